// cuda/attention_args.h — one attention call's tensors and sizes, as every tiled attention
// kernel takes them: the WMMA kernels of cuda/attention.cu (E = bf16), the register-resident
// ones of cuda/attention_fa2.cuh and the MFMA ones of cuda/attention_mfma.cuh (E = uint16_t,
// raw bf16 bits, which the host compiler of the emulated tests shares with nvcc and hipcc).
#ifndef TRAIN_GPT_CUDA_ATTENTION_ARGS_H
#define TRAIN_GPT_CUDA_ATTENTION_ARGS_H

#include <stdint.h>

template <typename E> struct attention_args_of {
    const E *q, *k, *v;         // (N, stride): q head j at j·D, kv head g at g·D
    int64_t q_stride, k_stride, v_stride;
    E *out;                     // (N, Hq·D)
    float *lse;                 // (B, Hq, T), natural log
    const int32_t *start;       // (N)
    int64_t B, T;
    int Hq, Hkv;
    float scale_log2;           // log2(e)/√D
    float scale;                // 1/√D
    // backward
    const E *dout;              // (N, Hq·D)
    const float *delta;         // (B, Hq, T)
    E *dq, *dk, *dv;
    int64_t dq_stride, dk_stride, dv_stride;
};

// What a block of a forward or dq kernel owns: `rows` queries of head blockIdx.y of sequence
// blockIdx.z (the query tiles with the most keys first: grid x counts down), and the keys they
// need, in tiles of `keys`. Query t sees keys [start[t], t] and start is non-decreasing, so no
// key tile before the first query's document start is needed; a key tile starting in
// [open_from, open_to] lies after the last query's document start and before the first query,
// with no query past T: every pair of it is visible, no per-element mask.
template <typename E> struct attention_query_block {
    int64_t T, b, q0, q_last;    // queries [q0, q_last] of sequence b
    int64_t k_first;             // the first key of the first key tile
    int64_t open_from, open_to;  // key tiles starting in this range need no mask
    int j, kvh;                  // the query head, its kv head
    const int32_t *start;        // this sequence's document starts
    const E *k, *v;              // the kv head's first row of this sequence
};

template <typename E>
__device__ inline attention_query_block<E> attention_query_block_of(const attention_args_of<E> &p, int D, int rows,
                                                                    int keys) {
    attention_query_block<E> a;
    a.T = p.T;
    a.b = blockIdx.z;
    a.q0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * rows;
    a.j = blockIdx.y;
    a.kvh = a.j / (p.Hq / p.Hkv);
    a.start = p.start + a.b * a.T;
    a.k = p.k + a.b * a.T * p.k_stride + (int64_t)a.kvh * D;
    a.v = p.v + a.b * a.T * p.v_stride + (int64_t)a.kvh * D;
    a.q_last = (a.q0 + rows < a.T ? a.q0 + rows : a.T) - 1;
    a.k_first = a.start[a.q0] / keys * keys;
    a.open_from = a.start[a.q_last];
    a.open_to = a.q0 + rows <= a.T ? a.q0 - keys : -1;
    return a;
}

#endif
