# A warm start (docs/diloco.md, "A warm start"): a plain run's checkpoint, then DiLoCo from
# it with init_from = that checkpoint directory, the way BOOM went from one cluster to four.
#   1. 3 replicas over MPI (and simulated, diloco_transport = local) start from the same
#      weights: every replica's first param_hash is the same, and differs from a random init.
#   2. Each replica reads on where the plain run stopped, disjoint from it and from the
#      others: the data position in its checkpoint is the one the documented rule gives (the
#      plain run read 20 micro-batches of 4 rows; at batch 5 over 3 processes each starts at
#      micro-batch ⌈⌈80 / 5⌉ / 3⌉ = 6).
#   3. The outer momentum ramps from 0 over diloco_momentum_warmup outer steps: μ·k/W.
#   4. A checkpoint whose windows differ (seq_len, shuffle) is refused with one line; a
#      model.safetensors alone takes the weights and starts the data at its beginning.
#   5. A replica that joins late (over TCP, evicted from the first exchange: diloco_late)
#      and takes the group's state still reads on from the warm-up: its data position at the
#      end is the other replica's (it once went back to step·grad_accum from the epoch's start,
#      re-reading the warm-up's rows).
#   6. What init_from verifies is what it uses, once: a checkpoint's weights and state.json,
#      hashed by rank 0 of a job alone (a corrupt optimizer.safetensors does not stop it, at
#      np 1 or 2; in an np 2 job stopped in its first step, rank 0 has read at least half the
#      weights' bytes more than rank 1); a corrupt model.safetensors stops it with one line, at
#      np 2 too. Until 2026-12 every rank hashed every file of the checkpoint (168-336 GB each
#      at 14B). A model.safetensors named alone is checked against the checksums.xxh64 beside
#      it (through a link too): until 2026-12 a flipped byte was loaded without a word.
#   7. init_from and a resume: into an out_dir that holds a run begun otherwise (the warm-up's
#      own, as docs/diloco.md's BOOM recipe had it) is refused in one line (it resumed that
#      run without a word, init_from unread); a requeue (the same init_from again) resumes even
#      once the file it began from is gone (it stopped: "no such file"), also spelt otherwise
#      (with a warning: it was refused, no path left to compare); a checkpoint renamed
#      to another step is refused, as a resume refuses it (it was taken).
. "$(dirname "$0")/lib.sh"
tmp_with_processes
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
make_secret "$tmp/secret"
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 0
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0)
detect_mpi
detect_tcp   # part 5 (a relay) needs OpenSSL: skipped without it, and said so

mkdir -p "$tmp/val.bin.d"
"$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/warm" >"$tmp/warm.log" 2>&1 || die "the plain run: $(tail -1 "$tmp/warm.log")"
ckpt="$tmp/warm/step_00000020"
[ -f "$ckpt/model.safetensors" ] || die "the plain run left no checkpoint at step 20"

# W = 3 outer steps of warm-up at μ 0.6: applied outer steps 1, 2, 3, 4 use 0.2, 0.4, 0.6, 0.6.
diloco=(--batch_size 5 --max_steps 20 --diloco_replicas 3 --diloco_inner_steps 5 --diloco_quant none
    --diloco_outer_lr 0.7 --diloco_outer_momentum 0.6 --diloco_momentum_warmup 3 --diloco_plain_in_decay 0
    --init_from "$ckpt")

first_hashes() {  # the param_hash of each replica's first outer step, one per line
    for f in "$@"; do grep -m1 '"outer_step":1,' "$f" | sed -E 's/.*"param_hash":"([0-9a-f]+)".*/\1/'; done
}
join_hashes() {  # the param_hash of its own weights each replica joined with at outer step 0
    for f in "$@"; do grep -m1 '"event":"diloco_member"' "$f" | sed -E 's/.*"param_hash":"([0-9a-f]+)".*/\1/'; done
}
momenta() {  # the outer_momentum of the applied outer steps, space-separated
    "$PYTHON" -c '
import json, sys
print(" ".join("%g" % d["outer_momentum"] for d in map(json.loads, open(sys.argv[1])) if d.get("applied")))' "$1"
}
data_index() { sed -nE 's/.*"data_index": ([0-9]+).*/\1/p' "$1/step_00000020/state.json"; }

if [ "$HAVE_MPI" = 1 ]; then
    "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}" "${diloco[@]}") \
        --diloco_transport mpi --out_dir '$tmp/mpi/'\$OMPI_COMM_WORLD_RANK" >"$tmp/mpi.log" 2>&1 ||
        die "3 replicas from the checkpoint: $(grep -m1 'error' "$tmp/mpi.log")"
    logs=("$tmp"/mpi/0/metrics.jsonl "$tmp"/mpi/1/metrics.jsonl "$tmp"/mpi/2/metrics.jsonl)
    joins=$(join_hashes "${logs[@]}" | sort -u)
    check "the 3 replicas joined with one param_hash ($(printf '%s ' $joins))" test "$(printf '%s\n' "$joins" | grep -c .)" = 1
    "${MPIRUN[@]}" 3 sh -c "exec '$TRAIN_GPT' $(printf "'%s' " "${common[@]}") --batch_size 3 --max_steps 5 \
        --diloco_replicas 3 --diloco_inner_steps 5 --diloco_transport mpi --out_dir '$tmp/cold/'\$OMPI_COMM_WORLD_RANK" \
        >"$tmp/cold.log" 2>&1 || die "3 replicas from a random init: $(grep -m1 'error' "$tmp/cold.log")"
    cold=$(join_hashes "$tmp/cold/0/metrics.jsonl")
    check "... and it is not a random init's ($cold)" test -n "$cold" -a "$cold" != "$joins"
    check "every replica's outer steps agree" test "$(hashes_per_step "${logs[@]}" | grep -cv ':1$')" = 0
    check "each replica read on from micro-batch 6: its position after 20 steps is 26 (got $(data_index "$tmp/mpi/0") $(data_index "$tmp/mpi/1") $(data_index "$tmp/mpi/2"))" \
        test "$(data_index "$tmp/mpi/0") $(data_index "$tmp/mpi/1") $(data_index "$tmp/mpi/2")" = "26 26 26"
    check "the note says where the data goes on" grep -q "each of 3 processes starts at its micro-batch 6 (10 rows skipped)" "$tmp/mpi.log"
    check "the outer momentum ramps 0.2 0.4 0.6 0.6 (got $(momenta "${logs[0]}"))" test "$(momenta "${logs[0]}")" = "0.2 0.4 0.6 0.6"
else
    say "  skip the MPI part: no mpirun or no MPI in this build"
fi

# The same warm start simulated in one process: the same first outer step as over MPI.
"$TRAIN_GPT" "${common[@]}" "${diloco[@]}" --diloco_transport local --out_dir "$tmp/local" >"$tmp/local.log" 2>&1 ||
    die "3 simulated replicas from the checkpoint: $(tail -1 "$tmp/local.log")"
check "simulated replicas: the note says where the data goes on" \
    grep -q "each of 3 processes starts at its micro-batch 6 (10 rows skipped)" "$tmp/local.log"
if [ "$HAVE_MPI" = 1 ]; then
    check "simulated replicas: every outer step's param_hash equals the MPI run's" \
        test "$(outer_hashes "$tmp/local/metrics.jsonl")" = "$(outer_hashes "$tmp/mpi/0/metrics.jsonl")"
fi

# 5. Two replicas over TCP. Replica 0 trains alone (diloco_min_replicas 1) and stops itself at
# step 12; replica 1 starts then, finds the group at outer step 2 and waits for its state;
# replica 0 continues, and replica 1 takes the group's state of outer step 3 (step 15): as it
# stands, or (a loaded machine: replica 0 closed round 3 alone while the state was on its way)
# with round 3's mean applied after it, which lands it at step 20 with the group. The
# stopped replica sends no heartbeats: the hub's timeout (120 s) must outlast replica 1's start
# on a loaded machine, or the hub drops replica 0 and replica 1 founds a group of its own. No
# round waits for it: each closes when its members' contributions are in.
if [ "$HAVE_TCP" = 1 ]; then
    start_relay late 1 120
    late=(--batch_size 5 --max_steps 20 --diloco_replicas 2 --diloco_inner_steps 5 --diloco_quant none
        --diloco_outer_lr 1 --diloco_outer_momentum 0 --init_from "$ckpt" --diloco_transport tcp
        --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_timeout_s 120
        --diloco_connect_timeout_s 120 --diloco_min_replicas 1)
    TRAIN_GPT_FAULT=stop_in_step:12 "$TRAIN_GPT" "${common[@]}" "${late[@]}" --diloco_replica_id 0 \
        --out_dir "$tmp/late/0" >"$tmp/late0.log" 2>&1 &
    p0=$!
    pids+=("$p0")
    stopped_or_gone() { stopped "$1" || ! kill -0 "$1" 2>/dev/null; }
    wait_until "replica 0 stopped itself at step 12" stopped_or_gone "$p0"
    stopped "$p0" || die "replica 0 did not stop: $(tail -1 "$tmp/late0.log")"
    "$TRAIN_GPT" "${common[@]}" "${late[@]}" --diloco_replica_id 1 --out_dir "$tmp/late/1" >"$tmp/late1.log" 2>&1 &
    p1=$!
    pids+=("$p1")
    waiting_or_gone() { grep -q "waits for the group's state" "$tmp/late1.log" || ! kill -0 "$p1" 2>/dev/null; }
    wait_until "replica 1 waiting for the group's state" waiting_or_gone
    grep -q "waits for the group's state" "$tmp/late1.log" || { kill -CONT "$p0"; die "replica 1: $(tail -1 "$tmp/late1.log")"; }
    kill -CONT "$p0"
    wait "$p0" || die "replica 0: $(grep -m1 error "$tmp/late0.log")"
    wait "$p1" || die "replica 1: $(grep -m1 error "$tmp/late1.log")"
    took_step15() {
        grep -q "replica 1 took the group's state: outer step 3, step 15" "$tmp/late1.log" ||
            grep -q "replica 1 caught up: the state of outer step 3, then the means of the 1 round" "$tmp/late1.log"
    }
    check "the late replica took the group's state of step 15" took_step15
    check "... and reads on from the warm-up: both end at micro-batch 28 (8 + 20; got $(data_index "$tmp/late/0") $(data_index "$tmp/late/1"))" \
        test "$(data_index "$tmp/late/0") $(data_index "$tmp/late/1")" = "28 28"
else
    say "  skip part 5 (a late replica over tcp): no OpenSSL in this build"
fi

# Refusals, one line each, and the weights-only form.
check "init_from a checkpoint of another seq_len: one line" \
    one_line_error "seq_len 32, this run's seq_len is 16" --seq_len 16 --init_from "$ckpt"
check "init_from a checkpoint of another data order: one line" \
    one_line_error "was trained with shuffle = 1, seed = 1337, this run has shuffle = 0" --shuffle 0 --init_from "$ckpt"
check "init_from a directory that is not a checkpoint: one line" one_line_error "checksums.xxh64" --init_from "$tmp/val.bin.d"
check "init_from a path that does not exist: one line" one_line_error "no such file or checkpoint" --init_from "$tmp/nope"
"$TRAIN_GPT" "${common[@]}" --init_from "$ckpt/model.safetensors" --max_steps 5 --out_dir "$tmp/weights" \
    >"$tmp/weights.log" 2>&1 || die "init_from a model.safetensors: $(tail -1 "$tmp/weights.log")"
check "init_from a model.safetensors takes the weights and starts the data at its beginning (position 5 after 5 steps)" \
    test "$(sed -nE 's/.*"data_index": ([0-9]+).*/\1/p' "$tmp/weights/step_00000005/state.json")" = 5

# 6. A byte flipped (the low bit: the values stay finite) in a copy of the checkpoint's file.
corrupt_copy() {  # corrupt_copy NAME FILE: $tmp/NAME/step_00000020, FILE in it with one byte flipped
    mkdir -p "$tmp/$1"
    cp -r "$ckpt" "$tmp/$1/"
    "$PYTHON" -c '
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) - 100] ^= 1
open(path, "wb").write(bytes(data))' "$tmp/$1/step_00000020/$2"
}
corrupt_copy badopt optimizer.safetensors
corrupt_copy badmodel model.safetensors
"$TRAIN_GPT" "${common[@]}" --max_steps 4 --init_from "$tmp/badopt/step_00000020" --out_dir "$tmp/badopt1" \
    >"$tmp/badopt1.log" 2>&1 || true
check "init_from does not hash the moments it does not use: a corrupt optimizer.safetensors does not stop it" \
    test -d "$tmp/badopt1/step_00000004"
check "init_from a checkpoint whose model.safetensors is corrupt: one line" \
    one_line_error "step_00000020': model.safetensors fails its checksum" --init_from "$tmp/badmodel/step_00000020"
check "init_from its model.safetensors alone: checked against the checksums.xxh64 beside it, one line" \
    one_line_error "model.safetensors': model.safetensors fails its checksum" \
    --init_from "$tmp/badmodel/step_00000020/model.safetensors"
ln -s "$tmp/badmodel/step_00000020/model.safetensors" "$tmp/linked.safetensors"
check "... and through a link to it" one_line_error "fails its checksum" --init_from "$tmp/linked.safetensors"
# The corrupt file's line made malformed (its digits upper-case, as no xxhsum -H64 writes): it
# was read as not listed, and the weights were taken unchecked.
cp -r "$tmp/badmodel" "$tmp/badline"
sed -i 's/^\([0-9a-f]*\)\(  model.safetensors\)$/\U\1\E\2/' "$tmp/badline/step_00000020/checksums.xxh64"
check "... and its line in checksums.xxh64 malformed: one line" \
    one_line_error "checksums.xxh64 beside it is malformed" --init_from "$tmp/badline/step_00000020/model.safetensors"
# ... while a line of another name the parser does not read (a space in it, as xxhsum -H64 writes
# for such a file) is not this file's: the sound weights load.
cp -r "$tmp/warm" "$tmp/spaced"
printf '0123456789abcdef  notes v2.txt\n' >>"$tmp/spaced/step_00000020/checksums.xxh64"
"$TRAIN_GPT" "${common[@]}" --max_steps 4 --init_from "$tmp/spaced/step_00000020/model.safetensors" \
    --out_dir "$tmp/spaced_run" >"$tmp/spaced.log" 2>&1 || true
check "... and a line for 'notes v2.txt' beside it does not stop it" test -d "$tmp/spaced_run/step_00000004"
if [ "$HAVE_MPI" = 1 ]; then
    rc=0
    "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --max_steps 4 --init_from "$tmp/badopt/step_00000020" \
        --out_dir "$tmp/badopt2" >"$tmp/badopt2.log" 2>&1 || rc=$?
    check "np 2: a corrupt optimizer.safetensors does not stop init_from (rc $rc)" \
        sh -c "[ $rc -eq 0 ] && test -d '$tmp/badopt2/step_00000004'"
    # An np 2 job (FSDP) from the sound checkpoint stops itself in its first step: what each
    # rank has read by then (rank 0 once read as much as rank 1: both hashed every file).
    TRAIN_GPT_FAULT=stop_in_step:0 "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --max_steps 4 --init_from "$ckpt" \
        --out_dir "$tmp/reads2" >"$tmp/reads2.log" 2>&1 &
    job=$!
    pids+=("$job")
    rank_of() { rank_pid "$job" "$1" || true; }   # lib.sh's, empty while not found
    both_stopped_or_gone() { { stopped "$(rank_of 0)" && stopped "$(rank_of 1)"; } || ! kill -0 "$job" 2>/dev/null; }
    wait_until "both ranks in their first step" both_stopped_or_gone || true
    read_bytes() { sed -n 's/^rchar: //p' "/proc/$1/io" 2>/dev/null || true; }   # all its reads so far
    r0=$(read_bytes "$(rank_of 0)") r1=$(read_bytes "$(rank_of 1)")
    for r in 0 1; do p=$(rank_of $r); [ -z "$p" ] || kill -CONT "$p"; done
    rc=0; wait "$job" || rc=$?
    weights=$(stat -c %s "$ckpt/model.safetensors")
    check "np 2: only rank 0 hashed the weights: it read ${r0:-?} bytes, rank 1 ${r1:-?}, at least $((weights / 2)) fewer (rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ -n '$r0' ] && [ -n '$r1' ] && [ $((${r0:-0} - ${r1:-0})) -ge $((weights / 2)) ]"
    rc=0
    "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --init_from "$tmp/badmodel/step_00000020" --out_dir "$tmp/badmodel2" \
        >"$tmp/badmodel2.log" 2>&1 || rc=$?
    check "np 2: a corrupt model.safetensors stops the job (rc $rc) with the line naming it" \
        sh -c "[ $rc -ne 0 ] && [ \$(grep -c \"error: init_from: checkpoint '$tmp/badmodel/step_00000020': model.safetensors fails its checksum\" '$tmp/badmodel2.log') -ge 1 ]"
    rc=0
    "${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --init_from "$tmp/badmodel/step_00000020/model.safetensors" \
        --out_dir "$tmp/badfile2" >"$tmp/badfile2.log" 2>&1 || rc=$?
    check "np 2: ... and named alone (rc $rc)" \
        sh -c "[ $rc -ne 0 ] && grep -q \"error: init_from: '$tmp/badmodel/step_00000020/model.safetensors': model.safetensors fails its checksum\" '$tmp/badfile2.log'"
fi
# 7. init_from and a resume.
rc=0
"$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/warm" --init_from "$ckpt" --max_steps 30 >"$tmp/samedir.log" 2>&1 || rc=$?
check "init_from into the out_dir of a run begun without it: refused in one line (rc $rc)" \
    sh -c "[ $rc -ne 0 ] && [ \$(grep -c 'error:' '$tmp/samedir.log') -eq 1 ] &&
        grep -q \"init_from: out_dir '$tmp/warm' holds checkpoints of a run that began without init_from\" '$tmp/samedir.log'"
check "... and the warm-up's checkpoints are as they were (newest step 20)" \
    sh -c "[ \"\$(ls '$tmp/warm' | grep -c '^step_')\" -ge 1 ] && [ ! -e '$tmp/warm/step_00000030' ]"
cp "$ckpt/model.safetensors" "$tmp/begin.safetensors"
requeue=("${common[@]}" --max_steps 6 --init_from "$tmp/begin.safetensors" --out_dir "$tmp/requeue")
"$TRAIN_GPT" "${requeue[@]}" --stop_at_step 3 >"$tmp/requeue1.log" 2>&1 || die "init_from, stopped at 3: $(tail -1 "$tmp/requeue1.log")"
[ -d "$tmp/requeue/step_00000003" ] || die "the stop at step 3 left no checkpoint"
rm "$tmp/begin.safetensors"
rc=0
"$TRAIN_GPT" "${requeue[@]}" >"$tmp/requeue2.log" 2>&1 || rc=$?
check "a requeue resumes though the file it began from is gone (rc $rc: $(grep -m1 error "$tmp/requeue2.log"))" \
    sh -c "[ $rc -eq 0 ] && grep -q 'resuming from .*step_00000003' '$tmp/requeue2.log' && [ -d '$tmp/requeue/step_00000006' ]"
"$TRAIN_GPT" "${common[@]}" --max_steps 6 --init_from "$tmp/./begin.safetensors" --out_dir "$tmp/requeue" \
    >"$tmp/requeue3.log" 2>&1 && rc=0 || rc=$?
check "... and spelt otherwise once it is gone: resumed with a warning (rc $rc; it was refused: no realpath to compare)" \
    sh -c "[ $rc -eq 0 ] && grep -q \"init_from: '$tmp/./begin.safetensors' is not there\" '$tmp/requeue3.log'"
check "... and with another init_from, the same out_dir is refused in one line" \
    one_line_error "holds checkpoints of a run that began from '$tmp/begin.safetensors'" \
    --max_steps 8 --out_dir "$tmp/requeue" --init_from "$ckpt/model.safetensors"
mkdir -p "$tmp/renamed"
cp -r "$ckpt" "$tmp/renamed/step_00000010"
check "init_from a checkpoint renamed to another step: one line" \
    one_line_error "its name says step 10, its state.json says step 20" --init_from "$tmp/renamed/step_00000010"
finish test_diloco_warm
