"""deploy/monitoring/triton_metrics.txt against a live Triton (QA_TEST_TRITON_METRICS_URL)."""

from __future__ import annotations

import os
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.targets import require_loopback
from tests.monitoring.catalog import triton_metric_names

URL = os.environ.get("QA_TEST_TRITON_METRICS_URL")


def exported_names(url: str) -> set[str]:
    """Family names a Triton metrics endpoint exports right now (loopback only), and its
    series' names as written (the parser drops a counter's ``_total`` from its family name)."""
    with urllib.request.urlopen(require_loopback(url), timeout=10) as response:
        text = response.read().decode()
    written = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    return {family.name for family in text_string_to_metric_families(text)} | written


def check_against_list(exported: set[str]) -> None:
    """Every [always] and [model] name is exported; [gpu] names are, whenever any GPU
    metric is."""
    sections = triton_metric_names()
    for section in ("always", "model"):
        assert sections[section] <= exported, sorted(sections[section] - exported)
    if exported & sections["gpu"]:
        assert sections["gpu"] <= exported, sorted(sections["gpu"] - exported)
    undocumented = {n for n in exported if n.startswith("nv_")} - set().union(*sections.values())
    assert not undocumented, f"Triton exports names missing from the list: {sorted(undocumented)}"


@pytest.mark.skipif(URL is None, reason="set QA_TEST_TRITON_METRICS_URL to a live Triton's "
                    "/metrics (e.g. http://127.0.0.1:8002/metrics) to verify the list")
def test_the_checked_in_list_matches_a_live_triton() -> None:
    assert URL is not None
    check_against_list(exported_names(URL))
