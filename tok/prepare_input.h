// tok/prepare_input.h — the input side of `train_gpt prepare`: which files, how they split into
// documents, and the `text` field of a JSONL line.
//
// Inputs are files, directories or glob patterns. A directory is walked recursively, hidden
// entries skipped, names sorted so that a rerun reads the same order; with --format auto it
// contributes the files named *.txt, *.jsonl, *.ndjson, *.json, each optionally compressed (.gz,
// .zst), and a warning counts the other files it skipped. A file named on the command line
// (or matched by a pattern) is read whatever its name. A pattern (an argument with * ? [ that
// names no file) is expanded by glob(3), sorted, so a corpus of many thousands of files need
// not pass through the shell's argument limit. Formats:
//   text   a file is one document, or, with a separator string, the documents are the
//          pieces between separators (empty pieces are skipped);
//   jsonl  one JSON object per line, the document is its string member `text` (or another
//          key); blank lines are skipped; anything else on a line is an error naming
//          file:line.
// --format auto decides by the name without its compression suffix (.jsonl / .ndjson / .json are
// JSONL). Files are streamed in blocks, compressed ones decoded on the fly
// (tok/prepare_stream.h), so a JSONL file of any size costs a block of memory; a single
// document must fit in memory.
#ifndef TRAIN_GPT_PREPARE_INPUT_H
#define TRAIN_GPT_PREPARE_INPUT_H

#include "llmc/json.h"
#include "tok/prepare_stream.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PREP_TEXT, PREP_JSONL } prep_format;

typedef struct {
    char *path;
    uint64_t bytes;                // the file's size (compressed, for a compressed file)
    prep_format format;
    prep_compression compression;  // by the file name
    bool is_val;
} prep_input;

// Expands paths (files, directories, patterns) into a list of files, directories sorted.
// format_name is "auto" (.jsonl / .ndjson are JSONL, everything else text, both with an
// optional .gz or .zst), "text" or "jsonl". Fails (one-line error) on a path that does not
// exist or cannot be read, a pattern that matches nothing, a compression this build cannot
// read, or no files at all. out_prefix (or NULL): files found by walking a directory that are
// output of a run of this --out (its shards and summary) are left out, with a note.
prep_input *prep_list_inputs(char *const *paths, int n_paths, const char *format_name, const char *out_prefix,
                             size_t *count);
void prep_free_inputs(prep_input *inputs, size_t count);

// One document of a batch: bytes [offset, offset + bytes) of the batch text; for JSONL the
// whole line, whose text member the worker extracts.
typedef struct {
    uint64_t offset, bytes;
    uint32_t input;      // index into the inputs
    uint64_t ordinal;    // documents before this one, over all inputs
    uint64_t line;       // JSONL: line number in its file; text: document number in its file
    bool is_json;
    bool is_val;
} prep_doc;

typedef struct {
    char *text;
    size_t bytes, capacity;
    prep_doc *docs;
    size_t n_docs, docs_capacity;
} prep_batch;

void prep_batch_free(prep_batch *b);

typedef struct prep_reader prep_reader;
// separator: NULL for one document per text file. Does not take ownership of inputs.
prep_reader *prep_reader_open(const prep_input *inputs, size_t n_inputs, const char *separator, size_t separator_bytes);
void prep_reader_close(prep_reader *r);
// Empties b and fills it with whole documents, stopping once it holds target_bytes (one
// document larger than that is taken whole). Returns false when the inputs are exhausted
// and b is empty. Fails (one-line error) on a read error or bad compressed data (naming the
// file and the compressed byte offset).
bool prep_reader_fill(prep_reader *r, prep_batch *b, size_t target_bytes);
// Text bytes consumed so far (decompressed).
uint64_t prep_reader_bytes_done(const prep_reader *r);
// File bytes consumed so far (compressed, for compressed files): progress against the sum
// of the inputs' sizes.
uint64_t prep_reader_file_bytes_done(const prep_reader *r);

// The string member `key` of the JSON object in line[0..bytes), unescaped into out
// (appended; may contain NUL bytes: \u0000 is kept). The whole line must be strict JSON.
// Lone surrogates become U+FFFD. False with a reason on malformed input or a missing or
// non-string member.
bool prep_json_text(const char *line, size_t bytes, const char *key, strbuf *out, char *why, size_t why_bytes);

#ifdef __cplusplus
}
#endif

#endif
