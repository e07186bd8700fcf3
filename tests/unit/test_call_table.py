"""The call table's write protocol (``engine.fused.call_table``): the kernels that read it
are tested under the Triton interpreter (``test_fused_kernels``) and on the GPU."""

from __future__ import annotations

import pytest


def test_writes_wait_for_the_previous_graphs_acknowledgement() -> None:
    """A write waits for the graph that read the previous one (and times out, not hangs,
    when none comes); a failed launch is abandoned, so the next write does not wait."""
    torch = pytest.importorskip("torch")
    from engine.fused import call_table as ct

    table = ct.CallTable(timeout_s=0.05, pin_memory=False)
    ids, tt, pos = (torch.arange(5, dtype=torch.int32) for _ in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    out = torch.empty((2, 5))
    table.write(ids, tt, pos, cu, out)  # nothing outstanding: no wait
    s = table.tensor
    assert [int(v) for v in s[[ct.TOKENS, ct.SEQS, ct.SEQ, ct.ACK]]] == [5, 2, 1, 0]
    assert int(s[ct.IDS]) == ids.data_ptr() and int(s[ct.OUT]) == out.data_ptr()
    with pytest.raises(RuntimeError, match="did not finish"):
        table.write()  # the graph that read call 1 has not acknowledged it
    assert int(s[ct.SEQ]) == 1 and int(s[ct.TOKENS]) == 5  # untouched
    s[ct.ACK] = 1  # what the graph's last kernel writes
    table.write()
    assert [int(v) for v in s[[ct.TOKENS, ct.OUT, ct.SEQ]]] == [0, 0, 2]
    s[ct.ACK] = 2
    table.write()  # call 3: say its graph failed to launch
    table.abandon()
    table.write()  # no wait for the call that never ran
    assert int(s[ct.SEQ]) == 4


class _Stream:
    """What ``CallTable.wait`` asks of a stream: ``query()`` (idle?), which raises a CUDA
    error where one happened."""

    def __init__(self, idle: bool, error: Exception | None = None) -> None:
        self.idle, self.error, self.queries = idle, error, 0

    def query(self) -> bool:
        self.queries += 1
        if self.error is not None:
            raise self.error
        return self.idle


def test_wait_fails_fast_on_a_dead_or_finished_stream() -> None:
    """A host caller waits for the acknowledgement (its logits are in host memory then).
    A stream that went idle without acknowledging, or that reports a CUDA error, ends the
    wait at once with an error, well before the timeout; the table is left writable. A
    busy stream waits, and the timeout still bounds it."""
    torch = pytest.importorskip("torch")
    from engine.fused import call_table as ct

    table = ct.CallTable(timeout_s=30.0, pin_memory=False)
    ids = torch.arange(3, dtype=torch.int32)
    out = torch.empty((2, 3))
    table.write(ids, ids, ids, torch.tensor([0, 3], dtype=torch.int32), out)
    assert int(table.tensor[ct.OUT_HOST]) == 1  # a host output: the kernel fences first
    idle = _Stream(idle=True)
    with pytest.raises(RuntimeError, match="without acknowledging"):
        table.wait(idle)  # type: ignore[arg-type]
    assert idle.queries >= 1
    table.write()  # abandoned: no wait
    assert int(table.tensor[ct.OUT_HOST]) == 0
    with pytest.raises(ValueError, match="illegal memory access"):
        table.wait(_Stream(idle=False, error=ValueError("illegal memory access")))  # type: ignore[arg-type]
    table.write()  # abandoned too: no wait
    slow = ct.CallTable(timeout_s=0.01, pin_memory=False)
    slow.write()
    busy = _Stream(idle=False)
    with pytest.raises(RuntimeError, match="did not finish"):
        slow.wait(busy)  # type: ignore[arg-type]
    assert busy.queries >= 1
    table.tensor[ct.ACK] = table.tensor[ct.SEQ]
    table.wait(_Stream(idle=True, error=ValueError("not asked")))  # type: ignore[arg-type]
