"""The kernels' per-program timeline (``engine.fused.kernels.timeline``) on a CUDA GPU
(skipped without one): a graph captured while recording writes one sane row per program
of every launch at each replay, and computes what an untraced engine computes."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CHECKPOINT = Path(__file__).resolve().parents[2] / "models" / "minilm-l6-squad"
ROLES = ["QKV", "attention", "out-projection", "FFN1", "FFN2"]


def _close(a: Any, b: Any) -> bool:
    # The small path adds FFN2's K splits with float32 atomics: the last bits follow their
    # arrival order (as in test_fused_gpu's staging test).
    return a.shape == b.shape and bool(((a - b).abs() <= 4e-3 * b.abs() + 1e-2).all())


def test_a_recorded_graph_writes_every_programs_row() -> None:
    from engine.fused.encoder import SMALL_BATCH_MAX_TOKENS
    from engine.fused.engine import FusedEngine
    from engine.fused.kernels import timeline

    traced = FusedEngine.from_pretrained(CHECKPOINT, device="cuda", dtype="float16")
    plain = FusedEngine(traced.weights, "cuda")
    # two sequences, neither a whole number of 64-key blocks, within the small-batch path's
    # tokens (encoder.SMALL_BATCH_MAX_TOKENS; above it only attention is traced)
    lengths = [90, 37]
    assert SMALL_BATCH_MAX_TOKENS is not None and sum(lengths) <= SMALL_BATCH_MAX_TOKENS
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device="cuda")
    ids = torch.randint(1000, 30000, (sum(lengths),), dtype=torch.int32, device="cuda")
    pos = torch.cat([torch.arange(n, dtype=torch.int32) for n in lengths]).cuda()
    x = (ids, torch.zeros_like(ids), pos, cu, max(lengths))
    recorder = timeline.Timeline(torch.device("cuda"))
    with torch.inference_mode():
        want = plain._run_device(*x).clone()
        with timeline.recording(recorder):  # the graph's warm-up pass and capture
            first = traced._run_device(*x).clone()
        torch.cuda.synchronize()
        recorder.rows.zero_()
        again = traced._run_device(*x).clone()
        torch.cuda.synchronize()
    assert _close(first, want) and _close(again, want)

    f = {name: i for i, name in enumerate(timeline.FIELDS)}
    written = [(launch, rows.numpy()) for launch, rows in recorder.launch_rows()]
    graph = [(launch, r) for launch, r in written if r[:, f["end_ns"]].any()]
    layers = traced.weights.config.num_layers
    assert [launch.name for launch, _ in graph] == ["embeddings", *ROLES * layers,
                                                    "LN + QA head"]
    assert len(written) > len(graph)  # the warm-up pass's slots: zeroed, not rewritten
    for launch, r in graph:
        assert (r[:, f["program"]] == np.arange(launch.programs)).all(), launch
        assert (r[:, f["start_ns"]] > 0).all(), launch
        assert (r[:, f["start_ns"]] <= r[:, f["waited_ns"]]).all(), launch
        marks = r[:, [f[k] for k in ("waited_ns", "product_ns", "epilogue_ns",
                                      "counted_ns", "end_ns")]]
        assert (marks[:, 1:] >= marks[:, :-1]).all(), launch  # the marks in order
        assert (r[:, f["start_clk"]] <= r[:, f["end_clk"]]).all(), launch
        assert ((r[:, f["sm"]] >= 0) & (r[:, f["sm"]] < 1024)).all(), launch
    # A launch ends after the one before it started (one pass, in order).
    for (_, a), (_, b) in itertools.pairwise(graph):
        assert b[:, f["end_ns"]].max() >= a[:, f["start_ns"]].min()
