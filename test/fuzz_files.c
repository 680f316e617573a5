// test/fuzz_files.c — libFuzzer target for the readers of files that come from outside a run
// and that no checksum of ours guards: a JSON text, a JSONL line of a corpus, a safetensors file
// (init_from takes any, e.g. one from the Hugging Face hub) and a tokenizer.json. Built by
// `make test` with clang -fsanitize=fuzzer,address,undefined when clang has libFuzzer
// (net/net.mk); test/test_fuzz_files.sh runs it from a seed corpus it writes.
//
// The first byte of an input picks the reader (modulo 3); the rest is the file:
//   0. JSON: llmc/json.c parses it, and prepare's JSONL scanner (prep_json_text, a second
//      parser written for speed) takes it as a corpus line. The two must agree: a line that
//      json.c reads as an object with one string member "text" the scanner must accept with
//      the same text, and a line the scanner accepts json.c must accept too, unless it is
//      one of the documented differences (json.c refuses lone surrogates, \u0000, numbers of
//      64 characters or more and nesting past 64; the scanner takes them).
//   1. safetensors: open; every entry's extent lies inside the file and matches its shape;
//      every tensor reads, and a range of it; the model config of the metadata, when it
//      parses, writes back to JSON that parses to the same config.
//   2. tokenizer.json: load; a loaded tokenizer round-trips decode(encode(s)) == s, with and
//      without special tokens, for s = the file's own bytes and a text with invalid UTF-8, and
//      emits no id at or past its vocab_size.
// A reader may refuse anything, but only by returning its error: a crash, a sanitizer report,
// an exit (fatal() inside a reader), a leak or a broken invariant (MUST) is a finding.
#include "llmc/config.h"
#include "llmc/json.h"
#include "llmc/safetensors.h"
#include "tok/prepare_input.h"
#include "tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MUST(cond)                                                              \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz_files: invariant broken: %s (line %d)\n", #cond, __LINE__); \
            __builtin_trap();                                                   \
        }                                                                       \
    } while (0)

// ---------------------------------------------------------------- 0: JSON and a JSONL line

static int depth_of(const json_value *v) {
    int deepest = 0;
    if (v->type == JSON_ARRAY || v->type == JSON_OBJECT)
        for (size_t i = 0; i < v->count; i++) {
            int d = depth_of(&v->items[i]);
            if (d > deepest) deepest = d;
        }
    return deepest + (v->type == JSON_ARRAY || v->type == JSON_OBJECT);
}

// The errors by which json.c refuses what the scanner takes, on purpose (see the top).
static bool documented_difference(const char *error) {
    static const char *const allowed[] = {"lone surrogate", "bad surrogate pair", "NUL in string", "number too long",
                                          "nesting too deep"};
    for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++)
        if (strstr(error, allowed[i])) return true;
    return false;
}

static void fuzz_json(const char *text, size_t n) {
    json_doc doc;
    bool parsed = json_parse(text, n, &doc);
    strbuf got = {0};
    char why[200];
    bool scanned = prep_json_text(text, n, "text", &got, why, sizeof why);
    if (parsed) {
        const json_value *root = &doc.root;
        size_t members = 0;
        const json_value *member = NULL;
        if (root->type == JSON_OBJECT)
            for (size_t i = 0; i < root->count; i++)
                if (strcmp(root->keys[i], "text") == 0) {
                    members++;
                    member = &root->items[i];
                }
        bool one_text = members == 1 && member->type == JSON_STRING;
        // The scanner nests to 128, json.c to 64: anything json.c read is within both.
        MUST(depth_of(root) <= 64);
        if (one_text) {
            MUST(scanned);
            MUST(got.length == strlen(member->string) && memcmp(got.data, member->string, got.length) == 0);
        } else {
            // An object without exactly one string "text": the scanner must refuse it.
            MUST(!scanned);
        }
        json_free(&doc);
    } else {
        MUST(doc.error[0] != '\0');
        if (scanned) MUST(documented_difference(doc.error));
    }
    if (!scanned) MUST(why[0] != '\0');
    sb_free(&got);
}

// ---------------------------------------------------------------- files through a memfd

static int file_fd = -1;
static char file_path[64];

// The bytes as a file with a path, for the readers that open one.
static const char *as_file(const uint8_t *data, size_t n) {
    if (file_fd < 0) {
        file_fd = memfd_create("fuzz_files", 0);
        MUST(file_fd >= 0);
        snprintf(file_path, sizeof file_path, "/proc/self/fd/%d", file_fd);
    }
    MUST(ftruncate(file_fd, 0) == 0);
    MUST(n == 0 || pwrite(file_fd, data, n, 0) == (ssize_t)n);
    return file_path;
}

// ---------------------------------------------------------------- 1: safetensors

static void fuzz_safetensors(const uint8_t *data, size_t n) {
    const char *path = as_file(data, n);
    st_file f;
    char why[300];
    if (!safetensors_open(path, &f, why, sizeof why)) {
        MUST(why[0] != '\0');
        return;
    }
    MUST(f.data_start >= 8 && f.data_start <= n);
    uint64_t data_bytes = n - f.data_start;
    for (int i = 0; i < f.count; i++) {
        const st_entry *e = &f.entries[i];
        MUST(e->ndim >= 0 && e->ndim <= 8);
        int64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            MUST(e->shape[d] >= 0);
            numel *= e->shape[d];
        }
        MUST(numel == e->numel);
        MUST(e->begin <= e->end && e->end <= data_bytes && e->end - e->begin == 4 * (uint64_t)numel);
        MUST(safetensors_find(&f, e->name) == e);
        float *values = malloc((size_t)numel * sizeof *values + 1);
        MUST(values && safetensors_read(&f, e, values));
        if (numel > 0) {
            int64_t first = numel / 3, count = numel - first;
            float *tail = malloc((size_t)count * sizeof *tail);
            MUST(tail && safetensors_read_range(&f, e, first, count, tail));
            MUST(memcmp(tail, values + first, (size_t)count * sizeof *tail) == 0);
            free(tail);
        }
        MUST(!safetensors_read_range(&f, e, numel, 1, values));
        free(values);
    }
    const char *config = safetensors_meta(&f, "model_config");
    if (config) {
        model_config m, back;
        const char *reason = NULL;
        if (model_config_from_json(config, &m, &reason)) {
            char *json = model_config_to_json(&m);
            MUST(model_config_from_json(json, &back, &reason));
            MUST(model_config_equal(&m, &back));
            free(json);
        } else {
            MUST(reason && reason[0]);
        }
    }
    safetensors_close(&f);
}

// ---------------------------------------------------------------- 2: tokenizer.json

static void round_trip(const tokenizer *t, const char *text, size_t n, bool allow_special) {
    uint32_t *ids = NULL;
    size_t count = 0;
    char why[300];
    MUST(tokenizer_encode(t, text, n, allow_special, &ids, &count, why, sizeof why));
    uint32_t vocab = tokenizer_vocab_size(t);
    for (size_t i = 0; i < count; i++) MUST(ids[i] < vocab);
    size_t bytes = 0;
    char *back = tokenizer_decode(t, ids, count, &bytes);
    MUST(bytes == n && memcmp(back, text, n) == 0 && back[n] == '\0');
    free(back);
    free(ids);
}

static void fuzz_tokenizer(const uint8_t *data, size_t n) {
    const char *path = as_file(data, n);
    char why[300];
    tokenizer *t = tokenizer_load(path, NULL, why, sizeof why);
    if (!t) {
        MUST(why[0] != '\0');
        return;
    }
    MUST(tokenizer_vocab_size(t) > 0);
    static const char mixed[] = "Hello, world! 123 \xFF\xFE caf\xC3\xA9 \xE2\x82 <|endoftext|>x \n\n  tabs\t\t\xF0\x9F\x98\x80";
#ifdef HAVE_PCRE2  // without it encoding is an error by design; loading and decoding still run
    for (int special = 0; special < 2; special++) {
        round_trip(t, (const char *)data, n, special);
        round_trip(t, mixed, sizeof mixed - 1, special);
    }
#else
    (void)mixed;
    (void)round_trip;
#endif
    tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n == 0) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_json((const char *)data + 1, n - 1); break;
    case 1: fuzz_safetensors(data + 1, n - 1); break;
    default: fuzz_tokenizer(data + 1, n - 1); break;
    }
    return 0;
}
