"""The kernels' per-program timeline (``engine.fused.kernels.timeline``), without a GPU:
its buffer and slots, what each launch wrapper asks of its kernel (the kernels are not
run), and the compiled code with and without ``TRACE`` (sm_90a SASS, compiled here)."""

from __future__ import annotations

import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from benchmarks.attention_sass import code_lines  # noqa: E402
from engine.fused.kernels import attention, deferred, timeline  # noqa: E402
from tests.launch_spy import launches_unrun  # noqa: E402
from tests.sass_tools import (  # noqa: E402
    ffn2_fp8_sass,
    kernel_sass,
    qkv_fp8_sass,
    tools_or_skip,
)

CPU = torch.device("cpu")


def test_slots_follow_launch_order_within_capacity() -> None:
    t = timeline.Timeline(CPU, capacity=10)
    a, b = t.slot("a", 3), t.slot("b", 7)
    assert a.shape == (3, len(timeline.FIELDS)) and b.shape == (7, len(timeline.FIELDS))
    assert a.data_ptr() == t.rows.data_ptr() and b.data_ptr() == t.rows[3].data_ptr()
    assert [(x.name, x.programs, x.first) for x in t.launches] == [("a", 3, 0), ("b", 7, 3)]
    b.fill_(5)
    assert [(x.name, r.shape[0], int(r.sum())) for x, r in t.launch_rows()] == \
        [("a", 3, 0), ("b", 7, 5 * 7 * len(timeline.FIELDS))]
    with pytest.raises(RuntimeError, match="holds 10 program rows"):
        t.slot("c", 1)
    with pytest.raises(ValueError, match="at least one program"):
        t.slot("d", 0)
    assert len(t.launches) == 2


def test_recording_is_scoped_and_exclusive() -> None:
    assert timeline.trace_slot("x", (4,)) is None
    t = timeline.Timeline(CPU, capacity=128)
    with timeline.recording(t):
        assert timeline.trace_slot("x", (2, 12, 4)).shape == (96, len(timeline.FIELDS))
        assert timeline.trace_slot("empty", (0,)) is None  # an empty grid gets no rows
        with pytest.raises(RuntimeError, match="already recording"), \
                timeline.recording(timeline.Timeline(CPU, capacity=1)):
            pass
    assert [(x.name, x.programs) for x in t.launches] == [("x", 96)]
    assert timeline.trace_slot("x", (4,)) is None
    with pytest.raises(KeyError), timeline.recording(t):  # left on an error too
        raise KeyError
    assert timeline.trace_slot("x", (4,)) is None


def _check(seen: list[tuple[Any, dict[str, Any]]], t: Any, names: list[str]) -> None:
    """The launches ``seen``, given their slots in order: named ``names``, the rows of
    their grids' programs, at their slots' places."""
    import math

    assert [x.name for x in t.launches] == names
    assert len(seen) == len(t.launches)
    for (grid, kwargs), launch in zip(seen, t.launches, strict=True):
        assert launch.programs == math.prod(grid)
        assert kwargs["TRACE"] is True
        assert kwargs["trace_ptr"].data_ptr() == t.rows[launch.first].data_ptr()
        assert kwargs["trace_ptr"].shape == (launch.programs, len(timeline.FIELDS))


def test_gemm_launches_ask_for_their_programs_rows() -> None:
    """Each kind of the deferred layer's GEMM, named by its role there."""
    m, k, n = 128, 192, 80
    x = torch.zeros((m, k), dtype=torch.float16)
    w = torch.zeros((n, k), dtype=torch.float16)
    stats = torch.zeros((m, 2))
    t = timeline.Timeline(CPU, capacity=4096)

    def residual(**kw: Any) -> None:
        deferred.residual_linear(
            x, torch.zeros((n, k), dtype=torch.float16), torch.zeros(n), x[:, :n].clone(),
            stats, torch.ones(n), torch.zeros(n), 1e-5, torch.zeros((m, 2)), **kw)

    with launches_unrun(deferred, "_deferred_gemm_kernel") as seen:
        deferred.folded_linear(x, w, torch.zeros(n), None, stats, 1e-5)
        (_, off), = seen
        seen.clear()
        with timeline.recording(t):
            deferred.folded_linear(x, w, torch.zeros(n), None, stats, 1e-5)
            deferred.folded_linear(x, w, torch.zeros(n), None, stats, 1e-5, act="gelu")
            residual()
            residual(out=torch.zeros((m, n)), out16=torch.zeros((m, n), dtype=torch.float16),
                     counters=torch.zeros(64, dtype=torch.int32), splits=3,
                     config=(64, 32, 32, 4, 2))
    assert off["TRACE"] is False and off["trace_ptr"] is w
    assert seen[-1][0] == (2 * 3, 3)  # 64x32 tiles of 128x80, 3 K splits
    _check(seen, t, ["QKV", "FFN1", "out-projection", "FFN2"])


def test_attention_asks_for_its_grids_rows() -> None:
    heads, d = 4, 64
    qkv = torch.zeros((100, 3 * d), dtype=torch.float16)
    cu = torch.tensor([0, 40, 100], dtype=torch.int32)
    t = timeline.Timeline(CPU, capacity=1024)
    with launches_unrun(attention, "_attn_varlen_kernel") as seen, timeline.recording(t):
        attention.attention_varlen(qkv, torch.zeros(3 * d), cu, 64, 2, heads)
    _check(seen, t, ["attention"])
    assert t.launches[0].programs == 1 * 2 * heads  # one 64-query block, 2 sequences


def test_embeddings_and_head_ask_for_their_rows_and_keep_the_logits_apart() -> None:
    n, d = 20, 32
    ids = torch.zeros(n, dtype=torch.int32)
    emb = torch.zeros((50, d), dtype=torch.float16)
    z, z16, stats = torch.zeros((n, d)), torch.zeros((n, d), dtype=torch.float16), torch.zeros(
        (n, 2))
    t = timeline.Timeline(CPU, capacity=1024)
    with launches_unrun(deferred, "_embed_sum_kernel") as embeds, \
            launches_unrun(deferred, "_layernorm_qa_kernel") as heads:
        with timeline.recording(t):
            deferred.embed_sum(ids, ids, ids, emb, emb, emb, z, z16, stats)
            deferred.layernorm_qa(z16, torch.ones(d), torch.zeros(d), 1e-5,
                                  torch.zeros((2, d)), torch.zeros(2))
        deferred.layernorm_qa(z16, torch.ones(d), torch.zeros(d), 1e-5, torch.zeros((2, d)),
                              torch.zeros(2))
    _check(embeds + heads[:1], t, ["embeddings", "LN + QA head"])
    # Off, the head's unused trace argument is not the logits (a graph's output argument
    # is found by its address: ``graph_args.pointer_arg``).
    assert heads[1][1]["TRACE"] is False and heads[1][1]["trace_ptr"] is z16


# --------------------------------------------------------------------------- the code

_TIMER = re.compile(r"SR_GLOBALTIMERLO|SR_CLOCKLO|SR_VIRTUALSMID")


def _gemm_sass(trace: bool) -> str:
    """FFN2's launch of the FP8 deferred layer compiled for sm_90a."""
    return ffn2_fp8_sass(TRACE=trace)[0]


def test_trace_off_compiles_no_timer_and_on_stamps_around_the_wait() -> None:
    """Off: no timer, clock or SM-id read in the kernel's code. On: the start stamp
    before anything else (the L2 prefetch), the second right after the PDL wait
    (``ACQBULK``) and the release, the product mark after the last wait on the tensor
    cores, the epilogue mark before the tile's first atomic add, the counted mark after
    the tile counter's atomic, the end after the fix-up's last atomic (its row sums)."""
    tools_or_skip()
    assert not _TIMER.search(_gemm_sass(False))
    code = code_lines(_gemm_sass(True))
    at = {key: [i for i, line in enumerate(code) if key in line]
          for key in ("SR_GLOBALTIMERLO", "SR_CLOCKLO", "SR_VIRTUALSMID", "ACQBULK",
                      "UBLKPF", "ATOMG", "REDG", "WARPGROUP.DEPBAR")}
    assert len(at["SR_GLOBALTIMERLO"]) == 6 and len(at["SR_CLOCKLO"]) == 3
    assert len(at["SR_VIRTUALSMID"]) == 1 and len(at["ACQBULK"]) == 1
    assert len(at["ATOMG"]) == 1  # the tile counter; the adds are reductions (REDG)
    first, waited, product, epilogue, counted, end = at["SR_GLOBALTIMERLO"]
    assert first < min(at["UBLKPF"])
    assert at["ACQBULK"][0] < waited < at["ACQBULK"][0] + 4
    assert max(at["WARPGROUP.DEPBAR"]) < product < epilogue < min(at["REDG"])
    assert at["ATOMG"][0] < counted < at["ATOMG"][0] + 16
    assert end > max(at["REDG"])


def test_stored_gemm_marks_the_product_then_the_output_before_its_stores() -> None:
    """QKV's launch (one K slice, its output stored whole, no counter): the product mark
    after the last tensor-core wait, the epilogue mark (the counted one is the same
    stamp: no timer read of its own) before the output's first store, the end after its
    last."""
    tools_or_skip()
    code = code_lines(qkv_fp8_sass(TRACE=True)[0])
    at = {key: [i for i, line in enumerate(code) if key in line]
          for key in ("SR_GLOBALTIMERLO", "WARPGROUP.DEPBAR", "STG.E")}
    _, _, product, epilogue, end = at["SR_GLOBALTIMERLO"]  # (start, wait)
    outputs = [i for i in at["STG.E"] if i < end]  # before the timeline row's stores
    assert max(at["WARPGROUP.DEPBAR"]) < product < epilogue < min(outputs)
    assert max(outputs) < end


def _sass_of(kernel: Any, types: dict[str, str], constexprs: dict[str, object],
             divisible: tuple[str, ...] | None = None) -> str:
    """SASS of ``kernel`` for sm_90a (``divisible``: by default its pointers)."""
    pointers = tuple(n for n, t in types.items() if t.startswith("*"))
    return kernel_sass(kernel, types, constexprs,
                       pointers if divisible is None else divisible)[0]


def _embeddings(trace: bool) -> str:
    from engine.fused.kernels.rows import _CU_BLOCK

    types = {n: "*i32" for n in ("ids_ptr", "tt_ptr", "pos_ptr", "cu_src", "cu_dst")}
    types |= {n: "*fp16" for n in ("word_ptr", "posemb_ptr", "type_ptr", "z16_ptr")}
    types |= {"z_ptr": "*fp32", "stats_ptr": "*fp32", "z8_ptr": "*fp8e4nv",
              "inv8_ptr": "*fp32", "trace_ptr": "*i64"}
    types |= {n: "i32" for n in ("n_valid", "n_seqs", "n_cu", "n_rows", "D")}
    return _sass_of(deferred._embed_sum_kernel, types,
                    {"BLOCK_D": 64, "ROWS": 4, "USE_PDL": True, "COPY8": True,
                     "CU_BLOCK": _CU_BLOCK, "TRACE": trace})


def _head(trace: bool) -> str:
    types = {n: "*fp16" for n in ("z_ptr", "g_ptr", "b_ptr", "qa_w_ptr", "qa_b_ptr")}
    types |= {"logits_ptr": "*fp32", "trace_ptr": "*i64", "n_rows": "i32",
              "logits_stride": "i32", "D": "i32", "eps": "fp32"}
    return _sass_of(deferred._layernorm_qa_kernel, types,
                    {"BLOCK_D": 64, "ROWS": 4, "USE_PDL": True, "TRACE": trace})


def _attention(trace: bool) -> str:
    """As the engine launches it: pointers and strides divisible by 16 (without, the loads
    compile to scalar ones: ``benchmarks.attention_sass``)."""
    from benchmarks.attention_sass import _DIVISIBLE, _SIGNATURE

    types = {n: t for n, t in _SIGNATURE.items() if t != "constexpr"}
    return _sass_of(attention._attn_varlen_kernel, types,
                    {"HEAD_DIM": 64, "BLOCK_DH": 64, "BLOCK_M": 64, "BLOCK_N": 64,
                     "USE_PDL": True, "PREFETCH": True, "FP8_OUT": False, "TILED": False,
                     "SPLIT": True, "LATE_RELEASE": False, "EARLY_TAIL": True,
                     "TRACE": trace, "OUT8_VEC": 0}, _DIVISIBLE)


@pytest.mark.parametrize(("compile_kernel", "stamps"),
                         [(_embeddings, 3), (_head, 3), (_attention, 5)],
                         ids=["embeddings", "head", "attention"])
def test_every_traced_kernel_compiles_both_ways(compile_kernel: Any, stamps: int) -> None:
    """Each kernel that takes a trace: no timer read off; on, its stamps (start, wait,
    attention's two marks, end) and the SM id, the second after the PDL wait and
    attention's last mark before its output's store."""
    tools_or_skip()
    assert not _TIMER.search(compile_kernel(False))
    code = code_lines(compile_kernel(True))
    timers = [i for i, line in enumerate(code) if "SR_GLOBALTIMERLO" in line]
    (wait,) = [i for i, line in enumerate(code) if "ACQBULK" in line]
    assert len(timers) == stamps and timers[0] < wait < timers[1]
    assert sum("SR_VIRTUALSMID" in line for line in code) == 1
    if stamps == 5:  # attention: its key loop's last tensor-core wait, then the output
        stores = [i for i, line in enumerate(code) if re.search(r"\bSTG\.", line)]
        depbars = [i for i, line in enumerate(code) if "WARPGROUP.DEPBAR" in line]
        assert max(depbars) < timers[2] < timers[3] < min(s for s in stores if s > timers[2])
        assert min(s for s in stores if s > timers[2]) < timers[4]


# ------------------------------------------------------------- the tool's arithmetic


def _rows(programs: list[tuple[int, int, int, int]]) -> Any:
    """Timeline rows from (start, waited, end, sm) in ns; the marks after the wait at the
    wait (as a kernel without them writes them)."""
    import numpy as np

    out = np.zeros((len(programs), len(timeline.FIELDS)), dtype=np.int64)
    at = [timeline.FIELDS.index(f) for f in ("start_ns", "waited_ns", "end_ns", "sm",
                                             "product_ns", "epilogue_ns", "counted_ns")]
    for i, (s, w, e, sm) in enumerate(programs):
        out[i, at] = (s, w, e, sm, w, w, w)
    return out


def test_the_tool_reads_the_fields_where_the_kernels_write_them() -> None:
    from benchmarks import program_timeline as tool

    assert [timeline.FIELDS[i] for i in (tool._START, tool._WAITED, tool._END,
                                         tool._START_CLK, tool._END_CLK, tool._SM,
                                         tool._PRODUCT, tool._EPILOGUE, tool._COUNTED)] == [
        "start_ns", "waited_ns", "end_ns", "start_clk", "end_clk", "sm", "product_ns",
        "epilogue_ns", "counted_ns"]


def test_program_parts_median_and_the_last_program() -> None:
    from benchmarks.program_timeline import program_parts

    rows = _rows([(0, 1000, 5000, 0), (0, 1000, 4000, 1), (0, 1000, 3000, 2)])
    f = {name: i for i, name in enumerate(timeline.FIELDS)}
    # product, epilogue, counted per program (ns); program 0 ends last and finishes a tile
    for i, marks in enumerate([(2000, 2500, 3000), (2200, 2400, 3200), (2100, 2300, 2600)]):
        rows[i, [f["product_ns"], f["epilogue_ns"], f["counted_ns"]]] = marks
    parts = program_parts(rows)
    assert parts["loop"] == pytest.approx(1.1) and parts["epi"] == pytest.approx(0.2)
    assert parts["count"] == pytest.approx(0.5) and parts["finish"] == pytest.approx(0.8)
    assert [parts[f"last_{p}"] for p in ("loop", "epi", "count", "finish")] == \
        pytest.approx([1.0, 0.5, 0.5, 2.0])
    plain = program_parts(_rows([(0, 1000, 3000, 0)]))  # no marks: all of it "finish"
    assert (plain["loop"], plain["finish"], plain["last_finish"]) == (0.0, 2.0, 2.0)


def test_slice_parts_group_programs_by_k_slice_and_the_tiles_last() -> None:
    """Two tiles of 2 K slices (row = tile + slice * tiles), in two launches of the named
    kind: each tile's last program to end is "last"; other launches are left out, and a
    launch that is not whole slices is refused."""
    from benchmarks.program_timeline import slice_markdown, slice_parts

    # slice 0: tiles 0, 1; slice 1: tiles 0, 1. Tile 0 ends last in slice 1, tile 1 in 0.
    rows = _rows([(0, 1000, 3000, 0), (0, 1000, 5000, 1), (0, 1000, 4000, 2),
                  (0, 1000, 2000, 3)])
    other = _rows([(0, 1000, 9000, 0)] * 4)
    groups = slice_parts([("FFN2", rows), ("QKV", other), ("FFN2", rows)], "FFN2", 2)
    assert [(g["split"], g["last"], g["programs"]) for g in groups] == \
        [(0, False, 2), (0, True, 2), (1, False, 2), (1, True, 2)]
    assert [g["finish"] for g in groups] == pytest.approx([2.0, 4.0, 1.0, 3.0])
    assert "| 1 | yes | 2 | 0.00 | 0.00 | 0.00 | 3.00 |" in slice_markdown("FFN2", groups)
    with pytest.raises(ValueError, match="not 3 K slices"):
        slice_parts([("FFN2", rows)], "FFN2", 3)


def test_markdown_lists_the_per_position_means_between_first_and_last() -> None:
    from benchmarks.program_timeline import launch_stats, layer_means, markdown

    names = ["embeddings", "QKV", "FFN2", "QKV", "FFN2", "LN + QA head"]
    launches = [(n, _rows([(1000 * i, 1000 * i + 500, 1000 * i + 900, i)]))
                for i, n in enumerate(names)]

    def tables(text: str) -> list[str]:
        return [line.split("|")[1].strip() for line in text.splitlines()
                if line.startswith("| ") and not line.startswith("| launch")]

    stats = launch_stats(launches)
    text = markdown("t", stats, layer_means(stats, 2), "a note")
    assert tables(text) == ["embeddings", "1 QKV", "2 FFN2", "LN + QA head"] * 2
    assert "a note" in text and "span 5.9 us" in text and "No marks" in text
    for _, rows in launches:  # with marks: the after-the-wait table too
        rows[:, timeline.FIELDS.index("product_ns")] += 200
    stats = launch_stats(launches)
    text = markdown("t", stats, layer_means(stats, 2))
    assert tables(text) == ["embeddings", "1 QKV", "2 FFN2", "LN + QA head"] * 3
    assert "No marks" not in text


def test_launch_stats_from_rows() -> None:
    from benchmarks.program_timeline import launch_stats

    a = _rows([(1000, 1000, 4000, 0), (1500, 1500, 3000, 1)])  # ends 4.0 µs after 1.0
    b = _rows([(2000, 4500, 6000, 0), (3000, 5000, 7000, 0), (5000, 5200, 6500, 2)])
    first, second = launch_stats([("a", a), ("b", b)])
    assert first["step"] == pytest.approx(3.0) and first["handoff"] == 0.0
    assert first["sms"] == 2 and first["stack"] == 1 and first["early"] == 0
    # b, in µs from t0 = 1000 ns: a's last end 3.0; waits return at 3.5, 4.0, 4.2; ends
    # at 5.0, 6.0, 5.5; starts at 1.0, 2.0, 4.0
    assert second["step"] == pytest.approx(3.0)     # 6.0 - 3.0
    assert second["handoff"] == pytest.approx(0.5)  # 3.5 - 3.0
    assert second["waits"] == pytest.approx(0.7)    # 4.2 - 3.5
    assert second["after"] == pytest.approx(1.8)    # 6.0 - 4.2
    assert second["early"] == 2                     # started before 3.0
    assert second["sms"] == 2 and second["stack"] == 2 and second["programs"] == 3


def test_layer_means_by_position() -> None:
    import math

    from benchmarks.program_timeline import _MEANS, layer_means

    def stat(name: str, step: float) -> dict[str, Any]:
        return {**{k: 0.0 for k in _MEANS}, "name": name, "step": step,
                "work_doubled": float("nan")}

    stats = [stat("embeddings", 3.0), stat("QKV", 1.0), stat("attention", 2.0),
             stat("QKV", 3.0), stat("attention", 6.0), stat("LN + QA head", 2.5)]
    means = layer_means(stats, 2)
    assert [m["position"] for m in means] == ["1 QKV", "2 attention"]
    assert [m["step"] for m in means] == [2.0, 4.0]
    assert math.isnan(means[0]["work_doubled"])  # NaN where no layer has any
    assert layer_means(stats, 3) == []  # 4 launches do not cut into 3 layers
    assert layer_means(stats[:-1], 1) == []  # not ending with the head: another path


def test_timer_step_and_clock() -> None:
    from benchmarks.program_timeline import clock_ghz, timer_step_ns

    rows = _rows([(1000, 1032, 3000, 0), (1064, 1064, 4064, 1)])
    rows[:, timeline.FIELDS.index("start_clk")] = (0, 100)
    rows[:, timeline.FIELDS.index("end_clk")] = (4000, 6100)  # 2 GHz over 2 and 3 µs
    assert timer_step_ns([("a", rows)]) == 32
    assert clock_ghz([("a", rows)]) == pytest.approx(2.0)


def test_placement_counts_doubled_programs_and_reused_sms() -> None:
    import math

    from benchmarks.program_timeline import placement

    # SM 3 runs two programs (2 and 3 µs of work), SM 5 one (1 µs); SM 5 ran the launch
    # before too
    rows = _rows([(0, 1000, 3000, 3), (0, 1000, 4000, 3), (0, 1000, 2000, 5)])
    got = placement(rows, {5, 9})
    assert (got["doubled"], got["reused"]) == (2, 1)
    assert got["work_single"] == pytest.approx(1.0)
    assert got["work_doubled"] == pytest.approx(2.5)
    alone = placement(_rows([(0, 1000, 2000, 1)]), set())
    assert (alone["doubled"], alone["reused"]) == (0, 0) and math.isnan(alone["work_doubled"])


def test_hosting_counts_programs_beside_the_next_launchs_early_ones() -> None:
    import math

    from benchmarks.program_timeline import hosting

    # programs on SMs 1, 2, 3 (work 1, 2, 3 µs, ending at 2, 3, 4 µs); the next launch's
    # programs start on SM 1 at 1.5 µs (before the first ends), on SM 2 at 3.5 µs (after
    # the second ends) and on SM 9
    rows = _rows([(0, 1000, 2000, 1), (0, 1000, 3000, 2), (0, 1000, 4000, 3)])
    following = _rows([(1500, 5000, 6000, 1), (3500, 5000, 6000, 2), (0, 5000, 6000, 9)])
    got = hosting(rows, following)
    assert got["host"] == 1
    assert got["work_host"] == pytest.approx(1.0) and got["work_alone"] == pytest.approx(2.5)
    last = hosting(rows, rows[:0])  # the last launch: none after it
    assert last["host"] == 0 and math.isnan(last["work_host"])


def test_saved_figures_are_strict_json() -> None:
    import json
    import math

    from benchmarks.program_timeline import _finite

    rows = _finite([{"name": "a", "work_doubled": math.nan, "step": 1.5, "sms": 3}])
    assert rows == [{"name": "a", "work_doubled": None, "step": 1.5, "sms": 3}]
    json.dumps(rows, allow_nan=False)


def test_a_saved_timeline_reads_back_with_marks_at_the_wait(tmp_path: Any) -> None:
    import gzip
    import json

    from benchmarks.program_timeline import load_recorded

    old = [[10, 20, 30, 0, 0, 0, 4, 0]]  # a row saved before the marks (8 fields)
    saved = {"shape": "s", "set": ["m.X=1"], "per_layer": [{}, {}],
             "launches": [{"name": n, "rows": old} for n in ("e", "a", "b", "a", "b", "h")]}
    path = tmp_path / "timeline_s.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(saved, f)
    title, launches, layers = load_recorded(path)
    assert title == "s (m.X=1)" and layers == 2 and len(launches) == 6
    assert launches[0][1].shape == (1, len(timeline.FIELDS))
    assert launches[0][1][0].tolist() == [10, 20, 30, 0, 0, 0, 4, 0, 20, 20, 20]
    # saved before its report (``main`` writes the rows first): no stats, its layer count
    bare = tmp_path / "timeline_bare.json"
    bare.write_text(json.dumps({"shape": "s", "layers": 3, "launches": saved["launches"]}))
    assert load_recorded(bare)[0] == "s" and load_recorded(bare)[2] == 3


def test_the_recorded_early_tail_pass_shows_its_doubled_programs() -> None:
    """v31's device record (H200, calibrated FP8 BERT-base 2x48): with the early key tail,
    attention's 96 programs ran two to an SM on 60 SMs beside none of QKV's, and pushed
    the out-projection onto 72; with the late load the GEMMs after it had an SM per
    program."""
    from pathlib import Path

    from benchmarks.program_timeline import launch_stats, layer_means, load_recorded

    at = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu-2026-12-01-v31"
    stats, means = {}, {}
    for tail, name in (("late", "timeline_bert-base_2x48_fp8.json.gz"),
                       ("early", "timeline_bert-base_2x48_fp8_early-tail.json.gz")):
        _, launches, layers = load_recorded(at / name)
        stats[tail] = launch_stats(launches)
        means[tail] = {m["position"]: m for m in layer_means(stats[tail], layers)}
    late = means["late"]
    assert [late[k]["sms"] for k in ("3 out-projection", "4 FFN1", "5 FFN2")] == [96] * 3
    attention = [s for s in stats["late"] if s["name"] == "attention"]
    assert [s["doubled"] for s in attention[1:]] == [0] * 11  # all of them in layer 0
    early = means["early"]
    # means over the 12 layers
    assert early["2 attention"]["sms"] < 61 and early["2 attention"]["reused"] == 0
    assert early["3 out-projection"]["sms"] < 73 and early["3 out-projection"]["doubled"] > 40
    assert early["5 FFN2"]["work_doubled"] > early["5 FFN2"]["work_single"] + 1.0
