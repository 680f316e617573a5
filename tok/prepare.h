// tok/prepare.h — `train_gpt prepare`: text and JSONL files in, train and val token shards out
// (format in dataloader.h and docs/formats.md; usage in docs/data.md).
#ifndef TRAIN_GPT_PREPARE_H
#define TRAIN_GPT_PREPARE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Where the tokens go: a writer of token shards (dataloader.h's, handed in by the command
// line; tok/ knows text and tokens, not the file format). open returns NULL with errno set
// on failure; append and close return false with errno set; abort drops a shard being
// written.
typedef struct {
    void *(*open)(const char *path, uint32_t vocab_size, uint32_t doc_token);
    bool (*append)(void *writer, const uint32_t *tokens, uint64_t count);
    uint64_t (*tokens)(const void *writer);
    bool (*close)(void *writer);
    void (*abort)(void *writer);
    uint32_t no_doc_token;   // the doc_token value that means "none" in the format
} shard_sink;

// argv[0] is "prepare". Returns the process exit code; user errors exit through fail().
int prepare_main(int argc, char **argv, const shard_sink *sink);

#ifdef __cplusplus
}
#endif

#endif
