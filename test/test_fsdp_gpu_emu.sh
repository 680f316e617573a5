# FSDP and HSDP on the GPU backend (issue #14; docs/fsdp.md "The GPU path"), run on the CPU:
# build/train_gpt_emu is train_gpt.cu's GPU model on the emulated GPU (test/warp_emu.h), its
# collectives NCCL's calls over MPI between the processes (test/nccl_emu.h). Without MPI:
# skipped, said so. A smaller model than the CPU's FSDP test (2 layers of d_model 64, one
# sequence of 64 per micro-batch but in np2_b2), 8 steps, at one global batch (np × grad_accum
# × batch_size = 4 rows):
#  1. np 1, np 2 (with and without prefetch, and without resharding), np 4, HSDP 1 × 2 and
#     2 × 2, and np 2 at batch_size 2 with grad_accum 1 (np2_b2: the same 4 rows per step,
#     2 per micro-batch): the losses agree with np 1 within 5e-4 relative. The forward of every
#     split is the same bits (the same fp32 weights, the same bf16 copy); the gradients differ
#     in the order of their fp32 additions (a few ulp), which moves a few weights across a bf16
#     rounding boundary after an AdamW step: measured 4e-5 at worst over 8 steps (np2_b2, whose
#     two rows' gradients add inside each matmul, 8e-5). A wrong piece or a lost micro-batch
#     moves the loss by 1e-2 within a step or two; the attention giving every row row 0's
#     document starts moves np2_b2's by 0.12 (val_loss 5e-3), which the splits at one row pass.
#  2. the splits that add the same values in the same order are the same bits: np 2 with and
#     without prefetch (the comm stream is the model's stream without it), and without
#     resharding; HSDP 2 × 2 as np 2 (a copy's sum of two ranks' gradients, as a group's).
#     The streams: np 2 and HSDP 2 × 2 again with the emulator's streams deferred
#     (TRAIN_GPT_EMU_DEFER, test/warp_emu.h): the model's stream run only when waited for, so
#     the comm stream runs as early as its events allow ("first"), and the comm stream run
#     only when waited for, as late as possible ("others"): the same bits. A missing event
#     between the two reads a buffer too early or too late and changes the losses (planted:
#     no wait for a gather before its unit's compute → "others" differs from step 1; a gather
#     not waiting for the model's stream → "first" differs from step 1; the step not waiting
#     for the last reduce-scatter → "others" differs from step 2).
#  3. np 2 twice: byte-identical checkpoints; stopped at step 4 and resumed at np 2: byte-identical
#     to the straight run.
#  4. np 2's checkpoint has the one-process layout (size and header bytes), and its step-4
#     checkpoint resumed at np 1 on the GPU and at np 2 on the CPU gives the np 2 run's step-5
#     loss (the same weights: within 5e-4, bf16 against fp32 for the CPU within 1e-3).
#  5. np 2 against the CPU backend at np 2: within 1e-3 per step (bf16 against fp32, as
#     test_gpu_train.sh's emulated run, measured 9e-5).
#  6. np 2 holds half of the weights, gradients and moments per rank, on the host and on the
#     GPU (device_state_mb of the end event: what the GPU backend allocated for them).
#  7. TRAIN_GPT_FSDP_UNITS=1: one rank through the sharded passes (a world of one) equals np 4's
#     order of additions: the same losses as np 4 within 5e-4.
#  1b. Validation over 3 rows (at np 2 and 4 a rank's last turn has none, and still takes part in
#     the gathers; at batch_size 2 rank 0's turn has 2 rows, rank 1's 1): the val_loss as np 1's
#     within 5e-4; every run's start line plans per rank what its GPU then allocated (within
#     0.05 MiB: 256-byte rounding, small tables).
#  8. DiLoCo over GPU-sharded replicas: 2 replicas of 2 ranks each (tcp through one relay of 2
#     hubs, int8 with error feedback, H = 4, 8 steps): both exit 0, both outer steps applied
#     with both replicas, param_hash equal on both at each. The same with HSDP replicas of 1
#     shard x 2 copies (the second copy takes DiLoCo's weights from the first and uploads them
#     to its GPU; the copies' check passes at both checkpoints), and streaming (2 fragments,
#     1 step in flight: the second copy takes only the changed span into the weights it
#     trained; the copies' check passes at every checkpoint, every 2 steps).
. "$(dirname "$0")/lib.sh"
require_mpi
tmp_with_processes
EMU="$BUILD/train_gpt_emu"
"$TOOL" shard "$tmp/train.bin" 512 0 100000 21
"$TOOL" shard "$tmp/val.bin" 512 0 5000 22
common=(test/configs/gpu_tiny.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 4
    --val_tokens 192 --log_every 1 --ckpt_every 4 --ckpt_keep 0 --n_layer 2 --d_model 64 --n_head 2 --n_kv_head 1
    --d_ff 128 --seq_len 64 --batch_size 1 --max_steps 8 --warmup_steps 2 --threads 1)
run() {  # run NP BINARY DEVICE OUT_DIR [--key value]...: grad_accum 4 / NP
    local np=$1 bin=$2 dev=$3 out=$4; shift 4
    local args=("${common[@]}" --device "$dev" --grad_accum $((4 / np)) --out_dir "$out" "$@")
    if [ "$np" = 1 ]; then "$bin" "${args[@]}" >"$out.log" 2>&1
    else "${MPIRUN[@]}" "$np" "$bin" "${args[@]}" >"$out.log" 2>&1; fi
}
close() {  # close A B TOLERANCE [FIRST_STEP]: the losses of every step A logged, relative to B's
    "$PYTHON" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "${4:-1}" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if "loss" in d and "step" in d and "event" not in d:
            out[d["step"]] = d["loss"]
    return out
a, b, tol, first = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
steps = [s for s in a if s >= first]
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps) if steps and all(s in b for s in steps) else float("inf")
print("    %d steps, worst relative difference %.2g (tolerance %g)" % (len(steps), worst, tol))
sys.exit(0 if worst <= tol else 1)
PY
}
same_losses() { cmp -s <(grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl") <(grep -o '"step":[0-9]*,"loss":[^,]*' "$2/metrics.jsonl"); }
same_ckpt() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.safetensors" "$2/optimizer.safetensors"; }
header_of() {
    "$PYTHON" -c 'import sys,struct; b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; sys.stdout.buffer.write(b[:8+n])' "$1"
}
same_layout() { [ "$(stat -c %s "$1")" = "$(stat -c %s "$2")" ] && cmp -s <(header_of "$1") <(header_of "$2"); }
end_field() { grep '"event":"end"' "$1/metrics.jsonl" | tail -n 1 | sed "s/.*\"$2\":\([0-9.]*\).*/\1/"; }

run 1 "$EMU" cuda "$tmp/np1"
if ! run 2 "$EMU" cuda "$tmp/np2"; then
    tail -n 5 "$tmp/np2.log"
    die "test_fsdp_gpu_emu: train_gpt_emu --device cuda did not run at np 2"
fi
run 2 "$EMU" cuda "$tmp/np2_noprefetch" --fsdp_prefetch 0
run 2 "$EMU" cuda "$tmp/np2_keep" --fsdp_reshard_after_forward 0
run 4 "$EMU" cuda "$tmp/np4"
run 2 "$EMU" cuda "$tmp/hsdp12" --fsdp_size 1 --dp_replicate 2
run 4 "$EMU" cuda "$tmp/hsdp22" --fsdp_size 2
run 2 "$EMU" cuda "$tmp/np2_b2" --batch_size 2 --grad_accum 1
check "np 2 says FSDP over 2 on the GPU" grep -q 'FSDP over 2, 1 copy' "$tmp/np2.log"
val_close() {  # val_close A B: the validation losses (3 rows: at np 2 and 4 a rank's last turn is empty)
    "$PYTHON" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def val(path):
    return {d["step"]: (d["val_loss"], d["val_tokens"]) for d in map(json.loads, open(path)) if "val_loss" in d}
a, b = val(sys.argv[1]), val(sys.argv[2])
ok = len(a) == 2 and a.keys() == b.keys() and all(a[s][1] == b[s][1] == 192 for s in a)
worst = max(abs(a[s][0] - b[s][0]) / b[s][0] for s in a) if ok else float("inf")
print("    val_loss at steps %s, worst relative difference %.2g (tolerance 5e-4)" % (sorted(a), worst))
sys.exit(0 if ok and worst <= 5e-4 else 1)
PY
}
planned_vs_allocated() {  # the start line's plan against what rank 0's GPU allocated, within 0.05 MiB
    "$PYTHON" - "$1" <<'PY'
import re, sys
m = re.search(r"planned per rank: ([0-9.]+) MiB .*allocated on this GPU: ([0-9.]+) MiB", open(sys.argv[1]).read())
print("    planned %s MiB, allocated %s MiB" % (m.group(1), m.group(2)) if m else "    no plan line")
sys.exit(0 if m and abs(float(m.group(1)) - float(m.group(2))) <= 0.05 else 1)
PY
}
for r in np2 np2_noprefetch np2_keep np4 hsdp12 hsdp22 np2_b2; do
    check "$r: 8 steps, losses as np 1 within 5e-4" close "$tmp/$r" "$tmp/np1" 5e-4
done
for r in np2 np4 hsdp12 np2_b2; do
    check "$r: validation (a rank's turn without rows included) as np 1's within 5e-4" val_close "$tmp/$r" "$tmp/np1"
done
for r in np2 np2_keep np4 hsdp12 hsdp22 np2_b2; do
    check "$r: the start line's plan per rank is what the GPU allocated" planned_vs_allocated "$tmp/$r.log"
done
check "np 2 without prefetch: the same bits as with it" same_losses "$tmp/np2" "$tmp/np2_noprefetch"
check "np 2 without resharding: the same bits" same_losses "$tmp/np2" "$tmp/np2_keep"
check "HSDP 2 x 2: the same bits as np 2" same_losses "$tmp/np2" "$tmp/hsdp22"
TRAIN_GPT_EMU_DEFER=first run 2 "$EMU" cuda "$tmp/np2_first"
TRAIN_GPT_EMU_DEFER=others run 2 "$EMU" cuda "$tmp/np2_others"
TRAIN_GPT_EMU_DEFER=others run 4 "$EMU" cuda "$tmp/hsdp22_others" --fsdp_size 2
check "np 2, the model's stream deferred (collectives as early as their events allow): the same bits" \
    same_losses "$tmp/np2" "$tmp/np2_first"
check "np 2, the comm stream deferred (collectives as late as possible): the same bits" \
    same_losses "$tmp/np2" "$tmp/np2_others"
check "HSDP 2 x 2, the comm stream deferred: the same bits" same_losses "$tmp/hsdp22" "$tmp/hsdp22_others"

run 2 "$EMU" cuda "$tmp/np2b"
check "np 2 twice: byte-identical checkpoints" same_ckpt "$tmp/np2/step_00000008" "$tmp/np2b/step_00000008"
run 2 "$EMU" cuda "$tmp/stop" --stop_at_step 4
run 2 "$EMU" cuda "$tmp/stop"
check "np 2 stopped at step 4 and resumed: byte-identical to the straight run" \
    same_ckpt "$tmp/np2/step_00000008" "$tmp/stop/step_00000008"
for f in model.safetensors optimizer.safetensors; do
    check "np 2's $f has the one-process layout (size and header bytes)" \
        same_layout "$tmp/np2/step_00000008/$f" "$tmp/np1/step_00000008/$f"
done
mkdir -p "$tmp/to1" "$tmp/tocpu"
cp -r "$tmp/np2/step_00000004" "$tmp/to1/"
cp -r "$tmp/np2/step_00000004" "$tmp/tocpu/"
run 1 "$EMU" cuda "$tmp/to1" --max_steps 5
check "np 2's step-4 checkpoint at np 1 (GPU): step 5 as np 2's within 5e-4" close "$tmp/to1" "$tmp/np2" 5e-4 5
run 2 "$TRAIN_GPT" cpu "$tmp/tocpu" --max_steps 5
check "np 2's step-4 checkpoint at np 2 on the CPU: step 5 as the GPU's within 1e-3" close "$tmp/tocpu" "$tmp/np2" 1e-3 5

run 2 "$TRAIN_GPT" cpu "$tmp/cpu2"
check "np 2 on the GPU against np 2 on the CPU: within 1e-3 per step" close "$tmp/np2" "$tmp/cpu2" 1e-3

s1=$(end_field "$tmp/np1" state_mb) s2=$(end_field "$tmp/np2" state_mb)
g1=$(end_field "$tmp/np1" device_state_mb) g2=$(end_field "$tmp/np2" device_state_mb)
say "  per rank: state np 1 $s1 MB, np 2 $s2 MB (host); on the GPU np 1 $g1 MB, np 2 $g2 MB (+ $(end_field "$tmp/np2" gathered_peak_mb) MB of gathered units at most)"
check "np 2 holds half the state per rank on the host (+ padding)" "$PYTHON" -c "
import sys; a, b = $s1, $s2; sys.exit(0 if a / 2 <= b <= a / 2 + 0.001 else 1)"
check "np 2 holds half the state per rank on the GPU (+ padding and 256-byte rounding)" "$PYTHON" -c "
import sys; a, b = $g1, $g2; sys.exit(0 if a / 2 - 0.001 <= b <= a / 2 + 0.002 else 1)"

TRAIN_GPT_FSDP_UNITS=1 run 1 "$EMU" cuda "$tmp/units1"
check "TRAIN_GPT_FSDP_UNITS=1: one rank through the sharded passes, losses as np 4's within 5e-4" \
    close "$tmp/units1" "$tmp/np4" 5e-4
make_secret "$tmp/secret"
start_relay sharded 2 10   # lib.sh's: another port when port or port + 1 is taken meanwhile
dl=(--diloco_replicas 2 --diloco_inner_steps 4 --diloco_transport tcp --diloco_secret_file "$tmp/secret"
    --diloco_rendezvous "127.0.0.1:$port" --diloco_quant int8 --diloco_error_feedback 1 --diloco_min_replicas 2
    --diloco_timeout_s 10 --diloco_connect_timeout_s 60 --fsdp_size 2 --ckpt_every 0)
two_replicas() {  # two_replicas NAME [--key value]...: replicas 0 and 1 (2 GPU ranks, $dl) into $tmp/NAME<id>; sets rc
    local name=$1 id
    shift
    for id in 0 1; do
        "${MPIRUN[@]}" 2 "$EMU" "${common[@]}" --device cuda --grad_accum 1 --out_dir "$tmp/$name$id" "${dl[@]}" \
            "$@" --diloco_replica_id $id >"$tmp/$name$id.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    wait "${pids[-2]}" || rc=$?
    wait "${pids[-1]}" || rc=$?
}
two_replicas dl
check "DiLoCo, 2 replicas x 2 GPU ranks: both exit 0 (rc $rc)" test "$rc" -eq 0
check "  both outer steps applied with both replicas" \
    test "$(grep -c '"contributors":\[0,1\],"applied":true' "$tmp/dl0/metrics.jsonl")" -eq 2
check "  param_hash equal on both replicas at every outer step (2)" \
    all_hashes_agree 2 "$tmp/dl0/metrics.jsonl" "$tmp/dl1/metrics.jsonl"
# 8b. HSDP replicas: 1 shard x 2 copies each (relay of 1 hub); the second copy follows the first.
start_relay hsdp 1 10
two_replicas hd --diloco_rendezvous "127.0.0.1:$port" --fsdp_size 1 --dp_replicate 2 --ckpt_every 4
check "DiLoCo, 2 replicas x (1 GPU shard x 2 copies): both exit 0 (rc $rc)" test "$rc" -eq 0
check "  both outer steps applied with both replicas" \
    test "$(grep -c '"contributors":\[0,1\],"applied":true' "$tmp/hd0/metrics.jsonl")" -eq 2
check "  param_hash equal on both replicas at every outer step (2)" \
    all_hashes_agree 2 "$tmp/hd0/metrics.jsonl" "$tmp/hd1/metrics.jsonl"
check "  the copies' weights agreed at both checkpoints (steps 4 and 8 written)" \
    test -d "$tmp/hd0/step_00000004" -a -d "$tmp/hd0/step_00000008" -a -d "$tmp/hd1/step_00000008"
# 8c. The same, streaming (2 fragments, 1 step in flight): the second copy receives only the
# span each landing or merge changed, into the weights it trained on its GPU (which its host
# copy does not hold). The copies' check at every checkpoint (every 2 steps) fails otherwise.
two_replicas hs --diloco_rendezvous "127.0.0.1:$port" --fsdp_size 1 --dp_replicate 2 --ckpt_every 2 \
    --diloco_fragments 2 --diloco_overlap_steps 1
check "streaming DiLoCo, 2 replicas x (1 GPU shard x 2 copies): both exit 0 (rc $rc)" test "$rc" -eq 0
check "  param_hash equal on both replicas at every outer step (>= 3)" \
    all_hashes_agree 3 "$tmp/hs0/metrics.jsonl" "$tmp/hs1/metrics.jsonl"
check "  the copies' weights agreed at every checkpoint (steps 2 to 8 written)" \
    test -d "$tmp/hs0/step_00000002" -a -d "$tmp/hs0/step_00000006" -a -d "$tmp/hs1/step_00000008"
# A job whose ranks are on different backends (one rank without a usable GPU: device = auto on a
# task given none) is refused at the start, by each rank in one line, status 1: the GPU ranks
# waited in NCCL's start for the CPU one, and after comm_timeout_s every rank blamed a dead rank
# (status 75, which the job scripts requeue). comm_timeout_s 120: a hang is a failure, not a wait.
rc=0
mixed=("${common[@]}" --grad_accum 2 --comm_timeout_s 120 --out_dir "$tmp/mixed")
timeout 300 "${MPIRUN[@]}" 1 "$EMU" "${mixed[@]}" --device cuda : -np 1 "$EMU" "${mixed[@]}" --device cpu \
    >"$tmp/mixed.log" 2>&1 || rc=$?
check "ranks on a GPU and on the CPU: refused at the start, status 1 (rc $rc), each rank saying which it is" \
    sh -c "[ $rc -eq 1 ] && grep -q 'rank 1: error: device = cpu on this rank, but other ranks of the job train on a GPU' '$tmp/mixed.log' &&
           grep -q 'rank 0: error: device = cuda: this rank trains on its GPU, but another rank of the job has none' '$tmp/mixed.log'"
# A collective that fails for a peer or the network (ncclRemoteError, ncclSystemError) exits 75,
# which the job scripts requeue, as the same loss seen asynchronously does (it exited 1: the
# requeue chain ended).
rc=0
timeout 300 "${MPIRUN[@]}" 2 -x NCCL_EMU_REMOTE_ERROR=1 "$EMU" "${common[@]}" --device cuda --grad_accum 2 \
    --out_dir "$tmp/remote" >"$tmp/remote.log" 2>&1 || rc=$?
check "a collective's remote error: status 75 (rc $rc), the call and the group named" \
    sh -c "[ $rc -eq 75 ] && grep -q 'rank [01]: error: NCCL: .* failed on rank [01] of the fsdp group: .*exiting with status 75' '$tmp/remote.log'"
# A peer's loss seen asynchronously, and the communicator's abort then blocking (as NCCL's may
# when a peer died): the rank still exits 75 within comm_timeout_s of the abort (it sat until the
# job's walltime). comm_timeout_s 5; the outer timeout of 120 s is the hang's verdict. (The
# model's stream deferred: the host's wait finds its event not ready and looks for NCCL's
# asynchronous error, as on a GPU.)
rc=0
timeout 120 "${MPIRUN[@]}" 2 -x NCCL_EMU_ASYNC_ERROR=1 -x NCCL_EMU_ABORT_HANGS=1 -x TRAIN_GPT_EMU_DEFER=first "$EMU" "${common[@]}" --device cuda \
    --grad_accum 2 --comm_timeout_s 5 --out_dir "$tmp/abort" >"$tmp/abort.log" 2>&1 || rc=$?
check "an abort that blocks after a peer's loss: status 75 (rc $rc), said in one line" \
    sh -c "[ $rc -eq 75 ] && grep -q 'error: fsdp: rank [01] of the fsdp group: aborting its NCCL communicators took more than 5 s (comm_timeout_s); exiting with status 75' '$tmp/abort.log'"
finish test_fsdp_gpu_emu
