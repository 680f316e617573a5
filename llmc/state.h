// llmc/state.h — the counters a run carries across restarts: what state.json holds besides
// the config (docs/formats.md), saved and restored by llmc/checkpoint.c.
#ifndef TRAIN_GPT_STATE_H
#define TRAIN_GPT_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "llmc/guard.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where the train loader stands (dataloader.h): the position is all a checkpoint needs to
// resume the token stream exactly.
typedef struct {
    int64_t epoch;
    int64_t index;   // micro-batches this process has taken in this epoch
} data_position;

// How the rows behind a data position were cut and ordered: the loader's keys when it was
// saved (state.json's batch_size, seq_len, shuffle, seed). batch_size 0 = not recorded.
typedef struct {
    int64_t batch_size, seq_len, seed;
    bool shuffle;
} data_window;

// Which train data a position counts in: the loader's dataloader_fingerprint, token and shard
// counts. Every save records it; a resume and an init_from compare it with the data they open
// (other data: the same position no longer names the same rows). tokens 0 = not recorded.
typedef struct {
    int64_t tokens, shards;
    uint64_t fingerprint;
} data_identity;

typedef struct {
    int64_t step;          // optimizer steps done (the next step to run, 0-based)
    int64_t adam_step;     // AdamW's t: updates actually applied (skipped steps do not count)
    data_position data;    // train loader position after the last step
    int64_t data_world;    // processes the data was split over when saved (0: not recorded)
    data_window window;    // read from a checkpoint only: a save writes the run's own keys
    data_identity data_id; // the train data of `data` (a save writes it when recorded)
    int64_t saved_max_steps;  // read from a checkpoint only: its config's max_steps (0: not recorded)
    int64_t bad_steps;     // consecutive skipped steps (NaN/Inf or spikes) so far
    int64_t norm_spikes;   // of them, the last ones in a row skipped as spikes within the shift
                           // ratios (spike_shift_like): max_bad_steps − 1 of them, with loss_spikes
                           // 0, accept a shift of the norm; max_bad_steps (carried over the
                           // rollback such a streak caused) one of the loss too (llmc/guard.h)
    int64_t loss_spikes;   // of the norm_spikes, those whose loss was above its limit: any one
                           // of them keeps the norm's shift closed (it is for the norm alone)
    int64_t tokens_seen;   // train tokens consumed by all processes
    int64_t outer_step;    // DiLoCo outer steps applied to θ (0 without DiLoCo)
    int64_t merge_step;    // streaming DiLoCo: the step at which the fragment that landed last
                           // merges into the local weights (0 = none pending)
    int64_t merge_fragment;   // ... which fragment that is, of merge_fragments (0: not saved, a
    int64_t merge_fragments;  // checkpoint from before 2026-12: the schedule's fragment there)
    int64_t restart_step;  // DiLoCo: the step at which this replica's weights last started over
                           // from θ (it took the group's state, or rolled back): its next
                           // contribution of each fragment counts only the steps since (0 = none)
    spike_window spikes;   // the spike guard's recent applied steps (llmc/guard.h)
    int64_t rollbacks;     // times this run went back to a checkpoint (max_rollbacks)
} train_state;

#ifdef __cplusplus
}
#endif

#endif
