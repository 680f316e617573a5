# The frame parser under libFuzzer (test/fuzz_wire.c) for FUZZ_SECONDS (default 30), from a
# seed corpus of valid frames of every type that test_wire writes. Any crash, leak,
# sanitizer report or timeout fails. Skipped, with a line saying so, when clang has no
# libFuzzer (test/fuzz.mk builds $BUILD/fuzz_wire only then, and only with OpenSSL).
set -euo pipefail
: "${BUILD:?}"
seconds=${FUZZ_SECONDS:-30}
if [ ! -x "$BUILD/fuzz_wire" ]; then
    echo "  ✗ libFuzzer: frame fuzzer not built (install clang); skipped"
    exit 0
fi
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
"$BUILD/test_wire" --corpus "$corpus/seeds" >/dev/null
mkdir -p "$corpus/new"
echo "  fuzzing the frame parser for $seconds s ($(ls "$corpus/seeds" | wc -l) seeds)"
rc=0
"$BUILD/fuzz_wire" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=70000 \
    -artifact_prefix="$BUILD/fuzz-" -print_final_stats=1 "$corpus/new" "$corpus/seeds" \
    >"$corpus/log" 2>&1 || rc=$?
grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)' "$corpus/log" | sed 's/^/  /' || true
if [ "$rc" -ne 0 ]; then
    tail -n 40 "$corpus/log"
    echo "FAIL: fuzz_wire found a problem (exit $rc); the input is in $BUILD/fuzz-*"
    exit 1
fi
echo "test_fuzz_wire: no finding in $seconds s"
