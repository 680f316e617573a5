// llmc/bytes.h — little-endian fields in byte buffers: every on-disk and on-wire format of
// train_gpt (token shards, the DiLoCo wire protocol, the donor state) is little-endian,
// byte for byte, whatever the host.
#ifndef TRAIN_GPT_BYTES_H
#define TRAIN_GPT_BYTES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#ifdef __cplusplus
}
#endif

#endif
