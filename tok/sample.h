// tok/sample.h — text samples during training: every sample_every steps the model continues
// sample_prompt for sample_tokens tokens, and the decoded text goes to stdout and to
// metrics.jsonl ({"event":"sample", "step", "text"}), so a user sees what it has learned.
//
// The prompt is preceded by the document token (training data puts one before every
// document), sampling uses its own random stream seeded by (seed, step) so it never
// changes the training, and it stops early at the end of a document.
#ifndef TRAIN_GPT_SAMPLE_H
#define TRAIN_GPT_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/backend.h"
#include "llmc/config.h"
#include "llmc/metrics.h"
#include "llmc/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sampler sampler;

// Loads the tokenizer and encodes the prompt; fatal (naming the key) if either fails.
sampler *sampler_create(const train_config *cfg, const param_table *t);
void sampler_free(sampler *s);
// A sharded model (FSDP): every rank of job generates, with rank 0's choice of each token.
typedef struct comm comm;
void sampler_set_job(sampler *s, comm *job);
// Generates and reports one sample with the backend's current weights (its forward pass).
void sampler_run(sampler *s, backend *b, int64_t step, metrics_log *log);
// The n bytes of a decoded sample as a string to print (malloc'd): control bytes other than
// newline and tab, and DEL, become U+FFFD. A model may sample the token of any byte: a NUL cut
// the text short on stdout and in metrics.jsonl, an ESC sequence reached the terminal.
char *sample_printable(const char *bytes, size_t n);

#ifdef __cplusplus
}
#endif

#endif
