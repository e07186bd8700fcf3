"""Start/end logits of all windows -> the n-best answer spans of each question.

A candidate span is (start token, end token) inside one window's context with
``start <= end < start + max_answer_len``; its rank score is ``start_logit + end_logit``
(the convention of BERT's and HF's SQuAD post-processing). Spans from overlapping
windows that cover the same characters are merged, keeping the best. The reported
``score`` is a probability: the softmax of rank scores over the ``N_BEST`` best distinct
spans plus the no-answer candidate (so it does not depend on ``top_k``).

The no-answer score of a question is the lowest ``start[CLS] + end[CLS]`` over its
windows. With a threshold set, the answer is empty when
``null_score - best_span_score > threshold``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from service.windowing import NOT_CONTEXT, Windows

FloatArray = npt.NDArray[np.float32]

_CANDIDATES_PER_ANSWER = 4  # extra candidates taken so that merging duplicates keeps top_k
N_BEST = 20  # spans the reported probability is normalised over, whatever top_k is


@dataclass(frozen=True)
class DecodeSpec:
    top_k: int = 1
    max_answer_len: int = 30  # tokens
    no_answer_threshold: float | None = None  # None: always answer


@dataclass(frozen=True)
class Span:
    start: int  # char offset into the context, inclusive
    end: int  # char offset, exclusive
    score: float  # probability in [0, 1]
    logit: float  # start_logit + end_logit


@dataclass(frozen=True)
class QuestionResult:
    spans: tuple[Span, ...]  # best first; empty when the question is judged unanswerable
    null_logit: float
    no_answer_score: float  # probability of the no-answer candidate


def decode(
    windows: Windows,
    start_logits: FloatArray,
    end_logits: FloatArray,
    n_questions: int,
    spec: DecodeSpec,
) -> list[QuestionResult]:
    """Decode every question of a request; logits are [windows, seq] (padding ignored)."""
    seq = windows.seq_len
    start_logits = np.asarray(start_logits, dtype=np.float32)[:, :seq]
    end_logits = np.asarray(end_logits, dtype=np.float32)[:, :seq]
    is_ctx = windows.offsets[:, :, 0] != NOT_CONTEXT
    return [
        _decode_question(
            np.flatnonzero(windows.question_index == q),
            windows,
            start_logits,
            end_logits,
            is_ctx,
            spec,
        )
        for q in range(n_questions)
    ]


def _decode_question(
    rows: npt.NDArray[np.intp],
    windows: Windows,
    start_logits: FloatArray,
    end_logits: FloatArray,
    is_ctx: npt.NDArray[np.bool_],
    spec: DecodeSpec,
) -> QuestionResult:
    scores = _span_scores(start_logits[rows], end_logits[rows], is_ctx[rows], spec.max_answer_len)
    null_logit = float(np.min(start_logits[rows, 0] + end_logits[rows, 0]))
    spans = _best_spans(scores, windows.offsets[rows], max(spec.top_k, N_BEST))
    probs = _softmax(np.array([s[2] for s in spans] + [null_logit], dtype=np.float64))
    ranked = tuple(
        Span(start=s, end=e, score=float(p), logit=float(lg))
        for (s, e, lg), p in zip(spans[: spec.top_k], probs[:-1][: spec.top_k], strict=True)
    )
    threshold = spec.no_answer_threshold
    if threshold is not None and (not ranked or null_logit - ranked[0].logit > threshold):
        ranked = ()
    return QuestionResult(spans=ranked, null_logit=null_logit, no_answer_score=float(probs[-1]))


def _span_scores(
    start: FloatArray, end: FloatArray, is_ctx: npt.NDArray[np.bool_], max_len: int
) -> FloatArray:
    """Scores [windows, seq, max_len]: span (i, i + d); -inf where invalid."""
    n, seq = start.shape
    max_len = min(max_len, seq)  # no span is longer than a window
    neg = np.float32(-np.inf)
    start = np.where(is_ctx, start, neg)
    end = np.where(is_ctx, end, neg)
    padded_end = np.concatenate([end, np.full((n, max_len - 1), neg, np.float32)], axis=1)
    ends = np.lib.stride_tricks.sliding_window_view(padded_end, max_len, axis=1)[:, :seq]
    return start[:, :, None] + ends  # type: ignore[no-any-return]


def _best_spans(
    scores: FloatArray, offsets: npt.NDArray[np.int32], top_k: int
) -> list[tuple[int, int, float]]:
    flat = scores.reshape(-1)
    take = min(flat.size, top_k * _CANDIDATES_PER_ANSWER)
    seq, max_len = scores.shape[1], scores.shape[2]
    while True:
        idx = np.argpartition(-flat, take - 1)[:take]
        idx = idx[np.argsort(-flat[idx], kind="stable")]
        best: dict[tuple[int, int], float] = {}
        exhausted = take == flat.size
        for i in idx:
            logit = float(flat[i])
            if not np.isfinite(logit):
                exhausted = True
                break
            w, rest = divmod(int(i), seq * max_len)
            tok, d = divmod(rest, max_len)
            key = (int(offsets[w, tok, 0]), int(offsets[w, tok + d, 1]))
            if key not in best:
                best[key] = logit
            if len(best) == top_k:
                break
        if len(best) == top_k or exhausted:
            return [(s, e, lg) for (s, e), lg in best.items()]
        # duplicates (overlapping windows, several tokens of one character) used up the
        # candidates: look further down the ranking
        take = min(flat.size, take * _CANDIDATES_PER_ANSWER)


def _softmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    z = np.exp(x - np.max(x))
    return z / z.sum()  # type: ignore[no-any-return]
