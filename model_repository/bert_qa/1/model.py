"""Triton python backend for ``bert_qa``: a thin adapter over an engine from engine/."""

from __future__ import annotations

import json
from typing import Any

import triton_python_backend_utils as pb_utils

from engine.batching import RequestLimits, run_batched
from engine.config import EngineConfig

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def error_response(message: str, code: Any) -> Any:
    # A new TritonError per response: the backend frees it with its response, so one error
    # shared by the responses of a batch crashed tritonserver (SIGSEGV).
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.engine_config = EngineConfig.resolve(params)
        self.engine = self.engine_config.build()
        self.limits = RequestLimits.of_checkpoint(self.engine_config.model_dir)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        valid: list[int] = []
        arrays = []
        for i, r in enumerate(requests):
            tensors = tuple(pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS)
            problem = self.limits.problem(tensors)
            if problem is None:  # a client's mistake is its own 400, never its batch's failure
                valid.append(i)
                arrays.append(tensors)
            else:
                responses[i] = error_response(problem, pb_utils.TritonError.INVALID_ARG)
        if not valid:
            return responses
        try:
            outputs = run_batched(self.engine, arrays)
        except Exception as exc:  # one failed batch fails its requests, not the server
            for i in valid:
                responses[i] = error_response(f"engine failure: {exc}", pb_utils.TritonError.INTERNAL)
            return responses
        for i, (start, end) in zip(valid, outputs, strict=True):
            responses[i] = pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("start_logits", start),
                    pb_utils.Tensor("end_logits", end),
                ]
            )
        return responses
