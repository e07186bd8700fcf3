"""Capacity search, gateway histogram deltas, SQuAD workload and the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from loadtest.capacity import find_capacity, rate_ladder
from loadtest.cli import main
from loadtest.gateway import PHASE_HISTOGRAM, REQUEST_HISTOGRAM, parse_snapshot
from loadtest.generator import Sample
from loadtest.promtext import Histogram, histogram_quantile
from loadtest.results import StepResult, step_result
from loadtest.workload import squad_payloads, with_options
from service.metrics import create_metrics
from tests.loadtest.conftest import StartGateway

# --- the gateway's histograms ------------------------------------------------------------------

def test_histogram_quantile_has_prometheus_semantics() -> None:
    # The same buckets as deploy/monitoring/rules/tests/recording_test.yml, same answers.
    hist = Histogram(buckets=((0.005, 85), (0.01, 97), (0.02, 100), (math.inf, 100)),
                     count=100, sum=0.6)
    assert histogram_quantile(0.50, hist) == pytest.approx(0.005 * 50 / 85)
    assert histogram_quantile(0.90, hist) == pytest.approx(0.005 + 0.005 * 5 / 12)
    assert histogram_quantile(0.99, hist) == pytest.approx(0.01 + 0.01 * 2 / 3)
    tail = Histogram(buckets=((0.005, 90), (math.inf, 100)), count=100, sum=1.0)
    assert histogram_quantile(0.99, tail) == 0.005  # in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile(0.5, Histogram((), 0, 0)))


def test_snapshots_of_the_real_registry_give_per_step_deltas() -> None:
    metrics = create_metrics(0.01)
    qa = metrics.request_duration.labels(route="/v1/qa", outcome="ok")
    for seconds in (0.001, 0.002, 0.003):
        qa.observe(seconds)
    metrics.request_duration.labels(route="/health/ready", outcome="ok").observe(0.5)
    before = parse_snapshot(generate_latest(metrics.registry).decode())
    for seconds in [0.0045] * 9 + [0.0095]:
        qa.observe(seconds)
        metrics.phase_duration.labels(phase="infer").observe(seconds / 2)
    after = parse_snapshot(generate_latest(metrics.registry).decode())
    delta = after.request.minus(before.request)
    assert delta.count == 10 and delta.sum == pytest.approx(9 * 0.0045 + 0.0095)
    assert 0.004 < histogram_quantile(0.5, delta) <= 0.005  # in the (4, 5] ms bucket
    assert 0.009 < histogram_quantile(0.99, delta) <= 0.010
    assert after.phases["infer"].minus(before.phases["infer"]).count == 10
    names = {f.name for f in metrics.registry.collect()}
    assert {REQUEST_HISTOGRAM, PHASE_HISTOGRAM} <= names


# --- capacity at SLO ---------------------------------------------------------------------------

def test_rate_ladder() -> None:
    assert rate_ladder(5, 400) == [5, 10, 20, 40, 80, 160, 320, 400]
    assert rate_ladder(10, 10) == [10]
    with pytest.raises(ValueError):
        rate_ladder(0, 10)


def fake_step(rate: float, capacity: float) -> StepResult:
    """A step whose p99 is 5 ms below ``capacity`` and 50 ms above it."""
    latency = 0.005 if rate <= capacity else 0.050
    samples = [Sample(i / 100, 0.0, latency, 200, "", {}) for i in range(100)]
    return step_result(samples, rate, 1.0, None, budget_ms=10.0, max_error_rate=0.01)


async def test_capacity_climbs_then_bisects() -> None:
    measured: list[float] = []

    async def measure(rate: float) -> StepResult:
        measured.append(rate)
        return fake_step(rate, capacity=130)

    steps, best = await find_capacity(measure, rate_ladder(10, 400), refine=3)
    assert measured == [10, 20, 40, 80, 160, 120, 140, 130]
    assert best == 130
    assert [s.offered_rps for s in steps] == sorted(measured)
    assert all(s.passed == (s.offered_rps <= 130) for s in steps)


async def test_capacity_is_none_when_the_first_step_fails() -> None:
    async def measure(rate: float) -> StepResult:
        return fake_step(rate, capacity=1)

    steps, best = await find_capacity(measure, rate_ladder(10, 400), refine=2)
    assert best is None and len(steps) == 1 and steps[0].passed is False


# --- the workload ------------------------------------------------------------------------------

def test_squad_workload_is_real_shuffled_and_reproducible() -> None:
    bodies = squad_payloads(limit=50, seed=1)
    assert bodies == squad_payloads(limit=50, seed=1) != squad_payloads(limit=50, seed=2)
    assert all(set(b) == {"context", "question"} for b in bodies)
    assert all(len(b["context"]) > 100 and b["question"].strip() for b in bodies)
    grouped = squad_payloads(questions_per_request=3)
    assert all(1 <= len(b["questions"]) <= 3 for b in grouped)
    assert sum(len(b["questions"]) for b in grouped) == len(squad_payloads())
    assert with_options(bodies[:1], {"top_k": 3})[0]["top_k"] == 3


# --- the command line --------------------------------------------------------------------------

def test_cli_run_writes_results_and_report(start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = start_gateway(delay_s=0.003)
    out = tmp_path / "run"
    code = main(["run", "--url", gateway.base_url, "--rate", "40", "--duration", "1",
                 "--warmup", "0.2", "--budget-ms", "250", "--out", str(out), "--quiet"])
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    (step,) = result["steps"]
    assert result["kind"] == "run" and step["completed"] == 40 and step["passed"] is True
    assert step["gateway"]["count"] == 40  # the warm-up is not in the step's delta
    assert step["latency_ms"]["p50"] >= 3.0
    assert len(step["samples"]["latency_ms"]) == 40
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 6


def test_cli_capacity_finds_the_knee(start_gateway: StartGateway, tmp_path: Path) -> None:
    # One request at a time, 5 ms each: about 200 rps at most; 320 rps must fail.
    gateway = start_gateway(delay_s=0.005, concurrency=1)
    out = tmp_path / "cap"
    code = main(["capacity", "--url", gateway.base_url, "--start-rate", "20", "--max-rate", "320",
                 "--factor", "4", "--step-duration", "1", "--warmup", "0", "--refine", "0",
                 "--budget-ms", "100", "--timeout", "2", "--out", str(out), "--quiet"])
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    rates = [s["offered_rps"] for s in result["steps"]]
    assert rates[0] == 20 and result["steps"][0]["passed"] is True
    assert result["steps"][-1]["passed"] is False and rates[-1] in (80, 320)
    assert result["capacity_rps"] in (20, 80)


def test_cli_refuses_remote_targets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["run", "--url", "http://192.168.0.10:8080", "--rate", "1", "--duration", "1",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 2
    assert "only 127.0.0.0/8, localhost and ::1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_cli_report_rerenders_from_json(start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = start_gateway()
    out = tmp_path / "run"
    assert main(["run", "--url", gateway.base_url, "--rate", "20", "--duration", "0.5",
                 "--warmup", "0", "--out", str(out), "--quiet"]) == 0
    (out / "report.html").unlink()
    assert main(["report", str(out / "results.json")]) == 0
    assert (out / "report.html").stat().st_size > 10_000
