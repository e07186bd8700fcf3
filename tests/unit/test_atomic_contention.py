"""The case arithmetic and table of ``benchmarks/atomic_contention.py`` (no GPU needed)."""

from __future__ import annotations

import pytest

from benchmarks.atomic_contention import CASES, TILE, table, ways


def test_ways_are_adds_per_address() -> None:
    assert ways(96, 1, 24) == 4  # the deferred FFN2 at 1x128: 24 tiles, 4 K splits
    assert ways(96, 12, 24) == 48  # one FFN kernel: 48 hidden blocks per output tile
    assert ways(96, 12, 1152) == 1


def test_volume_cases_move_the_same_bytes() -> None:
    """The volume_* cases differ only in how many programs add into each address."""
    volume = {n: c[0] * c[1] for n, c in CASES.items() if n.startswith("volume")}
    assert len(set(volume.values())) == 1
    stores = [c for c in CASES.values() if c[3]]
    assert all(c[2] == c[0] * c[1] for c in stores)  # stores never share a tile


def test_table_rates_and_skips_the_empty_launch() -> None:
    row = {"programs": 96, "tiles": 12, "ways": 48.0, "store": False,
           "v4_ops": 96 * 12 * TILE / 4, "net_us": 8.0}
    lines = table({"empty": {**row, "net_us": 0.0}, "volume_48_ways": row,
                   "volume_store": {**row, "ways": 1.0, "store": True, "net_us": 5.0}})
    assert len(lines) == 4
    assert "| volume_48_ways | 96 x 12 | 48 | 8.00 | 147.5 |" in lines
    assert lines[-1].split("|")[3].strip() == "stores"
    assert float(lines[-1].split("|")[5]) == pytest.approx(96 * 12 * TILE / 4 / 5e3, abs=0.05)
