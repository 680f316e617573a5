// train_gpt.cu — the trainer: the GPU model, the training loop and the command line, in
// one file that reads top to bottom like the model (llm.c's train_gpt2.cu is the pattern).
//
//   train_gpt CONFIG [--key value | --key=value]...   train (the usual case)
//   train_gpt prepare [options] INPUT...              tokenize text into shards (docs/data.md)
//   train_gpt plan CONFIG [--key value]...            size, FLOPs and memory plan; reads no data
//   train_gpt relay --listen HOST:PORT --secret_file F   the DiLoCo hub, on a login node (docs/diloco.md)
//   train_gpt --help                                  list every config key
//   train_gpt --version
//
// Sections:
//   the GPU model   forward, backward and the step on one GPU, the backend of llmc/backend.h
//                   that the loop drives, and the start-up probe of the CUDA runtime; only
//                   when nvcc (or hipcc, for AMD: cuda/portable.cuh) compiles this file. The
//                   kernels are in cuda/, one concern per file.
//   the training loop   from a checked configuration to a finished run: data → backend step →
//                   metrics → DiLoCo's outer step → validation / samples / checkpoint.
//   the command line    main() (left out with -DTESTING, when a test includes this file).
// One file, two compilers: nvcc with the CUDA backend, else the host C++ compiler (C-style
// C++17: no classes, no exceptions; templates only in the GPU section), which leaves the
// GPU section out; everything this file includes is C11 (docs/architecture.md).
#include "cpu/gemm.h"
#include "cpu/model.h"
#include "dataloader.h"
#include "diloco.h"
#include "llmc/watchdog.h"
#include "llmc/backend.h"
#include "llmc/checkpoint.h"
#include "llmc/comm.h"
#include "llmc/common.h"
#include "llmc/config.h"
#include "llmc/device.h"
#include "llmc/fault.h"
#include "llmc/json.h"
#include "llmc/metrics.h"
#include "llmc/optim.h"
#include "llmc/params.h"
#include "llmc/plot.h"
#include "llmc/plan.h"
#include "llmc/shard.h"
#include "net/relay.h"
#include "net/transport.h"
#include "tok/prepare.h"
#include "tok/sample.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>  // time(): the headers above declare it on x86-64 only by accident, not on aarch64

#ifdef _OPENMP
#include <omp.h>
#endif

#define TRAIN_GPT_VERSION "0.1.0"

// ================================================================ the GPU model
static const gpu_info *gpu_probe(void);

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(TRAIN_GPT_EMULATION)
// nvcc, or hipcc through cuda/portable.cuh, or the CPU emulator of the tests (test/warp_emu.h)
#include "cpu/ops.h"
#include "cuda/collective.h"
#include "cuda/kernels.h"

// The mirror of cpu/model.h + llmc/optim.h's step: the model's parameters, gradients and AdamW
// moments live on the GPU for the whole run (fp32 master weights and moments, a bf16 copy
// of the weights for the matmuls, fp32 gradients accumulated over micro-batches), and the
// host only feeds token batches in and reads scalars and checkpoints out.
//
// A training step, as the backend below drives it (docs/cuda.md has the exact wiring):
//   for each micro-batch:  cuda_forward_backward(m, inputs, targets, B, T, grad_scale, z_loss)
//   then:                  cuda_step(m, step, lr, rows, cfg, limits)
//   for the log:           cuda_step_poll(m, &result, wait)
// None of these waits for the GPU, with two named exceptions: cuda_forward_backward waits
// when the host is two micro-batches ahead of the GPU (its pinned input slots are both in
// flight: back-pressure, not a round trip), and cuda_step_poll(wait = true) waits for the
// step it returns. Everything of a step, including the outlier guard (a NaN/Inf loss or
// gradient norm skips the update), clipping and AdamW's step count, is decided on the GPU,
// so the log can read a step's numbers one step later without holding the GPU up.
//
// Synchronous by nature (outside steps): create/free, upload/download (checkpoints,
// DiLoCo), cuda_forward_loss (validation), cuda_forward_logits (tests, sampling).
//
// Checkpoints are the CPU backend's: download the fp32 params and moments into the
// trainer's host buffers and call checkpoint_save; on resume, checkpoint_load into the
// host buffers and upload them (with the state's adam_step). The bf16 weights are always
// recomputed from the fp32 master by round-to-nearest, so a resumed GPU run is bit-exact.
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
// one copy of the step's scalars back.
//
// FSDP (a job of several GPU ranks, docs/fsdp.md "The GPU path"): the same passes over units
// (llmc/shard.h), in cpu/model.c's order of acquire / prefetch / release / grads / grads_done.
// The model's buffers then hold this rank's pieces; a unit's bf16 weights are all-gathered
// into a slot before use, its gradient reduce-scattered from a slot after its backward (an
// all-to-all and a rank-order sum: cuda/collective.cu), both on a comm stream; the norm gains
// are read from an fp32 copy every rank keeps, the embedding's lookup from an fp32 gather.
// With one rank none of that runs and the buffers are the whole model, as before.
typedef struct cuda_model cuda_model;

// What one step did, read back from the GPU by cuda_step_poll.
typedef struct {
    int64_t step;         // the step number passed to cuda_step (1-based steps done, as the loop counts)
    double loss;          // mean cross-entropy over the step's rows (nats)
    double z_loss;        // z_loss · mean(lse²)
    double grad_norm;     // global norm before clipping
    double clip_coef;     // factor applied to the gradients (1 = not clipped)
    double ce_sum, lse_sq_sum;
    int64_t rows;
    int64_t adam_step;    // AdamW's t after the step (unchanged if skipped)
    bool skipped;         // the outlier guard skipped the update (NaN/Inf or a spike)
    bool spike;           // skipped as a spike
    double gpu_ms;        // GPU time from the step's first micro-batch to the end of AdamW
} cuda_step_result;

enum { INPUT_SLOTS = 2, RESULT_SLOTS = 8 };

// FSDP on GPUs (issue #14; docs/fsdp.md "The GPU path"): the ranks of one group, and how the
// model is cut over them (llmc/shard.h). NULL comms and ranks 1: one process, the whole model.
typedef struct {
    int rank, ranks;           // in the FSDP group
    gpu_comm *group;           // NULL: one rank (no sharding)
    gpu_comm *copies;          // HSDP: the ranks holding the same pieces in the other copies; NULL: none
    int copies_size;
    bool reshard, prefetch;    // fsdp_reshard_after_forward, fsdp_prefetch
} gpu_shard;

// A whole unit's bf16 weights, gathered from the group's bf16 pieces (what the matmuls read;
// the norm gains and the embedding lookup read fp32, which cuda_model keeps apart).
typedef struct {
    int unit;                  // the unit it holds, -1 when free
    int refs;
    bool keep;                 // held from the forward to the backward (fsdp_reshard_after_forward = 0)
    int64_t cap;               // values it holds: its units' whole size
    bf16 *w16;                 // (cap)
    cudaEvent_t ready;         // the gather is done (on the comm stream)
} gather_slot;

// A whole unit's gradient while its backward runs, then the source of its reduce-scatter.
typedef struct {
    int unit;                  // -1 when free
    int64_t cap;
    float *g;                  // (cap)
    cudaEvent_t sent;          // its last reduce-scatter has read it (on the comm stream)
    int64_t freed;             // when it was last given back (m->grad_clock): the oldest is taken first,
                               // so that a layer's backward does not wait for the previous layer's scatter
} grad_slot;
enum { GRAD_SLOTS = PLAN_GPU_GRAD_SLOTS };

// bf16 logits (their gradient in place) per classifier chunk, at most this many bytes (1.5 GiB):
// 6 278 rows at Llama 3's vocabulary, so gpt-1b's 8 × 2048 tokens take 3 chunks (GPT-2's
// vocabulary: 16 008 rows, 8 × 4096 tokens in 3); boom-14b's 4096 tokens fit in one.
static const int64_t LOGITS_CHUNK_BYTES = (int64_t)3 << 29;
#ifdef TESTING
// test/test_gpu_step.cu sets it lower before cuda_model_create, so that its few hundred rows
// take several chunks: the loop's later chunks, a partial last one, the head's gradient
// summed over chunks and copy_logits' loop, which no test's size reaches at 1.5 GiB.
static int64_t test_logits_chunk_bytes = LOGITS_CHUNK_BYTES;
#endif
static int64_t logits_chunk_bytes(void) {
#ifdef TESTING
    return test_logits_chunk_bytes;
#else
    return LOGITS_CHUNK_BYTES;
#endif
}

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
        banner("kernel profile: needs at least 2 steps (the first is left out)\n");
        return;
    }
    double total = 0.0;
    for (int f = 0; f < K_FAMILY_COUNT; f++) total += p->total_ms[f];
    banner("kernel time per step (TRAIN_GPT_PROFILE, CUDA events, mean of %lld steps after the first):\n",
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
        banner("  %-30s %9.2f ms %6.1f %%\n", family_names[f], p->total_ms[f] / (double)n,
               total > 0 ? 100.0 * p->total_ms[f] / total : 0.0);
    }
    banner("  %-30s %9.2f ms\n", "total (first mark to last)", total / (double)n);
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
    model_dims dims;           // llmc/params.h
    float eps;
    bool sizing_only;          // count bytes, allocate nothing, touch no GPU (memory plans)
    int64_t device_bytes;
    int64_t state_bytes;       // of which the weights, gradients, moments and bf16 copy (this rank's pieces)
    // The attention kernels (TRAIN_GPT_ATTENTION): ATT_WMMA (the default, cuda/attention.cu),
    // ATT_FA2 (softmax in registers, cuda/attention_fa2.cuh; not yet run on a GPU), ATT_SIMPLE
    // (the one-warp-per-row reference, any head_dim).
    enum { ATT_WMMA, ATT_FA2, ATT_SIMPLE } attention;

    cudaStream_t stream;
    matmul_context *mm;

    float *params, *grads, *exp_avg, *exp_avg_sq;   // (numel) fp32, the table's layout
    bf16 *params_bf16;                              // (numel)
    adamw_chunk *chunks;
    int64_t num_chunks;

    float **resid;             // L+1 × (N,C) fp32: resid[l] enters layer l
    layer_acts *layers;
    // Activation recomputation (issue #18; llmc/config.h): a layer whose mode is full keeps only
    // resid[l], its layer_acts all point into `spare`, and its backward first runs its forward
    // again; a selective layer keeps the matmuls' inputs and outputs and recomputes its two
    // RMSNorm outputs, QK-norm + RoPE and SwiGLU's product (and their 1/rms statistics) into
    // the spare's buffers. The same kernels on the same inputs give the same bits, so a step's gradients
    // are those of recompute = none, bit for bit (test/test_gpu_step.cu).
    recompute_setting recompute;
    layer_acts spare;
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

    bf16 *logits;              // (chunk_rows, ld_logits) bf16, turned into their gradient in place
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

    // FSDP / HSDP (gpu_shard). params, grads, the moments and params_bf16 hold this rank's
    // pieces (n_local values, llmc/shard.h's local layout); with one rank that is the table's
    // layout and none of the rest is used. Gathers and reduce-scatters run on comm_stream (the
    // model's stream without fsdp_prefetch), ordered against the model's stream by events.
    gpu_shard shard;
    shard_map map;
    int64_t n_local;
    bool sharded;              // an FSDP group of more than one rank
    cudaStream_t comm_stream;
    cudaEvent_t order;         // scratch: one stream waits for what another has queued so far
    cudaEvent_t host_done;     // the host waits for the streams (settle)
    int num_gathers;
    gather_slot *gathers;
    int *slot_of;              // unit → its gather slot, -1
    grad_slot grad_slots[GRAD_SLOTS];
    int *grad_of;              // unit → its grad slot, -1
    float *recv;               // (xfer) an all-to-all's receive buffer
    float *xfer_sum;           // (xfer / copies) HSDP's all-reduce: a chunk's sum
    int64_t xfer;
    double *partials_all;      // (max(ranks, copies) × GRAD_NORM_BLOCKS)
    double *sums_all;          // (max(ranks, copies) × 2)
    // What reads fp32 weights under FSDP: the norm gains, replicated in fp32 on every rank and
    // brought up to date after each change of the weights (sync_gains: a rank's own gain values,
    // zeros elsewhere, all-gathered and added — exact, one value is not zero), and the embedding,
    // gathered in fp32 for its lookup at the start of each forward.
    float *gains;              // (gain_numel) every norm gain, the table's order
    float *gains_mine;         // (gain_numel) this rank's values of them, zeros elsewhere
    float *gains_recv;         // (ranks × gain_numel)
    int64_t gain_numel;
    int64_t *gain_at;          // host: tensor index → its offset in gains, -1 for matrices
    copy_stretch *gain_stretches;  // (num_gain_stretches) this rank's pieces of the gains: local → gains_mine
    int64_t num_gain_stretches;
    float *embed32;            // (unit 0 whole) the embedding in fp32 while its lookup runs: the largest
                               // unit gradient's slot, which no backward uses while a forward begins
    bool embed_held;
    cudaEvent_t embed_ready;
    int64_t gathered_bytes, gathered_peak, grad_floats, grad_peak;
    int64_t grad_clock;
};

static void stream_after(cuda_model *m, cudaStream_t to, cudaStream_t from);
static void settle(cuda_model *m);
static void sync_gains(cuda_model *m);

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
    return cuda_alloc((size_t)bytes, "the model's buffers", m->device_bytes - bytes);
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
    for (int l = 0; l < (int)m->dims.L; l++) {
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

// Every device buffer of the model in one table, with its element type and count (fields
// of cuda_model and of each layer's layer_acts): create() allocates from it, or only adds
// up its bytes for a memory plan, and cuda_model_free() releases from it. The counts need
// m->dims, num_chunks, ld_logits and chunk_rows, and the host arrays resid and layers.
typedef struct {
    void **slot;    // the pointer to fill
    int64_t count;  // elements
    size_t elem;    // bytes per element
} device_buffer;

// The table (caller frees); *count receives its length.
static device_buffer *device_buffers(cuda_model *m, int *count) {
    const model_dims *d = &m->dims;
    int64_t N = d->N, C = d->C, F = d->F, n_local = m->n_local;
    int cap = 64 + 13 * (int)(d->L + 2) + 2 * m->num_gathers + GRAD_SLOTS, n = 0;  // 13 per layer with the residual
                                                                                 // and the spare, < 64 others
    device_buffer *b = (device_buffer *)xcalloc((size_t)cap, sizeof *b);
#define BUFFER(ptr, type, elems)            \
    do {                                    \
        CHECK(n < cap);                     \
        b[n].slot = (void **)&(ptr);        \
        b[n].count = (int64_t)(elems);      \
        b[n].elem = sizeof(type);           \
        n++;                                \
    } while (0)
    // fp32 master weights, gradients, AdamW's moments: this rank's pieces (the whole model with
    // one rank). The gradients have room for HSDP's all-reduce to round up to whole pieces.
    BUFFER(m->params, float, n_local);
    BUFFER(m->grads, float, n_local + m->shard.copies_size);
    BUFFER(m->exp_avg, float, n_local);
    BUFFER(m->exp_avg_sq, float, n_local);
    BUFFER(m->params_bf16, bf16, n_local);  // the matmuls' copy (sharded: AdamW writes it, the gathers do not read it)
    BUFFER(m->chunks, adamw_chunk, m->num_chunks);
    if (m->sharded) {  // gathered units and unit gradients, each as big as the largest unit
        for (int k = 0; k < m->num_gathers; k++) BUFFER(m->gathers[k].w16, bf16, m->gathers[k].cap);
        for (int k = 0; k < GRAD_SLOTS; k++) BUFFER(m->grad_slots[k].g, float, m->grad_slots[k].cap);
        BUFFER(m->gains, float, m->gain_numel);
        BUFFER(m->gains_mine, float, m->gain_numel);
        BUFFER(m->gains_recv, float, m->gain_numel * m->map.ranks);
        BUFFER(m->gain_stretches, copy_stretch, m->num_gain_stretches);
    }
    if (m->xfer > 0) {
        int most = m->shard.ranks > m->shard.copies_size ? m->shard.ranks : m->shard.copies_size;
        BUFFER(m->recv, float, m->xfer);
        if (m->shard.copies) BUFFER(m->xfer_sum, float, m->xfer / m->shard.copies_size);
        BUFFER(m->partials_all, double, (int64_t)most * GRAD_NORM_BLOCKS);
        BUFFER(m->sums_all, double, (int64_t)most * 2);
    }
    for (int64_t l = 0; l <= d->L; l++) BUFFER(m->resid[l], float, N * C);  // the residual stream
    // What each layer keeps for its backward (recompute: fewer), and the spare layer that the
    // recomputing layers share (as much of one as the most recomputing layer needs).
    recompute_mode most = RECOMPUTE_NONE;
    for (int64_t l = 0; l < d->L; l++) {
        recompute_mode mode = recompute_of_layer(m->recompute, l);
        if (mode > most) most = mode;
    }
    for (int64_t l = 0; l <= d->L; l++) {
        bool spare = l == d->L;
        recompute_mode mode = spare ? RECOMPUTE_NONE : recompute_of_layer(m->recompute, l);
        if (spare && most == RECOMPUTE_NONE) break;
        layer_acts *a = spare ? &m->spare : &m->layers[l];
        bool kept = spare ? most == RECOMPUTE_FULL : mode == RECOMPUTE_NONE || mode == RECOMPUTE_SELECTIVE;
        bool cheap = spare || mode == RECOMPUTE_NONE;  // the outputs selective recomputes
        if (kept) {
            BUFFER(a->resid_mid, float, N * C);
            BUFFER(a->qkv, bf16, N * d->QKV);
            BUFFER(a->att, bf16, N * d->QD);
            BUFFER(a->lse, float, N * d->Hq);
            BUFFER(a->gate_up, bf16, N * 2 * F);
        }
        if (cheap) {
            BUFFER(a->attn_in, bf16, N * C);
            BUFFER(a->attn_rstd, float, N);
            if (m->cfg.qk_norm) {
                BUFFER(a->qk, bf16, N * (d->QD + d->KD));
                BUFFER(a->qk_rstd, float, N * (d->Hq + d->Hkv));
            }
            BUFFER(a->mlp_in, bf16, N * C);
            BUFFER(a->mlp_rstd, float, N);
            BUFFER(a->act, bf16, N * F);
        }
    }
    BUFFER(m->final_out, bf16, N * C);
    BUFFER(m->final_rstd, float, N);
    BUFFER(m->rope_cos, float, d->T * (d->D / 2));
    BUFFER(m->rope_sin, float, d->T * (d->D / 2));
    BUFFER(m->d_inputs, int32_t, N);  // a micro-batch's inputs
    BUFFER(m->d_targets, int32_t, N);
    BUFFER(m->d_start, int32_t, N);
    BUFFER(m->d_pos, int32_t, N);
    BUFFER(m->d_unique, int32_t, N);
    BUFFER(m->d_offsets, int32_t, N + 1);
    BUFFER(m->d_positions, int32_t, N);
    BUFFER(m->d_resid, float, N * C);  // backward scratch, shared by the layers
    BUFFER(m->d_resid_bf16, bf16, N * C);
    BUFFER(m->d_norm, float, N * C);
    BUFFER(m->d_final, float, N * C);
    BUFFER(m->d_att, bf16, N * d->QD);
    BUFFER(m->d_qkv, bf16, N * d->QKV);
    BUFFER(m->d_act, bf16, N * F);
    BUFFER(m->d_gate_up, bf16, N * 2 * F);
    BUFFER(m->delta, float, N * d->Hq);
    BUFFER(m->gain_scratch, float,
           max_i64(rmsnorm_gain_scratch_floats(N, C), qknorm_gain_scratch_floats(N, (int)d->Hq, (int)d->D)));
    BUFFER(m->logits, bf16, m->chunk_rows * m->ld_logits);  // the classifier, a chunk of rows at a time
    BUFFER(m->row_ce, float, N);
    BUFFER(m->row_lse, float, N);
    BUFFER(m->st, step_scalars, 1);  // the step's scalars
    BUFFER(m->norm_partials, double, GRAD_NORM_BLOCKS);
    BUFFER(m->eval_sums, double, 2);
#undef BUFFER
    *count = n;
    return b;
}

// Points what a recomputing layer does not keep at the spare layer (device_buffers allocated
// only what each keeps).
static void share_spare(cuda_model *m) {
    for (int64_t l = 0; l < m->dims.L; l++) {
        layer_acts *a = &m->layers[l];
        switch (recompute_of_layer(m->recompute, l)) {
        case RECOMPUTE_NONE: break;
        case RECOMPUTE_FULL: *a = m->spare; break;
        case RECOMPUTE_SELECTIVE:
            a->attn_in = m->spare.attn_in;
            a->attn_rstd = m->spare.attn_rstd;
            a->qk = m->spare.qk;
            a->qk_rstd = m->spare.qk_rstd;
            a->mlp_in = m->spare.mlp_in;
            a->mlp_rstd = m->spare.mlp_rstd;
            a->act = m->spare.act;
            break;
        }
    }
}

static int64_t rounded(int64_t bytes);

// AdamW's chunks over this rank's pieces: each inside one tensor, at most ADAMW_CHUNK_ELEMS long,
// at local offsets (the padding of the last pieces belongs to no chunk and stays zero).
typedef struct {
    adamw_chunk *out;   // NULL: count only
    int64_t count;
    bool decay;
} chunk_list;

static void add_chunks(void *ctx, int64_t global, int64_t local, int64_t count) {
    (void)global;
    chunk_list *c = (chunk_list *)ctx;
    for (int64_t s = 0; s < count; s += ADAMW_CHUNK_ELEMS) {
        if (c->out) {
            c->out[c->count].start = local + s;
            c->out[c->count].count = (int32_t)min_i64(ADAMW_CHUNK_ELEMS, count - s);
            c->out[c->count].decay = c->decay ? 1 : 0;
        }
        c->count++;
    }
}

static int64_t local_chunks(const cuda_model *m, adamw_chunk *out) {
    chunk_list c = {out, 0, false};
    for (int i = 0; i < m->table->count; i++) {
        const param_info *p = &m->table->params[i];
        c.decay = p->decay;
        shard_visit(&m->map, p->offset, p->offset + p->numel, add_chunks, &c);
    }
    return c.count;
}

// The stretches of tensor i (a norm gain) that this rank holds, as copies from the local
// pieces into gains_mine; written to out from index at (NULL: counted only). Returns how many.
typedef struct {
    copy_stretch *out;
    int64_t at, n, tensor_offset, gain_offset;
} stretch_list;

static void add_stretch(void *ctx, int64_t global, int64_t local, int64_t count) {
    stretch_list *l = (stretch_list *)ctx;
    if (l->out) l->out[l->at + l->n] = (copy_stretch){local, l->gain_offset + (global - l->tensor_offset), count};
    l->n++;
}

static int64_t gain_stretches(const cuda_model *m, int i, copy_stretch *out, int64_t at) {
    const param_info *p = &m->table->params[i];
    stretch_list l = {out, at, 0, p->offset, m->gain_at[i]};
    shard_visit(&m->map, p->offset, p->offset + p->numel, add_stretch, &l);
    return l.n;
}

static cuda_model *create(const param_table *t, int64_t B, int64_t T, recompute_setting recompute, bool sizing_only,
                          const gpu_shard *sh) {
    const model_config *c = &t->cfg;
    CHECK(B >= 1 && T >= 1 && T <= c->seq_len && recompute.every >= 1);
    cuda_model *m = (cuda_model *)xcalloc(1, sizeof *m);
    m->table = t;
    if (sh) m->shard = *sh;
    else m->shard.ranks = 1;
    if (m->shard.copies_size < 1) m->shard.copies_size = 1;
    shard_map_build(&m->map, t, m->shard.rank, m->shard.ranks);
    m->n_local = m->map.local_numel;
    m->sharded = m->shard.ranks > 1 || m->shard.group;  // (a group of one: TRAIN_GPT_FSDP_UNITS=1)
    if (m->sharded) {
        // Gathered units held at once (llmc/plan.h): two layers (the one in use and the
        // prefetched one), or a layer and the final unit, or the final unit and a tied head's
        // (the embedding's): two slots of a layer's size and one of the largest unit's. Without
        // resharding every unit from its forward to its backward: a slot of each unit's size.
        // Unit gradients held at once: the largest (the head's, or a tied embedding's from the
        // head's backward to the embedding's) and two layers' (the one whose backward runs and the
        // one being reduce-scattered). A unit takes the smallest free slot that holds it.
        int64_t layer_unit = 0, *whole = (int64_t *)xmalloc((size_t)m->map.count * sizeof(int64_t));
        for (int u = 0; u < m->map.count; u++) whole[u] = m->map.units[u].piece * m->map.ranks;
        for (int u = 1; u <= (int)c->n_layer; u++) layer_unit = max_i64(layer_unit, whole[u]);
        m->num_gathers = m->shard.reshard ? PLAN_GPU_GATHER_SLOTS : m->map.count;
        m->gathers = (gather_slot *)xcalloc((size_t)m->num_gathers, sizeof *m->gathers);
        for (int k = 0; k < m->num_gathers; k++)
            m->gathers[k].cap = m->shard.reshard ? (k == 0 ? m->map.max_unit : layer_unit) : whole[k];
        for (int k = 0; k < GRAD_SLOTS; k++) m->grad_slots[k].cap = k == 0 ? m->map.max_unit : layer_unit;
        free(whole);
        m->slot_of = (int *)xmalloc((size_t)m->map.count * sizeof(int));
        m->grad_of = (int *)xmalloc((size_t)m->map.count * sizeof(int));
        for (int u = 0; u < m->map.count; u++) m->slot_of[u] = m->grad_of[u] = -1;
        for (int k = 0; k < m->num_gathers; k++) m->gathers[k].unit = -1;
        for (int k = 0; k < GRAD_SLOTS; k++) m->grad_slots[k].unit = -1;
        m->xfer = m->map.max_unit;
        m->gain_at = (int64_t *)xmalloc((size_t)t->count * sizeof(int64_t));
        for (int i = 0; i < t->count; i++) {
            m->gain_at[i] = t->params[i].ndim == 1 ? m->gain_numel : -1;
            if (t->params[i].ndim == 1) {
                m->gain_numel += t->params[i].numel;
                m->num_gain_stretches += gain_stretches(m, i, NULL, 0);
            }
        }
    }
    if (m->shard.copies_size > 1) {
        int64_t chunk = min_i64(m->n_local + m->shard.copies_size, (int64_t)1 << 26);
        if (chunk > m->xfer) m->xfer = chunk;
    }
    m->recompute = recompute;
    m->cfg = *c;
    m->sizing_only = sizing_only;
    m->dims = model_dims_of(c, B, T);
    m->eps = (float)c->norm_eps;
    check_layout(m);
    // The fast attention kernels exist for head_dim 32, 64 and 128. Another head_dim would
    // run on the one-warp-per-row reference kernels, O(T²) work at minutes per step: only
    // when the user asks for them.
    // The default is WMMA; where the build has mma.sync but no WMMA (the CPU emulator of the
    // tests, test/warp_emu.h), the register-resident kernels; HIP has neither and runs its
    // MFMA kernels (the portable ones for another head_dim) for wmma and fa2 alike.
    const char *choice = getenv("TRAIN_GPT_ATTENTION");
    m->attention = !HAVE_NVIDIA_TENSOR_CORES && HAVE_MMA_SYNC ? cuda_model::ATT_FA2 : cuda_model::ATT_WMMA;
    if (choice && strcmp(choice, "simple") == 0) m->attention = cuda_model::ATT_SIMPLE;
    else if (choice && strcmp(choice, "fa2") == 0) m->attention = cuda_model::ATT_FA2;
    else if (choice && *choice && strcmp(choice, "wmma") != 0 && !sizing_only)
        fail("TRAIN_GPT_ATTENTION=%s: the attention kernels are wmma (the default), fa2 or simple", choice);
    if (!sizing_only) {
        if (m->dims.D % 8 != 0 || m->dims.D > 256)
            fail("head_dim %lld: the CUDA backend needs a multiple of 8, at most 256", (long long)m->dims.D);
        if (m->attention != cuda_model::ATT_SIMPLE && !attention_supports_head_dim((int)m->dims.D))
            fail("head_dim %lld: the CUDA backend's attention kernels support head_dim 32, 64 and 128 (set "
                 "TRAIN_GPT_ATTENTION=simple to train on the slow reference kernels, or use the CPU backend)",
                 (long long)m->dims.D);
    }
    bool tiled_d = m->dims.D == 32 || m->dims.D == 64 || m->dims.D == 128;
    if (!sizing_only && m->attention == cuda_model::ATT_FA2 && HAVE_MMA_SYNC)
        banner("attention: the register-resident kernels (cuda/attention_fa2.cuh)\n");
    else if (!sizing_only && m->attention != cuda_model::ATT_SIMPLE && tiled_d && attention_mfma_available())
        banner("attention: the MFMA kernels (cuda/attention_mfma.cuh: AMD matrix cores; not yet run on "
               "an AMD GPU)\n");
    else if (!sizing_only && (m->attention == cuda_model::ATT_SIMPLE || !HAVE_NVIDIA_TENSOR_CORES))
        banner("attention: the portable one-warp-per-row kernels (%s: slow at long sequences)\n",
               m->attention == cuda_model::ATT_SIMPLE ? "TRAIN_GPT_ATTENTION=simple"
               : HAVE_MFMA && tiled_d                 ? "this GPU has no v_mfma_f32_16x16x16bf16_1k"
               : HAVE_MFMA                            ? "head_dim other than 32, 64, 128"
                                                      : "no matrix-core attention for this GPU yet");

    int64_t N = m->dims.N;
    if (!sizing_only) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
        m->mm = matmul_create();
    }
    m->device_bytes += 32 << 20;  // the matmul workspace (matmul.cu)

    m->num_chunks = local_chunks(m, NULL);
    // Rows of the logits' row stride padded to 64 elements: aligned rows for the kernels.
    m->ld_logits = (m->dims.V + 63) / 64 * 64;
    m->chunk_rows = max_i64(1, min_i64(N, logits_chunk_bytes() / (m->ld_logits * 2)));
    m->resid = (float **)xcalloc((size_t)m->dims.L + 1, sizeof *m->resid);
    m->layers = (layer_acts *)xcalloc((size_t)m->dims.L, sizeof *m->layers);
    int count = 0;
    device_buffer *buffers = device_buffers(m, &count);
    for (int i = 0; i < count; i++) {
        *buffers[i].slot = take_bytes(m, buffers[i].count * (int64_t)buffers[i].elem);
        void **state[] = {(void **)&m->params, (void **)&m->grads, (void **)&m->exp_avg, (void **)&m->exp_avg_sq,
                          (void **)&m->params_bf16};
        for (size_t k = 0; k < sizeof state / sizeof state[0]; k++)
            if (buffers[i].slot == state[k]) m->state_bytes += rounded(buffers[i].count * (int64_t)buffers[i].elem);
    }
    free(buffers);
    share_spare(m);
    if (m->sharded) m->embed32 = m->grad_slots[0].g;
    if (sizing_only) return m;

    adamw_chunk *host = (adamw_chunk *)xmalloc((size_t)m->num_chunks * sizeof *host);
    CHECK(local_chunks(m, host) == m->num_chunks);
    CUDA_CHECK(cudaMemcpy(m->chunks, host, (size_t)m->num_chunks * sizeof *host, cudaMemcpyHostToDevice));
    free(host);
    CUDA_CHECK(cudaMemset(m->grads, 0, (size_t)(m->n_local + m->shard.copies_size) * sizeof(float)));
    if (m->sharded) {
        copy_stretch *table = (copy_stretch *)xmalloc((size_t)max_i64(1, m->num_gain_stretches) * sizeof *table);
        int64_t at = 0;
        for (int i = 0; i < t->count; i++)
            if (m->gain_at[i] >= 0) at += gain_stretches(m, i, table, at);
        CHECK(at == m->num_gain_stretches);
        CUDA_CHECK(cudaMemcpy(m->gain_stretches, table, (size_t)at * sizeof *table, cudaMemcpyHostToDevice));
        free(table);
        CUDA_CHECK(cudaMemset(m->gains_mine, 0, (size_t)m->gain_numel * sizeof(float)));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->embed_ready, cudaEventDisableTiming));
    }
    if (m->sharded || m->shard.copies) {
        if (m->sharded && m->shard.prefetch)
            CUDA_CHECK(cudaStreamCreateWithFlags(&m->comm_stream, cudaStreamNonBlocking));
        else m->comm_stream = m->stream;
        CUDA_CHECK(cudaEventCreateWithFlags(&m->order, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->host_done, cudaEventDisableTiming));
        for (int k = 0; k < m->num_gathers; k++)
            CUDA_CHECK(cudaEventCreateWithFlags(&m->gathers[k].ready, cudaEventDisableTiming));
        for (int k = 0; k < GRAD_SLOTS; k++)
            CUDA_CHECK(cudaEventCreateWithFlags(&m->grad_slots[k].sent, cudaEventDisableTiming));
    }

    CUDA_CHECK(cudaMemset(m->st, 0, sizeof(step_scalars)));
    float *cos_h = alloc_floats((size_t)(T * (m->dims.D / 2))), *sin_h = alloc_floats((size_t)(T * (m->dims.D / 2)));
    rope_tables(cos_h, sin_h, T, m->dims.D, c->rope_theta);
    CUDA_CHECK(cudaMemcpy(m->rope_cos, cos_h, (size_t)(T * (m->dims.D / 2)) * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m->rope_sin, sin_h, (size_t)(T * (m->dims.D / 2)) * sizeof(float), cudaMemcpyHostToDevice));
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
    m->bucket_counts = (int32_t *)xcalloc((size_t)m->dims.V, sizeof(int32_t));
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

// Allocates everything for micro-batches of up to B × T tokens on the current GPU (device
// 0 unless the caller chose another with the CUDA runtime). Gradients start at zero; the
// parameters are undefined until cuda_model_upload. Fatal (with a HINT) if memory runs out.
// The backward recomputes activations as `recompute` says (cuda_model's comment; RECOMPUTE_OFF:
// none).
cuda_model *cuda_model_create(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    return create(t, B, T, recompute, false, NULL);
}

// The same for one rank of an FSDP group (and HSDP copies): sh says which (gpu_shard); the
// buffers then hold this rank's pieces, and the passes gather and reduce-scatter units.
cuda_model *cuda_model_create_sharded(const param_table *t, int64_t B, int64_t T, recompute_setting recompute,
                                      const gpu_shard *sh) {
    return create(t, B, T, recompute, false, sh);
}

// Device memory the model allocated, in bytes (for the start-up banner).
int64_t cuda_model_device_bytes(const cuda_model *m) { return m->device_bytes; }

// Bytes in use on the current GPU by every allocation of this process and its CUDA context
// (cudaMemGetInfo: total − free; other processes on the GPU count too). 0 without a GPU.
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
    free(m->gathers);
    free(m->slot_of);
    free(m->grad_of);
    free(m->gain_at);
    shard_map_free(&m->map);
    free(m);
}

// The same figure without a GPU (memory plans, `train_gpt plan`).
int64_t cuda_model_plan_bytes(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    cuda_model *m = create(t, B, T, recompute, true, NULL);
    int64_t bytes = m->device_bytes;
    free_host_side(m);
    return bytes;
}

// The part of that figure an FSDP rank holds whatever its share of the model: everything but
// the fp32 weights, gradients and moments, the bf16 copy and AdamW's chunk list (activations,
// scratch, tables, the matmul workspace), for a model that recomputes as `recompute` says.
// llmc/plan.h adds the rank's pieces and gathered units.
int64_t cuda_model_plan_activation_bytes(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    cuda_model *m = create(t, B, T, recompute, true, NULL);
    int count = 0;
    device_buffer *b = device_buffers(m, &count);
    void **state[] = {(void **)&m->params, (void **)&m->grads, (void **)&m->exp_avg, (void **)&m->exp_avg_sq,
                      (void **)&m->params_bf16, (void **)&m->chunks};
    int64_t bytes = m->device_bytes;
    for (int i = 0; i < count; i++)
        for (size_t s = 0; s < sizeof state / sizeof state[0]; s++)
            if (b[i].slot == state[s]) bytes -= (b[i].count * (int64_t)b[i].elem + 255) / 256 * 256;
    free(b);
    free_host_side(m);
    return bytes;
}

// One layer's part of that figure under recomputation: the per-layer buffers of device_buffers, each rounded
// as take_bytes rounds, split as cpu/model.h splits the CPU's: selective keeps what a matmul
// or the attention core made (resid_mid fp32, qkv, att, lse, gate_up) and recomputes into one
// layer's scratch shared by all layers both norms' outputs and 1/rms, QK-norm's output and 1/rms
// and SwiGLU's act (RoPE without QK-norm rotates qkv in place: nothing to keep twice); full
// keeps nothing but the layer's input (resid[l], counted apart), its scratch is a whole layer.
// With scratch: what the mode's shared scratch holds.
static int64_t rounded(int64_t bytes) { return (bytes + 255) / 256 * 256; }  // as take_bytes rounds
static int64_t cuda_layer_plan_bytes(const model_dims *d, bool qk_norm, recompute_mode mode, bool scratch) {
    int64_t N = d->N, C = d->C, F = d->F;
    int64_t products = rounded(N * C * 4) + rounded(N * d->QKV * 2) + rounded(N * d->QD * 2) + rounded(N * d->Hq * 4) +
                       rounded(N * 2 * F * 2);
    int64_t recomputed = 2 * (rounded(N * C * 2) + rounded(N * 4)) + rounded(N * F * 2) +
                         (qk_norm ? rounded(N * (d->QD + d->KD) * 2) + rounded(N * (d->Hq + d->Hkv) * 4) : 0);
    if (scratch) return mode == RECOMPUTE_FULL ? products + recomputed : mode == RECOMPUTE_SELECTIVE ? recomputed : 0;
    return mode == RECOMPUTE_FULL ? 0 : mode == RECOMPUTE_SELECTIVE ? products : products + recomputed;
}

// cuda_model_plan_activation_bytes split for the plan (llmc/plan.h): activations = the
// residual stream entering each layer and leaving the last (fp32), the final norm's output
// and 1/rms, what each layer keeps under `r` and the recompute scratch; workspace = the rest
// (the backward's scratch, a chunk of logits, RoPE tables, inputs, the matmul workspace).
activation_plan cuda_model_plan_activations(const param_table *t, int64_t B, int64_t T, recompute_setting r) {
    int64_t all = cuda_model_plan_activation_bytes(t, B, T, RECOMPUTE_OFF);
    model_dims d = model_dims_of(&t->cfg, B, T);
    bool qk = t->cfg.qk_norm;
    int64_t N = d.N;
    int64_t stream = (d.L + 1) * rounded(N * d.C * 4) + rounded(N * d.C * 2) + rounded(N * 4);
    int64_t layers = cuda_layer_plan_bytes(&d, qk, r.mode, true);
    for (int64_t l = 0; l < d.L; l++) layers += cuda_layer_plan_bytes(&d, qk, recompute_of_layer(r, l), false);
    activation_plan a;
    a.workspace = all - stream - d.L * cuda_layer_plan_bytes(&d, qk, RECOMPUTE_NONE, false);
    a.activations = stream + layers;
    // The formula must be what create() allocates under r (test_plan.sh runs this on every
    // mode): a change to one without the other stops here, not in a user's plan.
    int64_t allocated = cuda_model_plan_activation_bytes(t, B, T, r) - a.workspace;
    if (allocated != a.activations)
        fail("internal error: the CUDA activation plan (%lld bytes) differs from the allocation (%lld) for recompute %s",
             (long long)a.activations, (long long)allocated, recompute_name(r.mode));
    return a;
}

void cuda_model_free(cuda_model *m) {
    if (!m) return;
    settle(m);
    if (m->comm_stream) {
        for (int k = 0; k < m->num_gathers; k++) cudaEventDestroy(m->gathers[k].ready);
        for (int k = 0; k < GRAD_SLOTS; k++) cudaEventDestroy(m->grad_slots[k].sent);
        if (m->sharded) cudaEventDestroy(m->embed_ready);
        cudaEventDestroy(m->order);
        cudaEventDestroy(m->host_done);
        if (m->comm_stream != m->stream) cudaStreamDestroy(m->comm_stream);
    }
    if (m->profile) profile_print(m->profile);
    profile_free(m->profile);
    int count = 0;
    device_buffer *buffers = device_buffers(m, &count);
    for (int i = 0; i < count; i++) cudaFree(*buffers[i].slot);
    free(buffers);
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

// `to` runs nothing more until what `from` has queued so far is done (nothing when they are the same).
static void stream_after(cuda_model *m, cudaStream_t to, cudaStream_t from) {
    if (to == from) return;
    CUDA_CHECK(cudaEventRecord(m->order, from));
    CUDA_CHECK(cudaStreamWaitEvent(to, m->order, 0));
}

// Waits for everything queued on the model's streams (the host reads or writes its buffers next).
// The host waits for `done`; with peers (FSDP, HSDP) it gives up after comm_timeout_s, since
// queued collectives of a rank that died would never finish (gpu_comm_wait).
static void host_wait(const cuda_model *m, cudaEvent_t done, const char *what) {
    gpu_comm *peers = m->shard.group ? m->shard.group : m->shard.copies;
    if (peers) gpu_comm_wait(peers, peers == m->shard.copies ? NULL : m->shard.copies, done, what);
    else CUDA_CHECK(cudaEventSynchronize(done));
}

static void settle(cuda_model *m) {
    if (!m->shard.group && !m->shard.copies) {
        CUDA_CHECK(cudaStreamSynchronize(m->stream));
        return;
    }
    stream_after(m, m->stream, m->comm_stream);
    CUDA_CHECK(cudaEventRecord(m->host_done, m->stream));
    host_wait(m, m->host_done, "the GPU's queued work");
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

// Host → GPU: fp32 params (required), moments (NULL = zero) in the table's flat layout, and
// AdamW's t (the checkpoint state's adam_step; 0 for a fresh run). Synchronous.
void cuda_model_upload(cuda_model *m, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step) {
    CHECK(params != NULL);
    settle(m);
    upload_floats(m, m->params, params, m->n_local);
    upload_floats(m, m->exp_avg, exp_avg, m->n_local);
    upload_floats(m, m->exp_avg_sq, exp_avg_sq, m->n_local);
    floats_to_bf16(m->params_bf16, m->params, m->n_local, m->stream);
    sync_gains(m);
    step_scalars st;
    memset(&st, 0, sizeof st);
    st.adam_step = adam_step;
    CUDA_CHECK(cudaMemcpyAsync(m->st, &st, sizeof st, cudaMemcpyHostToDevice, m->stream));
    settle(m);
}

// Replaces only the weights (DiLoCo's outer step), keeping moments and t. Synchronous.
void cuda_model_upload_params(cuda_model *m, const float *params) {
    settle(m);
    upload_floats(m, m->params, params, m->n_local);
    floats_to_bf16(m->params_bf16, m->params, m->n_local, m->stream);
    sync_gains(m);
    settle(m);
}

// GPU → host after all queued work: any pointer may be NULL. Synchronous.
void cuda_model_download(cuda_model *m, float *params, float *exp_avg, float *exp_avg_sq) {
    size_t bytes = (size_t)m->n_local * sizeof(float);
    settle(m);
    if (params) CUDA_CHECK(cudaMemcpy(params, m->params, bytes, cudaMemcpyDeviceToHost));
    if (exp_avg) CUDA_CHECK(cudaMemcpy(exp_avg, m->exp_avg, bytes, cudaMemcpyDeviceToHost));
    if (exp_avg_sq) CUDA_CHECK(cudaMemcpy(exp_avg_sq, m->exp_avg_sq, bytes, cudaMemcpyDeviceToHost));
}

// The gradients accumulated so far in this step (tests). Synchronous.
void cuda_model_download_grads(cuda_model *m, float *grads) {
    settle(m);
    CUDA_CHECK(cudaMemcpy(grads, m->grads, (size_t)m->n_local * sizeof(float), cudaMemcpyDeviceToHost));
}

void cuda_model_zero_grads(cuda_model *m) {
    if (m->comm_stream) stream_after(m, m->stream, m->comm_stream);
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, (size_t)m->n_local * sizeof(float), m->stream));
}

// Fault injection (TRAIN_GPT_FAULT=nan_grad / grad_spike): the first gradient element
// becomes value.
void cuda_model_poison_grad(cuda_model *m, float value) {
    if (m->comm_stream) stream_after(m, m->stream, m->comm_stream);  // the reduce-scatters add to the gradients
    CUDA_CHECK(cudaMemcpyAsync(m->grads, &value, sizeof(float), cudaMemcpyHostToDevice, m->stream));
    settle(m);  // value lives on the host stack
}

// ---------------------------------------------------------------- inputs

// Validates the tokens, computes document starts/positions (and, for training, the
// embedding backward's buckets) on the host into a free pinned slot, and queues its copy.
static void queue_inputs(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                         bool buckets) {
    mark(m, K_INPUTS);
    CHECK(B >= 1 && T >= 1 && B * T <= m->dims.N && T <= m->dims.T);
    int64_t N = B * T;
    for (int64_t i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= m->dims.V)
            fail("input token %d is outside the vocabulary (vocab_size %lld)", inputs[i], (long long)m->dims.V);
        if (targets && (targets[i] < 0 || targets[i] >= m->dims.V))
            fail("target token %d is outside the vocabulary (vocab_size %lld)", targets[i], (long long)m->dims.V);
    }
    input_slot *sl = &m->slots[m->next_slot];
    m->next_slot = (m->next_slot + 1) % INPUT_SLOTS;
    // Named wait: the slot's previous copy must have been taken by the GPU (with peers, it may
    // sit behind collectives: a deadline, gpu_comm_wait).
    host_wait(m, sl->copied, "an input copy queued behind collectives");
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

// ---------------------------------------------------------------- units (FSDP)
// The forward and backward passes ask for the weights of a unit (llmc/shard.h: the embedding,
// each layer, the final norm with an untied head) before they use it and give it back after,
// in cpu/model.c's order: acquire, prefetch the next, release; grads and grads_done around a
// unit's backward. With one rank these do nothing and the weights and gradients are the
// model's own buffers.

static gather_slot *slot_holding(const cuda_model *m, int u) {
    int k = m->slot_of[u];
    return k >= 0 ? &m->gathers[k] : NULL;
}

static void count_gathered(cuda_model *m, int64_t bytes) {
    m->gathered_bytes += bytes;
    if (m->gathered_bytes > m->gathered_peak) m->gathered_peak = m->gathered_bytes;
}

static void count_grads(cuda_model *m, int64_t delta) {
    m->grad_floats += delta;
    if (m->grad_floats > m->grad_peak) m->grad_peak = m->grad_floats;
}

// Queues unit u's all-gather (bf16) into a free slot, on the comm stream, after everything the
// model's stream has queued so far (the last optimizer step wrote the pieces; the slot's
// previous unit may still be read).
static void start_gather(cuda_model *m, int u) {
    if (m->slot_of[u] >= 0) return;
    const shard_unit *x = &m->map.units[u];
    int k = -1;
    for (int j = 0; j < m->num_gathers; j++)
        if (m->gathers[j].unit < 0 && m->gathers[j].cap >= x->piece * m->map.ranks &&
            (k < 0 || m->gathers[j].cap < m->gathers[k].cap))
            k = j;
    CHECK(k >= 0);  // the passes never hold more units than the slots (create's comment)
    gather_slot *sl = &m->gathers[k];
    sl->unit = u;
    sl->refs = 0;
    sl->keep = false;
    m->slot_of[u] = k;
    count_gathered(m, x->piece * m->map.ranks * 2);
    cudaStream_t cs = m->comm_stream;
    stream_after(m, cs, m->stream);
    gpu_allgather(m->shard.group, m->params_bf16 + x->local, x->piece, GPU_BF16, sl->w16, cs);
    CUDA_CHECK(cudaEventRecord(sl->ready, cs));
}

// The embedding in fp32 for its lookup (unit 0 gathered whole from the fp32 pieces), held until
// embedding_release.
static void embedding_acquire(cuda_model *m) {
    if (!m->sharded) return;
    const shard_unit *x = &m->map.units[0];
    count_gathered(m, x->piece * m->map.ranks * 4);
    cudaStream_t cs = m->comm_stream;
    stream_after(m, cs, m->stream);
    gpu_allgather(m->shard.group, m->params + x->local, x->piece, GPU_F32, m->embed32, cs);
    CUDA_CHECK(cudaEventRecord(m->embed_ready, cs));
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->embed_ready, 0));
    m->embed_held = true;
}

static void embedding_release(cuda_model *m) {
    if (!m->sharded) return;
    m->embed_held = false;
    count_gathered(m, -m->map.units[0].piece * m->map.ranks * 4);
}

// After the weights changed (an AdamW step, an upload): every rank's fp32 copy of the norm
// gains from the ranks that hold them, on the model's stream.
static void sync_gains(cuda_model *m) {
    if (!m->sharded) return;
    cudaStream_t cs = m->comm_stream;
    stream_after(m, cs, m->stream);
    copy_stretches(m->gains_mine, m->params, m->gain_stretches, m->num_gain_stretches, cs);
    gpu_allgather(m->shard.group, m->gains_mine, m->gain_numel, GPU_F32, m->gains_recv, cs);
    sum_ranks_set(m->gains, m->gains_recv, m->map.ranks, m->gain_numel, cs);
    stream_after(m, m->stream, cs);
}

static void unit_acquire(cuda_model *m, int u) {
    if (!m->sharded) return;
    start_gather(m, u);
    gather_slot *sl = slot_holding(m, u);
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, sl->ready, 0));
    sl->refs++;
}

static void unit_prefetch(cuda_model *m, int u) {
    if (!m->sharded || !m->shard.prefetch || u < 0 || u >= m->map.count) return;
    start_gather(m, u);
}

static void unit_release(cuda_model *m, int u, bool backward_follows) {
    if (!m->sharded) return;
    gather_slot *sl = slot_holding(m, u);
    CHECK(sl && sl->refs > 0);
    sl->refs--;
    sl->keep = backward_follows && !m->shard.reshard;
    if (sl->refs == 0 && !sl->keep) {
        sl->unit = -1;
        m->slot_of[u] = -1;
        count_gathered(m, -m->map.units[u].piece * m->map.ranks * 2);
    }
}

// Unit u's whole gradient, zeroed when the unit's backward begins.
static void unit_grads(cuda_model *m, int u) {
    if (!m->sharded || m->grad_of[u] >= 0) return;
    int64_t whole = m->map.units[u].piece * m->map.ranks;
    int k = -1;
    for (int j = 0; j < GRAD_SLOTS; j++)
        if (m->grad_slots[j].unit < 0 && m->grad_slots[j].cap >= whole &&
            (k < 0 || m->grad_slots[j].cap < m->grad_slots[k].cap ||
             (m->grad_slots[j].cap == m->grad_slots[k].cap && m->grad_slots[j].freed < m->grad_slots[k].freed)))
            k = j;
    CHECK(k >= 0);
    grad_slot *g = &m->grad_slots[k];
    g->unit = u;
    m->grad_of[u] = k;
    count_grads(m, whole);
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, g->sent, 0));  // its previous reduce-scatter has read it
    CUDA_CHECK(cudaMemsetAsync(g->g, 0, (size_t)whole * sizeof(float), m->stream));
}

// Unit u's backward is queued: its gradient is reduce-scattered on the comm stream (an
// all-to-all of pieces, then the rank-order sum added to this rank's gradient pieces) while
// the next unit's backward runs.
static void unit_grads_done(cuda_model *m, int u) {
    if (!m->sharded) return;
    int k = m->grad_of[u];
    CHECK(k >= 0);
    grad_slot *g = &m->grad_slots[k];
    const shard_unit *x = &m->map.units[u];
    cudaStream_t cs = m->comm_stream;
    stream_after(m, cs, m->stream);
    gpu_alltoall(m->shard.group, g->g, x->piece, m->recv, cs);
    sum_ranks_add(m->grads + x->local, m->recv, m->map.ranks, x->piece, cs);
    CUDA_CHECK(cudaEventRecord(g->sent, cs));
    g->freed = ++m->grad_clock;
    g->unit = -1;
    m->grad_of[u] = -1;
    count_grads(m, -x->piece * m->map.ranks);
}

// Where a tensor's weights (fp32, bf16) and gradient are now: the model's own buffers with one
// rank, else the gathered unit that holds it.
static int64_t unit_offset(const cuda_model *m, param_kind kind, int layer, int *u) {
    int64_t off = tensor_offset(m, kind, layer);
    *u = shard_unit_of(&m->map, kind, layer);
    return off - m->map.units[*u].start;
}

// fp32 weights are read by the norms (their gains) and the embedding's lookup only.
static const float *w32(const cuda_model *m, param_kind kind, int layer) {
    if (!m->sharded) return m->params + tensor_offset(m, kind, layer);
    const param_info *p = param_find(m->table, kind, layer);
    CHECK(p != NULL);
    if (kind == P_EMBED) {
        CHECK(m->embed_held);
        return m->embed32;
    }
    int64_t at = m->gain_at[p - m->table->params];
    CHECK(at >= 0);
    return m->gains + at;
}

static const bf16 *w16(const cuda_model *m, param_kind kind, int layer) {
    if (!m->sharded) return m->params_bf16 + tensor_offset(m, kind, layer);
    int u = 0;
    int64_t at = unit_offset(m, kind, layer, &u);
    gather_slot *sl = slot_holding(m, u);
    CHECK(sl && sl->refs > 0);
    return sl->w16 + at;
}

static float *g32(const cuda_model *m, param_kind kind, int layer) {
    if (!m->sharded) return m->grads + tensor_offset(m, kind, layer);
    int u = 0;
    int64_t at = unit_offset(m, kind, layer, &u);
    CHECK(m->grad_of[u] >= 0);
    return m->grad_slots[m->grad_of[u]].g + at;
}

#define W16(kind, layer) w16(m, kind, layer)
#define W32(kind, layer) w32(m, kind, layer)
#define G32(kind, layer) g32(m, kind, layer)

// Where layer a's attention reads q, k and v (after QK-norm and RoPE), for B × T tokens.
static attention_inputs attention_inputs_of(const cuda_model *m, const layer_acts *a, int64_t B, int64_t T) {
    const model_dims *d = &m->dims;
    attention_inputs in;
    memset(&in, 0, sizeof in);
    if (m->cfg.qk_norm) {
        in.q = a->qk;
        in.k = a->qk + d->QD;
        in.q_stride = in.k_stride = d->QD + d->KD;
    } else {
        in.q = a->qkv;
        in.k = a->qkv + d->QD;
        in.q_stride = in.k_stride = d->QKV;
    }
    in.v = a->qkv + d->QD + d->KD;
    in.v_stride = d->QKV;
    in.start = m->d_start;
    in.B = B;
    in.T = T;
    in.Hq = (int)d->Hq;
    in.Hkv = (int)d->Hkv;
    in.D = (int)d->D;
    return in;
}

// What QK-norm (when the model has it) and RoPE (on layers that are not NoPE) apply to N
// rows of layer l.
static qknorm_rope_args qknorm_rope_of(cuda_model *m, int l, int64_t N, bool rope) {
    qknorm_rope_args q;
    memset(&q, 0, sizeof q);
    q.norm = m->cfg.qk_norm;
    q.gq = q.norm ? W32(P_Q_NORM, l) : NULL;
    q.gk = q.norm ? W32(P_K_NORM, l) : NULL;
    q.pos = m->d_pos;
    q.cos_t = m->rope_cos;
    q.sin_t = m->rope_sin;
    q.N = N;
    q.Hq = (int)m->dims.Hq;
    q.Hkv = (int)m->dims.Hkv;
    q.D = (int)m->dims.D;
    q.rope = rope;
    q.eps = m->eps;
    return q;
}

// Layer l's forward: resid[l] → resid[l + 1], keeping what m->layers[l] points at.
static void forward_layer(cuda_model *m, int l, int64_t B, int64_t T) {
    const model_config *c = &m->cfg;
    int64_t N = B * T, C = m->dims.C, F = m->dims.F, QD = m->dims.QD, QKV = m->dims.QKV;
    cudaStream_t s = m->stream;
    layer_acts *a = &m->layers[l];
    bool rope = layer_uses_rope(c, l);
    mark(m, K_RMSNORM_FWD);
    rmsnorm_forward(a->attn_in, a->attn_rstd, m->resid[l], W32(P_ATTN_NORM, l), N, C, m->eps, s);
    mark(m, K_MATMUL_FWD);
    matmul_forward(m->mm, a->qkv, CUDA_R_16BF, QKV, NULL, a->attn_in, W16(P_WQ, l), N, C, QKV, s);
    mark(m, K_QKNORM_ROPE_FWD);
    qknorm_rope_args qr = qknorm_rope_of(m, l, N, rope);
    if (c->qk_norm) qknorm_rope_forward(&qr, a->qk, QD + m->dims.KD, a->qk_rstd, a->qkv, QKV, s);
    else if (rope) qknorm_rope_forward(&qr, a->qkv, QKV, NULL, a->qkv, QKV, s);  // rotated in place
    attention_inputs in = attention_inputs_of(m, a, B, T);
    mark(m, K_ATTENTION_FWD);
    if (m->attention == cuda_model::ATT_SIMPLE) attention_simple_forward(&in, a->att, a->lse, s);
    else if (m->attention == cuda_model::ATT_FA2) attention_fa2_forward(&in, a->att, a->lse, s);
    else attention_forward(&in, a->att, a->lse, s);
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

// What a selective layer did not keep, from what it kept: the two RMSNorm outputs and their
// 1/rms, q and k after QK-norm and RoPE (and QK-norm's 1/rms), SwiGLU's product — the
// forward's kernels on the forward's inputs. Without QK-norm, RoPE rotated q and k in the
// kept qkv, so there is nothing to redo for them.
static void recompute_selective(cuda_model *m, int l, int64_t N) {
    int64_t C = m->dims.C, F = m->dims.F, QD = m->dims.QD, QKV = m->dims.QKV;
    cudaStream_t s = m->stream;
    layer_acts *a = &m->layers[l];
    mark(m, K_RMSNORM_FWD);
    rmsnorm_forward(a->attn_in, a->attn_rstd, m->resid[l], W32(P_ATTN_NORM, l), N, C, m->eps, s);
    if (m->cfg.qk_norm) {
        mark(m, K_QKNORM_ROPE_FWD);
        qknorm_rope_args qr = qknorm_rope_of(m, l, N, layer_uses_rope(&m->cfg, l));
        qknorm_rope_forward(&qr, a->qk, QD + m->dims.KD, a->qk_rstd, a->qkv, QKV, s);
    }
    mark(m, K_RMSNORM_FWD);
    rmsnorm_forward(a->mlp_in, a->mlp_rstd, a->resid_mid, W32(P_MLP_NORM, l), N, C, m->eps, s);
    mark(m, K_SWIGLU_FWD);
    swiglu_forward(a->act, a->gate_up, N, F, s);
}

// The blocks and the final norm. The final unit stays acquired for the caller (the classifier
// reads the final norm's unit again for an untied head; release it with final_unit_release).
static void forward_blocks(cuda_model *m, int64_t B, int64_t T, bool backward_follows) {
    int64_t N = B * T, C = m->dims.C;
    int L = (int)m->dims.L;
    cudaStream_t s = m->stream;
    mark(m, K_EMBEDDING);
    embedding_acquire(m);
    unit_prefetch(m, 1);
    embedding_forward(m->resid[0], m->d_inputs, W32(P_EMBED, -1), N, C, s);
    embedding_release(m);  // the embedding's backward needs no weights (a tied head gathers bf16)
    for (int l = 0; l < L; l++) {
        unit_acquire(m, 1 + l);
        unit_prefetch(m, 2 + l);
        forward_layer(m, l, B, T);
        unit_release(m, 1 + l, backward_follows);
    }
    unit_acquire(m, L + 1);
    mark(m, K_RMSNORM_FWD);
    rmsnorm_forward(m->final_out, m->final_rstd, m->resid[m->dims.L], W32(P_FINAL_NORM, -1), N, C, m->eps, s);
}

static void final_unit_release(cuda_model *m) { unit_release(m, (int)m->dims.L + 1, false); }
static int head_unit(const cuda_model *m) { return shard_unit_of(&m->map, P_LM_HEAD, -1); }

// Loss over chunks of rows; with `train`, also the head's backward into d_final and the
// head weight's gradient. Row sums go to `sums` (2 doubles: Σ ce, Σ lse²).
static void classifier(cuda_model *m, int64_t N, bool train, float grad_scale, float z_loss, double *sums) {
    cudaStream_t s = m->stream;
    int H = head_unit(m);
    unit_acquire(m, H);  // the final unit again, or the embedding's
    if (train) unit_grads(m, H);
    const bf16 *head = W16(P_LM_HEAD, -1);
    float *dhead = train ? G32(P_LM_HEAD, -1) : NULL;
    for (int64_t r0 = 0; r0 < N; r0 += m->chunk_rows) {
        int64_t n = min_i64(m->chunk_rows, N - r0);
        mark(m, K_HEAD_MATMUL_FWD);
        matmul_forward(m->mm, m->logits, CUDA_R_16BF, m->ld_logits, NULL, m->final_out + r0 * m->dims.C, head, n,
                       m->dims.C, m->dims.V, s);
        mark(m, K_CROSS_ENTROPY);
        cross_entropy_forward_backward(m->logits, m->row_ce + r0, m->row_lse + r0, m->d_targets + r0, n, m->dims.V,
                                       m->ld_logits, z_loss, grad_scale, train, s);
        if (train) {  // m->logits now holds their gradient
            mark(m, K_HEAD_MATMUL_BWD);
            matmul_backward_input(m->mm, m->d_final + r0 * m->dims.C, CUDA_R_32F, m->logits, m->ld_logits, head, n,
                                  m->dims.C, m->dims.V, false, s);
            matmul_backward_weight(m->mm, dhead, m->logits, m->ld_logits, m->final_out + r0 * m->dims.C, n, m->dims.C,
                                   m->dims.V, s);
        }
    }
    mark(m, K_CROSS_ENTROPY);
    loss_sums_accumulate(sums, m->row_ce, m->row_lse, N, s);
    unit_release(m, H, false);
}

// ---------------------------------------------------------------- backward

static void backward_blocks(cuda_model *m, int64_t B, int64_t T, int64_t num_unique) {
    const model_config *c = &m->cfg;
    int64_t N = B * T, C = m->dims.C, F = m->dims.F, QD = m->dims.QD, KD = m->dims.KD, QKV = m->dims.QKV;
    int Hq = (int)m->dims.Hq, Hkv = (int)m->dims.Hkv;
    cudaStream_t s = m->stream;
    int L = (int)m->dims.L;
    unit_acquire(m, L + 1);
    unit_grads(m, L + 1);
    unit_prefetch(m, L);
    mark(m, K_RMSNORM_BWD);
    rmsnorm_backward(m->d_resid, m->d_resid_bf16, G32(P_FINAL_NORM, -1), m->gain_scratch, m->d_final,
                     m->resid[m->dims.L], W32(P_FINAL_NORM, -1), m->final_rstd, N, C, false, s);
    unit_grads_done(m, L + 1);
    unit_release(m, L + 1, false);
    final_unit_release(m);  // forward_blocks' hold
    for (int l = L - 1; l >= 0; l--) {
        unit_acquire(m, 1 + l);
        if (l > 0) unit_prefetch(m, l);
        unit_grads(m, 1 + l);
        layer_acts *a = &m->layers[l];
        bool rope = layer_uses_rope(c, l);
        // Recomputation: the layer's forward again (full; it writes resid[l + 1] again, which
        // nothing reads any more, with the same bits), or its cheap outputs (selective).
        recompute_mode mode = recompute_of_layer(m->recompute, l);
        if (mode == RECOMPUTE_FULL) forward_layer(m, l, B, T);
        else if (mode == RECOMPUTE_SELECTIVE) recompute_selective(m, l, N);
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
        rmsnorm_backward(m->d_resid, m->d_resid_bf16, G32(P_MLP_NORM, l), m->gain_scratch, m->d_norm, a->resid_mid,
                         W32(P_MLP_NORM, l), a->mlp_rstd, N, C, true, s);
        // Attention: resid_mid = resid_in + o(attention(q, k, v))
        mark(m, K_MATMUL_BWD);
        matmul_backward_input(m->mm, m->d_att, CUDA_R_16BF, m->d_resid_bf16, C, W16(P_WO, l), N, QD, C, false, s);
        matmul_backward_weight(m->mm, G32(P_WO, l), m->d_resid_bf16, C, a->att, N, QD, C, s);
        attention_inputs in = attention_inputs_of(m, a, B, T);
        attention_grads g = {m->d_qkv, m->d_qkv + QD, m->d_qkv + QD + KD, QKV, QKV, QKV};  // dq|dk|dv stacked
        mark(m, K_ATTENTION_BWD);
        if (m->attention == cuda_model::ATT_SIMPLE)
            attention_simple_backward(&in, a->att, a->lse, m->d_att, &g, m->delta, s);
        else if (m->attention == cuda_model::ATT_FA2)
            attention_fa2_backward(&in, a->att, a->lse, m->d_att, &g, m->delta, s);
        else attention_backward(&in, a->att, a->lse, m->d_att, &g, m->delta, s);
        mark(m, K_QKNORM_ROPE_BWD);
        qknorm_rope_args qr = qknorm_rope_of(m, l, N, rope);
        if (c->qk_norm) {
            // Gains first: they read d_qkv before the in-place backward overwrites it.
            qknorm_gain_grad(&qr, 0, Hq, G32(P_Q_NORM, l), m->gain_scratch, m->d_qkv, QKV, a->qkv, QKV, a->qk_rstd, s);
            qknorm_gain_grad(&qr, Hq, Hkv, G32(P_K_NORM, l), m->gain_scratch, m->d_qkv, QKV, a->qkv, QKV, a->qk_rstd,
                             s);
            qknorm_rope_backward(&qr, m->d_qkv, QKV, m->d_qkv, QKV, a->qkv, QKV, a->qk_rstd, s);
        } else if (rope) {
            qknorm_rope_backward(&qr, m->d_qkv, QKV, m->d_qkv, QKV, NULL, 0, NULL, s);
        }
        mark(m, K_MATMUL_BWD);
        matmul_backward_input(m->mm, m->d_norm, CUDA_R_32F, m->d_qkv, QKV, W16(P_WQ, l), N, C, QKV, false, s);
        matmul_backward_weight(m->mm, G32(P_WQ, l), m->d_qkv, QKV, a->attn_in, N, C, QKV, s);
        mark(m, K_RMSNORM_BWD);
        rmsnorm_backward(m->d_resid, m->d_resid_bf16, G32(P_ATTN_NORM, l), m->gain_scratch, m->d_norm, m->resid[l],
                         W32(P_ATTN_NORM, l), a->attn_rstd, N, C, true, s);
        unit_grads_done(m, 1 + l);
        unit_release(m, 1 + l, false);
    }
    mark(m, K_EMBEDDING);
    unit_grads(m, 0);
    embedding_backward(G32(P_EMBED, -1), m->d_resid, m->d_unique, m->d_offsets, m->d_positions, num_unique, C, s);
    unit_grads_done(m, 0);
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
    forward_blocks(m, B, T, true);
    classifier(m, B * T, true, grad_scale, z_loss, &m->st->ce_sum);
    backward_blocks(m, B, T, sl->num_unique);
}

// The loss sums accumulated so far in this step (tests). Synchronous.
loss_sums cuda_step_loss_so_far(cuda_model *m) {
    step_scalars st;
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    CUDA_CHECK(cudaMemcpy(&st, m->st, sizeof st, cudaMemcpyDeviceToHost));
    loss_sums sums = {st.ce_sum, st.lse_sq_sum, 0};
    return sums;
}

// HSDP: the copies' gradient pieces summed in copy order, the same bits on every copy: per
// chunk an all-to-all, the sum, an all-gather (grads has room for the last chunk's padding).
static void allreduce_copies(cuda_model *m) {
    int c = m->shard.copies_size;
    int64_t k = m->xfer / c;
    cudaStream_t cs = m->comm_stream;
    stream_after(m, cs, m->stream);
    for (int64_t off = 0; off < m->n_local; off += c * k) {
        int64_t kk = cdiv(min_i64(c * k, m->n_local - off), c);
        gpu_alltoall(m->shard.copies, m->grads + off, kk, m->recv, cs);
        sum_ranks_set(m->xfer_sum, m->recv, c, kk, cs);
        gpu_allgather(m->shard.copies, m->xfer_sum, kk, GPU_F32, m->grads + off, cs);
    }
    stream_after(m, m->stream, cs);
}

// Every NCCL call of a communicator goes to the comm stream, in the same order on every rank
// (NCCL needs one order per communicator; two streams could run them in different orders on
// different ranks): the step's collectives wait for the model's stream there, and it for them.
//
// Sums over ranks, in rank order, the same on every rank of the job (the FSDP group, then
// the copies, as cpu/backend.c adds them): the gradient norm's partials (the copies hold equal
// gradients by now, so the group's sum is the job's) and the step's loss sums. Returns by how
// much the job's rows exceed this rank's.
static int64_t job_sums(cuda_model *m) {
    cudaStream_t s = m->comm_stream ? m->comm_stream : m->stream;
    stream_after(m, s, m->stream);
    int64_t ranks = 1;
    if (m->sharded) {
        int n = m->shard.ranks;
        gpu_allgather(m->shard.group, m->norm_partials, GRAD_NORM_BLOCKS, GPU_F64, m->partials_all, s);
        sum_ranks_doubles(m->norm_partials, m->partials_all, n, GRAD_NORM_BLOCKS, s);
        gpu_allgather(m->shard.group, &m->st->ce_sum, 2, GPU_F64, m->sums_all, s);  // ce_sum, lse_sq_sum lead
        sum_ranks_doubles(&m->st->ce_sum, m->sums_all, n, 2, s);
        ranks *= n;
    }
    if (m->shard.copies) {
        int n = m->shard.copies_size;
        gpu_allgather(m->shard.copies, &m->st->ce_sum, 2, GPU_F64, m->sums_all, s);
        sum_ranks_doubles(&m->st->ce_sum, m->sums_all, n, 2, s);
        ranks *= n;
    }
    stream_after(m, m->stream, s);
    return ranks;
}

// Ends the step: global norm, guard, clip to cfg->grad_clip, AdamW at learning rate lr
// with cfg's betas, eps and weight decay; zeroes the gradients; queues the step's scalars
// for cuda_step_poll. rows = tokens of the step (B·T·grad_accum). `step` is only echoed
// back in the result. At most 8 steps may wait unpolled.
void cuda_step(cuda_model *m, int64_t step, double lr, int64_t rows, const train_config *cfg,
               const step_limits *limits) {
    int64_t slot = m->results_queued % RESULT_SLOTS;
    if (!m->step_open) {
        CHECK(m->results_queued - m->results_read < RESULT_SLOTS);
        CUDA_CHECK(cudaEventRecord(m->step_began[slot], m->stream));
    }
    cudaStream_t s = m->stream;
    m->step_open = true;  // (a step without micro-batches: the marks below still count)
    mark(m, K_OPTIMIZER);
    if (m->comm_stream) stream_after(m, s, m->comm_stream);  // the reduce-scatters have landed
    if (m->shard.copies) allreduce_copies(m);
    grad_norm_partials(m->norm_partials, m->grads, m->n_local, s);
    rows *= job_sums(m);
    step_prepare(m->st, m->norm_partials, (double)rows, cfg->z_loss, cfg->grad_clip, lr, cfg->beta1, cfg->beta2,
                 limits->max_loss, limits->max_grad_norm, s);
    adamw_hparams hp;
    hp.keep_decay = (float)(1.0 - lr * cfg->weight_decay);
    hp.beta1 = (float)cfg->beta1;
    hp.beta2 = (float)cfg->beta2;
    hp.one_minus_beta1 = (float)(1.0 - cfg->beta1);
    hp.one_minus_beta2 = (float)(1.0 - cfg->beta2);
    hp.eps = (float)cfg->adam_eps;
    adamw_update(m->params, m->params_bf16, m->grads, m->exp_avg, m->exp_avg_sq, m->chunks, m->num_chunks, m->st, hp,
                 s);
    sync_gains(m);
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

// The oldest step not yet returned: true and *r filled, or false if none is queued (or,
// with wait = false, the oldest has not finished on the GPU yet).
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
    r->spike = st->skipped == 2;
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, m->step_began[slot], m->result_done[slot]));
    r->gpu_ms = ms;
    m->results_read++;
    return true;
}

// ---------------------------------------------------------------- forward only

// What a forward pass and the classifier acquire and release, in their order, without
// computing: a rank whose validation turn has no rows still takes part in every gather.
static void forward_units_only(cuda_model *m) {
    int L = (int)m->dims.L, H = head_unit(m);
    embedding_acquire(m);
    unit_prefetch(m, 1);
    embedding_release(m);
    for (int l = 0; l < L; l++) {
        unit_acquire(m, 1 + l);
        unit_prefetch(m, 2 + l);
        unit_release(m, 1 + l, false);
    }
    unit_acquire(m, L + 1);
    unit_acquire(m, H);
    unit_release(m, H, false);
    final_unit_release(m);
}

// B = 0: a turn without rows (a job's validation, trainer's validate): the sums of nothing.
loss_sums cuda_forward_loss(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T) {
    CHECK(!m->step_open);  // the activations are shared with the step being accumulated
    if (B == 0) {
        forward_units_only(m);
        settle(m);
        loss_sums none = {0.0, 0.0, 0};
        return none;
    }
    queue_inputs(m, inputs, targets, B, T, false);
    forward_blocks(m, B, T, false);
    CUDA_CHECK(cudaMemsetAsync(m->eval_sums, 0, 2 * sizeof(double), m->stream));
    classifier(m, B * T, false, 0.0f, 0.0f, m->eval_sums);
    final_unit_release(m);
    CUDA_CHECK(cudaMemcpyAsync(m->eval_result, m->eval_sums, 2 * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    settle(m);  // named: validation needs the number now
    loss_sums sums = {m->eval_result[0], m->eval_result[1], B * T};
    return sums;
}

// Logits of rows [r0, r0 + n) of the last forward into host rows (row stride V), as fp32
// from the bf16 logits the classifier sees.
static void copy_logits(cuda_model *m, int64_t r0, int64_t n, float *host) {
    int64_t V = m->dims.V;
    bf16 *rows = (bf16 *)xmalloc((size_t)(min_i64(m->chunk_rows, n) * V) * sizeof(bf16));
    unit_acquire(m, head_unit(m));
    for (int64_t c0 = 0; c0 < n; c0 += m->chunk_rows) {
        int64_t k = min_i64(m->chunk_rows, n - c0);
        matmul_forward(m->mm, m->logits, CUDA_R_16BF, m->ld_logits, NULL, m->final_out + (r0 + c0) * m->dims.C,
                       W16(P_LM_HEAD, -1), k, m->dims.C, V, m->stream);
        CUDA_CHECK(cudaMemcpy2DAsync(rows, (size_t)V * sizeof(bf16), m->logits, (size_t)m->ld_logits * sizeof(bf16),
                                     (size_t)V * sizeof(bf16), (size_t)k, cudaMemcpyDeviceToHost, m->stream));
        settle(m);  // the logits buffer is reused by the next chunk
        for (int64_t i = 0; i < k * V; i++) host[c0 * V + i] = bf16_to_float(rows[i]);
    }
    unit_release(m, head_unit(m), false);
    final_unit_release(m);
    free(rows);
}

// Forward only: all logits (B·T, V) fp32 into a host array (tests). Synchronous.
void cuda_forward_logits(cuda_model *m, const int32_t *inputs, int64_t B, int64_t T, float *logits) {
    CHECK(!m->step_open);
    queue_inputs(m, inputs, NULL, B, T, false);
    forward_blocks(m, B, T, false);
    copy_logits(m, 0, B * T, logits);
}

// Forward only: the logits (V) of the last position of one sequence (1,T) (sampling). Synchronous.
void cuda_forward_last_logits(cuda_model *m, const int32_t *inputs, int64_t T, float *logits) {
    CHECK(!m->step_open);
    queue_inputs(m, inputs, NULL, 1, T, false);
    forward_blocks(m, 1, T, false);
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
static step_result gpu_step(backend *b, double lr, int64_t rows, const train_config *cfg, const step_limits *limits) {
    gpu_backend *g = (gpu_backend *)b;
    cuda_model *m = g->model;
    cuda_step(m, ++g->steps_done, lr, rows, cfg, limits);
    if (m->shard.group || m->shard.copies) {
        // A rank that died leaves NCCL waiting: give up after comm_timeout_s, with one line.
        double t0 = wall_seconds();
        host_wait(m, m->result_done[(m->results_queued - 1) % RESULT_SLOTS], "the step's collectives");
        b->comm_wait_s += wall_seconds() - t0;  // the whole wait for the step (not only its collectives)
        b->gathered_peak_bytes = m->gathered_peak;
        b->grads_peak_bytes = (m->grad_peak + (m->sharded ? m->map.max_unit : 0)) * 4;  // + the receive buffer
    }
    cuda_step_result r;
    CHECK(cuda_step_poll(m, &r, true));
    step_result out;
    memset(&out, 0, sizeof out);
    out.loss = r.loss;
    out.z_loss = r.z_loss;
    out.grad_norm = r.grad_norm;
    out.skipped = r.skipped;
    out.spike = r.spike;
    out.adam_step = r.adam_step;
    if (g->steps_done == 1) {
        // The plan counts train_gpt's own buffers; the device also holds the CUDA context,
        // cuBLASLt's workspace and the allocator's own memory.
        banner("gpu memory in use after the first step: %.2f GiB (cudaMemGetInfo; plan %.2f GiB)\n",
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
static void gpu_poison_grad(backend *b, float value) { cuda_model_poison_grad(model_of(b), value); }
static int64_t gpu_device_bytes(const backend *b) { return cuda_model_device_bytes(((const gpu_backend *)b)->model); }
static void gpu_destroy(backend *b) {
    cuda_model *m = model_of(b);
    gpu_comm *group = m->shard.group, *copies = m->shard.copies;
    cuda_model_free(m);
    gpu_comm_free(group);
    gpu_comm_free(copies);
    free(b);
}

static const backend_ops gpu_ops = {gpu_upload,      gpu_upload_params, gpu_download,    gpu_forward_backward,
                                    gpu_step,        gpu_forward_loss,  gpu_last_logits, gpu_poison_grad,
                                    gpu_device_bytes, gpu_destroy};

// group: the FSDP group (NULL or one rank: the whole model on this GPU); copies: HSDP's
// (NULL or one: none). Each rank of the job takes the GPU of its local rank on the node.
static backend *gpu_backend_create(const param_table *t, int64_t B, int64_t T, recompute_setting recompute,
                                   const comm *group, const comm *copies, bool reshard, bool prefetch) {
    gpu_backend *g = (gpu_backend *)xcalloc(1, sizeof *g);
    g->base.ops = &gpu_ops;
    g->base.name = "cuda";
    (void)gpu_probe();  // selects this rank's GPU (probe_gpu), if nothing has asked yet
    gpu_shard sh;
    memset(&sh, 0, sizeof sh);
    sh.ranks = group ? comm_size(group) : 1;
    sh.rank = group ? comm_rank(group) : 0;
    sh.copies_size = copies ? comm_size(copies) : 1;
    sh.reshard = reshard;
    sh.prefetch = prefetch;
    // TRAIN_GPT_FSDP_UNITS=1: a one-rank job runs the sharded passes anyway (every unit
    // gathered and reduce-scattered through NCCL in a world of one): the GPU path's streams and
    // events checked on a machine with one GPU (docs/fsdp.md).
    const char *units = getenv("TRAIN_GPT_FSDP_UNITS");
    bool alone = units && strcmp(units, "1") == 0 && sh.ranks == 1;
    if (sh.ranks > 1 || alone) sh.group = gpu_comm_create(sh.ranks > 1 ? group : NULL, "fsdp");
    if (sh.copies_size > 1) sh.copies = gpu_comm_create(copies, "hsdp");
    g->model = cuda_model_create_sharded(t, B, T, recompute, &sh);
    g->base.device_state_bytes = g->model->state_bytes;
    return &g->base;
}

// ---------------------------------------------------------------- the probe

// The probe: asks the CUDA runtime, once, whether this process can train on a GPU. It is
// the first CUDA call of a run, so it is where a machine without a driver is told apart from one with a GPU:
//   cudaErrorInsufficientDriver (35)  no usable NVIDIA driver (the usual case on a login
//                                     node or a CI machine that has the toolkit only)
//   cudaErrorNoDevice (100)           a driver but no visible device (CUDA_VISIBLE_DEVICES)
//   compute capability < 8.0          no bf16 tensor cores: the backend needs sm_80+
//   cudaErrorNoKernelImageForDevice   the binary was built for other GPUs (CUDA_ARCH)
// The runtime is linked statically (cudart_static), so the binary starts on machines with
// no libcuda.so at all; the runtime looks for the driver only here, at run time.
// A kernel that exists only so that cudaFuncGetAttributes can tell whether this binary
// holds code the device can run. Under HIP (cuda/portable.cuh) the same steps ask the HIP
// runtime, and the AMD GPU's warp (wavefront) size must be the WARP_SIZE the kernels were
// built for.
__global__ void probe_kernel(int *x) {
    if (x) *x = 1;
}

static void say(gpu_info *info, const char *fmt, cudaError_t e) {
    snprintf(info->why, sizeof info->why, fmt, (int)e, cudaGetErrorString(e));
}

#if defined(__CUDACC__) && !defined(__HIPCC__) && defined(CUDART_VERSION)
// Whether the NVIDIA kernel driver lists a GPU (/proc/driver/nvidia/gpus/<bus id>).
static bool nvidia_gpu_listed(void) {
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d) return false;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d));) any = e->d_name[0] != '.';
    closedir(d);
    return any;
}
#endif

static void probe_gpu(gpu_info *info) {
    memset(info, 0, sizeof *info);
    info->compiled = true;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver) {
        snprintf(info->why, sizeof info->why,
                 "the " GPU_RUNTIME_NAME " runtime reports error %d (insufficient driver): this machine has no usable "
                 GPU_VENDOR " driver", (int)e);
#if defined(__CUDACC__) && !defined(__HIPCC__) && defined(CUDART_VERSION)
        // Error 35 also when there is a driver, older than this runtime (a CUDA 13 build needs
        // 580 or newer; clusters run 535-570): "no driver" then sent users to look for one that
        // nvidia-smi shows them. Only where the kernel driver lists a GPU: a node without GPUs
        // may have the driver's library, which reports its version all the same.
        int driver = 0;
        if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0 && nvidia_gpu_listed()) {
            snprintf(info->why, sizeof info->why,
                     "the NVIDIA driver here supports CUDA up to %d.%d, and this binary was built with CUDA %d.%d "
                     "(error 35, insufficient driver): build it with the toolkit the driver supports (module load "
                     "cuda/%d.x; make clean && make) or update the driver",
                     driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
                     driver / 1000);
            info->present = true;
        }
#endif
        return;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        const char *visible = getenv(GPU_VISIBLE_DEVICES_ENV);
        if (visible)
            snprintf(info->why, sizeof info->why, "no " GPU_RUNTIME_NAME " device (" GPU_VISIBLE_DEVICES_ENV "='%s')",
                     visible);
        else
            snprintf(info->why, sizeof info->why, "no " GPU_RUNTIME_NAME " device");
        return;
    }
    if (e != cudaSuccess) {
        say(info, "the " GPU_RUNTIME_NAME " runtime reports error %d (%s)", e);
        return;
    }
    // A job of several ranks on a node: each rank takes the GPU of its rank on the node (where
    // the launcher shows each rank one GPU, that is GPU 0), before anything makes a context.
    launch_info l = launch_detect();
    int dev = gpu_for_rank(l.local_rank, l.node_ranks_known ? l.node_ranks : 0, l.size, count, info->why,
                           sizeof info->why);
    if (dev < 0) {
        info->present = true;
        return;
    }
    if (dev != 0) {
        e = cudaSetDevice(dev);
        if (e != cudaSuccess) {
            say(info, "the " GPU_RUNTIME_NAME " runtime cannot select this rank's GPU: error %d (%s)", e);
            return;
        }
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        say(info, "the " GPU_RUNTIME_NAME " runtime cannot read the properties of this rank's GPU: error %d (%s)", e);
        return;
    }
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->index = dev;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->memory_bytes = (int64_t)prop.totalGlobalMem;
    info->sm_count = prop.multiProcessorCount;
    if (prop.major < 8) {
        snprintf(info->why, sizeof info->why,
                 "GPU %d (%s) has compute capability %d.%d; the CUDA backend needs bf16 tensor cores, 8.0 (A100) or "
                 "newer",
                 dev, prop.name, prop.major, prop.minor);
        return;
    }
    if (prop.warpSize != WARP_SIZE) {
        snprintf(info->why, sizeof info->why, "GPU %d (%s) runs %d-wide warps; this binary's kernels were built for %d",
                 dev, prop.name, prop.warpSize, (int)WARP_SIZE);
        return;
    }
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, probe_kernel);
    // Only a missing kernel image asks for a rebuild; another error here is the GPU's (another
    // process holds it in exclusive mode, it is full, an ECC error): it was told to rebuild.
    bool no_image = e == cudaErrorNoKernelImageForDevice;
#if defined(__HIPCC__)
    no_image = no_image || e == hipErrorInvalidDeviceFunction;
#elif defined(__CUDACC__)
    no_image = no_image || e == cudaErrorInvalidDeviceFunction;
#endif
    if (e != cudaSuccess && !no_image) {
        const char *hint = cuda_error_hint(e);
        snprintf(info->why, sizeof info->why, "GPU %d (%s) cannot run this binary's kernels: error %d (%s)%s%s", dev,
                 prop.name, (int)e, cudaGetErrorString(e), hint ? ": " : "", hint ? hint : "");
        cudaGetLastError();
        return;
    }
    if (e != cudaSuccess) {
        info->present = true;
#if defined(__HIPCC__)
        snprintf(info->why, sizeof info->why,
                 "this binary has no kernels for GPU %d (%s, %s): error %d (%s); rebuild with "
                 "make HIP_ARCH=\"--offload-arch=%s\"",
                 dev, prop.name, prop.gcnArchName, (int)e, cudaGetErrorString(e), prop.gcnArchName);
#else
        snprintf(info->why, sizeof info->why,
                 "this binary has no kernels for GPU %d (%s, sm_%d%d): error %d (%s); rebuild with "
                 "make CUDA_ARCH=\"-gencode arch=compute_%d%d,code=sm_%d%d\"",
                 dev, prop.name, prop.major, prop.minor, (int)e, cudaGetErrorString(e), prop.major, prop.minor, prop.major,
                 prop.minor);
#endif
        cudaGetLastError();  // clear it: the caller may go on with the CPU
        return;
    }
    info->usable = true;
}

static int64_t gpu_plan_bytes(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    return cuda_model_plan_bytes(t, B, T, recompute);
}
static bool gpu_plan_activations(const param_table *t, int64_t B, int64_t T, recompute_setting r, activation_plan *a) {
    *a = cuda_model_plan_activations(t, B, T, r);
    return true;
}

#else  // no nvcc: a CPU-only build

static void probe_gpu(gpu_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->why, sizeof info->why, "this build has no CUDA backend (built without nvcc or with NO_CUDA=1)");
}
static backend *gpu_backend_create(const param_table *t, int64_t B, int64_t T, recompute_setting recompute,
                                   const comm *group, const comm *copies, bool reshard, bool prefetch) {
    (void)t, (void)B, (void)T, (void)recompute, (void)group, (void)copies, (void)reshard, (void)prefetch;
    fail("internal error: the CUDA backend was called in a build without it (device_choose should have said cpu)");
}
static int64_t gpu_plan_bytes(const param_table *t, int64_t B, int64_t T, recompute_setting recompute) {
    (void)t, (void)B, (void)T, (void)recompute;
    return -1;
}
static bool gpu_plan_activations(const param_table *t, int64_t B, int64_t T, recompute_setting r, activation_plan *a) {
    (void)t, (void)B, (void)T, (void)r, (void)a;
    return false;
}

#endif  // __CUDACC__ || __HIPCC__ || TRAIN_GPT_EMULATION

// The GPU as this process sees it, asked once (the CUDA runtime is slow to start).
static const gpu_info *gpu_probe(void) {
    static gpu_info info;
    static bool probed = false;
    if (!probed) {
        probe_gpu(&info);
        probed = true;
    }
    return &info;
}

// ================================================================ the training loop
// One step = grad_accum micro-batches of forward + backward (gradients summed, scaled so
// the step minimizes the mean loss over all its tokens), the global gradient norm, the
// outlier guard (a NaN/Inf loss or norm skips the update; max_bad_steps in a row stop
// the run), clipping, the WSD learning rate, AdamW. Around the steps: validation,
// samples, checkpoints (on schedule, at the end, and on SIGTERM / SIGUSR1 / SIGINT,
// after which the run exits cleanly so SLURM can requeue it), metrics.jsonl and one
// progress line per log_every steps.

// The one piece of process-wide state the loop needs: which stop signal arrived.
// Exit statuses (docs/slurm.md): 0 finished, or stopped on purpose (stop_at_step, SIGTERM,
// SIGINT); 1 an error; EXIT_REQUEUE stopped early with a checkpoint, for the job script to
// requeue (SIGUSR1, the walltime guard); WATCHDOG_EXIT_STATUS (75) no progress.
enum { EXIT_REQUEUE = 76 };

static volatile sig_atomic_t stop_signal = 0;

// SIGUSR1 (a requeue request: SLURM's --signal before the walltime) is kept whatever comes
// after it: SLURM's SIGTERM at the end, a user's scancel, would otherwise turn the stop into
// status 0 and end the job chain. (Until 2026-12 the last signal won.)
static void on_stop_signal(int sig) {
    if (stop_signal != SIGUSR1) stop_signal = sig;
    // A second Ctrl-C should not wait for the checkpoint.
    if (sig == SIGINT) signal(SIGINT, SIG_DFL);
}

// A rank's reason to stop as one number, for the job's agreement (comm_max: the highest wins):
// 0 none, 1 stop_at_step (or another stop of its own), 2 the walltime, 100 + the signal, and
// SIGUSR1 above every signal (200): one rank's requeue request must not become another's
// SIGTERM (15 > 10: the job exited 0 and its chain ended).
static double stop_reason_code(int sig, bool walltime, bool stop_here) {
    if (sig == SIGUSR1) return 200.0;
    return sig ? 100.0 + sig : walltime ? 2.0 : stop_here ? 1.0 : 0.0;
}
static sig_atomic_t signal_of_stop_reason(double code) {
    return code >= 200.0 ? SIGUSR1 : (sig_atomic_t)(code - 100.0);
}

// A stop shared by a DiLoCo replica's ranks at once, where some wait outside any collective:
// ranks in a join the hub holds (a quorum, a donor's state; transport_tcp polls it), the other
// HSDP copies waiting for the first's answer (a collective's naps poll it). A signal that
// reached one rank only (a kill on one node) left the others waiting, with no deadline, until
// a replica came. A rank that has a signal tells the others; one told takes the signal as its
// own (SIGUSR1 outranking: the job's status is 76 on every rank).
static comm_flag *job_stop;
static void poll_job_stop(void) {
    if (stop_signal) comm_flag_raise(job_stop, stop_signal);
    int told = comm_flag_test(job_stop);
    if (told && (stop_signal == 0 || told == SIGUSR1)) stop_signal = told;
}

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

typedef struct {
    train_config *cfg;
    param_table table;
    // A job of several ranks trains one model sharded over them (FSDP, HSDP: docs/fsdp.md);
    // job is NULL for one process. shard says which pieces of the model this rank holds (the
    // whole model for one process), and the host buffers hold those pieces.
    comm *job, *group, *copies;
    shard_map shard;
    float *params, *exp_avg, *exp_avg_sq;  // the host's copy: checkpoints and DiLoCo
    device_kind device;
    char device_error[640];                // a rank of a job that cannot use its device: why (setup_job)
    backend *be;                           // does the math, on the CPU or the GPU
    dataloader *train, *val;
    int32_t *inputs, *targets;
    train_state state;
    metrics_log *log;
    sampler *samples;    // NULL without sample_every
    double flops_per_token;
    int threads;
    int rank, world;     // this process among all that read data (replicas × ranks), and how many
    data_split split;    // which rows it reads (dataloader.h)
    diloco *outer;       // NULL without DiLoCo, and on HSDP's other copies (copies_follow)
    bool copies_follow;  // DiLoCo with HSDP copies: the first copy's ranks run it, the others follow
    int64_t follow_bytes;  // weights this rank sent (first copy) or took (the others) after DiLoCo changed them
    bool over;             // DiLoCo: the hub said the others finished the run (diloco_group_over), on every copy
    bool join_stopped;     // DiLoCo: a stop signal ended a join (diloco_join_stopped), on every copy
    double peak_tflops;  // for MFU; 0 = unknown (mfu logged as null)
    bool quiet;          // no validation line on stdout (diloco-tune's runs)
    double ckpt_s;       // how long the last checkpoint took (0: none yet); the walltime guard's
    double slowest_step_s;  // and the slowest step so far, outer work included, and the slowest
    double slowest_extra_s; // validation and sample (which come after the guard's check passed)
} trainer;

// More threads than the CPUs this process may run on (its affinity mask) share cores, and every
// host loop slows by about their ratio: under Slurm 22.05-23.02 a plain srun in a job gives
// its task one CPU whatever --cpus-per-task says, while OMP_NUM_THREADS says 8 or 72.
static void warn_threads_over_cpus(int threads) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    int cpus = CPU_COUNT(&set);
    if (cpus > 0 && threads > cpus)
        warn("%d threads, but this process may run on %d CPU(s) (its affinity mask): they share them, and the "
             "host's work slows by about %d/%d; in a SLURM job pass srun --cpus-per-task=$SLURM_CPUS_PER_TASK "
             "(docs/slurm.md), or set threads",
             threads, cpus, threads, cpus);
}

static int setup_threads(const train_config *cfg) {
    int threads = 1;
#ifdef _OPENMP
    if (cfg->threads > 0) omp_set_num_threads((int)cfg->threads);
    threads = omp_get_max_threads();
#else
    if (cfg->threads > 1)   // it was dropped without a word
        warn("threads = %lld: this train_gpt was built without OpenMP and runs on 1 thread; rebuild with a compiler "
             "that has it (gcc: libgomp; clang: libomp-dev)",
             (long long)cfg->threads);
#endif
    gemm_set_threads(threads);
    warn_threads_over_cpus(threads);
    return threads;
}

static bool ranks_are_one_job(const train_config *cfg);

// device = auto | cpu | cuda, decided once (llmc/device.h), and the peak that MFU is against.
static device_kind select_device(trainer *tr) {
    const train_config *cfg = tr->cfg;
    char why[600];
    device_kind kind = device_choose(cfg->device, gpu_probe(), why, sizeof why);
    if (kind == DEVICE_ERROR) {
        // In a job of several ranks the error waits for setup_job, where the ranks agree on it and
        // all exit 1: a rank failing here alone left the others blocked in MPI's start, which has
        // no deadline (a node with no usable GPU among several that have one).
        if (launch_detect().size > 1 && ranks_are_one_job(cfg)) {
            snprintf(tr->device_error, sizeof tr->device_error, "%s", why);
            return DEVICE_CPU;
        }
        fail("device: %s", why);
    }
    if (kind == DEVICE_CUDA || strcmp(cfg->device, "auto") == 0) note("%s", why);
    tr->peak_tflops = device_mfu_peak(kind, cfg->peak_tflops, gpu_probe(), why, sizeof why);
    if (why[0]) warn("%s", why);
    return kind;
}

// A shard header's doc_token as text: the number, or "none".
static const char *doc_token_text(uint32_t doc_token, char *buf, size_t bytes) {
    if (doc_token == SHARD_NO_DOC_TOKEN) snprintf(buf, bytes, "none");
    else snprintf(buf, bytes, "%u", doc_token);
    return buf;
}

// doc_token = -1 means "whatever the train shards were written with".
static void resolve_doc_token(train_config *cfg, const dataloader *train) {
    model_config *m = &cfg->model;
    uint32_t shard_vocab = dataloader_vocab_size(train);
    if ((int64_t)shard_vocab > m->vocab_size)
        fail("vocab_size: the train shards hold token ids up to %u, above vocab_size %lld", shard_vocab - 1,
             (long long)m->vocab_size);
    uint32_t from_shards = dataloader_doc_token(train, m->doc_masking);
    if (m->doc_token >= 0) {
        // Set on purpose, perhaps; but a value other than the one the shards were written with
        // cuts documents where the data has none (and misses the ones it has).
        if (m->doc_masking && from_shards != SHARD_NO_DOC_TOKEN && (int64_t)from_shards != m->doc_token)
            warn("doc_token: %lld differs from the train shards' doc_token %u (their header): documents start at "
                 "%lld here", (long long)m->doc_token, from_shards, (long long)m->doc_token);
        return;
    }
    if (from_shards == SHARD_NO_DOC_TOKEN) {
        if (m->doc_masking)
            fail("doc_token: not set, and the train shards were written without one; set doc_token or "
                 "doc_masking = 0");
        m->doc_token = -1;
        return;
    }
    if ((int64_t)from_shards >= m->vocab_size)
        fail("doc_token: the shards' doc_token %u is not below vocab_size %lld", from_shards, (long long)m->vocab_size);
    m->doc_token = from_shards;
}

// ---------------------------------------------------------------- the memory plan (llmc/plan.h)

// One micro-batch's activations under `r` on the CPU backend (cpu/model.c's plan) or a GPU (the
// CUDA model's sizing, and what it would hold if it recomputed); false: this build has no CUDA
// model to size them.
static bool backend_activations(const param_table *t, const train_config *cfg, bool gpu, recompute_setting r,
                                activation_plan *a) {
    int64_t B = cfg->batch_size, T = cfg->model.seq_len;
    if (gpu) return gpu_plan_activations(t, B, T, r, a);
    a->workspace = cpu_model_plan_workspace_bytes(t, B, T);
    a->activations = cpu_model_plan_bytes(t, B, T, r) - a->workspace;
    return true;
}

// One rank's plan for an FSDP group of `ranks` with this config's split and DiLoCo settings, on
// the CPU backend (fp32) or a GPU (bf16 gathered weights), under recompute r; false as above.
// A rank's plan at `ranks` with the backend's activations `a` (which do not depend on ranks).
static rank_memory rank_plan_with(const param_table *t, const train_config *cfg, int ranks, bool gpu,
                                  activation_plan a) {
    plan_split s = {ranks, cfg->fsdp_reshard_after_forward, cfg->fsdp_prefetch, gpu,
                    cfg->dp_replicate > 1 ? (int)cfg->dp_replicate : 1};
    // diloco_transport = local: the process's outer state, 1/M of it in each replica's plan (the
    // budget is divided by M too: resolve_recompute).
    int64_t outer = plan_diloco_memory(cfg, t, ranks).total, share = plan_replicas_in_process(cfg);
    return plan_rank_memory(t, s, a, (outer + share - 1) / share);
}

static bool rank_plan(const param_table *t, const train_config *cfg, int ranks, bool gpu, recompute_setting r,
                      rank_memory *m) {
    activation_plan a;
    if (!backend_activations(t, cfg, gpu, r, &a)) return false;
    *m = rank_plan_with(t, cfg, ranks, gpu, a);
    return true;
}

// The CPU backend's plan of the run as configured (recompute = auto resolved already).
static rank_memory cpu_rank_plan(const param_table *t, const train_config *cfg, int ranks) {
    rank_memory m;
    rank_plan(t, cfg, ranks, false, config_recompute(cfg), &m);
    return m;
}

static double gib(int64_t bytes) { return (double)bytes / 1073741824.0; }

// "12.34 GiB", or "3.21 MiB" below one GiB (the test models).
static const char *bytes_text(int64_t bytes, char *buf, size_t buf_bytes) {
    if (bytes < ((int64_t)1 << 30)) snprintf(buf, buf_bytes, "%.2f MiB", (double)bytes / 1048576.0);
    else snprintf(buf, buf_bytes, "%.2f GiB", gib(bytes));
    return buf;
}

// recompute = auto's candidates (llmc/plan.h), the least recomputation first: the same on
// both backends.
enum { MAX_RECOMPUTE_CANDIDATES = 1100 };  // none, selective, at most n_layer (≤ 1024) others

// The first candidate whose plan fits `budget`: its index and plan, or -1.
static int first_fitting(const param_table *t, const train_config *cfg, int ranks, bool gpu, int64_t budget,
                         recompute_setting *c, rank_memory *plan) {
    int n = plan_recompute_candidates(t->cfg.n_layer, c, MAX_RECOMPUTE_CANDIDATES);
    for (int i = 0; i < n; i++)
        if (rank_plan(t, cfg, ranks, gpu, c[i], plan) && plan->total <= budget) return i;
    return -1;
}

// recompute = auto, resolved once before the model is built: the least recomputation whose plan
// fits this rank's budget (memory_budget_mb, or the device's: llmc/plan.h), said in one line
// with the plan and the budget, or a one-line error when not even full fits. replicas: the
// replicas this process holds (M with diloco_transport = local, which share its memory).
static void resolve_recompute(trainer *tr, int replicas) {
    train_config *cfg = tr->cfg;
    bool gpu = tr->device == DEVICE_CUDA;
    int ranks = tr->group ? comm_size(tr->group) : 1;
    char where[256], a[32], b[32], c2[32];
    int64_t budget;
    if (cfg->memory_budget_mb > 0) {
        budget = cfg->memory_budget_mb * 1048576;
        snprintf(where, sizeof where, "memory_budget_mb");
    } else if (gpu) {
        budget = gpu_memory_budget_bytes(gpu_probe()->memory_bytes);
        snprintf(where, sizeof where, "the GPU's %.1f GiB − %.0f GiB headroom", gib(gpu_probe()->memory_bytes),
                 gib(GPU_MEMORY_HEADROOM_BYTES));
    } else {
        budget = plan_cpu_budget_bytes(launch_detect().node_ranks, where, sizeof where);
    }
    if (replicas > 1) {
        budget /= replicas;
        size_t at = strlen(where);
        snprintf(where + at, sizeof where - at, ", / %d replicas in this process", replicas);
    }
    param_table t;
    param_table_build(&t, &cfg->model);
    if (!config_recompute_auto(cfg)) {
        // A mode set by hand is held to the same budget: past it, the CPU backend's allocation
        // (zeroed, so every page is touched) ran the node out of memory and the kernel killed
        // the process without a word; a GPU's would fail later, after the data's checks.
        rank_memory mine;
        if (rank_plan(&t, cfg, ranks, gpu, config_recompute(cfg), &mine) && mine.total > budget) {
            char label[64];
            plan_recompute_label(config_recompute(cfg), label, sizeof label);
            fail("recompute = %s: its plan needs %s per rank, more than %s = %s; use recompute = auto, a smaller "
                 "batch_size or more ranks (fsdp_size), or set memory_budget_mb (a budget given there is taken as it "
                 "is)",
                 label, bytes_text(mine.total, b, sizeof b), where, bytes_text(budget, a, sizeof a));
        }
        param_table_free(&t);
        return;
    }
    recompute_setting c[MAX_RECOMPUTE_CANDIDATES];
    rank_memory plan, none, full;
    int pick = first_fitting(&t, cfg, ranks, gpu, budget, c, &plan);
    rank_plan(&t, cfg, ranks, gpu, RECOMPUTE_OFF, &none);
    if (pick < 0) {
        rank_plan(&t, cfg, ranks, gpu, (recompute_setting){RECOMPUTE_FULL, 1}, &full);
        fail("recompute = auto: no mode fits %s = %s per rank: none needs %s, full (the least) %s; use a smaller "
             "batch_size, more ranks (fsdp_size), or set memory_budget_mb",
             where, bytes_text(budget, a, sizeof a), bytes_text(none.total, b, sizeof b),
             bytes_text(full.total, c2, sizeof c2));
    }
    char label[64], why[160] = "";
    plan_recompute_label(c[pick], label, sizeof label);
    if (pick > 0) snprintf(why, sizeof why, "; none would need %s", bytes_text(none.total, c2, sizeof c2));
    if (!tr->quiet)
        note("recompute = auto: %s, the least recomputation whose plan fits %s = %s: %s per rank%s", label, where,
         bytes_text(budget, a, sizeof a), bytes_text(plan.total, b, sizeof b), why);
    config_set_recompute(cfg, c[pick]);
    param_table_free(&t);
}

// Model shape, size, FLOPs and the memory plan: the start-up banner and `train_gpt plan`;
// processes: the job's (every rank of every HSDP copy), which the batch line counts.
static void print_model_summary(const param_table *t, const train_config *cfg, int64_t processes) {
    const model_config *m = &cfg->model;
    int64_t tokens_per_step = cfg->batch_size * m->seq_len * cfg->grad_accum * processes;
    double state_gib = (double)t->numel * 16 / 1073741824.0;
    recompute_setting recompute = config_recompute(cfg);
    double act_gib = (double)cpu_model_plan_bytes(t, cfg->batch_size, m->seq_len, recompute) / 1073741824.0;
    banner("model: %lld layers, d_model %lld, %lld/%lld heads of %lld, d_ff %lld, vocab %lld, seq %lld\n",
           (long long)m->n_layer, (long long)m->d_model, (long long)m->n_head, (long long)m->n_kv_head,
           (long long)m->head_dim, (long long)m->d_ff, (long long)m->vocab_size, (long long)m->seq_len);
    char all[32], matmul[32];
    banner("parameters: %s (%s in matmuls, LM head counted once); %.3f GFLOP/token "
           "(6N + 12·L·Hq·D·T)\n",
           format_count((double)t->numel, all, sizeof all), format_count((double)model_matmul_params(t), matmul,
           sizeof matmul), model_flops_per_token(t) / 1e9);
    char label[64];
    plan_recompute_label(recompute, label, sizeof label);
    banner("cpu memory: %.2f GiB weights+grads+AdamW (16 B/param) + %.2f GiB activations (recompute %s%s) "
           "= %.2f GiB\n",
           state_gib, act_gib, label, config_recompute_auto(cfg) ? "'s; auto: each mode below" : "",
           state_gib + act_gib);
    int64_t gpu_bytes = gpu_plan_bytes(t, cfg->batch_size, m->seq_len, config_recompute(cfg));  // -1: no CUDA backend
    if (gpu_bytes >= 0)
        banner("gpu memory: %.2f GiB (fp32 weights, grads and AdamW + bf16 weights + activations, one "
               "device)\n",
               (double)gpu_bytes / 1073741824.0);
    char run_tokens[32];
    banner("batch: %lld x %lld tokens x %lld accum x %lld process(es) = %lld tokens/step; %lld steps = "
           "%s tokens\n",
           (long long)cfg->batch_size, (long long)m->seq_len, (long long)cfg->grad_accum, (long long)processes,
           (long long)tokens_per_step, (long long)cfg->max_steps,
           format_count((double)tokens_per_step * (double)cfg->max_steps, run_tokens, sizeof run_tokens));
}

// The outer optimizer as the start line gives it: lr, μ (Nesterov or heavy-ball, its warm-up),
// plain averaging in the decay phase, and why when the auto values chose them.
static void describe_outer(const train_config *cfg, char *out, size_t n) {
    char why[112] = "";
    if (cfg->diloco_outer_auto)
        snprintf(why, sizeof why, " (auto: a run of %lld outer steps, %lld replicas; momentum from %d with %d+)",
                 (long long)(cfg->max_steps / cfg->diloco_inner_steps), (long long)cfg->diloco_replicas,
                 DILOCO_MOMENTUM_ROUNDS, DILOCO_MOMENTUM_REPLICAS);
    snprintf(out, n, "outer lr %g, momentum %g%s%s%s%s", cfg->diloco_outer_lr, cfg->diloco_outer_momentum,
             cfg->diloco_outer_momentum == 0 ? "" : cfg->diloco_nesterov ? " (Nesterov)" : " (heavy-ball)",
             cfg->diloco_momentum_warmup > 0 ? ", momentum warm-up" : "",
             cfg->diloco_plain_in_decay ? ", plain averaging in the decay phase" : "", why);
}

// "H inner steps per outer step", and H_d's where the decay phase has its own.
static void describe_inner(const train_config *cfg, char *out, size_t n) {
    char decay[96] = "";
    if (cfg->diloco_decay_inner_steps > 0)
        snprintf(decay, sizeof decay, " (%lld in the decay phase%s)", (long long)cfg->diloco_decay_inner_steps,
                 cfg->diloco_decay_auto ? ": auto, with plain averaging there" : "");
    snprintf(out, n, "%lld inner steps per outer step%s", (long long)cfg->diloco_inner_steps, decay);
}

static void print_banner(const trainer *tr) {
    print_model_summary(&tr->table, tr->cfg, tr->world);
    banner("data: %llu train tokens (%lld micro-batches per epoch per process)%s\n",
           (unsigned long long)dataloader_total_tokens(tr->train), (long long)dataloader_batches_per_epoch(tr->train),
           tr->val ? "" : ", no validation set");
    banner("cpu: %d threads, %s\n", tr->threads, gemm_backend_name());
    if (backend_device_bytes(tr->be) > 0) {
        const gpu_info *g = gpu_probe();
        banner("gpu: %s (sm_%d%d, %.1f GiB), model %.2f GiB on the GPU, MFU against %.1f TFLOP/s%s\n",
               g->name, g->cc_major, g->cc_minor, (double)g->memory_bytes / 1073741824.0,
               (double)backend_device_bytes(tr->be) / 1073741824.0, tr->peak_tflops,
               tr->peak_tflops > 0 ? "" : " (unknown: mfu is logged as null)");
    }
    const train_config *cfg = tr->cfg;
    char line[512];
    if (tr->job) {
        // The plan of the backend that runs: on a GPU its total is what this rank's GPU holds,
        // which the backend's own count of its allocations follows (the start's measured figure).
        bool gpu = tr->device == DEVICE_CUDA;
        rank_memory plan;
        if (!rank_plan(&tr->table, cfg, tr->group ? comm_size(tr->group) : 1, gpu, config_recompute(cfg), &plan))
            plan = cpu_rank_plan(&tr->table, cfg, tr->group ? comm_size(tr->group) : 1);
        plan_describe(&plan, line, sizeof line);
        char measured[96] = "";
        if (gpu)
            snprintf(measured, sizeof measured, "; allocated on this GPU: %.2f MiB",
                     (double)backend_device_bytes(tr->be) / 1048576.0);
        banner("fsdp: rank %d of %d, FSDP over %lld, %lld cop%s; planned per rank: %s%s\n",
               comm_rank(tr->job), comm_size(tr->job), (long long)cfg->fsdp_size, (long long)cfg->dp_replicate,
               cfg->dp_replicate == 1 ? "y" : "ies", line, measured);
    } else if (tr->device == DEVICE_CPU) {
        rank_memory plan = cpu_rank_plan(&tr->table, cfg, 1);
        plan_describe(&plan, line, sizeof line);
        banner("planned memory: %s\n", line);
    }
    if (tr->outer) {
        char topk[48] = "";
        if (cfg->diloco_topk < 1) snprintf(topk, sizeof topk, ", the top %g of every block", cfg->diloco_topk);
        char outer[256], inner[112];
        describe_outer(cfg, outer, sizeof outer);
        describe_inner(cfg, inner, sizeof inner);
        banner("diloco: replica %d of %d, %s, %s, %s transport, %s outer gradients%s%s\n",
               (int)cfg->diloco_replica_id, (int)cfg->diloco_replicas, inner, outer,
               cfg->diloco_transport, cfg->diloco_quant, topk, cfg->diloco_error_feedback ? " with error feedback" : "");
        diloco_memory d = plan_diloco_memory(cfg, &tr->table, tr->group ? comm_size(tr->group) : 1);
        if (d.total > 0) {
            plan_describe_diloco(&d, line, sizeof line);
            banner("diloco: outer state planned per rank (host memory): %s\n", line);
        }
    }
    fflush(stdout);
}

// The smallest FSDP group (up to max_ranks) whose GPU ranks each fit `bytes` with the headroom
// under recompute r; 0: none.
static int smallest_fitting_world(const param_table *t, const train_config *cfg, recompute_setting r, int64_t bytes,
                                  int max_ranks) {
    // Every n in turn: a rank's total is not monotone in n (its pieces shrink, but the GPU's
    // gathered norm gains and collective buffers grow with the ranks). The backend's activations,
    // the same at every n, are sized once: sized per n (a model built twice, O(layers²)), a deep
    // model that fits no group took minutes (1024 plans per GPU row: L = 256 took 22 s).
    activation_plan a;
    if (!backend_activations(t, cfg, true, r, &a)) return 0;
    int64_t budget = gpu_memory_budget_bytes(bytes);
    for (int n = 1; n <= max_ranks; n++)
        if (rank_plan_with(t, cfg, n, true, a).total <= budget) return n;
    return 0;
}

// The GPUs of llmc/device.h's table that hold `total` (+ the headroom): "A100 80GB, H200 141GB"
// or "none of the table".
static void fitting_gpus(int64_t total, char *out, size_t out_bytes) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < gpu_memory_rows() && at < out_bytes; i++) {
        if (total > gpu_memory_budget_bytes(gpu_memory_bytes(i))) continue;
        int n = snprintf(out + at, out_bytes - at, "%s%s", at ? ", " : "", gpu_memory_name(i));
        if (n < 0) break;
        at += (size_t)n;
    }
    if (!out[0]) snprintf(out, out_bytes, "none of the table");
}

// Each recompute mode at `world` ranks: a rank's activations and total on the CPU backend and on a
// GPU, and where it fits (llmc/plan.h; docs/fsdp.md "Memory per rank"). The modes: none,
// selective, full on every 2nd layer, full, and what auto picks on the CPU if it is another.
static void print_mode_table(const param_table *t, const train_config *cfg, int world, int gpu_row, bool have_gpu,
                             recompute_setting cpu_auto) {
    recompute_setting modes[5] = {RECOMPUTE_OFF, {RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_FULL, 2}, {RECOMPUTE_FULL, 1}};
    int count = 4;
    if (cpu_auto.mode == RECOMPUTE_FULL && cpu_auto.every > 2) modes[count++] = cpu_auto;
    enum { MAX_RANKS = 1024 };
    rank_memory none;  // the largest: it sets the unit
    rank_plan(t, cfg, world, false, RECOMPUTE_OFF, &none);
    bool small = none.total < ((int64_t)1 << 30);
    double u = small ? 1048576.0 : 1073741824.0;
    const char *title = small ? "recompute (MiB)" : "recompute (GiB)";
    if (gpu_row >= 0)
        banner("  %-22s %12s %10s %12s %10s   %s at %d (+ %.0f GiB headroom); the smallest group\n", title,
               "cpu: activ.", "cpu: total", "gpu: activ.", "gpu: total", gpu_memory_name(gpu_row), world,
               gib(GPU_MEMORY_HEADROOM_BYTES));
    else
        banner("  %-22s %12s %10s %12s %10s   GPUs that hold a rank (+ %.0f GiB headroom)\n", title,
               "cpu: activ.", "cpu: total", "gpu: activ.", "gpu: total", gib(GPU_MEMORY_HEADROOM_BYTES));
    for (int i = 0; i < count; i++) {
        char label[64], fits[512];
        plan_recompute_label(modes[i], label, sizeof label);
        rank_memory cpu, gpu;
        rank_plan(t, cfg, world, false, modes[i], &cpu);
        if (!have_gpu || !rank_plan(t, cfg, world, true, modes[i], &gpu)) {
            banner("  %-22s %12.2f %10.2f %12s %10s\n", label, (double)cpu.activations / u,
                   (double)cpu.total / u, "-", "-");
            continue;
        }
        if (gpu_row >= 0) {
            int n = smallest_fitting_world(t, cfg, modes[i], gpu_memory_bytes(gpu_row), MAX_RANKS);
            char group[48];
            if (n > 0) snprintf(group, sizeof group, "%d", n);
            else snprintf(group, sizeof group, "none up to %d", (int)MAX_RANKS);
            snprintf(fits, sizeof fits, "%s; %s",
                     gpu.total <= gpu_memory_budget_bytes(gpu_memory_bytes(gpu_row)) ? "fits" : "does not fit",
                     group);
        } else {
            fitting_gpus(gpu.total, fits, sizeof fits);
        }
        banner("  %-22s %12.2f %10.2f %12.2f %10.2f   %s\n", label, (double)cpu.activations / u,
               (double)cpu.total / u, (double)gpu.activations / u, (double)gpu.total / u, fits);
    }
}

// Per-rank memory at `world` ranks (`train_gpt plan --world N [--gpu NAME]`): what each rank
// holds on the CPU backend and on a GPU in every term, each recompute mode's activations and
// where it fits, what recompute = auto picks, which GPUs hold the run as configured and the
// smallest group each GPU needs. gpu_row: a row of llmc/device.h's table to single out, or -1.
static void print_rank_plans(const param_table *t, const train_config *cfg, int world, int gpu_row) {
    char line[512], a[32], b[32];
    banner("per rank, FSDP over %d (fsdp_reshard_after_forward %d, fsdp_prefetch %d; one micro-batch "
           "of %lld x %lld):\n",
           world, (int)cfg->fsdp_reshard_after_forward, (int)cfg->fsdp_prefetch, (long long)cfg->batch_size,
           (long long)cfg->model.seq_len);
    diloco_memory d = plan_diloco_memory(cfg, t, world);
    int replicas = plan_replicas_in_process(cfg);  // diloco_transport = local: M share the process
    if (d.total > 0) {
        plan_describe_diloco(&d, line, sizeof line);
        if (replicas > 1)
            banner("  diloco outer state (host memory, this process's, shared by its %d replicas; 1/%d in "
                   "each replica's cpu totals): %s\n",
                   replicas, replicas, line);
        else
            banner("  diloco outer state (host memory, this rank's pieces; in the cpu totals): %s\n", line);
    }
    rank_memory probe;
    bool have_gpu = rank_plan(t, cfg, world, true, RECOMPUTE_OFF, &probe);
    // What auto picks on the CPU backend of this machine (the budget of a run here).
    recompute_setting c[MAX_RECOMPUTE_CANDIDATES];
    char where[256];
    int64_t budget = cfg->memory_budget_mb > 0 ? cfg->memory_budget_mb * 1048576
                                               : plan_cpu_budget_bytes(1, where, sizeof where);
    if (cfg->memory_budget_mb > 0) snprintf(where, sizeof where, "memory_budget_mb");
    if (replicas > 1) {  // as resolve_recompute divides a run's
        budget /= replicas;
        size_t at = strlen(where);
        snprintf(where + at, sizeof where - at, ", / %d replicas in this process", replicas);
    }
    rank_memory cpu_pick;
    int pick = first_fitting(t, cfg, world, false, budget, c, &cpu_pick);
    recompute_setting cpu_auto = pick >= 0 ? c[pick] : (recompute_setting){RECOMPUTE_FULL, 1};
    print_mode_table(t, cfg, world, gpu_row, have_gpu, cpu_auto);
    char label[64];
    plan_recompute_label(cpu_auto, label, sizeof label);
    if (pick >= 0)
        banner("  recompute = auto on the cpu backend: %s (%s per rank; fits %s = %s)\n", label,
               bytes_text(cpu_pick.total, a, sizeof a), where, bytes_text(budget, b, sizeof b));
    else
        banner("  recompute = auto on the cpu backend: no mode fits %s = %s (a run stops with an error)\n",
               where, bytes_text(budget, b, sizeof b));
    if (have_gpu && gpu_row >= 0) {
        int64_t gpu_budget = gpu_memory_budget_bytes(gpu_memory_bytes(gpu_row)) / replicas;
        rank_memory gpu_pick;
        int would = first_fitting(t, cfg, world, true, gpu_budget, c, &gpu_pick);
        char would_label[64];
        if (would >= 0) {
            plan_recompute_label(c[would], would_label, sizeof would_label);
            banner("  recompute = auto on %s: %s (%s per rank; fits %s)\n", gpu_memory_name(gpu_row),
                   would_label, bytes_text(gpu_pick.total, a, sizeof a), bytes_text(gpu_budget, b, sizeof b));
        } else {
            banner("  recompute = auto on %s: no mode fits %s (a run stops with an error)\n",
                   gpu_memory_name(gpu_row), bytes_text(gpu_budget, b, sizeof b));
        }
    }
    // Every term of the run as configured: on the CPU its recompute (auto: what it picks here);
    // on the GPU of --gpu what auto picks there (none without --gpu), or the configured mode.
    recompute_setting cpu_mode = config_recompute_auto(cfg) ? cpu_auto : config_recompute(cfg);
    rank_memory cpu;
    rank_plan(t, cfg, world, false, cpu_mode, &cpu);
    plan_describe(&cpu, line, sizeof line);
    plan_recompute_label(cpu_mode, label, sizeof label);
    banner("  cpu backend (fp32), recompute %s: %s\n", label, line);
    if (!have_gpu) {
        banner("  gpu: this build has no CUDA model to size the activations (build with nvcc)\n");
        return;
    }
    recompute_setting gpu_mode = config_recompute(cfg);
    if (config_recompute_auto(cfg)) {
        gpu_mode = RECOMPUTE_OFF;
        rank_memory fit;
        int64_t gpu_budget = gpu_row >= 0 ? gpu_memory_budget_bytes(gpu_memory_bytes(gpu_row)) / replicas : 0;
        int would = gpu_row >= 0 ? first_fitting(t, cfg, world, true, gpu_budget, c, &fit) : -1;
        if (would >= 0) gpu_mode = c[would];
    }
    rank_memory gpu;
    rank_plan(t, cfg, world, true, gpu_mode, &gpu);
    plan_describe(&gpu, line, sizeof line);
    plan_recompute_label(gpu_mode, label, sizeof label);
    banner("  gpu (bf16 gathered weights%s), recompute %s: %s\n",
           world > 1 ? ", as the CUDA backend allocates them" : "", label, line);
    gpu_memory_fit(gpu.total, line, sizeof line);
    banner("  fits each rank's GPU (plan + %.0f GiB headroom): %s\n", gib(GPU_MEMORY_HEADROOM_BYTES), line);
    enum { MAX_RANKS = 1024 };
    banner("  the smallest FSDP group that fits (same micro-batch, recompute %s):", label);
    for (int i = 0; i < gpu_memory_rows(); i++) {
        if (gpu_row >= 0 && i != gpu_row) continue;
        int n = smallest_fitting_world(t, cfg, gpu_mode, gpu_memory_bytes(i), MAX_RANKS);
        if (n > 0) printf("%s %s %d", i && gpu_row < 0 ? "," : "", gpu_memory_name(i), n);
        else printf("%s %s none up to %d (the activations alone take %.1f GiB: recompute or a smaller micro-batch)",
                    i && gpu_row < 0 ? "," : "", gpu_memory_name(i), (int)MAX_RANKS,
                    gib(gpu.activations + gpu.workspace));
    }
    printf("\n");
    if (gpu_row >= 0)
        banner("  %s at %d rank(s), recompute %s: %s\n", gpu_memory_name(gpu_row), world, label,
               gpu.total <= gpu_memory_budget_bytes(gpu_memory_bytes(gpu_row)) ? "fits" : "does not fit");
}

// The inner phase of diloco_inner_steps steps at 40 % MFU of peak_tflops on `world` GPUs (0
// without peak_tflops).
static double inner_phase_s(const param_table *t, const train_config *cfg, int world) {
    if (cfg->peak_tflops <= 0) return 0.0;
    double tokens = (double)(cfg->batch_size * cfg->model.seq_len * cfg->grad_accum) * (double)world;
    return (double)cfg->diloco_inner_steps * tokens * model_flops_per_token(t) /
           (0.4 * cfg->peak_tflops * 1e12 * (double)world);
}

// The rounds a catch-up takes the means of, for a state of s seconds on the link, a fragment
// syncing every sync_s and each of its means taking mean_s: those closed while the state went,
// then those closed while their means went, ...: s / sync_s / (1 − mean_s / sync_s) in all;
// -1 when a mean is no faster than a sync (it never catches up).
static int64_t catchup_rounds(double s, double sync_s, double mean_s) {
    return mean_s >= sync_s ? -1 : (int64_t)ceil(s / (sync_s - mean_s));
}

// What a replica that joins late or rejoins receives over tcp: θ and the outer momentum in fp32
// (diloco.c's state: 456 header bytes + 8 B/param per rank, 4 B/param where m is zero), the
// time that takes on a link of `link` bytes/s, and, with inner_s (the inner phase), what a
// transfer longer than the inner phase costs: the relay's catch-up (its default; with several
// hubs through the joiner's primary) lets the rounds go on, and the joiner takes the means of
// those that closed meanwhile (x: their bytes). decay_s > 0: the decay phase differs (phases of
// decay_s, or plain averaging there keeps m at zero: the donor sends θ alone), said apart.
static void print_join_transfer(const param_table *t, const train_config *cfg, int world, double link, double inner_s,
                                double decay_s, const diloco_traffic *x) {
    if (strcmp(cfg->diloco_transport, "tcp") != 0) return;
    bool with_m = cfg->diloco_outer_momentum != 0.0;
    int ranks = world > 0 ? world : 1;
    int64_t theta_bytes = PLAN_STATE_HEADER_BYTES * (int64_t)ranks + 4 * plan_pieces(t, ranks);
    int64_t bytes = theta_bytes + (with_m ? 4 * plan_pieces(t, ranks) : 0);
    double s = (double)bytes / link;
    char a[32], b[32], c[32];
    banner("diloco: a replica that joins late or rejoins receives the group's state, θ%s in fp32: "
           "%.3f GB (%lld bytes%s), %s on the link",
           with_m ? " and the outer momentum" : " (no outer momentum)", (double)bytes / 1e9, (long long)bytes,
           ranks > 1 ? ", every rank its pieces over its own connection" : "", format_duration(s, a, sizeof a));
    if (inner_s <= 0) {
        printf("\n");
        return;
    }
    // The donor's bytes pass through a hub on their way: on top of the exchange, that hub's link
    // carries the transfer at up to a replica link's rate each way while it lasts.
    const char *relayed = plan_hubs(cfg) > 1 ? "; the joiner's primary hub relays it, a replica link's rate more each "
                                               "way on that hub's link while it lasts"
                                             : "; the hub relays it, a replica link's rate more each way on the hub's "
                                               "link while it lasts";
    double mean_s = (double)x->fragment_down / link, P = (double)cfg->diloco_fragments;
    // The donor holds the means it has not sent yet: the most at the end of the state's first
    // pass, every round closed while it went (after it they go faster than they come).
    int64_t held = 0;
    printf("; the inner phase takes %s: ", format_duration(inner_s, b, sizeof b));
    int64_t rounds = catchup_rounds(s, inner_s / P, mean_s);
    if (s <= inner_s) {
        printf("the donor sends it while it trains, the group does not wait");
        if (P > 1 && s > inner_s / P && rounds > 0) {   // fragments land while it goes
            printf(" (the joiner then takes the means of about %lld fragment round(s) closed meanwhile, %.3f GB)",
                   (long long)rounds, (double)rounds * (double)x->fragment_down / 1e9);
            held = (int64_t)ceil(s / (inner_s / P));
        }
    }
    else if (rounds < 0)
        printf("the relay's catch-up (its default) does not hold the rounds, but a fragment's mean takes %s on the "
               "link, as long as a sync interval (%s): the joiner never catches up (a larger H or fewer fragments, "
               "or a faster link)",
               format_duration(mean_s, c, sizeof c), format_duration(inner_s / P, a, sizeof a));
    else {
        printf("the relay's catch-up (its default%s) does not hold the rounds for it: the joiner then takes the means "
               "of about %lld round(s) closed meanwhile (%.3f GB, %s more) and trains",
               plan_hubs(cfg) > 1 ? "; through the joiner's primary hub" : "", (long long)rounds,
               (double)rounds * (double)x->fragment_down / 1e9, format_duration((double)rounds * mean_s, c, sizeof c));
        held = (int64_t)ceil(s / (inner_s / P));
    }
    if (decay_s > 0 && (decay_s < inner_s || s > inner_s)) {  // else it fits both phases alike
        // Plain averaging in the decay phase keeps m at zero (after each fragment's first such
        // step): the donor leaves it out (diloco.c's pack_state).
        bool theta_alone = with_m && cfg->diloco_plain_in_decay;
        double sd = theta_alone ? (double)theta_bytes / link : s;
        char alone[96] = "";
        if (theta_alone)
            snprintf(alone, sizeof alone, "; θ alone, plain averaging keeping m at zero: %.3f GB, %s",
                     (double)theta_bytes / 1e9, format_duration(sd, c, sizeof c));
        int64_t decay_rounds = catchup_rounds(sd, decay_s / P, mean_s);
        printf("; in the decay phase (phases of %s%s)", format_duration(decay_s, b, sizeof b), alone);
        if (sd <= decay_s)
            printf(" the donor sends it while it trains");
        else if (decay_rounds < 0)
            printf(" a join never catches up before the run ends");
        else {
            printf(" about %lld round(s) (%.3f GB, %s more)", (long long)decay_rounds,
                   (double)decay_rounds * (double)x->fragment_down / 1e9,
                   format_duration((double)decay_rounds * mean_s, c, sizeof c));
            int64_t decay_held = (int64_t)ceil(sd / (decay_s / P));
            if (decay_held > held) held = decay_held;
        }
    }
    if (held > 0)
        printf("; the donor holds the means it has not sent yet, at most those of about %lld round(s) (%.3f GB, "
               "%.3f GB per rank; the joiner applies each as it comes)",
               (long long)held, (double)held * (double)x->fragment_down / 1e9,
               (double)held * (double)x->fragment_down / 1e9 / ranks);
    printf("%s\n", relayed);
}

// One hub host's CPU and memory per outer step (plan_hub_load) against link_s, a replica's
// exchange on its link: a hub thread slower than that sets the exchange's pace.
static void print_hub_load(const param_table *t, const train_config *cfg, int world, double link_s) {
    hub_load h = plan_hub_load(cfg, t, world);
    if (h.hubs == 0) return;
    double relay_s = h.cpu_s / h.relays;
    char a[32], b[32], c[32], d[32], e[32], relays[128] = "`relay` (one thread)";
    if (h.relays > 1)
        snprintf(relays, sizeof relays, "`relay --shards %d` (a thread per rank of a replica, ports p .. p + %d)",
                 h.relays, h.relays - 1);
    banner("diloco: each of %d hub host(s) runs %s: about %s of CPU per outer step at the measured "
           "%.1f GB of contributions per core-second (%s per thread); memory about %s (%s downlink residual + %s of "
           "segments on their way); ",
           h.hubs, relays, format_duration(h.cpu_s, a, sizeof a), PLAN_HUB_BYTES_PER_CORE_S / 1e9,
           format_duration(relay_s, b, sizeof b), format_bytes((uint64_t)(h.residual + h.in_flight), c, sizeof c),
           format_bytes((uint64_t)h.residual, d, sizeof d), format_bytes((uint64_t)h.in_flight, e, sizeof e));
    if (relay_s <= link_s)
        printf("the links (%s) set the exchange's pace\n", format_duration(link_s, b, sizeof b));
    else {
        int more = (int)ceil((double)h.hubs * relay_s / link_s);
        printf("a thread is slower than the links (%s): the exchange takes its time; %d hubs would keep up\n",
               format_duration(link_s, b, sizeof b), more);
    }
}

// DiLoCo's bytes per outer step for one replica of `world` ranks, the time they take on a
// link of link_mbps each way, what passes through the hub, and (with peak_tflops) how that
// compares with the inner phase at 40 % MFU: the figures docs/diloco.md's recipes quote.
// world: a replica's FSDP group (whose ranks send their pieces); processes: its ranks in all,
// world x dp_replicate, whose tokens an inner step takes.
static void print_diloco_traffic(const param_table *t, const train_config *cfg, int world, int64_t processes,
                                 double link_mbps) {
    if (cfg->diloco_replicas <= 0) return;
    diloco_traffic x = plan_diloco_traffic(cfg, t, world);
    double N = (double)t->numel, M = (double)cfg->diloco_replicas, link = link_mbps * 1e6 / 8;  // bytes/s
    char topk[48] = "";
    if (cfg->diloco_topk < 1) snprintf(topk, sizeof topk, " top %g", cfg->diloco_topk);
    char a[32], b[32];
    double up_s, down_s;
    if (strcmp(cfg->diloco_transport, "mpi") == 0) {
        // No hub and no framing: each rank reduces the segments s mod M, so it sends the others'
        // segments of its payload and its means to the others, and takes theirs: (M − 1)/M of
        // the payload up and of the mean down, each way (a rank whose share holds one segment
        // more moves that more; until 2026-12 this printed the tcp hub's figures).
        double each_way = (M - 1) / M * (double)(x.payload_up + x.payload_down);
        banner("diloco: per replica per outer step over mpi (%lld replicas, H = %lld, %lld fragment(s)): "
               "%.3f GB (%.0f bytes) each way on average over the ranks, (M - 1)/M of the payload (%s%s, %.3f "
               "B/param) and of the mean (%.3f B/param): an all-to-all of the segments, then an all-gather of the "
               "means; no hub\n",
               (long long)cfg->diloco_replicas, (long long)cfg->diloco_inner_steps, (long long)cfg->diloco_fragments,
               each_way / 1e9, each_way, cfg->diloco_quant, topk, (double)x.payload_up / N, (double)x.payload_down / N);
        up_s = down_s = each_way / link;
        banner("diloco: on a %g Mbit/s link per rank: %s each way\n", link_mbps,
               format_duration(up_s, a, sizeof a));
    } else {
        banner("diloco: per replica per outer step (%lld replicas, H = %lld, %lld fragment(s)): %.3f GB up "
               "(%s%s, %.3f B/param, %lld bytes) and %.3f GB down (%.3f B/param, %lld bytes), framing (%.2f MB each way) "
               "included%s\n",
               (long long)cfg->diloco_replicas, (long long)cfg->diloco_inner_steps, (long long)cfg->diloco_fragments,
               (double)x.up / 1e9, cfg->diloco_quant, topk, (double)x.up / N, (long long)x.up, (double)x.down / 1e9,
               (double)x.down / N, (long long)x.down, (double)x.framing / 1e6,
               strcmp(cfg->diloco_transport, "local") == 0 ? " (simulated: diloco_transport = local sends nothing)"
                                                           : "");
        up_s = (double)x.up / link, down_s = (double)x.down / link;
        int hubs = plan_hubs(cfg);   // each of K hubs reduces 1/K of the segments
        banner("diloco: on a %g Mbit/s replica link: %s up, %s down (the mean comes back while the upload "
               "goes on); through each of %d hub(s) per outer step %.1f GB in, %.1f GB out: a hub link of %g Mbit/s "
               "each way keeps up\n",
               link_mbps, format_duration(up_s, a, sizeof a), format_duration(down_s, b, sizeof b), hubs,
               M * (double)x.up / 1e9 / hubs, M * (double)x.down / 1e9 / hubs, M * link_mbps / hubs);
        print_hub_load(t, cfg, world, up_s > down_s ? up_s : down_s);
    }
    int64_t H = cfg->diloco_inner_steps, Hd = cfg->diloco_decay_inner_steps, D = decay_start_step(cfg);
    bool decay_syncs = Hd > 0 && cfg->max_steps > D;
    if (decay_syncs) {  // whole-model syncs: every H to D, then every H_d, and the final one
        int64_t with = D / H + (cfg->max_steps - D + Hd - 1) / Hd, without = (cfg->max_steps + H - 1) / H;
        banner("diloco: diloco_decay_inner_steps %lld: an outer step every %lld inner steps from step %lld "
               "(the decay phase): %lld outer steps in the run instead of %lld (%.2f× the bytes)\n",
               (long long)Hd, (long long)Hd, (long long)D, (long long)with, (long long)without,
               (double)with / (double)without);
    }
    if (cfg->peak_tflops > 0) {
        double tokens = (double)(cfg->batch_size * cfg->model.seq_len * cfg->grad_accum) * (double)processes;
        double inner_s = inner_phase_s(t, cfg, world);  // tokens / GPUs: the same at any count
        double exchange_s = up_s > down_s ? up_s : down_s;
        banner("diloco: the %lld inner steps take %s at 40%% MFU of %.0f TFLOP/s per GPU on %lld GPU(s) "
               "(%.0f tokens a step): the exchange is %.2f× the inner phase%s\n",
               (long long)cfg->diloco_inner_steps, format_duration(inner_s, a, sizeof a), cfg->peak_tflops,
               (long long)processes,
               tokens, exchange_s / inner_s,
               exchange_s > inner_s ? " — longer than the compute: larger H, a smaller codec or top-k" : "");
        if (decay_syncs) {
            double decay_s = inner_s * (double)Hd / (double)H;
            banner("diloco: in the decay phase the %lld inner steps take %s: the exchange is %.2f× them%s\n",
                   (long long)Hd, format_duration(decay_s, a, sizeof a), exchange_s / decay_s,
                   exchange_s > decay_s ? " — training waits there" : "");
        }
        // Streaming hides a fragment's sync behind diloco_overlap_steps inner steps (docs/diloco.md).
        double step_s = inner_s / (double)cfg->diloco_inner_steps;
        double frag_s = (double)(x.fragment_up > x.fragment_down ? x.fragment_up : x.fragment_down) / link;
        double window_s = (double)cfg->diloco_overlap_steps * step_s;
        banner("diloco: the largest of %lld fragment sync(s) takes %s on the link; diloco_overlap_steps "
               "%lld = %s of inner steps: %s\n",
               (long long)cfg->diloco_fragments, format_duration(frag_s, a, sizeof a),
               (long long)cfg->diloco_overlap_steps, format_duration(window_s, b, sizeof b),
               window_s >= frag_s ? "hidden (training does not wait)"
               : cfg->diloco_overlap_steps > 0 ? "not hidden: training waits for the rest"
                                               : "training waits for every sync");
    }
    // The decay phase is told apart where its phases are shorter or its state is θ alone.
    double inner_s = inner_phase_s(t, cfg, world);
    bool decay_plain = cfg->diloco_plain_in_decay && cfg->diloco_outer_momentum != 0.0 && cfg->max_steps > D;
    double decay_s = decay_syncs ? inner_s * (double)Hd / (double)H : decay_plain ? inner_s : 0.0;
    print_join_transfer(t, cfg, world, link, inner_s, decay_s, &x);
}

// Prints the model's size, FLOPs per token and memory plan without touching any data
// (`train_gpt plan CONFIG [--world N] [--gpu NAME]`). world: the FSDP group a rank's memory is
// planned for (fsdp_size); processes: the job's, world x dp_replicate (HSDP), which the batch
// and the time of the run count.
static int train_plan(train_config *cfg, int world, int64_t processes, int gpu_row, double link_mbps) {
    config_check_tokens(cfg, processes);
    param_table t;
    param_table_build(&t, &cfg->model);
    print_model_summary(&t, cfg, processes);
    int64_t gpu_bytes = gpu_plan_bytes(&t, cfg->batch_size, cfg->model.seq_len, config_recompute(cfg));  // -1: no GPU backend
    if (gpu_bytes >= 0) {
        char fit[512];
        gpu_memory_fit(gpu_bytes, fit, sizeof fit);
        banner("fits one GPU (plan + %.0f GiB headroom): %s\n",
               (double)GPU_MEMORY_HEADROOM_BYTES / 1073741824.0, fit);
    }
    print_rank_plans(&t, cfg, world, gpu_row);
    print_diloco_traffic(&t, cfg, world, processes, link_mbps);
    if (cfg->peak_tflops > 0) {
        double tokens = (double)(cfg->batch_size * cfg->model.seq_len * cfg->grad_accum) * (double)processes *
                        (double)cfg->max_steps;
        double seconds_at_40 = tokens * model_flops_per_token(&t) / (0.4 * cfg->peak_tflops * 1e12);
        char d[32], dw[32];
        banner("at 40%% MFU of %.0f TFLOP/s: %.0f tokens/s per device, the run takes %s on one device",
               cfg->peak_tflops, 0.4 * cfg->peak_tflops * 1e12 / model_flops_per_token(&t),
               format_duration(seconds_at_40, d, sizeof d));
        if (processes > 1)
            printf(", %s on %lld", format_duration(seconds_at_40 / (double)processes, dw, sizeof dw),
                   (long long)processes);
        printf("\n");
    }
    param_table_free(&t);
    return 0;
}

// After the first step on the CPU backend: what this rank holds against the plan the banner
// printed. The pieces are exact by construction; the gathered units are the backend's own
// counters (the most held at once so far), the activations the CPU model's allocator count
// (activations and workspace together: it counts both), and the process's RSS says what the
// allocator and the libraries add.
static void print_rank_memory(const trainer *tr) {
    rank_memory plan = cpu_rank_plan(&tr->table, tr->cfg, tr->group ? comm_size(tr->group) : 1);
    struct rusage usage;
    double rss = getrusage(RUSAGE_SELF, &usage) == 0 ? (double)usage.ru_maxrss * 1024.0 : 0.0;
    int64_t pieces = tr->shard.local_numel * 16;
    bool small = plan.total < ((int64_t)1 << 30);
    const double g = small ? 1048576.0 : 1073741824.0;
    const char *u = small ? "MiB" : "GiB";
    char label[64];
    plan_recompute_label(config_recompute(tr->cfg), label, sizeof label);
    note("memory per rank after the first step (%s): pieces %.3f (planned %.3f), gathered weights %.3f at most "
         "(planned %.3f), unit gradients %.3f at most (planned %.3f), activations %.3f at most (planned %.3f, "
         "recompute %s); peak RSS %.3f (planned total %.3f)",
         u,
         (double)pieces / g, (double)(plan.weights + plan.grads + plan.optimizer) / g,
         (double)tr->be->gathered_peak_bytes / g, (double)plan.gathered_weights / g,
         (double)tr->be->grads_peak_bytes / g, (double)plan.gathered_grads / g,
         (double)tr->be->activation_peak_bytes / g, (double)(plan.activations + plan.workspace) / g, label, rss / g,
         (double)plan.total / g);
}

static void allocate(trainer *tr) {
    train_config *cfg = tr->cfg;
    param_table_build(&tr->table, &cfg->model);
    if (tr->group) shard_map_build(&tr->shard, &tr->table, comm_rank(tr->group), comm_size(tr->group));
    else shard_map_build(&tr->shard, &tr->table, 0, 1);
    size_t n = (size_t)tr->shard.local_numel;
    tr->params = alloc_floats(n);
    tr->exp_avg = alloc_floats(n);
    tr->exp_avg_sq = alloc_floats(n);
    // The one place that knows which backend runs: the CPU's works on the host buffers, the
    // GPU's on its own copy.
    int64_t B = cfg->batch_size, T = cfg->model.seq_len;
    tr->be = tr->device == DEVICE_CUDA
                 ? gpu_backend_create(&tr->table, B, T, config_recompute(cfg), tr->group, tr->copies,
                                      cfg->fsdp_reshard_after_forward, cfg->fsdp_prefetch)
                 : cpu_backend_create_sharded(&tr->table, tr->group, tr->copies, cfg->fsdp_reshard_after_forward,
                                              cfg->fsdp_prefetch, config_recompute(cfg), B, T, tr->params,
                                              tr->exp_avg, tr->exp_avg_sq);
    size_t tokens = (size_t)(cfg->batch_size * cfg->model.seq_len);
    tr->inputs = (int32_t *)xmalloc(tokens * sizeof *tr->inputs);
    tr->targets = (int32_t *)xmalloc(tokens * sizeof *tr->targets);
    tr->flops_per_token = model_flops_per_token(&tr->table);
}

// Frees what allocate() made and the trainer's own train data; the log, the validation data and
// the sampler are the caller's (a simulated run's replicas share them).
static void release(trainer *tr) {
    backend_free(tr->be);
    dataloader_close(tr->train);
    free(tr->params);
    free(tr->exp_avg);
    free(tr->exp_avg_sq);
    free(tr->inputs);
    free(tr->targets);
    shard_map_free(&tr->shard);
    param_table_free(&tr->table);
}

static model_buffers buffers_of(trainer *tr) {
    model_buffers b;
    memset(&b, 0, sizeof b);
    b.table = &tr->table;
    b.params = tr->params;
    b.exp_avg = tr->exp_avg;
    b.exp_avg_sq = tr->exp_avg_sq;
    b.shard = &tr->shard;
    b.job = tr->job;
    b.writer = true;
    b.outer_elsewhere = tr->copies_follow;
    if (tr->job) b.writer = !tr->copies || comm_rank(tr->copies) == 0;  // HSDP: the first copy writes
    if (tr->outer) diloco_attach_buffers(tr->outer, &b);
    return b;
}

// ---------------------------------------------------------------- HSDP copies in a DiLoCo replica
// A DiLoCo replica may be an HSDP job (docs/fsdp.md#hsdp-copies-in-a-diloco-replica): its copies
// hold the same weights after every step (their gradients are all-reduced), so only the first
// copy's ranks run DiLoCo, each with its own connection to the hub as an FSDP replica's ranks
// do, and every rank of another copy takes what DiLoCo did from the first copy's rank that
// holds the same pieces (a broadcast over `copies`, root 0): whether an extra step or a sync
// is due, and after DiLoCo changed the weights, the weights and counters — after a rejoin at
// the group's step, with its own data position at that step. The followers wait for DiLoCo's
// outcome without comm_timeout_s, as a sharded replica's ranks do in a join: a round may wait
// long for the other replicas (the launcher still ends a job whose rank died).

static bool outer_on(const trainer *tr) { return tr->outer || tr->copies_follow; }

// The watchdog during DiLoCo's outer work: on a rank that runs it, stuck only when its network
// moves nothing (an exchange may wait hours for a state transfer: watchdog_phase_moving); on
// another HSDP copy, not watched while it waits for the first copy's outcome (as the ranks of
// a sharded replica wait in a join: the launcher still ends a job whose rank died).
static void watch_outer_work(const trainer *tr, const char *phase) {
    if (tr->outer) watchdog_phase_moving(phase, tr->state.step);
    else watchdog_phase(NULL, tr->state.step);
}

static void copies_broadcast(trainer *tr, void *data, int64_t bytes) {
    double limit_s = comm_timeout();
    comm_set_timeout(86400.0);
    const int64_t chunk = (int64_t)1 << 30;  // one MPI call carries < 2 GiB
    for (int64_t at = 0; at < bytes; at += chunk)
        comm_broadcast(tr->copies, (char *)data + at, min_i64(chunk, bytes - at), 0);
    comm_set_timeout(limit_s);
}

// The first copy's answer, on every copy.
static bool first_copy_says(trainer *tr, bool answer) {
    if (!tr->copies_follow) return answer;
    uint8_t b = answer ? 1 : 0;
    copies_broadcast(tr, &b, 1);
    return b != 0;
}

// After DiLoCo's part on the first copy (changed: whether it changed the weights; whole: send
// all of them, else only the span DiLoCo wrote — one fragment's with streaming; before: its
// data position before), every copy holds the same weights and counters, and its own data
// position, and tr->over says whether DiLoCo found the run over. Returns changed.
static bool follow_first_copy(trainer *tr, bool changed, bool whole, data_position before) {
    tr->over = tr->outer && diloco_group_over(tr->outer);
    tr->join_stopped = tr->outer && diloco_join_stopped(tr->outer);
    if (!tr->copies_follow) return changed;
    uint8_t flags[3] = {(uint8_t)(changed ? 1 : 0), 0, (uint8_t)(tr->over ? 1 : tr->join_stopped ? 2 : 0)};
    if (tr->outer) flags[1] = memcmp(&before, &tr->state.data, sizeof before) != 0;  // a rejoin moved it
    copies_broadcast(tr, flags, sizeof flags);
    tr->over = flags[2] == 1;
    tr->join_stopped = flags[2] == 2;
    train_state st = tr->state;  // the counters (outer_step, merge_step) move without the weights too
    copies_broadcast(tr, &st, sizeof st);
    if (flags[0]) {
        int64_t span[2] = {0, tr->shard.local_numel};  // offset, values
        if (tr->outer && !whole) diloco_changed_range(tr->outer, &span[0], &span[1]);
        copies_broadcast(tr, span, sizeof span);
        // The caller uploads all of params: outside the span they must be this copy's own
        // trained weights, which only the backend holds (a GPU's; on the CPU the same memory).
        if (!tr->outer && span[1] < tr->shard.local_numel) backend_download(tr->be, tr->params, NULL, NULL);
        int64_t bytes = span[1] * (int64_t)sizeof(float);
        bool skip = !tr->outer && fault_requested("hsdp_skip_follow", st.step);  // the guard's test
        if (skip) {
            float *lost = (float *)xmalloc((size_t)bytes + 1);
            copies_broadcast(tr, lost, bytes);
            free(lost);
        } else {
            copies_broadcast(tr, tr->params + span[0], bytes);
        }
        tr->follow_bytes += bytes;
    }
    if (!tr->outer) {
        data_position mine = tr->state.data;
        int64_t was = tr->state.step;
        tr->state = st;
        tr->state.data = mine;
        if (flags[1]) diloco_seek_data(tr->cfg, tr->train, &tr->state, was);
    }
    return flags[0] != 0;
}

// Every checkpoint of an HSDP job first checks that its copies hold the same weights (the
// first copy writes them for all): the XXH64 of every rank's pieces against its first copy's.
// Copies that differ are a bug that would otherwise go unseen; the run stops before it writes.
static void check_copies_agree(trainer *tr) {
    if (!tr->copies || comm_size(tr->copies) == 1) return;
    uint64_t mine = diloco_hash(tr->params, tr->shard.local_numel), first = mine;
    comm_broadcast(tr->copies, &first, sizeof first, 0);
    double differ = comm_max(tr->job, mine != first ? (double)comm_rank(tr->job) + 1.0 : 0.0);
    if (differ > 0)
        fail("HSDP: the copies of the model hold different weights at step %lld (rank %d's pieces differ from its "
             "first copy's); no checkpoint is written — this is a bug, please report it with the log",
             (long long)tr->state.step, (int)differ - 1);
}

// A job's ranks split their replica's rows (dataloader.h): they must read the same data, or
// they read overlapping rows and miss others without a word (a node whose copy of the shards
// differs, or is still being copied). Fatal on every rank, naming the first that differs.
static void agree_on_data(const trainer *tr) {
    if (!tr->job || comm_size(tr->job) < 2) return;
    uint64_t mine = dataloader_fingerprint(tr->train), first = mine;
    comm_broadcast(tr->job, &first, sizeof first, 0);
    double differ = comm_max(tr->job, mine != first ? (double)(comm_size(tr->job) - comm_rank(tr->job)) : 0.0);
    if (differ > 0)
        fail("train_data: rank %d of the job reads other data than rank 0 (the ranks split the same rows, so every "
             "rank must read the same shards); this rank, %d, reads %llu tokens in %d shard(s), fingerprint %016llx, "
             "rank 0's is %016llx",
             comm_size(tr->job) - (int)differ, comm_rank(tr->job), (unsigned long long)dataloader_total_tokens(tr->train),
             dataloader_shard_count(tr->train), (unsigned long long)mine, (unsigned long long)first);
}

// The train data this run reads (dataloader_fingerprint), for state.json.
static data_identity data_identity_of(const dataloader *d) {
    return (data_identity){(int64_t)dataloader_total_tokens(d), dataloader_shard_count(d), dataloader_fingerprint(d)};
}

// "12345 tokens in 3 shards (fingerprint 0123456789abcdef)", for the messages below.
static void describe_data(const data_identity *id, char *out, size_t n) {
    snprintf(out, n, "%lld tokens in %lld shard(s) (fingerprint %016llx)", (long long)id->tokens, (long long)id->shards,
             (unsigned long long)id->fingerprint);
}

// Whether a recorded position counts in other data than this run's: a warning (what) that says
// which and what it means. Growing a corpus between jobs is legitimate; reading its rows
// twice or never, without a word, is not.
static void compare_data(const trainer *tr, const data_identity *was, const char *what) {
    data_identity now = data_identity_of(tr->train);
    if (was->tokens == 0 || was->fingerprint == now.fingerprint || tr->rank != 0) return;
    char a[160], b[160];
    describe_data(was, a, sizeof a);
    describe_data(&now, b, sizeof b);
    warn("%s read train data of %s, this run's train_data holds %s: its data position is kept, but it no longer "
         "names the same rows (%s), so rows of this epoch may repeat or be missed",
         what, a, b,
         tr->cfg->shuffle ? "the shuffled order is a permutation of all the rows" : "the stream shifted where shards changed");
}

// A checkpoint saved by a job of another size, micro-batch or row length (FSDP at np 4
// resumed at np 2, batch_size 4 resumed at 8, seq_len 1024 resumed at 2048): the position
// counts each process's micro-batches, and micro-batch i of process r of W holds rows
// (i · W + r) · B .. + B − 1 of the epoch's order, so the index · W · B rows read are the first
// rows for every W and B; unshuffled, they are the stream's first index · W · B · T tokens. This
// run's processes each take ⌈rows′ / (W′ · B′)⌉ of theirs, rows′ = ⌈tokens / T′⌉ (= rows when T
// is unchanged): exactly the same place when that divides, else fewer than W′ · B′ rows are
// skipped (none is read twice). At most an epoch: a position at an epoch's end turns into the
// next epoch's start at the first micro-batch, as it does without a resume.
// The split that wrote st's data position (state.json's data_world and window; an old
// checkpoint's: this run's).
typedef struct {
    int64_t world, batch, seq_len;
} data_layout;

static data_layout layout_of(const trainer *tr, const train_state *st) {
    bool recorded = st->window.batch_size > 0;
    return (data_layout){st->data_world > 0 ? st->data_world : tr->world,
                        recorded ? st->window.batch_size : tr->cfg->batch_size,
                        recorded ? st->window.seq_len : tr->cfg->model.seq_len};
}

// st's data index in this run's micro-batches (above); *rows: the rows it stands for, in this
// run's rows. Fails on a position out of range.
static int64_t index_here(const trainer *tr, const train_state *st, int64_t *rows_out) {
    data_layout was = layout_of(tr, st);
    int64_t now = tr->world, batch = tr->cfg->batch_size, T = tr->cfg->model.seq_len;
    if (st->data.index > INT64_MAX / was.world / was.batch / was.seq_len)
        fail("the checkpoint's data position (%lld micro-batches of %lld x %lld rows of %lld tokens) is out of range",
             (long long)st->data.index, (long long)was.world, (long long)was.batch, (long long)was.seq_len);
    int64_t rows = st->data.index * was.world * was.batch;
    if (was.seq_len != T) rows = (rows * was.seq_len + T - 1) / T;
    if (rows_out) *rows_out = rows;
    int64_t per = now * batch;
    return min_i64((rows + per - 1) / per, dataloader_batches_per_epoch(tr->train));
}

static void convert_data_position(trainer *tr) {
    const train_config *cfg = tr->cfg;
    const data_window *w = &tr->state.window;
    bool recorded = w->batch_size > 0;
    if (recorded && (w->shuffle != cfg->shuffle || (cfg->shuffle && w->seed != cfg->seed)) && tr->rank == 0)
        warn("resume: the checkpoint's data was read with shuffle = %d, seed = %lld, this run has shuffle = %d, seed = "
             "%lld: its position is kept, but rows of this epoch may now repeat or be missed",
             w->shuffle ? 1 : 0, (long long)w->seed, cfg->shuffle ? 1 : 0, (long long)cfg->seed);
    data_layout split = layout_of(tr, &tr->state);
    int64_t was = split.world, was_batch = split.batch, was_T = split.seq_len;
    int64_t now = tr->world, batch = cfg->batch_size, T = cfg->model.seq_len;
    compare_data(tr, &tr->state.data_id, "resume: the checkpoint");
    tr->state.data_id = data_identity_of(tr->train);
    if (was == now && was_batch == batch && was_T == T) {
        tr->state.data_world = now;
        return;
    }
    if (was_T != T && cfg->shuffle && tr->rank == 0)
        warn("resume: the checkpoint read rows of %lld tokens in a shuffled order, this run's rows are %lld tokens: "
             "the order of the epoch's rows changes, so rows of this epoch may repeat or be missed",
             (long long)was_T, (long long)T);
    int64_t rows, per = now * batch, index = index_here(tr, &tr->state, &rows);
    tr->state.data_world = now;
    if (tr->rank == 0)
        note("resume: the data position of %lld process(es) x %lld rows of %lld tokens (%lld micro-batches each) is "
             "%lld micro-batches each for %lld x %lld rows of %lld%s",
             (long long)was, (long long)was_batch, (long long)was_T, (long long)tr->state.data.index, (long long)index,
             (long long)now, (long long)batch, (long long)T,
             index * per == rows ? "" : " (fewer than one micro-batch of rows per process skipped, none read twice)");
    tr->state.data.index = index;
}

// init_from = a checkpoint directory (a warm start: one cluster's run, then DiLoCo): this
// run reads on where that run stopped, so that no token of its data is trained on twice.
// That run's processes had taken the first index·world micro-batches of B₀ rows of their
// epoch; this run's W processes (all replicas and ranks) each start at micro-batch
// ⌈⌈rows / B⌉ / W⌉ of the epoch, skipping fewer than W·B rows rather than reading any twice.
// The windows must be the same: seq_len, shuffle and (when shuffled) seed equal.
static void continue_data_of(trainer *tr, const char *dir) {
    train_config *cfg = tr->cfg;
    data_origin o;
    char why[600];
    if (!checkpoint_data_origin(dir, tr->job, &o, why, sizeof why)) fail("init_from: checkpoint '%s': %s", dir, why);
    if (o.window.seq_len != cfg->model.seq_len)
        fail("init_from: '%s' read its data in rows of seq_len %lld, this run's seq_len is %lld: its data position "
             "does not carry over (name its model.safetensors to take the weights alone)",
             dir, (long long)o.window.seq_len, (long long)cfg->model.seq_len);
    if (o.window.shuffle != cfg->shuffle || (o.window.shuffle && o.window.seed != (int64_t)cfg->seed))
        fail("init_from: '%s' was trained with shuffle = %d, seed = %lld, this run has shuffle = %d, seed = %lld: the "
             "order of its data differs, so its position does not carry over (set them equal, or name its "
             "model.safetensors to take the weights alone)",
             dir, o.window.shuffle ? 1 : 0, (long long)o.window.seed, cfg->shuffle ? 1 : 0, (long long)cfg->seed);
    if (o.train_data[0] && strcmp(o.train_data, cfg->train_data) != 0)
        warn("init_from: '%s' was trained on train_data = %s, this run reads %s; its position is taken as a "
             "position in these files",
             dir, o.train_data, cfg->train_data);
    char what[4300];
    snprintf(what, sizeof what, "init_from: '%s'", dir);
    compare_data(tr, &o.data_id, what);
    if (o.data.index > INT64_MAX / o.data_world / o.window.batch_size)
        fail("init_from: '%s': its data position (%lld micro-batches of %lld x %lld rows) is out of range", dir,
             (long long)o.data.index, (long long)o.data_world, (long long)o.window.batch_size);
    int64_t rows = o.data.index * o.data_world * o.window.batch_size, B = cfg->batch_size, W = tr->world;
    int64_t batches = (rows + B - 1) / B, index = (batches + W - 1) / W;
    tr->state.data = (data_position){o.data.epoch, index};
    dataloader_seek(tr->train, tr->state.data);
    if (tr->rank == 0)
        note("init_from: the data goes on after step %lld of '%s' (epoch %lld, %lld rows of %lld tokens read): "
             "each of %lld processes starts at its micro-batch %lld (%lld rows skipped)",
             (long long)o.step, dir, (long long)o.data.epoch, (long long)rows, (long long)o.window.seq_len, (long long)W,
             (long long)index, (long long)(index * W * B - rows));
}

// Whether checkpoint directory `path` lies directly in directory `dir` (both resolved).
static bool inside_dir(const char *path, const char *dir) {
    char *p = realpath(path, NULL), *d = realpath(dir, NULL);
    bool inside = false;
    if (p && d) {
        char *slash = strrchr(p, '/');
        if (slash) *slash = '\0';
        inside = strcmp(p[0] ? p : "/", d) == 0;
    }
    free(p);
    free(d);
    return inside;
}

// A resume that init_from would not start: the checkpoint's run began from other weights (or
// from none). A requeue gives the same init_from again and goes on; a new phase in the same
// out_dir (a warm-up's, as docs/diloco.md's recipe once had it) was resumed silently, the
// init_from unread, the step count and schedule the old run's. Refused: the two runs would mix.
static void refuse_ignored_init_from(const train_config *cfg, const char *from) {
    char was[4200];
    if (!checkpoint_config_value(from, "init_from", was, sizeof was) || strcmp(was, cfg->init_from) == 0) return;
    char *a = was[0] ? realpath(was, NULL) : NULL, *b = realpath(cfg->init_from, NULL);
    bool same = a && b && strcmp(a, b) == 0, gone = !b;   // the same file spelt otherwise; not there
    free(a);
    free(b);
    if (same) return;
    if (gone) {   // a requeue that spells it otherwise, once the source was deleted, cannot be told apart
        warn("init_from: '%s' is not there (deleted since the run began?); going on with out_dir's run, which began "
             "%s%s%s",
             cfg->init_from, was[0] ? "from '" : "without init_from", was, was[0] ? "'" : "");
        return;
    }
    fail("init_from: out_dir '%s' holds checkpoints of a run that began %s%s%s, and this run would resume '%s' "
         "without reading '%s': give this run its own out_dir (a run that starts from another's weights), or leave "
         "init_from out to go on with that run",
         cfg->out_dir, was[0] ? "from '" : "without init_from", was, was[0] ? "'" : "", from, cfg->init_from);
}

// Fresh init, init_from, or a checkpoint, as `resume` and `init_from` say. Returns whether
// a checkpoint was loaded.
static bool restore_or_init(trainer *tr) {
    train_config *cfg = tr->cfg;
    model_buffers b = buffers_of(tr);
    memset(&tr->state, 0, sizeof tr->state);
    char why_not[4400];
    if (!checkpoint_dir_writable(cfg->out_dir, why_not, sizeof why_not))  // before the run, not at its end
        fail("out_dir: %s", why_not);
    char *from = NULL;
    if (strcmp(cfg->resume, "auto") == 0) {
        from = checkpoint_load_latest(cfg->out_dir, &b, &tr->state);
    } else if (strcmp(cfg->resume, "never") != 0) {
        char why[512];
        if (!checkpoint_load(cfg->resume, &b, &tr->state, why, sizeof why))
            fail("resume: checkpoint '%s' cannot be used: %s", cfg->resume, why);
        from = xstrdup(cfg->resume);
        int64_t newest = checkpoint_newest_step(cfg->out_dir, tr->job), named = tr->state.step;
        if (newest > named && inside_dir(cfg->resume, cfg->out_dir))
            // Going back within a run: the new steps would sit below the old ones, ckpt_keep
            // would delete them and resume = auto would return to the old line.
            fail("resume: '%s' is older than out_dir's newest checkpoint step_%08lld: going back within a run would "
                 "write its steps below the newer ones, ckpt_keep would delete them and a restart would return to "
                 "them; move the newer checkpoints aside, or resume into another out_dir",
                 cfg->resume, (long long)newest);
        if (newest >= 0 && newest < named)
            // Not this run's progress (that would be newer): another run's, which ckpt_keep would
            // delete as this run's older checkpoints — refused as resume = never refuses them.
            fail("resume: out_dir '%s' holds checkpoints up to step_%08lld, older than '%s' (step %lld): they are "
                 "not this run's, and ckpt_keep would delete them; choose a new out_dir or move them",
                 cfg->out_dir, (long long)newest, cfg->resume, (long long)named);
        if (newest > named) {
            // The same command again: a run that began from another directory's checkpoint has
            // its own progress in out_dir.
            note("resume: out_dir '%s' holds step_%08lld, newer than '%s' (step %lld): this run's progress; going on "
                 "from out_dir's newest valid checkpoint, as resume = auto",
                 cfg->out_dir, (long long)newest, cfg->resume, (long long)named);
            free(from);
            memset(&tr->state, 0, sizeof tr->state);
            from = checkpoint_load_latest(cfg->out_dir, &b, &tr->state);
            if (!from || tr->state.step < named)
                fail("resume: out_dir '%s' holds no valid checkpoint at or after step %lld of '%s' (see the warnings "
                     "above); move its checkpoints aside to start again from '%s'",
                     cfg->out_dir, (long long)named, cfg->resume, cfg->resume);
        }
    }
    if (from && cfg->init_from[0]) refuse_ignored_init_from(cfg, from);
    if (from) {
        note("resuming from '%s' at step %lld", from, (long long)tr->state.step);
        int64_t was_max = tr->state.saved_max_steps, at = tr->state.step;
        if (was_max > 0 && was_max != cfg->max_steps && tr->rank == 0) {
            train_config then = *cfg;
            then.max_steps = was_max;
            warn("resume: max_steps was %lld when saved, now %lld: the learning-rate schedule is the new run's (at step "
                 "%lld the lr is %.3g, it was %.3g%s)",
                 (long long)was_max, (long long)cfg->max_steps, (long long)at, lr_at_step(cfg, at),
                 lr_at_step(&then, at),
                 at >= cfg->max_steps ? ": the run is already past its new max_steps, nothing is trained"
                 : at >= was_max      ? ": the saved run had finished"
                                      : "");
        }
        char outer_file[4200];
        snprintf(outer_file, sizeof outer_file, "%s/outer.safetensors", from);
        if (tr->rank == 0 && file_exists(outer_file)) {
            // What a resume changes of DiLoCo's outer loop is taken from here on, and said (a
            // plain checkpoint starting a DiLoCo run says so elsewhere).
            static const char *const keys[] = {
                "diloco_replicas", "diloco_inner_steps", "diloco_decay_inner_steps", "diloco_fragments",
                "diloco_overlap_steps", "diloco_merge_alpha", "diloco_outer_lr", "diloco_outer_momentum",
                "diloco_nesterov", "diloco_momentum_warmup", "diloco_plain_in_decay", "diloco_quant",
                "diloco_quant_block", "diloco_topk", "diloco_downlink", "diloco_error_feedback"};
            char changes[2048];
            if (checkpoint_config_changes(from, cfg, keys, (int)(sizeof keys / sizeof *keys), changes, sizeof changes) > 0)
                warn("resume: DiLoCo settings differ from the checkpoint's: %s; the new run's apply from step %lld", changes,
                     (long long)at);
        }
        convert_data_position(tr);
        dataloader_seek(tr->train, tr->state.data);
        strbuf extra = {};
        sb_append(&extra, "\"checkpoint\":");
        sb_json_string(&extra, from);
        metrics_event(tr->log, "resume", tr->state.step, extra.data);
        sb_free(&extra);
        free(from);
        return true;
    }
    // Starting over in a directory that holds another run's checkpoints would mix the two
    // runs and let ckpt_keep prune the old run's files.
    if (strcmp(cfg->resume, "never") == 0 && checkpoint_count(cfg->out_dir, tr->job) > 0)
        fail("resume = never, but out_dir '%s' already holds checkpoints of another run; choose a new out_dir or "
             "move them",
             cfg->out_dir);
    if (cfg->init_from[0]) {
        char why[512], weights[4200];
        // Checked here, not with the config: a resume (a requeue) does not read it, and its
        // source may be gone (a warm-up's 168-336 GB checkpoint deleted once the run went on).
        if (!dir_exists(cfg->init_from) && !file_exists(cfg->init_from))
            fail("init_from: no such file or checkpoint directory '%s'", cfg->init_from);
        bool from_checkpoint = dir_exists(cfg->init_from);
        snprintf(weights, sizeof weights, from_checkpoint ? "%s/model.safetensors" : "%s", cfg->init_from);
        // A checkpoint directory's weights were verified with its state.json; a file alone is
        // checked against the checksums.xxh64 beside it, where there is one.
        if (from_checkpoint) continue_data_of(tr, cfg->init_from);
        else if (!checkpoint_verify_weights_file(weights, tr->job, why, sizeof why))
            fail("init_from: '%s': %s", weights, why);
        if (!load_weights_pieces(weights, &tr->shard, tr->params, why, sizeof why))
            fail("init_from: '%s': %s", weights, why);
        note("initialized from '%s'", weights);
    } else {
        shard_param_init(&tr->shard, tr->params, (uint64_t)cfg->seed);  // one process: param_init's values
    }
    tr->state.data_world = tr->world;
    tr->state.data_id = data_identity_of(tr->train);
    metrics_event(tr->log, "start", 0, "");
    return false;
}

// The validation set's rows: the first val_tokens / seq_len sequences, all when val_tokens is 0
// or more than the set holds.
static int64_t validation_rows(const train_config *cfg, const dataloader *val) {
    int64_t rows = dataloader_batches_per_epoch(val);  // the val loader reads one sequence per batch
    if (cfg->val_tokens > 0) rows = min_i64(rows, max_i64(1, cfg->val_tokens / cfg->model.seq_len));
    return rows;
}

// The validation set, checked before training (else a bad one shows only at the first
// validation, possibly after the whole run and before its final checkpoint): its shards'
// vocabulary against vocab_size, and the checksums of the shards validation reads.
static dataloader *open_validation(const train_config *cfg) {
    if (!cfg->val_data[0]) return NULL;
    dataloader *val = dataloader_open(cfg->val_data, "val_data", 1, cfg->model.seq_len, false, 0, 0, 1);
    uint32_t vocab = dataloader_vocab_size(val);
    if ((int64_t)vocab > cfg->model.vocab_size)
        fail("val_data: the shards hold token ids up to %u, above vocab_size %lld (were they written by another "
             "tokenizer than the train shards?)",
             vocab - 1, (long long)cfg->model.vocab_size);
    // With document masking val_loss cuts the validation set's documents at the model's doc_token
    // (resolved from the train shards or set): val shards written with another one would be cut
    // in the wrong places, silently. Without it doc_token plays no part.
    uint32_t val_doc_token = dataloader_doc_token(val, cfg->model.doc_masking);
    uint32_t model_doc_token = cfg->model.doc_token >= 0 ? (uint32_t)cfg->model.doc_token : SHARD_NO_DOC_TOKEN;
    if (cfg->model.doc_masking && val_doc_token != model_doc_token) {
        char v[16], t[16];
        fail("val_data: the shards' doc_token is %s, the model's %s (the train shards' or doc_token's; were they "
             "written by another tokenizer or with other prepare options?)",
             doc_token_text(val_doc_token, v, sizeof v), doc_token_text(model_doc_token, t, sizeof t));
    }
    dataloader_verify_prefix(val, (uint64_t)(validation_rows(cfg, val) * cfg->model.seq_len + 1));
    return val;
}

// The loss on the first val_tokens / seq_len sequences of val_data (all when val_tokens is 0
// or more than the set holds), in micro-batches of up to batch_size rows: the same tokens
// whatever the batch size, so runs with different batch sizes or replica counts compare.
static double validate(trainer *tr) {
    const train_config *cfg = tr->cfg;
    int64_t B = cfg->batch_size, T = cfg->model.seq_len;
    int64_t rows = validation_rows(cfg, tr->val);
    dataloader_rewind(tr->val);
    double ce = 0.0;
    int64_t tokens = 0;
    // A job's ranks take turns: micro-batch i goes to rank i mod ranks, and every rank runs
    // as many forward passes (an empty one where its turn has no rows: the gathers need all).
    int ranks = tr->job ? comm_size(tr->job) : 1, me = tr->job ? comm_rank(tr->job) : 0;
    for (int64_t done = 0; done < rows;) {
        int64_t b = 0;
        for (int q = 0; q < ranks && done < rows; q++) {
            int64_t n = min_i64(B, rows - done);
            if (q == me) {
                for (int64_t r = 0; r < n; r++) dataloader_next(tr->val, tr->inputs + r * T, tr->targets + r * T);
                b = n;
            } else {  // another rank's rows: skipped unread (one sequence per val micro-batch)
                data_position at = dataloader_position(tr->val);
                at.index += n;
                dataloader_seek(tr->val, at);
            }
            done += n;
        }
        loss_sums s = backend_forward_loss(tr->be, tr->inputs, tr->targets, b, T);
        ce += s.ce_sum;
        tokens += s.rows;
    }
    if (tr->job) {
        ce = comm_sum(tr->job, ce);
        tokens = (int64_t)comm_sum(tr->job, (double)tokens);
    }
    double loss = ce / (double)tokens;
    metrics_val(tr->log, tr->state.step, loss, tokens);
    if (!tr->quiet) {
        printf("%sstep %6lld | val_loss %.4f (%lld tokens)\n", console_tag(), (long long)tr->state.step, loss,
               (long long)tokens);
        fflush(stdout);
    }
    return loss;
}

static bool save_checkpoint(trainer *tr) {
    model_buffers b = buffers_of(tr);
    double t0 = wall_seconds();
    backend_download(tr->be, tr->params, tr->exp_avg, tr->exp_avg_sq);
    check_copies_agree(tr);
    if (!checkpoint_save(tr->cfg->out_dir, &b, &tr->state, tr->cfg)) return false;
    if (!tr->job || comm_rank(tr->job) == 0) checkpoint_prune(tr->cfg->out_dir, tr->cfg->ckpt_keep, tr->state.step);
    char extra[64];
    snprintf(extra, sizeof extra, "\"seconds\":%.3f", wall_seconds() - t0);
    metrics_event(tr->log, "checkpoint", tr->state.step, extra);
    tr->ckpt_s = wall_seconds() - t0;
    note("checkpoint step_%08lld written in %.2f s", (long long)tr->state.step, tr->ckpt_s);
    return true;
}

// The walltime guard: the job's end (walltime_end, else SLURM_JOB_END_TIME; 0 = unknown).
static double walltime_end(const train_config *cfg) {
    if (cfg->walltime_end > 0) return cfg->walltime_end;
    const char *e = getenv("SLURM_JOB_END_TIME");
    if (!e || !*e) return 0.0;
    char *rest = NULL;
    double t = strtod(e, &rest);
    return rest != e && t > 0 ? t : 0.0;
}

// Whether the run must checkpoint and stop now to be done before the walltime: the time left
// is less than (the slowest step + the last checkpoint's time, or an estimate at 100 MB/s
// before the first) × walltime_safety + stop_before_s. *left_s gets the time left.
static bool walltime_near(const trainer *tr, double end, double *left_s) {
    if (end <= 0) return false;
    const train_config *cfg = tr->cfg;
    double ckpt_s = tr->ckpt_s > 0 ? tr->ckpt_s : (double)tr->table.numel * 12.0 / 100e6;  // weights + 2 moments
    double need_s = (tr->slowest_step_s + tr->slowest_extra_s + ckpt_s) * cfg->walltime_safety + cfg->stop_before_s;
    *left_s = end - (double)time(NULL);
    return *left_s < need_s;
}

static bool due(int64_t step, int64_t every, int64_t last) { return step == last || (every > 0 && step % every == 0); }

// Whether the bad steps that now roll back were all spikes within the shift ratios (llmc/guard.h).
static bool shift_streak(const trainer *tr) { return tr->state.norm_spikes >= tr->state.bad_steps; }

// The newest step a rollback at step s + 1 may go back to. Its bad_steps skipped steps in a
// row are steps s + 2 − bad_steps … s + 1; the first of them ran on the weights after step
// s + 1 − bad_steps, so those weights (and a checkpoint of that step, or of one in the
// streak, which holds the same weights: a skipped step changes nothing) are the suspects —
// weights that came apart give a bad step on any data. The weights after step s − bad_steps
// gave step s + 1 − bad_steps, which the guard applied: the newest known to be sound. So the
// bound is s − bad_steps, not s + 1 − bad_steps, even though the latter's weights came from an
// accepted update: that update is what may have broken them. (Before 2026-12 there was no
// bound: a checkpoint written in the streak, the weights that caused it, was taken.)
static int64_t rollback_bound(const trainer *tr, int64_t s) { return s - tr->state.bad_steps; }

// A warning about what every rank of a job decided alike (from all-reduced values: a skipped
// step, a rollback, a shift of the loss): said once, by rank 0 (a job of 64 ranks printed each 64
// times). Each DiLoCo replica decides on its own data and says its own: rank 0 of its job.
static void PRINTF_LIKE(2, 3) job_warn(const trainer *tr, const char *fmt, ...) {
    if (tr->job && comm_rank(tr->job) != 0) return;   // (tr->rank counts the replicas too)
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    warn("%s", line);
}

// Rollback: back to the newest valid checkpoint in out_dir from before the bad steps
// (rollback_bound) with its weights, moments, counters and spike window, but with the data
// where it is now, so the batches taken since that checkpoint (among them the ones that led
// to the trouble) are skipped. The checkpoints of later steps are moved aside
// (checkpoint_set_aside_after: those past the bound before the load), the others only read.
// false: no rollback left, or no checkpoint from before the bad steps. (A DiLoCo replica:
// restart_replica.)
static bool roll_back(trainer *tr, int64_t s) {
    const train_config *cfg = tr->cfg;
    int64_t bound = rollback_bound(tr, s);
    if (tr->state.rollbacks >= cfg->max_rollbacks || checkpoint_count_upto(cfg->out_dir, bound, tr->job) == 0)
        return false;
    data_position here = dataloader_position(tr->train);
    int64_t rollbacks = tr->state.rollbacks + 1;
    model_buffers b = buffers_of(tr);
    train_state st;
    memset(&st, 0, sizeof st);
    // The checkpoints of the bad steps go aside before anything is loaded, so that a crash from
    // here on resumes from before the streak, not from its weights (with rollbacks 0: it did).
    checkpoint_set_aside_after(cfg->out_dir, bound, tr->job);
    // ckpt_every's grid first: the straight run's target even after a stop wrote one off it.
    char *dir = checkpoint_load_latest_every(cfg->out_dir, cfg->ckpt_every, bound, &b, &st);  // fatal if none verifies
    if (!dir) return false;
    if (fault_requested("kill_in_rollback", st.step)) raise(SIGKILL);
    // The checkpoint's position in this run's micro-batches (it may have been written at
    // another world size, batch or seq_len: the skipped count mixed the two splits' units).
    st.data.index = index_here(tr, &st, NULL);
    int64_t per_epoch = dataloader_batches_per_epoch(tr->train);
    int64_t skipped = (here.epoch - st.data.epoch) * per_epoch + (here.index - st.data.index);
    strbuf extra = {};
    sb_printf(&extra, "\"to_step\":%lld,\"checkpoint\":", (long long)st.step);
    sb_json_string(&extra, dir);
    // The positions and skipped_batches count each process's micro-batches (as state.json's
    // data_index); skipped_rows is the job's: every process skipped as many.
    int64_t rows = skipped * tr->world * cfg->batch_size;
    sb_printf(&extra,
              ",\"skipped_from\":[%lld,%lld],\"skipped_to\":[%lld,%lld],\"skipped_batches\":%lld,"
              "\"rollbacks\":%lld,\"skipped_rows\":%lld",
              (long long)st.data.epoch, (long long)st.data.index, (long long)here.epoch, (long long)here.index,
              (long long)skipped, (long long)rollbacks, (long long)rows);
    metrics_event(tr->log, "rollback", s + 1, extra.data);
    sb_free(&extra);
    char each[96] = "";
    if (tr->world > 1) snprintf(each, sizeof each, " by each of the %d processes", tr->world);
    job_warn(tr, "step %lld: %lld bad steps in a row; rolled back to '%s' (step %lld), skipping the %lld micro-batches "
             "taken%s since it (epoch %lld batch %lld up to epoch %lld batch %lld; %lld rows of %lld tokens in all); "
             "rollback %lld of max_rollbacks %lld",
             (long long)s + 1, (long long)tr->state.bad_steps, dir, (long long)st.step, (long long)skipped, each,
             (long long)st.data.epoch, (long long)st.data.index, (long long)here.epoch, (long long)here.index,
             (long long)rows, (long long)cfg->model.seq_len, (long long)rollbacks, (long long)cfg->max_rollbacks);
    free(dir);
    checkpoint_set_aside_after(cfg->out_dir, st.step, tr->job);   // those up to the bound the load passed over
    st.data = here;
    st.data_world = tr->world;
    st.data_id = data_identity_of(tr->train);
    st.rollbacks = rollbacks;
    st.bad_steps = 0;
    // A streak of spikes all within the shift ratios: if the steps after the rollback are such
    // spikes again, the first is a lasting shift of the loss (llmc/guard.h).
    st.norm_spikes = shift_streak(tr) ? cfg->max_bad_steps : 0;
    st.loss_spikes = 0;
    tr->state = st;
    backend_upload(tr->be, tr->params, tr->exp_avg, tr->exp_avg_sq, st.adam_step);
    return true;
}

// A DiLoCo replica's rollback: its weights start over from θ, the point the group agreed on
// last (diloco_restart_from_theta), not from a checkpoint — its step, data and outer state go on
// with the group's, so it stays a member, nothing goes over the network, and the micro-batches
// of the bad steps stay behind it. AdamW's moments stay (the skipped steps did not change them).
// The other copies of an HSDP replica take the first copy's weights. false: no rollback left.
static bool restart_replica(trainer *tr, int64_t s) {
    const train_config *cfg = tr->cfg;
    if (tr->state.rollbacks >= cfg->max_rollbacks) return false;
    int64_t rollbacks = tr->state.rollbacks + 1, discarded = 0;
    data_position before = tr->state.data;
    if (tr->outer) discarded = diloco_restart_from_theta(tr->outer, tr->params, &tr->state, s + 1);
    tr->state.rollbacks = rollbacks;
    tr->state.bad_steps = 0;
    tr->state.norm_spikes = shift_streak(tr) ? cfg->max_bad_steps : 0;   // as roll_back's
    tr->state.loss_spikes = 0;
    follow_first_copy(tr, true, true, before);
    backend_upload_params(tr->be, tr->params);
    char extra[200];
    snprintf(extra, sizeof extra, "\"to\":\"outer_theta\",\"outer_step\":%lld,\"discarded_steps\":%lld,\"rollbacks\":%lld",
             (long long)tr->state.outer_step, (long long)discarded, (long long)rollbacks);
    metrics_event(tr->log, "rollback", s + 1, extra);
    job_warn(tr, "step %lld: %lld bad steps in a row; this DiLoCo replica's weights start over from the group's θ "
             "of outer step %lld (the work of its last %lld inner step(s) dropped; its next contribution counts the "
             "steps from here); rollback %lld of max_rollbacks %lld",
             (long long)s + 1, (long long)cfg->max_bad_steps, (long long)tr->state.outer_step, (long long)discarded,
             (long long)rollbacks, (long long)cfg->max_rollbacks);
    return true;
}

// What the failed rollback at step s + 1 lacked, for the error line: "" (max_rollbacks ran out),
// or no checkpoint at all, or none from before the bad steps (rollback_bound).
static const char *no_rollback_target(const trainer *tr, int64_t s) {
    const char *out_dir = tr->cfg->out_dir;
    if (outer_on(tr) || checkpoint_count_upto(out_dir, rollback_bound(tr, s), tr->job) > 0) return "";
    return checkpoint_count(out_dir, tr->job) > 0 ? "; no checkpoint from before the bad steps" : "; no checkpoint";
}

// A spike guard event in metrics.jsonl: the step's loss and gradient norm and the limits.
static void spike_event(trainer *tr, const char *event, const step_metrics *m, const step_limits *limits, int64_t s) {
    char extra[256];
    snprintf(extra, sizeof extra, "\"loss\":%.9g,\"grad_norm\":%.9g,\"max_loss\":%.9g,\"max_grad_norm\":%.9g",
             m->loss, m->grad_norm, limits->max_loss, limits->max_grad_norm);
    metrics_event(tr->log, event, s + 1, extra);
}

// The outlier guard's bookkeeping: count skipped steps (NaN/Inf or spikes) in a row; at
// max_bad_steps roll back (above) or stop the run. Returns whether it rolled back to a
// checkpoint (a DiLoCo replica's rollback keeps its step: the step goes on as a skipped one).
static bool count_bad_step(trainer *tr, const step_metrics *m, const step_limits *limits, bool spike, int64_t s) {
    const train_config *cfg = tr->cfg;
    tr->state.bad_steps++;
    if (spike) {
        spike_event(tr, "spike", m, limits, s);
        job_warn(tr, "step %lld: loss %.4f (limit %.4f), gradient norm %.4g (limit %.4g): a spike, update skipped "
                 "(%lld in a row, max_bad_steps %lld)",
                 (long long)s + 1, m->loss, limits->max_loss, m->grad_norm, limits->max_grad_norm,
                 (long long)tr->state.bad_steps, (long long)cfg->max_bad_steps);
    } else {
        job_warn(tr, "step %lld: loss %g, gradient norm %g: update skipped (%lld in a row, max_bad_steps %lld)",
                 (long long)s + 1, m->loss, m->grad_norm, (long long)tr->state.bad_steps,
                 (long long)cfg->max_bad_steps);
    }
    if (tr->state.bad_steps < cfg->max_bad_steps) return false;
    // Simulated replicas (diloco_transport = local) stop: they write no checkpoints, and one
    // rolled back to a checkpoint of out_dir (a run started from one) wound back its step, data
    // and outer step but not the simulator's θ and momentum, renumbering the outer steps.
    bool simulated = cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "local") == 0;
    if (simulated)
        fail("stopping: %lld steps in a row were skipped as NaN/Inf or spikes (last at step %lld); simulated DiLoCo "
             "replicas (diloco_transport = local) do not roll back (a real replica, tcp or mpi, starts over from θ)",
             (long long)tr->state.bad_steps, (long long)s + 1);
    if (outer_on(tr) ? restart_replica(tr, s) : roll_back(tr, s)) return !outer_on(tr);
    fail("stopping: %lld steps in a row were skipped as NaN/Inf or spikes (last at step %lld) and no rollback is "
         "left (%lld of max_rollbacks %lld done%s); the checkpoints in '%s' hold only finite weights (a lasting shift "
         "above the spike guard's limits: raise spike_z, or 0 turns the guard off)",
         (long long)tr->state.bad_steps, (long long)s + 1, (long long)tr->state.rollbacks, (long long)cfg->max_rollbacks,
         no_rollback_target(tr, s),
         cfg->out_dir);
}

// The step after max_bad_steps − 1 skips as spikes within the shift ratios was applied with its
// loss or norm still above the window's limit: the norm has moved (a model leaving a plateau)
// or the loss has (harder data for good), the window describes a regime that is over, and it
// starts over from this step (the guard acts again once it is full). Logged as a
// `spike_shift` event and a warning.
static void accept_shift(trainer *tr, const step_metrics *m, const step_limits *limits, int64_t s) {
    spike_event(tr, "spike_shift", m, limits, s);
    job_warn(tr, "step %lld: loss %.4f (limit %.4f), gradient norm %.4g (limit %.4g), above a limit for the %lld "
             "steps before it too and within %.0fx (loss) and %.0fx (norm) of them: a lasting shift, not a spike; step "
             "applied, the spike guard's window starts over",
             (long long)s + 1, m->loss, limits->max_loss, m->grad_norm, limits->max_grad_norm,
             (long long)tr->state.norm_spikes, SPIKE_SHIFT_MAX_LOSS_RATIO, SPIKE_SHIFT_MAX_RATIO);
    tr->state.spikes.count = 0;
}

// One optimizer step: grad_accum micro-batches of data through the backend's forward and
// backward, then its step (norm, guards, clip, AdamW); returns the step's metrics. extra: one of
// DiLoCo's extra inner steps (diloco_sync_every_s): at the learning rate of the step before,
// without advancing the step count (the data, the tokens and AdamW's count advance) and without
// the test faults keyed by step.
static step_metrics train_step(trainer *tr, bool extra) {
    const train_config *cfg = tr->cfg;
    int64_t B = cfg->batch_size, T = cfg->model.seq_len, s = tr->state.step - (extra ? 1 : 0);
    int64_t step_tokens = B * T * cfg->grad_accum;
    double t0 = wall_seconds();
    // The gradients of a job's ranks are summed (FSDP, HSDP): each scales by all their tokens.
    float grad_scale = 1.0f / (float)(step_tokens * (tr->job ? comm_size(tr->job) : 1));
    if (fault_from("grad_shift", s)) grad_scale *= 10.0f;
    data_position at = dataloader_position(tr->train);
    int64_t first_batch = at.epoch * dataloader_batches_per_epoch(tr->train) + at.index;
    for (int64_t a = 0; a < cfg->grad_accum; a++) {
        dataloader_next(tr->train, tr->inputs, tr->targets);
        backend_forward_backward(tr->be, tr->inputs, tr->targets, B, T, grad_scale, (float)cfg->z_loss);
    }
    if (!extra) {
        if (fault_requested("nan_grad", s)) backend_poison_grad(tr->be, NAN);
        for (int64_t a = 0; a < cfg->grad_accum; a++)
            if (fault_requested("nan_batch", first_batch + a)) backend_poison_grad(tr->be, NAN);
        if (fault_requested("grad_spike", s)) backend_poison_grad(tr->be, 1e4f);
        while (fault_requested("hang_in_step", s)) sleep(1);
        if (fault_requested("stop_in_step", s)) raise(SIGSTOP);   // resumed by SIGCONT (a test's)
    } else {
        static bool stopped_once;   // the first extra step of that phase only
        if (!stopped_once && fault_requested("stop_in_extra_step", s)) {
            stopped_once = true;
            raise(SIGSTOP);
        }
    }
    step_metrics m = {};
    m.lr = lr_at_step(cfg, s);
    step_limits limits = spike_limits(&tr->state.spikes, cfg->spike_z, s, cfg->warmup_steps);
    // A lasting shift (llmc/guard.h): after max_bad_steps − 1 skips as spikes within the shift
    // ratios, all for the norm alone (the loss within its limit), the norm may go up to its ratio
    // times its limit (with max_bad_steps = 1 at once: it once never could, and each shifted step
    // rolled back); after a rollback that a streak of such spikes of either kind caused
    // (norm_spikes carried as max_bad_steps), the loss to its own too. Until 2026-12 spikes of
    // the loss opened the norm's allowance as well.
    bool after_rollback = tr->state.norm_spikes >= cfg->max_bad_steps;
    bool shift = after_rollback || (tr->state.norm_spikes >= cfg->max_bad_steps - 1 && tr->state.loss_spikes == 0);
    step_limits window_limits = limits;
    if (shift) limits = spike_shift_limits(&window_limits, after_rollback);
    step_result r = backend_step(tr->be, m.lr, step_tokens, cfg, &limits);
    m.loss = r.loss;
    m.z_loss = r.z_loss;
    m.grad_norm = r.grad_norm;
    m.skipped = r.skipped;
    tr->state.adam_step = r.adam_step;
    if (m.skipped) {
        bool shifted = r.spike && spike_shift_like(&window_limits, r.loss, r.grad_norm);
        tr->state.norm_spikes = shifted ? tr->state.norm_spikes + 1 : 0;
        tr->state.loss_spikes = shifted ? tr->state.loss_spikes + (r.loss > window_limits.max_loss) : 0;
        if (count_bad_step(tr, &m, &limits, r.spike, s)) {
            m.rolled_back = true;  // the state is the checkpoint's now: no step to count
            m.step = s + 1;
            m.step_ms = (wall_seconds() - t0) * 1e3;
            m.tokens = tr->state.tokens_seen;
            m.tok_per_s = m.mfu = NAN;   // null, as on every line without a figure (0 reads as a measured one)
            return m;
        }
    } else {
        if (shift && spike_exceeds(&window_limits, r.loss, r.grad_norm)) accept_shift(tr, &m, &window_limits, s);
        tr->state.bad_steps = 0;
        tr->state.norm_spikes = 0;
        tr->state.loss_spikes = 0;
        spike_push(&tr->state.spikes, cfg->spike_window, r.loss, r.grad_norm);
    }

    // Test hook (bench/diloco/speeds.sh): a cluster at half speed takes twice each step's time.
    if (fault_requested("half_speed", 0)) {
        double busy = wall_seconds() - t0;
        struct timespec ts = {(time_t)busy, (long)((busy - (double)(time_t)busy) * 1e9)};
        nanosleep(&ts, NULL);
    }
    // tok/s and MFU are per process (per device); tokens_seen counts every process's tokens.
    if (!extra) tr->state.step++;
    tr->state.tokens_seen += step_tokens * tr->world;
    tr->state.data = dataloader_position(tr->train);
    double dt = wall_seconds() - t0;
    m.step = tr->state.step;
    m.step_ms = dt * 1e3;
    m.tok_per_s = (double)step_tokens / dt;
    m.mfu = tr->peak_tflops > 0 ? tr->flops_per_token * m.tok_per_s / (tr->peak_tflops * 1e12) : NAN;
    m.tokens = tr->state.tokens_seen;
    return m;
}

static void print_progress(const trainer *tr, const step_metrics *m, double mean_step_s) {
    char eta[32], mfu[32] = "", rate[32] = "-";   // a rolled-back step has no throughput (NaN)
    format_duration(mean_step_s * (double)(tr->cfg->max_steps - m->step), eta, sizeof eta);
    if (isfinite(m->mfu)) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * m->mfu);
    if (isfinite(m->tok_per_s)) snprintf(rate, sizeof rate, "%.0f", m->tok_per_s);
    printf("%sstep %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %s tok/s%s | %.0f ms | ETA %s%s\n", console_tag(),
           (long long)m->step, (long long)tr->cfg->max_steps, m->loss, m->lr, m->grad_norm, rate, mfu, m->step_ms, eta,
           m->rolled_back ? " | SKIPPED, ROLLED BACK" : m->skipped ? " | SKIPPED" : "");
    fflush(stdout);
}

// A job the launcher started with several ranks, without DiLoCo, is one model sharded over
// them: fsdp_size ranks per copy (default: the ranks of a node), dp_replicate copies. With
// DiLoCo and fsdp_size > 1 or dp_replicate > 1 the job is one DiLoCo replica of all its ranks
// (FSDP, HSDP: docs/fsdp.md#diloco-over-sharded-replicas); with DiLoCo and neither, every rank
// is a replica of its own, as before.
// Whether a launch's ranks are one job (one model sharded over them; with DiLoCo, one sharded
// replica) rather than DiLoCo replicas of their own.
static bool ranks_are_one_job(const train_config *cfg) {
    return cfg->diloco_replicas == 0 || cfg->fsdp_size > 1 || cfg->dp_replicate > 1;
}

static void setup_job(trainer *tr) {
    train_config *cfg = tr->cfg;
    launch_info l = launch_detect();
    bool sharded_replica = cfg->diloco_replicas > 0 && ranks_are_one_job(cfg);
    // Also the deadline of the start's collectives of DiLoCo over mpi (its replicas are no job).
    comm_set_timeout(cfg->comm_timeout_s);
    if (l.size <= 1 || !ranks_are_one_job(cfg)) {
        if (cfg->fsdp_size > 1 || cfg->dp_replicate > 1)
            fail("fsdp_size %lld / dp_replicate %lld: this process is the job's only rank; start the ranks with srun "
                 "or mpirun",
                 (long long)cfg->fsdp_size, (long long)cfg->dp_replicate);
        return;
    }
    if (sharded_replica) {  // one job of fsdp_size × dp_replicate ranks per replica (dp_replicate 0: all)
        if (cfg->dp_replicate <= 0 && (cfg->fsdp_size > l.size || l.size % cfg->fsdp_size != 0))
            fail("fsdp_size %lld: a DiLoCo replica is one job of fsdp_size × dp_replicate ranks, but this job has %d, "
                 "which fsdp_size does not divide; start one job of fsdp_size (× dp_replicate) ranks per replica",
                 (long long)cfg->fsdp_size, l.size);
        int64_t shards = cfg->fsdp_size > 0 ? cfg->fsdp_size : l.size / cfg->dp_replicate;
        int64_t copies = cfg->dp_replicate > 0 ? cfg->dp_replicate : l.size / shards;
        if (shards < 1 || shards * copies != l.size)
            fail("fsdp_size %lld × dp_replicate %lld: a DiLoCo replica is one job of fsdp_size × dp_replicate ranks "
                 "(HSDP), but this job has %d; start one such job per replica",
                 (long long)cfg->fsdp_size, (long long)cfg->dp_replicate, l.size);
        if (strcmp(cfg->diloco_transport, "tcp") != 0)
            fail("diloco_transport %s: a DiLoCo replica of %d ranks exchanges over tcp (each rank of its first copy "
                 "its own connection to the hub); use diloco_transport = tcp and `train_gpt relay --shards %lld`",
                 cfg->diloco_transport, l.size, (long long)shards);
        if (cfg->diloco_replica_id < 0)
            fail("diloco_replica_id: a DiLoCo replica of %d ranks must name its replica (0 .. %lld), the same on "
                 "every rank",
                 l.size, (long long)cfg->diloco_replicas - 1);
    }
    tr->job = comm_world();
    int rank = comm_rank(tr->job), size = comm_size(tr->job);
    int64_t fsdp = cfg->fsdp_size > 0 ? cfg->fsdp_size : cfg->dp_replicate > 0 ? size / cfg->dp_replicate
                                                                                  : l.local_size;
    if (fsdp < 1 || size % fsdp != 0)
        fail("fsdp_size: %lld does not divide the job's %d ranks", (long long)fsdp, size);
    int64_t copies = cfg->dp_replicate > 0 ? cfg->dp_replicate : size / fsdp;
    if (fsdp * copies != size)
        fail("fsdp_size %lld × dp_replicate %lld = %lld, but the job has %d ranks", (long long)fsdp,
             (long long)copies, (long long)(fsdp * copies), size);
    tr->group = comm_split(tr->job, (int)(rank / fsdp), rank);
    tr->copies = comm_split(tr->job, (int)(rank % fsdp), rank);
    cfg->fsdp_size = fsdp;
    cfg->dp_replicate = copies;
    log_set_rank(rank, rank == 0);
    // One backend for the job's ranks: a rank without a usable GPU (device = auto on a node or
    // task given none, a driver too old) trained on the CPU while the others waited for it in
    // NCCL's start, and after comm_timeout_s every rank blamed a dead rank (status 75: requeued,
    // the same again).
    double cannot = tr->device_error[0] ? 1.0 : 0.0;
    if (comm_max(tr->job, cannot) > 0) {
        if (cannot > 0) fail("device: %s", tr->device_error);
        fail("device: another rank of the job cannot use its device (its own line says why)");
    }
    double on_gpu = tr->device == DEVICE_CUDA ? 1.0 : 0.0;
    double any_gpu = comm_max(tr->job, on_gpu), all_gpu = -comm_max(tr->job, -on_gpu);
    if (any_gpu != all_gpu) {
        if (on_gpu == 0.0 && strcmp(cfg->device, "cpu") == 0)
            fail("device = cpu on this rank, but other ranks of the job train on a GPU; every rank trains on one "
                 "backend: give them all the same device");
        if (on_gpu == 0.0)
            fail("device = %s: this rank has no usable GPU (the line above says why) and would train on the CPU, "
                 "but other ranks of the job have one; every rank trains on one backend: give each rank a GPU (srun "
                 "--gpus-per-task=1, or --gpus-per-node = tasks per node) or set device = cpu",
                 cfg->device);
        fail("device = %s: this rank trains on its GPU, but another rank of the job has none (its own line says "
             "why); every rank trains on one backend",
             cfg->device);
    }
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) fail("cannot silence rank %d's stdout", rank);
    note("job: %d ranks (%s), FSDP over %lld, %lld cop%s (HSDP)%s", size, l.launcher, (long long)fsdp,
         (long long)copies, copies == 1 ? "y" : "ies", sharded_replica ? ": one DiLoCo replica" : "");
}

static void leave_job(trainer *tr) {
    comm_free(tr->group);
    comm_free(tr->copies);
    tr->group = tr->copies = NULL;
}

// The data split (dataloader.h): with DiLoCo each replica reads its own 1/M of the rows
// (every M-th, whatever its batch size); a job's ranks each read their own 1/ranks of their
// replica's micro-batches, so that a step of the replica reads the rows an unsharded replica
// with grad_accum N reads. rank/world number the M·N processes (r·M + i) for the data position's
// bookkeeping (data_world).
static void choose_data_split(trainer *tr) {
    train_config *cfg = tr->cfg;
    tr->split = (data_split){0, 1, 0, 1};
    if (tr->job) {
        tr->split.rank = comm_rank(tr->job);
        tr->split.ranks = comm_size(tr->job);
    } else if (cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "local") != 0 && cfg->diloco_replica_id < 0) {
        cfg->diloco_replica_id = transport_mpi_world_rank();
        // Said here, before the loader takes it as this process's share of the rows (an
        // internal error came first, and the transport's line on the world's size after it).
        if (cfg->diloco_replica_id >= cfg->diloco_replicas)
            fail("diloco_replicas: %lld, but this process is MPI rank %lld: the world has more ranks than replicas; "
                 "with diloco_transport = mpi every rank is one replica (start with mpirun -np %lld or srun -n %lld)",
                 (long long)cfg->diloco_replicas, (long long)cfg->diloco_replica_id, (long long)cfg->diloco_replicas,
                 (long long)cfg->diloco_replicas);
    }
    if (cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "local") != 0) {
        tr->split.replica = (int)cfg->diloco_replica_id;
        tr->split.replicas = (int)cfg->diloco_replicas;
    }
    tr->rank = tr->split.rank * tr->split.replicas + tr->split.replica;
    tr->world = tr->split.ranks * tr->split.replicas;
}

// Checkpoint, then say where the run stands.
// must_succeed: at a stop or the last step. requeue: the stop asks to be requeued (SIGUSR1, the
// walltime): its checkpoint failing (a file system's hiccup) then exits with the status of a
// temporary failure, which the job scripts requeue and count (MAX_FAILURES), from the checkpoint
// before — status 1 once ended the chain for good.
static void checkpoint_now(trainer *tr, bool must_succeed, bool requeue) {
    if (save_checkpoint(tr) || !must_succeed) return;
    if (requeue)
        fail_with_status(WATCHDOG_EXIT_STATUS,
                         "the checkpoint at step %lld could not be written (see above) at a stop before the walltime; "
                         "the previous checkpoint stands, and status %d asks the job script to requeue (a counted "
                         "failure)",
                         (long long)tr->state.step, WATCHDOG_EXIT_STATUS);
    fail("the checkpoint at step %lld could not be written (see above); the run stops with an error so that "
         "the job is not counted as finished",
         (long long)tr->state.step);
}

// TRAIN_GPT_NO_FINAL_CHECKPOINT=1, for benchmarks that throw the run away (at ~1B the last
// checkpoint is ~9 s of a one-minute benchmark run): no checkpoint when the run reaches
// max_steps, unless ckpt_every schedules one there anyway. Checkpoints at stop_at_step, on
// signals and before the walltime are written as always. Ignored by DiLoCo replicas (their
// last checkpoint holds the landing of the last outer step). A job's ranks agree: all skip or
// none does.
static bool skip_final_checkpoint(const trainer *tr) {
    const char *v = getenv("TRAIN_GPT_NO_FINAL_CHECKPOINT");
    bool skip = v && strcmp(v, "1") == 0 && !tr->outer;
    if (tr->job) skip = comm_max(tr->job, skip ? 0.0 : 1.0) == 0.0;
    return skip;
}

// Which process of a launch says each line, from the first (the device's and the threads'
// lines came from every rank, untagged, before setup_job): a job's ranks as setup_job says
// (notes from rank 0 alone), several DiLoCo replicas over MPI by their replica id (their step
// lines on stdout too: they were interleaved, none saying whose).
static void tag_process_lines(const train_config *cfg) {
    launch_info l = launch_detect();
    if (l.size <= 1) return;
    if (ranks_are_one_job(cfg)) log_set_rank(l.rank, l.rank == 0);
    else if (strcmp(cfg->diloco_transport, "mpi") == 0)
        log_set_replica(l.rank);   // its replica id (another is refused: transport_mpi)
}

// Runs the whole training; returns the process exit code (0 = finished or stopped cleanly
// with a checkpoint). User errors are fatal inside (one line, exit 1).
static int train_run(train_config *cfg) {
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.cfg = cfg;
    // First: a signal during the start (the data's checks, the plan, the allocation: seconds at
    // 14B) then ends the run at its first step with the status its kind asks for, not by the
    // signal's default action (status 143 for a SIGTERM, which the job scripts requeue as a
    // failure).
    install_signal_handlers();
    tag_process_lines(cfg);
    config_check_files(cfg);
    if (cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "tcp") == 0) transport_tcp_check_built();
    if (cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "mpi") == 0) transport_mpi_check_built();
    diloco_check_config(cfg);
    tr.device = select_device(&tr);
    tr.threads = setup_threads(cfg);
    setup_job(&tr);
    choose_data_split(&tr);
    config_check_tokens(cfg, tr.world);
    if (cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "mpi") == 0) {
        int id = cfg->diloco_replica_id >= 0 ? (int)cfg->diloco_replica_id : transport_mpi_world_rank();
        char *own = transport_mpi_replica_out_dir(cfg->out_dir, id);
        if (own) {
            free(cfg->out_dir);
            cfg->out_dir = own;
        }
    }
    // Ranks of one launch that are DiLoCo replicas of their own over tcp (fsdp_size and
    // dp_replicate 0 or 1) get one command line from srun: one out_dir for all (the lock below
    // stops the second rank, which named only "another run"), and a diloco_replica_id given the
    // same for all. Said on every rank: an MPMD launch may give each its own.
    int launched = launch_detect().size;
    if (cfg->diloco_replicas > 0 && !tr.job && strcmp(cfg->diloco_transport, "tcp") == 0 && launched > 1)
        warn("the launcher says this launch has %d ranks, and fsdp_size and dp_replicate are 0 or 1: each rank is a "
             "DiLoCo replica of its own (this one replica %lld, out_dir '%s'); ranks given one command line (srun) "
             "collide on the out_dir and on a diloco_replica_id given: start one job per replica, give each rank "
             "its own out_dir and id, or make the ranks one sharded replica (fsdp_size %d)",
             launched, (long long)cfg->diloco_replica_id, cfg->out_dir, launched);
    checkpoint_lock_out_dir(cfg->out_dir, tr.job);  // before anything writes there: metrics, the hub's join
    tr.train = dataloader_open_split(cfg->train_data, "train_data", cfg->batch_size, cfg->model.seq_len, cfg->shuffle,
                                     (uint64_t)cfg->seed, tr.split);
    agree_on_data(&tr);
    resolve_doc_token(cfg, tr.train);
    // Every replica validates on the whole validation set, so their val_loss compare.
    tr.val = open_validation(cfg);
    // A job's rank 0 keeps the log; the others log nothing (a NULL log).
    if (!tr.job || comm_rank(tr.job) == 0) tr.log = metrics_open(cfg->out_dir, cfg->tensorboard);
    resolve_recompute(&tr, 1);
    allocate(&tr);
    if (fault_requested("stop_in_start", 0)) raise(SIGSTOP);   // resumed by SIGCONT (a test's)
    tr.copies_follow = cfg->diloco_replicas > 0 && tr.copies && comm_size(tr.copies) > 1;
    // The signal handlers are in place (the top): a signal while the hub is retried
    // (diloco_connect_timeout_s) stops the replica at its join (status 0, or 76 for SIGUSR1).
    if (tr.job && cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "tcp") == 0) {
        job_stop = comm_flag_open(tr.job);
        comm_set_stop_poll(poll_job_stop);
    }
    if (!tr.copies_follow || comm_rank(tr.copies) == 0) {
        data_identity data = data_identity_of(tr.train);
        tr.outer = diloco_open(cfg, &tr.shard, &data, tr.group, tr.log, &stop_signal);
    }
    first_copy_says(&tr, true);  // the other copies wait for the first's connection, without comm_timeout_s
    if (cfg->sample_every > 0) tr.samples = sampler_create(cfg, &tr.table);
    if (tr.samples && tr.job) sampler_set_job(tr.samples, tr.job);
    bool resumed = restore_or_init(&tr);
    print_banner(&tr);
    // tr.over: the hub says the run was finished by the others: this replica stops without
    // training (at its join) or after its step (at a rejoin).
    if (outer_on(&tr)) {
        data_position before = tr.state.data;
        if (tr.outer) diloco_join(tr.outer, tr.params, &tr.state, tr.train, !resumed);
        follow_first_copy(&tr, true, true, before);
    }
    // joined_at_end: the join took the group's state at max_steps (it came during or after the
    // group's final syncs), so this replica trains no step. It takes part in the final syncs
    // still to come here (with none left this does nothing), and writes its checkpoint at
    // max_steps after the loop, which it does not enter (docs/diloco.md#membership-and-faults-tcp).
    bool joined_at_end = outer_on(&tr) && first_copy_says(&tr, tr.outer && diloco_joined_at_end(tr.outer));
    if (joined_at_end) {
        data_position before = tr.state.data;
        bool changed = false;
        if (tr.outer) changed = diloco_after_step(tr.outer, &tr.params, 1, &tr.state, tr.train, cfg->max_steps, NULL);
        follow_first_copy(&tr, changed, true, before);   // all of them: the backend holds none yet
    }
    backend_upload(tr.be, tr.params, tr.exp_avg, tr.exp_avg_sq, tr.state.adam_step);
    watchdog_start(cfg->watchdog_s, tr.job ? comm_rank(tr.job) : tr.rank);

    double step_time_sum = 0.0;
    int64_t timed_steps = 0;
    int64_t first_step = tr.state.step;
    // Whether this process trained a step: after a rollback the step can be first_step again,
    // and the lines below said "nothing to do" for a run that had trained and stopped.
    bool trained = false;
    int exit_status = 0;
    double job_end = walltime_end(cfg);
    bool no_final_checkpoint = skip_final_checkpoint(&tr);
    if (no_final_checkpoint)
        note("TRAIN_GPT_NO_FINAL_CHECKPOINT=1: no checkpoint at max_steps = %lld (a benchmark run)",
             (long long)cfg->max_steps);
    if (job_end > 0)
        note("the job ends at %.0f (%s): checkpoint and stop before it (walltime_safety %g, stop_before_s %g)", job_end,
             cfg->walltime_end > 0 ? "walltime_end" : "SLURM_JOB_END_TIME", cfg->walltime_safety, cfg->stop_before_s);
    // An end already past, or nearer than stop_before_s: every job would train one step and
    // ask to be requeued (status 76), a chain that never finishes.
    if (job_end > 0 && job_end - (double)time(NULL) < cfg->stop_before_s && tr.state.step < cfg->max_steps)
        fail("%s: the job ends in %.0f s, less than stop_before_s (%g s): no step can be trained before it (%s)",
             cfg->walltime_end > 0 ? "walltime_end" : "SLURM_JOB_END_TIME", job_end - (double)time(NULL),
             cfg->stop_before_s,
             cfg->walltime_end > 0 ? "a walltime_end in the past? it is a unix time, and every requeued job inherits it"
                                   : "stop_before_s longer than the job's time limit?");
    while (!tr.over && !tr.join_stopped && tr.state.step < cfg->max_steps) {
        watchdog_phase("a training step", tr.state.step + 1);
        step_metrics m = train_step(&tr, false);
        trained = true;
        if (m.rolled_back) {  // back at a checkpoint's step: nothing else is due for this step
            metrics_step(tr.log, &m);
            print_progress(&tr, &m, m.step_ms / 1e3);
            continue;
        }
        // DiLoCo's outer work comes first, so that validation, samples and checkpoints at an
        // outer boundary see its weights. A replica that had to rejoin may jump to the group's
        // step here.
        if (outer_on(&tr)) {
            m.has_stall = true;
            // diloco_sync_every_s: a replica done with its phase's steps early trains on until
            // the phase's time is up (steps that count toward its contribution, not the step count).
            // A signal or the walltime guard ends them (T may be as long as SLURM's warning before
            // the job's end: until 2026-12 a SIGUSR1 waited for the phase's end, and the guard,
            // checked after it, stopped the run past the walltime).
            double extra_t0 = wall_seconds(), left_s = 0.0;
            while (cfg->diloco_sync_every_s > 0 &&
                   first_copy_says(&tr, tr.outer && diloco_wants_extra_step(tr.outer, &tr.state, cfg->max_steps,
                                                                             stop_signal != 0 ||
                                                                                 walltime_near(&tr, job_end, &left_s)))) {
                watchdog_phase("an extra inner step", tr.state.step);  // each its own: T may be long
                step_metrics x = train_step(&tr, true);
                if (x.step_ms / 1e3 > tr.slowest_step_s) tr.slowest_step_s = x.step_ms / 1e3;
                // A skipped step (the outlier guard) ends the extra steps: the phase syncs now
                // rather than pile up skips at the same step (max_bad_steps in a row stop a run).
                if (x.rolled_back || x.skipped) break;
                if (tr.outer) diloco_count_extra_step(tr.outer);
                m.extra_steps++;
            }
            if (m.extra_steps) m.extra_ms = (wall_seconds() - extra_t0) * 1e3;
            if (tr.outer) diloco_stepped(tr.outer, tr.state.step);
            if (first_copy_says(&tr, tr.outer && diloco_due(tr.outer, &tr.state, cfg->max_steps))) {
                watch_outer_work(&tr, "DiLoCo's outer work");
                double stall_s = 0.0, t0 = wall_seconds();
                data_position before = tr.state.data;
                bool changed = false;
                if (tr.outer) {
                    backend_download(tr.be, tr.params, NULL, NULL);
                    changed = diloco_after_step(tr.outer, &tr.params, 1, &tr.state, tr.train, cfg->max_steps,
                                                &stall_s);
                }
                if (follow_first_copy(&tr, changed, false, before)) backend_upload_params(tr.be, tr.params);
                m.stall_ms = (tr.outer ? stall_s : wall_seconds() - t0) * 1e3;
            }
        }
        metrics_step(tr.log, &m);
        if (tr.device == DEVICE_CPU && tr.state.step == first_step + 1) print_rank_memory(&tr);
        double step_s = (m.step_ms + (m.has_stall ? m.stall_ms : 0.0)) / 1e3;
        if (step_s > tr.slowest_step_s) tr.slowest_step_s = step_s;
        if (m.step > 1 || cfg->max_steps == 1) {  // the first step includes warm-up costs
            step_time_sum += m.step_ms / 1e3;
            timed_steps++;
        }
        double mean_step_s = timed_steps ? step_time_sum / (double)timed_steps : m.step_ms / 1e3;
        if (due(m.step, cfg->log_every, cfg->max_steps) || m.skipped) print_progress(&tr, &m, mean_step_s);
        int64_t step = tr.state.step;
        watchdog_phase("validation", step);
        double eval_t0 = wall_seconds();
        if (tr.val && due(step, cfg->val_every, cfg->max_steps)) validate(&tr);
        watchdog_phase("a sample", step);
        if (tr.samples && due(step, cfg->sample_every, cfg->max_steps))
            sampler_run(tr.samples, tr.be, step, tr.log);
        // The guard's check below comes after them, the next step's before: a step where they are
        // due needs their time too (until 2026-12 not counted: a long validation ran past the
        // walltime).
        tr.slowest_extra_s = fmax(tr.slowest_extra_s, wall_seconds() - eval_t0);
        double left_s = 0.0;
        bool walltime = step < cfg->max_steps && walltime_near(&tr, job_end, &left_s);
        bool stop_here = stop_signal || step == cfg->stop_at_step || walltime || tr.over;
        watchdog_phase("the replicas' stop agreement", step);
        if (tr.outer) stop_here = diloco_agree_stop(tr.outer, stop_here);
        if (tr.job) {  // a job's ranks stop together: any rank's signal or walltime stops all
            double why = comm_max(tr.job, stop_reason_code(stop_signal, walltime, stop_here));
            stop_here = why > 0;
            walltime = walltime || why == 2.0;
            if (why >= 100.0) stop_signal = signal_of_stop_reason(why);
        }
        // Done whatever stopped it: its last step, or the stop_at_step asked for (no requeue) —
        // but not a DiLoCo replica whose rejoin in the final syncs a signal stopped: the group
        // may still be syncing, and a requeued job (SIGUSR1: 76) resumes at max_steps and takes
        // part in the final syncs still to come (until 2026-12 it exited 0, a finished run).
        bool done = (step >= cfg->max_steps && !tr.join_stopped) || step == cfg->stop_at_step;
        watchdog_phase("a checkpoint", step);
        if (due(step, cfg->ckpt_every, no_final_checkpoint ? -1 : cfg->max_steps) || stop_here) {
            if (first_copy_says(&tr, tr.outer && diloco_in_flight(tr.outer))) {  // a fragment in flight lands first
                watch_outer_work(&tr, "DiLoCo's fragment in flight, before a checkpoint");
                data_position before = tr.state.data;
                bool changed = false;
                if (tr.outer) {
                    backend_download(tr.be, tr.params, NULL, NULL);
                    changed = diloco_settle(tr.outer, tr.params, &tr.state, tr.train);
                }
                if (follow_first_copy(&tr, changed, false, before)) backend_upload_params(tr.be, tr.params);
                stop_here = stop_here || tr.over;  // a rejoin in the landing found the run over: the last checkpoint
                watchdog_phase("a checkpoint", step);
            }
            checkpoint_now(&tr, stop_here || tr.state.step == cfg->max_steps,
                           stop_here && (stop_signal == SIGUSR1 || walltime) && !done);
        }
        if (stop_here) {
            const char *reason = stop_signal ? "signal" : walltime ? "walltime" : step == cfg->stop_at_step ?
                                 "stop_at_step" : tr.over ? "run_over" : "replica";
            if (tr.over && !stop_signal && !walltime)
                note("stopped after step %lld: the run is over (the other replicas finished it and left, so there is "
                     "no group to rejoin); %s, the final weights in the checkpoint of the replica that finished",
                     (long long)step,
                     step == cfg->max_steps ? "the checkpoint written holds θ as this replica last took it (its final "
                                              "syncs did not all apply)"
                                            : "this replica's own work is in the checkpoint written");
            else if (stop_signal && tr.join_stopped && step >= cfg->max_steps)
                note("stopped by signal %d after step %lld = max_steps while rejoining the group in its final syncs: "
                     "the checkpoint written holds θ as this replica last took it (its final syncs did not all "
                     "apply); run the same command to join the group at the run's end and take its final weights "
                     "(if the others have finished and left, it says that the run is over and keeps this checkpoint)",
                     (int)stop_signal, (long long)step);
            else if (stop_signal)
                note("stopped by signal %d after step %lld; checkpoint written, run the same command to resume",
                     (int)stop_signal, (long long)step);
            else if (walltime)
                note("stopped after step %lld: %.0f s left before the job's end, less than the slowest step (%.3g s), "
                     "validation and sample (%.3g s) and a checkpoint (%.2f s) take with walltime_safety %g and "
                     "stop_before_s %g; checkpoint written, requeue the job to resume",
                     (long long)step, left_s, tr.slowest_step_s, tr.slowest_extra_s, tr.ckpt_s, cfg->walltime_safety,
                     cfg->stop_before_s);
            else
                note("stopped after step %lld (%s); checkpoint written, run again to resume", (long long)step,
                     step == cfg->stop_at_step ? "stop_at_step" : "another replica was stopped");
            char extra[64];
            snprintf(extra, sizeof extra, "\"reason\":\"%s\"", reason);
            metrics_event(tr.log, "stop", step, extra);
            // SIGUSR1 (SLURM's --signal before the walltime) and the walltime guard mean "not
            // done, requeue me": a status the job scripts tell from a finished run and an error —
            // unless the run is done anyway (its last step, or the stop_at_step asked for): a
            // requeue then trained on past stop_at_step, or started a finished run again.
            if ((stop_signal == SIGUSR1 || walltime) && !done) exit_status = EXIT_REQUEUE;
            if (strcmp(cfg->resume, "never") == 0 && !done) {
                // The same command again refuses the checkpoint just written (resume = never:
                // "out_dir already holds checkpoints"): a requeue ended the job chain in an error.
                note("resume = never: %sthe same command would refuse this checkpoint; to go on, run it with --resume "
                     "auto", exit_status == EXIT_REQUEUE ? "status 0, not 76 (no requeue): " : "");
                if (exit_status == EXIT_REQUEUE) exit_status = 0;
            }
            break;
        }
    }
    // A replica that joined at the run's end and took part in the final syncs left (or came
    // after them) holds the group's final weights: its checkpoint at max_steps, as the replicas
    // that trained to the end write. (Dropped from one of those syncs, with the run then over,
    // or stopped in a rejoin, it holds the weights of before that sync: no checkpoint.)
    bool saved_at_end = joined_at_end && !trained && !tr.over && !tr.join_stopped;
    if (saved_at_end) {
        watchdog_phase("a checkpoint", tr.state.step);
        checkpoint_now(&tr, true, false);
    }
    watchdog_stop();  // leaving has its own limit (diloco_timeout_s)
    // What a replica that trained nothing holds on disk: a fresh one (no checkpoint loaded) none.
    const char *own = resumed ? "the checkpoint is unchanged" : "it has no checkpoint (it started without one)";
    if (tr.join_stopped && !trained) {
        // Stopped while the hub held its join (a quorum, a donor's state): nothing was trained,
        // so the checkpoint it started from stands.
        note("stopped by signal %d at step %lld while waiting to join the group: nothing trained, %s; run the same "
             "command to %s",
             (int)stop_signal, (long long)tr.state.step, own, resumed ? "resume" : "start it again");
        metrics_event(tr.log, "stop", tr.state.step, "\"reason\":\"signal\"");
        if (stop_signal == SIGUSR1) exit_status = EXIT_REQUEUE;
    } else if (saved_at_end) {
        if (diloco_final_incomplete(tr.outer))
            note("finished at max_steps = %lld without training a step: this replica joined the group at the run's "
                 "end and took its state, but some of its final syncs did not apply (the warning above): its "
                 "checkpoint step_%08lld holds θ as of outer step %lld there, not the group's final weights, which "
                 "are in the checkpoints of the replicas whose final syncs applied",
                 (long long)cfg->max_steps, (long long)tr.state.step, (long long)tr.state.outer_step);
        else
            note("finished at max_steps = %lld without training a step: this replica joined the group at the run's "
                 "end and took its state; its checkpoint step_%08lld holds the group's final weights",
                 (long long)cfg->max_steps, (long long)tr.state.step);
    } else if (tr.over && !trained) {
        note("stopped at step %lld without training: the run is over (the other replicas finished it and left); "
             "%s, the final weights are in the checkpoint of the replica that finished",
             (long long)tr.state.step, own);
        metrics_event(tr.log, "stop", tr.state.step, "\"reason\":\"run_over\"");
    } else if (!trained) {
        note("nothing to do: the run had already reached max_steps = %lld", (long long)cfg->max_steps);
    }
    diloco_leave(tr.outer, &tr.state, tr.state.step >= cfg->max_steps);
    diloco_close(tr.outer);
    sampler_free(tr.samples);
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0) {  // ru_maxrss: KiB on Linux
        char extra[480];
        // This process's: the weights, gradients and moments it holds, the most activation
        // bytes held at once (the backend's allocator counts; 0 where it does not count), and
        // (FSDP) the most gathered layers and unit gradients at once and the time spent
        // waiting for collectives; device_mb: what the GPU backend allocated on its GPU, and
        // device_state_mb the part of it that is this rank's weights, gradients and moments (0
        // on the CPU); follow_mb (HSDP copies in a DiLoCo replica): the weights it sent the
        // other copies after DiLoCo changed them; data_read_mb and data_hashed_mb: what the
        // train loader read from its shards, and hashed to verify them, in this run.
        int at = snprintf(extra, sizeof extra,
                          "\"peak_rss_mb\":%.1f,\"state_mb\":%.6f,\"activation_peak_mb\":%.6f,\"gathered_peak_mb\":%.6f,"
                          "\"grads_peak_mb\":%.6f,\"comm_wait_s\":%.3f,\"device_mb\":%.6f,\"device_state_mb\":%.6f,"
                          "\"data_read_mb\":%.6f,\"data_hashed_mb\":%.6f",
                          (double)usage.ru_maxrss / 1024.0, (double)tr.shard.local_numel * 16.0 / 1048576.0,
                          (double)tr.be->activation_peak_bytes / 1048576.0,
                          (double)tr.be->gathered_peak_bytes / 1048576.0, (double)tr.be->grads_peak_bytes / 1048576.0,
                          tr.be->comm_wait_s, (double)backend_device_bytes(tr.be) / 1048576.0,
                          (double)tr.be->device_state_bytes / 1048576.0,
                          (double)dataloader_bytes_read(tr.train) / 1048576.0,
                          (double)dataloader_bytes_hashed(tr.train) / 1048576.0);
        if (tr.copies_follow && at > 0 && at < (int)sizeof extra)
            snprintf(extra + at, sizeof extra - (size_t)at, ",\"follow_mb\":%.6f", (double)tr.follow_bytes / 1048576.0);
        metrics_event(tr.log, "end", tr.state.step, extra);
    }
    metrics_close(tr.log);
    dataloader_close(tr.val);
    release(&tr);
    if (job_stop) {
        comm_set_stop_poll(NULL);
        comm_flag_close(job_stop);
        job_stop = NULL;
    }
    if (tr.job) {
        leave_job(&tr);
        comm_finish();
    }
    return exit_status;
}


// ================================================================ DiLoCo simulated in one process
// diloco_transport = local: the M replicas are trainers in this process, each with its own
// weights, AdamW moments, backend and 1/M of the data (the split M processes would read).
// Each round they take their inner steps one after another, then diloco_outer_step_local
// averages and applies exactly what a transport would have carried. The global weights are
// what is validated: at the first outer boundary at or after each multiple of val_every, and
// at the end. What it costs: M times the weights, moments and activations of one replica, and
// M times the compute of one replica per step. No checkpoints, no samples: it is for
// measuring (bench/diloco/convergence.sh, `train_gpt diloco-tune`), not for keeping a model.

typedef struct {
    double val_loss;      // at the end; NaN without val_data
    double seconds;
} local_result;

static local_result train_local(train_config *cfg, bool quiet) {
    int M = (int)cfg->diloco_replicas;
    int64_t H = cfg->diloco_inner_steps;
    double t_start = wall_seconds();
    config_check_files(cfg);
    config_check_tokens(cfg, M);
    trainer *reps = (trainer *)xcalloc((size_t)M, sizeof *reps);
    trainer *lead = &reps[0];
    lead->cfg = cfg;
    if (quiet) {  // diloco-tune's runs: the same choice, without saying it each time
        char why[600];
        lead->device = device_choose(cfg->device, gpu_probe(), why, sizeof why);
        if (lead->device == DEVICE_ERROR) fail("device: %s", why);
    } else {
        lead->device = select_device(lead);
    }
    lead->threads = setup_threads(cfg);
    lead->quiet = quiet;
    resolve_recompute(lead, M);  // the M replicas share this process's memory
    if (cfg->tensorboard && !quiet)
        warn("tensorboard = 1 is ignored with diloco_transport = local (a simulated run writes no event file; "
             "metrics.jsonl has every number, and `train_gpt plot` draws them)");
    metrics_log *log = metrics_open(cfg->out_dir, false);  // a simulated run writes no event file
    dataloader *val = NULL;
    float **params = (float **)xmalloc((size_t)M * sizeof *params);
    for (int i = 0; i < M; i++) {
        trainer *tr = &reps[i];
        tr->cfg = cfg;
        tr->device = lead->device;
        tr->threads = lead->threads;
        tr->peak_tflops = lead->peak_tflops;
        tr->quiet = quiet;
        tr->rank = i;
        tr->world = M;
        tr->split = (data_split){i, M, 0, 1};
        tr->train = dataloader_open_split(cfg->train_data, "train_data", cfg->batch_size, cfg->model.seq_len,
                                          cfg->shuffle, (uint64_t)cfg->seed, tr->split);
        if (i == 0) {
            resolve_doc_token(cfg, tr->train);
            val = open_validation(cfg);
        }
        tr->val = val;
        tr->log = i == 0 ? log : NULL;
        allocate(tr);
        restore_or_init(tr);
        params[i] = tr->params;
    }
    for (int i = 1; i < M; i++)
        if (reps[i].state.step != lead->state.step) fail("diloco (local): the replicas did not start at the same step");
    diloco *outer = diloco_open(cfg, &lead->shard, NULL, NULL, log, NULL);  // one data stream: nothing to compare
    diloco_set_quiet(outer, quiet);
    // Simulated replicas keep no outer state: from a checkpoint of a run that had one, θ starts
    // from its weights, with zero momentum and the outer count at 0 (said, as for a plain one).
    if (lead->state.step > 0 && !quiet)
        note("diloco (local): simulated replicas start their outer state afresh at step %lld: θ = the checkpoint's "
             "weights, zero momentum, outer step 0%s",
             (long long)lead->state.step, lead->state.merge_step > 0 ? "; its pending fragment merge is dropped" : "");
    diloco_start_local(outer, lead->params, &lead->state);
    for (int i = 0; i < M; i++)
        backend_upload(reps[i].be, reps[i].params, reps[i].exp_avg, reps[i].exp_avg_sq, reps[i].state.adam_step);
    if (!quiet) {
        print_model_summary(&lead->table, cfg, M);
        char topk[48] = "";
        if (cfg->diloco_topk < 1) snprintf(topk, sizeof topk, ", the top %g of every block", cfg->diloco_topk);
        char outer[256], inner[112];
        describe_outer(cfg, outer, sizeof outer);
        describe_inner(cfg, inner, sizeof inner);
        banner("diloco (simulated in this process): %d replicas one after another, %s, %s, %s outer "
               "gradients%s%s; validation on the global weights\n",
               M, inner, outer, cfg->diloco_quant, topk, cfg->diloco_error_feedback ? " with error feedback" : "");
        fflush(stdout);
        install_signal_handlers();
    }

    local_result res = {NAN, 0.0};
    // A round is at most H steps, or H + H_d where it crosses into the decay phase.
    step_metrics *round = (step_metrics *)xcalloc((size_t)(H + cfg->diloco_decay_inner_steps + 1), sizeof *round);
    double step_time_sum = 0.0;
    int64_t timed = 0;
    while (lead->state.step < cfg->max_steps) {
        // From one step with outer work to the next (every H steps; every H/P with fragments).
        int64_t start = lead->state.step;
        int64_t end = diloco_next_due(outer, &lead->state, cfg->max_steps);
        for (int i = 0; i < M; i++) {
            for (int64_t s = start; s < end; s++) {
                step_metrics m = train_step(&reps[i], false);
                step_metrics *r = &round[s - start];
                if (i == 0) {
                    *r = m;
                    r->loss = 0.0;
                    r->grad_norm = 0.0;
                    r->step_ms = 0.0;
                }
                r->loss += m.loss / M;           // the mean over replicas
                r->grad_norm += m.grad_norm / M;
                r->step_ms += m.step_ms;         // all replicas: the wall time of the step
                r->skipped = r->skipped || m.skipped;
            }
        }
        for (int i = 0; i < M; i++) backend_download(reps[i].be, reps[i].params, NULL, NULL);
        double stall_s = 0.0;
        diloco_after_step(outer, params, M, &lead->state, NULL, cfg->max_steps, &stall_s);
        for (int i = 0; i < M; i++) {
            reps[i].state.outer_step = lead->state.outer_step;
            backend_upload_params(reps[i].be, reps[i].params);
        }
        for (int64_t s = start; s < end; s++) {
            step_metrics *r = &round[s - start];
            r->tok_per_s = (double)(cfg->batch_size * cfg->model.seq_len * cfg->grad_accum * M) / (r->step_ms / 1e3);
            r->has_stall = true;
            r->stall_ms = s + 1 == end ? stall_s * 1e3 : 0.0;
            metrics_step(log, r);
            step_time_sum += r->step_ms / 1e3;
            timed++;
            if (!quiet && (due(r->step, cfg->log_every, cfg->max_steps) || r->skipped))
                print_progress(lead, r, step_time_sum / (double)timed);
        }
        // stop_at_step ends the run at the first outer boundary at or after it (a round is
        // never cut short), validated there like the last step; nothing is written to resume.
        bool stop_at = cfg->stop_at_step > 0 && end >= cfg->stop_at_step && end < cfg->max_steps;
        bool val_due = end == cfg->max_steps || stop_at ||
                       (cfg->val_every > 0 && end / cfg->val_every > start / cfg->val_every);
        // What is validated is θ, the global weights (after the last step every replica holds it).
        if (val && val_due) {
            if (end != cfg->max_steps) backend_upload_params(lead->be, diloco_theta(outer));
            res.val_loss = validate(lead);
            if (end != cfg->max_steps) backend_upload_params(lead->be, lead->params);
        }
        if (stop_signal) {
            note("stopped by signal %d after step %lld (a simulated run writes no checkpoint)", (int)stop_signal,
                 (long long)lead->state.step);
            metrics_event(log, "stop", lead->state.step, "\"reason\":\"signal\"");
            break;
        }
        if (stop_at) {
            if (!quiet)
                note("stopped after step %lld, the first outer boundary at or after stop_at_step = %lld (a simulated "
                     "run writes no checkpoint)", (long long)end, (long long)cfg->stop_at_step);
            metrics_event(log, "stop", end, "\"reason\":\"stop_at_step\"");
            break;
        }
    }
    free(round);
    diloco_close(outer);
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) == 0) {   // the end line, of what a simulated run has
        double state_mb = 0.0;
        for (int i = 0; i < M; i++) state_mb += (double)reps[i].shard.local_numel * 16.0 / 1048576.0;
        char extra[128];
        snprintf(extra, sizeof extra, "\"peak_rss_mb\":%.1f,\"state_mb\":%.6f", (double)usage.ru_maxrss / 1024.0,
                 state_mb);
        metrics_event(log, "end", lead->state.step, extra);
    }
    for (int i = 0; i < M; i++) release(&reps[i]);
    dataloader_close(val);
    metrics_close(log);
    free(params);
    free(reps);
    res.seconds = wall_seconds() - t_start;
    return res;
}

// ================================================================ diloco-tune
// `train_gpt diloco-tune CONFIG --replicas M --inner_steps H [options] [--key value]...`:
// the published recipe (Charles et al. 2025: the best outer learning rate depends on M and H,
// not on model size) as one command. It shrinks CONFIG to a proxy that trains in minutes,
// keeps what the outer optimizer's optimum depends on (M, H, the data, the schedule's shape,
// the quantization), runs one worker, data parallel and DiLoCo at each (outer lr, μ) of a
// grid, all at equal tokens per replica, and prints the table and the best settings as
// config lines. docs/diloco.md#tuning-the-outer-optimizer says what is scaled and why.

typedef struct {
    int replicas;
    int64_t inner_steps, rounds;
    bool proxy;
    double lrs[16], mus[16];
    int n_lr, n_mu;
    const char *dir;
} tune_options;

typedef struct {
    char name[96];
    double lr, mu;       // NaN for the baselines
    local_result r;
} tune_run;

// x in the fewest significant digits that read back as x: run names and printed settings
// (%g's 6 digits named 0.90000001 and 0.90000009 alike: one folder for both runs).
static const char *shortest(double x, char *buf, size_t bytes) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, bytes, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

static int parse_list(const char *flag, const char *text, double *out, int max, double lo, double hi) {
    int n = 0;
    char *copy = xstrdup(text), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(tok, &end);
        if (end == tok || *end || !(v >= lo && v <= hi) || n == max)
            fail("diloco-tune: %s: '%s' is not a comma-separated list of at most %d numbers in [%g, %g]", flag, text,
                 max, lo, hi);
        for (int i = 0; i < n; i++)
            if (out[i] == v) fail("diloco-tune: %s: %g is listed twice in '%s'", flag, v, text);
        out[n++] = v;
    }
    free(copy);
    if (n == 0) fail("diloco-tune: %s: empty list", flag);
    return n;
}

// An integer flag of diloco-tune in [lo, hi]; anything else (4x, 1e9, 2³² + 2) fails with one line.
static int64_t tune_int(const char *flag, const char *text, int64_t lo, int64_t hi) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || !end || *end || end == text || v < lo || v > hi)
        fail("diloco-tune: %s: expected an integer in [%lld, %lld], got '%s'", flag, (long long)lo, (long long)hi, text);
    return v;
}

// Whether argv[*i] is the tuner's flag `name`, as --name value or --name=value; *value is then
// its value (NULL: missing) and *i its last word.
static bool tune_flag(int argc, char **argv, int *i, const char *name, const char **value) {
    const char *a = argv[*i];
    size_t len = strlen(name);
    if (strncmp(a, name, len) != 0) return false;
    if (a[len] == '=') {
        *value = a + len + 1;
        return true;
    }
    if (a[len] != '\0') return false;
    *value = *i + 1 < argc ? argv[++*i] : NULL;
    return true;
}

// Splits the tuner's own flags from the config overrides (which stay in argv, compacted).
static tune_options parse_tune_options(int *argc, char **argv) {
    tune_options o = {};
    o.rounds = 8;
    o.proxy = true;
    o.dir = "out/diloco-tune";
    o.n_lr = parse_list("--outer_lr", "0.7,1.0,1.4", o.lrs, 16, 0, 10);
    o.n_mu = parse_list("--outer_momentum", "0,0.5,0.9", o.mus, 16, 0, 0.999999);
    static const char *const flags[] = {"--replicas", "--inner_steps", "--rounds", "--proxy",
                                        "--dir",      "--outer_lr",    "--outer_momentum"};
    const int n_flags = (int)(sizeof flags / sizeof flags[0]);
    int kept = 0;
    for (int i = 0; i < *argc; i++) {
        const char *v = NULL;
        int f = 0;
        while (f < n_flags && !tune_flag(*argc, argv, &i, flags[f], &v)) f++;
        if (f == n_flags) {
            argv[kept++] = argv[i];
            continue;
        }
        const char *a = flags[f];
        if (!v) fail("diloco-tune: %s needs a value", a);
        switch (f) {
        case 0: o.replicas = (int)tune_int(a, v, 2, 256); break;
        case 1: o.inner_steps = tune_int(a, v, 1, 1000000); break;
        case 2: o.rounds = tune_int(a, v, 2, 1000); break;
        case 3: o.proxy = tune_int(a, v, 0, 1) != 0; break;
        case 4: o.dir = v; break;
        case 5: o.n_lr = parse_list(a, v, o.lrs, 16, 0, 10); break;
        default: o.n_mu = parse_list(a, v, o.mus, 16, 0, 0.999999); break;
        }
    }
    *argc = kept;
    if (o.replicas < 2 || o.replicas > 256) fail("diloco-tune: --replicas M (2 .. 256) is required");
    if (o.inner_steps < 1) fail("diloco-tune: --inner_steps H (>= 1) is required");
    if (o.rounds < 2 || o.rounds > 1000) fail("diloco-tune: --rounds must be in 2 .. 1000, got %lld", (long long)o.rounds);
    return o;
}

// The proxy's depth; its head_dim is 32, the smallest the CUDA backend's attention kernels take
// (32, 64, 128): d_model 64 over 4 heads, 16, stopped every proxy run on a GPU at model creation.
#define TUNE_PROXY_LAYERS 4
#define TUNE_PROXY_HEAD_DIM 32

// The streaming the tuning runs can take: a fragment holds whole layers (the proxy has 4) and
// syncs at its own one of the H inner steps tuned, with fewer than H / P steps in flight. The
// run config's diloco_fragments and diloco_overlap_steps fit its own model and H, which the
// tuner's need not be: 8 fragments of a 32-layer run were refused, naming the config's line.
static void tune_streaming(const tune_options *o, const train_config *user, int64_t *fragments, int64_t *overlap) {
    int64_t layers = o->proxy ? TUNE_PROXY_LAYERS : user->model.n_layer;
    *fragments = min_i64(user->diloco_fragments, min_i64(layers, o->inner_steps));
    *overlap = min_i64(user->diloco_overlap_steps, o->inner_steps / *fragments - 1);
}

// The config of one tuning run: the user's file and overrides, then the proxy's shape, then
// this run's settings (later arguments win), which override the keys of the user's run that
// would contradict them.
static void tune_config(train_config *cfg, const char *path, int argc, char **argv, const tune_options *o,
                        const train_config *user, const char *name, int replicas, int64_t batch, double lr,
                        double mu) {
    char *buf[48];   // the values written here (a path may be long: --dir, out_dir)
    char **args = (char **)xcalloc((size_t)argc + 2 * 48, sizeof *args);
    int n = 0, b = 0;
    for (int i = 0; i < argc; i++) args[n++] = argv[i];
#define ARG(key, ...)                                          \
    do {                                                       \
        args[n++] = (char *)key;                               \
        int len_ = snprintf(NULL, 0, __VA_ARGS__);             \
        buf[b] = (char *)xmalloc((size_t)len_ + 1);            \
        snprintf(buf[b], (size_t)len_ + 1, __VA_ARGS__);       \
        args[n++] = buf[b++];                                  \
    } while (0)
    int64_t steps = o->rounds * o->inner_steps;
    if (o->proxy) {
        const model_config *m = &user->model;
        ARG("--n_layer", "%d", TUNE_PROXY_LAYERS);
        ARG("--d_model", "64");
        ARG("--n_head", "4");
        ARG("--n_kv_head", "%d", m->n_kv_head < m->n_head ? 2 : 4);
        ARG("--head_dim", "%d", TUNE_PROXY_HEAD_DIM);
        ARG("--d_ff", "192");
        ARG("--seq_len", "%lld", (long long)min_i64(m->seq_len, 64));
        ARG("--lr", "3e-3");
        ARG("--grad_accum", "1");
        ARG("--val_tokens", "%lld", (long long)(user->val_tokens > 0 ? min_i64(user->val_tokens, 65536) : 65536));
    }
    ARG("--batch_size", "%lld", (long long)batch);
    ARG("--max_steps", "%lld", (long long)steps);
    // The warm-up as the same fraction of the run, ending by the decay's start as the config's
    // does (rounding alone could carry it one step past: warmup 9 of 10 at decay_frac 0.12 is
    // 23 of 25 steps, whose decay starts at 22).
    train_config tuned = *user;
    tuned.max_steps = steps;
    int64_t warmup = llround((double)steps * (double)user->warmup_steps / (double)max_i64(1, user->max_steps));
    ARG("--warmup_steps", "%lld", (long long)min_i64(warmup, decay_start_step(&tuned)));
    ARG("--val_every", "0");
    ARG("--stop_at_step", "0");
    ARG("--diloco_min_replicas", "1");
    ARG("--sample_every", "0");
    ARG("--ckpt_every", "0");
    ARG("--resume", "never");
    if (o->proxy) ARG("--init_from", "%s", "");  // the user's weights have the user's shape
    ARG("--diloco_transport", "local");
    ARG("--fsdp_size", "0");      // the run's sharding (its replicas are jobs of several ranks): the
    ARG("--dp_replicate", "0");   // simulated replicas are unsharded, in one process
    ARG("--diloco_sync_every_s", "0");  // the simulated replicas take turns: no wall-time phases
    ARG("--diloco_replicas", "%d", replicas);
    // A replica's own config names its replica, which the simulated replicas do not read and
    // the baselines' one replica refused (diloco_replica_id 2 is not below diloco_replicas 1).
    ARG("--diloco_replica_id", "-1");
    ARG("--diloco_inner_steps", "%lld", (long long)(replicas > 1 ? o->inner_steps : steps));
    int64_t fragments, overlap;
    tune_streaming(o, user, &fragments, &overlap);
    if (replicas == 1) {
        // The baselines are plain training (M = 1, lr 1, μ 0, one outer step at the end), bit for
        // bit: nothing streamed (a fragment synced mid-run and merged back with
        // diloco_merge_alpha dropped part of its own training, and skewed every "vs" figure),
        // quantized, sparsified or bounded.
        fragments = 1, overlap = 0;
        ARG("--diloco_quant", "none");
        ARG("--diloco_downlink", "same");   // fp32 with none (a config's bf16 was refused beside none)
        ARG("--diloco_topk", "1");
        ARG("--diloco_error_feedback", "0");
        ARG("--diloco_bound", "0");
    }
    ARG("--diloco_fragments", "%lld", (long long)fragments);
    ARG("--diloco_overlap_steps", "%lld", (long long)overlap);
    // One H throughout: the tuned lr and μ are those of the phases before the decay (which
    // diloco_decay_inner_steps would shorten; the default outer optimizer makes them plain
    // averaging anyway).
    ARG("--diloco_decay_inner_steps", "0");
    ARG("--diloco_outer_lr", "%.17g", lr);
    ARG("--diloco_outer_momentum", "%.17g", mu);
    ARG("--out_dir", "%s/%s", o->dir, name);
#undef ARG
    config_load(cfg, path, n, args);
    for (int i = 0; i < b; i++) free(buf[i]);
    free(args);
}

static double tune_vs(double x, double ref) { return 100.0 * (x / ref - 1.0); }

static const char TUNE_USAGE[] =
    "usage: train_gpt diloco-tune CONFIG --replicas M --inner_steps H [options] [--key value]...\n"
    "  trains one worker, data parallel and DiLoCo over a grid of outer lr x momentum, M replicas\n"
    "  simulated in this process, and prints the validation losses and the best setting (docs/diloco.md)\n"
    "  --replicas M          the run's replicas, 2 .. 256 (required)\n"
    "  --inner_steps H       the run's inner steps per outer step (required)\n"
    "  --rounds R            outer rounds per tuning run, 2 .. 1000 [8]\n"
    "  --outer_lr LIST       outer learning rates, comma-separated [0.7,1.0,1.4]\n"
    "  --outer_momentum LIST outer momenta, comma-separated [0,0.5,0.9]\n"
    "  --proxy 0|1           1: a small model of the config's data and schedule; 0: the config's model [1]\n"
    "  --dir DIR             where the runs go, one folder each [out/diloco-tune]\n"
    "  --key value           any config key, as for training\n";

// --help or -h where an option's name goes: [CONFIG] then --key value or --key=value pairs (every
// option of training, plan and diloco-tune takes a value). A value that reads "-h" is a value:
// `--sample_prompt -h` printed the usage and exited 0, which a requeue loop takes for a run done.
static bool asks_for_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return true;
        if (strncmp(a, "--", 2) == 0 && !strchr(a, '=')) i++;   // its value follows
    }
    return false;
}

static int diloco_tune_main(int argc, char **argv) {
    if (asks_for_help(argc - 1, argv + 1)) {
        fputs(TUNE_USAGE, stdout);
        return 0;
    }
    if (argc < 2) fail("usage: train_gpt diloco-tune CONFIG --replicas M --inner_steps H [--rounds R] "
                       "[--outer_lr LIST] [--outer_momentum LIST] [--proxy 0|1] [--dir DIR] [--key value]...");
    const char *path = strncmp(argv[1], "--", 2) == 0 ? NULL : argv[1];
    int rest = path ? 2 : 1;
    int n_args = argc - rest;
    char **args = argv + rest;
    tune_options o = parse_tune_options(&n_args, args);
    train_config user;
    config_load(&user, path, n_args, args);
    if (!user.val_data[0]) fail("diloco-tune: the config has no val_data; the tuner compares validation losses");
    // Runs: one worker and data parallel (DiLoCo with M = 1, lr 1, μ 0 is plain training,
    // bit for bit), then the grid.
    int total = 2 + o.n_lr * o.n_mu;
    tune_run *runs = (tune_run *)xcalloc((size_t)total, sizeof *runs);
    int64_t B = o.proxy ? 8 : user.batch_size;
    // The model as the runs get it (the first run's config: all share the shape).
    train_config first;
    tune_config(&first, path, n_args, args, &o, &user, "one-worker", 1, B, 1.0, 0.0);
    const model_config *pm = &first.model;
    char model[300];
    snprintf(model, sizeof model, "%s: %lld layers, d_model %lld, %lld/%lld heads of %lld, d_ff %lld, seq %lld, batch "
             "%lld, inner lr %g%s", o.proxy ? "proxy" : "your model", (long long)pm->n_layer, (long long)pm->d_model,
             (long long)pm->n_head, (long long)pm->n_kv_head, (long long)pm->head_dim, (long long)pm->d_ff,
             (long long)pm->seq_len, (long long)B, first.lr, o.proxy ? " (--proxy 0: your model as is)" : "");
    config_free(&first);
    printf("diloco-tune | M = %d replicas, H = %lld inner steps, %lld rounds = %lld steps per replica; %s; %d runs\n",
           o.replicas, (long long)o.inner_steps, (long long)o.rounds, (long long)(o.rounds * o.inner_steps), model,
           total);
    int64_t fragments, overlap;
    tune_streaming(&o, &user, &fragments, &overlap);
    if (fragments != user.diloco_fragments || overlap != user.diloco_overlap_steps)
        printf("diloco-tune | the runs stream with diloco_fragments = %lld, diloco_overlap_steps = %lld (the "
               "config: %lld and %lld): a fragment holds whole layers (%lld here) and syncs at its own one of the "
               "H = %lld inner steps\n",
               (long long)fragments, (long long)overlap, (long long)user.diloco_fragments,
               (long long)user.diloco_overlap_steps, (long long)(o.proxy ? TUNE_PROXY_LAYERS : user.model.n_layer),
               (long long)o.inner_steps);
    fflush(stdout);
    double elapsed = 0.0;
    for (int k = 0; k < total; k++) {
        tune_run *r = &runs[k];
        int replicas = o.replicas;
        int64_t batch = B;
        r->lr = 1.0;
        r->mu = 0.0;
        if (k == 0) {
            snprintf(r->name, sizeof r->name, "one-worker");
            replicas = 1;
        } else if (k == 1) {
            snprintf(r->name, sizeof r->name, "data-parallel");
            replicas = 1;
            batch = B * o.replicas;
        } else {
            r->lr = o.lrs[(k - 2) / o.n_mu];
            r->mu = o.mus[(k - 2) % o.n_mu];
            char lr[32], mu[32];
            snprintf(r->name, sizeof r->name, "lr%s-mu%s", shortest(r->lr, lr, sizeof lr), shortest(r->mu, mu, sizeof mu));
        }
        train_config cfg;
        tune_config(&cfg, path, n_args, args, &o, &user, r->name, replicas, batch, r->lr, r->mu);
        char metrics[4200];
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", cfg.out_dir);
        unlink(metrics);
        r->r = train_local(&cfg, true);
        config_free(&cfg);
        elapsed += r->r.seconds;
        char eta[32];
        format_duration(elapsed / (k + 1) * (total - k - 1), eta, sizeof eta);
        printf("diloco-tune | [%2d/%d] %-16s val_loss %.4f  (%.0f s, ETA %s)\n", k + 1, total, r->name, r->r.val_loss,
               r->r.seconds, eta);
        fflush(stdout);
    }
    double one = runs[0].r.val_loss, dp = runs[1].r.val_loss;
    int best = 2;
    for (int k = 2; k < total; k++)
        if (runs[k].r.val_loss < runs[best].r.val_loss) best = k;
    printf("\n| outer lr | momentum | val_loss | vs one worker | vs data parallel |\n|---|---|---|---|---|\n");
    printf("| (one worker) | | %.4f | | %+.2f %% |\n", one, tune_vs(one, dp));
    printf("| (data parallel, %d x batch) | | %.4f | %+.2f %% | |\n", o.replicas, dp, tune_vs(dp, one));
    char lr[32], mu[32];
    for (int k = 2; k < total; k++)
        printf("| %s | %s | %.4f | %+.2f %% | %+.2f %% |%s\n", shortest(runs[k].lr, lr, sizeof lr),
               shortest(runs[k].mu, mu, sizeof mu), runs[k].r.val_loss, tune_vs(runs[k].r.val_loss, one),
               tune_vs(runs[k].r.val_loss, dp), k == best ? " best" : "");
    const tune_run *b = &runs[best];
    double lr_min = o.lrs[0], lr_max = o.lrs[0];   // the grid's range, whatever the list's order
    for (int i = 1; i < o.n_lr; i++) {
        lr_min = fmin(lr_min, o.lrs[i]);
        lr_max = fmax(lr_max, o.lrs[i]);
    }
    bool edge_lr = b->lr == lr_min || b->lr == lr_max;
    printf("\n# diloco-tune: M = %d, H = %lld: best of %d settings, %+.2f %% against data parallel, %+.2f %% against "
           "one worker\n",
           o.replicas, (long long)o.inner_steps, total - 2, tune_vs(b->r.val_loss, dp), tune_vs(b->r.val_loss, one));
    printf("diloco_replicas = %d\ndiloco_inner_steps = %lld\ndiloco_outer_lr = %s\ndiloco_outer_momentum = %s\n",
           o.replicas, (long long)o.inner_steps, shortest(b->lr, lr, sizeof lr), shortest(b->mu, mu, sizeof mu));
    if (o.n_lr > 1 && edge_lr)
        printf("# the best outer lr is at the edge of the grid: widen --outer_lr and run again\n");
    if (b->r.val_loss >= one)
        printf("# no setting beat one worker: try a larger H or more --rounds\n");
    printf("# tuned with one H throughout (diloco_decay_inner_steps = 0); the run keeps its own "
           "diloco_decay_inner_steps (auto: H/4 in the decay with momentum or 150+ outer steps)\n");
    free(runs);
    config_free(&user);
    return 0;
}

// ================================================================ the command line
#ifndef TESTING

// `train_gpt prepare` writes its tokens through dataloader.h's shard writer.
static void *sink_open(const char *path, uint32_t vocab_size, uint32_t doc_token) {
    return shard_writer_open(path, vocab_size, doc_token);
}
static bool sink_append(void *w, const uint32_t *tokens, uint64_t count) {
    return shard_writer_append((shard_writer *)w, tokens, count);
}
static uint64_t sink_tokens(const void *w) { return shard_writer_tokens((const shard_writer *)w); }
static bool sink_close(void *w) { return shard_writer_close((shard_writer *)w); }
static void sink_abort(void *w) { shard_writer_abort((shard_writer *)w); }
static const shard_sink shard_files = {sink_open, sink_append, sink_tokens, sink_close, sink_abort, SHARD_NO_DOC_TOKEN};

static void usage_error(void) {
    fail("usage: train_gpt CONFIG [--key value]...  |  train_gpt plan CONFIG  |  train_gpt prepare ...  |  "
         "train_gpt relay ...  |  train_gpt diloco-tune CONFIG --replicas M --inner_steps H ...  |  "
         "train_gpt plot OUT_DIR... [-o FILE.svg]  |  train_gpt shards upgrade PATH...  |  train_gpt --help");
}

// `train_gpt plan`'s own options, anywhere after the config, as `--opt V` or `--opt=V`: --world
// N (the ranks that shard one copy; default fsdp_size, or 1), --gpu NAME (a row of
// llmc/device.h's table) and --link_mbps X (a DiLoCo replica's link, default 100). Moves them
// out of argv and returns how many arguments are left: the config keys.
static int take_plan_options(int argc, char **argv, int *world, int *gpu_row, double *link_mbps) {
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        const char *names[3] = {"--world", "--gpu", "--link_mbps"};
        int which = -1;
        const char *value = NULL;
        for (int n = 0; n < 3 && which < 0; n++) {
            size_t len = strlen(names[n]);
            if (strncmp(argv[i], names[n], len) != 0) continue;
            if (argv[i][len] == '=') which = n, value = argv[i] + len + 1;
            else if (argv[i][len] == '\0') which = n, value = i + 1 < argc ? argv[++i] : NULL;
        }
        if (which < 0) {
            argv[kept++] = argv[i];
            continue;
        }
        if (!value) fail("plan: %s: needs a value", names[which]);
        char *end = NULL;
        if (which == 0) {
            long n = strtol(value, &end, 10);
            if (!end || *end || n < 1 || n > 1 << 20) fail("plan: --world: expected a number of ranks, got '%s'", value);
            *world = (int)n;
        } else if (which == 1) {
            char why[600];
            *gpu_row = gpu_memory_find(value, why, sizeof why);
            if (*gpu_row < 0) fail("plan: --gpu: %s", why);
        } else {
            double v = strtod(value, &end);
            if (!end || *end || !(v >= 1e-3) || v > 1e9)
                fail("plan: --link_mbps: expected a link speed in Mbit/s from 0.001 to 1e9, got '%s'", value);
            *link_mbps = v;
        }
    }
    return kept;
}

static void print_plan_usage(void) {
    printf("usage: train_gpt plan CONFIG [--world N] [--gpu NAME] [--link_mbps X] [--key value]...\n"
           "  memory per rank for every recompute mode, what recompute = auto picks, FLOPs and time per step,\n"
           "  and DiLoCo's traffic, without training (docs/fsdp.md)\n"
           "  --world N        the ranks that shard one copy of the model [fsdp_size, or 1]\n"
           "  --gpu NAME       a GPU of the memory table:");
    for (int i = 0; i < gpu_memory_rows(); i++) printf("%s %s", i ? "," : "", gpu_memory_name(i));
    printf("\n"
           "  --link_mbps X    a DiLoCo replica's link in Mbit/s [100]\n"
           "  --key value      any config key, as for training (train_gpt --help lists them)\n");
}

// ---------------------------------------------------------------- train_gpt shards upgrade
// Version 1 shards (no chunk table: every process verifies each whole, after every start)
// written again as version 2 in place, without tokenizing again: at disk speed, where prepare
// takes days over TBs. dataloader.h's shard_upgrade does one shard (verified, written aside,
// renamed over it, the same tokens and data fingerprint); this lists the shards, says how far it
// is, and what became of each (docs/data.md).

static const char SHARDS_USAGE[] =
    "usage: train_gpt shards upgrade [--config CONFIG] [--progress_s S] [--quiet] [--] PATH...\n"
    "  writes version 1 token shards again as version 2, in place: the same tokens, each shard verified\n"
    "  first and replaced only once the new one is whole (docs/data.md)\n"
    "  PATH              a shard, a directory (its *.bin files) or a quoted pattern ('data/web_*.bin')\n"
    "  --config CONFIG   also the shards its train_data and val_data name\n"
    "  --progress_s S    seconds between progress lines [5]\n"
    "  --quiet           no progress lines\n";

typedef struct {
    char **paths;
    int count, capacity;
} path_list;

static void path_list_add(path_list *l, const char *path) {
    if (l->count == l->capacity) {
        l->capacity = l->capacity ? 2 * l->capacity : 64;
        l->paths = (char **)xrealloc(l->paths, (size_t)l->capacity * sizeof *l->paths);
    }
    l->paths[l->count++] = xstrdup(path);
}

static int compare_paths(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// A directory's shards as the trainer's DIR/*.bin takes them: its files named *.bin (not hidden
// ones, not those of its subdirectories), sorted; prepare's .partial, .tmp and .replaced are not.
static void list_directory(path_list *l, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) fail("shards upgrade: cannot list directory '%s': %s", dir, strerror(errno));
    int first = l->count;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || n < 5 || strcmp(e->d_name + n - 4, ".bin") != 0) continue;
        size_t bytes = strlen(dir) + n + 2;
        char *path = (char *)xmalloc(bytes);
        snprintf(path, bytes, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) path_list_add(l, path);
        free(path);
    }
    closedir(d);
    if (l->count == first) fail("shards upgrade: directory '%s' holds no shard (no file named *.bin)", dir);
    qsort(l->paths + first, (size_t)(l->count - first), sizeof *l->paths, compare_paths);
}

// PATH: a file, a directory, or a pattern (an argument with *, ? or [ that names no file),
// whose matches are sorted. from: where it came from, for the error.
static void list_argument(path_list *l, const char *arg, const char *from) {
    struct stat st;
    if (stat(arg, &st) == 0) {
        if (S_ISDIR(st.st_mode)) list_directory(l, arg);
        else path_list_add(l, arg);
        return;
    }
    if (!strpbrk(arg, "*?[")) fail("shards upgrade: %s'%s': %s", from, arg, strerror(errno));
    glob_t g;
    int rc = glob(arg, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) fail("shards upgrade: %sno file matches '%s'", from, arg);
    if (rc != 0) fail("shards upgrade: %scannot expand '%s'", from, arg);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (stat(g.gl_pathv[i], &st) == 0 && S_ISDIR(st.st_mode)) list_directory(l, g.gl_pathv[i]);
        else path_list_add(l, g.gl_pathv[i]);
    }
    globfree(&g);
}

// The shards a config trains and validates on: train_data and val_data as the loader reads
// them (a path or a pattern, or a comma-separated list of either).
static void list_config(path_list *l, const char *config_path) {
    train_config cfg;
    config_load(&cfg, config_path, 0, NULL);
    const char *keys[2] = {"train_data", "val_data"};
    const char *specs[2] = {cfg.train_data, cfg.val_data};
    for (int k = 0; k < 2; k++) {
        if (!specs[k] || !specs[k][0]) continue;
        char from[300];
        snprintf(from, sizeof from, "%s's %s: ", config_path, keys[k]);
        char *copy = xstrdup(specs[k]), *save = NULL;
        for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
            while (*item == ' ') item++;
            char *end = item + strlen(item);
            while (end > item && end[-1] == ' ') *--end = '\0';
            if (*item) list_argument(l, item, from);
        }
        free(copy);
    }
    config_free(&cfg);
}

// A shard named twice (listed twice, a directory and a pattern over the same files, a symbolic
// link beside its target) is upgraded once, under its first name: a second pass found it version 2
// already and counted it twice. Files are the same when their canonical paths are (realpath: links
// resolved); a name that cannot be resolved stays, for the header read to refuse with its reason.
typedef struct {
    char *real;   // NULL: not resolved
    int index;    // in the list
} named_file;

static int compare_named(const void *a, const void *b) {
    const named_file *x = (const named_file *)a, *y = (const named_file *)b;
    int c = x->real && y->real ? strcmp(x->real, y->real) : (x->real != NULL) - (y->real != NULL);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

static void drop_same_files(path_list *l) {
    named_file *f = (named_file *)xcalloc((size_t)l->count, sizeof *f);
    for (int i = 0; i < l->count; i++) f[i] = (named_file){realpath(l->paths[i], NULL), i};
    qsort(f, (size_t)l->count, sizeof *f, compare_named);   // sorted by file, its first name first
    bool *again = (bool *)xcalloc((size_t)l->count, sizeof *again);
    for (int i = 1; i < l->count; i++)
        again[f[i].index] = f[i].real && f[i - 1].real && strcmp(f[i].real, f[i - 1].real) == 0;
    int kept = 0;
    for (int i = 0; i < l->count; i++) {
        if (again[i]) free(l->paths[i]);
        else l->paths[kept++] = l->paths[i];
    }
    for (int i = 0; i < l->count; i++) free(f[i].real);
    free(f);
    free(again);
    l->count = kept;
}

// A file with other names (hard links): the version 2 file takes this name only (written aside,
// renamed over it), so the others keep the version 1 file and its space. Said, not refused: the
// names are equal shards either way, and each one listed is upgraded in turn.
static void note_hard_links(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || st.st_nlink < 2) return;
    note("shards upgrade: '%s' has %lu names (hard links): the version 2 file takes this one; the other name(s) "
         "keep the version 1 file, and its space, unless upgraded too",
         path, (unsigned long)st.st_nlink);
}

typedef struct {
    int done, total;                     // version 1 shards: written again, and to write
    uint64_t read_bytes, total_bytes;    // of their payloads
    double start, last_note, progress_s;
    bool quiet;
} upgrade_progress;

static void upgrade_note(const upgrade_progress *p, double now) {
    double seconds = now - p->start, rate = seconds > 0 ? (double)p->read_bytes / seconds : 0.0;
    char done[32], total[32], eta[32];
    format_duration(rate > 0 ? (double)(p->total_bytes - min_i64((int64_t)p->read_bytes, (int64_t)p->total_bytes)) / rate
                             : -1.0, eta, sizeof eta);
    note("shards upgrade: %d of %d shards, %s of %s (%.0f%%) at %.1f MiB/s, ETA %s", p->done, p->total,
         format_bytes(p->read_bytes, done, sizeof done), format_bytes(p->total_bytes, total, sizeof total),
         p->total_bytes ? 100.0 * (double)p->read_bytes / (double)p->total_bytes : 100.0, rate / 1048576.0, eta);
}

static void upgrade_read(void *ctx, uint64_t bytes) {
    upgrade_progress *p = (upgrade_progress *)ctx;
    p->read_bytes += bytes;
    double now = wall_seconds();
    if (!p->quiet && now - p->last_note >= p->progress_s) {
        upgrade_note(p, now);
        p->last_note = now;
    }
}

static int shards_upgrade_main(int argc, char **argv) {
    path_list l = {};
    upgrade_progress p = {};
    p.progress_s = 5;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(SHARDS_USAGE, stdout);
            return 0;
        }
        if (strcmp(arg, "--") == 0) {
            while (++i < argc) list_argument(&l, argv[i], "");
            break;
        }
        if (strcmp(arg, "--quiet") == 0) {
            p.quiet = true;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0) {
            list_argument(&l, arg, "");
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        bool config = strncmp(arg, "--config", name_len) == 0 && name_len == 8;
        bool progress = strncmp(arg, "--progress_s", name_len) == 0 && name_len == 12;
        if (!config && !progress) fail("shards upgrade: unknown option '%s' (see train_gpt shards upgrade --help)", arg);
        const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!value) fail("shards upgrade: %.*s needs a value", (int)name_len, arg);
        if (config) {
            list_config(&l, value);
            continue;
        }
        char *end = NULL;
        p.progress_s = strtod(value, &end);
        if (!end || *end || !value[0] || !(p.progress_s >= 0 && p.progress_s <= 1e9))
            fail("shards upgrade: --progress_s must be a number of seconds >= 0, not '%s'", value);
    }
    if (l.count == 0) fail("shards upgrade: no shard given (see train_gpt shards upgrade --help)");
    int named = l.count;
    drop_same_files(&l);
    // Every header first: what there is to do, and its size for the progress lines.
    int current = 0, refused = 0, busy = 0;
    bool *todo = (bool *)xcalloc((size_t)l.count, sizeof *todo);
    char why[1200];
    for (int i = 0; i < l.count; i++) {
        shard_header h;
        if (!shard_read_header(l.paths[i], &h, why, sizeof why)) {
            warn("shards upgrade: refused '%s': %s; left as it is", l.paths[i], why);
            refused++;
        } else if (h.version >= 2) {
            current++;
        } else {
            todo[i] = true;
            p.total++;
            note_hard_links(l.paths[i]);
            p.total_bytes += h.n_tokens * h.token_bytes;
        }
    }
    char bytes[32];
    char twice[96] = "";
    if (named > l.count)
        snprintf(twice, sizeof twice, " (%d name%s of a shard listed before, or a link to one, left out)",
                 named - l.count, named - l.count == 1 ? "" : "s");
    note("shards upgrade: %d shard%s%s: %d of version 1 (%s of tokens) to write again as version 2, %d of version 2 "
         "already (left as they are)%s",
         l.count, l.count == 1 ? "" : "s", twice, p.total, format_bytes(p.total_bytes, bytes, sizeof bytes), current,
         refused ? ", the refused ones above" : "");
    p.start = p.last_note = wall_seconds();
    for (int i = 0; i < l.count; i++) {
        if (!todo[i]) continue;
        shard_header h;
        shard_upgrade_result r = shard_upgrade(l.paths[i], &h, upgrade_read, &p, why, sizeof why);
        if (r == SHARD_UPGRADED) {
            p.done++;
        } else if (r == SHARD_CURRENT) {
            current++;   // another upgrade's, since its header was read
        } else if (r == SHARD_BUSY) {
            note("shards upgrade: '%s': another process is upgrading it; left to it", l.paths[i]);
            busy++;
        } else if (r == SHARD_REFUSED) {
            warn("shards upgrade: refused '%s': %s; left as it is", l.paths[i], why);
            refused++;
        } else {
            fail("shards upgrade: '%s': %s; it is as it was (version 1); %d of the %d version 1 shards were written "
                 "again before it, none after it",
                 l.paths[i], why, p.done, p.total);
        }
    }
    double seconds = wall_seconds() - p.start;
    char duration[32];
    printf("shards upgrade: %d shard%s written again as version 2 (%s of tokens read in %s, %.1f MiB/s), %d of version "
           "2 already, %d refused%s\n",
           p.done, p.done == 1 ? "" : "s", format_bytes(p.read_bytes, bytes, sizeof bytes),
           format_duration(seconds, duration, sizeof duration),
           seconds > 0 ? (double)p.read_bytes / seconds / 1048576.0 : 0.0, current, refused,
           busy ? ", the rest being upgraded by another process" : "");
    for (int i = 0; i < l.count; i++) free(l.paths[i]);
    free(l.paths);
    free(todo);
    if (refused > 0)
        fail("shards upgrade: %d of the %d shards were refused (the warnings above name them) and left as they were",
             refused, l.count);
    return 0;
}

// `train_gpt shards VERB ...`: what is done to token shards that exist (upgrade, for now).
static int shards_main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "upgrade") == 0) return shards_upgrade_main(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(SHARDS_USAGE, stdout);
        return 0;
    }
    fail("shards: %s%s%s (train_gpt shards upgrade PATH...: see train_gpt shards upgrade --help)",
         argc >= 2 ? "unknown command '" : "which command?", argc >= 2 ? argv[1] : "", argc >= 2 ? "'" : "");
}

int main(int argc, char **argv) {
    // Progress lines must reach a SLURM log as they happen, not in 4 KiB bursts.
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) usage_error();
    const char *first = argv[1];
    // prepare uses no BLAS: no need for the kernel check (and its possible restart).
    if (strcmp(first, "prepare") == 0) return prepare_main(argc - 1, argv + 1, &shard_files);
    if (strcmp(first, "relay") == 0) return relay_main(argc - 1, argv + 1);
    if (strcmp(first, "plot") == 0) return plot_main(argc - 1, argv + 1);
    if (strcmp(first, "shards") == 0) return shards_main(argc - 1, argv + 1);
    gemm_fix_cpu_kernels(argv);
    if (strcmp(first, "diloco-tune") == 0) return diloco_tune_main(argc - 1, argv + 1);
    if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0) {
        config_print_help();
        return 0;
    }
    if (strcmp(first, "--version") == 0) {
        printf("train_gpt %s\n", TRAIN_GPT_VERSION);
        return 0;
    }
    bool plan = strcmp(first, "plan") == 0;
    int at = plan ? 2 : 1;
    // --help after the config (train_gpt CONFIG --help, train_gpt plan CONFIG --help): the keys,
    // or plan's options (it once said "--help: missing value").
    if (asks_for_help(argc - at, argv + at)) {
        if (plan) print_plan_usage();
        else config_print_help();
        return 0;
    }
    if (at >= argc) usage_error();
    // A config file is optional when every required key comes from the command line.
    const char *config_path = strncmp(argv[at], "--", 2) == 0 ? NULL : argv[at];
    int rest = config_path ? at + 1 : at;
    int world = 0, gpu_row = -1;
    double link_mbps = 100;
    int keys = argc - rest;
    if (plan) keys = take_plan_options(keys, argv + rest, &world, &gpu_row, &link_mbps);
    train_config cfg;
    config_load(&cfg, config_path, keys, argv + rest);
    int rc = 0;
    if (plan) {
        // --world is the FSDP group (docs/fsdp.md): fsdp_size where that is set, which a
        // different --world contradicts; the job's processes are the group x dp_replicate.
        if (world > 0 && cfg.fsdp_size > 0 && world != cfg.fsdp_size)
            fail("plan: --world %d contradicts fsdp_size %lld: --world is the FSDP group, which fsdp_size sets (the job's "
                 "processes are fsdp_size x dp_replicate); drop one of them",
                 world, (long long)cfg.fsdp_size);
        if (world > 1 && cfg.diloco_replicas > 0 && strcmp(cfg.diloco_transport, "local") == 0)
            fail("plan: --world %d: diloco_transport = local simulates the replicas in one process, unsharded; plan "
                 "the run's own transport (tcp) for a group of %d ranks",
                 world, world);
        diloco_check_config(&cfg);   // what the run would refuse at its start
        int group = cfg.fsdp_size > 0 ? (int)cfg.fsdp_size : world > 0 ? world : 1;
        rc = train_plan(&cfg, group, (int64_t)group * (cfg.dp_replicate > 1 ? cfg.dp_replicate : 1), gpu_row, link_mbps);
    }
    else if (cfg.diloco_replicas > 0 && strcmp(cfg.diloco_transport, "local") == 0) train_local(&cfg, false);
    else rc = train_run(&cfg);
    config_free(&cfg);
    return rc;
}

#endif  // TESTING
