"""Export a BERT-family QA checkpoint to ONNX for the CPU engine.

Steps: torch.onnx export (fp32, dynamic [windows, seq]) -> ONNX Runtime's BERT graph
fusion (attention, embed+layernorm, skip-layernorm, bias-gelu) -> optional dynamic int8
quantisation of the MatMul weights. Writes ``model-fp32.onnx``, ``model-fused.onnx`` and
``model-int8.onnx`` plus ``export.json`` (fused-op counts, sizes, parity vs torch).

    python -m training.export_onnx --model-dir models/minilm-l6-squad --out build/onnx/minilm-l6-squad
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT_NAMES = ["start_logits", "end_logits"]
OPSET = 17


def export_fp32(model_dir: Path, path: Path) -> None:
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    ).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.start_logits, out.end_logits

    dummy = tuple(torch.ones(2, 16, dtype=torch.int32) for _ in INPUT_NAMES)
    axes = {name: {0: "windows", 1: "seq"} for name in INPUT_NAMES + OUTPUT_NAMES}
    with torch.inference_mode():
        torch.onnx.export(
            Wrapped(), dummy, str(path), input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
            dynamic_axes=axes, opset_version=OPSET, dynamo=False,
        )


def fuse(src: Path, dst: Path, num_heads: int, hidden: int) -> dict[str, int]:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden, opt_level=1
    )
    optimized.save_model_to_file(str(dst))
    counts: dict[str, int] = optimized.get_fused_operator_statistics()
    return {k: int(v) for k, v in counts.items() if v}


def quantize(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Fused contrib ops (Attention, SkipLayerNormalization) defeat shape inference;
    # every tensor here is float32.
    quantize_dynamic(
        str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"], per_channel=True,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def parity(model_dir: Path, onnx_paths: list[Path], seed: int = 0) -> dict[str, float]:
    """Max |logit difference| of each ONNX file vs the torch fp32 reference, random inputs."""
    from engine.onnx_cpu import OnnxEngine
    from engine.reference import ReferenceEngine

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(4, 160), dtype=np.int32)
    mask = np.ones_like(ids)
    mask[2:, 120:] = 0
    types = np.zeros_like(ids)
    types[:, 30:] = 1
    ref = ReferenceEngine(model_dir).infer(ids, mask, types)
    out = {}
    for path in onnx_paths:
        got = OnnxEngine(path).infer(ids, mask, types)
        valid = mask.astype(bool)
        out[path.name] = float(max(np.abs(g - r)[valid].max() for g, r in zip(got, ref, strict=True)))
    return out


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--no-int8", action="store_true")
    args = p.parse_args(argv)
    config = json.loads((args.model_dir / "config.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    fp32, fused, int8 = (args.out / f"model-{n}.onnx" for n in ("fp32", "fused", "int8"))
    started = time.perf_counter()
    export_fp32(args.model_dir, fp32)
    ops = fuse(fp32, fused, config["num_attention_heads"], config["hidden_size"])
    files = [fp32, fused]
    if not args.no_int8:
        quantize(fused, int8)
        files.append(int8)
    report: dict[str, object] = {
        "model_dir": str(args.model_dir),
        "fused_ops": ops,
        "max_abs_logit_diff": parity(args.model_dir, files),
        "bytes": {f.name: f.stat().st_size for f in files},
        "seconds": time.perf_counter() - started,
    }
    (args.out / "export.json").write_text(json.dumps(report, indent=2))
    table = Table(title=f"ONNX export -> {args.out}")
    for col in ("file", "MB", "max |logit diff| vs torch"):
        table.add_column(col)
    for f in files:
        table.add_row(f.name, f"{f.stat().st_size / 1e6:.1f}",
                      f"{report['max_abs_logit_diff'][f.name]:.4f}")  # type: ignore[index]
    Console().print(table)
    Console().print(f"fused operators: {ops}")
    return report


if __name__ == "__main__":
    main()
