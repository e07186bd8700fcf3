"""Row chunks on the calibrated large path (``EncodeOptions.row_chunk_tokens``), through the
torch op set: the same logits as whole batches, the chunked layer really run, and the
residual LayerNorm's output buffers (``out``, ``out8``) checked. The Triton kernels' side
runs under the interpreter (``test_fused_kernels``: ``row_chunks_*``)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

STATIC_SETS = [("qkv", "ffn_in", "ffn_out"), ("qkv", "attn_out", "ffn_in", "ffn_out")]


def _engines(static: tuple[str, ...], chunk: int):  # type: ignore[no-untyped-def]
    from engine.fused.engine import FusedEngine
    from tests.unit.test_folding import _tiny_bert

    model, cfg = _tiny_bert(21)
    opts = {"device": "cpu", "backend": "torch", "fp8_calibrated_min_tokens": 1,
            "fp8_static_inputs": static}
    whole = FusedEngine.from_state_dict(model.state_dict(), cfg, dtype="fp8",  # type: ignore[arg-type]
                                        **opts)
    rng = np.random.default_rng(22)
    ids = rng.integers(1, 100, (4, 24)).astype(np.int32)
    whole.calibrate(ids, np.ones_like(ids), np.zeros_like(ids))
    chunked = FusedEngine(whole.weights, row_chunk_tokens=chunk, **opts)  # type: ignore[arg-type]
    return whole, chunked


@pytest.mark.parametrize("static", STATIC_SETS)
@pytest.mark.parametrize("chunk", [1, 7, 40])
def test_chunked_rows_give_the_whole_batch_logits(static: tuple[str, ...], chunk: int) -> None:
    from engine.fused import encoder

    whole, chunked = _engines(static, chunk)
    rng = np.random.default_rng(23)
    lengths = np.array([30, 5, 17, 24])
    ids = rng.integers(1, 100, (4, 30)).astype(np.int32)
    mask = (np.arange(30)[None, :] < lengths[:, None]).astype(np.int32)
    tt = ((np.arange(30)[None, :] >= 4) & (mask == 1)).astype(np.int32)
    real = encoder._rows_in_chunks
    with mock.patch.object(encoder, "_rows_in_chunks", side_effect=real) as spy:
        got = chunked.infer(ids, mask, tt)
    assert spy.call_count == 1  # layer 0 of 2; the last layer ends in the QA head
    assert spy.call_args.args[6] == chunk
    want = whole.infer(ids, mask, tt)
    # The same rows through the same steps; a GEMM of fewer rows may sum in another order
    # (float32 ulps, now and then one e4m3 rounding flipped downstream).
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=5e-4)


def test_chunks_as_large_as_the_batch_take_the_whole_batch_path() -> None:
    from engine.fused import encoder

    _, chunked = _engines(STATIC_SETS[0], 10_000)
    ids = np.arange(1, 25, dtype=np.int32).reshape(2, 12)
    with mock.patch.object(encoder, "_rows_in_chunks") as spy:
        chunked.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    spy.assert_not_called()


def test_uncalibrated_and_per_token_ffn_paths_ignore_chunks() -> None:
    """Chunks need FFN1 + GELU + e4m3 as one GEMM at calibrated scales: with the FFN's
    inputs per token the option changes nothing."""
    from engine.fused import encoder

    _, chunked = _engines(("qkv",), 3)
    ids = np.arange(1, 25, dtype=np.int32).reshape(2, 12)
    with mock.patch.object(encoder, "_rows_in_chunks") as spy:
        chunked.infer(ids, np.ones_like(ids), np.zeros_like(ids))
    spy.assert_not_called()


@pytest.mark.parametrize("ops_name", ["torch_ops"])
def test_layernorm_writes_into_given_row_slices(ops_name: str) -> None:
    import importlib

    from engine.fused.fp8 import FP8_DTYPE

    ops = importlib.import_module(f"engine.fused.{ops_name}")
    g = torch.Generator().manual_seed(5)
    t, d = 9, 32
    a, res = torch.randn(t, d, generator=g).half(), torch.randn(t, d, generator=g).half()
    bias, gamma, beta = (torch.randn(d, generator=g) for _ in range(3))
    scale = torch.tensor([0.02])
    want, wq = ops.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5, fp8=True,
                                           fp8_scale=scale)
    big = torch.full((t + 4, d), 7.0).half()
    big8 = torch.zeros((t + 4, d), dtype=FP8_DTYPE)
    big[2:2 + t] = res
    got, gq = ops.bias_residual_layernorm(a, bias, big[2:2 + t], gamma, beta, 1e-5, fp8=True,
                                          fp8_scale=scale, out=big[2:2 + t],
                                          out8=big8[2:2 + t])
    assert torch.equal(big[2:2 + t], want) and got.data_ptr() == big[2].data_ptr()
    assert gq is not None and wq is not None and gq.data.data_ptr() == big8[2].data_ptr()
    assert torch.equal(big8[2:2 + t].float(), wq.data.float())
    assert (big[:2] == 7).all() and (big[2 + t:] == 7).all()
    assert (big8[:2].float() == 0).all() and (big8[2 + t:].float() == 0).all()
    with pytest.raises(ValueError, match="out8"):
        ops.bias_residual_layernorm(a, bias, res, gamma, beta, 1e-5, fp8=True,
                                    out8=big8[:t])
