// llmc/config.h — every setting of a run, where it came from, and how it is checked.
//
// A run is configured by one file of `key = value` lines (with `#` comments) and then by
// command-line overrides (`--key value` or `--key=value`). All keys live in one table in
// llmc/config.c (name, type, default, bounds, one-line doc); the parser, `--help`, the JSON
// written into checkpoints and the docs test all iterate over that table, so a key cannot
// exist in one place and be missing in another.
//
// Errors name the key and where it was set: "configs/x.conf:12: lr: expected a number,
// got 'fast'" or "--n_layer: expected an integer >= 1, got '0'".
#ifndef TRAIN_GPT_CONFIG_H
#define TRAIN_GPT_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "llmc/common.h"

#ifdef __cplusplus
extern "C" {
#endif

// The auto outer optimizer (docs/diloco.md#the-default-outer-optimizer): runs of at least
// DILOCO_MOMENTUM_ROUNDS outer steps (max_steps / diloco_inner_steps) with 2+ replicas sync
// DILOCO_DECAY_SYNC_FACTOR times as often in the inner schedule's decay phase, and with at least
// DILOCO_MOMENTUM_REPLICAS replicas take Nesterov momentum 0.9 at outer lr 0.2 before it;
// everything else is plain averaging at H throughout.
#define DILOCO_MOMENTUM_ROUNDS 150
#define DILOCO_MOMENTUM_REPLICAS 3
// With plain averaging in the decay phase (diloco_plain_in_decay), diloco_decay_inner_steps auto
// syncs this many times as often there (docs/diloco.md#syncing-more-often-in-the-decay).
#define DILOCO_DECAY_SYNC_FACTOR 4

// The architecture: everything a model.safetensors needs to be read back.
typedef struct {
    int64_t vocab_size;
    int64_t n_layer;
    int64_t d_model;
    int64_t n_head;
    int64_t n_kv_head;   // 0 in a config means "= n_head"; resolved by config_finish()
    int64_t head_dim;    // 0 means "= d_model / n_head"; resolved by config_finish()
    int64_t d_ff;
    int64_t seq_len;
    double rope_theta;
    int64_t nope_every;  // 0 = RoPE on every layer
    bool qk_norm;
    bool tie_embeddings;
    double norm_eps;
    double init_std;
    bool doc_masking;
    int64_t doc_token;   // -1 = take it from the train shards' header
} model_config;

typedef struct {
    model_config model;
    // training
    char *device;        // auto | cpu | cuda
    int64_t batch_size;  // sequences per micro-batch (per process)
    int64_t grad_accum;
    int64_t max_steps;
    double lr;
    double min_lr_frac;
    int64_t warmup_steps;
    double decay_frac;
    char *decay_shape;   // linear | sqrt
    double beta1, beta2, adam_eps, weight_decay, grad_clip, z_loss;
    int64_t seed;
    int64_t max_bad_steps;
    double spike_z;                 // spike guard: skip a step this many std above the window (0 = off)
    int64_t spike_window;           // spike guard: applied steps in the window
    int64_t max_rollbacks;          // times a run may go back to its newest checkpoint
    double watchdog_s;
    double walltime_end;            // unix time the job ends (0 = SLURM_JOB_END_TIME, if set)
    double walltime_safety;         // stop when the time left < (slowest step + checkpoint) × this
    double stop_before_s;           // ... + this many seconds              // end the process when a phase makes no progress this long (0 = off)
    double peak_tflops;  // 0 = unknown: mfu is logged as null
    // data, checkpoints, logging
    char *train_data;
    char *val_data;
    bool shuffle;
    int64_t val_every;
    int64_t val_tokens;
    char *out_dir;
    int64_t ckpt_every;
    int64_t stop_at_step;
    int64_t ckpt_keep;
    char *resume;        // auto | never | path of a checkpoint directory
    char *init_from;
    int64_t log_every;
    bool tensorboard;    // also a TensorBoard event file in out_dir (llmc/tensorboard.h)
    int64_t threads;     // 0 = all cores (or OMP_NUM_THREADS)
    // sharding (docs/fsdp.md)
    int64_t fsdp_size;   // ranks per sharded copy; 0 = ranks per node
    int64_t dp_replicate;  // HSDP copies; 0 = ranks / fsdp_size
    bool fsdp_reshard_after_forward;
    bool fsdp_prefetch;
    double comm_timeout_s;
    // activation recomputation (docs/config.md#memory)
    char *recompute;            // auto | none | selective | full (auto: resolved before the model is built)
    int64_t recompute_layers;   // the mode applies to every N-th layer (l % N == 0); the others keep all
    int64_t memory_budget_mb;   // what a rank's plan may use (recompute = auto); 0 = the device's
    // samples
    char *tokenizer;
    int64_t sample_every;
    char *sample_prompt;
    int64_t sample_tokens;
    double sample_temperature;
    // DiLoCo (docs/diloco.md); diloco_replicas = 0 turns it off
    int64_t diloco_replicas;        // M
    int64_t diloco_replica_id;      // -1 = the MPI rank (mpi) ; required for tcp
    int64_t diloco_inner_steps;     // H
    int64_t diloco_decay_inner_steps;  // H in the decay phase; 0 = diloco_inner_steps (auto resolved)
    double diloco_outer_lr;
    double diloco_outer_momentum;
    bool diloco_nesterov;
    int64_t diloco_momentum_warmup;
    int64_t diloco_plain_in_decay;  // 0 or 1 once loaded (auto resolved)
    bool diloco_outer_auto;         // lr and μ were both auto: chosen by the run's length
    bool diloco_decay_auto;         // diloco_decay_inner_steps was auto
    int64_t diloco_fragments;       // P: streaming DiLoCo syncs the model in P fragments
    int64_t diloco_overlap_steps;   // τ: inner steps a fragment's exchange overlaps
    double diloco_merge_alpha;      // α: θ_local ← α·θ_local + (1−α)·θ_global when a fragment lands (τ > 0)
    char *diloco_transport;         // tcp | mpi
    char *diloco_rendezvous;        // tcp: host:port of the hub
    bool diloco_serve;              // tcp: this replica runs the hub itself
    int64_t diloco_streams;
    char *diloco_quant;             // none | int8 | int4 | int2
    int64_t diloco_quant_block;
    bool diloco_error_feedback;
    double diloco_topk;             // fraction of each block's values sent (1: dense; llmc/quant.h)
    char *diloco_downlink;          // same | bf16 | fp32: the codec of the hub's mean
    bool diloco_downlink_feedback;  // the hub's error feedback on the mean
    double diloco_bound;            // the reducer's bound: times the median norm (0: none)
    double diloco_timeout_s;
    double diloco_connect_timeout_s;
    char *diloco_secret_file;
    int64_t diloco_min_replicas;
    bool diloco_carry_late;         // a rejoining replica keeps its unsent work (docs/diloco.md)
    double diloco_sync_every_s;     // an inner phase lasts at least this long: extra inner steps fill it
} train_config;

// Activation recomputation: what the backward pass computes again instead of keeping it from
// the forward (cpu/model.h says what each mode keeps). A layer l with l % every == 0 uses
// `mode`; the layers between keep everything (as with none).
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } recompute_mode;
typedef struct {
    recompute_mode mode;
    int64_t every;  // >= 1
} recompute_setting;
static const recompute_setting RECOMPUTE_OFF = {RECOMPUTE_NONE, 1};
// The configured setting; recompute = auto reads as none until the trainer resolves it
// (config_set_recompute with the mode that llmc/plan.h's plan chose).
recompute_setting config_recompute(const train_config *cfg);
bool config_recompute_auto(const train_config *cfg);
void config_set_recompute(train_config *cfg, recompute_setting r);
static inline recompute_mode recompute_of_layer(recompute_setting r, int64_t layer) {
    return layer % r.every == 0 ? r.mode : RECOMPUTE_NONE;
}
const char *recompute_name(recompute_mode mode);

// Fills defaults, reads `path` (may be NULL: defaults and overrides only), applies the
// command-line overrides argv[0..argc), checks every value and the relations between
// them. Any problem is fatal with a one-line error naming the key and its source.
void config_load(train_config *cfg, const char *path, int argc, char **argv);
// Resolves derived values (n_kv_head, head_dim defaults) and checks cross-key rules.
void config_finish(train_config *cfg);
// Checks that the files the config names (resume, tokenizer, diloco_secret_file) exist; fatal
// otherwise. Separate from config_load so that `train_gpt plan` works without them. Not
// init_from: a resume does not read it (it may be gone by a requeue); restore_or_init says so
// where it is read, after out_dir's lock and metrics.jsonl were made.
void config_check_files(const train_config *cfg);
// Fatal when a step of batch_size x seq_len x grad_accum x processes tokens passes 2^40, or the
// run's max_steps of them 2^53 (tokens_seen's bound in state.json). config_finish checks one
// process; training and `train_gpt plan` check again with their processes.
void config_check_tokens(const train_config *cfg, int64_t processes);
// A rule across keys broke: fatal, naming `key`, where it was set (the command line, the file's
// line, the default) and the message.
NORETURN void config_refuse(const char *key, const char *fmt, ...) PRINTF_LIKE(2, 3);
// The first step of the WSD schedule's decay phase: max_steps - round(decay_frac * max_steps),
// rounded half away from zero; max_steps when there is none. config_finish refuses a
// warmup_steps past it.
int64_t decay_start_step(const train_config *cfg);
void config_free(train_config *cfg);

// The model section as a JSON object (keys in table order); caller frees.
char *model_config_to_json(const model_config *m);
// Parses the JSON written by model_config_to_json; false (with *why set) on a problem.
bool model_config_from_json(const char *json, model_config *m, const char **why);
bool model_config_equal(const model_config *a, const model_config *b);

// The whole configuration as `key = value` lines, as a config file could hold them.
char *config_to_text(const train_config *cfg);
// Prints every key with its default and doc line (for --help).
void config_print_help(void);

#ifdef __cplusplus
}
#endif

#endif
