#!/usr/bin/env bash
# scripts/gpu_session.sh — everything a session with a lent GPU should run, in stages that
# each fit one device call (≤ 10 minutes), writing raw output to be committed as evidence:
#
#   bash scripts/gpu_session.sh build    # the machine, the toolchain, `make` (sm_80 + sm_90 + the GPU's own)
#   bash scripts/gpu_session.sh test     # every GPU test, each on its own (a failure does not hide the rest)
#   bash scripts/gpu_session.sh bench    # bench/gpu/run.sh: train_gpt against PyTorch 2
#
# Output goes to $OUT (the device tool's folder that comes back) when set, else to
# bench/results/, as DATE-STAGE-GPUNAME.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: gpu_session.sh build|test|bench}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' /' '--' | tr -cd 'A-Za-z0-9._-')
dest=${OUT:-bench/results}
mkdir -p "$dest"
log="$dest/$(date -u +%F)-$stage-${gpu:-nogpu}.txt"
jobs=$(nproc)

run() {  # run TITLE COMMAND...: prints the title, the command's output and its exit status
    echo "==== $1"
    shift
    local t0=$SECONDS rc=0
    "$@" 2>&1 || rc=$?
    echo "==== exit $rc after $((SECONDS - t0)) s"
    return 0
}

{
    echo "# scripts/gpu_session.sh $stage, $(date -u '+%F %T') UTC, commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
    case "$stage" in
    build)
        run "nvidia-smi" nvidia-smi
        run "nvcc" nvcc --version
        run "torch" python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
        # The GPU's own architecture too, so that nothing is JIT-compiled from PTX at start-up.
        cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.')
        case "$cc" in
        80 | 90) run "make" make -j"$jobs" ;;
        *) run "make" make -j"$jobs" CUDA_ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_${cc},code=sm_${cc}" ;;
        esac
        run "memory plan" ./train_gpt plan configs/gpt-1b.conf
        ;;
    test)
        make -j"$jobs" all build/test_tool build/reference_dump >/dev/null 2>&1
        for t in $(make -s -f Makefile -f - print-gpu-tests <<<'print-gpu-tests: ; @echo $(GPU_TESTS)'); do
            make -s "$t" >/dev/null 2>&1
            run "$t" "$t"
        done
        for t in $(make -s -f Makefile -f - print-gpu-sh <<<'print-gpu-sh: ; @echo $(GPU_TESTS_SH)'); do
            run "$t" env TRAIN_GPT="$PWD/train_gpt" BUILD="$PWD/build" PYTHON=python3 bash "$t"
        done
        # The kernel tests under the sanitizers: out-of-bounds and misaligned accesses
        # (memcheck), shared-memory races (racecheck), uninitialized reads (initcheck).
        # --error-exitcode makes a finding fail the stage's line, not only print.
        san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        for tool in memcheck racecheck initcheck; do
            run "compute-sanitizer --tool $tool build/test_gpu_kernels" \
                timeout "${SANITIZER_TIMEOUT:-200}" "$san" --tool "$tool" --error-exitcode 3 build/test_gpu_kernels
        done
        ;;
    bench)
        run "bench/gpu/run.sh" bash bench/gpu/run.sh
        ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
    esac
} | tee "$log"
echo "gpu_session: wrote $log"
