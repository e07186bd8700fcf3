"""Exact latency percentiles over every recorded sample (no histogram rounding)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile(samples: Sequence[float] | npt.NDArray[np.float64], q: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least ``q``% of samples <= it.

    This is the value HdrHistogram reports (and numpy's ``method="inverted_cdf"``): always a
    latency that was actually observed, never an interpolation. NaN for no samples.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    values = np.sort(np.asarray(samples, dtype=np.float64))
    if values.size == 0:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * values.size - 1e-9))
    return float(values[rank - 1])


@dataclass(frozen=True)
class LatencySummary:
    """Latency of a set of requests, in milliseconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float


def summarize_ms(samples_s: Sequence[float] | npt.NDArray[np.float64]) -> LatencySummary:
    """Summary in ms of latencies given in seconds."""
    ms = np.asarray(samples_s, dtype=np.float64) * 1000.0
    if ms.size == 0:
        nan = math.nan
        return LatencySummary(0, nan, nan, nan, nan, nan, nan, nan)
    p50, p90, p95, p99, p999 = (percentile(ms, q) for q in PERCENTILES)
    return LatencySummary(
        count=int(ms.size), mean=float(ms.mean()), p50=p50, p90=p90, p95=p95, p99=p99,
        p999=p999, max=float(ms.max()),
    )
