// train.h — the training loop: from a checked configuration to a finished run.
//
// One step = grad_accum micro-batches of forward + backward (gradients summed, scaled so
// the step minimizes the mean loss over all its tokens), the global gradient norm, the
// outlier guard (a NaN/Inf loss or norm skips the update; max_bad_steps in a row stop
// the run), clipping, the WSD learning rate, AdamW. Around the steps: validation,
// samples, checkpoints (on schedule, at the end, and on SIGTERM / SIGUSR1 / SIGINT,
// after which the run exits cleanly so SLURM can requeue it), metrics.jsonl and one
// progress line per log_every steps.
#ifndef TRAIN_GPT_TRAIN_H
#define TRAIN_GPT_TRAIN_H

#include "llmc/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Runs the whole training; returns the process exit code (0 = finished or stopped cleanly
// with a checkpoint). User errors are fatal inside (one line, exit 1).
int train_run(train_config *cfg);

// Prints the model's size, FLOPs per token and memory plan without touching any data
// (`train_gpt plan CONFIG`).
int train_plan(train_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
