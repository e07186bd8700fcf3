"""What a graph launch adds to a call's CUDA-event time, batch 1.

    python benchmarks/launch_cost.py [--model bert-base] [--seq 128] --out F.json

``bench_gpu``'s "graph alone" records a start event on an idle GPU, launches the bucket's
graph and records the end event: the time holds the launch's host part (the GPU waits for
the host to submit the graph) as well as the kernels. This splits it, for calibrated FP8
(random weights, calibrated on random windows as ``bench_gpu`` does), in interleaved rounds:

- ``idle``: events around one call, the GPU idle before it (``bench_gpu``'s method);
- ``queued``: the same, with a ~50 µs sleep kernel queued in front of the start event, so
  the call is submitted before the start event is timestamped: the GPU's own time from
  the graph's start to its end;
- ``host``: the call's host time until it returns (perf_counter; the sync off the clock);

for these calls: ``torch replay`` (``CUDAGraph.replay``), ``driver launch``
(``graph_args.Launcher``: ``cuGraphLaunch`` through ctypes on the same executable graph
and stream), ``GraphCache.replay`` (the bare replay with its argument bookkeeping and
context check, through ``Launcher`` since v25), ``_run_device`` on one set of input
tensors and on four sets in turn (as ``bench_gpu``'s per-call rows; and, one median a
round, through ``bench_gpu.time_calls`` itself, to tell the timer from the calls), on the
compiled call path (``staged_launch``, the default since v34) and on the Python path
(``graphs.NATIVE_LAUNCH`` off: an engine of the same weights captured so), the compiled
launch alone (the extension's one call, with no Python around it) and ``replay_into``
(without ``_run_device``'s lock and route; v35, to split a call's host path), the public
``infer_packed`` on the same tensors, with ``position_ids`` given and computed. Since
v25 a call sets its inputs before its launch where they changed (none with one set, one
driver call with four), and names the next call's output after it (one driver call, off
the timed path to the launch); v24 set both before the launch. And what runs after a
driver launch while its graph is in flight, as ``replay_into``'s next output: 12 µs of host
spinning (no driver call), a set of the output argument (one driver call, to one of two
tensors in turn; through ``_CallArgs.name``, so since v34 in compiled code with a context
query beside it), the same after a ``cuStreamQuery`` (which would make a driver that
batches its submissions send the launch first), and ``torch.empty``: if the graph's start
waits for any of them, its idle time grows by that work. Then, host time only, the pieces
``infer_packed`` adds around ``_run_device`` (since v35): its four tensor checks, an
inference-mode enter and exit (v34's ``infer_packed`` entered one), the two logit rows as
v34 took them and as one ``unbind``, and the positions from ``cu_seqlens``: for one
sequence a view of a kept ``arange`` (v35's ``infer_packed``), for several one kernel
(``packed_positions``, v35), and as v34's torch ops. Prints a table, writes JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLEEP_CYCLES = 100_000  # ~50 µs at the H200's clock: enough to hide any launch


def host_pieces(eng: Any, ids: Any, tt: Any, pos: Any, cu: Any) -> dict[str, Callable[[], Any]]:
    """What ``infer_packed`` does around ``_run_device``, piece by piece (host time)."""
    import torch

    from engine.fused.engine import _int32_on

    dev, t, b = eng._tensor_device, ids.shape[0], cu.shape[0] - 1
    logits = torch.empty((2, t), device=dev)

    def inference_mode() -> None:
        with torch.inference_mode():
            pass

    def v34_positions() -> torch.Tensor:
        seq_of_token = torch.repeat_interleave(
            torch.arange(b, device=dev), (cu[1:] - cu[:-1]).long(), output_size=t)
        return (torch.arange(t, device=dev, dtype=torch.int32) - cu[seq_of_token]).int()

    return {
        "_int32_on, four tensors": lambda: [_int32_on(x, dev) for x in (ids, tt, pos, cu)],
        "inference mode, enter and exit": inference_mode,
        "logits[0], logits[1]": lambda: (logits[0], logits[1]),
        "logits.unbind(0)": lambda: logits.unbind(0),
        "positions, one sequence: a view (v35)": lambda: eng._positions(cu, t),
        "positions, one kernel (v35, several sequences)": lambda: eng.ops.packed_positions(
            cu, t, eng.config.max_position_embeddings),
        "positions, v34's torch ops": v34_positions,
    }


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import batch1_parser

    p = batch1_parser(__doc__, calls=200, calls_help="per variant, mode and round")
    p.add_argument("--commit", default="")
    args = p.parse_args()
    import numpy as np
    import torch

    from benchmarks.bench_gpu import device_packed, random_padded, time_calls
    from benchmarks.rounds import event_ms, host_us, tool_engine
    from engine.fused import graphs as graphs_module
    from engine.fused.engine import FusedEngine
    from engine.fused.graph_args import Launcher
    from engine.fused.graph_args import _cuda as cuda_driver

    eng, _ = tool_engine(args.model, "fp8", {}, random_padded(np.random.default_rng(7), 64,
                                                              384))
    rng = np.random.default_rng(0)
    sets = [device_packed(*random_padded(rng, 1, args.seq)) for _ in range(4)]
    ids, tt, pos, cu, max_len = sets[0]
    graphs_module.NATIVE_LAUNCH = False  # the same weights, its graphs on the Python path
    py_eng = FusedEngine(eng.weights, "cuda")
    with torch.inference_mode():
        py_eng._run_device(ids, tt, pos, cu, max_len)
    graphs_module.NATIVE_LAUNCH = True
    with torch.inference_mode():
        eng._run_device(ids, tt, pos, cu, max_len)
    bucket = eng._graph_bucket(args.seq, 1, args.seq)
    graphs = eng._graphs
    assert bucket is not None and graphs is not None
    graphs.replay(bucket)
    entry = graphs._graphs[bucket]
    launch, stream = Launcher(entry.graph), torch.cuda.current_stream().cuda_stream

    def driver_launch() -> None:
        launch(stream)

    turn = [0]

    def rotating(engine: Any = eng) -> None:
        turn[0] = (turn[0] + 1) % len(sets)
        engine._run_device(*sets[turn[0]])

    # What runs after a launch, while its graph is in flight (``replay_into`` makes and
    # names the next call's output there): does any of it hold back the graph's start?
    args_ = entry.args
    assert args_ is not None and args_.named is not None
    assert args_.native is not None, "the compiled call path did not build here"
    named_inputs = args_.named[0]
    outs = [torch.empty((2, bucket.tokens), device="cuda") for _ in range(2)]
    query = cuda_driver().cuStreamQuery
    flip = [0]

    def then_spin() -> None:
        launch(stream)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 12e-6:
            pass

    def then_set(flush: bool = False) -> None:
        launch(stream)
        if flush:
            query(stream)
        flip[0] ^= 1
        args_.name(named_inputs, outs[flip[0]].data_ptr())

    def then_empty() -> None:
        launch(stream)
        torch.empty((2, bucket.tokens), device="cuda")

    calls: dict[str, Callable[[], Any]] = {
        "torch replay": entry.graph.replay,
        "driver launch": driver_launch,
        "launch, then 12 µs on the host": then_spin,
        "launch, then an output set": then_set,
        "launch, stream query, output set": lambda: then_set(flush=True),
        "launch, then torch.empty": then_empty,
        "GraphCache.replay": lambda: graphs.replay(bucket),
        "staged_launch.launch alone": lambda: args_.native.launch(
            ids, tt, pos, cu, outs[0], bucket.tokens, bucket.seqs, stream),
        "GraphCache.replay_into": lambda: graphs.replay_into(bucket, ids, tt, pos, cu),
        "_run_device, one input set": lambda: eng._run_device(ids, tt, pos, cu, max_len),
        "_run_device, four sets in turn": rotating,
        "infer_packed, positions given": lambda: eng.infer_packed(ids, tt, cu, max_len,
                                                                 position_ids=pos),
        "infer_packed, positions computed": lambda: eng.infer_packed(ids, tt, cu, max_len),
        "Python path, one input set": lambda: py_eng._run_device(ids, tt, pos, cu, max_len),
        "Python path, four sets in turn": lambda: rotating(py_eng),
    }
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def sleep() -> None:
        torch.cuda._sleep(SLEEP_CYCLES)

    with torch.inference_mode():
        for r in range(args.rounds):
            for name, fn in calls.items():
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
                times[name]["idle"] += [ms * 1e3 for ms in event_ms(fn, args.calls)]
                times[name]["queued"] += [ms * 1e3 for ms in event_ms(fn, args.calls, sleep)]
                for _ in range(args.calls):
                    times[name]["host"].append(host_us(fn))
            # bench_gpu's own timer on the same calls, one round's median each (v25's
            # question; v26: it agrees with event_ms here, 283.0 against 283.5 µs)
            for label, engine in (("", eng), (", Python path", py_eng)):
                timing = time_calls(lambda x, e=engine: e._run_device(*x), sets, target_s=0.07)
                times[f"bench_gpu.time_calls, four sets{label}"]["idle"].append(
                    timing.median_ms * 1e3)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        for _ in range(args.rounds):
            for name, fn in host_pieces(eng, ids, tt, pos, cu).items():
                for _ in range(10):
                    fn()
                times[name]["host"] += [host_us(fn) for _ in range(args.calls)]
        # the sleep kernel alone, queued: what "queued" would read with no call at all
        times["nothing"]["queued"] = [ms * 1e3 for ms in event_ms(lambda: None, args.calls,
                                                                   sleep)]

    rows = {name: {mode: {"median_us": statistics.median(v),
                          "p10_us": sorted(v)[len(v) // 10], "calls": len(v)}
                   for mode, v in modes.items()} for name, modes in times.items()}
    print(f"\n{args.model} 1x{args.seq} calibrated FP8, µs (median over "
          f"{args.rounds}x{args.calls} calls)")
    print(f"{'call':34s} {'idle':>8s} {'queued':>8s} {'host':>8s}")
    for name, modes in rows.items():
        cells = [f"{modes[m]['median_us']:8.1f}" if m in modes else f"{'':8s}"
                 for m in ("idle", "queued", "host")]
        print(f"{name:34s} {' '.join(cells)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "model": args.model, "seq": args.seq, "commit": args.commit,
            "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
