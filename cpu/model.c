// cpu/model.c — forward and backward of the whole model on the CPU (see cpu/model.h).
//
// Saved for the backward pass, per layer without recomputation: the residual stream
// entering the layer and after attention, both norm outputs and their 1/rms, q and k
// before and after QK-norm (before is needed by QK-norm's backward), q/k after RoPE, v, the
// attention output and its log-sum-exp, and the three SwiGLU tensors. A recomputed layer's
// layer_acts point into the shared scratch for what it does not keep (cpu/model.h).
// Everything else is scratch shared by all layers.
#include "cpu/model.h"
#include "llmc/common.h"
#include "cpu/ops.h"
#include "cpu/gemm.h"
#include "llmc/shard.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    float *resid_mid;             // (N,C) after the attention residual add
    float *attn_in, *attn_rstd;   // (N,C), (N)
    float *q_raw, *k_raw;         // (N,Hq·D), (N,Hkv·D): the projections, before QK-norm and RoPE
                                  // (NULL without qk_norm and recomputation: they go straight to q, k)
    float *q_rstd, *k_rstd;       // (N·Hq), (N·Hkv)
    float *q, *k, *v;             // after QK-norm and RoPE
    float *att, *lse;             // (N,Hq·D), (B,Hq,T)
    float *mlp_in, *mlp_rstd;     // (N,C), (N)
    float *gate, *up, *act;       // (N,F)
    recompute_mode recompute;     // what the backward computes again
} layer_acts;

struct cpu_model {
    const param_table *table;
    shard_map units;              // the units of one rank (llmc/shard.h): where each starts
    model_dims dims;              // llmc/params.h
    float eps;
    float *rope_cos, *rope_sin;   // (T, D/2)
    float **resid;                // L+1 buffers (N,C): resid[l] enters layer l
    layer_acts *layers;
    layer_acts scratch;           // what recomputed layers do not keep (one layer's worth)
    int scratch_layer;            // the layer whose activations the scratch holds now; -1: none
    float *final_out, *final_rstd;
    int32_t *start, *pos;         // (N)
    // backward scratch
    float *d_resid, *d_norm, *d_att, *dq, *dk, *dv, *d_act, *d_gate, *d_up, *d_final;
    float *logits;                // (chunk_rows, V)
    int64_t chunk_rows;
    // The allocator's counts: every activation buffer, with its size as allocated.
    float **owned;
    int64_t *owned_bytes;
    int owned_count, owned_cap;
    int64_t live_bytes, peak_bytes;
};

static float *take(cpu_model *m, int64_t count) {
    if (m->owned_count == m->owned_cap) {
        m->owned_cap = m->owned_cap ? 2 * m->owned_cap : 64;
        m->owned = xrealloc(m->owned, (size_t)m->owned_cap * sizeof *m->owned);
        m->owned_bytes = xrealloc(m->owned_bytes, (size_t)m->owned_cap * sizeof *m->owned_bytes);
    }
    int64_t bytes = (count * (int64_t)sizeof(float) + 63) / 64 * 64;  // as alloc_floats rounds
    float *p = alloc_floats((size_t)count);
    m->owned[m->owned_count] = p;
    m->owned_bytes[m->owned_count++] = bytes;
    m->live_bytes += bytes;
    if (m->live_bytes > m->peak_bytes) m->peak_bytes = m->live_bytes;
    return p;
}

// A layer's buffers for `mode`: what it keeps from the allocator, what it recomputes from
// the scratch (full: all of it, the layer keeps nothing but its input in resid).
static void layer_buffers(cpu_model *m, layer_acts *a, recompute_mode mode, const layer_acts *scratch) {
    const model_config *c = &m->table->cfg;
    int64_t N = m->dims.N, C = m->dims.C, F = m->dims.F, QD = m->dims.QD, KD = m->dims.KD;
    if (mode == RECOMPUTE_FULL) {
        *a = *scratch;
        a->recompute = mode;
        return;
    }
    bool keep_all = mode == RECOMPUTE_NONE;  // else selective: the norms, q, k and act are recomputed
    a->recompute = mode;
    a->resid_mid = take(m, N * C);
    a->attn_in = keep_all ? take(m, N * C) : scratch->attn_in;
    a->attn_rstd = keep_all ? take(m, N) : scratch->attn_rstd;
    // selective keeps the projections before QK-norm and RoPE, with or without qk_norm
    bool raw = c->qk_norm || mode == RECOMPUTE_SELECTIVE;
    a->q_raw = raw ? take(m, N * QD) : NULL;
    a->k_raw = raw ? take(m, N * KD) : NULL;
    if (c->qk_norm) {
        a->q_rstd = keep_all ? take(m, N * m->dims.Hq) : scratch->q_rstd;
        a->k_rstd = keep_all ? take(m, N * m->dims.Hkv) : scratch->k_rstd;
    }
    a->q = keep_all ? take(m, N * QD) : scratch->q;
    a->k = keep_all ? take(m, N * KD) : scratch->k;
    a->v = take(m, N * KD);
    a->att = take(m, N * QD);
    a->lse = take(m, N * m->dims.Hq);
    a->mlp_in = keep_all ? take(m, N * C) : scratch->mlp_in;
    a->mlp_rstd = keep_all ? take(m, N) : scratch->mlp_rstd;
    a->gate = take(m, N * F);
    a->up = take(m, N * F);
    a->act = keep_all ? take(m, N * F) : scratch->act;
}

// The scratch of the recomputed parts: the whole layer for full, for selective what it
// recomputes (both norms and their 1/rms, q and k after QK-norm and RoPE, SwiGLU's output).
static void scratch_buffers(cpu_model *m, recompute_mode mode) {
    layer_acts *s = &m->scratch;
    memset(s, 0, sizeof *s);
    if (mode == RECOMPUTE_FULL) layer_buffers(m, s, RECOMPUTE_NONE, NULL);
    if (mode != RECOMPUTE_SELECTIVE) return;
    int64_t N = m->dims.N, C = m->dims.C;
    s->attn_in = take(m, N * C);
    s->attn_rstd = take(m, N);
    if (m->table->cfg.qk_norm) {
        s->q_rstd = take(m, N * m->dims.Hq);
        s->k_rstd = take(m, N * m->dims.Hkv);
    }
    s->q = take(m, N * m->dims.QD);
    s->k = take(m, N * m->dims.KD);
    s->mlp_in = take(m, N * C);
    s->mlp_rstd = take(m, N);
    s->act = take(m, N * m->dims.F);
}

cpu_model *cpu_model_create_recompute(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    const model_config *c = &t->cfg;
    CHECK(T <= c->seq_len);
    CHECK(recompute.every >= 1);
    cpu_model *m = xcalloc(1, sizeof *m);
    m->table = t;
    shard_map_build(&m->units, t, 0, 1);
    m->dims = model_dims_of(c, B, T);
    m->eps = (float)c->norm_eps;
    int64_t N = m->dims.N, C = m->dims.C, F = m->dims.F, QD = m->dims.QD, KD = m->dims.KD;
    m->rope_cos = take(m, T * m->dims.D / 2);
    m->rope_sin = take(m, T * m->dims.D / 2);
    rope_tables(m->rope_cos, m->rope_sin, T, m->dims.D, c->rope_theta);
    m->resid = xcalloc((size_t)m->dims.L + 1, sizeof *m->resid);
    for (int64_t l = 0; l <= m->dims.L; l++) m->resid[l] = take(m, N * C);
    scratch_buffers(m, recompute.mode);
    m->scratch_layer = -1;
    m->layers = xcalloc((size_t)m->dims.L, sizeof *m->layers);
    for (int64_t l = 0; l < m->dims.L; l++)
        layer_buffers(m, &m->layers[l], recompute_of_layer(recompute, l), &m->scratch);
    m->final_out = take(m, N * C);
    m->final_rstd = take(m, N);
    m->start = (int32_t *)take(m, N);  // int32 and float are both 4 bytes
    m->pos = (int32_t *)take(m, N);
    m->d_resid = take(m, N * C);
    m->d_norm = take(m, N * C);
    m->d_final = take(m, N * C);
    m->d_att = take(m, N * QD);
    m->dq = take(m, N * QD);
    m->dk = take(m, N * KD);
    m->dv = take(m, N * KD);
    m->d_act = take(m, N * F);
    m->d_gate = take(m, N * F);
    m->d_up = take(m, N * F);
    // Logits in chunks of at most 2^24 floats (64 MiB), whatever the vocabulary.
    m->chunk_rows = max_i64(1, min_i64(N, (1 << 24) / m->dims.V));
    m->logits = take(m, m->chunk_rows * m->dims.V);
    return m;
}

cpu_model *cpu_model_create(const param_table *t, int64_t B, int64_t T) {
    return cpu_model_create_recompute(t, B, T, RECOMPUTE_OFF);
}

// Floats of the layer activations a layer with `mode` keeps for its backward (full: none);
// with scratch, what the shared scratch of the mode holds instead.
static int64_t plan_layer_floats(const model_dims *d, bool qk_norm, recompute_mode mode, bool scratch) {
    int64_t N = d->N;
    int64_t norms = 2 * (N * d->C + N);                                  // attn_in, mlp_in and 1/rms
    int64_t qk_rstd = qk_norm ? N * (d->Hq + d->Hkv) : 0;
    int64_t projections = N * (d->QD + d->KD);                           // q_raw, k_raw
    int64_t roped = N * (d->QD + d->KD);                                 // q, k after QK-norm and RoPE
    int64_t products = N * d->C + N * d->KD + N * d->QD + N * d->Hq + 2 * N * d->F;  // resid_mid v att lse gate up
    int64_t act = N * d->F;
    int64_t all = products + norms + qk_rstd + (qk_norm ? projections : 0) + roped + act;
    if (scratch) {
        if (mode == RECOMPUTE_FULL) return all;
        if (mode == RECOMPUTE_SELECTIVE) return norms + qk_rstd + roped + act;
        return 0;
    }
    if (mode == RECOMPUTE_FULL) return 0;
    if (mode == RECOMPUTE_SELECTIVE) return products + projections;
    return all;
}

// The part of the plan no recomputation changes: the RoPE tables, the tokens' segment starts
// and positions, the backward's scratch (shared by the layers) and a chunk of logits.
static int64_t plan_workspace_floats(const model_dims *d) {
    int64_t N = d->N;
    int64_t floats = d->T * d->D;                                                // RoPE tables
    floats += 2 * N;                                                             // start, pos
    floats += 3 * N * d->C + 2 * N * d->QD + 2 * N * d->KD + 3 * N * d->F;       // backward scratch
    floats += max_i64(1, min_i64(N, (1 << 24) / d->V)) * d->V;                   // a chunk of logits
    return floats;
}

// 64-byte rounding of each buffer (alloc_floats) is left out: under 64 bytes a buffer.
int64_t cpu_model_plan_bytes(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    model_dims d = model_dims_of(&t->cfg, B, T);
    bool qk = t->cfg.qk_norm;
    int64_t N = d.N;
    int64_t floats = plan_workspace_floats(&d);
    floats += (d.L + 1) * N * d.C;                                        // the layers' inputs and the output
    for (int64_t l = 0; l < d.L; l++) floats += plan_layer_floats(&d, qk, recompute_of_layer(recompute, l), false);
    floats += plan_layer_floats(&d, qk, recompute.mode, true);
    floats += N * d.C + N;                                                // final norm and its 1/rms
    return floats * (int64_t)sizeof(float);
}

int64_t cpu_model_plan_workspace_bytes(const param_table *t, int64_t B, int64_t T) {
    model_dims d = model_dims_of(&t->cfg, B, T);
    return plan_workspace_floats(&d) * (int64_t)sizeof(float);
}

void cpu_model_free(cpu_model *m) {
    if (!m) return;
    for (int i = 0; i < m->owned_count; i++) {
        free(m->owned[i]);
        m->live_bytes -= m->owned_bytes[i];
    }
    free(m->owned);
    free(m->owned_bytes);
    free(m->resid);
    free(m->layers);
    shard_map_free(&m->units);
    free(m);
}

int64_t cpu_model_activation_bytes(const cpu_model *m) { return m->live_bytes; }
int64_t cpu_model_activation_peak_bytes(const cpu_model *m) { return m->peak_bytes; }

// A tensor inside its unit's buffer (weights or gradients), given the unit's base pointer.
static float *in_unit(const cpu_model *m, const float *base, param_kind kind, int layer) {
    if (kind == P_LM_HEAD && m->table->cfg.tie_embeddings) kind = P_EMBED;
    const param_info *p = param_find(m->table, kind, layer);
    int u = shard_unit_of(&m->units, kind, layer);
    return (float *)base + (p->offset - m->units.units[u].start);
}

#define W(kind, layer) in_unit(m, w, kind, layer)
#define G(kind, layer) in_unit(m, g, kind, layer)

// q and k for attention from the projections: QK-norm (or, without it, a copy of the kept
// projections), then RoPE in place. Without qk_norm and without kept projections the
// products went straight to q and k and only RoPE is left.
static void queries_keys(cpu_model *m, const float *w, int l, layer_acts *a, int64_t N) {
    const model_config *c = &m->table->cfg;
    int64_t Hq = m->dims.Hq, Hkv = m->dims.Hkv, D = m->dims.D;
    if (c->qk_norm) {
        rmsnorm_forward(a->q, a->q_rstd, a->q_raw, W(P_Q_NORM, l), N * Hq, D, m->eps);
        rmsnorm_forward(a->k, a->k_rstd, a->k_raw, W(P_K_NORM, l), N * Hkv, D, m->eps);
    } else if (a->q_raw) {
        memcpy(a->q, a->q_raw, (size_t)(N * Hq * D) * sizeof(float));
        memcpy(a->k, a->k_raw, (size_t)(N * Hkv * D) * sizeof(float));
    }
    if (layer_uses_rope(c, l)) {
        rope_forward(a->q, m->pos, m->rope_cos, m->rope_sin, N, Hq, D);
        rope_forward(a->k, m->pos, m->rope_cos, m->rope_sin, N, Hkv, D);
    }
}

// Layer l's forward from resid[l] into its layer_acts; with output, resid[l + 1] too (a
// full recomputation leaves it: the backward does not read it, and it is already there).
static void layer_forward(cpu_model *m, const float *w, int l, int64_t B, int64_t T, bool output) {
    int64_t N = B * T, C = m->dims.C, F = m->dims.F, Hq = m->dims.Hq, Hkv = m->dims.Hkv, D = m->dims.D;
    layer_acts *a = &m->layers[l];
    const float *x = m->resid[l];
    rmsnorm_forward(a->attn_in, a->attn_rstd, x, W(P_ATTN_NORM, l), N, C, m->eps);
    matmul_forward(a->q_raw ? a->q_raw : a->q, a->attn_in, W(P_WQ, l), N, C, Hq * D, false);
    matmul_forward(a->k_raw ? a->k_raw : a->k, a->attn_in, W(P_WK, l), N, C, Hkv * D, false);
    matmul_forward(a->v, a->attn_in, W(P_WV, l), N, C, Hkv * D, false);
    queries_keys(m, w, l, a, N);
    attention_forward(a->att, a->lse, a->q, a->k, a->v, m->start, B, T, Hq, Hkv, D);
    memcpy(a->resid_mid, x, (size_t)(N * C) * sizeof(float));
    matmul_forward(a->resid_mid, a->att, W(P_WO, l), N, Hq * D, C, true);
    rmsnorm_forward(a->mlp_in, a->mlp_rstd, a->resid_mid, W(P_MLP_NORM, l), N, C, m->eps);
    matmul_forward(a->gate, a->mlp_in, W(P_W_GATE, l), N, C, F, false);
    matmul_forward(a->up, a->mlp_in, W(P_W_UP, l), N, C, F, false);
    swiglu_forward(a->act, a->gate, a->up, N, F);
    if (output) {
        memcpy(m->resid[l + 1], a->resid_mid, (size_t)(N * C) * sizeof(float));
        matmul_forward(m->resid[l + 1], a->act, W(P_W_DOWN, l), N, F, C, true);
    }
    if (a->recompute != RECOMPUTE_NONE) m->scratch_layer = l;
}

// Before layer l's backward: what it did not keep, into the scratch, by the forward's own
// kernels on the same inputs (so the same bits). The weights are the backward's (held).
static void layer_recompute(cpu_model *m, const float *w, int l, int64_t B, int64_t T) {
    layer_acts *a = &m->layers[l];
    if (a->recompute == RECOMPUTE_NONE || m->scratch_layer == l) return;  // kept, or still there
    if (a->recompute == RECOMPUTE_FULL) {
        layer_forward(m, w, l, B, T, false);
        return;
    }
    int64_t N = B * T, C = m->dims.C;
    rmsnorm_forward(a->attn_in, a->attn_rstd, m->resid[l], W(P_ATTN_NORM, l), N, C, m->eps);
    queries_keys(m, w, l, a, N);
    rmsnorm_forward(a->mlp_in, a->mlp_rstd, a->resid_mid, W(P_MLP_NORM, l), N, C, m->eps);
    swiglu_forward(a->act, a->gate, a->up, N, m->dims.F);
    m->scratch_layer = l;
}

// Runs the blocks and the final norm; leaves final_out ready for the classifier.
static void forward_blocks(cpu_model *m, cpu_units *u, const int32_t *inputs, int64_t B, int64_t T,
                           bool backward_follows) {
    CHECK(B * T <= m->dims.N && T <= m->dims.T);
    const model_config *c = &m->table->cfg;
    int64_t N = B * T, C = m->dims.C;
    for (int64_t i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= m->dims.V) fail("input token %d is outside the vocabulary (vocab_size %lld)",
                                                     inputs[i], (long long)m->dims.V);
    document_positions(m->start, m->pos, inputs, B, T, c->doc_masking, c->doc_token);
    m->scratch_layer = -1;
    int L = (int)m->dims.L;
    const float *w = u->acquire(u, 0);
    u->prefetch(u, 1);
    embedding_forward(m->resid[0], inputs, W(P_EMBED, -1), N, C);
    u->release(u, 0, false);  // the embedding's backward needs no weights (a tied head acquires again)
    for (int l = 0; l < L; l++) {
        w = u->acquire(u, 1 + l);
        u->prefetch(u, 2 + l);
        layer_forward(m, w, l, B, T, true);
        u->release(u, 1 + l, backward_follows);
    }
    w = u->acquire(u, L + 1);  // held by the caller until the classifier is done
    rmsnorm_forward(m->final_out, m->final_rstd, m->resid[L], W(P_FINAL_NORM, -1), N, C, m->eps);
}

// The unit of the LM head: the last, or the embedding's when tied.
static int head_unit(const cpu_model *m) { return shard_unit_of(&m->units, P_LM_HEAD, -1); }

// Classifier and loss over chunks of rows; with grads, also the head's backward into
// d_final and the head weight gradient. The final unit is held (forward_blocks); a tied
// head's unit is acquired here and released after.
static loss_sums classifier(cpu_model *m, cpu_units *u, bool with_grads, const int32_t *targets, int64_t N,
                            float grad_scale, float z_loss) {
    int H = head_unit(m);
    const float *w = u->acquire(u, H);  // the final unit again, or the embedding's
    const float *head = W(P_LM_HEAD, -1);
    float *g = with_grads ? u->grads(u, H) : NULL;
    float *dhead = with_grads ? G(P_LM_HEAD, -1) : NULL;
    loss_sums sums = {0, 0, N};
    for (int64_t r0 = 0; r0 < N; r0 += m->chunk_rows) {
        int64_t n = min_i64(m->chunk_rows, N - r0);
        for (int64_t i = r0; i < r0 + n; i++)
            if (targets[i] < 0 || targets[i] >= m->dims.V)
                fail("target token %d is outside the vocabulary (vocab_size %lld)", targets[i], (long long)m->dims.V);
        matmul_forward(m->logits, m->final_out + r0 * m->dims.C, head, n, m->dims.C, m->dims.V, false);
        cross_entropy_forward_backward(m->logits, targets + r0, n, m->dims.V, z_loss, with_grads ? grad_scale : 0.0f,
                                       &sums.ce_sum, &sums.lse_sq_sum);
        if (with_grads) {
            matmul_backward_input(m->d_final + r0 * m->dims.C, m->logits, head, n, m->dims.C, m->dims.V, false);
            matmul_backward_weight(dhead, m->logits, m->final_out + r0 * m->dims.C, n, m->dims.C, m->dims.V);
        }
    }
    u->release(u, H, false);  // the final unit: one reference less (acquired twice when untied)
    return sums;
}

// Backward from d_final; the final unit is still held from the forward pass.
static void backward_blocks(cpu_model *m, cpu_units *u, const int32_t *inputs, int64_t B, int64_t T) {
    const model_config *c = &m->table->cfg;
    int64_t N = B * T, C = m->dims.C, F = m->dims.F, Hq = m->dims.Hq, Hkv = m->dims.Hkv, D = m->dims.D;
    int L = (int)m->dims.L;
    const float *w = u->acquire(u, L + 1);
    float *g = u->grads(u, L + 1);
    u->prefetch(u, L);
    rmsnorm_backward(m->d_resid, G(P_FINAL_NORM, -1), m->d_final, m->resid[L], W(P_FINAL_NORM, -1),
                     m->final_rstd, N, C, false);
    u->grads_done(u, L + 1);
    u->release(u, L + 1, false);
    u->release(u, L + 1, false);  // forward_blocks' hold
    for (int l = L - 1; l >= 0; l--) {
        w = u->acquire(u, 1 + l);
        if (l > 0) u->prefetch(u, l);
        g = u->grads(u, 1 + l);
        layer_recompute(m, w, l, B, T);
        layer_acts *a = &m->layers[l];
        // MLP: resid_out = resid_mid + down(silu(gate(mlp_in)) ⊙ up(mlp_in))
        matmul_backward_input(m->d_act, m->d_resid, W(P_W_DOWN, l), N, F, C, false);
        matmul_backward_weight(G(P_W_DOWN, l), m->d_resid, a->act, N, F, C);
        swiglu_backward(m->d_gate, m->d_up, m->d_act, a->gate, a->up, N, F);
        matmul_backward_input(m->d_norm, m->d_gate, W(P_W_GATE, l), N, C, F, false);
        matmul_backward_input(m->d_norm, m->d_up, W(P_W_UP, l), N, C, F, true);
        matmul_backward_weight(G(P_W_GATE, l), m->d_gate, a->mlp_in, N, C, F);
        matmul_backward_weight(G(P_W_UP, l), m->d_up, a->mlp_in, N, C, F);
        rmsnorm_backward(m->d_resid, G(P_MLP_NORM, l), m->d_norm, a->resid_mid, W(P_MLP_NORM, l), a->mlp_rstd, N,
                         C, true);
        // Attention: resid_mid = resid_in + o(attention(q, k, v))
        matmul_backward_input(m->d_att, m->d_resid, W(P_WO, l), N, Hq * D, C, false);
        matmul_backward_weight(G(P_WO, l), m->d_resid, a->att, N, Hq * D, C);
        attention_backward(m->dq, m->dk, m->dv, m->d_att, a->att, a->lse, a->q, a->k, a->v, m->start, B, T, Hq,
                           Hkv, D);
        if (layer_uses_rope(c, l)) {
            rope_backward(m->dq, m->pos, m->rope_cos, m->rope_sin, N, Hq, D);
            rope_backward(m->dk, m->pos, m->rope_cos, m->rope_sin, N, Hkv, D);
        }
        if (c->qk_norm) {
            rmsnorm_backward(m->dq, G(P_Q_NORM, l), m->dq, a->q_raw, W(P_Q_NORM, l), a->q_rstd, N * Hq, D, false);
            rmsnorm_backward(m->dk, G(P_K_NORM, l), m->dk, a->k_raw, W(P_K_NORM, l), a->k_rstd, N * Hkv, D, false);
        }
        matmul_backward_input(m->d_norm, m->dq, W(P_WQ, l), N, C, Hq * D, false);
        matmul_backward_input(m->d_norm, m->dk, W(P_WK, l), N, C, Hkv * D, true);
        matmul_backward_input(m->d_norm, m->dv, W(P_WV, l), N, C, Hkv * D, true);
        matmul_backward_weight(G(P_WQ, l), m->dq, a->attn_in, N, C, Hq * D);
        matmul_backward_weight(G(P_WK, l), m->dk, a->attn_in, N, C, Hkv * D);
        matmul_backward_weight(G(P_WV, l), m->dv, a->attn_in, N, C, Hkv * D);
        rmsnorm_backward(m->d_resid, G(P_ATTN_NORM, l), m->d_norm, m->resid[l], W(P_ATTN_NORM, l), a->attn_rstd,
                         N, C, true);
        u->grads_done(u, 1 + l);
        u->release(u, 1 + l, false);
    }
    g = u->grads(u, 0);
    embedding_backward(G(P_EMBED, -1), inputs, m->d_resid, N, C);
    u->grads_done(u, 0);
}

loss_sums cpu_forward_backward_units(cpu_model *m, cpu_units *u, const int32_t *inputs, const int32_t *targets,
                                     int64_t B, int64_t T, float grad_scale, float z_loss) {
    forward_blocks(m, u, inputs, B, T, true);
    loss_sums sums = classifier(m, u, true, targets, B * T, grad_scale, z_loss);
    backward_blocks(m, u, inputs, B, T);
    return sums;
}

loss_sums cpu_forward_loss_units(cpu_model *m, cpu_units *u, const int32_t *inputs, const int32_t *targets,
                                 int64_t B, int64_t T) {
    forward_blocks(m, u, inputs, B, T, false);
    loss_sums sums = classifier(m, u, false, targets, B * T, 0.0f, 0.0f);
    u->release(u, (int)m->dims.L + 1, false);
    return sums;
}

void cpu_forward_last_logits_units(cpu_model *m, cpu_units *u, const int32_t *inputs, int64_t T, float *logits) {
    forward_blocks(m, u, inputs, 1, T, false);
    int H = head_unit(m);
    const float *w = u->acquire(u, H);
    matmul_forward(logits, m->final_out + (T - 1) * m->dims.C, W(P_LM_HEAD, -1), 1, m->dims.C, m->dims.V, false);
    u->release(u, H, false);
    u->release(u, (int)m->dims.L + 1, false);
}

// The whole model in the caller's flat buffers: a unit is its range of them, nothing moves.
typedef struct {
    cpu_units base;
    const shard_map *map;
    const float *params;
    float *grads;
} whole_units;

static const float *whole_acquire(cpu_units *u, int unit) {
    whole_units *x = (whole_units *)u;
    return x->params + x->map->units[unit].start;
}
static float *whole_grads(cpu_units *u, int unit) {
    whole_units *x = (whole_units *)u;
    return x->grads + x->map->units[unit].start;
}
static void whole_prefetch(cpu_units *u, int unit) {
    (void)u;
    (void)unit;
}
static void whole_release(cpu_units *u, int unit, bool backward_follows) {
    (void)u;
    (void)unit;
    (void)backward_follows;
}
static void whole_done(cpu_units *u, int unit) {
    (void)u;
    (void)unit;
}

static whole_units whole(const cpu_model *m, const float *params, float *grads) {
    whole_units x = {{whole_acquire, whole_prefetch, whole_release, whole_grads, whole_done}, &m->units, params, grads};
    return x;
}

loss_sums cpu_forward_backward(cpu_model *m, const float *params, float *grads, const int32_t *inputs,
                               const int32_t *targets, int64_t B, int64_t T, float grad_scale, float z_loss) {
    whole_units u = whole(m, params, grads);
    return cpu_forward_backward_units(m, &u.base, inputs, targets, B, T, grad_scale, z_loss);
}

loss_sums cpu_forward_loss(cpu_model *m, const float *params, const int32_t *inputs, const int32_t *targets,
                           int64_t B, int64_t T) {
    whole_units u = whole(m, params, NULL);
    return cpu_forward_loss_units(m, &u.base, inputs, targets, B, T);
}

void cpu_forward_last_logits(cpu_model *m, const float *params, const int32_t *inputs, int64_t T, float *logits) {
    whole_units u = whole(m, params, NULL);
    cpu_forward_last_logits_units(m, &u.base, inputs, T, logits);
}

void cpu_forward_logits(cpu_model *m, const float *params, const int32_t *inputs, int64_t B, int64_t T,
                        float *logits) {
    whole_units u = whole(m, params, NULL);
    forward_blocks(m, &u.base, inputs, B, T, false);
    const float *w = params + m->units.units[head_unit(m)].start;
    matmul_forward(logits, m->final_out, W(P_LM_HEAD, -1), B * T, m->dims.C, m->dims.V, false);
}
