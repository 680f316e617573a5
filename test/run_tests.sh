# test/run_tests.sh TEST... — what `make test` runs: every test program and shell test, one
# at a time (TEST_JOBS=N: up to N at once), in the order given (the Makefile names the slowest
# first, so that with N > 1 no long test starts last and runs alone).
#
# Each test's output goes to $BUILD/test-logs/NAME.log too. One at a time it is printed as it
# comes; with N > 1, whole when the test ends, between "== NAME" and "== NAME: N s", so that
# the outputs of tests that ran at once never interleave. After the first failure no further
# test starts; the ones running finish, and the run ends with the names of the failed ones and
# status 1.
#
# Why one at a time by default: the tests' deadlines (a hub's timeout of 2-3 s, a state
# transfer paced against it) are sized for one test beside two busy processes on 2 cores, what
# CI's machine may be. Two tests at once there (most run 2-4 processes of their own) plus two
# busy processes missed them: test_transport's slowstate twice in two runs. On a machine with
# more cores N > 1 is safe and faster (the suite waits about a fifth of its time).
set -u
jobs=${TEST_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "run_tests: TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;; esac
logs=${BUILD:-build}/test-logs
mkdir -p "$logs" || exit 2
rm -f "$logs"/*.log "$logs"/*.failed
t0=$(date +%s)

# one TEST: runs it (a .sh with bash), then prints its block; a failure leaves NAME.failed.
one() {
    local t=$1 name rc s
    name=$(basename "$t")
    s=$(date +%s)
    if [ "$jobs" = 1 ]; then
        echo "== $t"
        run "$t" 2>&1 | tee "$logs/$name.log"
        rc=${PIPESTATUS[0]}
    else
        run "$t" >"$logs/$name.log" 2>&1
        rc=$?
    fi
    [ "$rc" = 0 ] || echo "$rc" >"$logs/$name.failed"
    {   # the lock file opened here, by each test's own block: a lock is its open file's
        flock 9
        [ "$jobs" = 1 ] || { echo "== $t"; cat "$logs/$name.log"; }
        if [ "$rc" = 0 ]; then echo "== $t: $(($(date +%s) - s)) s"
        else echo "== $t: FAILED (exit $rc) after $(($(date +%s) - s)) s; its output: $logs/$name.log"; fi
    } 9>>"$logs/.lock"
}
run() {
    case $1 in
        *.sh) bash "$1" ;;
        *) "$1" ;;
    esac
}
failed() { compgen -G "$logs/*.failed" >/dev/null; }

if [ "$jobs" = 1 ]; then
    # In the foreground: Ctrl-C reaches the test (a background job would ignore SIGINT).
    for t in "$@"; do
        one "$t"
        failed && break
    done
else
    # An interrupt ends the tests running too (in the background they ignore SIGINT).
    trap 'trap - INT TERM; kill -TERM 0 2>/dev/null; exit 130' INT TERM
    running=0
    for t in "$@"; do
        failed && break
        if [ "$running" -ge "$jobs" ]; then
            wait -n
            running=$((running - 1))
            failed && break
        fi
        one "$t" &
        running=$((running + 1))
    done
    wait
fi

if failed; then
    names=$(cd "$logs" && ls *.failed | sed 's/\.failed$//' | tr '\n' ' ')
    echo "make test: FAILED: $names(logs in $logs)"
    exit 1
fi
echo "make test: all passed in $(($(date +%s) - t0)) s ($jobs at a time)"
