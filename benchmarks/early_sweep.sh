#!/usr/bin/env bash
# Two choices measured where v29 left them unmeasured, by graph replay (``ab_replay.py``,
# interleaved rounds; the first variant of each run is the reference):
#   tail:  the attention kernel's early partial key block (``attention.ATTN_EARLY_TAIL``,
#          on by default) against the late load, on 16-bit engines (the shipped MiniLM's
#          shape, the service's GPU path, and BERT-base) and on batches of several
#          sequences whose length is not a multiple of 64;
#   ffn2:  FFN2 loading its weight slice before its wait (``early_weights``) on top of the
#          attention grid table (``dispatch.QUERY_BLOCKS``), per batch shape.
#   rule:  where the early tail loses: one sequence without a full key block, two with
#          full blocks, 2x48 with the variants' order swapped, 16-bit 2x48, and the kernel
#          trace of calibrated FP8 2x48 both ways.
#   multi: the engine's rule (``dispatch.EARLY_TAIL_E4M3_MAX_SEQS``) against the early
#          tail at every sequence count, calibrated FP8 BERT-base, 2 to 8 sequences.
#   large: the early tail on BERT-large's seven-kernel small layer at several sequences.
# (v30's records, benchmarks/gpu-2026-12-01-v30/: the tail and rule modes ran before
# c9ef551 (9be4aed, 1905b8a), where the engine needed no "$anyseqs" setting; the rule
# mode's traces are kept as trace-2x48-{late,early}-tail.{md,json}, and the ffn2 mode's
# files of its c9ef551 run as ffn2-early-*-fp8-rule.json.)
# Run on the GPU from the repository root:
#   benchmarks/early_sweep.sh tail|ffn2|all|rule|multi|large OUT_DIR
set -euo pipefail
which="${1:?tail, ffn2, all, rule, multi or large}"
out="${2:?output directory}"
mkdir -p "$out"
late='late:engine.fused.kernels.attention.ATTN_EARLY_TAIL=False'
# The deferred FP8 layer asks for the late tail past one sequence since c9ef551: variant
# "early" of an FP8 run lifts that limit so that it runs the early tail as v29 did.
anyseqs='engine.fused.dispatch.EARLY_TAIL_E4M3_MAX_SEQS=64'
ab() {
  local name="$1"; shift
  timeout 240 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --rounds 8 --iters 300 \
    "$@" --out "$out/$name.json" || echo "$name failed: $?"
}
if [ "$which" = tail ] || [ "$which" = all ]; then
  for spec in minilm-l6:1x96 minilm-l6:4x24 bert-base:1x96; do
    ab "tail-${spec/:/-}-fp16" --model "${spec%%:*}" --shape "${spec#*:}" \
      --variant 'late={}' --variant 'early={}' --set "$late"
  done
  for shape in 2x48 4x24; do
    ab "tail-bert-base-$shape-fp8" --model bert-base --dtype fp8 --shape "$shape" \
      --variant 'late={"calibrate": true}' --variant 'early={"calibrate": true}' --set "$late" \
      --set "early:$anyseqs"
  done
fi
if [ "$which" = rule ]; then  # where the early tail loses (v30: fp8 2x48 and 4x24)
  for shape in 1x48 2x96; do
    ab "tail-bert-base-$shape-fp8" --model bert-base --dtype fp8 --shape "$shape" \
      --variant 'late={"calibrate": true}' --variant 'early={"calibrate": true}' --set "$late" \
      --set "early:$anyseqs"
  done
  ab "tail-bert-base-2x48-fp8-early-first" --model bert-base --dtype fp8 --shape 2x48 \
    --variant 'early={"calibrate": true}' --variant 'late={"calibrate": true}' --set "$late" \
    --set "early:$anyseqs"
  ab "tail-bert-base-2x48-fp16" --model bert-base --shape 2x48 \
    --variant 'late={}' --variant 'early={}' --set "$late"
  for tail in late early; do
    flag=False; [ "$tail" = early ] && flag=True
    timeout 120 env PYTHONPATH="$PWD" python3 benchmarks/trace_pass.py --shapes bert-base:2x48 \
      --dtype fp8 --calibrate --set "engine.fused.kernels.attention.ATTN_EARLY_TAIL=$flag" \
      --set "$anyseqs" --out "$out/trace-2x48-$tail-tail" || echo "trace $tail failed: $?"
  done
fi
if [ "$which" = multi ]; then  # the engine's rule (late past one sequence on e4m3) held
  for shape in 2x64 4x32 8x16 2x48 4x24; do
    ab "multi-bert-base-$shape-fp8" --model bert-base --dtype fp8 --shape "$shape" \
      --variant 'default={"calibrate": true}' --variant 'early={"calibrate": true}' \
      --set "early:$anyseqs"
  done
fi
if [ "$which" = large ]; then  # BERT-large's seven-kernel small layer, several sequences
  ab "tail-bert-large-4x32-fp8" --model bert-large --dtype fp8 --shape 4x32 \
    --variant 'late={"calibrate": true}' --variant 'early={"calibrate": true}' --set "$late"
  ab "tail-bert-large-2x48-fp16" --model bert-large --shape 2x48 \
    --variant 'late={}' --variant 'early={}' --set "$late"
fi
if [ "$which" = ffn2 ] || [ "$which" = all ]; then
  for shape in 1x96 2x64 4x32 8x16; do
    ab "ffn2-early-bert-base-$shape-fp8" --model bert-base --dtype fp8 --shape "$shape" \
      --variant 'default={"calibrate": true}' \
      --variant 'ffn2_early={"calibrate": true, "early_weights": ["qkv", "ffn1", "ffn2"]}'
  done
fi
