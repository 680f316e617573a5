// llmc/plan.h — what one rank of a job holds in memory: the per-rank plan that
// `train_gpt plan` prints for a world size and a GPU type, and that a run prints next to what
// it measured (docs/fsdp.md "Memory per rank").
//
// A rank of an FSDP group of N ranks holds its pieces of every unit (llmc/shard.h): fp32
// weights, gradients and AdamW's two moments, 16 bytes per value of its ⌈unit/N⌉ pieces. On
// top, whole units while they are in use: the weights gathered for a layer's forward or
// backward (fp32 on the CPU, bf16 on a GPU), the next layer's on their way (fsdp_prefetch),
// every layer's from the forward to the backward when fsdp_reshard_after_forward = 0, and a
// unit's gradient (fp32) before and while it is reduce-scattered. The activations of a
// micro-batch do not shrink with N: the backend that runs them sizes them (cpu/model.c's plan,
// the CUDA model's sizing), and the caller passes that figure in. One rank (N = 1) is the
// one-process layout: the weights in place, no gathered units — except the GPU's bf16 copy of
// the whole model, which the matmuls read.
#ifndef TRAIN_GPT_PLAN_H
#define TRAIN_GPT_PLAN_H

#include "llmc/params.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int ranks;          // N: the ranks that shard one copy (fsdp_size)
    bool reshard;       // fsdp_reshard_after_forward
    bool prefetch;      // fsdp_prefetch
    bool gpu;           // gathered weights in bf16 (a GPU), else fp32 (the CPU backend)
} plan_split;

typedef struct {
    int64_t weights, grads, optimizer;   // this rank's pieces: fp32 weights, gradients, AdamW's m and v
    int64_t gathered_weights;            // whole units' weights held at once, at the peak (a bound)
    int64_t gathered_grads;              // whole units' gradients and their reduce-scatter's buffers (a bound)
    int64_t activations;                 // the backend's own figure (activations, scratch, workspace)
    int64_t total;
} rank_memory;

// The plan for one rank of s.ranks; activation_bytes is the backend's figure for one micro-batch.
rank_memory plan_rank_memory(const param_table *t, plan_split s, int64_t activation_bytes);

// One line: "4.21 GiB = 1.02 weights + 1.02 grads + ... + 0.03 activations".
void plan_describe(const rank_memory *m, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif

#endif
