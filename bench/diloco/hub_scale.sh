#!/usr/bin/env bash
# bench/diloco/hub_scale.sh — what one reducing hub and its replicas move and hold as the
# number of replicas M grows (issue: the hub reduces; docs/protocol.md).
#
#   bash bench/diloco/hub_scale.sh [OUT] [M...]      (default M: 2 8 32 72)
#
# For each M: a relay and M replicas of test/configs/scale_test.conf (992,640 parameters,
# int8 + error feedback both ways, H = 5, 15 steps: 3 outer steps), all on this machine over
# loopback, one thread each. Per M it prints one table row: per replica and outer step the
# bytes sent and received (median over replicas and steps) and the peak RSS (median, max);
# per round at the relay the bytes in and out and its RSS (its last round); the relay's CPU
# seconds (user + system, from /proc) over the run and the payload bytes it took in per CPU
# second. The relay runs on one core (OMP_NUM_THREADS=1: its decode, sum and encode are
# OpenMP loops; its sockets and HMACs one thread). Environment: TRAIN_GPT (default ./train_gpt), BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/dev/stdout}
shift || true
ms=("$@")
[ ${#ms[@]} -gt 0 ] || ms=(2 8 32 72)
train_gpt=${TRAIN_GPT:-./train_gpt}
build=${BUILD:-build}
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/test_tool" shard "$tmp/train.bin" 64 0 60000 21
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"
ticks=$(getconf CLK_TCK)
{
printf '# %s, %s, %d cores; train_gpt %s\n' "$(date -u +%Y-%m-%d)" "$(uname -m)" "$(nproc)" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
printf '# M | replica sent/outer step | replica recv/outer step | replica peak RSS median (max) | relay in/round | relay out/round | relay RSS | relay CPU s | relay MB in per CPU s\n'
for m in "${ms[@]}"; do
    port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    OMP_NUM_THREADS=1 "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$tmp/secret" --timeout_s 300 \
        >"$tmp/relay_$m.log" 2>&1 &
    relay=$!
    pids=()
    for ((r = 0; r < m; r++)); do
        "$train_gpt" test/configs/scale_test.conf --train_data "$tmp/train.bin" --val_every 0 --threads 1 \
            --ckpt_every 0 --ckpt_keep 0 --diloco_inner_steps 5 --diloco_quant int8 --diloco_error_feedback 1 \
            --diloco_replicas "$m" --diloco_replica_id "$r" --diloco_min_replicas "$m" --diloco_transport tcp \
            --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_timeout_s 300 \
            --diloco_connect_timeout_s 300 --out_dir "$tmp/run_$m/$r" >"$tmp/run_${m}_$r.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    read -r -a stat <"/proc/$relay/stat"
    cpu=$(( (stat[13] + stat[14]) ))
    kill -TERM "$relay"; wait "$relay" || true
    "$python" - "$m" "$cpu" "$ticks" "$tmp/relay_$m.log" "$tmp/run_$m"/*/metrics.jsonl <<'PY'
import json, re, statistics, sys
m, cpu, ticks, relay_log, files = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
sent, recv, rss = [], [], []
for path in files:
    for line in open(path):
        d = json.loads(line)
        if d.get("event") == "end":
            rss.append(d["peak_rss_mb"])
        elif "outer_step" in d and "event" not in d:
            sent.append(d["bytes_sent"])
            recv.append(d["bytes_recv"])
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
rounds = []
for line in open(relay_log):
    r = re.search(r"closed: (\d+) contributor.*?, ([\d.]+) (B|KiB|MiB|GiB) in, ([\d.]+) (B|KiB|MiB|GiB) out, rss ([\d.]+) (B|KiB|MiB|GiB)", line)
    if r:
        rounds.append((int(r.group(1)), float(r.group(2)) * units[r.group(3)], float(r.group(4)) * units[r.group(5)],
                       float(r.group(6)) * units[r.group(7)]))
full = [x for x in rounds if x[0] == m] or rounds
n_in = sum(x[1] for x in rounds)
cpu_s = cpu / ticks
mib = 2**20
print(f"{m:3d} | {statistics.median(sent)/1e6:.3f} MB | {statistics.median(recv)/1e6:.3f} MB | "
      f"{statistics.median(rss):.1f} ({max(rss):.1f}) MB | {full[-1][1]/mib:.2f} MiB | {full[-1][2]/mib:.2f} MiB | "
      f"{full[-1][3]/mib:.1f} MiB | {cpu_s:.2f} | {n_in/1e6/cpu_s if cpu_s else float('nan'):.0f}   "
      f"({len(rounds)} rounds, {len(full)} with all {m})")
PY
done
} | tee "$out"
