// test/test_ops.c — each CPU reference op on its own: forward against a naive version
// written differently, backward against central finite differences, and the same bits on
// 1 and on several threads (bit-exact resume relies on it).
//
// Finite differences run through the fp32 forward with h = 1e-2 on inputs of order 1 and a
// double accumulation of L = Σ dy·f(x): the truncation error is O(h²) ≈ 1e-4 relative and
// the rounding error about 1e-7·|L|/h ≈ 1e-5·|L|, so a tolerance of 1e-2 of the largest
// gradient separates a right backward (errors ~1e-4) from a wrong one (errors ~1).
#include "check.h"
#include "llmc/common.h"
#include "cpu/ops.h"
#include "llmc/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static rng_state rng;

static float *random_floats(int64_t n, double scale) {
    float *x = alloc_floats((size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_normal(&rng) * scale);
    return x;
}

static float max_abs(const float *x, int64_t n) {
    float m = 0;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

// ---------------------------------------------------------------- attention

enum { AB = 2, AT = 13, AHQ = 4, AHKV = 2, AD = 8 };
static int32_t att_start[AB * AT];

static void naive_attention(float *out, const float *q, const float *k, const float *v) {
    int group = AHQ / AHKV;
    for (int b = 0; b < AB; b++)
        for (int j = 0; j < AHQ; j++)
            for (int t = 0; t < AT; t++) {
                double scores[AT], mx = -1e300, sum = 0;
                for (int s = 0; s < AT; s++) {
                    bool visible = s <= t && s >= att_start[b * AT + t];
                    double d = 0;
                    for (int i = 0; i < AD; i++)
                        d += (double)q[((b * AT + t) * AHQ + j) * AD + i] * k[((b * AT + s) * AHKV + j / group) * AD + i];
                    scores[s] = visible ? d / sqrt((double)AD) : -INFINITY;
                    if (scores[s] > mx) mx = scores[s];
                }
                for (int s = 0; s < AT; s++) sum += exp(scores[s] - mx);
                for (int i = 0; i < AD; i++) {
                    double o = 0;
                    for (int s = 0; s < AT; s++)
                        o += exp(scores[s] - mx) / sum * v[((b * AT + s) * AHKV + j / group) * AD + i];
                    out[((b * AT + t) * AHQ + j) * AD + i] = (float)o;
                }
            }
}

static double attention_objective(const float *q, const float *k, const float *v, const float *dy) {
    float out[AB * AT * AHQ * AD], lse[AB * AHQ * AT];
    attention_forward(out, lse, q, k, v, att_start, AB, AT, AHQ, AHKV, AD);
    double L = 0;
    for (int i = 0; i < AB * AT * AHQ * AD; i++) L += (double)dy[i] * out[i];
    return L;
}

// Central differences of objective() with respect to x[i], for a spread of indices.
static void check_gradient(const char *what, float *x, int64_t n, const float *analytic,
                           double (*objective)(void *), void *ctx) {
    float scale = max_abs(analytic, n);
    float worst = 0;
    for (int64_t i = 0; i < n; i += 1 + n / 40) {
        float keep = x[i];
        float h = 1e-2f;
        x[i] = keep + h;
        double up = objective(ctx);
        x[i] = keep - h;
        double down = objective(ctx);
        x[i] = keep;
        float numeric = (float)((up - down) / (2.0 * h));
        worst = fmaxf(worst, fabsf(numeric - analytic[i]));
    }
    EXPECT(worst <= 1e-2f * scale, "%s: finite differences differ by %.3g (scale %.3g)", what, worst, scale);
}

typedef struct {
    float *q, *k, *v, *dy;
} att_ctx;

static double att_objective(void *p) {
    att_ctx *c = p;
    return attention_objective(c->q, c->k, c->v, c->dy);
}

static void test_attention(void) {
    int32_t tokens[AB * AT] = {5, 1, 0, 2, 3, 0, 0, 4, 4, 4, 0, 1, 1, 0, 0, 2, 3, 4, 5, 6, 7, 0, 8, 9, 9, 9};
    int32_t pos[AB * AT];
    document_positions(att_start, pos, tokens, AB, AT, true, 0);
    int64_t nq = AB * AT * AHQ * AD, nkv = AB * AT * AHKV * AD;
    float *q = random_floats(nq, 1), *k = random_floats(nkv, 1), *v = random_floats(nkv, 1);
    float *out = alloc_floats((size_t)nq), *ref = alloc_floats((size_t)nq), *lse = alloc_floats(AB * AHQ * AT);
    attention_forward(out, lse, q, k, v, att_start, AB, AT, AHQ, AHKV, AD);
    naive_attention(ref, q, k, v);
    float err = 0;
    for (int64_t i = 0; i < nq; i++) err = fmaxf(err, fabsf(out[i] - ref[i]));
    EXPECT(err < 1e-5f, "attention forward vs naive masked softmax: %.3g", err);

    float *dy = random_floats(nq, 1);
    float *dq = alloc_floats((size_t)nq), *dk = alloc_floats((size_t)nkv), *dv = alloc_floats((size_t)nkv);
    attention_backward(dq, dk, dv, dy, out, lse, q, k, v, att_start, AB, AT, AHQ, AHKV, AD);
    att_ctx ctx = {q, k, v, dy};
    check_gradient("attention dq", q, nq, dq, att_objective, &ctx);
    check_gradient("attention dk", k, nkv, dk, att_objective, &ctx);
    check_gradient("attention dv", v, nkv, dv, att_objective, &ctx);

#ifdef _OPENMP
    float *dq1 = alloc_floats((size_t)nq), *dk1 = alloc_floats((size_t)nkv), *dv1 = alloc_floats((size_t)nkv);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    attention_backward(dq1, dk1, dv1, dy, out, lse, q, k, v, att_start, AB, AT, AHQ, AHKV, AD);
    omp_set_num_threads(threads > 1 ? threads : 2);
    attention_backward(dq, dk, dv, dy, out, lse, q, k, v, att_start, AB, AT, AHQ, AHKV, AD);
    omp_set_num_threads(threads);
    EXPECT(!memcmp(dq, dq1, (size_t)nq * 4) && !memcmp(dk, dk1, (size_t)nkv * 4) && !memcmp(dv, dv1, (size_t)nkv * 4),
           "attention backward: the same bits on 1 thread and on several");
    free(dq1);
    free(dk1);
    free(dv1);
#endif
    free(q), free(k), free(v), free(out), free(ref), free(lse), free(dy), free(dq), free(dk), free(dv);
}

static void test_document_positions(void) {
    int32_t tokens[6] = {0, 5, 0, 3, 0, 0}, start[6], pos[6];
    document_positions(start, pos, tokens, 1, 6, true, 0);
    int32_t want_start[6] = {0, 0, 2, 2, 4, 5}, want_pos[6] = {0, 1, 0, 1, 0, 0};
    EXPECT(!memcmp(start, want_start, sizeof start) && !memcmp(pos, want_pos, sizeof pos),
           "documents start at s >= 1 where the token is doc_token");
    document_positions(start, pos, tokens, 1, 6, false, 0);
    EXPECT(start[5] == 0 && pos[5] == 5, "doc_masking = 0: plain causal positions");
}

// ---------------------------------------------------------------- rmsnorm

enum { RN = 5, RC = 12 };
typedef struct {
    float *x, *g, *dy;
} norm_ctx;

static double norm_objective(void *p) {
    norm_ctx *c = p;
    float y[RN * RC], rstd[RN];
    rmsnorm_forward(y, rstd, c->x, c->g, RN, RC, 1e-6f);
    double L = 0;
    for (int i = 0; i < RN * RC; i++) L += (double)c->dy[i] * y[i];
    return L;
}

static void test_rmsnorm(void) {
    float *x = random_floats(RN * RC, 1), *g = random_floats(RC, 1), *dy = random_floats(RN * RC, 1);
    float y[RN * RC], rstd[RN], dx[RN * RC], dg[RC] = {0};
    rmsnorm_forward(y, rstd, x, g, RN, RC, 1e-6f);
    double ms = 0;
    for (int c = 0; c < RC; c++) ms += (double)x[c] * x[c];
    EXPECT(fabsf(y[3] - (float)(x[3] / sqrt(ms / RC + 1e-6) * g[3])) < 1e-6f, "forward formula");
    rmsnorm_backward(dx, dg, dy, x, g, rstd, RN, RC, false);
    norm_ctx ctx = {x, g, dy};
    check_gradient("rmsnorm dx", x, RN * RC, dx, norm_objective, &ctx);
    check_gradient("rmsnorm dg", g, RC, dg, norm_objective, &ctx);
    float dx2[RN * RC];
    memcpy(dx2, dy, sizeof dx2);
    float dg2[RC] = {0};
    rmsnorm_backward(dx2, dg2, dx2, x, g, rstd, RN, RC, false);
    EXPECT(!memcmp(dx, dx2, sizeof dx) && !memcmp(dg, dg2, sizeof dg), "in-place backward (dinp == dout)");
    free(x), free(g), free(dy);
}

// ---------------------------------------------------------------- RoPE, SwiGLU, loss, embedding

static void test_rope(void) {
    enum { N = 6, H = 3, D = 8, T = 6 };
    float cos_t[T * D / 2], sin_t[T * D / 2];
    rope_tables(cos_t, sin_t, T, D, 10000.0);
    int32_t pos[N] = {0, 1, 2, 0, 5, 3};
    float *x = random_floats(N * H * D, 1), y[N * H * D];
    memcpy(y, x, sizeof y);
    rope_forward(y, pos, cos_t, sin_t, N, H, D);
    EXPECT(!memcmp(y, x, H * D * 4), "position 0 is the identity");
    // Rotate-half: dims i and i + D/2 rotate by pos · theta^(-2i/D).
    double angle = 5.0 * pow(10000.0, -2.0 * 1 / D);
    float *x4 = x + 4 * H * D, *y4 = y + 4 * H * D;
    EXPECT(fabsf(y4[1] - (float)(x4[1] * cos(angle) - x4[5] * sin(angle))) < 1e-6f &&
               fabsf(y4[5] - (float)(x4[5] * cos(angle) + x4[1] * sin(angle))) < 1e-6f,
           "rotate-half pairing of dims i and i + D/2");
    rope_backward(y, pos, cos_t, sin_t, N, H, D);
    float err = 0;
    for (int i = 0; i < N * H * D; i++) err = fmaxf(err, fabsf(y[i] - x[i]));
    EXPECT(err < 1e-6f, "backward is the inverse rotation (%.3g)", err);
    free(x);
}

typedef struct {
    float *gate, *up, *dy;
    int64_t n;
} swiglu_ctx;

static double swiglu_objective(void *p) {
    swiglu_ctx *c = p;
    float *y = alloc_floats((size_t)c->n);
    swiglu_forward(y, c->gate, c->up, 1, c->n);
    double L = 0;
    for (int64_t i = 0; i < c->n; i++) L += (double)c->dy[i] * y[i];
    free(y);
    return L;
}

static void test_swiglu(void) {
    int64_t n = 50;
    float *gate = random_floats(n, 2), *up = random_floats(n, 1), *dy = random_floats(n, 1);
    float *dgate = alloc_floats((size_t)n), *dup = alloc_floats((size_t)n);
    swiglu_backward(dgate, dup, dy, gate, up, 1, n);
    swiglu_ctx ctx = {gate, up, dy, n};
    check_gradient("swiglu dgate", gate, n, dgate, swiglu_objective, &ctx);
    check_gradient("swiglu dup", up, n, dup, swiglu_objective, &ctx);
    free(gate), free(up), free(dy), free(dgate), free(dup);
}

typedef struct {
    float *logits;
    int32_t *targets;
    int64_t n, V;
    float z;
} ce_ctx;

static double ce_objective(void *p) {
    ce_ctx *c = p;
    float *copy = alloc_floats((size_t)(c->n * c->V));
    memcpy(copy, c->logits, (size_t)(c->n * c->V) * 4);
    double ce = 0, lz = 0;
    cross_entropy_forward_backward(copy, c->targets, c->n, c->V, c->z, 0.0f, &ce, &lz);
    free(copy);
    return ce + c->z * lz;
}

static void test_cross_entropy(void) {
    int64_t n = 4, V = 30;
    float *logits = random_floats(n * V, 3);
    int32_t targets[4] = {0, 7, 29, 7};
    ce_ctx ctx = {logits, targets, n, V, 0.05f};
    double ce = 0, lz = 0;
    float *grad = alloc_floats((size_t)(n * V));
    memcpy(grad, logits, (size_t)(n * V) * 4);
    cross_entropy_forward_backward(grad, targets, n, V, ctx.z, 1.0f, &ce, &lz);
    double want = 0;
    for (int64_t r = 0; r < n; r++) {
        double s = 0;
        for (int64_t i = 0; i < V; i++) s += exp((double)logits[r * V + i]);
        want += log(s) - logits[r * V + targets[r]];
    }
    EXPECT(fabs(ce - want) < 1e-5 * fabs(want), "cross-entropy value %.8g vs %.8g", ce, want);
    check_gradient("cross-entropy + z-loss gradient", logits, n * V, grad, ce_objective, &ctx);
    free(logits), free(grad);
}

static void test_embedding(void) {
    enum { V = 7, C = 130, N = 9 };
    int32_t tokens[N] = {3, 1, 3, 6, 0, 3, 1, 2, 6};
    float *dout = random_floats(N * C, 1), dE[V * C] = {0}, want[V * C] = {0};
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) want[tokens[n] * C + c] += dout[n * C + c];
    embedding_backward(dE, tokens, dout, N, C);
    EXPECT(!memcmp(dE, want, sizeof dE), "scatter-add in token order, column blocks across threads");
    free(dout);
}

int main(void) {
    rng_seed(&rng, 12345, 1);
    test_attention();
    test_document_positions();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_cross_entropy();
    test_embedding();
    return check_summary("test_ops");
}
