#!/usr/bin/env bash
# FSDP on the CPU backend: one process against 2 ranks on the same cores, and the share of a
# step spent waiting for collectives with and without prefetch (docs/fsdp.md).
#
#   bash bench/fsdp/cpu.sh [OUT_FILE]
#
# A ~27 M-parameter model (8 layers, d_model 512, vocab 4096, seq 128, batch 4), 12 steps,
# the mean step time over steps 3-12. np 1 runs with 2 threads, np 2 with 1 thread per rank,
# so both use the machine's 2 cores. Reported per run: ms per step, state per rank
# (weights + grads + AdamW), the most gathered layers at once, the time spent waiting for
# collectives (comm_wait_s, all steps) and the peak RSS of rank 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/$(date +%F)-fsdp-cpu-$(hostname -s).txt}
BUILD=${BUILD:-build}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$BUILD/test_tool" shard "$tmp/train.bin" 4096 0 2000000 7 >/dev/null
model=(test/configs/tiny_test.conf --vocab_size 4096 --n_layer 8 --d_model 512 --n_head 8 --n_kv_head 4 --d_ff 1536
       --seq_len 128 --batch_size 4 --nope_every 4 --max_steps 12 --log_every 1 --train_data "$tmp/train.bin"
       --doc_token 0 --device cpu)
mpirun=(mpirun --oversubscribe -np)
[ "$(id -u)" = 0 ] && mpirun=(mpirun --allow-run-as-root --oversubscribe -np)
summary() {  # summary NAME OUT_DIR
    python3 - "$1" "$2/metrics.jsonl" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
steps, end = [], {}
for line in open(path):
    d = json.loads(line)
    if d.get("event") == "end": end = d
    elif "step_ms" in d: steps.append(d["step_ms"])
ms = sum(steps[2:]) / len(steps[2:])
wait = end.get("comm_wait_s", 0.0)
print("%-28s %8.0f ms/step  state/rank %7.2f MiB  gathered max %6.2f MiB  waiting for collectives %6.2f s (%4.1f %% of %d steps)  peak RSS %6.0f MiB"
      % (name, ms, end["state_mb"], end["gathered_peak_mb"], wait, 100 * wait / (sum(steps) / 1e3), len(steps), end["peak_rss_mb"]))
PY
}
{
    echo "# bench/fsdp/cpu.sh on $(hostname -s), $(date -u +%FT%TZ), $(nproc) cores, commit $(git rev-parse --short HEAD)"
    ./train_gpt "${model[@]}" --threads 2 --out_dir "$tmp/np1" >/dev/null 2>&1
    summary "np 1 (2 threads)" "$tmp/np1"
    "${mpirun[@]}" 2 ./train_gpt "${model[@]}" --threads 1 --grad_accum 1 --batch_size 2 --out_dir "$tmp/np2" >/dev/null 2>&1
    summary "np 2 (1 thread each)" "$tmp/np2"
    "${mpirun[@]}" 2 ./train_gpt "${model[@]}" --threads 1 --batch_size 2 --fsdp_prefetch 0 --out_dir "$tmp/np2n" \
        >/dev/null 2>&1
    summary "np 2, fsdp_prefetch 0" "$tmp/np2n"
    "${mpirun[@]}" 2 ./train_gpt "${model[@]}" --threads 1 --batch_size 2 --fsdp_reshard_after_forward 0 \
        --out_dir "$tmp/np2k" >/dev/null 2>&1
    summary "np 2, reshard_after_forward 0" "$tmp/np2k"
} | tee "$out"
