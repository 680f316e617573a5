// cpu/gemm.h — the matrix products of the CPU backend, in the three shapes a linear layer
// needs. All matrices are row-major fp32. Through CBLAS (OpenBLAS, MKL, ...) when the
// build found one; otherwise a plain blocked OpenMP loop that is correct but slow.
//
// The products are deterministic for a fixed thread count (they are in OpenBLAS), which is
// what bit-exact resume needs: the same run with the same threads repeats itself.
#ifndef TRAIN_GPT_GEMM_H
#define TRAIN_GPT_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// C[M,N] = alpha · op(A) · op(B) + beta · C, op = transpose when trans_* is set.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
          const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

// out (rows, n_out) = inp (rows, n_in) · W (n_out, n_in)ᵀ  [+ out if accumulate]
void matmul_forward(float *out, const float *inp, const float *W, int64_t rows, int64_t n_in, int64_t n_out,
                    bool accumulate);
// dinp (rows, n_in) = dout (rows, n_out) · W (n_out, n_in)  [+ dinp if accumulate]
void matmul_backward_input(float *dinp, const float *dout, const float *W, int64_t rows, int64_t n_in,
                           int64_t n_out, bool accumulate);
// dW (n_out, n_in) += dout (rows, n_out)ᵀ · inp (rows, n_in)
void matmul_backward_weight(float *dW, const float *dout, const float *inp, int64_t rows, int64_t n_in,
                            int64_t n_out);

// OpenBLAS built with DYNAMIC_ARCH picks its kernels by CPU model, and a CPU newer than
// the library (or one a hypervisor reports oddly) gets the generic SSE3 "Prescott"
// kernels, 2-3x slower than the AVX2/AVX-512 ones it could run. Called first thing in
// main(): in that case it sets OPENBLAS_CORETYPE and re-executes the program once. A user
// who sets OPENBLAS_CORETYPE keeps their choice.
void gemm_fix_cpu_kernels(char **argv);

// Threads for the BLAS (OpenBLAS keeps its own count beside OpenMP's).
void gemm_set_threads(int threads);

// What the build links, for the start-up banner ("OpenBLAS 0.3.21 (OpenMP)", "built-in").
const char *gemm_backend_name(void);

#ifdef __cplusplus
}
#endif

#endif
