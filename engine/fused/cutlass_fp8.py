"""The block-scaled FP8 GEMM (CUTLASS, Hopper) behind ``fp8.scaled_linear``'s block mode.

The kernel is CUDA C++ (``engine/fused/cuda/fp8_blockwise.cu``), built with nvcc into
``build/cuda/libqa_fp8_blockwise.so`` by ``engine/fused/cuda/build.sh`` (or the library at
``$QA_FP8_BLOCKWISE_LIB``) and called through ctypes on torch's current stream, so it runs
inside the engine's CUDA graphs like any kernel. Nothing is loaded until first use.
"""

from __future__ import annotations

import ctypes

import torch

from engine.fused.fp8 import BLOCK, Quantized
from engine.fused.native import NativeLibrary

LIB_NAME = "libqa_fp8_blockwise.so"
BUILD_HINT = "build it with engine/fused/cuda/build.sh (needs nvcc from CUDA 12.8+)"
_OUT_CODES = {torch.float16: 0, torch.bfloat16: 1}
_ERRORS = {1: "bad shape (rows % 4, cols % 128)", 2: "CUTLASS refused the problem",
           3: "workspace too small", 4: "launch failed"}


def _declare(lib: ctypes.CDLL) -> None:
    lib.qa_fp8_workspace.restype = ctypes.c_size_t
    lib.qa_fp8_workspace.argtypes = [ctypes.c_int] * 3
    lib.qa_fp8_sf_offsets.restype = None
    lib.qa_fp8_sf_offsets.argtypes = [ctypes.c_int] * 3 + [ctypes.POINTER(ctypes.c_longlong)]
    lib.qa_fp8_gemm.restype = ctypes.c_int
    lib.qa_fp8_gemm.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
                                + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])


LIBRARY = NativeLibrary(LIB_NAME, "QA_FP8_BLOCKWISE_LIB", "block-wise FP8", BUILD_HINT,
                        _declare)


def scale_offsets(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """The kernel's scale layouts, as offsets of SFA (m+1), SFA (kb+1), SFB (nb+1), SFB
    (kb+1) from the origin: ``(1, m, k/128, 1)`` is what ``fp8`` writes."""
    out = (ctypes.c_longlong * 4)()
    LIBRARY.load().qa_fp8_sf_offsets(m, n, k, out)
    return out[0], out[1], out[2], out[3]


def blockwise_gemm(xq: Quantized, w8: torch.Tensor, w_scale: torch.Tensor,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """``x @ w.T`` [M, N] in ``out_dtype`` from block-scaled e4m3 ``xq`` [M, K] and ``w8``
    [N, K] (scales [N/128, K/128]), on the GPU through the CUTLASS kernel."""
    rows, k = xq.data.shape
    n = w8.shape[0]
    m4 = xq.scale.shape[1]
    if (out_dtype not in _OUT_CODES or w8.shape[1] != k or xq.scale.shape[0] != k // BLOCK
            or w_scale.shape != (n // BLOCK, k // BLOCK) or m4 < rows):
        raise ValueError(f"block-wise GEMM: x {tuple(xq.data.shape)} (scales "
                         f"{tuple(xq.scale.shape)}), w {tuple(w8.shape)} (scales "
                         f"{tuple(w_scale.shape)}), out {out_dtype}")
    lib = LIBRARY.load()
    out = torch.empty((m4, n), device=w8.device, dtype=out_dtype)
    size = lib.qa_fp8_workspace(m4, n, k)
    workspace = torch.empty((max(size, 1),), device=w8.device, dtype=torch.uint8)
    stream = torch.cuda.current_stream(w8.device).cuda_stream
    # xq.data is the first `rows` rows of an [m4, K] buffer: the kernel reads all m4.
    code = lib.qa_fp8_gemm(xq.data.data_ptr(), w8.data_ptr(), xq.scale.data_ptr(),
                           w_scale.data_ptr(), out.data_ptr(), m4, n, k,
                           _OUT_CODES[out_dtype], workspace.data_ptr(), size, stream)
    if code:
        raise RuntimeError(f"block-wise FP8 GEMM {m4}x{n}x{k}: {_ERRORS.get(code, code)}")
    return out[:rows]
