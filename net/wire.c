// net/wire.c — frames, the handshake's proofs and keys, and the payload codecs. See net/wire.h and
// docs/protocol.md. Pure functions over byte buffers: the fuzzer links this file alone.
#include "net/wire.h"
#include "llmc/bytes.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------- little-endian fields
static bool all_zero(const uint8_t *p, size_t n) {
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++) acc |= p[i];
    return acc == 0;
}

// ---------------------------------------------------------------- names and bounds
const char *wire_error_string(wire_error e) {
    switch (e) {
    case WIRE_OK: return "ok";
    case WIRE_TRUNCATED: return "truncated frame";
    case WIRE_BAD_MAGIC: return "bad magic (not a train_gpt peer)";
    case WIRE_BAD_VERSION: return "unknown protocol version";
    case WIRE_BAD_TYPE: return "unknown frame type";
    case WIRE_BAD_FLAGS: return "unknown flags";
    case WIRE_TOO_LONG: return "length over the bound of its type";
    case WIRE_TOO_SHORT: return "length under the size of its type";
    case WIRE_BAD_TAG: return "bad tag (wrong secret, or corrupted)";
    case WIRE_BAD_SEQUENCE: return "replayed or reordered frame (bad sequence number)";
    }
    return "unknown error";
}

const char *wire_type_name(unsigned type) {
    switch (type) {
    case WIRE_HELLO: return "HELLO";
    case WIRE_AUTH: return "AUTH";
    case WIRE_WELCOME: return "WELCOME";
    case WIRE_REFUSE: return "REFUSE";
    case WIRE_HEARTBEAT: return "HEARTBEAT";
    case WIRE_JOIN: return "JOIN";
    case WIRE_JOINED: return "JOINED";
    case WIRE_CONTRIBUTE: return "CONTRIBUTE";
    case WIRE_ROUND: return "ROUND";
    case WIRE_EVICTED: return "EVICTED";
    case WIRE_STATE: return "STATE";
    case WIRE_STATE_ABORT: return "STATE_ABORT";
    case WIRE_LEAVE: return "LEAVE";
    case WIRE_FOLLOW: return "FOLLOW";
    case WIRE_DONE: return "DONE";
    case WIRE_HOLD: return "HOLD";
    case WIRE_STATE_END: return "STATE_END";
    case WIRE_CAUGHT_UP: return "CAUGHT_UP";
    case WIRE_STATE_AGAIN: return "STATE_AGAIN";
    case WIRE_DATA: return "DATA";
    }
    return "unknown";
}

bool wire_payload_bounds(unsigned type, uint64_t *min_bytes, uint64_t *max_bytes) {
    uint64_t lo, hi;
    switch (type) {
    case WIRE_HELLO: lo = hi = WIRE_HELLO_BYTES; break;
    case WIRE_AUTH: lo = hi = WIRE_AUTH_BYTES; break;
    case WIRE_WELCOME: lo = hi = WIRE_WELCOME_BYTES; break;
    case WIRE_REFUSE: lo = 8, hi = 8 + WIRE_MAX_TEXT_BYTES; break;
    case WIRE_HEARTBEAT: lo = 0, hi = WIRE_HEARTBEAT_BYTES; break;
    case WIRE_JOIN: lo = hi = WIRE_JOIN_BYTES; break;
    case WIRE_JOINED: lo = hi = WIRE_JOINED_BYTES; break;
    case WIRE_CONTRIBUTE: lo = hi = WIRE_CONTRIBUTE_BYTES; break;
    case WIRE_ROUND:
        lo = WIRE_ROUND_HEAD_BYTES, hi = WIRE_ROUND_HEAD_BYTES + WIRE_ROUND_ENTRY_BYTES * WIRE_MAX_REPLICAS;
        break;
    case WIRE_EVICTED: lo = WIRE_EVICTED_HEAD_BYTES, hi = WIRE_EVICTED_HEAD_BYTES + WIRE_MAX_TEXT_BYTES; break;
    case WIRE_STATE: lo = hi = WIRE_STATE_BYTES; break;
    case WIRE_STATE_ABORT: lo = hi = 8; break;
    case WIRE_LEAVE: lo = hi = WIRE_LEAVE_BYTES; break;
    case WIRE_FOLLOW: lo = hi = WIRE_FOLLOW_BYTES; break;
    case WIRE_DONE: lo = hi = WIRE_DONE_BYTES; break;
    case WIRE_HOLD: lo = hi = WIRE_HOLD_BYTES; break;
    case WIRE_STATE_END: lo = hi = 8; break;
    case WIRE_CAUGHT_UP: lo = hi = 8; break;
    case WIRE_STATE_AGAIN: lo = hi = 8; break;
    case WIRE_DATA: lo = WIRE_DATA_HEAD_BYTES, hi = WIRE_DATA_HEAD_BYTES + (uint64_t)WIRE_MAX_CHUNK_BYTES; break;
    default: return false;
    }
    *min_bytes = lo, *max_bytes = hi;
    return true;
}

// ---------------------------------------------------------------- HMAC-SHA256
// OpenSSL without its exit-time cleanup: a process that exits (fail() on one thread) while
// another thread computes an HMAC (a replica's heartbeat, a handshake to another hub) must not
// have the algorithms freed under that thread (it crashed: SIGSEGV instead of exit 1).
static void openssl_init_once(void) { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL); }

void wire_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, openssl_init_once);
}

// The fetched algorithm is cached (OpenSSL 3 fetches are not free); a lost race frees the
// loser's copy.
static EVP_MAC *hmac_algorithm(void) {
    wire_init();
    static _Atomic(EVP_MAC *) cached = NULL;
    EVP_MAC *mac = atomic_load(&cached);
    if (mac) return mac;
    EVP_MAC *fresh = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (!fresh) {
        // Not something a peer can cause: the OpenSSL installation (or OPENSSL_CONF) is broken.
        fputs("train_gpt: error: OpenSSL libcrypto offers no HMAC (check OPENSSL_CONF / the OpenSSL install)\n",
              stderr);
        exit(1);
    }
    EVP_MAC *expected = NULL;
    if (atomic_compare_exchange_strong(&cached, &expected, fresh)) return fresh;
    EVP_MAC_free(fresh);
    return expected;
}

static void hmac_sha256(const uint8_t *key, size_t key_bytes, const uint8_t *const *parts, const size_t *sizes,
                        int n_parts, uint8_t out[32]) {
    static const uint8_t empty_key[1] = {0};
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(hmac_algorithm());
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    size_t out_bytes = 0;
    bool ok = ctx && EVP_MAC_init(ctx, key_bytes ? key : empty_key, key_bytes, params);
    for (int i = 0; ok && i < n_parts; i++)
        if (sizes[i]) ok = EVP_MAC_update(ctx, parts[i], sizes[i]);
    ok = ok && EVP_MAC_final(ctx, out, &out_bytes, 32) && out_bytes == 32;
    EVP_MAC_CTX_free(ctx);
    if (!ok) {
        fputs("train_gpt: error: OpenSSL HMAC-SHA256 failed (out of memory, or a broken OpenSSL install)\n", stderr);
        exit(1);
    }
}

void wire_tag(const uint8_t key[WIRE_KEY_BYTES], const uint8_t *a, size_t a_bytes, const uint8_t *b, size_t b_bytes,
              uint8_t tag[WIRE_TAG_BYTES]) {
    const uint8_t *parts[2] = {a, b};
    size_t sizes[2] = {a_bytes, b_bytes};
    hmac_sha256(key, WIRE_KEY_BYTES, parts, sizes, 2, tag);
}

bool wire_equal32(const uint8_t a[32], const uint8_t b[32]) { return CRYPTO_memcmp(a, b, 32) == 0; }

// ---------------------------------------------------------------- frames
wire_error wire_check_header(const uint8_t h[WIRE_HEADER_BYTES], wire_frame *f) {
    memset(f, 0, sizeof *f);
    f->frame_bytes = WIRE_HEADER_BYTES;
    if (h[0] != WIRE_MAGIC0 || h[1] != WIRE_MAGIC1 || h[2] != WIRE_MAGIC2 || h[3] != WIRE_MAGIC3)
        return WIRE_BAD_MAGIC;
    f->version = get_u16(h + 4);
    f->type = h[6];
    f->flags = h[7];
    f->seq = get_u64(h + 8);
    f->payload_bytes = get_u64(h + 16);
    if (f->version != WIRE_VERSION) return WIRE_BAD_VERSION;
    uint64_t lo, hi;
    if (!wire_payload_bounds(f->type, &lo, &hi)) return WIRE_BAD_TYPE;
    if (f->flags != 0) return WIRE_BAD_FLAGS;
    if (f->payload_bytes > hi) return WIRE_TOO_LONG;
    if (f->payload_bytes < lo) return WIRE_TOO_SHORT;
    f->frame_bytes = WIRE_OVERHEAD_BYTES + f->payload_bytes;   // no overflow: bounded above
    return WIRE_OK;
}

wire_error wire_parse(const uint8_t *buf, size_t bytes, const uint8_t key[WIRE_KEY_BYTES], uint64_t expect_seq,
                      wire_frame *f) {
    static const uint8_t magic[4] = {WIRE_MAGIC0, WIRE_MAGIC1, WIRE_MAGIC2, WIRE_MAGIC3};
    if (bytes < WIRE_HEADER_BYTES) {
        memset(f, 0, sizeof *f);
        f->frame_bytes = WIRE_HEADER_BYTES;
        // Garbage is recognisable from its first byte: no need to wait for a whole header.
        if (memcmp(buf, magic, bytes < 4 ? bytes : 4) != 0) return WIRE_BAD_MAGIC;
        return WIRE_TRUNCATED;
    }
    wire_error e = wire_check_header(buf, f);
    if (e != WIRE_OK) return e;
    if (bytes < f->frame_bytes) return WIRE_TRUNCATED;
    size_t signed_bytes = WIRE_HEADER_BYTES + (size_t)f->payload_bytes;
    uint8_t tag[WIRE_TAG_BYTES];
    wire_tag(key, buf, signed_bytes, NULL, 0, tag);
    if (!wire_equal32(tag, buf + signed_bytes)) return WIRE_BAD_TAG;
    if (f->seq != expect_seq) return WIRE_BAD_SEQUENCE;
    f->payload = buf + WIRE_HEADER_BYTES;
    return WIRE_OK;
}

void wire_put_header(uint8_t out[WIRE_HEADER_BYTES], unsigned type, uint64_t seq, uint64_t payload_bytes) {
    out[0] = WIRE_MAGIC0, out[1] = WIRE_MAGIC1, out[2] = WIRE_MAGIC2, out[3] = WIRE_MAGIC3;
    put_u16(out + 4, WIRE_VERSION);
    out[6] = (uint8_t)type;
    out[7] = 0;
    put_u64(out + 8, seq);
    put_u64(out + 16, payload_bytes);
}

size_t wire_build(uint8_t *out, unsigned type, uint64_t seq, const uint8_t *payload, size_t payload_bytes,
                  const uint8_t key[WIRE_KEY_BYTES]) {
    wire_put_header(out, type, seq, payload_bytes);
    if (payload_bytes) memmove(out + WIRE_HEADER_BYTES, payload, payload_bytes);
    wire_tag(key, out, WIRE_HEADER_BYTES + payload_bytes, NULL, 0, out + WIRE_HEADER_BYTES + payload_bytes);
    return WIRE_OVERHEAD_BYTES + payload_bytes;
}

// ---------------------------------------------------------------- handshake
static const char AUTH_LABEL[] = "train_gpt auth v1";
static const char WELCOME_LABEL[] = "train_gpt welcome v1";
static const char C2H_LABEL[] = "train_gpt key client-to-hub v1";
static const char H2C_LABEL[] = "train_gpt key hub-to-client v1";

static void labelled_mac(const uint8_t *secret, size_t secret_bytes, const char *label, const uint8_t *nonce_h,
                         const uint8_t *nonce_c, const uint8_t *fields, size_t fields_bytes, uint8_t out[32]) {
    // The label's terminating NUL is included: no label is a prefix of another's input.
    const uint8_t *parts[4] = {(const uint8_t *)label, nonce_h, nonce_c, fields};
    size_t sizes[4] = {strlen(label) + 1, WIRE_NONCE_BYTES, nonce_c ? WIRE_NONCE_BYTES : 0, fields_bytes};
    hmac_sha256(secret, secret_bytes, parts, sizes, 4, out);
}

void wire_auth_proof(const uint8_t *secret, size_t secret_bytes, const uint8_t nonce_h[WIRE_NONCE_BYTES],
                     const uint8_t *auth_fields, size_t fields_bytes, uint8_t proof[32]) {
    labelled_mac(secret, secret_bytes, AUTH_LABEL, nonce_h, NULL, auth_fields, fields_bytes, proof);
}

void wire_welcome_proof(const uint8_t *secret, size_t secret_bytes, const uint8_t nonce_h[WIRE_NONCE_BYTES],
                        const uint8_t nonce_c[WIRE_NONCE_BYTES], const uint8_t *welcome_fields,
                        size_t fields_bytes, uint8_t proof[32]) {
    labelled_mac(secret, secret_bytes, WELCOME_LABEL, nonce_h, nonce_c, welcome_fields, fields_bytes, proof);
}

void wire_session_keys(const uint8_t *secret, size_t secret_bytes, const uint8_t nonce_h[WIRE_NONCE_BYTES],
                       const uint8_t nonce_c[WIRE_NONCE_BYTES], uint8_t key_c2h[WIRE_KEY_BYTES],
                       uint8_t key_h2c[WIRE_KEY_BYTES]) {
    labelled_mac(secret, secret_bytes, C2H_LABEL, nonce_h, nonce_c, NULL, 0, key_c2h);
    labelled_mac(secret, secret_bytes, H2C_LABEL, nonce_h, nonce_c, NULL, 0, key_h2c);
}

// ---------------------------------------------------------------- payload codecs
size_t wire_encode_hello(const wire_hello *m, uint8_t *out) {
    memcpy(out, m->nonce_h, WIRE_NONCE_BYTES);
    put_u32(out + 32, m->timeout_ms);
    put_u32(out + 36, 0);
    return WIRE_HELLO_BYTES;
}

const char *wire_decode_hello(const uint8_t *p, size_t n, wire_hello *m) {
    if (n != WIRE_HELLO_BYTES) return "HELLO has the wrong size";
    memcpy(m->nonce_h, p, WIRE_NONCE_BYTES);
    m->timeout_ms = get_u32(p + 32);
    if (get_u32(p + 36) != 0) return "HELLO: reserved field not zero";
    if (m->timeout_ms == 0) return "HELLO: timeout of 0 ms";
    return NULL;
}

size_t wire_encode_auth(const wire_auth *m, uint8_t *out) {
    put_u32(out, m->replica_id);
    put_u16(out + 4, m->stream_index);
    put_u16(out + 6, m->streams);
    put_u32(out + 8, m->replicas);
    put_u32(out + 12, m->min_replicas);
    put_u64(out + 16, m->run_fingerprint);
    put_u64(out + 24, m->session_id);
    put_u16(out + 32, m->hub_index);
    put_u16(out + 34, m->hubs);
    put_u32(out + 36, 0);
    memcpy(out + 40, m->nonce_c, WIRE_NONCE_BYTES);
    memcpy(out + 72, m->proof, 32);
    return WIRE_AUTH_BYTES;
}

const char *wire_decode_auth(const uint8_t *p, size_t n, wire_auth *m) {
    if (n != WIRE_AUTH_BYTES) return "AUTH has the wrong size";
    m->replica_id = get_u32(p);
    m->stream_index = get_u16(p + 4);
    m->streams = get_u16(p + 6);
    m->replicas = get_u32(p + 8);
    m->min_replicas = get_u32(p + 12);
    m->run_fingerprint = get_u64(p + 16);
    m->session_id = get_u64(p + 24);
    m->hub_index = get_u16(p + 32);
    m->hubs = get_u16(p + 34);
    memcpy(m->nonce_c, p + 40, WIRE_NONCE_BYTES);
    memcpy(m->proof, p + 72, 32);
    // Range checks that need no secret; the hub checks the proof first and says which failed.
    if (m->replica_id >= WIRE_MAX_REPLICAS) return "AUTH: replica id out of range";
    if (m->replicas == 0 || m->replicas > WIRE_MAX_REPLICAS) return "AUTH: replicas out of range";
    if (m->replica_id >= m->replicas) return "AUTH: replica id not below replicas";
    if (m->min_replicas == 0 || m->min_replicas > m->replicas) return "AUTH: min_replicas not in 1 .. replicas";
    if (m->streams == 0 || m->streams > WIRE_MAX_STREAMS) return "AUTH: streams out of range";
    if (m->stream_index > m->streams) return "AUTH: stream index above streams";
    if ((m->stream_index == 0) != (m->session_id == 0)) return "AUTH: session id and stream index disagree";
    if (m->hubs == 0 || m->hubs > WIRE_MAX_HUBS || m->hub_index >= m->hubs) return "AUTH: hub place out of range";
    if (get_u32(p + 36) != 0) return "AUTH: reserved field not zero";
    return NULL;
}

size_t wire_encode_welcome(const wire_welcome *m, uint8_t *out) {
    put_u64(out, m->session_id);
    put_u32(out + 8, m->timeout_ms);
    put_u32(out + 12, 0);
    memcpy(out + 16, m->proof, 32);
    return WIRE_WELCOME_BYTES;
}

const char *wire_decode_welcome(const uint8_t *p, size_t n, wire_welcome *m) {
    if (n != WIRE_WELCOME_BYTES) return "WELCOME has the wrong size";
    m->session_id = get_u64(p);
    m->timeout_ms = get_u32(p + 8);
    memcpy(m->proof, p + 16, 32);
    if (get_u32(p + 12) != 0) return "WELCOME: reserved field not zero";
    if (m->session_id == 0) return "WELCOME: session id 0";
    if (m->timeout_ms == 0) return "WELCOME: timeout of 0 ms";
    return NULL;
}

static size_t text_length(const char *text) {
    size_t n = text ? strlen(text) : 0;
    return n > WIRE_MAX_TEXT_BYTES ? WIRE_MAX_TEXT_BYTES : n;
}

size_t wire_encode_refuse(uint32_t code, const char *text, uint8_t *out) {
    size_t n = text_length(text);
    put_u32(out, code);
    put_u32(out + 4, (uint32_t)n);
    if (n) memcpy(out + 8, text, n);
    return 8 + n;
}

const char *wire_decode_refuse(const uint8_t *p, size_t n, wire_refuse *m) {
    if (n < 8 || n > 8 + WIRE_MAX_TEXT_BYTES) return "REFUSE has the wrong size";
    m->code = get_u32(p);
    m->text_bytes = get_u32(p + 4);
    m->text = p + 8;
    if (m->text_bytes != n - 8) return "REFUSE: text length disagrees with the frame";
    return NULL;
}

size_t wire_encode_status(const wire_status *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u64(out + 8, m->param_hash);
    return WIRE_JOIN_BYTES;
}

const char *wire_decode_status(const uint8_t *p, size_t n, wire_status *m) {
    if (n != WIRE_JOIN_BYTES) return "JOIN has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->param_hash = get_u64(p + 8);
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "JOIN: outer step not in 0 .. 2^53";
    return NULL;
}

size_t wire_encode_follow(const wire_follow *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u64(out + 8, m->param_hash);
    put_u64(out + 16, (uint64_t)m->first_round);
    put_u32(out + 24, m->flags);
    put_u32(out + 28, 0);
    return WIRE_FOLLOW_BYTES;
}

const char *wire_decode_follow(const uint8_t *p, size_t n, wire_follow *m) {
    if (n != WIRE_FOLLOW_BYTES) return "FOLLOW has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->param_hash = get_u64(p + 8);
    m->first_round = (int64_t)get_u64(p + 16);
    m->flags = get_u32(p + 24);
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP || m->first_round < 0 ||
        (m->first_round > WIRE_MAX_STEP && m->first_round != INT64_MAX))
        return "FOLLOW: outer step or round not in 0 .. 2^53";
    if ((m->flags & ~(uint32_t)FOLLOW_CATCHUP) != 0 || get_u32(p + 28) != 0) return "FOLLOW: unknown flags";
    return NULL;
}

size_t wire_encode_done(const wire_done *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u32(out + 8, m->result);
    put_u32(out + 12, 0);
    return WIRE_DONE_BYTES;
}

const char *wire_decode_done(const uint8_t *p, size_t n, wire_done *m) {
    if (n != WIRE_DONE_BYTES) return "DONE has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->result = get_u32(p + 8);
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "DONE: outer step not in 0 .. 2^53";
    if (m->result != DONE_COMPLETE && m->result != DONE_GAVE_UP) return "DONE: unknown result";
    if (get_u32(p + 12) != 0) return "DONE: reserved field not zero";
    return NULL;
}

size_t wire_encode_joined(const wire_joined *m, uint8_t *out) {
    put_u32(out, m->result);
    put_u32(out + 4, 0);
    put_u64(out + 8, (uint64_t)m->group_step);
    put_u64(out + 16, m->group_hash);
    return WIRE_JOINED_BYTES;
}

const char *wire_decode_joined(const uint8_t *p, size_t n, wire_joined *m) {
    if (n != WIRE_JOINED_BYTES) return "JOINED has the wrong size";
    m->result = get_u32(p);
    m->group_step = (int64_t)get_u64(p + 8);
    m->group_hash = get_u64(p + 16);
    if (m->result != JOINED_MEMBER && m->result != JOINED_WAIT && m->result != JOINED_FINISHED)
        return "JOINED: unknown result";
    if (get_u32(p + 4) != 0) return "JOINED: reserved field not zero";
    return NULL;
}

size_t wire_encode_leave(const wire_leave *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u32(out + 8, m->reason);
    put_u32(out + 12, 0);
    return WIRE_LEAVE_BYTES;
}

const char *wire_decode_leave(const uint8_t *p, size_t n, wire_leave *m) {
    if (n != WIRE_LEAVE_BYTES) return "LEAVE has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->reason = get_u32(p + 8);
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "LEAVE: outer step not in 0 .. 2^53";
    if (m->reason != LEAVE_STOPPED && m->reason != LEAVE_FINISHED) return "LEAVE: unknown reason";
    if (get_u32(p + 12) != 0) return "LEAVE: reserved field not zero";
    return NULL;
}

static const char *check_transfer(uint64_t total, uint32_t chunk) {
    if (total > WIRE_MAX_TRANSFER_BYTES) return "transfer larger than 1 TiB";
    if (chunk < WIRE_MIN_CHUNK_BYTES || chunk > WIRE_MAX_CHUNK_BYTES) return "chunk size out of range";
    // The hub keeps a pointer and a bit per chunk of a transfer: their count is bounded too.
    if ((total + chunk - 1) / chunk > WIRE_MAX_TRANSFER_CHUNKS) return "transfer of more than 4 Mi chunks";
    return NULL;
}

size_t wire_encode_contribute(const wire_contribute *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u64(out + 8, m->total_bytes);
    put_u32(out + 16, m->chunk_bytes);
    put_u32(out + 20, m->up_keep);
    out[24] = m->up_codec;
    out[25] = m->down_codec;
    out[26] = m->flags;
    out[27] = 0;
    put_u32(out + 28, m->block);
    put_u32(out + 32, m->segment_values);
    uint32_t bound_bits;
    memcpy(&bound_bits, &m->bound, 4);
    put_u32(out + 36, bound_bits);
    put_u64(out + 40, m->values);
    put_u64(out + 48, m->value_offset);
    put_u64(out + 56, m->model_values);
    put_u64(out + 64, m->tokens);
    return WIRE_CONTRIBUTE_BYTES;
}

const char *wire_decode_contribute(const uint8_t *p, size_t n, wire_contribute *m) {
    if (n != WIRE_CONTRIBUTE_BYTES) return "CONTRIBUTE has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->total_bytes = get_u64(p + 8);
    m->chunk_bytes = get_u32(p + 16);
    m->up_keep = get_u32(p + 20);
    m->up_codec = p[24];
    m->down_codec = p[25];
    m->flags = p[26];
    m->block = get_u32(p + 28);
    m->segment_values = get_u32(p + 32);
    uint32_t bound_bits = get_u32(p + 36);
    memcpy(&m->bound, &bound_bits, 4);
    m->values = get_u64(p + 40);
    m->value_offset = get_u64(p + 48);
    m->model_values = get_u64(p + 56);
    m->tokens = get_u64(p + 64);
    if (p[27] != 0) return "CONTRIBUTE: reserved field not zero";
    if (m->tokens > WIRE_MAX_TOKENS) return "CONTRIBUTE: its tokens are not in 0 .. 2^53";
    if (!(m->bound >= 0.0f && m->bound <= 1e6f)) return "CONTRIBUTE: the bound is not a number in [0, 1e6]";
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "CONTRIBUTE: outer step not in 0 .. 2^53";
    if (m->up_codec > WIRE_CODEC_INT2 || m->down_codec > WIRE_CODEC_INT2) return "CONTRIBUTE: unknown codec";
    // (The codecs take a block of at most 2^20 values, a sparse one fewer kept; a hub that asked
    // them for more exited: quant_codec_of's check, on a peer's word.)
    if (m->block > WIRE_MAX_BLOCK) return "CONTRIBUTE: the block is over 2^20 values";
    if (m->up_keep && (m->up_codec == WIRE_CODEC_FP32 || m->up_codec == WIRE_CODEC_BF16 || m->up_keep >= m->block))
        return "CONTRIBUTE: a sparse contribution needs codec int8, int4 or int2 and fewer values kept than a block";
    if (m->flags & ~(unsigned)(WIRE_HUB_FEEDBACK | WIRE_MULTI_HUB)) return "CONTRIBUTE: unknown flags";
    if (m->block == 0 || m->segment_values == 0 || m->segment_values % m->block != 0 || m->segment_values % 2 != 0)
        return "CONTRIBUTE: the segment is not an even number of whole blocks";
    if (m->values == 0 || m->values > m->model_values || m->value_offset > m->model_values - m->values)
        return "CONTRIBUTE: its values lie outside the model";
    return check_transfer(m->total_bytes, m->chunk_bytes);
}

size_t wire_encode_round(const wire_round *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u32(out + 8, m->flags);
    put_u32(out + 12, m->n);
    for (uint32_t i = 0; i < m->n && i < WIRE_MAX_REPLICAS; i++) {
        uint8_t *e = out + WIRE_ROUND_HEAD_BYTES + (size_t)i * WIRE_ROUND_ENTRY_BYTES;
        put_u32(e, m->ids[i]);
        put_u32(e + 4, 0);
        put_u64(e + 8, m->bytes[i]);
    }
    return WIRE_ROUND_HEAD_BYTES + (size_t)m->n * WIRE_ROUND_ENTRY_BYTES;
}

const char *wire_decode_round(const uint8_t *p, size_t n, wire_round *m) {
    if (n < WIRE_ROUND_HEAD_BYTES) return "ROUND is too short";
    m->outer_step = (int64_t)get_u64(p);
    m->flags = get_u32(p + 8);
    m->n = get_u32(p + 12);
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "ROUND: outer step not in 0 .. 2^53";
    if (m->flags & ~(uint32_t)(ROUND_APPLY | ROUND_SEND_STATE | ROUND_CATCHUP)) return "ROUND: unknown flags";
    if (m->n > WIRE_MAX_REPLICAS) return "ROUND: more contributors than replicas";
    if (n != WIRE_ROUND_HEAD_BYTES + (size_t)m->n * WIRE_ROUND_ENTRY_BYTES)
        return "ROUND: contributor count disagrees with the frame";
    for (uint32_t i = 0; i < m->n; i++) {
        const uint8_t *e = p + WIRE_ROUND_HEAD_BYTES + (size_t)i * WIRE_ROUND_ENTRY_BYTES;
        m->ids[i] = get_u32(e);
        m->bytes[i] = get_u64(e + 8);
        if (get_u32(e + 4) != 0) return "ROUND: reserved field not zero";
        if (m->ids[i] >= WIRE_MAX_REPLICAS) return "ROUND: replica id out of range";
        if (i > 0 && m->ids[i] <= m->ids[i - 1]) return "ROUND: ids not strictly ascending";
        if (m->bytes[i] > WIRE_MAX_TRANSFER_BYTES) return "ROUND: payload larger than 1 TiB";
    }
    return NULL;
}

size_t wire_encode_evicted(int64_t outer_step, uint32_t reason, const char *text, uint8_t *out) {
    size_t n = text_length(text);
    put_u64(out, (uint64_t)outer_step);
    put_u32(out + 8, reason);
    put_u32(out + 12, (uint32_t)n);
    if (n) memcpy(out + WIRE_EVICTED_HEAD_BYTES, text, n);
    return WIRE_EVICTED_HEAD_BYTES + n;
}

const char *wire_decode_evicted(const uint8_t *p, size_t n, wire_evicted *m) {
    if (n < WIRE_EVICTED_HEAD_BYTES || n > WIRE_EVICTED_HEAD_BYTES + WIRE_MAX_TEXT_BYTES)
        return "EVICTED has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->reason = get_u32(p + 8);
    m->text_bytes = get_u32(p + 12);
    m->text = p + WIRE_EVICTED_HEAD_BYTES;
    if (m->text_bytes != n - WIRE_EVICTED_HEAD_BYTES) return "EVICTED: text length disagrees with the frame";
    return NULL;
}

size_t wire_encode_state(const wire_state *m, uint8_t *out) {
    put_u64(out, (uint64_t)m->outer_step);
    put_u64(out + 8, m->total_bytes);
    put_u32(out + 16, m->chunk_bytes);
    put_u32(out + 20, m->donor_id);
    put_u32(out + 24, m->flags);
    put_u32(out + 28, 0);
    return WIRE_STATE_BYTES;
}

const char *wire_decode_state(const uint8_t *p, size_t n, wire_state *m) {
    if (n != WIRE_STATE_BYTES) return "STATE has the wrong size";
    m->outer_step = (int64_t)get_u64(p);
    m->total_bytes = get_u64(p + 8);
    m->chunk_bytes = get_u32(p + 16);
    m->donor_id = get_u32(p + 20);
    m->flags = get_u32(p + 24);
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "STATE: outer step not in 0 .. 2^53";
    if ((m->flags & ~(uint32_t)STATE_CATCHUP) != 0 || get_u32(p + 28) != 0) return "STATE: unknown flags";
    if (m->donor_id >= WIRE_MAX_REPLICAS) return "STATE: donor id out of range";
    return check_transfer(m->total_bytes, m->chunk_bytes);
}

size_t wire_encode_step(int64_t outer_step, uint8_t *out) {
    put_u64(out, (uint64_t)outer_step);
    return 8;
}

const char *wire_decode_step(const uint8_t *p, size_t n, int64_t *outer_step) {
    if (n != 8) return "an 8-byte step frame (STATE_ABORT, STATE_END, CAUGHT_UP) has the wrong size";
    *outer_step = (int64_t)get_u64(p);
    if (*outer_step < -WIRE_MAX_STEP || *outer_step > WIRE_MAX_STEP) return "an 8-byte step frame's step is beyond 2^53";
    return NULL;
}

size_t wire_encode_heartbeat(uint32_t flags, uint8_t out[WIRE_HEARTBEAT_BYTES]) {
    put_u32(out, flags);
    return WIRE_HEARTBEAT_BYTES;
}

const char *wire_decode_heartbeat(const uint8_t *p, size_t n, uint32_t *flags) {
    *flags = 0;
    if (n == 0) return NULL;
    if (n != WIRE_HEARTBEAT_BYTES) return "HEARTBEAT has the wrong size";
    *flags = get_u32(p);
    if (*flags & ~(uint32_t)HEARTBEAT_HOLD) return "HEARTBEAT has unknown flags";
    return NULL;
}

size_t wire_encode_hold(uint32_t what, uint8_t out[WIRE_HOLD_BYTES]) {
    put_u32(out, what);
    put_u32(out + 4, 0);
    return WIRE_HOLD_BYTES;
}

const char *wire_decode_hold(const uint8_t *p, size_t n, uint32_t *what) {
    if (n != WIRE_HOLD_BYTES) return "HOLD has the wrong size";
    *what = get_u32(p);
    if (*what != HOLD_BEGIN && *what != HOLD_END) return "HOLD: unknown kind";
    if (get_u32(p + 4) != 0) return "HOLD: reserved field not zero";
    return NULL;
}

size_t wire_encode_data_head(const wire_data *m, uint8_t out[WIRE_DATA_HEAD_BYTES]) {
    put_u32(out, m->owner_id);
    out[4] = (uint8_t)m->kind;
    out[5] = out[6] = out[7] = 0;
    put_u64(out + 8, (uint64_t)m->outer_step);
    put_u64(out + 16, m->total_bytes);
    put_u64(out + 24, m->offset);
    put_u32(out + 32, m->chunk_bytes);
    put_u32(out + 36, 0);
    return WIRE_DATA_HEAD_BYTES;
}

const char *wire_decode_data(const uint8_t *p, size_t n, wire_data *m) {
    if (n < WIRE_DATA_HEAD_BYTES) return "DATA is too short";
    m->owner_id = get_u32(p);
    m->kind = p[4];
    m->outer_step = (int64_t)get_u64(p + 8);
    m->total_bytes = get_u64(p + 16);
    m->offset = get_u64(p + 24);
    m->chunk_bytes = get_u32(p + 32);
    m->bytes = p + WIRE_DATA_HEAD_BYTES;
    m->chunk_len = n - WIRE_DATA_HEAD_BYTES;
    if (!all_zero(p + 5, 3) || get_u32(p + 36) != 0) return "DATA: reserved field not zero";
    if (m->kind < DATA_PAYLOAD || m->kind > DATA_CATCHUP) return "DATA: unknown kind";
    if (m->owner_id >= WIRE_MAX_REPLICAS) return "DATA: owner id out of range";
    if (m->outer_step < 0 || m->outer_step > WIRE_MAX_STEP) return "DATA: outer step not in 0 .. 2^53";
    const char *why = check_transfer(m->total_bytes, m->chunk_bytes);
    if (why) return why;
    if (m->offset >= m->total_bytes) return "DATA: offset past the end";
    if (m->offset % m->chunk_bytes != 0) return "DATA: offset not on a chunk boundary";
    uint64_t expect = m->total_bytes - m->offset < m->chunk_bytes ? m->total_bytes - m->offset : m->chunk_bytes;
    if (m->chunk_len != expect) return "DATA: chunk length disagrees with its offset and total";
    return NULL;
}

void wire_printable(const uint8_t *text, size_t bytes, char *out, size_t out_bytes) {
    if (out_bytes == 0) return;
    size_t n = bytes < out_bytes - 1 ? bytes : out_bytes - 1;
    for (size_t i = 0; i < n; i++) out[i] = (text[i] >= 0x20 && text[i] < 0x7f) ? (char)text[i] : '?';
    out[n] = '\0';
}
