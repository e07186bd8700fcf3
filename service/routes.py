"""HTTP routes: translate HTTP to a QAService call and back, nothing more."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.errors import ErrorCode, ServiceError
from service.qa import QAOutcome, QAQuery, QAService
from service.schemas import Answer, ErrorResponse, Health, QARequest, QAResponse, Timing

router = APIRouter()

ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (413, "Context, questions or windows over the limits"),
        (422, "Invalid input (empty or whitespace text, wrong types, unknown fields)"),
        (429, "Too many requests in flight"),
        (502, "Triton returned an error"),
        (503, "Triton or the model is unavailable"),
        (504, "Inference deadline exceeded"),
    )
}


def get_qa(request: Request) -> QAService:
    qa: QAService = request.app.state.qa
    return qa


QA = Annotated[QAService, Depends(get_qa)]


@router.post("/v1/qa", response_model=QAResponse, responses=ERROR_RESPONSES)
async def answer(body: QARequest, request: Request, response: Response, qa: QA) -> QAResponse:
    """Answer one or several questions about one context."""
    settings = qa.settings
    query = QAQuery(
        context=body.context,
        questions=tuple(body.all_questions),
        top_k=body.top_k or settings.default_top_k,
        max_answer_len=body.max_answer_len or settings.max_answer_tokens,
        no_answer_threshold=(
            body.no_answer_threshold
            if body.no_answer_threshold is not None
            else settings.no_answer_threshold
        ),
    )
    state = request.app.state
    if state.in_flight >= settings.max_in_flight:
        raise ServiceError(ErrorCode.OVERLOADED, "too many requests in flight; retry shortly")
    state.in_flight += 1
    qa.metrics.in_flight.inc()
    try:
        outcome = await qa.answer(query)
    finally:
        state.in_flight -= 1
        qa.metrics.in_flight.dec()
    result = _to_response(body.context, outcome)
    response.headers["Server-Timing"] = server_timing(result.timing)
    return result


def _to_response(context: str, outcome: QAOutcome) -> QAResponse:
    total = outcome.tokenize_s + outcome.infer_s + outcome.decode_s
    return QAResponse(
        answers=[
            [Answer(text=context[s.start : s.end], start=s.start, end=s.end, score=s.score)
             for s in r.spans]
            for r in outcome.results
        ],
        no_answer_scores=[r.no_answer_score for r in outcome.results],
        windows=outcome.windows,
        timing=Timing(
            tokenize_ms=outcome.tokenize_s * 1e3,
            infer_ms=outcome.infer_s * 1e3,
            decode_ms=outcome.decode_s * 1e3,
            total_ms=total * 1e3,
        ),
    )


def server_timing(t: Timing) -> str:
    return (f"tokenize;dur={t.tokenize_ms:.3f}, infer;dur={t.infer_ms:.3f}, "
            f"decode;dur={t.decode_ms:.3f}, total;dur={t.total_ms:.3f}")


@router.get("/health/live", response_model=Health)
async def live() -> Health:
    """The process is up (no backend check)."""
    return Health(status="live")


@router.get("/health/ready", response_model=Health, responses={503: {"model": ErrorResponse}})
async def ready(qa: QA) -> Health:
    """Ready only when Triton and the model answer."""
    is_ready = await qa.backend.ready()
    qa.metrics.ready.set(1 if is_ready else 0)
    if not is_ready:
        raise ServiceError(ErrorCode.NOT_READY, "inference server or model not ready")
    return Health(status="ready")


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)


