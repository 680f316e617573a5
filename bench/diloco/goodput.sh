#!/bin/bash
# bench/diloco/goodput.sh — the tcp transport's goodput on a shaped link (bench/diloco/README.md).
# `make bench-diloco` runs it; as root, because it creates network namespaces.
#
# Two network namespaces joined by a veth pair, each end shaped by tbf to RATE_MBIT
# (100 Mbit/s), so each direction of the link is a 100 Mbit/s bottleneck:
#   A (the hub's side): the relay, replica 0, the delay proxy, the raw-TCP sink
#   B (the far side):   replica 1, whose upload and download both cross the shaped link
# The kernel has no netem, so the ~25 ms one-way delay of a WAN is added in user space, in
# one of two ways (each case says which):
#   proxy   bench/diloco/delay_proxy.c in A, in front of the hub; replica 1 connects to it.
#           Every byte waits DELAY_MS each way, but TCP ends at the proxy: each TCP
#           connection runs over a short-RTT hop (it does not need a WAN's window).
#   packet  bench/diloco/delay_tun.c in A and in B: IP packets between the two namespaces
#           go through a TUN device and wait DELAY_MS before leaving on the veth, so TCP
#           itself sees the 2 x DELAY_MS round trip, as on a WAN.
#
# Measures, with PAYLOAD_MB per transfer or exchange:
#   1. the raw link (baseline), for each delay: RTT, and plain-TCP upload, download, and
#      both at once;
#   2. the transport, 2 replicas, EXCHANGES timed exchanges each, for each delay and
#      streams in STREAMS_LIST.
# Goodput = payload bytes / wall time (goodput_client.c says exactly what is counted). For
# the transport, the headline is the group's round: from the first replica's call to the
# last replica's return (one monotonic clock: both replicas run on this machine). The
# replicas start each timed exchange together through a file barrier (--barrier_dir).
#
# Environment: BUILD (goodput_client, delay_proxy, delay_tun); optional PAYLOAD_MB (100), EXCHANGES (3), DELAY_MS (25), STREAMS_LIST ("1 4"),
# DELAYS ("none proxy packet"), RATE_MBIT (100), RELAY_CMD (default "$BUILD/goodput_client relay"),
# BASELINE_ONLY=1 (the raw link only).
set -euo pipefail
: "${BUILD:?set BUILD to the build directory}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=shaped_link.sh
. "$ROOT/bench/diloco/shaped_link.sh"
PAYLOAD_MB=${PAYLOAD_MB:-100}
EXCHANGES=${EXCHANGES:-3}
DELAY_MS=${DELAY_MS:-25}
STREAMS_LIST=${STREAMS_LIST:-"1 4"}
DELAYS=${DELAYS:-"none proxy packet"}
RATE_MBIT=${RATE_MBIT:-100}
CLIENT="$BUILD/goodput_client"
# The hub: net/relay.c's relay_main, which `train_gpt relay` also runs; goodput_client links it.
RELAY_CMD=${RELAY_CMD:-"$CLIENT relay"}
PROXY="$BUILD/delay_proxy"
TUN="$BUILD/delay_tun"

[ "$(id -u)" -eq 0 ] || { echo "goodput.sh: must run as root (it creates network namespaces and tc qdiscs)" >&2; exit 1; }
for tool in ip tc timeout awk; do
    command -v $tool >/dev/null || { echo "goodput.sh: '$tool' not found (apt-get install iproute2)" >&2; exit 1; }
done
for bin in "$CLIENT" "$PROXY" "$TUN"; do
    [ -x "$bin" ] || { echo "goodput.sh: $bin not built (make bench-diloco-tools)" >&2; exit 1; }
done

# ---------------------------------------------------------------- the shaped link
NS_A=gp_hub_$$
NS_B=gp_far_$$
IP_A=10.77.0.1
IP_B=10.77.0.2
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
in_a() { ip netns exec "$NS_A" "$@"; }
in_b() { ip netns exec "$NS_B" "$@"; }
start_bg() {   # start_bg LOG NS CMD...: runs CMD in namespace NS in the background, remembers its pid
    local log=$1 ns=$2
    shift 2
    ip netns exec "$ns" "$@" >"$log" 2>&1 &   # ip execs CMD: $! is CMD's own pid
    pids+=($!)
}
shaped_link_create "$NS_A" "$NS_B" $IP_A $IP_B "$RATE_MBIT"

# Socket buffer limits, per namespace (these keys are per-netns in the kernels we run on):
# TCP's autotuning may grow a connection's buffers to 32 MB, far above the 625 KB one needs
# at 100 Mbit/s x 50 ms RTT. net.core.rmem_max / wmem_max (the cap on an explicit
# SO_RCVBUF / SO_SNDBUF) cannot be raised above the host's value inside a namespace; they
# are printed below and must stay above 625 KB too. rp_filter off: with the packet delay,
# replies arrive on veth while the route back to their source is the TUN device.
for ns in "$NS_A" "$NS_B"; do
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_rmem="4096 131072 33554432" net.ipv4.tcp_wmem="4096 16384 33554432" \
        net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 >/dev/null ||
        echo "# note: could not set tcp_rmem / tcp_wmem / rp_filter in $ns; using the defaults"
done

# The packet delay: one delay_tun per namespace, idle until packet_delay on routes the
# peer's address into it.
MAC_A=$(ip -n "$NS_A" -br link show veth_a | awk '{print $3}')
MAC_B=$(ip -n "$NS_B" -br link show veth_b | awk '{print $3}')
start_bg "$tmp/tun_a.log" "$NS_A" "$TUN" --tun dly --out veth_a --peer_mac "$MAC_B" --delay_ms "$DELAY_MS"
start_bg "$tmp/tun_b.log" "$NS_B" "$TUN" --tun dly --out veth_b --peer_mac "$MAC_A" --delay_ms "$DELAY_MS"
tun_pids=("${pids[@]: -2}")
for _ in $(seq 100); do
    ip -n "$NS_A" link show dly >/dev/null 2>&1 && ip -n "$NS_B" link show dly >/dev/null 2>&1 && break
    sleep 0.05
done
packet_delay() {   # packet_delay on|off
    local verb=del
    [ "$1" = on ] && verb=add
    ip -n "$NS_A" route $verb $IP_B/32 dev dly
    ip -n "$NS_B" route $verb $IP_A/32 dev dly
}

steal_ticks() { awk '/^cpu /{print $9}' /proc/stat; }
steal0=$(steal_ticks) run0=$(date +%s.%N)
rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$ROOT" status --porcelain -- net/transport_tcp.c net/relay.c net/wire.c net/socket.c net/conn.c 2>/dev/null | grep -q . && echo + || true)
echo "# bench/diloco/goodput.sh — $(date -u +%Y-%m-%dT%H:%MZ), train_gpt $rev$dirty"
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); kernel $(uname -r)"
echo "# link: veth $NS_A <-> $NS_B, tbf on both ends: $LINK_TBF"
echo "# delay: $DELAY_MS ms one way each direction, added by delay_proxy (proxy) or delay_tun (packet): no netem here"
echo "# tcp: congestion control $(in_a sysctl -n net.ipv4.tcp_congestion_control);" \
    "tcp_rmem $(in_a sysctl -n net.ipv4.tcp_rmem | tr '\t' ' '); tcp_wmem $(in_a sysctl -n net.ipv4.tcp_wmem | tr '\t' ' ');" \
    "rmem_max $(in_a sysctl -n net.core.rmem_max); wmem_max $(in_a sysctl -n net.core.wmem_max);" \
    "slow_start_after_idle $(in_a sysctl -n net.ipv4.tcp_slow_start_after_idle)"
echo "# payload: $PAYLOAD_MB MB (10^6 bytes) per transfer / exchange; goodput = payload bytes / wall time," \
    "no framing or headers counted"
echo

# ---------------------------------------------------------------- 1. the raw link
start_bg "$tmp/sink.log" "$NS_A" "$CLIENT" sink --listen $IP_A:7100
start_bg "$tmp/proxy_raw.log" "$NS_A" "$PROXY" --listen $IP_A:7101 --target $IP_A:7100 --delay_ms "$DELAY_MS" --quiet
wait_port "$NS_B" $IP_A 7100
wait_port "$NS_B" $IP_A 7101
raw=(--payload_mb "$PAYLOAD_MB" --link_mbit "$RATE_MBIT")
for delay in $DELAYS; do
    case $delay in
        none) addr=$IP_A:7100 label="baseline none" ;;
        proxy) addr=$IP_A:7101 label="baseline proxy${DELAY_MS}ms" ;;
        packet) addr=$IP_A:7100 label="baseline packet${DELAY_MS}ms"; packet_delay on ;;
        *) echo "goodput.sh: DELAYS: unknown '$delay' (none, proxy, packet)" >&2; exit 1 ;;
    esac
    echo "== $label: plain TCP between replica 1's side (B) and the hub's side (A)"
    {
        in_b timeout 60 "$CLIENT" ping --connect "$addr" --count 20 --label "$label"
        in_b timeout 60 "$CLIENT" upload --connect "$addr" "${raw[@]}" --label "$label"
        in_b timeout 60 "$CLIENT" download --connect "$addr" "${raw[@]}" --label "$label"
        # Both directions at once, as in an exchange, where a replica uploads and downloads together.
        in_b timeout 60 "$CLIENT" upload --connect "$addr" "${raw[@]}" --label "$label duplex" &
        up=$!
        in_b timeout 60 "$CLIENT" download --connect "$addr" "${raw[@]}" --label "$label duplex"
        wait $up
    } | tee -a "$tmp/results.log"
    [ "$delay" = packet ] && packet_delay off
    echo
done

# ---------------------------------------------------------------- 2. the transport
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"
port=7200
# The group's round per exchange, from both replicas' TIMING lines: first call to last return.
group_rounds() {   # group_rounds NAME LOG...
    local name=$1
    shift
    grep -h '^TIMING ' "$@" | awk -F'|' -v name="$name" -v link="$RATE_MBIT" '
        { k = $3; if (!(k in t0) || $4 < t0[k]) t0[k] = $4; if ($5 > t1[k]) t1[k] = $5; if ($6 > moved[k]) moved[k] = $6 }
        END {
            n = 0; s = 0; b = 0; line = ""
            for (k = 0; k in t0; k++) {
                dt = t1[k] - t0[k]; g = moved[k] * 8 / dt / 1e6; s += dt; b += moved[k]; n++
                line = line sprintf("%s%.2f", n > 1 ? ", " : "", g)
            }
            if (n == 0) { printf "transport, %s: no result\n", name; exit }
            g = b * 8 / s / 1e6
            printf "transport, %s: group round %.2f Mbit/s = %.1f %% (per exchange: %s)\n", name, g, 100 * g / link, line
        }'
}
run_case() {   # run_case none|proxy|packet STREAMS
    local delay=$1 streams=$2 hub=$IP_A:$port far=$IP_A:$port
    local name="delay $1${DELAY_MS}ms, streams $2"
    [ "$delay" = none ] && name="delay none, streams $2"
    start_bg "$tmp/relay_$port.log" "$NS_A" $RELAY_CMD --listen "$hub" --secret_file "$tmp/secret" --timeout_s 60
    local relay_pid=${pids[-1]} proxy_pid=
    wait_port "$NS_A" $IP_A $port
    if [ "$delay" = proxy ]; then
        far=$IP_A:$((port + 1))
        start_bg "$tmp/proxy_$port.log" "$NS_A" "$PROXY" --listen "$far" --target "$hub" --delay_ms "$DELAY_MS"
        proxy_pid=${pids[-1]}
        wait_port "$NS_B" $IP_A $((port + 1))
    fi
    [ "$delay" = packet ] && packet_delay on
    echo "== transport: $name (replica 0 in A -> $hub; replica 1 in B -> $far)"
    mkdir -p "$tmp/barrier_$port"
    local common=(--replicas 2 --streams "$streams" --secret_file "$tmp/secret" --timeout_s 60 --barrier_dir "$tmp/barrier_$port"
        --payload_mb "$PAYLOAD_MB" --exchanges "$EXCHANGES" --link_mbit "$RATE_MBIT" --label "[$name]")
    ip netns exec "$NS_A" timeout 150 "$CLIENT" transport --rendezvous "$hub" --replica_id 0 "${common[@]}" \
        >"$tmp/r0_$port.log" 2>&1 &
    local r0=$! rc=0
    pids+=($r0)
    in_b timeout 150 "$CLIENT" transport --rendezvous "$far" --replica_id 1 "${common[@]}" >"$tmp/r1_$port.log" 2>&1 || rc=$?
    wait $r0 || rc=$?
    cat "$tmp/r1_$port.log" "$tmp/r0_$port.log"
    group_rounds "$name" "$tmp/r0_$port.log" "$tmp/r1_$port.log" | tee -a "$tmp/results.log"
    grep -h ' summary: ' "$tmp/r1_$port.log" >>"$tmp/results.log" || true
    kill $relay_pid $proxy_pid 2>/dev/null || true
    wait $relay_pid $proxy_pid 2>/dev/null || true
    [ -n "$proxy_pid" ] && sed 's/^/  proxy: /' "$tmp/proxy_$port.log" | grep -v ' open$' || true
    if [ $rc != 0 ]; then
        echo "!! case failed (exit $rc); the relay's log:"
        sed 's/^/  relay: /' "$tmp/relay_$port.log" | tail -20
    fi
    [ "$delay" = packet ] && packet_delay off
    port=$((port + 2))
    echo
}
if [ "${BASELINE_ONLY:-0}" != 1 ]; then
    for delay in $DELAYS; do
        for streams in $STREAMS_LIST; do run_case "$delay" "$streams"; done
    done
fi

# ---------------------------------------------------------------- summary
# tbf's counters over the whole run: drops here would mean the limit is too small.
for end in "$NS_A veth_a A->B" "$NS_B veth_b B->A"; do
    set -- $end
    echo "# tbf $3: $(ip netns exec "$1" tc -s qdisc show dev "$2" | sed -n 's/^ *Sent/Sent/p' | head -1)"
done
echo "# cpu steal (time the hypervisor took the vCPUs away) over the run:" \
    "$(echo "($(steal_ticks) - $steal0) / $(getconf CLK_TCK) / ($(date +%s.%N) - $run0) * 100" | bc -l | xargs printf '%.0f') % of one core"
kill "${tun_pids[@]}" 2>/dev/null || true
wait "${tun_pids[@]}" 2>/dev/null || true
grep -h 'packets delayed' "$tmp/tun_a.log" "$tmp/tun_b.log" | sed 's/^/# /' || true
echo "== summary: goodput = payload Mbit/s, and % of the ${RATE_MBIT} Mbit/s link"
echo "   (transport: group round = first call to last return; replica 1 = the far replica's own calls)"
sed -E -e 's/^(baseline [^ ]+( duplex)?) raw TCP ([a-z]+), ([0-9]+) stream\(s\):.*goodput ([0-9.]+) Mbit\/s = ([0-9.]+) %.*/\1 raw TCP \3: \5 Mbit\/s = \6 %/' \
    -e 's/^\[([^]]*)\] replica 1 summary: .*goodput overall ([0-9.]+) Mbit\/s = ([0-9.]+) %[^(]*\((.*)\); payloads (.*)/transport, \1: replica 1 calls \2 Mbit\/s = \3 % (\4; \5)/' \
    "$tmp/results.log"
