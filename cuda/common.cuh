// cuda/common.cuh — what every CUDA file of train_gpt shares: the check macros that turn a
// failed CUDA / cuBLASLt call into one line naming file:line, the library's own error
// string and, where the user can do something about it, a `---> HINT:` line; bf16 helpers;
// warp and block reductions with a fixed order (determinism: the same inputs give the same
// bits on every run, which bit-exact resume relies on).
//
// Conventions of the kernels (cuda/kernels.h): N = B·T token rows, row-major tensors, the
// last index fastest; bf16 = __nv_bfloat16; every launcher takes the stream last and
// never synchronizes.
#ifndef TRAIN_GPT_CUDA_COMMON_CUH
#define TRAIN_GPT_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef __nv_bfloat16 bf16;

// ---------------------------------------------------------------- error checks

// A hint for the errors a user can fix; NULL for the others.
inline const char *cuda_error_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: lower batch_size (raise grad_accum to keep the tokens per step), "
               "or run `train_gpt plan CONFIG` to see the memory plan";
    case cudaErrorInsufficientDriver:
        return "the NVIDIA driver is missing or older than this CUDA runtime: run nvidia-smi; on a cluster, "
               "run on a GPU node (srun --gpus=1 ...)";
    case cudaErrorNoDevice:
        return "no GPU is visible: check CUDA_VISIBLE_DEVICES and the job's GPU request (srun --gpus=1 ...)";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "this binary has no kernels for this GPU: rebuild with `make CUDA_ARCH=\"-gencode "
               "arch=compute_XY,code=sm_XY\"` for its compute capability";
    case cudaErrorDevicesUnavailable:
        return "the GPU is busy or in exclusive-process mode with another process on it";
    default:
        return NULL;
    }
}

inline void cuda_check_failed(cudaError_t e, const char *expr, const char *file, int line) {
    fprintf(stderr, "train_gpt: error: CUDA error at %s:%d: %s (%s, error %d) in %s\n", file, line,
            cudaGetErrorString(e), cudaGetErrorName(e), (int)e, expr);
    const char *hint = cuda_error_hint(e);
    if (hint) fprintf(stderr, "---> HINT: %s\n", hint);
    fflush(stderr);
    exit(1);
}

inline const char *cublas_status_text(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

inline void cublas_check_failed(cublasStatus_t s, const char *expr, const char *file, int line) {
    fprintf(stderr, "train_gpt: error: cuBLASLt error at %s:%d: %s (status %d) in %s\n", file, line,
            cublas_status_text(s), (int)s, expr);
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        fprintf(stderr, "---> HINT: the GPU is out of memory: lower batch_size (raise grad_accum to keep the "
                        "tokens per step)\n");
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH)
        fprintf(stderr, "---> HINT: the CUDA backend needs bf16 tensor cores (compute capability 8.0, A100, or "
                        "newer)\n");
    fflush(stderr);
    exit(1);
}

#define CUDA_CHECK(call)                                                           \
    do {                                                                           \
        cudaError_t cuda_check_e_ = (call);                                        \
        if (cuda_check_e_ != cudaSuccess) cuda_check_failed(cuda_check_e_, #call, __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(call)                                                         \
    do {                                                                           \
        cublasStatus_t cublas_check_s_ = (call);                                   \
        if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS)                              \
            cublas_check_failed(cublas_check_s_, #call, __FILE__, __LINE__);       \
    } while (0)

// After a kernel launch: a bad launch configuration shows up here, at its line, instead
// of at the next synchronizing call. Costs nothing (no synchronization).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// cuDNN is detected by cuda.mk but not used by this version; its check macro lives with
// the code that will use it (cudnn.h is not included here so that the build does not
// need cuDNN).

// ---------------------------------------------------------------- small helpers

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

// Sum over the 32 lanes of a warp, the same butterfly every time: every lane gets the
// same, deterministic result.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block (blockDim.x a multiple of 32, at most 1024): warps first, then warp 0
// over the warp sums, in a fixed order. Every thread gets the result. `shared` holds 32
// values; the function synchronizes, so it can be called repeatedly with the same buffer.
template <typename T> __device__ __forceinline__ T block_sum(T v, T *shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // a previous call may still be reading `shared`
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : (T)0;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(v);
}

#endif
