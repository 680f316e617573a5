// test/test_attention_fa2_emu.cc — the register-resident attention kernels of
// cuda/attention_fa2.cuh, run on the CPU by test/warp_emu.h (a block's threads as lanes, the
// tensor-core instructions as the PTX ISA describes them), against the CPU reference of
// cpu/ops.c: forward (out, lse) and backward (dq, dk, dv), GQA, document masking and plain
// causal, head_dim 32, 64 and 128, sequence lengths that are not a multiple of the tiles,
// q/k/v read from a packed QKV buffer (the model's strided layout). What this shows: the
// kernels' index arithmetic, fragment bookkeeping, masking, tile skipping and double
// buffering are right if the instructions behave as documented. What it cannot show: that
// they do on a GPU, or how fast they are (make test-gpu, bench/gpu).
//
// Tolerances are those of test/test_gpu_kernels.cu for the GPU kernels: inputs are bf16, the
// probabilities are rounded to bf16 before P·V (as on the GPU), outputs are bf16 (relative
// rounding 2⁻⁸): 2 % of the largest magnitude and 1 % in L2 for the forward, 5 % and 2 % for
// the backward, which subtracts nearly equal terms (dP − δ); lse, kept in fp32, to 1e-3 / 1e-4.
#include "test/warp_emu.h"

#include "cuda/attention_fa2.cuh"

#include "cpu/ops.h"
#include "llmc/rng.h"

#include <vector>

static rng_state rng;
static int checks, failures;

struct tolerance {
    double max_rel, l2_rel;
};
static const tolerance FORWARD = {2e-2, 1e-2}, BACKWARD = {5e-2, 2e-2}, LSE = {1e-3, 1e-4};

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
    bool ok = finite && rel <= tol.max_rel && l2 <= tol.l2_rel;
    checks++;
    failures += !ok;
    printf("%s %-46s max_rel %.3e (tol %.0e)  l2_rel %.3e (tol %.0e)%s\n", ok ? "PASS" : "FAIL", name, rel,
           tol.max_rel, l2, tol.l2_rel, finite ? "" : "  NON-FINITE OR MISSING");
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

// Tokens with a document token (0) every doc_min..doc_max positions (none if doc_max is 0).
static std::vector<int32_t> doc_tokens(int64_t B, int64_t T, int doc_min, int doc_max) {
    std::vector<int32_t> t((size_t)(B * T));
    for (int64_t b = 0; b < B; b++) {
        int64_t next_doc = doc_max ? 5 + (int64_t)(rng_next(&rng) % 20) : T;
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

// ---------------------------------------------------------------- the instructions themselves

// The fragments as the PTX ISA tabulates them for mma.m16n8k16 with 16-bit A/B (g = lane/4,
// t = lane%4), element by element: A's a_i at row g (i = 0, 1, 4, 5) or g + 8, column
// 2t + (i & 1) (+ 8 for i ≥ 4); B's b_i at row 2t + (i & 1) (+ 8 for i ≥ 2), column g; C's c_i
// at row g (+ 8 for i ≥ 2), column 2t + (i & 1). Register r holds elements 2r (low half) and
// 2r + 1. Written from the table, not from the emulator's inverse mapping, so that the two
// readings check each other.
static void doc_a(uint32_t (&a)[4], const float *A, int lda, int lane) {
    int g = lane / 4, t = lane % 4;
    uint16_t e[8];
    for (int i = 0; i < 8; i++) {
        int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
        e[i] = emu::bf16_bits(A[row * lda + col]);
    }
    for (int r = 0; r < 4; r++) a[r] = (uint32_t)e[2 * r] | (uint32_t)e[2 * r + 1] << 16;
}
static void doc_b(uint32_t (&b)[2], const float *Bm, int ldb, int lane) {  // Bm is K × N (16 × 8)
    int g = lane / 4, t = lane % 4;
    uint16_t e[4];
    for (int i = 0; i < 4; i++) e[i] = emu::bf16_bits(Bm[(2 * t + (i & 1) + (i >= 2 ? 8 : 0)) * ldb + g]);
    for (int r = 0; r < 2; r++) b[r] = (uint32_t)e[2 * r] | (uint32_t)e[2 * r + 1] << 16;
}
static void check_instructions() {
    constexpr int D = 64, S = fa2::dims<D>::S;
    std::vector<float> A(16 * 16), Bm(16 * 16), X(16 * 16);  // Bm: 16 (k) × 16 (n): two 8-column blocks
    for (auto &x : A) x = bf16_round((float)rng_normal(&rng));
    for (auto &x : Bm) x = bf16_round((float)rng_normal(&rng));
    for (auto &x : X) x = bf16_round((float)rng_normal(&rng));
    int bad_mma = 0, bad_a = 0, bad_rows = 0, bad_cols = 0;
    emu::launch({1, 1, 1}, 32, 3 * 16 * S * 2, [&] {
        int lane = (int)threadIdx.x;
        uint16_t *tile_a = reinterpret_cast<uint16_t *>(emu::the_block().smem.data()), *tile_x = tile_a + 16 * S,
                 *tile_b = tile_x + 16 * S;
        for (int i = lane; i < 256; i += 32) {
            tile_a[i / 16 * S + i % 16] = emu::bf16_bits(A[i]);
            tile_x[i / 16 * S + i % 16] = emu::bf16_bits(X[i]);
            tile_b[i / 16 * S + i % 16] = emu::bf16_bits(Bm[i]);
        }
        block_barrier();
        // mma on the table's fragments: C = A · B for both 8-column blocks of Bm.
        uint32_t a[4];
        doc_a(a, A.data(), 16, lane);
        for (int nb = 0; nb < 2; nb++) {
            uint32_t b[2];
            doc_b(b, Bm.data() + nb * 8, 16, lane);
            float c[4] = {0, 0, 0, 0};
            mma_16816(c, a, b[0], b[1]);
            int g = lane / 4, t = lane % 4;
            for (int i = 0; i < 4; i++) {
                int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
                double want = 0.0;
                for (int k = 0; k < 16; k++) want += (double)A[row * 16 + k] * Bm[k * 16 + nb * 8 + col];
                bad_mma += fabs(c[i] - want) > 1e-4 * (1.0 + fabs(want));
            }
        }
        // The kernels' ldmatrix address patterns give the table's fragments: load_a = A's;
        // load_b_rows of X = B fragments of Xᵀ (B[k][n] = X[n][k]); load_b_cols of X = B of X.
        uint32_t la[4], lr[4], lc[4];
        fa2::load_a<D>(la, tile_a, 0, 0);
        for (int r = 0; r < 4; r++) bad_a += la[r] != a[r];
        fa2::load_b_rows<D>(lr, tile_x, 0, 0);
        fa2::load_b_cols<D>(lc, tile_x, 0, 0);
        std::vector<float> Xt(256);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) Xt[j * 16 + i] = X[i * 16 + j];
        for (int nb = 0; nb < 2; nb++) {
            uint32_t want_r[2], want_c[2];
            doc_b(want_r, Xt.data() + nb * 8, 16, lane);
            doc_b(want_c, X.data() + nb * 8, 16, lane);
            for (int r = 0; r < 2; r++) bad_rows += lr[2 * nb + r] != want_r[r], bad_cols += lc[2 * nb + r] != want_c[r];
        }
    });
    struct {
        const char *name;
        int bad;
    } rows[] = {{"mma m16n8k16 on the PTX table's fragments", bad_mma},
                {"load_a (ldmatrix) = the table's A fragment", bad_a},
                {"load_b_rows (ldmatrix) = B fragments of Xt", bad_rows},
                {"load_b_cols (ldmatrix.trans) = B of X", bad_cols}};
    for (auto &r : rows) {
        checks++;
        failures += r.bad != 0;
        printf("%s %-46s %d wrong elements\n", r.bad ? "FAIL" : "PASS", r.name, r.bad);
    }
}

// ---------------------------------------------------------------- the kernels

template <int D> static void run_case(int64_t B, int64_t T, int Hq, int Hkv, int doc_min, int doc_max) {
    const int64_t N = B * T, QKV = (int64_t)(Hq + 2 * Hkv) * D, QD = (int64_t)Hq * D, KD = (int64_t)Hkv * D;
    char label[96], name[160];
    snprintf(label, sizeof label, "B=%lld T=%lld %d/%d D=%d %s", (long long)B, (long long)T, Hq, Hkv, D,
             doc_max ? "docs" : "causal");

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
    fa2::args a;
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
    a.scale_log2 = a.scale * fa2::LOG2E;
    unsigned tiles = (unsigned)((T + fa2::BM - 1) / fa2::BM);
    emu::launch({tiles, (unsigned)Hq, (unsigned)B}, fa2::THREADS, fa2::forward_smem_bytes<D>(),
                [&] { fa2::forward_kernel<D>(a); });
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
    emu::launch({tiles, (unsigned)Hq, (unsigned)B}, fa2::THREADS, fa2::dq_smem_bytes<D>(),
                [&] { fa2::dq_kernel<D>(a); });
    emu::launch({tiles, (unsigned)Hkv, (unsigned)B}, fa2::THREADS, fa2::dkv_smem_bytes<D>(),
                [&] { fa2::dkv_kernel<D>(a); });
    auto got = from_bits(dqkv_bits);
    snprintf(name, sizeof name, "bwd dq %s", label);
    compare(name, columns(got, N, QKV, 0, QD), want_dq, BACKWARD);
    snprintf(name, sizeof name, "bwd dk %s", label);
    compare(name, columns(got, N, QKV, QD, KD), want_dk, BACKWARD);
    snprintf(name, sizeof name, "bwd dv %s", label);
    compare(name, columns(got, N, QKV, QD + KD, KD), want_dv, BACKWARD);
}

int main(void) {
    rng_seed(&rng, 20261129, 0);
    check_instructions();
    run_case<64>(2, 150, 4, 2, 20, 60);   // GQA, short documents, a partial last tile
    run_case<128>(1, 200, 2, 1, 60, 130); // head_dim 128 (the dk/dv kernel's 32-query steps), long documents
    run_case<32>(1, 130, 2, 2, 0, 0);     // plain causal, MHA
    run_case<64>(1, 256, 2, 1, 0, 0);     // whole tiles: the unmasked path off the diagonal
    run_case<64>(1, 320, 1, 1, 90, 140);  // key tiles skipped before a document, query tiles after it
    run_case<64>(2, 2, 2, 1, 0, 0);       // two positions (at one alone dq = dk = 0 exactly: dS = dP − δ = 0,
                                          // and a relative error would compare rounding noise with itself)
    run_case<128>(1, 63, 8, 1, 0, 0);     // one partial tile; a GQA group of 8 (MQA)
    run_case<32>(1, 64, 2, 1, 0, 0);      // exactly one tile
    run_case<64>(1, 65, 2, 2, 0, 0);      // one row into the second tile
    printf("%s: %d checks, %d failed\n", failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}
