"""Whole-pass A/B of cuBLASLt configurations for the mix's large GEMMs, eagerly, per call.

    python3 benchmarks/large_m_configs.py --out large_m.json \\
        [--search benchmarks/gpu-2026-11-30-v12-cublaslt-search-49152.json]

``cublaslt_search.py`` at 49,152 tokens found configurations 9-24% faster than the
heuristic's per GEMM, timed alone; in a graph-replayed mix pass they changed nothing
(v12). This runs the calibrated FP8 BERT-large engine the way the defaults run the mix
(eager passes of the batch's exact token count, ``graphs.MAX_GRAPH_TOKENS``) with, per
variant, the heuristic's choice (``cublaslt.TUNED`` off) or the search's best
configuration for one or all of the GEMMs it searched (QKV, FFN1 with bias + GELU + e4m3
out, FFN2; with ``--static-all`` also the out-projection, FP8 only on that path),
applied at any token count from ``--min-tokens`` (the configurations do not depend on
M). Per call, ``--draws`` batches of ``--windows`` SQuAD-dev-length windows,
interleaved rounds; then one profiled pass per variant gives each GEMM's own time
inside the pass. Random weights (timing only); logits are compared with the
heuristic's. ``--table`` writes a row-range entry (``--rows``) for each GEMM whose
configuration alone won every round (:func:`table_entries`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SEARCH = REPO / "benchmarks" / "gpu-2026-11-30-v12-cublaslt-search-49152.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--search", type=Path, default=DEFAULT_SEARCH)
    p.add_argument("--min-tokens", type=int, default=16384)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--draws", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=5, help="calls per draw per round")
    p.add_argument("--static-all", action="store_true",
                   help="every GEMM input static (the opt-in fastest FP8 path): the "
                        "out-projection's cuBLASLt GEMM joins the A/B")
    p.add_argument("--table", nargs="?", type=Path, default=None, const=Path("DEFAULT"),
                   help="write row-range entries for the GEMMs whose configuration alone won "
                        "(see table_entries) to this tuned table (no value: the engine's)")
    p.add_argument("--rows", type=_row_range, default=None,
                   help="LO-HI: the row range the table entries cover (default: from the "
                        "smallest batch measured, rounded down to 1,024, to 65,536)")
    p.add_argument("--min-gain", type=float, default=0.01,
                   help="relative gain in ms per batch a table entry needs")
    p.add_argument("--commit", default="")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def _row_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        rows = (int(lo), int(hi))
    except ValueError:
        rows = (1, 0)
    if not sep or not 1 <= rows[0] <= rows[1]:
        raise argparse.ArgumentTypeError(f"expected LO-HI with 1 <= LO <= HI, got {text!r}")
    return rows


def table_entries(results: list[dict[str, Any]], best: dict[str, Any], rows: tuple[int, int],
                  min_gain: float) -> list[dict[str, Any]]:
    """Tuned-table entries over ``rows`` for each GEMM whose configuration alone
    (variant ``searched_<gemm>``) beat the heuristic in every run: every round faster than
    the heuristic's fastest round, and the median at least ``min_gain`` faster."""
    entries = []
    for gemm, chosen in best.items():
        measured = {}
        for res in results:
            base, var = res["variants"]["heuristic"], res["variants"].get(f"searched_{gemm}")
            if var is None:
                break
            b, v = statistics.median(base["round_ms"]), statistics.median(var["round_ms"])
            if max(var["round_ms"]) >= min(base["round_ms"]) or v > (1 - min_gain) * b:
                break
            tokens = f"{min(res['tokens']):,}-{max(res['tokens']):,} tokens"
            measured[f"{res.get('windows', '?')} windows ({tokens})"] = {
                "heuristic_ms": round(b, 3), "ms": round(v, 3)}
        else:
            head = results[-1]
            entries.append({
                "gpu": head["gpu"], "cublaslt_version": head["cublaslt_version"],
                "plan": f"m={rows[0]}-{rows[1]},{chosen['plan_rest']}",
                "config": chosen["config"].to_json(),
                "source": "benchmarks/large_m_configs.py: whole eager passes of calibrated "
                          "FP8 BERT-large on SQuAD-mix windows, ms per batch per call",
                "measured": measured, "date": head["date"], "commit": head["commit"]})
    return entries


def searched(path: Path) -> dict[str, Any]:
    """GEMM name -> (N, K, GELU), its plan's fields but m, and the search's best
    configuration, from the search's JSON."""
    from engine.fused.cublaslt_algos import AlgoConfig
    from engine.fused.cublaslt_table import gemm

    out = {}
    for row in json.loads(path.read_text())["gemms"]:
        fields = dict(kv.split("=") for kv in row["plan"].split(","))
        out[row["gemm"]] = {"shape": (int(fields["n"]), int(fields["k"]),
                                      fields["gelu"] == "True"),
                            "plan_rest": gemm(row["plan"]),
                            "config": AlgoConfig.from_json(row["best"]["config"])}
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.bench_gpu import device_packed, mix_engine, mix_windows, static_everywhere
    from benchmarks.rounds import interleaved
    from engine.fused import cublaslt

    gemms = ("qkv", "out", "ffn1", "ffn2") if args.static_all else ("qkv", "ffn1", "ffn2")
    best = {g: v for g, v in searched(args.search).items() if g in gemms}
    variants: dict[str, dict[str, Any]] = {"heuristic": {}, "searched_all": best,
                                           **{f"searched_{g}": {g: v} for g, v in best.items()}}
    if args.static_all:
        variants["searched_qkv_out"] = {g: best[g] for g in ("qkv", "out")}
    chosen: dict[tuple[int, int, bool], Any] = {}

    def tuned_config(key: Any) -> Any:  # stands in for the tuned table
        return chosen.get((key.n, key.k, key.gelu)) if key.m >= args.min_tokens else None

    cublaslt._tuned_config = tuned_config  # type: ignore[assignment]

    def use(name: str) -> None:
        chosen.clear()
        chosen.update({v["shape"]: v["config"] for v in variants[name].values()})
        cublaslt.TUNED = name != "heuristic"
        cublaslt.clear_plans()

    eng = mix_engine("bert-large", int8_gemms=None)  # its GEMMs all cuBLASLt e4m3
    if args.static_all:
        eng = static_everywhere(eng)
    rng = np.random.default_rng(3)
    sets = [mix_windows(rng, args.windows) for _ in range(args.draws)]
    inputs = [device_packed(*s) for s in sets]
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(), "cublaslt_version": cublaslt.version(),
        "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "windows": args.windows,
        "tokens": [int(s[1].sum()) for s in sets],
        "search": args.search.name, "static_all": args.static_all, "variants": {}}
    with torch.inference_mode():
        use("heuristic")
        ref = [eng._run_device(*x) for x in inputs]
        for name, chosen_gemms in variants.items():
            use(name)
            diff = max(float((eng._run_device(*x) - r).abs().max())
                       for x, r in zip(inputs, ref, strict=True))
            applied = sum(plan.tuned is not None for plan in cublaslt._PLANS.values())
            result["variants"][name] = {
                "configs": {g: v["config"].to_json() for g, v in chosen_gemms.items()},
                "plans_configured": applied,  # of the draws' plans: cuBLASLt took them
                "max_abs_vs_heuristic": diff}

        def batches() -> None:  # one call per draw
            for x in inputs:
                eng._run_device(*x)

        times = interleaved(
            dict.fromkeys(variants, batches), args.rounds, args.calls, prepare=use,
            report=lambda r, ms: print(f"round {r + 1}/{args.rounds}: " + " ".join(
                f"{n}={t / len(inputs):.2f}" for n, t in ms.items()), flush=True))
        for name, ms in times.items():
            result["variants"][name]["round_ms"] = [t / len(inputs) for t in ms]
        for name in variants:  # each GEMM kernel's own time inside one pass
            use(name)
            eng._run_device(*inputs[-1])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                eng._run_device(*inputs[-1])
                torch.cuda.synchronize()
            trace = Path(tempfile.mkdtemp()) / "trace.json"
            prof.export_chrome_trace(str(trace))
            per: dict[str, list[float]] = defaultdict(list)
            for e in json.loads(trace.read_text())["traceEvents"]:
                if e.get("cat") == "kernel" and ("nvjet" in e["name"] or "gemm" in e["name"]):
                    per[e["name"]].append(float(e["dur"]))
            result["variants"][name]["kernels_us"] = {
                k: {"count": len(v), "mean": statistics.mean(v)} for k, v in per.items()}
    kind = " (all static)" if args.static_all else ""
    tokens = f"{min(result['tokens'])}-{max(result['tokens'])}"
    print(f"\nbert-large calibrated FP8{kind}, eager, {args.draws} x {args.windows} windows "
          f"(tokens {tokens}), per call:")
    for name, v in result["variants"].items():
        v["median_ms"] = statistics.median(v["round_ms"])
        print(f"  {name:16s} {v['median_ms']:8.3f} ms ({min(v['round_ms']):.3f}-"
              f"{max(v['round_ms']):.3f})  {args.windows / v['median_ms'] * 1e3:7.0f} "
              f"windows/s  max|diff| {v['max_abs_vs_heuristic']:.1e}  "
              f"{v['plans_configured']} plans configured")
        for k, s in sorted(v["kernels_us"].items(), key=lambda kv: -kv[1]["mean"]):
            print(f"      {s['count']:3d} x {s['mean']:7.1f} us  {k[:70]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    if args.table:
        from benchmarks.cublaslt_search import _write_table
        from engine.fused import cublaslt_table

        rows = args.rows or (min(result["tokens"]) // 1024 * 1024, 65536)
        entries = table_entries([result], best, rows, args.min_gain)
        path = cublaslt_table.TABLE_PATH if str(args.table) == "DEFAULT" else args.table
        _write_table(path, entries)
        print(f"wrote {len(entries)} entries to {path}: "
              + (", ".join(e["plan"].split(",k=")[0] for e in entries) or "none"))


if __name__ == "__main__":
    main()
