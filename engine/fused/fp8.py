"""FP8 (e4m3) activations and GEMMs: per-token x per-output-channel scales.

A GEMM ``y = x @ w.T`` runs as ``(xq * sx) @ (wq * sw).T`` where ``sx`` is one float32 scale
per row of ``x`` (per token) and ``sw`` one per row of ``w`` (per output channel), so one
outlier token or channel costs only its own precision. On the GPU this is
``torch._scaled_mm`` with row-wise scales (cuBLASLt, sm_89+); elsewhere the same function
is computed by dequantizing (the readable spec, used on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
SCALE_MIN = 1e-12  # keeps an all-zero row finite


@dataclass(frozen=True)
class Quantized:
    """``data * scale ~= x``: ``data`` [rows, cols] e4m3, ``scale`` [rows, 1] float32."""

    data: torch.Tensor
    scale: torch.Tensor


def quantize_rows(x: torch.Tensor) -> Quantized:
    """Per-row symmetric e4m3 quantization of a 2-D tensor (round to nearest even)."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=SCALE_MIN)
    # A multiply by the reciprocal, as the kernels do (one division per row).
    data = (x32 * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Quantized(data, scale.contiguous())


def dequantize(q: Quantized) -> torch.Tensor:
    """float32 ``data * scale``."""
    return q.data.float() * q.scale


def scaled_linear(
    xq: Quantized, w8: torch.Tensor, w8_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``x @ w.T`` from e4m3: ``xq`` [M, K] per-row scaled, ``w8`` [N, K] with ``w8_scale`` [1, N].

    ``w8.t()`` is the column-major [K, N] operand ``_scaled_mm`` wants, at no copy.
    """
    if xq.data.is_cuda:
        out: torch.Tensor = torch._scaled_mm(
            xq.data, w8.t(), scale_a=xq.scale, scale_b=w8_scale, out_dtype=out_dtype
        )
        return out
    w = w8.float() * w8_scale.t()
    return (dequantize(xq) @ w.t()).to(out_dtype)


def rowwise_out_dtype(device: torch.device, preferred: torch.dtype) -> torch.dtype:
    """The output dtype row-wise ``_scaled_mm`` accepts here: ``preferred`` or else bfloat16.

    Older cuBLASLt / torch builds only produce bfloat16 from row-wise scaled GEMMs; the
    kernels downstream read any float dtype, so falling back costs nothing but a dtype.
    """
    if device.type != "cuda":
        return preferred
    a = torch.ones((16, 32), device=device).to(FP8_DTYPE)
    b = torch.ones((16, 32), device=device).to(FP8_DTYPE)
    sa = torch.ones((16, 1), device=device)
    sb = torch.ones((1, 16), device=device)
    try:
        torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=preferred)
        return preferred
    except RuntimeError:
        return torch.bfloat16
