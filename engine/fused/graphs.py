"""CUDA graphs of the whole forward pass, one per bucket, captured on first use.

A graph owns static buffers: one int32 input buffer in the ``packing.bucket_layout``
layout, and the float32 [2, bucket.tokens] logits its captured forward wrote. A call
copies a batch into the input buffer, replays, and reads the logits before the next
call (the caller copies out what it keeps). With ``table_ops`` (an op set with
``stage_from_table`` / ``logits_to_table``) the graphs of buckets up to
``TABLE_MAX_TOKENS`` tokens also stage their own inputs and write the caller's output
tensor, named in a pinned call table (``engine.fused.call_table``):
:meth:`GraphCache.replay_into` is then one launch.
Not thread-safe: the engine serialises calls.
All graphs share one memory pool: they are
replayed one at a time and none reads another's intermediates, so the pool's blocks can
serve every graph's activations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from engine.fused import cublaslt
from engine.fused.call_table import CallTable
from engine.fused.packing import Bucket

# Buckets up to this many tokens stage through the call table. Its kernels copy with one
# program (one bus round trip for the table each), which is what a call of a few hundred
# tokens wants; H200, 2026-11-30, BERT-large SQuAD mix of 256 windows (45k tokens): the
# two took 122 µs of a 35 ms pass, more than the launches they save, which matter less
# the larger the batch.
TABLE_MAX_TOKENS = 2048

# Batches above this many tokens run eagerly (the engine's ``max_graph_tokens``): their
# exact token count, no bucket padding, and the GPU's work hides the host's launches.
# H200, 2026-11-30, BERT-large calibrated FP8, per call on SQuAD-mix windows
# (`benchmarks/bucket_padding.py`, 16d10de): eager against the graph (default buckets)
# 7.6 vs 3.0 ms at 16 windows (~3k tokens) and 11.2 vs 4.8 at 32 (~5.4k): the host's
# launches, 7.5-11 ms a pass, show; 9.3 vs 9.8 at 64 (~11k), 17.9 vs 19.0 at 128 (~22k),
# 35.7 vs 36.5 at 256 (~45k). The crossover lies between 5.6k and 10.5k tokens (not
# sampled between); 16k leaves a margin for slower hosts.
MAX_GRAPH_TOKENS = 16384

# forward(ids, token_types, positions, cu_seqlens, n_seqs, max_seqlen) -> logits [2, T]
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def split_inputs(buf: torch.Tensor, bucket: Bucket) -> tuple[torch.Tensor, ...]:
    """Views (ids, token types, positions, cu_seqlens) of a bucket's input buffer."""
    n = bucket.tokens
    return buf[:n], buf[n : 2 * n], buf[2 * n : 3 * n], buf[3 * n :]


@dataclass
class _Captured:
    inputs: torch.Tensor  # int32 [bucket.buffer_len]
    logits: torch.Tensor  # float32 [2, bucket.tokens], written by each replay
    graph: torch.cuda.CUDAGraph


class GraphCache:
    """Capture-once, replay-many forward passes keyed by :class:`Bucket`."""

    def __init__(self, forward: Forward, device: torch.device, max_graphs: int = 128,
                 table_ops: ModuleType | None = None) -> None:
        self._forward = forward
        self._device = device
        self._max_graphs = max_graphs
        self._graphs: dict[Bucket, _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()
        # Warm-ups and captures on one stream of the cache's own, and cuBLASLt calls on a
        # workspace of its own: its graphs keep the pointer and replay on their callers'
        # streams, so no other engine's GEMMs may share it (cublaslt.Workspace); the
        # warm-up makes it before the capture.
        self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._workspace = cublaslt.Workspace()
        self._ops = table_ops
        # A wait for the table fails as soon as the device reports a fault.
        self._table = (CallTable(probe=torch.cuda.current_stream(device).query)
                       if table_ops is not None else None)

    def stages_itself(self, bucket: Bucket) -> bool:
        """Whether the bucket's graph reads the call table (:meth:`replay_into`)."""
        return self._ops is not None and bucket.tokens <= TABLE_MAX_TOKENS

    def __len__(self) -> int:
        return len(self._graphs)

    def can_serve(self, bucket: Bucket) -> bool:
        """True when the bucket has a graph or there is room to capture one."""
        return bucket in self._graphs or len(self._graphs) < self._max_graphs

    def inputs(self, bucket: Bucket) -> torch.Tensor:
        """The bucket's static input buffer (capturing the graph first if needed)."""
        entry = self._graphs.get(bucket) or self._capture(bucket)
        return entry.inputs

    def replay(self, bucket: Bucket) -> torch.Tensor:
        """Run the bucket's graph on what its input buffer holds; returns the static logits."""
        entry = self._graphs[bucket]
        if self._table is not None and self.stages_itself(bucket):
            self._table.write()  # nothing to stage, nothing to copy out
        self._launch(entry.graph)
        return entry.logits

    def replay_into(self, bucket: Bucket, ids: torch.Tensor, tt: torch.Tensor,
                    pos: torch.Tensor, cu: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """One launch: the bucket's graph stages contiguous int32 ``ids``/``tt``/``pos``
        [T] and ``cu`` [B + 1] (rows past T keep earlier batches' tokens, in no sequence)
        and writes the logits into ``out`` (float32 [2, T], contiguous), returned."""
        assert self._table is not None and self.stages_itself(bucket), \
            "replay_into needs a GraphCache with table_ops, and a bucket that stages itself"
        entry = self._graphs.get(bucket) or self._capture(bucket)
        if ids.shape[0] > bucket.tokens or cu.shape[0] - 1 > bucket.seqs:
            raise ValueError(f"batch ({ids.shape[0]} tokens, {cu.shape[0] - 1} sequences) "
                             f"does not fit {bucket}")
        self._table.write(ids, tt, pos, cu, out)
        self._launch(entry.graph)
        return out

    def _launch(self, graph: torch.cuda.CUDAGraph) -> None:
        try:
            graph.replay()
        except BaseException:
            if self._table is not None:
                self._table.abandon()  # nothing will acknowledge what was just written
            raise

    def _capture(self, bucket: Bucket) -> _Captured:
        inputs = torch.zeros(bucket.buffer_len, dtype=torch.int32, device=self._device)
        ids, tt, pos, cu = split_inputs(inputs, bucket)
        cu.fill_(0)  # all sequences empty: the warm-up touches no uninitialised rows

        # The op set and table when this bucket's graph reads the call table, else None.
        ops, table = (self._ops, self._table) if self.stages_itself(bucket) else (None, None)

        def run() -> torch.Tensor:
            if ops is not None and table is not None:
                ops.stage_from_table(inputs, bucket.tokens, table.tensor)
            logits = self._forward(ids, tt, pos, cu, bucket.seqs, bucket.max_seqlen)
            if ops is not None and table is not None:
                ops.logits_to_table(logits, table.tensor)
            return logits

        if table is not None:
            # Both warm-up passes read this write (nothing to stage, nothing to copy out)
            # and acknowledge it; they are waited for below, so neither is still queued
            # when a call writes the table next.
            table.write()

        # Warm up on the capture stream: Triton compiles and cuBLAS picks its kernels
        # and workspaces here, outside the capture (neither may happen inside one).
        side = self._stream
        side.wait_stream(torch.cuda.current_stream(self._device))
        try:
            with torch.cuda.stream(side), cublaslt.using(self._workspace):
                for _ in range(2):
                    run()
        except BaseException:
            if table is not None:
                side.synchronize()  # what was queued has read the table before it is free
                table.abandon()
            raise
        side.synchronize()
        torch.cuda.current_stream(self._device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with (torch.cuda.graph(graph, pool=self._pool, stream=self._stream),
              cublaslt.using(self._workspace)):
            logits = run()
        entry = _Captured(inputs, logits, graph)
        self._graphs[bucket] = entry
        return entry
