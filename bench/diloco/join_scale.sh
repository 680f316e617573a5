#!/usr/bin/env bash
# bench/diloco/join_scale.sh — a catch-up transfer at several group sizes: does what the hub,
# the donor and the joiner hold, or what the group waits, grow with M? (docs/protocol.md
# #catch-up-transfers says none of it does.)
#
#   bash bench/diloco/join_scale.sh [OUT]
#
# For each M in MS (default "4 16 32"): a relay and M − 1 replicas of test/configs/
# scale_test.conf (about 1M parameters: 7.9 MB of θ and m with Nesterov μ 0.9), one thread each,
# tcp on loopback, int8 outer gradients with error feedback, H inner steps, a catch-up relay.
# Once round 1 has closed, replica M − 1 starts and waits for the group's state; replica 0, the
# donor, sends it in chunks of 128 KiB, one per 0.25 × timeout_s (TRAIN_GPT_FAULT=
# tcp_slow_state: about a minute at timeout_s 4), while the group goes on. Each M runs until all M
# have contributed to 3 rounds. OUT/M<M>/summary.txt, from the relay's log and the replicas'
# metrics: the relay's RSS at the rounds before, during and after the transfer; the rounds closed
# while it went and their pace against the rounds before; the joiner's JOIN → CAUGHT_UP, the
# state's bytes and the means it applied; the peak RSS of the donor, the joiner and the members'
# median. OUT/summary.md: one row per M.
#
# Run it on a machine with nothing else running: with 32 replicas on 2 cores a hub timeout of a
# few seconds is close to what a loaded machine's scheduling delays reach, and a replica evicted
# or dropped makes the figures meaningless (the summary counts them; none is wanted).
#
# Environment: TRAIN_GPT (default ./train_gpt), MS, H (10), TIMEOUT_S (4), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-join-scale}
MS=${MS:-4 16 32}
H=${H:-10}
TIMEOUT_S=${TIMEOUT_S:-4}
. bench/diloco/join_common.sh
closed() { grep -c "round [0-9]* closed" "$1/relay.log" 2>/dev/null || true; }
bench_data 21

run_m() {  # run_m M
    local m=$1 dir=$out/M$1 port r fault joiner=$(($1 - 1))
    mkdir -p "$dir"
    pids=()
    port=$(free_port)
    "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$out/secret" --timeout_s "$TIMEOUT_S" \
        >"$dir/relay.log" 2>&1 &
    pids+=($!)
    until grep -q "listening on" "$dir/relay.log"; do sleep 0.05; done
    local args=(test/configs/scale_test.conf --train_data "$out/train.bin" --val_every 0 --threads 1
        --log_every 1000 --ckpt_every 0 --ckpt_keep 0 --max_steps 100000000 --diloco_inner_steps "$H"
        --diloco_replicas "$m" --diloco_min_replicas "$joiner" --diloco_quant int8 --diloco_error_feedback 1
        --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_transport tcp
        --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$out/secret"
        --diloco_timeout_s "$TIMEOUT_S" --diloco_connect_timeout_s 300)
    for ((r = 0; r < m; r++)); do
        if [ "$r" = "$joiner" ]; then until [ "$(closed "$dir")" -ge 2 ]; do alive; sleep 0.2; done; fi
        start_replica "$r" "$dir" "${args[@]}"
    done
    until [ "$(closes_of "$dir" "$m")" -ge 3 ]; do alive; sleep 0.2; done
    kill -TERM "${pids[@]:1}"
    for p in "${pids[@]:1}"; do wait "$p" || true; done
    kill "${pids[0]}" 2>/dev/null || true
    wait "${pids[0]}" 2>/dev/null || true
    "$python" - "$dir" "$m" <<'PY'
import json, re, statistics, sys
d, m = sys.argv[1], int(sys.argv[2])
joiner = m - 1
log = open(f"{d}/relay.log").read()
def at(pattern):
    found = re.search(r"\[\s*([0-9.]+)s\] " + pattern, log)
    return float(found.group(1)) if found else None
unit = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
closes = [(float(t), int(n), float(rss) * unit[u]) for t, n, rss, u in
          re.findall(r"\[\s*([0-9.]+)s\] round \d+ closed: (\d+) contributor\(s\) \[[0-9 ]*\][^\n]*?rss ([0-9.]+) (B|KiB|MiB|GiB)", log)]
t_donor, t_over = at(r"replica 0 is the donor"), at(r"catch-up transfer from replica 0 over")
t_join, t_caught = at(rf"replica {joiner} joined at outer step"), at(rf"replica {joiner} caught up")
faults = len(re.findall(r"\) (evicted|dropped):", log))   # a replica late or silent: the machine was too loaded
if None in (t_donor, t_over, t_join, t_caught):
    sys.exit(f"join_scale: M = {m}: no whole catch-up transfer in {d}/relay.log ({faults} replica(s) evicted or "
             "dropped: a machine too loaded for this M and TIMEOUT_S?)")
before = [c for c in closes if c[0] < t_donor]
during = [c for c in closes if t_donor <= c[0] < t_over]
after = [c for c in closes if c[0] >= t_over]
pace = lambda cs: statistics.median(b[0] - a[0] for a, b in zip(cs, cs[1:])) if len(cs) > 2 else float("nan")
def metrics(r):
    rows = [json.loads(line) for line in open(f"{d}/r{r}/metrics.jsonl")]
    end = next((x for x in rows if x.get("event") == "end"), {})
    join = next((x for x in rows if x.get("event") == "diloco_join"), {})
    return end.get("peak_rss_mb", float("nan")), join
donor_rss, _ = metrics(0)
joiner_rss, join = metrics(joiner)
members_rss = statistics.median(metrics(r)[0] for r in range(1, joiner))
row = {
    "M": m,
    "evicted_or_dropped": faults,
    "relay_rss_before_mib": max(c[2] for c in before),
    "relay_rss_during_mib": max(c[2] for c in during),
    "relay_rss_after_mib": max(c[2] for c in after),
    "rounds_during": len(during),
    "pace_before_s": pace(before),
    "pace_during_s": pace(during),
    "join_to_caught_up_s": t_caught - t_join,
    "transfer_s": t_over - t_donor,
    "state_bytes": join.get("state_bytes"),
    "caught_up_rounds": join.get("caught_up_rounds"),
    "peak_rss_donor_mb": donor_rss,
    "peak_rss_joiner_mb": joiner_rss,
    "peak_rss_members_median_mb": members_rss,
}
json.dump(row, open(f"{d}/summary.json", "w"), indent=1)
text = "\n".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}" for k, v in row.items())
open(f"{d}/summary.txt", "w").write(text + "\n")
print(text)
PY
    # Each replica's metrics and the logs stay; checkpoints and the like go.
    find "$dir" -mindepth 2 -type f ! -name metrics.jsonl -delete
    find "$dir" -mindepth 1 -type d -empty -delete
}

for m in $MS; do run_m "$m"; done
"$python" - "$out" $MS <<'PY'
import json, sys
out, ms = sys.argv[1], sys.argv[2:]
rows = [json.load(open(f"{out}/M{m}/summary.json")) for m in ms]
head = ("| M | relay RSS before / during / after (MiB) | rounds closed during the transfer | round pace before / "
        "during (s) | joiner: JOIN → CAUGHT_UP (s) | state (bytes) | means applied | peak RSS donor / joiner / "
        "members' median (MB) | replicas evicted or dropped |")
lines = [head, "|" + "---|" * 9]
for r in rows:
    lines.append(f"| {r['M']} | {r['relay_rss_before_mib']:.1f} / {r['relay_rss_during_mib']:.1f} / "
                 f"{r['relay_rss_after_mib']:.1f} | {r['rounds_during']} | {r['pace_before_s']:.2f} / "
                 f"{r['pace_during_s']:.2f} | {r['join_to_caught_up_s']:.1f} | {r['state_bytes']} | "
                 f"{r['caught_up_rounds']} | {r['peak_rss_donor_mb']:.1f} / {r['peak_rss_joiner_mb']:.1f} / "
                 f"{r['peak_rss_members_median_mb']:.1f} | {r['evicted_or_dropped']} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
