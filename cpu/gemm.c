// cpu/gemm.c — CBLAS wrapper and the built-in fallback (see cpu/gemm.h).
#include "cpu/gemm.h"

#include "llmc/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#ifdef USE_CBLAS
#include <cblas.h>
#endif

#ifdef USE_CBLAS
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
          const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M,
                (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}
#else
// Built-in fallback: each thread owns a block of rows of C, so there are no races and the
// sum order is fixed; the k loop is outermost inside a tile so the inner loop vectorizes.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
          const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f) memset(c, 0, (size_t)N * sizeof *c);
        else if (beta != 1.0f)
            for (int64_t j = 0; j < N; j++) c[j] *= beta;
        for (int64_t k = 0; k < K; k++) {
            float a = alpha * (trans_a ? A[k * lda + i] : A[i * lda + k]);
            if (!trans_b) {
                const float *b = B + k * ldb;
                for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (int64_t j = 0; j < N; j++) c[j] += a * B[j * ldb + k];
            }
        }
    }
}
#endif

void matmul_forward(float *out, const float *inp, const float *W, int64_t rows, int64_t n_in, int64_t n_out,
                    bool accumulate) {
    gemm(false, true, rows, n_out, n_in, 1.0f, inp, n_in, W, n_in, accumulate ? 1.0f : 0.0f, out, n_out);
}

void matmul_backward_input(float *dinp, const float *dout, const float *W, int64_t rows, int64_t n_in,
                           int64_t n_out, bool accumulate) {
    gemm(false, false, rows, n_in, n_out, 1.0f, dout, n_out, W, n_in, accumulate ? 1.0f : 0.0f, dinp, n_in);
}

void matmul_backward_weight(float *dW, const float *dout, const float *inp, int64_t rows, int64_t n_in,
                            int64_t n_out) {
    gemm(true, false, n_out, n_in, rows, 1.0f, dout, n_out, inp, n_in, 1.0f, dW, n_in);
}

void gemm_fix_cpu_kernels(char **argv) {
#if defined(USE_OPENBLAS) && defined(__x86_64__)
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *core = openblas_get_corename();
    if (!core || (strcasecmp(core, "prescott") != 0 && strcasecmp(core, "core2") != 0 &&
                  strcasecmp(core, "nehalem") != 0))
        return;
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                            : NULL;
    if (!better) return;
    char saved[64];
    snprintf(saved, sizeof saved, "%s", core);
    setenv("OPENBLAS_CORETYPE", better, 1);
    note("OpenBLAS does not recognise this CPU and chose its generic %s kernels; restarting with "
         "OPENBLAS_CORETYPE=%s (2-3x faster here; set OPENBLAS_CORETYPE yourself to choose)",
         saved, better);
    execv("/proc/self/exe", argv);
    warn("could not restart (%s); carrying on with the %s kernels", "execv failed", saved);
#else
    (void)argv;
#endif
}

void gemm_set_threads(int threads) {
#if defined(USE_OPENBLAS)
    openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
}

const char *gemm_backend_name(void) {
#if defined(USE_OPENBLAS)
    static char name[128];
    const char *cfg = openblas_get_config();
    int kind = openblas_get_parallel();
    snprintf(name, sizeof name, "%s (%s)", cfg, kind == 2 ? "OpenMP" : kind == 1 ? "pthreads" : "sequential");
    return name;
#elif defined(USE_CBLAS)
    return "CBLAS";
#else
    return "built-in gemm (slow: build with a BLAS)";
#endif
}
