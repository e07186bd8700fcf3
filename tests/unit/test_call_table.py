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


def test_a_wait_raises_the_devices_fault_at_once() -> None:
    """While a write waits, the probe (on the GPU a stream query) runs about every
    millisecond: the error it raises (a faulted device) ends the wait at once and abandons
    the call, so the next write does not wait for it either; a probe that finds nothing
    leaves the timeout in charge."""
    import time

    pytest.importorskip("torch")
    from engine.fused import call_table as ct

    probes: list[float] = []

    def faulted() -> None:
        probes.append(time.monotonic())
        if len(probes) >= 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    table = ct.CallTable(timeout_s=30.0, pin_memory=False, probe=faulted)
    table.write()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        table.write()  # call 1's graph will never acknowledge
    assert time.monotonic() - t0 < 5.0 and len(probes) == 3
    assert probes[0] - t0 >= 1e-3  # no probe in the first millisecond's spin
    assert int(table.tensor[ct.SEQ]) == 1
    table.write()  # abandoned: no wait
    assert int(table.tensor[ct.SEQ]) == 2 and len(probes) == 3

    quiet = ct.CallTable(timeout_s=0.05, pin_memory=False, probe=lambda: None)
    quiet.write()
    with pytest.raises(RuntimeError, match="did not finish"):
        quiet.write()
