"""Every gateway metric, declared once. Prefix ``qa_``, base units, sub-ms buckets.

Label values are bounded: ``route`` is the route template, ``outcome`` is ``ok`` or an
``ErrorCode`` value, ``phase`` is one of ``PHASES``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "qa"
PHASES = ("tokenize", "infer", "decode")

LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006,
    0.007, 0.008, 0.009, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0, 2.5,
)
COUNT_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
TOKEN_BUCKETS = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    request_duration: Histogram
    phase_duration: Histogram
    windows_per_request: Histogram
    tokens_per_request: Histogram
    questions_per_request: Histogram
    in_flight: Gauge
    over_budget: Counter
    errors: Counter
    budget: Gauge
    ready: Gauge


def create_metrics(budget_seconds: float, registry: CollectorRegistry | None = None) -> Metrics:
    """A fresh set of metrics on its own registry (one per app instance)."""
    reg = registry or CollectorRegistry()
    m = Metrics(
        registry=reg,
        request_duration=Histogram(
            f"{PREFIX}_request_duration_seconds", "End-to-end gateway latency of a request",
            ["route", "outcome"], buckets=LATENCY_BUCKETS, registry=reg),
        phase_duration=Histogram(
            f"{PREFIX}_phase_duration_seconds",
            "Time in each phase: tokenize (validate+windows), infer (Triton round trip), decode",
            ["phase"], buckets=LATENCY_BUCKETS, registry=reg),
        windows_per_request=Histogram(
            f"{PREFIX}_windows_per_request", "Token windows sent to Triton per request",
            buckets=COUNT_BUCKETS, registry=reg),
        tokens_per_request=Histogram(
            f"{PREFIX}_tokens_per_request", "Real (unpadded) tokens per request",
            buckets=TOKEN_BUCKETS, registry=reg),
        questions_per_request=Histogram(
            f"{PREFIX}_questions_per_request", "Questions per request",
            buckets=COUNT_BUCKETS, registry=reg),
        in_flight=Gauge(f"{PREFIX}_in_flight_requests", "QA requests in progress", registry=reg),
        over_budget=Counter(
            f"{PREFIX}_requests_over_budget_total", "QA requests slower than the latency budget",
            registry=reg),
        errors=Counter(f"{PREFIX}_errors_total", "Failed requests by error code", ["code"],
                       registry=reg),
        budget=Gauge(f"{PREFIX}_latency_budget_seconds", "The configured latency budget",
                     registry=reg),
        ready=Gauge(f"{PREFIX}_backend_ready", "1 when Triton and the model are ready",
                    registry=reg),
    )
    m.budget.set(budget_seconds)
    return m
