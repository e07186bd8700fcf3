# Shared by the device sweeps of calibrated FP8 BERT-base plans (``warps_sweep.sh``,
# ``stages_sweep.sh``): source it, fill the array ``variants`` with ``ab_replay.py``'s
# variant options (the first is the engine's plan), then
#   sweep_shapes PREFIX OUT_DIR [SHAPE ...]   (default: 1x128 2x64 4x32 8x16)
# runs graph replay in interleaved rounds at each shape (a resource change moves the
# neighbours' placement: NOTES v30, v31), one JSON a shape, OUT_DIR/PREFIX-bert-base-S-fp8.json.
sweep_shapes() {
  local prefix="${1:?prefix}" out="${2:?output directory}"
  shift 2
  local shapes=("$@") s
  [ "${#shapes[@]}" -gt 0 ] || shapes=(1x128 2x64 4x32 8x16)
  mkdir -p "$out"
  for s in "${shapes[@]}"; do
    timeout 140 env PYTHONPATH="$PWD" python3 benchmarks/ab_replay.py --model bert-base \
      --dtype fp8 --shape "$s" --rounds 8 --iters 300 "${variants[@]}" \
      --out "$out/$prefix-bert-base-$s-fp8.json" || echo "$s failed: $?"
  done
}
