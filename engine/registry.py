"""Engines by name; heavy imports happen only for the engine asked for."""

from __future__ import annotations

from pathlib import Path

from engine.base import QAEngine

ENGINES = ("reference", "onnx", "fused")


def load_engine(name: str, model_dir: Path, device: str = "cpu", **options: str) -> QAEngine:
    """Build the named engine over a checkpoint directory (or its ONNX export)."""
    if name == "reference":
        from engine.reference import ReferenceEngine

        return ReferenceEngine(model_dir, device=device, dtype=options.get("dtype", "float32"))
    if name == "onnx":
        from engine.onnx_cpu import OnnxEngine

        return OnnxEngine(model_dir, threads=int(options.get("threads", "0")))
    if name == "fused":
        from engine.fused.engine import FusedEngine

        return FusedEngine.from_pretrained(
            model_dir, device=device, dtype=options.get("dtype", "float16")
        )
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
