# DiLoCo over several hubs (diloco_rendezvous = h1:p1,h2:p2; docs/protocol.md, "Several hubs"),
# the real binary on the CPU backend, relays and replicas on loopback:
#   1. 3 replicas through one relay and through two (each reducing half of the segments), the
#      same data and seeds: every outer step's param_hash equal on every replica, and equal
#      between the two runs (the two hubs' means together are one hub's, byte for byte, its
#      downlink error feedback included); the loss falls; the outer step against numpy.
#   2. kill -9 the first relay (every replica's primary) mid-run: each outer step still
#      closes within timeout + 5 s, through the other relay, and is applied; restarted on its
#      port, the relay takes its share again (its log: a round closed with all three); the
#      param_hash agrees on every replica at every outer step; the loss falls.
# Every move waits for what the processes log, never for a time or a step count.
. "$(dirname "$0")/lib.sh"
tmp_with_processes
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
make_secret "$tmp/secret"
# scale_test: 992,640 parameters, 4 segments of the payload: two shares.
common=(test/configs/scale_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --diloco_replicas 3 --diloco_inner_steps 5
    --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_quant int8 --diloco_min_replicas 3)
TIMEOUT=3

hashes() {  # hashes METRICS: "outer_step param_hash" of every applied outer step
    "$PYTHON" - "$1" <<'PY'
import json, sys
for d in map(json.loads, open(sys.argv[1])):
    if "param_hash" in d and "event" not in d and d.get("applied"):
        print(d["outer_step"], d["param_hash"])
PY
}
all_agree() {  # all_agree MIN_STEPS FILES...: at least MIN_STEPS applied outer steps, one hash each
    local want=$1; shift
    local out; out=$(for f in "$@"; do hashes "$f"; done | sort -u | awk '{n[$1]++} END {for (k in n) print k, n[k]}')
    [ "$(printf '%s\n' "$out" | grep -c .)" -ge "$want" ] && ! printf '%s\n' "$out" | awk '$2 != 1' | grep -q .
}
loss_falls() {  # the mean loss of the last 5 steps is below the first 5's by 20 %
    "$PYTHON" - "$1" <<'PY'
import json, sys
losses = [d["loss"] for d in map(json.loads, open(sys.argv[1])) if "loss" in d and "event" not in d]
first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
sys.exit(0 if last < 0.8 * first else 1)
PY
}
start_relay() {  # start_relay NAME PORT: a relay on 127.0.0.1:PORT, logging to $tmp/relay_NAME.log
    "$TRAIN_GPT" relay --listen "127.0.0.1:$2" --secret_file "$tmp/secret" --timeout_s $TIMEOUT \
        >>"$tmp/relay_$1.log" 2>&1 &
    pids+=($!)
    eval "relay_pid_$1=$!"
    wait_until "relay $1 listens" grep -q "listening on" "$tmp/relay_$1.log"
}
# three NAME RENDEZVOUS ARGS...: replicas 0, 1, 2 into $tmp/NAME/<id>, in the background.
three() {
    local name=$1 rdv=$2 r
    shift 2
    mkdir -p "$tmp/dump_$name"
    for r in 0 1 2; do
        TRAIN_GPT_DILOCO_DUMP="$tmp/dump_$name" "$TRAIN_GPT" "${common[@]}" "$@" --diloco_transport tcp \
            --diloco_rendezvous "$rdv" --diloco_secret_file "$tmp/secret" --diloco_timeout_s $TIMEOUT \
            --diloco_connect_timeout_s 20 --diloco_replica_id "$r" --out_dir "$tmp/$name/$r" \
            >>"$tmp/${name}_$r.log" 2>&1 &
        pids+=($!)
        eval "pid_${name}_$r=$!"
    done
}
wait_three() {  # wait_three NAME: rc = the last non-zero exit status
    local p
    rc=0
    for r in 0 1 2; do eval "p=\$pid_$1_$r"; wait "$p" || rc=$?; done
}

# ---------------------------------------------------------------- 1. one hub, two hubs
p1=$(free_port); start_relay one "$p1"
three one "127.0.0.1:$p1" --max_steps 60
wait_three one
check "one hub: 3 replicas exit 0 (rc $rc)" test "$rc" -eq 0
p2=$(free_port); start_relay a "$p2"
p3=$(free_port); start_relay b "$p3"
three two "127.0.0.1:$p2,127.0.0.1:$p3" --max_steps 60
wait_three two
check "two hubs: 3 replicas exit 0 (rc $rc)" test "$rc" -eq 0
check "two hubs: param_hash equal on every replica at every applied outer step (>= 8)" \
    all_agree 8 "$tmp"/two/*/metrics.jsonl
check "two hubs: the same param_hash as one hub at every outer step (the means byte for byte)" \
    test "$(hashes "$tmp/one/0/metrics.jsonl")" = "$(hashes "$tmp/two/0/metrics.jsonl")" -a \
    -n "$(hashes "$tmp/two/0/metrics.jsonl")"
check "two hubs: each relay reduces its share (step 11: share 0 on the first, share 1 on the second)" \
    sh -c "grep -q 'round 704 (step 11, attempt 0, share 0) closed: 3 contributor' '$tmp/relay_a.log' &&
           grep -q 'round 705 (step 11, attempt 0, share 1) closed: 3 contributor' '$tmp/relay_b.log'"
check "two hubs: loss falls" loss_falls "$tmp/two/1/metrics.jsonl"
check "two hubs: outer step = Nesterov on θ − mean θᵢ (numpy), int8 Δ within 3 % relative L2" \
    "$PYTHON" test/diloco_check.py "$tmp/dump_two" 0.7 0.9 int8 0.03
kill "$relay_pid_one" "$relay_pid_a" "$relay_pid_b" 2>/dev/null || true

# ---------------------------------------------------------------- 2. kill -9 a hub, restart it
outer_lines() {  # outer_lines ID: replica ID's outer lines so far
    local n; n=$(grep -c '"outer_step":[0-9]*,"step"' "$tmp/kill/$1/metrics.jsonl" 2>/dev/null || true)
    echo "${n:-0}"
}
p4=$(free_port); start_relay k1 "$p4"
p5=$(free_port); start_relay k2 "$p5"
three kill "127.0.0.1:$p4,127.0.0.1:$p5" --max_steps 100000000 --batch_size 16
wait_until "replica 0 reaches outer step 5" eval '[ "$(outer_lines 0)" -ge 5 ]'
kill -9 "$relay_pid_k1"
wait "$relay_pid_k1" 2>/dev/null || true
killed=$(outer_lines 0)
for r in 0 1 2; do
    wait_until "replica $r goes on through the second relay" eval '[ "$(outer_lines '$r')" -ge $((killed + 4)) ]'
done
check "kill -9 a hub: the second relay reduces the first one's share" \
    grep -q 'share 0) closed: 3 contributor' "$tmp/relay_k2.log"
before=$(wc -c <"$tmp/relay_k1.log")
start_relay k1 "$p4"
wait_until "the restarted relay closes a round with all three" \
    sh -c "tail -c +$((before + 1)) '$tmp/relay_k1.log' | grep -q 'closed: 3 contributor(s) \[0 1 2\]'"
check "restarted on its port, the first relay takes its share again (a round of all three)" \
    sh -c "tail -c +$((before + 1)) '$tmp/relay_k1.log' | grep -q 'closed: 3 contributor(s) \[0 1 2\]'"
back=$(outer_lines 0)
wait_until "replica 0 goes on with both relays" eval '[ "$(outer_lines 0)" -ge $((back + 3)) ]'
for r in 0 1 2; do eval "kill -TERM \$pid_kill_$r"; done
wait_three kill
check "kill -9 a hub: the replicas stop cleanly on SIGTERM (rc $rc)" test "$rc" -eq 0
every_round() {  # every outer line of replica 0 within timeout + 5 s; most applied (a replica
    # that got the dead hub's mean while others did not is evicted once and resyncs)
    "$PYTHON" - "$tmp/kill/0/metrics.jsonl" "$TIMEOUT" <<'PY'
import json, sys
lines = [d for d in map(json.loads, open(sys.argv[1])) if "contributors" in d]
slow = [(d["outer_step"], d["contributors"], round(d["sync_s"], 2)) for d in lines if d["sync_s"] > float(sys.argv[2]) + 5]
skipped = [(d["outer_step"], d["contributors"]) for d in lines if not d["applied"]]
print("  outer steps", len(lines), "slow:", slow[:8], "not applied:", skipped[:8], file=sys.stderr)
sys.exit(0 if lines and not slow and len(skipped) <= 2 else 1)
PY
}
check "kill -9 a hub: every outer step within timeout + 5 s, all but at most 2 applied" every_round
check "kill -9 a hub: param_hash equal on every replica at every outer step" \
    all_agree 8 "$tmp"/kill/*/metrics.jsonl
check "kill -9 a hub: loss falls" loss_falls "$tmp/kill/0/metrics.jsonl"
# ---------------------------------------------------------------- 3. configuration errors
bad_list() {  # bad_list WHAT RENDEZVOUS EXTRA...: exits non-zero with one error line naming WHAT
    local what=$1 rdv=$2 out rc=0
    shift 2
    out=$("$TRAIN_GPT" "${common[@]}" --max_steps 5 --diloco_transport tcp --diloco_rendezvous "$rdv" \
        --diloco_secret_file "$tmp/secret" --diloco_replica_id 0 --diloco_connect_timeout_s 2 "$@" \
        --out_dir "$tmp/bad" 2>&1) || rc=$?
    [ "$rc" -ne 0 ] && printf '%s\n' "$out" | grep -q "$what"
}
check "an empty address in the hub list: one line naming diloco_rendezvous" \
    bad_list "diloco_rendezvous '127.0.0.1:1,,127.0.0.1:2': an empty hub address" "127.0.0.1:1,,127.0.0.1:2"
check "a hub listed twice: one line naming diloco_rendezvous" \
    bad_list "is listed twice" "127.0.0.1:$p1,127.0.0.1:$p1"
check "diloco_serve with several hubs: one line naming diloco_serve" \
    bad_list "diloco_serve: a replica can host one hub" "127.0.0.1:$p1,127.0.0.1:$p2" --diloco_serve 1
check "no hub of the list reachable: one line naming the hubs" \
    bad_list "cannot reach any of the 2 hubs" "127.0.0.1:$p1,127.0.0.1:$p2"
finish test_diloco_hubs
