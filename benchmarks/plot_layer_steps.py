"""Where a BERT-base batch-1 layer's time goes, as a figure, from recorded
``trace_pass.py`` kernel lists (no GPU needed).

    python3 benchmarks/plot_layer_steps.py [--out benchmarks/layer-steps-2026-11-30.png]

Grouped bars: each kernel position of the deferred layer (QKV, attention, out-projection,
FFN1, FFN2), its mean step over the 12 layers (previous kernel's end to its own end),
for the real model and for the same pass with one layer's weights repeated (resident in
L2: ``--repeat-layers 1``), at 1x128 and 4x32. The gap between a pair is what that kernel
pays for its weight stream.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "benchmarks" / "gpu-2026-11-30-v18-trace-bert-base-{}.json"
SHAPES = ("1x128", "4x32")
NAMES = ("QKV", "attention", "out-proj", "FFN1", "FFN2")  # the deferred layer's order
LAYERS = 12


def layer_steps(path: Path) -> list[float]:
    """Mean step (us) of each position of the deferred layer in a recorded trace."""
    sys.path.insert(0, str(REPO))
    from benchmarks.trace_pass import layer_positions

    positions = layer_positions(json.loads(path.read_text()), LAYERS)
    if len(positions) != len(NAMES):
        raise ValueError(f"{path.name}: {len(positions)} kernels a layer, expected "
                         f"{len(NAMES)} (the deferred layer)")
    return [p["step_us"] for p in positions]


def plot(steps: dict[str, list[float]], title: str) -> Figure:
    fig = Figure(figsize=(7.2, 4.0), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(steps)
    for j, (label, values) in enumerate(steps.items()):
        xs = [i + (j - (len(steps) - 1) / 2) * width for i in range(len(NAMES))]
        ax.bar(xs, values, width, label=f"{label}: {sum(values):.1f} us a layer",
               color=f"C{j // 2}", alpha=1.0 if j % 2 == 0 else 0.45)
    ax.set_xticks(range(len(NAMES)), NAMES)
    ax.set_ylabel("step, us (mean over 12 layers)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path,
                   default=REPO / "benchmarks" / "layer-steps-2026-11-30.png")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from benchmarks.figures import save_figure

    steps = {}
    for shape in SHAPES:
        steps[f"{shape}, weights from HBM"] = layer_steps(Path(str(RECORDS).format(shape)))
        steps[f"{shape}, weights in L2"] = layer_steps(
            Path(str(RECORDS).format(f"{shape}-repeat1")))
    fig = plot(steps, "BERT-base fp16, deferred small-batch layer, kernel trace of real calls"
                      "\nNVIDIA H200, 2026-11-30 (v18), commit 8c02fd8")
    save_figure(fig, args.out)
    for label, values in steps.items():
        print(f"  {label:26s} " + "  ".join(f"{n} {v:.2f}" for n, v in zip(NAMES, values,
                                                                           strict=True)))


if __name__ == "__main__":
    main()
