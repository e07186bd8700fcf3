"""``benchmarks/plot_layer_steps.py`` on the recorded v18 traces (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")


def test_layer_steps_of_the_recorded_traces() -> None:
    """Five positions a layer; with resident weights the out-projection, FFN1 and FFN2
    steps are shorter (v18: 4.34 -> 3.93, 5.95 -> 5.32, 6.49 -> 5.99 at 1x128)."""
    from benchmarks import plot_layer_steps as plot

    real = plot.layer_steps(Path(str(plot.RECORDS).format("1x128")))
    resident = plot.layer_steps(Path(str(plot.RECORDS).format("1x128-repeat1")))
    assert len(real) == len(resident) == len(plot.NAMES)
    assert real[2:] == pytest.approx([4.34, 5.95, 6.49], abs=0.01)
    assert all(r < d for r, d in zip(resident[2:], real[2:], strict=True))


def test_a_trace_of_another_layer_is_refused(tmp_path: Path) -> None:
    from benchmarks import plot_layer_steps as plot

    bad = tmp_path / "t.json"
    bad.write_text('[{"name": "_gemm_kernel", "ts": 0.0, "dur": 1.0}]')
    with pytest.raises(ValueError, match="expected 5"):
        plot.layer_steps(bad)


def test_figure_has_a_bar_per_position_and_variant() -> None:
    from benchmarks import plot_layer_steps as plot

    fig = plot.plot({"a": [1.0] * 5, "b": [2.0] * 5}, "t")
    (ax,) = fig.axes
    assert len(ax.patches) == 10
