// cuda/collective.cu — the GPU side of llmc/comm.h's collectives: what the ranks of one FSDP
// group (or the copies of an HSDP job) exchange between their GPUs, on a CUDA stream, through
// NCCL, or RCCL on AMD GPUs (docs/fsdp.md "The GPU path").
//
// The library is loaded when the first communicator is made (dlopen of libnccl.so.2, or
// librccl.so.1 in a HIP build), not linked, and declared by cuda/nccl_abi.h rather than by
// nccl.h: the build needs no NCCL headers, the binary starts and trains on one GPU on machines
// without the library, and a job of several GPU ranks needs it and says so in one line when it
// is missing. The tests' emulated GPU (test/warp_emu.h) gets test/nccl_emu.h instead: the same
// calls over MPI between CPU processes.
//
// Determinism: an all-gather is a copy; a reduction is never NCCL's own (its summation order is
// not promised): gradients travel by an all-to-all of pieces (grouped ncclSend/ncclRecv) and
// each rank adds what it received in rank order (sum_ranks_add), as llmc/comm.c does on the
// CPU. The same world size gives the same bits run after run.
#include "cuda/collective.h"

#include "llmc/comm.h"
#include "llmc/common.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#if defined(TRAIN_GPT_NCCL) && !defined(TRAIN_GPT_EMULATION)
#include <dlfcn.h>
#endif
#include "cuda/nccl_abi.h"

// ---------------------------------------------------------------- kernels

// add: dst += the sum, else dst = the sum.
__global__ void sum_ranks_kernel(float *dst, const float *parts, int ranks, int64_t n, bool add) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float s = parts[i];
        for (int r = 1; r < ranks; r++) s += parts[(int64_t)r * n + i];
        dst[i] = add ? dst[i] + s : s;
    }
}

__global__ void sum_ranks_doubles_kernel(double *dst, const double *parts, int ranks, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double s = parts[i];
    for (int r = 1; r < ranks; r++) s += parts[(int64_t)r * n + i];
    dst[i] = s;
}

__global__ void copy_stretches_kernel(float *dst, const float *src, const copy_stretch *table) {
    copy_stretch c = table[blockIdx.x];
    for (int64_t i = threadIdx.x; i < c.count; i += blockDim.x) dst[c.dst + i] = src[c.src + i];
}

void copy_stretches(float *dst, const float *src, const copy_stretch *table, int64_t count, cudaStream_t stream) {
    if (count <= 0) return;
    copy_stretches_kernel<<<(unsigned)count, 256, 0, stream>>>(dst, src, table);
    CUDA_CHECK_LAUNCH();
}

static int blocks_for(int64_t n) { return (int)(n < 256 ? 1 : n / 256 < 4096 ? (n + 255) / 256 : 4096); }

static void sum_ranks(float *dst, const float *parts, int ranks, int64_t n, bool add, cudaStream_t stream) {
    if (n <= 0) return;
    sum_ranks_kernel<<<blocks_for(n), 256, 0, stream>>>(dst, parts, ranks, n, add);
    CUDA_CHECK_LAUNCH();
}

void sum_ranks_add(float *dst, const float *parts, int ranks, int64_t n, cudaStream_t stream) {
    sum_ranks(dst, parts, ranks, n, true, stream);
}

void sum_ranks_set(float *dst, const float *parts, int ranks, int64_t n, cudaStream_t stream) {
    sum_ranks(dst, parts, ranks, n, false, stream);
}

void sum_ranks_doubles(double *dst, const double *parts, int ranks, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    sum_ranks_doubles_kernel<<<(int)((n + 255) / 256), 256, 0, stream>>>(dst, parts, ranks, n);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- NCCL, loaded at run time

#if defined(TRAIN_GPT_NCCL)

// The NCCL functions train_gpt calls: from libnccl.so.2 or librccl.so.1 (dlsym), or
// test/nccl_emu.h's.
typedef struct {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_version)(int *);
} nccl_api;

static nccl_api nccl;
static bool nccl_loaded;

#if defined(TRAIN_GPT_EMULATION)
static void nccl_load(void) {
    if (nccl_loaded) return;
    nccl = (nccl_api){ncclGetUniqueId, ncclCommInitRank, ncclCommDestroy, ncclCommAbort, ncclCommGetAsyncError,
                      ncclAllGather,   ncclSend,         ncclRecv,        ncclGroupStart, ncclGroupEnd,
                      ncclGetErrorString, ncclGetVersion};
    nccl_loaded = true;
}
#else
static void *nccl_symbol(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) fail("%s: the library loaded has no %s (%s)", GPU_COLLECTIVES, name, GPU_COLLECTIVES_MIN);
    return f;
}

static void nccl_load(void) {
    if (nccl_loaded) return;
    // The versioned name, else the development link; the first one's error is the one to tell
    // (a libnccl.so.2 that exists but cannot load, say for a missing dependency).
    void *lib = dlopen(GPU_COLLECTIVES_LIB, RTLD_NOW | RTLD_GLOBAL);
    char why[512];
    snprintf(why, sizeof why, "%s", lib ? "" : dlerror());
    if (!lib) lib = dlopen(GPU_COLLECTIVES_LIB_DEV, RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        fail("%s: a job of several GPU ranks needs %s, which could not be loaded (%s); %s", GPU_COLLECTIVES,
             GPU_COLLECTIVES_LIB, why, GPU_COLLECTIVES_HINT);
#define NCCL_FN(field, name) *(void **)&nccl.field = nccl_symbol(lib, name)
    NCCL_FN(get_unique_id, "ncclGetUniqueId");
    NCCL_FN(comm_init_rank, "ncclCommInitRank");
    NCCL_FN(comm_destroy, "ncclCommDestroy");
    NCCL_FN(comm_abort, "ncclCommAbort");
    NCCL_FN(comm_get_async_error, "ncclCommGetAsyncError");
    NCCL_FN(all_gather, "ncclAllGather");
    NCCL_FN(send, "ncclSend");
    NCCL_FN(recv, "ncclRecv");
    NCCL_FN(group_start, "ncclGroupStart");
    NCCL_FN(group_end, "ncclGroupEnd");
    NCCL_FN(error_string, "ncclGetErrorString");
    NCCL_FN(get_version, "ncclGetVersion");
#undef NCCL_FN
    // RCCL reports the NCCL version it implements, so one threshold serves both.
    int version = 0;
    if (nccl.get_version(&version) != ncclSuccess || version < 21000)
        fail("%s: the library loaded reports version %d; train_gpt needs %s", GPU_COLLECTIVES, version,
             GPU_COLLECTIVES_MIN);
    nccl_loaded = true;
}
#endif

struct gpu_comm {
    ncclComm_t nccl;
    int rank, size;
    const char *name;   // "fsdp" or "hsdp" (messages)
};

// In a collective, a peer or the network gone (ncclRemoteError, ncclSystemError) is a temporary
// failure, as the same loss seen through check_async is: status EXIT_TEMPFAIL, which the job
// scripts requeue (status 1 ended the requeue chain). The others (invalid usage, an internal
// error), and any at the communicator's start (a system error there is mostly the setup's: a
// small /dev/shm, a wrong NCCL_SOCKET_IFNAME, which a requeue meets again), are not.
static void nccl_check(const gpu_comm *g, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return;
    bool starting = strcmp(what, "ncclGetUniqueId") == 0 || strcmp(what, "ncclCommInitRank") == 0;
    bool temporary = !starting && (r == ncclRemoteError || r == ncclSystemError);
    fail_with_status(temporary ? EXIT_TEMPFAIL : 1, GPU_COLLECTIVES ": %s failed on rank %d of the %s group: %s%s",
                     what, g ? g->rank : -1, g ? g->name : "?", nccl.error_string(r),
                     temporary ? " (a peer or the network: exiting with status 75, which requeues)" : "");
}

bool gpu_comm_available(void) { return true; }

// ncclCommInitRank blocks until every rank of the group has called it: a rank that died before
// then would leave the others waiting for ever, so a thread ends the process after
// comm_timeout_s (one line, exit status EXIT_TEMPFAIL: requeued) unless the call returned first.
typedef struct {
    int done;
    double timeout_s;
    int rank;
    const char *name;
} init_deadline;

static void *init_deadline_thread(void *arg) {
    init_deadline *d = (init_deadline *)arg;
    double t0 = wall_seconds();
    while (!__atomic_load_n(&d->done, __ATOMIC_ACQUIRE)) {
        if (wall_seconds() - t0 > d->timeout_s) {
            fprintf(stderr,
                    "train_gpt: error: fsdp: rank %d of the %s group waited %.0f s (comm_timeout_s) in "
                    "ncclCommInitRank: another rank died or hangs; exiting with status %d so that the job can be "
                    "requeued\n",
                    d->rank, d->name, d->timeout_s, EXIT_TEMPFAIL);
            fflush(stderr);
            _exit(EXIT_TEMPFAIL);
        }
        struct timespec nap = {0, 50 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    return NULL;
}

gpu_comm *gpu_comm_create(const comm *group, const char *name) {
    nccl_load();
    gpu_comm *g = (gpu_comm *)xcalloc(1, sizeof *g);
    g->rank = group ? comm_rank(group) : 0;
    g->size = group ? comm_size(group) : 1;
    g->name = name;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (g->rank == 0) nccl_check(g, nccl.get_unique_id(&id), "ncclGetUniqueId");
    if (group) comm_broadcast(group, &id, (int64_t)sizeof id, 0);  // over MPI: the bootstrap
    init_deadline d = {0, comm_timeout(), g->rank, name};
    pthread_t watcher;
    bool watched = pthread_create(&watcher, NULL, init_deadline_thread, &d) == 0;
    ncclResult_t r = nccl.comm_init_rank(&g->nccl, g->size, id, g->rank);
    __atomic_store_n(&d.done, 1, __ATOMIC_RELEASE);
    if (watched) pthread_join(watcher, NULL);
    nccl_check(g, r, "ncclCommInitRank");
    static bool told;  // which library the job's collectives run on: once, from the first group's rank 0
    if (!told && g->rank == 0) {
        int v = 0;
        nccl.get_version(&v);
        note("%s: %s %d.%d.%d, %d rank%s", name, GPU_COLLECTIVES, v / 10000, v / 100 % 100, v % 100, g->size,
             g->size == 1 ? "" : "s");
    }
    told = true;
    return g;
}

void gpu_comm_free(gpu_comm *g) {
    if (!g) return;
    nccl.comm_destroy(g->nccl);
    free(g);
}

int gpu_comm_rank(const gpu_comm *g) { return g->rank; }
int gpu_comm_size(const gpu_comm *g) { return g->size; }

int gpu_comm_nccl_version(void) {
    nccl_load();
    int v = 0;
    if (nccl.get_version(&v) != ncclSuccess) return 0;
    return v;
}

void gpu_allgather(gpu_comm *g, const void *mine, int64_t n, gpu_dtype type, void *all, cudaStream_t stream) {
    ncclDataType_t t = type == GPU_F64 ? ncclFloat64 : type == GPU_BF16 ? ncclBfloat16 : ncclFloat32;
    nccl_check(g, nccl.all_gather(mine, all, (size_t)n, t, g->nccl, stream), "ncclAllGather");
}

void gpu_alltoall(gpu_comm *g, const float *send, int64_t n, float *recv, cudaStream_t stream) {
    // This rank's own piece is a device copy; the others travel in one NCCL group.
    CUDA_CHECK(cudaMemcpyAsync(recv + (int64_t)g->rank * n, send + (int64_t)g->rank * n, (size_t)n * sizeof(float),
                               cudaMemcpyDeviceToDevice, stream));
    nccl_check(g, nccl.group_start(), "ncclGroupStart");
    for (int r = 0; r < g->size; r++) {
        if (r == g->rank) continue;
        nccl_check(g, nccl.send(send + (int64_t)r * n, (size_t)n, ncclFloat32, r, g->nccl, stream), "ncclSend");
        nccl_check(g, nccl.recv(recv + (int64_t)r * n, (size_t)n, ncclFloat32, r, g->nccl, stream), "ncclRecv");
    }
    nccl_check(g, nccl.group_end(), "ncclGroupEnd");
}

// Aborting a communicator after a peer died may block (NCCL may wait for the node's other ranks
// to abort too, or for a kernel of another communicator still spinning), and so may the exit's
// teardown: nothing else timed it, and the job sat until its walltime instead of exiting 75 to
// be requeued. A thread ends the process with status EXIT_TEMPFAIL comm_timeout_s after this.
typedef struct {
    double seconds;
    int rank;
    const char *name;
} abort_deadline;

static void *abort_deadline_thread(void *arg) {
    const abort_deadline *d = (const abort_deadline *)arg;
    struct timespec nap = {(time_t)d->seconds, (long)((d->seconds - (double)(time_t)d->seconds) * 1e9)};
    nanosleep(&nap, NULL);
    fprintf(stderr, "train_gpt: error: fsdp: rank %d of the %s group: aborting its " GPU_COLLECTIVES " communicators "
            "took more than %.0f s (comm_timeout_s); exiting with status %d so that the job can be requeued\n",
            d->rank, d->name, d->seconds, EXIT_TEMPFAIL);
    fflush(stderr);
    _exit(EXIT_TEMPFAIL);
    return NULL;
}

static void abort_within_deadline(gpu_comm *g, gpu_comm *also) {
    static abort_deadline d;   // once: the process ends after it
    d.seconds = comm_timeout() > 0 ? comm_timeout() : 600.0;
    d.rank = g ? g->rank : -1;
    d.name = g ? g->name : "?";
    pthread_t t;
    if (pthread_create(&t, NULL, abort_deadline_thread, &d) == 0) pthread_detach(t);
    if (g) nccl.comm_abort(g->nccl);
    if (also) nccl.comm_abort(also->nccl);
}

// NCCL's asynchronous error of g, if any: the communicator is aborted and the run ends with one line.
static void check_async(gpu_comm *g, const char *what) {
    ncclResult_t async = ncclSuccess;
    if (!g || nccl.comm_get_async_error(g->nccl, &async) != ncclSuccess || async == ncclSuccess ||
        async == ncclInProgress)
        return;
    abort_within_deadline(g, NULL);
    fail_with_status(EXIT_TEMPFAIL,
                     GPU_COLLECTIVES ": %s: rank %d of the %s group: %s (a rank of the job died or its link failed); "
                     "exiting with status %d so that the job can be requeued",
                     what, g->rank, g->name, nccl.error_string(async), EXIT_TEMPFAIL);
}

void gpu_comm_wait(gpu_comm *g, gpu_comm *also, cudaEvent_t done, const char *what) {
    double timeout = comm_timeout();
    double t0 = wall_seconds();
    for (;;) {
        cudaError_t e = cudaEventQuery(done);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) CUDA_CHECK(e);
        (void)cudaGetLastError();  // "not ready" is no error
        check_async(g, what);
        check_async(also, what);
        if (wall_seconds() - t0 > timeout) {
            abort_within_deadline(g, also);
            fail_with_status(EXIT_TEMPFAIL,
                             "fsdp: rank %d of the %s group waited %.0f s (comm_timeout_s) for %s: another rank died "
                             "or hangs; exiting with status %d so that the job can be requeued",
                             g->rank, g->name, timeout, what, EXIT_TEMPFAIL);
        }
        struct timespec nap = {0, 200 * 1000};
        nanosleep(&nap, NULL);
    }
}

#else  // the emulated GPU of a build without MPI: no collectives to emulate them with

bool gpu_comm_available(void) { return false; }
gpu_comm *gpu_comm_create(const comm *group, const char *name) {
    (void)name;
    fail("fsdp: a job of %d GPU ranks needs NCCL, which the emulated GPU of a build without MPI does not have",
         group ? comm_size(group) : 1);
    return NULL;
}
void gpu_comm_free(gpu_comm *g) { (void)g; }
int gpu_comm_rank(const gpu_comm *g) { return (void)g, 0; }
int gpu_comm_size(const gpu_comm *g) { return (void)g, 1; }
int gpu_comm_nccl_version(void) { return 0; }
void gpu_allgather(gpu_comm *g, const void *mine, int64_t n, gpu_dtype type, void *all, cudaStream_t stream) {
    (void)g, (void)mine, (void)n, (void)type, (void)all, (void)stream;
    CHECK(false);
}
void gpu_alltoall(gpu_comm *g, const float *send, int64_t n, float *recv, cudaStream_t stream) {
    (void)g, (void)send, (void)n, (void)recv, (void)stream;
    CHECK(false);
}
void gpu_comm_wait(gpu_comm *g, gpu_comm *also, cudaEvent_t done, const char *what) {
    (void)g, (void)also, (void)what;
    CUDA_CHECK(cudaEventSynchronize(done));
}

#endif
