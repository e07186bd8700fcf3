"""Overload and backend failures, in-process: 429 at once, 503 when Triton is unreachable."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from engine.onnx_cpu import OnnxEngine
from service.app import create_app
from service.backend import EngineBackend
from service.settings import Settings

CONTEXT = "The Amazon rainforest covers much of the Amazon basin of South America. " * 20


async def _burst(app: object, n: int) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await asyncio.gather(*(
            client.post("/v1/qa", json={"context": CONTEXT, "questions": ["Where?"] * 4})
            for _ in range(n)
        ))


def test_over_max_in_flight_is_429_with_retry_after(engine: OnnxEngine) -> None:
    app = create_app(Settings(max_in_flight=1), backend=EngineBackend(engine))

    async def run() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            return await _burst(app, 6)

    responses = asyncio.run(run())
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 429 in statuses, statuses
    rejected = next(r for r in responses if r.status_code == 429)
    assert rejected.json()["error"]["code"] == "overloaded"
    assert rejected.headers["retry-after"] == "1"


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_triton_gives_503_fast_and_not_ready() -> None:
    settings = Settings(triton_url=f"127.0.0.1:{_unused_port()}", request_timeout_ms=5000)
    app = create_app(settings)

    async def run() -> tuple[httpx.Response, httpx.Response, float]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                started = time.monotonic()
                r = await client.post("/v1/qa", json={"context": CONTEXT, "question": "Where?"})
                elapsed = time.monotonic() - started
                ready = await client.get("/health/ready")
                return r, ready, elapsed

    r, ready, elapsed = asyncio.run(run())
    assert r.status_code == 503 and r.json()["error"]["code"] == "backend_unavailable"
    assert elapsed < 5.0
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
    assert "Traceback" not in r.text


@pytest.mark.parametrize("overlap", [400, 1000])
def test_settings_reject_overlap_that_leaves_no_step(overlap: int) -> None:
    with pytest.raises(ValueError, match="overlap"):
        Settings(window_overlap=overlap)


@pytest.mark.parametrize("buckets", [(), (0, 384), (128, 1024)])
def test_settings_reject_buckets_the_model_cannot_take(buckets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="seq_buckets must be window lengths"):
        Settings(seq_buckets=buckets)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QA_PORT", "9090")
    monkeypatch.setenv("QA_SEQ_BUCKETS", "[128, 384]")
    monkeypatch.setenv("QA_NO_ANSWER_THRESHOLD", "0.5")
    s = Settings()
    assert (s.port, s.seq_buckets, s.no_answer_threshold) == (9090, (128, 384), 0.5)
