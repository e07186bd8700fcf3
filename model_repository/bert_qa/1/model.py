"""Triton python backend for ``bert_qa``: a thin adapter over an engine from engine/."""

from __future__ import annotations

import json
from typing import Any

import triton_python_backend_utils as pb_utils

from engine.batching import run_batched
from engine.config import EngineConfig

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.engine_config = EngineConfig.resolve(params)
        self.engine = self.engine_config.build()

    def execute(self, requests: list[Any]) -> list[Any]:
        arrays = [
            tuple(pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS)
            for r in requests
        ]
        try:
            outputs = run_batched(self.engine, arrays)
        except Exception as exc:  # one failed batch fails its requests, not the server
            error = pb_utils.TritonError(f"engine failure: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("start_logits", start),
                    pb_utils.Tensor("end_logits", end),
                ]
            )
            for start, end in outputs
        ]
