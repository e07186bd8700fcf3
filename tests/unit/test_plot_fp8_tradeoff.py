"""``benchmarks/plot_fp8_tradeoff.py`` on the recorded v11 results (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import plot_fp8_tradeoff as plot

BENCH = Path(plot.__file__).resolve().parent


def test_points_pair_each_schemes_speed_with_its_accuracy(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    mix = json.loads((BENCH / "gpu-2026-11-30-v11-mix.json").read_text())
    acc = json.loads((BENCH / "gpu-2026-11-30-v11-accuracy-static-inputs.json").read_text())
    pts = {p["label"]: p for p in plot.points(mix, acc)}
    assert list(pts) == [label for label, _, _ in plot.SCHEMES]
    default = pts["calibrated (default)"]
    assert default["per_s"] == mix["mix"][0]["ours_fp8_calibrated_packed"]["windows_per_s"]
    assert len(default["errors"]) == len(acc["grids"]) == len(default["losses"])
    # the ordering the figure shows: faster schemes, larger logit error
    order = sorted(pts.values(), key=lambda p: p["per_s"])
    errors = [sum(p["errors"]) / len(p["errors"]) for p in order]
    assert errors == sorted(errors)
    fig = plot.plot(list(pts.values()), "test")
    out = tmp_path / "f.png"
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(out)
    assert out.stat().st_size > 10_000
