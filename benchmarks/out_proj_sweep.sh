#!/usr/bin/env bash
# The deferred layer's out-projection (BERT-base, 16-bit: its e4m3 weight costs F1, v12)
# on 64-row wgmma tiles instead of its 32x32 mma.sync plan, with and without its weight
# slice loaded before the PDL wait (``early_weights`` "out"; the fit's byte limit
# ``kernels.deferred._EARLY_BYTES`` raised for those variants only). v31's timeline: the
# out-projection's programs move as many bytes as QKV's and run 1.6 us longer (3.61
# against 2.04 a layer at 1x128). 64x16 tiles keep its 96 programs at 128 tokens; 64x32
# halve them. Graph replay (``ab_replay.py``, interleaved rounds; the first variant is the
# engine's plan), calibrated FP8 BERT-base at 1x128, then at several sequences (a change
# of one kernel's resources moves its neighbours' placement: NOTES v30, v31).
# One shape a call (each run builds five calibrated engines; up to 480 s):
#   benchmarks/out_proj_sweep.sh 1x128 OUT_DIR, then 2x64 and 4x32 if a variant wins.
# Run on the GPU from the repository root.
set -euo pipefail
shape="${1:?a BxS shape, e.g. 1x128}"
out="${2:?output directory}"
mkdir -p "$out"
plan() {  # NAME TILE [early]
  local early=""
  [ "${3:-}" = early ] && early=', "early_weights": ["qkv", "out", "ffn1"]'
  echo "$1={\"calibrate\": true, \"gemm_plans\": {\"out\": [[$2], 1]}$early}"
}
variants=(--variant 'default={"calibrate": true}'
          --variant "$(plan o64x16 64,16,128,4,3)"
          --variant "$(plan o64x16e 64,16,128,4,3 early)"
          --set "o64x16e:engine.fused.kernels.deferred._EARLY_BYTES=131072"
          --variant "$(plan o64x32 64,32,128,4,3)"
          --variant "$(plan o64x32e 64,32,128,4,3 early)"
          --set "o64x32e:engine.fused.kernels.deferred._EARLY_BYTES=163840")
timeout 480 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model bert-base \
  --dtype fp8 --shape "$shape" --rounds 8 --iters 300 "${variants[@]}" \
  --out "$out/out-proj-bert-base-$shape-fp8.json" || echo "$shape failed: $?"
