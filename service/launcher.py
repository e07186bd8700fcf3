"""``python -m service.launcher``: start Triton, wait until it is ready, start the gateway.

Stops both cleanly on Ctrl-C / SIGTERM / SIGHUP, at any moment (Triton's startup included),
and stops the other when either exits. Before starting anything it checks that the ports are
free and the model repository exists. A failure ends with exit status 1 and one last line
saying what failed and what to do (Triton's own log is printed above it); a signal, with 0.
Nothing it started outlives it: Triton runs in its own process group, so that the python
backend stubs it leaves when killed, or when stopped while loading the model, are found
(they get a few seconds to end by themselves, then SIGKILL). Should the launcher itself be
SIGKILLed (the OOM killer, ``kill -9``), Linux sends each child SIGTERM (its parent-death
signal), so Triton and the gateway still shut down cleanly.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from service.settings import REPO_ROOT, Settings, settings_or_exit
from service.triton_runtime import TritonInstall, remove_stub_shared_memory

log = logging.getLogger("launcher")

# Triton's log lines: `E1206 21:13:31.922467 1155 model_lifecycle.cc:642] "failed to load ..."`
TRITON_ERROR_LINE = re.compile(r'^E\d{4} \S+\s+\d+ \S+\] (?P<msg>.*)$')
TRITON_ERROR_NOISE = ("CudaDriverHelper has not been initialized",)  # logged on any CPU host


class LaunchError(RuntimeError):
    """Something failed: the message is the one line the launcher ends with."""


class StopRequest:
    """SIGINT / SIGTERM / SIGHUP set a flag that the launcher checks between steps. A handler
    that raised instead could leave a child just started and not yet recorded behind."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None


class TritonLog:
    """Copies Triton's output (its python backend stubs' too) to our stderr and keeps the last
    lines, so that a failure can quote Triton's own reason."""

    def __init__(self, stream: IO[bytes], keep: int = 300) -> None:
        self._lines: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        for raw in stream:  # read to the end whatever happens: a full pipe would block Triton
            line = raw.decode(errors="replace").rstrip("\n")
            with self._lock:
                self._lines.append(line)
            with contextlib.suppress(OSError, ValueError):  # our stderr closed
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

    def drain(self, timeout_s: float) -> None:
        """Wait until everyone writing to the pipe closed it (or time ends)."""
        self._thread.join(timeout_s)

    def reason(self) -> str | None:
        """The last error Triton logged (its first line), or None."""
        with self._lock:
            lines = list(self._lines)
        errors = [m["msg"] for m in map(TRITON_ERROR_LINE.match, lines)
                  if m and not any(n in m["msg"] for n in TRITON_ERROR_NOISE)]
        errors = errors or [line for line in lines if line.startswith("error: ")]
        if not errors:
            return None
        # Triton quotes the message and writes a Python traceback in it as literal "\n"s
        message = errors[-1].strip().strip('"').split("\\n")[0].strip()
        return message[:400] + ("..." if len(message) > 400 else "")


@dataclass
class Processes:
    triton: subprocess.Popen[bytes] | None = None
    triton_log: TritonLog | None = None
    gateway: subprocess.Popen[bytes] | None = None

    def stop(self, timeout_s: float = 15.0) -> None:
        for proc in (self.gateway, self.triton):
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in (self.gateway, self.triton):
            if proc is None:
                continue
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.triton is not None:
            end_process_group(self.triton.pid, timeout_s=3.0)
        if self.triton_log is not None:
            self.triton_log.drain(2.0)


def process_group(pgid: int) -> list[tuple[int, list[str]]]:
    """The live (not zombie) processes of a process group and their command lines."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                argv = (stat.parent / "cmdline").read_bytes().decode(errors="replace").split("\0")
                members.append((int(stat.parent.name), argv))
        except (OSError, ValueError):  # it ended meanwhile
            continue
    return members


def end_process_group(pgid: int, timeout_s: float) -> None:
    """Wait for what is left of Triton's process group, then kill it. The python backend
    stubs of a Triton that was killed end by themselves within a second or two; those of a
    Triton stopped while it was loading the model wait forever."""
    deadline = time.monotonic() + timeout_s
    while (members := process_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, argv in members:
        log.info("killing %s (pid %d), left behind by Triton", Path(argv[0]).name, pid)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        remove_stub_shared_memory(argv)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_launcher() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when the launcher dies, however it
    dies (None where prctl is missing: not Linux). The signal follows the thread that
    forked the child: the launcher starts its children from its main thread."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()

    def in_child() -> None:
        # our StopRequest handlers live on in the fork until exec: a SIGTERM now must end it
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGTERM))  # best effort: no check
        if os.getppid() != launcher:  # it died before prctl: no signal will come
            os._exit(1)

    return in_child


def grpc_port(settings: Settings) -> int:
    try:
        return int(settings.triton_url.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        raise LaunchError(f"QA_TRITON_URL={settings.triton_url!r} has no port; the launcher "
                          "starts Triton's gRPC on it: set it to host:port") from None


def check_ports(settings: Settings) -> None:
    """Fail before starting anything when a port is taken or named twice. Else Triton exits
    after loading the model, or its health check finds whatever else listens there."""
    wanted = (
        ("QA_PORT", settings.host, settings.port),
        ("QA_TRITON_HTTP_PORT", "0.0.0.0", settings.triton_http_port),  # Triton binds all
        ("the port in QA_TRITON_URL", "0.0.0.0", grpc_port(settings)),
        ("QA_TRITON_METRICS_PORT", "0.0.0.0", settings.triton_metrics_port),
    )
    seen: dict[int, str] = {}
    for setting, host, port in wanted:
        if port in seen:
            raise LaunchError(f"{seen[port]} and {setting} both name port {port}; "
                              "give each its own port")
        seen[port] = setting
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            try:
                sock.bind((host, port))
            except (OSError, OverflowError) as exc:
                in_use = getattr(exc, "errno", None) == errno.EADDRINUSE
                why = "is in use" if in_use else f"cannot be used ({exc})"
                raise LaunchError(f"port {port} on {host} {why}; stop what listens there "
                                  f"or set {setting} to a free port") from None


def check_model_repository(settings: Settings) -> None:
    repository = settings.model_repository
    if not repository.is_dir():
        raise LaunchError(f"model repository {repository} does not exist; "
                          "set QA_MODEL_REPOSITORY to a Triton model repository")
    if not (repository / settings.model_name).is_dir():
        raise LaunchError(f"model repository {repository} has no model {settings.model_name!r}; "
                          "set QA_MODEL_REPOSITORY or QA_MODEL_NAME")


def start_triton(settings: Settings, build_dir: Path) -> tuple[subprocess.Popen[bytes], TritonLog]:
    try:
        install = TritonInstall.find()
        backends = install.backend_dir(build_dir)
        cmd = install.command(
            settings.model_repository, backends, settings.triton_http_port, grpc_port(settings),
            settings.triton_metrics_port,
        )
        log.info("starting Triton: %s", " ".join(cmd))
        # its own session and process group (pgid = pid): stop() can find its stubs; Ctrl-C
        # reaches it only through us
        proc = subprocess.Popen(cmd, env=install.environment(REPO_ROOT), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=end_with_launcher())
    except (ImportError, OSError) as exc:
        raise LaunchError(f"cannot start Triton: {exc}; reinstall the venv (make venv)") from None
    assert proc.stdout is not None
    return proc, TritonLog(proc.stdout)


def exit_status(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def wait_ready(
    proc: subprocess.Popen[bytes], triton_log: TritonLog, settings: Settings, stop: StopRequest,
) -> bool:
    """Poll Triton's readiness endpoint until it answers 200 (True) or a signal arrives
    (False); LaunchError when Triton exits first or time ends."""
    url = f"http://127.0.0.1:{settings.triton_http_port}/v2/health/ready"
    timeout_s = settings.triton_startup_timeout_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop.requested:
            return False
        if proc.poll() is not None:
            triton_log.drain(2.0)
            reason = triton_log.reason() or "no error in its log"
            raise LaunchError(
                f"Triton {exit_status(proc.returncode)} before it was ready: {reason}. "
                f"Its log is above; check the model repository "
                f"(QA_MODEL_REPOSITORY={settings.model_repository}) and the BERT_QA_* "
                "variables its model reads")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise LaunchError(f"Triton not ready after {timeout_s:g} s (its log is above); "
                      "raise QA_TRITON_STARTUP_TIMEOUT_S if it is only slow")


def start_gateway() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "service"], stdin=subprocess.DEVNULL,
                            preexec_fn=end_with_launcher())


def supervise(procs: Processes, stop: StopRequest) -> None:
    """Block until a signal arrives (return) or a child exits (LaunchError)."""
    while not stop.requested:
        for name, proc, other in (("Triton", procs.triton, "the gateway"),
                                  ("the gateway", procs.gateway, "Triton")):
            if proc is not None and proc.poll() is not None:
                raise LaunchError(f"{name} {exit_status(proc.returncode)}; stopped {other} too. "
                                  "Its output is above; fix the cause and start again")
        time.sleep(0.2)


def run(settings: Settings, procs: Processes, stop: StopRequest) -> None:
    check_model_repository(settings)
    check_ports(settings)
    procs.triton, procs.triton_log = start_triton(settings, REPO_ROOT / "build" / "triton")
    if wait_ready(procs.triton, procs.triton_log, settings, stop):
        procs.gateway = start_gateway()
        log.info("gateway on http://%s:%d (docs at /docs)", settings.host, settings.port)
        supervise(procs, stop)
    assert stop.signum is not None
    log.info("%s: stopping", signal.Signals(stop.signum).name)


def main() -> int:
    settings = settings_or_exit()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    stop = StopRequest()
    procs = Processes()
    # the gateway drains for up to QA_SHUTDOWN_TIMEOUT_S before it exits: not killed sooner
    stop_timeout_s = settings.shutdown_timeout_s + 5.0
    failure: str | None = None
    try:
        run(settings, procs, stop)
    except LaunchError as exc:
        failure = str(exc)
    procs.stop(stop_timeout_s)
    if failure is not None:
        log.error("%s", failure)  # the last line: after the children's shutdown output
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
