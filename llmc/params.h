// llmc/params.h — the parameter table: every tensor of the model with its Hugging Face name,
// shape, place in one flat fp32 buffer, and flags (weight decay, matmul).
//
// Everything that walks over parameters iterates this table: the optimizer (decay flag),
// checkpoints (names, shapes), the PyTorch reference test, the gradient norm, and later
// FSDP sharding (offsets). Parameters, gradients and both AdamW moments all use the same
// flat layout, so "tensor i" is the range [offset, offset + numel) in each of them.
//
// Layout order: embedding; for each layer: input_layernorm, q, k, v, (q_norm, k_norm),
// o, post_attention_layernorm, gate, up, down; final norm; lm_head (untied only).
#ifndef TRAIN_GPT_MODEL_H
#define TRAIN_GPT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "llmc/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    P_EMBED,       // model.embed_tokens.weight           [V, C]
    P_ATTN_NORM,   // model.layers.l.input_layernorm      [C]
    P_WQ,          // self_attn.q_proj                    [Hq*D, C]
    P_WK,          // self_attn.k_proj                    [Hkv*D, C]
    P_WV,          // self_attn.v_proj                    [Hkv*D, C]
    P_Q_NORM,      // self_attn.q_norm                    [D]   (qk_norm only)
    P_K_NORM,      // self_attn.k_norm                    [D]   (qk_norm only)
    P_WO,          // self_attn.o_proj                    [C, Hq*D]
    P_MLP_NORM,    // post_attention_layernorm            [C]
    P_W_GATE,      // mlp.gate_proj                       [F, C]
    P_W_UP,        // mlp.up_proj                         [F, C]
    P_W_DOWN,      // mlp.down_proj                       [C, F]
    P_FINAL_NORM,  // model.norm.weight                   [C]
    P_LM_HEAD,     // lm_head.weight                      [V, C] (untied only)
    P_KIND_COUNT
} param_kind;

typedef struct {
    char name[96];
    param_kind kind;
    int layer;        // -1 for tensors outside the blocks
    int ndim;         // 1 or 2
    int64_t shape[2];
    int64_t numel;
    int64_t offset;   // elements into the flat buffers
    bool decay;       // AdamW weight decay applies (2-D weights except the embedding)
    bool matmul;      // takes part in a matrix product (counts in N of the FLOP formula)
} param_info;

typedef struct {
    model_config cfg;
    int count;
    param_info *params;
    int64_t numel;      // all parameters
    int *lookup;        // [(n_layer + 1) * P_KIND_COUNT] → index into params, or -1
} param_table;

void param_table_build(param_table *t, const model_config *cfg);
void param_table_free(param_table *t);
// The tensor of this kind in this layer (layer -1 for non-block tensors), or NULL.
const param_info *param_find(const param_table *t, param_kind kind, int layer);
// Pointer to that tensor inside a flat buffer (params, grads or moments).
float *param_ptr(const param_table *t, float *flat, param_kind kind, int layer);

// Whether layer l applies RoPE (false on NoPE layers).
bool layer_uses_rope(const model_config *m, int layer);

// The model's dimensions for micro-batches of up to B × T tokens, computed once from the
// config (model_dims_of) and shared by both backends.
typedef struct {
    int64_t B, T, N;        // rows, sequence length, token rows N = B·T
    int64_t C, F, V;        // d_model, d_ff, vocab_size
    int64_t Hq, Hkv, D, L;  // query heads, key/value heads, head_dim, layers
    int64_t QD, KD, QKV;    // Hq·D, Hkv·D, and QD + 2·KD (the stacked q|k|v product)
} model_dims;
model_dims model_dims_of(const model_config *m, int64_t B, int64_t T);

// Normal(0, init_std) for matrices, 1 for norm gains. Each tensor draws from its own
// stream seeded by (seed, tensor index), so the result does not depend on thread count.
void param_init(const param_table *t, float *params, uint64_t seed);

// N of the PaLM formula: parameters in matrix products, the LM head counted once
// (tied or not); the embedding lookup is not a product.
int64_t model_matmul_params(const param_table *t);
// 6·N + 12·L·Hq·D·T (PaLM, appendix B; no causal halving).
double model_flops_per_token(const param_table *t);

#ifdef __cplusplus
}
#endif

#endif
