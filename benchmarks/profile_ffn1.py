"""Launches the fused FFN1 GEMM variants one after another, for Nsight Compute.

BERT-large's FFN1 (x [T, 1024] @ W1^T, W1 [4096, 1024]) at ``--tokens`` tokens through
``kernels.linear``: each variant is launched once to compile, then, in the order printed,
once more for the profiler to read. Run it under ``ncu`` skipping the warm-up launches:

    ncu --clock-control none --launch-skip 6 -k regex:_gemm --csv --page details \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        python3 benchmarks/profile_ffn1.py --tokens 384 > ncu_ffn1.csv

(``ncu`` flushes the caches before each profiled launch, so the weights come from HBM as
in a real pass.) What the bias + GELU epilogue costs: each tile with a plain store and
with bias + GELU, for the large path's pointer-load tile and two TMA tiles. (On
2026-11-30 a third variant, the bias slice prefetched into L1 and the weight slice into
L2 right before the K loop without PDL, was 1.4-1.8x slower; NOTES.md, v7.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, config, epilogue: "plain" | "gelu")
VARIANTS = [
    ("64x64x64 plain", (64, 64, 64, 4, 4), "plain"),
    ("64x64x64 gelu", (64, 64, 64, 4, 4), "gelu"),
    ("128x64x64 tma plain", (128, 64, 64, 4, 4, 1), "plain"),
    ("128x64x64 tma gelu", (128, 64, 64, 4, 4, 1), "gelu"),
    ("128x128x64 w8 tma plain", (128, 128, 64, 8, 4, 1), "plain"),
    ("128x128x64 w8 tma gelu", (128, 128, 64, 8, 4, 1), "gelu"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=384)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    from engine.fused import kernels as k

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.tokens, 1024, device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.float16, generator=g) * 0.03
    b = torch.randn(4096, device="cuda", dtype=torch.float16, generator=g) * 0.1

    def launch(config: tuple[int, ...], epilogue: str) -> torch.Tensor:
        if epilogue == "plain":
            return k.linear(x, w, config=config)
        return k.linear(x, w, b, act="gelu", config=config)

    for _, config, epilogue in VARIANTS:  # compile (the profiler skips these)
        launch(config, epilogue)
    torch.cuda.synchronize()
    for i, (label, config, epilogue) in enumerate(VARIANTS):
        print(f"profiled launch {i}: {label}", flush=True)
        launch(config, epilogue)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
