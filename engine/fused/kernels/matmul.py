# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""One Triton GEMM, ``x @ w^T``, with the epilogues cuBLAS cannot give this engine.

cuBLAS wins on the large GEMMs (the SQuAD-mix batches), so this kernel serves where it
does not: FFN1 with bias + exact-erf GELU in its epilogue (cuBLASLt only has the tanh
form), and every GEMM of a small batch (a few hundred tokens), where cuBLAS covers the
output with a handful of tiles, streams each weight through a few multiprocessors, and
cannot overlap its start with the kernel before it. Here, small batches get

* **split-K**: K is cut into ``splits`` slices handled by separate programs, which leave
  float32 partial sums ``[splits, M, N]``; the residual-LayerNorm (or GELU) kernel that
  reads the GEMM's output adds them up while it reads anyway;
* **PDL with an L2 weight prefetch**: launched with programmatic dependent launch, each
  program first asks L2 for its weight slice (weights never depend on earlier kernels)
  and L1 for its bias slice, then waits for the previous kernel, so weight streaming
  overlaps that kernel's work.

Epilogues: ``EPI_STORE`` (+ optional bias, output dtype), ``EPI_GELU`` (bias + GELU),
``EPI_PARTIAL`` (float32 partial of this program's K slice).

The K loop loads its tiles with per-thread ``cp.async`` (pointer loads, the default) or,
when a config's sixth entry is ``LOADS_TMA``, through TMA descriptors (sm_90). TMA
measured 0-2.3 us faster per GEMM at 128-384 tokens on the H200 but no faster over whole
passes (NOTES.md, v7), so no default plan uses it; the sweeps in ``benchmarks`` try it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from engine.fused.kernels.common import (
    gelu,
    launch_options,
    pdl_enter,
    pdl_release,
    prefetch_l1,
    prefetch_rows_l2,
)

EPI_STORE = tl.constexpr(0)
EPI_GELU = tl.constexpr(1)
EPI_PARTIAL = tl.constexpr(2)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages[, loads]): ``loads`` (default
# LOADS_POINTER) picks how ``linear`` feeds the K loop.
GemmConfig = tuple[int, ...]
LOADS_POINTER = 0  # per-thread loads (``cp.async``), the only kind the other GEMMs use
LOADS_TMA = 1  # tensor-memory-accelerator boxes (sm_90+)
# (No warp-specialised variant: with triton 3.6 on the H200 a ``warp_specialize`` K loop
# after ``griddepcontrol.wait`` hung the GPU, and its pass rejects the L2 prefetch's asm.)
# FFN1 + GELU tiles measured on the H200 (2026-11-29): 64x64x64 best of 7 at 128 and 384
# tokens; 128x256x64 the best Triton tile at 42,891 tokens (still 17% slower than
# cuBLAS + bias_gelu there, which is why the engine fuses FFN1 only for few tokens).
GEMM_LARGE: GemmConfig = (128, 256, 64, 8, 3)
GEMM_SMALL: GemmConfig = (64, 64, 64, 4, 4)
_SMS = 132  # H100/H200 multiprocessors: the split-K planner aims at 1-2 waves of them


@triton.jit
def tile_product(x_ptr, w_ptr, M, N, K, k0, k_len, offs_m, offs_n, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 ``x[offs_m, k0:k0+k_len] @ w[offs_n, k0:k0+k_len]^T``: rows and columns past
    the edge are clamped (no masks in the K loop), activations loaded past L1 (``.cg``)."""
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.minimum(offs_m, M - 1).to(tl.int64)
    cols = tl.minimum(offs_n, N - 1).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * K + k0 + offs_k[None, :]
    w_ptrs = w_ptr + cols[:, None] * K + k0 + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, k_len, BLOCK_K):
        a = tl.load(x_ptrs, cache_modifier=".cg")
        b = tl.load(w_ptrs)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def gemm_epilogue(acc, bias_ptr, out_ptr, M, N, offs_m, offs_n, split,
                  EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr):
    """Store a float32 output tile: split ``split`` of float32 partials [S, M, N]
    (``EPI_PARTIAL``), or + bias (then GELU for ``EPI_GELU``) in ``out``'s dtype; rows and
    columns past the edge are masked."""
    nmask = offs_n < N
    omask = (offs_m < M)[:, None] & nmask[None, :]
    if EPILOGUE == EPI_PARTIAL:
        prow = split.to(tl.int64) * M + offs_m
        tl.store(out_ptr + prow[:, None] * N + offs_n[None, :], acc, mask=omask)
    else:
        y = acc
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE == EPI_GELU:
            y = gelu(y, TANH)
        o_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def gemm_tile(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K, k0, k_len, pid_m, pid_n, split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr,
    LATE_RELEASE: tl.constexpr = False,
):
    """Output tile (pid_m, pid_n) of ``x[:, k0:k0+k_len] @ w[:, k0:k0+k_len]^T``, then
    :func:`gemm_epilogue`. ``LATE_RELEASE``: let the next kernel launch (PDL) between the
    two, not before the K loop.

    ``x`` [M, K], ``w`` [N, K] row-major, ``k_len`` a multiple of BLOCK_K. Rows/columns
    past the edge are clamped on load (no masks in the K loop) and masked on store.
    Activations are loaded past L1 (``.cg``): in the persistent kernel another program
    may have written them since this multiprocessor last cached the lines.
    """
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tile_product(x_ptr, w_ptr, M, N, K, k0, k_len, offs_m, offs_n, BLOCK_M, BLOCK_N,
                       BLOCK_K)
    pdl_release(LATE_RELEASE)
    gemm_epilogue(acc, bias_ptr, out_ptr, M, N, offs_m, offs_n, split, EPILOGUE, HAS_BIAS,
                  TANH)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid``, tiles ordered in groups of GROUP_M row
    tiles so that neighbouring programs share weight tiles in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_size, (pid % per_group) // group_size


@triton.jit
def prefetch_slices(w_ptr, bias_ptr, N, K, k0, k_len, pid_n, BLOCK_N: tl.constexpr,
                    HAS_BIAS: tl.constexpr, W_BYTES: tl.constexpr):
    """Ask L2 for this program's weight slice (rows of column tile ``pid_n``, K range
    ``k0:k0+k_len``) and L1 for its bias slice: issued before ``pdl_enter``, while the
    previous kernel still runs."""
    cols = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    prefetch_rows_l2(w_ptr + cols * K + k0, k_len * W_BYTES, [BLOCK_N])
    if HAS_BIAS:
        prefetch_l1(bias_ptr + tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 16) * 16,
                                          N - 1))


@triton.jit
def gemm_program(w_ptr, bias_ptr, M, N, K, k_split, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr,
                 USE_PDL: tl.constexpr, PREFETCH: tl.constexpr, W_BYTES: tl.constexpr,
                 LATE_RELEASE: tl.constexpr):
    """(row tile, column tile, split, K start) of this program of a ``linear`` launch, once
    its prefetches are issued and the previous kernel is done (``pdl_enter``; the next
    kernel may launch from then on, or with ``LATE_RELEASE`` after the K loop)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k0 = split * k_split
    if PREFETCH:
        prefetch_slices(w_ptr, bias_ptr, N, K, k0, k_split, pid_n, BLOCK_N, HAS_BIAS, W_BYTES)
    pdl_enter(USE_PDL, not LATE_RELEASE)
    return pid_m, pid_n, split, k0


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K, k_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr,
    TANH: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH: tl.constexpr,
    W_BYTES: tl.constexpr, LATE_RELEASE: tl.constexpr,
):
    """Program (tile, split) of ``gemm_tile`` (tiles in :func:`grouped_tile` order)."""
    pid_m, pid_n, split, k0 = gemm_program(w_ptr, bias_ptr, M, N, K, k_split, BLOCK_M, BLOCK_N,
                                           GROUP_M, HAS_BIAS, USE_PDL, PREFETCH, W_BYTES,
                                           LATE_RELEASE)
    gemm_tile(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, k0, k_split, pid_m, pid_n, split,
              BLOCK_M, BLOCK_N, BLOCK_K, EPILOGUE, HAS_BIAS, TANH, LATE_RELEASE)


@triton.jit
def _gemm_tma_kernel(
    x_desc, w_desc, w_ptr, bias_ptr, out_ptr,
    M, N, K, k_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr,
    TANH: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH: tl.constexpr,
    W_BYTES: tl.constexpr, LATE_RELEASE: tl.constexpr,
):
    """:func:`_gemm_kernel` with tiles loaded by the tensor-memory accelerator (TMA, sm_90):
    ``x_desc``/``w_desc`` describe ``x`` [M, K] and ``w`` [N, K] in [BLOCK_M, BLOCK_K] and
    [BLOCK_N, BLOCK_K] boxes; the hardware zero-fills past the edges, so no clamping."""
    pid_m, pid_n, split, k0 = gemm_program(w_ptr, bias_ptr, M, N, K, k_split, BLOCK_M, BLOCK_N,
                                           GROUP_M, HAS_BIAS, USE_PDL, PREFETCH, W_BYTES,
                                           LATE_RELEASE)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(k0, k0 + k_split, BLOCK_K):
        a = x_desc.load([off_m, k])
        b = w_desc.load([off_n, k])
        acc = tl.dot(a, b.T, acc)
    pdl_release(LATE_RELEASE)
    gemm_epilogue(acc, bias_ptr, out_ptr, M, N, off_m + tl.arange(0, BLOCK_M),
                  off_n + tl.arange(0, BLOCK_N), split, EPILOGUE, HAS_BIAS, TANH)


def gemm_config(m: int) -> GemmConfig:
    """Default tiles: small ones for few tokens (spread the weight stream over more
    multiprocessors), large ones for many."""
    return GEMM_LARGE if m >= 2048 else GEMM_SMALL


def gemm_supported(k: int) -> bool:
    """Whether :func:`linear` takes this inner dimension (a multiple of every BLOCK_K)."""
    return k % 64 == 0


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    act: str | None = None,
    splits: int = 1,
    config: GemmConfig | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    late_release: bool = False,
) -> torch.Tensor:
    """``x @ w.T`` (+ ``bias``) (then ``act``: None, "gelu" or "gelu_tanh") in ``x``'s dtype,
    or, with ``splits > 1``, float32 split-K partials ``[splits, M, N]`` (no bias, no act).

    ``x`` [M, K] and ``w`` [N, K] contiguous; K must split into ``splits`` multiples of the
    tile's BLOCK_K. ``pdl`` launches with programmatic dependent launch; ``prefetch`` (with
    ``pdl``) pulls each program's weight slice into L2 before waiting for the previous
    kernel; ``late_release`` (with ``pdl``) lets the next kernel launch only after each
    program's K loop instead of before it. ``config``'s optional sixth entry picks the K
    loop's loads (``LOADS_*``).
    """
    m, k = x.shape
    n = w.shape[0]
    bm, bn, bk, warps, stages, loads = unpack_config(config or gemm_config(m))
    check_k_split(k, splits, bk)
    if splits > 1 and (bias is not None or act is not None):
        raise ValueError("split-K partials take no bias or activation (the consumer adds them)")
    if act not in (None, "gelu", "gelu_tanh"):
        raise ValueError(f"unknown activation {act!r}")
    if splits > 1:
        out = torch.empty((splits, m, n), device=x.device, dtype=torch.float32)
        epilogue = EPI_PARTIAL
    else:
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
        epilogue = EPI_STORE if act is None else EPI_GELU
    if m == 0:
        return out
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), splits)
    meta = dict(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EPILOGUE=epilogue,
        HAS_BIAS=bias is not None, TANH=act == "gelu_tanh", USE_PDL=pdl,
        PREFETCH=pdl and prefetch, W_BYTES=w.element_size(), LATE_RELEASE=pdl and late_release,
        num_warps=warps, num_stages=stages, **launch_options(pdl),
    )
    b = bias if bias is not None else w
    if loads == LOADS_POINTER:
        _gemm_kernel[grid](x, w, b, out, m, n, k, k // splits, **meta)
    else:
        x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
        w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
        _gemm_tma_kernel[grid](x_desc, w_desc, w, b, out, m, n, k, k // splits, **meta)
    return out


def check_k_split(k: int, splits: int, bk: int) -> None:
    """ValueError unless K cuts into ``splits`` slices of whole BLOCK_K tiles (the K loops
    have no masks: a partial tile would read into the next slice and past each row)."""
    if k % (splits * bk):
        raise ValueError(f"K={k} does not split into {splits} multiples of {bk}")


def unpack_config(config: GemmConfig) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, loads) of a 5- or 6-entry config."""
    if len(config) not in (5, 6) or (len(config) == 6 and config[5] not in (
            LOADS_POINTER, LOADS_TMA)):
        raise ValueError(f"bad GEMM config {config!r}")
    bm, bn, bk, warps, stages = config[:5]
    return bm, bn, bk, warps, stages, config[5] if len(config) == 6 else LOADS_POINTER


def most_splits(k: int, bk: int, tiles: int, programs: int = _SMS) -> int:
    """Most K splits (of 1, 2, 3, 4, 6, 8) into whole BLOCK_K slices that keep
    ``tiles * splits`` programs within one wave of ``programs``."""
    best = 1
    for s in (2, 3, 4, 6, 8):
        if tiles * s <= programs and k % (s * bk) == 0:
            best = s
    return best


def small_batch_plan(m: int, n: int, k: int, partial: bool,
                     programs: int = _SMS) -> tuple[GemmConfig, int]:
    """(tiles, K splits) of a small-batch GEMM; splits only where the consumer sums partials.

    From the H200 sweeps of 2026-11-30 (``benchmarks/bench_small.py``: GEMM chains with PDL
    over HBM-resident weights, BERT-base and BERT-large at 128, 192, 256 and 384 tokens):

    * plain/GELU epilogues: 64x64x128 tiles, 3 stages, up to 256 tokens (best at 128 and
      192 on both models; 128-row tiles ran 2x slower at 192); 128x64x64 above;
    * split-K: 128-row tiles for FFN2 (long K) at up to 128 tokens and for anything above
      256, else 64; then as many splits as keep the programs within one wave of
      ``programs`` (128 tokens on 132 SMs: 4 for the attention output, 8 for FFN2 -- the
      best of up to 28 plans on both models).
    """
    if not partial:
        if m <= 256:
            return ((64, 64, 128, 4, 3) if k % 128 == 0 else (64, 64, 64, 4, 4)), 1
        return (128, 64, 64, 4, 4), 1
    bm = 128 if (m > 256 or (k >= 2048 and m <= 128)) else 64
    config: GemmConfig = (bm, 64, 64, 4, 4)
    return config, most_splits(k, 64, triton.cdiv(m, bm) * triton.cdiv(n, 64), programs)
