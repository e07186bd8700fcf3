"""What the report plots (``plot_*.py``) share: writing a figure to a PNG file."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def save_figure(fig: Figure, out: Path) -> None:
    """Render ``fig`` with the Agg canvas (no display, no pyplot state) to ``out`` at 100
    dpi, and say so."""
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
