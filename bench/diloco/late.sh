#!/usr/bin/env bash
# bench/diloco/late.sh — what late work carried is worth in loss (docs/diloco.md#late-work-carried).
#
#   bash bench/diloco/late.sh [OUT]
#
# Four replicas through a relay on this machine (tcp on loopback, fp32 outer gradients,
# diloco_min_replicas 3), CONFIG (default bench/diloco/markov.conf; data: markov_data.sh) at
# batch B (8) for STEPS (1500) steps, H (20); replica 3 is late past the round's cutoff in every
# LATE_EVERY-th (4th) round it begins (TRAIN_GPT_FAULT=diloco_late: it sleeps diloco_timeout_s
# + 1 s before uploading, the other three close the round without it, and it takes the
# group's state at the next close). Runs, each into OUT/NAME with its metrics and logs:
#   one       one worker, batch B (the same tokens per replica)
#   dp4       data parallel: one process at batch 4·B (the same tokens as four replicas)
#   ontime    the four replicas, nobody late
#   carry     replica 3 late, diloco_carry_late = 1 (the default): its missed work carried
#   drop      replica 3 late, diloco_carry_late = 0: its missed work thrown away
# and OUT/results.tsv: name, val_loss, val_tokens, replica 3's joins after being late, the
# carried weights, seconds. A run whose OUT/NAME/done exists is skipped.
#
# Environment: TRAIN_GPT (default ./train_gpt; copy it elsewhere to rebuild meanwhile), CONFIG,
# B, STEPS, H, LATE_EVERY, TIMEOUT_S (5), THREADS (1 per process).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-late}
train_gpt=${TRAIN_GPT:-./train_gpt}
config=${CONFIG:-bench/diloco/markov.conf}
B=${B:-8}
steps=${STEPS:-1500}
H=${H:-20}
late_every=${LATE_EVERY:-4}
timeout_s=${TIMEOUT_S:-5}
threads=${THREADS:-1}
mkdir -p "$out"
results="$out/results.tsv"
[ -f "$results" ] || printf 'name\tval_loss\tval_tokens\tlate_joins\tcarried_weights\tseconds\n' >"$results"
python=${PYTHON:-/usr/bin/python3}

common=("$config" --batch_size "$B" --max_steps "$steps" --val_every "$((steps / 4))" --log_every "$((steps / 4))"
    --sample_every 0 --threads "$threads" --ckpt_keep 0 --ckpt_every 0 --resume never)

final_val() { grep '"val_loss"' "$1" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*"val_tokens":([0-9]+).*/\1\t\2/'; }

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The rounds replica 3 is late in: every late_every-th from the second on.
late_faults() {
    local k list=""
    for ((k = 1; k < steps / H; k += late_every)); do list+="${list:+,}diloco_late:$k"; done
    echo "$list"
}

replicas() {  # replicas NAME FAULT3 [ARGS for replica 3...]
    local name=$1 fault=$2 dir="$out/$1"
    shift 2
    local secret="$dir/secret" port r pids=()
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
    chmod 600 "$secret"
    port=$(free_port)
    "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$secret" --timeout_s "$timeout_s" >"$dir/relay.log" 2>&1 &
    local relay=$!
    for r in 0 1 2 3; do
        local extra=() f=""
        [ "$r" = 3 ] && extra=("$@") && f=$fault
        TRAIN_GPT_FAULT=$f "$train_gpt" "${common[@]}" --diloco_replicas 4 --diloco_replica_id "$r" \
            --diloco_inner_steps "$H" --diloco_quant none --diloco_min_replicas 3 --diloco_transport tcp \
            --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$secret" --diloco_timeout_s "$timeout_s" \
            "${extra[@]}" --out_dir "$dir/$r" >"$dir/replica_$r.log" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    kill "$relay" 2>/dev/null || true
    wait "$relay" 2>/dev/null || true
    [ "$rc" -eq 0 ] || { echo "late: $name: a replica failed (rc $rc): see $dir" >&2; exit 1; }
    cp "$dir/0/metrics.jsonl" "$dir/metrics.jsonl"
}

run() {  # run NAME: one of the runs above
    local name=$1 dir="$out/$1" t0=$SECONDS
    [ -f "$dir/done" ] && return 0
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "late: $name ..." >&2
    case "$name" in
        one) "$train_gpt" "${common[@]}" --out_dir "$dir" >"$dir/log.txt" 2>&1 ;;
        dp4) "$train_gpt" "${common[@]}" --batch_size $((4 * B)) --out_dir "$dir" >"$dir/log.txt" 2>&1 ;;
        ontime) replicas ontime "" ;;
        carry) replicas carry "$(late_faults)" ;;
        drop) replicas drop "$(late_faults)" --diloco_carry_late 0 ;;
    esac
    local joins=0 weights="-"
    if [ -f "$dir/3/metrics.jsonl" ]; then
        joins=$(grep -c '"diloco_join"' "$dir/3/metrics.jsonl" || true)
        weights=$("$python" -c '
import json, sys
w = [json.loads(l)["carried"] for l in open(sys.argv[1]) if "\"diloco_join\"" in l]
print(",".join("%.3g" % c["weight"] if c else "0" for c in w) or "-")' "$dir/3/metrics.jsonl")
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$(final_val "$dir/metrics.jsonl")" "$joins" "$weights" \
        "$((SECONDS - t0))" >>"$results"
    rm -rf "$dir"/step_* "$dir"/*/step_* "$dir/secret"   # the final checkpoints and the run's secret: not results
    touch "$dir/done"
}

for name in ${RUNS:-one dp4 ontime carry drop}; do run "$name"; done
column -t -s $'\t' "$results"
