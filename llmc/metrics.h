// llmc/metrics.h — out_dir/metrics.jsonl, one JSON object per line, flushed after each line
// so a crash loses nothing already reported. Line kinds (docs/formats.md):
//   step:   {"step", "loss", "z_loss", "lr", "grad_norm", "tok_per_s", "mfu", "step_ms",
//            "tokens", "skipped", "stall_ms", "extra_steps", "extra_ms"}  mfu is null when the
//            peak is unknown (CPU); stall_ms only in DiLoCo runs; extra_steps and extra_ms (DiLoCo's
//            extra inner steps after this step, diloco_sync_every_s) only when there were some
//   val:    {"step", "val_loss", "val_tokens"}
//   event:  {"event", "step", ...}            start, resume, checkpoint, stop, diloco_*
//   outer:  {"outer_step", "step", "contributors", ...}   one per DiLoCo outer step (diloco.h)
// Numbers that are not finite are written as null (JSON has no NaN).
//
// With TensorBoard on (metrics_open's tensorboard), the same numbers also go to a new
// event file in out_dir (llmc/tensorboard.h), at the optimizer step:
//   step line  -> train/<field> for loss, z_loss, lr, grad_norm, tok_per_s, mfu, step_ms,
//                 tokens and (DiLoCo) stall_ms; not for a step that ended in a rollback
//   val line   -> val/loss
//   outer line -> diloco/<member> for each numeric member but step (outer_step, sync_s,
//                 wait_s, bytes_sent, bytes_recv, quant_rel_err, ...), and
//                 diloco/contributors = how many; at the line's step
//   "sample"   -> the text "samples"
//   "resume" at N, "rollback" to N -> a restart at N + 1 (TensorBoard drops what it read of
//                 steps > N, as the later line of metrics.jsonl counts)
// Numbers that are not finite are left out there.
#ifndef TRAIN_GPT_METRICS_H
#define TRAIN_GPT_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct metrics_log metrics_log;

typedef struct {
    int64_t step;        // optimizer steps done, 1-based
    double loss;         // mean cross-entropy (nats) over the step's tokens
    double z_loss;       // z_loss · mean(lse²): the term added to the objective
    double lr;
    double grad_norm;    // global norm before clipping
    double tok_per_s;
    double mfu;          // fraction of peak; NaN = unknown (null)
    double step_ms;
    int64_t tokens;      // train tokens consumed so far, all processes
    bool skipped;        // the outlier guard skipped the update
    bool has_stall;      // DiLoCo runs: stall_ms is written
    double stall_ms;     // time after the step spent on DiLoCo's outer work (no inner step ran)
    int64_t extra_steps; // DiLoCo's extra inner steps after this step (diloco_sync_every_s)
    double extra_ms;     // and their time
    bool rolled_back;    // not written: the step ended in a rollback to a checkpoint
} step_metrics;

// Opens (appending) out_dir/metrics.jsonl and, with tensorboard, a new TensorBoard event
// file in out_dir that gets the numbers too (above); fatal if either cannot be opened.
metrics_log *metrics_open(const char *out_dir, bool tensorboard);
void metrics_close(metrics_log *log);
// Every writer below accepts log = NULL and writes nothing.
void metrics_step(metrics_log *log, const step_metrics *m);
void metrics_val(metrics_log *log, int64_t step, double val_loss, int64_t val_tokens);
// {"event": name, "step": step} plus extra members given as a JSON fragment ("" for none),
// e.g. "\"path\":\"out/step_00000100\"".
void metrics_event(metrics_log *log, const char *name, int64_t step, const char *extra_json);
// A line made of the given members, a JSON fragment such as "\"outer_step\":3,\"step\":15".
void metrics_object(metrics_log *log, const char *members_json);

#ifdef __cplusplus
}
#endif

#endif
