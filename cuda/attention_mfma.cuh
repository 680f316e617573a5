// cuda/attention_mfma.cuh — causal attention on AMD's matrix cores (CDNA2/3: MI250X, MI300X),
// GQA native, document masking by tile skipping: the forward and the two backward kernels,
// written with the wavefront-level v_mfma_f32_16x16x16bf16_1k of cuda/mfma.cuh. The same
// contract, masking rules and deterministic two-kernel backward as cuda/attention_fa2.cuh
// (NVIDIA's mma.sync kernels), with 64-lane wavefronts and MFMA's fragment layout.
//
// The layout decides the shape of every product. An MFMA's result C[4h + i][r] sits in lane
// 16h + r, and its B operand B[4h + j][r] in the same place: a result can be the B operand of
// the next product without leaving the lane, but not its A operand. So the kernels compute
// the transposed products, which keep the softmax's row (the query) in the lane's r:
//   forward: Sᵀ = K·Qᵀ (keys × queries), P in place, Oᵀ += Vᵀ·Pᵀ (head dim × queries): a
//            lane's 16 keys of a 64-key tile and its output column belong to query r, so the
//            running max, sum and rescale are per lane, and the row's statistics across the
//            four lanes r, r + 16, r + 32, r + 48 take two shuffles.
//   dq:      Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ⊙ (dPᵀ − δ), dQᵀ += Kᵀ·dSᵀ
//   dk, dv:  S = Q·Kᵀ and dP = dO·Vᵀ (queries × keys: the query is the sum's index here),
//            dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS, over the query heads of the GQA group in order
// The A operands are read from shared memory 8 bytes per lane, a row of a tile: K, V, Q and
// dO row-major where they are A as they are, and stored transposed as well (Kᵀ, Vᵀ, Qᵀ, dOᵀ)
// where the product needs their transpose as A. The B operands that do not come from a
// previous product (Q and dO in the forward and dq, K and V in dk/dv) stay in registers for
// the whole kernel.
//
// A block is 4 wavefronts (256 threads). Forward and dq: 64 queries of one head per block, 16
// per wavefront, 64-key tiles, the longest query tiles first. dk, dv: 64 keys of a kv head,
// 16 per wavefront, query steps of BQ (64; 32 at head_dim 128, for shared memory). The next
// tile is read into registers while the block computes on this one (AMD has no asynchronous
// global → shared copies: the registers are the second buffer), then written to shared
// memory between two barriers.
//
// Two compilers: hipcc with cuda/mfma.cuh, or the host C++ compiler with test/warp_emu.h at
// TRAIN_GPT_EMU_WARP=64, which implements the instruction from the ISA's layout; `make test`
// checks the kernels against the CPU reference that way (test/test_attention_mfma_emu.cc).
// Not yet run on an AMD GPU: correctness there and speed are unverified.
#ifndef TRAIN_GPT_CUDA_ATTENTION_MFMA_CUH
#define TRAIN_GPT_CUDA_ATTENTION_MFMA_CUH

#include "cuda/attention_args.h"

#include <math.h>
#include <stdint.h>

namespace mfa {

constexpr int WAVES = 4, THREADS = 64 * WAVES;
constexpr int BM = 64;  // queries per block (forward, dq): 16 per wavefront
constexpr int BN = 64;  // keys per tile (forward, dq) and per block (dk, dv): 16 per wavefront
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

template <int D> struct dims {
    static constexpr int S = D + 4;    // row-major tile row stride (elements)
    static constexpr int KD = D / 16;  // 16-wide steps over the head dimension
    static constexpr int BQ = D == 128 ? 32 : 64;  // queries per step of the dk/dv kernel
};
typedef attention_args_of<uint16_t> args;  // bf16 bits

// Four bf16 (8 bytes) at p as an MFMA operand.
MFMA_DEVICE void load4(uint32_t (&r)[2], const uint16_t *p) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(p);
    r[0] = w[0];
    r[1] = w[1];
}

// A tile of ROWS rows of one head on its way to shared memory: each thread's share of it
// (8 bytes at a time) in registers. fetch() reads it from global memory and put() writes it
// to shared memory, so that the next tile's reads are in flight while the block computes on
// this one (no asynchronous copies on AMD: the registers are the second buffer).
template <int D, int ROWS> struct staged_tile {
    static constexpr int V = D / 4, PER = (ROWS * V + THREADS - 1) / THREADS;
    uint32_t w[PER][2];
};

// Rows [r0, r0 + ROWS) of one head (row stride `stride` elements); rows at or past T are zeros.
template <int D, int ROWS>
MFMA_DEVICE void fetch(staged_tile<D, ROWS> &t, const uint16_t *head, int64_t stride, int64_t r0, int64_t T) {
    constexpr int V = staged_tile<D, ROWS>::V;
#pragma unroll
    for (int n = 0; n < staged_tile<D, ROWS>::PER; n++) {
        int i = (int)threadIdx.x + n * THREADS, r = i / V, c = (i % V) * 4;
        t.w[n][0] = t.w[n][1] = 0u;
        if (i < ROWS * V && r0 + r < T) load4(t.w[n], head + (r0 + r) * stride + c);
    }
}

// Into a row-major tile [ROWS][D + 4] (if tile) and a transposed one [D][ts] (if transposed).
template <int D, int ROWS>
MFMA_DEVICE void put(const staged_tile<D, ROWS> &t, uint16_t *tile, uint16_t *transposed, int ts) {
    constexpr int V = staged_tile<D, ROWS>::V, S = dims<D>::S;
#pragma unroll
    for (int n = 0; n < staged_tile<D, ROWS>::PER; n++) {
        int i = (int)threadIdx.x + n * THREADS, r = i / V, c = (i % V) * 4;
        if (i >= ROWS * V) continue;
        if (tile) {
            uint32_t *dst = reinterpret_cast<uint32_t *>(tile + r * S + c);
            dst[0] = t.w[n][0];
            dst[1] = t.w[n][1];
        }
        if (transposed) {
            transposed[(c + 0) * ts + r] = (uint16_t)(t.w[n][0] & 0xffffu);
            transposed[(c + 1) * ts + r] = (uint16_t)(t.w[n][0] >> 16);
            transposed[(c + 2) * ts + r] = (uint16_t)(t.w[n][1] & 0xffffu);
            transposed[(c + 3) * ts + r] = (uint16_t)(t.w[n][1] >> 16);
        }
    }
}

// The B operands of one row (this lane's r) of a head, all D columns: row `t` of `head`, zeros
// past T. The row's element [16kk + 4h + j] goes to b[kk], as B[4h + j][r] of the kk-th product.
template <int D>
MFMA_DEVICE void load_row_operands(uint32_t (&b)[dims<D>::KD][2], const uint16_t *head, int64_t stride, int64_t t,
                                   int64_t T) {
    int h = (threadIdx.x % 64) / 16;
#pragma unroll
    for (int kk = 0; kk < dims<D>::KD; kk++) {
        b[kk][0] = b[kk][1] = 0u;
        if (t < T) load4(b[kk], head + t * stride + 16 * kk + 4 * h);
    }
}

// c (16 × 16) = rows r0..r0+15 of a row-major tile (D wide) · the B operands b (D × 16).
template <int D>
MFMA_DEVICE void product_rows(float (&c)[4], const uint16_t *tile, int r0, const uint32_t (&b)[dims<D>::KD][2]) {
    int lane = threadIdx.x % 64, r = lane % 16, h = lane / 16;
    c[0] = c[1] = c[2] = c[3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < dims<D>::KD; kk++) {
        uint32_t a[2];
        load4(a, tile + (r0 + r) * dims<D>::S + 16 * kk + 4 * h);
        mfma_16x16x16(c, a, b[kk]);
    }
}

// acc (D × 16, as KD blocks of 16 rows) += Xᵀ · P, Xᵀ being the transposed tile [D][ts] at
// columns c0..c0+15 (the sum's 16 indices) and P (16 × 16) the result of an earlier product,
// rounded to bf16 here: Oᵀ += Vᵀ·Pᵀ, dQᵀ += Kᵀ·dSᵀ, dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS.
template <int D>
MFMA_DEVICE void product_transposed(float (&acc)[dims<D>::KD][4], const uint16_t *xt, int ts, int c0,
                                    const float (&p)[4]) {
    int lane = threadIdx.x % 64, r = lane % 16, h = lane / 16;
    uint32_t b[2] = {pack_bf16x2(p[0], p[1]), pack_bf16x2(p[2], p[3])};
#pragma unroll
    for (int dd = 0; dd < dims<D>::KD; dd++) {
        uint32_t a[2];
        load4(a, xt + (16 * dd + r) * ts + c0 + 4 * h);
        mfma_16x16x16(acc[dd], a, b);
    }
}

// The sum over the four lanes r, r + 16, r + 32, r + 48 (one query's or key's row), and max.
MFMA_DEVICE float quad_sum(float v) {
    v += lane_shfl_xor(v, 16);
    return v + lane_shfl_xor(v, 32);
}
MFMA_DEVICE float quad_max(float v) {
    v = fmaxf(v, lane_shfl_xor(v, 16));
    return fmaxf(v, lane_shfl_xor(v, 32));
}

// A transposed accumulator (D × 16: element [16dd + 4h + i][r] in acc[dd][i]) as row r of
// the output, times f: this lane's four neighbouring elements per block, 8 bytes each.
template <int D> MFMA_DEVICE void store_row(const float (&acc)[dims<D>::KD][4], uint16_t *dst, float f) {
    int h = (threadIdx.x % 64) / 16;
#pragma unroll
    for (int dd = 0; dd < dims<D>::KD; dd++) {
        uint32_t *w = reinterpret_cast<uint32_t *>(dst + 16 * dd + 4 * h);
        w[0] = pack_bf16x2(acc[dd][0] * f, acc[dd][1] * f);
        w[1] = pack_bf16x2(acc[dd][2] * f, acc[dd][3] * f);
    }
}

template <int D> constexpr int forward_smem_bytes() { return (BN * dims<D>::S + D * (BN + 4)) * 2; }

// grid (⌈T/64⌉, Hq, B), 256 threads; shared memory forward_smem_bytes<D>().
template <int D> MFMA_KERNEL(THREADS) forward_kernel(args p) {
    constexpr int S = dims<D>::S, KD = dims<D>::KD, ST = BN + 4, NB = BN / 16;
    MFMA_SHARED_BYTES(smem_raw);
    uint16_t *Ks = reinterpret_cast<uint16_t *>(smem_raw), *Vt = Ks + BN * S;

    int wave = threadIdx.x / 64, lane = threadIdx.x % 64, r = lane % 16, h = lane / 16;
    const attention_query_block<uint16_t> qt = attention_query_block_of(p, D, BM, BN);
    int64_t T = qt.T, b = qt.b, q0 = qt.q0, q_last = qt.q_last, k_first = qt.k_first;
    int64_t open_from = qt.open_from, open_to = qt.open_to;
    int j = qt.j;
    const int32_t *start = qt.start;
    const uint16_t *kh = qt.k, *vh = qt.v;

    int row = (int)q0 + wave * 16 + r;  // this lane's query (T < 2³¹)
    int lo = row < T ? start[row] : (int)T;
    uint32_t qf[KD][2];
    load_row_operands<D>(qf, p.q + b * T * p.q_stride + (int64_t)j * D, p.q_stride, row, T);

    float o[KD][4], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int d = 0; d < KD; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

    staged_tile<D, BN> kn, vn;  // the next K and V tiles
    fetch<D, BN>(kn, kh, p.k_stride, k_first, T);
    fetch<D, BN>(vn, vh, p.v_stride, k_first, T);
    for (int64_t k0 = k_first; k0 <= q_last; k0 += BN) {
        block_barrier();  // the previous tile's readers are done
        put<D, BN>(kn, Ks, nullptr, 0);
        put<D, BN>(vn, nullptr, Vt, ST);
        block_barrier();
        if (k0 + BN <= q_last) {  // the next tile's reads, in flight during this tile's products
            fetch<D, BN>(kn, kh, p.k_stride, k0 + BN, T);
            fetch<D, BN>(vn, vh, p.v_stride, k0 + BN, T);
        }

        float s[NB][4];  // Sᵀ: keys k0 + 16n + 4h + i, query `row`
#pragma unroll
        for (int n = 0; n < NB; n++) product_rows<D>(s[n], Ks, 16 * n, qf);
        bool masked = !(k0 >= open_from && k0 <= open_to);
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = (int)k0 + 16 * n + 4 * h + i;
                bool visible = !masked || (row < T && key <= row && key >= lo);
                s[n][i] = visible ? s[n][i] * p.scale_log2 : -INFINITY;
                mx = fmaxf(mx, s[n][i]);
            }
        // The online softmax of this lane's query over the tile's 64 keys (16 here, 48 in the
        // three other lanes of the row).
        float m_new = fmaxf(m, quad_max(mx));
        bool empty = m_new == -INFINITY;  // nothing visible to this row yet
        float alpha = empty ? 1.0f : exp2f(m - m_new), sum = 0.0f;
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s[n][i] = empty ? 0.0f : exp2f(s[n][i] - m_new);
                sum += s[n][i];
            }
        m = m_new;
        l = l * alpha + sum;  // this lane's share of the row; the four add them at the end
#pragma unroll
        for (int d = 0; d < KD; d++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[d][i] *= alpha;
#pragma unroll
        for (int n = 0; n < NB; n++) product_transposed<D>(o, Vt, ST, 16 * n, s[n]);
    }

    l = quad_sum(l);
    if (row < T) {
        if (h == 0) p.lse[(b * p.Hq + j) * T + row] = m * LN2 + logf(l);
        store_row<D>(o, p.out + (b * T + row) * (int64_t)p.Hq * D + (int64_t)j * D, 1.0f / l);
    }
}

template <int D> constexpr int dq_smem_bytes() { return (2 * BN * dims<D>::S + D * (BN + 4)) * 2; }

// grid (⌈T/64⌉, Hq, B), 256 threads: dq of 64 queries of one head.
template <int D> MFMA_KERNEL(THREADS) dq_kernel(args p) {
    constexpr int S = dims<D>::S, KD = dims<D>::KD, ST = BN + 4, NB = BN / 16;
    MFMA_SHARED_BYTES(smem_raw);
    uint16_t *Ks = reinterpret_cast<uint16_t *>(smem_raw), *Vs = Ks + BN * S, *Kt = Vs + BN * S;

    int wave = threadIdx.x / 64, lane = threadIdx.x % 64, r = lane % 16, h = lane / 16;
    const attention_query_block<uint16_t> qt = attention_query_block_of(p, D, BM, BN);
    int64_t T = qt.T, b = qt.b, q0 = qt.q0, q_last = qt.q_last, k_first = qt.k_first;
    int64_t open_from = qt.open_from, open_to = qt.open_to;
    int j = qt.j;
    const int32_t *start = qt.start;
    const uint16_t *kh = qt.k, *vh = qt.v;

    int row = (int)q0 + wave * 16 + r;
    bool ok = row < T;
    int lo = ok ? start[row] : (int)T;
    float row_lse = ok ? p.lse[(b * p.Hq + j) * T + row] * LOG2E : 0.0f;
    float row_delta = ok ? p.delta[(b * p.Hq + j) * T + row] : 0.0f;
    uint32_t qf[KD][2], of[KD][2];
    load_row_operands<D>(qf, p.q + b * T * p.q_stride + (int64_t)j * D, p.q_stride, row, T);
    load_row_operands<D>(of, p.dout + b * T * p.Hq * D + (int64_t)j * D, (int64_t)p.Hq * D, row, T);

    float acc[KD][4];
#pragma unroll
    for (int d = 0; d < KD; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

    staged_tile<D, BN> kn, vn;
    fetch<D, BN>(kn, kh, p.k_stride, k_first, T);
    fetch<D, BN>(vn, vh, p.v_stride, k_first, T);
    for (int64_t k0 = k_first; k0 <= q_last; k0 += BN) {
        block_barrier();
        put<D, BN>(kn, Ks, Kt, ST);
        put<D, BN>(vn, Vs, nullptr, 0);
        block_barrier();
        if (k0 + BN <= q_last) {
            fetch<D, BN>(kn, kh, p.k_stride, k0 + BN, T);
            fetch<D, BN>(vn, vh, p.v_stride, k0 + BN, T);
        }

        bool masked = !(k0 >= open_from && k0 <= open_to);
#pragma unroll
        for (int n = 0; n < NB; n++) {
            float s[4], dp[4];
            product_rows<D>(s, Ks, 16 * n, qf);
            product_rows<D>(dp, Vs, 16 * n, of);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = (int)k0 + 16 * n + 4 * h + i;
                bool visible = !masked || (ok && key <= row && key >= lo);
                float pr = visible ? exp2f(s[i] * p.scale_log2 - row_lse) : 0.0f;
                s[i] = pr * (dp[i] - row_delta);  // dSᵀ
            }
            product_transposed<D>(acc, Kt, ST, 16 * n, s);
        }
    }

    if (ok) store_row<D>(acc, p.dq + (b * T + row) * p.dq_stride + (int64_t)j * D, p.scale);
}

template <int D> constexpr int dkv_smem_bytes() {
    constexpr int BQ = dims<D>::BQ;
    return (2 * BQ * dims<D>::S + 2 * D * (BQ + 4)) * 2 + 3 * BQ * 4;
}

// grid (⌈T/64⌉, Hkv, B), 256 threads: dk and dv of 64 keys of one kv head. Wavefront w owns
// keys 16w..16w+15, one per lane's r.
template <int D> MFMA_KERNEL(THREADS) dkv_kernel(args p) {
    constexpr int S = dims<D>::S, KD = dims<D>::KD, BQ = dims<D>::BQ, QT = BQ + 4, NQ = BQ / 16;
    MFMA_SHARED_BYTES(smem_raw);
    uint16_t *Qs = reinterpret_cast<uint16_t *>(smem_raw), *dOs = Qs + BQ * S, *Qt = dOs + BQ * S, *dOt = Qt + D * QT;
    float *q_lse = reinterpret_cast<float *>(dOt + D * QT), *q_delta = q_lse + BQ;
    int32_t *q_lo = reinterpret_cast<int32_t *>(q_delta + BQ);

    int wave = threadIdx.x / 64, lane = threadIdx.x % 64, r = lane % 16, h = lane / 16;
    int64_t T = p.T, b = blockIdx.z, k0 = (int64_t)blockIdx.x * BN;
    int kvh = blockIdx.y, group = p.Hq / p.Hkv;
    const int32_t *start = p.start + b * T;
    int64_t k_last = (k0 + BN < T ? k0 + BN : T) - 1;
    int key = (int)k0 + wave * 16 + r;  // this lane's key (T < 2³¹)

    // The query steps that see this key tile: from k0 (causal) while their first query's
    // document starts at or before the tile's last key. The same for every head of the group.
    int nq = 0;
    while (k0 + (int64_t)nq * BQ < T && start[k0 + (int64_t)nq * BQ] <= k_last) nq++;
    int steps = nq * group;

    uint32_t kf[KD][2], vf[KD][2];
    load_row_operands<D>(kf, p.k + b * T * p.k_stride + (int64_t)kvh * D, p.k_stride, key, T);
    load_row_operands<D>(vf, p.v + b * T * p.v_stride + (int64_t)kvh * D, p.v_stride, key, T);

    float dk[KD][4], dv[KD][4];
#pragma unroll
    for (int d = 0; d < KD; d++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[d][i] = dv[d][i] = 0.0f;

    // Step `it`'s Q and dO tiles and its rows' statistics (thread i < BQ: row i's lse, δ and
    // document start; zeros past T, where every pair is masked), fetched a step ahead.
    staged_tile<D, BQ> qn, on;
    float lse_n = 0.0f, delta_n = 0.0f;
    int lo_n = 0;
    auto fetch_step = [&](int it) {
        int jh = kvh * group + it / nq;
        int64_t q0 = k0 + (int64_t)(it % nq) * BQ, t = q0 + (int64_t)threadIdx.x;
        fetch<D, BQ>(qn, p.q + b * T * p.q_stride + (int64_t)jh * D, p.q_stride, q0, T);
        fetch<D, BQ>(on, p.dout + b * T * p.Hq * D + (int64_t)jh * D, (int64_t)p.Hq * D, q0, T);
        bool ok = (int)threadIdx.x < BQ && t < T;
        lse_n = ok ? p.lse[(b * p.Hq + jh) * T + t] * LOG2E : 0.0f;
        delta_n = ok ? p.delta[(b * p.Hq + jh) * T + t] : 0.0f;
        lo_n = ok ? start[t] : 0;
    };
    if (steps > 0) fetch_step(0);

    for (int it = 0; it < steps; it++) {
        int64_t q0 = k0 + (int64_t)(it % nq) * BQ;
        block_barrier();
        put<D, BQ>(qn, Qs, Qt, QT);
        put<D, BQ>(on, dOs, dOt, QT);
        if ((int)threadIdx.x < BQ) {
            q_lse[threadIdx.x] = lse_n;
            q_delta[threadIdx.x] = delta_n;
            q_lo[threadIdx.x] = lo_n;
        }
        block_barrier();
        if (it + 1 < steps) fetch_step(it + 1);

        // Every pair of the step is visible when all the tile's keys precede its first query
        // and its last query's document starts at or before the first key.
        bool open = k0 + BN - 1 <= q0 && q0 + BQ <= T && q_lo[BQ - 1] <= k0;
#pragma unroll
        for (int qb = 0; qb < NQ; qb++) {
            float s[4], dp[4];  // S and dP: queries q0 + 16qb + 4h + i, key `key`
            product_rows<D>(s, Qs, 16 * qb, kf);
            product_rows<D>(dp, dOs, 16 * qb, vf);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = 16 * qb + 4 * h + i, t = (int)q0 + c;
                bool visible = open || (key < (int)T && t < (int)T && key <= t && key >= q_lo[c]);
                float pr = visible ? exp2f(s[i] * p.scale_log2 - q_lse[c]) : 0.0f;
                s[i] = pr;
                dp[i] = pr * (dp[i] - q_delta[c]);  // dS
            }
            product_transposed<D>(dv, dOt, QT, 16 * qb, s);
            product_transposed<D>(dk, Qt, QT, 16 * qb, dp);
        }
    }

    if (key < T) {
        store_row<D>(dk, p.dk + (b * T + key) * p.dk_stride + (int64_t)kvh * D, p.scale);
        store_row<D>(dv, p.dv + (b * T + key) * p.dv_stride + (int64_t)kvh * D, 1.0f);
    }
}

}  // namespace mfa

#endif
