# DiLoCo end to end on the CPU backend, with real processes, real MPI and real sockets on
# loopback (docs/diloco.md):
#   1. M = 1, outer lr 1, momentum 0, no quantization: byte-identical to training without
#      DiLoCo (over MPI and over TCP with the replica hosting the hub).
#   2. The outer step against an independent float64 computation (test/diloco_check.py)
#      from the dumped tensors: the sign convention, Nesterov, all replicas identical.
#   3. 3 replicas over MPI and over TCP (a standalone relay), H = 5: every outer step's
#      param_hash equal on all replicas; the loss falls.
#   4. kill -9 one TCP replica mid-run: the others close each outer step within
#      timeout + 5 s and go on; restarted, it rejoins and its hash equals the others'.
#   5. Resume mid-round from a checkpoint with int8 + error feedback: bit-exact.
#   6. SIGTERM: the replica checkpoints, says goodbye, and the others carry on at once.
#   7. Configuration errors: one line naming the key.
#   8. diloco_transport = local (M replicas simulated in one process): every outer step's
#      param_hash equal to the MPI run's, fp32 and int8 + error feedback; heavy-ball and the
#      momentum warm-up against numpy.
#   9. Streaming (4 fragments, exchanges overlapping 2 inner steps): local = MPI bit for bit,
#      every fragment's outer step and merge against numpy, 3 replicas over TCP agree at
#      every fragment sync; a replica killed with a fragment in flight rejoins and agrees;
#      stop and resume with a fragment in flight is bit-exact.
# The tcp parts need a build with OpenSSL; without it they are skipped, and said so.
. "$(dirname "$0")/lib.sh"
tmp_with_processes
diloco_test_files
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0)
identity=(--diloco_replicas 1 --diloco_inner_steps 5 --diloco_outer_lr 1 --diloco_outer_momentum 0 --diloco_quant none)
detect_mpi
detect_tcp   # the tcp parts (a relay, replicas over sockets) need OpenSSL: skipped without it
[ "$HAVE_TCP" = 1 ] || say "  skip tcp parts: no OpenSSL in this build"

same_bytes() {  # same_bytes DIR_A DIR_B STEP_DIR FILES...
    local a=$1 b=$2 s=$3; shift 3
    for f in "$@"; do cmp -s "$a/$s/$f" "$b/$s/$f" || return 1; done
}

# ---------------------------------------------------------------- 1. M = 1 identity
"$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/plain" >/dev/null
if [ "$HAVE_MPI" = 1 ]; then
    "${MPIRUN[@]}" 1 "$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/id_mpi" "${identity[@]}" --diloco_transport mpi \
        >"$tmp/id_mpi.log" 2>&1 || cat "$tmp/id_mpi.log"
    check "M=1 over MPI, lr 1, momentum 0, none: losses identical to plain training" \
        test "$(loss_table "$tmp/plain/metrics.jsonl")" = "$(loss_table "$tmp/id_mpi/metrics.jsonl")"
    check "M=1 over MPI: model and optimizer bytes identical to plain training" \
        same_bytes "$tmp/plain" "$tmp/id_mpi" step_00000020 model.safetensors optimizer.safetensors
else
    say "  skip MPI parts: no mpirun or no MPI in this build"
fi
if [ "$HAVE_TCP" = 1 ]; then
    port=$(free_port)
    # A soft open-files limit of 256 (the hub raises it as `train_gpt relay` does: it did not).
    (ulimit -Sn 256 && "$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/id_tcp" "${identity[@]}" --diloco_transport tcp \
        --diloco_serve 1 --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_replica_id 0) \
        >"$tmp/id_tcp.log" 2>&1 || cat "$tmp/id_tcp.log"
    check "M=1 over TCP (serving the hub itself): model and optimizer bytes identical to plain training" \
        same_bytes "$tmp/plain" "$tmp/id_tcp" step_00000020 model.safetensors optimizer.safetensors
    check "  the served hub raised the open-files soft limit from 256" \
        grep -q 'open files: soft limit raised from 256 to' "$tmp/id_tcp.log"
fi

# ---------------------------------------------------------------- 2 + 3. three replicas
# The paper's outer optimizer (Nesterov, lr 0.7, μ 0.9): the defaults have no momentum, and
# the numpy check should see the momentum at work. diloco_plain_in_decay 0: the paper's step
# in the decay phase too (auto would average plainly there, with μ > 0).
three=(--diloco_replicas 3 --diloco_inner_steps 5 --max_steps 40 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9
       --diloco_plain_in_decay 0)
if [ "$HAVE_MPI" = 1 ]; then
    mkdir -p "$tmp/dump_mpi"
    TRAIN_GPT_DILOCO_DUMP="$tmp/dump_mpi" "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${three[@]}") \
        --diloco_transport mpi --diloco_quant none --out_dir '$tmp/mpi3/'\$OMPI_COMM_WORLD_RANK" \
        >"$tmp/mpi3.log" 2>&1 || cat "$tmp/mpi3.log"
    check "3 replicas over MPI: param_hash equal on every replica at all 8 outer steps" \
        all_hashes_agree 8 "$tmp"/mpi3/*/metrics.jsonl
    check "3 replicas over MPI: loss falls" loss_falls "$tmp/mpi3/0/metrics.jsonl"
    # plan's figure for mpi: (M − 1)/M of the payload and of the mean each way, on average over
    # the ranks (it printed the tcp hub's: a payload up and a mean down, and a hub there is not).
    planned=$("$TRAIN_GPT" plan "${common[@]}" "${three[@]}" --diloco_transport mpi --diloco_quant none |
        sed -n 's/.*per replica per outer step over mpi.* GB (\([0-9]*\) bytes) each way.*/\1/p')
    measured=$(grep -h '"outer_step":1,' "$tmp"/mpi3/*/metrics.jsonl |
        sed -E 's/.*"bytes_sent":([0-9]+).*/\1/' | awk '{ s += $1 } END { printf "%.0f", s / NR }')
    check "3 replicas over MPI: plan's bytes each way ($planned) = the ranks' mean bytes_sent at outer step 1 ($measured)" \
        test -n "$planned" -a "$planned" = "$measured"
    check "outer step = Nesterov on θ − mean θᵢ (numpy: the reducer's fp32 mean byte for byte, 1e-6), MPI, fp32 Δ" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_mpi" 0.7 0.9 none
    # The reducer's mean in the other codecs, against numpy byte for byte: int4 in odd blocks
    # with error feedback on both links (the hub's residual carried over rounds), and an int8
    # uplink with a bf16 downlink. Bounds on Δ's relative L2 error against the true mean of
    # the Δᵢ: two quantizations (each replica's, then the mean's) and the residuals they carry.
    for run in "int4 127 same 0.4" "int8 128 bf16 0.03"; do
        set -- $run
        mkdir -p "$tmp/dump_$1_$3"
        TRAIN_GPT_DILOCO_DUMP="$tmp/dump_$1_$3" "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' \
            $(printf "'%s' " "${common[@]}" "${three[@]}") --max_steps 20 --diloco_transport mpi --diloco_quant $1 \
            --diloco_quant_block $2 --diloco_error_feedback 1 --diloco_downlink $3 \
            --out_dir '$tmp/mpi_$1_$3/'\$OMPI_COMM_WORLD_RANK" >"$tmp/mpi_$1_$3.log" 2>&1 || cat "$tmp/mpi_$1_$3.log"
        check "the reducer's $1 mean (block $2, downlink $3, error feedback) = numpy byte for byte, Δ within $4" \
            "$PYTHON" test/diloco_check.py "$tmp/dump_$1_$3" 0.7 0.9 "$1" "$4" --hub "$3:1:$2"
    done
fi

# ---------------------------------------------------------------- 8. simulated replicas
# (outer_step, param_hash) of every applied outer step in a metrics file, one per line.
same_outer_hashes() {  # same_outer_hashes WANT METRICS_A METRICS_B: ≥ WANT outer steps, all equal
    local a b; a=$(outer_hashes "$2"); b=$(outer_hashes "$3")
    [ "$(printf '%s\n' "$a" | grep -c .)" -ge "$1" ] && [ "$a" = "$b" ] && return 0
    say "    $2: $(printf '%s ' $a)"; say "    $3: $(printf '%s ' $b)"
    return 1
}
"$TRAIN_GPT" "${common[@]}" "${three[@]}" --diloco_transport local --diloco_quant none --out_dir "$tmp/local3" \
    >"$tmp/local3.log" 2>&1 || cat "$tmp/local3.log"
if [ "$HAVE_MPI" = 1 ]; then
    check "3 simulated replicas (local) = 3 MPI processes: param_hash equal at all 8 outer steps, fp32" \
        same_outer_hashes 8 "$tmp/mpi3/0/metrics.jsonl" "$tmp/local3/metrics.jsonl"
    two=(--diloco_replicas 2 --diloco_inner_steps 4 --max_steps 40 --diloco_quant int8 --diloco_error_feedback 1
         --diloco_outer_lr 0.8 --diloco_outer_momentum 0.8 --diloco_nesterov 0 --diloco_momentum_warmup 4
         --diloco_plain_in_decay 1)
    mkdir -p "$tmp/dump_hb"
    TRAIN_GPT_DILOCO_DUMP="$tmp/dump_hb" "${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${two[@]}") \
        --diloco_transport mpi --out_dir '$tmp/mpi2/'\$OMPI_COMM_WORLD_RANK" >"$tmp/mpi2.log" 2>&1 || cat "$tmp/mpi2.log"
    "$TRAIN_GPT" "${common[@]}" "${two[@]}" --diloco_transport local --out_dir "$tmp/local2" >"$tmp/local2.log" 2>&1 ||
        cat "$tmp/local2.log"
    check "2 simulated replicas = 2 MPI processes: param_hash equal at all 10 outer steps, int8 + error feedback" \
        same_outer_hashes 10 "$tmp/mpi2/0/metrics.jsonl" "$tmp/local2/metrics.jsonl"
    # decay_frac 0.2 of 40 steps: the decay phase starts at step 32, so outer steps 9 and 10
    # (landed after steps 36 and 40) are plain averaging.
    check "heavy-ball outer step with a 4-step momentum warm-up and plain averaging in the decay phase = numpy (int8 Δ within 3 %)" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_hb" 0.8 0.8 int8 0.03 0 4 --plain_from 9
fi
check "3 simulated replicas: the loss falls" loss_falls "$tmp/local3/metrics.jsonl"

if [ "$HAVE_TCP" = 1 ]; then
    relay_tcp() {  # relay_tcp NAME: a fresh hub (lib.sh's start_relay, one shard); sets tcp=(...) to reach it
        start_relay "$1" 1
        tcp=(--diloco_transport tcp --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret"
            --diloco_timeout_s 3 --diloco_connect_timeout_s 20)
    }
    # three_over_tcp NAME ARGS...: replicas 0, 1, 2 through the relay of the last relay_tcp into
    # $tmp/NAME/<id> (logs $tmp/NAME_<id>.log, dumps in $tmp/dump_NAME), waited for; rc = the
    # last non-zero exit status. min_replicas 3: on a loaded machine one replica may start a
    # second or more after the others; the rounds before all three are in are skipped (and the
    # latecomers take the group's state), so every applied outer step has all three contributors.
    three_over_tcp() {
        local name=$1 r p
        shift
        mkdir -p "$tmp/dump_$name"
        for r in 0 1 2; do
            TRAIN_GPT_DILOCO_DUMP="$tmp/dump_$name" "$TRAIN_GPT" "${common[@]}" "$@" "${tcp[@]}" --diloco_min_replicas 3 \
                --diloco_replica_id "$r" --out_dir "$tmp/$name/$r" >"$tmp/${name}_$r.log" 2>&1 &
            pids+=($!)
        done
        rc=0
        for p in "${pids[@]: -3}"; do wait "$p" || rc=$?; done
    }
    relay_tcp three
    three_over_tcp tcp3 "${three[@]}" --diloco_quant int8 --max_steps 200
    check "3 replicas over TCP: all exit 0 (rc $rc)" test "$rc" -eq 0
    check "3 replicas over TCP: param_hash equal on every replica at every applied outer step (>= 4)" \
        all_hashes_agree 4 "$tmp"/tcp3/*/metrics.jsonl
    check "3 replicas over TCP: loss falls" loss_falls "$tmp/tcp3/1/metrics.jsonl"
    check "outer step = Nesterov on θ − mean θᵢ (numpy), TCP, int8 Δ within 3 % relative L2" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_tcp3" 0.7 0.9 int8 0.03
    check "the metrics line has every field" grep -q \
        '"outer_step":40,"step":200,"contributors":\[0,1,2\],"applied":true,"bytes_sent":[0-9]*,"bytes_recv":[0-9]*,"sync_s":[0-9.]*,"wait_s":[0-9.]*,"param_hash":"[0-9a-f]\{16\}"' \
        "$tmp/tcp3/0/metrics.jsonl"

    # ---------------------------------------------------------------- 4 + 6. faults
    # Every move waits for what the replicas log, never for a time or a step count, so the test
    # holds on a fast machine (where 600 steps take a second) and on a loaded one alike. The run
    # has no step limit the test could reach: it ends by SIGTERM.
    #   kill -9 replica 2 after its outer step 10; once replica 0 has closed a round without it,
    #   restart it (it resumes from its checkpoint and must rejoin); once all three contribute
    #   again, SIGTERM replica 1 (checkpoint, goodbye, exit 0); once replica 0 has closed a round
    #   with replica 2 alone, SIGTERM the two survivors.
    fault=(--diloco_replicas 3 --diloco_inner_steps 5 --max_steps 100000000 --batch_size 16 --ckpt_every 25
        --diloco_quant int8)
    fdir=fault  # the scenario's directory under $tmp (section 9 runs a second one)
    start_replica() {  # start_replica ID: runs in the background, appends to its log
        "$TRAIN_GPT" "${common[@]}" "${fault[@]}" "${tcp[@]}" --diloco_replica_id "$1" --out_dir "$tmp/$fdir/$1" \
            >>"$tmp/${fdir}_$1.log" 2>&1 &
        pids+=($!)
        eval "fault_pid_$1=$!"
    }
    outer_steps_done() {
        local n; n=$(grep -c '"outer_step":[0-9]*,"step"' "$tmp/$fdir/$1/metrics.jsonl" 2>/dev/null || true)
        echo "${n:-0}"
    }
    last_outer_step() {  # the outer_step of replica ID's newest outer line (0 before the first)
        local k; k=$(grep -o '"outer_step":[0-9]*,"step"' "$tmp/$fdir/$1/metrics.jsonl" 2>/dev/null | tail -n 1 | tr -dc '0-9')
        echo "${k:-0}"
    }
    # The outer steps of replica ID's outer lines after its outer step AFTER with exactly these
    # contributors (e.g. 0,1,2), one per line; rounds_with counts them, first_round_with takes
    # the first.
    rounds_after() {  # rounds_after ID AFTER CONTRIBUTORS
        grep -o '"outer_step":[0-9]*,"step":[0-9]*,"contributors":\['"$3"'\]' "$tmp/$fdir/$1/metrics.jsonl" 2>/dev/null |
            sed 's/"outer_step":\([0-9]*\).*/\1/' | awk -v a="$2" '$1 > a'
    }
    rounds_with() { rounds_after "$@" | wc -l; }
    first_round_with() { rounds_after "$@" | head -n 1; }
    relay_tcp faults
    for r in 0 1 2; do start_replica $r; done
    wait_until "replica 2 reaches outer step 10" eval '[ "$(outer_steps_done 2)" -ge 10 ]'
    kill -9 "$fault_pid_2" 2>/dev/null || true
    wait "$fault_pid_2" 2>/dev/null || true
    killed_at=$(last_outer_step 0)
    wait_until "replica 0 closes a round without replica 2" eval '[ "$(rounds_with 0 "$killed_at" 0,1)" -ge 1 ]'
    # Rounds after the first one without replica 2 can hold it only once it is back (replica
    # 0's log may lag replica 2's by a round, so killed_at alone could still see the old one).
    dropped_at=$(first_round_with 0 "$killed_at" 0,1)
    start_replica 2
    wait_until "replica 2 contributes again" eval '[ "$(rounds_with 0 "$dropped_at" 0,1,2)" -ge 1 ]'
    kill -TERM "$fault_pid_1" 2>/dev/null || true
    rc1=0; wait "$fault_pid_1" || rc1=$?
    left_at=$(last_outer_step 0)
    wait_until "replica 0 closes a round with replica 2 alone" eval '[ "$(rounds_with 0 "$left_at" 0,2)" -ge 1 ]'
    kill -TERM "$fault_pid_0" "$fault_pid_2" 2>/dev/null || true
    rc0=0; wait "$fault_pid_0" || rc0=$?
    rc2=0; wait "$fault_pid_2" || rc2=$?
    check "faults: the surviving replicas stop cleanly on SIGTERM (rc $rc0, $rc2)" test "$rc0" -eq 0 -a "$rc2" -eq 0
    check "SIGTERM: replica 1 exits 0 after a checkpoint (rc $rc1)" \
        sh -c "[ $rc1 -eq 0 ] && grep -q '\"event\":\"stop\"' '$tmp/fault/1/metrics.jsonl'"
    survivor_rounds() {  # survivor_rounds: checks on replica 0's outer lines, in order
        "$PYTHON" - "$tmp/fault/0/metrics.jsonl" "$1" <<'PY'
import json, sys
lines = [d for d in map(json.loads, open(sys.argv[1])) if "contributors" in d]
what = sys.argv[2]
without2 = [d for d in lines if d["contributors"] == [0, 1]]
rejoined = [i for i, d in enumerate(lines) if d["contributors"] == [0, 1, 2]]
if what == "dropped":      # after the kill: rounds of 0 and 1 only, none slower than timeout + 5 s
    ok = len(without2) >= 1 and all(d["sync_s"] <= 3 + 5 for d in lines)
elif what == "rejoined":   # and later all three again
    ok = len(without2) >= 1 and rejoined and rejoined[-1] > lines.index(without2[0])
elif what == "left":       # after SIGTERM: rounds of 0 and 2, none held far past a timeout
    # Not sync_s < timeout (3 s): the hub closes a round 3 s after its first contribution at the
    # latest, so a survivor 2.5-3 s late under load put the other's sync_s at 3 s. That the round
    # did not wait for replica 1 is the goodbye in the hub's log (the check after this one); this
    # bound only catches a round held well past the timeout.
    after = [d for d in lines if d["contributors"] == [0, 2]]
    ok = len(after) >= 1 and all(d["sync_s"] < 3 + 2 for d in after)
print(what, "ok" if ok else "NOT ok", [(d["outer_step"], d["contributors"], round(d["sync_s"], 2)) for d in lines
      if d["contributors"] != [0, 1, 2]][:8], file=sys.stderr)
sys.exit(0 if ok else 1)
PY
    }
    check "kill -9: the others close each round without it, within timeout + 5 s" survivor_rounds dropped
    check "restarted, replica 2 rejoins (all three contribute again)" survivor_rounds rejoined
    check "restarted, replica 2 took the group's state" grep -q '"event":"diloco_join"' "$tmp/fault/2/metrics.jsonl"
    check "after the faults, replica 2's param_hash equals replica 0's at every outer step both logged" \
        all_hashes_agree 1 "$tmp/fault/0/metrics.jsonl" "$tmp/fault/2/metrics.jsonl"
    check "SIGTERM: the others go on without replica 1 (rounds of 0 and 2, none held past timeout + 2 s)" \
        survivor_rounds left
    check "SIGTERM: replica 1 said goodbye: the hub dropped it at once, not at a timeout" \
        grep -q 'replica 1 (.*) left (goodbye)' "$tmp/relay_faults.log"
fi

# ---------------------------------------------------------------- 9. streaming
# 4 layers in 4 fragments of one layer each, H = 12: fragment p syncs after inner steps
# 3, 6, 9, 0 (mod 12) and lands 2 inner steps later, merging with α = 0.5.
stream=(--n_layer 4 --diloco_inner_steps 12 --diloco_fragments 4 --diloco_overlap_steps 2 --diloco_quant int8
    --diloco_error_feedback 1 --diloco_outer_lr 0.7 --diloco_outer_momentum 0.9 --diloco_momentum_warmup 3
    --diloco_plain_in_decay 0)
if [ "$HAVE_MPI" = 1 ]; then
    mkdir -p "$tmp/dump_stream"
    TRAIN_GPT_DILOCO_DUMP="$tmp/dump_stream" "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' \
        $(printf "'%s' " "${common[@]}" "${stream[@]}") --diloco_replicas 3 --max_steps 48 --diloco_transport mpi \
        --out_dir '$tmp/smpi/'\$OMPI_COMM_WORLD_RANK" >"$tmp/smpi.log" 2>&1 || cat "$tmp/smpi.log"
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" --diloco_replicas 3 --max_steps 48 --diloco_transport local \
        --out_dir "$tmp/slocal" >"$tmp/slocal.log" 2>&1 || cat "$tmp/slocal.log"
    # 15 fragment syncs overlapping inner steps + 4 final ones after step 48.
    check "streaming, 3 simulated replicas = 3 MPI processes: param_hash equal at all 19 fragment syncs" \
        same_outer_hashes 19 "$tmp/smpi/0/metrics.jsonl" "$tmp/slocal/metrics.jsonl"
    check "streaming over MPI: param_hash equal on every replica at every fragment sync" \
        all_hashes_agree 19 "$tmp"/smpi/*/metrics.jsonl
    check "streaming: each fragment's outer step (Nesterov, warm-up per fragment) and merge = numpy" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_stream" 0.7 0.9 int8 0.03 1 3 4 0.5
    # The final syncs after the last step need not follow the schedule's order: 2 fragments,
    # H = 8 (syncs after steps 4, 8, 12, ...), 13 steps: fragment 0 syncs at 4 and 12, 1 at 8,
    # then both once more. The momentum warm-up (10) counts each fragment's own syncs, so
    # fragment 0's final one is its 3rd (round 3 would say 2). Δ of a final sync one step
    # after the last regular one is tiny, so its int8 error is large against it: bound 0.2.
    mkdir -p "$tmp/dump_final"
    TRAIN_GPT_DILOCO_DUMP="$tmp/dump_final" "${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") \
        --max_steps 13 --diloco_replicas 2 --diloco_inner_steps 8 --diloco_fragments 2 --diloco_outer_lr 0.7 \
        --diloco_outer_momentum 0.9 --diloco_momentum_warmup 10 --diloco_plain_in_decay 0 --diloco_quant int8 --diloco_transport mpi \
        --out_dir '$tmp/sfinal/'\$OMPI_COMM_WORLD_RANK" >"$tmp/sfinal.log" 2>&1 || cat "$tmp/sfinal.log"
    check "streaming: the final syncs' momentum warm-up counts each fragment's own syncs = numpy" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_final" 0.7 0.9 int8 0.2 1 10 2
    check "streaming: the merges happen (15 merge dumps per replica)" \
        test "$(ls "$tmp/dump_stream" | grep -c '^merge_0_')" -eq 15
    check "streaming: the metrics line names the fragment and the steps in flight" grep -q \
        '"outer_step":5,"step":17,.*"fragment":0,"fragment_hash":"[0-9a-f]\{16\}","began_at_step":15,"steps_in_flight":2' \
        "$tmp/smpi/1/metrics.jsonl"
    check "streaming: the step lines say how long each step waited for DiLoCo (stall_ms)" \
        grep -q '"step":48,.*"stall_ms":[0-9.]*}' "$tmp/smpi/0/metrics.jsonl"

    # Stop after step 16: fragment 0 began after step 15 and lands after 17. The checkpoint
    # waits for it (state.json: merge due at step 17); the resumed run must be bit-exact.
    sres=(--diloco_replicas 1 --max_steps 30 --ckpt_every 8 --diloco_transport mpi)
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${sres[@]}" --out_dir "$tmp/s_straight" >/dev/null 2>&1
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${sres[@]}" --out_dir "$tmp/s_stop" --stop_at_step 16 >/dev/null 2>&1
    check "streaming: a checkpoint with a fragment in flight records its pending merge" \
        grep -q '"outer_merge_step": 17' "$tmp/s_stop/step_00000016/state.json"
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${sres[@]}" --out_dir "$tmp/s_stop" >/dev/null 2>&1
    check "streaming: stop with a fragment in flight + resume: model, optimizer, outer state bit-exact" \
        same_bytes "$tmp/s_straight" "$tmp/s_stop" step_00000030 model.safetensors optimizer.safetensors \
        outer.safetensors
    # The same one step before the decay phase, with plain averaging in it: 39 steps, the decay
    # after step 31; fragment 1 began after step 30 and lands after 32, in the decay phase (lr 1,
    # μ 0). Stopped after 31, the checkpoint lands it early; it must still take the decay's
    # settings (it took Nesterov's: the step it landed at, 31, is before the decay).
    dres=(--diloco_replicas 1 --max_steps 39 --ckpt_every 8 --diloco_transport mpi --diloco_plain_in_decay 1
        --diloco_decay_inner_steps 0)
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${dres[@]}" --out_dir "$tmp/d_straight" >/dev/null 2>&1
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${dres[@]}" --out_dir "$tmp/d_stop" --stop_at_step 31 >/dev/null 2>&1
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${dres[@]}" --out_dir "$tmp/d_stop" >/dev/null 2>&1
    check "streaming: a round in flight into the decay phase, stopped before it lands + resume: bit-exact" \
        same_bytes "$tmp/d_straight" "$tmp/d_stop" step_00000039 model.safetensors optimizer.safetensors \
        outer.safetensors
    # Stopped after step 10 (fragment 2 began after 9 and landed in the checkpoint, its merge due
    # at 11), resumed with H = 18: the merge at 11 is fragment 2's, whose θ landed (state.json
    # names it); it was the new schedule's fragment at that step, 1, whose θ never landed.
    hres=(--diloco_replicas 1 --max_steps 39 --diloco_transport mpi --diloco_decay_inner_steps 0)
    "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${hres[@]}" --out_dir "$tmp/h_stop" --stop_at_step 10 >/dev/null 2>&1
    mkdir -p "$tmp/dump_h"
    TRAIN_GPT_DILOCO_DUMP="$tmp/dump_h" "$TRAIN_GPT" "${common[@]}" "${stream[@]}" "${hres[@]}" --out_dir "$tmp/h_stop" \
        --diloco_inner_steps 18 >"$tmp/h_stop.log" 2>&1
    check "... and the resume says which DiLoCo setting changed" \
        grep -q "resume: DiLoCo settings differ from the checkpoint's: diloco_inner_steps 12 → 18; the new run's apply from step 10" \
        "$tmp/h_stop.log"
    check "streaming: resumed with another H, the pending merge is the landed fragment's (2), named in state.json" \
        sh -c "grep -q '\"outer_merge_fragment\": 2,' '$tmp/h_stop/step_00000010/state.json' &&
               test -f '$tmp/dump_h/merge_0_00003_2.f32' && ! test -e '$tmp/dump_h/merge_0_00003_1.f32'"
fi

if [ "$HAVE_TCP" = 1 ]; then
    relay_tcp stream
    three_over_tcp stcp "${stream[@]}" --diloco_replicas 3 --max_steps 96
    check "streaming, 3 replicas over TCP: all exit 0 (rc $rc)" test "$rc" -eq 0
    check "streaming over TCP: param_hash equal on every replica at every applied fragment sync (>= 8)" \
        all_hashes_agree 8 "$tmp"/stcp/*/metrics.jsonl
    check "streaming over TCP: loss falls" loss_falls "$tmp/stcp/1/metrics.jsonl"
    check "streaming over TCP: outer steps and merges = numpy" \
        "$PYTHON" test/diloco_check.py "$tmp/dump_stcp" 0.7 0.9 int8 0.03 1 3 4 0.5

    # Replica 2 SIGKILLs itself halfway through uploading a fragment, on its exchange thread
    # while inner steps go on, in the first round after 3 that all three contributed to
    # (tcp_die_in_upload_after_full:3; min_replicas 3 so that no round counts before all are in).
    # Restarted once replica 0 closed a round without it, it must rejoin and agree.
    fault=(--diloco_replicas 3 "${stream[@]}" --max_steps 100000000 --ckpt_every 24 --diloco_min_replicas 3)
    fdir=sfault
    relay_tcp sfault
    start_replica 0
    start_replica 1
    TRAIN_GPT_FAULT=tcp_die_in_upload_after_full:3 start_replica 2
    wait "$fault_pid_2" 2>/dev/null || true
    wait_until "replica 0 logs 3 rounds with all three" eval '[ "$(rounds_with 0 0 0,1,2)" -ge 3 ]'
    third_full=$(rounds_after 0 0 0,1,2 | sed -n 3p)
    wait_until "replica 0 closes a round without replica 2" eval '[ "$(rounds_with 0 "$third_full" 0,1)" -ge 1 ]'
    killed_in=$(first_round_with 0 "$third_full" 0,1)
    start_replica 2
    wait_until "replica 2 contributes again" eval '[ "$(rounds_with 0 "$killed_in" 0,1,2)" -ge 2 ]'
    kill -TERM "$fault_pid_0" "$fault_pid_1" "$fault_pid_2" 2>/dev/null || true
    rc=0
    for p in "$fault_pid_0" "$fault_pid_1" "$fault_pid_2"; do wait "$p" || rc=$?; done
    check "streaming: replica 2 died with a fragment in flight, after 3 full rounds; that round went on without it" \
        test "$killed_in" -eq $((third_full + 1))
    check "streaming: restarted, replica 2 took the group's state" \
        grep -q '"event":"diloco_join"' "$tmp/sfault/2/metrics.jsonl"
    check "streaming: restarted, replica 2 contributes to rounds again" test "$(rounds_with 0 "$killed_in" 0,1,2)" -ge 2
    check "streaming: after the fault, replica 2's param_hash equals replica 0's at every outer step both logged" \
        all_hashes_agree 1 "$tmp/sfault/0/metrics.jsonl" "$tmp/sfault/2/metrics.jsonl"
    check "streaming faults: all replicas stop cleanly on SIGTERM (rc $rc)" test "$rc" -eq 0
fi

# ---------------------------------------------------------------- a replica that sends NaN
if [ "$HAVE_MPI" = 1 ]; then
    "${MPIRUN[@]}" 3 sh -c "[ \$OMPI_COMM_WORLD_RANK = 1 ] && export TRAIN_GPT_FAULT=diloco_nan_payload:2; exec '$TRAIN_GPT' \
        $(printf "'%s' " "${common[@]}" "${three[@]}") --diloco_transport mpi --out_dir '$tmp/nan/'\$OMPI_COMM_WORLD_RANK" \
        >"$tmp/nan.log" 2>&1 || cat "$tmp/nan.log"
    # The NaN sits in replica 1's first segment: the reducer (rank 0 reduces segment 0) leaves
    # it out of that segment's mean and says so; the step is applied, with finite weights.
    check "a NaN outer gradient from replica 1 is left out of the mean: the reducer says so at outer step 3" \
        grep -q "outer step 3: replica 1's contribution holds NaN/Inf; left out of the mean" "$tmp/nan.log"
    check "the outer step with the NaN contribution is applied" \
        grep -q '"outer_step":3,"step":15,"contributors":\[0,1,2\],"applied":true' "$tmp/nan/1/metrics.jsonl"
    check "after the NaN, all replicas still agree at every outer step" all_hashes_agree 8 "$tmp"/nan/*/metrics.jsonl
fi

# ---------------------------------------------------------------- 5. resume mid-round
ef=(--diloco_replicas 1 --diloco_inner_steps 5 --diloco_quant int8 --diloco_error_feedback 1 --ckpt_every 5)
if [ "$HAVE_MPI" = 1 ]; then
    "$TRAIN_GPT" "${common[@]}" "${ef[@]}" --diloco_transport mpi --out_dir "$tmp/ef_straight" >/dev/null 2>&1
    "$TRAIN_GPT" "${common[@]}" "${ef[@]}" --diloco_transport mpi --out_dir "$tmp/ef_stop" --stop_at_step 7 \
        >/dev/null 2>&1
    check "stop_at_step 7 (mid-round) left outer state in the checkpoint" \
        test -f "$tmp/ef_stop/step_00000007/outer.safetensors"
    "$TRAIN_GPT" "${common[@]}" "${ef[@]}" --diloco_transport mpi --out_dir "$tmp/ef_stop" >/dev/null 2>&1
    check "int8 + error feedback, stop mid-round + resume: model, optimizer, outer state bit-exact" \
        same_bytes "$tmp/ef_straight" "$tmp/ef_stop" step_00000020 model.safetensors optimizer.safetensors \
        outer.safetensors
    # A round that is skipped gives its residual back. Encoding sets r' = (Δ + r) − sent as if
    # what was sent counted; θ and the local weights stay, so the next Δ holds the round's work
    # again, and with r' the part of it not sent counted twice, for good (int4: about a sixth of
    # the round's Δ; a sparse codec: nearly all of it). One replica, int4 with feedback, its
    # payload of outer step 3 (step 15) NaN: the mean is NaN, the step skipped. The residual at
    # step 15 must be step 10's up to fp32 rounding: r' − Δ + decode(sent) rounds each element
    # at |Δ| ≈ 14 |r| (int4's scale is max|Δ|/7), a few 1e-7 × |Δ|; the bug moves it by the
    # round's unsent part, of the order of r itself. Tolerance 1e-4 × max |r|.
    TRAIN_GPT_FAULT=diloco_nan_payload:2 "$TRAIN_GPT" "${common[@]}" "${ef[@]}" --diloco_quant int4 \
        --diloco_transport mpi --out_dir "$tmp/ef_skip" >"$tmp/ef_skip.log" 2>&1 || cat "$tmp/ef_skip.log"
    check "int4 + error feedback, the mean of outer step 3 NaN: the step is skipped" \
        grep -q '"outer_step":3,"step":15,.*"applied":false' "$tmp/ef_skip/metrics.jsonl"
    check "... and the residual after the skipped round is the one before it (error feedback counts no work twice)" \
        "$PYTHON" - "$tmp/ef_skip/step_00000010/outer.safetensors" "$tmp/ef_skip/step_00000015/outer.safetensors" <<'PY'
import json, struct, sys
import numpy as np
def residual(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    parts = [np.frombuffer(b[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]], dtype="<f4")
             for name, t in sorted(head.items()) if name.startswith("outer.residual.")]
    assert parts, path
    return np.concatenate(parts)
before, after = residual(sys.argv[1]), residual(sys.argv[2])
scale = float(np.abs(before).max())
worst = float(np.abs(after - before).max())
print("  residual: max |r(15) − r(10)| = %.3g, %.3g of max |r(10)| = %.3g" % (worst, worst / scale, scale))
sys.exit(0 if scale > 0 and worst <= 1e-4 * scale else 1)
PY

    # Two replicas: each reduces half the segments and keeps their downlink residual (int8
    # downlink with feedback, the defaults), which a checkpoint saves (outer_reducer.bin) and a
    # resume takes back. Before 2026-12 it was lost at the resume: the next mean differed. A
    # wider model (1.2M values: 5 segments of 262,144) gives both replicas segments to reduce.
    ef2() {  # ef2 NAME [--key value]...
        local name=$1; shift
        "${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${ef[@]}" "$@") --diloco_replicas 2 \
            --d_model 192 --d_ff 768 --diloco_transport mpi --out_dir '$tmp/$name/'\$OMPI_COMM_WORLD_RANK" \
            >>"$tmp/$name.log" 2>&1
    }
    ef2 ef2_straight
    ef2 ef2_stop --stop_at_step 7
    check "2 replicas over MPI: the mid-round checkpoint holds each one's downlink residual (outer_reducer.bin)" \
        sh -c "grep -q '  outer_reducer.bin\$' '$tmp/ef2_stop/0/step_00000007/checksums.xxh64' &&
               grep -q '  outer_reducer.bin\$' '$tmp/ef2_stop/1/step_00000007/checksums.xxh64'"
    ef2 ef2_stop
    check "2 replicas over MPI, int8 with downlink feedback, stop mid-round + resume: both bit-exact" \
        sh -c "for r in 0 1; do for f in model.safetensors optimizer.safetensors outer.safetensors; do
                   cmp -s '$tmp/ef2_straight/'\$r/step_00000020/\$f '$tmp/ef2_stop/'\$r/step_00000020/\$f || exit 1
               done; done"
    # With 2 fragments each replica holds several pieces of residual; resumed as the other
    # replica (out_dirs swapped), each lets the saved one go and starts from zero, as with one
    # fragment. The pieces were checked against this replica's shares: refused ("piece 1's
    # layout is inconsistent"), and resume = auto stopped the run.
    ef2 ef2_frag --diloco_fragments 2 --stop_at_step 7
    mv "$tmp/ef2_frag/0" "$tmp/ef2_frag/was0" && mv "$tmp/ef2_frag/1" "$tmp/ef2_frag/0" &&
        mv "$tmp/ef2_frag/was0" "$tmp/ef2_frag/1"
    rc=0
    ef2 ef2_frag --diloco_fragments 2 || rc=$?
    check "2 fragments, resumed with the replicas' out_dirs swapped: both start their residual from zero (rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ \$(grep -c 'downlink residual was replica [01].s of 2; this is replica [01] of 2: it starts from zero' '$tmp/ef2_frag.log') -eq 2 ] &&
               test -f '$tmp/ef2_frag/0/step_00000020/model.safetensors'"
    # One rank's newest checkpoint lost: rank 1 resumes from step 5, rank 0 from step 7, both at
    # outer step 1. Refused at the start in one line naming both steps (it hung: the ranks'
    # per-step collectives paired different steps' calls).
    ef2 ef2_skew --stop_at_step 7
    rm -rf "$tmp/ef2_skew/1/step_00000007"
    rc=0
    timeout 300 "${MPIRUN[@]}" 2 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${ef[@]}") --diloco_replicas 2 \
        --d_model 192 --d_ff 768 --diloco_transport mpi --out_dir '$tmp/ef2_skew/'\$OMPI_COMM_WORLD_RANK" \
        >"$tmp/ef2_skew.log" 2>&1 || rc=$?
    check "MPI ranks resuming at the same outer step from different steps: refused (exit $rc, not a hang)" \
        sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] &&
               grep -q 'rank 1 resumes at step 5 but rank 0 at step 7 (both at outer step 1)' '$tmp/ef2_skew.log'"

    out=$("$TRAIN_GPT" "${common[@]}" "${ef[@]}" --diloco_transport mpi --out_dir "$tmp/from_plain" \
        --resume "$tmp/plain/step_00000020" --max_steps 25 2>&1) || true
    check "a plain checkpoint starts a DiLoCo run (θ = its weights, zero momentum)" \
        sh -c "printf '%s' \"\$1\" | grep -q 'no DiLoCo outer state' && test -f '$tmp/from_plain/step_00000025/outer.safetensors'" _ "$out"
    out=$("$TRAIN_GPT" "${common[@]}" --diloco_replicas 2 --diloco_inner_steps 5 --diloco_transport local \
        --out_dir "$tmp/local_from" --resume "$tmp/plain/step_00000020" --max_steps 25 2>&1) || true
    check "simulated replicas from a checkpoint say their outer state starts afresh" \
        sh -c "printf '%s' \"\$1\" | grep -q 'simulated replicas start their outer state afresh at step 20'" _ "$out"
fi

# ---------------------------------------------------------------- 7. configuration errors
check "tcp without a secret file: error names diloco_secret_file" \
    one_line_error diloco_secret_file --diloco_replicas 2 --diloco_replica_id 0 --diloco_rendezvous 127.0.0.1:1
check "tcp without a replica id: error names diloco_replica_id" \
    one_line_error diloco_replica_id --diloco_replicas 2 --diloco_rendezvous 127.0.0.1:1 --diloco_secret_file "$tmp/secret"
check "replica id out of range: error names diloco_replica_id" \
    one_line_error diloco_replica_id --diloco_replicas 2 --diloco_replica_id 2 --diloco_rendezvous 127.0.0.1:1 \
    --diloco_secret_file "$tmp/secret"
printf 'short\n' >"$tmp/short_secret"
check "a secret under 16 bytes: error names diloco_secret_file" \
    one_line_error diloco_secret_file --diloco_replicas 2 --diloco_replica_id 0 --diloco_rendezvous 127.0.0.1:1 \
    --diloco_secret_file "$tmp/short_secret"
if [ "$HAVE_TCP" = 1 ]; then
    nobody=$(free_port)
    check "no hub at the rendezvous: error within diloco_connect_timeout_s names it" \
        one_line_error "127.0.0.1:$nobody" --diloco_replicas 2 --diloco_replica_id 0 \
        --diloco_rendezvous "127.0.0.1:$nobody" --diloco_secret_file "$tmp/secret" --diloco_connect_timeout_s 1
else
    check "a build without OpenSSL refuses diloco_transport = tcp in one line naming it" \
        one_line_error 'built without OpenSSL' --diloco_replicas 2 --diloco_replica_id 0 \
        --diloco_rendezvous 127.0.0.1:1 --diloco_secret_file "$tmp/secret"
fi
if [ "$HAVE_MPI" = 1 ]; then
    check "mpi with diloco_replicas 2 in a world of 1: error names diloco_replicas" \
        one_line_error diloco_replicas --diloco_replicas 2 --diloco_transport mpi
fi

finish test_diloco
