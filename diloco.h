// diloco.h — the DiLoCo outer loop, as a small API the training loop calls at step
// boundaries (docs/diloco.md has the whole story).
//
// Each of M replicas trains on its own 1/M of the data. Every H = diloco_inner_steps inner
// steps (and after the last step) it forms its outer gradient Δᵢ = θ − θᵢ, where θ is the
// global weights of the last outer step and θᵢ its own weights now. The replicas exchange
// their Δᵢ (net/transport.h), average those that arrived — never counting absent replicas —
// and all apply the same outer step:
//     Δ   = mean over contributors of Δᵢ
//     m   ← μ·m + Δ
//     θ   ← θ − lr·(Δ + μ·m)        (heavy-ball with diloco_nesterov = 0: θ ← θ − lr·m)
//     θᵢ  ← θ                       (AdamW moments stay local)
// as torch.optim.SGD(nesterov=True) would with Δ as the gradient; μ may ramp up over
// diloco_momentum_warmup outer steps. The defaults (lr 1, μ 0) make it θ ← mean θᵢ. The arithmetic is done
// per element in double and stored in fp32; every replica decodes the same bytes in the
// same order, so θ and m are bit-identical everywhere. A hash of θ goes into metrics.jsonl
// each outer step.
//
// How Δᵢ travels (diloco_quant): int8 / int4 send the blockwise-quantized Δᵢ (llmc/quant.h),
// optionally with error feedback. `none` sends θᵢ itself in fp32 — the same 4 bytes per
// parameter — and Δ = θ − mean(θᵢ) is formed in double on arrival; that is the same Δ, but
// exact: with M = 1, lr 1 and momentum 0 the outer step gives back θ₁ bit for bit, so such
// a run is byte-identical to one without DiLoCo.
//
// A replica that is behind (started late, restarted from an older checkpoint, or dropped
// from a round) joins at the next outer boundary by receiving the group's state from a
// donor: θ, m, the outer step and the inner step count; it then continues bit-identical to
// the others, with its own AdamW moments and data.
#ifndef TRAIN_GPT_DILOCO_H
#define TRAIN_GPT_DILOCO_H

#include <stdbool.h>
#include <stdint.h>

#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "dataloader.h"
#include "llmc/metrics.h"
#include "llmc/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct diloco diloco;

// Opens the transport and allocates the outer state. NULL when diloco_replicas = 0.
// Fatal (one line) on a transport or secret problem.
diloco *diloco_open(const train_config *cfg, const param_table *t, metrics_log *log);

// This replica's id and the number of replicas (for the data split).
int diloco_replica_id(const diloco *d);
int diloco_replicas(const diloco *d);

// The outer state, for checkpoints: b->outer_* point into d.
void diloco_attach_buffers(diloco *d, model_buffers *b);

// After the checkpoint (or fresh init) is loaded. fresh: no checkpoint was loaded, so θ is
// set to the freshly initialized weights. Joins the group; if the group is elsewhere,
// receives its state and overwrites params, θ, m, the step counters and the data position.
void diloco_join(diloco *d, float *params, train_state *st, dataloader *train, bool fresh);

// Whether the outer step is due after inner step `step` (1-based count of steps done).
bool diloco_outer_step_due(const diloco *d, int64_t step, int64_t max_steps);

// The outer step: exchange, average, Nesterov, params ← θ. Writes the metrics line and one
// progress line. May rejoin (overwriting params and state) when this replica was dropped.
void diloco_outer_step(diloco *d, float *params, train_state *st, dataloader *train);

// diloco_transport = local: the M replicas are simulated in this process (train_gpt.cu's
// train_local; `train_gpt diloco-tune`). diloco_start_local sets θ ← params (every replica
// starts from them) with zero momentum and residuals; diloco_outer_step_local encodes every
// replica's contribution as a transport would carry it, averages them in ascending replica
// id and applies the outer step — the same code and the same bits as M processes — then
// sets every params[i] ← θ. No bytes move: `bytes_sent` is what each replica would send.
void diloco_start_local(diloco *d, const float *params);
void diloco_outer_step_local(diloco *d, float *const *params, train_state *st);
// No progress line per outer step (metrics.jsonl still gets it).
void diloco_set_quiet(diloco *d, bool quiet);

// Whether to stop now: tcp: local_stop; mpi: whether any rank wants to (all agree).
bool diloco_agree_stop(diloco *d, bool local_stop);

// Says goodbye to the group (after the final checkpoint at a stop signal or at the end).
void diloco_leave(diloco *d);
void diloco_close(diloco *d);

// The XXH64 of n fp32 values' bytes (the param_hash of metrics.jsonl).
uint64_t diloco_hash(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
