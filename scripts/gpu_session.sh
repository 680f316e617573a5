#!/usr/bin/env bash
# scripts/gpu_session.sh — everything a session with a lent GPU runs, in three stages that
# each fit one 10-minute device command, raw output kept as evidence to commit:
#
#   bash scripts/gpu_session.sh check       # the machine and toolchain, `make`, every GPU test
#                                           # (make test-gpu's programs, each on its own, FSDP's
#                                           # test_fsdp_gpu.sh among them), the FSDP bench at
#                                           # gpt-124m, the kernel tests under memcheck,
#                                           # racecheck, initcheck
#   bash scripts/gpu_session.sh bench-1b    # gpt-1b, seq 4096: train_gpt vs PyTorch 2 (causal,
#                                           # documents) and the per-kernel table of each
#   bash scripts/gpu_session.sh bench-rest  # the same for gpt-124m and gpt-350m
#   bash scripts/gpu_session.sh fa2         # the register-resident attention (TRAIN_GPT_ATTENTION=fa2):
#                                           # its kernel tests, the GPU step with it, attention alone
#                                           # against the WMMA kernels and PyTorch's SDPA/Flex, the
#                                           # per-kernel table of gpt-1b with it, then the sanitizers
#
# On an H100 (2026-11-24) the stages took about 4, 5 and 7 minutes. Output goes to $OUT (the
# device tool's folder that comes back) when set, else to bench/results/, as
# DATE-STAGE-GPUNAME.txt; the benchmark scripts write their own files beside it. COMMIT=...
# names the code when the checkout travels without its git history.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
stage=${1:?usage: gpu_session.sh check|bench-1b|bench-rest|fa2}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' /' '--' | tr -cd 'A-Za-z0-9._-')
dest=${OUT:-bench/results}
mkdir -p "$dest"
log="$dest/$(date -u +%F)-$stage-${gpu:-nogpu}.txt"
jobs=$(nproc)
export PATH=$PATH:/usr/local/cuda/bin

run() {  # run TITLE COMMAND...: prints the title, the command's output and its exit status
    echo "==== $1"
    shift
    local t0=$SECONDS rc=0
    "$@" 2>&1 || rc=$?
    echo "==== exit $rc after $((SECONDS - t0)) s"
    return 0
}

build() {
    # The GPU's own architecture too, so that nothing is JIT-compiled from PTX at start-up.
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.')
    case "$cc" in
    80 | 90) make -j"$jobs" all build/test_tool build/reference_dump build/bench_attention ;;
    *) make -j"$jobs" all build/test_tool build/reference_dump build/bench_attention \
        CUDA_ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_${cc},code=sm_${cc}" ;;
    esac
}

bench_rows() {  # bench_rows CONFIG...: both data kinds at seq 4096, the table, the kernels
    for name in "$@"; do
        for data in causal docs; do
            run "bench/gpu/run.sh $name 4096 $data" bash bench/gpu/run.sh "$name" 4096 "$data"
            run "bench/gpu/kernels.sh $name 4096 $data" bash bench/gpu/kernels.sh "$name" 4096 "$data"
        done
    done
}

{
    echo "# scripts/gpu_session.sh $stage, $(date -u '+%F %T') UTC, commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
    case "$stage" in
    check)
        run "nvidia-smi" nvidia-smi
        run "nvcc" nvcc --version
        run "torch" python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
        run "make" build
        run "memory plan" ./train_gpt plan configs/gpt-1b.conf
        for t in $(make -s -f Makefile -f - print-gpu-tests <<<'print-gpu-tests: ; @echo $(GPU_TESTS)'); do
            make -s "$t" >/dev/null 2>&1
            run "$t" "$t"
        done
        for t in $(make -s -f Makefile -f - print-gpu-sh <<<'print-gpu-sh: ; @echo $(GPU_TESTS_SH)'); do
            run "$t" env TRAIN_GPT="$PWD/train_gpt" BUILD="$PWD/build" PYTHON=python3 bash "$t"
        done
        run "build/test_gpu_step with TRAIN_GPT_ATTENTION=fa2" env TRAIN_GPT_ATTENTION=fa2 build/test_gpu_step
        run "bench/fsdp/gpu.sh gpt-124m 1024 (FSDP through NCCL: world 1, or the GPUs here)" \
            bash bench/fsdp/gpu.sh gpt-124m 1024
        # The kernel tests under the sanitizers: out-of-bounds and misaligned accesses
        # (memcheck), shared-memory races (racecheck), uninitialized reads (initcheck).
        # --error-exitcode makes a finding fail the line, not only print.
        san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        for tool in memcheck racecheck initcheck; do
            run "compute-sanitizer --tool $tool build/test_gpu_kernels" env TRAIN_GPT_TEST_QUICK=1 \
                timeout "${SANITIZER_TIMEOUT:-200}" "$san" --tool "$tool" --error-exitcode 3 build/test_gpu_kernels
        done
        ;;
    fa2)
        run "nvidia-smi" nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
        run "make" build
        run "make the GPU tests" make -j"$jobs" build/test_gpu_kernels build/test_gpu_step
        run "build/test_gpu_kernels" build/test_gpu_kernels
        run "build/test_gpu_step with TRAIN_GPT_ATTENTION=fa2" env TRAIN_GPT_ATTENTION=fa2 build/test_gpu_step
        run "bench/gpu/attention.sh" bash bench/gpu/attention.sh
        for data in causal docs; do
            run "TRAIN_GPT_ATTENTION=fa2 bench/gpu/kernels.sh gpt-1b 4096 $data" \
                env TRAIN_GPT_ATTENTION=fa2 bash bench/gpu/kernels.sh gpt-1b 4096 "$data"
        done
        san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        for tool in racecheck memcheck; do
            run "compute-sanitizer --tool $tool build/test_gpu_kernels" env TRAIN_GPT_TEST_QUICK=1 \
                timeout "${SANITIZER_TIMEOUT:-90}" "$san" --tool "$tool" --error-exitcode 3 build/test_gpu_kernels
        done
        ;;
    bench-1b)
        build >/dev/null 2>&1
        bench_rows gpt-1b
        ;;
    bench-rest)
        build >/dev/null 2>&1
        bench_rows gpt-124m gpt-350m
        ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
    esac
} | tee "$log"
echo "gpu_session: wrote $log"
