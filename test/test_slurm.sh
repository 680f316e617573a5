# The SLURM job templates (scripts/slurm/, docs/slurm.md) end to end on this machine, with
# stand-ins for sbatch, scontrol and srun (test/slurm/) that run the job, rerun it when it
# requeues itself, and play SLURM's --signal=USR1 once the run has made progress:
#   1. scripts/slurm/generic.sbatch stopped by SIGUSR1 twice (status 76 each time, requeued)
#      finishes with weights byte-identical to an uninterrupted run;
#   2. an error (a bad config key: status 1) is not requeued;
#   3. the watchdog's status 75 every time: requeued MAX_FAILURES − 1 times, then given up;
#   4. the walltime guard: SLURM_JOB_END_TIME 20 s ahead, the run checkpoints and stops in
#      time with status 76;
#   5. SIGUSR1 in the last step, or in the step stop_at_step ends: status 0, not 76; SIGUSR1
#      with a checkpoint that cannot be written: 75 (requeued, counted), not 1; SIGTERM during
#      start-up: 0 after one step, not 143; SIGUSR1 then SIGTERM: 76, not 0;
#      a DiLoCo replica in the extra inner steps of a timed phase (diloco_sync_every_s): SIGUSR1
#      and the walltime guard stop it after the step in progress, not at the phase's end;
#   6. a walltime_end already past: status 1 and one line;
#   7. a glob in the templates' ARGS reaches train_gpt whole.
#   8. requeue.sh when the failure count cannot be kept, and on an out-of-memory kill (253);
#      SIGTERM to requeue.sh while the step runs (SLURM's at the time limit): the step's 76 is
#      still requeued (the script died: no requeue); the count goes when the chain ends (a
#      later manual requeue started at MAX_FAILURES); resume = never stopped by SIGUSR1:
#      status 0 and a line, not 76 (the requeued job refused its own checkpoint);
#   9. diloco-relay.sh started from another directory with a relative secret path: its relay
#      reads the secret and listens; a crashed relay is restarted; SIGTERM to the relay, Ctrl-C,
#      and SIGTERM to the script alone stop it for good; a train_gpt that dies of SIGILL, or
#      crashes at once every time, is not restarted for ever;
#  10. every template hands srun the job's --cpus-per-task.
. "$(dirname "$0")/lib.sh"
tmp_with_processes   # a check that fails leaves no trainer (stopped) or relay running
detect_tcp
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
data="--train_data $tmp/train.bin --val_data $tmp/val.bin --val_tokens 256 --threads 1 --log_every 100000"
[ "$(cd "$(dirname "$TRAIN_GPT")" && pwd)" = "$PWD" ] || die "test_slurm runs the templates' ./train_gpt: run it from the directory of \$TRAIN_GPT"
export PATH="$PWD/test/slurm:$PATH" REQUEUE_STATE_DIR="$tmp"
job() {  # job NAME ARGS...: the generic template through the shims, in $tmp/NAME
    local name=$1; shift
    mkdir -p "$tmp/$name.shim"
    SHIM_DIR="$tmp/$name.shim" SHIM_METRICS="$tmp/$name/metrics.jsonl" CONFIG=test/configs/tiny_test.conf \
        ARGS="$data --out_dir $tmp/$name $*" MAX_FAILURES=3 sbatch scripts/slurm/generic.sbatch >"$tmp/$name.log" 2>&1
}
calls() { grep -c "$2" "$tmp/$1.shim/calls" || true; }

# 1.
"$TRAIN_GPT" test/configs/tiny_test.conf $data --max_steps 1000 --out_dir "$tmp/straight" >/dev/null 2>&1
mkdir -p "$tmp/signalled.shim" && echo 2 >"$tmp/signalled.shim/usr1_left"
SHIM_USR1_STEPS=60 job signalled --max_steps 1000 || true
check "SIGUSR1 twice: the job ran 3 times and requeued itself twice ($(calls signalled '^requeue') requeues)" \
    sh -c "[ $(calls signalled '^start') -eq 3 ] && [ $(calls signalled '^requeue') -eq 2 ] &&
           [ $(calls signalled 'status 0$') -eq 3 ]"
check "... each stop was train_gpt's status 76 (SIGUSR1 after a checkpoint)" \
    test "$(grep -c 'stopped before the walltime with a checkpoint (status 76)' "$tmp/signalled.log")" -eq 2
check "... and the requeued run finished with weights byte-identical to the uninterrupted run" \
    sh -c "cmp -s '$tmp/straight/step_00001000/model.safetensors' '$tmp/signalled/step_00001000/model.safetensors' &&
           cmp -s '$tmp/straight/step_00001000/optimizer.safetensors' '$tmp/signalled/step_00001000/optimizer.safetensors'"

# 2.
job bad --max_steps 1000 --no_such_key 1 || true
check "an error (status 1) is not requeued" \
    sh -c "[ $(calls bad '^start') -eq 1 ] && [ $(calls bad '^requeue') -eq 0 ] && grep -q 'not requeueing' '$tmp/bad.log'"

# 3.
TRAIN_GPT_FAULT=hang_in_step:5 job hung --max_steps 1000 --watchdog_s 1 || true
check "the watchdog's status 75 three times (MAX_FAILURES 3): requeued twice, then given up" \
    sh -c "[ $(calls hung '^start') -eq 3 ] && [ $(calls hung '^requeue') -eq 2 ] &&
           grep -q '3 times in a row (MAX_FAILURES 3): not requeueing' '$tmp/hung.log'"

# 4.
end=$(( $(date +%s) + 20 ))
rc=0
SLURM_JOB_END_TIME=$end "$TRAIN_GPT" test/configs/tiny_test.conf $data --max_steps 100000000 --stop_before_s 2 \
    --out_dir "$tmp/walltime" >"$tmp/walltime.log" 2>&1 || rc=$?
done_at=$(date +%s)
check "SLURM_JOB_END_TIME 20 s ahead: status 76, stopped $(( end - done_at )) s before the end, with a checkpoint" \
    sh -c "[ $rc -eq 76 ] && [ $done_at -le $end ] && ls -d '$tmp'/walltime/step_* >/dev/null &&
           grep -q '\"event\":\"stop\",\"step\":[0-9]*,\"reason\":\"walltime\"' '$tmp/walltime/metrics.jsonl'"
# 5. SIGUSR1 on the last step (the process stops itself in step 9 of 10, 0-based, and is
# signalled there): the run is done, status 0 — it once said 76 and the template requeued a
# finished run. The same at stop_at_step: 0, the stop asked for (a requeue trained on past it).
usr1_in_step() {  # usr1_in_step NAME STEP ARGS...: the run's status, SIGUSR1 sent while it is stopped in STEP
    local name=$1 at=$2; shift 2
    # FILE_LIMIT (KiB): the run's files may not grow past it (its checkpoints then fail).
    TRAIN_GPT_FAULT=stop_in_step:$at sh -c 'ulimit -f "${FILE_LIMIT:-unlimited}"; trap "" XFSZ; exec "$@"' _ \
        "$TRAIN_GPT" test/configs/tiny_test.conf $data --out_dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 &
    local pid=$!
    # In $(...): the caller's pids and exit trap do not see this run, so it is ended here if it
    # never stops (and the status is no number: the caller's check fails).
    if ! wait_until "$name: the run stopped itself in step $at" stopped "$pid" >&2; then
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        echo never_stopped
        return 0
    fi
    kill -USR1 "$pid" && kill -CONT "$pid"
    local rc=0
    wait "$pid" || rc=$?
    echo "$rc"
}
rc=$(usr1_in_step last 9 --max_steps 10)
check "SIGUSR1 in the last step: status 0 (done), not 76 (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && test -d '$tmp/last/step_00000010'"
rc=$(usr1_in_step atstop 4 --max_steps 10 --stop_at_step 5)
check "SIGUSR1 in the step stop_at_step ends: status 0, not 76 (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && test -d '$tmp/atstop/step_00000005'"
rc=$(usr1_in_step early 2 --max_steps 10)
check "... but in an earlier step: status 76, the run is not done (rc $rc)" test "$rc" -eq 76
# SIGTERM while it starts (stopped after the allocation): the handlers are in place, so the
# run stops after its first step with status 0 and a checkpoint — it once died of the signal
# (status 143), which requeue.sh requeued as a failure.
TRAIN_GPT_FAULT=stop_in_start:0 "$TRAIN_GPT" test/configs/tiny_test.conf $data --out_dir "$tmp/start" --max_steps 10 \
    >"$tmp/start.log" 2>&1 &
pid=$!
pids+=($pid)
wait_until "the run stopped itself while starting" stopped "$pid" ||
    die "SIGTERM during start-up: the run did not stop while starting: $(tail -n 1 "$tmp/start.log")"
kill -TERM "$pid" && kill -CONT "$pid"
rc=0
wait "$pid" || rc=$?
check "SIGTERM during start-up: status 0 after one step, with its checkpoint (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && test -d '$tmp/start/step_00000001'"
# SIGUSR1 then SIGTERM (SLURM's --signal, then its SIGTERM at the end or a user's scancel): the
# requeue request stands, status 76; the last signal won (status 0, and requeue.sh ended the
# job chain). The order is made sure of, since the kernel hands two pending signals to a
# process's threads in no order we choose: the run stops itself while it starts, gets SIGUSR1
# and runs on (its handler runs then), stops itself again in its first step (after its
# "start" event), and gets SIGTERM there.
TRAIN_GPT_FAULT=stop_in_start:0,stop_in_step:0 "$TRAIN_GPT" test/configs/tiny_test.conf $data --out_dir "$tmp/usr1term" \
    --max_steps 10 >"$tmp/usr1term.log" 2>&1 &
pid=$!
wait_until "the run stopped itself while starting" stopped "$pid" >/dev/null
kill -USR1 "$pid" && kill -CONT "$pid"
in_first_step() { grep -q '"event":"start"' "$tmp/usr1term/metrics.jsonl" 2>/dev/null && stopped "$pid"; }
wait_until "the run stopped itself in its first step" in_first_step >/dev/null
kill -TERM "$pid" && kill -CONT "$pid"
rc=0
wait "$pid" || rc=$?
check "SIGUSR1, then SIGTERM: status 76 after step 1, the requeue request stands (rc $rc)" \
    sh -c "[ $rc -eq 76 ] && grep -q 'stopped by signal 10 after step 1;' '$tmp/usr1term.log'"
# A checkpoint that cannot be written at such a stop (a file system's hiccup; here: files past
# 64 KiB): status 75, which requeue.sh requeues and counts, from the checkpoint before — it was
# status 1, which ended the job chain for good.
rc=$(FILE_LIMIT=64 usr1_in_step unwritable 2 --max_steps 10)
check "SIGUSR1, and its checkpoint cannot be written: status 75, one line saying why (rc $rc)" \
    sh -c "[ $rc -eq 75 ] && [ \$(grep -c 'error: the checkpoint at step 3 could not be written' '$tmp/unwritable.log') -eq 1 ]"

# 5b. A DiLoCo replica whose phases run on wall time (diloco_sync_every_s, an hour here) trains
# extra inner steps until the phase's time is up: SIGUSR1 in them (the replica stops itself in
# the first) stops it after that step, status 76, and the walltime guard (the job's end 25 s
# ahead) stops it before the end. Both waited for the phase's end (an hour) until 2026-12.
detect_mpi
if [ "$HAVE_MPI" = 1 ]; then
    phases=(--max_steps 20 --diloco_replicas 1 --diloco_transport mpi --diloco_inner_steps 5 --diloco_sync_every_s 3600)
    TRAIN_GPT_FAULT=stop_in_extra_step:4 "$TRAIN_GPT" test/configs/tiny_test.conf $data "${phases[@]}" \
        --out_dir "$tmp/extra" >"$tmp/extra.log" 2>&1 &
    p=$!
    stopped_or_gone() { stopped "$1" || ! kill -0 "$1" 2>/dev/null; }
    wait_until "the replica stopped in its first extra step" stopped_or_gone "$p"
    kill -USR1 "$p"
    kill -CONT "$p"
    gone() { ! kill -0 "$1" 2>/dev/null; }
    wait_until "the replica signalled in its extra steps exits" gone "$p" || kill -9 "$p"
    rc=0
    wait "$p" || rc=$?
    check "SIGUSR1 in the extra inner steps of a timed phase: status 76 at step 5, not the phase's end (rc $rc)" \
        sh -c "[ $rc -eq 76 ] && grep -q 'stopped by signal 10 after step 5' '$tmp/extra.log'"
    end=$(( $(date +%s) + 25 ))
    rc=0
    SLURM_JOB_END_TIME=$end "$TRAIN_GPT" test/configs/tiny_test.conf $data "${phases[@]}" --stop_before_s 2 \
        --out_dir "$tmp/extra_wall" >"$tmp/extra_wall.log" 2>&1 &
    p=$!
    wait_until "the replica in a timed phase stops for the walltime" gone "$p" || kill -9 "$p"
    wait "$p" || rc=$?
    # (Its decision's time left, not the clock at its exit: a loaded machine may take a second
    # or two more to write the checkpoint and exit.)
    left=$(sed -n 's/.*stopped after step [0-9]*: \(-*[0-9]*\) s left.*/\1/p' "$tmp/extra_wall.log")
    check "... and the walltime guard in them: status 76, stopped with ${left:-?} s left (rc $rc)" \
        sh -c "[ $rc -eq 76 ] && [ '${left:--1}' -ge 0 ] &&
               grep -q '\"event\":\"stop\",\"step\":[0-9]*,\"reason\":\"walltime\"' '$tmp/extra_wall/metrics.jsonl'"
fi

# 6. A walltime_end already past: one line, status 1 (not 76): every requeued job inherits it,
# and each trained one step and asked to be requeued.
rc=0
"$TRAIN_GPT" test/configs/tiny_test.conf $data --max_steps 10 --walltime_end 1 --out_dir "$tmp/past" \
    >"$tmp/past.log" 2>&1 || rc=$?
check "walltime_end in the past: status 1 with one line naming it (rc $rc)" \
    sh -c "[ $rc -eq 1 ] && grep -q 'error: walltime_end: the job ends in -[0-9]* s, less than stop_before_s' '$tmp/past.log'"

# 7. A glob in ARGS reaches train_gpt whole (the templates once let the shell expand it: two
# files became a stray argument, one a silent choice of it).
mkdir -p "$tmp/globbed" && cp "$tmp/train.bin" "$tmp/globbed/a.bin" && cp "$tmp/train.bin" "$tmp/globbed/b.bin"
mkdir -p "$tmp/glob.shim"
SHIM_DIR="$tmp/glob.shim" SHIM_METRICS="$tmp/glob/metrics.jsonl" CONFIG=test/configs/tiny_test.conf \
    ARGS="--train_data $tmp/globbed/*.bin --threads 1 --log_every 100000 --max_steps 4 --out_dir $tmp/glob" MAX_FAILURES=3 \
    sbatch scripts/slurm/generic.sbatch >"$tmp/glob.log" 2>&1 || true
check "a glob in ARGS: train_gpt expands it (both shards, 120000 tokens)" \
    sh -c "grep -q 'data: 120000 train tokens' '$tmp/glob.log' '$tmp/glob.shim/'* 2>/dev/null"
# 8. requeue.sh when the failure count cannot be kept (a full or read-only file system — when a
# stop's checkpoint fails too): it read 1 every time and requeued for ever. Now: not requeued,
# the command's status, one line saying why; and a count file that is not a number, the same.
mkdir -p "$tmp/count.shim" && : >"$tmp/count.shim/calls"
rc=0
SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=77 REQUEUE_STATE_DIR="$tmp/no/such/dir" \
    bash scripts/slurm/requeue.sh sh -c 'exit 75' >"$tmp/count.log" 2>&1 || rc=$?
check "requeue.sh: the failure count cannot be written: status 75, not requeued, one line (rc $rc)" \
    sh -c "[ $rc -eq 75 ] && [ $(calls count '^requeue') -eq 0 ] &&
           grep -q 'not requeueing: cannot record the failure count' '$tmp/count.log'"
printf 'x\n' >"$tmp/.train_gpt_failures.78"
rc=0
SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=78 bash scripts/slurm/requeue.sh sh -c 'exit 75' >"$tmp/count2.log" 2>&1 || rc=$?
check "requeue.sh: a failure count that is not a number: status 75, not requeued (rc $rc)" \
    sh -c "[ $rc -eq 75 ] && [ $(calls count '^requeue') -eq 0 ] &&
           grep -q 'the failure count in .* is unreadable' '$tmp/count2.log'"
rc=0
SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=79 bash scripts/slurm/requeue.sh sh -c 'exit 75' >"$tmp/count3.log" 2>&1 || rc=$?
check "requeue.sh: a count it can keep: requeued, the count file says 1 (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && grep -q '^requeue job 79' '$tmp/count.shim/calls' && [ \"\$(cat '$tmp/.train_gpt_failures.79')\" = 1 ]"
# An out-of-memory kill under SLURM's cgroup: srun says 253 (SIG_OOM), not 137. requeue.sh called
# it "an error ... fix it and resubmit", naming neither memory nor --mem. Now: not requeued (it
# would run out again), its status, one line naming host memory and --mem.
rc=0
SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=80 bash scripts/slurm/requeue.sh sh -c 'exit 253' >"$tmp/oom.log" 2>&1 || rc=$?
check "requeue.sh: status 253 (an OOM kill): not requeued, one line naming host memory and --mem (rc $rc)" \
    sh -c "[ $rc -eq 253 ] && ! grep -q '^requeue job 80' '$tmp/count.shim/calls' && [ \$(wc -l <'$tmp/oom.log') -eq 1 ] &&
           grep -q 'ran out of host memory (status 253.*not requeueing.*raise the job.s --mem' '$tmp/oom.log'"
# SLURM's SIGTERM reaches the batch shell (requeue.sh) too, e.g. at the time limit while a
# SIGUSR1 stop writes its checkpoint: the script died (143) and the step's 76 was never acted on.
# The step here waits for a file, so that the SIGTERM surely comes while it runs.
: >"$tmp/count.shim/calls"
rc=0
SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=81 bash scripts/slurm/requeue.sh \
    sh -c "touch '$tmp/step81.started'; while [ ! -e '$tmp/step81.go' ]; do sleep 0.05; done; exit 76" \
    >"$tmp/term.log" 2>&1 &
rq=$!
pids+=("$rq")
step_started() { [ -e "$tmp/step81.started" ]; }
wait_until "requeue.sh's step to start" step_started >/dev/null
kill -TERM "$rq"
touch "$tmp/step81.go"
wait "$rq" || rc=$?
check "requeue.sh gets SIGTERM while its step runs: the step's status 76 is still requeued (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && grep -q '^requeue job 81' '$tmp/count.shim/calls' && grep -q 'SIGTERM: waiting for the step' '$tmp/term.log'"
# The chain's end takes the count with it: a job requeued by hand afterwards (the same id) has
# MAX_FAILURES − 1 requeues again, not none.
for i in 1 2 3; do MAX_FAILURES=3 SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=82 bash scripts/slurm/requeue.sh sh -c 'exit 75' \
    >"$tmp/chain$i.log" 2>&1 || true; done
rc=0
MAX_FAILURES=3 SHIM_DIR="$tmp/count.shim" SLURM_JOB_ID=82 bash scripts/slurm/requeue.sh sh -c 'exit 75' >"$tmp/chain4.log" 2>&1 || rc=$?
check "requeue.sh: the third failure ends the chain and its count; a job requeued by hand then counts from 1 (rc $rc)" \
    sh -c "grep -q '3 times in a row' '$tmp/chain3.log' && grep -q '(1 of MAX_FAILURES 3 in a row)' '$tmp/chain4.log' && [ $rc -eq 0 ]"
# resume = never, stopped by SIGUSR1: the requeued job (the same command) refused its own
# checkpoint ("holds checkpoints of another run") and ended the chain with status 1. Now the
# stop says so and exits 0: nothing is requeued into that error.
rc=$(usr1_in_step never 2 --max_steps 10 --resume never)
check "resume = never, SIGUSR1 in an early step: status 0 (not 76) and a line saying how to go on (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && test -d '$tmp/never/step_00000003' &&
           grep -q 'resume = never: status 0, not 76 (no requeue).*run it with --resume auto' '$tmp/never.log'"

# 9. diloco-relay.sh cds to the repository root (its ./train_gpt, relay.log) and once made a
# relative secret path unreadable from there. A copy in a root of its own, started from another
# directory with the secret given relatively: its relay listens (the secret read), in relay.log.
# Then: the relay killed (SIGKILL, a crash) is restarted; a stop on purpose ends the script, with
# status 0, its relay stopped, no restart: SIGTERM to the relay (which exits 0: the script once
# restarted it), Ctrl-C (SIGINT to the script's process group), SIGTERM to the script alone (it
# once died at once and left its relay running, holding the port). RESTART_DELAY_S=0: no
# restart waits; each check waits for relay.log's lines and the script's end, never a time.
if [ "$HAVE_TCP" = 1 ]; then   # a relay needs OpenSSL: skipped without it, said so
    mkdir -p "$tmp/relay_root/scripts/slurm" "$tmp/elsewhere"
    cp scripts/slurm/diloco-relay.sh "$tmp/relay_root/scripts/slurm/"
    ln -s "$(cd "$(dirname "$TRAIN_GPT")" && pwd)/$(basename "$TRAIN_GPT")" "$tmp/relay_root/train_gpt"
    make_secret "$tmp/elsewhere/my.secret"
    relay_port=$(free_port)
    relay_log=$tmp/relay_root/relay.log
    relay_script() {  # diloco-relay.sh in the background, started from $tmp/elsewhere: relay_job
        # Its own process group (setsid), as in a terminal of its own: Ctrl-C there signals the group.
        (cd "$tmp/elsewhere" && RESTART_DELAY_S=0 exec setsid bash "$tmp/relay_root/scripts/slurm/diloco-relay.sh" \
            "$relay_port" my.secret) >>"$tmp/relay_script.log" 2>&1 &
        relay_job=$!
        pids+=(-"$relay_job")   # its process group: the script's restart loop and its relay
    }
    relay_script
    in_log() { local n; n=$(grep -c "$1" "$relay_log" 2>/dev/null || true); echo "${n:-0}"; }   # lines with $1 in relay.log
    relay_up_or_gone() { [ "$(in_log 'listening on')" -ge "$1" ] || ! kill -0 "$relay_job" 2>/dev/null; }
    WAIT_LIMIT_S=120 wait_until "diloco-relay.sh's relay to listen or the script to end" relay_up_or_gone 1 || true
    check "diloco-relay.sh, a relative secret path from another directory: the relay reads it and listens" \
        grep -q 'listening on' "$relay_log"
    relay_child() { pgrep -P "$relay_job" -x train_gpt || true; }
    kill -9 "$(relay_child)" 2>/dev/null || true
    WAIT_LIMIT_S=120 wait_until "diloco-relay.sh's relay to listen again or the script to end" relay_up_or_gone 2 || true
    check "diloco-relay.sh: the relay killed (SIGKILL: status 137, a crash) is restarted and listens again" \
        sh -c "grep -q 'the relay ended (status 137); restarting in 0 s' '$relay_log' && [ $(in_log 'listening on') -eq 2 ]"
    # stop_relay_script SIGNAL TARGET LISTENING WHAT: SIGNAL to TARGET (group, script or relay) once
    # the relay listens for the LISTENING-th time; the script must end with status 0, its relay
    # stopped, no restart, and one more "not restarting" line.
    stop_relay_script() {
        local sig=$1 target=$2 what=$4 restarts stops relay_pid rc=running relay_left=no
        WAIT_LIMIT_S=120 wait_until "diloco-relay.sh's relay to listen or the script to end" relay_up_or_gone "$3" || true
        restarts=$(in_log 'restarting in')
        stops=$(in_log 'not restarting')
        relay_pid=$(relay_child)
        case $target in
            group) kill "-$sig" -- -"$relay_job" 2>/dev/null || true ;;
            script) kill "-$sig" "$relay_job" 2>/dev/null || true ;;
            relay) kill "-$sig" "${relay_pid:-no_relay}" 2>/dev/null || true ;;
        esac
        gone_or_restarted() { ! kill -0 "$relay_job" 2>/dev/null || [ "$(in_log 'restarting in')" -gt "$restarts" ]; }
        WAIT_LIMIT_S=120 wait_until "diloco-relay.sh to end, or to restart the relay" gone_or_restarted || true
        if ! kill -0 "$relay_job" 2>/dev/null; then rc=0; wait "$relay_job" || rc=$?; fi
        kill -0 "${relay_pid:-no_relay}" 2>/dev/null && relay_left=yes
        check "diloco-relay.sh, $what: the script ends (rc $rc) with its relay (left running: $relay_left), no restart" \
            sh -c "[ -n '$relay_pid' ] && [ '$rc' = 0 ] && [ $relay_left = no ] && [ $(in_log 'restarting in') -eq $restarts ] &&
                   [ $(in_log 'not restarting') -eq $((stops + 1)) ]"
        kill -9 -- -"$relay_job" 2>/dev/null || true
        wait "$relay_job" 2>/dev/null || true
        [ "$rc" = 0 ] && [ "$relay_left" = no ] || cat "$tmp/relay_script.log" "$relay_log" 2>/dev/null
    }
    stop_relay_script TERM relay 2 "SIGTERM to the relay (status 0: stopped on purpose)"
    relay_script
    stop_relay_script INT group 3 "Ctrl-C (SIGINT to its process group)"
    relay_script
    stop_relay_script TERM script 4 "SIGTERM to the script alone (kill PID after nohup ... &)"
    # A train_gpt that cannot run here: SIGILL (a -march=native build from another CPU) ends the
    # script at once with a line; a crash right at start, every time, after 5 in a row. Both were
    # restarted for ever (107 times in 2 s at RESTART_DELAY_S=0).
    for kind in ILL SEGV; do
        mkdir -p "$tmp/crash_$kind/scripts/slurm"
        cp scripts/slurm/diloco-relay.sh "$tmp/crash_$kind/scripts/slurm/"
        printf '#!/bin/sh\nkill -%s $$\n' "$kind" >"$tmp/crash_$kind/train_gpt"
        chmod +x "$tmp/crash_$kind/train_gpt"
        rc=0
        RESTART_DELAY_S=0 timeout 120 bash "$tmp/crash_$kind/scripts/slurm/diloco-relay.sh" "$relay_port" \
            "$tmp/elsewhere/my.secret" >"$tmp/crash_$kind.log" 2>&1 || rc=$?
        restarts=$(grep -c 'restarting in' "$tmp/crash_$kind/relay.log" || true)
        eval "crash_${kind}_rc=$rc crash_${kind}_restarts=$restarts"
    done
    check "diloco-relay.sh: a train_gpt that dies of SIGILL is not restarted (rc $crash_ILL_rc, $crash_ILL_restarts restarts)" \
        sh -c "[ $crash_ILL_rc -eq 132 ] && [ $crash_ILL_restarts -eq 0 ] && grep -q 'make NATIVE=0' '$tmp/crash_ILL.log'"
    check "diloco-relay.sh: one that crashes at once every time, after 5 in a row (rc $crash_SEGV_rc, $crash_SEGV_restarts restarts)" \
        sh -c "[ $crash_SEGV_rc -eq 139 ] && [ $crash_SEGV_restarts -eq 4 ] && grep -q '5 times in a row' '$tmp/crash_SEGV.log'"
else
    say "  skip 9 (diloco-relay.sh's relay): no OpenSSL in this build"
fi
# 10. Every template hands srun the job's --cpus-per-task: Slurm 22.05-23.02's srun no longer
# reads SLURM_CPUS_PER_TASK, and the templates' plain `srun ./train_gpt` ran all OMP_NUM_THREADS
# threads on one CPU. The sbatch stand-in sets SLURM_CPUS_PER_TASK from the template's #SBATCH
# line; the srun stand-in records each step's --cpus-per-task and runs nothing (SHIM_NO_RUN).
for t in scripts/slurm/*.sbatch; do
    name=cpus_$(basename "$t" .sbatch)
    want=$(sed -n 's/^#SBATCH --cpus-per-task=\([0-9][0-9]*\).*/\1/p' "$t" | head -n 1)
    mkdir -p "$tmp/$name.shim"
    SHIM_DIR="$tmp/$name.shim" SHIM_NO_RUN=1 REPLICA_ID=0 sbatch "$t" >"$tmp/$name.log" 2>&1 || true
    got=$(sed -n 's/^srun cpus-per-task //p' "$tmp/$name.shim/calls" 2>/dev/null | tr '\n' ' ' || true)
    got=${got% }
    check "$(basename "$t"): its srun gets the job's --cpus-per-task=${want:-?} (got: ${got:-no srun})" \
        test "$got" = "${want:-?}"
done
finish test_slurm
