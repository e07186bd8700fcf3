"""When each request is due: a fixed arrival schedule, decided before the run starts."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

Arrival = Literal["constant", "poisson"]


def arrival_offsets(
    rate: float, duration_s: float, max_requests: int, arrival: Arrival = "constant", seed: int = 0
) -> npt.NDArray[np.float64]:
    """Send times in seconds from the start of a step, all < ``duration_s``, at most
    ``max_requests`` of them.

    ``constant`` spaces requests exactly 1/rate apart; ``poisson`` draws exponential gaps of mean
    1/rate from a seeded generator, so a run is reproducible.
    """
    if rate <= 0 or duration_s <= 0 or max_requests <= 0:
        raise ValueError("rate, duration and max_requests must be positive")
    expected = int(np.ceil(rate * duration_s))
    if arrival == "constant":
        offsets = np.arange(expected, dtype=np.float64) / rate
    elif arrival == "poisson":
        rng = np.random.default_rng(seed)
        # Draw enough gaps to pass duration_s with overwhelming probability, then cut.
        n = expected + 10 * int(np.sqrt(expected)) + 10
        offsets = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    else:
        raise ValueError(f"unknown arrival process {arrival!r}")
    offsets = offsets[offsets < duration_s]
    return offsets[:max_requests]
