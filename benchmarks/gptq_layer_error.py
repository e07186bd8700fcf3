"""Each calibrated GEMM's weight-rounding error, nearest against GPTQ (``engine.fused.gptq``).

    python3 benchmarks/gptq_layer_error.py [--questions 128] [--device cpu] [--out err.json]

The shipped checkpoint is calibrated twice with Gram matrices (``calibrating(gptq=True)``):
on the first ``--questions`` training-subset questions (what GPTQ rounds against; the
engine's calibrated weights are then GPTQ's) and on as many dev questions (held out).
For every layer and GEMM it prints the output error
``||X (W - Wq s)^T||^2`` of GPTQ's rounding as a share of nearest rounding's, on the
training inputs and on the held-out ones: how much of the weight's rounding error GPTQ
takes out of the GEMM's output, before any activation is rounded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from rich.console import Console
    from rich.table import Table

    from benchmarks.bench_gpu import CHECKPOINT, DEV_SET, TRAIN_SET
    from engine.fused.calibration import GEMMS
    from engine.fused.engine import FusedEngine
    from engine.fused.fp8 import quantize_tiles
    from engine.fused.gptq import output_error
    from service.windowing import QATokenizer, WindowSpec
    from training.calibrate import calibrate_on
    from training.squad import load_examples

    tok = QATokenizer.from_dir(CHECKPOINT)
    spec = WindowSpec(max_seq_len=384, overlap=128)

    def calibrated(path: Path) -> Any:
        eng = FusedEngine.from_pretrained(CHECKPOINT, device=args.device, dtype="fp8")
        calibrate_on(eng, load_examples(path)[:args.questions], tok, spec, gptq=True)
        return eng

    fit = calibrated(TRAIN_SET)
    held = calibrated(DEV_SET).calibration.grams
    grams = fit.calibration.grams
    rows = []
    table = Table(title=f"GPTQ / nearest output error of the e4m3 weights, {CHECKPOINT.name}, "
                        f"{args.questions} questions each")
    for col in ("layer", "GEMM", "training inputs", "held-out inputs"):
        table.add_column(col)
    for i, (ly, cal) in enumerate(zip(fit.weights.layers, fit.weights.calibrated, strict=True)):
        for gemm in GEMMS:
            w = getattr(ly, gemm).weight.float()
            nearest, scale = quantize_tiles(w, w.shape[0], w.shape[1])
            ours = getattr(cal, gemm).w8  # the engine's own GPTQ rounding
            if not bool((getattr(cal, gemm).w_scale.reshape(()) == scale.reshape(())).all()):
                raise RuntimeError(f"layer {i} {gemm}: the engine's scale is not nearest's")
            ratio = {name: output_error(w, ours, scale, h[gemm][i])
                     / output_error(w, nearest, scale, h[gemm][i])
                     for name, h in (("train", grams), ("held_out", held))}
            rows.append({"layer": i, "gemm": gemm, **ratio})
            table.add_row(str(i), gemm, f"{ratio['train']:.3f}", f"{ratio['held_out']:.3f}")
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                        "checkpoint": CHECKPOINT.name,
                                        "questions": args.questions, "device": args.device,
                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
