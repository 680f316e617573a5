# Replicas of different sizes (docs/diloco.md#replicas-of-different-sizes): three replicas with
# different batch_size, grad_accum and threads train one model; the mean weights each outer
# gradient by the tokens it was trained on.
#   1. Over MPI, fp32 and int8 outer gradients: param_hash equal on every replica at every
#      outer step; each replica's metrics give its inner steps and tokens; the reducer's mean,
#      recomputed in numpy with the token weights, is byte-identical to what the replicas
#      received (test/diloco_check.py), and the same dump WITHOUT the weights fails the check
#      (so the check sees the weighting).
#   2. Through a relay (tcp): the same, and the relay's log names the weights.
#   2b. diloco_sync_every_s (phases on wall time) over MPI, batch 4 / 16 / 4: the fast replicas
#      take extra inner steps (more than H, more than the slow one), the hashes agree, and the
#      mean weights the contributions by their tokens, extra steps included (numpy). Two int8
#      quantizations of Δs that differ by up to 4x in steps: Δ within 5 % relative L2 of the
#      true weighted mean (test_diloco.sh's 3 % is for Δs of equal steps).
#      With streaming it is refused with one line.
#   3. A key every replica must share (max_steps, seed) differs: refused with one line, over MPI
#      and at the relay. So is other train data (another shard: the replicas would read
#      overlapping rows), while the same shards under another path are accepted; and two MPI
#      replicas given one out_dir.
# Batch sizes 4, 8, 4 with grad_accum 1, 1, 2: tokens per step 4·T, 8·T, 8·T, weights 1 : 2 : 2.
. "$(dirname "$0")/lib.sh"
tmp_with_processes
diloco_test_files
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --log_every 1000 --ckpt_keep 0 --diloco_replicas 3 --diloco_inner_steps 5 --max_steps 30)
# Replica i's own keys.
sizes=("--batch_size 4 --grad_accum 1 --threads 1" "--batch_size 8 --grad_accum 1 --threads 2"
       "--batch_size 4 --grad_accum 2 --threads 1")
detect_mpi
detect_tcp   # the relay's parts (2, 3's tcp checks) need OpenSSL: skipped without it
[ "$HAVE_TCP" = 1 ] || say "  skip tcp parts: no OpenSSL in this build"

# tokens_of FILE: the tokens of every applied outer step of a replica, one per line.
tokens_of() { grep '"applied":true' "$1" | sed -E 's/.*"tokens":([0-9]+).*/\1/' | sort -u; }

# The tokens each replica logged: 5 inner steps x its tokens per step (seq_len 32).
tokens_as_sized() {
    local dir=$1
    [ "$(tokens_of "$dir/0/metrics.jsonl")" = 640 ] && [ "$(tokens_of "$dir/1/metrics.jsonl")" = 1280 ] &&
        [ "$(tokens_of "$dir/2/metrics.jsonl")" = 1280 ] &&
        grep -q '"inner_steps":5,"tokens":1280' "$dir/2/metrics.jsonl"
}

# Without the token dumps the check takes equal weights: it must then fail.
fails_without_weights() {
    local copy="$tmp/unweighted_$1"
    cp -r "$tmp/dump_$1" "$copy"
    rm -f "$copy"/tokens_*
    ! "$PYTHON" test/diloco_check.py "$copy" 1 0 "${@:2}" >"$copy.log" 2>&1 &&
        grep -q "is not the hub's reduction" "$copy.log"
}

# ---------------------------------------------------------------- 1. MPI
if [ "$HAVE_MPI" = 1 ]; then
    for quant in none int8; do
        mkdir -p "$tmp/dump_mpi_$quant"
        TRAIN_GPT_DILOCO_DUMP="$tmp/dump_mpi_$quant" "${MPIRUN[@]}" 3 sh -c "
            set -- $(printf "'%s' " "${sizes[@]}")
            r=\$OMPI_COMM_WORLD_RANK; shift \$r
            exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") \$1 --diloco_transport mpi --diloco_quant $quant \
                --diloco_error_feedback $([ $quant = none ] && echo 0 || echo 1) --out_dir '$tmp/mpi_$quant/'\$r" \
            >"$tmp/mpi_$quant.log" 2>&1 || cat "$tmp/mpi_$quant.log"
        check "MPI, $quant: param_hash equal on the 3 replicas at all 6 outer steps" \
            all_hashes_agree 6 "$tmp"/mpi_$quant/*/metrics.jsonl
        check "MPI, $quant: each replica logs its inner steps and tokens (640, 1280, 1280)" tokens_as_sized "$tmp/mpi_$quant"
    done
    check "MPI, fp32: the mean is the token-weighted mean of the θᵢ (numpy, byte for byte; outer step 1e-6)" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_mpi_none" 1 0 none
    check "MPI, int8 + error feedback: the reducer's mean byte for byte with token weights (numpy)" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_mpi_int8" 1 0 int8 0.03
    check "MPI, int8: the same dump checked with equal weights fails (the weights matter)" \
        fails_without_weights mpi_int8 int8 0.03
else
    say "  skip MPI parts: no mpirun or no MPI in this build"
fi

# ---------------------------------------------------------------- 2. tcp through a relay
if [ "$HAVE_TCP" = 1 ]; then
    start_relay main 1 10   # listening before the replicas start (sets port; a taken port: another)
    tcp=(--diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
        --diloco_timeout_s 10 --diloco_connect_timeout_s 20 --diloco_min_replicas 3)
    mkdir -p "$tmp/dump_tcp"
    for r in 0 1 2; do
        # shellcheck disable=SC2086
        TRAIN_GPT_DILOCO_DUMP="$tmp/dump_tcp" "$TRAIN_GPT" "${common[@]}" ${sizes[$r]} "${tcp[@]}" --diloco_quant int8 \
            --diloco_replica_id "$r" --out_dir "$tmp/tcp/$r" >"$tmp/tcp_$r.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]: -3}"; do wait "$p" || rc=$?; done
    check "tcp: the 3 replicas exit 0 (rc $rc)" test "$rc" -eq 0
    check "tcp: param_hash equal on the 3 replicas at all 6 outer steps" all_hashes_agree 6 "$tmp"/tcp/*/metrics.jsonl
    check "tcp: each replica logs its inner steps and tokens" tokens_as_sized "$tmp/tcp"
    check "tcp: the relay's mean byte for byte with token weights, int8 both ways with the hub's feedback (numpy)" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_tcp" 1 0 int8 0.03
    check "tcp: the same dump with equal weights fails" fails_without_weights tcp int8 0.03
    check "tcp: the relay's log names the weights" grep -q 'weighted by tokens \[640 1280 1280\]' "$tmp/relay_main.log"
fi

# ---------------------------------------------------------------- 2b. phases on wall time
# diloco_sync_every_s 1: replicas of batch 4, 16 and 4 (the second slower per step) each train at
# least 1 s per phase; the fast ones fill it with extra inner steps, which their contributions
# count (tokens) and the weighted mean takes in. (At 0.3 s, H = 5 steps of a fast replica fill a
# phase once a step takes 60 ms, as under a load average of 13 on 2 cores (40 ms measured): then
# no extra step. 1 s leaves 200 ms a step.)
inner_total() {  # inner_total FILE: the inner steps of every applied outer step, summed
    "$PYTHON" -c 'import json, sys; print(sum(d["inner_steps"] for d in map(json.loads, open(sys.argv[1])) if d.get("applied")))' "$1"
}
more_steps_when_faster() {  # the fast replicas (0, 2) took more inner steps than H each phase on average, and than the slow one
    local dir=$1 f0 s1 f2
    f0=$(inner_total "$dir/0/metrics.jsonl"); s1=$(inner_total "$dir/1/metrics.jsonl"); f2=$(inner_total "$dir/2/metrics.jsonl")
    say "    inner steps over the run: replica 0 (batch 4) $f0, replica 1 (batch 16) $s1, replica 2 (batch 4) $f2 (H = 5 x 6 phases = 30)"
    [ "$f0" -gt 30 ] && [ "$f2" -gt 30 ] && [ "$f0" -gt "$s1" ] && [ "$f2" -gt "$s1" ]
}
if [ "$HAVE_MPI" = 1 ]; then
    timed=("--batch_size 4 --threads 1" "--batch_size 16 --threads 1" "--batch_size 4 --threads 1")
    mkdir -p "$tmp/dump_timed"
    TRAIN_GPT_DILOCO_DUMP="$tmp/dump_timed" "${MPIRUN[@]}" 3 sh -c "
        set -- $(printf "'%s' " "${timed[@]}")
        r=\$OMPI_COMM_WORLD_RANK; shift \$r
        exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") \$1 --diloco_transport mpi --diloco_quant int8 \
            --diloco_error_feedback 1 --diloco_sync_every_s 1 --out_dir '$tmp/timed/'\$r" \
        >"$tmp/timed.log" 2>&1 || cat "$tmp/timed.log"
    check "sync_every_s: param_hash equal on the 3 replicas at all 6 outer steps" \
        all_hashes_agree 6 "$tmp"/timed/*/metrics.jsonl
    check "sync_every_s: the fast replicas log more inner steps than H and than the slow one" \
        more_steps_when_faster "$tmp/timed"
    check "sync_every_s: the mean weights each contribution by its tokens, extra steps included (numpy, byte for byte)" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_timed" 1 0 int8 0.05
fi
check "sync_every_s with streaming is refused with one line" \
    one_line_error "diloco_sync_every_s: 0.5 cannot be combined with streaming" --diloco_transport mpi \
    --diloco_sync_every_s 0.5 --diloco_fragments 2 --out_dir "$tmp/refused"

# ---------------------------------------------------------------- 3. keys every replica shares
"$TOOL" shard "$tmp/more.bin" 64 0 5000 13   # another shard: other data
if [ "$HAVE_MPI" = 1 ]; then
    out=$("${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") --diloco_replicas 2 \
        --diloco_transport mpi --max_steps \$((30 + OMPI_COMM_WORLD_RANK)) --out_dir '$tmp/mismatch/'\$OMPI_COMM_WORLD_RANK" \
        2>&1 >/dev/null) && rc=0 || rc=$?
    check "MPI: replicas with different max_steps are refused, naming the field that differs (rc $rc)" \
        sh -c "[ $rc -ne 0 ] && printf '%s\n' \"\$1\" | grep -q \"train_gpt: replica [01]: error: diloco (mpi): the ranks disagree on the run: rank 1 has 'max_steps 31' where rank 0 has 'max_steps 30' (every replica must share the model, seq_len, max_steps, shuffle, seed\"" _ "$out"
    # Replica 1's copy of the data holds one more shard.
    out=$("${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") --diloco_replicas 2 \
        --diloco_transport mpi --max_steps 30 --train_data \"\$([ \$OMPI_COMM_WORLD_RANK = 0 ] && echo '$tmp/train.bin' || echo '$tmp/train.bin,$tmp/more.bin')\" \
        --out_dir '$tmp/mismatch_data/'\$OMPI_COMM_WORLD_RANK" 2>&1 >/dev/null) && rc=0 || rc=$?
    check "MPI: replicas whose train data differ (one more shard) are refused, naming the data (rc $rc)" \
        sh -c "[ $rc -ne 0 ] && printf '%s\n' \"\$1\" | grep -q \"the ranks disagree on the run: rank 1 has 'data [0-9a-f]\{16\} (65000 tokens, 2 shards)' where rank 0 has 'data [0-9a-f]\{16\} (60000 tokens, 1 shards)'.*its train data\"" _ "$out"
    out=$("${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --diloco_replicas 2 --diloco_transport mpi --max_steps 30 \
        --out_dir "$tmp/one_dir" 2>&1 >/dev/null) && rc=0 || rc=$?
    # srun gives every rank the same command line: the replicas write to one_dir/replica_<id>
    # (until 2026-12 the job stopped here, and LUMI's template, 8 MPI replicas, never trained).
    check "MPI: two replicas given one out_dir each write to its own replica_<id> under it, said in one line (rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ \$(printf '%s\n' \"\$1\" | grep -c \"out_dir: replicas 0 and 1 of this MPI job share '$tmp/one_dir'.*own $tmp/one_dir/replica_<id>\") -eq 1 ] &&
               test -d '$tmp/one_dir/replica_0/step_00000030' && test -d '$tmp/one_dir/replica_1/step_00000030' &&
               ! test -e '$tmp/one_dir/metrics.jsonl' && ! ls '$tmp/one_dir' | grep -q step_" _ "$out"
fi
if [ "$HAVE_TCP" = 1 ]; then
    start_relay second 1 10
    relay2=${pids[-1]}
    tcp=(--diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
        --diloco_timeout_s 10 --diloco_connect_timeout_s 20)
    "$TRAIN_GPT" "${common[@]}" "${tcp[@]}" --diloco_replica_id 0 --max_steps 100000000 --out_dir "$tmp/first" \
        >"$tmp/first.log" 2>&1 &
    first=$!
    pids+=($first)
    wait_until "replica 0 joined the relay" grep -q 'replica 0 joined' "$tmp/relay_second.log"
    check "tcp: a replica with another seed is refused with one line naming the keys" \
        one_line_error 'refused replica 1: replica 1 has run_fingerprint [0-9a-f]* but the group has [0-9a-f]*: its config differs in a key every replica must share (the model, seq_len, max_steps, shuffle, seed, a diloco_ key, its train data: the shards. tokens, or its ranks: fsdp_size, a sharded replica.s rank j meeting rank j of the others only; docs' \
        "${tcp[@]}" --diloco_replica_id 1 --max_steps 100000000 --seed 7
    check "tcp: the refused replica points to the diloco_fingerprint events" \
        one_line_error "refused replica 1: .*; the fields it hashes are in every replica's diloco_fingerprint event" \
        "${tcp[@]}" --diloco_replica_id 1 --max_steps 100000000 --seed 7
    check "tcp: the group's replica logged the fields its fingerprint hashes (max_steps, seed, data)" \
        grep -q '"event":"diloco_fingerprint","step":0,"fingerprint":"[0-9a-f]\{16\}","covers":"model {.*|max_steps 100000000|shuffle 1|seed 1337|.*|data [0-9a-f]\{16\} (60000 tokens, 1 shards)' \
        "$tmp/first/metrics.jsonl"
    check "tcp: a replica whose copy of the data is another shard is refused" \
        one_line_error 'refused replica 1: .*its train data' "${tcp[@]}" --diloco_replica_id 1 --max_steps 100000000 \
        --train_data "$tmp/more.bin"
    # The same shard under another path (another cluster's file system) is the same data: accepted,
    # and the replica trains (it is stopped once it has joined).
    mkdir -p "$tmp/elsewhere" && cp "$tmp/train.bin" "$tmp/elsewhere/copy.bin"
    "$TRAIN_GPT" "${common[@]}" "${tcp[@]}" --diloco_replica_id 1 --max_steps 100000000 --train_data "$tmp/elsewhere/copy.bin" \
        --out_dir "$tmp/copy" >"$tmp/copy.log" 2>&1 &
    copy=$!
    pids+=($copy)
    wait_until "replica 1 (the same shard elsewhere) joined the relay" grep -q 'replica 1 joined' "$tmp/relay_second.log"
    check "tcp: the same shards under another path are accepted (the replica trains on)" \
        sh -c "kill -0 $copy && ! grep -q 'error:' '$tmp/copy.log'"
    kill -9 "$copy" 2>/dev/null || true
    kill -9 "$first" "$relay2" 2>/dev/null || true
fi
finish test_diloco_hetero
