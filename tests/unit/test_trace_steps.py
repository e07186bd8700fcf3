"""The kernel-trace arithmetic of ``benchmarks/trace_pass.py`` (no GPU needed)."""

from __future__ import annotations

import pytest

from benchmarks.trace_pass import kind, launch_gap, layer_positions, markdown, steps


def test_kinds_of_kernel_names() -> None:
    assert kind("_gemm_kernel") == "Triton GEMM"
    assert kind("_gemm_tma_kernel") == "Triton GEMM"  # not "cuBLAS" for containing "gemm"
    assert kind("nvjet_sm90_hsh_144x64_64x8_1x2_h_bz_TNN") == "cuBLAS GEMM"
    assert kind("_attn_varlen_kernel") == "attention"
    assert kind("_residual_ln_kernel") == "residual LN"
    assert kind("_stage_kernel") == "copy/fill"
    assert kind("Memcpy DtoD (Device -> Device)") == "copy/fill"


def test_steps_charge_overlap_and_gaps_to_the_later_kernel() -> None:
    """With PDL a kernel starts before its predecessor ends: its step is from that end to
    its own end. A gap before a kernel is charged to it. Steps add up to the span."""
    events = [
        {"name": "_embed_ln_kernel", "ts": 0.0, "dur": 2.0},
        {"name": "_gemm_kernel", "ts": 1.0, "dur": 4.0},      # ends 5: step 3, own 4
        {"name": "_attn_varlen_kernel", "ts": 3.0, "dur": 3.5},  # ends 6.5: step 1.5
        {"name": "_gemm_kernel", "ts": 10.0, "dur": 1.0},     # gap 3.5: step 4.5
    ]
    res = steps(events)
    assert res["span_us"] == pytest.approx(11.0)
    assert res["kernels"] == 4
    by = res["by_kind"]
    assert by["Triton GEMM"]["count"] == 2
    assert by["Triton GEMM"]["step_us"] == pytest.approx(3.0 + 4.5)
    assert by["Triton GEMM"]["own_us"] == pytest.approx(5.0)
    assert by["attention"]["step_us"] == pytest.approx(1.5)
    assert sum(v["step_us"] for v in by.values()) == pytest.approx(res["span_us"])
    assert next(iter(by)) == "Triton GEMM"  # largest step total first


def test_layer_positions_average_each_kernel_of_a_layer() -> None:
    """Two layers of (GEMM, attention) between an embedding and a QA head kernel: each
    position's mean step and own time over the layers; uneven runs give nothing."""
    events = [
        {"name": "_embed_sum_kernel", "ts": 0.0, "dur": 1.0},
        {"name": "_deferred_gemm_kernel", "ts": 0.5, "dur": 3.0},   # step 2.5
        {"name": "_attn_varlen_kernel", "ts": 3.0, "dur": 2.0},     # step 1.5
        {"name": "_deferred_gemm_kernel", "ts": 4.0, "dur": 4.5},   # step 3.5
        {"name": "_attn_varlen_kernel", "ts": 8.0, "dur": 2.5},     # step 2.0
        {"name": "_layernorm_qa_kernel", "ts": 10.0, "dur": 1.0},
    ]
    pos = layer_positions(events, 2)
    assert [q["position"] for q in pos] == ["1 deferred-LN GEMM", "2 attention"]
    assert pos[0]["step_us"] == pytest.approx(3.0) and pos[0]["own_us"] == pytest.approx(3.75)
    assert pos[1]["step_us"] == pytest.approx(1.75) and pos[1]["own_us"] == pytest.approx(2.25)
    assert layer_positions(events, 3) == []


def test_launch_gap_takes_the_last_graph_launch_before_the_pass() -> None:
    """The graph launch that started the pass is the last one before its first kernel; a
    later launch (the next pass) and other runtime calls do not count."""
    events = [
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 100.0, "dur": 5.0},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 190.0, "dur": 2.0},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch_v10000", "ts": 200.0, "dur": 4.5},
        {"cat": "kernel", "name": "_embed_sum_kernel", "ts": 208.0, "dur": 3.0},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 300.0, "dur": 5.0},
    ]
    gap = launch_gap(events, 208.0)
    assert gap == {"launch_api_us": 4.5, "launch_to_first_kernel_us": 8.0}
    assert launch_gap(events, 50.0) is None
    assert launch_gap([e for e in events if e["name"] != "_embed_sum_kernel"
                       and "Graph" not in e["name"]], 208.0) is None


def test_markdown_keeps_the_launch_line_out_of_the_table() -> None:
    """The launch line comes before the kernel table's header: a line between a markdown
    table's header and its rows would end the table there."""
    result = {"model": "bert-base", "shape": "1x128", "options": None, "span_us": 10.0,
              "graph_span_us": 10.0, "kernels": 1,
              "by_kind": {"attention": {"count": 1, "step_us": 10.0, "own_us": 10.0}},
              "launch": {"launch_api_us": 3.0, "launch_to_first_kernel_us": 4.0}}
    lines = markdown([result]).splitlines()
    header = lines.index("| kernel | count | step us | step us each | own us |")
    assert lines[header + 1] == "|---|---|---|---|---|"
    assert lines[header + 2].startswith("| attention |")
    assert any(line.startswith("Graph launch") for line in lines[:header])
