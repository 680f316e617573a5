# The training-health guards (docs/config.md#training-health). The spike guard:
#   1. an injected finite spike (one gradient element set to 1e4 after the window is full)
#      is skipped and logged; with spike_z = 0 the same step is applied (the check fails
#      without the guard);
#   2. before the window is full the guard does not act;
#   3. the window is part of the run's state: stop before the spike, resume, and the spike
#      after the resume is skipped as in the straight run — model and optimizer bit-exact;
#   4. spikes in a row stop the run at max_bad_steps with one line naming spike_z;
#   5. 1000 steps of a healthy run: no step skipped (the limit is not noise);
#  11. a lasting shift (every gradient 10x from step 41 on, the loss as before: what a model
#      leaving a plateau does) is skipped max_bad_steps − 1 times, then accepted (a spike_shift
#      event), the window starts over and the run finishes with no other skip; stopped in the
#      middle of the streak and resumed, it decides the same and ends bit-exact; 1e4 spikes in a
#      row (section 4) are no shift and still stop the run.
#  13. harder data for good (the loss 1.6-1.8x its limit, lasting): one rollback, then the
#      loss's shift is accepted and the run finishes; the loss's spikes before the rollback do
#      not open the gradient norm's allowance, also when stopped among them and resumed;
#  14. max_bad_steps 1: a lasting shift of the gradient norm is accepted at once.
# Rollback:
#   8. bad data (NaN in the steps that take micro-batches 33–35; max_bad_steps 3) rolls back to
#      the step-30 checkpoint, skips the data since it, and goes on; its final weights equal a
#      clean run resumed from that checkpoint with the data moved past the same batches;
#      with max_rollbacks 0 the same run stops with an error instead; stopped off the
#      checkpoint grid at step 33 and resumed, it rolls back to step 30 all the same, bit-exact;
#      a checkpoint of another batch size counts the skipped micro-batches in this run's; simulated
#      DiLoCo replicas (local) do not roll back to a checkpoint of out_dir, they stop; a rollback
#      goes to a checkpoint from before the weights of the streak (not one written in it, nor
#      the one its first step ran on), and moves the newer ones aside (.rolled-back); a run
#      that rolled back to its resume step and stopped there does not say "nothing to do";
#   9. kill -9 right after a rollback loaded its checkpoint, then resume: every checkpoint
#      is intact (byte for byte) and the run finishes.
# The watchdog:
#   6. a step that hangs (fault injection) ends the process within watchdog_s + a few
#      seconds, exit status 75, one line naming the rank, the phase and the step;
#  6b. a process suspended (SIGSTOP) for longer than watchdog_s and continued finishes: the
#      watchdog leaves the stop out;
#   7. SIGSTOP on one rank of an mpirun -np 3 DiLoCo run: the job ends with status 75 and the
#      other ranks' watchdog lines.
# The reducer's bound:
#  10. a replica sending 100 x its outer gradient is bounded, named, and the loss holds.
# A DiLoCo replica's rollback:
#  12. NaN in max_bad_steps steps in a row on one of two MPI replicas: its weights start over
#      from θ (bit for bit), it stays a member, its next contribution counts the steps since,
#      θ agrees at every outer step; stopped after the rollback and resumed: bit-exact. Rolled
#      back onto a sync step, its sync there goes with tokens 0: MPI's mean leaves it out, and
#      diloco_min_replicas does not count it.
#  15. A rollback while a streaming fragment's exchange is in flight: when it lands, the fragment
#      takes θ whole (the weights hold none of the work it carries), and a run stopped between
#      the fragment's start and the rollback resumes bit-exact.
. "$(dirname "$0")/lib.sh"
tmp_with_processes   # a check that fails leaves no trainer or MPI job running
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --max_steps 80 --spike_window 20)
run() {  # run OUT_DIR [--key value]...: prints nothing, returns the exit status
    local out=$1; shift
    "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$out.log" 2>&1
}
skipped_steps() {  # the steps whose metrics line says skipped, space-separated
    grep '"skipped":true' "$1/metrics.jsonl" | sed -E 's/^\{"step":([0-9]+).*/\1/' | tr '\n' ' ' | sed 's/ $//'
}
spike_events() { grep -c '"event":"spike"' "$1/metrics.jsonl" || true; }

# 1. (0-based step 45 = the 46th step; the window of 20 is full from step 21)
TRAIN_GPT_FAULT=grad_spike:45 run "$tmp/spike" || true
check "an injected spike is skipped: step 46 only ($(skipped_steps "$tmp/spike"))" \
    test "$(skipped_steps "$tmp/spike")" = 46
check "the spike is logged: a spike event with the limits" \
    grep -q '"event":"spike","step":46,"loss":[0-9.e+-]*,"grad_norm":1[0-9.e+]*,"max_loss":[0-9.e+-]*,"max_grad_norm":' \
    "$tmp/spike/metrics.jsonl"
TRAIN_GPT_FAULT=grad_spike:45 run "$tmp/off" --spike_z 0 || true
check "with spike_z 0 the same spike is applied (no step skipped: '$(skipped_steps "$tmp/off")')" \
    test -z "$(skipped_steps "$tmp/off")"
check "... and the weights differ from the guarded run's" \
    sh -c "! cmp -s '$tmp/spike/step_00000080/model.safetensors' '$tmp/off/step_00000080/model.safetensors'"

# 2.
TRAIN_GPT_FAULT=grad_spike:10 run "$tmp/early" || true
check "before the window is full the guard does not act (spike at step 11 applied)" \
    test -z "$(skipped_steps "$tmp/early")"

# 3.
TRAIN_GPT_FAULT=grad_spike:45 run "$tmp/stopped" --stop_at_step 30 || true
check "the checkpoint carries the window (spike_window, spike_loss in state.json)" \
    sh -c "grep -q '\"spike_window\": 20' '$tmp/stopped/step_00000030/state.json' &&
           grep -q '\"spike_loss\": \[' '$tmp/stopped/step_00000030/state.json'"
TRAIN_GPT_FAULT=grad_spike:45 run "$tmp/stopped" || true
check "resumed before the spike: the spike is skipped as in the straight run" \
    test "$(skipped_steps "$tmp/stopped")" = 46
check "resumed: model and optimizer bit-exact with the straight run" \
    sh -c "cmp -s '$tmp/spike/step_00000080/model.safetensors' '$tmp/stopped/step_00000080/model.safetensors' &&
           cmp -s '$tmp/spike/step_00000080/optimizer.safetensors' '$tmp/stopped/step_00000080/optimizer.safetensors'"

# 4.
rc=0
TRAIN_GPT_FAULT=grad_spike:40,grad_spike:41,grad_spike:42 run "$tmp/streak" --max_bad_steps 3 || rc=$?
check "3 spikes in a row with max_bad_steps 3: exit 1 with one error line naming spike_z (rc $rc)" \
    sh -c "[ $rc -eq 1 ] && [ \$(grep -c 'error:' '$tmp/streak.log') -eq 1 ] && grep 'error:' '$tmp/streak.log' | grep -q spike_z"

# 5.
run "$tmp/healthy" --max_steps 1000 --spike_window 100 || true
check "1000 healthy steps at the defaults (z 6, window 100): none skipped ('$(skipped_steps "$tmp/healthy")')" \
    sh -c "[ -z '$(skipped_steps "$tmp/healthy")' ] && [ $(spike_events "$tmp/healthy") -eq 0 ] &&
           test -f '$tmp/healthy/step_00001000/model.safetensors'"

# 11. (the window of 20 is full from step 21; 0-based step 40 = the 41st step)
rc=0
TRAIN_GPT_FAULT=grad_shift:40 run "$tmp/shift" || rc=$?
check "a lasting shift of the gradient norm: steps 41-44 skipped, then accepted, the run finishes (rc $rc, skipped '$(skipped_steps "$tmp/shift")')" \
    sh -c "[ $rc -eq 0 ] && [ '$(skipped_steps "$tmp/shift")' = '41 42 43 44' ] && test -f '$tmp/shift/step_00000080/model.safetensors'"
check "... logged: a spike_shift event at step 45 with the limits" \
    grep -q '"event":"spike_shift","step":45,"loss":[0-9.e+-]*,"grad_norm":[0-9.e+-]*,"max_loss":' "$tmp/shift/metrics.jsonl"
TRAIN_GPT_FAULT=grad_shift:40 run "$tmp/shift_stopped" --stop_at_step 43 || true
check "stopped in the streak: the checkpoint carries it (norm_spikes 3 in state.json)" \
    grep -q '"norm_spikes": 3' "$tmp/shift_stopped/step_00000043/state.json"
TRAIN_GPT_FAULT=grad_shift:40 run "$tmp/shift_stopped" || true
check "... resumed: the same steps skipped (metrics.jsonl goes on), the shift accepted at step 45, bit-exact" \
    sh -c "[ '$(skipped_steps "$tmp/shift_stopped")' = '41 42 43 44' ] &&
           grep -q '\"event\":\"spike_shift\",\"step\":45' '$tmp/shift_stopped/metrics.jsonl' &&
           cmp -s '$tmp/shift/step_00000080/model.safetensors' '$tmp/shift_stopped/step_00000080/model.safetensors' &&
           cmp -s '$tmp/shift/step_00000080/optimizer.safetensors' '$tmp/shift_stopped/step_00000080/optimizer.safetensors'"

# 8.
roll=(--ckpt_every 10 --max_steps 60 --max_bad_steps 3)
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$tmp/roll" "${roll[@]}" || true
check "bad data: rolled back from step 36 to the step-30 checkpoint, skipping micro-batches 30..36" \
    grep -q '"event":"rollback","step":36,"to_step":30,"checkpoint":"[^"]*step_00000030","skipped_from":\[0,30\],"skipped_to":\[0,36\],"skipped_batches":6,"rollbacks":1' \
    "$tmp/roll/metrics.jsonl"
check "... and finished (step 60, rollbacks 1 in state.json)" \
    sh -c "grep -q '\"rollbacks\": 1' '$tmp/roll/step_00000060/state.json'"
check "... its console line for step 36 says it, with no throughput ('- tok/s', not 'nan tok/s')" \
    sh -c "grep -q '^step *36/60 | .* | - tok/s | .* | SKIPPED, ROLLED BACK$' '$tmp/roll.log' && ! grep -q 'nan tok/s' '$tmp/roll.log'"
# The same in an out_dir named with a quote and a backslash: the event's checkpoint path is a
# JSON string (it was written raw: the line did not parse, and TensorBoard lost the restart).
odd="$tmp/ro\"ll\\x"
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$odd" "${roll[@]}" || true
check "... in an out_dir with a quote: the rollback line is JSON naming the checkpoint" \
    "$PYTHON" -c "
import json, sys
e = [json.loads(l) for l in open(sys.argv[1] + '/metrics.jsonl') if 'rollback' in l]
sys.exit(0 if len(e) == 1 and e[0]['checkpoint'] == sys.argv[1] + '/step_00000030' and e[0]['rollbacks'] == 1 else 1)" "$odd"
# The clean run: the step-30 checkpoint with its data position moved to batch 36 (the
# checksum of the edited state.json rewritten), resumed without faults.
mkdir -p "$tmp/clean"
cp -r "$tmp/roll/step_00000030" "$tmp/clean/"
sed -i 's/"data_index": 30,/"data_index": 36,/' "$tmp/clean/step_00000030/state.json"
sum=$("$TOOL" xxh64 "$tmp/clean/step_00000030/state.json")
sed -i "s/^[0-9a-f]*  state.json\$/$sum  state.json/" "$tmp/clean/step_00000030/checksums.xxh64"
run "$tmp/clean" "${roll[@]}" || true
check "the rolled-back run's final weights and moments = a clean run that skipped the same data" \
    sh -c "cmp -s '$tmp/roll/step_00000060/model.safetensors' '$tmp/clean/step_00000060/model.safetensors' &&
           cmp -s '$tmp/roll/step_00000060/optimizer.safetensors' '$tmp/clean/step_00000060/optimizer.safetensors'"
rc=0
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$tmp/noroll" "${roll[@]}" --max_rollbacks 0 || rc=$?
check "with max_rollbacks 0 the same bad data stops the run: exit 1, one error line (rc $rc)" \
    sh -c "[ $rc -eq 1 ] && [ \$(grep -c 'error:' '$tmp/noroll.log') -eq 1 ] && ! grep -q rollback '$tmp/noroll/metrics.jsonl'"

# The checkpoint written at another batch size (4 rows, stopped at step 30: micro-batch 30)
# and the rollback run at 8 rows: the checkpoint's position is micro-batch 15 of this run's, and
# the skipped count is in this run's units (it mixed them: "skipping the -9 micro-batches").
run "$tmp/roll_b8" "${roll[@]}" --stop_at_step 30 || true
TRAIN_GPT_FAULT=nan_batch:18,nan_batch:19,nan_batch:20 run "$tmp/roll_b8" "${roll[@]}" --batch_size 8 || true
check "... a checkpoint of 4-row micro-batches rolled back to at 8 rows: skipped 15..21, 6 micro-batches" \
    grep -q '"event":"rollback","step":36,"to_step":30,"checkpoint":"[^"]*step_00000030","skipped_from":\[0,15\],"skipped_to":\[0,21\],"skipped_batches":6,' \
    "$tmp/roll_b8/metrics.jsonl"
# Simulated DiLoCo replicas (diloco_transport = local) started from a checkpoint in out_dir do
# not roll back to it (they did: step, data and outer step wound back, the simulator's θ not).
run "$tmp/roll_local" "${roll[@]}" --max_steps 20 --ckpt_every 20 || true
rc=0
TRAIN_GPT_FAULT=nan_grad:30,nan_grad:31,nan_grad:32 run "$tmp/roll_local" "${roll[@]}" --diloco_replicas 2 \
    --diloco_transport local --diloco_inner_steps 5 || rc=$?
check "simulated DiLoCo replicas stop at max_bad_steps, saying they do not roll back (rc $rc)" \
    sh -c "[ $rc -eq 1 ] && grep -q 'error: .*simulated DiLoCo replicas (diloco_transport = local) do not roll back' '$tmp/roll_local.log' &&
           ! grep -q rollback '$tmp/roll_local/metrics.jsonl'"

# Stopped off ckpt_every's grid just before the bad data (stop_at_step 33 writes a checkpoint
# there) and resumed: the rollback still goes to step 30, as in the straight run, and the run
# ends bit-exact (it went to the newest checkpoint, 33, and ended elsewhere).
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$tmp/roll_stopped" "${roll[@]}" --stop_at_step 33 || true
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$tmp/roll_stopped" "${roll[@]}" || true
check "... stopped at step 33 (off the grid) and resumed: the rollback goes to step 30 again, bit-exact at step 60" \
    sh -c "grep -q '\"event\":\"rollback\",\"step\":36,\"to_step\":30,' '$tmp/roll_stopped/metrics.jsonl' &&
           cmp -s '$tmp/roll/step_00000060/model.safetensors' '$tmp/roll_stopped/step_00000060/model.safetensors' &&
           cmp -s '$tmp/roll/step_00000060/optimizer.safetensors' '$tmp/roll_stopped/step_00000060/optimizer.safetensors'"

# A checkpoint written in the streak holds the weights that caused it (a skipped step changes
# nothing), and so does the one of the step before the streak: NaN in micro-batches 28–30
# skips steps 29–31, and the rollback goes to step 20, not to the step-30 checkpoint written in
# the streak (it did: the same weights again); NaN in 30–32 skips steps 31–33, whose first ran
# on step 30's weights: step 20 too. The checkpoint after the target is moved aside as
# step_00000030.rolled-back: a crash after the rollback resumes from step 20's line (it resumed
# from the streak's step 30 with rollbacks 0), and when the run writes step 30 again nothing is
# moved aside as .replaced-<time> (a whole checkpoint that was never pruned).
TRAIN_GPT_FAULT=nan_batch:28,nan_batch:29,nan_batch:30 run "$tmp/roll_mid" "${roll[@]}" || true
check "NaN in steps 29-31: the rollback goes to step 20, not to the step-30 checkpoint written in the streak" \
    grep -q '"event":"rollback","step":31,"to_step":20,' "$tmp/roll_mid/metrics.jsonl"
check "... the step-30 checkpoint is moved aside as step_00000030.rolled-back, said in one warning; none is .replaced-" \
    sh -c "test -d '$tmp/roll_mid/step_00000030.rolled-back' && test -d '$tmp/roll_mid/step_00000060' &&
           [ \$(grep -c 'warning: the rollback moved .*step_00000030.rolled-back.*can be deleted' '$tmp/roll_mid.log') -eq 1 ] &&
           ! ls '$tmp/roll_mid' | grep -q replaced"
TRAIN_GPT_FAULT=nan_batch:30,nan_batch:31,nan_batch:32 run "$tmp/roll_edge" "${roll[@]}" || true
check "NaN in steps 31-33 (the first on step 30's weights): the rollback goes to step 20" \
    grep -q '"event":"rollback","step":33,"to_step":20,' "$tmp/roll_edge/metrics.jsonl"
# A crash after the rollback, before the run writes step 30 again (here: NaN in micro-batches
# 31–33 too, the three steps after the rollback, and max_rollbacks 1: the run stops with an
# error at step 23), then a resume: from step 20, not from the streak's step 30.
rc=0
TRAIN_GPT_FAULT=nan_batch:28,nan_batch:29,nan_batch:30,nan_batch:31,nan_batch:32,nan_batch:33 \
    run "$tmp/roll_mid_crash" "${roll[@]}" --max_rollbacks 1 || rc=$?
check "stopped (rc $rc) after the rollback to step 20: no checkpoint of a later step left under its name" \
    sh -c "[ $rc -eq 1 ] && grep -q '\"event\":\"rollback\",\"step\":31,\"to_step\":20,' '$tmp/roll_mid_crash/metrics.jsonl' &&
           test -d '$tmp/roll_mid_crash/step_00000030.rolled-back' && ! test -e '$tmp/roll_mid_crash/step_00000030'"
run "$tmp/roll_mid_crash" "${roll[@]}" || true
check "... resumed: from step 20 (it resumed from the streak's step 30) and finished" \
    sh -c "grep -q '\"event\":\"resume\",\"step\":20,' '$tmp/roll_mid_crash/metrics.jsonl' &&
           test -d '$tmp/roll_mid_crash/step_00000060'"

# kill -9 in that rollback, right after it loaded step 20: the streak's step-30 checkpoint is
# already aside, and the resume takes step 20 (the step-30 checkpoint was still there, and the
# resume took its weights, those of the bad steps, with rollbacks 0).
rc=0
TRAIN_GPT_FAULT=nan_batch:28,nan_batch:29,nan_batch:30,kill_in_rollback:20 run "$tmp/roll_mid_kill" "${roll[@]}" || rc=$?
check "kill -9 in the rollback to step 20 (rc $rc): the streak's step 30 is aside already" \
    sh -c "[ $rc -eq 137 ] && test -d '$tmp/roll_mid_kill/step_00000030.rolled-back' && ! test -e '$tmp/roll_mid_kill/step_00000030'"
run "$tmp/roll_mid_kill" "${roll[@]}" || true
check "... resumed: from step 20 and finished" \
    sh -c "grep -q '\"event\":\"resume\",\"step\":20,' '$tmp/roll_mid_kill/metrics.jsonl' &&
           test -d '$tmp/roll_mid_kill/step_00000060'"

# Stopped at step 35 before the bad data, resumed with the same stop: the rollback takes the
# run back to step 30, it trains to 35 again and stops there. It said "nothing to do: the run
# had already reached max_steps" (the step it stopped at was the one it resumed at); a run
# resumed at max_steps still says it.
edge=(--ckpt_every 10 --max_steps 60 --max_bad_steps 3 --stop_at_step 35)
for _ in 1 2; do TRAIN_GPT_FAULT=nan_batch:35,nan_batch:36,nan_batch:37 run "$tmp/roll_edge_stop" "${edge[@]}" || true; done
check "resumed at 35, rolled back to 30 and stopped at 35 again: 'stopped after step 35', not 'nothing to do'" \
    sh -c "grep -q '\"event\":\"rollback\",\"step\":38,\"to_step\":30,' '$tmp/roll_edge_stop/metrics.jsonl' &&
           grep -q 'stopped after step 35 (stop_at_step)' '$tmp/roll_edge_stop.log' && ! grep -q 'nothing to do' '$tmp/roll_edge_stop.log'"
run "$tmp/roll_edge_stop" "${roll[@]}" || true
run "$tmp/roll_edge_stop" "${roll[@]}" || true
check "... a run resumed at max_steps says 'nothing to do'" grep -q 'nothing to do: the run had already reached max_steps = 60' "$tmp/roll_edge_stop.log"

# 13. Harder data for good: the stream (unshuffled) goes from a random-token shard to a Markov
# one whose loss, for this model, stays 1.6-1.8x the window's limit. The steps there are
# skipped, max_bad_steps of them roll back; when the steps after the rollback are such spikes
# again, the first is accepted as a lasting shift of the loss (spike_shift), the window starts
# over and the run finishes. Before, every streak rolled back to the same checkpoint until
# max_rollbacks ran out and the run stopped.
"$TOOL" shard "$tmp/rand.bin" 64 0 30000 11
"$TOOL" markov "$tmp/markov.bin" 64 0 60000 5 6
rc=0
"$TRAIN_GPT" test/configs/tiny_test.conf --val_every 0 --threads 1 --log_every 1000 --ckpt_every 50 --shuffle 0 \
    --train_data "$tmp/rand.bin,$tmp/markov.bin" --max_steps 300 --out_dir "$tmp/harder" >"$tmp/harder.log" 2>&1 || rc=$?
check "harder data for good: one rollback, then the loss's shift accepted, the run finishes (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && [ \$(grep -c '\"event\":\"rollback\"' '$tmp/harder/metrics.jsonl') -eq 1 ] &&
           grep -q '\"event\":\"spike_shift\"' '$tmp/harder/metrics.jsonl' && test -d '$tmp/harder/step_00000300'"
# The streak before the rollback is of the loss alone (the norm within its limit): the norm's
# 25x allowance stays closed, every spike event of it shows the window's own norm limit (the
# window does not change while steps are skipped). It opened after max_bad_steps - 1 of them:
# the last showed 25 x 4.318 = 107.9.
check "... the loss-only spikes before the rollback do not open the gradient norm's 25x allowance" \
    "$PYTHON" -c "
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '\"event\"' in l]
streak = [e for e in ev[:[e['event'] for e in ev].index('rollback')] if e['event'] == 'spike']
print('    max_grad_norm of the streak:', [e['max_grad_norm'] for e in streak])
sys.exit(0 if len(streak) >= 2 and all(e['loss'] > e['max_loss'] and e['max_grad_norm'] == streak[0]['max_grad_norm']
                                        for e in streak) else 1)" "$tmp/harder/metrics.jsonl"
# Stopped in that streak (after step 238: 4 loss spikes) and resumed: state.json carries the
# count (loss_spikes), so step 239 is judged as in the straight run, and the run ends bit-exact.
harder=(test/configs/tiny_test.conf --val_every 0 --threads 1 --log_every 1000 --ckpt_every 50 --shuffle 0
        --train_data "$tmp/rand.bin,$tmp/markov.bin" --max_steps 300 --out_dir "$tmp/harder_stopped")
"$TRAIN_GPT" "${harder[@]}" --stop_at_step 238 >"$tmp/harder_stopped.log" 2>&1 || true
check "... stopped at step 238 in the streak: state.json says loss_spikes 4" \
    grep -q '"loss_spikes": 4,' "$tmp/harder_stopped/step_00000238/state.json"
"$TRAIN_GPT" "${harder[@]}" >>"$tmp/harder_stopped.log" 2>&1 || true
check "... resumed: the same spike events, bit-exact at step 300" \
    sh -c "[ \"\$(grep '\"event\":\"spike' '$tmp/harder/metrics.jsonl')\" = \"\$(grep '\"event\":\"spike' '$tmp/harder_stopped/metrics.jsonl')\" ] &&
           cmp -s '$tmp/harder/step_00000300/model.safetensors' '$tmp/harder_stopped/step_00000300/model.safetensors' &&
           cmp -s '$tmp/harder/step_00000300/optimizer.safetensors' '$tmp/harder_stopped/step_00000300/optimizer.safetensors'"

# 14. max_bad_steps 1: the gradient norm's lasting shift is accepted at once (0 skips before
# it); it once was never accepted and each shifted step rolled back until the run stopped.
rc=0
TRAIN_GPT_FAULT=grad_shift:40 run "$tmp/shift1" --ckpt_every 10 --max_bad_steps 1 || rc=$?
check "max_bad_steps 1: a lasting shift of the gradient norm is accepted at step 41, nothing skipped (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && [ -z '$(skipped_steps "$tmp/shift1" 2>/dev/null)' ] &&
           grep -q '\"event\":\"spike_shift\",\"step\":41' '$tmp/shift1/metrics.jsonl'"

# 9.
rc=0
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35,kill_in_rollback:30 run "$tmp/killed" "${roll[@]}" || rc=$?
check "kill -9 during the rollback (rc $rc)" test "$rc" -eq 137
for d in "$tmp"/killed/step_*; do cp -r "$d" "$tmp/killed_before_$(basename "$d")"; done
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$tmp/killed" "${roll[@]}" || true
check "... resumed: the checkpoints from before the kill are byte for byte intact, and the run finished" \
    sh -c "for d in '$tmp'/killed_before_step_*; do n=\${d##*killed_before_}; cmp -s \"\$d/model.safetensors\" '$tmp/killed/'\$n/model.safetensors &&
           cmp -s \"\$d/state.json\" '$tmp/killed/'\$n/state.json || exit 1; done; test -f '$tmp/killed/step_00000060/model.safetensors'"

# 6.
rc=0
t0=$(date +%s)
TRAIN_GPT_FAULT=hang_in_step:30 run "$tmp/hang" --watchdog_s 2 || rc=$?
took=$(( $(date +%s) - t0 ))
check "a hung step: exit 75 with one watchdog line naming rank 0, the phase and step 31 (rc $rc, ${took} s)" \
    sh -c "[ $rc -eq 75 ] && grep -q 'watchdog: rank 0 made no progress for [0-9]* s in a training step at step 31' '$tmp/hang.log'"

# 6b. A job suspended (SIGSTOP: scontrol suspend, gang preemption) for longer than watchdog_s
# is not a hang: the watchdog's clock left the stop out. It ended such a job with 75 at its
# SIGCONT. The stop lasts 5 s, 2.5 × watchdog_s: the scenario's length, not a wait for an event.
TRAIN_GPT_FAULT=stop_in_step:10 "$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/suspended" --watchdog_s 2 --max_steps 20 \
    >"$tmp/suspended.log" 2>&1 &
pid=$!
pids+=($pid)
stopped_or_gone() { stopped "$1" || ! kill -0 "$1" 2>/dev/null; }
wait_until "the run stopped itself in step 10" stopped_or_gone "$pid" ||
    die "6b: the run did not stop itself in step 10: $(tail -n 1 "$tmp/suspended.log")"
sleep 5
kill -CONT "$pid" 2>/dev/null
rc=0
wait "$pid" || rc=$?
check "suspended 5 s with watchdog_s 2, then continued: the run finishes (rc $rc), no watchdog line" \
    sh -c "[ $rc -eq 0 ] && ! grep -q watchdog '$tmp/suspended.log' && test -d '$tmp/suspended/step_00000020'"

# 7.
detect_mpi
if [ "$HAVE_MPI" = 1 ]; then
    mkdir -p "$tmp/stopped_rank"
    # In a process group of its own (setsid), which the exit kills whole: the job has no step
    # limit, and a check that fails must not leave its ranks (one of them stopped) running.
    setsid "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") --max_steps 100000000 --diloco_replicas 3 \
        --diloco_inner_steps 5 --diloco_transport mpi --watchdog_s 3 --out_dir '$tmp/stopped_rank/'\$OMPI_COMM_WORLD_RANK" \
        >"$tmp/stopped_rank.log" 2>&1 &
    job=$!
    pids+=(-"$job")
    rank1_steps() { local n; n=$(grep -sc '"loss"' "$tmp/stopped_rank/1/metrics.jsonl" || true); echo "${n:-0}"; }
    wait_until "rank 1 of the job has taken 20 steps" eval '[ "$(rank1_steps)" -ge 20 ]' ||
        die "7: rank 1 did not take 20 steps: $(tail -n 2 "$tmp/stopped_rank.log")"
    rank1=$(pgrep -f "[o]ut_dir $tmp/stopped_rank/1\$" | head -n 1 || true)
    [ -n "$rank1" ] || die "7: rank 1's process not found (pgrep -f 'out_dir $tmp/stopped_rank/1')"
    kill -STOP "$rank1"
    rc=0
    wait "$job" || rc=$?
    check "SIGSTOP on rank 1 of 3: the job ends with status 75 (rc $rc)" test "$rc" -eq 75
    check "... and ranks 0 and 2 say which phase they were stuck in" \
        sh -c "grep -q 'watchdog: rank 0 made no progress' '$tmp/stopped_rank.log' &&
               grep -q 'watchdog: rank 2 made no progress' '$tmp/stopped_rank.log'"
fi
# 10. A replica cannot move the model alone: 3 replicas over MPI, replica 1 sends 100 times its
#     outer gradient in every round (fault injection). The reducer bounds it to diloco_bound
#     (3) times the median norm and says so, naming it; the final validation loss is no worse
#     than the clean run's + 2 % (measured: better, 5.94 against 6.53: a replica held at 3 x
#     the median acts as a larger outer step). With diloco_bound 0 the same run diverges (11.3):
#     the check below fails without the guard.
if [ "$HAVE_MPI" = 1 ]; then
    hostile=(--max_steps 60 --val_tokens 2048 --diloco_replicas 3 --diloco_inner_steps 5 --diloco_quant int8
             --diloco_error_feedback 1 --diloco_transport mpi)
    outer_run() {  # outer_run NAME HOSTILE(0|1) [--key value]...
        local name=$1 bad=$2; shift 2
        "${MPIRUN[@]}" 3 sh -c "[ \$OMPI_COMM_WORLD_RANK = 1 ] && [ $bad = 1 ] && export TRAIN_GPT_FAULT=diloco_hostile:0; \
            exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${hostile[@]}" "$@") --out_dir '$tmp/$name/'\$OMPI_COMM_WORLD_RANK" \
            >"$tmp/$name.log" 2>&1 || cat "$tmp/$name.log"
    }
    last_val() { grep '"val_loss"' "$1" | tail -1 | sed -E 's/.*"val_loss":([^,]*).*/\1/'; }
    outer_run clean 0
    outer_run wild 1
    outer_run wild_unbounded 1 --diloco_bound 0
    v_clean=$(last_val "$tmp/clean/0/metrics.jsonl")
    v_wild=$(last_val "$tmp/wild/0/metrics.jsonl")
    v_off=$(last_val "$tmp/wild_unbounded/0/metrics.jsonl")
    check "a hostile replica (x100) is bounded and named in every round" \
        test "$(grep -c "replica 1's outer gradient bounded" "$tmp/wild.log")" -ge 12
    check "a clean run bounds nothing" sh -c "! grep -q 'bounded' '$tmp/clean.log'"
    check "with the bound, the hostile run's val loss ($v_wild) is within 2 % of the clean run's ($v_clean)" \
        "$PYTHON" -c "import sys; sys.exit(0 if $v_wild <= 1.02 * $v_clean else 1)"
    check "without it (diloco_bound 0) the hostile replica ruins the model ($v_off > 1.2 x $v_clean)" \
        "$PYTHON" -c "import sys; sys.exit(0 if $v_off > 1.2 * $v_clean else 1)"
fi
# 12. A DiLoCo replica rolls back to θ: 2 replicas over MPI, H = 5, max_bad_steps 3; replica 1's
#     gradients are NaN in steps 12–14, so at step 14 its weights start over from θ of outer
#     step 2 (after step 10), the work of steps 11–14 dropped, and it stays a member: its next
#     contribution (after step 15) counts 1 inner step, replica 0's 5, and θ agrees on both at
#     every outer step (before, the replica stopped with an error: "DiLoCo replicas do not roll
#     back yet"). Stopped at step 14 (a checkpoint after the rollback, before the sync) and
#     resumed: at step 14 the weights are θ bit for bit, and the run ends byte-identical to the
#     straight one (state.json keeps the restart's step: without it the resumed contribution
#     counted the whole phase, 5 steps, and θ differed).
if [ "$HAVE_MPI" = 1 ]; then
    restart=(--max_steps 30 --diloco_replicas 2 --diloco_inner_steps 5 --diloco_transport mpi --max_bad_steps 3)
    restart_run() {  # restart_run NAME [--key value]...: returns mpirun's status
        local name=$1; shift
        "${MPIRUN[@]}" 2 sh -c "[ \$OMPI_COMM_WORLD_RANK = 1 ] && export TRAIN_GPT_FAULT=nan_grad:11,nan_grad:12,nan_grad:13; \
            exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${restart[@]}" "$@") --out_dir '$tmp/$name/'\$OMPI_COMM_WORLD_RANK" \
            >>"$tmp/$name.log" 2>&1
    }
    rc=0
    restart_run straight || rc=$?
    check "DiLoCo rollback: the run with replica 1's 3 NaN steps finishes (rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ -f '$tmp/straight/1/step_00000030/model.safetensors' ]"
    check "... replica 1 logs the rollback to θ of outer step 2 at step 14, the work of 4 steps dropped" \
        grep -q '"event":"rollback","step":14,"to":"outer_theta","outer_step":2,"discarded_steps":4,"rollbacks":1' \
        "$tmp/straight/1/metrics.jsonl"
    contribution_steps() {  # contribution_steps METRICS OUTER_STEP: the inner_steps of that outer line
        grep "\"outer_step\":$2,.*\"contributors\"" "$1" | sed -E 's/.*"inner_steps":([0-9]+).*/\1/'
    }
    got1=$(contribution_steps "$tmp/straight/1/metrics.jsonl" 3)
    got0=$(contribution_steps "$tmp/straight/0/metrics.jsonl" 3)
    check "... its next contribution counts 1 inner step (got $got1), replica 0's 5 (got $got0)" \
        sh -c "[ '$got1' = 1 ] && [ '$got0' = 5 ]"
    check "... and param_hash agrees on both replicas at all 6 outer steps" \
        all_hashes_agree 6 "$tmp/straight/0/metrics.jsonl" "$tmp/straight/1/metrics.jsonl"
    rc=0
    restart_run resumed --stop_at_step 14 || rc=$?
    restart_run resumed || rc=$?
    weights_are_theta() {  # weights_are_theta CHECKPOINT: model.safetensors = outer.theta.* bit for bit
        "$PYTHON" - "$1" <<'PY'
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
model, outer = tensors(sys.argv[1] + "/model.safetensors"), tensors(sys.argv[1] + "/outer.safetensors")
same = [outer.get("outer.theta." + k) == v for k, v in model.items()]
print(f"    {sys.argv[1].split('/')[-2]}: {sum(same)} of {len(same)} tensors equal θ")
sys.exit(0 if same and all(same) else 1)
PY
    }
    check "stopped at step 14: replica 1's weights are θ bit for bit" weights_are_theta "$tmp/resumed/1/step_00000014"
    weights_differ() { ! weights_are_theta "$1" >/dev/null; }
    check "... replica 0's are not (it trained 4 steps since the sync)" weights_differ "$tmp/resumed/0/step_00000014"
    check "... state.json keeps the restart's step (outer_restart_step 14)" \
        grep -q '"outer_restart_step": 14,' "$tmp/resumed/1/step_00000014/state.json"
    check "stopped after the rollback and resumed (rc $rc): both replicas byte-identical to the straight run at step 30" \
        sh -c "for r in 0 1; do for f in model.safetensors optimizer.safetensors outer.safetensors; do
                   cmp -s '$tmp/straight/'\$r/step_00000030/\$f '$tmp/resumed/'\$r/step_00000030/\$f || exit 1; done; done"
    # The same with streaming (2 fragments, each exchange overlapping 1 inner step): the
    # rollback takes each fragment's θ, with a fragment in flight or waiting to merge.
    stream=(--diloco_fragments 2 --diloco_overlap_steps 1)
    rc=0
    restart_run stream_straight "${stream[@]}" || rc=$?
    restart_run stream_resumed "${stream[@]}" --stop_at_step 14 || rc=$?
    restart_run stream_resumed "${stream[@]}" || rc=$?
    check "streaming: replica 1 rolls back to θ at step 14 and the runs finish (rc $rc)" \
        grep -q '"event":"rollback","step":14,"to":"outer_theta"' "$tmp/stream_straight/1/metrics.jsonl"
    check "streaming: param_hash agrees on both replicas at every fragment sync (at least 10)" \
        all_hashes_agree 10 "$tmp/stream_straight/0/metrics.jsonl" "$tmp/stream_straight/1/metrics.jsonl"
    check "streaming: stopped after the rollback and resumed: both replicas byte-identical at step 30" \
        sh -c "for r in 0 1; do for f in model.safetensors optimizer.safetensors outer.safetensors; do
                   cmp -s '$tmp/stream_straight/'\$r/step_00000030/\$f '$tmp/stream_resumed/'\$r/step_00000030/\$f || exit 1
               done; done"
    # Rolled back onto a sync step: replica 1's gradients are NaN in steps 13–15, so its weights
    # start over from θ at step 15, where it syncs with nothing trained since. Its contribution
    # goes with tokens 0 (no work) and MPI's reduction leaves it out of the mean and of the
    # contributors, as the tcp hub does: outer step 3 has contributors [0] on both replicas, its
    # mean (fp32 weights: diloco_quant none, lr 1, μ 0) is replica 0's contribution byte for byte,
    # and with diloco_min_replicas 2 the step is skipped. Counted as 1 token and a contributor
    # (before 2026-12), the mean took replica 1's Δ = 0 and the round applied with "2" contributors.
    onsync=(--max_steps 20 --diloco_quant none --diloco_outer_lr 1 --diloco_outer_momentum 0)
    onsync_run() {  # onsync_run NAME [--key value]...: fault on replica 1 at steps 13-15, dumps in $tmp/NAME.dump
        local name=$1; shift
        mkdir -p "$tmp/$name.dump"
        TRAIN_GPT_DILOCO_DUMP="$tmp/$name.dump" "${MPIRUN[@]}" 2 sh -c "[ \$OMPI_COMM_WORLD_RANK = 1 ] && \
            export TRAIN_GPT_FAULT=nan_grad:12,nan_grad:13,nan_grad:14; \
            exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${restart[@]}" "${onsync[@]}" "$@") \
            --out_dir '$tmp/$name/'\$OMPI_COMM_WORLD_RANK" >>"$tmp/$name.log" 2>&1
    }
    outer_line() {  # outer_line METRICS OUTER_STEP: that step's contributors, applied and tokens
        grep "\"outer_step\":$2,.*\"contributors\"" "$1" |
            sed -E 's/.*"contributors":\[([0-9,]*)\],"applied":([a-z]*),.*"tokens":([0-9]+).*/[\1] \2 \3/'
    }
    rc=0
    onsync_run onsync || rc=$?
    check "rollback onto a sync step (MPI): the run finishes (rc $rc), replica 1 rolls back at step 15 (5 steps dropped)" \
        sh -c "[ $rc -eq 0 ] && grep -q '\"event\":\"rollback\",\"step\":15,\"to\":\"outer_theta\",\"outer_step\":2,\"discarded_steps\":5,' \
               '$tmp/onsync/1/metrics.jsonl'"
    got0=$(outer_line "$tmp/onsync/0/metrics.jsonl" 3)
    got1=$(outer_line "$tmp/onsync/1/metrics.jsonl" 3)
    check "... its sync there goes with tokens 0, left out: outer step 3 applied with contributors [0] (got '$got0' / '$got1')" \
        sh -c "[ '$got0' = '[0] true 640' ] && [ '$got1' = '[0] true 0' ]"
    check "... the mean of outer step 3 is replica 0's contribution byte for byte, on both replicas" \
        sh -c "cmp '$tmp/onsync.dump/sent_0_00003_0.bin' '$tmp/onsync.dump/mean_0_00003_0.bin' &&
               cmp '$tmp/onsync.dump/sent_0_00003_0.bin' '$tmp/onsync.dump/mean_1_00003_0.bin'"
    check "... and param_hash agrees on both replicas at all 4 outer steps" \
        all_hashes_agree 4 "$tmp/onsync/0/metrics.jsonl" "$tmp/onsync/1/metrics.jsonl"
    rc=0
    onsync_run onsync_min --diloco_min_replicas 2 || rc=$?
    got0=$(outer_line "$tmp/onsync_min/0/metrics.jsonl" 3)
    check "... with diloco_min_replicas 2 outer step 3 is skipped, one contributor (rc $rc, got '$got0')" \
        sh -c "[ $rc -eq 0 ] && [ '$got0' = '[0] false 640' ] &&
               grep -q '\"outer_step\":3,.*\"skipped\":\"1 contributor(s), diloco_min_replicas is 2\"' '$tmp/onsync_min/1/metrics.jsonl'"

# 15. One replica (mpi transport, one process), H 16 in 4 fragments, each exchange overlapping 3
#     inner steps: fragment 0 begins after step 4 and lands after step 7. Steps 5-7 are NaN, so
#     the rollback to θ comes at step 7, before the landing. The merge blended the rolled-back
#     weights (the old θ) in with α 0.5: half of an outer step taken back (with one replica, lr 1
#     and μ 0 the merge is θ exactly). And a run stopped at step 5 or 6 (its checkpoint lands the
#     fragment early, so its rollback took the new θ) ended elsewhere than the straight run.
    inflight=(--n_layer 4 --diloco_inner_steps 16 --diloco_fragments 4 --diloco_overlap_steps 3 --max_steps 24
        --diloco_replicas 1 --diloco_transport mpi --max_bad_steps 3 --ckpt_every 1000)
    inflight_run() {  # inflight_run NAME [--key value]...: NaN in steps 5-7, dumps in $tmp/NAME.dump
        mkdir -p "$tmp/$1.dump"
        TRAIN_GPT_DILOCO_DUMP="$tmp/$1.dump" TRAIN_GPT_FAULT=nan_grad:4,nan_grad:5,nan_grad:6 \
            "$TRAIN_GPT" "${common[@]}" "${inflight[@]}" "${@:2}" --out_dir "$tmp/$1" >>"$tmp/$1.log" 2>&1
    }
    rc=0
    inflight_run inflight --diloco_quant none --diloco_outer_lr 1 --diloco_outer_momentum 0 || rc=$?
    merged_is_theta() {  # the merge dump: weights before, θ, weights after; after = θ bit for bit
        "$PYTHON" -c "
import sys
raw = open(sys.argv[1], 'rb').read(); n = len(raw) // 3
sys.exit(0 if n > 0 and raw[n:2 * n] == raw[2 * n:] else 1)" "$1"
    }
    check "rollback in flight: the run finishes (rc $rc), rolled back at step 7" \
        sh -c "[ $rc -eq 0 ] && grep -q '\"event\":\"rollback\",\"step\":7,\"to\":\"outer_theta\"' '$tmp/inflight/metrics.jsonl'"
    check "... fragment 0 lands after it and takes θ bit for bit (one replica, lr 1, μ 0)" \
        merged_is_theta "$tmp/inflight.dump/merge_0_00001_0.f32"
    q8=(--diloco_quant int8 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9)
    inflight_run q8_straight "${q8[@]}" || rc=$?
    for stop in 5 6; do
        inflight_run "q8_stop$stop" "${q8[@]}" --stop_at_step "$stop" || rc=$?
        inflight_run "q8_stop$stop" "${q8[@]}" || rc=$?
        check "... int8, μ 0.9: stopped at step $stop (fragment in flight) and resumed: byte-identical at step 24 (rc $rc)" \
            sh -c "for f in model.safetensors optimizer.safetensors outer.safetensors; do
                       cmp -s '$tmp/q8_straight/step_00000024/'\$f '$tmp/q8_stop$stop/step_00000024/'\$f || exit 1; done"
    done
fi
finish test_guards
