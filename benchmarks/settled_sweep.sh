#!/usr/bin/env bash
# The deferred layer's residual GEMMs building bias + LN(residual) before their PDL wait
# (``encoder.SETTLED_RESIDUAL_GEMMS``: the residual and its moments were written two or
# more launches back) against after the product (the default). v32's timeline (BERT-base
# 1x128, calibrated FP8, median program after its wait): FFN2 1.65 us of K loop, then
# 1.84 to the atomic adds, building that addend (528 instructions with 5 barriers; 43
# without it, compiled here); the out-projection 0.56 of 3.4. Graph replay
# (``ab_replay.py``, interleaved rounds; the first variant is the engine's default),
# calibrated FP8 BERT-base at 1x128 and several sequence counts (a change of one kernel's
# resources moves its neighbours' placement: NOTES v30, v31), the shipped MiniLM's shape
# in fp16, then the timeline of 1x128 with both.
# Run on the GPU from the repository root (one call):
#   benchmarks/settled_sweep.sh OUT_DIR
set -euo pipefail
out="${1:?output directory}"
mkdir -p "$out"
setting="engine.fused.encoder.SETTLED_RESIDUAL_GEMMS"
ab() {  # MODEL SHAPE DTYPE ENGINE-OPTIONS
  timeout 150 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model "$1" \
    --dtype "$3" --shape "$2" --rounds 8 --iters 300 \
    --variant "late=$4" --variant "ffn2=$4" --variant "out=$4" --variant "both=$4" \
    --set "ffn2:$setting=('ffn2',)" --set "out:$setting=('out',)" \
    --set "both:$setting=('out', 'ffn2')" \
    --out "$out/settled-$1-$2-$3.json" || echo "$1 $2 failed: $?"
}
for shape in 1x128 2x64 4x32 8x16; do ab bert-base "$shape" fp8 '{"calibrate": true}'; done
ab minilm-l6 1x128 float16 '{}'
timeout 150 env PYTHONPATH="$PWD" python3 benchmarks/program_timeline.py --dtype fp8 \
  --calibrate --shapes bert-base:1x128 --set "$setting=('out', 'ffn2')" \
  --out "$out/timeline-settled" || echo "timeline failed: $?"
