"""Static FP8 scales for the fused engine, calibrated on SQuAD questions and saved as JSON.

    python -m training.calibrate --model-dir models/minilm-l6-squad \\
        --data data/train-subset-v1.1.json.xz --out build/fp8-calibration/minilm-l6-squad.json

Runs the first ``--questions`` questions' windows un-quantized through the fused engine
and records the largest |input| of every FP8 GEMM per layer
(``engine.fused.calibration``). Serve with them: ``BERT_QA_DTYPE=fp8
BERT_QA_FP8_CALIBRATION=<file>`` (``engine/config.py``), or
``FusedEngine(..., fp8_calibration=<file>)``. Calibrate on data the engine is not scored
on (the training subset, not the dev set). Accuracy cost measured on the H200:
``engine/fused/NOTES.md`` (v10).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from service.decoding import DecodeSpec
from service.windowing import QATokenizer, WindowSpec
from training.features import predict_with_margins
from training.squad import Example, load_examples

if TYPE_CHECKING:
    from engine.fused.calibration import Calibration


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True, help="SQuAD JSON (.json or .json.xz)")
    p.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    p.add_argument("--questions", type=int, default=512)
    p.add_argument("--margin", type=float, default=None,
                   help="scale = margin x amax / 448, room for larger activations "
                        "(default: engine.fused.calibration.CALIBRATION_MARGIN, 4)")
    p.add_argument("--device", default=None,
                   help="cuda or cpu (default: cuda where there is one; either gives the same "
                        "scales to rounding: calibration passes are un-quantized)")
    p.add_argument("--batch-windows", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--overlap", type=int, default=128)
    args = p.parse_args(argv)
    if args.questions < 1:
        p.error("--questions must be at least 1")
    if args.margin is not None and not args.margin > 0:
        p.error("--margin must be positive")
    return args


def calibrate_on(engine: Any, examples: Sequence[Example], tok: QATokenizer,
                 spec: WindowSpec, margin: float | None = None, batch_windows: int = 64,
                 gptq: bool = False) -> None:
    """Calibrate ``engine`` (anything with ``calibrating()``, i.e. the fused engine) on
    the windows of ``examples``, cut and batched as evaluation cuts them."""
    calibrating = getattr(engine, "calibrating", None)
    if calibrating is None:
        raise ValueError(f"the {engine.name} engine has no FP8 calibration")
    with calibrating(*(() if margin is None else (margin,)), gptq=gptq):
        predict_with_margins(examples, tok, engine.infer, spec, DecodeSpec(), batch_windows)


def main(argv: list[str] | None = None) -> Calibration:
    args = parse_args(argv)
    from engine.fused.calibration import GEMMS
    from engine.fused.engine import FusedEngine

    examples = load_examples(args.data)[: args.questions]
    tok = QATokenizer.from_dir(args.model_dir)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = FusedEngine.from_pretrained(args.model_dir, device=device, dtype="fp8")
    calibrate_on(engine, examples, tok,
                 WindowSpec(max_seq_len=args.max_seq_len, overlap=args.overlap), args.margin,
                 args.batch_windows)
    engine.save_calibration(args.out)
    cal = engine.calibration
    assert cal is not None
    table = Table(title=f"FP8 calibration of {args.model_dir} on {len(examples)} questions "
                        f"(passes: {cal.passes}, margin {cal.margin:g}): largest |input|")
    table.add_column("layer")
    for gemm in GEMMS:
        table.add_column(gemm)
    for i in range(cal.layers):
        table.add_row(str(i), *(f"{cal.amax[g][i]:.3g}" for g in GEMMS))
    Console().print(table)
    Console().print(f"wrote {args.out}")
    return cal


if __name__ == "__main__":
    main()
