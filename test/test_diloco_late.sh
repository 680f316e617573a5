# Late work carried (docs/diloco.md#late-work-carried): 4 replicas through a relay,
# diloco_min_replicas 3, fp32 outer gradients. Replica 3 is SIGSTOPped in the middle of an
# inner phase (it stops itself at step 12, TRAIN_GPT_FAULT=stop_in_step:12, so that the stop
# never lands mid-exchange) and stays stopped past the round's cutoff (the hub drops it: no
# heartbeats); the other three close rounds without it; SIGCONT: it
# finds itself dropped, takes the group's state, and keeps the work the group never received
# in its local weights, weighted by its staleness. Checked:
#   - its join event says what it carried: from which outer step, weight 1/(1 + s) with s the
#     outer steps it missed, and the work's norm > 0 (nothing lost);
#   - numpy, from the dumped tensors: its local weights after = fp32(θ_K − w·(θ_k − x)) in
#     float64, within one fp32 rounding, and θ_K is the group's;
#   - it then contributes with all four, and the mean of that round is the hub's reduction of
#     the four byte for byte (test/diloco_check.py over every applied round), so the carried
#     work reaches θ;
#   - param_hash equal on every replica at every applied outer step;
#   - with diloco_carry_late = 0 the same scenario carries nothing (the event says why);
#   - with two fragments, a replica whose contribution to the round it missed was counted keeps
#     its work on the other fragment (carried per fragment, below).
#   - with streaming (τ 2), a replica back from a checkpoint with a fragment merge still due
#     applies that merge before it carries its work (numpy: not the whole θ_k − x again).
# Every move waits for a line a process wrote, never for a time or a step count.
. "$(dirname "$0")/lib.sh"
require_tcp
tmp_with_processes
diloco_test_files
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --ckpt_every 0 --batch_size 16
    --diloco_replicas 4 --diloco_inner_steps 5 --max_steps 100000000 --diloco_quant none --diloco_min_replicas 3
    --diloco_outer_lr 1 --diloco_outer_momentum 0)  # plain averaging, as the numpy check below expects
                                                    # (auto would take momentum for 2·10⁷ outer steps)

# applied_with FILE IDS [N]: more than N (default 0) applied outer steps of FILE had exactly
# contributors IDS ("0,1,2").
applied_with() { [ "$(applied_count "$1" "$2")" -gt "${3:-0}" ]; }
applied_count() { grep -s '"applied":true' "$1" | grep -c "\"contributors\":\[$2\]" || true; }
# joins FILE: how many times the replica took the group's state (diloco_join events).
joins() { grep -sc '"event":"diloco_join"' "$1" || true; }
# joined_after_stop FILE N: more than N joins (N: those before the stop; a replica that started
# late may have taken the state once already).
joined_after_stop() { [ "$(joins "$1")" -gt "$2" ]; }
# in_group FILE: the replica applied an outer step or took the group's state: its θ is the group's.
in_group() { grep -sq '"applied":true\|"event":"diloco_join"' "$1"; }
# all four in a round after the join: the join's outer step K, then a round with [0,1,2,3] past it.
four_after_join() {
    "$PYTHON" - "$1" "$2" <<'PY'
import json, sys
join = [json.loads(l) for l in open(sys.argv[2]) if '"diloco_join"' in l]
if not join:
    sys.exit(1)
k = join[-1]["outer_step"]
rounds = [json.loads(l) for l in open(sys.argv[1]) if '"contributors"' in l]
sys.exit(0 if any(r["applied"] and r["outer_step"] > k + 1 and r["contributors"] == [0, 1, 2, 3] for r in rounds) else 1)
PY
}

# scenario NAME ARGS...: the four replicas (ARGS for replica 3), the stop and the continue;
# ends with all four SIGTERMed once the late replica contributed again with the others.
scenario() {
    local name=$1 r
    shift
    # lib.sh's hub: listening before the replicas start, another port if this one was taken.
    local port
    start_relay "$name" 1
    local relay=${pids[-1]}
    local tcp=(--diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
        --diloco_timeout_s 3 --diloco_connect_timeout_s 20)
    mkdir -p "$tmp/dump_$name"
    local ids=()
    for r in 0 1 2 3; do
        local extra=()
        [ "$r" = 3 ] && extra=("$@")
        local fault=""
        [ "$r" = 3 ] && fault=stop_in_step:12
        TRAIN_GPT_FAULT=$fault TRAIN_GPT_DILOCO_DUMP="$tmp/dump_$name" "$TRAIN_GPT" "${common[@]}" "${tcp[@]}" \
            "${extra[@]}" --diloco_replica_id "$r" --out_dir "$tmp/$name/$r" >"$tmp/${name}_$r.log" 2>&1 &
        ids+=($!)
        pids+=($!)
    done
    if ! wait_until "replica 3 stopped itself" stopped "${ids[3]}"; then
        tail -n 5 "$tmp/${name}_3.log" "$tmp/relay_$name.log"
    fi
    # (It may have started after the others and taken their state first: either way its θ is
    # the group's of some outer step and it has trained since.)
    check "$name: replica 3 was in the group before it stopped" in_group "$tmp/$name/3/metrics.jsonl"
    local before without
    before=$(joins "$tmp/$name/3/metrics.jsonl")
    without=$(applied_count "$tmp/$name/0/metrics.jsonl" 0,1,2)   # rounds of three before it stopped
    wait_until "the others applied an outer step without replica 3" \
        applied_with "$tmp/$name/0/metrics.jsonl" 0,1,2 "$without"
    kill -CONT "${ids[3]}"
    wait_until "replica 3 took the group's state" joined_after_stop "$tmp/$name/3/metrics.jsonl" "$before"
    wait_until "replica 3 contributed again with the others" four_after_join "$tmp/$name/0/metrics.jsonl" \
        "$tmp/$name/3/metrics.jsonl"
    rc=0
    for r in 0 1 2 3; do kill -TERM "${ids[$r]}" 2>/dev/null || true; done
    for r in 0 1 2 3; do wait "${ids[$r]}" || rc=$?; done
    kill -TERM "$relay" 2>/dev/null || true
}

# The event's carry, as "from weight norm s" (s = K − from: outer steps missed, one fragment).
carried_of() {
    "$PYTHON" - "$1" <<'PY'
import json, sys
e = [json.loads(l) for l in open(sys.argv[1]) if '"diloco_join"' in l][-1]
c = e["carried"]
if not c:
    print("none", e.get("not_carried", ""))
else:
    print(c["from_outer_step"], repr(c["weight"]), c["work_norm"], e["outer_step"] - c["from_outer_step"])
PY
}

# numpy: the dumped carry (θ_k, x before, θ_K, x after; its weight, one fragment) is
# x_after = fp32(θ_K − w·(θ_k − x)).
carry_matches() {
    "$PYTHON" - "$tmp/dump_$1" "$2" <<'PY'
import glob, sys
import numpy as np
files = sorted(glob.glob(sys.argv[1] + "/carry_3_*_0.f32"))
if len(files) != 1:
    print(f"    carry dumps: {files}")
    sys.exit(1)
t = np.fromfile(files[0], dtype=np.float32).reshape(4, -1)
rec = np.fromfile(files[0][:-4] + ".bin", dtype=np.uint8).reshape(-1, 24)   # per fragment: f64 w, i64 offset, values
if len(rec) != 1:
    sys.exit(1)
w = float(rec[0, :8].view("<f8")[0])
theta_k, x, theta_K, after = (a.astype(np.float64) for a in t)
want = (theta_K - w * (theta_k - x)).astype(np.float32).astype(np.float64)
err = np.max(np.abs(after - want)) / max(np.max(np.abs(want)), 1e-30)
moved = np.max(np.abs(theta_k - x))
print(f"    carry: w {w}, max |θ_k − x| {moved:.3g}, relative error {err:.3g}")
sys.exit(0 if abs(w - float(sys.argv[2])) < 1e-15 and err <= 6e-8 and moved > 0 else 1)
PY
}

# ---------------------------------------------------------------- carried (the default)
scenario carry
check "carry: the four replicas exit 0 after SIGTERM (rc $rc)" test "$rc" -eq 0
read -r from weight norm missed <<<"$(carried_of "$tmp/carry/3/metrics.jsonl")"
say "    replica 3 carried the work of outer step $from: $missed outer step(s) missed, weight $weight, norm $norm"
check "carry: replica 3's join event carries its work (norm > 0) at weight 1/(1 + s), s = outer steps missed" \
    "$PYTHON" -c "import sys; s=int('$missed'); sys.exit(0 if s >= 1 and float('$norm') > 0 and float('$weight') == 1/(1+s) else 1)"
check "carry: local weights after = fp32(θ_K − w·(θ_k − x)) (numpy, one fp32 rounding)" \
    carry_matches carry "$weight"
check "carry: param_hash equal on the 4 replicas at every applied outer step" \
    all_hashes_agree 4 "$tmp"/carry/*/metrics.jsonl
check "carry: every applied round's mean is the hub's reduction byte for byte, the late replica's included (numpy)" \
    "$PYTHON" test/diloco_check.py "$tmp/dump_carry" 1 0 none
check "carry: the relay closed rounds without replica 3, then with it" \
    sh -c "grep -q 'closed: 3 contributor(s) \[0 1 2\]' '$tmp/relay_carry.log' && grep -q 'closed: 4 contributor(s) \[0 1 2 3\]' '$tmp/relay_carry.log'"

# ---------------------------------------------------------------- diloco_carry_late = 0
scenario drop --diloco_carry_late 0
read -r what why <<<"$(carried_of "$tmp/drop/3/metrics.jsonl")"
check "diloco_carry_late 0: nothing carried, and the event says why ($what $why)" \
    test "$what $why" = "none diloco_carry_late = 0"
check "diloco_carry_late 0: no carry dump" sh -c "! ls '$tmp/dump_drop'/carry_* >/dev/null 2>&1"
check "diloco_carry_late 0: param_hash equal at every applied outer step" all_hashes_agree 4 "$tmp"/drop/*/metrics.jsonl

# ---------------------------------------------------------------- carried per fragment
# Streaming (two fragments, τ 0: a round every 2 steps, fragments 0 and 1 in turn), three
# replicas, diloco_min_replicas 2. Replica 2 loses its session as the result of a round it was
# counted in comes (TRAIN_GPT_FAULT=tcp_lose_mean_after_full:2: the third round of all three):
# the hub has its whole contribution of that round's fragment p in θ, and it never applies the
# mean; it reconnects, rejoins and takes the state after the others closed a round without it.
# Its work on p is in θ already (not carried: θ_K there), its work on the other fragment q was
# never sent: carried at weight 1/(1 + s), s = the applied rounds of q it missed. Checked from
# its join event and, in numpy, from the dumped tensors (θ_K on p exactly, fp32(θ_K − w·(θ_k − x))
# on q, with work there); then all three contribute again and param_hash agrees at every applied
# outer step. On the old code the whole model took θ_K ("its contribution is in the group's θ"):
# its work on q was lost, and there was no carry dump.
start_relay frag 1
frag=(--diloco_replicas 3 --diloco_min_replicas 2 --diloco_inner_steps 4 --diloco_fragments 2 --diloco_overlap_steps 0
    --diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_timeout_s 3
    --diloco_connect_timeout_s 20)
mkdir -p "$tmp/dump_frag"
fpids=()
for r in 0 1 2; do
    fault=""
    [ "$r" = 2 ] && fault=tcp_lose_mean_after_full:2
    TRAIN_GPT_FAULT=$fault TRAIN_GPT_DILOCO_DUMP="$tmp/dump_frag" "$TRAIN_GPT" "${common[@]}" "${frag[@]}" \
        --diloco_replica_id "$r" --out_dir "$tmp/frag/$r" >"$tmp/frag_$r.log" 2>&1 &
    fpids+=($!)
    pids+=($!)
done
# three_after_join NAME: replica 2 of $tmp/NAME took the state, then all three contributed together.
three_after_join() {
    "$PYTHON" - "$tmp/$1/0/metrics.jsonl" "$tmp/$1/2/metrics.jsonl" <<'PY'
import json, os, sys
if not os.path.exists(sys.argv[2]):
    sys.exit(1)
join = [json.loads(l) for l in open(sys.argv[2]) if '"diloco_join"' in l]
rounds = [json.loads(l) for l in open(sys.argv[1]) if '"contributors"' in l]
sys.exit(0 if join and any(r["applied"] and r["outer_step"] > join[-1]["outer_step"] + 1
                           and r["contributors"] == [0, 1, 2] for r in rounds) else 1)
PY
}
# A state taken after the hook's line: a replica 2 that came after round 0 (a loaded machine;
# min_replicas 2 starts the group without it) took the state once already, and that join alone
# passed the wait (its diloco_join event is written before the note).
lost_then_three() {
    awk '/tcp_lose_mean_after_full: the session died/ { lost = 1 } /took the group.s state/ && lost { took = 1 }
         END { exit !took }' "$tmp/frag_2.log" && three_after_join frag
}
wait_until "replica 2 lost a round's result, rejoined, and all three contributed again" lost_then_three
rc=0
for p in "${fpids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${fpids[@]}"; do wait "$p" || rc=$?; done
check "carried per fragment: the three replicas exit 0 after SIGTERM (rc $rc)" test "$rc" -eq 0
check "carried per fragment: replica 2 lost its session as the result came in" \
    grep -q "tcp_lose_mean_after_full: the session died" "$tmp/frag_2.log"
# The join against replica 0's rounds: round `from` (outer step from + 1) held replica 2 and
# synced fragment p; q's weight is 1/(1 + its applied rounds from .. K − 1); p is in θ.
frag_carry() {
    "$PYTHON" - "$tmp/frag/0/metrics.jsonl" "$tmp/frag/2/metrics.jsonl" <<'PY'
import json, sys
rounds = {d["outer_step"] - 1: d for d in map(json.loads, open(sys.argv[1])) if "contributors" in d}
join = [json.loads(l) for l in open(sys.argv[2]) if '"diloco_join"' in l][-1]
c, K = join["carried"], join["outer_step"]
if not c:
    print(f"    join at outer step {K}: nothing carried ({join.get('not_carried')})")
    sys.exit(1)
k = c["from_outer_step"]
first = rounds[k]
p = first["fragment"]
q = 1 - p
s = sum(1 for r in range(k, K) if rounds[r]["applied"] and rounds[r]["fragment"] == q)
want = [0.0, 0.0]
want[q] = 1 / (1 + s)
print(f"    round {k} (fragment {p}) closed with {first['contributors']}; joined at outer step {K}; "
      f"fragment {q} missed {s} applied round(s); weights {c['fragment_weights']} (want {want}), in θ {c['in_theta']}")
ok = (first["applied"] and first["contributors"] == [0, 1, 2] and c["fragment_weights"] == want
      and c["in_theta"] == [p] and c["weight"] == want[q] and c["work_norm"] > 0)
sys.exit(0 if ok else 1)
PY
}
check "carried per fragment: the fragment of the round it was counted in takes θ, the other carries at 1/(1 + s)" frag_carry
# numpy: the dump's per-fragment weights (f64 w, i64 offset, i64 values each) and tensors.
frag_dump() {
    "$PYTHON" - "$tmp/dump_frag" <<'PY'
import glob, sys
import numpy as np
files = sorted(glob.glob(sys.argv[1] + "/carry_2_*_0.f32"))
if len(files) != 1:
    print(f"    carry dumps: {files}")
    sys.exit(1)
t = np.fromfile(files[0], dtype=np.float32).reshape(4, -1)
rec = np.fromfile(files[0][:-4] + ".bin", dtype=np.uint8).reshape(-1, 24)
theta_k, x, theta_K, after = (a.astype(np.float64) for a in t)
ok = len(rec) == 2
for p, r in enumerate(rec):
    w = float(r[:8].view("<f8")[0])
    o, n = (int(v) for v in r[8:].view("<i8"))
    sl = slice(o, o + n)
    want = (theta_K[sl] - w * (theta_k[sl] - x[sl])).astype(np.float32).astype(np.float64)
    err = np.max(np.abs(after[sl] - want)) / max(np.max(np.abs(want)), 1e-30)
    moved = np.max(np.abs(theta_k[sl] - x[sl]))
    print(f"    fragment {p}: values {o} .. {o + n}, w {w}, max |θ_k − x| {moved:.3g}, relative error {err:.3g}")
    if w == 0:
        ok = ok and np.array_equal(t[3][sl], t[2][sl])   # θ_K bit for bit
    else:
        ok = ok and err <= 6e-8 and moved > 0
ok = ok and sum(int(r[16:].view("<i8")[0]) for r in rec) == t.shape[1]
sys.exit(0 if ok else 1)
PY
}
check "carried per fragment: local weights after = θ_K on the fragment in θ, fp32(θ_K − w·(θ_k − x)) on the other (numpy)" \
    frag_dump
check "carried per fragment: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 4 "$tmp"/frag/*/metrics.jsonl

# start_three NAME AFTER FAULT ARGS...: replicas 0, 1 and 2 (common + ARGS) on this scenario's
# relay, in $tmp/NAME/R logging to $tmp/NAMER.log; replica 0 with TRAIN_GPT_FAULT=FAULT (may be
# empty); replica 2 started once replica 0 applied more than AFTER outer steps with [0,1], so
# that it joins late. Their pids in group_pids. (ARGS give diloco_min_replicas 2: 0 and 1 found
# the group together, neither takes a state from the other.)
start_three() {
    local name=$1 after=$2 fault=$3 r f
    shift 3
    group_pids=()
    for r in 0 1 2; do
        [ "$r" = 2 ] && wait_until "replica 0's outer step $((after + 1))" \
            applied_with "$tmp/$name/0/metrics.jsonl" 0,1 "$after"
        f=""
        [ "$r" = 0 ] && f=$fault
        TRAIN_GPT_FAULT=$f "$TRAIN_GPT" "${common[@]}" "$@" --diloco_replica_id "$r" --out_dir "$tmp/$name/$r" \
            >"$tmp/$name$r.log" 2>&1 &
        group_pids+=($!)
        pids+=($!)
    done
}

# state_bytes_are NAME B: replica 2 of $tmp/NAME took a state of 456 + B·N bytes (N parameters:
# the header, θ, and m when B is 8).
state_bytes_are() {
    "$PYTHON" - "$tmp/$1" "$2" <<'PY'
import json, sys
root, b = sys.argv[1], int(sys.argv[2])
end = [json.loads(l) for l in open(f"{root}/0/metrics.jsonl") if '"event":"end"' in l][-1]
n = round(end["state_mb"] * 2**20 / 16)          # state_mb: 16 B/param of weights, grads, moments
got = [json.loads(l) for l in open(f"{root}/2/metrics.jsonl") if '"diloco_join"' in l][-1]["state_bytes"]
print(f"    state: {got} bytes for {n} parameters (want 456 + {b}·{n} = {456 + b * n})")
sys.exit(0 if got == 456 + b * n else 1)
PY
}

# ---------------------------------------------------------------- a state slower than the deadline
# 3 replicas of a wider model, with outer momentum (so m is sent: 2.4 MB of state, 20 chunks
# of 128 KiB), diloco_timeout_s 2;
# replica 0, the donor, sends its state at one chunk per 0.5 s (TRAIN_GPT_FAULT=tcp_slow_state:0:
# about 10 s, longer than the deadline, never stalled). Replica 2 starts late and waits for the state:
# the hub holds the round for the transfer, so the donor is not evicted, replica 2 takes the
# state and all three contribute together, every param_hash equal. On the old relay the donor
# was evicted as late, the transfer dropped, and the next donor caught the same way. (A relay
# with --catch_up 0: the default's catch-up transfer does not hold the round, next scenario.)
start_relay slow 1 2 --catch_up 0   # the round waits for the transfer (the catch-up: below)
slow=(--d_model 128 --d_ff 256 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_replicas 3 --diloco_min_replicas 2 --diloco_transport tcp
    --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_timeout_s 2 --watchdog_s 3)
# three_through_join NAME LABEL AFTER FAULT ARGS...: start_three NAME AFTER FAULT ARGS, wait until
# all three contributed after replica 2's join, SIGTERM them; each must exit 0.
three_through_join() {
    local name=$1 label=$2 rc=0 p
    shift 2
    start_three "$name" "$@"
    wait_until "all three contribute after replica 2's join" three_after_join "$name"
    kill -TERM "${group_pids[@]}"
    for p in "${group_pids[@]}"; do wait "$p" || rc=$?; done
    check "$label: the three replicas exit 0 on SIGTERM (rc $rc)" test "$rc" = 0
}
three_through_join slow "slow state" 2 tcp_slow_state:0 "${slow[@]}"
took=$(sed -n 's/.*relayed from replica 0 to \[2\]: .* in \([0-9.]*\) s.*/\1/p' "$tmp/relay_slow.log" | head -n 1)
check "slow state: the state went from replica 0 to 2 in ${took:-?} s, longer than the 2 s deadline" \
    awk -v t="${took:-0}" 'BEGIN { exit !(t > 2) }'
check "slow state: nobody was evicted, no transfer aborted" \
    sh -c "! grep -q 'evicted\|aborted' '$tmp/relay_slow.log'"
# watchdog_s 3: the members' exchange and the donor's next one wait for the transfer (about
# 10 s) while the hub says it holds the round and the state's bytes move: progress, not a hang.
# Before, the watchdog ended replicas 0 and 1 (status 75) 3 s into that wait.
check "slow state: watchdog_s 3 and a 10 s wait for the transfer: no watchdog exit" \
    sh -c "! grep -q 'watchdog' '$tmp'/slow[012].log"
check "slow state: replica 2 took the group's state" grep -q '"event":"diloco_join"' "$tmp/slow/2/metrics.jsonl"
check "slow state: the joiner says how its state comes on (bytes, rate, time left)" \
    grep -q "replica 2 receives the group's state: .* of .* (.* %), .*/s, about .* left" "$tmp/slow2.log"
check "slow state: the donor says how its state goes out" \
    grep -q "replica 0 sends its state to the joiners: .* of .* (.* %)" "$tmp/slow0.log"
check "slow state: replica 1 says its exchange waits for the transfer" \
    grep -q "replica 1 waits for its exchange: the hub at .* holds the round for a state transfer" "$tmp/slow1.log"
check "slow state: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 1 "$tmp"/slow/*/metrics.jsonl
check "slow state: with outer momentum the state holds θ and m (456 + 8N bytes)" state_bytes_are slow 8

# ---------------------------------------------------------------- the same state, caught up
# The slow state again (about 10 s, many inner phases of 5 steps), through a relay with
# --catch_up 1 (the default): the rounds do not wait for it. Replicas 0 and 1 close round after round while it
# goes (the relay logs several closes of [0 1] between the donor's designation and replica 2's
# CAUGHT_UP), the donor sends the means of the rounds it lands after its state, and replica 2
# applies them: its join says how many, and its θ is the group's bit for bit — param_hash equal
# on the three at every outer step after it. Nobody is evicted, no transfer aborted. With the
# old relay (the scenario above) the group waited for the whole transfer. This relay runs with
# --join_in_flight 0 (the next scenario has the default): it tells the donor at its designation
# that no chunk will go again (STATE_AGAIN 0 before the donor begins to send), and no chunk does.
start_relay catchup 1 2 --join_in_flight 0   # --catch_up 1, the default
three_through_join catchup "catch-up" 2 tcp_slow_state:0 "${slow[@]/127.0.0.1:*/127.0.0.1:$port}"
closes_during=$(sed -n '/replica 0 is the donor/,/replica 2 caught up/p' "$tmp/relay_catchup.log" |
    grep -c 'closed: 2 contributor(s) \[0 1\]' || true)
read -r caught held < <("$PYTHON" -c "
import json, sys
j = [json.loads(l) for l in open(sys.argv[1]) if '\"diloco_join\"' in l][-1]
print(j['caught_up_rounds'], j['catchup_held_max'])" "$tmp/catchup/2/metrics.jsonl" 2>/dev/null || echo 0 0)
say "  catch-up: $closes_during round(s) closed by [0 1] while the state went; replica 2 applied $caught mean(s), at most $held held at once"
check "catch-up: the group closed 3 or more rounds while the state went (it did not wait)" \
    test "${closes_during:-0}" -ge 3
check "catch-up: the joiner applied the means of those rounds (caught_up_rounds >= 3)" test "${caught:-0}" -ge 3
check "catch-up: it applied each as it came: at most 3 held at once, fewer than it applied ($held of $caught)" \
    sh -c "[ '${held:-99}' -le 3 ] && [ '${held:-99}' -lt '${caught:-0}' ]"
check "catch-up: the relay logged the catch-up and its end" sh -c "
    grep -q 'replica 2 caught up: it has the state after round' '$tmp/relay_catchup.log' &&
    grep -q 'catch-up transfer from replica 0 over after' '$tmp/relay_catchup.log'"
check "catch-up: nobody was evicted, no transfer aborted" \
    sh -c "! grep -q 'evicted\|aborted' '$tmp/relay_catchup.log'"
check "catch-up: no watchdog exit" sh -c "! grep -q 'watchdog' '$tmp'/catchup[012].log"
check "catch-up: param_hash equal on the three at every applied outer step (the joiner's θ is the group's)" \
    all_hashes_agree 1 "$tmp"/catchup/*/metrics.jsonl
check "catch-up: the donor says its state goes while the group goes on" \
    grep -q "replica 0 sends its state to the joiners while the group goes on" "$tmp/catchup0.log"
check "catch-up, --join_in_flight 0: no chunk of the state sent again" \
    sh -c "! grep -q 'chunk(s) again\|chunk(s) of its state again' '$tmp/relay_catchup.log' '$tmp/catchup0.log'"

# The donor's sending thread scheduled late (TRAIN_GPT_FAULT=diloco_late_sender:0, 1 s): the
# transfer is under way before the donor's next exchange all the same. (It began only when the
# thread ran: the rounds the donor landed meanwhile were neither kept nor sent, the state went
# stamped with a later round than its header's, the hub dropped the donor — "sent the mean of
# round 9 for its catch-up transfer, expected round 7" — and the joiner looped.)
start_relay latesender 1 2
three_through_join latesender "late sender" 2 diloco_late_sender:0 "${slow[@]/127.0.0.1:*/127.0.0.1:$port}"
check "late sender: replica 2 joined once, nobody dropped or evicted" sh -c "
    [ \$(grep -c '\"event\":\"diloco_join\"' '$tmp/latesender/2/metrics.jsonl') -eq 1 ] &&
    ! grep -q 'dropped\|evicted' '$tmp/relay_latesender.log'"
check "late sender: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 1 "$tmp"/latesender/*/metrics.jsonl

# A fourth replica joins the catch-up transfer in flight (docs/protocol.md "Catch-up transfers"
# step 8): replica 3 starts once replica 2 receives its state (a wider model here: about 40
# slow chunks, 20 s), joins the transfer where it is, gets the rest of the first pass and the
# means with replica 2, then the chunks it missed, which replica 0 sends again (STATE_AGAIN).
# One designation for both: before, replica 3 waited for this transfer to end and the next
# close to begin another. Checked: the relay's lines for the join in flight and the chunks
# sent again, one donor designation in the whole run, the donor's line, nobody evicted or
# aborted, all four contribute together, param_hash equal on the four at every outer step.
start_relay inflight 1 2
inflight=("${slow[@]/127.0.0.1:*/127.0.0.1:$port}" --diloco_replicas 4 --d_model 192 --d_ff 512)
start_three inflight 2 tcp_slow_state:0 "${inflight[@]}"
wait_until "replica 2 receives its state" grep -qs "receiving the group's state from replica 0" "$tmp/inflight2.log"
"$TRAIN_GPT" "${common[@]}" "${inflight[@]}" --diloco_replica_id 3 --out_dir "$tmp/inflight/3" \
    >"$tmp/inflight3.log" 2>&1 &
group_pids+=($!)
pids+=($!)
wait_until "all four contribute after replica 3's join" \
    eval 'four_after_join "$tmp/inflight/0/metrics.jsonl" "$tmp/inflight/3/metrics.jsonl" 2>/dev/null'
kill -TERM "${group_pids[@]}"
rc=0
for p in "${group_pids[@]}"; do wait "$p" || rc=$?; done
check "in flight: the four replicas exit 0 on SIGTERM (rc $rc)" test "$rc" = 0
check "in flight: replica 3 joined the transfer from replica 0 in flight" \
    grep -q "replica 3 joins the catch-up transfer from replica 0 in flight" "$tmp/relay_inflight.log"
check "in flight: the first pass whole, replica 0 sends the chunks replica 3 missed again" sh -c "
    grep -q 'first pass from replica 0 is whole: it sends its first [0-9]* chunk(s) again' '$tmp/relay_inflight.log' &&
    grep -q 'replica 0 sends the first [0-9]* chunk(s) of its state again' '$tmp/inflight0.log'"
check "in flight: one donor designation for both joiners" \
    test "$(grep -c 'is the donor' "$tmp/relay_inflight.log")" -eq 1
check "in flight: replicas 2 and 3 caught up" sh -c "
    grep -q 'replica 2 caught up: it has the state after round' '$tmp/relay_inflight.log' &&
    grep -q 'replica 3 caught up: it has the state after round' '$tmp/relay_inflight.log'"
check "in flight: nobody was evicted, no transfer aborted, nobody dropped" \
    sh -c "! grep -q 'evicted\|aborted\|dropped' '$tmp/relay_inflight.log'"
check "in flight: param_hash equal on the four at every applied outer step" \
    all_hashes_agree 1 "$tmp"/inflight/*/metrics.jsonl

# A catch-up donor stopped mid-transfer: it stops sending and exits 0; the hub aborts the
# transfer; replica 2 waits again and takes the state of the next close from replica 1.
start_relay stopcatchup 1 2
start_three stopcatchup 1 tcp_slow_state:0 "${slow[@]/127.0.0.1:*/127.0.0.1:$port}"
wait_until "replica 0 sends its state to replica 2" grep -q "replica 0 is the donor: it sends its state to \[2\]" \
    "$tmp/relay_stopcatchup.log"
kill -TERM "${group_pids[0]}"
rc=0
wait "${group_pids[0]}" || rc=$?
check "stopped catch-up donor: exits 0 on SIGTERM mid-transfer (rc $rc)" test "$rc" = 0
wait_until "the hub ends the transfer" grep -q "state transfer from replica 0 aborted" "$tmp/relay_stopcatchup.log"
wait_until "replica 2 takes the state from replica 1" grep -q '"event":"diloco_join"' "$tmp/stopcatchup/2/metrics.jsonl"
wait_until "replicas 1 and 2 contribute together" applied_with "$tmp/stopcatchup/1/metrics.jsonl" 1,2
kill -TERM "${group_pids[1]}" "${group_pids[2]}"
rc=0
for p in "${group_pids[1]}" "${group_pids[2]}"; do wait "$p" || rc=$?; done
check "stopped catch-up donor: replicas 1 and 2 go on together and exit 0 (rc $rc)" test "$rc" = 0
check "stopped catch-up donor: replica 1 was the second donor" \
    grep -q "replica 1 is the donor: it sends its state to \[2\]" "$tmp/relay_stopcatchup.log"
check "stopped catch-up donor: param_hash equal on replicas 1 and 2 at every applied outer step" \
    all_hashes_agree 1 "$tmp"/stopcatchup/[12]/metrics.jsonl

# A joiner stopped while its catch-up means come: they go slower than the rounds close
# (TRAIN_GPT_FAULT=tcp_slow_means, so it never catches up); SIGTERM to replica 2 once its state
# is whole and the hub has told it up to which round to take the means. It stops as any joiner
# stopped in its join: status 0, nothing trained, no state taken — it must not adopt a state
# with some of its means applied (taking the state as soon as it was whole, the joiner failed
# there with status 1: it had applied fewer means than the hub's round asked). The group goes on
# and exits 0.
start_relay meansstop 1 2
start_three meansstop 1 tcp_slow_state:0,tcp_slow_means:0 "${slow[@]/127.0.0.1:*/127.0.0.1:$port}"
wait_until "replica 2 holds its state and waits for the means" \
    grep -q "replica 2 caught up: it has the state after round" "$tmp/relay_meansstop.log"
kill -TERM "${group_pids[2]}"
rc=0
wait "${group_pids[2]}" || rc=$?
check "joiner stopped while its means come: status 0 (got $rc)" test "$rc" = 0
check "joiner stopped while its means come: it says it stopped without training, and took no state" sh -c "
    grep -q 'stopped by signal 15 at step 0 while waiting to join the group: nothing trained' '$tmp/meansstop2.log' &&
    ! grep -q '\"diloco_join\"' '$tmp/meansstop/2/metrics.jsonl'"
kill -TERM "${group_pids[0]}" "${group_pids[1]}"
rc=0
for p in "${group_pids[0]}" "${group_pids[1]}"; do wait "$p" || rc=$?; done
check "joiner stopped while its means come: replicas 0 and 1 exit 0 (rc $rc)" test "$rc" = 0

# ---------------------------------------------------------------- a donor stopped while it sends
# The slow state again (about 10 s); the donor gets SIGTERM while its state goes. It does not
# wait for the transfer: it stops sending, exits 0, and the hub ends the transfer before the
# state was whole (the donor left, or — stopped while it waited for its sender at its boundary,
# it still takes part in that exchange — sent nothing for a timeout). A donor that waited would
# have the relay log the state as relayed.
start_relay stopdonor 1 2 --catch_up 0
start_three stopdonor 1 tcp_slow_state:0 "${slow[@]/127.0.0.1:*/127.0.0.1:$port}"   # slow's, on this relay
wait_until "replica 0 sends its state to replica 2" grep -q "replica 0 is the donor: it sends its state to \[2\]" \
    "$tmp/relay_stopdonor.log"
kill -TERM "${group_pids[0]}"
rc=0
wait "${group_pids[0]}" || rc=$?
check "stopped donor: exits 0 on SIGTERM mid-transfer (rc $rc)" test "$rc" = 0
check "stopped donor: it stops sending instead of waiting for the transfer" \
    grep -q "replica 0 stops sending its state: it stops or leaves" "$tmp/stopdonor0.log"
wait_until "the hub ends the transfer" grep -q "state transfer from replica 0 aborted" "$tmp/relay_stopdonor.log"
check "stopped donor: the hub ended the transfer before the state was whole" \
    sh -c "! grep -q 'relayed from replica 0' '$tmp/relay_stopdonor.log'"
kill -TERM "${group_pids[1]}" "${group_pids[2]}"
for p in "${group_pids[1]}" "${group_pids[2]}"; do wait "$p" || true; done

# ---------------------------------------------------------------- what a state transfer costs in memory
# 3 replicas of a 4.7M-parameter model (its state θ ‖ m: 8 B/param, 36 MiB). Replica 2 starts
# late and takes the state. The donor sends θ and m from where they live (the state's header is
# written in front of them), by the relay's default catch-up transfer: it copies each chunk as it
# queues it, and keeps aside what a landing changes of the part not yet sent — at most the state
# itself (456 + 4N here). Its peak RSS stays within the state's size + 8 MiB of the member's that
# gave nothing. On the old code it packed θ and m into an 8 B/param copy first, resident for the
# rest of the run: its peak was 8N above the member's. The run has no outer momentum (μ 0, as
# `common` sets): m is kept at zero and left out of the state, which is 456 + 4N bytes (it was
# 8N: m held the last Δ).
start_relay mem 1 20   # no eviction under load: a rejoin would touch a state buffer mid-run
mem=(--d_model 512 --d_ff 1024 --n_head 8 --n_kv_head 4 --batch_size 2 --diloco_replicas 3 --diloco_min_replicas 2
    --diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
    --diloco_timeout_s 20)
start_three mem 1 "" "${mem[@]}"
# Until all three contributed to a round after the join: every buffer of an exchange touched on each.
wait_until "all three contribute after replica 2's join" three_after_join mem
# The relay's default, a catch-up transfer (a whole one: "state ... relayed from replica D to [2]").
wait_until "the relay names the donor" grep -q 'catch-up transfer from replica [01] over\|relayed from replica [01] to \[2\]' \
    "$tmp/relay_mem.log"
kill -TERM "${group_pids[@]}"
rc=0
for p in "${group_pids[@]}"; do wait "$p" || rc=$?; done
check "state memory: the three replicas exit 0 on SIGTERM (rc $rc)" test "$rc" = 0
donor=$(sed -n 's/.*\(catch-up transfer\|relayed\) from replica \([01]\) .*/\2/p' "$tmp/relay_mem.log" | head -n 1)
state_memory() {
    "$PYTHON" - "$tmp/mem" "$donor" <<'PY'
import json, sys
root, donor = sys.argv[1], int(sys.argv[2])
def end(r):
    return [json.loads(l) for l in open(f"{root}/{r}/metrics.jsonl") if '"event":"end"' in l][-1]
state = end(0)["state_mb"] / 2                  # θ ‖ m, 8 B/param, in MiB (state_mb counts 16 B/param)
sent = state / 2                                 # μ 0: θ alone, 4 B/param
peak = {r: end(r)["peak_rss_mb"] for r in (0, 1, 2)}
member = 1 - donor
print(f"    peak RSS (MiB): donor {peak[donor]}, member {peak[member]}, joiner {peak[2]}; a state is {state:.1f}, "
      f"the one sent {sent:.1f}")
sys.exit(0 if peak[donor] - peak[member] < sent + 8 else 1)
PY
}
check "state memory: the donor's peak RSS stays within the state sent + 8 MiB of the member's (no resident copy)" \
    state_memory
check "state memory: μ 0: the state leaves m out (456 + 4N bytes)" state_bytes_are mem 4
check "state memory: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 1 "$tmp"/mem/*/metrics.jsonl

# ---------------------------------------------------------------- the donor trains while it sends
# 3 replicas, H = 100; replica 0, the donor, sends its state at one 128 KiB chunk per 0.5 s
# (tcp_slow_state) from a thread while it trains on, and stamps the step it reached as the last
# chunk goes (the chunk with the state's header goes last). Replica 2, the joiner, skips the
# steps its donor took meanwhile: its phase ends with the group's instead of a transfer later,
# and its first contribution counts only the steps it trained (H − skipped: tokens weigh it).
# On the old code the donor sent before it trained on: nothing to skip, the round waited.
# How many steps the donor takes in the transfer (about 1-1.5 s: 3 chunks) is the machine's
# speed: 17-30 here, more than H on a machine 3.5x as fast. The relay runs --catch_up 0, so
# that either way the joiner skips: a transfer longer than the phase holds the round (the donor
# waits for its thread at its exchange) and the joiner skips H − 1 steps and trains the one that
# ends its phase (docs/protocol.md, joins and state transfer). With the default catch-up such a
# transfer went on past the round, the joiner caught up instead and skipped nothing, and the
# check failed (shown with H = 10: skipped 0 with the catch-up, 9 and 1 step trained without).
live_h=100
start_relay live 1 3 --catch_up 0
live=(--batch_size 64 --diloco_inner_steps "$live_h" --diloco_replicas 3 --diloco_min_replicas 2 --diloco_transport tcp
    --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_timeout_s 2)
three_through_join live "donor trains on" 0 tcp_slow_state:0 "${live[@]}"
check "donor trains on: the donor says it sends while it trains" \
    grep -q "replica 0 sends its state (.*) to the joining replica(s) while it trains on" "$tmp/live0.log"
skipped_fewer() {
    "$PYTHON" - "$tmp/live/2/metrics.jsonl" "$live_h" <<'PY'
import json, sys
h = int(sys.argv[2])
lines = [json.loads(l) for l in open(sys.argv[1])]
join = [l for l in lines if l.get("event") == "diloco_join"][-1]
after = [l for l in lines if "contributors" in l and l["outer_step"] > join["outer_step"]]
first = after[0]
print(f"    joined at outer step {join['outer_step']} (step {join['step']}), skipped {join['skipped_steps']} step(s); "
      f"first contribution: {first['inner_steps']} inner steps, {first['tokens']} tokens")
sys.exit(0 if 0 < join["skipped_steps"] < h and first["inner_steps"] == h - join["skipped_steps"]
         and first["tokens"] == first["inner_steps"] * 64 * 32 else 1)
PY
}
check "donor trains on: the joiner skipped the steps its donor took, and contributed H − skipped steps" skipped_fewer
check "donor trains on: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 2 "$tmp"/live/*/metrics.jsonl

# ---------------------------------------------------------------- phases on wall time
# 3 replicas with diloco_sync_every_s 12 (H = 5, then extra inner steps until 12 s have passed
# since the phase began), a wider model whose state (456 + 4N bytes, 10 chunks of 128 KiB) takes
# about 5 s at tcp_slow_state's one chunk per 0.5 s. The donor stamps how far into its phase it
# was as the last chunk went, and the joiner's phase begins that long before its join: the
# round after the join closes with all three at once, the members waiting less than half the
# transfer (wait_s). On the old code the joiner's phase lasted 12 s from its join, and the
# members waited about a transfer for its contribution. spike_z 0: a step the spike guard skips
# ends a replica's extra steps, and so its phase, early (docs/diloco.md): that replica would wait.
start_relay timed 1 3 --catch_up 0   # the transfer's length from the relay's log; a catch-up's state is the same
timed=(--d_model 128 --d_ff 256 --diloco_sync_every_s 12 --diloco_replicas 3 --diloco_min_replicas 2
    --diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
    --diloco_timeout_s 2 --spike_z 0)
three_through_join timed "phases on wall time" 0 tcp_slow_state:0 "${timed[@]}"
timed_waits() {
    "$PYTHON" - "$tmp/timed" "$tmp/relay_timed.log" <<'PY'
import json, re, sys
root, relay = sys.argv[1], sys.argv[2]
took = [float(m) for m in re.findall(r"relayed from replica \d+ to \[2\]: .* in ([0-9.]+) s", open(relay).read())]
join = [json.loads(l) for l in open(f"{root}/2/metrics.jsonl") if '"diloco_join"' in l][-1]
outer = {r: {l["outer_step"]: l for l in map(json.loads, open(f"{root}/{r}/metrics.jsonl")) if "contributors" in l}
         for r in (0, 1, 2)}
# The first outer step after the join that all three contributed to, on every replica.
k = min(s for s, l in outer[0].items() if s > join["outer_step"] and l["applied"] and l["contributors"] == [0, 1, 2])
waits = [outer[r][k]["wait_s"] for r in (0, 1, 2)]
t = took[-1] if took else 0.0
print(f"    transfer {t:.1f} s; the donor was {join['donor_phase_s']:.1f} s into its phase as it ended; wait at outer "
      f"step {k} (the first of the three): {waits[0]:.2f} s, {waits[1]:.2f} s, joiner {waits[2]:.2f} s")
ok = t > 3 and join["donor_phase_s"] > 0.5 * t and max(waits[:2]) < 0.5 * t
if not ok:  # what happened, for the log
    for r in (0, 1, 2):
        print(f"    replica {r}: " + "; ".join(f"{s}: wait {l['wait_s']} sync {l['sync_s']} inner {l['inner_steps']}"
                                               for s, l in sorted(outer[r].items())))
    print("    relay: " + " | ".join(l.strip() for l in open(relay) if "round" in l or "state" in l))
sys.exit(0 if ok else 1)
PY
}
check "phases on wall time: the joiner's phase began with its donor's; the next round waited under half the transfer for it" \
    timed_waits
check "phases on wall time: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 2 "$tmp"/timed/*/metrics.jsonl

# stopped_in_join NAME WAIT_FOR ARGS...: a replica (tiny_test, replica 0 of 2, tcp) started with
# ARGS, logging to $tmp/NAME.log; once its log says WAIT_FOR, SIGTERM; it must exit 0 within
# 60 s and say it stopped without training.
stopped_in_join() {
    local name=$1 wait_for=$2
    shift 2
    "$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_every 0 --threads 1 --max_steps 20 \
        --diloco_replicas 2 --diloco_replica_id 0 --diloco_transport tcp --diloco_secret_file "$tmp/secret" \
        --diloco_timeout_s 3 --out_dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 &
    q=$!
    pids+=("$q")
    waiting_or_gone() { grep -q "$wait_for" "$tmp/$name.log" || ! kill -0 "$q" 2>/dev/null; }
    wait_until "$name: the replica waiting ($wait_for)" waiting_or_gone
    kill -TERM "$q"
    gone() { ! kill -0 "$q" 2>/dev/null || [ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$q/stat" 2>/dev/null)" = Z ]; }
    WAIT_LIMIT_S=60 wait_until "$name: the replica's exit after SIGTERM" gone || kill -9 "$q"
    local rc=0
    wait "$q" || rc=$?
    check "$name: SIGTERM while it waits: status 0 (got $rc)" test "$rc" = 0
    check "$name: ... and the replica says it stopped without training" \
        grep -q "stopped by signal 15 at step 0 while waiting to join the group: nothing trained" "$tmp/$name.log"
}

# A stop signal while the hub holds a join (here a quorum of 2 that never comes): the replica
# stops at once with status 0 and says so, the checkpoint it started from unchanged (it used to
# wait in its join until SIGKILL).
start_relay quorum 1
stopped_in_join quorum "to answer its join" --diloco_min_replicas 2 --diloco_rendezvous "127.0.0.1:$port"
# The same while the hub cannot be reached at all (nothing listens; diloco_connect_timeout_s
# 300): the replica stops within moments of the signal instead of retrying for 300 s (and then
# failing) — with one hub, and with two (diloco_rendezvous a,b). Both fail on the old code:
# the signal waited out the retries.
stopped_in_join nohub1 "waiting for the hub" --diloco_connect_timeout_s 300 \
    --diloco_rendezvous "127.0.0.1:$(free_port)"
p1=$(free_port)
p2=$(free_port)
[ "$p2" = "$p1" ] && p2=$((p1 + 1))   # two closed ports, not one listed twice
stopped_in_join nohub2 "waiting for the hub" --diloco_connect_timeout_s 300 --diloco_rendezvous "127.0.0.1:$p1,127.0.0.1:$p2"

# ---------------------------------------------------------------- carried, but no work on a fragment
# 3 replicas of 3 layers, P 3, H 6, τ 0, max_steps 24. Replica 2 founds the group and stops at
# step 12, right after fragment 2's sync (its checkpoint's fragment 2 is θ bit for bit: no work
# there); replicas 0 and 1 stop themselves in step 24 (stop_in_step:23); replica 2 comes back from
# its step-12 checkpoint, takes the state at max_steps and carries its unsent work into fragments
# 1 and 2 — on fragment 2 that work is zero. Its final sync of fragment 2 (round 13) must go with
# tokens 0, "no work from [2]", not as a contributor weighted one inner step (which shrank that
# fragment's final mean by 128/1664 here), while its final sync of fragment 1 (round 12) carries
# real work at one inner step's tokens.
nowork=(test/configs/tiny_test.conf --n_layer 3 --train_data "$tmp/train.bin" --val_every 0 --threads 1
    --log_every 1000 --ckpt_keep 0 --ckpt_every 0 --diloco_replicas 3 --diloco_inner_steps 6 --diloco_transport tcp
    --diloco_secret_file "$tmp/secret" --diloco_timeout_s 60 --diloco_connect_timeout_s 30 --max_steps 24
    --diloco_min_replicas 2 --diloco_fragments 3 --diloco_overlap_steps 0 --diloco_outer_lr 0.7
    --diloco_outer_momentum 0.9 --diloco_plain_in_decay 0 --diloco_decay_inner_steps 0)
start_relay nowork 1 60 --catch_up 0
# relay_replica NAME ID [FAULT] [--key value]...: replica ID with the options of array NAME,
# through the last relay started, in $tmp/NAME/ID, its output appended to $tmp/NAMEID.log; its
# pid in $rpid.
relay_replica() {
    local -n options=$1
    local name=$1 id=$2 fault=${3:-}
    shift 3
    TRAIN_GPT_FAULT=$fault "$TRAIN_GPT" "${options[@]}" --diloco_rendezvous "127.0.0.1:$port" --diloco_replica_id "$id" \
        --out_dir "$tmp/$name/$id" "$@" >>"$tmp/$name$id.log" 2>&1 &
    rpid=$!
    pids+=($!)
}
both_stopped() { stopped "$1" && stopped "$2"; }
# founder_then_two NAME STOP HOLD: replica 2 founds the group of relay NAME (relay_replica NAME)
# and stops at step STOP; replicas 0 and 1 join as members and stop themselves in step HOLD + 1.
# Replica 2 holds itself in its step 2
# until both are members: round 0 waits for it, so neither can come after a round closed (on a
# loaded machine one did, and joined late). Pids in first, held0, held1.
founder_then_two() {
    local name=$1 stop=$2 hold=$3
    relay_replica "$name" 2 stop_in_step:1 --stop_at_step "$stop"
    first=$rpid
    wait_until "replica 2 founds the group" grep -q 'replica 2 joined: founds the group' "$tmp/relay_$name.log"
    relay_replica "$name" 0 "stop_in_step:$hold"
    held0=$rpid
    relay_replica "$name" 1 "stop_in_step:$hold"
    held1=$rpid
    wait_until "replicas 0 and 1 are members, replica 2 held in its step 2" two_members_held "$name" ||
        die "$name: replicas 0 and 1 did not both join before the first round"
    kill -CONT "$first"
}
# back_and_finish NAME OUTER: replica 2 comes back (relay_replica NAME 2), the relay's log says it
# joined at outer step OUTER (a grep pattern) and waits for the group, then replicas 0 and 1 go
# on; the worst exit status of the three in rc.
back_and_finish() {
    relay_replica "$1" 2 ""
    local late=$rpid p
    wait_until "replica 2 waits for the group" \
        grep -q "replica 2 joined at outer step $2 .*: waits for the group" "$tmp/relay_$1.log"
    kill -CONT "$held0" "$held1"
    rc=0
    for p in "$held0" "$held1" "$late"; do wait "$p" || rc=$?; done
}
two_members_held() {
    grep -q 'replica 0 joined: member at outer step 0' "$tmp/relay_$1.log" &&
        grep -q 'replica 1 joined: member at outer step 0' "$tmp/relay_$1.log" && stopped "$first"
}
founder_then_two nowork 12 23
rc=0
wait "$first" || rc=$?
check "no work: replica 2 stops at step 12 (rc $rc)" test "$rc" = 0
wait_until "replicas 0 and 1 stop in step 24" both_stopped "$held0" "$held1"
back_and_finish nowork '[0-9]*'
check "no work: the three exit 0 (rc $rc)" test "$rc" = 0
check "no work: replica 2's final sync of fragment 1 carries its work, weighted one inner step" \
    grep -q 'round 12 closed: 3 contributor(s) \[0 1 2\], weighted by tokens \[256 256 128\]' "$tmp/relay_nowork.log"
check "no work: its final sync of fragment 2 goes with no work (it carried none there)" \
    grep -q 'round 13 closed: 2 contributor(s) \[0 1\], no work from \[2\]' "$tmp/relay_nowork.log"

# ---------------------------------------------------------------- carried with a merge still due
# 3 replicas, P 2, H 6, τ 2, max_steps 24: fragment 0 syncs after steps 3, 9, 15, 21, fragment 1
# after 6, 12, 18, each lands 2 steps later and merges into the local weights there (α 0.5).
# Replica 2 stops at step 10 (stop_at_step): its checkpoint lands round 2 (fragment 0, begun
# after step 9) early, and the merge stays due at step 11 (state.json's outer_merge_step).
# Replicas 0 and 1 go on (round 3, fragment 1, without it) and hold themselves in step 15;
# replica 2 comes back from its checkpoint, waits for the group, and takes the state at round
# 4's close (fragment 0): outer step 5, one applied round of each fragment missed, w = 1/2 on
# both. The merge still due is applied first, then the work carried: on fragment 0
# x ← θ_K − w·(θ_k − (α·x + (1 − α)·θ_k)), as if it had merged at step 11 and been dropped then,
# on fragment 1 x ← θ_K − w·(θ_k − x) (numpy, from the dumped tensors). The join used to drop the
# merge and carry θ_k − x whole on fragment 0: the (1 − α) share the merge takes out — its own
# round-2 work, in θ_k already through that round's mean, less the group's outer step — counted
# again in its next contribution.
merge=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_every 0 --threads 1 --log_every 1000
    --ckpt_keep 0 --ckpt_every 0 --diloco_replicas 3 --diloco_inner_steps 6 --diloco_transport tcp
    --diloco_secret_file "$tmp/secret" --diloco_timeout_s 60 --diloco_connect_timeout_s 30 --max_steps 24
    --diloco_min_replicas 2 --diloco_fragments 2 --diloco_overlap_steps 2 --diloco_merge_alpha 0.5
    --diloco_quant none --diloco_outer_lr 1 --diloco_outer_momentum 0)
start_relay merge 1 60 --catch_up 0
founder_then_two merge 10 14
rc=0
wait "$first" || rc=$?
check "merge due: replica 2 stops at step 10 with the merge of fragment 0 due at step 11 (rc $rc)" sh -c "[ $rc = 0 ] &&
    grep -q '\"outer_merge_step\": 11,' '$tmp/merge/2/step_00000010/state.json' &&
    grep -q '\"outer_merge_fragment\": 0,' '$tmp/merge/2/step_00000010/state.json'"
wait_until "replicas 0 and 1 hold themselves in step 15" both_stopped "$held0" "$held1"
mkdir -p "$tmp/dump_merge"
TRAIN_GPT_DILOCO_DUMP="$tmp/dump_merge" back_and_finish merge 3
check "merge due: the three exit 0 (rc $rc)" test "$rc" = 0
merge_carried() {
    "$PYTHON" - "$tmp/dump_merge" "$tmp/merge/2/metrics.jsonl" <<'PY'
import glob, json, sys
import numpy as np
join = [json.loads(l) for l in open(sys.argv[2]) if '"diloco_join"' in l]
files = glob.glob(sys.argv[1] + "/carry_2_*_0.f32")
if len(join) != 1 or len(files) != 1 or not join[0]["carried"]:
    print(f"    joins {join}, carry dumps {files}")
    sys.exit(1)
c = join[0]["carried"]
t = np.fromfile(files[0], dtype=np.float32).reshape(4, -1).astype(np.float64)
rec = np.fromfile(files[0][:-4] + ".bin", dtype=np.uint8).reshape(-1, 24)
theta_k, x, theta_K, after = t
alpha, ok = 0.5, True
for p, r in enumerate(rec):
    w = float(r[:8].view("<f8")[0])
    o, n = (int(v) for v in r[8:].view("<i8"))
    sl = slice(o, o + n)
    base = x[sl]
    if p == 0:   # the merge still due: x ← fp32(α·x + (1 − α)·θ_k), then carried
        base = (alpha * x[sl] + (1 - alpha) * theta_k[sl]).astype(np.float32).astype(np.float64)
    want = (theta_K[sl] - w * (theta_k[sl] - base)).astype(np.float32).astype(np.float64)
    err = np.max(np.abs(after[sl] - want)) / max(np.max(np.abs(want)), 1e-30)
    moved = np.max(np.abs(theta_k[sl] - x[sl]))
    print(f"    fragment {p}: w {w}, max |θ_k − x| {moved:.3g}, relative error {err:.3g}")
    ok = ok and w == 0.5 and moved > 0 and err <= 6e-8
print(f"    join: outer step {join[0]['outer_step']}, from {c['from_outer_step']}, weights {c['fragment_weights']}")
sys.exit(0 if ok and join[0]["outer_step"] == 5 and c["from_outer_step"] == 3 and len(rec) == 2 else 1)
PY
}
check "merge due: replica 2's join applies the merge still due on fragment 0, then carries its work at w = 1/2 (numpy)" \
    merge_carried
check "merge due: param_hash equal on the three at every applied outer step" \
    all_hashes_agree 4 "$tmp"/merge/*/metrics.jsonl
finish test_diloco_late
