"""``benchmarks/plot_power_samples.py``: nvidia-smi logs read, summarised and plotted (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import plot_power_samples as power

REPO = Path(__file__).resolve().parents[2]

# v36's query (throttle column under its newer name, utilisation between), a row cut off
# mid-line and one with a value nvidia-smi could not read.
V36_STYLE = """\
timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], \
temperature.gpu, utilization.gpu [%], clocks_event_reasons.active
2026/12/04 16:34:44.557, 345 MHz, 3201 MHz, 79.28 W, 39, 0 %, 0x0000000000000001
2026/12/04 16:34:44.657, 1980 MHz, 3201 MHz, 350.00 W, 40, 100 %, 0x0000000000000000
2026/12/04 16:34:44.757, 1500 MHz, 3201 MHz, 700.50 W, 55, 100 %, 0x0000000000000004
2026/12/04 16:34:44.857, [N/A], 3201 MHz, 690.00 W, 55, 100 %, 0x0000000000000004
2026/12/04 16:34:44.957, 1600 MHz, 3201 MHz, 695.00 W, 56, 100 %, 0x0000000000000044
2026/12/04 16:34:45.057, 1620 MHz, 3201
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "smi.csv"
    path.write_text(text)
    return path


def test_samples_read_skip_partial_and_unreadable_rows(tmp_path: Path) -> None:
    samples = power.read_samples(write(tmp_path, V36_STYLE))
    assert [s.sm_mhz for s in samples] == [345, 1980, 1500, 1600]
    assert [s.power_w for s in samples] == [79.28, 350.0, 700.5, 695.0]
    assert [s.reasons for s in samples] == [0x1, 0, 0x4, 0x44]
    assert [round(s.t_s, 3) for s in samples] == [0.0, 0.1, 0.2, 0.4]


def test_summary_is_over_busy_samples_only(tmp_path: Path) -> None:
    s = power.summary(power.read_samples(write(tmp_path, V36_STYLE)), busy_w=300)
    assert s.samples == 4 and s.busy == 3
    assert s.sm_mhz == (1500, 1600, 1980)
    assert s.power_w == (350.0, 695.0, 700.5)
    assert s.reasons == pytest.approx({"none": 1 / 3, "software power cap": 1 / 3,
                                          "software power cap + hardware thermal": 1 / 3})
    with pytest.raises(ValueError, match="no sample draws more than 800"):
        power.summary(power.read_samples(write(tmp_path, V36_STYLE)), busy_w=800)


def test_reasons_described() -> None:
    assert power.describe(0) == "none"
    assert power.describe(0x1) == "idle"
    assert power.describe(0x4) == "software power cap"
    assert power.describe(0x104) == "software power cap + 0x100"


def test_bad_logs_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is empty"):
        power.read_samples(write(tmp_path, ""))
    with pytest.raises(ValueError, match=r"no column power\.draw"):
        power.read_samples(write(tmp_path, "timestamp, clocks.sm [MHz], "
                                           "clocks_event_reasons.active\n"))
    header = V36_STYLE.splitlines()[0] + "\n"
    with pytest.raises(ValueError, match="holds no whole sample"):
        power.read_samples(write(tmp_path, header + "2026/12/04 16:34:44.557, 345 MHz\n"))


@pytest.mark.parametrize("name, median_mhz", [
    ("gpu-2026-11-30-v13-power-mix.csv", 1755),  # v13's machine (its query had power.limit)
    ("gpu-2026-12-04-v36/smi-mix-samples.csv", 1650),  # v36's: lower clocks at the same cap
])
def test_recorded_mix_runs_sat_at_the_power_cap(name: str, median_mhz: float,
                                                tmp_path: Path) -> None:
    samples = power.read_samples(REPO / "benchmarks" / name)
    s = power.summary(samples, busy_w=300)
    assert s.sm_mhz[1] == median_mhz
    assert 680 < s.power_w[1] <= 700
    assert s.reasons["software power cap"] > 0.9
    pytest.importorskip("matplotlib")
    from benchmarks.figures import save_figure

    out = tmp_path / "p.png"
    save_figure(power.plot(samples, 300, name), out)
    assert out.stat().st_size > 10_000
