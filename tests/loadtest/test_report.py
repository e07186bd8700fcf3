"""The HTML report: self-contained, and its plots really render in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from loadtest import plots
from loadtest.generator import Sample
from loadtest.report import render_html
from loadtest.results import GatewayView, RunResult, step_result, to_dict

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
PHASES = {"tokenize": 0.4, "infer": 3.0, "decode": 0.2}


def samples_at(rate: float, base_ms: float, seed: int, error_every: int = 0) -> list[Sample]:
    """Two seconds of requests with lognormal latency around ``base_ms``."""
    rng = np.random.default_rng(seed)
    n = int(rate * 2)
    latencies = base_ms * rng.lognormal(0.0, 0.15, n) / 1000.0
    out = []
    for i, lat in enumerate(latencies):
        failed = error_every and i % error_every == 0
        phases = {} if failed else {**{k: v * base_ms / 5 for k, v in PHASES.items()},
                                    "total": 4.0 * base_ms / 5}
        out.append(Sample(i / rate, 0.0002, float(lat), 503 if failed else 200,
                          "http_503" if failed else "", phases))
    return out


def capacity_result() -> RunResult:
    steps = []
    for i, (rate, base) in enumerate(((10, 5.0), (20, 5.5), (40, 6.5), (80, 14.0))):
        gateway = GatewayView(count=rate * 2, mean_ms=base * 0.8, p50_ms=base * 0.8,
                              p99_ms=base * 1.6, phases={})
        samples = samples_at(rate, base, seed=i, error_every=10 if rate == 80 else 0)
        steps.append(step_result(samples, rate, 2.0, gateway, budget_ms=10.0,
                                 max_error_rate=0.01))
    return RunResult(kind="capacity", url="http://127.0.0.1:8080/v1/qa",
                     started_at="2026-11-29T00:00:00+00:00", budget_ms=10.0,
                     max_error_rate=0.01, settings={}, steps=steps, capacity_rps=40.0, notes=[])


def test_report_is_self_contained_and_complete() -> None:
    result = to_dict(capacity_result())
    page = render_html(result)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # no network at all
    assert "<script" not in page
    assert page.count('src="data:image/png;base64,') == 6
    for figure in ("latency", "phases", "errors", "throughput", "timeline", "spectrum"):
        assert f'id="{figure}"' in page
    assert "capacity at SLO: 40 requests/s" in page
    assert page.count('class="pass"') == 3 and page.count('class="fail"') == 1


def colour_pixels(image: Image.Image, hex_colour: str, tolerance: int = 24) -> int:
    """How many pixels are within ``tolerance`` of the colour in every channel."""
    rgb = np.asarray(image.convert("RGB"), dtype=np.int16)
    target = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    return int((np.abs(rgb - target) <= tolerance).all(axis=2).sum())


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_report_renders_its_plots_in_headless_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    page = tmp_path / "report.html"
    page.write_text(render_html(to_dict(capacity_result())))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         "--window-size=1280,2400", page.as_uri()],
        capture_output=True, timeout=120, check=True)
    image = Image.open(shot)
    assert image.size == (1280, 2400)
    # Each plot has a signature colour; a missing or broken image would leave none of it.
    signatures = {
        "budget line": plots.BUDGET, "p99 line": plots.PERCENTILE_COLOURS["p99"],
        "infer bars": plots.PHASE_COLOURS["infer"],
        "tokenize bars": plots.PHASE_COLOURS["tokenize"],
        "error rate": plots.ERRORS, "achieved rate": plots.ACHIEVED,
    }
    for name, colour in signatures.items():
        assert colour_pixels(image, colour) >= 400, name  # the table alone has < 100 red
