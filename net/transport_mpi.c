// net/transport_mpi.c — DiLoCo replicas as the ranks of one MPI world (see net/transport.h).
//
// Every exchange is an MPI_Allgatherv of the encoded outer gradients, in pieces of at most
// 1 GiB per rank (MPI counts are ints). The membership is fixed: MPI cannot survive a dead
// rank, so there is no eviction and no joining; replicas that must survive failures use the
// tcp transport. A replica must resume at the same outer step as the others; if the ranks'
// states differ at start that is a clear error rather than a silent resync.
//
// Built only when the Makefile finds MPI (HAVE_MPI); otherwise transport_mpi_open fails
// with a one-line error naming what to install.
#include "net/transport_impl.h"
#include "llmc/common.h"

#include <stdlib.h>
#include <string.h>

#ifdef HAVE_MPI
#include <mpi.h>

#define PIECE_BYTES ((size_t)1 << 30)

typedef struct {
    int rank, size;
    MPI_Comm exchange_comm;  // a duplicate of the world: exchanges may run on a second thread
                             // while the main thread agrees on stopping over MPI_COMM_WORLD
    int min_replicas;
    uint8_t *gathered;      // size × max payload bytes
    size_t gathered_capacity;
} mpi_transport;

static void mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fail("diloco (mpi): %s failed: %.*s", what, len, text);
}

static const transport_ops MPI_OPS;

static int thread_level = MPI_THREAD_SINGLE;  // what MPI_Init_thread provided

// Asks for MPI_THREAD_MULTIPLE: streaming DiLoCo exchanges on a second thread.
static void mpi_start(void) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
        MPI_Query_thread(&thread_level);
        return;
    }
    mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &thread_level), "MPI_Init_thread");
}

int transport_mpi_world_rank(void) {
    mpi_start();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

transport *transport_mpi_open(const transport_options *o) {
    mpi_start();
    mpi_transport *t = xcalloc(1, sizeof *t);
    MPI_Comm_rank(MPI_COMM_WORLD, &t->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &t->size);
    if (t->size != o->replicas)
        fail("diloco_replicas: %d, but the MPI world has %d rank(s); with diloco_transport = mpi every rank is "
             "one replica (start with mpirun -np %d or srun -n %d)",
             o->replicas, t->size, o->replicas, o->replicas);
    if (o->replica_id >= 0 && o->replica_id != t->rank)
        fail("diloco_replica_id: %d, but this process is MPI rank %d; leave it at -1 with diloco_transport = mpi",
             o->replica_id, t->rank);
    if (t->size > TRANSPORT_MAX_REPLICAS) fail("diloco (mpi): at most %d replicas", TRANSPORT_MAX_REPLICAS);
    uint64_t mine = o->run_fingerprint, lowest = mine, highest = mine;
    MPI_Allreduce(&mine, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (lowest != highest)
        fail("diloco (mpi): the ranks disagree on the run (model, diloco_replicas, inner steps, outer optimizer or "
             "quantization differ between their configs)");
    if (o->threaded && thread_level < MPI_THREAD_MULTIPLE)
        fail("diloco_overlap_steps: an exchange that overlaps inner steps needs an MPI library with "
             "MPI_THREAD_MULTIPLE (this one provides level %d of 0..3); use diloco_overlap_steps = 0 or "
             "diloco_transport = tcp",
             thread_level);
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &t->exchange_comm), "MPI_Comm_dup");
    t->min_replicas = o->min_replicas;
    return transport_wrap(&MPI_OPS, t);
}

static join_result mpi_join(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                           size_t *state_bytes) {
    mpi_transport *t = impl;
    (void)state;
    (void)state_capacity;
    *state_bytes = 0;
    int64_t all_steps[TRANSPORT_MAX_REPLICAS];
    uint64_t all_hashes[TRANSPORT_MAX_REPLICAS];
    MPI_Allgather(&s->outer_step, 1, MPI_INT64_T, all_steps, 1, MPI_INT64_T, MPI_COMM_WORLD);
    MPI_Allgather(&s->param_hash, 1, MPI_UINT64_T, all_hashes, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 1; r < t->size; r++)
        if (all_steps[r] != all_steps[0] || all_hashes[r] != all_hashes[0])
            fail("diloco (mpi): rank %d is at outer step %lld (θ hash %016llx) but rank 0 at %lld (%016llx); with "
                 "the mpi transport all replicas must resume from the same outer step (check each rank's out_dir)",
                 r, (long long)all_steps[r], (unsigned long long)all_hashes[r], (long long)all_steps[0],
                 (unsigned long long)all_hashes[0]);
    return JOIN_MEMBER;
}

static join_result mpi_rejoin(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                             size_t *state_bytes) {
    return mpi_join(impl, s, state, state_capacity, state_bytes);
}

static bool mpi_exchange(void *impl, int64_t outer_step, const uint8_t *payload, size_t bytes, round_result *r) {
    mpi_transport *t = impl;
    double t0 = wall_seconds();
    memset(r, 0, sizeof *r);
    r->outer_step = outer_step;
    // Everyone's size first: they are equal in a healthy run, but a mismatch must be an
    // error rather than a buffer overrun.
    uint64_t mine = bytes, sizes[TRANSPORT_MAX_REPLICAS];
    mpi_check(MPI_Allgather(&mine, 1, MPI_UINT64_T, sizes, 1, MPI_UINT64_T, t->exchange_comm), "MPI_Allgather");
    double arrived = wall_seconds();
    size_t largest = 0;
    for (int i = 0; i < t->size; i++) largest = sizes[i] > largest ? sizes[i] : largest;
    if (largest * (size_t)t->size > t->gathered_capacity) {
        free(t->gathered);
        t->gathered_capacity = largest * (size_t)t->size;
        t->gathered = xmalloc(t->gathered_capacity);
    }
    // Piece by piece: each rank's next <= 1 GiB, gathered packed, then copied to its slot.
    int counts[TRANSPORT_MAX_REPLICAS], displs[TRANSPORT_MAX_REPLICAS];
    size_t piece = largest < PIECE_BYTES ? largest : PIECE_BYTES;
    uint8_t *packed = xmalloc(piece * (size_t)t->size + 1);
    for (size_t offset = 0; offset < largest; offset += PIECE_BYTES) {
        int at = 0;
        for (int i = 0; i < t->size; i++) {
            size_t left = sizes[i] > offset ? sizes[i] - offset : 0;
            counts[i] = (int)(left < PIECE_BYTES ? left : PIECE_BYTES);
            displs[i] = at;
            at += counts[i];
        }
        mpi_check(MPI_Allgatherv(payload + offset, counts[t->rank], MPI_BYTE, packed, counts, displs, MPI_BYTE,
                                 t->exchange_comm),
                  "MPI_Allgatherv");
        for (int i = 0; i < t->size; i++)
            memcpy(t->gathered + (size_t)i * largest + offset, packed + displs[i], (size_t)counts[i]);
    }
    free(packed);
    r->n = t->size;
    for (int i = 0; i < t->size; i++) {
        r->ids[i] = i;
        r->payload[i] = t->gathered + (size_t)i * largest;
        r->bytes[i] = sizes[i];
        if (i != t->rank) r->bytes_recv += sizes[i];
    }
    r->bytes_sent = bytes;
    r->apply = r->n >= t->min_replicas;
    r->wait_s = arrived - t0;
    r->sync_s = wall_seconds() - t0;
    return true;
}

static void mpi_send_state(void *impl, const uint8_t *state, size_t bytes) {
    (void)impl;
    (void)state;
    (void)bytes;  // never asked for: the membership of an MPI world is fixed
}

static bool mpi_agree_stop(void *impl, bool local_stop) {
    (void)impl;
    int mine = local_stop, any = 0;
    mpi_check(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    return any != 0;
}

static void mpi_close(void *impl) {
    mpi_transport *t = impl;
    MPI_Comm_free(&t->exchange_comm);
    free(t->gathered);
    free(t);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

static const transport_ops MPI_OPS = {"mpi", mpi_join, mpi_rejoin, mpi_exchange, mpi_send_state, mpi_agree_stop,
                                      mpi_close, mpi_close};

#else  // no MPI in this build

int transport_mpi_world_rank(void) {
    fail("diloco_replica_id: -1 means 'the MPI rank', but this build has no MPI; set diloco_replica_id");
}

transport *transport_mpi_open(const transport_options *o) {
    (void)o;
    fail("diloco_transport: mpi, but this build has no MPI (install libopenmpi-dev or load your cluster's MPI "
         "module, then rebuild); or use diloco_transport = tcp");
}

#endif
