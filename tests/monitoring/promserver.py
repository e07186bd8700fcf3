"""A real Prometheus (Debian's ``prometheus`` binary) for integration tests.

It listens on a free loopback port with a generated config that scrapes the given targets
every second and loads the project's rule files, stores into a temp dir, and is stopped by
the context manager. Readiness and results are polled with deadlines.
"""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from loadtest.ready import wait_http
from loadtest.targets import require_loopback
from tests.monitoring.catalog import MONITORING, RULE_FILES

PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_config(job: str, metrics_url: str) -> dict[str, Any]:
    parts = urlsplit(require_loopback(metrics_url))
    return {"job_name": job, "metrics_path": parts.path or "/metrics",
            "static_configs": [{"targets": [parts.netloc]}]}


def local_config(gateway_metrics_url: str, triton_metrics_url: str) -> dict[str, Any]:
    """deploy/monitoring/prometheus.yml with these targets, 1 s intervals, absolute rule paths."""
    config: dict[str, Any] = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(p) for p in RULE_FILES]
    config["scrape_configs"] = [scrape_config("gateway", gateway_metrics_url),
                                scrape_config("triton", triton_metrics_url)]
    return config


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def scalar(self, expr: str) -> float:
        """The value of a one-series query, NaN if it has no series."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else math.nan

    def wait_for(self, expr: str, accept: Callable[[float], bool], deadline_s: float = 90) -> float:
        """Poll until the one-series query's value is accepted; its last value on timeout."""
        end = time.monotonic() + deadline_s
        value = math.nan
        while time.monotonic() < end:
            value = self.scalar(expr)
            if accept(value):
                return value
            time.sleep(0.5)
        raise TimeoutError(f"{expr} never accepted within {deadline_s} s (last value {value})")

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.url}{path}", timeout=10)
        response.raise_for_status()
        return response.json()["data"]


@contextmanager
def running_prometheus(config: dict[str, Any], workdir: Path) -> Iterator[Prometheus]:
    """Prometheus with ``config`` on 127.0.0.1:<free port>, storage under ``workdir``."""
    if PROMETHEUS is None:
        raise RuntimeError("prometheus not installed (apt-get install -y prometheus)")
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/-/ready", proc, 60, interval_s=0.1)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
