# HSDP copies inside a DiLoCo replica (docs/fsdp.md#hsdp-copies-in-a-diloco-replica): a
# replica is one `mpirun` job of fsdp_size × dp_replicate ranks; only the first copy's ranks
# talk to the hub (`train_gpt relay --shards fsdp_size`), the other copies take DiLoCo's
# outcome from them. Two replicas on loopback tcp. Without MPI: skipped, said so.
#   1. Replicas of 1 × 2 ranks (one shard, two copies), fp32 exchange, outer lr 0.7, Nesterov
#      0.9, H = 5, 20 steps, against the same replicas as one process each with grad_accum 2
#      (the same micro-batches per step: a copy reads every second one): both exit 0, the relay
#      saw one connection per replica, param_hash equal on both replicas at every outer step,
#      and θ after the last outer step within 2e-5 of its scale (fp32: the runs differ only in
#      the order of gradient additions, a few ulp per step; a copy that did not take DiLoCo's
#      weights would train its half of the batch on stale weights, far outside this bound).
#      Every checkpoint checked the copies' weights equal before it was written (the run stops
#      otherwise: part 4).
#   2. Replicas of 2 × 2 ranks (two shards, two copies inferred from dp_replicate 0; relay
#      --shards 2), int8 with error
#      feedback: both exit 0, param_hash equal at every outer step, the loss falls, the
#      outer state per rank is half of one process's on the first copy and none on the other.
#   2b. Streaming (2 fragments, 1 step in flight), 1 × 2 ranks: both finish with the copies'
#      check passed at every checkpoint, param_hash equal, and the other copy received only the
#      span each landing or merge changed (follow_mb below 3/4 of a whole piece per change).
#   3. Stopped at step 10 and resumed (a fresh hub; fp32 downlink): the 1 × 2 replicas' step-20
#      checkpoints byte-identical to a straight run's.
#   4. Replica 1 alone at first: held by the hub until both are there (min_replicas 2), it
#      says it waits. A rejoin: replica 1's first copy is late for outer step 2 and evicted (diloco_late): it
#      takes the group's state, its other copy takes the weights and moves its data to the
#      same step; both finish, param_hash agrees at every applied outer step, and the
#      checkpoints after the rejoin pass the copies' check. The check can fail: a run whose
#      second copy skips the weights of outer step 2 (TRAIN_GPT_FAULT=hsdp_skip_follow:10) stops
#      with a one-line error at its next checkpoint and writes none.
#   5. Refused with one line: HSDP replicas over the mpi transport, fsdp_size × dp_replicate
#      other than the job's ranks.
. "$(dirname "$0")/lib.sh"
require_mpi
require_tcp
tmp_with_processes
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
make_secret "$tmp/secret"
common=(test/configs/tiny_test.conf --device cpu --train_data "$tmp/train.bin" --val_every 0 --threads 1
    --log_every 1000 --ckpt_keep 0 --diloco_replicas 2 --diloco_inner_steps 5 --diloco_transport tcp
    --diloco_secret_file "$tmp/secret" --diloco_timeout_s 3 --diloco_connect_timeout_s 30 --diloco_min_replicas 2)

replica() {  # replica SHARDS COPIES ID OUT_DIR [--key value]...: one replica in the background; sets rpid
    local shards=$1 copies=$2 id=$3 out=$4
    shift 4
    if [ "$shards" = 1 ] && [ "$copies" = 1 ]; then
        "$TRAIN_GPT" "${common[@]}" --diloco_rendezvous "127.0.0.1:$port" --diloco_replica_id "$id" --out_dir "$out" \
            "$@" >>"$out.log" 2>&1 &
    else
        "${MPIRUN[@]}" $((shards * copies)) "$TRAIN_GPT" "${common[@]}" --fsdp_size "$shards" --dp_replicate "$copies" \
            --diloco_rendezvous "127.0.0.1:$port" --diloco_replica_id "$id" --out_dir "$out" "$@" >>"$out.log" 2>&1 &
    fi
    rpid=$!
    pids+=($rpid)
}
two_replicas() {  # two_replicas SHARDS COPIES NAME [--key value]...: replicas 0 and 1 into $tmp/NAME_<id>; sets rc
    local shards=$1 copies=$2 name=$3 a b
    shift 3
    replica "$shards" "$copies" 0 "$tmp/${name}_0" "$@"; a=$rpid
    replica "$shards" "$copies" 1 "$tmp/${name}_1" "$@"; b=$rpid
    rc=0
    wait "$a" || rc=$?
    wait "$b" || rc=$?
}

# ---------------------------------------------------------------- 1. 1 × 2 against one process
fp32=(--diloco_quant none --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_plain_in_decay 0
    --max_steps 20 --ckpt_every 10)
start_relay copies 1
two_replicas 1 2 copies "${fp32[@]}"
check "replicas of 1 shard x 2 copies: both exit 0 (rc $rc)" test "$rc" -eq 0
check "  the start line says one DiLoCo replica of 2 copies" \
    grep -q "job: 2 ranks .*FSDP over 1, 2 copies (HSDP): one DiLoCo replica" "$tmp/copies_0.log"
check "  the relay saw one connection per replica (the first copy's)" \
    test "$(grep -c 'replica [01] connected' "$tmp/relay_copies.log")" -eq 2
check "  param_hash equal on both replicas at every outer step (4)" \
    all_hashes_agree 4 "$tmp/copies_0/metrics.jsonl" "$tmp/copies_1/metrics.jsonl"
check "  the outer steps weigh both copies' tokens (2 copies x 5 steps x 4 rows x 32)" \
    grep -q '"inner_steps":5,"tokens":1280' "$tmp/copies_0/metrics.jsonl"
start_relay whole 1
two_replicas 1 1 whole "${fp32[@]}" --grad_accum 2
check "the same replicas as one process each, grad_accum 2: both exit 0 (rc $rc)" test "$rc" -eq 0
for r in 0 1; do
    check "  replica $r: θ with 2 copies = θ of one process within 2e-5 of its scale" \
        theta_close "$tmp/copies_$r" "$tmp/whole_$r" 20 2e-5
done

# ---------------------------------------------------------------- 2. 2 × 2
start_relay two 2
two_replicas 2 2 two --diloco_quant int8 --diloco_error_feedback 1 --max_steps 40 --dp_replicate 0
check "replicas of 2 shards x 2 copies (relay --shards 2): both exit 0 (rc $rc)" test "$rc" -eq 0
check "  dp_replicate 0: the copies are the job's ranks / fsdp_size" \
    grep -q "job: 4 ranks .*FSDP over 2, 2 copies (HSDP): one DiLoCo replica" "$tmp/two_0.log"
check "  param_hash equal on both replicas at every outer step (8)" \
    all_hashes_agree 8 "$tmp/two_0/metrics.jsonl" "$tmp/two_1/metrics.jsonl"
check "  the loss falls" loss_falls "$tmp/two_0/metrics.jsonl"
check "  outer state per rank: half of one process's (the first copy holds it)" "$PYTHON" -c "
import json, sys
def mb(p): return [json.loads(l) for l in open(p) if '\"end\"' in l][-1]['state_mb']
a, b = mb('$tmp/whole_0/metrics.jsonl'), mb('$tmp/two_0/metrics.jsonl')
print('  state per rank: 1 process %.4f MB, 2 x 2 ranks %.4f MB' % (a, b)); sys.exit(0 if a / 2 <= b <= a / 2 + 0.001 else 1)"

# ---------------------------------------------------------------- 2b. streaming
# Two fragments, one step in flight: each landing or merge changes one fragment's weights, and
# the other copy receives only that span. The copies' check at every checkpoint (every 5
# steps) fails the run if a copy missed a value; follow_mb (the end event) counts what went.
start_relay stream 1
two_replicas 1 2 stream --diloco_fragments 2 --diloco_overlap_steps 1 --max_steps 20 --ckpt_every 5
check "streaming replicas of 1 shard x 2 copies: both exit 0, the copies' check passed at steps 5-20 (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && [ -d '$tmp/stream_0/step_00000020' ] && [ -d '$tmp/stream_1/step_00000020' ]"
check "  param_hash equal on both replicas at every outer step (>= 8)" \
    all_hashes_agree 8 "$tmp/stream_0/metrics.jsonl" "$tmp/stream_1/metrics.jsonl"
check "  the other copy received less than 3/4 of the weights per change (one fragment's span, not all)" "$PYTHON" -c "
import json, sys
lines = [json.loads(l) for l in open('$tmp/stream_0/metrics.jsonl')]
end = [d for d in lines if d.get('event') == 'end'][-1]
changes = 1 + sum(1 for d in lines if 'outer_step' in d and 'event' not in d and d.get('applied'))  # + the join
piece = end['state_mb'] / 4  # fp32 weights of this rank: 4 of the 16 bytes per value
print('  follow_mb %.4f for %d changes of a %.4f MB piece (all of it each time: %.4f)'
      % (end['follow_mb'], changes, piece, changes * piece))
sys.exit(0 if end['follow_mb'] < 0.75 * changes * piece else 1)"

# ---------------------------------------------------------------- 3. resume bit-exact
exact=(--diloco_quant int8 --diloco_error_feedback 1 --diloco_downlink fp32 --max_steps 20 --ckpt_every 5)
start_relay straight 1
two_replicas 1 2 straight "${exact[@]}"
start_relay stop 1
two_replicas 1 2 stop "${exact[@]}" --stop_at_step 10
start_relay resume 1
two_replicas 1 2 stop "${exact[@]}"
check "1 x 2 replicas stopped at step 10 and resumed: both exit 0 (rc $rc)" test "$rc" -eq 0
for r in 0 1; do
    check "  replica $r: resumed from step 10" grep -q "resuming from '.*step_00000010'" "$tmp/stop_$r.log"
    check "  replica $r: step 20's model, moments and outer state byte-identical to the straight run" \
        same_checkpoint "$tmp/straight_$r" "$tmp/stop_$r" 20
done

# ---------------------------------------------------------------- 4. a rejoin, and the copies' check
# Replica 0 (one process, grad_accum 2) stops itself at step 12 (SIGSTOP) so that it is still
# there when replica 1, late for outer step 2, rejoins; it goes on once the hub has replica 1
# waiting for the group's state (a logged event, not a time). Replica 1's ranks hold themselves
# in step 10 until replica 0's upload of outer step 2 is done (held_for_upload): then its late
# contribution misses the round whatever the machine's load (started together, a replica 0
# more than 1 s behind replica 1, as on a loaded machine, let it in).
# Replica 1 starts first: the hub holds the new group until both are present (min_replicas
# 2), and replica 1 says so while it waits (every hub timeout, 3 s here).
start_relay late 1
TRAIN_GPT_FAULT=stop_in_step:9,diloco_late:1 replica 1 2 1 "$tmp/late_1" --diloco_quant int8 --max_steps 40 \
    --ckpt_every 10; b=$rpid
check "alone, replica 1 says it waits for the hub to answer its join (diloco_min_replicas 2)" \
    wait_until "replica 1 says it waits" \
    grep -q "replica 1 has waited [0-9]* s for the hub at .* to answer its join: it holds a new group until 2" \
    "$tmp/late_1.log"
TRAIN_GPT_FAULT=stop_in_step:12,tcp_trace:1 replica 1 1 0 "$tmp/late_0" --grad_accum 2 --diloco_quant int8 \
    --max_steps 40 --ckpt_every 10; a=$rpid
held_ranks_for_upload late "$tmp/late_0.log" 1 "$b" 2
wait_until "replica 0 stops at step 12" stopped "$a"
wait_until "replica 1 waits for the group's state" \
    grep -q "replica 1 joined at outer step .*waits for the group's state" "$tmp/relay_late.log"
kill -CONT "$a"
rc=0; wait "$a" || rc=$?; wait "$b" || rc=$?
check "replica 1's first copy late and evicted: both finish (rc $rc)" test "$rc" -eq 0
check "  replica 1 took the group's state" grep -q '"event":"diloco_join"' "$tmp/late_1/metrics.jsonl"
check "  param_hash equal at every outer step both applied (>= 5)" \
    all_hashes_agree 5 "$tmp/late_0/metrics.jsonl" "$tmp/late_1/metrics.jsonl"
check "  its checkpoints after the rejoin passed the copies' check (step 40 written)" test -d "$tmp/late_1/step_00000040"
start_relay skip 1
skip=(--diloco_quant int8 --max_steps 20 --ckpt_every 10 --diloco_min_replicas 2)
replica 1 2 0 "$tmp/skip_0" "${skip[@]}"; a=$rpid
TRAIN_GPT_FAULT=hsdp_skip_follow:10 replica 1 2 1 "$tmp/skip_1" "${skip[@]}"; b=$rpid
rcb=0; wait "$b" || rcb=$?
wait "$a" || true
check "a second copy that skipped DiLoCo's weights: the run stops non-zero (rc $rcb)" test "$rcb" -ne 0
check "  naming the copies' difference" grep -q "^train_gpt: rank 0: error: HSDP: the copies of the model hold different weights at step 10 (rank 1's" "$tmp/skip_1.log"
check "  and writing no checkpoint at step 10" test ! -d "$tmp/skip_1/step_00000010"

# ---------------------------------------------------------------- 5. what is refused
refused() {  # refused PATTERN NP [--key value]...: the job fails with a one-line error matching PATTERN
    local pattern=$1 np=$2 out rc=0
    shift 2
    out=$("${MPIRUN[@]}" "$np" "$TRAIN_GPT" "${common[@]}" --diloco_rendezvous 127.0.0.1:1 --diloco_replica_id 0 \
        --out_dir "$tmp/refused" "$@" 2>&1) || rc=$?
    [ "$rc" -ne 0 ] && printf '%s\n' "$out" | grep "^train_gpt: rank [0-9]*: error: $pattern" >/dev/null
}
check "refused: HSDP replicas over the mpi transport" refused "diloco_transport mpi: a DiLoCo replica of 2 ranks" 2 \
    --dp_replicate 2 --diloco_transport mpi
check "refused: fsdp_size x dp_replicate other than the job's ranks" \
    refused "fsdp_size 2 × dp_replicate 2: a DiLoCo replica is one job of" 2 --fsdp_size 2 --dp_replicate 2
finish test_hsdp_diloco
