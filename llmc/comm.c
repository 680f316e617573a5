// llmc/comm.c — collectives among the ranks of one job (see llmc/comm.h): MPI, or a world of one.
// A group of one rank (the world without MPI, or any group of size 1) copies; the rest is MPI.
#ifdef HAVE_MPI
#include <mpi.h>   // first: llmc/comm.h declares its MPI helpers when it sees it
#endif
#include "llmc/comm.h"

#include "llmc/common.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


// A launcher's variable: a whole number in [0, 2^24] (ranks, sizes); fatal with one line
// naming it otherwise (atoi read "4x" as 4 and 99999999999 as garbage).
static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (*end || end == v || errno || n < 0 || n > (1 << 24))
        fail("launcher: %s='%s' is not a whole number from 0 to %d", name, v, 1 << 24);
    return (int)n;
}

// A hint (ranks per node): 0 (= unknown) unless a plain whole number.
static int env_hint(const char *name) {
    const char *v = getenv(name);
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    return v && *v && !*end && n > 0 && n <= (1 << 24) ? (int)n : 0;
}

int slurm_tasks_on_node(const char *spec, int node) {
    const char *c = spec;
    while (c && *c && node >= 0) {
        char *end;
        long tasks = strtol(c, &end, 10), repeat = 1;
        if (end == c || tasks <= 0 || tasks > (1 << 24)) return 0;
        c = end;
        if (*c == '(') {
            if (c[1] != 'x') return 0;
            repeat = strtol(c + 2, &end, 10);
            if (end == c + 2 || *end != ')' || repeat <= 0) return 0;
            c = end + 1;
        }
        if (node < repeat) return (int)tasks;
        node -= (int)(repeat < (1 << 24) ? repeat : (1 << 24));
        if (*c == ',') c++;
        else if (*c) return 0;
    }
    return 0;
}

// SLURM's ranks on this node from the step's (or the job's) per-node list: srun without
// --ntasks-per-node sets no SLURM_NTASKS_PER_NODE, and every rank of the job was taken for this
// node's (the CPU budget divided by all of them). 0: the lists do not say.
static int slurm_node_ranks(void) {
    const char *step = getenv("SLURM_STEP_TASKS_PER_NODE");
    if (step && getenv("SLURM_STEP_NODEID")) return slurm_tasks_on_node(step, env_hint("SLURM_STEP_NODEID"));
    const char *job = getenv("SLURM_TASKS_PER_NODE");
    if (job && getenv("SLURM_NODEID")) return slurm_tasks_on_node(job, env_hint("SLURM_NODEID"));
    return 0;
}

launch_info launch_detect(void) {
    launch_info l = {0, 1, 0, 1, 0, "none", false};
    // Open MPI's mpirun, and MPICH's / Intel MPI's hydra (MPI_LOCALRANKID), come before SLURM's
    // variables: under mpirun inside a SLURM allocation, the batch step's SLURM_PROCID = 0 and
    // SLURM_NTASKS reach every rank, which all took rank 0 and GPU 0. srun sets its own (and,
    // with --mpi=pmi2, PMI_RANK without MPI_LOCALRANKID: SLURM's then say the local rank).
    if (getenv("OMPI_COMM_WORLD_RANK"))
        l = (launch_info){env_int("OMPI_COMM_WORLD_RANK", 0), env_int("OMPI_COMM_WORLD_SIZE", 1),
                          env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0), env_hint("OMPI_COMM_WORLD_LOCAL_SIZE"), 0, "openmpi",
                          false};
    else if (getenv("PMI_RANK") && getenv("MPI_LOCALRANKID"))
        l = (launch_info){env_int("PMI_RANK", 0), env_int("PMI_SIZE", 1), env_int("MPI_LOCALRANKID", 0),
                          env_hint("MPI_LOCALNRANKS"), 0, "pmi", false};
    else if (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS"))
        l = (launch_info){env_int("SLURM_PROCID", 0), env_int("SLURM_NTASKS", 1), env_int("SLURM_LOCALID", 0),
                          env_hint("SLURM_NTASKS_PER_NODE"), 0, "slurm", false};
    else if (getenv("PMI_RANK"))
        l = (launch_info){env_int("PMI_RANK", 0), env_int("PMI_SIZE", 1), 0, 0, 0, "pmi", false};
    if (l.size < 1 || l.rank >= l.size)
        fail("launcher (%s): rank %d of %d ranks is not a rank of the job", l.launcher, l.rank, l.size);
    int listed = strcmp(l.launcher, "slurm") == 0 && l.local_size <= 0 ? slurm_node_ranks() : 0;
    l.node_ranks_known = (l.local_size > 0 && l.local_size <= l.size) || (listed > 0 && listed <= l.size);
    if (l.local_size <= 0 || l.local_size > l.size) l.local_size = l.size;
    l.node_ranks = listed > 0 && listed <= l.size ? listed : l.local_size;
    return l;
}

struct comm {
    int rank, size;
    bool owned;   // from comm_split: freed by comm_free
#ifdef HAVE_MPI
    MPI_Comm mpi; // MPI_COMM_NULL: a world of one, MPI never initialised
#endif
};

struct comm_request {
    const comm *c;
#ifdef HAVE_MPI
    MPI_Request req;
    const char *what;
#endif
    float *scratch;            // reduce-scatter: every rank's part of mine, summed at the wait
    float *mine;
    int size;
    int64_t n;
};

static comm *one_rank(bool owned) {
    comm *c = xcalloc(1, sizeof *c);
    c->size = 1;
    c->owned = owned;
#ifdef HAVE_MPI
    c->mpi = MPI_COMM_NULL;
#endif
    return c;
}

// A request that is already complete (a group of one copies at once).
static comm_request *done_request(const comm *c) {
    comm_request *r = xcalloc(1, sizeof *r);
    r->c = c;
#ifdef HAVE_MPI
    r->req = MPI_REQUEST_NULL;
#endif
    return r;
}

// Sums parts[r][i] over r = 0 .. size-1 in that order into out[i].
static void sum_in_rank_order(const float *parts, int size, int64_t n, float *out) {
    memcpy(out, parts, (size_t)n * sizeof(float));
    for (int r = 1; r < size; r++) {
        const float *p = parts + (size_t)r * (size_t)n;
        for (int64_t i = 0; i < n; i++) out[i] = out[i] + p[i];
    }
}

// How long a rank waits for any collective before it decides another rank is gone
// (comm_timeout_s). Process-wide: a job has one.
static double wait_limit_s = COMM_DEFAULT_TIMEOUT_S;

void comm_set_timeout(double seconds) { wait_limit_s = seconds > 0 ? seconds : COMM_DEFAULT_TIMEOUT_S; }
double comm_timeout(void) { return wait_limit_s; }

// What this thread does instead of napping while a collective waits (comm_set_idle).
static _Thread_local void (*idle_fn)(void *, double);
static _Thread_local void *idle_arg;

void comm_set_idle(void (*fn)(void *arg, double seconds), void *arg) {
    idle_fn = fn;
    idle_arg = arg;
}

static _Thread_local void (*stop_poll_fn)(void);

void comm_set_stop_poll(void (*fn)(void)) { stop_poll_fn = fn; }
void comm_poll_stop(void) {
    if (stop_poll_fn) stop_poll_fn();
}

static void gather_doubles(const comm *c, double x, double *all);

struct comm_flag {
    const comm *c;
    int value;                 // the kept value (0: not raised)
    int sent;                  // the value this rank has told the others (0: none)
#ifdef HAVE_MPI
    MPI_Comm mpi;              // a duplicate of c's: its messages meet no other traffic
    MPI_Request recv;          // the next raise from any other rank
    int incoming, received;
    int out[2], raises;        // what this rank told the others: at most twice (a value, then SIGUSR1)
    MPI_Request *sends;        // raises × (size − 1)
#endif
};

// The value kept of two raises: the first, unless the second is SIGUSR1 (a requeue).
static int flag_keep(int kept, int v) { return kept == 0 || (v == SIGUSR1 && kept != SIGUSR1) ? v : kept; }

#ifdef HAVE_MPI

// Waits for req, polling: MPI_Wait would wait forever for a rank that was killed under a
// launcher that does not end the job (srun without --kill-on-bad-exit) or that hangs. Spins
// first (a collective usually lands within microseconds), then naps up to 1 ms between polls.
static void timed_wait(const comm *c, MPI_Request *req, const char *what) {
    if (*req == MPI_REQUEST_NULL) return;
    double t0 = wall_seconds(), nap_s = 20e-6, last = t0;
    for (long polls = 0;; polls++) {
        int done = 0;
        comm_mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
        if (done) return;
        if (polls < 2000) continue;
        // A poll this late (its naps are 1 ms at most): the process was not running (SIGSTOP, a
        // SLURM suspend of the job); that time is not the other ranks' delay.
        double now = wall_seconds();
        if (now - last > 5.0) t0 += now - last;
        last = now;
        double waited = now - t0;
        if (waited > wait_limit_s)
            fail_with_status(EXIT_TEMPFAIL,
                             "comm: rank %d of %d waited %.0f s for the other ranks (%s): one of them died, hung or "
                             "stalls (comm_timeout_s = %g); exiting with status %d so that the job can be requeued "
                             "and resume from its checkpoint",
                             c->rank, c->size, waited, what, wait_limit_s, EXIT_TEMPFAIL);
        comm_poll_stop();
        if (idle_fn) {
            idle_fn(idle_arg, nap_s);
        } else {
            struct timespec ts = {0, (long)(nap_s * 1e9)};
            nanosleep(&ts, NULL);
        }
        if (nap_s < 1e-3) nap_s *= 2;
    }
}

void comm_mpi_wait_world(MPI_Request *req, const char *what) { timed_wait(comm_world(), req, what); }

static int count_of(int64_t n) {
    if (n < 0 || n > INT_MAX) fail("comm: %lld values per rank, more than one MPI call takes", (long long)n);
    return (int)n;
}

void comm_mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fail("mpi: %s failed: %.*s", what, len, text);
}

int comm_mpi_init(void) {
    int initialized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Query_thread(&level);
    else comm_mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level), "MPI_Init_thread");
    return level;
}

void comm_finish(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
}

static comm *wrap(MPI_Comm m, bool owned) {
    comm *c = one_rank(owned);
    c->mpi = m;
    MPI_Comm_rank(m, &c->rank);
    MPI_Comm_size(m, &c->size);
    return c;
}

comm *comm_world(void) {
    static comm *world;
    if (world) return world;
    int initialized = 0;
    MPI_Initialized(&initialized);
    launch_info l = launch_detect();
    if (l.size > 1 || initialized) {
        comm_mpi_init();
        world = wrap(MPI_COMM_WORLD, false);
        // The launcher's count and MPI's disagree: most often ./train_gpt run without srun inside
        // an allocation of several tasks (the batch step has SLURM_NTASKS), which said only
        // "fsdp_size: 4 does not divide the job's 1 ranks".
        if (l.size > 1 && world->size != l.size)
            fail("the launcher's environment (%s) says %d ranks, but MPI's world has %d: started without srun or "
                 "mpirun inside an allocation of several tasks? Start the ranks with srun (or mpirun), or run one "
                 "process outside the allocation's task count (unset SLURM_NTASKS)",
                 l.launcher, l.size, world->size);
    } else {
        world = one_rank(false);
    }
    return world;
}

comm *comm_split(const comm *c, int color, int key) {
    if (c->mpi == MPI_COMM_NULL) return one_rank(true);
    MPI_Comm m;
    comm_mpi_check(MPI_Comm_split(c->mpi, color, key, &m), "MPI_Comm_split");
    return wrap(m, true);
}

void comm_free(comm *c) {
    if (!c || !c->owned) return;
    if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
    free(c);
}

comm_flag *comm_flag_open(const comm *c) {
    comm_flag *f = xcalloc(1, sizeof *f);
    f->c = c;
    f->mpi = MPI_COMM_NULL;
    f->recv = MPI_REQUEST_NULL;
    if (c->size == 1) return f;
    comm_mpi_check(MPI_Comm_dup(c->mpi, &f->mpi), "MPI_Comm_dup");
    f->sends = xmalloc(2 * (size_t)c->size * sizeof *f->sends);
    comm_mpi_check(MPI_Irecv(&f->incoming, 1, MPI_INT, MPI_ANY_SOURCE, 0, f->mpi, &f->recv), "MPI_Irecv");
    return f;
}

void comm_flag_raise(comm_flag *f, int value) {
    f->value = flag_keep(f->value, value);
    int tell = flag_keep(f->sent, value);
    if (tell == f->sent) return;
    f->sent = tell;
    if (f->mpi == MPI_COMM_NULL) return;
    int *v = &f->out[f->raises];
    *v = tell;
    MPI_Request *sends = f->sends + f->raises * (f->c->size - 1);
    for (int r = 0; r < f->c->size; r++)
        if (r != f->c->rank) comm_mpi_check(MPI_Isend(v, 1, MPI_INT, r, 0, f->mpi, sends++), "MPI_Isend");
    f->raises++;
}

// Takes the raises that have come (blocking: until `until` of them have).
static void flag_take(comm_flag *f, int until) {
    while (f->recv != MPI_REQUEST_NULL) {
        int done = 0;
        if (f->received < until) {
            timed_wait(f->c, &f->recv, "the job's stop flag");   // (closing: the stop poll is unset)
            done = 1;
        } else {
            comm_mpi_check(MPI_Test(&f->recv, &done, MPI_STATUS_IGNORE), "MPI_Test");
        }
        if (!done) break;
        f->value = flag_keep(f->value, f->incoming);
        f->received++;
        comm_mpi_check(MPI_Irecv(&f->incoming, 1, MPI_INT, MPI_ANY_SOURCE, 0, f->mpi, &f->recv), "MPI_Irecv");
    }
}

int comm_flag_test(comm_flag *f) {
    flag_take(f, 0);
    return f->value;
}

// Every raise sent is received before the communicator goes (an MPI may keep a finalize waiting
// for a message nobody takes): the ranks count them.
void comm_flag_close(comm_flag *f) {
    if (!f) return;
    if (f->mpi != MPI_COMM_NULL) {
        double *all = xmalloc((size_t)f->c->size * sizeof *all);
        gather_doubles(f->c, (double)f->raises, all);
        int expect = 0;
        for (int r = 0; r < f->c->size; r++)
            if (r != f->c->rank) expect += (int)all[r];
        free(all);
        flag_take(f, expect);
        MPI_Cancel(&f->recv);
        MPI_Wait(&f->recv, MPI_STATUS_IGNORE);
        for (int i = 0; i < f->raises * (f->c->size - 1); i++)
            timed_wait(f->c, &f->sends[i], "the job's stop flag");
        MPI_Comm_free(&f->mpi);
    }
    free(f->sends);
    free(f);
}

#else  // no MPI in the build: a world of one

void comm_mpi_check(int rc, const char *what) {
    (void)rc;
    (void)what;
}

int comm_mpi_init(void) { return -1; }

void comm_finish(void) {}

comm *comm_world(void) {
    static comm *world;
    launch_info l = launch_detect();
    if (l.size > 1)
        fail("the launcher (%s) started %d ranks, but this build has no MPI to join them: install libopenmpi-dev "
             "(or load the cluster's MPI module) and rebuild, or start one rank",
             l.launcher, l.size);
    if (!world) world = one_rank(false);
    return world;
}

comm *comm_split(const comm *c, int color, int key) {
    (void)c;
    (void)color;
    (void)key;
    return one_rank(true);
}

void comm_free(comm *c) {
    if (c && c->owned) free(c);
}

comm_flag *comm_flag_open(const comm *c) {
    comm_flag *f = xcalloc(1, sizeof *f);
    f->c = c;
    return f;
}
void comm_flag_raise(comm_flag *f, int value) { f->value = f->sent = flag_keep(f->value, value); }
int comm_flag_test(comm_flag *f) { return f->value; }
void comm_flag_close(comm_flag *f) { free(f); }
#endif

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }

comm_request *comm_iallgather(const comm *c, const float *mine, int64_t n, float *all) {
    comm_request *r = done_request(c);
    if (c->size == 1) {
        memcpy(all, mine, (size_t)n * sizeof(float));
        return r;
    }
#ifdef HAVE_MPI
    comm_mpi_check(MPI_Iallgather(mine, count_of(n), MPI_FLOAT, all, count_of(n), MPI_FLOAT, c->mpi, &r->req),
                   "MPI_Iallgather");
    r->what = "an all-gather";
#endif
    return r;
}

comm_request *comm_ireduce_scatter(const comm *c, const float *all, int64_t n, float *mine) {
    comm_request *r = done_request(c);
    if (c->size == 1) {
        memcpy(mine, all, (size_t)n * sizeof(float));
        return r;
    }
    // Rank q's part of every rank's `all` lands in rank q's scratch, in rank order; the sum
    // waits for comm_wait.
    r->scratch = alloc_floats((size_t)c->size * (size_t)n);
    r->mine = mine;
    r->size = c->size;
    r->n = n;
#ifdef HAVE_MPI
    comm_mpi_check(MPI_Ialltoall(all, count_of(n), MPI_FLOAT, r->scratch, count_of(n), MPI_FLOAT, c->mpi, &r->req),
                   "MPI_Ialltoall");
    r->what = "a reduce-scatter";
#endif
    return r;
}

void comm_wait(comm_request *r) {
    if (!r) return;
#ifdef HAVE_MPI
    timed_wait(r->c, &r->req, r->what);
#endif
    if (r->scratch) {
        sum_in_rank_order(r->scratch, r->size, r->n, r->mine);
        free(r->scratch);
    }
    free(r);
}

void comm_allgather(const comm *c, const float *mine, int64_t n, float *all) {
    comm_wait(comm_iallgather(c, mine, n, all));
}

void comm_reduce_scatter(const comm *c, const float *all, int64_t n, float *mine) {
    comm_wait(comm_ireduce_scatter(c, all, n, mine));
}

// all[size] ← every rank's x.
static void gather_doubles(const comm *c, double x, double *all) {
#ifdef HAVE_MPI
    MPI_Request req;
    comm_mpi_check(MPI_Iallgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, c->mpi, &req), "MPI_Iallgather");
    timed_wait(c, &req, "an all-gather of one number");
#else
    all[0] = x;
#endif
}

double comm_sum(const comm *c, double x) {
    if (c->size == 1) return x;
    double *all = xmalloc((size_t)c->size * sizeof *all), s = 0.0;
    gather_doubles(c, x, all);
    for (int r = 0; r < c->size; r++) s += all[r];
    free(all);
    return s;
}

// In chunks of at most ALLREDUCE_CHUNK values, padded to a multiple of the group's size:
// reduce-scatter (the rank-order sum) then all-gather, so a rank holds about two chunks more.
#define ALLREDUCE_CHUNK ((int64_t)1 << 22)

void comm_allreduce(const comm *c, float *x, int64_t n) {
    if (c->size == 1 || n == 0) return;
    int64_t per = ceil_div(min_i64(n, ALLREDUCE_CHUNK), c->size), span = per * c->size;
    float *chunk = alloc_floats((size_t)span), *mine = alloc_floats((size_t)per);
    for (int64_t at = 0; at < n; at += span) {
        int64_t len = min_i64(span, n - at);
        memcpy(chunk, x + at, (size_t)len * sizeof(float));
        memset(chunk + len, 0, (size_t)(span - len) * sizeof(float));
        comm_reduce_scatter(c, chunk, per, mine);
        comm_allgather(c, mine, per, chunk);
        memcpy(x + at, chunk, (size_t)len * sizeof(float));
    }
    free(chunk);
    free(mine);
}

void comm_broadcast(const comm *c, void *data, int64_t bytes, int root) {
    if (c->size == 1 || bytes == 0) return;
#ifdef HAVE_MPI
    MPI_Request req;
    comm_mpi_check(MPI_Ibcast(data, count_of(bytes), MPI_BYTE, root, c->mpi, &req), "MPI_Ibcast");
    timed_wait(c, &req, "a broadcast");
#else
    (void)data;
    (void)root;
#endif
}

double comm_max(const comm *c, double x) {
    if (c->size == 1) return x;
    double *all = xmalloc((size_t)c->size * sizeof *all), m = x;
    gather_doubles(c, x, all);
    for (int r = 0; r < c->size; r++) m = all[r] > m ? all[r] : m;
    free(all);
    return m;
}
