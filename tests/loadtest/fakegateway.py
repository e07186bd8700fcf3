"""A real HTTP server that stands in for the gateway in load-generator tests.

It serves POST /v1/qa after a known delay, with a Server-Timing header and the gateway's own
metrics (service.metrics) on GET /metrics. It runs on its own thread and event loop, so a
``stall`` (time.sleep on that loop) freezes it the way a GC pause or a blocked worker would.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import generate_latest

from service.metrics import create_metrics


@dataclass
class Behaviour:
    delay_s: float = 0.005  # service time of every request
    stall_at: int | None = None  # the n-th request (1-based) freezes the whole server ...
    stall_s: float = 0.0  # ... for this long
    concurrency: int | None = None  # at most this many served at once (a capacity limit)
    fail_every: int | None = None  # every n-th request answers 429


@dataclass
class FakeGateway:
    behaviour: Behaviour = field(default_factory=Behaviour)
    budget_s: float = 0.010
    count: int = 0
    stalled_at: float | None = None  # perf_counter() when the stall began

    def __post_init__(self) -> None:
        self.metrics = create_metrics(self.budget_s)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeGateway:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake gateway did not start")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self) -> FakeGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._limit = asyncio.Semaphore(self.behaviour.concurrency or 1_000_000)
        app = web.Application()
        app.router.add_post("/v1/qa", self._qa)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _qa(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        self.count += 1
        n, b = self.count, self.behaviour
        await request.json()
        if n == b.stall_at:
            self.stalled_at = start
            time.sleep(b.stall_s)  # blocks this server's loop: nothing is accepted or answered
        m = self.metrics
        m.in_flight.inc()
        async with self._limit:
            await asyncio.sleep(b.delay_s)
        m.in_flight.dec()
        total = time.perf_counter() - start
        failed = b.fail_every is not None and n % b.fail_every == 0
        outcome = "overloaded" if failed else "ok"
        m.request_duration.labels(route="/v1/qa", outcome=outcome).observe(total)
        for phase, share in (("tokenize", 0.2), ("infer", 0.7), ("decode", 0.1)):
            m.phase_duration.labels(phase=phase).observe(total * share)
        timing = (f"tokenize;dur={total * 200:.3f}, infer;dur={total * 700:.3f}, "
                  f"decode;dur={total * 100:.3f}, total;dur={total * 1000:.3f}")
        if failed:
            m.errors.labels(code="overloaded").inc()
            return web.json_response({"error": {"code": "overloaded", "message": "busy",
                                                "request_id": str(n)}}, status=429)
        body = {"answers": [[{"text": "Denver Broncos", "start": 0, "end": 14, "score": 0.9}]],
                "timing": {"total_ms": total * 1000}}
        return web.json_response(body, headers={"Server-Timing": timing})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            content_type="text/plain", charset="utf-8")
