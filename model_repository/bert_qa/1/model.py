"""Triton python backend for ``bert_qa``: a thin adapter over an engine from engine/.

A request is answered without running the engine when its client has gone (the gateway
cancels its gRPC call when its own client disconnects, and a gRPC deadline that passes
cancels it too; checked only for batches that queued behind a busy engine, see
``engine.batching.Backlog``) or when its tensors are invalid. Triton counts such error
responses as successes, so ``qa_model_skipped_requests_total{reason}`` on Triton's metrics
port counts them.
"""

from __future__ import annotations

import json
import time
from typing import Any

import triton_python_backend_utils as pb_utils

from engine.batching import Backlog, RequestLimits, run_batched
from engine.config import EngineConfig

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SKIPPED = "qa_model_skipped_requests_total"


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
        self.backlog = Backlog()
        # kept on self: a family that is garbage-collected leaves Triton's metrics
        self.skipped_family = family = pb_utils.MetricFamily(
            name=SKIPPED, kind=pb_utils.MetricFamily.COUNTER,
            description="Requests answered without running the engine, by reason",
        )
        self.skipped = {reason: family.Metric(labels={"model": args["model_name"], "reason": reason})
                        for reason in ("cancelled", "invalid")}

    def execute(self, requests: list[Any]) -> list[Any]:
        try:
            return self._answer(requests, self.backlog.queued_behind_work(time.monotonic()))
        finally:
            self.backlog.ended(time.monotonic())

    def _answer(self, requests: list[Any], check_cancelled: bool) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        valid: list[int] = []
        arrays = []
        for i, r in enumerate(requests):
            if check_cancelled and r.is_cancelled():  # Triton's queue hands them over too
                responses[i] = error_response("request cancelled", pb_utils.TritonError.CANCELLED)
                self.skipped["cancelled"].increment(1)
                continue
            tensors = tuple(pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS)
            problem = self.limits.problem(tensors)
            if problem is None:  # a client's mistake is its own 400, never its batch's failure
                valid.append(i)
                arrays.append(tensors)
            else:
                responses[i] = error_response(problem, pb_utils.TritonError.INVALID_ARG)
                self.skipped["invalid"].increment(1)
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
