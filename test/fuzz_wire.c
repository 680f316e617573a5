// test/fuzz_wire.c — libFuzzer target for the frame parser and the payload decoders
// (net/wire.c), built by `make fuzz` / `make test` with clang -fsanitize=fuzzer,address,undefined.
//
// Each input is tried three ways:
//   1. as it is, under the all-zero handshake key and under a session key: the parser
//      must return a verdict without reading out of bounds (nearly always BAD_MAGIC,
//      TRUNCATED or BAD_TAG: the fuzzer cannot forge tags);
//   2. with its tag recomputed (and the expected sequence number taken from its header),
//      so that everything behind the tag check — every payload decoder — sees the fuzzer's
//      bytes. The parser must then accept the frame (a checked invariant), and
//   3. whatever a decoder accepts must encode back to the very same bytes (the codecs
//      are exact inverses; a decoder that accepts more than the encoder can write is a bug).
#include "net/wire.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t ZERO_KEY[WIRE_KEY_BYTES] = {0};
static const uint8_t SESSION_KEY[WIRE_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                                    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

#define MUST(cond) \
    do {           \
        if (!(cond)) __builtin_trap(); \
    } while (0)

static uint8_t scratch[WIRE_DATA_HEAD_BYTES + 8 + WIRE_MAX_TEXT_BYTES + WIRE_ROUND_HEAD_BYTES +
                       WIRE_ROUND_ENTRY_BYTES * WIRE_MAX_REPLICAS];

// Decodes a payload by its type; if accepted, re-encodes and compares.
static void decode_payload(unsigned type, const uint8_t *p, size_t n) {
    size_t m = 0;
    switch (type) {
    case WIRE_HELLO: {
        wire_hello x;
        if (!wire_decode_hello(p, n, &x)) m = wire_encode_hello(&x, scratch);
        break;
    }
    case WIRE_AUTH: {
        wire_auth x;
        if (!wire_decode_auth(p, n, &x)) m = wire_encode_auth(&x, scratch);
        break;
    }
    case WIRE_WELCOME: {
        wire_welcome x;
        if (!wire_decode_welcome(p, n, &x)) m = wire_encode_welcome(&x, scratch);
        break;
    }
    case WIRE_REFUSE: {
        wire_refuse x;
        if (!wire_decode_refuse(p, n, &x)) {
            MUST(x.text_bytes <= WIRE_MAX_TEXT_BYTES && x.text + x.text_bytes == p + n);
            char text[64];
            wire_printable(x.text, x.text_bytes, text, sizeof text);
            MUST(strlen(text) < sizeof text);
        }
        return;
    }
    case WIRE_JOIN: {
        wire_status x;
        if (!wire_decode_status(p, n, &x)) m = wire_encode_status(&x, scratch);
        break;
    }
    case WIRE_FOLLOW: {
        wire_follow x;
        if (!wire_decode_follow(p, n, &x)) m = wire_encode_follow(&x, scratch);
        break;
    }
    case WIRE_DONE: {
        wire_done x;
        if (!wire_decode_done(p, n, &x)) m = wire_encode_done(&x, scratch);
        break;
    }
    case WIRE_LEAVE: {
        wire_leave x;
        if (!wire_decode_leave(p, n, &x)) m = wire_encode_leave(&x, scratch);
        break;
    }
    case WIRE_JOINED: {
        wire_joined x;
        if (!wire_decode_joined(p, n, &x)) m = wire_encode_joined(&x, scratch);
        break;
    }
    case WIRE_CONTRIBUTE: {
        wire_contribute x;
        if (!wire_decode_contribute(p, n, &x)) m = wire_encode_contribute(&x, scratch);
        break;
    }
    case WIRE_ROUND: {
        static wire_round x;
        if (!wire_decode_round(p, n, &x)) {
            MUST(x.n <= WIRE_MAX_REPLICAS);
            for (uint32_t i = 1; i < x.n; i++) MUST(x.ids[i] > x.ids[i - 1]);
            m = wire_encode_round(&x, scratch);
        }
        break;
    }
    case WIRE_EVICTED: {
        wire_evicted x;
        if (!wire_decode_evicted(p, n, &x)) MUST(x.text + x.text_bytes == p + n);
        return;
    }
    case WIRE_STATE: {
        wire_state x;
        if (!wire_decode_state(p, n, &x)) m = wire_encode_state(&x, scratch);
        break;
    }
    case WIRE_HEARTBEAT: {
        uint32_t flags;
        if (!wire_decode_heartbeat(p, n, &flags)) {
            MUST(flags == 0 || n == WIRE_HEARTBEAT_BYTES);
            if (n == 0) return;
            m = wire_encode_heartbeat(flags, scratch);
        }
        break;
    }
    case WIRE_HOLD: {
        uint32_t what;
        if (!wire_decode_hold(p, n, &what)) m = wire_encode_hold(what, scratch);
        break;
    }
    case WIRE_STATE_ABORT: {
        int64_t step;
        if (!wire_decode_step(p, n, &step)) m = wire_encode_step(step, scratch);
        break;
    }
    case WIRE_DATA: {
        wire_data x;
        if (!wire_decode_data(p, n, &x)) {
            // What a receiver does with an accepted chunk: it must lie inside its transfer.
            MUST(x.offset < x.total_bytes && x.chunk_len <= x.total_bytes - x.offset);
            MUST(x.chunk_len <= x.chunk_bytes && x.bytes + x.chunk_len == p + n);
            m = wire_encode_data_head(&x, scratch);
            n = WIRE_DATA_HEAD_BYTES;
        }
        break;
    }
    default: return;
    }
    if (m) MUST(m == n && memcmp(scratch, p, n) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    wire_frame f;
    for (int k = 0; k < 2; k++) {
        wire_error e = wire_parse(data, size, k ? SESSION_KEY : ZERO_KEY, 0, &f);
        MUST(wire_error_string(e) != NULL);
        if (e == WIRE_OK) {
            MUST(f.frame_bytes <= size && f.payload == data + WIRE_HEADER_BYTES);
            decode_payload(f.type, f.payload, (size_t)f.payload_bytes);
        }
    }
    if (size < WIRE_HEADER_BYTES) return 0;
    if (wire_check_header(data, &f) != WIRE_OK) return 0;
    MUST(f.frame_bytes == WIRE_OVERHEAD_BYTES + f.payload_bytes);
    // Fix the tag up so that the decoders see the payload (the input may be short of a tag).
    size_t signed_bytes = WIRE_HEADER_BYTES + (size_t)f.payload_bytes;
    if (signed_bytes > size) return 0;
    uint8_t *buf = malloc(signed_bytes + WIRE_TAG_BYTES);
    memcpy(buf, data, signed_bytes);
    wire_tag(SESSION_KEY, buf, signed_bytes, NULL, 0, buf + signed_bytes);
    wire_frame g;
    MUST(wire_parse(buf, signed_bytes + WIRE_TAG_BYTES, SESSION_KEY, f.seq, &g) == WIRE_OK);
    decode_payload(g.type, g.payload, (size_t)g.payload_bytes);
    MUST(wire_parse(buf, signed_bytes + WIRE_TAG_BYTES, SESSION_KEY, f.seq + 1, &g) == WIRE_BAD_SEQUENCE);
    MUST(wire_parse(buf, signed_bytes + WIRE_TAG_BYTES - 1, SESSION_KEY, f.seq, &g) == WIRE_TRUNCATED);
    free(buf);
    return 0;
}
