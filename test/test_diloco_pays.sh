# DiLoCo pays (and the auto outer optimizer's choice, and diloco-tune, at the end): 2 replicas at
# the default outer optimizer (diloco_outer_lr, diloco_outer_momentum, diloco_nesterov,
# diloco_momentum_warmup as the config table sets them; auto is plain averaging for this run of
# 30 outer steps) reach a lower validation loss than one worker at equal tokens per replica,
# for each of 3 seeds.
#
# Data: an order-2 Markov "language" over 64 tokens (test_tool markov): 4,096 contexts with 4
# successors each, so a small model keeps gaining from more tokens for thousands of steps and
# twice the data shows. Replicas are simulated in one process (diloco_transport = local, whose
# outer steps test_diloco.sh shows equal to real processes'), fp32 exchange, H = 10, 300 steps.
#
# The margin, from seeds 1–8 measured when the defaults were chosen (2026-11-25): one worker's
# validation loss 4.070 ± 0.0045 (std over seeds); 2 replicas at the defaults (lr 1, μ 0) won
# by 0.054–0.084 nats (mean 0.075, std 0.010 of the paired difference); the DiLoCo paper's
# settings (Nesterov, lr 0.7, μ 0.9) won by −0.002–0.020, i.e. no better than one worker on
# seed 4. MARGIN = 0.03 nats is 6.7 standard deviations of one worker's seed noise and 4.5 of
# the paired difference's below its mean: the defaults pass on every seed, the paper's
# settings fail, and so would a reversed outer step or averaging that loses a replica's work.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
MARGIN=${MARGIN:-0.03}
"$TOOL" markov "$tmp/train.bin" 64 0 400000 7 1
"$TOOL" markov "$tmp/val.bin" 64 0 20000 7 2
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_tokens 8192
        --max_steps 300 --warmup_steps 10 --threads 1 --log_every 1000 --ckpt_keep 0 --resume never)
final_val() { grep '"val_loss"' "$1/metrics.jsonl" | tail -1 | sed -E 's/.*"val_loss":([0-9.eE+-]+).*/\1/'; }
beats() {  # beats A B MARGIN: A < B − MARGIN
    "$PYTHON" -c "import sys; sys.exit(0 if $1 < $2 - $3 else 1)"
}
for seed in 1 2 3; do
    "$TRAIN_GPT" "${common[@]}" --seed "$seed" --out_dir "$tmp/one$seed" >"$tmp/one$seed.log" 2>&1 ||
        die "one worker, seed $seed: $(tail -1 "$tmp/one$seed.log")"
    "$TRAIN_GPT" "${common[@]}" --seed "$seed" --diloco_replicas 2 --diloco_transport local --diloco_inner_steps 10 \
        --diloco_quant none --out_dir "$tmp/two$seed" >"$tmp/two$seed.log" 2>&1 ||
        die "2 replicas, seed $seed: $(tail -1 "$tmp/two$seed.log")"
    one=$(final_val "$tmp/one$seed"); two=$(final_val "$tmp/two$seed")
    check "seed $seed: 2 replicas at the default outer settings ($two) beat one worker ($one) by $MARGIN nats" \
        beats "$two" "$one" "$MARGIN"
done

# The auto outer optimizer (diloco_outer_lr and diloco_outer_momentum both auto): a run of at
# least 150 outer steps (max_steps / diloco_inner_steps) with 3+ replicas takes Nesterov μ 0.9 at
# lr 0.2, and plain averaging (lr 1, μ 0) for the outer steps after the decay phase began
# (diloco_plain_in_decay auto: on with momentum; step 120 of 150 at decay_frac 0.2); a run of 149,
# or 2 replicas, or one, or an outer lr set alone, takes plain averaging throughout. Read from the
# outer_lr / outer_momentum each applied outer step logs (test_diloco.sh checks those values
# against numpy).
outer_settings() {  # the distinct "lr mu first_step last_step" runs of a metrics file, in order
    "$PYTHON" - "$1" <<'PY'
import json, sys
runs = []
for d in map(json.loads, open(sys.argv[1])):
    if not d.get("applied"):
        continue
    key = "%g %g" % (d["outer_lr"], d["outer_momentum"])
    if runs and runs[-1][0] == key:
        runs[-1][2] = d["step"]
    else:
        runs.append([key, d["step"], d["step"]])
print(", ".join("%s %d %d" % tuple(r) for r in runs))
PY
}
syncs() {  # the applied outer steps of a metrics file: "began_at_step[:fragment]/inner_steps", in order
    "$PYTHON" - "$1" <<'PY'
import json, sys
rows = [d for d in map(json.loads, open(sys.argv[1])) if "outer_step" in d and d.get("applied")]
print(" ".join("%d%s/%d" % (d.get("began_at_step", d["step"]), ":%d" % d["fragment"] if "fragment" in d else "",
                           d["inner_steps"]) for d in rows))
PY
}
auto_run() {  # auto_run NAME [--key value]...: 2 simulated replicas, H = 1, no validation
    local name=$1; shift
    "$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0 \
        --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0 --resume never --diloco_transport local \
        --diloco_inner_steps 1 --diloco_quant none --out_dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 ||
        die "$name: $(tail -1 "$tmp/$name.log")"
}
auto_run auto150 --diloco_replicas 3 --max_steps 150
check "auto, 150 outer steps, 3 replicas: lr 0.2, mu 0.9 to step 120, then plain averaging ($(outer_settings "$tmp/auto150/metrics.jsonl"))" \
    test "$(outer_settings "$tmp/auto150/metrics.jsonl")" = "0.2 0.9 1 120, 1 0 121 150"
check "auto, 150 outer steps: the start line says why" \
    grep -q 'outer lr 0.2, momentum 0.9 (Nesterov), plain averaging in the decay phase (auto: a run of 150 outer steps, 3 replicas' \
    "$tmp/auto150.log"
auto_run auto150_m2 --diloco_replicas 2 --max_steps 150
check "auto, 150 outer steps, 2 replicas: plain averaging throughout ($(outer_settings "$tmp/auto150_m2/metrics.jsonl"))" \
    test "$(outer_settings "$tmp/auto150_m2/metrics.jsonl")" = "1 0 1 150"
auto_run auto149 --diloco_replicas 3 --max_steps 149
check "auto, 149 outer steps: plain averaging throughout ($(outer_settings "$tmp/auto149/metrics.jsonl"))" \
    test "$(outer_settings "$tmp/auto149/metrics.jsonl")" = "1 0 1 149"
auto_run auto_lr --diloco_replicas 2 --max_steps 150 --diloco_outer_lr 0.8
check "auto momentum beside a set outer lr: 0, and so no plain averaging in the decay ($(outer_settings "$tmp/auto_lr/metrics.jsonl"))" \
    test "$(outer_settings "$tmp/auto_lr/metrics.jsonl")" = "0.8 0 1 150"
auto_run auto_m1 --diloco_replicas 1 --max_steps 150
check "auto, one replica: plain averaging ($(outer_settings "$tmp/auto_m1/metrics.jsonl"))" \
    test "$(outer_settings "$tmp/auto_m1/metrics.jsonl")" = "1 0 1 150"

# auto (diloco_decay_inner_steps): H / 4 with plain averaging in the decay, at least 1; H = 2 over
# 150 outer steps: momentum to step 240 every 2 steps, then plain averaging every step (with 2
# replicas plain averaging throughout, every step in the decay all the same); the 150-step run
# above at H = 1 has no shorter interval to take; nor has a run of 149 outer steps.
auto_run auto_decay --diloco_replicas 3 --max_steps 300 --diloco_inner_steps 2
check "auto decay H: every 2 steps with momentum to step 240, then every step, plain ($(outer_settings "$tmp/auto_decay/metrics.jsonl"); $(syncs "$tmp/auto_decay/metrics.jsonl" | wc -w) outer steps)" \
    test "$(outer_settings "$tmp/auto_decay/metrics.jsonl") $(syncs "$tmp/auto_decay/metrics.jsonl" | wc -w)" = \
    "0.2 0.9 2 240, 1 0 241 300 180"
check "auto decay H: the start line says why" \
    grep -q '2 inner steps per outer step (1 in the decay phase: auto, with plain averaging there)' "$tmp/auto_decay.log"
check "auto decay H: none at H = 1 (150 outer steps)" grep -q '1 inner steps per outer step, outer lr 0.2' "$tmp/auto150.log"
auto_run auto_decay_m2 --diloco_replicas 2 --max_steps 300 --diloco_inner_steps 2
check "auto decay H, 2 replicas: plain averaging every 2 steps to step 240, then every step ($(outer_settings "$tmp/auto_decay_m2/metrics.jsonl"); $(syncs "$tmp/auto_decay_m2/metrics.jsonl" | wc -w) outer steps)" \
    test "$(outer_settings "$tmp/auto_decay_m2/metrics.jsonl") $(syncs "$tmp/auto_decay_m2/metrics.jsonl" | wc -w)" = \
    "1 0 2 300 180"
auto_run auto_decay_short --diloco_replicas 2 --max_steps 298 --diloco_inner_steps 2
check "auto decay H: none in a run of 149 outer steps ($(syncs "$tmp/auto_decay_short/metrics.jsonl" | wc -w) outer steps)" \
    test "$(syncs "$tmp/auto_decay_short/metrics.jsonl" | wc -w)" = 149

# diloco_decay_inner_steps: from the decay phase's start (decay_frac 0.4 of 50 steps: step 30)
# the outer steps come every 4 inner steps instead of 10, and each says how many inner steps it
# carries; with 2 streaming fragments (H 10, H_d 4, one step in flight, decay from step 20) the
# fragments sync at offsets 5 / 0 of 10, then 2 / 0 of 4 counted from step 20, and the sync that
# crosses into the decay phase carries the steps since the fragment's own last sync.
auto_run decay_h --diloco_replicas 2 --max_steps 50 --decay_frac 0.4 --diloco_inner_steps 10 --diloco_decay_inner_steps 4
check "decay H: outer steps at 10, 20, 30, then every 4 ($(syncs "$tmp/decay_h/metrics.jsonl"))" \
    test "$(syncs "$tmp/decay_h/metrics.jsonl")" = "10/10 20/10 30/10 34/4 38/4 42/4 46/4 50/4"
check "decay H: the start line says so" grep -q '10 inner steps per outer step (4 in the decay phase)' "$tmp/decay_h.log"
# stop_at_step in a simulated run: it stops at the first outer boundary at or after the step (34
# for 33: a round is never cut), validates there, and its outer steps are those of the whole run.
auto_run decay_stop --diloco_replicas 2 --max_steps 50 --decay_frac 0.4 --diloco_inner_steps 10 --diloco_decay_inner_steps 4 \
    --stop_at_step 33
check "stop_at_step 33, simulated: stops after the outer step at 34 ($(syncs "$tmp/decay_stop/metrics.jsonl"))" \
    test "$(syncs "$tmp/decay_stop/metrics.jsonl")" = "10/10 20/10 30/10 34/4"
check "stop_at_step, simulated: validated at 34, a stop event and the note" \
    test "$(grep -c '"step":34,"val_loss"' "$tmp/decay_stop/metrics.jsonl")" -eq 1 \
    -a "$(grep -c '"event":"stop","step":34,"reason":"stop_at_step"' "$tmp/decay_stop/metrics.jsonl")" -eq 1 \
    -a "$(grep -c 'stopped after step 34, the first outer boundary' "$tmp/decay_stop.log")" -eq 1
auto_run decay_stream --diloco_replicas 2 --max_steps 40 --decay_frac 0.5 --diloco_inner_steps 10 \
    --diloco_decay_inner_steps 4 --diloco_fragments 2 --diloco_overlap_steps 1 --n_layer 2
check "decay H, 2 streaming fragments ($(syncs "$tmp/decay_stream/metrics.jsonl"))" \
    test "$(syncs "$tmp/decay_stream/metrics.jsonl")" = \
    "5:0/5 10:1/10 15:0/10 20:1/10 22:0/7 24:1/4 26:0/4 28:1/4 30:0/4 32:1/4 34:0/4 36:1/4 38:0/4 40:0/2 40:1/4"
# The momentum warm-up counts each fragment's own syncs across the decay's start: with the decay
# from step 18 the last sync before it is fragment 0's (at 15), and the decay's turn starts over
# at fragment 0 (at 20), so round k is no longer fragment k mod 2's. Every outer step's μ is
# 0.9·j/20 for its fragment's j-th sync; until 2026-12 (μ from the round number) fragment 0's
# sync at 20 took j = 2 instead of 3, and every sync of both fragments after it was one off.
auto_run decay_warmup --diloco_replicas 2 --max_steps 40 --decay_frac 0.55 --diloco_inner_steps 10 \
    --diloco_decay_inner_steps 4 --diloco_fragments 2 --diloco_overlap_steps 1 --n_layer 2 --diloco_outer_lr 0.7 \
    --diloco_outer_momentum 0.9 --diloco_momentum_warmup 20 --diloco_plain_in_decay 0
own_warmup() {
    "$PYTHON" - "$1" <<'PY'
import json, sys
rows = [d for d in map(json.loads, open(sys.argv[1])) if "outer_step" in d and d.get("applied")]
seen, bad = {}, []
for d in rows:
    seen[d["fragment"]] = j = seen.get(d["fragment"], 0) + 1
    if abs(d["outer_momentum"] - 0.9 * min(j, 20) / 20) > 1e-9:
        bad.append("%d:%d (sync %d) μ %g" % (d["began_at_step"], d["fragment"], j, d["outer_momentum"]))
print("    %d outer steps; wrong μ: %s" % (len(rows), ", ".join(bad) or "none"))
sys.exit(1 if bad or len(rows) < 10 else 0)
PY
}
check "decay H, streaming: the momentum warm-up counts each fragment's own syncs across the decay's start" \
    own_warmup "$tmp/decay_warmup/metrics.jsonl"
if "$TRAIN_GPT" test/configs/tiny_test.conf --diloco_replicas 2 --diloco_transport local --diloco_inner_steps 10 \
    --diloco_decay_inner_steps 4 --diloco_fragments 2 --diloco_overlap_steps 2 --max_steps 40 --train_data "$tmp/train.bin" \
    --out_dir "$tmp/decay_bad" >"$tmp/decay_bad.log" 2>&1; then bad_rc=0; else bad_rc=$?; fi
check "decay H: a fragment still in flight at the next decay sync is refused in one line naming the key" \
    test "$bad_rc" -ne 0 -a "$(grep -c 'diloco_overlap_steps.*diloco_decay_inner_steps' "$tmp/decay_bad.log")" -eq 1

# diloco-tune on the same data, at the test model's own size (--proxy 0): it runs one worker,
# data parallel and the 2 x 2 grid; its one-worker baseline is plain training (the same val
# loss to the last digit as a run without DiLoCo), and the settings it recommends are those
# of the grid's lowest validation loss in its own table.
"$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" \
    --val_tokens 8192 --warmup_steps 0 --threads 1 --replicas 2 --inner_steps 5 --rounds 4 --proxy 0 \
    --outer_lr 0.7,1.0 --outer_momentum 0,0.9 --dir "$tmp/tune" >"$tmp/tune.log" 2>&1 || die "diloco-tune: $(tail -1 "$tmp/tune.log")"
"$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_tokens 8192 \
    --warmup_steps 0 --threads 1 --max_steps 20 --batch_size 4 --out_dir "$tmp/plain" >"$tmp/plain.log" 2>&1
check "diloco-tune: its one-worker run is plain training ($(final_val "$tmp/tune/one-worker") = $(final_val "$tmp/plain"))" \
    test "$(final_val "$tmp/tune/one-worker")" = "$(final_val "$tmp/plain")"
check "diloco-tune: a progress line per run (6) and the table's 4 grid rows" \
    test "$(grep -c '^diloco-tune | \[' "$tmp/tune.log")" -eq 6 -a "$(grep -c '^| [01]' "$tmp/tune.log")" -eq 4
best_row() {  # the grid row with the lowest val_loss, as "lr mu"
    grep '^| [01]' "$1" | sort -t'|' -k4,4g | head -1 | awk -F'|' '{gsub(/ /,""); print $2, $3}'
}
recommended() { printf '%s %s' "$(sed -n 's/^diloco_outer_lr = //p' "$1")" "$(sed -n 's/^diloco_outer_momentum = //p' "$1")"; }
check "diloco-tune: recommends the grid's best row ($(best_row "$tmp/tune.log") -> $(recommended "$tmp/tune.log"))" \
    test "$(best_row "$tmp/tune.log")" = "$(recommended "$tmp/tune.log")"

# The same tuning from a streaming run's config (2 fragments, 2 steps in flight, top-k with error
# feedback, an int8 uplink with a bf16 downlink: refused in the baselines beside their quant none),
# the tuner's own flags as --flag=value: its baselines are the same plain training,
# to the last digit (the baselines took the streaming: a fragment synced mid-run and merged back
# with diloco_merge_alpha moved them by 1 %, and every "vs" figure with them). The lrs listed out
# of order: the edge-of-grid warning is there exactly when the best lr is the smallest or the
# largest (it read the list's first and last).
"$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" \
    --val_tokens 8192 --warmup_steps 0 --threads 1 --replicas=2 --inner_steps=5 --rounds=4 --proxy=0 \
    --outer_lr=1.4,0.7,1.0 --outer_momentum=0 --dir="$tmp/tune_streamed" --diloco_fragments 2 \
    --diloco_overlap_steps 2 --diloco_topk 0.5 --diloco_error_feedback 1 --diloco_quant int8 --diloco_downlink bf16 \
    >"$tmp/tune_streamed.log" 2>&1 ||
    die "diloco-tune (streamed): $(tail -1 "$tmp/tune_streamed.log")"
check "diloco-tune on a streaming config: the baselines are the same plain training ($(final_val "$tmp/tune_streamed/one-worker"), $(final_val "$tmp/tune_streamed/data-parallel"))" \
    test "$(final_val "$tmp/tune_streamed/one-worker")" = "$(final_val "$tmp/tune/one-worker")" -a \
    "$(final_val "$tmp/tune_streamed/data-parallel")" = "$(final_val "$tmp/tune/data-parallel")"
best_lr=$(best_row "$tmp/tune_streamed.log" | cut -d' ' -f1)
case "$best_lr" in 0.7|1.4) edge=1 ;; *) edge=0 ;; esac
check "diloco-tune: the edge-of-grid warning iff the best lr ($best_lr) is the grid's smallest or largest" \
    test "$(grep -c 'at the edge of the grid' "$tmp/tune_streamed.log")" -eq "$edge"

# diloco-tune's default proxy, on a 1 x 1 grid: its first line gives the shape its runs train,
# whose head_dim is one the CUDA backend's attention kernels take (32, 64, 128; the proxy had 4
# heads of 16, and every proxy run with --device cuda stopped at model creation). And a run
# config that is valid for its own run tunes as it is: one replica's (diloco_replica_id 2 of 4,
# tcp: refused by the baselines' diloco_replicas 1); 8 fragments of 8 layers with 1 step in
# flight at H 16 (refused by the proxy's 4 layers; now 4 fragments, none in flight at the H 4
# tuned, and a line says so); a warm-up that rounding carried past the tuning run's decay start
# (9 of 10 at decay_frac 0.12 is 23 of 25 steps, whose decay starts at 22).
proxy_tune() {  # proxy_tune NAME [--key value]...: its output in $tmp/NAME.log; true when all 3 runs ran
    local name=$1; shift
    "$TRAIN_GPT" diloco-tune test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" \
        --val_tokens 1024 --threads 1 --replicas 2 --inner_steps 2 --rounds 2 --outer_lr 1 --outer_momentum 0 \
        --dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 && grep -q '^diloco-tune | \[ 3/3\]' "$tmp/$name.log"
}
why() {  # why NAME: " (the error that stopped it)", if any
    local e; e=$(grep -m1 'error:' "$tmp/$1.log" || true); [ -z "$e" ] || printf ' (%s)' "$e"
}
ran=0; proxy_tune proxy && ran=1
head_dim=$(sed -n 's/^diloco-tune | M = .*; proxy: .* heads of \([0-9]*\),.*/\1/p' "$tmp/proxy.log")
check "diloco-tune's proxy: head_dim ${head_dim:-?}, one the CUDA attention kernels take (32, 64, 128)$(why proxy)" \
    sh -c "[ $ran = 1 ] && case '$head_dim' in 32|64|128) true ;; *) false ;; esac"
echo "a shared secret" >"$tmp/secret"
ran=0; proxy_tune replica_id --replicas 4 --diloco_replicas 4 --diloco_replica_id 2 --diloco_transport tcp \
    --diloco_rendezvous localhost:1 --diloco_secret_file "$tmp/secret" && ran=1
check "diloco-tune on one replica's config (diloco_replica_id 2 of 4, tcp)$(why replica_id)" test "$ran" = 1
ran=0; proxy_tune fragments --inner_steps 4 --n_layer 8 --diloco_replicas 2 --diloco_transport local \
    --diloco_inner_steps 16 --diloco_fragments 8 --diloco_overlap_steps 1 && ran=1
check "diloco-tune on 8 fragments of 8 layers: the proxy's runs stream 4, and a line says so$(why fragments)" \
    sh -c "[ $ran = 1 ] && grep -q 'stream with diloco_fragments = 4, diloco_overlap_steps = 0 (the config: 8 and 1)' '$tmp/fragments.log'"
ran=0; proxy_tune warmup --inner_steps 5 --rounds 5 --max_steps 10 --decay_frac 0.12 --warmup_steps 9 && ran=1
check "diloco-tune on warmup 9 of 10 at decay_frac 0.12 (25 steps a run): the warm-up ends at the decay's start$(why warmup)" \
    test "$ran" = 1
finish test_diloco_pays
