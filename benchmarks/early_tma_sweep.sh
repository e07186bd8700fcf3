#!/usr/bin/env bash
# Early weight slices through TMA descriptors (``kernels.deferred.EARLY_TMA``, off) against
# loads through the registers (the default). v31's timeline: programs sharing their SM with
# the next launch's early programs (loading their slices before their wait) ran 0.35-0.4
# us longer; with TMA an early program issues one bulk copy a chunk instead of a slice's
# worth of loads and shared-memory stores (compiled here with the device's triton 3.6,
# BERT-base FP8 QKV: 80 registers against 92, 96 KB of shared memory both ways). Graph
# replay (``ab_replay.py``,
# interleaved rounds; the first variant is the default), at several sequence counts (a
# change of resources moves the neighbours' placement: NOTES v30, v31), then the timeline
# of 1x128 with TMA (its ``host`` programs against v31's).
# Run on the GPU from the repository root (each mode fits one call):
#   benchmarks/early_tma_sweep.sh one|multi|timeline OUT_DIR
#   one: 1x128 FP8 and the shipped MiniLM's shape in fp16; multi: 2x64, 4x32, 8x16 FP8.
set -euo pipefail
which="${1:?one, multi or timeline}"
out="${2:?output directory}"
mkdir -p "$out"
ab() {
  local shape="$1"
  timeout 170 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model bert-base \
    --dtype fp8 --shape "$shape" --rounds 8 --iters 300 \
    --variant 'loads={"calibrate": true}' --variant 'tma={"calibrate": true}' \
    --set "tma:engine.fused.kernels.deferred.EARLY_TMA=True" \
    --out "$out/early-tma-bert-base-$shape-fp8.json" || echo "$shape failed: $?"
}
if [ "$which" = multi ]; then
  for shape in 2x64 4x32 8x16; do ab "$shape"; done
fi
if [ "$which" = one ]; then
  ab 1x128
  # the shipped MiniLM's shape in fp16: its 16-bit QKV and FFN1 load early too
  timeout 120 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model minilm-l6 \
    --shape 1x128 --rounds 8 --iters 300 --variant 'loads={}' --variant 'tma={}' \
    --set "tma:engine.fused.kernels.deferred.EARLY_TMA=True" \
    --out "$out/early-tma-minilm-l6-1x128-fp16.json" || echo "minilm failed: $?"
fi
if [ "$which" = timeline ]; then
  timeout 200 env PYTHONPATH="$PWD" python3 benchmarks/program_timeline.py --dtype fp8 \
    --calibrate --shapes bert-base:1x128 --set engine.fused.kernels.deferred.EARLY_TMA=True \
    --out "$out/timeline-tma" || echo "timeline failed: $?"
fi
