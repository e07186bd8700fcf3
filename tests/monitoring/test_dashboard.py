"""The Grafana dashboard and the rules name only metrics that really exist."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.catalog import (
    DASHBOARD,
    MONITORING,
    dashboard_exprs,
    gateway_metric_names,
    known_names,
    metric_names,
    recorded_names,
    rules,
    triton_metric_names,
)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_metric_name_extraction() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, phase) (rate(qa_phase_duration_seconds_bucket'
            '{phase=~"infer|decode", route="/v1/qa"}[5m] offset 1m))) > on() group_left '
            'max(qa:latency_budget_seconds) * 1e3 and up{job="triton"} == 0')
    assert metric_names(expr) == {
        "qa_phase_duration_seconds_bucket", "qa:latency_budget_seconds", "up"}
    assert metric_names("sum(rate(x_total[$__rate_interval])) / 1e6") == {"x_total"}


def test_gateway_names_come_from_the_registry() -> None:
    names = gateway_metric_names()
    assert {"qa_request_duration_seconds_bucket", "qa_request_duration_seconds_count",
            "qa_requests_over_budget_total", "qa_errors_total", "qa_in_flight_requests",
            "qa_latency_budget_seconds", "qa_backend_ready"} <= names
    assert all(n.startswith("qa_") for n in names)


def test_every_rule_names_only_existing_metrics() -> None:
    known = known_names()
    for rule in rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, (rule.get("record") or rule.get("alert"), unknown)


def test_every_dashboard_query_names_only_existing_metrics(dashboard: dict[str, Any]) -> None:
    known = known_names()
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) >= 20
    for title, expr in exprs:
        unknown = metric_names(expr) - known
        assert not unknown, (title, expr, unknown)


def test_the_dashboard_covers_what_operators_need(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(e) for _, e in dashboard_exprs(dashboard)))
    assert {"qa:request_duration_seconds:p99_1m", "qa:latency_budget_seconds",
            "qa:phase_duration_seconds:p99_1m", "model:triton_batch_size:avg_rate1m",
            "model:triton_queue_seconds:avg_rate1m",
            "model:triton_compute_infer_seconds:avg_rate1m", "nv_gpu_utilization",
            "qa:errors:rate1m", "qa_in_flight_requests", "qa_backend_ready"} <= used
    batch = next(r["expr"] for r in rules()
                 if r.get("record") == "model:triton_batch_size:avg_rate1m")
    assert metric_names(batch) == {"nv_inference_count", "nv_inference_exec_count"}


def test_every_recording_rule_is_used(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(e) for _, e in dashboard_exprs(dashboard)))
    used |= set().union(*(metric_names(r["expr"]) for r in rules()))
    for_ad_hoc_queries = {"qa:requests:rate5m", "qa:server_errors:ratio_rate1m"}
    assert recorded_names() - used == for_ad_hoc_queries


def test_panels_are_wired_to_the_provisioned_datasource(dashboard: dict[str, Any]) -> None:
    provisioning = MONITORING / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
    providers = yaml.safe_load((provisioning / "dashboards" / "dashboards.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_triton_list_has_what_the_dashboard_needs() -> None:
    sections = triton_metric_names()
    assert set(sections) == {"always", "model", "gpu"}
    assert {"nv_inference_count", "nv_inference_exec_count", "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us"} <= sections["always"]
    assert "nv_gpu_utilization" in sections["gpu"]


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (apt-get install -y prometheus)")
def test_every_dashboard_query_is_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    # promtool has no "parse this expression"; a rule file of one recording rule per query
    # gets the server's own parser. Grafana's $__rate_interval becomes a real duration.
    exprs = [e.replace("$__rate_interval", "1m") for _, e in dashboard_exprs(dashboard)]
    group = {"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
