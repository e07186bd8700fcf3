"""Launches the packed attention kernel on a SQuAD-mix batch, for Nsight Compute.

BERT-large attention (16 heads of 64) over ``--windows`` windows with lengths drawn from
the SQuAD dev windows, through ``kernels.attention_varlen`` with the batch's tile list
(the engine's default on the mix) and without it. Each variant is launched once to compile,
then, in the order printed, once more for the profiler to read:

    ncu --clock-control none --launch-skip 2 -k regex:_attn_varlen --csv --page details \\
        --section SpeedOfLight --section WarpStateStats --section Occupancy \\
        --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \\
        python3 benchmarks/profile_attention.py > ncu_attention.csv

(The tile-list build is a launch of its own kernel, which ``-k`` leaves out.) Random
inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import numpy as np
    import torch

    from benchmarks.attn_backends import packed_qkv
    from benchmarks.bench_gpu import squad_lengths
    from engine.fused.kernels import attention_tiles, attention_varlen

    rng = np.random.default_rng(3)
    lengths = [int(v) for v in rng.choice(squad_lengths(), args.windows)]
    t, max_len, n = sum(lengths), max(lengths), len(lengths)
    cu, qkv, bias = packed_qkv(lengths, args.heads * args.head_dim)
    tiles = attention_tiles(cu, t, n, max_len, args.heads, args.head_dim)
    variants = [("tile list", tiles), ("grid", None)]
    for _, tl_ in variants:  # compile (the profiler skips these)
        attention_varlen(qkv, bias, cu, max_len, n, args.heads, tiles=tl_)
    torch.cuda.synchronize()
    for i, (label, tl_) in enumerate(variants):
        print(f"profiled launch {i}: {label} ({t} tokens, {n} sequences)", flush=True)
        attention_varlen(qkv, bias, cu, max_len, n, args.heads, tiles=tl_)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
