"""One pure-ASGI middleware: request id, body-size guard, and request metrics.

Pure ASGI (not BaseHTTPMiddleware) so it adds microseconds, not a task per request.
"""

from __future__ import annotations

import json
import time
import uuid
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

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
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
                await self.app(scope, self._limited(receive), send_wrapper)
            finally:
                self._observe(scope, state, status, time.perf_counter() - started)
            return
        self._observe(scope, state, status, time.perf_counter() - started)

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
