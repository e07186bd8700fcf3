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
_INT8_MAX = tl.constexpr(127.0)
# 1.5 * 2**23: adding it to a float32 of magnitude below 2**22 leaves the integer part in
# the mantissa, rounded to nearest even; subtracting it gives that integer exactly
_ROUND_MAGIC = tl.constexpr(12582912.0)
# Kernels run on triton's CPU interpreter, which has no inline PTX and mis-rounds the
# e4m3 cast. ``@triton.jit`` reads TRITON_INTERPRET (through this knob) when a kernel is
# defined, at import, so reading it here matches the kernels this module defines.
_INTERPRETED = tl.constexpr(bool(triton.knobs.runtime.interpret))


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
def pdl_enter(USE_PDL: tl.constexpr, RELEASE: tl.constexpr = True):
    """Wait for the previous kernel's results, then (``RELEASE``) let the next kernel
    launch; without it the kernel calls :func:`pdl_release` itself, later."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if RELEASE:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_release(USE_PDL: tl.constexpr):
    """Let the next kernel launch (after a :func:`pdl_enter` without ``RELEASE``)."""
    if USE_PDL:
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

    On the GPU the cast (``cvt.rn.satfinite.e4m3x2.f32``) rounds to nearest even by
    itself; triton 3.9's interpreter mis-rounds when the mantissa carries into the
    exponent, so :func:`to_e4m3` calls this only there (5 integer instructions per
    element, a sixth of the FP8 bias + GELU kernel's).
    """
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576 == ~0xFFFFF
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def to_e4m3(x):
    """float32 to e4m3, rounding to nearest even and saturating at +-448 (on the GPU the
    cast is ``cvt.rn.satfinite``; the interpreter gets both steps spelled out)."""
    if _INTERPRETED:
        x = round_to_e4m3_grid(tl.minimum(tl.maximum(x, -_FP8_MAX), _FP8_MAX))
    return x.to(tl.float8e4nv)


@triton.jit
def to_int8(x):
    """float32 to int8, rounding to nearest even and saturating at +-127 (the symmetric
    range: -128 is never produced). On the GPU the rounding is ``cvt.rni.s32.f32`` (one
    instruction an element; the interpreter, without inline PTX, adds and subtracts
    1.5 * 2**23 instead, as the GPU did before v51: two more)."""
    x = tl.minimum(tl.maximum(x, -_INT8_MAX), _INT8_MAX)
    if _INTERPRETED:
        r = ((x + _ROUND_MAGIC) - _ROUND_MAGIC).to(tl.int32)
    else:
        r = tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,f", [x],
                                      dtype=tl.int32, is_pure=True, pack=1)
    return r.to(tl.int8)


@triton.jit
def store_rows_fp8(y, mask, rmask, q_ptrs, qs_ptr, rows, n_rows, D, MODE: tl.constexpr,
                   mult=None):
    """e4m3 copy of a [ROWS, COLS] float32 tile of whole rows (masked lanes hold 0) and its
    float32 scales (``engine.fused.fp8``). ``MODE`` 1: one scale per row, stored at
    ``qs_ptr + rows``; 2: one per row per 128 columns at ``qs_ptr + block * M4 + rows``
    (M-major, M4 = ``n_rows`` rounded up to 4; COLS a multiple of 128, D too); 3: the one
    calibrated scale of the tensor, read from ``qs_ptr`` (values beyond it saturate); 4: an
    int8 copy (``engine.fused.int8``), each column multiplied by its factor read from
    ``qs_ptr`` [D] (the input's smoothing and scale in one) before rounding, or given as
    ``mult`` [1, COLS] already in the tile's layout (a loop over tiles loads it once, not
    once a tile: a load and a layout change behind barriers each, as v42 found for the
    LayerNorm's vectors)."""
    if MODE == 4:
        if mult is None:
            COLS: tl.constexpr = y.shape[1]
            cols = tl.arange(0, COLS)
            mult = tl.load(qs_ptr + cols, mask=cols < D, other=0.0)[None, :]
        tl.store(q_ptrs, to_int8(y * mult), mask=mask)
    elif MODE == 2:
        R: tl.constexpr = y.shape[0]
        C: tl.constexpr = y.shape[1]
        G: tl.constexpr = C // 128
        yg = tl.reshape(y, [R, G, 128])
        amax = tl.max(tl.abs(yg), axis=2)  # masked lanes are 0
        scale = tl.maximum(amax / _FP8_MAX, _SCALE_MIN)
        q = tl.reshape(yg * (1.0 / scale)[:, :, None], [R, C])
        tl.store(q_ptrs, to_e4m3(q), mask=mask)
        g = tl.arange(0, G)
        m4 = (n_rows + 3) // 4 * 4
        tl.store(qs_ptr + g[None, :] * m4 + rows[:, None], scale,
                 mask=rmask[:, None] & (g[None, :] * 128 < D))
    elif MODE == 3:
        tl.store(q_ptrs, to_e4m3(y * (1.0 / tl.load(qs_ptr))), mask=mask)
    else:
        amax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1)
        scale = tl.maximum(amax / _FP8_MAX, _SCALE_MIN)
        # One division per row, a multiply per element (|q| <= 448 up to rounding, which the
        # saturating cast absorbs).
        tl.store(q_ptrs, to_e4m3(y * (1.0 / scale)[:, None]), mask=mask)
        tl.store(qs_ptr + rows, scale, mask=rmask)


@triton.jit
def row_moments(x, mask, D, eps):
    """``(x - mean, mean, 1 / sqrt(var + eps))`` of each row of a float32 tile whose masked
    lanes hold 0 (the centred tile 0 there too)."""
    mean = tl.sum(x, axis=1) / D
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / D
    return xc, mean, 1.0 / tl.sqrt(var + eps)


@triton.jit
def layernorm_rows(x, mask, g, b, D, eps):
    """LayerNorm of each row of a float32 tile whose masked lanes hold 0; ``g``/``b`` are
    the float32 gamma and beta vectors (0 past D)."""
    return layernorm_tile(x, mask, g[None, :], b[None, :], D, eps)


@triton.jit
def layernorm_tile(x, mask, g, b, D, eps):
    """:func:`layernorm_rows` with ``g``/``b`` already [1, COLS] (laid out for the tile)."""
    xc, _, rstd = row_moments(x, mask, D, eps)
    return xc * rstd[:, None] * g + b


@triton.jit
def load_vector(ptr, cols, cmask):
    """A float32 vector (0 past the mask)."""
    return tl.load(ptr + cols, mask=cmask, other=0.0).to(tl.float32)


@triton.jit
def fast_rcp(x):
    """``1 / x`` for float32 ``x`` in [1, 2**126]: ``rcp.approx.ftz.f32`` (one instruction,
    error within 1 ulp) on the GPU; a plain division on the interpreter. Triton's own
    division adds ~8 range checks and fix-ups per element."""
    if _INTERPRETED:
        y = 1.0 / x
    else:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
    return y


# erfc(z) ~= t (A1 + t (A2 + t (A3 + t (A4 + t A5)))) exp(-z^2), t = 1 / (1 + P z), z >= 0
# (Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7). Here z = |x| / sqrt(2), so P is
# divided by sqrt(2), and the A's are halved: the polynomial gives erfc / 2 = 1 - Phi.
_ERFC_P = tl.constexpr(0.3275911 * 0.7071067811865476)
_ERFC_A1 = tl.constexpr(0.5 * 0.254829592)
_ERFC_A2 = tl.constexpr(0.5 * -0.284496736)
_ERFC_A3 = tl.constexpr(0.5 * 1.421413741)
_ERFC_A4 = tl.constexpr(0.5 * -1.453152027)
_ERFC_A5 = tl.constexpr(0.5 * 1.061405429)
_NEG_HALF_LOG2E = tl.constexpr(-0.5 * LOG2E)


@triton.jit
def gelu(x, TANH: tl.constexpr):
    """GELU of float32 ``x``: exact (erf), or the tanh approximation.

    The erf form is ``x * Phi(x)`` with ``1 - Phi(|x|) = erfc(|x| / sqrt 2) / 2`` from a
    branchless rational-exponential fit (A&S 7.1.26, absolute error <= 1.5e-7 in erf,
    so about one float32 ulp of GELU's output, far below its fp16 or e4m3 rounding). It costs two
    special-function instructions (reciprocal, exp2) and ~10 FMAs per element, against
    ~25 instructions for libdevice ``erff``, whose two polynomials are chosen per element:
    the GELU epilogue bounds the fused FFN1 GEMM and the bias + GELU kernel by instruction
    issue (H200 profile, 2026-11-30).
    """
    if TANH:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = tl.exp(-2.0 * tl.abs(u))  # in (0, 1]: no overflow
        t = (1.0 - e) / (1.0 + e)
        y = 0.5 * x * (1.0 + tl.where(u >= 0, t, -t))
    else:
        # (Tensors to the left of the constexpr coefficients: the interpreter needs it.)
        t = fast_rcp(tl.abs(x) * _ERFC_P + 1.0)  # 1/inf = 0: the tail's limit
        poly = ((((t * _ERFC_A5 + _ERFC_A4) * t + _ERFC_A3) * t + _ERFC_A2) * t + _ERFC_A1) * t
        tail = poly * tl.exp2(x * x * _NEG_HALF_LOG2E)  # 1 - Phi(|x|), in [0, 0.5]
        y = x * tl.where(x >= 0, 1.0 - tail, tail)
    return y
