"""Which engine the Triton model runs, from config.pbtxt parameters and env overrides.

Env vars (override config.pbtxt ``parameters`` of the same lower-case key without prefix):
``BERT_QA_ENGINE`` (onnx | fused | reference), ``BERT_QA_MODEL_DIR`` (checkpoint dir),
``BERT_QA_ONNX`` (ONNX file for the onnx engine), ``BERT_QA_DEVICE`` (cpu | cuda),
``BERT_QA_THREADS`` (ORT intra-op threads, 0 = ORT's default), ``BERT_QA_DTYPE``,
``BERT_QA_FP8_CALIBRATION`` (the fused engine's static FP8 scales: a JSON file from
``python -m training.calibrate``; with ``dtype=fp8`` only), ``BERT_QA_FP8_STATIC_INPUTS``
(which GEMMs' inputs take those static scales, comma-separated from ``qkv``, ``attn_out``,
``ffn_in``, ``ffn_out``, or ``none``; unset: the engine's default, all but ``attn_out``;
with ``BERT_QA_FP8_CALIBRATION`` only), ``BERT_QA_INT8_GEMMS`` (which GEMMs run in int8
with SmoothQuant smoothing, comma-separated from ``attn_out``, ``ffn_in``; ``auto``, the
engine's default when unset: both wherever the calibration recorded their inputs'
per-channel magnitudes and they can run, on a Hopper GPU or the CPU, else none with no
error; ``none``: none. Named GEMMs need ``BERT_QA_FP8_CALIBRATION``, a calibration that
recorded those magnitudes, and a Hopper GPU or the CPU).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from engine.base import QAEngine
from engine.registry import load_engine

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "BERT_QA_"


@dataclass(frozen=True)
class EngineConfig:
    engine: str = "onnx"
    model_dir: Path = REPO_ROOT / "models" / "minilm-l6-squad"
    onnx: Path = REPO_ROOT / "build" / "onnx" / "minilm-l6-squad" / "model-fused.onnx"
    device: str = "cpu"
    threads: int = 0
    dtype: str = "float16"
    fp8_calibration: Path | None = None
    fp8_static_inputs: str | None = None
    int8_gemms: str | None = None

    @classmethod
    def resolve(
        cls, parameters: Mapping[str, str], env: Mapping[str, str] | None = None
    ) -> EngineConfig:
        """Defaults, overridden by config.pbtxt parameters, overridden by env vars."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper()) or parameters.get(f.name)
            if raw:
                values[f.name] = _convert(f.name, raw)
        return cls(**values)  # type: ignore[arg-type]

    def build(self) -> QAEngine:
        # int8_gemms "" (``none``) and ``auto`` (the fused engine's default, which needs
        # nothing) ask for nothing, so they suit any engine
        asked = {"fp8_calibration": self.fp8_calibration is not None,
                 "fp8_static_inputs": self.fp8_static_inputs is not None,
                 "int8_gemms": (self.int8_gemms or "auto").strip().lower() != "auto"}
        for name in ("fp8_calibration", "fp8_static_inputs", "int8_gemms"):
            if asked[name] and self.engine != "fused":
                raise ValueError(f"{name} applies to the fused engine only "
                                 f"(BERT_QA_ENGINE is {self.engine!r})")
        for name in ("fp8_static_inputs", "int8_gemms"):
            if asked[name] and self.fp8_calibration is None:
                raise ValueError(f"{name} runs on calibrated scales: "
                                 "set fp8_calibration (BERT_QA_FP8_CALIBRATION) too")
        if self.engine == "onnx":
            return load_engine("onnx", self.onnx, threads=str(self.threads))
        options = {"dtype": self.dtype}
        if self.fp8_calibration is not None:
            options["fp8_calibration"] = str(self.fp8_calibration)
        if self.engine == "fused":  # (other engines: refused above, or "" / "auto")
            for name in ("fp8_static_inputs", "int8_gemms"):  # unset: the engine's default
                if (value := getattr(self, name)) is not None:
                    options[name] = value
        return load_engine(self.engine, self.model_dir, device=self.device, **options)


def _convert(name: str, raw: str) -> object:
    if name in ("model_dir", "onnx", "fp8_calibration"):
        path = Path(raw)
        return path if path.is_absolute() else REPO_ROOT / path
    if name == "threads":
        return int(raw)
    if name == "fp8_static_inputs" and raw.strip().lower() == "none":
        return ""  # no input static: every GEMM keeps scales per token
    if name == "int8_gemms" and raw.strip().lower() == "none":
        return ""  # no int8 GEMM, whatever the calibration (the engine's default is auto)
    return raw
