# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""An 8-bit GEMM with a scaling epilogue beside its main loop, as a warp-specialized
Gluon kernel (Triton's explicit-layout dialect, ``triton.experimental.gluon``; Hopper,
sm_90): the calibrated FP8 FFN1 (``fp8.calibrated_ffn1``: bias + tanh-GELU + e4m3), and
the same kernel on int8 operands for the INT8 study (NOTES v49-v50).

``out = cast(o_scale * act(x_scale * w_scale * col[n] * (a @ b^T) + bias))``: ``a`` [M, K]
and ``b`` [N, K] both e4m3 (float32 accumulation, ``QGMMA``) or both int8 (int32,
``IGMMA``); ``col`` optional per-column factors (int8 weights carry one scale a channel:
``w_scale`` is their largest, ``col`` each over it, so the fp16 handoff below never
holds a value larger than the largest channel's); ``bias`` optional; ``act`` tanh-GELU or
none; the output e4m3 (scaled by ``o_scale``, FFN2's input) or 16-bit (QKV's, the
out-projection's).

Why (``engine/fused/NOTES.md`` v37, v39, v41): FFN1 is a quarter of the settled mix pass
and ran at ~1,000 TFLOP/s against FFN2's ~1,400 for the same FLOPs: with K = 1,024 a
tile's epilogue outlasts the other warp group's main loop, so cuBLASLt's cooperative and
CUTLASS's ping-pong kernels leave the tensor cores idle 22-43% of FFN1's cycles. Here no
warp that issues wgmmas runs the epilogue:

- a loader warp streams A (activations) and B (weights) K-blocks by TMA into a ring of
  ``STAGES`` slots (one "ready" and one "empty" mbarrier a slot), across tile boundaries;
- two MMA warpgroups run K loops (asynchronous wgmmas, a slot released as soon as the
  wgmma that read it is done), then each hands its accumulators to the epilogue through
  its own shared-memory buffer and goes on to its next tile. Ping-pong (:data:`CONFIG`'s
  default, 128 x 128 tiles): they take alternate tiles of the program's sequence, and
  turns at the ring. Cooperative (256 tile columns): both take every 128 x 256 tile, 64
  rows each against the one B block (a quarter less L2 traffic);
- the epilogue warpgroup (the default partition) reads a handed-over tile in ``SUB_M``-row
  chunks, computes ``e4m3(h_inv * GELU_tanh(x_scale * w_scale * acc + b1))`` (FFN1; or
  the other forms above), stores it, and frees the buffer.

The accumulators are handed over as fp16 after the operands' scales (``ACC16``; float32
buffers leave room for only 3 ring slots, and ran 25% slower): that rounding moves
~0.3% of the e4m3 outputs by one step from cuBLASLt's (same error to float32 math).
Persistent (one program an SM), tiles in row-major order (a wave of programs covers a few
128-row blocks times all of N, so each activation block is read from DRAM once and the
4 MB of weights stay in L2). GPU only: Gluon kernels have no TRITON_INTERPRET path.
ptxas allocates the whole kernel within the launch's register cap (128 for its 16 warps,
whatever ``setmaxnreg`` gives a partition), so the wgmmas are n128 instructions.

Off by default (``fp8.FFN1_GLUON_MIN_ROWS``), v41 on an H100: alone it takes the mix's FFN1
(47,391 x 4,096 x 1,024) from cuBLASLt's 431-456 to 340-359 µs at burst clocks and from
414-416 to 378-390 µs with the 700 W power limit settled (9% less energy a call), but the
settled mix pass barely gains (+0.3-0.4% in two alternating runs, within its drift): with it
the whole pass runs ~170 MHz slower clocks at the same power. F1 on the shipped MiniLM is
unchanged (+0.087 loss over four weight roundings against the default's +0.095).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from engine.fused.dispatch import multiprocessors

# Gluon's names moved between releases (triton 3.6 and 3.9): the CTA barrier
# (``thread_barrier`` -> ``barrier``) and the TMA load (``async_copy_global_to_shared`` ->
# ``async_load``). Also ``benchmarks/gluon_attention.py``'s.
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

BLOCK_M = 128  # a tile's rows (a ring slot's A block)
# (ring slots, K-block, epilogue chunk rows, tile columns) of a launch; read at each call
# (an A/B can set it). 128 tile columns: ping-pong warpgroups; 256: cooperative ones.
CONFIG: tuple[int, int, int, int] = (4, 128, 32, 128)
# The launch: 4 epilogue warps, a loader warp and two MMA warpgroups (16 warps with the
# loader's group, so 128 registers a thread at most), and what setmaxnreg gives the workers.
LAUNCH: dict[str, int] = {"num_warps": 4, "maxnreg": 128}
# How the epilogue reads an addend (read at each call, so an A/B can set it): True, a TMA
# load of the whole tile into shared memory, issued as soon as the previous tile's
# epilogue is done, so it lands while the epilogue waits for the accumulators; False,
# global loads in each ``SUB_M``-row chunk, whose latency each chunk waits out (v52: the
# out-projection adding the residual took +36 µs a call, +40%, for 97 MB more read).
ADD_BY_TMA = True
# The accumulators' handoff buffers in shared memory (read at each call): True, in the
# wgmma layout's own swizzle (``NVMMASharedLayout``: the MMA warpgroups store fp16 buffers
# with ``stmatrix``, 16 bytes a thread an instruction, and the epilogue reads 16 bytes a
# load); False, v41's generic swizzle (4-byte stores, 8-byte loads: 4x the MMA side's store
# instructions a tile, while the tensor cores wait in the cooperative form). Same values.
NVMMA_HANDOFF = True
# Bounds for benchmarks only (``benchmarks/gluon_gemm_bounds.py``; read at each call): 0 the
# GEMM; 1 the epilogue takes each tile's accumulators and frees the buffer without reading
# it or writing ``out`` (the main loop and the handoff; an addend's TMA load still runs);
# 2 no handoff either (the main loop alone); 3 the whole epilogue with its stores
# predicated off at run time (what the stores cost); 4 the epilogue's math and stores on
# stand-in values (each element its own, so no math folds away) in place of the handoff
# buffer, which it does not read. 4 is not a bound: making the stand-ins costs integer work
# an element, and on v54's H100 it ran slower than 0. Under 1, 2 and 3 ``out`` is not
# written; under 4 it gets values unrelated to the product.
DIAGNOSTIC = 0
# How a cooperative kernel's MMA warpgroups hand a tile over (read at each call): True, in
# column halves, each half its own n128 accumulator: the first half is stored while the
# second's last wgmmas run; False, the whole 64 x 256 accumulator once its wgmmas have
# drained. Same values. (Overlapping the second half's store with the next tile's first
# wgmmas, an accumulator in flight across the tile loop, makes ptxas serialize every wgmma:
# C7514/C7515.) Off (``engine/fused/NOTES.md`` v54): FFN1 alone -1.7 to -3.3%, but the
# settled pass ran at a lower clock with it and lost 0.4% (two runs on an H100).
SPLIT_HANDOFF = False
SMEM_PER_PROGRAM = 227 * 1024  # sm_90's largest dynamic shared memory a block
WORKER_REGS: dict[str, int] = {"LOAD_REGS": 40, "MMA_REGS": 168}
SQRT_2_OVER_PI: gl.constexpr = gl.constexpr(0.7978845608028654)
GELU_CUBIC: gl.constexpr = gl.constexpr(0.7978845608028654 * 0.044715)


@gluon.jit
def _tile_origin(tile, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row-major tiles: (first row, first column) of output tile ``tile``."""
    n_tiles_n = gl.cdiv(N, BLOCK_N)
    return (tile // n_tiles_n) * BLOCK_M, (tile % n_tiles_n) * BLOCK_N


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K):
    """One warp: every K-block of every tile of this program, in order, into the ring."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    n_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    count = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_origin(tile, N, BLOCK_M, BLOCK_N)
        for k in range(k_steps):
            s = count % STAGES
            # a slot starts empty: the first pass waits on the phase before phase 0
            mbarrier.wait(empty.index(s), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma_load(a_desc, [off_m, k * BLOCK_K], bar, a_bufs.index(s))
            tma_load(b_desc, [off_n, k * BLOCK_K], bar, b_bufs.index(s))
            count += 1


@gluon.jit
def _mma(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr, ws_ptr,
         M, N, K, DIAG: gl.constexpr, WG: gl.constexpr):
    """One warpgroup's K loops, each tile's accumulators stored to buffer ``WG`` once the
    epilogue has freed it (float32 as they are, or fp16 after the operands' scales when the
    buffers are fp16).

    Ping-pong (the buffers as tall as a ring slot's A block): the tiles ``WG``, ``WG + 2``,
    ... of this program's sequence. The two warpgroups take turns at the ring (``turn``:
    warpgroup 0 starts, each hands the turn over once it has waited for its tile's last
    K-block): a "ready" barrier's wait is by phase parity, so a warpgroup that waited for a
    K-block two ring passes ahead of the loader would take an older load for it.
    Cooperative (buffers half as tall): every tile, this warpgroup's half of its rows
    against the whole B block, each slot freed by both warpgroups."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    TILE_M: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
    ROWS: gl.constexpr = acc_bufs.type.shape[1]
    COOP: gl.constexpr = ROWS < TILE_M
    SCALED: gl.constexpr = acc_bufs.dtype == gl.float16
    if SCALED:  # fp16 buffers get the scaled products (float32: the epilogue scales)
        ab_scale = gl.load(xs_ptr) * gl.load(ws_ptr)
    acc_dtype: gl.constexpr = gl.int32 if a_bufs.dtype == gl.int8 else gl.float32
    # n128 instructions (two for 256 columns): an n256 one needs 154 registers, and ptxas
    # holds the whole kernel to the launch's 128 (16 warps), whatever setmaxnreg gives
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 128, 32])
    n_tiles = gl.cdiv(M, TILE_M) * gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    programs = gl.num_programs(0)
    first = gl.program_id(0) if COOP else gl.program_id(0) + WG * programs
    buf = acc_bufs.index(WG)
    handed = 0
    for _tile in range(first, n_tiles, programs if COOP else 2 * programs):
        base = (handed if COOP else 2 * handed + WG) * k_steps  # the tile's first count
        acc = gl.zeros([ROWS, BLOCK_N], acc_dtype, mma)
        if not COOP:
            mbarrier.wait(turn.index(WG), (handed & 1) ^ (1 - WG))
        for k in range(k_steps):
            count = base + k
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            a = a_bufs.index(s)
            if COOP:
                a = a.slice(WG * ROWS, ROWS, dim=0)
            acc = warpgroup_mma(a, b_bufs.index(s).permute((1, 0)), acc, use_acc=k > 0,
                                is_async=True)
            # the previous block's wgmma is done: its slot goes back to the loader
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
        if not COOP:
            mbarrier.arrive(turn.index(1 - WG))
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((base + k_steps - 1) % STAGES))
        if DIAG != 2:
            mbarrier.wait(acc_empty.index(WG), (handed & 1) ^ 1)
        if DIAG != 2 or M < 0:  # (DIAG 2: never, but the wgmmas must have a use)
            if SCALED:
                buf.store((acc.to(gl.float32) * ab_scale).to(gl.float16))
            else:
                buf.store(acc.to(gl.float32))
        if DIAG != 2:
            cta_barrier()
            mbarrier.arrive(acc_ready.index(WG))
        handed += 1  # noqa: SIM113 (no enumerate in Gluon)


@gluon.jit
def _store_half(buf, acc, ab_scale, col0: gl.constexpr, SCALED: gl.constexpr):
    """One column half of a warpgroup's accumulators into its handoff buffer."""
    half = buf.slice(col0, acc.type.shape[1], dim=1)
    if SCALED:
        half.store((acc.to(gl.float32) * ab_scale).to(gl.float16))
    else:
        half.store(acc.to(gl.float32))


@gluon.jit
def _mma_split(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, xs_ptr, ws_ptr,
               M, N, K, DIAG: gl.constexpr, WG: gl.constexpr):
    """A cooperative warpgroup's K loops with two n128 accumulators, the tile's column
    halves (:data:`SPLIT_HANDOFF`): each K-block's first-half wgmmas, then its second's; at
    the tile's end the first half is stored while the second's last wgmmas run. A block's
    slot goes back once both halves' wgmmas on it are done."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
    HALF: gl.constexpr = BLOCK_N // 2
    ROWS: gl.constexpr = acc_bufs.type.shape[1]
    SCALED: gl.constexpr = acc_bufs.dtype == gl.float16
    ab_scale = 1.0
    if SCALED:
        ab_scale = gl.load(xs_ptr) * gl.load(ws_ptr)
    acc_dtype: gl.constexpr = gl.int32 if a_bufs.dtype == gl.int8 else gl.float32
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 128, 32])
    n_tiles = gl.cdiv(M, a_bufs.type.shape[1]) * gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    buf = acc_bufs.index(WG)
    handed = 0
    for _tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        base = handed * k_steps  # the tile's first count
        acc0 = gl.zeros([ROWS, HALF], acc_dtype, mma)
        acc1 = gl.zeros([ROWS, HALF], acc_dtype, mma)
        for k in range(k_steps):
            count = base + k
            s = count % STAGES
            mbarrier.wait(ready.index(s), (count // STAGES) & 1)
            a = a_bufs.index(s).slice(WG * ROWS, ROWS, dim=0)
            b = b_bufs.index(s)
            acc0 = warpgroup_mma(a, b.slice(0, HALF, dim=0).permute((1, 0)), acc0,
                                 use_acc=k > 0, is_async=True)
            acc1 = warpgroup_mma(a, b.slice(HALF, HALF, dim=0).permute((1, 0)), acc1,
                                 use_acc=k > 0, is_async=True)
            # the previous block's wgmmas are done: its slot goes back to the loader
            acc0, acc1 = warpgroup_mma_wait(2, deps=(acc0, acc1))
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=k > 0)
        acc0, acc1 = warpgroup_mma_wait(1, deps=(acc0, acc1))  # the first half is done
        if DIAG != 2:
            mbarrier.wait(acc_empty.index(WG), (handed & 1) ^ 1)
        if DIAG != 2 or M < 0:  # (DIAG 2: never, but the wgmmas must have a use)
            _store_half(buf, acc0, ab_scale, 0, SCALED)
        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
        mbarrier.arrive(empty.index((base + k_steps - 1) % STAGES))
        if DIAG != 2 or M < 0:
            _store_half(buf, acc1, ab_scale, HALF, SCALED)
        if DIAG != 2:
            cta_barrier()
            mbarrier.arrive(acc_ready.index(WG))
        handed += 1  # noqa: SIM113 (no enumerate in Gluon)


@gluon.jit
def _mma0(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr, ws_ptr,
          M, N, K, DIAG: gl.constexpr):
    _mma(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr, ws_ptr, M,
         N, K, DIAG, 0)


@gluon.jit
def _mma1(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr, ws_ptr,
          M, N, K, DIAG: gl.constexpr):
    _mma(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr, ws_ptr, M,
         N, K, DIAG, 1)


@gluon.jit
def _mma_split0(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, xs_ptr, ws_ptr,
                M, N, K, DIAG: gl.constexpr):
    _mma_split(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, xs_ptr, ws_ptr,
               M, N, K, DIAG, 0)


@gluon.jit
def _mma_split1(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, xs_ptr, ws_ptr,
                M, N, K, DIAG: gl.constexpr):
    _mma_split(a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, xs_ptr, ws_ptr,
               M, N, K, DIAG, 1)


@gluon.jit
def _gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh by one ``MUFU.TANH``."""
    u = x * (x * x * GELU_CUBIC + SQRT_2_OVER_PI)
    t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [u], dtype=gl.float32,
                                  is_pure=True, pack=1)
    half_x = 0.5 * x
    return half_x + half_x * t


@gluon.jit
def _epilogue(acc_bufs, acc_ready, acc_empty, add_desc, add_buf, add_bar, bias_ptr, cs_ptr,
              xs_ptr, ws_ptr, hinv_ptr, add_ptr, out_ptr, M, N, TILE_M: gl.constexpr,
              SUB_M: gl.constexpr, GELU: gl.constexpr, BIAS: gl.constexpr,
              COL_SCALE: gl.constexpr, ADD: gl.constexpr, ADD_TMA: gl.constexpr,
              DIAG: gl.constexpr, num_warps: gl.constexpr):
    """The default partition: each tile this program owns, in order, to rows of ``out``
    (e4m3 scaled by ``h_inv``, or 16-bit, plus the [M, N] addend at ``add_ptr`` with
    ``ADD``: each element read before it is written, so ``out`` may be the addend) in
    ``SUB_M``-row chunks: from one buffer (alternating) in a ping-pong kernel, from both
    (the top and bottom rows) in a cooperative one. ``ADD_TMA``: the tile's addend comes
    into ``add_buf`` by one TMA load (``add_desc``'s box is the tile) issued before the
    wait for its accumulators; else each chunk loads its rows of it. ``DIAG``: see
    :data:`DIAGNOSTIC`."""
    ROWS: gl.constexpr = acc_bufs.type.shape[1]
    BLOCK_N: gl.constexpr = acc_bufs.type.shape[2]
    COOP: gl.constexpr = ROWS < TILE_M
    epi: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16],
                                         threads_per_warp=[32 // (BLOCK_N // 16), BLOCK_N // 16],
                                         warps_per_cta=[num_warps, 1], order=[1, 0])
    # fp16 buffers hold the scaled products already
    ab_scale = 1.0 if acc_bufs.dtype == gl.float16 else gl.load(xs_ptr) * gl.load(ws_ptr)
    OUT8: gl.constexpr = out_ptr.dtype.element_ty == gl.float8e4nv
    if OUT8:
        h_inv = gl.load(hinv_ptr)
    n_tiles = gl.cdiv(M, TILE_M) * gl.cdiv(N, BLOCK_N)
    rows0 = gl.arange(0, SUB_M, layout=gl.SliceLayout(1, epi))
    cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, epi))
    i = 0
    for tile in range(gl.program_id(0), n_tiles if DIAG != 2 else 0, gl.num_programs(0)):
        off_m, off_n = _tile_origin(tile, N, TILE_M, BLOCK_N)
        if ADD_TMA:  # rows past M arrive as zeros (and are not stored)
            mbarrier.expect(add_bar.index(0), add_desc.block_type.nbytes)
            tma_load(add_desc, [off_m, off_n], add_bar.index(0), add_buf)
        cols = off_n + cols0
        if BIAS:
            bias = gl.expand_dims(gl.load(bias_ptr + cols).to(gl.float32), 0)
        if COL_SCALE:
            col = gl.expand_dims(gl.load(cs_ptr + cols), 0)
        for h in gl.static_range(2 if COOP else 1):
            j = h if COOP else i % 2
            mbarrier.wait(acc_ready.index(j), (i & 1) if COOP else ((i // 2) & 1))
            if ADD_TMA and h == 0:
                mbarrier.wait(add_bar.index(0), i & 1)
            buf = acc_bufs.index(j)
            for r in gl.static_range(ROWS // SUB_M if DIAG != 1 else 0):
                rows = off_m + h * ROWS + r * SUB_M + rows0
                if DIAG == 4:  # (a value an element: no row shares another's math)
                    x = (gl.expand_dims(rows % 64, 1) * BLOCK_N
                         + gl.expand_dims(cols0, 0)).to(gl.float32) * 1e-4
                else:
                    x = buf.slice(r * SUB_M, SUB_M, dim=0).load(epi).to(gl.float32)
                x = x * ab_scale
                if COL_SCALE:
                    x = x * col
                if BIAS:
                    x = x + bias
                if GELU:
                    x = _gelu_tanh(x)
                offs = gl.expand_dims(rows.to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
                ptrs = out_ptr + offs
                if ADD_TMA:
                    x = x + add_buf.slice(h * ROWS + r * SUB_M, SUB_M, dim=0).load(epi).to(
                        gl.float32)
                elif ADD:
                    x = x + gl.load(add_ptr + offs, mask=gl.expand_dims(rows < M, 1)).to(
                        gl.float32)
                if OUT8:
                    x = x * h_inv
                keep = gl.expand_dims(rows < M, 1)
                if DIAG == 3:
                    keep = keep & (M < 0)
                gl.store(ptrs, x.to(out_ptr.dtype.element_ty), mask=keep)
            if ADD_TMA:  # each thread's reads of the addend ordered before the next TMA write
                fence_async_shared()
            cta_barrier()
            mbarrier.arrive(acc_empty.index(j))
        i += 1  # noqa: SIM113 (no enumerate in Gluon)


@gluon.jit
def _gemm_kernel(a_desc, b_desc, add_desc, bias_ptr, cs_ptr, xs_ptr, ws_ptr, hinv_ptr,
                 add_ptr, out_ptr, M, N, K, STAGES: gl.constexpr, SUB_M: gl.constexpr,
                 GELU: gl.constexpr, BIAS: gl.constexpr, COL_SCALE: gl.constexpr,
                 ADD: gl.constexpr, ADD_TMA: gl.constexpr, ACC16: gl.constexpr,
                 NVMMA_ACC: gl.constexpr, DIAG: gl.constexpr, SPLIT: gl.constexpr,
                 COOP: gl.constexpr, LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr,
                 num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(COOP or not SPLIT, "the split handoff is for cooperative tiles")
    ROWS: gl.constexpr = BLOCK_M // 2 if COOP else BLOCK_M  # a warpgroup's accumulator rows
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    acc_dtype: gl.constexpr = gl.float16 if ACC16 else gl.float32
    # NVMMA_ACC: the wgmma layout's own swizzle (stmatrix stores, 16-byte loads)
    acc_layout: gl.constexpr = (
        gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16 if ACC16 else 32,
                             rank=2) if NVMMA_ACC
        else gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))
    acc_bufs = gl.allocate_shared_memory(acc_dtype, [2, ROWS, BLOCK_N], acc_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    acc_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # the ring's turn (ping-pong only; a cooperative kernel's never waits on it)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # the addend's tile (``ADD_TMA``; else a stand-in argument the epilogue never reads)
    if ADD_TMA:
        add_buf = gl.allocate_shared_memory(add_desc.dtype, [BLOCK_M, BLOCK_N],
                                            add_desc.layout)
    else:
        add_buf = acc_bufs
    add_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(add_bar.index(0), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2 if COOP else 1)
    for j in gl.static_range(2):
        mbarrier.init(acc_ready.index(j), count=1)
        mbarrier.init(acc_empty.index(j), count=1)
        if not COOP:
            mbarrier.init(turn.index(j), count=1)
    # the initialized barriers visible to the TMA unit (the async proxy) and to every
    # partition before any of them starts
    fence_async_shared()
    cta_barrier()
    # The MMA partitions are chosen here, on the kernel's own constexpr, and every argument
    # tuple is written out in its call: a constexpr inside a tuple bound to a name arrives
    # in the partition as a run-time value (an ``if`` on it traces both branches).
    if SPLIT:
        gl.warp_specialize([
            (_epilogue, (acc_bufs, acc_ready, acc_empty, add_desc, add_buf, add_bar, bias_ptr,
                         cs_ptr, xs_ptr, ws_ptr, hinv_ptr, add_ptr, out_ptr, M, N, BLOCK_M,
                         SUB_M, GELU, BIAS, COL_SCALE, ADD, ADD_TMA, DIAG, num_warps)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K)),
            (_mma_split0, (a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty,
                           xs_ptr, ws_ptr, M, N, K, DIAG)),
            (_mma_split1, (a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty,
                           xs_ptr, ws_ptr, M, N, K, DIAG)),
        ], [1, 4, 4], [LOAD_REGS, MMA_REGS, MMA_REGS])
    else:
        gl.warp_specialize([
            (_epilogue, (acc_bufs, acc_ready, acc_empty, add_desc, add_buf, add_bar, bias_ptr,
                         cs_ptr, xs_ptr, ws_ptr, hinv_ptr, add_ptr, out_ptr, M, N, BLOCK_M,
                         SUB_M, GELU, BIAS, COL_SCALE, ADD, ADD_TMA, DIAG, num_warps)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K)),
            (_mma0, (a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr,
                     ws_ptr, M, N, K, DIAG)),
            (_mma1, (a_bufs, b_bufs, ready, empty, acc_bufs, acc_ready, acc_empty, turn, xs_ptr,
                     ws_ptr, M, N, K, DIAG)),
        ], [1, 4, 4], [LOAD_REGS, MMA_REGS, MMA_REGS])


GL_TYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.int8: gl.int8}  # the operands'
ADDEND_TYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def descriptors(xq: torch.Tensor, w8: torch.Tensor, block_k: int,
                block_n: int) -> tuple[Any, Any]:
    """TMA descriptors of ``BLOCK_M`` x ``block_k`` activation and ``block_n`` x
    ``block_k`` weight boxes (e4m3 or int8, K contiguous: wgmma's K-major operands; the
    activation's rows may be strided)."""
    kind = GL_TYPES[xq.dtype]
    a_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, block_k], kind)
    b_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], kind)
    return (TensorDescriptor.from_tensor(xq, [BLOCK_M, block_k], a_layout),
            TensorDescriptor.from_tensor(w8, [block_n, block_k], b_layout))


def addend_descriptor(addend: torch.Tensor, block_n: int) -> Any:
    """The TMA descriptor of a 16-bit [M, N] addend in output tiles (``BLOCK_M`` x
    ``block_n`` boxes): what the epilogue loads under :data:`ADD_BY_TMA`."""
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, block_n],
                                                  ADDEND_TYPES[addend.dtype])
    return TensorDescriptor.from_tensor(addend, [BLOCK_M, block_n], layout)


def tma_addend_fits(config: tuple[int, int, int, int], acc16: int, operand_bytes: int = 1,
                    slack: int = 2048) -> bool:
    """Whether a launch of ``config`` has room for the addend's tile in shared memory
    beside its ring and accumulator buffers (``slack`` for barriers and alignment): e.g.
    the out-projection's ping-pong (4, 128, 32, 128) (224 KB with it) and the cooperative
    (4, 64, 32, 256), not FFN1's cooperative (3, 128, 32, 256)."""
    stages, block_k, _, block_n = config
    rows = BLOCK_M if block_n <= 128 else BLOCK_M // 2
    ring = stages * (BLOCK_M + block_n) * block_k * operand_bytes
    accumulators = 2 * rows * block_n * (2 if acc16 else 4)
    return ring + accumulators + BLOCK_M * block_n * 2 + slack <= SMEM_PER_PROGRAM


def supports(xq: torch.Tensor, w8: torch.Tensor,
             config: tuple[int, int, int, int] | None = None) -> bool:
    """Whether :func:`gemm` takes these operands with ``config`` (:data:`CONFIG` by
    default): a Hopper GPU (sm_90: wgmma and TMA), both e4m3 or both int8, K contiguous
    (the activation's rows may be strided, 16-byte aligned), N and K multiples of the
    tile."""
    _, block_k, _, block_n = config or CONFIG
    return (xq.is_cuda and torch.cuda.get_device_capability(xq.device) == (9, 0)
            and xq.dtype == w8.dtype and xq.dtype in GL_TYPES and xq.dim() == 2
            and xq.stride(1) == 1 and xq.stride(0) % 16 == 0
            and xq.data_ptr() % 16 == 0 and w8.data_ptr() % 16 == 0
            and w8.is_contiguous() and w8.shape[0] % block_n == 0
            and xq.shape[1] == w8.shape[1] and xq.shape[1] % block_k == 0)


def gemm(xq: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
         out: torch.Tensor, *, bias: torch.Tensor | None = None,
         col_scale: torch.Tensor | None = None, out_scale: torch.Tensor | None = None,
         gelu: int = 0, config: tuple[int, int, int, int] | None = None, acc16: int = 1,
         programs: int = 0, addend: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` [M, N] = ``cast(out_scale * act(x_scale * w_scale * col_scale * xq w8^T +
    bias))`` (the module docstring's form): ``xq`` [M, K] and ``w8`` [N, K] both e4m3 or
    both int8, ``x_scale`` and ``w_scale`` float32 [1] device tensors (``w_scale`` the
    largest per-channel scale where ``col_scale`` [N] holds each over it:
    ``engine.fused.int8.column_scales``), ``bias`` [N] or None, ``act`` tanh-GELU when ``gelu``;
    ``out`` e4m3 (then ``out_scale`` [1] is required) or 16-bit; ``addend`` (a contiguous
    16-bit [M, N] tensor, which may be ``out`` itself) is added last, before the cast (a
    GEMM that adds its residual; read as :data:`ADD_BY_TMA` says, where
    :func:`tma_addend_fits`). ``programs`` persistent
    programs (0: one an SM); ``acc16`` 0 hands the accumulators over as float32 (3 ring
    slots at most). ``config``: (ring slots, K-block, epilogue chunk rows, tile columns),
    :data:`CONFIG` by default; 128 tile columns run ping-pong warpgroups on 128 x 128
    tiles, 256 cooperative ones on 128 x 256 tiles (64 x 256 each)."""
    stages, block_k, sub_m, block_n = config or CONFIG
    m, k = xq.shape
    n = w8.shape[0]
    if n % block_n or k % block_k:
        raise ValueError(f"N ({n}) must be a multiple of {block_n}, K ({k}) of {block_k}")
    if w8.shape[1] != k or w8.dtype != xq.dtype:
        raise ValueError(f"w8 must be [N, {k}] of {xq.dtype}, got {list(w8.shape)} of "
                         f"{w8.dtype}")
    for name, vec in (("bias", bias), ("col_scale", col_scale)):
        if vec is not None and vec.shape != (n,):
            raise ValueError(f"{name} must be [{n}], got {list(vec.shape)}")
    if out.shape != (m, n) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{m}, {n}] tensor")
    if out.dtype == torch.float8_e4m3fn and out_scale is None:
        raise ValueError("an e4m3 output needs out_scale")
    if addend is not None and (addend.shape != (m, n) or not addend.is_contiguous()
                               or addend.dtype not in (torch.float16, torch.bfloat16)):
        raise ValueError(f"addend must be a contiguous 16-bit [{m}, {n}] tensor")
    a_desc, b_desc = descriptors(xq, w8, block_k, block_n)
    add_tma = (addend is not None and ADD_BY_TMA
               and tma_addend_fits((stages, block_k, sub_m, block_n), acc16))
    tiles = triton.cdiv(m, BLOCK_M) * (n // block_n)
    grid = (max(1, min(programs or multiprocessors(xq.device), tiles)), )
    unused = x_scale  # a pointer the kernel never reads where its constexpr is off
    _gemm_kernel[grid](a_desc, b_desc,
                       addend_descriptor(addend, block_n) if add_tma else a_desc,  # type: ignore[arg-type]
                       unused if bias is None else bias,
                       unused if col_scale is None else col_scale, x_scale, w_scale,
                       unused if out_scale is None else out_scale,
                       out if addend is None else addend, out, m, n, k,
                       STAGES=stages, SUB_M=sub_m, GELU=gelu, BIAS=bias is not None,
                       COL_SCALE=col_scale is not None, ADD=addend is not None,
                       ADD_TMA=add_tma, ACC16=acc16, NVMMA_ACC=NVMMA_HANDOFF,
                       DIAG=DIAGNOSTIC, SPLIT=SPLIT_HANDOFF and block_n > 128,
                       COOP=block_n > 128,
                       **WORKER_REGS, **LAUNCH)
    return out


def ffn1(xq: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
         b1: torch.Tensor, h_inv: torch.Tensor, out: torch.Tensor | None = None,
         config: tuple[int, int, int, int] | None = None, gelu: int = 1, acc16: int = 1,
         programs: int = 0) -> torch.Tensor:
    """e4m3 [M, N] = e4m3(h_inv * GELU_tanh(x_scale * w_scale * xq w8^T + b1)): the
    calibrated FFN1 (``xq`` e4m3 [M, K], ``w8`` e4m3 [N, K], ``b1`` [N], the scales
    float32 [1] device tensors) through :func:`gemm`. ``gelu`` 0 is a diagnostic (bias
    only: not FFN1's output)."""
    if out is None:
        out = torch.empty((xq.shape[0], w8.shape[0]), device=xq.device, dtype=xq.dtype)
    return gemm(xq, x_scale, w8, w_scale, out, bias=b1, out_scale=h_inv, gelu=gelu,
                config=config, acc16=acc16, programs=programs)
