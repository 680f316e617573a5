#!/usr/bin/env bash
# bench/diloco/convergence.sh — does DiLoCo learn better than one worker, and how close does it
# come to data parallel at the same tokens? (bench/diloco/README.md, issue "DiLoCo that pays")
#
#   bash bench/diloco/convergence.sh PLAN [OUT]
#
# PLAN is a file with one run per line (blank lines and # comments skipped):
#
#   NAME  KIND  M  H  OUTER_LR  MU  NESTEROV  MU_WARMUP  STEPS  SEED  START  [--key value]...
#
#   KIND   one: one worker (batch B); dp: data parallel, one process with batch M·B (the same
#          tokens per step as M replicas); diloco: M replicas simulated in one process
#          (diloco_transport = local, bit-identical to M processes; fp32 outer gradients
#          unless the extra keys say otherwise)
#   START  scratch, or warm: start from the checkpoint that the one-worker run of the same
#          STEPS and SEED wrote at 20 % of STEPS (that run must come earlier in PLAN)
#   H, OUTER_LR, MU, NESTEROV, MU_WARMUP: DiLoCo's settings (ignored by one and dp: write -);
#          OUTER_LR and MU may both be auto (the run's own choice, docs/config.md); else the
#          outer step is exactly lr and μ, also in the decay phase unless the extra keys say
#          --diloco_plain_in_decay 1
#
# Every run trains CONFIG (default configs/tiny.conf) with batch B (default 8) on its own
# 1/M of the data for STEPS steps and validates on the same val_tokens (default 0 = all of
# val_data) every VAL_EVERY steps (default STEPS/4, at outer boundaries for DiLoCo). A run
# whose OUT/NAME/done exists is skipped, so the script can be stopped and started again.
# OUT (default bench/results/diloco-convergence) gets one directory per run and results.tsv:
#   name kind M H outer_lr mu nesterov mu_warmup steps seed start val_loss val_tokens seconds
# bench/diloco/plot_convergence.py turns it into a table and an SVG.
#
# Environment: TRAIN_GPT (default ./train_gpt; copy the binary elsewhere to rebuild during a
# long benchmark), CONFIG, B, VAL_TOKENS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/../.."
plan=${1:?usage: convergence.sh PLAN [OUT]}
out=${2:-bench/results/diloco-convergence}
train_gpt=${TRAIN_GPT:-./train_gpt}
config=${CONFIG:-configs/tiny.conf}
B=${B:-8}
val_tokens=${VAL_TOKENS:-0}
threads=${THREADS:-0}
mkdir -p "$out"
results="$out/results.tsv"
[ -f "$results" ] || printf 'name\tkind\tM\tH\touter_lr\tmu\tnesterov\tmu_warmup\tsteps\tseed\tstart\tval_loss\tval_tokens\tseconds\n' >"$results"

# The final val_loss and val_tokens of a run's metrics.jsonl.
final_val() {
    grep '"val_loss"' "$1" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*"val_tokens":([0-9]+).*/\1 \2/'
}

# The one-worker checkpoint at 20 % of STEPS for SEED (written by that run's ckpt_every).
warm_checkpoint() {
    local steps=$1 seed=$2 at=$(($1 / 5))
    local dir
    dir=$(printf '%s/one-%s-s%s/step_%08d' "$out" "$steps" "$seed" "$at")
    [ -d "$dir" ] || { echo "convergence: no warm-start checkpoint $dir (run 'one-$steps-s$seed' first)" >&2; exit 1; }
    echo "$dir"
}

while read -r name kind M H lr mu nesterov mu_warmup steps seed start extra; do
    case "$name" in ''|'#'*) continue ;; esac
    dir="$out/$name"
    [ -f "$dir/done" ] && continue
    rm -rf "$dir"
    mkdir -p "$dir"
    val_every=${VAL_EVERY:-$((steps / 4))}
    args=("$config" --batch_size "$B" --max_steps "$steps" --seed "$seed" --val_tokens "$val_tokens"
          --val_every "$val_every" --sample_every 0 --log_every "$val_every" --threads "$threads"
          --out_dir "$dir" --ckpt_keep 0 --ckpt_every 0)
    case "$kind" in
        one) args+=(--ckpt_every $((steps / 5))) ;;
        dp) args+=(--batch_size $((B * M))) ;;
        diloco) args+=(--diloco_replicas "$M" --diloco_transport local --diloco_inner_steps "$H"
                       --diloco_outer_lr "$lr" --diloco_outer_momentum "$mu" --diloco_nesterov "$nesterov"
                       --diloco_momentum_warmup "$mu_warmup" --diloco_quant none)
                # The row's lr and μ exactly, also in the decay phase (the extra keys may say
                # --diloco_plain_in_decay 1); OUTER_LR and MU both auto: the auto outer optimizer.
                [ "$lr" = auto ] && [ "$mu" = auto ] || args+=(--diloco_plain_in_decay 0) ;;
        *) echo "convergence: $name: unknown kind '$kind' (one, dp or diloco)" >&2; exit 1 ;;
    esac
    case "$start" in
        scratch) args+=(--resume never) ;;
        warm) args+=(--resume "$(warm_checkpoint "$steps" "$seed")") ;;
        *) echo "convergence: $name: START must be scratch or warm, not '$start'" >&2; exit 1 ;;
    esac
    # shellcheck disable=SC2206
    [ -n "${extra:-}" ] && args+=($extra)
    t0=$(date +%s)
    echo "convergence: $name ($kind M=$M H=$H lr=$lr mu=$mu nesterov=$nesterov warmup=$mu_warmup, $steps steps, seed $seed, $start)"
    if ! "$train_gpt" "${args[@]}" >"$dir/log.txt" 2>&1; then
        echo "convergence: $name failed; the end of $dir/log.txt:" >&2
        tail -5 "$dir/log.txt" >&2
        exit 1
    fi
    read -r val vtok < <(final_val "$dir/metrics.jsonl")
    secs=$(($(date +%s) - t0))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$kind" "$M" "$H" "$lr" "$mu" \
        "$nesterov" "$mu_warmup" "$steps" "$seed" "$start" "$val" "$vtok" "$secs" >>"$results"
    echo "convergence: $name: val_loss $val ($vtok tokens) in ${secs} s"
    touch "$dir/done"
done <"$plan"
