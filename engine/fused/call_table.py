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

import struct
import time
from collections.abc import Callable

import torch

IDS, TOKEN_TYPES, POSITIONS, CU_SEQLENS, TOKENS, SEQS, OUT, SEQ, ACK = range(9)
SLOTS = 16  # 9 used; 128 bytes
_ALL, _TAIL = struct.Struct("<8q"), struct.Struct("<4q")  # slots IDS..SEQ; TOKENS..SEQ


class CallTable:
    """The pinned table and its write protocol (callers serialise calls)."""

    def __init__(self, timeout_s: float = 60.0, pin_memory: bool = True,
                 probe: Callable[[], object] | None = None) -> None:
        """``probe``: a CUDA call that raises the device's error if it has one (e.g. a
        stream query), made while a wait lasts: after a fault (an illegal address, a
        device-side assert) no acknowledgement will come, and every CUDA call reports the
        fault, so the wait raises it at once rather than after ``timeout_s``."""
        self.tensor = torch.zeros(SLOTS, dtype=torch.int64, pin_memory=pin_memory)
        self._slots = self.tensor.numpy()  # the same pinned memory
        self._bytes = self._slots.data.cast("B")  # and as bytes, for struct
        self._timeout_s = timeout_s
        self._probe = probe

    def _wait_ack(self) -> None:
        """Until the last graph that read the table has acknowledged it."""
        if self._slots[ACK] == self._slots[SEQ]:
            return
        start = time.monotonic()
        probed = 0.0
        while self._slots[ACK] != self._slots[SEQ]:
            waited = time.monotonic() - start
            if waited > self._timeout_s:
                raise RuntimeError(
                    f"the previous CUDA-graph call did not finish within {self._timeout_s:.0f} s")
            if self._probe is not None and waited >= probed + 1e-3:  # ~1,000 probes a second
                probed = waited
                try:
                    self._probe()
                except Exception:  # the device's fault (an interrupt leaves the call pending)
                    self.abandon()  # nothing will acknowledge it now
                    raise
            time.sleep(0 if waited < 1e-3 else 1e-4)  # spin briefly, then yield the core

    def abandon(self) -> None:
        """The graph launch that was to read the last write failed: acknowledge it here, so
        that the next write does not wait for an acknowledgement that will never come."""
        self._slots[ACK] = self._slots[SEQ]

    def write(self, ids: torch.Tensor | None = None, token_types: torch.Tensor | None = None,
              positions: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> None:
        """Name the next graph launch's inputs (int32 [T] x 3, [B + 1]) and output (float32
        [2, T], contiguous); without inputs the graph stages nothing, without ``out`` it
        copies nothing (its static logits are still written)."""
        self._wait_ack()
        # struct straight into the pinned bytes: on every call's path (with a numpy slice
        # assignment a write took 1.50 us on the CI machine, with struct 1.21; 2026-12-01).
        seq = int(self._slots[SEQ]) + 1
        dst = 0 if out is None else out.data_ptr()
        if ids is None:
            _TAIL.pack_into(self._bytes, 8 * TOKENS, 0, 0, dst, seq)
            return
        assert token_types is not None and positions is not None and cu_seqlens is not None
        _ALL.pack_into(self._bytes, 0, ids.data_ptr(), token_types.data_ptr(),
                       positions.data_ptr(), cu_seqlens.data_ptr(), ids.shape[0],
                       cu_seqlens.shape[0] - 1, dst, seq)
