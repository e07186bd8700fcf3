"""The CPU engine: ONNX Runtime over a BERT-fused (optionally int8) ONNX export."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.base import Float32Array, Int32Array


class OnnxEngine:
    """One ORT InferenceSession; inputs are cast to what the graph declares."""

    name = "onnx"

    def __init__(self, path: Path, threads: int = 0) -> None:
        import onnxruntime as ort

        if path.is_dir():
            path = path / "model-fused.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )
        types = {"tensor(int32)": np.int32, "tensor(int64)": np.int64}
        self._input_types = {i.name: types[i.type] for i in self.session.get_inputs()}

    def infer(
        self, input_ids: Int32Array, attention_mask: Int32Array, token_type_ids: Int32Array
    ) -> tuple[Float32Array, Float32Array]:
        feeds = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
        }
        feeds = {k: np.ascontiguousarray(v, dtype=self._input_types[k]) for k, v in feeds.items()}
        start, end = self.session.run(["start_logits", "end_logits"], feeds)
        return start.astype(np.float32, copy=False), end.astype(np.float32, copy=False)
