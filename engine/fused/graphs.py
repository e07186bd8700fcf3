"""CUDA graphs of the whole forward pass, one per bucket, captured on first use.

A graph owns static buffers: one int32 input buffer in the ``packing.bucket_layout``
layout, and the float32 [2, bucket.tokens] logits its captured forward wrote.
:meth:`GraphCache.replay` runs it on what that buffer holds. With ``stage_args`` every
graph of up to ``STAGE_MAX_TOKENS`` tokens can also read its inputs and write its logits
elsewhere: a call sets where its inputs are as the first kernel's leading arguments
(``kernels.STAGE_ARGS``: that kernel reads the tokens there and copies cu_seqlens, which
attention reads, into the input buffer) and where the logits go as the last kernel's
output argument, in the instantiated graph (``engine.fused.graph_args``). So
:meth:`GraphCache.replay_into` (the caller's device tensors) is one launch with nothing
staged or copied around it, and :meth:`GraphCache.run_host` (a host batch) is one copy
of the batch from pinned host memory into the input buffer and one launch that writes the
logits straight into pinned memory; buckets that do not stage themselves also copy the
logits out after the replay.
Graphs are launched through the driver (``graph_args.Launcher``), in the context of the
device they were captured on. Not thread-safe: the engine serialises calls.
All graphs share one memory pool: they are
replayed one at a time and none reads another's intermediates, so the pool's blocks can
serve every graph's activations. One at a time on the GPU too: a call on another stream
than the previous call's waits for that stream's work first (``GraphCache._follow``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from engine.fused import cublaslt, staged_launch
from engine.fused.graph_args import (
    Context,
    KernelArgs,
    Launcher,
    PointerArg,
    check,
    copy_to_device,
    device_address,
    driver_functions,
    leading_args,
    pointer_arg,
    synchronize,
)
from engine.fused.packing import I32, Bucket, bucket_layout

# Graphs of buckets up to this many tokens stage their own inputs (``stage_args``): one
# launch a call. Above it a call stages and copies out around the replay, as v22's graphs
# did above 2,048 tokens; larger buckets were not measured with in-graph staging, and at
# their size three launches cost little. (The one such capture that failed in a GPU suite
# run, H200, 2026-12-01, was a garbage collection inside it: ``no_automatic_collection``.)
STAGE_MAX_TOKENS = 2048

# Host batches (``GraphCache.run_host``) of buckets that stage themselves have their
# logits written straight into pinned host memory by the graph's last kernel; False:
# copied out, and the batch copied in (for A/B measurements: ``benchmarks/host_call.py``).
HOST_ZERO_COPY = True
# ... and their batch copied from pinned host memory into the graph's input buffer by the
# copy engine, one copy queued before the launch. False: the graph's first kernel reads it
# over the bus where the host wrote it, which cost the GPU 21-22 µs more per call than a
# batch in device memory (H200, BERT-base 1x128 fp16, `host_call.py`, v26: the GPU's time
# 327-331 µs against 304-309; the logits written over the bus cost nothing measurable;
# the batch copied in first, 313-320).
HOST_BATCH_COPIED = True

# Batch sizes the engine remembers the bucket of (``GraphCache.routes``), as
# ``packing.bucket_for`` caches its own answers.
MAX_ROUTES = 4096

# Calls on device tensors (``GraphCache.replay_into``) of graphs captured while this is
# True take the compiled path (``staged_launch``: checks, argument sets and launch in one
# call) where it builds here; False: the Python path, also the fallback (for A/B
# measurements). Read at capture: a graph keeps the path it was captured with.
NATIVE_LAUNCH = True

# Batches above this many tokens run eagerly (the engine's ``max_graph_tokens``): their
# exact token count, no bucket padding, and the GPU's work hides the host's launches.
# H200, 2026-11-30, BERT-large calibrated FP8, per call on SQuAD-mix windows
# (`benchmarks/bucket_padding.py`, 16d10de): eager against the graph (default buckets)
# 7.6 vs 3.0 ms at 16 windows (~3k tokens) and 11.2 vs 4.8 at 32 (~5.4k): the host's
# launches, 7.5-11 ms a pass, show; 9.3 vs 9.8 at 64 (~11k), 17.9 vs 19.0 at 128 (~22k),
# 35.7 vs 36.5 at 256 (~45k). The crossover lies between 5.6k and 10.5k tokens (not
# sampled between); 16k leaves a margin for slower hosts.
MAX_GRAPH_TOKENS = 16384

# forward(ids, token_types, positions, cu_seqlens, n_seqs, max_seqlen, stage) -> logits
# [2, T]; with ``stage`` its first kernel stages a call's inputs (``kernels.STAGE_ARGS``).
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, bool],
                   torch.Tensor]


def split_inputs(buf: torch.Tensor, bucket: Bucket) -> tuple[torch.Tensor, ...]:
    """Views (ids, token types, positions, cu_seqlens) of a bucket's input buffer."""
    n = bucket.tokens
    return buf[:n], buf[n : 2 * n], buf[2 * n : 3 * n], buf[3 * n :]


def staged_tensors_fit(ids: torch.Tensor, tt: torch.Tensor, pos: torch.Tensor,
                       cu: torch.Tensor, index: int) -> bool:
    """Whether a call's tensors can be handed to a graph as bare addresses
    (:meth:`GraphCache.replay_into`): contiguous 1-D int32 on device ``index``, ids, token
    types and positions of one length, at least one offset. The kernel gets bare
    addresses: a wrong dtype, stride, device or length would be misread. (Spelled out
    rather than looped: this is every call's host path on the Python path, 2.1 µs on the
    H200's host, ``benchmarks/call_pieces.py``; ``cpp/staged_launch.cpp``'s ``staged_fit``
    is the compiled form.)"""
    return (tt.shape == pos.shape == ids.shape == (ids.shape[0],)
            and cu.shape == (cu.shape[0],) and cu.shape[0] >= 1
            and ids.dtype == tt.dtype == pos.dtype == cu.dtype == torch.int32
            and ids.get_device() == tt.get_device() == pos.get_device() == cu.get_device()
            == index
            and ids.is_contiguous() and tt.is_contiguous() and pos.is_contiguous()
            and cu.is_contiguous())


_gc_lock = threading.Lock()
_gc_holders = 0  # captures under way (any engine, any thread)
_gc_was_enabled = False


@contextlib.contextmanager
def no_automatic_collection() -> Iterator[None]:
    """Automatic garbage collection off until the last of the overlapping holders (captures
    in any thread) is done, then as it was. A collection inside a capture can free another
    graph (an engine dropped in a reference cycle: its graph cache holds its bound forward),
    and destroying a graph or releasing its memory inside a capture invalidates the capture
    ("operation failed due to a previous error during capture": ``benchmarks/capture_gc.py``,
    H200, 2026-12-01). torch no longer collects before a capture (``force_cudagraph_gc``).
    Garbage waits until the captures are done. An explicit ``gc.collect()`` still runs."""
    global _gc_holders, _gc_was_enabled
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()


class _CallArgs:
    """Where a call names its tensors to a graph (``stage_args``): the first kernel's
    leading arguments and the last kernel's output address. :meth:`name` sets them for the
    graph's later launches and remembers what it set, so that calls in a row on the same
    buffers cost one tuple comparison and no driver call: :meth:`host` names the graph's
    own buffers (what the host writes into ``inputs``, every row of it, and the static
    logits; ``host_values`` the inputs alone), :meth:`GraphCache.run_host` those inputs
    and the bucket's pinned logits (:class:`_HostIO`; its pinned batch too with
    ``HOST_BATCH_COPIED`` off); :meth:`GraphCache.replay_into` names a fresh output after
    every launch. ``native``: the compiled form of the same (``staged_launch``), which then
    sets both nodes itself (the KernelArgs only hold its buffers), or None."""

    def __init__(self, stage: KernelArgs, output: PointerArg,
                 host_values: tuple[int, ...], logits: torch.Tensor,
                 native: Any | None = None) -> None:
        if stage.node == output.node:  # a one-kernel forward
            raise RuntimeError("the graph's first kernel is also its last: a call cannot "
                               "set both its inputs and its output there")
        self.stage, self.output = stage, output
        self.host_values, self._logits = host_values, logits.data_ptr()
        self._named: tuple[tuple[int, ...], int] | None = None
        self.native = native

    @property
    def named(self) -> tuple[tuple[int, ...], int] | None:
        """(inputs, output) the graph's later launches get, or None before both are set."""
        return self._named if self.native is None else self.native.named

    def host(self) -> None:
        self.name(self.host_values, self._logits)

    def name(self, values: tuple[int, ...], out: int) -> None:
        """The inputs (``STAGE_ARGS`` values) and output address of later launches."""
        if self.native is not None:
            result = self.native.name(*values, out)
            if result:
                check(result, self.native.failed)
            return
        if (values, out) == self._named:
            return
        self._named = None  # unknown until both are set: a failed set is redone next time
        self.stage.set(*values)
        self.output.set(out)
        self._named = (values, out)


class _HostIO:
    """A bucket's batch and logits in pinned host memory, reused by every host call (a
    call waits for its work before the next may write): the host writes the bucket's
    input layout into ``inputs`` and reads the logits from ``logits``. ``device``: where
    kernels reach them (unified addressing), as (``STAGE_ARGS`` values, logits address)
    for :meth:`_CallArgs.name`; None where the driver maps them nowhere."""

    def __init__(self, bucket: Bucket) -> None:
        self.inputs = torch.zeros(bucket.buffer_len, dtype=torch.int32, pin_memory=True)
        self.logits = torch.zeros((2, bucket.tokens), dtype=torch.float32, pin_memory=True)
        self.inputs_np: I32 = self.inputs.numpy()
        self.logits_np: npt.NDArray[np.float32] = self.logits.numpy()
        at = device_address(self.inputs.data_ptr())
        out = device_address(self.logits.data_ptr())
        n = bucket.tokens
        # As ``_CallArgs.host``'s values, on this buffer: the layout's every row.
        self.device = None if at is None or out is None else (
            (at, at + 4 * n, at + 8 * n, at + 12 * n, n, bucket.seqs), out)


@dataclass
class _Captured:
    inputs: torch.Tensor  # int32 [bucket.buffer_len]
    logits: torch.Tensor  # float32 [2, bucket.tokens], written by each replay (not by
    # replay_into or a host call of a bucket that stages itself: they name other outputs)
    graph: torch.cuda.CUDAGraph
    launch: Launcher
    args: _CallArgs | None = None  # with ``stage_args``, for buckets that stage themselves
    host_io: _HostIO | None = None  # made by the first host call
    # replay_into's next output on the Python path, made after the previous call's launch,
    # and its stream (on the compiled path its StagedLaunch keeps them)
    spare: torch.Tensor | None = None
    spare_stream: int = 0


class GraphCache:
    """Capture-once, replay-many forward passes keyed by :class:`Bucket`."""

    def __init__(self, forward: Forward, device: torch.device, max_graphs: int = 128,
                 stage_args: str | None = None) -> None:
        self._forward = forward
        # The device by its index: "cuda" alone would follow the calling thread's device.
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._device = torch.device("cuda", self._index)
        self._max_graphs = max_graphs
        self._graphs: dict[Bucket, _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()
        # Warm-ups and captures on one stream of the cache's own, and cuBLASLt calls on a
        # workspace of its own: its graphs keep the pointer and replay on their callers'
        # streams, so no other engine's GEMMs may share it (cublaslt.Workspace); the
        # warm-up makes it before the capture.
        self._stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        self._workspace = cublaslt.Workspace()
        self._stage_args = stage_args
        self._context = Context(self._index)
        # The stream of the last call, raw and as torch's object (see ``_follow``), and
        # raw alone for ``StagedLaunch.call`` (-1: none yet; no raw stream is negative).
        self._last: tuple[int, torch.cuda.Stream] | None = None
        self.last_stream = -1
        # (tokens, seqs, max_seqlen) of calls already replayed into a bucket that stages
        # itself -> that bucket and its compiled call path (None on the Python path): the
        # engine's shortcut past its bucket lookup (filled by ``remember_route``, bounded;
        # it lives as long as the graphs it names, which are never dropped).
        self.routes: dict[tuple[int, int, int], tuple[Bucket, Any]] = {}

    def remember_route(self, key: tuple[int, int, int], bucket: Bucket) -> None:
        """``routes[key] = (bucket, its StagedLaunch or None)`` once the bucket's graph
        exists, up to ``MAX_ROUTES``."""
        entry = self._graphs.get(bucket)
        if entry is not None and len(self.routes) < MAX_ROUTES:
            self.routes[key] = (bucket, entry.args.native if entry.args is not None else None)

    def stages_itself(self, bucket: Bucket) -> bool:
        """Whether a call names its tensors to the bucket's graph (:meth:`replay_into`)."""
        return self._stage_args is not None and bucket.tokens <= STAGE_MAX_TOKENS

    def __len__(self) -> int:
        return len(self._graphs)

    def can_serve(self, bucket: Bucket) -> bool:
        """True when the bucket has a graph or there is room to capture one."""
        return bucket in self._graphs or len(self._graphs) < self._max_graphs

    def inputs(self, bucket: Bucket) -> torch.Tensor:
        """The bucket's static input buffer (capturing the graph first if needed), for
        work on the current stream ahead of :meth:`replay`."""
        entry = self._graphs.get(bucket) or self._capture(bucket)
        self._follow(self._current_stream())
        return entry.inputs

    def _current_stream(self) -> int:
        return torch._C._cuda_getCurrentRawStream(self._index)

    def _follow(self, stream: int) -> None:
        """Order a call on ``stream`` after the previous call's work when that came on
        another stream: the graphs share one memory pool (and a bucket its buffers), so
        no two passes may overlap. On one stream, one comparison."""
        last = self._last
        if last is not None and last[0] == stream:
            return
        current = torch.cuda.current_stream(self._device)
        if last is not None:
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(last[1])
            current.wait_event(done)
        self._last = (stream, current)
        self.last_stream = stream

    def _native(self, graph: torch.cuda.CUDAGraph, bucket: Bucket, stage: KernelArgs,
                output: PointerArg) -> Any | None:
        """The compiled call path of one graph (``NATIVE_LAUNCH``), or None. It holds its
        calls' spare output (``_call_output``) and makes the next one as torch makes an
        op's output (``make_output``; no reference back to this cache)."""
        if not NATIVE_LAUNCH:
            return None
        stage_node, stage_params, stage_slots = stage.native_view()
        output_node, output_params, output_slots = output.native_view()
        return staged_launch.make(
            owners=(stage, output, graph), exec=graph.raw_cuda_graph_exec(),
            context=self._context.handle, device=self._index, **driver_functions(),
            stage_node=stage_node, stage_params=stage_params, stage_slots=stage_slots,
            output_node=output_node, output_params=output_params, output_slots=output_slots,
            max_tokens=bucket.tokens, max_seqs=bucket.seqs,
            current_stream=torch._C._cuda_getCurrentRawStream,
            make_output=functools.partial(torch.empty, (2, bucket.tokens), device=self._device,
                                          dtype=torch.float32),
            out_of_memory=torch.OutOfMemoryError)

    def replay(self, bucket: Bucket) -> torch.Tensor:
        """Run the bucket's graph on what its input buffer holds; returns the static logits."""
        entry = self._graphs[bucket]
        stream = self._current_stream()
        self._follow(stream)
        previous = self._context.enter()
        try:
            if entry.args is not None:
                entry.args.host()
            entry.launch(stream)
        finally:
            self._context.leave(previous)
        return entry.logits

    def replay_into(self, bucket: Bucket, ids: torch.Tensor, tt: torch.Tensor,
                    pos: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        """One launch on contiguous int32 ``ids``/``tt``/``pos`` [T] and ``cu`` [B + 1]
        where the caller holds them (they must stay alive until the launch has run, in
        stream order); returns the logits [2, T], a view of a fresh [2, bucket.tokens]
        tensor (the last kernel writes every row of the bucket)."""
        entry = self._graphs.get(bucket) or self._capture(bucket)
        assert entry.args is not None, \
            "replay_into needs a GraphCache with stage_args and a bucket that stages itself"
        native = entry.args.native
        if native is not None:
            return self._replay_native(native, bucket, ids, tt, pos, cu)
        t, b = ids.shape[0], cu.shape[0] - 1
        if t > bucket.tokens or b > bucket.seqs:
            raise ValueError(f"batch ({t} tokens, {b} sequences) does not fit {bucket}")
        if not staged_tensors_fit(ids, tt, pos, cu, self._index):
            raise self._misfit()
        stream, out = self._call_output(entry, bucket)
        values = (ids.data_ptr(), tt.data_ptr(), pos.data_ptr(), cu.data_ptr(), t, b)
        previous = self._context.enter()
        try:
            # The spare was named as the output after the last call's launch: this sets
            # the inputs alone, where they changed.
            entry.args.name(values, out.data_ptr())
            entry.launch(stream)
            spare = self._spare(bucket)  # the next call's output, named while this one runs
            if spare is not None:
                entry.args.name(values, spare.data_ptr())
        finally:
            self._context.leave(previous)
        entry.spare, entry.spare_stream = spare, stream
        return out if t == bucket.tokens else out[:, :t]

    def _replay_native(self, native: Any, bucket: Bucket, ids: torch.Tensor,
                       tt: torch.Tensor, pos: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        """:meth:`replay_into` through the compiled path (``native``, the entry's, which
        holds the spare output): the same checks, argument sets and launch in one call
        (which enters the graph's context itself). ``native.call`` is the same path
        without Python before the launch, for the engine's known batch sizes; it hands
        this one whatever it will not launch."""
        stream, out = self._call_output(native, bucket)
        result = native.launch(ids, tt, pos, cu, out, bucket.tokens, bucket.seqs, stream)
        if result:
            native.spare, native.spare_stream = out, stream  # unused: the next call's
            if result == staged_launch.NOT_IN_BUCKET:
                raise ValueError(f"batch ({ids.shape[0]} tokens, {cu.shape[0] - 1} "
                                 f"sequences) does not fit {bucket}")
            if result == staged_launch.TENSORS_MISFIT:
                raise self._misfit()
            check(result, native.failed)
        native.rearm(stream)  # the next call's output, made and named as ``call`` does
        t = ids.shape[0]
        return out if t == bucket.tokens else out[:, :t]

    def _call_output(self, holder: Any, bucket: Bucket) -> tuple[int, torch.Tensor]:
        """A staged call's stream (ordered after the previous call's: ``_follow``) and its
        output: the spare made for it by the last call on that stream, else a fresh one
        (the spare belongs to its stream). ``holder`` keeps the spare (``spare``,
        ``spare_stream``: the entry on the Python path, its ``StagedLaunch`` on the
        compiled one) and holds none until the call puts one back."""
        stream = self._current_stream()
        self._follow(stream)
        out = holder.spare
        if out is None or holder.spare_stream != stream:
            out = self._new_output(bucket)
        holder.spare = None
        return stream, out

    def _new_output(self, bucket: Bucket) -> torch.Tensor:
        return torch.empty((2, bucket.tokens), device=self._device, dtype=torch.float32)

    def _misfit(self) -> ValueError:
        return ValueError(f"replay_into takes contiguous 1-D int32 tensors on cuda:"
                          f"{self._index}, ids, token types and positions of one length "
                          "and at least one offset")

    def _spare(self, bucket: Bucket) -> torch.Tensor | None:
        """The next call's output, made after this call's launch (on the stream it will be
        written on, as torch makes an op's output) and named while this call runs, off
        the next call's path to its launch: a set applies to later launches only. (Made
        under this call's inference mode, or not: the next call returns it as it is.)
        None where memory ran out: this call's logits are done, so it returns them."""
        try:
            return self._new_output(bucket)
        except torch.OutOfMemoryError:
            return None

    def run_host(self, bucket: Bucket, ids: I32, tt: I32, pos: I32,
                 cu: I32) -> npt.NDArray[np.float32]:
        """The logits [2, T] of a packed host batch (int32 ``ids``/``tt``/``pos`` [T],
        ``cu`` [B + 1]), waited for: a view of the bucket's pinned output, which the next
        call overwrites (copy what you keep).

        The host writes the batch into pinned memory (:class:`_HostIO`). A bucket that
        stages itself gets it copied into its input buffer by the copy engine (one copy
        queued before its launch, ``HOST_BATCH_COPIED``; read over the bus by the first
        kernel instead, it cost the GPU ~22 µs) and writes the logits straight into
        pinned memory (``HOST_ZERO_COPY``): one copy and one launch, and no kernel
        argument set while calls stay on host batches. Other buckets also copy the logits
        back, in stream order."""
        entry = self._graphs.get(bucket) or self._capture(bucket)
        stream = self._current_stream()  # raw: torch's stream object costs ~5 µs (v26)
        self._follow(stream)
        previous = self._context.enter()
        try:
            io = entry.host_io
            if io is None:  # in the context: the driver maps the buffers for its device
                io = entry.host_io = _HostIO(bucket)
                if io.device is None and entry.args is not None:
                    warnings.warn("pinned host memory has no device address here: host "
                                  "batches are copied in and out", RuntimeWarning,
                                  stacklevel=2)
            bucket_layout(ids, tt, pos, cu, bucket, out=io.inputs_np)
            args = entry.args
            pinned = io.device if args is not None and HOST_ZERO_COPY else None
            if args is not None and pinned is not None and not HOST_BATCH_COPIED:
                args.name(*pinned)  # the first kernel reads the batch over the bus
            else:
                copy_to_device(entry.inputs.data_ptr(), io.inputs.data_ptr(),
                               io.inputs.nbytes, stream)
                if args is not None and pinned is not None:
                    args.name(args.host_values, pinned[1])
                elif args is not None:
                    args.host()
            entry.launch(stream)
            if pinned is None:
                io.logits.copy_(entry.logits, non_blocking=True)
            synchronize(stream)  # in the context: a raw handle names its stream there
        except BaseException:
            # What was queued must not read the pinned batch after the next call writes it.
            with contextlib.suppress(RuntimeError):
                synchronize(stream)
            raise
        finally:
            self._context.leave(previous)
        t = ids.shape[0]
        return io.logits_np if t == bucket.tokens else io.logits_np[:, :t]

    def _capture(self, bucket: Bucket) -> _Captured:
        with no_automatic_collection():
            return self._capture_unguarded(bucket)

    def _capture_unguarded(self, bucket: Bucket) -> _Captured:
        inputs = torch.zeros(bucket.buffer_len, dtype=torch.int32, device=self._device)
        ids, tt, pos, cu = split_inputs(inputs, bucket)
        cu.fill_(0)  # all sequences empty: the warm-up touches no uninitialised rows
        stage = self.stages_itself(bucket)

        def run() -> torch.Tensor:
            return self._forward(ids, tt, pos, cu, bucket.seqs, bucket.max_seqlen, stage)

        # Warm up on the capture stream: Triton compiles and cuBLAS picks its kernels
        # and workspaces here, outside the capture (neither may happen inside one).
        side = self._stream
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side), cublaslt.using(self._workspace):
            for _ in range(2):
                run()
        side.synchronize()
        torch.cuda.current_stream(self._device).wait_stream(side)
        # Kept (not only instantiated) where a call sets kernel arguments: the nodes are
        # found in it.
        graph = torch.cuda.CUDAGraph(keep_graph=stage)
        with (torch.cuda.graph(graph, pool=self._pool, stream=self._stream),
              cublaslt.using(self._workspace)):
            logits = run()
        call_args = None
        if stage and self._stage_args is not None:
            graph.instantiate()
            # As captured: the batch the host writes into ``inputs``, every row of it.
            host = (ids.data_ptr(), tt.data_ptr(), pos.data_ptr(), cu.data_ptr(),
                    bucket.tokens, bucket.seqs)
            stage_args = leading_args(graph, host, self._stage_args)
            output = pointer_arg(graph, logits.data_ptr())
            call_args = _CallArgs(stage_args, output, host, logits,
                                  self._native(graph, bucket, stage_args, output))
        entry = _Captured(inputs, logits, graph, Launcher(graph), call_args)
        self._graphs[bucket] = entry
        return entry
