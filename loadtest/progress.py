"""A live view of the running step (rich), refreshed a few times a second on stderr."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from loadtest.generator import StepState
from loadtest.stats import percentile


def _table(state: StepState, budget_ms: float | None) -> Table:
    lat_ms = np.asarray(state.latencies_s[-20_000:]) * 1000.0
    p50 = percentile(lat_ms, 50) if lat_ms.size else float("nan")
    p99 = percentile(lat_ms, 99) if lat_ms.size else float("nan")
    table = Table(title=f"open loop @ {state.config.rate:g} rps", title_justify="left")
    for column in ("elapsed", "scheduled", "sent", "done", "in flight", "errors", "p50 ms",
                   "p99 ms", "budget ms"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{state.elapsed_s:5.1f}/{state.config.duration_s:g}s", str(state.scheduled),
        str(state.sent), str(state.done), str(state.sent - state.done), str(state.errors),
        f"{p50:.2f}", f"[{'red' if budget_ms and p99 > budget_ms else 'green'}]{p99:.2f}",
        "-" if budget_ms is None else f"{budget_ms:g}",
    )
    return table


class Display:
    """Shows each step while it runs; does nothing when ``enabled`` is false."""

    def __init__(self, budget_ms: float | None, enabled: bool = True) -> None:
        self.budget_ms = budget_ms
        self.console = Console(stderr=True)
        self.enabled = enabled

    @contextlib.asynccontextmanager
    async def track(self, state: StepState) -> AsyncIterator[None]:
        if not self.enabled:
            yield
            return
        with Live(_table(state, self.budget_ms), console=self.console, auto_refresh=False,
                  transient=False) as live:
            async def refresh() -> None:
                while True:
                    live.update(_table(state, self.budget_ms), refresh=True)
                    await asyncio.sleep(0.25)

            task = asyncio.create_task(refresh())
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                live.update(_table(state, self.budget_ms), refresh=True)
