// cuda/adamw.cu — the optimizer's side of a step on the GPU, with no host round trip.
//
//   grad_norm_partials  fixed grid (GRAD_NORM_BLOCKS blocks): each block sums g² over a
//                       fixed, strided slice in double, then a fixed-order block tree
//   step_prepare        one block: the partials in a fixed order → the global norm; the
//                       outlier guard (non-finite loss, z-loss or norm → skip); the clip
//                       factor of torch.nn.utils.clip_grad_norm_ (max/(norm + 1e-6) when
//                       below 1); AdamW's t and bias corrections, from the device-side t
//   adamw_update        one pass over the flat parameter table: clip, decoupled decay,
//                       moments, the update, the bf16 copy of the new weight, and zeroing
//                       the gradient for the next step's accumulation
// The norm is the same bits on every run (no atomics, fixed shapes), which the clip and
// so the whole step inherit. The table's per-tensor decay flag reaches the fused kernel
// through a chunk list built once (adamw_chunk: start, count, decay): one block per
// chunk, each chunk inside one tensor.
//
// Keeping t on the device is what lets the guard skip a step without the host knowing yet:
// the host learns of it when it reads the step's scalars back (asynchronously, for the log).
#include "cuda/kernels.h"

enum { NORM_THREADS = 512, ADAMW_THREADS = 256 };

__global__ void __launch_bounds__(NORM_THREADS) grad_norm_kernel(double *partials, const float *g, int64_t n) {
    __shared__ double shared[32];
    int64_t stride = (int64_t)GRAD_NORM_BLOCKS * NORM_THREADS;
    int64_t n4 = n / 4;
    const float4 *g4 = reinterpret_cast<const float4 *>(g);
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * NORM_THREADS + threadIdx.x; i < n4; i += stride) {
        float4 v = g4[i];
        s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
    }
    if (blockIdx.x == 0)
        for (int64_t i = 4 * n4 + threadIdx.x; i < n; i += NORM_THREADS) s += (double)g[i] * g[i];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

void grad_norm_partials(double *partials, const float *grads, int64_t n, cudaStream_t stream) {
    grad_norm_kernel<<<GRAD_NORM_BLOCKS, NORM_THREADS, 0, stream>>>(partials, grads, n);
    CUDA_CHECK_LAUNCH();
}

// One block of GRAD_NORM_BLOCKS threads.
__global__ void step_prepare_kernel(step_scalars *st, const double *partials, double rows, double z_loss,
                                    double max_norm, double lr, double beta1, double beta2, double spike_loss,
                                    double spike_norm) {
    __shared__ double shared[32];
    double total = block_sum(partials[threadIdx.x], shared);
    if (threadIdx.x != 0) return;
    double norm = sqrt(total);
    double loss = st->ce_sum / rows, zl = z_loss * st->lse_sq_sum / rows;
    st->grad_norm = norm;
    st->clip_coef = 1.0;
    st->clip_scale = 1.0f;
    if (!isfinite(loss) || !isfinite(zl) || !isfinite(norm)) {
        st->skipped = 1;
        return;
    }
    if (loss > spike_loss || norm > spike_norm) {
        st->skipped = 2;
        return;
    }
    st->skipped = 0;
    if (max_norm > 0.0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) {
            st->clip_coef = coef;
            st->clip_scale = (float)coef;
        }
    }
    int64_t t = st->adam_step + 1;
    st->adam_step = t;
    double bias1 = 1.0 - pow(beta1, (double)t), bias2 = 1.0 - pow(beta2, (double)t);
    st->step_size = (float)(lr / bias1);
    st->bias2_sqrt = (float)sqrt(bias2);
}

void step_prepare(step_scalars *st, const double *partials, double rows, double z_loss, double max_norm, double lr,
                  double beta1, double beta2, double spike_loss, double spike_norm, cudaStream_t stream) {
    step_prepare_kernel<<<1, GRAD_NORM_BLOCKS, 0, stream>>>(st, partials, rows, z_loss, max_norm, lr, beta1, beta2,
                                                             spike_loss, spike_norm);
    CUDA_CHECK_LAUNCH();
}

// torch.optim.AdamW, single-tensor path, as llmc/optim.c: p·(1 − lr·wd), then the Adam step.
__global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(float *params, bf16 *params_bf16, float *grads, float *m, float *v, const adamw_chunk *chunks,
                 const step_scalars *st, adamw_hparams hp) {
    adamw_chunk ch = chunks[blockIdx.x];
    int64_t end = ch.start + ch.count;
    if (st->skipped) {
        for (int64_t i = ch.start + threadIdx.x; i < end; i += ADAMW_THREADS) grads[i] = 0.0f;
        return;
    }
    float clip = st->clip_scale, step_size = st->step_size, bias2_sqrt = st->bias2_sqrt;
    float keep = ch.decay ? hp.keep_decay : 1.0f;
    for (int64_t i = ch.start + threadIdx.x; i < end; i += ADAMW_THREADS) {
        float g = grads[i] * clip;
        float w = params[i] * keep;
        float mi = m[i] * hp.beta1 + g * hp.one_minus_beta1;
        float vi = v[i] * hp.beta2 + g * g * hp.one_minus_beta2;
        m[i] = mi;
        v[i] = vi;
        w = w - step_size * (mi / (sqrtf(vi) / bias2_sqrt + hp.eps));
        params[i] = w;
        params_bf16[i] = float_to_bf16(w);
        grads[i] = 0.0f;
    }
}

void adamw_update(float *params, bf16 *params_bf16, float *grads, float *m, float *v, const adamw_chunk *chunks,
                  int64_t num_chunks, const step_scalars *st, adamw_hparams hp, cudaStream_t stream) {
    if (num_chunks == 0) return;
    adamw_kernel<<<(unsigned)num_chunks, ADAMW_THREADS, 0, stream>>>(params, params_bf16, grads, m, v, chunks, st, hp);
    CUDA_CHECK_LAUNCH();
}

__global__ void to_bf16_kernel(bf16 *out, const float *in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = float_to_bf16(in[i]);
}

void floats_to_bf16(bf16 *out, const float *in, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    int64_t blocks = cdiv(n, 256);
    to_bf16_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(out, in, n);
    CUDA_CHECK_LAUNCH();
}
