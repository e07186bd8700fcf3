"""The open-loop load generator: requests leave on a fixed schedule, whatever the server does.

Every request has a scheduled send time decided before the step starts. A request's latency is
measured from that scheduled time, not from when it actually left, so a server stall (or a busy
client) shows up in the latency of every request that was due during it: no coordinated omission.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from loadtest.schedule import Arrival, arrival_offsets
from loadtest.servertiming import parse_server_timing
from loadtest.targets import require_loopback
from loadtest.workload import Payload

TIMEOUT = "timeout"
TRANSPORT = "transport"


@dataclass(frozen=True)
class Sample:
    """One request. Times in seconds from the start of its step."""

    scheduled_s: float
    lag_s: float  # actual send - scheduled send (the generator's own delay)
    latency_s: float  # response complete - scheduled send
    status: int  # HTTP status; 0 when no response came (timeout, connection error)
    error: str  # "" for a 2xx; else "http_<status>", "timeout" or "transport"
    phases_ms: dict[str, float]  # from Server-Timing

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class StepConfig:
    rate: float  # offered requests per second
    duration_s: float
    max_requests: int = 100_000
    arrival: Arrival = "constant"
    seed: int = 0
    timeout_s: float = 5.0  # whole-request deadline (connect + send + wait + read)


@dataclass
class StepState:
    """Live counters of the running step, read by the progress display."""

    config: StepConfig
    scheduled: int = 0
    sent: int = 0
    done: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)


def new_client(max_connections: int = 256) -> httpx.AsyncClient:
    """An HTTP/1.1 client with a pool big enough that the pool rarely queues requests."""
    limits = httpx.Limits(max_connections=max_connections,
                          max_keepalive_connections=max_connections)
    return httpx.AsyncClient(limits=limits, timeout=None)


async def _send(
    client: httpx.AsyncClient, url: str, body: Payload, due: float, origin: float,
    timeout_s: float, state: StepState,
) -> Sample:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    state.sent += 1
    status, error, phases = 0, "", {}
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(url, json=body)
            await response.aread()
        status = response.status_code
        error = "" if 200 <= status < 300 else f"http_{status}"
        phases = parse_server_timing(response.headers.get("server-timing", ""))
    except TimeoutError:
        error = TIMEOUT
    except httpx.HTTPError:
        error = TRANSPORT
    finished = loop.time()
    state.done += 1
    state.errors += bool(error)
    state.latencies_s.append(finished - due)
    return Sample(due - origin, sent - due, finished - due, status, error, phases)


async def run_step(
    client: httpx.AsyncClient, url: str, bodies: Sequence[Payload], config: StepConfig,
    state: StepState | None = None,
) -> list[Sample]:
    """Send ``bodies`` (cycled) at ``config.rate`` for ``config.duration_s``; every sample.

    Ends at most ``timeout_s`` after the last scheduled send: a request still pending then has
    already been recorded as a timeout.
    """
    require_loopback(url)
    if not bodies:
        raise ValueError("no request bodies")
    state = state or StepState(config)
    offsets = arrival_offsets(
        config.rate, config.duration_s, config.max_requests, config.arrival, config.seed
    )
    state.scheduled = len(offsets)
    loop = asyncio.get_running_loop()
    origin = loop.time() + 0.01
    tasks: list[asyncio.Task[Sample]] = []
    for i, offset in enumerate(offsets):
        due = origin + float(offset)
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        state.elapsed_s = loop.time() - origin
        body = bodies[i % len(bodies)]
        tasks.append(asyncio.create_task(
            _send(client, url, body, due, origin, config.timeout_s, state)))
    samples = list(await asyncio.gather(*tasks))
    state.elapsed_s = loop.time() - origin
    return samples
