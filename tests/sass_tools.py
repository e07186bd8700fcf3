"""The engine's Triton kernels compiled for sm_90a on this machine, no GPU needed (tests
only): the deferred layer's GEMM with given constants, and its SASS read as lines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

GEMM_POINTERS = ("x_ptr", "w_ptr", "u_ptr", "bias_ptr", "out_ptr", "out16_ptr", "stats_ptr",
                 "stats_out_ptr", "cnt_ptr", "res_ptr", "res_g_ptr", "res_b_ptr", "zero_ptr",
                 "scale_ptr", "out8_ptr", "inv8_ptr")
_SCALARS = {"M": "i32", "N": "i32", "K": "i32", "k_split": "i32", "zero_numel": "i32",
            "eps": "fp32", "trace_ptr": "*i64"}


def tools_or_skip() -> None:
    """Skip unless this Triton wheel ships ``cuobjdump`` (to read SASS with)."""
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton wheel has no cuobjdump")


def gemm_sass(types: dict[str, str], constexprs: dict[str, Any], warps: int,
              stages: int) -> tuple[str, str, int]:
    """(SASS, resource usage, shared bytes) of ``kernels.deferred._deferred_gemm_kernel``
    with ``types`` for its non-constant arguments (the rest of the scalars as the engine
    passes them) and every other argument in ``constexprs``."""
    from benchmarks.attention_sass import compile_sass
    from engine.fused.kernels import deferred

    kernel = deferred._deferred_gemm_kernel
    types = _SCALARS | types
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    assert {n for n, t in signature.items() if t == "constexpr"} == set(constexprs)
    return compile_sass(kernel, signature, constexprs,
                        (*GEMM_POINTERS, "trace_ptr", "N", "K", "k_split"),
                        {"num_warps": warps, "num_stages": stages})


def code_lines(sass: str) -> list[str]:
    """The instruction lines of ``cuobjdump -sass`` output, in order."""
    return [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}", line)]
