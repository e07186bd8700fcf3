"""The load generator against the real service: its percentiles agree with the gateway's own
histograms for the same requests."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.metrics import LATENCY_BUCKETS

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def bucket_edges(seconds: float) -> tuple[float, float]:
    """(lower, upper] edges in seconds of the gateway bucket that holds ``seconds``."""
    lower = 0.0
    for le in LATENCY_BUCKETS:
        if seconds <= le:
            return lower, le
        lower = le
    return lower, math.inf


def test_generator_and_gateway_agree_on_the_same_run(live_service: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadtest", "run", "--url", live_service.gateway_url,
           "--rate", "8", "--duration", "8", "--warmup", "1", "--budget-ms", "10",
           "--out", str(out), "--quiet"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "results.json").read_text())
    assert (out / "report.html").stat().st_size > 50_000  # six inline PNG plots
    (step,) = result["steps"]
    assert step["completed"] == 64 and step["ok"] == 64 and step["error_rate"] == 0

    gateway = step["gateway"]
    assert gateway["count"] == 64  # the histogram delta holds exactly this run's requests
    for q in ("p50", "p99"):
        client_ms = step["latency_ms"][q]
        lower, upper = bucket_edges(gateway[f"{q}_ms"] / 1000)
        # A request's gateway time is part of its client time, so the client's quantile is at
        # least the lower edge of the gateway's bucket ...
        assert client_ms >= lower * 1000, (q, client_ms, gateway)
        # ... and adds only its own send lag and the HTTP round trip on top.
        allowance_ms = step["lag_ms"]["max"] + 10
        assert client_ms <= upper * 1000 * 1.25 + allowance_ms, (q, client_ms, gateway)

    # The Server-Timing breakdown, read per response, agrees with the phase histograms.
    phases = step["phases_ms"]
    assert {"tokenize", "infer", "decode"} <= set(phases)
    for phase in ("tokenize", "infer", "decode"):
        assert phases[phase]["count"] == 64
        histogram_mean = gateway["phases"][phase]["mean_ms"]
        assert phases[phase]["mean"] == pytest.approx(histogram_mean, rel=0.05, abs=0.05)
