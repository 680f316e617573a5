// net/transport_mpi.c — DiLoCo replicas as the ranks of one MPI world (see net/transport.h).
//
// Every exchange is the hub's reduction spread over the ranks: segment s of the payload
// (llmc/quant.h) is reduced by rank s mod M. In waves of M segments, an MPI_Ialltoallv hands
// each rank the M contributions to its segment, the rank sums them in rank order and encodes
// the mean (quant_reduce_segment, with its share of the downlink residual), and an
// MPI_Iallgatherv hands every rank the M encoded means of the wave. The ranks' tokens (the
// mean's weights) are all-gathered first. The arithmetic is the
// hub's, so tcp and mpi give the same θ bit for bit; a rank holds its payload, the mean and
// one wave (M segments in, M out), never M payloads. The membership is fixed: MPI cannot survive a dead
// rank, so there is no eviction and no joining; replicas that must survive failures use the
// tcp transport. A replica must resume at the same outer step as the others; if the ranks'
// states differ at start that is a clear error rather than a silent resync.
//
// Built only when the Makefile finds MPI (HAVE_MPI); otherwise transport_mpi_open fails
// with a one-line error naming what to install.
#ifdef HAVE_MPI
#include <mpi.h>   // first: llmc/comm.h declares its MPI helpers when it sees it
#endif
#include "net/transport_impl.h"
#include "llmc/common.h"
#include "llmc/watchdog.h"
#include "llmc/quant.h"
#include "llmc/comm.h"
#include "llmc/bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_MPI

// Where one payload layout's share of the packed downlink residual begins.
typedef struct {
    int64_t offset, values;  // the payload's place in the model (payload_spec)
    int64_t segment;         // its values per segment (payload_spec)
    int64_t base;            // its first value in mpi_transport.residual
} residual_piece;

// The residual as a checkpoint keeps it (outer_reducer.bin, docs/formats.md), little-endian:
// "TGREDUCE", u32 version, u32 replicas M, u32 this rank, u32 pieces, i64 values; per piece
// i64 offset, i64 values, i64 segment, i64 base; then the f32 values.
#define REDUCER_MAGIC "TGREDUCE"
#define REDUCER_VERSION 1u
#define REDUCER_HEAD_BYTES 32
#define REDUCER_PIECE_BYTES 32

typedef struct {
    int rank, size;
    MPI_Comm exchange_comm;  // a duplicate of the world: exchanges may run on a second thread
                             // while the main thread agrees on stopping over MPI_COMM_WORLD
    int min_replicas;
    uint8_t *mean;          // the encoded mean of the last exchange
    size_t mean_capacity;
    // The downlink residual of the segments this rank reduces, packed: for each payload layout
    // (a fragment: its model offset and length) the rank's segments s = rank, rank + M, ... lie
    // one after another from that layout's base, so the rank holds about 4/M bytes per parameter.
    float *residual;
    int64_t residual_values;
    residual_piece *pieces;
    int n_pieces;
    uint8_t *reducer_head;   // its checkpoint header (transport_reducer_state)
} mpi_transport;

static const transport_ops MPI_OPS;

static int thread_level = MPI_THREAD_SINGLE;  // what MPI_Init_thread provided

// Asks for MPI_THREAD_MULTIPLE: streaming DiLoCo exchanges on a second thread.
static void mpi_start(void) { thread_level = comm_mpi_init(); }

int transport_mpi_world_rank(void) {
    mpi_start();
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

char *transport_mpi_replica_out_dir(const char *out_dir, int replica_id) {
    mpi_start();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) return NULL;
    size_t n = strlen(out_dir) + 64;
    char *probe = xmalloc(n), *other = xmalloc(n);
    snprintf(probe, n, "%s/.replica-probe-%d", out_dir, rank);
    int fd = make_dirs(out_dir) ? open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    int made = fd >= 0, all_made = 0, err = made ? 0 : errno;
    if (fd >= 0) close(fd);
    MPI_Request rq;
    comm_mpi_check(MPI_Iallreduce(&made, &all_made, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' out_dir check");
    int shares = size;   // the lowest other rank whose probe this rank sees: size = none
    for (int r = 0; all_made && r < size; r++) {
        snprintf(other, n, "%s/.replica-probe-%d", out_dir, r);
        if (r != rank && access(other, F_OK) == 0) {
            shares = r;
            break;
        }
    }
    comm_mpi_check(MPI_Ibarrier(MPI_COMM_WORLD, &rq), "MPI_Ibarrier");   // every rank looked before any probe goes
    comm_mpi_wait_world(&rq, "the replicas' out_dir check");
    if (made) unlink(probe);
    int pair[2] = {shares < size ? rank : size, shares}, first[2];
    comm_mpi_check(MPI_Iallreduce(pair, first, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' out_dir check");
    free(probe);
    free(other);
    if (!made) fail("out_dir: cannot create '%s' or write in it: %s", out_dir, strerror(err));
    if (!all_made) fail("out_dir: another rank of this MPI job cannot write its out_dir (see its error)");
    if (first[0] == size) return NULL;
    // Two share one (srun passes every rank the same arguments): every replica writes to its own
    // directory under it, named by its id, whichever ranks shared — the layout the same on every
    // file system.
    size_t m = strlen(out_dir) + 32;
    char *own = xmalloc(m);
    snprintf(own, m, "%s/replica_%d", out_dir, replica_id);
    if (rank == 0)
        note("out_dir: replicas %d and %d of this MPI job share '%s' (as srun's one command line gives them): each "
             "replica writes to its own %s/replica_<id>",
             first[0], first[1], out_dir, out_dir);
    return own;
}

// The first `|`-separated field where a and b differ: its start in a (and *b_field in b), its
// length in a (*a_len) and b (*b_len). NULL when the texts are equal.
static const char *first_difference(const char *a, const char *b, const char **b_field, int *a_len, int *b_len) {
    while (*a || *b) {
        size_t na = strcspn(a, "|"), nb = strcspn(b, "|");
        if (na != nb || memcmp(a, b, na) != 0) {
            *b_field = b;
            *a_len = (int)na;
            *b_len = (int)nb;
            return a;
        }
        a += na + (a[na] == '|');
        b += nb + (b[nb] == '|');
    }
    return NULL;
}

// The ranks' run fingerprints differ: rank 0 sends its fingerprint's text to every rank, each
// rank finds the first field where its own differs, and every rank exits with the same error,
// naming the lowest rank that differs and the field (docs/diloco.md#replicas-of-different-sizes).
static void refuse_fingerprint(const transport_options *o, int rank, int size) {
    enum { WHY_BYTES = 512 };
    const char *mine = o->fingerprint_text ? o->fingerprint_text : "";
    long long bytes = rank == 0 ? (long long)strlen(mine) + 1 : 0;
    MPI_Request rq;
    comm_mpi_check(MPI_Ibcast(&bytes, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD, &rq), "MPI_Ibcast");
    comm_mpi_wait_world(&rq, "the run fingerprint's text");
    char *first = xmalloc((size_t)bytes);
    if (rank == 0) memcpy(first, mine, (size_t)bytes);
    comm_mpi_check(MPI_Ibcast(first, (int)bytes, MPI_CHAR, 0, MPI_COMM_WORLD, &rq), "MPI_Ibcast");
    comm_mpi_wait_world(&rq, "the run fingerprint's text");
    first[bytes - 1] = 0;
    char why[WHY_BYTES] = "";
    const char *theirs;
    int my_len, their_len;
    const char *field = first_difference(mine, first, &theirs, &my_len, &their_len);
    if (field && *mine && *first)
        snprintf(why, sizeof why, "rank %d has '%.*s' where rank 0 has '%.*s'", rank, my_len, field, their_len, theirs);
    char *all = xmalloc((size_t)size * WHY_BYTES);
    comm_mpi_check(MPI_Iallgather(why, WHY_BYTES, MPI_CHAR, all, WHY_BYTES, MPI_CHAR, MPI_COMM_WORLD, &rq),
                   "MPI_Iallgather");
    comm_mpi_wait_world(&rq, "the run fingerprint's differences");
    for (int r = 1; r < size; r++)
        if (all[(size_t)r * WHY_BYTES])
            fail("diloco (mpi): the ranks disagree on the run: %s (every replica must share the model, seq_len, "
                 "max_steps, shuffle, seed, the diloco_ keys and its train data, the shards' tokens; "
                 "docs/diloco.md#replicas-of-different-sizes)",
                 all + (size_t)r * WHY_BYTES);
    fail("diloco (mpi): the ranks disagree on the run (the model, seq_len, max_steps, shuffle, seed, a diloco_ "
         "key or the train data differs between them; docs/diloco.md#replicas-of-different-sizes)");
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
    // The start's collectives wait up to comm_timeout_s, as a job's do: a replica that failed
    // alone before them (its checkpoint, its data) exits, and under a launcher that leaves the
    // others running (srun without --kill-on-bad-exit) they waited here for ever.
    MPI_Request rq;
    comm_mpi_check(MPI_Iallreduce(&mine, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' run fingerprints");
    comm_mpi_check(MPI_Iallreduce(&mine, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' run fingerprints");
    if (lowest != highest) refuse_fingerprint(o, t->rank, t->size);
    if (o->threaded && thread_level < MPI_THREAD_MULTIPLE)
        fail("diloco_overlap_steps: an exchange that overlaps inner steps needs an MPI library with "
             "MPI_THREAD_MULTIPLE (this one provides level %d of 0..3); use diloco_overlap_steps = 0 or "
             "diloco_transport = tcp",
             thread_level);
    comm_mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &t->exchange_comm), "MPI_Comm_dup");
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
    MPI_Request rq;
    comm_mpi_check(MPI_Iallgather(&s->outer_step, 1, MPI_INT64_T, all_steps, 1, MPI_INT64_T, MPI_COMM_WORLD, &rq),
                   "MPI_Iallgather");
    comm_mpi_wait_world(&rq, "the replicas' outer steps at their join");
    comm_mpi_check(MPI_Iallgather(&s->param_hash, 1, MPI_UINT64_T, all_hashes, 1, MPI_UINT64_T, MPI_COMM_WORLD, &rq),
                   "MPI_Iallgather");
    comm_mpi_wait_world(&rq, "the replicas' outer steps at their join");
    for (int r = 1; r < t->size; r++)
        if (all_steps[r] != all_steps[0] || all_hashes[r] != all_hashes[0])
            fail("diloco (mpi): rank %d is at outer step %lld (θ hash %016llx) but rank 0 at %lld (%016llx); with "
                 "the mpi transport all replicas must resume from the same outer step (check each rank's out_dir)",
                 r, (long long)all_steps[r], (unsigned long long)all_hashes[r], (long long)all_steps[0],
                 (unsigned long long)all_hashes[0]);
    // The same outer step from checkpoints of different inner steps (one rank's newest was lost or
    // refused): the ranks step together, each step's collectives would pair different steps' calls.
    comm_mpi_check(MPI_Iallgather(&s->step, 1, MPI_INT64_T, all_steps, 1, MPI_INT64_T, MPI_COMM_WORLD, &rq),
                   "MPI_Iallgather");
    comm_mpi_wait_world(&rq, "the replicas' steps at their join");
    for (int r = 1; r < t->size; r++)
        if (all_steps[r] != all_steps[0])
            fail("diloco (mpi): rank %d resumes at step %lld but rank 0 at step %lld (both at outer step %lld); with "
                 "the mpi transport all replicas step together and must resume from the same step (check each "
                 "rank's out_dir)",
                 r, (long long)all_steps[r], (long long)all_steps[0], (long long)s->outer_step);
    return JOIN_MEMBER;
}

static join_result mpi_rejoin(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                             size_t *state_bytes) {
    return mpi_join(impl, s, state, state_capacity, state_bytes);
}

// The layout every rank must hand in: a mismatch is a broken config, not something to average.
static void check_same_spec(mpi_transport *t, const payload_spec *sp) {
    uint32_t bound_bits;
    memcpy(&bound_bits, &sp->bound, sizeof bound_bits);
    int64_t mine[9] = {sp->up_codec, sp->down_codec, sp->down_feedback, sp->block, sp->segment, sp->values,
                       sp->offset, sp->model_values, bound_bits};
    int64_t lo[9], hi[9];
    MPI_Request rq;
    comm_mpi_check(MPI_Iallreduce(mine, lo, 9, MPI_INT64_T, MPI_MIN, t->exchange_comm, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' payload layouts, at an outer step");
    comm_mpi_check(MPI_Iallreduce(mine, hi, 9, MPI_INT64_T, MPI_MAX, t->exchange_comm, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' payload layouts, at an outer step");
    if (memcmp(lo, hi, sizeof lo) != 0)
        fail("diloco (mpi): the ranks encode their outer gradients differently (diloco_quant, diloco_quant_block, "
             "diloco_topk, diloco_downlink or the model differ between their configs)");
}

// The values this rank's share of a payload's downlink residual holds: its segments rank,
// rank + M, ... each whole; -1 when the layout is out of range (a checkpoint's).
static int64_t share_values(const mpi_transport *t, int64_t values, int64_t segment) {
    if (values <= 0 || segment <= 0 || values > ((int64_t)1 << 42) || segment > ((int64_t)1 << 30)) return -1;
    int64_t n_segments = (values + segment - 1) / segment;
    return (n_segments > t->rank ? (n_segments - t->rank + t->size - 1) / t->size : 0) * segment;
}

// This rank's share of the downlink residual for the payload sp lays out, packed, zero the
// first time the layout is seen.
static float *residual_share(mpi_transport *t, const payload_spec *sp) {
    for (int i = 0; i < t->n_pieces; i++)
        if (t->pieces[i].offset == sp->offset && t->pieces[i].values == sp->values &&
            t->pieces[i].segment == sp->segment)
            return t->residual + t->pieces[i].base;
    int64_t grow = share_values(t, sp->values, sp->segment);
    CHECK(grow >= 0);
    t->pieces = xrealloc(t->pieces, (size_t)(t->n_pieces + 1) * sizeof *t->pieces);
    t->pieces[t->n_pieces++] =
        (residual_piece){.offset = sp->offset, .values = sp->values, .segment = sp->segment, .base = t->residual_values};
    t->residual = xrealloc(t->residual, (size_t)(t->residual_values + grow) * sizeof(float));
    memset(t->residual + t->residual_values, 0, (size_t)grow * sizeof(float));
    t->residual_values += grow;
    return t->residual + t->pieces[t->n_pieces - 1].base;
}

static bool mpi_exchange(void *impl, int64_t outer_step, const payload_spec *sp, const uint8_t *payload,
                         round_result *r) {
    mpi_transport *t = impl;
    double t0 = wall_seconds();
    memset(r, 0, sizeof *r);
    r->outer_step = outer_step;
    check_same_spec(t, sp);
    // Every rank's tokens: the weights of the mean (llmc/quant.h), the same on every rank. No
    // work (a replica that rolled back onto a sync step and trained nothing since): tokens 0,
    // left out of the mean and of the contributors, as the tcp hub leaves it out (until 2026-12
    // it weighed 1 token here: a Δ = 0 in the mean, and a contributor for min_replicas).
    uint64_t my_tokens = sp->no_work ? 0 : sp->tokens ? sp->tokens : 1, tokens[TRANSPORT_MAX_REPLICAS];
    MPI_Request rq;
    comm_mpi_check(MPI_Iallgather(&my_tokens, 1, MPI_UINT64_T, tokens, 1, MPI_UINT64_T, t->exchange_comm, &rq),
                   "MPI_Iallgather");
    comm_mpi_wait_world(&rq, "the replicas' tokens, at an outer step");
    double weights[TRANSPORT_MAX_REPLICAS];
    for (int p = 0; p < t->size; p++) weights[p] = (double)tokens[p];
    double arrived = wall_seconds();
    quant_codec up = sp->up_codec, down = sp->down_codec;
    int M = t->size;
    size_t up_chunk = quant_encoded_bytes(up, sp->segment, sp->block);
    size_t down_chunk = quant_encoded_bytes(down, sp->segment, sp->block);
    size_t mean_bytes = payload_spec_down_bytes(sp);
    if (mean_bytes > t->mean_capacity) {
        free(t->mean);
        t->mean = xmalloc(mean_bytes);
        t->mean_capacity = mean_bytes;
    }
    float *residual = sp->down_feedback && down != QUANT_NONE ? residual_share(t, sp) : NULL;
    CHECK((size_t)M * up_chunk < (size_t)INT32_MAX && (size_t)M * down_chunk < (size_t)INT32_MAX);
    int64_t n_segments = (sp->values + sp->segment - 1) / sp->segment;
    uint8_t *in = xmalloc((size_t)M * up_chunk), *out = xmalloc(down_chunk);
    float *scratch = alloc_floats((size_t)sp->segment);
    const uint8_t *ins[TRANSPORT_MAX_REPLICAS];
    quant_effect effect[TRANSPORT_MAX_REPLICAS];
    quant_reduction q = {.up = up, .down = down, .block = sp->block, .bound = sp->bound, .weights = weights};
    int64_t bounded[TRANSPORT_MAX_REPLICAS] = {0};
    float least[TRANSPORT_MAX_REPLICAS];
    int scounts[TRANSPORT_MAX_REPLICAS], sdispls[TRANSPORT_MAX_REPLICAS];
    int rcounts[TRANSPORT_MAX_REPLICAS], rdispls[TRANSPORT_MAX_REPLICAS];
    bool told[TRANSPORT_MAX_REPLICAS] = {false}, capped[TRANSPORT_MAX_REPLICAS] = {false};
    for (int64_t base = 0; base < n_segments; base += M) {
        // Segment base + q goes to rank q: its bytes in this payload, and what it takes back.
        int64_t mine = base + t->rank;
        int64_t my_len = mine < n_segments ? min_i64(sp->segment, sp->values - mine * sp->segment) : 0;
        size_t my_up = my_len ? quant_encoded_bytes(up, my_len, sp->block) : 0;
        for (int q = 0; q < M; q++) {
            int64_t s = base + q;
            int64_t len = s < n_segments ? min_i64(sp->segment, sp->values - s * sp->segment) : 0;
            scounts[q] = len ? (int)quant_encoded_bytes(up, len, sp->block) : 0;
            sdispls[q] = 0;
            rcounts[q] = (int)my_up;
            rdispls[q] = (int)((size_t)q * up_chunk);
        }
        // The wave's segments are contiguous in the payload: displacements from its start.
        const uint8_t *wave = payload + (size_t)base * up_chunk;
        for (int q = 1; q < M; q++) sdispls[q] = sdispls[q - 1] + scounts[q - 1];
        comm_mpi_check(MPI_Ialltoallv(wave, scounts, sdispls, MPI_BYTE, in, rcounts, rdispls, MPI_BYTE,
                                      t->exchange_comm, &rq),
                       "MPI_Ialltoallv");
        comm_mpi_wait_world(&rq, "the outer gradients' segments, at an outer step");
        size_t my_down = 0;
        if (my_len) {
            for (int p = 0; p < M; p++) ins[p] = in + (size_t)p * up_chunk;
            float *res = residual ? residual + (base / M) * sp->segment : NULL;
            if (quant_reduce_segment(&q, ins, M, my_len, res, scratch, out, effect))
                for (int p = 0; p < M; p++) {
                    if (effect[p].left_out && !told[p]) {
                        told[p] = true;
                        warn("diloco (mpi): outer step %lld: replica %d's contribution holds NaN/Inf; left out of the "
                             "mean of such segments",
                             (long long)outer_step + 1, p);
                    }
                    if (effect[p].factor != 1.0f) {
                        if (!bounded[p] || effect[p].factor < least[p]) least[p] = effect[p].factor;
                        bounded[p]++;
                    }
                    if (effect[p].weight_capped && !capped[p]) {
                        capped[p] = true;
                        warn("diloco (mpi): outer step %lld: replica %d claims %llu tokens, more than %g x the "
                             "median: its weight is capped there",
                             (long long)outer_step + 1, p, (unsigned long long)tokens[p], (double)sp->bound);
                    }
                }
            my_down = quant_encoded_bytes(down, my_len, sp->block);
            r->bytes_sent += (uint64_t)my_down * (uint64_t)(M - 1);
            r->bytes_recv += (uint64_t)my_up * (uint64_t)(M - 1);
        }
        for (int q = 0; q < M; q++) {
            int64_t s = base + q;
            int64_t len = s < n_segments ? min_i64(sp->segment, sp->values - s * sp->segment) : 0;
            rcounts[q] = len ? (int)quant_encoded_bytes(down, len, sp->block) : 0;
            rdispls[q] = (int)((size_t)q * down_chunk);
            if (q != t->rank) {
                r->bytes_sent += (uint64_t)scounts[q];
                r->bytes_recv += (uint64_t)rcounts[q];
            }
        }
        comm_mpi_check(MPI_Iallgatherv(out, (int)my_down, MPI_BYTE, t->mean + (size_t)base * down_chunk, rcounts,
                                       rdispls, MPI_BYTE, t->exchange_comm, &rq),
                       "MPI_Iallgatherv");
        comm_mpi_wait_world(&rq, "the means' segments, at an outer step");
        // A wave moved: progress for the watchdog, which watches the outer work from its last
        // progress (a 14B model's exchange at 100 Mbit/s takes longer than watchdog_s).
        watchdog_progress();
    }
    for (int p = 0; p < M; p++)
        if (bounded[p])
            warn("diloco (mpi): outer step %lld: replica %d's outer gradient bounded in %lld of the segments rank %d "
                 "reduced (norm above %g x the median; scaled by down to %.3g)",
                 (long long)outer_step + 1, p, (long long)bounded[p], t->rank, (double)sp->bound, (double)least[p]);
    free(in);
    free(out);
    free(scratch);
    r->n = 0;
    for (int i = 0; i < M; i++)
        if (tokens[i] > 0) r->ids[r->n++] = i;
    r->mean = t->mean;
    r->mean_bytes = mean_bytes;
    r->apply = r->n > 0 && r->n >= t->min_replicas;
    r->wait_s = arrived - t0;
    r->sync_s = wall_seconds() - t0;
    return true;
}

static void mpi_send_state(void *impl, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    (void)impl, (void)state, (void)bytes, (void)hooks;  // never asked for: the membership of an MPI
                                                        // world is fixed
}

static bool mpi_reducer_state(void *impl, const void **head, size_t *head_bytes, const void **body,
                              size_t *body_bytes) {
    mpi_transport *t = impl;
    if (!t->residual_values) return false;
    *head_bytes = REDUCER_HEAD_BYTES + (size_t)t->n_pieces * REDUCER_PIECE_BYTES;
    free(t->reducer_head);
    uint8_t *h = t->reducer_head = xmalloc(*head_bytes);
    memcpy(h, REDUCER_MAGIC, 8);
    put_u32(h + 8, REDUCER_VERSION);
    put_u32(h + 12, (uint32_t)t->size);
    put_u32(h + 16, (uint32_t)t->rank);
    put_u32(h + 20, (uint32_t)t->n_pieces);
    put_u64(h + 24, (uint64_t)t->residual_values);
    for (int i = 0; i < t->n_pieces; i++) {
        uint8_t *q = h + REDUCER_HEAD_BYTES + (size_t)i * REDUCER_PIECE_BYTES;
        put_u64(q, (uint64_t)t->pieces[i].offset);
        put_u64(q + 8, (uint64_t)t->pieces[i].values);
        put_u64(q + 16, (uint64_t)t->pieces[i].segment);
        put_u64(q + 24, (uint64_t)t->pieces[i].base);
    }
    *head = h;
    *body = t->residual;
    *body_bytes = (size_t)t->residual_values * sizeof(float);
    return true;
}

static bool mpi_restore_reducer(void *impl, const uint8_t *b, size_t n, char *why, size_t why_bytes) {
    mpi_transport *t = impl;
    if (n < REDUCER_HEAD_BYTES || memcmp(b, REDUCER_MAGIC, 8) != 0 || get_u32(b + 8) != REDUCER_VERSION) {
        snprintf(why, why_bytes, "outer_reducer.bin: not a reducer state of version %u", REDUCER_VERSION);
        return false;
    }
    uint32_t replicas = get_u32(b + 12), rank = get_u32(b + 16), pieces = get_u32(b + 20);
    uint64_t values = get_u64(b + 24);
    size_t head = REDUCER_HEAD_BYTES + (size_t)pieces * REDUCER_PIECE_BYTES;
    if (pieces > 1u << 20 || values > ((uint64_t)1 << 42) || n != head + values * sizeof(float)) {
        snprintf(why, why_bytes, "outer_reducer.bin: %zu bytes, not the %u piece(s) and %llu value(s) it announces", n,
                 pieces, (unsigned long long)values);
        return false;
    }
    // Another M or rank: the pieces' layout is the saved replica's (its shares of each segment),
    // which this one cannot check nor use. It was checked against this replica's shares, and a
    // resume with several fragments (several pieces, the second one's base not 0) was refused.
    if (replicas != (uint32_t)t->size || rank != (uint32_t)t->rank) {
        note("diloco (mpi): the checkpoint's downlink residual was replica %u's of %u; this is replica %d of %d: it "
             "starts from zero",
             rank, replicas, t->rank, t->size);
        return true;
    }
    residual_piece *p = xcalloc(pieces ? pieces : 1, sizeof *p);
    int64_t next = 0;
    for (uint32_t i = 0; i < pieces; i++) {
        const uint8_t *q = b + REDUCER_HEAD_BYTES + (size_t)i * REDUCER_PIECE_BYTES;
        p[i] = (residual_piece){.offset = (int64_t)get_u64(q), .values = (int64_t)get_u64(q + 8),
                                .segment = (int64_t)get_u64(q + 16), .base = (int64_t)get_u64(q + 24)};
        int64_t share = share_values(t, p[i].values, p[i].segment);
        if (share < 0 || p[i].base != next || p[i].offset < 0) {
            free(p);
            snprintf(why, why_bytes, "outer_reducer.bin: piece %u's layout is inconsistent", i);
            return false;
        }
        next += share;
    }
    if (next != (int64_t)values) {
        free(p);
        snprintf(why, why_bytes, "outer_reducer.bin: its pieces hold %lld values, not %llu", (long long)next,
                 (unsigned long long)values);
        return false;
    }
    free(t->pieces);
    free(t->residual);
    t->pieces = p;
    t->n_pieces = (int)pieces;
    t->residual_values = (int64_t)values;
    t->residual = alloc_floats((size_t)values);
    memcpy(t->residual, b + head, (size_t)values * sizeof(float));
    return true;
}

// Every collective of a step and an exchange waits at most comm_timeout_s (comm_mpi_wait_world),
// as the start's do: a replica that hung or died under a launcher that lets the others run on
// (srun without --kill-on-bad-exit) left them in MPI_Allreduce here, or in the exchange, for
// ever with watchdog_s = 0 and 30 minutes by default; now they exit with status 75 after
// comm_timeout_s, naming the collective.
static bool mpi_agree_stop(void *impl, bool local_stop) {
    (void)impl;
    int mine = local_stop, any = 0;
    MPI_Request rq;
    comm_mpi_check(MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &rq), "MPI_Iallreduce");
    comm_mpi_wait_world(&rq, "the replicas' stop agreement, at a step");
    return any != 0;
}

static void mpi_close(void *impl) {
    mpi_transport *t = impl;
    MPI_Comm_free(&t->exchange_comm);
    free(t->mean);
    free(t->residual);
    free(t->pieces);
    free(t->reducer_head);
    free(t);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

// Membership is fixed: nobody to tell why it goes.
static void mpi_leave(void *impl, int64_t outer_step, bool finished) {
    (void)outer_step, (void)finished;
    mpi_close(impl);
}

static const transport_ops MPI_OPS = {.name = "mpi",
                                      .join = mpi_join,
                                      .rejoin = mpi_rejoin,
                                      .exchange = mpi_exchange,
                                      .send_state = mpi_send_state,
                                      .agree_stop = mpi_agree_stop,
                                      .leave = mpi_leave,
                                      .close = mpi_close,
                                      .reducer_state = mpi_reducer_state,
                                      .restore_reducer = mpi_restore_reducer};

void transport_mpi_check_built(void) {}

#else  // no MPI in this build

void transport_mpi_check_built(void) {
    fail("diloco_transport: mpi, but this build has no MPI (install libopenmpi-dev or load your cluster's MPI "
         "module, then rebuild)%s",
         transport_tcp_built() ? "; or use diloco_transport = tcp" : "");
}

int transport_mpi_world_rank(void) {
    transport_mpi_check_built();
    return -1;
}

char *transport_mpi_replica_out_dir(const char *out_dir, int replica_id) {   // no MPI world to share one
    (void)out_dir;
    (void)replica_id;
    return NULL;
}

transport *transport_mpi_open(const transport_options *o) {
    (void)o;
    transport_mpi_check_built();
    return NULL;
}

#endif
