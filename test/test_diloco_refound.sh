# A group that a replica behind the others founds, after the hub lost it, does not take the
# others back (net/relay.c: refound_ahead). Three replicas train through a relay; replica 2 stops
# (SIGTERM: it checkpoints) while 0 and 1 go on 5 more outer steps; 0 and 1 are stopped (SIGSTOP),
# the relay dies (kill -9) and a new one listens on its port (a login node's reboot); replica 2
# is requeued (the same command: it resumes from its checkpoint) and reaches the new relay first,
# founding the group at its old outer step. Then 0 and 1 go on and rejoin, ahead of it (the first
# of them to come founds the group anew). They
# took replica 2's state, every replica went back to its outer step, and nothing said so. Now the
# group is founded anew from replica 0 (no round had been held yet) and replica 2 takes its state:
#   1. diloco_min_replicas 2: replica 2 is held as founder (no quorum) when replica 0 comes;
#   2. diloco_min_replicas 1: replica 2 trains at once; it stops itself in its first step
#      (TRAIN_GPT_FAULT=stop_in_step), so that replica 0 comes before its first round, and goes on
#      once the group is founded anew: its first contribution is refused (not a member) and it
#      rejoins, taking the state.
# In both replica 2 joins at an outer step not below the one 0 had reached, and neither 0 nor 1
# goes back (the warning "went back" a replica now gives when it does is absent).
# Every wait is for an event (a log line, a stopped process, a metrics line); the relays' timeout
# of 30 s only bounds how long a silent replica is kept (replica 2 stopped in part 2).
. "$(dirname "$0")/lib.sh"
require_tcp
tmp_with_processes
diloco_test_files
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --ckpt_every 0 --batch_size 16
    --diloco_replicas 3 --diloco_inner_steps 5 --max_steps 100000000)
last_outer() { grep -s '"applied":true' "$1" | tail -n1 | sed -E 's/.*"outer_step":([0-9]+).*/\1/'; }
at_least() { local v; v=$(last_outer "$1"); [ -n "$v" ] && [ "$v" -ge "$2" ]; }
join_outer() { grep -s '"event":"diloco_join"' "$1" | tail -n1 | sed -E 's/.*"outer_step":([0-9]+).*/\1/'; }
joined_at_least() { local v; v=$(join_outer "$1"); [ -n "$v" ] && [ "$v" -ge "$2" ]; }

scenario() {  # scenario NAME MIN_REPLICAS STOP_IN_FIRST_STEP
    local name=$1 minr=$2 stop_first=$3 dir="$tmp/$1" relay r k2 step before
    local -a id
    mkdir -p "$dir"
    start_relay "${name}_a" 1 30
    relay=${pids[-1]}
    local tcp=(--diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
        --diloco_timeout_s 30 --diloco_connect_timeout_s 120 --diloco_min_replicas "$minr")
    run() {  # run REPLICA [ENV...]
        env "${@:2}" "$TRAIN_GPT" "${common[@]}" "${tcp[@]}" --diloco_replica_id "$1" --out_dir "$dir/r$1" \
            >>"$dir/r$1.log" 2>&1 &
        pids+=($!)
        id[$1]=$!
    }
    for r in 0 1 2; do run $r; done
    wait_until "$name: replica 2 applies outer step 3" at_least "$dir/r2/metrics.jsonl" 3 || die "$name: no progress"
    kill -TERM "${id[2]}"
    wait "${id[2]}" || true
    k2=$(last_outer "$dir/r2/metrics.jsonl")
    step=$(ls "$dir/r2" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n1)
    [ -n "$step" ] || die "$name: replica 2 left no checkpoint at its SIGTERM"
    wait_until "$name: replica 0 five outer steps further" at_least "$dir/r0/metrics.jsonl" $((k2 + 5)) ||
        die "$name: replicas 0 and 1 made no progress"
    kill -STOP "${id[0]}" "${id[1]}"
    before=$(last_outer "$dir/r0/metrics.jsonl")
    kill -9 "$relay"
    wait "$relay" 2>/dev/null || true
    "$TRAIN_GPT" relay --listen "127.0.0.1:$port" --secret_file "$tmp/secret" --timeout_s 30 >"$tmp/relay_${name}_b.log" 2>&1 &
    pids+=($!)
    wait_until "$name: the new relay listens" grep -qs 'listening on' "$tmp/relay_${name}_b.log" || die "$name: no new relay"
    if [ "$stop_first" = 1 ]; then run 2 TRAIN_GPT_FAULT="stop_in_step:$step"; else run 2; fi
    wait_until "$name: replica 2 founds the new group" grep -qs 'replica 2 joined: founds the group' \
        "$tmp/relay_${name}_b.log" || die "$name: replica 2 did not found the group"
    [ "$stop_first" = 1 ] && { wait_until "$name: replica 2 stops in its first step" stopped "${id[2]}" ||
        die "$name: replica 2 did not stop in step $step"; }
    kill -CONT "${id[0]}" "${id[1]}"
    wait_until "$name: the group is founded anew" grep -q 'ahead of the group being founded' "$tmp/relay_${name}_b.log" ||
        die "$name: the group was not founded anew"
    [ "$stop_first" = 1 ] && kill -CONT "${id[2]}"
    wait_until "$name: replica 2 takes the group's state" joined_at_least "$dir/r2/metrics.jsonl" "$before" ||
        die "$name: replica 2 took no state of outer step $before or later"
    check "$name: the group is founded anew from replica 0 or 1 (replica 2 at outer step $k2, replica 0 at $before)" \
        grep -q "replica [01] joined at outer step [0-9]*.*ahead of the group being founded at outer step [0-9]* (no round yet): it founds the group anew; replica(s) \[2\] take its state" \
        "$tmp/relay_${name}_b.log"
    check "$name: replica 2 joins at outer step $(join_outer "$dir/r2/metrics.jsonl") (not below $before)" \
        joined_at_least "$dir/r2/metrics.jsonl" "$before"
    check "$name: replicas 0 and 1 never go back" \
        sh -c "! grep -q 'went back' '$dir/r0.log' '$dir/r1.log' && ! grep -q 'warning:' '$tmp/relay_${name}_b.log'"
    check "$name: replica 2 says it went back nowhere (it moves forward)" sh -c "! grep -q 'went back' '$dir/r2.log'"
    for r in 0 1 2; do kill -9 "${id[$r]}" 2>/dev/null || true; wait "${id[$r]}" 2>/dev/null || true; done
}

scenario held 2 0
scenario training 1 1
finish test_diloco_refound
