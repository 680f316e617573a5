#!/bin/bash
# scripts/slurm/requeue.sh — runs one train_gpt job step and decides, from its exit status,
# whether the SLURM job requeues itself (docs/slurm.md). Every template ends with it:
#
#   exec scripts/slurm/requeue.sh srun --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" ./train_gpt CONFIG [--key value]...
#
#   status 0   finished (max_steps reached) or stopped on purpose: done, no requeue
#   status 76  stopped early with a checkpoint (SLURM's --signal=USR1 before the walltime,
#              or train_gpt's own walltime guard): requeue; the failure count starts over
#   status 75  the watchdog ended a run that made no progress (a hung collective, file
#              system or GPU), or the step died from a signal (status 129-159: a node
#              failure, a kill): requeue, until the MAX_FAILURES-th such failure in a row,
#              which is not requeued
#   status 253 SLURM killed the step for using more host memory than the job has (its
#              cgroup's OOM kill, which srun reports as 253, not as SIGKILL): never requeue —
#              it would run out again; raise --mem or make the run need less
#   other      an error (a bad config, data or checkpoint: exit status 1): never requeue —
#              it would fail the same way again
#
# Environment: MAX_FAILURES (the templates set it; default 3), SLURM_JOB_ID and
# SLURM_SUBMIT_DIR (set by SLURM). The count of failures in a row is kept in
# REQUEUE_STATE_DIR (default $SLURM_SUBMIT_DIR: shared storage, since a requeued job may run
# on another node)/.train_gpt_failures.$SLURM_JOB_ID (a requeued job keeps its id).
set -u
max_failures=${MAX_FAILURES:-3}
case $max_failures in
    '' | *[!0-9]*) echo "requeue.sh: MAX_FAILURES must be a whole number, not '$max_failures'" >&2; exit 1 ;;
esac
job=${SLURM_JOB_ID:?requeue.sh runs inside a SLURM job}
count_file="${REQUEUE_STATE_DIR:-${SLURM_SUBMIT_DIR:-.}}/.train_gpt_failures.$job"
say() { echo "requeue.sh: $(date '+%F %T') job $job: $*"; }

# SLURM's SIGTERM (the time limit, after --signal=USR1 and a checkpoint slower than its lead;
# or scancel) reaches this shell too: it killed the script while the step was writing its
# checkpoint, and the step's status 76 was never acted on. Trapped, it waits for the step's own
# status (bash runs the trap once the step has ended); SIGKILL follows after SLURM's KillWait.
trap 'say "SIGTERM: waiting for the step to end (a stop by SIGUSR1 still requeues)"' TERM
"$@"
rc=$?
trap - TERM
# The chain ends here (its last job): the count goes, or a later `scontrol requeue` of the same
# job id by hand would start from it (its first failure the MAX_FAILURES-th).
give_up() {
    rm -f "$count_file" 2>/dev/null
    exit "$1"
}
requeue() {
    say "$1; requeueing"
    if ! scontrol requeue "$job"; then
        say "scontrol requeue failed; resubmit by hand (the checkpoint is in place)"
        exit 1
    fi
    exit 0
}
case $rc in
    0)
        rm -f "$count_file"
        say "train_gpt finished"
        exit 0 ;;
    76)
        rm -f "$count_file"
        requeue "train_gpt stopped before the walltime with a checkpoint (status 76)" ;;
    75|129|13[0-9]|14[0-9]|15[0-9])
        # The count bounds the requeues: unreadable or unwritable (a full or read-only file
        # system, exactly when a stop's checkpoint fails), it would read 1 every time and the
        # job would requeue for ever — so then the job is not requeued.
        prev=0
        if [ -e "$count_file" ]; then
            prev=$(cat "$count_file" 2>/dev/null) || prev=
            case $prev in
                '' | *[!0-9]*)
                    say "train_gpt failed with status $rc; not requeueing: the failure count in $count_file is unreadable ('$prev')"
                    exit "$rc" ;;
            esac
        fi
        n=$((prev + 1))
        if ! { echo "$n" >"$count_file.tmp" && mv -f "$count_file.tmp" "$count_file"; } 2>/dev/null; then
            rm -f "$count_file.tmp" 2>/dev/null
            say "train_gpt failed with status $rc; not requeueing: cannot record the failure count in $count_file (a full or read-only file system?), so the requeues would have no bound"
            exit "$rc"
        fi
        if [ "$n" -ge "$max_failures" ]; then
            say "train_gpt failed with status $rc, $n times in a row (MAX_FAILURES $max_failures): not requeueing"
            give_up "$rc"
        fi
        requeue "train_gpt failed with status $rc ($n of MAX_FAILURES $max_failures in a row)" ;;
    253)
        say "train_gpt ran out of host memory (status 253: SLURM's memory limit, an OOM kill): not requeueing, it would run out again; raise the job's --mem (or --mem-per-gpu), or lower the run's memory plan (./train_gpt plan CONFIG)"
        give_up "$rc" ;;
    *)
        say "train_gpt stopped with an error (status $rc): not requeueing; fix it and resubmit"
        give_up "$rc" ;;
esac
