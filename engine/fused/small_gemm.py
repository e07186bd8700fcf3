"""CUTLASS GEMMs for the small-batch layer's QKV and FFN1 (engine option
``cutlass_small_gemms``: by default used where they can run, on models of hidden size
``encoder.AUTO_SMALL_GEMMS_MIN_HIDDEN`` and up).

At 128 tokens CUTLASS's TMA warp-specialized kernel runs these two GEMMs faster than the
engine's Triton K loop, and on BERT-large at 1x128 the seven-kernel layer's pass with both
swapped in measured 6.0-6.2% faster, and 2.8-17% from 1x16 to 8x16 (H200, ``NOTES.md``
v16-v17; no gain on BERT-base, whose default layer folds its LayerNorms into the GEMMs and
is not covered). The kernels are CUDA
C++ (``engine/fused/cuda/small_gemm.cu``), built with nvcc into
``build/cuda/libqa_small_gemm.so`` by ``engine/fused/cuda/build.sh small`` (or the library
at ``$QA_SMALL_GEMM_LIB``), and called through ctypes on torch's current stream, so they
run inside the engine's CUDA graphs and join its programmatic-dependent-launch chain.
Nothing is loaded until first use.
"""

from __future__ import annotations

import ctypes

import torch

from engine.fused.native import NativeLibrary

LIB_NAME = "libqa_small_gemm.so"
BUILD_HINT = "build it with engine/fused/cuda/build.sh small (needs nvcc from CUDA 12.8+)"
GEMMS = ("qkv", "ffn1")  # the small-batch GEMMs it can run
_PLAIN, _BIAS_GELU = 0, 1
_ERRORS = {1: "bad shape (N and K multiples of 8) or kind", 2: "CUTLASS refused the problem",
           3: "needs a workspace", 4: "launch failed"}


def _declare(lib: ctypes.CDLL) -> None:
    lib.qa_small_gemm_linear.restype = ctypes.c_int
    lib.qa_small_gemm_linear.argtypes = ([ctypes.c_int] + [ctypes.c_void_p] * 4
                                         + [ctypes.c_int] * 4 + [ctypes.c_void_p])


LIBRARY = NativeLibrary(LIB_NAME, "QA_SMALL_GEMM_LIB", "cutlass_small_gemms", BUILD_HINT,
                        _declare)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           gelu: bool = False, pdl: bool = False) -> torch.Tensor:
    """``x @ w.T`` [M, N] fp16, or with ``gelu`` ``GELU_erf(x @ w.T + bias)``: ``x`` [M, K]
    and ``w`` [N, K] contiguous fp16 on one CUDA device, ``bias`` [N] contiguous float32 (as
    the engine keeps biases), N and K multiples of 8, 16-byte aligned. Anything else is a
    ValueError before the library is touched."""
    _check(x, w, bias, gelu)
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty((m, n), device=x.device, dtype=torch.float16)
    if m == 0:
        return out
    code = LIBRARY.load().qa_small_gemm_linear(
        _BIAS_GELU if gelu else _PLAIN, x.data_ptr(), w.data_ptr(),
        0 if bias is None else bias.data_ptr(), out.data_ptr(), m, n, k, int(pdl),
        torch.cuda.current_stream(x.device).cuda_stream)
    if code:
        raise RuntimeError(f"small GEMM {m}x{n}x{k}: {_ERRORS.get(code, code)}")
    return out


def _check(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, gelu: bool,
           on_device: bool = True) -> None:
    """ValueError naming every way the operands differ from what the kernels take
    (``on_device=False`` skips the CUDA placement check: CPU tests)."""
    tensors = {"x": x, "w": w} | ({} if bias is None else {"bias": bias})
    problems = [f"{name} is {t.dim()}-D" for name, t in (("x", x), ("w", w)) if t.dim() != 2]
    if not problems:
        k = x.shape[1]
        n, kw = w.shape
        problems += [f"{name} is {t.dtype}, not float16" for name, t in (("x", x), ("w", w))
                     if t.dtype != torch.float16]
        if kw != k:
            problems.append(f"w has K={kw}, x K={k}")
        if n % 8 or k % 8:
            problems.append(f"N={n} and K={k} must be multiples of 8")
        if gelu != (bias is not None):
            problems.append("a bias goes with gelu, and only with it")
        if bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,)):
            problems.append(f"bias is {bias.dtype} {tuple(bias.shape)}, not float32 ({n},)")
        problems += [f"{name} is not contiguous" for name, t in tensors.items()
                     if not t.is_contiguous()]
        problems += [f"{name} is not 16-byte aligned" for name, t in tensors.items()
                     if t.data_ptr() % 16]
    if on_device:
        problems += [f"{name} is on {t.device}, not {x.device} (CUDA)"
                     for name, t in tensors.items() if not t.is_cuda or t.device != x.device]
    if problems:
        raise ValueError("small GEMM: " + "; ".join(problems))
