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

#endif
