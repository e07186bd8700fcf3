"""``benchmarks/mix_settings.py``'s command line on the CPU: settings are parsed and checked
before any engine is built."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv", [
    [],  # no --set: nothing to compare
    ["--set", "baseline:engine.fused.kernels.rows.ROW_TILE_LARGE=(2048, 2)"],  # reserved
    ["--set", "tile:ROW_TILE_LARGE=(2048, 2)"],  # no module
    ["--set", "tile:engine.fused.kernels.rows.ROW_TILE_LARGE"],  # no value
])
def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    from benchmarks import mix_settings

    monkeypatch.setattr("sys.argv", ["mix_settings.py", *argv])
    with pytest.raises(SystemExit) as exc:
        mix_settings.main()
    assert exc.value.code == 2
