// llmc/params.c — builds the parameter table (see llmc/params.h), initializes weights, counts FLOPs.
#include "llmc/params.h"
#include "llmc/common.h"
#include "llmc/rng.h"

#include <stdlib.h>
#include <string.h>

static void add_param(param_table *t, int *capacity, param_kind kind, int layer, const char *name, int64_t rows,
                      int64_t cols) {
    if (t->count == *capacity) {
        *capacity = *capacity ? *capacity * 2 : 64;
        t->params = xrealloc(t->params, (size_t)*capacity * sizeof *t->params);
    }
    param_info *p = &t->params[t->count];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->numel = rows * (cols > 0 ? cols : 1);
    p->offset = t->numel;
    // Decay only 2-D weights, and never the embedding (nor, being the same tensor, a tied head).
    p->decay = p->ndim == 2 && kind != P_EMBED;
    p->matmul = p->ndim == 2 && kind != P_EMBED;
    t->numel += p->numel;
    int slot = (layer + 1) * P_KIND_COUNT + (int)kind;
    t->lookup[slot] = t->count;
    t->count++;
}

void param_table_build(param_table *t, const model_config *m) {
    memset(t, 0, sizeof *t);
    t->cfg = *m;
    int L = (int)m->n_layer;
    int64_t C = m->d_model, V = m->vocab_size, F = m->d_ff, D = m->head_dim;
    int64_t q_dim = m->n_head * D, kv_dim = m->n_kv_head * D;
    size_t slots = (size_t)(L + 1) * P_KIND_COUNT;
    t->lookup = xmalloc(slots * sizeof *t->lookup);
    for (size_t i = 0; i < slots; i++) t->lookup[i] = -1;
    int capacity = 0;
    char name[96];
    add_param(t, &capacity, P_EMBED, -1, "model.embed_tokens.weight", V, C);
    for (int l = 0; l < L; l++) {
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
        add_param(t, &capacity, P_ATTN_NORM, l, LAYER_NAME("input_layernorm.weight"), C, 0);
        add_param(t, &capacity, P_WQ, l, LAYER_NAME("self_attn.q_proj.weight"), q_dim, C);
        add_param(t, &capacity, P_WK, l, LAYER_NAME("self_attn.k_proj.weight"), kv_dim, C);
        add_param(t, &capacity, P_WV, l, LAYER_NAME("self_attn.v_proj.weight"), kv_dim, C);
        if (m->qk_norm) {
            add_param(t, &capacity, P_Q_NORM, l, LAYER_NAME("self_attn.q_norm.weight"), D, 0);
            add_param(t, &capacity, P_K_NORM, l, LAYER_NAME("self_attn.k_norm.weight"), D, 0);
        }
        add_param(t, &capacity, P_WO, l, LAYER_NAME("self_attn.o_proj.weight"), C, q_dim);
        add_param(t, &capacity, P_MLP_NORM, l, LAYER_NAME("post_attention_layernorm.weight"), C, 0);
        add_param(t, &capacity, P_W_GATE, l, LAYER_NAME("mlp.gate_proj.weight"), F, C);
        add_param(t, &capacity, P_W_UP, l, LAYER_NAME("mlp.up_proj.weight"), F, C);
        add_param(t, &capacity, P_W_DOWN, l, LAYER_NAME("mlp.down_proj.weight"), C, F);
#undef LAYER_NAME
    }
    add_param(t, &capacity, P_FINAL_NORM, -1, "model.norm.weight", C, 0);
    if (!m->tie_embeddings) add_param(t, &capacity, P_LM_HEAD, -1, "lm_head.weight", V, C);
}

void param_table_free(param_table *t) {
    free(t->params);
    free(t->lookup);
    memset(t, 0, sizeof *t);
}

const param_info *param_find(const param_table *t, param_kind kind, int layer) {
    if (layer < -1 || layer >= t->cfg.n_layer) return NULL;
    int i = t->lookup[(layer + 1) * P_KIND_COUNT + (int)kind];
    return i < 0 ? NULL : &t->params[i];
}

float *param_ptr(const param_table *t, float *flat, param_kind kind, int layer) {
    if (kind == P_LM_HEAD && t->cfg.tie_embeddings) kind = P_EMBED;
    const param_info *p = param_find(t, kind, layer);
    return p ? flat + p->offset : NULL;
}

model_dims model_dims_of(const model_config *m, int64_t B, int64_t T) {
    model_dims d;
    d.B = B;
    d.T = T;
    d.N = B * T;
    d.C = m->d_model;
    d.F = m->d_ff;
    d.V = m->vocab_size;
    d.Hq = m->n_head;
    d.Hkv = m->n_kv_head;
    d.D = m->head_dim;
    d.L = m->n_layer;
    d.QD = d.Hq * d.D;
    d.KD = d.Hkv * d.D;
    d.QKV = d.QD + 2 * d.KD;
    return d;
}

bool layer_uses_rope(const model_config *m, int layer) {
    return !(m->nope_every > 0 && (layer + 1) % m->nope_every == 0);
}

void param_init(const param_table *t, float *params, uint64_t seed) {
    float std = (float)t->cfg.init_std;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        float *w = params + p->offset;
        if (p->ndim == 1) {
            for (int64_t j = 0; j < p->numel; j++) w[j] = 1.0f;
            continue;
        }
        rng_state r;
        rng_seed(&r, seed, (uint64_t)i + 1);
        for (int64_t j = 0; j < p->numel; j++) w[j] = (float)rng_normal(&r) * std;
    }
}

int64_t model_matmul_params(const param_table *t) {
    int64_t n = 0;
    for (int i = 0; i < t->count; i++)
        if (t->params[i].matmul && t->params[i].kind != P_LM_HEAD) n += t->params[i].numel;
    // The LM head is a matrix product whether or not its weights are the embedding's.
    return n + t->cfg.vocab_size * t->cfg.d_model;
}

double model_flops_per_token(const param_table *t) {
    const model_config *m = &t->cfg;
    double n = (double)model_matmul_params(t);
    return 6.0 * n + 12.0 * (double)m->n_layer * (double)m->n_head * (double)m->head_dim * (double)m->seq_len;
}
