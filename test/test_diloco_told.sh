# A replica the hub drops is told why, and one that breaks the protocol at every step ends with
# one line instead of rejoining for the rest of the run (net/relay.c end_session,
# net/transport_tcp.c disconnect). Two replicas train through a relay; replica 1 claims the last
# chunk of each of its payloads as replica 0's (TRAIN_GPT_FAULT=tcp_foreign_chunk:0). The hub
# drops it at each contribution with a REFUSE of code 9 saying "sent a chunk of another
# replica's payload"; it rejoins twice, saying so, and the third drop ends it with status 1 and
# a line naming the reason. Replica 0 trains on. (Before: replica 1 read only "the hub closed the
# connection", rejoined, took the state and was dropped again at every outer step, to the end.)
# Every wait is for an event (a process's exit, a metrics line).
. "$(dirname "$0")/lib.sh"
require_tcp
tmp_with_processes
diloco_test_files
start_relay told 1 30
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --ckpt_every 0 --batch_size 16
    --diloco_replicas 2 --diloco_inner_steps 3 --max_steps 100000000
    --diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
    --diloco_timeout_s 30 --diloco_connect_timeout_s 120 --diloco_min_replicas 1)
last_outer() { grep -s '"applied":true' "$1" | tail -n1 | sed -E 's/.*"outer_step":([0-9]+).*/\1/'; }
at_least() { local v; v=$(last_outer "$1"); [ -n "$v" ] && [ "$v" -ge "$2" ]; }

"$TRAIN_GPT" "${common[@]}" --diloco_replica_id 0 --out_dir "$tmp/r0" >"$tmp/r0.log" 2>&1 &
pids+=($!)
r0=$!
TRAIN_GPT_FAULT=tcp_foreign_chunk:0 "$TRAIN_GPT" "${common[@]}" --diloco_replica_id 1 --out_dir "$tmp/r1" \
    >"$tmp/r1.log" 2>&1 &
pids+=($!)
r1=$!
wait_until "replica 1 ends" sh -c "! kill -0 $r1 2>/dev/null" || die "replica 1 kept running"
rc=0
wait "$r1" || rc=$?
told="the hub at 127.0.0.1:$port dropped replica 1 for breaking the protocol: sent a chunk of another replica's payload"
check "replica 1 exits with status 1 (got $rc)" [ "$rc" -eq 1 ]
check "replica 1 is told why each time (3 times)" [ "$(grep -cF "$told" "$tmp/r1.log")" -ge 3 ]
check "replica 1's last line names the reason and that it was the third time" \
    sh -c "tail -n 1 '$tmp/r1.log' | grep -qF \"$told (the third time in a row\""
check "the relay drops replica 1 three times for its chunk" \
    [ "$(grep -c "replica 1 .* dropped: sent a chunk of another replica's payload" "$tmp/relay_told.log")" -eq 3 ]
k=$(last_outer "$tmp/r0/metrics.jsonl")
wait_until "replica 0 trains on" at_least "$tmp/r0/metrics.jsonl" $((${k:-0} + 2)) ||
    die "replica 0 made no progress after replica 1 ended"
check "replica 0 never saw a protocol error" sh -c "! grep -q 'breaking the protocol' '$tmp/r0.log'"
kill "$r0"
wait "$r0" || true
if [ -n "${VERBOSE:-}" ] || [ "$TESTS_FAILED" -ne 0 ]; then tail -n 30 "$tmp/r1.log" "$tmp/relay_told.log"; fi
finish test_diloco_told
