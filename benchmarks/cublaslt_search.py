"""Exhaustive cuBLASLt configuration search for the engine's static FP8 GEMMs (what
FasterTransformer's ``gemm_test`` did for its GEMMs), writing the winners to the tuned
table the engine reads (``engine/fused/cublaslt_table.TABLE_PATH``).

    python3 benchmarks/cublaslt_search.py --tokens 384 --out search.json --table

For each BERT-large GEMM of a calibrated (static-scale) layer at ``--tokens`` rows, with
the engine's exact cuBLASLt plan (per-tensor scales, fast accumulation; QKV, the
out-projection and FFN2 to fp16, FFN1 with bias + GELU to e4m3; the engine runs the
out-projection's only when the attention output is static too, not by default):

1. every configuration of ``cublaslt_algos.candidates``' grid that
   ``cublasLtMatmulAlgoCheck`` accepts (algorithm, tile, stages, custom option, cluster
   shape, and split-K with its reduction) is timed once, briefly (a seeded sample of
   ``--max-timed`` where there are more);
2. the fastest are checked against the heuristic's output (relative mean error at most
   ``--tolerance``: a split-K reduced in a low precision fails it);
3. the heuristic's first choice and the best survivors are re-timed in interleaved
   rounds (median); a configuration ``--min-gain`` faster than the heuristic's goes into
   the table (``--table``; entries for other shapes, GPUs or cuBLASLt versions are kept).

Times are CUDA-graph replays of ``--calls`` calls (24), each on its own copy of the
weight (24 copies exceed L2, as a pass's 24 layers do), in µs per call. Ends with a
table per GEMM. At the SQuAD mix's 49,152 tokens: ``--calls 4 --max-timed 800
--no-splitk``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAYERS = 24  # weight copies, and calls per timed graph (``--calls``)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.gemm_cli import BERT_LARGE_GEMMS as GEMMS

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, action="append", help="rows (repeatable; default 384)")
    p.add_argument("--gemms", default=",".join(GEMMS), help="comma-separated subset of "
                   + ", ".join(GEMMS))
    p.add_argument("--out", type=Path, default=None, help="results JSON (rewritten per GEMM)")
    p.add_argument("--table", nargs="?", type=Path, default=None, const=Path("DEFAULT"),
                   help="write winners to this tuned table (no value: the engine's)")
    p.add_argument("--top", type=int, default=8, help="survivors re-timed per GEMM")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the re-timing")
    p.add_argument("--min-gain", type=float, default=0.03,
                   help="relative gain over the heuristic a table entry needs")
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="largest relative mean difference from the heuristic's output")
    p.add_argument("--max-checks", type=int, default=1_000_000)
    p.add_argument("--max-timed", type=int, default=3000,
                   help="candidates timed per GEMM (a seeded sample beyond it)")
    p.add_argument("--calls", type=int, default=LAYERS,
                   help="calls per timed graph, each on its own weight copy")
    p.add_argument("--no-splitk", action="store_true",
                   help="time no split-K configuration (they lose at large M)")
    p.add_argument("--commit", default="", help="recorded with the results")
    args = p.parse_args(argv)
    args.tokens = args.tokens or [384]
    unknown = set(args.gemms.split(",")) - set(GEMMS)
    if unknown:
        p.error(f"unknown GEMMs {sorted(unknown)}")
    return args


def _operands(gemm: str, tokens: int, copies: int, g: Any, half: bool = False
              ) -> tuple[dict[str, Any], list[Any]]:
    """``fp8_linear`` keyword arguments (weight left out) and the weight copies; with
    ``half``, fp16 operands and no scales (a ``half_linear`` GEMM: :func:`_gemm`)."""
    import torch

    from benchmarks.gemm_cli import BERT_LARGE_GEMMS
    from engine.fused.fp8 import FP8_DTYPE

    n, k = BERT_LARGE_GEMMS[gemm]
    if half:
        x16 = torch.randn((tokens, k), generator=g, device="cuda").half()
        return ({"xq": x16, "x_scale": None, "w_scale": None, "out_dtype": torch.float16},
                [(torch.randn((n, k), generator=g, device="cuda") * 0.03).half()
                 for _ in range(copies)])
    x = (torch.randn((tokens, k), generator=g, device="cuda") * 64).clamp(-448, 448)
    kw: dict[str, Any] = {"xq": x.to(FP8_DTYPE), "x_scale": torch.tensor([0.02], device="cuda"),
                          "w_scale": torch.tensor([1e-4], device="cuda"),
                          "out_dtype": torch.float16, "fast_accum": True}
    if gemm == "ffn1":
        kw.update(out_dtype=FP8_DTYPE, gelu=True,
                  bias=(torch.randn((n,), generator=g, device="cuda") * 0.1).bfloat16(),
                  out_scale=torch.tensor([64.0], device="cuda"))
    weights = [(torch.randn((n, k), generator=g, device="cuda") * 64).clamp(-448, 448)
               .to(FP8_DTYPE) for _ in range(copies)]
    return kw, weights


def _caller(kw: dict[str, Any], weights: list[Any], config: Any) -> Callable[[], Any]:
    """A call that runs ``config`` on the next weight copy each time, into one buffer."""
    import torch

    out = torch.empty((kw["xq"].shape[0], weights[0].shape[0]), device="cuda",
                      dtype=kw["out_dtype"])
    turn = itertools.cycle(range(len(weights)))

    def call() -> Any:
        return _gemm(kw, weights[next(turn)], out=out, config=config)
    return call


def _gemm(kw: dict[str, Any], weight: Any, **more: Any) -> Any:
    """One call of the GEMM ``kw`` describes (:func:`_operands`) on ``weight``: ``fp8_linear``,
    or ``half_linear`` where ``kw`` has no scales."""
    from engine.fused import cublaslt

    if kw["x_scale"] is None:
        return cublaslt.half_linear(kw["xq"], weight, **more)
    return cublaslt.fp8_linear(w8=weight, **kw, **more)


def sample(candidates: list[Any], heuristic: list[Any], limit: int) -> list[Any]:
    """The heuristic's configurations, then the candidates (a seeded sample of them when
    there are more than ``limit``), without repeats."""
    import random

    first = set(heuristic)
    rest = [c for c in candidates if c not in first]
    if len(rest) > limit:
        rest = random.Random(0).sample(rest, limit)
    return list(dict.fromkeys(heuristic)) + rest


def _time(kw: dict[str, Any], weights: list[Any], config: Any, replays: int) -> float | None:
    from benchmarks.attn_backends import _time_graph

    try:
        us, graphed = _time_graph(_caller(kw, weights, config), len(weights), replays)
    except Exception:  # a configuration that fails to launch is not a candidate
        return None
    return us if graphed else None


def _difference(kw: dict[str, Any], weight: Any, config: Any, ref: Any) -> float:
    y = _gemm(kw, weight, config=config).float()
    return float((y - ref).abs().mean() / ref.abs().mean().clamp_min(1e-12))


def search(gemm: str, tokens: int, args: argparse.Namespace, g: Any) -> dict[str, Any]:
    """One GEMM's search; returns its results (and ``entry``, a table entry, if one won)."""
    from rich.progress import track

    from engine.fused import cublaslt

    kw, weights = _operands(gemm, tokens, args.calls, g)
    t0 = time.perf_counter()
    space = cublaslt.search_space(w8=weights[0], max_checks=args.max_checks,
                                  swizzle=tokens >= 4096, **kw)
    first = space.heuristic[0]
    ref = cublaslt.fp8_linear(w8=weights[0], algo=0, **kw).float()
    pool = sample([c for c in space.candidates if c.splitk == 1 or not args.no_splitk],
                  space.heuristic, args.max_timed)
    quick: list[tuple[float, Any]] = []
    for config in track(pool, description=f"{gemm} x {tokens}: {len(pool)} timed"):
        us = _time(kw, weights, config, 3)
        if us is not None:
            quick.append((us, config))
    quick.sort(key=lambda p: p[0])
    survivors: list[Any] = []
    rejected = 0
    for _, config in quick:
        if len(survivors) >= args.top:
            break
        if _difference(kw, weights[0], config, ref) <= args.tolerance:
            survivors.append(config)
        else:
            rejected += 1
    finalists = [first] + [c for c in dict.fromkeys(survivors) if c != first]
    runs: dict[Any, list[float]] = {c: [] for c in finalists}
    for _ in range(args.rounds):
        for config in finalists:
            us = _time(kw, weights, config, 10)
            if us is not None:
                runs[config].append(us)
    timed = {c: statistics.median(v) for c, v in runs.items() if v}
    if not timed:
        raise RuntimeError(f"{gemm} x {tokens}: no configuration could be timed")
    best = min(timed, key=lambda c: timed[c])
    base = timed.get(first)
    row: dict[str, Any] = {
        "gemm": gemm, "tokens": tokens, "plan": space.plan,
        "candidates": len(space.candidates), "timed": len(pool), "launched": len(quick),
        "algos": [{**a, "tiles": len(a["tiles"])} for a in space.algos],
        "heuristic_all": [c.to_json() for c in space.heuristic],
        "heuristic_in_candidates": [c in set(space.candidates) for c in space.heuristic],
        "rejected_by_error": rejected, "seconds": round(time.perf_counter() - t0, 1),
        "heuristic": {"config": first.to_json(), "us": base},
        "finalists": [{"config": c.to_json(), "us": timed.get(c), "runs": runs[c],
                       "difference": _difference(kw, weights[0], c, ref)} for c in finalists],
        "best": {"config": best.to_json(), "us": timed[best]},
    }
    if base is not None and best != first and timed[best] <= base * (1 - args.min_gain):
        row["entry"] = space.entry(best, us=round(timed[best], 2), heuristic_us=round(base, 2),
                                   date=time.strftime("%Y-%m-%d"), commit=args.commit)
    return row


def _write_table(path: Path, entries: list[dict[str, Any]]) -> None:
    from engine.fused import cublaslt_table

    old = json.loads(path.read_text()) if path.exists() else []
    cublaslt_table.parse(old, str(path))  # refuse to extend a table that does not parse
    new_keys = {cublaslt_table.entry_key(e) for e in entries}
    # An entry replaces the one for the same key, and row ranges of the same GEMM it overlaps.
    kept = [e for e in old if not any(
        k == cublaslt_table.entry_key(e) or cublaslt_table.overlaps(k, cublaslt_table.entry_key(e))
        for k in new_keys)]
    path.write_text(json.dumps(kept + entries, indent=1) + "\n")


def _summary(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="cuBLASLt search: µs per call (graphs of calls on distinct weights)")
    for col in ("GEMM", "tokens", "accepted", "heuristic", "best", "gain", "best config"):
        table.add_column(col)
    for r in rows:
        h, b = r["heuristic"]["us"], r["best"]["us"]
        cfg = {k: v for k, v in r["best"]["config"].items() if v}
        table.add_row(r["gemm"], str(r["tokens"]), str(r["candidates"]),
                      f"{h:.2f}" if h else "-", f"{b:.2f}",
                      f"{(1 - b / h) * 100:+.1f}%" if h else "-",
                      json.dumps(cfg) + (" -> table" if "entry" in r else ""))
    Console().print(table)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO))
    args = parse_args(argv)
    import torch

    from benchmarks import gemm_cli
    from engine.fused import cublaslt, cublaslt_table

    g = torch.Generator(device="cuda").manual_seed(0)
    result: dict[str, Any] = {**gemm_cli.header(args.tokens[0]), "tokens": args.tokens,
                              "commit": args.commit, "cublaslt_version": cublaslt.version(),
                              "gemms": []}
    for tokens in args.tokens:
        for gemm in args.gemms.split(","):
            result["gemms"].append(search(gemm, tokens, args, g))
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
    entries = [r["entry"] for r in result["gemms"] if "entry" in r]
    if args.table is not None:
        path = cublaslt_table.TABLE_PATH if str(args.table) == "DEFAULT" else args.table
        _write_table(path, entries)
        print(f"{len(entries)} entries written to {path}")
    _summary(result["gemms"])


if __name__ == "__main__":
    main()
