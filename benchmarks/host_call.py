"""Where a host call's time goes: ``FusedEngine.infer`` on numpy arrays, batch 1.

    python benchmarks/host_call.py [--model bert-base] [--seq 128] [--calls 400] --out F.json

The numpy path is what the Triton model (``serving``) calls per request: pack the padded
batch, check it, run the bucket's graph, unpack the logits. Wall-clock per call (host
``perf_counter``, the call returns with the logits on the host) for, interleaved over
rounds:

* ``infer_pinned``: the default engine (``graph_staging``): one graph launch that stages
  the batch from pinned host buffers and writes the logits into pinned host memory
  (``GraphCache.run_host``);
* ``infer_copies``: ``graph_staging=False``: a copy into the graph's input buffer, the
  replay, a copy of the logits out;
* ``device_call``: ``_run_device`` on int32 device tensors, synchronised (the engine's
  own per-call number, without packing or the host copies);

and the parts of ``infer_pinned`` (packing and checks, ``run_host``'s buffer fill and
launch, its wait for the acknowledgement). Random weights (fp16); prints a table, writes
JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-base")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--calls", type=int, default=400, help="per variant and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    from benchmarks.bench_gpu import make_hf, make_ours
    from engine.fused.engine import FusedEngine
    from engine.fused.graphs import GraphCache

    model, cfg = make_hf(args.model)
    pinned = make_ours(model, cfg, dtype="float16")
    copies = FusedEngine(pinned.weights, "cuda", graph_staging=False)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, cfg.vocab_size, (1, args.seq)).astype(np.int32)
    mask = np.ones_like(ids)
    tt = np.zeros_like(ids)
    tt[:, args.seq // 4:] = 1
    dev = [torch.from_numpy(a).cuda() for a in (ids[0], tt[0], np.arange(args.seq, dtype=np.int32))]
    cu = torch.tensor([0, args.seq], dtype=torch.int32, device="cuda")

    parts: dict[str, list[float]] = defaultdict(list)
    run_host = GraphCache.run_host

    def timed_run_host(self: Any, *a: Any) -> Any:
        t0 = time.perf_counter()
        out = run_host(self, *a)
        parts["run_host"].append(time.perf_counter() - t0)
        return out

    GraphCache.run_host = timed_run_host  # type: ignore[method-assign]
    table = pinned._graphs._table
    table_wait = table.wait

    def timed_wait(*a: Any) -> None:  # run_host's wait (with its stream), not write()'s
        t0 = time.perf_counter()
        table_wait(*a)
        if a:
            parts["ack_wait"].append(time.perf_counter() - t0)

    table.wait = timed_wait  # type: ignore[method-assign]

    def device_call() -> None:
        pinned._run_device(dev[0], dev[1], dev[2], cu, args.seq)
        torch.cuda.synchronize()

    variants = {"infer_pinned": lambda: pinned.infer(ids, mask, tt),
                "infer_copies": lambda: copies.infer(ids, mask, tt),
                "device_call": device_call}
    a, b = pinned.infer(ids, mask, tt), copies.infer(ids, mask, tt)
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for name, fn in variants.items():
            for _ in range(20):
                fn()
            if name == "infer_pinned":
                parts.clear()
            for _ in range(args.calls):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            if name == "infer_pinned":
                for key in ("run_host", "ack_wait"):
                    times[f"  {key}"] += parts[key]
    rows = {name: {"median_us": statistics.median(v) * 1e6,
                   "p99_us": sorted(v)[int(0.99 * (len(v) - 1))] * 1e6, "calls": len(v)}
            for name, v in times.items()}
    print(f"{args.model} 1x{args.seq}, host wall-clock per call ({args.rounds} rounds x "
          f"{args.calls}); pinned vs copies max|diff| {diff:.1e}")
    print("| variant | median us | p99 us |\n|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['median_us']:.1f} | {r['p99_us']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "seq": args.seq,
                                        "max_abs_diff": diff, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
