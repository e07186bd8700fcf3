"""Mix throughput with passes in flight on several CUDA streams at once.

    python3 benchmarks/streams_mix.py --streams 1,2,3 [--shared-workspace] --out streams.json

One calibrated FP8 engine per stream (sharing the weights and static scales), each pass
on the next stream in turn, the way an offline harness keeps a GPU busy: while one pass
runs its attention and LayerNorms (issue- or bandwidth-bound), another's GEMMs could fill
the SMs, and each kernel's tail could overlap the next pass. Variants: the calibrated
default (eager at these sizes) and every GEMM input static, at each entry of ``--streams``
(1: the default stream). A variant's round queues ``--passes`` passes over ``--draws``
batches of ``--windows`` SQuAD dev-length windows and waits for all of them (wall clock,
host and every stream); interleaved rounds, median. Before the rounds, every pass of one
such round (all streams in flight) is checked against the engine's logits on one stream.

``--shared-workspace`` gives every cuBLASLt call one workspace, as ``cublaslt`` did
before each stream (and each graph cache) had its own: it shows what sharing it costs in
correctness (the in-flight check) and what it seemed to gain in speed. Random weights
(timing only).
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-large")
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--draws", type=int, default=4)
    p.add_argument("--streams", default="1,2,3")
    p.add_argument("--passes", type=int, default=24, help="passes per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shared-workspace", action="store_true")
    p.add_argument("--commit", default="")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows, static_everywhere
    from benchmarks.rounds import interleaved, wall_ms
    from engine.fused import cublaslt
    from engine.fused.engine import FusedEngine

    if args.shared_workspace:
        one = torch.empty(cublaslt._WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        cublaslt._workspace = lambda device, stream: one
    base = mix_engine(args.model)
    rng = np.random.default_rng(3)
    packed = [device_packed(*mix_windows(rng, args.windows)) for _ in range(args.draws)]
    counts = [int(v) for v in args.streams.split(",")]
    kinds: dict[str, Callable[[], Any]] = {
        "calibrated": lambda: FusedEngine(base.weights, "cuda"),  # the default (int8 pair)
        "static_all": lambda: static_everywhere(base),
    }
    res: dict[str, Any] = {"model": args.model, "windows": args.windows, "draws": args.draws,
                           "passes": args.passes, "shared_workspace": args.shared_workspace,
                           "commit": args.commit, "gpu": torch.cuda.get_device_name(),
                           "date": time.strftime("%Y-%m-%d"), "variants": {}}
    variants: dict[str, Callable[[], object]] = {}
    with torch.inference_mode():
        for kind, make in kinds.items():
            ref = [make()._run_device(*x) for x in packed]
            for n in counts:
                engines = [make() for _ in range(n)]
                streams = ([torch.cuda.current_stream()] if n == 1
                           else [torch.cuda.Stream() for _ in range(n)])
                for s in streams:
                    s.wait_stream(torch.cuda.current_stream())

                def run(engines: list[Any] = engines, streams: list[Any] = streams,
                        keep: list[Any] | None = None) -> None:
                    for i in range(args.passes):
                        with torch.cuda.stream(streams[i % len(streams)]):
                            out = engines[i % len(engines)]._run_device(*packed[i % args.draws])
                        if keep is not None:
                            keep.append(out)
                    torch.cuda.synchronize()
                kept: list[Any] = []
                run(keep=kept)  # warm-up (plans, compiles) and parity with all streams busy
                diffs = [float((out - ref[i % args.draws]).abs().max())
                         for i, out in enumerate(kept)]
                name = f"{kind} x{n}"
                res["variants"][name] = {"streams": n, "max_abs_vs_one_stream": max(diffs),
                                         "passes_differing": sum(d > 0 for d in diffs)}
                print(f"{name}: max|diff| {max(diffs):.1e} in {sum(d > 0 for d in diffs)} "
                      f"of {len(diffs)} passes", flush=True)
                variants[name] = run

        def report(r: int, ms: dict[str, float]) -> None:  # ms: per round of passes
            print(f"round {r}: " + "  ".join(f"{k} {args.windows * args.passes / v * 1e3:.0f}/s"
                                              for k, v in ms.items()), flush=True)

        times = {name: [t / args.passes for t in ms] for name, ms in interleaved(
            variants, args.rounds, 1, report=report, timer=wall_ms).items()}
    print(f"\n{args.model} mix x{args.windows}, windows/s (median of {args.rounds} rounds, "
          f"{args.passes} passes each{', one shared workspace' * args.shared_workspace}):")
    for name, t in times.items():
        med = statistics.median(t)
        res["variants"][name].update(round_ms_per_pass=t, median_ms_per_pass=med,
                                     windows_per_s=args.windows / med * 1e3)
        print(f"  {name:16} {args.windows / med * 1e3:8.0f}/s  ({med:.3f} ms a pass)")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
