# bench/diloco/hubs_common.sh — sourced by hub_throughput.sh and hubs_rss.sh: K relays and M
# synthetic replicas (build/hub_bench) on loopback. The caller sets train_gpt, build, m, values
# and rounds; this sets tmp (removed at exit, with any relay still running), its secret, and
# free_port.
python=/usr/bin/python3
tmp=$(mktemp -d)
relays=()
trap 'for p in "${relays[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_relays K: K relays (one thread each), logging to $tmp/relay_K_H.log, each listening
# before it returns; their pids in relays, the rendezvous list in rdv.
start_relays() {
    local k=$1 h port
    rdv=""
    relays=()
    for ((h = 0; h < k; h++)); do
        port=$(free_port)
        OMP_NUM_THREADS=1 "$train_gpt" relay --listen "127.0.0.1:$port" --secret_file "$tmp/secret" --timeout_s 120 \
            >"$tmp/relay_${k}_$h.log" 2>&1 &
        relays+=($!)
        rdv+="${rdv:+,}127.0.0.1:$port"
        until grep -q "listening on" "$tmp/relay_${k}_$h.log" 2>/dev/null; do sleep 0.05; done
    done
}

# run_replicas K: the M replicas through rdv, ROUNDS exchanges of VALUES values each, logging to
# $tmp/rep_K_R.log; exits the script if one fails.
run_replicas() {
    local k=$1 r p pids=()
    for ((r = 0; r < m; r++)); do
        OMP_NUM_THREADS=1 "$build/hub_bench" --rendezvous "$rdv" --replica_id "$r" --replicas "$m" \
            --secret_file "$tmp/secret" --values "$values" --rounds "$rounds" --timeout_s 120 \
            >"$tmp/rep_${k}_$r.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "a replica failed:"; cat "$tmp/rep_${k}_"*.log; exit 1; }; done
}
