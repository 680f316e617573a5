# bench/diloco/shaped_link.sh — the link the DiLoCo benchmarks measure on, sourced by
# goodput.sh and streaming.sh (as root): two network namespaces joined by a veth pair
# (veth_a in A, veth_b in B), each end shaped by tbf, so each direction is a bottleneck.

# wait_port NS HOST PORT: until something listens there (5 s).
wait_port() {
    for _ in $(seq 100); do
        ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "$(basename "$0"): nothing listens on $2:$3 in $1" >&2
    return 1
}

# shaped_link_create NS_A NS_B IP_A IP_B RATE_MBIT: the namespaces, the veth pair with the
# two addresses (/24), and tbf at RATE_MBIT on both ends; LINK_TBF holds the tbf settings.
shaped_link_create() {
    local ns_a=$1 ns_b=$2 ip_a=$3 ip_b=$4 rate=$5
    ip netns add "$ns_a"
    ip netns add "$ns_b"
    ip link add veth_a netns "$ns_a" type veth peer name veth_b netns "$ns_b"
    ip -n "$ns_a" addr add "$ip_a/24" dev veth_a
    ip -n "$ns_b" addr add "$ip_b/24" dev veth_b
    for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
    ip -n "$ns_a" link set veth_a up
    ip -n "$ns_b" link set veth_b up
    # tbf on the egress of both ends: A->B and B->A are each a RATE_MBIT bottleneck.
    #   burst 1 MB: tbf refills its bucket from a timer; on a VM whose vCPUs are descheduled
    #     now and then (steal time: 25-30 % of a core on the machine the results come from),
    #     the timer fires late, and a small bucket throws away the tokens of the stalled time,
    #     so each stall is link capacity lost. With 64 KB, duplex plain TCP measured anywhere
    #     from 45 % to 95 % of the rate depending on the steal at the time; with 1 MB (80 ms
    #     at 100 Mbit/s) tbf catches up and the same runs measured 85-96 %. The price: over an
    #     interval of T seconds up to 1 MB more than rate x T may pass, so a 100 MB transfer
    #     (8 s) can read at most 1 % high.
    #   limit 2 MB: the queue tbf keeps before it drops. Too small a limit drops packets in
    #     bursts and under-measures the link; it must exceed the bandwidth-delay product of a
    #     connection crossing it (100 Mbit/s x 50 ms RTT = 625 KB) with room for several
    #     parallel streams. 2 MB is 160 ms of queue at 100 Mbit/s.
    LINK_TBF="rate ${rate}mbit burst 1mb limit 2mb"
    # shellcheck disable=SC2086
    ip netns exec "$ns_a" tc qdisc add dev veth_a root tbf $LINK_TBF
    # shellcheck disable=SC2086
    ip netns exec "$ns_b" tc qdisc add dev veth_b root tbf $LINK_TBF
}
