// cuda/model.cu — the whole model on one GPU: forward, backward, the step (cuda/backend.h).
//
// The structure follows cpu/model.c line for line where it can, with three differences
// that make it fast on a GPU:
//   - fused matmuls: q/k/v projections are adjacent in the parameter table, and so are
//     gate/up, so each pair or triple is one (rows × stacked outputs) product, forward and
//     backward (the gradient of the stacked weight is the stacked gradients);
//   - residual adds fused into the matmul epilogues (out = resid + att·Woᵀ in one cuBLASLt
//     call, C ≠ D), on an fp32 residual stream;
//   - QK-norm + RoPE in one kernel reading the QKV product through a row stride.
//
// Precision: the matmul inputs (weights' bf16 copy, normalized activations, attention
// tensors, SwiGLU tensors, and the gradients flowing into matmuls) are bf16; the residual
// stream and its gradient, the norm inputs' gradients (d_norm), the logits, every
// statistic, every parameter gradient and the AdamW state are fp32. Norm gains and the
// embedding lookup read the fp32 master weights directly (they are not matmul inputs).
//
// Saved for the backward pass, per layer (as on the CPU): the residual entering the layer
// (fp32) and after attention (fp32), both norm outputs (bf16) and their 1/rms, the raw QKV
// product, q/k after QK-norm and RoPE, the attention output and its log-sum-exp, the
// gate/up product and the SwiGLU output. The rest is scratch shared by all layers.
//
// Host ↔ GPU traffic inside a step is one small copy per micro-batch (tokens, document
// starts and positions, the embedding backward's token buckets) through pinned slots, and
// one copy of the step's scalars back. See cuda/backend.h for what waits on what.
#include "cuda/kernels.h"

extern "C" {
#include "llmc/common.h"
#include "cpu/ops.h"
#include "cuda/backend.h"
}

#include <stdlib.h>
#include <string.h>

enum { INPUT_SLOTS = 2, RESULT_SLOTS = 8 };
// fp32 logits + bf16 gradient per classifier chunk, at most this many bytes.
static const int64_t LOGITS_CHUNK_BYTES = (int64_t)1 << 30;

typedef struct {
    float *resid_mid;          // (N,C) fp32, after the attention residual add
    bf16 *attn_in;             // (N,C)
    float *attn_rstd;          // (N)
    bf16 *qkv;                 // (N, QKV) the stacked q|k|v product (q, k rotated in place without qk_norm)
    bf16 *qk;                  // (N, QD+KD) q|k after QK-norm and RoPE (qk_norm only)
    float *qk_rstd;            // (N, Hq+Hkv) (qk_norm only)
    bf16 *att;                 // (N, QD)
    float *lse;                // (B, Hq, T)
    bf16 *mlp_in;              // (N,C)
    float *mlp_rstd;           // (N)
    bf16 *gate_up;             // (N, 2F)
    bf16 *act;                 // (N, F)
} layer_acts;

// One micro-batch's host-side inputs, pinned, so that its copy to the GPU is asynchronous.
typedef struct {
    int32_t *inputs, *targets, *start, *pos, *unique, *offsets, *positions;  // N each (offsets N+1)
    int64_t num_unique;
    cudaEvent_t copied;        // the GPU has taken the copy: the slot may be refilled
} input_slot;

// ---------------------------------------------------------------- kernel profile
// TRAIN_GPT_PROFILE=1: the time of each kernel family, measured with CUDA events recorded
// on the model's stream between families (marks). Each interval between two marks goes
// to the family named by the first. At the end of each step the marks are read (the step
// waits for its last one; profiling serializes the host with the GPU once per step) and
// added up; cuda_model_free prints the table: milliseconds per step and share of the
// step, averaged over the steps after the first (which holds cuBLASLt's algorithm search).
typedef enum {
    K_INPUTS, K_EMBEDDING, K_RMSNORM_FWD, K_RMSNORM_BWD, K_MATMUL_FWD, K_MATMUL_BWD, K_QKNORM_ROPE_FWD,
    K_QKNORM_ROPE_BWD, K_ATTENTION_FWD, K_ATTENTION_BWD, K_SWIGLU_FWD, K_SWIGLU_BWD, K_HEAD_MATMUL_FWD,
    K_HEAD_MATMUL_BWD, K_CROSS_ENTROPY, K_OPTIMIZER, K_FAMILY_COUNT
} kernel_family;

static const char *const family_names[K_FAMILY_COUNT] = {
    "input copies (host → GPU)", "embedding fwd+bwd",  "rmsnorm fwd",        "rmsnorm bwd (+ gains)",
    "matmul fwd (blocks)",       "matmul bwd (blocks)", "qk-norm + rope fwd", "qk-norm + rope bwd (+ gains)",
    "attention fwd",             "attention bwd",       "swiglu fwd",         "swiglu bwd",
    "matmul fwd (lm head)",      "matmul bwd (lm head)", "cross-entropy + z-loss", "grad norm + AdamW"};

enum { PROFILE_MARKS = 4096 };
typedef struct {
    cudaEvent_t events[PROFILE_MARKS];
    int family[PROFILE_MARKS];
    int count;                       // marks recorded since the last fold
    double step_ms[K_FAMILY_COUNT];  // this step so far
    double total_ms[K_FAMILY_COUNT]; // steps after the first
    int64_t steps;                   // steps folded into step_ms (the first is left out of total_ms)
} kernel_profile;

static kernel_profile *profile_create(void) {
    const char *v = getenv("TRAIN_GPT_PROFILE");
    if (!v || !*v || strcmp(v, "0") == 0) return NULL;
    kernel_profile *p = (kernel_profile *)xcalloc(1, sizeof *p);
    for (int i = 0; i < PROFILE_MARKS; i++) CUDA_CHECK(cudaEventCreate(&p->events[i]));
    return p;
}

// Adds the closed intervals to step_ms; the last mark stays as the first of the next run.
static void profile_fold(kernel_profile *p) {
    if (p->count < 2) return;
    CUDA_CHECK(cudaEventSynchronize(p->events[p->count - 1]));
    for (int i = 0; i + 1 < p->count; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, p->events[i], p->events[i + 1]));
        if (p->family[i] < K_FAMILY_COUNT) p->step_ms[p->family[i]] += ms;
    }
    cudaEvent_t last = p->events[p->count - 1];
    p->events[p->count - 1] = p->events[0];
    p->events[0] = last;
    p->family[0] = p->family[p->count - 1];
    p->count = 1;
}

static void profile_end_step(kernel_profile *p) {
    profile_fold(p);
    p->count = 0;  // the next step starts with its own first mark
    if (p->steps > 0)
        for (int f = 0; f < K_FAMILY_COUNT; f++) p->total_ms[f] += p->step_ms[f];
    memset(p->step_ms, 0, sizeof p->step_ms);
    p->steps++;
}

static void profile_print(const kernel_profile *p) {
    int64_t n = p->steps - 1;
    if (n < 1) {
        printf("train_gpt | kernel profile: needs at least 2 steps (the first is left out)\n");
        return;
    }
    double total = 0.0;
    for (int f = 0; f < K_FAMILY_COUNT; f++) total += p->total_ms[f];
    printf("train_gpt | kernel time per step (TRAIN_GPT_PROFILE, CUDA events, mean of %lld steps after the first):\n",
           (long long)n);
    int order[K_FAMILY_COUNT];
    for (int f = 0; f < K_FAMILY_COUNT; f++) order[f] = f;
    for (int i = 1; i < K_FAMILY_COUNT; i++)  // largest first
        for (int j = i; j > 0 && p->total_ms[order[j]] > p->total_ms[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < K_FAMILY_COUNT; i++) {
        int f = order[i];
        printf("train_gpt |   %-30s %9.2f ms %6.1f %%\n", family_names[f], p->total_ms[f] / (double)n,
               total > 0 ? 100.0 * p->total_ms[f] / total : 0.0);
    }
    printf("train_gpt |   %-30s %9.2f ms\n", "total (first mark to last)", total / (double)n);
    fflush(stdout);
}

static void profile_free(kernel_profile *p) {
    if (!p) return;
    for (int i = 0; i < PROFILE_MARKS; i++) cudaEventDestroy(p->events[i]);
    free(p);
}

struct cuda_model {
    const param_table *table;
    model_config cfg;
    int64_t B, T, N, C, F, V, Hq, Hkv, D, L, QD, KD, QKV;
    float eps;
    bool sizing_only;          // count bytes, allocate nothing, touch no GPU (memory plans)
    int64_t device_bytes;
    bool simple_attention;

    cudaStream_t stream;
    matmul_context *mm;

    float *params, *grads, *exp_avg, *exp_avg_sq;   // (numel) fp32, the table's layout
    bf16 *params_bf16;                              // (numel)
    adamw_chunk *chunks;
    int64_t num_chunks;

    float **resid;             // L+1 × (N,C) fp32: resid[l] enters layer l
    layer_acts *layers;
    bf16 *final_out;           // (N,C)
    float *final_rstd;         // (N)
    float *rope_cos, *rope_sin;  // (T, D/2)

    int32_t *d_inputs, *d_targets, *d_start, *d_pos, *d_unique, *d_offsets, *d_positions;

    float *d_resid;            // (N,C) fp32
    bf16 *d_resid_bf16;        // (N,C)
    float *d_norm;             // (N,C) fp32
    float *d_final;            // (N,C) fp32
    bf16 *d_att;               // (N,QD)
    bf16 *d_qkv;               // (N,QKV)
    bf16 *d_act;               // (N,F)
    bf16 *d_gate_up;           // (N,2F)
    float *delta;              // (B,Hq,T)
    float *gain_scratch;

    float *logits;             // (chunk_rows, ld_logits) fp32
    bf16 *dlogits;             // (chunk_rows, ld_logits)
    int64_t chunk_rows, ld_logits;
    float *row_ce, *row_lse;   // (N)

    step_scalars *st;          // the step being accumulated
    double *norm_partials;     // (GRAD_NORM_BLOCKS)
    double *eval_sums;         // (2) forward_loss

    input_slot slots[INPUT_SLOTS];
    int next_slot;
    int32_t *bucket_counts;    // (V) host, zero between uses

    step_scalars *results;     // (RESULT_SLOTS) pinned
    double *eval_result;       // (2) pinned
    cudaEvent_t result_done[RESULT_SLOTS], step_began[RESULT_SLOTS];
    int64_t result_step[RESULT_SLOTS], result_rows[RESULT_SLOTS];
    double result_z_loss[RESULT_SLOTS];
    int64_t results_queued, results_read;  // ring positions
    bool step_open;            // a micro-batch of the current step has been queued
    kernel_profile *profile;   // TRAIN_GPT_PROFILE=1, else NULL
};

// From here on the stream runs work of `family` (K_FAMILY_COUNT: the step's end).
static void mark(cuda_model *m, int family) {
    kernel_profile *p = m->profile;
    if (!p || !m->step_open) return;  // training steps only, not validation or sampling
    if (p->count == PROFILE_MARKS) profile_fold(p);
    p->family[p->count] = family;
    CUDA_CHECK(cudaEventRecord(p->events[p->count], m->stream));
    p->count++;
}

// ---------------------------------------------------------------- allocation

static void *take_bytes(cuda_model *m, int64_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    m->device_bytes += bytes;
    if (m->sizing_only || bytes == 0) return NULL;
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, (size_t)bytes));
    return p;
}
#define TAKE(m, type, count) ((type *)take_bytes((m), (int64_t)(count) * (int64_t)sizeof(type)))

static int64_t tensor_offset(const cuda_model *m, param_kind kind, int layer) {
    if (kind == P_LM_HEAD && m->cfg.tie_embeddings) kind = P_EMBED;
    const param_info *p = param_find(m->table, kind, layer);
    CHECK(p != NULL);
    return p->offset;
}

// The stacked matmuls need q/k/v and gate/up adjacent in the flat layout (llmc/params.c's order).
static void check_layout(const cuda_model *m) {
    for (int l = 0; l < (int)m->L; l++) {
        const param_info *q = param_find(m->table, P_WQ, l), *k = param_find(m->table, P_WK, l),
                         *v = param_find(m->table, P_WV, l), *g = param_find(m->table, P_W_GATE, l),
                         *u = param_find(m->table, P_W_UP, l);
        CHECK(k->offset == q->offset + q->numel && v->offset == k->offset + k->numel);
        CHECK(u->offset == g->offset + g->numel);
        if (m->cfg.qk_norm) {
            const param_info *qn = param_find(m->table, P_Q_NORM, l), *kn = param_find(m->table, P_K_NORM, l);
            CHECK(qn && kn);
        }
    }
}

static cuda_model *create(const param_table *t, int64_t B, int64_t T, bool sizing_only) {
    const model_config *c = &t->cfg;
    CHECK(B >= 1 && T >= 1 && T <= c->seq_len);
    cuda_model *m = (cuda_model *)xcalloc(1, sizeof *m);
    m->table = t;
    m->cfg = *c;
    m->sizing_only = sizing_only;
    m->B = B;
    m->T = T;
    m->N = B * T;
    m->C = c->d_model;
    m->F = c->d_ff;
    m->V = c->vocab_size;
    m->Hq = c->n_head;
    m->Hkv = c->n_kv_head;
    m->D = c->head_dim;
    m->L = c->n_layer;
    m->QD = m->Hq * m->D;
    m->KD = m->Hkv * m->D;
    m->QKV = m->QD + 2 * m->KD;
    m->eps = (float)c->norm_eps;
    check_layout(m);
    // The fast attention kernels exist for head_dim 32, 64 and 128. Another head_dim would
    // run on the one-warp-per-row reference kernels, O(T²) work at minutes per step: only
    // when the user asks for them.
    const char *choice = getenv("TRAIN_GPT_ATTENTION");
    m->simple_attention = choice && strcmp(choice, "simple") == 0;
    if (!sizing_only) {
        if (m->D % 8 != 0 || m->D > 256)
            fail("head_dim %lld: the CUDA backend needs a multiple of 8, at most 256", (long long)m->D);
        if (!m->simple_attention && !attention_supports_head_dim((int)m->D))
            fail("head_dim %lld: the CUDA backend's attention kernels support head_dim 32, 64 and 128 (set "
                 "TRAIN_GPT_ATTENTION=simple to train on the slow reference kernels, or use the CPU backend)",
                 (long long)m->D);
    }

    int64_t N = m->N, C = m->C, F = m->F, numel = t->numel;
    if (!sizing_only) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
        m->mm = matmul_create();
    }
    m->device_bytes += 32 << 20;  // the matmul workspace (matmul.cu)

    m->params = TAKE(m, float, numel);
    m->grads = TAKE(m, float, numel);
    m->exp_avg = TAKE(m, float, numel);
    m->exp_avg_sq = TAKE(m, float, numel);
    m->params_bf16 = TAKE(m, bf16, numel);

    // AdamW's chunks: each inside one tensor, at most ADAMW_CHUNK_ELEMS long.
    for (int i = 0; i < t->count; i++) m->num_chunks += cdiv(t->params[i].numel, ADAMW_CHUNK_ELEMS);
    m->chunks = TAKE(m, adamw_chunk, m->num_chunks);
    if (!sizing_only) {
        adamw_chunk *host = (adamw_chunk *)xmalloc((size_t)m->num_chunks * sizeof *host);
        int64_t at = 0;
        for (int i = 0; i < t->count; i++) {
            const param_info *p = &t->params[i];
            for (int64_t s = 0; s < p->numel; s += ADAMW_CHUNK_ELEMS) {
                host[at].start = p->offset + s;
                host[at].count = (int32_t)min_i64(ADAMW_CHUNK_ELEMS, p->numel - s);
                host[at].decay = p->decay ? 1 : 0;
                at++;
            }
        }
        CUDA_CHECK(cudaMemcpy(m->chunks, host, (size_t)m->num_chunks * sizeof *host, cudaMemcpyHostToDevice));
        free(host);
        CUDA_CHECK(cudaMemset(m->grads, 0, (size_t)numel * sizeof(float)));
    }

    m->resid = (float **)xcalloc((size_t)m->L + 1, sizeof *m->resid);
    for (int64_t l = 0; l <= m->L; l++) m->resid[l] = TAKE(m, float, N * C);
    m->layers = (layer_acts *)xcalloc((size_t)m->L, sizeof *m->layers);
    for (int64_t l = 0; l < m->L; l++) {
        layer_acts *a = &m->layers[l];
        a->resid_mid = TAKE(m, float, N * C);
        a->attn_in = TAKE(m, bf16, N * C);
        a->attn_rstd = TAKE(m, float, N);
        a->qkv = TAKE(m, bf16, N * m->QKV);
        if (c->qk_norm) {
            a->qk = TAKE(m, bf16, N * (m->QD + m->KD));
            a->qk_rstd = TAKE(m, float, N * (m->Hq + m->Hkv));
        }
        a->att = TAKE(m, bf16, N * m->QD);
        a->lse = TAKE(m, float, N * m->Hq);
        a->mlp_in = TAKE(m, bf16, N * C);
        a->mlp_rstd = TAKE(m, float, N);
        a->gate_up = TAKE(m, bf16, N * 2 * F);
        a->act = TAKE(m, bf16, N * F);
    }
    m->final_out = TAKE(m, bf16, N * C);
    m->final_rstd = TAKE(m, float, N);
    m->rope_cos = TAKE(m, float, T * (m->D / 2));
    m->rope_sin = TAKE(m, float, T * (m->D / 2));

    m->d_inputs = TAKE(m, int32_t, N);
    m->d_targets = TAKE(m, int32_t, N);
    m->d_start = TAKE(m, int32_t, N);
    m->d_pos = TAKE(m, int32_t, N);
    m->d_unique = TAKE(m, int32_t, N);
    m->d_offsets = TAKE(m, int32_t, N + 1);
    m->d_positions = TAKE(m, int32_t, N);

    m->d_resid = TAKE(m, float, N * C);
    m->d_resid_bf16 = TAKE(m, bf16, N * C);
    m->d_norm = TAKE(m, float, N * C);
    m->d_final = TAKE(m, float, N * C);
    m->d_att = TAKE(m, bf16, N * m->QD);
    m->d_qkv = TAKE(m, bf16, N * m->QKV);
    m->d_act = TAKE(m, bf16, N * F);
    m->d_gate_up = TAKE(m, bf16, N * 2 * F);
    m->delta = TAKE(m, float, N * m->Hq);
    int64_t scratch = max_i64(rmsnorm_gain_scratch_floats(N, C), qknorm_gain_scratch_floats(N, (int)m->Hq, (int)m->D));
    m->gain_scratch = TAKE(m, float, scratch);

    // Rows of the logits' row stride padded to 64 elements: aligned rows for the kernels.
    m->ld_logits = (m->V + 63) / 64 * 64;
    m->chunk_rows = max_i64(1, min_i64(N, LOGITS_CHUNK_BYTES / (m->ld_logits * 6)));
    m->logits = TAKE(m, float, m->chunk_rows * m->ld_logits);
    m->dlogits = TAKE(m, bf16, m->chunk_rows * m->ld_logits);
    m->row_ce = TAKE(m, float, N);
    m->row_lse = TAKE(m, float, N);

    m->st = TAKE(m, step_scalars, 1);
    m->norm_partials = TAKE(m, double, GRAD_NORM_BLOCKS);
    m->eval_sums = TAKE(m, double, 2);
    if (sizing_only) return m;

    CUDA_CHECK(cudaMemset(m->st, 0, sizeof(step_scalars)));
    float *cos_h = alloc_floats((size_t)(T * (m->D / 2))), *sin_h = alloc_floats((size_t)(T * (m->D / 2)));
    rope_tables(cos_h, sin_h, T, m->D, c->rope_theta);
    CUDA_CHECK(cudaMemcpy(m->rope_cos, cos_h, (size_t)(T * (m->D / 2)) * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m->rope_sin, sin_h, (size_t)(T * (m->D / 2)) * sizeof(float), cudaMemcpyHostToDevice));
    free(cos_h);
    free(sin_h);

    for (int s = 0; s < INPUT_SLOTS; s++) {
        input_slot *sl = &m->slots[s];
        int32_t *block = NULL;
        CUDA_CHECK(cudaMallocHost((void **)&block, (size_t)(7 * N + 1) * sizeof(int32_t)));
        sl->inputs = block;
        sl->targets = block + N;
        sl->start = block + 2 * N;
        sl->pos = block + 3 * N;
        sl->unique = block + 4 * N;
        sl->positions = block + 5 * N;
        sl->offsets = block + 6 * N;  // N + 1
        CUDA_CHECK(cudaEventCreateWithFlags(&sl->copied, cudaEventDisableTiming));
    }
    m->bucket_counts = (int32_t *)xcalloc((size_t)m->V, sizeof(int32_t));
    CUDA_CHECK(cudaMallocHost((void **)&m->results, RESULT_SLOTS * sizeof(step_scalars)));
    CUDA_CHECK(cudaMallocHost((void **)&m->eval_result, 2 * sizeof(double)));
    for (int s = 0; s < RESULT_SLOTS; s++) {
        CUDA_CHECK(cudaEventCreate(&m->result_done[s]));
        CUDA_CHECK(cudaEventCreate(&m->step_began[s]));
    }
    m->profile = profile_create();
    // The set-up above used the legacy stream (cudaMemcpy, cudaMemset), which the model's
    // non-blocking stream does not wait for.
    CUDA_CHECK(cudaDeviceSynchronize());
    return m;
}

cuda_model *cuda_model_create(const param_table *t, int64_t B, int64_t T) { return create(t, B, T, false); }

int64_t cuda_model_device_bytes(const cuda_model *m) { return m->device_bytes; }

int64_t cuda_device_used_bytes(void) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (int64_t)(total_bytes - free_bytes);
}

static void free_host_side(cuda_model *m) {
    free(m->resid);
    free(m->layers);
    free(m);
}

int64_t cuda_model_plan_bytes(const param_table *t, int64_t B, int64_t T) {
    cuda_model *m = create(t, B, T, true);
    int64_t bytes = m->device_bytes;
    free_host_side(m);
    return bytes;
}

void cuda_model_free(cuda_model *m) {
    if (!m) return;
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    if (m->profile) profile_print(m->profile);
    profile_free(m->profile);
    for (int64_t l = 0; l <= m->L; l++) cudaFree(m->resid[l]);
    for (int64_t l = 0; l < m->L; l++) {
        layer_acts *a = &m->layers[l];
        void *bufs[] = {a->resid_mid, a->attn_in, a->attn_rstd, a->qkv, a->qk, a->qk_rstd,
                        a->att,       a->lse,     a->mlp_in,    a->mlp_rstd, a->gate_up, a->act};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    }
    void *bufs[] = {m->params,   m->grads,      m->exp_avg,    m->exp_avg_sq,  m->params_bf16, m->chunks,
                    m->final_out, m->final_rstd, m->rope_cos,   m->rope_sin,    m->d_inputs,    m->d_targets,
                    m->d_start,  m->d_pos,      m->d_unique,   m->d_offsets,   m->d_positions, m->d_resid,
                    m->d_resid_bf16, m->d_norm, m->d_final,    m->d_att,       m->d_qkv,       m->d_act,
                    m->d_gate_up, m->delta,     m->gain_scratch, m->logits,    m->dlogits,     m->row_ce,
                    m->row_lse,  m->st,         m->norm_partials, m->eval_sums};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    for (int s = 0; s < INPUT_SLOTS; s++) {
        cudaFreeHost(m->slots[s].inputs);
        cudaEventDestroy(m->slots[s].copied);
    }
    for (int s = 0; s < RESULT_SLOTS; s++) {
        cudaEventDestroy(m->result_done[s]);
        cudaEventDestroy(m->step_began[s]);
    }
    cudaFreeHost(m->results);
    cudaFreeHost(m->eval_result);
    free(m->bucket_counts);
    matmul_destroy(m->mm);
    cudaStreamDestroy(m->stream);
    free_host_side(m);
}

// ---------------------------------------------------------------- parameters in and out

// Copies go through the model's stream (a non-blocking one): a plain cudaMemcpy from
// pageable memory may return before its DMA lands, and nothing would order it before the
// stream's next kernel.
static void upload_floats(cuda_model *m, float *dst, const float *src, int64_t n) {
    if (src)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, m->stream));
    else
        CUDA_CHECK(cudaMemsetAsync(dst, 0, (size_t)n * sizeof(float), m->stream));
}

void cuda_model_upload(cuda_model *m, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step) {
    CHECK(params != NULL);
    upload_floats(m, m->params, params, m->table->numel);
    upload_floats(m, m->exp_avg, exp_avg, m->table->numel);
    upload_floats(m, m->exp_avg_sq, exp_avg_sq, m->table->numel);
    floats_to_bf16(m->params_bf16, m->params, m->table->numel, m->stream);
    step_scalars st;
    memset(&st, 0, sizeof st);
    st.adam_step = adam_step;
    CUDA_CHECK(cudaMemcpyAsync(m->st, &st, sizeof st, cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
}

void cuda_model_upload_params(cuda_model *m, const float *params) {
    upload_floats(m, m->params, params, m->table->numel);
    floats_to_bf16(m->params_bf16, m->params, m->table->numel, m->stream);
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
}

void cuda_model_download(cuda_model *m, float *params, float *exp_avg, float *exp_avg_sq) {
    size_t bytes = (size_t)m->table->numel * sizeof(float);
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    if (params) CUDA_CHECK(cudaMemcpy(params, m->params, bytes, cudaMemcpyDeviceToHost));
    if (exp_avg) CUDA_CHECK(cudaMemcpy(exp_avg, m->exp_avg, bytes, cudaMemcpyDeviceToHost));
    if (exp_avg_sq) CUDA_CHECK(cudaMemcpy(exp_avg_sq, m->exp_avg_sq, bytes, cudaMemcpyDeviceToHost));
}

void cuda_model_download_grads(cuda_model *m, float *grads) {
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    CUDA_CHECK(cudaMemcpy(grads, m->grads, (size_t)m->table->numel * sizeof(float), cudaMemcpyDeviceToHost));
}

void cuda_model_zero_grads(cuda_model *m) {
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, (size_t)m->table->numel * sizeof(float), m->stream));
}

void cuda_model_poison_grad(cuda_model *m) {
    // 0xFF bytes: a NaN bit pattern.
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0xFF, sizeof(float), m->stream));
}

// ---------------------------------------------------------------- inputs

// Validates the tokens, computes document starts/positions (and, for training, the
// embedding backward's buckets) on the host into a free pinned slot, and queues its copy.
static void queue_inputs(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                         bool buckets) {
    mark(m, K_INPUTS);
    CHECK(B >= 1 && T >= 1 && B * T <= m->N && T <= m->T);
    int64_t N = B * T;
    for (int64_t i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= m->V)
            fail("input token %d is outside the vocabulary (vocab_size %lld)", inputs[i], (long long)m->V);
        if (targets && (targets[i] < 0 || targets[i] >= m->V))
            fail("target token %d is outside the vocabulary (vocab_size %lld)", targets[i], (long long)m->V);
    }
    input_slot *sl = &m->slots[m->next_slot];
    m->next_slot = (m->next_slot + 1) % INPUT_SLOTS;
    // Named wait: the slot's previous copy must have been taken by the GPU.
    CUDA_CHECK(cudaEventSynchronize(sl->copied));
    memcpy(sl->inputs, inputs, (size_t)N * sizeof(int32_t));
    if (targets) memcpy(sl->targets, targets, (size_t)N * sizeof(int32_t));
    document_positions(sl->start, sl->pos, inputs, B, T, m->cfg.doc_masking, m->cfg.doc_token);
    sl->num_unique = buckets ? embedding_buckets(sl->unique, sl->offsets, sl->positions, inputs, N, m->bucket_counts)
                             : 0;
    size_t bytes = (size_t)N * sizeof(int32_t);
    cudaStream_t s = m->stream;
    CUDA_CHECK(cudaMemcpyAsync(m->d_inputs, sl->inputs, bytes, cudaMemcpyHostToDevice, s));
    if (targets) CUDA_CHECK(cudaMemcpyAsync(m->d_targets, sl->targets, bytes, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(m->d_start, sl->start, bytes, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(m->d_pos, sl->pos, bytes, cudaMemcpyHostToDevice, s));
    if (buckets) {
        CUDA_CHECK(cudaMemcpyAsync(m->d_unique, sl->unique, (size_t)sl->num_unique * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaMemcpyAsync(m->d_offsets, sl->offsets, (size_t)(sl->num_unique + 1) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaMemcpyAsync(m->d_positions, sl->positions, bytes, cudaMemcpyHostToDevice, s));
    }
    CUDA_CHECK(cudaEventRecord(sl->copied, s));
}

// ---------------------------------------------------------------- forward

#define W16(kind, layer) (m->params_bf16 + tensor_offset(m, kind, layer))
#define W32(kind, layer) (m->params + tensor_offset(m, kind, layer))
#define G32(kind, layer) (m->grads + tensor_offset(m, kind, layer))

typedef struct {
    const bf16 *q, *k, *v;
    int64_t q_stride, k_stride, v_stride;
} qkv_view;

// Where the attention reads q, k and v of layer l (after QK-norm and RoPE).
static qkv_view attention_inputs(const cuda_model *m, const layer_acts *a) {
    qkv_view view;
    if (m->cfg.qk_norm) {
        view.q = a->qk;
        view.k = a->qk + m->QD;
        view.q_stride = view.k_stride = m->QD + m->KD;
    } else {
        view.q = a->qkv;
        view.k = a->qkv + m->QD;
        view.q_stride = view.k_stride = m->QKV;
    }
    view.v = a->qkv + m->QD + m->KD;
    view.v_stride = m->QKV;
    return view;
}

static void forward_blocks(cuda_model *m, int64_t B, int64_t T) {
    const model_config *c = &m->cfg;
    int64_t N = B * T, C = m->C, F = m->F, QD = m->QD, QKV = m->QKV;
    int Hq = (int)m->Hq, Hkv = (int)m->Hkv, D = (int)m->D;
    cudaStream_t s = m->stream;
    mark(m, K_EMBEDDING);
    embedding_forward(m->resid[0], m->d_inputs, W32(P_EMBED, -1), N, C, s);
    for (int l = 0; l < (int)m->L; l++) {
        layer_acts *a = &m->layers[l];
        bool rope = layer_uses_rope(c, l);
        mark(m, K_RMSNORM_FWD);
        rmsnorm_forward(a->attn_in, a->attn_rstd, m->resid[l], W32(P_ATTN_NORM, l), N, C, m->eps, s);
        mark(m, K_MATMUL_FWD);
        matmul_forward(m->mm, a->qkv, CUDA_R_16BF, QKV, NULL, a->attn_in, W16(P_WQ, l), N, C, QKV, s);
        mark(m, K_QKNORM_ROPE_FWD);
        if (c->qk_norm)
            qknorm_rope_forward(a->qk, QD + m->KD, a->qk_rstd, a->qkv, QKV, W32(P_Q_NORM, l), W32(P_K_NORM, l),
                                m->d_pos, m->rope_cos, m->rope_sin, N, Hq, Hkv, D, true, rope, m->eps, s);
        else if (rope)
            qknorm_rope_forward(a->qkv, QKV, NULL, a->qkv, QKV, NULL, NULL, m->d_pos, m->rope_cos, m->rope_sin, N, Hq,
                                Hkv, D, false, true, m->eps, s);
        qkv_view in = attention_inputs(m, a);
        mark(m, K_ATTENTION_FWD);
        if (m->simple_attention)
            attention_simple_forward(a->att, a->lse, in.q, in.q_stride, in.k, in.k_stride, in.v, in.v_stride,
                                     m->d_start, B, T, Hq, Hkv, D, s);
        else
            attention_forward(a->att, a->lse, in.q, in.q_stride, in.k, in.k_stride, in.v, in.v_stride, m->d_start, B,
                              T, Hq, Hkv, D, s);
        mark(m, K_MATMUL_FWD);
        matmul_forward(m->mm, a->resid_mid, CUDA_R_32F, C, m->resid[l], a->att, W16(P_WO, l), N, QD, C, s);
        mark(m, K_RMSNORM_FWD);
        rmsnorm_forward(a->mlp_in, a->mlp_rstd, a->resid_mid, W32(P_MLP_NORM, l), N, C, m->eps, s);
        mark(m, K_MATMUL_FWD);
        matmul_forward(m->mm, a->gate_up, CUDA_R_16BF, 2 * F, NULL, a->mlp_in, W16(P_W_GATE, l), N, C, 2 * F, s);
        mark(m, K_SWIGLU_FWD);
        swiglu_forward(a->act, a->gate_up, N, F, s);
        mark(m, K_MATMUL_FWD);
        matmul_forward(m->mm, m->resid[l + 1], CUDA_R_32F, C, a->resid_mid, a->act, W16(P_W_DOWN, l), N, F, C, s);
    }
    mark(m, K_RMSNORM_FWD);
    rmsnorm_forward(m->final_out, m->final_rstd, m->resid[m->L], W32(P_FINAL_NORM, -1), N, C, m->eps, s);
}

// Loss over chunks of rows; with `train`, also the head's backward into d_final and the
// head weight's gradient. Row sums go to `sums` (2 doubles: Σ ce, Σ lse²).
static void classifier(cuda_model *m, int64_t N, bool train, float grad_scale, float z_loss, double *sums) {
    cudaStream_t s = m->stream;
    const bf16 *head = W16(P_LM_HEAD, -1);
    float *dhead = G32(P_LM_HEAD, -1);
    for (int64_t r0 = 0; r0 < N; r0 += m->chunk_rows) {
        int64_t n = min_i64(m->chunk_rows, N - r0);
        mark(m, K_HEAD_MATMUL_FWD);
        matmul_forward(m->mm, m->logits, CUDA_R_32F, m->ld_logits, NULL, m->final_out + r0 * m->C, head, n, m->C,
                       m->V, s);
        mark(m, K_CROSS_ENTROPY);
        cross_entropy_forward_backward(train ? m->dlogits : NULL, m->row_ce + r0, m->row_lse + r0, m->logits,
                                       m->d_targets + r0, n, m->V, m->ld_logits, z_loss, grad_scale, s);
        if (train) {
            mark(m, K_HEAD_MATMUL_BWD);
            matmul_backward_input(m->mm, m->d_final + r0 * m->C, CUDA_R_32F, m->dlogits, m->ld_logits, head, n, m->C,
                                  m->V, false, s);
            matmul_backward_weight(m->mm, dhead, m->dlogits, m->ld_logits, m->final_out + r0 * m->C, n, m->C, m->V,
                                   s);
        }
    }
    mark(m, K_CROSS_ENTROPY);
    loss_sums_accumulate(sums, m->row_ce, m->row_lse, N, s);
}

// ---------------------------------------------------------------- backward

static void backward_blocks(cuda_model *m, int64_t B, int64_t T, int64_t num_unique) {
    const model_config *c = &m->cfg;
    int64_t N = B * T, C = m->C, F = m->F, QD = m->QD, KD = m->KD, QKV = m->QKV;
    int Hq = (int)m->Hq, Hkv = (int)m->Hkv, D = (int)m->D;
    cudaStream_t s = m->stream;
    mark(m, K_RMSNORM_BWD);
    rmsnorm_gain_grad(G32(P_FINAL_NORM, -1), m->gain_scratch, m->d_final, m->resid[m->L], m->final_rstd, N, C, s);
    rmsnorm_backward(m->d_resid, m->d_resid_bf16, m->d_final, m->resid[m->L], W32(P_FINAL_NORM, -1), m->final_rstd,
                     N, C, false, s);
    for (int l = (int)m->L - 1; l >= 0; l--) {
        layer_acts *a = &m->layers[l];
        bool rope = layer_uses_rope(c, l);
        // MLP: resid_out = resid_mid + down(silu(gate(mlp_in)) ⊙ up(mlp_in))
        mark(m, K_MATMUL_BWD);
        matmul_backward_input(m->mm, m->d_act, CUDA_R_16BF, m->d_resid_bf16, C, W16(P_W_DOWN, l), N, F, C, false, s);
        matmul_backward_weight(m->mm, G32(P_W_DOWN, l), m->d_resid_bf16, C, a->act, N, F, C, s);
        mark(m, K_SWIGLU_BWD);
        swiglu_backward(m->d_gate_up, m->d_act, a->gate_up, N, F, s);
        mark(m, K_MATMUL_BWD);
        matmul_backward_input(m->mm, m->d_norm, CUDA_R_32F, m->d_gate_up, 2 * F, W16(P_W_GATE, l), N, C, 2 * F, false,
                              s);
        matmul_backward_weight(m->mm, G32(P_W_GATE, l), m->d_gate_up, 2 * F, a->mlp_in, N, C, 2 * F, s);
        mark(m, K_RMSNORM_BWD);
        rmsnorm_gain_grad(G32(P_MLP_NORM, l), m->gain_scratch, m->d_norm, a->resid_mid, a->mlp_rstd, N, C, s);
        rmsnorm_backward(m->d_resid, m->d_resid_bf16, m->d_norm, a->resid_mid, W32(P_MLP_NORM, l), a->mlp_rstd, N, C,
                         true, s);
        // Attention: resid_mid = resid_in + o(attention(q, k, v))
        mark(m, K_MATMUL_BWD);
        matmul_backward_input(m->mm, m->d_att, CUDA_R_16BF, m->d_resid_bf16, C, W16(P_WO, l), N, QD, C, false, s);
        matmul_backward_weight(m->mm, G32(P_WO, l), m->d_resid_bf16, C, a->att, N, QD, C, s);
        qkv_view in = attention_inputs(m, a);
        bf16 *dq = m->d_qkv, *dk = m->d_qkv + QD, *dv = m->d_qkv + QD + KD;
        mark(m, K_ATTENTION_BWD);
        if (m->simple_attention)
            attention_simple_backward(dq, QKV, dk, QKV, dv, QKV, m->delta, m->d_att, a->att, a->lse, in.q, in.q_stride,
                                      in.k, in.k_stride, in.v, in.v_stride, m->d_start, B, T, Hq, Hkv, D, s);
        else
            attention_backward(dq, QKV, dk, QKV, dv, QKV, m->delta, m->d_att, a->att, a->lse, in.q, in.q_stride, in.k,
                               in.k_stride, in.v, in.v_stride, m->d_start, B, T, Hq, Hkv, D, s);
        mark(m, K_QKNORM_ROPE_BWD);
        if (c->qk_norm) {
            // Gains first: they read d_qkv before the in-place backward overwrites it.
            qknorm_gain_grad(G32(P_Q_NORM, l), m->gain_scratch, m->d_qkv, QKV, a->qkv, QKV, a->qk_rstd, m->d_pos,
                             m->rope_cos, m->rope_sin, N, 0, Hq, Hq + Hkv, D, rope, s);
            qknorm_gain_grad(G32(P_K_NORM, l), m->gain_scratch, m->d_qkv, QKV, a->qkv, QKV, a->qk_rstd, m->d_pos,
                             m->rope_cos, m->rope_sin, N, Hq, Hkv, Hq + Hkv, D, rope, s);
            qknorm_rope_backward(m->d_qkv, QKV, m->d_qkv, QKV, a->qkv, QKV, a->qk_rstd, W32(P_Q_NORM, l),
                                 W32(P_K_NORM, l), m->d_pos, m->rope_cos, m->rope_sin, N, Hq, Hkv, D, true, rope, s);
        } else if (rope) {
            qknorm_rope_backward(m->d_qkv, QKV, m->d_qkv, QKV, NULL, 0, NULL, NULL, NULL, m->d_pos, m->rope_cos,
                                 m->rope_sin, N, Hq, Hkv, D, false, true, s);
        }
        mark(m, K_MATMUL_BWD);
        matmul_backward_input(m->mm, m->d_norm, CUDA_R_32F, m->d_qkv, QKV, W16(P_WQ, l), N, C, QKV, false, s);
        matmul_backward_weight(m->mm, G32(P_WQ, l), m->d_qkv, QKV, a->attn_in, N, C, QKV, s);
        mark(m, K_RMSNORM_BWD);
        rmsnorm_gain_grad(G32(P_ATTN_NORM, l), m->gain_scratch, m->d_norm, m->resid[l], a->attn_rstd, N, C, s);
        rmsnorm_backward(m->d_resid, m->d_resid_bf16, m->d_norm, m->resid[l], W32(P_ATTN_NORM, l), a->attn_rstd, N, C,
                         true, s);
    }
    mark(m, K_EMBEDDING);
    embedding_backward(G32(P_EMBED, -1), m->d_resid, m->d_unique, m->d_offsets, m->d_positions, num_unique, C, s);
}

// ---------------------------------------------------------------- the step

void cuda_forward_backward(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                           float grad_scale, float z_loss) {
    int64_t slot = m->results_queued % RESULT_SLOTS;
    if (!m->step_open) {
        CHECK(m->results_queued - m->results_read < RESULT_SLOTS);
        CUDA_CHECK(cudaEventRecord(m->step_began[slot], m->stream));
        m->step_open = true;
    }
    input_slot *sl = &m->slots[m->next_slot];
    queue_inputs(m, inputs, targets, B, T, true);
    forward_blocks(m, B, T);
    classifier(m, B * T, true, grad_scale, z_loss, &m->st->ce_sum);
    backward_blocks(m, B, T, sl->num_unique);
}

loss_sums cuda_step_loss_so_far(cuda_model *m) {
    step_scalars st;
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    CUDA_CHECK(cudaMemcpy(&st, m->st, sizeof st, cudaMemcpyDeviceToHost));
    loss_sums sums = {st.ce_sum, st.lse_sq_sum, 0};
    return sums;
}

void cuda_step(cuda_model *m, int64_t step, double lr, int64_t rows, const train_config *cfg) {
    int64_t slot = m->results_queued % RESULT_SLOTS;
    if (!m->step_open) {
        CHECK(m->results_queued - m->results_read < RESULT_SLOTS);
        CUDA_CHECK(cudaEventRecord(m->step_began[slot], m->stream));
    }
    cudaStream_t s = m->stream;
    m->step_open = true;  // (a step without micro-batches: the marks below still count)
    mark(m, K_OPTIMIZER);
    grad_norm_partials(m->norm_partials, m->grads, m->table->numel, s);
    step_prepare(m->st, m->norm_partials, (double)rows, cfg->z_loss, cfg->grad_clip, lr, cfg->beta1, cfg->beta2, s);
    adamw_hparams hp;
    hp.keep_decay = (float)(1.0 - lr * cfg->weight_decay);
    hp.beta1 = (float)cfg->beta1;
    hp.beta2 = (float)cfg->beta2;
    hp.one_minus_beta1 = (float)(1.0 - cfg->beta1);
    hp.one_minus_beta2 = (float)(1.0 - cfg->beta2);
    hp.eps = (float)cfg->adam_eps;
    adamw_update(m->params, m->params_bf16, m->grads, m->exp_avg, m->exp_avg_sq, m->chunks, m->num_chunks, m->st, hp,
                 s);
    mark(m, K_FAMILY_COUNT);
    if (m->profile) profile_end_step(m->profile);
    CUDA_CHECK(cudaMemcpyAsync(&m->results[slot], m->st, sizeof(step_scalars), cudaMemcpyDeviceToHost, s));
    // The next step accumulates its loss from zero (ce_sum and lse_sq_sum lead the struct).
    CUDA_CHECK(cudaMemsetAsync(m->st, 0, 2 * sizeof(double), s));
    CUDA_CHECK(cudaEventRecord(m->result_done[slot], s));
    m->result_step[slot] = step;
    m->result_rows[slot] = rows;
    m->result_z_loss[slot] = cfg->z_loss;
    m->results_queued++;
    m->step_open = false;
}

bool cuda_step_poll(cuda_model *m, cuda_step_result *r, bool wait) {
    if (m->results_read == m->results_queued) return false;
    int64_t slot = m->results_read % RESULT_SLOTS;
    if (!wait) {
        cudaError_t e = cudaEventQuery(m->result_done[slot]);
        if (e == cudaErrorNotReady) {
            (void)cudaGetLastError();  // "not ready" is no error: leave none for the next launch check
            return false;
        }
        CUDA_CHECK(e);
    }
    CUDA_CHECK(cudaEventSynchronize(m->result_done[slot]));
    const step_scalars *st = &m->results[slot];
    memset(r, 0, sizeof *r);
    r->step = m->result_step[slot];
    r->rows = m->result_rows[slot];
    r->ce_sum = st->ce_sum;
    r->lse_sq_sum = st->lse_sq_sum;
    r->loss = st->ce_sum / (double)r->rows;
    r->z_loss = m->result_z_loss[slot] * st->lse_sq_sum / (double)r->rows;
    r->grad_norm = st->grad_norm;
    r->clip_coef = st->clip_coef;
    r->adam_step = st->adam_step;
    r->skipped = st->skipped != 0;
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, m->step_began[slot], m->result_done[slot]));
    r->gpu_ms = ms;
    m->results_read++;
    return true;
}

// ---------------------------------------------------------------- forward only

loss_sums cuda_forward_loss(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T) {
    CHECK(!m->step_open);  // the activations are shared with the step being accumulated
    queue_inputs(m, inputs, targets, B, T, false);
    forward_blocks(m, B, T);
    CUDA_CHECK(cudaMemsetAsync(m->eval_sums, 0, 2 * sizeof(double), m->stream));
    classifier(m, B * T, false, 0.0f, 0.0f, m->eval_sums);
    CUDA_CHECK(cudaMemcpyAsync(m->eval_result, m->eval_sums, 2 * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    CUDA_CHECK(cudaStreamSynchronize(m->stream));  // named: validation needs the number now
    loss_sums sums = {m->eval_result[0], m->eval_result[1], B * T};
    return sums;
}

// Logits of rows [r0, r0 + n) of the last forward into host rows (row stride V).
static void copy_logits(cuda_model *m, int64_t r0, int64_t n, float *host) {
    for (int64_t c0 = 0; c0 < n; c0 += m->chunk_rows) {
        int64_t k = min_i64(m->chunk_rows, n - c0);
        matmul_forward(m->mm, m->logits, CUDA_R_32F, m->ld_logits, NULL, m->final_out + (r0 + c0) * m->C,
                       W16(P_LM_HEAD, -1), k, m->C, m->V, m->stream);
        CUDA_CHECK(cudaMemcpy2DAsync(host + c0 * m->V, (size_t)m->V * sizeof(float), m->logits,
                                     (size_t)m->ld_logits * sizeof(float), (size_t)m->V * sizeof(float), (size_t)k,
                                     cudaMemcpyDeviceToHost, m->stream));
        CUDA_CHECK(cudaStreamSynchronize(m->stream));  // the logits buffer is reused by the next chunk
    }
}

void cuda_forward_logits(cuda_model *m, const int32_t *inputs, int64_t B, int64_t T, float *logits) {
    CHECK(!m->step_open);
    queue_inputs(m, inputs, NULL, B, T, false);
    forward_blocks(m, B, T);
    copy_logits(m, 0, B * T, logits);
}

void cuda_forward_last_logits(cuda_model *m, const int32_t *inputs, int64_t T, float *logits) {
    CHECK(!m->step_open);
    queue_inputs(m, inputs, NULL, 1, T, false);
    forward_blocks(m, 1, T);
    copy_logits(m, T - 1, 1, logits);
}

// ---------------------------------------------------------------- the backend (llmc/backend.h)

typedef struct {
    backend base;
    cuda_model *model;
    int64_t steps_done;
} gpu_backend;

static cuda_model *model_of(backend *b) { return ((gpu_backend *)b)->model; }

static void gpu_upload(backend *b, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step) {
    cuda_model_upload(model_of(b), params, exp_avg, exp_avg_sq, adam_step);
}
static void gpu_upload_params(backend *b, const float *params) { cuda_model_upload_params(model_of(b), params); }
static void gpu_download(backend *b, float *params, float *exp_avg, float *exp_avg_sq) {
    cuda_model_download(model_of(b), params, exp_avg, exp_avg_sq);
}
static void gpu_forward_backward(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                                 float grad_scale, float z_loss) {
    cuda_forward_backward(model_of(b), inputs, targets, B, T, grad_scale, z_loss);
}

// The step's scalars are read back right after it is queued: the one host wait per step
// (docs/cuda.md); the GPU then idles only while the host fetches the next batch and
// launches its first kernels.
static step_result gpu_step(backend *b, double lr, int64_t rows, const train_config *cfg) {
    gpu_backend *g = (gpu_backend *)b;
    cuda_step(g->model, ++g->steps_done, lr, rows, cfg);
    cuda_step_result r;
    CHECK(cuda_step_poll(g->model, &r, true));
    step_result out;
    memset(&out, 0, sizeof out);
    out.loss = r.loss;
    out.z_loss = r.z_loss;
    out.grad_norm = r.grad_norm;
    out.skipped = r.skipped;
    out.adam_step = r.adam_step;
    if (g->steps_done == 1) {
        // The plan counts train_gpt's own buffers; the device also holds the CUDA context,
        // cuBLASLt's workspace and the allocator's own memory.
        printf("train_gpt | gpu memory in use after the first step: %.2f GiB (cudaMemGetInfo; plan %.2f GiB)\n",
               (double)cuda_device_used_bytes() / 1073741824.0,
               (double)cuda_model_device_bytes(g->model) / 1073741824.0);
        fflush(stdout);
    }
    return out;
}
static loss_sums gpu_forward_loss(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T) {
    return cuda_forward_loss(model_of(b), inputs, targets, B, T);
}
static void gpu_last_logits(backend *b, const int32_t *inputs, int64_t T, float *logits) {
    cuda_forward_last_logits(model_of(b), inputs, T, logits);
}
static void gpu_poison_grad(backend *b) { cuda_model_poison_grad(model_of(b)); }
static int64_t gpu_device_bytes(const backend *b) { return cuda_model_device_bytes(((const gpu_backend *)b)->model); }
static void gpu_destroy(backend *b) {
    cuda_model_free(model_of(b));
    free(b);
}

static const backend_ops gpu_ops = {gpu_upload,      gpu_upload_params, gpu_download,    gpu_forward_backward,
                                    gpu_step,        gpu_forward_loss,  gpu_last_logits, gpu_poison_grad,
                                    gpu_device_bytes, gpu_destroy};

backend *cuda_backend_create(const param_table *t, int64_t B, int64_t T) {
    gpu_backend *g = (gpu_backend *)xcalloc(1, sizeof *g);
    g->base.ops = &gpu_ops;
    g->base.name = "cuda";
    g->model = cuda_model_create(t, B, T);
    return &g->base;
}
