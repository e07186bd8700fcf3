"""Run one engine call for several Triton requests (what the dynamic batcher hands over).

Requests of one dynamic batch have equal sequence lengths (Triton batches equal shapes
only), but this groups by length anyway so that mixed lengths are still correct.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from engine.base import Float32Array, Int32Array, QAEngine

Inputs = tuple[Int32Array, Int32Array, Int32Array]  # input_ids, attention_mask, token_type_ids
Outputs = tuple[Float32Array, Float32Array]  # start_logits, end_logits


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
