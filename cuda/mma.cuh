// cuda/mma.cuh — the warp-level tensor-core instructions the register-resident attention
// (cuda/attention_fa2.cuh) is written with, one small inline function each, in PTX:
//
//   ldsm_x4(r, p)        ldmatrix.m8n8.x4: four 8×8 bf16 matrices from shared memory; lanes
//                        8i..8i+7 give the row addresses of matrix i; lane l receives, in r[i],
//                        row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i (the lower column in
//                        the lower 16 bits)
//   ldsm_x4_t(r, p)      the same, transposed: r[i] holds rows 2(l%4), 2(l%4)+1 of column l/4
//   mma_16816(c, a, b)   mma.sync.m16n8k16.row.col, bf16 × bf16 → fp32, c += a·b, with the PTX
//                        ISA's fragments (g = lane/4, t = lane%4):
//                          a[0] A[g][2t..2t+1]   a[1] A[g+8][2t..]   a[2] A[g][2t+8..]   a[3] A[g+8][2t+8..]
//                          b[0] B[2t..2t+1][g]   b[1] B[2t+8..2t+9][g]
//                          c[0..1] C[g][2t..2t+1]                     c[2..3] C[g+8][2t..2t+1]
//   cp_async_16(dst, src, valid), cp_async_4(...), cp_async_commit(), cp_async_wait<N>()
//                        16- and 4-byte global → shared copies that run while the warp
//                        computes; valid = false writes zeros (rows past the sequence's end)
//   pack_bf16x2(lo, hi)  two floats rounded to nearest even into one 32-bit register
//   lane_shfl_xor(v, m)  the value of lane (lane ^ m)
//
// test/warp_emu.h implements the same functions on the CPU, from the PTX ISA's description of
// each instruction, so that `make test` runs the attention kernels' index arithmetic and
// fragment bookkeeping without a GPU (test/test_attention_fa2_emu.cc). NVIDIA only (sm_80+):
// included behind HAVE_NVIDIA_TENSOR_CORES.
#ifndef TRAIN_GPT_CUDA_MMA_CUH
#define TRAIN_GPT_CUDA_MMA_CUH
#if !defined(TRAIN_GPT_EMULATION)  // else test/warp_emu.h has defined them

#include <cuda_bf16.h>
#include <stdint.h>

#define FA2_DEVICE __device__ __forceinline__
#define FA2_KERNEL(threads) __global__ void __launch_bounds__(threads)
#define FA2_SHARED_BYTES(name) extern __shared__ __align__(128) unsigned char name[]

FA2_DEVICE uint32_t smem_address(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

FA2_DEVICE void ldsm_x4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
}

FA2_DEVICE void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
}

FA2_DEVICE void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

FA2_DEVICE void cp_async_16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
FA2_DEVICE void cp_async_4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
FA2_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FA2_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

FA2_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

FA2_DEVICE float lane_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
FA2_DEVICE void block_barrier() { __syncthreads(); }

#endif  // TRAIN_GPT_EMULATION
#endif
