#!/bin/bash
# test/test_relay_peers.sh — the hub (`train_gpt relay`) against peers that hold the secret and
# misbehave (test/relay_peers.py plays them): whatever one replica claims or withholds, the
# relay stays up, says in one line what was wrong, and the honest replicas' rounds close.
#   residual_claim     a CONTRIBUTE claiming 2^38 values (a 1 TiB residual): that replica is
#                      refused, the relay does not exit (it did: "out of memory ...")
#   poisoned_round     a CONTRIBUTE refused for sizes that disagree with its encoding does not
#                      fix the round's size (the honest replica was evicted next)
#   poisoned_by_chunk  nor does a chunk of another size that comes before any CONTRIBUTE
#   window_bypass      a contributor that withholds segment 0 and sends 1 .. 63 is dropped once
#                      a window ahead (the hub kept every segment: the window counted the prefix)
#   window_reorder     while two streams in order, one far ahead of the other, are fine
#   nonreader          a receiver that reads none of the mean is dropped timeout_s later and
#                      the others' round closes (it stalled forever, without a line); it is told
#                      why (REFUSE 8 in its session)
#   handshake_flood    300 connections that never speak do not keep a replica out: a new one
#                      takes the place of the oldest in the handshake (it was refused until
#                      the silent ones timed out)
#   chunk_claim        a first chunk claiming a payload of 2^30 chunks: refused (the hub kept a
#                      pointer per chunk, 8 GiB, and touched them all when the replica left)
#   catchup_beyond     a catch-up donor sending means of rounds never closed: dropped (the hub
#                      kept them all, without bound)
#   state_claim        a state of 2^30 chunks: refused (a bit per chunk for each replica joining
#                      in flight, 128 MiB copied in the hub's loop; out of memory, the relay exited)
#   caughtup_far       a joiner saying CAUGHT_UP for round 2^40: dropped (at 2^62 round + 1 overflowed)
#   caughtup_silent    a joiner that caught up and never contributes: evicted as late, the round
#                      closes (it was held for ever), and that ends its transfer: a replica that
#                      waits afterwards gets a donor (the transfer stayed on for ever, the
#                      donor's means kept without bound, nobody else given a state)
#   resized_short      a chunk claiming a payload of 1 segment, then another replica's CONTRIBUTE of
#                      64: the first is evicted and the round closes (the hub read its array of
#                      segments past its end and crashed)
#   keep_claim         a CONTRIBUTE of block 2^23 keeping 2^22 values: refused (the hub exited on
#                      the codecs' internal check)
#   follow_held_silent (several hubs) a follower that caught up through its primary and never
#                      contributes: its first round waits timeout_s plus its state's time, not for ever
#   follow_catchup     (several hubs) a catch-up joiner that sends FOLLOW before CAUGHT_UP: its join
#                      ends, the donor's next round closes (it waited for it for ever)
#   follow_one_hub     FOLLOW to the only hub: dropped, as DONE and HOLD are
#   done_far           (several hubs) DONE for outer step 2^40: dropped (taken, every later round
#                      of the hub was refused as stale: the hub's group was blocked for good), and
#                      told why (REFUSE 9: it broke the protocol)
#   mean_from_donor    a donor's state chunk sent as DATA of kind 3 (a mean, the hub's to send):
#                      dropped (it was relayed as a mean, and the joiner's state never completed)
#   bad_quorum         (--replicas 2) AUTHs asking for min_replicas 0, 9 of 8, or 3: refused in
#                      one line (the group's joins waited for ever for a quorum it cannot reach)
#   unproven_flood     200 connections without the secret, each refused: 20 lines and one that
#                      counts the other 180 (a line each: 13.7 MB of log in an 8 s flood); the
#                      lines of a replica with the secret are all written
#   emfile             out of file descriptors (a limit of 40, 60 silent connections): one line,
#                      no busy loop (it spun silently), a replica gets in afterwards
source "$(dirname "$0")/lib.sh"
tmp_with_processes
make_secret "$tmp/secret"
PEERS="$(dirname "$0")/relay_peers.py"

# run_scenario NAME [PREFIX...]: a fresh relay (under PREFIX, e.g. prlimit; with the options in
# $relay_args too), the scenario against it; the relay must still be running afterwards. Leaves
# its log in $tmp/relay_NAME.log.
relay_args=()
run_scenario() {
    local name=$1 rc=0 relay
    shift
    local try
    for try in 1 2 3 4 5; do   # a port taken between free_port and the relay's bind: another
        port=$(free_port)
        "$@" "$TRAIN_GPT" relay --listen "127.0.0.1:$port" --secret_file "$tmp/secret" --timeout_s 3 \
            "${relay_args[@]}" >"$tmp/relay_$name.log" 2>&1 &
        relay=$!
        pids+=("$relay")
        while ! grep -q 'listening on' "$tmp/relay_$name.log" 2>/dev/null && kill -0 "$relay" 2>/dev/null; do
            sleep 0.05
        done
        grep -q 'listening on' "$tmp/relay_$name.log" && break
        [ "$try" -lt 5 ] || { cat "$tmp/relay_$name.log"; die "$name: the relay did not start"; }
    done
    RELAY_PID=$relay RELAY_LOG="$tmp/relay_$name.log" "$PYTHON" "$PEERS" "$name" "$port" "$tmp/secret" \
        >"$tmp/$name.out" 2>&1 || rc=$?
    check "$name: $(tail -n 1 "$tmp/$name.out")" [ "$rc" -eq 0 ]
    check "$name: the relay is still running" kill -0 "$relay"
    kill "$relay" 2>/dev/null || true
    wait "$relay" 2>/dev/null || true
    if [ "$rc" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then cat "$tmp/$name.out" "$tmp/relay_$name.log"; fi
}

# in_log NAME PATTERN: the relay's log of scenario NAME has a line matching PATTERN.
in_log() { grep -q -- "$2" "$tmp/relay_$1.log"; }

# The residual's allocation must fail whatever the machine's overcommit policy: 16 GiB of
# address space is far more than the relay needs (about 1 GiB with the CUDA libraries).
limit=()
command -v prlimit >/dev/null && limit=(prlimit --as=$((16 << 30)))
run_scenario residual_claim "${limit[@]}"
check "residual_claim: one line refuses replica 1" \
    in_log residual_claim "replica 1 .* dropped: the hub cannot hold the downlink's error feedback"

run_scenario poisoned_round
check "poisoned_round: replica 0 refused for its sizes" \
    in_log poisoned_round "replica 0 .* dropped: its CONTRIBUTE's sizes disagree with its encoding"
check "poisoned_round: replica 1 not evicted" sh -c "! grep -q 'replica 1 .* evicted' '$tmp/relay_poisoned_round.log'"

run_scenario poisoned_by_chunk
check "poisoned_by_chunk: replica 0 evicted for its chunk's size" \
    in_log poisoned_by_chunk "replica 0 .* evicted: its payload for step 0 is .* but the round's first CONTRIBUTE says"

run_scenario window_bypass
check "window_bypass: one line drops replica 0 at the window" \
    in_log window_bypass "replica 0 .* dropped: sent segment 16 of round 0 before segment 0"

run_scenario window_reorder
check "window_reorder: nobody dropped" sh -c "! grep -q 'dropped: sent segment' '$tmp/relay_window_reorder.log'"

run_scenario nonreader
check "nonreader: one line drops replica 1" \
    in_log nonreader "replica 1 .* dropped: its data streams took nothing of what the hub sends it for"

run_scenario chunk_claim
check "chunk_claim: one line refuses replica 0" in_log chunk_claim "replica 0 .* dropped: transfer of more than 4 Mi chunks"

run_scenario catchup_beyond
check "catchup_beyond: one line drops the donor" \
    in_log catchup_beyond "replica 0 .* dropped: sent the mean of round 1 for its catch-up transfer, but the last round closed is 0"

run_scenario state_claim
check "state_claim: one line refuses the donor" in_log state_claim "replica 0 .* dropped: transfer of more than 4 Mi chunks"

run_scenario caughtup_silent
check "caughtup_silent: the joiner evicted as late for round 1" \
    in_log caughtup_silent "replica 1 .* evicted: late for round 1: no contribution"
check "caughtup_silent: the eviction ended the transfer" \
    in_log caughtup_silent "state transfer from replica 0 aborted (no joiner left)"

run_scenario caughtup_far
check "caughtup_far: one line drops the joiner" \
    in_log caughtup_far "replica 1 .* dropped: said CAUGHT_UP for round 1099511627776, far past the last round closed (0)"

run_scenario resized_short
check "resized_short: replica 0 evicted for its chunk's size" \
    in_log resized_short "replica 0 .* evicted: its payload for step 0 is .* but the round's first CONTRIBUTE says"

run_scenario keep_claim
check "keep_claim: one line drops replica 0" in_log keep_claim "replica 0 .* dropped: .*the block is over 2^20 values"

run_scenario follow_held_silent
check "follow_held_silent: the follower evicted as late for round 0" \
    in_log follow_held_silent "replica 1 .* evicted: late for round 0 .*: no contribution"
run_scenario follow_catchup
check "follow_catchup: its FOLLOW ended its join and the transfer" \
    in_log follow_catchup "state transfer from replica 0 aborted (no joiner left)"

run_scenario follow_one_hub
check "follow_one_hub: one line drops replica 1" \
    in_log follow_one_hub "replica 1 .* dropped: sent FOLLOW, but its diloco_rendezvous lists one hub"

run_scenario done_far
check "done_far: one line drops replica 1" \
    in_log done_far "replica 1 .* dropped: said DONE for outer step 1099511627776, far past any step"

run_scenario mean_from_donor
check "mean_from_donor: one line drops the donor" in_log mean_from_donor "replica 0 .* dropped: sent DATA of kind 3"

relay_args=(--replicas 2)
run_scenario bad_quorum
relay_args=()
check "bad_quorum: one line for each refusal" \
    test "$(grep -c 'rejected 127.0.0.1:[0-9]*: .*min_replicas' "$tmp/relay_bad_quorum.log")" -eq 3

run_scenario handshake_flood
check "handshake_flood: the oldest are cut off with a line" in_log handshake_flood "cut off 127.0.0.1:.* the oldest of 128"

run_scenario unproven_flood
# The count is per minute: on a machine slow enough to take more than one, the sum over windows.
unproven_lines=$(grep -v 'more connections without the secret' "$tmp/relay_unproven_flood.log" |
    grep -c 'rejected 127.0.0.1:[0-9]*: bad magic')
unproven_counted=$(sed -n 's/.* \([0-9]*\) more connections without the secret were refused .*/\1/p' \
    "$tmp/relay_unproven_flood.log" | awk '{ n += $1 } END { print n + 0 }')
unproven_windows=$(grep -c 'more connections without the secret were refused' "$tmp/relay_unproven_flood.log")
check "unproven_flood: 20 lines a minute ($unproven_lines over $unproven_windows counted windows)" \
    test "$unproven_lines" -le $((20 * unproven_windows)) -a "$unproven_windows" -ge 1
check "unproven_flood: the lines and the counts add up to 200 ($unproven_lines + $unproven_counted)" \
    test $((unproven_lines + unproven_counted)) -eq 200
check "unproven_flood: the replica's lines are written" in_log unproven_flood "replica 0 connected from"

if command -v prlimit >/dev/null; then
    run_scenario emfile prlimit --nofile=40:40
    check "emfile: the start-up names the low limit" in_log emfile "open files: the limit is 40"
    check "emfile: one warning line, not one per connection" \
        test "$(grep -c 'out of file descriptors' "$tmp/relay_emfile.log")" -le 2
else
    say "  skip emfile (no prlimit)"
fi

finish test_relay_peers
