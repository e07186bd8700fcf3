"""Where a host call's time goes: ``FusedEngine.infer`` on numpy arrays, batch 1.

    python benchmarks/host_call.py [--model bert-base] [--seq 128] [--calls 400] --out F.json

The numpy path is what the Triton model (``serving``) calls per request: pack the padded
batch, check it, run the bucket's graph (``GraphCache.run_host``), unpack the logits.
Since v26 ``run_host`` copies the batch from pinned host memory into the graph's input
buffer (one driver copy) and the graph writes the logits straight into pinned memory.
Variants: ``infer, batch over the bus`` (``HOST_BATCH_COPIED`` off: the first kernel reads
the pinned batch, v25's path) and ``infer, copied`` (``HOST_ZERO_COPY`` off: the logits
copied out too); v24's path copied from and to pageable memory (run an older tree).
Random weights (fp16); interleaved over rounds; prints a table, writes JSON. Rows:

- host wall-clock per call (``perf_counter``; the call returns with the logits on the
  host): ``infer`` and its variants, with their parts (``pack_padded``, ``_check_host``,
  ``_run_host``; the rest is ``infer``'s own: output arrays, chunking, unpacking);
  ``run_host`` alone (under the lock and inference mode, as ``infer`` calls it);
  ``device_call`` (``_run_device`` on int32 device tensors, synchronised); the bare
  replay (``GraphCache.replay``) waited for by its stream's or the device's
  synchronisation, and the launch named to the pinned batch and logits, waited for;
- host parts alone (until the call returns, the GPU idle before it) of ``_run_device``
  and of the bare replay;
- CUDA events around one call, as ``bench_gpu`` times them: ``_run_device``, the bare
  replay (batch and logits in device memory), the launch with the pinned batch and/or the
  pinned logits named, the batch copied in (torch's ``copy_``, or the driver's copy that
  ``run_host`` uses) before a launch to pinned logits, each copy alone, and ``run_host``
  itself (which waits inside: its end event holds the host's return too, so those rows
  are not the GPU's time);
- pieces, the mean of a loop: the bucket lookup (which ``_run_device`` skips since v34
  for a batch size it has served), an output tensor's allocation (since v25 made after
  the launch, for the next call), two driver sets of the per-call kernel arguments
  through ``_CallArgs.name`` (since v34 in compiled code where it builds: a context query
  and the comparison with the sets; ``--steps`` takes the Python path throughout, so its
  rows compare with runs of v33 and before, not with runs without it), the bucket layout
  written into the pinned buffer, torch's current-stream object and stream
  synchronisation (v25's ``run_host``) against the raw stream and the driver's wait
  (since v26), the context check.

With ``--steps`` also the steps inside each variant's calls (their wrappers add ~0.3 µs
each).
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


def main() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import batch1_parser, event_ms, host_us

    p = batch1_parser(__doc__, calls=400, calls_help="per variant and round")
    p.add_argument("--spin-us", type=float, default=0.0,
                   help="host parts: spin this long on the host after each call's sync, off "
                        "the clock (does the host run slower right after a wait?)")
    p.add_argument("--steps", action="store_true",
                   help="also time the steps inside the calls (bucket lookup, call args, "
                        "graph launch, replay_into); their wrappers add ~0.3 us each to every "
                        "row that runs them, and calls take the Python path (the steps are "
                        "its functions)")
    args = p.parse_args()
    import numpy as np
    import torch

    import engine.fused.engine as fe
    import engine.fused.graphs as graphs_module

    if args.steps:  # the compiled path sets the arguments and launches in one call
        graphs_module.NATIVE_LAUNCH = False
    from benchmarks.bench_gpu import make_hf, make_ours
    from engine.fused import graph_args

    model, cfg = make_hf(args.model)
    eng = make_ours(model, cfg, dtype="float16")
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, cfg.vocab_size, (1, args.seq)).astype(np.int32)
    mask = np.ones_like(ids)
    tt = np.zeros_like(ids)
    tt[:, args.seq // 4:] = 1
    dev = [torch.from_numpy(a).cuda()
           for a in (ids[0], tt[0], np.arange(args.seq, dtype=np.int32))]
    cu = torch.tensor([0, args.seq], dtype=torch.int32, device="cuda")

    parts: dict[str, list[float]] = defaultdict(list)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*a)
            parts[name].append(time.perf_counter() - t0)
            return out
        return run

    fe.pack_padded = timed("pack_padded", fe.pack_padded)  # type: ignore[assignment]
    eng._check_host = timed("check_host", eng._check_host)  # type: ignore[method-assign]
    run_host_alone = eng._run_host  # unwrapped, for the rows of run_host alone
    eng._run_host = timed("run_host", eng._run_host)  # type: ignore[method-assign]

    def device_call() -> None:
        eng._run_device(dev[0], dev[1], dev[2], cu, args.seq)
        torch.cuda.synchronize()

    launch_only: dict[str, list[float]] = defaultdict(list)

    def host_part(name: str, fn: Callable[[], Any]) -> Callable[[], None]:
        """``fn``'s host time up to its return (the launch), then a sync off the clock."""
        def run() -> None:
            launch_only[name].append(host_us(fn) * 1e-6)
            until = time.perf_counter() + args.spin_us * 1e-6
            while time.perf_counter() < until:
                pass
        return run

    bucket = eng._graph_bucket(args.seq, 1, args.seq)
    assert bucket is not None and eng._graphs is not None
    graphs = eng._graphs
    graphs.inputs(bucket)  # captured now
    entry = graphs._graphs[bucket]
    assert entry.args is not None
    stage_set, output_set = entry.args.stage.set, entry.args.output.set  # to wrap (--steps)
    bucket_of = eng._graph_bucket
    if args.steps:  # steps inside the calls, per variant
        graphs.replay_into = timed("replay_into", graphs.replay_into)  # type: ignore[method-assign]
        entry.launch = timed("graph launch", entry.launch)  # type: ignore[method-assign]
        eng._graph_bucket = timed("bucket lookup", bucket_of)  # type: ignore[method-assign]
        entry.args.stage.set = timed("input args", stage_set)  # type: ignore[method-assign]
        entry.args.output.set = timed("output arg", output_set)  # type: ignore[method-assign]
    outs = [torch.empty((2, bucket.tokens), device="cuda") for _ in range(2)]
    flip = [0]

    def call_args() -> None:
        """New values each time (two output tensors in turn), so both reach the driver;
        through ``_CallArgs``, which then knows what the graph holds."""
        assert entry.args is not None
        flip[0] ^= 1
        entry.args.name((dev[0].data_ptr(), dev[1].data_ptr(), dev[2].data_ptr(),
                         cu.data_ptr(), args.seq - flip[0], 1), outs[flip[0]].data_ptr())

    pieces = {  # pieces of _run_device's host part, each alone
        "  bucket lookup": lambda: bucket_of(args.seq, 1, args.seq),
        "  output allocation": lambda: torch.empty((2, bucket.tokens), device=eng.device,
                                                   dtype=torch.float32),
        "  call args (two driver calls)": call_args,
        # pieces of run_host's host part before its launch, and its wait
        "  bucket_layout into pinned": lambda: graphs_module.bucket_layout(
            packed.input_ids, packed.token_type_ids, packed.position_ids, packed.cu_seqlens,
            bucket, out=io.inputs_np),
        "  torch.cuda.current_stream": lambda: torch.cuda.current_stream(eng.device),
        "  context enter + leave": lambda: context_switch(),
        "  idle stream sync": lambda: stream.synchronize(),  # torch's (v25's run_host)
        # what run_host uses since v26 instead of the two above
        "  raw current stream": lambda: graphs._current_stream(),
        "  idle stream wait, driver": lambda: graph_args.synchronize(graphs._current_stream()),
    }

    def flag_off(flag: str, fn: Callable[[], Any]) -> None:
        """``fn`` with a flag of ``graphs`` off: ``HOST_ZERO_COPY``, the pinned batch
        copied in and the logits out; ``HOST_BATCH_COPIED``, the batch read over the bus
        by the graph's first kernel."""
        before = getattr(graphs_module, flag)
        setattr(graphs_module, flag, False)
        try:
            fn()
        finally:
            setattr(graphs_module, flag, before)

    def copied(fn: Callable[[], Any]) -> None:
        flag_off("HOST_ZERO_COPY", fn)

    def infer_copied() -> None:
        copied(lambda: eng.infer(ids, mask, tt))

    def infer_over_bus() -> None:
        flag_off("HOST_BATCH_COPIED", lambda: eng.infer(ids, mask, tt))

    def context_switch() -> None:
        graphs._context.leave(graphs._context.enter())

    packed = fe.pack_padded(ids, mask, tt)
    stream = torch.cuda.current_stream()
    eng.infer(ids, mask, tt)  # the bucket's pinned buffers, made by its first host call
    io = entry.host_io
    assert io is not None

    def run_host() -> None:
        """The engine's host call alone, as ``infer`` makes it (lock, inference mode)."""
        with eng._lock, torch.inference_mode():
            run_host_alone(packed)

    def replay_synced(sync: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            graphs.replay(bucket)
            sync()
        return run

    def named_launch(inputs_pinned: bool, output_pinned: bool) -> Callable[[], None]:
        """A launch alone (no driver set after the first), the graph named to the pinned
        batch or its own input buffer (the same layout, as the last copied call left it),
        and to the pinned logits or its own: which of the two bus transfers costs the
        GPU's time. Both pinned: v25's ``run_host`` launch."""
        def run() -> None:
            assert entry.args is not None and io is not None and io.device is not None
            host_values, logits = entry.args.host_values, entry.logits.data_ptr()
            entry.args.name(io.device[0] if inputs_pinned else host_values,
                            io.device[1] if output_pinned else logits)
            entry.launch(graphs._current_stream())
        return run

    def copy_batch_in() -> None:
        """torch's ``copy_`` (v26's rows measured it so; ``run_host`` copies through the
        driver: ``driver_copy_in``)."""
        assert io is not None
        entry.inputs.copy_(io.inputs, non_blocking=True)

    def driver_copy_in() -> None:
        assert io is not None
        graph_args.copy_to_device(entry.inputs.data_ptr(), io.inputs.data_ptr(),
                                  io.inputs.nbytes, graphs._current_stream())

    def then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            first()
            second()
        return run

    zero_copy_launch = named_launch(True, True)
    to_pinned_logits = named_launch(False, True)

    variants = {"infer": lambda: eng.infer(ids, mask, tt), "infer, copied": infer_copied,
                "infer, batch over the bus": infer_over_bus,
                "run_host": run_host,
                "graph replay, stream sync": replay_synced(stream.synchronize),
                "graph replay, device sync": replay_synced(torch.cuda.synchronize),
                "zero-copy launch, stream sync": then(zero_copy_launch, stream.synchronize),
                "device_call": device_call,
                "device_call, host part": host_part(
                    "device_call, host part",
                    lambda: eng._run_device(dev[0], dev[1], dev[2], cu, args.seq)),
                "graph replay, host part": host_part(
                    "graph replay, host part", lambda: graphs.replay(bucket))}
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for name, fn in variants.items():
            for _ in range(20):
                fn()
            parts.clear()
            launch_only.clear()
            for _ in range(args.calls):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            if name in launch_only:  # the row is the host part alone
                times[name][-args.calls:] = launch_only[name]
            if name != "device_call":
                for key, v in parts.items():
                    times[f"  {name}: {key}"] += v
    events = {  # GPU time per call as bench_gpu takes it: events around the call
        "device_call, CUDA events": lambda: eng._run_device(dev[0], dev[1], dev[2], cu,
                                                            args.seq),
        "graph replay, CUDA events": lambda: graphs.replay(bucket),
        # GPU time of a host call's parts: the graph on the pinned batch and/or logits,
        # the batch copied in first (the copy's submission inside the events too)
        "zero-copy launch, CUDA events": zero_copy_launch,
        "pinned batch, device logits, CUDA events": named_launch(True, False),
        "device batch, pinned logits, CUDA events": to_pinned_logits,
        "batch copied in, pinned logits, CUDA events": then(copy_batch_in, to_pinned_logits),
        "batch copy alone, CUDA events": copy_batch_in,
        "batch copied in (driver), pinned logits, CUDA events": then(driver_copy_in,
                                                                     to_pinned_logits),
        "batch copy alone (driver), CUDA events": driver_copy_in,
        # (events around a call that waits inside: its host time after the wait too)
        "run_host, CUDA events": run_host,
        "run_host copied, CUDA events": lambda: copied(run_host),
        "run_host, batch over the bus, CUDA events": lambda: flag_off("HOST_BATCH_COPIED",
                                                                      run_host)}
    for _ in range(args.rounds):
        for name, fn in events.items():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            times[name] += [ms * 1e-3 for ms in event_ms(fn, args.calls)]
    for _ in range(args.rounds):
        for name, fn in pieces.items():
            for _ in range(20):
                fn()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t0) / args.calls)
    rows = {name: {"median_us": statistics.median(v) * 1e6,
                   "p99_us": sorted(v)[int(0.99 * (len(v) - 1))] * 1e6, "calls": len(v)}
            for name, v in times.items()}
    print(f"{args.model} 1x{args.seq}, host wall-clock per call ({args.rounds} rounds x "
          f"{args.calls})")
    print("| variant | median us | p99 us |\n|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['median_us']:.1f} | {r['p99_us']:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "seq": args.seq, "rows": rows},
                                       indent=2))


if __name__ == "__main__":
    main()
