"""The INT8 study's tools without a GPU: ``benchmarks/int8_accuracy.py``'s roundings and
its fake-quantized GEMMs on a tiny random BERT, and ``benchmarks/int8_gemm_speed.py``'s
Triton GEMM (int8 and e4m3, dequantizing epilogue) through Triton's interpreter in a child
process and compiled for sm_90a."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from engine.config import REPO_ROOT
from tests.sass_tools import tools_or_skip

torch = pytest.importorskip("torch")


def test_roundings_land_on_their_grids() -> None:
    from benchmarks.int8_accuracy import e4m3, int8

    x = torch.linspace(-3, 3, 1001)
    q = int8(x, torch.tensor(0.01))
    assert torch.allclose(q / 0.01, (q / 0.01).round(), atol=1e-4)
    assert float(q.abs().max()) == pytest.approx(1.27)  # saturates at 127 steps
    assert float((q - x.clamp(-1.27, 1.27)).abs().max()) <= 0.005 + 1e-6
    f = e4m3(x, torch.tensor(1.0))
    assert torch.equal(f, x.to(torch.float8_e4m3fn).float())
    assert float(e4m3(torch.tensor([1e4]), torch.tensor(1.0))) == 448.0


def test_weight_forms() -> None:
    from benchmarks.int8_accuracy import quantize_weight

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g)
    w[3] *= 20  # one large output channel
    per_channel = quantize_weight(w, "int8_channel")
    steps = w.abs().amax(1, keepdim=True) / 127
    assert torch.allclose(per_channel / steps, (per_channel / steps).round(), atol=1e-3)
    # a channel's scale is its own: the small channels keep their precision
    small = [r for r in range(64) if r != 3]
    err_c = (per_channel - w)[small].norm() / w[small].norm()
    err_t = (quantize_weight(w, "e4m3_tensor") - w)[small].norm() / w[small].norm()
    assert err_c < err_t
    coarser = quantize_weight(w, "int8_channel", grid=1.07)
    assert not torch.equal(coarser, per_channel)
    with pytest.raises(ValueError, match="unknown weight form"):
        quantize_weight(w, "int4")


def test_smoothing_keeps_the_product() -> None:
    from benchmarks.int8_accuracy import smoothing

    g = torch.Generator().manual_seed(1)
    x = torch.randn(50, 16, generator=g, dtype=torch.float64)
    x[:, 5] *= 30  # an outlier input channel
    w = torch.randn(8, 16, generator=g, dtype=torch.float64)
    s = smoothing(x.abs().amax(0), w, 0.75)
    assert torch.allclose((x / s) @ (w * s).t(), x @ w.t())
    assert float((x / s).abs().amax(0)[5]) < float(x.abs().amax(0)[5]) / 5


def tiny_bert() -> object:
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return BertForQuestionAnswering(cfg).eval()


@pytest.mark.parametrize("scheme", ["fp8", "fp8_all", "int8_s", "int8_t", "int8_s3"])
def test_quantized_forwards_round_and_come_off(scheme: str) -> None:
    """Each scheme moves the logits a little (every rounded GEMM replaced), and taking its
    forwards off gives back the fp32 model's logits exactly."""
    from benchmarks.int8_accuracy import SCHEMES, calibrate, quantized_forwards

    model = tiny_bert()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 60, (3, 20), generator=g)

    def run(i: torch.Tensor) -> object:
        with torch.no_grad():
            return model(input_ids=i)

    stats = calibrate(model, [(ids[i:i + 1],) for i in range(3)], run)
    ref = run(ids).start_logits
    patched = quantized_forwards(model, stats, scheme, 1.0, 0.75)
    per_layer = sum(3 if g == "qkv" else 1 for g in SCHEMES[scheme])
    assert len(patched) == 2 * per_layer
    for m, fwd in patched:
        m.forward = fwd
    got = run(ids).start_logits
    for m, _ in patched:
        del m.forward
    rel = float((got - ref).norm() / ref.norm())
    assert 0 < rel < 0.1
    assert torch.equal(run(ids).start_logits, ref)


def test_qkv_shares_one_rounding() -> None:
    """QKV's three weights are rounded as one tensor (the engine's fused QKV): under the
    per-tensor e4m3 form the three slices share one scale."""
    from benchmarks.int8_accuracy import calibrate, quantized_forwards

    model = tiny_bert()
    ids = torch.randint(0, 60, (1, 16), generator=torch.Generator().manual_seed(3))
    stats = calibrate(model, [(ids,)], lambda i: model(input_ids=i))
    patched = dict(quantized_forwards(model, stats, "fp8", 1.0, 0.75))
    s = model.bert.encoder.layer[0].attention.self
    fused = torch.cat([s.query.weight, s.key.weight, s.value.weight]).detach()
    scale = fused.abs().amax() / 448
    for m, start in ((s.query, 0), (s.key, 32), (s.value, 64)):
        w_m = patched[m].__defaults__[0]  # type: ignore[attr-defined]
        want = (fused[start:start + 32] / scale).to(torch.float8_e4m3fn).float() * scale
        assert torch.equal(w_m, want)


def test_triton_gemm_in_the_interpreter() -> None:
    """int8 and e4m3 operands, a row count that is not a multiple of the tile, against
    float64 math on the same operands."""
    pytest.importorskip("triton")
    child = textwrap.dedent("""
        import torch
        from benchmarks.int8_gemm_speed import triton_gemm
        g = torch.Generator().manual_seed(0)
        m, n, k = 70, 64, 64
        sa, sb = torch.rand(m, generator=g) * 1e-2, torch.rand(n, generator=g) * 1e-2
        bias = torch.randn(n, generator=g).half()
        for a, b in ((torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8),
                      torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)),
                     (torch.randn(m, k, generator=g).to(torch.float8_e4m3fn),
                      torch.randn(n, k, generator=g).to(torch.float8_e4m3fn))):
            out = triton_gemm(a, b, sa, sb, bias, (32, 32, 32, 2, 4, 2)).double()
            ref = ((a.double() @ b.double().t()) * sa.double()[:, None] * sb.double()[None, :]
                   + bias.double())
            err = float(((out - ref).abs() / (ref.abs() + 1e-2)).max())
            assert err < 2e-3, (a.dtype, err)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", child], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@pytest.mark.parametrize("int8", [True, False])
def test_triton_gemm_compiles_to_hopper_wgmma(int8: bool) -> None:
    tools_or_skip()
    from benchmarks.attention_sass import compile_sass
    from benchmarks.int8_gemm_speed import scaled_gemm

    dt = "*i8" if int8 else "*fp8e4nv"
    sig = {"a_ptr": dt, "b_ptr": dt, "c_ptr": "*fp16", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "bias_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32", "BLOCK_M": "constexpr",
           "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP_M": "constexpr",
           "INT8": "constexpr"}
    sass, _, _ = compile_sass(
        scaled_gemm, sig, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8,
                           "INT8": int8},
        ("a_ptr", "b_ptr", "c_ptr", "sa_ptr", "sb_ptr", "bias_ptr", "N", "K"),
        {"num_warps": 8, "num_stages": 4})
    want = r"IGMMA\.64x128x32\.S8\.S8" if int8 else r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3"
    assert re.search(want, sass)
    assert "STL" not in sass


def test_gemm_error_roundings() -> None:
    """``int8_gemm_error``'s forms on Gaussian operands with outlier input channels: the
    unrounded halves are exact, int8 weights per channel beat e4m3 per tensor, and
    smoothing lets a static int8 input scale beat the unsmoothed one."""
    from benchmarks.int8_gemm_error import roundings

    g = torch.Generator().manual_seed(4)
    x = torch.randn(256, 64, generator=g)
    x[:, [3, 40]] *= 25
    w = torch.randn(32, 64, generator=g) * 0.05
    y = x @ w.t()
    err = {name: float((xq @ wq.t() - y).norm() / y.norm())
           for name, form in roundings(x, w, x.abs().amax(0)).items()
           for xq, wq in [form()]}
    assert err["int8 W only"] < err["fp8 W only"] / 2
    assert err["int8 smooth 0.75 W/ch X/static"] < err["int8 W/ch X/static"] / 2
    xq, wq = roundings(x, w, x.abs().amax(0))["fp8 W only"]()
    assert xq is x and not torch.equal(wq, w)


def test_summarize_pools_files_and_pairs_by_grid() -> None:
    from benchmarks.int8_accuracy import summarize

    def run(scheme: str, grid: float, loss: float) -> dict[str, object]:
        return {"scheme": scheme, "grid": grid, "f1_loss": loss, "mean_abs": 0.05,
                "argmax_agree": 0.9}

    first = {"runs": [run("fp8", 1.0, 0.2), run("int8_s", 1.0, 0.0)]}
    second = {"runs": [run("fp8", 1.1, 0.1), run("int8_s", 1.1, 0.05),
                       run("int8_s", 1.2, 0.3)]}  # 1.2 has no fp8 partner
    out = summarize([first, second])
    assert out["schemes"]["fp8"]["f1_loss"]["n"] == 2
    assert out["schemes"]["int8_s"]["f1_loss"]["mean"] == pytest.approx(0.35 / 3)
    assert out["paired"]["n"] == 2
    assert out["paired"]["mean"] == pytest.approx((0.2 + 0.05) / 2)
    assert "paired" not in summarize([{"runs": [run("fp8", 1.0, 0.1)]}])


def test_logit_error_counts_real_tokens_only() -> None:
    """``fp8_accuracy.logit_error`` (both accuracy tools' measure): padding ignored, argmax
    agreement per window over its real tokens."""
    import numpy as np

    from benchmarks.fp8_accuracy import logit_error

    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    ref = (np.array([[0.0, 3.0, 1.0, 0.0], [2.0, 1.0, 0.0, 0.0]]),
           np.array([[0.0, 1.0, 3.0, 0.0], [1.0, 2.0, 0.0, 0.0]]))

    def infer(ids: object, m: object, tt: object) -> tuple[object, object]:
        start = ref[0] + np.array([[0.5, 0.0, 0.0, 99.0], [0.0, 0.0, 99.0, 99.0]])
        end = ref[1] + np.array([[0.0, 0.0, 0.0, 99.0], [0.0, 1.5, 99.0, 99.0]])
        return start, end

    out = logit_error(infer, [(mask, mask, mask)], [ref])
    assert out["mean_abs"] == pytest.approx(2.0 / 10)  # 5 real tokens, start and end
    assert out["max_abs"] == 1.5
    assert out["argmax_agree"] == 1.0  # neither change moves a real token's argmax
    worse = logit_error(lambda *_: (ref[1], ref[0]), [(mask, mask, mask)], [ref])
    assert worse["argmax_agree"] == 0.0


def test_standin_configs_and_epilogues() -> None:
    """``int8_standin``'s configuration strings, the fastest configuration on the
    stand-ins' data, and each GEMM's epilogue in the int8 design."""
    from benchmarks.int8_standin import best_config, epilogue_of, parse_config

    assert parse_config("3:128:16:256") == (3, 128, 16, 256)
    with pytest.raises(ValueError, match="STAGES"):
        parse_config("3:128")
    row = {"gemm": "qkv", "failed": {}, "us": {
        "cublaslt_fp8": 1.0, "gluon_int8 4:128:32:128": 2.0,
        "gluon_int8_e4m3_bytes 4:128:32:128": 5.0, "gluon_int8_e4m3_bytes 3:128:16:256": 4.0}}
    assert best_config(row) == (3, 128, 16, 256)
    with pytest.raises(RuntimeError, match="no int8 configuration"):
        best_config({"gemm": "qkv", "failed": {"x": "y"}, "us": {"cublaslt_fp8": 1.0}})
    assert epilogue_of("ffn1") == {"gelu": 1, "out8": True, "bias": True}
    assert epilogue_of("qkv") == epilogue_of("out_proj") == {"gelu": 0, "out8": False,
                                                             "bias": False}


def test_int8_rows() -> None:
    """One scale an output channel; each row's largest magnitude lands on 127."""
    from engine.fused.int8 import quantize_channels

    w = torch.randn(6, 40) * torch.arange(1, 7)[:, None]
    q, s = quantize_channels(w)
    assert q.dtype == torch.int8 and s.shape == (6,)
    assert torch.equal(q.abs().amax(1), torch.full((6,), 127, dtype=torch.int8))
    assert float((q.float() * s[:, None] - w).abs().max()) <= float(s.max()) / 2 + 1e-6


def test_standins_hand_on_the_recorded_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins' plumbing (the kernel itself runs only on a Hopper GPU, so it is
    replaced by a recorder here): each returns the recorded output, reads its input's bytes
    as int8 (the out-projection's first K bytes a row of its 16-bit context), makes a
    layer's int8 weight once, and runs FFN1 with its bias, GELU and e4m3 output."""
    gluon_gemm = pytest.importorskip("engine.fused.kernels.gluon_gemm")
    from benchmarks.int8_standin import Int8StandIns
    from engine.fused.fp8 import FP8_DTYPE, CalibratedLayer, Quantized, StaticLinear

    calls: list[dict[str, object]] = []

    def record(a, x_scale, w8, w_top, out, **kw):  # type: ignore[no-untyped-def]
        calls.append({"a": a, "w8": w8, "out": out, **kw})
        return out

    monkeypatch.setattr(gluon_gemm, "gemm", record)
    cfg = (4, 128, 32, 128)
    stand = Int8StandIns({"qkv": cfg, "out_proj": cfg, "ffn1": cfg})
    one = torch.ones(1)
    lin = StaticLinear(x_scale=one, w8=torch.randn(24, 8).to(FP8_DTYPE), w_scale=one)
    xq = Quantized(torch.randn(5, 8).to(FP8_DTYPE), one)
    for _ in range(2):
        assert stand.qkv("recorded", xq, lin, torch.float16, True) == "recorded"
    assert len(calls) == 2 and calls[0]["w8"] is calls[1]["w8"]  # made once
    assert calls[0]["a"].dtype == torch.int8 and calls[0]["a"].data_ptr() == xq.data.data_ptr()
    assert calls[0]["out"].dtype == torch.float16 and calls[0]["out"].shape == (5, 24)
    assert calls[0]["col_scale"].shape == (24,)

    class Lin:
        weight = torch.randn(8, 8, dtype=torch.float16)

    ctx = torch.randn(5, 8, dtype=torch.float16)
    assert stand.out_proj("rec", ctx, None, Lin(), torch.float16, True) == "rec"
    a = calls[-1]["a"]
    assert a.shape == (5, 8) and a.stride() == (16, 1) and a.data_ptr() == ctx.data_ptr()
    cal = CalibratedLayer(qkv=lin, attn_out=lin, ffn_in=lin, ffn_out=lin,
                          b1=torch.zeros(24), h_inv=one)
    assert stand.ffn1("r", xq, cal, True) == "r"
    assert calls[-1]["gelu"] == 1 and calls[-1]["bias"] is cal.b1
    assert calls[-1]["out"].dtype == FP8_DTYPE and calls[-1]["out_scale"] is one
