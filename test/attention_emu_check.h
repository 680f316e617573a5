// test/attention_emu_check.h — what the emulated tests of the tiled attention kernels share
// (test/test_attention_fa2_emu.cc: NVIDIA's mma.sync kernels on 32-wide warps;
// test/test_attention_mfma_emu.cc: AMD's MFMA kernels on 64-wide wavefronts): inputs, the CPU
// reference of cpu/ops.c, the comparison and its tolerances, and one case run through a kernel
// set K (K::forward<D>, K::dq<D>, K::dkv<D> launched on the emulator, with K::BM, K::BN and
// K::THREADS), forward (out, lse) and backward (dq, dk, dv), q/k/v read from a packed QKV
// buffer (the model's strided layout). Included after test/warp_emu.h.
//
// Tolerances are those of test/test_gpu_kernels.cu for the GPU kernels: inputs are bf16, the
// probabilities are rounded to bf16 before P·V (as on the GPU), outputs are bf16 (relative
// rounding 2⁻⁸): 2 % of the largest magnitude and 1 % in L2 for the forward, 5 % and 2 % for
// the backward, which subtracts nearly equal terms (dP − δ); lse, kept in fp32, to 1e-3 / 1e-4.
// Where the exact result is zero (a query alone in its document: P = 1, so dS = dP − δ = 0 and
// dq = dk = 0) the kernels and the reference both return fp32 rounding noise, which a relative
// error compares with itself: an output passes too when no element is off by more than
// ABS_FLOOR = 1e-5, 4× the noise measured on those shapes (max_abs ≤ 2.2e-6) and less than the
// bf16 rounding (2⁻⁹ relative) of any element over 0.005, so a wrong element of a real
// gradient still fails.
#ifndef TRAIN_GPT_TEST_ATTENTION_EMU_CHECK_H
#define TRAIN_GPT_TEST_ATTENTION_EMU_CHECK_H

#include "cuda/attention_args.h"
#include "cpu/ops.h"
#include "llmc/rng.h"

#include <vector>

static rng_state rng;
static int checks, failures;

struct tolerance {
    double max_rel, l2_rel;
};
// As test_gpu_kernels.cu's emulated ATTENTION and ATTENTION_BWD (measured there and here: forward
// max_rel ≤ 2.9e-3, L2 ≤ 1.9e-3; backward ≤ 5.5e-3, ≤ 4.3e-3; about 2.5× over them).
static const tolerance FORWARD = {8e-3, 5e-3}, BACKWARD = {1.2e-2, 8e-3}, LSE = {1e-3, 1e-4};
static const double ABS_FLOOR = 1e-5;

static void compare(const char *name, const std::vector<float> &got, const std::vector<float> &want, tolerance tol) {
    double max_abs = 0.0, max_want = 0.0, err2 = 0.0, want2 = 0.0;
    bool finite = got.size() == want.size();
    for (size_t i = 0; i < got.size() && i < want.size(); i++) {
        if (!isfinite(got[i])) finite = false;
        double e = fabs((double)got[i] - (double)want[i]);
        max_abs = fmax(max_abs, e);
        max_want = fmax(max_want, fabs((double)want[i]));
        err2 += e * e;
        want2 += (double)want[i] * want[i];
    }
    double rel = max_want > 0 ? max_abs / max_want : max_abs, l2 = want2 > 0 ? sqrt(err2 / want2) : sqrt(err2);
    bool within = rel <= tol.max_rel && l2 <= tol.l2_rel, ok = finite && (within || max_abs <= ABS_FLOOR);
    checks++;
    failures += !ok;
    printf("%s %-46s max_rel %.3e (tol %.0e)  l2_rel %.3e (tol %.0e)", ok ? "PASS" : "FAIL", name, rel, tol.max_rel,
           l2, tol.l2_rel);
    if (!within) printf("  max_abs %.1e (floor %.0e)", max_abs, ABS_FLOOR);
    printf("%s\n", finite ? "" : "  NON-FINITE OR MISSING");
}

static float bf16_round(float x) { return emu::bf16_value(emu::bf16_bits(x)); }

// Columns [offset, offset + width) of an (n, stride) matrix.
static std::vector<float> columns(const std::vector<float> &x, int64_t n, int64_t stride, int64_t offset,
                                  int64_t width) {
    std::vector<float> out((size_t)(n * width));
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < width; c++) out[(size_t)(r * width + c)] = x[(size_t)(r * stride + offset + c)];
    return out;
}
static std::vector<uint16_t> to_bits(const std::vector<float> &x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); i++) b[i] = emu::bf16_bits(x[i]);
    return b;
}
static std::vector<float> from_bits(const std::vector<uint16_t> &b) {
    std::vector<float> x(b.size());
    for (size_t i = 0; i < b.size(); i++) x[i] = emu::bf16_value(b[i]);
    return x;
}

// Tokens with a document token (0) every doc_min..doc_max positions (none if doc_max is 0;
// every position from the first if doc_max is 1: each token its own document).
static std::vector<int32_t> doc_tokens(int64_t B, int64_t T, int doc_min, int doc_max) {
    std::vector<int32_t> t((size_t)(B * T));
    for (int64_t b = 0; b < B; b++) {
        int64_t next_doc = doc_max == 1 ? 0 : doc_max ? 5 + (int64_t)(rng_next(&rng) % 20) : T;
        for (int64_t i = 0; i < T; i++) {
            int32_t v = 1 + (int32_t)(rng_next(&rng) % 99);
            if (i == next_doc) {
                v = 0;
                next_doc += doc_min + (int64_t)(rng_next(&rng) % (uint64_t)(doc_max - doc_min + 1));
            }
            t[(size_t)(b * T + i)] = v;
        }
    }
    return t;
}

// ---------------------------------------------------------------- one case through kernel set K

template <typename K, int D>
static void run_case(int64_t B, int64_t T, int Hq, int Hkv, int doc_min, int doc_max) {
    const int64_t N = B * T, QKV = (int64_t)(Hq + 2 * Hkv) * D, QD = (int64_t)Hq * D, KD = (int64_t)Hkv * D;
    char label[96], name[160];
    snprintf(label, sizeof label, "B=%lld T=%lld %d/%d D=%d %s", (long long)B, (long long)T, Hq, Hkv, D,
             doc_max == 1 ? "1-token docs" : doc_max ? "docs" : "causal");

    auto tokens = doc_tokens(B, T, doc_min, doc_max);
    std::vector<int32_t> start((size_t)N), pos((size_t)N);
    document_positions(start.data(), pos.data(), tokens.data(), B, T, doc_max > 0, 0);
    std::vector<float> qkv((size_t)(N * QKV)), dout((size_t)(N * QD));
    for (auto &x : qkv) x = bf16_round((float)rng_normal(&rng));
    for (auto &x : dout) x = bf16_round((float)rng_normal(&rng));
    auto q = columns(qkv, N, QKV, 0, QD), k = columns(qkv, N, QKV, QD, KD), v = columns(qkv, N, QKV, QD + KD, KD);

    std::vector<float> want_out((size_t)(N * QD)), want_lse((size_t)(N * Hq));
    attention_forward(want_out.data(), want_lse.data(), q.data(), k.data(), v.data(), start.data(), B, T, Hq, Hkv, D);
    std::vector<float> want_dq((size_t)(N * QD)), want_dk((size_t)(N * KD)), want_dv((size_t)(N * KD));
    attention_backward(want_dq.data(), want_dk.data(), want_dv.data(), dout.data(), want_out.data(), want_lse.data(),
                       q.data(), k.data(), v.data(), start.data(), B, T, Hq, Hkv, D);

    // The kernels' side: bf16 bits, q/k/v in one packed buffer; outputs poisoned (0xFFFF is a
    // NaN) so that an element a kernel forgets to write fails the comparison.
    std::vector<uint16_t> qkv_bits = to_bits(qkv), dout_bits = to_bits(dout);
    std::vector<uint16_t> out_bits((size_t)(N * QD), 0xFFFF), dqkv_bits((size_t)(N * QKV), 0xFFFF);
    std::vector<float> lse((size_t)(N * Hq), NAN), delta((size_t)(N * Hq));
    attention_args_of<uint16_t> a;
    memset(&a, 0, sizeof a);
    a.q = qkv_bits.data();
    a.k = qkv_bits.data() + QD;
    a.v = qkv_bits.data() + QD + KD;
    a.q_stride = a.k_stride = a.v_stride = QKV;
    a.out = out_bits.data();
    a.lse = lse.data();
    a.start = start.data();
    a.B = B;
    a.T = T;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.scale = 1.0f / sqrtf((float)D);
    a.scale_log2 = a.scale * 1.4426950408889634f;
    unsigned tiles = (unsigned)((T + K::BM - 1) / K::BM), key_tiles = (unsigned)((T + K::BN - 1) / K::BN);
    emu::launch({tiles, (unsigned)Hq, (unsigned)B}, K::THREADS, K::template forward_smem<D>(),
                [&] { K::template forward<D>(a); });
    auto out = from_bits(out_bits);
    snprintf(name, sizeof name, "fwd out %s", label);
    compare(name, out, want_out, FORWARD);
    snprintf(name, sizeof name, "fwd lse %s", label);
    compare(name, lse, want_lse, LSE);

    // δ = rowsum(dO ⊙ O) from the kernel's own bf16 out, as cuda/attention.cu's delta kernel.
    for (int64_t r = 0; r < N; r++)
        for (int j = 0; j < Hq; j++) {
            float s = 0.0f;
            for (int d = 0; d < D; d++) s += dout[(size_t)((r * Hq + j) * D + d)] * out[(size_t)((r * Hq + j) * D + d)];
            int64_t b = r / T, t = r % T;
            delta[(size_t)((b * Hq + j) * T + t)] = s;
        }
    a.dout = dout_bits.data();
    a.delta = delta.data();
    a.dq = dqkv_bits.data();
    a.dk = dqkv_bits.data() + QD;
    a.dv = dqkv_bits.data() + QD + KD;
    a.dq_stride = a.dk_stride = a.dv_stride = QKV;
    emu::launch({tiles, (unsigned)Hq, (unsigned)B}, K::THREADS, K::template dq_smem<D>(), [&] { K::template dq<D>(a); });
    emu::launch({key_tiles, (unsigned)Hkv, (unsigned)B}, K::THREADS, K::template dkv_smem<D>(),
                [&] { K::template dkv<D>(a); });
    auto got = from_bits(dqkv_bits);
    snprintf(name, sizeof name, "bwd dq %s", label);
    compare(name, columns(got, N, QKV, 0, QD), want_dq, BACKWARD);
    snprintf(name, sizeof name, "bwd dk %s", label);
    compare(name, columns(got, N, QKV, QD, KD), want_dk, BACKWARD);
    snprintf(name, sizeof name, "bwd dv %s", label);
    compare(name, columns(got, N, QKV, QD + KD, KD), want_dv, BACKWARD);
}

#endif
