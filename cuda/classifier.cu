// cuda/classifier.cu — cross-entropy + z-loss and their gradient, fused, over one chunk of
// rows of logits.
//
// The classifier never holds B·T·V logits: train_gpt.cu's GPU model runs it over chunks of rows (a
// chunk's fp32 logits and bf16 gradient are bounded to a fixed size whatever the
// vocabulary), and for each chunk this kernel turns the logits into per-row loss terms and
// the bf16 gradient that the two backward matmuls of the head read. The logits are fp32
// (the head matmul's fp32 output) so the loss matches the CPU's to fp32 rounding; the
// gradient is bf16 because it is a matmul input.
//
// One block per row: pass 1 keeps a running (max, sum of exp) per thread and combines them
// in a fixed tree (block_max, then block_sum in double); pass 2 writes
//   dlogits = (softmax · (1 + 2·z_loss·lse) − onehot(target)) · grad_scale
// which is the gradient of grad_scale·(ce + z_loss·lse²): z-loss adds 2·z·lse·softmax
// (BACKGROUND.md §3). expf, not __expf: the fast one is off by a few ulp more.
#include "cuda/kernels.h"

enum { CE_THREADS = 512 };

__global__ void __launch_bounds__(CE_THREADS)
    cross_entropy_kernel(bf16 *dlogits, float *row_ce, float *row_lse, const float *logits, const int32_t *targets,
                         int64_t V, int64_t ld, float z_loss, float grad_scale) {
    __shared__ float shared_f[32];
    __shared__ double shared_d[32];
    int64_t row = blockIdx.x;
    const float *x = logits + row * ld;
    float m = -INFINITY, s = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += CE_THREADS) {
        float v = x[i];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    float mx = block_max(m, shared_f);
    double part = m == -INFINITY ? 0.0 : (double)(s * expf(m - mx));
    double sum = block_sum(part, shared_d);
    float lse = (float)((double)mx + log(sum));
    int32_t target = targets[row];
    if (threadIdx.x == 0) {
        row_lse[row] = lse;
        row_ce[row] = lse - x[target];
    }
    if (!dlogits) return;
    float coef = (float)((1.0 + 2.0 * (double)z_loss * (double)lse) / sum) * grad_scale;
    bf16 *d = dlogits + row * ld;
    for (int64_t i = threadIdx.x; i < V; i += CE_THREADS) {
        float g = expf(x[i] - mx) * coef;
        if (i == target) g -= grad_scale;
        d[i] = float_to_bf16(g);
    }
}

void cross_entropy_forward_backward(bf16 *dlogits, float *row_ce, float *row_lse, const float *logits,
                                    const int32_t *targets, int64_t n, int64_t V, int64_t ld, float z_loss,
                                    float grad_scale, cudaStream_t stream) {
    if (n == 0) return;
    cross_entropy_kernel<<<(unsigned)n, CE_THREADS, 0, stream>>>(dlogits, row_ce, row_lse, logits, targets, V, ld,
                                                                 z_loss, grad_scale);
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
