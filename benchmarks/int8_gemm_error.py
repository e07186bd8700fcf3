"""Each GEMM's output error under e4m3 and int8 roundings, on the shipped model's own
activations: the CPU half of the INT8 study (``int8_accuracy.py`` is the F1 half).

    python3 benchmarks/int8_gemm_error.py [--calibration-questions 100] [--questions 60]
        [--out errors.json]

The fp32 model runs the windows of the first ``--calibration-questions`` training-subset
questions (each GEMM input's largest magnitudes, per tensor and per channel) and of the
first ``--questions`` dev questions (the inputs measured), one unpadded window a call.
For every GEMM of every layer and each rounding, the error is
``||X_q W_q^T - X W^T|| / ||X W^T||`` (Frobenius, float32, no bias); the table averages it
over the layers per GEMM kind. Roundings (W: weight, X: input; ``int8_accuracy``'s forms):

* ``fp8 default``: e4m3 W with one scale per tensor, e4m3 X on the static scale (margin 4);
  its two halves ``fp8 W only`` and ``fp8 X only``;
* ``fp8 W/ch X/tok``: e4m3 with a scale per output channel and per token;
* ``int8 W only``, ``int8 X/tok only``, ``int8 W/ch X/tok``, ``int8 W/ch X/static``: int8
  with a scale per output channel, and per token or one static scale (margin 1);
* ``int8 smooth a``: the same after SmoothQuant's factors with migration ``a``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def roundings(x: Any, w: Any, x_colmax: Any) -> dict[str, Callable[[], tuple[Any, Any]]]:
    """Each rounding's (X_q, W_q) for input ``x`` [T, K] and weight ``w`` [N, K], where
    ``x_colmax`` [K] is the calibration's largest |x| per input channel."""
    from benchmarks.int8_accuracy import E4M3_MAX, e4m3, input_quantizer, quantize_weight, smoothing

    amax = x_colmax.max()
    x8_static = input_quantizer("e4m3_static", amax)
    i8_rows = input_quantizer("int8_token", amax)  # a scale per row: a token's, a channel's
    w8 = quantize_weight(w, "e4m3_tensor")
    forms: dict[str, Callable[[], tuple[Any, Any]]] = {
        "fp8 default": lambda: (x8_static(x), w8),
        "fp8 W only": lambda: (x, w8),
        "fp8 X only": lambda: (x8_static(x), w),
        "fp8 W/ch X/tok": lambda: (e4m3(x, x.abs().amax(1, keepdim=True) / E4M3_MAX),
                                   e4m3(w, w.abs().amax(1, keepdim=True) / E4M3_MAX)),
        "int8 W only": lambda: (x, i8_rows(w)),
        "int8 X/tok only": lambda: (i8_rows(x), w),
        "int8 W/ch X/tok": lambda: (i8_rows(x), i8_rows(w)),
        "int8 W/ch X/static": lambda: (input_quantizer("int8_static", amax)(x), i8_rows(w)),
    }
    for a in (0.5, 0.75):
        s = smoothing(x_colmax, w, a)
        forms[f"int8 smooth {a} W/ch X/tok"] = lambda s=s: (i8_rows(x / s), i8_rows(w * s))
        forms[f"int8 smooth {a} W/ch X/static"] = lambda s=s: (
            input_quantizer("int8_static", (x_colmax / s).max())(x / s), i8_rows(w * s))
    return forms


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calibration-questions", type=int, default=100)
    p.add_argument("--questions", type=int, default=60)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.bench_gpu import CHECKPOINT, DEV_SET, TRAIN_SET
    from benchmarks.int8_accuracy import GEMMS, calibrate, gemm_modules, run_seeing_inputs, unpadded_windows
    from engine.registry import load_engine
    from service.windowing import QATokenizer, WindowSpec

    tok = QATokenizer.from_dir(CHECKPOINT)
    spec = WindowSpec(max_seq_len=384, overlap=128)
    eng = load_engine("reference", CHECKPOINT, device="cpu", dtype="float32")
    model = eng.model
    stats = calibrate(model, unpadded_windows(TRAIN_SET, args.calibration_questions, tok,
                                              spec), eng.infer)
    inputs: dict[tuple[int, str], list[Any]] = {}
    run_seeing_inputs(model, unpadded_windows(DEV_SET, args.questions, tok, spec), eng.infer,
                      lambda i, g, x: inputs.setdefault((i, g), []).append(x))
    errors: dict[str, dict[str, list[float]]] = {}
    for (i, g), xs in sorted(inputs.items()):
        x = torch.cat(xs)
        w = torch.cat([m.weight.detach() for m in gemm_modules(model)[i][g]])
        y = x @ w.t()
        for name, form in roundings(x, w, stats[i][g].colmax).items():
            xq, wq = form()
            errors.setdefault(name, {}).setdefault(g, []).append(
                float((xq @ wq.t() - y).norm() / y.norm()))
    table = {name: {g: statistics.mean(v) for g, v in per.items()}
             for name, per in errors.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "checkpoint": str(CHECKPOINT),
              "calibration_questions": args.calibration_questions,
              "questions": args.questions, "tokens": int(sum(
                  len(v) for v in inputs[(0, "qkv")])), "relative_error": table,
              "per_layer": errors}
    print(f"{'rounding':30s}" + "".join(f"{g:>10s}" for g in GEMMS))
    for name, per in table.items():
        print(f"{name:30s}" + "".join(f"{100 * per[g]:9.2f}%" for g in GEMMS))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
