#!/usr/bin/env bash
# Activation recomputation on one GPU (issue #18, docs/cuda.md "Activation recomputation"):
# recompute = none / selective / full on bench/gpu/CONFIG.conf at seq T, each run for STEPS
# steps on a synthetic causal shard, giving step time, tok/s, MFU and the memory the plan
# gives (`gpu memory: X GiB` at start) against what the GPU holds after the first step
# (cudaMemGetInfo: the plan plus the CUDA context and cuBLASLt's workspace). Two passes:
#   1. every mode at one micro-batch (BATCH, 4): what each mode costs in time at equal work;
#   2. every mode at the largest micro-batch of CANDIDATES that its plan fits into this GPU's
#      memory less 2 GiB (what `recompute = auto` allows for): the MFU each mode reaches.
# The plan comes from `train_gpt plan` on this machine, so a mode that the plan says fits
# and then runs out of memory shows up as `failed` with the log's last lines.
#
#     bash bench/recompute/gpu.sh [CONFIG [SEQ]]     (default gpt-1b 4096; about 3 minutes on an H100)
#
# STEPS (5; the first two are left out of the mean: cuBLASLt's search), BATCH (4), CANDIDATES
# ("32 24 16 12 8"), RUN_TIMEOUT (150 s per run: start-up and the steps).
# TRAIN_GPT_ATTENTION picks the attention kernels as for every run; TRAIN_GPT (./train_gpt) the
# binary (build/train_gpt_emu runs the script's logic on the CPU emulator of the GPU). The table goes to
# bench/results/DATE-recompute-gpu-CONFIG-seqT-GPUNAME.txt (and $OUT), the runs' logs beside
# it in $OUT only when the device tool sets it.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/gpu/lib.sh
name=${1:-gpt-1b}
T=${2:-4096}
steps=${STEPS:-5}
batch=${BATCH:-4}
candidates=${CANDIDATES:-32 24 16 12 8}
conf=bench/gpu/$name.conf
tg=${TRAIN_GPT:-./train_gpt}
[ -f "$conf" ] || { echo "bench/recompute/gpu.sh: no such config '$conf'" >&2; exit 2; }
for n in "$T" "$steps" "$batch" $candidates; do
    case "$n" in '' | *[!0-9]* | 0) echo "bench/recompute/gpu.sh: SEQ, STEPS, BATCH and CANDIDATES are positive integers" >&2; exit 2 ;; esac
done
[ "$steps" -ge 3 ] || { echo "bench/recompute/gpu.sh: STEPS must be at least 3 (two are left out)" >&2; exit 2; }
# The runs are thrown away: no checkpoint at their end (docs/config.md, ~9 s at ~1B).
export TRAIN_GPT_NO_FINAL_CHECKPOINT=1
make -s -j"$(nproc)" train_gpt build/test_tool >/dev/null || { echo "bench/recompute/gpu.sh: build failed" >&2; exit 1; }
gpu=$(gpu_tag)
[ -n "$gpu" ] || { echo "bench/recompute/gpu.sh: no GPU (nvidia-smi found none)" >&2; exit 1; }
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1 | awk '{printf "%d", $1}')
gpu_gib=$(awk -v m="$gpu_mib" 'BEGIN {printf "%.2f", m / 1024}')

# plan_gib MODE B: the plan's per-rank GPU total for MODE at micro-batch B in GiB (the last
# figure of its recompute table, whose header gives the unit)
plan_gib() {
    "$tg" plan "$conf" --seq_len "$T" --batch_size "$2" 2>/dev/null | awk -v m="$1" '
        /\| +recompute \(MiB\)/ { scale = 1 / 1024 }
        /\| +recompute \(GiB\)/ { scale = 1 }
        $1 == "train_gpt" && $2 == "|" && $3 == m && $4 ~ /^[0-9.]+$/ && scale { printf "%.2f\n", $7 * scale; exit }'
}
fits() {  # fits MODE B: the plan plus 2 GiB of headroom within this GPU's memory
    local g
    g=$(plan_gib "$1" "$2")
    [ -n "$g" ] && awk -v g="$g" -v m="$gpu_gib" 'BEGIN {exit !(g + 2 <= m)}'
}

max_b=$batch
for b in $candidates; do [ "$b" -gt "$max_b" ] && max_b=$b; done
tmp=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/test_tool shard "$tmp/shard.bin" "$(key "$conf" vocab_size)" "$(key "$conf" doc_token)" \
    $(( (steps + 1) * max_b * T + 1 )) 7 >/dev/null || exit 1
mkdir -p bench/results
result=bench/results/$(date -u +%F)-recompute-gpu-$name-seq$T-$gpu.txt
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}
{
    echo "# bench/recompute/gpu.sh $name seq $T, $steps steps (mean of steps 3..$steps), $gpu ($gpu_gib GiB)," \
        "attention kernels ${TRAIN_GPT_ATTENTION:-default}, commit $commit, $(date -u '+%F %TZ')"
    echo "# plan GiB: train_gpt's plan (start-up line); in use GiB: cudaMemGetInfo after the first step;"
    echo "# overhead: step time against none at the same micro-batch; MFU: the run's own (6N + 12.L.Hq.D.T)"
    printf '%-10s %4s %9s %10s %8s %7s %9s %9s %9s\n' recompute B "step ms" "tok/s" MFU overhead "plan GiB" "in use" "fits+2GiB"
} >"$result"

none_ms=
row() {  # row MODE B FITS
    local mode=$1 B=$2 fits=$3 log="$tmp/$1-$2.log" out="$tmp/$1-$2"
    timeout -s KILL "${RUN_TIMEOUT:-150}" "$tg" "$conf" --device cuda --train_data "$tmp/shard.bin" \
        --val_data "" --tokenizer "" --sample_every 0 --seq_len "$T" --batch_size "$B" --grad_accum 1 \
        --max_steps "$steps" --warmup_steps 1 --shuffle 0 --out_dir "$out" --ckpt_every 0 --log_every 1 \
        --recompute "$mode" --memory_budget_mb "$gpu_mib" >"$log" 2>&1   # the whole GPU: pass 1 tries modes past the 2 GiB headroom
    local rc=$?
    local plan inuse stats
    plan=$(sed -n 's/.*| gpu memory: \([0-9.]*\) GiB.*/\1/p' "$log" | head -n 1)
    inuse=$(sed -n 's/.*gpu memory in use after the first step: \([0-9.]*\) GiB.*/\1/p' "$log" | head -n 1)
    stats=$(python3 - "$out/metrics.jsonl" "$B" "$T" <<'PY' 2>/dev/null
import json, statistics, sys
rows = [d for d in map(json.loads, open(sys.argv[1])) if "step_ms" in d and d["step"] > 2]
ms = statistics.mean(d["step_ms"] for d in rows)
mfu = [d["mfu"] for d in rows if d.get("mfu") is not None]
print("%.1f %.0f %s" % (ms, int(sys.argv[2]) * int(sys.argv[3]) * 1000.0 / ms,
      "%.1f%%" % (100 * statistics.mean(mfu)) if mfu else "-"))
PY
)
    if [ "$rc" -ne 0 ] || [ -z "$stats" ]; then
        stats="failed - -"
        [ "$rc" -eq 137 ] && stats="timeout - -"
        { echo "# $mode B $B: exit $rc; the end of its log:"; tail -n 6 "$log" | sed 's/^/#   /'; } >>"$result"
    fi
    set -- $stats
    local over=-
    if [ "$mode" = none ] && [ "$B" = "$batch" ] && [ "$1" != failed ] && [ "$1" != timeout ]; then none_ms=$1; fi
    if [ -n "$none_ms" ] && [ "$B" = "$batch" ] && [ "$mode" != none ] && [ "$1" != failed ] && [ "$1" != timeout ]; then
        over=$(awk -v a="$1" -v b="$none_ms" 'BEGIN {printf "%+.1f%%", 100 * (a / b - 1)}')
    fi
    printf '%-10s %4s %9s %10s %8s %7s %9s %9s %9s\n' "$mode" "$B" "$1" "$2" "$3" "$over" "${plan:--}" "${inuse:--}" "$fits" >>"$result"
    [ -z "${OUT:-}" ] || cp "$log" "$OUT/recompute-$mode-$B.log" 2>/dev/null
    [ -z "${OUT:-}" ] || cp "$result" "$OUT/" 2>/dev/null
    rm -rf "$out"
}

for mode in none selective full; do
    row "$mode" "$batch" "$(fits "$mode" "$batch" && echo yes || echo no)"
done
for mode in none selective full; do
    best=
    for b in $candidates; do
        if fits "$mode" "$b" && { [ -z "$best" ] || [ "$b" -gt "$best" ]; }; then best=$b; fi
    done
    if [ -z "$best" ]; then
        echo "# $mode: no micro-batch of ($candidates) fits $gpu_gib GiB by the plan" >>"$result"
    elif [ "$best" != "$batch" ]; then
        row "$mode" "$best" yes
    fi
done
echo "# done $(date -u '+%TZ')" >>"$result"
cat "$result"
[ -z "${OUT:-}" ] || cp "$result" "$OUT/"
