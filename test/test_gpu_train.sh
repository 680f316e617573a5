# GPU training checks against the CPU backend (make test-gpu; needs a GPU and train_gpt.cu's
# device = cuda wiring). On test/configs/gpu_tiny.conf with a synthetic learnable shard:
#   1. 50 steps on the CPU and on the GPU: every step's loss within 5 % of the CPU's and the
#      mean of each 10-step window within 2 %; mfu is a number on a GPU of the peak table
#      (null, with a warning, on another). Why these: both runs start from the same weights,
#      but each GPU update carries bf16 rounding (gradients ~1-2 % off in L2, see
#      test_gpu_step) and at lr 3e-3 the differences compound, so late single steps drift
#      further apart than one step's error (measured on an H100: 2.3 % at worst, windows
#      closer); a wrong gradient, learning rate or schedule moves the curve by tens of percent.
#   2. the same GPU run twice: bit-identical loss sequence
#   3. GPU stop_at_step 20 + resume: bit-identical losses and final checkpoint bytes
#   4. a GPU checkpoint resumed on the CPU (and on the GPU): the next step's loss agrees
#      within 1 % (bf16 against fp32), the GPU's own resume exactly
#   5. a CPU checkpoint resumed on the GPU: the next 10 steps within 2 % of the CPU's
#   6. device = auto picks the GPU and says so
#   7. (emulated only) head_dim 128 on a GPU whose blocks have 99 KiB of shared memory: one line
#   8. (emulated only) 2 sequences per micro-batch, grad_accum 2, 8 steps: every loss and
#      val_loss within 1e-3 of the CPU's; stop at 4 + resume: bit-identical
# With GPU_TRAIN_EMULATED=1 (test/test_gpu_train_emu.sh, in `make test`) TRAIN_GPT is the
# trainer built on the CPU emulator of the GPU (build/train_gpt_emu), where a step takes about
# a second: the same checks on a smaller model (2 layers of d_model 64, 2 heads of 32, one
# sequence of 64 per micro-batch, grad_accum 2) over 20 steps (stop and resume at 10, the CPU
# checkpoint of step 10 on the GPU for the next 10), then check 8 at batch_size 2 (about 20 s
# more on 2 cores).
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$TOOL" shard "$tmp/train.bin" 512 0 400000 21
"$TOOL" shard "$tmp/val.bin" 512 0 20000 22
common=(test/configs/gpu_tiny.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 10
    --val_tokens 4096 --log_every 1 --ckpt_keep 0)
steps=50 half=20  # the run's steps; where it stops, and which checkpoint the resumes take
if [ "${GPU_TRAIN_EMULATED:-0}" = 1 ]; then
    common+=(--n_layer 2 --d_model 64 --n_head 2 --n_kv_head 1 --d_ff 128 --seq_len 64 --batch_size 1
        --max_steps 20 --val_tokens 512 --threads 1)
    steps=20 half=10
fi
ck() { printf 'step_%08d' "$1"; }
run() {  # run OUT_DIR DEVICE [--key value]...
    local out=$1 dev=$2; shift 2
    "$TRAIN_GPT" "${common[@]}" --device "$dev" --out_dir "$out" "$@" >"$out.log" 2>&1
}

if ! run "$tmp/probe" cuda --max_steps 1 --warmup_steps 0 --ckpt_every 0; then
    say "  FAIL train_gpt --device cuda did not run:"
    tail -n 3 "$tmp/probe.log"
    die "test_gpu_train: needs a GPU and train_gpt.cu's CUDA wiring"
fi

# Loss curves of two metrics files compared over the steps both have (FROM..TO): every step
# within STEP_TOL relative to B's and, when WINDOW > 0, the mean of each WINDOW consecutive
# steps within WINDOW_TOL. KEY: the field compared (default loss; val_loss for validation).
compare_curves() {  # compare_curves A B STEP_TOL FROM TO WINDOW WINDOW_TOL [KEY]
    "$PYTHON" - "$@" <<'PY'
import json, sys
key = sys.argv[8] if len(sys.argv) > 8 else "loss"
def table(path):
    t = {}
    for line in open(path):
        d = json.loads(line)
        if key in d and "step" in d: t[d["step"]] = d[key]
    return t
a, b = table(sys.argv[1]), table(sys.argv[2])
step_tol, lo, hi = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
window, window_tol = int(sys.argv[6]), float(sys.argv[7])
steps = [s for s in sorted(set(a) & set(b)) if lo <= s <= hi]
if not steps:
    print("    no common steps")
    sys.exit(1)
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
print(f"    {key}: {len(steps)} steps, worst single-step relative difference {worst:.3e} (tolerance {step_tol:g})")
worst_w = 0.0
for i in range(0, len(steps) - window + 1, window) if window > 0 else []:
    w = steps[i:i + window]
    ma, mb = sum(a[s] for s in w) / window, sum(b[s] for s in w) / window
    d = abs(ma - mb) / abs(mb)
    worst_w = max(worst_w, d)
    print(f"    steps {w[0]:3d}-{w[-1]:3d}: mean {key} gpu {ma:.4f} cpu {mb:.4f}, relative difference {d:.3e}")
if window > 0:
    print(f"    worst {window}-step window {worst_w:.3e} (tolerance {window_tol:g})")
sys.exit(0 if worst <= step_tol and len(steps) >= window and worst_w <= window_tol else 1)
PY
}
close_losses() { compare_curves "$1" "$2" "$3" "${4:-1}" "${5:-1000000000}" 0 0; }  # A B TOL [FROM TO]
close_curve() { compare_curves "$1" "$2" "$3" 1 1000000000 "$4" "$5"; }             # A B STEP_TOL WINDOW WINDOW_TOL
close_all() { compare_curves "$1" "$2" "$3" 1 1000000000 "$4" "$3" "${5:-loss}"; }  # A B TOL COUNT [KEY]

# 1. the loss curve
run "$tmp/cpu" cpu --ckpt_every 10
run "$tmp/gpu" cuda --ckpt_every 10
check "$steps steps: GPU losses within 5 % of the CPU's, 10-step means within 2 %" \
    close_curve "$tmp/gpu/metrics.jsonl" "$tmp/cpu/metrics.jsonl" 0.05 10 0.02
check "GPU run learned (final loss below the first)" "$PYTHON" -c "
import json, sys
l = [json.loads(x)['loss'] for x in open('$tmp/gpu/metrics.jsonl') if '\"loss\"' in x]
sys.exit(0 if l[-1] < 0.8 * l[0] else 1)"
check "mfu: a number for a known GPU, null with a warning otherwise" "$PYTHON" -c "
import json, sys
m = [json.loads(x)['mfu'] for x in open('$tmp/gpu/metrics.jsonl') if '\"mfu\"' in x]
warned = 'mfu' in open('$tmp/gpu.log').read()
sys.exit(0 if m and (all(isinstance(v, float) and 0 < v < 1 for v in m) or (all(v is None for v in m) and warned)) else 1)"

# 2. determinism
run "$tmp/gpu2" cuda --ckpt_every 10
check "the same GPU run twice: identical losses" \
    test "$(loss_table "$tmp/gpu/metrics.jsonl")" = "$(loss_table "$tmp/gpu2/metrics.jsonl")"

# 3. resume on the GPU
run "$tmp/stopped" cuda --ckpt_every 10 --stop_at_step $half
run "$tmp/stopped" cuda --ckpt_every 10
check "GPU stop at $half + resume: identical losses" \
    test "$(loss_table "$tmp/gpu/metrics.jsonl")" = "$(loss_table "$tmp/stopped/metrics.jsonl")"
check "GPU stop at $half + resume: identical final checkpoint" sh -c \
    "cmp -s '$tmp/gpu/$(ck $steps)/model.safetensors' '$tmp/stopped/$(ck $steps)/model.safetensors' &&
     cmp -s '$tmp/gpu/$(ck $steps)/optimizer.safetensors' '$tmp/stopped/$(ck $steps)/optimizer.safetensors'"

# 4. a GPU checkpoint on the CPU
next=$((half + 1))
run "$tmp/g2c" cpu --resume "$tmp/gpu/$(ck $half)" --max_steps $next --ckpt_every 0
run "$tmp/g2g" cuda --resume "$tmp/gpu/$(ck $half)" --max_steps $next --ckpt_every 0
check "GPU checkpoint resumed on the GPU: step $next as in the straight run" \
    test "$(loss_table "$tmp/g2g/metrics.jsonl" | grep "^$next ")" = "$(loss_table "$tmp/gpu/metrics.jsonl" | grep "^$next ")"
check "GPU checkpoint resumed on the CPU: step $next within 1 % of the GPU's" \
    close_losses "$tmp/g2c/metrics.jsonl" "$tmp/g2g/metrics.jsonl" 0.01 $next $next

# 5. a CPU checkpoint on the GPU
run "$tmp/c2g" cuda --resume "$tmp/cpu/$(ck $half)" --max_steps $((half + 10)) --ckpt_every 0
check "CPU checkpoint resumed on the GPU: steps $next-$((half + 10)) within 2 % of the CPU's" \
    close_losses "$tmp/c2g/metrics.jsonl" "$tmp/cpu/metrics.jsonl" 0.02 $next $((half + 10))

# 6. device = auto
run "$tmp/auto" auto --max_steps 2 --warmup_steps 0 --ckpt_every 0
check "device = auto picks the GPU and says so" grep -q "GPU 0 is" "$tmp/auto.log"

# 7. Emulated only: a GPU that offers a block less shared memory than head_dim 128's kernels ask
# for (an A40's or L40S's 99 KiB, TRAIN_GPT_EMU_SMEM_OPTIN): one line saying so and what to do,
# not CUDA's "invalid argument". fa2 is the kernel set the emulator runs on 32-wide warps.
if [ "${GPU_TRAIN_EMULATED:-0}" = 1 ]; then
    rc=0
    TRAIN_GPT_ATTENTION=fa2 TRAIN_GPT_EMU_SMEM_OPTIN=101376 run "$tmp/smem" cuda --max_steps 1 --warmup_steps 0 \
        --ckpt_every 0 --d_model 128 --n_head 1 --n_kv_head 1 --head_dim 128 || rc=$?
    check "head_dim 128 on a GPU with 99 KiB per block: one error line naming it, a hint (rc $rc)" \
        sh -c "[ $rc -eq 1 ] && grep -q 'error: attention kernel: this head_dim needs [0-9]* bytes of shared memory per block, .* offers 101376' '$tmp/smem.log' &&
               grep -q 'HINT: head_dim 64, or TRAIN_GPT_ATTENTION=simple' '$tmp/smem.log'"
fi

# 8. Emulated only: several sequences per micro-batch. The runs above have one (batch_size 1), so
# every row offset is 0: a kernel that gives every row row 0's document starts, or a classifier
# over T rows instead of B·T, passes them. Here batch_size 2 and grad_accum 2 for 8 steps,
# validated at 4 and 8 on 7 rows (micro-batches of 2, 2, 2 and 1), a checkpoint at 4. The
# shard's documents are 51-151 tokens long and a row is one of its windows of 64 tokens (in a
# shuffled order): 99 % of rows begin inside a document and 62 % hold a document start, each at
# its own position, so a row masked with another row's starts attends across a boundary.
#  a. GPU against CPU: each of the 8 losses and both val_losses within 1e-3. Both start from
#     the same weights; the GPU's bf16 matmul inputs move the loss by ~1e-4 (measured 1.4e-4
#     for the losses, 2.8e-4 for val_loss) and 8 steps do not compound it much: 1e-3, as
#     test_fsdp_gpu_emu's GPU-against-CPU check. Planted in the emulated build: the attention
#     reading row 0's document starts for every row → 7e-2 (val_loss 2e-2); the loss and the
#     head's gradient over the first T rows of each micro-batch → 0.5; the gradients zeroed
#     before every micro-batch (only the last counts) → 6e-3 (val_loss 2e-2), which check 1
#     at batch_size 1 only just sees (5.2e-2 against its 5 %).
#  b. stop at 4 + resume at batch_size 2: identical losses and final checkpoint (the data
#     position, 8 micro-batches of 2 rows, read back as such). Planted: the checkpoint's
#     batch_size read as 1 (the position converted to 4 micro-batches of 2) → both fail.
# On a GPU, gpu_tiny.conf's batch_size 8 runs through checks 1-6 instead.
if [ "${GPU_TRAIN_EMULATED:-0}" = 1 ]; then
    b2=(--batch_size 2 --grad_accum 2 --max_steps 8 --warmup_steps 2 --val_every 4 --val_tokens 448 --ckpt_every 4)
    run "$tmp/cpu_b2" cpu "${b2[@]}"
    run "$tmp/gpu_b2" cuda "${b2[@]}"
    check "batch_size 2, grad_accum 2: all 8 GPU losses within 1e-3 of the CPU's" \
        close_all "$tmp/gpu_b2/metrics.jsonl" "$tmp/cpu_b2/metrics.jsonl" 1e-3 8
    check "batch_size 2, grad_accum 2: both GPU val_losses within 1e-3 of the CPU's" \
        close_all "$tmp/gpu_b2/metrics.jsonl" "$tmp/cpu_b2/metrics.jsonl" 1e-3 2 val_loss
    run "$tmp/stopped_b2" cuda "${b2[@]}" --stop_at_step 4
    run "$tmp/stopped_b2" cuda "${b2[@]}"
    check "batch_size 2: GPU stop at 4 + resume: identical losses" \
        test "$(loss_table "$tmp/gpu_b2/metrics.jsonl")" = "$(loss_table "$tmp/stopped_b2/metrics.jsonl")"
    check "batch_size 2: GPU stop at 4 + resume: identical final checkpoint" sh -c \
        "cmp -s '$tmp/gpu_b2/$(ck 8)/model.safetensors' '$tmp/stopped_b2/$(ck 8)/model.safetensors' &&
         cmp -s '$tmp/gpu_b2/$(ck 8)/optimizer.safetensors' '$tmp/stopped_b2/$(ck 8)/optimizer.safetensors'"
fi
# cuBLASLt with no algorithm for a product says so with CUBLAS_STATUS_NOT_SUPPORTED (seldom with
# found = 0): the trainer names the product's shape and the multiple-of-8 hint, in one error line
# (it said the GPU lacked bf16 tensor cores). The emulator's cuBLASLt answers so on request.
if [ "${GPU_TRAIN_EMULATED:-0}" = 1 ]; then
    rc=0
    CUBLASLT_EMU_NO_ALGORITHM=1 run "$tmp/noalgo" cuda --max_steps 1 --warmup_steps 0 --ckpt_every 0 || rc=$?
    check "cuBLASLt without an algorithm: status 1 ($rc), the product's shape named" \
        sh -c "[ $rc -eq 1 ] && grep -q '^train_gpt: error: .* has no algorithm for a [NT][NT] matmul m=[0-9]* n=[0-9]* k=' '$tmp/noalgo.log' &&
               ! grep -q 'tensor cores (compute capability' '$tmp/noalgo.log'"
fi
# Out of GPU memory: one error line naming the bytes asked for and for what, the GPU's free
# memory, and what to change (the generic CUDA error named none). The emulator fails every
# allocation over 64 KiB on request (the matmuls' 32 MiB workspace is the first).
if [ "${GPU_TRAIN_EMULATED:-0}" = 1 ]; then
    rc=0
    TRAIN_GPT_EMU_MALLOC_MAX=65536 run "$tmp/oom" cuda --max_steps 1 --warmup_steps 0 --ckpt_every 0 || rc=$?
    check "out of GPU memory: status 1 ($rc), one line with the bytes asked, held and free, and what to change" \
        sh -c "[ $rc -eq 1 ] && [ \$(grep -c '^train_gpt: error:' '$tmp/oom.log') -eq 1 ] &&
               grep -q '^train_gpt: error: out of GPU memory: .* more asked for (.*); the GPU has .* free of .*recompute = selective or full' '$tmp/oom.log'"
fi
finish test_gpu_train
