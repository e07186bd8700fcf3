#!/usr/bin/env bash
# Tiles and K splits of the deferred small-batch layer's FFN1 and FFN2 (BERT-base), whole
# pass by graph replay (``ab_replay.py`` with ``gemm_plans``; interleaved rounds). The first
# variant of each sweep is the engine's plan (``kernels.deferred.deferred_plan``). Run on
# the GPU from the repository root: benchmarks/deferred_plan_sweep.sh OUT_DIR [SHAPE]
set -euo pipefail
out="${1:?output directory}"
shape="${2:-1x128}"
mkdir -p "$out"
plan() { echo "$1={\"gemm_plans\": {\"$2\": [[$3], $4]}}"; }
ffn2=(--variant "default={}")
for p in "64,64,64,4,4 2" "64,64,64,4,4 3" "64,64,64,4,4 6" "64,64,64,4,4 8" \
         "32,64,64,4,4 4" "64,32,64,4,4 4" "64,64,128,4,3 4" "64,64,64,4,3 4" "64,64,64,8,4 4"; do
  set -- $p
  ffn2+=(--variant "$(plan "ffn2_${1//,/x}_s$2" ffn2 "$1" "$2")")
done
ffn1=(--variant "default={}")
for c in "64,32,128,4,3" "32,64,128,4,3" "64,64,64,4,4" "64,128,64,4,3" "128,64,64,4,3" \
         "64,64,128,4,4" "64,64,128,8,3"; do
  ffn1+=(--variant "$(plan "ffn1_${c//,/x}" ffn1 "$c" 1)")
done
for sweep in ffn2 ffn1; do
  declare -n variants="$sweep"
  timeout 280 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model bert-base \
    --shape "$shape" --rounds 6 --iters 300 "${variants[@]}" \
    --out "$out/deferred-$sweep-bert-base-$shape.json" || echo "$sweep sweep failed: $?"
done
