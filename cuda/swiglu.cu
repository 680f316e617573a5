// cuda/swiglu.cu — the SwiGLU activation, act = silu(gate) ⊙ up, forward and backward.
//
// gate_proj and up_proj are adjacent in the parameter table, so one matmul with the
// stacked (2F, C) weight produces both halves of a (N, 2F) row: gate in [0, F), up in
// [F, 2F). This kernel reads both halves and writes act (N, F); the backward writes the
// gradient of the stacked row, which feeds the stacked backward matmuls directly.
// Element-wise, fp32 arithmetic on bf16 storage, with expf (not __expf) so that the
// result follows the CPU reference to within bf16 rounding. Memory-bound: a thread takes 8
// neighbouring columns of one row with 16-byte accesses, the rows on the grid's x dimension
// and the column blocks on y, so no thread divides a 64-bit index (F a multiple of 8 and
// aligned rows: every model of configs/; else one element per thread).
#include "cuda/kernels.h"

enum { VEC_THREADS = 256 };

static bool swiglu_vectors(int64_t F, const void *a, const void *b, const void *c) {
    return F % 8 == 0 && aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(c, 16);
}
static dim3 swiglu_grid(int64_t N, int64_t F) { return dim3((unsigned)N, (unsigned)cdiv(F / 8, VEC_THREADS)); }

// grid (N, ⌈F/8/256⌉), 256 threads: columns 8t..8t+7 of row blockIdx.x.
__global__ void __launch_bounds__(VEC_THREADS) swiglu_forward_vec_kernel(bf16 *act, const bf16 *gate_up, int64_t F) {
    int64_t n = blockIdx.x, f = 8 * ((int64_t)blockIdx.y * VEC_THREADS + threadIdx.x);
    if (f >= F) return;
    bf16 g[8], u[8], a[8];
    load_bf16x8(g, gate_up + n * 2 * F + f);
    load_bf16x8(u, gate_up + n * 2 * F + F + f);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float x = bf16_to_float(g[i]);
        a[i] = float_to_bf16(x / (1.0f + expf(-x)) * bf16_to_float(u[i]));
    }
    store_bf16x8(act + n * F + f, a);
}

// The same grid: d_gate_up's two halves for columns 8t..8t+7.
__global__ void __launch_bounds__(VEC_THREADS) swiglu_backward_vec_kernel(bf16 *d_gate_up, const bf16 *dact,
                                                                          const bf16 *gate_up, int64_t F) {
    int64_t n = blockIdx.x, f = 8 * ((int64_t)blockIdx.y * VEC_THREADS + threadIdx.x);
    if (f >= F) return;
    bf16 g[8], u[8], d[8], dg[8], du[8];
    load_bf16x8(g, gate_up + n * 2 * F + f);
    load_bf16x8(u, gate_up + n * 2 * F + F + f);
    load_bf16x8(d, dact + n * F + f);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float x = bf16_to_float(g[i]), up = bf16_to_float(u[i]), dd = bf16_to_float(d[i]);
        float sig = 1.0f / (1.0f + expf(-x));
        du[i] = float_to_bf16(dd * x * sig);
        dg[i] = float_to_bf16(dd * up * sig * (1.0f + x * (1.0f - sig)));
    }
    store_bf16x8(d_gate_up + n * 2 * F + f, dg);
    store_bf16x8(d_gate_up + n * 2 * F + F + f, du);
}

__global__ void swiglu_forward_kernel(bf16 *act, const bf16 *gate_up, int64_t N, int64_t F) {
    int64_t total = N * F;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / F, f = i % F;
        float x = bf16_to_float(gate_up[n * 2 * F + f]);
        float u = bf16_to_float(gate_up[n * 2 * F + F + f]);
        act[i] = float_to_bf16(x / (1.0f + expf(-x)) * u);
    }
}

static unsigned elementwise_blocks(int64_t total) {
    int64_t blocks = cdiv(total, 256);
    return (unsigned)(blocks < 65536 * 8 ? blocks : 65536 * 8);
}

void swiglu_forward(bf16 *act, const bf16 *gate_up, int64_t N, int64_t F, cudaStream_t stream) {
    if (N * F == 0) return;
    if (swiglu_vectors(F, act, gate_up, gate_up)) {
        swiglu_forward_vec_kernel<<<swiglu_grid(N, F), VEC_THREADS, 0, stream>>>(act, gate_up, F);
        CUDA_CHECK_LAUNCH();
        return;
    }
    swiglu_forward_kernel<<<elementwise_blocks(N * F), 256, 0, stream>>>(act, gate_up, N, F);
    CUDA_CHECK_LAUNCH();
}

// silu'(x) = σ(x)·(1 + x·(1 − σ(x)))
__global__ void swiglu_backward_kernel(bf16 *d_gate_up, const bf16 *dact, const bf16 *gate_up, int64_t N,
                                       int64_t F) {
    int64_t total = N * F;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / F, f = i % F;
        float x = bf16_to_float(gate_up[n * 2 * F + f]);
        float u = bf16_to_float(gate_up[n * 2 * F + F + f]);
        float d = bf16_to_float(dact[i]);
        float sig = 1.0f / (1.0f + expf(-x));
        d_gate_up[n * 2 * F + F + f] = float_to_bf16(d * x * sig);
        d_gate_up[n * 2 * F + f] = float_to_bf16(d * u * sig * (1.0f + x * (1.0f - sig)));
    }
}

void swiglu_backward(bf16 *d_gate_up, const bf16 *dact, const bf16 *gate_up, int64_t N, int64_t F,
                     cudaStream_t stream) {
    if (N * F == 0) return;
    if (swiglu_vectors(F, d_gate_up, dact, gate_up)) {
        swiglu_backward_vec_kernel<<<swiglu_grid(N, F), VEC_THREADS, 0, stream>>>(d_gate_up, dact, gate_up, F);
        CUDA_CHECK_LAUNCH();
        return;
    }
    swiglu_backward_kernel<<<elementwise_blocks(N * F), 256, 0, stream>>>(d_gate_up, dact, gate_up, N, F);
    CUDA_CHECK_LAUNCH();
}
