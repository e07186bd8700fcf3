"""One measured step: scrape the gateway, run the open-loop schedule, scrape again, summarise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx

from loadtest.gateway import QA_ROUTE, gateway_view, quiet_scrape, settled_scrape
from loadtest.generator import StepConfig, StepState, run_step
from loadtest.progress import Display
from loadtest.results import StepResult, step_result
from loadtest.targets import require_loopback
from loadtest.workload import Payload


@dataclass(frozen=True)
class Target:
    qa_url: str
    metrics_url: str | None  # None: do not read the gateway's own histograms
    route: str = QA_ROUTE

    @classmethod
    def from_base(
        cls, base_url: str, route: str = QA_ROUTE, metrics_url: str | None = ""
    ) -> Target:
        """``base_url`` + ``route``; the metrics URL defaults to ``base_url/metrics``."""
        base = require_loopback(base_url).rstrip("/")
        if metrics_url == "":
            metrics_url = f"{base}/metrics"
        if metrics_url is not None:
            require_loopback(metrics_url)
        return cls(qa_url=f"{base}{route}", metrics_url=metrics_url, route=route)


@dataclass(frozen=True)
class Criteria:
    budget_ms: float | None
    max_error_rate: float = 0.01


async def warm_up(client: httpx.AsyncClient, target: Target, bodies: Sequence[Payload],
                  config: StepConfig, seconds: float) -> None:
    """Unrecorded traffic at the step's rate (connections, caches, Triton's first batches)."""
    if seconds > 0:
        await run_step(client, target.qa_url, bodies, replace(config, duration_s=seconds))


async def measure_step(
    client: httpx.AsyncClient, target: Target, bodies: Sequence[Payload], config: StepConfig,
    criteria: Criteria, display: Display,
) -> StepResult:
    """Run one step and summarise it beside the gateway's own histograms for the same window."""
    before = (await quiet_scrape(client, target.metrics_url, target.route)
              if target.metrics_url else None)
    state = StepState(config)
    async with display.track(state):
        samples = await run_step(client, target.qa_url, bodies, config, state)
    view = None
    if before is not None and target.metrics_url:
        answered = sum(1 for s in samples if s.status)
        after = await settled_scrape(client, target.metrics_url, before, answered, target.route)
        view = gateway_view(before, after) if after else None
    return step_result(samples, config.rate, config.duration_s, view, criteria.budget_ms,
                       criteria.max_error_rate)
