"""The gateway over HTTP in front of a real Triton server (started from the wheel)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import pytest

from loadtest.promtext import Samples, read_samples
from service.contract import INPUTS, MAX_BATCH_SIZE, MODEL_NAME, OUTPUTS
from service.qa import INLINE_TOKENIZE_CHARS
from tests.integration.conftest import REPO, LiveService, Ports, SeparateProcesses, stop, wait_http

pytestmark = pytest.mark.integration

SQUAD = [  # SQuAD v1.1 dev, "Super_Bowl_50" article, first paragraph
    ("Which NFL team represented the AFC at Super Bowl 50?", ("Denver Broncos",)),
    ("Where did Super Bowl 50 take place?", ("Santa Clara, California", "Levi's Stadium")),
    ("Which NFL team won Super Bowl 50?", ("Denver Broncos",)),
]
CONTEXT = (
    "Super Bowl 50 was an American football game to determine the champion of the National "
    "Football League (NFL) for the 2015 season. The American Football Conference (AFC) champion "
    "Denver Broncos defeated the National Football Conference (NFC) champion Carolina Panthers "
    "24\u201310 to earn their third Super Bowl title. The game was played on February 7, 2016, at "
    "Levi's Stadium in the San Francisco Bay Area at Santa Clara, California."
)


def test_answers_squad_questions(live_service: LiveService) -> None:
    r = httpx.post(f"{live_service.gateway_url}/v1/qa",
                   json={"context": CONTEXT, "questions": [q for q, _ in SQUAD]}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    for (_, golds), answers in zip(SQUAD, body["answers"], strict=True):
        assert any(g in answers[0]["text"] for g in golds), answers[0]
        assert CONTEXT[answers[0]["start"] : answers[0]["end"]] == answers[0]["text"]
    assert set(r.headers["server-timing"].replace(" ", "").split(",")[0].split(";")) >= {"tokenize"}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"context": "", "question": "Who?"}, 422, "invalid_input"),
        ({"context": "Text", "question": "   "}, 422, "invalid_input"),
        ({"context": ["a"], "question": "Who?"}, 422, "invalid_input"),
        ({"context": "x" * 60_000, "question": "Who?"}, 413, "payload_too_large"),
        ({"context": "Text", "questions": ["q?"] * 33}, 413, "payload_too_large"),
    ],
)
def test_bad_inputs_get_documented_status(
    live_service: LiveService, body: dict, status: int, code: str
) -> None:
    r = httpx.post(f"{live_service.gateway_url}/v1/qa", json=body, timeout=30)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code


def test_concurrent_requests_all_succeed_and_batch(live_service: LiveService) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live_service.gateway_url, timeout=60) as c:
            return await asyncio.gather(*(
                c.post("/v1/qa", json={"context": CONTEXT, "question": q})
                for q, _ in SQUAD * 8
            ))

    def counts() -> tuple[float, float]:
        text = httpx.get(live_service.triton_metrics_url, timeout=5).text
        values = {}
        for line in text.splitlines():
            if line.startswith(("nv_inference_count{", "nv_inference_exec_count{")) and MODEL_NAME in line:
                values[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
        return values["nv_inference_count"], values["nv_inference_exec_count"]

    before = counts()
    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    # Triton's counters can trail the answers the client already has (a CI run read 3 of 24
    # right after the burst): wait up to 10 s for them to reach the burst, then check both
    deadline = time.monotonic() + 10
    while (after := counts())[0] - before[0] < 24 and time.monotonic() < deadline:
        time.sleep(0.05)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 24
    assert executions < inferences, "the dynamic batcher merged no requests"


def samples(url: str) -> Samples:
    return read_samples(httpx.get(url, timeout=5).text)


def poll(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def post_bytes(body: dict[str, object]) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/qa HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(raw)) + raw


def test_requests_of_clients_that_left_are_cancelled_in_triton(live_service: LiveService) -> None:
    """One client keeps the model busy; three more queue in Triton behind it and disconnect.
    The gateway cancels their gRPC calls: Triton drops those still in its queue (its CANCELED
    failures), and the model answers those its dynamic batcher had already handed it as the
    next batch without running the engine (``qa_model_skipped_requests_total``; Triton counts
    them as successes). So of everything Triton received, only the busy request ran.

    The busy request is under ``INLINE_TOKENIZE_CHARS``: the gateway tokenizes it on its event
    loop and starts its gRPC call before it reads any later request, so none overtakes it."""
    gateway = f"{live_service.gateway_url}/metrics"
    triton = live_service.triton_metrics_url
    model = frozenset({("model", MODEL_NAME), ("version", "1")})
    success = ("nv_inference_request_success_total", model)  # the parser adds _total
    dropped = ("nv_inference_request_failure_total", model | {("reason", "CANCELED")})
    skipped = ("qa_model_skipped_requests_total", frozenset({("model", MODEL_NAME),
                                                             ("reason", "cancelled")}))
    pending = ("nv_inference_pending_request_count", model)
    in_flight = ("qa_in_flight_requests", frozenset())

    def outcome(m: Samples, name: str) -> float:
        return m.get(("qa_request_duration_seconds_count",
                      frozenset({("route", "/v1/qa"), ("outcome", name)})), 0.0)

    before, before_gw = samples(triton), samples(gateway)
    address = ("127.0.0.1", live_service.ports.gateway)
    filler = " ".join(f"Sentence {i} of a long context says nothing at all." for i in range(66))
    questions = [f"What does sentence {i} say?" for i in range(12)]  # 36 windows, 3,657 chars
    assert len(filler) + sum(map(len, questions)) <= INLINE_TOKENIZE_CHARS
    busy = socket.create_connection(address, timeout=60)
    busy.sendall(post_bytes({"context": filler, "questions": questions}))
    poll(lambda: samples(gateway)[in_flight] == 1, "the busy request to reach the gateway")
    leaving = [socket.create_connection(address, timeout=60) for _ in range(3)]
    for sock, (question, _) in zip(leaving, SQUAD, strict=True):
        sock.sendall(post_bytes({"context": CONTEXT, "question": question}))
    poll(lambda: samples(triton)[pending] >= 1, "a request to queue in Triton behind the busy one")
    for sock in leaving:
        sock.close()
    status_line = busy.makefile("rb").readline()
    busy.close()
    assert status_line.startswith(b"HTTP/1.1 200"), status_line
    poll(lambda: outcome(samples(gateway), "client_closed") - outcome(before_gw, "client_closed") == 3,
         "the three to be counted as client_closed")
    poll(lambda: samples(triton)[pending] == 0, "Triton's queue to empty")

    after, after_gw = samples(triton), samples(gateway)
    assert after_gw[in_flight] == 0
    assert outcome(after_gw, "ok") - outcome(before_gw, "ok") == 1
    skips = after.get(skipped, 0) - before.get(skipped, 0)
    assert (after[dropped] - before[dropped]) + skips >= 1, "no cancellation reached Triton"
    ran = (after[success] - before[success]) - skips
    assert ran == 1, f"{ran:g} requests ran the engine; only the busy one should have"


def test_triton_model_config_matches_contract(live_service: LiveService) -> None:
    config = httpx.get(f"{live_service.triton_url}/v2/models/{MODEL_NAME}/config", timeout=5).json()
    assert config["max_batch_size"] == MAX_BATCH_SIZE
    for declared, specs in ((config["input"], INPUTS), (config["output"], OUTPUTS)):
        # Triton's JSON writes dims as strings
        got = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in declared]
        assert got == [(s.name, s.config_dtype, list(s.dims)) for s in specs]


def test_deadline_exceeded_is_504(live_service: LiveService) -> None:
    ports = Ports(http=live_service.ports.http, grpc=live_service.ports.grpc,
                  metrics=live_service.ports.metrics)
    gateway = subprocess.Popen([sys.executable, "-m", "service"],
                               env=ports.env(QA_REQUEST_TIMEOUT_MS="0.01"), cwd=REPO)
    try:
        url = f"http://127.0.0.1:{ports.gateway}"
        wait_http(f"{url}/health/ready", gateway, 60)
        r = httpx.post(f"{url}/v1/qa", json={"context": CONTEXT, "question": "Who won?"}, timeout=30)
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "deadline_exceeded"
    finally:
        stop(gateway)


def test_triton_death_gives_fast_503_not_a_hang(separate_processes: SeparateProcesses) -> None:
    url = separate_processes.gateway_url
    ok = httpx.post(f"{url}/v1/qa", json={"context": CONTEXT, "question": "Who won?"}, timeout=30)
    assert ok.status_code == 200
    separate_processes.triton.send_signal(signal.SIGKILL)
    separate_processes.triton.wait(10)
    started = time.monotonic()
    r = httpx.post(f"{url}/v1/qa", json={"context": CONTEXT, "question": "Who won?"}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "backend_unavailable"
    assert time.monotonic() - started < 5
    ready = httpx.get(f"{url}/health/ready", timeout=10)
    assert ready.status_code == 503
    assert httpx.get(f"{url}/health/live", timeout=5).status_code == 200


def test_launcher_stops_both_on_sigterm() -> None:
    ports = Ports()
    proc = subprocess.Popen([sys.executable, "-m", "service.launcher"], env=ports.env(), cwd=REPO)
    try:
        wait_http(f"http://127.0.0.1:{ports.gateway}/health/ready", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for port in (ports.gateway, ports.http):
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
    finally:
        stop(proc)
