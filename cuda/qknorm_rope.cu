// cuda/qknorm_rope.cu — QK-norm and RoPE fused: per head, RMSNorm over head_dim with the
// q or k gain, then the rotate-half rotation at the token's position within its document.
//
// Fused because both are per-head, element-wise after one reduction: one read of the raw
// q/k (straight from the fused QKV matmul's output, through a row stride) and one write of
// the attention's input instead of two round trips. NoPE layers (rope = false) keep the
// norm and skip the rotation; without qk_norm, the kernel only rotates (in place).
//
// Layout: the heads of a row are q heads 0..Hq-1 then k heads Hq..Hq+Hkv-1, D each, as in
// the QKV matmul's output. One warp per (row, head); lane l handles the rotation pairs
// (i, i + D/2) for i = l, l + WARP_SIZE, ..., so any even D works and a pair never crosses
// lanes (with 64-wide warps and D ≤ 64, some lanes only join the norm's sum with zeros).
// Positions restart at each document (cpu/ops.c's document_positions, computed on the
// host with the batch); cos/sin tables (T, D/2) come from rope_tables() on the host in
// double, the same tables the CPU uses.
#include "cuda/kernels.h"

enum { HEADS_PER_BLOCK = 8, QK_GAIN_CHUNK_ROWS = 256 };

__global__ void qknorm_rope_forward_kernel(bf16 *out, int64_t out_stride, float *rstd, const bf16 *inp,
                                           int64_t in_stride, const float *gq, const float *gk, const int32_t *pos,
                                           const float *cos_t, const float *sin_t, int64_t N, int Hq, int Hkv, int D,
                                           bool norm, bool rope, float eps) {
    int Htot = Hq + Hkv;
    int64_t row = (int64_t)blockIdx.x * HEADS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N * Htot) return;
    int64_t n = row / Htot;
    int h = (int)(row % Htot);
    const bf16 *x = inp + n * in_stride + (int64_t)h * D;
    bf16 *y = out + n * out_stride + (int64_t)h * D;
    const float *g = h < Hq ? gq : gk;
    int half = D / 2;
    float r = 1.0f;
    if (norm) {
        float ss = 0.0f;
        for (int i = lane; i < D; i += WARP_SIZE) {
            float v = bf16_to_float(x[i]);
            ss += v * v;
        }
        ss = warp_sum(ss);
        r = rsqrtf(ss / (float)D + eps);
        if (lane == 0) rstd[row] = r;
    }
    const float *c = cos_t + (int64_t)pos[n] * half, *s = sin_t + (int64_t)pos[n] * half;
    for (int i = lane; i < half; i += WARP_SIZE) {
        float a = bf16_to_float(x[i]), b = bf16_to_float(x[i + half]);
        if (norm) {
            a = a * r * g[i];
            b = b * r * g[i + half];
        }
        if (rope) {
            float a2 = a * c[i] - b * s[i], b2 = b * c[i] + a * s[i];
            a = a2;
            b = b2;
        }
        y[i] = float_to_bf16(a);
        y[i + half] = float_to_bf16(b);
    }
}

// The rotation is orthogonal: its backward is the rotation by the opposite angle.
//   u1 = d1·cos + d2·sin ; u2 = d2·cos − d1·sin
// then, with norm, dx = r·u·g − x·r³·mean(u·g·x).
__global__ void qknorm_rope_backward_kernel(bf16 *dx, int64_t dx_stride, const bf16 *dy, int64_t dy_stride,
                                            const bf16 *xin, int64_t x_stride, const float *rstd, const float *gq,
                                            const float *gk, const int32_t *pos, const float *cos_t,
                                            const float *sin_t, int64_t N, int Hq, int Hkv, int D, bool norm,
                                            bool rope) {
    int Htot = Hq + Hkv;
    int64_t row = (int64_t)blockIdx.x * HEADS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N * Htot) return;
    int64_t n = row / Htot;
    int h = (int)(row % Htot);
    const bf16 *d = dy + n * dy_stride + (int64_t)h * D;
    const bf16 *x = xin ? xin + n * x_stride + (int64_t)h * D : nullptr;
    bf16 *out = dx + n * dx_stride + (int64_t)h * D;
    const float *g = h < Hq ? gq : gk;
    int half = D / 2;
    const float *c = cos_t + (int64_t)pos[n] * half, *s = sin_t + (int64_t)pos[n] * half;
    float r = norm ? rstd[row] : 1.0f, k = 0.0f;
    if (norm) {
        float ux = 0.0f;
        for (int i = lane; i < half; i += WARP_SIZE) {
            float d1 = bf16_to_float(d[i]), d2 = bf16_to_float(d[i + half]);
            float u1 = rope ? d1 * c[i] + d2 * s[i] : d1, u2 = rope ? d2 * c[i] - d1 * s[i] : d2;
            ux += u1 * g[i] * bf16_to_float(x[i]) + u2 * g[i + half] * bf16_to_float(x[i + half]);
        }
        ux = warp_sum(ux);  // also orders every lane's reads before any lane's in-place writes
        k = ux / (float)D * r * r * r;
    }
    for (int i = lane; i < half; i += WARP_SIZE) {
        float d1 = bf16_to_float(d[i]), d2 = bf16_to_float(d[i + half]);
        float u1 = rope ? d1 * c[i] + d2 * s[i] : d1, u2 = rope ? d2 * c[i] - d1 * s[i] : d2;
        if (norm) {
            u1 = r * u1 * g[i] - bf16_to_float(x[i]) * k;
            u2 = r * u2 * g[i + half] - bf16_to_float(x[i + half]) * k;
        }
        out[i] = float_to_bf16(u1);
        out[i + half] = float_to_bf16(u2);
    }
}

// grid (⌈N·H/256⌉, ⌈(D/2)/32⌉), block (32, 8): the chunks of rows on x, whose limit is
// 2³¹ − 1 (y's is 65 535). Virtual row vr = n·H + (h − h0) over the H
// heads that share the gain. Thread (tx, ty) owns the pair (i, i + D/2), i = 32·bx + tx,
// and rows bx·256 + ty, + 8, ... (i = 32·by + tx); partial (chunks, D).
__global__ void qknorm_gain_partial_kernel(float *partial, const bf16 *dy, int64_t dy_stride, const bf16 *x,
                                           int64_t x_stride, const float *rstd, const int32_t *pos,
                                           const float *cos_t, const float *sin_t, int64_t N, int h0, int H,
                                           int Htot, int D, bool rope) {
    __shared__ float acc1[8][33], acc2[8][33];
    int tx = threadIdx.x, ty = threadIdx.y, half = D / 2;
    int i = blockIdx.y * 32 + tx;
    int64_t rows = N * H;
    int64_t r0 = (int64_t)blockIdx.x * QK_GAIN_CHUNK_ROWS, r1 = min(rows, r0 + QK_GAIN_CHUNK_ROWS);
    float s1 = 0.0f, s2 = 0.0f;
    if (i < half)
        for (int64_t vr = r0 + ty; vr < r1; vr += 8) {
            int64_t n = vr / H;
            int h = h0 + (int)(vr % H);
            const bf16 *d = dy + n * dy_stride + (int64_t)h * D, *xr = x + n * x_stride + (int64_t)h * D;
            float d1 = bf16_to_float(d[i]), d2 = bf16_to_float(d[i + half]);
            float u1 = d1, u2 = d2;
            if (rope) {
                float c = cos_t[(int64_t)pos[n] * half + i], s = sin_t[(int64_t)pos[n] * half + i];
                u1 = d1 * c + d2 * s;
                u2 = d2 * c - d1 * s;
            }
            float r = rstd[n * Htot + h];
            s1 += u1 * bf16_to_float(xr[i]) * r;
            s2 += u2 * bf16_to_float(xr[i + half]) * r;
        }
    acc1[ty][tx] = s1;
    acc2[ty][tx] = s2;
    __syncthreads();
    if (ty == 0 && i < half) {
        float t1 = 0.0f, t2 = 0.0f;
        for (int j = 0; j < 8; j++) {
            t1 += acc1[j][tx];
            t2 += acc2[j][tx];
        }
        partial[(int64_t)blockIdx.x * D + i] = t1;
        partial[(int64_t)blockIdx.x * D + i + half] = t2;
    }
}

int64_t qknorm_gain_scratch_floats(int64_t N, int H, int D) { return cdiv(N * H, QK_GAIN_CHUNK_ROWS) * D; }

// ---------------------------------------------------------------- the launchers (cuda/kernels.h)

void qknorm_rope_forward(const qknorm_rope_args *a, bf16 *out, int64_t out_stride, float *rstd, const bf16 *inp,
                         int64_t in_stride, cudaStream_t stream) {
    if (a->N == 0 || (!a->norm && !a->rope && out == inp)) return;
    int64_t rows = a->N * (a->Hq + a->Hkv);
    qknorm_rope_forward_kernel<<<(unsigned)cdiv(rows, HEADS_PER_BLOCK), WARP_SIZE * HEADS_PER_BLOCK, 0, stream>>>(
        out, out_stride, rstd, inp, in_stride, a->gq, a->gk, a->pos, a->cos_t, a->sin_t, a->N, a->Hq, a->Hkv, a->D,
        a->norm, a->rope, a->eps);
    CUDA_CHECK_LAUNCH();
}

void qknorm_rope_backward(const qknorm_rope_args *a, bf16 *dx, int64_t dx_stride, const bf16 *dy, int64_t dy_stride,
                          const bf16 *x, int64_t x_stride, const float *rstd, cudaStream_t stream) {
    if (a->N == 0 || (!a->norm && !a->rope && dx == dy)) return;
    int64_t rows = a->N * (a->Hq + a->Hkv);
    qknorm_rope_backward_kernel<<<(unsigned)cdiv(rows, HEADS_PER_BLOCK), WARP_SIZE * HEADS_PER_BLOCK, 0, stream>>>(
        dx, dx_stride, dy, dy_stride, x, x_stride, rstd, a->gq, a->gk, a->pos, a->cos_t, a->sin_t, a->N, a->Hq,
        a->Hkv, a->D, a->norm, a->rope);
    CUDA_CHECK_LAUNCH();
}

void qknorm_gain_grad(const qknorm_rope_args *a, int h0, int H, float *dg, float *scratch, const bf16 *dy,
                      int64_t dy_stride, const bf16 *x, int64_t x_stride, const float *rstd, cudaStream_t stream) {
    if (a->N == 0 || H == 0) return;
    int64_t chunks = cdiv(a->N * H, QK_GAIN_CHUNK_ROWS);
    qknorm_gain_partial_kernel<<<dim3((unsigned)chunks, (unsigned)cdiv(a->D / 2, 32)), dim3(32, 8), 0, stream>>>(
        scratch, dy, dy_stride, x, x_stride, rstd, a->pos, a->cos_t, a->sin_t, a->N, h0, H, a->Hq + a->Hkv, a->D,
        a->rope);
    CUDA_CHECK_LAUNCH();
    column_sums_add(dg, scratch, chunks, a->D, stream);  // in parallel, in a fixed order (cuda/rmsnorm.cu)
}
