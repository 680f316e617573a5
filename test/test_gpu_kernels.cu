// test/test_gpu_kernels.cu — every CUDA kernel against its CPU reference (cpu/ops.c,
// cpu/gemm.c, llmc/optim.c) on random inputs; `make test-gpu` runs it on a machine with a GPU.
//
// Each check prints one line: PASS/FAIL, the name, the largest absolute error, the error
// relative to the reference's largest magnitude (max_rel) and, for tensors, the relative L2
// error ‖got − want‖/‖want‖, with the tolerance applied. The CPU gets exactly the bf16
// values the GPU reads (inputs are rounded to bf16 first), so the errors measured are the
// kernels' own. Tolerances, and why:
//   bf16 has 8 significant bits: one rounding moves a value by up to 2^-9 ≈ 0.2 % of
//   itself. A kernel that writes a bf16 result from fp32 math gets max_rel ≈ 2^-9 and is
//   checked at 1 % (BF16_OUT). Sums in fp32 in another order than the CPU's differ by
//   ~n·2^-24 relative: fp32 outputs are checked at 1e-4 (FP32_OUT). Attention rounds P to
//   bf16 before P·V and its inputs are sums of many such products: checked at 2 % of the
//   largest magnitude and 1 % in L2 (ATTENTION); its backward subtracts nearly equal terms
//   (dP − δ), checked at 5 % and 2 % (ATTENTION_BWD); under the emulator, where they were
//   measured, at about 2.5× what they reach (below). A wrong index or a missing factor
//   gives errors of order 100 %, far outside all of these.
//   AdamW (ADAMW) is fp32 element-wise on both sides, about 12 roundings per element (the
//   moments, the bias corrections, sqrt, the division, the decay); either compiler may
//   contract a multiply-add into an FMA (one rounding fewer), so the sides can differ by a
//   few ulp: 2^-24 ≈ 6e-8 each. Checked at 1e-6 (16 ulp) of the largest element, max and L2.
//   Measured on an H100: ≤ 1e-7.
// Determinism checks run the same kernel twice and demand identical bits.
//
// `make test` also builds this file in emulation (TRAIN_GPT_EMULATION, test/warp_emu.h):
// the same checks run on the CPU, every kernel but the cuBLASLt products and the WMMA
// attention (which the emulator cannot run: WMMA's fragment layouts are not documented;
// attention_forward is the simple kernels at 32-wide warps, the MFMA ones at 64), and
// without the largest cases.
#include "cuda/kernels.h"

extern "C" {
#include "llmc/common.h"
#include "llmc/config.h"
#include "cpu/ops.h"
#include "cpu/gemm.h"
#include "llmc/params.h"
#include "llmc/optim.h"
#include "llmc/rng.h"
}

#include <math.h>
#include <string.h>
#include <vector>

#ifndef TRAIN_GPT_EMULATION
#define TRAIN_GPT_EMULATION 0
#endif

static int failures = 0, checks = 0;
static rng_state rng;
static cudaStream_t stream;

struct tolerance {
    double max_rel;   // max |got − want| / max |want|
    double l2_rel;    // ‖got − want‖ / ‖want‖
};
static const tolerance EXACT = {0.0, 0.0};
static const tolerance FP32_OUT = {1e-4, 1e-5};
static const tolerance BF16_OUT = {1e-2, 5e-3};
#if defined(TRAIN_GPT_EMULATION)
// Measured under the emulator (make test, 2026-12): forward max_rel ≤ 2.9e-3, L2 ≤ 1.9e-3;
// backward (dq, dk, dv) max_rel ≤ 5.5e-3, L2 ≤ 4.3e-3 over this file's and the fa2/mfma emulated
// tests' shapes: bf16's rounding (its fp32 sums are the CPU's, in another order). About 2.5× over
// them; dq off by 1 % (a wrong scale) reads L2 1.0e-2 and fails, as it passed at 5 % / 2 %.
static const tolerance ATTENTION = {8e-3, 5e-3};
static const tolerance ATTENTION_BWD = {1.2e-2, 8e-3};
#else
// On a GPU the same bf16 roundings with the GPU's own fp32 order: not yet measured on one, so the
// first bounds stand until a lease measures them (bench/results/).
static const tolerance ATTENTION = {2e-2, 1e-2};
static const tolerance ATTENTION_BWD = {5e-2, 2e-2};
#endif
static const tolerance ADAMW = {1e-6, 1e-6};

static void compare(const char *name, const float *got, const float *want, int64_t n, tolerance tol) {
    double max_abs = 0.0, max_want = 0.0, err2 = 0.0, want2 = 0.0;
    bool finite = true;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) finite = false;
        double e = fabs((double)got[i] - (double)want[i]);
        max_abs = fmax(max_abs, e);
        max_want = fmax(max_want, fabs((double)want[i]));
        err2 += e * e;
        want2 += (double)want[i] * want[i];
    }
    double rel = max_want > 0 ? max_abs / max_want : max_abs, l2 = want2 > 0 ? sqrt(err2 / want2) : sqrt(err2);
    bool ok = finite && rel <= tol.max_rel && l2 <= tol.l2_rel;
    checks++;
    if (!ok) failures++;
    printf("%s %-44s max_abs %.3e  max_rel %.3e (tol %.0e)  l2_rel %.3e (tol %.0e)%s\n", ok ? "PASS" : "FAIL", name,
           max_abs, rel, tol.max_rel, l2, tol.l2_rel, finite ? "" : "  NON-FINITE");
}

static void expect(const char *name, bool ok, const char *detail) {
    checks++;
    if (!ok) failures++;
    printf("%s %-44s %s\n", ok ? "PASS" : "FAIL", name, detail);
}

// ---------------------------------------------------------------- host/device helpers

static std::vector<float> randn(int64_t n, double scale) {
    std::vector<float> x((size_t)n);
    for (auto &v : x) v = (float)(rng_normal(&rng) * scale);
    return x;
}
static void round_bf16(std::vector<float> &x) {
    for (auto &v : x) v = bf16_to_float(float_to_bf16(v));
}
template <typename T> static T *dev_alloc(int64_t n) {
    T *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, (size_t)(n > 0 ? n : 1) * sizeof(T)));
    CUDA_CHECK(cudaMemset(p, 0, (size_t)(n > 0 ? n : 1) * sizeof(T)));
    return p;
}
static float *up_f32(const std::vector<float> &x) {
    float *d = dev_alloc<float>((int64_t)x.size());
    CUDA_CHECK(cudaMemcpy(d, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static bf16 *up_bf16(const std::vector<float> &x) {
    std::vector<bf16> h(x.size());
    for (size_t i = 0; i < x.size(); i++) h[i] = float_to_bf16(x[i]);
    bf16 *d = dev_alloc<bf16>((int64_t)x.size());
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    return d;
}
static int32_t *up_i32(const std::vector<int32_t> &x) {
    int32_t *d = dev_alloc<int32_t>((int64_t)x.size());
    CUDA_CHECK(cudaMemcpy(d, x.data(), x.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
}
static std::vector<float> down_f32(const float *d, int64_t n) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> h((size_t)n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
static std::vector<float> down_bf16(const bf16 *d, int64_t n) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<bf16> h((size_t)n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, (size_t)n * sizeof(bf16), cudaMemcpyDeviceToHost));
    std::vector<float> f((size_t)n);
    for (int64_t i = 0; i < n; i++) f[(size_t)i] = bf16_to_float(h[(size_t)i]);
    return f;
}
// Rows (n, width) taken out of a strided (n, stride) array at column offset.
static std::vector<float> columns(const std::vector<float> &x, int64_t n, int64_t stride, int64_t offset,
                                  int64_t width) {
    std::vector<float> out((size_t)(n * width));
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < width; c++) out[(size_t)(r * width + c)] = x[(size_t)(r * stride + offset + c)];
    return out;
}
static bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
// Tokens with a document token (0) every 20–60 positions, never all in one document.
static std::vector<int32_t> doc_tokens(int64_t B, int64_t T, int32_t vocab) {
    std::vector<int32_t> t((size_t)(B * T));
    for (int64_t b = 0; b < B; b++) {
        int64_t next_doc = 5 + (int64_t)(rng_next(&rng) % 20);
        for (int64_t i = 0; i < T; i++) {
            int32_t v = 1 + (int32_t)(rng_next(&rng) % (uint64_t)(vocab - 1));
            if (i == next_doc) {
                v = 0;
                next_doc += 20 + (int64_t)(rng_next(&rng) % 41);
            }
            t[(size_t)(b * T + i)] = v;
        }
    }
    return t;
}

// ---------------------------------------------------------------- matmul

static void test_matmul(matmul_context *mc) {
    const int64_t rows = 77, n_in = 96, n_out = 136;
    auto inp = randn(rows * n_in, 1.0), W = randn(n_out * n_in, 0.05), dout = randn(rows * n_out, 1.0);
    auto add = randn(rows * n_out, 1.0);
    round_bf16(inp), round_bf16(W), round_bf16(dout);
    bf16 *d_inp = up_bf16(inp), *d_W = up_bf16(W), *d_dout = up_bf16(dout);

    std::vector<float> want(add);
    ::matmul_forward(want.data(), inp.data(), W.data(), rows, n_in, n_out, true);
    float *d_out = up_f32(add);
    matmul_forward(mc, d_out, CUDA_R_32F, n_out, d_out, d_inp, d_W, rows, n_in, n_out, stream);
    compare("matmul forward, fp32 out + residual", down_f32(d_out, rows * n_out).data(), want.data(), rows * n_out,
            FP32_OUT);

    std::vector<float> want_b((size_t)(rows * n_out));
    ::matmul_forward(want_b.data(), inp.data(), W.data(), rows, n_in, n_out, false);
    bf16 *d_outb = dev_alloc<bf16>(rows * n_out);
    matmul_forward(mc, d_outb, CUDA_R_16BF, n_out, NULL, d_inp, d_W, rows, n_in, n_out, stream);
    compare("matmul forward, bf16 out", down_bf16(d_outb, rows * n_out).data(), want_b.data(), rows * n_out,
            BF16_OUT);

    // dinp, accumulated onto a start value
    auto start = randn(rows * n_in, 1.0);
    std::vector<float> want_di(start);
    ::matmul_backward_input(want_di.data(), dout.data(), W.data(), rows, n_in, n_out, true);
    float *d_di = up_f32(start);
    matmul_backward_input(mc, d_di, CUDA_R_32F, d_dout, n_out, d_W, rows, n_in, n_out, true, stream);
    compare("matmul backward input, fp32 accumulate", down_f32(d_di, rows * n_in).data(), want_di.data(), rows * n_in,
            FP32_OUT);

    // dW += twice (gradient accumulation over two micro-batches)
    auto dw0 = randn(n_out * n_in, 0.1);
    std::vector<float> want_dw(dw0);
    ::matmul_backward_weight(want_dw.data(), dout.data(), inp.data(), rows, n_in, n_out);
    ::matmul_backward_weight(want_dw.data(), dout.data(), inp.data(), rows, n_in, n_out);
    float *d_dw = up_f32(dw0);
    matmul_backward_weight(mc, d_dw, d_dout, n_out, d_inp, rows, n_in, n_out, stream);
    matmul_backward_weight(mc, d_dw, d_dout, n_out, d_inp, rows, n_in, n_out, stream);
    compare("matmul backward weight, fp32 += twice", down_f32(d_dw, n_out * n_in).data(), want_dw.data(),
            n_out * n_in, FP32_OUT);

    int shapes = matmul_cached_shapes(mc);
    matmul_forward(mc, d_out, CUDA_R_32F, n_out, d_out, d_inp, d_W, rows, n_in, n_out, stream);
    char detail[96];
    snprintf(detail, sizeof detail, "%d shapes cached, %d after a repeat", shapes, matmul_cached_shapes(mc));
    expect("matmul algorithm cache reused", matmul_cached_shapes(mc) == shapes, detail);
    cudaFree(d_inp), cudaFree(d_W), cudaFree(d_dout), cudaFree(d_out), cudaFree(d_outb), cudaFree(d_di),
        cudaFree(d_dw);
}

// ---------------------------------------------------------------- embedding

// N ≥ 65 536 rows once: the row count must not sit in a grid dimension limited to 65 535.
static void test_embedding_case(int64_t V, int64_t C, int64_t N) {
    char name[96];
    printf("   embedding V=%lld C=%lld N=%lld\n", (long long)V, (long long)C, (long long)N);
    std::vector<int32_t> tokens((size_t)N);
    for (auto &t : tokens) t = (int32_t)(rng_next(&rng) % 7 == 0 ? 3 : rng_next(&rng) % V);  // token 3 is frequent
    auto E = randn(V * C, 1.0), dout = randn(N * C, 1.0), dE0 = randn(V * C, 0.1);
    int32_t *d_tok = up_i32(tokens);
    float *d_E = up_f32(E), *d_out = dev_alloc<float>(N * C);
    std::vector<float> want((size_t)(N * C));
    embedding_forward(want.data(), tokens.data(), E.data(), N, C);
    embedding_forward(d_out, d_tok, d_E, N, C, stream);
    snprintf(name, sizeof name, "embedding forward (exact copy) N=%lld", (long long)N);
    compare(name, down_f32(d_out, N * C).data(), want.data(), N * C, EXACT);

    std::vector<int32_t> unique((size_t)N), offsets((size_t)N + 1), positions((size_t)N), counts((size_t)V, 0);
    int64_t U = embedding_buckets(unique.data(), offsets.data(), positions.data(), tokens.data(), N, counts.data());
    bool buckets_ok = offsets[(size_t)U] == N;
    for (int64_t u = 0; u < U; u++)
        for (int32_t i = offsets[(size_t)u]; i < offsets[(size_t)u + 1]; i++)
            buckets_ok = buckets_ok && tokens[(size_t)positions[(size_t)i]] == unique[(size_t)u] &&
                         (i == offsets[(size_t)u] || positions[(size_t)i] > positions[(size_t)i - 1]);
    for (int32_t c : counts) buckets_ok = buckets_ok && c == 0;
    expect("embedding buckets (host): groups, order, counts reset", buckets_ok, "");

    std::vector<float> want_dE(dE0);
    embedding_backward(want_dE.data(), tokens.data(), dout.data(), N, C);
    float *d_dE = up_f32(dE0), *d_dout = up_f32(dout);
    int32_t *d_u = up_i32(unique), *d_o = up_i32(offsets), *d_p = up_i32(positions);
    embedding_backward(d_dE, d_dout, d_u, d_o, d_p, U, C, stream);
    auto got1 = down_f32(d_dE, V * C);
    snprintf(name, sizeof name, "embedding backward N=%lld", (long long)N);
    compare(name, got1.data(), want_dE.data(), V * C, FP32_OUT);
    CUDA_CHECK(cudaMemcpy(d_dE, dE0.data(), dE0.size() * sizeof(float), cudaMemcpyHostToDevice));
    embedding_backward(d_dE, d_dout, d_u, d_o, d_p, U, C, stream);
    expect("embedding backward deterministic", same_bits(got1, down_f32(d_dE, V * C)), "two runs, same bits");
    cudaFree(d_tok), cudaFree(d_E), cudaFree(d_out), cudaFree(d_dE), cudaFree(d_dout), cudaFree(d_u), cudaFree(d_o),
        cudaFree(d_p);
}

static void test_embedding(void) {
    test_embedding_case(50, 300, 257);
#if !TRAIN_GPT_EMULATION  // the 70 000 rows: minutes in the emulator
    test_embedding_case(1000, 64, 70000);
#endif
}

// ---------------------------------------------------------------- rmsnorm

// The row kernels (C a multiple of 4 up to 8192: widths below, across and at 1024-column
// loads, chunks of 32 rows cut short by N, more chunks than column_sums_add's 32 threads per
// column) and the fallback (C = 202: one warp per row).
static void test_rmsnorm_case(int64_t N, int64_t C, bool accumulate) {
    const float eps = 1e-6f;
    char name[96], label[48];
    snprintf(label, sizeof label, "N=%lld C=%lld%s", (long long)N, (long long)C, accumulate ? "" : " (write)");
    auto x = randn(N * C, 2.0), g = randn(C, 0.3), dy = randn(N * C, 1.0), d0 = randn(N * C, 1.0),
         dg0 = randn(C, 0.1);
    for (auto &v : g) v += 1.0f;
    std::vector<float> want((size_t)(N * C)), rstd((size_t)N);
    rmsnorm_forward(want.data(), rstd.data(), x.data(), g.data(), N, C, eps);
    float *d_x = up_f32(x), *d_g = up_f32(g), *d_rstd = dev_alloc<float>(N);
    bf16 *d_y = dev_alloc<bf16>(N * C);
    rmsnorm_forward(d_y, d_rstd, d_x, d_g, N, C, eps, stream);
    snprintf(name, sizeof name, "rmsnorm forward (bf16 out) %s", label);
    compare(name, down_bf16(d_y, N * C).data(), want.data(), N * C, BF16_OUT);
    snprintf(name, sizeof name, "rmsnorm forward rstd %s", label);
    compare(name, down_f32(d_rstd, N).data(), rstd.data(), N, FP32_OUT);

    std::vector<float> want_dx(d0), want_dg(dg0);
    rmsnorm_backward(want_dx.data(), want_dg.data(), dy.data(), x.data(), g.data(), rstd.data(), N, C, accumulate);
    float *d_dy = up_f32(dy), *d_dx = up_f32(d0), *d_dg = up_f32(dg0);
    float *scratch = dev_alloc<float>(rmsnorm_gain_scratch_floats(N, C));
    bf16 *d_dxb = dev_alloc<bf16>(N * C);
    CUDA_CHECK(cudaMemcpy(d_rstd, rstd.data(), (size_t)N * sizeof(float), cudaMemcpyHostToDevice));
    rmsnorm_backward(d_dx, d_dxb, d_dg, scratch, d_dy, d_x, d_g, d_rstd, N, C, accumulate, stream);
    snprintf(name, sizeof name, "rmsnorm backward dinp (fp32) %s", label);
    compare(name, down_f32(d_dx, N * C).data(), want_dx.data(), N * C, FP32_OUT);
    snprintf(name, sizeof name, "rmsnorm backward dinp bf16 copy %s", label);
    compare(name, down_bf16(d_dxb, N * C).data(), want_dx.data(), N * C, BF16_OUT);
    snprintf(name, sizeof name, "rmsnorm backward dgain %s", label);
    compare(name, down_f32(d_dg, C).data(), want_dg.data(), C, FP32_OUT);
    // Twice from the same start: the same bits (the gain sums included).
    auto first_dx = down_f32(d_dx, N * C), first_dg = down_f32(d_dg, C);
    CUDA_CHECK(cudaMemcpy(d_dx, d0.data(), d0.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dg, dg0.data(), dg0.size() * sizeof(float), cudaMemcpyHostToDevice));
    rmsnorm_backward(d_dx, nullptr, d_dg, scratch, d_dy, d_x, d_g, d_rstd, N, C, accumulate, stream);
    snprintf(name, sizeof name, "rmsnorm backward deterministic %s", label);
    expect(name, same_bits(first_dx, down_f32(d_dx, N * C)) && same_bits(first_dg, down_f32(d_dg, C)),
           "two runs (the second without the bf16 copy), same bits");
    cudaFree(d_x), cudaFree(d_g), cudaFree(d_rstd), cudaFree(d_y), cudaFree(d_dy), cudaFree(d_dx), cudaFree(d_dg),
        cudaFree(scratch), cudaFree(d_dxb);
}

static void test_rmsnorm(void) {
    test_rmsnorm_case(300, 200, true);
    test_rmsnorm_case(70, 2052, true);
    test_rmsnorm_case(33, 8192, false);
    test_rmsnorm_case(45, 202, true);
    test_rmsnorm_case(1100, 64, true);  // 35 chunks of rows: more than the final sum's 32 threads per column
}

// ---------------------------------------------------------------- QK-norm + RoPE

static void test_qknorm_rope_case(int D, bool norm, bool rope) {
    const int64_t B = 2, T = 45, N = B * T;
    const int Hq = 4, Hkv = 2, H = Hq + Hkv;
    const int64_t in_stride = (int64_t)(Hq + 2 * Hkv) * D, out_stride = (int64_t)H * D;  // like QKV and qk
    const float eps = 1e-6f;
    char name[96];
    auto tokens = doc_tokens(B, T, 100);
    std::vector<int32_t> start((size_t)N), pos((size_t)N);
    document_positions(start.data(), pos.data(), tokens.data(), B, T, true, 0);
    std::vector<float> cos_t((size_t)(T * D / 2)), sin_t((size_t)(T * D / 2));
    rope_tables(cos_t.data(), sin_t.data(), T, D, 10000.0);
    auto in = randn(N * in_stride, 1.5), gq = randn(D, 0.2), gk = randn(D, 0.2), dy = randn(N * out_stride, 1.0);
    for (auto &v : gq) v += 1.0f;
    for (auto &v : gk) v += 1.0f;
    round_bf16(in), round_bf16(dy);

    // CPU: q (N,Hq,D) and k (N,Hkv,D) separately, as cpu/model.c does.
    auto q = columns(in, N, in_stride, 0, (int64_t)Hq * D), k = columns(in, N, in_stride, (int64_t)Hq * D,
                                                                          (int64_t)Hkv * D);
    std::vector<float> qo(q.size()), ko(k.size()), rq((size_t)(N * Hq)), rk((size_t)(N * Hkv));
    if (norm) {
        rmsnorm_forward(qo.data(), rq.data(), q.data(), gq.data(), N * Hq, D, eps);
        rmsnorm_forward(ko.data(), rk.data(), k.data(), gk.data(), N * Hkv, D, eps);
    } else {
        qo = q, ko = k;
    }
    if (rope) {
        rope_forward(qo.data(), pos.data(), cos_t.data(), sin_t.data(), N, Hq, D);
        rope_forward(ko.data(), pos.data(), cos_t.data(), sin_t.data(), N, Hkv, D);
    }
    bf16 *d_in = up_bf16(in), *d_out = dev_alloc<bf16>(N * out_stride);
    float *d_gq = up_f32(gq), *d_gk = up_f32(gk), *d_rstd = dev_alloc<float>(N * H), *d_cos = up_f32(cos_t),
          *d_sin = up_f32(sin_t);
    int32_t *d_pos = up_i32(pos);
    qknorm_rope_args qa;
    memset(&qa, 0, sizeof qa);
    qa.gq = d_gq;
    qa.gk = d_gk;
    qa.pos = d_pos;
    qa.cos_t = d_cos;
    qa.sin_t = d_sin;
    qa.N = N;
    qa.Hq = Hq;
    qa.Hkv = Hkv;
    qa.D = D;
    qa.norm = norm;
    qa.rope = rope;
    qa.eps = eps;
    qknorm_rope_forward(&qa, d_out, out_stride, d_rstd, d_in, in_stride, stream);
    auto got = down_bf16(d_out, N * out_stride);
    snprintf(name, sizeof name, "qknorm_rope forward D=%d norm=%d rope=%d (q)", D, norm, rope);
    compare(name, columns(got, N, out_stride, 0, (int64_t)Hq * D).data(), qo.data(), (int64_t)qo.size(), BF16_OUT);
    snprintf(name, sizeof name, "qknorm_rope forward D=%d norm=%d rope=%d (k)", D, norm, rope);
    compare(name, columns(got, N, out_stride, (int64_t)Hq * D, (int64_t)Hkv * D).data(), ko.data(),
            (int64_t)ko.size(), BF16_OUT);

    // Backward: CPU rope⁻¹ then rmsnorm backward (with the CPU's own rstd).
    auto dq = columns(dy, N, out_stride, 0, (int64_t)Hq * D), dk = columns(dy, N, out_stride, (int64_t)Hq * D,
                                                                            (int64_t)Hkv * D);
    std::vector<float> dgq((size_t)D, 0.0f), dgk((size_t)D, 0.0f);
    if (rope) {
        rope_backward(dq.data(), pos.data(), cos_t.data(), sin_t.data(), N, Hq, D);
        rope_backward(dk.data(), pos.data(), cos_t.data(), sin_t.data(), N, Hkv, D);
    }
    if (norm) {
        rmsnorm_backward(dq.data(), dgq.data(), dq.data(), q.data(), gq.data(), rq.data(), N * Hq, D, false);
        rmsnorm_backward(dk.data(), dgk.data(), dk.data(), k.data(), gk.data(), rk.data(), N * Hkv, D, false);
    }
    // The GPU backward runs in place on a (N, in_stride) gradient buffer, as in the model.
    std::vector<float> dbuf((size_t)(N * in_stride), 0.0f);
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < out_stride; c++) dbuf[(size_t)(r * in_stride + c)] = dy[(size_t)(r * out_stride + c)];
    bf16 *d_d = up_bf16(dbuf);
    float *d_dgq = dev_alloc<float>(D), *d_dgk = dev_alloc<float>(D);
    float *scratch = dev_alloc<float>(qknorm_gain_scratch_floats(N, Hq, D));
    if (norm) {
        qknorm_gain_grad(&qa, 0, Hq, d_dgq, scratch, d_d, in_stride, d_in, in_stride, d_rstd, stream);
        qknorm_gain_grad(&qa, Hq, Hkv, d_dgk, scratch, d_d, in_stride, d_in, in_stride, d_rstd, stream);
    }
    qknorm_rope_backward(&qa, d_d, in_stride, d_d, in_stride, norm ? d_in : NULL, in_stride, norm ? d_rstd : NULL,
                         stream);
    auto gotd = down_bf16(d_d, N * in_stride);
    snprintf(name, sizeof name, "qknorm_rope backward D=%d norm=%d rope=%d (dq)", D, norm, rope);
    compare(name, columns(gotd, N, in_stride, 0, (int64_t)Hq * D).data(), dq.data(), (int64_t)dq.size(), BF16_OUT);
    snprintf(name, sizeof name, "qknorm_rope backward D=%d norm=%d rope=%d (dk)", D, norm, rope);
    compare(name, columns(gotd, N, in_stride, (int64_t)Hq * D, (int64_t)Hkv * D).data(), dk.data(),
            (int64_t)dk.size(), BF16_OUT);
    if (norm) {
        snprintf(name, sizeof name, "qknorm gain grad D=%d rope=%d (q, k)", D, rope);
        std::vector<float> got_g = down_f32(d_dgq, D), got_k = down_f32(d_dgk, D);
        got_g.insert(got_g.end(), got_k.begin(), got_k.end());
        std::vector<float> want_g(dgq);
        want_g.insert(want_g.end(), dgk.begin(), dgk.end());
        compare(name, got_g.data(), want_g.data(), 2 * D, FP32_OUT);
    }
    cudaFree(d_in), cudaFree(d_out), cudaFree(d_gq), cudaFree(d_gk), cudaFree(d_rstd), cudaFree(d_cos),
        cudaFree(d_sin), cudaFree(d_pos), cudaFree(d_d), cudaFree(d_dgq), cudaFree(d_dgk), cudaFree(scratch);
}

static void test_qknorm_rope(void) {
    test_qknorm_rope_case(64, true, true);
    test_qknorm_rope_case(64, true, false);   // NoPE layer
    test_qknorm_rope_case(128, false, true);  // RoPE only (no qk_norm), as done in place in the model
    test_qknorm_rope_case(32, true, true);
}

// ---------------------------------------------------------------- SwiGLU

// F a multiple of 8 (16-byte accesses, and F/8 above one block of threads) and not (one
// element per thread).
static void test_swiglu_case(int64_t N, int64_t F) {
    char name[96];
    auto gu = randn(N * 2 * F, 2.0), dact = randn(N * F, 1.0);
    round_bf16(gu), round_bf16(dact);
    auto gate = columns(gu, N, 2 * F, 0, F), up = columns(gu, N, 2 * F, F, F);
    std::vector<float> want((size_t)(N * F)), want_dg((size_t)(N * F)), want_du((size_t)(N * F));
    swiglu_forward(want.data(), gate.data(), up.data(), N, F);
    swiglu_backward(want_dg.data(), want_du.data(), dact.data(), gate.data(), up.data(), N, F);
    bf16 *d_gu = up_bf16(gu), *d_act = dev_alloc<bf16>(N * F), *d_dact = up_bf16(dact),
         *d_dgu = dev_alloc<bf16>(N * 2 * F);
    swiglu_forward(d_act, d_gu, N, F, stream);
    swiglu_backward(d_dgu, d_dact, d_gu, N, F, stream);
    snprintf(name, sizeof name, "swiglu forward N=%lld F=%lld", (long long)N, (long long)F);
    compare(name, down_bf16(d_act, N * F).data(), want.data(), N * F, BF16_OUT);
    auto got = down_bf16(d_dgu, N * 2 * F);
    snprintf(name, sizeof name, "swiglu backward dgate N=%lld F=%lld", (long long)N, (long long)F);
    compare(name, columns(got, N, 2 * F, 0, F).data(), want_dg.data(), N * F, BF16_OUT);
    snprintf(name, sizeof name, "swiglu backward dup N=%lld F=%lld", (long long)N, (long long)F);
    compare(name, columns(got, N, 2 * F, F, F).data(), want_du.data(), N * F, BF16_OUT);
    cudaFree(d_gu), cudaFree(d_act), cudaFree(d_dact), cudaFree(d_dgu);
}

static void test_swiglu(void) {
    test_swiglu_case(99, 130);
    test_swiglu_case(37, 2056);
}

// ---------------------------------------------------------------- attention

typedef void (*att_fwd_fn)(const attention_inputs *, bf16 *, float *, cudaStream_t);
typedef void (*att_bwd_fn)(const attention_inputs *, const bf16 *, const float *, const bf16 *, const attention_grads *,
                           float *, cudaStream_t);

static void test_attention_case(const char *which, att_fwd_fn fwd, att_bwd_fn bwd, int64_t B, int64_t T, int Hq,
                                int Hkv, int D, bool docs) {
    const int64_t N = B * T, QKV = (int64_t)(Hq + 2 * Hkv) * D, QD = (int64_t)Hq * D, KD = (int64_t)Hkv * D;
    char name[128];
    auto tokens = doc_tokens(B, T, 100);
    std::vector<int32_t> start((size_t)N), pos((size_t)N);
    document_positions(start.data(), pos.data(), tokens.data(), B, T, docs, 0);
    // q, k, v packed as in the model's QKV buffer (row stride QKV): the strided reads are tested too.
    auto qkv = randn(N * QKV, 1.0), dout = randn(N * QD, 1.0);
    round_bf16(qkv), round_bf16(dout);
    auto q = columns(qkv, N, QKV, 0, QD), k = columns(qkv, N, QKV, QD, KD), v = columns(qkv, N, QKV, QD + KD, KD);
    std::vector<float> out((size_t)(N * QD)), lse((size_t)(N * Hq));
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), start.data(), B, T, Hq, Hkv, D);
    bf16 *d_qkv = up_bf16(qkv), *d_out = dev_alloc<bf16>(N * QD), *d_dout = up_bf16(dout),
         *d_dqkv = dev_alloc<bf16>(N * QKV);
    float *d_lse = dev_alloc<float>(N * Hq), *d_delta = dev_alloc<float>(N * Hq);
    int32_t *d_start = up_i32(start);
    attention_inputs in;
    memset(&in, 0, sizeof in);
    in.q = d_qkv;
    in.k = d_qkv + QD;
    in.v = d_qkv + QD + KD;
    in.q_stride = in.k_stride = in.v_stride = QKV;
    in.start = d_start;
    in.B = B;
    in.T = T;
    in.Hq = Hq;
    in.Hkv = Hkv;
    in.D = D;
    attention_grads g;
    g.dq = d_dqkv;
    g.dk = d_dqkv + QD;
    g.dv = d_dqkv + QD + KD;
    g.dq_stride = g.dk_stride = g.dv_stride = QKV;
    fwd(&in, d_out, d_lse, stream);
    auto got_out = down_bf16(d_out, N * QD);
    snprintf(name, sizeof name, "%s fwd B=%lld T=%lld %d/%d D=%d%s", which, (long long)B, (long long)T, Hq, Hkv, D,
             docs ? " docs" : "");
    compare(name, got_out.data(), out.data(), N * QD, ATTENTION);
    snprintf(name, sizeof name, "%s lse D=%d", which, D);
    compare(name, down_f32(d_lse, N * Hq).data(), lse.data(), N * Hq, {1e-3, 1e-4});

    // The CPU backward from the CPU's own out and lse; the GPU's from its own (as in training).
    std::vector<float> dq((size_t)(N * QD)), dk((size_t)(N * KD)), dv((size_t)(N * KD));
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                       v.data(), start.data(), B, T, Hq, Hkv, D);
    bwd(&in, d_out, d_lse, d_dout, &g, d_delta, stream);
    auto got = down_bf16(d_dqkv, N * QKV);
    snprintf(name, sizeof name, "%s bwd dq D=%d%s", which, D, docs ? " docs" : "");
    compare(name, columns(got, N, QKV, 0, QD).data(), dq.data(), N * QD, ATTENTION_BWD);
    snprintf(name, sizeof name, "%s bwd dk D=%d%s", which, D, docs ? " docs" : "");
    compare(name, columns(got, N, QKV, QD, KD).data(), dk.data(), N * KD, ATTENTION_BWD);
    snprintf(name, sizeof name, "%s bwd dv D=%d%s", which, D, docs ? " docs" : "");
    compare(name, columns(got, N, QKV, QD + KD, KD).data(), dv.data(), N * KD, ATTENTION_BWD);

    CUDA_CHECK(cudaMemset(d_dqkv, 0, (size_t)(N * QKV) * sizeof(bf16)));
    bwd(&in, d_out, d_lse, d_dout, &g, d_delta, stream);
    snprintf(name, sizeof name, "%s bwd deterministic D=%d", which, D);
    auto again = down_bf16(d_dqkv, N * QKV);
    expect(name, same_bits(got, again), "two runs, same bits");
    cudaFree(d_qkv), cudaFree(d_out), cudaFree(d_dout), cudaFree(d_dqkv), cudaFree(d_lse), cudaFree(d_delta),
        cudaFree(d_start);
}

static void test_attention(void) {
    // attention_forward is WMMA on NVIDIA, MFMA on AMD and in the emulator at 64-wide
    // wavefronts; in the emulator at 32-wide warps the simple kernels (WMMA is not emulated),
    // which the short cases cover. The fa2 launchers are their own kernels where mma.sync is
    // (NVIDIA, the emulator at 32), else attention_forward again (not tested twice).
    const bool tiled = !TRAIN_GPT_EMULATION || HAVE_MFMA, fa2 = HAVE_MMA_SYNC;
    const int dims_[] = {32, 64, 128};
    for (int i = 0; i < 3; i++) {
        int D = dims_[i];
        if (tiled) test_attention_case("attention", attention_forward, attention_backward, 2, 150, 4, 2, D, true);
        if (!TRAIN_GPT_EMULATION)  // a warp reduction per (query, key): hours in the emulator
            test_attention_case("attention_simple", attention_simple_forward, attention_simple_backward, 2, 150, 4, 2,
                                D, true);
        if (fa2)
            test_attention_case("attention_fa2", attention_fa2_forward, attention_fa2_backward, 2, 150, 4, 2, D, true);
        if (TRAIN_GPT_EMULATION)  // the simple kernels at every head_dim, on a short sequence
            test_attention_case("attention_simple", attention_simple_forward, attention_simple_backward, 1, 24, 4, 2,
                                D, true);
    }
    if (tiled) {
        test_attention_case("attention", attention_forward, attention_backward, 1, 256, 8, 2, 64, false);  // causal
        test_attention_case("attention", attention_forward, attention_backward, 3, 64, 2, 2, 128, true);   // MHA
    }
    if (fa2) {
        test_attention_case("attention_fa2", attention_fa2_forward, attention_fa2_backward, 1, 256, 8, 2, 64, false);
        test_attention_case("attention_fa2", attention_fa2_forward, attention_fa2_backward, 3, 64, 2, 2, 128, true);
    }
    test_attention_case("attention_simple", attention_simple_forward, attention_simple_backward, 2, 40, 4, 1, 16,
                        true);  // a head_dim only the simple kernels take
    // Long sequences: many tiles, the double buffers cycled, whole key tiles skipped by documents
    // (left out under the sanitizers, TRAIN_GPT_TEST_QUICK=1, and in the emulator: minutes there).
    if (getenv("TRAIN_GPT_TEST_QUICK") || TRAIN_GPT_EMULATION) return;
    if (fa2) {
        test_attention_case("attention_fa2", attention_fa2_forward, attention_fa2_backward, 1, 1100, 4, 1, 128, false);
        test_attention_case("attention_fa2", attention_fa2_forward, attention_fa2_backward, 2, 1000, 4, 2, 64, true);
    }
    if (HAVE_MFMA) {
        test_attention_case("attention", attention_forward, attention_backward, 1, 1100, 4, 1, 128, false);
        test_attention_case("attention", attention_forward, attention_backward, 2, 1000, 4, 2, 64, true);
    }
}

// ---------------------------------------------------------------- classifier

// The classifier's bf16 logits, turned into their gradient in place, at a row stride ld ≥ V:
// padded to a multiple of 8 (16-byte accesses, with a scalar tail when V is not one) or odd
// (the scalar loop only); the padding columns stay as they were. The reference runs on the
// same bf16-rounded logits, so only fp32 rounding separates the loss terms. z: the z-loss
// weight; at a trainer's 1e-4 its term 2·z·lse·softmax is ~2e-3 of softmax's (lse ≈ 11 for
// these logits), under the bf16 tolerance, so one case runs at 0.05, where it is as large.
static void test_classifier_case(int64_t V, int64_t ld, float z) {
    const int64_t n = 37;
    const float scale = 1.0f / 512.0f;
    auto logits = randn(n * V, 3.0);
    round_bf16(logits);
    std::vector<int32_t> targets((size_t)n);
    for (auto &t : targets) t = (int32_t)(rng_next(&rng) % V);
    targets[0] = (int32_t)(V - 1);  // the last column: the scalar tail of the 16-byte loop
    std::vector<float> want(logits), want_ce((size_t)n), want_lse((size_t)n);
    double ce_sum = 0, sq_sum = 0;
    for (int64_t r = 0; r < n; r++) {
        double ce = 0, sq = 0;
        cross_entropy_forward_backward(want.data() + r * V, targets.data() + r, 1, V, z, scale, &ce, &sq);
        want_ce[(size_t)r] = (float)ce;
        want_lse[(size_t)r] = (float)sqrt(sq);
        ce_sum += ce;
        sq_sum += sq;
    }
    std::vector<float> padded((size_t)(n * ld), 7.0f);  // the padding: 7, which must stay
    for (int64_t r = 0; r < n; r++) memcpy(&padded[(size_t)(r * ld)], &logits[(size_t)(r * V)], (size_t)V * sizeof(float));
    bf16 *d_logits = up_bf16(padded);
    float *d_ce = dev_alloc<float>(n), *d_lse = dev_alloc<float>(n);
    int32_t *d_t = up_i32(targets);
    double *d_sums = dev_alloc<double>(2);
    char what[96];
    // Loss only: the logits stay as they were.
    cross_entropy_forward_backward(d_logits, d_ce, d_lse, d_t, n, V, ld, z, scale, false, stream);
    auto kept = down_bf16(d_logits, n * ld);
    snprintf(what, sizeof what, "cross-entropy, loss only (V %lld, ld %lld): logits unchanged", (long long)V,
             (long long)ld);
    compare(what, columns(kept, n, ld, 0, V).data(), logits.data(), n * V, EXACT);
    snprintf(what, sizeof what, "cross-entropy per row (V %lld, ld %lld)", (long long)V, (long long)ld);
    compare(what, down_f32(d_ce, n).data(), want_ce.data(), n, FP32_OUT);
    // Training: the gradient in place.
    cross_entropy_forward_backward(d_logits, d_ce, d_lse, d_t, n, V, ld, z, scale, true, stream);
    loss_sums_accumulate(d_sums, d_ce, d_lse, n, stream);
    snprintf(what, sizeof what, "cross-entropy per row, training (V %lld, ld %lld)", (long long)V, (long long)ld);
    compare(what, down_f32(d_ce, n).data(), want_ce.data(), n, FP32_OUT);
    compare("logsumexp per row", down_f32(d_lse, n).data(), want_lse.data(), n, FP32_OUT);
    auto got = down_bf16(d_logits, n * ld);
    snprintf(what, sizeof what, "dlogits in place of the logits (softmax, z-loss %g, bf16; V %lld)", (double)z,
             (long long)V);
    compare(what, columns(got, n, ld, 0, V).data(), want.data(), n * V, BF16_OUT);
    if (ld > V) {
        std::vector<float> sevens((size_t)(n * (ld - V)), 7.0f);
        compare("  the padding columns untouched", columns(got, n, ld, V, ld - V).data(), sevens.data(), n * (ld - V),
                EXACT);
    }
    double sums[2];
    CUDA_CHECK(cudaMemcpy(sums, d_sums, sizeof sums, cudaMemcpyDeviceToHost));
    float got_sums[2] = {(float)sums[0], (float)sums[1]}, want_sums[2] = {(float)ce_sum, (float)sq_sum};
    compare("loss sums (Σ ce, Σ lse²)", got_sums, want_sums, 2, FP32_OUT);
    cudaFree(d_logits), cudaFree(d_ce), cudaFree(d_lse), cudaFree(d_t), cudaFree(d_sums);
}

static void test_classifier(void) {
    test_classifier_case(1000, 1024, 1e-4f);  // 16-byte accesses only
    test_classifier_case(1003, 1024, 1e-4f);  // 16-byte accesses and a scalar tail of 3
    test_classifier_case(1003, 1003, 1e-4f);  // the scalar loop only
    test_classifier_case(1000, 1024, 0.05f);  // a z-loss weight whose gradient term the tolerance sees
}

// ---------------------------------------------------------------- norm, clip, AdamW

static void test_optimizer_case(double grad_clip, bool poison) {
    model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.vocab_size = 300, mc.n_layer = 2, mc.d_model = 64, mc.n_head = 4, mc.n_kv_head = 2, mc.head_dim = 16;
    mc.d_ff = 96, mc.seq_len = 16, mc.nope_every = 4, mc.qk_norm = true, mc.tie_embeddings = false;
    mc.norm_eps = 1e-6, mc.init_std = 0.02, mc.rope_theta = 10000;
    param_table t;
    param_table_build(&t, &mc);
    int64_t n = t.numel;
    train_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.beta1 = 0.9, cfg.beta2 = 0.95, cfg.adam_eps = 1e-8, cfg.weight_decay = 0.1, cfg.grad_clip = grad_clip;
    const double lr = 1e-3;
    const int64_t adam_step0 = 4;  // as after a resume: bias corrections at t = 5
    auto p = randn(n, 0.05), g = randn(n, 1e-3), m = randn(n, 1e-4), v = randn(n, 1e-6);
    for (auto &x : v) x = fabsf(x);
    if (poison) g[12345 % n] = NAN;

    float *d_p = up_f32(p), *d_g = up_f32(g), *d_m = up_f32(m), *d_v = up_f32(v);
    bf16 *d_pb = dev_alloc<bf16>(n);
    double *d_partials = dev_alloc<double>(GRAD_NORM_BLOCKS);
    step_scalars st0;
    memset(&st0, 0, sizeof st0);
    st0.ce_sum = 2.5 * 64, st0.lse_sq_sum = 9.0 * 64, st0.adam_step = adam_step0;
    step_scalars *d_st = dev_alloc<step_scalars>(1);
    CUDA_CHECK(cudaMemcpy(d_st, &st0, sizeof st0, cudaMemcpyHostToDevice));
    std::vector<adamw_chunk> chunks;
    for (int i = 0; i < t.count; i++)
        for (int64_t s = 0; s < t.params[i].numel; s += ADAMW_CHUNK_ELEMS)
            chunks.push_back({t.params[i].offset + s, (int32_t)min_i64(ADAMW_CHUNK_ELEMS, t.params[i].numel - s),
                              t.params[i].decay ? 1 : 0});
    adamw_chunk *d_chunks = dev_alloc<adamw_chunk>((int64_t)chunks.size());
    CUDA_CHECK(cudaMemcpy(d_chunks, chunks.data(), chunks.size() * sizeof(adamw_chunk), cudaMemcpyHostToDevice));

    grad_norm_partials(d_partials, d_g, n, stream);
    step_prepare(d_st, d_partials, 64.0, 1e-4, grad_clip, lr, cfg.beta1, cfg.beta2, INFINITY, INFINITY, stream);
    adamw_hparams hp = {(float)(1.0 - lr * cfg.weight_decay), (float)cfg.beta1, (float)cfg.beta2,
                        (float)(1.0 - cfg.beta1), (float)(1.0 - cfg.beta2), (float)cfg.adam_eps};
    adamw_update(d_p, d_pb, d_g, d_m, d_v, d_chunks, (int64_t)chunks.size(), d_st, hp, stream);
    step_scalars st;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(&st, d_st, sizeof st, cudaMemcpyDeviceToHost));

    char tag[64], name[128], detail[160];
    snprintf(tag, sizeof tag, "clip %g%s", grad_clip, poison ? ", NaN gradient" : "");
    double norm = grad_global_norm(g.data(), n);
    auto zeros = down_f32(d_g, n);
    bool zeroed = true;
    for (float x : zeros) zeroed = zeroed && x == 0.0f;
    snprintf(name, sizeof name, "adamw zeroes the gradients (%s)", tag);
    expect(name, zeroed, "");
    if (poison) {
        snprintf(detail, sizeof detail, "skipped %d, adam_step %lld (was %lld), norm %g", st.skipped,
                 (long long)st.adam_step, (long long)adam_step0, st.grad_norm);
        expect("outlier guard skips a NaN step", st.skipped == 1 && st.adam_step == adam_step0, detail);
        compare("a skipped step leaves the weights alone", down_f32(d_p, n).data(), p.data(), n, EXACT);
    } else {
        snprintf(detail, sizeof detail, "gpu %.17g cpu %.17g", st.grad_norm, norm);
        snprintf(name, sizeof name, "grad norm (%s)", tag);
        expect(name, fabs(st.grad_norm - norm) <= 1e-9 * norm, detail);
        int64_t adam_step = adam_step0;
        optimizer_apply(&t, p.data(), g.data(), m.data(), v.data(), &adam_step, norm, lr, &cfg);
        snprintf(detail, sizeof detail, "gpu t=%lld clip %.6g, cpu t=%lld", (long long)st.adam_step, st.clip_coef,
                 (long long)adam_step);
        snprintf(name, sizeof name, "adam step count (%s)", tag);
        expect(name, st.adam_step == adam_step && st.skipped == 0, detail);
        snprintf(name, sizeof name, "adamw params (%s)", tag);
        compare(name, down_f32(d_p, n).data(), p.data(), n, ADAMW);
        snprintf(name, sizeof name, "adamw exp_avg (%s)", tag);
        compare(name, down_f32(d_m, n).data(), m.data(), n, ADAMW);
        snprintf(name, sizeof name, "adamw exp_avg_sq (%s)", tag);
        compare(name, down_f32(d_v, n).data(), v.data(), n, ADAMW);
        snprintf(name, sizeof name, "adamw bf16 copy (%s)", tag);
        compare(name, down_bf16(d_pb, n).data(), p.data(), n, BF16_OUT);
    }
    // The norm twice: the same bits.
    CUDA_CHECK(cudaMemcpy(d_g, g.data(), (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<double> a(GRAD_NORM_BLOCKS), b(GRAD_NORM_BLOCKS);
    grad_norm_partials(d_partials, d_g, n, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(a.data(), d_partials, a.size() * sizeof(double), cudaMemcpyDeviceToHost));
    grad_norm_partials(d_partials, d_g, n, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(b.data(), d_partials, b.size() * sizeof(double), cudaMemcpyDeviceToHost));
    if (!poison) expect("grad norm deterministic", memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0, "");
    cudaFree(d_p), cudaFree(d_g), cudaFree(d_m), cudaFree(d_v), cudaFree(d_pb), cudaFree(d_partials), cudaFree(d_st),
        cudaFree(d_chunks);
    param_table_free(&t);
}

static void test_optimizer(void) {
    test_optimizer_case(1.0, false);    // norm ≈ 0.06: no clipping
    test_optimizer_case(0.01, false);   // clipped
    test_optimizer_case(1.0, true);     // skipped
}

int main(void) {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("test_gpu_kernels on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    rng_seed(&rng, 1234, 1);
    CUDA_CHECK(cudaStreamCreate(&stream));
#if !TRAIN_GPT_EMULATION  // cuBLASLt
    matmul_context *mc = matmul_create();
    test_matmul(mc);
#endif
    test_embedding();
    test_rmsnorm();
    test_qknorm_rope();
    test_swiglu();
    test_attention();
    test_classifier();
    test_optimizer();
#if !TRAIN_GPT_EMULATION
    matmul_destroy(mc);
#endif
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("test_gpu_kernels: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
