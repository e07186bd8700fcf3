"""FFN1 of the calibrated FP8 engine: the engine's cuBLASLt call against CUTLASS kernels
(`benchmarks/cutlass/fp8_ffn1.cu`: ping-pong and cooperative schedules, several tiles), on
the same operands, timed as CUDA graphs in interleaved rounds.

    engine/fused/cuda/build.sh ffn1      # nvcc, no GPU needed
    python3 benchmarks/cutlass_ffn1.py --lib build/cuda/libqa_fp8_ffn1.so --out ffn1.json

FFN1 is the pass's largest GEMM: ~395 µs a layer on the BERT-large SQuAD mix (47,391
tokens) against ~263 for FFN2, which has the same FLOPs but a plain epilogue (v15 trace).
cuBLASLt runs it as a *cooperative* kernel, whose bias + GELU + e4m3 epilogue stalls the
tensor cores; a *ping-pong* kernel overlaps one warp group's epilogue with the other's
main loop. Both compute ``e4m3(h_inv * GELU_tanh(x_scale * w_scale * xq . w8^T + b1))``
with fast accumulation, the engine's calibrated FFN1 (``fp8.calibrated_ffn1``).

Per row count (``--m``): random operands with BERT-large's widths (LayerNorm-like
activations quantized with a static scale, weights with a per-tensor one, a bf16 bias and
the output scale from the GELU output's amax), the cuBLASLt output as the reference, each
CUTLASS variant's output compared with it (the share of elements that differ, the
largest difference in e4m3 values, i.e. in units of the output scale) and both with
float32 math on 256 rows. Then every
competitor is captured as a graph of ``--calls`` calls and the graphs replay in turn for
``--rounds`` rounds (``rounds.interleaved``): µs per GEMM, median of the rounds, and
TFLOP/s. A single GEMM's time at this size is also an energy result (the H200 runs at its
power cap), so the winner still has to win a whole pass (NOTES v12). Random data.

With ``--settle-s`` > 0 each competitor is then also timed at its own settled power limit
(NOTES v36): its graph replays for ``--settle-s`` seconds, then for ``--timed-s`` seconds
timed, with the median SM clock and power of that window from ``nvidia-smi``
(``gpu_clocks``). The kernels whose names say "no GELU", and ``cublaslt bias only``, are
diagnostics of what the GELU costs: their outputs are not FFN1's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _declare(lib: ctypes.CDLL) -> None:
    lib.qa_ffn1_variants.restype = ctypes.c_int
    lib.qa_ffn1_name.restype = ctypes.c_char_p
    lib.qa_ffn1_name.argtypes = [ctypes.c_int]
    lib.qa_ffn1_workspace.restype = ctypes.c_size_t
    lib.qa_ffn1_workspace.argtypes = [ctypes.c_int] * 4
    lib.qa_ffn1_gemm.restype = ctypes.c_int
    lib.qa_ffn1_gemm.argtypes = ([ctypes.c_int] + [ctypes.c_void_p] * 7 + [ctypes.c_int] * 3
                                 + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])


def load(lib_path: Path) -> ctypes.CDLL:
    from engine.fused.native import load_library

    return load_library(lib_path, _declare, "benchmarks/cutlass_ffn1.py",
                        "build it with engine/fused/cuda/build.sh ffn1")


def operands(m: int, d: int, f: int, seed: int = 0) -> dict[str, Any]:
    """FFN1's calibrated operands: e4m3 activations and weights with per-tensor scales, a
    bf16 bias, and the output multiplier 1 / (amax of the GELU output / 448)."""
    import torch

    from engine.fused.fp8 import FP8_DTYPE, gelu_tanh

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, d), generator=g, device="cuda")
    w = torch.randn((f, d), generator=g, device="cuda") * 0.03
    b1 = (torch.randn((f,), generator=g, device="cuda") * 0.1).to(torch.bfloat16)
    x_scale = (x.abs().amax() / 448.0).reshape(1).float()
    w_scale = (w.abs().amax() / 448.0).reshape(1).float()
    xq = (x / x_scale).clamp(-448, 448).to(FP8_DTYPE)
    w8 = (w / w_scale).clamp(-448, 448).to(FP8_DTYPE)
    rows = slice(0, min(m, 256))
    y = gelu_tanh((xq[rows].float() * x_scale) @ (w8.float() * w_scale).t() + b1.float())
    h_scale = (y.abs().amax() / 448.0).reshape(1).float()
    return {"xq": xq, "x_scale": x_scale, "w8": w8, "w_scale": w_scale, "b1": b1,
            "h_inv": (1.0 / h_scale).float(), "h_scale": float(h_scale), "ref_rows": y}


def compare(out: Any, ref: Any) -> dict[str, float]:
    """e4m3 outputs: the fraction of elements that differ and the largest difference of
    their e4m3 values (units of the output scale; a value's e4m3 step is 2**-3 of its power
    of two)."""
    a, b = out.float(), ref.float()
    return {"differ": float((a != b).float().mean()), "max_abs": float((a - b).abs().max())}


def float_error(out: Any, op: dict[str, Any]) -> float:
    """Largest |dequantized output - float32 math| over the first 256 rows, relative to
    the float output's largest magnitude."""
    y = op["ref_rows"]
    got = out[: y.shape[0]].float() * op["h_scale"]
    return float((got - y).abs().max() / y.abs().max())


def cublaslt_reference(op: dict[str, Any]) -> tuple[Any, Any]:
    """(a call of the engine's cuBLASLt FFN1 on ``op`` writing into a buffer, that buffer)
    after one call: the reference output every competitor is compared with."""
    import torch

    from engine.fused.cublaslt import fp8_linear
    from engine.fused.fp8 import FP8_DTYPE

    ref = torch.empty((op["xq"].shape[0], op["w8"].shape[0]), device="cuda", dtype=FP8_DTYPE)

    def cublaslt() -> None:
        fp8_linear(op["xq"], op["x_scale"], op["w8"], op["w_scale"], FP8_DTYPE, bias=op["b1"],
                   gelu=True, out_scale=op["h_inv"], out=ref, fast_accum=True)

    cublaslt()
    torch.cuda.synchronize()
    return cublaslt, ref


def new_row(op: dict[str, Any], ref: Any) -> dict[str, Any]:
    """A row's record: its shape, GFLOP and cuBLASLt's float error."""
    m, k = op["xq"].shape
    n = op["w8"].shape[0]
    return {"m": m, "n": n, "k": k, "gflop": 2.0 * m * n * k / 1e9,
            "competitors": {"cublaslt": {"float_error": float_error(ref, op)}}}


def try_competitor(row: dict[str, Any], fns: dict[str, Any], name: str, call: Any, out: Any,
                   ref: Any, op: dict[str, Any]) -> None:
    """Run ``call`` once (it writes ``out``); record its comparisons with ``ref`` and keep it
    for timing, or record why it failed (a variant the library refuses is not fatal)."""
    import torch

    try:
        call()
        torch.cuda.synchronize()
        row["competitors"][name] = {**compare(out, ref), "float_error": float_error(out, op)}
        fns[name] = call
    except Exception as exc:
        row["competitors"][name] = {"error": repr(exc)[:300]}
    print(f"m={row['m']} {name}: {row['competitors'][name]}", flush=True)


def time_row(row: dict[str, Any], fns: dict[str, Any], calls: int, rounds: int, reps: int,
             settle_s: float = 0.0, timed_s: float = 1.0) -> dict[str, Any]:
    """Every competitor captured as a graph of ``calls`` calls, replayed in interleaved
    rounds (µs per GEMM, median, TFLOP/s), then with ``settle_s`` > 0 each at its own
    settled power limit; the fields go into ``row``."""
    from benchmarks.rounds import capture_graph, interleaved

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


def run_rows(lib: ctypes.CDLL, m: int, d: int, f: int, calls: int, rounds: int,
             reps: int, variants: list[int], settle_s: float = 0.0,
             timed_s: float = 1.0) -> dict[str, Any]:
    import torch

    from engine.fused.cublaslt import fp8_linear
    from engine.fused.fp8 import FP8_DTYPE

    op = operands(m, d, f)
    cublaslt, ref = cublaslt_reference(op)
    row = new_row(op, ref)
    fns: dict[str, Any] = {"cublaslt": cublaslt}
    bias_out = torch.empty_like(ref)

    def cublaslt_bias() -> None:
        fp8_linear(op["xq"], op["x_scale"], op["w8"], op["w_scale"], FP8_DTYPE, bias=op["b1"],
                   out_scale=op["h_inv"], out=bias_out, fast_accum=True)

    cublaslt_bias()
    row["competitors"]["cublaslt bias only"] = {}  # a diagnostic: not FFN1's output
    fns["cublaslt bias only"] = cublaslt_bias
    for v in variants:
        name = lib.qa_ffn1_name(v).decode()
        out = torch.empty((m, f), device="cuda", dtype=FP8_DTYPE)
        ws = torch.empty(max(1, lib.qa_ffn1_workspace(v, m, f, d)), device="cuda",
                         dtype=torch.uint8)

        def call(v: int = v, out: Any = out, ws: Any = ws, name: str = name) -> None:
            rc = lib.qa_ffn1_gemm(v, op["xq"].data_ptr(), op["w8"].data_ptr(),
                                  op["b1"].data_ptr(), op["x_scale"].data_ptr(),
                                  op["w_scale"].data_ptr(), op["h_inv"].data_ptr(),
                                  out.data_ptr(), m, f, d, ws.data_ptr(), ws.numel(),
                                  torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"qa_ffn1_gemm({name}) returned {rc}")

        try_competitor(row, fns, name, call, out, ref, op)
    return time_row(row, fns, calls, rounds, reps, settle_s, timed_s)


def settled(graphs: dict[str, Any], calls: int, settle_s: float,
            timed_s: float) -> dict[str, dict[str, float]]:
    """Each graph in turn: replayed for ``settle_s`` seconds (the power limit settles at
    this kernel's own draw), then for ``timed_s`` seconds timed by CUDA events; µs per GEMM
    with the window's clock fields."""
    import torch

    from benchmarks.gpu_clocks import ClockSampler, clock_fields, torch_gpu_id
    from benchmarks.rounds import run_for

    out: dict[str, dict[str, float]] = {}
    windows = {}
    with ClockSampler(gpu=torch_gpu_id()) as sampler:
        for name, graph in graphs.items():
            def replay(_: int, graph: Any = graph) -> None:
                graph.replay()

            run_for(replay, settle_s)
            start_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            t0 = sampler.now()
            start_ev.record()
            reps = run_for(replay, timed_s)
            end_ev.record()
            end_ev.synchronize()
            us = start_ev.elapsed_time(end_ev) * 1e3 / (reps * calls)
            out[name] = {"settled_us": us}
            windows[name] = (t0, sampler.now())
            print(f"settled {name}: {us:.1f} µs", flush=True)
    for name, window in windows.items():  # the samples are read once the sampler stops
        out[name].update(clock_fields(sampler.between(*window)))
    if sampler.missing:
        print(f"clocks not sampled: {sampler.missing}", flush=True)
    return out


def add_args(p: argparse.ArgumentParser) -> None:
    """The options both FFN1 tools share: shapes, graph timing, settling, the JSON out."""
    p.add_argument("--m", default="47391,384", help="row counts (tokens)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=4096)
    p.add_argument("--calls", type=int, default=24, help="GEMMs per captured graph")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--reps", type=int, default=3, help="graph replays per round")
    p.add_argument("--settle-s", type=float, default=0.0,
                   help="also time each competitor after this long at load (0: not)")
    p.add_argument("--timed-s", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=None)


def run_all(args: argparse.Namespace, one_row: Any) -> None:
    """``one_row(m)`` for every ``--m``, the JSON rewritten after each, then the tables."""
    import torch

    rows = []
    for m in (int(v) for v in args.m.split(",")):
        rows.append(one_row(m))
        if args.out:
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                           indent=1))
    for row in rows:
        print(f"\nFFN1 {row['m']}x{row['n']}x{row['k']}: µs per GEMM (median of rounds), "
              "TFLOP/s, vs cuBLASLt")
        print("| kernel | µs | TFLOP/s | settled µs | MHz | W | elements differing | max diff "
              "| float error |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, c in row["competitors"].items():
            if "us" not in c:
                print(f"| {name} | {c.get('error', 'not timed')} | | | | | | | |")
                continue
            cells = [f"{c[k]:{f}}" if k in c else "-" for k, f in (
                ("settled_us", ".1f"), ("sm_mhz", ".0f"), ("power_w", ".0f"), ("differ", ".2e"),
                ("max_abs", ".3g"), ("float_error", ".2e"))]  # "-": not measured or compared
            print(f"| {name} | {c['us']:.1f} | {c['tflops']:.0f} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", type=Path, default=REPO / "build" / "cuda" / "libqa_fp8_ffn1.so")
    p.add_argument("--variants", default="", help="CUTLASS variant indices (default all)")
    add_args(p)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    lib = load(args.lib)
    variants = ([int(v) for v in args.variants.split(",")] if args.variants
                else list(range(lib.qa_ffn1_variants())))
    run_all(args, lambda m: run_rows(lib, m, args.hidden, args.intermediate, args.calls,
                                     args.rounds, args.reps, variants, args.settle_s,
                                     args.timed_s))


if __name__ == "__main__":
    main()
