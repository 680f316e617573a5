#!/usr/bin/env bash
# GPU benchmark: train_gpt against the same model in PyTorch 2 (bench/gpu/torch_model.py:
# bf16 autocast, torch.compile, flex_attention with a document mask, fused AdamW) on ~124M,
# ~350M and ~1B models at seq 2048 and 4096, same shard, batch and steps. One command, from
# the repository root on a machine with a GPU:
#
#     bash bench/gpu/run.sh          (or make bench-gpu)
#
# Writes a side-by-side table (tok/s, MFU, peak GPU memory) to
# bench/results/DATE-gpu-vs-pytorch-GPUNAME.txt, one row as soon as it is measured (and a
# copy into $OUT when the device tool sets it), so a run cut short keeps what it measured.
# Each side times STEPS steps after WARMUP warm-up steps (torch.compile happens there).
# MFU for both uses train_gpt's FLOP count (6N + 12·L·Hq·D·T per token, `train_gpt plan`)
# and the peak of the GPU (device.c's table; PEAK_TFLOPS=... overrides). Peak memory is
# the largest `nvidia-smi` reading during the run, for both sides (torch's own
# max_memory_allocated is shown next to it). Environment: STEPS (20), WARMUP (5),
# CONFIGS ("gpt-124m gpt-350m gpt-1b"), SEQS ("2048 4096"), TORCH_TIMEOUT (s, 240).
set -uo pipefail
cd "$(dirname "$0")/../.."
steps=${STEPS:-20}
warmup=${WARMUP:-5}
configs=${CONFIGS:-gpt-124m gpt-350m gpt-1b}
seqs=${SEQS:-2048 4096}
python=${PYTHON:-python3}
torch_timeout=${TORCH_TIMEOUT:-240}

make -s -j"$(nproc)" train_gpt build/test_tool >/dev/null || { echo "bench/gpu: build failed" >&2; exit 1; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$gpu" ] || { echo "bench/gpu: no GPU (nvidia-smi found none)" >&2; exit 1; }
tmp=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'kill "${mem_pid:-}" 2>/dev/null; rm -rf "$tmp"' EXIT
result=bench/results/$(date -u +%Y-%m-%d)-gpu-vs-pytorch-$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/^NVIDIA-//; s/-$//').txt
mkdir -p bench/results

peak=${PEAK_TFLOPS:-}
if [ -z "$peak" ]; then
    case "$gpu" in
        *GH200*) peak=989 ;; *"H100 NVL"*) peak=835 ;; *"H100 PCIe"*) peak=756 ;; *H100*) peak=989 ;;
        *H200*) peak=989 ;; *B200*) peak=2250 ;; *A100*) peak=312 ;; *) peak="" ;;
    esac
fi

emit() {  # a line into the result (and $OUT)
    printf '%s\n' "$*" | tee -a "$result"
    if [ -n "${OUT:-}" ]; then cp "$result" "$OUT/" 2>/dev/null || true; fi
}

mem_start() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$tmp/mem.log" 2>/dev/null &
    mem_pid=$!
}
mem_stop() {  # → peak GiB
    kill "$mem_pid" 2>/dev/null; wait "$mem_pid" 2>/dev/null; mem_pid=
    sort -n "$tmp/mem.log" | tail -n 1 | awk '{printf "%.1f", $1 / 1024}'
}

key() { awk -F= -v k="$2" '{split($2, a, "#"); gsub(/ /, "", $1); gsub(/ /, "", a[1])} $1 == k {print a[1]}' "$1"; }

: >"$result"
emit "# train_gpt vs PyTorch on $gpu — $(date -u +%Y-%m-%dT%H:%MZ)"
emit "# train_gpt $(./train_gpt --version 2>/dev/null | head -n 1) | torch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null) | driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
emit "# each side: mean step time of $steps steps after $warmup warm-up steps; peak dense bf16 ${peak:-unknown} TFLOP/s; MFU = tok/s x GFLOP/token (6N + 12.L.Hq.D.T) / peak"
emit "$(printf '%-9s %5s %3s %8s | %11s %6s %8s | %11s %6s %13s | %6s' config seq B GF/tok "ours tok/s" MFU "mem GiB" "torch tok/s" MFU "mem GiB (alloc)" ratio)"

for name in $configs; do
    conf=bench/gpu/$name.conf
    vocab=$(key "$conf" vocab_size)
    doc=$(key "$conf" doc_token)
    shard="$tmp/$name.bin"
    for T in $seqs; do
        # About the same tokens per step at both lengths: B halves when T doubles.
        B0=$(key "$conf" batch_size)
        B=$((B0 * 2048 / T)); [ "$B" -ge 1 ] || B=1
        need=$(( (steps + warmup + 1) * B * T + 1 ))
        if [ ! -f "$shard" ] || [ "$(cat "$shard.tokens" 2>/dev/null || echo 0)" -lt "$need" ]; then
            build/test_tool shard "$shard" "$vocab" "$doc" $((need + need / 4)) 7 100003 >/dev/null
            echo $((need + need / 4)) >"$shard.tokens"
        fi
        gflop=$(./train_gpt plan "$conf" --seq_len "$T" --batch_size "$B" 2>/dev/null | sed -n 's/.*; \([0-9.]*\) GFLOP\/token.*/\1/p')

        out="$tmp/out-$name-$T"; rm -rf "$out"
        mem_start
        ./train_gpt "$conf" --device cuda --train_data "$shard" --val_data "" --tokenizer "" --sample_every 0 \
            --seq_len "$T" --batch_size "$B" --grad_accum 1 --max_steps $((steps + warmup)) --warmup_steps 2 \
            --shuffle 0 --out_dir "$out" --ckpt_every 0 --log_every 1000 >"$tmp/ours.log" 2>&1
        ours_rc=$?
        ours_mem=$(mem_stop)
        ours_tps=$("$python" - "$out/metrics.jsonl" "$warmup" "$B" "$T" <<'PY' 2>/dev/null
import json, statistics, sys
ms = [d["step_ms"] for d in map(json.loads, open(sys.argv[1])) if "step_ms" in d and d["step"] > int(sys.argv[2])]
print(f"{int(sys.argv[3]) * int(sys.argv[4]) * 1000.0 / statistics.mean(ms):.0f}")
PY
)
        [ "$ours_rc" -eq 0 ] && [ -n "$ours_tps" ] || { ours_tps="failed"; tail -n 3 "$tmp/ours.log" >&2; }

        mem_start
        theirs=$(timeout "$torch_timeout" "$python" bench/gpu/torch_model.py "$conf" "$shard" --batch "$B" --seq "$T" \
            --steps "$steps" --warmup "$warmup" 2>"$tmp/torch.err" | grep '^torch ')
        torch_rc=$?
        torch_mem=$(mem_stop)
        torch_tps=$(echo "$theirs" | sed -n 's/.*tok_per_s=\([0-9.]*\).*/\1/p' | cut -d. -f1)
        torch_alloc=$(echo "$theirs" | sed -n 's/.*peak_mem_gib=\([0-9.]*\).*/\1/p')
        if [ "$torch_rc" -ne 0 ] || [ -z "$torch_tps" ]; then
            torch_tps="failed"; tail -n 3 "$tmp/torch.err" >&2
        fi

        mfu() { [ -n "$peak" ] && [ -n "$gflop" ] && [ "$1" != failed ] &&
            awk -v t="$1" -v g="$gflop" -v p="$peak" 'BEGIN {printf "%.1f%%", 100 * t * g / (p * 1000)}' || echo "-"; }
        ratio=$( [ "$ours_tps" != failed ] && [ "$torch_tps" != failed ] &&
            awk -v a="$ours_tps" -v b="$torch_tps" 'BEGIN {printf "%.2fx", a / b}' || echo "-")
        emit "$(printf '%-9s %5s %3s %8s | %11s %6s %8s | %11s %6s %13s | %6s' "$name" "$T" "$B" "$gflop" \
            "$ours_tps" "$(mfu "$ours_tps")" "$ours_mem" "$torch_tps" "$(mfu "$torch_tps")" \
            "$torch_mem (${torch_alloc:--})" "$ratio")"
    done
done
emit "# goals on H100: MFU >= 55 % at ~1B; train_gpt tok/s >= 1.25x PyTorch's"
echo "bench/gpu: wrote $result"
