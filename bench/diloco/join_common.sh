# bench/diloco/join_common.sh — sourced by the benches of joins (join_live.sh, catch_up.sh,
# join_in_flight.sh, join_scale.sh) once they have set `out`: train_gpt and python from the
# environment (TRAIN_GPT, default ./train_gpt; PYTHON, default /usr/bin/python3), `out` made
# afresh, pids (killed when the bench exits), free_port (a free loopback port), alive (the
# bench exits when a process of pids has died), closes_of DIR N (rounds DIR/relay.log closed
# with N contributors), bench_data SEED (OUT/train.bin, a synthetic shard of 60000 tokens, and
# OUT/secret) and start_replica R DIR ARGS... (replica R in the background, logging to
# DIR/rR.log, its out_dir DIR/rR; replica 0 is the donor and sends its state over a slow link:
# TRAIN_GPT_FAULT=tcp_slow_state, a 128 KiB chunk per 0.25 × diloco_timeout_s).
train_gpt=${TRAIN_GPT:-./train_gpt}
python=${PYTHON:-/usr/bin/python3}
rm -rf "$out"
mkdir -p "$out"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() {
    for p in "${pids[@]}"; do
        kill -0 "$p" 2>/dev/null || { echo "$(basename "$0" .sh): a process died" >&2; exit 1; }
    done
}
start_replica() {
    local r=$1 dir=$2 fault=""
    shift 2
    [ "$r" = 0 ] && fault=tcp_slow_state:0
    TRAIN_GPT_FAULT=$fault "$train_gpt" "$@" --diloco_replica_id "$r" --out_dir "$dir/r$r" >"$dir/r$r.log" 2>&1 &
    pids+=($!)
}
closes_of() { grep -c "closed: $2 contributor(s)" "$1/relay.log" 2>/dev/null || true; }
bench_data() {
    local tool=build/test_tool
    [ -x "$tool" ] || make -s "$tool"
    "$tool" shard "$out/train.bin" 64 0 60000 "$1" >/dev/null
    head -c 32 /dev/urandom >"$out/secret"
    chmod 600 "$out/secret"
}
