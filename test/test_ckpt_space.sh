# Checkpoints on a disk with room for ckpt_keep + 1 of them (a quota sized for the keep-then-prune
# design: the new checkpoint commits before the oldest goes), a tmpfs of 3.5 checkpoints here:
#  1. A save killed before its commit (a walltime's SIGKILL at a stop save) left a whole
#     checkpoint's .tmp-step_12; the requeued run resumes from step 10, so no later save is of
#     step 12. The next save removes the leftover before it writes, saying so, and every save
#     commits. Until 2026-12 the leftover went only after a later commit: on such a disk every
#     save failed with ENOSPC, the last one too (exit 1), and each requeue retrained the same
#     steps. One process, and a job of 2 ranks (rank 0 removes it while rank 1 waits).
#  2. A job's save that fails for want of space: rank 0 removes its unfinished directory before
#     any rank returns. With slow_ckpt_cleanup rank 0 takes 2 s for that (a big directory on
#     a slow file system); rank 1 once returned at once and fail()ed while the directory was
#     still there, and a launcher that ends a job at its first failed process (srun
#     --kill-on-bad-exit) then killed rank 0 amid the removal, leaving the directory (and, on a
#     requeue, the failure of 1.). Checked: when rank 1 says its error, the directory is gone.
# The tmpfs is mounted here: root only (skipped, said so, otherwise); the trap unmounts it.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
mounts=()
job=
trap '[ -z "$job" ] || { kill -9 "$job" 2>/dev/null; wait "$job" 2>/dev/null || true; }
      for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
      rm -rf "$tmp"' EXIT
detect_mpi
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 10
    --val_tokens 256 --log_every 100 --ckpt_every 5 --threads 1)
run() {  # run NP OUT_DIR LOG [--key value]...: exit status in rc
    local np=$1 out=$2 log=$3; shift 3
    rc=0
    if [ "$np" = 1 ]; then "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$log" 2>&1 || rc=$?
    else "${MPIRUN[@]}" "$np" "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$log" 2>&1 || rc=$?; fi
}
leftovers() { (cd "$1" && ls -d .tmp-* 2>/dev/null | tr '\n' ' ') || true; }   # its .tmp-* directories

# A checkpoint's size on a tmpfs (its pages), from one on this disk.
run 1 "$tmp/size" "$tmp/size.log" --max_steps 5
[ -d "$tmp/size/step_00000005" ] || die "the sizing run wrote no checkpoint: $(tail -n 1 "$tmp/size.log")"
ckpt_kib=$(du -sk "$tmp/size/step_00000005" | cut -f1)
small_disk() {  # small_disk DIR: a tmpfs of 3.5 checkpoints (+ metrics.jsonl, .lock) at DIR
    mkdir -p "$1"
    mount -t tmpfs -o size=$((ckpt_kib * 7 / 2 + 64))k tmpfs "$1" 2>/dev/null || return 1
    mounts+=("$1")
}
if ! small_disk "$tmp/d1"; then
    say "  skip (cannot mount a tmpfs: not root, or no permission in this container)"
    exit 0
fi

nps=(1)
[ "$HAVE_MPI" = 1 ] && nps+=(2) || say "  skip the job of 2 ranks: no mpirun or no MPI in this build"

# 1.
for np in "${nps[@]}"; do
    [ "$np" = 1 ] || small_disk "$tmp/d$np" || die "cannot mount a second tmpfs"
    out="$tmp/d$np/run"
    run "$np" "$out" "$tmp/first$np.log" --ckpt_keep 2 --max_steps 30 --stop_at_step 10
    [ -d "$out/step_00000010" ] || die "np $np: no step_00000010 to resume from: $(tail -n 1 "$tmp/first$np.log")"
    cp -r "$out/step_00000010" "$out/.tmp-step_00000012"   # killed just before its rename
    run "$np" "$out" "$tmp/again$np.log" --ckpt_keep 2 --max_steps 30
    check "np $np: with a checkpoint-sized .tmp-step_00000012 left, the run on a disk for 3 checkpoints ends well (rc $rc)" \
        test "$rc" = 0
    check "np $np: ... every save commits: steps 15 to 30, the last two kept ($(ls "$out" | grep step_ | tr '\n' ' '))" \
        sh -c "test -d '$out/step_00000025' && test -d '$out/step_00000030' && ! grep -q 'No space left' '$tmp/again$np.log'"
    check "np $np: ... the leftover is gone before the first save, with a warning naming it (left: $(leftovers "$out"))" \
        sh -c "[ -z '$(leftovers "$out")' ] && grep -q \"removing '$out/.tmp-step_00000012', a checkpoint that was never finished\" '$tmp/again$np.log'"
done

# 2.
if [ "$HAVE_MPI" = 1 ]; then
    small_disk "$tmp/full" || die "cannot mount a third tmpfs"
    out="$tmp/full/run"
    TRAIN_GPT_FAULT=slow_ckpt_cleanup:20 "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --out_dir "$out" --ckpt_keep 0 \
        --max_steps 20 >"$tmp/full.log" 2>&1 &
    job=$!
    rank1_failed() { grep -q 'rank 1: error: the checkpoint at step 20 could not be written' "$tmp/full.log"; }
    done_or_failed() { rank1_failed || ! kill -0 "$job" 2>/dev/null; }
    wait_until "rank 1's error" done_or_failed || true
    at_error=$(leftovers "$out")
    rc=0; wait "$job" || rc=$?; job=
    check "np 2: the fourth checkpoint does not fit: the job fails (rc $rc), rank 1 says so" \
        sh -c "[ $rc -ne 0 ] && grep -q 'checkpoint at step 20 failed' '$tmp/full.log' && grep -q 'rank 1: error: the checkpoint at step 20' '$tmp/full.log'"
    check "np 2: ... when rank 1 said so, rank 0 had removed the unfinished directory, though it took 2 s (left then: $at_error)" \
        test -z "$at_error"
    check "np 2: ... and it is gone at the end (left: $(leftovers "$out"))" test -z "$(leftovers "$out")"
    check "np 2: ... the checkpoints before it are untouched" \
        sh -c "test -d '$out/step_00000015' && ! test -e '$out/step_00000020'"
fi
finish test_ckpt_space
