# make check-emu-asan's trainer part: build/asan/train_gpt_emu (the GPU backend on the
# emulator, under AddressSanitizer) trains the FSDP test model at np 2 with each deferred-stream
# schedule (TRAIN_GPT_EMU_DEFER=first and others: test/warp_emu.h) and at np 1 with the model's
# stream deferred, 4 steps with validation and checkpoints: an op that runs after what it reads
# was freed, or past an allocation, is reported. Needs MPI for the np 2 runs (skipped without).
# Usage: bash test/emu_asan_fsdp.sh ASAN_BUILD_DIR TOOL
set -uo pipefail
emu=$1/train_gpt_emu
tool=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$tool" shard "$tmp/train.bin" 512 0 50000 21 >/dev/null
"$tool" shard "$tmp/val.bin" 512 0 5000 22 >/dev/null
common=(test/configs/gpu_tiny.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 2 --val_tokens 192
    --log_every 1 --ckpt_keep 0 --n_layer 2 --d_model 64 --n_head 2 --n_kv_head 1 --d_ff 128 --seq_len 64 --batch_size 1
    --max_steps 4 --warmup_steps 2 --threads 1 --ckpt_every 2 --device cuda)
export ASAN_OPTIONS=detect_leaks=0
mpirun=(mpirun --oversubscribe -np 2)
[ "$(id -u)" -eq 0 ] && mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2)
failed=0
one() {  # one LABEL COMMAND...
    local label=$1; shift
    "$@" >"$tmp/run.log" 2>&1
    local rc=$?
    if [ "$rc" -eq 0 ] && ! grep -q "ERROR: AddressSanitizer" "$tmp/run.log"; then
        echo "  ok   $label"
    else
        echo "  FAIL $label (exit $rc)"; grep -m 5 -A 12 "ERROR: AddressSanitizer" "$tmp/run.log" || tail -n 5 "$tmp/run.log"
        failed=1
    fi
}
if command -v mpirun >/dev/null && ldd "$emu" | grep libmpi >/dev/null; then
    for mode in first others; do
        TRAIN_GPT_EMU_DEFER=$mode one "np 2, TRAIN_GPT_EMU_DEFER=$mode" "${mpirun[@]}" "$emu" "${common[@]}" \
            --grad_accum 2 --out_dir "$tmp/np2_$mode"
    done
else
    echo "  skip the np 2 runs (no MPI)"
fi
TRAIN_GPT_EMU_DEFER=first one "np 1, TRAIN_GPT_EMU_DEFER=first" "$emu" "${common[@]}" --out_dir "$tmp/np1"
exit $failed
