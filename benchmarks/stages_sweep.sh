#!/usr/bin/env bash
# Pipeline depth of the deferred layer's K loops, on top of v32's settled FFN2 addend: the
# out-projection (16-bit, 32x32 mma.sync tiles, BLOCK_K 128, 3 stages) and FFN2 (e4m3,
# 64x64x128, 4 stages, 4 K slices). v33's timeline (BERT-base 1x128, median program after
# its wait): the out-projection's K loop 2.74 us for the 98 KB a program moves (32 rows of
# activations and weights, 768 deep, 2 bytes), FFN2's 1.67 us for 96 KB (64 + 64 rows, 768
# deep, 1 byte): the out-projection holds 48 KB in flight (3 stages of 16 KB), FFN2 64 KB.
# Variants: the out-projection with 4 and 6 stages (6: its whole K in flight, 96 KB), BLOCK_K
# 64 with 6 stages, BLOCK_K 256 with 3 (96 KB), 2 warps; FFN2 with 6 stages (96 KB) and
# BLOCK_K 256 with 3. Compiled here (triton 3.6, sm_90a): no spills; the out-projection 54-96
# registers, FFN2 134-166. v16 swept deeper pipelines on the 16-bit layer (whole pass within
# noise). Outcome (v33, 0c67d91): every out-projection variant lost at every shape (+0.1 to
# +22%; 4 stages +22% at 1x128), FFN2 at 6 stages tied, BLOCK_K 256 lost 0.4-0.7%. Graph replay
# (``ab_replay.py``, interleaved rounds; the first variant is the engine's plan), calibrated
# FP8 BERT-base at the shapes given (a resource change moves the neighbours' placement:
# NOTES v30, v31).
# Run on the GPU from the repository root (the four default shapes fit one call):
#   benchmarks/stages_sweep.sh OUT_DIR [SHAPE ...]   (default: 1x128 2x64 4x32 8x16)
set -euo pipefail
source "$(dirname "$0")/sweep_lib.sh"
variants=(
  --variant 'default={"calibrate": true}'
  --variant 'out_s4={"calibrate": true, "gemm_plans": {"out": [[32, 32, 128, 4, 4], 1]}}'
  --variant 'out_s6={"calibrate": true, "gemm_plans": {"out": [[32, 32, 128, 4, 6], 1]}}'
  --variant 'out_k64s6={"calibrate": true, "gemm_plans": {"out": [[32, 32, 64, 4, 6], 1]}}'
  --variant 'out_k256={"calibrate": true, "gemm_plans": {"out": [[32, 32, 256, 4, 3], 1]}}'
  --variant 'out_w2={"calibrate": true, "gemm_plans": {"out": [[32, 32, 128, 2, 3], 1]}}'
  --variant 'ffn2_s6={"calibrate": true, "gemm_plans": {"ffn2": [[64, 64, 128, 4, 6], 4]}}'
  --variant 'ffn2_k256={"calibrate": true, "gemm_plans": {"ffn2": [[64, 64, 256, 4, 3], 4]}}'
)
sweep_shapes stages "$@"  # OUT_DIR [SHAPE ...]
