"""The call table: how one CUDA-graph launch serves a call on device tensors.

Without it a call on device tensors costs three launches: a staging kernel that copies the
caller's tensors into the graph's input buffer, the graph, and a copy of the logits out
of the graph's static buffer (H200, 2026-11-30: ~25-30 µs per call beyond the graph, most
of it the staging launch's host-side cost). With it the graph's first kernel
(``kernels.stage_from_table``) reads the caller's tensor addresses and sizes from this
table, and its last kernel (``kernels.logits_to_table``) writes the logits into the
caller's output tensor and acknowledges: one launch per call.

The table is int64 slots in pinned host memory, which kernels read and write through
unified virtual addressing; its address is baked into every graph at capture. A call
writes the table only once the previous call's graph has acknowledged (its last kernel
copies the table's sequence number into ``ACK``): a graph still queued behind other work
never reads the next call's values. Calls that hold their inputs in the graph's buffer
already (the host path) write a table with no tokens and no output.
"""

from __future__ import annotations

import time

import torch

IDS, TOKEN_TYPES, POSITIONS, CU_SEQLENS, TOKENS, SEQS, OUT, SEQ, ACK, OUT_HOST = range(10)
SLOTS = 16  # 10 used; 128 bytes


class CallTable:
    """The pinned table and its write protocol (callers serialise calls)."""

    def __init__(self, timeout_s: float = 60.0, pin_memory: bool = True) -> None:
        self.tensor = torch.zeros(SLOTS, dtype=torch.int64, pin_memory=pin_memory)
        self._slots = self.tensor.numpy()  # the same pinned memory
        self._timeout_s = timeout_s

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Until the last graph that read the table has acknowledged it (its output, if in
        host memory, is then there). With the ``stream`` it runs on, a CUDA error there is
        raised as soon as the stream reports it, and a stream gone idle without the
        acknowledgement is an error too: no call waits out the timeout on a dead GPU."""
        if self._slots[ACK] == self._slots[SEQ]:
            return
        start = time.monotonic()
        while self._slots[ACK] != self._slots[SEQ]:
            waited = time.monotonic() - start
            if waited > self._timeout_s:
                raise RuntimeError(
                    f"the previous CUDA-graph call did not finish within {self._timeout_s:.0f} s")
            if waited >= 1e-3 and stream is not None and self._stream_idle(stream):
                raise RuntimeError("the CUDA-graph call finished without acknowledging")
            time.sleep(0 if waited < 1e-3 else 1e-4)  # spin briefly, then yield the core

    def _stream_idle(self, stream: torch.cuda.Stream) -> bool:
        """Whether ``stream`` finished without acknowledging (an idle stream's writes are
        visible). Either that or a CUDA error it reports abandons the call: nothing will
        acknowledge it."""
        try:
            idle = stream.query() and self._slots[ACK] != self._slots[SEQ]
        except BaseException:
            self.abandon()
            raise
        if idle:
            self.abandon()
        return bool(idle)

    def abandon(self) -> None:
        """The graph launch that was to read the last write failed: acknowledge it here, so
        that the next write does not wait for an acknowledgement that will never come."""
        self._slots[ACK] = self._slots[SEQ]

    def write(self, ids: torch.Tensor | None = None, token_types: torch.Tensor | None = None,
              positions: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> None:
        """Name the next graph launch's inputs (int32 [T] x 3, [B + 1]) and output (float32
        [2, T], contiguous); without inputs the graph stages nothing, without ``out`` it
        copies nothing (its static logits are still written). Pinned host tensors work too
        (the kernels reach them through unified addressing): a host ``out`` is complete
        once :meth:`wait` returns."""
        self.wait()
        s = self._slots
        seq = int(s[SEQ]) + 1
        dst = 0 if out is None else out.data_ptr()
        s[OUT_HOST] = int(out is not None and not out.is_cuda)
        if ids is None:
            s[TOKENS:SEQ + 1] = (0, 0, dst, seq)
            return
        assert token_types is not None and positions is not None and cu_seqlens is not None
        s[:SEQ + 1] = (ids.data_ptr(), token_types.data_ptr(), positions.data_ptr(),
                       cu_seqlens.data_ptr(), ids.shape[0], cu_seqlens.shape[0] - 1, dst, seq)
