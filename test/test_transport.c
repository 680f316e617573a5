// test/test_transport.c — the tcp transport end to end on loopback, with real processes:
// a hub (`relay_main`, the code behind `train_gpt relay`) and replicas that are fork()ed
// processes running transport_tcp_open → join → exchange... → leave, so that kill -9 and
// SIGSTOP hit a real process. Each replica reports every event on one line through a pipe;
// the test orchestrates the faults and checks the lines and the hub's log.
//
// The hub reduces: a replica uploads its payload (segmented, llmc/quant.h) and gets back one
// encoded mean. Unless a scenario says otherwise a payload is fp32 (codec none both ways) of
// small integers that depend on (replica, step, index) only, so every sum is exact and each
// replica checks the mean it received, value for value, against the mean over the
// contributors ROUND names; the mean's bytes are the same on every replica of a round.
//
//   reduce     3 replicas, 3 streams, payloads of ~3 MB (49 segments, the last one short):
//              every replica gets the exact mean of the three, the same bytes, and receives
//              about what it sent
//   mean       int8 up, int8 down with the hub's error feedback, 4 segments: every mean is
//              byte-exact the test's own reference (decode, fp32 sum in id order, division,
//              encode with a residual carried across rounds); a contribution with a NaN in one
//              segment is left out of that segment's mean only; receive traffic <= 1.1 x sent
//   kill9      kill -9 a replica: the others' next exchange closes with n = 2 within
//              timeout + 5 s (killed mid-upload, it may be in a prefix of that round's
//              segments, never in a later one); restarted with a stale status, it receives
//              the donor's state byte-exact and contributes again
//   sigstop    SIGSTOP a replica: evicted within the timeout (its heartbeats stop); after
//              SIGCONT it finds itself evicted, rejoins through a state transfer, contributes
//   late       a replica alive but late for a round: evicted timeout_s after the first
//              contribution began, rejoins
//   stopjoin   SIGTERM while the hub holds a replica's join (a quorum that never comes): the
//              join returns JOIN_STOPPED (transport_options.stop), the replica leaves, exit 0
//   slowread   a replica slow to read its rounds among fast ones: every round is exact on
//              every replica (the reduction waits for its backlog)
//   cutthrough the hub reduces segments as they arrive: a replica receives the first segment
//              of the mean before a slow uploader's upload is done
//   cutkill    a replica killed mid-upload is in the mean of a prefix of the segments (those
//              reduced before it died; not empty, since the others had sent theirs) and in no
//              later one; ROUND does not name it; back, it rejoins through the state; killed in
//              round 0 and back at once, it may not contribute to that round again
//   size       a payload of another size, and one of the same size encoded differently: both
//              evicted from the round and logged, the round goes on without them
//   donor      the donor dies halfway through the state: the next round's donor sends it
//   slowstate  a state that takes about 5.7 x timeout_s to arrive (tcp_slow_state): the hub holds the
//              round for its donor and joiner instead of evicting them as late, the others'
//              uploads held back meanwhile are not taken for a stuck hub (HEARTBEAT_HOLD), no
//              exchange fails, the joiner gets the state and the next round has all three
//   slowstate2 the same with two hubs: the other hub holds its rounds for the donor too (HOLD)
//   slowcut    the same with the relay's --max_hold_s 3: the hub cuts the transfer after 3 s, the
//              joiner waits again, the donor stops sending and goes on, not dropped or evicted;
//              after a cut the joiner gets no donor for 2, 4, .. closes (the group goes on unheld)
//   slowgone   the joiner of a slow state is killed: the hub stops the transfer (no joiner left)
//              and tells the donor, instead of holding the round for a state nobody gets
//   heldgone   the same before the donor began to send (tcp_hold_state): it sends nothing
//   refound    the late replica comes back to an empty group and founds it anew at its step
//   restart    the hub is killed and restarted: exchanges fail (skipped), then everyone
//              reconnects, rejoins and goes on
//   blackhole  the path to a hub whose timeout_s is longer than the replicas' goes dead without a
//              FIN (tcp_blackhole): the hub refuses the replica's reconnection as a duplicate of
//              its old session meanwhile; the replica skips the step, rejoins and finishes, exit 0
//   slowsetup  a replica whose name lookups are slow (tcp_slow_resolve) and one whose data streams
//              are slow to set up (tcp_slow_stream), 4 streams each, the setup longer than the hub's
//              timeout_s: both connect at their first try (one lookup; heartbeats meanwhile), train
//   leave      transport_leave: dropped at once (no timeout); min_replicas 3 → apply = false
//   evil       while two replicas train: a wrong secret, garbage, a truncated frame, a length
//              of 2^63, a bad tag, a replayed frame, an unknown session, a wrong
//              fingerprint, a duplicate id, a silent connection, a fake hub → each refused
//              and logged, nobody crashes, the two replicas finish every round exact
//   serve      a replica hosting the hub in a thread (diloco_serve)
//   hubs       two hubs (diloco_rendezvous = a,b), each reducing half of the segments: every
//              mean exact and the same bytes on every replica; each hub logs its share's rounds
//   hubsmean   two hubs, int8 both ways with each hub's error feedback on its share: every mean
//              byte-exact the reference with one residual over the whole model (one hub's); each
//              hub allocates the residual of its share only
//   hubkill    two hubs; kill -9 the first: every exchange completes through the second within
//              timeout + 5 s; restarted on its port it takes its share again (a round of all three)
//   hubmixed   two hubs; the second dies after sending one replica its round's ROUND
//              (relay_die_in_close): that replica takes the step, the others are evicted and take
//              its state; no step taken from two rounds or twice; restarted, it takes its share
//   hubs3      three hubs; kill -9 the second, then the third: the shares move on within
//              timeout + 5 s; a replica listing the hubs in another order is refused (one line);
//              restarted, each takes its share again
//   hubfew     two hubs, a payload of one segment (the second hub has no share): 80 steps, and
//              the share-less hub drops nobody (its DONE bound once dropped all at step 65)
//   hubfewkill the same; kill -9 the first hub after step 70: share 0 moves to the second,
//              nobody is evicted (but, if the kill fell in a close, the mixed case's losers)
//   hubquick   three hubs; kill -9 the second and restart it on its port at once (a supervisor's
//              restart, within timeout_s), three times: the replicas go on, nobody evicted (each
//              replica reconnected inside the exchange, took the step as evicted, and the group,
//              founded again, had its other shares refused as closed for ever)
//   hubtwo     three hubs; kill -9 the second and third together: both shares move to the first;
//              restarted, each takes its share again
//   hubboth    two hubs, both kill -9'd and restarted at once: the replicas rejoin and go on
//   cli        relay_main's argument errors
// `build/test_transport NAME` runs one scenario; TEST_TRANSPORT_KEEP=1 keeps the logs.
#include "llmc/common.h"
#include "llmc/quant.h"
#include "net/conn.h"
#include "net/socket.h"
#include "net/relay.h"
#include "net/transport.h"
#include "net/wire.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define TIMEOUT_S 2.0
#define STATE_BYTES 3000000   // three 1 MiB chunks: a donor can die halfway
#define MAX_LINES 4000
#define SEGMENT_VALUES (1 << 14)   // fp32 payloads: segments (= chunks) of 64 KiB
#define MAX_IDS 8                  // replica ids of these tests are below this

static char dir[256];
static char secret_path[300];
static const char SECRET[] = "test-secret-0123456789abcdef";
static const uint64_t FINGERPRINT = 0x5eed5eed5eedull;

// ---------------------------------------------------------------- deterministic bytes
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = splitmix(&s);
        memcpy(p + i, &v, 8);
    }
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, n - i);
}

// Values in a payload of `base` bytes of fp32: not a whole number of segments (the last
// one is short).
static int64_t payload_values(size_t base) { return (int64_t)(base / 4) + 3087; }
static uint64_t status_hash(int64_t k) { return (uint64_t)k * 0x9e3779b97f4a7c15ull ^ 0xabc; }

// Replica id's outer gradient at step k: integers in [-1000, 1000] (fp32 sums of a few of
// them are exact, whatever the order).
static void make_values(float *x, int64_t n, int id, int64_t k) {
    uint64_t seed = ((uint64_t)id * 1000003 + (uint64_t)k * 7919 + 1) * 0xd1b54a32d192ed03ull;
    for (int64_t i = 0; i < n; i++) {
        uint64_t s = seed + (uint64_t)i;
        x[i] = (float)((int)(splitmix(&s) % 2001) - 1000);
    }
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// The state after outer step k: k, then bytes that depend on k only.
static void make_state(uint8_t *p, int64_t k) {
    memcpy(p, &k, 8);
    fill(p + 8, STATE_BYTES - 8, 777 + (uint64_t)k);
}

// ---------------------------------------------------------------- a replica process
typedef struct {
    int id, replicas, min_replicas, streams;
    // the payload (payload_spec): values, segment, block, codecs
    int64_t values, segment, block;
    int up, down;              // quant_kind
    bool feedback;             // the hub's error feedback on the mean
    int partial;               // a replica that may be in a prefix of the mean's segments without
                               // being named (killed or stopped mid-upload); -1: none; ANY_SHARE:
                               // any one replica may be in any segment without being named (with
                               // several hubs, dropped from one share's round after another's closed)
    int nan_id;                // replica nan_id puts a NaN at value nan_index of its step nan_step
    int64_t nan_step, nan_index;
    bool check_traffic;        // bytes received <= 1.1 x bytes sent
    int64_t steps;             // exchanges up to this outer step
    int64_t start_step;        // its status at start (stale on a restart)
    double inner_s;            // "training" between exchanges
    int64_t slow_at;           // before this step's exchange, trains slow_s instead (-1: never)
    double slow_s;
    int64_t leave_at;          // leaves once at this step (-1: never)
    const char *stop_file;     // leaves before the exchange after this file appears (NULL: never)
    bool serve;
    const char *rendezvous;
    const uint8_t *secret;
    size_t secret_bytes;
    uint64_t fingerprint;
    double connect_timeout_s;
    double timeout_s;          // 0: TIMEOUT_S
} replica_cfg;

static int report_fd = -1;

static void PRINTF_LIKE(1, 2) report(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t ignored = write(report_fd, line, (size_t)n);   // < PIPE_BUF: atomic
    (void)ignored;
}

// A line for an event other than a round.
static void report_event(int id, const char *ev, int64_t k, bool ok, double dt) {
    report("R%d %s k=%lld n=0 ids=- apply=0 state=0 ok=%d dt=%.3f pre=0 h=0", id, ev, (long long)k, ok, dt);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// Takes the state a join returned: reports whether it is byte-exact the state of its step.
static int64_t adopt(int id, const uint8_t *state, size_t bytes, const char *how) {
    int64_t k = -1;
    static uint8_t expect[STATE_BYTES];
    bool ok = bytes == STATE_BYTES;
    if (ok) {
        memcpy(&k, state, 8);
        make_state(expect, k);
        ok = k >= 0 && memcmp(expect, state, STATE_BYTES) == 0;
    }
    report_event(id, how, k, ok, 0);
    return k;
}

static payload_spec spec_of(const replica_cfg *c) {
    return (payload_spec){.up_codec = c->up, .down_codec = c->down, .down_feedback = c->feedback,
                          .block = c->block, .segment = c->segment, .values = c->values, .offset = 0,
                          .model_values = c->values};
}

// The payload replica id sends for step k (x: scratch of c->values floats).
static void encode_payload(const replica_cfg *c, int id, int64_t k, float *x, uint8_t *enc) {
    make_values(x, c->values, id, k);
    if (id == c->nan_id && k == c->nan_step) x[c->nan_index] = NAN;
    quant_encode_segments((quant_kind)c->up, x, NULL, c->values, c->block, c->segment, enc);
}

// What replica id sent for step k, decoded again: the values the hub averages.
static void contribution_of(const replica_cfg *c, int id, int64_t k, float *x, uint8_t *enc, float *decoded) {
    encode_payload(c, id, k, x, enc);
    quant_decode_segments((quant_kind)c->up, enc, c->values, c->block, c->segment, decoded);
}

static bool all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

// The reference mean of one segment over the contributors set[0..count) (ascending ids), as
// the hub must compute it: a contribution with NaN/Inf in the segment is left out, the others
// are summed in fp32 in ascending id, the sum divided by their count (one fp32 division, none
// for one), then encoded in the downlink codec, with error feedback on residual[len] (NULL: none).
static void reference_segment(const replica_cfg *c, float *const *decoded, const int *set, int count, int64_t s0,
                              int64_t len, float *mean, float *residual, uint8_t *out) {
    int kept = 0;
    for (int j = 0; j < count; j++) {
        const float *v = decoded[set[j]] + s0;
        if (!all_finite(v, len)) continue;
        if (kept == 0) memcpy(mean, v, (size_t)len * sizeof(float));
        else
            for (int64_t i = 0; i < len; i++) mean[i] = mean[i] + v[i];
        kept++;
    }
    if (kept == 0) {
        for (int64_t i = 0; i < len; i++) mean[i] = NAN;
        residual = NULL;
    }
    if (kept > 1) {
        float divisor = (float)kept;
        for (int64_t i = 0; i < len; i++) mean[i] = mean[i] / divisor;
    }
    if (residual) quant_encode_feedback((quant_kind)c->down, mean, residual, len, c->block, out);
    else quant_encode((quant_kind)c->down, mean, len, c->block, out);
}

// A replica's check of the mean it received for step k: every segment is the reference mean
// over the contributors ROUND names, or, for a prefix of the segments only, over those and
// c->partial (its upload was cut off after the hub had reduced those segments). *with: the
// length of that prefix. residual: the reference's copy of the hub's downlink residual
// (updated; NULL without feedback).
typedef struct {
    float *x, *decoded[MAX_IDS], *mean, *res;
    uint8_t *enc, *out;
} scratch;

#define ANY_SHARE (-2)

// With several hubs: each segment is the reference over the named contributors and maybe
// others (whole at one hub's round, cut from another's: the replicas named are those whole in
// every share). *with: segments with others. Without a residual (exact fp32 sums of small
// integers).
static bool check_mean_any(const replica_cfg *c, scratch *w, int64_t k, const round_result *r, int *with) {
    int named[MAX_IDS], n = 0;
    for (int i = 0; i < r->n; i++) {
        if (r->ids[i] < 0 || r->ids[i] >= MAX_IDS) return false;
        named[n++] = r->ids[i];
    }
    for (int id = 0; id < c->replicas && id < MAX_IDS; id++) {
        if (!w->decoded[id]) w->decoded[id] = xmalloc((size_t)c->values * sizeof(float));
        contribution_of(c, id, k, w->x, w->enc, w->decoded[id]);
    }
    size_t seg_bytes = quant_encoded_bytes((quant_kind)c->down, c->segment, c->block);
    for (int64_t s0 = 0, seg = 0; s0 < c->values; s0 += c->segment, seg++) {
        int64_t len = c->values - s0 < c->segment ? c->values - s0 : c->segment;
        size_t bytes = quant_encoded_bytes((quant_kind)c->down, len, c->block);
        const uint8_t *got = r->mean + (size_t)seg * seg_bytes;
        bool match = false;
        unsigned all = 0, named_mask = 0;
        for (int id = 0; id < c->replicas && id < MAX_IDS; id++) all |= 1u << id;
        for (int i = 0; i < n; i++) named_mask |= 1u << named[i];
        for (unsigned set_mask = 0; set_mask <= all && !match; set_mask++) {
            if ((set_mask & named_mask) != named_mask || (set_mask & ~all) || !set_mask) continue;
            int set[MAX_IDS], m = 0;
            for (int id = 0; id < MAX_IDS; id++)
                if (set_mask & (1u << id)) set[m++] = id;
            reference_segment(c, w->decoded, set, m, s0, len, w->mean, NULL, w->out);
            match = memcmp(w->out, got, bytes) == 0;
            if (match && set_mask != named_mask) (*with)++;
        }
        if (!match) {
            fprintf(stderr, "test: replica %d: step %lld: segment %lld of the mean is no reference\n", c->id,
                    (long long)k, (long long)seg);
            return false;
        }
    }
    return true;
}

static bool check_mean(const replica_cfg *c, scratch *w, int64_t k, const round_result *r, float *residual,
                       int *with) {
    *with = 0;
    if (c->partial == ANY_SHARE) return r->mean && check_mean_any(c, w, k, r, with);
    payload_spec sp = spec_of(c);
    if (r->mean_bytes != payload_spec_down_bytes(&sp) || !r->mean) return false;
    int named[MAX_IDS], n = 0, both[MAX_IDS], nb = 0;
    bool partial = c->partial >= 0;
    for (int i = 0; i < r->n; i++) {
        if (r->ids[i] < 0 || r->ids[i] >= MAX_IDS || n == MAX_IDS) return false;
        named[n++] = r->ids[i];
        partial &= r->ids[i] != c->partial;
    }
    for (int i = 0; i < n; i++) {
        if (partial && c->partial < named[i] && (i == 0 || c->partial > named[i - 1])) both[nb++] = c->partial;
        both[nb++] = named[i];
    }
    if (partial && (n == 0 || c->partial > named[n - 1])) both[nb++] = c->partial;
    for (int i = 0; i < nb; i++) {
        int id = both[i];
        if (!w->decoded[id]) w->decoded[id] = xmalloc((size_t)c->values * sizeof(float));
        contribution_of(c, id, k, w->x, w->enc, w->decoded[id]);
    }
    bool in_prefix = partial, ok = true;
    size_t seg_bytes = quant_encoded_bytes((quant_kind)c->down, c->segment, c->block);
    for (int64_t s0 = 0, seg = 0; s0 < c->values && ok; s0 += c->segment, seg++) {
        int64_t len = c->values - s0 < c->segment ? c->values - s0 : c->segment;
        size_t bytes = quant_encoded_bytes((quant_kind)c->down, len, c->block);
        const uint8_t *got = r->mean + (size_t)seg * seg_bytes;
        bool match = false;
        for (int variant = 0; variant < (in_prefix ? 2 : 1) && !match; variant++) {
            float *res = NULL;
            if (residual) {
                res = w->res;
                memcpy(res, residual + s0, (size_t)len * sizeof(float));
            }
            if (variant == 0) reference_segment(c, w->decoded, named, n, s0, len, w->mean, res, w->out);
            else reference_segment(c, w->decoded, both, nb, s0, len, w->mean, res, w->out);
            match = memcmp(w->out, got, bytes) == 0;
            if (!match) continue;
            if (residual) memcpy(residual + s0, res, (size_t)len * sizeof(float));
            if (variant == 0) in_prefix = false;
            else (*with)++;
        }
        if (!match) {
            fprintf(stderr, "test: replica %d: step %lld: segment %lld of the mean is not the reference\n", c->id,
                    (long long)k, (long long)seg);
            ok = false;
        }
    }
    return ok;
}

static int replica_main(const replica_cfg *c) {
#ifdef _OPENMP
    // The reference's decode and encode on one thread: four processes of OpenMP threads on a
    // small, busy machine would spend their time waiting for one another at the barriers.
    omp_set_num_threads(1);
#endif
    transport_options o = {.replica_id = c->id, .replicas = c->replicas, .min_replicas = c->min_replicas,
                           .timeout_s = c->timeout_s > 0 ? c->timeout_s : TIMEOUT_S,
                           .connect_timeout_s = c->connect_timeout_s,
                           .rendezvous = c->rendezvous, .serve = c->serve, .streams = c->streams,
                           .secret = c->secret, .secret_bytes = c->secret_bytes, .run_fingerprint = c->fingerprint};
    transport *t = transport_tcp_open(&o);
    payload_spec sp = spec_of(c);
    size_t bytes = payload_spec_up_bytes(&sp);
    scratch w = {.x = xmalloc((size_t)c->values * sizeof(float)), .enc = xmalloc(bytes),
                 .mean = xmalloc((size_t)c->segment * sizeof(float)), .res = xmalloc((size_t)c->segment * sizeof(float)),
                 .out = xmalloc(quant_encoded_bytes((quant_kind)c->down, c->segment, c->block))};
    uint8_t *payload = xmalloc(bytes);
    // The reference's copy of the hub's downlink residual: known from the group's first
    // round on, for a replica that has been in every round since.
    float *residual = c->feedback ? xcalloc((size_t)c->values, sizeof(float)) : NULL;
    bool residual_known = true;
    uint8_t *state = xmalloc(STATE_BYTES + 1000);
    int64_t k = c->start_step;
    size_t got = 0;
    replica_status s = {k, status_hash(k), 0};
    if (transport_join(t, &s, state, STATE_BYTES + 1000, &got) == JOIN_GOT_STATE) {
        k = adopt(c->id, state, got, "gotstate");
        residual_known = false;
    } else {
        report_event(c->id, "member", k, true, 0);
    }
    bool slowed = false;
    int failures = 0, rc = 0;
    while (k < c->steps) {
        if (c->stop_file && access(c->stop_file, F_OK) == 0) break;
        bool slow = k == c->slow_at && !slowed;
        slowed |= slow;
        sleep_s(slow ? c->slow_s : c->inner_s);
        encode_payload(c, c->id, k, w.x, payload);
        round_result r;
        double t0 = wall_seconds();
        bool ok = transport_exchange(t, k, &sp, payload, &r);
        double dt = wall_seconds() - t0;
        if (!ok) {
            report_event(c->id, "failed", k, false, dt);
            if (++failures == 8) {   // no hub for a long while: give up (a test is failing)
                report_event(c->id, "gaveup", k, false, 0);
                rc = 2;
                break;
            }
            continue;
        }
        failures = 0;
        if (r.evicted) {
            report_event(c->id, "evicted", k, true, dt);
            residual_known = false;
            s = (replica_status){k, status_hash(k), 0};
            if (transport_rejoin(t, &s, state, STATE_BYTES + 1000, &got) == JOIN_GOT_STATE)
                k = adopt(c->id, state, got, "gotstate");
            else report_event(c->id, "member", k, true, 0);
            continue;
        }
        bool good = r.outer_step == k && r.n >= 1;
        char ids[300] = "";
        for (int i = 0; i < r.n; i++) {
            size_t len = strlen(ids);
            snprintf(ids + len, sizeof ids - len, "%s%d", i ? "," : "", r.ids[i]);
            good &= i == 0 || r.ids[i] > r.ids[i - 1];
        }
        int with = 0;
        good = good && check_mean(c, &w, k, &r, residual, &with) && (!residual || residual_known);
        good &= r.bytes_sent >= bytes && r.sync_s >= r.wait_s;
        if (c->check_traffic && !((double)r.bytes_recv <= 1.1 * (double)r.bytes_sent)) {
            fprintf(stderr, "test: replica %d: step %lld: %llu bytes received for %llu sent\n", c->id, (long long)k,
                    (unsigned long long)r.bytes_recv, (unsigned long long)r.bytes_sent);
            good = false;
        }
        report("R%d round k=%lld n=%d ids=%s apply=%d state=%d ok=%d dt=%.3f pre=%d h=%016llx", c->id, (long long)k,
               r.n, ids, r.apply, r.send_state, good, dt, with,
               r.mean ? (unsigned long long)fnv1a(r.mean, r.mean_bytes) : 0ull);
        k++;
        if (r.send_state) {
            make_state(state, k);
            transport_send_state(t, state, STATE_BYTES, NULL);
        }
        if (k == c->leave_at) break;
    }
    if (rc == 0) report_event(c->id, k == c->leave_at ? "left" : "done", k, true, 0);
    if (rc == 0) transport_leave(t, 0, false);
    else transport_close(t);
    free(payload);
    free(residual);
    free(state);
    free(w.x);
    free(w.enc);
    free(w.mean);
    free(w.res);
    free(w.out);
    for (int i = 0; i < MAX_IDS; i++) free(w.decoded[i]);
    return rc;
}
typedef struct {
    int id;
    char ev[16];
    long long k;
    int n;
    char ids[64];
    int apply, state, ok;
    double dt;
    int pre;                     // segments of the mean that hold the partial contributor's
    unsigned long long hash;     // of the mean's bytes
} rec;

typedef struct {
    const char *name;
    int pipe_rd, pipe_wr;
    pid_t hub;
    int port;
    char hub_addr[64];
    char hub_log[300];
    pid_t pids[8];
    int n_pids;
    char buf[65536];
    size_t have;
    rec lines[MAX_LINES];
    int n_lines;
} scenario;

static bool parse(const char *line, rec *r) {
    memset(r, 0, sizeof *r);
    return sscanf(line, "R%d %15s k=%lld n=%d ids=%63s apply=%d state=%d ok=%d dt=%lf pre=%d h=%llx", &r->id, r->ev,
                  &r->k, &r->n, r->ids, &r->apply, &r->state, &r->ok, &r->dt, &r->pre, &r->hash) == 11;
}

// Reads report lines until one for replica id with event ev (and step >= k) arrives, or
// timeout. Every line is kept for the checks afterwards.
static const rec *await(scenario *s, int id, const char *ev, long long k, double timeout) {
    double deadline = wall_seconds() + timeout;
    int seen = 0;
    for (;;) {
        for (; seen < s->n_lines; seen++) {
            const rec *r = &s->lines[seen];
            if (r->id == id && strcmp(r->ev, ev) == 0 && r->k >= k) return r;
        }
        // Any line already in the buffer?
        char *nl = memchr(s->buf, '\n', s->have);
        if (nl) {
            *nl = '\0';
            if (s->n_lines < MAX_LINES && parse(s->buf, &s->lines[s->n_lines])) s->n_lines++;
            else if (s->n_lines < MAX_LINES) fprintf(stderr, "unparsed report: %s\n", s->buf);
            size_t used = (size_t)(nl + 1 - s->buf);
            memmove(s->buf, nl + 1, s->have - used);
            s->have -= used;
            continue;
        }
        double left = deadline - wall_seconds();
        if (left <= 0) return NULL;
        struct pollfd p = {.fd = s->pipe_rd, .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) > 0) {
            ssize_t n = read(s->pipe_rd, s->buf + s->have, sizeof s->buf - s->have);
            if (n > 0) s->have += (size_t)n;
        }
    }
}

static char *slurp(const char *path) {
    size_t n;
    char *t = read_file_or_null(path, &n);
    return t ? t : xstrdup("");
}

static bool file_has(const char *path, const char *needle) {
    char *t = slurp(path);
    bool yes = strstr(t, needle) != NULL;
    free(t);
    return yes;
}

// Waits until the file holds needle.
static bool await_file(const char *path, const char *needle, double timeout) {
    double deadline = wall_seconds() + timeout;
    while (wall_seconds() < deadline) {
        if (file_has(path, needle)) return true;
        sleep_s(0.02);
    }
    return file_has(path, needle);
}

static void redirect(int fd, const char *path) {
    int f = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (f < 0) _exit(99);
    dup2(f, fd);
    close(f);
}

// The hub: relay_main in a child process, its stdout (the event lines) into a log file; fault:
// its TRAIN_GPT_FAULT (NULL: none).
static void start_hub_fault(scenario *s, const char *listen, const char *extra, const char *fault) {
    snprintf(s->hub_log, sizeof s->hub_log, "%s/%s_hub.log", dir, s->name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (fault) setenv("TRAIN_GPT_FAULT", fault, 1);
        redirect(1, s->hub_log);
        redirect(2, s->hub_log);
        char timeout[32];
        snprintf(timeout, sizeof timeout, "%g", TIMEOUT_S);
        char listen_copy[64];
        snprintf(listen_copy, sizeof listen_copy, "%s", listen);
        // --catch_up 0: these replicas are the transport's alone (no diloco.c to keep its state or
        // send the means of later rounds), so their joins are whole transfers; the catch-up is
        // tested with the trainer (test_diloco_late.sh, test_fsdp_diloco.sh).
        char *argv[16] = {"relay", "--listen", listen_copy, "--secret_file", secret_path, "--timeout_s", timeout,
                          "--catch_up", "0"};
        int argc = 9;
        char extra_copy[64];
        if (extra) {
            snprintf(extra_copy, sizeof extra_copy, "%s", extra);
            argv[argc++] = strtok(extra_copy, " ");
            argv[argc++] = strtok(NULL, " ");
        }
        _exit(relay_main(argc, argv));
    }
    s->hub = pid;
    // "listening on 127.0.0.1:0 (port N)" (the last such line: a restarted hub appends)
    EXPECT(await_file(s->hub_log, "(port ", 10), "%s: the hub did not start", s->name);
    char *log = slurp(s->hub_log);
    char *p = NULL;
    for (char *q = strstr(log, "(port "); q; q = strstr(q + 1, "(port ")) p = q;
    s->port = p ? atoi(p + 6) : 0;
    free(log);
    snprintf(s->hub_addr, sizeof s->hub_addr, "127.0.0.1:%d", s->port);
}

static void start_hub_on(scenario *s, const char *listen, const char *extra) {
    start_hub_fault(s, listen, extra, NULL);
}
static void start_hub(scenario *s, const char *extra) { start_hub_on(s, "127.0.0.1:0", extra); }

static void stop_hub(scenario *s) {
    kill(s->hub, SIGTERM);
    int status = 0;
    waitpid(s->hub, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the hub exits 0 on SIGTERM (status %d)", s->name,
           status);
    EXPECT(file_has(s->hub_log, "stopping (signal)"), "%s: the hub says it stops", s->name);
}

static void open_reports(scenario *s, const char *name) {
    memset(s, 0, sizeof *s);
    s->name = name;
    int p[2];
    if (pipe(p) != 0) fail("pipe: %s", strerror(errno));
    s->pipe_rd = p[0];
    s->pipe_wr = p[1];
}

static replica_cfg default_cfg(scenario *s, int id) {
    return (replica_cfg){.id = id, .replicas = 3, .min_replicas = 1, .streams = 2,
                         .values = payload_values(200000), .segment = SEGMENT_VALUES, .block = 2, .up = QUANT_NONE,
                         .down = QUANT_NONE, .partial = -1, .nan_id = -1, .steps = 8, .start_step = 0, .inner_s = 0.1, .leave_at = -1, .slow_at = -1,
                         .rendezvous = s->hub_addr, .secret = (const uint8_t *)SECRET,
                         .secret_bytes = strlen(SECRET), .fingerprint = FINGERPRINT, .connect_timeout_s = 10};
}

static pid_t start_replica_env(scenario *s, const replica_cfg *c, const char *fault) {
    char err_path[400];
    snprintf(err_path, sizeof err_path, "%s/%s_R%d.err", dir, s->name, c->id);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (fault) setenv("TRAIN_GPT_FAULT", fault, 1);
        close(s->pipe_rd);
        report_fd = s->pipe_wr;
        redirect(2, err_path);
        _exit(replica_main(c));
    }
    s->pids[s->n_pids++] = pid;
    return pid;
}

static pid_t start_replica(scenario *s, const replica_cfg *c) { return start_replica_env(s, c, NULL); }

static int wait_exit(pid_t pid, double timeout) {
    double deadline = wall_seconds() + timeout;
    int status = 0;
    while (wall_seconds() < deadline) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        sleep_s(0.02);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static void finish(scenario *s) {
    for (int i = 0; i < s->n_pids; i++) {
        kill(s->pids[i], SIGKILL);
        waitpid(s->pids[i], NULL, WNOHANG);
    }
    close(s->pipe_rd);
    close(s->pipe_wr);
}

// Every round of the same step with the same contributors (and no partial one) has the same
// mean on every replica: the hub sends every receiver the same bytes. Returns how many lines
// disagree with the first of theirs.
static int means_disagree(scenario *s) {
    int bad = 0;
    for (int i = 0; i < s->n_lines; i++) {
        const rec *a = &s->lines[i];
        if (strcmp(a->ev, "round") != 0 || a->pre) continue;
        for (int j = 0; j < i; j++) {
            const rec *b = &s->lines[j];
            if (strcmp(b->ev, "round") != 0 || b->pre || b->k != a->k || strcmp(b->ids, a->ids) != 0) continue;
            if (b->hash != a->hash) {
                fprintf(stderr, "%s: replica %d's mean of step %lld [%s] is %016llx, replica %d's %016llx\n", s->name,
                        a->id, a->k, a->ids, a->hash, b->id, b->hash);
                bad++;
            }
            break;
        }
    }
    return bad;
}

// With several hubs, stronger than means_disagree: every replica that takes outer step k takes
// the same mean, whoever contributed (no step taken from two different rounds of a share by two
// sets of replicas: they would apply different θ), and no replica takes a step twice. Returns
// how many lines break either.
static int steps_disagree(scenario *s) {
    int bad = 0;
    for (int i = 0; i < s->n_lines; i++) {
        const rec *a = &s->lines[i];
        if (strcmp(a->ev, "round") != 0) continue;
        for (int j = 0; j < i; j++) {
            const rec *b = &s->lines[j];
            if (strcmp(b->ev, "round") != 0 || b->k != a->k) continue;
            if (b->id == a->id) {
                fprintf(stderr, "%s: replica %d took step %lld twice\n", s->name, a->id, a->k);
                bad++;
                break;
            }
            if (b->hash != a->hash) {
                fprintf(stderr, "%s: step %lld: replica %d's mean is %016llx [%s], replica %d's %016llx [%s]\n",
                        s->name, a->k, a->id, a->hash, a->ids, b->id, b->hash, b->ids);
                bad++;
                break;
            }
        }
    }
    return bad;
}

// The lines of one replica's rounds; checks each is ok, and counts those with n contributors.
static int rounds_of(scenario *s, int id, int n, bool *all_ok) {
    int count = 0;
    for (int i = 0; i < s->n_lines; i++) {
        const rec *r = &s->lines[i];
        if (r->id != id || strcmp(r->ev, "round") != 0) continue;
        if (!r->ok) *all_ok = false;
        if (n < 0 || r->n == n) count++;
    }
    return count;
}

// ---------------------------------------------------------------- scenarios
// Three replicas, ~3 MB each: every round is the exact mean of the three, the same bytes on
// every replica, and a replica receives one payload's worth whatever the number of replicas.
static void test_reduce(void) {
    static scenario s;
    open_reports(&s, "reduce");
    start_hub(&s, NULL);
    double t0 = wall_seconds();
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.streams = 3;
        c.values = payload_values(3u << 20);
        c.steps = 3;
        c.inner_s = 0.05;
        c.slow_at = 0, c.slow_s = 0.5;   // everyone is in before the first round
        c.check_traffic = true;
        start_replica(&s, &c);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 3, 30), "reduce: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "reduce: replica %d exits 0", id);
    for (int id = 0; id < 3; id++) {
        bool ok = true;
        int full = rounds_of(&s, id, 3, &ok);
        EXPECT(full == 3 && ok, "reduce: replica %d: %d rounds of 3 contributors, each the exact mean: %d", id, full,
               ok);
    }
    for (int i = 0; i < s.n_lines; i++)
        if (!strcmp(s.lines[i].ev, "round"))
            EXPECT(!strcmp(s.lines[i].ids, "0,1,2") && s.lines[i].apply && s.lines[i].pre == 0,
                   "reduce: ids %s apply %d", s.lines[i].ids, s.lines[i].apply);
    EXPECT(means_disagree(&s) == 0, "reduce: every replica receives the same bytes");
    EXPECT(file_has(s.hub_log, "round 2 closed: 3 contributor(s) [0 1 2]"), "reduce: the hub logs the rounds");
    EXPECT(file_has(s.hub_log, "replica 1 connected from 127.0.0.1:"), "reduce: the hub logs connections");
    EXPECT(file_has(s.hub_log, "left (goodbye)"), "reduce: the hub logs goodbyes");
    printf("reduce: 3 replicas x 3 rounds of ~3 MB over 3 streams in %.2f s\n", wall_seconds() - t0);
    stop_hub(&s);
    finish(&s);
}

// int8 up and down, with the hub's error feedback: every mean byte-exact the reference each
// replica computes itself (its residual carried across rounds as the hub's is), a NaN in one
// contribution's segment 1 of step 2 left out of that segment only.
static void test_mean(void) {
    static scenario s;
    open_reports(&s, "mean");
    start_hub(&s, NULL);
    const int64_t block = 128, segment = quant_segment_values(block), values = 3 * segment + 12345;
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.up = c.down = QUANT_INT8;
        c.feedback = true;
        c.block = block;
        c.segment = segment;
        c.values = values;
        c.steps = 6;
        c.slow_at = 0, c.slow_s = 1.0;   // everyone is in the first round (the residual starts there)
        c.nan_id = 1, c.nan_step = 2, c.nan_index = segment + 1000;
        c.check_traffic = true;
        start_replica(&s, &c);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 6, 30), "mean: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "mean: replica %d exits 0", id);
    for (int id = 0; id < 3; id++) {
        bool ok = true;
        int full = rounds_of(&s, id, 3, &ok);
        EXPECT(full == 6 && ok, "mean: replica %d: %d rounds of 3, each byte-exact the reference (%d)", id, full, ok);
    }
    for (int i = 0; i < s.n_lines; i++)
        if (!strcmp(s.lines[i].ev, "round"))
            EXPECT(!strcmp(s.lines[i].ids, "0,1,2") && s.lines[i].apply, "mean: step %lld: ids %s apply %d",
                   s.lines[i].k, s.lines[i].ids, s.lines[i].apply);
    EXPECT(means_disagree(&s) == 0, "mean: every replica receives the same bytes");
    char text[160];
    snprintf(text, sizeof text, "downlink error feedback: a residual of %lld values", (long long)values);
    EXPECT(file_has(s.hub_log, text), "mean: the hub logs its residual");
    EXPECT(file_has(s.hub_log, "round 2: replica 1's contribution holds NaN/Inf (segment 1)"),
           "mean: the hub logs the NaN it left out");
    stop_hub(&s);
    finish(&s);
}

static void test_kill9(void) {
    static scenario s;
    open_reports(&s, "kill9");
    start_hub(&s, NULL);
    double t0 = wall_seconds();
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 14;
        c.partial = 2;   // killed at any moment: maybe mid-upload
        start_replica(&s, &c);
    }
    EXPECT(await(&s, 2, "round", 2, 20), "kill9: replica 2 reaches round 2");
    kill(s.pids[2], SIGKILL);
    waitpid(s.pids[2], NULL, 0);
    double killed = wall_seconds();
    // The others' rounds after the kill: 2 contributors, each within timeout + 5 s.
    const rec *r = await(&s, 0, "round", 3, 20);
    EXPECT(r != NULL, "kill9: replica 0 goes on after the kill");
    bool found = false;
    for (int i = 0; i < s.n_lines; i++) {
        const rec *x = &s.lines[i];
        if (x->id == 0 && !strcmp(x->ev, "round") && x->k >= 3) {
            EXPECT(x->dt <= TIMEOUT_S + 5, "kill9: round %lld took %.2f s", x->k, x->dt);
            found |= x->n == 2 && !strcmp(x->ids, "0,1") && x->ok;
        }
    }
    const rec *two = NULL;
    for (int i = 0; i < s.n_lines && !two; i++)
        if (s.lines[i].id == 0 && !strcmp(s.lines[i].ev, "round") && s.lines[i].n == 2) two = &s.lines[i];
    if (!two) {
        two = await(&s, 0, "round", 3, 10);
        found = two && two->n == 2;
    }
    EXPECT(found, "kill9: replica 0 closes a round with [0,1] after the kill");
    EXPECT(await_file(s.hub_log, "replica 2 (127.0.0.1:", 5), "kill9: the hub names the dropped replica");
    printf("kill9: dropped and the others' round closed %.2f s after the kill\n", wall_seconds() - killed);
    // Restart it with its initial (stale) status: it must take the group's state.
    replica_cfg c = default_cfg(&s, 2);
    c.steps = 14;
    start_replica(&s, &c);
    const rec *g = await(&s, 2, "gotstate", 0, 20);
    EXPECT(g && g->ok && g->k > 2, "kill9: restarted, replica 2 receives the donor's state byte-exact (k %lld ok %d)",
           g ? g->k : -1, g ? g->ok : 0);
    const rec *back = await(&s, 2, "round", g ? g->k : 0, 20);
    EXPECT(back && back->n == 3 && back->ok, "kill9: replica 2 contributes again with all three (n %d)",
           back ? back->n : -1);
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 14, 30), "kill9: replica %d finishes", id);
    for (int i = 0; i < 3; i++) EXPECT(wait_exit(s.pids[i == 2 ? 3 : i], 10) == 0, "kill9: replica %d exits 0", i);
    bool ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "kill9: every round every replica saw was exact");
    EXPECT(means_disagree(&s) == 0, "kill9: the replicas of a round receive the same bytes");
    EXPECT(file_has(s.hub_log, "is the donor"), "kill9: the hub logs the donor");
    printf("kill9: %.2f s\n", wall_seconds() - t0);
    stop_hub(&s);
    finish(&s);
}

static void test_sigstop(void) {
    static scenario s;
    open_reports(&s, "sigstop");
    start_hub(&s, NULL);
    double t0 = wall_seconds();
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 16;
        c.partial = 1;   // stopped at any moment: maybe mid-upload
        start_replica(&s, &c);
    }
    EXPECT(await(&s, 1, "round", 2, 20), "sigstop: replica 1 reaches round 2");
    kill(s.pids[1], SIGSTOP);
    double stopped = wall_seconds();
    // Bounds with 3 s to spare: the drop comes a timeout after the last heartbeat (1.98 s was
    // measured beside two busy processes, against a bound of timeout + 1 s), and the test sees
    // it only when the hub and this poll get the CPU. They still catch a hub that never drops a
    // silent replica, or waits for it well past its timeout.
    EXPECT(await_file(s.hub_log, "no heartbeat", TIMEOUT_S + 5), "sigstop: the hub drops the silent replica");
    double dropped = wall_seconds() - stopped;
    EXPECT(dropped <= TIMEOUT_S + 3, "sigstop: dropped %.2f s after SIGSTOP (timeout %.1f s)", dropped, TIMEOUT_S);
    const rec *r = NULL;
    for (long long k = 3; k < 10 && !(r && r->n == 2); k++) r = await(&s, 0, "round", k, 10);
    EXPECT(r && r->n == 2 && !strcmp(r->ids, "0,2") && r->ok && r->dt <= TIMEOUT_S + 3,
           "sigstop: the others close a round without it (n %d, %.2f s)", r ? r->n : -1, r ? r->dt : -1);
    sleep_s(0.5);
    kill(s.pids[1], SIGCONT);
    const rec *e = await(&s, 1, "evicted", 0, 20);
    EXPECT(e != NULL, "sigstop: after SIGCONT, replica 1 finds itself evicted");
    const rec *g = await(&s, 1, "gotstate", 0, 20);
    EXPECT(g && g->ok, "sigstop: it rejoins through a byte-exact state transfer");
    const rec *back = await(&s, 1, "round", g ? g->k : 0, 20);
    EXPECT(back && back->n == 3 && back->ok, "sigstop: and contributes again with all three");
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 16, 30), "sigstop: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "sigstop: replica %d exits 0", id);
    bool ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "sigstop: every round was exact");
    EXPECT(means_disagree(&s) == 0, "sigstop: the replicas of a round receive the same bytes");
    printf("sigstop: dropped %.2f s after SIGSTOP; whole scenario %.2f s\n", dropped, wall_seconds() - t0);
    stop_hub(&s);
    finish(&s);
}

static void test_leave(void) {
    static scenario s;
    open_reports(&s, "leave");
    start_hub(&s, "--min_replicas 3");
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.min_replicas = 3;
        c.steps = 4;
        c.leave_at = id == 2 ? 2 : -1;
        start_replica(&s, &c);
    }
    EXPECT(await(&s, 2, "left", 2, 20), "leave: replica 2 leaves after two rounds");
    EXPECT(wait_exit(s.pids[2], 5) == 0, "leave: the leaver exits 0");
    const rec *r = await(&s, 0, "round", 2, 20);
    EXPECT(r && r->n == 2 && !r->apply && r->ok, "leave: the next round has 2 contributors and apply = false");
    // A round that waited for the timeout takes at least TIMEOUT_S from its first contribution:
    // below that it closed on the goodbye (half the timeout left a loaded machine 1 s).
    EXPECT(r && r->dt < TIMEOUT_S, "leave: closed at once (%.2f s), not after a timeout", r ? r->dt : -1);
    const rec *first = NULL;
    for (int i = 0; i < s.n_lines && !first; i++)
        if (s.lines[i].id == 0 && !strcmp(s.lines[i].ev, "round")) first = &s.lines[i];
    EXPECT(first && first->n == 3 && first->apply, "leave: with all 3, apply = true");
    for (int id = 0; id < 2; id++) EXPECT(wait_exit(s.pids[id], 20) == 0, "leave: replica %d exits 0", id);
    EXPECT(file_has(s.hub_log, "replica 2 (127.0.0.1:") && file_has(s.hub_log, "left (goodbye)"),
           "leave: the hub logs the goodbye");
    EXPECT(file_has(s.hub_log, "skip (fewer than min_replicas)"), "leave: the hub logs the skipped round");
    stop_hub(&s);
    finish(&s);
}

static void test_late(void) {
    static scenario s;
    open_reports(&s, "late");
    start_hub(&s, NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 40;   // the others go on while it is away
        if (id == 2) c.slow_at = 3, c.slow_s = TIMEOUT_S + 0.7;   // alive (heartbeats), but late
        start_replica(&s, &c);
    }
    const rec *r = NULL;
    for (long long k = 3; k < 8 && !(r && r->n == 2); k++) r = await(&s, 0, "round", k, 15);
    EXPECT(r && r->k == 3 && r->n == 2 && !strcmp(r->ids, "0,1") && r->ok,
           "late: round 3 closes without the late replica (k %lld, n %d)", r ? r->k : -1, r ? r->n : -1);
    // Timeout + 3 s: the round without replica 2 (n 2, checked above) closes at the deadline,
    // when the hub gets the CPU; a bound of 1 s over it was the load's margin, not the hub's.
    EXPECT(r && r->dt <= TIMEOUT_S + 3, "late: ... at the deadline (%.2f s after the first contribution began)",
           r ? r->dt : -1);
    const rec *e = await(&s, 2, "evicted", 3, 15);
    EXPECT(e && e->k == 3, "late: the late replica learns it was evicted from round 3");
    const rec *g = await(&s, 2, "gotstate", 0, 15);
    EXPECT(g && g->ok && g->k > 3, "late: it rejoins with the donor's state (k %lld)", g ? g->k : -1);
    const rec *back = await(&s, 2, "round", g ? g->k : 0, 15);
    EXPECT(back && back->n == 3 && back->ok, "late: and contributes again with all three");
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 40, 30), "late: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "late: replica %d exits 0", id);
    bool ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "late: every round was exact");
    EXPECT(means_disagree(&s) == 0, "late: the replicas of a round receive the same bytes");
    EXPECT(file_has(s.hub_log, "replica 2 (127.0.0.1:") && file_has(s.hub_log, "evicted: late for round 3"),
           "late: the hub logs the eviction");
    stop_hub(&s);
    finish(&s);
}

// A replica slow to read its rounds, with fast neighbours: its backlog holds the reduction
// back (and the fast ones' uploads with it), and no round's mean mixes with another's.
static void test_slow_reader(void) {
    static scenario s;
    open_reports(&s, "slowread");
    start_hub(&s, NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 10;
        c.streams = 4;
        c.inner_s = id == 1 ? 0.05 : 0.0;
        c.slow_at = 0, c.slow_s = 0.5;   // everyone is in before the first round
        start_replica_env(&s, &c,
                          id == 1 ? "tcp_slow_read:1,tcp_slow_read:2,tcp_slow_read:3,tcp_slow_read:4,tcp_slow_read:5,"
                                    "tcp_slow_read:6,tcp_slow_read:7,tcp_slow_read:8"
                                  : NULL);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 10, 30), "slowread: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "slowread: replica %d exits 0", id);
    bool ok = true;
    int full = 0;
    for (int id = 0; id < 3; id++) full += rounds_of(&s, id, 3, &ok);
    EXPECT(ok && full == 30, "slowread: 10 rounds of all three on every replica, exact (%d)", full);
    EXPECT(means_disagree(&s) == 0, "slowread: every replica receives the same bytes");
    stop_hub(&s);
    finish(&s);
}

// The time a replica's trace line (TRAIN_GPT_FAULT=tcp_trace:K) gives: what follows `what`
// in its stderr, -1 if absent.
static double trace_time(scenario *s, int id, const char *what) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s_R%d.err", dir, s->name, id);
    char *t = slurp(path);
    char *p = strstr(t, what);
    double v = p ? atof(p + strlen(what)) : -1;
    free(t);
    return v;
}

// Cut-through: the hub reduces segment by segment, so the other replica receives the first
// segment of the mean while a slow uploader is still uploading (a hub that waited for whole
// payloads could only send it after).
static void test_cutthrough_slow(void) {
    static scenario s;
    open_reports(&s, "cutthrough");
    start_hub(&s, NULL);
    for (int id = 0; id < 2; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.replicas = 2;
        c.steps = 4;
        c.values = payload_values(4u << 20);   // 65 segments: the first half is 32 of them
        c.slow_at = 0, c.slow_s = 0.5;           // both are in before the first round
        start_replica_env(&s, &c, id == 0 ? "tcp_slow_upload:2,tcp_trace:2" : "tcp_trace:2");
    }
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 4, 30), "cutthrough: replica %d finishes", id);
    for (int id = 0; id < 2; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "cutthrough: replica %d exits 0", id);
    bool ok = true;
    int full = rounds_of(&s, 0, 2, &ok) + rounds_of(&s, 1, 2, &ok);
    EXPECT(ok && full == 8, "cutthrough: 4 rounds of both on both replicas, exact (%d)", full);
    EXPECT(means_disagree(&s) == 0, "cutthrough: both replicas receive the same bytes");
    double got = trace_time(&s, 1, "step 3 (round 2): first segment of the mean at ");
    double done = trace_time(&s, 0, "step 3 (round 2): own upload done at ");
    // Causal: a hub that waited for whole payloads could only send the mean after replica 0
    // had handed in its last byte (and replica 0 pauses 0.6 s halfway).
    EXPECT(got > 0 && done > 0 && got < done,
           "cutthrough: replica 1 receives the mean's first segment %.3f s before replica 0's upload is done",
           done - got);
    printf("cutthrough: the mean's first segment arrived %.3f s before the slow upload was done\n", done - got);
    stop_hub(&s);
    finish(&s);
}

// A contributor killed halfway through its upload, after the hub had reduced its first
// segments with the others': the mean holds it in a prefix of the segments and in no later
// one, the round names the others only; back, the replica rejoins and contributes again.
static void test_cutthrough_killed(void) {
    static scenario s;
    open_reports(&s, "cutkill");
    start_hub(&s, NULL);
    const int64_t values = payload_values(4u << 20);   // 65 segments: it sends 32 of them
    const int half = (int)(values * 4 / 2 / (SEGMENT_VALUES * 4));
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 8;
        c.values = values;
        c.slow_at = 0, c.slow_s = 0.5;
        c.partial = 2;
        // Replica 2 begins each round last: the others' first segments are at the hub when
        // its own arrive, so its first segments are reduced before it dies.
        if (id == 2) c.inner_s = 0.4;
        start_replica_env(&s, &c, id == 2 ? "tcp_die_in_upload:2" : "tcp_trace:2");
    }
    EXPECT(wait_exit(s.pids[2], 20) == 128 + SIGKILL, "cutkill: replica 2 dies halfway through its upload");
    const rec *seen[2] = {NULL, NULL};
    for (int id = 0; id < 2; id++) {
        const rec *r = seen[id] = await(&s, id, "round", 2, 20);
        EXPECT(r && r->k == 2 && r->n == 2 && !strcmp(r->ids, "0,1") && r->ok,
               "cutkill: replica %d's round 2 names 0 and 1 only, its mean exact (n %d ids %s ok %d)", id,
               r ? r->n : -1, r ? r->ids : "-", r ? r->ok : 0);
        EXPECT(r && r->pre >= 1 && r->pre <= half,
               "cutkill: replica %d's mean of step 2 holds the dead replica's contribution in its first %d "
               "segment(s) (of the %d it sent), and none after",
               id, r ? r->pre : -1, half);
        EXPECT(trace_time(&s, id, "step 3 (round 2): first segment of the mean at ") > 0,
               "cutkill: replica %d traces the mean of step 2", id);
    }
    EXPECT(seen[0] && seen[1] && seen[0]->hash == seen[1]->hash && seen[0]->pre == seen[1]->pre,
           "cutkill: both receive the same mean of step 2");
    printf("cutkill: the dead replica is in the first %d of 65 segments of the mean\n", seen[0] ? seen[0]->pre : -1);
    replica_cfg c = default_cfg(&s, 2);
    c.steps = 8;
    c.values = values;
    start_replica(&s, &c);   // stale: it gets the state
    const rec *g = await(&s, 2, "gotstate", 0, 20);
    EXPECT(g && g->ok, "cutkill: back, replica 2 gets the state");
    const rec *back = await(&s, 2, "round", g ? g->k : 0, 20);
    EXPECT(back && back->n == 3 && back->ok, "cutkill: and contributes again with all three");
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 8, 30), "cutkill: replica %d finishes", id);
    bool ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "cutkill: every round every replica saw was exact");
    EXPECT(means_disagree(&s) == 0, "cutkill: the replicas of a round receive the same bytes");
    stop_hub(&s);
    finish(&s);

    // Killed in the group's first round before anything was reduced, and back at once with the
    // same status: not a member at once, since it left that round after beginning it (a second
    // upload would mix with the first in the mean); it rejoins through the state. Replicas 0 and 1 begin round 0
    // well within the deadline (timeout_s after replica 2 began) and upload slowly, so that the
    // round is still open when replica 2 comes back.
    static scenario s2;
    open_reports(&s2, "cutback");
    start_hub(&s2, NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c2 = default_cfg(&s2, id);
        c2.steps = 4;
        c2.values = values;
        c2.inner_s = 0.0;
        c2.partial = 2;
        if (id < 2) c2.slow_at = 0, c2.slow_s = TIMEOUT_S / 2;   // 0 and 1 begin round 0 late
        start_replica_env(&s2, &c2, id == 2 ? "tcp_die_in_upload:0" : "tcp_slow_upload:0");
    }
    EXPECT(wait_exit(s2.pids[2], 20) == 128 + SIGKILL, "cutback: replica 2 dies halfway through round 0");
    replica_cfg c3 = default_cfg(&s2, 2);
    c3.steps = 4;
    c3.values = values;
    c3.inner_s = 0.0;
    start_replica(&s2, &c3);
    EXPECT(await_file(s2.hub_log, "replica 2 joined at outer step 0 (hash 0000000000000abc): waits", 10),
           "cutback: back before round 0 closed, with the group's status, replica 2 still waits for the state "
           "(it left round 0 after beginning it: it may not contribute to it again)");
    for (int id = 0; id < 2; id++) {
        const rec *r = await(&s2, id, "round", 0, 10);
        EXPECT(r && r->k == 0 && !strcmp(r->ids, "0,1") && r->ok, "cutback: round 0 names 0 and 1 (%s)",
               r ? r->ids : "-");
    }
    const rec *g2 = await(&s2, 2, "gotstate", 0, 20);
    EXPECT(g2 && g2->ok, "cutback: replica 2 rejoins through the state");
    for (int id = 0; id < 3; id++) EXPECT(await(&s2, id, "done", 4, 30), "cutback: replica %d finishes", id);
    ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s2, id, -1, &ok);
    EXPECT(ok, "cutback: every round was exact");
    EXPECT(means_disagree(&s2) == 0, "cutback: the replicas of a round receive the same bytes");
    stop_hub(&s2);
    finish(&s2);
}

// A contribution whose size differs from the round's first (replica 2: more values), and one
// of the same size encoded differently (replica 3: another downlink codec): each evicted and
// logged, the round goes on without them.
static void test_size(void) {
    static scenario s;
    open_reports(&s, "size");
    start_hub(&s, NULL);
    for (int id = 0; id < 4; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.replicas = 4;
        c.steps = id < 2 ? 3 : 1;   // 2 and 3 stop once they have the group's state
        c.slow_at = 0, c.slow_s = id >= 2 ? 0.8 : 0.4;   // replicas 2 and 3 are the last to contribute
        if (id == 2) c.values += 250;
        if (id == 3) c.down = QUANT_BF16;
        start_replica(&s, &c);
    }
    for (int id = 2; id < 4; id++) {
        const rec *e = await(&s, id, "evicted", 0, 10);
        EXPECT(e && e->k == 0, "size: replica %d (%s) is evicted from round 0", id,
               id == 2 ? "another payload size" : "another encoding");
    }
    EXPECT(file_has(s.hub_log, "bytes, but the round's first contribution is"), "size: the hub logs the sizes");
    EXPECT(file_has(s.hub_log, "is encoded differently from the round's first contribution"),
           "size: the hub logs the encoding");
    for (int id = 0; id < 2; id++) {
        const rec *r = await(&s, id, "round", 0, 10);
        EXPECT(r && r->k == 0 && !strcmp(r->ids, "0,1") && r->ok, "size: round 0 names 0 and 1 (%s)", r ? r->ids : "-");
    }
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 3, 30), "size: replica %d finishes", id);
    stop_hub(&s);
    finish(&s);
}

// The donor dies halfway through sending its state: the joiner waits, and at the next
// round the next donor (the lowest-id contributor left) sends it the state.
static void test_donor_dies(void) {
    static scenario s;
    open_reports(&s, "donor");
    start_hub(&s, NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 14;
        c.partial = 2;   // killed at any moment: maybe mid-upload
        // Replica 0 will be the donor (lowest id): it dies halfway through its state.
        start_replica_env(&s, &c, id == 0 ? "tcp_die_in_state:0" : NULL);
    }
    EXPECT(await(&s, 2, "round", 2, 20), "donor: replica 2 reaches round 2");
    kill(s.pids[2], SIGKILL);
    waitpid(s.pids[2], NULL, 0);
    EXPECT(await(&s, 0, "round", 3, 20), "donor: the others go on");
    replica_cfg c = default_cfg(&s, 2);
    c.steps = 14;
    start_replica(&s, &c);   // stale: it needs a donor
    EXPECT(wait_exit(s.pids[0], 20) == 128 + SIGKILL, "donor: replica 0 dies while sending its state");
    const rec *g = await(&s, 2, "gotstate", 0, 20);
    EXPECT(g && g->ok, "donor: the joiner still gets a byte-exact state (from the next donor)");
    EXPECT(file_has(s.hub_log, "state transfer from replica 0 aborted") &&
               file_has(s.hub_log, "replica 1 is the donor") && file_has(s.hub_log, "relayed from replica 1 to [2]"),
           "donor: the hub aborts the first transfer and asks replica 1");
    const rec *back = await(&s, 2, "round", g ? g->k : 0, 20);
    EXPECT(back && back->n == 2 && !strcmp(back->ids, "1,2") && back->ok, "donor: replicas 1 and 2 go on together");
    for (int id = 1; id < 3; id++) EXPECT(await(&s, id, "done", 14, 30), "donor: replica %d finishes", id);
    EXPECT(wait_exit(s.pids[1], 10) == 0 && wait_exit(s.pids[3], 10) == 0, "donor: replicas 1 and 2 exit 0");
    bool ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "donor: every round was exact");
    EXPECT(means_disagree(&s) == 0, "donor: the replicas of a round receive the same bytes");
    stop_hub(&s);
    finish(&s);
}

// A state slower than the round's deadline (a big model on a slow link): the round waits for
// the transfer, however long, and for the donor's and joiner's inner phase after it. Before,
// the donor was evicted as late, the joiner's transfer dropped, and the next donor likewise.
// Payloads of 32 MiB in 128 segments on one stream, far beyond the hub's window of 16 and what
// the loopback's socket buffers take, so the others' uploads are held back for the whole
// transfer. With two hubs (slowstate2, 8 MiB) the state goes through the donor's primary hub;
// the other must hold its rounds for the donor too (HOLD begin/end), or it evicts it as late.
static void start_second_hub(scenario *s, scenario *second, const char *name, const char *extra);
#define SLOW_TIMEOUT_S 3.0   // the slow-state scenarios' hub and replicas: tcp_slow_state sends a chunk per
                             // 0.25 x timeout, so a stall of the loaded machine under 0.75 x timeout is not one

static void slow_state(const char *name, bool two_hubs) {
    static scenario s, second;
    open_reports(&s, name);
    start_hub(&s, "--timeout_s 3");   // SLOW_TIMEOUT_S
    char second_name[64];
    snprintf(second_name, sizeof second_name, "%s_second", name);
    if (two_hubs) start_second_hub(&s, &second, second_name, "--timeout_s 3");
    replica_cfg c = default_cfg(&s, 0);
    c.steps = 7;
    c.values = payload_values(two_hubs ? 8u << 20 : 32u << 20);
    c.segment = 1 << 16;
    c.streams = 1;
    c.partial = two_hubs ? ANY_SHARE : 2;   // killed at any moment: maybe mid-upload
    c.timeout_s = SLOW_TIMEOUT_S;
    for (int id = 0; id < 3; id++) {
        c.id = id;
        // Replica 0 is the donor (lowest id): 23 chunks of 128 KiB, one per 0.75 s.
        start_replica_env(&s, &c, id == 0 ? "tcp_slow_state:0" : NULL);
    }
    // (60 s: a guard against a hang, not a deadline; three rounds of 32 MiB took 22 s on 2 loaded cores.)
    EXPECT(await(&s, 2, "round", 2, 60), "%s: replica 2 reaches round 2", name);
    kill(s.pids[2], SIGKILL);
    waitpid(s.pids[2], NULL, 0);
    EXPECT(await(&s, 0, "round", 3, 60), "%s: the others go on", name);
    c.id = 2;
    c.partial = two_hubs ? ANY_SHARE : -1;
    start_replica(&s, &c);   // stale: it needs a donor
    const rec *g = await(&s, 2, "gotstate", 0, 60);
    EXPECT(g && g->ok, "%s: the joiner gets a byte-exact state", name);
    const rec *back = await(&s, 2, "round", g ? g->k : 0, 30);
    EXPECT(back && back->n == 3 && !strcmp(back->ids, "0,1,2") && back->ok,
           "%s: the next round has all three (n %d, ids %s)", name, back ? back->n : -1, back ? back->ids : "-");
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 7, 60), "%s: replica %d finishes", name, id);
    EXPECT(wait_exit(s.pids[0], 10) == 0 && wait_exit(s.pids[1], 10) == 0 && wait_exit(s.pids[3], 10) == 0,
           "%s: every replica exits 0", name);
    // The transfer took longer than the hub's timeouts: the test is of what it says.
    char *log = slurp(s.hub_log);
    const char *at = strstr(log, "relayed from replica 0 to [2]: ");
    double took = -1;
    if (at) {
        const char *in = strstr(at, " in ");
        if (in) took = atof(in + 4);
    }
    free(log);
    EXPECT(took > 3 * SLOW_TIMEOUT_S, "%s: the state went from 0 to 2 through the hub in %.1f s (> 3 x timeout)",
           name, took);
    EXPECT(!file_has(s.hub_log, "evicted") && !file_has(s.hub_log, "aborted"),
           "%s: nobody was evicted and no transfer aborted (hub log %s)", name, s.hub_log);
    if (two_hubs) {
        EXPECT(!file_has(second.hub_log, "evicted"), "%s: the other hub evicted nobody (log %s)", name,
               second.hub_log);
        EXPECT(file_has(second.hub_log, "replica 0 sends its state through another hub") &&
                   file_has(second.hub_log, "replica 0 has sent its state through another hub in "),
               "%s: the other hub held its rounds for the donor (HOLD begin and end)", name);
    }
    int failed = 0;
    for (int i = 0; i < s.n_lines; i++) failed += !strcmp(s.lines[i].ev, "failed") || !strcmp(s.lines[i].ev, "evicted");
    EXPECT(failed == 0, "%s: no exchange failed or was evicted (%d)", name, failed);
    bool ok = true;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "%s: every round was exact", name);
    EXPECT((two_hubs ? steps_disagree(&s) : means_disagree(&s)) == 0, "%s: the replicas of a round receive the same "
           "bytes", name);
    stop_hub(&s);
    if (two_hubs) stop_hub(&second);
    finish(&s);
    if (two_hubs) finish(&second);
}
static void test_slow_state(void) { slow_state("slowstate", false); }

// Whether the hub's log says it dropped replica id ("replica ID (PEER) dropped: ...").
static bool hub_dropped(const char *hub_log, int id) {
    char *log = slurp(hub_log);
    char who[32];
    snprintf(who, sizeof who, "replica %d (", id);
    bool dropped = false;
    for (char *line = strstr(log, who); line; line = strstr(line + 1, who)) {
        char *end = strchr(line, '\n');
        char *d = strstr(line, ") dropped");
        dropped |= d && (!end || d < end);
    }
    free(log);
    return dropped;
}

// The start of slowcut, slowgone and heldgone: a hub (extra: its options), three replicas
// training until stop_path appears, replica 0 the donor with TRAIN_GPT_FAULT=donor_fault (a slow
// one: tcp_slow_state:0); replica 2 is killed at round 2 and restarted stale once the others go
// on, so that it waits for replica 0's state. Returns the round replica 0 had reached then.
static long long start_slow_joiner(scenario *s, const char *name, const char *extra, const char *donor_fault,
                                   char *stop_path, size_t bytes) {
    open_reports(s, name);
    start_hub(s, extra);
    snprintf(stop_path, bytes, "%s/%s.stop", dir, name);
    replica_cfg c = default_cfg(s, 0);
    c.steps = 100000;
    c.stop_file = stop_path;
    c.partial = 2;
    for (int id = 0; id < 3; id++) {
        c.id = id;
        start_replica_env(s, &c, id == 0 ? donor_fault : NULL);
    }
    EXPECT(await(s, 2, "round", 2, 20), "%s: replica 2 reaches round 2", name);
    kill(s->pids[2], SIGKILL);
    waitpid(s->pids[2], NULL, 0);
    const rec *r = await(s, 0, "round", 3, 20);
    EXPECT(r != NULL, "%s: the others go on", name);
    c.id = 2;
    c.partial = -1;
    start_replica(s, &c);   // stale: it needs a donor
    return r ? r->k : 0;
}

// The joiner of a slow state is killed mid-transfer: the hub stops the transfer at once (no
// joiner left: STATE_ABORT to the donor, which stops sending), the group goes on without
// holding its round for a state nobody gets, and the donor is neither dropped nor evicted.
static void test_slow_gone(void) {
    static scenario s;
    char stop_path[400];
    start_slow_joiner(&s, "slowgone", NULL, "tcp_slow_state:0", stop_path, sizeof stop_path);
    char path[400];
    snprintf(path, sizeof path, "%s/slowgone_R2.err", dir);
    EXPECT(await_file(path, "receiving the group's state", 30), "slowgone: the joiner's state is on its way");
    kill(s.pids[3], SIGKILL);
    waitpid(s.pids[3], NULL, 0);
    double killed = wall_seconds();
    EXPECT(await_file(s.hub_log, "aborted (no joiner left)", 10), "slowgone: the hub stops the transfer");
    double stopped = wall_seconds() - killed;
    int n0 = s.n_lines;
    long long k = 0;
    for (int i = 0; i < n0; i++)
        if (s.lines[i].id == 0 && !strcmp(s.lines[i].ev, "round") && s.lines[i].k > k) k = s.lines[i].k;
    EXPECT(await(&s, 0, "round", k + 2, 30) && await(&s, 1, "round", k + 2, 30), "slowgone: 0 and 1 go on");
    FILE *f = fopen(stop_path, "w");
    if (f) fclose(f);
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 0, 60), "slowgone: replica %d finishes", id);
    EXPECT(wait_exit(s.pids[0], 10) == 0 && wait_exit(s.pids[1], 10) == 0, "slowgone: replicas 0 and 1 exit 0");
    printf("slowgone: the transfer stopped %.2f s after its joiner was killed\n", stopped);
    // 2 timeouts + 3 s (7 s): room for a loaded machine, still well short of the 11 s the
    // transfer would have gone on for.
    EXPECT(stopped < 2 * TIMEOUT_S + 3, "slowgone: within the joiner's drop (%.2f s), not the transfer's 11 s", stopped);
    snprintf(path, sizeof path, "%s/slowgone_R0.err", dir);
    EXPECT(file_has(path, "stops sending its state"), "slowgone: the donor is told to stop sending");
    EXPECT(!file_has(s.hub_log, "evicted") && !file_has(s.hub_log, "sent state chunks it was not asked for"),
           "slowgone: the donor was neither evicted nor dropped (hub log %s)", s.hub_log);
    bool ok = true;
    for (int id = 0; id < 2; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "slowgone: every round was exact");
    stop_hub(&s);
    finish(&s);
}

// The joiner is killed after the hub named the donor but before the donor began to send (it holds
// its state back: tcp_hold_state): the hub ends the transfer (no joiner left) with a STATE_ABORT
// that reaches the donor before its STATE; the donor sends nothing ("sends no state") and trains
// on, neither evicted nor dropped (a state sent anyway would be chunks it was not asked for).
static void test_held_gone(void) {
    static scenario s;
    char stop_path[400], path[400];
    start_slow_joiner(&s, "heldgone", NULL, "tcp_hold_state:0", stop_path, sizeof stop_path);
    snprintf(path, sizeof path, "%s/heldgone_R0.err", dir);
    EXPECT(await_file(path, "holds back its state (test hook)", 30), "heldgone: the donor holds its state back");
    kill(s.pids[3], SIGKILL);
    waitpid(s.pids[3], NULL, 0);
    EXPECT(await_file(s.hub_log, "state transfer from replica 0 aborted (no joiner left)", 30),
           "heldgone: the hub ends the transfer (no joiner left)");
    EXPECT(await_file(path, "sends no state: the hub ended the transfer before it began", 30),
           "heldgone: the donor sends nothing");
    int n0 = s.n_lines;
    long long k = 0;
    for (int i = 0; i < n0; i++)
        if (s.lines[i].id == 0 && !strcmp(s.lines[i].ev, "round") && s.lines[i].k > k) k = s.lines[i].k;
    EXPECT(await(&s, 0, "round", k + 2, 30) && await(&s, 1, "round", k + 2, 30), "heldgone: 0 and 1 go on");
    FILE *f = fopen(stop_path, "w");
    if (f) fclose(f);
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 0, 60), "heldgone: replica %d finishes", id);
    EXPECT(wait_exit(s.pids[0], 10) == 0 && wait_exit(s.pids[1], 10) == 0, "heldgone: replicas 0 and 1 exit 0");
    EXPECT(!file_has(s.hub_log, "evicted") && !file_has(s.hub_log, "sent state chunks it was not asked for") &&
               !hub_dropped(s.hub_log, 0),
           "heldgone: the donor was neither evicted nor dropped (hub log %s)", s.hub_log);
    EXPECT(!file_has(path, "stops sending its state"), "heldgone: the donor had nothing on its way to stop");
    int failed = 0;
    for (int i = 0; i < s.n_lines; i++)
        failed += s.lines[i].id < 2 && (!strcmp(s.lines[i].ev, "failed") || !strcmp(s.lines[i].ev, "evicted"));
    EXPECT(failed == 0, "heldgone: no exchange of 0 or 1 failed or was evicted (%d)", failed);
    bool ok = true;
    for (int id = 0; id < 2; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "heldgone: every round was exact");
    stop_hub(&s);
    finish(&s);
}

// The same slow state with the relay's --max_hold_s 3: after 3 s the hub cuts the transfer, the
// joiner waits again, the donor stops sending and goes on (it is not evicted or dropped, its
// chunks still on the way are let go), and the group closes rounds without the joiner.
static void test_slow_cut(void) {
    static scenario s;
    char stop_path[400];
    long long k = start_slow_joiner(&s, "slowcut", "--max_hold_s 3", "tcp_slow_state:0", stop_path, sizeof stop_path);
    EXPECT(await_file(s.hub_log, "cut after", 30), "slowcut: the hub cuts the transfer");
    EXPECT(await(&s, 0, "round", k + 4, 60) && await(&s, 1, "round", k + 4, 60),
           "slowcut: replicas 0 and 1 go on past the cut");
    FILE *f = fopen(stop_path, "w");
    if (f) fclose(f);
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 0, 60), "slowcut: replica %d finishes", id);
    kill(s.pids[3], SIGKILL);   // the joiner, still waiting
    EXPECT(wait_exit(s.pids[0], 10) == 0 && wait_exit(s.pids[1], 10) == 0, "slowcut: replicas 0 and 1 exit 0");
    EXPECT(file_has(s.hub_log, "state transfer from replica 0 cut after") &&
               file_has(s.hub_log, "--max_hold_s 3"),
           "slowcut: the hub says why it cut");
    // Backoff: after a cut the joiner gets no donor for a close (two after the second cut...), so
    // the group closes rounds unheld in between: at least 2 closes between two cuts.
    char *text = slurp(s.hub_log);
    int cuts = 0, closes_between = -1, fewest = 1000;
    for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (memmem(line, len, "cut after", 9)) {
            if (cuts++ && closes_between < fewest) fewest = closes_between;
            closes_between = 0;
        } else if (closes_between >= 0 && memmem(line, len, " closed: ", 9)) {
            closes_between++;
        }
    }
    free(text);
    EXPECT(cuts >= 1 && (cuts == 1 || fewest >= 2), "slowcut: %d cut(s), at least 2 closes between two (fewest %d)",
           cuts, fewest);
    EXPECT(!hub_dropped(s.hub_log, 0) && !file_has(s.hub_log, "evicted"), "slowcut: the donor was neither dropped nor evicted (hub log %s)",
           s.hub_log);
    char path[400];
    snprintf(path, sizeof path, "%s/slowcut_R0.err", dir);
    EXPECT(file_has(path, "stops sending its state: the hub ended the transfer"), "slowcut: the donor says it stops");
    snprintf(path, sizeof path, "%s/slowcut_R2.err", dir);
    EXPECT(file_has(path, "the hub aborted the state transfer"), "slowcut: the joiner says it waits again");
    int failed = 0, got = 0;
    for (int i = 0; i < s.n_lines; i++) {
        failed += s.lines[i].id < 2 && (!strcmp(s.lines[i].ev, "failed") || !strcmp(s.lines[i].ev, "evicted"));
        got += !strcmp(s.lines[i].ev, "gotstate");
    }
    EXPECT(failed == 0 && got == 0, "slowcut: no exchange of 0 or 1 failed (%d), the joiner got no state (%d)", failed,
           got);
    bool ok = true;
    for (int id = 0; id < 2; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "slowcut: every round was exact");
    stop_hub(&s);
    finish(&s);
}
static void test_slow_state_hubs(void) { slow_state("slowstate2", true); }

// The others finish and leave while a late replica is away: back, it finds the group empty,
// founds it anew at its own (older) step, and trains on alone.
static void test_refound(void) {
    static scenario s;
    open_reports(&s, "refound");
    start_hub(&s, NULL);
    for (int id = 0; id < 2; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.replicas = 2;
        c.steps = 6;
        if (id == 1) c.slow_at = 2, c.slow_s = TIMEOUT_S + 1.5;
        start_replica(&s, &c);
    }
    EXPECT(await(&s, 0, "done", 6, 20), "refound: replica 0 finishes without replica 1");
    EXPECT(await(&s, 1, "evicted", 2, 20), "refound: replica 1 finds itself evicted");
    const rec *m = await(&s, 1, "member", 2, 10);
    EXPECT(m && m->k == 2, "refound: it rejoins as a member at its own step 2 (k %lld)", m ? m->k : -1);
    EXPECT(await(&s, 1, "done", 6, 20), "refound: and finishes alone");
    for (int id = 0; id < 2; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "refound: replica %d exits 0", id);
    bool ok = true;
    EXPECT(rounds_of(&s, 1, 1, &ok) == 4 && ok, "refound: replica 1 closes steps 2..5 alone");
    EXPECT(file_has(s.hub_log, "replica 1 joined: founds the group at outer step 2"), "refound: the hub logs it");
    stop_hub(&s);
    finish(&s);
}

// The hub dies (kill -9) and a new one starts on the same port: the replicas' exchanges
// fail meanwhile (skipped, never applied alone), then they reconnect, rejoin, go on.
static void test_hub_restart(void) {
    static scenario s;
    open_reports(&s, "restart");
    start_hub(&s, NULL);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s.port);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 12;
        c.min_replicas = 2;   // the first to reach the new hub may close a round alone: not applied
        start_replica(&s, &c);
    }
    EXPECT(await(&s, 0, "round", 2, 20), "restart: training");
    kill(s.hub, SIGKILL);
    waitpid(s.hub, NULL, 0);
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "failed", 0, 15), "restart: replica %d's exchange fails", id);
    start_hub_on(&s, listen, NULL);
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 12, 40), "restart: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "restart: replica %d exits 0", id);
    bool ok = true;
    int applied_alone = 0, after = 0;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    for (int i = 0; i < s.n_lines; i++) {
        const rec *r = &s.lines[i];
        if (!strcmp(r->ev, "round") && r->n < 2 && r->apply) applied_alone++;
        if (!strcmp(r->ev, "round") && r->n == 3 && r->k >= 4) after++;
    }
    EXPECT(ok && applied_alone == 0, "restart: every round exact, none applied below min_replicas (%d)",
           applied_alone);
    EXPECT(after > 0, "restart: rounds of all three after the restart (%d)", after);
    EXPECT(file_has(s.hub_log, "founds the group"), "restart: the new hub's group is founded by a rejoiner");
    EXPECT(means_disagree(&s) == 0, "restart: the replicas of a round receive the same bytes");
    stop_hub(&s);
    finish(&s);
}

// The path to the hub goes dead without a FIN (a firewall's failover, a NAT's flushed table:
// tcp_blackhole) while the hub's --timeout_s is longer than the replica's: the replica gives its
// session up and reconnects long before the hub lets the old one go, and the hub refuses it as
// a duplicate of itself meanwhile. That costs it the outer step (the exchange fails: skipped),
// not the run: once the hub has dropped the old session it reconnects, finds itself evicted,
// rejoins and finishes. (Until 2026-12 it exited 1 with "two replicas with the same
// diloco_replica_id?", which a requeue script takes for a configuration error.)
static int count_error_lines(const char *text);
static void test_blackhole(void) {
    static scenario s;
    open_reports(&s, "blackhole");
    // The replicas' timeout 4 s: the hub heartbeats every min(its timeout / 4, 2 s), and a
    // replica takes 2 s of silence for a dead hub only with a margin on a busy machine.
    start_hub(&s, "--timeout_s 10");
    char stop_path[300];
    snprintf(stop_path, sizeof stop_path, "%s/blackhole_stop", dir);
    for (int id = 0; id < 2; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.replicas = 2;
        c.steps = 100000;   // until the stop file: replica 0 goes on while replica 1 is away
        c.stop_file = stop_path;
        c.timeout_s = 4;
        start_replica_env(&s, &c, id == 1 ? "tcp_blackhole:3" : NULL);
    }
    EXPECT(await(&s, 1, "failed", 3, 40), "blackhole: replica 1's exchange for step 3 fails (the step is skipped)");
    EXPECT(file_has(s.hub_log, "duplicate replica id 1"), "blackhole: the hub refused its reconnection meanwhile");
    const rec *e = await(&s, 1, "evicted", 3, 40);
    EXPECT(e, "blackhole: once the hub let the old session go, it finds itself evicted");
    const rec *back = NULL;
    long long from = e ? e->k : 0;
    for (int i = 0; e && i < 20 && !(back && back->n == 2); i++) {
        back = await(&s, 1, "round", from, 30);
        from = back ? back->k + 1 : from;
    }
    EXPECT(back && back->n == 2 && back->ok, "blackhole: it rejoins and contributes again with replica 0");
    FILE *f = fopen(stop_path, "w");
    if (f) fclose(f);
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 0, 30), "blackhole: replica %d finishes", id);
    for (int id = 0; id < 2; id++) {
        int rc = wait_exit(s.pids[id], 10);
        EXPECT(rc == 0, "blackhole: replica %d exits 0 (rc %d)", id, rc);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/blackhole_R1.err", dir);
    char *err = slurp(path);
    EXPECT(count_error_lines(err) == 0 && strstr(err, "still holds this replica's previous session"),
           "blackhole: replica 1 says the hub still held its previous session, and no error: %s", err);
    free(err);
    bool ok = true;
    for (int id = 0; id < 2; id++) rounds_of(&s, id, -1, &ok);
    EXPECT(ok, "blackhole: every round was exact");
    EXPECT(means_disagree(&s) == 0, "blackhole: the replicas of a round receive the same bytes");
    stop_hub(&s);
    finish(&s);
}

// A replica's D data streams come up one after another once its control connection is up. Each
// looked the hub's name up again, and the control connection sent nothing until the last was up:
// with a slow resolver (a login node's, 1-2 s a lookup) or a slow link's handshakes, D × that
// exceeded the hub's timeout_s, the hub dropped the session as silent before it was whole (its
// data streams then named no session), and the replica tried again, the same way, until
// diloco_connect_timeout_s. Replica 1 looks names up slowly (tcp_slow_resolve: 0.4 × timeout_s a
// lookup), replica 2 sets each data stream up slowly (tcp_slow_stream: 0.4 × timeout_s before
// each), with 4 streams each (1.6 × timeout_s of setup): both must connect at their first try —
// one lookup for all five connections, heartbeats on the control connection while the streams
// come up — and train with replica 0 (a quorum of 3: every round has all three).
static void test_slow_setup(void) {
    static scenario s;
    open_reports(&s, "slowsetup");
    start_hub(&s, NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.min_replicas = 3;
        c.streams = 4;
        c.steps = 3;
        start_replica_env(&s, &c, id == 1 ? "tcp_slow_resolve:0" : id == 2 ? "tcp_slow_stream:0" : NULL);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "member", 0, 30), "slowsetup: replica %d joins", id);
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 3, 30), "slowsetup: replica %d finishes", id);
    for (int id = 0; id < 3; id++) {
        int rc = wait_exit(s.pids[id], 10);
        EXPECT(rc == 0, "slowsetup: replica %d exits 0 (rc %d)", id, rc);
        bool ok = true;
        int full = rounds_of(&s, id, 3, &ok);
        EXPECT(full == 3 && ok, "slowsetup: replica %d: %d rounds of 3 contributors, each exact: %d", id, full, ok);
    }
    EXPECT(!file_has(s.hub_log, "dropped"), "slowsetup: the hub dropped no replica");
    for (int id = 1; id < 3; id++) {
        char path[400];
        snprintf(path, sizeof path, "%s/slowsetup_R%d.err", dir, id);
        char *err = slurp(path);
        EXPECT(!strstr(err, "waiting for the hub"), "slowsetup: replica %d connects at its first try: %s", id, err);
        if (id == 1) {
            int lookups = 0;
            for (const char *p = strstr(err, "looking up the hub's address"); p;
                 p = strstr(p + 1, "looking up the hub's address"))
                lookups++;
            EXPECT(lookups == 1, "slowsetup: replica 1 looks the hub's name up once for its 5 connections, not %d",
                   lookups);
        }
        free(err);
    }
    stop_hub(&s);
    finish(&s);
}

// ---------------------------------------------------------------- several hubs
// A second relay for s (its fields in *second, its log "<s>_second_hub.log"); the replicas
// get both addresses, s's hub first.
static void start_second_hub(scenario *s, scenario *second, const char *name, const char *extra) {
    memset(second, 0, sizeof *second);
    second->name = name;
    start_hub(second, extra);
    snprintf(s->hub_addr, sizeof s->hub_addr, "127.0.0.1:%d,127.0.0.1:%d", s->port, second->port);
}

// Whether the hub's log holds needle after its first `from` bytes (a restarted hub appends).
static bool await_log_after(const char *path, size_t from, const char *needle, double timeout) {
    double deadline = wall_seconds() + timeout;
    for (;;) {
        char *t = slurp(path);
        bool yes = strlen(t) > from && strstr(t + from, needle) != NULL;
        free(t);
        if (yes || wall_seconds() > deadline) return yes;
        sleep_s(0.05);
    }
}

// Two hubs, each reducing half of the segments: every round is the exact mean of the three
// (the test's reference over the whole payload, byte for byte: what one hub gives), the same
// bytes on every replica, one payload's worth received; each hub logs its share's rounds.
static void test_hubs(void) {
    static scenario s, second;
    open_reports(&s, "hubs");
    start_hub(&s, NULL);
    start_second_hub(&s, &second, "hubs_second", NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.streams = 3;
        c.values = payload_values(3u << 20);
        c.steps = 3;
        c.inner_s = 0.05;
        c.slow_at = 0, c.slow_s = 0.5;
        c.check_traffic = true;
        start_replica(&s, &c);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 3, 30), "hubs: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "hubs: replica %d exits 0", id);
    for (int id = 0; id < 3; id++) {
        bool ok = true;
        int full = rounds_of(&s, id, 3, &ok);
        EXPECT(full == 3 && ok, "hubs: replica %d: %d rounds of 3 contributors, each the exact mean: %d", id, full, ok);
    }
    EXPECT(means_disagree(&s) == 0, "hubs: every replica receives the same bytes");
    EXPECT(file_has(s.hub_log, "round 128 (step 2, attempt 0, share 0) closed: 3 contributor(s) [0 1 2]"),
           "hubs: the first hub reduces share 0");
    EXPECT(file_has(second.hub_log, "round 129 (step 2, attempt 0, share 1) closed: 3 contributor(s) [0 1 2]"),
           "hubs: the second hub reduces share 1");
    EXPECT(file_has(second.hub_log, "replica 2 follows and founds the group") ||
               file_has(second.hub_log, "replica 2 follows: member"),
           "hubs: the second hub is followed, not joined");
    stop_hub(&s);
    stop_hub(&second);
    finish(&s);
    finish(&second);
}

// int8 both ways with each hub's error feedback on its share: every mean byte-exact the
// reference with one residual over the whole model (as one hub computes it), a NaN left out
// of its segment only (segment 1: share 0, the first hub).
static void test_hubs_mean(void) {
    static scenario s, second;
    open_reports(&s, "hubsmean");
    start_hub(&s, NULL);
    start_second_hub(&s, &second, "hubsmean_second", NULL);
    const int64_t block = 128, segment = quant_segment_values(block), values = 3 * segment + 12345;
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.up = c.down = QUANT_INT8;
        c.feedback = true;
        c.block = block;
        c.segment = segment;
        c.values = values;
        c.steps = 6;
        c.slow_at = 0, c.slow_s = 1.0;
        c.nan_id = 1, c.nan_step = 2, c.nan_index = segment + 1000;
        c.check_traffic = true;
        start_replica(&s, &c);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 6, 30), "hubsmean: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "hubsmean: replica %d exits 0", id);
    for (int id = 0; id < 3; id++) {
        bool ok = true;
        int full = rounds_of(&s, id, 3, &ok);
        EXPECT(full == 6 && ok, "hubsmean: replica %d: %d rounds of 3, each byte-exact the reference (%d)", id, full,
               ok);
    }
    EXPECT(means_disagree(&s) == 0, "hubsmean: every replica receives the same bytes");
    EXPECT(file_has(s.hub_log, "round 128: replica 1's contribution holds NaN/Inf (segment 1)"),
           "hubsmean: the first hub logs the NaN it left out");
    // Each hub keeps the residual of its share only (segments 0-1 and 2-3 of the 4).
    char first_share[160], second_share[160];
    snprintf(first_share, sizeof first_share, "for values 0 .. %lld of %lld; ", (long long)(2 * segment - 1),
             (long long)values);
    snprintf(second_share, sizeof second_share, "for values %lld .. %lld of %lld; ", (long long)(2 * segment),
             (long long)(values - 1), (long long)values);
    EXPECT(file_has(s.hub_log, first_share) && !file_has(s.hub_log, second_share),
           "hubsmean: the first hub keeps the residual of share 0 only (%s)", first_share);
    EXPECT(file_has(second.hub_log, second_share) && !file_has(second.hub_log, first_share),
           "hubsmean: the second hub keeps the residual of share 1 only (%s)", second_share);
    stop_hub(&s);
    stop_hub(&second);
    finish(&s);
    finish(&second);
}

// Two hubs; kill -9 the first (the primary) mid-run: every exchange completes through the
// second within timeout + 5 s (its share redone there), every mean exact and the same bytes
// on every replica of a round; restarted on its port, it takes its share again (a round
// closed there with all three). The replicas stop when told (a file), whatever their step.
static void test_hubs_kill(void) {
    static scenario s, second;
    open_reports(&s, "hubkill");
    start_hub(&s, NULL);
    start_second_hub(&s, &second, "hubkill_second", NULL);
    char listen[64], stop_path[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s.port);
    snprintf(stop_path, sizeof stop_path, "%s/hubkill.stop", dir);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 100000;
        c.stop_file = stop_path;
        c.partial = ANY_SHARE;   // dropped from one hub's round after another's closed: in a share unnamed
        start_replica(&s, &c);
    }
    const rec *r = await(&s, 0, "round", 2, 20);
    EXPECT(r != NULL, "hubkill: training");
    long long k_kill = r ? r->k : 0;
    kill(s.hub, SIGKILL);
    waitpid(s.hub, NULL, 0);
    double killed = wall_seconds();
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k_kill + 3, 30), "hubkill: replica %d goes on through the second hub", id);
    printf("hubkill: three rounds more %.2f s after the kill\n", wall_seconds() - killed);
    EXPECT(await_file(second.hub_log, ", share 0) closed: 3 contributor(s) [0 1 2]", 10),
           "hubkill: the second hub reduces the first one's share");
    size_t before = strlen(slurp(s.hub_log));
    start_hub_on(&s, listen, NULL);
    EXPECT(await_log_after(s.hub_log, before, "closed: 3 contributor(s) [0 1 2]", 30),
           "hubkill: restarted, the first hub takes its share again");
    int n_lines = s.n_lines;
    long long k_back = 0;
    for (int i = 0; i < n_lines; i++)
        if (!strcmp(s.lines[i].ev, "round") && s.lines[i].k > k_back) k_back = s.lines[i].k;
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k_back + 2, 30), "hubkill: replica %d goes on with both hubs", id);
    FILE *f = fopen(stop_path, "w");
    if (f) fclose(f);
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 0, 30), "hubkill: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "hubkill: replica %d exits 0", id);
    bool ok = true;
    int slow = 0, failed = 0, full_after = 0;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    for (int i = 0; i < s.n_lines; i++) {
        const rec *x = &s.lines[i];
        if (!strcmp(x->ev, "round") && x->dt > TIMEOUT_S + 5) {
            fprintf(stderr, "hubkill: replica %d's round %lld took %.2f s\n", x->id, x->k, x->dt);
            slow++;
        }
        failed += !strcmp(x->ev, "failed");
        full_after += !strcmp(x->ev, "round") && x->k > k_back && x->n == 3;
    }
    EXPECT(ok, "hubkill: every round every replica saw was exact");
    EXPECT(slow == 0, "hubkill: every exchange within timeout + 5 s (%d slower)", slow);
    EXPECT(failed == 0, "hubkill: no exchange failed (%d): the second hub took the share", failed);
    EXPECT(full_after > 0, "hubkill: rounds of all three after the first hub is back (%d)", full_after);
    EXPECT(means_disagree(&s) == 0, "hubkill: the replicas of a round receive the same bytes");
    EXPECT(steps_disagree(&s) == 0, "hubkill: every replica that takes a step takes the same mean, once");
    stop_hub(&s);
    stop_hub(&second);
    finish(&s);
    finish(&second);
}


static int doomed_replica(scenario *s, const char *name, replica_cfg c, char *err, size_t err_bytes);
static int count_error_lines(const char *text);

// What a scenario's rounds say after the fact: every round ok, none slower than timeout + 5 s,
// no exchange failed, every replica that takes a step takes the same mean, once (the name
// prefixes the checks).
static void check_hub_rounds(scenario *s, const char *name) {
    bool ok = true;
    int slow = 0, failed = 0;
    for (int id = 0; id < 3; id++) rounds_of(s, id, -1, &ok);
    for (int i = 0; i < s->n_lines; i++) {
        const rec *x = &s->lines[i];
        if (!strcmp(x->ev, "round") && x->dt > TIMEOUT_S + 5) {
            fprintf(stderr, "%s: replica %d's round %lld took %.2f s\n", name, x->id, x->k, x->dt);
            slow++;
        }
        failed += !strcmp(x->ev, "failed");
    }
    EXPECT(ok, "%s: every round every replica saw was exact", name);
    EXPECT(slow == 0, "%s: every exchange within timeout + 5 s (%d slower)", name, slow);
    EXPECT(failed == 0, "%s: no exchange failed (%d)", name, failed);
    EXPECT(means_disagree(s) == 0, "%s: the replicas of a round receive the same bytes", name);
    EXPECT(steps_disagree(s) == 0, "%s: every replica that takes a step takes the same mean, once", name);
}

// The largest step any replica has reported a round of.
static long long last_round_step(scenario *s) {
    long long k = 0;
    for (int i = 0; i < s->n_lines; i++)
        if (!strcmp(s->lines[i].ev, "round") && s->lines[i].k > k) k = s->lines[i].k;
    return k;
}

// Whether replica id reported a round of exactly step k.
static bool took_step(scenario *s, int id, long long k) {
    for (int i = 0; i < s->n_lines; i++)
        if (s->lines[i].id == id && !strcmp(s->lines[i].ev, "round") && s->lines[i].k == k) return true;
    return false;
}

static void stop_replicas(scenario *s, const char *stop_path, const char *name) {
    FILE *f = fopen(stop_path, "w");
    if (f) fclose(f);
    for (int id = 0; id < 3; id++) EXPECT(await(s, id, "done", 0, 30), "%s: replica %d finishes", name, id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s->pids[id], 10) == 0, "%s: replica %d exits 0", name, id);
}

// Whether the hub's log says replica id was evicted from its round of outer step k because
// other replicas completed that step (the mixed case: relay.c abort_round, or on_contribute's
// refusal).
static bool evicted_for_completers(const char *path, int id, long long k) {
    char *t = slurp(path), abort_at[80], refused[80], step[48];
    snprintf(abort_at, sizeof abort_at, " completed step %lld without it; its contributor(s) [", k);
    snprintf(refused, sizeof refused, "replica %d: contribution to round ", id);
    snprintf(step, sizeof step, "(step %lld, ", k);
    bool yes = false;
    for (char *line = strtok(t, "\n"); line && !yes; line = strtok(NULL, "\n")) {
        const char *a = strstr(line, abort_at);
        if (a) {
            for (const char *p = a + strlen(abort_at); *p && *p != ']'; ) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                yes |= v == id;
                p = end;
            }
        } else if (strstr(line, refused) && strstr(line, step) &&
                   strstr(line, "other replicas completed that outer step")) {
            yes = true;
        }
    }
    free(t);
    return yes;
}

// Two hubs; the second (not the primary) dies the mixed way (TRAIN_GPT_FAULT relay_die_in_close):
// at the close of its round of some step k it sends ROUND to replica 0 only, and dies once
// replica 0 has completed step k. Replica 0 takes step k; replicas 1 and 2, without that
// share's ROUND, redo the share at the first hub, where replica 0's DONE leaves their round
// nothing to stand for: evicted, they rejoin and take replica 0's state. Every replica that
// takes a step takes the same mean (none from two rounds), none twice; every exchange within
// timeout + 5 s; restarted, the second hub takes its share again.
static void test_hubs_mixed(void) {
    static scenario s, second;
    open_reports(&s, "hubmixed");
    start_hub(&s, NULL);
    memset(&second, 0, sizeof second);
    second.name = "hubmixed_second";
    start_hub_fault(&second, "127.0.0.1:0", NULL, "relay_die_in_close:2");
    snprintf(s.hub_addr, sizeof s.hub_addr, "127.0.0.1:%d,127.0.0.1:%d", s.port, second.port);
    char listen[64], stop_path[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", second.port);
    snprintf(stop_path, sizeof stop_path, "%s/hubmixed.stop", dir);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 100000;
        c.stop_file = stop_path;
        c.partial = ANY_SHARE;
        // Replica 0's inner phase after step 2 (the step the second hub dies in, when its first
        // rounds have all three) is longer than the others' failover: their redo of the dead
        // hub's share reaches the first hub before replica 0's next contribution does, so that
        // only its DONE can tell the first hub that the redo must not stand.
        if (id == 0) c.slow_at = 3, c.slow_s = 2 * TIMEOUT_S + 0.5;
        start_replica(&s, &c);
    }
    EXPECT(await_file(second.hub_log, "relay_die_in_close: the hub dies now", 30),
           "hubmixed: the second hub sends one replica its ROUND and dies");
    int status = 0;
    waitpid(second.hub, &status, 0);
    EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "hubmixed: the second hub died of SIGKILL");
    char *log = slurp(second.hub_log);
    const char *at = strstr(log, "went to replica 0 only");
    const char *st = at ? strstr(log, "ROUND of round ") : NULL;
    long long k = -1;
    if (st) st = strstr(st, "(step ");
    if (st) k = atoll(st + 6);
    free(log);
    EXPECT(k >= 0, "hubmixed: the second hub names the step whose ROUND went to replica 0 only");
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k + 3, 30), "hubmixed: replica %d goes on through the first hub", id);
    EXPECT(took_step(&s, 0, k), "hubmixed: replica 0, which had every share's ROUND, takes step %lld", k);
    for (int id = 1; id < 3; id++) {
        EXPECT(!took_step(&s, id, k), "hubmixed: replica %d, without the dead hub's ROUND, does not take step %lld", id,
               k);
        EXPECT(await(&s, id, "evicted", k, 1) && await(&s, id, "gotstate", k, 1),
               "hubmixed: replica %d is evicted from step %lld and takes the group's state", id, k);
    }
    for (int id = 1; id < 3; id++) {
        const rec *e = await(&s, id, "evicted", k, 1);
        EXPECT(e && evicted_for_completers(s.hub_log, id, e->k),
               "hubmixed: the first hub aborts or refuses replica %d's redo of a share that replica 0 completed the "
               "step without", id);
    }
    size_t before = strlen(slurp(second.hub_log));
    start_hub_fault(&second, listen, NULL, NULL);
    EXPECT(await_log_after(second.hub_log, before, "closed: 3 contributor(s) [0 1 2]", 30),
           "hubmixed: restarted, the second hub takes its share again");
    long long back = last_round_step(&s);
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", back + 2, 30), "hubmixed: replica %d goes on with both hubs", id);
    stop_replicas(&s, stop_path, "hubmixed");
    check_hub_rounds(&s, "hubmixed");
    stop_hub(&s);
    stop_hub(&second);
    finish(&s);
    finish(&second);
}

// Three hubs (s's and b's and c's, named NAME_b and NAME_c), s.hub_addr listing them; b's and
// c's listen addresses (to restart them on their ports) and a stop file for the replicas.
static void start_three_hubs(scenario *s, scenario *b, scenario *c, const char *name_b, const char *name_c,
                             char listen_b[64], char listen_c[64], char *stop_path, size_t stop_bytes) {
    start_hub(s, NULL);
    memset(b, 0, sizeof *b);
    b->name = name_b;
    start_hub(b, NULL);
    memset(c, 0, sizeof *c);
    c->name = name_c;
    start_hub(c, NULL);
    snprintf(s->hub_addr, sizeof s->hub_addr, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", s->port, b->port, c->port);
    snprintf(listen_b, 64, "127.0.0.1:%d", b->port);
    snprintf(listen_c, 64, "127.0.0.1:%d", c->port);
    snprintf(stop_path, stop_bytes, "%s/%s.stop", dir, s->name);
}

// Stops the three hubs of start_three_hubs and reports their checks.
static void stop_three_hubs(scenario *s, scenario *b, scenario *c) {
    stop_hub(s);
    stop_hub(b);
    stop_hub(c);
    finish(s);
    finish(b);
    finish(c);
}

// Three replicas that exchange until the stop file appears (stop_replicas), any share partial.
static void start_endless_replicas(scenario *s, const char *stop_path) {
    for (int id = 0; id < 3; id++) {
        replica_cfg cfg = default_cfg(s, id);
        cfg.steps = 100000;
        cfg.stop_file = stop_path;
        cfg.partial = ANY_SHARE;
        start_replica(s, &cfg);
    }
}

// Three hubs: kill -9 the second (not the primary): its share moves to the third within
// timeout + 5 s; then kill -9 the third: both shares move to the first. A replica that lists the
// hubs in another order is refused with one line. Restarted, the second and third hubs each
// take their share again (a round of all three in each one's log). Every exchange within
// timeout + 5 s, none failed, every step the same mean on every replica that takes it, once.
static void test_hubs_three(void) {
    static scenario s, b, c;
    open_reports(&s, "hubs3");
    char listen_b[64], listen_c[64], stop_path[400];
    start_three_hubs(&s, &b, &c, "hubs3_b", "hubs3_c", listen_b, listen_c, stop_path, sizeof stop_path);
    start_endless_replicas(&s, stop_path);
    const rec *r = await(&s, 0, "round", 2, 20);
    EXPECT(r != NULL, "hubs3: training");
    EXPECT(file_has(c.hub_log, "(step 2, attempt 0, share 2) closed: 3 contributor(s) [0 1 2]"),
           "hubs3: the third hub reduces share 2");

    // Another order: the first hub takes it as hub 1 of 3 like the others, the second and third
    // refuse it; one error line, exit 1.
    replica_cfg bad = default_cfg(&s, 3);
    bad.replicas = 4;
    char swapped[200], err[2048];
    snprintf(swapped, sizeof swapped, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", s.port, c.port, b.port);
    bad.rendezvous = swapped;
    int rc = doomed_replica(&s, "order", bad, err, sizeof err);
    EXPECT(rc == 1 && count_error_lines(err) == 1 && strstr(err, "refused replica 3") &&
               strstr(err, "every replica must list the same hubs in the same order"),
           "hubs3: hubs listed in another order: one line, exit 1 (rc %d): %s", rc, err);
    EXPECT(file_has(b.hub_log, "replica 3 lists this hub as hub 3 of 3 in its diloco_rendezvous, but replica") ||
               file_has(c.hub_log, "replica 3 lists this hub as hub 2 of 3 in its diloco_rendezvous, but replica"),
           "hubs3: the hub logs the order it was given and the group's");

    kill(b.hub, SIGKILL);
    waitpid(b.hub, NULL, 0);
    long long k = last_round_step(&s);
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k + 3, 30), "hubs3: replica %d goes on without the second hub", id);
    EXPECT(await_file(c.hub_log, ", share 1) closed: 3 contributor(s) [0 1 2]", 10),
           "hubs3: the third hub reduces the second one's share");
    kill(c.hub, SIGKILL);
    waitpid(c.hub, NULL, 0);
    k = last_round_step(&s);
    size_t first_before = strlen(slurp(s.hub_log));
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k + 3, 30), "hubs3: replica %d goes on through the first hub alone", id);
    EXPECT(await_log_after(s.hub_log, first_before, ", share 1) closed: 3 contributor(s) [0 1 2]", 10) &&
               await_log_after(s.hub_log, first_before, ", share 2) closed: 3 contributor(s) [0 1 2]", 10),
           "hubs3: the first hub reduces every share");
    size_t before_b = strlen(slurp(b.hub_log)), before_c = strlen(slurp(c.hub_log));
    start_hub_on(&b, listen_b, NULL);
    start_hub_on(&c, listen_c, NULL);
    EXPECT(await_log_after(b.hub_log, before_b, "share 1) closed: 3 contributor(s) [0 1 2]", 30),
           "hubs3: restarted, the second hub takes its share again");
    EXPECT(await_log_after(c.hub_log, before_c, "share 2) closed: 3 contributor(s) [0 1 2]", 30),
           "hubs3: restarted, the third hub takes its share again");
    stop_replicas(&s, stop_path, "hubs3");
    check_hub_rounds(&s, "hubs3");
    stop_three_hubs(&s, &b, &c);
}

// Two hubs and a payload of one segment: the second hub has no share and no round, only the
// replicas' FOLLOW and DONEs (hubfew).
static void test_hubs_few(void) {
    static scenario s, second;
    open_reports(&s, "hubfew");
    start_hub(&s, NULL);
    start_second_hub(&s, &second, "hubfew_second", NULL);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.values = SEGMENT_VALUES;   // one segment: share 0 only
        c.steps = 80;
        c.inner_s = 0.01;
        start_replica(&s, &c);
    }
    for (int id = 0; id < 3; id++) EXPECT(await(&s, id, "done", 80, 120), "hubfew: replica %d finishes", id);
    for (int id = 0; id < 3; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "hubfew: replica %d exits 0", id);
    EXPECT(!file_has(second.hub_log, "far past"), "hubfew: the share-less hub drops nobody for DONE far past");
    check_hub_rounds(&s, "hubfew");
    stop_hub(&s);
    stop_hub(&second);
    finish(&s);
    finish(&second);
}

// Counts the replicas' evictions (into *all) and returns those that no hub's log explains as the
// mixed case's (evicted_for_completers), naming each.
static int evictions_not_for_completers(const scenario *s, const char **logs, int n_logs, const char *name,
                                        int *all) {
    int other = 0;
    *all = 0;
    for (int i = 0; i < s->n_lines; i++) {
        if (strcmp(s->lines[i].ev, "evicted")) continue;
        ++*all;
        bool explained = false;
        for (int j = 0; j < n_logs && !explained; j++)
            explained = evicted_for_completers(logs[j], s->lines[i].id, s->lines[i].k);
        if (!explained) {
            other++;
            printf("%s: replica %d evicted at step %lld, and no hub's log says other replicas completed that step\n",
                   name, s->lines[i].id, (long long)s->lines[i].k);
        }
    }
    return other;
}

// One segment, two hubs; after step 70 kill -9 the first hub (the only one with a share): share 0
// moves to the second, as in hubkill, and nobody is evicted but the mixed case's losers
// (hubfewkill). Before, the second hub had dropped every replica at step 65, unnoticed, and all
// of them rejoined here.
static void test_hubs_few_kill(void) {
    static scenario s, second;
    open_reports(&s, "hubfewkill");
    start_hub(&s, NULL);
    start_second_hub(&s, &second, "hubfewkill_second", NULL);
    char stop_path[400];
    snprintf(stop_path, sizeof stop_path, "%s/hubfewkill.stop", dir);
    for (int id = 0; id < 3; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.values = SEGMENT_VALUES;
        c.steps = 100000;
        c.inner_s = 0.01;
        c.stop_file = stop_path;
        c.partial = ANY_SHARE;
        start_replica(&s, &c);
    }
    const rec *r = await(&s, 0, "round", 70, 60);
    EXPECT(r != NULL, "hubfewkill: 70 rounds");
    kill(s.hub, SIGKILL);
    waitpid(s.hub, NULL, 0);
    double killed = wall_seconds();
    long long k = last_round_step(&s);
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k + 3, 60), "hubfewkill: replica %d goes on through the second hub", id);
    printf("hubfewkill: three rounds more %.2f s after the kill\n", wall_seconds() - killed);
    stop_replicas(&s, stop_path, "hubfewkill");
    EXPECT(!file_has(second.hub_log, "far past"), "hubfewkill: the second hub drops nobody for DONE far past");
    // An eviction is right only in the mixed case: the kill came after some replicas had the
    // first hub's ROUND and others had not, and the others' redo at the second hub was aborted
    // or refused for the completers (docs/protocol.md, "Several hubs"; the official CI's
    // machine met it once in 2026-12). Any other is the bug this scenario is for.
    const char *logs[] = {second.hub_log};
    int ev = 0, other = evictions_not_for_completers(&s, logs, 1, "hubfewkill", &ev);
    EXPECT(other == 0 && ev < 3, "hubfewkill: nobody evicted but the mixed case's losers (%d evictions, %d of "
           "them not for replicas that completed the step)", ev, other);
    check_hub_rounds(&s, "hubfewkill");
    stop_hub(&second);
    finish(&s);
    finish(&second);
}

// Three hubs; kill -9 the second and restart it on its port at once (well within timeout_s, as a
// supervisor would), three times: the replicas go on, nobody evicted (but a mixed step's losers),
// every step the same mean, none twice (hubquick).
static void test_hubs_quick(void) {
    static scenario s, b, c;
    open_reports(&s, "hubquick");
    char listen_b[64], listen_c[64], stop_path[400];
    start_three_hubs(&s, &b, &c, "hubquick_b", "hubquick_c", listen_b, listen_c, stop_path, sizeof stop_path);
    start_endless_replicas(&s, stop_path);
    EXPECT(await(&s, 0, "round", 3, 20) != NULL, "hubquick: training");
    for (int rep = 0; rep < 3; rep++) {
        kill(b.hub, SIGKILL);
        waitpid(b.hub, NULL, 0);
        start_hub_on(&b, listen_b, NULL);
        long long k = last_round_step(&s);
        for (int id = 0; id < 3; id++)
            EXPECT(await(&s, id, "round", k + 4, 40), "hubquick: rep %d: replica %d goes on", rep, id);
    }
    stop_replicas(&s, stop_path, "hubquick");
    // As in hubfewkill, a kill in a close (or replicas that disagree for a moment on whether the
    // hub is back) may evict the losers of a mixed step; before, every replica was evicted at
    // every kill, and 1154 times in all.
    const char *logs[] = {s.hub_log, b.hub_log, c.hub_log};
    int ev = 0, other = evictions_not_for_completers(&s, logs, 3, "hubquick", &ev);
    EXPECT(other == 0 && ev <= 6, "hubquick: nobody evicted but the mixed case's losers (%d evictions, %d of them "
           "not for replicas that completed the step)", ev, other);
    check_hub_rounds(&s, "hubquick");
    stop_three_hubs(&s, &b, &c);
}

// Two hubs, both killed and restarted on their ports at once (one host's supervisor, or a link
// flap here): every share fails, no hub is live, and the replicas rejoin once the hubs are back
// (hubboth). They exchanged "none of the hubs is reachable" at every step for good: the hubs'
// revivers followed them from a later step than the one they kept trying.
static void test_hubs_both(void) {
    static scenario s, b;
    open_reports(&s, "hubboth");
    start_hub(&s, NULL);
    memset(&b, 0, sizeof b);
    b.name = "hubboth_b";
    start_hub(&b, NULL);
    char listen_a[64], listen_b[64], stop_path[400], addr[sizeof s.hub_addr];
    snprintf(addr, sizeof addr, "127.0.0.1:%d,127.0.0.1:%d", s.port, b.port);
    snprintf(s.hub_addr, sizeof s.hub_addr, "%s", addr);
    snprintf(listen_a, sizeof listen_a, "127.0.0.1:%d", s.port);
    snprintf(listen_b, sizeof listen_b, "127.0.0.1:%d", b.port);
    snprintf(stop_path, sizeof stop_path, "%s/hubboth.stop", dir);
    start_endless_replicas(&s, stop_path);
    EXPECT(await(&s, 0, "round", 3, 20) != NULL, "hubboth: training");
    kill(s.hub, SIGKILL);
    kill(b.hub, SIGKILL);
    waitpid(s.hub, NULL, 0);
    waitpid(b.hub, NULL, 0);
    start_hub_on(&s, listen_a, NULL);
    start_hub_on(&b, listen_b, NULL);
    snprintf(s.hub_addr, sizeof s.hub_addr, "%s", addr);
    long long k = last_round_step(&s);
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k + 4, 60), "hubboth: replica %d goes on once both hubs are back", id);
    stop_replicas(&s, stop_path, "hubboth");
    // The exchange in flight when both died fails (no hub for its shares): not the others.
    bool ok = true;
    int failed = 0;
    for (int id = 0; id < 3; id++) rounds_of(&s, id, -1, &ok);
    for (int i = 0; i < s.n_lines; i++) failed += !strcmp(s.lines[i].ev, "failed");
    EXPECT(ok, "hubboth: every round every replica saw was exact");
    EXPECT(failed <= 3, "hubboth: one failed exchange per replica at most (%d)", failed);
    EXPECT(means_disagree(&s) == 0, "hubboth: the replicas of a round receive the same bytes");
    EXPECT(steps_disagree(&s) == 0, "hubboth: every replica that takes a step takes the same mean, once");
    stop_hub(&s);
    stop_hub(&b);
    finish(&s);
    finish(&b);
}

// Three hubs; kill -9 the second and third at the same moment: both shares move to the first;
// restarted, each takes its share again (hubtwo).
static void test_hubs_two_die(void) {
    static scenario s, b, c;
    open_reports(&s, "hubtwo");
    char listen_b[64], listen_c[64], stop_path[400];
    start_three_hubs(&s, &b, &c, "hubtwo_b", "hubtwo_c", listen_b, listen_c, stop_path, sizeof stop_path);
    start_endless_replicas(&s, stop_path);
    EXPECT(await(&s, 0, "round", 3, 20) != NULL, "hubtwo: training");
    kill(b.hub, SIGKILL);
    kill(c.hub, SIGKILL);
    waitpid(b.hub, NULL, 0);
    waitpid(c.hub, NULL, 0);
    long long k = last_round_step(&s);
    for (int id = 0; id < 3; id++)
        EXPECT(await(&s, id, "round", k + 3, 30), "hubtwo: replica %d goes on through the first hub", id);
    size_t before_b = strlen(slurp(b.hub_log)), before_c = strlen(slurp(c.hub_log));
    start_hub_on(&b, listen_b, NULL);
    start_hub_on(&c, listen_c, NULL);
    EXPECT(await_log_after(b.hub_log, before_b, "share 1) closed: 3 contributor(s) [0 1 2]", 30), "hubtwo: b back");
    EXPECT(await_log_after(c.hub_log, before_c, "share 2) closed: 3 contributor(s) [0 1 2]", 30), "hubtwo: c back");
    stop_replicas(&s, stop_path, "hubtwo");
    check_hub_rounds(&s, "hubtwo");
    stop_three_hubs(&s, &b, &c);
}

// ---------------------------------------------------------------- evil peers
// Connects and reads the hub's HELLO.
static int evil_connect(scenario *s, conn *c, wire_hello *hello) {
    char err[256];
    int fd = net_connect(s->hub_addr, wall_seconds() + 5, err, sizeof err);
    EXPECT(fd >= 0, "evil: connect: %s", err);
    conn_init(c, fd, "hub");
    c->allowed_rx = CONN_ALLOW(WIRE_HELLO);
    wire_frame f;
    EXPECT(conn_read_until(c, &f, wall_seconds() + 5, err, sizeof err) == CONN_FRAME, "evil: HELLO: %s", err);
    EXPECT(!wire_decode_hello(f.payload, (size_t)f.payload_bytes, hello), "evil: HELLO decodes");
    return fd;
}

// An AUTH frame (whole, tagged with the handshake key) for the given fields and secret.
static size_t evil_auth(uint8_t *frame, const wire_hello *hello, int id, int stream, uint64_t session,
                        uint64_t fingerprint, const char *secret, wire_auth *out) {
    wire_auth a = {.replica_id = (uint32_t)id, .stream_index = (uint16_t)stream, .streams = 1, .replicas = 8,
                   .min_replicas = 1, .run_fingerprint = fingerprint, .session_id = session, .hubs = 1};
    memset(a.nonce_c, 0x42, sizeof a.nonce_c);
    uint8_t p[WIRE_AUTH_BYTES];
    wire_encode_auth(&a, p);
    wire_auth_proof((const uint8_t *)secret, strlen(secret), hello->nonce_h, p, WIRE_AUTH_PROVEN_BYTES, a.proof);
    wire_encode_auth(&a, p);
    if (out) *out = a;
    static const uint8_t zero[WIRE_KEY_BYTES] = {0};
    return wire_build(frame, WIRE_AUTH, 0, p, sizeof p, zero);
}

// True when the hub closes the connection within 5 s (after whatever it answers).
static bool hub_hangs_up(int fd) {
    double deadline = wall_seconds() + 5;
    char buf[4096];
    while (wall_seconds() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
}

// A child that opens the transport with some wrong setting; returns its exit code and
// stderr.
static int doomed_replica(scenario *s, const char *name, replica_cfg c, char *err, size_t err_bytes) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s_%s.err", dir, s->name, name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        redirect(2, path);
        close(s->pipe_rd);
        report_fd = s->pipe_wr;
        _exit(replica_main(&c) == 0 ? 42 : 43);   // reaching the end means it was let in
    }
    int rc = wait_exit(pid, 15);
    char *text = slurp(path);
    snprintf(err, err_bytes, "%s", text);
    free(text);
    return rc;
}

static int count_error_lines(const char *text) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, "train_gpt: error:")); p++) n++;
    return n;
}

static void test_evil(void) {
    static scenario s;
    open_reports(&s, "evil");
    start_hub(&s, NULL);
    for (int id = 0; id < 2; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.steps = 40;
        c.inner_s = 0.1;
        start_replica(&s, &c);
    }
    EXPECT(await(&s, 1, "round", 1, 20), "evil: the good replicas are training");
    static uint8_t frame[4096];
    wire_hello hello;
    conn c;
    char err[2048];
    int fd;

    // Garbage.
    fd = evil_connect(&s, &c, &hello);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    EXPECT(net_send_all(fd, http, strlen(http), wall_seconds() + 2, err, sizeof err), "evil: send garbage");
    EXPECT(hub_hangs_up(fd), "evil: garbage: the hub hangs up");
    EXPECT(await_file(s.hub_log, "bad magic", 5), "evil: garbage is logged as bad magic");
    conn_close(&c);

    // A truncated frame: a third of an AUTH, then the connection closes.
    fd = evil_connect(&s, &c, &hello);
    size_t n = evil_auth(frame, &hello, 5, 0, 0, FINGERPRINT, SECRET, NULL);
    EXPECT(net_send_all(fd, frame, n / 3, wall_seconds() + 2, err, sizeof err), "evil: send a truncated frame");
    shutdown(fd, SHUT_WR);
    EXPECT(await_file(s.hub_log, "truncated frame: the peer closed after", 5), "evil: the truncated frame is logged");
    conn_close(&c);

    // A length of 2^63.
    fd = evil_connect(&s, &c, &hello);
    wire_put_header(frame, WIRE_AUTH, 0, (uint64_t)1 << 63);
    EXPECT(net_send_all(fd, frame, WIRE_HEADER_BYTES, wall_seconds() + 2, err, sizeof err), "evil: send 2^63");
    EXPECT(hub_hangs_up(fd), "evil: 2^63: the hub hangs up");
    EXPECT(await_file(s.hub_log, "payload length of 9223372036854775808, over its bound of 104", 5),
           "evil: the length of 2^63 is logged");
    conn_close(&c);

    // A frame of a type not allowed before the handshake, claiming 16 MiB.
    fd = evil_connect(&s, &c, &hello);
    wire_put_header(frame, WIRE_DATA, 0, 16u << 20);
    EXPECT(net_send_all(fd, frame, WIRE_HEADER_BYTES, wall_seconds() + 2, err, sizeof err), "evil: send DATA");
    EXPECT(hub_hangs_up(fd), "evil: DATA before AUTH: the hub hangs up");
    EXPECT(await_file(s.hub_log, "unexpected DATA frame", 5), "evil: DATA before the handshake is logged");
    conn_close(&c);

    // A bad tag.
    fd = evil_connect(&s, &c, &hello);
    n = evil_auth(frame, &hello, 5, 0, 0, FINGERPRINT, SECRET, NULL);
    frame[n - 1] ^= 0x55;
    EXPECT(net_send_all(fd, frame, n, wall_seconds() + 2, err, sizeof err), "evil: send a bad tag");
    EXPECT(hub_hangs_up(fd), "evil: bad tag: the hub hangs up");
    EXPECT(await_file(s.hub_log, "bad tag", 5), "evil: the bad tag is logged");
    conn_close(&c);

    // A wrong secret, raw: REFUSE, then the hub hangs up.
    fd = evil_connect(&s, &c, &hello);
    n = evil_auth(frame, &hello, 5, 0, 0, FINGERPRINT, "not-the-secret-at-all", NULL);
    EXPECT(net_send_all(fd, frame, n, wall_seconds() + 2, err, sizeof err), "evil: send a wrong proof");
    c.allowed_rx = CONN_ALLOW(WIRE_REFUSE) | CONN_ALLOW(WIRE_WELCOME);
    wire_frame f;
    EXPECT(conn_read_until(&c, &f, wall_seconds() + 5, err, sizeof err) == CONN_FRAME && f.type == WIRE_REFUSE,
           "evil: a wrong secret gets REFUSE");
    EXPECT(hub_hangs_up(fd), "evil: wrong secret: the hub hangs up");
    EXPECT(await_file(s.hub_log, "wrong secret", 5), "evil: the wrong secret is logged");
    conn_close(&c);

    // A data stream for a session that does not exist (with the right secret).
    fd = evil_connect(&s, &c, &hello);
    n = evil_auth(frame, &hello, 6, 1, 12345, FINGERPRINT, SECRET, NULL);
    EXPECT(net_send_all(fd, frame, n, wall_seconds() + 2, err, sizeof err), "evil: send a stray data stream");
    EXPECT(hub_hangs_up(fd), "evil: stray data stream: the hub hangs up");
    EXPECT(await_file(s.hub_log, "names no session", 5), "evil: the stray data stream is logged");
    conn_close(&c);

    // A replayed frame: a real session (replica 7), then the same heartbeat twice.
    fd = evil_connect(&s, &c, &hello);
    wire_auth a;
    n = evil_auth(frame, &hello, 7, 0, 0, FINGERPRINT, SECRET, &a);
    EXPECT(net_send_all(fd, frame, n, wall_seconds() + 2, err, sizeof err), "evil: send AUTH");
    c.allowed_rx = CONN_ALLOW(WIRE_REFUSE) | CONN_ALLOW(WIRE_WELCOME);
    EXPECT(conn_read_until(&c, &f, wall_seconds() + 5, err, sizeof err) == CONN_FRAME && f.type == WIRE_WELCOME,
           "evil: a right secret gets WELCOME");
    uint8_t c2h[WIRE_KEY_BYTES], h2c[WIRE_KEY_BYTES];
    wire_session_keys((const uint8_t *)SECRET, strlen(SECRET), hello.nonce_h, a.nonce_c, c2h, h2c);
    n = wire_build(frame, WIRE_HEARTBEAT, 1, NULL, 0, c2h);
    EXPECT(net_send_all(fd, frame, n, wall_seconds() + 2, err, sizeof err), "evil: heartbeat");
    EXPECT(net_send_all(fd, frame, n, wall_seconds() + 2, err, sizeof err), "evil: the same heartbeat again");
    EXPECT(hub_hangs_up(fd), "evil: replay: the hub hangs up");
    EXPECT(await_file(s.hub_log, "replayed or reordered", 5), "evil: the replay is logged");
    conn_close(&c);

    // A connection that says nothing: cut off after the timeout.
    fd = evil_connect(&s, &c, &hello);
    EXPECT(hub_hangs_up(fd), "evil: silence: the hub hangs up");
    EXPECT(await_file(s.hub_log, "no authentication within", 5), "evil: the silent connection is logged");
    conn_close(&c);

    // Through the transport: a wrong secret, a wrong fingerprint, a duplicate id. Each is
    // this replica's own configuration: one error line, exit 1 — but the duplicate exit 75: the
    // live session the hub holds may be this replica's previous job's (a requeue), which a later
    // try finds gone.
    replica_cfg bad = default_cfg(&s, 2);
    bad.secret = (const uint8_t *)"another-secret-entirely";
    bad.secret_bytes = strlen("another-secret-entirely");
    int rc = doomed_replica(&s, "secret", bad, err, sizeof err);
    EXPECT(rc == 1 && count_error_lines(err) == 1 &&
               strstr(err, "diloco_secret_file: the hub at 127.0.0.1:") && strstr(err, "refused our secret"),
           "evil: wrong secret: one line naming diloco_secret_file, exit 1 (rc %d): %s", rc, err);
    bad = default_cfg(&s, 2);
    bad.fingerprint = 0xbad;
    rc = doomed_replica(&s, "fingerprint", bad, err, sizeof err);
    EXPECT(rc == 1 && count_error_lines(err) == 1 && strstr(err, "has run_fingerprint 0000000000000bad but the group has") &&
               strstr(err, "refused replica 2"),
           "evil: wrong fingerprint: one line, exit 1 (rc %d): %s", rc, err);
    EXPECT(file_has(s.hub_log, "has run_fingerprint 0000000000000bad"), "evil: the fingerprint is logged");
    bad = default_cfg(&s, 1);
    bad.connect_timeout_s = 1;
    rc = doomed_replica(&s, "duplicate", bad, err, sizeof err);
    EXPECT(rc == 75 && count_error_lines(err) == 1 && strstr(err, "duplicate replica id 1") &&
               strstr(err, "this replica's previous job") && strstr(err, "same diloco_replica_id"),
           "evil: duplicate id: one line naming a previous job and the same id, exit 75 (rc %d): %s", rc, err);
    EXPECT(file_has(s.hub_log, "duplicate replica id 1"), "evil: the duplicate is logged");

    // A fake hub that talks garbage, and one that does not know the secret.
    for (int fake = 0; fake < 2; fake++) {
        char lerr[256];
        int lfd = net_listen("127.0.0.1:0", lerr, sizeof lerr);
        EXPECT(lfd >= 0, "evil: listen: %s", lerr);
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", net_local_port(lfd));
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) {
                char peer[96];
                if (net_wait(lfd, POLLIN, wall_seconds() + 30) <= 0) _exit(0);
                int cfd = net_accept(lfd, peer, sizeof peer);
                if (cfd < 0) continue;
                if (fake == 0) {
                    char e2[64];
                    (void)net_send_all(cfd, "SSH-2.0-OpenSSH_9.2\r\n", 21, wall_seconds() + 2, e2, sizeof e2);
                } else {
                    // HELLO, read AUTH, then a WELCOME with a proof under another secret.
                    conn fc;
                    conn_init(&fc, cfd, "client");
                    wire_hello h = {.timeout_ms = 2000};
                    uint8_t p[WIRE_WELCOME_BYTES];
                    conn_send(&fc, WIRE_HELLO, p, wire_encode_hello(&h, p), NULL, 0, NULL);
                    char e2[256];
                    conn_flush_until(&fc, wall_seconds() + 2, e2, sizeof e2);
                    fc.allowed_rx = CONN_ALLOW(WIRE_AUTH);
                    wire_frame af;
                    wire_auth aa;
                    if (conn_read_until(&fc, &af, wall_seconds() + 5, e2, sizeof e2) == CONN_FRAME &&
                        !wire_decode_auth(af.payload, (size_t)af.payload_bytes, &aa)) {
                        wire_welcome w = {.session_id = 1, .timeout_ms = 2000};
                        wire_welcome_proof((const uint8_t *)"guessed-secret!!", 16, h.nonce_h, aa.nonce_c, p, 16,
                                           w.proof);
                        conn_send(&fc, WIRE_WELCOME, p, wire_encode_welcome(&w, p), NULL, 0, NULL);
                        conn_flush_until(&fc, wall_seconds() + 2, e2, sizeof e2);
                    }
                    sleep_s(0.5);
                    conn_close(&fc);
                    continue;
                }
                sleep_s(0.2);
                close(cfd);
            }
        }
        close(lfd);
        bad = default_cfg(&s, 0);
        bad.rendezvous = addr;
        bad.connect_timeout_s = 1;
        rc = doomed_replica(&s, fake ? "fakehub_secret" : "fakehub_garbage", bad, err, sizeof err);
        // Garbage is no hub: status 1 and a hint at a wrong port (a requeue would meet it again),
        // where nothing listening is 75 (the relay may be back for the next job); a hub without the
        // secret is refused, 1.
        if (fake == 0)
            EXPECT(rc == 1 && count_error_lines(err) == 1 && strstr(err, "cannot reach the hub at") &&
                       strstr(err, "bad magic") && strstr(err, "no train_gpt hub of this version: a wrong port?"),
                   "evil: a hub that talks garbage: one line naming a wrong port, exit 1 (rc %d): %s", rc, err);
        else
            EXPECT(rc == 1 && count_error_lines(err) == 1 && strstr(err, "could not prove it knows our secret"),
                   "evil: a hub without the secret: one line, exit 1 (rc %d): %s", rc, err);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }

    // Through all of it, the two good replicas kept training.
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 40, 40), "evil: good replica %d finishes", id);
    for (int id = 0; id < 2; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "evil: good replica %d exits 0", id);
    bool ok = true;
    int good_rounds = rounds_of(&s, 0, 2, &ok);
    EXPECT(ok && good_rounds == 40, "evil: replica 0: %d rounds of 2, all exact (%d)", good_rounds, ok);
    EXPECT(means_disagree(&s) == 0, "evil: both replicas receive the same bytes");
    stop_hub(&s);
    finish(&s);
}

static void test_serve(void) {
    static scenario s;
    open_reports(&s, "serve");
    char lerr[256];
    int lfd = net_listen("127.0.0.1:0", lerr, sizeof lerr);
    int port = net_local_port(lfd);
    close(lfd);
    snprintf(s.hub_addr, sizeof s.hub_addr, "127.0.0.1:%d", port);
    for (int id = 0; id < 2; id++) {
        replica_cfg c = default_cfg(&s, id);
        c.replicas = 2;
        c.steps = 3;
        c.serve = id == 0;
        // The host's first inner phase is long enough for the other to connect (one that
        // comes after the first round would join through a state transfer: also fine).
        if (id == 0) c.slow_at = 0, c.slow_s = 1.0;
        start_replica(&s, &c);
    }
    for (int id = 0; id < 2; id++) EXPECT(await(&s, id, "done", 3, 20), "serve: replica %d finishes", id);
    for (int id = 0; id < 2; id++) EXPECT(wait_exit(s.pids[id], 10) == 0, "serve: replica %d exits 0", id);
    bool ok = true;
    int rounds = rounds_of(&s, 1, 2, &ok);
    EXPECT(rounds >= 2 && ok, "serve: rounds of 2 through the replica's hub (%d)", rounds);
    char path[400];
    snprintf(path, sizeof path, "%s/serve_R0.err", dir);
    EXPECT(file_has(path, "round 2 closed: 2 contributor(s) [0 1]") && file_has(path, "relay ["),
           "serve: the hub thread logs to stderr");
    finish(&s);
}

static int relay_child(char **argv, int argc, char *err, size_t err_bytes) {
    char path[400];
    snprintf(path, sizeof path, "%s/cli.err", dir);
    unlink(path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        redirect(1, path);
        redirect(2, path);
        exit(relay_main(argc, argv));   // exit, not _exit: stdout is flushed
    }
    int rc = wait_exit(pid, 10);
    char *text = slurp(path);
    snprintf(err, err_bytes, "%s", text);
    free(text);
    return rc;
}

// stopjoin: a replica whose join the hub holds (a quorum of 2 that never comes) gets SIGTERM: its
// join returns JOIN_STOPPED (transport_options.stop, the caller's signal flag), it says LEAVE and
// exits 0. The join ignored the signal: only SIGKILL ended the process.
static volatile sig_atomic_t stopjoin_flag = 0;
static void stopjoin_on_term(int sig) { stopjoin_flag = sig; }

static void test_stop_in_join(void) {
    static scenario s;
    open_reports(&s, "stopjoin");
    start_hub(&s, NULL);
    char err_path[400];
    snprintf(err_path, sizeof err_path, "%s/stopjoin_R0.err", dir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        redirect(2, err_path);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = stopjoin_on_term;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGTERM, &sa, NULL);
        transport_options o = {.replica_id = 0, .replicas = 2, .min_replicas = 2, .timeout_s = TIMEOUT_S,
                               .connect_timeout_s = 10, .rendezvous = s.hub_addr, .streams = 1,
                               .secret = (const uint8_t *)SECRET, .secret_bytes = strlen(SECRET),
                               .run_fingerprint = FINGERPRINT, .stop = &stopjoin_flag};
        transport *t = transport_tcp_open(&o);
        replica_status st = {0, status_hash(0), 0};
        uint8_t state[64];
        size_t got = 0;
        join_result r = transport_join(t, &st, state, sizeof state, &got);
        transport_leave(t, 0, false);
        _exit(r == JOIN_STOPPED && stopjoin_flag == SIGTERM ? 0 : 3);
    }
    s.pids[s.n_pids++] = pid;
    EXPECT(await_file(s.hub_log, "founds the group", 10), "stopjoin: the replica's join is held for the quorum");
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, 5);
    EXPECT(rc == 0, "stopjoin: SIGTERM in the join: it returns JOIN_STOPPED and the replica exits 0 (rc %d; -1: still "
                    "running 5 s later)",
           rc);
    EXPECT(await_file(s.hub_log, "left (goodbye)", 5), "stopjoin: it says goodbye to the hub");
    EXPECT(file_has(err_path, "stops while its join waits"), "stopjoin: the replica says why it stops");
    stop_hub(&s);
    finish(&s);
}

static void test_cli(void) {
    char err[2048];
    char *no_listen[] = {"relay", "--secret_file", secret_path};
    int rc = relay_child(no_listen, 3, err, sizeof err);
    EXPECT(rc == 1 && count_error_lines(err) == 1 && strstr(err, "--listen"), "cli: no --listen (rc %d): %s", rc, err);
    char *no_secret[] = {"relay", "--listen", "127.0.0.1:0"};
    rc = relay_child(no_secret, 3, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "--secret_file"), "cli: no --secret_file (rc %d): %s", rc, err);
    char short_path[300];
    snprintf(short_path, sizeof short_path, "%s/short_secret", dir);
    FILE *f = fopen(short_path, "w");
    fputs("short\n", f);
    fclose(f);
    char *short_secret[] = {"relay", "--listen", "127.0.0.1:0", "--secret_file", short_path};
    rc = relay_child(short_secret, 5, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "at least 16"), "cli: a short secret (rc %d): %s", rc, err);
    char *bad_address[] = {"relay", "--listen", "nowhere", "--secret_file", secret_path};
    rc = relay_child(bad_address, 5, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "host:port"), "cli: a bad address (rc %d): %s", rc, err);
    char *bad_timeout[] = {"relay", "--listen", "127.0.0.1:0", "--secret_file", secret_path, "--timeout_s", "-1"};
    rc = relay_child(bad_timeout, 7, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "--timeout_s"), "cli: a bad timeout (rc %d): %s", rc, err);
    char *bad_hold[] = {"relay", "--listen", "127.0.0.1:0", "--secret_file", secret_path, "--max_hold_s", "soon"};
    rc = relay_child(bad_hold, 7, err, sizeof err);
    EXPECT(rc == 1 && count_error_lines(err) == 1 && strstr(err, "--max_hold_s"), "cli: a bad --max_hold_s (rc %d): %s",
           rc, err);
    char *unknown[] = {"relay", "--listen", "127.0.0.1:0", "--secret_file", secret_path, "--frobnicate", "1"};
    rc = relay_child(unknown, 7, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "unknown option --frobnicate"), "cli: an unknown option (rc %d): %s", rc, err);
    char *help[] = {"relay", "--help"};
    rc = relay_child(help, 2, err, sizeof err);
    EXPECT(rc == 0 && strstr(err, "usage: train_gpt relay"), "cli: --help (rc %d)", rc);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    const char *only = argc > 1 ? argv[1] : NULL;
    struct {
        const char *name;
        void (*run)(void);
    } tests[] = {{"cli", test_cli},         {"reduce", test_reduce},
                 {"mean", test_mean},       {"leave", test_leave},
                 {"serve", test_serve},     {"kill9", test_kill9},
                 {"sigstop", test_sigstop}, {"late", test_late},
                 {"refound", test_refound}, {"slowread", test_slow_reader},
                 {"cutthrough", test_cutthrough_slow}, {"cutkill", test_cutthrough_killed},
                 {"size", test_size},       {"donor", test_donor_dies},
                 {"slowstate", test_slow_state}, {"slowstate2", test_slow_state_hubs},
                 {"slowcut", test_slow_cut}, {"slowgone", test_slow_gone}, {"heldgone", test_held_gone},
                 {"restart", test_hub_restart}, {"blackhole", test_blackhole},
                 {"slowsetup", test_slow_setup}, {"evil", test_evil},
                 {"hubs", test_hubs},       {"hubsmean", test_hubs_mean},
                 {"hubkill", test_hubs_kill}, {"hubmixed", test_hubs_mixed},
                 {"hubs3", test_hubs_three}, {"hubfew", test_hubs_few},
                 {"hubfewkill", test_hubs_few_kill}, {"hubquick", test_hubs_quick},
                 {"hubtwo", test_hubs_two_die}, {"hubboth", test_hubs_both}, {"stopjoin", test_stop_in_join}};
    bool known = only == NULL;
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) known |= only && strcmp(only, tests[i].name) == 0;
    if (!known) {
        fprintf(stderr, "test_transport: no scenario named '%s'\n", only);
        return 2;
    }
    snprintf(dir, sizeof dir, "/tmp/test_transport.XXXXXX");
    if (!mkdtemp(dir)) fail("mkdtemp: %s", strerror(errno));
    snprintf(secret_path, sizeof secret_path, "%s/secret", dir);
    FILE *f = fopen(secret_path, "w");
    fprintf(f, "%s\n", SECRET);
    fclose(f);
    chmod(secret_path, 0600);
    double t0 = wall_seconds();
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        if (only && strcmp(only, tests[i].name) != 0) continue;
        double t = wall_seconds();
        int failed = checks_failed;
        tests[i].run();
        printf("  %-9s %5.2f s%s\n", tests[i].name, wall_seconds() - t, checks_failed > failed ? "  FAILED" : "");
        fflush(stdout);
    }
    printf("test_transport: %.1f s (logs in %s)\n", wall_seconds() - t0, dir);
    int rc = check_summary("test_transport");
    if (rc == 0 && !getenv("TEST_TRANSPORT_KEEP")) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) warn("could not remove %s", dir);
    }
    return rc;
}
