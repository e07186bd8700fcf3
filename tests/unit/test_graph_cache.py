"""``engine.fused.graphs.GraphCache``'s capture guard, without a GPU (captures themselves
are GPU tests)."""

from __future__ import annotations

import gc

import pytest


@pytest.mark.parametrize("fails", [False, True])
def test_captures_run_without_automatic_garbage_collection(fails: bool) -> None:
    """A collection inside a capture can free another graph and invalidate the capture
    (``benchmarks/capture_gc.py``): ``GraphCache`` holds automatic collection off while it
    captures and restores it afterwards, also when the capture raises; off before, it
    stays off."""
    from engine.fused.graphs import GraphCache

    cache = object.__new__(GraphCache)  # no CUDA here: only the guard is exercised
    seen = []

    def capture(bucket: object) -> str:
        seen.append(gc.isenabled())
        if fails:
            raise RuntimeError("capture invalidated")
        return "captured"

    cache._capture_unguarded = capture  # type: ignore[method-assign,assignment]
    assert gc.isenabled()
    for collecting in (True, False):
        if not collecting:
            gc.disable()
        try:
            if fails:
                with pytest.raises(RuntimeError, match="invalidated"):
                    cache._capture(None)  # type: ignore[arg-type]
            else:
                assert cache._capture(None) == "captured"  # type: ignore[arg-type]
            assert gc.isenabled() == collecting
        finally:
            gc.enable()
    assert seen == [False, False]


def test_overlapping_captures_keep_collection_off_until_the_last_ends() -> None:
    """Captures in two threads overlap: the first to finish must not turn collection back
    on under the other (the pause is counted, and restores the state it found)."""
    from engine.fused.graphs import no_automatic_collection

    assert gc.isenabled()
    first, second = no_automatic_collection(), no_automatic_collection()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


class _FakeArgs:
    """A kernel node's settable arguments: records what is set (``graph_args.KernelArgs``
    talks to the driver; its own tests are in ``test_graph_args``)."""

    def __init__(self, node: int, log: list[tuple[str, tuple[int, ...]]], name: str) -> None:
        self.node, self._log, self._name = node, log, name
        self.fail = False

    def set(self, *values: int) -> None:
        if self.fail:
            raise RuntimeError("refused")
        self._log.append((self._name, values))


def test_call_args_point_back_at_the_graph_buffers_once_per_switch() -> None:
    """Replays of host batches in a row set nothing after the first, and so do calls in
    a row on the same buffers (the pinned ones of ``run_host``); a call on other tensors
    sets both kernels, and the next host replay points them back, also after a call whose
    set failed halfway. One kernel for both ends is refused."""
    torch = pytest.importorskip("torch")
    from engine.fused.graphs import _CallArgs

    log: list[tuple[str, tuple[int, ...]]] = []
    stage, output = _FakeArgs(1, log, "stage"), _FakeArgs(2, log, "output")
    logits, out = torch.zeros(2, 8), torch.zeros(2, 8)
    args = _CallArgs(stage, output, (10, 11, 12, 13, 8, 1), logits)  # type: ignore[arg-type]
    host = [("stage", (10, 11, 12, 13, 8, 1)), ("output", (logits.data_ptr(),))]
    args.host()
    args.host()
    assert log == host
    log.clear()
    args.name((20, 21, 22, 23, 5, 1), out.data_ptr())
    args.name((20, 21, 22, 23, 5, 1), out.data_ptr())
    assert log == [("stage", (20, 21, 22, 23, 5, 1)), ("output", (out.data_ptr(),))]
    log.clear()
    args.name((20, 21, 22, 23, 5, 1), out.data_ptr() + 64)  # the output alone differs
    assert log == [("stage", (20, 21, 22, 23, 5, 1)), ("output", (out.data_ptr() + 64,))]
    log.clear()
    args.host()
    args.host()
    assert log == host
    log.clear()
    output.fail = True
    with pytest.raises(RuntimeError, match="refused"):
        args.name((30, 31, 32, 33, 5, 1), out.data_ptr())
    output.fail = False
    log.clear()
    args.host()
    assert log == host
    with pytest.raises(RuntimeError, match="first kernel is also its last"):
        _CallArgs(stage, _FakeArgs(1, log, "x"), (), logits)  # type: ignore[arg-type]


def test_staged_tensors_fit_refuses_what_a_kernel_would_misread() -> None:
    """``staged_tensors_fit`` (``replay_into``'s check before it hands bare addresses to a
    graph): contiguous 1-D int32 ids, token types and positions of one length and int32
    offsets (at least one), on the graph's device (CPU tensors report device -1); anything else is
    refused."""
    import torch

    from engine.fused.graphs import staged_tensors_fit

    def batch() -> list[torch.Tensor]:
        return [torch.zeros(8, dtype=torch.int32) for _ in range(3)] + [
            torch.tensor([0, 8], dtype=torch.int32)]

    assert staged_tensors_fit(*batch(), -1)
    assert not staged_tensors_fit(*batch(), 0)  # another device
    for i in range(4):
        wrong = batch()
        wrong[i] = wrong[i].long()
        assert not staged_tensors_fit(*wrong, -1), ("dtype", i)
        strided = batch()
        strided[i] = torch.zeros(2 * strided[i].shape[0], dtype=torch.int32)[::2]
        assert not staged_tensors_fit(*strided, -1), ("stride", i)
    for i in range(3):
        short = batch()
        short[i] = short[i][:7]
        assert not staged_tensors_fit(*short, -1), ("length", i)
    flat = batch()
    assert not staged_tensors_fit(*(t.reshape(2, 4) for t in flat[:3]), flat[3], -1)
    assert not staged_tensors_fit(*flat[:3], flat[3].reshape(1, 2), -1)  # 2-D offsets
    assert not staged_tensors_fit(*flat[:3], flat[3][:0], -1)  # no offset at all


def test_routes_are_remembered_for_captured_buckets_only_and_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``GraphCache.remember_route``: the engine's shortcut from a batch size to its bucket
    is kept only once the bucket's graph exists, and up to ``MAX_ROUTES`` sizes."""
    from types import SimpleNamespace

    from engine.fused import graphs
    from engine.fused.packing import bucket_for

    cache = graphs.GraphCache.__new__(graphs.GraphCache)  # no GPU: the two dicts alone
    cache._graphs, cache.routes = {}, {}
    bucket = bucket_for(100, 1, 100)
    cache.remember_route((100, 1, 100), bucket)
    assert cache.routes == {}  # not captured
    native = object()  # its compiled call path, kept beside it
    cache._graphs[bucket] = SimpleNamespace(args=SimpleNamespace(native=native))  # type: ignore[assignment]
    monkeypatch.setattr(graphs, "MAX_ROUTES", 2)
    for t in (100, 101, 102):
        cache.remember_route((t, 1, 100), bucket)
    assert cache.routes == {(100, 1, 100): (bucket, native), (101, 1, 100): (bucket, native)}
    python_path = bucket_for(200, 1, 200)  # no call arguments: no compiled path
    cache._graphs[python_path] = SimpleNamespace(args=None)  # type: ignore[assignment]
    cache.routes.clear()
    cache.remember_route((200, 1, 200), python_path)
    assert cache.routes == {(200, 1, 200): (python_path, None)}
