"""Question + context -> fixed-length token windows, with character offsets kept.

A window is ``[CLS] question [SEP] context-slice [SEP]``. Long contexts are cut into
several windows; ``overlap`` is the number of context tokens that two consecutive
windows share (HF tokenizers' ``stride`` meaning, *not* the step size of Google's
``doc_stride``). The step between window starts is therefore
``context_budget - overlap``.

Offsets are character offsets into the original context string (the tokenizer maps
through normalisation: lower-casing, accent stripping, CJK splitting), with ``-1``
for tokens that are not context tokens. Answers decoded from them are always exact
slices of the context.

This module is pure (tokenizers + numpy) so training, evaluation and the gateway
share one implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

IntArray = npt.NDArray[np.int32]

NOT_CONTEXT = -1
_SEQUENTIAL_BELOW = 4  # texts; see QATokenizer.encode_batch


@dataclass(frozen=True)
class WindowSpec:
    """How a (question, context) pair is cut into windows."""

    max_seq_len: int = 384
    overlap: int = 128
    max_question_len: int = 64

    def __post_init__(self) -> None:
        if self.max_question_len < 1 or self.overlap < 0:
            raise ValueError("max_question_len must be >= 1 and overlap >= 0")
        if self.context_budget(self.max_question_len) <= self.overlap:
            raise ValueError(
                "overlap must be smaller than the context tokens a window holds "
                f"(max_seq_len {self.max_seq_len} - question {self.max_question_len} - 3)"
            )

    def context_budget(self, question_len: int) -> int:
        """Context tokens that fit in one window next to a question of this length."""
        return self.max_seq_len - question_len - 3


@dataclass(frozen=True)
class EncodedText:
    """Token ids of a text without special tokens, and each token's char span."""

    ids: IntArray  # [n]
    offsets: IntArray  # [n, 2]


@dataclass(frozen=True)
class Windows:
    """All windows of a request, padded to the longest window.

    Row ``w`` belongs to question ``question_index[w]``; ``lengths[w]`` tokens are real.
    """

    input_ids: IntArray  # [n, seq]
    attention_mask: IntArray  # [n, seq]
    token_type_ids: IntArray  # [n, seq]
    offsets: IntArray  # [n, seq, 2], NOT_CONTEXT outside the context
    question_index: IntArray  # [n]
    lengths: IntArray  # [n]

    @property
    def count(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def padded_to(self, seq_len: int, pad_id: int = 0) -> Windows:
        """The same windows, right-padded to ``seq_len`` columns."""
        extra = seq_len - self.seq_len
        if extra < 0:
            raise ValueError(f"cannot pad windows of length {self.seq_len} to {seq_len}")
        if extra == 0:
            return self
        pad2 = ((0, 0), (0, extra))
        return Windows(
            input_ids=np.pad(self.input_ids, pad2, constant_values=pad_id),
            attention_mask=np.pad(self.attention_mask, pad2),
            token_type_ids=np.pad(self.token_type_ids, pad2),
            offsets=np.pad(self.offsets, (*pad2, (0, 0)), constant_values=NOT_CONTEXT),
            question_index=self.question_index,
            lengths=self.lengths,
        )


class QATokenizer:
    """A BERT-style WordPiece tokenizer that builds QA windows."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self.cls_id = self._token_id("[CLS]")
        self.sep_id = self._token_id("[SEP]")
        self.pad_id = self._token_id("[PAD]")

    @classmethod
    def from_dir(cls, model_dir: Path) -> QATokenizer:
        return cls(Tokenizer.from_file(str(model_dir / "tokenizer.json")))

    def _token_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer has no {token} token: not a BERT-family vocabulary")
        return int(token_id)

    def encode(self, text: str) -> EncodedText:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[EncodedText]:
        """Tokenize texts without special tokens (in parallel, in Rust, for many texts)."""
        if len(texts) <= _SEQUENTIAL_BELOW:  # the thread pool costs more than it saves here
            encodings = [self._tok.encode(t, add_special_tokens=False) for t in texts]
        else:
            encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [
            EncodedText(
                ids=np.asarray(e.ids, dtype=np.int32).reshape(-1),
                offsets=np.asarray(e.offsets, dtype=np.int32).reshape(-1, 2),
            )
            for e in encodings
        ]

    def windows(
        self, questions: Sequence[EncodedText], context: EncodedText, spec: WindowSpec
    ) -> Windows:
        """Cut the context into windows for every question (question-major order)."""
        rows = [
            row
            for q_index, question in enumerate(questions)
            for row in self._question_rows(q_index, question.ids, context, spec)
        ]
        return _stack(rows, self.pad_id)

    def _question_rows(
        self, q_index: int, q_ids: IntArray, context: EncodedText, spec: WindowSpec
    ) -> list[_Row]:
        q_ids = q_ids[: spec.max_question_len]
        budget = spec.context_budget(len(q_ids))
        head = np.concatenate([[self.cls_id], q_ids, [self.sep_id]]).astype(np.int32)
        rows = []
        for start in window_starts(len(context.ids), budget, spec.overlap):
            stop = min(start + budget, len(context.ids))
            ids = np.concatenate([head, context.ids[start:stop], [self.sep_id]])
            offsets = np.full((len(ids), 2), NOT_CONTEXT, dtype=np.int32)
            offsets[len(head) : len(head) + stop - start] = context.offsets[start:stop]
            rows.append(_Row(q_index, ids.astype(np.int32), len(head), offsets))
        return rows


def window_starts(n_context: int, budget: int, overlap: int) -> list[int]:
    """First context token of each window; consecutive windows share ``overlap`` tokens."""
    step = budget - overlap
    starts = [0]
    while starts[-1] + budget < n_context:
        starts.append(starts[-1] + step)
    return starts


@dataclass(frozen=True)
class _Row:
    question_index: int
    ids: IntArray
    head_len: int  # tokens of [CLS] question [SEP]
    offsets: IntArray


def _stack(rows: list[_Row], pad_id: int) -> Windows:
    seq = max(len(r.ids) for r in rows)
    n = len(rows)
    input_ids = np.full((n, seq), pad_id, dtype=np.int32)
    attention = np.zeros((n, seq), dtype=np.int32)
    types = np.zeros((n, seq), dtype=np.int32)
    offsets = np.full((n, seq, 2), NOT_CONTEXT, dtype=np.int32)
    lengths = np.zeros(n, dtype=np.int32)
    for w, row in enumerate(rows):
        length = len(row.ids)
        input_ids[w, :length] = row.ids
        attention[w, :length] = 1
        types[w, row.head_len : length] = 1
        offsets[w, :length] = row.offsets
        lengths[w] = length
    return Windows(
        input_ids=input_ids,
        attention_mask=attention,
        token_type_ids=types,
        offsets=offsets,
        question_index=np.asarray([r.question_index for r in rows], dtype=np.int32),
        lengths=lengths,
    )


def answer_token_span(
    window_offsets: IntArray, char_start: int, char_end: int
) -> tuple[int, int] | None:
    """Token positions (inclusive) of a gold char span ``[char_start, char_end)`` in a window.

    ``None`` when the span is not wholly inside the window's context tokens.
    """
    is_ctx = window_offsets[:, 0] != NOT_CONTEXT
    ctx_positions = np.flatnonzero(is_ctx)
    if len(ctx_positions) == 0:
        return None
    starts = window_offsets[ctx_positions, 0]
    ends = window_offsets[ctx_positions, 1]
    if char_start < starts[0] or char_end > ends[-1]:
        return None
    first = int(np.searchsorted(ends, char_start, side="right"))
    last = int(np.searchsorted(starts, char_end, side="left")) - 1
    if first >= len(ctx_positions) or last < first:
        return None
    return int(ctx_positions[first]), int(ctx_positions[last])
