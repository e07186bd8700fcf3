"""The engine's int8 GEMMs (``engine/fused/int8.py``) on the CPU: the smoothed int8 form
of a weight and its input, the GEMM's float math (the GPU runs ``kernels.gluon_gemm``,
checked in ``tests/gpu``), the calibration's per-channel magnitudes, and calibrated
passes of the shipped MiniLM with the out-projection and FFN1 in int8 (torch op set)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.config import REPO_ROOT

torch = pytest.importorskip("torch")
MODEL = REPO_ROOT / "models" / "minilm-l6-squad"


def test_int8_form_keeps_the_product_and_the_input_range() -> None:
    """``x / s`` and ``W diag(s)`` multiply to ``x W^T``; the input copy of the largest
    calibrated magnitudes lands on 127 at most; the product of the int8 operands is
    within their rounding of the float one."""
    from engine.fused.int8 import int8_linear, int8_linear_of, quantize_int8, smoothing

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g) * torch.linspace(0.1, 8, 32)  # outlier channels
    w = torch.randn(48, 32, generator=g) * 0.05
    colmax = x.abs().amax(0)
    s = smoothing(colmax, w)
    assert torch.allclose((x / s) @ (w * s).t(), x @ w.t(), atol=1e-5)
    lin = int8_linear_of(w, colmax)
    assert lin.w8.dtype == torch.int8 and lin.w8.shape == (48, 32)
    assert lin.col.shape == (48,) and float(lin.col.max()) == 1.0
    q = quantize_int8(x, lin.mult)
    assert int(q.abs().max()) == 127  # the calibration's largest channel fills the range
    y = int8_linear(q, lin, torch.float32)
    ref = x @ w.t()
    assert float((y - ref).norm() / ref.norm()) < 0.02
    # the smoothing is what keeps it that fine: without it the outlier channels set the
    # input's one scale
    flat = int8_linear_of(w, colmax, alpha=0.0)
    y0 = int8_linear(quantize_int8(x, flat.mult), flat, torch.float32)
    assert float((y - ref).norm()) < float((y0 - ref).norm())


def test_int8_linear_epilogues_and_errors() -> None:
    """Bias + GELU + an e4m3 output (FFN1's), against float math; an e4m3 output needs
    its scale and a 16-bit one refuses it."""
    from engine.fused.fp8 import FP8_DTYPE, gelu_tanh
    from engine.fused.int8 import int8_linear, int8_linear_of, quantize_int8

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(20, 16, generator=g), torch.randn(24, 16, generator=g) * 0.1
    b = torch.randn(24, generator=g).to(torch.bfloat16)
    lin = int8_linear_of(w, x.abs().amax(0))
    q = quantize_int8(x, lin.mult)
    deq = (q.float() @ lin.w8.float().t()) * lin.x_scale * lin.w_top * lin.col
    h_inv = torch.tensor([448 / 3.0])
    out = int8_linear(q, lin, FP8_DTYPE, bias=b, gelu=True, out_scale=h_inv)
    want = (gelu_tanh(deq + b.float()) * h_inv).clamp(-448, 448).to(FP8_DTYPE)
    assert out.dtype == FP8_DTYPE and torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    with pytest.raises(ValueError, match="out_scale"):
        int8_linear(q, lin, FP8_DTYPE)
    with pytest.raises(ValueError, match="out_scale"):
        int8_linear(q, lin, torch.float16, out_scale=h_inv)
    # the out-projection adding the residual: written into the addend
    res = torch.randn(20, 24, generator=g).half()
    want16 = (deq + res.float()).half()
    got16 = int8_linear(q, lin, torch.float16, addend=res)
    assert got16 is res and torch.equal(got16, want16)
    with pytest.raises(ValueError, match="addend"):
        int8_linear(q, lin, torch.float32, addend=res)


def _batch(rng: np.random.Generator, windows: int, seq: int) -> tuple[np.ndarray, ...]:
    ids = rng.integers(1000, 20000, (windows, seq)).astype(np.int32)
    ids[:, 0] = 101
    mask = np.ones((windows, seq), dtype=np.int32)
    tt = (np.arange(seq)[None, :] >= seq // 3).astype(np.int32).repeat(windows, 0)
    return ids, mask, tt


@pytest.fixture(scope="module")
def calibrated() -> object:
    from engine.fused.engine import FusedEngine

    # the e4m3 form (no int8 GEMM), which the int8 forms are compared with
    engine = FusedEngine.from_pretrained(MODEL, device="cpu", dtype="fp8", backend="torch",
                                         fp8_calibrated_min_tokens=1, int8_gemms=None)
    engine.calibrate(*_batch(np.random.default_rng(3), 4, 96))
    return engine


def test_calibration_records_per_channel_magnitudes(calibrated: object, tmp_path: Path,
                                                    ) -> None:
    """Every layer's out-projection and FFN1 input magnitudes per channel, each at most
    the tensor's largest (which the same passes recorded) and reaching it; saved and read
    back with the rest."""
    from engine.fused.calibration import INT8_GEMMS, Calibration

    cal = calibrated.calibration  # type: ignore[attr-defined]
    assert cal.colmax is not None and set(cal.colmax) == set(INT8_GEMMS)
    for g in INT8_GEMMS:
        assert len(cal.colmax[g]) == cal.layers
        for i, row in enumerate(cal.colmax[g]):
            assert len(row) == 384
            assert max(row) == pytest.approx(cal.amax[g][i], rel=1e-6)
    path = tmp_path / "cal.json"
    cal.save(path)
    back = Calibration.load(path)
    assert back == cal and back.colmax == cal.colmax


def test_int8_passes(calibrated: object) -> None:
    """With ``int8_gemms`` the calibrated passes run the out-projection and FFN1 in int8:
    logits differ from the e4m3 default's and from each single GEMM's, and stay about as
    close to the un-quantized pass as the default's (the shipped MiniLM on random tokens;
    F1 is measured on the GPU). The names are checked; a calibration without per-channel
    magnitudes is refused when int8 is asked for."""
    from dataclasses import replace

    from engine.fused.engine import FusedEngine

    base = calibrated
    weights, cal = base.weights, base.calibration  # type: ignore[attr-defined]
    x = _batch(np.random.default_rng(8), 2, 80)
    plain = FusedEngine(weights, "cpu", backend="torch",
                        fp8_calibrated_min_tokens=1 << 30, fp8_min_tokens=1 << 30).infer(*x)
    default = base.infer(*x)  # type: ignore[attr-defined]
    got = {}
    for names in ("attn_out", "ffn_in", "attn_out,ffn_in"):
        eng = FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                          int8_gemms=names)
        eng.load_calibration(cal)
        assert eng.weights.int8 is not None and len(eng.weights.int8) == 6
        got[names] = eng.infer(*x)
    outs = [default, *got.values()]
    for i, a in enumerate(outs):
        for b in outs[i + 1:]:
            assert not np.array_equal(a[0], b[0])

    def err(out: tuple[np.ndarray, ...]) -> float:
        return float(np.mean([np.abs(a - b).mean() for a, b in zip(out, plain, strict=True)]))

    assert err(got["attn_out,ffn_in"]) < 1.5 * err(default)
    # with the out-projection adding the residual (the sum-residual form: layernorm_quant
    # writes FFN1's int8 copy): other logits, as close
    from engine.fused import encoder

    both = FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                       int8_gemms="attn_out,ffn_in")
    both.load_calibration(cal)
    adds, encoder.OUT_PROJ_ADDS_RESIDUAL = encoder.OUT_PROJ_ADDS_RESIDUAL, True
    try:
        summed = both.infer(*x)
    finally:
        encoder.OUT_PROJ_ADDS_RESIDUAL = adds
    assert not np.array_equal(summed[0], got["attn_out,ffn_in"][0])
    assert err(summed) < 1.5 * err(default)
    with pytest.raises(ValueError, match="unknown"):
        FusedEngine(weights, "cpu", backend="torch", int8_gemms="qkv")
    old = replace(cal, colmax=None)
    eng = FusedEngine(weights, "cpu", backend="torch", int8_gemms="ffn_in")
    with pytest.raises(ValueError, match="per-channel"):
        eng.load_calibration(old)
    # weights calibrated elsewhere, without their int8 form: a clear error, not e4m3
    eng = FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                      int8_gemms="ffn_in")
    with pytest.raises(ValueError, match="per-channel"):
        eng.infer(*x)


def test_accuracy_schemes_and_int8_regrid() -> None:
    """``fp8_accuracy``'s ``int8:G1+G2`` and ``static:G1+G2`` schemes; ``int8.regrid``
    re-rounds the weight on a coarser grid and keeps the input's form."""
    from benchmarks.fp8_accuracy import _int8_gemms, _static_inputs
    from engine.fused.int8 import int8_linear_of, regrid

    assert _int8_gemms("int8:attn_out+ffn_in") == ("attn_out", "ffn_in")
    assert [_int8_gemms(s) for s in ("int8:", "int8:qkv", "static:qkv", "int8")] == [None] * 4
    assert _static_inputs("static:") == () and _static_inputs("static:qkv") == ("qkv",)
    assert _static_inputs("static:x") is None and _static_inputs("int8:ffn_in") is None
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 8, generator=g)
    lin = int8_linear_of(w, torch.rand(8, generator=g) + 0.5)
    same = regrid(lin, w, 1.0)
    # the smoothing comes back from the multipliers up to float32 rounding
    assert torch.equal(same.w8, lin.w8) and torch.allclose(same.col, lin.col, rtol=1e-6)
    coarse = regrid(lin, w, 1.1)
    assert coarse.mult is lin.mult and coarse.x_scale is lin.x_scale
    assert float(coarse.w_top) == pytest.approx(1.1 * float(lin.w_top))
    assert int(coarse.w8.abs().max()) < 127 and not torch.equal(coarse.w8, lin.w8)


def test_int8_options_and_copies_are_checked(calibrated: object) -> None:
    """What ``int8_gemms`` cannot do is refused at construction (an engine without FP8
    weights; FFN1 without its input and FFN2's static), and the int8 copies' multipliers
    are checked (shape, dtype, not beside an e4m3 scale)."""
    from engine.fused import torch_ops
    from engine.fused.engine import FusedEngine

    weights = calibrated.weights  # type: ignore[attr-defined]
    fp32 = FusedEngine.from_pretrained(MODEL, device="cpu", dtype="float32", backend="torch")
    with pytest.raises(ValueError, match="FP8 engine"):
        FusedEngine(fp32.weights, "cpu", backend="torch", int8_gemms="attn_out")
    with pytest.raises(ValueError, match="ffn_in and ffn_out"):
        FusedEngine(weights, "cpu", backend="torch", int8_gemms="ffn_in",
                    fp8_static_inputs="qkv,ffn_in")
    FusedEngine(weights, "cpu", backend="torch", int8_gemms="attn_out",
                fp8_static_inputs="qkv")  # the out-projection alone needs no static FFN
    a = torch.randn(5, 8)
    ones = torch.ones(8)
    for mult, scale, message in ((torch.ones(7), None, r"float32 \[8\]"),
                                 (torch.ones(8, dtype=torch.float64), None, "float32"),
                                 (ones, torch.ones(1), "not both")):
        with pytest.raises(ValueError, match=message):
            torch_ops.bias_residual_layernorm(a, ones, a, ones, ones, 1e-5, int8_mult=mult,
                                              fp8_scale=scale)


def test_calibration_colmax_checks(calibrated: object) -> None:
    """A calibration may hold per-channel magnitudes for some of ``INT8_GEMMS`` (an older
    or narrower one loads); unknown names and wrong lengths are refused; int8 layers need
    both."""
    from dataclasses import replace

    from engine.fused.calibration import Calibration

    cal = calibrated.calibration  # type: ignore[attr-defined]
    assert cal.colmax is not None
    part = replace(cal, colmax={"ffn_in": cal.colmax["ffn_in"]})
    with pytest.raises(ValueError, match="per-channel input magnitudes"):
        part.int8_for(calibrated.weights)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="are for"):
        Calibration(cal.amax, colmax={"qkv": cal.colmax["ffn_in"]})
    with pytest.raises(ValueError, match="one vector a layer"):
        Calibration(cal.amax, colmax={"ffn_in": cal.colmax["ffn_in"][:2]})
    with pytest.raises(ValueError, match="finite and non-negative"):
        Calibration(cal.amax, colmax={"ffn_in": [[-1.0]] * cal.layers})


def test_int8_auto_follows_each_calibration(calibrated: object) -> None:
    """``int8_gemms="auto"`` runs the pair in int8 from a calibration with their
    per-channel magnitudes (the same logits as asking for them by name), and stays on the
    e4m3 default (the same logits as it, no error) with a calibration without them, with
    FFN2's input not static, or in an engine without FP8 weights; each calibration loaded
    decides again."""
    from dataclasses import replace

    from engine.fused.calibration import INT8_GEMMS
    from engine.fused.engine import FusedEngine

    weights, cal = calibrated.weights, calibrated.calibration  # type: ignore[attr-defined]
    x = _batch(np.random.default_rng(9), 2, 72)
    named = FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                        int8_gemms="attn_out,ffn_in", fp8_calibration=cal).infer(*x)
    default = calibrated.infer(*x)  # type: ignore[attr-defined]
    # (MiniLM's width has no measured threshold, INT8_AUTO_MIN_TOKENS: one is given)
    auto = FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                       int8_gemms=" auto", fp8_calibration=cal, int8_min_tokens=1)
    assert auto.options.int8_gemms == INT8_GEMMS
    for a, b in zip(auto.infer(*x), named, strict=True):
        assert np.array_equal(a, b)
    # an engine on those weights (which carry the int8 copies) makes the same choice
    shared = FusedEngine(auto.weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                         int8_min_tokens=1)
    assert shared.options.int8_gemms == INT8_GEMMS
    assert np.array_equal(shared.infer(*x)[0], named[0])
    assert FusedEngine(auto.weights, "cpu", backend="torch").options.int8_gemms == ()
    auto.load_calibration(replace(cal, colmax=None))  # an older calibration file
    assert auto.options.int8_gemms == () and auto.weights.int8 is None
    for a, b in zip(auto.infer(*x), default, strict=True):
        assert np.array_equal(a, b)
    auto.load_calibration(cal)
    assert auto.options.int8_gemms == INT8_GEMMS
    assert np.array_equal(auto.infer(*x)[0], named[0])
    partial = FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                          int8_gemms="auto", fp8_static_inputs="qkv,ffn_in",
                          fp8_calibration=cal, int8_min_tokens=1)
    assert partial.options.int8_gemms == ()
    fp32 = FusedEngine.from_pretrained(MODEL, device="cpu", dtype="float32", backend="torch",
                                       int8_gemms="AUTO ")
    assert fp32.options.int8_gemms == ()
    with pytest.raises(ValueError, match="or 'auto'"):
        FusedEngine(weights, "cpu", backend="torch", int8_gemms="auto,ffn_in")


def test_auto_int8_gemms_choice(calibrated: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto_int8_gemms`` takes the pair only where everything they need is there: the
    calibration's magnitudes of both, FP8, FFN1's and FFN2's inputs static, and a device
    that runs them (the CPU; on CUDA a GPU the int8 kernel runs on)."""
    from dataclasses import replace

    from engine.fused import int8
    from engine.fused.calibration import INT8_GEMMS
    from engine.fused.engine import auto_int8_gemms

    cal = calibrated.calibration  # type: ignore[attr-defined]
    cpu, static = torch.device("cpu"), ("qkv", "ffn_in", "ffn_out")
    assert auto_int8_gemms(cal, True, static, cpu) == INT8_GEMMS
    assert auto_int8_gemms(cal, False, static, cpu) == ()
    assert auto_int8_gemms(cal, True, ("qkv", "ffn_in"), cpu) == ()
    assert auto_int8_gemms(replace(cal, colmax={"ffn_in": cal.colmax["ffn_in"]}), True,
                           static, cpu) == ()
    monkeypatch.setattr(int8, "gpu_supported", lambda device: False)  # CUDA, not Hopper
    assert auto_int8_gemms(cal, True, static, torch.device("cuda", 0)) == ()
    monkeypatch.setattr(int8, "gpu_supported", lambda device: True)
    assert auto_int8_gemms(cal, True, static, torch.device("cuda", 0)) == INT8_GEMMS


def test_loop_register_cap() -> None:
    """The residual LayerNorm's loop caps registers so that its ``per_sm`` programs are
    all resident (the int8 copy compiled to 142 registers at (4, 4, 4): v51), in the
    allocation's unit of 8."""
    from engine.fused.kernels import rows

    assert rows.loop_register_cap(4, 4) == 128
    assert rows.loop_register_cap(8, 2) == 128
    assert rows.loop_register_cap(3, 4) == 168
    assert rows.loop_register_cap(1, 1) == 255  # a thread's most
    # shares under 96 registers would spill (187 spill stores at 32): no cap
    assert rows.loop_register_cap(9, 4) is None and rows.loop_register_cap(4, 8) is None
    assert rows.ROW_LOOP is not None
    assert rows.loop_register_cap(rows.ROW_LOOP[0], rows.ROW_LOOP[2]) == 128


def test_int8_copy_keeps_the_layernorm_loop_resident() -> None:
    """The residual LayerNorm's loop (``ROW_LOOP``) with the int8 copy, compiled for sm_90a
    under its launch's register cap: within the cap without spills, and its loop over
    tiles no heavier in barriers and shared-memory traffic than the e4m3 copy's (the
    multipliers loaded once a program; v50 loaded them every tile and ran at 142
    registers, one program an SM as a tail: NOTES v51)."""
    from benchmarks.int8_copy_sass import layernorm_stats
    from engine.fused.kernels import rows
    from tests.sass_tools import tools_or_skip

    tools_or_skip()
    assert rows.ROW_LOOP is not None
    per_sm, _, warps = rows.ROW_LOOP
    cap = rows.loop_register_cap(per_sm, warps)
    assert cap is not None
    e4m3 = layernorm_stats(3, "*fp8e4nv", cap)
    int8 = layernorm_stats(4, "*i8", cap)
    assert int8.registers <= cap and int8.spills == 0 and int8.loop > 0
    assert ((int8.loop_bar, int8.loop_lds, int8.loop_sts)
            == (e4m3.loop_bar, e4m3.loop_lds, e4m3.loop_sts))


def test_8bit_attention_keeps_the_16bit_layout() -> None:
    """Attention's 8-bit output forms (int8 for ``int8_gemms``, e4m3), compiled for sm_90a
    as the mix launches them, load Q, its bias and the K/V tiles as the 16-bit form does
    and store at most ``ATTN_OUT8_VECTOR`` bytes a thread. Left to the compiler's 16-byte
    store they are laid out otherwise from the first load (two 16-byte bias loads a thread
    instead of one), and ran 10-14% slower than the 16-bit form (NOTES v52)."""
    from benchmarks.int8_copy_sass import attention_memory_ops
    from engine.fused.kernels import attention
    from tests.sass_tools import tools_or_skip

    tools_or_skip()
    assert attention.ATTN_OUT8_VECTOR == 8

    def loads(ops: Counter[str]) -> dict[str, int]:  # less the scale / multiplier loads
        return {op: n for op, n in ops.items() if op.startswith(("LDG.E.128", "LDGSTS"))}

    wide = attention_memory_ops(0, "*fp16")
    assert wide["STG.E.128"] > 0
    for mode, out_type in ((4, "*i8"), (1, "*fp8e4nv")):
        ops = attention_memory_ops(mode, out_type)
        assert loads(ops) == loads(wide), out_type
        assert ops["STG.E.64"] > 0 and "STG.E.128" not in ops, out_type
        own = attention_memory_ops(mode, out_type, vector=0)  # the compiler's choice
        assert loads(own) != loads(wide) and own["STG.E.128"] > 0, out_type


def test_int8_min_tokens(calibrated: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 GEMMs run on calibrated passes of at least ``int8_min_tokens`` tokens; shorter
    ones give the e4m3 GEMMs' logits exactly. ``"auto"`` takes its threshold from
    ``INT8_AUTO_MIN_TOKENS`` by hidden size (BERT-large 2,048, BERT-base 6,144: where the
    Gluon int8 GEMM overtook cuBLASLt's e4m3 one, v52) and runs none for a size it does
    not list (MiniLM's 384); named GEMMs run from 0 unless told."""
    from engine.fused import engine as engine_module
    from engine.fused.engine import FusedEngine

    weights, cal = calibrated.weights, calibrated.calibration  # type: ignore[attr-defined]
    x = _batch(np.random.default_rng(11), 2, 72)  # 144 tokens
    e4m3 = calibrated.infer(*x)  # type: ignore[attr-defined]

    def engine(**kw: object) -> FusedEngine:
        return FusedEngine(weights, "cpu", backend="torch", fp8_calibrated_min_tokens=1,
                           fp8_calibration=cal, **kw)  # type: ignore[arg-type]

    named = engine(int8_gemms="attn_out,ffn_in")
    assert named.options.int8_gemms and named.options.int8_min_tokens == 0
    int8 = named.infer(*x)
    assert not np.array_equal(int8[0], e4m3[0])
    for tokens, want in ((144, int8), (145, e4m3)):
        for kw in ({"int8_gemms": "attn_out,ffn_in"}, {}):  # named, auto
            got = engine(int8_min_tokens=tokens, **kw).infer(*x)
            for a, b in zip(got, want, strict=True):
                assert np.array_equal(a, b), (tokens, kw)
    assert engine().options.int8_gemms == ()  # auto, MiniLM: no threshold
    assert engine_module.INT8_AUTO_MIN_TOKENS == {1024: 2048, 768: 6144}
    # the table by hidden size (MiniLM listed as if measured)
    monkeypatch.setitem(engine_module.INT8_AUTO_MIN_TOKENS, weights.config.hidden_size, 145)
    listed = engine()
    assert listed.options.int8_min_tokens == 145 and listed.options.int8_gemms
    assert np.array_equal(listed.infer(*x)[0], e4m3[0])
    for bad in (-1, 1.5, "12"):
        with pytest.raises(ValueError, match="int8_min_tokens"):
            engine(int8_min_tokens=bad)
