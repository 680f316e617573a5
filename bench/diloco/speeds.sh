#!/usr/bin/env bash
# bench/diloco/speeds.sh — clusters of different speeds: compute utilization of the fast
# replicas with a fixed H against phases on wall time (diloco_sync_every_s,
# docs/diloco.md#replicas-of-different-sizes).
#
#   bash bench/diloco/speeds.sh [OUT]
#
# Three replicas through a relay on this machine (tcp on loopback, one process each, THREADS
# threads), CONFIG (default bench/diloco/markov.conf; data: markov_data.sh) at batch B (8), STEPS
# (600) steps, H (20), fp32 outer gradients; replica 2 runs at half speed
# (TRAIN_GPT_FAULT=half_speed: every step takes twice its time). Two runs:
#   fixed   diloco_sync_every_s 0: every replica takes H steps per phase; the fast ones wait
#   timed   diloco_sync_every_s = the slow replica's measured time for H steps in `fixed`:
#           the fast ones fill the wait with extra inner steps
# For each run and replica OUT/results.tsv gives: inner steps over the run, compute time
# (Σ step_ms + Σ extra_ms), the process's wall time, compute utilization = compute / wall, and
# the run's final val_loss. (Not over MPI: its ranks agree on stopping after every step, which
# holds the fast ones to the slow one's pace whatever the phase.)
#
# Environment: TRAIN_GPT (default ./train_gpt), CONFIG, B, STEPS, H, THREADS (1).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-speeds}
train_gpt=${TRAIN_GPT:-./train_gpt}
config=${CONFIG:-bench/diloco/markov.conf}
B=${B:-8}
steps=${STEPS:-600}
H=${H:-20}
threads=${THREADS:-1}
python=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {  # run NAME SYNC_EVERY_S
    local name=$1 sync=$2 dir="$out/$1" r pids=()
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "speeds: $name (diloco_sync_every_s $sync) ..." >&2
    local secret="$dir/secret" port
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
    chmod 600 "$secret"
    port=$(free_port)
    "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$secret" --timeout_s 60 >"$dir/relay.log" 2>&1 &
    local relay=$!
    for r in 0 1 2; do
        local fault=""
        [ "$r" = 2 ] && fault=half_speed:0
        (
            t0=$(date +%s.%N)
            TRAIN_GPT_FAULT=$fault "$train_gpt" "$config" --batch_size "$B" --max_steps "$steps" --val_every "$steps" \
                --log_every $((steps / 4)) --sample_every 0 --threads "$threads" --ckpt_keep 0 --ckpt_every 0 \
                --resume never --diloco_replicas 3 --diloco_replica_id "$r" --diloco_transport tcp \
                --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$secret" --diloco_min_replicas 3 \
                --diloco_inner_steps "$H" --diloco_quant none --diloco_sync_every_s "$sync" --out_dir "$dir/$r" \
                >"$dir/replica_$r.log" 2>&1
            echo "$t0 $(date +%s.%N)" >"$dir/$r/wall"
        ) &
        pids+=($!)
    done
    local rc=0 p
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    kill "$relay" 2>/dev/null || true
    wait "$relay" 2>/dev/null || true
    [ "$rc" -eq 0 ] || { echo "speeds: $name failed: see $dir" >&2; exit 1; }
    rm -rf "$dir"/*/step_* "$secret"   # the final checkpoints and the run's secret: not results
}

# The slow replica's mean time for H steps in a run (its step_ms, which include the half-speed sleep).
slow_phase_s() {
    "$python" - "$1/2/metrics.jsonl" "$H" <<'PY'
import json, sys
ms = [d["step_ms"] for d in map(json.loads, open(sys.argv[1])) if "step_ms" in d and d["step"] > 1]
print("%.3f" % (sum(ms) / len(ms) * int(sys.argv[2]) / 1e3))
PY
}

summarize() {  # summarize NAME SYNC: one line per replica
    "$python" - "$out/$1" "$1" "$2" <<'PY'
import json, sys
d, name, sync = sys.argv[1], sys.argv[2], sys.argv[3]
val = [l for l in map(json.loads, open(d + "/0/metrics.jsonl")) if "val_loss" in l][-1]["val_loss"]
for r in range(3):
    lines = [json.loads(l) for l in open(f"{d}/{r}/metrics.jsonl")]
    comp = sum(l.get("step_ms", 0) + l.get("extra_ms", 0) for l in lines if "step_ms" in l) / 1e3
    t0, t1 = map(float, open(f"{d}/{r}/wall").read().split())
    inner = sum(l["inner_steps"] for l in lines if l.get("applied"))
    speed = "half" if r == 2 else "full"
    print(f"{name}\t{sync}\t{r}\t{speed}\t{inner}\t{comp:.1f}\t{t1 - t0:.1f}\t{comp / (t1 - t0):.3f}\t{val:.4f}")
PY
}

run fixed 0
T=$(slow_phase_s "$out/fixed")
run timed "$T"
{
    printf 'run\tsync_every_s\treplica\tspeed\tinner_steps\tcompute_s\twall_s\tutilization\tval_loss\n'
    summarize fixed 0
    summarize timed "$T"
} >"$out/results.tsv"
column -t -s $'\t' "$out/results.tsv"
