// net/wire.h — the frame format of the tcp transport (docs/protocol.md has it byte for byte).
//
// Every byte a replica and the hub exchange travels in a frame:
//
//   header (24 bytes, little-endian)  magic "TGPW", u16 version, u8 type, u8 flags,
//                                     u64 sequence number, u64 payload length
//   payload                           at most the bound of its type (control ≤ 64 KiB,
//                                     DATA ≤ 40 + 16 MiB)
//   tag (32 bytes)                    HMAC-SHA256(key, header ‖ payload)
//
// The key is a per-connection, per-direction session key derived from the shared secret and
// two nonces at the handshake (all zeros for the handshake frames themselves, whose
// authentication lives in the proofs they carry). The sequence number counts the frames of
// one direction of one connection from 0: a replayed, dropped or reordered frame fails.
//
// Everything here is pure computation over byte buffers (no sockets, no allocation, no
// global state), so that libFuzzer can drive the parser and the payload decoders directly
// (test/fuzz_wire.c). A peer can never make these functions read out of bounds, loop, or
// allocate: lengths are checked against the type's bounds before anything else looks at them.
#ifndef TRAIN_GPT_WIRE_H
#define TRAIN_GPT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WIRE_MAGIC0 'T'
#define WIRE_MAGIC1 'G'
#define WIRE_MAGIC2 'P'
#define WIRE_MAGIC3 'W'
#define WIRE_VERSION 10  // 2: the hub reduces (CONTRIBUTE says how payloads are encoded); 3: several hubs (FOLLOW);
                         // 4: DONE, and AUTH says which hub of how many (several hubs);
                         //    sparse and int2 contributions (CONTRIBUTE's up_keep, codec 4);
                         // 5: CONTRIBUTE's tokens (the mean weights each contribution by them)
                         // 6: LEAVE says whether the replica finished the run; JOINED(finished)
                         // 7: HEARTBEAT's flags (the hub holds the round for a state transfer), HOLD
                         // 8: the catch-up transfer (STATE's flags, DATA kind CATCHUP, CAUGHT_UP,
                         //    STATE_END, ROUND_CATCHUP, FOLLOW's flags)
                         // 9: STATE_AGAIN (a replica joins a catch-up transfer in flight)
                         // 10: CONTRIBUTE's tokens may be 0 (no work: left out of the mean and of
                         //     ROUND's ids, sent ROUND all the same)
#define WIRE_HEADER_BYTES 24
#define WIRE_TAG_BYTES 32
#define WIRE_KEY_BYTES 32
#define WIRE_NONCE_BYTES 32
#define WIRE_OVERHEAD_BYTES (WIRE_HEADER_BYTES + WIRE_TAG_BYTES)
#define WIRE_MAX_CONTROL_BYTES 65536u                    // bound of every control payload
#define WIRE_DATA_HEAD_BYTES 40                          // the DATA sub-header
#define WIRE_MIN_CHUNK_BYTES 1024u
#define WIRE_MAX_CHUNK_BYTES (16u << 20)                 // bound of one DATA chunk
#define WIRE_MAX_TRANSFER_BYTES ((uint64_t)1 << 40)      // one payload or state: 1 TiB
#define WIRE_MAX_TRANSFER_CHUNKS ((uint64_t)1 << 22)    // one payload or state: 4 Mi chunks (a payload's
                                                         // segments are ~2^18 values: 10^12 of them)
#define WIRE_MAX_STREAMS 64                              // data connections per replica
#define WIRE_MAX_REPLICAS 256                            // = TRANSPORT_MAX_REPLICAS
#define WIRE_MAX_TEXT_BYTES 1024u                        // the reason in REFUSE and EVICTED
#define WIRE_MAX_STEP ((int64_t)1 << 53)                // every outer step and round id in a frame
#define WIRE_MAX_BLOCK (1u << 20)                        // CONTRIBUTE's block: diloco_quant_block's bound
#define WIRE_MAX_HUBS 8                                  // hubs in a replica's diloco_rendezvous

typedef enum {
    // handshake (tagged with the all-zero key)
    WIRE_HELLO = 1,        // hub → client: nonce_h, hub's timeout
    WIRE_AUTH = 2,         // client → hub: who it is, nonce_c, proof of the secret
    WIRE_WELCOME = 3,      // hub → client: session id, proof of the secret
    WIRE_REFUSE = 4,       // hub → client: code and reason; the hub closes
    // session, control connection
    WIRE_HEARTBEAT = 16,   // both ways, every heartbeat interval
    WIRE_JOIN = 17,        // client → hub: this replica's status
    WIRE_JOINED = 18,      // hub → client: member, or wait for state
    WIRE_CONTRIBUTE = 19,  // client → hub: announces this replica's payload for a step
    WIRE_ROUND = 20,       // hub → client: the round closed: who contributed, flags
    WIRE_EVICTED = 21,     // hub → client: too late for the round; rejoin
    WIRE_STATE = 22,       // donor → hub and hub → joiner: a state transfer begins
    WIRE_STATE_ABORT = 23, // hub → joiner: the donor died; wait for the next boundary
    WIRE_LEAVE = 24,       // client → hub: goodbye
    WIRE_FOLLOW = 25,      // client → hub: member without a state transfer (a hub of several)
    WIRE_DONE = 26,        // client → hub: its exchange for an outer step is over (a hub of several)
    WIRE_HOLD = 27,        // client → hub: it sends a state through another hub (begin), or is done (end)
    WIRE_STATE_END = 28,   // hub → joiner: the round it is caught up to; hub → donor: stop sending means
    WIRE_CAUGHT_UP = 29,   // joiner → hub: it has its state and will have the means up to a round
    WIRE_STATE_AGAIN = 30, // hub → donor of a catch-up: the state's first chunks again (joiners came in flight)
    // session, data connections
    WIRE_DATA = 32,        // one chunk of a payload or a state
} wire_type;
#define WIRE_TYPE_LIMIT 33      // every type is below this (bit masks of allowed types are u64)

typedef enum {
    WIRE_OK = 0,
    WIRE_TRUNCATED,     // not a whole frame yet (a stream: read more; a datagram: truncated)
    WIRE_BAD_MAGIC,
    WIRE_BAD_VERSION,
    WIRE_BAD_TYPE,
    WIRE_BAD_FLAGS,
    WIRE_TOO_LONG,      // payload length above the type's bound
    WIRE_TOO_SHORT,     // payload length below the type's fixed size
    WIRE_BAD_TAG,       // wrong key (wrong secret, another connection) or corrupted bytes
    WIRE_BAD_SEQUENCE,  // replayed, dropped or reordered
} wire_error;

// Initializes OpenSSL for the transport (once, idempotent; before any other OpenSSL call of the
// process): without its exit-time cleanup, so that exit() on one thread cannot free what another
// thread's HMAC uses.
void wire_init(void);

const char *wire_error_string(wire_error e);
// "HELLO", "DATA", ...; "unknown" for anything else.
const char *wire_type_name(unsigned type);

typedef struct {
    unsigned type, flags, version;
    uint64_t seq;
    uint64_t payload_bytes;     // as the header claims (valid once the header parsed)
    const uint8_t *payload;     // into the parsed buffer (WIRE_OK only)
    uint64_t frame_bytes;       // header + payload + tag: how many bytes the frame needs
} wire_frame;

// Bounds of a type's payload; false for an unknown type.
bool wire_payload_bounds(unsigned type, uint64_t *min_bytes, uint64_t *max_bytes);

// Checks the first WIRE_HEADER_BYTES of a frame: magic, version, type, flags, length bound.
// Fills f's header fields (type, seq, payload_bytes, frame_bytes) as far as they parsed.
wire_error wire_check_header(const uint8_t header[WIRE_HEADER_BYTES], wire_frame *f);

// Parses one frame at the start of buf: the header checks above, then (whole frame present)
// the tag under key, then seq == expect_seq. WIRE_TRUNCATED with f->frame_bytes = the bytes
// the frame needs (WIRE_HEADER_BYTES while the header is incomplete).
wire_error wire_parse(const uint8_t *buf, size_t bytes, const uint8_t key[WIRE_KEY_BYTES], uint64_t expect_seq,
                      wire_frame *f);

// Writes a header for a payload of payload_bytes.
void wire_put_header(uint8_t out[WIRE_HEADER_BYTES], unsigned type, uint64_t seq, uint64_t payload_bytes);
// HMAC-SHA256(key, a ‖ b): the tag of a frame whose header+payload are split in two parts.
void wire_tag(const uint8_t key[WIRE_KEY_BYTES], const uint8_t *a, size_t a_bytes, const uint8_t *b, size_t b_bytes,
              uint8_t tag[WIRE_TAG_BYTES]);
// Builds a whole frame into out (WIRE_OVERHEAD_BYTES + payload_bytes); returns its size.
size_t wire_build(uint8_t *out, unsigned type, uint64_t seq, const uint8_t *payload, size_t payload_bytes,
                  const uint8_t key[WIRE_KEY_BYTES]);

// ---------------------------------------------------------------- the handshake
// Proofs and keys (docs/protocol.md, "Handshake"): HMAC-SHA256 keyed with the secret over a
// label, both nonces and the fields they vouch for.
void wire_auth_proof(const uint8_t *secret, size_t secret_bytes, const uint8_t nonce_h[WIRE_NONCE_BYTES],
                     const uint8_t *auth_fields, size_t fields_bytes, uint8_t proof[32]);
void wire_welcome_proof(const uint8_t *secret, size_t secret_bytes, const uint8_t nonce_h[WIRE_NONCE_BYTES],
                        const uint8_t nonce_c[WIRE_NONCE_BYTES], const uint8_t *welcome_fields,
                        size_t fields_bytes, uint8_t proof[32]);
void wire_session_keys(const uint8_t *secret, size_t secret_bytes, const uint8_t nonce_h[WIRE_NONCE_BYTES],
                       const uint8_t nonce_c[WIRE_NONCE_BYTES], uint8_t key_c2h[WIRE_KEY_BYTES],
                       uint8_t key_h2c[WIRE_KEY_BYTES]);
// Constant-time comparison of two 32-byte proofs or tags.
bool wire_equal32(const uint8_t a[32], const uint8_t b[32]);

// ---------------------------------------------------------------- payloads
// Each payload type has a struct, an encoder (returns the payload size; out must hold the
// type's maximum) and a decoder that returns NULL or a one-phrase reason the payload is
// malformed. The decoders assume nothing beyond what wire_parse checked.

typedef struct {
    uint8_t nonce_h[WIRE_NONCE_BYTES];
    uint32_t timeout_ms;        // the hub's eviction timeout: clients heartbeat well within it
} wire_hello;
#define WIRE_HELLO_BYTES 40

typedef struct {
    uint32_t replica_id;
    uint16_t stream_index;      // 0: the control connection; 1..streams: data connections
    uint16_t streams;           // data connections this replica opens
    uint32_t replicas;          // M as the replica is configured
    uint32_t min_replicas;
    uint64_t run_fingerprint;
    uint64_t session_id;        // 0 on the control connection; the WELCOME's on data connections
    uint16_t hub_index;         // this hub's place in the replica's diloco_rendezvous (0-based)
    uint16_t hubs;              // the hubs listed there (1..WIRE_MAX_HUBS)
    uint8_t nonce_c[WIRE_NONCE_BYTES];
    uint8_t proof[32];          // wire_auth_proof over nonce_h and the 72 bytes before it
} wire_auth;
#define WIRE_AUTH_BYTES 104
#define WIRE_AUTH_PROVEN_BYTES 72   // the fields the proof covers

typedef struct {
    uint64_t session_id;
    uint32_t timeout_ms;
    uint8_t proof[32];          // wire_welcome_proof over both nonces and the 16 bytes before it
} wire_welcome;
#define WIRE_WELCOME_BYTES 48
#define WIRE_WELCOME_PROVEN_BYTES 16

typedef enum {
    REFUSE_SECRET = 1,          // the client's proof is wrong: different secret
    REFUSE_FINGERPRINT = 2,     // run_fingerprint differs from the group's
    REFUSE_DUPLICATE = 3,       // a live replica with this id is connected
    REFUSE_BAD_ID = 4,          // replica id or stream numbers out of range
    REFUSE_NO_SESSION = 5,      // a data connection for a session the hub does not have
    REFUSE_BUSY = 6,            // too many connections
    REFUSE_HUB_ORDER = 7,       // the replica lists this hub at another place (or among another number
                                // of hubs) than the group's replicas do
    // In a session (tagged with its key): the hub ends it and closes.
    REFUSE_DROPPED = 8,         // given up: silent, too slow to take the mean, a broken stream, the
                                // hub out of memory (the replica rejoins)
    REFUSE_PROTOCOL = 9,        // the replica broke the protocol (it rejoins; the third in a row
                                // without a round between ends it)
} wire_refuse_code;

typedef struct {
    uint32_t code;
    uint32_t text_bytes;
    const uint8_t *text;        // into the payload; not NUL-terminated
} wire_refuse;

typedef struct {
    int64_t outer_step;
    uint64_t param_hash;
} wire_status;                  // JOIN
#define WIRE_JOIN_BYTES 16

// JOINED_FINISHED: the group has no members and a replica of this run left having finished it
// (its LEAVE said LEAVE_FINISHED): there is no group to join; group_step is the outer step it
// finished at, group_hash the id of that replica.
enum { JOINED_MEMBER = 1, JOINED_WAIT = 2, JOINED_FINISHED = 3 };
// FOLLOW: a replica of a run with several hubs joins a hub that is not its primary (the first
// live one, which does the JOIN and any state transfer). It is a member at once, expected in
// rounds from first_round on (a round id, 64·k at the boundary of outer step k); a group
// without members is founded with its status, without waiting for a quorum. FOLLOW_CATCHUP:
// it caught up through its primary (a catch-up transfer): its first round waits for it as the
// primary's does, however late it begins (until it begins a contribution).
enum { FOLLOW_CATCHUP = 1 };
typedef struct {
    int64_t outer_step;
    uint64_t param_hash;
    int64_t first_round;
    uint32_t flags;
} wire_follow;
#define WIRE_FOLLOW_BYTES 32
// With several hubs the round of share s of outer step k, attempt a, has the id 64·k + 8·a + s.
#define WIRE_ROUNDS_PER_STEP 64

// DONE: a replica of a run with several hubs tells every hub it follows that its exchange for
// outer step k is over (docs/protocol.md, "Several hubs"): DONE_COMPLETE, it has every share's
// mean (it takes the step); DONE_GAVE_UP, the exchange failed (it will not come back to step k's
// rounds). The hub then expects it in no round of step k; a completion also means that any
// round of step k it has not begun is another set of replicas' and cannot stand.
enum { DONE_COMPLETE = 1, DONE_GAVE_UP = 2 };
typedef struct {
    int64_t outer_step;         // k, the replica's step (not a round id)
    uint32_t result;
} wire_done;
#define WIRE_DONE_BYTES 16

// HOLD: a replica of a run with several hubs tells its other hubs that it sends its state to
// joiners through one hub (HOLD_BEGIN) and that it is done (HOLD_END): until then they hold
// their rounds for it as that hub does (it is not late), and after it they give it the
// transfer's duration on top of timeout_s.
enum { HOLD_BEGIN = 1, HOLD_END = 2 };
#define WIRE_HOLD_BYTES 8

// LEAVE: goodbye, with why. LEAVE_STOPPED: it will be back (a signal, the walltime, an error);
// LEAVE_FINISHED: it reached max_steps, the run is over for it.
enum { LEAVE_STOPPED = 1, LEAVE_FINISHED = 2 };
typedef struct {
    int64_t outer_step;         // the replica's outer step as it leaves
    uint32_t reason;
} wire_leave;
#define WIRE_LEAVE_BYTES 16

typedef struct {
    uint32_t result;
    int64_t group_step;         // informational: the group's status when known, else -1, 0
    uint64_t group_hash;
} wire_joined;
#define WIRE_JOINED_BYTES 24

// How a contribution is encoded, so that the hub can decode it, average, and encode the mean:
// segments of segment_values values (whole blocks, an even count), each encoded on its own
// in up_codec (llmc/quant.h's quant_kind), sparse with up_keep values of every block kept when
// up_keep > 0 (int8 / int4 / int2 only, up_keep < block), one DATA chunk per segment; the mean
// goes back dense in down_codec, the same segments, with the hub's error feedback when
// WIRE_HUB_FEEDBACK.
// values at value_offset of the model's model_values (where the hub's residual keeps them).
enum { WIRE_CODEC_FP32 = 0, WIRE_CODEC_INT8 = 1, WIRE_CODEC_INT4 = 2, WIRE_CODEC_BF16 = 3, WIRE_CODEC_INT2 = 4 };
// WIRE_MULTI_HUB: the run has several hubs and outer_step is a round id
// 64·k + 8·attempt + share (docs/protocol.md, "Several hubs"): the hub logs it as k/attempt/share
// and makes the joiners of a round of step k members from 64·(k + 1) on.
enum { WIRE_HUB_FEEDBACK = 1, WIRE_MULTI_HUB = 2 };
typedef struct {
    int64_t outer_step;
    uint64_t total_bytes;
    uint32_t chunk_bytes;       // the bytes of one whole segment in up_codec
    uint32_t up_keep;           // 0: dense; else values kept of every block (top-k)
    uint8_t up_codec, down_codec, flags;
    uint32_t block;             // values per quantization block
    uint32_t segment_values;
    float bound;                // > 0: the hub bounds each contribution's segment norm (diloco_bound)
    uint64_t values, value_offset, model_values;
    uint64_t tokens;            // the training tokens behind this Δ (0 .. 2^53): its weight in the mean
                                // (0: a replica that trained nothing: it only receives the mean)
} wire_contribute;
#define WIRE_CONTRIBUTE_BYTES 72
#define WIRE_MAX_TOKENS (1ull << 53)   // exact as a double

// HEARTBEAT: empty, or (hub → client) u32 flags. HOLD: the open round waits for a state
// transfer (its donor and joiners are not late while it moves) or for their inner phase after
// it: an upload the hub holds back meanwhile is not stuck.
enum { HEARTBEAT_HOLD = 1 };
#define WIRE_HEARTBEAT_BYTES 4

// ROUND_CATCHUP (with SEND_STATE): a catch-up transfer — the donor sends its state as of this
// round, then the means of the rounds it lands meanwhile, until STATE_END (docs/protocol.md).
enum { ROUND_APPLY = 1, ROUND_SEND_STATE = 2, ROUND_CATCHUP = 4 };
typedef struct {
    int64_t outer_step;
    uint32_t flags;
    uint32_t n;
    uint32_t ids[WIRE_MAX_REPLICAS];     // strictly ascending, each < WIRE_MAX_REPLICAS
    uint64_t bytes[WIRE_MAX_REPLICAS];   // each ≤ WIRE_MAX_TRANSFER_BYTES
} wire_round;
#define WIRE_ROUND_HEAD_BYTES 16
#define WIRE_ROUND_ENTRY_BYTES 16

typedef struct {
    int64_t outer_step;
    uint32_t reason;            // 1: late for the round
    uint32_t text_bytes;
    const uint8_t *text;
} wire_evicted;
#define WIRE_EVICTED_HEAD_BYTES 16

enum { STATE_CATCHUP = 1 };   // wire_state.flags: the means of later rounds follow the state
typedef struct {
    int64_t outer_step;
    uint64_t total_bytes;
    uint32_t chunk_bytes;
    uint32_t donor_id;
    uint32_t flags;             // STATE_CATCHUP
} wire_state;
#define WIRE_STATE_BYTES 32

// MEAN: hub → replica, owner_id 0. CATCHUP: donor → hub → joiner, one landed round's mean and
// settings (opaque to the transport, diloco.c's), outer_step the round.
enum { DATA_PAYLOAD = 1, DATA_STATE = 2, DATA_MEAN = 3, DATA_CATCHUP = 4 };
typedef struct {
    uint32_t owner_id;          // whose payload (or the donor, for a state)
    uint32_t kind;              // DATA_PAYLOAD, DATA_STATE, DATA_MEAN or DATA_CATCHUP
    int64_t outer_step;
    uint64_t total_bytes;       // of the whole payload or state
    uint64_t offset;            // a multiple of chunk_bytes
    uint32_t chunk_bytes;       // every chunk but the last has exactly this size
    const uint8_t *bytes;       // into the frame
    uint64_t chunk_len;         // min(chunk_bytes, total_bytes - offset)
} wire_data;

size_t wire_encode_hello(const wire_hello *m, uint8_t *out);
size_t wire_encode_auth(const wire_auth *m, uint8_t *out);
size_t wire_encode_welcome(const wire_welcome *m, uint8_t *out);
size_t wire_encode_refuse(uint32_t code, const char *text, uint8_t *out);
size_t wire_encode_status(const wire_status *m, uint8_t *out);
size_t wire_encode_follow(const wire_follow *m, uint8_t *out);
size_t wire_encode_done(const wire_done *m, uint8_t *out);
size_t wire_encode_joined(const wire_joined *m, uint8_t *out);
size_t wire_encode_leave(const wire_leave *m, uint8_t *out);
size_t wire_encode_contribute(const wire_contribute *m, uint8_t *out);
size_t wire_encode_round(const wire_round *m, uint8_t *out);
size_t wire_encode_evicted(int64_t outer_step, uint32_t reason, const char *text, uint8_t *out);
size_t wire_encode_state(const wire_state *m, uint8_t *out);
size_t wire_encode_step(int64_t outer_step, uint8_t *out);   // STATE_ABORT, STATE_END, CAUGHT_UP
size_t wire_encode_heartbeat(uint32_t flags, uint8_t out[WIRE_HEARTBEAT_BYTES]);
size_t wire_encode_hold(uint32_t what, uint8_t out[WIRE_HOLD_BYTES]);
// The DATA sub-header only (the chunk bytes follow it in the frame).
size_t wire_encode_data_head(const wire_data *m, uint8_t out[WIRE_DATA_HEAD_BYTES]);

const char *wire_decode_hello(const uint8_t *p, size_t n, wire_hello *m);
const char *wire_decode_auth(const uint8_t *p, size_t n, wire_auth *m);
const char *wire_decode_welcome(const uint8_t *p, size_t n, wire_welcome *m);
const char *wire_decode_refuse(const uint8_t *p, size_t n, wire_refuse *m);
const char *wire_decode_status(const uint8_t *p, size_t n, wire_status *m);
const char *wire_decode_follow(const uint8_t *p, size_t n, wire_follow *m);
const char *wire_decode_done(const uint8_t *p, size_t n, wire_done *m);
const char *wire_decode_joined(const uint8_t *p, size_t n, wire_joined *m);
const char *wire_decode_leave(const uint8_t *p, size_t n, wire_leave *m);
const char *wire_decode_contribute(const uint8_t *p, size_t n, wire_contribute *m);
const char *wire_decode_round(const uint8_t *p, size_t n, wire_round *m);
const char *wire_decode_evicted(const uint8_t *p, size_t n, wire_evicted *m);
const char *wire_decode_state(const uint8_t *p, size_t n, wire_state *m);
const char *wire_decode_step(const uint8_t *p, size_t n, int64_t *outer_step);
const char *wire_decode_heartbeat(const uint8_t *p, size_t n, uint32_t *flags);   // empty: flags 0
const char *wire_decode_hold(const uint8_t *p, size_t n, uint32_t *what);
const char *wire_decode_data(const uint8_t *p, size_t n, wire_data *m);

// Copies a peer's text (REFUSE, EVICTED) into a printable, NUL-terminated one-liner.
void wire_printable(const uint8_t *text, size_t bytes, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif

#endif
