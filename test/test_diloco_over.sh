#!/usr/bin/env bash
# The run is over (docs/diloco.md#membership-and-faults-tcp): a replica that comes back to the
# relay after the other replicas finished the run and left is told so (JOINED(finished)) and
# stops with exit 0, instead of founding a group alone — where, with diloco_min_replicas 2, it
# waited forever for a quorum that could not come, and with 1 trained on alone.
#   1. Two replicas, min_replicas 2, H 5, 40 steps: replica 1 stops at step 10 (stop_at_step:
#      checkpoint, goodbye "stopped"); replica 0 trains on alone (its rounds skipped) and leaves
#      at step 40 having finished. Replica 1 restarted from its checkpoint: exits 0, says the
#      run is over, logs the stop event "run_over", trains no step, leaves its checkpoint
#      directory unchanged; the relay logs whom it told and who finished. Without the fix the
#      restarted replica never exits (the wait below gives up and the check fails). A fresh
#      replica of the same configuration (no checkpoint: a rerun) is refused with one line.
#   2. A replica of another run on the same relay (another seed: another fingerprint) is not
#      told so: the relay forgets the finished run and the replica trains to its end.
#   3. At a rejoin: min_replicas 2 (the hub holds the group until both are in: with 1, replica 0
#      could train all 20 short steps and leave before replica 1 connected), H 5, 20 steps;
#      replica 1 is late for the last exchange (diloco_late) and evicted; replica 0 closes the
#      round alone (skipped: one contributor), finishes and leaves. Replica
#      1's rejoin finds the run over (at once, or when replica 0 leaves while it waits for a
#      state): it stops after step 20 with the stop event "run_over" and a checkpoint, exit 0.
#      Both final checkpoints hold θ, the same weights (the final outer step did not apply on
#      either), and replica 0 says what of its work that dropped; the same with two fragments,
#      and with the hub unreachable at the final sync (its exchange failed on both).
#   4. Sharded replicas (MPI; skipped without): 2 shards x 2 copies each (relay --shards 2),
#      part 1's story: every rank of the returning replica stops (its shards' groups both say
#      the run is over; its second copy follows the first), exit 0, checkpoint unchanged; and
#      part 3's with two fragments: both final checkpoints hold θ, the same weights.
#   5. Replicas dropped from the final syncs (two fragments): no round past the final syncs,
#      and every replica that finished holds the same θ and weights.
#   6. A replica that joins during the final syncs (two fragments: it takes the state after the
#      first) trains no step, takes part in the second and writes a checkpoint at max_steps
#      with the finishers' weights, exit 0: a. fresh, whole transfer: with no work (tokens 0,
#      named apart by the relay), the finishers' weights those of the same run without it
#      (with one inner step's tokens for its Δ = 0 they differ) and every mean numpy's;
#      b. fresh, catch-up transfer; c. back from an old checkpoint, with its carried work.
#      Until 2026-12 it stopped with "nothing to do" and no checkpoint (a fresh one: none at all).
#   7. A fresh replica that joins after the final sync (one fragment) writes a checkpoint at
#      max_steps with the finishers' weights, exit 0. The same with its state cut off by the
#      donor's finish (tcp_slow_state): told the run is over after its wait, it says it came too
#      late, stops with run_over and no checkpoint, exit 0 (until 2026-12: exit 1, the error
#      for a new run against an old relay's group); also over two hubs, and by a catch-up
#      transfer (until 2026-12 its donor sent on until the joiner had caught up).
#   8. Part 6a with sharded replicas (MPI; skipped without): every rank of the joiner takes
#      part, all write the checkpoint; and part 7's cut-off state: every rank stops, exit 0.
#   9. A stop signal in a rejoin during the final syncs: three replicas, two fragments, replica
#      1 dropped from the first final sync and SIGUSR1 while its rejoin waits. Its checkpoint at
#      max_steps holds θ (the diloco_final_theta event names both fragments) and it exits 76,
#      not done; run again (the requeue) it exits 0 with θ, the finishers' weights if it joined
#      the final syncs still going on. Until 2026-12: its local weights, no event, exit 0.
. "$(dirname "$0")/lib.sh"
require_tcp
tmp_with_processes
diloco_test_files
common=(test/configs/tiny_test.conf --device cpu --train_data "$tmp/train.bin" --val_every 0 --threads 1
    --log_every 1000 --ckpt_keep 0 --diloco_replicas 2 --diloco_inner_steps 5 --diloco_transport tcp
    --diloco_secret_file "$tmp/secret" --diloco_timeout_s 3 --diloco_connect_timeout_s 30)

replica() {  # replica ID OUT_DIR [--key value]...: one replica in the background; sets rpid
    local id=$1 out=$2
    shift 2
    "$TRAIN_GPT" "${common[@]}" --diloco_rendezvous "${RENDEZVOUS:-127.0.0.1:$port}" --diloco_replica_id "$id" \
        --out_dir "$out" "$@" >>"$out.log" 2>&1 &
    rpid=$!
    pids+=("$rpid")
}
sharded() {  # sharded ID OUT_DIR [--key value]...: a replica of 2 shards x 2 copies (mpirun -np 4); sets rpid
    local id=$1 out=$2
    shift 2
    "${MPIRUN[@]}" 4 "$TRAIN_GPT" "${common[@]}" --fsdp_size 2 --dp_replicate 2 --diloco_rendezvous "127.0.0.1:$port" \
        --diloco_replica_id "$id" --out_dir "$out" "$@" >>"$out.log" 2>&1 &
    rpid=$!
    pids+=("$rpid")
}
exited() { ! kill -0 "$1" 2>/dev/null; }
# wait_exit PID: waits (WAIT_LIMIT_S) for the process to end; rc = its exit status, 124 if it
# did not end (then it is killed).
wait_exit() {
    if wait_until "process $1 to exit" exited "$1"; then
        rc=0
        wait "$1" || rc=$?
    else
        kill -9 "$1" 2>/dev/null || true
        wait "$1" 2>/dev/null || true
        rc=124
    fi
}
# stopped_over OUT_DIR STEP: the run's last stop event says run_over, and a checkpoint of STEP is there.
stopped_over() {
    grep '"event":"stop"' "$1/metrics.jsonl" | tail -n 1 | grep -q '"reason":"run_over"' &&
        [ -d "$1/$(printf 'step_%08d' "$2")" ]
}
last_step() { grep -v '"event"' "$1" | grep '"loss"' | tail -n 1 | sed -E 's/.*"step":([0-9]+).*/\1/'; }

# ---------------------------------------------------------------- 1. back after the end
start_relay end 1
over=(--max_steps 40 --ckpt_every 10 --diloco_min_replicas 2)
replica 0 "$tmp/end0" "${over[@]}"
r0=$rpid
replica 1 "$tmp/end1" "${over[@]}" --stop_at_step 10
r1=$rpid
wait_exit "$r1"
check "replica 1 stopped at step 10 (rc $rc)" test "$rc" -eq 0
wait_exit "$r0"
check "replica 0 trained on alone to step 40 and finished (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && [ \"\$(grep -c '\"step\":40,' '$tmp/end0/metrics.jsonl')\" -ge 1 ]"
check "the relay heard replica 0 finish the run" grep -q 'replica 0 .* left: it finished the run' "$tmp/relay_end.log"
before=$(tree_digest "$tmp/end1")
lines_before=$(grep -c . "$tmp/end1/metrics.jsonl")
replica 1 "$tmp/end1" "${over[@]}"
WAIT_LIMIT_S=120 wait_exit "$rpid"
say "    replica 1 back after the end: rc $rc"
check "replica 1, back after the end, exits 0 instead of waiting forever (rc $rc)" test "$rc" -eq 0
check "it says the run is over" grep -q 'the run is over' "$tmp/end1.log"
check "its stop event says run_over and it trained no step" \
    sh -c "[ \"\$(tail -n +$((lines_before + 1)) '$tmp/end1/metrics.jsonl' | grep -c '\"loss\"')\" -eq 0 ] &&
           tail -n +$((lines_before + 1)) '$tmp/end1/metrics.jsonl' | grep -q '\"event\":\"stop\".*\"reason\":\"run_over\"'"
after=$(tree_digest "$tmp/end1" | grep -v ' ./metrics.jsonl$')
check "its checkpoints are unchanged" test "$after" = "$(printf '%s\n' "$before" | grep -v ' ./metrics.jsonl$')"
check "the relay says whom it told and who finished" \
    grep -q 'replica 1 at outer step 2: the run is over (replica 0 finished it at outer step 8' "$tmp/relay_end.log"

check "a fresh replica of the same configuration (no checkpoint) is refused with one line, non-zero" \
    one_line_error "restart the relay" --diloco_rendezvous "127.0.0.1:$port" --diloco_replica_id 1 "${over[@]}"

# ---------------------------------------------------------------- 2. another run, same relay
replica 0 "$tmp/other" --max_steps 10 --seed 7 --diloco_min_replicas 1
WAIT_LIMIT_S=120 wait_exit "$rpid"
check "a replica of another run on the same relay trains to its end (rc $rc, step $(last_step "$tmp/other/metrics.jsonl"))" \
    sh -c "[ $rc -eq 0 ] && [ \"$(last_step "$tmp/other/metrics.jsonl")\" = 10 ]"
check "the relay forgot the finished run" grep -q 'the finished run.s record is forgotten' "$tmp/relay_end.log"

# ---------------------------------------------------------------- 3. over at a rejoin
# model_is_theta OUT_DIR STEP: the checkpoint's model.safetensors holds its outer θ bit for bit.
model_is_theta() {
    "$PYTHON" - "$1/$(printf 'step_%08d' "$2")" <<'PY'
import json, struct, sys
def tensors(path, prefix=""):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    return {k[len(prefix):]: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in head.items() if k != "__metadata__" and k.startswith(prefix)}
model = tensors(sys.argv[1] + "/model.safetensors")
theta = tensors(sys.argv[1] + "/outer.safetensors", "outer.theta.")
differ = [k for k in model if model[k] != theta.get(k)]
print(f"    {sys.argv[1]}: {len(model)} tensors, {len(differ)} differ from θ {differ[:3]}")
sys.exit(0 if model and not differ else 1)
PY
}
# over_at_rejoin NAME LATE ARGS...: min_replicas 2 (the hub holds the group until both are in:
# with 1, replica 0 could train all 20 short steps and leave before replica 1 connected), H 5,
# 20 steps, ARGS; replica 1 is late for round LATE, the first of the final syncs after step 20
# (diloco_late; held_for_upload) and evicted; replica 0 closes the final round(s) alone (skipped: one
# contributor), finishes and leaves. Replica 1's rejoin finds the run over (at once, or when
# replica 0 leaves while it waits for a state): it stops after step 20 with the stop event
# "run_over" and a checkpoint, exit 0. Each fragment whose final sync did not apply (on replica
# 0, all of them: skipped) takes θ at the end: both checkpoints of step 20 hold θ and the same
# weights, and replica 0 says how much of its work that dropped. Until 2026-12 each kept its
# local weights there: two different models, neither of them θ.
over_at_rejoin() {
    local name=$1 late=$2
    shift 2
    start_relay "$name" 1
    local over=(--max_steps 20 --ckpt_every 10 --diloco_min_replicas 2 "$@")
    TRAIN_GPT_FAULT=tcp_trace:$late replica 0 "$tmp/${name}0" "${over[@]}"
    local r0=$rpid
    TRAIN_GPT_FAULT=stop_in_step:19,diloco_late:$late replica 1 "$tmp/${name}1" "${over[@]}"
    local r1=$rpid
    held_for_upload "$name" "$tmp/${name}0.log" 1 "$r1"
    wait_exit "$r0"
    check "$name: replica 0 closes the last round alone and finishes (rc $rc)" test "$rc" -eq 0
    wait_exit "$r1"
    check "$name: replica 1, late for the last exchange, exits 0 (rc $rc)" test "$rc" -eq 0
    if [ "$name" = late ]; then
        check "$name: replica 1 was evicted and found the run over at its rejoin" \
            sh -c "grep -q 'too late' '$tmp/${name}1.log' && grep -q 'the run is over' '$tmp/${name}1.log'"
        check "$name: replica 1 stopped after step 20 with the stop event run_over and a checkpoint" \
            stopped_over "$tmp/${name}1" 20
    fi
    check "$name: replica 0's final checkpoint holds θ (its final sync skipped)" model_is_theta "$tmp/${name}0" 20
    check "$name: replica 1's final checkpoint holds θ (dropped from its final sync, the run over)" \
        model_is_theta "$tmp/${name}1" 20
    check "$name: ... the same weights in both" \
        cmp -s "$tmp/${name}0/step_00000020/model.safetensors" "$tmp/${name}1/step_00000020/model.safetensors"
}
over_at_rejoin late 3
check "late: replica 0 says its final outer step did not apply and what of its work that dropped" \
    sh -c "grep -q \"replica 0's final outer step did not apply; its weights become θ, .* its last 5 inner step(s) of work are dropped (norm [0-9]\" '$tmp/late0.log' &&
           grep -q '\"event\":\"diloco_final_theta\",\"step\":20,\"outer_step\":4,.*\"fragments\":\[0\],\"dropped_steps\":\[5\]' '$tmp/late0/metrics.jsonl'"
# Two fragments, τ 0 (H 5: rounds after steps 2, 5, 7, ... 17, then the final syncs of fragments
# 0 and 1 after step 20: rounds 7 and 8): replica 1 is late for round 7. Its rejoin finds the
# run over, or takes the state replica 0 sends after round 8 (the final syncs over: θ whole);
# either way its checkpoint of step 20 holds θ.
over_at_rejoin late_p2 7 --diloco_fragments 2 --diloco_overlap_steps 0
check "late_p2: replica 0 says the final syncs of fragments 0 and 1 did not apply and what of its work that dropped" \
    sh -c "grep -q \"replica 0's final sync of fragment(s) 0,1 did not apply; .*: 3,5 inner step(s)\" '$tmp/late_p20.log' &&
           grep -q '\"event\":\"diloco_final_theta\",.*\"fragments\":\[0,1\],\"dropped_steps\":\[3,5\]' '$tmp/late_p20/metrics.jsonl'"
# The hub unreachable at the final sync: two replicas, H 5, 10 steps, each stopping itself in
# step 7 (stop_in_step); once both are stopped the relay is stopped too (SIGSTOP: silent, its
# port still open) and the replicas go on. Their final exchange fails (the hub silent for
# timeout_s, no answer to a reconnect) and each ends with θ of outer step 1 bit for bit: both
# final checkpoints hold θ, the same weights.
start_relay gone 1
gone_relay=${pids[-1]}
gone=(--max_steps 10 --ckpt_every 10 --diloco_min_replicas 2)
TRAIN_GPT_FAULT=stop_in_step:7 replica 0 "$tmp/gone0" "${gone[@]}"
g0=$rpid
TRAIN_GPT_FAULT=stop_in_step:7 replica 1 "$tmp/gone1" "${gone[@]}"
g1=$rpid
both_stopped() { stopped "$g0" && stopped "$g1"; }
wait_until "both replicas stop themselves in step 7" both_stopped
kill -STOP "$gone_relay"
kill -CONT "$g0" "$g1"
wait_exit "$g0"
grc=$rc
wait_exit "$g1"
kill -CONT "$gone_relay"
check "hub gone at the final sync: both replicas exit 0 (rc $grc $rc)" test "$grc$rc" = 00
check "  replica 0's final exchange failed, and it says its weights became θ" \
    sh -c "grep -q 'the exchange for outer step 2 failed' '$tmp/gone0.log' &&
           grep -q \"replica 0's final outer step did not apply; its weights become θ\" '$tmp/gone0.log'"
check "  replica 0's final checkpoint holds θ" model_is_theta "$tmp/gone0" 10
check "  replica 1's the same weights" \
    cmp -s "$tmp/gone0/step_00000010/model.safetensors" "$tmp/gone1/step_00000010/model.safetensors"

# ---------------------------------------------------------------- 4. sharded replicas
detect_mpi
if [ "$HAVE_MPI" = 1 ]; then
    start_relay sharded 2
    over=(--max_steps 20 --ckpt_every 10 --diloco_min_replicas 2)
    sharded 0 "$tmp/sh0" "${over[@]}"
    r0=$rpid
    sharded 1 "$tmp/sh1" "${over[@]}" --stop_at_step 10
    wait_exit "$rpid"
    check "sharded: replica 1 stopped at step 10 (rc $rc)" test "$rc" -eq 0
    wait_exit "$r0"
    check "sharded: replica 0 finished (rc $rc)" test "$rc" -eq 0
    check "  both shards' hubs heard it finish" test "$(grep -c 'replica 0 .* left: it finished the run' "$tmp/relay_sharded.log")" -eq 2
    before=$(tree_digest "$tmp/sh1" | grep -v ' ./metrics.jsonl$')
    sharded 1 "$tmp/sh1" "${over[@]}"
    WAIT_LIMIT_S=120 wait_exit "$rpid"
    check "sharded: replica 1, back after the end, exits 0 on every rank (rc $rc)" test "$rc" -eq 0
    check "  both shards' hubs told it the run is over" \
        test "$(grep -c 'replica 1 at outer step 2: the run is over' "$tmp/relay_sharded.log")" -eq 2
    check "  its stop event says run_over" sh -c "tail -n 2 '$tmp/sh1/metrics.jsonl' | grep -q '\"reason\":\"run_over\"'"
    check "  its checkpoints are unchanged" test "$(tree_digest "$tmp/sh1" | grep -v ' ./metrics.jsonl$')" = "$before"
    # Part 3's two fragments with these replicas: replica 1 late for round 7 (the final sync of
    # fragment 0; held_for_upload), replica 0's final syncs skipped. Every rank takes its own group's θ into its
    # pieces of the fragments whose final sync did not apply (the replica's figures from
    # collectives that every rank makes), and both replicas' final checkpoints hold θ.
    start_relay shfinal 2
    over=(--max_steps 20 --ckpt_every 10 --diloco_min_replicas 2 --diloco_fragments 2 --diloco_overlap_steps 0)
    TRAIN_GPT_FAULT=tcp_trace:7 sharded 0 "$tmp/shf0" "${over[@]}"
    r0=$rpid
    TRAIN_GPT_FAULT=stop_in_step:19,diloco_late:7 sharded 1 "$tmp/shf1" "${over[@]}"
    r1=$rpid
    # (Rank 0's trace alone: the other ranks log no notes; its shard-1 rank sends in the same step.)
    held_ranks_for_upload shfinal "$tmp/shf0.log" 1 "$r1" 4
    wait_exit "$r0"
    rc0=$rc
    wait_exit "$r1"
    check "sharded, final syncs skipped: both replicas exit 0 on every rank (rc $rc0 $rc)" test "$rc0$rc" = 00
    check "  replica 0 took θ into both fragments and said so" \
        grep -q '"event":"diloco_final_theta",.*"fragments":\[0,1\],"dropped_steps":\[3,5\]' "$tmp/shf0/metrics.jsonl"
    check "  replica 0's final checkpoint holds θ" model_is_theta "$tmp/shf0" 20
    check "  replica 1's too" model_is_theta "$tmp/shf1" 20
    check "  ... the same weights in both" \
        cmp -s "$tmp/shf0/step_00000020/model.safetensors" "$tmp/shf1/step_00000020/model.safetensors"
else
    say "  skip part 4 (no MPI in this build)"
fi
# ---------------------------------------------------------------- 5. dropped from a final sync
# Three replicas, two fragments, H 4, τ 0, 40 steps: a round every 2 steps (fragment 0, 1, 0,
# ...), rounds 0-18 regular, 19 and 20 the final syncs (fragments 0, 1). Replica 2 is late for
# round 19 and dropped, replica 1 for round 20; replica 2's rejoin takes the state replica 0
# sends after round 20 (or hears that the run is over). No round after 20 is held, and every
# replica that finished ends with the same θ and weights: a replica that took a donor's state
# at the last step went on with its own next fragment (until 2026-12: round 21, of the wrong
# fragment, alone and applied; its weights not the group's). The three start together (each
# stops itself in its start-up, and all continue at once), so all are members before round 19.
# Timeouts 10 s (the late ones wait 11 s): with 3 s, a replica slowed by a loaded machine was
# dropped before round 18 (seen once beside other tests' processes).
start_relay finals 1 10
finals=(--max_steps 40 --ckpt_every 0 --batch_size 4 --diloco_replicas 3 --diloco_inner_steps 4
    --diloco_fragments 2 --diloco_overlap_steps 0 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9
    --diloco_plain_in_decay 0 --diloco_decay_inner_steps 0 --diloco_timeout_s 10)
# start_three_together NAME LATE1 LATE2 [--key value]...: replicas 0, 1 and 2 in $tmp/NAME0..2,
# each stopped in its start-up until all three are, then continued at once, and once joined
# stopped again in its first step until all three are (all members before the first round: a
# round needs H steps; continued from the start-up alone, one replica on a loaded machine
# founded the group and closed rounds 0-7 on its own while the other two were still
# connecting, and they waited for its state: seen in CI beside two busy processes); replica 1 late for round LATE1, replica 2 for LATE2 (diloco_late), and
# replica R with the faults in $EXTRA_R too (EXTRA_0, EXTRA_1) where set. Their pids in together_pids.
start_three_together() {
    local name=$1 late1=$2 late2=$3 r fault
    shift 3
    together_pids=()
    for r in 0 1 2; do
        fault=stop_in_start:0,stop_in_step:0
        [ "$r" = 0 ] && fault=$fault${EXTRA_0:+,$EXTRA_0}
        [ "$r" = 1 ] && fault=$fault,diloco_late:$late1${EXTRA_1:+,$EXTRA_1}
        [ "$r" = 2 ] && fault=$fault,diloco_late:$late2
        TRAIN_GPT_FAULT=$fault replica "$r" "$tmp/$name$r" "$@"
        together_pids+=("$rpid")
    done
    all_stopped() { for p in "${together_pids[@]}"; do stopped "$p" || return 1; done; }
    wait_until "the three replicas to stop themselves in their start-up" all_stopped ||
        die "$name: the replicas did not all stop in their start-up"
    kill -CONT "${together_pids[@]}"
    wait_until "the three replicas to join and stop themselves in their first step" all_stopped ||
        die "$name: the replicas did not all stop in their first step"
    kill -CONT "${together_pids[@]}"
}
start_three_together fin 20 19 "${finals[@]}"
fpids=("${together_pids[@]}")
frc=""
for r in 0 1 2; do
    wait_exit "${fpids[$r]}"
    frc="$frc $rc"
done
check "final syncs with drops: the three replicas exit 0 (rc$frc)" test "$frc" = " 0 0 0"
check "  all three were in round 18" grep -q 'round 18 closed: 3 contributor' "$tmp/relay_finals.log"
check "  no round after the two final syncs (19, 20) is held" \
    sh -c "! grep -E 'round (2[1-9]|[3-9][0-9]|[1-9][0-9][0-9]+) closed' '$tmp/relay_finals.log'"
last_hash() { grep -o '"param_hash":"[0-9a-f]*"' "$1/metrics.jsonl" | tail -n 1; }
finished=$(grep -o 'replica [0-2] ([^)]*) left: it finished the run' "$tmp/relay_finals.log" | cut -d' ' -f2 | sort -u |
    tr '\n' ' ')
hashes=$(for r in $finished; do last_hash "$tmp/fin$r"; done | sort -u | wc -l)
check "  the replicas that finished the run ($finished) end with the same θ (param_hash)" test "$hashes" -eq 1
models=$(for r in $finished; do
    f="$tmp/fin$r/step_00000040/model.safetensors"
    [ -f "$f" ] && cksum <"$f"
done | sort -u | wc -l)
check "  ... and the same weights in their final checkpoints" test "$models" -eq 1

# ---------------------------------------------------------------- 6. joining during the final syncs
# Replicas 0 and 1 (min_replicas 2: they start together), two fragments, H 4, τ 0, 40 steps:
# rounds 0-18 regular, 19 and 20 the final syncs (fragments 0, 1). Both stop themselves in step
# 40 (0-based 39), after round 18; replica 2 starts and waits at the relay; then they go on, and
# round 19's close gives it replica 0's state, members from round 20. Timeouts 60 s: the
# stopped replicas send no heartbeat meanwhile.
j6=(--max_steps 40 --ckpt_every 0 --diloco_replicas 3 --diloco_min_replicas 2 --diloco_inner_steps 4
    --diloco_fragments 2 --diloco_overlap_steps 0 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9
    --diloco_plain_in_decay 0 --diloco_decay_inner_steps 0 --diloco_timeout_s 60)
model_sum() {  # model_sum OUT_DIR STEP: the cksum of its step-STEP model.safetensors (fails without one)
    local f; f=$1/step_$(printf %08d "$2")/model.safetensors
    [ -f "$f" ] && cksum <"$f"
}
# join_at_end NAME STEPS [--key value]...: replicas 0 and 1 stop in their last step, replica 2
# starts and waits for the group's state, then 0 and 1 go on; sets jrc (the three exit
# statuses). Out dirs $tmp/NAME0..2. OLD_AT=N: replica 2 first trains with them and stops at
# step N (a checkpoint), and comes back from it at the end. HELD_FAULT: more TRAIN_GPT_FAULT
# hooks for replicas 0 and 1.
join_at_end() {
    local name=$1 steps=$2
    shift 2
    local held=() old=""
    # It founds the group and stops itself in its step 2 (the group starts with the first of 0
    # and 1 to come: a quorum of 2), and goes on once 0 and 1 are both in: else it could reach
    # OLD_AT and leave before replica 1 came (the run takes a second), and 1 waited for a state
    # that replica 0, alone and skipping every round, never sent (seen under load).
    if [ -n "${OLD_AT:-}" ]; then
        TRAIN_GPT_FAULT=stop_in_step:1 replica 2 "$tmp/${name}2" "$@" --stop_at_step "$OLD_AT"
        old=$rpid
        wait_until "replica 2 to found the group" grep -q 'replica 2 joined: founds the group' "$tmp/relay_$name.log" ||
            die "$name: replica 2 did not found the group"
    fi
    for r in 0 1; do
        TRAIN_GPT_FAULT=stop_in_step:$((steps - 1))${HELD_FAULT:+,$HELD_FAULT} replica "$r" "$tmp/$name$r" "$@"
        held+=("$rpid")
    done
    if [ -n "$old" ]; then
        held_until_all_in() {
            stopped "$old" && grep -q 'replica 0 joined' "$tmp/relay_$name.log" &&
                grep -q 'replica 1 joined' "$tmp/relay_$name.log"
        }
        wait_until "replica 2 to stop in its step 2, 0 and 1 to join" held_until_all_in ||
            die "$name: replica 2 did not stop in step 2, or 0 and 1 did not join"
        kill -CONT "$old"
        wait_exit "$old"
        [ "$rc" -eq 0 ] && grep -q "stopped after step $OLD_AT (stop_at_step)" "$tmp/${name}2.log" ||
            die "$name: replica 2 did not stop at step $OLD_AT (rc $rc)"
    fi
    stopped_all() { for p in "${held[@]}"; do stopped "$p" || return 1; done; }
    wait_until "replicas 0 and 1 to stop in their last step" stopped_all || die "$name: 0 and 1 did not stop"
    local waits='replica 2 joined at outer step [0-9]* .*: waits for the group' before
    before=$(grep -c "$waits" "$tmp/relay_$name.log" || true)
    replica 2 "$tmp/${name}2" "$@"
    local late=$rpid
    more_waits() { [ "$(grep -c "$waits" "$tmp/relay_$name.log" || true)" -gt "$before" ]; }
    wait_until "replica 2 to wait for the group's state" more_waits || die "$name: replica 2 did not join"
    kill -CONT "${held[@]}"
    jrc=""
    for p in "${held[@]}" "$late"; do
        wait_exit "$p"
        jrc="$jrc $rc"
    done
}
# said_finished OUT_DIR STEP: its log says it finished with the group's final weights in step STEP.
said_finished() {
    local said="finished at max_steps = $2 without training a step: .* its checkpoint step_$(printf %08d "$2")"
    grep -q "$said holds the group.s final weights" "$1.log"
}
# same_models NAME STEP: the three replicas' step-STEP model.safetensors are the same bytes.
same_models() {
    local s0 s1 s2
    s0=$(model_sum "$tmp/${1}0" "$2") s1=$(model_sum "$tmp/${1}1" "$2") s2=$(model_sum "$tmp/${1}2" "$2" || echo none)
    [ -n "$s0" ] && [ "$s0" = "$s1" ] && [ "$s2" = "$s0" ]
}
# a. Fresh, whole transfer (--catch_up 0: round 20 waits for it): it takes part in round 20
# with no work, which the relay names apart, and its weights are the finishers' — the same
# bytes as the run without it (with one inner step's tokens for its Δ = 0 they differ); the
# mean of every round, 20 with its tokens 0 too, is numpy's byte for byte (diloco_check.py).
start_relay fj 1 60 --catch_up 0
mkdir "$tmp/fj_dump"
TRAIN_GPT_DILOCO_DUMP=$tmp/fj_dump join_at_end fj 40 "${j6[@]}"
check "fresh, joined during the final syncs: the three replicas exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  it took the state after final sync 19 and took part in 20 with no work" \
    sh -c "grep -q 'replica 0 is the donor: it sends its state to \[2\]' '$tmp/relay_fj.log' &&
           grep -q 'round 20 closed: 2 contributor(s) \[0 1\], no work from \[2\]' '$tmp/relay_fj.log' &&
           grep -q 'takes part in the group.s 1 final sync(s) still to come, with no work' '$tmp/fj2.log'"
check "  no round after 20" sh -c "! grep -E 'round (2[1-9]|[3-9][0-9]) closed' '$tmp/relay_fj.log'"
check "  it says it finished with the group's final weights in its checkpoint" said_finished "$tmp/fj2" 40
check "  its step-40 weights are the finishers' (model.safetensors)" same_models fj 40
check "  ... and its θ (param_hash) too" test "$(last_hash "$tmp/fj2")" = "$(last_hash "$tmp/fj0")"
# (Δ within 5 %: int8 both ways, 2.6 % seen.)
check "  every round's mean is the hub's reduction, round 20's without its Δ (diloco_check.py)" \
    "$PYTHON" test/diloco_check.py "$tmp/fj_dump" 0.7 0.9 int8 0.05 1 0 2
start_relay fjref 1 60 --catch_up 0
replica 0 "$tmp/fjref0" "${j6[@]}"
r0=$rpid
replica 1 "$tmp/fjref1" "${j6[@]}"
wait_exit "$rpid"
rc1=$rc
wait_exit "$r0"
check "  the run without it ends with the same weights: its Δ = 0 did not pull the mean (rc $rc $rc1)" \
    sh -c "[ $rc -eq 0 ] && [ $rc1 -eq 0 ] && [ '$(model_sum "$tmp/fjref0" 40)' = '$(model_sum "$tmp/fj0" 40)' ]"
# b. Fresh, the relay's catch-up transfer: round 20 may close before it has its state, and it
# takes that final sync's mean after the state (or is due in it): the same end either way.
start_relay fc 1 60
join_at_end fc 40 "${j6[@]}"
check "fresh, joined during the final syncs, catch-up transfer: exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  it says it finished with the group's final weights in its checkpoint" said_finished "$tmp/fc2" 40
check "  its step-40 weights are the finishers'" same_models fc 40
# c. Back from an old checkpoint (step 10): it takes part in round 20 with the late work it
# carries into fragment 1 (a contributor: the relay names it) and ends with the same weights.
start_relay fo 1 60 --catch_up 0
OLD_AT=10 join_at_end fo 40 "${j6[@]}"
check "back from its step-10 checkpoint during the final syncs: exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  it took part in round 20 with its carried work" \
    sh -c "grep -q 'round 20 closed: 3 contributor(s) \[0 1 2\]' '$tmp/relay_fo.log' &&
           grep -q 'carries its unsent work' '$tmp/fo2.log' && grep -q 'with the late work it carries' '$tmp/fo2.log'"
check "  it says it finished with the group's final weights in its checkpoint" said_finished "$tmp/fo2" 40
old_kept() { same_models fo 40 && [ -d "$tmp/fo2/step_00000010" ]; }
check "  its step-40 weights are the finishers', its step-10 checkpoint is still there" old_kept
# ---------------------------------------------------------------- 7. fresh, after the final sync
# One fragment, H 5, 20 steps: rounds 0-2 regular, 3 the final sync. Replica 2 waits at the relay
# during round 3 and takes the state after it: nothing left to sync.
start_relay fk 1 60
join_at_end fk 20 --max_steps 20 --ckpt_every 0 --diloco_replicas 3 --diloco_min_replicas 2 --diloco_timeout_s 60 \
    --diloco_plain_in_decay 0 --diloco_decay_inner_steps 0
check "fresh, joined after the final sync: the three replicas exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  it took the state after round 3 and says the final syncs were over" \
    sh -c "grep -q 'round 3 closed: 2 contributor(s) \[0 1\]' '$tmp/relay_fk.log' &&
           grep -q 'joined after the group.s final syncs' '$tmp/fk2.log' &&
           ! grep -E 'round [4-9] closed' '$tmp/relay_fk.log'"
check "  it says it finished with the group's final weights in its checkpoint" said_finished "$tmp/fk2" 20
check "  its step-20 weights are the finishers' (model.safetensors)" same_models fk 20
# Its state cut off by the run's end: the same with a whole transfer (--catch_up 0), which the
# donor (after round 3, the final sync) sends from a thread at one chunk of 128 KiB per 15 s
# (tcp_slow_state: 0.25 × timeout_s; the state is 306 KiB) while it finishes; it leaves without
# waiting for it (the usual case at 1B over 100 Mbit/s, where a state takes minutes), the relay
# ends the transfer and, the other finisher gone too, tells replica 2 that the run is over. It
# came too late: it says so and stops with the stop event "run_over", trains no step and writes
# no checkpoint (nothing of its own), exit 0: a finished run to requeue.sh, as a replica back
# from a checkpoint stops. Until 2026-12 it exited 1 with "starts a run that the relay says is
# over", the line for a new run started against an old relay's finished group (part 1: a fresh
# replica told so at its JOIN, without a wait, is still refused so).
start_relay fx 1 60 --catch_up 0
k7=(--max_steps 20 --ckpt_every 0 --diloco_replicas 3 --diloco_min_replicas 2 --diloco_timeout_s 60
    --diloco_plain_in_decay 0 --diloco_decay_inner_steps 0)
HELD_FAULT=tcp_slow_state:0 join_at_end fx 20 "${k7[@]}"
check "fresh, its state cut off by the run's end: the three replicas exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  the donor left before the state was whole, and the relay told replica 2 the run is over" \
    sh -c "grep -q 'state transfer from replica [01] aborted (the donor left)' '$tmp/relay_fx.log' &&
           grep -q 'replica 2 at outer step 0: the run is over' '$tmp/relay_fx.log'"
# stopped_over_fresh OUT_DIR: its last stop event says run_over, it trained no step, it has no checkpoint.
stopped_over_fresh() {
    grep '"event":"stop"' "$1/metrics.jsonl" | tail -n 1 | grep -q '"reason":"run_over"' &&
        ! grep -q '"loss"' "$1/metrics.jsonl" && ! ls -d "$1"/step_* >/dev/null 2>&1
}
came_late() {  # came_late NAME: $tmp/NAME.log says it came too late (no error), and it stopped so
    grep -q 'replica 2 came too late: the run finished while it waited for the group.s state' "$tmp/$1.log" &&
        ! grep -q 'error:' "$tmp/$1.log" && stopped_over_fresh "$tmp/$1"
}
check "  it says it came too late, stops with run_over, no step trained, no checkpoint" came_late fx2
check "  the finishers' step-20 weights are the same" \
    sh -c "[ -n '$(model_sum "$tmp/fx0" 20)' ] && [ '$(model_sum "$tmp/fx0" 20)' = '$(model_sum "$tmp/fx1" 20)' ]"
# The same with a catch-up transfer (the relay's default, --catch_up 1), sent at the same pace
# from the donor's sender thread: leaving, the donor stops sending (its log says so) as a whole
# transfer's donor does, the relay ends the transfer before the state was whole, and replica 2
# came too late. Until 2026-12 a catch-up donor's sender missed the cancel of its leave (it read
# a whole transfer's hooks; only a stop signal ended it): the donor sent on until replica 2 had
# the state and caught up, its exit waiting for its transfer (at 14B over 100 Mbit/s: hours, at
# the run's end, stop_at_step or the walltime guard), and replica 2 wrote a checkpoint.
start_relay fxc 1 60
HELD_FAULT=tcp_slow_state:0 join_at_end fxc 20 "${k7[@]}"
check "catch-up, its state cut off by the run's end: the three replicas exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  the donor stopped sending as it left, before the state was whole; replica 2 told the run is over" \
    sh -c "grep -q 'replica [01] stops sending its state: it stops or leaves' '$tmp/fxc0.log' '$tmp/fxc1.log' &&
           grep -q 'state transfer from replica [01] aborted (the donor left)' '$tmp/relay_fxc.log' &&
           grep -q 'replica 2 at outer step 0: the run is over' '$tmp/relay_fxc.log'"
check "  it says it came too late, stops with run_over, no step trained, no checkpoint" came_late fxc2
# The same over two hubs (diloco_rendezvous h1,h2: the first, the primary, has the joins and
# the state transfer).
start_relay fhb 1 60 --catch_up 0
second=$port
start_relay fh 1 60 --catch_up 0
RENDEZVOUS=127.0.0.1:$port,127.0.0.1:$second HELD_FAULT=tcp_slow_state:0 join_at_end fh 20 "${k7[@]}"
check "two hubs, its state cut off by the run's end: the three replicas exit 0 (rc$jrc)" test "$jrc" = " 0 0 0"
check "  the primary ended the transfer and told replica 2 the run is over" \
    sh -c "grep -q 'state transfer from replica [01] aborted (the donor left)' '$tmp/relay_fh.log' &&
           grep -q 'replica 2 at outer step 0: the run is over' '$tmp/relay_fh.log'"
check "  it says it came too late, stops with run_over, no step trained, no checkpoint" came_late fh2

# ---------------------------------------------------------------- 8. sharded, during the final syncs
# Part 6a with replicas of 2 shards x 2 copies (MPI; skipped without), 20 steps: rounds 0-8
# regular, 9 and 10 the final syncs. Every rank of replica 2 takes part in its shard's round 10
# with no work, and all write the checkpoint together.
# sharded_join_at_end NAME STEPS FAULT [--key value]...: join_at_end with these replicas (FAULT:
# more TRAIN_GPT_FAULT hooks for replicas 0 and 1); sets jrc.
sharded_join_at_end() {
    local name=$1 steps=$2 fault=$3 r
    shift 3
    held=()
    for r in 0 1; do
        TRAIN_GPT_FAULT=stop_in_step:$((steps - 1))${fault:+,$fault} sharded "$r" "$tmp/$name$r" "$@"
        held+=("$rpid")
    done
    held_stopped() { ranks_stopped "${held[0]}" 4 && ranks_stopped "${held[1]}" 4; }
    wait_until "the ranks of replicas 0 and 1 to stop in their last step" held_stopped ||
        die "$name: they did not stop"
    sharded 2 "$tmp/${name}2" "$@"
    local late=$rpid
    both_wait() {
        [ "$(grep -c 'replica 2 joined at outer step 0 .*: waits for the group' "$tmp/relay_$name.log")" -eq 2 ]
    }
    wait_until "replica 2 to wait at both shards' hubs" both_wait || die "$name: replica 2 did not join"
    for p in "${held[@]}"; do kill -CONT $(pgrep -P "$p"); done
    jrc=""
    for p in "${held[@]}" "$late"; do
        wait_exit "$p"
        jrc="$jrc $rc"
    done
}
if [ "$HAVE_MPI" = 1 ]; then
    start_relay fs 2 60 --catch_up 0
    sharded_join_at_end fs 20 "" "${j6[@]}" --max_steps 20
    check "sharded, joined during the final syncs: exit 0 on every rank (rc$jrc)" test "$jrc" = " 0 0 0"
    check "  both shards' round 10 had it with no work" \
        test "$(grep -c 'round 10 closed: 2 contributor(s) \[0 1\], no work from \[2\]' "$tmp/relay_fs.log")" -eq 2
    check "  it says it finished with the group's final weights in its checkpoint" said_finished "$tmp/fs2" 20
    check "  its step-20 weights are the finishers'" same_models fs 20
    # Part 7's state cut off by the run's end with these replicas: each rank's donor sends its
    # 153 KiB at one chunk of 128 KiB per 30 s (the relay's timeout 120 s). Every rank of replica
    # 2 is told the run is over after its wait, and the replica stops as one: exit 0, no checkpoint.
    start_relay fsx 2 120 --catch_up 0
    sharded_join_at_end fsx 20 tcp_slow_state:0 "${k7[@]}"
    check "sharded, its state cut off by the run's end: exit 0 on every rank (rc$jrc)" test "$jrc" = " 0 0 0"
    check "  both shards' hubs ended the transfer and told replica 2 the run is over" \
        sh -c "[ \$(grep -c 'state transfer from replica [01] aborted (the donor left)' '$tmp/relay_fsx.log') -eq 2 ] &&
               [ \$(grep -c 'replica 2 at outer step 0: the run is over' '$tmp/relay_fsx.log') -eq 2 ]"
    check "  it says it came too late, stops with run_over, no step trained, no checkpoint" came_late fsx2
else
    say "  skip part 8 (no MPI in this build)"
fi
# ---------------------------------------------------------------- 9. stopped in a final rejoin
# Three replicas (min_replicas 1), two fragments, H 5, τ 0, 20 steps: rounds 0-6 regular, 7 and
# 8 the final syncs (fragments 0, 1); timeouts 10 s. Replica 1 is late for round 7 and dropped
# (held in its last step until replica 0's contribution began: held_for_upload);
# replica 2 is late for round 8, which the hub so holds open for timeout_s, and with it replica
# 1's rejoin (it waits for the state after round 8). SIGUSR1 reaches replica 1 in that wait:
# its rejoin ends, and neither fragment's final sync applied on it. It writes its checkpoint at
# step 20 with θ in both and exits 76 (SIGUSR1: its final syncs not done). Until 2026-12 it
# skipped that: the checkpoint held its local weights, no diloco_final_theta event, status 0
# (requeue.sh took it for finished) while it said "run the same command to resume".
start_relay sg 1 10
sg=(--max_steps 20 --ckpt_every 0 --diloco_replicas 3 --diloco_min_replicas 1 --diloco_fragments 2
    --diloco_overlap_steps 0 --diloco_timeout_s 10)
EXTRA_0=tcp_trace:7 EXTRA_1=stop_in_step:19 start_three_together sg 7 8 "${sg[@]}"
spids=("${together_pids[@]}")
held_for_upload sg "$tmp/sg0.log" 1 "${spids[1]}"   # replica 1 late for round 7 whatever the machine's speed
sg_rejoining() { grep -q 'replica 1 is out of outer step 8 .*; rejoining' "$tmp/sg1.log"; }
wait_until "replica 1 to rejoin in the final syncs" sg_rejoining || die "9: replica 1 did not rejoin"
kill -USR1 "${spids[1]}"
wait_exit "${spids[1]}"
check "stopped in a rejoin in the final syncs: replica 1 exits 76 for SIGUSR1, not done (rc $rc)" test "$rc" -eq 76
check "  its rejoin was stopped, and it says the checkpoint holds θ and a rerun joins at the run's end" \
    sh -c "grep -q 'replica 1 stops while its join waits' '$tmp/sg1.log' &&
           grep -q 'stopped by signal 10 after step 20 = max_steps while rejoining the group in its final syncs: the checkpoint written holds θ' '$tmp/sg1.log'"
check "  it took θ into both fragments and said so (diloco_final_theta)" \
    grep -q '"event":"diloco_final_theta","step":20,.*"fragments":\[0,1\]' "$tmp/sg1/metrics.jsonl"
check "  its final checkpoint holds θ" model_is_theta "$tmp/sg1" 20
# The requeue, at once: it resumes at step 20. It joins at the run's end (round 8 held: it
# takes the state after it, the final syncs over) and writes the finishers' weights, or, where
# its start took longer than the hub held round 8 (a loaded machine), hears that the run is
# over and leaves its checkpoint (θ) as it is: either way exit 0 and θ at step 20.
before=$(tree_digest "$tmp/sg1" | grep -v ' ./metrics.jsonl$')
replica 1 "$tmp/sg1" "${sg[@]}"
wait_exit "$rpid"
rrc=$rc
src=""
for p in "${spids[0]}" "${spids[2]}"; do
    wait_exit "$p"
    src="$src $rc"
done
check "  replicas 0 and 2 exit 0 (rc$src)" test "$src" = " 0 0"
check "  replica 0's final checkpoint holds θ" model_is_theta "$tmp/sg0" 20
sg_requeued() {
    model_is_theta "$tmp/sg1" 20 || return 1
    if said_finished "$tmp/sg1" 20; then
        say "    (it joined at the run's end)"
        cmp -s "$tmp/sg0/step_00000020/model.safetensors" "$tmp/sg1/step_00000020/model.safetensors"
    else
        say "    (it heard that the run is over)"
        grep -q 'the run is over' "$tmp/sg1.log" &&
            test "$(tree_digest "$tmp/sg1" | grep -v ' ./metrics.jsonl$')" = "$before"
    fi
}
check "  run again (the requeue) replica 1 exits 0 (rc $rrc)" test "$rrc" -eq 0
check "  ... its step-20 checkpoint holds θ: replica 0's weights (it joined at the run's end), or unchanged (the run over)" \
    sg_requeued
finish test_diloco_over
