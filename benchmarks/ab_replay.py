"""A/B of engine options by CUDA-graph replay alone (inputs resident), interleaved rounds.

One random-weight model (``bench_gpu.MODELS`` or ``TOOL_MODELS``), one batch shape, and
engines that share its weights but differ in options; each engine's graph for the shape is
replayed ``--iters`` times per round, the engines taking turns for ``--rounds`` rounds so
that clock and thermal drift hit them alike. Prints a table (median of the rounds'
per-replay means, min-max over rounds) and writes it as JSON. Also checks that every
variant's logits agree with the first variant's.

    python3 benchmarks/ab_replay.py --model bert-large --shape 1x384 \\
        --variant base='{}' --variant no_prefetch='{"prefetch": false}' --out ab.json

``--shape mixN`` runs N windows with SQuAD dev lengths (``bench_gpu.squad_lengths``);
``--dtype fp8`` builds the e4m3 engine; a variant's ``"fp8_scaling": "blocks"`` packs its
own block-scaled weights, and ``"calibrate": true`` calibrates its static FP8 scales
(``FusedEngine.calibrate``) on 256 other windows of the same lengths first.
``"repeat_layers": N`` runs the model with its first N layers repeated up to its depth
(the same tensors, so for small N the weights stay in L2 between uses): the time a pass
would take if no weight had to come from HBM, an upper bound of any saving on the weight
stream (its logits differ from the other variants', being another model's).
``--setup module:function`` calls that function once, before any engine is built (e.g.
``benchmarks.cutlass_small:install``, which swaps kernels that ``--set`` then picks per
variant). ``--set NAME:module.ATTR=VALUE`` sets a module constant (a Python literal) while variant
NAME's graph is captured, and restores it after: launch choices that are not engine
options (e.g. the row kernels' tiles, ``engine.fused.kernels.rows.ROW_TILE_LARGE``) are
fixed into the graph at capture. Set the module that *reads* the constant (a re-export
elsewhere changes nothing).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# A variant's options that are this tool's own (see the docstring), not engine keywords,
# with their defaults.
OWN_OPTIONS: dict[str, Any] = {"fp8_scaling": "rows", "calibrate": False,
                               "repeat_layers": None}


def _tuples(value: Any) -> Any:
    """JSON lists as tuples, at any depth (engine options take tuples: tiles, plans)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=JSON-object`` -> (NAME, engine options)."""
    name, _, options = text.partition("=")
    parsed = json.loads(options or "{}")
    if not name or not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected NAME=JSON-object, got {text!r}")
    return name, _tuples(parsed)


def repeated_layers(weights: Any, n: int) -> Any:
    """``weights`` (``BertQAWeights``) with layer ``i`` replaced by layer ``i % n``, the
    same tensors (folded and calibrated copies too); no flat storage, which holds distinct
    layers."""
    import dataclasses

    depth = len(weights.layers)
    if not 1 <= n <= depth:
        raise ValueError(f"repeat_layers must be 1..{depth}, got {n}")

    def cycle(per_layer: Any) -> Any:
        return None if per_layer is None else tuple(per_layer[i % n] for i in range(depth))

    return dataclasses.replace(weights, layers=cycle(weights.layers), flat=None,
                               folded=cycle(weights.folded),
                               calibrated=cycle(weights.calibrated),
                               folded8=cycle(weights.folded8))


def parse_setting(text: str) -> tuple[str, str, str, Any]:
    """``NAME:module.ATTR=VALUE`` -> (NAME, module, ATTR, VALUE as a Python literal)."""
    name, _, rest = text.partition(":")
    target, _, value = rest.partition("=")
    module, _, attr = target.rpartition(".")
    if not (name and module and attr and value):
        raise argparse.ArgumentTypeError(f"expected NAME:module.ATTR=VALUE, got {text!r}")
    return name, module, attr, ast.literal_eval(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-large",
                   help="bert-base, bert-large or minilm-l6 (bench_gpu's model shapes)")
    p.add_argument("--shape", default="1x384",
                   help="BATCHxSEQ (full-length windows) or mixN (SQuAD dev lengths)")
    p.add_argument("--dtype", default="float16", help="float16, bfloat16 or fp8")
    p.add_argument("--set", type=parse_setting, action="append", default=[],
                   help="NAME:module.ATTR=VALUE while variant NAME is captured")
    p.add_argument("--setup", default=None, help="module:function to call before the engines")
    p.add_argument("--variant", type=_variant, action="append", required=True,
                   help="NAME=JSON engine options (the first is the reference)")
    p.add_argument("--idle", action="store_true",
                   help="time each replay alone, the GPU idle before it (rounds.idle_ms: "
                        "median per round) instead of back-to-back replays")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    names = {name for name, _ in args.variant}
    for name, *_ in args.set:
        if name not in names:
            p.error(f"--set names variant {name!r}, which is not one of {sorted(names)}")
    sys.path.insert(0, str(REPO))
    for _, module, attr, _ in args.set:  # a typo would silently A/B identical graphs
        if not hasattr(importlib.import_module(module), attr):
            p.error(f"--set: {module} has no attribute {attr!r}")
    if args.setup:
        module, _, func = args.setup.partition(":")
        getattr(importlib.import_module(module), func)()
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, make_hf, make_ours, random_padded, squad_lengths
    from benchmarks.rounds import cuda_ms, idle_ms, interleaved
    from engine.fused.engine import FusedEngine

    rng = np.random.default_rng(5)
    if args.shape.startswith("mix"):
        batch, seq = int(args.shape[3:]), 384
        lengths = rng.choice(squad_lengths(), batch)
    else:
        batch, seq = (int(v) for v in args.shape.split("x"))
        lengths = np.full(batch, seq)
    model, cfg = make_hf(args.model)
    weights: dict[str, Any] = {}  # per fp8_scaling (a packing choice, not an engine option)
    engines = {}
    for name, opts in args.variant:
        opts = dict(opts)
        own = {key: opts.pop(key, default) for key, default in OWN_OPTIONS.items()}
        scaling, calibrate, repeat = own["fp8_scaling"], own["calibrate"], own["repeat_layers"]
        if scaling not in weights:
            weights[scaling] = make_ours(model, cfg, dtype=args.dtype,
                                         fp8_scaling=scaling).weights
        used = weights[scaling] if repeat is None else repeated_layers(weights[scaling], repeat)
        engines[name] = FusedEngine(used, "cuda",  # type: ignore[arg-type]
                                    **{"max_graph_tokens": 65536, **opts})
        if calibrate:
            cal_rng = np.random.default_rng(6)
            cal_lengths = cal_rng.choice(squad_lengths(), 256) if args.shape.startswith(
                "mix") else np.full(256, seq)
            engines[name].calibrate(*random_padded(cal_rng, 256, 384, lengths=cal_lengths))
    del model
    x = device_packed(*random_padded(rng, batch, seq, lengths=lengths))
    replays = {}
    ref = None
    result: dict[str, Any] = {"model": args.model, "shape": args.shape, "dtype": args.dtype,
                              "gpu": torch.cuda.get_device_name(), "variants": {}}
    with torch.inference_mode():
        for name, eng in engines.items():
            saved = []
            for _, module, attr, value in (t for t in args.set if t[0] == name):
                mod = importlib.import_module(module)
                saved.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, value)
            out = eng._run_device(*x)  # captures this shape's graph
            for mod, attr, old in reversed(saved):
                setattr(mod, attr, old)
            ref = out if ref is None else ref
            bucket = eng._graph_bucket(x[0].shape[0], x[3].shape[0] - 1, x[4])
            assert bucket is not None and eng._graphs is not None, "no graph for this shape"
            replays[name] = (eng._graphs, bucket)
            result["variants"][name] = {
                "options": dict(args.variant)[name],
                "set": [t[1:] for t in args.set if t[0] == name],
                "max_abs_vs_first": float((out - ref).abs().max())}
        times = interleaved({name: lambda g=graphs, b=bucket: g.replay(b)
                             for name, (graphs, bucket) in replays.items()},
                            args.rounds, args.iters, warm=10,
                            timer=idle_ms if args.idle else cuda_ms)
        for name, ms in times.items():
            result["variants"][name]["round_ms"] = ms
    result["timing"] = "idle" if args.idle else "back to back"
    print(f"{args.model} {args.shape}, graph replay ms ({result['timing']}, {args.rounds} "
          f"rounds x {args.iters}):")
    for name, v in result["variants"].items():
        v["median_ms"] = statistics.median(v["round_ms"])
        print(f"  {name:24s} {v['median_ms']:.4f}  ({min(v['round_ms']):.4f}-"
              f"{max(v['round_ms']):.4f})  max|diff| {v['max_abs_vs_first']:.1e}")
    result["date"] = time.strftime("%Y-%m-%d")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
