"""Argument parsing and helpers of the GPU benchmark tools (no GPU needed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from benchmarks.ab_replay import _variant


def test_variant_is_a_name_and_engine_options() -> None:
    assert _variant('no_prefetch={"prefetch": false}') == ("no_prefetch", {"prefetch": False})
    assert _variant("base={}") == ("base", {})
    assert _variant("base") == ("base", {})  # no options: the engine's defaults
    opts = _variant('tiles={"attention_tiles": [64, 128, 4, 2], "pdl": true}')[1]
    assert opts == {"attention_tiles": (64, 128, 4, 2), "pdl": True}  # tuples, as engines take
    plans = _variant('p={"gemm_plans": {"qkv": [[64, 64, 128, 4, 3, 1], 1]}}')[1]
    assert plans == {"gemm_plans": {"qkv": ((64, 64, 128, 4, 3, 1), 1)}}


@pytest.mark.parametrize("text", ['={"pdl": false}', "x=[1, 2]", 'x={"pdl": fals'])
def test_bad_variants_are_refused(text: str) -> None:
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        _variant(text)


def test_shape_lists_of_the_gpu_benchmarks() -> None:
    """``--shapes``/``--small-shapes`` of bench_gpu, bench_small and trace_pass."""
    from benchmarks.bench_gpu import parse_shapes

    assert parse_shapes("bert-base:1x128,bert-large:32x384") == [
        ("bert-base", 1, 128), ("bert-large", 32, 384)]
    with pytest.raises(ValueError):
        parse_shapes("bert-base:1-128")


def test_settings_are_a_variant_a_module_constant_and_a_literal() -> None:
    from benchmarks.ab_replay import parse_setting

    assert parse_setting("v7:engine.fused.kernels.rows.ROW_TILE_LARGE=(4096, 2)") == (
        "v7", "engine.fused.kernels.rows", "ROW_TILE_LARGE", (4096, 2))
    for bad in ("engine.rows.X=1", "v7:X=1", "v7:engine.rows.X", "v7:engine.rows.X=open()"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            parse_setting(bad)


def test_attention_benchmark_shapes_and_flops() -> None:
    from benchmarks.attn_backends import attention_flops, parse_shape

    assert parse_shape("bert-large:mix256") == ("bert-large", 256, None)
    assert parse_shape("bert-base:1x128") == ("bert-base", 1, 128)
    # QK^T and PV: 2 * s^2 * hidden FLOPs each, per sequence
    assert attention_flops([128, 64], 768) == 4 * 768 * (128**2 + 64**2)


def test_tile_quantization_has_one_scale_per_tile() -> None:
    """``fp8.quantize_tiles`` (the FP8 benchmark's schemes, and the engine's): each 1x128,
    128x128 or whole-row tile gets its own amax/448 scale; dequantized, the tiles are within
    e4m3's relative rounding (2**-4) of their tile maximum. Edge tiles are padded."""
    import torch

    from engine.fused.fp8 import quantize_tiles

    x = torch.randn(200, 300)
    x[:, 5] = 200.0  # an outlier channel inflates only its own blocks' scales
    for rows, cols in ((1, 128), (128, 128), (1, 300)):
        q, scale = quantize_tiles(x, rows, cols)
        assert q.shape == (200, 300)
        assert scale.shape == (-(-200 // rows), -(-300 // cols))
        s = scale.repeat_interleave(rows, 0)[:200].repeat_interleave(cols, 1)[:, :300]
        err = (q.float() * s - x).abs() / (s * 448)
        assert float(err.max()) <= 2**-4
    _, s_blocks = quantize_tiles(x, 1, 128)
    assert float(s_blocks[:, 1:].max()) < float(s_blocks[:, 0].min())  # outlier kept to block 0


@pytest.mark.parametrize("setting", [
    "other:engine.fused.kernels.rows.ROW_TILE_LARGE=(4096, 2)",  # no such variant
    "v7:engine.fused.kernels.rows.ROW_TILE_LRAGE=(4096, 2)",  # a typo: no such constant
])
def test_settings_that_would_change_nothing_are_refused(
        setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before any GPU work: otherwise the A/B compares identical graphs."""
    from benchmarks import ab_replay

    monkeypatch.setattr("sys.argv", ["ab_replay.py", "--variant", "v7={}", "--set", setting])
    with pytest.raises(SystemExit) as exc:
        ab_replay.main()
    assert exc.value.code == 2


def test_gemm_benchmarks_share_one_command_line() -> None:
    """``cublaslt_fp8``, ``fp8_gemm_tuning`` and ``fp8_scaling`` parse through ``gemm_cli``."""
    from pathlib import Path

    from benchmarks import gemm_cli

    args = gemm_cli.parse_args("doc", 47392, ["--replays", "3", "--out", "r.json"])
    assert (args.tokens, args.replays, args.out) == (47392, 3, Path("r.json"))
    bench = Path(gemm_cli.__file__).parent
    for name in ("cublaslt_fp8.py", "fp8_gemm_tuning.py", "fp8_scaling.py"):
        assert "gemm_cli.parse_args(__doc__" in (bench / name).read_text(), name


def test_bucket_padding_arguments() -> None:
    from benchmarks import bucket_padding

    args = bucket_padding.parse_args(["--windows", "16,256", "--per-octave", "8,64"])
    assert args.windows == [16, 256] and args.per_octave == [8, 64] and args.dtype == "fp8"
    for bad in (["--windows", "0"], ["--per-octave", "8,-1"], ["--dtype", "int8"]):
        with pytest.raises(SystemExit):
            bucket_padding.parse_args(bad)


def test_large_m_configs_reads_the_recorded_search() -> None:
    """The v12 search at 49,152 tokens: each GEMM's (N, K, GELU) from its plan string and
    its best configuration (what ``large_m_configs`` A/Bs in whole passes)."""
    from benchmarks import large_m_configs

    best = large_m_configs.searched(large_m_configs.DEFAULT_SEARCH)
    assert {g: v["shape"] for g, v in best.items()} == {
        "qkv": (3072, 1024, False), "out": (1024, 1024, False), "ffn1": (4096, 1024, True),
        "ffn2": (1024, 4096, False)}
    # The shipped table's row-range entry is what table_entries makes of the recorded
    # runs: QKV's configuration won every round at 128, 192 and 256 windows; FFN1's and
    # FFN2's did not (FFN1's kernel was faster inside the pass, the pass was not).
    runs = [json.loads((large_m_configs.REPO / "benchmarks"
                        / f"gpu-2026-11-30-v13-large-m-configs-{w}.json").read_text())
            for w in (128, 192, 256)]
    three = {g: v for g, v in best.items() if g != "out"}
    made = large_m_configs.table_entries(runs, three, (20480, 65536), 0.01)
    table = json.loads((large_m_configs.REPO / "engine" / "fused"
                        / "cublaslt_tuned.json").read_text())
    ranged = [e for e in table if "-" in e["plan"].partition(",")[0] and e["gpu"] == "NVIDIA H200"]
    assert ranged == made and [e["plan"][:28] for e in made] == ["m=20480-65536,n=3072,k=1024,"]
    # All static: the out-projection's configuration lost a round to the heuristic.
    static = json.loads((large_m_configs.REPO / "benchmarks"
                         / "gpu-2026-11-30-v13-large-m-configs-static-all-256.json").read_text())
    assert [e["plan"][:20] for e in large_m_configs.table_entries([static], best, (1, 2), 0.01)
            ] == ["m=1-2,n=3072,k=1024,"]
    assert large_m_configs.table_entries(runs, three, (1, 2), 0.03) == []  # gains < 3%
    args = large_m_configs.parse_args(["--static-all", "--windows", "128", "--rows", "9-10"])
    assert args.static_all and args.windows == 128 and args.rows == (9, 10)
    assert large_m_configs.parse_args([]).rows is None  # from the smallest batch measured
    for bad in ("10-9", "0-5", "5", "a-b"):
        with pytest.raises(SystemExit):
            large_m_configs.parse_args(["--rows", bad])


def test_table_entries_need_every_round_faster() -> None:
    """A configuration whose median wins by 5% but one of whose rounds is no faster than
    the heuristic's fastest gets no entry: the rounds overlap."""
    from benchmarks import large_m_configs

    best = {g: v for g, v in large_m_configs.searched(large_m_configs.DEFAULT_SEARCH).items()
            if g == "qkv"}

    def run(rounds: list[float]) -> dict[str, object]:
        return {"gpu": "g", "cublaslt_version": 1, "date": "d", "commit": "c", "windows": 8,
                "tokens": [100, 120], "variants": {
                    "heuristic": {"round_ms": [10.0, 10.0, 9.0]},
                    "searched_qkv": {"round_ms": rounds}}}

    assert large_m_configs.table_entries([run([9.4, 9.5, 9.45])], best, (1, 2), 0.01) == []
    made = large_m_configs.table_entries([run([8.5, 8.6, 8.9])], best, (1, 2), 0.01)
    assert [e["measured"] for e in made] == [
        {"8 windows (100-120 tokens)": {"heuristic_ms": 10.0, "ms": 8.6}}]



def test_repeated_layers_cycle_the_first_n_layers() -> None:
    """``repeat_layers``: layer i becomes layer i % n, folded, calibrated and e4m3 folded
    copies alike (the same tensors), without the flat storage of distinct layers."""
    import dataclasses

    from benchmarks.ab_replay import repeated_layers

    @dataclasses.dataclass(frozen=True)
    class W:  # the fields repeated_layers touches
        layers: tuple[str, ...]
        folded: tuple[str, ...] | None
        calibrated: tuple[str, ...] | None
        folded8: tuple[str, ...] | None
        flat: object

    w = W(("l0", "l1", "l2", "l3", "l4"), ("f0", "f1", "f2", "f3", "f4"), None,
          ("e0", "e1", "e2", "e3", "e4"), object())
    r = repeated_layers(w, 2)
    assert r.layers == ("l0", "l1", "l0", "l1", "l0")
    assert r.folded == ("f0", "f1", "f0", "f1", "f0")
    assert r.folded8 == ("e0", "e1", "e0", "e1", "e0")
    assert r.calibrated is None and r.flat is None
    assert repeated_layers(w, 5).layers == w.layers
    for bad in (0, 6):
        with pytest.raises(ValueError, match="repeat_layers"):
            repeated_layers(w, bad)


def test_trace_pass_sets_module_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trace_pass.py --set module.ATTR=VALUE``: the constant is set (a literal), and a
    misspelt one or a malformed item is an error, not a silently unchanged trace."""
    from benchmarks.trace_pass import apply_settings
    from engine.fused import graphs

    monkeypatch.setattr(graphs, "MAX_GRAPH_TOKENS", 16384)
    apply_settings(["engine.fused.graphs.MAX_GRAPH_TOKENS=4096"])
    assert graphs.MAX_GRAPH_TOKENS == 4096
    with pytest.raises(AttributeError, match="MAX_GRAPH_TOKEN"):
        apply_settings(["engine.fused.graphs.MAX_GRAPH_TOKEN=4096"])
    with pytest.raises(argparse.ArgumentTypeError):
        apply_settings(["engine.fused.graphs.MAX_GRAPH_TOKENS"])


def test_attention_grid_sweep_ranges_suggestion_and_table() -> None:
    """``attn_grid_sweep``: block ranges, the count it suggests (the fastest, where it
    beats the fewest by more than the margin) and its markdown table."""
    from benchmarks.attn_grid_sweep import markdown, parse_range, suggestion

    assert parse_range("2:5") == [2, 3, 4, 5]
    assert parse_range("2:8:3") == [2, 5, 8]
    assert parse_range("2,4") == [2, 4]
    for bad in ("4:2", "2:8:0", "0,2", "x", "2:3:4:5", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_range(bad)
    rows = [{"variant": "fewest", "blocks": 2, "programs": 48, "ms": 0.276},
            {"variant": "count", "blocks": 3, "programs": 72, "ms": 0.2599},
            {"variant": "count", "blocks": 4, "programs": 96, "ms": 0.2485},
            {"variant": "table", "blocks": 4, "programs": 96, "ms": 0.2487}]
    assert suggestion(rows, 0.01) == 4
    assert suggestion(rows, 0.2) is None  # not 20% faster
    assert suggestion(rows[:1], 0.01) is None
    result = {"model": "bert-base", "dtype": "fp8", "gpu": "H200", "commit": "abc",
              "date": "2026-12-01", "within": 0.01,
              "shapes": {"2x64": {"seqs": 2, "fewest": 2, "table_blocks": 4, "rows": rows,
                                  "suggestion": 4}}}
    text = markdown(result)
    assert "| 4 (table) | 96 | 0.2487 | -9.9% |" in text
    assert "| 2 (fewest) | 48 | 0.2760 | +0.0% |" in text
    assert "over 1%: 4 blocks" in text


def test_bucket_probe_items() -> None:
    """``bucket_probe``: an item is N windows of L tokens in a bucket of S >= N sequences,
    the extra sequences empty (their offsets repeat the token count)."""
    from benchmarks.bucket_probe import cu_seqlens, parse_item

    assert parse_item("2x64@4") == (2, 64, 4)
    assert parse_item("1x128@1") == (1, 128, 1)
    for bad in ("2x64@1", "2x64", "0x64@1", "2-64@2", "2x64@x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_item(bad)
    assert cu_seqlens(2, 64, 4) == [0, 64, 128, 128, 128]
    assert cu_seqlens(1, 128, 1) == [0, 128]


def test_engine_tools_share_one_command_line() -> None:
    """``rounds.engine_parser``: the model, dtype, calibration, rounds, calls per round,
    commit and output of the engine-against-engine tools, with each tool's defaults."""
    from benchmarks.rounds import engine_parser

    args = engine_parser("doc", rounds=5, reps=100).parse_args(["--out", "x.json"])
    assert (args.model, args.dtype, args.calibrate, args.rounds, args.reps, args.commit) == (
        "bert-base", "fp8", False, 5, 100, "")
    with pytest.raises(SystemExit):
        engine_parser("doc", rounds=5, reps=100).parse_args([])  # --out is required
    # Each tool adds its own options to a parser of its own.
    assert engine_parser("doc", 5, 100) is not engine_parser("doc", 5, 100)


def test_process_state_probe_actions() -> None:
    """``process_state_probe``: actions in order, repeats kept, unknown ones refused
    before any engine is built; off CUDA no GPU state is read."""
    import argparse

    from benchmarks.process_state_probe import (
        ACTIONS,
        HF_OPS,
        gpu_state,
        parse_actions,
        parse_shape,
    )

    assert parse_actions("tiny_graph,hf,tiny_graph") == ["tiny_graph", "hf", "tiny_graph"]
    assert set(HF_OPS) <= set(ACTIONS)
    for bad in ("", "tiny_graph,nope", "HF"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_actions(bad)
    assert parse_shape("2x64") == (2, 64)
    for bad in ("128", "0x128", "1xL"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shape(bad)
    import torch

    if not torch.cuda.is_available():
        assert gpu_state() == {}


def test_sweep_scripts_parse_and_name_what_exists() -> None:
    """The device sweeps (``benchmarks/*.sh``) parse as bash, every module constant they
    name in full (``--set [NAME:]module.ATTR=VALUE`` written out, not through a shell
    variable) exists, and the options of every variant written as one single-quoted
    literal (``'NAME={...}'``) are engine options or ``ab_replay``'s own: on the device a
    typo costs a call (ab_replay refuses it only once the call has started). Variants a
    script builds (``out_proj_sweep.sh``'s ``plan``) are not seen."""
    import importlib
    import inspect
    import re
    import subprocess
    from pathlib import Path

    scripts = sorted(Path(__file__).resolve().parents[2].glob("benchmarks/*.sh"))
    assert scripts
    targets: set[tuple[str, str]] = set()
    options: set[str] = set()
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
        text = script.read_text()
        targets |= set(re.findall(r"\b(engine\.fused[\w.]*)\.(\w+)=", text))
        for literal in re.findall(r"'\w+=(\{[^'$]*\})'", text):
            options |= set(json.loads(literal))
    assert ("engine.fused.dispatch", "EARLY_TAIL_E4M3_MAX_SEQS") in targets
    assert ("engine.fused.encoder", "SETTLED_RESIDUAL_GEMMS") in targets
    assert {"calibrate", "early_weights"} <= options  # the literals were found
    pytest.importorskip("triton")
    from benchmarks.ab_replay import OWN_OPTIONS
    from engine.fused.engine import FusedEngine

    known = set(inspect.signature(FusedEngine).parameters) | set(OWN_OPTIONS)
    assert options <= known, sorted(options - known)
    for module, attr in sorted(targets):
        assert hasattr(importlib.import_module(module), attr), f"{module}.{attr}"


def _recorded(version: str, *names: str) -> list[dict[str, Any]]:
    """Recorded ``gemm_settled`` runs: ``benchmarks/gpu-2026-12-06-VERSION/gemm-settled-NAME.json``."""
    from benchmarks import gemm_settled

    return [json.loads((gemm_settled.REPO / "benchmarks" / f"gpu-2026-12-06-{version}"
                        / f"gemm-settled-{name}.json").read_text()) for name in names]


def _shipped_table() -> list[dict[str, Any]]:
    from benchmarks import gemm_settled

    table: list[dict[str, Any]] = json.loads(
        (gemm_settled.REPO / "engine" / "fused" / "cublaslt_tuned.json").read_text())
    return table


def test_gemm_settled_table_entries_are_the_recorded_winners() -> None:
    """The shipped table's H100 row-range entry is what ``gemm_settled.table_entries``
    makes of v43's three recorded runs: QKV's configuration (tile 409) won every settled
    pass in both runs it ran in; tile 20 won all three of its runs by less on average;
    FFN1's tile 29 won the one run it ran in; every other FFN1 and FFN2 configuration lost
    a pass."""
    from benchmarks import gemm_settled

    runs = _recorded("v43", "grid150-a73d647", "grid600-1953461", "grid1300-1953461")
    made = gemm_settled.table_entries(runs, 0.005, 2)
    assert [e for e in _shipped_table() if e["gpu"] == "NVIDIA H100 80GB HBM3"] == made
    assert [(e["plan"][:28], e["config"]["tile"]) for e in made] == [
        ("m=20480-65536,n=3072,k=1024,", 409)]
    # One slower pass in one run disqualifies a configuration everywhere (qkv_1 is tile
    # 409 in the grid600 run).
    slow = json.loads(json.dumps(runs[1]))
    next(r for r in slow["rows"] if r["variant"] == "qkv_1")["ms"] = 40.0
    assert [e["config"]["tile"] for e in gemm_settled.table_entries(
        [runs[0], slow, runs[2]], 0.005, 2)] == [20]
    # With one run enough, FFN1's tile 29 (one run, +0.5%) qualifies too.
    assert sorted((e["plan"][:28], e["config"]["tile"])
                  for e in gemm_settled.table_entries(runs, 0.005, 1)) == [
        ("m=20480-65536,n=3072,k=1024,", 409), ("m=20480-65536,n=4096,k=1024,", 29)]


def test_gemm_settled_out_projection_runs_make_no_entry() -> None:
    """v44's four runs of the 16-bit out-projection (H100): tile 407 gained every run, by
    0.28-0.76% a variant, but some variant in each pair of runs fell under the 0.5% bar
    (runs 1-2: 0.50% just under; runs 3-4: a pass over a baseline, and 0.46%), so neither
    pair makes an entry; at a 0.25% bar both would, with 16-bit plans that name their
    operands."""
    from benchmarks import gemm_settled

    first = _recorded("v44", "out-run1-6d5f0dd", "out-run2-2faeb20")
    second = _recorded("v44", "out-run3-2faeb20", "out-run4-2faeb20")
    assert gemm_settled.table_entries(first, 0.005, 2) == []
    assert gemm_settled.table_entries(second, 0.005, 2) == []
    assert gemm_settled.table_entries(second[:1], 0.0, 1) == []  # run 3: a pass over a baseline

    def picks(made: list[dict[str, Any]]) -> list[tuple[int, bool]]:
        return [(e["config"]["tile"], e["plan"].endswith(",operands=float16")) for e in made]

    assert picks(gemm_settled.table_entries(first, 0.0025, 2)) == [(407, True)]
    assert picks(gemm_settled.table_entries(second[1:], 0.0025, 1)) == [(407, True)]
    assert not any("operands=" in e["plan"] for e in _shipped_table())


def test_gemm_settled_arguments() -> None:
    from benchmarks import gemm_settled

    args = gemm_settled.parse_args(["--gemms", "qkv,ffn2", "--repeat", "2"])
    assert args.gemms == ["qkv", "ffn2"] and args.repeat == 2 and args.entries is None
    args = gemm_settled.parse_args(["--entries", "a.json", "b.json", "--table"])
    assert [p.name for p in args.entries] == ["a.json", "b.json"] and str(args.table) == "DEFAULT"
    assert gemm_settled.parse_args([]).gemms == ["qkv", "ffn1", "ffn2", "out"]
    with pytest.raises(SystemExit):
        gemm_settled.parse_args(["--gemms", "qkv,attention"])
