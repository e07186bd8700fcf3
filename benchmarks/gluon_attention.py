# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""A prototype of the packed attention kernel in Gluon (Triton's explicit-layout dialect,
``triton.experimental.gluon``), timed against the engine's kernel on a SQuAD-mix batch.

    python3 benchmarks/gluon_attention.py [--windows 256] [--rounds 3] [--out gluon.json]

Why (``engine/fused/NOTES.md`` v40): the engine's kernel is written in plain Triton, which
cannot keep a wgmma in flight across the softmax. This one does what FlashAttention 3 does
inside one warpgroup: the next key block's QK^T is issued (asynchronous wgmma) before this
block's softmax and waited for after it, and P V runs while the next softmax starts. Q is
a shared-memory operand (biased and scaled once, stored back to shared memory); K and V
arrive by TMA into a ring of ``STAGES`` buffers with one mbarrier each, refilled as soon
as the wgmma that read a buffer is done. One program per (tile-list slot, head), 4 warps,
16-bit in and out, head size 64; the same inputs and outputs as
``kernels.attention_varlen`` with a tile list (Q/K/V column slices of the bias-free QKV
GEMM output, the K bias dropped, the V bias added at the end).

Not in the engine: no TRITON_INTERPRET path (Gluon kernels compile for the GPU only), no
e4m3 output, no PDL. The TMA boxes read rows past a sequence (the next sequence's, or
zeros past the tensor): masked scores cover keys; V rows past the sequence meet P = 0, so
they must be finite (they are here). Prints µs a launch per round (CUDA graph of 24
launches, idle GPU) and the largest difference from the engine's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# the names Gluon moved between triton 3.6 (the device's) and 3.9
from engine.fused.kernels.gluon_gemm import cta_barrier, tma_load

REPO = Path(__file__).resolve().parents[1]
# Layouts of one warpgroup over 64-row blocks and 64 keys (the per-sequence forms): the
# wgmma accumulator, P as a register operand of P V, and the query block's load.
MMA64: gl.constexpr = gl.constexpr(gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
P64: gl.constexpr = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA64.value,
                                                     k_width=2))
Q_LOAD: gl.constexpr = gl.constexpr(gl.BlockedLayout(
    size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0]))


@gluon.jit
def _load_kv(desc, bars, k_bufs, v_bufs, block, start, k_col, v_col,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, pred):
    """Key block ``block``'s K and V tiles into ring slot ``block % STAGES`` (TMA), its
    barrier expecting both."""
    s = block % STAGES
    bar = bars.index(s)
    mbarrier.expect(bar, 2 * desc.block_type.nbytes, pred=pred)
    tma_load(desc, [start + block * BLOCK_N, k_col], bar, k_bufs.index(s), pred=pred)
    tma_load(desc, [start + block * BLOCK_N, v_col], bar, v_bufs.index(s), pred=pred)


@gluon.jit
def _softmax(s, m_i, l_i, block, length, BLOCK_N: gl.constexpr, col_layout: gl.constexpr):
    """Scores ``s`` of key block ``block`` (keys past ``length`` masked) into P, with the
    running max and sum; returns (P, alpha, m_new, l_new)."""
    if (block + 1) * BLOCK_N > length:
        keys = gl.arange(0, BLOCK_N, layout=col_layout) + block * BLOCK_N
        s = gl.where(gl.expand_dims(keys < length, 0), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - gl.expand_dims(m_new, 1))
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def _prepare_q(q_smem, bias_ptr, q_col, qk_scale, HEAD_DIM: gl.constexpr,
               blocked: gl.constexpr):
    """The query block in shared memory (landed) plus its bias, times the softmax scale
    (log2 e folded in), written back in place for the QK^T wgmma."""
    q = q_smem.load(blocked).to(gl.float32)
    bq = gl.load(bias_ptr + q_col + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, blocked)))
    q = (q + gl.expand_dims(bq.to(gl.float32), 0)) * qk_scale
    cta_barrier()
    q_smem.store(q.to(gl.float16))
    fence_async_shared()
    cta_barrier()


@gluon.jit
def _pv(acc, p, alpha, v_buf, p_layout: gl.constexpr):
    """``acc`` rescaled by ``alpha`` plus P V (an asynchronous wgmma, P from registers)."""
    acc = acc * gl.expand_dims(alpha, 1)
    return warpgroup_mma(gl.convert_layout(p.to(gl.float16), p_layout), v_buf, acc,
                         is_async=True)


@gluon.jit
def _store_rows(acc, l_i, bias_ptr, out_ptr, start, m0, length, q_col, v_col, stride_out,
                BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, mma: gl.constexpr):
    """Rows ``m0 : m0 + BLOCK_M`` of the sequence (those under ``length``): ``acc`` over the
    row sums plus the V bias, fp16, into this head's output columns."""
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma))
    bv = gl.load(bias_ptr + v_col + offs_d).to(gl.float32)
    out = acc / gl.expand_dims(gl.maximum(l_i, 1.0), 1) + gl.expand_dims(bv, 0)
    o_rows = (start + m0 + offs_m).to(gl.int64)
    ptrs = out_ptr + gl.expand_dims(o_rows * stride_out, 1) + gl.expand_dims(q_col + offs_d, 0)
    gl.store(ptrs, out.to(gl.float16), mask=gl.expand_dims(m0 + offs_m < length, 1))


@gluon.jit
def _attend(q_smem, k_bufs, v_bufs, bars, desc, start, k_col, v_col, length,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
            STAGES: gl.constexpr, PV_PENDING: gl.constexpr, mma: gl.constexpr):
    """One query block (prepared in ``q_smem``) over the sequence's key blocks in the ring
    of ``STAGES`` K/V slots (block b in slot b % STAGES, signalled on its barrier): the
    next block's QK^T in flight during this block's softmax, each slot refilled with the
    block STAGES past it once its P V is waited for (never, where STAGES holds every
    block). Returns (the P V accumulator, the row sums)."""
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    n_blocks = gl.cdiv(length, BLOCK_N)
    zeros_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
    # (an accumulator value: the loop carries P V's wgmma in flight)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=mma))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=rows)
    mbarrier.wait(bars.index(0), 0)
    s_cur = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zeros_s,
                          use_acc=False, is_async=True)
    s_cur = warpgroup_mma_wait(num_outstanding=0, deps=(s_cur,))
    for j in range(0, n_blocks - 1):
        # The next block's scores, in flight during this block's softmax.
        nxt = j + 1
        mbarrier.wait(bars.index(nxt % STAGES), (nxt // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_bufs.index(nxt % STAGES).permute((1, 0)), zeros_s,
                               use_acc=False, is_async=True)
        p, alpha, m_i, l_i = _softmax(s_cur, m_i, l_i, j, length, BLOCK_N, cols)
        # P V of the previous block done (the newest group, s_next, may still run):
        # its ring slot is free for the block STAGES past it.
        acc = warpgroup_mma_wait(num_outstanding=PV_PENDING, deps=(acc,))
        prev = j - 1
        _load_kv(desc, bars, k_bufs, v_bufs, prev + STAGES, start, k_col, v_col, BLOCK_N,
                 STAGES, (prev >= 0) & (prev + STAGES < n_blocks))
        acc = _pv(acc, p, alpha, v_bufs.index(j % STAGES), p_layout)
        s_cur = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))
    last = n_blocks - 1
    p, alpha, m_i, l_i = _softmax(s_cur, m_i, l_i, last, length, BLOCK_N, cols)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    acc = _pv(acc, p, alpha, v_bufs.index(last % STAGES), p_layout)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, l_i


@gluon.jit
def _attn_gluon_kernel(desc, q_desc, bias_ptr, out_ptr, tiles_ptr, qk_scale, stride_out, D,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, num_warps: gl.constexpr,
                       PV_PENDING: gl.constexpr = 1):
    slot = tiles_ptr + gl.program_id(0) * 3
    start = gl.load(slot)
    length = gl.load(slot + 1)
    m0 = gl.load(slot + 2)
    head = gl.program_id(1)
    if length > 0:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
        q_col = head * HEAD_DIM
        k_col = D + q_col
        v_col = 2 * D + q_col
        n_blocks = gl.cdiv(length, BLOCK_N)

        q_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, HEAD_DIM], q_desc.layout)
        k_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_DIM], desc.layout)
        v_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_DIM], desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES + 1):
            mbarrier.init(bars.index(i), count=1)
        q_bar = bars.index(STAGES)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma_load(q_desc, [start + m0, q_col], q_bar, q_smem)
        for b in gl.static_range(STAGES):
            _load_kv(desc, bars, k_bufs, v_bufs, b, start, k_col, v_col, BLOCK_N, STAGES,
                     b < n_blocks)
        mbarrier.wait(q_bar, 0)
        _prepare_q(q_smem, bias_ptr, q_col, qk_scale, HEAD_DIM, Q_LOAD)
        acc, l_i = _attend(q_smem, k_bufs, v_bufs, bars, desc, start, k_col, v_col, length,
                           BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, PV_PENDING, mma)
        for i in gl.static_range(STAGES + 1):
            mbarrier.invalidate(bars.index(i))
        _store_rows(acc, l_i, bias_ptr, out_ptr, start, m0, length, q_col, v_col, stride_out,
                    BLOCK_M, HEAD_DIM, mma)


@gluon.jit
def _load_resident_kv(desc, k_bufs, v_bufs, bars, start, n_blocks, k_col, v_col,
                      BLOCK: gl.constexpr, MAX_BLOCKS: gl.constexpr):
    """All of the sequence's key blocks (up to ``n_blocks``) into their own K and V
    buffers, block b signalling barrier b."""
    for b in gl.static_range(MAX_BLOCKS):
        pred = b < n_blocks
        mbarrier.expect(bars.index(b), 2 * desc.block_type.nbytes, pred=pred)
        tma_load(desc, [start + b * BLOCK, k_col], bars.index(b), k_bufs.index(b), pred=pred)
        tma_load(desc, [start + b * BLOCK, v_col], bars.index(b), v_bufs.index(b), pred=pred)


@gluon.jit
def _attn_seq_kernel(desc, q_desc, bias_ptr, out_ptr, cu_ptr, qk_scale, stride_out, D,
                     HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr, MAX_BLOCKS: gl.constexpr,
                     num_warps: gl.constexpr):
    """One program per (sequence, head): the sequence's K and V blocks loaded once (TMA,
    all of them, one mbarrier each) and kept in shared memory while every query block of
    the sequence runs over them in turn (Q double-buffered), so that K and V cross from L2
    once per head instead of once per query block."""
    seq = gl.program_id(0)
    head = gl.program_id(1)
    start = gl.load(cu_ptr + seq)
    length = gl.load(cu_ptr + seq + 1) - start
    if length > 0:
        q_col = head * HEAD_DIM
        k_col = D + q_col
        v_col = 2 * D + q_col
        n_blocks = gl.cdiv(length, BLOCK)

        k_bufs = gl.allocate_shared_memory(gl.float16, [MAX_BLOCKS, BLOCK, HEAD_DIM], desc.layout)
        v_bufs = gl.allocate_shared_memory(gl.float16, [MAX_BLOCKS, BLOCK, HEAD_DIM], desc.layout)
        q_bufs = gl.allocate_shared_memory(gl.float16, [2, BLOCK, HEAD_DIM], q_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [MAX_BLOCKS + 2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(MAX_BLOCKS + 2):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.expect(bars.index(MAX_BLOCKS), q_desc.block_type.nbytes)
        tma_load(q_desc, [start, q_col], bars.index(MAX_BLOCKS), q_bufs.index(0))
        _load_resident_kv(desc, k_bufs, v_bufs, bars, start, n_blocks, k_col, v_col,
                          BLOCK, MAX_BLOCKS)

        for qb in range(0, n_blocks):
            buf = qb % 2
            # The next query block into the other buffer (its last reader, the previous
            # block's QK^T, is done: every wgmma is waited for before a block ends).
            nq = qb + 1
            mbarrier.expect(bars.index(MAX_BLOCKS + nq % 2), q_desc.block_type.nbytes,
                            pred=nq < n_blocks)
            tma_load(q_desc, [start + nq * BLOCK, q_col], bars.index(MAX_BLOCKS + nq % 2),
                      q_bufs.index(nq % 2), pred=nq < n_blocks)
            mbarrier.wait(bars.index(MAX_BLOCKS + buf), (qb // 2) & 1)
            q_smem = q_bufs.index(buf)
            _prepare_q(q_smem, bias_ptr, q_col, qk_scale, HEAD_DIM, Q_LOAD)
            # (every block resident: the ring is all MAX_BLOCKS slots, never refilled)
            acc, l_i = _attend(q_smem, k_bufs, v_bufs, bars, desc, start, k_col, v_col, length,
                               BLOCK, BLOCK, HEAD_DIM, MAX_BLOCKS, 0, MMA64)
            _store_rows(acc, l_i, bias_ptr, out_ptr, start, qb * BLOCK, length, q_col, v_col,
                        stride_out, BLOCK, HEAD_DIM, MMA64)
        for i in gl.static_range(MAX_BLOCKS + 2):
            mbarrier.invalidate(bars.index(i))


# The two-warpgroup per-sequence form's fixed shape (warp-specialized partitions take
# their constants from here: constexpr arguments do not cross into them in triton 3.6):
# 64-wide heads, 64-row blocks, windows of up to 384 tokens.
SEQ2_HEAD_DIM: gl.constexpr = gl.constexpr(64)
SEQ2_BLOCK: gl.constexpr = gl.constexpr(64)
SEQ2_MAX_BLOCKS: gl.constexpr = gl.constexpr(6)


@gluon.jit
def _seq_consumer(desc, q_desc, k_bufs, v_bufs, q_bufs, bars, bias_ptr, out_ptr, start, length,
                  head, qk_scale, stride_out, D, WG):
    """One warpgroup of :func:`_attn_seq2_kernel`: query blocks WG, WG + 2, ... of the
    sequence, each over the resident K/V (its own Q buffer and barrier), one key block
    at a time (v40: the next block's QK^T in flight as well spilled at 128 registers and
    took 260-269 µs; its code is in b850e3b)."""
    HEAD_DIM: gl.constexpr = SEQ2_HEAD_DIM
    BLOCK: gl.constexpr = SEQ2_BLOCK
    MAX_BLOCKS: gl.constexpr = SEQ2_MAX_BLOCKS
    rows: gl.constexpr = gl.SliceLayout(1, MMA64)
    cols: gl.constexpr = gl.SliceLayout(0, MMA64)
    q_col = head * HEAD_DIM
    v_col = 2 * D + q_col
    n_blocks = gl.cdiv(length, BLOCK)
    q_smem = q_bufs.index(WG)
    q_bar = bars.index(MAX_BLOCKS + WG)
    zeros_s = gl.zeros([BLOCK, BLOCK], gl.float32, layout=MMA64)
    for qb in range(WG, n_blocks, 2):
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma_load(q_desc, [start + qb * BLOCK, q_col], q_bar, q_smem)
        mbarrier.wait(q_bar, ((qb - WG) // 2) & 1)
        _prepare_q(q_smem, bias_ptr, q_col, qk_scale, HEAD_DIM, Q_LOAD)
        acc = warpgroup_mma_init(gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout=MMA64))
        m_i = gl.full([BLOCK], float("-inf"), gl.float32, layout=rows)
        l_i = gl.zeros([BLOCK], gl.float32, layout=rows)
        for j in range(0, n_blocks):
            mbarrier.wait(bars.index(j), 0)
            sc = warpgroup_mma(q_smem, k_bufs.index(j).permute((1, 0)), zeros_s,
                               use_acc=False, is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
            p, alpha, m_i, l_i = _softmax(sc, m_i, l_i, j, length, BLOCK, cols)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            acc = _pv(acc, p, alpha, v_bufs.index(j), P64)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _store_rows(acc, l_i, bias_ptr, out_ptr, start, qb * BLOCK, length, q_col, v_col,
                    stride_out, BLOCK, HEAD_DIM, MMA64)
        cta_barrier()  # every warp done with Q (its wgmmas waited) before the next TMA


@gluon.jit
def _attn_seq2_kernel(desc, q_desc, bias_ptr, out_ptr, cu_ptr, qk_scale, stride_out, D,
                      WORKER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """:func:`_attn_seq_kernel` with two warpgroups (warp-specialized partitions of 4 warps)
    taking alternate query blocks over the one resident K/V: 8 warps a program, each with
    one Q buffer (112 KB of shared memory at 384 tokens: two programs, 16 warps an SM)."""
    seq = gl.program_id(0)
    head = gl.program_id(1)
    start = gl.load(cu_ptr + seq)
    length = gl.load(cu_ptr + seq + 1) - start
    n_blocks = gl.cdiv(length, SEQ2_BLOCK)
    q_col = head * SEQ2_HEAD_DIM
    k_bufs = gl.allocate_shared_memory(gl.float16, [SEQ2_MAX_BLOCKS, SEQ2_BLOCK, SEQ2_HEAD_DIM],
                                       desc.layout)
    v_bufs = gl.allocate_shared_memory(gl.float16, [SEQ2_MAX_BLOCKS, SEQ2_BLOCK, SEQ2_HEAD_DIM],
                                       desc.layout)
    q_bufs = gl.allocate_shared_memory(gl.float16, [2, SEQ2_BLOCK, SEQ2_HEAD_DIM], q_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [SEQ2_MAX_BLOCKS + 2, 1],
                                     mbarrier.MBarrierLayout())
    for i in gl.static_range(SEQ2_MAX_BLOCKS + 2):
        mbarrier.init(bars.index(i), count=1)
    _load_resident_kv(desc, k_bufs, v_bufs, bars, start, n_blocks, D + q_col, 2 * D + q_col,
                      SEQ2_BLOCK, SEQ2_MAX_BLOCKS)
    # (a program whose sequence is empty loads nothing and both loops run zero times)
    wg0 = (desc, q_desc, k_bufs, v_bufs, q_bufs, bars, bias_ptr, out_ptr, start, length, head,
           qk_scale, stride_out, D, seq * 0)
    wg1 = (desc, q_desc, k_bufs, v_bufs, q_bufs, bars, bias_ptr, out_ptr, start, length, head,
           qk_scale, stride_out, D, seq * 0 + 1)
    gl.warp_specialize([(_seq_consumer, wg0), (_seq_consumer, wg1)], [4], [WORKER_REGS])
    for i in gl.static_range(SEQ2_MAX_BLOCKS + 2):
        mbarrier.invalidate(bars.index(i))


def _output_and_desc(qkv: Any, heads: int, rows: int) -> tuple[Any, int, int, Any]:
    """(the [T, hidden] fp16 output, hidden, head size, a TMA descriptor of ``rows`` x head
    size boxes over ``qkv``) for a launch."""
    import torch

    t, three_d = qkv.shape
    d = three_d // 3
    head_dim = d // heads
    out = torch.empty((t, d), device=qkv.device, dtype=qkv.dtype)
    layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.float16)
    return out, d, head_dim, TensorDescriptor.from_tensor(qkv, [rows, head_dim], layout)


def attention_gluon_seq(qkv: Any, bias: Any, cu: Any, n_seqs: int, max_seqlen: int,
                        heads: int) -> Any:
    """:func:`_attn_seq_kernel` over ``cu`` (int32 [n_seqs + 1]): [T, hidden] fp16."""
    from engine.fused.kernels.attention import softmax_scale

    out, d, head_dim, desc = _output_and_desc(qkv, heads, 64)
    _attn_seq_kernel[(n_seqs, heads)](
        desc, desc, bias, out, cu, softmax_scale(head_dim), out.stride(0), d,
        HEAD_DIM=head_dim, BLOCK=64, MAX_BLOCKS=triton.cdiv(max_seqlen, 64), num_warps=4)
    return out


def attention_gluon_seq2(qkv: Any, bias: Any, cu: Any, n_seqs: int, max_seqlen: int,
                         heads: int) -> Any:
    """:func:`_attn_seq2_kernel` over ``cu``: [T, hidden] fp16 (64-wide heads, windows of
    up to 384 tokens; registers capped at 128 for two programs of 8 warps an SM)."""
    from engine.fused.kernels.attention import softmax_scale

    out, d, head_dim, desc = _output_and_desc(qkv, heads, 64)
    if head_dim != 64 or max_seqlen > 384:
        raise ValueError("the two-warpgroup form takes 64-wide heads and <= 384 tokens")
    _attn_seq2_kernel[(n_seqs, heads)](
        desc, desc, bias, out, cu, softmax_scale(head_dim), out.stride(0), d,
        WORKER_REGS=128, num_warps=4, maxnreg=128)
    return out


def attention_gluon(qkv: Any, bias: Any, slots: Any, heads: int, stages: int = 3,
                    pv_pending: int = 0, block_n: int = 64, maxnreg: int = 0) -> Any:
    """The prototype over a tile list ``slots`` (``kernels.attention_tiles(..).slots``,
    64-query blocks): [T, hidden] fp16. ``pv_pending`` 1 leaves P V in flight into the
    next block's softmax (ptxas then serializes the wgmmas: C7514), 0 waits for it first."""
    from engine.fused.kernels.attention import softmax_scale

    out, d, head_dim, desc = _output_and_desc(qkv, heads, block_n)
    q_desc = desc if block_n == 64 else _output_and_desc(qkv, heads, 64)[3]
    _attn_gluon_kernel[(slots.shape[0], heads)](
        desc, q_desc, bias, out, slots, softmax_scale(head_dim), out.stride(0), d,
        HEAD_DIM=head_dim, BLOCK_M=64, BLOCK_N=block_n, STAGES=stages, num_warps=4,
        PV_PENDING=pv_pending, **({"maxnreg": maxnreg} if maxnreg else {}))
    return out


def sm90_sass(form: str, stages: int = 3, pv_pending: int = 0, block_n: int = 64,
              maxnreg: int = 0) -> tuple[str, str, int]:
    """(SASS, ``cuobjdump -res-usage``, shared bytes) of a form compiled for sm_90a here, no
    GPU needed (``attention_sass.compile_sass``): ``"tiles"`` (:func:`_attn_gluon_kernel`
    with these settings), ``"seq"`` (:func:`_attn_seq_kernel` for 384-token windows) or
    ``"seq2"`` (:func:`_attn_seq2_kernel` at 128 registers, as launched). BERT-large's
    64-wide heads."""
    import torch
    from triton.runtime.jit import mangle_type

    from benchmarks.attention_sass import compile_sass

    qkv = torch.empty((64, 3 * 1024), dtype=torch.float16)

    def desc(rows: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, 64], gl.float16)
        return str(mangle_type(TensorDescriptor.from_tensor(qkv, [rows, 64], layout)))

    common = {"bias_ptr": "*fp16", "out_ptr": "*fp16"}
    scalars = {"qk_scale": "fp32", "stride_out": "i32", "D": "i32"}
    options: dict[str, object] = {"num_warps": 4}
    if form == "seq2":
        signature = {"desc": desc(64), "q_desc": desc(64), **common, "cu_ptr": "*i32",
                     **scalars, "WORKER_REGS": "constexpr", "num_warps": "constexpr"}
        return compile_sass(_attn_seq2_kernel, signature, {"WORKER_REGS": 128, "num_warps": 4},
                            ("bias_ptr", "out_ptr", "cu_ptr", "stride_out", "D"),
                            {**options, "maxnreg": 128}, gluon=True)
    if form == "seq":
        signature = {"desc": desc(64), "q_desc": desc(64), **common, "cu_ptr": "*i32",
                     **scalars, "HEAD_DIM": "constexpr", "BLOCK": "constexpr",
                     "MAX_BLOCKS": "constexpr", "num_warps": "constexpr"}
        constexprs: dict[str, object] = {"HEAD_DIM": 64, "BLOCK": 64, "MAX_BLOCKS": 6,
                                         "num_warps": 4}
        return compile_sass(_attn_seq_kernel, signature, constexprs,
                            ("bias_ptr", "out_ptr", "cu_ptr", "stride_out", "D"), options,
                            gluon=True)
    signature = {"desc": desc(block_n), "q_desc": desc(64), **common, "tiles_ptr": "*i32",
                 **scalars, "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr",
                 "BLOCK_N": "constexpr", "STAGES": "constexpr", "num_warps": "constexpr",
                 "PV_PENDING": "constexpr"}
    constexprs = {"HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": block_n, "STAGES": stages,
                  "num_warps": 4, "PV_PENDING": pv_pending}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return compile_sass(_attn_gluon_kernel, signature, constexprs,
                        ("bias_ptr", "out_ptr", "tiles_ptr", "stride_out", "D"), options,
                        gluon=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="3:0:64:128,3:0:32:0",
                   help="STAGES:PV_PENDING:BLOCK_N:MAXNREG (STAGES >= 3: block j + 1 loads "
                        "while block j runs; MAXNREG 0: no cap), 'seq' (one program a "
                        "sequence and head) or 'seq2' (the same with two warpgroups)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.profile_attention import mix_batch, time_forms
    from engine.fused.kernels import attention as attn

    lengths, cu, qkv, bias = mix_batch(args.windows, args.heads * 64)
    t, max_len, n = sum(lengths), max(lengths), len(lengths)
    tiles = attn.attention_tiles(cu, t, n, max_len, args.heads, 64, config=attn.ATTN_SMALL,
                                 force=True)
    assert tiles is not None
    calls = {"engine": lambda: attn.attention_varlen(qkv, bias, cu, max_len, n, args.heads,
                                                     config=attn.ATTN_SMALL, tiles=tiles)}
    for item in filter(None, args.variants.split(",")):
        if item == "seq":
            calls["gluon_per_sequence"] = lambda: attention_gluon_seq(qkv, bias, cu, n,
                                                                      max_len, args.heads)
            continue
        if item == "seq2":
            calls["gluon_per_sequence_2wg"] = lambda: attention_gluon_seq2(qkv, bias, cu, n,
                                                                           max_len, args.heads)
            continue
        st, pv, bn, mr = (int(v) for v in item.split(":"))
        calls[f"gluon_{st}_stages_pv{pv}_n{bn}_reg{mr}"] = (
            lambda st=st, pv=pv, bn=bn, mr=mr: attention_gluon(qkv, bias, tiles.slots,
                                                               args.heads, st, pv, bn, mr))
    ref = calls["engine"]().float()
    result: dict[str, Any] = {"tokens": t, "windows": n, "device": torch.cuda.get_device_name(),
                              "triton": triton.__version__, "max_abs_vs_engine": {}}
    for name, call in calls.items():
        result["max_abs_vs_engine"][name] = float((call().float() - ref).abs().max())
        print(f"{name}: max |out - engine's| {result['max_abs_vs_engine'][name]:.3e}",
              flush=True)
    result["us"] = time_forms(calls, args.rounds)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
