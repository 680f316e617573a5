# test/run_tests.sh TEST... — what `make test` runs: every test program and shell test, in the
# order given, one at a time beside a second lane of tests that have no deadline (below), or
# (TEST_JOBS=N) up to N at once, the slowest first (the Makefile's TESTS_FIRST).
#
# Each test's output goes to $BUILD/test-logs/NAME.log too. A test of the first lane prints as
# it comes; every other test's output is printed whole once it ends, between "== NAME" and
# "== NAME: N s", never inside another test's. After the first failure no further test starts;
# the ones running finish, and the run ends with the names of the failed ones and status 1.
#
# Why one at a time: the tests' deadlines (a hub's timeout of 2-3 s, a state transfer paced
# against it) are sized for one test beside two busy processes on 2 cores, what CI's machine
# may be. Two such tests at once there (most run 2-4 processes of their own) plus two busy
# processes missed them: test_transport's slowstate twice in two runs. On a machine with more
# cores TEST_JOBS=N > 1 is safe and faster.
#
# The second lane (TEST_JOBS=1; TEST_LANE2=0 turns it off): the tests named in $TESTS_NICE
# (the Makefile's list: pure computation with no deadline or timeout of their own — the
# emulated GPU kernels, the cross builds and qemu, the references) run one at a time beside
# the first lane at nice 19. The first lane's tests wait for their processes' lines much of
# their time (about a fifth of the suite's); the second lane takes that idle CPU, and almost
# none a test of the first lane needs (nice 19 weighs 1/68 of nice 0 in Linux's scheduler), so
# the first lane's tests see the load they were sized for. Once the first lane is done, the
# second's tests run at nice 0 (the one running is reniced where that is allowed, as root):
# beside other busy processes the second lane then runs on as the first lane would have.
# Not as root, the second lane runs at nice 10, not 19: lowering a nice value needs root (or
# an RLIMIT_NICE that allows it), so the test running when the first lane ends keeps its nice
# value to its end; at 19 beside two busy processes it would get 1/68 of their share (a test of
# 2 minutes would take over an hour), at 10 about a tenth. Nice 10 weighs 1/9 of nice 0: a little
# more of the first lane's CPU than 19 takes, still far under one busy process.
set -u
jobs=${TEST_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "run_tests: TEST_JOBS must be a positive integer, not '$jobs'" >&2; exit 2 ;; esac
logs=${BUILD:-build}/test-logs
mkdir -p "$logs" || exit 2
rm -f "$logs"/*.log "$logs"/*.failed "$logs"/*.status "$logs"/.done2 "$logs"/.lane1_done
t0=$(date +%s)

# one TEST MODE [PREFIX...]: runs TEST (a .sh with bash) under PREFIX (e.g. nice); a failure
# leaves NAME.failed, the end NAME.status ("rc seconds"). MODE: live (printed as it comes),
# block (printed whole when it ends), later (printed whole by the first lane: print_done2).
one() {
    local t=$1 mode=$2 name rc s
    shift 2
    name=$(basename "$t")
    s=$(date +%s)
    if [ "$mode" = live ]; then
        echo "== $t"
        run "$@" "$t" 2>&1 | tee "$logs/$name.log"
        rc=${PIPESTATUS[0]}
    else
        run "$@" "$t" >"$logs/$name.log" 2>&1
        rc=$?
    fi
    [ "$rc" = 0 ] || echo "$rc" >"$logs/$name.failed"
    echo "$rc $(($(date +%s) - s))" >"$logs/$name.status"
    case $mode in
        live) status_line "$t" ;;
        block) print_block "$t" ;;
        later) echo "$t" >>"$logs/.done2" ;;
    esac
}
run() {  # run [PREFIX...] TEST
    local t=${!#}
    case $t in
        *.sh) "${@:1:$#-1}" bash "$t" ;;
        *) "$@" ;;
    esac
}
status_line() {
    local t=$1 name rc secs
    name=$(basename "$t")
    read -r rc secs <"$logs/$name.status"
    if [ "$rc" = 0 ]; then echo "== $t: $secs s"
    else echo "== $t: FAILED (exit $rc) after $secs s; its output: $logs/$name.log"; fi
}
print_block() {
    {   # the lock file opened here, by each block: a lock is its open file's
        flock 9
        echo "== $t"
        cat "$logs/$(basename "$1").log"
        status_line "$1"
    } 9>>"$logs/.lock"
}
failed() { compgen -G "$logs/*.failed" >/dev/null; }

# The second lane's tests that ended and are not printed yet (printed counts them).
printed=0
print_done2() {
    [ -e "$logs/.done2" ] || return 0
    local t n=0
    while read -r t; do
        n=$((n + 1))
        [ "$n" -le "$printed" ] && continue
        print_block "$t"
        printed=$n
    done <"$logs/.done2"
}
# descendants PID: every process below PID.
descendants() {
    local p
    for p in $(pgrep -P "$1" 2>/dev/null); do
        echo "$p"
        descendants "$p"
    done
}

if [ "$jobs" = 1 ]; then
    lane1=() lane2=()
    for t in "$@"; do
        if [ "${TEST_LANE2:-1}" != 0 ] && [[ " ${TESTS_NICE:-} " == *" $t "* ]]; then lane2+=("$t")
        else lane1+=("$t"); fi
    done
    lane2_pid="" lane2_nice=19
    [ "$(id -u)" = 0 ] || lane2_nice=10   # not root: no renice to 0 later (above)
    if [ ${#lane2[@]} -gt 0 ]; then
        (
            for t in "${lane2[@]}"; do
                failed && break
                if [ -e "$logs/.lane1_done" ]; then one "$t" later
                else one "$t" later nice -n "$lane2_nice"; fi
            done
        ) &
        lane2_pid=$!
        # An interrupt ends the second lane too (in the background it ignores SIGINT).
        trap 'trap "" INT TERM; kill -TERM 0 2>/dev/null; exit 130' INT TERM   # ignored here: the kill ends the others, not this script
        echo "run_tests: ${#lane2[@]} tests without deadlines run beside the others at nice $lane2_nice: ${lane2[*]}"
    fi
    # In the foreground: Ctrl-C reaches the test (a background job would ignore SIGINT).
    for t in "${lane1[@]}"; do
        one "$t" live
        print_done2
        failed && break
    done
    if [ -n "$lane2_pid" ]; then
        : >"$logs/.lane1_done"
        # Its test running now at nice 0 too, where allowed (lowering a nice value needs root;
        # elsewhere it stays at nice 10 to its end: lane2_nice).
        renice 0 -p $(descendants "$lane2_pid") >/dev/null 2>&1 || true
        while kill -0 "$lane2_pid" 2>/dev/null; do
            print_done2
            sleep 1
        done
        wait "$lane2_pid"
        print_done2
    fi
else
    # An interrupt ends the tests running too (in the background they ignore SIGINT).
    trap 'trap "" INT TERM; kill -TERM 0 2>/dev/null; exit 130' INT TERM   # ignored here: the kill ends the others, not this script
    running=0
    for t in "$@"; do
        failed && break
        if [ "$running" -ge "$jobs" ]; then
            wait -n
            running=$((running - 1))
            failed && break
        fi
        one "$t" block &
        running=$((running + 1))
    done
    wait
fi

if failed; then
    names=$(cd "$logs" && ls *.failed | sed 's/\.failed$//' | tr '\n' ' ')
    echo "make test: FAILED: $names(logs in $logs)"
    exit 1
fi
lane=""
[ "$jobs" = 1 ] && [ ${#lane2[@]} -gt 0 ] && lane=", ${#lane2[@]} of them in a second lane at nice $lane2_nice"
echo "make test: all passed in $(($(date +%s) - t0)) s ($jobs at a time$lane)"
