"""The question-answering use case: limits -> windows -> inference -> spans."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from service.backend import InferenceBackend, pad_to_bucket
from service.decoding import DecodeSpec, QuestionResult, decode
from service.errors import ErrorCode, ServiceError
from service.metrics import Metrics
from service.settings import Settings
from service.windowing import QATokenizer, Windows, WindowSpec


@dataclass(frozen=True)
class QAQuery:
    context: str
    questions: tuple[str, ...]
    top_k: int
    max_answer_len: int
    no_answer_threshold: float | None


@dataclass(frozen=True)
class QAOutcome:
    results: tuple[QuestionResult, ...]
    windows: int
    tokenize_s: float
    infer_s: float
    decode_s: float


# Requests up to this many characters are tokenized on the event loop: they take well under a
# millisecond, less than a worker-thread hop plus the GIL hand-offs it causes under load.
INLINE_TOKENIZE_CHARS = 4_000
# Decoding more windows than this runs in a worker thread (numpy releases the GIL).
INLINE_DECODE_WINDOWS = 8


class QAService:
    """Owns the tokenizer and the backend; one instance per app."""

    def __init__(
        self, settings: Settings, tokenizer: QATokenizer, backend: InferenceBackend, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.backend = backend
        self.metrics = metrics
        self.spec = WindowSpec(
            settings.max_seq_len, settings.window_overlap, settings.max_question_tokens
        )

    def check_limits(self, query: QAQuery) -> None:
        s = self.settings
        if len(query.context) > s.max_context_chars:
            raise ServiceError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"context has {len(query.context)} characters; the limit is {s.max_context_chars}",
            )
        if len(query.questions) > s.max_questions:
            raise ServiceError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"{len(query.questions)} questions; the limit is {s.max_questions}",
            )
        longest = max(len(q) for q in query.questions)
        if longest > s.max_question_chars:
            raise ServiceError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"a question has {longest} characters; the limit is {s.max_question_chars}",
            )
        if query.top_k > s.max_top_k:
            raise ServiceError(
                ErrorCode.INVALID_INPUT, f"top_k is {query.top_k}; the limit is {s.max_top_k}"
            )

    def _windows(self, query: QAQuery) -> Windows:
        encoded = self.tokenizer.encode_batch([query.context, *query.questions])
        windows = self.tokenizer.windows(encoded[1:], encoded[0], self.spec)
        if windows.count > self.settings.max_windows:
            raise ServiceError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"the request needs {windows.count} windows; the limit is "
                f"{self.settings.max_windows} (shorten the context or ask fewer questions)",
            )
        return pad_to_bucket(windows, self.settings.seq_buckets, self.tokenizer.pad_id)

    async def answer(self, query: QAQuery) -> QAOutcome:
        self.check_limits(query)
        t0 = time.perf_counter()
        size = len(query.context) + sum(len(q) for q in query.questions)
        if size <= INLINE_TOKENIZE_CHARS:
            windows = self._windows(query)
        else:  # long inputs: tokenizers releases the GIL, keep the event loop free meanwhile
            windows = await asyncio.to_thread(self._windows, query)
        t1 = time.perf_counter()
        start, end = await self.backend.infer(windows, self.settings.request_timeout_ms / 1000)
        t2 = time.perf_counter()
        spec = DecodeSpec(query.top_k, query.max_answer_len, query.no_answer_threshold)
        if windows.count <= INLINE_DECODE_WINDOWS:
            results = decode(windows, start, end, len(query.questions), spec)
        else:
            results = await asyncio.to_thread(
                decode, windows, start, end, len(query.questions), spec
            )
        t3 = time.perf_counter()
        self._observe(windows, t1 - t0, t2 - t1, t3 - t2, len(query.questions))
        return QAOutcome(tuple(results), windows.count, t1 - t0, t2 - t1, t3 - t2)

    def _observe(
        self, windows: Windows, tokenize: float, infer: float, decode_s: float, n_questions: int
    ) -> None:
        m = self.metrics
        m.phase_duration.labels("tokenize").observe(tokenize)
        m.phase_duration.labels("infer").observe(infer)
        m.phase_duration.labels("decode").observe(decode_s)
        m.windows_per_request.observe(windows.count)
        m.tokens_per_request.observe(int(windows.lengths.sum()))
        m.questions_per_request.observe(n_questions)
