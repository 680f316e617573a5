#!/usr/bin/env bash
# Activation recomputation on the CPU backend (issue #18, docs/config.md#memory): step time and
# activation memory of recompute = none / selective / full / full on every 2nd layer on
# configs/gpt-124m.conf's model at seq 1024 (bench/recompute_cpu.c says how it measures).
#
#   bash bench/recompute/cpu.sh [OUT_FILE] [ROUNDS] [BATCH] [THREADS]    defaults: 8 rounds, batch 1, 2 threads
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/$(date +%F)-recompute-cpu-$(hostname -s).txt}
rounds=${2:-8}
batch=${3:-1}
threads=${4:-2}
BUILD=${BUILD:-build}
make -s "$BUILD/bench_recompute" >/dev/null
{
    echo "# bench/recompute/cpu.sh on $(hostname -s), $(date -u +%FT%TZ), $(nproc) cores" \
        "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), commit $(git rev-parse --short HEAD)," \
        "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$BUILD/bench_recompute" configs/gpt-124m.conf "$batch" 1024 "$rounds" "$threads" 2>/dev/null
    echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out"
