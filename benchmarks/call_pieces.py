"""The host cost of each piece of a call on device tensors (``FusedEngine._run_device``),
each in a tight loop, batch 1, calibrated FP8 (random weights).

    python benchmarks/call_pieces.py [--model bert-base] [--seq 128] [--out F.json]

``launch_cost.py`` times whole calls with CUDA events, the GPU idle before each (as
``bench_gpu``'s per-call rows): there ``_run_device`` on one input set starts the graph
12 µs later than a bare driver launch (H200, v33), and what it does after its launch does
not delay the graph. This splits its path before the launch: the engine's lock, the bucket
lookup, ``GraphCache.replay_into``'s checks of the tensors (``graphs.staged_tensors_fit``),
the raw stream, the stream ordering, the argument values, the context check, the argument
comparison; then
``torch.empty`` (the next call's output, made after the launch), a few tensor accessors,
and the whole of ``_run_device`` and of ``replay_into`` with the launch a no-op (the
spare output still made and named; since v34 ``_run_device`` skips the bucket lookup for a
batch size it has served, ``GraphCache.routes``, so its row no longer holds that piece).
Best of ``--rounds`` repeats of ``--calls`` calls, µs.
These are the pieces of the Python path (``graphs.NATIVE_LAUNCH`` off here): since v34 a
call takes the compiled path (``engine.fused.staged_launch``) where it builds, which does
the checks, argument values, context check, argument sets and launch in one call;
``launch_cost.py`` times both paths' whole calls.
"""

from __future__ import annotations

import json
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import batch1_parser, tool_engine

    p = batch1_parser(__doc__, calls=2000, calls_help="per piece and repeat")
    args = p.parse_args()
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, random_padded
    from engine.fused import graphs as graphs_module
    from engine.fused.graphs import staged_tensors_fit

    graphs_module.NATIVE_LAUNCH = False  # the Python path's pieces (captured so below)
    eng, _ = tool_engine(args.model, "fp8", {}, random_padded(np.random.default_rng(7), 64,
                                                              384))
    ids, tt, pos, cu, max_len = device_packed(*random_padded(np.random.default_rng(0), 1,
                                                              args.seq))
    graphs = eng._graphs
    assert graphs is not None
    t = ids.shape[0]
    with torch.inference_mode():
        eng._run_device(ids, tt, pos, cu, max_len)
        torch.cuda.synchronize()
        bucket = eng._graph_bucket(t, 1, max_len)
        assert bucket is not None
        entry = graphs._graphs[bucket]
        call_args = entry.args
        assert call_args is not None
        named, index, stream = call_args.named, graphs._index, graphs._current_stream()
        assert named is not None

        def locked() -> None:
            with eng._lock:
                pass

        def context() -> None:
            graphs._context.leave(graphs._context.enter())

        pieces: dict[str, Callable[[], Any]] = {
            "engine lock": locked,
            "_graph_bucket": lambda: eng._graph_bucket(t, 1, max_len),
            "stages_itself": lambda: graphs.stages_itself(bucket),
            "graph dict lookup": lambda: graphs._graphs.get(bucket),
            "tensor checks": lambda: staged_tensors_fit(ids, tt, pos, cu, index),
            "raw current stream": graphs._current_stream,
            "_follow, same stream": lambda: graphs._follow(stream),
            "argument values": lambda: (ids.data_ptr(), tt.data_ptr(), pos.data_ptr(),
                                        cu.data_ptr(), t, 1),
            "context enter + leave": context,
            "name, unchanged": lambda: call_args.name(*named),
            "torch.empty (after the launch)": lambda: torch.empty((2, bucket.tokens),
                                                                  device="cuda"),
            "tensor.shape[0]": lambda: ids.shape[0],
            "tensor.data_ptr()": ids.data_ptr,
            "tensor.get_device()": ids.get_device,
            "tensor.is_contiguous()": ids.is_contiguous,
            "dtype == torch.int32": lambda: ids.dtype == torch.int32,
        }
        real = entry.launch
        entry.launch = lambda s: None  # type: ignore[assignment]
        try:
            pieces["_run_device, launch a no-op"] = lambda: eng._run_device(ids, tt, pos, cu,
                                                                           max_len)
            pieces["replay_into, launch a no-op"] = lambda: graphs.replay_into(bucket, ids,
                                                                              tt, pos, cu)
            rows = {}
            for name, fn in pieces.items():
                best = min(timeit.repeat(fn, number=args.calls, repeat=args.rounds)) / args.calls
                rows[name] = best * 1e6
                print(f"{name:32s} {rows[name]:6.2f} us", flush=True)
        finally:
            entry.launch = real
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "model": args.model, "seq": args.seq, "gpu": torch.cuda.get_device_name(),
            "date": time.strftime("%Y-%m-%d"), "calls": args.calls, "best_us": rows},
            indent=1))


if __name__ == "__main__":
    main()
