"""``loadtest.ready.wait_http``: returns once the URL answers 200, and says why it gave up
when the child exits first or time runs out."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadtest.ready import wait_http


class Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ready" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_returns_once_ready(server: str, child: subprocess.Popen[bytes]) -> None:
    wait_http(f"{server}/ready", child, timeout_s=10)


def test_times_out_while_not_ready(server: str, child: subprocess.Popen[bytes]) -> None:
    with pytest.raises(TimeoutError, match=r"not ready after 0\.5 s"):
        wait_http(f"{server}/starting", child, timeout_s=0.5, interval_s=0.05)


def test_a_child_that_exits_first(server: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_http(f"{server}/starting", proc, timeout_s=10)
