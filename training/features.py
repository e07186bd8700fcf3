"""SQuAD examples -> labelled training windows, and examples -> predictions via any engine.

Both use the gateway's own windowing and span decoding (``service.windowing``,
``service.decoding``), so offline accuracy is the service's accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from service.decoding import DecodeSpec, decode
from service.windowing import QATokenizer, Windows, WindowSpec, answer_token_span
from training.squad import Example

InferFn = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class TrainWindow:
    input_ids: np.ndarray  # int32 [len]
    token_type_ids: np.ndarray  # int32 [len]
    start: int  # 0 ([CLS]) when the answer is not in this window
    end: int


def _by_context(examples: Sequence[Example]) -> dict[str, list[Example]]:
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        groups[ex.context].append(ex)
    return groups


def encoded_groups(
    examples: Sequence[Example], tok: QATokenizer, spec: WindowSpec, desc: str
) -> Iterator[tuple[list[Example], Windows]]:
    """Per context (in first-seen order): its questions and their windows, tokenized in
    two batches (contexts, questions), with a ``desc`` progress bar."""
    groups = _by_context(examples)
    contexts = list(groups)
    ctx_enc = tok.encode_batch(contexts)
    q_enc = tok.encode_batch([ex.question for c in contexts for ex in groups[c]])
    pos = 0
    for context, enc in tqdm(zip(contexts, ctx_enc, strict=True), total=len(contexts), desc=desc):
        group = groups[context]
        yield group, tok.windows(q_enc[pos : pos + len(group)], enc, spec)
        pos += len(group)


def train_windows(
    examples: Sequence[Example], tok: QATokenizer, spec: WindowSpec
) -> list[TrainWindow]:
    """Every window of every answerable example, labelled with its first gold answer."""
    out = []
    for group, win in encoded_groups(examples, tok, spec, "windows"):
        for w in range(win.count):
            ex = group[int(win.question_index[w])]
            span = None
            if ex.answers:
                start_char = ex.answer_starts[0]
                span = answer_token_span(
                    win.offsets[w], start_char, start_char + len(ex.answers[0])
                )
            n = int(win.lengths[w])
            start, end = span if span is not None else (0, 0)
            out.append(TrainWindow(win.input_ids[w, :n], win.token_type_ids[w, :n], start, end))
    return out


def predict(
    examples: Sequence[Example],
    tok: QATokenizer,
    infer: InferFn,
    spec: WindowSpec,
    decode_spec: DecodeSpec,
    batch_windows: int = 64,
) -> dict[str, str]:
    """The best answer text of every example (empty when judged unanswerable)."""
    full = predict_with_margins(examples, tok, infer, spec, decode_spec, batch_windows)
    return {k: text for k, (text, _) in full.items()}


def predict_with_margins(
    examples: Sequence[Example],
    tok: QATokenizer,
    infer: InferFn,
    spec: WindowSpec,
    decode_spec: DecodeSpec,
    batch_windows: int = 64,
) -> dict[str, tuple[str, float]]:
    """Per example: the answer text and ``null_logit - best_span_logit`` (the no-answer margin)."""
    predictions: dict[str, tuple[str, float]] = {}
    pending: list[tuple[list[Example], Windows]] = []

    def flush() -> None:
        seq = max(win.seq_len for _, win in pending)
        padded = [win.padded_to(seq, tok.pad_id) for _, win in pending]
        start, end = infer(
            np.concatenate([w.input_ids for w in padded]),
            np.concatenate([w.attention_mask for w in padded]),
            np.concatenate([w.token_type_ids for w in padded]),
        )
        row = 0
        for (group, win), pwin in zip(pending, padded, strict=True):
            rows = slice(row, row + win.count)
            results = decode(pwin, start[rows], end[rows], len(group), decode_spec)
            for ex, res in zip(group, results, strict=True):
                best = res.spans[0] if res.spans else None
                text = ex.context[best.start : best.end] if best else ""
                margin = res.null_logit - best.logit if best else float("inf")
                predictions[ex.id] = (text, margin)
            row += win.count
        pending.clear()

    n_pending = 0
    for group, win in encoded_groups(examples, tok, spec, "predict"):
        pending.append((group, win))
        n_pending += win.count
        if n_pending >= batch_windows:
            flush()
            n_pending = 0
    if pending:
        flush()
    return predictions
