// llmc/checksum.h — XXH64, the checksum of every file train_gpt writes (token shards,
// checkpoints). Implemented from the published XXH64 specification so that a user can
// check any of our files with the stock `xxhsum -H64` tool; streaming, so multi-GB
// tensors never need to be in memory twice. Not a cryptographic hash: it detects
// corruption (bit rot, truncation, a half-written file), not tampering.
#ifndef TRAIN_GPT_CHECKSUM_H
#define TRAIN_GPT_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t total_bytes;
    uint64_t acc[4];
    uint8_t buffer[32];
    uint32_t buffered;
    uint64_t seed;
} xxh64_state;

void xxh64_init(xxh64_state *s, uint64_t seed);
void xxh64_update(xxh64_state *s, const void *data, size_t bytes);
uint64_t xxh64_digest(const xxh64_state *s);
uint64_t xxh64(const void *data, size_t bytes, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif
