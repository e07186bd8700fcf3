"""The GPU's SM clock and power during timed work, from ``nvidia-smi`` samples.

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

``nvidia-smi`` samples the GPU named by ``gpu`` (:func:`torch_gpu_id` gives the UUID of the
one torch runs on: nvidia-smi numbers GPUs in PCI bus order, CUDA by default fastest
first, so an index can name another GPU); without it, the one ``CUDA_VISIBLE_DEVICES``
names first, else the first it lists (the lent machines have one). Where it is missing
or fails, the work runs unsampled and :attr:`ClockSampler.missing` says why. :func:`read_samples` and
:func:`summary` also read logs written by hand (``plot_power_samples.py`` plots them).
"""

from __future__ import annotations

import csv
import os
import shutil
import statistics
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"
STOP_TIMEOUT_S = 5.0
POWER_CAP = 0x4  # the clock-event reasons' "software power cap" bit
REASONS = {0x1: "idle", POWER_CAP: "software power cap", 0x20: "software thermal",
           0x40: "hardware thermal", 0x80: "hardware power brake"}


@dataclass(frozen=True)
class Sample:
    at: datetime  # the sample's local time, as nvidia-smi prints it
    sm_mhz: float
    power_w: float
    reasons: int  # the clock-event reasons' bit mask


@dataclass(frozen=True)
class Summary:
    samples: int
    busy: int  # samples drawing more than the threshold
    sm_mhz: tuple[float, float, float]  # min, median, max over the busy samples
    power_w: tuple[float, float, float]
    reasons: dict[str, float]  # each clock-event mask's share of the busy samples, in words
    cap_share: float  # the busy samples' share that the software power cap held down


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
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        try:
            out.append(Sample(datetime.strptime(row[at].strip(), "%Y/%m/%d %H:%M:%S.%f"),
                              _number(row[sm]), _number(row[power]),
                              int(row[reasons].strip(), 16)))
        except ValueError:
            continue
    if not out:
        raise ValueError(f"{path} holds no whole sample")
    return out


def _spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def summary(samples: list[Sample], busy_w: float) -> Summary:
    """Over the busy samples (power above ``busy_w``): the SM clock's and the power's
    min / median / max, and the clock-event reasons' shares."""
    busy = [s for s in samples if s.power_w > busy_w]
    if not busy:
        raise ValueError(f"no sample draws more than {busy_w} W")
    reasons = Counter(s.reasons for s in busy)
    return Summary(len(samples), len(busy), _spread([s.sm_mhz for s in busy]),
                   _spread([s.power_w for s in busy]),
                   {describe(mask): n / len(busy) for mask, n in reasons.most_common()},
                   sum(s.reasons & POWER_CAP != 0 for s in busy) / len(busy))


def describe(mask: int) -> str:
    """A clock-event mask in words: ``0x4`` -> ``'software power cap'``, ``0`` -> ``'none'``."""
    if mask == 0:
        return "none"
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return " + ".join(names + ([f"0x{rest:x}"] if rest else []))


class ClockSampler:
    """A context manager: ``nvidia-smi`` runs while the block does; its samples are read
    on exit into :attr:`samples`, for :meth:`between` to summarise by time."""

    def __init__(self, interval_ms: int = 100, smi: str | None = None,
                 gpu: str | None = None) -> None:
        if interval_ms < 1:
            raise ValueError(f"interval_ms must be >= 1, not {interval_ms}")
        self.interval_ms = interval_ms
        self.smi = smi
        self.gpu = gpu
        self.samples: list[Sample] = []
        self.missing: str | None = None  # why there are no samples
        self._proc: subprocess.Popen[bytes] | None = None
        self._path: Path | None = None

    def command(self) -> list[str] | None:
        exe = self.smi or shutil.which("nvidia-smi")
        if exe is None:
            return None
        cmd = [exe, f"--query-gpu={QUERY}", "--format=csv", "-lms", str(self.interval_ms)]
        gpu = self.gpu or os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        return [*cmd, "-i", gpu] if gpu else cmd

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
        window is the work); None where none fell in it. Only after the block: the samples
        are read when it ends, so asking inside it raises rather than answer None."""
        if self._proc is not None:
            raise RuntimeError("ClockSampler.between: the samples are read when the block "
                               "ends; keep the windows and summarise them after it")
        inside = [s for s in self.samples if start <= s.at <= end]
        return summary(inside, busy_w=float("-inf")) if inside else None


def torch_gpu_id(device: int | None = None) -> str | None:
    """nvidia-smi's id (``GPU-<uuid>``) of the CUDA device torch runs on (its current one
    by default); None where torch has no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(
        torch.cuda.current_device() if device is None else device)
    return f"GPU-{props.uuid}"


def clock_fields(s: Summary | None) -> dict[str, float]:
    """A results row's clock fields: the medians, the power cap's share of the samples and
    their count; {} without samples."""
    if s is None:
        return {}
    return {"sm_mhz": s.sm_mhz[1], "power_w": s.power_w[1], "power_cap_share": s.cap_share,
            "clock_samples": float(s.samples)}
