"""A self-contained HTML report (inline PNG plots, inline CSS, no network) from a result."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from loadtest import plots

CSS = """
body { font-family: sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 6px 0; }
p.meta { margin: 2px 0; font-size: 13px; color: #444; }
table { border-collapse: collapse; font-size: 12px; margin: 10px 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f2f2f2; }
td.pass { color: #1a7f37; font-weight: bold; } td.fail { color: #d62728; font-weight: bold; }
.grid { display: grid; grid-template-columns: 600px 600px; gap: 8px; }
.grid figure { margin: 0; } .grid img { width: 600px; height: 380px; display: block; }
figcaption { font-size: 12px; color: #555; }
"""


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def _row(step: dict[str, Any]) -> str:
    lat, gw = step["latency_ms"], step.get("gateway") or {}
    verdict = {True: ("pass", "pass"), False: ("fail", "FAIL"), None: ("", "-")}[step["passed"]]
    cells = [
        _fmt(step["offered_rps"], 1), _fmt(step["achieved_rps"], 1), str(step["completed"]),
        _fmt(lat["p50"]), _fmt(lat["p90"]), _fmt(lat["p99"]), _fmt(lat["p999"]), _fmt(lat["max"]),
        _fmt(gw.get("p50_ms")), _fmt(gw.get("p99_ms")), _fmt(100.0 * step["error_rate"], 2)
        if step["error_rate"] is not None else "-", _fmt(step["lag_ms"]["p99"]),
    ]
    tds = "".join(f"<td>{c}</td>" for c in cells)
    return f'<tr>{tds}<td class="{verdict[0]}">{verdict[1]}</td></tr>'


def _table(steps: list[dict[str, Any]]) -> str:
    head = ("offered rps", "achieved rps", "requests", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms",
            "max ms", "gateway p50 ms", "gateway p99 ms", "errors %", "send lag p99 ms", "SLO")
    ths = "".join(f"<th>{h}</th>" for h in head)
    return f"<table><tr>{ths}</tr>{''.join(_row(s) for s in steps)}</table>"


def _figure(name: str, png: str, caption: str) -> str:
    return (f'<figure id="{name}"><img alt="{html.escape(caption)}" '
            f'src="data:image/png;base64,{png}"><figcaption>{html.escape(caption)}</figcaption>'
            "</figure>")


def _figures(result: dict[str, Any]) -> str:
    steps, budget = result["steps"], result["budget_ms"]
    figures = [
        ("latency", plots.latency_vs_load(steps, budget),
         "Client-side percentiles (all requests, timed from their scheduled send) and the "
         "gateway's own p50/p99 from its histograms; dashed red: the latency budget."),
        ("phases", plots.phase_breakdown(steps),
         "Server-Timing phases, the rest of the gateway, and the client + network share of the "
         "client-measured mean latency of 2xx requests."),
        ("errors", plots.error_rate(steps, result["max_error_rate"]),
         "Share of requests that were not 2xx (429, 503, 504, timeouts ...)."),
        ("throughput", plots.achieved_vs_offered(steps),
         "Achieved 2xx responses/s against the offered open-loop rate."),
        ("timeline", plots.latency_timeline(steps, budget),
         "Each request by its scheduled send time, steps in order of offered rate; brown crosses "
         "are errors."),
        ("spectrum", plots.percentile_spectrum(steps, budget),
         "Latency by percentile per step (x: 1/(1-p), so the tail is visible)."),
    ]
    return "".join(_figure(*f) for f in figures)


def render_html(result: dict[str, Any]) -> str:
    """The report for a result as written by ``results.to_dict``."""
    capacity = result.get("capacity_rps")
    lines = [
        f"target {html.escape(result['url'])} &middot; started {html.escape(result['started_at'])}",
        f"latency budget {_fmt(result['budget_ms'], 1)} ms at p99 &middot; error limit "
        f"{100.0 * result['max_error_rate']:.2f}%",
    ]
    if result["kind"] == "capacity":
        lines.append("<b>capacity at SLO: "
                     + (f"{capacity:g} requests/s" if capacity is not None else "none")
                     + "</b> (highest offered rate with p99 within budget)")
    lines += [html.escape(n) for n in result.get("notes", [])]
    meta = "".join(f'<p class="meta">{line}</p>' for line in lines)
    title = f"QA load test: {result['kind']}"
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{CSS}</style></head><body><h1>{title}</h1>{meta}"
            f"{_table(result['steps'])}<div class=\"grid\">{_figures(result)}</div></body></html>")


def write_html(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
