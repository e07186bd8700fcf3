"""BERT-large throughput over every SQuAD v1.1 dev window once, settled at the power cap.

    python3 benchmarks/mix_dev_sweep.py --commit SHA --out sweep.json

The mix benchmarks (``bench_gpu.py`` section ``mix``, ``mix_settings.py``) time batches of
``--windows`` windows whose lengths are drawn from the dev windows' token counts, so their
windows/s depend on the draw: ``mix_settings``'s one batch holds 185.1 tokens a window,
``bench_gpu``'s four hold 176.3, the dev set 176.0. This tool takes the draw out. Each of
the 10,784 dev windows' lengths is used exactly once, in an order shuffled by ``--seed``,
in batches of ``--windows`` (the last batch holds the rest); token ids are random and the
weights are random (``bench_gpu.mix_engine``: the calibrated default engine), which does
not change the work. One timed call is one sweep over every batch through the engine's
own path (batches this large run eagerly; the last, smaller one may replay a CUDA graph,
captured in the untimed reference sweep); windows/s is the dev set's windows over a
sweep's median time. A sweep takes ~1.35 s at 8,000 windows/s, so ``--timed-s`` under ~11 s times
the 8-sweep minimum.

Variants (``--variants``, default ``default,e4m3,default``): ``default`` (the engine's
defaults), ``e4m3`` (``int8_gemms=None``: every GEMM in e4m3), ``graph`` (the default's
weights with each batch replayed from a CUDA graph of its token bucket, ``max_graph_tokens``
raised; one graph a bucket, so more GPU memory); each settles for
``--settle-s`` and is timed for ``--timed-s`` with SM clock and board power
(``benchmarks/settled``). Ends with a table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def sweep_batches(lengths: Any, windows: int, seed: int) -> list[Any]:
    """Every length in ``lengths`` once, shuffled by ``seed``, as padded batches of
    ``windows`` windows (``bench_gpu.random_padded``; the last holds the rest)."""
    import numpy as np

    from benchmarks.bench_gpu import random_padded

    rng = np.random.default_rng(seed)
    order = rng.permutation(np.asarray(lengths))
    return [random_padded(rng, len(chunk), 384, chunk)
            for chunk in np.array_split(order, range(windows, len(order), windows))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.path.insert(0, str(REPO))
    from benchmarks.settled import add_mix_args, finish, mix_result, ordered_variants, settled_rows

    add_mix_args(p)
    p.add_argument("--seed", type=int, default=0, help="the shuffle of the dev windows")
    p.add_argument("--variants", default="default,e4m3,default",
                   help="comma-separated, from default, e4m3, graph (repeats allowed)")
    args = p.parse_args()
    names = args.variants.split(",")
    if unknown := set(names) - {"default", "e4m3", "graph"}:
        p.error(f"unknown variants {sorted(unknown)}")

    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, squad_lengths
    from engine.fused.engine import FusedEngine

    lengths = squad_lengths()
    batches = [device_packed(*b) for b in sweep_batches(lengths, args.windows, args.seed)]
    tokens = int(sum(int(b[0].shape[0]) for b in batches))
    engine = mix_engine("bert-large")
    engines = {"default": engine}
    if "e4m3" in names:
        engines["e4m3"] = FusedEngine(engine.weights, "cuda",
                                      fp8_calibration=engine.calibration, int8_gemms=None)
    if "graph" in names:
        engines["graph"] = FusedEngine(engine.weights, "cuda",
                                       fp8_calibration=engine.calibration,
                                       max_graph_tokens=1 << 20)

    def sweep_of(eng: FusedEngine) -> Any:
        return lambda bs: [eng._run_device(*b) for b in bs]

    result = mix_result(args, tokens, dev_windows=len(lengths), batches=len(batches),
                        seed=args.seed, mean_tokens_per_window=tokens / len(lengths))
    result["max_abs_logit_diff"] = {"default": 0.0}
    with torch.inference_mode():
        reference = sweep_of(engine)(batches)
        for name, eng in engines.items():
            if eng is engine:
                continue
            out = sweep_of(eng)(batches)
            result["max_abs_logit_diff"][name] = max(
                float((a - b).abs().max()) for a, b in zip(out, reference, strict=True))
        print(f"{len(lengths)} windows, {tokens} tokens ({tokens / len(lengths):.1f} a "
              f"window) in {len(batches)} batches; max |logit - default's|: "
              f"{result['max_abs_logit_diff']}", flush=True)
        plan = ordered_variants(names, lambda n: sweep_of(engines[n]))
        result["rows"] = settled_rows(plan, batches, len(lengths), args.settle_s, args.timed_s)
    args.windows = len(lengths)  # the table's title: windows a timed call
    finish(args, result)


if __name__ == "__main__":
    main()
