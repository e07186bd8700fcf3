"""The BERT-large SQuAD mix pass with each layer's row-wise steps in row chunks, at the
power cap.

    python3 benchmarks/row_chunks.py --commit SHA --out row_chunks.json
        [--chunks 2048,4096,8192,16384] [--static-chunks 4096] [--windows 256] [--graph]

At 47k tokens each activation the steps after attention hand on is 48-194 MB, more than
the 50 MB L2, so every one goes out to HBM and back: the 47 residual LayerNorms alone move
~16 GB a pass, at HBM bandwidth (v39's ablation: they are 13% of the settled pass on an
H100, and taking any step out saves its whole time). ``row_chunk_tokens``
(``encoder._rows_in_chunks``) runs out-projection, LayerNorm, FFN1, FFN2 and LayerNorm one
chunk of rows at a time, so each chunk's intermediates can be read back from L2. The cost:
GEMMs of fewer rows (more launches, a wave tail each). Each variant of the calibrated
default (and of the all-static pass, for reference) runs ``--settle-s`` at load, then is
timed for ``--timed-s`` with its SM clock and board power (``benchmarks/settled``); the
whole-batch pass runs again last. Each chunked variant's logits are compared with the
whole-batch pass's. Eager passes (the engine's way at this size) launch ~35 µs of host
work a step, so small chunks starve the GPU; ``--graph`` times each variant as one
captured CUDA graph instead, the GPU side alone. Ends with a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def with_chunks(engine: Any, tokens: int | None) -> Any:
    """A shallow copy of ``engine`` (same weights and calibration) whose passes run in row
    chunks of ``tokens`` (None: whole batches)."""
    other = copy.copy(engine)
    other.options = replace(engine.options, row_chunk_tokens=tokens)
    return other


def _sizes(text: str) -> list[int]:
    sizes = [int(v) for v in text.split(",") if v]
    if any(v < 1 for v in sizes):
        raise argparse.ArgumentTypeError(f"chunk sizes must be positive: {text!r}")
    return sizes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--chunks", type=_sizes, default=[2048, 4096, 8192, 16384],
                   help="comma-separated chunk sizes (tokens) for the calibrated default")
    p.add_argument("--static-chunks", type=_sizes, default=[4096],
                   help="chunk sizes for the all-static pass (beside its whole batch)")
    p.add_argument("--settle-s", type=float, default=3.0)
    p.add_argument("--timed-s", type=float, default=1.0)
    p.add_argument("--graph", action="store_true",
                   help="time each variant's pass as a captured CUDA graph (no host cost)")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows, static_everywhere
    from benchmarks.rounds import capture_graph
    from benchmarks.settled import print_table, settled_rows

    engine = mix_engine("bert-large")  # calibrated FP8, the default static inputs
    all_static = static_everywhere(engine)
    batch = mix_windows(np.random.default_rng(3), args.windows)
    packed = device_packed(*batch)
    plan = [("whole", engine)]
    plan += [(f"chunks_{c}", with_chunks(engine, c)) for c in args.chunks]
    plan += [("all_static_whole", all_static)]
    plan += [(f"all_static_chunks_{c}", with_chunks(all_static, c)) for c in args.static_chunks]
    plan += [("whole_again", engine)]
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
        "commit": args.commit, "torch": torch.__version__, "windows": args.windows,
        "tokens": int(batch[1].sum()), "settle_s": args.settle_s, "timed_s": args.timed_s,
        "graph": args.graph, "max_abs_logit_diff": {}, "rows": []}
    with torch.inference_mode():
        reference = {id(engine): engine._run_device(*packed),
                     id(all_static): all_static._run_device(*packed)}
        for name, eng in plan:
            base = engine if eng.options.fp8_static_inputs == engine.options.fp8_static_inputs \
                else all_static
            diff = (eng._run_device(*packed) - reference[id(base)]).abs().max().item()
            result["max_abs_logit_diff"][name] = diff
        print(f"max |logit - whole batch's|: {result['max_abs_logit_diff']}", flush=True)

        def ready(eng: Any) -> Any:
            if not args.graph:
                return lambda: (lambda x: eng._run_device(*x))
            graph = capture_graph(lambda: eng._run_device(*packed), 1)
            return lambda: (lambda _x: graph.replay())

        variants = [(name, ready(eng)) for name, eng in plan]  # graphs captured up front
        result["rows"] = settled_rows(variants, packed, args.windows, args.settle_s,
                                      args.timed_s)
    for row in result["rows"]:
        row["max_abs_logit_diff"] = result["max_abs_logit_diff"][row["variant"]]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print_table(f"BERT-large mix x{args.windows} ({result['tokens']} tokens) in row chunks, "
                f"{'graphs' if args.graph else 'eager'}, {result['gpu']}, settled "
                f"{args.settle_s:g} s, {args.commit}", result["rows"])


if __name__ == "__main__":
    main()
