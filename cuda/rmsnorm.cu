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
// One warp per row: rows are 1–8k wide, so a warp's loop over the row is enough to keep
// the loads coalesced, and the row's statistics need only shuffles (a warp is WARP_SIZE
// lanes: 32, or 64 on AMD's CDNA). The gain gradient is a sum over all rows, done
// deterministically in two kernels (partial sums over fixed chunks of rows, then a
// fixed-order sum over chunks), never with atomics; its blocks are 32 × 8 tiles of
// threads, whatever the warp size.
#include "cuda/kernels.h"

enum { ROWS_PER_BLOCK = 8, GAIN_CHUNK_ROWS = 256 };

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

void rmsnorm_forward(bf16 *out, float *rstd, const float *inp, const float *g, int64_t N, int64_t C, float eps,
                     cudaStream_t stream) {
    if (N == 0) return;
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

void rmsnorm_backward(float *dinp, bf16 *dinp_bf16, const float *dout, const float *inp, const float *g,
                      const float *rstd, int64_t N, int64_t C, bool accumulate, cudaStream_t stream) {
    if (N == 0) return;
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

// dg[c] += Σ_chunk partial[chunk][c], chunks in order.
__global__ void gain_finish_kernel(float *dg, const float *partial, int64_t chunks, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float total = 0.0f;
    for (int64_t i = 0; i < chunks; i++) total += partial[i * C + c];
    dg[c] += total;
}

int64_t rmsnorm_gain_scratch_floats(int64_t N, int64_t C) { return cdiv(N, GAIN_CHUNK_ROWS) * C; }

void rmsnorm_gain_grad(float *dg, float *scratch, const float *dout, const float *inp, const float *rstd,
                       int64_t N, int64_t C, cudaStream_t stream) {
    if (N == 0) return;
    int64_t chunks = cdiv(N, GAIN_CHUNK_ROWS);
    rmsnorm_gain_partial_kernel<<<dim3((unsigned)chunks, (unsigned)cdiv(C, 32)), dim3(32, 8), 0, stream>>>(
        scratch, dout, inp, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    gain_finish_kernel<<<(unsigned)cdiv(C, 256), 256, 0, stream>>>(dg, scratch, chunks, C);
    CUDA_CHECK_LAUNCH();
}
