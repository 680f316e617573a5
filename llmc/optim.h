// llmc/optim.h — the optimizer side of a step: WSD learning rate, global gradient norm,
// clipping, and AdamW, all iterating over the parameter table.
//
// AdamW follows torch.optim.AdamW (PyTorch 1.13 single-tensor path) exactly:
//   p ← p·(1 − lr·wd)                      (only where the table says decay)
//   m ← β1·m + (1−β1)·g ;  v ← β2·v + (1−β2)·g²
//   p ← p − (lr / (1−β1^t)) · m / (√v / √(1−β2^t) + ε)
// with the scalar factors computed in double and the element-wise math in fp32.
// Clipping follows torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6),
// applied when coef < 1.
#ifndef TRAIN_GPT_OPTIM_H
#define TRAIN_GPT_OPTIM_H

#include <stdint.h>

#include "llmc/config.h"
#include "llmc/params.h"
#include "llmc/shard.h"

#ifdef __cplusplus
extern "C" {
#endif

// decay_start_step (llmc/config.h): the first step of the schedule's decay phase.

// WSD schedule at 0-based step s of max_steps (docs/model.md gives the formula).
// Steps at or past max_steps get the schedule's last value, min_lr_frac · lr.
double lr_at_step(const train_config *cfg, int64_t step);

// Global L2 norm of all gradients, summed in double over fixed blocks in a fixed order:
// the same bits on any thread count. Inf/NaN propagate (the outlier guard needs them).
double grad_global_norm(const float *grads, int64_t count);
// The square of that norm before the root (a rank's share of an FSDP group's norm²).
double grad_sum_squares(const float *grads, int64_t count);
// Scales grads by max_norm / (norm + 1e-6) when that is below 1; returns the factor used.
double grad_clip(float *grads, int64_t count, double norm, double max_norm);

// One AdamW update of every tensor; adam_step is t, 1-based.
void adamw_update(const param_table *t, float *params, const float *grads, float *m, float *v, int64_t adam_step,
                  double lr, const train_config *cfg);

// The same update of this rank's part of the model, over local buffers (llmc/shard.h): the
// same element-wise arithmetic, so the values it writes are those adamw_update writes.
void adamw_update_shard(const shard_map *s, float *params, const float *grads, float *m, float *v,
                        int64_t adam_step, double lr, const train_config *cfg);

// Clip to cfg->grad_clip by the given global norm, advance *adam_step and apply AdamW:
// the update of one step once its gradients are summed (the caller has checked that loss
// and norm are finite).
void optimizer_apply(const param_table *t, float *params, float *grads, float *m, float *v, int64_t *adam_step,
                     double grad_norm, double lr, const train_config *cfg);

// The same over local buffers (s->local_numel floats; grad_norm is the group's).
void optimizer_apply_shard(const shard_map *s, float *params, float *grads, float *m, float *v, int64_t *adam_step,
                           double grad_norm, double lr, const train_config *cfg);

// True if every value is finite (checked before anything is written to a checkpoint).
bool all_finite(const float *x, int64_t count);

#ifdef __cplusplus
}
#endif

#endif
