"""Per-shape choice between cuBLAS and the Triton split-K GEMM, made by measuring both.

At batch-1 sizes (a few hundred tokens) cuBLAS covers a [T, N] output with few tiles, so
a handful of multiprocessors stream the whole weight while the rest idle. The split-K
kernel (``kernels.splitk_linear``) cuts K into slices handled by separate programs and
leaves float32 partial sums, which the next kernel (residual LayerNorm or bias-GELU) adds
while reading its input anyway. Which wins depends on the shape and the GPU, so the
planner times the candidates once per (M, N, K, dtype) on the live tensors, outside any
CUDA-graph capture (the engine's warm-up runs before each capture), and remembers the
winner. A shape first seen during a capture falls back to cuBLAS.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType

import torch


@dataclass(frozen=True)
class GemmPlan:
    """``splits == 0``: cuBLAS; otherwise split-K with these tiles."""

    splits: int
    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4


CUBLAS = GemmPlan(0)


def splitk_candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmPlan]:
    """Split-K plans worth timing: about 1, 2 and 4 waves of programs over the GPU."""
    if k % 64:
        return []
    tiles = -(-m // 64) * -(-n // 64)
    divisors = [s for s in range(1, 17) if (k // 64) % s == 0]
    chosen: set[int] = set()
    for waves in (1, 2, 4):
        best = min(divisors, key=lambda s: abs(tiles * s - waves * sms))
        chosen.add(best)
    return [GemmPlan(s) for s in sorted(chosen)]


def _median_ms(fn: Callable[[], object], runs: int = 7) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return float(statistics.median(times))


def _consumer_ms(plan: GemmPlan, m: int, n: int, bytes_per_ms: float = 2.5e9) -> float:
    """Extra time the consumer kernel spends reading float32 partials instead of one
    fp16 output (at ~2.5 TB/s), so the choice counts the whole cost of splitting."""
    if plan.splits == 0:
        return 0.0
    return (plan.splits * 4 - 2) * m * n / bytes_per_ms


class GemmPlanner:
    """``linear(x, w)``: ``x @ w.T`` by the faster of cuBLAS and split-K for its shape.

    Returns [M, N] in ``x``'s dtype (cuBLAS) or float32 partials [S, M, N] (split-K);
    the kernels that consume GEMM outputs accept both. Disabled (always cuBLAS/torch.mm)
    off CUDA, or when ``enabled`` is False, or for M above ``max_m`` where cuBLAS tiles
    already fill the GPU.
    """

    def __init__(self, ops: ModuleType, enabled: bool = True, max_m: int = 512,
                 force: GemmPlan | None = None) -> None:
        self._ops = ops
        self.enabled = enabled
        self.max_m = max_m
        self._force = force  # tests: use this plan whenever it applies
        self.plans: dict[tuple[int, int, int, torch.dtype], GemmPlan] = {}

    @property
    def forcing_splitk(self) -> bool:
        """True when tests impose split-K plans (the FFN1 GEMM then stays unfused)."""
        return self._force is not None and self._force.splits > 0

    def _run(self, plan: GemmPlan, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if plan.splits == 0:
            return torch.mm(x, w.t())
        out: torch.Tensor = self._ops.splitk_linear(
            x, w, plan.splits, block_m=plan.block_m, block_n=plan.block_n,
            block_k=plan.block_k, num_warps=plan.num_warps, num_stages=plan.num_stages)
        return out

    def plan(self, x: torch.Tensor, w: torch.Tensor) -> GemmPlan:
        m, k = x.shape
        n = w.shape[0]
        if self._force is not None:
            ok = self._force.splits == 0 or k % (self._force.splits * self._force.block_k) == 0
            return self._force if ok else CUBLAS
        if not self.enabled or not x.is_cuda or m > self.max_m:
            return CUBLAS
        key = (m, n, k, x.dtype)
        if key in self.plans:
            return self.plans[key]
        if torch.cuda.is_current_stream_capturing():
            return CUBLAS  # cannot time inside a capture; the warm-up normally got here first
        timed: dict[GemmPlan, float] = {}
        for plan in [CUBLAS, *splitk_candidates(m, n, k)]:
            timed[plan] = _median_ms(partial(self._run, plan, x, w)) + _consumer_ms(plan, m, n)
        best = min(timed, key=timed.__getitem__)
        self.plans[key] = best
        return best

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self._run(self.plan(x, w), x, w)
