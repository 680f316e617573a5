# test/lib.sh — shared helpers for the shell tests (sourced). Expects TRAIN_GPT, BUILD and
# PYTHON in the environment (make test sets them).
set -euo pipefail
: "${TRAIN_GPT:?}" "${BUILD:?}"
PYTHON=${PYTHON:-/usr/bin/python3}
TOOL="$BUILD/test_tool"
TESTS_FAILED=0

say() { printf '%s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
check() {  # check DESCRIPTION CONDITION-COMMAND...
    local what=$1; shift
    if "$@"; then say "  ok   $what"; else say "  FAIL $what"; TESTS_FAILED=$((TESTS_FAILED + 1)); fi
}
finish() {
    if [ "$TESTS_FAILED" -ne 0 ]; then die "$1: $TESTS_FAILED check(s) failed"; fi
    say "$1: all checks passed"
}

# step -> loss of the last line for each step in a metrics.jsonl, one "step loss" per line.
loss_table() {
    "$PYTHON" - "$1" <<'PY'
import json, sys
last = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "loss" in d and "step" in d:
        last[d["step"]] = d["loss"]
for s in sorted(last):
    print(s, repr(last[s]))
PY
}

# Final loss of a run.
final_loss() { loss_table "$1" | tail -n 1 | cut -d' ' -f2; }

# A listing of every file under a directory with its checksum, to prove nothing changed.
tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }
