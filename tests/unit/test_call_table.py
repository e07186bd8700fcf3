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
