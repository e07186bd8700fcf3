#!/usr/bin/env bash
# Where each small-batch kernel lets its successor launch (PDL): the engine's
# ``late_release`` option, one kernel at a time and all together, by graph replay
# (``ab_replay.py``, interleaved rounds). Run on the GPU from the repository root:
#   benchmarks/late_release_sweep.sh base OUT_DIR     # BERT-base, the deferred layer
#   benchmarks/late_release_sweep.sh large OUT_DIR    # BERT-large, the seven-kernel layer
# BERT-large runs with the engine's defaults, so where libqa_small_gemm.so is built its
# QKV and FFN1 are CUTLASS kernels and their names are left out of the sweep.
set -euo pipefail
which="${1:?base or large}"
out="${2:?output directory}"
mkdir -p "$out"
if [ "$which" = base ]; then
  model=bert-base
  shapes=(1x128 4x32)
  kernels=(qkv attention out ffn1 ffn2)
  all='"qkv,attention,out,ffn1,ffn2"'
else
  model=bert-large
  shapes=(1x128 4x32)
  kernels=(attention out ln1 ffn2 ln2)
  all='"attention,out,ln1,ffn2,ln2"'
fi
for shape in "${shapes[@]}"; do
  variants=(--variant "early={}")
  for k in "${kernels[@]}"; do
    variants+=(--variant "$k={\"late_release\": \"$k\"}")
  done
  variants+=(--variant "all={\"late_release\": $all}")
  timeout 280 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model "$model" \
    --shape "$shape" --rounds 6 --iters 300 "${variants[@]}" \
    --out "$out/late-release-$model-$shape.json" || echo "ab_replay $model $shape failed: $?"
done
