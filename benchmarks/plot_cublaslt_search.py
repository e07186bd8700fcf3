"""The cuBLASLt search's results as a figure, from recorded JSONs (no GPU needed).

    python3 benchmarks/plot_cublaslt_search.py [--search FILE ...]
        [--out benchmarks/cublaslt-search-2026-11-30.png]

One panel per GEMM of a BERT-large layer: µs per call against the token count, the
heuristic's first choice and the search's best (``cublaslt_search.py``: graphs of calls on
distinct weight copies, median of interleaved rounds); a filled marker where the best
went into the tuned table (at least ``--min-gain`` faster). Several files merge; a
(GEMM, tokens) pair measured twice keeps the later file's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]
GEMMS = ("qkv", "out", "ffn1", "ffn2")
DEFAULT_SEARCHES = [REPO / "benchmarks" / f"gpu-2026-11-30-v12-cublaslt-search-{s}.json"
                    for s in ("384", "192-512")]


def points(searches: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per GEMM, by token count: the heuristic's and the best µs, and whether the best
    went into the table."""
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for search in searches:
        for row in search["gemms"]:
            if row["heuristic"]["us"] is None:
                continue
            seen[(row["gemm"], row["tokens"])] = {
                "tokens": row["tokens"], "heuristic": row["heuristic"]["us"],
                "best": row["best"]["us"], "table": "entry" in row}
    return {g: sorted((p for (gg, _), p in seen.items() if gg == g), key=lambda p: p["tokens"])
            for g in GEMMS if any(gg == g for gg, _ in seen)}


def plot(pts: dict[str, list[dict[str, Any]]], title: str) -> Figure:
    fig = Figure(figsize=(3.2 * len(pts), 3.6), layout="constrained")
    axes = fig.subplots(1, len(pts), squeeze=False)[0]
    for ax, (gemm, rows) in zip(axes, pts.items(), strict=True):
        tokens = [r["tokens"] for r in rows]
        ax.plot(tokens, [r["heuristic"] for r in rows], "o--", color="C7",
                label="heuristic's choice")
        ax.plot(tokens, [r["best"] for r in rows], "-", color="C0", label="search's best")
        for r in rows:
            ax.plot([r["tokens"]], [r["best"]], "o", color="C0",
                    markerfacecolor="C0" if r["table"] else "white")
        ax.set_title(gemm, fontsize=10)
        ax.set_ylim(0, 1.1 * max(r["heuristic"] for r in rows))  # gains to scale
        ax.set_xlim(150, 550)
        ax.set_xlabel("tokens")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("µs per call")
    axes[0].legend(fontsize=8, title="filled: in the table", title_fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--search", type=Path, action="append", default=None)
    p.add_argument("--out", type=Path,
                   default=REPO / "benchmarks" / "cublaslt-search-2026-11-30.png")
    args = p.parse_args()
    import sys

    sys.path.insert(0, str(REPO))
    from benchmarks.figures import save_figure

    searches = [json.loads(f.read_text()) for f in args.search or DEFAULT_SEARCHES]
    pts = points(searches)
    head = searches[-1]
    fig = plot(pts, f"cuBLASLt FP8 GEMMs of BERT-large, heuristic vs exhaustive search "
                    f"({head.get('gpu', '?')}, cuBLASLt {head.get('cublaslt_version', '?')}, "
                    f"{head.get('date', '?')})")
    save_figure(fig, args.out)
    for gemm, rows in pts.items():
        for r in rows:
            print(f"  {gemm:5s} {r['tokens']:5d} tokens: {r['heuristic']:6.2f} -> "
                  f"{r['best']:6.2f} µs{'  (table)' if r['table'] else ''}")


if __name__ == "__main__":
    main()
