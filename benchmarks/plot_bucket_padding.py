"""Eager passes against CUDA graphs by batch size, as a figure, from a recorded
``bucket_padding.py`` JSON (no GPU needed).

    python3 benchmarks/plot_bucket_padding.py [--results FILE]
        [--out benchmarks/graph-vs-eager-2026-11-30.png]

Windows/s per call against the batch's mean token count, one line per variant (eager, and
graphs at each bucket granularity), with the engine's ``max_graph_tokens`` default marked:
below it a pass replays a graph, above it runs eagerly.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = REPO / "benchmarks" / "gpu-2026-11-30-v13-bucket-padding-sizes.json"


def series(results: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Per variant: (mean tokens of the batch size's draws, windows/s), by token count."""
    out: dict[str, list[tuple[float, float]]] = {}
    for batch in sorted(results["batches"], key=lambda b: statistics.mean(b["tokens"])):
        tokens = statistics.mean(batch["tokens"])
        for name, v in batch["variants"].items():
            out.setdefault(name, []).append((tokens, v["windows_per_s"]))
    return out


def plot(lines: dict[str, list[tuple[float, float]]], threshold: int, title: str) -> Figure:
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, pts in lines.items():
        ax.plot([t for t, _ in pts], [w for _, w in pts], "o-" if name == "eager" else "s--",
                label=name if name == "eager" else f"graph, {name.split('/')[1]} buckets "
                                                   "per octave")
    ax.axvline(threshold, color="C7", linestyle=":",
               label=f"max_graph_tokens default ({threshold:,}): eager above")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per batch (SQuAD-mix windows)")
    ax.set_ylabel("windows/s per call")
    ax.set_ylim(0, None)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--out", type=Path,
                   default=REPO / "benchmarks" / "graph-vs-eager-2026-11-30.png")
    args = p.parse_args()
    import sys

    sys.path.insert(0, str(REPO))
    from benchmarks.figures import save_figure
    from engine.fused.graphs import MAX_GRAPH_TOKENS

    results = json.loads(args.results.read_text())
    lines = series(results)
    fig = plot(lines, MAX_GRAPH_TOKENS,
               f"{results['model']} {results['dtype']} (calibrated): eager passes vs CUDA "
               f"graphs\n{results['gpu']}, {results['date']}, commit {results['commit']}")
    save_figure(fig, args.out)
    for name, pts in lines.items():
        print(f"  {name:9s} " + "  ".join(f"{t:7.0f} tok {w:5.0f}/s" for t, w in pts))


if __name__ == "__main__":
    main()
