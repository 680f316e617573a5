# scripts/gpu_session.sh lease, the one list a session with a lent GPU runs (docs/cuda.md
# "Testing"), checked without a GPU so that a renamed script, test program or config breaks
# CI and not the next GPU session, which comes rarely and lasts ~15 minutes:
#   1. LEASE_DRY=1 on this tree: every item's scripts, configs and build/ targets exist;
#   2. the same on a copy of the tree with bench/recompute/gpu.sh removed: the dry run fails
#      and names the missing script.
# Needs a build with nvcc (the GPU test programs are make targets only then); else skipped.
. "$(dirname "$0")/lib.sh"
if ! make -n build/test_gpu_kernels >/dev/null 2>&1; then  # the script's own build folder
    say "test_gpu_session: skipped (no nvcc: the GPU test programs are not make targets in this build)"
    exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

LEASE_DRY=1 bash scripts/gpu_session.sh lease >"$tmp/dry.txt" 2>&1 && rc=0 || rc=$?
check "the dry lease passes (exit $rc; $(tail -n 1 "$tmp/dry.txt"))" test "$rc" -eq 0
items=$(grep -c '^==== .*: ok$' "$tmp/dry.txt" || true)
check "it checked at least 15 items ($items)" test "$items" -ge 15

# The planted break: a copy of the tracked tree without the recompute benchmark.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z | tar --null -T - -cf - | (mkdir "$tmp/tree" && cd "$tmp/tree" && tar xf -)
    rm "$tmp/tree/bench/recompute/gpu.sh"
    (cd "$tmp/tree" && LEASE_DRY=1 bash scripts/gpu_session.sh lease) >"$tmp/broken.txt" 2>&1 && rc=0 || rc=$?
    check "with bench/recompute/gpu.sh gone the dry lease fails (exit $rc)" test "$rc" -ne 0
    check "and names it" grep -q "missing script bench/recompute/gpu.sh" "$tmp/broken.txt"
fi
finish test_gpu_session
