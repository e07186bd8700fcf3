"""``python -m service.launcher``: start Triton, wait until it is ready, start the gateway.

Stops both cleanly on Ctrl-C / SIGTERM, and stops the other when either exits.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from service.settings import REPO_ROOT, Settings, settings_or_exit
from service.triton_runtime import TritonInstall

log = logging.getLogger("launcher")


class LaunchError(RuntimeError):
    pass


@dataclass
class Processes:
    triton: subprocess.Popen[bytes]
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


def grpc_port(settings: Settings) -> int:
    return int(settings.triton_url.rsplit(":", 1)[1])


def start_triton(settings: Settings, build_dir: Path) -> subprocess.Popen[bytes]:
    install = TritonInstall.find()
    backends = install.backend_dir(build_dir)
    cmd = install.command(
        settings.model_repository, backends, settings.triton_http_port, grpc_port(settings),
        settings.triton_metrics_port,
    )
    log.info("starting Triton: %s", " ".join(cmd))
    return subprocess.Popen(cmd, env=install.environment(REPO_ROOT))


def wait_ready(proc: subprocess.Popen[bytes], http_port: int, timeout_s: float) -> None:
    """Poll Triton's readiness endpoint until it answers 200, the process dies, or time ends."""
    url = f"http://127.0.0.1:{http_port}/v2/health/ready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"Triton exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise LaunchError(f"Triton not ready after {timeout_s:.0f} s")


def start_gateway() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "service"])


def supervise(procs: Processes) -> int:
    """Block until a child exits or a signal arrives; return the exit code to use."""
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        log.info("signal %d: stopping", signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stopping:
        for name, proc in (("triton", procs.triton), ("gateway", procs.gateway)):
            if proc is not None and proc.poll() is not None:
                log.error("%s exited with code %s; stopping", name, proc.returncode)
                procs.stop()
                return proc.returncode or 1
        time.sleep(0.2)
    procs.stop()
    return 0


def main() -> int:
    settings = settings_or_exit()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    procs = Processes(triton=start_triton(settings, REPO_ROOT / "build" / "triton"))
    try:
        wait_ready(procs.triton, settings.triton_http_port, settings.triton_startup_timeout_s)
        procs.gateway = start_gateway()
        log.info("gateway on http://%s:%d (docs at /docs)", settings.host, settings.port)
        return supervise(procs)
    except (LaunchError, KeyboardInterrupt) as exc:
        log.error("%s", exc)
        procs.stop()
        return 1


if __name__ == "__main__":
    sys.exit(main())
