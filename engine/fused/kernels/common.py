# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""What every kernel module shares: e4m3 rounding, LayerNorm rows, GELU, and PDL.

**Programmatic dependent launch (PDL, Hopper and newer).** A kernel launched with
``launch_pdl=True`` may start while the kernel before it in the stream is still running.
It must call :func:`pdl_enter` before it touches anything an earlier kernel wrote:
``griddepcontrol.wait`` blocks until the previous grid has finished and its writes are
visible (and that grid itself waited for its own predecessor, so the guarantee is
transitive); ``griddepcontrol.launch_dependents`` then lets the *next* kernel start. What
a kernel does before ``pdl_enter`` must read only data no kernel writes, such as weights:
the GEMMs use that window to pull their weight slice into L2 (:func:`prefetch_rows_l2`)
while the previous kernel computes. Without PDL both calls are compiled out (constexpr
flags), which is also what the CPU interpreter runs.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.fused.fp8 import FP8_MAX, SCALE_MIN

LOG2E = 1.4426950408889634
# Globals a @triton.jit function reads must be constexpr.
_FP8_MAX = tl.constexpr(FP8_MAX)
_SCALE_MIN = tl.constexpr(SCALE_MIN)


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    major, _ = torch.cuda.get_device_capability(device_index)
    extra = getattr(getattr(tl, "extra", None), "cuda", None)
    return major >= 9 and hasattr(extra, "gdc_wait")


def pdl_available(t: torch.Tensor) -> bool:
    """True where kernels on ``t``'s device can use PDL: a CUDA GPU of sm_90 or newer, and
    a triton that has the ``gdc_*`` intrinsics. Never under the CPU interpreter."""
    return t.is_cuda and _pdl_capable(t.device.index or 0)


def launch_options(pdl: bool) -> dict[str, bool]:
    """Extra launch keywords: ``launch_pdl`` only when asked for (older triton lacks it)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def pdl_enter(USE_PDL: tl.constexpr):
    """Wait for the previous kernel's results, then let the next kernel launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_rows_l2(row_ptrs, nbytes, SHAPE: tl.constexpr):
    """Ask L2 to fetch ``nbytes`` (a multiple of 16) from each 16-byte-aligned address:
    one bulk-copy-engine prefetch per row (``cp.async.bulk.prefetch.L2``, sm_90). It does
    not block, and its result is never read."""
    size = tl.zeros(SHAPE, tl.int32) + nbytes
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r", [row_ptrs, size], dtype=tl.int32, is_pure=False, pack=1,
    )


@triton.jit
def prefetch_l1(ptrs):
    """Ask this multiprocessor's L1 for the lines at ``ptrs`` (``prefetch.global.L1``): one
    pointer per 128-byte line is enough. It does not block, and its result is never read.
    The GEMMs and attention use it before :func:`pdl_enter` for the bias slices they read
    after it, which the weight streams of earlier kernels have evicted from L2: otherwise
    each costs an HBM round trip on the critical path."""
    tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def round_to_e4m3_grid(x):
    """Round float32 to 3 mantissa bits (nearest even) so the e4m3 cast after it is exact.

    On the GPU the cast alone would round the same way; this makes the result independent
    of the cast's rounding (triton 3.9's interpreter mis-rounds when the mantissa carries
    into the exponent), at a few integer ops per element in a memory-bound kernel.
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576 == ~0xFFFFF
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def store_rows_fp8(y, mask, rmask, q_ptrs, scale_ptrs):
    """Per-row e4m3 quantization of a [ROWS, COLS] float32 tile (masked lanes hold 0)."""
    amax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1)
    scale = tl.maximum(amax / _FP8_MAX, _SCALE_MIN)
    q = tl.minimum(tl.maximum(y / scale[:, None], -_FP8_MAX), _FP8_MAX)
    tl.store(q_ptrs, round_to_e4m3_grid(q).to(tl.float8e4nv), mask=mask)
    tl.store(scale_ptrs, scale, mask=rmask)


@triton.jit
def layernorm_rows(x, mask, g, b, D, eps):
    """LayerNorm of each row of a float32 tile whose masked lanes hold 0; ``g``/``b`` are
    the float32 gamma and beta vectors (0 past D)."""
    mean = tl.sum(x, axis=1) / D
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / D
    rstd = 1.0 / tl.sqrt(var + eps)
    return xc * rstd[:, None] * g[None, :] + b[None, :]


@triton.jit
def load_vector(ptr, cols, cmask):
    """A float32 vector (0 past the mask)."""
    return tl.load(ptr + cols, mask=cmask, other=0.0).to(tl.float32)


@triton.jit
def gelu(x, TANH: tl.constexpr):
    """Exact (erf) GELU of float32 ``x``, or the tanh approximation."""
    if TANH:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = tl.exp(-2.0 * tl.abs(u))  # in (0, 1]: no overflow
        t = (1.0 - e) / (1.0 + e)
        y = 0.5 * x * (1.0 + tl.where(u >= 0, t, -t))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    return y
