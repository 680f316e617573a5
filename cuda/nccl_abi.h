// cuda/nccl_abi.h — the part of NCCL's C interface that cuda/collective.cu calls, declared here
// instead of taken from nccl.h. The library is opened at run time (dlopen), so the declarations
// are all the build needs: a binary built where no NCCL headers are installed (a login node
// without the NCCL module, a container with only the CUDA toolkit) still shards a model over
// the GPUs of a node that has libnccl.so.2. AMD's RCCL implements the same interface under the
// same names and values (its header is a copy of NCCL's with HIP's stream type), so the HIP
// build opens librccl.so.1 through the same declarations.
//
// What is declared is NCCL's ABI, each name unchanged since the version that introduced it
// (the notes below; train_gpt needs 2.10): the communicator is an opaque pointer, the unique
// id 128 bytes passed by value, the result codes and the data types small enums.
// test/test_nccl_abi.cu checks every value and size against the nccl.h of the build machine
// where it has one (make test), and calls the library through them.
#ifndef TRAIN_GPT_CUDA_NCCL_ABI_H
#define TRAIN_GPT_CUDA_NCCL_ABI_H

typedef struct ncclComm *ncclComm_t;

typedef struct {
    char internal[128];  // NCCL_UNIQUE_ID_BYTES
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,  // NCCL 2.12 and later
    ncclInProgress = 7,   // NCCL 2.14 and later: a non-blocking communicator's operation is under way
} ncclResult_t;

// The types train_gpt sends (NCCL has more, with other values).
typedef enum {
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,  // NCCL 2.10 and later; RCCL since ROCm 4
} ncclDataType_t;

#endif
