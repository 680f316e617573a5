# The training-health guards (docs/config.md#training-health). The spike guard:
#   1. an injected finite spike (one gradient element set to 1e4 after the window is full)
#      is skipped and logged; with spike_z = 0 the same step is applied (the check fails
#      without the guard);
#   2. before the window is full the guard does not act;
#   3. the window is part of the run's state: stop before the spike, resume, and the spike
#      after the resume is skipped as in the straight run — model and optimizer bit-exact;
#   4. spikes in a row stop the run at max_bad_steps with one line naming spike_z;
#   5. 1000 steps of a healthy run: no step skipped (the limit is not noise).
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
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
finish test_guards
