// llmc/checkpoint.h — saving and restoring everything a run needs to continue bit-exactly.
//
// A checkpoint is a directory OUT_DIR/step_NNNNNNNN (N = optimizer steps done) holding
//   model.safetensors      fp32 master weights, Hugging Face names, "model_config" (JSON)
//                          in __metadata__ — loadable by any safetensors reader
//   optimizer.safetensors  AdamW moments: "exp_avg.<name>" and "exp_avg_sq.<name>"
//   state.json             step, AdamW step, data position, outlier-guard count, DiLoCo
//                          outer step, the config
//   outer.safetensors      DiLoCo runs only: the outer state, "outer.theta.<name>" (θ, the
//                          global weights of the last outer step), "outer.momentum.<name>"
//                          and, with error feedback, "outer.residual.<name>"
//   checksums.xxh64        XXH64 of the files above, in `xxhsum -H64` format
// It is written into OUT_DIR/.tmp-step_NNNNNNNN, every file fsynced, then the directory is
// renamed into place and OUT_DIR fsynced: a crash at any moment leaves either the complete
// checkpoint or none (a stale .tmp-step_* directory, which is never read; the next save, of
// whatever step, removes every one before it writes: the out_dir lock makes it the only writer
// there). On load every file is checked against checksums.xxh64 before anything is used.
#ifndef TRAIN_GPT_CHECKPOINT_H
#define TRAIN_GPT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmc/comm.h"
#include "llmc/config.h"
#include "llmc/params.h"
#include "llmc/shard.h"
#include "llmc/state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const param_table *table;
    float *params, *exp_avg, *exp_avg_sq;   // flat buffers in the table's layout
    // DiLoCo's outer state, NULL without DiLoCo (residual: NULL without error feedback).
    float *outer_theta, *outer_momentum, *outer_residual;
    // FSDP (llmc/shard.h): with job set, every buffer above holds this rank's pieces of
    // shard, and every rank of job calls save and load together. Rank 0 of job creates the
    // files and their headers, the writers (one copy of the model: HSDP's first) write their
    // pieces at their offsets in parallel, rank 0 checksums and commits. On load rank 0
    // verifies the checksums and every rank reads its own pieces, so a checkpoint written at
    // one world size loads at any other. The files are the one-process files, byte for byte.
    const shard_map *shard;
    comm *job;        // NULL: one process, the whole model
    bool writer;
    // The checkpoint holds DiLoCo's outer state though this process has no outer buffers: an
    // HSDP copy other than the first, which writes nothing but takes part in the job's calls.
    bool outer_elsewhere;
    // DiLoCo's reducer state (the mpi transport's downlink residual: diloco_attach_buffers),
    // saved by rank 0 as outer_reducer.bin, the header then the values; reducer_head NULL:
    // none. On load, a checkpoint that lists the file hands its bytes to reducer_load (NULL:
    // the file is not read).
    const void *reducer_head, *reducer_body;
    size_t reducer_head_bytes, reducer_body_bytes;
    bool (*reducer_load)(void *arg, const uint8_t *bytes, size_t n, char *why, size_t why_bytes);
    void *reducer_arg;
} model_buffers;

// Writes OUT_DIR/step_NNNNNNNN atomically. false (with a warning already printed) on
// failure; nothing half-written is ever left under the final name, and a job's ranks return
// only once rank 0 has removed what it wrote.
bool checkpoint_save(const char *out_dir, const model_buffers *b, const train_state *s, const train_config *cfg);

// Verifies and loads one checkpoint directory. false with a one-line reason in why; the
// buffers may then hold partial data and must not be used. When b has outer buffers and
// the checkpoint has no outer state (it was written without DiLoCo), θ is set to the
// weights, the momentum and residual to zero, and s->outer_step to 0, with a notice.
bool checkpoint_load(const char *dir, const model_buffers *b, train_state *s, char *why, size_t why_bytes);

// Where an earlier run's training data stream stood when it saved a checkpoint, and the
// keys that define that stream: what `init_from = <checkpoint directory>` needs to go on
// reading where that run stopped (docs/config.md, init_from).
typedef struct {
    int64_t step;               // the checkpoint's optimizer step
    data_position data;         // each of its processes' position
    int64_t data_world;         // processes its data was split over (1 when not recorded)
    data_window window;         // how its rows were cut and ordered (always recorded here)
    char train_data[1024];      // its train_data key ("" when state.json does not say)
    data_identity data_id;      // its train data (tokens 0: not recorded)
} data_origin;

// The value KEY had in the configuration DIR's state.json records (its `key = value` line, quotes
// taken off); false when the checkpoint or the key is not there (checkpoints before the key).
bool checkpoint_config_value(const char *dir, const char *key, char *out, size_t out_bytes);

// Verifies DIR's weights and state.json against its checksums.xxh64 (not the moments or the
// outer state, which init_from does not use) and reads its state.json into o; a directory named
// for another step than its state.json's is refused, as a resume refuses it. false with a
// reason in why. job (NULL: this process alone): rank 0 reads and verifies, every rank gets its
// answer (collective).
bool checkpoint_data_origin(const char *dir, const comm *job, data_origin *o, char *why, size_t why_bytes);

// A weights file named for init_from (a checkpoint's model.safetensors): when the directory it
// lies in (a link's target's) holds a checksums.xxh64 with a line for its name, the file must
// match it. true also when there is no line to check against; false with a reason in why. job
// (NULL: this process alone): rank 0 checks, every rank gets its answer (collective).
bool checkpoint_verify_weights_file(const char *path, const comm *job, char *why, size_t why_bytes);

// Which of KEYS (config.md's names) the checkpoint in DIR was saved with another value of than
// cfg has: "key A → B" each, "; "-separated, into out; returns how many (0 also when its
// state.json holds no config).
int checkpoint_config_changes(const char *dir, const train_config *cfg, const char *const *keys, int n_keys, char *out,
                              size_t out_bytes);

// Loads the newest checkpoint in out_dir that verifies, warning about each one skipped.
// Returns its path (caller frees), or NULL if out_dir has no checkpoint at all.
// If checkpoints exist but none verifies, that is a fatal error: the user decides.
char *checkpoint_load_latest(const char *out_dir, const model_buffers *b, train_state *s);
// The same among the checkpoints whose step is at most max_step (a rollback's: those from
// before the weights that went bad; INT64_MAX: all), trying first the ones whose step is a
// multiple of `every` (ckpt_every's grid), newest first, then the others: a rollback lands
// where it would have without the checkpoints a stop wrote off the grid (a signal, the
// walltime, stop_at_step), so that a run resumed after one rolls back as the straight run
// does. every 0: newest first. NULL also when none is at most max_step.
char *checkpoint_load_latest_every(const char *out_dir, int64_t every, int64_t max_step, const model_buffers *b,
                                   train_state *s);

// Number of checkpoint directories (step_%08lld: no other spelling) in out_dir, valid or not.
// job (NULL: this process alone): its ranks take rank 0's listing (collective), as the loads
// below do.
int checkpoint_count(const char *out_dir, const comm *job);
// The same, counting only those whose step is at most max_step.
int checkpoint_count_upto(const char *out_dir, int64_t max_step, const comm *job);

// After a rollback to the checkpoint of `step`: renames every checkpoint directory of a later
// step to step_NNNNNNNN.rolled-back (-2, -3, … when that exists), with one warning naming them.
// They hold the bad steps' weights or lead to them: left under their names, a crash after the
// rollback resumed from one (its rollbacks count from before the rollback), and the run's next
// pass over their steps moved each aside as .replaced-<time>. Rank 0 of job only (NULL: this
// process); not collective.
void checkpoint_set_aside_after(const char *out_dir, int64_t step, const comm *job);

// Whether checkpoints can be written in out_dir (created if absent): a directory is made and
// removed there. false with the reason in why.
bool checkpoint_dir_writable(const char *out_dir, char *why, size_t why_bytes);

// The step of the newest checkpoint directory in out_dir (valid or not); -1 when there is none.
int64_t checkpoint_newest_step(const char *out_dir, const comm *job);

// Takes OUT_DIR/.lock (flock, exclusive) for the rest of the process and writes "pid N on host
// H" into it: two runs in one out_dir (a requeued job while the old one still lives, a job
// submitted twice) would delete each other's unfinished saves and move each other's
// checkpoints aside. Held by the process that writes the checkpoints: rank 0 of job (NULL: this
// process); every rank of job calls it. A lock held by another process is a fatal error naming
// the holder, on every rank; a file system without locks only warns.
void checkpoint_lock_out_dir(const char *out_dir, comm *job);

// Removes all but the newest `keep` checkpoints at or below step `written` (the one just
// written; keep 0 = remove none). Newer ones are another line of the run — ones a resume
// skipped because they failed their checksums — and are neither counted nor removed: counting
// them once deleted every valid checkpoint and kept the corrupt one.
void checkpoint_prune(const char *out_dir, int64_t keep, int64_t written);

// Writes a model.safetensors (weights + model_config metadata) atomically to path.
bool save_weights(const char *path, const param_table *t, const float *params);

// Loads weights only from a model.safetensors (init_from): every tensor of the table must
// be present with its shape, and no other; model_config metadata, where the file has it, must
// name the table's architecture. false with a reason in why.
bool load_weights(const char *path, const param_table *t, float *params, char *why, size_t why_bytes);
// The same, only this rank's pieces (llmc/shard.h) into local.
bool load_weights_pieces(const char *path, const shard_map *shard, float *local, char *why, size_t why_bytes);

#ifdef __cplusplus
}
#endif

#endif
