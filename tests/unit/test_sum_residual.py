"""The residual kept as a sum (``residual.SumResidual``, ``encoder.OUT_PROJ_ADDS_RESIDUAL``)
through the PyTorch op set: the spec the Triton kernels are checked against
(tests/unit/test_fused_kernels.py runs them under the interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.fused import torch_ops
from engine.fused.residual import SumResidual


def test_layernorm_quant_is_the_residual_layernorm_of_the_sum() -> None:
    g = torch.Generator().manual_seed(4)
    s = (torch.randn(9, 64, generator=g) * 3 + 1).half()
    bias, gamma, beta = (torch.randn(64, generator=g) for _ in range(3))
    scale = torch.tensor([0.01])
    q, moments = torch_ops.layernorm_quant(s, bias, gamma, beta, 1e-5, fp8_scale=scale)
    _, ref = torch_ops.bias_residual_layernorm(s, bias, torch.zeros_like(s), gamma, beta,
                                               1e-5, fp8=True, fp8_scale=scale)
    assert ref is not None and torch.equal(q.data.view(torch.uint8), ref.data.view(torch.uint8))
    x = s.double() + bias.double()
    assert torch.allclose(moments[:, 0].double(), x.mean(1), atol=1e-5)
    assert torch.allclose(moments[:, 1].double(), 1 / torch.sqrt(x.var(1, correction=0) + 1e-5),
                          rtol=1e-5)
    # The sum normalized with those moments is the LayerNorm.
    value = SumResidual(s, moments, bias, gamma, beta).value()
    want = torch.nn.functional.layer_norm(x.float(), (64,), gamma, beta, 1e-5)
    assert torch.allclose(value, want, atol=1e-4)


@pytest.mark.parametrize("adds", [False, True])
def test_engine_with_the_out_projection_adding_the_residual(
        monkeypatch: pytest.MonkeyPatch, adds: bool) -> None:
    """The calibrated tiny BERT with and without the out-projection adding the residual:
    the same logits within a small fraction of their range (the LayerNorm reads the
    un-rounded sum instead of a rounded hidden state), and ``layernorm_quant`` runs once
    a layer only when asked."""
    from engine.fused import encoder
    from tests.launch_spy import calls
    from tests.unit.test_folding import calibrated_tiny_fp8

    eng, cfg, (ids, mask, tt) = calibrated_tiny_fp8()
    monkeypatch.setattr(encoder, "OUT_PROJ_ADDS_RESIDUAL", False)
    plain = eng.infer(ids, mask, tt)
    monkeypatch.setattr(encoder, "OUT_PROJ_ADDS_RESIDUAL", adds)
    with calls(torch_ops, "layernorm_quant") as quant:
        got = eng.infer(ids, mask, tt)
    assert len(quant) == (cfg.num_layers if adds else 0)
    for a, b in zip(got, plain, strict=True):
        span = float(np.ptp(b))
        assert float(np.abs(a - b).max()) <= 0.01 * span
        if not adds:
            assert np.array_equal(a, b)
