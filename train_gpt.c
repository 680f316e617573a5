// train_gpt.c — the command line. One binary, a few modes:
//
//   train_gpt CONFIG [--key value | --key=value]...   train (the usual case)
//   train_gpt prepare [options] INPUT...              tokenize text into shards (docs/data.md)
//   train_gpt plan CONFIG [--key value]...            size, FLOPs and memory plan; reads no data
//   train_gpt relay --listen HOST:PORT --secret_file F   the DiLoCo hub, on a login node (docs/diloco.md)
//   train_gpt --help                                  list every config key
//   train_gpt --version
//
// Everything else lives in the subsystems; this file only routes.
#include "llmc/common.h"
#include "llmc/config.h"
#include "cpu/gemm.h"
#include "tok/prepare.h"
#include "net/relay.h"
#include "train.h"
#include "dataloader.h"

#include <stdio.h>
#include <string.h>

#define TRAIN_GPT_VERSION "0.1.0"

// `train_gpt prepare` writes its tokens through dataloader.h's shard writer.
static void *sink_open(const char *path, uint32_t vocab_size, uint32_t doc_token) {
    return shard_writer_open(path, vocab_size, doc_token);
}
static bool sink_append(void *w, const uint32_t *tokens, uint64_t count) {
    return shard_writer_append((shard_writer *)w, tokens, count);
}
static uint64_t sink_tokens(const void *w) { return shard_writer_tokens((const shard_writer *)w); }
static bool sink_close(void *w) { return shard_writer_close((shard_writer *)w); }
static void sink_abort(void *w) { shard_writer_abort((shard_writer *)w); }
static const shard_sink shard_files = {sink_open, sink_append, sink_tokens, sink_close, sink_abort, SHARD_NO_DOC_TOKEN};

static void usage_error(void) {
    fail("usage: train_gpt CONFIG [--key value]...  |  train_gpt plan CONFIG  |  train_gpt prepare ...  |  "
         "train_gpt relay ...  |  train_gpt --help");
}

int main(int argc, char **argv) {
    // Progress lines must reach a SLURM log as they happen, not in 4 KiB bursts.
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) usage_error();
    const char *first = argv[1];
    // prepare uses no BLAS: no need for the kernel check (and its possible restart).
    if (strcmp(first, "prepare") == 0) return prepare_main(argc - 1, argv + 1, &shard_files);
    if (strcmp(first, "relay") == 0) return relay_main(argc - 1, argv + 1);
    gemm_fix_cpu_kernels(argv);
    if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0) {
        config_print_help();
        return 0;
    }
    if (strcmp(first, "--version") == 0) {
        printf("train_gpt %s\n", TRAIN_GPT_VERSION);
        return 0;
    }
    bool plan = strcmp(first, "plan") == 0;
    int at = plan ? 2 : 1;
    if (at >= argc) usage_error();
    // A config file is optional when every required key comes from the command line.
    const char *config_path = strncmp(argv[at], "--", 2) == 0 ? NULL : argv[at];
    int rest = config_path ? at + 1 : at;
    train_config cfg;
    config_load(&cfg, config_path, argc - rest, argv + rest);
    int rc = plan ? train_plan(&cfg) : train_run(&cfg);
    config_free(&cfg);
    return rc;
}
