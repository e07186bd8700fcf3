"""INT8 GEMMs with SmoothQuant smoothing, for the calibrated path's out-projection and FFN1
(``engine/fused/NOTES.md`` v49-v50).

Why: e4m3 keeps 3 mantissa bits whatever its scale, and the calibrated e4m3 default
already spends most of the 0.1 F1 budget (+0.093). int8 with one scale per output channel
is uniform and 2-3x finer at these GEMMs; SmoothQuant's per-input-channel factors take the
activations' outlier channels out of their one static scale. Emulated on the shipped
MiniLM (``benchmarks/int8_accuracy.py``, scheme ``int8_fo``): +0.033 F1 loss over 13
weight roundings with the out-projection 8-bit as well, where the e4m3 default loses
+0.093 with it 16-bit. Timed as stand-ins in the settled BERT-large mix pass
(``benchmarks/int8_standin.py``, H100): +3.5 to +4.1%.

The form, for a GEMM ``y = x W^T`` whose input ``x`` [T, K] had per-channel largest
magnitudes ``colmax`` [K] over the calibration:

* smoothing ``s_j = colmax_j^alpha / max_n |W_nj|^(1 - alpha)`` (:func:`smoothing`):
  ``x / s`` and ``W diag(s)`` multiply to the same product;
* the input's one static scale ``x_scale = max_j(colmax_j / s_j) / 127`` (margin 1, not
  the e4m3 calibration's: int8 has no range to spare, so inputs past the calibration's
  largest saturate at +-127; v49's emulation measured F1 with exactly this), and its
  copy ``q = round(x * mult)`` with ``mult_j = 1 / (s_j x_scale)``, written by the kernel
  ahead of the GEMM (the LayerNorm before FFN1, attention before the out-projection:
  ``store_rows_fp8``'s mode 4), returned as ``Quantized(q, mult)``: unlike an e4m3 copy's
  scale, ``mult`` is what the input was multiplied by (only the int8 GEMM reads it);
* the weight ``W diag(s)`` in int8 with one scale an output channel, its largest ``w_top``
  and each over it ``col`` (:func:`quantize_channels`, :func:`column_scales`);
* ``y = x_scale * w_top * col_n * (q w8^T)``, then the GEMM's epilogue (bias, GELU, e4m3
  for FFN2, or 16-bit): ``kernels.gluon_gemm`` on a Hopper GPU, float32 math elsewhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

INT8_MAX = 127.0
SMOOTHING_ALPHA = 0.75  # SmoothQuant's migration strength (v49's emulation)
COLMAX_MIN = 1e-5  # keeps a channel that never fired (or a zero weight column) finite


@dataclass(frozen=True)
class Int8Linear:
    """One GEMM's int8 operands (see the module docstring): the input's column multipliers
    ``mult`` [K] and scale ``x_scale`` [1], the smoothed weight ``w8`` int8 [N, K] with its
    largest channel scale ``w_top`` [1] and each channel's over it ``col`` [N]; all
    float32 but ``w8``."""

    mult: torch.Tensor
    x_scale: torch.Tensor
    w8: torch.Tensor
    w_top: torch.Tensor
    col: torch.Tensor


def smoothing(colmax: torch.Tensor, w: torch.Tensor, alpha: float = SMOOTHING_ALPHA,
              ) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors [K] for weight ``w`` [N, K] whose inputs'
    largest magnitudes per channel are ``colmax`` [K]."""
    return (colmax.float().clamp_min(COLMAX_MIN) ** alpha
            / w.float().abs().amax(0).clamp_min(COLMAX_MIN) ** (1 - alpha))


def check_int8_mult(mult: torch.Tensor, cols: int, fp8_scale: torch.Tensor | None) -> None:
    """An int8 copy's column multipliers: float32 [cols] on the copy's device, and no e4m3
    scale beside them (a copy is one or the other)."""
    if fp8_scale is not None:
        raise ValueError("an output copy is e4m3 (fp8_scale) or int8 (int8_mult), not both")
    if mult.dtype != torch.float32 or mult.shape != (cols,) or not mult.is_contiguous():
        raise ValueError(f"int8_mult must be a contiguous float32 [{cols}] tensor, got "
                         f"{mult.dtype} {list(mult.shape)}")


def quantize_int8(x: torch.Tensor, mult: torch.Tensor) -> torch.Tensor:
    """``round(x * mult)`` (nearest even) saturating at +-127, int8: the copy the kernels
    write in ``store_rows_fp8``'s mode 4."""
    return torch.round(x.float() * mult.float()).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def quantize_channels(w: torch.Tensor, grid: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of ``w`` [N, K] with one float32 scale an output channel (a row), on a
    grid ``grid`` times coarser than amax / 127: (int8 copy, scales [N])."""
    scales = (w.float().abs().amax(1) / INT8_MAX).clamp_min(1e-12) * grid
    w8 = torch.round(w.float() / scales[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return w8.contiguous(), scales


def column_scales(w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel weight scales [N] as the int8 kernel takes them (``gluon_gemm.gemm``):
    (their largest [1], each over it [N]), both float32, so its fp16 handoff never holds a
    value larger than the largest channel's."""
    top = w_scale.float().amax().reshape(1)
    return top.contiguous(), (w_scale.float() / top).contiguous()


def _weight(ws: torch.Tensor, grid: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 copy, largest scale [1], each over it [N]) of the smoothed weight ``ws``."""
    w8, scales = quantize_channels(ws, grid)
    return (w8, *column_scales(scales))


def int8_linear_of(w: torch.Tensor, colmax: torch.Tensor,
                   alpha: float = SMOOTHING_ALPHA) -> Int8Linear:
    """The :class:`Int8Linear` of weight ``w`` [N, K] for inputs whose calibration
    ``colmax`` [K] is given."""
    s = smoothing(colmax, w, alpha)
    w8, top, col = _weight(w.float() * s[None, :], 1.0)
    x_scale = ((colmax.float().clamp_min(COLMAX_MIN) / s).amax() / INT8_MAX).reshape(1)
    return Int8Linear(mult=(1.0 / (s * x_scale)).contiguous(), x_scale=x_scale.contiguous(),
                      w8=w8, w_top=top, col=col)


def regrid(lin: Int8Linear, w: torch.Tensor, grid: float) -> Int8Linear:
    """``lin`` (made from weight ``w``) with its weight re-rounded on a grid ``grid`` times
    coarser (the same precision, another rounding: the accuracy protocol's weight grids,
    ``benchmarks/fp8_accuracy.py``); the input's smoothing and scale kept."""
    s = 1.0 / (lin.mult * lin.x_scale)
    w8, top, col = _weight(w.float() * s[None, :], grid)
    return Int8Linear(mult=lin.mult, x_scale=lin.x_scale, w8=w8, w_top=top, col=col)


def gpu_supported(device: torch.device) -> bool:
    """Whether the int8 kernel (``kernels.gluon_gemm``) runs on this CUDA device: a Hopper
    GPU (sm_90) and a Triton with Gluon's Hopper warp specialization."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gpu_supported(index)


@functools.cache
def _gpu_supported(index: int) -> bool:
    if torch.cuda.get_device_capability(index) != (9, 0):
        return False
    try:
        from engine.fused.kernels import gluon_gemm  # noqa: F401
    except ImportError:  # a Triton without Gluon's Hopper warp specialization
        return False
    return True


def _gluon_takes(q: torch.Tensor, lin: Int8Linear,
                 config: tuple[int, int, int, int] | None) -> bool:
    """Whether the kernel takes this call (on the CPU, another GPU or an odd shape the
    GEMM runs as float math)."""
    if not (q.is_cuda and gpu_supported(q.device)):
        return False
    from engine.fused.kernels import gluon_gemm

    return gluon_gemm.supports(q, lin.w8, config)


def int8_linear(q: torch.Tensor, lin: Int8Linear, out_dtype: torch.dtype,
                bias: torch.Tensor | None = None, gelu: bool = False,
                out_scale: torch.Tensor | None = None,
                config: tuple[int, int, int, int] | None = None,
                addend: torch.Tensor | None = None) -> torch.Tensor:
    """``cast(out_scale * act(x_scale * w_top * col * (q w8^T) + bias))`` [T, N] for the
    int8 input copy ``q`` [T, K]: ``out_dtype`` e4m3 (``out_scale`` [1] required) or
    16-bit; ``act`` tanh-GELU when ``gelu``. The Gluon kernel on a Hopper GPU, float32
    math elsewhere (and for shapes it does not take); ``config`` the kernel's
    (:data:`GEMM_CONFIGS`). ``addend`` (16-bit [T, N], with a 16-bit output only) is added
    last and the result written into it: the out-projection adding the residual
    (``encoder.OUT_PROJ_ADDS_RESIDUAL``)."""
    from engine.fused.fp8 import FP8_DTYPE, gelu_tanh

    if (out_dtype == FP8_DTYPE) != (out_scale is not None):
        raise ValueError("out_scale is required for, and only for, an e4m3 output")
    if addend is not None and addend.dtype != out_dtype:
        raise ValueError("an addend takes the output's (16-bit) dtype: it is written over")
    if _gluon_takes(q, lin, config):
        from engine.fused.kernels.gluon_gemm import gemm

        out = (torch.empty((q.shape[0], lin.w8.shape[0]), device=q.device, dtype=out_dtype)
               if addend is None else addend)
        return gemm(q, lin.x_scale, lin.w8, lin.w_top, out, bias=bias, col_scale=lin.col,
                    out_scale=out_scale, gelu=int(gelu), config=config, addend=addend)
    y = (q.float() @ lin.w8.float().t()) * (lin.x_scale * lin.w_top * lin.col)[None, :]
    if bias is not None:
        y = y + bias.float()
    if gelu:
        y = gelu_tanh(y)
    if addend is not None:
        return addend.copy_(y + addend.float())
    if out_scale is not None:
        from engine.fused.fp8 import FP8_MAX

        return (y * out_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return y.to(out_dtype)


@dataclass(frozen=True)
class Int8Layer:
    """One layer's int8 GEMMs (``calibration.INT8_GEMMS``): the out-projection and FFN1."""

    attn_out: Int8Linear
    ffn_in: Int8Linear


# The Gluon kernel's configuration per GEMM (``gluon_gemm.CONFIG``'s order): H100,
# 2026-12-07, the mix's 47,391 tokens at burst clocks (``benchmarks/int8_standin.py``):
# FFN1 cooperative 327 µs against ping-pong's 378; the out-projection ping-pong 91 against
# 99-102.
GEMM_CONFIGS: dict[str, tuple[int, int, int, int]] = {
    "ffn_in": (3, 128, 32, 256), "attn_out": (4, 128, 32, 128)}
