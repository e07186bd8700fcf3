"""Clients that go away mid-request, against a real uvicorn server on a real socket.

The in-process TestClient never disconnects, so these tests run the app under
``uvicorn.Server`` in a background thread (on a socket bound by the test) and talk to it
with raw sockets: close after a full request while the engine works, close after part of
the body, stall with part of the body. Afterwards the in-flight slots and the in-flight
gauge must be back at 0, nothing may be logged as an unhandled error, and later requests
must not be refused with 429.

What the gateway and uvicorn do (0.55 here; httptools and h11 alike), as these tests pin it:
- a request whose body was read and whose client leaves before the answer is cancelled by
  the gateway's middleware (uvicorn itself would let it run to the end for nobody): its slot
  and gauge are released at once, it is counted as ``client_closed`` (499), and if it was
  still waiting for the engine, the engine never runs it (with Triton, its gRPC call is
  cancelled and the model skips it: ``tests/integration/test_service.py``);
- a client that leaves before the body is complete makes ``receive`` return
  ``http.disconnect``; FastAPI's ClientDisconnect error goes to nobody, and the request is
  counted as ``client_closed`` too (client side, never ``internal`` or ``invalid_input``);
- a client that stalls mid-body is waited for without a timeout (``timeout_keep_alive``
  only runs between requests), but the in-flight slot is taken only after the body is
  parsed, so a stalled client holds a connection, not a slot; on SIGTERM, ``python -m
  service`` closes it after ``QA_SHUTDOWN_TIMEOUT_S`` (uvicorn alone would wait forever).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client import generate_latest

from engine.base import Float32Array, Int32Array
from engine.onnx_cpu import OnnxEngine
from loadtest.promtext import Samples, read_samples
from service.app import create_app
from service.backend import EngineBackend
from service.settings import Settings

MAX_IN_FLIGHT = 4
# short windows keep the engine quick; many of them keep it busy long enough to abort into
SMALL = {
    "max_in_flight": MAX_IN_FLIGHT, "max_seq_len": 64, "window_overlap": 16,
    "max_question_tokens": 16, "seq_buckets": (64,), "request_timeout_ms": 60_000,
}
FILLER = " ".join(f"Sentence number {i} talks about nothing in particular." for i in range(400))
LONG = {"context": FILLER, "question": "Which sentence talks about nothing?"}  # 93 windows, ~0.8 s
MEDIUM = {"context": FILLER[:4000], "question": "Which sentence talks about nothing?"}  # 17, ~0.15 s
SHORT = {"context": "Brazil holds 60% of the Amazon rainforest.", "question": "Who holds most?"}
QA = "/v1/qa"
DEADLINE_S = 15.0


class LiveServer:
    """The gateway under uvicorn in a daemon thread, on a socket the test bound itself."""

    def __init__(self, app: FastAPI, http: str) -> None:
        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app, http=http, log_config=None, access_log=False, lifespan="on",
            timeout_keep_alive=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.errors: list[logging.LogRecord] = []
        self._handler = _ListHandler(self.errors)

    def __enter__(self) -> LiveServer:
        logging.getLogger().addHandler(self._handler)
        self.thread.start()
        wait_until(lambda: self.server.started, "the server to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if self.thread.is_alive():  # a connection the test left open: don't hang the suite
            self.server.force_exit = True
            self.thread.join(10)
        logging.getLogger().removeHandler(self._handler)
        self.sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def in_flight(self) -> int:
        n: int = self.app.state.in_flight
        return n

    @property
    def tasks(self) -> int:
        """Request cycles uvicorn is running (one from the end of the headers on)."""
        return len(self.server.server_state.tasks)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_S)

    def metrics(self) -> Samples:
        """The samples of GET /metrics."""
        return read_samples(httpx.get(f"{self.url}/metrics", timeout=DEADLINE_S).text)

    def settled(self, qa_requests: int) -> None:
        """Once ``qa_requests`` QA requests were counted (polled, with a deadline; a client's
        connect returns before uvicorn accepts, so an idle server proves nothing): every
        request task done, every slot free, and the in-flight gauge at 0."""
        registry = self.app.state.metrics.registry
        wait_until(
            lambda: sum(qa_outcomes(read_samples(generate_latest(registry).decode())).values())
            >= qa_requests,
            f"{qa_requests} QA requests to be counted",
        )
        wait_until(lambda: self.tasks == 0, "uvicorn's request tasks to finish")
        wait_until(lambda: self.in_flight == 0, "app.state.in_flight to return to 0")
        m = self.metrics()
        assert sum(qa_outcomes(m).values()) == qa_requests, qa_outcomes(m)
        gauge = m[("qa_in_flight_requests", frozenset())]
        assert gauge == 0, f"qa_in_flight_requests is {gauge} with nothing in flight"

    def assert_no_errors_logged(self) -> None:
        assert not self.errors, [f"{r.name}: {r.getMessage()}" for r in self.errors]


class _ListHandler(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


class CountingEngine:
    """The real engine, counting its calls: what a cancelled request must not add to."""

    def __init__(self, engine: OnnxEngine) -> None:
        self.engine = engine
        self.name = engine.name
        self.calls = 0

    def infer(self, input_ids: Int32Array, attention_mask: Int32Array,
              token_type_ids: Int32Array) -> tuple[Float32Array, Float32Array]:
        self.calls += 1
        return self.engine.infer(input_ids, attention_mask, token_type_ids)


@pytest.fixture
def live(engine: OnnxEngine) -> Iterator[LiveServer]:
    app = create_app(Settings(**SMALL), backend=EngineBackend(engine))  # type: ignore[arg-type]
    with LiveServer(app, "httptools") as server:
        yield server


@pytest.fixture(params=["httptools", "h11"])
def live_any(engine: OnnxEngine, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    app = create_app(Settings(**SMALL), backend=EngineBackend(engine))  # type: ignore[arg-type]
    with LiveServer(app, request.param) as server:
        yield server


def request_bytes(body: dict[str, Any] | bytes, content_length: int | None = None) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    length = len(raw) if content_length is None else content_length
    head = (f"POST {QA} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n")
    return head.encode() + raw


def send_and_leave(live: LiveServer, body: dict[str, Any]) -> None:
    """A whole request, then FIN at once (not RST, so the kernel delivers the request)."""
    sock = live.connect()
    sock.sendall(request_bytes(body))
    close(sock, "fin")


def close(sock: socket.socket, how: str) -> None:
    """``fin``: an orderly close; ``rst``: SO_LINGER 0, the kernel sends a reset."""
    if how == "rst":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def has_response(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def slots_full_or_answered(live: LiveServer, socks: list[socket.socket]) -> bool:
    return live.in_flight == MAX_IN_FLIGHT or any(map(has_response, socks))


def count(m: Samples, name: str, **labels: str) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


def qa_outcomes(m: Samples) -> dict[str, float]:
    """Outcome -> requests counted on the QA route by the latency histogram."""
    out: dict[str, float] = {}
    for (name, labels), value in m.items():
        d = dict(labels)
        if name == "qa_request_duration_seconds_count" and d.get("route") == QA and value:
            out[d["outcome"]] = value
    return out


def assert_errors_match_histogram(m: Samples) -> None:
    """qa_errors_total{code} counts exactly the non-ok requests of the latency histogram."""
    errors = {dict(k[1])["code"]: v for k, v in m.items() if k[0] == "qa_errors_total" and v}
    by_outcome: dict[str, float] = {}
    for (name, labels), value in m.items():
        d = dict(labels)
        if name == "qa_request_duration_seconds_count" and d["outcome"] != "ok" and value:
            by_outcome[d["outcome"]] = by_outcome.get(d["outcome"], 0) + value
    assert errors == by_outcome


def serves_again(live: LiveServer, counted: int) -> Samples:
    """A normal request still gets its 200; the metrics once it is counted (``counted`` + 1)."""
    r = httpx.post(f"{live.url}{QA}", json=SHORT, timeout=DEADLINE_S)
    assert r.status_code == 200, r.text
    live.settled(counted + 1)
    return live.metrics()


def concurrent_posts(url: str, n: int, body: dict[str, Any]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
            return await asyncio.gather(*(client.post(QA, json=body) for _ in range(n)))

    return asyncio.run(run())


# 1. full request, client gone while the engine works


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_abort_while_engine_works_frees_slot_and_gauge(live_any: LiveServer, how: str) -> None:
    live = live_any
    sock = live.connect()
    sock.sendall(request_bytes(LONG))
    wait_until(lambda: live.in_flight == 1, "the request to take its slot")
    assert not has_response(sock), "the engine answered before the abort: nothing was aborted"
    close(sock, how)

    live.settled(1)
    m = live.metrics()
    # 5. the aborted request was cancelled: counted as client_closed, never as done
    assert qa_outcomes(m) == {"client_closed": 1}
    assert count(m, "qa_errors_total", code="client_closed") == 1
    assert count(m, "qa_windows_per_request_count") == 0
    m = serves_again(live, 1)
    assert qa_outcomes(m) == {"client_closed": 1, "ok": 1}
    assert_errors_match_histogram(m)
    live.assert_no_errors_logged()


def test_close_right_after_sending_is_ok_or_client_side(live: LiveServer) -> None:
    """No wait for the slot: uvicorn may see the EOF before the app reads the body."""
    for _ in range(6):
        send_and_leave(live, MEDIUM)
    live.settled(6)
    m = serves_again(live, 6)
    outcomes = qa_outcomes(m)
    assert set(outcomes) <= {"ok", "overloaded", "client_closed"}, outcomes
    assert_errors_match_histogram(m)
    live.assert_no_errors_logged()


def test_queued_requests_of_clients_that_left_never_reach_the_engine(engine: OnnxEngine) -> None:
    """One client keeps the engine busy; three more wait for it and leave: the engine runs
    the first request alone, and the next one comes straight after it."""
    counting = CountingEngine(engine)
    app = create_app(Settings(**SMALL), backend=EngineBackend(counting))  # type: ignore[arg-type]
    with LiveServer(app, "httptools") as live:
        busy = live.connect()
        busy.sendall(request_bytes(LONG))
        wait_until(lambda: counting.calls == 1, "the first request to reach the engine")
        waiting = [live.connect() for _ in range(3)]
        for sock in waiting:
            sock.sendall(request_bytes(MEDIUM))
        wait_until(lambda: live.in_flight == 4, "the three to wait for the engine")
        assert not has_response(busy), "the engine answered before the others queued"
        for sock in waiting:
            close(sock, "fin")
        wait_until(lambda: live.in_flight == 1, "the three to be cancelled")
        answer = busy.makefile("rb").readline()
        busy.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        live.settled(4)
        assert counting.calls == 1
        m = serves_again(live, 4)
        assert counting.calls == 2
        assert qa_outcomes(m) == {"ok": 2, "client_closed": 3}
        assert_errors_match_histogram(m)
        live.assert_no_errors_logged()


# 2. more aborted requests than slots: none leaks


def test_many_aborts_leak_no_slots(live: LiveServer) -> None:
    # a burst of 20 that close at once: about MAX_IN_FLIGHT admitted, the rest refused (429)
    # to a client already gone; FIN, not RST, so the kernel delivers every request
    for _ in range(20):
        send_and_leave(live, MEDIUM)
    live.settled(20)
    burst = qa_outcomes(live.metrics())
    assert burst.get("ok", 0) <= MAX_IN_FLIGHT
    assert set(burst) <= {"ok", "overloaded", "client_closed"}

    # 5 waves that each fill every slot with requests whose clients then leave
    aborted_mid_work = 0
    for wave in range(1, 6):
        socks = [live.connect() for _ in range(MAX_IN_FLIGHT)]
        for sock in socks:
            sock.sendall(request_bytes(MEDIUM))
        wait_until(partial(slots_full_or_answered, live, socks), "the wave to take every slot")
        for sock in socks:
            aborted_mid_work += not has_response(sock)
            close(sock, "fin")
        live.settled(20 + wave * MAX_IN_FLIGHT)
    # the engine runs one request at a time: most of each wave was still queued for it
    assert aborted_mid_work > MAX_IN_FLIGHT, aborted_mid_work

    # every slot is free again: MAX_IN_FLIGHT concurrent requests all get in
    responses = concurrent_posts(live.url, MAX_IN_FLIGHT, MEDIUM)
    assert [r.status_code for r in responses] == [200] * MAX_IN_FLIGHT, [r.text for r in responses]
    live.settled(20 + 5 * MAX_IN_FLIGHT + MAX_IN_FLIGHT)
    m = live.metrics()
    outcomes = qa_outcomes(m)
    assert set(outcomes) <= {"ok", "overloaded", "client_closed"}, outcomes
    # more admitted-then-cancelled requests than slots
    assert outcomes["client_closed"] > MAX_IN_FLIGHT, outcomes
    assert_errors_match_histogram(m)
    live.assert_no_errors_logged()


# 3. Content-Length promised, part of the body sent, then gone


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_partial_body_then_close_is_client_side_not_500(live_any: LiveServer, how: str) -> None:
    live = live_any
    body = json.dumps(MEDIUM).encode()
    sock = live.connect()
    sock.sendall(request_bytes(body[:100], content_length=len(body)))
    wait_until(lambda: live.tasks == 1, "uvicorn to start the request")
    close(sock, how)

    live.settled(1)
    m = live.metrics()
    # 5. counted as the client's leaving (FastAPI's ClientDisconnect, answered to nobody)
    assert qa_outcomes(m) == {"client_closed": 1}
    assert count(m, "qa_errors_total", code="client_closed") == 1
    assert count(m, "qa_windows_per_request_count") == 0  # never reached the engine
    m = serves_again(live, 1)
    assert_errors_match_histogram(m)
    live.assert_no_errors_logged()


# 4. part of the body, then a stall (slowloris)


def test_stalled_bodies_hold_no_slot(live: LiveServer) -> None:
    body = json.dumps(MEDIUM).encode()
    stalled = [live.connect() for _ in range(MAX_IN_FLIGHT + 2)]
    try:
        for sock in stalled:
            sock.sendall(request_bytes(body[:100], content_length=len(body)))
        wait_until(lambda: live.tasks == len(stalled), "uvicorn to start every stalled request")
        assert live.in_flight == 0
        assert live.metrics()[("qa_in_flight_requests", frozenset())] == 0

        # a fixed wait on purpose: past timeout_keep_alive (1 s here), which does not apply
        # mid-request, the stalled requests are still there and still hold no slot
        time.sleep(1.2)
        assert live.in_flight == 0
        responses = concurrent_posts(live.url, MAX_IN_FLIGHT, MEDIUM)
        assert [r.status_code for r in responses] == [200] * MAX_IN_FLIGHT
        wait_until(lambda: live.tasks == len(stalled), "the normal requests to finish")
        assert not any(has_response(sock) for sock in stalled)
    finally:
        for sock in stalled:
            close(sock, "fin")

    live.settled(MAX_IN_FLIGHT + len(stalled))
    m = live.metrics()
    assert qa_outcomes(m) == {"ok": MAX_IN_FLIGHT, "client_closed": len(stalled)}
    assert_errors_match_histogram(m)
    live.assert_no_errors_logged()


def test_sigterm_does_not_wait_for_a_stalled_upload_forever() -> None:
    """``python -m service`` closes a connection stalled mid-body after QA_SHUTDOWN_TIMEOUT_S:
    uvicorn alone waits for it without limit, past a pod's grace period (then SIGKILL)."""
    repo = Path(__file__).resolve().parents[2]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "QA_HOST": "127.0.0.1", "QA_PORT": str(port), "QA_SHUTDOWN_TIMEOUT_S": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _live(port), "the gateway to answer /health/live", 60.0)
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(request_bytes(b'{"context": ', content_length=1000))
            assert _live(port)  # a round trip through the event loop after the bytes arrived
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=DEADLINE_S)  # TimeoutExpired: still waiting for the upload
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _live(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
