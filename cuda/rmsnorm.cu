// cuda/rmsnorm.cu — RMSNorm over the fp32 residual stream, forward and backward.
//
// The residual stream stays fp32 (see docs/cuda.md): the residual adds themselves are fused
// into the matmuls that produce them (cuBLASLt's D = A·B + C with C the stream), which is
// cheaper than a separate add+norm kernel because the epilogue reads C while the product's
// tile is still in registers. What is fused here is the other side: the forward writes the
// bf16 normalized rows the next matmul reads, and the backward adds the norm's input
// gradient into the fp32 stream gradient and writes its bf16 copy for the next matmuls in
// the same pass.
//
// The row kernels (rows up to 8192 wide, 16-byte aligned: every model of configs/): a block
// of 256 threads walks a chunk of 32 rows, one row at a time; each thread holds its columns
// of the row in registers (16-byte loads, 4 columns per load, K loads per row), so a row is
// read from memory once: the forward reads x and writes y, the backward reads dy, x and
// the old dx and writes dx and its bf16 copy. The row's sum (Σx², Σdy·g·x) is a block
// reduction in a fixed order. The backward also folds in the gain gradient: each thread
// adds dy·x·r of its columns over the chunk's rows in registers and writes the chunk's
// partial sums; column_sums_add adds the chunks in a fixed order. Deterministic, no atomics.
//
// The fallback (wider rows, unaligned pointers): one warp per row, 4-byte accesses, the
// gain gradient in its own pass (partial sums over fixed chunks of rows in 32 × 8 tiles of
// threads, whatever the warp size, then the same ordered sum over chunks).
#include "cuda/kernels.h"

#include <initializer_list>

enum { ROWS_PER_BLOCK = 8, GAIN_CHUNK_ROWS = 256 };
enum { ROW_THREADS = 256, ROW_CHUNK = 32, ROW_MAX_LOADS = 8 };  // the row kernels: C ≤ 4·256·8

// How many 16-byte loads per thread a row of C takes, or 0 when the row kernels do not apply.
static int row_loads(int64_t C, std::initializer_list<const void *> vectors16, const void *bf16_out) {
    int64_t K = cdiv(C, 4 * ROW_THREADS);
    if (C % 4 || K > ROW_MAX_LOADS || !aligned_to(bf16_out, 8)) return 0;
    for (const void *p : vectors16)
        if (!aligned_to(p, 16)) return 0;
    return (int)K;
}

// Column c of this thread's k-th load.
__device__ __forceinline__ int64_t row_column(int k) { return 4 * ((int64_t)threadIdx.x + (int64_t)ROW_THREADS * k); }

// grid ⌈N/32⌉, 256 threads.
template <int K>
__global__ void __launch_bounds__(ROW_THREADS) rmsnorm_forward_rows_kernel(bf16 *out, float *rstd, const float *inp,
                                                                           const float *g, int64_t N, int64_t C,
                                                                           float eps) {
    __shared__ float red[32];
    int64_t r0 = (int64_t)blockIdx.x * ROW_CHUNK, r1 = min(N, r0 + ROW_CHUNK);
    float4 gw[K];
#pragma unroll
    for (int k = 0; k < K; k++) gw[k] = row_column(k) < C ? load_float4(g + row_column(k)) : float4{};
    for (int64_t row = r0; row < r1; row++) {
        const float *x = inp + row * C;
        float4 xv[K];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            xv[k] = float4{};
            if (row_column(k) < C) {
                xv[k] = load_float4(x + row_column(k));
                ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
            }
        }
        ss = block_sum(ss, red);
        float r = rsqrtf(ss / (float)C + eps);
        if (threadIdx.x == 0) rstd[row] = r;
        bf16 *y = out + row * C;
#pragma unroll
        for (int k = 0; k < K; k++)
            if (row_column(k) < C)
                store_bf16x4(y + row_column(k), xv[k].x * r * gw[k].x, xv[k].y * r * gw[k].y, xv[k].z * r * gw[k].z,
                             xv[k].w * r * gw[k].w);
    }
}

// grid ⌈N/32⌉, 256 threads; partial (⌈N/32⌉, C): the chunk's Σ dy·x·r per column.
template <int K>
__global__ void __launch_bounds__(ROW_THREADS) rmsnorm_backward_rows_kernel(float *dinp, bf16 *dinp_bf16,
                                                                            float *partial, const float *dout,
                                                                            const float *inp, const float *g,
                                                                            const float *rstd, int64_t N, int64_t C,
                                                                            bool accumulate) {
    __shared__ float red[32];
    int64_t r0 = (int64_t)blockIdx.x * ROW_CHUNK, r1 = min(N, r0 + ROW_CHUNK);
    float4 gw[K], gain[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        gain[k] = float4{};
        gw[k] = row_column(k) < C ? load_float4(g + row_column(k)) : float4{};
    }
    for (int64_t row = r0; row < r1; row++) {
        const float *x = inp + row * C, *dy = dout + row * C;
        float r = rstd[row];
        float4 xv[K], dv[K];
        float ux = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            xv[k] = dv[k] = float4{};
            if (row_column(k) < C) {
                xv[k] = load_float4(x + row_column(k));
                dv[k] = load_float4(dy + row_column(k));
                ux += dv[k].x * gw[k].x * xv[k].x + dv[k].y * gw[k].y * xv[k].y + dv[k].z * gw[k].z * xv[k].z +
                      dv[k].w * gw[k].w * xv[k].w;
            }
        }
        ux = block_sum(ux, red);
        float kx = ux / (float)C * r * r * r;
        float *dx = dinp + row * C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            int64_t c = row_column(k);
            if (c >= C) continue;
            float4 v = make_float4(r * dv[k].x * gw[k].x - xv[k].x * kx, r * dv[k].y * gw[k].y - xv[k].y * kx,
                                   r * dv[k].z * gw[k].z - xv[k].z * kx, r * dv[k].w * gw[k].w - xv[k].w * kx);
            if (accumulate) {
                float4 old = load_float4(dx + c);
                v = make_float4(v.x + old.x, v.y + old.y, v.z + old.z, v.w + old.w);
            }
            store_float4(dx + c, v);
            if (dinp_bf16) store_bf16x4(dinp_bf16 + row * C + c, v.x, v.y, v.z, v.w);
            gain[k].x += dv[k].x * xv[k].x * r;
            gain[k].y += dv[k].y * xv[k].y * r;
            gain[k].z += dv[k].z * xv[k].z * r;
            gain[k].w += dv[k].w * xv[k].w * r;
        }
    }
#pragma unroll
    for (int k = 0; k < K; k++)
        if (row_column(k) < C) store_float4(partial + (int64_t)blockIdx.x * C + row_column(k), gain[k]);
}

// grid ⌈N/8⌉, block 8 warps: warp w of block b owns row 8b + w.
__global__ void rmsnorm_forward_kernel(bf16 *out, float *rstd, const float *inp, const float *g, int64_t N,
                                       int64_t C, float eps) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const float *x = inp + row * C;
    float ss = 0.0f;
    for (int64_t c = lane; c < C; c += WARP_SIZE) ss += x[c] * x[c];
    ss = warp_sum(ss);
    float r = rsqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[row] = r;
    bf16 *y = out + row * C;
    for (int64_t c = lane; c < C; c += WARP_SIZE) y[c] = float_to_bf16(x[c] * r * g[c]);
}

template <int K>
static void forward_rows(bf16 *out, float *rstd, const float *inp, const float *g, int64_t N, int64_t C, float eps,
                         cudaStream_t stream) {
    rmsnorm_forward_rows_kernel<K><<<(unsigned)cdiv(N, ROW_CHUNK), ROW_THREADS, 0, stream>>>(out, rstd, inp, g, N, C,
                                                                                              eps);
    CUDA_CHECK_LAUNCH();
}

void rmsnorm_forward(bf16 *out, float *rstd, const float *inp, const float *g, int64_t N, int64_t C, float eps,
                     cudaStream_t stream) {
    if (N == 0) return;
    switch (row_loads(C, {inp, g}, out)) {
    case 1: return forward_rows<1>(out, rstd, inp, g, N, C, eps, stream);
    case 2: return forward_rows<2>(out, rstd, inp, g, N, C, eps, stream);
    case 3: return forward_rows<3>(out, rstd, inp, g, N, C, eps, stream);
    case 4: return forward_rows<4>(out, rstd, inp, g, N, C, eps, stream);
    case 5: return forward_rows<5>(out, rstd, inp, g, N, C, eps, stream);
    case 6: return forward_rows<6>(out, rstd, inp, g, N, C, eps, stream);
    case 7: return forward_rows<7>(out, rstd, inp, g, N, C, eps, stream);
    case 8: return forward_rows<8>(out, rstd, inp, g, N, C, eps, stream);
    default: break;
    }
    rmsnorm_forward_kernel<<<(unsigned)cdiv(N, ROWS_PER_BLOCK), WARP_SIZE * ROWS_PER_BLOCK, 0, stream>>>(
        out, rstd, inp, g, N, C, eps);
    CUDA_CHECK_LAUNCH();
}

// y = x·r·g with r = (mean(x²)+eps)^-1/2. With u = dy·g:
//   dx = r·u − x·r³·mean(u·x)
__global__ void rmsnorm_backward_kernel(float *dinp, bf16 *dinp_bf16, const float *dout, const float *inp,
                                        const float *g, const float *rstd, int64_t N, int64_t C, bool accumulate) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= N) return;
    const float *x = inp + row * C, *dy = dout + row * C;
    float r = rstd[row];
    float ux = 0.0f;
    for (int64_t c = lane; c < C; c += WARP_SIZE) ux += dy[c] * g[c] * x[c];
    ux = warp_sum(ux);
    float k = ux / (float)C * r * r * r;
    float *dx = dinp + row * C;
    bf16 *dxb = dinp_bf16 ? dinp_bf16 + row * C : nullptr;
    for (int64_t c = lane; c < C; c += WARP_SIZE) {
        float v = r * dy[c] * g[c] - x[c] * k;
        if (accumulate) v += dx[c];
        dx[c] = v;
        if (dxb) dxb[c] = float_to_bf16(v);
    }
}

static void rmsnorm_gain_grad(float *dg, float *scratch, const float *dout, const float *inp, const float *rstd,
                              int64_t N, int64_t C, cudaStream_t stream);

template <int K>
static void backward_rows(float *dinp, bf16 *dinp_bf16, float *partial, const float *dout, const float *inp,
                          const float *g, const float *rstd, int64_t N, int64_t C, bool accumulate,
                          cudaStream_t stream) {
    rmsnorm_backward_rows_kernel<K><<<(unsigned)cdiv(N, ROW_CHUNK), ROW_THREADS, 0, stream>>>(
        dinp, dinp_bf16, partial, dout, inp, g, rstd, N, C, accumulate);
    CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(float *dinp, bf16 *dinp_bf16, float *dg, float *scratch, const float *dout, const float *inp,
                      const float *g, const float *rstd, int64_t N, int64_t C, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
    int K = row_loads(C, {dinp, dout, inp, g, scratch}, dinp_bf16);
    switch (K) {
    case 1: backward_rows<1>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 2: backward_rows<2>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 3: backward_rows<3>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 4: backward_rows<4>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 5: backward_rows<5>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 6: backward_rows<6>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 7: backward_rows<7>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    case 8: backward_rows<8>(dinp, dinp_bf16, scratch, dout, inp, g, rstd, N, C, accumulate, stream); break;
    default: break;
    }
    if (K > 0) {
        column_sums_add(dg, scratch, cdiv(N, ROW_CHUNK), C, stream);
        return;
    }
    // The gains first: dinp may be the buffer the fallback's gain pass reads as dout.
    rmsnorm_gain_grad(dg, scratch, dout, inp, rstd, N, C, stream);
    rmsnorm_backward_kernel<<<(unsigned)cdiv(N, ROWS_PER_BLOCK), WARP_SIZE * ROWS_PER_BLOCK, 0, stream>>>(
        dinp, dinp_bf16, dout, inp, g, rstd, N, C, accumulate);
    CUDA_CHECK_LAUNCH();
}

// grid (⌈N/256⌉, ⌈C/32⌉), block (32, 8), the chunks of rows on x (y's limit is 65 535):
// thread (tx, ty) of block (bx, by) owns column 32·by + tx and rows bx·256 + ty, + 8, ...; the 8 partial sums of a column are then added
// in ty order. partial (chunks, C).
__global__ void rmsnorm_gain_partial_kernel(float *partial, const float *dout, const float *inp, const float *rstd,
                                            int64_t N, int64_t C) {
    __shared__ float acc[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t c = (int64_t)blockIdx.y * 32 + tx;
    int64_t r0 = (int64_t)blockIdx.x * GAIN_CHUNK_ROWS, r1 = min(N, r0 + GAIN_CHUNK_ROWS);
    float s = 0.0f;
    if (c < C)
        for (int64_t r = r0 + ty; r < r1; r += 8) s += dout[r * C + c] * inp[r * C + c] * rstd[r];
    acc[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float total = 0.0f;
        for (int i = 0; i < 8; i++) total += acc[i][tx];
        partial[(int64_t)blockIdx.x * C + c] = total;
    }
}

// grid ⌈C/32⌉, block (32, 32): thread (tx, ty) adds chunks ty, ty + 32, ... of column
// 32·bx + tx in order, then the 32 sums are added in ty order: the same bits every run,
// and 32 threads per column instead of one walking every chunk.
__global__ void __launch_bounds__(1024) column_sums_kernel(float *dg, const float *partial, int64_t chunks, int64_t C) {
    __shared__ float acc[32][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t c = (int64_t)blockIdx.x * 32 + tx;
    float s = 0.0f;
    if (c < C)
        for (int64_t i = ty; i < chunks; i += 32) s += partial[i * C + c];
    acc[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float total = 0.0f;
        for (int j = 0; j < 32; j++) total += acc[j][tx];
        dg[c] += total;
    }
}

void column_sums_add(float *dg, const float *partial, int64_t chunks, int64_t C, cudaStream_t stream) {
    if (C == 0) return;
    column_sums_kernel<<<(unsigned)cdiv(C, 32), dim3(32, 32), 0, stream>>>(dg, partial, chunks, C);
    CUDA_CHECK_LAUNCH();
}

int64_t rmsnorm_gain_scratch_floats(int64_t N, int64_t C) { return cdiv(N, ROW_CHUNK) * C; }

static void rmsnorm_gain_grad(float *dg, float *scratch, const float *dout, const float *inp, const float *rstd,
                       int64_t N, int64_t C, cudaStream_t stream) {
    if (N == 0) return;
    int64_t chunks = cdiv(N, GAIN_CHUNK_ROWS);
    rmsnorm_gain_partial_kernel<<<dim3((unsigned)chunks, (unsigned)cdiv(C, 32)), dim3(32, 8), 0, stream>>>(
        scratch, dout, inp, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    column_sums_add(dg, scratch, chunks, C, stream);
}
