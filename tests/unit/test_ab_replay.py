"""Argument parsing of the GPU benchmark tools (`ab_replay.py`, shape lists; no GPU needed)."""

from __future__ import annotations

import argparse

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
