// cuda/attention_simple.cu — attention the slow, obvious way: one warp per output row, fp32
// arithmetic on bf16 inputs, no tensor cores, no tiles. Same arguments and results as
// cuda/attention.cu (see kernels.h).
//
// Why it exists: the fast kernels are intricate, and on a new GPU or after a change one
// wants a second GPU implementation to compare with that is easy to believe. The kernel
// tests check both against the CPU; TRAIN_GPT_ATTENTION=simple swaps it into the model
// (to tell an attention bug from anything else). Lane l holds dimensions l, l + WARP_SIZE,
// ... of the row (D ≤ 256, D even). It is also the HIP build's attention (cuda/attention.cu:
// no tensor-core kernel there yet), with 64-wide warps.
//   forward: for each visible key, s = q·k/√D (a warp sum), online softmax into o
//   dq:      warp per (query, head): dq = Σ_s P(dP − δ)·k/√D
//   dk, dv:  warp per (key, kv head), over the group's query heads and the queries that
//            see the key, in order: no atomics, deterministic
#include "cuda/kernels.h"

namespace {

constexpr int MAX_D = 256;
constexpr int MAX_PER_LANE = MAX_D / WARP_SIZE;
constexpr int ROWS_PER_BLOCK = 8;  // one warp each
constexpr int THREADS = WARP_SIZE * ROWS_PER_BLOCK;

__device__ __forceinline__ void load_row(float *x, const bf16 *row, int D, int lane) {
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; i++) {
        int d = lane + WARP_SIZE * i;
        x[i] = d < D ? bf16_to_float(row[d]) : 0.0f;
    }
}

__device__ __forceinline__ float dot_row(const float *x, const bf16 *row, int D, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < D) s += x[i] * bf16_to_float(row[d]);
    }
    return warp_sum(s);
}

// warp per (b, t, j); grid ⌈B·T·Hq/8⌉, 8 warps per block
__global__ void simple_forward_kernel(bf16 *out, float *lse, const bf16 *q, int64_t q_stride, const bf16 *k,
                                      int64_t k_stride, const bf16 *v, int64_t v_stride, const int32_t *start,
                                      int64_t B, int64_t T, int Hq, int Hkv, int D, float scale) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;  // (b·T + t)·Hq + j
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * T * Hq) return;
    int64_t bt = row / Hq, b = bt / T, t = bt % T;
    int j = (int)(row % Hq), g = j / (Hq / Hkv);
    float qr[MAX_PER_LANE], o[MAX_PER_LANE];
    load_row(qr, q + bt * q_stride + (int64_t)j * D, D, lane);
    for (int i = 0; i < MAX_PER_LANE; i++) o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t s = start[bt]; s <= t; s++) {
        int64_t bs = b * T + s;
        float sc = dot_row(qr, k + bs * k_stride + (int64_t)g * D, D, lane) * scale;
        float m_new = fmaxf(m, sc), alpha = expf(m - m_new), e = expf(sc - m_new);
        l = l * alpha + e;
        const bf16 *vr = v + bs * v_stride + (int64_t)g * D;
        for (int i = 0; i < MAX_PER_LANE; i++) {
            int d = lane + WARP_SIZE * i;
            if (d < D) o[i] = o[i] * alpha + e * bf16_to_float(vr[d]);
        }
        m = m_new;
    }
    bf16 *dst = out + row * D;
    for (int i = 0; i < MAX_PER_LANE; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < D) dst[d] = float_to_bf16(o[i] / l);
    }
    if (lane == 0) lse[(b * Hq + j) * T + t] = m + logf(l);
}

__global__ void simple_delta_kernel(float *delta, const bf16 *dout, const bf16 *out, int64_t B, int64_t T, int Hq,
                                    int D) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * T * Hq) return;
    float s = 0.0f;
    for (int d = lane; d < D; d += WARP_SIZE) s += bf16_to_float(dout[row * D + d]) * bf16_to_float(out[row * D + d]);
    s = warp_sum(s);
    int64_t bt = row / Hq, b = bt / T, t = bt % T, j = row % Hq;
    if (lane == 0) delta[(b * Hq + j) * T + t] = s;
}

__global__ void simple_dq_kernel(bf16 *dq, int64_t dq_stride, const float *delta, const bf16 *dout, const float *lse,
                                 const bf16 *q, int64_t q_stride, const bf16 *k, int64_t k_stride, const bf16 *v,
                                 int64_t v_stride, const int32_t *start, int64_t B, int64_t T, int Hq, int Hkv, int D,
                                 float scale) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * T * Hq) return;
    int64_t bt = row / Hq, b = bt / T, t = bt % T;
    int j = (int)(row % Hq), g = j / (Hq / Hkv);
    float qr[MAX_PER_LANE], dor[MAX_PER_LANE], acc[MAX_PER_LANE];
    load_row(qr, q + bt * q_stride + (int64_t)j * D, D, lane);
    load_row(dor, dout + row * D, D, lane);
    for (int i = 0; i < MAX_PER_LANE; i++) acc[i] = 0.0f;
    float l = lse[(b * Hq + j) * T + t], dl = delta[(b * Hq + j) * T + t];
    for (int64_t s = start[bt]; s <= t; s++) {
        int64_t bs = b * T + s;
        const bf16 *kr = k + bs * k_stride + (int64_t)g * D;
        float p = expf(dot_row(qr, kr, D, lane) * scale - l);
        float dp = dot_row(dor, v + bs * v_stride + (int64_t)g * D, D, lane);
        float ds = p * (dp - dl) * scale;
        for (int i = 0; i < MAX_PER_LANE; i++) {
            int d = lane + WARP_SIZE * i;
            if (d < D) acc[i] += ds * bf16_to_float(kr[d]);
        }
    }
    bf16 *dst = dq + bt * dq_stride + (int64_t)j * D;
    for (int i = 0; i < MAX_PER_LANE; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < D) dst[d] = float_to_bf16(acc[i]);
    }
}

// warp per (b, s, g); grid ⌈B·T·Hkv/8⌉
__global__ void simple_dkv_kernel(bf16 *dk, int64_t dk_stride, bf16 *dv, int64_t dv_stride, const float *delta,
                                  const bf16 *dout, const float *lse, const bf16 *q, int64_t q_stride, const bf16 *k,
                                  int64_t k_stride, const bf16 *v, int64_t v_stride, const int32_t *start, int64_t B,
                                  int64_t T, int Hq, int Hkv, int D, float scale) {
    int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;  // (b·T + s)·Hkv + g
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * T * Hkv) return;
    int64_t bs = row / Hkv, b = bs / T, s = bs % T;
    int g = (int)(row % Hkv), group = Hq / Hkv;
    float kr[MAX_PER_LANE], vr[MAX_PER_LANE], dk_acc[MAX_PER_LANE], dv_acc[MAX_PER_LANE];
    load_row(kr, k + bs * k_stride + (int64_t)g * D, D, lane);
    load_row(vr, v + bs * v_stride + (int64_t)g * D, D, lane);
    for (int i = 0; i < MAX_PER_LANE; i++) dk_acc[i] = dv_acc[i] = 0.0f;
    for (int j = g * group; j < (g + 1) * group; j++)
        for (int64_t t = s; t < T && start[b * T + t] <= s; t++) {
            int64_t bt = b * T + t;
            const bf16 *qr = q + bt * q_stride + (int64_t)j * D, *dor = dout + (bt * Hq + j) * D;
            float p = expf(dot_row(kr, qr, D, lane) * scale - lse[(b * Hq + j) * T + t]);
            float dp = dot_row(vr, dor, D, lane);
            float ds = p * (dp - delta[(b * Hq + j) * T + t]) * scale;
            for (int i = 0; i < MAX_PER_LANE; i++) {
                int d = lane + WARP_SIZE * i;
                if (d < D) {
                    dv_acc[i] += p * bf16_to_float(dor[d]);
                    dk_acc[i] += ds * bf16_to_float(qr[d]);
                }
            }
        }
    bf16 *dkr = dk + bs * dk_stride + (int64_t)g * D, *dvr = dv + bs * dv_stride + (int64_t)g * D;
    for (int i = 0; i < MAX_PER_LANE; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < D) {
            dkr[d] = float_to_bf16(dk_acc[i]);
            dvr[d] = float_to_bf16(dv_acc[i]);
        }
    }
}

void check_simple_shapes(int Hq, int Hkv, int D) {
    if (D > MAX_D || D % 2 || Hkv <= 0 || Hq % Hkv) {
        fprintf(stderr, "train_gpt: error: simple attention: unsupported shape (head_dim %d, %d/%d heads)\n", D, Hq,
                Hkv);
        exit(1);
    }
}

}  // namespace

// ---------------------------------------------------------------- the launchers (cuda/kernels.h)

void attention_simple_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    check_simple_shapes(in->Hq, in->Hkv, in->D);
    simple_forward_kernel<<<(unsigned)cdiv(in->B * in->T * in->Hq, ROWS_PER_BLOCK), THREADS, 0, stream>>>(
        out, lse, in->q, in->q_stride, in->k, in->k_stride, in->v, in->v_stride, in->start, in->B, in->T, in->Hq,
        in->Hkv, in->D, 1.0f / sqrtf((float)in->D));
    CUDA_CHECK_LAUNCH();
}

void attention_simple_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                               const attention_grads *g, float *delta, cudaStream_t stream) {
    int64_t B = in->B, T = in->T;
    int Hq = in->Hq, Hkv = in->Hkv, D = in->D;
    if (B * T == 0) return;
    check_simple_shapes(Hq, Hkv, D);
    float scale = 1.0f / sqrtf((float)D);
    unsigned q_blocks = (unsigned)cdiv(B * T * Hq, ROWS_PER_BLOCK);
    unsigned kv_blocks = (unsigned)cdiv(B * T * Hkv, ROWS_PER_BLOCK);
    simple_delta_kernel<<<q_blocks, THREADS, 0, stream>>>(delta, dout, out, B, T, Hq, D);
    CUDA_CHECK_LAUNCH();
    simple_dq_kernel<<<q_blocks, THREADS, 0, stream>>>(g->dq, g->dq_stride, delta, dout, lse, in->q, in->q_stride,
                                                       in->k, in->k_stride, in->v, in->v_stride, in->start, B, T, Hq,
                                                       Hkv, D, scale);
    CUDA_CHECK_LAUNCH();
    simple_dkv_kernel<<<kv_blocks, THREADS, 0, stream>>>(g->dk, g->dk_stride, g->dv, g->dv_stride, delta, dout, lse,
                                                         in->q, in->q_stride, in->k, in->k_stride, in->v, in->v_stride,
                                                         in->start, B, T, Hq, Hkv, D, scale);
    CUDA_CHECK_LAUNCH();
}
