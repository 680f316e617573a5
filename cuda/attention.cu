// cuda/attention.cu — causal attention with native GQA and document masking, forward and
// backward, flash-attention style: the T×T scores never exist in memory, only 64×64 tiles
// in shared memory. bf16 tensor-core products through WMMA (16×16×16 fragments, fp32
// accumulation), softmax statistics and accumulators in fp32.
//
// Forward (FlashAttention-2's loop order): one block of 4 warps per (64 queries, query
// head, batch row); each warp owns 16 query rows. For each 64-key tile: S = Q·Kᵀ into
// shared memory, an online-softmax update of the running max m and sum l per row, the
// tile's P (bf16), O ← O·e^(m_old − m_new) + P·V. The output is O / l; lse = m + log l is
// kept for the backward. Base-2 exponentials with the scale folded in (exp2f of
// s·log2(e)/√D), as FlashAttention does.
//
// Backward, deterministic (no atomics): two kernels recompute P from the saved lse.
//   dq:     per query tile, like the forward: dP = dO·Vᵀ, dS = P ⊙ (dP − δ), dQ += dS·K
//   dk, dv: per key tile of a kv head; loops over the query heads of its GQA group and
//           their query tiles: dV += Pᵀ·dO, dK += dSᵀ·Q, so the group's sum happens in a
//           fixed order inside one block (native GQA: no copied K/V heads, no reduction
//           over copies afterwards).
// with δ = rowsum(dO ⊙ O) from a small kernel. Recomputing S and dP twice costs about
// 1.4× the flops of FlashAttention-2's single backward kernel, which needs atomic adds
// into dQ and so gives different bits from run to run.
//
// Masking: query t sees keys [start[t], t]. start is non-decreasing along t, so a query
// tile needs no key tile before its first query's document start, and a key tile is
// needed by no query tile whose first query starts a document after the tile's last key:
// those tiles are skipped, which is what makes document masking cheaper than plain causal.
//
// Status: checked on an H100 by test/test_gpu_kernels.cu against the CPU reference and
// attention_simple.cu (2026-11-24), and slow there (59 / 44 TFLOP/s: docs/performance.md).
// This plainly structured version (softmax in shared memory between WMMA calls) stays the
// default and the reference for the register-resident kernels of cuda/attention_fa2.cuh,
// whose launchers (attention_fa2_*) are at the end of this file.
//
// NVIDIA only: WMMA is behind HAVE_NVIDIA_TENSOR_CORES, mma.sync behind HAVE_MMA_SYNC
// (cuda/portable.cuh). Under HIP (AMD) both sets of launchers go to the MFMA kernels of
// cuda/attention_mfma.cuh (HAVE_MFMA; head_dim 32, 64, 128) or, for another head_dim, to the
// portable kernels of cuda/attention_simple.cu. In the CPU emulator (test/warp_emu.h) the fa2
// kernels run on 32-wide warps and the MFMA kernels on 64-wide ones; the WMMA launchers are
// the simple ones at 32.
#include "cuda/kernels.h"

#include <string.h>

#if HAVE_MMA_SYNC
#include "cuda/mma.cuh"
#include "cuda/attention_fa2.cuh"
#endif
#if HAVE_MFMA
#include "cuda/mfma.cuh"
#include "cuda/attention_mfma.cuh"
#endif

#if HAVE_NVIDIA_TENSOR_CORES || HAVE_MMA_SYNC || HAVE_MFMA
// What the tiled kernels (WMMA, fa2, MFMA) share: δ, the shape check, their arguments.
namespace {

constexpr int DELTA_ROWS = 256 / WARP_SIZE;  // rows per block of the δ kernel: one warp each

// δ (B, Hq, T) = Σ_d dO·O per (row, head); one warp each. grid ⌈N·Hq/DELTA_ROWS⌉, 256 threads.
__global__ void attention_delta_kernel(float *delta, const bf16 *dout, const bf16 *out, int64_t B, int64_t T, int Hq,
                                       int D) {
    int64_t row = (int64_t)blockIdx.x * DELTA_ROWS + threadIdx.x / WARP_SIZE;  // (b·T + t)·Hq + j
    int lane = threadIdx.x % WARP_SIZE;
    if (row >= B * T * Hq) return;
    const bf16 *a = dout + row * D, *o = out + row * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += WARP_SIZE) s += bf16_to_float(a[d]) * bf16_to_float(o[d]);
    s = warp_sum(s);
    int64_t bt = row / Hq, j = row % Hq, b = bt / T, t = bt % T;
    if (lane == 0) delta[(b * Hq + j) * T + t] = s;
}

#if HAVE_NVIDIA_TENSOR_CORES || HAVE_MMA_SYNC
// Dynamic shared memory above 48 KiB has to be asked for, once per kernel (CUDA; HIP gives a
// kernel the whole 64 KiB of LDS without asking).
// A GPU that offers less (compute capability 8.6 / 8.9: A10, A40, L4, L40S, 99 KiB; head_dim 128
// needs up to 121 KiB) is told in one line with what to do, not CUDA's "invalid argument".
template <typename K> void allow_smem(K kernel, size_t bytes) {
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess &&
        bytes > (size_t)prop.sharedMemPerBlockOptin) {
        fprintf(stderr,
                "train_gpt: error: attention kernel: this head_dim needs %zu bytes of shared memory per block, "
                "%s (sm_%d%d) offers %zu\n---> HINT: head_dim 64, or TRAIN_GPT_ATTENTION=simple (slow)\n",
                bytes, prop.name, prop.major, prop.minor, (size_t)prop.sharedMemPerBlockOptin);
        exit(1);
    }
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
#endif

// The tiled kernels (WMMA and fa2) take head_dim 32, 64 and 128 and 16-byte aligned rows.
void check_shapes(const attention_inputs *in) {
    int D = in->D, Hq = in->Hq, Hkv = in->Hkv;
    if (in->B > 65535) {   // the batch is the grids' z dimension
        fprintf(stderr, "train_gpt: error: attention kernel: a micro-batch of %lld rows\n---> HINT: batch_size at "
                        "most 65535 on a GPU (grad_accum gives larger batches)\n", (long long)in->B);
        exit(1);
    }
    if (!(D == 32 || D == 64 || D == 128) || Hkv <= 0 || Hq % Hkv != 0 || in->q_stride % 8 || in->k_stride % 8 ||
        in->v_stride % 8 || in->T >= INT32_MAX) {
        fprintf(stderr,
                "train_gpt: error: attention kernel: unsupported shape (head_dim %d, %d/%d heads, strides %lld "
                "%lld %lld)\n---> HINT: head_dim must be 32, 64 or 128 for the CUDA backend\n",
                D, Hq, Hkv, (long long)in->q_stride, (long long)in->k_stride, (long long)in->v_stride);
        exit(1);
    }
}


// A call's arguments, for either kernel set (E: bf16 for WMMA, raw bits for fa2).
template <typename E> attention_args_of<E> args_for(const attention_inputs *in) {
    attention_args_of<E> a;
    memset(&a, 0, sizeof a);
    a.q = reinterpret_cast<const E *>(in->q);
    a.k = reinterpret_cast<const E *>(in->k);
    a.v = reinterpret_cast<const E *>(in->v);
    a.q_stride = in->q_stride;
    a.k_stride = in->k_stride;
    a.v_stride = in->v_stride;
    a.start = in->start;
    a.B = in->B;
    a.T = in->T;
    a.Hq = in->Hq;
    a.Hkv = in->Hkv;
    a.scale = 1.0f / sqrtf((float)in->D);
    a.scale_log2 = a.scale * 1.4426950408889634f;  // log2(e)/√D
    return a;
}

// The backward's arguments, after δ = rowsum(dO ⊙ O) has been launched into `delta`.
template <typename E>
attention_args_of<E> backward_args(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                              const attention_grads *g, float *delta, cudaStream_t stream) {
    int64_t rows = in->B * in->T * in->Hq;
    attention_delta_kernel<<<(unsigned)cdiv(rows, DELTA_ROWS), 256, 0, stream>>>(delta, dout, out, in->B, in->T, in->Hq,
                                                                               in->D);
    CUDA_CHECK_LAUNCH();
    attention_args_of<E> a = args_for<E>(in);
    a.lse = const_cast<float *>(lse);
    a.dout = reinterpret_cast<const E *>(dout);
    a.delta = delta;
    a.dq = reinterpret_cast<E *>(g->dq);
    a.dk = reinterpret_cast<E *>(g->dk);
    a.dv = reinterpret_cast<E *>(g->dv);
    a.dq_stride = g->dq_stride;
    a.dk_stride = g->dk_stride;
    a.dv_stride = g->dv_stride;
    return a;
}

}  // namespace
#endif

#if HAVE_NVIDIA_TENSOR_CORES
#include <mma.h>

using namespace nvcuda;

namespace {

constexpr int TILE = 64;      // queries per query tile = keys per key tile
constexpr int WARPS = 4;      // 16 rows each
constexpr int THREADS = 32 * WARPS;
constexpr int SSTRIDE = TILE + 4;   // fp32 score tiles: row stride (floats), a multiple of 4 for WMMA
constexpr int PSTRIDE = TILE + 8;   // bf16 probability tiles: a multiple of 8, and off the bank period
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

template <int D> struct dims {
    static constexpr int QS = D + 8;   // bf16 Q/K/V/dO tile row stride
    static constexpr int OS = D + 4;   // fp32 output accumulator row stride
    static constexpr int KD = D / 16;  // 16-wide slices of the head dimension
};

typedef attention_args_of<bf16> att_args;  // cuda/attention_fa2.cuh: the same arguments, bf16 elements

// rows [r0, r0 + 64) of one head of a (T, stride) matrix into a [64][QS] tile, zeros past T.
// 16-byte vectors: D and the strides are multiples of 8 elements.
template <int D>
__device__ __forceinline__ void load_tile(bf16 *tile, const bf16 *head, int64_t stride, int64_t r0, int64_t T) {
    constexpr int V = D / 8, QS = dims<D>::QS;
    for (int i = threadIdx.x; i < TILE * V; i += THREADS) {
        int r = i / V, c = (i % V) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) val = *reinterpret_cast<const uint4 *>(head + (r0 + r) * stride + c);
        *reinterpret_cast<uint4 *>(tile + r * QS + c) = val;
    }
}

// C (16×64 fp32, row stride SSTRIDE) = A (16×D rows of a [..][QS] tile) · Bᵀ, B being
// 64 rows of another [..][QS] tile: the score-shaped products Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ.
template <int D>
__device__ __forceinline__ void product_abt(float *C, const bf16 *A, const bf16 *B) {
    constexpr int QS = dims<D>::QS;
#pragma unroll
    for (int nb = 0; nb < TILE / 16; nb++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < dims<D>::KD; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
            wmma::load_matrix_sync(a, A + kk * 16, QS);
            wmma::load_matrix_sync(b, B + nb * 16 * QS + kk * 16, QS);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(C + nb * 16, acc, SSTRIDE, wmma::mem_row_major);
    }
}

// acc[d] += P (16×64 bf16, row stride PSTRIDE) · X (64 rows of a [..][QS] tile), for the
// D/16 column slices d: the value-shaped products P·V, dS·K, Pᵀ·dO, dSᵀ·Q.
template <int D>
__device__ __forceinline__ void product_ab(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[D / 16],
                                           const bf16 *P, const bf16 *X) {
    constexpr int QS = dims<D>::QS;
#pragma unroll
    for (int kk = 0; kk < TILE / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, P + kk * 16, PSTRIDE);
#pragma unroll
        for (int d = 0; d < D / 16; d++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
            wmma::load_matrix_sync(b, X + kk * 16 * QS + d * 16, QS);
            wmma::mma_sync(acc[d], a, b, acc[d]);
        }
    }
}

// Shared-memory carving: each region starts on a 128-byte boundary (WMMA wants 32).
struct smem_carver {
    unsigned char *at;
    template <typename T> __device__ T *take(int count) {
        T *p = reinterpret_cast<T *>(at);
        at += ((size_t)count * sizeof(T) + 127) / 128 * 128;
        return p;
    }
};
template <typename T> constexpr size_t region(int count) { return ((size_t)count * sizeof(T) + 127) / 128 * 128; }

// ---------------------------------------------------------------- forward

template <int D> constexpr size_t forward_smem() {
    return 3 * region<bf16>(TILE * dims<D>::QS) + region<float>(TILE * SSTRIDE) + region<bf16>(TILE * PSTRIDE) +
           region<float>(TILE * dims<D>::OS) + 3 * region<float>(TILE);
}

// grid (⌈T/64⌉, Hq, B), 128 threads
template <int D> __global__ void __launch_bounds__(THREADS) attention_forward_kernel(att_args p) {
    constexpr int QS = dims<D>::QS, OS = dims<D>::OS;
    extern __shared__ __align__(128) unsigned char smem[];
    smem_carver sc{smem};
    bf16 *Qs = sc.take<bf16>(TILE * QS), *Ks = sc.take<bf16>(TILE * QS), *Vs = sc.take<bf16>(TILE * QS);
    float *Ss = sc.take<float>(TILE * SSTRIDE);
    bf16 *Ps = sc.take<bf16>(TILE * PSTRIDE);
    float *Os = sc.take<float>(TILE * OS);
    float *row_m = sc.take<float>(TILE), *row_l = sc.take<float>(TILE), *row_alpha = sc.take<float>(TILE);

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t q0 = (int64_t)blockIdx.x * TILE, T = p.T, b = blockIdx.z;
    int j = blockIdx.y, g = j / (p.Hq / p.Hkv);
    const int32_t *start = p.start + b * T;
    const bf16 *kh = p.k + b * T * p.k_stride + (int64_t)g * D, *vh = p.v + b * T * p.v_stride + (int64_t)g * D;

    load_tile<D>(Qs, p.q + b * T * p.q_stride + (int64_t)j * D, p.q_stride, q0, T);
    for (int i = threadIdx.x; i < TILE * OS; i += THREADS) Os[i] = 0.0f;
    for (int i = threadIdx.x; i < TILE; i += THREADS) {
        row_m[i] = -INFINITY;
        row_l[i] = 0.0f;
    }

    // This lane's row for the softmax: lanes 2r and 2r+1 share row r of the warp's 16,
    // taking the even and the odd columns.
    int my_row = warp * 16 + lane / 2, parity = lane % 2;
    int64_t my_t = q0 + my_row;
    int64_t my_lo = my_t < T ? start[my_t] : T;

    int64_t q_last = min(q0 + TILE, T) - 1;
    for (int64_t k0 = start[q0] / TILE * TILE; k0 <= q_last; k0 += TILE) {
        __syncthreads();  // the previous tile's K/V reads are done (and, first time, the Q load)
        load_tile<D>(Ks, kh, p.k_stride, k0, T);
        load_tile<D>(Vs, vh, p.v_stride, k0, T);
        __syncthreads();
        product_abt<D>(Ss + warp * 16 * SSTRIDE, Qs + warp * 16 * QS, Ks);
        __syncwarp();

        float x[TILE / 2], mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < TILE / 2; i++) {
            int c = 2 * i + parity;
            int64_t key = k0 + c;
            bool visible = my_t < T && key <= my_t && key >= my_lo;
            x[i] = visible ? Ss[my_row * SSTRIDE + c] * p.scale_log2 : -INFINITY;
            mx = fmaxf(mx, x[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float m_old = row_m[my_row], m_new = fmaxf(m_old, mx);
        bool empty = m_new == -INFINITY;  // nothing visible yet in this row
        float alpha = empty ? 1.0f : exp2f(m_old - m_new), sum = 0.0f;
#pragma unroll
        for (int i = 0; i < TILE / 2; i++) {
            float e = empty ? 0.0f : exp2f(x[i] - m_new);
            sum += e;
            Ps[my_row * PSTRIDE + 2 * i + parity] = float_to_bf16(e);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        __syncwarp();
        if (parity == 0) {
            row_m[my_row] = m_new;
            row_l[my_row] = row_l[my_row] * alpha + sum;
            row_alpha[my_row] = alpha;
        }
        __syncwarp();
        for (int i = lane; i < 16 * D; i += 32) {
            int r = warp * 16 + i / D;
            Os[r * OS + i % D] *= row_alpha[r];
        }
        __syncwarp();
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[D / 16];
#pragma unroll
        for (int d = 0; d < D / 16; d++)
            wmma::load_matrix_sync(acc[d], Os + warp * 16 * OS + d * 16, OS, wmma::mem_row_major);
        product_ab<D>(acc, Ps + warp * 16 * PSTRIDE, Vs);
#pragma unroll
        for (int d = 0; d < D / 16; d++)
            wmma::store_matrix_sync(Os + warp * 16 * OS + d * 16, acc[d], OS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = warp * 16; r < warp * 16 + 16; r++) {
        int64_t t = q0 + r;
        if (t >= T) break;
        float l = row_l[r], inv = 1.0f / l;
        bf16 *o = p.out + ((b * T + t) * p.Hq + j) * D;
        for (int d = lane; d < D; d += 32) o[d] = float_to_bf16(Os[r * OS + d] * inv);
        if (lane == 0) p.lse[(b * p.Hq + j) * T + t] = row_m[r] * LN2 + logf(l);
    }
}

// ---------------------------------------------------------------- backward

template <int D> constexpr size_t dq_smem() {
    return 4 * region<bf16>(TILE * dims<D>::QS) + 2 * region<float>(TILE * SSTRIDE) + region<bf16>(TILE * PSTRIDE);
}

// grid (⌈T/64⌉, Hq, B), 128 threads: dq of one query tile of one head.
template <int D> __global__ void __launch_bounds__(THREADS) attention_dq_kernel(att_args p) {
    constexpr int QS = dims<D>::QS, OS = dims<D>::OS;
    extern __shared__ __align__(128) unsigned char smem[];
    smem_carver sc{smem};
    bf16 *Qs = sc.take<bf16>(TILE * QS), *dOs = sc.take<bf16>(TILE * QS);
    bf16 *Ks = sc.take<bf16>(TILE * QS), *Vs = sc.take<bf16>(TILE * QS);
    float *Ss = sc.take<float>(TILE * SSTRIDE), *dPs = sc.take<float>(TILE * SSTRIDE);
    bf16 *dSs = sc.take<bf16>(TILE * PSTRIDE);

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t q0 = (int64_t)blockIdx.x * TILE, T = p.T, b = blockIdx.z;
    int j = blockIdx.y, g = j / (p.Hq / p.Hkv);
    const int32_t *start = p.start + b * T;
    const bf16 *kh = p.k + b * T * p.k_stride + (int64_t)g * D, *vh = p.v + b * T * p.v_stride + (int64_t)g * D;
    load_tile<D>(Qs, p.q + b * T * p.q_stride + (int64_t)j * D, p.q_stride, q0, T);
    load_tile<D>(dOs, p.dout + b * T * p.Hq * D + (int64_t)j * D, (int64_t)p.Hq * D, q0, T);

    int my_row = warp * 16 + lane / 2, parity = lane % 2;
    int64_t my_t = q0 + my_row;
    bool row_ok = my_t < T;
    int64_t my_lo = row_ok ? start[my_t] : T;
    float my_lse = row_ok ? p.lse[(b * p.Hq + j) * T + my_t] * LOG2E : 0.0f;
    float my_delta = row_ok ? p.delta[(b * p.Hq + j) * T + my_t] : 0.0f;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[D / 16];
#pragma unroll
    for (int d = 0; d < D / 16; d++) wmma::fill_fragment(acc[d], 0.0f);

    int64_t q_last = min(q0 + TILE, T) - 1;
    for (int64_t k0 = start[q0] / TILE * TILE; k0 <= q_last; k0 += TILE) {
        __syncthreads();
        load_tile<D>(Ks, kh, p.k_stride, k0, T);
        load_tile<D>(Vs, vh, p.v_stride, k0, T);
        __syncthreads();
        product_abt<D>(Ss + warp * 16 * SSTRIDE, Qs + warp * 16 * QS, Ks);
        product_abt<D>(dPs + warp * 16 * SSTRIDE, dOs + warp * 16 * QS, Vs);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < TILE / 2; i++) {
            int c = 2 * i + parity;
            int64_t key = k0 + c;
            bool visible = row_ok && key <= my_t && key >= my_lo;
            float pr = visible ? exp2f(Ss[my_row * SSTRIDE + c] * p.scale_log2 - my_lse) : 0.0f;
            float ds = pr * (dPs[my_row * SSTRIDE + c] - my_delta);
            dSs[my_row * PSTRIDE + c] = float_to_bf16(ds);
        }
        __syncwarp();
        product_ab<D>(acc, dSs + warp * 16 * PSTRIDE, Ks);
    }
    __syncthreads();  // K/V tiles are free: reuse them for the fp32 result
    float *Out = reinterpret_cast<float *>(Ks);
#pragma unroll
    for (int d = 0; d < D / 16; d++)
        wmma::store_matrix_sync(Out + warp * 16 * OS + d * 16, acc[d], OS, wmma::mem_row_major);
    __syncwarp();
    for (int r = warp * 16; r < warp * 16 + 16; r++) {
        int64_t t = q0 + r;
        if (t >= T) break;
        bf16 *dst = p.dq + (b * T + t) * p.dq_stride + (int64_t)j * D;
        for (int d = lane; d < D; d += 32) dst[d] = float_to_bf16(Out[r * OS + d] * p.scale);
    }
}

template <int D> constexpr size_t dkv_smem() {
    return 4 * region<bf16>(TILE * dims<D>::QS) + 2 * region<float>(TILE * SSTRIDE) +
           2 * region<bf16>(TILE * PSTRIDE) + 3 * region<float>(TILE);
}

// grid (⌈T/64⌉, Hkv, B), 128 threads: dk and dv of one key tile of one kv head. Warp w owns
// keys 16w..16w+15 of the tile; the score tiles are transposed (keys × queries).
template <int D> __global__ void __launch_bounds__(THREADS) attention_dkv_kernel(att_args p) {
    constexpr int QS = dims<D>::QS, OS = dims<D>::OS;
    extern __shared__ __align__(128) unsigned char smem[];
    smem_carver sc{smem};
    bf16 *Ks = sc.take<bf16>(TILE * QS), *Vs = sc.take<bf16>(TILE * QS);
    bf16 *Qs = sc.take<bf16>(TILE * QS), *dOs = sc.take<bf16>(TILE * QS);
    float *St = sc.take<float>(TILE * SSTRIDE), *dPt = sc.take<float>(TILE * SSTRIDE);
    bf16 *Pt = sc.take<bf16>(TILE * PSTRIDE), *dSt = sc.take<bf16>(TILE * PSTRIDE);
    float *q_lse = sc.take<float>(TILE), *q_delta = sc.take<float>(TILE);
    int32_t *q_lo = sc.take<int32_t>(TILE);

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int64_t k0 = (int64_t)blockIdx.x * TILE, T = p.T, b = blockIdx.z;
    int g = blockIdx.y, group = p.Hq / p.Hkv;
    const int32_t *start = p.start + b * T;
    load_tile<D>(Ks, p.k + b * T * p.k_stride + (int64_t)g * D, p.k_stride, k0, T);
    load_tile<D>(Vs, p.v + b * T * p.v_stride + (int64_t)g * D, p.v_stride, k0, T);

    int my_row = warp * 16 + lane / 2, parity = lane % 2;  // a key row of the transposed tiles
    int64_t my_s = k0 + my_row;
    int64_t k_last = min(k0 + TILE, T) - 1;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> dk[D / 16], dv[D / 16];
#pragma unroll
    for (int d = 0; d < D / 16; d++) {
        wmma::fill_fragment(dk[d], 0.0f);
        wmma::fill_fragment(dv[d], 0.0f);
    }

    for (int j = g * group; j < (g + 1) * group; j++) {
        const bf16 *qh = p.q + b * T * p.q_stride + (int64_t)j * D;
        const bf16 *doh = p.dout + b * T * p.Hq * D + (int64_t)j * D;
        const float *lse = p.lse + (b * p.Hq + j) * T, *delta = p.delta + (b * p.Hq + j) * T;
        // Queries before the tile cannot see it (causal); from the first query whose
        // document starts after the tile's last key on, none can (start is non-decreasing).
        for (int64_t q0 = k0; q0 < T && start[q0] <= k_last; q0 += TILE) {
            __syncthreads();  // the previous tile's reads are done (and, first time, the K/V load)
            load_tile<D>(Qs, qh, p.q_stride, q0, T);
            load_tile<D>(dOs, doh, (int64_t)p.Hq * D, q0, T);
            for (int i = threadIdx.x; i < TILE; i += THREADS) {
                bool ok = q0 + i < T;
                q_lse[i] = ok ? lse[q0 + i] * LOG2E : 0.0f;
                q_delta[i] = ok ? delta[q0 + i] : 0.0f;
                q_lo[i] = ok ? start[q0 + i] : INT32_MAX;
            }
            __syncthreads();
            product_abt<D>(St + warp * 16 * SSTRIDE, Ks + warp * 16 * QS, Qs);
            product_abt<D>(dPt + warp * 16 * SSTRIDE, Vs + warp * 16 * QS, dOs);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < TILE / 2; i++) {
                int c = 2 * i + parity;
                int64_t t = q0 + c;
                bool visible = my_s <= k_last && t < T && my_s <= t && my_s >= q_lo[c];
                float pr = visible ? exp2f(St[my_row * SSTRIDE + c] * p.scale_log2 - q_lse[c]) : 0.0f;
                float ds = pr * (dPt[my_row * SSTRIDE + c] - q_delta[c]);
                Pt[my_row * PSTRIDE + c] = float_to_bf16(pr);
                dSt[my_row * PSTRIDE + c] = float_to_bf16(ds);
            }
            __syncwarp();
            product_ab<D>(dv, Pt + warp * 16 * PSTRIDE, dOs);
            product_ab<D>(dk, dSt + warp * 16 * PSTRIDE, Qs);
        }
    }
    __syncthreads();  // Q/dO tiles are free: reuse them for the fp32 results, one at a time
    float *Out = reinterpret_cast<float *>(Qs);
    for (int which = 0; which < 2; which++) {
#pragma unroll
        for (int d = 0; d < D / 16; d++)
            wmma::store_matrix_sync(Out + warp * 16 * OS + d * 16, which == 0 ? dk[d] : dv[d], OS,
                                    wmma::mem_row_major);
        __syncwarp();
        for (int r = warp * 16; r < warp * 16 + 16; r++) {
            int64_t s = k0 + r;
            if (s >= T) break;
            bf16 *dst = which == 0 ? p.dk + (b * T + s) * p.dk_stride : p.dv + (b * T + s) * p.dv_stride;
            dst += (int64_t)g * D;
            float f = which == 0 ? p.scale : 1.0f;
            for (int d = lane; d < D; d += 32) dst[d] = float_to_bf16(Out[r * OS + d] * f);
        }
        __syncwarp();
    }
}

template <int D> void forward_d(const att_args &a, cudaStream_t stream) {
    static bool ready = false;
    constexpr size_t smem = forward_smem<D>();
    if (!ready) {
        allow_smem(attention_forward_kernel<D>, smem);
        ready = true;
    }
    dim3 grid((unsigned)cdiv(a.T, TILE), (unsigned)a.Hq, (unsigned)a.B);
    attention_forward_kernel<D><<<grid, THREADS, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

template <int D> void backward_d(const att_args &a, cudaStream_t stream) {
    static bool ready = false;
    constexpr size_t smem_q = dq_smem<D>(), smem_kv = dkv_smem<D>();
    if (!ready) {
        allow_smem(attention_dq_kernel<D>, smem_q);
        allow_smem(attention_dkv_kernel<D>, smem_kv);
        ready = true;
    }
    dim3 grid_q((unsigned)cdiv(a.T, TILE), (unsigned)a.Hq, (unsigned)a.B);
    attention_dq_kernel<D><<<grid_q, THREADS, smem_q, stream>>>(a);
    CUDA_CHECK_LAUNCH();
    dim3 grid_kv((unsigned)cdiv(a.T, TILE), (unsigned)a.Hkv, (unsigned)a.B);
    attention_dkv_kernel<D><<<grid_kv, THREADS, smem_kv, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}


}  // namespace

bool attention_supports_head_dim(int D) { return D == 32 || D == 64 || D == 128; }
bool attention_mfma_available(void) { return false; }

// ---------------------------------------------------------------- the launchers (cuda/kernels.h)

void attention_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    check_shapes(in);
    att_args a = args_for<bf16>(in);
    a.out = out;
    a.lse = lse;
    if (in->D == 32) forward_d<32>(a, stream);
    else if (in->D == 64) forward_d<64>(a, stream);
    else forward_d<128>(a, stream);
}

void attention_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                        const attention_grads *g, float *delta, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    check_shapes(in);
    att_args a = backward_args<bf16>(in, out, lse, dout, g, delta, stream);
    if (in->D == 32) backward_d<32>(a, stream);
    else if (in->D == 64) backward_d<64>(a, stream);
    else backward_d<128>(a, stream);
}

#elif HAVE_MFMA  // HIP (and the emulator at 64-wide wavefronts): AMD's matrix cores

// Whether this GPU has v_mfma_f32_16x16x16bf16_1k: gfx90a (MI250X), gfx94x (MI300X), gfx950,
// asked once. Others (gfx908 = MI100, gfx906) run the portable kernels.
bool attention_mfma_available(void) {
#if defined(__HIPCC__) && !defined(TRAIN_GPT_EMULATION)
    static int known = -1;
    if (known < 0) {
        int dev = 0;
        cudaDeviceProp prop;
        known = 0;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
            const char *a = prop.gcnArchName;
            known = strncmp(a, "gfx90a", 6) == 0 || strncmp(a, "gfx94", 5) == 0 || strncmp(a, "gfx950", 6) == 0;
        }
    }
    return known == 1;
#else
    return true;  // the emulator at 64-wide wavefronts emulates the instruction
#endif
}

namespace {

template <int D> void mfma_forward_d(const mfa::args &a, cudaStream_t stream) {
    dim3 grid((unsigned)cdiv(a.T, mfa::BM), (unsigned)a.Hq, (unsigned)a.B);
    mfa::forward_kernel<D><<<grid, mfa::THREADS, mfa::forward_smem_bytes<D>(), stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

template <int D> void mfma_backward_d(const mfa::args &a, cudaStream_t stream) {
    dim3 grid_q((unsigned)cdiv(a.T, mfa::BM), (unsigned)a.Hq, (unsigned)a.B);
    mfa::dq_kernel<D><<<grid_q, mfa::THREADS, mfa::dq_smem_bytes<D>(), stream>>>(a);
    CUDA_CHECK_LAUNCH();
    dim3 grid_kv((unsigned)cdiv(a.T, mfa::BN), (unsigned)a.Hkv, (unsigned)a.B);
    mfa::dkv_kernel<D><<<grid_kv, mfa::THREADS, mfa::dkv_smem_bytes<D>(), stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

bool mfma_head_dim(int D) { return (D == 32 || D == 64 || D == 128) && attention_mfma_available(); }

}  // namespace


// The MFMA kernels for head_dim 32, 64 and 128; another even head_dim up to 256 runs on the
// portable one-warp-per-row kernels (correct, slow at long sequences).
bool attention_supports_head_dim(int D) { return D > 0 && D % 2 == 0 && D <= 256; }

void attention_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    if (!mfma_head_dim(in->D)) return attention_simple_forward(in, out, lse, stream);
    check_shapes(in);
    mfa::args a = args_for<uint16_t>(in);
    a.out = reinterpret_cast<uint16_t *>(out);
    a.lse = lse;
    if (in->D == 32) mfma_forward_d<32>(a, stream);
    else if (in->D == 64) mfma_forward_d<64>(a, stream);
    else mfma_forward_d<128>(a, stream);
}

void attention_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                        const attention_grads *g, float *delta, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    if (!mfma_head_dim(in->D)) return attention_simple_backward(in, out, lse, dout, g, delta, stream);
    check_shapes(in);
    mfa::args a = backward_args<uint16_t>(in, out, lse, dout, g, delta, stream);
    if (in->D == 32) mfma_backward_d<32>(a, stream);
    else if (in->D == 64) mfma_backward_d<64>(a, stream);
    else mfma_backward_d<128>(a, stream);
}

#else  // the emulator's 32-wide warps: no WMMA (its fragment layouts are not documented)

// The portable kernels, one warp per row in fp32: correct and slow (no tiles, no matrix
// cores: each row reads its keys from memory on its own); any even head_dim up to 256.
bool attention_supports_head_dim(int D) { return D > 0 && D % 2 == 0 && D <= 256; }
bool attention_mfma_available(void) { return false; }

void attention_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream) {
    attention_simple_forward(in, out, lse, stream);
}

void attention_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                        const attention_grads *g, float *delta, cudaStream_t stream) {
    attention_simple_backward(in, out, lse, dout, g, delta, stream);
}

#endif  // HAVE_NVIDIA_TENSOR_CORES

// ---------------------------------------------------------------- the register-resident kernels

#if HAVE_MMA_SYNC
namespace {


template <int D> void fa2_forward_d(const fa2::args &a, cudaStream_t stream) {
    static bool ready = false;
    constexpr int smem = fa2::forward_smem_bytes<D>();
    if (!ready) {
        allow_smem(fa2::forward_kernel<D>, smem);
        ready = true;
    }
    dim3 grid((unsigned)cdiv(a.T, fa2::BM), (unsigned)a.Hq, (unsigned)a.B);
    fa2::forward_kernel<D><<<grid, fa2::THREADS, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

template <int D> void fa2_backward_d(const fa2::args &a, cudaStream_t stream) {
    static bool ready = false;
    constexpr int smem_q = fa2::dq_smem_bytes<D>(), smem_kv = fa2::dkv_smem_bytes<D>();
    if (!ready) {
        allow_smem(fa2::dq_kernel<D>, smem_q);
        allow_smem(fa2::dkv_kernel<D>, smem_kv);
        ready = true;
    }
    dim3 grid_q((unsigned)cdiv(a.T, fa2::BM), (unsigned)a.Hq, (unsigned)a.B);
    fa2::dq_kernel<D><<<grid_q, fa2::THREADS, smem_q, stream>>>(a);
    CUDA_CHECK_LAUNCH();
    dim3 grid_kv((unsigned)cdiv(a.T, fa2::BN), (unsigned)a.Hkv, (unsigned)a.B);
    fa2::dkv_kernel<D><<<grid_kv, fa2::THREADS, smem_kv, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_fa2_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    check_shapes(in);
    fa2::args a = args_for<uint16_t>(in);
    a.out = reinterpret_cast<uint16_t *>(out);
    a.lse = lse;
    if (in->D == 32) fa2_forward_d<32>(a, stream);
    else if (in->D == 64) fa2_forward_d<64>(a, stream);
    else fa2_forward_d<128>(a, stream);
}

void attention_fa2_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                            const attention_grads *g, float *delta, cudaStream_t stream) {
    if (in->B * in->T == 0) return;
    check_shapes(in);
    fa2::args a = backward_args<uint16_t>(in, out, lse, dout, g, delta, stream);
    if (in->D == 32) fa2_backward_d<32>(a, stream);
    else if (in->D == 64) fa2_backward_d<64>(a, stream);
    else fa2_backward_d<128>(a, stream);
}

#else  // HIP (and the emulator at 64-wide wavefronts): no mma.sync; the default launchers
      // above (MFMA, or the portable kernels) serve TRAIN_GPT_ATTENTION=fa2 too

void attention_fa2_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream) {
    attention_forward(in, out, lse, stream);
}

void attention_fa2_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                            const attention_grads *g, float *delta, cudaStream_t stream) {
    attention_backward(in, out, lse, dout, g, delta, stream);
}

#endif  // HAVE_MMA_SYNC
