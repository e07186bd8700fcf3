"""What CUDA graphs and their bucket padding cost on many-token batches: graphs at several
bucket granularities against exact-size eager passes, per call, same inputs, interleaved
rounds, at several batch sizes (where eager passes overtake graphs).

    python3 benchmarks/bucket_padding.py --model bert-large --dtype fp8 \\
        --windows 32,64,128,256 --per-octave 8,64 --out bucket.json

A graph runs its bucket's token count (``packing.round_tokens``: up to 1/per_octave of
padding, 12.5% at the default 8), the GEMMs and row kernels over every padded row;
an eager pass (``cuda_graphs=False``) runs exactly the batch's tokens, paying the host's
launches instead, which at tens of thousands of tokens the GPU's work hides. The batches
are, per entry of ``--windows``, ``--draws`` sets of that many windows with SQuAD v1.1 dev lengths
(``bench_gpu.squad_lengths``, the mix of ``bench_gpu --sections mix``). ``--dtype fp8``
times the calibrated default engine (static FP8 scales from 256 other windows), ``float16``
the fp16 one. Each variant calls ``FusedEngine._run_device`` (the path for device
tensors) on every draw in turn, ``--calls`` times per round, for ``--rounds`` rounds;
the table gives the median of the rounds' per-batch means. Random weights (timing only);
every variant's logits are checked against the eager pass's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _positive_ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-large")
    p.add_argument("--dtype", default="fp8", choices=("fp8", "float16"))
    p.add_argument("--windows", type=_positive_ints, default=[256],
                   help="batch sizes in windows (comma-separated)")
    p.add_argument("--draws", type=int, default=4)
    p.add_argument("--per-octave", type=_positive_ints, default=[8, 32, 64],
                   help="graph bucket granularities to time (comma-separated)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=10, help="calls per draw per round")
    p.add_argument("--commit", default="", help="recorded with the results")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    from benchmarks.bench_gpu import mix_engine, mix_windows
    from engine.fused.engine import FusedEngine

    base = mix_engine(args.model, args.dtype)
    common = {"max_graph_tokens": 1 << 20, "fp8_calibration": base.calibration}
    engines: dict[str, FusedEngine] = {"eager": FusedEngine(base.weights, "cuda",
                                                             cuda_graphs=False, **common)}
    for k in args.per_octave:
        engines[f"graph/{k}"] = FusedEngine(base.weights, "cuda", graph_buckets_per_octave=k,
                                            **common)
    result: dict[str, Any] = {
        "model": args.model, "dtype": args.dtype, "gpu": torch.cuda.get_device_name(),
        "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "batches": []}
    rng = np.random.default_rng(3)
    for windows in args.windows:
        sets = [mix_windows(rng, windows) for _ in range(args.draws)]
        result["batches"].append(time_batches(engines, sets, args.rounds, args.calls))
    print(f"\n{args.model} {args.dtype}, {args.draws} draws per batch size, per call:")
    print(f"  {'windows':>7s} {'tokens':>13s} {'variant':10s} {'padding':>8s} "
          f"{'ms/batch':>9s} {'range':>15s} {'windows/s':>10s} {'max|diff|':>9s}")
    for b in result["batches"]:
        for name, v in b["variants"].items():
            print(f"  {b['windows']:7d} {min(b['tokens']):6d}-{max(b['tokens']):6d} "
                  f"{name:10s} {100 * v['padding']:7.2f}% {v['median_ms']:9.3f} "
                  f"{min(v['round_ms']):7.3f}-{max(v['round_ms']):7.3f} "
                  f"{v['windows_per_s']:10.0f} {v['max_abs_vs_eager']:9.1e}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


def time_batches(engines: dict[str, Any], sets: list[Any], rounds: int,
                 calls: int) -> dict[str, Any]:
    """Per-call ms of every engine on these padded batches, interleaved rounds."""
    import torch

    from benchmarks.bench_gpu import device_packed
    from benchmarks.rounds import interleaved
    from engine.fused.packing import round_tokens

    inputs = [device_packed(*s) for s in sets]
    tokens = [int(s[1].sum()) for s in sets]
    windows = int(sets[0][0].shape[0])
    out: dict[str, Any] = {"windows": windows, "tokens": tokens, "variants": {}}
    with torch.inference_mode():
        ref = [engines["eager"]._run_device(*x) for x in inputs]
        for name, eng in engines.items():
            k = eng.graph_buckets_per_octave if eng.cuda_graphs else None
            buckets = [round_tokens(t, k) if k else t for t in tokens]
            diff = max(float((eng._run_device(*x) - r).abs().max())
                       for x, r in zip(inputs, ref, strict=True))
            out["variants"][name] = {"bucket_tokens": buckets, "max_abs_vs_eager": diff,
                                     "padding": sum(buckets) / sum(tokens) - 1}
        torch.cuda.synchronize()

        def batches(eng: Any) -> Callable[[], None]:  # one call per draw
            def run() -> None:
                for x in inputs:
                    eng._run_device(*x)
            return run

        times = interleaved(
            {name: batches(eng) for name, eng in engines.items()}, rounds, calls,
            report=lambda r, ms: print(f"{windows} windows, round {r + 1}/{rounds}: " + " ".join(
                f"{n}={t / len(inputs):.2f}" for n, t in ms.items()), flush=True))
    for name, ms in times.items():
        out["variants"][name]["round_ms"] = [t / len(inputs) for t in ms]
    for v in out["variants"].values():
        v["median_ms"] = statistics.median(v["round_ms"])
        v["windows_per_s"] = windows / v["median_ms"] * 1e3
    return out


if __name__ == "__main__":
    main()
