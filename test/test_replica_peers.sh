#!/bin/bash
# test/test_replica_peers.sh — a real replica (the tcp transport, diloco.c) against a hand-made
# hub (test/fake_hub.py) that does at an awkward moment what a relay may do, or sends what a
# broken one might: the replica goes on as the protocol says, or drops the session with a line
# and connects again; it never exits on it.
#   abort_after_mean    a catch-up transfer aborted (the donor left) after one of its means was
#                       applied, then a new donor's state with no means: the joiner trains on (it
#                       exited: "applied 1 catch-up mean(s) but the hub ended its catch-up after 0")
#   abort_in_caught_up  (several hubs) STATE_ABORT while the replica waits for the answer to its
#                       CAUGHT_UP: it joins again on the same session (it cut the session and
#                       took the live hub for gone, its shares moved to the other)
#   huge_mean           a catch-up mean announced at 64 GiB: the session is dropped with a line and
#                       the replica connects again (it allocated 64 GiB and exited)
#   squatter            the hub dies mid-join and something without the secret on its port answers
#                       each AUTH with a refusal (secret, fingerprint, id, hub order) or a WELCOME
#                       without our secret's proof: the replica takes each for a lost hub and joins
#                       the hub once it is back (it exited on the first: anyone could end a run)
#   squatter_forever    the same refusal at every try: the replica exits once it has lasted
#                       diloco_connect_timeout_s (3 s here), saying so in one line: status 1, or 75
#                       when the join's own deadline (the same length) comes first
source "$(dirname "$0")/lib.sh"
require_tcp
tmp_with_processes
diloco_test_files
HUB="$(dirname "$0")/fake_hub.py"
N_PARAMS=78208   # test/configs/tiny_test.conf's parameters (a donor's state is 8 bytes each)

# scenario NAME [second hub: relay] : the fake hub on a free port, one replica (id 1 of 2) whose
# diloco_rendezvous lists it (and a real relay as the second hub with `relay`), with the
# arguments in $extra too. The hub's verdict is the check, and that the replica is still running
# (with $expect_exit, a regular expression, that it exited with such a status); it is then stopped. Leaves $tmp/NAME.hub
# and $tmp/NAME.log.
extra=()
expect_exit=
scenario() {
    local name=$1 port rendezvous rc=0 hub relay="" replica
    port=$(free_port)
    PYTHONPATH="$(dirname "$0")" REPLICA_LOG="$tmp/$name.log" "$PYTHON" "$HUB" "$name" "$port" "$tmp/secret" "$N_PARAMS" >"$tmp/$name.hub" 2>&1 &
    hub=$!
    pids+=("$hub")
    wait_until "$name: the fake hub listens" grep -qs 'hub: listening' "$tmp/$name.hub" || die "$name: no fake hub"
    rendezvous=127.0.0.1:$port
    if [ "${2:-}" = relay ]; then
        start_relay "$name" 1 10   # lib.sh's (another port if this one is taken meanwhile): sets port
        relay=${pids[-1]}
        rendezvous=$rendezvous,127.0.0.1:$port
    fi
    "$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0 \
        --threads 1 --ckpt_every 0 --max_steps 1000 --diloco_replicas 2 --diloco_replica_id 1 \
        --diloco_inner_steps 5 --diloco_outer_momentum 0 --diloco_quant none --diloco_rendezvous "$rendezvous" \
        --diloco_secret_file "$tmp/secret" --diloco_timeout_s 10 --out_dir "$tmp/$name" "${extra[@]}" \
        >"$tmp/$name.log" 2>&1 &
    replica=$!
    pids+=("$replica")
    wait "$hub" || rc=$?
    check "$name: $(tail -n 1 "$tmp/$name.hub")" [ "$rc" -eq 0 ]
    if [ -n "$expect_exit" ]; then
        local replica_rc=0
        wait "$replica" || replica_rc=$?
        check "$name: the replica exited with status $expect_exit (rc $replica_rc)" grep -Eqx "$expect_exit" <<<"$replica_rc"
    else
        check "$name: the replica did not exit on it" kill -0 "$replica"
    fi
    kill "$replica" $relay 2>/dev/null || true
    wait "$replica" $relay 2>/dev/null || true
    if [ "$rc" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then cat "$tmp/$name.hub"; grep -v '^step\|^outer' "$tmp/$name.log"; fi
}

scenario abort_after_mean
check "abort_after_mean: it took the second state (outer step 10) and no error" sh -c "
    grep -q 'took the group.s state: outer step 10' '$tmp/abort_after_mean.log' &&
    ! grep -q 'error:' '$tmp/abort_after_mean.log'"

scenario abort_in_caught_up relay
check "abort_in_caught_up: the primary hub was not taken for gone" \
    sh -c "! grep -q 'is gone (while catching up)' '$tmp/abort_in_caught_up.log'"

scenario huge_mean
check "huge_mean: one line says why the session was dropped" \
    grep -q "lost the hub at .*: a catch-up mean larger than this replica's whole state" "$tmp/huge_mean.log"

scenario squatter
check "squatter: one warning says the refusal was taken for a lost hub, and no error" sh -c "
    [ \$(grep -c 'taken for a lost hub until it lasts diloco_connect_timeout_s' '$tmp/squatter.log') -eq 1 ] &&
    ! grep -q 'error:' '$tmp/squatter.log'"

extra=(--diloco_connect_timeout_s 3)
expect_exit='1|75'
scenario squatter_forever
check "squatter_forever: one error line, naming the refusal of our secret" \
    sh -c "[ \$(grep -c 'error:' '$tmp/squatter_forever.log') -eq 1 ] &&
           grep -q 'error: .*the hub at .* refused our secret' '$tmp/squatter_forever.log'"
extra=()
expect_exit=

finish test_replica_peers
