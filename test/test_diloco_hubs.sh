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
#   3. configuration errors: one line each (a hub listed in another order: test_transport hubs3).
#   4. three relays; the second (not the primary) dies the mixed way (TRAIN_GPT_FAULT
#      relay_die_in_close: its ROUND of a round goes to replica 0 only, then it dies): replica 0
#      takes that outer step, replicas 1 and 2 are evicted and take its state; then kill -9 the
#      third relay: every share goes through the first. Restarted, the second and third take
#      their shares again. Every outer step within timeout + 5 s, the param_hash equal on every
#      replica at every applied outer step (none taken from two rounds), the loss falls.
#   5. A late joiner catches up through two hubs (relay --catch_up 1, the default): replicas 0
#      and 1 train; replica 2 starts later and takes replica 0's state through its primary (the
#      first relay), slowly (TRAIN_GPT_FAULT=tcp_slow_state:0: seconds for its θ and m) while
#      the group closes step after step, then the means of those steps; it follows the second
#      relay from the step after them (its first round there waits for it) and contributes at
#      both. Replica 3 starts once replica 2's state is coming and joins that transfer in flight
#      at the first relay (docs/protocol.md "Catch-up transfers" step 8). Checked: the group's
#      outer steps within timeout + 5 s throughout (a whole transfer would hold one for the
#      state's seconds), the joiner applied 3 or more means, replica 3 joined in flight (one
#      designation for both), nobody evicted, both relays close rounds of all four afterwards,
#      param_hash equal on every replica at every outer step.
# Every move waits for what the processes log, never for a time or a step count.
. "$(dirname "$0")/lib.sh"
tmp_with_processes
diloco_test_files
# scale_test: 992,640 parameters, 4 segments of the payload: two shares.
common=(test/configs/scale_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --diloco_replicas 3 --diloco_inner_steps 5
    --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_plain_in_decay 0 --diloco_quant int8 --diloco_min_replicas 3)
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
    [ "$(printf '%s\n' "$out" | grep -c .)" -ge "$want" ] && ! printf '%s\n' "$out" | awk '$2 != 1' | grep . >/dev/null
}
# relay_on NAME PORT [FAULT]: a relay on 127.0.0.1:PORT, logging to $tmp/relay_NAME.log (appended:
# a restart keeps the first run's lines); returns once it listens, or 1, its new lines shown, when
# it exited first (the port taken) or never listened.
relay_on() {
    local before=0 pid
    [ -f "$tmp/relay_$1.log" ] && before=$(wc -c <"$tmp/relay_$1.log")
    TRAIN_GPT_FAULT=${3:-} "$TRAIN_GPT" relay --listen "127.0.0.1:$2" --secret_file "$tmp/secret" \
        --timeout_s $TIMEOUT >>"$tmp/relay_$1.log" 2>&1 &
    pid=$!
    pids+=($pid)
    eval "relay_pid_$1=$pid"
    wait_until "relay $1 listens or exits" relay_up_or_gone "$1" "$before" "$pid" || true
    relay_listens "$1" "$before" && return 0
    say "  relay $1 on port $2 $(kill -0 "$pid" 2>/dev/null && echo 'never listened' || echo exited):"
    tail -c +$((before + 1)) "$tmp/relay_$1.log" | tail -n 5 | sed 's/^/    /'
    return 1
}
relay_listens() { tail -c +$(($2 + 1)) "$tmp/relay_$1.log" 2>/dev/null | grep -q 'listening on'; }
relay_up_or_gone() { relay_listens "$1" "$2" || ! kill -0 "$3" 2>/dev/null; }
# relay_new NAME VAR [FAULT]: relay_on NAME on a free port, another if that one was taken
# meanwhile (up to 5 tries); the port in VAR. A restart after kill -9 calls relay_on with its port.
relay_new() {
    local try port
    for try in 1 2 3 4 5; do
        port=$(free_port)
        relay_on "$1" "$port" "${3:-}" && { eval "$2=$port"; return 0; }
    done
    die "relay $1: no port it could listen on in 5 tries"
}
log_after() {  # log_after FILE BYTES PATTERN: PATTERN in FILE past its first BYTES
    tail -c +$(($2 + 1)) "$1" | grep "$3" >/dev/null
}
# three NAME RENDEZVOUS ARGS...: replicas 0, 1, 2 into $tmp/NAME/<id>, in the background (replica
# 0 with TRAIN_GPT_FAULT=$FAULT0 if set).
three() {
    local name=$1 rdv=$2 r fault
    shift 2
    mkdir -p "$tmp/dump_$name"
    for r in 0 1 2; do
        fault=""
        [ "$r" = 0 ] && fault=${FAULT0:-}
        TRAIN_GPT_FAULT=$fault TRAIN_GPT_DILOCO_DUMP="$tmp/dump_$name" "$TRAIN_GPT" "${common[@]}" "$@" --diloco_transport tcp \
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
relay_new one p1
three one "127.0.0.1:$p1" --max_steps 60
wait_three one
check "one hub: 3 replicas exit 0 (rc $rc)" test "$rc" -eq 0
relay_new a p2
relay_new b p3
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
outer_lines() {  # outer_lines ID [RUN]: replica ID's outer lines so far in run RUN (kill)
    local n; n=$(grep -c '"outer_step":[0-9]*,"step"' "$tmp/${2:-kill}/$1/metrics.jsonl" 2>/dev/null || true)
    echo "${n:-0}"
}
relay_new k1 p4
relay_new k2 p5
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
relay_on k1 "$p4" || die "relay k1: no restart on its port p4 = $p4"
wait_until "the restarted relay closes a round with all three" \
    log_after "$tmp/relay_k1.log" "$before" 'closed: 3 contributor(s) \[0 1 2\]'
check "restarted on its port, the first relay takes its share again (a round of all three)" \
    log_after "$tmp/relay_k1.log" "$before" 'closed: 3 contributor(s) \[0 1 2\]'
back=$(outer_lines 0)
wait_until "replica 0 goes on with both relays" eval '[ "$(outer_lines 0)" -ge $((back + 3)) ]'
for r in 0 1 2; do eval "kill -TERM \$pid_kill_$r"; done
wait_three kill
check "kill -9 a hub: the replicas stop cleanly on SIGTERM (rc $rc)" test "$rc" -eq 0
every_round() {  # every_round METRICS: every outer line within timeout + 5 s; all but 2 applied (the
    # replicas without a dead hub's ROUND are evicted once and take the state of one that had it;
    # the step they miss meanwhile has too few contributors)
    "$PYTHON" - "$1" "$TIMEOUT" <<'PY'
import json, sys
lines = [d for d in map(json.loads, open(sys.argv[1])) if "contributors" in d]
slow = [(d["outer_step"], d["contributors"], round(d["sync_s"], 2)) for d in lines if d["sync_s"] > float(sys.argv[2]) + 5]
skipped = [(d["outer_step"], d["contributors"]) for d in lines if not d["applied"]]
print("  outer steps", len(lines), "slow:", slow[:8], "not applied:", skipped[:8], file=sys.stderr)
sys.exit(0 if lines and not slow and len(skipped) <= 2 else 1)
PY
}
check "kill -9 a hub: every outer step within timeout + 5 s, all but at most 2 applied" \
    every_round "$tmp/kill/0/metrics.jsonl"
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
    [ "$rc" -ne 0 ] && printf '%s\n' "$out" | grep "$what" >/dev/null
}
check "an empty address in the hub list: one line naming diloco_rendezvous" \
    bad_list "diloco_rendezvous '127.0.0.1:1,,127.0.0.1:2': an empty hub address" "127.0.0.1:1,,127.0.0.1:2"
check "a hub listed twice: one line naming diloco_rendezvous" \
    bad_list "is listed twice" "127.0.0.1:$p1,127.0.0.1:$p1"
check "diloco_serve with several hubs: one line naming diloco_serve" \
    bad_list "diloco_serve: a replica can host one hub" "127.0.0.1:$p1,127.0.0.1:$p2" --diloco_serve 1
check "no hub of the list reachable: one line naming the hubs" \
    bad_list "cannot reach any of the 2 hubs" "127.0.0.1:$p1,127.0.0.1:$p2"

# ---------------------------------------------------------------- 4. three hubs: the mixed case, two down
relay_new ta pa
relay_new tb pb relay_die_in_close:3
relay_new tc pc
# Replica 0's exchange after the mixed step (outer step 4, when the relay's first rounds have all
# three) waits timeout_s + 1 s (diloco_late): the others' redo of the dead relay's share reaches
# the third relay first, and only replica 0's DONE can tell it that the redo must not stand.
FAULT0=diloco_late:4 three three "127.0.0.1:$pa,127.0.0.1:$pb,127.0.0.1:$pc" --max_steps 100000000 --batch_size 16
wait_until "the second relay sends one replica its ROUND and dies" grep -q "the hub dies now" "$tmp/relay_tb.log"
wait "$relay_pid_tb" 2>/dev/null || true
died=$(outer_lines 0 three)
for r in 0 1 2; do
    wait_until "replica $r goes on without the second relay" eval '[ "$(outer_lines '$r' three)" -ge $((died + 3)) ]'
done
check "the mixed case: the second relay's ROUND went to replica 0 only, then it died" \
    grep -q "went to replica 0 only; the hub dies at its DONE" "$tmp/relay_tb.log"
check "the mixed case: the redo of its share cannot stand once replica 0 completed the step (rejoin)" \
    sh -c "grep -qE 'aborted: replica 0 completed step|other replicas completed that outer step' \
        '$tmp/relay_ta.log' '$tmp/relay_tc.log'"
check "the mixed case: replicas 1 and 2 take replica 0's state" \
    sh -c "grep -q '\"event\":\"diloco_join\"' '$tmp/three/1/metrics.jsonl' &&
           grep -q '\"event\":\"diloco_join\"' '$tmp/three/2/metrics.jsonl'"
kill -9 "$relay_pid_tc"
wait "$relay_pid_tc" 2>/dev/null || true
before_a=$(wc -c <"$tmp/relay_ta.log")
alone=$(outer_lines 0 three)
for r in 0 1 2; do
    wait_until "replica $r goes on through the first relay alone" eval '[ "$(outer_lines '$r' three)" -ge $((alone + 3)) ]'
done
check "kill -9 the third relay too: the first reduces every share" \
    sh -c "tail -c +$((before_a + 1)) '$tmp/relay_ta.log' | grep -q 'share 1) closed: 3 contributor' &&
           tail -c +$((before_a + 1)) '$tmp/relay_ta.log' | grep -q 'share 2) closed: 3 contributor'"
before_b=$(wc -c <"$tmp/relay_tb.log")
before_c=$(wc -c <"$tmp/relay_tc.log")
relay_on tb "$pb" || die "relay tb: no restart on its port pb = $pb"
relay_on tc "$pc" || die "relay tc: no restart on its port pc = $pc"
wait_until "the restarted second relay closes a round with all three" \
    log_after "$tmp/relay_tb.log" "$before_b" 'share 1) closed: 3 contributor(s) \[0 1 2\]'
wait_until "the restarted third relay closes a round with all three" \
    log_after "$tmp/relay_tc.log" "$before_c" 'share 2) closed: 3 contributor(s) \[0 1 2\]'
check "restarted, the second and third relays take their shares again" \
    sh -c "tail -c +$((before_b + 1)) '$tmp/relay_tb.log' | grep -q 'share 1) closed: 3 contributor(s) \[0 1 2\]' &&
           tail -c +$((before_c + 1)) '$tmp/relay_tc.log' | grep -q 'share 2) closed: 3 contributor(s) \[0 1 2\]'"
for r in 0 1 2; do eval "kill -TERM \$pid_three_$r"; done
wait_three three
check "three hubs: the replicas stop cleanly on SIGTERM (rc $rc)" test "$rc" -eq 0
for r in 0 1 2; do
    check "three hubs: replica $r's outer steps within timeout + 5 s, all but at most 2 applied" \
        every_round "$tmp/three/$r/metrics.jsonl"
done
check "three hubs: param_hash equal on every replica at every applied outer step (none from two rounds)" \
    all_agree 8 "$tmp"/three/*/metrics.jsonl
check "three hubs: loss falls" loss_falls "$tmp/three/0/metrics.jsonl"

# ---------------------------------------------------------------- 5. a late joiner catches up
# tiny_test at d_model 128: 303,870 values, two segments (a share per relay), a state of 2.4 MB
# with m: about 14 s at the slow hook's 128 KiB per 0.75 s, where an inner phase is a few tenths.
# diloco_min_replicas 2: replicas 0 and 1 start together (the quorum) and apply every step.
late=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_every 0 --threads 1 --log_every 1000
    --ckpt_keep 0 --ckpt_every 0 --max_steps 100000000 --batch_size 16 --d_model 128 --d_ff 256
    --diloco_replicas 4 --diloco_inner_steps 5 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9
    --diloco_quant int8 --diloco_min_replicas 2 --diloco_transport tcp --diloco_secret_file "$tmp/secret"
    --diloco_timeout_s $TIMEOUT --diloco_connect_timeout_s 20)
relay_new ca pd
relay_new cb pe
late_replica() {  # late_replica ID: replica ID of run "late" in the background (replicas 0 and 1 send slowly)
    TRAIN_GPT_FAULT=$([ "$1" -ge 2 ] || echo tcp_slow_state:0) "$TRAIN_GPT" "${late[@]}" \
        --diloco_rendezvous "127.0.0.1:$pd,127.0.0.1:$pe" --diloco_replica_id "$1" --out_dir "$tmp/late/$1" \
        >>"$tmp/late_$1.log" 2>&1 &
    pids+=($!)
    eval "pid_late_$1=$!"
}
late_replica 0
late_replica 1
wait_until "replicas 0 and 1 have 2 outer steps" eval '[ "$(outer_lines 0 late)" -ge 2 ] && [ "$(outer_lines 1 late)" -ge 2 ]'
late_replica 2
wait_until "replica 2 receives its state" grep -qs "receiving the group's state" "$tmp/late_2.log"
late_replica 3
wait_until "replicas 2 and 3 caught up and the relays close rounds of all four" \
    sh -c "grep -q 'closed: 4 contributor(s) \[0 1 2 3\]' '$tmp/relay_ca.log' &&
           grep -q 'closed: 4 contributor(s) \[0 1 2 3\]' '$tmp/relay_cb.log'"
joined=$(outer_lines 0 late)
wait_until "replica 0 has 3 more outer steps" eval '[ "$(outer_lines 0 late)" -ge $((joined + 3)) ]'
caught=$("$PYTHON" -c "
import json, sys
j = [json.loads(l) for l in open(sys.argv[1]) if '\"diloco_join\"' in l][-1]
print(j['caught_up_rounds'])" "$tmp/late/2/metrics.jsonl" 2>/dev/null || echo 0)
say "  catch-up through two hubs: replica 2 applied $caught mean(s) before it trained"
check "catch-up through two hubs: the first relay relayed replica 0's state and means to replica 2" \
    sh -c "grep -q 'replica 0 is the donor: it sends its state to \[2\] and then the means' '$tmp/relay_ca.log' &&
           grep -q 'replica 2 caught up: .* takes the means up to outer step' '$tmp/relay_ca.log'"
check "catch-up through two hubs: replica 2 follows the second relay once caught up, its first round held for it" \
    grep -q 'replica 2 follows: member at outer step .*(it caught up through its primary' "$tmp/relay_cb.log"
check "catch-up through two hubs: replica 3 joined replica 2's transfer in flight at the first relay, and follows the second" \
    sh -c "grep -q 'replica 3 joins the catch-up transfer from replica 0 in flight' '$tmp/relay_ca.log' &&
           [ \$(grep -c 'is the donor' '$tmp/relay_ca.log') -eq 1 ] &&
           grep -q 'replica 3 follows: member at outer step .*(it caught up through its primary' '$tmp/relay_cb.log'"
check "catch-up through two hubs: replica 2 applied the means of 3 or more outer steps closed meanwhile" \
    test "${caught:-0}" -ge 3
check "catch-up through two hubs: replica 2 joined once (not refused at the second relay, no rejoin)" \
    sh -c "[ \$(grep -c '\"event\":\"diloco_join\"' '$tmp/late/2/metrics.jsonl') -eq 1 ] &&
           ! grep -q 'rejoining' '$tmp/late_2.log'"
no_eviction_late() {  # nobody evicted, no transfer aborted at either relay; says which if so
    ! grep 'evicted\|aborted' "$tmp/relay_ca.log" "$tmp/relay_cb.log" | sed 's/^/    /' | grep .
}
check "catch-up through two hubs: nobody evicted, no transfer aborted" no_eviction_late
for r in 0 1 2 3; do eval "kill -TERM \$pid_late_$r"; done
wait_three late
wait "$pid_late_3" || rc=$?
check "catch-up through two hubs: the replicas stop cleanly on SIGTERM (rc $rc)" test "$rc" -eq 0
for r in 0 1; do
    check "catch-up through two hubs: replica $r's outer steps within timeout + 5 s while the state went" \
        every_round "$tmp/late/$r/metrics.jsonl"
done
check "catch-up through two hubs: param_hash equal on every replica at every outer step" \
    all_agree 8 "$tmp"/late/*/metrics.jsonl
finish test_diloco_hubs
