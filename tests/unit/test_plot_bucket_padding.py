"""``benchmarks/plot_bucket_padding.py`` on the recorded v13 run (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_series_follow_the_recorded_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import plot_bucket_padding as plot

    results = json.loads(plot.DEFAULT_RESULTS.read_text())
    lines = plot.series(results)
    assert list(lines) == ["eager", "graph/8", "graph/64"]
    for pts in lines.values():  # one point per batch size, by token count
        assert len(pts) == len(results["batches"]) == 5
        assert [t for t, _ in pts] == sorted(t for t, _ in pts)
    # What the engine's default rests on: eager passes win on every batch above
    # max_graph_tokens, graphs on the small ones (the crossover: 5.6k-10.5k tokens).
    from engine.fused.graphs import MAX_GRAPH_TOKENS

    eager, graph = dict(lines["eager"]), dict(lines["graph/8"])
    assert [t > MAX_GRAPH_TOKENS for t in eager] == [False, False, False, True, True]
    assert all(eager[t] > graph[t] for t in eager if t > MAX_GRAPH_TOKENS)
    assert all((eager[t] > graph[t]) == (t > 10_000) for t in eager)
    fig = plot.plot(lines, MAX_GRAPH_TOKENS, "test")
    out = tmp_path / "f.png"
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(out)
    assert out.stat().st_size > 10_000
