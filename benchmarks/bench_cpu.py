"""CPU engine latency on this machine: torch eager vs ONNX Runtime fused fp32 vs int8.

Real SQuAD windows (question + context from dev v1.1) padded to the gateway's buckets,
batch 1 and 8, median and p99 over many runs after warm-up. Appends to RESULTS.md.

    python -m benchmarks.bench_cpu [--runs 200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from engine.onnx_cpu import OnnxEngine
from engine.reference import ReferenceEngine
from service.backend import pad_to_bucket
from service.settings import Settings
from service.windowing import QATokenizer, Windows, WindowSpec
from training.squad import load_examples

REPO = Path(__file__).resolve().parent.parent
ONNX_DIR = REPO / "build" / "onnx" / "minilm-l6-squad"


def sample_windows(n: int, batch: int, seed: int = 0) -> list[Windows]:
    s = Settings()
    tok = QATokenizer.from_dir(s.model_dir)
    spec = WindowSpec(s.max_seq_len, s.window_overlap, s.max_question_tokens)
    examples = load_examples(REPO / "data" / "dev-v1.1.json.xz")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        picked = [examples[i] for i in rng.choice(len(examples), batch, replace=False)]
        rows = [tok.windows([tok.encode(e.question)], tok.encode(e.context), spec) for e in picked]
        seq = max(r.seq_len for r in rows)
        padded = [pad_to_bucket(r.padded_to(seq, tok.pad_id), s.seq_buckets, tok.pad_id)
                  for r in rows]
        out.append(Windows(*(np.concatenate([getattr(p, f) for p in padded])
                             for f in ("input_ids", "attention_mask", "token_type_ids",
                                       "offsets", "question_index", "lengths"))))
    return out


def time_engine(engine: object, inputs: list[Windows], runs: int) -> tuple[float, float]:
    infer = engine.infer  # type: ignore[attr-defined]
    for w in inputs[:5]:
        infer(w.input_ids, w.attention_mask, w.token_type_ids)
    times = []
    for i in range(runs):
        w = inputs[i % len(inputs)]
        t0 = time.perf_counter()
        infer(w.input_ids, w.attention_mask, w.token_type_ids)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3), float(np.percentile(times, 99) * 1e3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    engines = {
        "torch eager fp32": ReferenceEngine(Settings().model_dir),
        "ORT fused fp32": OnnxEngine(ONNX_DIR / "model-fused.onnx", args.threads),
        "ORT fused int8": OnnxEngine(ONNX_DIR / "model-int8.onnx", args.threads),
    }
    rows = []
    for batch in (1, 8):
        inputs = sample_windows(32, batch)
        mean_len = float(np.mean([w.lengths.mean() for w in inputs]))
        for name, engine in engines.items():
            median, p99 = time_engine(engine, inputs, args.runs if batch == 1 else args.runs // 4)
            rows.append((name, batch, mean_len, median, p99))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    machine = f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores"
    title = f"CPU engines, {dt.date.today()}, {machine}, commit {commit}"
    table = Table(title=title)
    for col in ("engine", "batch", "mean real tokens", "median ms", "p99 ms"):
        table.add_column(col)
    lines = [f"\n### {title}\n", "| engine | batch | mean real tokens | median ms | p99 ms |",
             "|---|---|---|---|---|"]
    for name, batch, mean_len, median, p99 in rows:
        table.add_row(name, str(batch), f"{mean_len:.0f}", f"{median:.2f}", f"{p99:.2f}")
        lines.append(f"| {name} | {batch} | {mean_len:.0f} | {median:.2f} | {p99:.2f} |")
    Console().print(table)
    with (REPO / "benchmarks" / "RESULTS.md").open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
