// test/test_wire.c — the frame format (net/wire.c) on its own: every frame type round-trips;
// every single flipped byte, every truncation, a length of 2^63, a wrong key, a replayed
// sequence number and plain garbage are each rejected with their own error; the payload
// decoders refuse inconsistent fields; the handshake's proofs and keys depend on everything
// they should; a connection (net/conn.c) that drops its unsent frames keeps its sequence
// numbers contiguous for the frames after; the sockets of net/socket.c have TCP keepalive on.
// Also `test_wire --corpus DIR` writes the fuzzer's seed corpus (one valid frame of every type).
#include "net/wire.h"
#include "llmc/plan.h"
#include "llmc/common.h"
#include "net/socket.h"
#include "net/conn.h"
#include "check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const uint8_t KEY[WIRE_KEY_BYTES] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
static const uint8_t OTHER_KEY[WIRE_KEY_BYTES] = {9, 8, 7, 6, 5, 4, 3, 2, 2};

typedef struct {
    unsigned type;
    uint8_t payload[WIRE_ROUND_HEAD_BYTES + WIRE_ROUND_ENTRY_BYTES * WIRE_MAX_REPLICAS + 5000];
    size_t bytes;
} sample;
#define SAMPLES 23   // samples() writes one of every type, and of the catch-up's frames

// One valid payload of every type.
static int samples(sample *s) {
    int n = 0;
    wire_hello hello = {.timeout_ms = 60000};
    for (int i = 0; i < WIRE_NONCE_BYTES; i++) hello.nonce_h[i] = (uint8_t)(i * 7);
    s[n].type = WIRE_HELLO, s[n].bytes = wire_encode_hello(&hello, s[n].payload), n++;
    wire_auth auth = {.replica_id = 2, .stream_index = 1, .streams = 4, .replicas = 3, .min_replicas = 2,
                      .run_fingerprint = 0x1234567890abcdefull, .session_id = 99, .hub_index = 1, .hubs = 3};
    memset(auth.nonce_c, 0xab, sizeof auth.nonce_c);
    memset(auth.proof, 0xcd, sizeof auth.proof);
    s[n].type = WIRE_AUTH, s[n].bytes = wire_encode_auth(&auth, s[n].payload), n++;
    wire_welcome welcome = {.session_id = 77, .timeout_ms = 3000};
    s[n].type = WIRE_WELCOME, s[n].bytes = wire_encode_welcome(&welcome, s[n].payload), n++;
    s[n].type = WIRE_REFUSE, s[n].bytes = wire_encode_refuse(REFUSE_SECRET, "wrong secret", s[n].payload), n++;
    s[n].type = WIRE_HEARTBEAT, s[n].bytes = 0, n++;
    wire_status st = {.outer_step = 12, .param_hash = 0xfeedull};
    s[n].type = WIRE_JOIN, s[n].bytes = wire_encode_status(&st, s[n].payload), n++;
    wire_joined joined = {.result = JOINED_WAIT, .group_step = 13, .group_hash = 5};
    s[n].type = WIRE_JOINED, s[n].bytes = wire_encode_joined(&joined, s[n].payload), n++;
    wire_contribute c = {.outer_step = 12, .total_bytes = 3000000, .chunk_bytes = 1 << 20, .up_codec = WIRE_CODEC_INT8,
                         .down_codec = WIRE_CODEC_INT8, .flags = WIRE_HUB_FEEDBACK, .block = 128,
                         .segment_values = 1 << 18, .values = 2900000, .value_offset = 100, .model_values = 3000000,
                         .tokens = 40960};
    s[n].type = WIRE_CONTRIBUTE, s[n].bytes = wire_encode_contribute(&c, s[n].payload), n++;
    static wire_round round = {.outer_step = 12, .flags = ROUND_APPLY | ROUND_SEND_STATE, .n = 3,
                               .ids = {0, 1, 5}, .bytes = {10, 0, 3000000}};
    s[n].type = WIRE_ROUND, s[n].bytes = wire_encode_round(&round, s[n].payload), n++;
    s[n].type = WIRE_EVICTED, s[n].bytes = wire_encode_evicted(12, 1, "late", s[n].payload), n++;
    wire_state state = {.outer_step = 12, .total_bytes = 5000, .chunk_bytes = 4096, .donor_id = 1};
    s[n].type = WIRE_STATE, s[n].bytes = wire_encode_state(&state, s[n].payload), n++;
    s[n].type = WIRE_STATE_ABORT, s[n].bytes = wire_encode_step(12, s[n].payload), n++;
    wire_leave leave = {.outer_step = 12, .reason = LEAVE_FINISHED};
    s[n].type = WIRE_LEAVE, s[n].bytes = wire_encode_leave(&leave, s[n].payload), n++;
    wire_data d = {.owner_id = 5, .kind = DATA_STATE, .outer_step = 12, .total_bytes = 5000, .offset = 4096,
                   .chunk_bytes = 4096, .chunk_len = 904};
    s[n].type = WIRE_DATA, s[n].bytes = wire_encode_data_head(&d, s[n].payload);
    for (int i = 0; i < 904; i++) s[n].payload[s[n].bytes++] = (uint8_t)i;
    n++;
    wire_follow follow = {.outer_step = 12, .param_hash = 0xfeedull, .first_round = 12 * 64, .flags = FOLLOW_CATCHUP};
    s[n].type = WIRE_FOLLOW, s[n].bytes = wire_encode_follow(&follow, s[n].payload), n++;
    wire_done done = {.outer_step = 12, .result = DONE_COMPLETE};
    s[n].type = WIRE_DONE, s[n].bytes = wire_encode_done(&done, s[n].payload), n++;
    s[n].type = WIRE_HOLD, s[n].bytes = wire_encode_hold(HOLD_BEGIN, s[n].payload), n++;
    s[n].type = WIRE_HEARTBEAT, s[n].bytes = wire_encode_heartbeat(HEARTBEAT_HOLD, s[n].payload), n++;
    // The catch-up transfer: STATE with its flag, the joiner's CAUGHT_UP, the hub's STATE_END, and a
    // chunk of a landed round's mean.
    wire_state catchup = {.outer_step = 12, .total_bytes = 5000, .chunk_bytes = 4096, .donor_id = 1,
                          .flags = STATE_CATCHUP};
    s[n].type = WIRE_STATE, s[n].bytes = wire_encode_state(&catchup, s[n].payload), n++;
    s[n].type = WIRE_CAUGHT_UP, s[n].bytes = wire_encode_step(15, s[n].payload), n++;
    s[n].type = WIRE_STATE_END, s[n].bytes = wire_encode_step(17, s[n].payload), n++;
    s[n].type = WIRE_STATE_AGAIN, s[n].bytes = wire_encode_step(3, s[n].payload), n++;   // joiners in flight
    wire_data mean = {.owner_id = 1, .kind = DATA_CATCHUP, .outer_step = 13, .total_bytes = 2000, .offset = 0,
                      .chunk_bytes = 4096, .chunk_len = 2000};
    s[n].type = WIRE_DATA, s[n].bytes = wire_encode_data_head(&mean, s[n].payload);
    for (int i = 0; i < 2000; i++) s[n].payload[s[n].bytes++] = (uint8_t)(i * 3);
    n++;
    return n;
}

static uint8_t frame[WIRE_OVERHEAD_BYTES + sizeof(((sample *)0)->payload)];

static wire_state catchup_state_with(uint32_t flags) {
    wire_state m = {.outer_step = 3, .total_bytes = 5000, .chunk_bytes = 4096, .donor_id = 2, .flags = flags};
    return m;
}

static void test_round_trips(void) {
    static sample s[SAMPLES];
    int n = samples(s);
    EXPECT(n == SAMPLES, "%d sample types", n);
    for (int i = 0; i < n; i++) {
        size_t bytes = wire_build(frame, s[i].type, 41, s[i].payload, s[i].bytes, KEY);
        wire_frame f;
        wire_error e = wire_parse(frame, bytes, KEY, 41, &f);
        EXPECT(e == WIRE_OK, "%s: %s", wire_type_name(s[i].type), wire_error_string(e));
        EXPECT(f.type == s[i].type && f.payload_bytes == s[i].bytes && f.frame_bytes == bytes, "%s header",
               wire_type_name(s[i].type));
        EXPECT(f.payload && memcmp(f.payload, s[i].payload, s[i].bytes) == 0, "%s payload", wire_type_name(s[i].type));
    }
    // Decoders give back what was encoded.
    wire_round r;
    EXPECT(!wire_decode_round(s[8].payload, s[8].bytes, &r) && r.n == 3 && r.ids[2] == 5 && r.bytes[2] == 3000000 &&
               r.flags == (ROUND_APPLY | ROUND_SEND_STATE),
           "ROUND decodes");
    wire_data d;
    EXPECT(!wire_decode_data(s[13].payload, s[13].bytes, &d) && d.offset == 4096 && d.chunk_len == 904 &&
               d.bytes[3] == 3,
           "DATA decodes");
    wire_state ws;
    EXPECT(!wire_decode_state(s[10].payload, s[10].bytes, &ws) && ws.flags == 0 && ws.donor_id == 1,
           "STATE decodes (a whole transfer)");
    EXPECT(!wire_decode_state(s[18].payload, s[18].bytes, &ws) && ws.flags == STATE_CATCHUP && ws.total_bytes == 5000,
           "STATE decodes (a catch-up transfer)");
    int64_t step = 0;
    EXPECT(!wire_decode_step(s[19].payload, s[19].bytes, &step) && step == 15, "CAUGHT_UP decodes");
    EXPECT(!wire_decode_step(s[20].payload, s[20].bytes, &step) && step == 17, "STATE_END decodes");
    EXPECT(!wire_decode_step(s[21].payload, s[21].bytes, &step) && step == 3, "STATE_AGAIN decodes");
    EXPECT(!wire_decode_data(s[22].payload, s[22].bytes, &d) && d.kind == DATA_CATCHUP && d.outer_step == 13 &&
               d.chunk_len == 2000 && d.bytes[1] == 3,
           "DATA of a catch-up mean decodes");
    uint8_t sb[WIRE_STATE_BYTES];
    for (int i = 0; i < 2; i++) {
        wire_state bad = catchup_state_with(i == 0 ? 2 : STATE_CATCHUP);
        wire_encode_state(&bad, sb);
        if (i == 1) sb[28] = 1;
        EXPECT(wire_decode_state(sb, sizeof sb, &ws) != NULL, "STATE with %s is refused",
               i == 0 ? "an unknown flag" : "its reserved field set");
    }
    EXPECT(wire_decode_state(sb, 24, &ws) != NULL, "STATE of version 7's 24 bytes is refused");
    wire_auth a;
    EXPECT(!wire_decode_auth(s[1].payload, s[1].bytes, &a) && a.replica_id == 2 && a.streams == 4 &&
               a.run_fingerprint == 0x1234567890abcdefull && a.session_id == 99 && a.hub_index == 1 && a.hubs == 3,
           "AUTH decodes");
    wire_done dn;
    EXPECT(!wire_decode_done(s[15].payload, s[15].bytes, &dn) && dn.outer_step == 12 && dn.result == DONE_COMPLETE,
           "DONE decodes");
    uint8_t dbuf[WIRE_DONE_BYTES];
    for (int i = 0; i < 4; i++) {
        wire_done bad_done = {.outer_step = i == 0 ? -1 : i == 3 ? (int64_t)1 << 62 : 3,
                              .result = i == 1 ? 3 : DONE_GAVE_UP};
        wire_encode_done(&bad_done, dbuf);
        if (i == 2) dbuf[12] = 1;
        EXPECT(wire_decode_done(dbuf, sizeof dbuf, &dn) != NULL, "DONE with %s is refused",
               i == 0   ? "a negative step"
               : i == 1 ? "an unknown result"
               : i == 2 ? "a reserved field set"
                        : "a step of 2^62 (every step and round id of a frame is at most 2^53)");
    }
    wire_done far = {.outer_step = WIRE_MAX_STEP, .result = DONE_COMPLETE};
    wire_encode_done(&far, dbuf);
    EXPECT(!wire_decode_done(dbuf, sizeof dbuf, &dn) && dn.outer_step == WIRE_MAX_STEP, "DONE of step 2^53 decodes");
    // HEARTBEAT: empty (flags 0) or u32 flags, HOLD the only one.
    uint8_t hb[WIRE_HEARTBEAT_BYTES];
    uint32_t flags = 7;
    EXPECT(!wire_decode_heartbeat(NULL, 0, &flags) && flags == 0, "an empty HEARTBEAT decodes");
    EXPECT(!wire_decode_heartbeat(hb, wire_encode_heartbeat(HEARTBEAT_HOLD, hb), &flags) && flags == HEARTBEAT_HOLD,
           "HEARTBEAT(hold) decodes");
    wire_encode_heartbeat(2, hb);
    EXPECT(wire_decode_heartbeat(hb, sizeof hb, &flags) != NULL, "HEARTBEAT with an unknown flag is refused");
    EXPECT(wire_decode_heartbeat(hb, 2, &flags) != NULL, "HEARTBEAT of 2 bytes is refused");
    // HOLD: begin or end, reserved zero.
    uint8_t hold[WIRE_HOLD_BYTES];
    uint32_t what = 0;
    EXPECT(!wire_decode_hold(hold, wire_encode_hold(HOLD_END, hold), &what) && what == HOLD_END, "HOLD decodes");
    wire_encode_hold(3, hold);
    EXPECT(wire_decode_hold(hold, sizeof hold, &what) != NULL, "HOLD of an unknown kind is refused");
    wire_encode_hold(HOLD_BEGIN, hold);
    hold[5] = 1;
    EXPECT(wire_decode_hold(hold, sizeof hold, &what) != NULL, "HOLD with a reserved field set is refused");
    wire_leave lv;
    EXPECT(!wire_decode_leave(s[12].payload, s[12].bytes, &lv) && lv.outer_step == 12 && lv.reason == LEAVE_FINISHED,
           "LEAVE decodes");
    uint8_t lbuf[WIRE_LEAVE_BYTES];
    for (int i = 0; i < 3; i++) {
        wire_leave bad_leave = {.outer_step = i == 0 ? -1 : 3, .reason = i == 1 ? 3 : LEAVE_STOPPED};
        wire_encode_leave(&bad_leave, lbuf);
        if (i == 2) lbuf[12] = 1;
        EXPECT(wire_decode_leave(lbuf, sizeof lbuf, &lv) != NULL, "LEAVE with %s is refused",
               i == 0 ? "a negative step" : i == 1 ? "an unknown reason" : "a reserved field set");
    }
    wire_joined jd;
    EXPECT(!wire_decode_joined(s[6].payload, s[6].bytes, &jd) && jd.result == JOINED_WAIT && jd.group_step == 13,
           "JOINED decodes");
    wire_joined over = {.result = JOINED_FINISHED, .group_step = 40, .group_hash = 2};
    uint8_t jbuf[WIRE_JOINED_BYTES];
    wire_encode_joined(&over, jbuf);
    EXPECT(!wire_decode_joined(jbuf, sizeof jbuf, &jd) && jd.result == JOINED_FINISHED && jd.group_step == 40,
           "JOINED(finished) decodes");
    over.result = 4;
    wire_encode_joined(&over, jbuf);
    EXPECT(wire_decode_joined(jbuf, sizeof jbuf, &jd) != NULL, "JOINED with an unknown result is refused");
    wire_follow fo;
    EXPECT(!wire_decode_follow(s[14].payload, s[14].bytes, &fo) && fo.outer_step == 12 && fo.param_hash == 0xfeedull &&
               fo.first_round == 768 && fo.flags == FOLLOW_CATCHUP,
           "FOLLOW decodes");
    uint8_t fbuf[WIRE_FOLLOW_BYTES];
    wire_follow negative = {.outer_step = 3, .first_round = -1};
    wire_encode_follow(&negative, fbuf);
    EXPECT(wire_decode_follow(fbuf, sizeof fbuf, &fo) != NULL, "FOLLOW with a negative round is refused");
    wire_follow flagged = {.outer_step = 3, .first_round = 192, .flags = 2};
    wire_encode_follow(&flagged, fbuf);
    EXPECT(wire_decode_follow(fbuf, sizeof fbuf, &fo) != NULL, "FOLLOW with an unknown flag is refused");
    wire_follow none_yet = {.outer_step = 3, .first_round = INT64_MAX}, beyond = {.outer_step = 3, .first_round = (int64_t)1 << 60};
    EXPECT(!wire_decode_follow(fbuf, wire_encode_follow(&none_yet, fbuf), &fo) && fo.first_round == INT64_MAX,
           "FOLLOW with no first round yet (2^63 - 1) decodes");
    EXPECT(wire_decode_follow(fbuf, wire_encode_follow(&beyond, fbuf), &fo) != NULL,
           "FOLLOW with a first round of 2^60 is refused");
    // CONTRIBUTE says how the payload is encoded; a layout the hub could not reduce is refused.
    wire_contribute c, bad;
    uint8_t buf[WIRE_CONTRIBUTE_BYTES];
    wire_contribute want = {.outer_step = 12, .total_bytes = 3000000, .chunk_bytes = 1 << 20,
                            .up_codec = WIRE_CODEC_INT4, .down_codec = WIRE_CODEC_BF16, .flags = WIRE_HUB_FEEDBACK,
                            .block = 100, .segment_values = 262000, .values = 2900000, .value_offset = 100,
                            .model_values = 3000100, .tokens = 81920};
    wire_encode_contribute(&want, buf);
    EXPECT(!wire_decode_contribute(buf, sizeof buf, &c) && c.up_codec == WIRE_CODEC_INT4 &&
               c.down_codec == WIRE_CODEC_BF16 && c.flags == WIRE_HUB_FEEDBACK && c.block == 100 &&
               c.segment_values == 262000 && c.values == 2900000 && c.value_offset == 100 && c.model_values == 3000100 &&
               c.tokens == 81920,
           "CONTRIBUTE decodes");
    bad = want;
    bad.flags = WIRE_HUB_FEEDBACK | WIRE_MULTI_HUB;
    wire_encode_contribute(&bad, buf);
    EXPECT(!wire_decode_contribute(buf, sizeof buf, &c) && c.flags == (WIRE_HUB_FEEDBACK | WIRE_MULTI_HUB),
           "CONTRIBUTE of a run with several hubs decodes");
    bad = want;
    bad.up_codec = WIRE_CODEC_INT2, bad.up_keep = 25;
    wire_encode_contribute(&bad, buf);
    EXPECT(!wire_decode_contribute(buf, sizeof buf, &c) && c.up_codec == WIRE_CODEC_INT2 && c.up_keep == 25,
           "CONTRIBUTE of a sparse int2 payload (25 of every 100 values) decodes");
    const char *spoiled[] = {"an unknown codec", "a segment of part blocks", "an odd segment",
                             "values past the model", "no values", "an unknown flag",
                             "a sparse fp32 payload", "a sparse keep of the whole block", "a sparse bf16 payload",
                             "more tokens than a double holds exactly", "a block of 2^23 values keeping 2^22 (the codecs' "
                             "bound is 2^20: the hub exited on their check)", "an outer step of 2^62"};
    for (int i = 0; i < 12; i++) {
        bad = want;
        if (i == 0) bad.down_codec = 5;
        if (i == 1) bad.segment_values = 262050;
        if (i == 2) bad.block = 131001, bad.segment_values = 131001;
        if (i == 3) bad.value_offset = 100101;
        if (i == 4) bad.values = 0;
        if (i == 5) bad.flags = 4;
        if (i == 6) bad.up_codec = WIRE_CODEC_FP32, bad.up_keep = 10;
        if (i == 7) bad.up_keep = 100;
        if (i == 8) bad.up_codec = WIRE_CODEC_BF16, bad.up_keep = 10;
        if (i == 9) bad.tokens = WIRE_MAX_TOKENS + 1;
        if (i == 10)
            bad.up_codec = WIRE_CODEC_INT8, bad.block = 1u << 23, bad.segment_values = 1u << 23, bad.up_keep = 1u << 22,
            bad.values = bad.model_values = 1u << 23, bad.value_offset = 0;
        if (i == 11) bad.outer_step = (int64_t)1 << 62;
        wire_encode_contribute(&bad, buf);
        EXPECT(wire_decode_contribute(buf, sizeof buf, &c) != NULL, "CONTRIBUTE with %s is refused", spoiled[i]);
    }
    bad = want;
    bad.tokens = 0;
    wire_encode_contribute(&bad, buf);
    EXPECT(!wire_decode_contribute(buf, sizeof buf, &c) && c.tokens == 0,
           "CONTRIBUTE of no work (tokens 0: a replica that joined at the run's end) decodes");
}

static void test_every_byte_flip_is_caught(void) {
    uint8_t payload[WIRE_JOIN_BYTES];
    wire_status st = {.outer_step = 3, .param_hash = 42};
    size_t bytes = wire_build(frame, WIRE_JOIN, 5, payload, wire_encode_status(&st, payload), KEY);
    int caught = 0;
    for (size_t i = 0; i < bytes; i++) {
        for (int bit = 0; bit < 8; bit++) {
            frame[i] ^= (uint8_t)(1 << bit);
            wire_frame f;
            wire_error e = wire_parse(frame, bytes, KEY, 5, &f);
            caught += e != WIRE_OK;
            frame[i] ^= (uint8_t)(1 << bit);
        }
    }
    EXPECT(caught == (int)bytes * 8, "%d of %zu bit flips caught", caught, bytes * 8);
    // And which error each part of the header gives.
    wire_frame f;
    frame[0] ^= 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_BAD_MAGIC, "magic");
    frame[0] ^= 1, frame[4] ^= 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_BAD_VERSION, "version");
    frame[4] ^= 1, frame[6] = 99;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_BAD_TYPE, "type");
    frame[6] = WIRE_JOIN, frame[7] = 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_BAD_FLAGS, "flags");
    frame[7] = 0, frame[16] = WIRE_JOIN_BYTES + 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_TOO_LONG, "length one more");
    frame[16] = WIRE_JOIN_BYTES - 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_TOO_SHORT, "length one less");
    frame[16] = WIRE_JOIN_BYTES, frame[30] ^= 0x80;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_BAD_TAG, "payload byte");
    frame[30] ^= 0x80, frame[bytes - 1] ^= 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_BAD_TAG, "tag byte");
    frame[bytes - 1] ^= 1;
    EXPECT(wire_parse(frame, bytes, KEY, 5, &f) == WIRE_OK, "restored");
    EXPECT(wire_parse(frame, bytes, OTHER_KEY, 5, &f) == WIRE_BAD_TAG, "another key");
    EXPECT(wire_parse(frame, bytes, KEY, 6, &f) == WIRE_BAD_SEQUENCE, "replayed (expected seq 6)");
    EXPECT(wire_parse(frame, bytes, KEY, 4, &f) == WIRE_BAD_SEQUENCE, "from the future (expected seq 4)");
}

static void test_truncation_and_lengths(void) {
    size_t bytes = wire_build(frame, WIRE_HEARTBEAT, 0, NULL, 0, KEY);
    wire_frame f;
    for (size_t n = 0; n < bytes; n++) {
        wire_error e = wire_parse(frame, n, KEY, 0, &f);
        EXPECT(e == WIRE_TRUNCATED, "prefix of %zu bytes: %s", n, wire_error_string(e));
        EXPECT(f.frame_bytes == (n < WIRE_HEADER_BYTES ? WIRE_HEADER_BYTES : bytes), "needed bytes at %zu", n);
    }
    // A length of 2^63 (and 2^64 - 1) is over every type's bound: rejected from the header
    // alone, before anyone would wait for (or allocate) that much.
    unsigned types[] = {WIRE_HELLO, WIRE_AUTH, WIRE_REFUSE, WIRE_HEARTBEAT, WIRE_ROUND, WIRE_DATA};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        wire_put_header(frame, types[i], 0, (uint64_t)1 << 63);
        EXPECT(wire_check_header(frame, &f) == WIRE_TOO_LONG, "%s with 2^63", wire_type_name(types[i]));
        EXPECT(wire_parse(frame, WIRE_HEADER_BYTES, KEY, 0, &f) == WIRE_TOO_LONG, "%s parse with 2^63",
               wire_type_name(types[i]));
        wire_put_header(frame, types[i], 0, UINT64_MAX);
        EXPECT(wire_check_header(frame, &f) == WIRE_TOO_LONG, "%s with 2^64-1", wire_type_name(types[i]));
    }
    uint64_t lo, hi;
    EXPECT(wire_payload_bounds(WIRE_DATA, &lo, &hi) && hi == WIRE_DATA_HEAD_BYTES + (16u << 20), "DATA bound");
    wire_put_header(frame, WIRE_DATA, 0, hi);
    EXPECT(wire_check_header(frame, &f) == WIRE_OK && f.frame_bytes == hi + WIRE_OVERHEAD_BYTES, "DATA at its bound");
    wire_put_header(frame, WIRE_DATA, 0, hi + 1);
    EXPECT(wire_check_header(frame, &f) == WIRE_TOO_LONG, "DATA one over");
    for (unsigned t = 0; t < 256; t++)
        if (wire_payload_bounds(t, &lo, &hi))
            EXPECT(hi <= WIRE_MAX_CONTROL_BYTES || t == WIRE_DATA, "%s bound %llu", wire_type_name(t),
                   (unsigned long long)hi);
    // Garbage is known by its first byte.
    const char *http = "GET / HTTP/1.1\r\n";
    EXPECT(wire_parse((const uint8_t *)http, 1, KEY, 0, &f) == WIRE_BAD_MAGIC, "one byte of HTTP");
    EXPECT(wire_parse((const uint8_t *)http, strlen(http), KEY, 0, &f) == WIRE_BAD_MAGIC, "HTTP");
}

static void test_decoders_refuse_nonsense(void) {
    static uint8_t p[WIRE_ROUND_HEAD_BYTES + WIRE_ROUND_ENTRY_BYTES * WIRE_MAX_REPLICAS];
    static wire_round r = {.outer_step = 1, .n = 3, .ids = {1, 2, 3}, .bytes = {1, 1, 1}};
    size_t n = wire_encode_round(&r, p);
    static wire_round out;
    EXPECT(wire_decode_round(p, n, &out) == NULL, "valid ROUND");
    EXPECT(wire_decode_round(p, n - 1, &out) != NULL, "ROUND cut short");
    p[WIRE_ROUND_HEAD_BYTES + WIRE_ROUND_ENTRY_BYTES] = 1;   // ids 1, 1, 3
    EXPECT(wire_decode_round(p, n, &out) != NULL, "ROUND ids not ascending");
    r.n = 300;
    wire_encode_round(&r, p);   // writes at most 256 entries, claims 300
    EXPECT(wire_decode_round(p, WIRE_ROUND_HEAD_BYTES, &out) != NULL, "ROUND n of 300");

    uint8_t d[WIRE_DATA_HEAD_BYTES + 100];
    wire_data data = {.owner_id = 1, .kind = DATA_PAYLOAD, .outer_step = 1, .total_bytes = 5000, .offset = 4096,
                      .chunk_bytes = 4096};
    wire_encode_data_head(&data, d);
    wire_data got;
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 904, &got) == NULL, "valid DATA");
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 100, &got) != NULL, "DATA chunk shorter than it should be");
    data.offset = 4095;
    wire_encode_data_head(&data, d);
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 905, &got) != NULL, "DATA offset off a chunk boundary");
    data.offset = 8192;
    wire_encode_data_head(&data, d);
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES, &got) != NULL, "DATA offset past the end");
    data.offset = 0, data.kind = 7;
    wire_encode_data_head(&data, d);
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 4096, &got) != NULL, "DATA kind 7");
    data.kind = DATA_CATCHUP + 1;
    wire_encode_data_head(&data, d);
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 4096, &got) != NULL, "DATA kind 5");
    data.kind = DATA_PAYLOAD, data.total_bytes = WIRE_MAX_TRANSFER_BYTES + 1;
    wire_encode_data_head(&data, d);
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 4096, &got) != NULL, "DATA transfer over 1 TiB");
    data.total_bytes = 5000, data.chunk_bytes = 100;
    wire_encode_data_head(&data, d);
    EXPECT(wire_decode_data(d, WIRE_DATA_HEAD_BYTES + 100, &got) != NULL, "DATA chunk size under the minimum");

    uint8_t a[WIRE_AUTH_BYTES];
    wire_auth auth = {.replica_id = 3, .streams = 1, .replicas = 3, .min_replicas = 1, .hubs = 1};
    wire_auth ga;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) != NULL, "AUTH id 3 of 3 replicas");
    auth.replica_id = 0;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) == NULL, "valid AUTH");
    auth.hub_index = 1;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) != NULL, "AUTH from hub 2 of 1");
    auth.hub_index = 0, auth.hubs = 0;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) != NULL, "AUTH of 0 hubs");
    auth.hubs = WIRE_MAX_HUBS + 1;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) != NULL, "AUTH of 9 hubs");
    auth.hubs = 1;
    auth.replica_id = 0, auth.streams = 0;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) != NULL, "AUTH with 0 streams");
    auth.streams = 2, auth.stream_index = 1;
    wire_encode_auth(&auth, a);
    EXPECT(wire_decode_auth(a, sizeof a, &ga) != NULL, "AUTH data stream without a session");

    uint8_t t[8 + 10];
    wire_encode_refuse(1, "0123456789", t);
    wire_refuse rf;
    EXPECT(wire_decode_refuse(t, sizeof t, &rf) == NULL && rf.text_bytes == 10, "valid REFUSE");
    EXPECT(wire_decode_refuse(t, sizeof t - 1, &rf) != NULL, "REFUSE text length disagrees");
    char printable[8];
    wire_printable((const uint8_t *)"a\nb\x01" "cdefghij", 12, printable, sizeof printable);
    EXPECT(strcmp(printable, "a?b?cde") == 0, "printable: '%s'", printable);
}

static void test_proofs_and_keys(void) {
    const uint8_t s1[] = "0123456789abcdef", s2[] = "0123456789abcdeg";
    uint8_t nh[WIRE_NONCE_BYTES] = {1}, nc[WIRE_NONCE_BYTES] = {2}, nc2[WIRE_NONCE_BYTES] = {3};
    uint8_t fields[WIRE_AUTH_PROVEN_BYTES] = {4};
    uint8_t p1[32], p2[32], p3[32], p4[32];
    wire_auth_proof(s1, 16, nh, fields, sizeof fields, p1);
    wire_auth_proof(s2, 16, nh, fields, sizeof fields, p2);
    fields[WIRE_AUTH_PROVEN_BYTES - 1] ^= 1;
    wire_auth_proof(s1, 16, nh, fields, sizeof fields, p3);
    nh[5] ^= 1;
    fields[WIRE_AUTH_PROVEN_BYTES - 1] ^= 1;
    wire_auth_proof(s1, 16, nh, fields, sizeof fields, p4);
    EXPECT(!wire_equal32(p1, p2), "proof depends on the secret");
    EXPECT(!wire_equal32(p1, p3), "proof depends on the fields");
    EXPECT(!wire_equal32(p1, p4), "proof depends on the hub's nonce");
    uint8_t w1[32], w2[32];
    wire_welcome_proof(s1, 16, nh, nc, fields, 16, w1);
    wire_welcome_proof(s1, 16, nh, nc2, fields, 16, w2);
    EXPECT(!wire_equal32(w1, w2), "welcome proof depends on the client's nonce");
    uint8_t c2h[32], h2c[32], c2h_b[32], h2c_b[32];
    wire_session_keys(s1, 16, nh, nc, c2h, h2c);
    wire_session_keys(s1, 16, nh, nc2, c2h_b, h2c_b);
    EXPECT(!wire_equal32(c2h, h2c), "one key per direction");
    EXPECT(!wire_equal32(c2h, c2h_b) && !wire_equal32(h2c, h2c_b), "keys depend on the nonces");
    EXPECT(!wire_equal32(c2h, p1) && !wire_equal32(c2h, w1), "keys are not proofs");
}

static void test_addresses(void) {
    char host[64], port[16], err[200];
    EXPECT(net_split_host_port("login1.example.org:29500", host, sizeof host, port, sizeof port, err, sizeof err) &&
               !strcmp(host, "login1.example.org") && !strcmp(port, "29500"),
           "host:port");
    EXPECT(net_split_host_port("[::1]:7", host, sizeof host, port, sizeof port, err, sizeof err) &&
               !strcmp(host, "::1") && !strcmp(port, "7"),
           "[v6]:port");
    EXPECT(net_split_host_port(":0", host, sizeof host, port, sizeof port, err, sizeof err) && !host[0], ":port");
    EXPECT(!net_split_host_port("nohost", host, sizeof host, port, sizeof port, err, sizeof err), "no port");
    EXPECT(!net_split_host_port("h:70000", host, sizeof host, port, sizeof port, err, sizeof err), "port too big");
    EXPECT(!net_split_host_port("::1:5", host, sizeof host, port, sizeof port, err, sizeof err), "v6 without brackets");
    EXPECT(!net_split_host_port("h:x1", host, sizeof host, port, sizeof port, err, sizeof err), "port not a number");
}

static int int_option(int fd, int level, int option) {
    int v = -1;
    socklen_t len = sizeof v;
    return getsockopt(fd, level, option, &v, &len) == 0 ? v : -1;
}

static void expect_keepalive(int fd, const char *which) {
    EXPECT(int_option(fd, SOL_SOCKET, SO_KEEPALIVE) == 1, "%s: SO_KEEPALIVE is %d, expected 1", which,
           int_option(fd, SOL_SOCKET, SO_KEEPALIVE));
#ifdef TCP_KEEPIDLE
    EXPECT(int_option(fd, IPPROTO_TCP, TCP_KEEPIDLE) == NET_KEEPALIVE_IDLE_S, "%s: TCP_KEEPIDLE is %d s, expected %d",
           which, int_option(fd, IPPROTO_TCP, TCP_KEEPIDLE), NET_KEEPALIVE_IDLE_S);
#endif
#ifdef TCP_KEEPINTVL
    EXPECT(int_option(fd, IPPROTO_TCP, TCP_KEEPINTVL) == NET_KEEPALIVE_INTERVAL_S,
           "%s: TCP_KEEPINTVL is %d s, expected %d", which, int_option(fd, IPPROTO_TCP, TCP_KEEPINTVL),
           NET_KEEPALIVE_INTERVAL_S);
#endif
#ifdef TCP_KEEPCNT
    EXPECT(int_option(fd, IPPROTO_TCP, TCP_KEEPCNT) == NET_KEEPALIVE_PROBES, "%s: TCP_KEEPCNT is %d, expected %d",
           which, int_option(fd, IPPROTO_TCP, TCP_KEEPCNT), NET_KEEPALIVE_PROBES);
#endif
}

// Accepts the connection pending on lfd (waiting up to 5 s for it), or -1.
static int accept_pending(int lfd) {
    char peer[64];
    if (net_wait(lfd, POLLIN, wall_seconds() + 5) != 1) return -1;
    return net_accept(lfd, peer, sizeof peer);
}

// Every socket the replicas and the hub talk over has TCP keepalive on (net/socket.h): a data
// connection is idle for a whole inner phase, and a firewall or NAT on the path forgets a flow
// idle longer than its timeout, then drops its packets without a word — every exchange after
// a long inner phase stalled and the replica was evicted (docs/protocol.md, "Firewalls"). The
// sockets of net_connect and net_accept, the latter from net_listen's listener (the hub's) and
// from a plain one: on Linux an accepted socket inherits its listener's options, and the plain
// listener catches a net_accept that would rely on that.
static void test_keepalive(void) {
    char err[256] = "", address[64];
    int lfd = net_listen("127.0.0.1:0", err, sizeof err);
    EXPECT(lfd >= 0, "net_listen: %s", err);
    if (lfd < 0) return;
    expect_keepalive(lfd, "net_listen");
    snprintf(address, sizeof address, "127.0.0.1:%d", net_local_port(lfd));
    int cfd = net_connect(address, wall_seconds() + 5, err, sizeof err);
    EXPECT(cfd >= 0, "net_connect %s: %s", address, err);
    int afd = accept_pending(lfd);
    EXPECT(afd >= 0, "net_accept on net_listen's socket: %s", strerror(errno));
    if (cfd >= 0) expect_keepalive(cfd, "net_connect");
    if (afd >= 0) expect_keepalive(afd, "net_accept (net_listen's listener)");
    close(cfd);
    close(afd);
    close(lfd);

    int plain = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT(plain >= 0 && bind(plain, (struct sockaddr *)&a, sizeof a) == 0 && listen(plain, 4) == 0,
           "a plain listener: %s", strerror(errno));
    snprintf(address, sizeof address, "127.0.0.1:%d", net_local_port(plain));
    cfd = net_connect(address, wall_seconds() + 5, err, sizeof err);
    EXPECT(cfd >= 0, "net_connect %s: %s", address, err);
    afd = accept_pending(plain);
    EXPECT(afd >= 0, "net_accept on a plain listener: %s", strerror(errno));
    if (afd >= 0) expect_keepalive(afd, "net_accept (a plain listener)");
    close(cfd);
    close(afd);
    close(plain);
}

static int write_corpus(const char *dir) {
    if (!make_dirs(dir)) fail("--corpus: cannot create '%s': %s", dir, strerror(errno));
    static sample s[SAMPLES];
    int n = samples(s);
    static const uint8_t zero[WIRE_KEY_BYTES] = {0};
    for (int i = 0; i < n; i++) {
        size_t bytes = wire_build(frame, s[i].type, 0, s[i].payload, s[i].bytes, zero);
        char path[4096];
        snprintf(path, sizeof path, "%s/%02d_%s", dir, i, wire_type_name(s[i].type));
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(frame, 1, bytes, f) != bytes || fclose(f) != 0) fail("--corpus: cannot write '%s'", path);
    }
    printf("wrote %d seed frames to %s\n", n, dir);
    return 0;
}

// `train_gpt plan` counts the tcp transport's bytes per outer step with its own copies of the
// framing sizes (llmc/plan.h): they must be the wire's.
static void test_plan_framing_is_the_wire_s(void) {
    EXPECT(PLAN_SEGMENT_FRAMING_BYTES == WIRE_DATA_HEAD_BYTES + WIRE_OVERHEAD_BYTES,
          "plan's framing per segment %d = DATA head + frame overhead %d", PLAN_SEGMENT_FRAMING_BYTES,
          WIRE_DATA_HEAD_BYTES + WIRE_OVERHEAD_BYTES);
    EXPECT(PLAN_CONTRIBUTE_FRAME_BYTES == WIRE_CONTRIBUTE_BYTES + WIRE_OVERHEAD_BYTES,
          "plan's CONTRIBUTE frame %d = its body + frame overhead %d", PLAN_CONTRIBUTE_FRAME_BYTES,
          WIRE_CONTRIBUTE_BYTES + WIRE_OVERHEAD_BYTES);
}

// conn_drop_unsent (an eviction: the hub's drop_queue, a replica's EVICTED) frees frames that
// were sealed with sequence numbers: the next frame must take the first dropped number, or the
// peer rejects it ("replayed or reordered") and the session, which stays open, is torn down.
// Once with the first frame half-written (it must finish), once with nothing written yet.
static void test_drop_unsent_keeps_sequence(void) {
    for (int partial = 0; partial < 2; partial++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
            EXPECT(0, "socketpair: %s", strerror(errno));
            return;
        }
        int small = 4096;
        setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        fcntl(sv[0], F_SETFL, O_NONBLOCK);
        fcntl(sv[1], F_SETFL, O_NONBLOCK);
        conn tx, rx;
        conn_init(&tx, sv[0], "tx");
        conn_init(&rx, sv[1], "rx");
        memcpy(tx.key_tx, KEY, WIRE_KEY_BYTES);
        memcpy(rx.key_rx, KEY, WIRE_KEY_BYTES);
        rx.allowed_rx = CONN_ALLOW(WIRE_DATA);
        static uint8_t chunk[65536];
        uint8_t head[WIRE_DATA_HEAD_BYTES] = {0};
        char err[256] = "";
        for (int i = 0; i < 3; i++) conn_send(&tx, WIRE_DATA, head, sizeof head, chunk, sizeof chunk, NULL);
        if (partial) EXPECT(conn_flush(&tx, err, sizeof err) == 0, "the first frame is half-written (%s)", err);
        conn_drop_unsent(&tx);
        EXPECT(tx.out_frames == (size_t)partial, "%zu frame(s) left queued, expected %d", tx.out_frames, partial);
        conn_send(&tx, WIRE_DATA, head, sizeof head, chunk, 100, NULL);
        int frames = 0;
        uint64_t last_seq = 0;
        size_t last_len = 0;
        conn_result r = CONN_AGAIN;
        for (int spin = 0; spin < 1000000 && frames < partial + 1; spin++) {
            if (conn_flush(&tx, err, sizeof err) < 0) break;
            wire_frame f;
            r = conn_read(&rx, &f, err, sizeof err);
            if (r == CONN_ERROR || r == CONN_CLOSED) break;
            if (r == CONN_FRAME) {
                frames++;
                last_seq = f.seq;
                last_len = (size_t)f.payload_bytes;
            }
        }
        EXPECT(frames == partial + 1, "%s: %d of %d frames arrived after the drop (receiver: %s)",
               partial ? "half-written" : "nothing written", frames, partial + 1, r == CONN_ERROR ? err : "no error");
        EXPECT(last_seq == (uint64_t)partial && last_len == sizeof head + 100,
               "the frame after the drop has sequence number %llu (%zu bytes), expected %d", (unsigned long long)last_seq,
               last_len, partial);
        conn_close(&tx);
        conn_close(&rx);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--corpus") == 0) return write_corpus(argv[2]);
    test_round_trips();
    test_every_byte_flip_is_caught();
    test_truncation_and_lengths();
    test_decoders_refuse_nonsense();
    test_proofs_and_keys();
    test_addresses();
    test_keepalive();
    test_plan_framing_is_the_wire_s();
    test_drop_unsent_keeps_sequence();
    return check_summary("test_wire");
}
