# FSDP on the CPU over MPI ranks (oversubscribed: 2 cores; docs/fsdp.md). Without MPI: skipped,
# said so.
#  1. test/test_fsdp.c at np 2 and 4: the sharded backend against the whole-model backend,
#     HSDP 2 × 2 too (make test also runs it as one rank: the whole backend bit for bit).
#  2. The trainer, tiny model, 20 steps at the same global batch (np 1 × grad_accum 4, np 2 × 2,
#     np 4 × 1, HSDP 2 × 2): the losses agree within 1e-5 relative — the runs differ only in
#     the order of fp32 gradient additions (a few ulp), and 20 AdamW steps keep that far
#     below 1e-5 of a loss of ~2-6 (measured: equal to the 7 digits the log keeps); a wrong
#     piece or a lost gradient changes the loss in the 2nd-3rd digit within a step or two.
#  3. np 4 twice: byte-identical checkpoints; np 4 stopped at step 10 and resumed at np 4:
#     byte-identical to the straight run.
#  4. np 4's checkpoint has the one-process layout: the same files, sizes and header bytes,
#     and it verifies (checksums.xxh64 by our reader on resume).
#  5. np 4's step-10 checkpoint resumed at np 2 and at np 1 continues: the losses of steps
#     11-20 within the tolerance of 2. of the np 4 run (so the weights and moments were
#     read back into other splits exactly enough to continue the same run).
#  6. Memory: weights + grads + moments per rank at np 4 are 1/4 of one process's (+ the
#     padding of at most 3 values per unit), plus the gathered layers.
. "$(dirname "$0")/lib.sh"
require_mpi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for np in 2 4; do
    check_ranks "$np" "$BUILD/test_fsdp" "$tmp/np$np.log"
    grep '(rank 0)' "$tmp/np$np.log" || true
done

"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 10
    --val_tokens 256 --shuffle 1 --ckpt_every 5 --ckpt_keep 0 --log_every 100 --threads 1)
run() {  # run NP OUT_DIR [--key value]...
    local np=$1 out=$2; shift 2
    if [ "$np" = 1 ]; then "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$out.log" 2>&1
    else "${MPIRUN[@]}" "$np" "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$out.log" 2>&1; fi
}
close_losses() {  # close_losses A B [FIRST_STEP]: every step both logged, within 1e-5 relative
    "$PYTHON" - "$1/metrics.jsonl" "$2/metrics.jsonl" "${3:-1}" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if "loss" in d and "step" in d and "event" not in d:
            out[d["step"]] = d["loss"]
    return out
a, b, first = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
steps = [s for s in a if s >= first]
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps) if all(s in b for s in steps) and steps else float("inf")
print("  %d steps, worst relative difference %.2g" % (len(steps), worst))
sys.exit(0 if worst < 1e-5 else 1)
PY
}
same_ckpt() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.safetensors" "$2/optimizer.safetensors"; }
header_of() {  # the 8-byte length and the JSON header of a safetensors file
    "$PYTHON" -c 'import sys,struct; b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; sys.stdout.buffer.write(b[:8+n])' "$1"
}

run 1 "$tmp/np1" --grad_accum 4
run 2 "$tmp/np2" --grad_accum 2
run 4 "$tmp/np4" --grad_accum 1
run 4 "$tmp/np4b" --grad_accum 1
run 4 "$tmp/hsdp" --grad_accum 1 --fsdp_size 2
for r in np2 np4 hsdp; do
    check "$r: 20 steps, losses as np 1 x grad_accum 4 within 1e-5" close_losses "$tmp/np1" "$tmp/$r"
done
check "np 4 says FSDP over 4 / HSDP says 2 copies" \
    sh -c "grep -q 'FSDP over 4, 1 copy' '$tmp/np4.log' && grep -q 'FSDP over 2, 2 copies' '$tmp/hsdp.log'"
check "np 4 twice: byte-identical checkpoints" same_ckpt "$tmp/np4/step_00000020" "$tmp/np4b/step_00000020"
same_layout() {  # same_layout FILE_A FILE_B: the same size and the same header bytes
    [ "$(stat -c %s "$1")" = "$(stat -c %s "$2")" ] && cmp -s <(header_of "$1") <(header_of "$2")
}
for f in model.safetensors optimizer.safetensors; do
    check "np 4's $f has the one-process layout (size and header bytes)" \
        same_layout "$tmp/np4/step_00000020/$f" "$tmp/np1/step_00000020/$f"
done

# Resume: the same np bit-exact; np 2 and np 1 from np 4's step 10.
run 4 "$tmp/stop" --grad_accum 1 --stop_at_step 10
run 4 "$tmp/stop" --grad_accum 1
check "np 4: stop at step 10 + resume at np 4 = the straight run, byte for byte" \
    same_ckpt "$tmp/np4/step_00000020" "$tmp/stop/step_00000020"
for np in 2 1; do
    mkdir -p "$tmp/from4_np$np"
    cp -r "$tmp/np4/step_00000010" "$tmp/from4_np$np/"
    run $np "$tmp/from4_np$np" --grad_accum $((4 / np))
    check "np 4's step-10 checkpoint resumed at np $np" grep -q "resuming from '.*step_00000010'" "$tmp/from4_np$np.log"
    check "  and steps 11-20 go as np 4's within 1e-5" close_losses "$tmp/np4" "$tmp/from4_np$np" 11
done

# Memory: the state each rank holds (the end event of rank 0's metrics).
state_mb() { grep '"event":"end"' "$1/metrics.jsonl" | tail -n 1 | sed 's/.*"state_mb":\([0-9.]*\).*/\1/'; }
gathered_mb() { grep '"event":"end"' "$1/metrics.jsonl" | tail -n 1 | sed 's/.*"gathered_peak_mb":\([0-9.]*\).*/\1/'; }
say "  state per rank: np 1 $(state_mb "$tmp/np1") MB, np 2 $(state_mb "$tmp/np2") MB, np 4 $(state_mb "$tmp/np4") MB (+ $(gathered_mb "$tmp/np4") MB of gathered layers at most)"
check "np 4 holds 1/4 of the state per rank (+ padding)" "$PYTHON" -c "
a, b = $(state_mb "$tmp/np1"), $(state_mb "$tmp/np4")
import sys; sys.exit(0 if a / 4 <= b <= a / 4 + 0.001 else 1)"
finish test_fsdp
