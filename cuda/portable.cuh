// cuda/portable.cuh — the one header between the GPU backend's sources and the two
// toolchains that build them: nvcc (CUDA, NVIDIA GPUs) and hipcc (HIP, AMD GPUs under ROCm).
// Every file of the backend includes it (through cuda/common.cuh) and is written with
// CUDA's names; under hipcc this header turns them into HIP's, so each kernel exists once.
// Everything that differs between the two is here:
//
//   runtime API    cuda* → hip*: one #define per name the backend uses, nothing more.
//   bf16           the type `bf16` and its two conversions, float_to_bf16 (round to nearest
//                  even, NaN → 0x7FFF) and bf16_to_float, on the host and the device: CUDA's
//                  __nv_bfloat16 under nvcc, a plain 16-bit struct under hipcc (ROCm 5.2, which
//                  `make check-hip` compiles with, has no __hip_bfloat16; a struct of our own
//                  converts the same way on every ROCm); the bits are the same on both.
//   warps          WARP_SIZE, stated here and nowhere else: 32 on NVIDIA; 64 under hipcc,
//                  because AMD's CDNA GPUs (MI250X = gfx90a, MI300X = gfx942) run 64-wide
//                  wavefronts. Kernels count lanes, warps per block and reduction steps from
//                  it; warp_shuffle_xor exchanges over all WARP_SIZE lanes (CUDA's full mask
//                  WARP_FULL_MASK; HIP's non-_sync shuffles need none). RDNA's 32-wide mode
//                  is not a target: the device pass stops with an error for anything but
//                  gfx9, and the start-up probe refuses a GPU whose warpSize differs.
//   tensor cores   HAVE_NVIDIA_TENSOR_CORES: 1 under nvcc, 0 under hipcc. The code that
//                  uses NVIDIA's WMMA sits behind this guard, the mma.sync / ldmatrix /
//                  cp.async code (cuda/mma.cuh) behind HAVE_MMA_SYNC, and AMD's matrix
//                  instruction (cuda/mfma.cuh: the MFMA attention) behind HAVE_MFMA, 1 under
//                  hipcc (cuda/attention.cu picks the kernels).
//   emulation      TRAIN_GPT_EMULATION (test/warp_emu.h, tests only): the kernels built by
//                  the host C++ compiler and run on the CPU; mma.sync (32-wide warps) and MFMA
//                  (64-wide) emulated, WMMA not.
//   launch bounds  __launch_bounds__(threads) means the same on both (the most threads a
//                  block is launched with); its optional second argument does not (minimum
//                  blocks per SM vs. waves per execution unit), so the backend never uses it.
//   names          the vendor's words in messages and HINT lines (runtime, driver, the
//                  variable that picks visible devices, how to rebuild for another GPU).
//   collectives    GPU_COLLECTIVES*: the library cuda/collective.cu opens at run time, NCCL's
//                  libnccl.so.2 or RCCL's librccl.so.1 (the same interface, cuda/nccl_abi.h),
//                  and what to tell a user whose job cannot load it.
//
// Matrix products (cuBLASLt or hipBLASLt) are mapped in their one user, cuda/matmul.cu.
#ifndef TRAIN_GPT_CUDA_PORTABLE_CUH
#define TRAIN_GPT_CUDA_PORTABLE_CUH

#include <stdint.h>

#if defined(TRAIN_GPT_EMULATION)
// ================================================================ the CPU emulator (tests)
// test/warp_emu.h, included before everything (the emulated build's -include), has defined
// the runtime's names, dim3, launches and the instructions; here is what the toolchains'
// branches define. `make test` builds the kernel files this way (test/test_gpu_kernels.cu).
#define GPU_RUNTIME_NAME "CUDA (emulated on the CPU)"
#define GPU_VENDOR "NVIDIA"
#define GPU_VISIBLE_DEVICES_ENV "CUDA_VISIBLE_DEVICES"
#define HAVE_NVIDIA_TENSOR_CORES 0  // WMMA's fragment layouts are not documented: not emulated
#define HAVE_MMA_SYNC (TRAIN_GPT_EMU_WARP == 32)  // mma.sync's are (cuda/mma.cuh), on 32-wide warps
#define HAVE_MFMA (TRAIN_GPT_EMU_WARP == 64)      // and CDNA's MFMA (cuda/mfma.cuh), on 64-wide ones
#define PORTABLE_OWN_BF16 1
enum { WARP_SIZE = TRAIN_GPT_EMU_WARP };  // 32, or 64 to run HIP's wavefront width
#define WARP_FULL_MASK 0xffffffffu

template <typename T> inline T warp_shuffle_xor(T v, int lane_mask) { return emu::shuffle_xor(v, lane_mask); }
#define GPU_CHECK_ALIGNED(p, bytes) emu::check_global_aligned((p), (bytes))

#define GPU_HINT_DRIVER "(none: the emulator needs no driver)"
#define GPU_HINT_VISIBLE "(none: the emulator is always there)"
#define GPU_HINT_REBUILD "(none: the emulator runs every kernel)"
#define GPU_COLLECTIVES "NCCL"  // test/nccl_emu.h's calls over MPI: nothing is loaded

#elif defined(__HIPCC__)
// ================================================================ HIP (AMD, ROCm)
#include <hip/hip_runtime.h>
#include <hip/library_types.h>

#define GPU_RUNTIME_NAME "HIP"
#define GPU_VENDOR "AMD"
#define GPU_VISIBLE_DEVICES_ENV "ROCR_VISIBLE_DEVICES"  // what SLURM sets for AMD GPUs (also: HIP_VISIBLE_DEVICES)
#define HAVE_NVIDIA_TENSOR_CORES 0
#define HAVE_MMA_SYNC 0
#define HAVE_MFMA 1  // v_mfma_f32_16x16x16bf16_1k: gfx90a (MI250X) and gfx94x (MI300X)
#define PORTABLE_OWN_BF16 1
#define GPU_CHECK_ALIGNED(p, bytes) ((void)0)
enum { WARP_SIZE = 64 };
#if defined(__HIP_DEVICE_COMPILE__) && !defined(__GFX9__)
#error "train_gpt's HIP build targets CDNA GPUs (gfx9: gfx90a, gfx942), whose wavefronts are 64 wide (WARP_SIZE)"
#endif

// The runtime. cudaMallocHost has no two-argument HIP twin that is not deprecated.
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorNoKernelImageForDevice hipErrorNoBinaryForGpu
#define cudaErrorUnsupportedPtxVersion hipErrorInvalidKernelFile
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorDevicesUnavailable hipErrorContextAlreadyInUse  // the nearest: another process holds it
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaMemGetInfo hipMemGetInfo
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes(attr, kernel) hipFuncGetAttributes((attr), reinterpret_cast<const void *>(kernel))
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamDestroy hipStreamDestroy
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventDestroy hipEventDestroy
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaSetDevice hipSetDevice
#define cudaGetDevice hipGetDevice
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost(ptr, bytes) hipHostMalloc((ptr), (bytes), hipHostMallocDefault)
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice

// Element types of the matrix products (cuda/kernels.h names them; cuda/matmul.cu hands them
// to hipBLASLt). ROCm 5's hip/library_types.h has no HIP_R_16BF: its value in ROCm 6's,
// so that the kernels compile there too (the hipBLASLt glue needs ROCm 6 anyway).
#define cudaDataType_t hipDataType
#define CUDA_R_32F HIP_R_32F
#if HIP_VERSION_MAJOR >= 6
#define CUDA_R_16BF HIP_R_16BF
#else
#define CUDA_R_16BF ((hipDataType)14)
#endif

template <typename T> __device__ __forceinline__ T warp_shuffle_xor(T v, int lane_mask) {
    return __shfl_xor(v, lane_mask, WARP_SIZE);
}

#define GPU_HINT_DRIVER                                                                                    \
    "the AMD GPU driver (amdgpu) is missing or older than this HIP runtime: run rocm-smi; on a cluster, " \
    "run on a GPU node (srun --gpus-per-task=1 ...)"
#define GPU_HINT_VISIBLE                                                                                   \
    "no GPU is visible: check ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES and the job's GPU request (srun " \
    "--gpus-per-task=1 ...)"
#define GPU_HINT_REBUILD                                                                                   \
    "this binary has no kernels for this GPU: rebuild with `make HIP_ARCH=\"--offload-arch=gfxXYZ\"` for its " \
    "architecture (rocminfo names it)"
#define GPU_COLLECTIVES "RCCL"
#define GPU_COLLECTIVES_LIB "librccl.so.1"
#define GPU_COLLECTIVES_LIB_DEV "librccl.so"
#define GPU_COLLECTIVES_MIN "RCCL 2.10 or newer (bf16 all-gathers)"
#define GPU_COLLECTIVES_HINT "load your cluster's ROCm module or add ROCm's lib directory to LD_LIBRARY_PATH"

#else
// ================================================================ CUDA (NVIDIA)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#define GPU_RUNTIME_NAME "CUDA"
#define GPU_VENDOR "NVIDIA"
#define GPU_VISIBLE_DEVICES_ENV "CUDA_VISIBLE_DEVICES"
#define HAVE_NVIDIA_TENSOR_CORES 1
#define HAVE_MMA_SYNC 1
#define HAVE_MFMA 0
#define PORTABLE_OWN_BF16 0
#define GPU_CHECK_ALIGNED(p, bytes) ((void)0)
enum { WARP_SIZE = 32 };
#define WARP_FULL_MASK 0xffffffffu

typedef __nv_bfloat16 bf16;

__host__ __device__ __forceinline__ float bf16_to_float(bf16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ bf16 float_to_bf16(float f) { return __float2bfloat16_rn(f); }

template <typename T> __device__ __forceinline__ T warp_shuffle_xor(T v, int lane_mask) {
    return __shfl_xor_sync(WARP_FULL_MASK, v, lane_mask);
}

#define GPU_HINT_DRIVER                                                                                   \
    "the NVIDIA driver is missing or older than this CUDA runtime: run nvidia-smi; on a cluster, run on " \
    "a GPU node (srun --gpus=1 ...)"
#define GPU_HINT_VISIBLE "no GPU is visible: check CUDA_VISIBLE_DEVICES and the job's GPU request (srun --gpus=1 ...)"
#define GPU_HINT_REBUILD                                                                                   \
    "this binary has no kernels for this GPU: rebuild with `make CUDA_ARCH=\"-gencode "                    \
    "arch=compute_XY,code=sm_XY\"` for its compute capability"
#define GPU_COLLECTIVES "NCCL"
#define GPU_COLLECTIVES_LIB "libnccl.so.2"
#define GPU_COLLECTIVES_LIB_DEV "libnccl.so"
#define GPU_COLLECTIVES_MIN "NCCL 2.10 or newer (bf16 all-gathers)"
#define GPU_COLLECTIVES_HINT "load your cluster's NCCL module or add its lib directory to LD_LIBRARY_PATH"

#endif

// bf16 as a plain 16-bit struct where the toolchain has no type of its own that converts
// the same way (HIP on ROCm 5, the emulator): the bits of CUDA's __nv_bfloat16.
#if PORTABLE_OWN_BF16
typedef struct {
    uint16_t bits;
} bf16;

__host__ __device__ __forceinline__ float bf16_to_float(bf16 x) {
    uint32_t u = (uint32_t)x.bits << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}

__host__ __device__ __forceinline__ bf16 float_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    bf16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: the one quiet NaN CUDA's conversion gives
        b.bits = 0x7fff;
        return b;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (overflow gives inf)
    b.bits = (uint16_t)(u >> 16);
    return b;
}

#endif

#endif
