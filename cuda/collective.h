// cuda/collective.h — collectives between the GPUs of one job (FSDP / HSDP, issue #14): the
// GPU implementation of the one collective layer whose CPU implementation is llmc/comm.h.
// NCCL underneath, or RCCL on AMD GPUs (cuda/collective.cu loads it at run time, declared by
// cuda/nccl_abi.h); every call takes the CUDA stream it runs on and returns at once. A gpu_comm
// mirrors one llmc/comm.h group: the same ranks in the same order, made from it (NCCL's unique
// id goes out over the group's MPI broadcast).
#ifndef TRAIN_GPT_CUDA_COLLECTIVE_H
#define TRAIN_GPT_CUDA_COLLECTIVE_H

#include "cuda/common.cuh"
#include "llmc/comm.h"

typedef struct gpu_comm gpu_comm;
typedef enum { GPU_F32, GPU_F64, GPU_BF16 } gpu_dtype;

// Whether this build can make a gpu_comm (every GPU build; not the emulated GPU of a build
// without MPI); the library is loaded at the first gpu_comm_create, which fails with one line
// where libnccl.so.2 (librccl.so.1) cannot be loaded.
bool gpu_comm_available(void);
// A communicator over group's ranks (collective: every rank of the group calls it); NULL
// group: a world of one (TRAIN_GPT_FSDP_UNITS=1). name says which group in messages ("fsdp",
// "hsdp").
gpu_comm *gpu_comm_create(const comm *group, const char *name);
void gpu_comm_free(gpu_comm *g);
int gpu_comm_rank(const gpu_comm *g);
int gpu_comm_size(const gpu_comm *g);
int gpu_comm_nccl_version(void);   // NCCL_VERSION_CODE of the library (loaded by this call; a missing
                                   // one ends the run with one line); 0 where the build has no collectives

// all[size·n] ← every rank's mine[n], in rank order (device buffers).
void gpu_allgather(gpu_comm *g, const void *mine, int64_t n, gpu_dtype type, void *all, cudaStream_t stream);
// recv[r·n .. r·n + n) ← rank r's send[me·n .. me·n + n): the pieces of a reduce-scatter,
// before the rank-order sum (sum_ranks_add).
void gpu_alltoall(gpu_comm *g, const float *send, int64_t n, float *recv, cudaStream_t stream);
// Waits for `done` (an event after collectives of g and of also, which may be NULL), giving up
// with a one-line error (and aborting the communicators) on NCCL's asynchronous error of either
// or after comm_timeout_s: another rank died or hangs. what names the wait.
void gpu_comm_wait(gpu_comm *g, gpu_comm *also, cudaEvent_t done, const char *what);

// dst[i] (+)= Σ_r parts[r·n + i], r = 0, 1, … in order: the same bits on every rank and run.
void sum_ranks_add(float *dst, const float *parts, int ranks, int64_t n, cudaStream_t stream);
void sum_ranks_set(float *dst, const float *parts, int ranks, int64_t n, cudaStream_t stream);
void sum_ranks_doubles(double *dst, const double *parts, int ranks, int64_t n, cudaStream_t stream);

// dst[t.dst + i] = src[t.src + i] for i < t.count, for each of count entries t of table (device):
// one block per entry (the norm gains a rank holds, packed for their all-gather).
typedef struct {
    int64_t src, dst, count;
} copy_stretch;
void copy_stretches(float *dst, const float *src, const copy_stretch *table, int64_t count, cudaStream_t stream);

#endif
