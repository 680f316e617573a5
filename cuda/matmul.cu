// cuda/matmul.cu — every matrix product of the GPU backend, through cuBLASLt (NVIDIA) or
// hipBLASLt (AMD, ROCm ≥ 6), the one library glue file of the backend.
//
// The model's tensors are row-major; cuBLASLt thinks column-major. A row-major X (r, c) is
// the column-major Xᵀ (c, r) with the same leading dimension, so each product of a linear
// layer becomes one column-major call without copies:
//   forward          outᵀ (n_out, rows)  = op_T(W as (n_in, n_out)) · inpᵀ (n_in, rows)
//   backward input   dinpᵀ (n_in, rows)  = W as (n_in, n_out) · doutᵀ (n_out, rows)
//   backward weight  dWᵀ (n_in, n_out)  += inpᵀ (n_in, rows) · op_T(doutᵀ (n_out, rows))
// bf16 inputs, fp32 compute (CUBLAS_COMPUTE_32F), outputs bf16 or fp32; the weight
// gradients accumulate (beta = 1) straight into the fp32 gradient buffer, so gradient
// accumulation over micro-batches happens in fp32 with no extra pass.
//
// Why a cache: cuBLASLt's heuristic query and the descriptor set-up cost tens of
// microseconds of host time per call — about as long as a small GEMM. Each distinct
// problem (shapes, leading dimensions, transposes, output type, whether C is read, the
// pointers' alignment) is looked up once and remembered with its descriptors and chosen
// algorithm. The same problem then always runs the same algorithm, which together with
// cuBLAS's own guarantee (same bits on the same GPU model and library version) keeps runs
// deterministic.
//
// hipBLASLt copies cuBLASLt's API call for call: under hipcc the names below become its
// names (the API of ROCm 6.2 and later: hipDataType and hipblasComputeType_t; ROCm 6.0 and
// 6.1 spelled those types differently). It has no minimum-alignment preferences, so the
// heuristic is not told the alignment there (the cache key still holds it). Not yet run on
// an AMD GPU; Debian's ROCm 5 has no hipBLASLt, so `make check-hip` skips this file there.
#include "cuda/kernels.h"

#include <string.h>

#if defined(TRAIN_GPT_EMULATION)
// The CPU emulator's cuBLASLt (test/cublaslt_emu.h, force-included by the emulated build).
#define BLAS_NAME "cuBLASLt (emulated on the CPU)"
#define BLAS_STATUS_PREFIX "CUBLAS_"
#define BLAS_HAS_ALIGNMENT_PREFERENCES 1
#define BLAS_HINT_UNSUPPORTED "the emulated cuBLASLt multiplies bf16 matrices into bf16 or fp32 only"
#elif defined(__HIPCC__)
#include <hipblaslt/hipblaslt.h>
#define BLAS_NAME "hipBLASLt"
#define BLAS_HAS_ALIGNMENT_PREFERENCES 0
#define BLAS_STATUS_PREFIX "HIPBLAS_"
#define BLAS_HINT_UNSUPPORTED                                                                              \
    "hipBLASLt runs bf16 products on CDNA GPUs (gfx90a: MI250X, gfx942: MI300X) with ROCm 6 or newer"
#define cublasStatus_t hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define CUBLAS_STATUS_NOT_INITIALIZED HIPBLAS_STATUS_NOT_INITIALIZED
#define CUBLAS_STATUS_ALLOC_FAILED HIPBLAS_STATUS_ALLOC_FAILED
#define CUBLAS_STATUS_INVALID_VALUE HIPBLAS_STATUS_INVALID_VALUE
#define CUBLAS_STATUS_ARCH_MISMATCH HIPBLAS_STATUS_ARCH_MISMATCH
#define CUBLAS_STATUS_MAPPING_ERROR HIPBLAS_STATUS_MAPPING_ERROR
#define CUBLAS_STATUS_EXECUTION_FAILED HIPBLAS_STATUS_EXECUTION_FAILED
#define CUBLAS_STATUS_INTERNAL_ERROR HIPBLAS_STATUS_INTERNAL_ERROR
#define CUBLAS_STATUS_NOT_SUPPORTED HIPBLAS_STATUS_NOT_SUPPORTED
#define cublasOperation_t hipblasOperation_t
#define CUBLAS_OP_N HIPBLAS_OP_N
#define CUBLAS_OP_T HIPBLAS_OP_T
#define CUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define cublasLtHandle_t hipblasLtHandle_t
#define cublasLtCreate hipblasLtCreate
#define cublasLtDestroy hipblasLtDestroy
#define cublasLtMatmulDesc_t hipblasLtMatmulDesc_t
#define cublasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy hipblasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define CUBLASLT_MATMUL_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define CUBLASLT_MATMUL_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define cublasLtMatrixLayout_t hipblasLtMatrixLayout_t
#define cublasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy hipblasLtMatrixLayoutDestroy
#define cublasLtMatmulPreference_t hipblasLtMatmulPreference_t
#define cublasLtMatmulPreferenceCreate hipblasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define cublasLtMatmulAlgo_t hipblasLtMatmulAlgo_t
#define cublasLtMatmulHeuristicResult_t hipblasLtMatmulHeuristicResult_t
#define cublasLtMatmulAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define cublasLtMatmul hipblasLtMatmul
#else
#include <cublasLt.h>
#define BLAS_NAME "cuBLASLt"
#define BLAS_STATUS_PREFIX "CUBLAS_"
#define BLAS_HAS_ALIGNMENT_PREFERENCES 1
#define BLAS_HINT_UNSUPPORTED "the CUDA backend needs bf16 tensor cores (compute capability 8.0, A100, or newer)"
#endif

// ---------------------------------------------------------------- error checks

static const char *blas_status_text(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return BLAS_STATUS_PREFIX "STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return BLAS_STATUS_PREFIX "STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return BLAS_STATUS_PREFIX "STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return BLAS_STATUS_PREFIX "STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return BLAS_STATUS_PREFIX "STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return BLAS_STATUS_PREFIX "STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return BLAS_STATUS_PREFIX "STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return BLAS_STATUS_PREFIX "STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return BLAS_STATUS_PREFIX "STATUS_NOT_SUPPORTED";
    default: return "unknown status";
    }
}

static void blas_check_failed(cublasStatus_t s, const char *expr, const char *file, int line) {
    fprintf(stderr, "train_gpt: error: " BLAS_NAME " error at %s:%d: %s (status %d) in %s\n", file, line,
            blas_status_text(s), (int)s, expr);
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        fprintf(stderr, "---> HINT: the GPU is out of memory: lower batch_size (raise grad_accum to keep the "
                        "tokens per step)\n");
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH)
        fprintf(stderr, "---> HINT: " BLAS_HINT_UNSUPPORTED "\n");
    fflush(stderr);
    exit(1);
}

#define CUBLAS_CHECK(call)                                                         \
    do {                                                                           \
        cublasStatus_t cublas_check_s_ = (call);                                   \
        if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS)                              \
            blas_check_failed(cublas_check_s_, #call, __FILE__, __LINE__);         \
    } while (0)

// ---------------------------------------------------------------- the cache

enum { MATMUL_WORKSPACE_BYTES = 32 << 20 };  // what NVIDIA recommends for Hopper

typedef struct {
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    cudaDataType_t out_type;
    bool reads_c;
    int align_a, align_b, align_c, align_d;
} matmul_key;

typedef struct {
    matmul_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;
} matmul_plan;

struct matmul_context {
    cublasLtHandle_t handle;
    void *workspace;
    matmul_plan *plans;
    int count, capacity;
};

matmul_context *matmul_create(void) {
    matmul_context *mc = (matmul_context *)calloc(1, sizeof *mc);
    if (!mc) {
        fprintf(stderr, "train_gpt: error: out of host memory\n");
        exit(1);
    }
    CUBLAS_CHECK(cublasLtCreate(&mc->handle));
    mc->workspace = cuda_alloc(MATMUL_WORKSPACE_BYTES, "the matmuls' workspace", -1);
    return mc;
}

void matmul_destroy(matmul_context *mc) {
    if (!mc) return;
    for (int i = 0; i < mc->count; i++) {
        matmul_plan *p = &mc->plans[i];
        cublasLtMatmulDescDestroy(p->desc);
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->c);
        cublasLtMatrixLayoutDestroy(p->d);
    }
    free(mc->plans);
    cudaFree(mc->workspace);
    cublasLtDestroy(mc->handle);
    free(mc);
}

int matmul_cached_shapes(const matmul_context *mc) { return mc->count; }

// Largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by it.
static int alignment_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int align = 256;
    while (align > 1 && a % (uintptr_t)align) align /= 2;
    return align;
}

static bool same_key(const matmul_key *x, const matmul_key *y) {
    return x->trans_a == y->trans_a && x->trans_b == y->trans_b && x->m == y->m && x->n == y->n && x->k == y->k &&
           x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc && x->out_type == y->out_type &&
           x->reads_c == y->reads_c && x->align_a == y->align_a && x->align_b == y->align_b &&
           x->align_c == y->align_c && x->align_d == y->align_d;
}

#if BLAS_HAS_ALIGNMENT_PREFERENCES
static void set_alignment(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, int align) {
    uint32_t a = (uint32_t)align;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &a, sizeof a));
}
#endif

static matmul_plan *plan_for(matmul_context *mc, const matmul_key *key) {
    for (int i = 0; i < mc->count; i++)
        if (same_key(&mc->plans[i].key, key)) return &mc->plans[i];
    if (mc->count == mc->capacity) {
        mc->capacity = mc->capacity ? 2 * mc->capacity : 32;
        mc->plans = (matmul_plan *)realloc(mc->plans, (size_t)mc->capacity * sizeof *mc->plans);
        if (!mc->plans) {
            fprintf(stderr, "train_gpt: error: out of host memory\n");
            exit(1);
        }
    }
    matmul_plan *p = &mc->plans[mc->count];
    memset(p, 0, sizeof *p);
    p->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Stored shapes (before op): A is (m,k) or, transposed, (k,m); B is (k,n) or (n,k).
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, key->trans_a ? key->k : key->m,
                                            key->trans_a ? key->m : key->k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, key->trans_b ? key->n : key->k,
                                            key->trans_b ? key->k : key->n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, key->out_type, key->m, key->n, key->ldc));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, key->out_type, key->m, key->n, key->ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t workspace = MATMUL_WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace));
#if BLAS_HAS_ALIGNMENT_PREFERENCES
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key->align_a);
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key->align_b);
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key->align_c);
    set_alignment(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key->align_d);
#endif
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    // No algorithm comes back as CUBLAS_STATUS_NOT_SUPPORTED more often than as found = 0: both
    // get the shape and the hint below (CUBLAS_CHECK's was that the GPU lacks bf16 tensor cores).
    cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(mc->handle, p->desc, p->a, p->b, p->c, p->d, pref, 1,
                                                              &result, &found);
    if (heuristic == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
    else CUBLAS_CHECK(heuristic);
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) {
        fprintf(stderr,
                "train_gpt: error: " BLAS_NAME " has no algorithm for a %s%s matmul m=%lld n=%lld k=%lld (lda %lld, "
                "ldb %lld, ldc %lld, %s output)\n"
                "---> HINT: d_model, d_ff, head_dim·heads and vocab_size that are multiples of 8 keep every "
                "product on the tensor cores\n",
                key->trans_a ? "T" : "N", key->trans_b ? "T" : "N", (long long)key->m, (long long)key->n,
                (long long)key->k, (long long)key->lda, (long long)key->ldb, (long long)key->ldc,
                key->out_type == CUDA_R_32F ? "fp32" : "bf16");
        exit(1);
    }
    p->algo = result.algo;
    mc->count++;
    return p;
}

// D (m,n; ldc) = op(A)·op(B) + beta·C, column-major; C is D itself unless c is given.
static void lt_matmul(matmul_context *mc, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16 *A,
                      int64_t lda, const bf16 *B, int64_t ldb, const void *C, void *D, int64_t ldc,
                      cudaDataType_t out_type, float beta, cudaStream_t stream) {
    if (m == 0 || n == 0) return;
    const void *c = C ? C : D;
    matmul_key key;
    memset(&key, 0, sizeof key);  // padding too: keys are compared field by field, but keep them clean
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.out_type = out_type;
    key.reads_c = beta != 0.0f;
    key.align_a = alignment_of(A);
    key.align_b = alignment_of(B);
    key.align_c = alignment_of(c);
    key.align_d = alignment_of(D);
    matmul_plan *p = plan_for(mc, &key);
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(mc->handle, p->desc, &alpha, A, p->a, B, p->b, &beta, c, p->c, D, p->d, &p->algo,
                                mc->workspace, MATMUL_WORKSPACE_BYTES, stream));
}

void matmul_forward(matmul_context *mc, void *out, cudaDataType_t out_type, int64_t ld_out, const float *add,
                    const bf16 *inp, const bf16 *W, int64_t rows, int64_t n_in, int64_t n_out, cudaStream_t stream) {
    // outᵀ (n_out, rows) = Wᵀ-view op_T · inpᵀ
    lt_matmul(mc, true, false, n_out, rows, n_in, W, n_in, inp, n_in, add, out, ld_out, out_type,
              add ? 1.0f : 0.0f, stream);
}

void matmul_backward_input(matmul_context *mc, void *dinp, cudaDataType_t dinp_type, const bf16 *dout,
                           int64_t ld_dout, const bf16 *W, int64_t rows, int64_t n_in, int64_t n_out,
                           bool accumulate, cudaStream_t stream) {
    // dinpᵀ (n_in, rows) = W as (n_in, n_out) · doutᵀ (n_out, rows)
    lt_matmul(mc, false, false, n_in, rows, n_out, W, n_in, dout, ld_dout, NULL, dinp, n_in, dinp_type,
              accumulate ? 1.0f : 0.0f, stream);
}

void matmul_backward_weight(matmul_context *mc, float *dW, const bf16 *dout, int64_t ld_dout, const bf16 *inp,
                            int64_t rows, int64_t n_in, int64_t n_out, cudaStream_t stream) {
    // dWᵀ (n_in, n_out) += inpᵀ (n_in, rows) · (doutᵀ (n_out, rows))ᵀ
    lt_matmul(mc, false, true, n_in, n_out, rows, inp, n_in, dout, ld_dout, NULL, dW, n_in, CUDA_R_32F, 1.0f,
              stream);
}
