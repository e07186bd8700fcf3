"""``engine.fused.small_gemm`` and the engine option ``cutlass_small_gemms`` without a GPU:
where the library is looked for, what a missing or stale one says, which operands are
refused before any kernel runs, and the option's checks (its kernels are checked on the
GPU: ``tests/gpu/test_fused_gpu.py``, ``test_small_gemm_kernels_match_torch`` and
``test_small_batch_paths_agree[seven_kernels_cutlass]``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from engine.config import REPO_ROOT

torch = pytest.importorskip("torch")
MODEL = REPO_ROOT / "models" / "minilm-l6-squad"


@pytest.fixture
def library_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, object]]:
    """``small_gemm`` and a setter of the path its library is looked for at."""
    from engine.fused import small_gemm

    def at(path: Path) -> None:
        monkeypatch.setenv("QA_SMALL_GEMM_LIB", str(path))
        small_gemm.LIBRARY.forget()

    yield small_gemm, at
    small_gemm.LIBRARY.forget()


def test_missing_library(library_at, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    small_gemm, at = library_at
    at(tmp_path / "missing.so")
    assert small_gemm.LIBRARY.path().name == "missing.so"
    assert not small_gemm.LIBRARY.available()
    with pytest.raises(RuntimeError, match=r"needs .*missing\.so: build it with .*build\.sh small"):
        small_gemm.LIBRARY.load()


def test_stale_or_broken_library(library_at, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A shared library without the engine's function (e.g. the benchmark's build of the
    same name from before) or a file that is no library: a RuntimeError saying it could not
    be loaded, never an AttributeError, and ``available()`` is False."""
    import _ctypes  # a real shared library without qa_small_gemm_linear

    small_gemm, at = library_at
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not an ELF file")
    for path in (Path(_ctypes.__file__), garbage):
        at(path)
        assert not small_gemm.LIBRARY.available()
        with pytest.raises(RuntimeError, match=r"could not load .*rebuild it"):
            small_gemm.LIBRARY.load()


def test_default_library_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.fused import small_gemm

    monkeypatch.delenv("QA_SMALL_GEMM_LIB", raising=False)
    assert small_gemm.LIBRARY.path() == REPO_ROOT / "build" / "cuda" / "libqa_small_gemm.so"


def _operands() -> dict[str, object]:
    return {"x": torch.zeros(8, 64, dtype=torch.float16),
            "w": torch.zeros(32, 64, dtype=torch.float16), "bias": None, "gelu": False}


@pytest.mark.parametrize(("case", "change", "message"), [
    ("fp32 x", {"x": torch.zeros(8, 64)}, "x is torch.float32"),
    ("fp32 w", {"w": torch.zeros(32, 64)}, "w is torch.float32"),
    ("3-D x", {"x": torch.zeros(2, 8, 64, dtype=torch.float16)}, "x is 3-D"),
    ("K mismatch", {"w": torch.zeros(32, 32, dtype=torch.float16)}, "w has K=32"),
    ("N off 8", {"w": torch.zeros(30, 64, dtype=torch.float16)}, "multiples of 8"),
    ("bias without gelu", {"bias": torch.zeros(32)}, "a bias goes with gelu"),
    ("gelu without bias", {"gelu": True}, "a bias goes with gelu"),
    ("fp16 bias", {"bias": torch.zeros(32, dtype=torch.float16), "gelu": True},
     "bias is torch.float16"),
    ("short bias", {"bias": torch.zeros(16), "gelu": True}, r"not float32 \(32,\)"),
    ("strided x", {"x": torch.zeros(8, 128, dtype=torch.float16)[:, ::2]}, "x is not contig"),
    ("misaligned w", {"w": torch.zeros(32 * 64 + 1, dtype=torch.float16)[1:].view(32, 64)},
     "w is not 16-byte aligned"),
])
def test_operands_the_kernels_do_not_take(case: str, change: dict[str, object],
                                         message: str) -> None:
    """Each is a ValueError naming the problem, before the library is touched."""
    from engine.fused import small_gemm

    small_gemm._check(**_operands(), on_device=False)  # type: ignore[arg-type]  # the good case
    with pytest.raises(ValueError, match=message):
        small_gemm._check(**{**_operands(), **change}, on_device=False)  # type: ignore[arg-type]


def test_operands_must_be_on_one_cuda_device() -> None:
    from engine.fused import small_gemm

    with pytest.raises(ValueError, match=r"x is on cpu, not cpu \(CUDA\)"):
        small_gemm.linear(**_operands())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def fp16_weights():  # type: ignore[no-untyped-def]
    from engine.fused.engine import FusedEngine

    return FusedEngine.from_pretrained(MODEL, device="cpu", dtype="float16",
                                       backend="torch").weights


def test_engine_option_is_checked(fp16_weights) -> None:  # type: ignore[no-untyped-def]
    """``cutlass_small_gemms`` takes names (a sequence or text; None, "" or () for none),
    refuses unknown ones, and each thing its kernels need is a clear error, model checks
    first: fp16 weights, the exact GELU for FFN1, a model on the seven-kernel layer, no
    Triton plan for the same GEMM, then CUDA."""
    from engine.fused.engine import FusedEngine

    def make(weights=fp16_weights, **kw):  # type: ignore[no-untyped-def]
        return FusedEngine(weights, "cpu", backend="torch", **kw)

    for empty in (None, "", ()):
        assert make(cutlass_small_gemms=empty).options.cutlass_small_gemms == ()
    with pytest.raises(ValueError, match="unknown GEMMs"):
        make(cutlass_small_gemms="qkv,ffn2")
    fp32 = FusedEngine.from_pretrained(MODEL, device="cpu", dtype="float32",
                                       backend="torch").weights
    with pytest.raises(ValueError, match="takes float16 weights"):
        make(fp32, cutlass_small_gemms="qkv")
    tanh = dataclasses.replace(
        fp16_weights, config=dataclasses.replace(fp16_weights.config, gelu="tanh"))
    with pytest.raises(ValueError, match="exact GELU only"):
        make(tanh, cutlass_small_gemms="ffn1", deferred_ln_max_hidden=None)
    with pytest.raises(ValueError, match="takes the deferred one"):
        make(cutlass_small_gemms=("qkv",))  # MiniLM: hidden 384 <= 768
    with pytest.raises(ValueError, match=r"gemm_plans \['ffn1'\]"):
        make(cutlass_small_gemms="ffn1, qkv", deferred_ln_max_hidden=None,
             gemm_plans={"ffn1": ((64, 64, 64, 4, 4), 1)})
    with pytest.raises(ValueError, match="runs on CUDA"):
        make(cutlass_small_gemms="ffn1, qkv", deferred_ln_max_hidden=None)


def test_odd_widths_are_refused(fp16_weights) -> None:  # type: ignore[no-untyped-def]
    """The kernels take N and K in multiples of 8: a model whose widths are not is refused
    when the engine is built, not at its first batch."""
    from engine.fused.engine import FusedEngine

    odd = dataclasses.replace(
        fp16_weights, config=dataclasses.replace(fp16_weights.config, intermediate_size=1530))
    with pytest.raises(ValueError, match="must be multiples of 8"):
        FusedEngine(odd, "cpu", backend="torch", cutlass_small_gemms="qkv",
                    deferred_ln_max_hidden=None)


def test_auto_picks_what_can_run(fp16_weights, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The default, ``"auto"``, is never an error: none where a check fails (here the CPU,
    or a model narrower than ``AUTO_SMALL_GEMMS_MIN_HIDDEN``); where every check passes,
    QKV and FFN1, leaving out FFN1 without the exact GELU and any GEMM with a Triton plan."""
    from engine.fused import engine as engine_module
    from engine.fused.engine import FusedEngine

    def make(weights=fp16_weights, **kw):  # type: ignore[no-untyped-def]
        return FusedEngine(weights, "cpu", backend="torch", deferred_ln_max_hidden=None,
                           **kw).options.cutlass_small_gemms

    assert FusedEngine(fp16_weights, "cpu", backend="torch").options.cutlass_small_gemms == ()
    monkeypatch.setattr(engine_module, "AUTO_SMALL_GEMMS_MIN_HIDDEN", 0)
    assert make() == ()  # the checks fail on the CPU: no error
    assert make(cutlass_small_gemms="auto") == ()
    checked: list[tuple[str, ...]] = []
    monkeypatch.setattr(FusedEngine, "_check_small_gemms",
                        lambda self, gemms, *rest: checked.append(tuple(gemms)))
    assert make() == ("qkv", "ffn1")
    tanh = dataclasses.replace(
        fp16_weights, config=dataclasses.replace(fp16_weights.config, gelu="tanh"))
    assert make(tanh) == ("qkv",)
    assert make(gemm_plans={"qkv": ((64, 64, 64, 4, 4), 1)}) == ("ffn1",)
    assert checked == [("qkv", "ffn1"), ("qkv",), ("ffn1",)]
    monkeypatch.setattr(engine_module, "AUTO_SMALL_GEMMS_MIN_HIDDEN",
                        fp16_weights.config.hidden_size + 1)
    assert make() == ()
    assert checked == [("qkv", "ffn1"), ("qkv",), ("ffn1",)]  # narrower: not even checked
