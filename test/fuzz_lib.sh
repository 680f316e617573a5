# test/fuzz_lib.sh — what test/test_fuzz_wire.sh and test/test_fuzz_files.sh share: run one
# libFuzzer target of test/fuzz.mk from a seed corpus for FUZZ_SECONDS (default 30).
#   fuzz_run NAME WHAT MAX_LEN SEED_COMMAND...
# runs $BUILD/NAME on the seeds SEED_COMMAND writes into the directory it is given as its last
# argument; prints the fuzzer's totals; any crash, leak, sanitizer report, broken invariant or
# timeout fails (the input lands in $BUILD/fuzz-*). Without the target (clang without
# libFuzzer) it says so and passes.
set -euo pipefail
: "${BUILD:?}"

fuzz_run() {
    local name=$1 what=$2 max_len=$3
    shift 3
    local seconds=${FUZZ_SECONDS:-30}
    if [ ! -x "$BUILD/$name" ]; then
        echo "  ✗ libFuzzer: $name not built (install clang); skipped"
        return 0
    fi
    local corpus
    corpus=$(mktemp -d)
    trap "rm -rf '$corpus'" EXIT
    "$@" "$corpus/seeds" >/dev/null
    mkdir -p "$corpus/new"
    echo "  fuzzing $what for $seconds s ($(ls "$corpus/seeds" | wc -l) seeds)"
    local rc=0
    "$BUILD/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
        -artifact_prefix="$BUILD/fuzz-" -print_final_stats=1 "$corpus/new" "$corpus/seeds" \
        >"$corpus/log" 2>&1 || rc=$?
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)' "$corpus/log" | sed 's/^/  /' || true
    if [ "$rc" -ne 0 ]; then
        grep -E 'invariant broken|ERROR|SUMMARY' "$corpus/log" | head -n 5 || true
        tail -n 40 "$corpus/log"
        echo "FAIL: $name found a problem (exit $rc); the input is in $BUILD/fuzz-*"
        exit 1
    fi
    echo "test_$name: no finding in $seconds s"
}
