"""``python -m service.launcher`` (``make run``) when something goes wrong.

Each case runs the real launcher and checks: its exit status, that it exits within a bound,
that its last line says what failed and what to do (and is its only line at warning level),
that it prints no traceback, and that no process it started (tritonserver, its python backend
stubs, the gateway) is left: every process of a run carries a marker in its environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.launcher import check_ports
from service.settings import Settings
from service.triton_runtime import STUB_SHM_PREFIX, remove_stub_shared_memory
from tests.integration.conftest import ONNX, REPO, Ports, wait_http

pytestmark = pytest.mark.integration

LAUNCHER_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} launcher (.*)$")


def marked_processes(marker: str) -> list[tuple[int, list[str]]]:
    """Live processes whose environment holds ``marker`` (a zombie's environ reads empty)."""
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (proc_dir / "environ").read_bytes():
                argv = (proc_dir / "cmdline").read_bytes().decode(errors="replace").split("\0")
                found.append((int(proc_dir.name), argv))
        except OSError:
            continue
    return found


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    output_file: Path
    marker: str

    def output(self) -> str:
        return self.output_file.read_text(errors="replace")

    def processes(self) -> list[tuple[int, list[str]]]:
        return marked_processes(self.marker)

    def find(self, predicate: Callable[[list[str]], bool], timeout_s: float = 60) -> int:
        """The pid of the run's first process whose argv matches, waiting for it to appear."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()[-3000:]
            for pid, argv in self.processes():
                if predicate(argv):
                    return pid
            time.sleep(0.05)
        raise TimeoutError("no such process")

    def wait_for_output(self, text: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()[-3000:]
            time.sleep(0.02)

    def wait(self, within_s: float) -> tuple[int, str]:
        """Exit status and output, failing if the launcher runs past ``within_s``."""
        try:
            code = self.proc.wait(within_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launcher still running after {within_s} s:\n{self.output()[-3000:]}")
        return code, self.output()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def start(ports: Ports | None = None, **env: str) -> Run:
        marker = f"launcher-test-{uuid.uuid4().hex}"
        out = tmp_path / f"launcher-{len(runs)}.log"
        full_env = (ports or Ports()).env(LAUNCHER_TEST_RUN=marker, **env)
        with out.open("wb") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "service.launcher"], env=full_env,
                                    cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        runs.append(Run(proc, out, marker))
        return runs[-1]

    yield start
    for run in runs:  # whatever a failed test left
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        for pid, argv in run.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            remove_stub_shared_memory(argv)


def assert_failed_cleanly(run: Run, within_s: float, *expected: str) -> str:
    code, out = run.wait(within_s)
    assert code == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [m[1] for m in map(LAUNCHER_LINE.match, out.splitlines()) if m]
    assert len(lines) == 1, lines  # QA_LOG_LEVEL=warning: the error alone
    assert out.rstrip().splitlines()[-1].endswith(lines[0]), "the error is not the last line"
    for text in expected:
        assert text in lines[0], lines[0]
    assert run.processes() == []
    return lines[0]


def listening_on(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind((host, port))
    sock.listen()
    return sock


def require_model() -> None:
    if not ONNX.exists():
        pytest.skip(f"{ONNX} missing: run `make model` (make test builds it)")


def test_gateway_port_in_use_fails_before_starting_anything(launch: Callable[..., Run]) -> None:
    ports = Ports()
    with listening_on("127.0.0.1", ports.gateway):
        run = launch(ports)
        line = assert_failed_cleanly(run, 20, f"port {ports.gateway} ", "in use", "QA_PORT")
    assert "starting Triton" not in run.output() and "tritonserver" not in run.output()
    assert line.startswith("port"), line


@pytest.mark.parametrize(("port_name", "setting"), [
    ("http", "QA_TRITON_HTTP_PORT"), ("grpc", "QA_TRITON_URL"), ("metrics", "QA_TRITON_METRICS_PORT"),
])
def test_triton_port_in_use_names_its_setting(
    launch: Callable[..., Run], port_name: str, setting: str
) -> None:
    ports = Ports()
    port = getattr(ports, port_name)
    with listening_on("0.0.0.0", port):  # Triton binds every address
        run = launch(ports)
        assert_failed_cleanly(run, 20, f"port {port} ", "in use", setting)
    assert "tritonserver" not in run.output()


def test_one_port_named_twice_is_refused(launch: Callable[..., Run]) -> None:
    ports = Ports()
    run = launch(ports, QA_TRITON_METRICS_PORT=str(ports.http))
    assert_failed_cleanly(run, 20, "QA_TRITON_HTTP_PORT and QA_TRITON_METRICS_PORT", str(ports.http))


def test_missing_model_repository(launch: Callable[..., Run], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-repository"
    run = launch(QA_MODEL_REPOSITORY=str(missing))
    assert_failed_cleanly(run, 20, str(missing), "does not exist", "QA_MODEL_REPOSITORY")
    assert "tritonserver" not in run.output()


def test_model_that_fails_to_load_ends_the_launcher_at_once(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    """Triton exits after the model fails: the launcher says why (Triton's own reason, not
    its Python traceback) without waiting for QA_TRITON_STARTUP_TIMEOUT_S."""
    missing = tmp_path / "missing.onnx"
    run = launch(BERT_QA_ONNX=str(missing), QA_TRITON_STARTUP_TIMEOUT_S="120")
    line = assert_failed_cleanly(run, 60, "Triton exited with code 1 before it was ready",
                                 "failed to load 'bert_qa'", str(missing), "File doesn't exist",
                                 "QA_MODEL_REPOSITORY", "BERT_QA_")
    assert "At:" not in line and "\\n" not in line


def test_startup_timeout_stops_triton(launch: Callable[..., Run]) -> None:
    require_model()
    run = launch(QA_TRITON_STARTUP_TIMEOUT_S="1")
    assert_failed_cleanly(run, 30, "Triton not ready after 1 s", "QA_TRITON_STARTUP_TIMEOUT_S")


@pytest.mark.parametrize(("victim", "other"), [("Triton", "the gateway"), ("the gateway", "Triton")])
def test_a_child_killed_after_ready_stops_the_other(
    launch: Callable[..., Run], victim: str, other: str
) -> None:
    require_model()
    ports = Ports()
    run = launch(ports)
    wait_http(f"http://127.0.0.1:{ports.gateway}/health/ready", run.proc, 120)
    if victim == "Triton":
        pid = run.find(lambda argv: argv[0].endswith("/tritonserver"))
        run.find(lambda argv: argv[0].endswith("triton_python_backend_stub"))
    else:
        pid = run.find(lambda argv: argv[1:3] == ["-m", "service"])
    os.kill(pid, signal.SIGKILL)
    assert_failed_cleanly(run, 30, f"{victim} was killed by SIGKILL", f"stopped {other} too")


@pytest.mark.parametrize(("signum", "moment"), [
    (signal.SIGTERM, "as the model instance starts"), (signal.SIGINT, "as Triton starts"),
])
def test_signal_during_triton_startup_stops_cleanly(
    launch: Callable[..., Run], signum: int, moment: str
) -> None:
    """Exit 0, nothing left. Stopped as the model instance starts, Triton leaves its python
    backend stub waiting forever (most times): the launcher kills it, removes its shared memory."""
    require_model()
    run = launch(QA_TRITON_STARTUP_TIMEOUT_S="120")
    if moment == "as Triton starts":
        run.find(lambda argv: argv[0].endswith("/tritonserver"))
    else:
        run.wait_for_output("TRITONBACKEND_ModelInstanceInitialize: bert_qa")
    run.proc.send_signal(signum)
    regions: set[str] = set()  # of the stubs seen while the launcher stops
    while run.proc.poll() is None and not regions:
        regions |= {arg for _, argv in run.processes() for arg in argv
                    if arg.startswith(STUB_SHM_PREFIX)}
        time.sleep(0.05)
    code, out = run.wait(15)
    assert code == 0, out[-3000:]
    assert "Traceback" not in out
    assert run.processes() == []
    assert all(not (Path("/dev/shm") / region).exists() for region in regions), regions


@pytest.mark.parametrize("moment", ["after ready", "as the model instance starts"])
def test_launcher_killed_leaves_nothing(launch: Callable[..., Run], moment: str) -> None:
    """SIGKILL cannot be handled: the children's parent-death signal (SIGTERM) stops them.
    Stopped as the model loads, Triton may leave its stub waiting (see the startup test):
    with no launcher to kill it, the stub must notice its parent is gone by itself."""
    require_model()
    ports = Ports()
    run = launch(ports, QA_TRITON_STARTUP_TIMEOUT_S="120")
    if moment == "after ready":
        wait_http(f"http://127.0.0.1:{ports.gateway}/health/ready", run.proc, 120)
        assert {argv[0].rsplit("/", 1)[-1] for _, argv in run.processes()} >= {
            "tritonserver", "triton_python_backend_stub", sys.executable.rsplit("/", 1)[-1]}
    else:
        run.wait_for_output("TRITONBACKEND_ModelInstanceInitialize: bert_qa")
    regions = {arg for _, argv in run.processes() for arg in argv if arg.startswith(STUB_SHM_PREFIX)}
    run.proc.kill()
    run.proc.wait()
    deadline = time.monotonic() + 45
    while (left := run.processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left
    assert all(not (Path("/dev/shm") / region).exists() for region in regions), regions
    # every port free for a restart, checked as the launcher checks before it starts
    check_ports(Settings(host="127.0.0.1", port=ports.gateway, triton_http_port=ports.http,
                         triton_url=f"127.0.0.1:{ports.grpc}", triton_metrics_port=ports.metrics))
