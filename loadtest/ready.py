"""Waiting for a server started as a child process to answer: what the benchmarks and the
tests that start the service (or Prometheus) do before they send it anything."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0,
              interval_s: float = 0.2) -> None:
    """Poll ``url`` until it answers 200. RuntimeError if ``proc`` exits first, TimeoutError
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")
