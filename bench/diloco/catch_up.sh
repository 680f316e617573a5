#!/usr/bin/env bash
# bench/diloco/catch_up.sh — what a join costs the group when its state transfer outlasts an
# inner phase: the relay's catch-up transfer (--catch_up 1, the default) against the whole
# transfer that holds the round (--catch_up 0) (docs/protocol.md#catch-up-transfers).
#
#   bash bench/diloco/catch_up.sh [OUT]
#
# Three replicas through a relay on this machine (tcp on loopback, one thread each),
# test/configs/tiny_test.conf at d_model 128 (303,872 parameters), batch B (16), H (5) inner
# steps, Nesterov outer momentum (so the state is θ and m, 2.4 MB), fp32 outer gradients.
# Replicas 0 and 1 start; once round 1 has closed, replica 2 starts and waits for the group's
# state, which replica 0 sends over a slow link (TRAIN_GPT_FAULT=tcp_slow_state: one 128 KiB
# chunk per 0.5 s, about 10 s for the state) — several inner phases. Each mode runs until
# the three have contributed together to 5 rounds. OUT/MODE/summary.txt: the transfer's
# length; the length of the first round to close after the donor's designation (with
# --catch_up 0 it waits for the whole transfer); the rounds that closed while it went and their
# mean length, against the median round of the two before it; the rounds after it with all
# three; the joiner's caught_up_rounds and skipped_steps.
# OUT/summary.txt: both modes.
#
# HUBS=2: the same through two relays (diloco_rendezvous = a,b; each reduces a share of the
# segments); the figures are the first relay's (the joiner's primary, which relays the state
# and the means: docs/protocol.md, "Catch-up transfers" step 7), its rounds counted per outer
# step (share 0's).
#
# Environment: TRAIN_GPT (default ./train_gpt), B, H, HUBS (1), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/diloco-catch-up}
B=${B:-16}
H=${H:-5}
HUBS=${HUBS:-1}
. bench/diloco/join_common.sh
# Rounds closed at the first relay (with two: share 0's, one per outer step).
closed() { grep -c "round [0-9]*\( (step [0-9]*, attempt [0-9]*, share 0)\)\? closed" "$1/relay.log" 2>/dev/null || true; }
with_three() { grep "round [0-9]*\( (step [0-9]*, attempt [0-9]*, share 0)\)\? closed" "$1/relay.log" 2>/dev/null |
    grep -c "closed: 3 contributor(s)" || true; }

tool=build/test_tool
[ -x "$tool" ] || make -s "$tool"
"$tool" shard "$out/train.bin" 64 0 60000 11 >/dev/null
head -c 32 /dev/urandom >"$out/secret"

run_mode() {  # run_mode NAME CATCH_UP
    local dir=$out/$1 port r fault rendezvous="" log
    mkdir -p "$dir"
    pids=()
    for ((r = 0; r < HUBS; r++)); do
        port=$(free_port)
        log=$dir/relay.log
        [ "$r" -gt 0 ] && log=$dir/relay$((r + 1)).log
        "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$out/secret" --timeout_s 2 --catch_up "$2" \
            >"$log" 2>&1 &
        pids+=($!)
        until grep -q "listening on" "$log"; do sleep 0.05; done
        rendezvous+=${rendezvous:+,}127.0.0.1:$port
    done
    local relays=$HUBS
    local args=(test/configs/tiny_test.conf --train_data "$out/train.bin" --val_every 0 --threads 1 --log_every 1000
        --ckpt_every 0 --ckpt_keep 0 --max_steps 100000000 --d_model 128 --d_ff 256 --batch_size "$B"
        --diloco_inner_steps "$H" --diloco_replicas 3 --diloco_min_replicas 2 --diloco_quant none
        --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_transport tcp
        --diloco_rendezvous "$rendezvous" --diloco_secret_file "$out/secret" --diloco_timeout_s 2)
    for r in 0 1 2; do
        if [ "$r" = 2 ]; then until [ "$(closed "$dir")" -ge 2 ]; do alive; sleep 0.2; done; fi
        start_replica "$r" "$dir" "${args[@]}"
    done
    until [ "$(with_three "$dir")" -ge 5 ]; do alive; sleep 0.2; done
    kill -TERM "${pids[@]:relays}"
    for p in "${pids[@]:relays}"; do wait "$p" || true; done
    kill "${pids[@]:0:relays}" 2>/dev/null || true
    for p in "${pids[@]:0:relays}"; do wait "$p" 2>/dev/null || true; done
    "$python" - "$dir" "$1" <<'PY'
import json, re, statistics, sys
d, mode = sys.argv[1], sys.argv[2]
log = open(f"{d}/relay.log").read()
# One relay: every round; two: share 0's rounds (one per outer step).
closes = [(float(t), int(k), int(n)) for t, k, s, n in
          re.findall(r"\[\s*([0-9.]+)s\] round (\d+)(?: \(step \d+, attempt \d+, share (\d+)\))? closed: (\d+) contributor",
                     log) if s in ("", "0")]
began = float(re.search(r"\[\s*([0-9.]+)s\] replica \d+ is the donor", log).group(1))
end = re.search(r"\[\s*([0-9.]+)s\] (?:catch-up transfer from replica \d+ over|state after round \d+ relayed)", log)
ended = float(end.group(1))
lengths = [(t, k, n, t - closes[i - 1][0]) for i, (t, k, n) in enumerate(closes) if i > 0]
before = [x for t, k, n, x in lengths if t <= began and n == 2]
during = [x for t, k, n, x in lengths if began < t <= ended]
after = [x for t, k, n, x in lengths if t > ended and n == 3]
join = [json.loads(l) for l in open(f"{d}/r2/metrics.jsonl") if '"diloco_join"' in l][-1]
first = next((x for t, k, n, x in lengths if t > began), None)   # the round the designation fell in: held, or not
lines = [f"{mode}: transfer {ended - began:.1f} s (designation to its end at the hub)",
         f"  the first round to close after the designation: {first:.2f} s" if first is not None else "  no round closed after it",
         f"  rounds closed while it went: {len(during)}, "
         + (f"mean {statistics.mean(during):.2f} s, longest {max(during):.2f} s" if during else "none"),
         f"  rounds before it (two replicas): median {statistics.median(before):.2f} s" if before else "  rounds before it: none",
         f"  rounds after it (all three): median {statistics.median(after):.2f} s" if after else "  rounds after it: none",
         f"  joiner: caught_up_rounds {join.get('caught_up_rounds', 0)}, skipped_steps {join.get('skipped_steps')}"]
open(f"{d}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
    find "$dir"/r? -type f ! -name metrics.jsonl -delete
    find "$dir"/r? -type d -empty -delete
}

run_mode catch_up 1
run_mode whole 0
cat "$out/catch_up/summary.txt" "$out/whole/summary.txt" >"$out/summary.txt"
rm -f "$out/train.bin" "$out/secret"
