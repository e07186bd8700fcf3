"""Helpers of the GPU experiment tools that run without a GPU: ``cutlass_ffn1``'s output
comparison, ``gemm_workspace``'s per-configuration environments and ``fp8_accuracy``'s FP8
attention emulation."""

from __future__ import annotations

import pytest


def test_cutlass_ffn1_compares_e4m3_outputs() -> None:
    """``cutlass_ffn1.compare``: the share of differing elements and the largest difference
    (in units of the output scale) between two e4m3 outputs."""
    torch = pytest.importorskip("torch")
    from benchmarks.cutlass_ffn1 import compare

    ref = torch.tensor([[1.0, -2.0, 448.0, 0.0]] * 2).to(torch.float8_e4m3fn)
    assert compare(ref.clone(), ref) == {"differ": 0.0, "max_abs": 0.0}
    out = ref.clone()
    out[1, 2] = torch.tensor(416.0).to(torch.float8_e4m3fn)  # one e4m3 step below 448
    assert compare(out, ref) == {"differ": 1 / 8, "max_abs": 32.0}


def test_gemm_workspace_child_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each configuration's child gets its own settings and none of the others', even when
    the caller's shell has one set (the default must be the default)."""
    from benchmarks.gemm_workspace import CONFIGS, child_env

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setenv("LT_WORKSPACE_BYTES", "0")
    default = child_env("default")
    assert "CUBLAS_WORKSPACE_CONFIG" not in default and "LT_WORKSPACE_BYTES" not in default
    assert child_env("lt0")["LT_WORKSPACE_BYTES"] == "0"
    assert "CUBLAS_WORKSPACE_CONFIG" not in child_env("lt0")
    assert child_env("lt0_torch0")["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    assert set(CONFIGS) == {"default", "lt0", "lt0_torch0"}


def test_fp8_attention_emulation() -> None:
    """``fp8_accuracy.fp8_attention``: without rounding it is the engine's attention spec
    (``torch_ops.attention_varlen``); with Q/K/V and P in e4m3 it stays within e4m3's
    error of it (relative step 2**-3), and each rounding alone changes the output."""
    torch = pytest.importorskip("torch")
    from benchmarks.fp8_accuracy import fp8_attention
    from engine.fused import torch_ops

    g = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 70, 71, 200], dtype=torch.int32)
    qkv = torch.randn(200, 3 * 128, generator=g)
    bias = torch.randn(3 * 128, generator=g) * 0.1
    ref = torch_ops.attention_varlen(qkv, bias, cu, 129, 3, 4)
    exact = fp8_attention(qkv, bias, cu, 129, 3, 4, qkv8=False, p8=False)
    assert torch.allclose(exact, ref, atol=1e-5)
    outs = {}
    for qkv8, p8 in ((True, False), (False, True), (True, True)):
        out = fp8_attention(qkv, bias, cu, 129, 3, 4, config=None, tiles=None, qkv8=qkv8, p8=p8)
        err = float((out - ref).abs().max())
        assert 0 < err < 0.125 * float(ref.abs().max()), (qkv8, p8, err)
        outs[(qkv8, p8)] = out
    assert not torch.equal(outs[(True, False)], outs[(False, True)])
    # Per token and head scales for Q and K, per head for V: closer than one per tensor
    # when the heads' magnitudes differ (e4m3 is floating point: not by much).
    spread = qkv * torch.tensor([0.1, 1.0, 4.0, 0.5]).repeat_interleave(32).repeat(3)
    coarse = fp8_attention(spread, bias, cu, 129, 3, 4, p8=False)
    fine = fp8_attention(spread, bias, cu, 129, 3, 4, p8=False, fine=True)
    exact_s = torch_ops.attention_varlen(spread, bias, cu, 129, 3, 4)
    assert (fine - exact_s).abs().mean() < 0.9 * (coarse - exact_s).abs().mean()
    scale = torch.tensor([0.01])
    q8 = fp8_attention(qkv, bias, cu, 129, 3, 4, fp8_scale=scale)
    assert q8.dtype == torch.float8_e4m3fn
