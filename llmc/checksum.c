// llmc/checksum.c — XXH64 (see llmc/checksum.h), written from the algorithm's specification.
#include "llmc/checksum.h"

#include <string.h>

static const uint64_t P1 = 0x9E3779B185EBCA87ULL;
static const uint64_t P2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t P3 = 0x165667B19E3779F9ULL;
static const uint64_t P4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t P5 = 0x27D4EB2F165667C5ULL;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The format is little-endian; memcpy keeps the loads legal on any alignment.
static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t load32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t mix_lane(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t merge_lane(uint64_t h, uint64_t lane) {
    h ^= mix_lane(0, lane);
    return h * P1 + P4;
}

void xxh64_init(xxh64_state *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->acc[0] = seed + P1 + P2;
    s->acc[1] = seed + P2;
    s->acc[2] = seed;
    s->acc[3] = seed - P1;
}

static inline void consume_stripe(uint64_t acc[4], const uint8_t *p) {
    acc[0] = mix_lane(acc[0], load64(p));
    acc[1] = mix_lane(acc[1], load64(p + 8));
    acc[2] = mix_lane(acc[2], load64(p + 16));
    acc[3] = mix_lane(acc[3], load64(p + 24));
}

void xxh64_update(xxh64_state *s, const void *data, size_t bytes) {
    const uint8_t *p = data;
    s->total_bytes += bytes;
    if (s->buffered + bytes < 32) {
        memcpy(s->buffer + s->buffered, p, bytes);
        s->buffered += (uint32_t)bytes;
        return;
    }
    if (s->buffered > 0) {
        size_t fill = 32 - s->buffered;
        memcpy(s->buffer + s->buffered, p, fill);
        consume_stripe(s->acc, s->buffer);
        p += fill;
        bytes -= fill;
        s->buffered = 0;
    }
    uint64_t acc[4] = {s->acc[0], s->acc[1], s->acc[2], s->acc[3]};
    while (bytes >= 32) {
        consume_stripe(acc, p);
        p += 32;
        bytes -= 32;
    }
    memcpy(s->acc, acc, sizeof acc);
    memcpy(s->buffer, p, bytes);
    s->buffered = (uint32_t)bytes;
}

uint64_t xxh64_digest(const xxh64_state *s) {
    uint64_t h;
    if (s->total_bytes >= 32) {
        const uint64_t *a = s->acc;
        h = rotl64(a[0], 1) + rotl64(a[1], 7) + rotl64(a[2], 12) + rotl64(a[3], 18);
        for (int i = 0; i < 4; i++) h = merge_lane(h, a[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total_bytes;
    const uint8_t *p = s->buffer;
    uint32_t left = s->buffered;
    while (left >= 8) {
        h ^= mix_lane(0, load64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
        left -= 8;
    }
    if (left >= 4) {
        h ^= (uint64_t)load32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
        left -= 4;
    }
    while (left > 0) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
        left--;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t xxh64(const void *data, size_t bytes, uint64_t seed) {
    xxh64_state s;
    xxh64_init(&s, seed);
    xxh64_update(&s, data, bytes);
    return xxh64_digest(&s);
}
