"""SQuAD v1.1 dev F1 of the calibrated-FFN FP8 engine by calibration margin and by FFN1
implementation (cuBLASLt's fused GEMM, or the same scheme as dequantized torch math on
the GPU), next to the row-scaled FP8 engine, on the shipped checkpoint.

    python3 benchmarks/calibration_f1.py --out f1.json [--margins 1,2,4]

Calibration: the first 512 questions of the training subset (not the scored dev set).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--margins", default="2")
    p.add_argument("--spec", action="store_true", help="also run FFN1 as torch math")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_gpu import CHECKPOINT, DEV_SET, TRAIN_SET
    from engine.fused import fp8
    from training.evaluate import main as evaluate

    base = ["--model-dir", str(CHECKPOINT), "--data", str(DEV_SET), "--device", "cuda",
            "--engine", "fused", "--dtype", "fp8"]
    runs: list[tuple[str, list[str], bool]] = [("rows", [], True)]
    for m in args.margins.split(","):
        cal = ["--calibrate-with", str(TRAIN_SET), "--calibrate-margin", m]
        runs.append((f"calibrated_margin_{m}", cal, True))
        if args.spec:
            runs.append((f"calibrated_margin_{m}_torch_math", cal, False))
    result: dict[str, Any] = {}
    for label, extra, lt in runs:
        fp8.CALIBRATED_FFN1_CUBLASLT = lt
        score = evaluate(base + extra)
        result[label] = {"exact": score.exact, "f1": score.f1}
        print(f"{label}: EM {score.exact:.2f} F1 {score.f1:.2f}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
