"""The app factory: settings, lifespan-owned resources, routes, error handlers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.backend import InferenceBackend, TritonBackend
from service.errors import RETRY_AFTER_S, ErrorCode, ServiceError, error_body
from service.metrics import create_metrics
from service.middleware import GatewayMiddleware
from service.qa import QAService
from service.routes import router
from service.settings import Settings
from service.windowing import QATokenizer

log = logging.getLogger("service")


def create_app(settings: Settings | None = None, backend: InferenceBackend | None = None) -> FastAPI:
    """A gateway app. ``backend`` defaults to Triton at ``settings.triton_url``."""
    settings = settings or Settings()
    metrics = create_metrics(settings.latency_budget_ms / 1000)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        chosen = backend or TritonBackend(
            settings.triton_url, settings.model_name, settings.model_version
        )
        tokenizer = QATokenizer.from_dir(settings.model_dir)
        app.state.qa = QAService(settings, tokenizer, chosen, metrics)
        app.state.in_flight = 0
        try:
            yield
        finally:
            await chosen.close()

    app = FastAPI(
        title="Extractive QA gateway",
        version="0.1.0",
        description="Answer spans for questions about a context, served by Triton.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.include_router(router)
    _install_error_handlers(app)
    # 12 bytes a character: the most a legal character takes in JSON, a character outside the
    # BMP written as an escaped surrogate pair (\ud83d\ude00); the limits count characters
    max_body = 12 * (settings.max_context_chars + settings.max_questions * settings.max_question_chars)
    app.add_middleware(
        GatewayMiddleware, metrics=metrics, max_body_bytes=max_body + 65536,
        budget_s=settings.latency_budget_ms / 1000,
    )
    return app


def _error_response(request: Request, code: ErrorCode, message: str) -> JSONResponse:
    request.state.error_code = code
    request_id = getattr(request.state, "request_id", "")
    headers = {"Retry-After": str(RETRY_AFTER_S[code])} if code in RETRY_AFTER_S else None
    err = ServiceError(code, message)
    return JSONResponse(error_body(code, message, request_id), err.status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _error_response(request, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(request, ErrorCode.INVALID_INPUT, _describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED,
                 413: ErrorCode.PAYLOAD_TOO_LARGE}
        code = codes.get(exc.status_code, ErrorCode.INVALID_INPUT)
        return _error_response(request, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error (request %s)", getattr(request.state, "request_id", ""))
        return _error_response(request, ErrorCode.INTERNAL, "internal error")


def _describe(exc: RequestValidationError) -> str:
    """A short, client-facing summary of what was wrong (no internals)."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts) or "invalid request"
