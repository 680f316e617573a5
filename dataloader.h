// dataloader.h — token shards (the on-disk format) and the loader that turns a set of
// shards into micro-batches.
//
// SHARD FORMAT, version 1 (all integers little-endian; documented in docs/formats.md):
//
//   offset  size  field
//        0     8  magic "TGPTSHRD"
//        8     4  version = 1
//       12     4  token_bytes: 2 (uint16 tokens, vocab_size <= 65536) or 4 (uint32)
//       16     8  n_tokens
//       24     8  payload_xxh64: XXH64 (seed 0) of the n_tokens * token_bytes payload bytes
//       32     4  vocab_size of the tokenizer that wrote it (every token is below it)
//       36     4  doc_token: the token placed before each document, 0xFFFFFFFF if none
//       40    16  reserved, zero
//       56     8  header_xxh64: XXH64 (seed 0) of bytes 0..55
//       64     …  payload: n_tokens tokens of token_bytes each
//
// The file is exactly 64 + n_tokens * token_bytes bytes; anything else is a truncated or
// padded shard and is refused. A shard is written to NAME.tmp, fsynced and renamed, so a
// reader never sees half of one.
//
// THE LOADER. The train shards, in the order given (a glob is sorted), are one stream of
// tokens. A micro-batch holds batch_size rows of seq_len + 1 tokens (inputs, and targets
// shifted by one).
//   shuffle = 0: micro-batch i of the whole run is the contiguous window of tokens
//     [i·B·T, (i+1)·B·T + 1) of the stream (as llm.c does); rows are consecutive
//     T-token slices of it. The stream wraps at its end (a new epoch).
//   shuffle = 1: the stream is cut into windows of T + 1 tokens starting every T tokens;
//     each epoch visits all windows once in an order given by a keyed permutation of
//     (seed, epoch), and a micro-batch is B consecutive windows of that order.
// With several processes (world > 1) process r takes micro-batches r, r + world, … of
// that sequence, so processes read disjoint data. The position (epoch, micro-batch index)
// is all a checkpoint needs to resume the stream exactly.
#ifndef TRAIN_GPT_DATALOADER_H
#define TRAIN_GPT_DATALOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmc/state.h"

#define SHARD_MAGIC "TGPTSHRD"
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 64
#define SHARD_NO_DOC_TOKEN 0xFFFFFFFFu

typedef struct {
    uint32_t version;
    uint32_t token_bytes;
    uint64_t n_tokens;
    uint64_t payload_xxh64;
    uint32_t vocab_size;
    uint32_t doc_token;
} shard_header;

// ---- writing shards ----
// Streams tokens into PATH.tmp and, on close, fixes up the header, fsyncs and renames
// to PATH. token_bytes is 2 when vocab_size <= 65536, else 4.
typedef struct shard_writer shard_writer;
// NULL (errno set) if PATH.tmp cannot be created.
shard_writer *shard_writer_open(const char *path, uint32_t vocab_size, uint32_t doc_token);
// false on an I/O error or a token >= vocab_size (errno = EINVAL).
bool shard_writer_append(shard_writer *w, const uint32_t *tokens, uint64_t count);
uint64_t shard_writer_tokens(const shard_writer *w);
// Finishes and renames; false on failure (PATH.tmp is removed). Frees w either way.
bool shard_writer_close(shard_writer *w);
// Drops a shard being written (removes PATH.tmp). Frees w.
void shard_writer_abort(shard_writer *w);

// ---- reading shards ----
// Reads and checks a shard's header against its file size. On failure returns false and
// writes a one-line reason (without the path) into why.
bool shard_read_header(const char *path, shard_header *h, char *why, size_t why_bytes);
// Reads a whole shard, checks both checksums and every token < vocab_size. Returns the
// tokens as uint32 (caller frees) or NULL with a reason in why.
uint32_t *shard_read_all(const char *path, shard_header *h, char *why, size_t why_bytes);

// ---- the loader ----
// Its position, data_position (epoch, micro-batch index), is in llmc/state.h.
typedef struct dataloader dataloader;

// Opens the shards named by `spec` (a path, a glob, or comma-separated list of either)
// and checks every header. `key` names the config key for error messages. Fails
// (one-line error) on no match, a bad shard, or too few tokens for one micro-batch.
dataloader *dataloader_open(const char *spec, const char *key, int64_t batch_size, int64_t seq_len,
                            bool shuffle, uint64_t seed, int rank, int world);
void dataloader_close(dataloader *d);
// Fills inputs and targets (each batch_size * seq_len tokens) with the next micro-batch.
void dataloader_next(dataloader *d, int32_t *inputs, int32_t *targets);
data_position dataloader_position(const dataloader *d);
void dataloader_seek(dataloader *d, data_position pos);
// Restarts at the first micro-batch of epoch 0 (validation uses the same batches each time).
void dataloader_rewind(dataloader *d);
uint64_t dataloader_total_tokens(const dataloader *d);
// Largest vocab_size among the shard headers, and their doc_token (SHARD_NO_DOC_TOKEN when
// absent; the first shard's when they disagree, with a warning).
uint32_t dataloader_vocab_size(const dataloader *d);
uint32_t dataloader_doc_token(const dataloader *d);
// Micro-batches per epoch for one process.
int64_t dataloader_batches_per_epoch(const dataloader *d);

#endif
