#!/usr/bin/env bash
# The per-kernel time table of one configuration: train_gpt with TRAIN_GPT_PROFILE=1 (CUDA
# events between kernel families, docs/performance.md) for a few steps on a synthetic shard,
# the table written to bench/results/DATE-kernels-CONFIG-seqT-DATA-GPUNAME.txt (and $OUT).
#
#     bash bench/gpu/kernels.sh [CONFIG [SEQ [causal|docs]]]    (make bench-kernels: gpt-1b 4096 causal)
#
# CONFIG names bench/gpu/CONFIG.conf; batch as bench/gpu/run.sh (BATCH=... overrides);
# docs data: documents of 200..2000 tokens, as run.sh's. STEPS (6): the first is left out
# of the table (cuBLASLt's algorithm search). About a minute at ~1B on an H100. TRAIN_GPT
# (./train_gpt): the binary.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/gpu/lib.sh
name=${1:-gpt-1b}
T=${2:-4096}
data=${3:-causal}
steps=${STEPS:-6}
tg=${TRAIN_GPT:-./train_gpt}
conf=bench/gpu/$name.conf
[ -f "$conf" ] || { echo "bench/gpu/kernels.sh: no such config '$conf'" >&2; exit 2; }
case "$data" in causal) docs="0 0" ;; docs) docs="200 2000" ;; *) echo "bench/gpu/kernels.sh: DATA is causal or docs, not '$data'" >&2; exit 2 ;; esac
# The runs are thrown away: no checkpoint at their end (docs/config.md, ~9 s at ~1B).
export TRAIN_GPT_NO_FINAL_CHECKPOINT=1
make -s -j"$(nproc)" train_gpt build/test_tool >/dev/null || { echo "bench/gpu/kernels.sh: build failed" >&2; exit 1; }
gpu=$(gpu_tag)
[ -n "$gpu" ] || { echo "bench/gpu/kernels.sh: no GPU (nvidia-smi found none)" >&2; exit 1; }
B=${BATCH:-$(( $(key "$conf" batch_size) * 2048 / T ))}
[ "$B" -ge 1 ] || B=1
tmp=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
build/test_tool shard "$tmp/shard.bin" "$(key "$conf" vocab_size)" "$(key "$conf" doc_token)" \
    $(( (steps + 2) * B * T + 1 )) 7 17 $docs >/dev/null || exit 1
mkdir -p bench/results
# TRAIN_GPT_ATTENTION (wmma, fa2, simple) picks the attention kernels; other than the default
# it is part of the file's name.
att=${TRAIN_GPT_ATTENTION:-}
result=bench/results/$(date -u +%F)-kernels-$name-seq$T-$data${att:+-$att}-$gpu.txt
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}
echo "# TRAIN_GPT_PROFILE=1 ${att:+TRAIN_GPT_ATTENTION=$att }./train_gpt $conf, seq $T, batch $B, data $data; commit $commit" >"$result"
TRAIN_GPT_PROFILE=1 timeout "${OURS_TIMEOUT:-150}" "$tg" "$conf" --device cuda --train_data "$tmp/shard.bin" \
    --val_data "" --tokenizer "" --sample_every 0 --seq_len "$T" --batch_size "$B" --grad_accum 1 \
    --max_steps "$steps" --warmup_steps 1 --shuffle 0 --out_dir "$tmp/out" --ckpt_every 0 --log_every 1 >>"$result" 2>&1
rc=$?
[ -n "${OUT:-}" ] && cp "$result" "$OUT/"
grep -E "kernel|train_gpt \|   |error" "$result"
echo "bench/gpu/kernels.sh: wrote $result (exit $rc)"
exit $rc
