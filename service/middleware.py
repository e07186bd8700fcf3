"""One pure-ASGI middleware: request id, body-size guard, request metrics, and the end of a
request whose client has gone.

Pure ASGI (not BaseHTTPMiddleware) so it adds microseconds. Only ``POST /v1/qa`` runs in a
task of its own, beside a watcher: a client that disconnects before its response starts
cancels that task, so its Triton calls are cancelled (gRPC cancellation; the model skips
cancelled requests) instead of running to the end for nobody. Such a request is counted
with outcome ``client_closed`` (status 499, as nginx logs it); nothing is sent.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import STATUS, ErrorCode, error_body
from service.metrics import Metrics

REQUEST_ID_HEADER = b"x-request-id"
QA_ROUTE = "/v1/qa"


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int, budget_s: float) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.budget_s = budget_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _request_id(scope)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 500
        responded = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status = message["status"]
                responded = True
                message.setdefault("headers", []).append(
                    (REQUEST_ID_HEADER, request_id.encode("latin-1"))
                )
            await send(message)

        if _content_length(scope) > self.max_body_bytes:
            state["error_code"] = ErrorCode.PAYLOAD_TOO_LARGE
            await _send_error(
                send_wrapper, ErrorCode.PAYLOAD_TOO_LARGE,
                f"request body is larger than {self.max_body_bytes} bytes", request_id,
            )
        else:
            try:
                if scope["path"] == QA_ROUTE and scope["method"] == "POST":
                    if await self._run_until_disconnect(scope, receive, send_wrapper,
                                                        lambda: responded):
                        state["error_code"] = ErrorCode.CLIENT_CLOSED
                        status = STATUS[ErrorCode.CLIENT_CLOSED]
                else:
                    await self.app(scope, self._limited(receive), send_wrapper)
            finally:
                self._observe(scope, state, status, time.perf_counter() - started)
            return
        self._observe(scope, state, status, time.perf_counter() - started)

    async def _run_until_disconnect(
        self, scope: Scope, receive: Receive, send: Send, responded: Callable[[], bool]
    ) -> bool:
        """Run the app; True when its client disconnected before the response started. A
        client that leaves mid-body ends the body's reading (FastAPI answers nobody); one that
        leaves after it cancels the app. Once the app has read the whole body, a watcher reads
        on: the next message is ``http.disconnect``, when the client goes or the response
        completes (the ASGI spec), and is handed to the app too if it reads again."""
        body_read = asyncio.Event()
        disconnect: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        left = False  # the client went before the response started
        limited = self._limited(receive)

        def disconnected(message: Message) -> None:
            nonlocal left
            left = not responded()
            disconnect.set_result(message)

        async def app_receive() -> Message:
            if disconnect.done() or body_read.is_set():
                return await asyncio.shield(disconnect)
            message = await limited()
            if message["type"] == "http.disconnect":
                disconnected(message)
            elif not message.get("more_body", False):
                body_read.set()
            return message

        async def watch() -> None:
            await body_read.wait()
            message = await receive()
            while message["type"] != "http.disconnect":  # none is sent after the body
                message = await receive()
            disconnected(message)

        app = asyncio.ensure_future(self.app(scope, app_receive, send))
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait((app, watcher), return_when=asyncio.FIRST_COMPLETED)
            if left and not app.done():
                app.cancel()
            await asyncio.wait((app,))  # its cancellation's cleanup (slots, gauges) runs first
            if not app.cancelled() or not left:
                app.result()  # the app's own exception, as if it had run in this task
            return left
        finally:  # also when this task is cancelled (shutdown): the app's cleanup runs first
            for task in (app, watcher):
                task.cancel()
            await asyncio.wait((app, watcher))
            for task in (app, watcher):
                if not task.cancelled():
                    task.exception()  # read: a failure raised here or not is not logged as lost

    def _limited(self, receive: Receive) -> Receive:
        """Count streamed body bytes too (a chunked body has no Content-Length)."""
        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    # FastAPI re-raises HTTPException from body reading; the app maps it to 413
                    raise HTTPException(413, f"request body is larger than {self.max_body_bytes} bytes")
            return message

        return receive_limited

    def _observe(self, scope: Scope, state: dict[str, Any], status: int, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", "unmatched")
        code: ErrorCode | None = state.get("error_code")
        if code is None and status >= 400:
            code = ErrorCode.INTERNAL if status >= 500 else ErrorCode.INVALID_INPUT
        outcome = "ok" if code is None else code.value
        self.metrics.request_duration.labels(route, outcome).observe(seconds)
        if code is not None:
            self.metrics.errors.labels(code.value).inc()
        if route == QA_ROUTE and seconds > self.budget_s:
            self.metrics.over_budget.inc()


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER:
            text: str = value.decode("latin-1")
            if 0 < len(text) <= 128 and text.isprintable():
                return text
    return uuid.uuid4().hex


def _content_length(scope: Scope) -> int:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


async def _send_error(send: Send, code: ErrorCode, message: str, request_id: str) -> None:
    body = json.dumps(error_body(code, message, request_id)).encode()
    await send({
        "type": "http.response.start",
        "status": STATUS[code],
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
