"""The report's figures, drawn with matplotlib's object API (no pyplot, no global state).

Each plot keeps one signature colour so that a screenshot test can find it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

BUDGET = "#d62728"
PERCENTILE_COLOURS = {"p50": "#1f77b4", "p90": "#6baed6", "p99": "#08306b", "p999": "#9ecae1"}
GATEWAY = "#7f7f7f"
PHASE_COLOURS = {"tokenize": "#2ca02c", "infer": "#ff7f0e", "decode": "#9467bd",
                 "gateway other": "#bcbd22", "client + network": "#c7c7c7"}
ERRORS = "#8c564b"
ACHIEVED = "#17becf"

Step = dict[str, Any]


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(title: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(6.0, 3.8), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _value(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _budget_line(ax: Axes, budget_ms: float | None) -> None:
    if budget_ms is not None:
        ax.axhline(budget_ms, color=BUDGET, linestyle="--", linewidth=2,
                   label=f"budget {budget_ms:g} ms")


def latency_vs_load(steps: Sequence[Step], budget_ms: float | None) -> str:
    fig, ax = _figure("Latency vs offered load (from scheduled send)")
    rates = [s["offered_rps"] for s in steps]
    for key, colour in PERCENTILE_COLOURS.items():
        label = "p99.9" if key == "p999" else key
        ax.plot(rates, [_value(s["latency_ms"][key]) for s in steps], "o-", color=colour,
                linewidth=2, label=label)
    gw = [s for s in steps if s.get("gateway")]
    if gw:
        for key, marker in (("p50_ms", "s"), ("p99_ms", "^")):
            ax.plot([s["offered_rps"] for s in gw], [_value(s["gateway"][key]) for s in gw],
                    marker, linestyle=":", color=GATEWAY, label=f"gateway {key[:3]}")
    _budget_line(ax, budget_ms)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.legend(fontsize=8)
    return _png(fig)


def _phase_bars(step: Step) -> dict[str, float]:
    phases = step["phases_ms"]
    bars = {p: _value(phases[p]["mean"]) if p in phases else 0.0
            for p in ("tokenize", "infer", "decode")}
    named = sum(bars.values())
    total = _value(phases["total"]["mean"]) if "total" in phases else named
    client = _value(step["ok_latency_ms"]["mean"])
    bars["gateway other"] = max(total - named, 0.0)
    bars["client + network"] = max(client - total, 0.0) if client == client else 0.0
    return bars


def phase_breakdown(steps: Sequence[Step]) -> str:
    fig, ax = _figure("Where the time goes (share of the mean 2xx latency)")
    labels = [f"{s['offered_rps']:g}" for s in steps]
    per_step = [_phase_bars(s) for s in steps]
    totals = [sum(bars.values()) for bars in per_step]
    bottoms = [0.0] * len(steps)
    for name, colour in PHASE_COLOURS.items():
        shares = [100.0 * bars[name] / t if t > 0 else 0.0
                  for bars, t in zip(per_step, totals, strict=True)]
        ax.bar(labels, shares, bottom=bottoms, color=colour, label=name)
        bottoms = [b + h for b, h in zip(bottoms, shares, strict=True)]
    for x, total in enumerate(totals):
        ax.annotate(f"{total:.3g} ms", (x, 101), ha="center", fontsize=7)
    ax.set_ylim(0, 135)
    ax.set_xlabel("offered load (requests/s); mean ms above each bar")
    ax.set_ylabel("% of mean latency")
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    return _png(fig)


def error_rate(steps: Sequence[Step], max_error_rate: float) -> str:
    fig, ax = _figure("Error rate vs offered load")
    rates = [s["offered_rps"] for s in steps]
    ax.plot(rates, [100.0 * _value(s["error_rate"]) for s in steps], "o-", color=ERRORS,
            linewidth=2, label="non-2xx + timeouts")
    ax.axhline(100.0 * max_error_rate, color=BUDGET, linestyle="--", label="limit")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("errors (%)")
    ax.legend(fontsize=8)
    return _png(fig)


def achieved_vs_offered(steps: Sequence[Step]) -> str:
    fig, ax = _figure("Achieved vs offered rate")
    rates = [s["offered_rps"] for s in steps]
    top = max(rates + [s["achieved_rps"] for s in steps])
    ax.plot([0, top], [0, top], color="#555555", linestyle=":", label="achieved = offered")
    ax.plot(rates, [s["achieved_rps"] for s in steps], "o-", color=ACHIEVED, linewidth=2,
            label="2xx responses/s")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("achieved (requests/s)")
    ax.legend(fontsize=8)
    return _png(fig)


def latency_timeline(steps: Sequence[Step], budget_ms: float | None) -> str:
    fig, ax = _figure("Every request's latency over the test")
    offset = 0.0
    for step in steps:
        samples = step["samples"]
        xs = [offset + t for t in samples["scheduled_s"]]
        ok = [st and 200 <= st < 300 for st in samples["status"]]
        ax.scatter([x for x, g in zip(xs, ok, strict=True) if g],
                   [y for y, g in zip(samples["latency_ms"], ok, strict=True) if g],
                   s=3, color=PERCENTILE_COLOURS["p50"], alpha=0.5)
        ax.scatter([x for x, g in zip(xs, ok, strict=True) if not g],
                   [y for y, g in zip(samples["latency_ms"], ok, strict=True) if not g],
                   s=6, color=ERRORS, marker="x")
        offset += step["duration_s"]
        ax.axvline(offset, color="#dddddd", linewidth=0.8)
    _budget_line(ax, budget_ms)
    ax.set_yscale("log")
    ax.set_xlabel("scheduled send time (s, steps back to back)")
    ax.set_ylabel("latency (ms)")
    return _png(fig)


def percentile_spectrum(steps: Sequence[Step], budget_ms: float | None) -> str:
    fig, ax = _figure("Latency by percentile (HDR style)")
    for step in steps:
        lat = sorted(step["samples"]["latency_ms"])
        n = len(lat)
        if n < 2:
            continue
        # x = 1 / (1 - p): 10 at p90, 100 at p99, 1000 at p99.9.
        xs = [1.0 / (1.0 - (i + 0.5) / n) for i in range(n)]
        ax.plot(xs, lat, linewidth=1.5, label=f"{step['offered_rps']:g} rps")
    _budget_line(ax, budget_ms)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 10, 100, 1000], ["0", "50", "90", "99", "99.9"])
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)
