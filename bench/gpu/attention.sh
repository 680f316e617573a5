#!/usr/bin/env bash
# Attention alone on one GPU: train_gpt's two kernel sets (bench/gpu/attention.cu: WMMA, the
# default, and the register-resident fa2) and PyTorch's SDPA (flash, cuDNN) / FlexAttention
# (bench/gpu/attention_torch.py) at the same shapes, into one file:
# bench/results/DATE-attention-GPUNAME.txt (and $OUT when the device tool sets it).
#
#     bash bench/gpu/attention.sh [ITERS]       (about a minute on an H100 once built)
#
# TORCH_TIMEOUT (240 s) bounds the PyTorch side (flex_attention is compiled on first use).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. bench/gpu/lib.sh
iters=${1:-10}
make -s -j"$(nproc)" build/bench_attention >/dev/null || { echo "bench/gpu/attention.sh: build failed" >&2; exit 1; }
gpu=$(gpu_tag)
[ -n "$gpu" ] || { echo "bench/gpu/attention.sh: no GPU (nvidia-smi found none)" >&2; exit 1; }
mkdir -p bench/results
result=bench/results/$(date -u +%F)-attention-$gpu.txt
{
    echo "# bash bench/gpu/attention.sh $iters; commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}"
    timeout 300 build/bench_attention "$iters" 2>&1
    echo "# exit $?"
    timeout "${TORCH_TIMEOUT:-240}" "${PYTHON:-python3}" bench/gpu/attention_torch.py "$iters" 2>&1 | grep -v Warning
    echo "# exit ${PIPESTATUS[0]}"
} | tee "$result"
[ -n "${OUT:-}" ] && cp "$result" "$OUT/"
echo "bench/gpu/attention.sh: wrote $result"
# Either side failing or timed out fails the script (the file keeps what ran).
! grep -q '^# exit [1-9]' "$result"
