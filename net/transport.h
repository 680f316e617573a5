// net/transport.h — how DiLoCo replicas exchange their outer gradients.
//
// The outer loop (diloco.c) sees the replicas through this one interface; two transports
// implement it:
//   tcp  (net/transport_tcp.c, net/relay.c, net/wire.c): separate jobs, possibly on separate clusters.
//        Every replica connects out to a hub (the "relay": `train_gpt relay --listen
//        HOST:PORT --secret_file PATH` on a login or gateway node, or a thread inside one
//        replica when diloco_serve = 1 and that replica's node accepts inbound
//        connections). Frames are length-prefixed, versioned, bounded, and authenticated
//        with HMAC-SHA256 over a shared secret (docs/protocol.md). The hub keeps the
//        membership: heartbeats, eviction of a dead or silent replica within timeout_s,
//        joins at outer boundaries. With several hubs (net/transport_hubs.c) each reduces
//        a share of the payload's segments and a dead one's share moves to the others.
//   mpi  (net/transport_mpi.c): the replicas are the ranks of one MPI world (one job). The
//        membership is fixed; a rank that dies ends the job (MPI offers no recovery), so
//        fault tolerance needs tcp.
//
// An exchange is a reduction: each replica hands in its encoded outer gradient for outer step
// k (in segments, llmc/quant.h), and gets back one encoded mean of every replica's that
// contributed to step k (its own included), weighted by the tokens each was trained on: summed
// in fp32 in ascending replica id, segment by segment, then encoded for the way back (the downlink codec, with the hub's own error
// feedback). Every replica receives the same bytes, so all end with the same bits; what a
// replica receives is one payload whatever the number of replicas (docs/protocol.md).
//
// A replica of several ranks (an FSDP job, docs/fsdp.md#diloco-over-sharded-replicas) opens
// one transport per rank: rank j's carries its pieces of the model, to hub j (the
// rendezvous port + j), and diloco.c makes the ranks agree on what each round did. Nothing
// here knows: to the transport, rank j of every replica is a run of its own.
#ifndef TRAIN_GPT_TRANSPORT_H
#define TRAIN_GPT_TRANSPORT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRANSPORT_MAX_REPLICAS 256

typedef struct transport transport;

typedef struct {
    int replica_id;             // 0 .. replicas-1
    int replicas;               // M, the number of replicas the run is configured for
    int min_replicas;           // fewer contributors than this: the outer step is skipped
    double timeout_s;           // eviction, round deadline, and every blocking socket call
    double connect_timeout_s;   // how long a replica keeps trying to reach the hub at start
    // tcp only
    const char *rendezvous;     // "host:port" of the hub, or "h1:p1,h2:p2,..." (several hubs:
                                // net/transport_hubs.c, docs/protocol.md "Several hubs")
    bool serve;                 // this process also runs the hub, listening on rendezvous
    int streams;                // parallel TCP connections per replica for payloads and states
                                // (1..64; a control connection comes on top)
    const uint8_t *secret;      // shared secret (HMAC key; copied by transport_tcp_open)
    size_t secret_bytes;
    // Everything a joining replica must agree on with the group: a mismatch is refused at
    // the handshake with a one-line reason (different model, different quantization, ...).
    uint64_t run_fingerprint;
    const char *fingerprint_text; // what run_fingerprint hashes: `key value` fields joined by
                                  // `|` (MPI names the field that differs; may be NULL)
    // transport_exchange runs on a second thread while the main thread may call
    // transport_agree_stop (streaming DiLoCo with diloco_overlap_steps > 0).
    bool threaded;
    // tcp: the caller's stop request (its signal handler's flag; NULL: none). A join waiting for
    // the hub (a quorum, a donor's state) returns JOIN_STOPPED within 0.2 s of it becoming
    // non-zero, so that the caller can stop as documented (checkpoint, LEAVE, exit 0).
    const volatile sig_atomic_t *stop;
    // tcp, one rank of a replica of several (each rank its own hub sessions): a join that takes
    // a catch-up state returns once the state is whole, before this rank tells its hub it caught
    // up; the caller tells it with transport_catchup_extend(t, -1) once every rank holds its
    // state. A rank that told it alone would make its hubs hold its first round, which the donor
    // replica's rank there must finish before its other ranks can reach the close that gives
    // this replica's other ranks their states.
    bool defer_caught_up;
    // tcp: a catch-up join hands the joiner each mean of the rounds after its state's, in order
    // (index 0, 1, ...: round state + 1, + 2, ...), as soon as it can be applied — the state
    // whole and every mean before it handed — and lets it go, so that a joiner holds the one or
    // two on their way, not all that the group closed while its state came (j · b↓·N/P: 26 GB
    // per rank at 14B in the decay phase of docs/diloco.md's 72-replica recipe). It runs on the
    // thread in the transport's call (join, rejoin, catchup_extend, poll), with the state in
    // the buffer the join was given and state_bytes its size; index 0 again: a new state (the
    // transfer before was aborted); index -1 (mean NULL): a transfer whose means were handed was
    // aborted, those means count no more (a new state may come without any). NULL: the means are received and kept unread until the
    // next join.
    void (*catchup_sink)(void *arg, int index, const uint8_t *mean, size_t bytes, size_t state_bytes);
    void *catchup_arg;
} transport_options;

// What a replica says about itself when it (re)joins the group.
typedef struct {
    int64_t outer_step;         // outer steps applied to its θ
    uint64_t param_hash;        // XXH64 of its θ (fp32 bytes)
    int64_t step;               // inner steps taken (the mpi transport's ranks step together: they must agree)
} replica_status;

typedef enum {
    JOIN_MEMBER = 1,            // in sync with the group: train and contribute
    JOIN_GOT_STATE = 2,         // out of sync: *state now holds a donor's state (see below)
    JOIN_FINISHED = 3,          // tcp: the group has no members and a replica left having finished
                                // the run (the transport says which and when): nothing to join
    JOIN_STOPPED = 4,           // tcp: *options.stop was set while the join waited: not joined (no
                                // state taken); the caller stops (transport_leave says goodbye)
} join_result;

// How a payload is encoded, and how its mean comes back (the hub must decode, average and
// encode it; every replica of a round hands in the same layout).
typedef struct {
    int up_codec;               // quant_codec of the contributions (llmc/quant.h: a kind, maybe sparse)
    int down_codec;             // quant_codec of the mean (dense)
    bool down_feedback;         // the reducer keeps an error-feedback residual for the mean
    int64_t block;              // values per quantization block
    int64_t segment;            // values per segment: the unit of the reduction (quant_segment_values)
    int64_t values;             // values in this payload
    int64_t offset;             // where they start in the model's flat parameters
    int64_t model_values;       // the model's parameter count
    float bound;                // the reducer's bound on each contribution (diloco_bound; 0: none)
    // Not part of the layout (it may differ between replicas): the training tokens behind this
    // contribution, its weight in the mean (0 is taken as 1 unless no_work; replicas of equal
    // tokens get the plain mean).
    uint64_t tokens;
    // No work behind it (a replica that joined at the run's end, in the group's final syncs,
    // and trained nothing): it goes with tokens 0, the reducer leaves it out of the mean and of
    // the contributors (round_result's n and ids do not name it, nor count it for
    // min_replicas), and the replica receives the mean. Also a replica that rolled back onto a
    // sync step (diloco_restart_from_theta) and trained nothing since; tcp and mpi alike.
    bool no_work;
} payload_spec;

// Bytes of the payload and of the mean for a spec.
size_t payload_spec_up_bytes(const payload_spec *s);
size_t payload_spec_down_bytes(const payload_spec *s);

typedef struct {
    int64_t outer_step;         // the step this result is for
    int n;                      // replicas whose whole contribution is in the mean (this one included)
    int ids[TRANSPORT_MAX_REPLICAS];              // ascending
    const uint8_t *mean;        // the encoded mean (payload_spec_down_bytes), owned by the transport,
                                // valid until the next call; a contribution cut off mid-upload (its
                                // sender died) is in the segments reduced before it stopped
    size_t mean_bytes;
    bool apply;                 // false: fewer than min_replicas contributed, skip the outer step
    bool evicted;               // this replica was too late for the round and was dropped: it must
                                // call transport_rejoin() before contributing again
    bool send_state;            // this replica is the donor for joiners: after applying the outer
                                // step it must call transport_send_state()
    bool catch_up;              // with send_state: a catch-up transfer (tcp, relay --catch_up): the
                                // state goes while the donor trains and exchanges on; before each
                                // later landing changes θ or m the donor calls
                                // transport_preserve_state, after it transport_send_catchup
    uint64_t bytes_sent, bytes_recv;   // payload + framing bytes of this exchange, this replica
    double wait_s;              // time from handing in the payload until the last contributor's arrived
    double sync_s;              // whole call, wall time
} round_result;

// Opens the transport (tcp: connects to the hub, starting it first when serve; mpi: the
// world must have exactly `replicas` ranks and replica_id = rank). Fatal with a one-line
// error when the hub cannot be reached within connect_timeout_s or the handshake fails.
transport *transport_tcp_open(const transport_options *o);
transport *transport_mpi_open(const transport_options *o);
// Fatal with the one-line error of a build that lacks it (tcp: OpenSSL; mpi: MPI), before the
// run writes anything (out_dir's lock and metrics.jsonl were made first, then the open failed).
void transport_tcp_check_built(void);
void transport_mpi_check_built(void);
bool transport_tcp_built(void);   // whether this build has the tcp transport (OpenSSL)
// Fatal with one line for a diloco_rendezvous the tcp transport cannot take (an address that
// is not host:port, an empty one, more than TRANSPORT_MAX_HUBS, a hub listed twice; serve with
// several hubs), without connecting: said by `train_gpt plan` and before a run writes anything.
// Nothing in a build without the tcp transport (transport_tcp_check_built says that).
void transport_tcp_check_rendezvous(const char *list, bool serve);
// This process's rank in the MPI world (initializing MPI); fatal without MPI in the build.
int transport_mpi_world_rank(void);
// With diloco_transport = mpi every rank of the world is a replica, and each needs its own
// out_dir: two writing one directory delete each other's temporary checkpoints, prune each
// other's checkpoints and interleave metrics.jsonl. Each rank leaves a probe file in its
// out_dir (created) and looks for the others': by what the file systems show, not by the
// paths, so node-local directories of the same name pass and a shared one spelled two ways
// does not. NULL: no two share. Else every replica's own directory, OUT_DIR/replica_<id>
// (malloc'd; rank 0 says so in one line) — srun gives every rank the same out_dir, and until
// 2026-12 the job stopped here. A collective of the world; call it before out_dir is written.
char *transport_mpi_replica_out_dir(const char *out_dir, int replica_id);

// Joins the group with this status. If the status matches the group's (same outer step and
// param_hash), or this replica is the first, it is a member: returns JOIN_MEMBER. Otherwise
// blocks until the group's next outer boundary, receives the donor's state (at most
// state_capacity bytes, opaque to the transport: diloco.c defines it) into state, sets
// *state_bytes, and returns JOIN_GOT_STATE; the replica is then a member.
join_result transport_join(transport *t, const replica_status *s, uint8_t *state, size_t state_capacity,
                           size_t *state_bytes);

// After result.evicted: the same as transport_join.
join_result transport_rejoin(transport *t, const replica_status *s, uint8_t *state, size_t state_capacity,
                             size_t *state_bytes);

// Whether the last transport_join / transport_rejoin waited for the group's state before it
// returned: the hub took the join as one that waits for the next boundary (JOINED(wait)), or a
// state began to come. A JOIN_FINISHED after such a wait is a run that finished while this
// replica waited (its donor finished and left before the state was whole — a donor does not
// wait for its transfer — or the last round had closed), not a run that was over when the
// replica came. tcp only (mpi: false; its replicas start together and never wait, nor hear
// that the run is over). Over several hubs: any hub the join tried.
bool transport_join_waited(transport *t);

// Contributes payload for outer step `outer_step` and waits for the round to close (every
// live member contributed, or the round deadline passed). false only when the transport
// itself is gone (hub unreachable past timeout_s): the caller skips the outer step and
// says so; it never applies its own Δ alone.
bool transport_exchange(transport *t, int64_t outer_step, const payload_spec *spec, const uint8_t *payload,
                        round_result *r);

// What the owner of a state being sent may do while it goes (each may be NULL): stamp, called
// just before the chunk that holds the state's first bytes is queued — that chunk is queued
// last — may still write those bytes (a donor that trains while it sends records how far it
// got: diloco.c); cancelled, polled while it goes, ends the send when true (the donor leaves);
// began, called once a catch-up transfer is under way (the STATE announced as of the round that
// made this replica the donor; from then on a landing's fragment is preserved and its mean
// sent): the owner waits for it (or for the send's return) before its next exchange, which
// would otherwise take the pump first and land a round the transfer never sees.
typedef struct {
    void (*stamp)(void *arg);
    bool (*cancelled)(void *arg);
    void (*began)(void *arg);
    void *arg;
} state_hooks;

// The donor's state for the replicas joining at this boundary (after result.send_state).
// Returns once every byte went, the hub ended the transfer, the session died, hooks->cancelled
// said so, or (tcp) transport_options.stop was raised: a donor stopping does not wait for it.
void transport_send_state(transport *t, const uint8_t *state, size_t bytes, const state_hooks *hooks);

// A catch-up transfer (round_result.catch_up), the donor's side. transport_send_state then
// returns only once the hub ends the transfer (its joiners caught up, or it was aborted), the
// session dies, or it is cancelled; meanwhile it runs beside exchanges on other threads.
// preserve: bytes [offset, offset + bytes) of the state being sent are about to change: what of
// them is not yet on its way is kept as it is (copied aside), so the state stays the one of its
// round. send_catchup: the landed round's mean and settings (opaque: diloco.c's), sent after the
// state, in the order given. Both do nothing without a catch-up transfer in flight.
void transport_preserve_state(transport *t, size_t offset, size_t bytes);
void transport_send_catchup(transport *t, int64_t round, const uint8_t *bytes, size_t n);

// The joiner's side: after transport_join / transport_rejoin returned JOIN_GOT_STATE from a
// catch-up transfer, how many means of the rounds after the state's it takes (STATE_END's round
// − the state's), each handed to transport_options.catchup_sink before the call returned; 0
// after any other join. held: the most of them it held at once (received or on their way, not
// yet handed), and their bytes then.
int transport_catchup_count(transport *t);
int transport_catchup_held(transport *t, uint64_t *bytes);
// The ranks of a sharded replica end their catch-up at one round (each rank's hub may have
// closed one more before it asked): a rank behind asks its hub to take it to `round` (CAUGHT_UP
// again) and waits for the means up to the round the hub answers (≥ round). Returns that round
// (the state's round + transport_catchup_count), or -1 when the session was lost or the
// transfer aborted meanwhile (rejoin). round -1, after a join of defer_caught_up: the first
// CAUGHT_UP (the means it holds); -2 when the state it took is not a catch-up one.
int64_t transport_catchup_extend(transport *t, int64_t round);

// Reads what the hub has sent, for at most about `seconds`, without waiting for anything: a rank
// of a sharded replica that holds its catch-up state before its other ranks waits for them in
// their collective (llmc/comm.h comm_set_idle) and keeps taking its means meanwhile; otherwise
// they would queue at its hub, which past its bound stops reading the donor's rank, and the
// group's exchanges there wait. Naps for that long when there is nothing to read (mpi; a lost
// session).
void transport_poll(transport *t, double seconds);

// tcp: local_stop. mpi: true on every rank when any rank saw a stop signal (an all-reduce),
// so that all ranks stop at the same step instead of deadlocking in the next exchange.
bool transport_agree_stop(transport *t, bool local_stop);

// The reducer's state this replica keeps between its exchanges, for its checkpoint
// (outer_reducer.bin, docs/formats.md): the mpi transport's downlink residual of the segments
// it reduces, a header (*head) and the values (*body), both valid until the next exchange.
// false: none (tcp: the hub keeps its own; mpi before its first exchange or without feedback).
bool transport_reducer_state(transport *t, const void **head, size_t *head_bytes, const void **body,
                             size_t *body_bytes);
// Takes it back from a checkpoint (the file's bytes) before the first exchange, so that a
// resume is bit-exact. A state another replica or another number of replicas saved, or one
// this transport does not keep, is let go with a note (the residual starts from zero);
// false with why: the bytes are not such a state.
bool transport_restore_reducer(transport *t, const uint8_t *bytes, size_t n, char *why, size_t why_bytes);

// Says goodbye (the hub drops this replica at once instead of waiting for a timeout) and
// closes; finished: it reached max_steps at outer_step (a replica that comes back to the hub
// after every other has gone then learns the run is over, JOIN_FINISHED, instead of founding
// a group alone). transport_close alone just closes.
void transport_leave(transport *t, int64_t outer_step, bool finished);
void transport_close(transport *t);

#ifdef __cplusplus
}
#endif

#endif
