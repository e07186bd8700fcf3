"""``EngineBackend`` (the in-process backend of tests and tools): one engine call at a time,
even when its callers are cancelled (their client left) or time out mid-call."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import numpy as np
import pytest

from engine.base import Float32Array, Int32Array
from engine.onnx_cpu import OnnxEngine
from service.backend import EngineBackend
from service.errors import ErrorCode, ServiceError


class PeakEngine:
    """The real engine, recording how many of its calls ever ran at once."""

    def __init__(self, engine: OnnxEngine) -> None:
        self.engine = engine
        self.name = engine.name
        self.active = self.peak = self.calls = 0
        self._lock = threading.Lock()

    def infer(self, input_ids: Int32Array, attention_mask: Int32Array,
              token_type_ids: Int32Array) -> tuple[Float32Array, Float32Array]:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
        try:
            return self.engine.infer(input_ids, attention_mask, token_type_ids)
        finally:
            with self._lock:
                self.active -= 1


@dataclass(frozen=True)
class Batch:
    """What ``EngineBackend.infer`` reads of a request's windows."""

    input_ids: Int32Array
    attention_mask: Int32Array
    token_type_ids: Int32Array


def batch(windows: int, seq: int = 256) -> Batch:
    ids = np.full((windows, seq), 2023, dtype=np.int32)  # "this"
    ids[:, 0], ids[:, 8], ids[:, -1] = 101, 102, 102
    types = np.zeros_like(ids)
    types[:, 9:] = 1
    return Batch(ids, np.ones_like(ids), types)


async def wait_for_call(engine: PeakEngine) -> None:
    while engine.active == 0:
        await asyncio.sleep(0.001)


def test_callers_that_leave_never_overlap_engine_calls(engine: OnnxEngine) -> None:
    async def scenario() -> None:
        peak = PeakEngine(engine)
        backend = EngineBackend(peak)
        long, short = batch(24), batch(1)

        first = asyncio.ensure_future(backend.infer(long, 60))  # type: ignore[arg-type]
        await wait_for_call(peak)
        first.cancel()  # its client left mid-call
        await asyncio.gather(first, return_exceptions=True)
        assert peak.active == 1, "the cancelled call's thread should still be running"
        start, end = await backend.infer(short, 60)  # type: ignore[arg-type]
        assert start.shape == end.shape == (1, 256)

        timed_out = asyncio.ensure_future(backend.infer(long, 0.05))  # type: ignore[arg-type]
        await wait_for_call(peak)
        with pytest.raises(ServiceError) as info:
            await timed_out
        assert info.value.code is ErrorCode.DEADLINE_EXCEEDED
        assert peak.active == 1
        await backend.infer(short, 60)  # type: ignore[arg-type]

        busy = asyncio.ensure_future(backend.infer(long, 60))  # type: ignore[arg-type]
        await wait_for_call(peak)
        waiting = [asyncio.ensure_future(backend.infer(short, 60)) for _ in range(3)]  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        for task in waiting:  # cancelled while waiting for the lock: they run nothing
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await busy
        await backend.infer(short, 60)  # type: ignore[arg-type]
        assert (peak.calls, peak.peak) == (6, 1)

    asyncio.run(scenario())
