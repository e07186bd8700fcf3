# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""The engine's Gluon FFN1 kernel (``engine/fused/kernels/gluon_ffn1.py``: warp-specialized,
its epilogue beside the main loop) against the engine's cuBLASLt call on the same operands.

    python3 benchmarks/gluon_ffn1.py [--m 47391] [--variants 4:128:32:1:1] [--settle-s 3]

Each variant is ``STAGES:BLOCK_K:SUB_M:GELU:ACC16`` (GELU 0: a diagnostic without it, not
FFN1's output; ACC16 0: accumulators handed over as float32, 1: as scaled fp16). The
harness reuses ``cutlass_ffn1``'s operands, comparisons and settled timing: cuBLASLt's
output is the reference (the share of e4m3 elements that differ, the largest difference in
e4m3 values), both against float32 math on 256 rows, then CUDA graphs of ``--calls`` GEMMs
replayed in interleaved rounds, and with ``--settle-s`` each at its own settled power
limit (µs with MHz and W: at the 700 W cap a GEMM's time is also an energy result).
``sm90_sass`` compiles the kernel for sm_90a on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
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
              acc16: int = 1, block_n: int = 128) -> tuple[str, str, int]:
    """(SASS, ``cuobjdump -res-usage``, shared bytes) of the kernel compiled for sm_90a
    here, no GPU needed (``attention_sass.compile_sass``), with BERT-large's FFN1 widths."""
    import torch
    from triton.runtime.jit import mangle_type

    from benchmarks.attention_sass import compile_sass

    xq = torch.empty((256, 1024), dtype=torch.float8_e4m3fn)
    w8 = torch.empty((4096, 1024), dtype=torch.float8_e4m3fn)
    from engine.fused.kernels.gluon_ffn1 import _ffn1_kernel, descriptors

    a_desc, b_desc = descriptors(xq, w8, block_k, block_n)
    signature = {"a_desc": str(mangle_type(a_desc)), "b_desc": str(mangle_type(b_desc)),
                 "bias_ptr": "*bf16", "xs_ptr": "*fp32", "ws_ptr": "*fp32",
                 "hinv_ptr": "*fp32", "out_ptr": "*fp8e4nv", "M": "i32", "N": "i32",
                 "K": "i32", "STAGES": "constexpr", "SUB_M": "constexpr",
                 "GELU": "constexpr", "ACC16": "constexpr", "COOP": "constexpr",
                 "LOAD_REGS": "constexpr",
                 "MMA_REGS": "constexpr", "num_warps": "constexpr"}
    constexprs = {"STAGES": stages, "SUB_M": sub_m, "GELU": gelu, "ACC16": acc16,
                  "COOP": block_n > 128, "LOAD_REGS": 40, "MMA_REGS": 168, "num_warps": 4}
    return compile_sass(_ffn1_kernel, signature, constexprs,
                        ("bias_ptr", "out_ptr", "N", "K"), {"num_warps": 4, "maxnreg": 128},
                        gluon=True)


def run_rows(m: int, d: int, f: int, variants: list[str], calls: int, rounds: int, reps: int,
             settle_s: float, timed_s: float) -> dict[str, Any]:
    """cuBLASLt and every variant on the same operands: comparisons, then graph timings."""
    import torch

    from benchmarks.cutlass_ffn1 import compare, float_error, operands, settled
    from benchmarks.rounds import capture_graph, interleaved
    from engine.fused.cublaslt import fp8_linear
    from engine.fused.fp8 import FP8_DTYPE
    from engine.fused.kernels.gluon_ffn1 import ffn1

    op = operands(m, d, f)
    ref = torch.empty((m, f), device="cuda", dtype=FP8_DTYPE)

    def cublaslt() -> None:
        fp8_linear(op["xq"], op["x_scale"], op["w8"], op["w_scale"], FP8_DTYPE, bias=op["b1"],
                   gelu=True, out_scale=op["h_inv"], out=ref, fast_accum=True)

    cublaslt()
    torch.cuda.synchronize()
    row: dict[str, Any] = {"m": m, "n": f, "k": d, "gflop": 2.0 * m * f * d / 1e9,
                           "competitors": {"cublaslt": {"float_error": float_error(ref, op)}}}
    fns: dict[str, Any] = {"cublaslt": cublaslt}
    for text in variants:
        settings = parse_variant(text)
        name = "gluon " + text + ("" if settings["gelu"] else " (no GELU)")
        out = torch.empty_like(ref)

        def call(out: Any = out, settings: dict[str, Any] = settings) -> None:
            ffn1(op["xq"], op["x_scale"], op["w8"], op["w_scale"], op["b1"], op["h_inv"],
                 out, **settings)

        try:
            call()
            torch.cuda.synchronize()
            row["competitors"][name] = {**compare(out, ref), "float_error": float_error(out, op)}
            fns[name] = call
        except Exception as exc:  # a variant that fails to compile is reported, not fatal
            row["competitors"][name] = {"error": repr(exc)[:300]}
        print(f"m={m} {name}: {row['competitors'][name]}", flush=True)
    graphs = {name: capture_graph(fn, calls) for name, fn in fns.items()}
    times = interleaved({name: g.replay for name, g in graphs.items()}, rounds, reps, warm=1)
    for name, ms in times.items():
        us = [t * 1e3 / calls for t in ms]
        med = statistics.median(us)
        row["competitors"][name].update(us_rounds=us, us=med, tflops=row["gflop"] / med * 1e3)
    if settle_s > 0:
        for name, fields in settled(graphs, calls, settle_s, timed_s).items():
            fields["settled_tflops"] = row["gflop"] / fields["settled_us"] * 1e3
            row["competitors"][name].update(fields)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", default="47391", help="row counts (tokens)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=4096)
    p.add_argument("--variants", default="4:128:32:1:1,3:128:32:1:0",
                   help="STAGES:BLOCK_K:SUB_M:GELU:ACC16, comma-separated")
    p.add_argument("--calls", type=int, default=24, help="GEMMs per captured graph")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=3, help="graph replays per round")
    p.add_argument("--settle-s", type=float, default=0.0,
                   help="also time each competitor after this long at load (0: not)")
    p.add_argument("--timed-s", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    rows = []
    for m in (int(v) for v in args.m.split(",")):
        rows.append(run_rows(m, args.hidden, args.intermediate, args.variants.split(","),
                             args.calls, args.rounds, args.reps, args.settle_s, args.timed_s))
        if args.out:
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                           indent=1))
    for row in rows:
        print(f"\nFFN1 {row['m']}x{row['n']}x{row['k']}: µs per GEMM (median of rounds)")
        print("| kernel | µs | TFLOP/s | settled µs | MHz | W | elements differing | max diff "
              "| float error |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, c in row["competitors"].items():
            if "us" not in c:
                print(f"| {name} | {c.get('error', 'not timed')} | | | | | | | |")
                continue
            cells = [f"{c[k]:{f}}" if k in c else "-" for k, f in (
                ("settled_us", ".1f"), ("sm_mhz", ".0f"), ("power_w", ".0f"), ("differ", ".2e"),
                ("max_abs", ".3g"), ("float_error", ".2e"))]
            print(f"| {name} | {c['us']:.1f} | {c['tflops']:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
