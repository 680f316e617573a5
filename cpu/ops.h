// cpu/ops.h — every operation of the model, forward and backward, in fp32 on the CPU.
//
// These are the reference implementations: the CPU backend is built from them, the
// PyTorch test checks them, and every GPU kernel is tested against them. Each is written
// to be plainly correct first and reasonably fast second (OpenMP, loops that vectorize).
//
// Conventions: N = B·T token rows; shapes are in the comment next to each signature,
// row-major, last index fastest. Backward functions *accumulate* into parameter
// gradients (dg, dE) — gradient accumulation over micro-batches relies on it — and write
// or accumulate activation gradients as their `accumulate` flag says.
//
// Determinism: every reduction has a fixed order that does not depend on the number of
// threads (work is split over rows or over columns, never summed across threads), so
// these ops give the same bits for the same inputs on any thread count.
#ifndef TRAIN_GPT_CPU_OPS_H
#define TRAIN_GPT_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// out (N,C) = E[tokens] ; E (V,C), tokens (N)
void embedding_forward(float *out, const int32_t *tokens, const float *E, int64_t N, int64_t C);
// dE (V,C) += scatter of dout (N,C) by tokens (N)
void embedding_backward(float *dE, const int32_t *tokens, const float *dout, int64_t N, int64_t C);

// out (N,C) = inp / sqrt(mean(inp²) + eps) ⊙ g ; rstd (N) keeps 1/sqrt(...) for backward
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *g, int64_t N, int64_t C, float eps);
// dinp (N,C) (+)= ∂/∂inp ; dg (C) += ∂/∂g ; needs the forward's inp and rstd.
// dinp may be dout itself (in place) when accumulate is false.
void rmsnorm_backward(float *dinp, float *dg, const float *dout, const float *inp, const float *g,
                      const float *rstd, int64_t N, int64_t C, bool accumulate);

// Per-position document start (N) and RoPE position (N) from the input tokens (B,T).
// With doc_masking, a document starts at each s >= 1 where tokens[b,s] == doc_token;
// without it, start = 0 and position = t.
void document_positions(int32_t *start, int32_t *pos, const int32_t *tokens, int64_t B, int64_t T,
                        bool doc_masking, int64_t doc_token);

// cos/sin tables (T, D/2): angle(p, i) = p · theta^(-2i/D), computed in double.
void rope_tables(float *cos_t, float *sin_t, int64_t T, int64_t D, double theta);
// x (N, H, D), rotated in place by the rotate-half rule at positions pos (N)
void rope_forward(float *x, const int32_t *pos, const float *cos_t, const float *sin_t, int64_t N, int64_t H,
                  int64_t D);
// dx (N, H, D), the inverse rotation in place
void rope_backward(float *dx, const int32_t *pos, const float *cos_t, const float *sin_t, int64_t N, int64_t H,
                   int64_t D);

// out (N,F) = silu(gate) ⊙ up ; gate, up (N,F)
void swiglu_forward(float *out, const float *gate, const float *up, int64_t N, int64_t F);
// dgate, dup (N,F) from dout (N,F)
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t N,
                     int64_t F);

// Causal attention with GQA and document masking.
// out (B,T,Hq,D), lse (B,Hq,T) ; q (B,T,Hq,D), k,v (B,T,Hkv,D), start (B·T)
// Query head j reads kv head j / (Hq/Hkv); position t attends s in [start[t], t].
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int32_t *start, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D);
// dq (B,T,Hq,D), dk, dv (B,T,Hkv,D) written (not accumulated) from dout and the forward's out, lse
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int32_t *start, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, int64_t D);

// Cross-entropy + z-loss on a chunk of rows of logits (n,V), targets (n).
// Per row: lse = logsumexp(logits), ce = lse - logits[target].
// Adds Σ ce and Σ lse² (in double, row order) to *ce_sum and *lse_sq_sum.
// If grad_scale != 0, overwrites logits with the gradient of
//   grad_scale · (ce + z_loss · lse²):  (softmax · (1 + 2·z_loss·lse) - onehot) · grad_scale
void cross_entropy_forward_backward(float *logits, const int32_t *targets, int64_t n, int64_t V, float z_loss,
                                    float grad_scale, double *ce_sum, double *lse_sq_sum);

#ifdef __cplusplus
}
#endif

#endif
