# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""Bidirectional attention over packed variable-length sequences (FlashAttention-style
online softmax, no padding), reading Q, K and V straight from the QKV GEMM's output."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.fused.fp8 import FP8_DTYPE
from engine.fused.int8 import check_int8_mult
from engine.fused.kernels.common import (
    LOG2E,
    launch_options,
    pdl_enter,
    pdl_release,
    prefetch_l1,
    to_e4m3,
    to_int8,
)
from engine.fused.kernels.timeline import record, stamp, trace_slot

# Attention tiles (BLOCK_M queries x BLOCK_N keys, warps, pipeline stages). 64 x 64 with
# 4 warps by default: on the H200 it beats 64 x 32 by 7% on full windows of 192 and 384
# tokens (BERT-large, 128 sequences; 92.6 vs 99.7 and 306.7 vs 329.4 us a layer,
# `benchmarks/attn_backends.py --tiles`, v14) and matches it on the SQuAD mix over a tile
# list (whole pass, graph replay, `benchmarks/ab_replay.py`: 34.96 vs 35.07 ms in v13,
# 34.87 vs 34.85 in v14). Many sequences of nearly full length (mean >= ATTN_LARGE_MEAN
# tokens) take 128 x 64 with 8 warps, K and V loaded once for twice the queries: 288.2 us
# a layer at 128 x 384 (12.5% under 64 x 32). It pads more rows with short sequences (mix:
# 290 vs 260 us, v8), and with few programs (batch 1) the 64-query tile spreads over more
# multiprocessors. Under CUDA graphs the rule sees the bucket's token and sequence counts
# (tokens up to 12.5% over, sequences a power of two), so a batch near the threshold may
# take the other tile graphed than eager.
ATTN_SMALL = (64, 64, 4, 3)
ATTN_LARGE = (128, 64, 8, 3)
ATTN_LARGE_MEAN = 320  # tokens per sequence from which ATTN_LARGE is used
# The key loop split in two (``SPLIT``): full key blocks loaded and scored with no key mask,
# then the partial last block masked. The same arithmetic, so the same output bit for bit,
# with 22-29% fewer instructions a loop iteration (sm_90a SASS, triton 3.6; 21-31% with
# 3.9; `benchmarks/attention_sass.py`) at +25-35 registers: 146 at 64x64 with 4 warps
# (3 programs an SM), 143 at 128x64 with 8 (1). Where more programs wait than fit on the
# multiprocessors that way, those registers cost occupancy, so they are capped at
# ATTN_MAXNREG (128: 4 programs of 4 warps, 2 of 8; no spills with triton 3.6, 10-11 with
# 3.9: re-check when moving past 3.6). H200, us a layer, masked -> split
# (`benchmarks/attn_backends.py --split-caps`, v15): BERT-large mix 241.0 -> 231.5 capped
# (249.0 uncapped), 128x384 at 128x64x8 299.7 -> 281.0 capped (385.7 uncapped); BERT-base
# mix 181.1 -> 174.9; BERT-large 1x384 (112 programs) 7.7 -> 6.4 uncapped (6.9 capped),
# BERT-base 1x128 4.4 -> 4.0. Whole pass (graph replay): BERT-large 1x384 -1.8%, 128x384
# -1.5%; the mix pass unchanged (power-capped). Between one and three waves of 4-warp
# programs the cap is left off by the occupancy argument, not by a measurement.
ATTN_SPLIT_LOOP = True
ATTN_MAXNREG: int | None = 128
# The partial last key block's keys and values requested before the loop over the full
# blocks (``EARLY_TAIL``), so that their latency overlaps the loop's instead of following
# it: a sequence whose length is not a multiple of BLOCK_N otherwise pays one more memory
# round trip a program. H200, BERT-base calibrated FP8, one sequence in the 128-token
# bucket, late tail (v29): attention's step a layer 3.60 us at 128 tokens, 4.50 at 96
# (`trace_pass.py`); the pass 0.2466 ms at 128 tokens, 0.2577-0.2581 at 80 to 127
# (`bucket_probe.py`). Early, graph replay back to back (`ab_replay.py`, late -> early):
# 1x96 0.2562 -> 0.2475 and 0.2589 -> 0.2481 (two runs); BERT-large 1x300 0.9235 ->
# 0.9158; calls at 65, 96 and 127 tokens 0.2474-0.2478 (`bucket_probe.py`). Block-exact
# lengths request nothing (1x128 0.2450 -> 0.2484 in one run, 0.2490 -> 0.2481 in the
# other: comparable to the ~2.5 us by which one graph's time moves with the process's
# history, see `benchmarks/process_state_probe.py`, and possibly that). Two pipeline
# stages instead of three (less shared memory) cost the early form 4.2% at 1x128.
# Same arithmetic, so the same output bit for bit. The tail's tiles take 8 KB of shared
# memory and ~20 registers more (sm_90a, `attention_sass.py`), so launches whose
# registers are capped (:func:`register_cap`) keep the late load. A form that branched
# around the early load for block-exact programs was slower at every shape (v29). 16-bit
# engines gain too (v30, graph replay, late -> early): the shipped MiniLM's shape 1x96
# 0.1057 -> 0.1035, 4x24 0.1052 -> 0.1031; BERT-base fp16 1x96 0.3123 -> 0.3016; BERT-large
# 4x32 0.7412 -> 0.7314, 2x48 0.7267 -> 0.7167. BERT-base's calibrated FP8 deferred layer
# ran 8-25% slower with it at 2 to 8 sequences (its kernels around attention slowed), so that
# layer asks for the late load there (``dispatch.early_tail``).
ATTN_EARLY_TAIL = True
# The 8-bit output forms (e4m3, int8) store at most this many bytes a thread at once (None:
# the compiler's choice). Left to itself, Triton 3.6 stores them 16 bytes a thread, and that
# layout, propagated back from the store, re-lays the kernel from its first loads: Q's bias
# is loaded 4 threads a row (two 16-byte loads a thread) instead of 8, and the rest follows.
# On the BERT-large mix (H100, attention alone, `benchmarks/attn_out_forms.py`, v52) the
# e4m3 form then took 251.7 us a layer and the int8 form 259.5, against 227.6 for the
# 16-bit one. 8 bytes keeps the 16-bit form's loads and loop (sm_90a SASS): e4m3 229.9,
# int8 237.7 against 231.8 in the same run.
ATTN_OUT8_VECTOR: int | None = 8
_UNCAPPED_PER_SM = {4: 3, 8: 1}  # split-loop programs an SM holds uncapped, by warps
_SMS = 132  # multiprocessors of an H100/H200
_ATTN_LARGE_PROGRAMS = 4 * _SMS  # ... when it still launches ~4 waves of an H100/H200


@triton.jit
def _online_softmax_step(q, k, v, m_i, l_i, acc, nmask, MASKED: tl.constexpr):
    """One key block of the online softmax: scores Q K^T (keys where ``nmask`` is false
    left out when ``MASKED``), the running row max ``m_i`` and sum ``l_i``, and ``acc``
    rescaled and added P V. Returns the new (m_i, l_i, acc)."""
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(nmask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def attention_tile(
    qkv_ptr, bias_ptr, out_ptr, cu_ptr, m_block, seq, head,
    qk_scale, stride_qkv, stride_out, D,
    HEAD_DIM: tl.constexpr, BLOCK_DH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, scale_ptr=None, FP8_OUT: tl.constexpr = False,
    SPLIT: tl.constexpr = False, EARLY_TAIL: tl.constexpr = False,
    TRACE: tl.constexpr = False, OUT8_VEC: tl.constexpr = 0,
):
    """One (query block, sequence, head): :func:`attention_rows` for the sequence whose
    tokens are rows ``cu[seq]:cu[seq+1]``. Programs past a sequence's end write nothing,
    so the grid may be sized for bucketed (padded) sequence counts and lengths. Returns
    :func:`attention_rows`'s timeline marks."""
    start = tl.load(cu_ptr + seq, cache_modifier=".cg")
    length = tl.load(cu_ptr + seq + 1, cache_modifier=".cg") - start
    return attention_rows(qkv_ptr, bias_ptr, out_ptr, start, length, m_block * BLOCK_M, head,
                          qk_scale, stride_qkv, stride_out, D, HEAD_DIM, BLOCK_DH, BLOCK_M,
                          BLOCK_N, scale_ptr, FP8_OUT, SPLIT, EARLY_TAIL, TRACE, OUT8_VEC)


@triton.jit
def attention_rows(
    qkv_ptr, bias_ptr, out_ptr, start, length, m0, head,
    qk_scale, stride_qkv, stride_out, D,
    HEAD_DIM: tl.constexpr, BLOCK_DH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, scale_ptr=None, FP8_OUT: tl.constexpr = False,
    SPLIT: tl.constexpr = False, EARLY_TAIL: tl.constexpr = False,
    TRACE: tl.constexpr = False, OUT8_VEC: tl.constexpr = 0,
):
    """Queries ``m0 : m0 + BLOCK_M`` of the sequence at rows ``start : start + length``, one
    head: softmax(Q K^T * scale) V with an online softmax (nothing written where ``m0 >=
    length``). With ``FP8_OUT`` the output is stored in e4m3 with the one calibrated scale
    at ``scale_ptr`` (values beyond it saturate); with ``FP8_OUT`` 4 in int8, each column
    times its multiplier at ``scale_ptr`` [D] (saturating at +-127); ``OUT8_VEC`` (0: the
    compiler's choice) caps the bytes a thread stores at once in those 8-bit forms
    (``ATTN_OUT8_VECTOR``). Returns two timeline marks
    (``kernels.timeline.stamp``; no instruction without ``TRACE``): the key loop done, and
    the output computed before its store.

    Q, K, V are column slices of the packed QKV GEMM output (no bias yet).

    Biases cost nothing inside the loop: the K bias adds ``q . bk`` to every score of a
    query row, which softmax cancels, so it is dropped; rows of P sum to one, so
    ``P (V + bv) = P V + bv`` and the V bias is added once at the end. K and V tiles thus
    go from memory straight into ``tl.dot``, which lets the compiler pipeline the loads.
    """
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_DH)
    dmask = offs_d < HEAD_DIM
    col = head * HEAD_DIM + offs_d
    mmask = offs_m < length
    q_rows = (start + offs_m).to(tl.int64)
    io_mask = mmask[:, None] & dmask[None, :]
    dtype = qkv_ptr.dtype.element_ty

    q = tl.load(qkv_ptr + q_rows[:, None] * stride_qkv + col[None, :], mask=io_mask, other=0.0,
                cache_modifier=".cg")
    bq = tl.load(bias_ptr + col, mask=dmask, other=0.0)
    # Softmax scale and log2(e) folded into Q once, so the loop uses exp2 directly.
    q = ((q.to(tl.float32) + bq[None, :]) * qk_scale).to(dtype)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DH], tl.float32)
    n_end = tl.where(m0 < length, length, 0)  # empty programs skip the loop
    k_base = qkv_ptr + (start + offs_n).to(tl.int64)[:, None] * stride_qkv + D + col[None, :]
    if SPLIT:
        # Full key blocks need no key mask (neither on the loads nor on the scores); the
        # partial last block, if any, is masked once after the loop. Each block's
        # pointers come from the loop index rather than being carried from the previous
        # block, which keeps the pointer tensor out of the loop's registers (triton 3.6).
        n_full = (n_end // BLOCK_N) * BLOCK_N
        nmask = (n_full + offs_n) < n_end  # the partial last block's keys (none if empty)
        kv_mask = nmask[:, None] & dmask[None, :]
        if EARLY_TAIL:  # its keys and values requested before the loop, not after it
            k_tail = tl.load(k_base + n_full * stride_qkv, mask=kv_mask, other=0.0,
                             cache_modifier=".cg")
            v_tail = tl.load(k_base + n_full * stride_qkv + D, mask=kv_mask, other=0.0,
                             cache_modifier=".cg")
        for n0 in range(0, n_full, BLOCK_N):
            k_ptrs = k_base + n0 * stride_qkv  # < max_seqlen * stride: int32
            k = tl.load(k_ptrs, mask=dmask[None, :], other=0.0, cache_modifier=".cg")
            v = tl.load(k_ptrs + D, mask=dmask[None, :], other=0.0, cache_modifier=".cg")
            m_i, l_i, acc = _online_softmax_step(q, k, v, m_i, l_i, acc, offs_n, False)
        if n_full < n_end:
            if not EARLY_TAIL:
                k_tail = tl.load(k_base + n_full * stride_qkv, mask=kv_mask, other=0.0,
                                 cache_modifier=".cg")
                v_tail = tl.load(k_base + n_full * stride_qkv + D, mask=kv_mask, other=0.0,
                                 cache_modifier=".cg")
            m_i, l_i, acc = _online_softmax_step(q, k_tail, v_tail, m_i, l_i, acc, nmask,
                                                 True)
    else:
        k_ptrs = k_base
        for n0 in range(0, n_end, BLOCK_N):
            nmask = (n0 + offs_n) < length
            kv_mask = nmask[:, None] & dmask[None, :]
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0, cache_modifier=".cg")
            v = tl.load(k_ptrs + D, mask=kv_mask, other=0.0, cache_modifier=".cg")
            m_i, l_i, acc = _online_softmax_step(q, k, v, m_i, l_i, acc, nmask, True)
            k_ptrs += BLOCK_N * stride_qkv
    looped = stamp(TRACE)
    bv = tl.load(bias_ptr + 2 * D + col, mask=dmask, other=0.0)
    # l_i >= 1 on every row that saw a key (its max contributes exp2(0)); the floor only
    # keeps rows of empty programs finite (they are not stored).
    out = acc / tl.maximum(l_i, 1.0)[:, None] + bv[None, :]
    o_col = col
    if FP8_OUT and OUT8_VEC:
        o_col = tl.max_contiguous(col, OUT8_VEC)
    o_ptrs = out_ptr + q_rows[:, None] * stride_out + o_col[None, :]
    if FP8_OUT == 4:  # int8 with per-column multipliers (the row kernels' mode 4)
        out8 = to_int8(out * tl.load(scale_ptr + col, mask=dmask, other=0.0)[None, :])
        computed = stamp(TRACE)
        tl.store(o_ptrs, out8, mask=io_mask)
    elif FP8_OUT:
        out8 = to_e4m3(out * (1.0 / tl.load(scale_ptr)))
        computed = stamp(TRACE)
        tl.store(o_ptrs, out8, mask=io_mask)
    else:
        out16 = out.to(out_ptr.dtype.element_ty)
        computed = stamp(TRACE)
        tl.store(o_ptrs, out16, mask=io_mask)
    return looped, computed


@triton.jit
def _attn_varlen_kernel(
    qkv_ptr, bias_ptr, out_ptr, cu_ptr, scale_ptr, tiles_ptr,
    qk_scale, stride_qkv, stride_out, D,
    HEAD_DIM: tl.constexpr, BLOCK_DH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr, FP8_OUT: tl.constexpr, TILED: tl.constexpr,
    SPLIT: tl.constexpr, LATE_RELEASE: tl.constexpr, EARLY_TAIL: tl.constexpr, trace_ptr,
    TRACE: tl.constexpr, OUT8_VEC: tl.constexpr = 0,
):
    """Grid (query blocks, sequences, heads), or with ``TILED`` (tile-list slots, heads).
    With ``USE_PDL`` the next kernel may launch right after the wait, or with
    ``LATE_RELEASE`` once the program has stored its rows. ``TRACE``: each program writes
    its timeline row (``kernels.timeline``)."""
    started = stamp(TRACE)
    head = tl.program_id(1) if TILED else tl.program_id(2)
    if PREFETCH:  # this head's Q and V biases into L1 while the QKV GEMM still runs
        v = head * HEAD_DIM + tl.minimum(tl.arange(0, BLOCK_DH // 16) * 16, HEAD_DIM - 1)
        prefetch_l1(bias_ptr + v)
        prefetch_l1(bias_ptr + 2 * D + v)
    pdl_enter(USE_PDL, not LATE_RELEASE)
    waited = stamp(TRACE)
    if TILED:
        slot = tiles_ptr + tl.program_id(0) * 3
        start = tl.load(slot, cache_modifier=".cg")
        length = tl.load(slot + 1, cache_modifier=".cg")
        m0 = tl.load(slot + 2, cache_modifier=".cg")
        if length > 0:
            attention_rows(qkv_ptr, bias_ptr, out_ptr, start, length, m0, head,
                           qk_scale, stride_qkv, stride_out, D, HEAD_DIM, BLOCK_DH, BLOCK_M,
                           BLOCK_N, scale_ptr, FP8_OUT, SPLIT, EARLY_TAIL, False, OUT8_VEC)
        looped, computed = waited, waited  # (no marks on the tile list's path)
    else:
        looped, computed = attention_tile(
            qkv_ptr, bias_ptr, out_ptr, cu_ptr, tl.program_id(0), tl.program_id(1), head,
            qk_scale, stride_qkv, stride_out, D, HEAD_DIM, BLOCK_DH, BLOCK_M, BLOCK_N,
            scale_ptr, FP8_OUT, SPLIT, EARLY_TAIL, TRACE, OUT8_VEC)
    pdl_release(LATE_RELEASE)
    record(trace_ptr, started, waited, looped, computed, computed, TRACE)


@triton.jit
def _attn_tiles_kernel(cu_ptr, tiles_ptr, n_seqs, n_slots, per_seq,
                       BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, MAX_TILES: tl.constexpr):
    """Program ``s < n_seqs`` writes sequence s's query blocks to consecutive slots (after
    those of the sequences before it) as (start row, length, first query); program
    ``n_seqs`` empties the slots past the last block (length 0). A sequence gets at most
    ``per_seq`` blocks (the grid's ceil(max_seqlen / BLOCK_M): a longer one, against the
    contract, is cut as the grid cuts it), and nothing is written past ``n_slots``."""
    me = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    smask = s < n_seqs
    c0 = tl.load(cu_ptr + s, mask=smask, other=0)
    c1 = tl.load(cu_ptr + s + 1, mask=smask, other=0)
    blocks = tl.minimum(tl.maximum(c1 - c0 + BLOCK_M - 1, 0) // BLOCK_M, per_seq)
    first = tl.sum(tl.where(s < me, blocks, 0), axis=0)
    i = tl.arange(0, MAX_TILES)
    if me < n_seqs:
        start = tl.load(cu_ptr + me)
        length = tl.load(cu_ptr + me + 1) - start
        mine = tl.minimum(tl.maximum(length + BLOCK_M - 1, 0) // BLOCK_M, per_seq)
        mask = (i < mine) & (first + i < n_slots)
        slot = tiles_ptr + (first + i) * 3
        tl.store(slot, start + i * 0, mask=mask)
        tl.store(slot + 1, length + i * 0, mask=mask)
        tl.store(slot + 2, i * BLOCK_M, mask=mask)
    else:
        for j0 in range(first, n_slots, MAX_TILES):
            idx = j0 + i
            mask = idx < n_slots
            for col in tl.static_range(3):
                tl.store(tiles_ptr + idx * 3 + col, i * 0, mask=mask)


def softmax_scale(head_dim: int) -> float:
    """1/sqrt(head_dim) with log2(e) folded in: the kernels exponentiate with exp2."""
    return float(LOG2E / head_dim**0.5)


def head_block(head_dim: int) -> int:
    """BLOCK_DH: the head dimension padded to a power of two (at least 16, for tl.dot)."""
    return max(16, int(triton.next_power_of_2(head_dim)))


def attention_config(max_seqlen: int, n_seqs: int, num_heads: int, head_dim: int,
                     tokens: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a batch of ``n_seqs`` sequences of
    ``tokens`` tokens in all (None: unknown, the default tile)."""
    if head_dim > 64 or tokens is None or tokens < ATTN_LARGE_MEAN * n_seqs:
        return ATTN_SMALL
    programs = triton.cdiv(max_seqlen, ATTN_LARGE[0]) * n_seqs * num_heads
    return ATTN_LARGE if programs >= _ATTN_LARGE_PROGRAMS else ATTN_SMALL


def register_cap(programs: int, warps: int) -> int | None:
    """The split loop's register cap for a launch of ``programs`` programs of ``warps``
    warps: ``ATTN_MAXNREG`` where they outnumber what the multiprocessors hold uncapped,
    else None (the compiler's choice)."""
    if ATTN_MAXNREG is None or programs <= _SMS * _UNCAPPED_PER_SM.get(warps, 1):
        return None
    return ATTN_MAXNREG


@dataclass(frozen=True)
class AttnTiles:
    """A tile list for :func:`attention_varlen`: int32 [slots, 3] (start row, length, first
    query) per query block of ``block_m`` rows, built on the device from ``cu_seqlens``
    (:func:`attention_tiles`), so one list serves every layer of a pass and a CUDA graph
    rebuilds it on each replay."""

    slots: torch.Tensor
    block_m: int


def tile_slots(tokens: int, n_seqs: int, block_m: int) -> int:
    """Slots enough for any ``n_seqs`` sequences of ``tokens`` rows in all: each needs
    ceil(length / block_m) <= length / block_m + 1 blocks."""
    return -(-tokens // block_m) + n_seqs


def attention_tiles(
    cu_seqlens: torch.Tensor,
    tokens: int,
    n_seqs: int,
    max_seqlen: int,
    num_heads: int,
    head_dim: int,
    config: tuple[int, int, int, int] | None = None,
    force: bool = False,
) -> AttnTiles | None:
    """The tile list of a batch of ``n_seqs`` sequences (``cu_seqlens`` int32 [n_seqs + 1])
    in ``tokens`` rows, or None where it would not save :func:`attention_varlen` a quarter
    of its programs (one sequence, or sequences close to ``max_seqlen``; ``force`` builds
    it regardless). Its grid otherwise has ceil(max_seqlen / BLOCK_M) programs for every
    sequence, however short: on the SQuAD mix (mean 176 of 384 tokens) ~47% of them have
    nothing to do. One launch of ``n_seqs + 1`` programs."""
    bm = (config or attention_config(max_seqlen, n_seqs, num_heads, head_dim, tokens))[0]
    per_seq = -(-max_seqlen // bm)
    n_slots = tile_slots(tokens, n_seqs, bm)
    if n_seqs == 0 or (not force and (n_seqs < 2 or 4 * n_slots > 3 * per_seq * n_seqs)):
        return None
    slots = torch.empty((n_slots, 3), dtype=torch.int32, device=cu_seqlens.device)
    _attn_tiles_kernel[(n_seqs + 1,)](
        cu_seqlens, slots, n_seqs, n_slots, per_seq, BLOCK_M=bm,
        BLOCK_S=max(2, int(triton.next_power_of_2(n_seqs))),
        MAX_TILES=max(2, int(triton.next_power_of_2(per_seq))), num_warps=4,
    )
    return AttnTiles(slots, bm)


def attention_varlen(
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    n_seqs: int,
    num_heads: int,
    config: tuple[int, int, int, int] | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    fp8_scale: torch.Tensor | None = None,
    tiles: AttnTiles | None = None,
    split: bool | None = None,
    late_release: bool = False,
    early_tail: bool | None = None,
    int8_mult: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bidirectional multi-head attention over packed sequences; returns [T, hidden], in
    ``qkv``'s dtype or, given ``fp8_scale`` (float32 [1], calibrated), in e4m3 with that
    scale (values beyond ``448 * fp8_scale`` saturate), or, given ``int8_mult`` (float32
    [hidden]), in int8: ``round(out * int8_mult)`` saturating at +-127
    (``engine.fused.int8``).

    ``qkv`` [T, 3*hidden] is the bias-free QKV GEMM output; ``cu_seqlens`` int32
    [n_seqs + 1]. ``max_seqlen`` and ``n_seqs`` only size the grid: they may exceed the
    real values (extra sequences have zero length), which is what CUDA graphs rely on.
    Rows of the output outside every sequence are left unwritten. ``prefetch`` (with
    ``pdl``) pulls each program's bias slices into L1 before waiting for the QKV GEMM.
    ``tiles`` (:func:`attention_tiles` of the same batch and tiles) launches one program per
    slot of the list instead of ceil(max_seqlen / BLOCK_M) per sequence. ``split`` (None:
    ``ATTN_SPLIT_LOOP``) runs the key loop split into unmasked full blocks and a masked
    tail, with registers capped where programs outnumber what the multiprocessors hold
    (:func:`register_cap`); the output is the same. ``late_release`` (with ``pdl``) lets the
    next kernel launch only after each program's stores, not right after its wait.
    ``early_tail`` (split loop only; None: ``ATTN_EARLY_TAIL`` where the registers are not
    capped) requests the partial last key block before the loop over the full ones; the
    output is the same.
    """
    n, three_d = qkv.shape
    d = three_d // 3
    head_dim = d // num_heads
    if int8_mult is not None:
        check_int8_mult(int8_mult, d, fp8_scale)
    mode = 4 if int8_mult is not None else int(fp8_scale is not None)  # FP8_OUT
    out_dtype = (torch.int8 if int8_mult is not None
                 else qkv.dtype if fp8_scale is None else FP8_DTYPE)
    out = torch.empty((n, d), device=qkv.device, dtype=out_dtype)
    if n_seqs == 0 or max_seqlen == 0:
        return out
    bm, bn, warps, stages = config or attention_config(max_seqlen, n_seqs, num_heads,
                                                       head_dim, n)
    if tiles is not None and tiles.block_m != bm:
        raise ValueError(f"the tile list has {tiles.block_m}-query blocks, the tiles {bm}")
    split = ATTN_SPLIT_LOOP if split is None else split
    grid = ((triton.cdiv(max_seqlen, bm), n_seqs, num_heads) if tiles is None
            else (tiles.slots.shape[0], num_heads))
    cap = register_cap(grid[0] * grid[1] * (grid[2] if len(grid) == 3 else 1), warps)
    maxnreg = {"maxnreg": cap} if split and cap else {}
    early_tail = split and (ATTN_EARLY_TAIL and not cap if early_tail is None else early_tail)
    trace = trace_slot("attention", grid)
    _attn_varlen_kernel[grid](
        qkv, qkv_bias, out, cu_seqlens,
        int8_mult if int8_mult is not None else out if fp8_scale is None else fp8_scale,
        cu_seqlens if tiles is None else tiles.slots,
        softmax_scale(head_dim), qkv.stride(0), out.stride(0), d,
        HEAD_DIM=head_dim, BLOCK_DH=head_block(head_dim),
        BLOCK_M=bm, BLOCK_N=bn, USE_PDL=pdl, PREFETCH=pdl and prefetch,
        FP8_OUT=mode,
        TILED=tiles is not None, SPLIT=split,
        LATE_RELEASE=pdl and late_release, EARLY_TAIL=early_tail,
        trace_ptr=qkv if trace is None else trace, TRACE=trace is not None,
        OUT8_VEC=(ATTN_OUT8_VECTOR or 0) if mode else 0, num_warps=warps,
        num_stages=stages,
        **launch_options(pdl), **maxnreg,
    )
    return out
