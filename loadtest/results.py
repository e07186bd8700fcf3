"""What a load test found, as plain data that serialises to JSON (NaN becomes null)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.generator import Sample
from loadtest.stats import LatencySummary, percentile, summarize_ms

PHASE_ORDER = ("tokenize", "infer", "decode")


@dataclass(frozen=True)
class GatewayView:
    """The gateway's own view of one step, from deltas of its /metrics histograms (ms)."""

    count: float
    mean_ms: float
    p50_ms: float
    p99_ms: float
    phases: dict[str, dict[str, float]]  # phase -> mean_ms, p50_ms, p99_ms


@dataclass(frozen=True)
class StepResult:
    offered_rps: float
    duration_s: float
    scheduled: int
    completed: int
    ok: int
    wall_s: float  # step start to last response
    achieved_rps: float  # 2xx responses per second of the step (or of wall time, if longer)
    error_rate: float  # non-2xx (incl. timeouts) / completed
    errors: dict[str, int]
    latency_ms: LatencySummary  # every request, from its scheduled send time
    ok_latency_ms: LatencySummary  # 2xx only
    lag_ms: LatencySummary  # how late the generator sent (its own saturation)
    phases_ms: dict[str, dict[str, float]]  # Server-Timing per phase: mean, p50, p99
    gateway: GatewayView | None
    passed: bool | None  # p99 within budget and error rate within limit; None without budget
    samples: dict[str, list[float]] = field(repr=False)  # scheduled_s, latency_ms, status


@dataclass(frozen=True)
class RunResult:
    kind: str  # "run" or "capacity"
    url: str
    started_at: str
    budget_ms: float | None
    max_error_rate: float
    settings: dict[str, Any]
    steps: list[StepResult]
    capacity_rps: float | None  # highest offered rate that passed (capacity runs)
    notes: list[str]


def _phase_stats(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    names: list[str] = []
    for s in samples:
        names.extend(n for n in s.phases_ms if n not in names)
    stats: dict[str, dict[str, float]] = {}
    for name in names:
        values = np.array([s.phases_ms[name] for s in samples if name in s.phases_ms])
        stats[name] = {"mean": float(values.mean()), "p50": percentile(values, 50),
                       "p99": percentile(values, 99), "count": float(values.size)}
    return stats


def step_result(
    samples: Sequence[Sample], offered_rps: float, duration_s: float, gateway: GatewayView | None,
    budget_ms: float | None, max_error_rate: float,
) -> StepResult:
    """Everything a report needs about one step, from its raw samples."""
    ok = [s for s in samples if s.ok]
    latency = summarize_ms([s.latency_s for s in samples])
    wall = max((s.scheduled_s + s.latency_s for s in samples), default=0.0)
    error_rate = (len(samples) - len(ok)) / len(samples) if samples else math.nan
    passed = None
    if budget_ms is not None:
        passed = bool(samples) and latency.p99 <= budget_ms and error_rate <= max_error_rate
    return StepResult(
        offered_rps=offered_rps, duration_s=duration_s, scheduled=len(samples),
        completed=len(samples), ok=len(ok), wall_s=wall,
        achieved_rps=len(ok) / max(duration_s, wall), error_rate=error_rate,
        errors=dict(Counter(s.error for s in samples if s.error)), latency_ms=latency,
        ok_latency_ms=summarize_ms([s.latency_s for s in ok]),
        lag_ms=summarize_ms([max(s.lag_s, 0.0) for s in samples]),
        phases_ms=_phase_stats(ok), gateway=gateway, passed=passed,
        samples={
            "scheduled_s": [round(s.scheduled_s, 6) for s in samples],
            "latency_ms": [round(s.latency_s * 1000.0, 4) for s in samples],
            "status": [float(s.status) for s in samples],
        },
    )


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def to_dict(result: RunResult) -> dict[str, Any]:
    """The result as JSON-ready data: NaN and inf become None."""
    data: dict[str, Any] = _finite(asdict(result))
    return data


def write_json(result: RunResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_dict(result), indent=1, allow_nan=False))


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
