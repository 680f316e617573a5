#!/usr/bin/env bash
# bench/diloco/lr_rule.sh — the inner learning rate of a replica with a larger batch
# (docs/diloco.md#replicas-of-different-sizes): which rule to give users.
#
#   bash bench/diloco/lr_rule.sh [OUT]
#
# Two replicas over MPI (fp32 outer gradients, H = 20), CONFIG (default bench/diloco/markov.conf;
# data: markov_data.sh), STEPS (1500) steps: replica 0 at batch B (8) and the config's lr,
# replica 1 at batch 4·B with its lr unscaled, ×2 (√4: the square-root rule) or ×4 (linear).
# OUT/results.tsv: rule, replica 1's lr, final val_loss (the same 65,408 validation tokens).
#
# Environment: TRAIN_GPT (default ./train_gpt), CONFIG, B, STEPS, H, LR (the config's: 3e-3).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-lr-rule}
train_gpt=${TRAIN_GPT:-./train_gpt}
config=${CONFIG:-bench/diloco/markov.conf}
B=${B:-8}
steps=${STEPS:-1500}
H=${H:-20}
lr=${LR:-3e-3}
mpirun=(mpirun --oversubscribe -np 2)
[ "$(id -u)" -eq 0 ] && mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
mkdir -p "$out"
results="$out/results.tsv"
[ -f "$results" ] || printf 'rule\tlr_batch_4B\tval_loss\tseconds\n' >"$results"

for rule in same sqrt linear; do
    dir="$out/$rule"
    [ -f "$dir/done" ] && continue
    rm -rf "$dir"
    mkdir -p "$dir"
    factor=$(case $rule in same) echo 1 ;; sqrt) echo 2 ;; linear) echo 4 ;; esac)
    lr1=$(awk -v a="$lr" -v f="$factor" 'BEGIN { printf "%g", a * f }')
    echo "lr_rule: $rule (batch $((4 * B)) at lr $lr1) ..." >&2
    t0=$SECONDS
    "${mpirun[@]}" sh -c "
        r=\$OMPI_COMM_WORLD_RANK
        if [ \$r = 0 ]; then mine='--batch_size $B --lr $lr'; else mine='--batch_size $((4 * B)) --lr $lr1'; fi
        exec '$train_gpt' '$config' \$mine --max_steps $steps --val_every $((steps / 4)) --log_every $((steps / 4)) \
            --sample_every 0 --threads 1 --ckpt_keep 0 --ckpt_every 0 --resume never --diloco_replicas 2 \
            --diloco_transport mpi --diloco_inner_steps $H --diloco_quant none --out_dir '$dir/'\$r" \
        >"$dir/log.txt" 2>&1 || { echo "lr_rule: $rule failed: see $dir/log.txt" >&2; exit 1; }
    rm -rf "$dir"/*/step_*
    val=$(grep '"val_loss"' "$dir/0/metrics.jsonl" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*/\1/')
    printf '%s\t%s\t%s\t%s\n' "$rule" "$lr1" "$val" "$((SECONDS - t0))" >>"$results"
    touch "$dir/done"
done
column -t -s $'\t' "$results"
