#!/usr/bin/env bash
# Per-program timelines (``program_timeline.py``) of calibrated FP8 BERT-base passes:
#   first: 1x128 (the batch-1 target's shape) and 2x48 as the engine runs them, then 2x48
#          with the early attention key tail that v30 measured 7% slower there (its
#          out-projection and FFN2 slowed, NOTES v30): where that time goes. (v31: the
#          early form's attention ran two programs to an SM on 60 SMs and pushed the
#          out-projection and FFN2 onto fewer SMs.)
#   marks: with the marks inside the programs (the GEMMs' K loop, epilogue and tile
#          counter, attention's key loop and output): where FFN2's tile fix-up (+1.2 µs a
#          layer at 1x128, v31) and attention's ~3 µs a program go; 1x128 and 2x48 FP8,
#          1x128 fp16 (uncalibrated, the 16-bit deferred layer) beside them, and 1x128 FP8
#          with no weights loaded early: do the out-projection's programs beside FFN1's
#          early ones (+0.4 us, v31) and FFN2's beside QKV's (+0.35) lose that penalty?
# Run on the GPU from the repository root:
#   benchmarks/timeline_sweep.sh first|marks OUT_DIR
set -euo pipefail
which="${1:?first or marks}"
out="${2:?output directory}"
mkdir -p "$out"
tl() {
  local name="$1"; shift
  timeout 140 env PYTHONPATH="$PWD" python3 benchmarks/program_timeline.py "$@" \
    --out "$out/$name" || echo "$name failed: $?"
}
if [ "$which" = first ]; then
  tl engine --dtype fp8 --calibrate --shapes bert-base:1x128,bert-base:2x48
  tl early-2x48 --dtype fp8 --calibrate --shapes bert-base:2x48 \
    --set engine.fused.dispatch.EARLY_TAIL_E4M3_MAX_SEQS=64
fi
if [ "$which" = marks ]; then
  tl fp8 --dtype fp8 --calibrate --shapes bert-base:1x128,bert-base:2x48 --by-slice FFN2=4
  tl fp16 --dtype float16 --shapes bert-base:1x128 --by-slice FFN2=4
  tl fp8-no-early --dtype fp8 --calibrate --shapes bert-base:1x128 --option early_weights=none \
    --by-slice FFN2=4
fi
