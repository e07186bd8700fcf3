"""The Triton kernels of the batch-1 GPU experiments (``benchmarks/handoff.py``,
``benchmarks/weight_bytes.py``), run on the CPU through Triton's interpreter, and their
host-side helpers.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is defined, so the kernel checks run
in one child process started with it (as ``test_fused_kernels`` does), which prints one JSON
object of results. References are float32 torch products of the same fp16 inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json
import torch
from benchmarks.handoff import MODES, chain
from benchmarks.weight_bytes import gemm, quantize

out = {}
g = torch.Generator().manual_seed(0)
x0 = torch.randn(70, 64, generator=g).half()           # a partial second row block
ws = [(torch.randn(64, 64, generator=g) / 8).half() for _ in range(3)]
ref = x0.clone()
for k in range(4):
    ref = (ref.float() @ ws[k % 3].float()).half()
for mode in MODES:
    for work in (True, False):
        bufs, flags, run = chain(x0, ws, 4, mode, work, bm=64, bn=32, bk=32)
        y = run()
        out[f"handoff {mode} {work}"] = {
            "err": float((y.float() - ref.float()).abs().max()) if work else 0.0,
            "y": y.float().sum().item(),
            "is_last_buffer": y.data_ptr() == bufs[4 % 2].data_ptr(),
            "flags": flags.tolist(),
        }
x16 = (torch.randn(70, 256, generator=g) * 0.5).half()
for dtype in ("float16", "int8", "e4m3", "e4m3x"):
    x = x16.to(torch.float8_e4m3fn) if dtype == "e4m3x" else x16  # both operands e4m3
    w, s = quantize(torch.randn(96, 256, generator=g) * 0.02, dtype.rstrip("x"))
    ref = x.float() @ (w.float() * s[:, None]).t()
    for indexed in (False, True):
        for splits, cfg in ((1, (64, 32, 64, 4, 3)), (2, (64, 32, 64, 4, 4))):
            shape = (splits, 70, 96) if splits > 1 else (70, 96)
            dst = torch.full(shape, float("nan"),
                             dtype=torch.float32 if splits > 1 else torch.float16)
            gemm(x, w, s, dst, splits, cfg, pdl=False, indexed=indexed)
            got = dst.float().sum(0) if splits > 1 else dst.float()
            out[f"weight_bytes {dtype} {indexed} {splits}"] = float(
                (got - ref).abs().max() / ref.abs().max())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def child() -> dict[str, object]:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_handoff_modes_compute_the_same_chain(child: dict[str, object]) -> None:
    """Every handoff mode runs the same GEMM chain (fp16 rounding per step, so within one
    fp16 step of the float32 reference) and returns the last step's buffer; without the K
    loop all modes still produce one identical output. The flag modes release each (step,
    row block) counter once per column tile (2 here: 64 columns in tiles of 32), the
    others never touch them. (The interpreter runs programs one at a time, so a wait that
    does not wait cannot show here; the GPU run compares every mode's output bit for bit.)"""
    from benchmarks.handoff import MODES

    for mode in MODES:
        gemm = child[f"handoff {mode} True"]
        assert isinstance(gemm, dict)
        assert gemm["is_last_buffer"]
        assert gemm["err"] <= 4e-3, (mode, gemm)
        released = 2 if mode.startswith("flags") else 0
        assert gemm["flags"] == [released] * 8, (mode, gemm["flags"])  # 4 steps x 2 blocks
    none = {child[f"handoff {mode} False"]["y"] for mode in MODES}  # type: ignore[index]
    assert len(none) == 1


def test_weight_bytes_gemm_matches_dequantized_product(child: dict[str, object]) -> None:
    """``weight_bytes.gemm``: fp16, int8 and e4m3 weights, and e4m3 on both operands (no
    conversion), both pointer forms, whole and split-K (float32 partials summed) against
    float32 math on the dequantized operands."""
    for dtype in ("float16", "int8", "e4m3", "e4m3x"):
        for indexed in (False, True):
            for splits in (1, 2):
                err = child[f"weight_bytes {dtype} {indexed} {splits}"]
                assert isinstance(err, float)
                assert err < 2e-3, (dtype, indexed, splits, err)


def test_weight_bytes_quantize() -> None:
    """One scale per output row: int8 uses the full +-127, e4m3 reaches 448, and the
    dequantized weight is within half a step of the original."""
    torch = pytest.importorskip("torch")
    from benchmarks.weight_bytes import quantize

    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    w[3] *= 100.0  # one row far larger: its scale must not leak into the others
    q8, s8 = quantize(w, "int8")
    assert q8.dtype == torch.int8 and s8.shape == (16,)
    assert (q8.abs().amax(dim=1) == 127).all()
    assert ((q8.float() * s8[:, None] - w).abs() <= s8[:, None] / 2 + 1e-6).all()
    qf, sf = quantize(w, "e4m3")
    assert torch.allclose(qf.float().abs().amax(dim=1), torch.full((16,), 448.0))
    rel = (qf.float() * sf[:, None] - w).abs() / w.abs().clamp_min(1e-3)
    assert float(rel[w.abs() > 1e-2 * w.abs().amax(dim=1, keepdim=True)].max()) <= 2 ** -4
    h, ones = quantize(w, "float16")
    assert h.dtype == torch.float16 and (ones == 1).all()


def test_weight_bytes_parse_config() -> None:
    from benchmarks.weight_bytes import parse_config

    assert parse_config("64x64x128/4/3") == (64, 64, 128, 4, 3)
    with pytest.raises(ValueError):
        parse_config("64x64x128/4")


def test_cutlass_small_pass_kinds() -> None:
    """Which ``kernels.linear`` calls ``cutlass_small.install`` may swap: QKV (plain), FFN1
    with the exact GELU and a bias, split-K partials; never a tanh GELU or a bias without
    GELU (and partials with an epilogue, which the engine's ``linear`` refuses anyway)."""
    from benchmarks.cutlass_small import pass_kind

    bias = object()
    assert pass_kind(None, None, 1) == "plain"
    assert pass_kind(bias, "gelu", 1) == "gelu"
    assert pass_kind(None, None, 4) == "partial"
    assert pass_kind(bias, "gelu_tanh", 1) is None
    assert pass_kind(bias, None, 1) is None
    assert pass_kind(None, "gelu", 1) is None
    assert pass_kind(bias, None, 4) is None


def test_weight_bytes_refuses_a_split_off_the_k_tile() -> None:
    """A K slice that is not a whole number of K tiles would run the loop past it."""
    torch = pytest.importorskip("torch")
    from benchmarks.weight_bytes import gemm

    x = torch.zeros(64, 768, dtype=torch.float16)
    w = torch.zeros(768, 768, dtype=torch.float16)
    with pytest.raises(ValueError, match="does not split"):
        gemm(x, w, torch.ones(768), torch.empty(4, 64, 768), 4, (64, 64, 128, 4, 4), pdl=False)


class _FakeLib:
    """Stands in for ``libqa_small_gemm_bench.so``: records each ``qa_small_gemm_pass`` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def qa_small_gemm_pass(self, kind, a, b, bias, d, m, n, k, splits, pdl, stream):  # type: ignore[no-untyped-def]
        self.calls.append((kind, m, n, k, splits, pdl, stream, bias != 0))
        return 0


def test_cutlass_small_install_routes_by_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """``install``: only the kinds in ``PASS_GEMMS`` go to the library (kind + 3 when
    ``EARLY``), with the shape, splits, PDL flag and stream; outputs are allocated as the
    engine's ``linear`` would (fp16 [M, N], float32 [splits, M, N]); a tanh GELU, fp32
    weights or an fp16 bias stay on the engine's kernel."""
    torch = pytest.importorskip("torch")
    from benchmarks import cutlass_small
    from engine.fused import kernels

    triton_calls: list[str] = []
    late: list[bool] = []

    def engine_linear(x, w, bias=None, act=None, splits=1, config=None, pdl=False,  # type: ignore[no-untyped-def]
                      prefetch=False, late_release=False):
        triton_calls.append(str(act))
        late.append(late_release)
        return "triton"

    monkeypatch.setattr(kernels, "linear", engine_linear)
    monkeypatch.setattr(cutlass_small, "PASS_GEMMS", ("gelu", "partial"))
    monkeypatch.setattr(cutlass_small, "EARLY", False)
    lib = _FakeLib()
    cutlass_small.install(lib=lib, stream=lambda: 7)
    x = torch.zeros(128, 768, dtype=torch.float16)
    w = torch.zeros(3072, 768, dtype=torch.float16)
    b32 = torch.zeros(3072)
    h = kernels.linear(x, w, b32, act="gelu", pdl=True)
    assert h.shape == (128, 3072) and h.dtype == torch.float16
    p = kernels.linear(x, w, splits=4)
    assert p.shape == (4, 128, 3072) and p.dtype == torch.float32
    assert lib.calls == [(1, 128, 3072, 768, 1, 1, 7, True), (2, 128, 3072, 768, 4, 0, 7, False)]
    assert kernels.linear(x, w, late_release=True) == "triton"  # plain: not in PASS_GEMMS
    assert late == [True]  # the engine's launch choice reaches its kernel
    assert kernels.linear(x, w, b32, act="gelu_tanh") == "triton"
    assert kernels.linear(x, w, b32.half(), act="gelu") == "triton"
    assert kernels.linear(x, w.float(), b32, act="gelu") == "triton"
    monkeypatch.setattr(cutlass_small, "EARLY", True)
    kernels.linear(x, w, b32, act="gelu")
    assert lib.calls[-1][0] == 4
    assert len(lib.calls) == 3 and len(triton_calls) == 4


@pytest.mark.parametrize(("module", "target"), [("cutlass_small", "small-bench"),
                                                ("cutlass_ffn1", "ffn1"),
                                                ("qkv_attention", "qkv-attn")])
def test_tool_libraries_fail_clearly(module: str, target: str, tmp_path: Path) -> None:
    """The CUDA tools' libraries load through the engine's ``native.load_library``: a
    missing file names its build target, and a library without the tool's functions (built
    from other sources) says to rebuild it, never an AttributeError."""
    import _ctypes  # a real shared library without the tools' functions
    import importlib

    load = importlib.import_module(f"benchmarks.{module}").load
    with pytest.raises(RuntimeError, match=rf"needs .*missing\.so: .*build\.sh {target}"):
        load(tmp_path / "missing.so")
    with pytest.raises(RuntimeError, match=rf"could not load .*rebuild it; .*build\.sh {target}"):
        load(Path(_ctypes.__file__))
