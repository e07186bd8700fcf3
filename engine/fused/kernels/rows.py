# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""Row-wise kernels: embeddings + LayerNorm, bias + residual + LayerNorm (+ QA head),
bias + GELU. Each reads a GEMM's output once (summing split-K partials if there are any)
and writes one activation, optionally with its per-row e4m3 copy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.fused.dispatch import multiprocessors
from engine.fused.fp8 import BLOCK, FP8_DTYPE, Quantized, padded_rows
from engine.fused.int8 import check_int8_mult
from engine.fused.kernels.common import (
    gelu,
    launch_options,
    layernorm_rows,
    layernorm_tile,
    load_vector,
    pdl_enter,
    pdl_release,
    row_moments,
    store_rows_fp8,
)
from engine.fused.residual import SumResidual


@triton.jit
def row_block(rows, n_rows, D, BLOCK_D: tl.constexpr):
    """Masks and element offsets of a [ROWS, BLOCK_D] tile of rows ``rows`` of a [n_rows, D]
    row-major matrix: ``(rmask, cols, cmask, mask, offs)``."""
    rmask = rows < n_rows
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    return rmask, cols, cmask, mask, offs


@triton.jit
def embed_rows(rows, ids_ptr, tt_ptr, pos_ptr, n_valid, word_ptr, posemb_ptr, type_ptr, mask,
               rmask, cols, D):
    """float32 word + position + token-type embeddings of token rows ``rows``; rows from
    ``n_valid`` on read no input and embed token 0 (a graph's rows past its call's batch)."""
    valid = rmask & (rows < n_valid)
    tok = tl.load(ids_ptr + rows, mask=valid, other=0, cache_modifier=".cg").to(tl.int64)
    typ = tl.load(tt_ptr + rows, mask=valid, other=0, cache_modifier=".cg").to(tl.int64)
    pos = tl.load(pos_ptr + rows, mask=valid, other=0, cache_modifier=".cg").to(tl.int64)
    x = tl.load(word_ptr + tok[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x += tl.load(posemb_ptr + pos[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x += tl.load(type_ptr + typ[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def embed_ln_rows(
    rows, ids_ptr, tt_ptr, pos_ptr, n_valid, word_ptr, posemb_ptr, type_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr, n_rows, D, eps,
    BLOCK_D: tl.constexpr, FP8_OUT: tl.constexpr,
):
    """Embeddings + LayerNorm of token rows ``rows`` (a [ROWS] index vector)."""
    rmask, cols, cmask, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    x = embed_rows(rows, ids_ptr, tt_ptr, pos_ptr, n_valid, word_ptr, posemb_ptr, type_ptr,
                   mask, rmask, cols, D)
    y = layernorm_rows(x, mask, load_vector(g_ptr, cols, cmask), load_vector(b_ptr, cols, cmask),
                       D, eps)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if FP8_OUT:
        store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr, rows, n_rows, D, FP8_OUT)


# ------------------------------------------------------------ a graph's inputs, per call
#
# The embeddings kernels are a graph's first kernel, and they stage its inputs: their
# leading arguments (``STAGE_ARGS``: the token ids', token types' and positions' addresses,
# cu_seqlens' address, the batch's tokens T and sequences B) are what a call sets in the
# instantiated graph (``engine.fused.graph_args``), so a call on device tensors reads them
# where the caller holds them, with no staging kernel in front. They are never specialised
# by triton (the graph's one compiled kernel must hold for every call's values). Rows from
# T on embed token 0; the first program copies cu_seqlens into the graph's buffer, which
# attention reads (``n_cu`` entries, those past the batch's last sequence repeating its end:
# empty sequences). Outside a graph cu_seqlens is where attention reads it (``n_cu`` 0).
STAGE_ARGS = "QQQQii"
_STAGED = ("ids_ptr", "tt_ptr", "pos_ptr", "cu_src", "n_valid", "n_seqs")
_CU_BLOCK = 1024


@triton.jit
def copy_cu(i, cu_src, cu_dst, n_seqs, n_cu):
    """``cu_dst[i] = cu_src[min(i, n_seqs)]`` for the entries ``i < n_cu``: those past the
    batch's last sequence repeat its end (the bucket's extra sequences are empty)."""
    m = i < n_cu
    tl.store(cu_dst + i, tl.load(cu_src + tl.minimum(i, n_seqs), mask=m), mask=m)


@triton.jit
def stage_cu(cu_src, cu_dst, n_seqs, n_cu, BLOCK: tl.constexpr):
    """:func:`copy_cu` of all ``n_cu`` entries, by the first program."""
    if tl.program_id(0) == 0:
        for start in range(0, n_cu, BLOCK):
            copy_cu(start + tl.arange(0, BLOCK), cu_src, cu_dst, n_seqs, n_cu)


@triton.jit(do_not_specialize=_STAGED, do_not_specialize_on_alignment=_STAGED[:4])
def _embed_ln_kernel(
    ids_ptr, tt_ptr, pos_ptr, cu_src, n_valid, n_seqs,
    word_ptr, posemb_ptr, type_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr, cu_dst, n_cu,
    n_rows, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, FP8_OUT: tl.constexpr, USE_PDL: tl.constexpr,
    CU_BLOCK: tl.constexpr,
):
    pdl_enter(USE_PDL)
    stage_cu(cu_src, cu_dst, n_seqs, n_cu, CU_BLOCK)
    embed_ln_rows(tl.program_id(0) * ROWS + tl.arange(0, ROWS), ids_ptr, tt_ptr, pos_ptr,
                  n_valid, word_ptr, posemb_ptr, type_ptr, g_ptr, b_ptr, out_ptr, q_ptr,
                  qs_ptr, n_rows, D, eps, BLOCK_D, FP8_OUT)


def staging_args(input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                 position_ids: torch.Tensor, stage: torch.Tensor | None,
                 ) -> tuple[tuple[object, ...], tuple[torch.Tensor, int]]:
    """The embeddings kernels' leading arguments and (cu_dst, n_cu): with ``stage`` (the
    graph buffer's cu_seqlens, B + 1 entries), a graph capture's, which copy cu_seqlens
    onto itself until a call names its own; else none copied."""
    n = input_ids.shape[0]
    if stage is None:
        return (input_ids, token_type_ids, position_ids, input_ids, n, 0), (input_ids, 0)
    return ((input_ids, token_type_ids, position_ids, stage, n, stage.shape[0] - 1),
            (stage, stage.shape[0]))


@triton.jit
def residual_ln_pre(rows, bias_ptr, res_ptr, g_ptr, b_ptr, n_rows, D, BLOCK_D: tl.constexpr):
    """What the residual LayerNorm of rows ``rows`` reads that the GEMM ahead of it does
    not write: ``(residual + bias, gamma, beta)`` in float32.

    With PDL the kernel loads these *before* it waits for that GEMM. The residual rows were
    written at least three kernels earlier, and a kernel only starts once its predecessor
    has passed its own wait, so they are complete; they are read past L1 (``.cg``). The
    vectors are weights, and the weight streams in between have evicted them from L2: an
    HBM round trip taken off the critical path.
    """
    _, cols, cmask, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    c = tl.load(res_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    c += load_vector(bias_ptr, cols, cmask)[None, :]
    return c, load_vector(g_ptr, cols, cmask), load_vector(b_ptr, cols, cmask)


@triton.jit
def residual_ln_pre_sum(rows, bias_ptr, s_ptr, mom_ptr, sb_ptr, sg_ptr, sbeta_ptr, g_ptr,
                        b_ptr, n_rows, D, BLOCK_D: tl.constexpr):
    """:func:`residual_ln_pre` for a residual kept as a sum (``SumResidual``): the residual
    is ``(s + sb - mean) * rstd * sg + sbeta``, normalized here as ``s`` is read, with the
    moments ``layernorm_quant`` stored."""
    rmask, cols, cmask, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    x = tl.load(s_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    x += load_vector(sb_ptr, cols, cmask)[None, :]
    mean = tl.load(mom_ptr + 2 * rows, mask=rmask, other=0.0)
    rstd = tl.load(mom_ptr + 2 * rows + 1, mask=rmask, other=0.0)
    c = ((x - mean[:, None]) * rstd[:, None] * load_vector(sg_ptr, cols, cmask)[None, :]
         + load_vector(sbeta_ptr, cols, cmask)[None, :])
    c += load_vector(bias_ptr, cols, cmask)[None, :]
    return c, load_vector(g_ptr, cols, cmask), load_vector(b_ptr, cols, cmask)


@triton.jit
def qa_head_rows(y, rows, rmask, cols, cmask, qa_w_ptr, qa_b_ptr, logits_ptr, logits_stride,
                 D):
    """Start/end logits of the last layer's LayerNorm rows ``y`` (float32), stored in
    ``logits`` [2, T]. Those hidden states are only ever read by the 2-logit head: they
    are dotted here, unrounded, and never stored."""
    w0 = tl.load(qa_w_ptr + cols, mask=cmask, other=0.0)
    w1 = tl.load(qa_w_ptr + D + cols, mask=cmask, other=0.0)
    start = tl.sum(y * w0[None, :], axis=1) + tl.load(qa_b_ptr)
    end = tl.sum(y * w1[None, :], axis=1) + tl.load(qa_b_ptr + 1)
    tl.store(logits_ptr + rows, start, mask=rmask)
    tl.store(logits_ptr + logits_stride + rows, end, mask=rmask)


@triton.jit
def residual_ln_tile(
    rows, a_ptr, c, g, b,
    out_ptr, q_ptr, qs_ptr, qa_w_ptr, qa_b_ptr, logits_ptr,
    n_rows, logits_stride, split_stride, D, eps,
    BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, FP8_OUT: tl.constexpr, QA_HEAD: tl.constexpr,
    mult=None,
):
    """LayerNorm(sum of SPLITS partials of ``a`` + c) with ``c`` from
    :func:`residual_ln_pre` and ``g``/``b`` its vectors as [1, BLOCK_D]: stores the rows
    (+ e4m3 or int8 copy; ``mult``: the int8 copy's multipliers, already loaded), or the
    QA logits."""
    rmask, cols, cmask, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    x = tl.load(a_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    for s in tl.static_range(1, SPLITS):  # split-K partial sums of the GEMM, if any
        x += tl.load(a_ptr + s * split_stride + offs, mask=mask, other=0.0, cache_modifier=".cg")
    y = layernorm_tile(x + c, mask, g, b, D, eps)
    if QA_HEAD:
        qa_head_rows(y, rows, rmask, cols, cmask, qa_w_ptr, qa_b_ptr, logits_ptr,
                     logits_stride, D)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
        if FP8_OUT:
            store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr, rows, n_rows, D, FP8_OUT,
                           mult)


@triton.jit
def residual_ln_rows(
    rows, a_ptr, bias_ptr, res_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr, qa_w_ptr, qa_b_ptr, logits_ptr,
    n_rows, logits_stride, split_stride, D, eps,
    BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, FP8_OUT: tl.constexpr, QA_HEAD: tl.constexpr,
    USE_PDL: tl.constexpr, LATE_RELEASE: tl.constexpr = False,
):
    """LayerNorm(sum of SPLITS partials of ``a`` + bias + residual) of rows ``rows``;
    with ``USE_PDL`` it waits for the previous kernel between the two halves, and lets the
    next kernel launch right after that wait or, with ``LATE_RELEASE``, after its stores.

    ``out_ptr`` may be ``res_ptr`` (in place): each row is read before it is written,
    by the same program.
    """
    c, g, b = residual_ln_pre(rows, bias_ptr, res_ptr, g_ptr, b_ptr, n_rows, D, BLOCK_D)
    pdl_enter(USE_PDL, not LATE_RELEASE)  # only the GEMM's output is read after this
    residual_ln_tile(rows, a_ptr, c, g[None, :], b[None, :], out_ptr, q_ptr, qs_ptr, qa_w_ptr,
                     qa_b_ptr, logits_ptr, n_rows, logits_stride, split_stride, D, eps,
                     BLOCK_D, SPLITS, FP8_OUT, QA_HEAD)
    pdl_release(LATE_RELEASE)


@triton.jit
def residual_ln_loop(
    a_ptr, bias_ptr, res_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr, qa_w_ptr, qa_b_ptr, logits_ptr,
    n_rows, logits_stride, split_stride, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr, FP8_OUT: tl.constexpr,
    QA_HEAD: tl.constexpr,
):
    """:func:`residual_ln_rows` (no PDL) over every ROWS-row tile from this program's, a
    grid apart: the bias, gamma and beta vectors are loaded and laid out for the tile once
    a program rather than once a tile (each is a load's round trip and a shared-memory
    layout change behind barriers, ahead of the tile's own loads; NOTES v42), and so is
    an int8 copy's multiplier vector (v51)."""
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    bias = load_vector(bias_ptr, cols, cmask)[None, :]
    g = load_vector(g_ptr, cols, cmask)[None, :]
    b = load_vector(b_ptr, cols, cmask)[None, :]
    mult = load_vector(qs_ptr, cols, cmask)[None, :] if FP8_OUT == 4 else None
    for t in range(tl.program_id(0), tl.cdiv(n_rows, ROWS), tl.num_programs(0)):
        rows = t * ROWS + tl.arange(0, ROWS)
        _, _, _, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
        c = tl.load(res_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        residual_ln_tile(rows, a_ptr, c + bias, g, b, out_ptr, q_ptr, qs_ptr, qa_w_ptr,
                         qa_b_ptr, logits_ptr, n_rows, logits_stride, split_stride, D, eps,
                         BLOCK_D, SPLITS, FP8_OUT, QA_HEAD, mult)


@triton.jit
def _residual_ln_kernel(
    a_ptr, bias_ptr, res_ptr, g_ptr, b_ptr,
    out_ptr, q_ptr, qs_ptr,
    qa_w_ptr, qa_b_ptr, logits_ptr,
    mom_ptr, sb_ptr, sg_ptr, sbeta_ptr,
    n_rows, logits_stride, split_stride, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr,
    FP8_OUT: tl.constexpr, QA_HEAD: tl.constexpr, USE_PDL: tl.constexpr,
    LATE_RELEASE: tl.constexpr, SUM_RESIDUAL: tl.constexpr, LOOP: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    if LOOP:  # a few programs an SM, each over many tiles (ROW_LOOP)
        residual_ln_loop(a_ptr, bias_ptr, res_ptr, g_ptr, b_ptr, out_ptr, q_ptr, qs_ptr,
                         qa_w_ptr, qa_b_ptr, logits_ptr, n_rows, logits_stride, split_stride,
                         D, eps, BLOCK_D, ROWS, SPLITS, FP8_OUT, QA_HEAD)
    elif SUM_RESIDUAL:  # the residual is a SumResidual: mom/sb/sg/sbeta normalize it
        # (the large path's form: no PDL). The residual first, as in residual_ln_rows:
        # with the GEMM output loaded first it ran 177 us a call, 132 this way; the
        # vectors loaded in the tile's layout, 207 (H100, BERT-large mix; NOTES v42).
        c, g, b = residual_ln_pre_sum(rows, bias_ptr, res_ptr, mom_ptr, sb_ptr, sg_ptr,
                                      sbeta_ptr, g_ptr, b_ptr, n_rows, D, BLOCK_D)
        residual_ln_tile(rows, a_ptr, c, g[None, :], b[None, :], out_ptr, q_ptr, qs_ptr,
                         qa_w_ptr, qa_b_ptr, logits_ptr, n_rows, logits_stride, split_stride,
                         D, eps, BLOCK_D, SPLITS, FP8_OUT, QA_HEAD)
    else:
        residual_ln_rows(rows, a_ptr, bias_ptr, res_ptr, g_ptr, b_ptr, out_ptr, q_ptr, qs_ptr,
                         qa_w_ptr, qa_b_ptr, logits_ptr, n_rows, logits_stride, split_stride,
                         D, eps, BLOCK_D, SPLITS, FP8_OUT, QA_HEAD, USE_PDL, LATE_RELEASE)


@triton.jit
def _layernorm_quant_kernel(
    s_ptr, bias_ptr, g_ptr, b_ptr, q_ptr, qs_ptr, moments_ptr, n_rows, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, FP8_OUT: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask, cols, cmask, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    x = tl.load(s_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    x += load_vector(bias_ptr, cols, cmask)[None, :]
    xc, mean, rstd = row_moments(x, mask, D, eps)
    y = (xc * rstd[:, None] * load_vector(g_ptr, cols, cmask)[None, :]
         + load_vector(b_ptr, cols, cmask)[None, :])
    store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr, rows, n_rows, D, FP8_OUT)
    tl.store(moments_ptr + 2 * rows, mean, mask=rmask)
    tl.store(moments_ptr + 2 * rows + 1, rstd, mask=rmask)


@triton.jit
def _bias_gelu_kernel(
    h_ptr, bias_ptr, out_ptr, q_ptr, qs_ptr,
    n_rows, F, split_stride,
    BLOCK_F: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr,
    FP8_OUT: tl.constexpr, TANH: tl.constexpr, USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    rmask = rows < n_rows
    cmask = cols < F
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * F + cols[None, :]
    x = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLITS):  # split-K partial sums of the GEMM, if any
        x += tl.load(h_ptr + s * split_stride + offs, mask=mask, other=0.0)
    x += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y = gelu(x, TANH)
    if FP8_OUT:
        # Only the next GEMM reads this activation: store its e4m3 copy alone
        # (BLOCK_F covers the whole row, so the row's scale is known here).
        store_rows_fp8(y, mask, rmask, q_ptr + offs, qs_ptr, rows, n_rows, F, FP8_OUT)
    else:
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launchers

# A large batch: from this many rows up the row kernels take their large tiles
# (``ROW_TILE_LARGE``, ``LN_QUANT_TILE``) and the residual LayerNorm its loop (``ROW_LOOP``).
# A module constant so that the interpreter checks reach the residual LayerNorm's large tile
# and loop on a few hundred rows (``layernorm_quant``'s large tile has no such check).
LARGE_ROWS = 8192
# Large batches: (elements per program, at least this many rows) of the row
# kernels (``_row_tile``), and (column block cap, rows per program) of the fp16 bias + GELU.
# Module constants so that benchmarks can A/B them (``ab_replay.py --set``). H200,
# 2026-11-30, BERT-large SQuAD mix: alone (``bench_rows.py``, 47,391 rows) smaller tiles
# won (residual LN + e4m3 copy 85 us at 2048 elements vs 100; bias + GELU + e4m3 193 vs
# 213 at one 4096-row; fp16 bias + GELU 188 vs 209 at one 4096-row), but inside the pass
# (``ab_replay.py --set``, graph replay, 5 interleaved rounds) these tiles were faster:
# FP8 43.43 vs 43.70 ms, fp16 56.82 vs 57.01.
ROW_TILE_LARGE = (4096, 2)
GELU_TILE = (1024, 4)
# The residual LayerNorm (plain residual, no PDL) from ``LARGE_ROWS`` rows up as (programs an SM,
# rows a tile, warps), each program looping over tiles (``residual_ln_loop``); None: a
# program a tile (``ROW_TILE_LARGE``). H100, 2026-12-06, BERT-large mix, settled: (4, 4, 4)
# +1.5 to +2.0% (the LayerNorms 9.5% faster), logits bit for bit the same (and on the
# shipped MiniLM); (8, 2, 2) +1.8%, (9, 1, 4) +1.6%, (4, 4, 8) +0.1% (NOTES v42); on a
# faster part (v45) (8, 2, 2) ran between two (4, 4, 4) baselines, its logits 5e-7 off.
ROW_LOOP: tuple[int, int, int] | None = (4, 4, 4)
# A multiprocessor's 32-bit registers (sm_80 to sm_90): what ``loop_register_cap`` shares;
# a thread's most (255), and the least a cap leaves (below it the kernels spill: 187 spill
# stores at 32; ``benchmarks/int8_copy_sass.py``).
REGISTERS_PER_SM = 65536
_MAX_REGISTERS = 255
_MIN_REGISTER_CAP = 96


def loop_register_cap(per_sm: int, warps: int) -> int | None:
    """Registers a thread may use so that ``per_sm`` programs of ``warps`` warps are all
    resident on a multiprocessor at once (rounded down to the allocation's unit of 8; at
    most 255, a thread's limit): the loop's grid assumes they are. The int8 copy took the
    residual LayerNorm to 142 registers, over (4, 4, 4)'s 128, so one program an SM could
    only run as a tail (that LayerNorm measured +33% in the BERT-large mix on an H100,
    v51); at 128 it compiles without spills. None (no cap) where the share is under 96
    registers: spills would cost more than the programs that do not fit."""
    cap = min(REGISTERS_PER_SM // (per_sm * warps * 32) // 8 * 8, _MAX_REGISTERS)
    return cap if cap >= _MIN_REGISTER_CAP else None


# ``layernorm_quant``'s (rows a program, warps) from ``LARGE_ROWS`` rows up (2 rows, 4 warps
# below).
# H100, 2026-12-06, the BERT-large mix (47,391 rows of 1,024): 57 us a call at (8, 4),
# 58-64 at (4, 4), (8, 8), (16, 4), (16, 8), (4, 2), (2, 2); 72 at (4, 8), 84 at (16, 16)
# (``mix_settings.py --profile``, v42).
LN_QUANT_TILE = (8, 4)


def _row_tile(n_rows: int, width: int) -> tuple[int, int, int]:
    """(BLOCK, ROWS, num_warps) for a row-wise kernel over ``width`` columns.

    Small batches get 2 rows per program (more programs for few tokens); large ones
    ``ROW_TILE_LARGE``: about 4096 elements per program, at least 2 rows.
    """
    block = triton.next_power_of_2(width)
    elements, min_rows = ROW_TILE_LARGE
    rows = 2 if n_rows < LARGE_ROWS else max(min_rows, elements // block)
    warps = 4 if block * rows <= 2048 else 8
    return block, rows, warps


def _gelu_tile(width: int) -> tuple[int, int, int]:
    """(BLOCK_F, ROWS, num_warps) of the fp16 bias + GELU over ``width`` columns."""
    cap, rows = GELU_TILE
    block = min(cap, triton.next_power_of_2(width))
    return block, rows, 8 if block >= 2048 else 4


@dataclass(frozen=True)
class _Fp8Out:
    """Where a row kernel writes its e4m3 copy: buffers ``q``/``qs`` and the kernels'
    ``FP8_OUT`` mode (0 none, 1 per-row scales, 2 1x128 block scales, 3 a given scale; 4 an
    int8 copy with per-column multipliers, ``qs``)."""

    q: torch.Tensor
    qs: torch.Tensor
    mode: int

    def result(self) -> Quantized | None:
        return Quantized(self.q, self.qs, self.mode == 2) if self.mode else None


def _fp8_out(x: torch.Tensor, fp8: bool, blocks: bool = False,
             scale: torch.Tensor | None = None,
             int8_mult: torch.Tensor | None = None) -> _Fp8Out:
    """The e4m3 copy of ``x`` [rows, cols] the caller asked for: per-row scales [rows, 1];
    with ``blocks`` the first ``rows`` rows of an [M4, cols] buffer and [cols/128, M4]
    scales (``engine.fused.fp8``); with ``scale`` (float32 [1], calibrated) that scale;
    with ``int8_mult`` (float32 [cols]) an int8 copy instead, ``round(x * int8_mult)``
    (``engine.fused.int8``)."""
    if int8_mult is not None:
        check_int8_mult(int8_mult, x.shape[1], scale)
        return _Fp8Out(torch.empty(x.shape, device=x.device, dtype=torch.int8), int8_mult, 4)
    if not fp8:
        return _Fp8Out(x, x, 0)  # never touched: the FP8 branch is compiled out
    n, d = x.shape
    if scale is not None:
        return _Fp8Out(torch.empty(x.shape, device=x.device, dtype=FP8_DTYPE), scale, 3)
    if blocks:
        if d % BLOCK:
            raise ValueError(f"block-wise FP8 needs a width that is a multiple of {BLOCK}")
        m4 = padded_rows(n)
        q = torch.empty((m4, d), device=x.device, dtype=FP8_DTYPE)[:n]
        return _Fp8Out(q, torch.empty((d // BLOCK, m4), device=x.device, dtype=torch.float32),
                       2)
    return _Fp8Out(torch.empty(x.shape, device=x.device, dtype=FP8_DTYPE),
                   torch.empty((n, 1), device=x.device, dtype=torch.float32), 1)


def _splits(a: torch.Tensor) -> tuple[int, int]:
    """(number of split-K partials, elements between them) of a GEMM output."""
    if a.dim() == 3:
        return a.shape[0], a.shape[1] * a.shape[2]
    return 1, 0


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
    pdl: bool = False,
    fp8_blocks: bool = False,
    fp8_scale: torch.Tensor | None = None,
    stage: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Quantized | None]:
    """LayerNorm(word[ids] + position[pos] + token_type[tt]) for packed int32 [T] inputs
    (+ e4m3 copy: per-row scales, 1x128 block scales with ``fp8_blocks``, or the one
    calibrated scale ``fp8_scale``, float32 [1], values beyond it saturating). ``stage``
    (the graph buffer's cu_seqlens): a graph's first kernel, whose inputs a call sets
    (``STAGE_ARGS``)."""
    n, d = input_ids.shape[0], word.shape[1]
    out = torch.empty((n, d), device=word.device, dtype=word.dtype)
    f8 = _fp8_out(out, fp8, fp8_blocks, fp8_scale)
    block, rows, warps = _row_tile(n, d)
    staged, (cu_dst, n_cu) = staging_args(input_ids, token_type_ids, position_ids, stage)
    _embed_ln_kernel[(triton.cdiv(n, rows),)](
        *staged, word, position, token_type, gamma, beta,
        out, f8.q, f8.qs, cu_dst, n_cu, n, d, eps,
        BLOCK_D=block, ROWS=rows, FP8_OUT=f8.mode, USE_PDL=pdl, CU_BLOCK=_CU_BLOCK,
        num_warps=warps, **launch_options(pdl),
    )
    return out, f8.result()


def _residual_ln(a: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | SumResidual,
                 gamma: torch.Tensor, beta: torch.Tensor, eps: float, fp8: bool, pdl: bool,
                 qa: tuple[torch.Tensor, torch.Tensor] | None, fp8_blocks: bool = False,
                 fp8_scale: torch.Tensor | None = None, late_release: bool = False,
                 int8_mult: torch.Tensor | None = None) -> tuple[torch.Tensor, _Fp8Out]:
    """Launch ``_residual_ln_kernel``: (LayerNorm output, its e4m3 copy), or with ``qa``
    (head weight, bias) the float32 [2, T] logits (nothing else is stored).
    ``fp8_scale`` (float32 [1]): the e4m3 copy takes this one scale, given, not computed.
    ``int8_mult`` (float32 [D]): an int8 copy with these column multipliers instead.
    ``late_release`` (with ``pdl``): the next kernel launches after the stores."""
    n, d = a.shape[-2:]
    if isinstance(residual, SumResidual):  # normalized as it is read
        if pdl:
            raise ValueError("a SumResidual is the large path's: no PDL")
        summed, res = True, residual.s
        sum_args = (residual.moments, residual.bias, residual.gamma, residual.beta)
    else:
        summed, res, sum_args = False, residual, (gamma, gamma, gamma, gamma)  # not read
    splits, split_stride = _splits(a)
    if qa is None:
        out = torch.empty((n, d), device=a.device, dtype=residual.dtype)
        f8 = _fp8_out(out, fp8, fp8_blocks, fp8_scale, int8_mult)
        qa_w, qa_b, logits = gamma, gamma, out  # never touched: QA_HEAD is off
    else:
        out = logits = torch.empty((2, n), device=a.device, dtype=torch.float32)
        f8 = _fp8_out(out, False)
        qa_w, qa_b = qa
    block, rows, warps = _row_tile(n, d)
    grid = triton.cdiv(n, rows)
    # ROW_LOOP: plain residuals without PDL, on a GPU (multiprocessors() is 0 off CUDA)
    sms = multiprocessors(a.device) if n >= LARGE_ROWS and not (summed or pdl) else 0
    loop = ROW_LOOP if sms else None
    cap = {}
    if loop is not None:
        per_sm, rows, warps = loop
        grid = min(triton.cdiv(n, rows), per_sm * sms)
        regs = loop_register_cap(per_sm, warps)
        cap = {"maxnreg": regs} if regs else {}
    _residual_ln_kernel[(grid,)](
        a, bias, res, gamma, beta, out, f8.q, f8.qs, qa_w, qa_b, logits, *sum_args,
        n, logits.stride(0), split_stride, d, eps,
        BLOCK_D=block, ROWS=rows, SPLITS=splits, FP8_OUT=f8.mode,
        QA_HEAD=qa is not None, USE_PDL=pdl, LATE_RELEASE=pdl and late_release,
        SUM_RESIDUAL=summed, LOOP=loop is not None, num_warps=warps, **launch_options(pdl),
        **cap,
    )
    return out, f8


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
    late_release: bool = False,
    int8_mult: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Quantized | None]:
    """LayerNorm(a + bias + residual), in ``residual``'s dtype (+ e4m3 copy: per-row
    scales, 1x128 block scales with ``fp8_blocks``, or the one calibrated scale
    ``fp8_scale``, float32 [1], values beyond it saturating; or, given ``int8_mult``
    (float32 [D]), an int8 copy ``round(y * int8_mult)`` saturating at +-127, returned
    with the multipliers as its ``scale``: ``engine.fused.int8``).

    ``a`` is a GEMM output [T, D], or [S, T, D] float32 split-K partials to be summed.
    ``residual`` may be a :class:`SumResidual`, normalized as it is read.
    ``late_release`` (with ``pdl``) lets the next kernel launch only after the stores,
    not right after the wait.
    """
    out, f8 = _residual_ln(a, bias, residual, gamma, beta, eps, fp8, pdl, None, fp8_blocks,
                           fp8_scale, late_release, int8_mult)
    return out, f8.result()


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
    """The e4m3 copy of LayerNorm(s + bias) (per-row scales, 1x128 block scales with
    ``fp8_blocks``, or the one calibrated scale ``fp8_scale``; or, given ``int8_mult``, the
    int8 copy as ``bias_residual_layernorm`` writes it) and the rows' moments of ``s +
    bias``, float32 [T, 2]: mean and ``1 / sqrt(var + eps)``.

    The LayerNorm step of a residual kept as a sum (:class:`SumResidual`): ``s`` [T, D] is
    the sum a GEMM that adds its residual wrote, read once; no 16-bit output is written,
    since the next residual LayerNorm normalizes ``s`` with these moments as it reads it.
    3 bytes an element against the residual LayerNorm's 7, for 2 more the GEMM reads
    (``engine/fused/NOTES.md`` v42).
    """
    n, d = s.shape
    f8 = _fp8_out(s, True, fp8_blocks, fp8_scale, int8_mult)
    moments = torch.empty((n, 2), device=s.device, dtype=torch.float32)
    block = triton.next_power_of_2(d)
    rows, warps = LN_QUANT_TILE if n >= LARGE_ROWS else (2, 4)
    _layernorm_quant_kernel[(triton.cdiv(n, rows),)](
        s, bias, gamma, beta, f8.q, f8.qs, moments, n, d, eps,
        BLOCK_D=block, ROWS=rows, FP8_OUT=f8.mode, num_warps=warps,
    )
    return Quantized(f8.q, f8.qs, f8.mode == 2), moments


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
    """QA logits float32 [2, T] (row 0 start, row 1 end) of LayerNorm(a + bias + residual)."""
    return _residual_ln(a, bias, residual, gamma, beta, eps, False, pdl, (qa_weight, qa_bias))[0]


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
    """GELU(h + bias): ``(out, None)``, or ``(None, e4m3 copy)`` when ``fp8`` (per-row
    scales, 1x128 block scales with ``fp8_blocks``, or the one calibrated scale
    ``fp8_scale``, float32 [1]).

    ``h`` is a GEMM output [T, F], or [S, T, F] float32 split-K partials to be summed.
    A 2-D ``h`` is overwritten in place (elementwise, so safe; it saves an allocation of the
    largest activation); otherwise ``out`` is new, in ``out_dtype``.
    """
    n, f = h.shape[-2:]
    splits, split_stride = _splits(h)
    f8 = _fp8_out(h[-1] if splits > 1 else h, fp8, fp8_blocks, fp8_scale)
    if fp8:
        block, rows, warps = _row_tile(n, f)  # whole rows: the scale needs them
        grid = (triton.cdiv(n, rows), 1)
        out = h
    else:
        block, rows, warps = _gelu_tile(f)
        grid = (triton.cdiv(n, rows), triton.cdiv(f, block))
        out = h if splits == 1 and out_dtype in (None, h.dtype) else torch.empty(
            (n, f), device=h.device, dtype=out_dtype or h.dtype)
    _bias_gelu_kernel[grid](
        h, bias, out, f8.q, f8.qs, n, f, split_stride,
        BLOCK_F=block, ROWS=rows, SPLITS=splits, FP8_OUT=f8.mode,
        TANH=tanh, USE_PDL=pdl,
        num_warps=warps, **launch_options(pdl),
    )
    return (None, f8.result()) if fp8 else (out, None)
