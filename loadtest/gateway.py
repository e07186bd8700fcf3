"""The gateway's own latency for a step: its /metrics histograms scraped before and after."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from loadtest.promtext import Histogram, histogram_quantile, read_histogram
from loadtest.results import GatewayView
from loadtest.targets import require_loopback
from service.metrics import PHASES, PREFIX

REQUEST_HISTOGRAM = f"{PREFIX}_request_duration_seconds"
PHASE_HISTOGRAM = f"{PREFIX}_phase_duration_seconds"
QA_ROUTE = "/v1/qa"


@dataclass(frozen=True)
class Snapshot:
    request: Histogram
    phases: dict[str, Histogram]


def parse_snapshot(text: str, route: str = QA_ROUTE) -> Snapshot:
    """The QA route's request histogram (all outcomes) and each phase's histogram."""
    return Snapshot(
        request=read_histogram(text, REQUEST_HISTOGRAM, {"route": route}),
        phases={p: read_histogram(text, PHASE_HISTOGRAM, {"phase": p}) for p in PHASES},
    )


async def scrape(
    client: httpx.AsyncClient, metrics_url: str, route: str = QA_ROUTE
) -> Snapshot | None:
    """A snapshot of the gateway's histograms, or None if /metrics cannot be read."""
    require_loopback(metrics_url)
    try:
        response = await client.get(metrics_url, timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_snapshot(response.text, route)


async def _scrape_until(
    client: httpx.AsyncClient, metrics_url: str, route: str,
    done: Callable[[Snapshot, Snapshot | None], bool], interval_s: float, deadline_s: float,
) -> Snapshot | None:
    """Scrape every ``interval_s`` until ``done(this scrape, the one before it)`` or the
    deadline passes (or /metrics cannot be read); the last scrape."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    last = None
    while True:
        now = await scrape(client, metrics_url, route)
        if now is None or done(now, last) or loop.time() >= end:
            return now
        last = now
        await asyncio.sleep(interval_s)


async def settled_scrape(
    client: httpx.AsyncClient, metrics_url: str, before: Snapshot, expected: int,
    route: str = QA_ROUTE, deadline_s: float = 2.0,
) -> Snapshot | None:
    """Scrape until the gateway has counted ``expected`` more requests, or the deadline passes.

    A gateway may observe its histogram just after the response leaves; polling avoids reading
    a count that is one request short.
    """
    return await _scrape_until(
        client, metrics_url, route,
        lambda now, _: now.request.count - before.request.count >= expected, 0.05, deadline_s)


async def quiet_scrape(
    client: httpx.AsyncClient, metrics_url: str, route: str = QA_ROUTE,
    quiet_s: float = 0.1, deadline_s: float = 2.0,
) -> Snapshot | None:
    """A step's starting snapshot: scrape until the request count has held still for
    ``quiet_s`` (or the deadline passes), so that requests answered before the step (the
    warm-up's last ones) but not yet observed by the gateway are not counted in it."""
    return await _scrape_until(
        client, metrics_url, route,
        lambda now, last: last is not None and now.request.count == last.request.count,
        quiet_s, deadline_s)


def _ms(hist: Histogram) -> dict[str, float]:
    mean = hist.sum / hist.count * 1000.0 if hist.count else float("nan")
    return {"mean_ms": mean, "p50_ms": histogram_quantile(0.5, hist) * 1000.0,
            "p99_ms": histogram_quantile(0.99, hist) * 1000.0}


def gateway_view(before: Snapshot, after: Snapshot) -> GatewayView:
    """What the gateway measured between two snapshots (quantiles interpolated in buckets)."""
    request = after.request.minus(before.request)
    stats = _ms(request)
    phases = {p: _ms(after.phases[p].minus(before.phases[p])) for p in after.phases}
    return GatewayView(count=request.count, mean_ms=stats["mean_ms"], p50_ms=stats["p50_ms"],
                       p99_ms=stats["p99_ms"], phases=phases)
