# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""Split-K reduced inside a thread-block cluster, through distributed shared memory (sm_90).

A GEMM whose K is split over ``n`` programs must add their partial tiles. The deferred
layer's FFN2 did it with float32 atomics into L2, a per-tile counter and a read-back by
the program that arrived last: three dependent L2 round trips after the K loop. Here the
``n`` programs of a tile form one cluster (co-scheduled on a GPC): each stores its partial
tile in its own shared memory, the cluster meets at a barrier, and program ``r`` sums row
block ``r`` of the tile from all ``n`` shared memories (``ld.shared::cluster``, in rank
order, so the sum is deterministic) and runs the epilogue on that block alone.

Triton (3.6-3.9) has no cluster API for independent programs: its ``num_ctas`` makes one
program span several CTAs. :func:`launch_in_clusters` compiles the kernel as usual and then
launches it with a cluster dimension and extra dynamic shared memory past what triton
allocated (whose byte offset the kernel takes as an argument); the jit helpers below reach
that memory through triton's ``global_smem`` symbol with inline PTX. Neither runs on the
CPU interpreter (no inline PTX, programs run one after another): :func:`clusters_available`
says where they do.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch
import triton
import triton.language as tl

# Cluster sizes the reduction supports (8 is the largest portable one).
CLUSTER_SIZES = (2, 4, 8)
_SMEM_ALIGN = 128
_DEFAULT_DYNAMIC_SMEM = 48 * 1024  # above it a kernel must opt in (cuFuncSetAttribute)
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute


@triton.jit
def _cluster_barrier(token, ARRIVE: tl.constexpr, WAIT: tl.constexpr):
    """Each thread once: arrive at (release) and/or wait on (acquire) the cluster barrier."""
    if ARRIVE:
        tl.inline_asm_elementwise("barrier.cluster.arrive.release;\n\tmov.u32 $0, 0;",
                                  "=r,r", [token], dtype=tl.int32, is_pure=False, pack=1)
    if WAIT:
        tl.inline_asm_elementwise("barrier.cluster.wait.acquire;\n\tmov.u32 $0, 0;",
                                  "=r,r", [token], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_put(acc, red_off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store float32 tile ``acc`` [BLOCK_M, BLOCK_N] row-major at byte ``red_off`` of this
    program's shared memory, then arrive at the cluster barrier (release)."""
    offs = red_off + (tl.arange(0, BLOCK_M)[:, None] * BLOCK_N
                      + tl.arange(0, BLOCK_N)[None, :]) * 4
    tl.inline_asm_elementwise(
        "{ .reg .u32 a; mov.u32 a, global_smem; add.u32 a, a, $2; st.shared.f32 [a], $1; }"
        "\n\tmov.u32 $0, 0;",
        "=r,f,r", [acc, offs], dtype=tl.int32, is_pure=False, pack=1)
    _cluster_barrier(red_off, True, False)


@triton.jit
def cluster_sum(red_off, rank, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CLUSTER: tl.constexpr):
    """Wait for the cluster's :func:`cluster_put`, then return row block ``rank`` (rows
    ``rank * BLOCK_M // CLUSTER`` on) of the sum of its ``CLUSTER`` tiles, float32
    [BLOCK_M // CLUSTER, BLOCK_N]; then arrive again: done reading the others' memory
    (:func:`cluster_done` waits for that before the program may exit).

    The peers' values come as one [rows, BLOCK_N, CLUSTER] tensor, summed by a reduction:
    an elementwise sum in inline PTX would be rematerialised by triton in the layout of
    each consumer (up to 7 copies of every remote load, triton 3.6)."""
    _cluster_barrier(red_off, False, True)
    QM: tl.constexpr = BLOCK_M // CLUSTER
    rows = rank * QM + tl.arange(0, QM)
    offs = red_off + (rows[:, None, None] * BLOCK_N
                      + tl.arange(0, BLOCK_N)[None, :, None]) * 4
    peer = tl.arange(0, CLUSTER)[None, None, :]
    v = tl.inline_asm_elementwise(
        "{ .reg .u32 a, r; mov.u32 a, global_smem; add.u32 a, a, $1;"
        " mapa.shared::cluster.u32 r, a, $2; ld.shared::cluster.f32 $0, [r]; }",
        "=f,r,r", [offs + peer * 0, peer + offs * 0], dtype=tl.float32, is_pure=False,
        pack=1)
    s = tl.sum(v, axis=2)
    _cluster_barrier(red_off, True, False)
    return s


@triton.jit
def cluster_done(red_off):
    """Wait until every program of the cluster has read this one's shared memory."""
    _cluster_barrier(red_off, False, True)


@functools.cache
def _capable(device_index: int) -> bool:
    major, _ = torch.cuda.get_device_capability(device_index)
    return major >= 9


def clusters_available(t: torch.Tensor) -> bool:
    """True where :func:`launch_in_clusters` runs: a CUDA GPU of sm_90 or newer, not the
    CPU interpreter."""
    return (t.is_cuda and not triton.knobs.runtime.interpret
            and _capable(t.device.index or 0))


def cluster_reduction(t: torch.Tensor, splits: int, config: tuple[int, ...] | None) -> bool:
    """Whether ``deferred.residual_linear`` can add ``splits`` K slices of tiles
    ``config`` (BLOCK_M first) inside a cluster on ``t``'s device (``cluster=True``)."""
    return (config is not None and clusters_available(t) and splits in CLUSTER_SIZES
            and config[0] % splits == 0)


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def launch_in_clusters(kernel: Any, grid: tuple[int, ...], ctas: int, smem_bytes: int,
                       args: list[Any], kwargs: dict[str, Any], offset_arg: int) -> None:
    """Launch jit ``kernel`` (``args``, ``kwargs``) as ``grid[0] * ctas`` programs along
    axis 0 in clusters of ``ctas``, with ``smem_bytes`` of shared memory past triton's
    own: its byte offset is passed as ``args[offset_arg]``.

    The kernel is compiled (``warmup``) and its cached launch metadata patched with the
    cluster size and the larger shared memory, so the specialisation must be one that is
    only ever launched this way (a constexpr flag of the kernel's own)."""
    if ctas not in CLUSTER_SIZES:
        raise ValueError(f"clusters of {ctas} programs: expected one of {CLUSTER_SIZES}")
    args = list(args)
    args[offset_arg] = _SMEM_ALIGN  # a placeholder of the real offset's specialisation
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    base = -(-compiled.metadata.shared // _SMEM_ALIGN) * _SMEM_ALIGN
    total = base + smem_bytes
    warps = compiled.metadata.num_warps
    if compiled.packed_metadata != (warps, ctas, total):
        compiled._init_handles()
        if total > _DEFAULT_DYNAMIC_SMEM:
            err = _libcuda().cuFuncSetAttribute(
                ctypes.c_void_p(compiled.function), _MAX_DYNAMIC_SHARED_SIZE_BYTES,
                ctypes.c_int(total))
            if err != 0:
                raise RuntimeError(f"{total} bytes of shared memory for {compiled.name}: "
                                   f"cuFuncSetAttribute returned CUresult {err}")
        compiled.packed_metadata = (warps, ctas, total)
    args[offset_arg] = base
    kernel[grid](*args, **kwargs)
