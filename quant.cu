// quant.cu — blockwise int8 / int4 quantization of DiLoCo outer gradients: the C reference
// (the host section, compiled as C-style C++ by nvcc or, without nvcc, by the host C++
// compiler) and the CUDA encoder and decoder (the GPU section, compiled by nvcc, or by
// hipcc through cuda/portable.cuh), which write the same bytes (test/test_quant_gpu.cu
// checks it). See llmc/quant.h for the byte
// layout and the API, docs/quant.md for the error bounds.
//
// ================================================================ the C reference
//
// Design. Encoding is two passes over the input, both parallel and both independent of the
// thread count:
//   1. one scale per block: max|y| / qmax, y = x (+ residual), written to the head of out;
//   2. the codes, in fixed chunks of QUANT_CHUNK elements (not per block, so that a block of
//      a million values is still spread over threads and a block of 32 does not cost one
//      parallel iteration each). A chunk starts at an even element, so an int4 byte never
//      straddles two chunks and no two threads write the same byte. Within a chunk the
//      elements are walked block segment by block segment, one scale at a time.
// Error feedback rides on pass 2: the chunk that just wrote its codes decodes them, updates
// the residual and sums its squared errors into its own slot; the slots are added in chunk
// order afterwards, so the returned error, like the bytes, is the same on 1 or 64 threads.
//
// Exactness. The CUDA encoder (the GPU section below) must write the same bytes, so every value goes
// through the same IEEE fp32 operations: scale = m / qmax (a true division), v = y / scale
// (a true division: multiplying by 1/scale differs in the last bit for some y and then
// in the rounded code), clamp to ±qmax, round half away from zero. Rounding is done by hand
// (round_half_away) rather than with roundf because gcc turns roundf into a library call
// per element; the hand version is exact for |v| <= 127, which the clamp guarantees, and
// test_quant checks it against roundf. Clamping before rounding gives the same code as
// rounding before clamping because rounding is monotone and ±qmax are integers. The build
// compiles this host code with -ffp-contract=off (g++ would otherwise contract a*b+c into
// an FMA, even in ISO mode); the separate statements below keep clang's default (contract
// within a statement) harmless too.
//
// Non-finite input. A block whose y holds a NaN or an Inf gets the scale NaN (bits
// 0x7FC00000) and codes 0, so it decodes to NaN everywhere and cannot pass for a good
// update; with feedback its residual becomes NaN as well. diloco.c checks the outer gradient
// for finiteness before encoding, so this is a last line of defence, not a feature.
#include "llmc/quant.h"

#include "llmc/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Elements per pass-2 work item. Even (see above); small enough that a chunk's int4 codes
// fit on the stack, large enough that the per-chunk bookkeeping is noise.
#define QUANT_CHUNK 8192

// The one NaN both sections write for a non-finite block (a quiet NaN).
#define QUANT_NAN_BITS 0x7FC00000u

// Helpers the GPU section's kernels share with the reference.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

int quant_kind_from_name(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "none") == 0) return QUANT_NONE;
    if (strcmp(name, "int8") == 0) return QUANT_INT8;
    if (strcmp(name, "int4") == 0) return QUANT_INT4;
    if (strcmp(name, "bf16") == 0) return QUANT_BF16;
    return -1;
}

const char *quant_kind_name(quant_kind k) {
    switch (k) {
    case QUANT_NONE: return "none";
    case QUANT_INT8: return "int8";
    case QUANT_INT4: return "int4";
    case QUANT_BF16: return "bf16";
    }
    return "unknown";
}

static float quant_max_code(quant_kind k) { return k == QUANT_INT8 ? 127.0f : 7.0f; }

static HOST_DEVICE int64_t quant_blocks(int64_t n, int64_t block) { return n / block + (n % block != 0); }

static void check_arguments(quant_kind k, int64_t n, int64_t block) {
    CHECK(k == QUANT_NONE || k == QUANT_INT8 || k == QUANT_INT4 || k == QUANT_BF16);
    CHECK(n >= 0);
    CHECK(block >= 1);
}

size_t quant_encoded_bytes(quant_kind k, int64_t n, int64_t block) {
    check_arguments(k, n, block);
    if (k == QUANT_NONE) return (size_t)n * sizeof(float);
    if (k == QUANT_BF16) return (size_t)n * sizeof(uint16_t);
    size_t scale_bytes = (size_t)quant_blocks(n, block) * sizeof(float);
    return scale_bytes + (k == QUANT_INT8 ? (size_t)n : (size_t)(n / 2 + n % 2));
}

// Scales sit at the head of the buffer, which need not be 4-byte aligned: memcpy.
static float scale_load(const uint8_t *buf, int64_t b) {
    float s;
    memcpy(&s, buf + (size_t)b * sizeof(float), sizeof s);
    return s;
}

static void scale_store(uint8_t *buf, int64_t b, float s) { memcpy(buf + (size_t)b * sizeof(float), &s, sizeof s); }

static float scale_of_bad_block(void) {
    uint32_t bits = QUANT_NAN_BITS;
    float s;
    memcpy(&s, &bits, sizeof s);
    return s;
}

// ---------------------------------------------------------------- pass 1: scales

// max|y| / qmax over one block, y = x + r (r may be NULL); NaN if any y is not finite.
// The max is taken on the bits of |y|: for floats with the sign bit clear, the order of the
// bit patterns as integers is the order of the values, Inf and NaN above every finite value.
// That makes it an integer max, which gcc vectorizes (a float max it would not, without
// -ffast-math), and it is exact, so any order of comparison (here, or a warp reduction on
// the GPU) gives the same m.
static float block_scale(const float *x, const float *r, int64_t len, float qmax) {
    uint32_t max_bits = 0;
    for (int64_t i = 0; i < len; i++) {
        float y = r ? x[i] + r[i] : x[i];
        uint32_t bits;
        memcpy(&bits, &y, sizeof bits);
        bits &= 0x7FFFFFFFu;
        max_bits = bits > max_bits ? bits : max_bits;
    }
    if (max_bits > 0x7F7FFFFFu) return scale_of_bad_block(); // above FLT_MAX: Inf or NaN
    float m;
    memcpy(&m, &max_bits, sizeof m);
    return m / qmax;
}

static void write_scales(const float *x, const float *r, int64_t n, int64_t block, float qmax, uint8_t *out) {
    int64_t n_blocks = quant_blocks(n, block);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t start = b * block, len = min_i64(block, n - start);
        scale_store(out, b, block_scale(x + start, r ? r + start : NULL, len, qmax));
    }
}

// ---------------------------------------------------------------- pass 2: codes

// roundf (nearest, ties away from zero) for |v| <= qmax: the truncation of |v| is exact,
// so is |v| - trunc, and the tie test on it is exact; no library call, so it vectorizes.
static inline int round_half_away(float v) {
    float a = fabsf(v);
    int t = (int)a;
    int q = t + (a - (float)t >= 0.5f);
    return v < 0.0f ? -q : q;
}

// Codes of one block segment whose scale is `scale`. A zero scale (a block of zeros, or
// one so tiny that max/qmax underflows to 0) and a NaN scale give codes 0.
static void code_segment(const float *x, const float *r, int64_t len, float scale, float qmax, int8_t *codes) {
    if (!(scale > 0.0f)) {
        memset(codes, 0, (size_t)len);
        return;
    }
    for (int64_t i = 0; i < len; i++) {
        float y = r ? x[i] + r[i] : x[i];
        float v = y / scale;
        v = v > qmax ? qmax : v;
        v = v < -qmax ? -qmax : v;
        codes[i] = (int8_t)round_half_away(v);
    }
}

// One chunk's sums for quant_encode_feedback's return value: Σ (sent - x)² and Σ x².
typedef struct {
    double err2, x2;
} chunk_error;

// The sums run in LANES fixed lanes, added in a fixed order at the end: the same result on
// every run and thread count, and unlike one running sum gcc can vectorize them (16, not 8:
// with 8 it finds no vector type for the 8 int8 codes).
#define LANES 16

// r = y - value over one segment, y = x + r: what this round did not send.
static void residual_segment(const float *x, float *r, int64_t len, float scale, const int8_t *codes) {
    for (int64_t i = 0; i < len; i++) {
        float value = (float)codes[i] * scale;
        float y = x[i] + r[i];
        r[i] = y - value;
    }
}

// Error feedback over one segment of one block: the residual update (r not NULL), then the
// sums (e not NULL).
static void feedback_segment(const float *x, float *r, int64_t len, float scale, const int8_t *codes,
                             chunk_error *e) {
    if (r) residual_segment(x, r, len, scale, codes);
    if (!e) return;
    double err2[LANES] = {0}, x2[LANES] = {0};
    for (int64_t i0 = 0; i0 < len; i0 += LANES) {
        int64_t lanes = min_i64(LANES, len - i0);
        if (lanes == LANES) {
#pragma omp simd
            for (int l = 0; l < LANES; l++) {
                double xd = x[i0 + l], d = (double)((float)codes[i0 + l] * scale) - xd;
                err2[l] += d * d;
                x2[l] += xd * xd;
            }
        } else {
            for (int l = 0; l < lanes; l++) {
                double xd = x[i0 + l], d = (double)((float)codes[i0 + l] * scale) - xd;
                err2[l] += d * d;
                x2[l] += xd * xd;
            }
        }
    }
    for (int l = 0; l < LANES; l++) {
        e->err2 += err2[l];
        e->x2 += x2[l];
    }
}

// Pass 2 over the elements [c0, c1) of one chunk; c0 is even.
static void encode_chunk(quant_kind k, const float *x, float *r, int64_t n, int64_t block, int64_t c0, int64_t c1,
                         uint8_t *out, chunk_error *e) {
    float qmax = quant_max_code(k);
    uint8_t *code_bytes = out + (size_t)quant_blocks(n, block) * sizeof(float);
    int8_t buffer[QUANT_CHUNK];
    int8_t *codes = k == QUANT_INT8 ? (int8_t *)code_bytes + c0 : buffer;
    for (int64_t i = c0; i < c1;) {
        int64_t b = i / block, end = min_i64((b + 1) * block, c1);
        code_segment(x + i, r ? r + i : NULL, end - i, scale_load(out, b), qmax, codes + (i - c0));
        i = end;
    }
    if (k == QUANT_INT4) {
        uint8_t *bytes = code_bytes + c0 / 2;
        int64_t len = c1 - c0;
        for (int64_t j = 0; j < len / 2; j++)
            bytes[j] = (uint8_t)((codes[2 * j] & 0x0F) | ((codes[2 * j + 1] & 0x0F) << 4));
        if (len % 2) bytes[len / 2] = (uint8_t)(codes[len - 1] & 0x0F); // last element of an odd n
    }
    if (!e && !r) return;
    for (int64_t i = c0; i < c1;) {
        int64_t b = i / block, end = min_i64((b + 1) * block, c1);
        feedback_segment(x + i, r ? r + i : NULL, end - i, scale_load(out, b), codes + (i - c0), e);
        i = end;
    }
}

// QUANT_NONE: the values y = x + r themselves; the residual becomes y - y = 0. A NaN that
// the sum makes is written as the one quiet NaN (x86 keeps an operand's payload, a GPU
// makes its own), so that C and CUDA write the same bytes.
static void encode_chunk_none(const float *x, float *r, int64_t c0, int64_t c1, uint8_t *out, chunk_error *e) {
    for (int64_t i = c0; i < c1; i++) {
        float y = r ? x[i] + r[i] : x[i];
        if (r && isnan(y)) y = scale_of_bad_block();
        memcpy(out + (size_t)i * sizeof(float), &y, sizeof y);
        if (r) r[i] = y - y;
        if (e) {
            double d = (double)y - (double)x[i];
            e->err2 += d * d;
            e->x2 += (double)x[i] * (double)x[i];
        }
    }
}

// fp32 -> bf16, rounding to nearest, ties to even; every NaN becomes the one quiet NaN 0x7FC0.
static inline uint16_t bf16_from_float(float y) {
    uint32_t bits;
    memcpy(&bits, &y, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(QUANT_NAN_BITS >> 16);
    bits += 0x7FFFu + ((bits >> 16) & 1u);   // may carry into the exponent: rounds up to the next binade or Inf
    return (uint16_t)(bits >> 16);
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

// QUANT_BF16: y = x + r rounded to bf16; the residual keeps what the rounding dropped.
static void encode_chunk_bf16(const float *x, float *r, int64_t c0, int64_t c1, uint8_t *out, chunk_error *e) {
    for (int64_t i = c0; i < c1; i++) {
        float y = r ? x[i] + r[i] : x[i];
        uint16_t h = bf16_from_float(y);
        memcpy(out + (size_t)i * sizeof h, &h, sizeof h);
        float sent = bf16_to_float(h);
        if (r) r[i] = y - sent;
        if (e) {
            double d = (double)sent - (double)x[i];
            e->err2 += d * d;
            e->x2 += (double)x[i] * (double)x[i];
        }
    }
}

// The whole encode; r and errors may be NULL. errors[c] receives chunk c's sums.
static void encode(quant_kind k, const float *x, float *r, int64_t n, int64_t block, uint8_t *out,
                   chunk_error *errors) {
    check_arguments(k, n, block);
    if (k == QUANT_INT8 || k == QUANT_INT4) write_scales(x, r, n, block, quant_max_code(k), out);
    int64_t n_chunks = quant_blocks(n, QUANT_CHUNK);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t c0 = c * QUANT_CHUNK, c1 = min_i64(c0 + QUANT_CHUNK, n);
        chunk_error *e = errors ? &errors[c] : NULL;
        if (k == QUANT_NONE)
            encode_chunk_none(x, r, c0, c1, out, e);
        else if (k == QUANT_BF16)
            encode_chunk_bf16(x, r, c0, c1, out, e);
        else
            encode_chunk(k, x, r, n, block, c0, c1, out, e);
    }
}

void quant_encode(quant_kind k, const float *x, int64_t n, int64_t block, uint8_t *out) {
    encode(k, x, NULL, n, block, out, NULL);
}

double quant_encode_feedback(quant_kind k, const float *x, float *residual, int64_t n, int64_t block,
                             uint8_t *out) {
    int64_t n_chunks = quant_blocks(n, QUANT_CHUNK);
    chunk_error *errors = (chunk_error *)xcalloc((size_t)max_i64(n_chunks, 1), sizeof *errors);
    encode(k, x, residual, n, block, out, errors);
    double err2 = 0, x2 = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        err2 += errors[c].err2;
        x2 += errors[c].x2;
    }
    free(errors);
    return x2 == 0.0 ? 0.0 : sqrt(err2) / sqrt(x2); // NaN in, NaN out
}

// ---------------------------------------------------------------- decode

// 4-bit two's complement: 0..7 stay, 8..15 become -8..-1.
static inline float int4_value(int nibble, float scale) { return (float)((nibble ^ 8) - 8) * scale; }

// Elements [i, end) of int4 codes into v[0 .. end - i): a lone odd element first, then whole
// bytes (low nibble, high nibble), then a lone even element; the byte loop vectorizes.
static void decode_int4_segment(const uint8_t *code_bytes, int64_t i, int64_t end, float scale, float *v) {
    int64_t j = i;
    if (j < end && j % 2) {
        *v++ = int4_value(code_bytes[j / 2] >> 4, scale);
        j++;
    }
    const uint8_t *bytes = code_bytes + j / 2;
    int64_t pairs = (end - j) / 2;
    for (int64_t p = 0; p < pairs; p++) {
        v[2 * p] = int4_value(bytes[p] & 0x0F, scale);
        v[2 * p + 1] = int4_value(bytes[p] >> 4, scale);
    }
    if ((end - j) % 2) v[2 * pairs] = int4_value(bytes[pairs] & 0x0F, scale);
}

// Values of the elements [c0, c1) into values[0 .. c1 - c0): code * scale, one fp32
// multiply, so that every decoder of the same bytes gets the same bits.
static void decode_chunk(quant_kind k, const uint8_t *in, int64_t n, int64_t block, int64_t c0, int64_t c1,
                         float *values) {
    if (k == QUANT_NONE) {
        memcpy(values, in + (size_t)c0 * sizeof(float), (size_t)(c1 - c0) * sizeof(float));
        return;
    }
    if (k == QUANT_BF16) {
        for (int64_t i = c0; i < c1; i++) {
            uint16_t h;
            memcpy(&h, in + (size_t)i * sizeof h, sizeof h);
            values[i - c0] = bf16_to_float(h);
        }
        return;
    }
    const uint8_t *code_bytes = in + (size_t)quant_blocks(n, block) * sizeof(float);
    for (int64_t i = c0; i < c1;) {
        int64_t b = i / block, end = min_i64((b + 1) * block, c1);
        float scale = scale_load(in, b);
        float *v = values + (i - c0);
        if (k == QUANT_INT8) {
            const int8_t *codes = (const int8_t *)code_bytes;
            for (int64_t j = i; j < end; j++) v[j - i] = (float)codes[j] * scale;
        } else {
            decode_int4_segment(code_bytes, i, end, scale, v);
        }
        i = end;
    }
}

void quant_decode(quant_kind k, const uint8_t *in, int64_t n, int64_t block, float *x) {
    check_arguments(k, n, block);
    int64_t n_chunks = quant_blocks(n, QUANT_CHUNK);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t c0 = c * QUANT_CHUNK, c1 = min_i64(c0 + QUANT_CHUNK, n);
        decode_chunk(k, in, n, block, c0, c1, x + c0);
    }
}

// ---------------------------------------------------------------- segments and the hub's mean
//
// A DiLoCo payload travels as segments of quant_segment_values(block) values, each encoded on
// its own (its scales, then its codes), one after the other; the hub reduces segment by
// segment as they arrive. Segments are whole blocks and an even number of values, so a
// segment's blocks, scales and codes are exactly those of the whole encoding, only laid out
// per segment.

int64_t quant_segment_values(int64_t block) {
    CHECK(block >= 1);
    int64_t blocks = 2 * (((int64_t)1 << 17) / block);
    return block * (blocks < 2 ? 2 : blocks);
}

size_t quant_segmented_bytes(quant_kind k, int64_t n, int64_t block, int64_t segment) {
    CHECK(segment >= 1);
    int64_t full = n / segment, rest = n % segment;
    return (size_t)full * quant_encoded_bytes(k, segment, block) + (rest ? quant_encoded_bytes(k, rest, block) : 0);
}

double quant_encode_segments(quant_kind k, const float *x, float *residual, int64_t n, int64_t block,
                             int64_t segment, uint8_t *out) {
    check_arguments(k, n, block);
    int64_t n_chunks_all = 0;
    for (int64_t s0 = 0; s0 < n; s0 += segment) n_chunks_all += quant_blocks(min_i64(segment, n - s0), QUANT_CHUNK);
    chunk_error *errors = (chunk_error *)xcalloc((size_t)max_i64(n_chunks_all, 1), sizeof *errors);
    chunk_error *e = errors;
    for (int64_t s0 = 0; s0 < n; s0 += segment) {
        int64_t len = min_i64(segment, n - s0);
        encode(k, x + s0, residual ? residual + s0 : NULL, len, block, out, e);
        out += quant_encoded_bytes(k, len, block);
        e += quant_blocks(len, QUANT_CHUNK);
    }
    double err2 = 0, x2 = 0;
    for (int64_t c = 0; c < n_chunks_all; c++) {
        err2 += errors[c].err2;
        x2 += errors[c].x2;
    }
    free(errors);
    return x2 == 0.0 ? 0.0 : sqrt(err2) / sqrt(x2);
}

void quant_decode_segments(quant_kind k, const uint8_t *in, int64_t n, int64_t block, int64_t segment, float *x) {
    for (int64_t s0 = 0; s0 < n; s0 += segment) {
        int64_t len = min_i64(segment, n - s0);
        quant_decode(k, in, len, block, x + s0);
        in += quant_encoded_bytes(k, len, block);
    }
}

bool quant_is_finite(quant_kind k, const uint8_t *in, int64_t n, int64_t block) {
    check_arguments(k, n, block);
    if (k == QUANT_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, in + (size_t)i * sizeof h, sizeof h);
            if ((h & 0x7F80u) == 0x7F80u) return false;
        }
        return true;
    }
    // int8 / int4: a block with a NaN or Inf input has a NaN scale (the codes are bounded).
    int64_t floats = k == QUANT_NONE ? n : quant_blocks(n, block);
    for (int64_t i = 0; i < floats; i++)
        if (!isfinite(scale_load(in, i))) return false;
    return true;
}

void quant_mean(quant_kind k, const uint8_t *const *in, int count, int64_t n, int64_t block, const float *factors,
                float *mean) {
    check_arguments(k, n, block);
    CHECK(count >= 1);
    int64_t n_chunks = quant_blocks(n, QUANT_CHUNK);
    float divisor = (float)count;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t c0 = c * QUANT_CHUNK, c1 = min_i64(c0 + QUANT_CHUNK, n);
        float values[QUANT_CHUNK];
        float *sum = mean + c0;
        for (int j = 0; j < count; j++) {
            float *v = j == 0 ? sum : values;
            decode_chunk(k, in[j], n, block, c0, c1, v);
            if (factors && factors[j] != 1.0f)
                for (int64_t i = 0; i < c1 - c0; i++) v[i] = v[i] * factors[j];
            if (j > 0)
                for (int64_t i = 0; i < c1 - c0; i++) sum[i] = sum[i] + values[i];
        }
        if (count > 1)
            for (int64_t i = 0; i < c1 - c0; i++) sum[i] = sum[i] / divisor;
    }
}

double quant_norm(quant_kind k, const uint8_t *in, int64_t n, int64_t block) {
    check_arguments(k, n, block);
    double sum = 0.0;
    float values[QUANT_CHUNK];
    for (int64_t c0 = 0; c0 < n; c0 += QUANT_CHUNK) {
        int64_t c1 = min_i64(c0 + QUANT_CHUNK, n);
        decode_chunk(k, in, n, block, c0, c1, values);
        for (int64_t i = 0; i < c1 - c0; i++) sum += (double)values[i] * (double)values[i];
    }
    return sqrt(sum);
}

// The bound on the finite contributions in[0..kept): factors[j] = bound · median / norm_j (as
// fp32) for a contribution whose norm exceeds bound times the lower median of the norms, 1
// for the others (and for all when the median is 0: nothing to measure against).
static void bound_factors(quant_kind k, const uint8_t *const *in, int kept, int64_t n, int64_t block, float bound,
                          float *factors) {
    double *norms = (double *)xmalloc((size_t)kept * sizeof *norms), *sorted = (double *)xmalloc((size_t)kept * sizeof *sorted);
    for (int j = 0; j < kept; j++) sorted[j] = norms[j] = quant_norm(k, in[j], n, block);
    for (int j = 1; j < kept; j++)   // insertion sort: a few hundred at most
        for (int i = j; i > 0 && sorted[i - 1] > sorted[i]; i--) {
            double t = sorted[i];
            sorted[i] = sorted[i - 1];
            sorted[i - 1] = t;
        }
    double limit = (double)bound * sorted[(kept - 1) / 2];
    for (int j = 0; j < kept; j++) factors[j] = limit > 0.0 && norms[j] > limit ? (float)(limit / norms[j]) : 1.0f;
    free(norms);
    free(sorted);
}

int quant_reduce_segment(const quant_reduction *q, const uint8_t *const *in, int count, int64_t n, float *residual,
                         float *scratch, uint8_t *out, quant_effect *effect) {
    const uint8_t **finite = (const uint8_t **)xmalloc((size_t)(count > 0 ? count : 1) * sizeof *finite);
    float *factors = (float *)xmalloc((size_t)(count > 0 ? count : 1) * sizeof *factors);
    int *index = (int *)xmalloc((size_t)(count > 0 ? count : 1) * sizeof *index);
    int kept = 0, touched = 0;
    for (int j = 0; j < count; j++) {
        bool ok = quant_is_finite(q->up, in[j], n, q->block);
        if (effect) effect[j] = (quant_effect){.left_out = !ok, .factor = 1.0f};
        touched += !ok;
        if (ok) {
            index[kept] = j;
            finite[kept++] = in[j];
        }
    }
    if (kept == 0) {
        // Nothing finite to average: a segment of NaN, so that every replica skips the step.
        float nan = scale_of_bad_block();
        for (int64_t i = 0; i < n; i++) scratch[i] = nan;
        encode(q->down, scratch, NULL, n, q->block, out, NULL);
    } else {
        bool bounded = q->bound > 0.0f && q->up != QUANT_NONE;
        if (bounded) {
            bound_factors(q->up, finite, kept, n, q->block, q->bound, factors);
            for (int j = 0; j < kept; j++) {
                touched += factors[j] != 1.0f;
                if (effect) effect[index[j]].factor = factors[j];
            }
        }
        quant_mean(q->up, finite, kept, n, q->block, bounded ? factors : NULL, scratch);
        encode(q->down, scratch, residual, n, q->block, out, NULL);
    }
    free(finite);
    free(factors);
    free(index);
    return touched;
}

// ================================================================ the GPU section
#if defined(__CUDACC__) || defined(__HIPCC__)  // nvcc, or hipcc through cuda/portable.cuh
// Two kernels encode, as the C reference's two passes do:
//   quant_scales_kernel  one warp (WARP_SIZE lanes) per block: max of |y| (y = x + residual)
//                        as an integer max on the bits (exact, so the reduction order and
//                        the warp size do not matter), then
//                        scale = max / qmax, or NaN for a block holding NaN or Inf;
//   quant_codes_kernel   one thread per code byte (an int8 element, or an int4 pair, so no
//                        two threads write one byte): code = round(clamp(y / scale)), and
//                        with feedback residual = y - code·scale.
// Exactness: every fp32 operation is an explicit round-to-nearest intrinsic (__fadd_rn,
// __fdiv_rn, __fmul_rn, __fsub_rn), which nvcc never contracts into an FMA nor replaces
// by an approximation (-prec-div=false does not touch __fdiv_rn); roundf is exact. The C reference
// clamps before rounding like here, and rounds by hand; both equal roundf for |v| <= qmax.
// Subnormals: -ftz=true (part of -use_fast_math) flushes them in these intrinsics too,
// which would break the match for blocks of tiny values: build this file without it.
// Under hipcc the intrinsics are plain fp32 operations, and -ffp-contract=off (cuda/cuda.mk
// gives it to hipcc for the device code too) is what keeps them from fusing (unverified on
// an AMD GPU: test/test_quant_gpu.cu has not run there).
//
// A warp per block suits the block sizes DiLoCo uses (32 .. 4096); a block of millions of
// values is correct but leaves most of the GPU idle in the first kernel.
#include "cuda/common.cuh"


namespace {

constexpr int THREADS = 256;
constexpr int64_t MAX_GRID = 1 << 16; // grid-stride loops cover the rest
constexpr unsigned FLT_MAX_BITS = 0x7F7FFFFFu;

unsigned grid_for(int64_t threads) {
    int64_t grid = (threads + THREADS - 1) / THREADS;
    return (unsigned)(grid < 1 ? 1 : grid > MAX_GRID ? MAX_GRID : grid);
}

__device__ __forceinline__ float y_at(const float *x, const float *r, int64_t i) {
    return r ? __fadd_rn(x[i], r[i]) : x[i];
}

// The code of y in a block of scale s: 0 for a zero or NaN scale.
__device__ __forceinline__ int code_of(float y, float s, float qmax) {
    if (!(s > 0.0f)) return 0;
    float v = __fdiv_rn(y, s);
    v = fminf(fmaxf(v, -qmax), qmax);
    return (int)roundf(v);
}

// 4-bit two's complement: 0..7 stay, 8..15 become -8..-1.
__device__ __forceinline__ int int4_code(unsigned nibble) { return (int)(nibble ^ 8u) - 8; }

// scales[b] for every block b; x, r (may be NULL) [n]; scales [ceil(n / block)].
__global__ void quant_scales_kernel(const float *x, const float *r, int64_t n, int64_t block, float qmax,
                                    float *scales) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / WARP_SIZE;
    const int64_t n_blocks = quant_blocks(n, block);
    for (int64_t b = warp; b < n_blocks; b += n_warps) { // uniform across the warp
        int64_t start = b * block, end = min(start + block, n);
        unsigned max_bits = 0;
        for (int64_t i = start + lane; i < end; i += WARP_SIZE)
            max_bits = max(max_bits, __float_as_uint(y_at(x, r, i)) & 0x7FFFFFFFu);
        for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
            max_bits = max(max_bits, warp_shuffle_xor(max_bits, offset));
        if (lane == 0)
            scales[b] = max_bits > FLT_MAX_BITS ? __uint_as_float(QUANT_NAN_BITS) : __fdiv_rn(__uint_as_float(max_bits), qmax);
    }
}

// Codes (and the residual update) of element i; returns the code.
__device__ __forceinline__ int encode_element(const float *x, float *r, int64_t i, int64_t block, float qmax,
                                              const float *scales) {
    float s = scales[i / block];
    float y = y_at(x, r, i);
    int code = code_of(y, s, qmax);
    if (r) r[i] = __fsub_rn(y, __fmul_rn((float)code, s));
    return code;
}

// int8: codes [n]; int4: codes [ceil(n / 2)], element 2j in the low nibble of byte j.
__global__ void quant_codes_kernel(bool int4, const float *x, float *r, int64_t n, int64_t block, float qmax,
                                   const float *scales, uint8_t *codes) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n_bytes = int4 ? n / 2 + n % 2 : n;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n_bytes; j += stride) {
        if (!int4) {
            codes[j] = (uint8_t)(int8_t)encode_element(x, r, j, block, qmax, scales);
            continue;
        }
        unsigned low = (unsigned)encode_element(x, r, 2 * j, block, qmax, scales) & 0x0Fu;
        unsigned high = 2 * j + 1 < n ? (unsigned)encode_element(x, r, 2 * j + 1, block, qmax, scales) & 0x0Fu : 0u;
        codes[j] = (uint8_t)(low | high << 4);
    }
}

// QUANT_NONE with feedback: out = y = x + r (a NaN as QUANT_NAN_BITS), r = y - y (0, or NaN for a
// non-finite y).
__global__ void quant_none_feedback_kernel(const float *x, float *r, int64_t n, float *out) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float y = __fadd_rn(x[i], r[i]);
        out[i] = isnan(y) ? __uint_as_float(QUANT_NAN_BITS) : y;  // the C reference's one NaN
        r[i] = __fsub_rn(y, y);
    }
}

// x [n] = code · scale.
__global__ void quant_decode_kernel(bool int4, const float *scales, const uint8_t *codes, int64_t n, int64_t block,
                                    float *x) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int code = int4 ? int4_code((codes[i / 2] >> (4 * (i % 2))) & 0x0Fu) : (int)(int8_t)codes[i];
        x[i] = __fmul_rn((float)code, scales[i / block]);
    }
}

} // namespace  (the launchers check their arguments with the C reference's check_arguments)

extern "C" void quant_encode_cuda(quant_kind k, const float *d_x, float *d_residual, int64_t n, int64_t block,
                                  uint8_t *d_out, cudaStream_t stream) {
    check_arguments(k, n, block);
    CHECK(k != QUANT_BF16);   // the hub's downlink codec: host only
    if (n == 0) return;
    if (k == QUANT_NONE) {
        if (d_residual) {
            quant_none_feedback_kernel<<<grid_for(n), THREADS, 0, stream>>>(d_x, d_residual, n, (float *)d_out);
            CUDA_CHECK_LAUNCH();
        } else {
            CUDA_CHECK(cudaMemcpyAsync(d_out, d_x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        }
        return;
    }
    const float qmax = quant_max_code(k);
    const int64_t n_blocks = quant_blocks(n, block);
    float *scales = (float *)d_out;
    uint8_t *codes = d_out + (size_t)n_blocks * sizeof(float);
    quant_scales_kernel<<<grid_for(n_blocks * WARP_SIZE), THREADS, 0, stream>>>(d_x, d_residual, n, block, qmax,
                                                                                 scales);
    CUDA_CHECK_LAUNCH();
    const int64_t n_bytes = k == QUANT_INT4 ? n / 2 + n % 2 : n;
    quant_codes_kernel<<<grid_for(n_bytes), THREADS, 0, stream>>>(k == QUANT_INT4, d_x, d_residual, n, block, qmax,
                                                                   scales, codes);
    CUDA_CHECK_LAUNCH();
}

extern "C" void quant_decode_cuda(quant_kind k, const uint8_t *d_in, int64_t n, int64_t block, float *d_x,
                                  cudaStream_t stream) {
    check_arguments(k, n, block);
    CHECK(k != QUANT_BF16);
    if (n == 0) return;
    if (k == QUANT_NONE) {
        CUDA_CHECK(cudaMemcpyAsync(d_x, d_in, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    const float *scales = (const float *)d_in;
    const uint8_t *codes = d_in + (size_t)quant_blocks(n, block) * sizeof(float);
    quant_decode_kernel<<<grid_for(n), THREADS, 0, stream>>>(k == QUANT_INT4, scales, codes, n, block, d_x);
    CUDA_CHECK_LAUNCH();
}

#endif  // __CUDACC__ || __HIPCC__
