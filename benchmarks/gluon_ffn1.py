# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""The engine's Gluon FFN1 kernel (``engine/fused/kernels/gluon_gemm.py``: warp-specialized,
its epilogue beside the main loop) against the engine's cuBLASLt call on the same operands.

    python3 benchmarks/gluon_ffn1.py [--m 47391] [--variants 4:128:32:1:1] [--settle-s 3]

Each variant is ``STAGES:BLOCK_K:SUB_M:GELU:ACC16`` (GELU 0: a diagnostic without it, not
FFN1's output; ACC16 0: accumulators handed over as float32, 1: as scaled fp16). The
harness reuses ``cutlass_ffn1``'s operands, comparisons and settled timing: cuBLASLt's
output is the reference (the share of e4m3 elements that differ, the largest difference in
e4m3 values), both against float32 math on 256 rows, then CUDA graphs of ``--calls`` GEMMs
replayed in interleaved rounds, and with ``--settle-s`` each at its own settled power
limit (µs with MHz and W: at the 700 W cap a GEMM's time is also an energy result).
``sm90_sass`` compiles the kernel (any of its forms) for sm_90a on a machine without a
GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> dict[str, Any]:
    """``STAGES:BLOCK_K:SUB_M:GELU:ACC16[:BLOCK_N]`` (GELU 0: a diagnostic without it, not
    FFN1's output; ACC16 1: accumulators handed over as scaled fp16, 0: as float32;
    BLOCK_N 128: ping-pong, 256: cooperative)."""
    values = [int(v) for v in text.split(":")]
    if len(values) not in (5, 6):
        raise ValueError(f"bad variant {text!r}: STAGES:BLOCK_K:SUB_M:GELU:ACC16[:BLOCK_N]")
    stages, block_k, sub_m, gelu, acc16 = values[:5]
    block_n = values[5] if len(values) == 6 else 128
    return {"config": (stages, block_k, sub_m, block_n), "gelu": gelu, "acc16": acc16}


def sm90_sass(stages: int = 4, block_k: int = 128, sub_m: int = 32, gelu: int = 1,
              acc16: int = 1, block_n: int = 128, operand: str = "e4m3", out: str = "e4m3",
              bias: bool = True, col_scale: bool = False, n: int = 4096,
              k: int = 1024, add: bool = False, add_tma: bool = False,
              nvmma_acc: bool = True, diag: int = 0,
              split: bool | None = None) -> tuple[str, str, int]:
    """(SASS, ``cuobjdump -res-usage``, shared bytes) of ``gluon_gemm``'s kernel compiled
    for sm_90a here, no GPU needed (``attention_sass.compile_sass``): by default the FFN1
    form at BERT-large's widths; ``operand`` "e4m3" or "int8", ``out`` "e4m3" or "fp16";
    ``add`` an addend read in the epilogue, by TMA with ``add_tma``; ``nvmma_acc`` the
    handoff buffers' layout (``gluon_gemm.NVMMA_HANDOFF``); ``diag`` the benchmarks'
    ``gluon_gemm.DIAGNOSTIC``; ``split`` a cooperative kernel's handoff in column halves
    (``gluon_gemm.SPLIT_HANDOFF`` when None)."""
    import torch
    from triton.runtime.jit import mangle_type

    from benchmarks.attention_sass import compile_sass

    kind = {"e4m3": torch.float8_e4m3fn, "int8": torch.int8}[operand]
    xq = torch.empty((256, k), dtype=kind)
    w8 = torch.empty((n, k), dtype=kind)
    from engine.fused.kernels.gluon_gemm import (
        LAUNCH,
        SPLIT_HANDOFF,
        WORKER_REGS,
        _gemm_kernel,
        addend_descriptor,
        descriptors,
    )

    a_desc, b_desc = descriptors(xq, w8, block_k, block_n)
    add_desc = (addend_descriptor(torch.empty((256, n), dtype=torch.float16), block_n)
                if add and add_tma else a_desc)
    signature = {"a_desc": str(mangle_type(a_desc)), "b_desc": str(mangle_type(b_desc)),
                 "add_desc": str(mangle_type(add_desc)),
                 "bias_ptr": "*bf16", "cs_ptr": "*fp32", "xs_ptr": "*fp32", "ws_ptr": "*fp32",
                 "hinv_ptr": "*fp32", "add_ptr": "*fp16",
                 "out_ptr": {"e4m3": "*fp8e4nv", "fp16": "*fp16"}[out],
                 "M": "i32", "N": "i32", "K": "i32", "STAGES": "constexpr",
                 "SUB_M": "constexpr", "GELU": "constexpr", "BIAS": "constexpr",
                 "COL_SCALE": "constexpr", "ADD": "constexpr", "ADD_TMA": "constexpr",
                 "ACC16": "constexpr", "NVMMA_ACC": "constexpr", "DIAG": "constexpr",
                 "SPLIT": "constexpr", "COOP": "constexpr",
                 "LOAD_REGS": "constexpr", "MMA_REGS": "constexpr", "num_warps": "constexpr"}
    constexprs = {"STAGES": stages, "SUB_M": sub_m, "GELU": gelu, "BIAS": bias,
                  "COL_SCALE": col_scale, "ADD": add, "ADD_TMA": add and add_tma,
                  "ACC16": acc16, "NVMMA_ACC": nvmma_acc, "DIAG": diag,
                  "SPLIT": block_n > 128 and (SPLIT_HANDOFF if split is None else split),
                  "COOP": block_n > 128,
                  **WORKER_REGS, "num_warps": LAUNCH["num_warps"]}
    return compile_sass(_gemm_kernel, signature, constexprs,
                        ("bias_ptr", "cs_ptr", "add_ptr", "out_ptr", "N", "K"), LAUNCH,
                        gluon=True)


def run_rows(m: int, d: int, f: int, variants: list[str], calls: int, rounds: int, reps: int,
             settle_s: float, timed_s: float) -> dict[str, Any]:
    """cuBLASLt and every variant on the same operands: comparisons, then graph timings."""
    import torch

    from benchmarks.cutlass_ffn1 import (
        cublaslt_reference,
        new_row,
        operands,
        time_row,
        try_competitor,
    )
    from engine.fused.kernels.gluon_gemm import ffn1

    op = operands(m, d, f)
    cublaslt, ref = cublaslt_reference(op)
    row = new_row(op, ref)
    fns: dict[str, Any] = {"cublaslt": cublaslt}
    for text in variants:
        settings = parse_variant(text)
        out = torch.empty_like(ref)

        def call(out: Any = out, settings: dict[str, Any] = settings) -> None:
            ffn1(op["xq"], op["x_scale"], op["w8"], op["w_scale"], op["b1"], op["h_inv"],
                 out, **settings)

        name = "gluon " + text + ("" if settings["gelu"] else " (no GELU)")
        try_competitor(row, fns, name, call, out, ref, op)
    return time_row(row, fns, calls, rounds, reps, settle_s, timed_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="4:128:32:1:1,3:128:32:1:1:256",
                   help="STAGES:BLOCK_K:SUB_M:GELU:ACC16[:BLOCK_N], comma-separated")
    sys.path.insert(0, str(REPO))
    from benchmarks.cutlass_ffn1 import add_args, run_all

    add_args(p)
    p.set_defaults(m="47391")
    args = p.parse_args()
    run_all(args, lambda m: run_rows(m, args.hidden, args.intermediate,
                                     args.variants.split(","), args.calls, args.rounds,
                                     args.reps, args.settle_s, args.timed_s))


if __name__ == "__main__":
    main()
