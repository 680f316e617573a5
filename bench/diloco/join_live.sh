#!/usr/bin/env bash
# bench/diloco/join_live.sh — what a replica's join costs the group: the round during which a
# donor's state goes, against the rounds before and after (docs/protocol.md#joins-and-state-transfer).
#
#   bash bench/diloco/join_live.sh [OUT]
#
# Three replicas through a relay on this machine (tcp on loopback, one thread each),
# test/configs/tiny_test.conf at d_model D (128), batch B (64), H (200) inner steps, fp32 outer
# gradients, plain averaging. Replicas 0 and 1 start; once round 1 has closed, replica 2 starts
# and waits for the group's state. Replica 0 is the donor and sends it over a slow link: one
# 128 KiB chunk per 0.25 × diloco_timeout_s (TRAIN_GPT_FAULT=tcp_slow_state, 0.5 s here: about
# 2 Mbit/s), so that the transfer takes seconds while an inner phase takes longer. The run stops
# once round 5 has closed. OUT/rounds.tsv: each round's close time and its length (close to
# close) from the relay's log; OUT/summary.txt: the transfer's length, the round it fell in,
# that round's length against the median of the rounds after it (the same three replicas
# training, no transfer), and the joiner's skipped steps.
# Run it with TRAIN_GPT set to two builds to compare them.
#
# Environment: TRAIN_GPT (default ./train_gpt), D, B, H, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-join-live}
D=${D:-128}
B=${B:-64}
H=${H:-200}
. bench/diloco/join_common.sh
closed() { grep -c "round [0-9]* closed" "$out/relay.log" 2>/dev/null || true; }
wait_for() {  # wait_for N: until N rounds have closed (or a process died)
    until [ "$(closed)" -ge "$1" ]; do
        alive
        sleep 0.2
    done
}

tool=build/test_tool
[ -x "$tool" ] || make -s "$tool"
"$tool" shard "$out/train.bin" 64 0 60000 11 >/dev/null
head -c 32 /dev/urandom >"$out/secret"
port=$(free_port)
# --catch_up 0: the whole transfer, which may hold the round (bench/diloco/catch_up.sh: the default).
"$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$out/secret" --timeout_s 3 --catch_up 0 >"$out/relay.log" 2>&1 &
pids+=($!)
until grep -q "listening on" "$out/relay.log"; do sleep 0.05; done
args=(test/configs/tiny_test.conf --train_data "$out/train.bin" --val_every 0 --threads 1 --log_every 1000
    --ckpt_every 0 --ckpt_keep 0 --max_steps 100000000 --d_model "$D" --d_ff $((2 * D)) --batch_size "$B"
    --diloco_inner_steps "$H" --diloco_replicas 3 --diloco_min_replicas 1 --diloco_quant none
    --diloco_outer_lr 1 --diloco_outer_momentum 0 --diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port"
    --diloco_secret_file "$out/secret" --diloco_timeout_s 2)
for r in 0 1 2; do
    [ "$r" = 2 ] && wait_for 2
    fault=""
    [ "$r" = 0 ] && fault=tcp_slow_state:0
    TRAIN_GPT_FAULT=$fault "$train_gpt" "${args[@]}" --diloco_replica_id "$r" --out_dir "$out/r$r" >"$out/r$r.log" 2>&1 &
    pids+=($!)
done
wait_for 6
kill -TERM "${pids[@]:1}"
for p in "${pids[@]:1}"; do wait "$p" || true; done
"$python" - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
log = open(f"{out}/relay.log").read()
closes = [(int(k), float(t)) for t, k in re.findall(r"\[\s*([0-9.]+)s\] round (\d+) closed", log)]
m = re.search(r"\[\s*([0-9.]+)s\] state after round (\d+) relayed from replica (\d+) to \[2\]: .* in ([0-9.]+) s", log)
with open(f"{out}/rounds.tsv", "w") as f:
    f.write("round\tclosed_at_s\tlength_s\n")
    for i, (k, t) in enumerate(closes):
        f.write(f"{k}\t{t:.3f}\t{'' if i == 0 else f'{t - closes[i - 1][1]:.3f}'}\n")
lines = []
if m:
    at, after, donor, took = float(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
    lengths = {k: t - closes[i - 1][1] for i, (k, t) in enumerate(closes) if i > 0}
    during = after + 1                    # the round whose inner phase the transfer overlapped
    others = [v for k, v in lengths.items() if k > during]   # the three replicas, no transfer
    lines.append(f"transfer: state after round {after} from replica {donor}, {took:.1f} s")
    if during in lengths and others:
        med = statistics.median(others)
        lines.append(f"round {during} (the transfer's): {lengths[during]:.2f} s; median of rounds "
                     f"{sorted(k for k in lengths if k > during)}: {med:.2f} s; "
                     f"difference {lengths[during] - med:+.2f} s")
joins = [json.loads(l) for l in open(f"{out}/r2/metrics.jsonl") if '"diloco_join"' in l]
if joins:
    lines.append(f"joiner: skipped_steps {joins[-1].get('skipped_steps', 'n/a (build without it)')}")
open(f"{out}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
rm -f "$out/train.bin" "$out/secret"
# Keep the metrics and logs; the checkpoints the stop wrote are not results.
find "$out"/r? -type f ! -name metrics.jsonl -delete
find "$out"/r? -type d -empty -delete
