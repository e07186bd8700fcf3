"""Interleaved timing rounds for whole-pass A/Bs: each round times every variant once, in
turn, so that drift in clocks, temperature and (at the H200's power cap) power hits them
alike; the tools report the median of the rounds (``ab_replay``, ``bucket_padding``,
``large_m_configs``, ``cutlass_ffn1``). Also the one stream and capture helper for the
CUDA graphs the tools time, and the command line the batch-1 call tools share."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def batch1_parser(doc: str | None, calls: int, calls_help: str) -> argparse.ArgumentParser:
    """The options of the tools that time one batch-1 call's parts (``host_call``,
    ``launch_cost``): the model, the sequence length, calls per round, rounds and the JSON
    output; each tool adds its own."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-base")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--calls", type=int, default=calls, help=calls_help)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    return p


# timer(fn, reps) -> ms per call of fn, over reps calls
Timer = Callable[[Callable[[], object], int], float]


def engine_parser(doc: str | None, rounds: int, reps: int) -> argparse.ArgumentParser:
    """The options of the tools that time engines of one random-weight model against each
    other (``attn_grid_sweep``, ``bucket_probe``): the model, its dtype, FP8 calibration,
    rounds, calls per round, the commit to record and the JSON output; each tool adds its
    own. :func:`calibrated_engine` builds the engine they describe."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert-base")
    p.add_argument("--dtype", default="fp8")
    p.add_argument("--calibrate", action="store_true", help="static FP8 scales (fp8 only)")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--commit", default="")
    p.add_argument("--out", type=Path, required=True)
    return p


def tool_engine(name: str, dtype: str, options: dict[str, Any],
                calibration: tuple[Any, Any, Any] | None = None,
                repeat_layers: int | None = None) -> tuple[Any, Any]:
    """(engine, HF config) of ``bench_gpu``'s random-weight model ``name`` on the GPU: with
    its first ``repeat_layers`` layers repeated to its depth (``ab_replay.repeated_layers``)
    and, given a ``calibration`` batch (padded ids, mask, token types), static FP8 scales
    from it (fp8 only)."""
    from benchmarks.bench_gpu import make_hf, make_ours

    if calibration is not None and dtype != "fp8":
        raise SystemExit(f"--calibrate needs fp8 (the {name} engine is {dtype})")
    model, cfg = make_hf(name)
    eng = make_ours(model, cfg, dtype=dtype, **options)
    del model
    if repeat_layers is not None:
        from benchmarks.ab_replay import repeated_layers
        from engine.fused.engine import FusedEngine

        eng = FusedEngine(repeated_layers(eng.weights, repeat_layers), "cuda", **options)
    if calibration is not None:
        eng.calibrate(*calibration)
    return eng, cfg


def calibrated_engine(args: argparse.Namespace, **options: Any) -> tuple[Any, Any]:
    """:func:`tool_engine` of :func:`engine_parser`'s model and dtype, calibrated where
    ``args.calibrate`` on 256 random 128-token windows."""
    import numpy as np

    from benchmarks.bench_gpu import random_padded

    calibration = (random_padded(np.random.default_rng(6), 256, 384,
                                 lengths=np.full(256, 128)) if args.calibrate else None)
    return tool_engine(args.model, args.dtype, options, calibration)


@functools.cache
def capture_stream() -> Any:
    """The one stream the tools warm up and capture their timed CUDA graphs on
    (:func:`capture_graph`, for ``attn_backends``, ``bench_gpu.graph_time_ms`` and
    ``cutlass_ffn1``): cuBLASLt keeps a workspace per stream it has run on (32 MiB each),
    and the first call on a stream must come before its capture, so a new stream per
    timing would pile them up."""
    import torch

    return torch.cuda.Stream()


def capture_graph(fn: Callable[[], object], calls: int, warm: int = 3) -> Any:
    """``calls`` calls of ``fn`` as one CUDA graph, captured on :func:`capture_stream`
    after ``warm`` calls there (cuBLASLt's workspace for that stream must exist before the
    capture). The graph keeps ``fn``: replays read the buffers ``fn`` holds, which must not
    be freed (and reused) while the graph lives."""
    import torch

    s = capture_stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    g.captured_fn = fn
    return g


def run_for(fn: Callable[[int], object], seconds: float) -> int:
    """Call ``fn(0)``, ``fn(1)``, ... back to back for ``seconds`` of wall time (the GPU kept
    busy, e.g. until its power limit has settled, or timed by events around it); returns
    the number of calls. The queue is kept short, so the time is the GPU's, not the
    host's; the GPU has finished them all on return."""
    import time

    import torch

    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn(calls)
        calls += 1
        if calls % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return calls


def cuda_ms(fn: Callable[[], object], reps: int) -> float:
    """CUDA-event time of ``reps`` calls of ``fn`` on the current stream, ms per call."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / reps


def event_ms(fn: Callable[[], object], reps: int,
             before: Callable[[], object] | None = None) -> list[float]:
    """CUDA-event time of each of ``reps`` calls of ``fn``, ms, synced after each: the
    device idle before each call, or busy with whatever ``before`` queues ahead of the
    start event (e.g. a sleep kernel, so that the call is submitted before the start is
    stamped)."""
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def idle_ms(fn: Callable[[], object], reps: int) -> float:
    """Median CUDA-event time of one call of ``fn``, the device idle before each: a lone
    call's latency, its launch's host part included (``bench_gpu``'s method), where
    :func:`cuda_ms` lets back-to-back calls overlap launch and drain."""
    import statistics

    return statistics.median(event_ms(fn, reps))


def host_us(fn: Callable[[], object]) -> float:
    """Host time of one call of ``fn`` up to its return (for a launch: before the GPU has
    run it), µs; then a device sync, off the clock."""
    import time

    import torch

    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt * 1e6


def wall_ms(fn: Callable[[], object], reps: int) -> float:
    """Wall-clock time of ``reps`` calls of ``fn`` between two device synchronizations, ms
    per call: what a caller waits for, host work and every stream included."""
    import time

    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / reps


def interleaved(variants: Mapping[str, Callable[[], object]], rounds: int, reps: int,
                warm: int = 1, prepare: Callable[[str], None] | None = None,
                report: Callable[[int, dict[str, float]], None] | None = None,
                timer: Timer = cuda_ms) -> dict[str, list[float]]:
    """Per variant, ms per call of each round: ``prepare(name)`` (if given), ``warm``
    untimed calls (after the previous variant's, caches and clocks are its own again),
    then ``reps`` timed ones. ``report(round, {name: this round's ms})`` after each round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, fn in variants.items():
            if prepare is not None:
                prepare(name)
            for _ in range(warm):
                fn()
            times[name].append(timer(fn, reps))
        if report is not None:
            report(r, {name: t[-1] for name, t in times.items()})
    return times
