"""Reading a Prometheus text exposition: one histogram and its quantiles, or every sample.

The gateway publishes cumulative histograms; the load generator scrapes them before and after a
step and reads the step's own latency distribution from the difference. Counters read back
with ``_total`` on their sample names, whatever the exposition wrote (the parser adds it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (upper bound -> count <= it), plus count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        """This histogram with ``earlier``'s observations taken out (a counter delta)."""
        before = dict(earlier.buckets)
        return Histogram(
            buckets=tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            count=self.count - earlier.count,
            sum=self.sum - earlier.sum,
        )


EMPTY = Histogram(buckets=(), count=0.0, sum=0.0)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (name, labels) -> value


def read_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by its name and labels."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample_sum(samples: Samples, name: str, **match: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``match``."""
    return sum(value for (sample, labels), value in samples.items()
               if sample == name and _matches(dict(labels), match))


def _matches(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def read_histogram(text: str, name: str, match: Mapping[str, str] | None = None) -> Histogram:
    """The sum over every series of histogram ``name`` whose labels include ``match``."""
    match = match or {}
    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if not _matches(sample.labels, match):
                continue
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
            elif sample.name == f"{name}_sum":
                total += sample.value
    return Histogram(buckets=tuple(sorted(buckets.items())), count=count, sum=total)


def histogram_quantile(q: float, hist: Histogram) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket that holds the
    q-th observation; the highest finite bound if that bucket is +Inf. NaN when empty."""
    if not hist.buckets or hist.buckets[-1][1] <= 0:
        return math.nan
    rank = q * hist.buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in hist.buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower
            if cumulative == below:
                return le
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower
