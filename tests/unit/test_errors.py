"""The error table and the mapping of Triton client errors onto it."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from service.backend import map_triton_error
from service.errors import STATUS, ErrorCode, error_body


def test_every_code_has_a_status() -> None:
    assert set(STATUS) == set(ErrorCode)
    assert all(s == 500 or 400 <= s < 600 for s in STATUS.values())
    client = {c for c, s in STATUS.items() if s < 500}
    assert ErrorCode.INVALID_INPUT in client and ErrorCode.PAYLOAD_TOO_LARGE in client


@pytest.mark.parametrize(
    ("status", "code", "http"),
    [
        ("StatusCode.DEADLINE_EXCEEDED", ErrorCode.DEADLINE_EXCEEDED, 504),
        ("StatusCode.UNAVAILABLE", ErrorCode.BACKEND_UNAVAILABLE, 503),
        ("StatusCode.NOT_FOUND", ErrorCode.BACKEND_UNAVAILABLE, 503),
        ("StatusCode.INTERNAL", ErrorCode.BACKEND_ERROR, 502),
        (None, ErrorCode.BACKEND_ERROR, 502),
    ],
)
def test_triton_errors_map_to_taxonomy(status: str | None, code: ErrorCode, http: int) -> None:
    err = map_triton_error(InferenceServerException("engine failure: secret detail", status))
    assert err.code is code and err.status == http
    assert "secret detail" not in err.message


def test_error_body_shape() -> None:
    assert error_body(ErrorCode.OVERLOADED, "busy", "r1") == {
        "error": {"code": "overloaded", "message": "busy", "request_id": "r1"}
    }
