"""Inference backends behind one Protocol: Triton over gRPC, or an in-process engine.

The gateway only sees ``InferenceBackend``; tests swap in ``EngineBackend`` (a real
engine in a worker thread) the way httpx swaps transports.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import numpy as np
import numpy.typing as npt

from engine.base import QAEngine
from service.contract import INPUTS, MAX_BATCH_SIZE, OUTPUTS, bucket_for
from service.errors import ErrorCode, ServiceError
from service.windowing import Windows

Logits = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]


class InferenceBackend(Protocol):
    async def infer(self, windows: Windows, deadline_s: float) -> Logits:
        """Start/end logits [windows, seq] for padded windows, within ``deadline_s``."""
        ...

    async def ready(self) -> bool: ...

    async def close(self) -> None: ...


def chunks(windows: Windows, size: int = MAX_BATCH_SIZE) -> list[tuple[int, int]]:
    """Row ranges of at most ``size`` windows (Triton's max_batch_size)."""
    return [(i, min(i + size, windows.count)) for i in range(0, windows.count, size)]


class TritonBackend:
    """tritonclient's asyncio gRPC client; one channel shared by all requests."""

    def __init__(self, url: str, model_name: str, model_version: str = "") -> None:
        import tritonclient.grpc.aio as grpcclient

        self._grpc = grpcclient
        size = 64 * 1024 * 1024  # [64, 512] int32 x 3 in, fp32 x 2 out: far below this
        # round_robin spreads calls over every address a `dns:///triton-headless:8001`
        # name resolves to (one Triton pod each on Kubernetes); harmless for one address.
        options = [
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.lb_policy_name", "round_robin"),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
        ]
        self._client = grpcclient.InferenceServerClient(url=url, channel_args=options)
        self.model_name = model_name
        self.model_version = model_version

    async def infer(self, windows: Windows, deadline_s: float) -> Logits:
        parts = await asyncio.gather(
            *(self._infer_rows(windows, lo, hi, deadline_s) for lo, hi in chunks(windows))
        )
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
        )

    async def _infer_rows(self, windows: Windows, lo: int, hi: int, deadline_s: float) -> Logits:
        from tritonclient.utils import InferenceServerException

        arrays = (windows.input_ids, windows.attention_mask, windows.token_type_ids)
        inputs = []
        for spec, array in zip(INPUTS, arrays, strict=True):
            tensor = self._grpc.InferInput(spec.name, [hi - lo, windows.seq_len], spec.triton_dtype)
            tensor.set_data_from_numpy(np.ascontiguousarray(array[lo:hi]))
            inputs.append(tensor)
        outputs = [self._grpc.InferRequestedOutput(spec.name) for spec in OUTPUTS]
        try:
            result = await self._client.infer(
                self.model_name, inputs, model_version=self.model_version,
                outputs=outputs, client_timeout=deadline_s,
            )
        except InferenceServerException as exc:
            raise map_triton_error(exc) from exc
        start, end = (result.as_numpy(spec.name) for spec in OUTPUTS)
        return start, end

    async def ready(self) -> bool:
        try:
            return bool(
                await self._client.is_server_ready(client_timeout=1.0)
                and await self._client.is_model_ready(
                    self.model_name, self.model_version, client_timeout=1.0
                )
            )
        except Exception:  # any failure to answer means not ready
            return False

    async def close(self) -> None:
        await self._client.close()


def map_triton_error(exc: Exception) -> ServiceError:
    """A tritonclient error -> the gateway's taxonomy (the message stays server-side)."""
    status = str(getattr(exc, "status", lambda: "")() or "")
    if "DEADLINE_EXCEEDED" in status:
        return ServiceError(ErrorCode.DEADLINE_EXCEEDED, "inference deadline exceeded")
    if "UNAVAILABLE" in status or "NOT_FOUND" in status:
        return ServiceError(ErrorCode.BACKEND_UNAVAILABLE, "inference server or model unavailable")
    return ServiceError(ErrorCode.BACKEND_ERROR, "inference server error")


class EngineBackend:
    """A real engine run in a worker thread (one call at a time), for tests and tools.

    A caller that is cancelled (its client left) or times out stops waiting at once, but a
    thread cannot be stopped: the engine call runs to its end and holds the lock until then,
    so calls never overlap. A cancelled caller still waiting for the lock runs nothing."""

    def __init__(self, engine: QAEngine) -> None:
        self.engine = engine
        self._lock = asyncio.Lock()

    async def infer(self, windows: Windows, deadline_s: float) -> Logits:
        await self._lock.acquire()
        call = asyncio.ensure_future(asyncio.to_thread(
            self.engine.infer, windows.input_ids, windows.attention_mask, windows.token_type_ids,
        ))
        call.add_done_callback(self._release)
        try:
            return await asyncio.wait_for(asyncio.shield(call), timeout=deadline_s)
        except TimeoutError as exc:
            raise ServiceError(ErrorCode.DEADLINE_EXCEEDED, "inference deadline exceeded") from exc

    def _release(self, call: asyncio.Future[Logits]) -> None:
        self._lock.release()
        if not call.cancelled():
            call.exception()  # read, so a failure no caller awaited is not logged as lost

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def pad_to_bucket(windows: Windows, buckets: tuple[int, ...], pad_id: int) -> Windows:
    """Pad windows to the smallest bucket that holds them, so Triton can batch them."""
    return windows.padded_to(max(bucket_for(windows.seq_len, buckets), windows.seq_len), pad_id)
