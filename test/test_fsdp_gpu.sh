# The CUDA backend's FSDP path on real GPUs (make test-gpu; docs/fsdp.md "The GPU path"), on
# test/configs/gpu_tiny.conf with a synthetic learnable shard, 20 steps:
#  1. TRAIN_GPT_FSDP_UNITS=1 (one rank through the sharded passes: every unit gathered and
#     reduce-scattered through NCCL in a world of one, on a second stream) against the plain
#     GPU path: losses within 2e-3 relative (the forward is the same bits; the gradients are
#     added in another order, which moves a few weights across a bf16 rounding boundary, and
#     at lr 3e-3 that compounds: the emulated GPU measured 1.9e-4 over 20 steps of a smaller
#     model, 7e-5 over 8; a wrong piece or a lost gradient moves the loss by more than 1e-2).
#  2. that run twice, and with fsdp_prefetch 0 (everything on the model's stream): the same
#     bits — a missing stream dependency on the real GPU shows here as a difference.
#  3. With two GPUs or more and MPI: np 2 × grad_accum 1 against np 1 × grad_accum 2 within
#     2e-3, and np 2 twice the same bits. With one GPU: skipped, said so (NCCL refuses two
#     ranks on one GPU).
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$TOOL" shard "$tmp/train.bin" 512 0 400000 21
"$TOOL" shard "$tmp/val.bin" 512 0 20000 22
common=(test/configs/gpu_tiny.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 10
    --val_tokens 4096 --log_every 1 --ckpt_every 0 --max_steps 20 --device cuda)
run() {  # run OUT_DIR [--key value]...
    local out=$1; shift
    "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$out.log" 2>&1
}
close() {  # close A B TOLERANCE
    "$PYTHON" - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def losses(path):
    return {d["step"]: d["loss"] for d in map(json.loads, open(path)) if "loss" in d and "event" not in d}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in a) if a and all(s in b for s in a) else float("inf")
print("    %d steps, worst relative difference %.2g (tolerance %g)" % (len(a), worst, tol))
sys.exit(0 if worst <= tol and len(a) >= 20 else 1)
PY
}
same_losses() { cmp -s <(grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl") <(grep -o '"step":[0-9]*,"loss":[^,]*' "$2/metrics.jsonl"); }

if ! run "$tmp/plain"; then
    tail -n 3 "$tmp/plain.log"
    die "test_fsdp_gpu: needs a GPU"
fi
if ! TRAIN_GPT_FSDP_UNITS=1 run "$tmp/units"; then
    tail -n 3 "$tmp/units.log"
    die "test_fsdp_gpu: TRAIN_GPT_FSDP_UNITS=1 did not run (NCCL: is libnccl.so.2 on the library path?)"
fi
TRAIN_GPT_FSDP_UNITS=1 run "$tmp/units_b"
TRAIN_GPT_FSDP_UNITS=1 run "$tmp/units_serial" --fsdp_prefetch 0
check "TRAIN_GPT_FSDP_UNITS=1: 20 steps within 2e-3 of the plain GPU path" close "$tmp/units" "$tmp/plain" 2e-3
check "  twice: the same bits" same_losses "$tmp/units" "$tmp/units_b"
check "  with fsdp_prefetch 0 (one stream): the same bits" same_losses "$tmp/units" "$tmp/units_serial"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# AMD (the HIP build, RCCL): the GPUs this job may use (ROCR_VISIBLE_DEVICES, as SLURM sets
# it), else the distinct GPU[i] indices rocm-smi lists (one per GCD of an MI250X; it prints
# several lines per GPU and ignores the visibility variables).
if [ "${gpus:-0}" -eq 0 ]; then
    if [ -n "${ROCR_VISIBLE_DEVICES:-}" ]; then
        gpus=$(printf '%s\n' "$ROCR_VISIBLE_DEVICES" | tr ',' '\n' | grep -c . || true)
    else
        gpus=$( (rocm-smi --showid 2>/dev/null || true) | { grep -o '^GPU\[[0-9]*\]' || true; } | sort -u | wc -l)
    fi
fi
detect_mpi
if [ "${gpus:-0}" -ge 2 ] && [ "$HAVE_MPI" = 1 ]; then
    "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --grad_accum 1 --out_dir "$tmp/np2" >"$tmp/np2.log" 2>&1
    "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --grad_accum 1 --out_dir "$tmp/np2b" >"$tmp/np2b.log" 2>&1
    check "np 2 (two GPUs, NCCL): within 2e-3 of np 1" close "$tmp/np2" "$tmp/plain" 2e-3
    check "  twice: the same bits" same_losses "$tmp/np2" "$tmp/np2b"
else
    say "  skip np 2: ${gpus:-0} GPU(s) here, MPI in the build: $HAVE_MPI (two ranks need two GPUs and MPI)"
fi
finish test_fsdp_gpu
