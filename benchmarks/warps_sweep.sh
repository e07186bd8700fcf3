#!/usr/bin/env bash
# 8 warps (two warpgroups) for the deferred layer's FP8 GEMMs, FFN2's K splits and its
# early weight slice, on top of v32's settled FFN2 addend. v32's marks (BERT-base 1x128,
# median program after its wait): FFN1 1.30 us from its product to its e4m3 output (760
# instructions a thread at one warp a scheduler), FFN2's last program 1.25 us of tile
# fix-up. Compiled here (triton 3.6, sm_90a): with 8 warps FFN1's epilogue is 388
# instructions a thread (90 registers, 96 KB of shared memory as with 4) and FFN2's
# counter + fix-up 271 against 437 (79 registers against 163). Earlier sweeps of these
# plans (v18, 16-bit, before the FP8 layer and the early weights) found no gain; nor did
# this one (v33, 64fc215: every variant lost at every shape, +0.5 to +16%). Graph
# replay (``ab_replay.py``, interleaved rounds; the first variant is the engine's plan),
# calibrated FP8 BERT-base at the shapes given (a resource change moves the neighbours'
# placement: NOTES v30, v31).
# Run on the GPU from the repository root (the four default shapes fit one call):
#   benchmarks/warps_sweep.sh OUT_DIR [SHAPE ...]   (default: 1x128 2x64 4x32 8x16)
set -euo pipefail
source "$(dirname "$0")/sweep_lib.sh"
variants=(
  --variant 'default={"calibrate": true}'
  --variant 'qkv_w8={"calibrate": true, "gemm_plans": {"qkv": [[64, 64, 256, 8, 3], 1]}}'
  --variant 'ffn1_w8={"calibrate": true, "gemm_plans": {"ffn1": [[64, 64, 256, 8, 3], 1]}}'
  --variant 'ffn2_w8={"calibrate": true, "gemm_plans": {"ffn2": [[64, 64, 128, 8, 4], 4]}}'
  --variant 'all_w8={"calibrate": true, "gemm_plans": {"qkv": [[64, 64, 256, 8, 3], 1], "ffn1": [[64, 64, 256, 8, 3], 1], "ffn2": [[64, 64, 128, 8, 4], 4]}}'
  --variant 'ffn2_s2={"calibrate": true, "gemm_plans": {"ffn2": [[64, 64, 128, 4, 4], 2]}}'
  --variant 'ffn2_s8={"calibrate": true, "gemm_plans": {"ffn2": [[64, 64, 128, 4, 4], 8]}}'
  --variant 'ffn2_early={"calibrate": true, "early_weights": ["qkv", "ffn1", "ffn2"]}'
)
sweep_shapes warps "$@"  # OUT_DIR [SHAPE ...]
