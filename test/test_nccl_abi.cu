// test/test_nccl_abi.cu — cuda/nccl_abi.h, the part of NCCL's interface that cuda/collective.cu
// declares for itself (so that the build needs no NCCL headers), against the nccl.h of this
// machine, and collective.cu's loader against its libnccl.so.2. Built by nvcc where the CUDA
// toolkit has nccl.h and libnccl.so.2 (the Makefile says when it is not); runs without a GPU:
// nothing here touches a device.
//
// Compile time: every result code and data type train_gpt uses has NCCL's value, the unique id
// NCCL's size. Run time: gpu_comm_nccl_version() opens the library the way a multi-GPU job
// does (dlopen, the twelve symbols, the version check) and must report the version the library
// itself reports; a value wrong in nccl_abi.h, a symbol missing or misspelt, or a loader that
// fails makes this test fail.
#include <cuda_bf16.h>  // nccl.h's own includes, first, so that the namespace below
#include <cuda_fp16.h>  // holds NCCL's declarations and nothing of CUDA's
#include <cuda_runtime.h>
#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#endif
namespace real {
#include <nccl.h>
}

#include "cuda/collective.h"
#include "cuda/nccl_abi.h"
#include "test/check.h"

#include <dlfcn.h>
#include <string.h>

#define SAME(ours, theirs) static_assert((int)(ours) == (int)real::theirs, #ours " differs from nccl.h")
SAME(ncclSuccess, ncclSuccess);
SAME(ncclUnhandledCudaError, ncclUnhandledCudaError);
SAME(ncclSystemError, ncclSystemError);
SAME(ncclInternalError, ncclInternalError);
SAME(ncclInvalidArgument, ncclInvalidArgument);
SAME(ncclInvalidUsage, ncclInvalidUsage);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 12, 0)  // older headers have not these codes
SAME(ncclRemoteError, ncclRemoteError);
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
SAME(ncclInProgress, ncclInProgress);
#endif
SAME(ncclFloat32, ncclFloat32);
SAME(ncclFloat64, ncclFloat64);
SAME(ncclBfloat16, ncclBfloat16);
static_assert(sizeof(ncclUniqueId) == sizeof(real::ncclUniqueId), "ncclUniqueId's size differs from nccl.h");
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is not NCCL_UNIQUE_ID_BYTES long");
static_assert(sizeof(ncclComm_t) == sizeof(real::ncclComm_t), "ncclComm_t's size differs from nccl.h");
#undef SAME

int main(void) {
    // The library as collective.cu opens it (its run path: the toolkit's lib directory).
    int ours = gpu_comm_nccl_version();
    void *lib = dlopen("libnccl.so.2", RTLD_NOW);
    EXPECT(lib != NULL, "libnccl.so.2 does not open here: %s", dlerror());
    if (lib) {
        real::ncclResult_t (*get_version)(int *) = (real::ncclResult_t(*)(int *))dlsym(lib, "ncclGetVersion");
        int theirs = 0;
        EXPECT(get_version && get_version(&theirs) == real::ncclSuccess, "ncclGetVersion through nccl.h failed");
        EXPECT(ours == theirs && ours >= 21000, "the loader reports NCCL %d, the library %d", ours, theirs);
        printf("test_nccl_abi: nccl.h %d, libnccl.so.2 %d, collective.cu's loader %d\n", NCCL_VERSION_CODE, theirs,
               ours);
    }
    EXPECT(gpu_comm_available(), "a CUDA build has the GPU collectives");
    return check_summary("test_nccl_abi");
}
