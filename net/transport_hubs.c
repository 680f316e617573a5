// net/transport_hubs.c — the tcp transport over several hubs: diloco_rendezvous = h1:p1,h2:p2[,...]
// (at most TRANSPORT_MAX_HUBS). docs/protocol.md, "Several hubs", has the protocol and the
// argument that no outer step is half-applied or applied twice.
//
// The replica holds one ordinary session (net/transport_tcp.c) per hub, and each hub keeps
// its own membership, heartbeats and rounds. An exchange cuts the payload's whole segments
// into K contiguous shares (K configured hubs; fewer when the payload has fewer segments):
// share i is a payload_spec of its own (its values at their model offset, so each hub's
// downlink residual keeps its values at their model positions) and goes to hub i while that
// hub is live, else to the next live hub in configured order (cyclic). The exchanges with
// different hubs run concurrently, one thread per round; a hub holding several shares runs
// them as consecutive rounds. Round ids on the wire: 64·k + 8·attempt + share for outer
// step k (hubs require them strictly increasing), so a share redone after a failover always
// gets a larger id than anything that hub saw for step k. The replica-facing step stays k.
//
// Failover. A round whose hub cannot be reached (transport_exchange false: the hub is gone
// past timeout_s) marks the hub dead: that share and the shares queued behind it are redone,
// attempt + 1, at the next live hub. The replica applies only when every share's mean is in
// (all or nothing: the means land in one buffer that diloco.c reads once the exchange
// returns); evicted from any share's round, it rejoins; a share no live hub can take makes
// the exchange fail (the step is skipped, as with one hub that is gone).
//
// Joins. The first live hub in configured order (the primary) takes the JOIN and any state
// transfer; the others get FOLLOW: a member from the step the replica is at, no state.
// While a rejoining replica waits for its state, its other hubs are told it follows from no
// round yet, so their rounds do not wait for it. A catch-up transfer (the relays' default) goes
// through the primary too, counting outer steps: the joiner follows the others once it has the
// means up to outer step k, from k + 1 (FOLLOW_CATCHUP: their first round waits for it); a hub
// that has already reduced part of that round without it makes it take step k + 1's mean too.
// The donor sends its state and means through the hub that asked (no HOLD elsewhere: it
// exchanges on meanwhile).
//
// A dead hub is tried again by a thread of its own (reconnect, FOLLOW from the next step);
// once that is done, the next exchange puts it back in the rotation (it takes its share
// again).
//
// DONE. After an exchange the replica tells every live hub its step is over (completed, or
// given up). When replicas took a share of a step from different rounds — a hub died after
// some had its ROUND and others had not, or they disagreed for a moment on which hubs are
// live — the hubs let those that completed the step go on: the others' rounds of that step
// are aborted or refused, and they rejoin and take a completer's state (docs/protocol.md).
// Every session's AUTH says which hub of how many it is, so a replica that lists the hubs in
// another order is refused.
#include "net/socket.h"
#include "net/transport_impl.h"
#include "net/transport_tcp_hub.h"
#include "net/wire.h"

#include "llmc/comm.h"
#include "llmc/common.h"
#include "llmc/quant.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS_PER_STEP WIRE_ROUNDS_PER_STEP   // round id = 64·k + 8·attempt + share
#define ATTEMPTS 8
#define REVIVE_PERIOD_S 0.25 // a dead hub is tried this often (a refused connection costs little)
#define REVIVE_MARGIN 2      // a hub found back takes its share from this many steps after the next

enum { HUB_LIVE, HUB_DEAD, HUB_READY };

typedef struct hubs hubs;

typedef struct {
    hubs *owner;
    int index;
    tcp_hub *t;
    atomic_int state;          // HUB_LIVE, HUB_DEAD (its reviver runs), HUB_READY (followed again)
    pthread_t reviver;
    bool reviver_running;
    int64_t ready_from;        // READY: the outer step the hub expects this replica from (under lock)
    // the exchange in progress (queue, last_round: the exchange's thread only)
    int queue[TRANSPORT_MAX_HUBS];   // shares waiting, in the order of their round ids
    int queued;
    int64_t last_round;        // the largest round id given to this hub in this exchange (-1: none)
    bool send_state;           // a round of this exchange asked this replica for its state
    // the round running on its worker thread (done, ok, r: under owner->lock)
    bool busy, done, ok;
    int share;
    int64_t round;
    pthread_t worker;
    round_result r;
} hub;

typedef enum { SHARE_PENDING, SHARE_DONE, SHARE_EVICTED, SHARE_FAILED } share_status;

typedef struct {
    payload_spec spec;             // its values at their model offset
    size_t up_offset, down_offset; // where its bytes lie in the payload and in the mean
    int attempt;
    share_status status;
    round_result r;                // its round (r.mean not kept: copied into the mean)
} share;

struct hubs {
    transport_options o;
    uint8_t *secret;
    int n;
    hub h[TRANSPORT_MAX_HUBS];
    atomic_llong next_step;        // the step of the next exchange (a reviver follows from it)
    atomic_bool stopping;
    bool joined_once;
    int joined_via;                // the primary of the last join, if it took a catch-up state (-1: not)
    atomic_int sending_via;        // the hub whose session sends this replica's catch-up state (-1: none)
    pthread_mutex_t lock;
    pthread_cond_t changed;
    // the exchange in progress
    int64_t step;
    const uint8_t *payload;
    share shares[TRANSPORT_MAX_HUBS];
    int n_shares;
    uint8_t *mean;
    size_t mean_cap;
};

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int64_t round_id(int64_t step, int attempt, int share) {
    return step * ROUNDS_PER_STEP + (int64_t)attempt * 8 + share;
}

// ---------------------------------------------------------------- dead hubs, and back
// Follows a hub found back from REVIVE_MARGIN steps after the next exchange's (the hub may
// put it later: the step the first replica to find it back chose, so that they all agree).
// true: READY, the exchange for ready_from puts it back in the rotation. false: the hub is
// lost again, or an exchange began past that step meanwhile (follow it again).
static bool follow_back(hubs *x, hub *hb) {
    pthread_mutex_lock(&x->lock);
    int64_t next = (int64_t)atomic_load(&x->next_step);
    pthread_mutex_unlock(&x->lock);
    replica_status st = {.outer_step = next, .param_hash = 0};
    int64_t from_round = 0;
    if (!tcp_hub_follow(hb->t, &st, (next + REVIVE_MARGIN) * ROUNDS_PER_STEP, false, &from_round)) return false;
    int64_t from = (from_round + ROUNDS_PER_STEP - 1) / ROUNDS_PER_STEP;
    pthread_mutex_lock(&x->lock);
    bool in_time = from >= (int64_t)atomic_load(&x->next_step);
    if (in_time) {
        hb->ready_from = from;
        atomic_store(&hb->state, HUB_READY);
    }
    pthread_mutex_unlock(&x->lock);
    if (in_time)
        note("diloco: the hub at %s is back: it takes its share again from outer step %lld", tcp_hub_address(hb->t),
             (long long)from + 1);
    return in_time;
}

// Reconnects to a dead hub every REVIVE_PERIOD_S (so that the replicas find it back at about
// the same moment) and follows it.
static void *revive(void *arg) {
    hub *hb = arg;
    hubs *x = hb->owner;
    char err[256];
    while (!atomic_load(&x->stopping)) {
        double t0 = wall_seconds();
        if (tcp_hub_connected(hb->t) || tcp_hub_connect(hb->t, t0 + REVIVE_PERIOD_S, true, false, err, sizeof err))
            if (follow_back(x, hb)) return NULL;
        sleep_s(t0 + REVIVE_PERIOD_S - wall_seconds());
    }
    return NULL;
}

// The step of the next exchange: a hub found back from now on follows from it.
static void set_next_step(hubs *x, int64_t step) {
    pthread_mutex_lock(&x->lock);
    atomic_store(&x->next_step, step);
    pthread_mutex_unlock(&x->lock);
}

static void mark_dead(hubs *x, hub *hb, const char *when) {
    if (atomic_load(&hb->state) != HUB_LIVE) return;
    warn("diloco: the hub at %s is gone (%s): its share moves to the other hubs until it is back",
         tcp_hub_address(hb->t), when);
    tcp_hub_disconnect(hb->t);
    atomic_store(&hb->state, HUB_DEAD);
    int rc = pthread_create(&hb->reviver, NULL, revive, hb);
    if (rc != 0) fail("tcp transport: pthread_create: %s", strerror(rc));
    hb->reviver_running = true;
    (void)x;
}

// READY hubs go back in the rotation: at the exchange for their step (step >= 0), or at a
// join (step < 0; it follows them itself). One that expects this replica since an earlier
// step (a join came between) is told the step now, without waiting for the answer: the
// contribution that follows on the same connection comes after it.
static void take_back(hubs *x, int64_t step) {
    for (int i = 0; i < x->n; i++) {
        hub *hb = &x->h[i];
        pthread_mutex_lock(&x->lock);
        bool ready = atomic_load(&hb->state) == HUB_READY && (step < 0 || hb->ready_from <= step);
        int64_t from = hb->ready_from;
        pthread_mutex_unlock(&x->lock);
        if (!ready) continue;
        pthread_join(hb->reviver, NULL);
        hb->reviver_running = false;
        atomic_store(&hb->state, HUB_LIVE);
        replica_status st = {.outer_step = step, .param_hash = 0};
        if (step >= 0 && from < step && !tcp_hub_follow_now(hb->t, &st, step * ROUNDS_PER_STEP))
            mark_dead(x, hb, "while following it again");
    }
}

static int live_hubs(hubs *x) {
    int n = 0;
    for (int i = 0; i < x->n; i++) n += atomic_load(&x->h[i].state) == HUB_LIVE;
    return n;
}

static bool stop_requested(const hubs *x) {
    comm_poll_stop();   // as transport_tcp's
    return x->o.stop && *x->o.stop;
}

// Waits (up to connect_timeout_s) until some hub is back (true), or the caller asks to stop
// (false); fatal if none comes.
static bool await_any_hub(hubs *x) {
    double deadline = wall_seconds() + x->o.connect_timeout_s;
    for (;;) {
        take_back(x, -1);
        if (live_hubs(x) > 0) return true;
        if (stop_requested(x)) return false;
        if (wall_seconds() > deadline)
            fail_with_status(EXIT_TEMPFAIL,   // requeued: the hubs may be back then
                             "cannot reach any of the %d hubs (diloco_rendezvous) within "
                             "diloco_connect_timeout_s = %g s",
                             x->n, x->o.connect_timeout_s);
        sleep_s(0.05);
    }
}

// ---------------------------------------------------------------- joins
static int primary(hubs *x) {
    for (int i = 0; i < x->n; i++)
        if (atomic_load(&x->h[i].state) == HUB_LIVE) return i;
    return -1;
}

// FOLLOW on every live hub but the primary p (first_round INT64_MAX: expected in no round).
static void follow_others(hubs *x, int p, const replica_status *s, int64_t first_round) {
    for (int i = 0; i < x->n; i++) {
        hub *hb = &x->h[i];
        if (i == p || atomic_load(&hb->state) != HUB_LIVE) continue;
        if (!tcp_hub_follow(hb->t, s, first_round, false, NULL)) mark_dead(x, hb, "while following it");
    }
}

// A joiner that caught up through its primary p, with the means up to outer step `to`, follows
// the other live hubs from step to + 1's first round, held there until it begins
// (FOLLOW_CATCHUP). A hub that has already reduced part of that round without it expects it
// later: it then takes the means up to that step too (CAUGHT_UP again at p), and follows again.
// Returns the last step whose mean it takes, -1 when p is lost meanwhile.
static int64_t follow_caught_up(hubs *x, int p, int64_t to) {
    for (int attempt = 0; attempt < 16 && to >= 0; attempt++) {
        replica_status st = {.outer_step = to + 1, .param_hash = 0};
        int64_t need = to;
        for (int i = 0; i < x->n; i++) {
            hub *hb = &x->h[i];
            if (i == p || atomic_load(&hb->state) != HUB_LIVE) continue;
            int64_t from = 0;
            if (!tcp_hub_follow(hb->t, &st, (to + 1) * ROUNDS_PER_STEP, true, &from)) {
                mark_dead(x, hb, "while following it");
                continue;
            }
            int64_t whole = (from + ROUNDS_PER_STEP - 1) / ROUNDS_PER_STEP;   // the first step it is in whole
            if (whole - 1 > need) need = whole - 1;
        }
        if (need == to) return to;
        note("diloco: replica %d takes the mean of outer step %lld too (a hub had begun it without this replica)",
             x->o.replica_id, (long long)need + 1);
        follow_others(x, p, &st, INT64_MAX);   // expected nowhere while it takes more means
        to = tcp_hub_catchup_extend(x->h[p].t, need);
    }
    return -1;
}

static int64_t hubs_catchup_extend(void *impl, int64_t landing);

static join_result hubs_join_from(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                                  size_t *state_bytes);

// A join or rejoin: whether it waits for a state is said anew (transport_join_waited), over
// every hub it tries, and over a join again after an aborted catch-up.
static join_result hubs_join(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                             size_t *state_bytes) {
    hubs *x = impl;
    for (int i = 0; i < x->n; i++) tcp_hub_clear_waited(x->h[i].t);
    return hubs_join_from(impl, s, state, state_capacity, state_bytes);
}

static bool hubs_join_waited(void *impl) {
    hubs *x = impl;
    for (int i = 0; i < x->n; i++)
        if (tcp_hub_join_waited(x->h[i].t)) return true;
    return false;
}

static join_result hubs_join_from(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                                  size_t *state_bytes) {
    hubs *x = impl;
    join_result result = JOIN_MEMBER;
    int64_t state_round = 0;
    int p;
    for (;;) {
        if (stop_requested(x)) return JOIN_STOPPED;
        take_back(x, -1);
        if (live_hubs(x) == 0 && !await_any_hub(x)) return JOIN_STOPPED;
        p = primary(x);
        // A rejoining replica is still a member elsewhere: those rounds must not wait for it
        // while it waits for its state here.
        if (x->joined_once) follow_others(x, p, s, INT64_MAX);
        if (atomic_load(&x->h[p].state) != HUB_LIVE) continue;
        if (tcp_hub_join(x->h[p].t, s, state, state_capacity, state_bytes, &result, &state_round)) break;
        mark_dead(x, &x->h[p], "while joining");
    }
    if (result == JOIN_FINISHED || result == JOIN_STOPPED) return result;   // nothing to follow
    x->joined_once = true;
    x->joined_via = result == JOIN_GOT_STATE && tcp_hub_took_catchup(x->h[p].t) ? p : -1;
    if (x->joined_via >= 0) {
        // A catch-up state (the sessions defer CAUGHT_UP): a replica of one rank tells its primary
        // now, and follows the others; a rank of a sharded replica once every rank holds its
        // state (transport_options.defer_caught_up: diloco.c calls transport_catchup_extend(-1)).
        if (!x->o.defer_caught_up && hubs_catchup_extend(x, -1) < 0) {   // join again
            if (!tcp_hub_connected(x->h[p].t)) mark_dead(x, &x->h[p], "while catching up");   // else aborted
            return hubs_join_from(impl, s, state, state_capacity, state_bytes);
        }
        return result;
    }
    int64_t step = result == JOIN_MEMBER ? s->outer_step : state_round / ROUNDS_PER_STEP + 1;
    replica_status now = {.outer_step = step, .param_hash = result == JOIN_MEMBER ? s->param_hash : 0};
    follow_others(x, p, &now, step * ROUNDS_PER_STEP);
    set_next_step(x, step);
    return result;
}

// ---------------------------------------------------------------- the exchange
// Cuts the payload's whole segments into n_shares contiguous shares.
static void cut_shares(hubs *x, const payload_spec *spec) {
    int64_t segments = (spec->values + spec->segment - 1) / spec->segment;
    int k = segments < x->n ? (int)segments : x->n;
    size_t up_seg = quant_encoded_bytes((quant_kind)spec->up_codec, spec->segment, spec->block);
    size_t down_seg = quant_encoded_bytes((quant_kind)spec->down_codec, spec->segment, spec->block);
    x->n_shares = k;
    for (int i = 0; i < k; i++) {
        int64_t first = segments * i / k, end = segments * (i + 1) / k;
        share *sh = &x->shares[i];
        memset(sh, 0, sizeof *sh);
        sh->spec = *spec;
        sh->spec.offset = spec->offset + first * spec->segment;
        sh->spec.values = min_i64(end * spec->segment, spec->values) - first * spec->segment;
        sh->up_offset = (size_t)first * up_seg;
        sh->down_offset = (size_t)first * down_seg;
        sh->status = SHARE_PENDING;
    }
}

// Gives share s (its next attempt) to the first live hub from `from` on in configured order:
// its round id must exceed every id that hub has had this exchange. Returns the hub, or -1
// when none can take it.
static int place_share(hubs *x, int s, int from) {
    share *sh = &x->shares[s];
    for (int j = 0; j < x->n; j++) {
        hub *hb = &x->h[(from + j) % x->n];
        if (atomic_load(&hb->state) != HUB_LIVE) continue;
        int a = sh->attempt;
        while (a < ATTEMPTS && round_id(x->step, a, s) <= hb->last_round) a++;
        if (a == ATTEMPTS) return -1;
        sh->attempt = a;
        hb->last_round = round_id(x->step, a, s);
        hb->queue[hb->queued++] = s;
        return hb->index;
    }
    return -1;
}

static void *run_round(void *arg) {
    hub *hb = arg;
    hubs *x = hb->owner;
    share *sh = &x->shares[hb->share];
    round_result r;
    bool ok = tcp_hub_exchange(hb->t, hb->round, &sh->spec, x->payload + sh->up_offset, &r);
    if (ok && !r.evicted && r.mean) memcpy(x->mean + sh->down_offset, r.mean, r.mean_bytes);   // its own part
    pthread_mutex_lock(&x->lock);
    hb->ok = ok;
    hb->r = r;
    hb->r.mean = NULL;
    hb->done = true;
    pthread_cond_signal(&x->changed);
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

static void start_round(hubs *x, hub *hb) {
    int s = hb->queue[0];
    memmove(hb->queue, hb->queue + 1, (size_t)(--hb->queued) * sizeof *hb->queue);
    hb->share = s;
    hb->round = round_id(x->step, x->shares[s].attempt, s);
    hb->busy = true;
    hb->done = false;
    int rc = pthread_create(&hb->worker, NULL, run_round, hb);
    if (rc != 0) fail("tcp transport: pthread_create: %s", strerror(rc));
}

// Moves share s and the shares queued behind it from a dead hub to the next live ones.
static void fail_over(hubs *x, hub *hb, int s) {
    int moving[TRANSPORT_MAX_HUBS + 1], n = 0;
    moving[n++] = s;
    for (int i = 0; i < hb->queued; i++) moving[n++] = hb->queue[i];
    hb->queued = 0;
    for (int i = 0; i < n; i++) {
        share *sh = &x->shares[moving[i]];
        sh->attempt++;
        int to = place_share(x, moving[i], hb->index + 1);
        if (to < 0) {
            warn("diloco: no hub left for share %d of outer step %lld", moving[i], (long long)x->step + 1);
            sh->status = SHARE_FAILED;
        } else {
            note("diloco: share %d of outer step %lld goes to the hub at %s (attempt %d)", moving[i],
                 (long long)x->step + 1, tcp_hub_address(x->h[to].t), sh->attempt);
        }
    }
}

// A round finished: keep its result, or fail its hub over.
static void take_result(hubs *x, hub *hb) {
    pthread_join(hb->worker, NULL);
    hb->busy = hb->done = false;
    share *sh = &x->shares[hb->share];
    if (!hb->ok) {
        mark_dead(x, hb, "its round failed");
        fail_over(x, hb, hb->share);
        return;
    }
    sh->r = hb->r;
    sh->status = hb->r.evicted ? SHARE_EVICTED : SHARE_DONE;
    if (!hb->r.evicted && hb->r.send_state) {
        pthread_mutex_lock(&x->lock);   // hubs_send_state takes them on another thread
        hb->send_state = true;
        pthread_mutex_unlock(&x->lock);
    }
}

// Runs every share's rounds, each hub's in the order of their ids, until none is left.
static void run_shares(hubs *x) {
    pthread_mutex_lock(&x->lock);
    for (;;) {
        bool any = false;
        for (int i = 0; i < x->n; i++) {
            hub *hb = &x->h[i];
            if (hb->busy && hb->done) {
                pthread_mutex_unlock(&x->lock);
                take_result(x, hb);
                pthread_mutex_lock(&x->lock);
            }
        }
        for (int i = 0; i < x->n; i++) {
            hub *hb = &x->h[i];
            if (!hb->busy && hb->queued && atomic_load(&hb->state) == HUB_LIVE) start_round(x, hb);
            any |= hb->busy;
        }
        if (!any) break;
        bool finished = false;
        for (int i = 0; i < x->n; i++) finished |= x->h[i].busy && x->h[i].done;
        if (!finished) pthread_cond_wait(&x->changed, &x->lock);
    }
    pthread_mutex_unlock(&x->lock);
}

// The shares' rounds as one result: all or nothing.
static bool combine(hubs *x, const payload_spec *spec, round_result *r) {
    bool failed = false, evicted = false, apply = true, state = false, catch_up = false;
    int count[TRANSPORT_MAX_REPLICAS] = {0};
    for (int s = 0; s < x->n_shares; s++) {
        const share *sh = &x->shares[s];
        failed |= sh->status == SHARE_FAILED || sh->status == SHARE_PENDING;
        evicted |= sh->status == SHARE_EVICTED;
        r->bytes_sent += sh->r.bytes_sent;
        r->bytes_recv += sh->r.bytes_recv;
        if (sh->r.wait_s > r->wait_s) r->wait_s = sh->r.wait_s;
        if (sh->status != SHARE_DONE) continue;
        apply &= sh->r.apply;
        state |= sh->r.send_state;
        catch_up |= sh->r.catch_up;
        for (int i = 0; i < sh->r.n; i++) count[sh->r.ids[i]]++;
    }
    if (evicted) {
        r->evicted = true;   // rejoin (whatever else failed: the rejoin brings it in step)
        return true;
    }
    if (failed) return false;
    for (int id = 0; id < TRANSPORT_MAX_REPLICAS; id++)
        if (count[id] == x->n_shares) r->ids[r->n++] = id;   // whole in every share's mean
    r->mean = x->mean;
    r->mean_bytes = payload_spec_down_bytes(spec);
    r->apply = apply;
    r->send_state = state;
    r->catch_up = state && catch_up;
    return true;
}

// DONE to every live hub: this replica is through with the step (completed: it has every share's
// mean and takes the step; or it gave up). A hub then expects it in no round of the step, and a
// completion settles which replicas go on when two sets took a share from different rounds (a
// hub died after some had its mean and others had not): those that completed it
// (docs/protocol.md, "Several hubs"). An evicted replica says nothing: it rejoins.
static void tell_done(hubs *x, bool completed) {
    for (int i = 0; i < x->n; i++) {
        hub *hb = &x->h[i];
        if (atomic_load(&hb->state) == HUB_LIVE && tcp_hub_connected(hb->t)) tcp_hub_done(hb->t, x->step, completed);
    }
}

static bool hubs_exchange(void *impl, int64_t outer_step, const payload_spec *spec, const uint8_t *payload,
                          round_result *r) {
    hubs *x = impl;
    double t0 = wall_seconds();
    memset(r, 0, sizeof *r);
    r->outer_step = outer_step;
    set_next_step(x, outer_step + 1);
    take_back(x, outer_step);
    if (live_hubs(x) == 0) {
        // Every hub was lost (restarted together, a link flap here): the revivers follow them
        // from a later step than this one, which a replica that skips this step's exchange never
        // reaches (until 2026-12, "none reachable" at every step for good). It rejoins instead:
        // the join takes back any hub found back, or waits connect_timeout_s for one.
        warn("diloco: none of the %d hubs is reachable; rejoining once one is back", x->n);
        r->evicted = true;
        r->sync_s = wall_seconds() - t0;
        return true;
    }
    size_t mean_bytes = payload_spec_down_bytes(spec);
    if (mean_bytes > x->mean_cap) {
        x->mean = xrealloc(x->mean, mean_bytes);
        x->mean_cap = mean_bytes;
    }
    x->step = outer_step;
    x->payload = payload;
    pthread_mutex_lock(&x->lock);
    for (int i = 0; i < x->n; i++) {
        x->h[i].queued = 0;
        x->h[i].last_round = -1;
        x->h[i].send_state = false;
    }
    pthread_mutex_unlock(&x->lock);
    cut_shares(x, spec);
    for (int s = 0; s < x->n_shares; s++)
        if (place_share(x, s, s) < 0) x->shares[s].status = SHARE_FAILED;
    run_shares(x);
    bool ok = combine(x, spec, r);
    if (!r->evicted) tell_done(x, ok);
    r->sync_s = wall_seconds() - t0;
    return ok;
}

// The state goes to the hubs that asked for it (the joiners' primary). For a whole transfer the
// others hold their rounds for this replica meanwhile (HOLD), or a transfer longer than their
// timeout_s would make them evict it as late; a catch-up one needs nothing of them (the replica
// exchanges on while it sends, and its means go with the state).
static void hubs_send_state(void *impl, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    hubs *x = impl;
    // The hubs that asked, taken once: a catch-up donor exchanges on (another thread) while it
    // sends, and that exchange's rounds reset and set the flags anew — read here throughout and
    // cleared at the end, a newer round's request was lost or an older one's state went to it.
    bool to[TRANSPORT_MAX_HUBS] = {false};
    pthread_mutex_lock(&x->lock);
    for (int i = 0; i < x->n; i++) {
        to[i] = x->h[i].send_state;
        x->h[i].send_state = false;
    }
    pthread_mutex_unlock(&x->lock);
    bool held[TRANSPORT_MAX_HUBS] = {false}, whole = false;
    for (int i = 0; i < x->n; i++) whole |= to[i] && !tcp_hub_sends_catchup(x->h[i].t);
    for (int i = 0; i < x->n; i++) {
        hub *hb = &x->h[i];
        if (whole && !to[i] && atomic_load(&hb->state) == HUB_LIVE && tcp_hub_connected(hb->t))
            held[i] = tcp_hub_hold(hb->t, true);
    }
    for (int i = 0; i < x->n; i++) {
        hub *hb = &x->h[i];
        if (to[i] && atomic_load(&hb->state) == HUB_LIVE) {
            bool catchup = tcp_hub_sends_catchup(hb->t);
            if (catchup) atomic_store(&x->sending_via, i);
            tcp_hub_send_state(hb->t, state, bytes, hooks);
            if (catchup) atomic_store(&x->sending_via, -1);
        }
    }
    for (int i = 0; i < x->n; i++)
        if (held[i] && atomic_load(&x->h[i].state) == HUB_LIVE) tcp_hub_hold(x->h[i].t, false);
}

// The catch-up transfer's calls go to the hub it runs through: the donor's (sending_via), the
// joiner's primary (joined_via).
static void hubs_preserve_state(void *impl, size_t offset, size_t bytes) {
    hubs *x = impl;
    int i = atomic_load(&x->sending_via);
    if (i >= 0) tcp_hub_preserve_state(x->h[i].t, offset, bytes);
}

static void hubs_send_catchup(void *impl, int64_t landing, const uint8_t *bytes, size_t n) {
    hubs *x = impl;
    int i = atomic_load(&x->sending_via);
    if (i >= 0) tcp_hub_send_catchup(x->h[i].t, landing, bytes, n);
}

static int hubs_catchup_count(void *impl) {
    hubs *x = impl;
    return x->joined_via >= 0 ? tcp_hub_catchup_count(x->h[x->joined_via].t) : 0;
}

static int hubs_catchup_held(void *impl, uint64_t *bytes) {
    hubs *x = impl;
    return x->joined_via >= 0 ? tcp_hub_catchup_held(x->h[x->joined_via].t, bytes) : 0;
}

// A joiner's first CAUGHT_UP at its primary (landing -1: deferred by its session; a sharded
// replica's rank says it once every rank holds its state), or a rank behind its others (the
// means up to `landing`); then it follows its other hubs from the step after (follow_caught_up).
// -1: the primary is lost.
static int64_t hubs_catchup_extend(void *impl, int64_t landing) {
    hubs *x = impl;
    int p = x->joined_via;
    if (p < 0) return landing < 0 ? -2 : -1;   // -2: the join took no catch-up state
    if (atomic_load(&x->h[p].state) != HUB_LIVE) return -1;
    replica_status st = {.outer_step = landing + 1, .param_hash = 0};
    if (landing >= 0) follow_others(x, p, &st, INT64_MAX);   // expected nowhere while it takes more means
    int64_t to = follow_caught_up(x, p, tcp_hub_catchup_extend(x->h[p].t, landing));
    if (to >= 0) set_next_step(x, to + 1);
    return to;
}

// transport_poll: the means of a catch-up come through the primary it joined by.
static void hubs_poll(void *impl, double seconds) {
    hubs *x = impl;
    int p = x->joined_via;   // a hub found dead since may be reconnecting on its reviver's thread
    if (p >= 0 && atomic_load(&x->h[p].state) == HUB_LIVE) tcp_hub_poll(x->h[p].t, seconds);
    else sleep_s(seconds);
}

static bool hubs_agree_stop(void *impl, bool local_stop) {
    (void)impl;
    return local_stop;
}

// ---------------------------------------------------------------- open, close
static void hubs_free(hubs *x, bool leave, int64_t outer_step, bool finished) {
    atomic_store(&x->stopping, true);
    for (int i = 0; i < x->n; i++)
        if (x->h[i].reviver_running) pthread_join(x->h[i].reviver, NULL);
    for (int i = 0; i < x->n; i++) {
        if (leave) tcp_hub_leave(x->h[i].t, outer_step, finished);
        else tcp_hub_free(x->h[i].t);
    }
    pthread_mutex_destroy(&x->lock);
    pthread_cond_destroy(&x->changed);
    free(x->mean);
    free(x);
}

static void hubs_leave(void *impl, int64_t outer_step, bool finished) { hubs_free(impl, true, outer_step, finished); }
static void hubs_close(void *impl) { hubs_free(impl, false, 0, false); }

static const transport_ops hubs_ops = {
    .name = "tcp (several hubs)",
    .join = hubs_join,
    .rejoin = hubs_join,
    .exchange = hubs_exchange,
    .send_state = hubs_send_state,
    .preserve_state = hubs_preserve_state,
    .send_catchup = hubs_send_catchup,
    .catchup_count = hubs_catchup_count,
    .catchup_held = hubs_catchup_held,
    .catchup_extend = hubs_catchup_extend,
    .poll = hubs_poll,
    .join_waited = hubs_join_waited,
    .agree_stop = hubs_agree_stop,
    .leave = hubs_leave,
    .close = hubs_close,
};

// Splits "h1:p1, h2:p2" into addresses; a one-line error for anything malformed.
static int parse_hubs(const char *list, char out[TRANSPORT_MAX_HUBS][300]) {
    int n = 0;
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ' || *p == '\t')) p++, len--;
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len == 0) fail("diloco_rendezvous '%s': an empty hub address in the list", list);
        if (n == TRANSPORT_MAX_HUBS) fail("diloco_rendezvous '%s': at most %d hubs", list, TRANSPORT_MAX_HUBS);
        if (len >= 300) fail("diloco_rendezvous '%s': a hub address is too long", list);
        memcpy(out[n], p, len);
        out[n][len] = '\0';
        for (int i = 0; i < n; i++)
            if (!strcmp(out[i], out[n])) fail("diloco_rendezvous '%s': the hub %s is listed twice", list, out[n]);
        char host[256], port[16], err[400];  // malformed: at once, not after connect_timeout_s of retries
        if (!net_split_host_port(out[n], host, sizeof host, port, sizeof port, err, sizeof err))
            fail("diloco_rendezvous: %s", err);
        n++;
        if (!end) return n;
        p = end + 1;
    }
}

void transport_tcp_check_rendezvous(const char *list, bool serve) {
    char addresses[TRANSPORT_MAX_HUBS][300];
    if (parse_hubs(list, addresses) > 1 && serve)
        fail("diloco_serve: a replica can host one hub, but diloco_rendezvous lists several (%s): run relays "
             "(train_gpt relay) for them",
             list);
}

static void *connect_one(void *arg) {
    hub *hb = arg;
    char err[256];
    if (!tcp_hub_connect(hb->t, wall_seconds() + hb->owner->o.connect_timeout_s, false, true, err, sizeof err) &&
        !stop_requested(hb->owner))
        warn("diloco: cannot reach the hub at %s within diloco_connect_timeout_s = %g s: %s (trying it again in the "
             "background)",
             tcp_hub_address(hb->t), hb->owner->o.connect_timeout_s, err);
    return NULL;
}

transport *transport_hubs_open(const transport_options *o) {
    transport_tcp_check_rendezvous(o->rendezvous, o->serve);
    char addresses[TRANSPORT_MAX_HUBS][300];
    hubs *x = xcalloc(1, sizeof *x);
    x->o = *o;
    x->o.rendezvous = NULL;
    x->n = parse_hubs(o->rendezvous, addresses);
    // The sessions defer a catch-up join's CAUGHT_UP: the joiner says it at its primary (hubs_join,
    // or for a sharded replica's rank its caller), then follows the others.
    transport_options session = *o;
    session.defer_caught_up = true;
    x->joined_via = -1;
    atomic_store(&x->sending_via, -1);
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->changed, NULL);
    pthread_t connecting[TRANSPORT_MAX_HUBS];
    for (int i = 0; i < x->n; i++) {
        hub *hb = &x->h[i];
        hb->owner = x;
        hb->index = i;
        hb->t = tcp_hub_new(&session, addresses[i], i, x->n);
        atomic_store(&hb->state, HUB_LIVE);
        int rc = pthread_create(&connecting[i], NULL, connect_one, hb);
        if (rc != 0) fail("tcp transport: pthread_create: %s", strerror(rc));
    }
    int up = 0;
    for (int i = 0; i < x->n; i++) {
        pthread_join(connecting[i], NULL);
        up += tcp_hub_connected(x->h[i].t);
    }
    if (up == 0 && !stop_requested(x))   // stopped meanwhile: the join says so (JOIN_STOPPED)
        fail_with_status(EXIT_TEMPFAIL,   // requeued: the hubs may be back then
                         "cannot reach any of the %d hubs (diloco_rendezvous %s) within "
                         "diloco_connect_timeout_s = %g s",
                         x->n, o->rendezvous, o->connect_timeout_s);
    for (int i = 0; i < x->n && !stop_requested(x); i++)   // stopped: the join says so, nothing to revive
        if (!tcp_hub_connected(x->h[i].t)) mark_dead(x, &x->h[i], "unreachable at start");
    if (up > 0)
        note("diloco: replica %d connected to %d of %d hubs (%s; %d data streams each)", o->replica_id, up, x->n,
             o->rendezvous, o->streams);
    return transport_wrap(&hubs_ops, x);
}
