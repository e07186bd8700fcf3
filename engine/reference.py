"""The plain transformers/PyTorch engine: the fp32 reference for parity and accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.base import Float32Array, Int32Array


class ReferenceEngine:
    """``AutoModelForQuestionAnswering`` from a local checkpoint directory."""

    name = "reference"

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: str = "float32") -> None:
        from transformers import AutoModelForQuestionAnswering

        self.device = torch.device(device)
        self.model = AutoModelForQuestionAnswering.from_pretrained(
            str(model_dir), dtype=getattr(torch, dtype)
        ).to(self.device).eval()

    def _tensor(self, a: Int32Array) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)

    def infer(
        self, input_ids: Int32Array, attention_mask: Int32Array, token_type_ids: Int32Array
    ) -> tuple[Float32Array, Float32Array]:
        with torch.inference_mode():
            out = self.model(
                input_ids=self._tensor(input_ids),
                attention_mask=self._tensor(attention_mask),
                token_type_ids=self._tensor(token_type_ids),
            )
        start: Float32Array = out.start_logits.float().cpu().numpy()
        end: Float32Array = out.end_logits.float().cpu().numpy()
        return start, end
