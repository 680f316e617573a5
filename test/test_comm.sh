# llmc/comm.h's collectives on 2 and 4 MPI ranks (oversubscribed: 2 cores): every rank checks
# the all-gather, the reduce-scatter (the fp32 sum in rank order, bit for bit), the sum of a
# double, their non-blocking forms, and the same inside even / odd groups (test/test_comm.c;
# make test also runs it as one rank). Without MPI in the build: skipped, and said so.
. "$(dirname "$0")/lib.sh"
require_mpi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for np in 2 4; do check_ranks "$np" "$BUILD/test_comm" "$tmp/np$np.log"; done
# mpirun inside a SLURM allocation: the batch step's SLURM_PROCID = 0, SLURM_LOCALID = 0 and
# SLURM_NTASKS reach every rank; they took rank 0 and local rank 0 (one GPU for all).
SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_NTASKS_PER_NODE=1 \
    check_ranks 2 "$BUILD/test_comm" "$tmp/stale_slurm.log"
# A launcher's variable that is not a whole number: one line naming it (atoi read 4x as 4).
rc=0
"$TOOL" shard "$tmp/train.bin" 64 0 20000 11
SLURM_PROCID=0 SLURM_NTASKS=4x "$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 4 \
    --out_dir "$tmp/bad_env" >"$tmp/bad_env.log" 2>&1 || rc=$?
check "SLURM_NTASKS=4x: one line naming it (rc $rc)" \
    sh -c "[ $rc -ne 0 ] && grep -q \"launcher: SLURM_NTASKS='4x' is not a whole number\" '$tmp/bad_env.log'"
# Run without srun inside an allocation of 4 tasks (the batch step's SLURM_NTASKS): one line
# saying so; it said "fsdp_size: 4 does not divide the job's 1 ranks", a key never set.
rc=0
SLURM_PROCID=0 SLURM_NTASKS=4 "$TRAIN_GPT" test/configs/tiny_test.conf --train_data "$tmp/train.bin" --max_steps 4 \
    --out_dir "$tmp/no_srun" >"$tmp/no_srun.log" 2>&1 || rc=$?
check "SLURM_NTASKS=4 in a process started alone: one line saying the launcher and MPI disagree (rc $rc)" \
    sh -c "[ $rc -ne 0 ] && grep -q \"the launcher's environment (slurm) says 4 ranks, but MPI's world has 1\" '$tmp/no_srun.log' &&
           ! grep -q fsdp_size '$tmp/no_srun.log'"
finish test_comm
