// cuda/classifier.cu — cross-entropy + z-loss and their gradient, fused, over one chunk of
// rows of logits, the gradient written in place over the logits.
//
// The classifier never holds B·T·V logits: train_gpt.cu's GPU model runs it over chunks of
// rows (a chunk's bf16 logits are bounded to a fixed size whatever the vocabulary), and for
// each chunk this kernel turns the logits into per-row loss terms and, in the same buffer,
// the bf16 gradient that the two backward matmuls of the head read. The logits are bf16 (the
// head matmul's output, as in llm.c and PyTorch's bf16 training): a logit carries a relative
// rounding of at most 2^-9, so a row's ce = lse − logit[target] moves by up to |logit|·2^-9
// (~0.01 at |logit| 5), a random error that averages out over the rows of a batch (the GPU
// tests' loss bound is 1 %); the sums themselves run in fp32 and double.
//
// One block per row, two passes over the row, each 8 logits per 16-byte access where the row
// is aligned: pass 1 keeps a running (max, sum of exp) per thread and combines them in a
// fixed tree (block_max, then block_sum in double); pass 2 overwrites each logit with
//   dlogit = (softmax · (1 + 2·z_loss·lse) − onehot(target)) · grad_scale
// which is the gradient of grad_scale·(ce + z_loss·lse²): z-loss adds 2·z·lse·softmax
// (BACKGROUND.md §3). In place is safe: each element is read and written by the same thread,
// and the target's logit is read before the reductions' barriers, which every thread passes
// only after the whole row was read. The second pass reads from L2: a row (V·2 bytes, 100 KB
// at GPT-2's vocabulary) per block in flight is far below L2's size, so HBM sees the row once
// read and once written. expf, not __expf: the fast one is off by a few ulp more.
#include "cuda/kernels.h"

enum { CE_THREADS = 512 };

// The online (max, Σ exp) of one more value.
__device__ __forceinline__ void online_add(float v, float &m, float &s) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else {
        s += expf(v - m);
    }
}

// The gradient of one logit x in column i (coef = (1 + 2·z_loss·lse)·grad_scale / Σ exp).
__device__ __forceinline__ bf16 dlogit(float x, int64_t i, float mx, float coef, int32_t target, float grad_scale) {
    float g = expf(x - mx) * coef;
    if (i == target) g -= grad_scale;
    return float_to_bf16(g);
}

__global__ void __launch_bounds__(CE_THREADS)
    cross_entropy_kernel(bf16 *logits, float *row_ce, float *row_lse, const int32_t *targets, int64_t V, int64_t ld,
                         bool vec, float z_loss, float grad_scale, bool train) {
    __shared__ float shared_f[32];
    __shared__ double shared_d[32];
    int64_t row = blockIdx.x;
    bf16 *x = logits + row * ld;
    int32_t target = targets[row];
    float x_target = threadIdx.x == 0 ? bf16_to_float(x[target]) : 0.0f;  // before any thread writes
    // Columns [0, V8) in 8-wide accesses when the row allows, the rest one by one.
    int64_t V8 = vec ? V / 8 * 8 : 0;
    float m = -INFINITY, s = 0.0f;
    for (int64_t i = 8 * (int64_t)threadIdx.x; i < V8; i += 8 * CE_THREADS) {
        bf16 v[8];
        load_bf16x8(v, x + i);
#pragma unroll
        for (int k = 0; k < 8; k++) online_add(bf16_to_float(v[k]), m, s);
    }
    for (int64_t i = V8 + threadIdx.x; i < V; i += CE_THREADS) online_add(bf16_to_float(x[i]), m, s);
    float mx = block_max(m, shared_f);
    double part = m == -INFINITY ? 0.0 : (double)(s * expf(m - mx));
    double sum = block_sum(part, shared_d);
    float lse = (float)((double)mx + log(sum));
    if (threadIdx.x == 0) {
        row_lse[row] = lse;
        row_ce[row] = lse - x_target;
    }
    if (!train) return;
    float coef = (float)((1.0 + 2.0 * (double)z_loss * (double)lse) / sum) * grad_scale;
    for (int64_t i = 8 * (int64_t)threadIdx.x; i < V8; i += 8 * CE_THREADS) {
        bf16 v[8];
        load_bf16x8(v, x + i);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = dlogit(bf16_to_float(v[k]), i + k, mx, coef, target, grad_scale);
        store_bf16x8(x + i, v);
    }
    for (int64_t i = V8 + threadIdx.x; i < V; i += CE_THREADS)
        x[i] = dlogit(bf16_to_float(x[i]), i, mx, coef, target, grad_scale);
}

void cross_entropy_forward_backward(bf16 *logits, float *row_ce, float *row_lse, const int32_t *targets, int64_t n,
                                    int64_t V, int64_t ld, float z_loss, float grad_scale, bool train,
                                    cudaStream_t stream) {
    if (n == 0) return;
    bool vec = aligned_to(logits, 16) && ld % 8 == 0;
    cross_entropy_kernel<<<(unsigned)n, CE_THREADS, 0, stream>>>(logits, row_ce, row_lse, targets, V, ld, vec, z_loss,
                                                                 grad_scale, train);
    CUDA_CHECK_LAUNCH();
}

// One block of 1024: thread i takes rows i, i + 1024, ... in order, then the fixed tree.
__global__ void loss_sums_kernel(double *sums, const float *row_ce, const float *row_lse, int64_t N) {
    __shared__ double shared[32];
    double ce = 0.0, sq = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        ce += (double)row_ce[i];
        sq += (double)row_lse[i] * (double)row_lse[i];
    }
    ce = block_sum(ce, shared);
    sq = block_sum(sq, shared);
    if (threadIdx.x == 0) {
        sums[0] += ce;
        sums[1] += sq;
    }
}

void loss_sums_accumulate(double *sums, const float *row_ce, const float *row_lse, int64_t N, cudaStream_t stream) {
    if (N == 0) return;
    loss_sums_kernel<<<1, 1024, 0, stream>>>(sums, row_ce, row_lse, N);
    CUDA_CHECK_LAUNCH();
}
