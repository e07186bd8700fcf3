"""Does what else a process holds change one engine's pass? The same engine's 1x128 graph
timed as the process around it changes.

    python3 benchmarks/process_state_probe.py --model bert-base --dtype fp8 --calibrate \\
        --actions alloc,hf,hf_graph,engine,calibrate,capture --repeat 4 --out probe.json

One engine (``A``) captures the ``--shape`` bucket's graph and is timed alone, then after
each of ``--actions`` in turn, each done ``--repeat`` times and its objects freed
(``gc.collect``, ``torch.cuda.empty_cache``) before A is timed again:

- ``alloc``: ``--dummy-gib`` of device memory allocated, written and freed;
- ``small_op``: one small eager op (an add on 1,024 floats) on the current stream;
- ``many_ops``: 300 such adds;
- ``matmul``: one eager fp16 768x768 matmul (cuBLAS) on the current stream;
- ``linear``, ``sdpa``, ``layernorm``, ``gelu``, ``embedding``: one eager op of an HF
  BERT-base forward at the shape (fp16, BERT-base's sizes whatever ``--model``: a biased
  768x768 linear, attention over 12 heads, ...);
- ``stream``: a new torch stream (the next of torch's pool) and one small op on it;
- ``tiny_graph``: a CUDA graph of one small op captured (on a stream made before A) and
  replayed;
- ``upload``: A's graph uploaded again (``cuGraphUpload`` on the current stream);
- ``hf_build``: a random-weight HF model of the same size built on the GPU, no forward;
- ``hf``: a random-weight HF model of the same size built on the GPU, one eager forward;
- ``hf_graph``: the same, captured as a CUDA graph (bench_gpu's ``HFRunner``) and replayed;
- ``engine``: a fused engine built from such a model (no calibration, no graph);
- ``calibrate``: the same, calibrated (256 windows through its large path);
- ``capture``: the same, calibrated, and the shape's graph captured and replayed;
- ``capture_other``: A captures the graph of another bucket (1x64, 2x64, 4x32, ... in
  turn, from the first again after all six) and replays it once;
- ``recapture``: A drops its graph of the shape and captures it again;
- ``small_eager``: one eager pass of the shape on an engine without CUDA graphs that
  shares A's weights and calibration (the same kernels, launched one by one).

An action may be named more than once: one that moves A's time, then others, shows which
of them move it back. Then A again after ``--cool`` seconds idle. Each phase times A's
calls on device tensors (``_run_device``) and its bare graph replays
(``GraphCache.replay``) back to back (``cuda_ms``; with ``--streams N`` the replays on N
other streams too), and both one at a time with the GPU idle before each (``idle_ms``,
bench_gpu's method; the replay is bench_gpu's "graph alone"), ``--rounds`` rounds each,
median, and reads the GPU's SM clock, temperature and power right after (NVML, where
torch can reach it). Prints a table and writes it as JSON. Phases run one after another,
so drift between them is not separated from their differences. Random weights.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ACTIONS = ("alloc", "small_op", "many_ops", "matmul", "linear", "sdpa", "layernorm", "gelu",
           "embedding", "stream", "tiny_graph", "upload", "hf_build", "hf", "hf_graph", "engine",
           "calibrate", "capture", "capture_other", "recapture", "small_eager")
OTHER_SHAPES = ((1, 64), (2, 64), (4, 32), (1, 32), (8, 16), (1, 16))
# One eager op of an HF BERT-base forward at the probe's shape (fp16), on the current stream.
HF_OPS = ("linear", "sdpa", "layernorm", "gelu", "embedding")


def parse_shape(text: str) -> tuple[int, int]:
    """``"1x128"`` -> (1, 128): windows and tokens each."""
    try:
        batch, seq = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: BxL, e.g. 1x128") from None
    if min(batch, seq) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive sizes")
    return batch, seq


def parse_actions(text: str) -> list[str]:
    """``"tiny_graph,hf,tiny_graph"`` -> the actions in order (repeats kept)."""
    actions = [a for a in text.split(",") if a]
    unknown = sorted(set(actions) - set(ACTIONS))
    if not actions or unknown:
        raise argparse.ArgumentTypeError(
            (f"unknown actions {unknown}" if unknown else "no actions")
            + f": a list of {', '.join(ACTIONS)}")
    return actions


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import (
        calibrated_engine,
        capture_graph,
        capture_stream,
        cuda_ms,
        engine_parser,
        idle_ms,
    )

    p = engine_parser(__doc__, rounds=7, reps=300)
    p.add_argument("--shape", type=parse_shape, default=(1, 128))
    p.add_argument("--actions", type=parse_actions, default=list(ACTIONS))
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--dummy-gib", type=float, default=20.0)
    p.add_argument("--cool", type=float, default=30.0)
    p.add_argument("--streams", type=int, default=0,
                   help="also time A's replays back to back on this many other streams")
    args = p.parse_args()
    import numpy as np
    import torch
    from rich.console import Console
    from rich.table import Table

    from benchmarks.bench_gpu import HFRunner, device_packed, make_hf, random_padded
    from engine.fused.engine import FusedEngine
    from engine.fused.graph_args import _cuda, check

    batch, seq = args.shape
    rng = np.random.default_rng(5)
    x = device_packed(*random_padded(rng, batch, seq, lengths=np.full(batch, seq)))
    console = Console(width=150)

    def build() -> Any:
        eng, _ = calibrated_engine(args)
        with torch.inference_mode():
            eng._run_device(*x)  # captures the bucket's graph
        return eng

    def timings() -> dict[str, float]:
        """A's times now (medians of the rounds)."""
        def call() -> None:
            a._run_device(*x)

        def replay() -> None:
            a._graphs.replay(bucket_a)

        calls = {"b2b_ms": (call, cuda_ms, args.reps),
                 "replay_b2b_ms": (replay, cuda_ms, args.reps),
                 "idle_ms": (call, idle_ms, max(1, args.reps // 2)),
                 "replay_idle_ms": (replay, idle_ms, max(1, args.reps // 2))}
        for i, st in enumerate(streams):
            calls[f"replay_b2b_s{i}_ms"] = (lambda st=st: on_stream(st, replay), cuda_ms,
                                            args.reps)
        out: dict[str, list[float]] = {k: [] for k in calls}
        with torch.inference_mode():
            for _ in range(args.rounds):
                for key, (fn, timer, reps) in calls.items():
                    for _ in range(10):
                        fn()
                    out[key].append(timer(fn, reps))
        return {k: statistics.median(v) for k, v in out.items()}

    rows: list[dict[str, Any]] = []

    def phase(label: str) -> None:
        t = timings()
        rows.append({"phase": label,
                     "allocated_gib": torch.cuda.memory_allocated() / 2**30, **t, **gpu_state()})
        console.print(f"{label:<24} " + "  ".join(f"{k} {v}" for k, v in rows[-1].items()
                                                  if k != "phase"))

    def act(action: str) -> None:
        """Queue (or run) one action; the caller waits for the GPU after it."""
        if action == "alloc":
            torch.empty(int(args.dummy_gib * 2**30) // 4, device="cuda").fill_(1.0)
        elif action == "capture_other":  # the shapes in turn, from the first again after all
            b, length = OTHER_SHAPES[next(others)]
            a._run_device(*device_packed(*random_padded(rng, b, length,
                                                        lengths=np.full(b, length))))
        elif action == "recapture":
            del a._graphs._graphs[bucket_a]
            a._run_device(*x)
        elif action == "small_eager":
            FusedEngine(a.weights, "cuda", cuda_graphs=False,
                        fp8_calibration=a.calibration)._run_device(*x)
        elif action == "upload":
            own = a._graphs._graphs[bucket_a].graph
            check(_cuda().cuGraphUpload(ctypes.c_void_p(own.raw_cuda_graph_exec()),
                                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)),
                  "cuGraphUpload")
        elif action in HF_OPS:
            hf_op(action, batch, seq)
        elif action in ("small_op", "many_ops"):
            for _ in range(300 if action == "many_ops" else 1):
                y.add_(1)
        elif action == "matmul":
            m = torch.randn(768, 768, device="cuda", dtype=torch.float16)
            m @ m
        elif action == "stream":
            with torch.cuda.stream(torch.cuda.Stream()):  # type: ignore[no-untyped-call]
                y.add_(1)
        elif action == "tiny_graph":
            capture_graph(lambda: y.add_(1), 1).replay()
        elif action in ("engine", "calibrate", "capture"):  # as A was built, or less
            eng, _ = calibrated_engine(argparse.Namespace(
                **{**vars(args), "calibrate": action != "engine"}))
            if action == "capture":
                eng._run_device(*x)
        else:  # hf_build, hf, hf_graph
            model, _ = make_hf(args.model)
            ids, tt = (v.view(batch, seq).long() for v in x[:2])
            if action == "hf":
                model(input_ids=ids, token_type_ids=tt)
            elif action == "hf_graph":
                HFRunner(model, batch, seq, use_mask=False, graph=True)(
                    (ids, torch.ones_like(ids), tt))

    capture_stream()  # tiny_graph's captures: a stream older than A
    others = itertools.cycle(range(len(OTHER_SHAPES)))  # capture_other's shapes, in turn
    y = torch.ones(1024, device="cuda")  # the small ops' operand
    streams = [torch.cuda.Stream() for _ in range(args.streams)]  # type: ignore[no-untyped-call]

    def on_stream(st: Any, fn: Any) -> None:
        """``fn`` on ``st``, ordered after the current stream's work and before its next."""
        current = torch.cuda.current_stream()
        st.wait_stream(current)
        with torch.cuda.stream(st):
            fn()
        current.wait_stream(st)

    a = build()
    bucket_a = a._graph_bucket(x[0].shape[0], x[3].shape[0] - 1, x[4])
    phase("alone")
    for action in args.actions:
        for _ in range(args.repeat):
            with torch.inference_mode():
                act(action)
            torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        phase(f"after {action} x{args.repeat}")
    time.sleep(args.cool)
    phase(f"after {args.cool:g} s idle")

    table = Table(title=f"{args.model} {args.dtype} {batch}x{seq}: one engine as the process "
                        f"changes (ms, median of {args.rounds} rounds)")
    for col in ("phase", "GiB", "back to back", "replay back to back", "idle", "replay idle",
                "MHz", "°C", "W"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["phase"], f"{r['allocated_gib']:.1f}",
                      *(f"{r[k]:.4f}" for k in ("b2b_ms", "replay_b2b_ms", "idle_ms",
                                                  "replay_idle_ms")),
                      *(str(r.get(k, "?")) for k in ("sm_mhz", "temp_c", "power_w")))
    console.print(table)
    result = {"model": args.model, "dtype": args.dtype, "calibrated": args.calibrate,
              "shape": f"{batch}x{seq}", "repeat": args.repeat, "gpu": torch.cuda.get_device_name(),
              "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


def hf_op(name: str, batch: int, seq: int) -> None:
    """One eager op of a BERT-base forward on a [batch, seq] batch, fp16, random data."""
    import torch
    import torch.nn.functional as F

    h = torch.randn(batch, seq, 768, device="cuda", dtype=torch.float16)
    if name == "linear":
        F.linear(h, torch.randn(768, 768, device="cuda", dtype=torch.float16),
                 torch.randn(768, device="cuda", dtype=torch.float16))
    elif name == "sdpa":
        q = h.view(batch, seq, 12, 64).transpose(1, 2)
        F.scaled_dot_product_attention(q, q, q)
    elif name == "layernorm":
        F.layer_norm(h, (768,))
    elif name == "gelu":
        F.gelu(h)
    else:
        F.embedding(torch.randint(0, 30000, (batch, seq), device="cuda"),
                    torch.randn(30522, 768, device="cuda", dtype=torch.float16))


def gpu_state() -> dict[str, float]:
    """The current GPU's SM clock (MHz), temperature (°C) and power (W) through NVML, as
    torch reads them; empty where it cannot."""
    import torch

    try:
        return {"sm_mhz": torch.cuda.clock_rate(), "temp_c": torch.cuda.temperature(),
                "power_w": torch.cuda.power_draw() / 1000}
    except Exception:  # no pynvml, or NVML refuses: the times stand alone
        return {}


if __name__ == "__main__":
    main()
