"""A bad setting stops the gateway and the launcher with one line per problem, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.settings import settings_or_exit

REPO = Path(__file__).resolve().parents[2]


def test_each_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QA_PORT", "abc")
    monkeypatch.setenv("QA_MAX_SEQ_LEN", "4096")
    with pytest.raises(SystemExit) as stop:
        settings_or_exit()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("invalid configuration:")
    assert "QA_PORT: Input should be a valid integer" in err
    assert "QA_MAX_SEQ_LEN: Input should be less than or equal to 512" in err


def test_a_rule_across_fields_is_reported(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QA_SEQ_BUCKETS", "[128, 1024]")
    with pytest.raises(SystemExit):
        settings_or_exit()
    assert "settings: Value error, seq_buckets must be window lengths in [1, 512]" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("module", ["service", "service.launcher"])
def test_entry_points_exit_2_without_a_traceback(module: str) -> None:
    env = {**os.environ, "QA_PORT": "abc"}
    done = subprocess.run([sys.executable, "-m", module], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "QA_PORT" in done.stderr and "Traceback" not in done.stderr
