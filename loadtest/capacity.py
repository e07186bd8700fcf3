"""Capacity at SLO: the highest offered rate whose p99 stays within the latency budget."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loadtest.results import StepResult

Measure = Callable[[float], Awaitable[StepResult]]


def rate_ladder(start: float, max_rate: float, factor: float = 2.0) -> list[float]:
    """``start``, ``start*factor``, ... below ``max_rate``, then ``max_rate`` itself."""
    if start <= 0 or max_rate < start or factor <= 1:
        raise ValueError("need 0 < start <= max_rate and factor > 1")
    rates = []
    rate = start
    while rate < max_rate:
        rates.append(round(rate, 3))
        rate *= factor
    rates.append(max_rate)
    return rates


async def find_capacity(
    measure: Measure, ladder: list[float], refine: int = 0, min_gap: float = 1.0,
    may_continue: Callable[[], bool] = lambda: True,
) -> tuple[list[StepResult], float | None]:
    """Climb ``ladder`` until a step fails, then bisect ``refine`` times between the last pass
    and the first failure. Returns every step (by offered rate) and the highest passing rate."""
    steps: list[StepResult] = []
    best: float | None = None
    failed: float | None = None
    for rate in ladder:
        if not may_continue():
            break
        step = await measure(rate)
        steps.append(step)
        if not step.passed:
            failed = rate
            break
        best = rate
    for _ in range(refine):
        if best is None or failed is None or failed - best < 2 * min_gap or not may_continue():
            break
        mid = round((best + failed) / 2.0, 1)
        step = await measure(mid)
        steps.append(step)
        if step.passed:
            best = mid
        else:
            failed = mid
    return sorted(steps, key=lambda s: s.offered_rps), best
