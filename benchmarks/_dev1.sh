V() { echo "$1={\"calibrate\": true$2}"; }
A='"early_weights": ["qkv", "ffn1", "ffn2"]'
P() { echo "\"gemm_plans\": {\"ffn2\": [[64, 64, 128, 4, 4], $1]}"; }
for shape in 1x128 4x32 2x64; do
timeout 150 env PYTHONPATH=$PWD python3 benchmarks/ab_replay.py --model bert-base --shape $shape --dtype fp8 \
  --variant "$(V default)" --variant "$(V all3 ", $A")" --variant "$(V all3_s6 ", $A, $(P 6)")" \
  --variant "$(V all3_s8 ", $A, $(P 8)")" --variant "$(V default_s8 ", $(P 8)")" \
  --rounds 5 --iters 300 --out $OUT/ab-fp8-$shape-ffn2-splits.json 2>&1 | tail -6
done
