#!/usr/bin/env bash
# GPU benchmark, one row per call: train_gpt against the same model in PyTorch 2
# (bench/gpu/torch_model.py) on one GPU, same shard, batch, sequence length and steps.
# From the repository root on a machine with a GPU (bench/gpu/README.md has the rows to run):
#
#     bash bench/gpu/run.sh [CONFIG [SEQ [DATA]]]     default: gpt-1b 4096 causal (make bench-gpu)
#
# CONFIG: gpt-124m, gpt-350m, gpt-1b (bench/gpu/NAME.conf) or a .conf path. DATA: causal (no
# document token: plain causal attention; PyTorch uses SDPA with is_causal, flash or cuDNN)
# or docs (documents of 200..2000 tokens, uniform, mean 1100; PyTorch uses FlexAttention
# with a document-causal block mask). One call fits a 10-minute command: each side runs
# under a timeout (OURS_TIMEOUT 120 s, TORCH_TIMEOUT 300 s, torch.compile included), so a
# call takes at most about 7 minutes once train_gpt is built (build it in a call of its
# own on a fresh machine: `make -j train_gpt build/test_tool`).
#
# The row is appended to bench/results/DATE-gpu-vs-pytorch-GPUNAME.txt (the header lines
# only when the file is new), and the file is copied into $OUT when the device tool sets
# it, with both sides' logs. Each side times STEPS steps after WARMUP warm-up steps. MFU
# uses `train_gpt plan`'s FLOPs per token (6N + 12·L·Hq·D·T); "MFU done" replaces the
# attention term by what document masking leaves (12·L·Hq·D·Σℓ²/T over the timed rows).
# Environment: STEPS (20), WARMUP (5), BATCH (conf's batch_size × 2048 / SEQ), PEAK_TFLOPS
# (from the GPU's name), OURS_TIMEOUT, TORCH_TIMEOUT, PYTHON (python3); TORCH=0 leaves the
# PyTorch side out (its columns say `skipped`); TRAIN_GPT_ATTENTION (wmma, fa2) picks
# train_gpt's attention kernels, and other than the default it is added to the row's config
# name (gpt-1b+fa2) and the logs' names. TRAIN_GPT (./train_gpt): the binary (build/train_gpt_emu
# runs train_gpt's side on the CPU emulator of the GPU, to check the script without one).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/gpu/lib.sh

usage() {
    echo "usage: bash bench/gpu/run.sh [CONFIG [SEQ [causal|docs]]]   e.g. bash bench/gpu/run.sh gpt-1b 4096 docs" >&2
    exit 2
}
[ $# -le 3 ] || usage
name=${1:-gpt-1b}
T=${2:-4096}
data=${3:-causal}
case "$name" in
    *.conf) conf=$name; name=$(basename "$name" .conf) ;;
    *) conf=bench/gpu/$name.conf ;;
esac
[ -f "$conf" ] || { echo "bench/gpu: no config '$conf'" >&2; usage; }
case "$data" in
    causal) attention=sdpa ;;
    docs) attention=flex ;;
    *) usage ;;
esac
doc_min=200 doc_max=2000  # docs: document lengths in tokens, its document token included
steps=${STEPS:-20}
warmup=${WARMUP:-5}
python=${PYTHON:-python3}
ours_timeout=${OURS_TIMEOUT:-120}
tg=${TRAIN_GPT:-./train_gpt}
torch_timeout=${TORCH_TIMEOUT:-300}
for n in "$T" "$steps" "$warmup" "${BATCH:-1}"; do
    case "$n" in '' | *[!0-9]* | 0) echo "bench/gpu: SEQ, STEPS, WARMUP and BATCH must be positive integers" >&2; usage ;; esac
done

# The runs are thrown away: no checkpoint at their end (docs/config.md, ~9 s at ~1B).
export TRAIN_GPT_NO_FINAL_CHECKPOINT=1
t_build=$(date +%s)
make -s -j"$(nproc)" train_gpt build/test_tool >/dev/null || { echo "bench/gpu: build failed" >&2; exit 1; }
[ $(($(date +%s) - t_build)) -lt 30 ] ||
    echo "bench/gpu: the build took $(($(date +%s) - t_build)) s; build in a call of its own to keep a row under 8 minutes"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$gpu" ] || { echo "bench/gpu: no GPU (nvidia-smi found none)" >&2; exit 1; }

# Scratch: the shard and train_gpt's out_dir (its metrics; no checkpoint, see above), in
# /dev/shm when it has room, else on disk.
shm_free_kib=$(df -k --output=avail /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
if [ "${shm_free_kib:-0}" -gt $((32 * 1024 * 1024)) ]; then tmp=$(mktemp -d -p /dev/shm); else tmp=$(mktemp -d); fi
trap 'kill "${mem_pid:-}" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p bench/results
result=bench/results/$(date -u +%Y-%m-%d)-gpu-vs-pytorch-$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/^NVIDIA-//; s/-$//').txt

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


# Mean over ROWS consecutive T-token rows starting at token FIRST of Σ ℓ², ℓ the lengths of
# the document pieces of a row: a row starts a piece, and so does every document token
# after its first position (DESIGN.md's documents, cut at the row's ends). T² for causal data.
doc_sumsq_mean() {  # SHARD DOC_TOKEN T FIRST ROWS
    build/test_tool tokens "$1" | awk -v doc="$2" -v T="$3" -v first="$4" -v rows="$5" '
        { i = NR - 1 }
        i < first { next }
        i >= first + rows * T { exit }
        { if ((i - first) % T == 0 || $1 == doc) { sum += len * len; len = 0 } len++ }
        END { sum += len * len; printf "%.1f\n", sum / rows }'
}

if [ ! -s "$result" ]; then
    emit "# train_gpt vs PyTorch 2 on $gpu: one row per \`bash bench/gpu/run.sh CONFIG SEQ DATA\` (bench/gpu/README.md)"
    emit "# driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1) | torch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null) | peak dense bf16 ${peak:-unknown} TFLOP/s"
    emit "# each side: mean step time of STEPS steps after WARMUP warm-up steps (torch.compile happens there), same shard, batch B, seq"
    emit "# GF/tok: standard FLOPs per token 6N + 12.L.Hq.D.T (train_gpt plan; N = weights in matmuls, LM head once; the full TxT score matrix)."
    emit "#   MFU = tok/s x GF/tok / peak."
    emit "# GF done, MFU done: the attention term replaced by 12.L.Hq.D.(sum of l^2)/T, l = lengths of the document pieces in each"
    emit "#   T-token row (mean over the timed rows): the attention work document masking leaves. Equal to the standard on causal rows."
    emit "# data causal: no document token (torch: SDPA is_causal, flash/cuDNN). docs: documents of $doc_min..$doc_max tokens, uniform (torch: FlexAttention)."
    emit "# mem GiB: peak nvidia-smi memory.used (100 ms samples) over each side's process; alloc: torch.cuda.max_memory_allocated, timed steps."
    emit "$(printf '%-12s %5s %3s %-6s %6s %6s | %10s %6s %8s %7s | %11s %6s %8s %14s %-11s | %6s | %s' \
        config seq B data GF/tok "GF done" "ours tok/s" MFU "MFU done" "mem GiB" "torch tok/s" MFU "MFU done" \
        "mem GiB (alloc)" attention ratio "steps+warmup UTC commit")"
fi

# About the same tokens per step at every length: B halves when T doubles.
B0=$(key "$conf" batch_size)
B=${BATCH:-$((B0 * 2048 / T))}
[ "$B" -ge 1 ] 2>/dev/null || B=1
vocab=$(key "$conf" vocab_size)
doc=$(key "$conf" doc_token)
L=$(key "$conf" n_layer)
H=$(key "$conf" n_head)
D=$(key "$conf" head_dim)
[ -n "$D" ] || D=$(($(key "$conf" d_model) / H))

shard="$tmp/$name-$data.bin"
need=$(((steps + warmup + 1) * B * T + 1))
if [ "$data" = docs ]; then lengths="$doc_min $doc_max"; else lengths="0 0"; fi
# shellcheck disable=SC2086  # lengths is two arguments
build/test_tool shard "$shard" "$vocab" "$doc" $((need + need / 4)) 7 100003 $lengths >/dev/null ||
    { echo "bench/gpu: cannot write the shard" >&2; exit 1; }
sumsq=$(doc_sumsq_mean "$shard" "$doc" "$T" $((warmup * B * T)) $((steps * B)))

gflop=$("$tg" plan "$conf" --seq_len "$T" --batch_size "$B" 2>/dev/null | sed -n 's/.*; \([0-9.]*\) GFLOP\/token.*/\1/p')
gflop_done=
if [ -n "$gflop" ] && [ -n "$sumsq" ]; then
    gflop_done=$(awk -v g="$gflop" -v L="$L" -v H="$H" -v D="$D" -v T="$T" -v s="$sumsq" \
        'BEGIN {a = 12 * L * H * D * 1e-9; printf "%.3f", g - a * T + a * s / T}')
fi

tail_to_stdout() {  # WHO RC LOG
    echo "bench/gpu: $1 failed (exit status $2$( [ "$2" -eq 124 ] || [ "$2" -eq 137 ] && echo ": timed out")); the end of its log:"
    tail -n 20 "$3"
}
att=${TRAIN_GPT_ATTENTION:-}
[ "$att" != wmma ] || att=
tag="$name${att:++$att}-$T-$data"

out="$tmp/out"
mem_start
timeout -s KILL "$ours_timeout" "$tg" "$conf" --device cuda --train_data "$shard" --val_data "" --tokenizer "" \
    --sample_every 0 --seq_len "$T" --batch_size "$B" --grad_accum 1 --max_steps $((steps + warmup)) --warmup_steps 2 \
    --shuffle 0 --out_dir "$out" --ckpt_every 0 --log_every 1000 >"$tmp/ours.log" 2>&1
ours_rc=$?
ours_mem=$(mem_stop)
ours_tps=$("$python" - "$out/metrics.jsonl" "$warmup" "$B" "$T" <<'PY' 2>/dev/null
import json, statistics, sys
ms = [d["step_ms"] for d in map(json.loads, open(sys.argv[1])) if "step_ms" in d and d["step"] > int(sys.argv[2])]
print(f"{int(sys.argv[3]) * int(sys.argv[4]) * 1000.0 / statistics.mean(ms):.0f}")
PY
)
if [ "$ours_rc" -ne 0 ] || [ -z "$ours_tps" ]; then
    ours_tps=failed
    [ "$ours_rc" -eq 124 ] || [ "$ours_rc" -eq 137 ] && ours_tps=timeout
    tail_to_stdout train_gpt "$ours_rc" "$tmp/ours.log"
fi

torch_rc=0 torch_mem= torch_tps=skipped torch_alloc= torch_attention=
if [ "${TORCH:-1}" != 0 ]; then
    mem_start
    PYTHONUNBUFFERED=1 timeout -k 10 "$torch_timeout" "$python" bench/gpu/torch_model.py "$conf" "$shard" --batch "$B" \
        --seq "$T" --steps "$steps" --warmup "$warmup" --attention "$attention" >"$tmp/torch.out" 2>"$tmp/torch.err"
    torch_rc=$?
    torch_mem=$(mem_stop)
    theirs=$(grep '^torch ' "$tmp/torch.out")
    torch_tps=$(echo "$theirs" | sed -n 's/.*tok_per_s=\([0-9.]*\).*/\1/p' | cut -d. -f1)
    torch_alloc=$(echo "$theirs" | sed -n 's/.*peak_mem_gib=\([0-9.]*\).*/\1/p')
    torch_attention=$(echo "$theirs" | sed -n 's/.*attention=\([^ ]*\).*/\1/p')
    if [ "$torch_rc" -ne 0 ] || [ -z "$torch_tps" ]; then
        torch_tps=failed
        [ "$torch_rc" -eq 124 ] || [ "$torch_rc" -eq 137 ] && torch_tps=timeout
        cat "$tmp/torch.out" >>"$tmp/torch.err"
        tail_to_stdout "PyTorch" "$torch_rc" "$tmp/torch.err"
    fi
fi
if [ -n "${OUT:-}" ]; then
    cp "$tmp/ours.log" "$OUT/ours-$tag.log" 2>/dev/null
    [ "${TORCH:-1}" = 0 ] || cat "$tmp/torch.out" "$tmp/torch.err" >"$OUT/torch-$name-$T-$data.log" 2>/dev/null
fi

is_number() { case "$1" in '' | *[!0-9.]*) return 1 ;; esac; }
mfu() {  # TOK_PER_S GFLOP_PER_TOKEN
    if [ -n "$peak" ] && is_number "$1" && is_number "$2"; then
        awk -v t="$1" -v g="$2" -v p="$peak" 'BEGIN {printf "%.1f%%", 100 * t * g / (p * 1000)}'
    else
        echo "-"
    fi
}
ratio=-
if is_number "$ours_tps" && is_number "$torch_tps"; then
    ratio=$(awk -v a="$ours_tps" -v b="$torch_tps" 'BEGIN {printf "%.2fx", a / b}')
fi
# COMMIT=... names the code when the tree travels without its history (a copied checkout).
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}
[ -n "${COMMIT:-}" ] || [ "$commit" = - ] || git diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
emit "$(printf '%-12s %5s %3s %-6s %6s %6s | %10s %6s %8s %7s | %11s %6s %8s %14s %-11s | %6s | %s' \
    "$name${att:++$att}" "$T" "$B" "$data" "${gflop:--}" "${gflop_done:--}" \
    "$ours_tps" "$(mfu "$ours_tps" "$gflop")" "$(mfu "$ours_tps" "$gflop_done")" "${ours_mem:--}" \
    "$torch_tps" "$(mfu "$torch_tps" "$gflop")" "$(mfu "$torch_tps" "$gflop_done")" \
    "${torch_mem:--} (${torch_alloc:--})" "${torch_attention:--}" "$ratio" \
    "$steps+$warmup $(date -u +%H:%MZ) $commit")"
echo "bench/gpu: appended to $result"
# The row is kept either way; the status says whether both sides ran (scripts/gpu_session.sh's
# summary showed "exit 0" for rows that said failed).
case "$ours_tps $torch_tps" in *failed* | *timeout*) exit 1 ;; esac
