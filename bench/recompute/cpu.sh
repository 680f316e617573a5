#!/usr/bin/env bash
# Activation recomputation on the CPU backend (issue #18, docs/config.md#memory): step time and
# activation memory of recompute = none / selective / full (and full on every 2nd layer) on
# configs/gpt-124m.conf's model at seq 1024.
#
#   bash bench/recompute/cpu.sh [OUT_FILE] [ROUNDS] [STEPS] [BATCH]
#
# Each run trains STEPS steps (default 6) of one micro-batch of BATCH (default 1) × 1024
# tokens on a synthetic shard, 2 threads; steps 2..STEPS are timed (the first has the page
# faults of first touch). The modes run interleaved, ROUNDS times (default 3), so that load
# from other processes on a shared machine spreads over all of them. Reported per mode, over
# all timed steps of all rounds: the median and the fastest step (the least disturbed by other
# load: on a busy machine the better estimate of the mode's own cost), the overhead of each
# against none's, the activation memory the backend's allocator counts (end event:
# activation_peak_mb; equal to cpu_model_plan_bytes, test/test_recompute.c) and the peak RSS.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/$(date +%F)-recompute-cpu-$(hostname -s).txt}
rounds=${2:-3}
steps=${3:-6}
batch=${4:-1}
BUILD=${BUILD:-build}
make -s train_gpt "$BUILD/test_tool" >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$BUILD/test_tool" shard "$tmp/train.bin" 50257 50256 2000000 7 >/dev/null
modes=("none" "selective" "full" "full_every2")
args_of() {
    case $1 in
    full_every2) echo "--recompute full --recompute_layers 2" ;;
    *) echo "--recompute $1" ;;
    esac
}
for r in $(seq 1 "$rounds"); do
    for mode in "${modes[@]}"; do
        # shellcheck disable=SC2046
        ./train_gpt configs/gpt-124m.conf --train_data "$tmp/train.bin" --val_data "" --batch_size "$batch" \
            --grad_accum 1 --max_steps "$steps" --warmup_steps 1 --threads 2 --log_every 1000 --ckpt_every 0 \
            --ckpt_keep 1 --out_dir "$tmp/$mode-$r" $(args_of "$mode") >"$tmp/$mode-$r.log" 2>&1
        grep -h 'cpu memory' "$tmp/$mode-$r.log" >"$tmp/$mode.banner"
        rm -rf "$tmp/$mode-$r"/step_*  # 1.4 GB of checkpoint each
    done
done
{
    echo "# bench/recompute/cpu.sh on $(hostname -s), $(date -u +%FT%TZ), $(nproc) cores" \
        "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), commit $(git rev-parse --short HEAD)"
    echo "# configs/gpt-124m.conf at seq 1024, batch $batch, grad_accum 1, 2 threads; $rounds interleaved rounds of" \
        "$steps steps per mode, steps 2..$steps timed; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    for mode in "${modes[@]}"; do echo "# $mode: $(sed 's/^train_gpt | //' "$tmp/$mode.banner")"; done
    python3 - "$tmp" "$rounds" "${modes[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def run(mode, r):
    steps, end = [], {}
    for line in open("%s/%s-%d/metrics.jsonl" % (tmp, mode, r)):
        d = json.loads(line)
        if d.get("event") == "end": end = d
        elif "step_ms" in d and "event" not in d: steps.append(d["step_ms"])
    return steps[1:], end
res = {m: [run(m, r) for r in range(1, rounds + 1)] for m in modes}
med = {m: statistics.median([ms for steps, _ in res[m] for ms in steps]) for m in modes}
low = {m: min(ms for steps, _ in res[m] for ms in steps) for m in modes}
none_mib = res["none"][-1][1]["activation_peak_mb"]
print("%-12s %13s %9s %14s %9s %18s %12s" % ("mode", "median ms", "overhead", "fastest ms", "overhead",
                                              "activation MiB", "peak RSS MiB"))
for m in modes:
    end = res[m][-1][1]
    print("%-12s %13.0f %8.1f%% %14.0f %8.1f%% %11.1f (%.2f) %12.0f" % (
        m, med[m], 100 * (med[m] / med["none"] - 1), low[m], 100 * (low[m] / low["none"] - 1),
        end["activation_peak_mb"], end["activation_peak_mb"] / none_mib, end["peak_rss_mb"]))
print("# every timed step (ms), by round:")
for m in modes:
    print("#   %-12s %s" % (m, " | ".join(" ".join("%.0f" % x for x in steps) for steps, _ in res[m])))
PY
} | tee "$out"
