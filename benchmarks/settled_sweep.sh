#!/usr/bin/env bash
# The deferred layer's residual GEMMs building bias + LN(residual) before their PDL wait
# (``encoder.SETTLED_RESIDUAL_GEMMS``: the residual and its moments were written two or
# more launches back) against after the product (``late``: none named). v32's timeline
# (BERT-base 1x128, calibrated FP8, median program after its wait): FFN2 1.65 us of K
# loop, then 1.84 to the atomic adds, building that addend (528 instructions with 5
# barriers; 43 without, compiled here); the out-projection 0.56 of 3.4. Graph replay
# (``ab_replay.py``, interleaved rounds; ``late`` first), calibrated FP8 BERT-base at
# 1x128 and several sequence counts (a change of one kernel's resources moves its
# neighbours' placement: NOTES v30, v31), the shipped MiniLM's shape in fp16, then the
# timeline of 1x128 with both. v32 ran it with ``late`` the default; since, the default
# is ``ffn2`` (so each variant sets the constant).
# Run on the GPU from the repository root (one call):
#   benchmarks/settled_sweep.sh OUT_DIR
set -euo pipefail
out="${1:?output directory}"
mkdir -p "$out"
ab() {  # MODEL SHAPE DTYPE ENGINE-OPTIONS
  timeout 150 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model "$1" \
    --dtype "$3" --shape "$2" --rounds 8 --iters 300 \
    --variant "late=$4" --variant "ffn2=$4" --variant "out=$4" --variant "both=$4" \
    --set "late:engine.fused.encoder.SETTLED_RESIDUAL_GEMMS=()" \
    --set "ffn2:engine.fused.encoder.SETTLED_RESIDUAL_GEMMS=('ffn2',)" \
    --set "out:engine.fused.encoder.SETTLED_RESIDUAL_GEMMS=('out',)" \
    --set "both:engine.fused.encoder.SETTLED_RESIDUAL_GEMMS=('out', 'ffn2')" \
    --out "$out/settled-$1-$2-$3.json" || echo "$1 $2 failed: $?"
}
for shape in 1x128 2x64 4x32 8x16; do ab bert-base "$shape" fp8 '{"calibrate": true}'; done
ab minilm-l6 1x128 float16 '{}'
timeout 150 env PYTHONPATH="$PWD" python3 benchmarks/program_timeline.py --dtype fp8 \
  --calibrate --shapes bert-base:1x128 \
  --set "engine.fused.encoder.SETTLED_RESIDUAL_GEMMS=('out', 'ffn2')" --by-slice FFN2=4 \
  --out "$out/timeline-settled" || echo "timeline failed: $?"
