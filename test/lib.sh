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

# The MPI tests: HAVE_MPI=1 when mpirun is here and MPI is linked into the binary (grep
# without -q: under pipefail an early exit would fail ldd with SIGPIPE); MPIRUN=(... -np),
# oversubscribed (2 cores), as root allowed.
detect_mpi() {
    HAVE_MPI=0
    command -v mpirun >/dev/null && ldd "$TRAIN_GPT" | grep libmpi >/dev/null && HAVE_MPI=1
    MPIRUN=(mpirun --oversubscribe -np)
    [ "$(id -u)" -eq 0 ] && MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np)
    return 0
}

# A test that needs MPI: detect_mpi, and without it say so and pass.
require_mpi() {
    detect_mpi
    if [ "$HAVE_MPI" = 0 ]; then
        say "  skip (no MPI in this build)"
        exit 0
    fi
}

# The tcp transport and `train_gpt relay` need OpenSSL's libcrypto (net/net.mk): a build without
# it refuses both with one line saying so. detect_tcp: HAVE_TCP=0 when the binary's relay says
# it was built without OpenSSL, else 1 (any other answer, a crash too, counts as tcp being there:
# the tcp test then runs and fails, never skips).
detect_tcp() {
    local out
    out=$("$TRAIN_GPT" relay --help 2>&1 || true)
    HAVE_TCP=1
    case $out in *"built without OpenSSL"*) HAVE_TCP=0 ;; esac
    return 0
}

# A test that needs the tcp transport or the relay: detect_tcp, and without it say so and pass.
require_tcp() {
    detect_tcp
    if [ "$HAVE_TCP" = 0 ]; then
        say "  skip (no OpenSSL in this build: no tcp transport, no relay)"
        exit 0
    fi
}

# check_ranks NP BINARY LOG: a C test under mpirun -np NP passes on every rank (each prints
# "…, 0 failed"); the log is shown when it does not.
check_ranks() {
    local np=$1 bin=$2 log=$3 rc=0
    "${MPIRUN[@]}" "$np" "$bin" >"$log" 2>&1 || rc=$?
    check "np $np: every rank passes ($(grep -c ', 0 failed' "$log") of $np; rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ \$(grep -c ', 0 failed' '$log') -eq $np ]"
    [ "$rc" -eq 0 ] || cat "$log"
}

# A TCP port free at the time of asking, on 127.0.0.1.
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A DiLoCo shared secret (64 hex characters, mode 600) in FILE.
make_secret() {
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"
    chmod 600 "$1"
}

# tmp=a fresh directory and pids=() for background processes; on exit every pid still running
# is killed and tmp removed (kept, and named, with KEEP_TMP=1). A negative pid is a process group,
# killed whole: a job started with setsid (mpirun: SIGKILL to it alone leaves its ranks running).
# A test that exits non-zero first prints the last lines of the 8 logs in tmp written last: CI
# keeps the test's output, not tmp, and a failure seen once under load is otherwise unexplained.
tmp_with_processes() {
    tmp=$(mktemp -d)
    pids=()
    trap 'tmp_status=$?
          for p in "${pids[@]}"; do kill -9 -- "$p" 2>/dev/null || true; wait "${p#-}" 2>/dev/null || true; done
          [ "$tmp_status" -ne 0 ] && tail_logs "$tmp"
          if [ -n "${KEEP_TMP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi' EXIT
}
tail_logs() {  # tail_logs DIR: the last 15 lines of the 8 newest *.log files under DIR
    local f
    find "$1" -name '*.log' -type f -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -n 8 | cut -d' ' -f2- |
        while IFS= read -r f; do
            printf -- '---- the last lines of %s\n' "${f#"$1"/}"
            tail -n 15 "$f"
        done
}

# The DiLoCo tests' files in $tmp: train.bin and val.bin (random tokens below 64, seeds 11 and
# 12: 60,000 and 5,000 of them) and a shared secret.
diloco_test_files() {
    "$TOOL" shard "$tmp/train.bin" 64 0 60000 11
    "$TOOL" shard "$tmp/val.bin" 64 0 5000 12
    make_secret "$tmp/secret"
}

# bytes_tokenizer FILE: a tokenizer.json of one token per byte (a byte-level BPE without merges,
# GPT-2's alphabet: printable bytes stand for themselves, the others for 256 + i): vocabulary 256.
bytes_tokenizer() {
"$PYTHON" - "$1" <<'PY'
import json, sys
keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
spelled, extra = {b: chr(b) for b in keep}, 0
for b in range(256):
    if b not in spelled:
        spelled[b] = chr(256 + extra)
        extra += 1
json.dump({"version": "1.0", "normalizer": None, "added_tokens": [],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "vocab": {spelled[b]: b for b in range(256)}, "merges": []}},
          open(sys.argv[1], "w"))
PY
}

# start_relay NAME SHARDS [TIMEOUT_S [OPTION...]]: a fresh DiLoCo hub (`train_gpt relay`, timeout
# TIMEOUT_S, default 3 s, secret $tmp/secret, the relay options after it and in $RELAY_OPTIONS) of SHARDS shards on consecutive ports from a free
# one, in the background (killed on exit), logging to $tmp/relay_NAME.log; returns once it
# listens on every shard's port, trying up to 5 ports; sets port.
start_relay() {
    local n
    for _ in 1 2 3 4 5; do
        port=$(free_port)
        "$TRAIN_GPT" relay --listen "127.0.0.1:$port" --secret_file "$tmp/secret" --timeout_s "${3:-3}" --shards "$2" \
            "${@:4}" ${RELAY_OPTIONS:-} >"$tmp/relay_$1.log" 2>&1 &
        pids+=($!)
        # Listening on every shard's port, or gone (port + 1 was taken: try other ports).
        while kill -0 "${pids[-1]}" 2>/dev/null; do
            n=$(grep -c 'listening on' "$tmp/relay_$1.log" 2>/dev/null || true)
            [ "${n:-0}" -ge "$2" ] && break
            sleep 0.05
        done
        kill -0 "${pids[-1]}" 2>/dev/null && return 0
    done
    die "cannot start a relay of $2 shards"
}

# theta_close A B STEP TOL: the outer.theta.* tensors of the step-STEP outer.safetensors in
# out_dirs A and B differ by at most TOL × max |θ| (of B's); prints the worst difference.
theta_close() {
    local step_dir; step_dir=step_$(printf %08d "$3")
    "$PYTHON" - "$1/$step_dir/outer.safetensors" "$2/$step_dir/outer.safetensors" "$4" "$3" <<'PY'
import json, os, struct, sys
import numpy as np
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for name, t in head.items():
        if name.startswith("outer.theta."):
            s, e = t["data_offsets"]
            out[name] = np.frombuffer(b[8 + n + s:8 + n + e], dtype="<f4")
    return out
a, b, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys() and a
scale = max(float(np.abs(x).max()) for x in b.values())
worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
run_a, run_b = (os.path.basename(os.path.dirname(os.path.dirname(p))) for p in sys.argv[1:3])
print("  θ at step %s: max |%s − %s| = %.3g, %.3g of max |θ| = %.3g"
      % (sys.argv[4], run_a, run_b, worst, worst / scale, scale))
sys.exit(0 if worst <= tol * scale else 1)
PY
}

# Final loss of a run.
final_loss() { loss_table "$1" | tail -n 1 | cut -d' ' -f2; }

# A listing of every file under a directory with its checksum, to prove nothing changed. Not
# out_dir's .lock: every run that starts there takes it and writes its pid into it, a refused
# one too (formats.md, the lock); what it says is who ran last, no content of the directory.
tree_digest() { (cd "$1" && find . -type f ! -path ./.lock -print0 | sort -z | xargs -0 -r sha256sum); }

# same_checkpoint A B STEP: the checkpoints of STEP in out_dirs A and B hold byte-identical
# model, optimizer and outer-state files (state.json is not compared).
same_checkpoint() {
    local f dir; dir=$(printf 'step_%08d' "$3")
    for f in model.safetensors optimizer.safetensors outer.safetensors; do
        cmp -s "$1/$dir/$f" "$2/$dir/$f" || { say "    $f of $dir differs"; return 1; }
    done
}

# wait_until WHAT COMMAND...: polls COMMAND every 0.1 s until it succeeds; after WAIT_LIMIT_S
# seconds (default 300: a loaded machine) says what it gave up on and returns 1.
wait_until() {
    local what=$1 t0=$SECONDS
    shift
    until "$@"; do
        if [ $((SECONDS - t0)) -ge "${WAIT_LIMIT_S:-300}" ]; then
            say "  (gave up waiting: $what)"
            return 1
        fi
        sleep 0.1
    done
}

# rank_pid MPIRUN_PID RANK: the pid of rank RANK of the job mpirun MPIRUN_PID started (its
# children, told apart by the rank their environment names); none yet: status 1.
rank_pid() {
    local p
    for p in $(pgrep -P "$1"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$2" >/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# stopped PID: the process is stopped (SIGSTOP, e.g. TRAIN_GPT_FAULT=stop_in_step); an empty PID is not.
stopped() { [ -n "$1" ] && [ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null)" = T ]; }
# ranks_stopped PID N: the N ranks of the mpirun PID (its children) are all stopped.
ranks_stopped() {
    local n=0 c
    for c in $(pgrep -P "$1"); do stopped "$c" || return 1; n=$((n + 1)); done
    [ "$n" -eq "$2" ]
}

# held_for_upload NAME LOG N PID...: the late replica of round LATE (diloco_late: its exchange
# waits timeout_s + 1 s), its processes PID... stopped in their last step (stop_in_step), goes on
# once LOG holds N "own upload done" lines (the on-time replica's tcp_trace:LATE): the round's
# first contribution began before that wait, so it is late whatever the machine's speed.
# (Started together, it was late only while the other replica reached the round less than 1 s
# after it: on a loaded machine, where the other may lag, it was not evicted.)
held_for_upload() {
    local name=$1 log=$2 n=$3
    shift 3
    uploaded() {
        local p
        for p in "$@"; do stopped "$p" || return 1; done
        [ "$(grep -c 'trace: .*own upload done' "$log" 2>/dev/null || true)" -ge "$n" ]
    }
    if ! wait_until "$name: the late replica held in its last step, the other's upload done" uploaded "$@"; then
        local p held=""
        for p in "$@"; do if stopped "$p"; then held="$held $p:stopped"; else held="$held $p:running"; fi; done
        die "$name: the late replica's processes ($held) not all stopped in their last step, or fewer than $n" \
            "'own upload done' lines in $log ($(grep -c 'own upload done' "$log" 2>/dev/null || true))"
    fi
    kill -CONT "$@"
}
# held_ranks_for_upload NAME LOG N PID R: held_for_upload for a late replica that is one mpirun
# PID of R ranks (its children), once they have all stopped in their last step.
held_ranks_for_upload() {
    local name=$1 log=$2 n=$3 pid=$4 ranks=$5
    wait_until "$name: the late replica's $ranks ranks to stop in their last step" ranks_stopped "$pid" "$ranks" ||
        die "$name: the late replica's ranks (children of mpirun $pid: $(pgrep -P "$pid" | tr '\n' ' ')) did not all stop" \
            "in their last step"
    held_for_upload "$name" "$log" "$n" $(pgrep -P "$pid")
}

# Distinct param_hash values per applied outer step over the given metrics files: "k:count"
# lines (1 everywhere: the replicas agree).
hashes_per_step() {
    "$PYTHON" - "$@" <<'PY'
import json, sys
from collections import defaultdict
seen = defaultdict(set)
for path in sys.argv[1:]:
    for line in open(path):
        d = json.loads(line)
        if "param_hash" in d and "event" not in d and d.get("applied"):
            seen[d["outer_step"]].add(d["param_hash"])
for k in sorted(seen):
    print(f"{k}:{len(seen[k])}")
PY
}

# Every applied outer step over the given metrics files has one param_hash, for at least WANT
# steps: all_hashes_agree WANT FILES...
all_hashes_agree() {
    local want=$1; shift
    local out; out=$(hashes_per_step "$@")
    if [ "$(printf '%s\n' "$out" | grep -c .)" -ge "$want" ] && ! printf '%s\n' "$out" | grep -v ':1$' >/dev/null; then return 0; fi
    say "    outer step:distinct hashes over $* = $(printf '%s ' $out)"
    return 1
}

# The mean loss of a metrics file's last 5 steps is below its first 5's by 20 %: loss_falls METRICS
loss_falls() {
    "$PYTHON" - "$1" <<'PY'
import json, sys
losses = [d["loss"] for d in map(json.loads, open(sys.argv[1])) if "loss" in d and "event" not in d]
first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
print(f"    loss: first 5 steps {first:.4f}, last 5 {last:.4f}")
sys.exit(0 if last < 0.8 * first else 1)
PY
}

# "outer_step param_hash" of every applied outer step of a metrics file, one per line.
outer_hashes() { grep '"applied":true' "$1" | sed -E 's/.*"outer_step":([0-9]+).*"param_hash":"([0-9a-f]+)".*/\1 \2/'; }

# The trainer with the test's ${common[@]} and ARGS, in an out_dir of its own, exits non-zero
# with exactly one error line, matching PATTERN: one_line_error PATTERN ARGS...
one_line_error() {
    local pattern=$1; shift
    local out rc=0
    out=$("$TRAIN_GPT" "${common[@]}" --out_dir "$(mktemp -d -p "$tmp")" "$@" 2>&1 >/dev/null) || rc=$?
    [ "$rc" -ne 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'train_gpt: error:')" -eq 1 ] &&
        printf '%s\n' "$out" | grep -- "$pattern" >/dev/null
}
