"""``benchmarks/fp8_aware_summary.py``: rows from a sweep's JSONs, seeds pooled across
re-runs of one recipe, and the declared rule's verdict; then on the recorded v46 runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fp8_aware_summary import load, verdicts

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu-2026-12-06-v46"


def _write(d: Path, name: str, fp32: float, runs: dict[str, float], sum_residual: bool = False) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tag = f"{name}-sum-residual" if sum_residual else name
    (d / f"acc-{tag}-abc1234.json").write_text(json.dumps({
        "reference": {"f1": fp32},
        "runs": [{"scheme": s, "f1": f1, "mean_abs": 0.05} for s, f1 in runs.items()]}))


def test_seeds_pool_across_re_runs_and_both_losses_decide(tmp_path: Path) -> None:
    a, b = tmp_path / "kd-2e-5-1", tmp_path / "kd-2e-5-1-s456"
    _write(a, "aware1", 78.0, {"static:qkv+ffn_in+ffn_out": 77.95, "calibrated": 77.82})
    _write(a, "aware1", 78.0, {"static:qkv+ffn_in+ffn_out": 77.97}, sum_residual=True)
    _write(a, "plain1", 78.0, {"static:qkv+ffn_in+ffn_out": 70.0})  # controls never count
    _write(b, "aware4", 77.9, {"static:qkv+ffn_in+ffn_out": 77.85, "calibrated": 77.90})
    _write(b, "plain1", 78.1, {"static:qkv+ffn_in+ffn_out": 70.0})
    rows = load([a, b])
    assert sorted(r.name for r in rows) == ["aware1", "aware4 (kd-2e-5-1-s456)", "plain1",
                                            "plain1 (kd-2e-5-1-s456)"]
    assert {r.recipe for r in rows} == {"kd-2e-5-1"}
    got = verdicts(rows, shipped=77.9)
    shipped, own, ok, seeds = got["kd-2e-5-1", "default"]
    assert (shipped, own, ok) == (pytest.approx(0.0), pytest.approx(0.05), True)
    assert seeds == 2  # aware1 and aware4, pooled; no plain control
    shipped, own, ok, _ = got["kd-2e-5-1", "all static"]
    assert (shipped, own, ok) == (pytest.approx(0.04), pytest.approx(0.09), True)
    _write(b, "aware5", 77.0, {"calibrated": 77.5})  # better than its own, far under shipped
    assert not verdicts(load([a, b]), shipped=77.9)["kd-2e-5-1", "all static"].room
    assert got["kd-2e-5-1", "sum residual"][1] == pytest.approx(0.03)


def test_the_recorded_runs_give_no_room_to_the_gated_schemes() -> None:
    """v46's record: no recipe gives all four GEMMs static or the sum residual room."""
    dirs = sorted(p for p in RECORDS.iterdir() if p.is_dir())
    got = verdicts(load(dirs), shipped=77.68)
    assert {recipe for recipe, _ in got} == {"ce-2e-5-1", "ce-1e-5-0.3", "kd-1e-5-0.3",
                                             "kd-2e-5-1"}
    assert not any(v.room for (_, scheme), v in got.items() if scheme != "default")
