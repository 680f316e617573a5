#!/bin/bash
# bench/diloco/streaming.sh — compute utilization of DiLoCo replicas on a shaped 100 Mbit/s
# link, classic against streaming (bench/diloco/README.md#streaming). As root: it creates
# network namespaces and tc qdiscs. `make bench-streaming` runs it.
#
# Topology (bench/diloco/shaped_link.sh, as goodput.sh): two namespaces joined by a veth
# pair, each end shaped by tbf to RATE_MBIT, so each direction is a 100 Mbit/s bottleneck.
#   A (the hub's side): `train_gpt relay`, replica 0, and delay_proxy in front of the relay
#   B (the far side):   replica 1; everything it sends and receives crosses the shaped link
#                       and waits DELAY_MS each way in the proxy
# Both replicas train bench/diloco/stream.conf (one thread each: one core per replica) on
# an order-2 Markov language; each round ends when replica 1's upload is in, and replica 1
# then downloads replica 0's outer gradient, so both replicas feel the link.
#
# For each setting in SETTINGS ("QUANT:P:TAU" ...) it runs STEPS steps and reports, from
# replica 1's metrics.jsonl: compute utilization = Σ step_ms ÷ (Σ step_ms + Σ stall_ms) over
# every step but the last (whose stall is the final blocking sync of every fragment, a cost
# per run, not per step), the mean exchange time of a round (sync_s), and the validation
# loss after the last step (the same tokens for every setting).
#
# Environment: BUILD (test_tool, delay_proxy), TRAIN_GPT (default ./train_gpt), STEPS (240),
# H (12), RATE_MBIT (100), DELAY_MS (25),
# SETTINGS ("int8:1:0 int8:1:6 int8:4:2 int4:1:0 int4:1:6 int4:4:2").
set -euo pipefail
: "${BUILD:?set BUILD to the build directory}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=shaped_link.sh
. "$ROOT/bench/diloco/shaped_link.sh"
TRAIN_GPT=${TRAIN_GPT:-$ROOT/train_gpt}
STEPS=${STEPS:-240}
H=${H:-12}
RATE_MBIT=${RATE_MBIT:-100}
DELAY_MS=${DELAY_MS:-25}
SETTINGS=${SETTINGS:-"int8:1:0 int8:1:6 int8:4:2 int4:1:0 int4:1:6 int4:4:2"}
PYTHON=${PYTHON:-/usr/bin/python3}
[ "$(id -u)" -eq 0 ] || { echo "streaming.sh: must run as root (network namespaces, tc)" >&2; exit 1; }
for tool in ip tc; do command -v $tool >/dev/null || { echo "streaming.sh: needs '$tool' (iproute2)" >&2; exit 1; }; done
for f in "$TRAIN_GPT" "$BUILD/test_tool" "$BUILD/delay_proxy"; do
    [ -x "$f" ] || { echo "streaming.sh: $f is missing (make && make bench-diloco-tools)" >&2; exit 1; }
done

NS_A=tgs_a_$$ NS_B=tgs_b_$$
IP_A=10.77.0.1 IP_B=10.77.0.2
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    if [ -n "${KEEP_TMP:-}" ]; then echo "# kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT INT TERM
shaped_link_create "$NS_A" "$NS_B" $IP_A $IP_B "$RATE_MBIT"

"$BUILD/test_tool" markov "$tmp/train.bin" 512 0 2000000 7 1 >/dev/null
"$BUILD/test_tool" markov "$tmp/val.bin" 512 0 40000 7 2 >/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"

echo "# streaming DiLoCo on a shaped link: $(date -u +%F), $(nproc) cores, $(uname -r)"
echo "# link: tbf $RATE_MBIT Mbit/s each direction, $DELAY_MS ms each way (delay_proxy); model bench/diloco/stream.conf, H = $H, $STEPS steps, 2 replicas"
printf '%-8s %2s %3s | %8s %8s %8s | %7s %7s | %s\n' quant P tau step_ms stall_s sync_s util val_loss "exchange ÷ H steps (classic)"
port=7300
for setting in $SETTINGS; do
    IFS=: read -r quant P tau <<<"$setting"
    run="$tmp/$quant-P$P-t$tau"
    mkdir -p "$run"
    ip netns exec "$NS_A" "$TRAIN_GPT" relay --listen "$IP_A:$port" --secret_file "$tmp/secret" --timeout_s 60 \
        >"$run/relay.log" 2>&1 &
    pids+=($!)
    relay=$!
    wait_port "$NS_A" $IP_A $port
    ip netns exec "$NS_A" "$BUILD/delay_proxy" --listen "$IP_A:$((port + 1))" --target "$IP_A:$port" \
        --delay_ms "$DELAY_MS" --quiet >"$run/proxy.log" 2>&1 &
    pids+=($!)
    proxy=$!
    wait_port "$NS_B" $IP_A $((port + 1))
    args=("$ROOT/bench/diloco/stream.conf" --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --max_steps "$STEPS"
        --resume never --ckpt_every 0 --diloco_replicas 2 --diloco_min_replicas 2 --diloco_inner_steps "$H"
        --diloco_quant "$quant" --diloco_error_feedback 1 --diloco_fragments "$P" --diloco_overlap_steps "$tau"
        --diloco_transport tcp --diloco_secret_file "$tmp/secret" --diloco_timeout_s 60)
    ip netns exec "$NS_A" "$TRAIN_GPT" "${args[@]}" --diloco_rendezvous "$IP_A:$port" --diloco_replica_id 0 \
        --out_dir "$run/0" >"$run/0.log" 2>&1 &
    r0=$!
    rc=0
    ip netns exec "$NS_B" "$TRAIN_GPT" "${args[@]}" --diloco_rendezvous "$IP_A:$((port + 1))" --diloco_replica_id 1 \
        --out_dir "$run/1" >"$run/1.log" 2>&1 || rc=$?
    wait $r0 || rc=$?
    kill $relay $proxy 2>/dev/null || true
    wait $relay $proxy 2>/dev/null || true
    if [ $rc != 0 ]; then
        echo "!! $setting failed (exit $rc):"
        tail -5 "$run/1.log" "$run/0.log"
        port=$((port + 2))
        continue
    fi
    "$PYTHON" - "$run/1/metrics.jsonl" "$quant" "$P" "$tau" "$H" <<'PY'
import json, sys
path, quant, P, tau, H = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lines = [json.loads(l) for l in open(path)]
steps = [d for d in lines if "loss" in d and "step_ms" in d]
outer = [d for d in lines if "contributors" in d and d.get("applied")]
vals = [d for d in lines if "val_loss" in d]
body = steps[1:-1]   # the first step pays warm-up costs; the last one the final blocking sync
step_ms = sum(d["step_ms"] for d in body) / len(body)
stall = sum(d["stall_ms"] for d in body) / 1e3
compute = sum(d["step_ms"] for d in body) / 1e3
regular = [d for d in outer if d["step"] < steps[-1]["step"]]
sync = sum(d["sync_s"] for d in regular) / max(len(regular), 1)
ratio = sync * P / (H * step_ms / 1e3)
print(f"{quant:<8} {P:2d} {tau:3d} | {step_ms:8.1f} {stall:8.2f} {sync:8.3f} | {100 * compute / (compute + stall):6.1f}% "
      f"{vals[-1]['val_loss']:7.4f} | {100 * ratio:.0f} %")
PY
    port=$((port + 2))
done
for end in "$NS_A veth_a A->B" "$NS_B veth_b B->A"; do
    set -- $end
    echo "# tbf $3: $(ip netns exec "$1" tc -s qdisc show dev "$2" | sed -n 's/^ *Sent/Sent/p' | head -1)"
done
