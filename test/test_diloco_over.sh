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
#   4. Sharded replicas (MPI; skipped without): 2 shards x 2 copies each (relay --shards 2),
#      part 1's story: every rank of the returning replica stops (its shards' groups both say
#      the run is over; its second copy follows the first), exit 0, checkpoint unchanged.
#   5. Replicas dropped from the final syncs (two fragments): no round past the final syncs,
#      and every replica that finished holds the same θ and weights.
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
    "$TRAIN_GPT" "${common[@]}" --diloco_rendezvous "127.0.0.1:$port" --diloco_replica_id "$id" --out_dir "$out" \
        "$@" >>"$out.log" 2>&1 &
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
start_relay rejoin 1
late=(--max_steps 20 --ckpt_every 10 --diloco_min_replicas 2)
replica 0 "$tmp/late0" "${late[@]}"
r0=$rpid
TRAIN_GPT_FAULT=diloco_late:3 replica 1 "$tmp/late1" "${late[@]}"
r1=$rpid
wait_exit "$r0"
check "replica 0 closes the last round alone and finishes (rc $rc)" test "$rc" -eq 0
wait_exit "$r1"
check "replica 1, late for the last exchange, exits 0 (rc $rc)" test "$rc" -eq 0
check "replica 1 was evicted and found the run over at its rejoin" \
    sh -c "grep -q 'too late' '$tmp/late1.log' && grep -q 'the run is over' '$tmp/late1.log'"
check "replica 1 stopped after step 20 with the stop event run_over and a checkpoint" stopped_over "$tmp/late1" 20

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
start_relay finals 1
finals=(--max_steps 40 --ckpt_every 0 --batch_size 4 --diloco_replicas 3 --diloco_inner_steps 4
    --diloco_fragments 2 --diloco_overlap_steps 0 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9
    --diloco_plain_in_decay 0 --diloco_decay_inner_steps 0)
fpids=()
for r in 0 1 2; do
    fault=stop_in_start:0
    [ "$r" = 1 ] && fault=$fault,diloco_late:20
    [ "$r" = 2 ] && fault=$fault,diloco_late:19
    TRAIN_GPT_FAULT=$fault replica "$r" "$tmp/fin$r" "${finals[@]}"
    fpids+=("$rpid")
done
stopped() { [ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null)" = T ]; }
all_stopped() { for p in "${fpids[@]}"; do stopped "$p" || return 1; done; }
wait_until "the three replicas to stop themselves in their start-up" all_stopped ||
    die "5: the replicas did not all stop in their start-up"
kill -CONT "${fpids[@]}"
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
finish test_diloco_over
