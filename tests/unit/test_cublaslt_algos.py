"""``engine.fused.cublaslt_algos``, ``cublaslt_table`` and the tuned-table side of
``cublaslt`` and ``benchmarks/cublaslt_search.py``: what needs no GPU (the search itself,
and a tuned plan's outputs, are checked in tests/gpu)."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import cublaslt_search
from engine.fused import cublaslt, cublaslt_algos, cublaslt_table
from engine.fused.cublaslt_algos import AlgoConfig
from engine.fused.cublaslt_table import TableKey


def _entry(plan: str, config: AlgoConfig, gpu: str = "NVIDIA H200", version: int = 130000,
           **extra: object) -> dict[str, object]:
    return {"gpu": gpu, "cublaslt_version": version, "plan": plan, "config": config.to_json(),
            **extra}


def test_config_json_round_trip_and_unknown_fields() -> None:
    c = AlgoConfig(66, tile=20, stages=35, splitk=4, reduction=2, cluster=3)
    assert AlgoConfig.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert AlgoConfig.from_json({"algo_id": 5}) == AlgoConfig(5)
    with pytest.raises(ValueError, match="unknown AlgoConfig fields"):
        AlgoConfig.from_json({"algo_id": 5, "tiles": 3})


def test_table_loads_entries_by_gpu_version_and_plan(tmp_path: Path) -> None:
    a, b = AlgoConfig(66, splitk=2, reduction=2), AlgoConfig(70, tile=18)
    path = tmp_path / "t.json"
    path.write_text(json.dumps([_entry("m=384", a, us=3.1), _entry("m=384", b, gpu="other")]))
    table = cublaslt_table.load_table(path)
    assert table == {TableKey("NVIDIA H200", 130000, "m=384"): a,
                     TableKey("other", 130000, "m=384"): b}
    assert cublaslt_table.load_table(tmp_path / "absent.json") == {}


def test_find_prefers_the_exact_plan_then_a_row_range(tmp_path: Path) -> None:
    """Eager passes make a plan per token count: an entry may name its rows as an inclusive
    range, used for plans inside it whose other fields match, after an exact entry."""
    exact, ranged, other = AlgoConfig(1), AlgoConfig(2), AlgoConfig(3)
    path = tmp_path / "t.json"
    path.write_text(json.dumps([_entry("m=20000-40000,n=8", ranged), _entry("m=30000,n=8", exact),
                                _entry("m=20000-40000,n=9", other),
                                _entry("m=20000-40000,n=8", other, version=1)]))
    table = cublaslt_table.load_table(path)

    def find(plan: str) -> AlgoConfig | None:
        return cublaslt_table.find(table, TableKey("NVIDIA H200", 130000, plan))

    assert find("m=30000,n=8") == exact
    assert [find(f"m={m},n=8") for m in (19999, 20000, 31234, 40000, 40001)] == [
        None, ranged, ranged, ranged, None]
    assert find("m=30001,n=9") == other and find("m=30001,n=10") is None


def test_a_plans_gemm_is_every_field_but_the_rows() -> None:
    """What a row-range entry answers for, and what ``gemm_settled``'s variants and
    cuBLASLt's refusal warnings are keyed by: the same for exact rows and a range, and
    apart for 16-bit and FP8 operands of one shape."""
    fp8 = "n=1024,k=1024,out=float16,bias=None,fast_accum=False"
    assert cublaslt_table.gemm(f"m=384,{fp8}") == fp8
    assert cublaslt_table.gemm(f"m=20480-65536,{fp8}") == fp8
    assert cublaslt_table.gemm(f"m=384,{fp8},operands=float16") != fp8


@pytest.mark.parametrize(("text", "message"), [
    ("{}", "JSON list"),
    ("[{", "Expecting"),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "p"}]', "entry 0: KeyError"),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "p", "config": {"tile": 1}}]', "entry 0"),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "m=9-8,n=1", "config": {"algo_id": 1}}]',
     "empty row range"),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "n=1", "config": {"algo_id": 1}}]',
     "does not start with m="),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "m= 384,n=1", "config": {"algo_id": 1}}]',
     "does not start with m="),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "m=-5-9,n=1", "config": {"algo_id": 1}}]',
     "does not start with m="),
    ('[{"gpu": "g", "cublaslt_version": 1, "plan": "m=1-9,n=1", "config": {"algo_id": 1}},'
     ' {"gpu": "g", "cublaslt_version": 1, "plan": "m=9-20,n=1", "config": {"algo_id": 2}}]',
     "entry 1: .*overlap"),
])
def test_an_unreadable_table_is_ignored_with_a_warning(tmp_path: Path, text: str,
                                                       message: str) -> None:
    """A broken table must not break inference: the heuristic runs (empty table)."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.warns(RuntimeWarning, match=message):
        assert cublaslt_table.load_table(path) == {}


def test_shipped_table_parses() -> None:
    """The repository's table loads, and each entry's plan names exactly the fields of
    ``cublaslt._Key`` but ``tuned`` (a renamed field would make every entry miss)."""
    cublaslt_table._load.cache_clear()
    table = cublaslt_table.load_table()
    assert table, "the shipped table is empty"
    names = [f.name for f in fields(cublaslt._Key) if f.name != "tuned"]
    for key in table:  # e4m3 plans do not name their operands
        expected = names if "operands=" in key.plan else names[:-1]
        assert [part.partition("=")[0] for part in key.plan.split(",")] == expected


def test_key_name_is_every_field_but_tuned() -> None:
    key = cublaslt._Key(384, 4096, 1024, torch.float8_e4m3fn, torch.bfloat16, True, False,
                        False, True, True, tuned=True)
    assert key.name() == ("m=384,n=4096,k=1024,out=float8_e4m3fn,bias=bfloat16,gelu=True,"
                          "x_rows=False,w_rows=False,out_scaled=True,fast_accum=True")
    assert key.name() == cublaslt._Key(*[getattr(key, f) for f in (
        "m", "n", "k", "out", "bias", "gelu", "x_rows", "w_rows", "out_scaled",
        "fast_accum")], tuned=False).name()
    # 16-bit operands are named (last), so their entries never answer an e4m3 GEMM's plan.
    half = cublaslt._Key(47391, 1024, 1024, torch.float16, None, False, False, False, False,
                         False, True, operands=torch.float16)
    assert half.name() == ("m=47391,n=1024,k=1024,out=float16,bias=None,gelu=False,"
                           "x_rows=False,w_rows=False,out_scaled=False,fast_accum=False,"
                           "operands=float16")
    assert cublaslt._half_key(torch.zeros((47391, 1024)).half(),
                              torch.zeros((1024, 1024)).half()) == half
    assert key.fp8 and not half.fp8


def _plan(tuned: bool) -> cublaslt._Plan:
    null = ctypes.c_void_p()
    heuristic = [(ctypes.c_uint64 * 8)(i) for i in (11, 12)]
    plan = cublaslt._Plan(null, null, null, null, null,
                          cublaslt_algos.Types(68, 0, 28, 28, 2, 2), heuristic)
    if tuned:
        plan.tuned = AlgoConfig(99)
        plan.configured[plan.tuned] = cublaslt_algos.Algo((ctypes.c_uint64 * 8)(99))
    return plan


@pytest.mark.parametrize("tuned", [False, True])
def test_first_choice_is_the_tuned_config_and_algo_indexes_the_heuristic(tuned: bool) -> None:
    key = cublaslt._Key(8, 16, 32, torch.float16, None, False, False, False, False, False, tuned)
    plan = _plan(tuned)
    assert cublaslt._choose(plan, key, None, None)[0] == (99 if tuned else 11)
    assert cublaslt._choose(plan, key, 0, None)[0] == 11
    assert cublaslt._choose(plan, key, 1, None)[0] == 12
    with pytest.raises(cublaslt.CublasLtError, match="offers 2 algorithms"):
        cublaslt._choose(plan, key, 2, None)


def test_plans_are_kept_least_recently_used_first_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan cache holds ``MAX_PLANS`` plans and destroys the least recently used beyond
    them (eager passes make a plan per batch size); a plan used again is kept."""
    made: list[int] = []
    destroyed: list[int] = []
    plans = {m: _plan(False) for m in range(5)}
    monkeypatch.setattr(cublaslt, "_PLANS", type(cublaslt._PLANS)())
    monkeypatch.setattr(cublaslt, "MAX_PLANS", 2)
    monkeypatch.setattr(cublaslt, "_new_plan", lambda key: made.append(key.m) or plans[key.m])
    monkeypatch.setattr(cublaslt, "_destroy",
                        lambda plan: destroyed.append(next(m for m, p in plans.items()
                                                           if p is plan)))

    def key(m: int) -> cublaslt._Key:
        return cublaslt._Key(m, 16, 32, torch.float16, None, False, False, False, False,
                             False, True)

    for m in (0, 1, 0, 2, 0, 1):
        assert cublaslt._plan(key(m)) is plans[m]
    assert made == [0, 1, 2, 1]  # 0 was used again before 2 came, so 1 went, then 2
    assert destroyed == [1, 2]
    assert list(cublaslt._PLANS) == [key(0), key(1)]
    monkeypatch.setattr(cublaslt, "MAX_PLANS", 0)  # still keeps the plan it returns
    assert cublaslt._plan(key(3)) is plans[3] and list(cublaslt._PLANS) == [key(3)]
    assert destroyed == [1, 2, 0, 1]


def test_search_arguments() -> None:
    args = cublaslt_search.parse_args([])
    assert args.tokens == [384] and args.gemms == "qkv,out,ffn1,ffn2" and args.table is None
    args = cublaslt_search.parse_args(["--tokens", "256", "--tokens", "384", "--table",
                                       "--gemms", "ffn2"])
    assert args.tokens == [256, 384] and str(args.table) == "DEFAULT"
    with pytest.raises(SystemExit):
        cublaslt_search.parse_args(["--gemms", "ffn3"])


def test_sample_keeps_the_heuristic_first_and_bounds_the_rest() -> None:
    cands = [AlgoConfig(i) for i in range(100)]
    heur = [AlgoConfig(7), AlgoConfig(500)]
    out = cublaslt_search.sample(cands, heur, 10)
    assert out[:2] == heur and len(out) == 12 and len(set(out)) == 12
    assert out == cublaslt_search.sample(cands, heur, 10)  # seeded
    assert cublaslt_search.sample(cands, heur, 1000) == heur + [c for c in cands if c != heur[0]]


def test_write_table_replaces_overlapping_row_ranges(tmp_path: Path) -> None:
    """A new row-range entry replaces the same GEMM's ranges it overlaps (which would
    otherwise make the table unreadable), and nothing else."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps([_entry("m=20480-65536,n=8", AlgoConfig(1)),
                                _entry("m=100-200,n=8", AlgoConfig(2)),
                                _entry("m=16384-65536,n=9", AlgoConfig(3)),
                                _entry("m=30000,n=8", AlgoConfig(4))]))
    cublaslt_search._write_table(path, [_entry("m=16384-65536,n=8", AlgoConfig(5))])
    got = {e["plan"]: e["config"]["algo_id"] for e in json.loads(path.read_text())}
    assert got == {"m=100-200,n=8": 2, "m=16384-65536,n=9": 3, "m=30000,n=8": 4,
                   "m=16384-65536,n=8": 5}
    assert len(cublaslt_table.parse(json.loads(path.read_text()), "t")) == 4


def test_write_table_replaces_only_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    old = [_entry("m=384", AlgoConfig(1)), _entry("m=256", AlgoConfig(2)),
           _entry("m=384", AlgoConfig(3), version=1)]
    path.write_text(json.dumps(old))
    cublaslt_search._write_table(path, [_entry("m=384", AlgoConfig(9), us=2.0)])
    got = {(e["plan"], e["cublaslt_version"]): e["config"]["algo_id"]
           for e in json.loads(path.read_text())}
    assert got == {("m=384", 130000): 9, ("m=256", 130000): 2, ("m=384", 1): 3}


class _FakeLib:
    """Functions set as attributes, as ctypes exposes a library's."""


def _fake_lt(caps: dict[int, dict[str, Any]], accept: Callable[[int, dict[int, int]], bool]) -> Any:
    """A stand-in for libcublasLt's algorithm API (the ctypes calls ``candidates`` makes):
    algorithms ``caps`` (algo ID -> tiles, splitk, reduction_mask, custom_max), and
    ``accept(algo_id, attrs)`` deciding ``cublasLtMatmulAlgoCheck`` from the attributes
    set (config attribute enum -> value). An algorithm's ID sits in ``data[0]``'s low bits,
    its cluster shape (attribute 8) above them, attributes 1-7 in ``data[1..7]``."""
    cap_values = {0: "splitk", 1: "reduction_mask", 2: "swizzle", 7: "custom_max"}

    def get_ids(handle, *args):  # type: ignore[no-untyped-def]
        ids, count = args[-2], args[-1]._obj
        for i, a in enumerate(caps):
            ids[i] = a
        count.value = len(caps)
        return 0

    def init(handle, *args):  # type: ignore[no-untyped-def]
        args[-1]._obj.data[0] = args[-2]
        return 0

    def cap(algo, attr, buf, size, written):  # type: ignore[no-untyped-def]
        c = caps[algo._obj.data[0] & 0xFFFF]
        if attr in cap_values:
            buf._obj.value = c.get(cap_values[attr], 0)
            return 0
        values = c.get({6: "tiles", 13: "stages"}[attr], [])
        if buf is None:
            written._obj.value = 4 * len(values)
        else:
            buf[:len(values)] = values
        return 0

    def set_attr(algo, attr, value, size):  # type: ignore[no-untyped-def]
        data = algo._obj.data
        if attr == 8:
            data[0] = (data[0] & 0xFFFF) | (value._obj.value << 16)
        else:
            data[attr] = value._obj.value
        return 0

    def check(handle, desc, a, b, c, d, algo, res):  # type: ignore[no-untyped-def]
        data = algo._obj.data
        attrs = {i: int(data[i]) for i in range(1, 8)} | {8: int(data[0]) >> 16}
        res._obj.workspaceSize = 0
        return 0 if accept(int(data[0]) & 0xFFFF, attrs) else 15

    lib = _FakeLib()  # hashable, as a ctypes.CDLL is (``_declare`` is cached on it)
    lib.__dict__.update(
        cublasLtMatmulAlgoGetIds=get_ids, cublasLtMatmulAlgoInit=init,
        cublasLtMatmulAlgoCheck=check, cublasLtMatmulAlgoCapGetAttribute=cap,
        cublasLtMatmulAlgoConfigSetAttribute=set_attr,
        cublasLtMatmulAlgoConfigGetAttribute=lambda *a: 0)
    return lib


def test_candidates_grid_unsplit_first_then_splits_of_the_accepted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid's order and bounds, through a stand-in library: every tile x cluster shape
    unsplit, then split-K variants of the accepted ones only; an algorithm that accepts
    none of its first MAX_MISSES configurations is left after them."""
    monkeypatch.setattr(cublaslt_algos, "MAX_MISSES", 3)
    caps = {66: {"tiles": [5, 6], "stages": [36], "splitk": 1, "reduction_mask": 2},
            67: {"tiles": [1, 2, 3, 4], "stages": [0]}}

    def accept(algo_id: int, a: dict[int, int]) -> bool:  # tile 5, clusters 2/3, K split <= 2
        return algo_id == 66 and a[1] == 5 and a[8] in (2, 3) and a[2] <= 2

    report: list[dict[str, Any]] = []
    null = ctypes.c_void_p()
    found = cublaslt_algos.candidates(
        _fake_lt(caps, accept), null, cublaslt_algos.Types(68, 0, 28, 28, 2, 2), null,
        (null,) * 4, 1 << 20, report=report)
    unsplit = [AlgoConfig(66, 5, 36, cluster=c) for c in (2, 3)]
    assert found == unsplit + [replace(c, splitk=2, reduction=2) for c in unsplit]
    n_clusters, n_splits = len(cublaslt_algos.CLUSTERS), len(cublaslt_algos.SPLITS) - 1
    assert [(r["algo_id"], r["checked"], r["accepted"]) for r in report] == [
        (66, 2 * n_clusters + 2 * n_splits, 4), (67, 3, 0)]
