"""Plain-PyTorch versions of the ``kernels`` launchers: the readable spec and the CPU path.

Each function has the signature and contract of its namesake in ``engine.fused.kernels``
and computes in float32, rounding only what it returns.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.fused.fp8 import (
    Quantized,
    e4m3_times,
    quantize_blocks,
    quantize_rows,
    quantize_static,
)
from engine.fused.int8 import check_int8_mult, quantize_int8
from engine.fused.residual import SumResidual


def sum_splits(a: torch.Tensor) -> torch.Tensor:
    """float32 GEMM output from [T, N] or split-K partials [S, T, N]."""
    return a.float().sum(0) if a.dim() == 3 else a.float()


def _layernorm(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float
) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), gamma.float(), beta.float(), eps)


def _quantize(y: torch.Tensor, fp8: bool, blocks: bool,
              scale: torch.Tensor | None = None,
              int8_mult: torch.Tensor | None = None) -> Quantized | None:
    """The e4m3 copy a row kernel writes with ``fp8``: per row, 1x128 blocks, or with one
    given scale; or, given ``int8_mult``, its int8 copy (``engine.fused.int8``), returned
    with the multipliers."""
    if int8_mult is not None:
        check_int8_mult(int8_mult, y.shape[1], scale)
        return Quantized(quantize_int8(y, int8_mult), int8_mult)
    if not fp8:
        return None
    if scale is not None:
        return quantize_static(y, scale)
    return quantize_blocks(y) if blocks else quantize_rows(y)


def embed_layernorm(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    word: torch.Tensor,
    position: torch.Tensor,
    token_type: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    fp8: bool = False,
    pdl: bool = False,  # launch detail: meaningless here
    fp8_blocks: bool = False,
    fp8_scale: torch.Tensor | None = None,
    stage: torch.Tensor | None = None,  # cu_seqlens stays where it is: no copy
) -> tuple[torch.Tensor, Quantized | None]:
    x = (
        word[input_ids.long()].float()
        + position[position_ids.long()].float()
        + token_type[token_type_ids.long()].float()
    )
    y = _layernorm(x, gamma, beta, eps)
    return y.to(word.dtype), _quantize(y, fp8, fp8_blocks, fp8_scale)


def _residual_ln(a: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | SumResidual,
                 gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 LayerNorm(a (summing split-K partials) + bias + residual)."""
    res = residual.value() if isinstance(residual, SumResidual) else residual.float()
    return _layernorm(sum_splits(a) + bias.float() + res, gamma, beta, eps)


def bias_residual_layernorm(
    a: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor | SumResidual,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    fp8: bool = False,
    pdl: bool = False,
    fp8_blocks: bool = False,
    fp8_scale: torch.Tensor | None = None,
    late_release: bool = False,  # launch order: meaningless here
    int8_mult: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Quantized | None]:
    y = _residual_ln(a, bias, residual, gamma, beta, eps)
    return y.to(residual.dtype), _quantize(y, fp8, fp8_blocks, fp8_scale, int8_mult)


def layernorm_quant(
    s: torch.Tensor,
    bias: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    fp8_blocks: bool = False,
    fp8_scale: torch.Tensor | None = None,
    int8_mult: torch.Tensor | None = None,
) -> tuple[Quantized, torch.Tensor]:
    x = s.float() + bias.float()
    var, mean = torch.var_mean(x, dim=1, correction=0)
    y = _layernorm(x, gamma, beta, eps)
    q = _quantize(y, True, fp8_blocks, fp8_scale, int8_mult)
    assert q is not None
    return q, torch.stack([mean, torch.rsqrt(var + eps)], dim=1)


def bias_residual_layernorm_qa(
    a: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor | SumResidual,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    qa_weight: torch.Tensor,
    qa_bias: torch.Tensor,
    pdl: bool = False,
) -> torch.Tensor:
    y = _residual_ln(a, bias, residual, gamma, beta, eps)
    return (qa_weight.float() @ y.t() + qa_bias.float()[:, None]).contiguous()


def gelu(x: torch.Tensor, tanh: bool = False) -> torch.Tensor:
    """Exact (erf) GELU, or the tanh approximation."""
    return F.gelu(x, approximate="tanh" if tanh else "none")


def bias_gelu(
    h: torch.Tensor,
    bias: torch.Tensor,
    fp8: bool = False,
    tanh: bool = False,
    out_dtype: torch.dtype | None = None,
    pdl: bool = False,
    fp8_blocks: bool = False,
    fp8_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, Quantized | None]:
    y = gelu(sum_splits(h) + bias.float(), tanh)
    if fp8:
        return None, _quantize(y, fp8, fp8_blocks, fp8_scale)
    return y.to(out_dtype or h.dtype), None


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    act: str | None = None,
    splits: int = 1,
    config: tuple[int, ...] | None = None,  # tile sizes: meaningless here
    pdl: bool = False,
    prefetch: bool = False,
    late_release: bool = False,  # launch order: meaningless here
) -> torch.Tensor:
    """``x @ w.T`` (+ bias) (then GELU) in ``x``'s dtype from a float32 product (one
    rounding), or float32 partials [splits, M, N] over equal K slices."""
    if splits > 1:
        if bias is not None or act is not None:
            raise ValueError("split-K partials take no bias or activation")
        k = x.shape[1]
        xs = x.float().view(x.shape[0], splits, k // splits).transpose(0, 1)
        ws = w.float().view(w.shape[0], splits, k // splits).transpose(0, 1)
        return torch.bmm(xs, ws.transpose(1, 2))
    y = x.float() @ w.float().t()
    if bias is not None:
        y = y + bias.float()
    if act is not None:
        y = gelu(y, tanh=act == "gelu_tanh")
    return y.to(x.dtype)


def _moments(stats: torch.Tensor, d: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, 1] mean and 1/std from rows' (sum, sum of squares) over ``d`` values."""
    mean = stats[:, :1] / d
    var = (stats[:, 1:] / d - mean * mean).clamp_min(0.0)
    return mean, torch.rsqrt(var + eps)


def _row_sums(v: torch.Tensor) -> torch.Tensor:
    return torch.stack([v.sum(1), (v * v).sum(1)], 1)


def _product(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float32 ``x @ w^T``, times ``scale`` for e4m3 operands."""
    y = x.float() @ w.float().t()
    return y if scale is None else y * scale


def embed_sum(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    word: torch.Tensor,
    position: torch.Tensor,
    token_type: torch.Tensor,
    z: torch.Tensor,
    z16: torch.Tensor,
    stats: torch.Tensor,
    pdl: bool = False,
    z8: torch.Tensor | None = None,
    inv8: torch.Tensor | None = None,
    stage: torch.Tensor | None = None,  # cu_seqlens stays where it is: no copy
) -> None:
    x = (word[input_ids.long()].float() + position[position_ids.long()].float()
         + token_type[token_type_ids.long()].float())
    z.copy_(x)
    z16.copy_(x)
    if z8 is not None and inv8 is not None:
        z8.copy_(e4m3_times(x, inv8))
    stats.copy_(_row_sums(x))


def folded_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    colsum: torch.Tensor,
    bias: torch.Tensor | None,
    stats: torch.Tensor,
    eps: float,
    act: str | None = None,
    zero: torch.Tensor | None = None,
    config: tuple[int, ...] | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    late_release: bool = False,  # launch order: meaningless here
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out_inv: torch.Tensor | None = None,
    early: bool = False,  # where weights are loaded: meaningless here
) -> torch.Tensor:
    """``r * (x @ w^T - mean * colsum) (+ bias) (then act)`` = ``LN(x) @ W^T ...`` for a
    folded ``w`` (``engine.fused.folding``), moments from the rows' sums ``stats``;
    zeroes ``zero`` if given. FP8 as in ``kernels.folded_linear``."""
    mean, rstd = _moments(stats, x.shape[1], eps)
    y = rstd * (_product(x, w, scale) - mean * colsum.float())
    if bias is not None:
        y = y + bias.float()
    if act is not None:
        y = gelu(y, tanh=act == "gelu_tanh")
    if zero is not None:
        zero.zero_()
    if out_inv is not None:
        return e4m3_times(y, out_inv)
    return y.to(out_dtype or x.dtype)


def residual_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    res_stats: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    stats_out: torch.Tensor,
    out: torch.Tensor | None = None,
    out16: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    splits: int = 1,
    config: tuple[int, ...] | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    late_release: bool = False,  # launch order: meaningless here
    scale: torch.Tensor | None = None,
    out8: torch.Tensor | None = None,
    inv8: torch.Tensor | None = None,
    early: bool = False,  # where weights are loaded: meaningless here
    settled: bool = False,  # when the addend is built: meaningless here
) -> torch.Tensor:
    """``x @ w^T + bias + LN(residual)`` (moments from ``res_stats``): stored in ``x``'s
    dtype, or added into the float32 ``out`` with its copy in ``out16``; the result's
    row sums go into ``stats_out``. FP8 as in ``kernels.residual_linear``."""
    mean, rstd = _moments(res_stats, residual.shape[1], eps)
    ln = (residual.float() - mean) * rstd * gamma.float() + beta.float()
    y = _product(x, w, scale) + bias.float() + ln
    if out is None:
        if scale is not None:
            raise ValueError("e4m3 operands need a float32 `out` to accumulate into")
        stored = y.to(x.dtype)
        stats_out += _row_sums(stored.float())
        if out8 is not None and inv8 is not None:
            out8.copy_(e4m3_times(stored, inv8))
        return stored
    if out16 is None:
        raise ValueError("`out` needs an `out16` copy")
    out += y
    out16.copy_(out)
    if out8 is not None and inv8 is not None:
        out8.copy_(e4m3_times(out, inv8))
    stats_out += _row_sums(out)
    return out16


def layernorm_qa(
    z: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    qa_weight: torch.Tensor,
    qa_bias: torch.Tensor,
    pdl: bool = False,
) -> torch.Tensor:
    y = _layernorm(z.float(), gamma, beta, eps)
    return (qa_weight.float() @ y.t() + qa_bias.float()[:, None]).contiguous()


def deferred_plan(m: int, n: int, k: int, kind: str, fp8: bool = False) -> tuple[None, int]:
    """No tiles and no split-K here."""
    return None, 1


def gemm_supported(k: int) -> bool:
    return True


def small_batch_plan(m: int, n: int, k: int, partial: bool) -> tuple[None, int]:
    """No tiles and no split-K here: one float32 product per GEMM."""
    return None, 1


def pdl_available(t: torch.Tensor) -> bool:
    return False


def persistent_supported(w: object) -> bool:
    """No persistent kernel here: the encoder runs its per-op path."""
    return False


def attention_tiles(cu_seqlens: torch.Tensor, tokens: int, n_seqs: int, max_seqlen: int,
                    num_heads: int, head_dim: int,
                    config: tuple[int, int, int, int] | None = None,
                    force: bool = False) -> None:
    """No tile list here: :func:`attention_varlen` loops over the sequences."""
    return None


def attention_varlen(
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    n_seqs: int,
    num_heads: int,
    config: tuple[int, int, int, int] | None = None,  # tile sizes: meaningless here
    pdl: bool = False,
    prefetch: bool = False,
    fp8_scale: torch.Tensor | None = None,
    tiles: object = None,  # the Triton kernel's tile list: meaningless here
    late_release: bool = False,  # launch order: meaningless here
    early_tail: bool | None = None,  # when the kernel loads keys: meaningless here
    int8_mult: torch.Tensor | None = None,
) -> torch.Tensor:
    n, three_d = qkv.shape
    d = three_d // 3
    hd = d // num_heads
    x = (qkv.float() + qkv_bias.float()).view(n, 3, num_heads, hd)
    if int8_mult is not None:
        check_int8_mult(int8_mult, d, fp8_scale)
    out = torch.zeros((n, d), device=qkv.device,
                      dtype=qkv.dtype if fp8_scale is None and int8_mult is None
                      else torch.float32)
    cu = cu_seqlens.tolist()
    for s in range(n_seqs):
        a, b = int(cu[s]), int(cu[s + 1])
        if b <= a:
            continue
        q, k, v = (x[a:b, i].transpose(0, 1) for i in range(3))  # [heads, len, hd]
        p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd), dim=-1)
        out[a:b] = (p @ v).transpose(0, 1).reshape(b - a, d).to(out.dtype)
    if int8_mult is not None:
        return quantize_int8(out, int8_mult)
    return out if fp8_scale is None else quantize_static(out, fp8_scale).data


def packed_positions(cu: torch.Tensor, tokens: int, longest: int) -> torch.Tensor:
    b = cu.shape[0] - 1
    if b <= 0:
        return torch.zeros(tokens, dtype=torch.int32, device=cu.device)
    i = torch.arange(tokens, device=cu.device, dtype=torch.int32)
    seq = (torch.searchsorted(cu[:b].contiguous(), i, right=True) - 1).clamp(min=0)
    return (i - cu[seq]).clamp(0, longest - 1).int()


def stage_inputs(buf: torch.Tensor, tokens: int, ids: torch.Tensor, tt: torch.Tensor,
                 pos: torch.Tensor, cu: torch.Tensor) -> None:
    t, b = ids.shape[0], cu.shape[0] - 1
    seqs = buf.shape[0] - 3 * tokens - 1
    if t > tokens or b > seqs:
        raise ValueError(f"batch ({t} tokens, {b} sequences) does not fit the buffer")
    for i, src in enumerate((ids, tt, pos)):
        buf[i * tokens: i * tokens + t].copy_(src)
    buf[3 * tokens: 3 * tokens + b + 1].copy_(cu)
    buf[3 * tokens + b + 1:].fill_(t)
