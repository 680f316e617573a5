# DiLoCo at the users' scale on loopback (issue: the hub reduces, docs/protocol.md):
#   1. 4 replicas over TCP (one relay) and 4 over MPI, same data and seed, int8 with error
#      feedback on both links: the same θ (param_hash) at every outer step, bit for bit —
#      the relay and the MPI ranks reduce with the same arithmetic.
#   2. 72 replicas of a ~1M-parameter model through one relay: a round closes with 72
#      contributors; on every replica bytes received <= 1.1 x bytes sent at every outer step;
#      every replica's peak RSS within 10 % of the 4-replica run's; param_hash equal on all
#      72 at every applied outer step; the relay logs its bytes in / out and RSS per round;
#      every replica's bytes sent and received per outer step are `train_gpt plan`'s figures.
# Every wait is for a file or a process, never for a time.
. "$(dirname "$0")/lib.sh"
require_tcp
tmp_with_processes
"$TOOL" shard "$tmp/train.bin" 64 0 60000 21
make_secret "$tmp/secret"
common=(test/configs/scale_test.conf --train_data "$tmp/train.bin" --val_every 0 --threads 1 --ckpt_keep 0
    --ckpt_every 0 --diloco_inner_steps 5 --diloco_quant int8 --diloco_error_feedback 1)
detect_mpi

# over_tcp NAME M: a relay and M replicas (min_replicas M: a round without all of them is
# skipped) into $tmp/NAME/<id>; waits for all; rc = the last non-zero exit status. The
# timeout is long: on a loaded machine 72 processes take a while to start, and the first
# round waits for every member to begin.
over_tcp() {
    local name=$1 m=$2 port r
    start_relay "$name" 1 120   # lib.sh's: listening before the replicas start (a taken port: another)
    local relay=${pids[-1]}
    local mine=()
    for ((r = 0; r < m; r++)); do
        "$TRAIN_GPT" "${common[@]}" --diloco_replicas "$m" --diloco_replica_id "$r" --diloco_min_replicas "$m" \
            --diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" \
            --diloco_timeout_s 120 --diloco_connect_timeout_s 300 --out_dir "$tmp/$name/$r" \
            >"$tmp/${name}_$r.log" 2>&1 &
        mine+=($!)
        pids+=($!)
    done
    rc=0
    for p in "${mine[@]}"; do wait "$p" || rc=$?; done
    kill -TERM "$relay" 2>/dev/null || true
    wait "$relay" 2>/dev/null || true
}

# Per outer step (applied), the distinct param_hash values and the worst bytes_recv / bytes_sent
# over the given metrics files, and the peak RSS of each: checks NAME=value lines.
summary() {
    "$PYTHON" - "$@" <<'PY'
import json, statistics, sys
hashes, ratio, rss, applied_by, moved = {}, 0.0, [], {}, set()
for path in sys.argv[1:]:
    for line in open(path):
        d = json.loads(line)
        if d.get("event") == "end":
            rss.append(d["peak_rss_mb"])
        elif "outer_step" in d and "event" not in d and d.get("applied"):
            hashes.setdefault(d["outer_step"], set()).add(d["param_hash"])
            applied_by.setdefault(d["outer_step"], 0)
            applied_by[d["outer_step"]] += 1
            ratio = max(ratio, d["bytes_recv"] / max(d["bytes_sent"], 1))
            if d["outer_step"] > 1: moved.add((d["bytes_sent"], d["bytes_recv"]))   # step 1 has the handshakes
print("steps=%d" % len(hashes))
print("distinct=%d" % max((len(v) for v in hashes.values()), default=0))
print("ratio=%.4f" % ratio)
print("rss_n=%d" % len(rss))
print("rss_median=%.1f" % (statistics.median(rss) if rss else 0))
print("rss_max=%.1f" % (max(rss) if rss else 0))
print("moved=" + " ".join("%d/%d" % m for m in sorted(moved)))
print("hashes=" + ",".join("%d:%s" % (k, sorted(v)[0]) for k, v in sorted(hashes.items())))
PY
}
val() { printf '%s\n' "$1" | sed -n "s/^$2=//p"; }

# ---------------------------------------------------------------- 1. TCP = MPI at M = 4
over_tcp tcp4 4
check "4 replicas over TCP: all exit 0 (rc $rc)" test "$rc" -eq 0
s4=$(summary "$tmp"/tcp4/*/metrics.jsonl)
check "4 replicas over TCP: 3 outer steps applied, one param_hash each ($(val "$s4" steps) steps, $(val "$s4" distinct) distinct)" \
    test "$(val "$s4" steps)" -eq 3 -a "$(val "$s4" distinct)" -eq 1
check "4 replicas over TCP: bytes received <= 1.1 x bytes sent (worst $(val "$s4" ratio))" \
    "$PYTHON" -c "import sys; sys.exit(0 if $(val "$s4" ratio) <= 1.1 else 1)"
if [ "$HAVE_MPI" = 1 ]; then
    "${MPIRUN[@]}" 4 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") --diloco_replicas 4 \
        --diloco_transport mpi --out_dir '$tmp/mpi4/'\$OMPI_COMM_WORLD_RANK" >"$tmp/mpi4.log" 2>&1 || cat "$tmp/mpi4.log"
    m4=$(summary "$tmp"/mpi4/*/metrics.jsonl)
    check "4 replicas over MPI = over TCP: the same param_hash at every outer step" \
        test "$(val "$m4" hashes)" = "$(val "$s4" hashes)" -a "$(val "$m4" distinct)" -eq 1
fi

# ---------------------------------------------------------------- 2. 72 replicas, one hub
over_tcp tcp72 72
check "72 replicas over TCP: all exit 0 (rc $rc)" test "$rc" -eq 0
check "72 replicas: the relay closes a round with 72 contributors" \
    grep -q "closed: 72 contributor(s)" "$tmp/relay_tcp72.log"
check "72 replicas: the relay logs bytes in, bytes out and its RSS per round" \
    grep -Eq "closed: 72 contributor\(s\) \[0 1 2 .* 71\], [0-9.]+ MiB in, [0-9.]+ MiB out, rss [0-9.]+ MiB, apply" \
    "$tmp/relay_tcp72.log"
s72=$(summary "$tmp"/tcp72/*/metrics.jsonl)
check "72 replicas: param_hash equal on all at every applied outer step ($(val "$s72" steps) steps, $(val "$s72" distinct) distinct)" \
    test "$(val "$s72" steps)" -ge 1 -a "$(val "$s72" distinct)" -eq 1
check "72 replicas: bytes received <= 1.1 x bytes sent on every replica (worst $(val "$s72" ratio))" \
    "$PYTHON" -c "import sys; sys.exit(0 if $(val "$s72" ratio) <= 1.1 else 1)"
check "72 replicas: peak RSS (median $(val "$s72" rss_median) MB, max $(val "$s72" rss_max)) within 10 % of 4 replicas' (median $(val "$s4" rss_median) MB)" \
    "$PYTHON" -c "import sys; sys.exit(0 if $(val "$s72" rss_n) == 72 and $(val "$s72" rss_max) <= 1.1 * $(val "$s4" rss_median) else 1)"
# What `train_gpt plan` says a replica moves per outer step must be what every one of them
# moved, but for heartbeats: 56-byte frames (a header and a tag, no body) sent whenever the
# link was quiet for a heartbeat interval, so their number depends on the machine's speed.
plan_bytes=$("$TRAIN_GPT" plan "${common[@]}" --diloco_replicas 72 --diloco_transport local 2>&1 |
    sed -nE 's/.*GB up \(.*, ([0-9]+) bytes\) and .* GB down \(.*, ([0-9]+) bytes\).*/\1\/\2/p')
check "72 replicas: bytes sent/received per outer step after the first ($(val "$s72" moved)) are plan's ($plan_bytes) + heartbeats" \
    "$PYTHON" -c "
import sys
up, down = map(int, '$plan_bytes'.split('/'))
moved = [tuple(map(int, m.split('/'))) for m in '$(val "$s72" moved)'.split()]
beats = lambda extra: extra >= 0 and extra % 56 == 0
sys.exit(0 if moved and all(beats(s - up) and beats(r - down) for s, r in moved) else 1)"
say "  rounds at the relay (72 replicas):"
grep "closed:" "$tmp/relay_tcp72.log" | sed 's/\[0 1 2 .* 71\]/[0 .. 71]/; s/^/    /'
finish test_diloco_scale
