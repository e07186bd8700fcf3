"""The GPU's clocks and power while it works, from ``nvidia-smi`` samples (no GPU needed).

The samples are what ``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,...
--format=csv -lms 100`` prints beside a benchmark (v13's and v36's mix runs). A sample is
*busy* when it draws more than ``--busy-w`` watts; over those the summary gives the SM
clock, the power and the share of each clock-event reason (``0x4``: the software power
cap, ``0x1``: idle). The plot is SM clock and power against time.

    python3 benchmarks/plot_power_samples.py benchmarks/gpu-2026-12-04-v36/smi-mix-samples.csv
        [--out benchmarks/gpu-2026-12-04-v36/power-mix.png] [--busy-w 300]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from matplotlib.figure import Figure

REASONS = {0x1: "idle", 0x4: "software power cap", 0x20: "software thermal",
           0x40: "hardware thermal", 0x80: "hardware power brake"}


@dataclass(frozen=True)
class Sample:
    at: datetime  # the sample's local time, as nvidia-smi prints it
    t_s: float  # seconds since the first sample
    sm_mhz: float
    power_w: float
    reasons: int  # the clock-event reasons' bit mask


def _number(cell: str) -> float:
    """``'1620 MHz'`` / ``'691.8 W'`` / ``'59'`` -> the number."""
    return float(cell.strip().split()[0])


def _column(header: list[str], *names: str) -> int:
    """The index of the first header cell that starts with one of ``names``."""
    cells = [h.strip() for h in header]
    for name in names:
        for i, cell in enumerate(cells):
            if cell.startswith(name):
                return i
    raise ValueError(f"no column {' or '.join(names)} in the header {cells}")


def read_samples(path: Path) -> list[Sample]:
    """The samples of an ``nvidia-smi --format=csv`` log, in order; rows that are not
    whole (a log cut off mid-line) or not numbers (``[N/A]``) are skipped."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path} is empty")
    header = rows[0]
    at = _column(header, "timestamp")
    sm = _column(header, "clocks.current.sm", "clocks.sm")
    power = _column(header, "power.draw")
    reasons = _column(header, "clocks_event_reasons.active", "clocks_throttle_reasons.active")
    out: list[Sample] = []
    start: datetime | None = None
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        try:
            when = datetime.strptime(row[at].strip(), "%Y/%m/%d %H:%M:%S.%f")
            sample = (_number(row[sm]), _number(row[power]), int(row[reasons].strip(), 16))
        except ValueError:
            continue
        start = start or when
        out.append(Sample(when, (when - start).total_seconds(), *sample))
    if not out:
        raise ValueError(f"{path} holds no whole sample")
    return out


@dataclass(frozen=True)
class Summary:
    samples: int
    busy: int  # samples drawing more than the threshold
    sm_mhz: tuple[float, float, float]  # min, median, max over the busy samples
    power_w: tuple[float, float, float]
    reasons: dict[str, float]  # each clock-event reason's share of the busy samples


def _spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def summary(samples: list[Sample], busy_w: float) -> Summary:
    """Over the busy samples (power above ``busy_w``): the SM clock's and the power's
    min / median / max, and each clock-event reason's share."""
    busy = [s for s in samples if s.power_w > busy_w]
    if not busy:
        raise ValueError(f"no sample draws more than {busy_w} W")
    reasons = Counter(s.reasons for s in busy)
    return Summary(len(samples), len(busy), _spread([s.sm_mhz for s in busy]),
                   _spread([s.power_w for s in busy]),
                   {describe(mask): n / len(busy) for mask, n in reasons.most_common()})


def describe(mask: int) -> str:
    """A clock-event mask in words: ``0x4`` -> ``'software power cap'``, ``0`` -> ``'none'``."""
    if mask == 0:
        return "none"
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return " + ".join(names + ([f"0x{rest:x}"] if rest else []))


def plot(samples: list[Sample], busy_w: float, title: str) -> Figure:
    fig = Figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.subplots()
    t = [s.t_s for s in samples]
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
    save_figure(plot(samples, args.busy_w, args.samples.name),
                args.out or args.samples.with_suffix(".png"))


if __name__ == "__main__":
    main()
