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
//
// Activation recomputation (issue #18, llmc/config.h's recompute_setting), per layer:
//   none       keeps every activation the backward reads;
//   selective  keeps the residual stream after attention and what the matmuls and the
//              attention core produce (q and k before QK-norm and RoPE, v, the attention
//              output and its log-sum-exp, SwiGLU's gate and up) and recomputes, right
//              before the layer's backward, the cheap rest: both RMSNorms, QK-norm, RoPE and
//              SwiGLU's activation — no matmul, no attention;
//   full       keeps only the layer's input (the residual stream entering it) and runs the
//              layer's forward again right before its backward (all but the last product,
//              whose output the backward does not read).
// What a layer recomputes goes to one layer's worth of scratch shared by all layers; the
// recomputation calls the forward's kernels on the same inputs, so gradients are bit for bit
// those of none. The last recomputed layer of the forward is still in the scratch when the
// backward reaches it and is not computed again.
#ifndef TRAIN_GPT_CPU_MODEL_H
#define TRAIN_GPT_CPU_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "llmc/backend.h"
#include "llmc/params.h"
#include "llmc/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_model cpu_model;

// No recomputation (recompute = none).
cpu_model *cpu_model_create(const param_table *t, int64_t B, int64_t T);
cpu_model *cpu_model_create_recompute(const param_table *t, int64_t B, int64_t T, recompute_setting recompute);
void cpu_model_free(cpu_model *m);
// The model's activation memory as its allocator counts it: the bytes of activation buffers
// held now, and the most held at once since create (the CPU model allocates them all at
// create, so the two agree; the passes allocate nothing else but the attention kernels'
// per-thread tiles, a few (D + 64)·T floats per thread, not counted).
int64_t cpu_model_activation_bytes(const cpu_model *m);
int64_t cpu_model_activation_peak_bytes(const cpu_model *m);
// The memory plan's activation term: the bytes a model for micro-batches of B × T tokens with
// this recomputation allocates, by arithmetic over the model's dimensions (a formula of its
// own, not a dry run of the allocation: test/test_recompute.c checks one against the other).
int64_t cpu_model_plan_bytes(const param_table *t, int64_t B, int64_t T, recompute_setting recompute);
// The part of that figure that is the same in every mode (the plan's "workspace"): the
// backward's scratch, a chunk of logits, the RoPE tables, the tokens' positions. The rest is
// what the layers keep for the backward (their inputs, their activations, the recompute scratch).
int64_t cpu_model_plan_workspace_bytes(const param_table *t, int64_t B, int64_t T);

// Where the passes find a unit's weights and leave its gradient (units: llmc/shard.h). The
// whole-model calls below use the caller's flat buffers in place; the FSDP backend
// (cpu/backend.c) gathers a unit's pieces before it is used and reduce-scatters its
// gradient after. Weights and gradients of a unit are indexed as in the flat layout, from
// the unit's first value: tensor p at base + (p->offset − unit start).
typedef struct cpu_units cpu_units;
struct cpu_units {
    // The unit's weights, whole, until the matching release (acquires nest: a reference count).
    const float *(*acquire)(cpu_units *u, int unit);
    // A hint: the unit is acquired next (its gathering can start now).
    void (*prefetch)(cpu_units *u, int unit);
    // One acquire less; backward_follows: a backward pass will want the weights again.
    void (*release)(cpu_units *u, int unit, bool backward_follows);
    // The buffer the unit's gradient is added to (zeroed when first asked for in a pass), and
    // the end of the pass's additions to it.
    float *(*grads)(cpu_units *u, int unit);
    void (*grads_done)(cpu_units *u, int unit);
};

// The passes below over units (the FSDP backend's): the same arithmetic in the same order.
loss_sums cpu_forward_backward_units(cpu_model *m, cpu_units *u, const int32_t *inputs, const int32_t *targets,
                                     int64_t B, int64_t T, float grad_scale, float z_loss);
loss_sums cpu_forward_loss_units(cpu_model *m, cpu_units *u, const int32_t *inputs, const int32_t *targets,
                                 int64_t B, int64_t T);
void cpu_forward_last_logits_units(cpu_model *m, cpu_units *u, const int32_t *inputs, int64_t T, float *logits);

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

// The same backend for one rank of an FSDP group (group: its ranks; copies: the HSDP copies
// this rank's pieces are all-reduced with, NULL or a group of one for none). params,
// exp_avg and exp_avg_sq are this rank's pieces (llmc/shard.h: local_numel floats each, the
// map of comm_rank(group) of comm_size(group)). prefetch: start gathering the next unit
// while the current one computes. recompute: what the backward recomputes (above); a
// recomputed layer's forward runs inside the backward's acquire of the layer's unit, so it
// uses the weights gathered for the backward (gathered again after a reshard, or kept with
// reshard_after_forward = false): no gather more than without recomputation. A group of
// one with RECOMPUTE_OFF is cpu_backend_create.
backend *cpu_backend_create_sharded(const param_table *t, comm *group, comm *copies, bool reshard_after_forward,
                                    bool prefetch, recompute_setting recompute, int64_t B, int64_t T, float *params,
                                    float *exp_avg, float *exp_avg_sq);


#ifdef __cplusplus
}
#endif

#endif
