"""SQuAD v1.1 / v2.0 EM and F1 of a QA checkpoint through any engine.

    python -m training.evaluate --model-dir models/minilm-l6-squad --data dev-v1.1.json
    python -m training.evaluate ... --engine onnx --model-dir build/onnx/minilm-l6-squad

For v2.0 data, ``--no-answer-threshold`` (default: best threshold search reported too)
turns on no-answer predictions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from engine.registry import ENGINES, load_engine
from service.decoding import DecodeSpec
from service.windowing import QATokenizer, WindowSpec
from training.calibrate import calibrate_on
from training.features import predict_with_margins
from training.squad import Score, best_threshold, load_examples, score


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--tokenizer-dir", type=Path, default=None, help="default: --model-dir")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--engine", choices=ENGINES, default="reference")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None,
                   help="engine precision (default: float32 for reference, float16 for fused)")
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--overlap", type=int, default=128)
    p.add_argument("--max-answer-len", type=int, default=30)
    p.add_argument("--no-answer-threshold", type=float, default=None)
    p.add_argument("--search-threshold", action="store_true",
                   help="also report the F1-maximising no-answer threshold (SQuAD v2)")
    p.add_argument("--batch-windows", type=int, default=64)
    p.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fused engine keyword, e.g. small_batch_max_tokens=512 (repeatable)")
    p.add_argument("--limit", type=int, default=0, help="first N questions only")
    p.add_argument("--calibrate-with", type=Path, default=None, metavar="SQUAD_JSON",
                   help="fused FP8: calibrate static FP8 scales on these questions first "
                        "(FusedEngine.calibrating); use data the scores are not taken on")
    p.add_argument("--calibrate-questions", type=int, default=512)
    p.add_argument("--calibrate-margin", type=float, default=None,
                   help="scale = margin * amax / 448 (default: the engine's)")
    p.add_argument("--out", type=Path, default=None, help="write predictions + scores JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Score:
    args = parse_args(argv)
    examples = load_examples(args.data)
    if args.limit:
        examples = examples[: args.limit]
    tok = QATokenizer.from_dir(args.tokenizer_dir or args.model_dir)
    options = {"dtype": args.dtype} if args.dtype else {}
    for item in args.engine_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--engine-option wants KEY=VALUE, got {item!r}")
        options[key] = value
    engine = load_engine(args.engine, args.model_dir, device=args.device, **options)
    spec = WindowSpec(max_seq_len=args.max_seq_len, overlap=args.overlap)
    decode_spec = DecodeSpec(max_answer_len=args.max_answer_len,
                             no_answer_threshold=args.no_answer_threshold)
    if args.calibrate_with is not None:
        try:
            calibrate_on(engine, load_examples(args.calibrate_with)[: args.calibrate_questions],
                         tok, spec, args.calibrate_margin, args.batch_windows)
        except ValueError as exc:
            raise SystemExit(f"--calibrate-with: {exc}") from exc
    started = time.perf_counter()
    full = predict_with_margins(examples, tok, engine.infer, spec, decode_spec, args.batch_windows)
    seconds = time.perf_counter() - started
    preds = {k: text for k, (text, _) in full.items()}
    result = score(examples, preds)
    table = Table(title=f"{args.data.name} via {engine.name}: {args.model_dir}")
    for col in ("questions", "EM", "F1", "has-ans F1", "no-ans F1", "seconds"):
        table.add_column(col)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    table.add_row(str(result.total), fmt(result.exact), fmt(result.f1), fmt(result.has_ans_f1),
                  fmt(result.no_ans_f1), f"{seconds:.1f}")
    Console().print(table)
    if args.search_threshold:
        threshold, tuned = best_threshold(examples, full)
        Console().print(f"best no-answer threshold {threshold:.3f}: EM {tuned.exact:.2f} "
                        f"F1 {tuned.f1:.2f} (has-ans F1 {fmt(tuned.has_ans_f1)}, "
                        f"no-ans F1 {fmt(tuned.no_ans_f1)}); tuned on this data")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(
            {"score": result.__dict__, "seconds": seconds, "predictions": preds}, indent=1))
    return result


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
