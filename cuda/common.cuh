// cuda/common.cuh — what every GPU file of train_gpt shares: the check macro that turns a
// failed runtime call into one line naming file:line, the runtime's own error string and,
// where the user can do something about it, a `---> HINT:` line; bf16 helpers; warp and
// block reductions with a fixed order (determinism: the same inputs give the same bits on
// every run, which bit-exact resume relies on). Written in CUDA's names; cuda/portable.cuh
// makes them HIP's under hipcc (AMD), where a warp is a 64-wide wavefront.
//
// Conventions of the kernels (cuda/kernels.h): N = B·T token rows, row-major tensors, the
// last index fastest; bf16 = __nv_bfloat16 (CUDA) or a 16-bit struct with the same bits
// (HIP); every launcher takes the stream last and never synchronizes.
#ifndef TRAIN_GPT_CUDA_COMMON_CUH
#define TRAIN_GPT_CUDA_COMMON_CUH

#include "cuda/portable.cuh"
#include "llmc/common.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------- error checks

// A hint for the errors a user can fix; NULL for the others.
inline const char *cuda_error_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: lower batch_size (raise grad_accum to keep the tokens per step), "
               "or run `train_gpt plan CONFIG` to see the memory plan";
    case cudaErrorInsufficientDriver:
        return GPU_HINT_DRIVER;
    case cudaErrorNoDevice:
        return GPU_HINT_VISIBLE;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return GPU_HINT_REBUILD;
    case cudaErrorDevicesUnavailable:
        return "the GPU is busy or in exclusive-process mode with another process on it";
    default:
        return NULL;
    }
}

inline void cuda_check_failed(cudaError_t e, const char *expr, const char *file, int line) {
    fprintf(stderr, "train_gpt: error: " GPU_RUNTIME_NAME " error at %s:%d: %s (%s, error %d) in %s\n", file, line,
            cudaGetErrorString(e), cudaGetErrorName(e), (int)e, expr);
    const char *hint = cuda_error_hint(e);
    if (hint) fprintf(stderr, "---> HINT: %s\n", hint);
    fflush(stderr);
    exit(1);
}

// cudaMalloc of `bytes` for `what`: out of memory, one error line naming the bytes asked for,
// those already held (held_bytes; -1 when not counted), the GPU's free memory, and what to
// change (the runtime's own error named none of them, and the plan does not count what NCCL,
// the CUDA context or another process holds). Other errors as CUDA_CHECK.
inline void *cuda_alloc(size_t bytes, const char *what, int64_t held_bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) return p;
    if (e != cudaErrorMemoryAllocation) cuda_check_failed(e, what, __FILE__, __LINE__);
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) free_bytes = total_bytes = 0;
    cudaGetLastError();
    char asked[32], held[48] = "", free_s[32], total_s[32];
    if (held_bytes >= 0) {
        char n[32];
        snprintf(held, sizeof held, ", with %s already taken", format_bytes((uint64_t)held_bytes, n, sizeof n));
    }
    fail("out of GPU memory: %s more asked for (%s)%s; the GPU has %s free of %s (NCCL, the CUDA context and other "
         "processes hold some): lower batch_size (raise grad_accum to keep the tokens per step), set recompute = "
         "selective or full, or shard the model (fsdp_size); `train_gpt plan CONFIG` shows the plan",
         format_bytes(bytes, asked, sizeof asked), what, held, format_bytes(free_bytes, free_s, sizeof free_s),
         format_bytes(total_bytes, total_s, sizeof total_s));
}

#define CUDA_CHECK(call)                                                           \
    do {                                                                           \
        cudaError_t cuda_check_e_ = (call);                                        \
        if (cuda_check_e_ != cudaSuccess) cuda_check_failed(cuda_check_e_, #call, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: a bad launch configuration shows up here, at its line, instead
// of at the next synchronizing call. Costs nothing (no synchronization).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// cuBLASLt's (hipBLASLt's) check macro lives in cuda/matmul.cu, its one user, so that only
// that file needs the library's headers. cuDNN is detected by cuda.mk but not used by this
// version; its check macro will live with the code that uses it.

// ---------------------------------------------------------------- small helpers

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return bf16_to_float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return float_to_bf16(x); }

// 16-byte loads and stores of four floats, and 8-byte stores of four bf16: the memory-bound
// kernels' vector accesses. The pointer must be aligned to the access (the GPU faults
// otherwise; the CPU emulator checks it, test/warp_emu.h).
__device__ __forceinline__ float4 load_float4(const float *p) {
    GPU_CHECK_ALIGNED(p, 16);
    return *reinterpret_cast<const float4 *>(p);
}
__device__ __forceinline__ void store_float4(float *p, float4 v) {
    GPU_CHECK_ALIGNED(p, 16);
    *reinterpret_cast<float4 *>(p) = v;
}
__device__ __forceinline__ void store_bf16x4(bf16 *p, float a, float b, float c, float d) {
    GPU_CHECK_ALIGNED(p, 8);
    bf16 h[4] = {float_to_bf16(a), float_to_bf16(b), float_to_bf16(c), float_to_bf16(d)};
    uint2 u;
    memcpy(&u, h, sizeof u);
    *reinterpret_cast<uint2 *>(p) = u;
}
// Eight bf16 through one 16-byte access.
__device__ __forceinline__ void load_bf16x8(bf16 (&v)[8], const bf16 *p) {
    GPU_CHECK_ALIGNED(p, 16);
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    memcpy(v, &u, sizeof u);
}
__device__ __forceinline__ void store_bf16x8(bf16 *p, const bf16 (&v)[8]) {
    GPU_CHECK_ALIGNED(p, 16);
    uint4 u;
    memcpy(&u, v, sizeof u);
    *reinterpret_cast<uint4 *>(p) = u;
}
inline bool aligned_to(const void *p, uintptr_t bytes) { return p == nullptr || (uintptr_t)p % bytes == 0; }

// Sum over the WARP_SIZE lanes of a warp, the same butterfly every time: every lane gets
// the same, deterministic result.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += warp_shuffle_xor(v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += warp_shuffle_xor(v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, warp_shuffle_xor(v, o));
    return v;
}

// Sum over a block (blockDim.x a multiple of WARP_SIZE, at most 1024): warps first, then
// warp 0 over the warp sums, in a fixed order. Every thread gets the result. `shared` holds
// 32 values (enough for 1024 / WARP_SIZE warps); the function synchronizes, so it can be
// called repeatedly with the same buffer.
template <typename T> __device__ __forceinline__ T block_sum(T v, T *shared) {
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // a previous call may still be reading `shared`
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : (T)0;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *shared) {
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(v);
}

#endif
