#!/usr/bin/env bash
# Per-program timelines (``program_timeline.py``) of calibrated FP8 BERT-base passes:
#   first: 1x128 (the batch-1 target's shape) and 2x48 as the engine runs them, then 2x48
#          with the early attention key tail that v30 measured 7% slower there (its
#          out-projection and FFN2 slowed, NOTES v30): where that time goes.
# Run on the GPU from the repository root:
#   benchmarks/timeline_sweep.sh first OUT_DIR
set -euo pipefail
which="${1:?first}"
out="${2:?output directory}"
mkdir -p "$out"
tl() {
  local name="$1"; shift
  timeout 200 env PYTHONPATH="$PWD" python3 benchmarks/program_timeline.py --dtype fp8 \
    --calibrate "$@" --out "$out/$name" || echo "$name failed: $?"
}
if [ "$which" = first ]; then
  tl engine --shapes bert-base:1x128,bert-base:2x48
  tl early-2x48 --shapes bert-base:2x48 --set engine.fused.dispatch.EARLY_TAIL_E4M3_MAX_SEQS=64
fi
