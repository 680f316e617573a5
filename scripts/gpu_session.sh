#!/usr/bin/env bash
# scripts/gpu_session.sh — everything a session with a lent GPU runs, raw output kept as
# evidence to commit: `lease` (below) for today's ~15-minute lease, and the four stages it
# was made from, each one 10-minute device command, for a longer one:
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
#   bash scripts/gpu_session.sh lease       # the session's whole device time in one list, most
#                                           # needed first, for a lease of ~15 minutes (below)
#
# On an H100 (2026-11-24) the first three stages took about 4, 5 and 7 minutes. Output goes to
# $OUT (the device tool's folder that comes back) when set, else to bench/results/, as
# DATE-STAGE-GPUNAME.txt; the benchmark scripts write their own files beside it. COMMIT=...
# names the code when the checkout travels without its git history.
#
# lease: a session is lent ~15 minutes of device time in all, the machine's start included,
# and a machine stays warm only ~30 s after a call: one call of about 9 minutes and, at once,
# a short second one. The stage runs the checks of all four stages as one list in order of
# need (correctness, then #11's speed against PyTorch, then FSDP and recompute, then the
# sanitizers and the other rows) while LEASE_S seconds last (500); an item whose estimate no
# longer fits is skipped and named, each runs under `timeout` of its cap or of what is left.
# Items finished are listed in build/lease.done.COMMIT, so a second call on the warm machine
# (`LEASE_S=<budget left − 60> bash scripts/gpu_session.sh lease`) goes on where the first
# stopped; on a fresh machine, LEASE_DONE='<the first reply's "lease done:" list>' does. The
# build is for this GPU's architecture alone (exported CUDA_ARCH, so that the benchmark
# scripts' own `make` reuses it), with libnccl.so.2 from PyTorch's wheel when the system has none.
# With $OUT set, the files the items write (results, logs) are packed after every item into
# $OUT/lease-files.tar.gz, next to the stage's log: the device tool brings back 8 files at most.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
stage=${1:?usage: gpu_session.sh check|bench-1b|bench-rest|fa2|lease}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' /' '--' | tr -cd 'A-Za-z0-9._-')
dest=${OUT:-bench/results}
mkdir -p "$dest"
log="$dest/$(date -u +%F)-$stage-${gpu:-nogpu}.txt"
# LEASE_DRY=1 (lease only; `make test` runs it, test/test_gpu_session.sh): run nothing, check
# that every item's script and build target exists, so that a rename breaks CI and not the
# next rare GPU session.
dry=${LEASE_DRY:-0}
if [ "$dry" = 1 ]; then
    [ "$stage" = lease ] || { echo "gpu_session: LEASE_DRY=1 is for the lease stage" >&2; exit 2; }
    log=/dev/null
fi
jobs=$(nproc)
export PATH=$PATH:/usr/local/cuda/bin
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
compute_cap() { nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.'; }  # 90 on Hopper

run() {  # run TITLE COMMAND...: prints the title, the command's output and its exit status (also in $last_rc)
    echo "==== $1"
    shift
    local t0=$SECONDS rc=0
    "$@" 2>&1 || rc=$?
    echo "==== exit $rc after $((SECONDS - t0)) s"
    last_rc=$rc
    return 0
}

build() {
    # The GPU's own architecture too, so that nothing is JIT-compiled from PTX at start-up.
    local cc
    cc=$(compute_cap)
    case "$cc" in
    80 | 90) make -j"$jobs" all build/test_tool build/reference_dump build/bench_attention ;;
    *) make -j"$jobs" all build/test_tool build/reference_dump build/bench_attention \
        CUDA_ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_${cc},code=sm_${cc}" ;;
    esac
}

# --- lease ---------------------------------------------------------------------------------
lease_setup() {
    if [ "$dry" = 1 ]; then
        deadline=$((SECONDS + 100000)) done_file=/dev/null real_out= missing=0 items=0 targets_ok=
        skipped=()
        return 0
    fi
    commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
    export COMMIT=$commit
    done_file=build/lease.done.$commit
    # LEASE_DONE="NAME|NAME|...": items a call on another machine finished (the first reply's
    # "lease done:" line), for a second call that lands on a fresh machine or after a commit.
    local name
    if [ -n "${LEASE_DONE:-}" ]; then
        mkdir -p build
        IFS='|' read -r -a lease_done_given <<<"$LEASE_DONE"
        for name in "${lease_done_given[@]}"; do
            [ -n "$name" ] && ! grep -qxF "$name" "$done_file" 2>/dev/null && echo "$name" >>"$done_file"
        done
    fi
    deadline=$((SECONDS + ${LEASE_S:-500}))
    skipped=() summary=()
    mkdir -p build
    local cc
    cc=$(compute_cap)
    export CUDA_ARCH="-gencode arch=compute_${cc:-90},code=sm_${cc:-90}"
    # NCCL: the build needs no header (cuda/nccl_abi.h); a job of GPU ranks needs libnccl.so.2
    # where dlopen finds it. Where the system has none, PyTorch's wheel has one (its layout
    # varies: nvidia/nccl/lib, nvidia/cu13/lib, ...).
    local nccl_lib=system
    # (grep without -q: under pipefail its early exit would fail ldconfig with SIGPIPE)
    if ! ldconfig -p 2>/dev/null | grep 'libnccl\.so\.2 ' >/dev/null && [ ! -f /usr/local/cuda/lib64/libnccl.so.2 ]; then
        local d so
        d=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
        so=$([ -n "$d" ] && find "$d" -maxdepth 4 -name 'libnccl.so.2' 2>/dev/null | head -n 1)
        if [ -n "$so" ]; then
            export LD_LIBRARY_PATH=$(dirname "$so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            nccl_lib=$so
        else
            nccl_lib="none found (multi-rank GPU items will fail)"
        fi
    fi
    echo "lease: ${LEASE_S:-500} s, CUDA_ARCH=$CUDA_ARCH, libnccl.so.2: $nccl_lib," \
        "done before: $(cat "$done_file" 2>/dev/null | tr '\n' ' ')"
    # The items' own files: the benchmark scripts copy theirs into $OUT, which becomes a folder
    # of this call's (build/lease-files/callN) that is packed, with the earlier calls' folders,
    # into the real $OUT after every item. What they write under bench/results is copied there
    # too (a folder per call: the tree that travels again may bring a result file back without
    # the rows an earlier call appended).
    real_out=${OUT:-}
    if [ -n "$real_out" ]; then
        local n=1
        while [ -e "build/lease-files/call$n" ]; do n=$((n + 1)); done
        export OUT=$PWD/build/lease-files/call$n
        mkdir -p "$OUT"
        touch "$OUT.start"
    fi
}

pack() {
    [ -n "$real_out" ] || return 0
    cp "$done_file" build/lease-files/lease.done 2>/dev/null
    find bench/results -type f -newer "$OUT.start" -exec cp {} "$OUT/" \; 2>/dev/null
    tar czf "$real_out/lease-files.tar.gz.part" -C build/lease-files . &&
        mv "$real_out/lease-files.tar.gz.part" "$real_out/lease-files.tar.gz"
}

dry_check() {  # dry_check NAME COMMAND...: its scripts exist and its build/ targets are make targets
    local name=$1 a ok=1
    shift
    for a in "$@"; do
        case "$a" in
        *.sh | *.py) [ -f "$a" ] || { echo "  missing script $a"; ok=0; } ;;
        build/*)  # each target once (make -n reads the whole Makefile: about a second)
            case " $targets_ok " in *" $a "*) continue ;; esac
            if make -n "$a" >/dev/null 2>&1; then targets_ok="$targets_ok $a"; else echo "  no make target $a"; ok=0; fi ;;
        gpt-*) [ -f "bench/gpu/$a.conf" ] || { echo "  no config bench/gpu/$a.conf"; ok=0; } ;;
        esac
    done
    items=$((items + 1))
    if [ "$ok" = 1 ]; then echo "==== $name: ok"; else echo "==== $name: BROKEN"; missing=$((missing + 1)); fi
    last_rc=0
}

# in_session COMMAND...: COMMAND in a session of its own; what it leaves running is killed at its
# end. (A benchmark's own `timeout` puts its child in a process group of its own, which the
# item's `timeout` does not signal: cut at its cap, the item left a train_gpt or PyTorch run on
# the GPU, beside the next item, for up to its own limit.)
in_session() {
    local sid rc=0 left
    # Without job control the background command is no process group's leader, so setsid makes
    # it a session's in place (its pid is the session's id); with it (set -m), setsid would fork.
    local -
    set +m
    setsid "$@" &
    sid=$!
    wait "$sid" || rc=$?
    left=$(pgrep -s "$sid" | tr '\n' ' ')
    if [ -n "$left" ]; then
        echo "==== left running in its session: $left(killed)"
        pkill -9 -s "$sid"
    fi
    return "$rc"
}

item() {  # item NAME ESTIMATE_S CAP_S COMMAND...: run it if its estimate fits what is left, under timeout
    local name=$1 est=$2 cap=$3
    shift 3
    if [ "$dry" = 1 ]; then
        dry_check "$name" "$@"
        return 0
    fi
    if grep -qxF "$name" "$done_file" 2>/dev/null; then
        echo "==== $name: done in an earlier call"
        last_rc=0
        return 0
    fi
    local left=$((deadline - SECONDS))
    if [ "$est" -gt "$left" ]; then
        echo "==== $name: skipped (about $est s; $left s left)"
        skipped+=("$name")
        last_rc=skipped
        return 0
    fi
    local t0=$SECONDS
    run "$name" in_session timeout -k 5 "$((cap < left ? cap : left))" "$@"
    summary+=("$(printf '%-28s exit %-4s %4d s' "$name" "$last_rc" $((SECONDS - t0)))")
    # Cut off by the lease's end rather than its own cap: not done, a later call runs it again.
    case "$last_rc" in 124 | 137) [ $((deadline - SECONDS)) -le 5 ] && { skipped+=("$name (cut off)"); pack; return 0; } ;; esac
    echo "$name" >>"$done_file"
    pack
}

# need NAME ESTIMATE_S CAP_S COMMAND...: an item the rest depends on (the build), run in every
# call (a no-op when nothing changed; the tree sent again for a second call may have newer
# files, and the benchmark scripts' own `make` would rebuild inside their time); without it
# the list stops.
need() {
    item "$@"
    [ "$dry" = 1 ] || sed -i "/^$1\$/d" "$done_file" 2>/dev/null
    [ "$last_rc" = 0 ] && return 0
    echo "==== lease: stopping: '$1' did not succeed ($last_rc), and every item after it needs it"
    return 1
}

lease() {
    lease_setup
    if [ "$dry" != 1 ]; then
        run "nvidia-smi" nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv
        run "nvcc" nvcc --version
        run "torch" python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
    fi
    local gpu_tests
    gpu_tests=$(make -s -f Makefile -f - print-gpu-tests <<<'print-gpu-tests: ; @echo $(GPU_TESTS)')
    [ "$dry" != 1 ] || [ -n "$gpu_tests" ] || { echo "==== the Makefile lists no GPU tests (a build without nvcc?)"; missing=$((missing + 1)); }
    # shellcheck disable=SC2086
    need make 60 300 make -s -j"$jobs" all build/test_tool build/reference_dump build/bench_attention $gpu_tests ||
        { pack; return 0; }
    # Correctness: every kernel against its reference, the GPU step against the CPU's, both attentions.
    # Caps of a few times the 2026-11-24 H100 times (test_gpu_kernels 1 s, test_gpu_step 12 s,
    # memcheck 2 s, racecheck 14 s): a kernel that hangs costs each item that runs it its cap.
    item test_gpu_kernels 20 60 build/test_gpu_kernels
    local kernels_hung=$last_rc
    item test_gpu_step 25 90 build/test_gpu_step
    item "test_gpu_step fa2" 25 90 env TRAIN_GPT_ATTENTION=fa2 build/test_gpu_step
    # Quick: sizes up to 100003 and a few of 3000001 (the whole list took ~71 s in 2026-11 with
    # three codecs; with int2 and the sparse codecs it is ~5 times that).
    item test_quant_gpu 40 150 env TRAIN_GPT_TEST_QUICK=1 build/test_quant_gpu
    # The kernel tests under the sanitizers: out-of-bounds accesses, and shared-memory races
    # between real warps (what the CPU's warp emulator cannot show for fa2); initcheck later.
    # Not after test_gpu_kernels hung: they run the same kernels, slower.
    local tool sanitize=1
    case "$kernels_hung" in
    124 | 137) sanitize=0 && echo "==== the sanitizers: skipped (test_gpu_kernels timed out)" ;;
    esac
    for tool in memcheck racecheck; do
        [ "$sanitize" = 1 ] || break
        item "$tool" 40 "$([ "$tool" = memcheck ] && echo 60 || echo 120)" \
            env TRAIN_GPT_TEST_QUICK=1 "$san" --tool "$tool" --error-exitcode 3 build/test_gpu_kernels
    done
    # #11: attention alone against PyTorch's, then the 1B model against PyTorch 2 (register-resident
    # attention), the same row on the default kernels (ours alone), and where the time goes.
    item attention 70 240 bash bench/gpu/attention.sh
    item "gpt-1b docs fa2" 80 300 env TRAIN_GPT_ATTENTION=fa2 TORCH_TIMEOUT=220 bash bench/gpu/run.sh gpt-1b 4096 docs
    item "gpt-1b docs wmma" 30 150 env TORCH=0 bash bench/gpu/run.sh gpt-1b 4096 docs
    item test_gpu_train 70 200 env TRAIN_GPT="$PWD/train_gpt" BUILD="$PWD/build" PYTHON=python3 bash test/test_gpu_train.sh
    item test_fsdp_gpu 60 200 env TRAIN_GPT="$PWD/train_gpt" BUILD="$PWD/build" PYTHON=python3 bash test/test_fsdp_gpu.sh
    item "kernels gpt-1b docs fa2" 40 150 env TRAIN_GPT_ATTENTION=fa2 bash bench/gpu/kernels.sh gpt-1b 4096 docs
    # #18 and #14's figures.
    item "recompute gpt-1b" 180 240 env TRAIN_GPT_ATTENTION=fa2 bash bench/recompute/gpu.sh gpt-1b 4096
    item "fsdp gpt-124m" 60 200 bash bench/fsdp/gpu.sh gpt-124m 1024
    # The default kernels' table with today's memory-bound kernels: with the 2026-11-24 tables
    # (before) and fa2's (after), #11's before/after per kernel family.
    item "kernels gpt-1b docs wmma" 40 150 bash bench/gpu/kernels.sh gpt-1b 4096 docs
    [ "$sanitize" = 1 ] && item initcheck 40 120 env TRAIN_GPT_TEST_QUICK=1 "$san" --tool initcheck --error-exitcode 3 build/test_gpu_kernels
    # The other rows, as time allows.
    item "gpt-1b causal fa2" 80 300 env TRAIN_GPT_ATTENTION=fa2 TORCH_TIMEOUT=220 bash bench/gpu/run.sh gpt-1b 4096 causal
    item "kernels gpt-1b causal fa2" 40 150 env TRAIN_GPT_ATTENTION=fa2 bash bench/gpu/kernels.sh gpt-1b 4096 causal
    item "gpt-124m docs fa2" 60 300 env TRAIN_GPT_ATTENTION=fa2 TORCH_TIMEOUT=220 bash bench/gpu/run.sh gpt-124m 4096 docs
    if [ "$dry" = 1 ]; then
        echo "==== lease (dry): $items items, $missing broken"
        [ "$missing" = 0 ] || exit 1
        return 0
    fi
    echo "==== lease: $((SECONDS)) s; skipped: ${skipped[*]:-none}"
    pack
    lease_summary
}

# The end of the output is what the device tool's reply shows: the items' exit statuses and
# the result tables this call wrote, short.
lease_summary() {
    echo "==== summary of this call (exit 0: passed; 124: its timeout)"
    local line f
    for line in "${summary[@]}"; do echo "  $line"; done
    # For a second call on another machine (or after a commit): LEASE_DONE='...' skips these.
    echo "lease done: $(paste -sd'|' "$done_file" 2>/dev/null)"
    [ -n "$real_out" ] || return 0
    for f in "$OUT"/*-gpu-vs-pytorch-*.txt "$OUT"/*-recompute-gpu-*.txt "$OUT"/*-attention-*.txt; do
        [ -f "$f" ] || continue
        echo "---- $(basename "$f")"
        grep -v '^#' "$f" | grep -v -i 'warning' | tail -n 14 | cut -c1-200
    done
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
    lease) lease ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
    esac
} | tee "$log"
rc=${PIPESTATUS[0]}
[ "$dry" = 1 ] || echo "gpu_session: wrote $log"
exit "$rc"
