"""cuBLASLt configurations for the mix's GEMMs, chosen at a settled power limit.

    python3 benchmarks/gemm_settled.py --commit SHA --out gemm-settled.json

At the 700 W cap the mix pass's time is its energy (``engine/fused/NOTES.md`` v36, v39),
so a GEMM configuration is better for the pass when a call costs less energy, not when it
wins a burst timing (v12's search at 49,152 rows ranked by clock drift; v13's whole-pass
A/B was unsettled). Two stages, one process:

1. **Alone, settled.** For each GEMM (``--gemms``: QKV, FFN1 with bias + GELU + e4m3 out
   and FFN2, all FP8; the out-projection, 16-bit, which the engine runs with ``torch.mm``
   unless the tuned table has a configuration for it, so its "engine's choice" here is
   cuBLASLt's heuristic first) at the mix batch's exact token count, with the engine's
   plan: the heuristic's
   configurations and a seeded sample of ``--grid`` from ``cublaslt_algos``' grid (no
   split-K) are timed briefly; the engine's choice (the tuned table's, else the
   heuristic's first) and the ``--shortlist`` fastest whose output is within
   ``--tolerance`` of its output are then timed as CUDA graphs of 24 calls on 24 weight
   copies, each ``--alone-settle-s`` at the cap and ``--alone-timed-s`` timed, in
   ``--rounds`` interleaved rounds (median µs a call), after ``--settle-s`` of the
   engine's choice.
2. **The whole pass, settled** (``settled.settled_variants``): the engine's choice, then
   per GEMM its ``--top`` fastest settled-alone
   configurations other than that one, all GEMMs' best together (the sequence run
   ``--repeat`` times), and the engine's choice again; logits compared with the engine's
   choice.

The result records each variant's largest logit difference from the engine's choice, how
many plans took its configuration, and the tuned-table entries (a row range over the mix's
sizes) that would make it the default.
Random BERT-large weights, calibrated FP8 (timing only). Ends with both tables.

    python3 benchmarks/gemm_settled.py --entries run1.json run2.json [--table [PATH]]

prints (and with ``--table`` writes) the entries :func:`table_entries` draws from
recorded runs: one configuration per GEMM that beat the engine's choice in every pass of
every run it ran in.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GEMMS = ("qkv", "ffn1", "ffn2", "out")
HALF = ("out",)  # 16-bit in the calibrated default: cuBLASLt's configuration or torch.mm
ROWS = (20480, 65536)  # the tuned table's row range for the mix's eager passes (v13)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.settled import add_mix_args

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gemms", default=",".join(GEMMS))
    p.add_argument("--grid", type=int, default=150,
                   help="grid configurations sampled per GEMM for the quick timing")
    p.add_argument("--shortlist", type=int, default=10,
                   help="quick-timing fastest timed settled alone (besides the heuristic's)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds alone")
    p.add_argument("--alone-settle-s", type=float, default=0.3)
    p.add_argument("--alone-timed-s", type=float, default=0.4)
    p.add_argument("--top", type=int, default=2,
                   help="settled-alone fastest per GEMM that run the whole pass")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="largest relative mean difference from the engine's choice's output")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of the pass variants (the engine's choice first in each)")
    p.add_argument("--profile", action="store_true",
                   help="also time each pass variant's kernels by name")
    p.add_argument("--entries", nargs="+", type=Path, default=None,
                   help="recorded runs' JSON: print the table entries they support, then stop")
    p.add_argument("--table", nargs="?", type=Path, default=None, const=Path("DEFAULT"),
                   help="with --entries: write them to this tuned table (no value: the engine's)")
    p.add_argument("--min-gain", type=float, default=0.005,
                   help="with --entries: the median gain a pass variant needs in each run")
    p.add_argument("--min-runs", type=int, default=2,
                   help="with --entries: runs a configuration must have won")
    add_mix_args(p)
    args = p.parse_args(argv)
    args.gemms = args.gemms.split(",")
    if unknown := set(args.gemms) - set(GEMMS):
        p.error(f"unknown GEMMs {sorted(unknown)}")
    return args


def settled_alone(configs: list[Any], kw: dict[str, Any], weights: list[Any],
                  args: argparse.Namespace) -> dict[Any, list[float]]:
    """µs a call per configuration and round: each a graph of one call per weight copy,
    run ``alone_settle_s`` then timed ``alone_timed_s``, configurations interleaved."""
    from benchmarks.bench_gpu import time_calls
    from benchmarks.cublaslt_search import _caller
    from benchmarks.rounds import capture_graph, run_for

    graphs = {c: capture_graph(_caller(kw, weights, c), len(weights)) for c in configs}
    run_for(lambda _i: graphs[configs[0]].replay(), args.settle_s)
    runs: dict[Any, list[float]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for c, g in graphs.items():
            run_for(lambda _i: g.replay(), args.alone_settle_s)  # noqa: B023
            t = time_calls(lambda _x: g.replay(), [None], target_s=args.alone_timed_s,  # noqa: B023
                           warmup=0, min_iters=8)
            runs[c].append(t.median_ms * 1e3 / len(weights))
    return runs


def gemm_candidates(gemm: str, tokens: int, args: argparse.Namespace, g: Any
                    ) -> dict[str, Any]:
    """Stage 1 for one GEMM: its plan, the heuristic's first choice, the shortlist's
    settled-alone µs a call (fastest first) and each one's output difference."""
    from benchmarks.cublaslt_search import _difference, _gemm, _operands, _time, sample
    from engine.fused import cublaslt, cublaslt_table

    kw, weights = _operands(gemm, tokens, 24, g, half=gemm in HALF)
    space = cublaslt.search_space(w8=weights[0], swizzle=True, **kw)
    engine_choice = space.tuned or space.heuristic[0]
    ref = _gemm(kw, weights[0], config=engine_choice).float()
    pool = sample([c for c in space.candidates if c.splitk == 1],
                  [c for c in space.heuristic if c.splitk == 1], args.grid)
    quick = sorted((us, i, c) for i, c in enumerate(pool)
                   if (us := _time(kw, weights, c, 3)) is not None)
    shortlist = [engine_choice]
    for _, _, c in quick:
        if len(shortlist) > args.shortlist:
            break
        if c not in shortlist and _difference(kw, weights[0], c, ref) <= args.tolerance:
            shortlist.append(c)
    runs = settled_alone(shortlist, kw, weights, args)
    rows = sorted(({"config": c, "us": statistics.median(v), "runs": v,
                    "difference": _difference(kw, weights[0], c, ref)}
                   for c, v in runs.items()), key=lambda r: r["us"])
    return {"gemm": gemm, "plan": space.plan, "plan_rest": cublaslt_table.gemm(space.plan),
            "engine_choice": engine_choice, "space": space, "quick_timed": len(quick),
            "alone": rows}


def table_entries(runs: list[dict[str, Any]], min_gain: float, min_runs: int
                  ) -> list[dict[str, Any]]:
    """Tuned-table entries from recorded runs: a single-GEMM variant's configuration
    qualifies in a run when each of its passes beat every pass of the engine's choice
    (``baseline`` and ``baseline_again``) and its median pass is ``min_gain`` faster than
    theirs; it must qualify in every run it ran in, and in at least ``min_runs``. Per GEMM
    plan the qualifier with the largest mean gain wins; its entry records the gains."""
    import json

    gains: dict[tuple[str, str], list[float]] = {}
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    failed: set[tuple[str, str]] = set()
    for run in runs:
        rows: dict[str, list[float]] = {}
        for row in run["rows"]:
            name = "baseline" if row["variant"] == "baseline_again" else row["variant"]
            rows.setdefault(name, []).append(row["ms"])
        base = rows["baseline"]
        for name, picks in run["variants"].items():
            if len(picks) != 1 or name not in rows:
                continue
            key = (picks[0]["plan"], json.dumps(picks[0]["config"], sort_keys=True))
            gain = 1 - statistics.median(rows[name]) / statistics.median(base)
            if max(rows[name]) < min(base) and gain >= min_gain:
                gains.setdefault(key, []).append(gain)
                entries.setdefault(key, picks[0])
            else:
                failed.add(key)
    best: dict[str, tuple[float, tuple[str, str]]] = {}
    for key, won in gains.items():
        mean = statistics.mean(won)
        if key not in failed and len(won) >= min_runs and mean > best.get(key[0], (0.0,))[0]:
            best[key[0]] = (mean, key)
    return [{**{k: v for k, v in entries[key].items() if k not in ("date", "commit")},
             "source": "benchmarks/gemm_settled.py: whole settled mix passes against the "
                       "engine's choice, logits bit for bit",
             "pass_gains": [round(g, 4) for g in gains[key]],
             "date": entries[key]["date"], "commit": entries[key]["commit"]}
            for _, key in best.values()]


def _entries(args: argparse.Namespace) -> None:
    import json

    from benchmarks.cublaslt_search import _write_table
    from engine.fused import cublaslt_table

    runs = [json.loads(p.read_text()) for p in args.entries]
    entries = table_entries(runs, args.min_gain, args.min_runs)
    print(json.dumps(entries, indent=1))
    if args.table is not None:
        path = cublaslt_table.TABLE_PATH if str(args.table) == "DEFAULT" else args.table
        _write_table(path, entries)
        print(f"{len(entries)} entries written to {path}")


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO))
    args = parse_args(argv)
    if args.entries:
        _entries(args)
        return
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows
    from benchmarks.settled import finish, mix_result, settled_variants
    from engine.fused import cublaslt, cublaslt_table

    engine = mix_engine("bert-large", int8_gemms=None)  # its GEMMs all cuBLASLt e4m3
    batch = mix_windows(np.random.default_rng(3), args.windows)
    packed = device_packed(*batch)
    tokens = int(batch[1].sum())
    g = torch.Generator(device="cuda").manual_seed(0)
    found = []
    for gemm in args.gemms:
        f = gemm_candidates(gemm, tokens, args, g)
        found.append(f)
        best = f["alone"][0]
        own = next(r["us"] for r in f["alone"] if r["config"] == f["engine_choice"])
        print(f"{gemm}: {f['quick_timed']} quick-timed; settled alone fastest "
              f"{best['us']:.1f} µs ({best['config']}), the engine's {own:.1f}", flush=True)

    # Stage 2: variants choose configurations by plan less its rows (what a row-range
    # table entry matches, operand types included) from the table's first row up.
    variants: dict[str, dict[str, Any]] = {}
    shapes = {f["gemm"]: f["plan_rest"] for f in found}
    for f in found:
        others = [r for r in f["alone"] if r["config"] != f["engine_choice"]][:args.top]
        for i, r in enumerate(others):
            variants[f"{f['gemm']}_{i + 1}"] = {shapes[f["gemm"]]: r["config"]}
    variants["best_each"] = {shapes[f["gemm"]]: f["alone"][0]["config"] for f in found}
    chosen: dict[str, Any] = {}
    table_config = cublaslt._tuned_config

    def tuned_config(key: Any) -> Any:  # the variant's choice, else the engine's own
        pick = chosen.get(cublaslt_table.gemm(key.name())) if key.m >= ROWS[0] else None
        return pick or table_config(key)

    cublaslt._tuned_config = tuned_config

    def use(name: str) -> None:
        chosen.clear()
        chosen.update(variants.get(name, {}))
        cublaslt.clear_plans()

    def ready(name: str) -> Any:
        def go() -> Any:
            use(name)
            return lambda x: engine._run_device(*x)
        return go

    order = ["baseline", *variants] * args.repeat + ["baseline_again"]
    result = mix_result(args, tokens, cublaslt_version=cublaslt.version(), gemms=[
        {"gemm": f["gemm"], "plan": f["plan"], "quick_timed": f["quick_timed"],
         "engine_choice": f["engine_choice"].to_json(),
         "alone": [{**r, "config": r["config"].to_json()} for r in f["alone"]]}
        for f in found], variants={}, max_abs_logit_diff={}, plans_configured={})
    try:
        with torch.inference_mode():
            use("baseline")
            reference = engine._run_device(*packed)
            for name, picks in variants.items():
                use(name)
                diff = (engine._run_device(*packed) - reference).abs().max().item()
                result["max_abs_logit_diff"][name] = diff
                result["plans_configured"][name] = sum(
                    p.tuned is not None for p in cublaslt._PLANS.values())
                result["variants"][name] = [
                    f["space"].entry(picks[shapes[f["gemm"]]],
                                     plan=f"m={ROWS[0]}-{ROWS[1]},{f['plan_rest']}",
                                     date=time.strftime("%Y-%m-%d"), commit=args.commit)
                    for f in found if shapes[f["gemm"]] in picks]
            # The last variant (every GEMM's best) made every searched GEMM's plan that the
            # pass runs (a 16-bit GEMM has none without a configuration for it).
            in_pass = {k.name() for k in cublaslt._PLANS}
            result["plans_missing_from_pass"] = [f["plan"] for f in found
                                                 if f["plan"] not in in_pass]
            if result["plans_missing_from_pass"]:
                print(f"warning: the pass runs none of {result['plans_missing_from_pass']}",
                      flush=True)
            print(f"max |logit - baseline's|: {result['max_abs_logit_diff']}", flush=True)
            settled_variants(result, order, ready, packed, args, args.profile)
    finally:
        cublaslt._tuned_config = table_config
        cublaslt.clear_plans()
    _print_alone(result["gemms"])
    finish(args, result)


def _print_alone(gemms: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="settled alone: µs a call (graphs of 24 calls on 24 weight copies)")
    for col in ("GEMM", "config", "µs", "vs engine's", "difference"):
        table.add_column(col)
    for f in gemms:
        base = next(r["us"] for r in f["alone"] if r["config"] == f["engine_choice"])
        for r in f["alone"]:
            cfg = {k: v for k, v in r["config"].items() if v and k != "algo_id"}
            mark = " (engine's)" if r["config"] == f["engine_choice"] else ""
            table.add_row(f["gemm"], str(cfg) + mark, f"{r['us']:.1f}",
                          f"{r['us'] / base - 1:+.1%}", f"{r['difference']:.1e}")
    Console().print(table)


if __name__ == "__main__":
    main()
