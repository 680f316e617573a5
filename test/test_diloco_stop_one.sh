# A signal that reaches one rank of a DiLoCo replica of several ranks while the hub holds its
# join stops the whole replica at once (train_gpt.cu job_stop, llmc/comm.c comm_flag): the rank
# tells the others, which may wait outside any collective (in their own join, or as an HSDP copy
# waiting for the first's answer). A replica started alone with diloco_min_replicas 2 is held by
# the hub (its join waits for a second replica that never comes); once every rank's hub holds
# its join (the relay logs it), one rank gets the signal:
#   1. FSDP, 2 ranks, SIGUSR1 to rank 1: the job exits 76 (a requeue), rank 0 saying it was
#      stopped by signal 10 while waiting to join;
#   2. the same with the signal to rank 0;
#   3. HSDP, 1 shard × 2 copies, SIGTERM to the second copy (which never talks to the hub): the
#      job exits 0.
# (4., below: replicas of their own in one launch are warned of their collision.)
# Before: the ranks told nothing waited for the hub with no deadline (until a second replica
# came), and the job never ended. Every wait is for an event (relay lines, the job's exit).
. "$(dirname "$0")/lib.sh"
require_mpi
require_tcp
tmp_with_processes
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
make_secret "$tmp/secret"
common=(test/configs/tiny_test.conf --device cpu --train_data "$tmp/train.bin" --val_every 0 --threads 1
    --log_every 1000 --ckpt_keep 0 --diloco_replicas 2 --diloco_inner_steps 5 --diloco_transport tcp
    --diloco_secret_file "$tmp/secret" --diloco_timeout_s 3 --diloco_connect_timeout_s 30 --diloco_min_replicas 2
    --max_steps 40)

founds() { [ "$(grep -c 'replica 0 joined: founds the group' "$1")" -ge "$2" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }

scenario() {  # scenario NAME SHARDS COPIES RANK SIGNAL STATUS
    local name=$1 shards=$2 copies=$3 rank=$4 sig=$5 want=$6 job victim rc=0 r
    start_relay "$name" "$shards"
    "${MPIRUN[@]}" $((shards * copies)) "$TRAIN_GPT" "${common[@]}" --fsdp_size "$shards" --dp_replicate "$copies" \
        --diloco_rendezvous "127.0.0.1:$port" --diloco_replica_id 0 --out_dir "$tmp/$name" >"$tmp/$name.log" 2>&1 &
    job=$!
    pids+=("$job")
    wait_until "$name: every hub holds the join" founds "$tmp/relay_$name.log" "$shards" ||
        die "$name: the hub never held replica 0's join"
    wait_until "$name: rank $rank's pid" rank_pid "$job" "$rank" >/dev/null || die "$name: no rank $rank"
    victim=$(rank_pid "$job" "$rank")
    kill -"$sig" "$victim"
    WAIT_LIMIT_S=120 wait_until "$name: the job ends" gone "$job" || die "$name: the job kept waiting for the hub"
    wait "$job" || rc=$?
    check "$name: SIG$sig to rank $rank of $((shards * copies)) stops the job with status $want (got $rc)" \
        [ "$rc" -eq "$want" ]
    check "$name:   rank 0 (which speaks for the job) says it stopped by that signal while waiting to join" \
        grep -q "rank 0: stopped by signal $(kill -l "$sig") at step 0 while waiting to join the group" "$tmp/$name.log"
    if [ "$rc" -ne "$want" ] || [ -n "${VERBOSE:-}" ]; then cat "$tmp/$name.log"; fi
}
scenario fsdp_rank1 2 1 1 USR1 76
scenario fsdp_rank0 2 1 0 USR1 76
scenario hsdp_copy 1 2 1 TERM 0
# 4. Ranks of one launch that are replicas of their own over tcp (fsdp_size 1, dp_replicate 0)
#    with one command line: each rank warns that they collide on the out_dir and the id (the
#    second read only that out_dir was "in use by another run"), and the launch fails.
rc=0
"${MPIRUN[@]}" 2 "$TRAIN_GPT" "${common[@]}" --fsdp_size 1 --diloco_rendezvous "127.0.0.1:$(free_port)" \
    --diloco_connect_timeout_s 1 --diloco_replica_id 0 --out_dir "$tmp/own" >"$tmp/own.log" 2>&1 || rc=$?
check "replicas of their own with one command line: the launch fails (rc $rc)" [ "$rc" -ne 0 ]
# (At least one line: the rank that fails first may end the launch before the other says it.)
check "  a rank warns that they collide" grep -q "warning: the launcher says this launch has 2 ranks, and \
fsdp_size and dp_replicate are 0 or 1: each rank is a DiLoCo replica of its own" "$tmp/own.log"
finish test_diloco_stop_one
