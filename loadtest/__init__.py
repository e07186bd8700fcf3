"""Open-loop load testing for the QA gateway: fixed-schedule arrivals, exact percentiles,
capacity at the p99 budget, and a self-contained HTML report.

Only loopback targets are accepted (127.0.0.0/8, localhost, ::1).
"""

from loadtest.capacity import find_capacity, rate_ladder
from loadtest.generator import Sample, StepConfig, StepState, new_client, run_step
from loadtest.measure import Criteria, Target, measure_step
from loadtest.results import GatewayView, RunResult, StepResult, step_result, to_dict
from loadtest.servertiming import parse_server_timing
from loadtest.stats import LatencySummary, percentile, summarize_ms
from loadtest.targets import TargetNotAllowed, require_loopback

__all__ = [
    "Criteria", "GatewayView", "LatencySummary", "RunResult", "Sample", "StepConfig",
    "StepResult", "StepState", "Target", "TargetNotAllowed", "find_capacity", "measure_step",
    "new_client", "parse_server_timing", "percentile", "rate_ladder", "require_loopback",
    "run_step", "step_result", "summarize_ms", "to_dict",
]
