"""Which metric names exist, and which ones a PromQL expression names.

Known names come from the code and the checked-in files, never from the expressions themselves:
the gateway's registry (service.metrics.create_metrics), deploy/monitoring/triton_metrics.txt,
the recording rules' outputs, and Prometheus' own ``up``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from service.metrics import create_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING = REPO_ROOT / "deploy" / "monitoring"
RULE_FILES = (MONITORING / "rules" / "recording.yml", MONITORING / "rules" / "alerts.yml")
DASHBOARD = MONITORING / "grafana" / "dashboards" / "qa-latency.json"
TRITON_METRICS = MONITORING / "triton_metrics.txt"
PROMETHEUS_BUILTIN = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "atan2", "inf", "nan",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Every metric (or recorded series) name a PromQL expression selects."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        is_call = text[match.end():].lstrip().startswith("(")
        if not is_call and match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def gateway_metric_names() -> set[str]:
    """Every series name the gateway can expose, with _bucket/_sum/_count/_total suffixes."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count", "_created"),
                "counter": ("_total", "_created"), "gauge": ("",)}
    names: set[str] = set()
    for family in create_metrics(0.01).registry.collect():
        names.update(family.name + s for s in suffixes[family.type])
    return names


def triton_metric_names() -> dict[str, set[str]]:
    """Section ([always], [gpu]) -> names, from deploy/monitoring/triton_metrics.txt."""
    sections: dict[str, set[str]] = {}
    current = None
    for raw in TRITON_METRICS.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = set()
        elif current is not None:
            sections[current].add(line)
    return sections


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in RULE_FILES:
        groups.extend(yaml.safe_load(path.read_text())["groups"])
    return groups


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def known_names() -> set[str]:
    triton = set().union(*triton_metric_names().values())
    return gateway_metric_names() | triton | recorded_names() | PROMETHEUS_BUILTIN


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            found.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return found
