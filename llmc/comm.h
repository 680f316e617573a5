// llmc/comm.h — collectives among the ranks of one job: what the ranks of one replica will use
// to shard the model (FSDP / HSDP, issue #14). Two implementations behind one interface: MPI
// (the CPU backend, and the CPU side of a GPU job), and — later — NCCL on GPUs. Without MPI in
// the build, or in a job of one rank, the world is one rank and every collective is a copy.
//
// Every reduction sums in rank order (rank 0 first), on every rank, so that the same world
// size gives the same bits run after run: reduce-scatter is an all-to-all followed by a local
// sum in rank order, never the MPI library's own reduction, whose order it does not promise.
#ifndef TRAIN_GPT_COMM_H
#define TRAIN_GPT_COMM_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Who this process is in the job, from the launcher's environment: Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK), MPICH / Intel MPI (PMI_RANK, PMI_SIZE,
// MPI_LOCALRANKID), SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) — in that order: a
// batch step's stale SLURM variables reach mpirun's ranks — or rank 0 of 1. Fatal, with one
// line, on a value that is not a whole number. A rank picks its GPU from local_rank.
typedef struct {
    int rank, size, local_rank;
    int local_size;             // ranks on this node: SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE,
                                // MPI_LOCALNRANKS; size when the launcher does not say (fsdp_size = 0's group)
    int node_ranks;             // the same, or under srun without SLURM_NTASKS_PER_NODE this node's entry of
                                // SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("4(x2),3"): the ranks
                                // that share this node's memory (the CPU budget), which may differ by node
    const char *launcher;       // "slurm", "openmpi", "pmi" or "none"
    bool node_ranks_known;      // the launcher said node_ranks (else it is the job's size: a guess)
} launch_info;
launch_info launch_detect(void);
// The tasks on node `node` (0-based) of SLURM's per-node list, "4(x2),3" (4 on nodes 0 and 1,
// 3 on node 2); 0 when the list does not say (malformed, or too few nodes).
int slurm_tasks_on_node(const char *spec, int node);

typedef struct comm comm;

// The job's ranks: MPI's world (MPI is initialised here, asking for MPI_THREAD_MULTIPLE) when
// the build has MPI and the launcher started more than one rank, or when MPI was initialised
// already; a world of one otherwise. Fatal, with one line, when the launcher says several
// ranks but the build has no MPI. Owned by this module (do not free).
comm *comm_world(void);
// Ranks with the same color form a group, ordered by key (then by rank): MPI_Comm_split.
comm *comm_split(const comm *c, int color, int key);
void comm_free(comm *c);   // a group from comm_split
// Finalises MPI if it was initialised (once every group is freed, at the end of the process).
void comm_finish(void);
int comm_rank(const comm *c);
int comm_size(const comm *c);

// all[size·n] ← every rank's mine[n], in rank order.
void comm_allgather(const comm *c, const float *mine, int64_t n, float *all);
// mine[n] ← Σ over ranks r (in order) of rank r's all[rank·n .. rank·n + n). all holds size·n.
void comm_reduce_scatter(const comm *c, const float *all, int64_t n, float *mine);
// Σ over ranks of x, in rank order, the same on every rank.
double comm_sum(const comm *c, double x);

// x[n] ← Σ over ranks of x, in rank order, the same bits on every rank (a reduce-scatter and
// an all-gather over chunks: about two chunks of extra memory, whatever n).
void comm_allreduce(const comm *c, float *x, int64_t n);
// The largest x over ranks; root's bytes to every rank.
double comm_max(const comm *c, double x);
void comm_broadcast(const comm *c, void *data, int64_t bytes, int root);

// The same two, started now and finished by comm_wait (the caller keeps every buffer alive
// and untouched until then): a layer's all-gather runs while the previous layer computes.
typedef struct comm_request comm_request;
comm_request *comm_iallgather(const comm *c, const float *mine, int64_t n, float *all);
comm_request *comm_ireduce_scatter(const comm *c, const float *all, int64_t n, float *mine);
void comm_wait(comm_request *r);

// Every wait for a collective gives up after comm_timeout_s with a one-line fatal error naming
// this rank and the collective: a rank that died or hangs ends the job instead of leaving the
// others waiting forever (launchers that kill the job first are fine too). It must exceed the
// longest time one rank may spend alone between two collectives (rank 0 hashing a checkpoint,
// a DiLoCo exchange): docs/fsdp.md. seconds <= 0: the default.
#define COMM_DEFAULT_TIMEOUT_S 600.0
void comm_set_timeout(double seconds);
double comm_timeout(void);

// While this thread waits for a collective, fn(arg, seconds) runs between polls instead of a
// nap of that long (up to a millisecond), and returns after about that long: a sharded DiLoCo
// joiner's rank that holds its state first keeps reading what its hub sends while its other
// ranks receive theirs (transport_poll). NULL: nap. Per thread; the FSDP collectives of
// training never set it.
void comm_set_idle(void (*fn)(void *arg, double seconds), void *arg);

// A flag any rank of c can raise with a value (a signal's number) and every rank can test
// without a collective: how the ranks of a job share a stop while some wait outside any
// collective (a DiLoCo join the hub holds). Raised once for good (a stop ends the run), so a
// raise is never taken back; the value of the first raise that reaches this rank is kept (a
// later SIGUSR1 replaces another: a requeue outranks a plain stop). Open and close are
// collective over c; raise and test are not. Without MPI, or a group of one: the flag holds
// only this rank's own raise.
typedef struct comm_flag comm_flag;
comm_flag *comm_flag_open(const comm *c);
void comm_flag_raise(comm_flag *f, int value);   // tells the other ranks (once per value kind)
int comm_flag_test(comm_flag *f);                // 0: nobody raised it (as far as this rank has heard)
void comm_flag_close(comm_flag *f);   // collective; every raise sent is taken (unset the stop poll first)

// While this thread waits a long time (a collective's naps, a DiLoCo join the hub holds:
// net/transport_tcp.c), fn runs between polls: train_gpt.cu's share of a job's stop. Per
// thread; NULL: none. comm_poll_stop runs it.
void comm_set_stop_poll(void (*fn)(void));
void comm_poll_stop(void);

// MPI's thread level after initialising it (MPI_THREAD_* value), -1 without MPI in the build;
// and a one-line fatal error for a failed MPI call. Shared with net/transport_mpi.c.
int comm_mpi_init(void);
void comm_mpi_check(int rc, const char *what);
#ifdef MPI_VERSION   // mpi.h included before this header (net/transport_mpi.c)
// Waits for a non-blocking collective of MPI_COMM_WORLD as the job's collectives wait: up to
// comm_timeout_s, then fatal with one line naming `what` (a rank that failed alone before it
// exits, and under a launcher that leaves the others running they would wait for ever).
void comm_mpi_wait_world(MPI_Request *req, const char *what);
#endif

#ifdef __cplusplus
}
#endif

#endif
