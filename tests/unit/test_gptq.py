"""Error-compensated e4m3 rounding (``engine.fused.gptq``) and its calibration path, on
the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.fused.fp8 import FP8_DTYPE, quantize_tiles
from engine.fused.gptq import gptq_e4m3, output_error


def _correlated_inputs(rows: int, k: int, seed: int) -> torch.Tensor:
    """Inputs whose channels correlate (a few factors, the same for every ``seed``, plus
    noise), with a few channels 20x larger than the rest, as transformer activations
    have them; ``seed`` draws the samples."""
    mixing = torch.randn(6, k, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=g) @ mixing
    x = x + 0.3 * torch.randn(rows, k, generator=g)
    x[:, :3] *= 20.0
    return x


def test_gptq_lowers_the_output_error_on_held_out_inputs() -> None:
    """Against nearest rounding with the same scale, GPTQ's ``X Wq^T`` is closer to
    ``X W^T``, on the inputs it was fitted on and on fresh inputs of the same kind; the
    result is e4m3 on the same grid (every value a representable multiple of the scale)."""
    g = torch.Generator().manual_seed(1)
    n, k = 64, 256
    w = torch.randn(n, k, generator=g) * 0.05
    fit = _correlated_inputs(2048, k, 2)
    fresh = _correlated_inputs(2048, k, 3)
    nearest, scale = quantize_tiles(w, n, k)
    ours = gptq_e4m3(w, fit.t() @ fit, scale)
    assert ours.dtype == FP8_DTYPE and ours.shape == (n, k)
    for x in (fit, fresh):
        h = x.t() @ x
        assert output_error(w, ours, scale, h) < 0.6 * output_error(w, nearest, scale, h)
        direct = float(((x @ (w - ours.float() * scale).t()) ** 2).sum())
        assert direct == pytest.approx(output_error(w, ours, scale, h), rel=1e-3)


def test_uncorrelated_inputs_round_to_nearest() -> None:
    """With a diagonal Gram matrix no column's error is worth carrying to another, so GPTQ
    is nearest rounding, whatever the column order; channels that never fired too."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(16, 32, generator=g)
    nearest, scale = quantize_tiles(w, 16, 32)
    diag = torch.rand(32, generator=g) + 0.5
    diag[5] = 0.0  # a dead channel
    for act_order in (True, False):
        ours = gptq_e4m3(w, torch.diag(diag), scale, block=8, act_order=act_order)
        assert torch.equal(ours.float(), nearest.float())


def test_bad_arguments_are_refused() -> None:
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="16x16"):
        gptq_e4m3(w, torch.eye(8), 0.01)
    with pytest.raises(ValueError, match="positive"):
        gptq_e4m3(w, torch.eye(16), 0.0)
    bad = torch.eye(16)
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        gptq_e4m3(w, bad, 0.01)


def test_calibrating_with_gptq_records_grams_and_rounds_by_them() -> None:
    """``calibrating(gptq=True)`` keeps each GEMM's input Gram matrix per layer (symmetric,
    positive semi-definite, as many tokens on its trace's scale as were seen), and the
    calibrated weights are GPTQ's: same scales as nearest rounding, other roundings, a
    lower output error on those inputs; the engine then runs and its logits stay close
    to the nearest-rounded engine's."""
    from engine.fused.engine import FusedEngine
    from tests.unit.test_folding import _tiny_bert

    model, cfg = _tiny_bert(7)
    rng = np.random.default_rng(8)
    ids = rng.integers(1, 100, (4, 24)).astype(np.int32)
    mask, tt = np.ones_like(ids), np.zeros_like(ids)
    engines = {}
    for gptq in (False, True):
        eng = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu", dtype="fp8",  # type: ignore[arg-type]
                                          backend="torch", fp8_calibrated_min_tokens=1)
        with eng.calibrating(gptq=gptq):
            eng.infer(ids, mask, tt)
        engines[gptq] = eng
    plain, ours = engines[False], engines[True]
    assert plain.calibration is not None and plain.calibration.grams is None
    cal = ours.calibration
    assert cal is not None and cal.grams is not None
    assert cal.amax == plain.calibration.amax
    for name, sizes in (("qkv", 48), ("attn_out", 48), ("ffn_in", 48), ("ffn_out", 96)):
        assert len(cal.grams[name]) == 2
        for i, h in enumerate(cal.grams[name]):
            assert h.shape == (sizes, sizes) and torch.allclose(h, h.t())
            assert float(torch.linalg.eigvalsh(h.double()).min()) > -1e-6 * float(h.diagonal().max())
            a, b = (getattr(e.weights.calibrated[i], name) for e in (plain, ours))  # type: ignore[index]
            assert torch.equal(a.w_scale, b.w_scale) and not torch.equal(a.w8.float(), b.w8.float())
            w = getattr(ours.weights.layers[i], name).weight
            assert output_error(w, b.w8, b.w_scale, h) < output_error(w, a.w8, a.w_scale, h)
    test_ids = rng.integers(1, 100, (2, 20)).astype(np.int32)
    args = (test_ids, np.ones_like(test_ids), np.zeros_like(test_ids))
    for a, b in zip(ours.infer(*args), plain.infer(*args), strict=True):
        assert np.abs(a - b).max() < 0.1 * max(float(np.abs(b).max()), 1.0)


def test_fp8_accuracy_regrids_calibrated_weights_by_gptq() -> None:
    """``fp8_accuracy._regrid`` with the calibration's Gram matrices rounds each calibrated
    weight by GPTQ on the coarser grid (its scale times the grid), not to nearest."""
    from benchmarks.fp8_accuracy import _regrid, _rounded
    from engine.fused.calibration import GEMMS
    from engine.fused.engine import FusedEngine
    from tests.unit.test_folding import _tiny_bert

    model, cfg = _tiny_bert(9)
    eng = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu", dtype="fp8",  # type: ignore[arg-type]
                                      backend="torch", fp8_calibrated_min_tokens=1)
    ids = np.random.default_rng(10).integers(1, 100, (3, 24)).astype(np.int32)
    with eng.calibrating(gptq=True):
        eng.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    assert eng.calibration is not None and eng.calibration.grams is not None
    grams = eng.calibration.grams
    ours, nearest = _regrid(eng.weights, 1.07, grams=grams), _regrid(eng.weights, 1.07)
    assert ours.calibrated is not None and nearest.calibrated is not None
    for i, ly in enumerate(eng.weights.layers):
        for name in GEMMS:
            w = getattr(ly, name).weight
            _, scale = _rounded(w, w.shape[0], 1.07)
            lin = getattr(ours.calibrated[i], name)
            assert torch.equal(lin.w_scale, scale.reshape(1))
            assert torch.equal(lin.w8.float(), gptq_e4m3(w, grams[name][i], scale).float())
            assert not torch.equal(lin.w8.float(), getattr(nearest.calibrated[i], name).w8.float())
