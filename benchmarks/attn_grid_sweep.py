"""Whole-pass time against the query blocks a sequence gets in the deferred layer's
attention grid (``dispatch.QUERY_BLOCKS``, the engine's ``attention_grid``).

    python3 benchmarks/attn_grid_sweep.py --model bert-base --dtype fp8 --calibrate \\
        --shapes 1x128,2x64,4x32,8x16 --blocks 2:8 --out sweep.json

For each batch shape (full-length windows, one CUDA-graph bucket each) and each count of
``--blocks`` (START:STOP[:STEP], inclusive, or a list; counts under the bucket's fewest
are skipped), one engine with ``attention_grid`` set to that count captures the shape's
graph; the fewest (``"fewest"``) and the engine's default (``"table"``) run too. All of
them share the weights and one FP8 calibration, and take turns for ``--rounds`` rounds of
back-to-back calls on device tensors (``_run_device``, CUDA events), so that drift hits
them alike. Prints one table per shape (blocks, programs, ms, against the fewest) and the
fastest count where it beats the fewest by more than ``--within``: a candidate for
``dispatch.QUERY_BLOCKS`` (sequences in the bucket -> blocks). Writes the tables as JSON
and markdown. Random weights.
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
    """``"2:8"`` -> [2, ..., 8], ``"2:8:2"`` -> [2, 4, 6, 8] (inclusive); ``"2,4"`` -> [2, 4]."""
    try:
        if ":" in text:
            start, stop, *step = (int(v) for v in text.split(":"))
            if len(step) > 1 or start < 1 or stop < start or (step and step[0] < 1):
                raise ValueError
            return list(range(start, stop + 1, step[0] if step else 1))
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: START:STOP[:STEP] or a list of positive counts") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: block counts are positive")
    return values


def suggestion(rows: list[dict[str, Any]], within: float) -> int | None:
    """The fastest row's block count where it beats the fewest grid by more than
    ``within`` (a fraction), else None."""
    fewest = next(r["ms"] for r in rows if r["variant"] == "fewest")
    best = min(rows, key=lambda r: r["ms"])
    return int(best["blocks"]) if best["ms"] < fewest * (1 - within) else None


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Attention grid sweep: {result['model']} {result['dtype']}, {result['gpu']}, "
             f"commit {result['commit'] or '?'}, {result['date']}", ""]
    for shape, s in result["shapes"].items():
        lines += [f"## {shape} ({s['seqs']} sequences a bucket): fewest {s['fewest']} blocks, "
                  f"default (table) {s['table_blocks']}", "",
                  "| blocks | programs | ms | vs fewest |", "|---|---|---|---|"]
        base = next(r["ms"] for r in s["rows"] if r["variant"] == "fewest")
        for r in sorted(s["rows"], key=lambda r: (r["blocks"], r["variant"])):
            tag = "" if r["variant"] == "count" else f" ({r['variant']})"
            lines.append(f"| {r['blocks']}{tag} | {r['programs']} | {r['ms']:.4f} | "
                         f"{100 * (r['ms'] / base - 1):+.1f}% |")
        best = s["suggestion"]
        lines += ["", f"Faster than the fewest by over {100 * result['within']:.0f}%: "
                  + (f"{best} blocks" if best else "none"), ""]
    return "\n".join(lines)


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import calibrated_engine, engine_parser

    p = engine_parser(__doc__, rounds=5, reps=100)
    p.add_argument("--shapes", default="1x128,2x64,4x32,8x16")
    p.add_argument("--blocks", type=parse_range, default=parse_range("2:8"))
    p.add_argument("--within", type=float, default=0.01)
    args = p.parse_args()
    import numpy as np
    import torch
    from rich.progress import track

    from benchmarks.bench_gpu import device_packed, random_padded
    from benchmarks.rounds import cuda_ms, interleaved
    from engine.fused import kernels
    from engine.fused.engine import FusedEngine
    from engine.fused.packing import bucket_for

    base, cfg = calibrated_engine(args)
    heads = cfg.num_attention_heads
    rng = np.random.default_rng(5)
    calls: dict[str, Any] = {}
    blocks: dict[str, int] = {}
    result: dict[str, Any] = {
        "model": args.model, "dtype": args.dtype, "calibrated": args.calibrate,
        "gpu": torch.cuda.get_device_name(), "commit": args.commit,
        "date": time.strftime("%Y-%m-%d"), "within": args.within, "shapes": {}}
    plan = []
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        bucket = bucket_for(batch * seq, batch, seq)
        bm = kernels.attention_config(bucket.max_seqlen, bucket.seqs, heads,
                                      cfg.hidden_size // heads, bucket.tokens)[0]
        fewest = -(-bucket.max_seqlen // bm)
        result["shapes"][shape] = {"seqs": bucket.seqs, "fewest": fewest, "block_m": bm,
                                   "rows": []}
        plan += [(shape, batch, seq, bucket, v, n) for v, n in
                 [("fewest", "fewest"), ("table", "table")]
                 + [("count", n) for n in args.blocks if n >= fewest]]
    with torch.inference_mode():
        for shape, batch, seq, bucket, variant, grid in track(plan, description="capturing"):
            eng = FusedEngine(base.weights, "cuda", max_graph_tokens=65536,
                              fp8_calibration=base.calibration, attention_grid=grid)
            x = device_packed(*random_padded(rng, batch, seq, lengths=np.full(batch, seq)))
            eng._run_device(*x)  # captures the shape's graph
            name = f"{shape}|{variant}|{grid}"
            blocks[name] = graph_blocks(eng, bucket, result["shapes"][shape]["block_m"])
            calls[name] = (lambda e=eng, x=x: e._run_device(*x))
        times = interleaved(calls, args.rounds, args.reps, warm=10, timer=cuda_ms)
    for name, ms in times.items():
        shape, variant, _ = name.split("|")
        s = result["shapes"][shape]
        s["rows"].append({"variant": variant, "blocks": blocks[name],
                          "programs": blocks[name] * s["seqs"] * heads,
                          "ms": statistics.median(ms), "round_ms": ms})
    for s in result["shapes"].values():
        s["table_blocks"] = next(r["blocks"] for r in s["rows"] if r["variant"] == "table")
        s["suggestion"] = suggestion(s["rows"], args.within)
    report = markdown(result)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text(report)


def graph_blocks(eng: Any, bucket: Any, block_m: int) -> int:
    """Query blocks a sequence in the bucket's graph: the ``max_seqlen`` the engine sized
    the deferred layer's attention grid for (``encoder._attention_seqlen``), in blocks."""
    import torch

    from engine.fused import encoder

    e4m3 = eng.options.fp8_deferred and eng.weights.folded8 is not None
    seqlen = encoder._attention_seqlen(eng.ops, eng.weights, eng.options, bucket.tokens,
                                       bucket.seqs, bucket.max_seqlen, e4m3,
                                       torch.device("cuda"))
    return -(-seqlen // block_m)


if __name__ == "__main__":
    main()
