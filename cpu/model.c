// cpu/model.c — forward and backward of the whole model on the CPU (see cpu/model.h).
//
// Saved for the backward pass, per layer: the residual stream entering the layer and
// after attention, both norm outputs and their 1/rms, q and k before and after QK-norm
// (before is needed by QK-norm's backward), q/k after RoPE, v, the attention output and
// its log-sum-exp, and the three SwiGLU tensors. Everything else is scratch shared by all
// layers.
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
    float *q_raw, *k_raw;         // (N,Hq·D), (N,Hkv·D) before QK-norm (qk_norm only)
    float *q_rstd, *k_rstd;       // (N·Hq), (N·Hkv)
    float *q, *k, *v;             // after QK-norm and RoPE
    float *att, *lse;             // (N,Hq·D), (B,Hq,T)
    float *mlp_in, *mlp_rstd;     // (N,C), (N)
    float *gate, *up, *act;       // (N,F)
} layer_acts;

struct cpu_model {
    const param_table *table;
    shard_map units;              // the units of one rank (llmc/shard.h): where each starts
    model_dims dims;              // llmc/params.h
    float eps;
    float *rope_cos, *rope_sin;   // (T, D/2)
    float **resid;                // L+1 buffers (N,C): resid[l] enters layer l
    layer_acts *layers;
    float *final_out, *final_rstd;
    int32_t *start, *pos;         // (N)
    // backward scratch
    float *d_resid, *d_norm, *d_att, *dq, *dk, *dv, *d_act, *d_gate, *d_up, *d_final;
    float *logits;                // (chunk_rows, V)
    int64_t chunk_rows;
    int64_t activation_floats;
    bool sizing_only;             // count the floats, allocate nothing (memory plans)
};

static float *take(cpu_model *m, int64_t count) {
    m->activation_floats += count;
    return m->sizing_only ? NULL : alloc_floats((size_t)count);
}

static cpu_model *create(const param_table *t, int64_t B, int64_t T, bool sizing_only) {
    const model_config *c = &t->cfg;
    CHECK(T <= c->seq_len);
    cpu_model *m = xcalloc(1, sizeof *m);
    m->sizing_only = sizing_only;
    m->table = t;
    shard_map_build(&m->units, t, 0, 1);
    m->dims = model_dims_of(c, B, T);
    m->eps = (float)c->norm_eps;
    int64_t N = m->dims.N, C = m->dims.C, F = m->dims.F, QD = m->dims.QD, KD = m->dims.KD;
    m->rope_cos = take(m, T * m->dims.D / 2);
    m->rope_sin = take(m, T * m->dims.D / 2);
    if (!sizing_only) rope_tables(m->rope_cos, m->rope_sin, T, m->dims.D, c->rope_theta);
    m->resid = xcalloc((size_t)m->dims.L + 1, sizeof *m->resid);
    for (int64_t l = 0; l <= m->dims.L; l++) m->resid[l] = take(m, N * C);
    m->layers = xcalloc((size_t)m->dims.L, sizeof *m->layers);
    for (int64_t l = 0; l < m->dims.L; l++) {
        layer_acts *a = &m->layers[l];
        a->resid_mid = take(m, N * C);
        a->attn_in = take(m, N * C);
        a->attn_rstd = take(m, N);
        if (c->qk_norm) {
            a->q_raw = take(m, N * QD);
            a->k_raw = take(m, N * KD);
            a->q_rstd = take(m, N * m->dims.Hq);
            a->k_rstd = take(m, N * m->dims.Hkv);
        }
        a->q = take(m, N * QD);
        a->k = take(m, N * KD);
        a->v = take(m, N * KD);
        a->att = take(m, N * QD);
        a->lse = take(m, N * m->dims.Hq);
        a->mlp_in = take(m, N * C);
        a->mlp_rstd = take(m, N);
        a->gate = take(m, N * F);
        a->up = take(m, N * F);
        a->act = take(m, N * F);
    }
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

cpu_model *cpu_model_create(const param_table *t, int64_t B, int64_t T) { return create(t, B, T, false); }

int64_t cpu_model_plan_bytes(const param_table *t, int64_t B, int64_t T) {
    cpu_model *m = create(t, B, T, true);
    int64_t bytes = cpu_model_activation_bytes(m);
    free(m->resid);
    free(m->layers);
    shard_map_free(&m->units);
    free(m);
    return bytes;
}

void cpu_model_free(cpu_model *m) {
    if (!m) return;
    for (int64_t l = 0; l <= m->dims.L; l++) free(m->resid[l]);
    free(m->resid);
    for (int64_t l = 0; l < m->dims.L; l++) {
        layer_acts *a = &m->layers[l];
        float *bufs[] = {a->resid_mid, a->attn_in, a->attn_rstd, a->q_raw, a->k_raw, a->q_rstd, a->k_rstd, a->q,
                         a->k, a->v, a->att, a->lse, a->mlp_in, a->mlp_rstd, a->gate, a->up, a->act};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    }
    free(m->layers);
    float *bufs[] = {m->rope_cos, m->rope_sin, m->final_out, m->final_rstd, m->d_resid, m->d_norm, m->d_final,
                     m->d_att, m->dq, m->dk, m->dv, m->d_act, m->d_gate, m->d_up, m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->start);
    free(m->pos);
    shard_map_free(&m->units);
    free(m);
}

int64_t cpu_model_activation_bytes(const cpu_model *m) { return m->activation_floats * (int64_t)sizeof(float); }

// A tensor inside its unit's buffer (weights or gradients), given the unit's base pointer.
static float *in_unit(const cpu_model *m, const float *base, param_kind kind, int layer) {
    if (kind == P_LM_HEAD && m->table->cfg.tie_embeddings) kind = P_EMBED;
    const param_info *p = param_find(m->table, kind, layer);
    int u = shard_unit_of(&m->units, kind, layer);
    return (float *)base + (p->offset - m->units.units[u].start);
}

#define W(kind, layer) in_unit(m, w, kind, layer)
#define G(kind, layer) in_unit(m, g, kind, layer)

// Runs the blocks and the final norm; leaves final_out ready for the classifier.
static void forward_blocks(cpu_model *m, cpu_units *u, const int32_t *inputs, int64_t B, int64_t T,
                           bool backward_follows) {
    CHECK(B * T <= m->dims.N && T <= m->dims.T);
    const model_config *c = &m->table->cfg;
    int64_t N = B * T, C = m->dims.C, F = m->dims.F, Hq = m->dims.Hq, Hkv = m->dims.Hkv, D = m->dims.D;
    for (int64_t i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= m->dims.V) fail("input token %d is outside the vocabulary (vocab_size %lld)",
                                                     inputs[i], (long long)m->dims.V);
    document_positions(m->start, m->pos, inputs, B, T, c->doc_masking, c->doc_token);
    int L = (int)m->dims.L;
    const float *w = u->acquire(u, 0);
    u->prefetch(u, 1);
    embedding_forward(m->resid[0], inputs, W(P_EMBED, -1), N, C);
    u->release(u, 0, false);  // the embedding's backward needs no weights (a tied head acquires again)
    for (int l = 0; l < L; l++) {
        w = u->acquire(u, 1 + l);
        u->prefetch(u, 2 + l);
        layer_acts *a = &m->layers[l];
        float *x = m->resid[l];
        rmsnorm_forward(a->attn_in, a->attn_rstd, x, W(P_ATTN_NORM, l), N, C, m->eps);
        if (c->qk_norm) {
            matmul_forward(a->q_raw, a->attn_in, W(P_WQ, l), N, C, Hq * D, false);
            matmul_forward(a->k_raw, a->attn_in, W(P_WK, l), N, C, Hkv * D, false);
            rmsnorm_forward(a->q, a->q_rstd, a->q_raw, W(P_Q_NORM, l), N * Hq, D, m->eps);
            rmsnorm_forward(a->k, a->k_rstd, a->k_raw, W(P_K_NORM, l), N * Hkv, D, m->eps);
        } else {
            matmul_forward(a->q, a->attn_in, W(P_WQ, l), N, C, Hq * D, false);
            matmul_forward(a->k, a->attn_in, W(P_WK, l), N, C, Hkv * D, false);
        }
        matmul_forward(a->v, a->attn_in, W(P_WV, l), N, C, Hkv * D, false);
        if (layer_uses_rope(c, l)) {
            rope_forward(a->q, m->pos, m->rope_cos, m->rope_sin, N, Hq, D);
            rope_forward(a->k, m->pos, m->rope_cos, m->rope_sin, N, Hkv, D);
        }
        attention_forward(a->att, a->lse, a->q, a->k, a->v, m->start, B, T, Hq, Hkv, D);
        memcpy(a->resid_mid, x, (size_t)(N * C) * sizeof(float));
        matmul_forward(a->resid_mid, a->att, W(P_WO, l), N, Hq * D, C, true);
        rmsnorm_forward(a->mlp_in, a->mlp_rstd, a->resid_mid, W(P_MLP_NORM, l), N, C, m->eps);
        matmul_forward(a->gate, a->mlp_in, W(P_W_GATE, l), N, C, F, false);
        matmul_forward(a->up, a->mlp_in, W(P_W_UP, l), N, C, F, false);
        swiglu_forward(a->act, a->gate, a->up, N, F);
        memcpy(m->resid[l + 1], a->resid_mid, (size_t)(N * C) * sizeof(float));
        matmul_forward(m->resid[l + 1], a->act, W(P_W_DOWN, l), N, F, C, true);
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
