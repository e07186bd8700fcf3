"""Real processes: Triton from the nvidia-pytriton wheel, the gateway, the launcher.

Readiness is polled with deadlines; nothing sleeps a fixed time to synchronise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loadtest.ready import wait_http
from service.triton_runtime import TritonInstall

REPO = Path(__file__).resolve().parents[2]
ONNX = REPO / "build" / "onnx" / "minilm-l6-squad" / "model-fused.onnx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Ports:
    gateway: int = field(default_factory=free_port)
    http: int = field(default_factory=free_port)
    grpc: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            QA_PORT=str(self.gateway), QA_HOST="127.0.0.1",
            QA_TRITON_URL=f"127.0.0.1:{self.grpc}", QA_TRITON_HTTP_PORT=str(self.http),
            QA_TRITON_METRICS_PORT=str(self.metrics), QA_LOG_LEVEL="warning",
            BERT_QA_THREADS="2",
        )
        env.update(extra)
        return env


@dataclass
class LiveService:
    gateway_url: str
    triton_url: str  # Triton HTTP
    triton_metrics_url: str
    ports: Ports


def _require_artifacts() -> None:
    if not ONNX.exists():
        pytest.skip(f"{ONNX} missing: run `make model` (make test builds it)")


@pytest.fixture(scope="session")
def live_service() -> Iterator[LiveService]:
    """Triton + gateway started by the project's launcher, as `make run` does."""
    _require_artifacts()
    ports = Ports()
    # CI's 2-core CPU is far slower than a GPU: a generous deadline keeps tests about behaviour
    env = ports.env(QA_REQUEST_TIMEOUT_MS="30000")
    proc = subprocess.Popen([sys.executable, "-m", "service.launcher"], env=env, cwd=REPO)
    try:
        wait_http(f"http://127.0.0.1:{ports.gateway}/health/ready", proc)
        yield LiveService(
            gateway_url=f"http://127.0.0.1:{ports.gateway}",
            triton_url=f"http://127.0.0.1:{ports.http}",
            triton_metrics_url=f"http://127.0.0.1:{ports.metrics}/metrics",
            ports=ports,
        )
    finally:
        stop(proc)


@dataclass
class SeparateProcesses:
    triton: subprocess.Popen[bytes]
    gateway: subprocess.Popen[bytes]
    gateway_url: str


@pytest.fixture
def separate_processes(tmp_path: Path) -> Iterator[SeparateProcesses]:
    """Triton and the gateway as two processes, so a test can kill Triton alone."""
    _require_artifacts()
    ports = Ports()
    install = TritonInstall.find()
    cmd = install.command(REPO / "model_repository", install.backend_dir(REPO / "build" / "triton"),
                          ports.http, ports.grpc, ports.metrics)
    triton = subprocess.Popen(cmd, env=install.environment(REPO, base=ports.env()),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{ports.http}/v2/health/ready", triton)
    gateway = subprocess.Popen([sys.executable, "-m", "service"],
                               env=ports.env(QA_REQUEST_TIMEOUT_MS="3000"), cwd=REPO)
    try:
        wait_http(f"http://127.0.0.1:{ports.gateway}/health/ready", gateway)
        yield SeparateProcesses(triton, gateway, f"http://127.0.0.1:{ports.gateway}")
    finally:
        stop(gateway)
        stop(triton)
