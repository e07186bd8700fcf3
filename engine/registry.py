"""Engines by name; heavy imports happen only for the engine asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.base import QAEngine

ENGINES = ("reference", "onnx", "fused")


def _option_value(text: str) -> object:
    """``none`` -> None, ``true``/``false`` -> bool, integers -> int, else the text."""
    low = text.lower()
    if low == "none":
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def load_engine(name: str, model_dir: Path, device: str = "cpu", **options: str) -> QAEngine:
    """Build the named engine over a checkpoint directory (or its ONNX export).

    ``dtype`` (and ``threads`` for onnx) are read here; for ``fused`` every other option is
    a ``FusedEngine`` keyword (e.g. ``small_batch_max_tokens="512"``, ``persistent="true"``).
    """
    if name == "reference":
        from engine.reference import ReferenceEngine

        return ReferenceEngine(model_dir, device=device, dtype=options.get("dtype", "float32"))
    if name == "onnx":
        from engine.onnx_cpu import OnnxEngine

        return OnnxEngine(model_dir, threads=int(options.get("threads", "0")))
    if name == "fused":
        from engine.fused.engine import FusedEngine

        extra: dict[str, Any] = {k: _option_value(v) for k, v in options.items() if k != "dtype"}
        return FusedEngine.from_pretrained(
            model_dir, device=device, dtype=options.get("dtype", "float16"), **extra
        )
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
