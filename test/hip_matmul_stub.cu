// test/hip_matmul_stub.cu — cuda/matmul.cu's functions for `make check-hip` where ROCm has no
// hipBLASLt (Debian's ROCm 5): the HIP build links and starts (the probe, the CPU fallback,
// `train_gpt plan`), and any matrix product stops it with one line. Never in a real build:
// cuda/cuda.mk takes it only with HIP_CHECK=1 and no hipblaslt/hipblaslt.h.
#include "cuda/kernels.h"

struct matmul_context {
    int unused;
};

static void no_hipblaslt(void) {
    fprintf(stderr, "train_gpt: error: this HIP_CHECK=1 build has no hipBLASLt (make check-hip's stand-in for "
                    "cuda/matmul.cu)\n---> HINT: build with ROCm 6.2 or newer for the HIP backend\n");
    exit(1);
}

matmul_context *matmul_create(void) {
    no_hipblaslt();
    return NULL;
}
void matmul_destroy(matmul_context *mc) { (void)mc; }
int matmul_cached_shapes(const matmul_context *mc) { return mc ? mc->unused : 0; }
void matmul_forward(matmul_context *, void *, cudaDataType_t, int64_t, const float *, const bf16 *, const bf16 *,
                    int64_t, int64_t, int64_t, cudaStream_t) {
    no_hipblaslt();
}
void matmul_backward_input(matmul_context *, void *, cudaDataType_t, const bf16 *, int64_t, const bf16 *, int64_t,
                           int64_t, int64_t, bool, cudaStream_t) {
    no_hipblaslt();
}
void matmul_backward_weight(matmul_context *, float *, const bf16 *, int64_t, const bf16 *, int64_t, int64_t, int64_t,
                            cudaStream_t) {
    no_hipblaslt();
}
