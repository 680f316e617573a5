// cuda/swiglu.cu — the SwiGLU activation, act = silu(gate) ⊙ up, forward and backward.
//
// gate_proj and up_proj are adjacent in the parameter table, so one matmul with the
// stacked (2F, C) weight produces both halves of a (N, 2F) row: gate in [0, F), up in
// [F, 2F). This kernel reads both halves and writes act (N, F); the backward writes the
// gradient of the stacked row, which feeds the stacked backward matmuls directly.
// Element-wise, fp32 arithmetic on bf16 storage, with expf (not __expf) so that the
// result follows the CPU reference to within bf16 rounding.
#include "cuda/kernels.h"

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
    swiglu_backward_kernel<<<elementwise_blocks(N * F), 256, 0, stream>>>(d_gate_up, dact, gate_up, N, F);
    CUDA_CHECK_LAUNCH();
}
