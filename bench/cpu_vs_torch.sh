#!/usr/bin/env bash
# CPU benchmark: steps/s of train_gpt vs the same model in PyTorch (Debian's 1.13, CPU,
# bench/torch_cpu_model.py) — same shapes, batch, data and thread count, one run each,
# alternating. Usage: bench/cpu_vs_torch.sh [THREADS] [STEPS]   (from the repo root,
# after `make`). Writes a table to stdout; commit it under bench/results/.
#
# Both sides link Debian's OpenBLAS. On a CPU that OpenBLAS 0.3.21 does not recognise it
# falls back to SSE3 kernels; train_gpt then re-executes itself with OPENBLAS_CORETYPE set,
# so the same variable is exported here for PyTorch too — a fair fight on the same kernels.
set -euo pipefail
threads=${1:-$(nproc)}
steps=${2:-12}
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=$threads
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX; fi
make -s build/test_tool train_gpt >/dev/null

ours() {  # ours CONFIG SHARD -> steps/s (mean step time of steps 3.., as the PyTorch side)
    local out="$tmp/out"; rm -rf "$out"
    ./train_gpt "$1" --train_data "$2" --val_data "" --tokenizer "" --sample_every 0 --max_steps "$steps" \
        --warmup_steps 2 --shuffle 0 --threads "$threads" --out_dir "$out" --ckpt_every 0 --log_every 1000 \
        >/dev/null 2>&1
    "$python" - "$out/metrics.jsonl" <<'PY'
import json, statistics, sys
ms = [d["step_ms"] for d in map(json.loads, open(sys.argv[1])) if "step_ms" in d and d["step"] > 2]
print(f"{1000.0 / statistics.mean(ms):.4f}")
PY
}
theirs() {
    "$python" bench/torch_cpu_model.py "$1" "$2" "$steps" "$threads" 2>/dev/null | sed 's/.*steps_per_s=\([0-9.]*\).*/\1/'
}

echo "# train_gpt vs PyTorch $("$python" -c 'import torch; print(torch.__version__)') on CPU"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | $threads threads | $steps steps (each side: mean step time of steps 3..$steps)"
echo "# OpenBLAS kernels: ${OPENBLAS_CORETYPE:-auto} | train_gpt: $(./train_gpt --version)"
printf '%-14s %-62s %14s %14s %8s\n' config shape "train_gpt it/s" "pytorch it/s" ratio
for conf in configs/tiny.conf bench/cpu/small.conf bench/cpu/gpt124m-short.conf; do
    vocab=$(awk -F= '$1 ~ /^vocab_size/ {gsub(/ /, "", $2); print $2}' "$conf")
    doc=$(awk -F= '$1 ~ /^doc_token/ {split($2, a, "#"); gsub(/ /, "", a[1]); print a[1]}' "$conf")
    build/test_tool shard "$tmp/data.bin" "$vocab" "$doc" 3000000 7 100003
    a=$(ours "$conf" "$tmp/data.bin")
    b=$(theirs "$conf" "$tmp/data.bin")
    shape=$(awk -F= '/^(n_layer|d_model|seq_len|batch_size|vocab_size) /{split($2,a,"#"); gsub(/ /,"",a[1]); gsub(/ /,"",$1); printf "%s=%s ", $1, a[1]}' "$conf")
    printf '%-14s %-62s %14s %14s %7.2fx\n' "$(basename "$conf" .conf)" "$shape" "$a" "$b" "$(echo "$a / $b" | bc -l)"
done
