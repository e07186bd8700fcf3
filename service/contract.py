"""The tensor contract between the gateway and Triton's ``bert_qa`` model.

config.pbtxt is written by hand; tests/integration checks it against this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    triton_dtype: str  # as tritonclient names it
    config_dtype: str  # as config.pbtxt names it
    dims: tuple[int, ...]  # per request item, without the batch dimension


INPUTS = (
    TensorSpec("input_ids", "INT32", "TYPE_INT32", (-1,)),
    TensorSpec("attention_mask", "INT32", "TYPE_INT32", (-1,)),
    TensorSpec("token_type_ids", "INT32", "TYPE_INT32", (-1,)),
)
OUTPUTS = (
    TensorSpec("start_logits", "FP32", "TYPE_FP32", (-1,)),
    TensorSpec("end_logits", "FP32", "TYPE_FP32", (-1,)),
)
MODEL_NAME = "bert_qa"
MAX_BATCH_SIZE = 64  # windows per Triton request and per dynamic batch

TRITON_HTTP_PORT = 8000
TRITON_GRPC_PORT = 8001
TRITON_METRICS_PORT = 8002
GATEWAY_PORT = 8080


def bucket_for(length: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``length`` tokens (the largest if none does)."""
    for b in sorted(buckets):
        if length <= b:
            return b
    return max(buckets)
