"""The GPU's SM clock and power during timed work, sampled by ``nvidia-smi`` beside it.

A whole-pass result at the H200's power cap is an energy result: the same mix path read
7,735-7,757 windows/s on one part and 7,453-7,523 on another whose SM clock at the cap was
6% lower (``engine/fused/NOTES.md`` v36), and a GPU fresh from idle runs its first second
or so at its top clock before the power limit pulls it down. ``bench_gpu``'s mix section
therefore runs each variant at load before timing it, and records the median SM clock and
power over each timed window and the share of samples the software power cap held down.

    with ClockSampler() as sampler:
        start = sampler.now()
        ...  # the timed work
        windows[key] = (start, sampler.now())
    row.update(clock_fields(sampler.between(*windows[key])))  # {} where unsampled

``nvidia-smi`` samples the GPU that ``CUDA_VISIBLE_DEVICES`` names first, else the first
it lists (the lent machines have one). Where it is missing or fails, the work runs
unsampled and :attr:`ClockSampler.missing` says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path
from types import TracebackType

from benchmarks.plot_power_samples import Sample, Summary, read_samples, summary

QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"
STOP_TIMEOUT_S = 5.0


class ClockSampler:
    """A context manager: ``nvidia-smi`` runs while the block does; its samples are read
    on exit into :attr:`samples`, for :meth:`between` to summarise by time."""

    def __init__(self, interval_ms: int = 100, smi: str | None = None) -> None:
        if interval_ms < 1:
            raise ValueError(f"interval_ms must be >= 1, not {interval_ms}")
        self.interval_ms = interval_ms
        self.smi = smi
        self.samples: list[Sample] = []
        self.missing: str | None = None  # why there are no samples
        self._proc: subprocess.Popen[bytes] | None = None
        self._path: Path | None = None

    def command(self) -> list[str] | None:
        exe = self.smi or shutil.which("nvidia-smi")
        if exe is None:
            return None
        cmd = [exe, f"--query-gpu={QUERY}", "--format=csv", "-lms", str(self.interval_ms)]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        return [*cmd, "-i", visible] if visible else cmd

    @staticmethod
    def now() -> datetime:
        """The local time, on the clock nvidia-smi's timestamps use."""
        return datetime.now()

    def __enter__(self) -> ClockSampler:
        cmd = self.command()
        if cmd is None:
            self.missing = "nvidia-smi not found"
            return self
        fd, name = tempfile.mkstemp(prefix="gpu-clocks-", suffix=".csv")
        self._path = Path(name)
        try:
            self._proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.DEVNULL)
        except OSError as exc:
            self.missing = f"{cmd[0]} did not start: {exc}"
            self._path.unlink(missing_ok=True)
            self._path = None
        finally:
            os.close(fd)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        proc, path = self._proc, self._path
        self._proc = self._path = None
        if proc is None or path is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            self.samples = read_samples(path)
        except ValueError as err:  # no sample in time, or nvidia-smi printed an error
            self.missing = str(err)
        finally:
            path.unlink(missing_ok=True)

    def between(self, start: datetime, end: datetime) -> Summary | None:
        """The samples taken from ``start`` to ``end``, summarised (all count as busy: the
        window is the work); None where none fell in it."""
        inside = [s for s in self.samples if start <= s.at <= end]
        return summary(inside, busy_w=float("-inf")) if inside else None


def clock_fields(s: Summary | None) -> dict[str, float]:
    """A results row's clock fields: the medians, the power cap's share of the samples and
    their count; {} without samples."""
    if s is None:
        return {}
    return {"sm_mhz": s.sm_mhz[1], "power_w": s.power_w[1],
            "power_cap_share": sum(share for reason, share in s.reasons.items()
                                   if "software power cap" in reason),
            "clock_samples": float(s.samples)}
