// diloco.h — the DiLoCo outer loop, as a small API the training loop calls at step
// boundaries (docs/diloco.md has the whole story).
//
// Each of M replicas trains on its own 1/M of the data. Every H = diloco_inner_steps inner
// steps (every H_d = diloco_decay_inner_steps in the decay phase, if set; and after the last
// step) it forms its outer gradient Δᵢ = θ − θᵢ, where θ is the global weights of the last
// outer step and θᵢ its own weights now. The replicas exchange
// their Δᵢ (net/transport.h), average those that arrived — never counting absent replicas —
// and all apply the same outer step:
//     Δ   = mean over contributors of Δᵢ
//     m   ← μ·m + Δ
//     θ   ← θ − lr·(Δ + μ·m)        (heavy-ball with diloco_nesterov = 0: θ ← θ − lr·m)
//     θᵢ  ← θ                       (AdamW moments stay local)
// as torch.optim.SGD(nesterov=True) would with Δ as the gradient; μ may ramp up over
// diloco_momentum_warmup outer steps, and with diloco_plain_in_decay the outer steps landed in
// the inner schedule's decay phase use lr 1, μ 0. lr 1, μ 0 make it θ ← mean θᵢ: the
// defaults (auto, llmc/config.c) for a run of fewer than DILOCO_MOMENTUM_ROUNDS outer steps
// and for 2 replicas, μ 0.9 at lr 0.2 with plain averaging in the decay for a longer run of 3+
// replicas; a longer run also syncs every H / 4 steps in the decay (diloco_decay_inner_steps).
// The arithmetic is done per element in double and stored in fp32; every replica decodes the
// same bytes in the same order, so θ and m are bit-identical everywhere. A hash of θ goes into
// metrics.jsonl each outer step.
//
// How Δᵢ travels (diloco_quant): int8 / int4 / int2 send the blockwise-quantized Δᵢ
// (llmc/quant.h), optionally with error feedback; with diloco_topk < 1 only the largest values
// of every block, with their indices (error feedback required: the rest waits in the
// residual), and the mean comes back dense. `none` sends θᵢ itself in fp32 — the same 4 bytes per
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

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "llmc/checkpoint.h"
#include "llmc/comm.h"
#include "llmc/config.h"
#include "dataloader.h"
#include "llmc/metrics.h"
#include "llmc/params.h"
#include "llmc/shard.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct diloco diloco;

// Opens the transport and allocates the outer state. NULL when diloco_replicas = 0.
// Fatal (one line) on a transport or secret problem.
//
// shard: the pieces of the model this process holds (llmc/shard.h; the whole model for a
// replica of one process); group: the replica's ranks (NULL for one process). A replica of N
// ranks keeps θ, m and the residual sharded like the weights: every buffer here and every
// params passed in is the rank's local layout (shard->local_numel values). Rank j exchanges
// its pieces with rank j of the other replicas over its own tcp connection, to the hub at the
// rendezvous port + j (`train_gpt relay --shards N`); the ranks agree after every join and
// every round, so the replica moves as one (docs/fsdp.md#diloco-over-sharded-replicas). Every
// call below is then a collective of the replica's ranks. stop: the caller's stop request (its
// signal handler's flag, or NULL): a join the hub holds returns when it is set
// (diloco_join_stopped). data: the train data this replica reads (NULL: none to compare), part
// of the run's fingerprint, since replicas split the same rows (dataloader.h): a replica whose
// copy of the shards differs would read rows another reads and miss others.
// The DiLoCo rules that need no file nor peer, said by `train_gpt plan` and by a run before
// out_dir is touched; fatal with one line. The tcp hub list (transport_tcp_check_rendezvous),
// and the payload's chunks (quant_segment_values' segments, one chunk each) against the
// transport: under the tcp wire's least chunk (WIRE_MIN_CHUNK_BYTES: a sparse codec of few
// values per large block, naming diloco_topk), or, over mpi, the replicas' chunks of a segment
// past MPI's int counts (naming diloco_quant_block).
void diloco_check_config(const train_config *cfg);
diloco *diloco_open(const train_config *cfg, const shard_map *shard, const data_identity *data, comm *group, metrics_log *log,
                    const volatile sig_atomic_t *stop);

// This replica's id and the number of replicas (for the data split).
int diloco_replica_id(const diloco *d);
int diloco_replicas(const diloco *d);

// The outer state, for checkpoints: b->outer_* point into d.
void diloco_attach_buffers(diloco *d, model_buffers *b);

// After the checkpoint (or fresh init) is loaded. fresh: no checkpoint was loaded, so θ is
// set to the freshly initialized weights. Joins the group; if the group is elsewhere,
// receives its state and overwrites params, θ, m, the step counters and the data position.
void diloco_join(diloco *d, float *params, train_state *st, dataloader *train, bool fresh);

// Whether the run is over without this replica (tcp): at its join or a rejoin, the hub had no
// member left and a replica had left having finished the run (JOIN_FINISHED). The replica
// then stops (train_gpt.cu): there is no group to train with, and the final weights are in
// the finished replica's checkpoint. Agreed by a sharded replica's ranks.
bool diloco_group_over(const diloco *d);

// Whether a join or rejoin returned because the stop request was set while the hub held it:
// the replica is not in the group (its own weights are as they were) and stops.
bool diloco_join_stopped(const diloco *d);

// Whether diloco_join took the group's state at max_steps: the replica joined during or after
// the group's final syncs and trains no step. Its next outer work (diloco_after_step at
// max_steps) takes part in the final syncs still to come, with no work of its own (none left:
// it does nothing); it then holds the group's final θ in params and ends the run as the
// replicas that finished it do (docs/diloco.md#membership-and-faults-tcp).
bool diloco_joined_at_end(const diloco *d);
// Whether some fragment's final sync did not apply on this replica (a rank of it): its weights
// there are θ as of the last outer step it applied, not the group's final ones
// (diloco_final_theta event).
bool diloco_final_incomplete(const diloco *d);

// The span of this rank's local values that the last diloco_join, diloco_after_step or
// diloco_settle wrote into params (numel 0: none): one fragment's after a streaming merge or
// landing, everything after taking the group's state. HSDP's other copies receive only it.
void diloco_changed_range(const diloco *d, int64_t *offset, int64_t *numel);

// A replica that takes the group's state continues its data where a replica that had trained
// all along to st->step would be: st->data, its position at from_step, moves by the steps
// between (× grad_accum), so that what it read before joining stays behind it (init_from's
// warm-up rows, a restart's own steps); seeks train there and records it in st->data. (HSDP's
// other copies do the same for their own rows when the first copy's rank rejoined: train_gpt.cu.)
void diloco_seek_data(const train_config *cfg, dataloader *train, train_state *st, int64_t from_step);

// Streaming (docs/diloco.md#streaming): with diloco_fragments P > 1 the model is synced in
// P fragments of whole layers, fragment p after inner steps s with s % H = ⌊(p+1)·H/P⌋ % H,
// each its own round of the transport (its own outer step number, quantization, error
// feedback). With diloco_overlap_steps τ > 0 the exchange runs on a second thread while τ
// inner steps go on; then the outer step is applied to θ and m exactly as above, and the
// fragment's local weights merge: θᵢ ← α·θᵢ + (1 − α)·θ (diloco_merge_alpha). After the last
// step every fragment syncs once more, blocking, so every replica ends with θ. P = 1, τ = 0
// is classic DiLoCo, bit for bit.

// Whether diloco_after_step has work after inner step st->step (the caller then hands it the
// host weights), and the next step after st->step at which it will (max_steps at most).
bool diloco_due(const diloco *d, const train_state *st, int64_t max_steps);
// The replica finished inner step `step` (every step): a state this replica sends meanwhile
// says how far it got (a joiner skips those steps).
void diloco_stepped(diloco *d, int64_t step);
int64_t diloco_next_due(const diloco *d, const train_state *st, int64_t max_steps);

// diloco_sync_every_s = T > 0: whether this replica, done with the inner steps of its phase
// (a sync is due after st->step), should take one more inner step first — T has not passed
// since the phase began. The caller then trains one step that does not advance st->step (at the
// learning rate of the phase's last step) and calls diloco_count_extra_step; the contribution
// then counts H + extra inner steps and their tokens. A collective of a sharded replica's ranks.
// `stop`: this rank must stop (a signal, the walltime guard): no more extra steps on any rank of
// the replica, whatever their clocks say.
bool diloco_wants_extra_step(diloco *d, const train_state *st, int64_t max_steps, bool stop);
void diloco_count_extra_step(diloco *d);

// After inner step st->step: lands the fragment in flight when its τ steps are done, merges
// it, and begins the fragment due now (at max_steps: the final sync of every fragment).
// params: this replica's weights (n_params = 1), or the M simulated replicas' (local). Writes
// the metrics line and a progress line per outer step. Returns whether params changed (the
// caller uploads them); *stall_s (may be NULL) is the time spent here, when no inner step ran.
// A dropped replica rejoins here, which may move st->step to the group's.
bool diloco_after_step(diloco *d, float *const *params, int n_params, train_state *st, dataloader *train,
                       int64_t max_steps, double *stall_s);

// Before a checkpoint: waits for the fragment in flight and applies its outer step to θ and m,
// so the checkpoint holds no half-done exchange; its merge stays due at st->merge_step (saved
// in state.json). Returns whether params changed (only when this replica had to rejoin).
bool diloco_settle(diloco *d, float *params, train_state *st, dataloader *train);
bool diloco_in_flight(const diloco *d);

// A rollback (train_gpt.cu): after inner step `step`, whose update was skipped, this replica's
// weights start over from θ — the point the group agreed on last, each fragment's own with
// streaming — and its next contribution of each fragment counts only the steps trained from
// here (st->restart_step, saved in checkpoints). θ, m, the outer step, a fragment in flight or
// waiting to merge stay as they are: the replica remains a member and nothing goes over the
// network. Returns the inner steps whose work was dropped (since the later of the last restart
// and the sync longest ago). The caller uploads params (diloco_changed_range: all of them).
int64_t diloco_restart_from_theta(diloco *d, float *params, train_state *st, int64_t step);

// The global weights θ (the local run validates them).
const float *diloco_theta(const diloco *d);

// diloco_transport = local: the M replicas are simulated in this process (train_gpt.cu's
// train_local; `train_gpt diloco-tune`). diloco_start_local sets θ ← params (every replica
// starts from them) with zero momentum and residuals; then diloco_after_step with all M
// replicas' weights encodes every contribution as a transport would carry it, averages them
// in ascending replica id and applies the outer step — the same code and the same bits as M
// processes. No bytes move: `bytes_sent` is what each replica would send.
void diloco_start_local(diloco *d, const float *params, train_state *st);
// No progress line per outer step (metrics.jsonl still gets it).
void diloco_set_quiet(diloco *d, bool quiet);

// Whether to stop now: tcp: local_stop; mpi: whether any rank wants to (all agree).
bool diloco_agree_stop(diloco *d, bool local_stop);

// Says goodbye to the group (after the final checkpoint at a stop signal or at the end);
// finished: the replica reached max_steps (the hub then tells a replica that comes back
// after every other has gone that the run is over, instead of letting it found a group).
void diloco_leave(diloco *d, const train_state *st, bool finished);
void diloco_close(diloco *d);

// The XXH64 of n fp32 values' bytes (the param_hash of metrics.jsonl; a sharded replica logs
// the XXH64 of its ranks' hashes, 8 bytes little-endian each, in rank order).
uint64_t diloco_hash(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
