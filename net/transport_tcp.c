// net/transport_tcp.c — the tcp transport of net/transport.h: a replica's side of the hub protocol
// (docs/protocol.md; the hub is net/relay.c).
//
// A replica holds one control connection and `streams` data connections to the hub, all
// authenticated at the handshake. Two threads use them:
//   - the I/O thread owns the reading of the control connection and sends a heartbeat
//     every heartbeat interval, so that the hub can tell a replica deep in a long inner
//     phase from a dead or stopped one, and the replica can tell a dead hub from a quiet
//     one. The frames it reads (ROUND, EVICTED, JOINED, STATE, STATE_ABORT) go into a
//     mailbox, and a byte on a pipe wakes the training thread.
//   - the caller's thread, inside join/exchange/send_state, pumps the data connections
//     (non-blocking, one poll() loop; one call at a time: the training thread, or the thread
//     diloco.c runs an overlapping exchange or a donor's state send on): uploads its payload segment by segment (one chunk
//     each) to whichever stream has room, and reads the segments of the mean the hub sends
//     back, which it places by offset (they are self-describing, so their order across
//     streams is free).
// The hub reduces segment c once every contributor's segment c is in, and sends the
// encoded mean of it to every contributor: so the mean arrives while this replica is still
// uploading, into one buffer of one payload's size whatever the number of replicas. ROUND
// then names the contributions that are whole.
//
// Losing the hub (connection closed, a bad frame, no heartbeat for timeout_s) is never fatal
// by itself: the next call reconnects, and since the hub dropped this replica, the
// exchange reports `evicted` and the replica rejoins. Only what the replica's own
// configuration causes is fatal (a refused secret, a different run_fingerprint, an id out
// of range, a hub that cannot prove the secret).
#include "net/transport_impl.h"
#include "net/transport_tcp_hub.h"

#include "llmc/comm.h"
#include "llmc/common.h"
#include "llmc/quant.h"
#include "net/conn.h"
#include "llmc/fault.h"
#include "llmc/watchdog.h"
#include "net/socket.h"
#include "net/relay.h"
#include "net/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_BYTES (1u << 20)   // chunks of a state (a payload's chunks are its segments)
#define STREAM_DEPTH_FRAMES 2   // chunks handed to one data connection at a time

typedef struct msg {
    struct msg *next;
    unsigned type;
    size_t bytes;
    uint8_t payload[];
} msg;

// A catch-up donor's bytes of its state kept as they were before a landing changed them.
typedef struct overlay {
    struct overlay *next;
    uint64_t offset, bytes;
    uint8_t *kept;
} overlay;

// A landed round's mean and settings a catch-up donor sends after its state.
typedef struct catchup_out {
    struct catchup_out *next;
    int64_t round;
    blob *b;
    size_t n;
} catchup_out;

// One a joiner receives (bytes NULL once handed to transport_options.catchup_sink).
typedef struct {
    int64_t round;
    uint8_t *bytes;
    uint64_t total, received;
} catchup_in;

struct tcp {
    transport_options o;
    uint8_t *secret;
    char hub[300];                  // the address we connect to
    bool multi_hub;                 // one hub of several: round ids are 64·k + 8·attempt + share
    int hub_index, hubs;            // this hub's place in diloco_rendezvous, and how many it lists
    bool quiet;                     // connect_session does not say it waits (a background retry)
    bool had_session;               // a session with this hub was ever up (connect_session)
    double refused_since;           // the first of the refusals since then, none in between (handshake; 0: none)
    int refusals;                   // how many
    bool not_a_hub;                 // the last try's answer was no train_gpt hub's HELLO (connect_session)
    relay *served;
    // the session
    bool connected, member;
    double hub_timeout_s, heartbeat_s;
    int64_t full_rounds;       // rounds that every replica contributed to (a test hook counts them)
    conn ctl;
    pthread_mutex_t ctl_send;       // serialises sends on ctl (training thread, I/O thread)
    conn data[WIRE_MAX_STREAMS];
    // the I/O thread
    pthread_t io;
    bool io_running;
    atomic_bool io_stop;
    int to_io[2];                   // wakes the I/O thread (stop)
    int to_main[2];                 // wakes the training thread (mailbox)
    pthread_mutex_t mailbox_lock;
    msg *mail_head, *mail_tail;
    bool dead;                      // under mailbox_lock
    char dead_why[1024];
    uint32_t refused_code;          // the REFUSE that ended the session (0: none; the I/O thread's until joined)
    bool foreign_chunk;             // test hook tcp_foreign_chunk
    int protocol_drops;             // sessions in a row the hub ended with REFUSE_PROTOCOL, no round completed between
    double hub_held_s;              // under mailbox_lock: the last HEARTBEAT_HOLD (the hub holds
                                    // the round for a state transfer: an upload held back is not stuck)
    // what the training thread learnt from the mailbox
    int64_t cur_step;
    bool have_round, evicted;
    bool no_work;                   // this round's contribution has tokens 0: ROUND does not name it
    wire_round round;
    char evicted_why[WIRE_MAX_TEXT_BYTES + 1];
    uint32_t joined;                // JOINED_MEMBER / JOINED_WAIT / 0
    bool join_waited;               // since the caller's join began (tcp_join, hubs_join): the hub said
                                    // JOINED(wait), or a state began to come (transport_join_waited)
    int64_t joined_step;            // its group_step (answering FOLLOW: the round we are expected from)
    // the mean of the round in progress, and an incoming state
    uint8_t *mean;
    size_t mean_cap;
    uint64_t mean_total, mean_received;
    bool want_state;
    uint8_t *state_buf;
    size_t state_cap;
    bool state_started;
    int64_t state_step;
    uint64_t state_total, state_received;
    // the upload in progress
    const uint8_t *job_buf;
    uint64_t job_total, job_next;
    uint64_t job_end;               // stop feeding here (job_total, but for a test hook)
    uint32_t job_chunk;
    int64_t job_step;
    unsigned job_kind;
    double job_progress_s;
    double job_slow_s;              // test hook tcp_slow_state: one chunk per this many seconds
    bool blackholed;                // test hook tcp_blackhole: done (once a process)
    bool state_cut;                 // the hub ended the transfer this replica is to donate before it began
    double job_next_chunk_s;
    const state_hooks *job_hooks;   // a state's (transport_send_state)
    double join_sent_s, join_said_s;  // a JOIN without an answer yet: when sent, when last said so
    // A state on its way in or out: when it began (its progress is said every hub timeout), and
    // when a long wait (a state, or a round the hub holds for one) was last said.
    double state_began_s, job_began_s, wait_said_s, hold_began_s;
    uint8_t *own;
    size_t own_cap;
    // One pump at a time (the calls below take it): the training or exchange thread, or a
    // catch-up donor's sender, which pumps in slices beside them; whichever pumps moves both.
    pthread_mutex_t pump_lock;
    atomic_int pump_wanted;         // callers waiting for the pump: the sender lets them have it
    uint64_t session_serial;        // counts the sessions (a catch-up sender of an old one ends)
    bool payload_open;              // an exchange's payload is not all written: the state waits
    // A catch-up transfer, the donor's side (docs/protocol.md "Catch-up"): the state's chunks in
    // the order 1 .. n − 1, 0, each copied as it is queued (with the overlays), then the means of
    // the rounds it lands, until STATE_END or STATE_ABORT (cu_over).
    bool send_catchup;              // the last ROUND asked this donor for a catch-up transfer
    bool cu_active, cu_over;
    const uint8_t *cu_buf;
    uint64_t cu_total, cu_chunks, cu_queued;
    uint32_t cu_chunk;              // CHUNK_BYTES (an eighth with the test hook tcp_slow_state)
    double cu_slow_s, cu_next_chunk_s;   // tcp_slow_state: one state chunk per cu_slow_s
    double cu_slow_means_s;         // tcp_slow_means: one chunk of the means per this many seconds
    int64_t cu_step;
    int64_t designated_step;        // the round whose ROUND made this replica a donor (take_round)
    // STATE_AGAIN: the hub has said which of the first chunks to send again after the first pass
    // (chunks 1 .. cu_again − 1, for replicas that joined the transfer in flight); until then a
    // landing's change is kept for every chunk, sent or not. cu_again_next: the next to queue.
    bool cu_again_known;
    uint64_t cu_again, cu_again_next;
    int64_t cu_again_early;         // STATE_AGAIN before the sending began (relay --join_in_flight 0:
                                    // right after the designation), -1: none

    double cu_began_s;
    const state_hooks *cu_hooks;
    overlay *cu_overlays;
    catchup_out *cu_out_head, *cu_out_tail;
    uint64_t cu_out_next;           // the first mean's next byte to queue
    // The joiner's side: the state is a catch-up one (STATE's flag), CAUGHT_UP sent, the round of
    // STATE_END, and the means received.
    bool state_announced, state_catchup, caught_up_sent, state_end_known;
    int64_t state_end_round;
    // transport_options.defer_caught_up: the join returned with a whole catch-up state and has not
    // said CAUGHT_UP yet (its means are still taken); catchup_aborted: the hub ended that transfer
    // meanwhile (the caller joins again).
    bool caught_up_deferred, catchup_aborted;
    int means_while_deferred;       // means whole during transport_poll while caught_up_deferred
    catchup_in *patches;
    int n_patches, cap_patches;
    int handed;                     // means handed to the sink since the state began (hand_catchup):
                                    // the n_patches − handed others are held (bytes not NULL)
    uint64_t held_bytes;            // their bytes
    int held_max;                   // the most held at once since the state began, and their
    uint64_t held_max_bytes;        // bytes then
};
typedef struct tcp tcp;

// ---------------------------------------------------------------- small helpers
static void random_bytes(uint8_t *p, size_t n) {
    if (RAND_bytes(p, (int)n) != 1) fail("tcp transport: OpenSSL RAND_bytes failed");
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void wake(int fd) {
    ssize_t ignored = write(fd, "x", 1);
    (void)ignored;
}

static void drain(int fd) {
    char buf[64];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

// Bytes moved on the data streams, plus (sent) the control connection's, whose sends the
// I/O thread shares.
static uint64_t bytes_moved(tcp *t, bool sent) {
    uint64_t b = 0;
    for (int s = 0; s < t->o.streams; s++) b += sent ? t->data[s].bytes_tx : t->data[s].bytes_rx;
    if (sent) {
        pthread_mutex_lock(&t->ctl_send);
        b += t->ctl.bytes_tx;
        pthread_mutex_unlock(&t->ctl_send);
    }
    return b;
}

// What a replica's log calls an exchange: "outer step 12", numbered as diloco.c numbers it
// (k + 1 for round k, as one hub's transport is given it: it said "outer step 11" where diloco.c's
// next line said 12 of the same exchange), or with several hubs, where the round id is
// 64·k + 8·attempt + share, "share 1 of outer step 12 (attempt 0; round 705 at this hub)".
static const char *exchange_name(const tcp *t, int64_t round, char *buf, size_t bytes) {
    if (t->multi_hub)
        snprintf(buf, bytes, "share %lld of outer step %lld (attempt %lld; round %lld at this hub)",
                 (long long)(round % 8), (long long)(round / 64 + 1), (long long)(round % 64 / 8), (long long)round);
    else snprintf(buf, bytes, "outer step %lld (round %lld)", (long long)round + 1, (long long)round);
    return buf;
}

// ---------------------------------------------------------------- the I/O thread
static void post_dead(tcp *t, const char *why) {
    pthread_mutex_lock(&t->mailbox_lock);
    if (!t->dead) {
        t->dead = true;
        snprintf(t->dead_why, sizeof t->dead_why, "%s", why);
    }
    pthread_mutex_unlock(&t->mailbox_lock);
    wake(t->to_main[1]);
}

static void post_frame(tcp *t, const wire_frame *f) {
    msg *m = xmalloc(sizeof *m + (size_t)f->payload_bytes);
    m->next = NULL;
    m->type = f->type;
    m->bytes = (size_t)f->payload_bytes;
    memcpy(m->payload, f->payload, m->bytes);
    pthread_mutex_lock(&t->mailbox_lock);
    if (t->mail_tail) t->mail_tail->next = m;
    else t->mail_head = m;
    t->mail_tail = m;
    pthread_mutex_unlock(&t->mailbox_lock);
    wake(t->to_main[1]);
}

static bool send_control(tcp *t, unsigned type, const uint8_t *payload, size_t bytes, char *err, size_t err_bytes) {
    pthread_mutex_lock(&t->ctl_send);
    conn_send(&t->ctl, type, payload, bytes, NULL, 0, NULL);
    bool ok = conn_flush_until(&t->ctl, wall_seconds() + t->hub_timeout_s, err, err_bytes);
    pthread_mutex_unlock(&t->ctl_send);
    return ok;
}

static void *io_thread(void *arg) {
    tcp *t = arg;
    double next_heartbeat = wall_seconds();
    char err[256], why[1024];
    while (!atomic_load(&t->io_stop)) {
        double now = wall_seconds();
        if (now >= next_heartbeat) {
            if (!send_control(t, WIRE_HEARTBEAT, NULL, 0, err, sizeof err)) {
                snprintf(why, sizeof why, "heartbeat to the hub at %s failed: %s", t->hub, err);
                post_dead(t, why);
                return NULL;
            }
            next_heartbeat = now + t->heartbeat_s;
        }
        double silent = now - t->ctl.last_rx_s;
        if (silent > t->hub_timeout_s) {
            snprintf(why, sizeof why, "the hub at %s has been silent for %.1f s", t->hub, silent);
            post_dead(t, why);
            return NULL;
        }
        struct pollfd p[2] = {{.fd = t->ctl.fd, .events = POLLIN}, {.fd = t->to_io[0], .events = POLLIN}};
        int ms = (int)((next_heartbeat - now) * 1000) + 1;
        if (ms > 100) ms = 100;
        if (poll(p, 2, ms) < 0 && errno != EINTR) {
            snprintf(why, sizeof why, "poll: %s", strerror(errno));
            post_dead(t, why);
            return NULL;
        }
        if (p[1].revents) drain(t->to_io[0]);
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        for (;;) {
            wire_frame f;
            conn_result r = conn_read(&t->ctl, &f, err, sizeof err);
            if (r == CONN_AGAIN) break;
            if (r == CONN_FRAME && f.type == WIRE_HEARTBEAT) {
                uint32_t flags;
                const char *bad = wire_decode_heartbeat(f.payload, (size_t)f.payload_bytes, &flags);
                if (bad) {
                    snprintf(why, sizeof why, "the hub at %s: %s", t->hub, bad);
                    post_dead(t, why);
                    return NULL;
                }
                if (flags & HEARTBEAT_HOLD) {
                    pthread_mutex_lock(&t->mailbox_lock);
                    t->hub_held_s = wall_seconds();
                    pthread_mutex_unlock(&t->mailbox_lock);
                }
                continue;
            }
            if (r == CONN_FRAME && f.type == WIRE_REFUSE) {   // the hub ends the session, and says why
                wire_refuse rf;
                char text[WIRE_MAX_TEXT_BYTES + 1] = "";
                const char *bad = wire_decode_refuse(f.payload, (size_t)f.payload_bytes, &rf);
                if (!bad) wire_printable(rf.text, rf.text_bytes, text, sizeof text);
                t->refused_code = bad ? 0 : rf.code;
                snprintf(why, sizeof why, "the hub at %s dropped replica %d%s: %s", t->hub, t->o.replica_id,
                         t->refused_code == REFUSE_PROTOCOL ? " for breaking the protocol" : "", bad ? bad : text);
                post_dead(t, why);
                return NULL;
            }
            if (r == CONN_FRAME) {
                post_frame(t, &f);
                continue;
            }
            if (r == CONN_CLOSED) snprintf(why, sizeof why, "the hub at %s closed the connection", t->hub);
            else snprintf(why, sizeof why, "the hub at %s: %s", t->hub, err);
            post_dead(t, why);
            return NULL;
        }
    }
    return NULL;
}

// ---------------------------------------------------------------- connecting
typedef enum { HS_OK, HS_RETRY, HS_DUPLICATE, HS_NOT_HUB } handshake_result;

// An answer that says this replica's own configuration is wrong (a REFUSE for its secret,
// fingerprint, id or hub order; a WELCOME whose proof is not of our secret). At start it ends
// the run: the user's error, said at once. Once this replica has had a session with the hub it
// is a lost hub until it lasts: those answers carry no proof (a REFUSE cannot: the hub that
// sends it does not share our secret, or has not yet checked it), so anything listening on the
// hub's port while the relay restarts (any local user of a shared login node, or a machine on
// the path) could otherwise end every replica of the run with one frame. Fatal when every
// try has been refused for diloco_connect_timeout_s, three tries at least: a relay really
// restarted with another secret or run, said as at start.
static handshake_result refused(tcp *t, const char *what, char *err, size_t err_bytes) {
    if (!t->had_session) fail("%s", what);
    double now = wall_seconds();
    if (t->refusals++ == 0) t->refused_since = now;
    if (t->refusals >= 3 && now - t->refused_since >= t->o.connect_timeout_s)
        fail("%s (every answer for %.0f s, %d tries, since this replica's last session with it)", what,
             now - t->refused_since, t->refusals);
    if (t->refusals == 1)
        warn("diloco: %s; taken for a lost hub until it lasts diloco_connect_timeout_s = %g s (no proof comes "
             "with it: maybe not the relay but something else on its port while the relay restarts)",
             what, t->o.connect_timeout_s);
    snprintf(err, err_bytes, "taken for a lost hub: %.160s%s", what, strlen(what) > 160 ? "..." : "");
    return HS_RETRY;
}

// The handshake on one connection (docs/protocol.md). Errors of this replica's own
// configuration are fatal here; anything else asks for another try.
static handshake_result handshake(tcp *t, conn *c, int stream, uint64_t *session_id, char *err, size_t err_bytes) {
    double deadline = wall_seconds() + t->hub_timeout_s;
    wire_frame f;
    char why[256];
    c->allowed_rx = CONN_ALLOW(WIRE_HELLO);
    if (conn_read_until(c, &f, deadline, why, sizeof why) != CONN_FRAME) {
        snprintf(err, err_bytes, "no HELLO from the hub: %s", why);
        // Bytes that are no train_gpt frame, or a frame of another protocol version: something
        // else listens there (a wrong port), or a relay of another build.
        return c->rx_error == WIRE_BAD_MAGIC || c->rx_error == WIRE_BAD_VERSION ? HS_NOT_HUB : HS_RETRY;
    }
    wire_hello hello;
    const char *bad = wire_decode_hello(f.payload, (size_t)f.payload_bytes, &hello);
    if (bad) {   // something else listens there, or a hub of another protocol version
        snprintf(err, err_bytes, "%s", bad);
        return HS_NOT_HUB;
    }
    wire_auth a = {.replica_id = (uint32_t)t->o.replica_id, .stream_index = (uint16_t)stream,
                   .streams = (uint16_t)t->o.streams, .replicas = (uint32_t)t->o.replicas,
                   .min_replicas = (uint32_t)t->o.min_replicas, .run_fingerprint = t->o.run_fingerprint,
                   .session_id = stream ? *session_id : 0, .hub_index = (uint16_t)t->hub_index,
                   .hubs = (uint16_t)t->hubs};
    random_bytes(a.nonce_c, WIRE_NONCE_BYTES);
    uint8_t buf[WIRE_AUTH_BYTES];
    wire_encode_auth(&a, buf);
    wire_auth_proof(t->secret, t->o.secret_bytes, hello.nonce_h, buf, WIRE_AUTH_PROVEN_BYTES, a.proof);
    conn_send(c, WIRE_AUTH, buf, wire_encode_auth(&a, buf), NULL, 0, NULL);
    if (!conn_flush_until(c, deadline, why, sizeof why)) {
        snprintf(err, err_bytes, "sending AUTH: %s", why);
        return HS_RETRY;
    }
    c->allowed_rx = CONN_ALLOW(WIRE_WELCOME) | CONN_ALLOW(WIRE_REFUSE);
    if (conn_read_until(c, &f, deadline, why, sizeof why) != CONN_FRAME) {
        snprintf(err, err_bytes, "no answer to AUTH: %s", why);
        return HS_RETRY;
    }
    if (f.type == WIRE_REFUSE) {
        wire_refuse rf;
        char text[WIRE_MAX_TEXT_BYTES + 1] = "";
        if ((bad = wire_decode_refuse(f.payload, (size_t)f.payload_bytes, &rf))) {
            snprintf(err, err_bytes, "%s", bad);
            return HS_RETRY;
        }
        wire_printable(rf.text, rf.text_bytes, text, sizeof text);
        char what[WIRE_MAX_TEXT_BYTES + 600];
        switch (rf.code) {
        case REFUSE_SECRET:
            snprintf(what, sizeof what, "diloco_secret_file: the hub at %s refused our secret (the relay's "
                     "--secret_file and every replica's diloco_secret_file must hold the same bytes)", t->hub);
            return refused(t, what, err, err_bytes);
        case REFUSE_DUPLICATE: snprintf(err, err_bytes, "%s", text); return HS_DUPLICATE;
        case REFUSE_FINGERPRINT:
            snprintf(what, sizeof what, "the hub at %s refused replica %d: %s; the fields it hashes are in every "
                     "replica's diloco_fingerprint event (metrics.jsonl)", t->hub, t->o.replica_id, text);
            return refused(t, what, err, err_bytes);
        case REFUSE_HUB_ORDER:
        case REFUSE_BAD_ID:
            snprintf(what, sizeof what, "the hub at %s refused replica %d: %s", t->hub, t->o.replica_id, text);
            return refused(t, what, err, err_bytes);
        default: snprintf(err, err_bytes, "the hub refused the connection: %s", text); return HS_RETRY;
        }
    }
    wire_welcome w;
    if ((bad = wire_decode_welcome(f.payload, (size_t)f.payload_bytes, &w))) {
        snprintf(err, err_bytes, "%s", bad);
        return HS_RETRY;
    }
    uint8_t proof[32];
    wire_welcome_proof(t->secret, t->o.secret_bytes, hello.nonce_h, a.nonce_c, f.payload, WIRE_WELCOME_PROVEN_BYTES,
                       proof);
    if (!wire_equal32(proof, w.proof)) {
        char what[600];
        snprintf(what, sizeof what, "diloco_secret_file: the hub at %s could not prove it knows our secret (another "
                 "service, or a relay started with a different --secret_file)", t->hub);
        return refused(t, what, err, err_bytes);
    }
    if (stream > 0 && w.session_id != *session_id) {
        snprintf(err, err_bytes, "the hub answered a data stream with another session");
        return HS_RETRY;
    }
    *session_id = w.session_id;
    uint8_t c2h[WIRE_KEY_BYTES], h2c[WIRE_KEY_BYTES];
    wire_session_keys(t->secret, t->o.secret_bytes, hello.nonce_h, a.nonce_c, c2h, h2c);
    memcpy(c->key_tx, c2h, WIRE_KEY_BYTES);
    memcpy(c->key_rx, h2c, WIRE_KEY_BYTES);
    if (stream == 0) {
        double hub_timeout = w.timeout_ms / 1000.0;
        t->hub_timeout_s = hub_timeout < t->o.timeout_s ? hub_timeout : t->o.timeout_s;
        t->heartbeat_s = t->hub_timeout_s / 4 < 2.0 ? t->hub_timeout_s / 4 : 2.0;
    }
    return HS_OK;
}

static void clear_mailbox(tcp *t) {
    pthread_mutex_lock(&t->mailbox_lock);
    for (msg *m = t->mail_head, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    t->mail_head = t->mail_tail = NULL;
    t->dead = false;
    t->hub_held_s = 0;
    t->dead_why[0] = '\0';
    pthread_mutex_unlock(&t->mailbox_lock);
    drain(t->to_main[0]);
}

static void disconnect(tcp *t) {
    if (t->io_running) {
        atomic_store(&t->io_stop, true);
        wake(t->to_io[1]);
        pthread_join(t->io, NULL);
        t->io_running = false;
    }
    // A replica the hub drops for breaking the protocol rejoins, as after any lost session; the
    // third time in a row without a round it completed between is a bug that rejoining does not
    // mend (our own, or a relay of another build): said, and the run ends here.
    if (t->refused_code == REFUSE_PROTOCOL && ++t->protocol_drops >= 3)
        fail("diloco: %s (the third time in a row, with no round completed between: a bug of train_gpt's that "
             "rejoining does not mend; please report it with this log and the relay's)",
             t->dead_why);
    t->refused_code = 0;
    if (t->ctl.fd >= 0) conn_close(&t->ctl);
    t->ctl.fd = -1;
    for (int s = 0; s < t->o.streams; s++) {
        if (t->data[s].fd >= 0) conn_close(&t->data[s]);
        t->data[s].fd = -1;
    }
    clear_mailbox(t);
    t->mean_received = 0;
    // An upload cut off here must not go on over the next session (its round is over for us).
    t->job_buf = NULL;
    t->job_total = t->job_next = t->job_end = 0;
    t->payload_open = false;
    t->cu_over = true;   // a catch-up transfer ends with its session (the hub dropped it)
    t->connected = false;
    t->member = false;
}

// The caller's stop request; first the job's shared stop (comm_poll_stop: another rank's signal
// becomes this one's), since a join may wait here for hours outside any collective.
static bool stop_requested(const tcp *t) {
    comm_poll_stop();
    return t->o.stop && *t->o.stop;
}

// The hub's address, looked up once per try of connect_session for all 1 + streams connections.
// Test hook (TRAIN_GPT_FAULT=tcp_slow_resolve:0): each lookup takes 0.4 × timeout_s longer, as
// with a login node's slow resolver, and says so (test_transport counts the lookups).
static bool resolve_hub(tcp *t, net_addresses *addresses, char *err, size_t err_bytes) {
    if (fault_requested("tcp_slow_resolve", 0)) {
        note("diloco: trace: looking up the hub's address %s", t->hub);
        sleep_s(0.4 * t->o.timeout_s);
    }
    return net_resolve(t->hub, addresses, err, err_bytes);
}

// The I/O thread, for a session whose control connection has just been welcomed: it heartbeats
// while the data streams come up.
static void start_io(tcp *t) {
    t->ctl.allowed_rx = CONN_ALLOW(WIRE_HEARTBEAT) | CONN_ALLOW(WIRE_JOINED) | CONN_ALLOW(WIRE_ROUND) |
                        CONN_ALLOW(WIRE_EVICTED) | CONN_ALLOW(WIRE_STATE) | CONN_ALLOW(WIRE_STATE_ABORT) |
                        CONN_ALLOW(WIRE_STATE_END) | CONN_ALLOW(WIRE_STATE_AGAIN) | CONN_ALLOW(WIRE_REFUSE);
    t->ctl.last_rx_s = wall_seconds();
    atomic_store(&t->io_stop, false);
    int rc = pthread_create(&t->io, NULL, io_thread, t);
    if (rc != 0) fail("tcp transport: pthread_create: %s", strerror(rc));
    t->io_running = true;
}

// Whether the I/O thread has given the session up (why: its reason).
static bool session_dead(tcp *t, char *why, size_t why_bytes) {
    pthread_mutex_lock(&t->mailbox_lock);
    bool dead = t->dead;
    if (dead) {   // cut to fit
        size_t n = strnlen(t->dead_why, why_bytes - 1);
        memcpy(why, t->dead_why, n);
        why[n] = '\0';
    }
    pthread_mutex_unlock(&t->mailbox_lock);
    return dead;
}

// Connects the control connection and every data stream, retrying until deadline.
// false with the last reason in err. stoppable (a join, the start): false as soon as the
// caller asks to stop (transport_options.stop), so that a walltime signal is not lost in
// diloco_connect_timeout_s of retries while the hub is down; not in an exchange, whose failure
// the ranks of a sharded replica must not meet at different moments.
//
// The hub counts a session's life from its control connection: from WELCOME on, it drops one
// silent for its timeout_s. So the I/O thread heartbeats from the control connection's WELCOME
// on, while the data streams come up one after another, and one lookup of the hub's name serves
// every connection of a try (each stream goes to the address the control connection reached).
// Before, every stream looked the name up again and nothing was sent until the last was up: D ×
// (a lookup at 1-2 s on a login node's resolver, or a slow link's handshake) past the hub's
// timeout_s, and the hub dropped the session before it was whole, at every try
// (test_transport slowsetup). The hub is not asked to count the data streams' bytes instead:
// between them (a lookup, a SYN retried) nothing is on the wire at all.
//
// A hub that refuses the replica's id as a duplicate until the deadline holds a live session
// of that id. Once this process has had a session with the hub, that is its own old one: the
// path went dead without a FIN (a firewall's failover, a partition) and the hub keeps the
// session until it has heard nothing of it for its --timeout_s, which may be longer than ours
// (docs/protocol.md allows it). That is a lost hub like any other, not an error: false, and the
// exchange is skipped, the join's caller gives up as for an unreachable hub, or the background
// retry (quiet) goes on. At start (no session yet, not a background retry) it ends the run, with
// status 75 (EXIT_TEMPFAIL), not 1: the session may be this replica's previous job's (a requeue
// after a node failure, its process not yet gone or the hub not yet timed out), which a later
// try finds gone; a second replica started with the same id is refused the same way at every
// requeue, and requeue.sh stops after MAX_FAILURES of them in a row.
static bool connect_session(tcp *t, double deadline, bool stoppable, char *err, size_t err_bytes) {
    disconnect(t);
    double began = wall_seconds(), pause = 0.1;
    bool told = false, duplicate = false;
    char duplicate_why[300] = "";
    err[0] = '\0';
    for (;;) {
        if (stoppable && stop_requested(t)) {
            snprintf(err, err_bytes, "stopped by a signal");
            return false;
        }
        char why[300] = "";
        uint64_t session = 0;
        double attempt_deadline = wall_seconds() + t->o.timeout_s;
        if (attempt_deadline > deadline) attempt_deadline = deadline;
        // The last try comes at the deadline with no time of its own: what it says
        // ("timed out") must not hide the reason the earlier tries failed.
        bool real_try = attempt_deadline - wall_seconds() > 0.05;
        net_addresses addresses;
        int fd = -1;
        if (resolve_hub(t, &addresses, why, sizeof why))
            fd = net_connect_to(&addresses, attempt_deadline, why, sizeof why);
        handshake_result hs = HS_RETRY;
        int refusals_before = t->refusals;
        if (fd >= 0) {
            conn_init(&t->ctl, fd, t->hub);
            hs = handshake(t, &t->ctl, 0, &session, why, sizeof why);
            if (hs == HS_OK) start_io(t);
            for (int s = 0; hs == HS_OK && s < t->o.streams; s++) {
                if (session_dead(t, why, sizeof why)) {
                    hs = HS_RETRY;
                    break;
                }
                // Test hook (TRAIN_GPT_FAULT=tcp_slow_stream:0): each data stream's setup takes
                // 0.4 × timeout_s longer (a slow link's round trips).
                if (fault_requested("tcp_slow_stream", 0)) sleep_s(0.4 * t->o.timeout_s);
                int dfd = net_connect_to(&addresses, wall_seconds() + t->hub_timeout_s, why, sizeof why);
                if (dfd < 0) {
                    hs = HS_RETRY;
                    break;
                }
                conn_init(&t->data[s], dfd, t->hub);
                hs = handshake(t, &t->data[s], s + 1, &session, why, sizeof why);
            }
            if (hs == HS_OK && session_dead(t, why, sizeof why)) hs = HS_RETRY;
        }
        if (t->refusals == refusals_before) t->refusals = 0;   // a try that was no such refusal (refused())
        if (hs == HS_OK) {
            for (int s = 0; s < t->o.streams; s++) t->data[s].allowed_rx = CONN_ALLOW(WIRE_DATA);
            t->connected = true;
            t->had_session = true;
            t->refusals = 0;
            t->session_serial++;
            return true;
        }
        disconnect(t);
        if (hs == HS_DUPLICATE) {
            duplicate = true;
            snprintf(duplicate_why, sizeof duplicate_why, "%s", why);
        } else if (real_try) {
            duplicate = false;
        }
        if (real_try || !err[0]) {
            snprintf(err, err_bytes, "%s", why);
            t->not_a_hub = hs == HS_NOT_HUB;
        }
        double left = deadline - wall_seconds();
        if (left <= 0) {
            if (duplicate && !t->had_session && !t->quiet)
                fail_with_status(EXIT_TEMPFAIL,
                                 "the hub at %s still refused replica %d after %.0f s of tries: %s: it holds a "
                                 "live session of this id — this replica's previous job (a requeue) that it has "
                                 "not yet let go, or another replica started with the same diloco_replica_id",
                                 t->hub, t->o.replica_id, wall_seconds() - began, duplicate_why);
            if (duplicate)
                snprintf(err, err_bytes,
                         "the hub still holds this replica's previous session (%s): it lets it go once it has "
                         "heard nothing of it for the hub's --timeout_s",
                         duplicate_why);
            return false;
        }
        if (!told && !t->quiet) {
            note("diloco: waiting for the hub at %s (%s)", t->hub, why);
            told = true;
        }
        sleep_s(pause < left ? pause : left);   // the last try is at the deadline
        pause = pause * 2 > 2.0 ? 2.0 : pause * 2;
    }
}

// No hub reached in diloco_connect_timeout_s: status 75 (EXIT_TEMPFAIL: requeue.sh requeues it,
// and the next job may find the relay back — a login node's reboot); 1 when what answered last
// was no train_gpt hub (a wrong port, another service, a relay of another protocol version): a
// requeue would meet it again.
static int unreached_status(const tcp *t) { return t->not_a_hub ? 1 : EXIT_TEMPFAIL; }
static const char *unreached_hint(const tcp *t) {
    return t->not_a_hub ? " (what answers there is no train_gpt hub of this version: a wrong port?)" : "";
}

// ---------------------------------------------------------------- the pump
static void take_round(tcp *t, const msg *m) {
    wire_round r;
    const char *bad = wire_decode_round(m->payload, m->bytes, &r);
    if (bad) {
        post_dead(t, bad);
        return;
    }
    if (r.outer_step != t->cur_step) return;   // a stale round (before a reconnect)
    t->round = r;
    t->have_round = true;
    // A new transfer: an old end is not its. Its kind stays until the next designation (with
    // several hubs a later round of the same step here may close before the state goes).
    if (r.flags & ROUND_SEND_STATE) {
        t->state_cut = false;
        t->send_catchup = (r.flags & ROUND_CATCHUP) != 0;
        t->cu_again_early = -1;
        t->designated_step = r.outer_step;
    }
}

static void free_patches(tcp *t) {
    for (int i = 0; i < t->n_patches; i++) free(t->patches[i].bytes);
    t->n_patches = 0;
    t->handed = 0;
    t->held_bytes = 0;
    t->held_max = 0;
    t->held_max_bytes = 0;
}

static void reset_state_progress(tcp *t) {
    // The sink hears that the means it took belong to a state that is gone (index -1): the next
    // state's count starts at 0 even if no mean of it comes. (A state with no means, after an
    // aborted transfer whose means had been applied, left the count stale: the joiner exited,
    // "applied 1 catch-up mean(s) but the hub ended its catch-up after 0".)
    if (t->handed > 0 && t->o.catchup_sink) t->o.catchup_sink(t->o.catchup_arg, -1, NULL, 0, 0);
    t->state_started = false;
    t->state_received = 0;
    t->state_total = 0;
    t->state_announced = t->state_catchup = t->caught_up_sent = t->state_end_known = false;
    t->caught_up_deferred = t->catchup_aborted = false;
    t->means_while_deferred = 0;
    free_patches(t);
}

static bool start_state(tcp *t, int64_t step, uint64_t total) {
    if (t->state_started && t->state_step == step) return t->state_total == total;
    if (total > t->state_cap)
        fail("the donor's state is %llu bytes but this replica holds %zu: the replicas' configs differ",
             (unsigned long long)total, t->state_cap);
    t->state_started = true;
    t->join_waited = true;
    t->state_step = step;
    t->state_total = total;
    t->state_received = 0;
    t->state_began_s = wall_seconds();
    return true;
}

static bool state_all_queued(const tcp *t);
static void free_overlays(tcp *t);
static void hand_catchup(tcp *t);

static void take_mail(tcp *t) {
    pthread_mutex_lock(&t->mailbox_lock);
    msg *m = t->mail_head;
    t->mail_head = t->mail_tail = NULL;
    pthread_mutex_unlock(&t->mailbox_lock);
    while (m) {
        msg *next = m->next;
        const char *bad = NULL;
        switch (m->type) {
        case WIRE_ROUND: take_round(t, m); break;
        case WIRE_EVICTED: {
            wire_evicted e;
            // Only for the step being exchanged: an EVICTED answering an older contribution
            // may trail behind a rejoin.
            if (!(bad = wire_decode_evicted(m->payload, m->bytes, &e)) && e.outer_step == t->cur_step &&
                t->job_kind == DATA_PAYLOAD && !t->evicted) {
                t->evicted = true;
                wire_printable(e.text, e.text_bytes, t->evicted_why, sizeof t->evicted_why);
                // The rest of our upload would be thrown away: stop it (a frame half-written
                // must still finish, or the stream loses its framing).
                t->job_next = t->job_end = t->job_total;
                for (int st = 0; st < t->o.streams; st++) conn_drop_unsent(&t->data[st]);
            }
            break;
        }
        case WIRE_JOINED: {
            wire_joined j;
            if (!(bad = wire_decode_joined(m->payload, m->bytes, &j))) {
                t->joined = j.result;
                t->joined_step = j.group_step;
                if (j.result == JOINED_WAIT) {
                    t->join_waited = true;
                    note("diloco: replica %d waits for the group's state at the next outer boundary", t->o.replica_id);
                }
                if (j.result == JOINED_FINISHED)
                    note("diloco: the hub at %s says the run is over: replica %llu finished it at outer step %lld and "
                         "left, and no replica is training; its checkpoint holds the final weights",
                         t->hub, (unsigned long long)j.group_hash, (long long)j.group_step);
            }
            break;
        }
        case WIRE_STATE: {
            wire_state s;
            char size[32];
            if (!(bad = wire_decode_state(m->payload, m->bytes, &s)) && t->want_state) {
                if (!start_state(t, s.outer_step, s.total_bytes)) bad = "STATE disagrees with its chunks";
                else {
                    t->state_announced = true;
                    t->state_catchup = (s.flags & STATE_CATCHUP) != 0;
                    hand_catchup(t);   // its chunks may all have come first
                    note("diloco: receiving the group's state from replica %u (%s%s)", s.donor_id,
                         format_bytes(s.total_bytes, size, sizeof size),
                         t->state_catchup ? ", then the means of the rounds the group closes meanwhile" : "");
                }
            }
            break;
        }
        case WIRE_STATE_ABORT:
            if (t->caught_up_deferred && !t->want_state) {   // its join returned, CAUGHT_UP not said yet
                note("diloco: the hub aborted the catch-up transfer before this rank's others had their states "
                     "(the donor left or stalled): joining again");
                reset_state_progress(t);
                t->catchup_aborted = true;
            } else if (t->want_state) {
                note("diloco: the hub aborted the state transfer (the donor left or stalled, or the transfer held "
                     "the group longer than the relay's --max_hold_s); waiting for the next outer boundary");
                reset_state_progress(t);
            } else if (t->cu_active && !t->cu_over) {
                note("diloco: replica %d stops sending its state: the hub ended the transfer (no joiner left, or "
                     "stalled); training on",
                     t->o.replica_id);
                t->cu_over = true;
            } else if (t->job_buf && t->job_kind == DATA_STATE && t->job_next < t->job_end) {
                // The donor: the hub ended the transfer; what is queued goes, the rest not.
                note("diloco: replica %d stops sending its state: the hub ended the transfer (cut by the relay's "
                     "--max_hold_s, no joiner left, or stalled); training on",
                     t->o.replica_id);
                t->job_end = t->job_next;
            } else {
                t->state_cut = true;   // before this donor began to send: tcp_send_state sends nothing
            }
            break;
        case WIRE_STATE_AGAIN: {
            int64_t k;
            if ((bad = wire_decode_step(m->payload, m->bytes, &k))) break;
            if (k < 0) {
                bad = "STATE_AGAIN asks for a negative number of chunks";
                break;
            }
            // Designated, not sending yet (or a sender of the transfer before still winding up).
            if ((!t->cu_active || t->cu_over) && t->send_catchup) t->cu_again_early = k;
            if (!t->cu_active || t->cu_over || t->cu_again_known) break;   // a transfer over, or said twice
            if ((uint64_t)k > t->cu_chunks) {
                bad = "STATE_AGAIN asks for chunks beyond the state";
                break;
            }
            t->cu_again_known = true;
            t->cu_again = (uint64_t)k;
            t->cu_again_next = 1;
            if (state_all_queued(t)) free_overlays(t);   // nothing to send again: what was kept goes
            if (k > 1)
                note("diloco: replica %d sends the first %lld chunk(s) of its state again, for replicas that joined "
                     "the transfer in flight",
                     t->o.replica_id, (long long)k - 1);
            break;
        }
        case WIRE_STATE_END: {
            int64_t round;
            if ((bad = wire_decode_step(m->payload, m->bytes, &round))) break;
            if (t->want_state && t->state_catchup) {   // the joiner: caught up to this round
                t->state_end_known = true;
                t->state_end_round = round;
            } else if (t->cu_active) {                  // the donor: its joiners have what they need
                t->cu_over = true;
            }
            break;
        }
        }
        if (bad) {
            char why[200];
            snprintf(why, sizeof why, "the hub sent a malformed %s: %s", wire_type_name(m->type), bad);
            post_dead(t, why);
        }
        free(m);
        m = next;
    }
}

static catchup_in *patch_of(const tcp *t, int64_t round) {
    for (int i = 0; i < t->n_patches; i++)
        if (t->patches[i].round == round) return &t->patches[i];
    return NULL;
}

static int64_t state_landing(const tcp *t);

// A chunk of a landed round's mean for a joiner catching up: kept by round (they are few; the
// frames of several may interleave over several streams).
static const char *take_catchup_chunk(tcp *t, const wire_data *d) {
    if (!t->want_state && !t->caught_up_deferred) return NULL;   // after the join: a mean it no longer needs
    // A mean is at most the model's values in fp32 and a header: below the state (θ and m). A
    // larger one was allocated as announced (one 16 KiB frame of 2^36 bytes: out of memory, exit).
    if (d->total_bytes > t->state_cap) return "a catch-up mean larger than this replica's whole state";
    // The means handed start after the state's landing: one at or before it would be kept unread.
    if (t->state_started && t->state_catchup && d->outer_step <= state_landing(t)) return NULL;
    catchup_in *p = patch_of(t, d->outer_step);
    if (!p) {
        if (t->n_patches >= 4096) return "more than 4096 catch-up means";
        if (t->n_patches == t->cap_patches) {
            t->cap_patches = t->cap_patches ? 2 * t->cap_patches : 8;
            t->patches = xrealloc(t->patches, (size_t)t->cap_patches * sizeof *t->patches);
        }
        p = &t->patches[t->n_patches++];
        *p = (catchup_in){.round = d->outer_step, .bytes = xmalloc((size_t)d->total_bytes), .total = d->total_bytes};
        t->held_bytes += d->total_bytes;
        if (t->n_patches - t->handed > t->held_max) {
            t->held_max = t->n_patches - t->handed;
            t->held_max_bytes = t->held_bytes;
        }
    }
    if (p->total != d->total_bytes) return "a catch-up mean's chunks disagree on its size";
    if (!p->bytes || p->received + d->chunk_len > p->total) return "a catch-up mean's chunk came twice";
    memcpy(p->bytes + d->offset, d->bytes, (size_t)d->chunk_len);
    p->received += d->chunk_len;
    return NULL;
}

// A catch-up counts the donor's landings: rounds with one hub, outer steps with several (the
// state's round id 64·k + 8·a + s is after outer step k). The state's.
static int64_t state_landing(const tcp *t) {
    return t->multi_hub ? t->state_step / WIRE_ROUNDS_PER_STEP : t->state_step;
}

// A landing as this replica's log names it: "round r" with one hub, "outer step k + 1" with
// several (diloco.c's numbering of the step that landing k makes).
static const char *landing_name(const tcp *t, int64_t landing, char *buf, size_t bytes) {
    if (t->multi_hub) snprintf(buf, bytes, "outer step %lld", (long long)landing + 1);
    else snprintf(buf, bytes, "round %lld", (long long)landing);
    return buf;
}

// The last landing r such that the means of landings state_landing + 1 .. r are all here (the
// state's own when none is).
static int64_t patched_through(const tcp *t) {
    int64_t r = state_landing(t);
    for (;;) {
        const catchup_in *p = patch_of(t, r + 1);
        if (!p || p->received != p->total) return r;
        r++;
    }
}

// The joiner's catch-up means to transport_options.catchup_sink, in order, as soon as the state
// is whole and the means before are handed (not past STATE_END's round once it is known: the
// hub answers at least every round it closed, and the rounds after wait for this joiner, so no
// mean beyond it comes); each is let go once handed.
static void hand_catchup(tcp *t) {
    if (!t->o.catchup_sink || !t->state_catchup || !t->state_started || t->state_received != t->state_total) return;
    for (;;) {
        int64_t landing = state_landing(t) + 1 + t->handed;
        if (t->state_end_known && landing > t->state_end_round) return;
        catchup_in *p = patch_of(t, landing);
        if (!p || p->received != p->total) return;
        t->o.catchup_sink(t->o.catchup_arg, t->handed, p->bytes, (size_t)p->total, (size_t)t->state_total);
        free(p->bytes);
        p->bytes = NULL;
        t->handed++;
        t->held_bytes -= p->total;
    }
}

static const char *take_chunk(tcp *t, const wire_data *d) {
    if (d->kind == DATA_CATCHUP) {
        const char *bad = take_catchup_chunk(t, d);
        if (!bad) hand_catchup(t);
        return bad;
    }
    if (d->kind == DATA_STATE) {
        if (!t->want_state) return NULL;
        if (!start_state(t, d->outer_step, d->total_bytes)) return "a state chunk disagrees with its transfer";
        if (t->state_received + d->chunk_len > t->state_total) return "a state chunk came twice";
        memcpy(t->state_buf + d->offset, d->bytes, (size_t)d->chunk_len);
        t->state_received += d->chunk_len;
        hand_catchup(t);
        return NULL;
    }
    if (d->kind != DATA_MEAN) return "the hub sent a replica's payload (a hub of another version?)";
    if (d->outer_step != t->cur_step || t->job_kind != DATA_PAYLOAD) return NULL;   // stale (before a reconnect)
    if (d->total_bytes != t->mean_total) return "a segment of the mean disagrees with the round's layout";
    // Test hook (TRAIN_GPT_FAULT=tcp_trace:K): when the mean of round K begins to arrive.
    if (t->mean_received == 0 && fault_requested("tcp_trace", d->outer_step)) {
        char name[128];
        note("diloco: trace: %s: first segment of the mean at %.6f", exchange_name(t, d->outer_step, name, sizeof name),
             wall_seconds());
    }
    memcpy(t->mean + d->offset, d->bytes, (size_t)d->chunk_len);
    t->mean_received += d->chunk_len;
    t->job_progress_s = wall_seconds();
    return NULL;
}

static bool upload_done(const tcp *t) {
    if (t->job_next < t->job_end) return false;
    for (int s = 0; s < t->o.streams; s++)
        if (t->data[s].out_head) return false;
    return true;
}

// The pump for a call (exchange, join, a landing's preserve or mean): a catch-up donor's sender,
// which takes it back between its slices, lets a waiting caller have it first.
static void take_pump(tcp *t) {
    atomic_fetch_add(&t->pump_wanted, 1);
    wake(t->to_main[1]);   // a sender's slice in poll() ends at once
    pthread_mutex_lock(&t->pump_lock);
    atomic_fetch_sub(&t->pump_wanted, 1);
}

// ---------------------------------------------------------------- a catch-up donor's sending
// The state's k-th chunk in sending order: 1, 2, .., n − 1, then 0 (its first bytes, stamped
// just before).
static uint64_t catchup_chunk_index(const tcp *t, uint64_t k) { return k + 1 < t->cu_chunks ? k + 1 : 0; }

static void free_overlays(tcp *t) {
    for (overlay *o = t->cu_overlays, *next; o; o = next) {
        next = o->next;
        free(o->kept);
        free(o);
    }
    t->cu_overlays = NULL;
}

static void free_catchup_out(tcp *t) {
    for (catchup_out *o = t->cu_out_head, *next; o; o = next) {
        next = o->next;
        blob_release(o->b);
        free(o);
    }
    t->cu_out_head = t->cu_out_tail = NULL;
    t->cu_out_next = 0;
}

// Queues chunk i of the state: its bytes now, with what the overlays kept of them.
static void queue_state_chunk(tcp *t, conn *c, uint64_t i) {
    uint64_t at = i * t->cu_chunk, len = t->cu_total - at < t->cu_chunk ? t->cu_total - at : t->cu_chunk;
    if (i == 0 && t->cu_hooks && t->cu_hooks->stamp) t->cu_hooks->stamp(t->cu_hooks->arg);
    blob *b = blob_new((size_t)len);
    if (!b) fail("tcp transport: out of memory for a chunk of the state (%llu bytes)", (unsigned long long)len);
    memcpy(b->data, t->cu_buf + at, (size_t)len);
    for (const overlay *o = t->cu_overlays; o; o = o->next) {
        uint64_t lo = o->offset > at ? o->offset : at, hi = o->offset + o->bytes < at + len ? o->offset + o->bytes : at + len;
        if (lo < hi) memcpy(b->data + (lo - at), o->kept + (lo - o->offset), (size_t)(hi - lo));
    }
    wire_data d = {.owner_id = (uint32_t)t->o.replica_id, .kind = DATA_STATE, .outer_step = t->cu_step,
                   .total_bytes = t->cu_total, .offset = at, .chunk_bytes = t->cu_chunk, .chunk_len = len};
    uint8_t head[WIRE_DATA_HEAD_BYTES];
    wire_encode_data_head(&d, head);
    conn_send(c, WIRE_DATA, head, sizeof head, b->data, (size_t)len, b);
    blob_release(b);
}

static void queue_catchup_chunk(tcp *t, conn *c) {
    catchup_out *o = t->cu_out_head;
    uint64_t at = t->cu_out_next, len = o->n - at < CHUNK_BYTES ? o->n - at : CHUNK_BYTES;
    wire_data d = {.owner_id = (uint32_t)t->o.replica_id, .kind = DATA_CATCHUP, .outer_step = o->round,
                   .total_bytes = o->n, .offset = at, .chunk_bytes = CHUNK_BYTES, .chunk_len = len};
    uint8_t head[WIRE_DATA_HEAD_BYTES];
    wire_encode_data_head(&d, head);
    conn_send(c, WIRE_DATA, head, sizeof head, o->b->data + at, (size_t)len, o->b);
    t->cu_out_next += len;
    if (t->cu_out_next == o->n) {
        t->cu_out_head = o->next;
        if (!t->cu_out_head) t->cu_out_tail = NULL;
        t->cu_out_next = 0;
        blob_release(o->b);
        free(o);
    }
}

// Every chunk of the state that is to go has been queued: the first pass, and those the hub
// asked for again (STATE_AGAIN, which it sends once the first pass is whole at the hub).
static bool state_all_queued(const tcp *t) {
    return t->cu_queued == t->cu_chunks && t->cu_again_known && t->cu_again_next >= t->cu_again;
}

// Feeds the catch-up transfer, after an exchange's payload (which the round waits for): the
// state's chunks, then the means queued by transport_send_catchup.
static void feed_catchup(tcp *t) {
    if (!t->cu_active || t->cu_over || t->payload_open) return;
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < t->o.streams; s++) {
            conn *c = &t->data[s];
            if (c->out_frames >= STREAM_DEPTH_FRAMES) continue;
            bool again = t->cu_queued == t->cu_chunks && t->cu_again_next < t->cu_again;
            if (t->cu_queued < t->cu_chunks || again) {
                if (t->cu_slow_s > 0) {
                    double now = wall_seconds();
                    if (now < t->cu_next_chunk_s) return;
                    t->cu_next_chunk_s = now + t->cu_slow_s;
                }
                queue_state_chunk(t, c, again ? t->cu_again_next++ : catchup_chunk_index(t, t->cu_queued++));
                if (state_all_queued(t)) free_overlays(t);   // every byte is on its way
            } else if (t->cu_out_head) {
                if (t->cu_slow_means_s > 0) {
                    double now = wall_seconds();
                    if (now < t->cu_next_chunk_s) return;
                    t->cu_next_chunk_s = now + t->cu_slow_means_s;
                }
                queue_catchup_chunk(t, c);
            } else {
                return;
            }
            progress = true;
        }
    }
}

// transport_preserve_state: of [offset, offset + bytes), what is not yet queued and not kept
// already (a fragment lands again: its first copy holds the state's bytes) is copied aside.
static void keep_unsent(tcp *t, uint64_t lo, uint64_t hi) {
    if (lo >= hi) return;
    for (const overlay *o = t->cu_overlays; o; o = o->next)
        if (o->offset < hi && lo < o->offset + o->bytes) return;   // a fragment's range: kept whole before
    overlay *o = xcalloc(1, sizeof *o);
    o->offset = lo;
    o->bytes = hi - lo;
    o->kept = xmalloc((size_t)(hi - lo));
    memcpy(o->kept, t->cu_buf + lo, (size_t)(hi - lo));
    o->next = t->cu_overlays;
    t->cu_overlays = o;
}

static void tcp_preserve_state(void *impl, size_t offset, size_t bytes) {
    tcp *t = impl;
    take_pump(t);
    if (t->cu_active && !t->cu_over && !state_all_queued(t)) {
        uint64_t lo = offset, hi = offset + bytes;
        if (hi > t->cu_total) hi = t->cu_total;
        if (!t->cu_again_known) {
            // The hub may still ask for any chunk but the first again (replicas joining in flight).
            keep_unsent(t, lo, hi);
        } else {
            // Not yet queued: chunks cu_queued + 1 .. n − 1 (in order), chunk 0, and the chunks
            // cu_again_next .. cu_again − 1 to go again.
            uint64_t tail = (t->cu_queued + 1) * (uint64_t)t->cu_chunk;
            if (t->cu_queued + 1 < t->cu_chunks) keep_unsent(t, lo > tail ? lo : tail, hi);
            if (t->cu_queued < t->cu_chunks) {
                uint64_t first = t->cu_total < t->cu_chunk ? t->cu_total : t->cu_chunk;
                keep_unsent(t, lo, hi < first ? hi : first);
            }
            uint64_t a = t->cu_again_next * (uint64_t)t->cu_chunk, b = t->cu_again * (uint64_t)t->cu_chunk;
            if (a < b) keep_unsent(t, lo > a ? lo : a, hi < b ? hi : b);
        }
    }
    pthread_mutex_unlock(&t->pump_lock);
}

static void tcp_send_catchup(void *impl, int64_t round, const uint8_t *bytes, size_t n) {
    tcp *t = impl;
    take_pump(t);
    if (t->cu_active && !t->cu_over) {
        catchup_out *o = xcalloc(1, sizeof *o);
        o->round = round;
        o->n = n;
        o->b = blob_new(n);
        if (!o->b) fail("tcp transport: out of memory for a catch-up mean (%zu bytes)", n);
        memcpy(o->b->data, bytes, n);
        if (t->cu_out_tail) t->cu_out_tail->next = o;
        else t->cu_out_head = o;
        t->cu_out_tail = o;
    }
    pthread_mutex_unlock(&t->pump_lock);
}

static void feed_upload(tcp *t) {
    bool progress = true;
    while (progress && t->job_next < t->job_end) {
        progress = false;
        for (int s = 0; s < t->o.streams && t->job_next < t->job_end; s++) {
            conn *c = &t->data[s];
            if (c->out_frames >= STREAM_DEPTH_FRAMES) continue;
            if (t->job_slow_s > 0) {
                double now = wall_seconds();
                if (now < t->job_next_chunk_s) return;
                t->job_next_chunk_s = now + t->job_slow_s;
            }
            // A state's chunks go 1, 2, .., n − 1, then 0 (its first bytes, stamped just before).
            uint64_t at = t->job_next;
            if (t->job_kind == DATA_STATE) {
                uint64_t chunks = (t->job_total + t->job_chunk - 1) / t->job_chunk;
                at = (t->job_next / t->job_chunk + 1) % chunks * t->job_chunk;
                if (at == 0 && t->job_hooks && t->job_hooks->stamp) t->job_hooks->stamp(t->job_hooks->arg);
            }
            uint64_t len = t->job_total - at < t->job_chunk ? t->job_total - at : t->job_chunk;
            wire_data d = {.owner_id = (uint32_t)t->o.replica_id, .kind = t->job_kind, .outer_step = t->job_step,
                           .total_bytes = t->job_total, .offset = at, .chunk_bytes = t->job_chunk,
                           .chunk_len = len};
            // Test hook (TRAIN_GPT_FAULT=tcp_foreign_chunk:0): every payload's last chunk is
            // claimed as the next replica's, a protocol error the hub drops the replica for.
            if (t->job_kind == DATA_PAYLOAD && at + len == t->job_total && t->foreign_chunk)
                d.owner_id = (uint32_t)((t->o.replica_id + 1) % t->o.replicas);
            uint8_t head[WIRE_DATA_HEAD_BYTES];
            wire_encode_data_head(&d, head);
            conn_send(c, WIRE_DATA, head, sizeof head, t->job_buf + at, (size_t)len, NULL);
            t->job_next = t->job_total - t->job_next < t->job_chunk ? t->job_total : t->job_next + t->job_chunk;
            progress = true;
        }
    }
    feed_catchup(t);
}

typedef bool (*done_fn)(tcp *t);

// Moves bytes until done(t) or the session dies (false; t->dead_why says why).
// A join the hub does not answer yet: said every hub timeout (a minute by default), so that
// a replica held back is not a silent one. The hub answers a JOIN at once, but for a group
// being founded, which it holds until diloco_min_replicas replicas are present (the others may
// be queued, or the run may have ended without this replica).
static void say_join_waits(tcp *t) {
    if (t->joined != 0 || t->state_started) return;
    double now = wall_seconds(), every = t->hub_timeout_s > 1.0 ? t->hub_timeout_s : 1.0;
    if (now - t->join_said_s < every) return;
    t->join_said_s = now;
    note("diloco: replica %d has waited %.0f s for the hub at %s to answer its join: it holds a new group until %d "
         "replica(s) are present (diloco_min_replicas; the others may not have started, or have finished)",
         t->o.replica_id, now - t->join_sent_s, t->hub, t->o.min_replicas);
}

static bool join_done(tcp *t);

// CAUGHT_UP for the means this joiner holds (its first: the hub answers which round it is due
// in). false: the session is lost.
static bool say_caught_up(tcp *t) {
    uint8_t buf[8];
    char err[256];
    // Test hook (TRAIN_GPT_FAULT=tcp_caught_up_late:0): one rank of a sharded replica asks 1.5 s
    // after the others, so that its hub has closed more rounds than theirs when they asked: the
    // ranks must agree on one last round.
    if (fault_requested("tcp_caught_up_late", 0)) sleep_s(1.5);
    int64_t through = patched_through(t);
    bool deferred = t->caught_up_deferred;
    t->caught_up_sent = true;
    t->caught_up_deferred = false;
    if (!send_control(t, WIRE_CAUGHT_UP, buf, wire_encode_step(through, buf), err, sizeof err)) return false;
    char a[48], b[48], waited[96] = "";
    if (deferred)
        snprintf(waited, sizeof waited, " (%d taken while its other ranks received their states)",
                 t->means_while_deferred);
    note("diloco: replica %d has the group's state of %s and the means up to %s%s; asks the hub which round it is due "
         "in",
         t->o.replica_id, landing_name(t, state_landing(t), a, sizeof a), landing_name(t, through, b, sizeof b),
         waited);
    return true;
}

// "3.10 GiB of 8.00 GiB (39 %), 11.9 MiB/s, about 7m02s left"
static void transfer_progress(uint64_t done, uint64_t total, double began_s, char *out, size_t bytes) {
    double took = wall_seconds() - began_s, rate = took > 0 ? (double)done / took : 0;
    char d[32], t[32], r[32], left[32];
    format_bytes(done, d, sizeof d);
    format_bytes(total, t, sizeof t);
    format_bytes((uint64_t)rate, r, sizeof r);
    format_duration(rate > 0 ? (double)(total - done) / rate : -1, left, sizeof left);
    snprintf(out, bytes, "%s of %s (%.0f %%), %s/s, about %s left", d, t, total ? 100.0 * (double)done / (double)total : 0,
             r, left);
}

// A long wait says what it waits for every hub timeout (a minute by default): a state on its way
// in or out (a 14B model's takes hours on a slow link), or a round the hub holds for another
// replica's state (HEARTBEAT_HOLD) — never a silent replica that looks hung.
static void say_long_wait(tcp *t, double held_s) {
    double now = wall_seconds(), every = t->hub_timeout_s > 1.0 ? t->hub_timeout_s : 1.0;
    bool held = now - held_s < every;
    if (!held) t->hold_began_s = 0;
    else if (t->hold_began_s == 0) t->hold_began_s = now;
    if (now - t->wait_said_s < every) return;
    char line[160], waited[32];
    if (t->state_started && t->state_received < t->state_total) {
        transfer_progress(t->state_received, t->state_total, t->state_began_s, line, sizeof line);
        note("diloco: replica %d receives the group's state: %s", t->o.replica_id, line);
    } else if (t->want_state && t->state_catchup && t->state_end_known) {
        char a[48], b[48];
        note("diloco: replica %d has the group's state; waits for the means up to %s (has them up to %s)",
             t->o.replica_id, landing_name(t, t->state_end_round, a, sizeof a),
             landing_name(t, patched_through(t), b, sizeof b));
    } else if (t->job_buf && t->job_kind == DATA_STATE && t->job_next < t->job_total) {
        transfer_progress(t->job_next, t->job_total, t->job_began_s, line, sizeof line);
        note("diloco: replica %d sends its state to the joiners: %s", t->o.replica_id, line);
    } else if (held && t->hold_began_s > 0 && now - t->hold_began_s >= every) {
        note("diloco: replica %d waits for its exchange: the hub at %s holds the round for a state transfer "
             "(a replica joins; waited %s)",
             t->o.replica_id, t->hub, format_duration(now - t->hold_began_s, waited, sizeof waited));
    } else {
        return;
    }
    t->wait_said_s = now;
}

typedef enum { PUMP_DONE, PUMP_DEAD, PUMP_SLICE } pump_result;
static pump_result pump_until(tcp *t, done_fn done, double until_s);

static bool pump(tcp *t, done_fn done) { return pump_until(t, done, INFINITY) == PUMP_DONE; }

// pump, for a slice of time at most (until_s): a catch-up donor's sender gives the pump to an
// exchange between slices.
static pump_result pump_until(tcp *t, done_fn done, double until_s) {
    struct pollfd p[1 + WIRE_MAX_STREAMS];
    char err[256], why[1024];
    t->job_progress_s = wall_seconds();
    if (until_s == INFINITY || t->wait_said_s == 0) t->wait_said_s = t->job_progress_s;
    double hold_seen_s = 0;
    for (;;) {
        if (done == join_done) say_join_waits(t);
        take_mail(t);
        pthread_mutex_lock(&t->mailbox_lock);
        bool dead = t->dead;
        double held_s = t->hub_held_s;
        pthread_mutex_unlock(&t->mailbox_lock);
        if (dead) return PUMP_DEAD;
        // Progress for the watchdog (llmc/watchdog.h): bytes moved (below), or the hub saying
        // anew that it holds the round for a state transfer.
        if (held_s > hold_seen_s) {
            hold_seen_s = held_s;
            watchdog_progress();
        }
        say_long_wait(t, held_s);
        if (done(t)) return PUMP_DONE;
        if (until_s != INFINITY && (wall_seconds() >= until_s || atomic_load(&t->pump_wanted) > 0)) return PUMP_SLICE;
        feed_upload(t);
        p[0] = (struct pollfd){.fd = t->to_main[0], .events = POLLIN};
        for (int s = 0; s < t->o.streams; s++)
            p[1 + s] = (struct pollfd){.fd = t->data[s].fd, .events = POLLIN | (t->data[s].out_head ? POLLOUT : 0)};
        int ms = until_s == INFINITY ? 200 : (int)fmin(50.0, fmax(1.0, (until_s - wall_seconds()) * 1e3));
        if (poll(p, (nfds_t)(1 + t->o.streams), ms) < 0 && errno != EINTR) {
            snprintf(why, sizeof why, "poll: %s", strerror(errno));
            post_dead(t, why);
            continue;
        }
        if (p[0].revents) drain(t->to_main[0]);
        for (int s = 0; s < t->o.streams; s++) {
            conn *c = &t->data[s];
            if (p[1 + s].revents & (POLLIN | POLLHUP | POLLERR)) {
                for (int frames = 0; frames < 16; frames++) {
                    wire_frame f;
                    conn_result r = conn_read(c, &f, err, sizeof err);
                    if (r == CONN_AGAIN) break;
                    const char *bad = NULL;
                    if (r == CONN_FRAME) {
                        wire_data d;
                        bad = wire_decode_data(f.payload, (size_t)f.payload_bytes, &d);
                        if (!bad) bad = take_chunk(t, &d);
                        if (!bad) {
                            watchdog_progress();
                            continue;
                        }
                    }
                    snprintf(why, sizeof why, "data stream %d from the hub at %s: %s", s + 1, t->hub,
                             r == CONN_CLOSED ? "connection closed" : bad ? bad : err);
                    post_dead(t, why);
                    break;
                }
            }
            if (c->out_head) {
                uint64_t before = c->bytes_tx;
                if (conn_flush(c, err, sizeof err) < 0) {
                    snprintf(why, sizeof why, "data stream %d to the hub at %s: %s", s + 1, t->hub, err);
                    post_dead(t, why);
                }
                if (c->bytes_tx != before) {
                    t->job_progress_s = wall_seconds();
                    watchdog_progress();
                }
            }
        }
        // The hub holds an upload back while the others catch up (a member not yet begun is
        // evicted timeout_s after the first began; a stalled one is dropped after timeout_s):
        // nothing moving either way for 3 timeouts means the hub is stuck — unless the hub says
        // it holds the round for a state transfer, which may take hours (HEARTBEAT_HOLD).
        double quiet_since = t->job_progress_s > held_s ? t->job_progress_s : held_s;
        if (!upload_done(t) && wall_seconds() - quiet_since > 3 * t->hub_timeout_s) {
            snprintf(why, sizeof why, "upload to the hub at %s stalled for %.1f s", t->hub, 3 * t->hub_timeout_s);
            post_dead(t, why);
        }
    }
}

// Why the session died (the training thread's copy: the I/O thread has stopped writing it
// once dead is set).
static const char *dead_reason(tcp *t) {
    pthread_mutex_lock(&t->mailbox_lock);
    const char *why = t->dead_why;
    pthread_mutex_unlock(&t->mailbox_lock);
    return why;
}

// ---------------------------------------------------------------- join

// Joined, or the caller asked to stop (transport_options.stop: a signal while the hub holds the
// join for a quorum or a state).
static bool join_done(tcp *t) {
    if (t->joined == JOINED_MEMBER || t->joined == JOINED_FINISHED) return true;
    bool whole = t->state_started && t->state_announced && t->state_received == t->state_total;
    if (whole && !t->state_catchup) return true;
    if (whole) {
        // Catch-up: the state is here; the hub says up to which round's mean to wait for (the
        // last it closed, or this replica's word if later), and it is due from the next. A rank
        // of a sharded replica returns first: its ranks say it together (defer_caught_up).
        if (t->o.defer_caught_up && !t->caught_up_sent) return true;
        if (!t->caught_up_sent && !say_caught_up(t)) post_dead(t, "cannot send CAUGHT_UP");
        if (t->state_end_known && patched_through(t) >= t->state_end_round) return true;
    }
    return stop_requested(t);
}

// Joins through tcp_hub_join (below), reconnecting after a lost hub until the join lands.
static join_result tcp_join(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                            size_t *state_bytes) {
    tcp *t = impl;
    char err[256];
    join_result result = JOIN_MEMBER;
    int64_t state_round = 0;
    t->join_waited = false;   // a wait before a lost hub counts: the join goes on in the next session
    for (;;) {
        if (!t->connected && !connect_session(t, wall_seconds() + t->o.connect_timeout_s, true, err, sizeof err)) {
            if (stop_requested(t)) return JOIN_STOPPED;
            fail_with_status(unreached_status(t),
                             "cannot reach the hub at %s within diloco_connect_timeout_s = %g s: %s%s", t->hub,
                             t->o.connect_timeout_s, err, unreached_hint(t));
        }
        if (tcp_hub_join(t, s, state, state_capacity, state_bytes, &result, &state_round)) return result;
    }
}

// ---------------------------------------------------------------- exchange
// Whether this replica is in the round that closed: named in ROUND, or (a contribution of no
// work, which ROUND does not name) sent ROUND at all — the hub sends it only to those whose
// contribution it took whole.
static bool named_in_round(const tcp *t) {
    if (t->no_work) return true;
    for (uint32_t i = 0; i < t->round.n; i++)
        if ((int)t->round.ids[i] == t->o.replica_id) return true;
    return false;
}

static bool round_done(tcp *t) {
    if (t->evicted) return upload_done(t);
    if (t->payload_open || !t->have_round) return false;
    return !named_in_round(t) || t->mean_received == t->mean_total;
}

static bool upload_finished(tcp *t) { return upload_done(t); }
// A state's sending, whole (hooks: job_hooks) or catch-up (cu_hooks): also over when the caller
// asks to stop or cancels it (its donor does not wait for it). Until 2026-12 the catch-up sender
// read job_hooks (NULL then): a donor leaving at the run's end, stop_at_step or the walltime
// guard (a cancel, no signal) sent on until its joiners had caught up.
static bool state_cancelled(const tcp *t, const state_hooks *h) {
    return stop_requested(t) || (h && h->cancelled && h->cancelled(h->arg));
}
static bool state_sent_or_stopping(tcp *t) { return upload_done(t) || state_cancelled(t, t->job_hooks); }

// Test hook (TRAIN_GPT_FAULT=tcp_blackhole:K, once): at the exchange for outer step K the path
// to the hub goes dead without a FIN, as at a firewall's failover or a NAT's flushed table:
// this replica gives its session up (as after timeout_s of the hub's silence) and reconnects,
// while its old sockets stay open and quiet (a copy of each, never closed), so the hub keeps
// the old session until its own --timeout_s.
static void blackhole(tcp *t) {
    t->blackholed = true;
    if (t->ctl.fd >= 0) (void)dup(t->ctl.fd);
    for (int s = 0; s < t->o.streams; s++)
        if (t->data[s].fd >= 0) (void)dup(t->data[s].fd);
    post_dead(t, "test hook tcp_blackhole: the path to the hub went dead");
}

// After the session died: reconnect (this replica was dropped, so it must rejoin) or give up.
// One hub of several gives up at once: the share fails over to the next live hub, as for a dead
// one, and the hub is taken back at a later step (transport_hubs.c). Reconnected here, a hub
// restarted within timeout_s (a supervisor's restart) made every replica's step "evicted": all of
// them rejoined, the group was founded again at that step, and the hubs that had closed its other
// shares refused them as closed, round after round, with no end (test_transport hubquick).
static bool recover(tcp *t, round_result *r, double t0) {
    char err[256], name[128];
    warn("diloco: lost the hub at %s during the exchange for %s: %s", t->hub,
         exchange_name(t, r->outer_step, name, sizeof name), dead_reason(t));
    disconnect(t);
    if (t->multi_hub) {
        r->sync_s = wall_seconds() - t0;
        return false;
    }
    bool back = connect_session(t, wall_seconds() + t->o.timeout_s, false, err, sizeof err);
    r->evicted = back;
    r->sync_s = wall_seconds() - t0;
    if (!back) warn("diloco: cannot reconnect to the hub at %s: %s", t->hub, err);
    return back;
}

static bool exchange_locked(tcp *t, int64_t outer_step, const payload_spec *spec, const uint8_t *payload,
                            round_result *r) {
    size_t bytes = payload_spec_up_bytes(spec);
    double t0 = wall_seconds();
    memset(r, 0, sizeof *r);
    r->outer_step = outer_step;
    if (!t->connected) {
        if (t->multi_hub) return false;   // as recover: the share goes to another hub
        char err[256];
        bool back = connect_session(t, t0 + t->o.timeout_s, false, err, sizeof err);
        if (!back) warn("diloco: cannot reconnect to the hub at %s: %s", t->hub, err);
        r->evicted = back;   // the hub dropped us when we went: rejoin
        r->sync_s = wall_seconds() - t0;
        return back;
    }
    if (!t->member) {
        r->evicted = true;
        return true;
    }
    if (!t->blackholed && fault_requested("tcp_blackhole", outer_step)) {
        blackhole(t);
        return recover(t, r, t0);
    }
    if (bytes > t->own_cap) {
        t->own = xrealloc(t->own, bytes);
        t->own_cap = bytes;
    }
    if (bytes) memcpy(t->own, payload, bytes);
    size_t mean_bytes = payload_spec_down_bytes(spec);
    if (mean_bytes > t->mean_cap) {
        t->mean = xrealloc(t->mean, mean_bytes);
        t->mean_cap = mean_bytes;
    }
    t->mean_total = mean_bytes;
    t->mean_received = 0;
    uint32_t chunk = (uint32_t)quant_encoded_bytes(spec->up_codec, spec->segment, spec->block);
    uint64_t sent0 = bytes_moved(t, true), recv0 = bytes_moved(t, false);
    t->cur_step = outer_step;
    t->have_round = t->evicted = false;
    t->no_work = spec->no_work;
    t->job_buf = t->own;
    t->job_total = t->job_end = bytes;
    t->job_chunk = chunk;
    t->job_next = 0;
    t->job_step = outer_step;
    t->job_kind = DATA_PAYLOAD;
    t->payload_open = true;
    // Test hooks (TRAIN_GPT_FAULT): tcp_slow_upload:K uploads the first half of round K's
    // payload, pauses 0.6 s, then the rest; tcp_die_in_upload:K uploads the first half,
    // waits 0.3 s (the hub passes it on), and SIGKILLs itself; tcp_die_in_upload_after_full:N
    // does the same in the first round after N rounds that every replica contributed to
    // (whatever their numbers: a test need not know when the group formed).
    bool slow = fault_requested("tcp_slow_upload", outer_step);
    bool die = fault_requested("tcp_die_in_upload", outer_step) ||
               fault_requested("tcp_die_in_upload_after_full", t->full_rounds);
    if (slow || die) t->job_end = bytes / 2 / chunk * chunk;
    wire_contribute c = {.outer_step = outer_step, .total_bytes = bytes, .chunk_bytes = chunk,
                         .up_keep = (uint32_t)quant_codec_keep(spec->up_codec),
                         .up_codec = (uint8_t)quant_codec_kind(spec->up_codec), .down_codec = (uint8_t)spec->down_codec,
                         .flags = (uint8_t)((spec->down_feedback ? WIRE_HUB_FEEDBACK : 0) |
                                            (t->multi_hub ? WIRE_MULTI_HUB : 0)),
                         .block = (uint32_t)spec->block,
                         .segment_values = (uint32_t)spec->segment, .bound = spec->bound,
                         .values = (uint64_t)spec->values,
                         .value_offset = (uint64_t)spec->offset, .model_values = (uint64_t)spec->model_values,
                         .tokens = spec->no_work ? 0 : spec->tokens ? spec->tokens : 1};
    uint8_t buf[WIRE_CONTRIBUTE_BYTES];
    char err[256];
    if (!send_control(t, WIRE_CONTRIBUTE, buf, wire_encode_contribute(&c, buf), err, sizeof err)) {
        post_dead(t, err);
        return recover(t, r, t0);
    }
    if (!pump(t, upload_finished)) return recover(t, r, t0);
    if (die) {
        sleep_s(0.3);
        raise(SIGKILL);
    }
    if (slow) {
        sleep_s(0.6);
        t->job_end = t->job_total;
        if (!pump(t, upload_finished)) return recover(t, r, t0);
    }
    if (fault_requested("tcp_trace", outer_step))
        note("diloco: trace: %s: own upload done at %.6f", exchange_name(t, outer_step, err, sizeof err),
             wall_seconds());
    t->payload_open = false;   // a catch-up transfer's state goes on while the mean comes back
    double uploaded = wall_seconds();
    // Test hook (TRAIN_GPT_FAULT=tcp_slow_read:K): a replica slow to read round K, so that
    // the others' next payloads could queue up behind this round's in its sockets.
    if (fault_requested("tcp_slow_read", outer_step)) sleep_s(0.3);
    if (!pump(t, round_done)) return recover(t, r, t0);
    r->wait_s = wall_seconds() - uploaded;
    r->bytes_sent = bytes_moved(t, true) - sent0;
    r->bytes_recv = bytes_moved(t, false) - recv0;
    if (t->evicted || !named_in_round(t)) {
        char name[128];
        warn("diloco: replica %d was dropped from %s by the hub at %s: %s", t->o.replica_id,
             exchange_name(t, outer_step, name, sizeof name), t->hub,
             t->evicted ? t->evicted_why : "not among the contributors");
        t->member = false;
        r->evicted = true;
        r->sync_s = wall_seconds() - t0;
        return true;
    }
    // Test hook (TRAIN_GPT_FAULT=tcp_lose_mean_after_full:N): in the first round after N rounds
    // that every replica contributed to, itself one, the replica loses its session as the
    // round's result is in: the hub counted its whole contribution, and it never applies the
    // mean (it reconnects and rejoins: test/test_diloco_late.sh, late work carried per fragment).
    if ((int)t->round.n == t->o.replicas && fault_requested("tcp_lose_mean_after_full", t->full_rounds)) {
        t->full_rounds++;   // once
        post_dead(t, "test hook tcp_lose_mean_after_full: the session died as the round's result came in");
        return recover(t, r, t0);
    }
    t->protocol_drops = 0;
    r->n = (int)t->round.n;
    for (int i = 0; i < r->n; i++) r->ids[i] = (int)t->round.ids[i];
    r->mean = t->mean;
    r->mean_bytes = mean_bytes;
    r->apply = (t->round.flags & ROUND_APPLY) && r->n >= t->o.min_replicas;
    r->send_state = (t->round.flags & ROUND_SEND_STATE) != 0;
    r->catch_up = r->send_state && (t->round.flags & ROUND_CATCHUP) != 0;
    r->sync_s = wall_seconds() - t0;
    if (r->n == t->o.replicas) t->full_rounds++;
    return true;
}

// The exchange holds the pump: a catch-up donor's sender waits, and the exchange's pump moves
// the state after its payload.
static bool tcp_exchange(void *impl, int64_t outer_step, const payload_spec *spec, const uint8_t *payload,
                         round_result *r) {
    tcp *t = impl;
    take_pump(t);
    bool ok = exchange_locked(t, outer_step, spec, payload, r);
    t->payload_open = false;
    pthread_mutex_unlock(&t->pump_lock);
    return ok;
}

// ---------------------------------------------------------------- the rest
// Test hook tcp_hold_state:0: the donor holds its state back until the hub ends the transfer
// (STATE_ABORT) or 10 × timeout_s pass: the path of a transfer ended before its donor began.
static double hold_state_until_s;
static bool hold_state_done(tcp *t) { return t->state_cut || wall_seconds() > hold_state_until_s; }

// A catch-up transfer (ROUND_CATCHUP): the state from a copy of each chunk as it is queued,
// then the means given to tcp_send_catchup, in slices of the pump: an exchange on another
// thread takes the pump between them (and moves the state after its payload). Returns when the
// hub ends the transfer (STATE_END: every joiner caught up and trains; STATE_ABORT), the session
// goes, the caller cancels, or a stop is requested.
static bool catchup_sender_done(tcp *t) { return t->cu_over || state_cancelled(t, t->cu_hooks); }
static void send_state_whole(tcp *t, const uint8_t *state, size_t bytes, const state_hooks *hooks);

// Called holding the pump, returns holding it (gives it up between slices).
static void send_state_catching_up(tcp *t, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    take_mail(t);   // a STATE_ABORT already here
    if (!t->connected || t->state_cut) {
        if (t->connected) note("diloco: replica %d sends no state: the hub ended the transfer before it began",
                               t->o.replica_id);
        t->state_cut = false;
        return;
    }
    uint64_t serial = t->session_serial;
    // Test hook tcp_slow_state:0 (as for a whole transfer): chunks of 128 KiB, one per 0.25 ×
    // timeout_s: a state that takes several inner phases to arrive.
    bool slow = fault_requested("tcp_slow_state", 0);
    t->cu_chunk = slow ? CHUNK_BYTES / 8 : CHUNK_BYTES;
    t->cu_slow_s = slow ? 0.25 * t->hub_timeout_s : 0;
    // Test hook tcp_slow_means:0: the catch-up means go at one chunk per 0.25 × timeout_s, slower
    // than the rounds close: the joiner never catches up (a stop while it waits for them).
    t->cu_slow_means_s = fault_requested("tcp_slow_means", 0) ? 0.25 * t->hub_timeout_s : 0;
    t->cu_next_chunk_s = 0;
    t->cu_buf = state;
    t->cu_total = bytes;
    t->cu_chunks = (bytes + t->cu_chunk - 1) / t->cu_chunk;
    t->cu_queued = 0;
    t->cu_step = t->designated_step;   // the round that made it the donor (an exchange may have come since)
    t->cu_hooks = hooks;
    t->cu_began_s = wall_seconds();
    t->cu_over = false;
    // The hub may have said already that no chunk will go again (relay --join_in_flight 0).
    t->cu_again_known = t->cu_again_early == 0;
    t->cu_again = t->cu_again_next = 0;
    t->cu_again_early = -1;
    t->cu_active = true;
    wire_state m = {.outer_step = t->cu_step, .total_bytes = bytes, .chunk_bytes = t->cu_chunk,
                    .donor_id = (uint32_t)t->o.replica_id, .flags = STATE_CATCHUP};
    uint8_t buf[WIRE_STATE_BYTES];
    char err[256];
    bool lost = false;
    if (!send_control(t, WIRE_STATE, buf, wire_encode_state(&m, buf), err, sizeof err)) {
        post_dead(t, err);
        lost = true;
    }
    if (hooks && hooks->began) hooks->began(hooks->arg);   // the owner's next exchange may come
    double said_s = wall_seconds(), every = t->hub_timeout_s > 1.0 ? t->hub_timeout_s : 1.0;
    while (!lost) {
        // Every hub timeout, how far the state is (its own clock: the exchanges pump in between).
        if (wall_seconds() - said_s >= every && t->cu_queued < t->cu_chunks) {
            char line[160];
            uint64_t queued = t->cu_queued * (uint64_t)t->cu_chunk;
            transfer_progress(queued < t->cu_total ? queued : t->cu_total, t->cu_total, t->cu_began_s, line,
                              sizeof line);
            note("diloco: replica %d sends its state to the joiners while the group goes on: %s", t->o.replica_id,
                 line);
            said_s = wall_seconds();
        }
        pump_result r = pump_until(t, catchup_sender_done, wall_seconds() + 0.2);
        if (r == PUMP_DONE) break;
        if (r == PUMP_DEAD || t->session_serial != serial || !t->connected) {
            lost = t->session_serial == serial && t->connected;
            break;
        }
        pthread_mutex_unlock(&t->pump_lock);   // an exchange or a landing may take the pump now
        while (atomic_load(&t->pump_wanted) > 0) sleep_s(0.001);
        pthread_mutex_lock(&t->pump_lock);
        if (t->session_serial != serial || !t->connected) break;   // it lost the session meanwhile
    }
    if (lost) {
        warn("diloco: lost the hub while sending our state: %s", dead_reason(t));
        disconnect(t);
    } else if (t->session_serial == serial && t->connected && !t->cu_over) {
        note("diloco: replica %d stops sending its state: it stops or leaves", t->o.replica_id);
    }
    t->cu_active = false;
    t->cu_over = true;
    t->cu_buf = NULL;
    t->cu_hooks = NULL;
    free_overlays(t);
    free_catchup_out(t);
}

static void tcp_send_state(void *impl, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    tcp *t = impl;
    take_pump(t);
    if (t->send_catchup) send_state_catching_up(t, state, bytes, hooks);   // the ROUND that made it the donor said so
    else send_state_whole(t, state, bytes, hooks);
    pthread_mutex_unlock(&t->pump_lock);
}

static void send_state_whole(tcp *t, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    if (!t->connected) return;
    if (fault_requested("tcp_hold_state", 0)) {
        note("diloco: trace: replica %d holds back its state (test hook)", t->o.replica_id);
        hold_state_until_s = wall_seconds() + 10 * t->hub_timeout_s;
        if (!pump(t, hold_state_done)) {
            warn("diloco: lost the hub while holding back our state: %s", dead_reason(t));
            disconnect(t);
            return;
        }
    }
    take_mail(t);   // a STATE_ABORT already here
    if (t->state_cut) {
        t->state_cut = false;
        note("diloco: replica %d sends no state: the hub ended the transfer before it began", t->o.replica_id);
        return;
    }
    wire_state m = {.outer_step = t->cur_step, .total_bytes = bytes, .chunk_bytes = CHUNK_BYTES,
                    .donor_id = (uint32_t)t->o.replica_id};
    uint8_t buf[WIRE_STATE_BYTES];
    char err[256];
    t->job_buf = state;
    t->job_total = t->job_end = bytes;
    t->job_next = 0;
    t->job_step = t->cur_step;
    t->job_kind = DATA_STATE;
    t->job_chunk = CHUNK_BYTES;
    t->job_began_s = wall_seconds();
    t->job_hooks = hooks;
    // Test hooks (TRAIN_GPT_FAULT): tcp_die_in_state:0, the donor dies halfway through;
    // tcp_slow_state:0, it sends chunks of 128 KiB, one per 0.25 × timeout_s: a link too slow for
    // the state to arrive within the round's deadline, never stalled for a timeout.
    bool die = fault_requested("tcp_die_in_state", 0);
    if (die) t->job_end = bytes / 2 / CHUNK_BYTES * CHUNK_BYTES;
    bool slow = fault_requested("tcp_slow_state", 0);
    t->job_slow_s = slow ? 0.25 * t->hub_timeout_s : 0;
    t->job_next_chunk_s = 0;
    if (slow) t->job_chunk = m.chunk_bytes = CHUNK_BYTES / 8;
    if (!send_control(t, WIRE_STATE, buf, wire_encode_state(&m, buf), err, sizeof err)) post_dead(t, err);
    else if (pump(t, state_sent_or_stopping)) {
        if (die) raise(SIGKILL);
        if (!upload_done(t)) {
            note("diloco: replica %d stops sending its state: it stops or leaves", t->o.replica_id);
            t->job_end = t->job_next;   // nothing more to feed; what is queued goes or is dropped
        }
        t->job_buf = NULL;
        t->job_slow_s = 0;
        t->job_hooks = NULL;
        return;
    }
    // The hub is gone: the next exchange reconnects and rejoins.
    warn("diloco: lost the hub while sending our state: %s", dead_reason(t));
    t->job_buf = NULL;
    t->job_total = t->job_next = t->job_end = 0;
    t->job_slow_s = 0;
    disconnect(t);
}

static bool tcp_agree_stop(void *impl, bool local_stop) {
    (void)impl;
    return local_stop;
}

static void tcp_free(tcp *t) {
    disconnect(t);
    if (t->served) {
        // The others may still be receiving the last round from this hub: let them finish
        // and leave (at most timeout_s) before it goes.
        double wait_s = t->o.timeout_s;
        if (!relay_wait_until_empty(t->served, 0.2)) {
            note("diloco: waiting up to %.0f s for the other replicas to leave the hub this replica serves", wait_s);
            if (!relay_wait_until_empty(t->served, wait_s))
                warn("diloco: stopping the hub with replicas still connected (they will skip rounds until they "
                     "reach another)");
        }
        relay_stop(t->served);
    }
    free(t->mean);
    free(t->own);
    memset(t->secret, 0, t->o.secret_bytes);
    free(t->secret);
    close(t->to_io[0]);
    close(t->to_io[1]);
    close(t->to_main[0]);
    close(t->to_main[1]);
    pthread_mutex_destroy(&t->ctl_send);
    pthread_mutex_destroy(&t->mailbox_lock);
    pthread_mutex_destroy(&t->pump_lock);
    free_patches(t);
    free(t->patches);
    free_overlays(t);
    free_catchup_out(t);
    free(t);
}

static void tcp_leave(void *impl, int64_t outer_step, bool finished) {
    tcp *t = impl;
    if (t->connected) {
        char err[256];
        wire_leave m = {.outer_step = outer_step, .reason = finished ? LEAVE_FINISHED : LEAVE_STOPPED};
        uint8_t buf[WIRE_LEAVE_BYTES];
        size_t n = wire_encode_leave(&m, buf);
        pthread_mutex_lock(&t->ctl_send);
        conn_send(&t->ctl, WIRE_LEAVE, buf, n, NULL, 0, NULL);
        double grace = t->hub_timeout_s < 2 ? t->hub_timeout_s : 2;
        if (!conn_flush_until(&t->ctl, wall_seconds() + grace, err, sizeof err))
            warn("diloco: could not say goodbye to the hub at %s: %s", t->hub, err);
        pthread_mutex_unlock(&t->ctl_send);
    }
    tcp_free(t);
}

static void tcp_close(void *impl) { tcp_free(impl); }

// The means a catch-up join took, rounds state + 1 .. STATE_END's (patched_through checked they
// are all here; hand_catchup gave them to the sink in order).
static int tcp_catchup_count(void *impl) {
    tcp *t = impl;
    return t->state_catchup && t->state_end_known ? (int)(t->state_end_round - state_landing(t)) : 0;
}

static int tcp_catchup_held(void *impl, uint64_t *bytes) {
    tcp *t = impl;
    *bytes = t->held_max_bytes;
    return t->held_max;
}

// A sharded joiner's rank behind its others, after its catch-up join: CAUGHT_UP(round) again,
// then the means up to the hub's answer (or a STATE_ABORT: the join is off).
static bool extended(tcp *t) {
    return !t->state_catchup || (t->state_end_known && patched_through(t) >= t->state_end_round);   // or aborted
}

// CAUGHT_UP(round) again: this joiner takes the means up to `round` (its other ranks' or hubs'
// last). false: the session is lost.
static bool say_caught_up_to(tcp *t, int64_t round) {
    uint8_t buf[8];
    char err[256], a[48];
    if (!send_control(t, WIRE_CAUGHT_UP, buf, wire_encode_step(round, buf), err, sizeof err)) return false;
    note("diloco: replica %d takes the means up to %s%s", t->o.replica_id, landing_name(t, round, a, sizeof a),
         t->multi_hub ? "" : ", as its other ranks");
    return true;
}

static int64_t tcp_catchup_extend(void *impl, int64_t round) {
    tcp *t = impl;
    take_pump(t);
    take_mail(t);   // a STATE_ABORT already here
    int64_t end = -1;
    bool first = round < 0;   // the deferred first CAUGHT_UP (defer_caught_up), once every rank has its state
    if (first && !t->state_catchup && !t->catchup_aborted) {
        end = -2;   // a whole transfer's state
    } else if (t->connected && (first ? t->caught_up_deferred : t->state_catchup && t->state_end_known)) {
        t->want_state = true;
        t->state_end_known = false;
        bool said = first ? say_caught_up(t) : say_caught_up_to(t, round);
        bool alive = said && pump(t, extended);
        if (alive && t->state_catchup) end = t->state_end_round;   // not STATE_ABORT
        t->want_state = false;
        // A STATE_ABORT (the donor left or stalled) keeps the session: the caller joins again
        // through it. (It was taken for a lost hub: the session cut, and with several hubs a
        // live primary marked dead, its shares moved to the other hubs.)
        if (!alive) {
            note("diloco: lost the hub at %s while catching up (%s)", t->hub, dead_reason(t));
            disconnect(t);
        }
    }
    pthread_mutex_unlock(&t->pump_lock);
    return end;
}

static int whole_patches(const tcp *t) {
    int n = 0;
    for (int i = 0; i < t->n_patches; i++) n += t->patches[i].received == t->patches[i].total;
    return n;
}

static bool never_done(tcp *t) { return false; }

// transport_poll: a sharded joiner's rank whose join returned with its state before its other
// ranks' (caught_up_deferred) takes the means its hub forwards while it waits for them.
static void tcp_poll(void *impl, double seconds) {
    tcp *t = impl;
    double until_s = wall_seconds() + seconds;
    take_pump(t);
    bool read = t->connected && t->caught_up_deferred;
    if (read) {
        int before = whole_patches(t);
        read = pump_until(t, never_done, until_s) != PUMP_DEAD;
        t->means_while_deferred += whole_patches(t) - before;
    }
    pthread_mutex_unlock(&t->pump_lock);
    if (!read && until_s > wall_seconds()) sleep_s(until_s - wall_seconds());
}

void tcp_hub_poll(tcp_hub *t, double seconds) { tcp_poll(t, seconds); }

static bool tcp_join_waited(void *impl) { return ((tcp *)impl)->join_waited; }
bool tcp_hub_join_waited(const tcp_hub *t) { return t->join_waited; }
void tcp_hub_clear_waited(tcp_hub *t) { t->join_waited = false; }

static const transport_ops tcp_ops = {
    .name = "tcp",
    .join = tcp_join,
    .rejoin = tcp_join,
    .exchange = tcp_exchange,
    .send_state = tcp_send_state,
    .agree_stop = tcp_agree_stop,
    .leave = tcp_leave,
    .close = tcp_close,
    .preserve_state = tcp_preserve_state,
    .send_catchup = tcp_send_catchup,
    .catchup_count = tcp_catchup_count,
    .catchup_held = tcp_catchup_held,
    .catchup_extend = tcp_catchup_extend,
    .poll = tcp_poll,
    .join_waited = tcp_join_waited,
};

// With serve and a wildcard listen address, the replica reaches its own hub on loopback.
static void own_hub_address(const char *rendezvous, int port, char *out, size_t out_bytes) {
    char host[256], port_s[16], err[200];
    if (!net_split_host_port(rendezvous, host, sizeof host, port_s, sizeof port_s, err, sizeof err))
        fail("diloco_rendezvous: %s", err);
    bool wildcard = !host[0] || !strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
    if (wildcard) snprintf(out, out_bytes, "127.0.0.1:%d", port);
    else if (strchr(host, ':')) snprintf(out, out_bytes, "[%s]:%d", host, port);
    else snprintf(out, out_bytes, "%s:%d", host, port);
}

// Checks the options and allocates a session with the hub at address (not connected).
static tcp *tcp_new(const transport_options *o, const char *address) {
    wire_init();
    if (!o->secret || o->secret_bytes == 0) fail("diloco_secret_file: no secret");
    if (o->replicas < 1 || o->replicas > WIRE_MAX_REPLICAS || o->replica_id < 0 || o->replica_id >= o->replicas)
        fail("diloco_replica_id %d is not in 0..%d", o->replica_id, o->replicas - 1);
    if (o->streams < 1 || o->streams > WIRE_MAX_STREAMS) fail("diloco_streams %d is not in 1..%d", o->streams, WIRE_MAX_STREAMS);
    if (!(o->timeout_s > 0)) fail("diloco_timeout_s must be positive");
    tcp *t = xcalloc(1, sizeof *t);
    t->o = *o;
    t->secret = xmalloc(o->secret_bytes);
    memcpy(t->secret, o->secret, o->secret_bytes);
    t->o.secret = t->secret;
    t->o.rendezvous = NULL;   // not kept: the caller's string
    t->hub_timeout_s = o->timeout_s;
    t->heartbeat_s = o->timeout_s / 4 < 2.0 ? o->timeout_s / 4 : 2.0;
    t->ctl.fd = -1;
    t->cu_again_early = -1;
    t->foreign_chunk = fault_requested("tcp_foreign_chunk", 0);
    for (int s = 0; s < WIRE_MAX_STREAMS; s++) t->data[s].fd = -1;
    pthread_mutex_init(&t->ctl_send, NULL);
    pthread_mutex_init(&t->mailbox_lock, NULL);
    pthread_mutex_init(&t->pump_lock, NULL);
    if (pipe2(t->to_io, O_NONBLOCK | O_CLOEXEC) != 0 || pipe2(t->to_main, O_NONBLOCK | O_CLOEXEC) != 0)
        fail("tcp transport: pipe: %s", strerror(errno));
    snprintf(t->hub, sizeof t->hub, "%s", address);
    t->hubs = 1;
    return t;
}

void transport_tcp_check_built(void) {}
bool transport_tcp_built(void) { return true; }

transport *transport_tcp_open(const transport_options *o) {
    if (!o->rendezvous || !o->rendezvous[0]) fail("diloco_rendezvous: must be host:port of the hub");
    if (strchr(o->rendezvous, ',')) return transport_hubs_open(o);
    char host[256], port[16], bad[400];  // malformed: at once, not after connect_timeout_s of retries
    if (!net_split_host_port(o->rendezvous, host, sizeof host, port, sizeof port, bad, sizeof bad))
        fail("diloco_rendezvous: %s", bad);
    tcp *t = tcp_new(o, o->rendezvous);
    if (o->serve) {
        relay_options ro = {.listen = o->rendezvous, .secret = o->secret, .secret_bytes = o->secret_bytes,
                            .timeout_s = o->timeout_s, .min_replicas = o->min_replicas, .replicas = o->replicas,
                            .catch_up = true, .join_in_flight = true, .log = stderr};
        char err[400];
        t->served = relay_start_thread(&ro, err, sizeof err);
        if (!t->served) fail("diloco_serve: cannot run the hub on %s: %s", o->rendezvous, err);
        own_hub_address(o->rendezvous, relay_port(t->served), t->hub, sizeof t->hub);
    }
    char err[256];
    // Stopped meanwhile: the join says so (JOIN_STOPPED) without trying again.
    if (connect_session(t, wall_seconds() + o->connect_timeout_s, true, err, sizeof err))
        note("diloco: replica %d connected to the hub at %s (%d data streams)", o->replica_id, t->hub, o->streams);
    else if (!stop_requested(t))
        fail_with_status(unreached_status(t),
                         "cannot reach the hub at %s within diloco_connect_timeout_s = %g s: %s%s", t->hub,
                         o->connect_timeout_s, err, unreached_hint(t));
    return transport_wrap(&tcp_ops, t);
}

// ---------------------------------------------------------------- one hub of several
tcp_hub *tcp_hub_new(const transport_options *o, const char *address, int index, int hubs) {
    tcp *t = tcp_new(o, address);
    t->multi_hub = hubs > 1;
    t->hub_index = index;
    t->hubs = hubs;
    return t;
}

const char *tcp_hub_address(const tcp_hub *t) { return t->hub; }
bool tcp_hub_connected(const tcp_hub *t) { return t->connected; }

bool tcp_hub_connect(tcp_hub *t, double deadline, bool quiet, bool stoppable, char *err, size_t err_bytes) {
    t->quiet = quiet;
    bool ok = connect_session(t, deadline, stoppable, err, err_bytes);
    t->quiet = false;
    return ok;
}

static bool hub_join_locked(tcp_hub *t, const replica_status *s, uint8_t *state, size_t state_capacity,
                            size_t *state_bytes, join_result *result, int64_t *state_round);

bool tcp_hub_join(tcp_hub *t, const replica_status *s, uint8_t *state, size_t state_capacity, size_t *state_bytes,
                  join_result *result, int64_t *state_round) {
    take_pump(t);
    bool ok = hub_join_locked(t, s, state, state_capacity, state_bytes, result, state_round);
    pthread_mutex_unlock(&t->pump_lock);
    return ok;
}

static bool hub_join_locked(tcp_hub *t, const replica_status *s, uint8_t *state, size_t state_capacity,
                            size_t *state_bytes, join_result *result, int64_t *state_round) {
    char err[256];
    if (!t->connected) return false;
    t->joined = 0;
    t->want_state = true;
    t->state_buf = state;
    t->state_cap = state_capacity;
    reset_state_progress(t);
    wire_status st = {.outer_step = s->outer_step, .param_hash = s->param_hash};
    uint8_t buf[WIRE_JOIN_BYTES];
    // Test hook (TRAIN_GPT_FAULT=tcp_join_late:0): one rank of a sharded replica joins 1.5 s
    // after the others, so that its hub takes its donor's state at a later close than theirs.
    if (fault_requested("tcp_join_late", 0)) sleep_s(1.5);
    bool sent = send_control(t, WIRE_JOIN, buf, wire_encode_status(&st, buf), err, sizeof err);
    t->join_sent_s = t->join_said_s = wall_seconds();
    bool ok = sent && pump(t, join_done);
    // A catch-up state whose CAUGHT_UP waits for this replica's other ranks: its means are still
    // taken (transport_catchup_extend(t, -1) says it).
    t->caught_up_deferred = ok && t->o.defer_caught_up && t->state_catchup && !t->caught_up_sent &&
                            t->state_started && t->state_received == t->state_total;
    t->want_state = false;
    t->state_buf = NULL;
    if (!ok) {
        note("diloco: lost the hub at %s while joining (%s)", t->hub, sent ? dead_reason(t) : err);
        disconnect(t);
        return false;
    }
    if (t->joined == JOINED_FINISHED) {
        *result = JOIN_FINISHED;
        return true;
    }
    // A catch-up state is taken once its means up to STATE_END's round are here too (or, its
    // CAUGHT_UP deferred, once the state is: they come in transport_catchup_extend); a stop in
    // between (hours at 14B) leaves the join, whatever means were applied to the state.
    bool got_state = t->state_started && t->state_received == t->state_total &&
                     (!t->state_catchup || t->caught_up_deferred ||
                      (t->state_end_known && patched_through(t) >= t->state_end_round));
    if (t->joined != JOINED_MEMBER && !got_state) {   // stop_requested: not joined
        note("diloco: replica %d stops while its join waits for the hub at %s", t->o.replica_id, t->hub);
        *result = JOIN_STOPPED;
        return true;
    }
    t->member = true;
    *result = t->joined == JOINED_MEMBER ? JOIN_MEMBER : JOIN_GOT_STATE;
    if (*result == JOIN_GOT_STATE) {
        *state_bytes = (size_t)t->state_total;
        *state_round = t->state_step;
    }
    return true;
}

static bool joined_member(tcp *t) { return t->joined == JOINED_MEMBER; }

bool tcp_hub_follow(tcp_hub *t, const replica_status *s, int64_t first_round, bool caught_up, int64_t *from_round) {
    char err[256];
    if (!t->connected) return false;
    t->joined = 0;
    wire_follow f = {.outer_step = s->outer_step, .param_hash = s->param_hash, .first_round = first_round,
                     .flags = caught_up ? FOLLOW_CATCHUP : 0};
    uint8_t buf[WIRE_FOLLOW_BYTES];
    bool sent = send_control(t, WIRE_FOLLOW, buf, wire_encode_follow(&f, buf), err, sizeof err);
    if (!sent || !pump(t, joined_member)) {
        note("diloco: lost the hub at %s while following it (%s)", t->hub, sent ? dead_reason(t) : err);
        disconnect(t);
        return false;
    }
    t->member = true;
    if (from_round) *from_round = t->joined_step;
    return true;
}

bool tcp_hub_follow_now(tcp_hub *t, const replica_status *s, int64_t first_round) {
    char err[256];
    if (!t->connected) return false;
    wire_follow f = {.outer_step = s->outer_step, .param_hash = s->param_hash, .first_round = first_round};
    uint8_t buf[WIRE_FOLLOW_BYTES];
    if (!send_control(t, WIRE_FOLLOW, buf, wire_encode_follow(&f, buf), err, sizeof err)) {
        post_dead(t, err);
        return false;
    }
    t->member = true;
    return true;
}

bool tcp_hub_exchange(tcp_hub *t, int64_t round, const payload_spec *spec, const uint8_t *payload, round_result *r) {
    return tcp_exchange(t, round, spec, payload, r);
}

bool tcp_hub_sends_catchup(const tcp_hub *t) { return t->send_catchup; }
void tcp_hub_preserve_state(tcp_hub *t, size_t offset, size_t bytes) { tcp_preserve_state(t, offset, bytes); }
void tcp_hub_send_catchup(tcp_hub *t, int64_t landing, const uint8_t *bytes, size_t n) {
    tcp_send_catchup(t, landing, bytes, n);
}
bool tcp_hub_took_catchup(const tcp_hub *t) { return t->state_catchup; }
int tcp_hub_catchup_count(tcp_hub *t) { return tcp_catchup_count(t); }
int tcp_hub_catchup_held(tcp_hub *t, uint64_t *bytes) { return tcp_catchup_held(t, bytes); }
int64_t tcp_hub_catchup_extend(tcp_hub *t, int64_t landing) { return tcp_catchup_extend(t, landing); }

bool tcp_hub_done(tcp_hub *t, int64_t outer_step, bool completed) {
    char err[256];
    if (!t->connected) return false;
    wire_done d = {.outer_step = outer_step, .result = completed ? DONE_COMPLETE : DONE_GAVE_UP};
    uint8_t buf[WIRE_DONE_BYTES];
    if (!send_control(t, WIRE_DONE, buf, wire_encode_done(&d, buf), err, sizeof err)) {
        post_dead(t, err);
        return false;
    }
    return true;
}

bool tcp_hub_hold(tcp_hub *t, bool begin) {
    char err[256];
    if (!t->connected) return false;
    uint8_t buf[WIRE_HOLD_BYTES];
    if (!send_control(t, WIRE_HOLD, buf, wire_encode_hold(begin ? HOLD_BEGIN : HOLD_END, buf), err, sizeof err)) {
        post_dead(t, err);
        return false;
    }
    return true;
}

void tcp_hub_send_state(tcp_hub *t, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    tcp_send_state(t, state, bytes, hooks);
}
void tcp_hub_disconnect(tcp_hub *t) { disconnect(t); }
void tcp_hub_leave(tcp_hub *t, int64_t outer_step, bool finished) { tcp_leave(t, outer_step, finished); }
void tcp_hub_free(tcp_hub *t) { tcp_free(t); }
