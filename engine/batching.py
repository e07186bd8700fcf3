"""Run one engine call for several Triton requests (what the dynamic batcher hands over).

Requests of one dynamic batch have equal sequence lengths (Triton batches equal shapes
only), but this groups by length anyway so that mixed lengths are still correct.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.base import Float32Array, Int32Array, QAEngine

Inputs = tuple[Int32Array, Int32Array, Int32Array]  # input_ids, attention_mask, token_type_ids
Outputs = tuple[Float32Array, Float32Array]  # start_logits, end_logits


@dataclass(frozen=True)
class RequestLimits:
    """What one request's values may be: the served checkpoint's vocabularies and positions."""

    vocab_size: int
    type_vocab_size: int
    max_len: int

    @classmethod
    def of_checkpoint(cls, model_dir: Path) -> RequestLimits:
        config = json.loads((model_dir / "config.json").read_text())
        return cls(config["vocab_size"], config["type_vocab_size"],
                   config["max_position_embeddings"])

    def problem(self, request: Sequence[Int32Array]) -> str | None:
        """What is wrong with one request's tensors (None: nothing), before any engine sees them.

        Triton checks names, dtypes, ranks and the batch size against config.pbtxt; values,
        the three shapes agreeing and the length are ours. An engine fed bad values fails (or
        answers garbage) for every request batched with the bad one, so each request is
        checked alone, before :func:`run_batched`.
        """
        ids, mask, type_ids = request
        if not ids.shape == mask.shape == type_ids.shape:
            return ("input_ids, attention_mask and token_type_ids must have one shape "
                    f"[batch, seq]; got {list(ids.shape)}, {list(mask.shape)}, "
                    f"{list(type_ids.shape)}")
        if ids.shape[0] == 0:
            return "empty batch: send at least one window"
        if not 1 <= ids.shape[1] <= self.max_len:
            return (f"sequence length {ids.shape[1]} is outside [1, {self.max_len}] "
                    "(the model's positions)")
        for name, array, high in (("input_ids", ids, self.vocab_size), ("attention_mask", mask, 2),
                                  ("token_type_ids", type_ids, self.type_vocab_size)):
            if array.min() < 0 or array.max() >= high:
                at = tuple(int(i) for i in np.argwhere((array < 0) | (array >= high))[0])
                return f"{name} values must be in [0, {high}); got {int(array[at])} at {list(at)}"
        attends = mask.any(axis=1)
        if not attends.all():
            return f"attention_mask row {int(np.argmin(attends))} is all 0: no token to attend to"
        return None


@dataclass
class Backlog:
    """Whether a batch queued behind a busy engine rather than forming while it sat idle: its
    execution starts within ``min_gap_s``, or within half the previous execution's time, of
    that execution's end (handing the responses over and forming the next batch take a few
    ms on a slow host even when work is waiting).

    Asking Triton whether a request was cancelled is a round trip from the python backend's
    stub to the server, 35-120 us a request on the 2-core CI machine under load: more than a
    GPU spends on a short window. A batch that formed while the engine was idle waited about
    the dynamic batcher's delay, too short for its client to give up, so only batches that
    queued behind work are checked: under a backlog, where clients time out.
    """

    min_gap_s: float = 0.002
    _started: float = float("-inf")
    _ended: float = float("-inf")

    def queued_behind_work(self, now: float) -> bool:
        """Call as an execution starts."""
        busy = self._ended - self._started
        queued = now - self._ended < max(self.min_gap_s, busy / 2)
        self._started = now
        return queued

    def ended(self, now: float) -> None:
        """Call as an execution ends."""
        self._ended = now


def run_batched(engine: QAEngine, requests: Sequence[Inputs]) -> list[Outputs]:
    """Logits for every request, in order, with one engine call per sequence length."""
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, (ids, _, _) in enumerate(requests):
        by_len[ids.shape[1]].append(i)
    results: list[Outputs | None] = [None] * len(requests)
    for members in by_len.values():
        stacked = [np.concatenate([requests[i][k] for i in members]) for k in range(3)]
        start, end = engine.infer(stacked[0], stacked[1], stacked[2])
        row = 0
        for i in members:
            n = requests[i][0].shape[0]
            results[i] = (start[row : row + n], end[row : row + n])
            row += n
    return [r for r in results if r is not None]
