"""What float32 atomic adds into L2 cost on this GPU, by how many programs add into each
address: the cost model behind split-K through atomics (the deferred layer's FFN2 adds
4 K slices into each output tile; the one-kernel FFN tried in v19 added one slice per
hidden block, 48 on BERT-base: ``engine/fused/NOTES.md``).

    python3 benchmarks/atomic_contention.py --out atomics.json

Each case launches ``programs`` programs of 4 warps; each adds ``tiles`` 64x64 float32
tiles (vector reductions, ``red.global.add.v4.f32``, as ``tl.atomic_add`` compiles when its
result is unused) into a buffer of ``unique`` tiles, program ``p``'s ``t``-th tile being
``(p * tiles + t) % unique``: every address takes ``programs * tiles / unique`` adds
(the *ways*). The same volume is also timed as plain stores into distinct tiles. A case
is a CUDA graph of 20 launches, replayed in interleaved rounds (``rounds``); the table
gives the median µs per launch, minus an empty launch's, and the adds per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAUNCHES = 20  # per graph
TILE = 64 * 64  # float32 elements per tile

# name -> (programs, tiles per program, unique tiles, store instead of add)
CASES: dict[str, tuple[int, int, int, bool]] = {
    "empty": (96, 0, 1, False),
    "ffn2_4_splits": (96, 1, 24, False),  # the deferred FFN2 at 1x128 (64x64 tiles, 4 splits)
    "ffn2_4_splits_store": (96, 1, 96, True),
    "volume_1_way": (96, 12, 1152, False),
    "volume_4_ways": (96, 12, 288, False),
    "volume_12_ways": (96, 12, 96, False),
    "volume_48_ways": (96, 12, 24, False),  # the one-kernel FFN's h64 plan
    "volume_store": (96, 12, 1152, True),
}


def ways(programs: int, tiles: int, unique: int) -> float:
    """Adds each address takes: every program's tiles spread evenly over ``unique``."""
    return programs * tiles / unique


def table(results: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| case | programs x tiles | ways | µs per launch (net) | G vector adds/s |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        if name == "empty":
            continue
        rate = r["v4_ops"] / (r["net_us"] * 1e3) if r["net_us"] > 0 else float("nan")
        kind = "stores" if r["store"] else f"{r['ways']:g}"
        lines.append(f"| {name} | {r['programs']} x {r['tiles']} | {kind} | "
                     f"{r['net_us']:.2f} | {rate:.1f} |")
    return lines


def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def add_tiles(buf_ptr, tiles, unique, STORE: tl.constexpr):
        pid = tl.program_id(0)
        offs = tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :]
        v = (offs + pid).to(tl.float32) * 1e-3
        for t in range(tiles):
            at = buf_ptr + ((pid * tiles + t) % unique).to(tl.int64) * 4096 + offs
            if STORE:
                tl.store(at, v)
            else:
                tl.atomic_add(at, v, sem="relaxed")

    return add_tiles


def run(rounds: int, reps: int) -> dict[str, dict[str, float]]:
    import torch

    sys.path.insert(0, str(REPO))
    from benchmarks.rounds import capture_graph, cuda_ms, interleaved

    kernel = _kernel()
    graphs = {}
    for name, (programs, tiles, unique, store) in CASES.items():
        buf = torch.zeros(unique * TILE, device="cuda")

        def launch(buf: Any = buf, programs: int = programs, tiles: int = tiles,
                   unique: int = unique, store: bool = store) -> None:
            kernel[(programs,)](buf, tiles, unique, STORE=store, num_warps=4)

        graphs[name] = capture_graph(launch, LAUNCHES)
    times = interleaved({n: g.replay for n, g in graphs.items()}, rounds, reps,
                        timer=cuda_ms)
    empty = statistics.median(times["empty"]) * 1e3 / LAUNCHES
    out = {}
    for name, (programs, tiles, unique, store) in CASES.items():
        us = statistics.median(times[name]) * 1e3 / LAUNCHES
        out[name] = {"programs": programs, "tiles": tiles, "unique": unique, "store": store,
                     "ways": ways(programs, tiles, unique), "us": us, "net_us": us - empty,
                     "v4_ops": programs * tiles * TILE / 4}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=50, help="graph replays per round")
    p.add_argument("--commit", default=None, help="the tree's commit (the device's git "
                   "metadata can be stale)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import torch

    results = run(args.rounds, args.reps)
    print("\n".join(table(results)))
    if args.out:
        args.out.write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(), "commit": args.commit,
            "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))


if __name__ == "__main__":
    main()
