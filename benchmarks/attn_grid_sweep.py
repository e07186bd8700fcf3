"""Whole-pass time against the number of programs the deferred layer's attention launches.

    python3 benchmarks/attn_grid_sweep.py --model bert-base --dtype fp8 --calibrate \\
        --shapes 1x128,2x64 --programs 24:168:12 --out sweep.json

For each batch shape (full-length windows, one CUDA-graph bucket each) and each count of
``--programs`` (START:STOP:STEP, inclusive; counts under the shape's fewest are skipped,
and each count is rounded up to whole heads' worth of the grid), one engine with
``attention_grid`` set to that count captures the shape's graph; the shape's fewest
programs (``"fewest"``) and the engine's default (``"table"``, ``dispatch.GOOD_RESIDUES``)
run too. All of them share the weights and one FP8 calibration, and take turns for
``--rounds`` rounds of back-to-back calls on device tensors (``_run_device``, CUDA events),
so that drift hits them alike. Prints one table per shape (programs, programs modulo the
multiprocessors, ms, against the fewest) and the residues within ``--within`` of the
shape's best: the candidates for a ``dispatch.GOOD_RESIDUES`` entry, which holds the
residues good at every shape of one token count. Writes the table as JSON (plot it with
``benchmarks/plot_attn_grid.py``). Random weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_range(text: str) -> list[int]:
    """``"24:168:12"`` -> [24, 36, ..., 168] (inclusive); ``"24,36"`` -> [24, 36]."""
    try:
        if ":" in text:
            start, stop, step = (int(v) for v in text.split(":"))
            if step < 1 or start < 1 or stop < start:
                raise ValueError
            return list(range(start, stop + 1, step))
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: START:STOP:STEP or a list of positive counts") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: program counts are positive")
    return values


def grid_counts(minimum: int, per_head: int, wanted: list[int]) -> list[int]:
    """The launchable counts of ``wanted`` (a count launches whole heads' worth of the grid,
    ``per_head`` programs each, and never fewer than ``minimum``), without repeats."""
    out: list[int] = []
    for n in wanted:
        if n < minimum:
            continue
        launched = -(-n // per_head) * per_head
        if launched not in out:
            out.append(launched)
    return out


def good_residues(rows: list[dict[str, Any]], within: float) -> list[int]:
    """Residues (programs modulo the multiprocessors) of the rows within ``within`` (a
    fraction) of the fastest row."""
    best = min(r["ms"] for r in rows)
    return sorted({r["residue"] for r in rows if r["ms"] <= best * (1 + within)})


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Attention grid sweep: {result['model']} {result['dtype']}, {result['gpu']} "
             f"({result['sms']} multiprocessors), {result['date']}", ""]
    for shape, s in result["shapes"].items():
        lines += [f"## {shape}: fewest {s['fewest']} programs ({s['per_head']} a head); "
                  f"default (table) {s['table_programs']}", "",
                  "| programs | mod SMs | ms | vs fewest |", "|---|---|---|---|"]
        base = next(r["ms"] for r in s["rows"] if r["variant"] == "fewest")
        for r in sorted(s["rows"], key=lambda r: (r["programs"], r["variant"])):
            tag = "" if r["variant"] == "count" else f" ({r['variant']})"
            lines.append(f"| {r['programs']}{tag} | {r['residue']} | {r['ms']:.4f} | "
                         f"{100 * (r['ms'] / base - 1):+.1f}% |")
        lines += ["", f"Within {100 * result['within']:.0f}% of the best: residues "
                  f"{s['good_residues']}", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-base")
    p.add_argument("--dtype", default="fp8")
    p.add_argument("--calibrate", action="store_true", help="static FP8 scales (fp8 only)")
    p.add_argument("--shapes", default="1x128,2x64,4x32,8x16")
    p.add_argument("--programs", type=parse_range, default=parse_range("24:156:12"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--within", type=float, default=0.01)
    p.add_argument("--commit", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.calibrate and args.dtype != "fp8":
        p.error("--calibrate needs --dtype fp8")

    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch
    from rich.progress import track

    from benchmarks.bench_gpu import device_packed, make_hf, make_ours, random_padded
    from benchmarks.rounds import cuda_ms, interleaved
    from engine.fused import dispatch, kernels
    from engine.fused.engine import FusedEngine
    from engine.fused.packing import round_tokens

    model, cfg = make_hf(args.model)
    base = make_ours(model, cfg, dtype=args.dtype)
    del model
    if args.calibrate:
        base.calibrate(*random_padded(np.random.default_rng(6), 256, 384,
                                      lengths=np.full(256, 128)))
    heads = cfg.num_attention_heads
    sms = dispatch.multiprocessors(torch.device("cuda"))
    rng = np.random.default_rng(5)
    calls: dict[str, Any] = {}
    result: dict[str, Any] = {
        "model": args.model, "dtype": args.dtype, "calibrated": args.calibrate,
        "gpu": torch.cuda.get_device_name(), "sms": sms, "commit": args.commit,
        "date": time.strftime("%Y-%m-%d"), "within": args.within, "shapes": {}}
    plan = []
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        tokens = batch * seq
        bucket_seqs = 1 << max(0, (batch - 1).bit_length())  # packing.bucket_for's
        max_seqlen = -(-seq // 128) * 128
        bm = kernels.attention_config(max_seqlen, bucket_seqs, heads, cfg.hidden_size // heads,
                                      tokens)[0]
        per_head = -(-max_seqlen // bm) * bucket_seqs
        fewest = per_head * heads
        counts = grid_counts(fewest, per_head, args.programs)
        result["shapes"][shape] = {"fewest": fewest, "per_head": per_head, "rows": []}
        bucket = (round_tokens(tokens), bucket_seqs, max_seqlen)
        plan += [(shape, batch, seq, bucket, v, n) for v, n in
                 [("fewest", "fewest"), ("table", "table")] + [("count", n) for n in counts]]
    with torch.inference_mode():
        programs = {}
        for shape, batch, seq, bucket, variant, grid in track(plan, description="capturing"):
            eng = FusedEngine(base.weights, "cuda", max_graph_tokens=65536,
                              fp8_calibration=base.calibration, attention_grid=grid)
            x = device_packed(*random_padded(rng, batch, seq, lengths=np.full(batch, seq)))
            eng._run_device(*x)  # captures the shape's graph
            name = f"{shape}|{variant}|{grid}"
            s = result["shapes"][shape]
            programs[name] = launched(eng, *bucket, s["fewest"], s["per_head"])
            calls[name] = (lambda e=eng, x=x: e._run_device(*x))
        times = interleaved(calls, args.rounds, args.reps, warm=10, timer=cuda_ms)
    for name, ms in times.items():
        shape, variant, _ = name.split("|")
        n = programs[name]
        result["shapes"][shape]["rows"].append({
            "variant": variant, "programs": n, "residue": n % sms,
            "ms": statistics.median(ms), "round_ms": ms})
    for s in result["shapes"].values():
        s["table_programs"] = next(r["programs"] for r in s["rows"] if r["variant"] == "table")
        s["good_residues"] = good_residues(s["rows"], args.within)
    report = markdown(result)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text(report)


def launched(eng: Any, tokens: int, seqs: int, max_seqlen: int, fewest: int,
             per_head: int) -> int:
    """How many programs the engine's deferred-layer attention launches for this bucket
    (``encoder._attention_programs``, rounded up to whole heads as the kernel does)."""
    import torch

    from engine.fused import encoder

    e4m3 = eng.options.fp8_deferred and eng.weights.folded8 is not None
    wanted = encoder._attention_programs(eng.ops, eng.weights, eng.options, tokens, seqs,
                                         max_seqlen, e4m3, torch.device("cuda"))
    return max(fewest, -(-(wanted or 0) // per_head) * per_head)


if __name__ == "__main__":
    main()
