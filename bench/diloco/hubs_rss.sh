#!/usr/bin/env bash
# bench/diloco/hubs_rss.sh — a relay's memory with 1, 2 and 3 hubs (docs/protocol.md, "What the
# hub stores" and "Several hubs"): each hub keeps the downlink's error-feedback residual of the
# shares it reduces only, so its memory falls about as 1/K.
#
#   make build/hub_bench && bash bench/diloco/hubs_rss.sh [OUT] [VALUES] [M] [ROUNDS]
#
# For K = 1, 2, 3: K relays (`train_gpt relay`) and M synthetic replicas (build/hub_bench: int8
# up, int8 down with the hubs' error feedback, block 128) on loopback, ROUNDS exchanges of
# VALUES values. Once the replicas are done, per relay from /proc/PID/status: VmHWM (the peak
# resident set), VmRSS, VmPeak (the peak of the address space: what the relay allocated, touched
# or not), and the residual it logged ("downlink error feedback: a residual of ..."). TRAIN_GPT and
# BUILD choose the binaries (another commit's build compares), LABEL names them in OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/dev/stdout}
values=${2:-32000000}
m=${3:-3}
rounds=${4:-3}
train_gpt=${TRAIN_GPT:-./train_gpt}
build=${BUILD:-build}
. bench/diloco/hubs_common.sh
status_mib() { awk -v k="$2:" '$1 == k {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
{
printf '# %s, %s, %d cores (%s); %s (%s)\n' "$(date -u +%Y-%m-%d)" "$(uname -m)" "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" "$train_gpt" \
    "${LABEL:-commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')}"
printf '# bash bench/diloco/hubs_rss.sh OUT %d %d %d: %d replicas (build/hub_bench), %d rounds of %d values\n' \
    "$values" "$m" "$rounds" "$m" "$rounds" "$values"
printf '# (int8 up, int8 down + the hubs error feedback, block 128: payload %.1f MB, residual of the whole model %.0f MiB)\n' \
    "$("$python" -c "print($values * (1 + 4 / 128) / 1e6)")" "$("$python" -c "print($values * 4 / 2**20)")"
printf '# K hubs | relay | residual logged | VmHWM MiB | VmRSS MiB | VmPeak MiB\n'
# An idle relay (listening, no replica): what the binary itself costs.
port=$(free_port)
OMP_NUM_THREADS=1 "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$tmp/secret" >"$tmp/relay_idle.log" 2>&1 &
idle=$!
until grep -q "listening on" "$tmp/relay_idle.log" 2>/dev/null; do sleep 0.05; done
printf '0 | idle | none | %s | %s | %s\n' "$(status_mib "$idle" VmHWM)" "$(status_mib "$idle" VmRSS)" \
    "$(status_mib "$idle" VmPeak)"
kill -TERM "$idle"; wait "$idle" || true
for k in 1 2 3; do
    start_relays "$k"
    run_replicas "$k"
    for ((h = 0; h < k; h++)); do
        p=${relays[$h]}
        residual=$(grep -o 'a residual of [0-9]* values ([^)]*)' "$tmp/relay_${k}_$h.log" | sed 's/a residual of //' |
            paste -sd+ - || true)
        printf '%d | %d | %s | %s | %s | %s\n' "$k" "$h" "${residual:-none}" "$(status_mib "$p" VmHWM)" \
            "$(status_mib "$p" VmRSS)" "$(status_mib "$p" VmPeak)"
    done
    for p in "${relays[@]}"; do kill -TERM "$p"; wait "$p" || true; done
done
} | tee "$out"
