// llmc/rng.h — the one random number generator of train_gpt: splitmix64 to seed, xoshiro256**
// to draw, Box-Muller for normals. Small, fast, and the same bits on every machine, so
// an init from a seed is reproducible anywhere.
#ifndef TRAIN_GPT_RNG_H
#define TRAIN_GPT_RNG_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t s[4];
} rng_state;

static inline uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Independent streams for (seed, stream) pairs.
static inline void rng_seed(rng_state *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1342543DE82EF95ULL);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rng_next(rng_state *r) {
    uint64_t *s = r->s;
    uint64_t result = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

// Uniform in (0, 1): never 0, so log() in Box-Muller is safe.
static inline double rng_uniform(rng_state *r) {
    return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double rng_normal(rng_state *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

#ifdef __cplusplus
}
#endif

#endif
