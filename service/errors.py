"""The closed error taxonomy: one table from error code to HTTP status, one JSON body.

Body: ``{"error": {"code": "...", "message": "...", "request_id": "..."}}``.
No exception class name or stack trace ever reaches a client.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_INPUT = "invalid_input"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    OVERLOADED = "overloaded"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    NOT_READY = "not_ready"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BACKEND_ERROR = "backend_error"
    INTERNAL = "internal"
    CLIENT_CLOSED = "client_closed"  # the client left before its answer: nothing is sent


STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_INPUT: 422,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.BACKEND_UNAVAILABLE: 503,
    ErrorCode.NOT_READY: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.BACKEND_ERROR: 502,
    ErrorCode.INTERNAL: 500,
    ErrorCode.CLIENT_CLOSED: 499,  # nginx's "client closed request"; only in metrics and logs
}

RETRY_AFTER_S: dict[ErrorCode, int] = {
    ErrorCode.OVERLOADED: 1,
    ErrorCode.BACKEND_UNAVAILABLE: 2,
    ErrorCode.NOT_READY: 2,
}


class ServiceError(Exception):
    """Every failure the gateway reports to a client."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]


def error_body(code: ErrorCode, message: str, request_id: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code.value, "message": message, "request_id": request_id}}
