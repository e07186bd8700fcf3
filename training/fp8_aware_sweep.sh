#!/usr/bin/env bash
# FP8-aware fine-tunes of the shipped checkpoint and their F1 through the fused engine, in
# one GPU call (engine/fused/NOTES.md, "Next steps" 1: F1 room from the checkpoint).
#
#   training/fp8_aware_sweep.sh OUT COMMIT [SEEDS] [LR] [EPOCHS] [FINETUNE_ARGS]
#
# Trains, from models/minilm-l6-squad on its own data mix (training_run.json beside it),
# one FP8-aware fine-tune per seed (all four GEMMs on the engine's calibrated e4m3 rounding,
# training.fp8_aware) and one plain fine-tune with the same recipe (seed 1: what more
# training alone does), all at once on the one GPU. Then scores each through
# benchmarks/fp8_accuracy.py at its own grid (grid 1: the weights sit on it): the calibrated
# default (QKV, FFN1, FFN2 static) and all four GEMMs static, against its own fp32 reference
# and the shipped checkpoint's (--baseline); and, per FP8-aware seed, the default with the
# out-projection adding the residual (encoder.OUT_PROJ_ADDS_RESIDUAL). JSONs and one log in OUT.
# FINETUNE_ARGS go to every fine-tune, e.g. "--distill-from models/minilm-l6-squad" (the
# shipped model's own fp32 outputs as the target).
set -u
out=$1
commit=$2
seeds=${3:-"1 2 3"}
lr=${4:-2e-5}
epochs=${5:-1}
read -r -a extra <<< "${6:-}"
base=models/minilm-l6-squad
work=$(mktemp -d /tmp/fp8aware.XXXXXX)  # this call's own: a warm machine keeps the last
phase="data/extra_train_answerable.json.xz,data/train-subset-v1.1.json.xz*2@$epochs"
mkdir -p "$out"
names="plain1$(for s in $seeds; do printf ' aware%s' "$s"; done)"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2  # seven processes share 16 cores

train() {  # NAME ARGS...: one fine-tune into $work/NAME
    python3 -m training.finetune --base-model "$base" --out "$work/$1" --phase "$phase" \
        --drop-sources covidqa --batch-size 64 --lr "$lr" "${extra[@]}" "${@:2}" \
        > "$work/train-$1.log" 2>&1
    echo "train $1: rc $?"
}

accuracy() {  # NAME TAG ARGS...: fp8_accuracy.py on $work/NAME into $out/acc-TAG-$commit.json
    local name=$1 tag=$2
    python3 benchmarks/fp8_accuracy.py --checkpoint "$work/$name" --grids 1 \
        --out "$out/acc-$tag-$commit.json" "${@:3}" > "$work/acc-$tag.log" 2>&1
    echo "accuracy $tag: rc $?"
}

started=$(date +%s)
for s in $seeds; do
    train "aware$s" --seed "$s" --fp8-aware qkv,attn_out,ffn_in,ffn_out &
done
train plain1 --seed 1 &
wait
echo "training done after $(( $(date +%s) - started )) s"

for name in $names; do
    accuracy "$name" "$name" --schemes static:qkv+ffn_in+ffn_out,calibrated \
        $([ "$name" = plain1 ] && echo "--baseline $base") &
done
for s in $seeds; do
    accuracy "aware$s" "aware$s-sum-residual" --schemes static:qkv+ffn_in+ffn_out \
        --out-proj-adds-residual &
done
wait
echo "all done after $(( $(date +%s) - started )) s"

for f in "$work"/train-*.log "$work"/acc-*.log; do
    echo "=== $f"
    tail -n 25 "$f"
done > "$out/logs-$commit.txt"
for name in $names; do
    echo "=== $name/training_run.json"
    cat "$work/$name/training_run.json"
done >> "$out/logs-$commit.txt"
