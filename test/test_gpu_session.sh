# scripts/gpu_session.sh lease, the one list a session with a lent GPU runs (docs/cuda.md
# "Testing"), checked without a GPU so that a renamed script, test program or config breaks
# CI and not the next GPU session, which comes rarely and lasts ~15 minutes:
#   1. LEASE_DRY=1 on this tree: every item's scripts, configs and build/ targets exist;
#   2. the same on a copy of the tree with bench/recompute/gpu.sh removed: the dry run fails
#      and names the missing script;
#   3. an item cut at its cap leaves nothing running (in_session);
#   4. a second call told LEASE_DONE skips those items and ends with the list for the next.
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
# An item's leftovers: a benchmark's own `timeout` puts its child in a process group of its own,
# which the item's timeout does not signal; in_session kills what the item left in its session
# (it ran on beside the next item, on the GPU).
sed -n '/^in_session() {/,/^}/p' scripts/gpu_session.sh >"$tmp/in_session.sh"
# (The sleep's length names this run: two checkouts tested at once on one host must not see or
# kill each other's.)
printf 'timeout 300 sleep 297.%s &\nwait\n' "$$" >"$tmp/inner.sh"
rc=0
(. "$tmp/in_session.sh" && in_session timeout -k 2 1 bash "$tmp/inner.sh") >"$tmp/session.txt" 2>&1 || rc=$?
check "an item cut at its cap: status 124 ($rc), and what it left running is killed" \
    sh -c "[ $rc -eq 124 ] && grep -q 'left running in its session' '$tmp/session.txt' && ! pgrep -f 'sleep 29[7]\.$$' >/dev/null"
pkill -f "sleep 297\.$$" 2>/dev/null || true

# A second call on a fresh machine goes on from LEASE_DONE (the first reply's "lease done:" list):
# with a lease of 1 s every item not done is skipped, the two given are "done in an earlier call",
# and the list it ends with names the item (make, which runs in every call, is not in it).
mkdir -p "$tmp/bin" "$tmp/out"
printf '#!/bin/sh\ncase "$*" in *compute_cap*) echo 9.0 ;; *) echo "Fake GPU" ;; esac\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
# (in a copy of the tree: the lease writes its done list and files under build/)
git ls-files -z | tar --null -T - -cf - | (mkdir "$tmp/tree2" && cd "$tmp/tree2" && tar xf -)
(cd "$tmp/tree2" && PATH="$tmp/bin:$PATH" OUT="$tmp/out" COMMIT=test-lease-done LEASE_S=1 \
    LEASE_DONE='make|test_gpu_kernels' bash scripts/gpu_session.sh lease) >"$tmp/lease.txt" 2>&1 || true
check "LEASE_DONE: the items given are done in an earlier call" \
    sh -c "grep -q '^==== test_gpu_kernels: done in an earlier call' '$tmp/lease.txt' &&
           grep -q '^==== make: done in an earlier call' '$tmp/lease.txt' && grep -q '^==== test_gpu_step: skipped' '$tmp/lease.txt'"
check "... and the call ends with the list for the next (lease done: test_gpu_kernels)" \
    grep -qx 'lease done: test_gpu_kernels' "$tmp/lease.txt"
finish test_gpu_session
