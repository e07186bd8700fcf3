"""The engine's Triton kernels compiled for sm_90a on this machine, no GPU needed (tests
only), through ``benchmarks.attention_sass.compile_sass``: any kernel with argument types
and constants, and the deferred layer's GEMM as its launches use it."""

from __future__ import annotations

from typing import Any

import pytest

GEMM_POINTERS = ("x_ptr", "w_ptr", "u_ptr", "bias_ptr", "out_ptr", "out16_ptr", "stats_ptr",
                 "stats_out_ptr", "cnt_ptr", "res_ptr", "res_g_ptr", "res_b_ptr", "zero_ptr",
                 "scale_ptr", "out8_ptr", "inv8_ptr")
_GEMM_SCALARS = {"M": "i32", "N": "i32", "K": "i32", "k_split": "i32", "zero_numel": "i32",
                 "eps": "fp32", "trace_ptr": "*i64"}


def tools_or_skip() -> None:
    """Skip unless this Triton wheel ships ``cuobjdump`` (to read SASS with)."""
    pytest.importorskip("triton")
    from benchmarks.attention_sass import cuda_tools

    if not (cuda_tools() / "cuobjdump").exists():
        pytest.skip("this Triton wheel has no cuobjdump")


def kernel_sass(kernel: Any, types: dict[str, str], constexprs: dict[str, Any],
                divisible: tuple[str, ...], warps: int = 4,
                stages: int = 3) -> tuple[str, str, int]:
    """(SASS, resource usage, shared bytes) of JIT function ``kernel``: ``types`` for its
    runtime arguments, ``constexprs`` for all the others (checked), ``divisible`` the
    arguments the launcher would find divisible by 16 (pointers, strides)."""
    from benchmarks.attention_sass import compile_sass

    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    assert {n for n, t in signature.items() if t == "constexpr"} == set(constexprs)
    return compile_sass(kernel, signature, constexprs, divisible,
                        {"num_warps": warps, "num_stages": stages})


def gemm_sass(types: dict[str, str], constexprs: dict[str, Any], warps: int,
              stages: int) -> tuple[str, str, int]:
    """:func:`kernel_sass` of ``kernels.deferred._deferred_gemm_kernel``, the scalars typed
    as the engine passes them."""
    from engine.fused.kernels import deferred

    return kernel_sass(deferred._deferred_gemm_kernel, _GEMM_SCALARS | types, constexprs,
                       (*GEMM_POINTERS, "trace_ptr", "N", "K", "k_split"), warps, stages)


# The deferred GEMM's constants as the FP8 deferred layer launches it, before each
# launch's own (:func:`qkv_fp8_sass`, :func:`ffn2_fp8_sass`).
_FP8_GEMM: dict[str, Any] = dict(
    BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, GROUP_M=8, FOLD_LN=False, GELU=False, TANH=False,
    HAS_BIAS=False, RESIDUAL=False, ATOMIC=False, STATS_OUT=False, ZERO=False, USE_PDL=True,
    PREFETCH=True, W_BYTES=1, LATE_RELEASE=False, SCALED=True, Q_OUT=False, COPY8=False,
    EARLY=False, NCH=0, TRACE=False, w_desc=None, W_TMA=False, SETTLED=False)


def fp8_gemm_sass(e4m3: tuple[str, ...], fp16: tuple[str, ...], stages: int,
                  **constexprs: Any) -> tuple[str, str, int]:
    """:func:`gemm_sass` of an FP8 deferred launch (4 warps): the pointers ``e4m3`` to
    e4m3, ``fp16`` to fp16, the tile counters int32, the others float32; ``constexprs``
    over :data:`_FP8_GEMM` (``w_desc`` a descriptor's type where given: then a runtime
    argument)."""
    types = {p: "*fp8e4nv" if p in e4m3 else "*i32" if p == "cnt_ptr"
             else "*fp16" if p in fp16 else "*fp32" for p in GEMM_POINTERS}
    constants = _FP8_GEMM | constexprs
    if constants["w_desc"] is not None:
        types["w_desc"] = constants.pop("w_desc")
    return gemm_sass(types, constants, 4, stages)


def qkv_fp8_sass(**constexprs: Any) -> tuple[str, str, int]:
    """BERT-base's calibrated FP8 QKV launch with early weights (64x64x256, 3 chunks, the
    folded LayerNorm, fp16 out, zeroing the layer's scratch, PDL and L2 prefetch),
    ``constexprs`` overriding its constants (e.g. ``TRACE``, ``W_TMA`` with ``w_desc`` a
    type)."""
    return fp8_gemm_sass(("x_ptr", "w_ptr"), ("out_ptr",), 3, **(
        dict(FOLD_LN=True, ZERO=True, EARLY=True, NCH=3) | constexprs))


def ffn2_fp8_sass(**constexprs: Any) -> tuple[str, str, int]:
    """FFN2's launch of the FP8 deferred layer (64x64x128 K loop, split-K atomics, the
    tile fix-up, e4m3 copy, PDL, L2 prefetch), ``constexprs`` overriding its constants."""
    return fp8_gemm_sass(("x_ptr", "w_ptr", "out8_ptr"), (), 4, **(
        dict(BLOCK_K=128, HAS_BIAS=True, RESIDUAL=True, ATOMIC=True, STATS_OUT=True,
             COPY8=True) | constexprs))
