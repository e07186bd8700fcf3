"""Whole-pass time of batches replayed in CUDA-graph buckets that hold more sequences than
they have: which part of a bucket (its graph, the batch's data) decides a pass's time.

    python3 benchmarks/bucket_probe.py --model bert-base --dtype fp8 --calibrate \\
        --items 1x128@1,1x128@2,2x64@2,2x64@4,4x32@4 --out probe.json

An item ``NxL@S`` is N windows of L tokens in a bucket of S >= N sequences: its
``cu_seqlens`` repeats the last offset S - N times (empty sequences, as a bucket pads a
smaller batch), so a 1x128 batch in a 2-sequence bucket replays the 2x64 batch's graph.
Every item takes the first N x L of one random draw of token ids, with positions
restarting per window. One engine (one FP8 calibration) captures every bucket, and the
items take turns for ``--rounds`` rounds of back-to-back calls on device tensors
(``_run_device``, CUDA events). Prints a table (median ms per call, min-max over rounds)
and writes it as JSON. Random weights.
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


def parse_item(text: str) -> tuple[int, int, int]:
    """``"2x64@4"`` -> (2, 64, 4): windows, tokens each, sequences of the bucket."""
    try:
        shape, seqs = text.split("@")
        n, length = (int(v) for v in shape.split("x"))
        s = int(seqs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: NxL@S, e.g. 2x64@4") from None
    if min(n, length) < 1 or s < n:
        raise argparse.ArgumentTypeError(f"{text!r}: positive sizes and S >= N")
    return n, length, s


def cu_seqlens(n: int, length: int, seqs: int) -> list[int]:
    """Offsets of n windows of ``length`` tokens, then ``seqs - n`` empty sequences."""
    return [i * length for i in range(n + 1)] + [n * length] * (seqs - n)


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import calibrated_engine, cuda_ms, engine_parser, interleaved

    p = engine_parser(__doc__, rounds=6, reps=300)
    p.add_argument("--items", required=True,
                   type=lambda t: [parse_item(v) for v in t.split(",")])
    args = p.parse_args()
    import numpy as np
    import torch

    eng, cfg = calibrated_engine(args, max_graph_tokens=65536)
    most = max(n * length for n, length, _ in args.items)
    rng = np.random.default_rng(5)
    ids = torch.from_numpy(rng.integers(1000, cfg.vocab_size, most).astype(np.int32)).cuda()
    calls: dict[str, Any] = {}
    buckets: dict[str, str] = {}
    with torch.inference_mode():
        for n, length, seqs in args.items:
            t = n * length
            x = (ids[:t], torch.zeros(t, dtype=torch.int32, device="cuda"),
                 torch.arange(length, dtype=torch.int32, device="cuda").repeat(n),
                 torch.tensor(cu_seqlens(n, length, seqs), dtype=torch.int32, device="cuda"),
                 length)
            name = f"{n}x{length}@{seqs}"
            eng._run_device(*x)  # captures the bucket's graph
            buckets[name] = str(eng._graph_bucket(t, seqs, length))
            calls[name] = (lambda x=x: eng._run_device(*x))
        times = interleaved(calls, args.rounds, args.reps, warm=20, timer=cuda_ms)
    result: dict[str, Any] = {
        "model": args.model, "dtype": args.dtype, "calibrated": args.calibrate,
        "gpu": torch.cuda.get_device_name(), "commit": args.commit,
        "date": time.strftime("%Y-%m-%d"), "items": {}}
    print(f"{args.model} {args.dtype}: ms per call, back to back ({args.rounds} rounds x "
          f"{args.reps})")
    for name, ms in times.items():
        result["items"][name] = {"bucket": buckets[name], "median_ms": statistics.median(ms),
                                 "round_ms": ms}
        print(f"  {name:12s} {statistics.median(ms):.4f} ({min(ms):.4f}-{max(ms):.4f})  "
              f"{buckets[name]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
