// net/relay.c — the hub of the tcp transport. See net/relay.h; the protocol and the state machine
// are in docs/protocol.md.
//
// One thread, one poll() loop, non-blocking sockets: a peer that stalls or floods costs
// a few buffers and is cut off at its deadline, and nothing it sends can block the others.
//
// Who is who. A connection starts in the handshake (the hub sends HELLO; the peer must
// answer with an AUTH proving the secret within timeout_s). An authenticated stream 0 is
// a replica's control connection and creates its session; streams 1..S attach to that
// session as data connections. A session is CONNECTED, then (after JOIN) a MEMBER, or
// WAITING for a donor's state.
//
// Rounds. The hub reduces: it decodes each contribution segment by segment as it arrives
// (a segment is one DATA chunk, encoded on its own, llmc/quant.h), and once every
// contributor of the round has delivered segment c it sums them in fp32 in ascending replica
// id, divides, encodes the mean for the way back (the downlink codec, with the hub's
// error-feedback residual) and sends that one encoded segment to every contributor. So a
// replica sends one payload and receives one, whatever M is, and every replica receives the
// same bytes. The first CONTRIBUTE of a step opens the round and fixes its layout (codecs,
// block, segment, values); a member announcing another is evicted. Segments wait at the hub
// only until the slowest contributor's arrive: a contributor more than WINDOW_SEGMENTS ahead of
// the reduction is not read (TCP pushes back), and the reduction waits while a receiver has
// DOWN_BACKLOG_SEGMENTS unsent, so the hub holds O(M · window) segments, not M payloads. A
// member that has not begun blocks the reduction: the round's deadline is timeout_s after
// the first contribution began; members that have not begun by then are evicted as late,
// uploads that move are waited for (one stalled for timeout_s is dropped). A state transfer
// holds the round: its donor and joiners are waited for while it moves, and have its duration
// on top of timeout_s after it; the heartbeats say HOLD meanwhile. --max_hold_s cuts one that
// holds too long (its joiners get a donor again only after 2, 4, .. 64 closes); one left without
// joiners is stopped; either way the donor is told to stop sending (STATE_ABORT). The round closes
// when every member has contributed whole and every segment is sent: ROUND names the whole
// contributions (apply = n >= min_replicas). A contributor dropped mid-upload is in the
// segments reduced before it stopped and not in the later ones; it may not contribute to
// the same round again.
// Joins. A replica whose status matches the group's (known only from the first member until
// the group's first round closes, and after an empty group is refounded) is a member at once;
// any other waits. At a round close with replicas waiting, the lowest-id contributor is
// told to send its state (send_state); the waiting replicas become members for the next
// round, and the state is relayed chunk by chunk as it arrives (cut-through, with a bounded
// backlog per joiner), never stored whole. If the donor dies mid-transfer the joiners wait
// again for the next boundary. A group left without members is refounded by the lowest-id
// waiting replica.
//
// Several hubs (docs/protocol.md, "Several hubs"). Round ids are 64·k + 8·attempt + share.
// FOLLOW makes a replica a member without a state (its primary hub does the joins). DONE says
// a replica's exchange for step k is over: a completion makes a round of step k it was due in
// and has not begun another set's (aborted: its contributors rejoin), and later contributions to
// step k stale. The first AUTH fixes which hub of how many this one is; another place is refused.
#include "net/relay.h"

#include "llmc/common.h"
#include "llmc/fault.h"
#include "llmc/quant.h"
#include "net/conn.h"
#include "net/socket.h"
#include "net/transport.h"
#include "net/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

_Static_assert(WIRE_MAX_REPLICAS == TRANSPORT_MAX_REPLICAS, "wire and transport agree on the replica limit");

#define MAX_CONNS 2048
#define MAX_HANDSHAKES 128
#define ACCEPTS_PER_LOOP 64   // then back to poll: the members' frames and heartbeats go on under a flood
#define STATE_BACKLOG_BYTES ((uint64_t)64 << 20)   // per joiner: pause the donor above this
#define QUEUE_DEPTH_FRAMES 2                        // frames handed to a data connection at once
#define WINDOW_SEGMENTS 16        // a contributor may run this many segments ahead of the reduction
#define DOWN_BACKLOG_SEGMENTS 8   // the reduction waits while a receiver has this many unsent

typedef enum { ROLE_HANDSHAKE, ROLE_CONTROL, ROLE_DATA, ROLE_CLOSING } conn_role;

typedef struct {
    conn c;
    conn_role role;
    int replica;                    // control/data: the replica's id
    int stream;                     // data: 1..streams
    uint8_t nonce_h[WIRE_NONCE_BYTES];
    // data: the last payload segment read from this connection in round seg_round (a replica
    // sends its segments in order on each connection, so the next one is beyond it)
    int64_t last_seg;
    uint64_t seg_round;
    double opened_s, closing_deadline_s;
    bool linger;                    // closing: only at closing_deadline_s (a dropped replica's data stream)
    bool dead;                      // swept at the end of the loop iteration
} hub_conn;

// A DATA frame waiting for one of a replica's data connections.
typedef struct pending {
    struct pending *next;
    uint8_t head[WIRE_DATA_HEAD_BYTES];
    const uint8_t *bulk;
    size_t bulk_bytes;
    blob *ref;
} pending;

// A transfer being received in chunks: a contribution or a state.
typedef struct {
    bool started, announced;
    int64_t step;
    uint64_t total;
    uint32_t chunk;
    uint64_t chunks, chunks_have;
    uint8_t *have;                  // one bit per chunk
    double last_progress_s;
} transfer;

typedef enum { R_FREE, R_CONNECTED, R_WAITING, R_MEMBER } replica_state;

typedef struct {
    uint64_t offset, values;        // model positions
    float *r;
} residual_range;

// A contributor's part of the open round: its segments that arrived and wait for the
// others' (each is freed once reduced).
typedef struct {
    bool began;                     // a frame of its contribution arrived
    bool announced;                 // its CONTRIBUTE arrived and matched the round's layout
    bool whole;                     // its contribution is complete: it counts
    bool left;                      // it began the round and left it (whole or not): no second try
    bool nonfinite_told;            // a segment of NaN/Inf was logged
    bool capped_told;               // its token weight was capped (logged once)
    int64_t bounded;                // segments the bound scaled down
    float least_factor;             // the smallest such scale
    uint64_t tokens;                // from its CONTRIBUTE: its weight in the mean
    uint64_t total;
    int64_t n_segments, prefix;     // segments 0 .. prefix - 1 have arrived
    blob **seg;                     // [n_segments]
} contribution;

typedef struct {
    replica_state state;
    uint64_t session_id;
    hub_conn *control;
    hub_conn *data[WIRE_MAX_STREAMS + 1];   // 1..streams
    int streams;
    char peer[96];
    wire_status status;             // from JOIN
    bool joiner;                    // member for the next round, its state still on the way
    bool held;                      // a founding member whose JOINED waits for the quorum
    int64_t member_from;            // a member is expected in rounds from this id on (FOLLOW, or a
                                    // joiner of a run with several hubs); it may begin an earlier one
    // several hubs (outer step k = round id / 64): the last step it began a round of here, and
    // the last step it said DONE for (-1: none)
    int64_t began_step, done_step;
    int min_replicas;               // from its AUTH
    transfer up;                    // its contribution to the open round (which chunks came)
    pending *queue_head, *queue_tail;
    uint64_t queued_bytes;
    // the way down: when its data connections last took a byte of what the hub has for it (or
    // it had nothing waiting), and their byte count then
    double down_progress_s;
    uint64_t down_tx_seen;
    double next_heartbeat_s;
    // How long a state transfer it sent or received kept it from its inner phase: its deadline
    // in the next round it is due in is that much later (0 once it begins a contribution).
    double transfer_delay_s;
    // A joiner whose state is whole at the hub but still in its queue: held until it drains;
    // when its transfer began (its donor's designation).
    bool state_draining;
    double state_began_s;
    // Expected in a round that was open when it followed (several hubs): its deadline counts
    // from its FOLLOW, this much after the round's first contribution.
    double follow_delay_s;
    // several hubs: it sends a state through another hub (HOLD_BEGIN), since when
    bool donating;
    double donating_since_s;
    // Transfers to it cut by --max_hold_s, and the close from which it may be given a donor
    // again (a replica whose state cannot arrive in time must not hold the group every round).
    int cuts;
    int64_t retry_at_close;
    // A donor whose transfer ended early (it is told to stop: STATE_ABORT): its state frames
    // still on the way are let go, not taken for a protocol error, until it is a donor again.
    bool state_cut;
    // A joiner of a catch-up transfer: from its donor's designation until it begins a
    // contribution, it gets the donor's state and means; caught_up_to: the round it said it will
    // have reached (CAUGHT_UP: it is due from the next one), -1 before.
    bool catching_up;
    int64_t caught_up_to;
    // It joined a catch-up transfer in flight: the chunks of the state the hub had relayed
    // before (one bit each), which the donor sends again after the rest (STATE_AGAIN). NULL: none.
    uint8_t *lacks;
    // With several hubs: a replica that caught up through its primary follows this hub
    // (FOLLOW_CATCHUP): its first round here waits for it as the primary's does (it began its
    // inner phase a catch-up mean after the others): timeout_s plus as long as its state took
    // where that is known (follow_bounded), else until it begins a contribution.
    bool follow_held;
    // When its FOLLOW of no round came (it waits for its state through its primary); 0: none.
    // follow_bounded: that time was known at its catch-up FOLLOW, and its first round waits
    // timeout_s plus it (transfer_delay_s); unknown (a first join follows no hub before its state
    // comes), the round waits until it begins, as before 2026-12.
    double follow_waiting_since_s;
    bool follow_bounded;
} replica;

struct relay {
    relay_options o;
    uint8_t *secret;
    FILE *log;
    double t0, heartbeat_s;
    int listen_fd, port;
    // Out of file descriptors (accept: EMFILE): a descriptor kept in reserve is given up to
    // accept and close the next connection (so that it does not wait in the backlog, keeping the
    // listener readable: a busy loop); without one the listener is not polled for a moment.
    int reserve_fd;
    double listen_paused_until_s;
    double fd_warned_s;             // the last warning (one per 10 s)
    uint64_t fd_refused;            // connections refused since
    // Lines about connections that have not proven the secret (anyone can open them, thousands a
    // second): the first UNPROVEN_LINES of each UNPROVEN_WINDOW_S, then the rest counted and said
    // in one line (unproven_log).
    double unproven_window_s;       // when the current window began
    int unproven_lines;             // lines written in it
    uint64_t unproven_quiet;        // lines held back in it
    char unproven_last[320];        // the last of them
    int wake[2];                    // a byte here wakes the loop (stop)
    atomic_bool stop;
    atomic_int sessions;            // replicas connected (for relay_wait_until_empty)
    volatile sig_atomic_t *stop_signal;
    pthread_t thread;
    hub_conn **conns;
    int n_conns;
    replica reps[WIRE_MAX_REPLICAS];
    // the group
    bool fingerprint_set;
    uint64_t fingerprint;
    bool status_known;
    wire_status status;
    int64_t follow_from;            // a group founded by FOLLOW: its founder's first round (-1: none)
    // the run is over: a replica of this fingerprint left having finished it (LEAVE_FINISHED);
    // a replica that comes back once no member is left is told so instead of founding a group
    int finished_by;                // -1: none
    int64_t finished_step;
    uint64_t finished_fingerprint;
    // the open round
    bool round_open;
    uint64_t round_serial;          // counts the rounds opened (hub_conn.seg_round)
    int64_t round_step, last_closed_step;
    double first_began_s;           // < 0: no contribution began yet
    bool round_sized;               // spec is fixed (by the first CONTRIBUTE)
    wire_contribute spec;           // the layout every contribution to the round follows
    uint64_t round_total;           // bytes of each contribution (fixed by the first frame)
    uint32_t round_chunk;
    int64_t n_segments, reduced;    // the round's segments; those reduced and sent
    uint32_t down_chunk;            // bytes of one whole segment of the mean
    uint64_t down_total;
    contribution contrib[WIRE_MAX_REPLICAS];   // per contributor (kept if it dies once whole)
    uint64_t round_in_bytes, round_out_bytes;
    float *scratch;                 // one segment of floats
    size_t scratch_values;
    // the downlink's error feedback: what the encoded means did not carry, per model value, for
    // the ranges of the model this hub has reduced (with several hubs, its shares: not the model)
    residual_range *residual;
    int n_residual;
    uint64_t residual_model;        // the model_values the ranges belong to
    float *round_residual;          // the open round's range (NULL: no feedback)
    // several hubs: every replica lists this hub as hub hub_index of hubs (from the first AUTH)
    bool order_set;
    int order_by;
    uint16_t hub_index, hubs;
    int64_t completed_step;         // the last outer step a member completed (DONE), -1: none
    // the fault hook relay_die_in_close (docs/protocol.md): rounds closed with 2 or more
    // contributors; dying: ROUND went to one replica only, the hub dies at its DONE
    int64_t shared_closes;
    int dying_for;                  // -1: not dying
    double dying_deadline_s;
    // the state transfer
    int donor;                      // -1: none
    double donor_progress_s;        // designation, last chunk, or last moment it was paused
    double donor_grace_s;           // how long it may take to announce its state: timeout_s, or 3 ×
                                    // with several hubs (it sends once every share's round is in)
    double transfer_began_s;        // the donor's designation
    int64_t closes;                 // rounds closed
    transfer st;
    // A catch-up transfer (relay_options.catch_up): the state is the donor's θ and m after round
    // `st.step`; then the donor sends the mean and settings of each round it lands (patch: the
    // one on its way), patched_through the last whole one. It ends once every joiner began a
    // contribution (or left): the donor is told STATE_END.
    bool catchup;
    int64_t patched_through;
    transfer patch;
    // Replicas that come while its state's first pass is on its way join it (lacks): the donor's
    // STATE (for them), whether the hub has told the donor which chunks to send again (once the
    // first pass is whole), how many (chunks 1 .. again_chunks − 1), and those received again.
    wire_state announced;
    bool means_begun;               // a chunk of a mean has come (none in flight may join after)
    bool again_said;
    uint64_t again_chunks;
    transfer again;
    // The chunks of means beyond what some joiner was told to wait for (its caught_up_to): kept
    // until the transfer ends, in case a CAUGHT_UP said again moves it on (a sharded joiner's
    // ranks agree on one round), not queued to it meanwhile (it trains and does not read them).
    struct held_chunk *held;
};

typedef struct held_chunk {
    struct held_chunk *next;
    wire_data d;                    // d.bytes: into ref
    blob *ref;
} held_chunk;

// ---------------------------------------------------------------- logging
static void PRINTF_LIKE(2, 3) hub_log(relay *h, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    for (char *p = line; *p; p++)
        if (*p == '\n') *p = ' ';
    fprintf(h->log, "%s [%9.3fs] %s\n", h->o.name ? h->o.name : "relay", wall_seconds() - h->t0, line);
    fflush(h->log);
}

#define UNPROVEN_LINES 20
#define UNPROVEN_WINDOW_S 60.0

// Says how many lines about connections without the secret were held back in the window that
// ends, and opens the next.
static void unproven_window(relay *h, double now) {
    if (h->unproven_quiet)
        hub_log(h, "%llu more connections without the secret were refused in the last %.0f s, not logged one by "
                   "one (the last: %s)",
                (unsigned long long)h->unproven_quiet, now - h->unproven_window_s, h->unproven_last);
    h->unproven_window_s = now;
    h->unproven_lines = 0;
    h->unproven_quiet = 0;
}

// A line about a connection that has not proven the secret: a flood of them wrote a line each
// (bench/diloco/relay_flood: 98,654 lines, 13.7 MB in 8 s, on the login node's disk) and buried
// the members' lines.
static void PRINTF_LIKE(2, 3) unproven_log(relay *h, const char *fmt, ...) {
    double now = wall_seconds();
    if (now - h->unproven_window_s >= UNPROVEN_WINDOW_S) unproven_window(h, now);
    char line[sizeof h->unproven_last];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (h->unproven_lines < UNPROVEN_LINES) {
        if (++h->unproven_lines == UNPROVEN_LINES)
            hub_log(h, "%s (the last such line for up to %.0f s: the others are counted)", line,
                    UNPROVEN_WINDOW_S - (now - h->unproven_window_s));
        else
            hub_log(h, "%s", line);
    } else {
        h->unproven_quiet++;
        memcpy(h->unproven_last, line, sizeof line);
    }
}

// ---------------------------------------------------------------- connections
static hub_conn *add_conn(relay *h, int fd, const char *peer) {
    hub_conn *hc = xcalloc(1, sizeof *hc);
    conn_init(&hc->c, fd, peer);
    hc->role = ROLE_HANDSHAKE;
    hc->replica = -1;
    hc->opened_s = wall_seconds();
    h->conns = xrealloc(h->conns, (size_t)(h->n_conns + 1) * sizeof *h->conns);
    h->conns[h->n_conns++] = hc;
    return hc;
}

// Closing after a REFUSE: the queued frame still goes out (for a second at most).
static void close_after_flush(hub_conn *hc) {
    hc->role = ROLE_CLOSING;
    hc->replica = -1;
    hc->c.allowed_rx = 0;
    hc->closing_deadline_s = wall_seconds() + 1.0;
}

static void sweep_conns(relay *h) {
    int kept = 0;
    for (int i = 0; i < h->n_conns; i++) {
        hub_conn *hc = h->conns[i];
        if (hc->dead) {
            conn_close(&hc->c);
            free(hc);
        } else {
            h->conns[kept++] = hc;
        }
    }
    h->n_conns = kept;
}

// ---------------------------------------------------------------- transfers
static void transfer_reset(transfer *t) {
    free(t->have);
    memset(t, 0, sizeof *t);
}

// Starts (or checks against what was started) a transfer from a frame that describes it.
static const char *transfer_expect(transfer *t, int64_t step, uint64_t total, uint32_t chunk) {
    if (t->started) {
        if (t->step != step || t->total != total || t->chunk != chunk)
            return "its chunks disagree with the transfer it announced";
        return NULL;
    }
    t->started = true;
    t->step = step;
    t->total = total;
    t->chunk = chunk;
    t->chunks = (total + chunk - 1) / chunk;
    t->have = calloc((size_t)(t->chunks / 8 + 1), 1);
    if (!t->have) return "the hub is out of memory for its transfer";
    t->last_progress_s = wall_seconds();
    return NULL;
}

// Marks a chunk received; NULL, or why the chunk is wrong.
static const char *transfer_take(transfer *t, const wire_data *d) {
    uint64_t i = d->offset / t->chunk;
    if (t->have[i / 8] & (1u << (i % 8))) return "it sent the same chunk twice";
    t->have[i / 8] |= (uint8_t)(1u << (i % 8));
    t->chunks_have++;
    t->last_progress_s = wall_seconds();
    return NULL;
}

static bool transfer_whole(const transfer *t) { return t->started && t->announced && t->chunks_have == t->chunks; }

// ---------------------------------------------------------------- replicas
static replica *rep(relay *h, int id) { return &h->reps[id]; }

static void free_held(relay *h) {
    for (held_chunk *c = h->held, *next; c; c = next) {
        next = c->next;
        blob_release(c->ref);
        free(c);
    }
    h->held = NULL;
}

// A replica that joined a transfer in flight needs none of its chunks again (it has them, or
// left the transfer).
static void forget_lacks(replica *r) {
    free(r->lacks);
    r->lacks = NULL;
}

// No transfer in flight any more (it ended, or was aborted): the next close may designate one.
static void clear_transfer(relay *h) {
    h->donor = -1;
    h->catchup = false;
    transfer_reset(&h->st);
    transfer_reset(&h->patch);
    transfer_reset(&h->again);
    h->again_said = h->means_begun = false;
    h->again_chunks = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) forget_lacks(&h->reps[i]);
    free_held(h);
}
// Whether the donor's frames go to replica r: a joiner, or (catch-up) a replica catching up.
static bool receives_state(const replica *r) { return r->joiner || r->catching_up; }

// A run with several hubs numbers its rounds 64·k + 8·attempt + share (docs/protocol.md); its
// replicas' AUTH say how many hubs they list.
#define HUB_ROUNDS_PER_STEP WIRE_ROUNDS_PER_STEP
static bool several_hubs(const relay *h) { return h->order_set && h->hubs > 1; }
static int64_t step_of(int64_t round) { return round / HUB_ROUNDS_PER_STEP; }
// A catch-up transfer counts in the donor's landings: rounds with one hub, outer steps with
// several (a step's shares land together). The unit of a round id, and a unit's first round.
static int64_t landing_of(const relay *h, int64_t round) { return several_hubs(h) ? step_of(round) : round; }
// The landing of the last round this hub closed (-1: none yet).
static int64_t closed_landing(const relay *h) { return h->last_closed_step < 0 ? -1 : landing_of(h, h->last_closed_step); }
static int64_t first_round_of(const relay *h, int64_t landing) {
    return several_hubs(h) ? landing * HUB_ROUNDS_PER_STEP : landing;
}

static uint64_t backlog_bytes(const replica *r);

static void queue_data(replica *r, const wire_data *d, const uint8_t *bulk, blob *ref) {
    if (backlog_bytes(r) == 0) r->down_progress_s = wall_seconds();   // the way down's clock starts
    pending *p = xcalloc(1, sizeof *p);
    wire_encode_data_head(d, p->head);
    p->bulk = bulk;
    p->bulk_bytes = (size_t)d->chunk_len;
    p->ref = blob_ref(ref);
    if (r->queue_tail) r->queue_tail->next = p;
    else r->queue_head = p;
    r->queue_tail = p;
    r->queued_bytes += p->bulk_bytes + WIRE_DATA_HEAD_BYTES + WIRE_OVERHEAD_BYTES;
}

static void drop_queue(replica *r) {
    for (pending *p = r->queue_head, *next; p; p = next) {
        next = p->next;
        blob_release(p->ref);
        free(p);
    }
    r->queue_head = r->queue_tail = NULL;
    r->queued_bytes = 0;
    for (int s = 1; s <= r->streams; s++)
        if (r->data[s]) conn_drop_unsent(&r->data[s]->c);
}

static uint64_t backlog_bytes(const replica *r) {
    uint64_t b = r->queued_bytes;
    for (int s = 1; s <= r->streams; s++)
        if (r->data[s]) b += r->data[s]->c.out_bytes;
    return b;
}

// Hands queued frames to the data connections with room: whichever stream drains first
// takes the next chunk, so a slow stream never holds the others back.
static void feed_streams(replica *r) {
    for (bool moved = true; moved && r->queue_head;) {
        moved = false;
        for (int s = 1; s <= r->streams && r->queue_head; s++) {
            hub_conn *dc = r->data[s];
            if (!dc || dc->dead || dc->c.out_frames >= QUEUE_DEPTH_FRAMES) continue;
            pending *p = r->queue_head;
            r->queue_head = p->next;
            if (!r->queue_head) r->queue_tail = NULL;
            r->queued_bytes -= p->bulk_bytes + WIRE_DATA_HEAD_BYTES + WIRE_OVERHEAD_BYTES;
            conn_send(&dc->c, WIRE_DATA, p->head, WIRE_DATA_HEAD_BYTES, p->bulk, p->bulk_bytes, p->ref);
            blob_release(p->ref);
            free(p);
            moved = true;
        }
    }
}

static void send_control(relay *h, replica *r, unsigned type, const uint8_t *payload, size_t bytes) {
    (void)h;
    if (r->control && !r->control->dead) conn_send(&r->control->c, type, payload, bytes, NULL, 0, NULL);
}

static int count_members(relay *h) {
    int n = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) n += h->reps[i].state == R_MEMBER;
    return n;
}

// ---------------------------------------------------------------- the round's segments
static void contribution_drop_segments(contribution *k) {
    for (int64_t c = 0; k->seg && c < k->n_segments; c++) {
        blob_release(k->seg[c]);
        k->seg[c] = NULL;
    }
}

static void contribution_reset(contribution *k) {
    contribution_drop_segments(k);
    free(k->seg);
    memset(k, 0, sizeof *k);
}

// Whether member id takes part in the open round: from its first round on (member_from), or
// once it has begun one before that. With several hubs, not in a round of an outer step it has
// said DONE for (it has that step's means, or gave it up).
static bool due(relay *h, int id) {
    const replica *r = rep(h, id);
    if (h->contrib[id].began) return true;
    if (h->round_step < r->member_from) return false;
    return !(several_hubs(h) && step_of(h->round_step) <= r->done_step);
}

// With several hubs: a member that began a round of this outer step here is between two of the
// step's rounds (its exchange goes on at this hub or another), not late: it begins this one,
// says DONE, rejoins or dies (docs/protocol.md, "Several hubs"), so it is never evicted as late.
static bool between_rounds(relay *h, int id) {
    return several_hubs(h) && rep(h, id)->began_step == step_of(h->round_step);
}

// Whether replica id's segments go into the mean: a member still in the round (it may not
// have begun yet: then the reduction waits for it), or a whole contribution (even if its
// sender has gone since).
static bool expected(relay *h, int id) {
    const contribution *k = &h->contrib[id];
    return (rep(h, id)->state == R_MEMBER && !k->left && due(h, id)) || k->whole;
}

// Whether replica id is sent the mean: it began the round and is still in it.
static bool receiver(relay *h, int id) {
    const contribution *k = &h->contrib[id];
    return rep(h, id)->state == R_MEMBER && k->began && !k->left;
}

static quant_codec codec(uint8_t wire_codec) { return (quant_codec)wire_codec; }
// The contributions' codec: the kind, sparse when up_keep > 0 (wire_decode_contribute checked it).
static quant_codec up_codec(const wire_contribute *m) { return quant_codec_of(codec(m->up_codec), m->up_keep); }

// Reduces and sends every segment that every expected contributor has delivered, in order.
static void try_reduce(relay *h) {
    if (!h->round_open || !h->round_sized) return;
    const wire_contribute *sp = &h->spec;
    while (h->reduced < h->n_segments) {
        int64_t c = h->reduced;
        const uint8_t *ins[WIRE_MAX_REPLICAS];
        int ids[WIRE_MAX_REPLICAS], count = 0;
        double weights[WIRE_MAX_REPLICAS];
        for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
            if (!expected(h, i)) continue;
            const contribution *k = &h->contrib[i];
            if (!k->announced || !k->seg || !k->seg[c]) return;   // not here yet
            ids[count] = i;
            weights[count] = (double)k->tokens;
            ins[count++] = k->seg[c]->data;
        }
        if (count == 0) return;
        for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
            if (receiver(h, i) && backlog_bytes(rep(h, i)) > (uint64_t)DOWN_BACKLOG_SEGMENTS * h->down_chunk) return;
        int64_t first = c * (int64_t)sp->segment_values;
        int64_t len = (int64_t)sp->values - first < (int64_t)sp->segment_values ? (int64_t)sp->values - first
                                                                                 : (int64_t)sp->segment_values;
        size_t out_bytes = quant_encoded_bytes(codec(sp->down_codec), len, sp->block);
        blob *b = blob_new(out_bytes);
        if (!b) fail("relay: out of memory for a segment of the mean (%zu bytes)", out_bytes);
        float *residual = h->round_residual ? h->round_residual + first : NULL;
        quant_effect effect[WIRE_MAX_REPLICAS];
        quant_reduction q = {.up = up_codec(sp), .down = codec(sp->down_codec), .block = sp->block,
                             .bound = sp->bound, .weights = weights};
        if (quant_reduce_segment(&q, ins, count, len, residual, h->scratch, b->data, effect))
            for (int j = 0; j < count; j++) {
                contribution *k = &h->contrib[ids[j]];
                if (effect[j].left_out && !k->nonfinite_told) {
                    k->nonfinite_told = true;
                    hub_log(h, "round %lld: replica %d's contribution holds NaN/Inf (segment %lld): left out of the "
                               "mean of every such segment",
                            (long long)h->round_step, ids[j], (long long)c);
                }
                if (effect[j].factor != 1.0f) {
                    if (!k->bounded || effect[j].factor < k->least_factor) k->least_factor = effect[j].factor;
                    k->bounded++;
                }
                if (effect[j].weight_capped && !k->capped_told) {
                    k->capped_told = true;
                    hub_log(h, "round %lld: replica %d claims %llu tokens, more than %g x the round's median: its "
                               "weight is capped there",
                            (long long)h->round_step, ids[j], (unsigned long long)k->tokens, (double)sp->bound);
                }
            }
        wire_data d = {.owner_id = 0, .kind = DATA_MEAN, .outer_step = h->round_step, .total_bytes = h->down_total,
                       .offset = (uint64_t)c * h->down_chunk, .chunk_bytes = h->down_chunk,
                       .chunk_len = (uint32_t)out_bytes};
        for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
            if (receiver(h, i)) {
                queue_data(rep(h, i), &d, b->data, b);
                h->round_out_bytes += out_bytes;
            }
        blob_release(b);
        // (A contribution evicted by resize_round has another, smaller count of segments.)
        for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
            if (h->contrib[i].seg && c < h->contrib[i].n_segments && h->contrib[i].seg[c]) {
                blob_release(h->contrib[i].seg[c]);
                h->contrib[i].seg[c] = NULL;
            }
        h->reduced++;
    }
}

// Whether every segment the round's receivers need has been sent.
static bool reduction_done(relay *h) {
    if (!h->round_sized || h->reduced == h->n_segments) return true;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (receiver(h, i)) return false;
    return true;
}

// Whether a data connection's last segment of the open round is beyond the window: the next
// one it brings is too (a replica sends its segments in order on each connection).
static bool stream_ahead(relay *h, const hub_conn *hc) {
    return hc->seg_round == h->round_serial && hc->last_seg >= h->reduced + WINDOW_SEGMENTS;
}

// A contributor this far ahead of the reduction is not read until the others catch up: all its
// connections once its segments up to the window are in, and each connection that brought a
// segment beyond the window. So the hub holds at most WINDOW_SEGMENTS + streams segments of a
// contribution, whatever order they come in (a segment withheld does not open the window).
static bool contributor_paused(relay *h, const hub_conn *hc) {
    if (hc->role != ROLE_DATA || !h->round_open) return false;
    const contribution *k = &h->contrib[hc->replica];
    if (!k->began || k->left) return false;
    return k->prefix >= h->reduced + WINDOW_SEGMENTS || stream_ahead(h, hc);
}

static bool donor_paused(relay *h, const hub_conn *hc);

// Paused with the segment the reduction waits for in: held back by the hub (for the others, or
// the receivers' backlog), not stalled. A contributor paused while its own segment is missing is
// waiting for itself: its upload may stall out.
static bool held_back(relay *h, const hub_conn *hc) {
    if (donor_paused(h, hc)) return true;
    return contributor_paused(h, hc) && h->contrib[hc->replica].prefix > h->reduced;
}

// A member from now on, expected in every round (FOLLOW narrows it after): not in the rounds a
// joiner of an earlier close was told it would be in (a group refounded by waiting replicas
// starts at their step).
static void make_member(relay *h, int id) {
    rep(h, id)->state = R_MEMBER;
    rep(h, id)->member_from = 0;
}

static void send_joined(relay *h, replica *r, uint32_t result) {
    uint8_t buf[WIRE_JOINED_BYTES];
    wire_joined j = {.result = result, .group_step = h->status_known ? h->status.outer_step : -1,
                     .group_hash = h->status_known ? h->status.param_hash : 0};
    send_control(h, r, WIRE_JOINED, buf, wire_encode_joined(&j, buf));
}

// JOINED(finished): the run is over, nothing to join; the replica stays connected until it leaves.
static void send_finished(relay *h, int id) {
    replica *r = rep(h, id);
    r->state = R_CONNECTED;
    r->held = false;
    uint8_t buf[WIRE_JOINED_BYTES];
    wire_joined j = {.result = JOINED_FINISHED, .group_step = h->finished_step, .group_hash = (uint64_t)h->finished_by};
    send_control(h, r, WIRE_JOINED, buf, wire_encode_joined(&j, buf));
    hub_log(h, "replica %d at outer step %lld: the run is over (replica %d finished it at outer step %lld and no "
               "replica is training), told so",
            id, (long long)r->status.outer_step, h->finished_by, (long long)h->finished_step);
}

static void abort_transfer(relay *h, const char *why, bool backoff);
static void check_round(relay *h);
static void settle_group(relay *h);
static void tell_evicted(relay *h, int id, int64_t step, const char *text);

static void release_contribution(replica *r) { transfer_reset(&r->up); }

// Replica id leaves the open round. A contribution already whole still counts; one cut off
// halfway is in the segments reduced so far and in no later one (ROUND will not name it).
// Either way the replica may not contribute to this round again: the mean already holds
// part of its first upload.
static void leave_round(relay *h, int id) {
    replica *r = rep(h, id);
    contribution *k = &h->contrib[id];
    if (h->round_open && k->began) {
        if (!k->whole) contribution_drop_segments(k);
        k->left = true;
    }
    release_contribution(r);
}

static void stop_transfer_without_joiners(relay *h);

// A joiner that will not get this transfer goes back to waiting.
static void unjoin(relay *h, int id) {
    replica *r = rep(h, id);
    uint8_t buf[8];
    r->joiner = r->catching_up = false;
    r->caught_up_to = -1;
    r->member_from = 0;
    forget_lacks(r);
    r->state = R_WAITING;
    leave_round(h, id);
    drop_queue(r);
    send_control(h, r, WIRE_STATE_ABORT, buf, wire_encode_step(h->st.started ? h->st.step : 0, buf));
}

// A member evicted from the group (R_CONNECTED: it must JOIN again, and takes a state then)
// receives no more of the transfer in flight; the transfer ends once nobody does. (A catch-up
// joiner evicted as late after its CAUGHT_UP kept receiving: the transfer never ended, the
// donor's later means piled up in h->held, and no replica that waited was given a donor.)
static void stop_receiving(relay *h, int id) {
    replica *r = rep(h, id);
    if (!receives_state(r)) return;
    r->joiner = r->catching_up = false;
    r->caught_up_to = -1;
    forget_lacks(r);
    stop_transfer_without_joiners(h);
}

// Ends a replica's session: it left (code 0), broke the protocol (REFUSE_PROTOCOL: drop_replica)
// or was given up for another reason (REFUSE_DROPPED: lose_replica; silent, too slow, the hub out
// of memory, a broken connection). A live control connection is told why in a REFUSE of that
// code (tagged with the session's key: proven, unlike a handshake's) and closed after it; the
// data streams linger as long, without their unsent frames, so that the replica reads the reason
// before it sees a stream close. Told nothing, a replica rejoined without a word of why, and one
// that broke the protocol the same way at every step did so for the rest of the run.
static void end_session(relay *h, int id, uint32_t code, const char *why) {
    replica *r = rep(h, id);
    if (r->state == R_FREE) return;
    hub_log(h, "replica %d (%s) %s%s", id, r->peer, code ? "dropped: " : "", why);
    bool tell = code && r->control && !r->control->dead;
    if (tell) {
        uint8_t buf[8 + WIRE_MAX_TEXT_BYTES];
        conn_send(&r->control->c, WIRE_REFUSE, buf, wire_encode_refuse(code, why, buf), NULL, 0, NULL);
        close_after_flush(r->control);
    } else if (r->control) {
        r->control->dead = true;
    }
    for (int s = 1; s <= r->streams; s++) {
        hub_conn *d = r->data[s];
        if (!d) continue;
        if (tell) {
            conn_drop_unsent(&d->c);
            close_after_flush(d);
            d->linger = true;
        } else {
            d->dead = true;
        }
    }
    drop_queue(r);
    leave_round(h, id);
    bool was_donor = h->donor == id;
    forget_lacks(r);
    memset(r, 0, sizeof *r);
    r->state = R_FREE;
    if (was_donor) abort_transfer(h, "the donor left", false);
    else stop_transfer_without_joiners(h);
    check_round(h);
    settle_group(h);
}

static void drop_replica(relay *h, int id, const char *why) { end_session(h, id, REFUSE_PROTOCOL, why); }
static void lose_replica(relay *h, int id, const char *why) { end_session(h, id, REFUSE_DROPPED, why); }

// ---------------------------------------------------------------- the state transfer
// Ends the transfer in flight before its state is whole: its joiners wait again (STATE_ABORT;
// with backoff, a transfer cut by --max_hold_s: such a joiner is given a donor again only after
// 2, 4, .. 64 more closes). A donor still here is told to stop sending (STATE_ABORT too; its
// frames on the way are let go: state_cut) and trains on, with the time it spent on top of
// timeout_s in the round it is due in, as after a whole transfer.
static void abort_transfer(relay *h, const char *why, bool backoff) {
    if (h->donor < 0) return;
    int donor = h->donor, joiners = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        replica *r = rep(h, i);
        if (!receives_state(r)) continue;
        // A catch-up joiner that was told its round and has every mean up to it queued has all
        // it needs: it stays a member (it trains, and is due from the next round).
        if (r->catching_up && r->caught_up_to >= 0 && h->patched_through >= r->caught_up_to) {
            r->catching_up = false;
            continue;
        }
        unjoin(h, i);
        joiners++;
        if (backoff) {
            r->cuts++;
            r->retry_at_close = h->closes + ((int64_t)1 << (r->cuts < 6 ? r->cuts : 6));
        }
    }
    replica *d = rep(h, donor);
    if (d->state != R_FREE) {
        d->state_cut = true;
        d->transfer_delay_s = wall_seconds() - h->transfer_began_s;
        uint8_t buf[8];
        send_control(h, d, WIRE_STATE_ABORT, buf, wire_encode_step(h->st.started ? h->st.step : 0, buf));
    }
    hub_log(h, "state transfer from replica %d aborted (%s): %d joiner(s) wait for the next round", donor, why,
            joiners);
    clear_transfer(h);
}

// A transfer left without joiners (dropped, or joining again) is stopped: nobody would get it.
static void stop_transfer_without_joiners(relay *h) {
    if (h->donor < 0) return;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (receives_state(&h->reps[i])) return;
    abort_transfer(h, "no joiner left", false);
}

// --max_hold_s: the transfer has held the round too long.
static void cut_transfer(relay *h) {
    char b[32], t[32];
    hub_log(h, "state transfer from replica %d cut after %.1f s (--max_hold_s %g; %s of %s relayed): the group goes "
               "on without its joiners",
            h->donor, wall_seconds() - h->transfer_began_s, h->o.max_hold_s,
            format_bytes((uint64_t)h->st.chunks_have * h->st.chunk, b, sizeof b),
            format_bytes(h->st.total, t, sizeof t));
    abort_transfer(h, "held the round longer than --max_hold_s", true);
}

// The state is whole at the hub. The donor begins its inner phase now, each joiner once the
// state has left its queue: each round's deadline for them moves by the transfer's time until
// they begin a contribution (check_round).
static void finish_transfer_if_whole(relay *h) {
    if (h->donor < 0 || h->catchup || !transfer_whole(&h->st)) return;
    char b[32];
    int n = 0;
    char ids[1024] = "";
    double took = wall_seconds() - h->transfer_began_s;
    rep(h, h->donor)->transfer_delay_s = took;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (h->reps[i].joiner) {
            h->reps[i].joiner = false;
            h->reps[i].state_draining = true;
            size_t len = strlen(ids);
            snprintf(ids + len, sizeof ids - len, "%s%d", n++ ? " " : "", i);
        }
    hub_log(h, "state after round %lld relayed from replica %d to [%s]: %s in %.1f s", (long long)h->st.step,
            h->donor, ids, format_bytes(h->st.total, b, sizeof b), took);
    clear_transfer(h);
}

// A joiner's state has left its queue: it begins its inner phase (housekeeping).
static void state_drained(relay *h, int id) {
    replica *r = rep(h, id);
    r->state_draining = false;
    r->transfer_delay_s = wall_seconds() - r->state_began_s;
}

// The donor's STATE, to a joiner.
static void announce_state(relay *h, replica *r) {
    uint8_t buf[WIRE_STATE_BYTES];
    send_control(h, r, WIRE_STATE, buf, wire_encode_state(&h->announced, buf));
}

static bool lacks_chunk(const replica *r, uint64_t i) { return r->lacks && (r->lacks[i / 8] >> (i % 8) & 1); }

// A catch-up state's first pass is whole at the hub: the donor is told which of its first
// chunks to send again (STATE_AGAIN k: chunks 1 .. k − 1, which the replicas that joined the
// transfer in flight lack; 0: none), so that it can let go of what it kept of them.
static void say_again_if_whole(relay *h) {
    if (h->donor < 0 || !h->catchup || h->again_said || !transfer_whole(&h->st)) return;
    uint64_t k = 0;
    int late = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        const replica *r = rep(h, i);
        if (!receives_state(r) || !r->lacks) continue;
        late++;
        for (uint64_t c = h->st.chunks; c > k; c--)
            if (lacks_chunk(r, c - 1)) {
                k = c;
                break;
            }
    }
    h->again_said = true;
    h->again_chunks = k;
    uint8_t buf[8];
    send_control(h, rep(h, h->donor), WIRE_STATE_AGAIN, buf, wire_encode_step((int64_t)k, buf));
    if (k == 0) return;
    if (transfer_expect(&h->again, h->st.step, h->st.total, h->st.chunk)) {
        abort_transfer(h, "the hub is out of memory", false);
        return;
    }
    h->again.announced = true;
    char b[32];
    hub_log(h, "the state's first pass from replica %d is whole: it sends its first %llu chunk(s) again (%s) for the "
               "%d replica(s) that joined it in flight",
            h->donor, (unsigned long long)(k - 1), format_bytes((k - 1) * (uint64_t)h->st.chunk, b, sizeof b), late);
}

// The chunks asked for again have not all come.
static bool again_pending(const relay *h) {
    return h->again_chunks > 1 && h->again.chunks_have < h->again_chunks - 1;
}

static void on_state_announce(relay *h, int id, const wire_state *m) {
    if (h->donor != id) {
        if (rep(h, id)->state_cut) return;   // told to stop before it announced
        drop_replica(h, id, "sent a STATE it was not asked for");
        return;
    }
    const char *why = transfer_expect(&h->st, m->outer_step, m->total_bytes, m->chunk_bytes);
    if (why || h->st.announced) {
        drop_replica(h, id, why ? why : "announced its state twice");
        return;
    }
    h->st.announced = true;
    // With several hubs a donor announces up to 3 × timeout_s after it was designated: its
    // chunks have timeout_s from the announcement on.
    h->donor_progress_s = wall_seconds();
    h->announced = *m;
    h->announced.donor_id = (uint32_t)id;
    h->announced.flags = h->catchup ? STATE_CATCHUP : 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (receives_state(&h->reps[i])) announce_state(h, rep(h, i));
    finish_transfer_if_whole(h);   // a state of 0 bytes has no chunks
    say_again_if_whole(h);
}

// A chunk from the donor for transfer t: checked against it and counted, copied into a blob to
// relay (the caller releases it). NULL when the donor was dropped (a wrong chunk) or the
// transfer aborted (no memory).
static blob *take_donor_chunk(relay *h, int id, transfer *t, const wire_data *d) {
    const char *why = transfer_expect(t, d->outer_step, d->total_bytes, d->chunk_bytes);
    if (!why) why = transfer_take(t, d);
    if (why) {
        drop_replica(h, id, why);
        return NULL;
    }
    blob *b = blob_new((size_t)d->chunk_len);
    if (!b) {
        abort_transfer(h, "the hub is out of memory", false);
        return NULL;
    }
    memcpy(b->data, d->bytes, (size_t)d->chunk_len);
    h->donor_progress_s = wall_seconds();
    return b;
}

static void on_state_chunk(relay *h, int id, const wire_data *d) {
    if (h->donor != id) {
        if (rep(h, id)->state_cut) return;   // told to stop: what was on the way
        drop_replica(h, id, "sent state chunks it was not asked for");
        return;
    }
    wire_data fwd = *d;
    fwd.owner_id = (uint32_t)id;
    if (h->again_said && transfer_whole(&h->st)) {   // asked for again: to those that joined in flight and lack it
        uint64_t i = h->st.chunk ? d->offset / h->st.chunk : 0;
        if (i == 0 || i >= h->again_chunks || d->offset % h->st.chunk) {
            drop_replica(h, id, "sent a chunk of its state again that it was not asked for");
            return;
        }
        blob *b = take_donor_chunk(h, id, &h->again, d);
        if (!b) return;
        for (int r = 0; r < WIRE_MAX_REPLICAS; r++)
            if (receives_state(&h->reps[r]) && lacks_chunk(&h->reps[r], i)) queue_data(rep(h, r), &fwd, b->data, b);
        blob_release(b);
        return;
    }
    blob *b = take_donor_chunk(h, id, &h->st, d);
    if (!b) return;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (receives_state(&h->reps[i])) queue_data(rep(h, i), &fwd, b->data, b);
    blob_release(b);
    finish_transfer_if_whole(h);
    say_again_if_whole(h);
}

// ---------------------------------------------------------------- the catch-up transfer
// (docs/protocol.md "Catch-up"). The joiners are due in no round until they say CAUGHT_UP, and
// the donor trains and contributes as any member: the group does not wait for the transfer.

// The transfer is over once no joiner of it still catches up (each began a contribution, or
// left): the donor stops sending means.
static void end_catchup_if_done(relay *h) {
    if (h->donor < 0 || !h->catchup) return;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (receives_state(&h->reps[i])) return;
    replica *d = rep(h, h->donor);
    uint8_t buf[8];
    send_control(h, d, WIRE_STATE_END, buf, wire_encode_step(h->patched_through, buf));
    d->state_cut = true;   // its chunks still on the way (a second pass, means) are let go
    char b[32];
    hub_log(h, "catch-up transfer from replica %d over after %.1f s: its state after round %lld (%s) and the means "
               "of rounds up to %lld relayed; its joiners train",
            h->donor, wall_seconds() - h->transfer_began_s, (long long)h->st.step,
            format_bytes(h->st.total, b, sizeof b), (long long)h->patched_through);
    clear_transfer(h);
}

// A chunk of the mean and settings of a round the donor landed (DATA_CATCHUP), in order: round
// patched_through + 1, then the next. Relayed to the replicas catching up as it arrives.
static void on_catchup_chunk(relay *h, int id, const wire_data *d) {
    if (h->donor != id || !h->catchup) {
        if (rep(h, id)->state_cut || rep(h, id)->state == R_MEMBER) return;   // after its transfer ended
        drop_replica(h, id, "sent a catch-up mean it was not asked for");
        return;
    }
    // A mean of a round the group has not closed cannot be the donor's landing: taken, it would
    // be kept (h->held) for joiners that never ask for it, without bound. (With several hubs one
    // step more: the donor may give up a step whose round here never closed, and land it skipped.)
    int64_t closed = closed_landing(h);
    if (d->outer_step > closed + (several_hubs(h) ? 1 : 0)) {
        char why[160];
        snprintf(why, sizeof why, "sent the mean of round %lld for its catch-up transfer, but the last round closed is %lld",
                 (long long)d->outer_step, (long long)closed);
        drop_replica(h, id, why);
        return;
    }
    if (!h->patch.started && d->outer_step != h->patched_through + 1) {
        char why[160];
        snprintf(why, sizeof why, "sent the mean of round %lld for its catch-up transfer, expected round %lld",
                 (long long)d->outer_step, (long long)h->patched_through + 1);
        drop_replica(h, id, why);
        return;
    }
    blob *b = take_donor_chunk(h, id, &h->patch, d);
    if (!b) return;
    h->means_begun = true;
    h->patch.announced = true;   // a catch-up mean has no announcement: its chunks say its size
    wire_data fwd = *d;
    fwd.owner_id = (uint32_t)id;
    fwd.bytes = b->data;
    bool beyond = false;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        replica *r = rep(h, i);
        if (!r->catching_up) continue;
        if (r->caught_up_to < 0 || d->outer_step <= r->caught_up_to) queue_data(r, &fwd, b->data, b);
        else beyond = true;
    }
    if (beyond) {   // kept in the order they came (a few rounds' chunks at most)
        held_chunk **end = &h->held;
        while (*end) end = &(*end)->next;
        *end = xcalloc(1, sizeof **end);
        (*end)->d = fwd;
        (*end)->ref = blob_ref(b);
    }
    blob_release(b);
    if (transfer_whole(&h->patch)) {
        h->patched_through = h->patch.step;
        transfer_reset(&h->patch);
    }
}

// CAUGHT_UP from a joiner: it holds the state and will have the means up to `round`. It is due
// from the next round the hub has not closed: round' = max(round, the last closed), answered
// with STATE_END(round'); it waits for the means up to round' (the donor lands every closed
// round) and then trains. Said again before it contributes (a sharded replica's ranks agree on
// one round), it moves on.
static void on_caught_up(relay *h, int id, int64_t round) {
    replica *r = rep(h, id);
    if (!r->catching_up || h->donor < 0 || !h->catchup) return;   // its transfer ended meanwhile (STATE_ABORT)
    if (round < landing_of(h, h->st.step)) {
        drop_replica(h, id, "said CAUGHT_UP for a round before its state");
        return;
    }
    // In landings (rounds; outer steps with several hubs).
    int64_t closed = closed_landing(h);
    // Another hub (several hubs, or a sharded replica's other ranks) may be a few rounds ahead of
    // this one, never 2^20: such a round is no joiner's (and round + 1 below overflowed).
    if (round > closed + ((int64_t)1 << 20)) {
        char why[160];
        snprintf(why, sizeof why, "said CAUGHT_UP for round %lld, far past the last round closed (%lld)",
                 (long long)round, (long long)closed);
        drop_replica(h, id, why);
        return;
    }
    int64_t to = round > closed ? round : closed;
    if (h->round_open && landing_of(h, h->round_step) == to + 1 && h->reduced > 0) to++;   // reduced without it
    // Kept chunks of means it is now to wait for (it said CAUGHT_UP before, for an earlier round).
    if (r->caught_up_to >= 0)
        for (held_chunk *c = h->held; c; c = c->next)
            if (c->d.outer_step > r->caught_up_to && c->d.outer_step <= to) queue_data(r, &c->d, c->d.bytes, c->ref);
    r->joiner = false;
    r->caught_up_to = to;
    r->transfer_delay_s = 0;   // its deadline counts from when it has these means (check_round)
    r->member_from = first_round_of(h, to + 1);
    forget_lacks(r);   // its state is whole
    uint8_t buf[8];
    send_control(h, r, WIRE_STATE_END, buf, wire_encode_step(to, buf));
    hub_log(h, "replica %d caught up: it has the state after round %lld and takes the means up to %s %lld; due from "
               "round %lld",
            id, (long long)h->st.step, several_hubs(h) ? "outer step" : "round", (long long)to,
            (long long)r->member_from);
}

// ---------------------------------------------------------------- rounds
// The hub's resident memory, from /proc/self/statm (0 where there is none).
static uint64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long pages = 0, resident = 0;
    int got = fscanf(f, "%llu %llu", &pages, &resident);
    fclose(f);
    return got == 2 ? resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

static bool multi_hub(const relay *h) { return h->round_sized && (h->spec.flags & WIRE_MULTI_HUB); }

// "12", or "777 (step 12, attempt 1, share 1)" for a round of a run with several hubs.
static const char *name_round(const relay *h, int64_t round, char *buf, size_t bytes) {
    long long w = (long long)round;
    if (several_hubs(h) || multi_hub(h))
        snprintf(buf, bytes, "%lld (step %lld, attempt %lld, share %lld)", w, w / HUB_ROUNDS_PER_STEP,
                 w % HUB_ROUNDS_PER_STEP / 8, w % 8);
    else snprintf(buf, bytes, "%lld", w);
    return buf;
}

static const char *round_name(const relay *h, char *buf, size_t bytes) {
    return name_round(h, h->round_step, buf, bytes);
}

// The open round is over (closed, or aborted): the next frame of a later round opens another.
static void end_round(relay *h) {
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        contribution_reset(&h->contrib[i]);
        release_contribution(rep(h, i));
    }
    h->round_open = false;
    h->round_sized = false;
    h->round_residual = NULL;
    h->last_closed_step = h->round_step;
    h->first_began_s = -1;
    h->round_in_bytes = h->round_out_bytes = 0;
    // The members move to the next step (apply or not): the group's status is unknown until
    // a group is founded anew.
    h->status_known = false;
}

// The fault hook relay_die_in_close:N (TRAIN_GPT_FAULT; test/test_transport.c `hubmixed`,
// test/test_diloco_hubs.sh): at the close of the first round with two or more contributors
// after N such rounds, ROUND goes to the lowest-id contributor only (every contributor may
// have the mean's bytes: without ROUND they are not done), and the hub dies (SIGKILL) once that
// replica says DONE for the step (it has every share's mean), or timeout_s later: a hub that
// dies after some replicas received its mean for a round and others did not.
static bool dies_in_this_close(relay *h, uint32_t contributors) {
    if (contributors < 2) return false;
    return fault_requested("relay_die_in_close", h->shared_closes++);
}

static void die_now(relay *h, const char *why) {
    hub_log(h, "fault hook relay_die_in_close: the hub dies now (%s)", why);
    raise(SIGKILL);
}

// Whether waiting replica id may be given a donor at this close (backoff after cut transfers).
static bool may_get_state(const relay *h, int id) {
    const replica *r = &h->reps[id];
    return r->state == R_WAITING && h->closes >= r->retry_at_close;
}

// Replicas waiting for the group's state while a catch-up transfer's first pass is on its way
// join it at once (docs/protocol.md "Catch-up transfers" step 8): they get the rest of the pass
// and the means as its other joiners do, and the chunks the hub had relayed before they came
// once the pass is whole (say_again_if_whole), instead of waiting for the transfer to end and
// the next close to begin another. Not once the state's first chunk (its donor sends it last)
// or a mean has come: they then wait for the next transfer.
static void join_in_flight(relay *h) {
    if (h->donor < 0 || !h->catchup || h->again_said || h->means_begun || !h->o.join_in_flight) return;
    if (rep(h, h->donor)->state != R_MEMBER) return;
    if (h->st.started && (h->st.have[0] & 1)) return;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        if (i == h->donor || !may_get_state(h, i)) continue;
        replica *r = rep(h, i);
        r->joiner = r->catching_up = true;
        r->caught_up_to = -1;
        r->member_from = INT64_MAX;   // due in no round until CAUGHT_UP
        r->state = R_MEMBER;
        r->state_began_s = wall_seconds();
        uint64_t had = h->st.started ? h->st.chunks_have : 0;
        if (had > 0) {
            size_t bytes = (size_t)(h->st.chunks / 8 + 1);
            r->lacks = xmalloc(bytes);
            memcpy(r->lacks, h->st.have, bytes);
        }
        if (h->st.announced) announce_state(h, r);
        char b[32], t[32];
        hub_log(h, "replica %d joins the catch-up transfer from replica %d in flight (%s of %s relayed so far: those "
                   "come again after the rest)",
                i, h->donor, format_bytes(had * (uint64_t)h->st.chunk, b, sizeof b),
                h->st.started ? format_bytes(h->st.total, t, sizeof t) : "a state not announced yet");
    }
}

static void close_round(relay *h) {
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (h->contrib[i].bounded)
            hub_log(h, "round %lld: replica %d's outer gradient bounded in %lld of %lld segment(s) (norm above %g x "
                       "the median; scaled by down to %.3g)",
                    (long long)h->round_step, i, (long long)h->contrib[i].bounded, (long long)h->n_segments,
                    (double)h->spec.bound, (double)h->contrib[i].least_factor);
    // ROUND names the contributions that arrived whole with work behind them; those of no work
    // (tokens 0: a replica that joined at the run's end), which the mean left out, are named
    // neither there nor in the count that --min_replicas asks of, and get ROUND all the same.
    wire_round m = {.outer_step = h->round_step};
    int listeners[WIRE_MAX_REPLICAS], n_listeners = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (h->contrib[i].whole && h->contrib[i].tokens == 0) {
            listeners[n_listeners++] = i;
        } else if (h->contrib[i].whole) {
            m.ids[m.n] = (uint32_t)i;
            m.bytes[m.n] = h->contrib[i].total;
            m.n++;
        }
    bool apply = (int)m.n >= h->o.min_replicas;
    // A donor for the waiting replicas: the lowest-id contributor still here.
    h->closes++;
    int donor = -1, waiting = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) waiting += may_get_state(h, i);
    if (waiting && h->donor < 0)
        for (uint32_t k = 0; k < m.n && donor < 0; k++)
            if (rep(h, (int)m.ids[k])->state == R_MEMBER) donor = (int)m.ids[k];
    bool dying = dies_in_this_close(h, m.n);
    // A catch-up transfer (relay_options.catch_up): with several hubs this is the joiners'
    // primary, the means are the donor's outer steps, and the joiners follow the other hubs once
    // caught up; a hub of `--shards N` does it for its rank's pieces.
    bool catchup = donor >= 0 && h->o.catch_up;
    uint8_t buf[WIRE_ROUND_HEAD_BYTES + WIRE_ROUND_ENTRY_BYTES * WIRE_MAX_REPLICAS];
    for (uint32_t k = 0; k < m.n; k++) {
        replica *r = rep(h, (int)m.ids[k]);
        if (r->state != R_MEMBER || (dying && h->dying_for >= 0)) continue;
        m.flags = (apply ? ROUND_APPLY : 0) |
                  ((int)m.ids[k] == donor ? ROUND_SEND_STATE | (catchup ? ROUND_CATCHUP : 0) : 0);
        send_control(h, r, WIRE_ROUND, buf, wire_encode_round(&m, buf));
        if (dying) {
            h->dying_for = (int)m.ids[k];
            h->dying_deadline_s = wall_seconds() + h->o.timeout_s;
        }
    }
    char no_work[1200] = "";
    for (int k = 0; k < n_listeners; k++) {
        size_t len = strlen(no_work);
        snprintf(no_work + len, sizeof no_work - len, "%s%d", k ? " " : ", no work from [", listeners[k]);
        replica *r = rep(h, listeners[k]);
        if (r->state != R_MEMBER || (dying && h->dying_for >= 0)) continue;
        m.flags = apply ? ROUND_APPLY : 0;
        send_control(h, r, WIRE_ROUND, buf, wire_encode_round(&m, buf));
    }
    if (n_listeners) strncat(no_work, "]", sizeof no_work - strlen(no_work) - 1);
    char ids[1200] = "", tokens[2400] = "", b1[32], b2[32], b3[32];
    bool unequal = false;
    for (uint32_t k = 0; k < m.n; k++) {
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, "%s%u", k ? " " : "", m.ids[k]);
        uint64_t t = h->contrib[m.ids[k]].tokens;
        unequal |= t != h->contrib[m.ids[0]].tokens;
        len = strlen(tokens);
        snprintf(tokens + len, sizeof tokens - len, "%s%llu", k ? " " : "", (unsigned long long)t);
    }
    char weighted[2450] = "";
    if (unequal) snprintf(weighted, sizeof weighted, ", weighted by tokens [%s]", tokens);
    char joiners[1200] = "";
    if (donor >= 0) {
        int nj = 0;
        // With several hubs the donor sends its state once it has the whole outer step (every
        // share's round): the joiners are members from the next step's first round.
        int64_t from = multi_hub(h) ? (h->round_step / HUB_ROUNDS_PER_STEP + 1) * HUB_ROUNDS_PER_STEP : 0;
        for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
            if (may_get_state(h, i)) {
                replica *r = rep(h, i);
                r->joiner = true;
                r->state_began_s = wall_seconds();
                r->member_from = from;
                r->state = R_MEMBER;   // for the next round; its state comes first on its streams
                if (catchup) {         // due in no round until CAUGHT_UP
                    r->catching_up = true;
                    r->caught_up_to = -1;
                    r->member_from = INT64_MAX;
                }
                size_t len = strlen(joiners);
                snprintf(joiners + len, sizeof joiners - len, "%s%d", nj++ ? " " : "", i);
            }
        h->donor = donor;
        h->catchup = catchup;
        h->patched_through = landing_of(h, h->round_step);
        transfer_reset(&h->patch);
        rep(h, donor)->state_cut = false;
        h->transfer_began_s = h->donor_progress_s = wall_seconds();
        h->donor_grace_s = multi_hub(h) ? 3 * h->o.timeout_s : h->o.timeout_s;
        transfer_reset(&h->st);
        if (catchup && !h->o.join_in_flight) {   // no chunk will go again: the donor keeps only what is unsent
            uint8_t b[8];
            h->again_said = true;
            send_control(h, rep(h, donor), WIRE_STATE_AGAIN, b, wire_encode_step(0, b));
        }
    }
    char name[96];
    hub_log(h, "round %s closed: %u contributor(s) [%s]%s%s, %s in, %s out, rss %s, %s",
            round_name(h, name, sizeof name), m.n, ids, weighted, no_work,
            format_bytes(h->round_in_bytes, b1, sizeof b1), format_bytes(h->round_out_bytes, b2, sizeof b2), format_bytes(rss_bytes(), b3, sizeof b3),
            apply ? "apply" : "skip (fewer than min_replicas)");
    if (donor >= 0 && catchup)
        hub_log(h, "replica %d is the donor: it sends its state to [%s] and then the means of the rounds it lands "
                   "until they catch up (the rounds do not wait for them)",
                donor, joiners);
    else if (donor >= 0)
        hub_log(h, "replica %d is the donor: it sends its state to [%s], members from the next round", donor, joiners);
    if (dying)
        hub_log(h, "fault hook relay_die_in_close: ROUND of round %s went to replica %d only; the hub dies at its DONE",
                name, h->dying_for);
    end_round(h);
    join_in_flight(h);   // a transfer in flight (none designated here): those whose backoff ended
}

// Evicted from the open round without closing it (abort_round): told why; it must JOIN again.
static void evict_quietly(relay *h, int id, const char *text) {
    replica *r = rep(h, id);
    tell_evicted(h, id, h->round_step, text);
    r->state = R_CONNECTED;
    leave_round(h, id);
    drop_queue(r);
    if (h->donor == id) abort_transfer(h, "the donor was evicted", false);
    else stop_receiving(h, id);
}

// With several hubs: member `winner` completed outer step k (DONE) without beginning the open
// round of step k. Its replicas and the round's contributors took (or would take) a share of
// step k from different rounds, so they cannot both go on: the round's contributors are
// evicted (they rejoin and take the state of a replica that completed the step: docs/protocol.md,
// "Several hubs") and the round ends without a result.
static void abort_round(relay *h, int winner) {
    char name[96], text[300], ids[1200] = "";
    round_name(h, name, sizeof name);
    snprintf(text, sizeof text,
             "round %lld cannot stand: replica %d completed that outer step without it (a hub died after some "
             "replicas had its mean, or the replicas disagree on which hubs are live): rejoin",
             (long long)h->round_step, winner);
    int n = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        if (!h->contrib[i].began || h->contrib[i].left || rep(h, i)->state != R_MEMBER) continue;
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, "%s%d", n++ ? " " : "", i);
        evict_quietly(h, i, text);
    }
    hub_log(h, "round %s aborted: replica %d completed step %lld without it; its contributor(s) [%s] evicted (they "
               "rejoin)",
            name, winner, (long long)step_of(h->round_step), ids);
    end_round(h);
}

static void evict_late(relay *h, int id) {
    replica *r = rep(h, id);
    double late = wall_seconds() - h->first_began_s;
    // The replica is told the round's id (its own log names the share, step and attempt); the
    // hub's log names them the hub's way.
    char text[200], name[96];
    snprintf(text, sizeof text, "late for round %lld: no contribution %.1f s after the first began",
             (long long)h->round_step, late);
    hub_log(h, "replica %d (%s) evicted: late for round %s: no contribution %.1f s after the first began", id, r->peer,
            round_name(h, name, sizeof name), late);
    uint8_t buf[WIRE_EVICTED_HEAD_BYTES + WIRE_MAX_TEXT_BYTES];
    send_control(h, r, WIRE_EVICTED, buf, wire_encode_evicted(h->round_step, 1, text, buf));
    r->state = R_CONNECTED;   // it must JOIN again
    leave_round(h, id);
    drop_queue(r);
    if (h->donor == id) abort_transfer(h, "the donor was evicted", false);
    else stop_receiving(h, id);
}

// A joiner of a catch-up transfer that said CAUGHT_UP and has been sent every mean up to the
// hub's answer is in its inner phase: from then on the rounds wait for it as for the joiner of
// a whole transfer (timeout_s plus how long its state took: check_round), no longer for ever
// (a joiner whose trainer hung while its heartbeats went on held every round of the group).
static bool catchup_delivered(const relay *h, const replica *r) {
    return r->catching_up && !r->joiner && r->caught_up_to >= 0 && h->patched_through >= r->caught_up_to &&
           backlog_bytes(r) == 0;
}

// Whether replica id sends or receives the state transfer in flight. The transfer holds the
// round for it (a stalled transfer is aborted: run_loop), however long it takes: evicted as
// late, a donor would have to take a state itself, and its joiners would wait again (a state
// longer than timeout_s could never arrive).
static bool in_transfer(const relay *h, int id) {
    const replica *r = &h->reps[id];
    return (h->donor >= 0 && ((id == h->donor && !h->catchup) || r->joiner)) ||
           (r->catching_up && !catchup_delivered(h, r)) || r->state_draining || r->donating ||
           (r->follow_held && !r->follow_bounded);
}

// Whether member id, due in the open round and not yet begun, is one the round waits for past
// its deadline: in a transfer, or in the inner phase the transfer delayed.
static bool held_by_transfer(const relay *h, int id, double now) {
    if (in_transfer(h, id)) return true;
    const replica *r = &h->reps[id];
    return r->transfer_delay_s > 0 && h->first_began_s >= 0 &&
           now - h->first_began_s < h->o.timeout_s + r->transfer_delay_s;
}

// Whether the open round waits for a transfer (HEARTBEAT_HOLD: the uploads held back meanwhile
// are not stuck).
static bool round_held(relay *h, double now) {
    if (!h->round_open) return false;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        const replica *r = rep(h, i);
        if (r->state == R_MEMBER && !h->contrib[i].began && due(h, i) && held_by_transfer(h, i, now)) return true;
    }
    return false;
}

// Closes the round if it can close now; evicts the late at the deadline (for the donor and
// joiners of a transfer, that long after it ended).
static void check_round(relay *h) {
    if (!h->round_open) return;
    double now = wall_seconds();
    bool all = true;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        replica *r = rep(h, i);
        if (r->state != R_MEMBER || h->contrib[i].whole || !due(h, i)) continue;
        if (catchup_delivered(h, r) && r->transfer_delay_s == 0) r->transfer_delay_s = now - r->state_began_s;
        if (in_transfer(h, i)) {
            all = false;
            continue;
        }
        double extra = r->transfer_delay_s > r->follow_delay_s ? r->transfer_delay_s : r->follow_delay_s;
        bool deadline = h->first_began_s >= 0 && now - h->first_began_s >= h->o.timeout_s + extra;
        // Still uploading and moving: wait for it even past the deadline.
        bool moving = r->up.started && now - r->up.last_progress_s < h->o.timeout_s;
        if (r->up.started && !moving) {
            char why[96];
            snprintf(why, sizeof why, "its upload stalled for %.1f s", now - r->up.last_progress_s);
            lose_replica(h, i, why);   // calls check_round again
            return;
        }
        if (deadline && !moving && !between_rounds(h, i)) evict_late(h, i);
        else all = false;
    }
    try_reduce(h);
    if (all && reduction_done(h)) close_round(h);
}

static const char *open_or_check_round(relay *h, int64_t step) {
    static char why[160];
    if (h->round_open) {
        if (step == h->round_step) return NULL;
        snprintf(why, sizeof why, "contributed to step %lld while the round is for step %lld", (long long)step,
                 (long long)h->round_step);
        return why;
    }
    if (step <= h->last_closed_step) {
        snprintf(why, sizeof why, "contributed to step %lld, but the group has closed step %lld", (long long)step,
                 (long long)h->last_closed_step);
        return why;
    }
    h->round_open = true;
    h->round_serial++;
    h->round_step = step;
    h->first_began_s = -1;
    h->round_in_bytes = h->round_out_bytes = 0;
    h->round_sized = false;
    h->round_total = 0;
    h->reduced = h->n_segments = 0;
    return NULL;
}

static void tell_evicted(relay *h, int id, int64_t step, const char *text) {
    uint8_t buf[WIRE_EVICTED_HEAD_BYTES + WIRE_MAX_TEXT_BYTES];
    send_control(h, rep(h, id), WIRE_EVICTED, buf, wire_encode_evicted(step, 1, text, buf));
}

// Out of the round, told why: it stays connected and must JOIN again.
static void evict_from_round(relay *h, int id, const char *text) {
    replica *r = rep(h, id);
    hub_log(h, "replica %d (%s) evicted: %s", id, r->peer, text);
    tell_evicted(h, id, h->round_step, text);
    r->state = R_CONNECTED;
    leave_round(h, id);
    h->contrib[id].left = true;   // its chunks still in flight are ignored
    drop_queue(r);
    stop_receiving(h, id);
    check_round(h);
}

// With several hubs: member id completed outer step k (DONE, or moved_on below). It is expected
// in no round of step k any more; later contributions to step k are refused (stale); an open
// round of step k it was expected in and has not begun is another set's: aborted.
static void take_completion(relay *h, int id, int64_t k) {
    replica *r = rep(h, id);
    if (k > r->done_step) r->done_step = k;
    if (k > h->completed_step) h->completed_step = k;
    bool was_due = h->round_step >= r->member_from;
    if (h->round_open && step_of(h->round_step) <= k && !h->contrib[id].began && was_due) abort_round(h, id);
}

// With several hubs: the first frame of a member for a later outer step than the open round's,
// when it began a round of the open round's step here and has not begun this one, says it
// completed that step (failed, it would redo the same step; evicted, it rejoins first and is
// expected from a later round): its DONE is on the control connection, which a chunk on a data
// connection may overtake.
static bool moved_on(relay *h, int id, int64_t round) {
    const replica *r = rep(h, id);
    return several_hubs(h) && h->round_open && step_of(round) > step_of(h->round_step) && r->state == R_MEMBER &&
           !r->joiner && !h->contrib[id].began && r->began_step == step_of(h->round_step) && due(h, id);
}

// The round's size so far came from chunks alone (they may overtake their CONTRIBUTE): a
// CONTRIBUTE whose sizes follow from its encoding (spec_problem) says what it is. The
// contributions begun with another size are evicted; a broken replica's chunks must not make
// the others' whole contributions wrong.
static void resize_round(relay *h, int id, uint64_t total, uint32_t chunk) {
    char text[300];
    snprintf(text, sizeof text,
             "its payload for step %lld is %llu bytes in chunks of %u, but the round's first CONTRIBUTE says %llu "
             "bytes in chunks of %u (the replicas' configs differ)",
             (long long)h->round_step, (unsigned long long)h->round_total, h->round_chunk, (unsigned long long)total,
             chunk);
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        if (i == id || !h->contrib[i].began || h->contrib[i].left) continue;
        hub_log(h, "replica %d (%s) evicted: %s", i, rep(h, i)->peer, text);
        evict_quietly(h, i, text);
        contribution_drop_segments(&h->contrib[i]);   // of the old size, whole or not: nothing reads them
    }
    h->round_total = total;
    h->round_chunk = chunk;
    h->n_segments = (int64_t)((total + chunk - 1) / chunk);
}

// A member begins its contribution with its first frame (CONTRIBUTE, or a chunk, which may
// overtake it on another connection). Every contribution to a round has the size of the
// round's first; a member may not begin once segments were reduced without it (it joined
// the group after the round had begun). spec: the CONTRIBUTE, checked by spec_problem (NULL
// for a chunk).
static bool start_contribution(relay *h, int id, int64_t step, uint64_t total, uint32_t chunk,
                               const wire_contribute *spec) {
    replica *r = rep(h, id);
    contribution *k = &h->contrib[id];
    bool first = !k->began;
    if (moved_on(h, id, step)) take_completion(h, id, step_of(h->round_step));
    const char *why = open_or_check_round(h, step);
    if (!why && total == 0) why = "announced an empty contribution";
    if (!why && h->round_total && !h->round_sized && spec && first && h->reduced == 0 &&
        (total != h->round_total || chunk != h->round_chunk))
        resize_round(h, id, total, chunk);
    if (!why && h->round_total && (total != h->round_total || chunk != h->round_chunk)) {
        // One broken replica must not make the hub (or the receivers) hold what it likes.
        char text[200];
        snprintf(text, sizeof text,
                 "its payload for step %lld is %llu bytes, but the round's first contribution is %llu bytes "
                 "(the replicas' configs differ)",
                 (long long)step, (unsigned long long)total, (unsigned long long)h->round_total);
        evict_from_round(h, id, text);
        return false;
    }
    if (!why && first && h->reduced > 0) {
        evict_from_round(h, id, "began its contribution after the hub had begun to reduce the round");
        return false;
    }
    if (!why) why = transfer_expect(&r->up, step, total, chunk);
    if (why) {
        drop_replica(h, id, why);
        return false;
    }
    if (first) {
        if (!h->round_total) {
            h->round_total = total;
            h->round_chunk = chunk;
            h->n_segments = (int64_t)((total + chunk - 1) / chunk);
        }
        k->began = true;
        if (several_hubs(h)) r->began_step = step_of(step);
        k->total = total;
        k->n_segments = h->n_segments;
        k->seg = calloc((size_t)k->n_segments, sizeof *k->seg);
        if (!k->seg) {
            lose_replica(h, id, "the hub is out of memory for its contribution");
            return false;
        }
        if (h->first_began_s < 0) h->first_began_s = wall_seconds();
        r->transfer_delay_s = r->follow_delay_s = 0;
        r->donating = r->state_draining = r->follow_held = r->follow_bounded = false;
        if (r->catching_up) {
            r->catching_up = false;
            end_catchup_if_done(h);
        }
    }
    return true;
}

// ---------------------------------------------------------------- the downlink's residual
// Kept per range of the model this hub has reduced: a payload's values at their model offset
// (the whole model, a streaming fragment, or with several hubs a share of one), allocated
// (zeroed) when a round first asks for that range. A hub of K holds its shares' values, about
// 4·N/K bytes, not the whole model's 4·N (docs/protocol.md, "What the hub stores"). Ranges
// repeat exactly (the same fragments, cut into the same shares); one that overlaps a kept
// range without matching it replaces it.
static void free_residual(relay *h) {
    for (int i = 0; i < h->n_residual; i++) free(h->residual[i].r);
    free(h->residual);
    h->residual = NULL;
    h->n_residual = 0;
    h->residual_model = 0;
    h->round_residual = NULL;
}

static uint64_t residual_values(const relay *h) {
    uint64_t n = 0;
    for (int i = 0; i < h->n_residual; i++) n += h->residual[i].values;
    return n;
}

// NULL when the memory is not there: nothing kept is changed, and the caller refuses the
// contribution that asked for it (a peer's claim must never stop the hub).
static float *residual_for(relay *h, uint64_t offset, uint64_t values, uint64_t model_values) {
    if (h->residual_model == model_values)
        for (int i = 0; i < h->n_residual; i++)
            if (h->residual[i].offset == offset && h->residual[i].values == values) return h->residual[i].r;
    float *r = values <= SIZE_MAX / sizeof(float) ? calloc((size_t)values, sizeof(float)) : NULL;
    if (!r) return NULL;
    if (h->residual_model != model_values) free_residual(h);   // a model of another size
    h->residual_model = model_values;
    int kept = 0;
    for (int i = 0; i < h->n_residual; i++) {
        residual_range *g = &h->residual[i];
        if (g->offset < offset + values && offset < g->offset + g->values) free(g->r);   // overlaps: replaced
        else h->residual[kept++] = *g;
    }
    h->n_residual = kept;
    h->residual = xrealloc(h->residual, (size_t)(h->n_residual + 1) * sizeof *h->residual);
    h->residual[h->n_residual++] = (residual_range){.offset = offset, .values = values, .r = r};
    char b[32], b2[32];
    uint64_t all = residual_values(h);
    hub_log(h, "downlink error feedback: a residual of %llu values (%s) for values %llu .. %llu of %llu; %s in all",
            (unsigned long long)values, format_bytes(values * sizeof(float), b, sizeof b), (unsigned long long)offset,
            (unsigned long long)(offset + values - 1), (unsigned long long)model_values,
            format_bytes(all * sizeof(float), b2, sizeof b2));
    return r;
}

// Whether a CONTRIBUTE can be a round's layout: the sizes must follow from the encoding.
// Checked before the contribution fixes anything (the round's size), so that a refused one
// leaves the round to the next.
static const char *spec_problem(const wire_contribute *m) {
    if (m->values > ((uint64_t)1 << 42)) return "its CONTRIBUTE announces too many values";
    quant_codec up = up_codec(m), down = codec(m->down_codec);
    size_t down_chunk = quant_encoded_bytes(down, m->segment_values, m->block);
    if (m->total_bytes != quant_segmented_bytes(up, (int64_t)m->values, m->block, m->segment_values) ||
        m->chunk_bytes != quant_encoded_bytes(up, m->segment_values, m->block))
        return "its CONTRIBUTE's sizes disagree with its encoding";
    if (down_chunk < WIRE_MIN_CHUNK_BYTES || down_chunk > WIRE_MAX_CHUNK_BYTES)
        return "its segments of the mean would be out of the chunk bounds";
    return NULL;
}

// The round's layout from its first CONTRIBUTE (spec_problem passed). NULL, or why the hub
// cannot take it (its memory): the round is then left unsized, the caller refuses the contributor.
static const char *take_spec(relay *h, const wire_contribute *m) {
    static char why[400];
    quant_codec down = codec(m->down_codec);
    if (h->scratch_values < m->segment_values) {
        float *scratch = malloc((size_t)m->segment_values * sizeof(float));
        if (!scratch) {
            snprintf(why, sizeof why, "the hub is out of memory for one segment of its contribution (%u values)",
                     m->segment_values);
            return why;
        }
        free(h->scratch);
        h->scratch = scratch;
        h->scratch_values = m->segment_values;
    }
    bool feedback = (m->flags & WIRE_HUB_FEEDBACK) && down != QUANT_NONE;
    float *residual = NULL;
    if (feedback) {
        residual = residual_for(h, m->value_offset, m->values, m->model_values);
        if (!residual) {
            char b[32];
            snprintf(why, sizeof why,
                     "the hub cannot hold the downlink's error feedback its contribution asks for (values %llu .. "
                     "%llu of a model of %llu: %s): out of memory; run the replicas with diloco_downlink_feedback = 0 "
                     "or give the hub more memory",
                     (unsigned long long)m->value_offset, (unsigned long long)(m->value_offset + m->values - 1),
                     (unsigned long long)m->model_values, format_bytes(m->values * sizeof(float), b, sizeof b));
            return why;
        }
    } else {
        free_residual(h);
    }
    h->spec = *m;
    h->round_sized = true;
    h->down_chunk = (uint32_t)quant_encoded_bytes(down, m->segment_values, m->block);
    h->down_total = quant_segmented_bytes(down, (int64_t)m->values, m->block, m->segment_values);
    h->round_residual = residual;
    return NULL;
}

static bool same_layout(const wire_contribute *a, const wire_contribute *b) {
    return a->total_bytes == b->total_bytes && a->chunk_bytes == b->chunk_bytes && a->up_codec == b->up_codec &&
           a->up_keep == b->up_keep && a->down_codec == b->down_codec && a->flags == b->flags && a->block == b->block &&
           a->segment_values == b->segment_values && a->bound == b->bound && a->values == b->values &&
           a->value_offset == b->value_offset &&
           a->model_values == b->model_values;
}

static void finish_contribution_if_whole(relay *h, int id) {
    replica *r = rep(h, id);
    if (!transfer_whole(&r->up) || h->contrib[id].whole) return;
    h->contrib[id].whole = true;
    check_round(h);
}

// Frames for a step the group has closed, or from a replica that is not a member, come from
// a replica dropped from a round: chunks are ignored, and a contribution is answered with
// EVICTED so that the replica stops waiting for the round and rejoins. The same holds for a
// replica that began the open round and left it (dropped, evicted, rejoined), whole or not.
static bool left_round(relay *h, int id, int64_t step) {
    return h->round_open && step == h->round_step && h->contrib[id].left;
}

// With several hubs, a round of an outer step that a member has completed without it is another
// set of replicas' (a hub died after some had its mean and others had not, or the replicas
// disagreed on which hubs are live): it cannot stand (docs/protocol.md, "Several hubs").
static bool step_completed(relay *h, int64_t round) {
    return several_hubs(h) && h->completed_step >= 0 && step_of(round) <= h->completed_step;
}

static bool stale(relay *h, int id, int64_t step) {
    return rep(h, id)->state != R_MEMBER || step <= h->last_closed_step || left_round(h, id, step) ||
           step_completed(h, step);
}

static void on_contribute(relay *h, int id, const wire_contribute *m) {
    replica *r = rep(h, id);
    if (stale(h, id, m->outer_step)) {
        const char *why = r->state != R_MEMBER                   ? "not a member of the group (rejoin)"
                          : left_round(h, id, m->outer_step)     ? "it left that round after beginning it (rejoin)"
                          : m->outer_step <= h->last_closed_step ? "the group has closed that round"
                                                                 : "other replicas completed that outer step without "
                                                                   "this round (rejoin)";
        char text[300], name[96];
        snprintf(text, sizeof text, "contribution to round %lld refused: %s", (long long)m->outer_step, why);
        hub_log(h, "replica %d: contribution to round %s refused: %s", id, name_round(h, m->outer_step, name, sizeof name),
                why);
        if (r->state == R_MEMBER && !r->joiner) {
            r->state = R_CONNECTED;   // out of step with the group
            leave_round(h, id);
            drop_queue(r);
            stop_receiving(h, id);
        }
        tell_evicted(h, id, m->outer_step, text);
        check_round(h);
        return;
    }
    if (r->joiner) {
        drop_replica(h, id, "contributed before its state arrived");
        return;
    }
    if (r->up.announced) {
        drop_replica(h, id, "announced its contribution twice");
        return;
    }
    // A CONTRIBUTE that would fix the round's layout is checked before it fixes anything (the
    // round's size): refused, it leaves the round to the next contribution.
    bool sizes_round = !(h->round_open && h->round_step == m->outer_step && h->round_sized);
    const char *bad = sizes_round ? spec_problem(m) : NULL;
    if (bad) {
        drop_replica(h, id, bad);
        return;
    }
    if (!start_contribution(h, id, m->outer_step, m->total_bytes, m->chunk_bytes, m)) return;
    if (!h->round_sized) {
        const char *why = take_spec(h, m);
        if (why) {
            // The hub cannot take this layout: the size it fixed goes with it, unless another
            // contribution in the round began with that size.
            bool others = false;
            for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
                others |= i != id && h->contrib[i].began && !h->contrib[i].left;
            if (!others) h->round_total = 0, h->round_chunk = 0, h->n_segments = 0;
            drop_replica(h, id, why);
            return;
        }
    } else if (!same_layout(m, &h->spec)) {
        char text[200];
        snprintf(text, sizeof text,
                 "its payload for step %lld is encoded differently from the round's first contribution (the "
                 "replicas' configs differ)",
                 (long long)m->outer_step);
        evict_from_round(h, id, text);
        return;
    }
    r->up.announced = true;
    h->contrib[id].announced = true;
    h->contrib[id].tokens = m->tokens;
    finish_contribution_if_whole(h, id);
    try_reduce(h);
}

static void on_payload_chunk(relay *h, hub_conn *hc, const wire_data *d) {
    int id = hc->replica;
    replica *r = rep(h, id);
    if (stale(h, id, d->outer_step)) return;
    if (d->owner_id != (uint32_t)id) {
        drop_replica(h, id, "sent a chunk of another replica's payload");
        return;
    }
    if (!start_contribution(h, id, d->outer_step, d->total_bytes, d->chunk_bytes, NULL)) return;
    const char *why = transfer_take(&r->up, d);
    if (why) {
        drop_replica(h, id, why);
        return;
    }
    blob *b = blob_new((size_t)d->chunk_len);
    if (!b) {
        lose_replica(h, id, "the hub is out of memory for its chunk");
        return;
    }
    memcpy(b->data, d->bytes, (size_t)d->chunk_len);
    contribution *k = &h->contrib[id];
    int64_t c = (int64_t)(d->offset / d->chunk_bytes);
    if (c < h->reduced) {   // cannot happen for a contributor the reduction waited for: a guard
        blob_release(b);
        drop_replica(h, id, "sent a segment the hub has already reduced");
        return;
    }
    k->seg[c] = b;
    while (k->prefix < k->n_segments && (k->prefix < h->reduced || k->seg[k->prefix])) k->prefix++;
    h->round_in_bytes += d->chunk_len;
    hc->last_seg = c;
    hc->seg_round = h->round_serial;
    // Every connection of it has brought a segment beyond the window while the segment the
    // reduction waits for has not come: it cannot come (each connection is in order), and the
    // hub would hold whatever such a peer sends.
    if (c >= h->reduced + WINDOW_SEGMENTS && k->prefix <= h->reduced) {
        bool all = true;
        for (int s = 1; s <= r->streams; s++) all &= r->data[s] && stream_ahead(h, r->data[s]);
        if (all) {
            char why[300];
            snprintf(why, sizeof why,
                     "sent segment %lld of round %lld before segment %lld, which the reduction waits for: more than %d "
                     "segments ahead of the reduction on every data stream (the hub's window)",
                     (long long)c, (long long)h->round_step, (long long)h->reduced, WINDOW_SEGMENTS);
            drop_replica(h, id, why);
            return;
        }
    }
    finish_contribution_if_whole(h, id);
    try_reduce(h);
}

// ---------------------------------------------------------------- joins
static bool same_status(const wire_status *a, const wire_status *b) {
    return a->outer_step == b->outer_step && a->param_hash == b->param_hash;
}

// A group without members starts over from the founder's status: the step numbers of the
// group that was are forgotten (the founder may be behind them, e.g. every replica restarted
// from an older checkpoint).
static void found_group(relay *h, int founder) {
    h->status_known = true;
    h->status = rep(h, founder)->status;
    h->last_closed_step = -1;
    h->follow_from = -1;
    h->completed_step = -1;
    // A group founded anew starts without the downlink residual (its replicas may have gone
    // back to a checkpoint): what the last means did not carry is lost, at most one round's
    // quantization error of the mean (docs/protocol.md).
    free_residual(h);
}

// A group being founded starts training only once it has as many replicas as any of them
// asks for (its diloco_min_replicas, or the relay's --min_replicas), members or waiting:
// before that every round would be skipped, and the first replica would train alone and
// make the others take its state. Held members get JOINED(member) together.
static void release_held(relay *h) {
    int quorum = h->o.min_replicas, present = 0, held = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        const replica *r = rep(h, i);
        if (r->state != R_MEMBER && r->state != R_WAITING) continue;
        present++;
        held += r->held;
        if (r->min_replicas > quorum) quorum = r->min_replicas;
    }
    if (held == 0 || present < quorum) return;
    hub_log(h, "%d replica(s) present (quorum %d): the group starts training", present, quorum);
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (rep(h, i)->held) {
            rep(h, i)->held = false;
            send_joined(h, rep(h, i), JOINED_MEMBER);
        }
}

static int held_members(relay *h) {
    int n = 0;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) n += rep(h, i)->held;
    return n;
}

// Whether the group is being founded: it has closed no round and none is open.
static bool founding(relay *h) { return h->status_known && h->last_closed_step < 0 && !h->round_open; }

// A group being founded (no round yet) that a replica ahead of its founder joins is founded anew
// from that replica. The founder may be a replica requeued from an older checkpoint that reached
// a restarted relay first (or the hub lost every member): the others, further on, took its state
// and the whole group went back to its outer step, saying nothing. The members of the old
// founding leave the group: one held (no JOINED yet) is told to wait for the state; one already
// training has its first contribution refused (not a member) and rejoins, taking the state then.
static void refound_ahead(relay *h, int id) {
    char ids[1200] = "";
    int n = 0, held[WIRE_MAX_REPLICAS], n_held = 0;
    int64_t was = h->status.outer_step;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        replica *o = rep(h, i);
        if (i == id || o->state != R_MEMBER) continue;
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, "%s%d", n++ ? " " : "", i);
        if (o->held) {
            o->held = false;
            o->state = R_WAITING;
            held[n_held++] = i;
        } else {
            o->state = R_CONNECTED;
        }
    }
    found_group(h, id);
    make_member(h, id);
    rep(h, id)->held = true;
    hub_log(h, "replica %d joined at outer step %lld (hash %016llx), ahead of the group being founded at outer step "
               "%lld (no round yet): it founds the group anew; replica(s) [%s] take its state",
            id, (long long)h->status.outer_step, (unsigned long long)h->status.param_hash, (long long)was, ids);
    for (int k = 0; k < n_held; k++) send_joined(h, rep(h, held[k]), JOINED_WAIT);
    // Those waiting already that are where the new founder is are members with it (settle_group).
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) {
        replica *o = rep(h, i);
        if (o->state == R_WAITING && same_status(&o->status, &h->status)) {
            make_member(h, i);
            o->held = true;
        }
    }
    release_held(h);
    join_in_flight(h);
}

static void on_join(relay *h, int id, const wire_status *s) {
    replica *r = rep(h, id);
    // A JOIN from a member or a waiting replica starts its join over (it may have missed a
    // frame of ours; its word on its status wins).
    if (r->joiner) {
        r->joiner = false;
        forget_lacks(r);
        drop_queue(r);
    }
    if (r->state == R_MEMBER) leave_round(h, id);
    r->state = R_CONNECTED;
    r->held = false;
    r->transfer_delay_s = r->follow_delay_s = 0;
    r->state_draining = r->donating = false;
    r->catching_up = r->follow_held = r->follow_bounded = false;
    r->follow_waiting_since_s = 0;   // it joins here now: a later FOLLOW of no round starts its own wait
    r->caught_up_to = -1;
    if (h->donor == id) abort_transfer(h, "the donor joins again", false);
    stop_transfer_without_joiners(h);
    // The round it left may close now, without it: a replica that waits takes the state of the
    // next close, never of the one its own JOIN let close (the ranks of a sharded replica join
    // their groups at different moments of their rounds and must all get the same close's).
    check_round(h);
    for (int st = 1; st <= r->streams; st++)
        if (!r->data[st]) {
            drop_replica(h, id, "sent JOIN before all its data streams were connected");
            return;
        }
    r->status = *s;
    r->member_from = 0;
    r->began_step = r->done_step = -1;
    if (count_members(h) == 0 && h->finished_by >= 0) {
        send_finished(h, id);
    } else if (count_members(h) == 0) {
        found_group(h, id);
        make_member(h, id);
        r->held = true;
        hub_log(h, "replica %d joined: founds the group at outer step %lld (hash %016llx)", id,
                (long long)s->outer_step, (unsigned long long)s->param_hash);
        release_held(h);
    } else if (founding(h) && s->outer_step > h->status.outer_step) {
        refound_ahead(h, id);
    } else if (h->status_known && same_status(s, &h->status) && !(h->round_open && h->contrib[id].left)) {
        make_member(h, id);
        r->held = founding(h) && held_members(h) > 0;
        if (!r->held) send_joined(h, r, JOINED_MEMBER);
        hub_log(h, "replica %d joined: member at outer step %lld", id, (long long)s->outer_step);
        release_held(h);
    } else {
        r->state = R_WAITING;
        send_joined(h, r, JOINED_WAIT);
        release_held(h);
        hub_log(h, "replica %d joined at outer step %lld (hash %016llx): waits for the group's state at the next "
                   "round",
                id, (long long)s->outer_step, (unsigned long long)s->param_hash);
        // Ahead of the group (its last closed round's outer step + 1): the founder was behind and
        // the group has had rounds since (refound_ahead is too late); it goes back.
        int64_t closed = several_hubs(h) ? step_of(h->last_closed_step) : h->last_closed_step;
        int64_t group = h->last_closed_step < 0 ? -1 : closed + 1;
        if (group >= 0 && s->outer_step > group)
            hub_log(h, "warning: replica %d is at outer step %lld, ahead of the group's %lld: it takes the group's "
                       "state and loses %lld outer step(s) (the group was founded by a replica behind it: "
                       "docs/diloco.md#membership-and-faults-tcp)",
                    id, (long long)s->outer_step, (long long)group, (long long)(s->outer_step - group));
        join_in_flight(h);
    }
}

// A group without members (all gone) is refounded by the lowest-id waiting replica; the
// others waiting are members at once if their status matches its.
static void settle_group(relay *h) {
    if (count_members(h) > 0) return;
    int founder = -1;
    for (int i = 0; i < WIRE_MAX_REPLICAS && founder < 0; i++)
        if (h->reps[i].state == R_WAITING) founder = i;
    if (founder < 0) return;
    if (h->finished_by >= 0) {  // the last member finished the run: nobody is left to train with
        for (int i = founder; i < WIRE_MAX_REPLICAS; i++)
            if (h->reps[i].state == R_WAITING) send_finished(h, i);
        return;
    }
    found_group(h, founder);
    hub_log(h, "the group has no members: replica %d founds it anew at outer step %lld", founder,
            (long long)h->status.outer_step);
    for (int i = founder; i < WIRE_MAX_REPLICAS; i++) {
        replica *r = rep(h, i);
        if (r->state == R_WAITING && same_status(&r->status, &h->status)) {
            make_member(h, i);
            send_joined(h, r, JOINED_MEMBER);
        }
    }
}

// FOLLOW (a run with several hubs, at a hub that is not the replica's primary): a member at
// once, without a state transfer (the primary hub's join brings the replica in step with the
// group), expected in rounds from first_round on — in the round open now only while the hub has
// reduced none of its segments (then with timeout_s from now), else once it begins it. A member that follows again keeps its part in the open round
// (its chunks may overtake the FOLLOW on the data connections). A group without members is
// founded by the follower, with its status unknown (a later JOIN waits for a state).
static void on_follow(relay *h, int id, const wire_follow *m) {
    replica *r = rep(h, id);
    if (!several_hubs(h)) {
        drop_replica(h, id, "sent FOLLOW, but its diloco_rendezvous lists one hub");
        return;
    }
    // A FOLLOW from a replica receiving a state here ends its join, as a JOIN would. (One still
    // catching up kept catching_up: never caught up (no CAUGHT_UP), it was in the transfer for
    // ever, and every round waited for it.)
    if (receives_state(r)) {
        drop_queue(r);
        r->state = R_CONNECTED;
        stop_receiving(h, id);
    }
    r->held = false;
    r->transfer_delay_s = r->follow_delay_s = 0;
    r->state_draining = r->donating = false;
    for (int st = 1; st <= r->streams; st++)
        if (!r->data[st]) {
            drop_replica(h, id, "sent FOLLOW before all its data streams were connected");
            return;
        }
    r->status = (wire_status){.outer_step = m->outer_step, .param_hash = m->param_hash};
    r->began_step = r->done_step = -1;
    bool founds = count_members(h) == 0;
    if (founds) {
        found_group(h, id);
        h->status_known = false;
        if (m->first_round != INT64_MAX) h->follow_from = m->first_round;
    }
    make_member(h, id);
    r->member_from = m->first_round;
    r->follow_held = (m->flags & FOLLOW_CATCHUP) && m->first_round != INT64_MAX;
    // Its first round here waits, past timeout_s, as long as its state took through its primary
    // (from its FOLLOW of no round to this one), as the primary's rounds wait for a catch-up
    // joiner (transfer_delay_s): a bound. Held until it began a contribution, a joiner whose
    // trainer hung while its heartbeats went on held this hub's rounds for ever, and the others'
    // uploads counted as held, not stuck. (A first join sends no FOLLOW of no round: the time is
    // not known, and the round waits until it begins, as before.)
    double now_s = wall_seconds();
    r->follow_bounded = r->follow_held && r->follow_waiting_since_s > 0;
    if (r->follow_bounded) r->transfer_delay_s = now_s - r->follow_waiting_since_s;
    if (m->first_round != INT64_MAX) r->follow_waiting_since_s = 0;
    else if (r->follow_waiting_since_s == 0) r->follow_waiting_since_s = now_s;
    // The replicas that find a hub back follow it at about the same moment (each from a step or
    // two after its own next one): until the group has had a round, they all start from its
    // founder's first round, so that they agree on the step the hub takes its share again.
    // (A replica that caught up is never expected before its first round: it has the means of
    // the steps before, and its first round waits for it.)
    bool unstarted = h->follow_from >= 0 && h->last_closed_step < 0 && !h->round_open;
    if (unstarted && m->first_round != INT64_MAX && (!r->follow_held || h->follow_from > r->member_from))
        r->member_from = h->follow_from;
    // Not in a round this hub has closed (JOINED then says the next: a replica that caught up
    // through its primary, which had not closed that step yet, takes that step's mean too).
    if (r->member_from != INT64_MAX && h->last_closed_step >= 0 && r->member_from <= h->last_closed_step)
        r->member_from = h->last_closed_step + 1;
    // Not in the open round once the hub has reduced segments of it without this replica (it
    // could not be in their mean); before that, it is expected like the others: a joiner's
    // first round here is open while the group waits for the donor (HOLD), and it must be in it.
    if (h->round_open && !h->contrib[id].began && r->member_from <= h->round_step && h->reduced > 0)
        r->member_from = h->round_step + 1;
    // Expected in a round that began before it followed (a joiner, after its state came through
    // its primary hub): its deadline counts from now.
    if (h->round_open && h->first_began_s >= 0 && !h->contrib[id].began && r->member_from <= h->round_step)
        r->follow_delay_s = wall_seconds() - h->first_began_s;
    // JOINED answers a FOLLOW with the round this replica is expected from.
    uint8_t jb[WIRE_JOINED_BYTES];
    wire_joined j = {.result = JOINED_MEMBER, .group_step = r->member_from, .group_hash = 0};
    send_control(h, r, WIRE_JOINED, jb, wire_encode_joined(&j, jb));
    if (m->first_round == INT64_MAX)
        hub_log(h, "replica %d follows%s: member, expected in no round until it follows again", id,
                founds ? " and founds the group" : "");
    else
        hub_log(h, "replica %d follows%s: member at outer step %lld, expected from round %lld on%s", id,
                founds ? " and founds the group" : "", (long long)m->outer_step, (long long)r->member_from,
                r->follow_held ? " (it caught up through its primary: its first round waits for it)" : "");
    check_round(h);
    release_held(h);
}

// DONE (several hubs): member id's exchange for outer step k is over, everywhere. It is expected
// in no round of step k or before. Completed, it has every share's mean of step k: a round of
// step k here that it has not begun is another set of replicas' (abort_round), and later
// contributions to step k are refused (stale): the replicas that completed step k win, and
// those that did not take their state (docs/protocol.md, "Several hubs"). Only members count:
// a replica evicted here rejoins through its primary anyway.
#define DONE_MAX_AHEAD 64   // outer steps: see on_done
static void on_done(relay *h, int id, const wire_done *m) {
    replica *r = rep(h, id);
    if (!several_hubs(h)) {
        drop_replica(h, id, "sent DONE, but its diloco_rendezvous lists one hub");
        return;
    }
    if (h->dying_for == id && m->result == DONE_COMPLETE) die_now(h, "the replica that had the round's ROUND is done");
    if (r->state != R_MEMBER || r->joiner) return;
    // A replica completes the steps it exchanges here, one at a time: a DONE far past anything
    // this hub knows of it (its JOIN or FOLLOW, the rounds it began, its first round here, its
    // last DONE) or of the group (its rounds, the other members' DONEs) is a broken peer. Taken,
    // it made every later contribution here stale and no round of this hub could close again.
    // (A hub with no share of a small payload has no round: without the DONEs counted, its
    // replicas were dropped at their 65th step, test_transport hubfew.) Its own DONEs let it
    // go on alone; the group's completed step, which makes every member's rounds up to it stale,
    // moves only within 64 steps of what the group shows (one peer's DONEs, 64 steps further
    // each, could have walked it anywhere).
    int64_t group = r->status.outer_step;
    int64_t seen[] = {r->began_step, step_of(h->round_step), step_of(h->last_closed_step),
                      r->member_from == INT64_MAX ? -1 : step_of(r->member_from)};
    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++)
        if (seen[i] > group) group = seen[i];
    for (int j = 0; j < WIRE_MAX_REPLICAS; j++)
        if (j != id && h->reps[j].state == R_MEMBER && h->reps[j].done_step > group) group = h->reps[j].done_step;
    int64_t known = r->done_step > group ? r->done_step : group;
    if (m->outer_step > known + DONE_MAX_AHEAD) {
        char why[160];
        snprintf(why, sizeof why, "said DONE for outer step %lld, far past any step it or the group has been in here (%lld)",
                 (long long)m->outer_step, (long long)known);
        drop_replica(h, id, why);
        return;
    }
    if (m->result == DONE_COMPLETE && m->outer_step <= group + DONE_MAX_AHEAD) take_completion(h, id, m->outer_step);
    else if (m->outer_step > r->done_step) r->done_step = m->outer_step;
    check_round(h);
}

// HOLD (several hubs): member id sends its state to joiners through another hub. Its rounds
// here wait for it as that hub's do (in_transfer), and after it it has the transfer's duration on
// top of timeout_s. A replica that dies meanwhile is dropped as any other; one whose transfer
// ends badly says HOLD_END all the same.
static void on_hold(relay *h, int id, uint32_t what) {
    replica *r = rep(h, id);
    if (!several_hubs(h)) {
        drop_replica(h, id, "sent HOLD, but its diloco_rendezvous lists one hub");
        return;
    }
    double now = wall_seconds();
    if (what == HOLD_BEGIN) {
        r->donating = true;
        r->donating_since_s = now;
        hub_log(h, "replica %d sends its state through another hub: its rounds here wait for it", id);
    } else if (r->donating) {
        r->donating = false;
        r->transfer_delay_s = now - r->donating_since_s;
        hub_log(h, "replica %d has sent its state through another hub in %.1f s", id, r->transfer_delay_s);
    }
    check_round(h);
}

// ---------------------------------------------------------------- the handshake
// proven: the peer has shown it holds the secret (else its line may be held back: unproven_log).
static void refuse(relay *h, hub_conn *hc, uint32_t code, const char *text, const char *log_why, bool proven) {
    if (proven) hub_log(h, "rejected %s: %s", hc->c.peer, log_why);
    else unproven_log(h, "rejected %s: %s", hc->c.peer, log_why);
    uint8_t buf[8 + WIRE_MAX_TEXT_BYTES];
    conn_send(&hc->c, WIRE_REFUSE, buf, wire_encode_refuse(code, text, buf), NULL, 0, NULL);
    close_after_flush(hc);
}

static bool session_alive(relay *h, const replica *r) {
    return r->control && !r->control->dead && wall_seconds() - r->control->c.last_rx_s < h->o.timeout_s;
}

static void welcome(relay *h, hub_conn *hc, const wire_auth *a, uint64_t session_id) {
    wire_welcome w = {.session_id = session_id, .timeout_ms = (uint32_t)(h->o.timeout_s * 1000 + 0.5)};
    uint8_t buf[WIRE_WELCOME_BYTES];
    wire_encode_welcome(&w, buf);
    wire_welcome_proof(h->secret, h->o.secret_bytes, hc->nonce_h, a->nonce_c, buf, WIRE_WELCOME_PROVEN_BYTES,
                       w.proof);
    conn_send(&hc->c, WIRE_WELCOME, buf, wire_encode_welcome(&w, buf), NULL, 0, NULL);
    // Everything after WELCOME is under the session keys.
    uint8_t c2h[WIRE_KEY_BYTES], h2c[WIRE_KEY_BYTES];
    wire_session_keys(h->secret, h->o.secret_bytes, hc->nonce_h, a->nonce_c, c2h, h2c);
    memcpy(hc->c.key_rx, c2h, WIRE_KEY_BYTES);
    memcpy(hc->c.key_tx, h2c, WIRE_KEY_BYTES);
}

static void on_auth(relay *h, hub_conn *hc, const wire_frame *f) {
    wire_auth a;
    const char *malformed = wire_decode_auth(f->payload, (size_t)f->payload_bytes, &a);
    uint8_t proof[32];
    wire_auth_proof(h->secret, h->o.secret_bytes, hc->nonce_h, f->payload, WIRE_AUTH_PROVEN_BYTES, proof);
    char why[640];
    if (!wire_equal32(proof, a.proof)) {
        snprintf(why, sizeof why, "wrong secret (its proof does not match; it says it is replica %u)", a.replica_id);
        refuse(h, hc, REFUSE_SECRET, "the hub refused your secret", why, false);
        return;
    }
    if (malformed) {
        snprintf(why, sizeof why, "malformed AUTH: %s", malformed);
        refuse(h, hc, REFUSE_BAD_ID, malformed, why, true);
        return;
    }
    int id = (int)a.replica_id;
    if (h->o.replicas > 0 && id >= h->o.replicas) {
        snprintf(why, sizeof why, "replica id %d, but the relay was started with --replicas %d", id, h->o.replicas);
        refuse(h, hc, REFUSE_BAD_ID, why, why, true);
        return;
    }
    if (h->o.replicas > 0 && (int)a.min_replicas > h->o.replicas) {   // a quorum no group can reach here
        snprintf(why, sizeof why, "replica %d asks for min_replicas %u, but the relay was started with --replicas %d",
                 id, a.min_replicas, h->o.replicas);
        refuse(h, hc, REFUSE_BAD_ID, why, why, true);
        return;
    }
    replica *r = rep(h, id);
    bool anyone = false;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++) anyone |= h->reps[i].state != R_FREE;
    if (!anyone) h->fingerprint_set = h->order_set = false;   // a new group: the first replica defines the run
    if (h->fingerprint_set && a.run_fingerprint != h->fingerprint) {
        snprintf(why, sizeof why,
                 "replica %d has run_fingerprint %016llx but the group has %016llx: its config differs in a key "
                 "every replica must share (the model, seq_len, max_steps, shuffle, seed, a diloco_ key, its "
                 "train data: the shards' tokens, or its ranks: fsdp_size, a sharded replica's rank j meeting rank "
                 "j of the others only; docs/diloco.md#replicas-of-different-sizes)",
                 id, (unsigned long long)a.run_fingerprint, (unsigned long long)h->fingerprint);
        refuse(h, hc, REFUSE_FINGERPRINT, why, why, true);
        return;
    }
    if (h->order_set && (a.hub_index != h->hub_index || a.hubs != h->hubs)) {
        snprintf(why, sizeof why,
                 "replica %d lists this hub as hub %u of %u in its diloco_rendezvous, but replica %d lists it as hub "
                 "%u of %u: every replica must list the same hubs in the same order",
                 id, a.hub_index + 1u, a.hubs, h->order_by, h->hub_index + 1u, h->hubs);
        refuse(h, hc, REFUSE_HUB_ORDER, why, why, true);
        return;
    }
    if (a.stream_index == 0) {
        if (r->state != R_FREE) {
            if (session_alive(h, r)) {
                snprintf(why, sizeof why, "duplicate replica id %d: it is already connected from %s", id, r->peer);
                refuse(h, hc, REFUSE_DUPLICATE, why, why, true);
                return;
            }
            lose_replica(h, id, "replaced by a new connection with the same id");
        }
        h->fingerprint_set = true;
        h->fingerprint = a.run_fingerprint;
        if (h->finished_by >= 0 && h->finished_fingerprint != a.run_fingerprint) {
            hub_log(h, "a replica of another run (fingerprint %016llx): the finished run's record is forgotten",
                    (unsigned long long)a.run_fingerprint);
            h->finished_by = -1;
        }
        if (!h->order_set) {
            h->order_set = true;
            h->order_by = id;
            h->hub_index = a.hub_index;
            h->hubs = a.hubs;
        }
        uint64_t session = 0;
        while (session == 0)
            if (RAND_bytes((uint8_t *)&session, sizeof session) != 1) fail("relay: OpenSSL RAND_bytes failed");
        memset(r, 0, sizeof *r);
        r->state = R_CONNECTED;
        r->session_id = session;
        r->control = hc;
        r->streams = a.streams;
        r->min_replicas = (int)a.min_replicas;
        r->began_step = r->done_step = -1;
        r->next_heartbeat_s = wall_seconds();
        snprintf(r->peer, sizeof r->peer, "%s", hc->c.peer);
        hc->role = ROLE_CONTROL;
        hc->replica = id;
        hc->c.allowed_rx = CONN_ALLOW(WIRE_HEARTBEAT) | CONN_ALLOW(WIRE_JOIN) | CONN_ALLOW(WIRE_CONTRIBUTE) |
                           CONN_ALLOW(WIRE_STATE) | CONN_ALLOW(WIRE_LEAVE) | CONN_ALLOW(WIRE_FOLLOW) |
                           CONN_ALLOW(WIRE_DONE) | CONN_ALLOW(WIRE_HOLD) | CONN_ALLOW(WIRE_CAUGHT_UP);
        welcome(h, hc, &a, session);
        hub_log(h, "replica %d connected from %s (%d data streams)", id, hc->c.peer, a.streams);
        return;
    }
    if (r->state == R_FREE || r->session_id != a.session_id || a.stream_index > r->streams ||
        r->data[a.stream_index]) {
        snprintf(why, sizeof why, "data stream %u for replica %d names no session the hub has", a.stream_index, id);
        refuse(h, hc, REFUSE_NO_SESSION, why, why, true);
        return;
    }
    r->data[a.stream_index] = hc;
    hc->role = ROLE_DATA;
    hc->replica = id;
    hc->stream = a.stream_index;
    hc->c.allowed_rx = CONN_ALLOW(WIRE_DATA);
    welcome(h, hc, &a, a.session_id);
}

// ---------------------------------------------------------------- frames
static void on_control_frame(relay *h, hub_conn *hc, const wire_frame *f) {
    int id = hc->replica;
    const char *bad = NULL;
    switch (f->type) {
    case WIRE_HEARTBEAT: return;
    case WIRE_JOIN: {
        wire_status s;
        if (!(bad = wire_decode_status(f->payload, (size_t)f->payload_bytes, &s))) on_join(h, id, &s);
        break;
    }
    case WIRE_CONTRIBUTE: {
        wire_contribute m;
        if (!(bad = wire_decode_contribute(f->payload, (size_t)f->payload_bytes, &m))) on_contribute(h, id, &m);
        break;
    }
    case WIRE_STATE: {
        wire_state m;
        if (!(bad = wire_decode_state(f->payload, (size_t)f->payload_bytes, &m))) on_state_announce(h, id, &m);
        break;
    }
    case WIRE_FOLLOW: {
        wire_follow m;
        if (!(bad = wire_decode_follow(f->payload, (size_t)f->payload_bytes, &m))) on_follow(h, id, &m);
        break;
    }
    case WIRE_DONE: {
        wire_done m;
        if (!(bad = wire_decode_done(f->payload, (size_t)f->payload_bytes, &m))) on_done(h, id, &m);
        break;
    }
    case WIRE_CAUGHT_UP: {
        int64_t round;
        if (!(bad = wire_decode_step(f->payload, (size_t)f->payload_bytes, &round))) on_caught_up(h, id, round);
        break;
    }
    case WIRE_HOLD: {
        uint32_t what;
        if (!(bad = wire_decode_hold(f->payload, (size_t)f->payload_bytes, &what))) on_hold(h, id, what);
        break;
    }
    case WIRE_LEAVE: {
        wire_leave m;
        if ((bad = wire_decode_leave(f->payload, (size_t)f->payload_bytes, &m))) break;
        bool finished = m.reason == LEAVE_FINISHED && rep(h, id)->state == R_MEMBER && !rep(h, id)->joiner;
        if (finished && h->finished_by < 0) {
            h->finished_by = id;
            h->finished_step = m.outer_step;
            h->finished_fingerprint = h->fingerprint;
        }
        end_session(h, id, 0, finished ? "left: it finished the run" : "left (goodbye)");
        return;
    }
    }
    if (bad) drop_replica(h, id, bad);
}

static void on_data_frame(relay *h, hub_conn *hc, const wire_frame *f) {
    int id = hc->replica;
    wire_data d;
    const char *bad = wire_decode_data(f->payload, (size_t)f->payload_bytes, &d);
    if (bad) drop_replica(h, id, bad);
    else if (d.kind == DATA_PAYLOAD) on_payload_chunk(h, hc, &d);
    else if (d.kind == DATA_CATCHUP) on_catchup_chunk(h, id, &d);
    else if (d.kind == DATA_STATE) on_state_chunk(h, id, &d);
    // DATA_MEAN goes from the hub to replicas only: taken as a state chunk, it was counted into the
    // joiners' state and relayed as a mean, which they ignore as stale: their state never completed.
    else drop_replica(h, id, "sent DATA of kind 3 (a mean: the hub's to send, not a replica's)");
}

// Reads what the connection has (a bounded number of frames, to stay fair).
static void read_conn(relay *h, hub_conn *hc) {
    for (int frames = 0; frames < 16 && !hc->dead && hc->role != ROLE_CLOSING; frames++) {
        if (donor_paused(h, hc) || contributor_paused(h, hc)) return;   // the window: not one frame more
        wire_frame f;
        char err[256];
        conn_result r = conn_read(&hc->c, &f, err, sizeof err);
        if (r == CONN_AGAIN) return;
        if (r == CONN_FRAME) {
            if (hc->role == ROLE_HANDSHAKE) on_auth(h, hc, &f);
            else if (hc->role == ROLE_CONTROL) on_control_frame(h, hc, &f);
            else on_data_frame(h, hc, &f);
            continue;
        }
        const char *what = r == CONN_CLOSED ? "connection closed" : err;
        if (hc->role == ROLE_HANDSHAKE) {
            if (r == CONN_CLOSED) unproven_log(h, "%s closed the connection during the handshake", hc->c.peer);
            else unproven_log(h, "rejected %s: %s", hc->c.peer, what);
            hc->dead = true;
        } else {
            char why[420];
            snprintf(why, sizeof why, "%s %s: %s", hc->role == ROLE_CONTROL ? "control connection" : "data stream",
                     hc->c.peer, what);
            hc->dead = true;   // broken: nothing more goes out on it
            lose_replica(h, hc->replica, why);
        }
        return;
    }
}

static void write_conn(relay *h, hub_conn *hc) {
    if (hc->dead || !hc->c.out_head) return;
    char err[256];
    if (conn_flush(&hc->c, err, sizeof err) >= 0) return;
    if (hc->role == ROLE_CONTROL || hc->role == ROLE_DATA) {
        char why[320];
        snprintf(why, sizeof why, "%s", err);
        hc->dead = true;
        lose_replica(h, hc->replica, why);
    } else {
        hc->dead = true;
    }
}

// ---------------------------------------------------------------- timers
static void housekeeping(relay *h) {
    double now = wall_seconds();
    if (h->unproven_quiet && now - h->unproven_window_s >= UNPROVEN_WINDOW_S) unproven_window(h, now);
    for (int i = 0; i < h->n_conns; i++) {
        hub_conn *hc = h->conns[i];
        if (hc->dead) continue;
        if (hc->role == ROLE_HANDSHAKE && now - hc->opened_s > h->o.timeout_s) {
            unproven_log(h, "rejected %s: no authentication within %.1f s", hc->c.peer, h->o.timeout_s);
            hc->dead = true;
        } else if (hc->role == ROLE_CLOSING && (now > hc->closing_deadline_s || (!hc->linger && !hc->c.out_head))) {
            hc->dead = true;
        }
    }
    bool hold = round_held(h, now);
    for (int id = 0; id < WIRE_MAX_REPLICAS; id++) {
        replica *r = rep(h, id);
        if (r->state == R_FREE) continue;
        double silent = now - r->control->c.last_rx_s;
        if (silent > h->o.timeout_s) {
            char why[96];
            snprintf(why, sizeof why, "silent for %.1f s (no heartbeat)", silent);
            lose_replica(h, id, why);
            continue;
        }
        // A receiver that takes nothing of the mean (or of a state) for timeout_s: the reduction
        // waits on its backlog (and a donor on a joiner's), so it would hold everyone.
        uint64_t backlog = backlog_bytes(r), tx = 0;
        for (int s = 1; s <= r->streams; s++)
            if (r->data[s]) tx += r->data[s]->c.bytes_tx;
        if (backlog == 0 || tx != r->down_tx_seen) {
            r->down_tx_seen = tx;
            r->down_progress_s = now;
        } else if (now - r->down_progress_s > h->o.timeout_s) {
            char why[160], b[32];
            snprintf(why, sizeof why, "its data streams took nothing of what the hub sends it for %.1f s (%s waiting)",
                     now - r->down_progress_s, format_bytes(backlog, b, sizeof b));
            lose_replica(h, id, why);
            continue;
        }
        if (now >= r->next_heartbeat_s) {
            uint8_t hb[WIRE_HEARTBEAT_BYTES];
            send_control(h, r, WIRE_HEARTBEAT, hb, wire_encode_heartbeat(hold ? HEARTBEAT_HOLD : 0, hb));
            r->next_heartbeat_s = now + h->heartbeat_s;
        }
    }
    int sessions = 0;
    for (int id = 0; id < WIRE_MAX_REPLICAS; id++) sessions += h->reps[id].state != R_FREE;
    atomic_store(&h->sessions, sessions);
    // A catch-up donor whose state is whole waits for its next landing to send a mean: not stalled.
    if (h->donor >= 0 && h->catchup && transfer_whole(&h->st) && !again_pending(h) && !h->patch.started)
        h->donor_progress_s = now;
    if (h->donor >= 0) {
        bool paused = false;
        for (int s = 1; s <= rep(h, h->donor)->streams; s++)
            if (rep(h, h->donor)->data[s]) paused |= donor_paused(h, rep(h, h->donor)->data[s]);
        if (paused) h->donor_progress_s = now;
        else if (now - h->donor_progress_s > (h->st.announced ? h->o.timeout_s : h->donor_grace_s))
            abort_transfer(h, "the donor sent nothing for a timeout", false);
    }
    if (h->donor >= 0 && !h->catchup && h->o.max_hold_s > 0 && now - h->transfer_began_s > h->o.max_hold_s)
        cut_transfer(h);
    for (int id = 0; id < WIRE_MAX_REPLICAS; id++)
        if (h->reps[id].state_draining && backlog_bytes(&h->reps[id]) == 0) state_drained(h, id);
    if (h->dying_for >= 0 && now > h->dying_deadline_s) die_now(h, "no DONE within timeout_s");
    check_round(h);
    settle_group(h);
}

// ---------------------------------------------------------------- the loop
// accept failed for want of descriptors or memory: the connection waiting is refused (closed at
// once, through the reserve descriptor), or, without a reserve, the listener rests 0.25 s. One
// line per 10 s says so.
static void out_of_descriptors(relay *h, int err) {
    double now = wall_seconds();
    char peer[96] = "";
    bool refused = false;
    if (h->reserve_fd >= 0) {
        close(h->reserve_fd);
        h->reserve_fd = -1;
        int fd = net_accept(h->listen_fd, peer, sizeof peer);
        if (fd >= 0) {
            close(fd);
            refused = true;
        }
        h->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (!refused || h->reserve_fd < 0) h->listen_paused_until_s = now + 0.25;
    h->fd_refused += refused;
    if (now - h->fd_warned_s < 10.0) return;
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    hub_log(h, "out of file descriptors (accept: %s; %d connections open, open-file limit %llu): new connections "
               "are refused%s%s (%llu so far) until some close; raise the limit (ulimit -n, or the hard limit: "
               "ulimit -Hn) for M replicas × (1 + diloco_streams) connections",
            strerror(err), h->n_conns, (unsigned long long)rl.rlim_cur, refused ? ", the last from " : "",
            refused ? peer : "", (unsigned long long)h->fd_refused);
    h->fd_warned_s = now;
}

// Takes the connections waiting, at most ACCEPTS_PER_LOOP: a flood of connections (no secret
// needed) kept the loop here, no frame read and no heartbeat sent, until the members were
// dropped as silent; and the connections it cut as the oldest in the handshake, swept only
// after the loop, counted toward MAX_CONNS ("too many connections" with ~130 live).
static void accept_all(relay *h) {
    for (int accepted = 0; accepted < ACCEPTS_PER_LOOP; accepted++) {
        char peer[96];
        int fd = net_accept(h->listen_fd, peer, sizeof peer);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED) continue;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) out_of_descriptors(h, err);
            else if (err != EAGAIN && err != EWOULDBLOCK) h->listen_paused_until_s = wall_seconds() + 0.25;
            return;
        }
        // At most MAX_HANDSHAKES in the handshake: a new connection takes the place of the oldest.
        // Connections that never speak (no secret needed) then cannot keep a replica out for
        // timeout_s: a replica's handshake takes a round trip, and only a flood of
        // MAX_HANDSHAKES connections within it pushes it out.
        int handshakes = 0, live = 0;
        hub_conn *oldest = NULL;
        for (int i = 0; i < h->n_conns; i++) {
            hub_conn *hc = h->conns[i];
            if (hc->dead) continue;
            live++;
            if (hc->role != ROLE_HANDSHAKE) continue;
            handshakes++;
            if (!oldest || hc->opened_s < oldest->opened_s) oldest = hc;
        }
        if (live >= MAX_CONNS) {
            unproven_log(h, "rejected %s: too many connections (%d, %d in the handshake)", peer, live, handshakes);
            close(fd);
            continue;
        }
        if (handshakes >= MAX_HANDSHAKES && oldest) {
            unproven_log(h, "cut off %s: not authenticated after %.1f s, the oldest of %d connections in the handshake "
                       "(%s takes its place)",
                    oldest->c.peer, wall_seconds() - oldest->opened_s, handshakes, peer);
            oldest->dead = true;
        }
        hub_conn *hc = add_conn(h, fd, peer);
        hc->c.allowed_rx = CONN_ALLOW(WIRE_AUTH);
        wire_hello hello = {.timeout_ms = (uint32_t)(h->o.timeout_s * 1000 + 0.5)};
        if (RAND_bytes(hello.nonce_h, WIRE_NONCE_BYTES) != 1) fail("relay: OpenSSL RAND_bytes failed");
        memcpy(hc->nonce_h, hello.nonce_h, WIRE_NONCE_BYTES);
        uint8_t buf[WIRE_HELLO_BYTES];
        conn_send(&hc->c, WIRE_HELLO, buf, wire_encode_hello(&hello, buf), NULL, 0, NULL);
    }
}

// The donor's data streams are not read while a joiner's backlog is over the bound.
static bool donor_paused(relay *h, const hub_conn *hc) {
    if (hc->role != ROLE_DATA || hc->replica != h->donor) return false;
    for (int i = 0; i < WIRE_MAX_REPLICAS; i++)
        if (receives_state(&h->reps[i]) && backlog_bytes(&h->reps[i]) > STATE_BACKLOG_BYTES) return true;
    return false;
}

static bool stopping(relay *h) { return atomic_load(&h->stop) || (h->stop_signal && *h->stop_signal); }

static void run_loop(relay *h) {
    struct pollfd *fds = NULL;
    int cap = 0;
    while (!stopping(h)) {
        for (int id = 0; id < WIRE_MAX_REPLICAS; id++)
            if (h->reps[id].state != R_FREE) feed_streams(rep(h, id));
        int n = h->n_conns + 2;
        if (n > cap) {
            cap = n * 2;
            fds = xrealloc(fds, (size_t)cap * sizeof *fds);
        }
        // A negative fd is skipped by poll: the listener rests (out of descriptors).
        bool listening = wall_seconds() >= h->listen_paused_until_s;
        fds[0] = (struct pollfd){.fd = listening ? h->listen_fd : -1, .events = POLLIN};
        fds[1] = (struct pollfd){.fd = h->wake[0], .events = POLLIN};
        for (int i = 0; i < h->n_conns; i++) {
            hub_conn *hc = h->conns[i];
            short ev = 0;
            bool paused = donor_paused(h, hc) || contributor_paused(h, hc);
            if (paused && held_back(h, hc) && rep(h, hc->replica)->up.started)
                rep(h, hc->replica)->up.last_progress_s = wall_seconds();   // held back by us, not stalled
            if (hc->role != ROLE_CLOSING && !paused) ev |= POLLIN;
            if (hc->c.out_head) ev |= POLLOUT;
            fds[i + 2] = (struct pollfd){.fd = hc->c.fd, .events = ev};
        }
        int timeout_ms = (int)(h->heartbeat_s * 250);
        if (timeout_ms < 10) timeout_ms = 10;
        if (timeout_ms > 100) timeout_ms = 100;
        int ready = poll(fds, (nfds_t)n, timeout_ms);
        if (ready < 0 && errno != EINTR) fail("relay: poll: %s", strerror(errno));
        if (ready > 0) {
            if (fds[1].revents) {
                char drain[64];
                while (read(h->wake[0], drain, sizeof drain) > 0) {
                }
            }
            int existing = h->n_conns;   // accept_all appends: those are polled next time
            for (int i = 0; i < existing; i++) {
                hub_conn *hc = h->conns[i];
                short re = fds[i + 2].revents;
                if (!hc->dead && (re & (POLLIN | POLLHUP | POLLERR))) read_conn(h, hc);
                if (!hc->dead && (re & POLLOUT)) write_conn(h, hc);
            }
            if (listening && (fds[0].revents & POLLIN)) accept_all(h);
        }
        // New frames were queued while reading: send what the sockets take now.
        for (int id = 0; id < WIRE_MAX_REPLICAS; id++)
            if (h->reps[id].state != R_FREE) feed_streams(rep(h, id));
        for (int i = 0; i < h->n_conns; i++) write_conn(h, h->conns[i]);
        housekeeping(h);
        sweep_conns(h);
    }
    free(fds);
    if (h->unproven_quiet) unproven_window(h, wall_seconds());   // the count of the window cut short
}

// ---------------------------------------------------------------- start and stop
static relay *relay_create(const relay_options *o, char *err, size_t err_bytes) {
    wire_init();
    if (o->timeout_s <= 0) {
        snprintf(err, err_bytes, "relay: timeout_s must be positive");
        return NULL;
    }
    if (!o->secret || o->secret_bytes == 0) {
        snprintf(err, err_bytes, "relay: no secret");
        return NULL;
    }
    char why[256] = "";
    int fd = net_listen(o->listen, why, sizeof why);
    if (fd < 0) {
        snprintf(err, err_bytes, "relay: %s", why);
        return NULL;
    }
    relay *h = xcalloc(1, sizeof *h);
    h->o = *o;
    h->secret = xmalloc(o->secret_bytes);
    memcpy(h->secret, o->secret, o->secret_bytes);
    h->o.secret = h->secret;
    if (h->o.min_replicas < 1) h->o.min_replicas = 1;
    h->log = o->log ? o->log : stdout;
    h->t0 = wall_seconds();
    h->unproven_window_s = h->t0;
    h->heartbeat_s = o->timeout_s / 4 < 2.0 ? o->timeout_s / 4 : 2.0;
    h->listen_fd = fd;
    h->port = net_local_port(fd);
    h->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    h->fd_warned_s = -1e9;
    h->donor = -1;
    h->follow_from = -1;
    h->last_closed_step = -1;
    h->completed_step = -1;
    h->dying_for = -1;
    h->finished_by = -1;
    h->first_began_s = -1;
    if (pipe2(h->wake, O_NONBLOCK | O_CLOEXEC) != 0) fail("relay: pipe: %s", strerror(errno));
    atomic_init(&h->stop, false);
    atomic_init(&h->sessions, 0);
    return h;
}

static void relay_destroy(relay *h) {
    for (int id = 0; id < WIRE_MAX_REPLICAS; id++) {
        drop_queue(rep(h, id));
        release_contribution(rep(h, id));
        contribution_reset(&h->contrib[id]);
    }
    free(h->scratch);
    free_residual(h);
    clear_transfer(h);   // the state's, the mean's and the second pass's chunks; every replica's lacks
    for (int i = 0; i < h->n_conns; i++) h->conns[i]->dead = true;
    sweep_conns(h);
    free(h->conns);
    close(h->listen_fd);
    if (h->reserve_fd >= 0) close(h->reserve_fd);
    close(h->wake[0]);
    close(h->wake[1]);
    memset(h->secret, 0, h->o.secret_bytes);
    free(h->secret);
    free(h);
}

// The hub's arithmetic runs on its own thread only: an OpenMP team per segment costs more than
// it saves on a busy login node, and inside a replica (diloco_serve) it would take the cores
// the training uses.
static void one_thread(void) {
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
}

static void *relay_thread(void *arg) {
    one_thread();
    run_loop(arg);
    return NULL;
}

static void raise_open_file_limit(relay *h, int shards);

relay *relay_start_thread(const relay_options *o, char *err, size_t err_bytes) {
    relay *h = relay_create(o, err, err_bytes);
    if (!h) return NULL;
    // A hub served by a replica (diloco_serve) too, not only `train_gpt relay`'s (a no-op there,
    // whose start raised it for every shard).
    raise_open_file_limit(h, 1);
    hub_log(h, "listening on %s (port %d), timeout %.1f s, min_replicas %d", o->listen, h->port, h->o.timeout_s,
            h->o.min_replicas);
    int rc = pthread_create(&h->thread, NULL, relay_thread, h);
    if (rc != 0) fail("relay: pthread_create: %s", strerror(rc));
    return h;
}

int relay_port(const relay *r) { return r->port; }

bool relay_wait_until_empty(relay *r, double max_wait_s) {
    double deadline = wall_seconds() + max_wait_s;
    // The count is refreshed every loop iteration (at most 100 ms apart).
    for (;;) {
        if (atomic_load(&r->sessions) == 0) return true;
        if (wall_seconds() >= deadline) return false;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void relay_stop(relay *r) {
    if (!r) return;
    atomic_store(&r->stop, true);
    ssize_t ignored = write(r->wake[1], "x", 1);
    (void)ignored;
    pthread_join(r->thread, NULL);
    relay_destroy(r);
}

// ---------------------------------------------------------------- train_gpt relay
static volatile sig_atomic_t relay_signalled = 0;
static int relay_wake_fd = -1;

static void on_stop_signal(int sig) {
    (void)sig;
    relay_signalled = 1;
    if (relay_wake_fd >= 0) {
        ssize_t ignored = write(relay_wake_fd, "x", 1);
        (void)ignored;
    }
}

static const char relay_usage[] =
    "usage: train_gpt relay --listen HOST:PORT --secret_file PATH [--timeout_s 60] [--min_replicas 1]\n"
    "                       [--replicas M] [--shards N] [--max_hold_s S] [--catch_up 0|1] [--join_in_flight 0|1]\n"
    "Runs the hub the replicas of a DiLoCo run meet at (diloco_transport = tcp), until SIGINT or SIGTERM.\n"
    "  --listen        address to listen on: HOST:PORT, *:PORT (every address), [v6addr]:PORT\n"
    "  --secret_file   the run's diloco_secret_file (the same bytes every replica reads)\n"
    "  --timeout_s     a replica silent this long is dropped; a round closes this long after its first\n"
    "                  contribution (use the replicas' diloco_timeout_s)\n"
    "  --min_replicas  a round with fewer contributors is skipped by everyone\n"
    "  --replicas      refuse replica ids >= M (default: any id below 256)\n"
    "  --shards        replicas of N ranks each (fsdp_size N): N independent hubs on ports PORT .. PORT+N-1,\n"
    "                  hub j for rank j of every replica (open all N ports in the firewall)\n"
    "  --max_hold_s    the longest a state transfer may hold the group's round (a replica that joins a big\n"
    "                  model over a slow link); then it is cut: the joiners wait, the group goes on.\n"
    "                  0 (the default): as long as it moves\n"
    "  --catch_up      1 (the default): a joiner's state transfer does not hold the rounds: the donor sends its state, then\n"
    "                  the mean of every round it lands meanwhile, and the joiner applies them before it trains\n"
    "                  (with several hubs in the replicas' diloco_rendezvous, through the joiner's primary; every\n"
    "                  relay of the list should run the same value). 0: the round waits for the transfer\n"
    "  --join_in_flight 1 (the default; with --catch_up 1): a replica that comes while a transfer's state is on its\n"
    "                  way joins it, and its donor sends the chunks it missed again after the rest. 0: it waits for\n"
    "                  the next transfer (the donor then keeps less of its state aside while it sends)\n"
    "One line per event on stdout: connections, joins, evictions, rounds, state transfers, rejected peers.\n"
    "Protocol: docs/protocol.md.\n";

// A plain decimal number (digits, one point, an exponent): strtod's hex, inf and nan are not
// what a user means (--timeout_s 0x10 was 16 s).
static double parse_number(const char *name, const char *value, double lo, double hi) {
    char *end = NULL;
    double v = strtod(value, &end);
    if (!*value || *end || !plain_decimal(value) || !(v >= lo && v <= hi))
        fail("relay: --%s %s: expected a number from %g to %g", name, value, lo, hi);
    return v;
}

// A whole number, digits only (--replicas 2.5 was 2, --catch_up 0.5 was on).
static int parse_integer(const char *name, const char *value, int lo, int hi) {
    char *end = NULL;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (!*value || !plain_decimal(value) || errno || *end || v < lo || v > hi)
        fail("relay: --%s %s: expected a whole number from %d to %d", name, value, lo, hi);
    return (int)v;
}

// --shards N: hubs 1 .. N−1 on ports PORT+1 .. PORT+N−1, each a thread of its own (hub 0 runs
// in the foreground); NULL-terminated, and *names holds their log prefixes.
static relay **start_shard_hubs(const relay_options *o, int shards, char ***names) {
    char host[256], port_s[16], err[400];
    if (!net_split_host_port(o->listen, host, sizeof host, port_s, sizeof port_s, err, sizeof err))
        fail("relay: --listen %s: %s", o->listen, err);
    long port = strtol(port_s, NULL, 10);
    if (port <= 0 || port + shards - 1 > 65535)
        fail("relay: --shards %d needs a fixed --listen port with %d ports free above it (rank j's hub is on port + j)",
             shards, shards - 1);
    relay **hubs = xcalloc((size_t)shards, sizeof *hubs);
    *names = xcalloc((size_t)shards, sizeof **names);
    for (int j = 1; j < shards; j++) {
        char listen[300], name[32];
        snprintf(listen, sizeof listen, "%s%s%s:%ld", strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
                 port + j);
        snprintf(name, sizeof name, "relay shard %d", j);
        (*names)[j] = xstrdup(name);
        relay_options oj = *o;
        oj.listen = listen;
        oj.name = (*names)[j];
        hubs[j - 1] = relay_start_thread(&oj, err, sizeof err);
        if (!hubs[j - 1]) fail("relay: shard %d: %s", j, err);
    }
    return hubs;
}

// Every connection is a descriptor: the soft limit (often 1024) goes up to what a hub may hold
// (MAX_CONNS per shard), within the hard one, and the start-up says so, or that the hard limit is
// lower (then accept fails with EMFILE and out_of_descriptors refuses the excess).
static void raise_open_file_limit(relay *h, int shards) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t need = (rlim_t)shards * (MAX_CONNS + 16) + 64, was = rl.rlim_cur;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        if (rl.rlim_cur > was && setrlimit(RLIMIT_NOFILE, &rl) == 0)
            hub_log(h, "open files: soft limit raised from %llu to %llu (RLIMIT_NOFILE; a hub holds up to %d "
                       "connections)",
                    (unsigned long long)was, (unsigned long long)rl.rlim_cur, MAX_CONNS);
        else rl.rlim_cur = was;
    }
    if (rl.rlim_cur < need)
        hub_log(h, "open files: the limit is %llu (hard %llu): about %llu connections in all, each replica takes 1 + "
                   "diloco_streams per shard; raise it (ulimit -Hn) for more",
                (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                (unsigned long long)(rl.rlim_cur > (rlim_t)(16 * shards) ? rl.rlim_cur - 16 * shards : 0));
}

int relay_main(int argc, char **argv) {
    relay_options o = {.timeout_s = 60, .min_replicas = 1, .catch_up = true, .join_in_flight = true};
    const char *secret_path = NULL;
    int shards = 1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(relay_usage, stdout);
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0) fail("relay: unexpected argument '%s' (see train_gpt relay --help)", arg);
        char name[64];
        const char *value;
        const char *eq = strchr(arg + 2, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg - 2), arg + 2);
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg + 2);
            if (i + 1 >= argc) fail("relay: --%s needs a value", name);
            value = argv[++i];
        }
        if (strcmp(name, "listen") == 0) o.listen = value;
        else if (strcmp(name, "secret_file") == 0) secret_path = value;
        else if (strcmp(name, "timeout_s") == 0) o.timeout_s = parse_number(name, value, 0.1, 1e6);
        else if (strcmp(name, "min_replicas") == 0) o.min_replicas = parse_integer(name, value, 1, 256);
        else if (strcmp(name, "replicas") == 0) o.replicas = parse_integer(name, value, 1, 256);
        else if (strcmp(name, "shards") == 0) shards = parse_integer(name, value, 1, 1024);
        else if (strcmp(name, "max_hold_s") == 0) o.max_hold_s = parse_number(name, value, 0, 1e9);
        else if (strcmp(name, "catch_up") == 0) o.catch_up = parse_integer(name, value, 0, 1) != 0;
        else if (strcmp(name, "join_in_flight") == 0) o.join_in_flight = parse_integer(name, value, 0, 1) != 0;
        else fail("relay: unknown option --%s (see train_gpt relay --help)", name);
    }
    if (!o.listen) fail("relay: --listen HOST:PORT is required (see train_gpt relay --help)");
    if (o.replicas > 0 && o.min_replicas > o.replicas)  // a quorum no group can reach: every join would wait
        fail("relay: --min_replicas %d is more than --replicas %d", o.min_replicas, o.replicas);
    if (!secret_path) fail("relay: --secret_file PATH is required: the run's diloco_secret_file");
    uint8_t *secret = read_secret_file(secret_path, "relay: --secret_file", &o.secret_bytes);
    o.secret = secret;
    o.log = stdout;
    if (shards > 1) o.name = "relay shard 0";
    char err[320];
    relay *h = relay_create(&o, err, sizeof err);
    char **names = NULL;
    relay **others = h && shards > 1 ? start_shard_hubs(&o, shards, &names) : NULL;
    memset(secret, 0, o.secret_bytes);
    free(secret);
    if (!h) fail("%s", err);
    relay_wake_fd = h->wake[1];
    h->stop_signal = &relay_signalled;
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    hub_log(h, "listening on %s (port %d), timeout %.1f s, min_replicas %d%s", o.listen, h->port, h->o.timeout_s,
            h->o.min_replicas, o.replicas ? "" : ", any replica id");
    raise_open_file_limit(h, shards);
    one_thread();
    run_loop(h);
    hub_log(h, "stopping (signal)");
    relay_wake_fd = -1;
    for (int j = 0; others && j < shards - 1; j++) relay_stop(others[j]);
    for (int j = 0; names && j < shards; j++) free(names[j]);
    free(names);
    free(others);
    relay_destroy(h);
    return 0;
}
