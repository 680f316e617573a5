# The per-rank memory plan (issue #14 part 6; llmc/plan.h, docs/fsdp.md "Memory per rank"):
#  1. `train_gpt plan configs/boom-14b.conf --world 40 --gpu h100-64gb`: this rank's pieces and
#     the gathered weights checked against hand arithmetic from the config (16 bytes per value
#     of ⌈unit/40⌉ pieces; on the CPU the two largest whole units in fp32, on a GPU what the CUDA
#     backend allocates: docs/fsdp.md), to the 0.01 GiB the line prints;
#     the GPU line is asked for only when the build has the CUDA model (it sizes the activations).
#  2. --gpu names a row of the table or fails with one line; --world must be a number. HSDP:
#     --world is the FSDP group (fsdp_size; a different --world is refused in one line), the
#     batch line and the time at 40 % MFU count fsdp_size x dp_replicate processes.
#  3. A job's planned pieces, gathered weights, unit gradients and activations against the
#     backend's own counters after the first step: np 2 and 4, tied and untied embeddings,
#     fsdp_reshard_after_forward 0 and recompute full (the activations: cpu_model_plan_bytes
#     against the model's allocator count) — equal within 10 % (the plan is a bound made of the largest
#     units: the tiny model's layers are all the same size, so it is met exactly; measured:
#     equal to the printed digits).
. "$(dirname "$0")/lib.sh"
tmp_with_processes

# 1. Hand arithmetic for BOOM's 14B at 40 ranks.
"$TRAIN_GPT" plan configs/boom-14b.conf --world 40 --gpu h100-64gb >"$tmp/plan.txt" 2>&1 || { cat "$tmp/plan.txt"; die "plan failed"; }
expect=$("$PYTHON" - <<'PY'
import math
V, L, C, Hq, Hkv, D, F, N = 128256, 40, 5120, 40, 8, 128, 17408, 40
layer = C + Hq*D*C + 2*Hkv*D*C + 2*D + C*Hq*D + C + 3*F*C   # norms, q k v, qk gains, o, mlp norm, gate up down
units = [V*C] + [layer]*L + [C + V*C]                     # embedding; layers; final norm + untied head
pieces = [math.ceil(u / N) for u in units]
whole = sorted((p * N for p in pieces), reverse=True)
g = 2**30
print("%.2f weights + %.2f grads + %.2f AdamW" % (4*sum(pieces)/g, 4*sum(pieces)/g, 8*sum(pieces)/g))
gains = L*(2*C + 2*D) + C
# the GPU (train_gpt.cu's FSDP buffers): the bf16 pieces, bf16 slots of the largest unit and of two
# layers, the norm gains in fp32 (all, this rank's, the all-gather's N copies)
print("%.2f gathered weights" % ((2*sum(pieces) + 2*(whole[0] + 2*pieces[1]*N) + 4*gains*(N + 2))/g))
print("%.2f gathered weights" % (4*(whole[0] + whole[1])/g))   # fp32 on the CPU backend
PY
)
pieces_line=$(sed -n 1p <<<"$expect")
check "plan --world 40: the CPU line's pieces are the hand arithmetic ($pieces_line)" \
    grep -q "cpu backend (fp32), recompute [a-z0-9 ]*: .*= $pieces_line (this rank's pieces) + $(sed -n 3p <<<"$expect")" "$tmp/plan.txt"
if grep -q "gpu memory:" "$tmp/plan.txt"; then
    check "plan --world 40: the GPU line's pieces and bf16 gathered weights are the hand arithmetic" \
        grep -q "gpu (bf16 .*= $pieces_line (this rank's pieces) + $(sed -n 2p <<<"$expect")" "$tmp/plan.txt"
    check "plan --gpu h100-64gb: says whether 40 ranks fit, and the smallest group" \
        sh -c "grep -q 'H100 64GB at 40 rank(s), recompute none: fits' '$tmp/plan.txt' && grep -q 'smallest FSDP group that fits (same micro-batch, recompute none): H100 64GB [0-9]' '$tmp/plan.txt'"
else
    say "  skip the GPU lines (this build has no CUDA model)"
fi
grep 'per rank\|cpu backend\|gpu (bf16\|smallest\|at 40' "$tmp/plan.txt"

# 2. Bad options.
fails_with() {  # fails_with PATTERN ARGS...: exits non-zero with PATTERN on one line of stderr
    local pattern=$1; shift
    ! "$TRAIN_GPT" plan configs/boom-14b.conf "$@" >"$tmp/bad.out" 2>"$tmp/bad.err" &&
        [ "$(wc -l <"$tmp/bad.err")" -eq 1 ] && grep -q "$pattern" "$tmp/bad.err"
}
check "--gpu h100: names two rows, refused in one line" fails_with "plan: --gpu: 'h100' names more than one of:" --gpu h100
check "--gpu tpu: refused in one line" fails_with "plan: --gpu: 'tpu' is not one of:" --gpu tpu
check "--world two: refused in one line" fails_with "plan: --world: expected a number of ranks, got 'two'" --world two
# HSDP: --world is the FSDP group (fsdp_size); the job's processes are fsdp_size x dp_replicate.
# The batch line and the run's time counted --world (8 for a 64-rank job), and --world 64 beside
# fsdp_size 8 planned an FSDP group of 64 (8x too little of the weights per rank).
"$TRAIN_GPT" plan configs/boom-14b.conf --fsdp_size 8 --dp_replicate 8 --peak_tflops 989 >"$tmp/hsdp.txt" 2>&1 ||
    { cat "$tmp/hsdp.txt"; die "plan failed"; }
check "HSDP, fsdp_size 8 x dp_replicate 8: the batch line and the time at 40 % MFU count 64 processes" \
    sh -c "grep -q 'x 64 process(es) = 134217728 tokens/step' '$tmp/hsdp.txt' && grep -q 'at 40% MFU .*, [0-9a-z]* on 64\$' '$tmp/hsdp.txt'"
check "HSDP, fsdp_size 8 x dp_replicate 8: a rank's memory is an FSDP group of 8's" \
    grep -q "per rank, FSDP over 8 (" "$tmp/hsdp.txt"
# On the CPU, HSDP's all-reduce of the copies' gradient pieces holds a chunk of 2^22 values padded
# to the copies and its 1/copies share: 4 x (2^22 + 2^19) bytes = 0.02 GiB more unit gradients
# than one copy's plan (the CPU row left it out).
"$TRAIN_GPT" plan configs/boom-14b.conf --fsdp_size 8 --dp_replicate 1 >"$tmp/hsdp1.txt" 2>&1 || true
unit_grads() { sed -n 's/.*cpu backend (fp32).* + \([0-9.]*\) unit gradients.*/\1/p' "$1"; }
check "HSDP on the CPU: the copies' all-reduce buffers, $(unit_grads "$tmp/hsdp.txt") against $(unit_grads "$tmp/hsdp1.txt") GiB of unit gradients" \
    "$PYTHON" -c "import sys; sys.exit(0 if abs($(unit_grads "$tmp/hsdp.txt") - $(unit_grads "$tmp/hsdp1.txt") - 0.02) < 0.006 else 1)"
# The smallest group that fits a GPU, for a model whose rank total is not monotone in the group's
# size (1024 layers of 12288-wide norms: a GPU rank holds every gain, and collective buffers per
# rank): 2 ranks (a binary search from the largest group, where it does not fit, said "none").
printf 'vocab_size = 256\nn_layer = 1024\nd_model = 12288\nn_head = 1\nn_kv_head = 1\nhead_dim = 64\nd_ff = 64\nseq_len = 64\nbatch_size = 1\nlr = 1e-3\nmax_steps = 10\nwarmup_steps = 0\n' \
    >"$tmp/gains.conf"
"$TRAIN_GPT" plan "$tmp/gains.conf" --train_data "$tmp/train.bin" --gpu h100-80 --world 8 >"$tmp/gains.txt" 2>&1 || true
if grep -q "gpu: this build has no CUDA model" "$tmp/gains.txt"; then
    say "  skip the smallest fitting group (no CUDA model in this build)"
else
    check "the smallest group that fits an H100 80GB when the rank total is not monotone: 2 ranks, recompute none" \
        grep -q '^train_gpt |   none .* fits; 2$' "$tmp/gains.txt"
fi
check "--world 64 beside fsdp_size 8: refused in one line" \
    fails_with "plan: --world 64 contradicts fsdp_size 8" --world 64 --fsdp_size 8 --dp_replicate 8
"$TRAIN_GPT" plan configs/boom-14b.conf --batch_size 1 --world=40 --gpu h100-64gb >"$tmp/plan_after.txt" 2>&1 || true
check "plan's options also after a config key, as --opt=V: the same per-rank lines" \
    test "$(grep 'cpu backend\|at 40' "$tmp/plan_after.txt")" = "$(grep 'cpu backend\|at 40' "$tmp/plan.txt")"

# 3. Planned against measured in a job.
detect_mpi
if [ "$HAVE_MPI" = 0 ]; then
    say "  skip the job checks (no MPI in this build)"
    finish test_fsdp_plan
    exit 0
fi
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
within() {  # within NP [--key value]...: the job's measured figures are within 10 % of its plan
    local np=$1; shift
    "${MPIRUN[@]}" "$np" "$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --out_dir "$tmp/run$np" \
        --max_steps 4 --ckpt_every 0 --threads 1 "$@" >"$tmp/job.log" 2>&1 || { cat "$tmp/job.log"; return 1; }
    rm -rf "$tmp/run$np"
    local line
    line=$(grep 'memory per rank after the first step' "$tmp/job.log") || { cat "$tmp/job.log"; return 1; }
    say "    $line"
    "$PYTHON" - "$line" <<'PY'
import re, sys
line = sys.argv[1]
ok = True
for what in ("pieces", "gathered weights", "unit gradients", "activations"):
    m = re.search(what + r" ([0-9.]+)(?: at most)? \(planned ([0-9.]+)[,)]", line)
    measured, planned = float(m.group(1)), float(m.group(2))
    ok = ok and planned > 0 and abs(measured - planned) <= 0.1 * planned
sys.exit(0 if ok else 1)
PY
}
check "np 2, tied embeddings: measured within 10 % of the plan" within 2
check "np 2, tied embeddings as the largest unit (vocab 8192): measured within 10 % of the plan" within 2 --vocab_size 8192
check "np 4, untied embeddings: measured within 10 % of the plan" within 4 --tie_embeddings 0
check "np 2, fsdp_reshard_after_forward 0: measured within 10 % of the plan" within 2 --fsdp_reshard_after_forward 0
check "np 2, recompute full: measured within 10 % of the plan" within 2 --recompute full
finish test_fsdp_plan
