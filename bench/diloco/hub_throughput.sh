#!/usr/bin/env bash
# bench/diloco/hub_throughput.sh — how many replicas of a 1B-parameter int8 model the hubs
# serve per outer step per minute, with 1, 2 and 3 hubs (docs/protocol.md, "Several hubs").
#
#   make bench-hubs        or   bash bench/diloco/hub_throughput.sh [OUT] [VALUES] [M] [ROUNDS]
#
# For K = 1, 2, 3: K relays (`train_gpt relay`, one thread each: OMP_NUM_THREADS=1) and M
# synthetic replicas (build/hub_bench: int8 up, int8 down with the hub's error feedback, block
# 128, no training between exchanges) on this machine over loopback, ROUNDS exchanges of
# VALUES values (default 16,000,000: a 16.5 MB payload). Measured per relay: its CPU seconds
# (user + system, /proc/PID/stat) over the run and the payload bytes it took in (its round
# lines). The figure: a relay's CPU seconds per replica per outer step for a 1B model's payload
# (1.031 GB at int8, block 128), scaled linearly from the measured payload; with K hubs each
# on a core of its own, the busiest relay bounds the rate: replicas per outer step per
# minute = 60 / (busiest relay's CPU s per replica-step). The machine's cores are shared by
# the relays and the M replica processes, so CPU seconds, not wall time, are what counts.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/dev/stdout}
values=${2:-16000000}
m=${3:-8}
rounds=${4:-3}
train_gpt=${TRAIN_GPT:-./train_gpt}
build=${BUILD:-build}
. bench/diloco/hubs_common.sh
ticks=$(getconf CLK_TCK)
{
printf '# %s, %s, %d cores (%s); train_gpt %s\n' "$(date -u +%Y-%m-%d)" "$(uname -m)" "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
printf '# %d replicas, %d rounds of %d values (int8 up, int8 down + hub error feedback, block 128)\n' "$m" "$rounds" "$values"
printf '# K hubs | relay: payload in over the run, CPU s, MB in per CPU s (each relay) | busiest relay CPU s per replica-step at 1B int8 | replicas of 1B int8 per outer step per minute (one core per hub) | replica wall s per exchange (median)\n'
for k in 1 2 3; do
    start_relays "$k"
    run_replicas "$k"
    cpus=()
    for p in "${relays[@]}"; do
        read -r -a stat <"/proc/$p/stat"
        cpus+=($((stat[13] + stat[14])))
        kill -TERM "$p"; wait "$p" || true
    done
    "$python" - "$k" "$m" "$rounds" "$values" "$ticks" "${cpus[*]}" "$tmp" <<'PY'
import glob, re, statistics, sys
k, m, rounds, values, ticks = map(int, sys.argv[1:6])
cpus = [int(c) / ticks for c in sys.argv[6].split()]
tmp = sys.argv[7]
unit = {"B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}
ins = []
for h in range(k):
    total = 0.0
    for line in open(f"{tmp}/relay_{k}_{h}.log"):
        g = re.search(r"closed: (\d+) contributor.*?, ([\d.]+) (B|KiB|MiB|GiB) in,", line)
        if g:
            total += float(g.group(2)) * unit[g.group(3)]
    ins.append(total)
walls = []
for path in glob.glob(f"{tmp}/rep_{k}_*.log"):
    for line in open(path):
        g = re.search(r"ok ([\d.]+) s", line)
        if g:
            walls.append(float(g.group(1)))
payload = values * (1 + 4 / 128)                      # int8 bytes of one replica's payload
one_b = 1e9 * (1 + 4 / 128)                           # a 1B model's payload
per_rs = [cpus[h] / (rounds * m) * (one_b / payload) for h in range(k)]
busiest = max(per_rs)
each = "; ".join(f"{ins[h] / 1e6:.0f} MB, {cpus[h]:.2f} s, {ins[h] / 1e6 / max(cpus[h], 1e-9):.0f} MB/s"
                 for h in range(k))
print(f"{k} | {each} | {busiest:.2f} s | {60 / busiest:.1f} | {statistics.median(walls):.2f}")
PY
done
} | tee "$out"
