// cuda/backend.h — the model on one GPU, for the training loop (C API; cuda/model.cu).
//
// The mirror of cpu/model.h + llmc/optim.h's step: the model's parameters, gradients and AdamW
// moments live on the GPU for the whole run (fp32 master weights and moments, a bf16 copy
// of the weights for the matmuls, fp32 gradients accumulated over micro-batches), and the
// host only feeds token batches in and reads scalars and checkpoints out.
//
// A training step, as train.c drives it (docs/cuda.md has the exact wiring):
//   for each micro-batch:  cuda_forward_backward(m, inputs, targets, B, T, grad_scale, z_loss)
//   then:                  cuda_step(m, step, lr, rows, cfg)
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
#ifndef TRAIN_GPT_CUDA_BACKEND_H
#define TRAIN_GPT_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>
#include <stdint.h>

#include "llmc/backend.h"
#include "llmc/config.h"
#include "llmc/params.h"

typedef struct cuda_model cuda_model;

// The GPU backend (llmc/backend.h) over a cuda_model for micro-batches of up to B × T.
backend *cuda_backend_create(const param_table *t, int64_t B, int64_t T);

// What one step did, read back from the GPU by cuda_step_poll.
typedef struct {
    int64_t step;         // the step number passed to cuda_step (1-based steps done, as train.c counts)
    double loss;          // mean cross-entropy over the step's rows (nats)
    double z_loss;        // z_loss · mean(lse²)
    double grad_norm;     // global norm before clipping
    double clip_coef;     // factor applied to the gradients (1 = not clipped)
    double ce_sum, lse_sq_sum;
    int64_t rows;
    int64_t adam_step;    // AdamW's t after the step (unchanged if skipped)
    bool skipped;         // the outlier guard skipped the update
    double gpu_ms;        // GPU time from the step's first micro-batch to the end of AdamW
} cuda_step_result;

// Allocates everything for micro-batches of up to B × T tokens on the current GPU (device
// 0 unless the caller chose another with the CUDA runtime). Gradients start at zero; the
// parameters are undefined until cuda_model_upload. Fatal (with a HINT) if memory runs out.
cuda_model *cuda_model_create(const param_table *t, int64_t B, int64_t T);
void cuda_model_free(cuda_model *m);
// Device memory the model allocated, in bytes (for the start-up banner).
int64_t cuda_model_device_bytes(const cuda_model *m);
// Bytes in use on the current GPU by every allocation of this process and its CUDA context
// (cudaMemGetInfo: total − free; other processes on the GPU count too). 0 without a GPU.
int64_t cuda_device_used_bytes(void);
// The same figure without a GPU (memory plans, `train_gpt plan`).
int64_t cuda_model_plan_bytes(const param_table *t, int64_t B, int64_t T);

// Host → GPU: fp32 params (required), moments (NULL = zero) in the table's flat layout, and
// AdamW's t (the checkpoint state's adam_step; 0 for a fresh run). Synchronous.
void cuda_model_upload(cuda_model *m, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step);
// Replaces only the weights (DiLoCo's outer step), keeping moments and t. Synchronous.
void cuda_model_upload_params(cuda_model *m, const float *params);
// GPU → host after all queued work: any pointer may be NULL. Synchronous.
void cuda_model_download(cuda_model *m, float *params, float *exp_avg, float *exp_avg_sq);
// The gradients accumulated so far in this step (tests). Synchronous.
void cuda_model_download_grads(cuda_model *m, float *grads);
void cuda_model_zero_grads(cuda_model *m);
// Fault injection (TRAIN_GPT_FAULT=nan_grad): the first gradient element becomes NaN.
void cuda_model_poison_grad(cuda_model *m);

// One micro-batch: inputs, targets (B,T) host arrays, B ≤ the model's B, T ≤ its T.
// Gradients of grad_scale · Σ_rows (ce + z_loss·lse²) are added to the GPU's gradients and
// the loss sums to the step's. Token ids outside the vocabulary are a fatal error.
void cuda_forward_backward(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                           float grad_scale, float z_loss);
// The loss sums accumulated so far in this step (tests). Synchronous.
loss_sums cuda_step_loss_so_far(cuda_model *m);
// Ends the step: global norm, guard, clip to cfg->grad_clip, AdamW at learning rate lr
// with cfg's betas, eps and weight decay; zeroes the gradients; queues the step's scalars
// for cuda_step_poll. rows = tokens of the step (B·T·grad_accum). `step` is only echoed
// back in the result. At most 8 steps may wait unpolled.
void cuda_step(cuda_model *m, int64_t step, double lr, int64_t rows, const train_config *cfg);
// The oldest step not yet returned: true and *r filled, or false if none is queued (or,
// with wait = false, the oldest has not finished on the GPU yet).
bool cuda_step_poll(cuda_model *m, cuda_step_result *r, bool wait);

// Forward only: the loss sums of a micro-batch (validation). Synchronous.
loss_sums cuda_forward_loss(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T);
// Forward only: all logits (B·T, V) fp32 into a host array (tests). Synchronous.
void cuda_forward_logits(cuda_model *m, const int32_t *inputs, int64_t B, int64_t T, float *logits);
// Forward only: the logits (V) of the last position of one sequence (1,T) (sampling). Synchronous.
void cuda_forward_last_logits(cuda_model *m, const int32_t *inputs, int64_t T, float *logits);

#ifdef __cplusplus
}
#endif

#endif
