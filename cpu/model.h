// cpu/model.h — the model's forward and backward pass on the CPU in fp32, assembled from
// cpu_ops over the parameter table.
//
// A cpu_model owns the activations for micro-batches of up to B × T tokens (any smaller
// B', T' can be run through the same buffers: validation, sampling). Parameters and
// gradients are flat buffers in the parameter table's layout, owned by the caller.
//
// The classifier never materializes B·T·V logits: it runs over chunks of rows, turning
// each chunk of logits into its gradient in place and folding it into the gradients of
// the final norm's output and of the head weights before the next chunk.
#ifndef TRAIN_GPT_CPU_MODEL_H
#define TRAIN_GPT_CPU_MODEL_H

#include <stdint.h>

#include "llmc/backend.h"
#include "llmc/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_model cpu_model;

cpu_model *cpu_model_create(const param_table *t, int64_t B, int64_t T);
void cpu_model_free(cpu_model *m);
// Activation memory of the model in bytes (for the start-up banner).
int64_t cpu_model_activation_bytes(const cpu_model *m);
// The same figure for a model that is not allocated (memory plans).
int64_t cpu_model_plan_bytes(const param_table *t, int64_t B, int64_t T);

// Forward and backward of one micro-batch: inputs, targets (B,T). Gradients of
// grad_scale · Σ_rows (ce + z_loss·lse²) are ADDED to grads. Returns the loss sums.
loss_sums cpu_forward_backward(cpu_model *m, const float *params, float *grads, const int32_t *inputs,
                               const int32_t *targets, int64_t B, int64_t T, float grad_scale, float z_loss);
// Forward only: the loss sums of a micro-batch.
loss_sums cpu_forward_loss(cpu_model *m, const float *params, const int32_t *inputs, const int32_t *targets,
                           int64_t B, int64_t T);
// Forward only: all logits (B·T, V) into `logits` (tests, sampling).
void cpu_forward_logits(cpu_model *m, const float *params, const int32_t *inputs, int64_t B, int64_t T,
                        float *logits);

// Forward only: the logits (V) of the last position of one sequence (1,T) (sampling).
void cpu_forward_last_logits(cpu_model *m, const float *params, const int32_t *inputs, int64_t T, float *logits);

// The CPU backend (llmc/backend.h) over a cpu_model for micro-batches of up to B × T. It
// works in place on the caller's host buffers (params, exp_avg, exp_avg_sq: numel floats
// each, in the table's layout), so upload and download copy nothing when given them; it
// owns the gradients.
backend *cpu_backend_create(const param_table *t, int64_t B, int64_t T, float *params, float *exp_avg,
                            float *exp_avg_sq);

#ifdef __cplusplus
}
#endif

#endif
