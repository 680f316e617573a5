// cuda/mfma.cuh — the wavefront-level matrix instruction of AMD's CDNA GPUs (MI250X = gfx90a,
// MI300X = gfx942) that the MFMA attention (cuda/attention_mfma.cuh) is written with, and the
// few helpers around it, for hipcc:
//
//   mfma_16x16x16(c, a, b)  v_mfma_f32_16x16x16bf16_1k: C (16 × 16, fp32) += A (16 × 16) · B
//                           (16 × 16), bf16 inputs, over the 64 lanes of a wavefront (l = lane,
//                           r = l % 16, h = l / 16):
//                             a: A[r][4h .. 4h+3]   b: B[4h .. 4h+3][r]   (two bf16 per register,
//                                                                          the lower k below)
//                             c[i]: C[4h + i][r], i = 0..3
//   pack_bf16x2(lo, hi)     two floats rounded to nearest even into one 32-bit register
//   lane_shfl_xor(v, m)     the value of lane (lane ^ m) of the wavefront
//   block_barrier()         __syncthreads()
//
// test/warp_emu.h implements the same functions on the CPU (at TRAIN_GPT_EMU_WARP=64) from the
// ISA's layout, so that `make test` runs the MFMA attention's index arithmetic and fragment
// bookkeeping without a GPU (test/test_attention_mfma_emu.cc). What that cannot show is that
// the hardware agrees; nothing here has run on an AMD GPU yet. Included behind HAVE_MFMA
// (cuda/portable.cuh).
#ifndef TRAIN_GPT_CUDA_MFMA_CUH
#define TRAIN_GPT_CUDA_MFMA_CUH
#if !defined(TRAIN_GPT_EMULATION)  // else test/warp_emu.h has defined them

#include <stdint.h>

#define MFMA_DEVICE __device__ __forceinline__
#define MFMA_KERNEL(threads) __global__ void __launch_bounds__(threads)
#define MFMA_SHARED_BYTES(name) extern __shared__ __attribute__((aligned(16))) unsigned char name[]

typedef short mfma_short4 __attribute__((ext_vector_type(4)));
typedef float mfma_float4 __attribute__((ext_vector_type(4)));

MFMA_DEVICE void mfma_16x16x16(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2]) {
#if defined(__HIP_DEVICE_COMPILE__) && !defined(__gfx90a__) && !defined(__gfx940__) && !defined(__gfx941__) && \
    !defined(__gfx942__) && !defined(__gfx950__)
    // A GPU without the instruction (gfx908 = MI100, gfx906): never launched there, the
    // launchers check the device (attention_mfma_available) and take the portable kernels.
    (void)c, (void)a, (void)b;
    __builtin_trap();
#elif defined(__HIP_DEVICE_COMPILE__)
    mfma_short4 av, bv;
    av[0] = (short)(a[0] & 0xffffu), av[1] = (short)(a[0] >> 16), av[2] = (short)(a[1] & 0xffffu),
    av[3] = (short)(a[1] >> 16);
    bv[0] = (short)(b[0] & 0xffffu), bv[1] = (short)(b[0] >> 16), bv[2] = (short)(b[1] & 0xffffu),
    bv[3] = (short)(b[1] >> 16);
    mfma_float4 cv = {c[0], c[1], c[2], c[3]};
    cv = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, cv, 0, 0, 0);
    c[0] = cv[0], c[1] = cv[1], c[2] = cv[2], c[3] = cv[3];
#else
    (void)c, (void)a, (void)b;  // the host pass compiles no device code
#endif
}

MFMA_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)float_to_bf16(lo).bits | (uint32_t)float_to_bf16(hi).bits << 16;
}

MFMA_DEVICE float lane_shfl_xor(float v, int mask) { return warp_shuffle_xor(v, mask); }
MFMA_DEVICE void block_barrier() { __syncthreads(); }

#endif  // TRAIN_GPT_EMULATION
#endif
