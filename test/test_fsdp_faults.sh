# A rank of an FSDP job that dies or hangs (issue #14 part 7; docs/fsdp.md "When a rank dies"):
#  1. One rank of an np 2 job stopped (SIGSTOP: hung, the case no launcher catches): the other
#     exits within comm_timeout_s with the one-line error naming itself and the collective; the
#     job ends non-zero, nothing is left running.
#  2. The same command again resumes from the last checkpoint (the job requeued) and runs on.
#  3. One rank killed (kill -9): the job ends non-zero, every rank gone (mpirun ends the others;
#     under a launcher that does not, the timeout of 1. does).
#  4. The ranks read different train data (rank 1's copy holds one more shard): they would split
#     rows of different orders, overlapping; every rank stops at its start with one line naming
#     rank 1, before any step.
#  5. A rank that fails at its start under a launcher that lets the others run on: the others
#     end after comm_timeout_s with one line, they do not hang.
#  6. More MPI ranks than DiLoCo replicas: the line that says so.
#  7. Ranks that see different checkpoints in out_dir resume from the same one (rank 0's list).
#  8. SIGUSR1 on one rank, SIGTERM on the other: the job stops with status 76 (a requeue).
#  9. DiLoCo over mpi, one replica stopped (SIGSTOP) mid-run, under a launcher that lets the
#     others run on: the other exits within comm_timeout_s, status 75, naming the collective
#     (it waited in the step's stop agreement for ever with watchdog_s 0).
# 10. What a job's ranks print: NaN gradients on rank 1 (two steps, max_bad_steps 2) skip the
#     steps and roll back; each skip and the rollback is said once, by rank 0 (every rank said
#     it: 64 lines a step at 64 ranks); every line on stderr names its rank, from the first
#     (the device's and the threads' lines came from every rank untagged, before the job was
#     set up); the rollback event's skipped_rows counts the job's rows (skipped_batches is each
#     process's). Several DiLoCo replicas over mpi: every line, step lines too, names its
#     replica (two "step 5/10" lines with different losses, neither saying whose), and so does
#     each replica's banner (two "train_gpt | model:" blocks interleaved).
# The bounds wait for events (a checkpoint directory, the job's exit); the only clock is the
# deadline for the job's end after the fault: comm_timeout_s (5 s) plus a margin of 60 s for
# a loaded machine — a hang (the bug this guards against) never ends.
. "$(dirname "$0")/lib.sh"
require_mpi
tmp_with_processes
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
args=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 1000000 --ckpt_every 5 --ckpt_keep 2
    --log_every 1 --threads 1 --comm_timeout_s 5 --out_dir "$tmp/run")

wait_within() {  # wait_within WHAT SECONDS COMMAND...: lib.sh's wait_until with this deadline, or the test fails
    local what=$1 limit=$2
    shift 2
    WAIT_LIMIT_S=$limit wait_until "$what" "$@" >/dev/null || die "waited ${limit}s for: $what"
}
latest_ckpt() { ls -d "$tmp"/run/step_* 2>/dev/null | sort | tail -n 1; }
job_gone() { ! kill -0 "$job" 2>/dev/null; }
no_rank_left() { ! pgrep -f -- "--out_dir $tmp/run" >/dev/null; }

# 1. A hung rank.
"${MPIRUN[@]}" 2 "$TRAIN_GPT" "${args[@]}" >"$tmp/hung.log" 2>&1 &
job=$!
pids+=("$job")
wait_within "the first checkpoint" 180 eval '[ -n "$(latest_ckpt)" ]'
wait_within "rank 1's pid" 30 rank_pid "$job" 1
victim=$(rank_pid "$job" 1)
kill -STOP "$victim"
t0=$SECONDS
wait_within "the job to end after rank 1 hung" 65 job_gone
rc=0
wait "$job" || rc=$?
took=$((SECONDS - t0))
kill -9 "$victim" 2>/dev/null || true
say "  (rank 1 stopped: the job ended after ${took}s, rc $rc)"
check "hung rank: the job ends with status 75, which requeue.sh requeues (rc $rc)" test "$rc" -eq 75
check "hung rank: rank 0 says it waited past comm_timeout_s for the others" \
    grep -q 'comm: rank 0 of 2 waited [0-9]* s for the other ranks (.*comm_timeout_s = 5); exiting with status 75' "$tmp/hung.log"
wait_within "every rank to be gone" 30 no_rank_left
grep -m1 'comm: rank 0' "$tmp/hung.log" || cat "$tmp/hung.log"

# 2. Requeued: the same command resumes from the last checkpoint.
saved=$(latest_ckpt)
saved_step=$((10#${saved##*step_}))
"${MPIRUN[@]}" 2 "$TRAIN_GPT" "${args[@]}" --stop_at_step $((saved_step + 5)) >"$tmp/requeue.log" 2>&1
check "requeued: resumes from step $saved_step and stops cleanly 5 steps later" \
    sh -c "grep -q \"resuming from '.*step_0*$saved_step' at step $saved_step\" '$tmp/requeue.log' &&
           grep -q 'stopped after step $((saved_step + 5))' '$tmp/requeue.log'"

# 3. A killed rank.
"${MPIRUN[@]}" 2 "$TRAIN_GPT" "${args[@]}" >"$tmp/killed.log" 2>&1 &
job=$!
pids+=("$job")
wait_within "a checkpoint after the requeued one" 180 eval '[ "$(latest_ckpt)" != "$tmp/run/step_$(printf %08d $((saved_step + 5)))" ]'
wait_within "rank 1's pid" 30 rank_pid "$job" 1
kill -9 "$(rank_pid "$job" 1)"
t0=$SECONDS
wait_within "the job to end after rank 1 was killed" 65 job_gone
rc=0
wait "$job" || rc=$?
say "  (rank 1 killed: the job ended after $((SECONDS - t0))s, rc $rc)"
check "killed rank: the job ends non-zero" test "$rc" -ne 0
wait_within "every rank to be gone" 30 no_rank_left
check "killed rank: no rank left running" no_rank_left

# 4. Ranks on different data.
"$TOOL" shard "$tmp/more.bin" 64 0 5000 13
rc=0
"${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${args[@]}") --max_steps 4 --out_dir '$tmp/data' \
    --train_data \"\$([ \$OMPI_COMM_WORLD_RANK = 0 ] && echo '$tmp/train.bin' || echo '$tmp/train.bin,$tmp/more.bin')\"" \
    >"$tmp/data.log" 2>&1 || rc=$?
check "ranks on different data: the job ends non-zero (status $rc)" test "$rc" -ne 0
check "... each rank says, in one line, that rank 1 reads other data" \
    test "$(grep -c 'error: train_data: rank 1 of the job reads other data than rank 0' "$tmp/data.log")" = 2
check "... before any step" sh -c "! grep -q '^step ' '$tmp/data.log'"

# 5. A rank that fails at its start under a launcher that lets the others run on (srun without
# --kill-on-bad-exit; here mpirun told not to abort on a non-zero exit): DiLoCo over mpi, rank 1
# refuses its diloco_replica_id. It exited alone and rank 0 waited in the start's collective for
# ever; now that collective waits comm_timeout_s (5 s here), as a job's do, and rank 0 says so.
# The deadline is a hang's, not a time to wait. (mpirun told so exits 0 whatever its ranks'
# statuses: the lines tell.)
rc=0
t0=$SECONDS
timeout 300 "${MPIRUN[@]}" 2 --mca orte_abort_on_non_zero_status 0 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${args[@]}") \
    --max_steps 20 --diloco_replicas 2 --diloco_replica_id 0 --diloco_transport mpi --diloco_inner_steps 5 \
    --out_dir '$tmp/abort/'\$OMPI_COMM_WORLD_RANK" >"$tmp/abort.log" 2>&1 || rc=$?
check "a rank fails at its start, the launcher lets the other run on: the job ends (rc $rc, $((SECONDS - t0)) s), not a hang" \
    sh -c "[ $rc -ne 124 ] && grep -q 'error: diloco_replica_id: 0, but this process is MPI rank 1' '$tmp/abort.log' &&
           grep -q 'rank 0 of 2 waited [0-9]* s for the other ranks (the replicas. run fingerprints)' '$tmp/abort.log'"
# 6. More MPI ranks than DiLoCo replicas: one line saying so, not an internal error of the
# data loader (rank 2 took its rank as its replica id, and opened its data before the check).
rc=0
timeout 300 "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${args[@]}") --max_steps 20 --diloco_replicas 2 \
    --diloco_transport mpi --diloco_inner_steps 5 --out_dir '$tmp/wide/'\$OMPI_COMM_WORLD_RANK" >"$tmp/wide.log" 2>&1 || rc=$?
check "3 MPI ranks for 2 replicas: the line that says so, no internal error (rc $rc)" \
    sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && ! grep -q 'internal error' '$tmp/wide.log' &&
           grep -q 'error: diloco_replicas: 2, but this process is MPI rank 2: the world has more ranks than replicas' '$tmp/wide.log'"
# 7. The ranks see different checkpoints in out_dir (a shared file system's cache right after a
# save or a prune shows nodes different directories; played here by rank 1 given a copy of
# out_dir without the newest one): they take rank 0's listing and load the same checkpoint, the
# one every rank can read. Each listed its own: rank 0 resumed from step 10, rank 1 read its
# pieces of step 5. (The saves after it fail, as the two out_dirs differ: not the point here.)
mpi_job() {  # mpi_job LOG OUT_DIR_RANK0 OUT_DIR_OTHERS [--key value]...
    local log=$1 a=$2 b=$3
    shift 3
    timeout 300 "${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${args[@]}" "$@") \
        --out_dir \"\$([ \$OMPI_COMM_WORLD_RANK = 0 ] && echo '$a' || echo '$b')\"" >"$log" 2>&1
}
mpi_job "$tmp/views_a.log" "$tmp/views_a" "$tmp/views_a" --max_steps 10 || true
cp -r "$tmp/views_a" "$tmp/views_b" && rm -rf "$tmp/views_b/step_00000010"
mpi_job "$tmp/views.log" "$tmp/views_a" "$tmp/views_b" --max_steps 15 || true
check "ranks that list different checkpoints resume from the same one, which all can read" \
    grep -q "rank 0: resuming from '$tmp/views_a/step_00000005' at step 5" "$tmp/views.log"
# 8. The ranks stop together on the signal that asks most: rank 0 gets SIGUSR1 (a requeue
# request), rank 1 SIGTERM, each while it has stopped itself in step 3. Their agreement took
# the higher signal number (SIGTERM, 15 > 10): the job exited 0 and requeue.sh ended the chain;
# now SIGUSR1 wins and every rank exits 76.
TRAIN_GPT_FAULT=stop_in_step:2 "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${args[@]}" --max_steps 10 --out_dir "$tmp/signals" \
    >"$tmp/signals.log" 2>&1 &
job=$!
pids+=("$job")
both_stopped() {
    local r p
    for r in 0 1; do
        p=$(rank_pid "$job" $r) && stopped "$p" || return 1
    done
}
wait_within "both ranks to stop themselves in step 3" 180 both_stopped
r0=$(rank_pid "$job" 0) && r1=$(rank_pid "$job" 1)
kill -USR1 "$r0" && kill -TERM "$r1" && kill -CONT "$r0" "$r1"
wait_within "the job to end" 65 job_gone
rc=0
wait "$job" || rc=$?
check "SIGUSR1 on rank 0, SIGTERM on rank 1: the job stops after step 3 with status 76 (rc $rc)" \
    sh -c "[ $rc -eq 76 ] && grep -q 'stopped by signal 10 after step 3;' '$tmp/signals.log' &&
           test -d '$tmp/signals/step_00000003'"
# 9. A hung DiLoCo replica (mpi transport), the launcher told not to end the job on a rank's
# exit: rank 0 waits at most comm_timeout_s (5 s) in a step's or an exchange's collective.
rm -rf "$tmp/dhung"
"${MPIRUN[@]}" 2 --mca orte_abort_on_non_zero_status 0 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${args[@]}") \
    --diloco_replicas 2 --diloco_transport mpi --diloco_inner_steps 5 --watchdog_s 0 \
    --out_dir '$tmp/dhung/'\$OMPI_COMM_WORLD_RANK" >"$tmp/dhung.log" 2>&1 &
job=$!
pids+=("$job")
wait_within "replica 1's first checkpoint" 180 eval '[ -n "$(ls -d "$tmp"/dhung/1/step_* 2>/dev/null)" ]'
wait_within "rank 1's pid" 30 rank_pid "$job" 1
victim=$(rank_pid "$job" 1)
r0=$(rank_pid "$job" 0)
kill -STOP "$victim"
t0=$SECONDS
rank0_gone() { ! kill -0 "$r0" 2>/dev/null; }
wait_within "rank 0 to give up on the hung replica" 65 rank0_gone
took=$((SECONDS - t0))
kill -9 "$victim" 2>/dev/null || true
kill "$job" 2>/dev/null || true   # mpirun told not to abort waits on after a rank's SIGKILL
wait "$job" 2>/dev/null || true
check "hung DiLoCo replica (mpi): rank 0 exits after ${took}s with status 75, naming the collective it waited in" \
    grep -Eq 'comm: rank 0 of 2 waited [0-9]+ s for the other ranks \((the replicas. stop agreement, at a step|the replicas. payload layouts, at an outer step|the replicas. tokens, at an outer step|the outer gradients. segments, at an outer step|the means. segments, at an outer step)\).*comm_timeout_s = 5\); exiting with status 75' "$tmp/dhung.log"

# 10. What a job's ranks print.
rm -rf "$tmp/lines"
lines_args=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 12 --ckpt_every 5 --max_bad_steps 2
    --max_rollbacks 1 --threads 1 --device auto --out_dir "$tmp/lines")
# (The fault comes back after the rollback, at the same steps: the second pass ends the run,
# max_rollbacks 1, with an error from each rank.)
"${MPIRUN[@]}" 1 "$TRAIN_GPT" "${lines_args[@]}" : -np 1 -x TRAIN_GPT_FAULT=nan_grad:6,nan_grad:7 "$TRAIN_GPT" "${lines_args[@]}" \
    >"$tmp/lines.log" 2>&1 || true
grep -q 'error: stopping: 2 steps in a row were skipped' "$tmp/lines.log" ||
    die "np 2, NaN on rank 1: not the guard's end: $(grep -m1 'error:' "$tmp/lines.log")"
check "np 2: the device line once, from rank 0 ($(grep -c 'device = auto' "$tmp/lines.log") lines)" \
    sh -c "[ \$(grep -c 'device = auto' '$tmp/lines.log') -eq 1 ] && grep -q '^train_gpt: rank 0: device = auto' '$tmp/lines.log'"
check "np 2: every line on stderr names its rank" \
    sh -c "! grep '^train_gpt: ' '$tmp/lines.log' | grep -v '^train_gpt: rank [01]: '"
check "np 2: each skip said once a pass, by rank 0 (step 7: $(grep -c 'step 7: .*update skipped' "$tmp/lines.log") lines in 2 passes)" \
    sh -c "[ \$(grep -c 'step 7: .*update skipped' '$tmp/lines.log') -eq 2 ] && [ \$(grep -c 'step 8: .*update skipped' '$tmp/lines.log') -eq 2 ] &&
           ! grep -q '^train_gpt: rank 1: warning: step' '$tmp/lines.log'"
check "np 2: the rollback said once, with the job's rows" \
    sh -c "[ \$(grep -c 'rolled back to' '$tmp/lines.log') -eq 1 ] &&
           grep -q 'skipping the 3 micro-batches taken by each of the 2 processes since it (epoch 0 batch 5 up to epoch 0 batch 8; 24 rows of 32 tokens in all)' '$tmp/lines.log'"
check "np 2: the rollback event's skipped_rows is the job's (3 micro-batches x 2 processes x 4 rows)" \
    grep -q '"event":"rollback",.*"skipped_batches":3,"rollbacks":1,"skipped_rows":24' "$tmp/lines/metrics.jsonl"
# A NaN gradient on replica 1 (its own data: its own decision, its own warning; the one-line
# guard messages once printed only where the job-wide rank was 0, i.e. by replica 0 alone).
dlines_args=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 10 --threads 1 --log_every 5
    --diloco_replicas 2 --diloco_transport mpi --diloco_inner_steps 5 --max_bad_steps 3 --out_dir "$tmp/dlines")
"${MPIRUN[@]}" 1 "$TRAIN_GPT" "${dlines_args[@]}" : -np 1 -x TRAIN_GPT_FAULT=nan_grad:6 "$TRAIN_GPT" "${dlines_args[@]}" \
    >"$tmp/dlines.log" 2>&1 || die "2 DiLoCo replicas over mpi: $(grep -m1 'error:' "$tmp/dlines.log")"
check "DiLoCo over mpi: replica 1 says its own skipped step" \
    grep -q '^train_gpt: replica 1: warning: step 7: .*update skipped' "$tmp/dlines.log"
check "DiLoCo over mpi: each replica's step lines name it" \
    sh -c "grep -q '^replica 0 | step *5/10 | loss' '$tmp/dlines.log' && grep -q '^replica 1 | step *5/10 | loss' '$tmp/dlines.log' &&
           grep -q '^replica 1 | outer *1 | step' '$tmp/dlines.log' && ! grep -q '^step \|^outer ' '$tmp/dlines.log'"
check "DiLoCo over mpi: each replica's banner (model, plan, diloco lines) names it" \
    sh -c "grep -q '^train_gpt | replica 1 | model: ' '$tmp/dlines.log' && grep -q '^train_gpt | replica 0 | diloco: replica 0 of 2' '$tmp/dlines.log' &&
           ! grep '^train_gpt | ' '$tmp/dlines.log' | grep -v '^train_gpt | replica [01] | '"
check "DiLoCo over mpi: every line on stderr names its replica" \
    sh -c "grep -q '^train_gpt: replica 1: checkpoint step_00000010 written' '$tmp/dlines.log' &&
           ! grep '^train_gpt: ' '$tmp/dlines.log' | grep -v '^train_gpt: replica [01]: '"

# A rank that cannot have its device (device = cuda where there is no usable GPU) fails with the
# others, after the job's start, each rank in one line: alone before MPI's start, it left the
# others blocked there (no deadline), under srun without --kill-on-bad-exit until the walltime.
rc=0
dev_args=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 4 --threads 1 --comm_timeout_s 120
    --out_dir "$tmp/devices")
timeout 300 "${MPIRUN[@]}" 1 "$TRAIN_GPT" "${dev_args[@]}" --device cuda : -np 1 "$TRAIN_GPT" "${dev_args[@]}" --device cpu \
    >"$tmp/devices.log" 2>&1 || rc=$?
check "a rank without its device: every rank exits 1 (rc $rc) after the start, each saying why" \
    sh -c "[ $rc -eq 1 ] && grep -q '^train_gpt: rank 0: error: device: cuda was asked for, but' '$tmp/devices.log' &&
           grep -q '^train_gpt: rank 1: error: device: another rank of the job cannot use its device' '$tmp/devices.log'"
finish test_fsdp_faults
