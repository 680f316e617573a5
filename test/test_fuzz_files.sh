# The readers of outside files under libFuzzer (test/fuzz_files.c: JSON and a corpus's JSONL
# line against each other, safetensors, tokenizer.json) for FUZZ_SECONDS (default 30), from the
# seed corpus test/fuzz_files_seeds.py writes. Any crash, leak, sanitizer report, broken
# invariant or timeout fails. Skipped, with a line saying so, when clang has no libFuzzer
# (test/fuzz.mk builds $BUILD/fuzz_files only then).
set -euo pipefail
: "${BUILD:?}"
seconds=${FUZZ_SECONDS:-30}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$BUILD/fuzz_files" ]; then
    echo "  ✗ libFuzzer: file fuzzer not built (install clang); skipped"
    exit 0
fi
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
"${PYTHON:-python3}" "$here/fuzz_files_seeds.py" "$corpus/seeds"
mkdir -p "$corpus/new"
echo "  fuzzing the file readers for $seconds s ($(ls "$corpus/seeds" | wc -l) seeds)"
rc=0
"$BUILD/fuzz_files" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -artifact_prefix="$BUILD/fuzz-" -print_final_stats=1 "$corpus/new" "$corpus/seeds" \
    >"$corpus/log" 2>&1 || rc=$?
grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)' "$corpus/log" | sed 's/^/  /' || true
if [ "$rc" -ne 0 ]; then
    grep -E 'invariant broken|ERROR|SUMMARY' "$corpus/log" | head -n 5
    tail -n 40 "$corpus/log"
    echo "FAIL: fuzz_files found a problem (exit $rc); the input is in $BUILD/fuzz-*"
    exit 1
fi
echo "test_fuzz_files: no finding in $seconds s"
