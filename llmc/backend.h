// llmc/backend.h — the step interface of both backends: the fp32 CPU backend (cpu/backend.c)
// and the GPU model (the GPU section of train_gpt.cu). The training loop calls it once per
// concern and never asks which backend it has.
//
// The host keeps the run's state that checkpoints and DiLoCo need: the fp32 weights and
// AdamW's moments in the parameter table's flat layout. A backend works on its own copy
// (the GPU's memory) or, on the CPU, directly on those host buffers (upload and download
// then copy nothing). A step, as the loop drives it:
//   for each micro-batch:   backend_forward_backward(b, inputs, targets, B, T, grad_scale, z_loss)
//   then:                   r = backend_step(b, lr, rows, cfg, &limits)
// backend_step computes the global gradient norm, applies the outlier guard (a NaN/Inf loss
// or norm skips the update; so does a loss or norm above the spike guard's limits,
// llmc/guard.h), clips, runs AdamW and zeroes the gradients for the next step.
// Around steps: backend_download before a checkpoint or DiLoCo's outer step,
// backend_upload_params after the outer step, backend_forward_loss for validation,
// backend_forward_last_logits for samples.
#ifndef TRAIN_GPT_BACKEND_H
#define TRAIN_GPT_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "llmc/config.h"
#include "llmc/guard.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double ce_sum;      // Σ cross-entropy over the rows (nats)
    double lse_sq_sum;  // Σ logsumexp(logits)² over the rows
    int64_t rows;
} loss_sums;

// What one optimizer step did.
typedef struct {
    double loss;        // mean cross-entropy over the step's rows (nats)
    double z_loss;      // z_loss · mean(lse²)
    double grad_norm;   // global norm before clipping
    bool skipped;       // the update was not applied: a NaN/Inf, or a spike
    bool spike;         // skipped because the loss or norm is above the step's limits
    int64_t adam_step;  // AdamW's t after the step (unchanged if skipped)
} step_result;

typedef struct backend backend;

typedef struct {
    // Host → backend: weights (required), moments (NULL = zero) and AdamW's t.
    void (*upload)(backend *b, const float *params, const float *exp_avg, const float *exp_avg_sq,
                   int64_t adam_step);
    // Replaces only the weights (DiLoCo's outer step), keeping moments and t.
    void (*upload_params)(backend *b, const float *params);
    // Backend → host after all queued work; any pointer may be NULL.
    void (*download)(backend *b, float *params, float *exp_avg, float *exp_avg_sq);
    // One micro-batch, inputs and targets (B,T): adds the gradients of
    // grad_scale · Σ_rows (ce + z_loss·lse²) and the loss sums to the step's.
    void (*forward_backward)(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                             float grad_scale, float z_loss);
    // Ends the step (see above). rows = tokens of the step (B·T·grad_accum); a step whose
    // loss or norm exceeds limits is skipped (r.spike).
    step_result (*step)(backend *b, double lr, int64_t rows, const train_config *cfg, const step_limits *limits);
    // Forward only: the loss sums of a micro-batch (validation).
    loss_sums (*forward_loss)(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T);
    // Forward only: the logits (V) of the last position of one sequence (1,T) (samples).
    void (*forward_last_logits)(backend *b, const int32_t *inputs, int64_t T, float *logits);
    // Fault injection (TRAIN_GPT_FAULT=nan_grad / grad_spike): the first gradient element
    // becomes value (NaN, or a finite spike).
    void (*poison_grad)(backend *b, float value);
    // Memory the backend holds on its device beyond the host's buffers, in bytes (banner).
    int64_t (*device_bytes)(const backend *b);
    void (*destroy)(backend *b);
} backend_ops;

struct backend {
    const backend_ops *ops;
    const char *name;   // "cpu" or "cuda"
    // FSDP: the most bytes of gathered units (whole layers) held at once so far; 0 unsharded.
    int64_t gathered_peak_bytes;
    int64_t grads_peak_bytes;   // FSDP: the most bytes of whole-unit gradients held at once
    // The most bytes of activations (and their scratch) held at once so far, as the backend's
    // allocator counts them; 0 where a backend does not count them yet (CUDA).
    int64_t activation_peak_bytes;
    double comm_wait_s;   // FSDP: seconds spent waiting for collectives (not hidden by overlap)
    // GPU: the bytes of this rank's weights, gradients, moments and bf16 copy on the device
    // (the pieces under FSDP); 0 on the CPU.
    int64_t device_state_bytes;
};

static inline void backend_upload(backend *b, const float *params, const float *exp_avg, const float *exp_avg_sq,
                                  int64_t adam_step) {
    b->ops->upload(b, params, exp_avg, exp_avg_sq, adam_step);
}
static inline void backend_upload_params(backend *b, const float *params) { b->ops->upload_params(b, params); }
static inline void backend_download(backend *b, float *params, float *exp_avg, float *exp_avg_sq) {
    b->ops->download(b, params, exp_avg, exp_avg_sq);
}
static inline void backend_forward_backward(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B,
                                            int64_t T, float grad_scale, float z_loss) {
    b->ops->forward_backward(b, inputs, targets, B, T, grad_scale, z_loss);
}
static inline step_result backend_step(backend *b, double lr, int64_t rows, const train_config *cfg,
                                       const step_limits *limits) {
    return b->ops->step(b, lr, rows, cfg, limits);
}
static inline loss_sums backend_forward_loss(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B,
                                             int64_t T) {
    return b->ops->forward_loss(b, inputs, targets, B, T);
}
static inline void backend_forward_last_logits(backend *b, const int32_t *inputs, int64_t T, float *logits) {
    b->ops->forward_last_logits(b, inputs, T, logits);
}
static inline void backend_poison_grad(backend *b, float value) { b->ops->poison_grad(b, value); }
static inline int64_t backend_device_bytes(const backend *b) { return b->ops->device_bytes(b); }
static inline void backend_free(backend *b) {
    if (b) b->ops->destroy(b);
}

#ifdef __cplusplus
}
#endif

#endif
