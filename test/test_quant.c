// test/test_quant.c — quant.cu's C reference, the blockwise int8 / int4 / int2 quantizer of DiLoCo's
// outer gradients, dense and top-k sparse, against hand-made bytes, a naive reference encoder,
// derived error bounds, and the error-feedback identity.
//
// Tolerances, and where they come from (s is a block's scale, max|y| / qmax):
//   - Elementwise, a decoded value is within (1/2 + 2^-15)·s of what was encoded. Rounding to
//     the nearest code costs at most s/2; the division y/s is off by at most 2^-24·|y/s| <=
//     2^-24·128 codes and the decode multiply by 2^-24·|code·s| <= 2^-24·127·s, together
//     < 2^-16·s, so 2^-15·s leaves room.
//   - Relative L2 on Gaussian data: with a step s small against the spread of the data the
//     rounding error is close to uniform on [-s/2, s/2], of mean square s²/12, so the
//     expected squared error is Σ_blocks len·s²/12 (the "uniform model"). The measured error
//     must lie within [0.85, 1.05] of the model's (measured: 0.985 .. 1.000 for both int8
//     and int4, a bit under 1 because each block's largest element is exact), and under
//     fixed ceilings: the model with E max|x| of a block of N(0, 1) (about 2.2, 2.8, 3.4 for
//     32, 128, 1024 values) gives 0.0050 / 0.0064 / 0.0077 (int8) and 0.091 / 0.115 / 0.140
//     (int4); measured 0.00535 / 0.00646 / 0.00786 and 0.0969 / 0.1172 / 0.1426 (E max² >
//     (E max)²); the ceilings are the measured values plus 10%.
//   - Error feedback: Σ_t applied_t = Σ_t true_t − residual_T exactly in real arithmetic;
//     in fp32 each round rounds y = g + r and r' = y − value once each, at most 2^-24·|y|
//     and 2^-24·|r'| <= 2^-24·s/2 apiece, so over T rounds an element may drift from the
//     identity by 2·T·2^-24·Y, Y the largest |y| of any element and round, and the norms by
//     √n times that (| ||a|| − ||b|| | <= ||a − b||).
#include "check.h"
#include "llmc/common.h"
#include "llmc/quant.h"
#include "llmc/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static rng_state rng;

static float *gaussian(int64_t n, double sigma) {
    float *x = alloc_floats((size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_normal(&rng) * sigma);
    return x;
}

static float float_of_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t bits_of_float(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float qmax_of(quant_kind k) { return k == QUANT_INT8 ? 127.0f : k == QUANT_INT4 ? 7.0f : 1.0f; }
static int bits_of(quant_kind k) { return k == QUANT_INT8 ? 8 : k == QUANT_INT4 ? 4 : 2; }
static int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

static float scale_at(const uint8_t *buf, int64_t b) {
    float s;
    memcpy(&s, buf + 4 * b, 4);
    return s;
}

static uint8_t *encode_new(quant_kind k, const float *x, int64_t n, int64_t block) {
    uint8_t *out = xmalloc(quant_encoded_bytes(k, n, block) + 1);
    quant_encode(k, x, n, block, out);
    return out;
}

// ---------------------------------------------------------------- the naive reference
// Written the obvious way, element by element: fmaxf and isfinite for the block max, roundf
// after the division, clamp after rounding, each nibble placed by its own index.

static void reference_encode(quant_kind k, const float *x, int64_t n, int64_t block, uint8_t *out) {
    if (k == QUANT_NONE) {
        memcpy(out, x, (size_t)n * 4);
        return;
    }
    int64_t nb = blocks_of(n, block);
    memset(out, 0, quant_encoded_bytes(k, n, block));
    for (int64_t b = 0; b < nb; b++) {
        int64_t start = b * block, end = start + block < n ? start + block : n;
        float m = 0;
        bool finite = true;
        for (int64_t i = start; i < end; i++) {
            if (!isfinite(x[i])) finite = false;
            m = fmaxf(m, fabsf(x[i]));
        }
        float s = finite ? m / qmax_of(k) : float_of_bits(0x7FC00000u);
        memcpy(out + 4 * b, &s, 4);
        for (int64_t i = start; i < end; i++) {
            int code = 0;
            if (finite && s != 0.0f) {
                float q = roundf(x[i] / s);
                code = (int)fminf(fmaxf(q, -qmax_of(k)), qmax_of(k));
            }
            if (k == QUANT_INT8)
                out[4 * nb + i] = (uint8_t)(int8_t)code;
            else if (k == QUANT_INT4)
                out[4 * nb + i / 2] |= (uint8_t)((code & 15) << (i % 2 == 0 ? 0 : 4));
            else
                out[4 * nb + i / 4] |= (uint8_t)((code & 3) << (2 * (i % 4)));
        }
    }
}

static void reference_decode(quant_kind k, const uint8_t *in, int64_t n, int64_t block, float *x) {
    int64_t nb = blocks_of(n, block);
    for (int64_t i = 0; i < n; i++) {
        if (k == QUANT_NONE) {
            memcpy(&x[i], in + 4 * i, 4);
            continue;
        }
        int code = k == QUANT_INT8   ? (int8_t)in[4 * nb + i]
                   : k == QUANT_INT4 ? (in[4 * nb + i / 2] >> (i % 2 ? 4 : 0)) & 15
                                     : (in[4 * nb + i / 4] >> (2 * (i % 4))) & 3;
        if (k == QUANT_INT4 && code > 7) code -= 16;
        if (k == QUANT_INT2 && code > 1) code -= 4;
        x[i] = (float)code * scale_at(in, i / block);
    }
}

// ---------------------------------------------------------------- names and sizes

static void test_names_and_sizes(void) {
    EXPECT(quant_kind_from_name("none") == QUANT_NONE, "none");
    EXPECT(quant_kind_from_name("int8") == QUANT_INT8, "int8");
    EXPECT(quant_kind_from_name("int4") == QUANT_INT4, "int4");
    EXPECT(quant_kind_from_name("int2") == QUANT_INT2, "int2");
    EXPECT(quant_kind_from_name("int3") == -1 && quant_kind_from_name("INT8") == -1 &&
               quant_kind_from_name("") == -1 && quant_kind_from_name(NULL) == -1,
           "unknown names are -1");
    for (int k = 0; k < 5; k++)
        EXPECT(quant_kind_from_name(quant_kind_name((quant_kind)k)) == k, "name of %d round-trips", k);
    EXPECT(quant_encoded_bytes(QUANT_NONE, 10, 4) == 40, "none: 4 bytes a value");
    EXPECT(quant_encoded_bytes(QUANT_INT8, 10, 4) == 3 * 4 + 10, "int8: 3 scales + 10 codes");
    EXPECT(quant_encoded_bytes(QUANT_INT4, 10, 4) == 3 * 4 + 5, "int4: 3 scales + 5 bytes");
    EXPECT(quant_encoded_bytes(QUANT_INT4, 11, 4) == 3 * 4 + 6, "int4, odd n: 3 scales + 6 bytes");
    EXPECT(quant_encoded_bytes(QUANT_INT2, 11, 4) == 3 * 4 + 3, "int2: 3 scales + 3 bytes (4 codes a byte)");
    EXPECT(quant_encoded_bytes(QUANT_INT8, 0, 4) == 0, "n = 0: nothing");
    EXPECT(quant_encoded_bytes(QUANT_INT8, 128, 128) == 4 + 128, "one whole block");
    uint8_t none[1] = {0xEE};
    float nothing[1] = {1.0f};
    for (int k = 0; k < 5; k++) {
        if (k == QUANT_BF16) continue;
        quant_encode((quant_kind)k, nothing, 0, 32, none);
        EXPECT(quant_encode_feedback((quant_kind)k, nothing, nothing, 0, 32, none) == 0.0 && none[0] == 0xEE &&
                   nothing[0] == 1.0f,
               "%s: n = 0 writes nothing", quant_kind_name((quant_kind)k));
    }
}

// ---------------------------------------------------------------- exact bytes

static void expect_bytes(const uint8_t *got, const uint8_t *want, size_t bytes, const char *what) {
    size_t i = 0;
    while (i < bytes && got[i] == want[i]) i++;
    EXPECT(i == bytes, "%s: byte %zu is %02x, want %02x", what, i, i < bytes ? got[i] : 0, i < bytes ? want[i] : 0);
}

static void test_hand_made_layout(void) {
    // int8, block 3, n 5: scales first (1.0, 2.0), then the codes. 2.5 -> 3 and -63.5 -> -64
    // are ties, rounded away from zero (to even they would be 2 and -64); the last block is
    // short (2 values).
    const float x8[5] = {127.0f, -63.5f, 2.5f, 0.0f, -254.0f};
    const uint8_t want8[13] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40, 0x7F, 0xC0, 0x03, 0x00, 0x81};
    EXPECT(quant_encoded_bytes(QUANT_INT8, 5, 3) == sizeof want8, "int8 example size");
    uint8_t got[32];
    memset(got, 0xEE, sizeof got);
    quant_encode(QUANT_INT8, x8, 5, 3, got);
    expect_bytes(got, want8, sizeof want8, "int8 example");
    EXPECT(got[sizeof want8] == 0xEE, "int8 encode writes past its size");
    float back[5];
    quant_decode(QUANT_INT8, want8, 5, 3, back);
    const float want_back8[5] = {127.0f, -64.0f, 3.0f, 0.0f, -254.0f};
    EXPECT(memcmp(back, want_back8, sizeof back) == 0, "int8 example decodes to code * scale");

    // int4, block 2, n 5: scales 1.0, 0.25, 2.0; codes 7, -4 | 7, -1 | -7. Element 2i in the
    // low nibble: bytes 0xC7, 0xF7, and 0x09 with the unused high nibble zero.
    const float x4[5] = {7.0f, -3.5f, 1.75f, -0.25f, -14.0f};
    const uint8_t want4[15] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x80, 0x3E, 0x00,
                               0x00, 0x00, 0x40, 0xC7, 0xF7, 0x09};
    EXPECT(quant_encoded_bytes(QUANT_INT4, 5, 2) == sizeof want4, "int4 example size");
    memset(got, 0xEE, sizeof got);
    quant_encode(QUANT_INT4, x4, 5, 2, got);
    expect_bytes(got, want4, sizeof want4, "int4 example");
    EXPECT(got[sizeof want4] == 0xEE, "int4 encode writes past its size");
    quant_decode(QUANT_INT4, want4, 5, 2, back);
    const float want_back4[5] = {7.0f, -4.0f, 1.75f, -0.25f, -14.0f};
    EXPECT(memcmp(back, want_back4, sizeof back) == 0, "int4 example decodes to code * scale");

    // none: the float32 values as they are.
    memset(got, 0xEE, sizeof got);
    quant_encode(QUANT_NONE, x8, 5, 3, got);
    EXPECT(memcmp(got, x8, sizeof x8) == 0 && got[sizeof x8] == 0xEE, "none is the raw floats");
    quant_decode(QUANT_NONE, got, 5, 3, back);
    EXPECT(memcmp(back, x8, sizeof x8) == 0, "none decodes to the raw floats");
}

// ---------------------------------------------------------------- against the reference

// Data that exercises the corners: Gaussian; exact ties (halves of a power-of-two scale);
// subnormals, whose max/qmax may underflow to 0 or round so far that y/s passes qmax.
static void fill(float *x, int64_t n, int64_t block, int pattern) {
    for (int64_t i = 0; i < n; i++) {
        switch (pattern) {
        case 0: x[i] = (float)rng_normal(&rng); break;
        case 1: // block max 127·2^-3 (int8) so the scale is 2^-3 exactly and y/s = j/2: ties
            x[i] = i % block == 0 ? 127.0f / 8 : (float)((int)(rng_next(&rng) % 509) - 254) / 16.0f;
            break;
        case 2: x[i] = i % block == 0 ? 7.0f / 4 : (float)((int)(rng_next(&rng) % 29) - 14) / 8.0f; break;
        default: x[i] = float_of_bits((uint32_t)(rng_next(&rng) % 400)) * (rng_next(&rng) % 2 ? 1.0f : -1.0f);
        }
    }
}

static void test_against_reference(void) {
    const int64_t sizes[] = {1, 2, 31, 32, 33, 1000, 8191, 8192, 8193, 20001};
    const int64_t blocks[] = {1, 2, 3, 7, 32, 128, 1024, 5000};
    int mismatches = 0, decode_mismatches = 0, cases = 0;
    for (int k = 0; k < 5; k++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++)
                for (int pattern = 0; pattern < 4; pattern++) {
                    int64_t n = sizes[si], block = blocks[bi];
                    if (k == QUANT_BF16) continue;
                    float *x = alloc_floats((size_t)n);
                    fill(x, n, block, pattern);
                    size_t bytes = quant_encoded_bytes((quant_kind)k, n, block);
                    uint8_t *want = xmalloc(bytes), *got = encode_new((quant_kind)k, x, n, block);
                    reference_encode((quant_kind)k, x, n, block, want);
                    cases++;
                    if (memcmp(got, want, bytes) != 0 && ++mismatches <= 5)
                        EXPECT(0, "%s n=%lld block=%lld pattern %d differs from the reference",
                               quant_kind_name((quant_kind)k), (long long)n, (long long)block, pattern);
                    float *back = alloc_floats((size_t)n), *want_back = alloc_floats((size_t)n);
                    quant_decode((quant_kind)k, want, n, block, back);
                    reference_decode((quant_kind)k, want, n, block, want_back);
                    if (memcmp(back, want_back, sizeof(float) * n) != 0 && ++decode_mismatches <= 5)
                        EXPECT(0, "%s n=%lld block=%lld pattern %d decodes unlike the reference",
                               quant_kind_name((quant_kind)k), (long long)n, (long long)block, pattern);
                    free(x), free(want), free(got), free(back), free(want_back);
                }
    EXPECT(mismatches == 0, "%d of %d cases differ from the reference", mismatches, cases);
    EXPECT(decode_mismatches == 0, "%d of %d cases decode unlike the reference", decode_mismatches, cases);
}

// ---------------------------------------------------------------- error bounds

static double dot_error(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s;
}

static double norm2(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

// Number of elements whose decoded value is further than (1/2 + 2^-15)·s from x.
static int64_t outside_elementwise_bound(const uint8_t *enc, const float *x, const float *back, int64_t n,
                                         int64_t block) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float s = scale_at(enc, i / block);
        if (fabs((double)back[i] - x[i]) > (0.5 + 1.0 / 32768) * s) bad++;
    }
    return bad;
}

static void test_round_trip_bounds(void) {
    // n is not a multiple of any block size, and odd (the int4 tail byte).
    const int64_t n = (1 << 20) + 333, block_sizes[3] = {32, 128, 1024};
    const double ceiling[2][3] = {{0.0059, 0.0071, 0.0087}, {0.107, 0.129, 0.157}};
    float *x = gaussian(n, 1.0), *back = alloc_floats((size_t)n);
    for (int ki = 0; ki < 2; ki++)
        for (int bi = 0; bi < 3; bi++) {
            quant_kind k = ki == 0 ? QUANT_INT8 : QUANT_INT4;
            int64_t block = block_sizes[bi];
            uint8_t *enc = encode_new(k, x, n, block);
            quant_decode(k, enc, n, block, back);
            int64_t bad = outside_elementwise_bound(enc, x, back, n, block);
            EXPECT(bad == 0, "%s block %lld: %lld elements beyond s/2", quant_kind_name(k), (long long)block,
                   (long long)bad);
            double model = 0; // Σ len·s²/12
            for (int64_t b = 0; b < blocks_of(n, block); b++) {
                double s = scale_at(enc, b), len = (double)(b * block + block <= n ? block : n - b * block);
                model += len * s * s / 12;
            }
            double rel = sqrt(dot_error(back, x, n) / norm2(x, n)), rel_model = sqrt(model / norm2(x, n));
            printf("  %s block %4lld: relative L2 error %.5f (uniform model %.5f, ratio %.3f)\n", quant_kind_name(k),
                   (long long)block, rel, rel_model, rel / rel_model);
            EXPECT(rel >= 0.85 * rel_model && rel <= 1.05 * rel_model, "%s block %lld: %.5f vs model %.5f",
                   quant_kind_name(k), (long long)block, rel, rel_model);
            EXPECT(rel <= ceiling[ki][bi], "%s block %lld: %.5f over the ceiling %.4f", quant_kind_name(k),
                   (long long)block, rel, ceiling[ki][bi]);
            free(enc);
        }
    free(x), free(back);
}

static void test_zero_blocks(void) {
    const int64_t n = 1000, block = 100;
    for (int k = 1; k < 3; k++) {
        float *x = gaussian(n, 1.0), back[1000];
        for (int64_t i = 300; i < 500; i++) x[i] = (i % 2) ? 0.0f : -0.0f; // blocks 3 and 4
        uint8_t *enc = encode_new((quant_kind)k, x, n, block);
        EXPECT(bits_of_float(scale_at(enc, 3)) == 0 && bits_of_float(scale_at(enc, 4)) == 0,
               "%s: a zero block has scale +0", quant_kind_name((quant_kind)k));
        const uint8_t *codes = enc + 4 * 10;
        bool codes_zero = true;
        for (int64_t i = 300; i < 500; i++)
            if ((k == QUANT_INT8 ? codes[i] : (codes[i / 2] >> (4 * (i % 2))) & 15) != 0) codes_zero = false;
        EXPECT(codes_zero, "%s: a zero block has codes 0", quant_kind_name((quant_kind)k));
        quant_decode((quant_kind)k, enc, n, block, back);
        bool back_zero = true;
        for (int64_t i = 300; i < 500; i++) back_zero &= back[i] == 0.0f;
        EXPECT(back_zero, "%s: a zero block decodes to zeros", quant_kind_name((quant_kind)k));
        memset(x, 0, sizeof(float) * n);
        float residual[1000] = {0};
        EXPECT(quant_encode_feedback((quant_kind)k, x, residual, n, block, enc) == 0.0,
               "%s: all zeros has relative error 0", quant_kind_name((quant_kind)k));
        free(x), free(enc);
    }
}

static void test_outlier(void) {
    // One value of 1e6 among N(0, 1): its block's scale becomes 1e6/127 (int8), every other
    // value of that block (|x| << s/2 ≈ 3937) decodes to 0, the outlier itself within the
    // elementwise bound, and the other blocks' bytes do not change at all.
    const int64_t n = 4096, block = 128, at = 1000;
    for (int k = 1; k < 3; k++) {
        float *x = gaussian(n, 1.0), back[4096];
        uint8_t *plain = encode_new((quant_kind)k, x, n, block);
        x[at] = 1e6f;
        uint8_t *enc = encode_new((quant_kind)k, x, n, block);
        quant_decode((quant_kind)k, enc, n, block, back);
        int64_t b = at / block;
        EXPECT(scale_at(enc, b) == 1e6f / qmax_of((quant_kind)k), "outlier block scale");
        EXPECT(fabs(back[at] - 1e6) <= 1e6 * 1e-6, "outlier decodes to %g", back[at]);
        bool rest_zero = true;
        for (int64_t i = b * block; i < (b + 1) * block; i++)
            if (i != at) rest_zero &= back[i] == 0.0f;
        EXPECT(rest_zero, "%s: the outlier's block neighbours decode to 0", quant_kind_name((quant_kind)k));
        bool others_same = memcmp(enc, plain, 4 * (size_t)b) == 0 &&
                           memcmp(enc + 4 * (b + 1), plain + 4 * (b + 1), 4 * (size_t)(n / block - b - 1)) == 0;
        size_t per = k == QUANT_INT8 ? 1 : 2; // values per code byte; block is even
        const uint8_t *c1 = enc + 4 * (n / block), *c0 = plain + 4 * (n / block);
        others_same &= memcmp(c1, c0, (size_t)(b * block) / per) == 0;
        others_same &= memcmp(c1 + (b + 1) * block / per, c0 + (b + 1) * block / per,
                              (size_t)(n - (b + 1) * block) / per) == 0;
        EXPECT(others_same, "%s: an outlier changes only its own block", quant_kind_name((quant_kind)k));
        free(x), free(plain), free(enc);
    }
}

static void test_odd_tail(void) {
    // int4 with odd n: the last byte holds one code in its low nibble, the high nibble is 0.
    float x[7] = {1, 2, 3, 4, 5, 6, -7};
    uint8_t enc[4 + 4];
    quant_encode(QUANT_INT4, x, 7, 7, enc);
    EXPECT(enc[4 + 3] == 0x09, "odd tail byte %02x, want 09", enc[4 + 3]);
}

static void test_non_finite(void) {
    // A block holding NaN or Inf: scale NaN (0x7FC00000), codes 0, decodes to NaN; the
    // other blocks are untouched; no crash; with feedback the error comes back NaN.
    const int64_t n = 300, block = 100;
    for (int k = 1; k < 3; k++)
        for (int which = 0; which < 3; which++) {
            float *x = gaussian(n, 1.0), back[300];
            uint8_t *plain = encode_new((quant_kind)k, x, n, block);
            x[150] = which == 0 ? NAN : which == 1 ? INFINITY : -INFINITY;
            uint8_t *enc = encode_new((quant_kind)k, x, n, block);
            EXPECT(bits_of_float(scale_at(enc, 1)) == 0x7FC00000u, "%s: bad block scale %08x",
                   quant_kind_name((quant_kind)k), bits_of_float(scale_at(enc, 1)));
            EXPECT(scale_at(enc, 0) == scale_at(plain, 0) && scale_at(enc, 2) == scale_at(plain, 2),
                   "good blocks keep their scale");
            quant_decode((quant_kind)k, enc, n, block, back);
            bool nan_block = true, finite_rest = true;
            for (int64_t i = 0; i < n; i++) {
                if (i / block == 1) nan_block &= isnan(back[i]) != 0;
                else finite_rest &= isfinite(back[i]) != 0;
            }
            EXPECT(nan_block && finite_rest, "%s: the bad block decodes to NaN, only it", quant_kind_name((quant_kind)k));
            float residual[300] = {0};
            EXPECT(isnan(quant_encode_feedback((quant_kind)k, x, residual, n, block, enc)), "feedback error NaN");
            free(x), free(plain), free(enc);
        }
}

// ---------------------------------------------------------------- threads

static void test_threads(void) {
#ifdef _OPENMP
    const int64_t n = 100003;
    const int64_t blocks[] = {32, 1001, 100003};
    float *x = gaussian(n, 1.0), *r1 = gaussian(n, 0.01), *r2 = alloc_floats((size_t)n);
    float *d1 = alloc_floats((size_t)n), *d2 = alloc_floats((size_t)n);
    float *a1 = alloc_floats((size_t)n), *a2 = alloc_floats((size_t)n);
    memcpy(r2, r1, sizeof(float) * n);
    int threads = omp_get_max_threads();
    for (int k = 0; k < 3; k++)
        for (int bi = 0; bi < 3; bi++) {
            int64_t block = blocks[bi];
            size_t bytes = quant_encoded_bytes((quant_kind)k, n, block);
            uint8_t *e1 = xmalloc(bytes), *e2 = xmalloc(bytes), *f1 = xmalloc(bytes), *f2 = xmalloc(bytes);
            omp_set_num_threads(1);
            quant_encode((quant_kind)k, x, n, block, e1);
            double err1 = quant_encode_feedback((quant_kind)k, x, r1, n, block, f1);
            quant_decode((quant_kind)k, e1, n, block, d1);
            const uint8_t *ins1[2] = {e1, f1}, *ins2[2] = {e2, f2};
            quant_mean((quant_kind)k, ins1, 2, n, block, NULL, a1);
            omp_set_num_threads(2);
            quant_encode((quant_kind)k, x, n, block, e2);
            double err2 = quant_encode_feedback((quant_kind)k, x, r2, n, block, f2);
            quant_decode((quant_kind)k, e2, n, block, d2);
            quant_mean((quant_kind)k, ins2, 2, n, block, NULL, a2);
            const char *name = quant_kind_name((quant_kind)k);
            EXPECT(memcmp(e1, e2, bytes) == 0, "%s block %lld: encode differs on 1 and 2 threads", name, (long long)block);
            EXPECT(memcmp(f1, f2, bytes) == 0, "%s block %lld: feedback encode differs", name, (long long)block);
            EXPECT(memcmp(r1, r2, sizeof(float) * n) == 0, "%s block %lld: residual differs", name, (long long)block);
            EXPECT(memcmp(&err1, &err2, sizeof err1) == 0, "%s block %lld: returned error differs", name,
                   (long long)block);
            EXPECT(memcmp(d1, d2, sizeof(float) * n) == 0, "%s block %lld: decode differs", name, (long long)block);
            EXPECT(memcmp(a1, a2, sizeof(float) * n) == 0, "%s block %lld: the reducer's mean differs", name,
                   (long long)block);
            free(e1), free(e2), free(f1), free(f2);
        }
    omp_set_num_threads(threads);
    free(x), free(r1), free(r2), free(d1), free(d2), free(a1), free(a2);
#else
    printf("  (no OpenMP: thread-count test skipped)\n");
#endif
}

// ---------------------------------------------------------------- error feedback

// The returned error equals ||decode(out) - x|| / ||x|| computed here.
static void test_feedback_return(void) {
    const int64_t n = 5003, block = 61; // segments of every length mod 8
    float *x = gaussian(n, 1.0), *r = gaussian(n, 0.05), *back = alloc_floats((size_t)n);
    for (int k = 0; k < 3; k++) {
        float *r_copy = alloc_floats((size_t)n);
        memcpy(r_copy, r, sizeof(float) * n);
        uint8_t *enc = xmalloc(quant_encoded_bytes((quant_kind)k, n, block));
        double got = quant_encode_feedback((quant_kind)k, x, r_copy, n, block, enc);
        quant_decode((quant_kind)k, enc, n, block, back);
        double want = sqrt(dot_error(back, x, n) / norm2(x, n));
        EXPECT(fabs(got - want) <= 1e-9 * want, "%s: returned %.12g, recomputed %.12g", quant_kind_name((quant_kind)k),
               got, want);
        // The residual is what was not sent: (x + r) - decoded, to the rounding of fp32.
        bool identity = true;
        for (int64_t i = 0; i < n; i++) {
            float y = x[i] + r[i];
            identity &= r_copy[i] == y - back[i];
        }
        EXPECT(identity, "%s: residual != (x + r) - decode(out)", quant_kind_name((quant_kind)k));
        if (k == QUANT_NONE) {
            bool zero = true;
            for (int64_t i = 0; i < n; i++) zero &= r_copy[i] == 0.0f;
            EXPECT(zero, "none: the residual becomes 0");
        }
        free(r_copy), free(enc);
    }
    free(x), free(r), free(back);
}

typedef struct {
    double err_at_25, err_at_100; // ||Σ applied − Σ true|| after 25 and 100 rounds
    double residual_norm;         // ||residual_100|| (EF only)
    double max_round_err;         // max over rounds of ||applied_t − (g_t + r_{t-1})||
    int64_t identity_bad;         // elements where Σ applied − Σ true + residual drifts past 2·T·2^-24·Y
    double identity_slack;        // √n · 2·T·2^-24·Y: the most the two norms may differ
    int64_t last_round_bad;       // elements where |residual_100| exceeds the elementwise bound
} feedback_run;

// 100 rounds of g_t = mean(t) + N(0, 1): the mean drifts slowly (a sine of period 200 rounds,
// amplitude 0.3, a different phase per element), like the slowly turning direction of
// DiLoCo's outer gradients under their noise.
static feedback_run run_rounds(quant_kind k, bool feedback) {
    const int64_t n = 16384, block = 128;
    const int rounds = 100;
    feedback_run out = {0};
    double max_y = 0;
    float *g = alloc_floats(n), *r = alloc_floats(n), *y = alloc_floats(n), *applied = alloc_floats(n);
    double *sum_applied = xcalloc(n, sizeof(double)), *sum_true = xcalloc(n, sizeof(double)),
           *phase = xmalloc(sizeof(double) * n);
    uint8_t *enc = xmalloc(quant_encoded_bytes(k, n, block));
    for (int64_t i = 0; i < n; i++) phase[i] = 6.283185307179586 * rng_uniform(&rng);
    for (int t = 1; t <= rounds; t++) {
        for (int64_t i = 0; i < n; i++) {
            g[i] = (float)(0.3 * sin(6.283185307179586 * t / 200 + phase[i]) + rng_normal(&rng));
            y[i] = feedback ? g[i] + r[i] : g[i];
            max_y = fmax(max_y, fabs(y[i]));
        }
        quant_encode_feedback(k, g, feedback ? r : NULL, n, block, enc);
        quant_decode(k, enc, n, block, applied);
        out.max_round_err = fmax(out.max_round_err, sqrt(dot_error(applied, y, n)));
        double err = 0;
        for (int64_t i = 0; i < n; i++) {
            sum_applied[i] += applied[i];
            sum_true[i] += g[i];
            err += (sum_applied[i] - sum_true[i]) * (sum_applied[i] - sum_true[i]);
        }
        if (t == 25) out.err_at_25 = sqrt(err);
        if (t == rounds) out.err_at_100 = sqrt(err);
    }
    double slack = 2.0 * rounds * max_y / 16777216.0;
    out.identity_slack = sqrt((double)n) * slack;
    for (int64_t i = 0; i < n; i++) {
        out.residual_norm += (double)r[i] * r[i];
        double drift = sum_applied[i] - sum_true[i] + r[i];
        if (fabs(drift) > slack) out.identity_bad++;
        if (fabs(r[i]) > (0.5 + 1.0 / 32768) * scale_at(enc, i / block)) out.last_round_bad++;
    }
    out.residual_norm = sqrt(out.residual_norm);
    free(g), free(r), free(y), free(applied), free(sum_applied), free(sum_true), free(phase), free(enc);
    return out;
}

static void test_error_feedback(void) {
    for (int k = 1; k < 3; k++) {
        const char *name = quant_kind_name((quant_kind)k);
        feedback_run ef = run_rounds((quant_kind)k, true), plain = run_rounds((quant_kind)k, false);
        printf("  %s, 100 rounds: ||Σ applied − Σ true|| with EF %.4g (25 rounds: %.4g), without %.4g (25 rounds: "
               "%.4g); one round's error up to %.4g\n",
               name, ef.err_at_100, ef.err_at_25, plain.err_at_100, plain.err_at_25, ef.max_round_err);
        // With EF the error of the sums is the last residual, to fp32 rounding...
        EXPECT(ef.identity_bad == 0, "%s: Σ applied − Σ true != −residual at %lld elements", name,
               (long long)ef.identity_bad);
        EXPECT(fabs(ef.err_at_100 - ef.residual_norm) <= ef.identity_slack, "%s: %.8g vs ||residual|| %.8g", name,
               ef.err_at_100, ef.residual_norm);
        // ...which is one round's quantization error: elementwise within s/2 of the last round,
        // and in norm no more than the largest single-round error.
        EXPECT(ef.last_round_bad == 0, "%s: residual beyond s/2 at %lld elements", name, (long long)ef.last_round_bad);
        EXPECT(ef.err_at_100 <= ef.max_round_err, "%s: EF error %.4g > one round's %.4g", name, ef.err_at_100,
               ef.max_round_err);
        // Without EF the errors of the rounds add up: about √T times one round's (independent
        // errors), so 100 rounds hold about 2x the error of 25 and 10x the EF error.
        EXPECT(plain.err_at_100 >= 1.6 * plain.err_at_25, "%s: without EF the error does not grow (%.4g -> %.4g)",
               name, plain.err_at_25, plain.err_at_100);
        EXPECT(plain.err_at_100 >= 5 * ef.err_at_100, "%s: EF %.4g is not much better than none %.4g", name,
               ef.err_at_100, plain.err_at_100);
    }
}

// ---------------------------------------------------------------- segments, bf16, the hub's mean

// The segmented layout is each segment encoded on its own, end to end: the same bytes as
// encoding each slice by hand; decode gives back what quant_decode of each slice gives; with
// feedback, the residual is what per-slice quant_encode_feedback leaves.
static void test_segments(void) {
    EXPECT(quant_segment_values(128) == 262144, "segment of block 128: 262144 values");
    EXPECT(quant_segment_values(100) % 100 == 0 && quant_segment_values(100) % 2 == 0, "segment: whole blocks, even");
    EXPECT(quant_segment_values(1 << 20) == 1 << 21, "a block above 2^17: two blocks per segment");
    const int64_t block = 6, seg = 18, n = 50;   // two whole segments and a short one of 14
    quant_kind kinds[] = {QUANT_NONE, QUANT_INT8, QUANT_INT4, QUANT_BF16};
    for (int ki = 0; ki < 4; ki++) {
        quant_kind k = kinds[ki];
        float *x = gaussian(n, 1.0), *r1 = (float *)xcalloc(n, sizeof(float)), *r2 = (float *)xcalloc(n, sizeof(float));
        for (int64_t i = 0; i < n; i++) r1[i] = r2[i] = 0.01f * (float)(i % 7);
        size_t total = quant_segmented_bytes(k, n, block, seg);
        size_t by_hand = 2 * quant_encoded_bytes(k, seg, block) + quant_encoded_bytes(k, n - 2 * seg, block);
        EXPECT(total == by_hand, "%s: segmented bytes %zu = %zu", quant_kind_name(k), total, by_hand);
        uint8_t *a = (uint8_t *)xmalloc(total), *b = (uint8_t *)xmalloc(total);
        quant_encode_segments(k, x, r1, n, block, seg, a);
        size_t at = 0;
        for (int64_t s0 = 0; s0 < n; s0 += seg) {
            int64_t len = n - s0 < seg ? n - s0 : seg;
            quant_encode_feedback(k, x + s0, r2 + s0, len, block, b + at);
            at += quant_encoded_bytes(k, len, block);
        }
        EXPECT(memcmp(a, b, total) == 0, "%s: segments = slices encoded one by one", quant_kind_name(k));
        EXPECT(memcmp(r1, r2, n * sizeof(float)) == 0, "%s: the same residual", quant_kind_name(k));
        float *y = (float *)xmalloc(n * sizeof(float)), *z = (float *)xmalloc(n * sizeof(float));
        quant_decode_segments(k, a, n, block, seg, y);
        at = 0;
        for (int64_t s0 = 0; s0 < n; s0 += seg) {
            int64_t len = n - s0 < seg ? n - s0 : seg;
            quant_decode(k, b + at, len, block, z + s0);
            at += quant_encoded_bytes(k, len, block);
        }
        EXPECT(memcmp(y, z, n * sizeof(float)) == 0, "%s: segmented decode", quant_kind_name(k));
        free(x), free(r1), free(r2), free(a), free(b), free(y), free(z);
    }
}

// bf16: round to nearest, ties to even, on the fp32 bits; NaN -> 0x7FC0; Inf stays Inf.
static void test_bf16(void) {
    EXPECT(quant_kind_from_name("bf16") == QUANT_BF16 && quant_encoded_bytes(QUANT_BF16, 5, 2) == 10, "bf16: 2 bytes");
    uint32_t in[] = {0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F808001u, 0x7F800000u, 0x7FC12345u, 0xFF7FFFFFu, 0x00000001u};
    uint16_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7FC0, 0xFF80, 0x0000};
    //                 1.0     tie->even tie->even  above tie  Inf     NaN     -FLT_MAX rounds to -Inf   tiny
    int n = (int)(sizeof in / sizeof in[0]);
    float x[8];
    uint16_t out[8];
    for (int i = 0; i < n; i++) x[i] = float_of_bits(in[i]);
    quant_encode(QUANT_BF16, x, n, 1, (uint8_t *)out);
    for (int i = 0; i < n; i++) EXPECT(out[i] == want[i], "bf16 of %08x: %04x, want %04x", in[i], out[i], want[i]);
    EXPECT(!quant_is_finite(QUANT_BF16, (const uint8_t *)out, n, 1) && quant_is_finite(QUANT_BF16, (const uint8_t *)out, 4, 1),
           "bf16: Inf/NaN are not finite, the rest is");
}

// The hub's mean: decoded values summed in fp32 in the order given, then one division. The
// order matters in fp32 (1e8 + 1 - 1e8 = 0, 1e8 - 1e8 + 1 = 1): the function must follow it.
static void test_mean(void) {
    float a[2] = {1e8f, 3.0f}, b[2] = {1.0f, 5.0f}, c[2] = {-1e8f, 7.0f};
    const uint8_t *abc[3] = {(const uint8_t *)a, (const uint8_t *)b, (const uint8_t *)c};
    const uint8_t *acb[3] = {(const uint8_t *)a, (const uint8_t *)c, (const uint8_t *)b};
    float m1[2], m2[2];
    quant_mean(QUANT_NONE, abc, 3, 2, 2, NULL, m1);
    quant_mean(QUANT_NONE, acb, 3, 2, 2, NULL, m2);
    EXPECT(m1[0] == 0.0f && m2[0] == 1.0f / 3.0f, "mean in the given order: %g (a+b+c), %g (a+c+b)", m1[0], m2[0]);
    EXPECT(m1[1] == 5.0f && m2[1] == 5.0f, "mean of 3, 5, 7 = 5");
    // A NaN contribution is left out and said so; none left: NaN out.
    float nan[2] = {NAN, 1.0f};
    const uint8_t *with_nan[3] = {(const uint8_t *)a, (const uint8_t *)nan, (const uint8_t *)b};
    float scratch[2], out[2];
    quant_effect eff[3];
    quant_reduction plain = {.up = QUANT_NONE, .down = QUANT_NONE, .block = 2, .bound = 3.0f};   // none: not bounded
    int dropped = quant_reduce_segment(&plain, with_nan, 3, 2, NULL, scratch, (uint8_t *)out, eff);
    EXPECT(dropped == 1 && eff[1].left_out && !eff[0].left_out && !eff[2].left_out && eff[0].factor == 1.0f,
           "the NaN contribution is left out (weights, codec none: no bound)");
    EXPECT(out[1] == 4.0f, "the mean of the others: 4 = (3 + 5) / 2 (%g)", out[1]);
    const uint8_t *only_nan[1] = {(const uint8_t *)nan};
    quant_reduce_segment(&plain, only_nan, 1, 2, NULL, scratch, (uint8_t *)out, NULL);
    EXPECT(isnan(out[0]) && isnan(out[1]), "no finite contribution: a NaN segment");
    // int8 up, int8 down with the hub's feedback: the residual is what the mean's encoding lost.
    const int64_t n = 300, block = 32;
    float *x0 = gaussian(n, 1.0), *x1 = gaussian(n, 2.0), *res = (float *)xcalloc(n, sizeof(float));
    size_t bytes = quant_encoded_bytes(QUANT_INT8, n, block);
    uint8_t *e0 = (uint8_t *)xmalloc(bytes), *e1 = (uint8_t *)xmalloc(bytes), *em = (uint8_t *)xmalloc(bytes);
    quant_encode(QUANT_INT8, x0, n, block, e0);
    quant_encode(QUANT_INT8, x1, n, block, e1);
    const uint8_t *ins[2] = {e0, e1};
    float *mean = (float *)xmalloc(n * sizeof(float)), *sent = (float *)xmalloc(n * sizeof(float));
    float *sc = (float *)xmalloc(n * sizeof(float));
    quant_mean(QUANT_INT8, ins, 2, n, block, NULL, mean);
    quant_reduction q8 = {.up = QUANT_INT8, .down = QUANT_INT8, .block = block, .bound = 0.0f};
    quant_reduce_segment(&q8, ins, 2, n, res, sc, em, NULL);
    quant_decode(QUANT_INT8, em, n, block, sent);
    bool exact = true;
    for (int64_t i = 0; i < n; i++) exact = exact && res[i] == mean[i] - sent[i];
    EXPECT(exact, "hub feedback: residual = mean - decode(sent), bit for bit");
    free(x0), free(x1), free(res), free(e0), free(e1), free(em), free(mean), free(sent), free(sc);
}

// A mean that overflows, or a scale that decodes past FLT_MAX. (1) Two finite int8
// contributions of 2e38 each: their fp32 sum is Inf. The mean goes out non-finite (every
// replica skips the step), but the hub's downlink residual must stay as it was: it took
// Inf − NaN = NaN and made every later round's mean of the segment NaN (the step skipped for
// good). (2) An int8 block with a finite scale of 1e37 decodes to 127e37 = Inf: not finite,
// so it is left out of the mean (it passed, and with the bound took factor 0 · Inf = NaN).
static void test_mean_overflow(void) {
    const int64_t n = 256, block = 32;
    quant_codec c = QUANT_INT8;
    size_t bytes = quant_encoded_bytes(c, n, block);
    float *x0 = gaussian(n, 1e-3), *x1 = gaussian(n, 1e-3), *x2 = gaussian(n, 1e-3);
    x0[5] = 2e38f, x1[5] = 2e38f;
    uint8_t *e0 = (uint8_t *)xmalloc(bytes), *e1 = (uint8_t *)xmalloc(bytes), *e2 = (uint8_t *)xmalloc(bytes);
    uint8_t *out = (uint8_t *)xmalloc(bytes);
    quant_encode(c, x0, n, block, e0), quant_encode(c, x1, n, block, e1), quant_encode(c, x2, n, block, e2);
    float *res = (float *)xcalloc(n, sizeof(float)), *sc = (float *)xmalloc(n * sizeof(float));
    float *mean = (float *)xmalloc(n * sizeof(float));
    const uint8_t *ins[3] = {e0, e1, e2};
    quant_reduction q = {.up = c, .down = c, .block = block, .bound = 0.0f};
    EXPECT(quant_is_finite(c, e0, n, block) && quant_is_finite(c, e1, n, block), "2e38 encodes to finite int8 blocks");
    quant_reduce_segment(&q, ins, 3, n, res, sc, out, NULL);
    EXPECT(!quant_is_finite(c, out, n, block), "their sum overflows: the mean is not finite (every replica skips)");
    bool res_finite = true;
    for (int64_t i = 0; i < n; i++) res_finite &= isfinite(res[i]) != 0;
    EXPECT(res_finite, "... and the hub's downlink residual stays finite");
    quant_encode(c, x2, n, block, e0), quant_encode(c, x2, n, block, e1);   // the next round: ordinary
    quant_reduce_segment(&q, ins, 3, n, res, sc, out, NULL);
    EXPECT(quant_is_finite(c, out, n, block), "the next round's mean of ordinary contributions is finite");
    // (2) block 0's scale made 1e37 by hand: its codes (one of 127) decode to Inf.
    quant_encode(c, x2, n, block, e0);
    float big = 1e37f;
    memcpy(e0, &big, sizeof big);
    e0[(n + block - 1) / block * 4] = 127;   // value 0's code (after the scales)
    EXPECT(!quant_is_finite(c, e0, n, block), "an int8 scale of 1e37 (127 · 1e37 = Inf) is not finite");
    quant_effect eff[3];
    quant_reduction bounded = {.up = c, .down = c, .block = block, .bound = 3.0f};
    EXPECT(quant_reduce_segment(&bounded, ins, 3, n, NULL, sc, out, eff) == 1 && eff[0].left_out &&
               quant_is_finite(c, out, n, block),
           "... so it is left out of the mean, which stays finite");
    free(x0), free(x1), free(x2), free(e0), free(e1), free(e2), free(out), free(res), free(sc), free(mean);
}

// The bound: a contribution whose norm is above bound × the lower median of the norms is
// scaled to exactly that norm (within fp32 rounding); the others are untouched, bit for bit.
static void test_bound(void) {
    const int64_t n = 1000, block = 100;
    float *g[4];
    uint8_t *e[4];
    const uint8_t *ins[4];
    size_t bytes = quant_encoded_bytes(QUANT_INT8, n, block);
    for (int j = 0; j < 4; j++) {
        g[j] = gaussian(n, 1.0);
        if (j == 2)
            for (int64_t i = 0; i < n; i++) g[j][i] *= 100.0f;   // hostile: 100 times
        e[j] = (uint8_t *)xmalloc(bytes);
        quant_encode(QUANT_INT8, g[j], n, block, e[j]);
        ins[j] = e[j];
    }
    double norms[4], sorted[4];
    for (int j = 0; j < 4; j++) sorted[j] = norms[j] = quant_norm(QUANT_INT8, e[j], n, block);
    for (int j = 1; j < 4; j++)
        for (int i = j; i > 0 && sorted[i - 1] > sorted[i]; i--) {
            double t = sorted[i];
            sorted[i] = sorted[i - 1], sorted[i - 1] = t;
        }
    quant_reduction q = {.up = QUANT_INT8, .down = QUANT_NONE, .block = block, .bound = 3.0f};
    quant_effect eff[4];
    float *mean = (float *)xmalloc(n * sizeof(float)), *sc = (float *)xmalloc(n * sizeof(float));
    float *plain = (float *)xmalloc(n * sizeof(float));
    int touched = quant_reduce_segment(&q, ins, 4, n, NULL, sc, (uint8_t *)mean, eff);
    double want = 3.0 * sorted[1] / norms[2];
    EXPECT(touched == 1 && eff[2].factor == (float)want && eff[0].factor == 1.0f && eff[1].factor == 1.0f &&
               eff[3].factor == 1.0f,
           "bound: only the hostile one is scaled, by 3 x lower median / its norm (%g, want %g)", eff[2].factor, want);
    // The same mean as scaling by hand, and the bounded contribution's norm is 3 x the median.
    float factors[4] = {1, 1, eff[2].factor, 1};
    quant_mean(QUANT_INT8, ins, 4, n, block, factors, plain);
    EXPECT(memcmp(plain, mean, n * sizeof(float)) == 0, "bound: the mean of the scaled contributions");
    float *v = (float *)xmalloc(n * sizeof(float));
    quant_decode(QUANT_INT8, e[2], n, block, v);
    double s2 = 0;
    for (int64_t i = 0; i < n; i++) s2 += (double)(v[i] * eff[2].factor) * (double)(v[i] * eff[2].factor);
    EXPECT(fabs(sqrt(s2) / (3.0 * sorted[1]) - 1.0) < 1e-6, "bound: its norm is now 3 x the median (%.8f)",
           sqrt(s2) / (3.0 * sorted[1]));
    q.bound = 0.0f;
    EXPECT(quant_reduce_segment(&q, ins, 4, n, NULL, sc, (uint8_t *)mean, eff) == 0 && eff[2].factor == 1.0f,
           "bound 0: nothing scaled");
    // Zero segments: a median of 0 bounds nothing.
    memset(e[0], 0, bytes), memset(e[1], 0, bytes), memset(e[3], 0, bytes);
    q.bound = 3.0f;
    EXPECT(quant_reduce_segment(&q, ins, 4, n, NULL, sc, (uint8_t *)mean, eff) == 0, "bound: a zero median bounds nothing");
    for (int j = 0; j < 4; j++) free(g[j]), free(e[j]);
    free(mean), free(sc), free(plain), free(v);
}

// Token weights (docs/quant.md, "The hub's mean"): equal weights give the unweighted bytes;
// unequal ones the mean of the contributions each scaled by fp32(w·n/Σw), the same as scaling
// by hand (and close to Σ w·x / Σ w in double: within the fp32 roundings); with a bound a
// claim above bound × the lower median weight counts as that.
static void test_weights(void) {
    int64_t n = 1000, block = 100;
    float *g[3];
    uint8_t *e[3];
    const uint8_t *ins[3];
    size_t bytes = quant_encoded_bytes(QUANT_INT8, n, block);
    for (int j = 0; j < 3; j++) {
        g[j] = gaussian(n, 1.0 + j);
        e[j] = (uint8_t *)xmalloc(bytes);
        quant_encode(QUANT_INT8, g[j], n, block, e[j]);
        ins[j] = e[j];
    }
    float *a = (float *)xmalloc(n * sizeof(float)), *b = (float *)xmalloc(n * sizeof(float));
    float *sc = (float *)xmalloc(n * sizeof(float));
    quant_reduction plain = {.up = QUANT_INT8, .down = QUANT_NONE, .block = block};
    double equal[3] = {4096, 4096, 4096};
    quant_reduction q = plain;
    q.weights = equal;
    quant_reduce_segment(&plain, ins, 3, n, NULL, sc, (uint8_t *)a, NULL);
    quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)b, NULL);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "weights: equal tokens give the unweighted bytes");
    double w[3] = {1000, 2000, 3000};
    q.weights = w;
    quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)b, NULL);
    float f[3] = {(float)(1000.0 * 3 / 6000), (float)(2000.0 * 3 / 6000), (float)(3000.0 * 3 / 6000)};
    quant_mean(QUANT_INT8, ins, 3, n, block, f, a);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "weights 1:2:3: the mean of the contributions scaled by w·n/Σw");
    float *v = (float *)xmalloc(n * sizeof(float));
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = 0;
        for (int j = 0; j < 3; j++) {
            quant_decode(QUANT_INT8, e[j], n, block, v);
            want += w[j] * (double)v[i];
        }
        want /= 6000.0;
        worst = fmax(worst, fabs((double)b[i] - want));
        scale = fmax(scale, fabs(want));
    }
    // fp32: a product and a rounding per contribution, two sums and a division: a few ulps.
    EXPECT(worst <= 8 * 0x1p-24 * scale * 3, "weights 1:2:3: Σ w·x / Σ w within fp32 roundings (%.3g of %.3g)",
           worst, scale);
    // A claim of a million times the others' tokens, with the bound 3: counted as 3 x the median.
    double hostile[3] = {1000, 1e9, 1000};
    q.weights = hostile;
    q.bound = 3.0f;
    quant_effect eff[3];
    quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)b, eff);
    EXPECT(eff[1].weight_capped && !eff[0].weight_capped && !eff[2].weight_capped,
           "weights: the bound caps only the outsized claim");
    double capped[3] = {1000, 3000, 1000};
    q.weights = capped;
    quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)a, eff);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0 && !eff[1].weight_capped,
           "weights: a claim above bound x the lower median counts as bound x the median");
    // Weight 0 (a replica that joined at the run's end and trained nothing): the mean is the
    // one without it, bit for bit — not pulled toward its Δ, nor the bound's medians moved —
    // even when its payload holds NaN, which is then not reported as left out.
    const uint8_t *two[2] = {e[0], e[2]};
    double two_w[2] = {1000, 3000}, with_none[3] = {1000, 0, 3000};
    q.weights = two_w;
    quant_reduce_segment(&q, two, 2, n, NULL, sc, (uint8_t *)a, NULL);
    q.weights = with_none;
    memset(e[1], 0, bytes);   // its Δ = 0: a plain mean would shrink the others' by a third
    quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)b, eff);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0 && !eff[1].left_out,
           "weights: a contribution of weight 0 leaves the mean as it is without it");
    float nan = NAN;
    memcpy(e[1], &nan, sizeof nan);
    EXPECT(quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)b, eff) == 0 && !eff[1].left_out &&
               memcmp(a, b, n * sizeof(float)) == 0,
           "weights: a weight-0 contribution's NaN is not looked at");
    double none[3] = {0, 0, 0};
    q.weights = none;
    quant_reduce_segment(&q, ins, 3, n, NULL, sc, (uint8_t *)b, eff);
    EXPECT(isnan(b[0]) && isnan(b[n - 1]), "weights: all of weight 0: a segment of NaN (nothing to average)");
    for (int j = 0; j < 3; j++) free(g[j]), free(e[j]);
    free(a), free(b), free(sc), free(v);
}

// ---------------------------------------------------------------- sparse (top-k) codecs
// Tolerances. Sparse encoding is exact bytes (against a naive encoder), so no tolerance there.
// The error-feedback identity Σ_t sent_t + r_T = Σ_t g_t holds exactly in real arithmetic;
// in fp32 each round rounds y = g + r once (≤ 2^-24·|y|) and r' = y − code·s once (≤ 2^-24·|r'|
// ≤ 2^-24·|y|: a value not kept has r' = y exactly, a kept one |r'| ≤ s/2 ≤ |y|max), so after
// T rounds an element may be 2·T·2^-24·Y off, Y the largest |y| of any element and round.
// Sums over rounds are taken in double, exactly enough not to matter against that.

static const quant_kind int_kinds[3] = {QUANT_INT8, QUANT_INT4, QUANT_INT2};

static int offset_width_of(int64_t block) {
    int w = 0;
    while (((int64_t)1 << w) < block) w++;
    return w;
}

static void set_bits(uint8_t *buf, int64_t at, uint32_t v, int width) {
    for (int j = 0; j < width; j++)
        if ((v >> j) & 1) buf[(at + j) / 8] |= (uint8_t)(1u << ((at + j) % 8));
}

static uint32_t read_bits(const uint8_t *buf, int64_t at, int width) {
    uint32_t v = 0;
    for (int j = 0; j < width; j++) v |= (uint32_t)((buf[(at + j) / 8] >> ((at + j) % 8)) & 1) << j;
    return v;
}

typedef struct {
    uint32_t bits;
    int64_t i;
} ranked;

// |y| as bits descending, then the index ascending: the order the top-k takes.
static int by_rank(const void *pa, const void *pb) {
    const ranked *a = (const ranked *)pa, *b = (const ranked *)pb;
    if (a->bits != b->bits) return a->bits > b->bits ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

// The naive sparse encoder: per block, the dense reference's scale; the kept set from a full
// qsort; every offset, bitmap bit and code placed bit by bit at the layout's position.
static void reference_sparse_encode(quant_codec c, const float *x, int64_t n, int64_t block, uint8_t *out) {
    quant_kind k = quant_codec_kind(c);
    int64_t keep = quant_codec_keep(c), nb = blocks_of(n, block);
    int w = offset_width_of(block), vb = bits_of(k);
    bool offsets = (keep * w + 7) / 8 < (block + 7) / 8;
    memset(out, 0, quant_encoded_bytes(c, n, block));
    int64_t pos = 4 * nb;
    ranked *order = (ranked *)xmalloc((size_t)block * sizeof *order);
    bool *kept = (bool *)xmalloc((size_t)block);
    for (int64_t b = 0; b < nb; b++) {
        int64_t start = b * block, len = start + block < n ? block : n - start, kb = keep < len ? keep : len;
        float m = 0;
        bool finite = true;
        for (int64_t i = 0; i < len; i++) {
            if (!isfinite(x[start + i])) finite = false;
            m = fmaxf(m, fabsf(x[start + i]));
            order[i] = (ranked){bits_of_float(x[start + i]) & 0x7FFFFFFFu, i};
            kept[i] = false;
        }
        float s = finite ? m / qmax_of(k) : float_of_bits(0x7FC00000u);
        memcpy(out + 4 * b, &s, 4);
        qsort(order, (size_t)len, sizeof *order, by_rank);
        for (int64_t t = 0; t < kb; t++) kept[order[t].i] = true;
        int64_t index_bytes = offsets ? (kb * w + 7) / 8 : (len + 7) / 8, slot = 0;
        for (int64_t i = 0; i < len; i++) {
            if (!kept[i]) continue;
            int code = 0;
            if (finite && s != 0.0f) code = (int)fminf(fmaxf(roundf(x[start + i] / s), -qmax_of(k)), qmax_of(k));
            if (offsets) set_bits(out + pos, slot * w, (uint32_t)i, w);
            else set_bits(out + pos, i, 1, 1);
            set_bits(out + pos + index_bytes, slot * vb, (uint32_t)code & ((1u << vb) - 1), vb);
            slot++;
        }
        pos += index_bytes + (kb * vb + 7) / 8;
    }
    free(order), free(kept);
}

// code·scale at the kept values, 0·scale elsewhere.
static void reference_sparse_decode(quant_codec c, const uint8_t *in, int64_t n, int64_t block, float *x) {
    quant_kind k = quant_codec_kind(c);
    int64_t keep = quant_codec_keep(c), nb = blocks_of(n, block), pos = 4 * nb;
    int w = offset_width_of(block), vb = bits_of(k);
    bool offsets = (keep * w + 7) / 8 < (block + 7) / 8;
    for (int64_t b = 0; b < nb; b++) {
        int64_t start = b * block, len = start + block < n ? block : n - start, kb = keep < len ? keep : len;
        float s = scale_at(in, b);
        for (int64_t i = 0; i < len; i++) x[start + i] = 0.0f * s;
        int64_t index_bytes = offsets ? (kb * w + 7) / 8 : (len + 7) / 8, slot = 0;
        for (int64_t i = 0; i < len && slot < kb; i++) {
            int64_t at = offsets ? (int64_t)read_bits(in + pos, slot * w, w) : i;
            if (!offsets && !read_bits(in + pos, i, 1)) continue;
            int code = (int)read_bits(in + pos + index_bytes, slot * vb, vb);
            if (code >= 1 << (vb - 1)) code -= 1 << vb;
            x[start + at] = (float)code * s;
            slot++;
        }
        pos += index_bytes + (kb * vb + 7) / 8;
    }
}

static void test_sparse_sizes(void) {
    EXPECT(quant_topk_keep(1.0, 128) == 0 && quant_topk_keep(1.0, 2) == 0, "topk 1 is the dense codec (keep 0)");
    EXPECT(quant_codec_of(QUANT_INT4, quant_topk_keep(1.0, 128)) == QUANT_INT4, "topk 1: the int4 codec itself");
    EXPECT(quant_topk_keep(0.25, 128) == 32 && quant_topk_keep(0.03, 128) == 4 && quant_topk_keep(0.3, 10) == 3 &&
               quant_topk_keep(0.0001, 128) == 1 && quant_topk_keep(0.999, 128) == 0 && quant_topk_keep(0.99, 128) == 127,
           "keep = ceil(topk·block): 32, 4, 3 (not 4: 0.3·10 is 3.0000000000000004), at least 1, dense at the block");
    quant_codec c = quant_codec_of(QUANT_INT4, 32);
    EXPECT(quant_codec_kind(c) == QUANT_INT4 && quant_codec_keep(c) == 32 && c != QUANT_INT4, "a codec carries kind and keep");
    // block 128: offsets of 7 bits are smaller than the 16-byte bitmap up to 17 values (15 bytes).
    EXPECT(quant_sparse_offsets(128, 17) && !quant_sparse_offsets(128, 18), "block 128: offsets up to 17 kept, then the bitmap");
    EXPECT(quant_sparse_offsets(1024, 101) && !quant_sparse_offsets(1024, 102), "block 1024: offsets up to 101 (10 bits)");
    EXPECT(quant_encoded_bytes(quant_codec_of(QUANT_INT4, 32), 128, 128) == 4 + 16 + 16,
           "int4 top 32 of 128: scale + 16-byte bitmap + 16 bytes of codes");
    EXPECT(quant_encoded_bytes(quant_codec_of(QUANT_INT2, 4), 256, 128) == 2 * (4 + 4 + 1),
           "int2 top 4 of 128: scale + 4 bytes of 7-bit offsets + 1 byte of codes, per block");
    // The short last block: 10 values of block 8, keep 3 -> block 1 has 2 values, keeps both.
    EXPECT(quant_encoded_bytes(quant_codec_of(QUANT_INT8, 3), 10, 8) == 8 + (1 + 3) + (1 + 2),
           "short last block: its own bitmap and keep");
}

static void test_sparse_hand_made(void) {
    // int4, block 16, keep 2: offsets (4 bits each, 1 byte) beat the 2-byte bitmap. Kept: 3 (7)
    // and 10 (-3.5); scale 7/7 = 1; codes 7 and round(-3.5) = -4 (away from zero).
    float x[16] = {0.5f, -1, 0.25f, 7, 1, 0, -2, 3, 0, 0, -3.5f, 1, 2, -3, 0.75f, 0};
    const uint8_t want[6] = {0x00, 0x00, 0x80, 0x3F, 0xA3, 0xC7};
    quant_codec c = quant_codec_of(QUANT_INT4, 2);
    EXPECT(quant_encoded_bytes(c, 16, 16) == sizeof want, "sparse int4 example size");
    uint8_t got[32];
    memset(got, 0xEE, sizeof got);
    quant_encode(c, x, 16, 16, got);
    expect_bytes(got, want, sizeof want, "sparse int4 example (offsets)");
    EXPECT(got[sizeof want] == 0xEE, "sparse encode writes past its size");
    float back[16];
    quant_decode(c, want, 16, 16, back);
    EXPECT(back[3] == 7.0f && back[10] == -4.0f && back[0] == 0.0f && back[13] == 0.0f,
           "sparse example decodes to code·scale at 3 and 10, 0 elsewhere");
    // int2, block 8, keep 4, n 10: a bitmap (3-bit offsets would take 2 bytes). |x| = 2 at 1 and
    // 3, then three values of |x| = 1 (5, 6, 7) for two places: the lower indices 5 and 6.
    // scale 2/1 = 2; codes -1, 1, round(0.5) = 1, round(-0.5) = -1. The last block (2 values)
    // keeps both: scale 0.75, codes round(1/3) = 0 and -1.
    float y[10] = {0.1f, -2, 0.5f, 2, -0.9f, 1, -1, 1, 0.25f, -0.75f};
    const uint8_t want2[12] = {0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x3F, 0x6A, 0xD7, 0x03, 0x0C};
    quant_codec c2 = quant_codec_of(QUANT_INT2, 4);
    EXPECT(quant_encoded_bytes(c2, 10, 8) == sizeof want2, "sparse int2 example size");
    memset(got, 0xEE, sizeof got);
    quant_encode(c2, y, 10, 8, got);
    expect_bytes(got, want2, sizeof want2, "sparse int2 example (bitmap, ties to the lower index)");
    EXPECT(got[sizeof want2] == 0xEE, "sparse int2 encode writes past its size");
}

// Gaussian, exact ties (every |x| equal), mostly zeros with a few values, subnormals, a NaN.
static void sparse_fill(float *x, int64_t n, int pattern) {
    for (int64_t i = 0; i < n; i++) {
        switch (pattern) {
        case 0: x[i] = (float)rng_normal(&rng); break;
        case 1: x[i] = rng_next(&rng) % 2 ? 0.5f : -0.5f; break;
        case 2: x[i] = rng_next(&rng) % 17 == 0 ? (float)rng_normal(&rng) : 0.0f; break;
        case 3: x[i] = float_of_bits((uint32_t)(rng_next(&rng) % 400)) * (rng_next(&rng) % 2 ? 1.0f : -1.0f); break;
        default: x[i] = (float)rng_normal(&rng);
        }
    }
    if (pattern == 4 && n > 0) x[n / 3] = NAN;
}

static void test_sparse_against_reference(void) {
    const int64_t sizes[] = {1, 2, 7, 9, 100, 1000, 9001};
    const int64_t blocks[] = {2, 3, 8, 16, 33, 128, 1000, 9000};
    int mismatches = 0, decode_mismatches = 0, cases = 0, offsets = 0, bitmaps = 0;
    for (int ki = 0; ki < 3; ki++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
                int64_t n = sizes[si], block = blocks[bi];
                int64_t keeps[4] = {1, block / 8, block / 2, block - 1};
                for (int kk = 0; kk < 4; kk++) {
                    int64_t keep = keeps[kk];
                    if (keep < 1 || (kk > 0 && keep == keeps[kk - 1])) continue;
                    quant_codec c = quant_codec_of(int_kinds[ki], keep);
                    quant_sparse_offsets(block, keep) ? offsets++ : bitmaps++;
                    for (int pattern = 0; pattern < 5; pattern++) {
                        float *x = alloc_floats((size_t)n);
                        sparse_fill(x, n, pattern);
                        size_t bytes = quant_encoded_bytes(c, n, block);
                        uint8_t *want = xmalloc(bytes + 1), *got = xmalloc(bytes + 1);
                        got[bytes] = 0xEE;
                        quant_encode(c, x, n, block, got);
                        reference_sparse_encode(c, x, n, block, want);
                        cases++;
                        if ((memcmp(got, want, bytes) != 0 || got[bytes] != 0xEE) && ++mismatches <= 5)
                            EXPECT(0, "sparse %s keep %lld n=%lld block=%lld pattern %d differs from the reference",
                                   quant_kind_name(int_kinds[ki]), (long long)keep, (long long)n, (long long)block,
                                   pattern);
                        float *back = alloc_floats((size_t)n), *want_back = alloc_floats((size_t)n);
                        quant_decode(c, want, n, block, back);
                        reference_sparse_decode(c, want, n, block, want_back);
                        if (memcmp(back, want_back, sizeof(float) * n) != 0 && ++decode_mismatches <= 5)
                            EXPECT(0, "sparse %s keep %lld n=%lld block=%lld pattern %d decodes unlike the reference",
                                   quant_kind_name(int_kinds[ki]), (long long)keep, (long long)n, (long long)block,
                                   pattern);
                        free(x), free(want), free(got), free(back), free(want_back);
                    }
                }
            }
    EXPECT(mismatches == 0, "sparse: %d of %d cases differ from the reference", mismatches, cases);
    EXPECT(decode_mismatches == 0, "sparse: %d of %d cases decode unlike the reference", decode_mismatches, cases);
    EXPECT(offsets > 0 && bitmaps > 0, "both index codings were exercised (%d offsets, %d bitmap settings)", offsets,
           bitmaps);
    printf("  sparse: %d cases equal to the naive encoder and decoder\n", cases);
}

// A sparse encoding is the dense one of codes that are 0 off the kept set: at the kept values
// it decodes exactly as the dense codec does (same scale, same codes).
static void test_sparse_is_dense_on_kept(void) {
    const int64_t n = 50000, block = 128;
    float *x = gaussian(n, 1.0), *dense = alloc_floats(n), *sparse = alloc_floats(n);
    for (int ki = 0; ki < 3; ki++) {
        quant_codec c = quant_codec_of(int_kinds[ki], 32);
        uint8_t *ed = encode_new(int_kinds[ki], x, n, block), *es = encode_new(c, x, n, block);
        quant_decode(int_kinds[ki], ed, n, block, dense);
        quant_decode(c, es, n, block, sparse);
        int64_t nonzero = 0, bad = 0;
        for (int64_t i = 0; i < n; i++) {
            if (sparse[i] != 0.0f) nonzero++;
            if (sparse[i] != 0.0f && sparse[i] != dense[i]) bad++;
        }
        EXPECT(bad == 0 && memcmp(es, ed, (size_t)blocks_of(n, block) * 4) == 0,
               "sparse %s: same scales as dense, same values where kept (%lld differ)", quant_kind_name(int_kinds[ki]),
               (long long)bad);
        EXPECT(nonzero <= 32 * blocks_of(n, block), "sparse %s: at most 32 of every 128 values nonzero (%lld)",
               quant_kind_name(int_kinds[ki]), (long long)nonzero);
        free(ed), free(es);
    }
    free(x), free(dense), free(sparse);
}

static void test_sparse_threads(void) {
#ifdef _OPENMP
    const int64_t n = 300007, block = 100;
    float *x = gaussian(n, 1.0), *r1 = gaussian(n, 0.1), *r2 = alloc_floats(n);
    memcpy(r2, r1, n * sizeof(float));
    quant_codec c = quant_codec_of(QUANT_INT4, 25);
    size_t bytes = quant_encoded_bytes(c, n, block);
    uint8_t *a = xmalloc(bytes), *b = xmalloc(bytes);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double e1 = quant_encode_feedback(c, x, r1, n, block, a);
    omp_set_num_threads(threads > 1 ? threads : 4);
    double e2 = quant_encode_feedback(c, x, r2, n, block, b);
    omp_set_num_threads(threads);
    EXPECT(memcmp(a, b, bytes) == 0 && memcmp(r1, r2, n * sizeof(float)) == 0 && e1 == e2,
           "sparse: the same bytes, residual and error on 1 and %d threads", threads > 1 ? threads : 4);
    free(x), free(r1), free(r2), free(a), free(b);
#endif
}

// What top-k does not send stays in the residual: after a round, a value not kept has
// r = y exactly; over rounds, Σ sent + r_T = Σ g within the fp32 drift above.
static void test_sparse_feedback(void) {
    const int64_t n = 16384, block = 128, rounds = 100;
    const int64_t keeps[2] = {32, 4};
    for (int case_ = 0; case_ < 2; case_++) {
        quant_kind k = case_ == 0 ? QUANT_INT4 : QUANT_INT2;
        quant_codec c = quant_codec_of(k, keeps[case_]);
        float *g = alloc_floats(n), *r = (float *)xcalloc(n, sizeof(float)), *sent = alloc_floats(n);
        double *sum_sent = (double *)xcalloc(n, sizeof(double)), *sum_g = (double *)xcalloc(n, sizeof(double));
        uint8_t *enc = xmalloc(quant_encoded_bytes(c, n, block));
        float y_max = 0;
        int64_t not_kept_exact = 0, not_kept = 0;
        double phase = rng_normal(&rng);
        for (int64_t t = 0; t < rounds; t++) {
            for (int64_t i = 0; i < n; i++)
                g[i] = (float)(0.3 * sin(2 * M_PI * (double)t / 200 + phase + (double)i) + rng_normal(&rng));
            float *y = alloc_floats(n);
            for (int64_t i = 0; i < n; i++) {
                y[i] = g[i] + r[i];
                y_max = fmaxf(y_max, fabsf(y[i]));
            }
            quant_encode_feedback(c, g, r, n, block, enc);
            quant_decode(c, enc, n, block, sent);
            for (int64_t i = 0; i < n; i++) {
                sum_sent[i] += sent[i];
                sum_g[i] += g[i];
                if (sent[i] == 0.0f) {   // not kept (or kept with code 0: then too r = y - 0 = y)
                    not_kept++;
                    not_kept_exact += bits_of_float(r[i]) == bits_of_float(y[i]);
                }
            }
            free(y);
        }
        double tol = 2.0 * (double)rounds * ldexp(1.0, -24) * y_max, worst = 0, err2 = 0, r2 = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = sum_sent[i] + (double)r[i] - sum_g[i];
            worst = fmax(worst, fabs(d));
            double e = sum_sent[i] - sum_g[i];
            err2 += e * e;
            r2 += (double)r[i] * r[i];
        }
        EXPECT(not_kept_exact == not_kept && not_kept > 0,
               "sparse %s top %lld: every value not sent is kept whole in the residual (%lld of %lld)",
               quant_kind_name(k), (long long)keeps[case_], (long long)not_kept_exact, (long long)not_kept);
        EXPECT(worst <= tol, "sparse %s top %lld: Σ sent + r = Σ g within %.3g (worst %.3g)", quant_kind_name(k),
               (long long)keeps[case_], tol, worst);
        printf("  sparse %s top %lld/128, %lld rounds: |Σ sent + r − Σ g| ≤ %.2e (bound %.2e); ||Σ sent − Σ g|| = "
               "%.2f = ||r|| %.2f\n",
               quant_kind_name(k), (long long)keeps[case_], (long long)rounds, worst, tol, sqrt(err2), sqrt(r2));
        free(g), free(r), free(sent), free(sum_sent), free(sum_g), free(enc);
    }
}

// The hub's mean of sparse contributions: each decoded to its dense values (0 off its kept set),
// summed in the given order in fp32 and divided once: the union of the kept sets.
static void test_sparse_mean(void) {
    const int64_t n = 1000, block = 100;
    quant_codec c = quant_codec_of(QUANT_INT4, 25);
    size_t bytes = quant_encoded_bytes(c, n, block);
    float *x[3], *v[3], *mean = alloc_floats(n), *want = alloc_floats(n), *scratch = alloc_floats(n);
    uint8_t *e[3];
    const uint8_t *ins[3];
    for (int j = 0; j < 3; j++) {
        x[j] = gaussian(n, 1.0 + j);
        e[j] = xmalloc(bytes);
        quant_encode(c, x[j], n, block, e[j]);
        ins[j] = e[j];
        v[j] = alloc_floats(n);
        quant_decode(c, e[j], n, block, v[j]);
    }
    int64_t in_union = 0;
    for (int64_t i = 0; i < n; i++) {
        want[i] = ((v[0][i] + v[1][i]) + v[2][i]) / 3.0f;
        in_union += v[0][i] != 0.0f || v[1][i] != 0.0f || v[2][i] != 0.0f;
    }
    quant_mean(c, ins, 3, n, block, NULL, mean);
    EXPECT(memcmp(mean, want, n * sizeof(float)) == 0, "sparse mean = (v0 + v1 + v2) / 3 in fp32, over the union "
           "(%lld of %lld values)", (long long)in_union, (long long)n);
    // Through quant_reduce_segment, downlink int4 dense with the hub's feedback.
    uint8_t *out = xmalloc(quant_encoded_bytes(QUANT_INT4, n, block)), *ref = xmalloc(quant_encoded_bytes(QUANT_INT4, n, block));
    float *res = (float *)xcalloc(n, sizeof(float)), *res_ref = (float *)xcalloc(n, sizeof(float));
    quant_reduction q = {.up = c, .down = QUANT_INT4, .block = block, .bound = 0.0f};
    quant_reduce_segment(&q, ins, 3, n, res, scratch, out, NULL);
    quant_encode_feedback(QUANT_INT4, want, res_ref, n, block, ref);
    EXPECT(memcmp(out, ref, quant_encoded_bytes(QUANT_INT4, n, block)) == 0 && memcmp(res, res_ref, n * 4) == 0,
           "the hub's sparse reduction = the dense int4 encoding of that mean, with its residual");
    // A NaN block makes the contribution non-finite (its scale is NaN).
    x[1][150] = NAN;
    quant_encode(c, x[1], n, block, e[1]);
    EXPECT(!quant_is_finite(c, e[1], n, block) && quant_is_finite(c, e[0], n, block), "sparse: a NaN block is not finite");
    for (int j = 0; j < 3; j++) free(x[j]), free(v[j]), free(e[j]);
    free(mean), free(want), free(scratch), free(out), free(ref), free(res), free(res_ref);
}

// Bytes from a peer are not trusted to be well formed: random records garble values but never
// write outside the output.
static void test_sparse_malformed(void) {
    const int64_t n = 1001;
    const int64_t settings[3][2] = {{128, 4}, {128, 64}, {33, 2}};   // offsets, bitmap, offsets past len
    for (int s = 0; s < 3; s++) {
        int64_t block = settings[s][0];
        quant_codec c = quant_codec_of(QUANT_INT8, settings[s][1]);
        size_t bytes = quant_encoded_bytes(c, n, block);
        uint8_t *junk = xmalloc(bytes);
        float *out = alloc_floats(n + 64);
        bool fenced = true;
        for (int trial = 0; trial < 20; trial++) {
            for (size_t i = 0; i < bytes; i++) junk[i] = (uint8_t)rng_next(&rng);
            for (int64_t i = 0; i < n + 64; i++) out[i] = 12345.0f;
            quant_decode(c, junk, n, block, out);
            for (int64_t i = n; i < n + 64; i++) fenced = fenced && out[i] == 12345.0f;
        }
        EXPECT(fenced, "random bytes as sparse (block %lld, keep %lld): nothing written past n", (long long)block,
               (long long)settings[s][1]);
        free(junk), free(out);
    }
}

int main(void) {
    rng_seed(&rng, 20261122, 0);
    test_names_and_sizes();
    test_hand_made_layout();
    test_against_reference();
    test_round_trip_bounds();
    test_zero_blocks();
    test_outlier();
    test_odd_tail();
    test_non_finite();
    test_threads();
    test_feedback_return();
    test_error_feedback();
    test_segments();
    test_bf16();
    test_mean();
    test_mean_overflow();
    test_bound();
    test_weights();
    test_sparse_sizes();
    test_sparse_hand_made();
    test_sparse_against_reference();
    test_sparse_is_dense_on_kept();
    test_sparse_threads();
    test_sparse_feedback();
    test_sparse_mean();
    test_sparse_malformed();
    return check_summary("test_quant");
}
