"""FP8 (e4m3) activations and GEMMs, with two ways to scale them.

**Rows** (the default): a GEMM ``y = x @ w.T`` runs as ``(xq * sx) @ (wq * sw).T`` where
``sx`` is one float32 scale per row of ``x`` (per token) and ``sw`` one per row of ``w``
(per output channel), so one outlier token or channel costs only its own precision. On the
GPU this is ``torch._scaled_mm`` with row-wise scales (cuBLASLt, sm_89+).

**Blocks** (opt-in, Hopper): one scale per token per 128 input channels (1x128) and one
per 128x128 block of ``w`` (DeepSeek-V3's recipe): finer than per token, and a kernel that
writes a 128-column tile can scale it without seeing the whole row. On the GPU this is
CUTLASS's block-scaled sm90 GEMM (``engine.fused.cutlass_fp8``). Activation scales are
stored M-major, ``[K/128, M4]`` with ``M4`` the row count rounded up to a multiple of 4
(GEMMs read them in 16-byte rows), and the e4m3 rows are a ``[M, K]`` view of a ``[M4, K]``
buffer. Measured (H200, 2026-11-30, BERT-large SQuAD mix): the whole FP8 pass 47.3 ms with
blocks vs 44.4 with rows, F1 77.64 vs 77.69 (reference 77.68); cuBLAS's ``_scaled_mm``
also takes these scales when ``M4`` rows are passed, and ran QKV and FFN1 faster than this
CUTLASS build on the same operands (``benchmarks/GPU_RESULTS.md``, v8).

**Calibrated** (opt-in, ``FusedEngine.calibrating``): static scales, as TensorRT's FP8/INT8
calibration has them. The inputs of the GEMMs named in ``fp8_static_inputs`` (by default
QKV, FFN1 and FFN2; the attention output too on request) take one scale for the tensor,
fixed from activations seen on calibration data (``engine.fused.calibration``), and their
weights one scale. Then no scale depends on the batch: the LayerNorm (and, for a static
attention output, the attention) kernels write their e4m3 outputs with the given scales,
FFN1 + bias + GELU + e4m3 is one cuBLASLt GEMM whose epilogue writes FFN2's input
(:func:`calibrated_ffn1`), and those GEMMs run with per-tensor scales
(:func:`static_linear`, ``engine.fused.cublaslt``), which cuBLASLt runs faster than
row-wise ones, most of all at a few hundred tokens (H200, BERT-large FFN2 at 384 tokens:
6.2 vs 12.9 µs). Measured results: ``engine/fused/NOTES.md`` (v9-v11).

**Fast accumulation** (``fast_accum``, the engine's ``fp8_fast_accum``, on by default): the
tensor cores accumulate in their own precision throughout, without cuBLAS's periodic
promotion to float32. H200, BERT-large SQuAD mix: 8-20% faster GEMMs, whole FP8 pass 44.1
-> 40.6 ms; GEMM error 1e-3 of the output's size at K = 4096 (FP8 rounding of the
operands: ~2e-2); logit error against fp32 on the shipped MiniLM 0.0578 vs 0.0583.

Elsewhere everything is computed by dequantizing (the readable spec, used on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
SCALE_MIN = 1e-12  # keeps an all-zero row finite


BLOCK = 128  # block-wise scaling: columns per activation scale, rows and columns per weight scale
# The calibrated FFN1 (:func:`calibrated_ffn1`) with fast accumulation on a Hopper GPU runs
# as the warp-specialized Gluon kernel (``kernels.gluon_gemm``) from this many rows up,
# cuBLASLt below (None: always cuBLASLt). Read at each call, so an A/B can set it. Off: it
# is faster alone but the settled mix pass does not gain (engine/fused/NOTES.md v41; on
# v42-v43's default, v45: -1.3%, the whole pass at 1,605 MHz against 1,740-1,755).
FFN1_GLUON_MIN_ROWS: int | None = None


@dataclass(frozen=True)
class Quantized:
    """``data * scale ~= x``: ``data`` [rows, cols] e4m3; ``scale`` [rows, 1] float32, or
    with ``blocks`` [cols/128, rows rounded up to 4], or [1] (one calibrated scale for the
    tensor; see the module docstring)."""

    data: torch.Tensor
    scale: torch.Tensor
    blocks: bool = False


def padded_rows(rows: int) -> int:
    """Rows of a block-scaled activation's buffers: a multiple of 4."""
    return -(-rows // 4) * 4


def quantize_tiles(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric e4m3 quantization of 2-D ``x`` with one float32 scale (amax / 448) per
    ``rows x cols`` tile: (e4m3 copy [R, C], scales [ceil(R/rows), ceil(C/cols)]). Edge
    tiles are padded with zeros; an all-zero tile gets SCALE_MIN. Every scheme here is one
    tiling: per row (1 x C), 1x128 activations, 128x128 weights."""
    r, c = x.shape
    pr, pc = -(-r // rows) * rows, -(-c // cols) * cols
    x32 = x.float()
    if (pr, pc) != (r, c):
        x32 = torch.zeros((pr, pc), device=x.device, dtype=torch.float32)
        x32[:r, :c] = x
    tiles = x32.view(pr // rows, rows, pc // cols, cols)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=SCALE_MIN)
    # A multiply by the reciprocal, as the kernels do (one division per tile).
    data = (tiles * (1.0 / scale)[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return data.view(pr, pc)[:r, :c], scale.contiguous()


def quantize_blocks(x: torch.Tensor) -> Quantized:
    """Block-wise (1x128) e4m3 quantization of a 2-D tensor whose width is a multiple of
    128, in the layout of the module docstring (padding rows hold zeros, scale SCALE_MIN)."""
    rows, cols = x.shape
    if cols % BLOCK:
        raise ValueError(f"block-wise FP8 needs a width that is a multiple of {BLOCK}, got {cols}")
    padded = torch.zeros((padded_rows(rows), cols), device=x.device, dtype=x.dtype)
    padded[:rows] = x
    data, scale = quantize_tiles(padded, 1, BLOCK)  # scale [M4, cols/128]
    return Quantized(data[:rows], scale.t().contiguous(), blocks=True)


def quantize_weight_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 copy of a weight [N, K] (multiples of 128) and its float32 scales [N/128, K/128],
    one per 128x128 block."""
    n, k = w.shape
    if n % BLOCK or k % BLOCK:
        raise ValueError(f"block-wise FP8 needs weights in multiples of {BLOCK}, got {n}x{k}")
    return quantize_tiles(w, BLOCK, BLOCK)


def quantize_rows(x: torch.Tensor) -> Quantized:
    """Per-row symmetric e4m3 quantization of a 2-D tensor (round to nearest even)."""
    return Quantized(*quantize_tiles(x, 1, x.shape[1]))


def e4m3_times(x: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """e4m3 ``x * inv`` (``inv`` = 1 / the scale), saturating at +-448: what the kernels'
    e4m3 stores compute."""
    return (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_static(x: torch.Tensor, scale: torch.Tensor) -> Quantized:
    """e4m3 copy of ``x`` with one given float32 scale ([1]; a calibrated one): values
    beyond ``448 * scale`` saturate."""
    return Quantized(e4m3_times(x, 1.0 / scale), scale)


def dequantize(q: Quantized) -> torch.Tensor:
    """float32 ``data * scale``."""
    if q.blocks:
        rows = q.data.shape[0]
        return q.data.float() * q.scale.t()[:rows].repeat_interleave(BLOCK, dim=1)
    return q.data.float() * q.scale


def dequantize_weight_blocks(w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 weight of :func:`quantize_weight_blocks`' output."""
    s = scale.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    return w8.float() * s


def scaled_linear(
    xq: Quantized, w8: torch.Tensor, w8_scale: torch.Tensor, out_dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``x @ w.T`` from e4m3: ``xq`` [M, K] per-row scaled, ``w8`` [N, K] with ``w8_scale`` [1, N];
    or, with ``xq.blocks``, both block-scaled (``w8_scale`` [N/128, K/128]). ``fast_accum``:
    see the module docstring (row-wise GEMMs on the GPU only).

    ``w8.t()`` is the column-major [K, N] operand ``_scaled_mm`` wants, at no copy.
    """
    if xq.blocks:
        if xq.data.is_cuda:
            from engine.fused.cutlass_fp8 import blockwise_gemm

            return blockwise_gemm(xq, w8, w8_scale, out_dtype)
        w = dequantize_weight_blocks(w8, w8_scale)
        return (dequantize(xq) @ w.t()).to(out_dtype)
    if xq.data.is_cuda:
        out: torch.Tensor = torch._scaled_mm(
            xq.data, w8.t(), scale_a=xq.scale, scale_b=w8_scale, out_dtype=out_dtype,
            use_fast_accum=fast_accum,
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


@dataclass(frozen=True)
class StaticLinear:
    """A GEMM's calibrated FP8 operands: the one scale its input is quantized with, and its
    weight in e4m3 with one scale (see the module docstring)."""

    x_scale: torch.Tensor  # [1] float32
    w8: torch.Tensor  # [N, K] e4m3
    w_scale: torch.Tensor  # [1] float32


@dataclass(frozen=True)
class CalibratedLayer:
    """One layer's calibrated GEMMs. ``attn_out.x_scale`` is the scale attention writes
    its e4m3 output with; ``ffn_out.x_scale`` FFN1's (its epilogue writes with it)."""

    qkv: StaticLinear
    attn_out: StaticLinear
    ffn_in: StaticLinear
    ffn_out: StaticLinear
    b1: torch.Tensor  # [F] bfloat16: FFN1's epilogue bias
    h_inv: torch.Tensor  # [1] float32: 1 / ffn_out.x_scale, the epilogue's multiplier


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh form, which cuBLASLt's GELU epilogue computes."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def _static_math(xq: Quantized, lin: StaticLinear) -> torch.Tensor:
    """float32 ``x @ w^T`` of calibrated operands, by dequantization (the CPU spec)."""
    return dequantize(xq) @ (lin.w8.float() * lin.w_scale).t()


def static_linear(xq: Quantized, lin: StaticLinear, out_dtype: torch.dtype,
                  fast_accum: bool = False) -> torch.Tensor:
    """``x @ w^T`` in ``out_dtype`` from ``xq`` quantized with ``lin.x_scale``: one cuBLASLt
    GEMM with per-tensor scales on the GPU, dequantized math elsewhere."""
    if xq.data.is_cuda:
        from engine.fused.cublaslt import fp8_linear

        return fp8_linear(xq.data, lin.x_scale, lin.w8, lin.w_scale, out_dtype,
                          fast_accum=fast_accum)
    return _static_math(xq, lin).to(out_dtype)


def _gluon_ffn1(xq: torch.Tensor, w8: torch.Tensor) -> Any:
    """``kernels.gluon_gemm`` where :data:`FFN1_GLUON_MIN_ROWS` sends these operands to it
    and it takes them (a Triton with Gluon, a Hopper GPU), else None."""
    if FFN1_GLUON_MIN_ROWS is None or xq.shape[0] < FFN1_GLUON_MIN_ROWS:
        return None
    try:
        from engine.fused.kernels import gluon_gemm
    except ImportError:  # a Triton without Gluon's Hopper warp specialization
        return None
    return gluon_gemm if gluon_gemm.supports(xq, w8) else None


def calibrated_ffn1(xq: Quantized, cal: CalibratedLayer, fast_accum: bool = False) -> Quantized:
    """FFN2's e4m3 input ``GELU(x @ W1^T + b1)``, scaled by ``cal.ffn_out.x_scale``, from
    ``xq`` quantized with ``cal.ffn_in.x_scale``: one cuBLASLt GEMM (bias + GELU + e4m3 in
    its epilogue) on the GPU, or the Gluon kernel where :data:`FFN1_GLUON_MIN_ROWS` asks
    for it; dequantized math elsewhere."""
    h_scale = cal.ffn_out.x_scale
    lin = cal.ffn_in
    if xq.data.is_cuda:
        gluon = _gluon_ffn1(xq.data, lin.w8) if fast_accum else None
        if gluon is not None:
            return Quantized(gluon.ffn1(xq.data, lin.x_scale, lin.w8, lin.w_scale, cal.b1,
                                        cal.h_inv), h_scale)
        from engine.fused.cublaslt import fp8_linear

        q = fp8_linear(xq.data, lin.x_scale, lin.w8, lin.w_scale, FP8_DTYPE, bias=cal.b1,
                       gelu=True, out_scale=cal.h_inv, fast_accum=fast_accum)
        return Quantized(q, h_scale)
    y = gelu_tanh(_static_math(xq, lin) + cal.b1.float())
    return quantize_static(y, h_scale)
