#!/usr/bin/env bash
# bench/diloco/rollback.sh — what a replica's rollback to θ costs the model
# (docs/diloco.md#a-replicas-rollback).
#
#   bash bench/diloco/rollback.sh [OUT]
#
# Three replicas over MPI on bench/diloco/markov.conf (data: bash bench/diloco/markov_data.sh),
# S (600) steps, H (50) inner steps, max_bad_steps 3. Two runs from the same seed:
#   clean     nothing goes wrong;
#   rollback  replica 1's gradients are NaN in steps 231–233 and 431–433 (TRAIN_GPT_FAULT
#             nan_grad): each time its weights start over from θ, the work of its inner steps
#             since the last sync dropped, and it stays a member (before 2026-12 the replica
#             stopped at step 233, and with the mpi transport the whole job with it); 30 inner steps
#             of its work since the sync at step 200 (400) are dropped each time.
# OUT/summary.txt: each run's validation loss at S (on θ, every replica the same), the rollback
# events, and replica 1's contributions after them (inner steps, tokens).
#
# Environment: TRAIN_GPT (default ./train_gpt), S, H, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-rollback}
train_gpt=${TRAIN_GPT:-./train_gpt}
S=${S:-600}
H=${H:-50}
python=${PYTHON:-/usr/bin/python3}
[ -f data/markov/train.bin ] || bash bench/diloco/markov_data.sh
mpirun=(mpirun --oversubscribe -np 3)
[ "$(id -u)" -eq 0 ] && mpirun=(mpirun --allow-run-as-root --oversubscribe -np 3)
rm -rf "$out"
mkdir -p "$out"
run() {  # run NAME FAULT: three replicas, replica 1 with TRAIN_GPT_FAULT=FAULT
    "${mpirun[@]}" sh -c "[ \$OMPI_COMM_WORLD_RANK = 1 ] && export TRAIN_GPT_FAULT='$2'; exec '$train_gpt' \
        bench/diloco/markov.conf --max_steps $S --val_every $S --ckpt_every 0 --threads 1 --max_bad_steps 3 \
        --diloco_replicas 3 --diloco_inner_steps $H --diloco_transport mpi --out_dir '$out/$1/'\$OMPI_COMM_WORLD_RANK" \
        >"$out/$1.log" 2>&1
}
t0=$(date +%s)
run clean ""
run rollback "nan_grad:230,nan_grad:231,nan_grad:232,nan_grad:430,nan_grad:431,nan_grad:432"
"$python" - "$out" "$S" "$(($(date +%s) - t0))" <<'PY' | tee "$out/summary.txt"
import json, sys
out, S, took = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def lines(run, r):
    return [json.loads(l) for l in open(f"{out}/{run}/{r}/metrics.jsonl")]
def val(run):
    return [l["val_loss"] for l in lines(run, 0) if "val_loss" in l and l["step"] == S][-1]
print(f"bench/diloco/rollback.sh: markov.conf, 3 replicas over MPI, {S} steps, {took} s for both runs")
for run in ("clean", "rollback"):
    print(f"  {run:9s} validation loss at step {S}: {val(run):.4f}")
events = [l for l in lines("rollback", 1) if l.get("event") == "rollback"]
for e in events:
    after = [l for l in lines("rollback", 1) if "contributors" in l and l["step"] > e["step"]][0]
    print(f"  replica 1 rolled back at step {e['step']} to θ of outer step {e['outer_step']} "
          f"(work of {e['discarded_steps']} inner steps dropped); its next contribution (outer step "
          f"{after['outer_step']}): {after['inner_steps']} inner steps, {after['tokens']} tokens; "
          f"contributors {after['contributors']}")
hashes = {r: [l["param_hash"] for l in lines("rollback", r) if l.get("applied")] for r in (0, 1, 2)}
print(f"  param_hash equal on the three replicas at all {len(hashes[0])} applied outer steps: "
      f"{hashes[0] == hashes[1] == hashes[2]}")
PY
rm -rf "$out"/*/*/step_*   # the final checkpoints: the metrics and logs are the result
