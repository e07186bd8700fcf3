"""``benchmarks/figures.save_figure``, the one PNG writer of the report plots."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_save_figure_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from benchmarks.figures import save_figure

    fig = Figure(figsize=(2, 1))
    fig.subplots().plot([0, 1], [1, 0])
    out = tmp_path / "f.png"
    save_figure(fig, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in capsys.readouterr().out
