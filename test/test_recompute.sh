# Activation recomputation through the trainer (issue #18, docs/config.md#memory). On the CPU
# every mode calls the same kernels on the same inputs as none, so there is no tolerance:
# equal means the same loss digits in metrics.jsonl and byte-identical checkpoints. All runs
# use the same thread count (the default: every core), as bit-exactness needs.
#  1. test/test_recompute.c under mpirun -np 2 (make test runs it as one rank): the sharded
#     backend with recompute against the sharded backend without, bit for bit.
#  2. The tiny test model and a 4-layer one, grad_accum 2, 10 steps: selective, full and full on
#     every 2nd layer give none's losses and byte-identical model and optimizer checkpoints.
#  3. Resume: stopped at step 5 with full and resumed with full, and stopped with selective and
#     resumed with full (the mode is not part of the state): byte-identical to none's straight run.
#  4. FSDP over 2 ranks (the trainer): full = none, byte for byte.
#  5. The end event's activation_peak_mb (the allocator's count) shrinks: full < selective < none.
#  6. Config errors: an unknown mode, recompute_layers without a mode.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
detect_mpi
if [ "$HAVE_MPI" = 1 ]; then
    check_ranks 2 "$BUILD/test_recompute" "$tmp/np2.log"
else
    say "  skip: np 2 (no MPI in this build)"
fi

"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --grad_accum 2 --max_steps 10 --shuffle 1
    --ckpt_every 5 --ckpt_keep 0 --log_every 100)
run() {  # run OUT_DIR [--key value]...
    local out=$1; shift
    "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$out.log" 2>&1
}
same_as() {  # same_as REFERENCE_DIR OUT_DIR: the same losses, byte-identical step-10 checkpoints
    [ "$(loss_table "$1/metrics.jsonl")" = "$(loss_table "$2/metrics.jsonl")" ] &&
        cmp -s "$1/step_00000010/model.safetensors" "$2/step_00000010/model.safetensors" &&
        cmp -s "$1/step_00000010/optimizer.safetensors" "$2/step_00000010/optimizer.safetensors"
}
end_field() {  # end_field OUT_DIR FIELD: a number of the end event
    grep '"event":"end"' "$1/metrics.jsonl" | tail -n 1 | sed "s/.*\"$2\":\([0-9.]*\).*/\1/"
}

for layers in 2 4; do
    run "$tmp/none$layers" --n_layer $layers --recompute none
    check "$layers layers, none: 10 steps" test -f "$tmp/none$layers/step_00000010/model.safetensors"
    run "$tmp/sel$layers" --n_layer $layers --recompute selective
    run "$tmp/full$layers" --n_layer $layers --recompute full
    run "$tmp/every$layers" --n_layer $layers --recompute full --recompute_layers 2
    check "$layers layers, selective = none (losses, checkpoints)" same_as "$tmp/none$layers" "$tmp/sel$layers"
    check "$layers layers, full = none (losses, checkpoints)" same_as "$tmp/none$layers" "$tmp/full$layers"
    check "$layers layers, full on every 2nd layer = none" same_as "$tmp/none$layers" "$tmp/every$layers"
    check "$layers layers, the banner names the mode" grep -q 'activations (recompute full on 1 layer in 2)' \
        "$tmp/every$layers.log"
done
say "  activation_peak_mb, 4 layers: none $(end_field "$tmp/none4" activation_peak_mb), selective" \
    "$(end_field "$tmp/sel4" activation_peak_mb), full $(end_field "$tmp/full4" activation_peak_mb), full on every" \
    "2nd $(end_field "$tmp/every4" activation_peak_mb)"
check "activation_peak_mb: full < full on every 2nd < none, full < selective < none" "$PYTHON" -c "
n, s, f, e = $(end_field "$tmp/none4" activation_peak_mb), $(end_field "$tmp/sel4" activation_peak_mb), \
    $(end_field "$tmp/full4" activation_peak_mb), $(end_field "$tmp/every4" activation_peak_mb)
import sys; sys.exit(0 if f < e < n and f < s < n else 1)"

# 3. resume
run "$tmp/stop_full" --n_layer 4 --recompute full --stop_at_step 5
check "full: stopped with a checkpoint at step 5" test -d "$tmp/stop_full/step_00000005"
run "$tmp/stop_full" --n_layer 4 --recompute full
check "full: stop at 5 + resume = none's straight run, byte for byte" same_as "$tmp/none4" "$tmp/stop_full"
run "$tmp/switch" --n_layer 4 --recompute selective --stop_at_step 5
run "$tmp/switch" --n_layer 4 --recompute full
check "selective stopped at 5, resumed as full = none's straight run" same_as "$tmp/none4" "$tmp/switch"

# 4. FSDP, the trainer at np 2
if [ "$HAVE_MPI" = 1 ]; then
    for mode in none full; do
        "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --n_layer 4 --grad_accum 1 --threads 1 --recompute $mode \
            --out_dir "$tmp/np2_$mode" >"$tmp/np2_$mode.log" 2>&1 || cat "$tmp/np2_$mode.log"
    done
    check "FSDP np 2: full = none (losses, checkpoints)" same_as "$tmp/np2_none" "$tmp/np2_full"
fi

# 6. config errors
rc=0; "$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/bad" --recompute some >"$tmp/bad.log" 2>&1 || rc=$?
check "recompute = some: refused (rc $rc) naming the choices" \
    sh -c "[ $rc -eq 1 ] && grep -q 'expected one of auto|none|selective|full' '$tmp/bad.log'"
rc=0; "$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/bad" --recompute none --recompute_layers 2 >"$tmp/bad.log" 2>&1 || rc=$?
check "recompute_layers 2 with recompute = none: refused (rc $rc)" \
    sh -c "[ $rc -eq 1 ] && grep -q 'recompute_layers.*no effect with recompute = none' '$tmp/bad.log'"
finish test_recompute
