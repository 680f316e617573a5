// test/test_attention_fa2_emu.cc — the register-resident attention kernels of
// cuda/attention_fa2.cuh, run on the CPU by test/warp_emu.h (a block's threads as lanes, the
// tensor-core instructions as the PTX ISA describes them), against the CPU reference of
// cpu/ops.c: forward (out, lse) and backward (dq, dk, dv), GQA, document masking and plain
// causal, head_dim 32, 64 and 128, sequence lengths that are not a multiple of the tiles,
// q/k/v read from a packed QKV buffer (the model's strided layout). What this shows: the
// kernels' index arithmetic, fragment bookkeeping, masking, tile skipping and double
// buffering are right if the instructions behave as documented. What it cannot show: that
// they do on a GPU, or how fast they are (make test-gpu, bench/gpu).
// (The cases, tolerances and reference: test/attention_emu_check.h.)
#include "test/warp_emu.h"

#include "cuda/attention_fa2.cuh"

#include "test/attention_emu_check.h"

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

struct fa2_kernels {
    static constexpr int BM = fa2::BM, BN = fa2::BN, THREADS = fa2::THREADS;
    template <int D> static int forward_smem() { return fa2::forward_smem_bytes<D>(); }
    template <int D> static int dq_smem() { return fa2::dq_smem_bytes<D>(); }
    template <int D> static int dkv_smem() { return fa2::dkv_smem_bytes<D>(); }
    template <int D> static void forward(fa2::args a) { fa2::forward_kernel<D>(a); }
    template <int D> static void dq(fa2::args a) { fa2::dq_kernel<D>(a); }
    template <int D> static void dkv(fa2::args a) { fa2::dkv_kernel<D>(a); }
};

int main(void) {
    rng_seed(&rng, 20261129, 0);
    check_instructions();
    run_case<fa2_kernels, 64>(2, 150, 4, 2, 20, 60);   // GQA, short documents, a partial last tile
    run_case<fa2_kernels, 128>(1, 200, 2, 1, 60, 130); // head_dim 128 (the dk/dv kernel's 32-query steps), long documents
    run_case<fa2_kernels, 32>(1, 130, 2, 2, 0, 0);     // plain causal, MHA
    run_case<fa2_kernels, 64>(1, 256, 2, 1, 0, 0);     // whole tiles: the unmasked path off the diagonal
    run_case<fa2_kernels, 64>(1, 320, 1, 1, 90, 140);  // key tiles skipped before a document, query tiles after it
    run_case<fa2_kernels, 64>(2, 2, 2, 1, 0, 0);       // two positions
    run_case<fa2_kernels, 64>(2, 70, 2, 1, 1, 1);      // a document at every position: dq = dk = 0 exactly, dv = dO
    run_case<fa2_kernels, 32>(2, 1, 2, 1, 0, 0);       // one position: dq = dk = 0 exactly
    run_case<fa2_kernels, 128>(1, 63, 8, 1, 0, 0);     // one partial tile; a GQA group of 8 (MQA)
    run_case<fa2_kernels, 32>(1, 64, 2, 1, 0, 0);      // exactly one tile
    run_case<fa2_kernels, 64>(1, 65, 2, 2, 0, 0);      // one row into the second tile
    printf("%s: %d checks, %d failed\n", failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}
