// tok/prepare.h — `train_gpt prepare`: text and JSONL files in, train and val token shards out
// (format in dataloader.h and docs/formats.md; usage in docs/data.md).
#ifndef TRAIN_GPT_PREPARE_H
#define TRAIN_GPT_PREPARE_H

// argv[0] is "prepare". Returns the process exit code; user errors exit through fail().
int prepare_main(int argc, char **argv);

#endif
