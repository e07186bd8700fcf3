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


def qkv_fp8_sass(**constexprs: Any) -> tuple[str, str, int]:
    """BERT-base's calibrated FP8 QKV launch with early weights (64x64x256, 3 chunks, the
    folded LayerNorm, fp16 out, zeroing the layer's scratch, PDL and L2 prefetch),
    ``constexprs`` overriding its
    constants (e.g. ``TRACE``, ``W_TMA`` with ``w_desc`` a type)."""
    types = {p: "*fp8e4nv" if p in ("x_ptr", "w_ptr") else "*i32" if p == "cnt_ptr"
             else "*fp16" if p == "out_ptr" else "*fp32" for p in GEMM_POINTERS}
    constants: dict[str, Any] = dict(
        BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, GROUP_M=8, FOLD_LN=True, GELU=False,
        TANH=False, HAS_BIAS=False, RESIDUAL=False, ATOMIC=False, STATS_OUT=False,
        ZERO=True, USE_PDL=True, PREFETCH=True, W_BYTES=1, LATE_RELEASE=False,
        SCALED=True, Q_OUT=False, COPY8=False, EARLY=True, NCH=3, TRACE=False,
        w_desc=None, W_TMA=False, SETTLED=False) | constexprs
    if constants["w_desc"] is not None:  # a descriptor's type: a runtime argument
        types["w_desc"] = constants.pop("w_desc")
    return gemm_sass(types, constants, 4, 3)
