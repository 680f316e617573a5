# aarch64 (the Grace CPUs of GH200 nodes), checked here by cross-compiling and running under
# qemu-user (docs/build.md). Two builds: armv8-a, what `make NATIVE=0` gives on any aarch64
# Linux (NEON), and armv9-a, close to what `make` gives on Grace itself (-march=native:
# SVE2), run with Grace's 128-bit SVE vectors. For each:
#   1. the CPU build compiles, without a warning (where a header that x86-64 includes by
#      accident, or a comparison that unsigned `char` makes always false, shows);
#   2. the C unit tests pass under qemu;
#   3. test/configs/tiny_test.conf trains the same as on the host: per-step losses of the
#      aarch64 binary and of $TRAIN_GPT (both on the CPU, one thread, same shard and seed)
#      agree within a relative LOSS_RTOL (below: why that much and no more).
# The builds are static (qemu then needs no arm64 sysroot) and use the built-in gemm:
# Debian's arm64 OpenBLAS, PCRE2, zlib, libzstd and OpenSSL would need a multiarch sysroot,
# so they are left out (PKG_CONFIG_LIBDIR points nowhere, NO_*=1).
# Without the cross compilers or qemu: one "skipped: ..." line, exit 0.
. "$(dirname "$0")/lib.sh"
CROSS_CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
CROSS_CXX=${AARCH64_CXX:-aarch64-linux-gnu-g++}
QEMU=${QEMU_AARCH64:-qemu-aarch64-static}
PACKAGES="gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static"
for tool in "$CROSS_CC" "$CROSS_CXX" "$QEMU"; do
    if ! command -v "$tool" >/dev/null; then
        say "test_aarch64: skipped: no $tool (install $PACKAGES)"
        exit 0
    fi
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! echo 'int main(void){return 0;}' | "$CROSS_CC" -static -x c - -o "$tmp/probe" 2>/dev/null; then
    say "test_aarch64: skipped: $CROSS_CC cannot link a static program (install libc6-dev-arm64-cross)"
    exit 0
fi

# Why 1e-5. Both binaries compute in fp32 without FMA contraction (C11 mode; the C++ files
# have -ffp-contract=off), and with the same gemm they agree exactly: an x86-64 NO_BLAS=1
# build and both builds here print the same losses and gradient norms for 200 steps
# (measured; so glibc's expf / logf round alike on both, and SVE2 loops sum like SSE ones).
# The host binary usually has OpenBLAS, whose FMA kernels sum in another order: gradient
# norms differ from step 4 on (~1e-6 relative) and training amplifies it (AdamW takes
# full-size steps on coordinates whose gradient is at rounding level). Measured: the 20
# losses here agree to their 7 printed digits (< 3e-7); a longer run drifts to ~3e-6 by
# step 50 and ~1e-4 by step 100. So: few steps, and 1e-5, 30x above what 20 steps show and
# far below what a portability bug does (a misread shard or token, a wrong op move the loss
# by 1e-3 and more from the first step on).
LOSS_RTOL=1e-5
started=$(date +%s)

# The host's run, once.
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
train() {  # train OUT_DIR COMMAND...: tiny_test.conf, CPU, one thread
    local out=$1; shift
    "$@" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --out_dir "$out" --device cpu --threads 1 \
        --ckpt_every 0 --log_every 100 >"$out.log" 2>&1 || { cat "$out.log"; die "training in $out failed"; }
}
train "$tmp/host" "$TRAIN_GPT"
loss_table "$tmp/host/metrics.jsonl" >"$tmp/host.loss"

# Largest relative difference of two loss tables; fails above the tolerance.
compare_losses() {  # compare_losses HOST AARCH64 RTOL
    "$PYTHON" - "$@" <<'PY'
import sys
host = dict(line.split() for line in open(sys.argv[1]))
a64 = dict(line.split() for line in open(sys.argv[2]))
rtol = float(sys.argv[3])
if not host or host.keys() != a64.keys():
    print(f"different steps: host {sorted(host, key=int)}, aarch64 {sorted(a64, key=int)}")
    sys.exit(1)
worst = max(host, key=lambda s: abs(float(a64[s]) - float(host[s])) / abs(float(host[s])))
rel = abs(float(a64[worst]) - float(host[worst])) / abs(float(host[worst]))
print(f"{len(host)} steps, max relative difference {rel:.2e} at step {worst} "
      f"(host {host[worst]}, aarch64 {a64[worst]}; tolerance {rtol:g})")
sys.exit(0 if rel <= rtol else 1)
PY
}

variant() {  # variant NAME BUILD_DIR MARCH QEMU_CPU
    local name=$1 dir=$2 march=$3 cpu=$4 t0 ok t verdict
    say "-- $name: -march=$march, qemu -cpu $cpu"
    # 1. The build. MAKEFLAGS cleared: the caller's variables (NO_BLAS=1, ...) and jobserver
    # are not this build's.
    local targets="$dir/test_units $dir/test_ops $dir/test_quant $dir/test_device $dir/test_tokenizer $dir/train_gpt"
    t0=$(date +%s)
    if ! MAKEFLAGS= MFLAGS= PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR="$tmp/no-pkgconfig" \
        make --no-print-directory -j"$(nproc)" BUILD="$dir" NATIVE=0 \
        CC="$CROSS_CC -static -march=$march" CXX="$CROSS_CXX -static -march=$march" \
        NO_CUDA=1 NO_BLAS=1 NO_MPI=1 NO_OPENSSL=1 NO_ZLIB=1 NO_ZSTD=1 $targets >"$tmp/$name.build" 2>&1; then
        tail -n 30 "$tmp/$name.build"
        die "test_aarch64: the $name build failed (log above)"
    fi
    # A static glibc program that reaches dlopen (libgomp's OpenACC profiling hook does)
    # gets a link-time note about it: not ours, and no dlopen happens in a CPU run.
    grep 'warning:' "$tmp/$name.build" | grep -v "Using 'dlopen' in statically linked" >"$tmp/$name.warnings" || true
    local runs
    runs=$(grep -cF -e "$CROSS_CC -static" -e "$CROSS_CXX -static" "$tmp/$name.build" || true)
    check "$name build ($runs compiler runs, $(($(date +%s) - t0)) s): no warnings ($(wc -l <"$tmp/$name.warnings") lines)" \
        test ! -s "$tmp/$name.warnings"
    if [ -s "$tmp/$name.warnings" ]; then
        head -n 20 "$tmp/$name.warnings"
        rm -f "$dir/config.txt"  # every object depends on it: the next run recompiles and warns again
    fi
    # e_machine, bytes 18-19 of the ELF header: 183 (0xb7) is EM_AARCH64.
    check "$name train_gpt is an aarch64 executable" sh -c "od -An -tx1 -j18 -N2 '$dir/train_gpt' | grep -q 'b7 00'"

    # 2. The C unit tests (each prints its summary last).
    for t in test_units test_ops test_quant test_device test_tokenizer; do
        t0=$(date +%s)
        if QEMU_CPU=$cpu OMP_NUM_THREADS=2 "$QEMU" "$dir/$t" >"$tmp/$name.$t" 2>&1; then ok=0; else ok=1; fi
        [ "$ok" -eq 0 ] || tail -n 20 "$tmp/$name.$t"
        check "$t under qemu ($(($(date +%s) - t0)) s): $(tail -n 1 "$tmp/$name.$t")" test "$ok" -eq 0
    done

    # 3. The host's training, step by step.
    t0=$(date +%s)
    QEMU_CPU=$cpu train "$tmp/$name" "$QEMU" "$dir/train_gpt"
    loss_table "$tmp/$name/metrics.jsonl" >"$tmp/$name.loss"
    if verdict=$(compare_losses "$tmp/host.loss" "$tmp/$name.loss" "$LOSS_RTOL"); then ok=0; else ok=1; fi
    check "losses against the host ($(($(date +%s) - t0)) s): $verdict" test "$ok" -eq 0
}

variant armv8-a "$BUILD/aarch64" armv8-a max
# Grace (Neoverse V2): Armv9-A, SVE2 with 128-bit vectors (qemu's default is 512).
if "$CROSS_CC" -march=armv9-a -E -x c /dev/null >/dev/null 2>&1; then
    variant armv9-a "$BUILD/aarch64-sve2" armv9-a max,sve-default-vector-length=16
else
    say "-- armv9-a: left out ($CROSS_CC does not know -march=armv9-a: GCC 12 or later does)"
fi
say "  the check took $(($(date +%s) - started)) s"
finish test_aarch64
