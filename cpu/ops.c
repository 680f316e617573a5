// cpu/ops.c — fp32 reference operations (see cpu/ops.h for shapes and conventions).
#include "cpu/ops.h"
#include "llmc/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

// Eight independent partial sums: GCC turns the unrolled body into one 8-wide vector FMA
// without -ffast-math, and the fixed combination order keeps the result deterministic.
static inline float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// exp(x) for float, written so that GCC vectorizes loops over it (glibc's expf is a
// scalar call). Cody-Waite reduction x = n·ln2 + r with a two-part ln2, then a degree-6
// Taylor polynomial for e^r on |r| ≤ ln2/2: relative error ≤ 3e-7 (measured 2.3e-7 over
// [-87, 88] against exp in double), about what expf gives.
// Inputs below -87 return ~0 (e^-87 is at the edge of the normal floats).
static inline float exp_vec(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    // Round to nearest by adding and removing 1.5·2^23 (|x·log2 e| < 2^22): unlike
    // floorf, GCC keeps this inline and vectorizes it without -ffast-math.
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// y (n) += a · x (n); restrict (y and x never overlap) lets GCC vectorize it unversioned.
static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

// Column blocks for reductions over rows: each thread owns whole columns.
#define COLUMN_BLOCK 64

// ---------------------------------------------------------------- embedding

void embedding_forward(float *out, const int32_t *tokens, const float *E, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) memcpy(out + n * C, E + (int64_t)tokens[n] * C, (size_t)C * sizeof(float));
}

void embedding_backward(float *dE, const int32_t *tokens, const float *dout, int64_t N, int64_t C) {
    int64_t blocks = ceil_div(C, COLUMN_BLOCK);
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t c0 = blk * COLUMN_BLOCK, c1 = min_i64(C, c0 + COLUMN_BLOCK);
        for (int64_t n = 0; n < N; n++) {
            float *dst = dE + (int64_t)tokens[n] * C;
            const float *src = dout + n * C;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

// ---------------------------------------------------------------- rmsnorm

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *g, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        rstd[n] = r;
        float *y = out + n * C;
        for (int64_t c = 0; c < C; c++) y[c] = x[c] * r * g[c];
    }
}

// y = x·r·g with r = (mean(x²)+eps)^-1/2. With u = dy·g:
//   dx = r·u − x · r³ · mean(u·x)      dg = Σ_rows dy·x·r
void rmsnorm_backward(float *dinp, float *dg, const float *dout, const float *inp, const float *g,
                      const float *rstd, int64_t N, int64_t C, bool accumulate) {
    // dg first: it reads dout, and dinp may be the same buffer as dout (in-place use).
    int64_t blocks = ceil_div(C, COLUMN_BLOCK);
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t c0 = blk * COLUMN_BLOCK, c1 = min_i64(C, c0 + COLUMN_BLOCK);
        float acc[COLUMN_BLOCK] = {0};
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C, *dy = dout + n * C;
            float r = rstd[n];
            for (int64_t c = c0; c < c1; c++) acc[c - c0] += dy[c] * x[c] * r;
        }
        for (int64_t c = c0; c < c1; c++) dg[c] += acc[c - c0];
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float r = rstd[n];
        double ux = 0.0;
        for (int64_t c = 0; c < C; c++) ux += (double)(dy[c] * g[c]) * x[c];
        float k = (float)(ux / (double)C) * r * r * r;
        float *dx = dinp + n * C;
        if (accumulate)
            for (int64_t c = 0; c < C; c++) dx[c] += r * dy[c] * g[c] - x[c] * k;
        else
            for (int64_t c = 0; c < C; c++) dx[c] = r * dy[c] * g[c] - x[c] * k;
    }
}

// ---------------------------------------------------------------- documents and RoPE

void document_positions(int32_t *start, int32_t *pos, const int32_t *tokens, int64_t B, int64_t T,
                        bool doc_masking, int64_t doc_token) {
    for (int64_t b = 0; b < B; b++) {
        int32_t s0 = 0;
        for (int64_t t = 0; t < T; t++) {
            if (doc_masking && t >= 1 && tokens[b * T + t] == doc_token) s0 = (int32_t)t;
            start[b * T + t] = s0;
            pos[b * T + t] = (int32_t)t - s0;
        }
    }
}

void rope_tables(float *cos_t, float *sin_t, int64_t T, int64_t D, double theta) {
    int64_t half = D / 2;
    for (int64_t p = 0; p < T; p++)
        for (int64_t i = 0; i < half; i++) {
            double angle = (double)p * pow(theta, -2.0 * (double)i / (double)D);
            cos_t[p * half + i] = (float)cos(angle);
            sin_t[p * half + i] = (float)sin(angle);
        }
}

static void rope_rotate(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int64_t N, int64_t H,
                        int64_t D, float direction) {
    int64_t half = D / 2;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *c = cos_t + (int64_t)pos[n] * half, *s = sin_t + (int64_t)pos[n] * half;
        for (int64_t h = 0; h < H; h++) {
            float *x1 = x + (n * H + h) * D, *x2 = x1 + half;
            for (int64_t i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], sn = direction * s[i];
                x1[i] = a * c[i] - b * sn;
                x2[i] = b * c[i] + a * sn;
            }
        }
    }
}

void rope_forward(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int64_t N, int64_t H,
                  int64_t D) {
    rope_rotate(x, pos, cos_t, sin_t, N, H, D, 1.0f);
}

// The rotation is orthogonal, so its backward is the rotation by the opposite angle.
void rope_backward(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t, int64_t N, int64_t H,
                   int64_t D) {
    rope_rotate(dx, pos, cos_t, sin_t, N, H, D, -1.0f);
}

// ---------------------------------------------------------------- SwiGLU

void swiglu_forward(float *out, const float *gate, const float *up, int64_t N, int64_t F) {
    int64_t total = N * F;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i++) {
        float x = gate[i];
        out[i] = x / (1.0f + exp_vec(-x)) * up[i];
    }
}

// silu'(x) = σ(x)·(1 + x·(1 − σ(x)))
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t N,
                     int64_t F) {
    int64_t total = N * F;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i++) {
        float x = gate[i];
        float sig = 1.0f / (1.0f + exp_vec(-x));
        float silu = x * sig;
        dup[i] = dout[i] * silu;
        dgate[i] = dout[i] * up[i] * sig * (1.0f + x * (1.0f - sig));
    }
}

// ---------------------------------------------------------------- attention
//
// Scores are recomputed in the backward pass from q, k and the saved log-sum-exp, as
// flash attention does, so no (T,T) matrix per head is ever kept. Work goes in tiles of
// ATT_TILE queries against the keys they can see, with K and V transposed to (D, T) so
// that the inner loops run along keys (contiguous, vectorized) instead of ending every
// score in a horizontal sum over D. A query row t sees keys [start[t], t].

#define ATT_TILE 32

// (T, H, D) rows of one (batch, head) → (D, T)
static void transpose_head(float *out, const float *x, int64_t T, int64_t H, int64_t h, int64_t D) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + (t * H + h) * D;
        for (int64_t d = 0; d < D; d++) out[d * T + t] = row[d];
    }
}

// Scores of query rows [t0, t1) of one (batch, head): s[i * T + s] = q_t·k_s / √D for the
// keys each row sees (other entries untouched). kt is (D, T).
static void tile_scores(float *s, const float *q, int64_t Hq, int64_t j, const float *kt, const int32_t *start,
                        int64_t t0, int64_t t1, int64_t T, int64_t D, float scale) {
    for (int64_t t = t0; t < t1; t++) {
        float *row = s + (t - t0) * T;
        int64_t lo = start[t];
        int64_t n = t - lo + 1;
        memset(row + lo, 0, (size_t)n * sizeof *row);
        const float *qt = q + (t * Hq + j) * D;
        for (int64_t d = 0; d < D; d++) axpy(row + lo, qt[d] * scale, kt + d * T + lo, n);
    }
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int32_t *start, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
    int64_t group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *kt = xmalloc((size_t)(D * T) * sizeof *kt);
        float *s = xmalloc((size_t)(ATT_TILE * T) * sizeof *s);
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Hq; j++) {
                int64_t g = j / group;
                const float *qb = q + b * T * Hq * D, *vb = v + b * T * Hkv * D;
                const int32_t *sb = start + b * T;
                transpose_head(kt, k + b * T * Hkv * D, T, Hkv, g, D);
                for (int64_t t0 = 0; t0 < T; t0 += ATT_TILE) {
                    int64_t t1 = min_i64(T, t0 + ATT_TILE);
                    tile_scores(s, qb, Hq, j, kt, sb, t0, t1, T, D, scale);
                    for (int64_t t = t0; t < t1; t++) {
                        float *row = s + (t - t0) * T;
                        int64_t lo = sb[t];
                        float mx = -INFINITY;
                        for (int64_t kk = lo; kk <= t; kk++) mx = row[kk] > mx ? row[kk] : mx;
                        for (int64_t kk = lo; kk <= t; kk++) row[kk] = exp_vec(row[kk] - mx);
                        float sum = 0.0f;
                        for (int64_t kk = lo; kk <= t; kk++) sum += row[kk];
                        float inv = 1.0f / sum;
                        float *o = out + ((b * T + t) * Hq + j) * D;
                        memset(o, 0, (size_t)D * sizeof *o);
                        for (int64_t kk = lo; kk <= t; kk++) axpy(o, row[kk] * inv, vb + (kk * Hkv + g) * D, D);
                        lse[(b * Hq + j) * T + t] = mx + logf(sum);
                    }
                }
            }
        free(kt);
        free(s);
    }
}

// With P = softmax(S), S = q·kᵀ/√D, O = P·v:
//   dv_s += P_ts · dO_t ;  dP_ts = dO_t · v_s ;  dS_ts = P_ts (dP_ts − dO_t·O_t)
//   dq_t += dS_ts k_s / √D ;  dk_s += dS_ts q_t / √D
// One thread owns a (batch, kv head) pair and all its query heads, so dk and dv need no
// atomics; they are accumulated transposed, (D, T), and written back at the end.
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int32_t *start, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
    int64_t group = Hq / Hkv;
    float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel
    {
        float *kt = xmalloc((size_t)(D * T) * sizeof *kt), *vt = xmalloc((size_t)(D * T) * sizeof *vt);
        float *dkt = xmalloc((size_t)(D * T) * sizeof *dkt), *dvt = xmalloc((size_t)(D * T) * sizeof *dvt);
        float *p = xmalloc((size_t)(ATT_TILE * T) * sizeof *p), *dp = xmalloc((size_t)(ATT_TILE * T) * sizeof *dp);
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < Hkv; g++) {
                const float *qb = q + b * T * Hq * D, *kb = k + b * T * Hkv * D;
                const int32_t *sb = start + b * T;
                transpose_head(kt, kb, T, Hkv, g, D);
                transpose_head(vt, v + b * T * Hkv * D, T, Hkv, g, D);
                memset(dkt, 0, (size_t)(D * T) * sizeof *dkt);
                memset(dvt, 0, (size_t)(D * T) * sizeof *dvt);
                for (int64_t j = g * group; j < (g + 1) * group; j++)
                    for (int64_t t0 = 0; t0 < T; t0 += ATT_TILE) {
                        int64_t t1 = min_i64(T, t0 + ATT_TILE);
                        tile_scores(p, qb, Hq, j, kt, sb, t0, t1, T, D, scale);
                        for (int64_t t = t0; t < t1; t++) {
                            int64_t lo = sb[t], row_index = (b * T + t) * Hq + j;
                            float *pr = p + (t - t0) * T, *dpr = dp + (t - t0) * T;
                            const float *dot_ = dout + row_index * D;
                            float l = lse[(b * Hq + j) * T + t];
                            for (int64_t kk = lo; kk <= t; kk++) pr[kk] = exp_vec(pr[kk] - l);
                            // dP = dO · vᵀ, along keys
                            int64_t n = t - lo + 1;
                            memset(dpr + lo, 0, (size_t)n * sizeof *dpr);
                            for (int64_t d = 0; d < D; d++) axpy(dpr + lo, dot_[d], vt + d * T + lo, n);
                            float delta = dot(dot_, out + row_index * D, D);
                            // dS (in dp), scaled by 1/√D for both dq and dk
                            for (int64_t kk = lo; kk <= t; kk++) dpr[kk] = pr[kk] * (dpr[kk] - delta) * scale;
                            float *dqt = dq + row_index * D;
                            memset(dqt, 0, (size_t)D * sizeof *dqt);
                            for (int64_t kk = lo; kk <= t; kk++) axpy(dqt, dpr[kk], kb + (kk * Hkv + g) * D, D);
                            const float *qt = qb + (t * Hq + j) * D;
                            for (int64_t d = 0; d < D; d++) {
                                axpy(dkt + d * T + lo, qt[d], dpr + lo, n);
                                axpy(dvt + d * T + lo, dot_[d], pr + lo, n);
                            }
                        }
                    }
                for (int64_t t = 0; t < T; t++) {
                    float *dkr = dk + ((b * T + t) * Hkv + g) * D, *dvr = dv + ((b * T + t) * Hkv + g) * D;
                    for (int64_t d = 0; d < D; d++) {
                        dkr[d] = dkt[d * T + t];
                        dvr[d] = dvt[d * T + t];
                    }
                }
            }
        free(kt), free(vt), free(dkt), free(dvt), free(p), free(dp);
    }
}

// ---------------------------------------------------------------- classifier loss

// Per row: one pass for the max, one that turns the row into exp(x − max) in place and
// sums it (in double, 8 lanes), one that scales it into the gradient. The exponentials are
// computed once.
void cross_entropy_forward_backward(float *logits, const int32_t *targets, int64_t n, int64_t V, float z_loss,
                                    float grad_scale, double *ce_sum, double *lse_sq_sum) {
    double *row_ce = xmalloc((size_t)n * sizeof *row_ce);
    double *row_lse = xmalloc((size_t)n * sizeof *row_lse);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; r++) {
        float *x = logits + r * V;
        float lane_max[16];
        for (int u = 0; u < 16; u++) lane_max[u] = -INFINITY;
        int64_t i = 0;
        for (; i + 16 <= V; i += 16)
            for (int u = 0; u < 16; u++) lane_max[u] = x[i + u] > lane_max[u] ? x[i + u] : lane_max[u];
        float mx = -INFINITY;
        for (int u = 0; u < 16; u++) mx = lane_max[u] > mx ? lane_max[u] : mx;
        for (; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        float target_logit = x[targets[r]];
        for (i = 0; i < V; i++) x[i] = exp_vec(x[i] - mx);
        double lane_sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (i = 0; i + 8 <= V; i += 8)
            for (int u = 0; u < 8; u++) lane_sum[u] += (double)x[i + u];
        double sum = ((lane_sum[0] + lane_sum[4]) + (lane_sum[1] + lane_sum[5])) +
                     ((lane_sum[2] + lane_sum[6]) + (lane_sum[3] + lane_sum[7]));
        for (; i < V; i++) sum += (double)x[i];
        double lse = (double)mx + log(sum);
        row_lse[r] = lse;
        row_ce[r] = lse - (double)target_logit;
        if (grad_scale != 0.0f) {
            // softmax_i · (1 + 2·z_loss·lse) · grad_scale, minus grad_scale at the target
            float coef = (float)((1.0 + 2.0 * (double)z_loss * lse) / sum) * grad_scale;
            for (i = 0; i < V; i++) x[i] *= coef;
            x[targets[r]] -= grad_scale;
        }
    }
    for (int64_t r = 0; r < n; r++) {
        *ce_sum += row_ce[r];
        *lse_sq_sum += row_lse[r] * row_lse[r];
    }
    free(row_ce);
    free(row_lse);
}
