"""Block-wise FP8 (``engine.fused.fp8``, ``engine.fused.cutlass_fp8``) on the CPU.

The quantizers and the dequantizing GEMM spec run anywhere. The CUDA library's layouts are
checked against what the kernels write when nvcc can build it here (``engine/fused/cuda/
build.sh``: no GPU needed; the GEMM itself runs in the GPU suite).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from engine.fused import cutlass_fp8
from engine.fused.fp8 import (
    BLOCK,
    FP8_MAX,
    Quantized,
    dequantize,
    dequantize_weight_blocks,
    padded_rows,
    quantize_blocks,
    quantize_weight_blocks,
    scaled_linear,
)

REPO = Path(__file__).resolve().parents[2]


def test_activation_blocks_have_one_scale_per_row_per_128_columns() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(45, 384, generator=g)
    x[:, 130] = 300.0  # an outlier: only block 1 of every row pays for it
    q = quantize_blocks(x)
    assert q.blocks and q.data.shape == (45, 384) and q.scale.shape == (3, padded_rows(45))
    assert q.data.untyped_storage().nbytes() >= padded_rows(45) * 384  # rows padded to 4
    expect = x.view(45, 3, BLOCK).abs().amax(2).t() / FP8_MAX
    assert torch.allclose(q.scale[:, :45], expect)
    assert float(q.scale[1, :45].min()) > 10 * float(q.scale[0, :45].max())
    err = (dequantize(q) - x).abs()  # e4m3: 2**-4 relative, or the subnormal step
    step = q.scale[:, :45].t().repeat_interleave(BLOCK, dim=1) * 2.0**-9
    assert float((err / (x.abs() * 2.0**-4 + step + 1e-9)).max()) <= 1.0


def test_weight_blocks_have_one_scale_per_128x128_block() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(256, 384, generator=g) * 0.05
    w[:128, :128] *= 40
    w8, s = quantize_weight_blocks(w)
    assert w8.dtype == torch.float8_e4m3fn and s.shape == (2, 3)
    assert torch.allclose(s, w.view(2, 128, 3, 128).abs().amax(dim=(1, 3)) / FP8_MAX)
    assert float(s[0, 0]) > 10 * float(s[1, 1])
    err = (dequantize_weight_blocks(w8, s) - w).abs()
    step = s.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1) * 2.0**-9
    assert float((err / (w.abs() * 2.0**-4 + step + 1e-9)).max()) <= 1.0


def test_block_gemm_spec_is_the_product_of_the_dequantized_operands() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(33, 256, generator=g)
    x[:, 7] = 200.0  # an outlier channel: its block's scale alone grows
    w = torch.randn(128, 256, generator=g) * 0.05
    xq, (w8, ws) = quantize_blocks(x), quantize_weight_blocks(w)
    y = scaled_linear(xq, w8, ws, torch.float32)
    exact = dequantize(xq) @ dequantize_weight_blocks(w8, ws).t()
    assert y.shape == (33, 128) and torch.allclose(y, exact, rtol=1e-5, atol=1e-4)
    ref = x @ w.t()
    assert float((y - ref).abs().mean()) < 0.03 * float(ref.abs().mean())


def test_widths_off_the_block_grid_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_blocks(torch.zeros(4, 100))
    with pytest.raises(ValueError, match="multiples of 128"):
        quantize_weight_blocks(torch.zeros(100, 128))


def test_gemm_binding_checks_shapes_before_touching_the_library() -> None:
    x = quantize_blocks(torch.zeros(8, 256))
    w8, s = quantize_weight_blocks(torch.zeros(128, 128))  # K mismatch: 128 vs 256
    with pytest.raises(ValueError, match="block-wise GEMM"):
        cutlass_fp8.blockwise_gemm(x, w8, s, torch.float16)
    bad = Quantized(x.data, x.scale[:1], blocks=True)
    w8, s = quantize_weight_blocks(torch.zeros(128, 256))
    with pytest.raises(ValueError, match="block-wise GEMM"):
        cutlass_fp8.blockwise_gemm(bad, w8, s, torch.float16)


def test_missing_library_is_a_clear_error(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QA_FP8_BLOCKWISE_LIB", str(tmp_path / "absent.so"))
    cutlass_fp8.LIBRARY.forget()
    try:
        assert not cutlass_fp8.LIBRARY.available()
        with pytest.raises(RuntimeError, match=r"build\.sh"):
            cutlass_fp8.LIBRARY.load()
    finally:
        cutlass_fp8.LIBRARY.forget()


@pytest.fixture(scope="module")
def built_library() -> Path:
    """The CUDA library, built here with nvcc if it is not built yet (~1 minute)."""
    path = REPO / "build" / "cuda" / cutlass_fp8.LIB_NAME
    if not path.is_file():
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not Path(nvcc).is_file():
            pytest.skip("no nvcc here: the block-wise FP8 library cannot be built")
        proc = subprocess.run(["bash", str(REPO / "engine/fused/cuda/build.sh"), "lib"],
                              capture_output=True, text=True, env={**os.environ, "NVCC": nvcc},
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return path


def test_library_scale_layouts_match_what_the_kernels_write(
        built_library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SFA M-major (``block * M4 + row``), SFB K-major (``n_block * K/128 + k_block``):
    the layouts ``quantize_blocks``/``quantize_weight_blocks`` and the row kernels write."""
    monkeypatch.setenv("QA_FP8_BLOCKWISE_LIB", str(built_library))
    cutlass_fp8.LIBRARY.forget()
    try:
        for m, n, k in ((48, 256, 384), (47392, 1024, 4096)):
            assert cutlass_fp8.scale_offsets(m, n, k) == (1, m, k // BLOCK, 1)
        q = quantize_blocks(torch.randn(45, 384))
        assert q.scale.stride() == (padded_rows(45), 1)
        _, s = quantize_weight_blocks(torch.randn(256, 384))
        assert s.stride() == (384 // BLOCK, 1)
    finally:
        cutlass_fp8.LIBRARY.forget()
