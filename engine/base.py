"""The one interface every inference engine implements."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

Int32Array = npt.NDArray[np.int32]
Float32Array = npt.NDArray[np.float32]


class QAEngine(Protocol):
    """Token windows in, start/end logits out; all arrays are [windows, seq]."""

    name: str

    def infer(
        self, input_ids: Int32Array, attention_mask: Int32Array, token_type_ids: Int32Array
    ) -> tuple[Float32Array, Float32Array]:
        """Start and end logits, float32, same shape as ``input_ids``."""
        ...
