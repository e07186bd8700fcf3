"""The BERT-large SQuAD mix pass (eager, the calibrated FP8 default) under module-constant
settings, each timed at a settled power limit.

    python3 benchmarks/mix_settings.py --commit SHA --out settings.json \\
        --set tile2k:engine.fused.kernels.rows.ROW_TILE_LARGE='(2048, 2)' \\
        --set tile1k:engine.fused.kernels.rows.ROW_TILE_LARGE='(1024, 1)'

Each ``--set NAME:module.ATTR=VALUE`` (``ab_replay.parse_setting``; several for one NAME
combine) makes a variant that runs with those constants set, the others at their
defaults; each ``--option NAME:keyword=VALUE`` (several for one NAME combine) a variant
that runs another engine on the baseline's weights and calibration, built with those
``FusedEngine`` keywords (e.g. ``--option int8:int8_gemms='"attn_out,ffn_in"'``; a NAME
given both runs that engine with those constants set);
``baseline`` (nothing set) runs first and again last. Launch choices that are
module constants (the row kernels' tiles, say) are read at each eager launch, so a variant
takes effect from its first pass. Each variant runs ``--settle-s`` at load, then is timed
for ``--timed-s`` with SM clock and board power (``benchmarks/settled``): at the 700 W cap
a step's saving is its whole time in the pass (``engine/fused/NOTES.md`` v39), so
this is the A/B for a kernel's launch choices inside the pass. Every variant's logits are
compared with the baseline's. With ``--profile``, each variant's kernels are then timed
from the profiler over a few passes (µs a pass by kernel name, after the settled rows, so
at the clock the cap settled at): where a variant's time moved. Ends with a table.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parse_option(text: str) -> tuple[str, str, Any]:
    """``NAME:keyword=VALUE`` (VALUE a Python literal) -> (NAME, keyword, value)."""
    import ast

    name, sep, rest = text.partition(":")
    key, eq, value = rest.partition("=")
    if not (sep and eq and name and key.isidentifier()):
        raise ValueError(f"bad option {text!r}: NAME:keyword=VALUE")
    try:
        return name, key, ast.literal_eval(value)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"bad option {text!r}: {value!r} is not a Python literal") from exc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", dest="settings", action="append", default=[],
                   help="NAME:module.ATTR=VALUE (a Python literal); repeat per setting")
    sys.path.insert(0, str(REPO))
    from benchmarks.ab_replay import parse_setting
    from benchmarks.settled import add_mix_args, finish, mix_result, settled_variants

    p.add_argument("--option", dest="options", action="append", default=[],
                   help="NAME:keyword=VALUE (a Python literal): a FusedEngine keyword")
    p.add_argument("--profile", action="store_true",
                   help="also time each variant's kernels by name from the profiler")
    add_mix_args(p)
    args = p.parse_args()

    try:
        settings = [parse_setting(s) for s in args.settings]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    try:
        options = [parse_option(o) for o in args.options]
    except ValueError as exc:
        p.error(str(exc))
    if not settings and not options:
        p.error("give at least one --set or --option")
    variants: dict[str, list[tuple[Any, str, Any]]] = {}
    for name, module, attr, value in settings:
        variants.setdefault(name, []).append((importlib.import_module(module), attr, value))
    engine_options: dict[str, dict[str, Any]] = {}
    for name, key, value in options:
        engine_options.setdefault(name, {})[key] = value
    if "baseline" in variants or "baseline" in engine_options:
        p.error("'baseline' is the variant with nothing set; name yours otherwise")
    defaults = {(id(m), attr): (m, attr, getattr(m, attr))
                for sets in variants.values() for m, attr, _ in sets}

    def apply(name: str) -> None:
        for m, attr, value in defaults.values():
            setattr(m, attr, value)
        for m, attr, value in variants.get(name, []):
            setattr(m, attr, value)

    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows
    from engine.fused.engine import FusedEngine

    engine = mix_engine("bert-large")  # the calibrated default (int8 out-projection, FFN1)
    engines = {name: FusedEngine(engine.weights, "cuda", fp8_calibration=engine.calibration,
                                 **kw) for name, kw in engine_options.items()}
    batch = mix_windows(np.random.default_rng(3), args.windows)
    packed = device_packed(*batch)
    order = ["baseline", *dict.fromkeys([*variants, *engines]), "baseline_again"]
    result = mix_result(args, int(batch[1].sum()),
                        settings={n: [f"{m.__name__}.{a}={v!r}" for m, a, v in s]
                                  for n, s in variants.items()},
                        engine_options={n: {k: repr(v) for k, v in kw.items()}
                                        for n, kw in engine_options.items()},
                        max_abs_logit_diff={})

    def ready(name: str) -> Any:
        def go() -> Any:
            apply(name)
            eng = engines.get(name, engine)
            return lambda x: eng._run_device(*x)
        return go

    try:
        with torch.inference_mode():
            reference = engine._run_device(*packed)
            for name in dict.fromkeys([*variants, *engines]):
                apply(name)
                result["max_abs_logit_diff"][name] = (
                    engines.get(name, engine)._run_device(*packed) - reference).abs().max().item()
            print(f"max |logit - baseline's|: {result['max_abs_logit_diff']}", flush=True)
            settled_variants(result, order, ready, packed, args, args.profile)
    finally:
        apply("baseline")
    finish(args, result)


if __name__ == "__main__":
    main()
