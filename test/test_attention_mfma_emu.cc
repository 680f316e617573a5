// test/test_attention_mfma_emu.cc — the MFMA attention kernels of cuda/attention_mfma.cuh
// (AMD CDNA's matrix cores), run on the CPU by test/warp_emu.h with 64-wide wavefronts and
// v_mfma_f32_16x16x16bf16_1k as the ISA lays it out, against the CPU reference of cpu/ops.c:
// forward (out, lse) and backward (dq, dk, dv), GQA, document masking and plain causal,
// head_dim 32, 64 and 128, sequence lengths that are not a multiple of the tiles. What this
// shows: the kernels' index arithmetic, fragment bookkeeping, masking and tile skipping are
// right if the instruction behaves as documented. What it cannot show: that it does on an AMD
// GPU, or how fast the kernels are (make test-gpu on a LUMI-G node).
// (The cases, tolerances and reference: test/attention_emu_check.h.)
#define TRAIN_GPT_EMU_WARP 64
#include "test/warp_emu.h"

#include "cuda/attention_mfma.cuh"

#include "test/attention_emu_check.h"

// ---------------------------------------------------------------- the instruction itself

// v_mfma_f32_16x16x16bf16_1k's operands element by element as the CDNA ISA guides tabulate
// them (lane l, r = l % 16, h = l / 16): A[r][4h + j] and B[4h + j][r] are element j of lane
// l's four (register j / 2, the lower half for even j); D[4h + i][r] is its result i. Then
// product_rows' A load (a tile row's 8 bytes) against the table; the other operand loads
// (load_row_operands' B, product_transposed's A and B) are covered by the kernels' results.
static void check_instruction() {
    constexpr int D = 64;
    std::vector<float> A(256), Bm(256);
    for (auto &x : A) x = bf16_round((float)rng_normal(&rng));
    for (auto &x : Bm) x = bf16_round((float)rng_normal(&rng));
    int bad_mfma = 0, bad_rows = 0;
    emu::launch({1, 1, 1}, 64, 16 * mfa::dims<D>::S * 2, [&] {
        int lane = (int)threadIdx.x, r = lane % 16, h = lane / 16;
        uint32_t a[2], b[2];
        uint16_t ea[4], eb[4];
        for (int j = 0; j < 4; j++) {
            ea[j] = emu::bf16_bits(A[r * 16 + 4 * h + j]);
            eb[j] = emu::bf16_bits(Bm[(4 * h + j) * 16 + r]);
        }
        for (int k = 0; k < 2; k++) {
            a[k] = (uint32_t)ea[2 * k] | (uint32_t)ea[2 * k + 1] << 16;
            b[k] = (uint32_t)eb[2 * k] | (uint32_t)eb[2 * k + 1] << 16;
        }
        float c[4] = {1.0f, 1.0f, 1.0f, 1.0f};  // accumulates onto C
        mfma_16x16x16(c, a, b);
        for (int i = 0; i < 4; i++) {
            double want = 1.0;
            for (int k = 0; k < 16; k++) want += (double)A[(4 * h + i) * 16 + k] * Bm[k * 16 + r];
            bad_mfma += fabs(c[i] - want) > 1e-4 * (1.0 + fabs(want));
        }
        // A tile whose rows are A's, 16 wide of D: product_rows' first step reads lane l's A
        // fragment from row r, columns 4h..4h+3.
        uint16_t *tile = reinterpret_cast<uint16_t *>(emu::the_block().smem.data());
        for (int i = lane; i < 16 * D; i += 64) tile[i / D * mfa::dims<D>::S + i % D] = emu::bf16_bits(i % D < 16 ? A[i / D * 16 + i % D] : 0.0f);
        block_barrier();
        uint32_t got[2];
        mfa::load4(got, tile + r * mfa::dims<D>::S + 4 * h);
        bad_rows += got[0] != a[0] || got[1] != a[1];
    });
    struct {
        const char *name;
        int bad;
    } rows[] = {{"mfma 16x16x16 bf16 on the ISA's fragments", bad_mfma},
                {"a tile row's 8 bytes = the ISA's A fragment", bad_rows}};
    for (auto &row : rows) {
        checks++;
        failures += row.bad != 0;
        printf("%s %-46s %d wrong elements\n", row.bad ? "FAIL" : "PASS", row.name, row.bad);
    }
}

// ---------------------------------------------------------------- the kernels

struct mfma_kernels {
    static constexpr int BM = mfa::BM, BN = mfa::BN, THREADS = mfa::THREADS;
    template <int D> static int forward_smem() { return mfa::forward_smem_bytes<D>(); }
    template <int D> static int dq_smem() { return mfa::dq_smem_bytes<D>(); }
    template <int D> static int dkv_smem() { return mfa::dkv_smem_bytes<D>(); }
    template <int D> static void forward(mfa::args a) { mfa::forward_kernel<D>(a); }
    template <int D> static void dq(mfa::args a) { mfa::dq_kernel<D>(a); }
    template <int D> static void dkv(mfa::args a) { mfa::dkv_kernel<D>(a); }
};

int main(void) {
    rng_seed(&rng, 20261204, 0);
    check_instruction();
    run_case<mfma_kernels, 64>(2, 150, 4, 2, 20, 60);   // GQA, short documents, a partial last tile
    run_case<mfma_kernels, 128>(1, 200, 2, 1, 60, 130); // head_dim 128 (the dk/dv kernel's 32-query steps), long documents
    run_case<mfma_kernels, 32>(1, 130, 2, 2, 0, 0);     // plain causal, MHA
    run_case<mfma_kernels, 64>(1, 256, 2, 1, 0, 0);     // whole tiles: the unmasked path off the diagonal
    run_case<mfma_kernels, 64>(1, 320, 1, 1, 90, 140);  // key tiles skipped before a document, query tiles after it
    run_case<mfma_kernels, 64>(2, 2, 2, 1, 0, 0);       // two positions
    run_case<mfma_kernels, 64>(2, 70, 2, 1, 1, 1);      // a document at every position: dq = dk = 0 exactly, dv = dO
    run_case<mfma_kernels, 32>(2, 1, 2, 1, 0, 0);       // one position: dq = dk = 0 exactly
    run_case<mfma_kernels, 128>(1, 63, 8, 1, 0, 0);     // one partial tile; a GQA group of 8 (MQA)
    run_case<mfma_kernels, 32>(1, 64, 2, 1, 0, 0);      // exactly one tile
    run_case<mfma_kernels, 64>(1, 65, 2, 2, 0, 0);      // one row into the second tile
    printf("%s: %d checks, %d failed\n", failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}
