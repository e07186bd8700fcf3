"""``benchmarks.gpu_clocks``: nvidia-smi logs read and summarised; the sampler's process,
its samples and its failures.

No GPU here, so ``nvidia-smi`` is played by small scripts that print what it prints (its
CSV header, then one row per interval) or fail the ways it can.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_clocks
from benchmarks.bench_gpu import clocks
from benchmarks.gpu_clocks import ClockSampler, clock_fields, describe, read_samples, summary

HEADER = ("timestamp, clocks.current.sm [MHz], power.draw [W], "
          "clocks_event_reasons.active")


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
    samples = read_samples(write(tmp_path, V36_STYLE))
    assert [s.sm_mhz for s in samples] == [345, 1980, 1500, 1600]
    assert [s.power_w for s in samples] == [79.28, 350.0, 700.5, 695.0]
    assert [s.reasons for s in samples] == [0x1, 0, 0x4, 0x44]
    assert [round((s.at - samples[0].at).total_seconds(), 3) for s in samples] == [
        0.0, 0.1, 0.2, 0.4]


def test_summary_is_over_busy_samples_only(tmp_path: Path) -> None:
    s = summary(read_samples(write(tmp_path, V36_STYLE)), busy_w=300)
    assert s.samples == 4 and s.busy == 3
    assert s.sm_mhz == (1500, 1600, 1980)
    assert s.power_w == (350.0, 695.0, 700.5)
    assert s.reasons == pytest.approx({"none": 1 / 3, "software power cap": 1 / 3,
                                       "software power cap + hardware thermal": 1 / 3})
    assert s.cap_share == pytest.approx(2 / 3)  # by the bit: 0x4 and 0x44
    with pytest.raises(ValueError, match="no sample draws more than 800"):
        summary(read_samples(write(tmp_path, V36_STYLE)), busy_w=800)


def test_reasons_described() -> None:
    assert describe(0) == "none"
    assert describe(0x1) == "idle"
    assert describe(0x4) == "software power cap"
    assert describe(0x104) == "software power cap + 0x100"


def test_bad_logs_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is empty"):
        read_samples(write(tmp_path, ""))
    with pytest.raises(ValueError, match=r"no column power\.draw"):
        read_samples(write(tmp_path, "timestamp, clocks.sm [MHz], "
                                           "clocks_event_reasons.active\n"))
    header = V36_STYLE.splitlines()[0] + "\n"
    with pytest.raises(ValueError, match="holds no whole sample"):
        read_samples(write(tmp_path, header + "2026/12/04 16:34:44.557, 345 MHz\n"))


def fake_smi(tmp_path: Path, body: str) -> str:
    """An executable that runs ``body`` (Python, with ``argv`` and ``HEADER`` bound)."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!{sys.executable}\nimport sys, time, signal\nargv = sys.argv[1:]\n"
                    f"HEADER = {HEADER!r}\n{body}")
    path.chmod(0o755)
    return str(path)


SAMPLING = """
print(HEADER, flush=True)
rows = [("1980 MHz", "350.0 W", "0x0000000000000000"),
        ("1600 MHz", "695.0 W", "0x0000000000000004"),
        ("1650 MHz", "690.0 W", "0x0000000000000004")]
for i, (sm, w, r) in enumerate(rows):
    print(f"2020/01/01 12:00:00.{i}00, {sm}, {w}, {r}", flush=True)
time.sleep(60)
"""


def test_samples_over_the_block(tmp_path: Path) -> None:
    smi = fake_smi(tmp_path, SAMPLING)
    with ClockSampler(smi=smi) as sampler:
        start = sampler.now()
        proc = sampler._proc
        deadline = time.monotonic() + 10
        while sampler._path is not None and sampler._path.read_text().count("\n") < 4:
            assert time.monotonic() < deadline, "the fake nvidia-smi printed nothing"
            time.sleep(0.02)
        path = sampler._path
        with pytest.raises(RuntimeError, match="read when the block ends"):
            sampler.between(start, sampler.now())  # no samples yet: refused, not None
    assert proc is not None and proc.poll() is not None  # stopped with the block
    assert path is not None and not path.exists()  # its samples file removed
    assert sampler.missing is None and len(sampler.samples) == 3
    # The fake's timestamps are fixed, 2020-01-01 12:00:00.0-00.2: windows pick by them.
    at = [s.at for s in sampler.samples]
    whole = sampler.between(at[0], at[-1])
    assert whole is not None and whole.sm_mhz == (1600, 1650, 1980)  # every sample counts
    fields = clock_fields(whole)
    assert fields == pytest.approx({"sm_mhz": 1650, "power_w": 690.0,
                                    "power_cap_share": 2 / 3, "clock_samples": 3})
    assert clocks(fields) == " [1650 MHz, 690 W]"
    late = sampler.between(at[1], at[2])
    assert late is not None and late.samples == 2 and late.sm_mhz[1] == 1625
    assert sampler.between(start, sampler.now()) is None  # none taken during the block
    assert clock_fields(None) == {} and clocks(clock_fields(None)) == ""


def test_command_names_the_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc, 3")
    cmd = ClockSampler(interval_ms=50, smi="/bin/nvidia-smi").command()
    assert cmd == ["/bin/nvidia-smi", f"--query-gpu={gpu_clocks.QUERY}", "--format=csv",
                   "-lms", "50", "-i", "GPU-abc"]
    named = ClockSampler(smi="/bin/nvidia-smi", gpu="GPU-0d1e").command() or []
    assert named[-2:] == ["-i", "GPU-0d1e"]  # a given id wins over the variable's index
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "-i" not in (ClockSampler(smi="/bin/nvidia-smi").command() or [])
    with pytest.raises(ValueError, match="interval_ms must be >= 1"):
        ClockSampler(interval_ms=0)


def test_torch_gpu_id_names_the_device_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_clocks.torch_gpu_id() is None  # no CUDA device: nvidia-smi's default GPU

    class Props:
        uuid = "8a4e0c9f-1b2d-4e5f-a6b7-c8d9e0f1a2b3"

    asked: list[int] = []

    def properties(device: int) -> Props:
        asked.append(device)
        return Props()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert gpu_clocks.torch_gpu_id() == "GPU-8a4e0c9f-1b2d-4e5f-a6b7-c8d9e0f1a2b3"
    assert gpu_clocks.torch_gpu_id(0) == "GPU-8a4e0c9f-1b2d-4e5f-a6b7-c8d9e0f1a2b3"
    assert asked == [2, 0]  # the current device unless one is named


def test_missing_smi_runs_the_block_unsampled(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi
    ran = False
    with ClockSampler() as sampler:
        ran = True
    assert ran and sampler.missing == "nvidia-smi not found" and sampler.samples == []
    assert sampler.between(sampler.now(), sampler.now()) is None


def test_smi_that_cannot_start_or_fails(tmp_path: Path) -> None:
    with ClockSampler(smi=str(tmp_path / "absent")) as sampler:
        pass
    assert sampler.missing is not None and "did not start" in sampler.missing
    # What nvidia-smi prints on a machine whose driver it cannot reach, then exits 9.
    failing = fake_smi(tmp_path, 'print("NVIDIA-SMI has failed because it couldn\'t '
                                 'communicate with the NVIDIA driver.")\nsys.exit(9)\n')
    with ClockSampler(smi=failing) as sampler:
        time.sleep(0.2)
    assert sampler.samples == []
    assert sampler.missing is not None and "no column timestamp" in sampler.missing


def test_a_sampler_that_ignores_terminate_is_killed(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_clocks, "STOP_TIMEOUT_S", 0.3)
    stubborn = fake_smi(tmp_path, "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                  "print(HEADER, flush=True)\ntime.sleep(60)\n")
    with ClockSampler(smi=stubborn) as sampler:
        time.sleep(0.3)  # let it install its handler
        proc = sampler._proc
    assert proc is not None and proc.returncode is not None  # killed, not left behind
    assert sampler.missing is not None and "no whole sample" in sampler.missing
