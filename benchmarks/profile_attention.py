"""Launches the packed attention kernel on a SQuAD-mix batch, for Nsight Compute, or times
its forms.

BERT-large attention (16 heads of 64) over ``--windows`` windows with lengths drawn from
the SQuAD dev windows, through ``kernels.attention_varlen`` in each of ``--forms``
(:data:`FORMS`; by default the batch's tile list, the engine's default on the mix, and the
grid). Each form is launched once to compile, then, in the order printed, once more for
the profiler to read:

    ncu --clock-control none -k regex:_attn_varlen --csv --page raw \\
        --section SpeedOfLight --section WarpStateStats --section Occupancy \\
        --section SchedulerStats python3 benchmarks/profile_attention.py > ncu_attention.csv

(Each form appears twice, compiling launch first; the tile-list build is a launch of its
own kernel, which ``-k`` leaves out. With ``--launch-skip`` set to the number of forms,
v40's run profiled nothing; v14's with ``--launch-skip 2`` over two forms had worked.)
``--time`` instead times each form by replaying a CUDA graph of 24 launches (median µs
a launch, idle GPU; ``attn_backends._time_graph``), in interleaved rounds, and checks that
every form writes the first form's output bit for bit. Random inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# name -> (tile list?, attention_varlen keywords, attention module constants while launched)
FORMS: dict[str, tuple[bool, dict[str, Any], dict[str, Any]]] = {
    "tiles": (True, {}, {}),
    "grid": (False, {}, {}),
    "tiles_64x32": (True, {"config": (64, 32, 4, 3)}, {}),
    "tiles_64x32_88": (True, {"config": (64, 32, 4, 3)}, {"ATTN_MAXNREG": 88}),
}


def form_call(name: str, qkv: Any, bias: Any, cu: Any, t: int, max_len: int, n: int,
              heads: int, head_dim: int) -> Callable[[], Any]:
    """A call of form ``name`` on these inputs (its tile list built once, here)."""
    from engine.fused.kernels import attention as attn

    tiled, kwargs, constants = FORMS[name]
    config = kwargs.get("config") or attn.attention_config(max_len, n, heads, head_dim, t)
    tiles = (attn.attention_tiles(cu, t, n, max_len, heads, head_dim, config=config,
                                  force=True) if tiled else None)

    def call() -> Any:
        saved = {k: getattr(attn, k) for k in constants}
        for k, v in constants.items():
            setattr(attn, k, v)
        try:
            return attn.attention_varlen(qkv, bias, cu, max_len, n, heads, tiles=tiles,
                                         **kwargs)
        finally:
            for k, v in saved.items():
                setattr(attn, k, v)
    return call


def mix_batch(windows: int, hidden: int) -> tuple[list[int], Any, Any, Any]:
    """``windows`` lengths drawn from the SQuAD dev windows (seed 3) and random packed
    attention inputs for them (``attn_backends.packed_qkv``): (lengths, cu_seqlens, QKV,
    bias)."""
    import numpy as np

    from benchmarks.attn_backends import packed_qkv
    from benchmarks.bench_gpu import squad_lengths

    rng = np.random.default_rng(3)
    lengths = [int(v) for v in rng.choice(squad_lengths(), windows)]
    return (lengths, *packed_qkv(lengths, hidden))


def time_forms(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """µs a launch of each call in ``rounds`` interleaved rounds (a CUDA graph of 24
    launches replayed on an idle GPU, ``attn_backends._time_graph``), printed as they come."""
    from benchmarks.attn_backends import _time_graph

    us: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            us[name].append(_time_graph(call, 24, 20)[0])
            print(f"{name}: {us[name][-1]:.1f} µs a launch", flush=True)
    return us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--forms", default="tiles,grid", help=f"of {', '.join(FORMS)}")
    p.add_argument("--time", action="store_true", help="time the forms instead")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="--time's JSON")
    args = p.parse_args()
    forms = [f for f in args.forms.split(",") if f]
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        p.error(f"unknown forms {unknown}; choose from {', '.join(FORMS)}")
    sys.path.insert(0, str(REPO))
    import torch

    lengths, cu, qkv, bias = mix_batch(args.windows, args.heads * args.head_dim)
    t, max_len, n = sum(lengths), max(lengths), len(lengths)
    calls = {f: form_call(f, qkv, bias, cu, t, max_len, n, args.heads, args.head_dim)
             for f in forms}
    outs = {f: call() for f, call in calls.items()}  # compile (the profiler skips these)
    torch.cuda.synchronize()
    if not args.time:
        for i, (label, call) in enumerate(calls.items()):
            print(f"profiled launch {i}: {label} ({t} tokens, {n} sequences)", flush=True)
            call()
        torch.cuda.synchronize()
        return
    first = outs[forms[0]]
    result: dict[str, Any] = {"tokens": t, "windows": n, "device": torch.cuda.get_device_name(),
                              "equal_to_first": {f: bool(torch.equal(o, first))
                                                 for f, o in outs.items()},
                              "us": time_forms(calls, args.rounds)}
    print("| form | µs a launch (median of rounds) | equal to the first |")
    print("|---|---|---|")
    for f in forms:
        print(f"| {f} | {sorted(result['us'][f])[len(result['us'][f]) // 2]:.1f} "
              f"| {result['equal_to_first'][f]} |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
