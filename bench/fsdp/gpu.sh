#!/usr/bin/env bash
# The CUDA backend's FSDP path on the GPUs of one machine (docs/fsdp.md "The GPU path"): step
# time and GPU memory of one configuration, plain (one GPU, no sharding) against the sharded
# passes — with one GPU through NCCL in a world of one (TRAIN_GPT_FSDP_UNITS=1), with and without
# fsdp_prefetch; with NGPU ≥ 2 GPUs and MPI also np NGPU at the same global batch. The table and
# the raw logs go to bench/results/DATE-fsdp-gpu-CONFIG-seqT-GPUNAME.txt (and $OUT).
#
#     bash bench/fsdp/gpu.sh [CONFIG [SEQ]]     (default gpt-1b 2048; CONFIG names bench/gpu/CONFIG.conf)
#
# STEPS (8): the mean step time leaves out the first two (cuBLASLt's search, NCCL's set-up).
# About 3 minutes at gpt-1b on an H100.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/gpu/lib.sh
name=${1:-gpt-1b}
T=${2:-2048}
steps=${STEPS:-8}
conf=bench/gpu/$name.conf
[ -f "$conf" ] || { echo "bench/fsdp/gpu.sh: no such config '$conf'" >&2; exit 2; }
# The runs are thrown away: no checkpoint at their end (docs/config.md, ~9 s at ~1B).
export TRAIN_GPT_NO_FINAL_CHECKPOINT=1
make -s -j"$(nproc)" train_gpt build/test_tool >/dev/null || { echo "bench/fsdp/gpu.sh: build failed" >&2; exit 1; }
gpu=$(gpu_tag)
[ -n "$gpu" ] || { echo "bench/fsdp/gpu.sh: no GPU (nvidia-smi found none)" >&2; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU')
B=${BATCH:-$(( $(key "$conf" batch_size) * 2048 / T ))}
[ "$B" -ge 1 ] || B=1
tmp=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/test_tool shard "$tmp/shard.bin" "$(key "$conf" vocab_size)" "$(key "$conf" doc_token)" \
    $(( (steps + 2) * B * T * (ngpu > 1 ? ngpu : 1) + 1 )) 7 >/dev/null || exit 1
mkdir -p bench/results
result=bench/results/$(date -u +%F)-fsdp-gpu-$name-seq$T-$gpu.txt
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}
echo "# bench/fsdp/gpu.sh $name seq $T batch $B, $steps steps, $ngpu GPU(s) $gpu, commit $commit" >"$result"
args=("$conf" --device cuda --train_data "$tmp/shard.bin" --val_data "" --tokenizer "" --sample_every 0
    --seq_len "$T" --batch_size "$B" --max_steps "$steps" --warmup_steps 1 --shuffle 0 --ckpt_every 0 --log_every 1)
row() {  # row LABEL LOG: mean step ms (steps 3..), the end event's GPU figures
    python3 - "$1" "$2" <<'PY'
import json, re, sys
label, log = sys.argv[1], sys.argv[2]
ms, end = [], {}
for line in open(log):
    m = re.match(r"step\s+(\d+)/\d+ .*\| ([0-9.]+) ms", line)
    if m and int(m.group(1)) > 2: ms.append(float(m.group(2)))
try:
    for line in open(log.replace(".log", "/metrics.jsonl")):
        d = json.loads(line)
        if d.get("event") == "end": end = d
except OSError:
    pass
mean = sum(ms) / len(ms) if ms else float("nan")
print("%-34s %9.1f %10.0f %10.0f %10.0f %8.2f" % (label, mean, end.get("device_mb", 0), end.get("device_state_mb", 0),
      end.get("gathered_peak_mb", 0), end.get("comm_wait_s", 0)))
PY
}
run1() {  # run1 LABEL OUT [env...] -- [--key value]...
    local label=$1 out=$2; shift 2
    local envs=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout "${RUN_TIMEOUT:-200}" ./train_gpt "${args[@]}" --out_dir "$tmp/$out" "$@" >"$tmp/$out.log" 2>&1
    echo "== $label: exit $?" >>"$result"
    cat "$tmp/$out.log" >>"$result"
}
run1 "plain, one GPU" plain -- --grad_accum "$ngpu"
run1 "units, world 1, prefetch 1" units TRAIN_GPT_FSDP_UNITS=1 -- --grad_accum "$ngpu"
run1 "units, world 1, prefetch 0" units0 TRAIN_GPT_FSDP_UNITS=1 -- --grad_accum "$ngpu" --fsdp_prefetch 0
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    timeout "${RUN_TIMEOUT:-200}" mpirun "${root[@]}" -np "$ngpu" ./train_gpt "${args[@]}" --grad_accum 1 \
        --out_dir "$tmp/npn" >"$tmp/npn.log" 2>&1
    echo "== np $ngpu: exit $?" >>"$result"
    cat "$tmp/npn.log" >>"$result"
fi
{
    echo
    printf "%-34s %9s %10s %10s %10s %8s\n" "run" "step ms" "device MB" "state MB" "gather MB" "wait s"
    row "plain, one GPU" "$tmp/plain.log"
    row "units, world 1, prefetch 1" "$tmp/units.log"
    row "units, world 1, prefetch 0" "$tmp/units0.log"
    [ -f "$tmp/npn.log" ] && row "np $ngpu (NCCL), prefetch 1" "$tmp/npn.log"
} | tee -a "$result"
[ -n "${OUT:-}" ] && cp "$result" "$OUT/"
echo "bench/fsdp/gpu.sh: wrote $result"
