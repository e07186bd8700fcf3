"""Helpers of the GPU experiment tools that run without a GPU: ``cutlass_ffn1``'s output
comparison and ``gemm_workspace``'s per-configuration environments."""

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
