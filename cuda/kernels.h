// cuda/kernels.h — the launchers of every kernel of the CUDA backend, one section per file
// under cuda/, each with its tensor shapes. train_gpt.cu's GPU section builds the model from them and
// test/test_gpu_kernels.cu checks each against its CPU reference in cpu/ops.c.
//
// Precision (docs/cuda.md): activations and matmul weights are bf16; everything that
// accumulates is fp32 (the residual stream, the norms' statistics, the gradients of the
// parameters, softmax sums, the AdamW state). N = B·T token rows; all tensors row-major.
// No launcher synchronizes with the host; each takes its stream last.
#ifndef TRAIN_GPT_CUDA_KERNELS_H
#define TRAIN_GPT_CUDA_KERNELS_H

#include "cuda/common.cuh"

// ---------------------------------------------------------------- matmul.cu
// All matrix products go through cuBLASLt: bf16 inputs, fp32 accumulation, bf16 or fp32
// outputs. The algorithm of each distinct problem (shapes, leading dimensions, types,
// pointer alignment, beta) is chosen once by cuBLASLt's heuristic and cached with its
// descriptors; later calls of that shape only launch.
typedef struct matmul_context matmul_context;
matmul_context *matmul_create(void);
void matmul_destroy(matmul_context *mc);
// Distinct shapes seen so far (for the tests: the cache must stop growing after step 1).
int matmul_cached_shapes(const matmul_context *mc);

// out (rows, n_out; row stride ld_out) = inp (rows, n_in) · W (n_out, n_in)ᵀ  [+ add]
// out_type CUDA_R_16BF or CUDA_R_32F; add (rows, n_out; ld_out) is fp32 and only with an
// fp32 out (the residual stream: out = add + inp·Wᵀ, add may equal out).
void matmul_forward(matmul_context *mc, void *out, cudaDataType_t out_type, int64_t ld_out, const float *add,
                    const bf16 *inp, const bf16 *W, int64_t rows, int64_t n_in, int64_t n_out, cudaStream_t stream);
// dinp (rows, n_in) = [dinp +] dout (rows, n_out; row stride ld_dout) · W (n_out, n_in)
void matmul_backward_input(matmul_context *mc, void *dinp, cudaDataType_t dinp_type, const bf16 *dout,
                           int64_t ld_dout, const bf16 *W, int64_t rows, int64_t n_in, int64_t n_out,
                           bool accumulate, cudaStream_t stream);
// dW (n_out, n_in) fp32 += dout (rows, n_out; row stride ld_dout)ᵀ · inp (rows, n_in)
void matmul_backward_weight(matmul_context *mc, float *dW, const bf16 *dout, int64_t ld_dout, const bf16 *inp,
                            int64_t rows, int64_t n_in, int64_t n_out, cudaStream_t stream);

// ---------------------------------------------------------------- embedding.cu
// out (N,C) fp32 = E[tokens] ; E (V,C) fp32 (the master weights: the residual stream
// starts exact), tokens (N)
void embedding_forward(float *out, const int32_t *tokens, const float *E, int64_t N, int64_t C,
                       cudaStream_t stream);
// Deterministic backward without atomics. On the host, embedding_buckets() groups the
// positions of each distinct token (tokens in order of first appearance, positions
// ascending within a token); on the GPU one block column per (token, 256 columns) sums its rows in that
// order and adds the sum to dE once.
// unique (U), offsets (U+1), positions (N) are written; counts (V) must be zero on entry
// and is zero again on return. Returns U.
int64_t embedding_buckets(int32_t *unique, int32_t *offsets, int32_t *positions, const int32_t *tokens, int64_t N,
                          int32_t *counts);
// dE (V,C) += Σ_{n: tokens[n] = v} dout[n] ; dout (N,C) fp32, buckets as above (device)
void embedding_backward(float *dE, const float *dout, const int32_t *unique, const int32_t *offsets,
                        const int32_t *positions, int64_t num_unique, int64_t C, cudaStream_t stream);

// ---------------------------------------------------------------- rmsnorm.cu
// out (N,C) bf16 = inp / sqrt(mean(inp²) + eps) ⊙ g ; inp (N,C) fp32 (residual stream),
// g (C) fp32, rstd (N) fp32 kept for the backward. A row is read once (C ≤ 8192).
void rmsnorm_forward(bf16 *out, float *rstd, const float *inp, const float *g, int64_t N, int64_t C, float eps,
                     cudaStream_t stream);
// dinp (N,C) fp32 (+)= ∂/∂inp of dout (N,C) fp32; dinp_bf16 (N,C), if not NULL, receives a
// bf16 copy of the new dinp (the next matmuls' input); dg (C) += Σ_rows dout·inp·rstd, the
// gain's gradient, deterministically (partial sums over fixed chunks of rows in scratch,
// rmsnorm_gain_scratch_floats of them, summed per column in chunk order). Fused: one pass
// reads dout, inp and the old dinp, writes both copies of dinp and the chunks' gain sums.
void rmsnorm_backward(float *dinp, bf16 *dinp_bf16, float *dg, float *scratch, const float *dout, const float *inp,
                      const float *g, const float *rstd, int64_t N, int64_t C, bool accumulate, cudaStream_t stream);
int64_t rmsnorm_gain_scratch_floats(int64_t N, int64_t C);
// dg (C) += Σ over chunks of partial (chunks, C), per column, in a fixed order (32 threads
// per column, then their 32 sums in order): the last step of every gain gradient.
void column_sums_add(float *dg, const float *partial, int64_t chunks, int64_t C, cudaStream_t stream);

// ---------------------------------------------------------------- qknorm_rope.cu
// q and k sit side by side in each row: heads 0..Hq-1 are q, Hq..Hq+Hkv-1 are k, D each.
// Per head: y = rmsnorm(x) ⊙ g (g = gq for q heads, gk for k heads) when `norm`, then the
// rotate-half RoPE at position pos[n] when `rope`. NoPE layers pass rope = false.
// What every call applies:
typedef struct {
    const float *gq, *gk;        // the QK-norm gains (D each), when norm
    const int32_t *pos;          // (N) each row's position in its document
    const float *cos_t, *sin_t;  // (T, D/2) RoPE tables
    int64_t N;                   // rows
    int Hq, Hkv, D;
    bool norm, rope;
    float eps;                   // the norm's epsilon (forward only)
} qknorm_rope_args;
// out (N, rows of out_stride) bf16, inp (N, rows of in_stride) bf16 (out may equal inp
// with the same stride), rstd (N, Hq+Hkv) fp32 (written when norm).
void qknorm_rope_forward(const qknorm_rope_args *a, bf16 *out, int64_t out_stride, float *rstd, const bf16 *inp,
                         int64_t in_stride, cudaStream_t stream);
// dx = ∂/∂inp from dy (∂/∂out); dx may equal dy (in place, same stride). x is the
// forward's inp and rstd its statistics (both needed when norm, else NULL).
void qknorm_rope_backward(const qknorm_rope_args *a, bf16 *dx, int64_t dx_stride, const bf16 *dy, int64_t dy_stride,
                          const bf16 *x, int64_t x_stride, const float *rstd, cudaStream_t stream);
// dg (D) += Σ over rows n and heads h0..h0+H-1 (the q heads: 0, Hq; the k heads: Hq, Hkv)
// of (RoPE⁻¹ dy)·x·rstd, deterministically. Must run before an in-place
// qknorm_rope_backward (it reads dy).
int64_t qknorm_gain_scratch_floats(int64_t N, int H, int D);
void qknorm_gain_grad(const qknorm_rope_args *a, int h0, int H, float *dg, float *scratch, const bf16 *dy,
                      int64_t dy_stride, const bf16 *x, int64_t x_stride, const float *rstd, cudaStream_t stream);

// ---------------------------------------------------------------- swiglu.cu
// act (N,F) = silu(gate) ⊙ up ; gate_up (N,2F): gate = columns [0,F), up = [F,2F)
// (one matmul makes both: gate_proj and up_proj are adjacent in the parameter table)
void swiglu_forward(bf16 *act, const bf16 *gate_up, int64_t N, int64_t F, cudaStream_t stream);
// d_gate_up (N,2F) from dact (N,F) and the forward's gate_up
void swiglu_backward(bf16 *d_gate_up, const bf16 *dact, const bf16 *gate_up, int64_t N, int64_t F,
                     cudaStream_t stream);

// ---------------------------------------------------------------- attention.cu
// Causal attention with native GQA and document masking, flash-attention style: bf16
// tensor-core products (WMMA), fp32 softmax and accumulation, no T×T matrix in memory.
// Query head j reads kv head j / (Hq/Hkv). Tiles of keys that no query of a tile can see
// (before the tile's first document start, or after its last query) are skipped.
// The inputs of one call:
typedef struct {
    const bf16 *q, *k, *v;                 // (N, rows of their stride): q head j at j·D, kv head g at g·D
    int64_t q_stride, k_stride, v_stride;  // elements between rows
    const int32_t *start;                  // (N) position t sees keys [start[t], t]
    int64_t B, T;
    int Hq, Hkv, D;
} attention_inputs;
// Where the backward writes dq, dk, dv (same layouts as q, k, v): written, not accumulated.
typedef struct {
    bf16 *dq, *dk, *dv;
    int64_t dq_stride, dk_stride, dv_stride;
} attention_grads;
bool attention_supports_head_dim(int D);   // 32, 64, 128 (HIP: any even D ≤ 256, see below)
// Whether attention_forward / attention_backward run the MFMA kernels (cuda/attention_mfma.cuh)
// for head_dim 32, 64 and 128: a HIP build on a GPU with v_mfma_f32_16x16x16bf16_1k (gfx90a,
// gfx94x, gfx950; asked once), and the emulator at 64-wide wavefronts. False on NVIDIA.
bool attention_mfma_available(void);
// out (N, Hq·D) bf16, lse (B, Hq, T) fp32.
void attention_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream);
// From the forward's out and lse and the gradient dout (N, Hq·D). Deterministic without
// atomics: one kernel owns each query tile (dq), another each key tile of a kv head and
// loops over that head's query heads (dk, dv: GQA's sum over the group in a fixed order).
// delta (B, Hq, T) fp32 scratch.
void attention_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                        const attention_grads *g, float *delta, cudaStream_t stream);

// The same two functions with the softmax in registers (cuda/attention_fa2.cuh: mma.sync,
// ldmatrix, cp.async double buffering; FlashAttention-2's structure, deterministic backward).
// TRAIN_GPT_ATTENTION=fa2 makes the model use them. Checked on the CPU by `make test` through
// test/warp_emu.h; not yet run on a GPU, so not the default (docs/cuda.md). Under HIP these
// are attention_forward / attention_backward (the MFMA kernels) again.
void attention_fa2_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream);
void attention_fa2_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                            const attention_grads *g, float *delta, cudaStream_t stream);

// ---------------------------------------------------------------- attention_simple.cu
// The same two functions, one warp per row and fp32 arithmetic, no tensor cores: slow,
// plainly correct, any even D ≤ 256. The tests check the fast kernels against the CPU and
// against these; TRAIN_GPT_ATTENTION=simple makes the model use them. Under HIP (AMD),
// attention_forward / attention_backward are the MFMA kernels of cuda/attention_mfma.cuh for
// head_dim 32, 64 and 128, and these for any other.
void attention_simple_forward(const attention_inputs *in, bf16 *out, float *lse, cudaStream_t stream);
void attention_simple_backward(const attention_inputs *in, const bf16 *out, const float *lse, const bf16 *dout,
                               const attention_grads *g, float *delta, cudaStream_t stream);

// ---------------------------------------------------------------- classifier.cu
// Cross-entropy + z-loss over a chunk of rows: logits (n, V; row stride ld) bf16 from the
// chunk's matmul, targets (n). Per row: lse = logsumexp, ce = lse − logit[target], into
// row_ce, row_lse (n) fp32. With `train`, each logit is overwritten (bf16, in place) by its
// gradient of grad_scale·(ce + z_loss·lse²):
//   (softmax·(1 + 2·z_loss·lse) − onehot)·grad_scale
// One block per row, 16-byte accesses where logits is 16-byte aligned and ld a multiple of 8.
void cross_entropy_forward_backward(bf16 *logits, float *row_ce, float *row_lse, const int32_t *targets, int64_t n,
                                    int64_t V, int64_t ld, float z_loss, float grad_scale, bool train,
                                    cudaStream_t stream);
// sums[0] += Σ row_ce, sums[1] += Σ row_lse² over N rows, in double, one block in a fixed
// order (deterministic).
void loss_sums_accumulate(double *sums, const float *row_ce, const float *row_lse, int64_t N, cudaStream_t stream);

// ---------------------------------------------------------------- adamw.cu
// The optimizer's side of a step, without a host round trip: the global gradient norm
// (fixed-grid partial sums, then one block in fixed order), the outlier guard (a
// non-finite loss or norm skips the update), the clipping factor, AdamW's bias
// corrections from its device-side step count, then one fused AdamW pass over the flat
// parameter table that also writes the bf16 copy and zeroes the gradients.
typedef struct {
    double ce_sum, lse_sq_sum;   // Σ over the step's rows (loss_sums_accumulate adds to these)
    double grad_norm;            // global L2 norm before clipping
    double clip_coef;            // the factor applied to the gradients (1 = none)
    int64_t adam_step;           // AdamW's t after this step
    int32_t skipped;             // 1: the outlier guard skipped the update (NaN/Inf); 2: a spike
    float clip_scale;            // clip_coef as applied (float)
    float step_size;             // lr / (1 − β1^t)
    float bias2_sqrt;            // sqrt(1 − β2^t)
} step_scalars;

// A contiguous piece of one tensor: the unit of work of one AdamW block.
typedef struct {
    int64_t start;
    int32_t count;
    int32_t decay;
} adamw_chunk;
enum { ADAMW_CHUNK_ELEMS = 8192, GRAD_NORM_BLOCKS = 1024 };

// partials (GRAD_NORM_BLOCKS) = Σ g² over fixed slices of grads (n)
void grad_norm_partials(double *partials, const float *grads, int64_t n, cudaStream_t stream);
// One thread: norm, guard, clip factor, t and the bias corrections into *st.
// rows = tokens of the step; z_loss, max_norm (grad_clip; ≤ 0 = no clipping), lr, betas;
// spike_loss, spike_norm: the spike guard's limits (llmc/guard.h; +inf = none).
void step_prepare(step_scalars *st, const double *partials, double rows, double z_loss, double max_norm, double lr,
                  double beta1, double beta2, double spike_loss, double spike_norm, cudaStream_t stream);
// params (n) fp32, params_bf16 (n), grads (n, zeroed on return), m, v (n) over chunks
// (num_chunks). A skipped step (st->skipped) only zeroes the gradients.
// The element-wise math is llmc/optim.c's: fp32, with (1 − β) rounded to float on the host.
typedef struct {
    float keep_decay;            // 1 − lr·weight_decay, for chunks with decay
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
} adamw_hparams;
void adamw_update(float *params, bf16 *params_bf16, float *grads, float *m, float *v, const adamw_chunk *chunks,
                  int64_t num_chunks, const step_scalars *st, adamw_hparams hp, cudaStream_t stream);
// out (n) bf16 = in (n) fp32, round to nearest even
void floats_to_bf16(bf16 *out, const float *in, int64_t n, cudaStream_t stream);

#endif
