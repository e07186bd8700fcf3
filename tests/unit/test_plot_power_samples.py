"""``benchmarks/plot_power_samples.py`` on the recorded H200 mix logs (no GPU needed); the
log reader and summary it uses are tested with ``gpu_clocks`` (``test_gpu_clocks.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import plot_power_samples as power
from benchmarks.gpu_clocks import read_samples, summary

REPO = Path(__file__).resolve().parents[2]

@pytest.mark.parametrize("name, median_mhz", [
    ("gpu-2026-11-30-v13-power-mix.csv", 1755),  # v13's machine (its query had power.limit)
    ("gpu-2026-12-04-v36/smi-mix-samples.csv", 1650),  # v36's: lower clocks at the same cap
])
def test_recorded_mix_runs_sat_at_the_power_cap(name: str, median_mhz: float,
                                                tmp_path: Path) -> None:
    samples = read_samples(REPO / "benchmarks" / name)
    s = summary(samples, busy_w=300)
    assert s.sm_mhz[1] == median_mhz
    assert 680 < s.power_w[1] <= 700
    assert s.reasons["software power cap"] > 0.9 and s.cap_share > 0.9
    pytest.importorskip("matplotlib")
    from benchmarks.figures import save_figure

    out = tmp_path / "p.png"
    save_figure(power.plot(samples, 300, name), out)
    assert out.stat().st_size > 10_000
