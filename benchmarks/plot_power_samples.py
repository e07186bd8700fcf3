"""The GPU's clocks and power while it works, from ``nvidia-smi`` samples (no GPU needed).

The samples are what ``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,...
--format=csv -lms 100`` prints beside a benchmark (v13's and v36's mix runs). A sample is
*busy* when it draws more than ``--busy-w`` watts; over those the summary gives the SM
clock, the power and the share of each clock-event reason (``0x4``: the software power
cap, ``0x1``: idle; read and summarised by ``gpu_clocks``). The plot is SM clock and power
against time.

    python3 benchmarks/plot_power_samples.py benchmarks/gpu-2026-12-04-v36/smi-settled-samples.csv
        [--out benchmarks/gpu-2026-12-04-v36/power-mix-settled.png] [--busy-w 300]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from matplotlib.figure import Figure

from benchmarks.gpu_clocks import Sample, read_samples, summary


def plot(samples: list[Sample], busy_w: float, title: str) -> Figure:
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.subplots()
    t = [(s.at - samples[0].at).total_seconds() for s in samples]
    ax.plot(t, [s.sm_mhz for s in samples], color="C0", label="SM clock (MHz)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("SM clock (MHz)", color="C0")
    ax.set_ylim(0, None)
    ax.grid(True, alpha=0.3)
    power = ax.twinx()
    power.plot(t, [s.power_w for s in samples], color="C3", alpha=0.7, label="power (W)")
    power.axhline(busy_w, color="C7", linestyle=":", label=f"busy above {busy_w:.0f} W")
    power.set_ylabel("power (W)", color="C3")
    power.set_ylim(0, None)
    power.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("samples", type=Path)
    p.add_argument("--out", type=Path, default=None,
                   help="PNG to write (default: beside the samples, .png)")
    p.add_argument("--busy-w", type=float, default=300.0)
    args = p.parse_args()
    from benchmarks.figures import save_figure

    samples = read_samples(args.samples)
    s = summary(samples, args.busy_w)
    print(f"{s.busy} of {s.samples} samples busy (> {args.busy_w:.0f} W)")
    print("| | min | median | max |\n|---|---|---|---|")
    for name, (lo, mid, hi) in (("SM clock (MHz)", s.sm_mhz), ("power (W)", s.power_w)):
        print(f"| {name} | {lo:.0f} | {mid:.0f} | {hi:.0f} |")
    for reason, share in s.reasons.items():
        print(f"clock-event reason {reason}: {share:.0%} of busy samples")
    print(f"the software power cap among them: {s.cap_share:.0%}")
    save_figure(plot(samples, args.busy_w, args.samples.name),
                args.out or args.samples.with_suffix(".png"))


if __name__ == "__main__":
    main()
