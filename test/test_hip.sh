# The GPU backend for AMD GPUs (HIP), checked here without one (docs/build.md, LUMI): hipcc
# compiles every kernel file, train_gpt.cu's GPU section and the GPU tests' sources for
# gfx90a (MI250X), through the Makefile's own rule and flags (HIP=1 HIP_CHECK=1, into
# $BUILD/hip), warnings as errors (HIP_WERROR=1), and train_gpt links. Then:
#   1. each file with kernels gave device code for gfx90a (the offload bundle names it);
#   2. the NVIDIA-only tensor-core kernels stayed out (cuda/attention.o has no WMMA
#      kernel); its launchers are the MFMA kernels, whose gfx90a code holds the matrix
#      instruction and spills no register, and the portable ones for other head_dims;
#   3. `make HIP=1` says what it found (hipBLASLt present or missing) in one ✓ / ✗ line;
#   4. the HIP train_gpt starts: `plan` gives the same GPU memory plan as the CUDA build
#      and the line of GPUs it fits, MI250X and MI300X among them;
#   5. with no AMD GPU, device = auto says why and trains on the CPU, step for step as
#      $TRAIN_GPT does (the same C code); device = cuda is an error naming the reason.
# cuda/matmul.cu calls hipBLASLt, which Debian's ROCm 5 does not have: there it is left out
# and HIP_CHECK=1 links test/hip_matmul_stub.cu in its place (any matmul stops the run), so
# nothing here multiplies a matrix on an AMD GPU; where hipblaslt/hipblaslt.h is installed
# (ROCm 6.2 or newer) it is compiled too. What this cannot show is listed in docs/build.md.
# Without hipcc: one "skipped: ..." line, exit 0.
. "$(dirname "$0")/lib.sh"
ROCM_PATH=${ROCM_PATH:-/opt/rocm}
HIPCC=$(command -v hipcc || { [ -x "$ROCM_PATH/bin/hipcc" ] && echo "$ROCM_PATH/bin/hipcc"; } || true)
if [ -z "$HIPCC" ]; then
    say "test_hip: skipped: no hipcc (Debian: apt-get install hipcc libamdhip64-dev; a cluster: module load rocm)"
    exit 0
fi
started=$(date +%s)
dir="$BUILD/hip"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ARCH=gfx90a
HIP_BIN="$dir/train_gpt"

sources="cuda/embedding.cu cuda/rmsnorm.cu cuda/qknorm_rope.cu cuda/swiglu.cu cuda/attention.cu
         cuda/attention_simple.cu cuda/classifier.cu cuda/adamw.cu cuda/collective.cu quant.cu train_gpt.cu
         test/test_gpu_kernels.cu test/test_gpu_step.cu test/test_quant_gpu.cu"
blaslt=""
for d in "$ROCM_PATH" "$(dirname "$(dirname "$(readlink -f "$HIPCC")")")"; do
    [ -f "$d/include/hipblaslt/hipblaslt.h" ] && blaslt="$d/include/hipblaslt/hipblaslt.h" && break
done
if [ -n "$blaslt" ]; then
    sources="$sources cuda/matmul.cu"
else
    say "  -- cuda/matmul.cu left out: no hipblaslt/hipblaslt.h (hipBLASLt comes with ROCm 6.2 or newer, not Debian's)"
fi
objects=""
for s in $sources; do objects="$objects $dir/${s%.cu}.o"; done

# 0. The build. MAKEFLAGS cleared: the caller's jobserver is not this build's; and NO_CUDA= on
# the command line, since `make test NO_CUDA=1` leaves NO_CUDA=1 in the environment (g++ then
# compiled cuda/*.cu: "cuda_bf16.h: no such file").
t0=$(date +%s)
mkdir "$tmp/tmpdir"
if TMPDIR="$tmp/tmpdir" MAKEFLAGS= MFLAGS= make --no-print-directory -j"$(nproc)" BUILD="$dir" NO_CUDA= HIP=1 HIP_CHECK=1 \
    HIP_WERROR=1 HIP_ARCH="--offload-arch=$ARCH" $objects "$HIP_BIN" >"$tmp/build" 2>&1; then ok=0; else ok=1; fi
[ "$ok" -eq 0 ] || tail -n 40 "$tmp/build"
runs=$(grep -c -- "--offload-arch=$ARCH" "$tmp/build" || true)
check "hipcc compiles $(echo $sources | wc -w) files for $ARCH, warnings as errors, and train_gpt links" \
    test "$ok" -eq 0
say "       ($runs hipcc runs, $(($(date +%s) - t0)) s)"
# ROCm's clang leaves a directory in TMPDIR per device compile; the build points it at $dir/hip-tmp.
check "the build left nothing in TMPDIR (hipcc's temporary directories stay in the build directory)" \
    sh -c '[ -z "$(ls -A "$1")" ] || { ls -A "$1" | head -3 >&2; exit 1; }' _ "$tmp/tmpdir"
# On failure the next run must recompile (and show the errors again): every object depends on config.txt.
[ "$ok" -eq 0 ] || { rm -f "$dir/config.txt"; finish test_hip; }

# 1. Device code for the target in every object of a file that defines kernels (hipcc's
# offload bundle names the target); cuda/attention.cu's are in the headers it includes.
missing="" with_kernels=0
for s in $sources; do
    [ "$s" = cuda/attention.cu ] || grep -q '__global__' "$s" || continue
    with_kernels=$((with_kernels + 1))
    grep -q "amdgcn-amd-amdhsa--$ARCH" "$dir/${s%.cu}.o" || missing="$missing ${s%.cu}.o"
done
check "the $with_kernels objects of files with kernels hold $ARCH device code (missing:${missing:- none})" \
    test -z "$missing"

# 2. NVIDIA's tensor-core attention stays out; the HIP launchers are the MFMA kernels
# (cuda/attention_mfma.cuh) and, for other head_dims, the portable ones. The MFMA kernels'
# gfx90a code (unbundled from the object) holds the matrix instruction, and no kernel spills
# registers to scratch (the AMDGPU metadata's spill counts and private segment).
nm -C "$dir/cuda/attention.o" >"$tmp/attention.nm"
check "cuda/attention.o: no WMMA kernel under HIP; attention_forward has the MFMA kernels and the portable one" \
    sh -c "! grep -q attention_forward_kernel '$tmp/attention.nm' && grep -q ' T attention_forward(' '$tmp/attention.nm' &&
           grep -q 'mfa::forward_kernel<128>' '$tmp/attention.nm' && grep -q 'mfa::dkv_kernel<64>' '$tmp/attention.nm' &&
           grep -q ' U attention_simple_forward(' '$tmp/attention.nm'"
llvm_bin=$(dirname "$(readlink -f "$(command -v clang-offload-bundler 2>/dev/null || ls /usr/lib/llvm-*/bin/clang-offload-bundler 2>/dev/null | tail -n 1)" 2>/dev/null)" 2>/dev/null)
objdump=$(command -v llvm-objdump || ls "$llvm_bin/llvm-objdump" /usr/bin/llvm-objdump-* 2>/dev/null | head -n 1 || true)
readelf_=$(command -v llvm-readelf || ls "$llvm_bin/llvm-readelf" /usr/bin/llvm-readelf-* 2>/dev/null | head -n 1 || true)
if [ -x "$llvm_bin/clang-offload-bundler" ] && [ -n "$objdump" ] && [ -n "$readelf_" ] &&
    objcopy -O binary --only-section=.hip_fatbin "$dir/cuda/attention.o" "$tmp/attention.fatbin" &&
    "$llvm_bin/clang-offload-bundler" --type=o --targets="hipv4-amdgcn-amd-amdhsa--$ARCH" \
        --input="$tmp/attention.fatbin" --output="$tmp/attention.$ARCH.o" --unbundle 2>/dev/null; then
    mfma=$("$objdump" -d "$tmp/attention.$ARCH.o" | grep -c 'v_mfma_f32_16x16x16bf16_1k' || true)
    "$readelf_" --notes "$tmp/attention.$ARCH.o" | grep -E '\.name:|\.vgpr_count:|\.agpr_count:|spill_count:|private_segment_fixed_size:' |
        paste - - - - - - | { grep 'mfa' || true; } |
        sed -e 's/  */ /g' -e 's/_ZN3mfa[0-9]*\([a-z_]*\)ILi\([0-9]*\)E[^ ]*/\1<\2>/' >"$tmp/mfma.resources" || true
    sed 's/^/       /' "$tmp/mfma.resources"
    kernels=$(wc -l <"$tmp/mfma.resources")
    spilled=$(grep -c -E 'spill_count: [1-9]|private_segment_fixed_size: [1-9]' "$tmp/mfma.resources" || true)
    check "the MFMA kernels' $ARCH code: $mfma v_mfma_f32_16x16x16bf16_1k, $kernels kernels, $spilled spilling" \
        sh -c "[ '$mfma' -gt 0 ] && [ '$kernels' -eq 9 ] && [ '$spilled' -eq 0 ]"
else
    say "  -- the MFMA kernels' device code not inspected: no clang-offload-bundler / llvm-objdump / llvm-readelf"
fi

# 3. What `make HIP=1` says about this machine: the backend, or why not, in one line.
line=$(MAKEFLAGS= MFLAGS= make --no-print-directory BUILD="$tmp/info" NO_CUDA= HIP=1 info 2>/dev/null | grep 'hipcc' || true)
if [ -n "$blaslt" ]; then want='✓ hipcc'; else want='✗ hipcc .* no hipblaslt/hipblaslt.h'; fi
check "make HIP=1 reports it: $(echo $line)" sh -c "printf '%s\n' \"\$1\" | grep -q \"\$2\"" _ "$line" "$want"

# 4. plan: the GPU memory plan is the CUDA build's (one code path), and the fit line.
"$HIP_BIN" plan configs/gpt-1b.conf >"$tmp/plan.hip" 2>&1 || true
"$TRAIN_GPT" plan configs/gpt-1b.conf >"$tmp/plan.host" 2>&1 || true
gpu_line() { grep 'gpu memory' "$1" | cut -d'(' -f1; }
hip_gpu=$(gpu_line "$tmp/plan.hip") host_gpu=$(gpu_line "$tmp/plan.host")
same="the same as the CUDA build's"
[ -n "$host_gpu" ] || same="$(basename "$TRAIN_GPT") has no GPU backend to compare with"
check "HIP plan:${hip_gpu#*|}($same)" \
    sh -c '[ -n "$1" ] && { [ -z "$2" ] || [ "$1" = "$2" ]; }' _ "$hip_gpu" "$host_gpu"
check "HIP plan names the GPUs it fits: $(grep -o 'MI250X GCD 64GB .*' "$tmp/plan.hip")" \
    sh -c "grep -q 'fits one GPU .*MI250X GCD 64GB ✓, MI300X 192GB ✓' '$tmp/plan.hip'"

# 5. Without an AMD GPU: the CPU, as $TRAIN_GPT trains; device = cuda is an error.
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
run() {  # run NAME BINARY ARGS...
    local name=$1 bin=$2; shift 2
    "$bin" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --out_dir "$tmp/$name" --max_steps 5 --threads 1 \
        --ckpt_every 0 --log_every 100 "$@" >"$tmp/$name.log" 2>&1
}
if run hip_auto "$HIP_BIN"; then ok=0; else ok=1; fi
if grep -q 'device = auto: GPU 0 is' "$tmp/hip_auto.log"; then
    say "  -- an AMD GPU is here: make HIP=1 && make test-gpu checks it; the CPU comparison is left out"
else
    run host_cpu "$TRAIN_GPT" --device cpu || { cat "$tmp/host_cpu.log"; die "the host run failed"; }
    why=$(grep -o 'no usable GPU ([^)]*)' "$tmp/hip_auto.log" || tail -n 1 "$tmp/hip_auto.log")
    check "device = auto without an AMD GPU: $why" \
        sh -c "[ $ok -eq 0 ] && grep -q 'no usable GPU (.*); training on the CPU' '$tmp/hip_auto.log'"
    loss_table "$tmp/hip_auto/metrics.jsonl" >"$tmp/hip.loss" 2>/dev/null || true
    loss_table "$tmp/host_cpu/metrics.jsonl" >"$tmp/host.loss"
    check "... and trains on the CPU as $(basename "$TRAIN_GPT") does ($(wc -l <"$tmp/host.loss") steps, same losses)" \
        sh -c "[ -s '$tmp/hip.loss' ] && cmp -s '$tmp/hip.loss' '$tmp/host.loss'"
    if run hip_cuda "$HIP_BIN" --device cuda; then ok=0; else ok=1; fi
    check "device = cuda without an AMD GPU: an error ($(tail -n 1 "$tmp/hip_cuda.log" | sed 's/^train_gpt: error: //'))" \
        sh -c "[ $ok -ne 0 ] && grep -q 'cuda was asked for, but .*HIP' '$tmp/hip_cuda.log'"
fi
say "  the check took $(($(date +%s) - started)) s"
finish test_hip
