# Bit-exact resume and crash safety. The reference is one straight run of 20 steps
# (shuffled data, 2 micro-batches per step, validation, checkpoints every 5 steps). Each
# interrupted run must end with the same per-step losses and byte-identical final
# model.safetensors and optimizer.safetensors:
#   stop_at_step 8, then resume;  SIGUSR1 mid-run, then resume;
#   SIGKILL halfway through writing the step-10 checkpoint (fault injection), then resume
#   from step 5;  kill -9 from outside at an arbitrary moment, then resume.
# And TRAIN_GPT_NO_FINAL_CHECKPOINT=1 (benchmarks): no checkpoint at max_steps, but one
# where ckpt_every falls on it and at stop_at_step. A resume on other train data warns (10).
. "$(dirname "$0")/lib.sh"
tmp_with_processes   # a check that fails leaves no trainer running (one of them stopped)
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 10
    --val_tokens 256 --grad_accum 2 --shuffle 1 --ckpt_every 5 --ckpt_keep 0 --log_every 100)
run() {  # run OUT_DIR [--key value]...
    local out=$1; shift
    "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@"
}
same_as() {  # same_as REFERENCE_DIR OUT_DIR FINAL_STEP_DIR_NAME
    [ "$(loss_table "$1/metrics.jsonl")" = "$(loss_table "$2/metrics.jsonl")" ] &&
        cmp -s "$1/$3/model.safetensors" "$2/$3/model.safetensors" &&
        cmp -s "$1/$3/optimizer.safetensors" "$2/$3/optimizer.safetensors" &&
        same_state "$1" "$2" "$3"
}
# same_state A B STEP_DIR: the final state.json alike but for when it was saved and the config
# (its out_dir and stop_at_step differ), and every step line alike in what a resume must carry on
# (lr, grad_norm, tokens, skipped; not the timings). A resume that forgot tokens_seen passed the
# losses and the weights, and logged every later step's tokens wrong.
same_state() {
    "$PYTHON" - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, step = sys.argv[1:4]
def state(d):
    s = json.load(open("%s/%s/state.json" % (d, step)))
    for k in ("saved_at_unix", "config"):
        s.pop(k, None)
    return s
def steps(d):
    last = {}
    for line in open(d + "/metrics.jsonl"):
        m = json.loads(line)
        if "loss" in m and "step" in m and "lr" in m:
            last[m["step"]] = tuple(m.get(k) for k in ("lr", "grad_norm", "tokens", "skipped"))
    return last
sa, sb = state(a), state(b)
bad = [k for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
if bad:
    sys.exit("state.json differs in %s: %s against %s" % (bad, [sa.get(k) for k in bad], [sb.get(k) for k in bad]))
ta, tb = steps(a), steps(b)
bad = [s for s in sorted(set(ta) & set(tb)) if ta[s] != tb[s]]
if bad or set(ta) != set(tb):
    sys.exit("step lines differ at steps %s (first: %s against %s)" % (bad[:5] or sorted(set(ta) ^ set(tb))[:5],
             ta.get(bad[0]) if bad else None, tb.get(bad[0]) if bad else None))
PY
}
state_index() { sed -nE 's/.*"data_(epoch|index)": ([0-9]+).*/\2/p' "$1/state.json" | tr '\n' ' ' | sed 's/ $//'; }
same_as_straight() { same_as "$tmp/straight" "$1" step_00000020; }
# The signal and kill -9 cases need a run long enough that the signal surely lands
# before its end: 300 steps (~1 s) with its own straight reference.
long=(--max_steps 300 --ckpt_every 50)
same_as_long() { same_as "$tmp/long" "$1" step_00000300; }

run "$tmp/straight" >/dev/null
run "$tmp/long" "${long[@]}" >/dev/null
check "straight run wrote step_00000020" test -f "$tmp/straight/step_00000020/model.safetensors"
if command -v xxhsum >/dev/null; then
    check "checksums.xxh64 verifies with the stock xxhsum" \
        sh -c "cd '$tmp/straight/step_00000020' && xxhsum -c checksums.xxh64 >/dev/null"
fi

# 1. stop_at_step, then resume
run "$tmp/stopped" --stop_at_step 8 >/dev/null
check "stop_at_step 8 left a checkpoint at step 8" test -d "$tmp/stopped/step_00000008"
run "$tmp/stopped" >/dev/null
check "stop at 8 + resume: identical losses and bytes" same_as_straight "$tmp/stopped"

# 2. SIGUSR1 (SLURM's pre-walltime signal) mid-run
"$TRAIN_GPT" "${common[@]}" "${long[@]}" --out_dir "$tmp/signal" >"$tmp/signal.log" 2>&1 &
pid=$!  # the trainer itself, not a subshell: the signal must reach it
pids+=($pid)
wait_until "the run's step 3" grep -q '"step":3,' "$tmp/signal/metrics.jsonl" ||
    die "SIGUSR1: the run never logged step 3: $(tail -n 1 "$tmp/signal.log")"
kill -USR1 "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
check "SIGUSR1: exit status 76, stopped early with a checkpoint for the job to requeue (rc $rc)" test "$rc" -eq 76
check "SIGUSR1: the run stopped early with a checkpoint" grep -q '"event":"stop"' "$tmp/signal/metrics.jsonl"
run "$tmp/signal" "${long[@]}" >/dev/null
check "SIGUSR1 + resume: identical losses and bytes" same_as_long "$tmp/signal"

# 3. SIGKILL in the middle of writing the step-10 checkpoint
rc=0; TRAIN_GPT_FAULT=kill_in_checkpoint:10 run "$tmp/crash" >/dev/null 2>&1 || rc=$?
check "fault injection killed the run (rc $rc)" test "$rc" -eq 137
check "the half-written checkpoint is only a .tmp directory" \
    sh -c "test -d '$tmp/crash/.tmp-step_00000010' && ! test -e '$tmp/crash/step_00000010' && test -d '$tmp/crash/step_00000005'"
run "$tmp/crash" >"$tmp/crash.log" 2>&1
check "resumed from step 5" grep -q "resuming from '$tmp/crash/step_00000005'" "$tmp/crash.log"
check "crash + resume: identical losses and bytes" same_as_straight "$tmp/crash"
# Killed while writing an off-grid checkpoint (stop_at_step 7, as at a walltime signal): no
# later save is of step 7, so its .tmp directory (a whole checkpoint's size) once stayed
# forever; the next save removes it before it writes, with a warning naming it
# (test_ckpt_space.sh: on a disk with room for no more).
rc=0; TRAIN_GPT_FAULT=kill_in_checkpoint:7 run "$tmp/crash7" --stop_at_step 7 >/dev/null 2>&1 || rc=$?
check "killed while writing the step-7 checkpoint (rc $rc): a .tmp directory is left" \
    sh -c "[ $rc -eq 137 ] && test -d '$tmp/crash7/.tmp-step_00000007'"
run "$tmp/crash7" >"$tmp/crash7.log" 2>&1
check "... the next save removes it, saying so" \
    sh -c "! test -e '$tmp/crash7/.tmp-step_00000007' && grep -q \"removing '$tmp/crash7/.tmp-step_00000007', a checkpoint that was never finished\" '$tmp/crash7.log'"
check "... and the run is still bit-exact" same_as_straight "$tmp/crash7"

# 4. kill -9 from outside, at whatever moment the step-50 checkpoint appears
"$TRAIN_GPT" "${common[@]}" "${long[@]}" --out_dir "$tmp/killed" >/dev/null 2>&1 &
pid=$!
pids+=($pid)
wait_until "the run's step-50 checkpoint" test -d "$tmp/killed/step_00000050" ||
    die "kill -9: the run never wrote its step-50 checkpoint"
kill -9 "$pid" 2>/dev/null || true
rc=0; wait "$pid" 2>/dev/null || rc=$?
check "kill -9 landed before the run finished (rc $rc)" test "$rc" -eq 137
run "$tmp/killed" "${long[@]}" >/dev/null 2>&1
check "kill -9 + resume: identical losses and bytes" same_as_long "$tmp/killed"

# 5. resume on a finished run does nothing and succeeds
run "$tmp/straight" >"$tmp/again.log" 2>&1
check "a finished run resumes to a no-op" grep -q "already reached max_steps" "$tmp/again.log"
# 6. TRAIN_GPT_NO_FINAL_CHECKPOINT=1: 12 steps with ckpt_every 5 leave steps 5 and 10 only;
# at 10 steps (a multiple of ckpt_every) the last one stays; stop_at_step still writes its own.
TRAIN_GPT_NO_FINAL_CHECKPOINT=1 run "$tmp/bench" --max_steps 12 >"$tmp/bench.log" 2>&1
check "no final checkpoint: steps 5 and 10 written, not 12 ($(ls "$tmp/bench" | grep step_ | tr '\n' ' '))" \
    sh -c "test -d '$tmp/bench/step_00000010' && ! test -e '$tmp/bench/step_00000012'"
check "no final checkpoint: the run says so" grep -q "TRAIN_GPT_NO_FINAL_CHECKPOINT=1: no checkpoint at max_steps = 12" "$tmp/bench.log"
TRAIN_GPT_NO_FINAL_CHECKPOINT=1 run "$tmp/bench10" --max_steps 10 >/dev/null 2>&1
check "no final checkpoint: ckpt_every's own at max_steps stays" test -d "$tmp/bench10/step_00000010"
TRAIN_GPT_NO_FINAL_CHECKPOINT=1 run "$tmp/bench_stop" --max_steps 12 --stop_at_step 7 >/dev/null 2>&1
check "no final checkpoint: stop_at_step still writes one" test -d "$tmp/bench_stop/step_00000007"
# 7. resume = an older checkpoint of out_dir itself, which holds newer ones (or a checkpoint
# elsewhere into an out_dir of older ones): refused with one
# line before anything is written (the new branch's steps would sit below the old branch's,
# and ckpt_keep would delete them); the directory is untouched.
before=$(tree_digest "$tmp/straight")
rc=0
run "$tmp/straight" --resume "$tmp/straight/step_00000010" --max_steps 30 >"$tmp/branch.log" 2>&1 || rc=$?
check "resume = an older checkpoint beside newer ones: refused (status $rc)" test "$rc" -ne 0
check "... with one line naming the newer checkpoint" \
    grep -q "resume: '$tmp/straight/step_00000010' is older than out_dir's newest checkpoint step_00000020" "$tmp/branch.log"
check "... and the out_dir is untouched" test "$(tree_digest "$tmp/straight")" = "$before"
run "$tmp/branch" --resume "$tmp/straight/step_00000010" --max_steps 12 >"$tmp/branch2.log" 2>&1
check "the same checkpoint into a fresh out_dir continues" grep -q "resuming from '$tmp/straight/step_00000010' at step 10" "$tmp/branch2.log"
# The same command again (a requeued job whose ARGS name that checkpoint) goes on from its own
# progress in out_dir, as resume = auto would.
run "$tmp/branch" --resume "$tmp/straight/step_00000010" --max_steps 14 >"$tmp/branch3.log" 2>&1
check "... and the same command again goes on from out_dir's step 12" \
    sh -c "grep -q \"going on from out_dir's newest valid checkpoint\" '$tmp/branch3.log' && grep -q \"resuming from '$tmp/branch/step_00000012' at step 12\" '$tmp/branch3.log' && test -d '$tmp/branch/step_00000014'"
# An out_dir that holds only older checkpoints than the named one holds another run's (this
# run's progress would be newer): refused as resume = never refuses them, where ckpt_keep 1
# deleted them all (found by a reviewer helper); the directory is untouched.
mkdir -p "$tmp/other" && cp -r "$tmp/straight/step_00000005" "$tmp/other/"
before=$(tree_digest "$tmp/other/step_00000005")
rc=0
run "$tmp/other" --resume "$tmp/straight/step_00000010" --max_steps 12 --ckpt_keep 1 >"$tmp/other.log" 2>&1 || rc=$?
check "resume = a checkpoint elsewhere into an out_dir of older checkpoints: refused (status $rc), naming them" \
    sh -c "[ $rc -ne 0 ] && grep -q \"resume: out_dir '$tmp/other' holds checkpoints up to step_00000005, older than\" '$tmp/other.log'"
check "... and its checkpoint is untouched" test "$(tree_digest "$tmp/other/step_00000005")" = "$before"

# 8. Another batch_size on resume: the position is converted by rows (docs/config.md, resume).
# 8 steps of 2 × 4 rows read micro-batches 0..15 = rows 0..63; at batch_size 8 and grad_accum 1
# that is micro-batch 8, and 12 more steps end at 20 (unconverted: 28).
mkdir -p "$tmp/rebatch" && cp -r "$tmp/stopped/step_00000008" "$tmp/rebatch/"
run "$tmp/rebatch" --batch_size 8 --grad_accum 1 >"$tmp/rebatch.log" 2>&1
check "batch_size 4 x 2 -> 8 x 1: the note says micro-batch 16 is 8" \
    grep -q "1 process(es) x 4 rows of 32 tokens (16 micro-batches each) is 8 micro-batches each for 1 x 8 rows of 32" "$tmp/rebatch.log"
check "... and the run ends at micro-batch 20 (got $(state_index "$tmp/rebatch/step_00000020"))" \
    test "$(state_index "$tmp/rebatch/step_00000020")" = "0 20"
# A position at an epoch's very end (2,000 tokens: 62 rows of 32, 15 micro-batches of 4) at
# another batch size: its 60 rows are ⌈60 / 8⌉ = 8 micro-batches of 8, past this epoch's 7,
# so the next step starts epoch 1.
"$TOOL" shard "$tmp/small.bin" 64 0 2000 13
edge=(--train_data "$tmp/small.bin" --max_steps 10 --val_every 0 --threads 1)
run "$tmp/edge" "${edge[@]}" --batch_size 4 --grad_accum 3 --stop_at_step 5 >/dev/null 2>&1
check "the epoch's end: saved at micro-batch 15 (got $(state_index "$tmp/edge/step_00000005"))" \
    test "$(state_index "$tmp/edge/step_00000005")" = "0 15"
cp -r "$tmp/edge" "$tmp/edge_np2"
run "$tmp/edge" "${edge[@]}" --batch_size 8 --grad_accum 1 >"$tmp/edge.log" 2>&1
check "... resumed at batch_size 8: epoch 1, micro-batch 5 after 5 more steps (got $(state_index "$tmp/edge/step_00000010"))" \
    test "$(state_index "$tmp/edge/step_00000010")" = "1 5"
# The same position at 2 processes: 15 micro-batches of one process do not split in two, but
# the epoch is over (60 rows: 8 each, past its 7), so the run goes on in epoch 1 (it was once
# refused as "cannot split evenly").
detect_mpi
if [ "$HAVE_MPI" = 1 ]; then
    rc=0
    "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/edge_np2" "${edge[@]}" --batch_size 4 \
        --grad_accum 1 >"$tmp/edge_np2.log" 2>&1 || rc=$?
    check "... resumed at np 2: runs (status $rc) and ends at epoch 1, micro-batch 5 (got $(state_index "$tmp/edge_np2/step_00000010" 2>/dev/null))" \
        test "$rc" = 0 -a "$(state_index "$tmp/edge_np2/step_00000010" 2>/dev/null)" = "1 5"
else
    say "  skip the np 2 resume: no MPI in this build"
fi
# Another seq_len, unshuffled: 4 steps of 2 × 4 rows of 32 tokens read the stream's first 1,024
# tokens = 64 rows of 16, micro-batch 16 at batch 4; 2 more steps of 2 end at 20 (unconverted: 12).
run "$tmp/reseq" --shuffle 0 --max_steps 6 --stop_at_step 4 --val_every 0 >/dev/null 2>&1
run "$tmp/reseq" --shuffle 0 --max_steps 6 --val_every 0 --seq_len 16 >"$tmp/reseq.log" 2>&1
check "seq_len 32 -> 16 unshuffled: the position is converted by tokens, ends at micro-batch 20 (got $(state_index "$tmp/reseq/step_00000006"))" \
    test "$(state_index "$tmp/reseq/step_00000006")" = "0 20"

# 9. A resume with another max_steps says that the schedule changed (a finished run extended
# goes back up to the new schedule's lr).
cp -r "$tmp/straight" "$tmp/extended"
run "$tmp/extended" --max_steps 24 >"$tmp/extended.log" 2>&1
check "max_steps 20 -> 24 on resume: a warning names both and the saved run as finished" \
    grep -q "resume: max_steps was 20 when saved, now 24: .*the saved run had finished" "$tmp/extended.log"
# Lowered below the saved step: the warning gives the schedule's floor (min_lr_frac 0.1 x lr
# 0.003), not the decay line drawn on past the end (-0.0132), and says nothing is trained.
cp -r "$tmp/straight" "$tmp/lowered"
run "$tmp/lowered" --max_steps 10 >"$tmp/lowered.log" 2>&1
check "max_steps 20 -> 10 on resume: at step 20 the lr is 0.0003 (the floor), the run past its new end" \
    grep -q "resume: max_steps was 20 when saved, now 10: .*at step 20 the lr is 0.0003, .*already past its new max_steps" \
    "$tmp/lowered.log"

# 10. The checkpoint records its train data (tokens, shards, fingerprint); a resume whose
# train_data holds other data (one more shard) warns that the position no longer names the
# same rows; the same data does not.
check "state.json records the train data: 60000 tokens, 1 shard, a fingerprint" \
    grep -qz '"data_tokens": 60000,.*"data_shards": 1,.*"data_fingerprint": "[0-9a-f]\{16\}"' "$tmp/straight/step_00000020/state.json"
check "... and the resume with the same data says nothing of it" sh -c "! grep -q 'no longer names the same rows' '$tmp/extended.log'"
"$TOOL" shard "$tmp/more.bin" 64 0 5000 13
cp -r "$tmp/straight" "$tmp/more"
run "$tmp/more" --max_steps 24 --train_data "$tmp/train.bin,$tmp/more.bin" >"$tmp/more.log" 2>&1
check "a resume with one more shard warns, naming both data sets" \
    grep -q "resume: the checkpoint read train data of 60000 tokens in 1 shard(s) (fingerprint [0-9a-f]*), this run's train_data holds 65000 tokens in 2 shard(s) .*no longer names the same rows" "$tmp/more.log"

# 11. Two runs in one out_dir (a requeued job while the old one still lives, a job submitted
# twice) deleted each other's unfinished saves and moved each other's checkpoints aside, and
# both exited 0. The first holds OUT_DIR/.lock (stopped in its start, after taking it); the
# second is refused at once with one line naming the first; once the first ends, its out_dir
# is free again.
TRAIN_GPT_FAULT=stop_in_start:0 "$TRAIN_GPT" "${common[@]}" --max_steps 6 --out_dir "$tmp/locked" >"$tmp/locked.log" 2>&1 &
pid=$!  # the trainer itself: it is the one that stops
pids+=($pid)
wait_until "the first run stops in its start" stopped "$pid" ||
    die "the first run did not stop in its start: $(tail -n 1 "$tmp/locked.log")"
rc=0; run "$tmp/locked" --max_steps 6 >"$tmp/locked2.log" 2>&1 || rc=$?
check "a second run in a live run's out_dir: refused at once (status $rc), naming the first's pid and host" \
    sh -c "[ $rc -ne 0 ] && grep -q \"^train_gpt: error: out_dir '$tmp/locked' is in use by pid $pid on host $(hostname) (another run, or the previous job still alive)\" '$tmp/locked2.log'"
check "... in one error line" test "$(grep -c 'error:' "$tmp/locked2.log")" -eq 1
kill -CONT "$pid"
rc=0; wait "$pid" || rc=$?
check "... and the first run finishes (rc $rc), its checkpoints its own" \
    sh -c "[ $rc -eq 0 ] && test -d '$tmp/locked/step_00000006' && ! ls '$tmp/locked' | grep -q replaced"
run "$tmp/locked" --max_steps 6 >"$tmp/locked3.log" 2>&1
check "... after which the out_dir is free: the next run in it starts" grep -q "already reached max_steps" "$tmp/locked3.log"
# A resume whose config changes a non-shape model key: one warning naming it with both values;
# init_std, which only draws the first weights, none (it named six keys, none of them changed).
run "$tmp/keys" --max_steps 5 >/dev/null 2>&1
run "$tmp/keys" --max_steps 6 --init_std 0.01 >"$tmp/keys_std.log" 2>&1
run "$tmp/keys" --max_steps 7 --rope_theta 5000 >"$tmp/keys_rope.log" 2>&1
check "resume with another init_std: no model-config warning" sh -c "! grep -q 'model config differs' '$tmp/keys_std.log'"
check "resume with another rope_theta: one warning naming it, checkpoint's value -> the config's" \
    sh -c "[ \$(grep -c 'warning: the checkpoint.s model config differs from the config in rope_theta [0-9.e+]* -> 5000 ' '$tmp/keys_rope.log') -eq 1 ]"
finish test_resume
