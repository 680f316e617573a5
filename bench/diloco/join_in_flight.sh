#!/usr/bin/env bash
# bench/diloco/join_in_flight.sh — what a replica that comes during another's catch-up transfer
# waits: joining the transfer in flight (relay --join_in_flight 1, the default) against waiting
# for it to end and for the next close to begin another (--join_in_flight 0, the relay before
# 2026-12) (docs/protocol.md#catch-up-transfers, step 8).
#
#   bash bench/diloco/join_in_flight.sh [OUT]
#
# Four replicas through a relay on this machine (tcp on loopback, one thread each),
# test/configs/tiny_test.conf at d_model 192 (6.3 MB of θ and m: 48 chunks of 128 KiB), batch
# B (16), H (5) inner steps, Nesterov outer momentum, fp32 outer gradients, a catch-up relay.
# Replicas 0 and 1 start; once round 1 has closed replica 2 starts and waits for the group's
# state, which replica 0 sends over a slow link (TRAIN_GPT_FAULT=tcp_slow_state: one chunk per
# 0.5 s, about 25 s); once replica 2 says its state is coming, replica 3 starts. Each mode runs
# until the four have contributed together to 5 rounds. OUT/MODE/summary.txt, from the relay's
# log: for replicas 2 and 3, the time from its JOIN to its CAUGHT_UP and to the first round it
# contributed to; the donor designations; the chunks the donor sent again. OUT/summary.txt:
# both modes.
#
# Environment: TRAIN_GPT (default ./train_gpt), B, H, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-join-in-flight}
B=${B:-16}
H=${H:-5}
. bench/diloco/join_common.sh
closed() { grep -c "round [0-9]* closed" "$1/relay.log" 2>/dev/null || true; }
bench_data 11

run_mode() {  # run_mode NAME JOIN_IN_FLIGHT
    local dir=$out/$1 port r fault
    mkdir -p "$dir"
    pids=()
    port=$(free_port)
    "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$out/secret" --timeout_s 2 \
        --join_in_flight "$2" >"$dir/relay.log" 2>&1 &
    pids+=($!)
    until grep -q "listening on" "$dir/relay.log"; do sleep 0.05; done
    local args=(test/configs/tiny_test.conf --train_data "$out/train.bin" --val_every 0 --threads 1 --log_every 1000
        --ckpt_every 0 --ckpt_keep 0 --max_steps 100000000 --d_model 192 --d_ff 512 --batch_size "$B"
        --diloco_inner_steps "$H" --diloco_replicas 4 --diloco_min_replicas 2 --diloco_quant none
        --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_transport tcp
        --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$out/secret" --diloco_timeout_s 2)
    for r in 0 1 2 3; do
        if [ "$r" = 2 ]; then until [ "$(closed "$dir")" -ge 2 ]; do alive; sleep 0.2; done; fi
        if [ "$r" = 3 ]; then
            until grep -q "receiving the group's state" "$dir/r2.log"; do alive; sleep 0.1; done
        fi
        start_replica "$r" "$dir" "${args[@]}"
    done
    until [ "$(closes_of "$dir" 4)" -ge 5 ]; do alive; sleep 0.2; done
    kill -TERM "${pids[@]:1}"
    for p in "${pids[@]:1}"; do wait "$p" || true; done
    kill "${pids[0]}" 2>/dev/null || true
    wait "${pids[0]}" 2>/dev/null || true
    "$python" - "$dir" "$1" <<'PY'
import re, sys
d, mode = sys.argv[1], sys.argv[2]
log = open(f"{d}/relay.log").read()
def at(pattern):
    m = re.search(r"\[\s*([0-9.]+)s\] " + pattern, log)
    return float(m.group(1)) if m else None
closes = [(float(t), [int(x) for x in ids.split()]) for t, ids in
          re.findall(r"\[\s*([0-9.]+)s\] round \d+ closed: \d+ contributor\(s\) \[([0-9 ]*)\]", log)]
lines = [f"{mode}: donor designations {len(re.findall('is the donor', log))}, "
         f"replicas that joined a transfer in flight {len(re.findall('in flight [(]', log))}"]
again = re.search(r"it sends its first (\d+) chunk\(s\) again \(([^)]*)\)", log)
lines.append(f"  chunks sent again: {again.group(1)} ({again.group(2)})" if again else "  chunks sent again: none")
for r in (2, 3):
    joined = at(rf"replica {r} joined at outer step")
    caught = at(rf"replica {r} caught up")
    first = next((t for t, ids in closes if r in ids), None)
    f = lambda x: f"{x - joined:.1f} s" if x is not None and joined is not None else "never"
    lines.append(f"  replica {r}: JOIN to CAUGHT_UP {f(caught)}, JOIN to its first contribution's close {f(first)}")
open(f"{d}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
    find "$dir"/r? -type f ! -name metrics.jsonl -delete
    find "$dir"/r? -type d -empty -delete
}

run_mode in_flight 1
run_mode wait 0
cat "$out/in_flight/summary.txt" "$out/wait/summary.txt" >"$out/summary.txt"
