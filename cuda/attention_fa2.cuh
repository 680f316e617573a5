// cuda/attention_fa2.cuh — causal attention with the softmax in registers (FlashAttention-2's
// structure), GQA native, document masking by tile skipping: the forward and the two backward
// kernels, written with the warp-level tensor-core instructions of cuda/mma.cuh (mma.sync
// m16n8k16, ldmatrix, cp.async). Same contract as cuda/attention.cu's WMMA kernels (which
// stay as the reference the tests compare against): cuda/kernels.h, attention_fa2_*.
//
// Why it is faster than the WMMA kernels: those stage every 64×64 score tile through shared
// memory (store S, read it back for the softmax, store P, read it for P·V), ~50 KB of shared
// traffic per tile and warp; here a warp's scores stay in the accumulator registers of the
// product that made them, the softmax works on them in place, and they become the A operand
// of the next product without leaving the registers (the m16n8 accumulator layout of two
// neighbouring 8-column blocks is the m16k16 operand layout). K/V (or Q/dO) tiles are double-
// buffered with cp.async: the next tile loads while the warps compute on this one.
//
// Forward: a block of 4 warps owns 64 queries of one head, each warp 16 rows. For each 64-key
// tile: S = Q·Kᵀ (16×64 per warp, in registers), the online softmax (row max and sum across
// the four lanes that share a row), O ← O·α + P·V. Base-2 exponentials with the 1/√D scale
// folded in. The query tiles with the most keys are scheduled first (the causal triangle's
// long rows), so the short ones fill the last wave.
//
// Backward, deterministic (no atomics), in two kernels that recompute P from the saved lse
// (7 products per tile pair instead of FlashAttention-2's 5 with atomic dQ — the cost of
// giving the same bits on every run, which bit-exact resume relies on):
//   dq:     per 64 queries of a head: S = Q·Kᵀ, dP = dO·Vᵀ, dS = P⊙(dP − δ), dQ += dS·K
//   dk, dv: per 64 keys of a kv head, looping over the query heads of its GQA group and their
//           query tiles of BQ rows: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q
// δ = rowsum(dO ⊙ O) comes from cuda/attention.cu's small kernel.
//
// Masking: query t sees keys [start[t], t]; start is non-decreasing in t, so a query tile
// needs no key tile before its first query's document start, and a key tile no query tile
// whose first query starts a document after the tile's last key. Tiles wholly inside the
// visible region skip the per-element mask.
//
// Two compilers: nvcc with cuda/mma.cuh (the PTX instructions), or the host C++ compiler
// with test/warp_emu.h, which runs a block's 128 threads as cooperative lanes and implements
// the same instructions from the PTX ISA's description — `make test` checks these kernels
// against the CPU reference that way (test/test_attention_fa2_emu.cc). Tensors are passed
// as raw bf16 bits (uint16_t), which both compilers share.
#ifndef TRAIN_GPT_CUDA_ATTENTION_FA2_CUH
#define TRAIN_GPT_CUDA_ATTENTION_FA2_CUH

#include "cuda/attention_args.h"

#include <math.h>
#include <stdint.h>

namespace fa2 {

constexpr int WARPS = 4, THREADS = 32 * WARPS;
constexpr int BM = 64;  // queries per block (forward, dq): 16 per warp
constexpr int BN = 64;  // keys per tile (forward, dq) and per block (dk, dv): 16 per warp
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

template <int D> struct dims {
    static constexpr int S = D + 8;    // shared tile row stride (elements): 16 bytes off the bank period,
                                       // so ldmatrix's eight row reads hit eight different bank groups
    static constexpr int KD = D / 16;  // 16-wide steps over the head dimension
    static constexpr int DB = D / 8;   // 8-wide column blocks of an output row (O, dQ, dK, dV)
    static constexpr int BQ = D == 128 ? 32 : 64;  // queries per step of the dk/dv kernel (registers)
};

// One call's tensors and sizes (cuda/attention_args.h); E is the 16-bit element type: raw bits
// (uint16_t) here, bf16 for cuda/attention.cu's WMMA kernels, which take the same arguments.
template <typename E> using args_of = attention_args_of<E>;
typedef args_of<uint16_t> args;  // bf16 bits

// Rows [r0, r0 + ROWS) of one head (row stride `stride` elements) into a [ROWS][S] shared tile,
// asynchronously, 16 bytes per copy; rows at or past T become zeros.
template <int D, int ROWS>
FA2_DEVICE void load_tile_async(uint16_t *tile, const uint16_t *head, int64_t stride, int64_t r0, int64_t T) {
    constexpr int V = D / 8, S = dims<D>::S;
    for (int i = threadIdx.x; i < ROWS * V; i += THREADS) {
        int r = i / V, c = (i % V) * 8;
        bool valid = r0 + r < T;
        cp_async_16(tile + r * S + c, valid ? head + (r0 + r) * stride + c : head, valid);
    }
}

// The A operand (16×16 at row r0, column c0 of a [..][S] tile) of mma_16816.
template <int D> FA2_DEVICE void load_a(uint32_t (&a)[4], const uint16_t *tile, int r0, int c0) {
    int lane = threadIdx.x % 32;
    ldsm_x4(a, tile + (r0 + (lane & 15)) * dims<D>::S + c0 + (lane >> 4) * 8);
}

// B operands for two neighbouring 8-column blocks of C = A·Xᵀ, X being rows n0..n0+15 of a
// tile (k = its columns c0..c0+15): b[0], b[1] for columns n0..n0+7 of C, b[2], b[3] for n0+8..
template <int D> FA2_DEVICE void load_b_rows(uint32_t (&b)[4], const uint16_t *tile, int n0, int c0) {
    int lane = threadIdx.x % 32;
    ldsm_x4(b, tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * dims<D>::S + c0 + ((lane >> 3) & 1) * 8);
}

// B operands for two neighbouring 8-column blocks of C = A·X, X being rows k0..k0+15 (the k
// dimension) and columns n0..n0+15 of a tile: the transposing load.
template <int D> FA2_DEVICE void load_b_cols(uint32_t (&b)[4], const uint16_t *tile, int k0, int n0) {
    int lane = threadIdx.x % 32;
    ldsm_x4_t(b, tile + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * dims<D>::S + n0 + (lane >> 4) * 8);
}

// acc (16 × 8·NB) = the warp's 16 rows of A (rows r0.. of tile `a`, D wide) · Xᵀ, X = rows
// 0..8·NB−1 of tile `x`: the score-shaped products Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ.
template <int D, int NB>
FA2_DEVICE void product_abt(float (&acc)[NB][4], const uint16_t *a, int r0, const uint16_t *x) {
#pragma unroll
    for (int n = 0; n < NB; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < dims<D>::KD; kk++) {
        uint32_t af[4];
        load_a<D>(af, a, r0, kk * 16);
#pragma unroll
        for (int n = 0; n < NB; n += 2) {
            uint32_t bf[4];
            load_b_rows<D>(bf, x, n * 8, kk * 16);
            mma_16816(acc[n], af, bf[0], bf[1]);
            mma_16816(acc[n + 1], af, bf[2], bf[3]);
        }
    }
}

// acc (16 × D) += P · X, P (16 × 8·NB) held as score-shaped accumulators (rounded to bf16
// here), X = rows 0..8·NB−1 of tile `x`: the value-shaped products P·V, dS·K, Pᵀ·dO, dSᵀ·Q.
// Two neighbouring 8-column accumulator blocks are exactly one 16-wide A operand.
template <int D, int NB>
FA2_DEVICE void product_ab(float (&acc)[dims<D>::DB][4], const float (&p)[NB][4], const uint16_t *x) {
#pragma unroll
    for (int kk = 0; kk < NB / 2; kk++) {
        uint32_t af[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                          pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                          pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int d = 0; d < dims<D>::DB; d += 2) {
            uint32_t bf[4];
            load_b_cols<D>(bf, x, kk * 16, d * 8);
            mma_16816(acc[d], af, bf[0], bf[1]);
            mma_16816(acc[d + 1], af, bf[2], bf[3]);
        }
    }
}

// Row sum / max over the four lanes that hold one row of an accumulator.
FA2_DEVICE float quad_sum(float v) {
    v += lane_shfl_xor(v, 1);
    return v + lane_shfl_xor(v, 2);
}
FA2_DEVICE float quad_max(float v) {
    v = fmaxf(v, lane_shfl_xor(v, 1));
    return fmaxf(v, lane_shfl_xor(v, 2));
}

// An output row block (16 × D per warp) scaled by f into bf16 rows; rows at or past T are not
// written. dst_row(t) points at row t's first element of this head.
template <int D, typename RowPtr>
FA2_DEVICE void store_rows(const float (&acc)[dims<D>::DB][4], int64_t row0, int64_t T, const float (&f)[2],
                           RowPtr dst_row) {
    int lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int64_t t = row0 + g + 8 * h;
        if (t >= T) continue;
        uint16_t *dst = dst_row(t);
#pragma unroll
        for (int d = 0; d < dims<D>::DB; d++)
            *reinterpret_cast<uint32_t *>(dst + d * 8 + tq * 2) =
                pack_bf16x2(acc[d][2 * h] * f[h], acc[d][2 * h + 1] * f[h]);
    }
}

template <int D> constexpr int forward_smem_bytes() { return (BM + 4 * BN) * dims<D>::S * 2; }

// grid (⌈T/64⌉, Hq, B), 128 threads; shared memory forward_smem_bytes<D>().
template <int D> FA2_KERNEL(THREADS) forward_kernel(args p) {
    constexpr int S = dims<D>::S, DB = dims<D>::DB, NB = BN / 8;
    FA2_SHARED_BYTES(smem_raw);
    uint16_t *Qs = reinterpret_cast<uint16_t *>(smem_raw), *Ks = Qs + BM * S, *Vs = Ks + 2 * BN * S;

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const attention_query_block<uint16_t> qt = attention_query_block_of(p, D, BM, BN);
    int64_t T = qt.T, b = qt.b, q0 = qt.q0, q_last = qt.q_last, k_first = qt.k_first;
    int64_t open_from = qt.open_from, open_to = qt.open_to;
    int j = qt.j;
    const int32_t *start = qt.start;
    const uint16_t *kh = qt.k, *vh = qt.v;

    int row[2] = {(int)q0 + warp * 16 + g, (int)q0 + warp * 16 + g + 8}, lo[2];  // T < 2³¹
    for (int h = 0; h < 2; h++) lo[h] = row[h] < T ? start[row[h]] : (int)T;

    load_tile_async<D, BM>(Qs, p.q + b * T * p.q_stride + (int64_t)j * D, p.q_stride, q0, T);
    load_tile_async<D, BN>(Ks, kh, p.k_stride, k_first, T);
    load_tile_async<D, BN>(Vs, vh, p.v_stride, k_first, T);
    cp_async_commit();

    float o[DB][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int d = 0; d < DB; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    for (int64_t k0 = k_first, it = 0; k0 <= q_last; k0 += BN, it++) {
        cp_async_wait<0>();
        block_barrier();  // tile `it` has landed for every thread, and tile it−1's buffers are free
        const uint16_t *Kt = Ks + (it & 1) * BN * S, *Vt = Vs + (it & 1) * BN * S;
        if (k0 + BN <= q_last) {
            load_tile_async<D, BN>(Ks + ((it + 1) & 1) * BN * S, kh, p.k_stride, k0 + BN, T);
            load_tile_async<D, BN>(Vs + ((it + 1) & 1) * BN * S, vh, p.v_stride, k0 + BN, T);
        }
        cp_async_commit();

        float s[NB][4];
        product_abt<D, NB>(s, Qs, warp * 16, Kt);
        bool masked = !(k0 >= open_from && k0 <= open_to);
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int h = e >> 1, key = (int)k0 + n * 8 + tq * 2 + (e & 1);
                bool visible = !masked || (row[h] < T && key <= row[h] && key >= lo[h]);
                s[n][e] = visible ? s[n][e] * p.scale_log2 : -INFINITY;
            }
        // The online softmax, per row half h (this lane's rows g and g+8).
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NB; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
            float m_new = fmaxf(m[h], quad_max(mx));
            bool empty = m_new == -INFINITY;  // nothing visible to this row yet
            float alpha = empty ? 1.0f : exp2f(m[h] - m_new), sum = 0.0f;
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; e++) {
                    s[n][e] = empty ? 0.0f : exp2f(s[n][e] - m_new);
                    sum += s[n][e];
                }
            m[h] = m_new;
            l[h] = l[h] * alpha + sum;  // this lane's share of the row; the quad adds them at the end
#pragma unroll
            for (int d = 0; d < DB; d++) {
                o[d][2 * h] *= alpha;
                o[d][2 * h + 1] *= alpha;
            }
        }
        product_ab<D, NB>(o, s, Vt);
    }

    float inv[2];
    for (int h = 0; h < 2; h++) {
        l[h] = quad_sum(l[h]);
        inv[h] = 1.0f / l[h];
        if (tq == 0 && row[h] < T) p.lse[(b * p.Hq + j) * T + row[h]] = m[h] * LN2 + logf(l[h]);
    }
    uint16_t *out = p.out + (int64_t)j * D;
    int64_t ld = (int64_t)p.Hq * D;
    store_rows<D>(o, q0 + warp * 16, T, inv, [&](int64_t t) { return out + (b * T + t) * ld; });
}

template <int D> constexpr int dq_smem_bytes() { return (2 * BM + 4 * BN) * dims<D>::S * 2; }

// grid (⌈T/64⌉, Hq, B), 128 threads: dq of 64 queries of one head.
template <int D> FA2_KERNEL(THREADS) dq_kernel(args p) {
    constexpr int S = dims<D>::S, DB = dims<D>::DB, NB = BN / 8;
    FA2_SHARED_BYTES(smem_raw);
    uint16_t *Qs = reinterpret_cast<uint16_t *>(smem_raw), *dOs = Qs + BM * S, *Ks = dOs + BM * S,
             *Vs = Ks + 2 * BN * S;

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    const attention_query_block<uint16_t> qt = attention_query_block_of(p, D, BM, BN);
    int64_t T = qt.T, b = qt.b, q0 = qt.q0, q_last = qt.q_last, k_first = qt.k_first;
    int64_t open_from = qt.open_from, open_to = qt.open_to;
    int j = qt.j;
    const int32_t *start = qt.start;
    const uint16_t *kh = qt.k, *vh = qt.v;

    int row[2] = {(int)q0 + warp * 16 + g, (int)q0 + warp * 16 + g + 8}, lo[2];  // T < 2³¹
    float row_lse[2], row_delta[2];
    for (int h = 0; h < 2; h++) {
        bool ok = row[h] < T;
        lo[h] = ok ? start[row[h]] : (int)T;
        row_lse[h] = ok ? p.lse[(b * p.Hq + j) * T + row[h]] * LOG2E : 0.0f;
        row_delta[h] = ok ? p.delta[(b * p.Hq + j) * T + row[h]] : 0.0f;
    }

    load_tile_async<D, BM>(Qs, p.q + b * T * p.q_stride + (int64_t)j * D, p.q_stride, q0, T);
    load_tile_async<D, BM>(dOs, p.dout + b * T * p.Hq * D + (int64_t)j * D, (int64_t)p.Hq * D, q0, T);
    load_tile_async<D, BN>(Ks, kh, p.k_stride, k_first, T);
    load_tile_async<D, BN>(Vs, vh, p.v_stride, k_first, T);
    cp_async_commit();

    float acc[DB][4];
#pragma unroll
    for (int d = 0; d < DB; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

    for (int64_t k0 = k_first, it = 0; k0 <= q_last; k0 += BN, it++) {
        cp_async_wait<0>();
        block_barrier();
        const uint16_t *Kt = Ks + (it & 1) * BN * S, *Vt = Vs + (it & 1) * BN * S;
        if (k0 + BN <= q_last) {
            load_tile_async<D, BN>(Ks + ((it + 1) & 1) * BN * S, kh, p.k_stride, k0 + BN, T);
            load_tile_async<D, BN>(Vs + ((it + 1) & 1) * BN * S, vh, p.v_stride, k0 + BN, T);
        }
        cp_async_commit();

        float s[NB][4], dp[NB][4];
        product_abt<D, NB>(s, Qs, warp * 16, Kt);
        product_abt<D, NB>(dp, dOs, warp * 16, Vt);
        bool masked = !(k0 >= open_from && k0 <= open_to);
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int h = e >> 1, key = (int)k0 + n * 8 + tq * 2 + (e & 1);
                bool visible = !masked || (row[h] < T && key <= row[h] && key >= lo[h]);
                float pr = visible ? exp2f(s[n][e] * p.scale_log2 - row_lse[h]) : 0.0f;
                s[n][e] = pr * (dp[n][e] - row_delta[h]);  // dS
            }
        product_ab<D, NB>(acc, s, Kt);
    }

    float f[2] = {p.scale, p.scale};
    uint16_t *dq = p.dq + (int64_t)j * D;
    int64_t ld = p.dq_stride;
    store_rows<D>(acc, q0 + warp * 16, T, f, [&](int64_t t) { return dq + (b * T + t) * ld; });
}

template <int D> constexpr int dkv_smem_bytes() {
    return (2 * BN + 4 * dims<D>::BQ) * dims<D>::S * 2 + 2 * 3 * dims<D>::BQ * 4;
}

// grid (⌈T/64⌉, Hkv, B), 128 threads: dk and dv of 64 keys of one kv head. Warp w owns keys
// 16w..16w+15; the score tiles are transposed (keys × queries). The first key tiles have the
// most queries: the grid's order already schedules them first.
template <int D> FA2_KERNEL(THREADS) dkv_kernel(args p) {
    constexpr int S = dims<D>::S, DB = dims<D>::DB, BQ = dims<D>::BQ, NB = BQ / 8;
    FA2_SHARED_BYTES(smem_raw);
    uint16_t *Ks = reinterpret_cast<uint16_t *>(smem_raw), *Vs = Ks + BN * S, *Qs = Vs + BN * S,
             *dOs = Qs + 2 * BQ * S;
    float *q_lse = reinterpret_cast<float *>(dOs + 2 * BQ * S), *q_delta = q_lse + 2 * BQ;
    int32_t *q_lo = reinterpret_cast<int32_t *>(q_delta + 2 * BQ);

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    int64_t T = p.T, b = blockIdx.z, k0 = (int64_t)blockIdx.x * BN;
    int kvh = blockIdx.y, group = p.Hq / p.Hkv;
    const int32_t *start = p.start + b * T;
    int64_t k_last = (k0 + BN < T ? k0 + BN : T) - 1;
    int kv[2] = {(int)k0 + warp * 16 + g, (int)k0 + warp * 16 + g + 8};  // this lane's keys (T < 2³¹)

    // The query tiles that see this key tile: from k0 (causal) while their first query's
    // document starts at or before the tile's last key. The same for every head of the group.
    int nq = 0;
    while (k0 + (int64_t)nq * BQ < T && start[k0 + (int64_t)nq * BQ] <= k_last) nq++;
    int tiles = nq * group;

    auto issue = [&](int it) {  // the Q/dO tile and its rows' statistics for step `it`, buffer it & 1
        int jh = kvh * group + it / nq, buf = it & 1;
        int64_t q0 = k0 + (int64_t)(it % nq) * BQ;
        load_tile_async<D, BQ>(Qs + buf * BQ * S, p.q + b * T * p.q_stride + (int64_t)jh * D, p.q_stride, q0, T);
        load_tile_async<D, BQ>(dOs + buf * BQ * S, p.dout + b * T * p.Hq * D + (int64_t)jh * D, (int64_t)p.Hq * D,
                               q0, T);
        // The rows' statistics ride the same copy group (zeros past T, where every pair is masked).
        for (int i = threadIdx.x; i < BQ; i += THREADS) {
            bool ok = q0 + i < T;
            int64_t at = ok ? q0 + i : 0;
            cp_async_4(q_lse + buf * BQ + i, p.lse + (b * p.Hq + jh) * T + at, ok);
            cp_async_4(q_delta + buf * BQ + i, p.delta + (b * p.Hq + jh) * T + at, ok);
            cp_async_4(q_lo + buf * BQ + i, start + at, ok);
        }
    };

    load_tile_async<D, BN>(Ks, p.k + b * T * p.k_stride + (int64_t)kvh * D, p.k_stride, k0, T);
    load_tile_async<D, BN>(Vs, p.v + b * T * p.v_stride + (int64_t)kvh * D, p.v_stride, k0, T);
    if (tiles > 0) issue(0);
    cp_async_commit();

    float dk[DB][4], dv[DB][4];
#pragma unroll
    for (int d = 0; d < DB; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;

    for (int it = 0; it < tiles; it++) {
        cp_async_wait<0>();
        block_barrier();  // step `it`'s tiles and statistics are in place; step it−1's buffers are free
        int buf = it & 1;
        int64_t q0 = k0 + (int64_t)(it % nq) * BQ;
        if (it + 1 < tiles) issue(it + 1);
        cp_async_commit();
        const uint16_t *Qt = Qs + buf * BQ * S, *dOt = dOs + buf * BQ * S;
        const float *lse = q_lse + buf * BQ, *delta = q_delta + buf * BQ;
        const int32_t *qlo = q_lo + buf * BQ;

        float st[NB][4], dpt[NB][4];
        product_abt<D, NB>(st, Ks, warp * 16, Qt);
        product_abt<D, NB>(dpt, Vs, warp * 16, dOt);
        // Every pair of the tile is visible when all its keys precede its first query and
        // its last query's document starts at or before the first key: no per-pair test.
        bool open = k0 + BN - 1 <= q0 && q0 + BQ <= T && qlo[BQ - 1] <= k0;
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {  // this lane's two columns (queries) of block n
                int c = n * 8 + tq * 2 + e2, t = (int)q0 + c;
                float row_lse = lse[c] * LOG2E, row_delta = delta[c];
#pragma unroll
                for (int h = 0; h < 2; h++) {  // its two rows (keys)
                    int e = 2 * h + e2;
                    bool visible = open || (kv[h] < (int)T && t < (int)T && kv[h] <= t && kv[h] >= qlo[c]);
                    float pr = visible ? exp2f(st[n][e] * p.scale_log2 - row_lse) : 0.0f;
                    st[n][e] = pr;
                    dpt[n][e] = pr * (dpt[n][e] - row_delta);  // dSᵀ
                }
            }
        product_ab<D, NB>(dv, st, dOt);
        product_ab<D, NB>(dk, dpt, Qt);
    }

    int64_t row0 = k0 + warp * 16;
    float fk[2] = {p.scale, p.scale}, fv[2] = {1.0f, 1.0f};
    uint16_t *dkh = p.dk + (int64_t)kvh * D, *dvh = p.dv + (int64_t)kvh * D;
    int64_t ldk = p.dk_stride, ldv = p.dv_stride;
    store_rows<D>(dk, row0, T, fk, [&](int64_t s) { return dkh + (b * T + s) * ldk; });
    store_rows<D>(dv, row0, T, fv, [&](int64_t s) { return dvh + (b * T + s) * ldv; });
}

}  // namespace fa2

#endif
