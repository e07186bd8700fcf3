"""Which engine Triton's model builds, and how one engine call serves several requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.batching import run_batched
from engine.config import REPO_ROOT, EngineConfig
from engine.onnx_cpu import OnnxEngine


def test_defaults_params_then_env_override() -> None:
    assert EngineConfig.resolve({}, env={}) == EngineConfig()
    cfg = EngineConfig.resolve({"engine": "fused", "device": "cuda"}, env={})
    assert (cfg.engine, cfg.device) == ("fused", "cuda")
    cfg = EngineConfig.resolve(
        {"engine": "fused", "device": "cuda"},
        env={"BERT_QA_ENGINE": "onnx", "BERT_QA_THREADS": "3", "BERT_QA_ONNX": "x/m.onnx",
             "BERT_QA_MODEL_DIR": "/abs/model"},
    )
    assert cfg.engine == "onnx" and cfg.device == "cuda" and cfg.threads == 3
    assert cfg.onnx == REPO_ROOT / "x" / "m.onnx"  # relative paths resolve against the repo
    assert cfg.model_dir == Path("/abs/model")


def test_config_pbtxt_defaults_name_real_fields() -> None:
    text = (REPO_ROOT / "model_repository" / "bert_qa" / "config.pbtxt").read_text()
    keys = [line.split('"')[1] for line in text.splitlines() if line.startswith("parameters")]
    assert keys and set(keys) <= set(EngineConfig.__dataclass_fields__)


def request(n: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(n, seq), dtype=np.int32)
    ids[:, 0] = 101  # [CLS]
    types = np.zeros_like(ids)
    types[:, seq // 2 :] = 1
    return ids, np.ones_like(ids), types


def test_run_batched_matches_one_call_per_request() -> None:
    onnx = REPO_ROOT / "build" / "onnx" / "minilm-l6-squad" / "model-fused.onnx"
    if not onnx.exists():
        pytest.skip(f"{onnx} missing: run `make model` (make test builds it)")
    engine = OnnxEngine(onnx, threads=2)
    reqs = [request(2, 24, 0), request(1, 40, 1), request(3, 24, 2), request(1, 40, 3)]
    outs = run_batched(engine, reqs)
    assert len(outs) == len(reqs)
    for (ids, mask, types), (start, end) in zip(reqs, outs, strict=True):
        alone_start, alone_end = engine.infer(ids, mask, types)
        np.testing.assert_allclose(start, alone_start, atol=1e-3)
        np.testing.assert_allclose(end, alone_end, atol=1e-3)


def test_fused_engine_options_through_the_registry() -> None:
    """``load_engine`` (and ``training.evaluate --engine-option``) turn text into the
    FusedEngine keywords: none/true/false/integers, anything else stays text."""
    pytest.importorskip("torch")
    from engine.registry import _option_value, load_engine

    assert [_option_value(v) for v in ("none", "True", "false", "512", "fp16")] == [
        None, True, False, 512, "fp16"]
    engine = load_engine("fused", REPO_ROOT / "models" / "minilm-l6-squad", device="cpu",
                         dtype="float32", small_batch_max_tokens="none", persistent="true")
    opts = engine.options  # type: ignore[attr-defined]
    assert opts.small_batch_max_tokens is None and opts.persistent is True
    with pytest.raises(TypeError):
        load_engine("fused", REPO_ROOT / "models" / "minilm-l6-squad", device="cpu", no_such="1")


def test_calibration_needs_a_row_scaled_fp8_engine() -> None:
    """``FusedEngine.calibrating`` refuses engines it cannot calibrate, before any pass,
    and leaves them as they were."""
    pytest.importorskip("torch")
    from engine.fused.engine import FusedEngine

    model = REPO_ROOT / "models" / "minilm-l6-squad"
    engine = FusedEngine.from_pretrained(model, device="cpu", dtype="float32", backend="torch")
    with pytest.raises(ValueError, match="row-wise scales"), engine.calibrating():
        pass
    assert engine.weights.calibrated is None and engine._recorder is None
