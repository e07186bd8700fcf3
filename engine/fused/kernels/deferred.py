# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""GEMMs that take a LayerNorm's place: the small-batch path with no LayerNorm kernels.

A residual LayerNorm is a kernel of its own because it needs whole rows, and at batch 1
every kernel costs a dependent-kernel handoff (about 2 us on the H200). Two of a layer's
seven kernels are LayerNorms; here they are gone, their work split between the GEMMs
around them (the algebra and the weights are in ``engine.fused.folding``):

* **before the LayerNorm** the GEMM leaves the *un-normalised* rows ``z`` and adds each
  row's sum and sum of squares into a statistics vector (float32 atomics). The
  attention-output GEMM stores ``y = ctx @ Wo^T + bo + x`` whole (no split-K) and sums
  its tile's part of each row. FFN2 splits K and adds its products into a float32 ``z``
  (zeroed earlier in the layer) with vector atomics; the program that finishes a tile
  last (a per-tile counter) reads the finished tile back, stores its model-dtype copy and
  sums it;
* **the GEMM after it** reads the un-normalised rows as its A operand and applies
  ``LN(x) @ W^T = r * (x @ W'^T - mean * u) + W beta`` in its epilogue (``W' = W
  diag(gamma)``, ``u`` its row sums), mean and ``r = 1/std`` from the statistics;
* **the residual** ``LN(x)``, which the next sum needs, is rebuilt in the epilogue of
  the GEMM that adds it, from ``x`` and the same statistics.

Per layer: QKV (folded LN2 of the layer before; zeroes this layer's scratch), attention,
out-proj (+ bias + LN2(z_prev) residual), FFN1 (folded LN1, + bias + GELU), FFN2 (split-K
atomics + bias + LN1(y) residual): five kernels instead of seven. The last layer's LN2
runs with the QA head (:func:`layernorm_qa`). Launched with PDL like the rest of the
small-batch path (``common``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from engine.fused.kernels.common import (
    gelu,
    launch_options,
    layernorm_rows,
    load_vector,
    pdl_enter,
    pdl_release,
    prefetch_l1,
    prefetch_rows_l2,
    to_e4m3,
)
from engine.fused.kernels.matmul import (
    LOADS_POINTER,
    GemmConfig,
    check_k_split,
    grouped_tile,
    most_splits,
    small_batch_plan,
    tile_product,
    unpack_config,
)
from engine.fused.kernels.rows import (
    _CU_BLOCK,
    _STAGED,
    _row_tile,
    embed_rows,
    qa_head_rows,
    row_block,
    stage_cu,
    staging_args,
)
from engine.fused.kernels.timeline import record, stamp, trace_slot

_ZERO_BLOCK = tl.constexpr(1024)  # float32 elements a program zeroes per step

# A launch with ``early`` weights (see :func:`folded_linear`) holds its weight slice and
# its activation chunks in shared memory at once: at most this many BLOCK_K chunks, in
# tiles of 64 rows (``wgmma``; 32-row tiles spilled 106 registers), and this many bytes of
# both (96 KB: BERT-base's e4m3 slices of 768 at 128 tokens, 48 KB each; 16-bit ones, 96 KB
# each, left the previous kernel's programs no room: BERT-base fp16 1x128 +12%, H200,
# 2026-12-01).
_EARLY_CHUNKS = 6
_EARLY_BYTES = 96 * 1024
# Early weight slices through the tensor-memory accelerator (a TMA descriptor of the
# weight, ``cp.async.bulk.tensor`` into shared memory) instead of loads through the
# registers: the early program then issues a few instructions before its wait, not a
# slice's worth of loads and shared-memory stores on a multiprocessor where the launch
# before it still works. Programs beside the next launch's early ones ran 0.35-0.4 us
# longer (H200, 2026-12-01, NOTES v31); TMA did not take that away (graph replay,
# ``benchmarks/early_tma_sweep.sh``, v32): BERT-base FP8 1x128 0.2504 -> 0.2500 ms, within
# the rounds' spread; MiniLM fp16 1x128 0.1044 -> 0.1057. So it is off.
EARLY_TMA = False


@triton.jit
def row_moments(stats_ptr, offs_m, M, D, eps):
    """(mean, 1/std) of rows ``offs_m`` from their (sum, sum of squares) over ``D``."""
    rmask = offs_m < M
    s1 = tl.load(stats_ptr + 2 * offs_m, mask=rmask, other=0.0, cache_modifier=".cg")
    s2 = tl.load(stats_ptr + 2 * offs_m + 1, mask=rmask, other=0.0, cache_modifier=".cg")
    mean = s1 / D
    rstd = 1.0 / tl.sqrt(tl.maximum(s2 / D - mean * mean, 0.0) + eps)
    return mean, rstd


@triton.jit
def add_row_sums(stats_ptr, v, offs_m, rmask):
    """Add each row's sum and sum of squares of tile ``v`` (0 where masked) into stats."""
    tl.atomic_add(stats_ptr + 2 * offs_m, tl.sum(v, axis=1), mask=rmask, sem="relaxed")
    tl.atomic_add(stats_ptr + 2 * offs_m + 1, tl.sum(v * v, axis=1), mask=rmask, sem="relaxed")


@triton.jit
def ln_rebuild(res_ptr, stats_ptr, g_ptr, b_ptr, offs_m, offs_n, M, N, eps, rows_on):
    """float32 tile ``LN(res)[offs_m, offs_n]`` from the rows' statistics, 0 in rows from
    ``rows_on`` (<= M) on."""
    rmask = offs_m < rows_on
    nmask = offs_n < N
    mask = rmask[:, None] & nmask[None, :]
    x = tl.load(res_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], mask=mask,
                other=0.0, cache_modifier=".cg").to(tl.float32)
    mean, rstd = row_moments(stats_ptr, offs_m, M, N, eps)
    g = load_vector(g_ptr, offs_n, nmask)
    b = load_vector(b_ptr, offs_n, nmask)
    return tl.where(mask, (x - mean[:, None]) * rstd[:, None] * g[None, :] + b[None, :], 0.0)


@triton.jit
def zero_share(zero_ptr, zero_numel, pid, split):
    """This program's share of zeroing ``zero_ptr[:zero_numel]`` (float32)."""
    programs = tl.num_programs(0) * tl.num_programs(1)
    lin = split * tl.num_programs(0) + pid
    for start in range(lin * _ZERO_BLOCK, zero_numel, programs * _ZERO_BLOCK):
        offs = start + tl.arange(0, _ZERO_BLOCK)
        tl.store(zero_ptr + offs, tl.zeros([_ZERO_BLOCK], tl.float32), mask=offs < zero_numel)


@triton.jit
def epilogue_addend(bias_ptr, res_ptr, stats_ptr, g_ptr, b_ptr, offs_m, offs_n, M, N, eps,
                    lead, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """float32 tile of what the epilogue adds: bias and LN(residual), times ``lead``."""
    add = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if HAS_BIAS:
        add += load_vector(bias_ptr, offs_n, offs_n < N)[None, :] * lead
    if RESIDUAL:
        add += ln_rebuild(res_ptr, stats_ptr, g_ptr, b_ptr, offs_m, offs_n, M, N, eps, M * lead)
    return add


@triton.jit
def _chunks(ptrs, NCH: tl.constexpr, BLOCK_K: tl.constexpr, CG: tl.constexpr):
    """The ``NCH`` (1-6) BLOCK_K-wide chunks of a K slice at ``ptrs``, all loads issued
    before any is used; past ``NCH`` the first chunk stands in (never multiplied)."""
    tl.static_assert(NCH >= 1 and NCH <= 6, "a K slice of 1 to 6 chunks")
    c0 = _chunk(ptrs, 0, NCH, BLOCK_K, None, CG)
    return (c0, _chunk(ptrs, 1, NCH, BLOCK_K, c0, CG), _chunk(ptrs, 2, NCH, BLOCK_K, c0, CG),
            _chunk(ptrs, 3, NCH, BLOCK_K, c0, CG), _chunk(ptrs, 4, NCH, BLOCK_K, c0, CG),
            _chunk(ptrs, 5, NCH, BLOCK_K, c0, CG))


@triton.jit
def _chunk(ptrs, i: tl.constexpr, NCH: tl.constexpr, BLOCK_K: tl.constexpr, first,
           CG: tl.constexpr):
    """Chunk ``i`` of a K slice (``first`` where the slice has no such chunk)."""
    if i >= NCH:
        c = first
    elif CG:
        c = tl.load(ptrs + i * BLOCK_K, cache_modifier=".cg")
    else:
        c = tl.load(ptrs + i * BLOCK_K)
    return c


@triton.jit
def _desc_chunks(desc, row, k0, NCH: tl.constexpr, BLOCK_K: tl.constexpr):
    """:func:`_chunks` of the [BLOCK_N, BLOCK_K] boxes of TMA descriptor ``desc`` at
    ``row``, columns ``k0 + i * BLOCK_K``."""
    tl.static_assert(NCH >= 1 and NCH <= 6, "a K slice of 1 to 6 chunks")
    c0 = desc.load([row, k0])
    return (c0, _desc_chunk(desc, row, k0, 1, NCH, BLOCK_K, c0),
            _desc_chunk(desc, row, k0, 2, NCH, BLOCK_K, c0),
            _desc_chunk(desc, row, k0, 3, NCH, BLOCK_K, c0),
            _desc_chunk(desc, row, k0, 4, NCH, BLOCK_K, c0),
            _desc_chunk(desc, row, k0, 5, NCH, BLOCK_K, c0))


@triton.jit
def _desc_chunk(desc, row, k0, i: tl.constexpr, NCH: tl.constexpr, BLOCK_K: tl.constexpr,
                first):
    """Box ``i`` of a K slice (``first`` where the slice has no such chunk)."""
    if i >= NCH:  # noqa: SIM108 (a constexpr branch: no load for an absent chunk)
        c = first
    else:
        c = desc.load([row, k0 + i * BLOCK_K])
    return c


@triton.jit
def _chunk_dot(acc, a, b, i: tl.constexpr, NCH: tl.constexpr):
    if i < NCH:
        acc = tl.dot(a, tl.trans(b), acc)
    return acc


@triton.jit
def _deferred_gemm_kernel(
    x_ptr, w_ptr, u_ptr, bias_ptr, out_ptr, out16_ptr, stats_ptr, stats_out_ptr, cnt_ptr,
    res_ptr, res_g_ptr, res_b_ptr, zero_ptr, scale_ptr, out8_ptr, inv8_ptr,
    M, N, K, k_split, zero_numel, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, FOLD_LN: tl.constexpr, GELU: tl.constexpr, TANH: tl.constexpr,
    HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, ATOMIC: tl.constexpr,
    STATS_OUT: tl.constexpr, ZERO: tl.constexpr, USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr, W_BYTES: tl.constexpr, LATE_RELEASE: tl.constexpr,
    SCALED: tl.constexpr, Q_OUT: tl.constexpr, COPY8: tl.constexpr,
    EARLY: tl.constexpr, NCH: tl.constexpr, trace_ptr, TRACE: tl.constexpr,
    w_desc, W_TMA: tl.constexpr, SETTLED: tl.constexpr,
):
    """Output tile of ``x @ w^T`` over K slice ``program_id(1)``, then:

    * ``SCALED``: ``x`` and ``w`` are e4m3 and the product is multiplied by
      ``scale_ptr[0]`` (both operands' scales);
    * ``FOLD_LN``: ``r * (acc - mean * u)``, the rows' moments from ``stats_ptr``;
    * ``HAS_BIAS`` / ``RESIDUAL`` (+ bias, + LN(res) with the moments of ``stats_ptr``;
      with ``ATOMIC`` in K slice 0 only), then ``GELU``;
    * ``ATOMIC``: add into float32 ``out``; with ``STATS_OUT`` the tile's last program
      (counter ``cnt_ptr[tile]``) then reads the finished tile, stores it in ``out16``'s
      dtype and adds its row sums into ``stats_out``. Without ``ATOMIC``: store in
      ``out``'s dtype (``Q_OUT``: e4m3, times ``inv8_ptr[0]``), and with ``STATS_OUT``
      add the stored values' row sums;
    * ``COPY8``: also store the result (the finished tile with ``ATOMIC``) in e4m3 times
      ``inv8_ptr[0]`` into ``out8``: the next GEMM's FP8 operand;
    * ``ZERO``: then the programs zero ``zero_ptr[:zero_numel]`` (float32) between them;
    * ``TRACE``: each program writes its timeline row (``kernels.timeline``).

    With ``USE_PDL`` the next kernel may launch right after the wait, or with
    ``LATE_RELEASE`` after the K loop (or the products). ``EARLY``: the weight slice is
    loaded whole, in ``NCH`` chunks of ``BLOCK_K`` (triton stores them in shared memory)
    before the wait, and after it every activation chunk is loaded at once, then
    multiplied: no K loop, and no weight bytes between the wait and the product. (The
    weights' L2 prefetch is still issued first, as measured; without it is unmeasured.)
    ``W_TMA`` (with ``EARLY``): the slice's chunks come through ``w_desc``, a TMA
    descriptor of ``w`` in [BLOCK_N, BLOCK_K] boxes, straight into shared memory.
    ``SETTLED`` (with ``RESIDUAL``): the residual and its moments were written two or more
    launches back, so the program builds its addend (bias and LN(residual)) before its
    wait, which the launch in between waited for (each program's wait comes before its
    release): the deferred layer's out-projection (the residual from the previous FFN2,
    attention and QKV between) and FFN2 (from the out-projection, FFN1 between).

    Everything the epilogue reads is loaded after the K loop, but for the FP8 scalars (in
    the prologue: after the loop each was a dependent load in FFN2's way, +1.2 us a layer,
    H200, 2026-12-01). Loading the bias and residual terms before it (to hide their
    latency) shortened the out-projection's step by 1 us but lengthened FFN1's and FFN2's
    by 2-3 us each: the whole pass ran 20% slower (H200, 2026-11-30); the rows'
    LayerNorm moments alone before the loop gained nothing (2026-12-01). Zeroing before
    or after the tile measured the same. ``SETTLED`` builds the addend before the wait
    instead: FFN2 -1.7 to -2.0% a pass, the out-projection +15-22% (``encoder``'s
    ``SETTLED_RESIDUAL_GEMMS``, H200, 2026-12-01).
    """
    started = stamp(TRACE)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k0 = split * k_split
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    if PREFETCH:  # weights and vectors never depend on earlier kernels
        prefetch_rows_l2(w_ptr + cols * K + k0, k_split * W_BYTES, [BLOCK_N])
        vec_at = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 16) * 16, N - 1)
        if HAS_BIAS:
            prefetch_l1(bias_ptr + vec_at)
        if FOLD_LN:
            prefetch_l1(u_ptr + vec_at)
        if RESIDUAL:
            prefetch_l1(res_g_ptr + vec_at)
            prefetch_l1(res_b_ptr + vec_at)
    # The FP8 scalars are constants too: loaded before the wait (see the docstring).
    scale = 1.0
    if SCALED:
        scale = tl.load(scale_ptr)
    inv8 = 1.0
    if Q_OUT or COPY8:
        inv8 = tl.load(inv8_ptr)
    if EARLY and W_TMA:  # the whole weight slice, bulk-copied before the wait
        b = _desc_chunks(w_desc, pid_n * BLOCK_N, k0, NCH, BLOCK_K)
    elif EARLY:  # the whole weight slice, loaded before the wait
        b = _chunks(w_ptr + cols[:, None] * K + k0 + tl.arange(0, BLOCK_K)[None, :], NCH,
                    BLOCK_K, False)
    rmask = offs_m < M
    nmask = offs_n < N
    lead = 1  # 1 where this program adds bias and residual (ATOMIC: K slice 0 only), else 0
    if ATOMIC:
        lead = (split == 0).to(tl.int32)
    if SETTLED:
        add = epilogue_addend(bias_ptr, res_ptr, stats_ptr, res_g_ptr, res_b_ptr, offs_m,
                              offs_n, M, N, eps, lead, HAS_BIAS, RESIDUAL, BLOCK_M, BLOCK_N)
    pdl_enter(USE_PDL, not LATE_RELEASE)
    waited = stamp(TRACE)
    if EARLY:  # every activation chunk in flight at once, then the products
        a = _chunks(x_ptr + tl.minimum(offs_m, M - 1).to(tl.int64)[:, None] * K + k0
                    + tl.arange(0, BLOCK_K)[None, :], NCH, BLOCK_K, True)
        acc = tl.dot(a[0], tl.trans(b[0]))
        acc = _chunk_dot(acc, a[1], b[1], 1, NCH)
        acc = _chunk_dot(acc, a[2], b[2], 2, NCH)
        acc = _chunk_dot(acc, a[3], b[3], 3, NCH)
        acc = _chunk_dot(acc, a[4], b[4], 4, NCH)
        acc = _chunk_dot(acc, a[5], b[5], 5, NCH)
    else:
        acc = tile_product(x_ptr, w_ptr, M, N, K, k0, k_split, offs_m, offs_n, BLOCK_M,
                           BLOCK_N, BLOCK_K)
    pdl_release(LATE_RELEASE)
    product = stamp(TRACE)
    if SCALED:
        acc *= scale
    omask = rmask[:, None] & nmask[None, :]
    o_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    y = acc
    if FOLD_LN:
        mean, rstd = row_moments(stats_ptr, offs_m, M, K, eps)
        u = load_vector(u_ptr, offs_n, nmask)
        y = rstd[:, None] * (acc - mean[:, None] * u[None, :])
    if not SETTLED:
        add = epilogue_addend(bias_ptr, res_ptr, stats_ptr, res_g_ptr, res_b_ptr, offs_m,
                              offs_n, M, N, eps, lead, HAS_BIAS, RESIDUAL, BLOCK_M, BLOCK_N)
    y += add
    if ATOMIC:
        epilogue = stamp(TRACE)
        counted = epilogue
        tl.atomic_add(out_ptr + o_offs, y, mask=omask, sem="relaxed")
        if STATS_OUT:
            tl.debug_barrier()  # every thread's adds happen before the counter's release
            done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            counted = stamp(TRACE)
            if done == tl.num_programs(1) - 1:  # the tile is complete: read it back
                z = tl.load(out_ptr + o_offs, mask=omask, other=0.0, cache_modifier=".cg")
                tl.store(out16_ptr + o_offs, z.to(out16_ptr.dtype.element_ty), mask=omask)
                if COPY8:
                    tl.store(out8_ptr + o_offs, to_e4m3(z * inv8), mask=omask)
                add_row_sums(stats_out_ptr, z, offs_m, rmask)
    else:
        if GELU:
            y = gelu(y, TANH)
        epilogue = stamp(TRACE)
        counted = epilogue
        if Q_OUT:
            tl.store(out_ptr + o_offs, to_e4m3(y * inv8), mask=omask)
        else:
            yo = y.to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + o_offs, yo, mask=omask)
            if STATS_OUT:  # of the values as stored, which the next GEMM reads
                add_row_sums(stats_out_ptr, tl.where(omask, yo.to(tl.float32), 0.0), offs_m,
                             rmask)
            if COPY8:
                tl.store(out8_ptr + o_offs, to_e4m3(yo.to(tl.float32) * inv8), mask=omask)
    if ZERO:
        zero_share(zero_ptr, zero_numel, pid, split)
    record(trace_ptr, started, waited, product, epilogue, counted, TRACE)


def deferred_plan(m: int, n: int, k: int, kind: str,
                  fp8: bool = False) -> tuple[GemmConfig, int]:
    """(tiles, K splits) of this path's GEMMs (``kind``: folded, residual, accumulate).

    Folded GEMMs (QKV, FFN1) keep the small-batch path's 64x64x128 tiles. The
    attention-output GEMM stores whole sums, so it cannot split K: 32x32 tiles give it
    about as many programs (96 at 128 tokens on BERT-base) as its 4 splits had (BLOCK_K
    64 with 4 stages measured 2% slower than 128 with 3). FFN2 takes 64x64 tiles and as
    many splits as fill one wave (4 at 128 tokens): 2% faster than the seven-kernel
    path's 128-row tiles with 8 splits, whose tiles wait on 8 programs (H200, 2026-11-30).

    ``fp8`` (e4m3 operands, folded and accumulate kinds): the same tiles with BLOCK_K
    doubled where K holds it, so that a pipeline stage moves as many bytes (chains of
    BERT-base GEMMs at 128 tokens, H200, 2026-12-01, ``benchmarks/weight_bytes.py``: QKV
    2.78, FFN1 2.93, FFN2 3.15 us against 4.08, 4.56, 4.93 in fp16; 11 other plans in the
    whole pass lost or tied). Measured at up to 128 rows, the small path's default.
    """
    if fp8 and kind in ("folded", "accumulate"):
        top = 256 if kind == "folded" else 128
        bk = next(b for b in (256, 128, 64, 32) if b <= top and k % b == 0)
        if kind == "folded":
            return (64, 64, bk, 4, 3), 1
        return (64, 64, bk, 4, 4), most_splits(k, bk, triton.cdiv(m, 64) * triton.cdiv(n, 64))
    if kind == "folded":
        return small_batch_plan(m, n, k, False)
    if kind == "residual":
        bk = 128 if k % 128 == 0 else 64
        return (32, 32, bk, 4, 3), 1
    if kind == "accumulate":
        return (64, 64, 64, 4, 4), most_splits(k, 64, triton.cdiv(m, 64) * triton.cdiv(n, 64))
    raise ValueError(f"unknown GEMM kind {kind!r}")


def early_weights_fit(config: GemmConfig, k_slice: int, element_bytes: int) -> bool:
    """Whether a launch with ``early`` weights holds its K slice (else it keeps the K
    loop): 64-row tiles, 1 to ``_EARLY_CHUNKS`` whole chunks, and weight and activation
    chunks within ``_EARLY_BYTES`` together."""
    bm, bn, bk = config[:3]
    return (bm == 64 and k_slice % bk == 0 and 1 <= k_slice // bk <= _EARLY_CHUNKS
            and (bm + bn) * k_slice * element_bytes <= _EARLY_BYTES)


def _launch(x, w, out, *, config, pdl, prefetch, u=None, bias=None, out16=None, stats=None,
            stats_out=None, counters=None, residual=None, res_gamma=None, res_beta=None,
            zero=None, eps=0.0, act=None, splits=1, fold=False, late_release=False,
            scale=None, out8=None, inv8=None, early=False, settled=False) -> None:
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk, warps, stages, loads = unpack_config(config)
    if loads != LOADS_POINTER:
        raise ValueError("the deferred-LayerNorm GEMMs take pointer-load tiles only")
    check_k_split(k, splits, bk)
    atomic = out.dtype == torch.float32 and out16 is not None
    scaled = scale is not None
    if scaled != (x.dtype == torch.float8_e4m3fn) or scaled != (w.dtype == torch.float8_e4m3fn):
        raise ValueError("e4m3 operands (both) go with a `scale`, 16-bit ones without")
    q_out = out.dtype == torch.float8_e4m3fn
    if (q_out or out8 is not None) and inv8 is None:
        raise ValueError("an e4m3 output needs `inv8`, the multiplier it is stored with")
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    early = early and early_weights_fit(config, k // splits, w.element_size())
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk]) if early and EARLY_TMA else None
    if atomic and (counters is None or counters.numel() < tiles):
        raise ValueError(f"split-K accumulation needs {tiles} zeroed tile counters")
    if m == 0:
        return

    def arg(t):  # a valid pointer for arguments a variant never reads
        return w if t is None else t

    grid = (tiles, splits)
    # named as the deferred layer uses each kind of launch
    role = "FFN2" if atomic else (("FFN1" if act else "QKV") if fold else "out-projection")
    trace = trace_slot(role, grid)
    _deferred_gemm_kernel[grid](
        x, w, arg(u), arg(bias), out, arg(out16), arg(stats), arg(stats_out), arg(counters),
        arg(residual), arg(res_gamma), arg(res_beta), arg(zero), arg(scale), arg(out8),
        arg(inv8),
        m, n, k, k // splits, zero.numel() if zero is not None else 0, eps,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, FOLD_LN=fold,
        GELU=act is not None, TANH=act == "gelu_tanh", HAS_BIAS=bias is not None,
        RESIDUAL=residual is not None, ATOMIC=atomic, STATS_OUT=stats_out is not None,
        ZERO=zero is not None, USE_PDL=pdl, PREFETCH=pdl and prefetch,
        W_BYTES=w.element_size(), LATE_RELEASE=pdl and late_release, SCALED=scaled,
        Q_OUT=q_out, COPY8=out8 is not None, EARLY=early, NCH=k // splits // bk if early else 0,
        trace_ptr=w if trace is None else trace, TRACE=trace is not None,
        w_desc=w_desc, W_TMA=w_desc is not None, SETTLED=settled and residual is not None,
        num_warps=warps,
        num_stages=stages, **launch_options(pdl),
    )


def folded_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    colsum: torch.Tensor,
    bias: torch.Tensor | None,
    stats: torch.Tensor,
    eps: float,
    act: str | None = None,
    zero: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    late_release: bool = False,
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out_inv: torch.Tensor | None = None,
    early: bool = False,
) -> torch.Tensor:
    """``LN(x) @ W^T (+ bias) (then act)`` in ``x``'s dtype, from un-normalised rows ``x``
    [M, K], their (sum, sum of squares) ``stats`` [M, 2] float32, and the folded weight
    ``w = W diag(gamma)`` with ``colsum`` its row sums (``engine.fused.folding``; ``bias``
    already holds ``W beta``). If given, also zeroes the float32 tensor ``zero`` (what
    later GEMMs of the layer accumulate into), after its own tile. ``late_release`` (with
    ``pdl``) lets the next kernel launch only after each program's K loop.

    FP8: ``x`` and ``w`` in e4m3 with ``scale`` [1] float32 the product's (``colsum``
    then sums the dequantized weight); the result in ``out_dtype``, or with ``out_inv``
    [1] in e4m3 times ``out_inv``.

    ``early``: each program loads its whole weight slice before its PDL wait and its
    activations all at once after it, where the slice fits (:func:`early_weights_fit`;
    else the K loop runs as without it)."""
    if act not in (None, "gelu", "gelu_tanh"):
        raise ValueError(f"unknown activation {act!r}")
    m, n = x.shape[0], w.shape[0]
    dtype = torch.float8_e4m3fn if out_inv is not None else out_dtype or x.dtype
    out = torch.empty((m, n), device=x.device, dtype=dtype)
    config = config or deferred_plan(m, n, x.shape[1], "folded", scale is not None)[0]
    _launch(x, w, out, u=colsum, bias=bias, stats=stats, zero=zero, eps=eps, act=act,
            config=config, pdl=pdl, prefetch=prefetch, fold=True, late_release=late_release,
            scale=scale, inv8=out_inv, early=early)
    return out


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
    config: GemmConfig | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    late_release: bool = False,
    scale: torch.Tensor | None = None,
    out8: torch.Tensor | None = None,
    inv8: torch.Tensor | None = None,
    early: bool = False,
    settled: bool = False,
) -> torch.Tensor:
    """``v = x @ w^T + bias + LN(residual)`` (LN's moments from ``res_stats``, the rows'
    (sum, sum of squares)), whose rows' sums are added into ``stats_out`` [M, 2].

    Without ``out``: ``v`` stored in ``x``'s dtype (one K slice) and returned. With
    ``out`` (float32 [M, N], zeroed), ``out16`` ([M, N], model dtype) and ``counters``
    (int32, zeroed, one per output tile): ``v`` added into ``out`` over ``splits`` K
    slices, its copy left in ``out16``; returns ``out16``. ``late_release`` as for
    :func:`folded_linear`.

    FP8: ``x`` and ``w`` in e4m3 (with ``out``) and ``scale`` [1] float32 the product's.
    ``out8`` ([M, N] e4m3) also gets ``v`` times ``inv8`` [1]: the next GEMM's operand.
    ``early`` as for :func:`folded_linear`. ``settled``: ``residual`` and ``res_stats``
    were written two or more launches back (with ``pdl``, the launch in between waited
    for their writer): the programs build bias + LN(residual) before their wait.
    """
    m, n = x.shape[0], w.shape[0]
    if out is None:
        if splits != 1:
            raise ValueError("split-K needs a float32 `out` to accumulate into")
        if scale is not None:
            raise ValueError("e4m3 operands need a float32 `out` to accumulate into")
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
        kind = "residual"
    elif out.dtype != torch.float32 or out.shape != (m, n) or out16 is None:
        raise ValueError("`out` must be float32 [M, N], with an `out16` copy")
    else:
        kind = "accumulate"
    _launch(x, w, out, out16=out16, bias=bias, stats=res_stats, stats_out=stats_out,
            counters=counters, residual=residual, res_gamma=gamma, res_beta=beta, eps=eps,
            splits=splits, config=config or deferred_plan(m, n, x.shape[1], kind,
                                                          scale is not None)[0],
            pdl=pdl, prefetch=prefetch, late_release=late_release, scale=scale, out8=out8,
            inv8=inv8, early=early, settled=settled)
    return out if out16 is None else out16


@triton.jit(do_not_specialize=_STAGED, do_not_specialize_on_alignment=_STAGED[:4])
def _embed_sum_kernel(
    ids_ptr, tt_ptr, pos_ptr, cu_src, n_valid, n_seqs,
    word_ptr, posemb_ptr, type_ptr, z_ptr, z16_ptr, stats_ptr,
    z8_ptr, inv8_ptr, cu_dst, n_cu, n_rows, D, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
    USE_PDL: tl.constexpr, COPY8: tl.constexpr, CU_BLOCK: tl.constexpr, trace_ptr,
    TRACE: tl.constexpr,
):
    """The deferred layer's first kernel; it stages a graph's inputs as ``_embed_ln_kernel``
    does (``rows.STAGE_ARGS``)."""
    started = stamp(TRACE)
    pdl_enter(USE_PDL)
    waited = stamp(TRACE)
    stage_cu(cu_src, cu_dst, n_seqs, n_cu, CU_BLOCK)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask, cols, _, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    x = embed_rows(rows, ids_ptr, tt_ptr, pos_ptr, n_valid, word_ptr, posemb_ptr, type_ptr,
                   mask, rmask, cols, D)
    tl.store(z_ptr + offs, x, mask=mask)
    tl.store(z16_ptr + offs, x.to(z16_ptr.dtype.element_ty), mask=mask)
    if COPY8:
        tl.store(z8_ptr + offs, to_e4m3(x * tl.load(inv8_ptr)), mask=mask)
    tl.store(stats_ptr + 2 * rows, tl.sum(x, axis=1), mask=rmask)
    tl.store(stats_ptr + 2 * rows + 1, tl.sum(x * x, axis=1), mask=rmask)
    record(trace_ptr, started, waited, waited, waited, waited, TRACE)


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
    stage: torch.Tensor | None = None,
) -> None:
    """word[ids] + position[pos] + token_type[tt] (no LayerNorm) into float32 ``z`` and its
    model-dtype copy ``z16`` [T, D], with each row's (sum, sum of squares) in ``stats``;
    and with ``z8`` an e4m3 copy of ``z`` times ``inv8`` [1]. ``stage`` (the graph
    buffer's cu_seqlens): a graph's first kernel, whose inputs a call sets
    (``rows.STAGE_ARGS``)."""
    if (z8 is None) != (inv8 is None):
        raise ValueError("an e4m3 copy needs both `z8` and `inv8`")
    n, d = input_ids.shape[0], word.shape[1]
    block, rows, warps = _row_tile(n, d)
    staged, (cu_dst, n_cu) = staging_args(input_ids, token_type_ids, position_ids, stage)
    grid = (triton.cdiv(n, rows),)
    trace = trace_slot("embeddings", grid)
    _embed_sum_kernel[grid](
        *staged, word, position, token_type, z, z16, stats,
        z16 if z8 is None else z8, stats if inv8 is None else inv8, cu_dst, n_cu, n, d,
        BLOCK_D=block, ROWS=rows, USE_PDL=pdl, COPY8=z8 is not None, CU_BLOCK=_CU_BLOCK,
        trace_ptr=word if trace is None else trace, TRACE=trace is not None,
        num_warps=warps, **launch_options(pdl),
    )


@triton.jit
def _layernorm_qa_kernel(
    z_ptr, g_ptr, b_ptr, qa_w_ptr, qa_b_ptr, logits_ptr, n_rows, logits_stride, D, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, USE_PDL: tl.constexpr, trace_ptr,
    TRACE: tl.constexpr,
):
    started = stamp(TRACE)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask, cols, cmask, mask, offs = row_block(rows, n_rows, D, BLOCK_D)
    g, b = load_vector(g_ptr, cols, cmask), load_vector(b_ptr, cols, cmask)
    pdl_enter(USE_PDL)
    waited = stamp(TRACE)
    z = tl.load(z_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    qa_head_rows(layernorm_rows(z, mask, g, b, D, eps), rows, rmask, cols, cmask, qa_w_ptr,
                 qa_b_ptr, logits_ptr, logits_stride, D)
    record(trace_ptr, started, waited, waited, waited, waited, TRACE)


def layernorm_qa(
    z: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    qa_weight: torch.Tensor,
    qa_bias: torch.Tensor,
    pdl: bool = False,
) -> torch.Tensor:
    """QA logits float32 [2, T] (row 0 start, row 1 end) of LayerNorm(z)."""
    n, d = z.shape
    logits = torch.empty((2, n), device=z.device, dtype=torch.float32)
    block, rows, warps = _row_tile(n, d)
    grid = (triton.cdiv(n, rows),)
    trace = trace_slot("LN + QA head", grid)
    _layernorm_qa_kernel[grid](
        z, gamma, beta, qa_weight, qa_bias, logits, n, logits.stride(0), d, eps,
        BLOCK_D=block, ROWS=rows, USE_PDL=pdl,
        # the fallback is not the logits: a graph's output argument is found by its address
        trace_ptr=z if trace is None else trace, TRACE=trace is not None,
        num_warps=warps, **launch_options(pdl),
    )
    return logits
