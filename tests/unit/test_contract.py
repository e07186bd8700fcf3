"""config.pbtxt is hand-written; it must say what service/contract.py says."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from service import contract
from service.settings import Settings

CONFIG = Path(__file__).resolve().parents[2] / "model_repository" / "bert_qa" / "config.pbtxt"


def load() -> model_config_pb2.ModelConfig:
    return text_format.Parse(CONFIG.read_text(), model_config_pb2.ModelConfig())


def test_tensors_match_contract() -> None:
    config = load()
    assert config.name == contract.MODEL_NAME
    assert config.max_batch_size == contract.MAX_BATCH_SIZE
    for declared, spec in ((config.input, contract.INPUTS), (config.output, contract.OUTPUTS)):
        got = [(t.name, model_config_pb2.DataType.Name(t.data_type), tuple(t.dims)) for t in declared]
        assert got == [(s.name, s.config_dtype, s.dims) for s in spec]


def test_dynamic_batching_and_python_backend() -> None:
    config = load()
    assert config.backend == "python"
    assert config.HasField("dynamic_batching")
    assert config.dynamic_batching.max_queue_delay_microseconds <= 2000


def test_default_settings_agree_with_contract() -> None:
    s = Settings()
    assert s.model_name == contract.MODEL_NAME
    assert s.port == contract.GATEWAY_PORT
    assert s.triton_url.endswith(f":{contract.TRITON_GRPC_PORT}")
    assert s.triton_http_port == contract.TRITON_HTTP_PORT
    assert s.triton_metrics_port == contract.TRITON_METRICS_PORT
    assert max(s.seq_buckets) >= s.max_seq_len


def test_bucket_for() -> None:
    buckets = (64, 128, 384)
    assert [contract.bucket_for(n, buckets) for n in (1, 64, 65, 200, 384, 500)] == [
        64, 64, 128, 384, 384, 384]
