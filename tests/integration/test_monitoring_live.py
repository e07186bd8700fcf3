"""Prometheus scraping the real gateway and Triton, with the project's rules, read back over
its HTTP API; and the checked-in Triton metric list against the real Triton."""

from __future__ import annotations

import asyncio
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from loadtest.generator import StepConfig, new_client, run_step
from loadtest.stats import percentile
from loadtest.workload import squad_payloads
from service.metrics import LATENCY_BUCKETS
from tests.monitoring.catalog import RULE_FILES
from tests.monitoring.promserver import local_config, running_prometheus
from tests.monitoring.test_triton_metrics import check_against_list, exported_names

pytestmark = pytest.mark.integration


def bucket_upper_edge(seconds: float) -> float:
    return next((le for le in LATENCY_BUCKETS if seconds <= le), math.inf)


def send_traffic(gateway_url: str, rate: float, duration_s: float) -> list[float]:
    """Real SQuAD questions at ``rate`` for ``duration_s``; latencies (s) of 2xx responses."""
    bodies = squad_payloads(limit=500)

    async def main() -> list[float]:
        async with new_client() as client:
            samples = await run_step(client, f"{gateway_url}/v1/qa", bodies,
                                     StepConfig(rate=rate, duration_s=duration_s))
        assert all(s.ok for s in samples), {s.error for s in samples}
        return [s.latency_s for s in samples]

    return asyncio.run(main())


def test_checked_in_triton_metric_list_matches_the_real_triton(live_service: Any) -> None:
    check_against_list(exported_names(live_service.triton_metrics_url))


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus not installed (apt-get install -y prometheus)")
def test_prometheus_reads_the_gateway_p99_through_the_recording_rules(
    live_service: Any, tmp_path: Path,
) -> None:
    config = local_config(f"{live_service.gateway_url}/metrics", live_service.triton_metrics_url)
    with running_prometheus(config, tmp_path) as prom:
        prom.wait_for('sum(up{job=~"gateway|triton"})', lambda v: v == 2, deadline_s=30)
        count = 'sum(qa_request_duration_seconds_count{route="/v1/qa"})'
        before = prom.wait_for(f"{count} or vector(0)", lambda v: v >= 0, deadline_s=30)
        latencies = send_traffic(live_service.gateway_url, rate=8, duration_s=6)

        # Every request reached Prometheus through the gateway's own counter.
        prom.wait_for(count, lambda v: v - before == len(latencies), deadline_s=30)
        p99 = prom.wait_for("qa:request_duration_seconds:p99_1m", lambda v: v > 0, deadline_s=30)
        # The server's time is part of the client's: the gateway's p99 (interpolated inside its
        # bucket) cannot be above the bucket that holds the client-side p99.
        client_p99 = percentile(latencies, 99)
        assert p99 <= bucket_upper_edge(client_p99), (p99, client_p99)

        rate = prom.wait_for("qa:requests:rate1m", lambda v: v > 0, deadline_s=30)
        assert 0 < rate <= 8 * 1.5
        batch = prom.wait_for('model:triton_batch_size:avg_rate1m{model="bert_qa"}',
                              lambda v: v >= 1, deadline_s=30)
        assert batch >= 1
        queue = prom.scalar('model:triton_queue_seconds:avg_rate1m{model="bert_qa"}')
        compute = prom.scalar('model:triton_compute_infer_seconds:avg_rate1m{model="bert_qa"}')
        assert 0 <= queue < 2.5 and 0 < compute < 2.5
        assert prom.scalar("qa:latency_budget_seconds") > 0
        assert_every_rule_evaluates(prom.get("/api/v1/rules"))
        assert prom.query('ALERTS{alertname=~"TritonDown|QaGatewayDown|QaGatewayNotReady"}') == []


def assert_every_rule_evaluates(rules: dict[str, Any]) -> None:
    """All the project's rules are loaded and none failed to evaluate on real series."""
    files = {g["file"] for g in rules["groups"]}
    assert files == {str(p) for p in RULE_FILES}
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
