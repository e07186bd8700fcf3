#!/usr/bin/env bash
# The deferred layer's FFN as one kernel (``fused_ffn``: FFN1 + GELU + FFN2, FFN2's K
# split by hidden slice through float32 atomics) against FFN1 then FFN2, by graph replay
# (``ab_replay.py``, interleaved rounds; it also checks that every variant's logits agree
# with the first's), over plans ((BLOCK_M, BLOCK_H, BLOCK_K, BLOCK_N, warps, stages),
# counter groups). Run on the GPU from the repository root:
#   benchmarks/fused_ffn_sweep.sh OUT_DIR [SHAPE ...]     # BERT-base; default 1x128 4x32 1x64
set -euo pipefail
out="${1:?output directory}"
shift
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(1x128 4x32 1x64)
mkdir -p "$out"
plan() {  # NAME TILES GROUPS
  echo "$1={\"fused_ffn\": true, \"gemm_plans\": {\"ffn\": [[$2], $3]}}"
}
for shape in "${shapes[@]}"; do
  timeout 280 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model bert-base \
    --shape "$shape" --rounds 6 --iters 300 --variant "two_kernels={}" \
    --variant "$(plan h64_g2 64,64,128,64,4,3 2)" \
    --variant "$(plan h64_g1 64,64,128,64,4,3 1)" \
    --variant "$(plan h64_g6 64,64,128,64,4,3 6)" \
    --variant "$(plan h64_n128 64,64,128,128,8,3 2)" \
    --variant "$(plan h128_g2 64,128,128,64,8,3 2)" \
    --variant "$(plan m32_h128 32,128,128,64,4,3 2)" \
    --variant "$(plan m128_h64 128,64,128,64,8,3 2)" \
    --out "$out/fused-ffn-bert-base-$shape.json" || echo "ab_replay $shape failed: $?"
done
