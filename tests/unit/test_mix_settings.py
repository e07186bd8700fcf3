"""``benchmarks/mix_settings.py``'s command line on the CPU: settings are parsed and checked
before any engine is built."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("argv", [
    [],  # no --set: nothing to compare
    ["--set", "baseline:engine.fused.kernels.rows.ROW_TILE_LARGE=(2048, 2)"],  # reserved
    ["--set", "tile:ROW_TILE_LARGE=(2048, 2)"],  # no module
    ["--set", "tile:engine.fused.kernels.rows.ROW_TILE_LARGE"],  # no value
    ["--option", "int8:int8_gemms=ffn_in"],  # not a literal
    ["--option", "baseline:int8_gemms='ffn_in'"],  # reserved
])
def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    from benchmarks import mix_settings

    monkeypatch.setattr("sys.argv", ["mix_settings.py", *argv])
    with pytest.raises(SystemExit) as exc:
        mix_settings.main()
    assert exc.value.code == 2


def test_finish_writes_the_record_and_prints_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from benchmarks.settled import add_mix_args, finish

    p = argparse.ArgumentParser()
    add_mix_args(p)
    out = tmp_path / "sub" / "r.json"
    args = p.parse_args(["--commit", "abc1234", "--out", str(out), "--windows", "8"])
    rows = [{"variant": "baseline", "ms": 10.0, "saving_ms": 0.0, "windows_per_s": 800.0,
             "sm_mhz": 1700.0, "power_w": 690.0},
            {"variant": "tile2k", "ms": 9.0, "saving_ms": 1.0, "windows_per_s": 888.9}]
    result = {"tokens": 1234, "gpu": "NVIDIA H200", "rows": rows}
    finish(args, result)
    assert json.loads(out.read_text()) == result
    shown = capsys.readouterr().out
    assert "abc1234" in shown and "tile2k" in shown and "+10.0%" in shown and "nan" in shown


def test_kernel_moves_against_the_first_variant() -> None:
    """``settled.kernel_moves``: per variant, each kernel's calls or µs less the first
    variant's (kernels on one side only count from 0), unmoved ones left out, the largest
    move first; ``print_kernel_moves`` prints each variant's total and its moves."""
    from benchmarks.settled import kernel_moves

    tables = {
        "baseline": {"ln": {"calls": 48, "us": 5400.0}, "gemm": {"calls": 24, "us": 3150.0}},
        "fold": {"ln": {"calls": 24, "us": 3160.0}, "gemm": {"calls": 24, "us": 3550.0},
                 "quant": {"calls": 24, "us": 1360.0}},
    }
    assert kernel_moves(tables, "calls") == {"baseline": {},
                                             "fold": {"ln": -24, "quant": 24}}
    us = kernel_moves(tables, "us")
    assert list(us["fold"]) == ["ln", "quant", "gemm"]
    assert us["fold"] == {"ln": -2240.0, "quant": 1360.0, "gemm": 400.0}


def test_print_kernel_moves(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.settled import print_kernel_moves

    print_kernel_moves({"a": {"k": {"us": 10.0}}, "b": {"k": {"us": 12.0}}}, "us")
    out = capsys.readouterr().out.splitlines()
    assert out == ["a: 10 us of kernels; ", "b: 12 us of kernels; k +2"]


def test_engine_options() -> None:
    """``--option NAME:keyword=VALUE``: a FusedEngine keyword with a Python literal."""
    from benchmarks.mix_settings import parse_option

    assert parse_option("int8:int8_gemms='attn_out,ffn_in'") == (
        "int8", "int8_gemms", "attn_out,ffn_in")
    assert parse_option("g:max_graph_tokens=0") == ("g", "max_graph_tokens", 0)
    for bad in ("int8", "x:1=2", "x:k=foo"):
        with pytest.raises(ValueError, match="bad option"):
            parse_option(bad)


def test_ordered_variants_label_repeats() -> None:
    """``settled.ordered_variants``: a repeated name is labelled ``name_2``, ``name_3``, ...
    and each variant readies its own name."""
    from benchmarks.settled import ordered_variants

    plan = ordered_variants(["a", "b", "a", "a"], lambda name: lambda x: (name, x))
    assert [label for label, _ in plan] == ["a", "b", "a_2", "a_3"]
    assert [ready()(1) for _, ready in plan] == [("a", 1), ("b", 1), ("a", 1), ("a", 1)]


def test_variant_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``settled.variant_checks``: each variant once (in order), its largest logit
    difference from the reference and its profiled kernels (the profiler needs a GPU, so
    here a table per variant stands in for it)."""
    torch = pytest.importorskip("torch")
    from benchmarks import settled

    tables = {"base": {"ln": {"calls": 2.0, "us": 5.0}},
              "fold": {"ln": {"calls": 1.0, "us": 3.0}, "q": {"calls": 1.0, "us": 1.0}}}
    outs = {"base": torch.zeros(3), "fold": torch.tensor([0.0, -0.5, 0.25])}
    passes: dict[str, int] = {}

    def use(name: str) -> object:
        def run(x: object) -> object:
            passes[name] = passes.get(name, 0) + 1
            return outs[name]
        run.variant = name  # type: ignore[attr-defined]
        return run

    monkeypatch.setattr(settled, "kernel_table",
                        lambda fn, arg, passes=3: tables[fn.variant])
    got = settled.variant_checks(["base", "fold", "base"], use, 1, torch.zeros(3))  # type: ignore[arg-type]
    assert passes == {"base": 1, "fold": 1}  # once each (the profiled pass is stubbed)
    assert got["max_abs_logit_diff"] == {"base": 0.0, "fold": 0.5}
    assert got["kernels_per_pass"] == {"base": 2.0, "fold": 2.0}
    assert got["kernels_changed"] == {"base": {}, "fold": {"ln": -1.0, "q": 1.0}}
    assert got["kernel_us"]["fold"] == {"ln": 3.0, "q": 1.0}
