"""The FP8 schemes' speed against their accuracy, from recorded results (no GPU needed).

    python3 benchmarks/plot_fp8_tradeoff.py [--mix benchmarks/gpu-2026-11-30-v11-mix.json]
        [--accuracy benchmarks/gpu-2026-11-30-v11-accuracy-static-inputs.json]
        [--out benchmarks/fp8-tradeoff-2026-11-30.png]

Left: BERT-large SQuAD-mix windows/s per call (``bench_gpu.py --sections mix``) against the
mean |logit - fp32| of the shipped MiniLM (``fp8_accuracy.py``, mean over its weight
roundings, bars from the least to the most); the 8,000/s target as a line. Right: the F1
loss of each scheme over the roundings, against the 0.1 budget. The accuracy runs
measure the scheme on MiniLM, the speed runs on BERT-large with random weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]
TARGET_PER_S, F1_BUDGET = 8000.0, 0.1
# label, mix column of bench_gpu, scheme of fp8_accuracy
SCHEMES = [
    ("FP8 row scales", "ours_fp8_packed", "rows"),
    ("calibrated (default)", "ours_fp8_calibrated_packed", "static:qkv+ffn_in+ffn_out"),
    ("all static", "ours_fp8_static_all_packed", "calibrated"),
]


def points(mix: dict[str, Any], accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scheme: windows/s, the logit errors and the F1 losses over the roundings."""
    row = mix["mix"][0]
    ref = accuracy["reference"]["f1"]
    out = []
    for label, column, scheme in SCHEMES:
        runs = [r for r in accuracy["runs"] if r["scheme"] == scheme]
        if column not in row or not runs:
            continue
        out.append({"label": label, "per_s": row[column]["windows_per_s"],
                    "errors": [r["mean_abs"] for r in runs],
                    "losses": [ref - r["f1"] for r in runs]})
    return out


def plot(pts: list[dict[str, Any]], title: str) -> Figure:
    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    speed, f1 = fig.subplots(1, 2)
    for i, p in enumerate(pts):
        colour = f"C{i}"
        err = statistics.mean(p["errors"])
        speed.errorbar([p["per_s"]], [err], yerr=[[err - min(p["errors"])],
                                                  [max(p["errors"]) - err]],
                       fmt="o", color=colour, capsize=4, label=p["label"])
        loss = statistics.mean(p["losses"])
        f1.errorbar([i], [loss], yerr=[[loss - min(p["losses"])], [max(p["losses"]) - loss]],
                    fmt="o", color=colour, capsize=4)
    speed.axvline(TARGET_PER_S, color="#d62728", linestyle="--", label="target 8,000/s")
    speed.set_xlabel("BERT-large SQuAD mix, windows/s per call (H200)")
    speed.set_ylabel("mean |logit - fp32|, MiniLM")
    speed.legend(fontsize=8, loc="upper left")
    f1.axhline(F1_BUDGET, color="#d62728", linestyle="--", label="budget 0.1")
    f1.axhline(0.0, color="#7f7f7f", linewidth=0.8)
    f1.set_xticks(range(len(pts)), [p["label"] for p in pts], fontsize=8)
    f1.set_xlim(-0.5, len(pts) - 0.5)
    f1.set_ylabel("F1 loss vs fp32 (SQuAD v1.1 dev)")
    f1.legend(fontsize=8)
    for ax in (speed, f1):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=11)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mix", type=Path, default=REPO / "benchmarks" / "gpu-2026-11-30-v11-mix.json")
    p.add_argument("--accuracy", type=Path,
                   default=REPO / "benchmarks" / "gpu-2026-11-30-v11-accuracy-static-inputs.json")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "fp8-tradeoff-2026-11-30.png")
    args = p.parse_args()
    import sys

    sys.path.insert(0, str(REPO))
    from benchmarks.figures import save_figure

    mix, accuracy = json.loads(args.mix.read_text()), json.loads(args.accuracy.read_text())
    pts = points(mix, accuracy)
    env = mix.get("env", {})
    fig = plot(pts, f"FP8 schemes: speed and accuracy ({env.get('gpu', '?')}, "
                    f"{env.get('date', '?')}, commit {env.get('commit', '?')})")
    save_figure(fig, args.out)
    for pt in pts:
        print(f"  {pt['label']:22s} {pt['per_s']:7.0f}/s  logit error "
              f"{statistics.mean(pt['errors']):.4f}  F1 loss {statistics.mean(pt['losses']):+.3f}")


if __name__ == "__main__":
    main()
