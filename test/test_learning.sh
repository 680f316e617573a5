# Learning: a tiny model overfits one repeated micro-batch to a loss below 0.1.
# The shard holds exactly B·T + 1 tokens, so with shuffle = 0 every step sees the same batch.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
B=4; T=32
"$TOOL" shard "$tmp/one.bin" 64 0 $((B * T + 1)) 3 1000003
"$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/one.bin" --out_dir "$tmp/out" --shuffle 0 \
    --batch_size $B --seq_len $T --max_steps 150 --lr 3e-3 --warmup_steps 10 --log_every 50 --ckpt_every 0
loss=$(final_loss "$tmp/out/metrics.jsonl")
check "final loss $loss < 0.1" "$PYTHON" -c "import sys; sys.exit(0 if $loss < 0.1 else 1)"
finish test_learning
