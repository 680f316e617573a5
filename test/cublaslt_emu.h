// test/cublaslt_emu.h — the part of cuBLASLt that cuda/matmul.cu calls, on the CPU, for the
// emulated GPU build (test/warp_emu.h; the Makefile's "emulated GPU tests"): with it the GPU
// model of train_gpt.cu runs whole training steps in `make test` (build/test_gpu_step_emu).
//
// What it computes is what cuBLASLt is documented to compute: column-major
//   D (m, n; ldd) = alpha · op(A) · op(B) + beta · C,   op = transpose or not (TRANSA / TRANSB),
// A and B bf16, products summed in fp32 (CUBLAS_COMPUTE_32F), D bf16 (rounded to nearest even)
// or fp32. The sums run in the CPU backend's product (cpu/gemm.h), in whatever order it
// takes; a GPU's kernels split and order them otherwise, so the two differ by fp32 rounding
// (~1e-7 relative per sum), far below the bf16 tests' bounds.
// It also does what the library does with bad calls: a layout whose shape disagrees with the
// op, a type other than bf16 in / bf16 or fp32 out, or a C layout unlike D's returns
// CUBLAS_STATUS_INVALID_VALUE or _NOT_SUPPORTED, so matmul.cu's checks are exercised too.
// The heuristic returns one "algorithm" for every problem; the workspace is not used.
#ifndef TRAIN_GPT_TEST_CUBLASLT_EMU_H
#define TRAIN_GPT_TEST_CUBLASLT_EMU_H

#include "cpu/gemm.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;  // cublas_api.h's values
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 } cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

namespace emu {
struct lt_handle {
    int calls;
};
struct lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t trans_a, trans_b;
};
struct lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct lt_pref {
    uint64_t workspace;
};
}  // namespace emu

typedef emu::lt_handle *cublasLtHandle_t;
typedef emu::lt_desc *cublasLtMatmulDesc_t;
typedef emu::lt_layout *cublasLtMatrixLayout_t;
typedef emu::lt_pref *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { return *h = new emu::lt_handle{0}, CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return delete h, CUBLAS_STATUS_SUCCESS; }

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new emu::lt_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return delete d, CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void *value, size_t bytes) {
    if (bytes != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    cublasOperation_t op;
    memcpy(&op, value, sizeof op);
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA) d->trans_a = op;
    else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) d->trans_b = op;
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

// A column-major layout: rows, cols, and ld ≥ rows.
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows || ld < 1) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new emu::lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return delete l, CUBLAS_STATUS_SUCCESS; }

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    return *p = new emu::lt_pref{0}, CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    return delete p, CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t attr,
                                                           const void *value, size_t bytes) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (bytes != sizeof p->workspace) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->workspace, value, bytes);
        return CUBLAS_STATUS_SUCCESS;
    }
    uint32_t align;  // a minimum alignment: a power of two
    if (bytes != sizeof align) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&align, value, bytes);
    return align && !(align & (align - 1)) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

namespace emu {
// The shapes of a product: op(A) is (m, k), op(B) is (k, n), C and D (m, n) of one type.
inline cublasStatus_t lt_shapes(const lt_desc *d, const lt_layout *a, const lt_layout *b, const lt_layout *c,
                                const lt_layout *dl, uint64_t *m, uint64_t *n, uint64_t *k) {
    if (a->type != CUDA_R_16BF || b->type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (dl->type != CUDA_R_16BF && dl->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (c->type != dl->type || c->rows != dl->rows || c->cols != dl->cols) return CUBLAS_STATUS_NOT_SUPPORTED;
    *m = d->trans_a == CUBLAS_OP_T ? a->cols : a->rows;
    *k = d->trans_a == CUBLAS_OP_T ? a->rows : a->cols;
    uint64_t kb = d->trans_b == CUBLAS_OP_T ? b->cols : b->rows;
    *n = d->trans_b == CUBLAS_OP_T ? b->rows : b->cols;
    if (kb != *k || dl->rows != *m || dl->cols != *n) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
inline float lt_load(const void *p, cudaDataType_t type, int64_t i) {
    return type == CUDA_R_32F ? ((const float *)p)[i] : bf16_value(((const uint16_t *)p)[i]);
}
}  // namespace emu

inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                     cublasLtMatmulPreference_t, int requested,
                                                     cublasLtMatmulHeuristicResult_t *results, int *found) {
    uint64_t m, n, k;
    cublasStatus_t s = emu::lt_shapes(d, a, b, c, dl, &m, &n, &k);
    *found = 0;
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    // CUBLASLT_EMU_NO_ALGORITHM=1: no algorithm, as cuBLASLt most often says it (not found = 0):
    // the trainer must name the shape (test/test_gpu_train.sh).
    if (getenv("CUBLASLT_EMU_NO_ALGORITHM")) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                     cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b,
                                     const void *beta, const void *C, cublasLtMatrixLayout_t c, void *D,
                                     cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *, void *, size_t,
                                     cudaStream_t stream) {
    uint64_t m, n, k;
    cublasStatus_t s = emu::lt_shapes(d, a, b, c, dl, &m, &n, &k);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    h->calls++;
    // Read now (host pointers), run in the stream's order (test/warp_emu.h's deferred streams);
    // the descriptors are the caller's cached ones, alive until it destroys them.
    float al = *(const float *)alpha, be = *(const float *)beta;
    bool ta = d->trans_a == CUBLAS_OP_T, tb = d->trans_b == CUBLAS_OP_T;
    int64_t lda = a->ld, ldb = b->ld, ldc = c ? c->ld : 0, ldd = dl->ld;
    cudaDataType_t ctype = c ? c->type : CUDA_R_32F, dtype = dl->type;
    emu::enqueue(stream, [=] {
    // op(A) row by row and op(B) column by column as floats, then Dᵀ (n, m) = op(B)ᵀ · op(A)ᵀ
    // by the CPU backend's row-major product (cpu/gemm.h: OpenBLAS when the build has it).
    const uint16_t *Ab = (const uint16_t *)A, *Bb = (const uint16_t *)B;
    std::vector<float> opa(m * k), opbt(n * k), dt(n * m);
    for (uint64_t i = 0; i < m; i++)
        for (uint64_t p = 0; p < k; p++) opa[i * k + p] = emu::bf16_value(Ab[ta ? i * lda + p : p * lda + i]);
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t p = 0; p < k; p++) opbt[j * k + p] = emu::bf16_value(Bb[tb ? p * ldb + j : j * ldb + p]);
    gemm(false, true, (int64_t)n, (int64_t)m, (int64_t)k, 1.0f, opbt.data(), (int64_t)k, opa.data(), (int64_t)k, 0.0f,
         dt.data(), (int64_t)m);
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            float v = al * dt[j * m + i];
            if (be != 0.0f) v += be * emu::lt_load(C, ctype, (int64_t)(j * ldc + i));
            int64_t at = (int64_t)(j * ldd + i);
            if (dtype == CUDA_R_32F) ((float *)D)[at] = v;
            else ((uint16_t *)D)[at] = emu::bf16_bits(v);
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

#endif
