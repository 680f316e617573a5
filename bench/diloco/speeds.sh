#!/usr/bin/env bash
# bench/diloco/speeds.sh — clusters of different speeds: compute utilization of the fast
# replicas with a fixed H against phases on wall time (diloco_sync_every_s,
# docs/diloco.md#replicas-of-different-sizes).
#
#   bash bench/diloco/speeds.sh [OUT]
#
# Three replicas over MPI (one process each, THREADS threads), CONFIG (default
# bench/diloco/markov.conf; data: markov_data.sh) at batch B (8), STEPS (600) steps, H (20),
# fp32 outer gradients; replica 2 runs at half speed (TRAIN_GPT_FAULT=half_speed: every step
# takes twice its time). Two runs:
#   fixed   diloco_sync_every_s 0: every replica takes H steps per phase; the fast ones wait
#   timed   diloco_sync_every_s = the slow replica's measured time for H steps in `fixed`:
#           the fast ones fill the wait with extra inner steps
# For each run and replica OUT/results.tsv gives: inner steps over the run, compute time
# (Σ step_ms + Σ extra_ms), stall time (Σ stall_ms: DiLoCo's outer work and the wait for the
# others), compute utilization = compute / (compute + stall), and the run's final val_loss.
#
# Environment: TRAIN_GPT (default ./train_gpt), CONFIG, B, STEPS, H, THREADS (1), MPIRUN.
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
mpirun=(mpirun --oversubscribe -np 3)
[ "$(id -u)" -eq 0 ] && mpirun=(mpirun --allow-run-as-root --oversubscribe -np 3)
mkdir -p "$out"

run() {  # run NAME SYNC_EVERY_S
    local name=$1 sync=$2 dir="$out/$1"
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "speeds: $name (diloco_sync_every_s $sync) ..." >&2
    "${mpirun[@]}" sh -c "
        r=\$OMPI_COMM_WORLD_RANK
        [ \$r = 2 ] && export TRAIN_GPT_FAULT=half_speed:0
        exec '$train_gpt' '$config' --batch_size $B --max_steps $steps --val_every $steps --log_every $((steps / 4)) \
            --sample_every 0 --threads $threads --ckpt_keep 0 --ckpt_every 0 --resume never --diloco_replicas 3 \
            --diloco_transport mpi --diloco_inner_steps $H --diloco_quant none --diloco_sync_every_s $sync \
            --out_dir '$dir/'\$r" >"$dir/log.txt" 2>&1 || { echo "speeds: $name failed: see $dir/log.txt" >&2; exit 1; }
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
    stall = sum(l.get("stall_ms", 0) for l in lines if "step_ms" in l) / 1e3
    inner = sum(l["inner_steps"] for l in lines if l.get("applied"))
    speed = "half" if r == 2 else "full"
    print(f"{name}\t{sync}\t{r}\t{speed}\t{inner}\t{comp:.1f}\t{stall:.1f}\t{comp / (comp + stall):.3f}\t{val:.4f}")
PY
}

run fixed 0
T=$(slow_phase_s "$out/fixed")
run timed "$T"
{
    printf 'run\tsync_every_s\treplica\tspeed\tinner_steps\tcompute_s\tstall_s\tutilization\tval_loss\n'
    summarize fixed 0
    summarize timed "$T"
} >"$out/results.tsv"
column -t -s $'\t' "$out/results.tsv"
