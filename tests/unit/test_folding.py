"""The LayerNorm folding behind the deferred small-batch path (``engine.fused.folding``) and
the torch spec of that path (``torch_ops``), on the CPU without Triton."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.fused.folding import fold_linear
from engine.fused.weights import Linear


def test_folded_linear_equals_layernorm_then_linear() -> None:
    """r * (x @ W'^T - mean * u) + (W beta + b) == LN(x) @ W^T + b, on rows whose mean is
    large against their spread (where a wrong mean term shows at once). The spec computes
    in float32: outputs of ~30 agree to float32 rounding of the ~500-sized products."""
    from engine.fused import torch_ops

    g = torch.Generator().manual_seed(0)
    k, n, eps = 96, 40, 1e-12
    lin = Linear(torch.randn(n, k, generator=g, dtype=torch.float64),
                 torch.randn(n, generator=g, dtype=torch.float64))
    gamma = torch.randn(k, generator=g, dtype=torch.float64)
    beta = torch.randn(k, generator=g, dtype=torch.float64)
    x = torch.randn(7, k, generator=g, dtype=torch.float64) + 5.0
    f = fold_linear(lin, gamma, beta)
    ref = torch.nn.functional.layer_norm(x, (k,), gamma, beta, eps) @ lin.weight.t() + lin.bias
    sums = torch.stack([x.sum(1), (x * x).sum(1)], 1)
    out = torch_ops.folded_linear(x, f.weight, f.colsum, f.bias, sums, eps)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-3)
    wrong = torch_ops.folded_linear(x, f.weight, torch.zeros_like(f.colsum), f.bias, sums, eps)
    assert (wrong - ref).abs().max() > 1.0


def test_colsum_is_of_the_rounded_folded_weight() -> None:
    g = torch.Generator().manual_seed(1)
    lin = Linear(torch.randn(16, 32, generator=g).half(), torch.zeros(16))
    f = fold_linear(lin, torch.rand(32, generator=g) * 3, torch.zeros(32))
    assert f.weight.dtype == torch.float16
    assert torch.equal(f.colsum, f.weight.float().sum(1))


def _tiny_bert(seed: int):  # type: ignore[no-untyped-def]
    """(HF BERT QA model, our config): 2 layers, hidden 48, parameters moved off their
    init, embeddings shifted so rows have a large mean."""
    transformers = pytest.importorskip("transformers")
    from engine.fused.config import BertQAConfig

    torch.manual_seed(seed)
    hf = transformers.BertConfig(vocab_size=100, hidden_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=96,
                                 max_position_embeddings=64)
    model = transformers.BertForQuestionAnswering(hf).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.bert.embeddings.word_embeddings.weight.add_(0.5)  # rows with a large mean
    return model, BertQAConfig.from_dict(hf.to_dict())


def calibrated_tiny_fp8(seed: int = 11):  # type: ignore[no-untyped-def]
    """(engine, config, (ids, mask, token types)): :func:`_tiny_bert` as a calibrated FP8
    engine on the PyTorch ops (every batch on the calibrated large path), calibrated on
    the 3 x 20 batch it returns."""
    from engine.fused.engine import FusedEngine

    model, cfg = _tiny_bert(seed)
    eng = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu", dtype="fp8",
                                      backend="torch", fp8_calibrated_min_tokens=1)
    ids = np.random.default_rng(12).integers(1, 100, (3, 20)).astype(np.int32)
    batch = (ids, np.ones_like(ids), np.zeros_like(ids))
    eng.calibrate(*batch)
    return eng, cfg, batch


@pytest.mark.parametrize("splits", [False, True])
def test_deferred_torch_path_matches_seven_kernel_path(splits: bool) -> None:
    """The whole encoder through the torch spec: the layer without LayerNorm kernels gives
    the logits of the layer with them (bfloat16 weights, float32 math)."""
    from engine.fused.engine import FusedEngine

    model, cfg = _tiny_bert(3)
    plans = {"ffn2": (None, 2)} if splits else None
    kw = dict(device="cpu", dtype="bfloat16", backend="torch", small_batch_max_tokens=512,
              gemm_plans=plans)
    deferred = FusedEngine.from_state_dict(model.state_dict(), cfg, **kw)  # type: ignore[arg-type]
    seven = FusedEngine(deferred.weights, "cpu", backend="torch", small_batch_max_tokens=512,
                        deferred_ln_max_hidden=None)
    assert deferred.weights.folded is not None
    rng = np.random.default_rng(4)
    ids = rng.integers(1, 100, (3, 20)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 12:] = 0
    tt = np.zeros_like(ids)
    tt[:, 8:] = 1
    a, b = deferred.infer(ids, mask, tt), seven.infer(ids, mask, tt)
    keep = mask.astype(bool)
    for x, y in zip(a, b, strict=True):
        scale = max(float(np.abs(y[keep]).max()), 1.0)
        assert np.abs(x[keep] - y[keep]).max() / scale < 2e-2


def test_deferred_fp8_torch_path_and_its_calibration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Calibration records the un-normalised inputs the deferred layer quantizes (the
    embeddings' sum, the residual sums), which give it e4m3 layers (``folded8``); with
    ``fp8_deferred`` the small batch runs them (logits move, a little), without it they
    are ignored. A calibration saved without those inputs (an older file) still loads,
    and then the deferred layer stays 16-bit."""
    from engine.fused.calibration import RAW_INPUTS, Calibration
    from engine.fused.engine import FusedEngine

    model, cfg = _tiny_bert(5)
    eng = FusedEngine.from_state_dict(model.state_dict(), cfg, device="cpu", dtype="fp8",  # type: ignore[arg-type]
                                      backend="torch", small_batch_max_tokens=512,
                                      fp8_calibrated_min_tokens=1 << 30, fp8_deferred=False)
    rng = np.random.default_rng(6)
    eng.calibrate(rng.integers(1, 100, (4, 24)).astype(np.int32),
                  np.ones((4, 24), np.int32), np.zeros((4, 24), np.int32))
    cal = eng.calibration
    assert cal is not None and cal.has_raw_inputs and eng.weights.folded8 is not None
    tables = model.bert.embeddings
    emb = sum(float(t.weight.detach().abs().max()) for t in (
        tables.word_embeddings, tables.position_embeddings, tables.token_type_embeddings))
    assert 0 < cal.amax["qkv_raw"][0] <= emb + 1e-3
    assert all(a > 0 for g in RAW_INPUTS for a in cal.amax[g])

    ids = rng.integers(1, 100, (2, 20)).astype(np.int32)
    mask, tt = np.ones_like(ids), np.zeros_like(ids)
    plain = eng.infer(ids, mask, tt)
    fp8 = FusedEngine(eng.weights, "cpu", backend="torch", small_batch_max_tokens=512,
                      fp8_calibrated_min_tokens=1 << 30, fp8_deferred=True).infer(ids, mask, tt)
    for a, b in zip(fp8, plain, strict=True):
        assert not np.array_equal(a, b)
        assert np.abs(a - b).max() < 0.1 * max(float(np.abs(b).max()), 1.0)

    cal.save(tmp_path / "cal.json")
    assert Calibration.load(tmp_path / "cal.json").amax == cal.amax
    old = Calibration({g: v for g, v in cal.amax.items() if g not in RAW_INPUTS}, cal.margin)
    assert not old.has_raw_inputs and old.deferred_for(eng.weights) is None
    with pytest.raises(ValueError, match="optionally"):
        Calibration({**old.amax, "qkv_raw": cal.amax["qkv_raw"]}, cal.margin)
