"""Prometheus config and rules: promtool checks them and runs their unit tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from service.errors import STATUS
from tests.monitoring.catalog import MONITORING, RULE_FILES, rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install -y prometheus)")


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=MONITORING)


@needs_promtool
def test_rule_files_are_valid() -> None:
    result = promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    tests = sorted((MONITORING / "rules" / "tests").glob("*.yml"))
    assert len(tests) >= 2
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


@needs_promtool
@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus.local.yml"])
def test_prometheus_configs_are_valid(config: str) -> None:
    result = promtool("check", "config", MONITORING / config)
    assert result.returncode == 0, result.stdout + result.stderr


def test_local_config_differs_from_compose_only_in_targets() -> None:
    compose = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    local = yaml.safe_load((MONITORING / "prometheus.local.yml").read_text())
    targets = {"gateway:8080": "127.0.0.1:8080", "triton:8002": "127.0.0.1:8002"}
    for job in compose["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = [targets[t] for t in static["targets"]]
    assert local == compose
    assert {j["job_name"] for j in compose["scrape_configs"]} == {"gateway", "triton"}


def test_server_error_ratio_counts_exactly_the_server_side_codes() -> None:
    # One source of truth: the codes of service/errors.py answered with 429 or 5xx.
    server_side = {code.value for code, status in STATUS.items() if status == 429 or status >= 500}
    exprs = [r["expr"] for r in rules() if r.get("record", "").startswith("qa:server_errors:")]
    assert exprs
    for expr in exprs:
        (pattern,) = re.findall(r'outcome=~"([^"]+)"', expr)
        assert set(pattern.split("|")) == server_side


def test_every_alert_has_severity_summary_and_description() -> None:
    alerts = [r for r in rules() if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "QaLatencyP99OverBudget", "QaHighErrorRate", "TritonDown", "QaGatewayNotReady"}
    for alert in alerts:
        assert alert["labels"]["severity"] in {"page", "ticket"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
