"""Triton python backend for ``bert_qa``: a thin adapter over an engine from engine/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from engine.batching import run_batched
from engine.config import EngineConfig

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def checkpoint_limits(model_dir: Path) -> tuple[int, int, int]:
    """(vocab size, token types, max sequence length) of the checkpoint the engine serves."""
    config = json.loads((model_dir / "config.json").read_text())
    return config["vocab_size"], config["type_vocab_size"], config["max_position_embeddings"]


def input_problem(
    tensors: tuple[np.ndarray, ...], vocab_size: int, type_vocab_size: int, max_len: int
) -> str | None:
    """What is wrong with one request's tensors (None: nothing), before any engine sees them.

    Triton checks names, dtypes, ranks and the batch size against config.pbtxt; values, the
    three shapes agreeing and the length are ours. An engine fed bad values fails (or answers
    garbage) for every request batched with the bad one, so each request is checked alone.
    """
    ids, mask, type_ids = tensors
    if not ids.shape == mask.shape == type_ids.shape:
        return ("input_ids, attention_mask and token_type_ids must have one shape [batch, seq]; "
                f"got {list(ids.shape)}, {list(mask.shape)}, {list(type_ids.shape)}")
    if ids.shape[0] == 0:
        return "empty batch: send at least one window"
    if not 1 <= ids.shape[1] <= max_len:
        return f"sequence length {ids.shape[1]} is outside [1, {max_len}] (the model's positions)"
    for name, array, high in (("input_ids", ids, vocab_size), ("attention_mask", mask, 2),
                              ("token_type_ids", type_ids, type_vocab_size)):
        if array.min() < 0 or array.max() >= high:
            at = tuple(int(i) for i in np.argwhere((array < 0) | (array >= high))[0])
            return f"{name} values must be in [0, {high}); got {int(array[at])} at {list(at)}"
    attends = mask.any(axis=1)
    if not attends.all():
        return f"attention_mask row {int(np.argmin(attends))} is all 0: no token to attend to"
    return None


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
        self.limits = checkpoint_limits(self.engine_config.model_dir)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        valid: list[int] = []
        arrays = []
        for i, r in enumerate(requests):
            tensors = tuple(pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS)
            problem = input_problem(tensors, *self.limits)
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
