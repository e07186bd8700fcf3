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
