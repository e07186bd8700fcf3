# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""What a handoff between dependent kernels costs at batch-1 sizes, and whether per-row-block
readiness flags beat the grid-wide wait of programmatic dependent launch (PDL).

The small-batch path (BERT-base 1x128) is a chain of ~60 dependent kernels, each 2-7 µs,
of which v5 put about 2 µs on the handoff (grid drain, memory flush, ``griddepcontrol.wait``;
this tool measured 0.85 µs, NOTES v16).
Here a chain of ``--steps`` GEMM kernels ``x_{k+1} = x_k W_k`` (``--tokens`` rows, hidden
``--hidden``, tile BM x BN, K loop over the hidden size), captured in one CUDA graph, runs
in four modes:

- ``plain``: ordinary launches; each kernel starts after the previous one has finished.
- ``pdl``: ``launch_pdl``; each program waits on ``griddepcontrol.wait`` (the whole previous
  grid complete and flushed), then lets the next kernel launch. What the engine does.
- ``flags``: ``launch_pdl``; each program first lets the next kernel launch, then spins on
  a counter of its row block of the previous kernel (one release add per finished tile,
  acquire once the count is reached). A program waits for its own rows only, not for the
  grid, and nothing waits for the flush of a grid's exit.
- ``flags_late``: as ``flags``, but the next kernel may launch only once the flag wait is
  over, so at most two kernels' programs are resident (with ``flags`` as many of the
  chain's kernels as fit launch at once, and all but one spin).

All four compute the same thing in the same order, so their outputs must be equal bit for
bit (checked each run: a flag that released too early would show). The per-kernel time is
the graph's time, less that of the chain's two resets (timed as a graph of their own),
over the steps. ``--work none`` drops the K loop (one row read per program): the handoff
alone.

    python -m benchmarks.handoff --out benchmarks/gpu-handoff.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import triton
import triton.language as tl

MODES = ("plain", "pdl", "flags", "flags_late")


@triton.jit
def _wait_count(ptr, target, HW: tl.constexpr):
    """Spin until the counter at ``ptr`` reaches ``target``, then acquire (GPU scope)."""
    seen = tl.load(ptr, volatile=True)
    while seen < target:
        seen = tl.load(ptr, volatile=True)
    if HW:  # (no inline PTX on the CPU interpreter, which runs programs one at a time)
        tl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _step_kernel(x_ptr, w_ptr, y_ptr, flags_ptr, step, M, H: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                 WORK: tl.constexpr, HW: tl.constexpr):
    rb = tl.program_id(0)
    cb = tl.program_id(1)
    row_blocks = tl.num_programs(0)
    if MODE == 1 and HW:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if MODE >= 2:
        if HW and MODE == 2:
            tl.extra.cuda.gdc_launch_dependents()
        if step > 0:
            _wait_count(flags_ptr + (step - 1) * row_blocks + rb, tl.num_programs(1), HW)
        if HW and MODE == 3:
            tl.extra.cuda.gdc_launch_dependents()
    offs_m = rb * BM + tl.arange(0, BM)
    offs_n = cb * BN + tl.arange(0, BN)
    rmask = offs_m < M
    if WORK:
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, H, BK):
            offs_k = k0 + tl.arange(0, BK)
            a = tl.load(x_ptr + offs_m[:, None] * H + offs_k[None, :], mask=rmask[:, None],
                        other=0.0, cache_modifier=".cg")
            b = tl.load(w_ptr + offs_k[:, None] * H + offs_n[None, :])
            acc = tl.dot(a, b, acc)
    else:  # one element of each row: a dependent read and nothing else
        a = tl.load(x_ptr + offs_m * H + cb, mask=rmask, other=0.0, cache_modifier=".cg")
        acc = a.to(tl.float32)[:, None] + offs_n[None, :].to(tl.float32) * 1e-3
    tl.store(y_ptr + offs_m[:, None] * H + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=rmask[:, None])
    if MODE >= 2:
        tl.debug_barrier()  # every thread's stores happen before the release
        tl.atomic_add(flags_ptr + step * row_blocks + rb, 1, sem="release", scope="gpu")


def chain(x0: Any, weights: list[Any], steps: int, mode: str, work: bool,
          bm: int = 64, bn: int = 32, bk: int = 64, warps: int = 4, stages: int = 3
          ) -> tuple[Any, Any, Any]:
    """The buffers, the flag counters (one per step and row block) and a function running
    ``steps`` kernels from ``x0`` (step k uses ``weights[k % len(weights)]``); the function
    returns the last output."""
    import torch

    m, h = x0.shape
    bufs = [x0.clone(), torch.empty_like(x0)]
    grid = (triton.cdiv(m, bm), h // bn)
    flags = torch.zeros(steps * grid[0], dtype=torch.int32, device=x0.device)
    code = MODES.index(mode)
    hw = x0.is_cuda and not triton.knobs.runtime.interpret
    extra = {"launch_pdl": True} if mode != "plain" and hw else {}

    def run() -> Any:
        flags.zero_()
        bufs[0].copy_(x0)
        for k in range(steps):
            src, dst = bufs[k % 2], bufs[(k + 1) % 2]
            _step_kernel[grid](src, weights[k % len(weights)], dst, flags, k, m, h, bm, bn,
                               bk, code, work, hw, num_warps=warps, num_stages=stages, **extra)
        return bufs[steps % 2]

    return bufs, flags, run


def measure(tokens: int, hidden: int, steps: int, works: list[bool], rounds: int, reps: int,
            bn: int) -> dict[str, Any]:
    import torch

    from benchmarks.rounds import capture_graph, cuda_ms, interleaved

    gen = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(tokens, hidden, device="cuda", generator=gen).half()
    # unit-gain weights keep the chain's values O(1); 8 copies (a few MB) stay in L2
    weights = [(torch.randn(hidden, hidden, device="cuda", generator=gen)
                / hidden ** 0.5).half() for _ in range(8)]
    out: dict[str, Any] = {}
    for work in works:
        label = "gemm" if work else "none"
        graphs, results = {}, {}
        for mode in MODES:
            bufs, flags, run = chain(x0, weights, steps, mode, work, bn=bn)
            results[mode] = run().clone()
            g = capture_graph(run, 1)
            graphs[mode] = g
            bufs[steps % 2].zero_()  # so the check below sees the graph's own output
            g.replay()
            torch.cuda.synchronize()
            results[mode + "_graph"] = bufs[steps % 2].clone()
        ref = results["plain"]
        equal = {k: bool(torch.equal(v, ref)) for k, v in results.items()}
        # the chain's own resets (flags zeroed, first buffer restored) as a graph alone,
        # timed with the others and taken off their time
        setup = capture_graph(lambda f=flags, b=bufs: (f.zero_(), b[0].copy_(x0)), 1)
        graphs["_setup"] = setup
        times = interleaved({m: g.replay for m, g in graphs.items()}, rounds, reps,
                            timer=cuda_ms)
        fixed = statistics.median(times.pop("_setup"))
        per_kernel = {m: (statistics.median(t) - fixed) * 1e3 / steps
                      for m, t in times.items()}
        out[label] = {"us_per_kernel": per_kernel, "rounds_ms": times, "setup_ms": fixed,
                      "outputs_equal_plain": equal}
        print(f"work={label}: " + " ".join(f"{m} {v:.2f} us" for m, v in per_kernel.items())
              + f"  equal={equal}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--bn", type=int, default=32, help="tile width (programs: rows/64 x H/bn)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--work", default="gemm,none")
    p.add_argument("--commit", default="")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch

    res = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
           "commit": a.commit, "tokens": a.tokens, "hidden": a.hidden, "bn": a.bn,
           "steps": a.steps,
           "results": measure(a.tokens, a.hidden, a.steps,
                              [w == "gemm" for w in a.work.split(",")], a.rounds, a.reps, a.bn)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
