"""``benchmarks/rounds.py``: the order and bookkeeping of interleaved rounds (no GPU: a
counting timer stands in for CUDA events)."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.rounds import interleaved


def test_rounds_interleave_variants_with_their_warm_up_and_preparation() -> None:
    log: list[str] = []
    clock = iter(range(100))

    def timer(fn: Callable[[], object], reps: int) -> float:
        for _ in range(reps):
            fn()
        return float(next(clock))

    variants = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    reported: list[tuple[int, dict[str, float]]] = []
    times = interleaved(variants, rounds=2, reps=3, warm=1, prepare=lambda n: log.append(f"+{n}"),
                        report=lambda r, ms: reported.append((r, ms)), timer=timer)
    assert log == ["+a", "a", "a", "a", "a", "+b", "b", "b", "b", "b"] * 2  # 1 warm + 3 timed
    assert times == {"a": [0.0, 2.0], "b": [1.0, 3.0]}
    assert reported == [(0, {"a": 0.0, "b": 1.0}), (1, {"a": 2.0, "b": 3.0})]
