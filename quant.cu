// quant.cu — blockwise int8 / int4 / int2 quantization of DiLoCo outer gradients, dense or
// top-k sparse: the C reference
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
// Sparse codecs (top-k per block) encode block by block instead (encode_sparse_block): the
// block's scale, its kept set (the k-th largest |y| found bit by bit, then one walk in index
// order that keeps every value above it and the first of those equal to it),
// its record (index and codes), the residual and the error sums, all in one work item of
// whole blocks (about QUANT_CHUNK values), so again independent of the thread count.
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
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(TRAIN_GPT_EMULATION)
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
    if (strcmp(name, "int2") == 0) return QUANT_INT2;
    return -1;
}

const char *quant_kind_name(quant_kind k) {
    switch (k) {
    case QUANT_NONE: return "none";
    case QUANT_INT8: return "int8";
    case QUANT_INT4: return "int4";
    case QUANT_BF16: return "bf16";
    case QUANT_INT2: return "int2";
    }
    return "unknown";
}

// ---------------------------------------------------------------- codecs and sizes

#define QUANT_KEEP_SHIFT 8
#define QUANT_MAX_KEEP ((int64_t)1 << 22)   // above diloco_quant_block's maximum, 2^20

static HOST_DEVICE quant_kind codec_kind(quant_codec c) { return (quant_kind)(c & 0xFF); }
static HOST_DEVICE int64_t codec_keep(quant_codec c) { return (int64_t)(c >> QUANT_KEEP_SHIFT); }
static HOST_DEVICE bool kind_is_int(quant_kind k) { return k == QUANT_INT8 || k == QUANT_INT4 || k == QUANT_INT2; }
static HOST_DEVICE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

quant_codec quant_codec_of(quant_kind kind, int64_t keep) {
    CHECK(keep >= 0 && keep < QUANT_MAX_KEEP);
    CHECK(keep == 0 || kind_is_int(kind));
    return (quant_codec)kind | (quant_codec)(keep << QUANT_KEEP_SHIFT);
}

quant_kind quant_codec_kind(quant_codec c) { return codec_kind(c); }
int64_t quant_codec_keep(quant_codec c) { return codec_keep(c); }

int64_t quant_topk_keep(double topk, int64_t block) {
    CHECK(topk > 0.0 && topk <= 1.0 && block >= 1);
    double want = ceil(topk * (double)block - 1e-9);
    int64_t keep = want < 1.0 ? 1 : (int64_t)want;
    return keep >= block ? 0 : keep;
}

static float quant_max_code(quant_kind k) { return k == QUANT_INT8 ? 127.0f : k == QUANT_INT4 ? 7.0f : 1.0f; }
static HOST_DEVICE int code_bits(quant_kind k) { return k == QUANT_INT8 ? 8 : k == QUANT_INT4 ? 4 : 2; }

static HOST_DEVICE int64_t quant_blocks(int64_t n, int64_t block) { return n / block + (n % block != 0); }

static void check_arguments(quant_codec c, int64_t n, int64_t block) {
    CHECK(c >= 0 && (c & 0xFF) <= QUANT_INT2);
    CHECK(codec_keep(c) == 0 || (kind_is_int(codec_kind(c)) && codec_keep(c) < block));
    CHECK(n >= 0);
    CHECK(block >= 1);
}

// How a sparse codec lays out its blocks: offsets or bitmap (from block and keep alone),
// the width of an offset, the bits of a code.
typedef struct {
    int64_t keep;
    int offset_bits;        // w = ceil(log2(block)): an offset in [0, block)
    int value_bits;         // 8, 4 or 2
    bool offsets;           // the index coding: offsets (true) or a bitmap
} sparse_layout;

static HOST_DEVICE int offset_width(int64_t block) {
    int w = 0;
    while (((int64_t)1 << w) < block) w++;
    return w;
}

static HOST_DEVICE bool offsets_are_smaller(int64_t block, int64_t keep) {
    return (keep * offset_width(block) + 7) / 8 < (block + 7) / 8;
}

bool quant_sparse_offsets(int64_t block, int64_t keep) {
    CHECK(block >= 1 && keep >= 1);
    return offsets_are_smaller(block, keep);
}

static HOST_DEVICE sparse_layout sparse_layout_of(quant_codec c, int64_t block) {
    sparse_layout s;
    s.keep = codec_keep(c);
    s.offset_bits = offset_width(block);
    s.value_bits = code_bits(codec_kind(c));
    s.offsets = offsets_are_smaller(block, s.keep);
    return s;
}

// A block of len values: its index bytes, and its whole record (index + codes).
static HOST_DEVICE int64_t sparse_index_bytes(const sparse_layout *s, int64_t len) {
    int64_t k = min64(s->keep, len);
    return s->offsets ? (k * s->offset_bits + 7) / 8 : (len + 7) / 8;
}

static HOST_DEVICE int64_t sparse_record_bytes(const sparse_layout *s, int64_t len) {
    return sparse_index_bytes(s, len) + (min64(s->keep, len) * s->value_bits + 7) / 8;
}

size_t quant_sparse_record_bytes(quant_codec c, int64_t block) {
    check_arguments(c, block, block);
    CHECK(codec_keep(c) > 0);
    sparse_layout s = sparse_layout_of(c, block);
    return (size_t)sparse_record_bytes(&s, block);
}

// Where block b's record starts in a sparse encoding of n values (every record before the
// last is a full block's).
static HOST_DEVICE int64_t sparse_record_at(const sparse_layout *s, int64_t n, int64_t block, int64_t b) {
    return quant_blocks(n, block) * (int64_t)sizeof(float) + b * sparse_record_bytes(s, block);
}

size_t quant_encoded_bytes(quant_codec c, int64_t n, int64_t block) {
    check_arguments(c, n, block);
    quant_kind k = codec_kind(c);
    if (k == QUANT_NONE) return (size_t)n * sizeof(float);
    if (k == QUANT_BF16) return (size_t)n * sizeof(uint16_t);
    int64_t n_blocks = quant_blocks(n, block);
    size_t scale_bytes = (size_t)n_blocks * sizeof(float);
    if (codec_keep(c) > 0) {
        if (n == 0) return 0;
        sparse_layout s = sparse_layout_of(c, block);
        return (size_t)sparse_record_at(&s, n, block, n_blocks - 1) +
               (size_t)sparse_record_bytes(&s, n - (n_blocks - 1) * block);
    }
    size_t code_bytes = k == QUANT_INT8 ? (size_t)n : k == QUANT_INT4 ? (size_t)(n / 2 + n % 2) : (size_t)(n / 4 + (n % 4 != 0));
    return scale_bytes + code_bytes;
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

// Pass 2 over the elements [c0, c1) of one chunk; c0 is a multiple of 4 (QUANT_CHUNK is).
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
    if (k == QUANT_INT2) {
        uint8_t *bytes = code_bytes + c0 / 4;
        int64_t len = c1 - c0;
        for (int64_t j = 0; j < len / 4; j++)
            bytes[j] = (uint8_t)((codes[4 * j] & 3) | (codes[4 * j + 1] & 3) << 2 | (codes[4 * j + 2] & 3) << 4 |
                                 (codes[4 * j + 3] & 3) << 6);
        if (len % 4) {   // the last elements of an n that is not a multiple of 4
            unsigned last = 0;
            for (int64_t t = 0; t < len % 4; t++) last |= (unsigned)(codes[len / 4 * 4 + t] & 3) << (2 * t);
            bytes[len / 4] = (uint8_t)last;
        }
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

// ---------------------------------------------------------------- sparse codecs: block by block

static inline uint32_t abs_bits(float y) {
    uint32_t bits;
    memcpy(&bits, &y, sizeof bits);
    return bits & 0x7FFFFFFFu;
}

// The k-th largest of a[0..len) (1 <= k <= len), the GPU's way: t takes bit j (from the top;
// bit 31 of |y| is 0) when at least k values are >= t | 2^j. 31 passes, each a branch-free
// count that vectorizes: faster on random data than a quickselect, whose branches mispredict.
static uint32_t kth_largest(const uint32_t *a, int64_t len, int64_t k) {
    uint32_t t = 0;
    for (int bit = 30; bit >= 0; bit--) {
        uint32_t candidate = t | (1u << bit);
        int32_t count = 0;
        for (int64_t i = 0; i < len; i++) count += a[i] >= candidate;
        if (count >= k) t = candidate;
    }
    return t;
}

// Ors the low `width` bits of v into the bit stream at bit `at` (LSB first, bytes ascending).
static inline void put_bits(uint8_t *buf, int64_t at, uint32_t v, int width) {
    uint8_t *p = buf + (at >> 3);
    uint64_t shifted = (uint64_t)(v & (uint32_t)((1ull << width) - 1)) << (at & 7);
    int bytes = (int)(((at & 7) + width + 7) >> 3);
    for (int j = 0; j < bytes; j++) p[j] |= (uint8_t)(shifted >> (8 * j));
}

static inline uint32_t get_bits(const uint8_t *buf, int64_t at, int width) {
    const uint8_t *p = buf + (at >> 3);
    int bytes = (int)(((at & 7) + width + 7) >> 3);
    uint64_t w = 0;
    for (int j = 0; j < bytes; j++) w |= (uint64_t)p[j] << (8 * j);
    return (uint32_t)(w >> (at & 7)) & (uint32_t)((1ull << width) - 1);
}

// A `bits`-bit two's-complement code back to an int.
static inline HOST_DEVICE int code_of_bits(uint32_t v, int bits) {
    int half = 1 << (bits - 1);
    return (int)(v ^ (uint32_t)half) - half;
}

// One block of len values, y = x + r (r may be NULL), whose scale is already known: its kept
// set, its record (rec, sparse_record_bytes(s, len) bytes), the residual r = y - code·scale
// (code 0 off the kept set) and the error sums. sel holds len values of scratch.
static void encode_sparse_block(const sparse_layout *s, float qmax, const float *x, float *r, int64_t len,
                                float scale, uint8_t *rec, chunk_error *e, uint32_t *sel) {
    int64_t keep = min_i64(s->keep, len);
    for (int64_t i = 0; i < len; i++) sel[i] = abs_bits(r ? x[i] + r[i] : x[i]);
    uint32_t threshold = kth_largest(sel, len, keep);
    int64_t above = 0;
    for (int64_t i = 0; i < len; i++) above += sel[i] > threshold;
    int64_t ties = keep - above;   // of the values equal to the threshold, the first `ties` are kept
    memset(rec, 0, (size_t)sparse_record_bytes(s, len));
    uint8_t *codes = rec + sparse_index_bytes(s, len);
    int64_t slot = 0;
    double err2 = 0.0, x2 = 0.0;
    for (int64_t i = 0; i < len; i++) {
        float y = r ? x[i] + r[i] : x[i];
        uint32_t bits = abs_bits(y);
        bool kept = bits > threshold || (bits == threshold && ties > 0);
        ties -= kept && bits == threshold;
        int code = 0;
        if (kept) {
            if (scale > 0.0f) {
                float v = y / scale;
                v = v > qmax ? qmax : v;
                v = v < -qmax ? -qmax : v;
                code = round_half_away(v);
            }
            if (s->offsets)
                put_bits(rec, slot * s->offset_bits, (uint32_t)i, s->offset_bits);
            else
                rec[i >> 3] |= (uint8_t)(1u << (i & 7));
            put_bits(codes, slot * s->value_bits, (uint32_t)code, s->value_bits);
            slot++;
        }
        float value = (float)code * scale;
        if (r) r[i] = y - value;
        if (e) {
            double d = (double)value - (double)x[i];
            err2 += d * d;
            x2 += (double)x[i] * (double)x[i];
        }
    }
    if (e) {
        e->err2 += err2;
        e->x2 += x2;
    }
}

// Blocks per work item of a sparse encode: about QUANT_CHUNK values.
static int64_t sparse_blocks_per_item(int64_t block) { return block >= QUANT_CHUNK ? 1 : QUANT_CHUNK / block; }

// Work items of an encode (the entries of its errors[]): chunks of QUANT_CHUNK values for a
// dense codec, groups of whole blocks for a sparse one.
static int64_t work_items(quant_codec c, int64_t n, int64_t block) {
    if (codec_keep(c) == 0) return quant_blocks(n, QUANT_CHUNK);
    return quant_blocks(quant_blocks(n, block), sparse_blocks_per_item(block));
}

static void encode_sparse(quant_codec c, const float *x, float *r, int64_t n, int64_t block, uint8_t *out,
                          chunk_error *errors) {
    sparse_layout s = sparse_layout_of(c, block);
    float qmax = quant_max_code(codec_kind(c));
    int64_t n_blocks = quant_blocks(n, block), per = sparse_blocks_per_item(block);
    int64_t items = quant_blocks(n_blocks, per);
#pragma omp parallel for schedule(static)
    for (int64_t it = 0; it < items; it++) {
        uint32_t stack[QUANT_CHUNK];
        uint32_t *sel = block <= QUANT_CHUNK ? stack : (uint32_t *)xmalloc((size_t)block * sizeof *sel);
        for (int64_t b = it * per; b < min_i64((it + 1) * per, n_blocks); b++) {
            int64_t start = b * block, len = min_i64(block, n - start);
            const float *xb = x + start;
            float *rb = r ? r + start : NULL;
            float scale = block_scale(xb, rb, len, qmax);
            scale_store(out, b, scale);
            encode_sparse_block(&s, qmax, xb, rb, len, scale, out + sparse_record_at(&s, n, block, b),
                                errors ? &errors[it] : NULL, sel);
        }
        if (sel != stack) free(sel);
    }
}

// The whole encode; r and errors may be NULL. errors[c] receives work item c's sums
// (work_items of them).
static void encode(quant_codec c, const float *x, float *r, int64_t n, int64_t block, uint8_t *out,
                   chunk_error *errors) {
    check_arguments(c, n, block);
    if (codec_keep(c) > 0) {
        encode_sparse(c, x, r, n, block, out, errors);
        return;
    }
    quant_kind k = codec_kind(c);
    if (kind_is_int(k)) write_scales(x, r, n, block, quant_max_code(k), out);
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

void quant_encode(quant_codec c, const float *x, int64_t n, int64_t block, uint8_t *out) {
    encode(c, x, NULL, n, block, out, NULL);
}

double quant_encode_feedback(quant_codec c, const float *x, float *residual, int64_t n, int64_t block,
                             uint8_t *out) {
    check_arguments(c, n, block);
    int64_t n_chunks = work_items(c, n, block);
    chunk_error *errors = (chunk_error *)xcalloc((size_t)max_i64(n_chunks, 1), sizeof *errors);
    encode(c, x, residual, n, block, out, errors);
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

// A sparse encoding's values [c0, c1): 0·scale everywhere (0, or NaN in a NaN block), then
// code·scale at the kept values. Indices come from the bytes: whatever they say, only values
// inside [c0, c1) are written (a malformed record garbles values, never memory).
static void decode_chunk_sparse(quant_codec c, const uint8_t *in, int64_t n, int64_t block, int64_t c0, int64_t c1,
                                float *values) {
    sparse_layout s = sparse_layout_of(c, block);
    for (int64_t i = c0; i < c1;) {
        int64_t b = i / block, start = b * block, len = min_i64(block, n - start), end = min_i64(start + len, c1);
        float scale = scale_load(in, b), zero = 0.0f * scale;
        for (int64_t j = i; j < end; j++) values[j - c0] = zero;
        const uint8_t *rec = in + sparse_record_at(&s, n, block, b);
        const uint8_t *codes = rec + sparse_index_bytes(&s, len);
        int64_t keep = min_i64(s.keep, len), lo = i - start, hi = end - start;
        float *v = values + (start - c0);   // v[o] is the block's value o (written for o in [lo, hi) only)
        if (s.offsets) {
            for (int64_t t = 0; t < keep; t++) {
                int64_t o = get_bits(rec, t * s.offset_bits, s.offset_bits);
                if (o >= lo && o < hi)
                    v[o] = (float)code_of_bits(get_bits(codes, t * s.value_bits, s.value_bits), s.value_bits) * scale;
            }
        } else {
            int64_t t = 0;
            for (int64_t byte = 0; byte < (len + 7) / 8 && t < keep && byte * 8 < hi; byte++) {
                for (unsigned bits = rec[byte]; bits && t < keep; bits &= bits - 1, t++) {
                    int64_t o = byte * 8 + __builtin_ctz(bits);
                    if (o >= lo && o < hi)
                        v[o] = (float)code_of_bits(get_bits(codes, t * s.value_bits, s.value_bits), s.value_bits) *
                               scale;
                }
            }
        }
        i = end;
    }
}

// Values of the elements [c0, c1) into values[0 .. c1 - c0): code * scale, one fp32
// multiply, so that every decoder of the same bytes gets the same bits.
static void decode_chunk(quant_codec c, const uint8_t *in, int64_t n, int64_t block, int64_t c0, int64_t c1,
                         float *values) {
    if (codec_keep(c) > 0) {
        decode_chunk_sparse(c, in, n, block, c0, c1, values);
        return;
    }
    quant_kind k = codec_kind(c);
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
        } else if (k == QUANT_INT2) {
            for (int64_t j = i; j < end; j++)
                v[j - i] = (float)code_of_bits((uint32_t)(code_bytes[j / 4] >> (2 * (j % 4))) & 3u, 2) * scale;
        } else {
            decode_int4_segment(code_bytes, i, end, scale, v);
        }
        i = end;
    }
}

void quant_decode(quant_codec k, const uint8_t *in, int64_t n, int64_t block, float *x) {
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

size_t quant_segmented_bytes(quant_codec k, int64_t n, int64_t block, int64_t segment) {
    CHECK(segment >= 1);
    int64_t full = n / segment, rest = n % segment;
    return (size_t)full * quant_encoded_bytes(k, segment, block) + (rest ? quant_encoded_bytes(k, rest, block) : 0);
}

double quant_encode_segments(quant_codec k, const float *x, float *residual, int64_t n, int64_t block,
                             int64_t segment, uint8_t *out) {
    check_arguments(k, n, block);
    int64_t n_chunks_all = 0;
    for (int64_t s0 = 0; s0 < n; s0 += segment) n_chunks_all += work_items(k, min_i64(segment, n - s0), block);
    chunk_error *errors = (chunk_error *)xcalloc((size_t)max_i64(n_chunks_all, 1), sizeof *errors);
    chunk_error *e = errors;
    for (int64_t s0 = 0; s0 < n; s0 += segment) {
        int64_t len = min_i64(segment, n - s0);
        encode(k, x + s0, residual ? residual + s0 : NULL, len, block, out, e);
        out += quant_encoded_bytes(k, len, block);
        e += work_items(k, len, block);
    }
    double err2 = 0, x2 = 0;
    for (int64_t c = 0; c < n_chunks_all; c++) {
        err2 += errors[c].err2;
        x2 += errors[c].x2;
    }
    free(errors);
    return x2 == 0.0 ? 0.0 : sqrt(err2) / sqrt(x2);
}

void quant_decode_segments(quant_codec k, const uint8_t *in, int64_t n, int64_t block, int64_t segment, float *x) {
    for (int64_t s0 = 0; s0 < n; s0 += segment) {
        int64_t len = min_i64(segment, n - s0);
        quant_decode(k, in, len, block, x + s0);
        in += quant_encoded_bytes(k, len, block);
    }
}

bool quant_is_finite(quant_codec c, const uint8_t *in, int64_t n, int64_t block) {
    check_arguments(c, n, block);
    quant_kind k = codec_kind(c);
    if (k == QUANT_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, in + (size_t)i * sizeof h, sizeof h);
            if ((h & 0x7F80u) == 0x7F80u) return false;
        }
        return true;
    }
    // int8 / int4 / int2, dense or sparse: a block with a NaN or Inf input has a NaN scale (the
    // codes are bounded). A finite scale whose largest code decodes to Inf (scale · qmax above
    // FLT_MAX: an encoded max of FLT_MAX, or a scale no encoder writes) is not finite either:
    // taken, it passed Inf into the mean, or into Δ.
    if (k == QUANT_NONE) {
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(scale_load(in, i))) return false;
        return true;
    }
    float qmax = quant_max_code(k);
    int64_t blocks = quant_blocks(n, block);
    for (int64_t i = 0; i < blocks; i++) {
        float s = scale_load(in, i);
        if (!isfinite(s) || !isfinite(s * qmax)) return false;
    }
    return true;
}

void quant_mean(quant_codec k, const uint8_t *const *in, int count, int64_t n, int64_t block, const float *factors,
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

double quant_norm(quant_codec k, const uint8_t *in, int64_t n, int64_t block) {
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

// The lower median of x[0..n) (n >= 1): the bound's reference, for norms and for token weights.
static double lower_median(const double *x, int n) {
    double *sorted = (double *)xmalloc((size_t)n * sizeof *sorted);
    memcpy(sorted, x, (size_t)n * sizeof *sorted);
    for (int j = 1; j < n; j++)   // insertion sort: a few hundred at most
        for (int i = j; i > 0 && sorted[i - 1] > sorted[i]; i--) {
            double t = sorted[i];
            sorted[i] = sorted[i - 1];
            sorted[i - 1] = t;
        }
    double m = sorted[(n - 1) / 2];
    free(sorted);
    return m;
}

// The bound on the finite contributions in[0..kept): factors[j] = bound · median / norm_j (as
// fp32) for a contribution whose norm exceeds bound times the lower median of the norms, 1
// for the others (and for all when the median is 0: nothing to measure against).
static void bound_factors(quant_codec k, const uint8_t *const *in, int kept, int64_t n, int64_t block, float bound,
                          float *factors) {
    double *norms = (double *)xmalloc((size_t)kept * sizeof *norms);
    for (int j = 0; j < kept; j++) norms[j] = quant_norm(k, in[j], n, block);
    double limit = (double)bound * lower_median(norms, kept);
    for (int j = 0; j < kept; j++) factors[j] = limit > 0.0 && norms[j] > limit ? (float)(limit / norms[j]) : 1.0f;
    free(norms);
}

int quant_reduce_segment(const quant_reduction *q, const uint8_t *const *in, int count, int64_t n, float *residual,
                         float *scratch, uint8_t *out, quant_effect *effect) {
    const uint8_t **finite = (const uint8_t **)xmalloc((size_t)(count > 0 ? count : 1) * sizeof *finite);
    float *factors = (float *)xmalloc((size_t)(count > 0 ? count : 1) * sizeof *factors);
    int *index = (int *)xmalloc((size_t)(count > 0 ? count : 1) * sizeof *index);
    int kept = 0, touched = 0;
    for (int j = 0; j < count; j++) {
        // Weight 0: a contribution of no work (a replica that joined at the run's end), which
        // the mean, the bound's medians and the weights' sum leave out as if it were not there.
        bool weightless = q->weights && q->weights[j] == 0.0;
        bool ok = weightless || quant_is_finite(q->up, in[j], n, q->block);
        if (effect) effect[j] = (quant_effect){.left_out = !ok, .factor = 1.0f, .weight_capped = false};
        touched += !ok;
        if (ok && !weightless) {
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
        } else {
            for (int j = 0; j < kept; j++) factors[j] = 1.0f;
        }
        if (q->weights) {
            // The weighted mean as a plain mean of scaled contributions: f = w·kept/Σw, exactly 1
            // for equal weights (integers: w·kept and Σw are the same exact double). With a bound,
            // a weight counts at most bound × the lower median weight: a replica that claims more
            // tokens than it could have trained cannot take over the mean either.
            double *w = (double *)xmalloc((size_t)kept * sizeof *w), total = 0.0;
            for (int j = 0; j < kept; j++) w[j] = q->weights[index[j]];
            if (bounded) {
                double cap = (double)q->bound * lower_median(w, kept);
                for (int j = 0; j < kept; j++)
                    if (w[j] > cap) {
                        w[j] = cap;
                        if (effect) effect[index[j]].weight_capped = true;
                    }
            }
            for (int j = 0; j < kept; j++) total += w[j];
            for (int j = 0; j < kept; j++) {
                float f = (float)(w[j] * (double)kept / total);
                if (f != 1.0f) factors[j] = factors[j] * f;
            }
            free(w);
        }
        quant_mean(q->up, finite, kept, n, q->block, bounded || q->weights ? factors : NULL, scratch);
        // Finite contributions can still sum past FLT_MAX: such a mean goes out as it is (NaN
        // scales: every replica skips the step), but it must not reach the downlink residual,
        // which would hold NaN from then on and make every later round's mean of this segment
        // NaN too (the step skipped round after round, until the hub restarted).
        bool mean_finite = true;
        for (int64_t i = 0; i < n; i++) mean_finite &= isfinite(scratch[i]) != 0;
        encode(q->down, scratch, mean_finite ? residual : NULL, n, q->block, out, NULL);
    }
    free(finite);
    free(factors);
    free(index);
    return touched;
}

// ================================================================ the GPU section
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(TRAIN_GPT_EMULATION)
// nvcc, or hipcc through cuda/portable.cuh, or the tests' CPU emulator (test/warp_emu.h).
// Two kernels encode a dense codec, as the C reference's two passes do:
//   quant_scales_kernel  one warp (WARP_SIZE lanes) per block: max of |y| (y = x + residual)
//                        as an integer max on the bits (exact, so the reduction order and
//                        the warp size do not matter), then
//                        scale = max / qmax, or NaN for a block holding NaN or Inf;
//   quant_codes_kernel   one thread per code byte (an int8 element, an int4 pair or four
//                        int2 codes, so no two threads write one byte): code =
//                        round(clamp(y / scale)), and with feedback residual = y - code·scale.
// One kernel encodes a sparse codec, one warp per block (quant_sparse_kernel):
//   the scale as above; the threshold t = the keep-th largest |y| bits, found bit by bit from
//   the top (t gets bit j when at least keep values have bits >= t | 2^j: 31 counting passes,
//   each an exact integer count, so again independent of the order); then each lane takes a
//   contiguous range of the block, counts its values above t and equal to t, and exclusive
//   sums over the lanes (xor butterflies) say which of the ties are its (the first
//   keep - above in index order: the C reference's rule) and at which slot its first kept
//   value goes. Lanes then write offsets or bitmap bits and codes with atomicOr into the
//   record, zeroed before (neighbouring lanes, and blocks, share bytes), and the residual.
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

// bits = 8: codes [n]; 4: codes [ceil(n / 2)], element 2j in the low nibble of byte j; 2:
// codes [ceil(n / 4)], element 4j + t in bits 2t, 2t + 1 of byte j.
__global__ void quant_codes_kernel(int bits, const float *x, float *r, int64_t n, int64_t block, float qmax,
                                   const float *scales, uint8_t *codes) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int per = 8 / bits;
    const unsigned mask = (1u << bits) - 1u;
    const int64_t n_bytes = (n + per - 1) / per;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n_bytes; j += stride) {
        unsigned byte = 0;
        for (int t = 0; t < per && j * per + t < n; t++)
            byte |= ((unsigned)encode_element(x, r, j * per + t, block, qmax, scales) & mask) << (bits * t);
        codes[j] = (uint8_t)byte;
    }
}

// Exclusive prefix sum of v over the warp's lanes, and the total (xor butterflies: at step o
// each lane holds its aligned group of o lanes' sum and takes its sibling group's).
__device__ __forceinline__ int warp_exclusive_sum(int v, int lane, int *total) {
    int sum = v, before = 0;
    for (int o = 1; o < WARP_SIZE; o <<= 1) {
        int other = warp_shuffle_xor(sum, o);
        if (lane & o) before += other;
        sum += other;
    }
    *total = sum;
    return before;
}

__device__ __forceinline__ int warp_sum_int(int v) {
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += warp_shuffle_xor(v, o);
    return v;
}

__device__ __forceinline__ unsigned abs_bits_at(const float *x, const float *r, int64_t i) {
    return __float_as_uint(y_at(x, r, i)) & 0x7FFFFFFFu;
}

// Ors the low `width` bits of v into the bit stream that starts at byte buf, at bit `at`,
// through the 32-bit words that hold those bytes (buf + at / 8 may be unaligned; the buffer's
// start is 4-byte aligned).
__device__ __forceinline__ void atomic_or_bits(uint8_t *buf, int64_t at, unsigned v, int width) {
    uintptr_t byte = (uintptr_t)(buf + (at >> 3));
    unsigned *word = (unsigned *)(byte & ~(uintptr_t)3);
    int shift = (int)(byte & 3) * 8 + (int)(at & 7);
    unsigned long long bits = (unsigned long long)(v & ((1u << width) - 1u)) << shift;
    if ((unsigned)bits) atomicOr(word, (unsigned)bits);
    if ((unsigned)(bits >> 32)) atomicOr(word + 1, (unsigned)(bits >> 32));
}

// Lane `lane`'s contiguous range [*lo, *hi) of a block of len values (per values each,
// rounded up to whole bytes of a bitmap).
__device__ __forceinline__ void lane_range(int64_t len, int lane, int64_t *lo, int64_t *hi) {
    int64_t per = (len + WARP_SIZE - 1) / WARP_SIZE;
    per = (per + 7) / 8 * 8;
    *lo = min((int64_t)lane * per, len);
    *hi = min(*lo + per, len);
}

// A sparse codec, one warp per block: scales [n_blocks] at out, then the records (zeroed
// before the launch); x, r (may be NULL) [n].
__global__ void quant_sparse_kernel(sparse_layout s, const float *x, float *r, int64_t n, int64_t block, float qmax,
                                    uint8_t *out) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / WARP_SIZE;
    const int64_t n_blocks = quant_blocks(n, block);
    for (int64_t b = warp; b < n_blocks; b += n_warps) { // uniform across the warp
        const int64_t start = b * block, len = min(block, n - start);
        const int keep = (int)min64(s.keep, len);
        const float *xb = x + start;
        float *rb = r ? r + start : NULL;
        unsigned max_bits = 0;
        for (int64_t i = lane; i < len; i += WARP_SIZE) max_bits = max(max_bits, abs_bits_at(xb, rb, i));
        for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
            max_bits = max(max_bits, warp_shuffle_xor(max_bits, offset));
        const float scale = max_bits > FLT_MAX_BITS ? __uint_as_float(QUANT_NAN_BITS)
                                                    : __fdiv_rn(__uint_as_float(max_bits), qmax);
        if (lane == 0) ((float *)out)[b] = scale;
        unsigned t = 0;   // bit 31 of |y| is 0
        for (int bit = 30; bit >= 0; bit--) {
            unsigned candidate = t | (1u << bit);
            int count = 0;
            for (int64_t i = lane; i < len; i += WARP_SIZE) count += abs_bits_at(xb, rb, i) >= candidate;
            if (warp_sum_int(count) >= keep) t = candidate;
        }
        int64_t lo, hi;
        lane_range(len, lane, &lo, &hi);
        int above = 0, equal = 0;
        for (int64_t i = lo; i < hi; i++) {
            unsigned bits = abs_bits_at(xb, rb, i);
            above += bits > t;
            equal += bits == t;
        }
        int above_total, equal_total;
        warp_exclusive_sum(above, lane, &above_total);
        int equal_before = warp_exclusive_sum(equal, lane, &equal_total);
        int ties = min(max(keep - above_total - equal_before, 0), equal);   // this lane's kept ties
        int kept_total;
        int slot = warp_exclusive_sum(above + ties, lane, &kept_total);
        uint8_t *rec = out + sparse_record_at(&s, n, block, b);
        uint8_t *codes = rec + sparse_index_bytes(&s, len);
        for (int64_t i = lo; i < hi; i++) {
            float y = y_at(xb, rb, i);
            unsigned bits = __float_as_uint(y) & 0x7FFFFFFFu;
            bool kept = bits > t || (bits == t && ties > 0);
            ties -= kept && bits == t;
            int code = 0;
            if (kept) {
                code = code_of(y, scale, qmax);
                if (s.offsets)
                    atomic_or_bits(rec, (int64_t)slot * s.offset_bits, (unsigned)i, s.offset_bits);
                else
                    atomic_or_bits(rec, i, 1u, 1);
                atomic_or_bits(codes, (int64_t)slot * s.value_bits, (unsigned)code, s.value_bits);
                slot++;
            }
            if (rb) rb[i] = __fsub_rn(y, __fmul_rn((float)code, scale));
        }
    }
}

// A sparse codec's values, one warp per block: each lane writes its range, 0·scale and then
// code·scale at the kept values in it (their slots: the kept values before the range).
__global__ void quant_sparse_decode_kernel(sparse_layout s, const uint8_t *in, int64_t n, int64_t block, float *x) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP_SIZE;
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / WARP_SIZE;
    const int64_t n_blocks = quant_blocks(n, block);
    for (int64_t b = warp; b < n_blocks; b += n_warps) {
        const int64_t start = b * block, len = min(block, n - start);
        const int keep = (int)min64(s.keep, len);
        const float scale = ((const float *)in)[b];
        const uint8_t *rec = in + sparse_record_at(&s, n, block, b);
        const uint8_t *codes = rec + sparse_index_bytes(&s, len);
        int64_t lo, hi;
        lane_range(len, lane, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) x[start + i] = __fmul_rn(0.0f, scale);
        if (s.offsets) {
            for (int slot = 0; slot < keep; slot++) {
                int64_t o = 0;
                for (int j = 0; j < s.offset_bits; j++) {
                    int64_t at = (int64_t)slot * s.offset_bits + j;
                    o |= (int64_t)((rec[at >> 3] >> (at & 7)) & 1) << j;
                }
                if (o < lo || o >= hi) continue;
                unsigned v = 0;
                for (int j = 0; j < s.value_bits; j++) {
                    int64_t at = (int64_t)slot * s.value_bits + j;
                    v |= (unsigned)((codes[at >> 3] >> (at & 7)) & 1) << j;
                }
                x[start + o] = __fmul_rn((float)code_of_bits(v, s.value_bits), scale);
            }
            continue;   // uniform: every lane of the warp takes the same branch
        }
        int mine = 0;   // lo and hi are whole bytes of the bitmap (hi may be the block's end)
        for (int64_t byte = lo / 8; lo < hi && byte < (hi + 7) / 8; byte++) mine += __popc(rec[byte]);
        int total;
        int slot = warp_exclusive_sum(mine, lane, &total);
        for (int64_t i = lo; i < hi; i++) {
            if (!((rec[i >> 3] >> (i & 7)) & 1)) continue;
            if (slot < keep) {
                unsigned v = 0;
                for (int j = 0; j < s.value_bits; j++) {
                    int64_t at = (int64_t)slot * s.value_bits + j;
                    v |= (unsigned)((codes[at >> 3] >> (at & 7)) & 1) << j;
                }
                x[start + i] = __fmul_rn((float)code_of_bits(v, s.value_bits), scale);
            }
            slot++;
        }
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

// x [n] = code · scale; codes of `bits` bits (8, 4, 2) as quant_codes_kernel writes them.
__global__ void quant_decode_kernel(int bits, const float *scales, const uint8_t *codes, int64_t n, int64_t block,
                                    float *x) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int per = 8 / bits;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned v = (codes[i / per] >> (bits * (i % per))) & ((1u << bits) - 1u);
        x[i] = __fmul_rn((float)code_of_bits(v, bits), scales[i / block]);
    }
}

} // namespace  (the launchers check their arguments with the C reference's check_arguments)

extern "C" void quant_encode_cuda(quant_codec c, const float *d_x, float *d_residual, int64_t n, int64_t block,
                                  uint8_t *d_out, cudaStream_t stream) {
    check_arguments(c, n, block);
    const quant_kind k = codec_kind(c);
    CHECK(k != QUANT_BF16);   // the hub's downlink codec: host only
    if (n == 0) return;
    if (codec_keep(c) > 0) {
        const int64_t n_blocks = quant_blocks(n, block);
        const size_t scale_bytes = (size_t)n_blocks * sizeof(float);
        CUDA_CHECK(cudaMemsetAsync(d_out + scale_bytes, 0, quant_encoded_bytes(c, n, block) - scale_bytes, stream));
        quant_sparse_kernel<<<grid_for(n_blocks * WARP_SIZE), THREADS, 0, stream>>>(
            sparse_layout_of(c, block), d_x, d_residual, n, block, quant_max_code(k), d_out);
        CUDA_CHECK_LAUNCH();
        return;
    }
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
    const int bits = code_bits(k);
    const int64_t n_bytes = (n * bits + 7) / 8;
    quant_codes_kernel<<<grid_for(n_bytes), THREADS, 0, stream>>>(bits, d_x, d_residual, n, block, qmax, scales,
                                                                   codes);
    CUDA_CHECK_LAUNCH();
}

extern "C" void quant_decode_cuda(quant_codec c, const uint8_t *d_in, int64_t n, int64_t block, float *d_x,
                                  cudaStream_t stream) {
    check_arguments(c, n, block);
    const quant_kind k = codec_kind(c);
    CHECK(k != QUANT_BF16);
    if (n == 0) return;
    if (codec_keep(c) > 0) {
        quant_sparse_decode_kernel<<<grid_for(quant_blocks(n, block) * WARP_SIZE), THREADS, 0, stream>>>(
            sparse_layout_of(c, block), d_in, n, block, d_x);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (k == QUANT_NONE) {
        CUDA_CHECK(cudaMemcpyAsync(d_x, d_in, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    const float *scales = (const float *)d_in;
    const uint8_t *codes = d_in + (size_t)quant_blocks(n, block) * sizeof(float);
    quant_decode_kernel<<<grid_for(n), THREADS, 0, stream>>>(code_bits(k), scales, codes, n, block, d_x);
    CUDA_CHECK_LAUNCH();
}

#endif  // __CUDACC__ || __HIPCC__ || TRAIN_GPT_EMULATION
