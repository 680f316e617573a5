// tok/prepare.c — `train_gpt prepare`: tokenizes text and JSONL files into train and val token
// shards. Usage and examples: docs/data.md; `train_gpt prepare --help`.
//
// The pipeline works in batches of whole documents (~32 MiB), which keeps the output
// independent of the thread count: all threads (OpenMP, all cores by default) encode the
// documents of batch k in any order, each into its own token buffer, while one of them first
// appends batch k-1's documents, in input order, to the train or val shard stream (a new shard
// every --shard_tokens tokens) and reads batch k+1, then joins the encoding. So reading and
// writing overlap encoding, and on a many-core node the cores do not wait for the disk.
//
// Each document becomes [doc_token] + encode(text), with the spellings of special tokens
// kept as plain text (a document that contains "<|endoftext|>" must not end early). The
// val split is either whole files (--val_files) or a fraction of documents picked by a hash
// of (seed, document number), so the same inputs always give the same split.
//
// While writing, unigram counts of both splits are kept; the summary reports the entropy
// of the val tokens (nats) and the cross-entropy of val under a unigram model of train,
// the loss a model that ignores context would reach: the first number a training run's
// val_loss should beat.
//
// Inputs may be gzip or zstd compressed (decoded as a stream, tok/prepare_stream.c);
// progress is measured in file bytes, so the ETA of a compressed corpus is against the sum
// of its compressed sizes. A run is all or nothing: a failure (bad input, full disk) removes
// every shard the run wrote, the finished ones too, so a corpus with a hole in it is never
// mistaken for a whole one.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tok/prepare.h"
#include "llmc/common.h"
#include "llmc/json.h"
#include "llmc/fault.h"
#include "tok/prepare_input.h"
#include "tok/tokenizer.h"

#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif


static const char usage[] =
    "usage: train_gpt prepare --tokenizer PATH --out PREFIX [options] INPUT...\n"
    "\n"
    "Tokenizes text and JSONL files into token shards PREFIX_train_000000.bin, ... and\n"
    "PREFIX_val_000000.bin, ..., plus a summary PREFIX_summary.json. INPUT: files,\n"
    "directories (read recursively, in sorted order: their *.txt, *.jsonl, *.ndjson and *.json files)\n"
    "or quoted glob patterns. Files may be gzip (.gz) or zstd (.zst) compressed, e.g.\n"
    "web/part-00017.jsonl.zst; they are decoded as streams.\n"
    "\n"
    "  --tokenizer PATH      a .tiktoken rank file or a Hugging Face tokenizer.json (required)\n"
    "  --encoding NAME       tiktoken encoding: r50k_base (gpt2), p50k_base, p50k_edit,\n"
    "                        cl100k_base, o200k_base (default: from the file name)\n"
    "  --out PREFIX          output path prefix, e.g. data/austen/austen (required)\n"
    "  --val_files A,B       inputs whose file name (or path) is listed go to val\n"
    "  --val_frac F          or: this fraction of documents, picked by hash (default 0: no val)\n"
    "  --seed N              seed of the --val_frac pick (default 1337)\n"
    "  --format F            auto (default: .jsonl/.ndjson/.json are JSONL, also .gz/.zst), text\n"
    "                        or jsonl (these two: every file of a directory, in that format)\n"
    "  --separator S         text files hold many documents separated by S (escapes \\n \\t\n"
    "                        \\r \\\\ \\xHH); default: one document per text file\n"
    "  --text_key K          JSONL member holding the text (default text)\n"
    "  --doc_token T         token before each document: an id, a special token's name,\n"
    "                        or none (default: <|begin_of_text|>, <|endoftext|> or <s>)\n"
    "  --shard_tokens N      tokens per shard (default 100000000): the output is cut into\n"
    "                        shards of N tokens, the last one shorter\n"
    "  --threads N           encoding threads (default: all cores)\n"
    "  --batch_bytes N       text per batch of the pipeline (default 33554432); the output\n"
    "                        does not depend on it\n"
    "  --overwrite           replace the shards and summary of an earlier run with the\n"
    "                        same PREFIX\n"
    "  --progress_s S        seconds between progress lines (default 5; 0: every batch)\n"
    "  --quiet               no progress lines\n"
    "  --                    the end of the options: every argument after it is an INPUT,\n"
    "                        one whose name starts with -- too\n";

typedef struct {
    const char *tokenizer_path, *encoding, *out_prefix, *val_files, *format, *text_key, *doc_token;
    char *separator;
    size_t separator_bytes;
    double val_frac, progress_s;
    uint64_t seed, shard_tokens, batch_bytes;
    int threads;
    bool overwrite, quiet;
    char **inputs;
    int n_inputs;
} prepare_options;

// ---------------------------------------------------------------- options

static uint64_t parse_count(const char *key, const char *value, uint64_t min) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || !end || *end || !isdigit((unsigned char)value[0]) || v < min)   // strtoull takes " -1", "+5"
        fail("--%s must be an integer >= %llu, not '%s'", key, (unsigned long long)min, value);
    return v;
}

// "\n", "\t", "\r", "\\", "\xHH" in a --separator; anything else stands for itself.
static char *parse_separator(const char *text, size_t *bytes) {
    char *out = xmalloc(strlen(text) + 1);
    size_t n = 0;
    for (const char *p = text; *p; p++) {
        if (*p != '\\' || !p[1]) {
            out[n++] = *p;
            continue;
        }
        p++;
        if (*p == 'n') out[n++] = '\n';
        else if (*p == 't') out[n++] = '\t';
        else if (*p == 'r') out[n++] = '\r';
        else if (*p == '\\') out[n++] = '\\';
        else if (*p == 'x' && p[1] && p[2] && strchr("0123456789abcdefABCDEF", p[1]) &&
                 strchr("0123456789abcdefABCDEF", p[2])) {
            char hex[3] = {p[1], p[2], 0};
            out[n++] = (char)strtol(hex, NULL, 16);
            p += 2;
        } else {
            fail("--separator: unknown escape \\%c (known: \\n \\t \\r \\\\ \\xHH)", *p);
        }
    }
    if (n == 0) fail("--separator must not be empty");
    *bytes = n;
    return out;
}

static prepare_options parse_options(int argc, char **argv) {
    prepare_options o = {0};
    o.format = "auto";
    o.text_key = "text";
    o.seed = 1337;
    o.shard_tokens = 100000000;
    o.batch_bytes = (uint64_t)32 << 20;
    o.progress_s = 5;
    o.inputs = xcalloc((size_t)argc, sizeof *o.inputs);
    char given[32][64];   // the options with a value seen so far (there are 14)
    int n_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strcmp(arg, "--") == 0) {
            // The end of the options: every argument after it is an input, "--notes.txt" too
            // (until 2026-12 "--" was itself taken for an input).
            while (++i < argc) o.inputs[o.n_inputs++] = argv[i];
            break;
        }
        if (strncmp(arg, "--", 2) != 0) {
            o.inputs[o.n_inputs++] = argv[i];
            continue;
        }
        const char *key = arg + 2;
        if (strcmp(key, "overwrite") == 0) {
            o.overwrite = true;
            continue;
        }
        if (strcmp(key, "quiet") == 0) {
            o.quiet = true;
            continue;
        }
        // --key=value or --key value
        char name[64];
        const char *value;
        const char *eq = strchr(key, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - key), key);
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", key);
            if (i + 1 >= argc) fail("prepare: --%s needs a value", name);
            value = argv[++i];
        }
        // An option given twice is refused (prepare has no config file for the command line to
        // override, as the trainer's does): the last one won, silently (--out A ... --out B wrote B).
        for (int j = 0; j < n_given; j++)
            if (strcmp(given[j], name) == 0) fail("prepare: --%s is given twice", name);
        if (n_given < (int)(sizeof given / sizeof given[0])) snprintf(given[n_given++], sizeof given[0], "%s", name);
        if (strcmp(name, "tokenizer") == 0) o.tokenizer_path = value;
        else if (strcmp(name, "encoding") == 0) o.encoding = value;
        else if (strcmp(name, "out") == 0) o.out_prefix = value;
        else if (strcmp(name, "val_files") == 0) o.val_files = value;
        else if (strcmp(name, "format") == 0) o.format = value;
        else if (strcmp(name, "text_key") == 0) o.text_key = value;
        else if (strcmp(name, "doc_token") == 0) o.doc_token = value;
        else if (strcmp(name, "separator") == 0) {
            free(o.separator);
            o.separator = parse_separator(value, &o.separator_bytes);
        } else if (strcmp(name, "seed") == 0) o.seed = parse_count(name, value, 0);
        else if (strcmp(name, "shard_tokens") == 0) o.shard_tokens = parse_count(name, value, 1);
        else if (strcmp(name, "threads") == 0) {
            uint64_t threads = parse_count(name, value, 1);  // the trainer's own bound
            if (threads > 4096) fail("--threads must be an integer in [1, 4096], not '%s'", value);
            o.threads = (int)threads;
        }
        else if (strcmp(name, "batch_bytes") == 0) o.batch_bytes = parse_count(name, value, 1);
        else if (strcmp(name, "val_frac") == 0) {
            char *end = NULL;
            o.val_frac = strtod(value, &end);
            if (!end || *end || value[0] == '\0' || !(o.val_frac >= 0 && o.val_frac < 1))
                fail("--val_frac must be a number in [0, 1), not '%s'", value);
        } else if (strcmp(name, "progress_s") == 0) {
            char *end = NULL;
            o.progress_s = strtod(value, &end);
            if (!end || *end || value[0] == '\0' || !(o.progress_s >= 0 && o.progress_s <= 1e9))
                fail("--progress_s must be a number of seconds >= 0, not '%s'", value);
        } else {
            fail("prepare: unknown option --%s (see train_gpt prepare --help)", name);
        }
    }
    // Before anything is read or created: without the split regex no document can be encoded
    // (until 2026-12 the run got as far as its first document).
    if (!tokenizer_can_split())
        fail("prepare: this train_gpt was built without PCRE2, so it cannot encode text ---> HINT: apt-get install "
             "libpcre2-dev (or your system's PCRE2 development package) and rebuild with make");
    if (!o.tokenizer_path) fail("prepare: --tokenizer is required (see train_gpt prepare --help)");
    if (!o.out_prefix || !*o.out_prefix) fail("prepare: --out is required (see train_gpt prepare --help)");
    if (o.n_inputs == 0) fail("prepare: no input files given (see train_gpt prepare --help)");
    if (o.val_files && o.val_frac > 0) fail("prepare: give --val_files or --val_frac, not both");
    if (o.threads == 0) {
#ifdef _OPENMP
        o.threads = omp_get_num_procs();
#else
        o.threads = 1;
#endif
    }
    return o;
}

// ---------------------------------------------------------------- the val split

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

// Marks the inputs named in a comma-separated list (by file name or by path as given or
// found); every name must match some input.
static void mark_val_files(prep_input *inputs, size_t n, const char *list) {
    char *copy = xstrdup(list);
    char *save = NULL;
    for (char *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        bool matched = false;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(base_name(inputs[i].path), name) == 0 || strcmp(inputs[i].path, name) == 0) {
                inputs[i].is_val = true;
                matched = true;
            }
        }
        if (!matched) fail("--val_files: no input file is named %s", name);
    }
    free(copy);
}

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static bool picked_for_val(uint64_t seed, uint64_t ordinal, double frac) {
    return (double)(mix64(seed ^ mix64(ordinal)) >> 11) * 0x1.0p-53 < frac;
}

// ---------------------------------------------------------------- shard output

typedef struct {
    const char *split;        // "train" or "val"
    const char *prefix;
    uint32_t vocab_size, doc_token;
    uint64_t shard_tokens;
    void *writer;             // the sink's, while a shard is being written
    char *path;               // of the shard being written
    int shards;
    uint64_t tokens, documents;
    uint64_t *counts;         // unigram counts
} split_output;

// Shards are numbered in six digits so that a glob's sort is their order: a millionth would
// sort between the 100000th and the 100001st.
#define MAX_SHARDS 1000000

// A shard's final name, or (partial) the name it has until the run is complete.
static char *shard_path(const char *prefix, const char *split, int index, bool partial) {
    size_t n = strlen(prefix) + strlen(split) + 40;
    char *path = xmalloc(n);
    snprintf(path, n, "%s_%s_%06d.bin%s", prefix, split, index, partial ? ".partial" : "");
    return path;
}

// prefix with glob(3)'s special characters escaped, then `suffix` (a pattern) appended: an
// --out of "runs[1]/x" once matched nothing, so old shards went unnoticed.
static char *glob_of(const char *prefix, const char *suffix) {
    size_t n = 2 * strlen(prefix) + strlen(suffix) + 1;
    char *out = xmalloc(n), *q = out;
    for (const char *p = prefix; *p; p++) {
        if (strchr("*?[]\\", *p)) *q++ = '\\';
        *q++ = *p;
    }
    strcpy(q, suffix);
    return out;
}

// A run's shards are written as NAME.bin.partial and renamed to NAME.bin only once the whole
// run is done (an earlier run's, with --overwrite, removed just before): a run killed by a
// signal (SLURM's time limit, SIGKILL) leaves no shard under a name the trainer's glob reads,
// and a failed --overwrite leaves the old corpus whole. If the process fails half-way (fail()
// exits through atexit), the shard being written is dropped (its .tmp removed) and the partial
// shards this run finished are removed too; a killed run's are removed by the next run.
static split_output *outputs_to_abort[2];
static const shard_sink *sink;  // prepare_main's

static void abort_run_shards(void) {
    for (int i = 0; i < 2; i++) {
        split_output *o = outputs_to_abort[i];
        if (!o) continue;
        if (o->writer) {
            sink->abort(o->writer);
            o->writer = NULL;
        }
        for (int k = 0; k < o->shards; k++) {
            char *path = shard_path(o->prefix, o->split, k, true);
            unlink(path);   // the one being written was never renamed: ENOENT, fine
            free(path);
        }
    }
}

static void output_append(split_output *o, const uint32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) o->counts[ids[i]]++;
    o->tokens += n;
    while (n > 0) {
        if (!o->writer) {
            if (o->shards == MAX_SHARDS)
                fail("more than %d %s shards (--shard_tokens %llu): their names would no longer sort in order; raise "
                     "--shard_tokens",
                     MAX_SHARDS - 1, o->split, (unsigned long long)o->shard_tokens);
            free(o->path);
            o->path = shard_path(o->prefix, o->split, o->shards, true);
            o->writer = sink->open(o->path, o->vocab_size, o->doc_token);
            if (!o->writer) fail("cannot create shard %s.tmp: %s", o->path, strerror(errno));
            o->shards++;
        }
        uint64_t room = o->shard_tokens - sink->tokens(o->writer);
        size_t take = n < room ? n : (size_t)room;
        if (!sink->append(o->writer, ids, take)) fail("cannot write shard %s: %s", o->path, strerror(errno));
        ids += take;
        n -= take;
        if (sink->tokens(o->writer) == o->shard_tokens) {
            void *w = o->writer;
            o->writer = NULL;
            if (!sink->close(w)) fail("cannot finish shard %s: %s", o->path, strerror(errno));
            if (strcmp(o->split, "train") == 0 && fault_requested("prepare_term_after_shard", o->shards - 1)) {
                fflush(NULL);
                raise(SIGTERM);
            }
        }
    }
}

static void output_finish(split_output *o) {
    if (!o->writer) return;
    void *w = o->writer;
    o->writer = NULL;
    if (!sink->close(w)) fail("cannot finish shard %s: %s", o->path, strerror(errno));
}

static const char *const SPLITS[] = {"train", "val"};

// Shards of an earlier run would mix with this one's under the trainer's glob: refused
// without --overwrite (checked at the start); with it they are moved aside once this run is
// done and removed once this run's have their names (set_aside_earlier, drop_aside). Either
// way a killed run's partial shards go at the start (partial = true): NAME.bin.partial, and
// NAME.bin.partial.tmp of the shard it was writing and its summary's .tmp. Only this prefix's
// names (six digits: PREFIX_train_NNNNNN.bin), never those of another corpus whose prefix
// begins so (--out owt against owt_train_10k_train_000000.bin).
static void old_shards(const char *prefix, bool overwrite, bool partial) {
    static const char *const partial_suffixes[] = {".partial", ".partial.tmp"};
    for (int s = 0; s < 2; s++)
        for (int p = 0; p < (partial ? 2 : 1); p++) {
            char suffix[64];
            snprintf(suffix, sizeof suffix, "_%s_[0-9][0-9][0-9][0-9][0-9][0-9].bin%s", SPLITS[s],
                     partial ? partial_suffixes[p] : "");
            char *pattern = glob_of(prefix, suffix);
            glob_t g;
            if (glob(pattern, 0, NULL, &g) == 0) {
                if (!overwrite && !partial)
                    fail("%s already exists (an earlier run?) ---> HINT: pass --overwrite to replace it, or another "
                         "--out",
                         g.gl_pathv[0]);
                if (partial && g.gl_pathc > 0)
                    note("prepare: removing %zu partial shard(s) of a run that was stopped (%s, ...)", g.gl_pathc,
                         g.gl_pathv[0]);
                for (size_t i = 0; partial && i < g.gl_pathc; i++)
                    if (unlink(g.gl_pathv[i]) != 0) fail("cannot remove %s: %s", g.gl_pathv[i], strerror(errno));
                globfree(&g);
            }
            free(pattern);
        }
    if (partial) {   // a stopped run's summary .tmp is litter
        size_t n = strlen(prefix) + 24;
        char *path = xmalloc(n);
        snprintf(path, n, "%s_summary.json.tmp", prefix);
        if (unlink(path) != 0 && errno != ENOENT) fail("cannot remove %s: %s", path, strerror(errno));
        free(path);
    }
}

// ---------------------------------------------------------------- replacing an earlier run
// --overwrite: the earlier run's shards and summary are renamed to NAME.replaced just before
// this run's take their names, and removed only once all of this run's have: if one of this
// run's renames fails, its shards are taken back and the earlier run's files return to their
// names, so a failed replacement leaves the old corpus whole (until 2026-12 the old one was
// removed first, and a failed rename left neither corpus). A run killed between the two
// leaves NAME.replaced files: the next run refuses to start beside them without --overwrite
// (they may be the only copy of the old corpus), and one with --overwrite removes them once
// it is done.
static const char REPLACED[] = ".replaced";
static char **aside;   // the earlier run's files moved aside, by their own names
static int n_aside;

static char *aside_name(const char *path) {
    char *out = xmalloc(strlen(path) + sizeof REPLACED);
    sprintf(out, "%s%s", path, REPLACED);
    return out;
}

// The files of this prefix that match `suffix` after PREFIX_split_NNNNNN.bin (train's, then
// val's) and PREFIX_summary.json, appended to *paths.
static void earlier_files(const char *prefix, const char *suffix, char ***paths, int *count) {
    for (int s = 0; s < 3; s++) {
        char pat[80];
        if (s < 2) snprintf(pat, sizeof pat, "_%s_[0-9][0-9][0-9][0-9][0-9][0-9].bin%s", SPLITS[s], suffix);
        else snprintf(pat, sizeof pat, "_summary.json%s", suffix);
        char *pattern = glob_of(prefix, pat);
        glob_t g;
        if (glob(pattern, 0, NULL, &g) == 0) {
            *paths = xrealloc(*paths, (size_t)(*count + (int)g.gl_pathc) * sizeof **paths);
            for (size_t i = 0; i < g.gl_pathc; i++) (*paths)[(*count)++] = xstrdup(g.gl_pathv[i]);
            globfree(&g);
        }
        free(pattern);
    }
}

// At the start: NAME.replaced files of a run killed while it replaced its corpus.
static void check_replaced_leftovers(const char *prefix, bool overwrite) {
    char **left = NULL;
    int n = 0;
    earlier_files(prefix, REPLACED, &left, &n);
    if (n > 0 && !overwrite) {
        // Where it stopped, from the summaries: the earlier one goes aside last, this run's
        // summary is published last and the earlier one removed last. Renaming back over a
        // published corpus would mix the two (the new shards past the old count stay).
        size_t bytes = strlen(prefix) + 40;
        char *summary = xmalloc(bytes), *summary_aside = xmalloc(bytes);
        snprintf(summary, bytes, "%s_summary.json", prefix);
        snprintf(summary_aside, bytes, "%s_summary.json%s", prefix, REPLACED);
        bool published = access(summary, F_OK) == 0, all_aside = access(summary_aside, F_OK) == 0;
        if (published && all_aside)
            fail("%s exists: an earlier `prepare --overwrite` was stopped after its new corpus was whole (its summary "
                 "is in place) ---> HINT: delete the %s_*%s files (the corpus it replaced), or pass --overwrite",
                 left[0], prefix, REPLACED);
        if (all_aside)
            fail("%s exists: an earlier `prepare --overwrite` was stopped while it put its new shards in place (no "
                 "summary yet) ---> HINT: to keep the earlier corpus, delete %s_train_*.bin and %s_val_*.bin first "
                 "(the new run's, some in place), then rename the %s_*%s files back (drop %s); or pass --overwrite "
                 "to replace it",
                 left[0], prefix, prefix, prefix, REPLACED, REPLACED);
        fail("%s exists: an earlier `prepare --overwrite` was stopped while it moved its earlier corpus aside "
             "(nothing new in place yet) ---> HINT: rename the %s_*%s files back (drop %s) to keep that corpus, or "
             "pass --overwrite to replace it",
             left[0], prefix, REPLACED, REPLACED);
    }
    for (int i = 0; i < n; i++) free(left[i]);
    free(left);
}

// Puts what set_aside_earlier moved back under its names; returns how many could not be (they
// keep NAME.replaced; the first in *first).
static int restore_aside(const char **first) {
    int left = 0;
    *first = NULL;
    for (int i = 0; i < n_aside; i++) {
        char *from = aside_name(aside[i]);
        if (rename(from, aside[i]) != 0 && left++ == 0) *first = aside[i];
        free(from);
    }
    return left;
}

static void set_aside_earlier(const char *prefix) {
    earlier_files(prefix, "", &aside, &n_aside);
    for (int i = 0; i < n_aside; i++) {
        char *to = aside_name(aside[i]);
        int rc, error;
        if (fault_requested("prepare_aside_eio", i)) rc = -1, error = EIO;
        else rc = rename(aside[i], to), error = errno;
        if (rc != 0) {
            n_aside = i;   // the ones moved so far go back
            size_t n = strlen(prefix) + 24;
            char *summary = xmalloc(n);
            snprintf(summary, n, "%s_summary.json.tmp", prefix);
            unlink(summary);   // this run's (its partial shards go at the exit)
            const char *first;
            int left = restore_aside(&first);
            if (left)
                fail("cannot move %s aside to %s: %s; %d of the earlier run's %d files moved before it could not be "
                     "moved back: rename %s%s and the other *%s files back by hand",
                     aside[i], to, strerror(error), left, i, first, REPLACED, REPLACED);
            fail("cannot move %s aside to %s: %s; the earlier run's output is as it was", aside[i], to, strerror(error));
        }
        free(to);
    }
}

// This run's output has its names: the earlier run's goes, and any NAME.replaced left by a
// stopped --overwrite with it. A file that cannot be removed is only litter now: a warning.
static void drop_aside(const char *prefix) {
    for (int i = 0; i < n_aside; i++) free(aside[i]);
    free(aside);
    aside = NULL;
    n_aside = 0;
    char **left = NULL;
    int n = 0;
    earlier_files(prefix, REPLACED, &left, &n);
    for (int i = 0; i < n; i++) {
        if (unlink(left[i]) != 0) warn("cannot remove %s, the earlier run's: %s", left[i], strerror(errno));
        free(left[i]);
    }
    free(left);
}

// Removes the first `published` shards of the run (train's, then val's) under their final
// names; returns how many could not be removed.
static int take_back_shards(const split_output *const splits[2], int published) {
    int left = 0;
    for (int s = 0; s < 2 && published > 0; s++)
        for (int k = 0; k < splits[s]->shards && published > 0; k++, published--) {
            char *path = shard_path(splits[s]->prefix, splits[s]->split, k, false);
            if (unlink(path) != 0) left++;
            free(path);
        }
    return left;
}

// A rename of the publication failed (from → to, errno error) after `published` of this run's
// shards took their names: they are taken back, the summary's .tmp removed, the earlier run's
// files (--overwrite) put back, and the run fails with one line saying what is left.
static void undo_publish(const split_output *const splits[2], int published, const char *from, const char *to,
                         int error) {
    const char *prefix = splits[0]->prefix;
    int left = take_back_shards(splits, published);
    size_t n = strlen(prefix) + 24;
    char *summary = xmalloc(n);
    snprintf(summary, n, "%s_summary.json.tmp", prefix);
    unlink(summary);
    char earlier[PATH_MAX + 200] = "";
    if (n_aside > 0) {
        const char *first;
        int stuck = restore_aside(&first);
        if (stuck)
            snprintf(earlier, sizeof earlier, "; %d of the earlier run's %d files could not be put back: rename %s%s "
                     "and the other *%s files back by hand", stuck, n_aside, first, REPLACED, REPLACED);
        else
            snprintf(earlier, sizeof earlier, "; the earlier run's %d files are back under their names", n_aside);
    }
    if (left)
        fail("cannot rename %s to %s: %s; %d of the %d shards renamed before it could not be removed: "
             "remove %s_train_*.bin and %s_val_*.bin, a corpus with a hole%s",
             from, to, strerror(error), left, published, prefix, prefix, earlier);
    fail("cannot rename %s to %s: %s; the %d shards renamed before it were removed: no shard of this run "
         "is left%s",
         from, to, strerror(error), published, earlier);
}

// The run is done: its partial shards take their final names, train's then val's, and the
// summary its name last. If one cannot (EIO, EDQUOT), those already renamed are taken back
// before the run fails, and the exit removes the partial ones: shards 0..k-1 under their
// final names would be a corpus with a hole that the trainer's glob takes for whole (until
// 2026-12 they were left); with --overwrite the earlier run's output returns.
static void publish(const split_output *train, const split_output *val) {
    const split_output *const splits[2] = {train, val};
    int published = 0;
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < splits[s]->shards; k++) {
            const split_output *o = splits[s];
            char *from = shard_path(o->prefix, o->split, k, true), *to = shard_path(o->prefix, o->split, k, false);
            int rc, error;
            if (fault_requested("prepare_publish_eio", published)) rc = -1, error = EIO;
            else rc = rename(from, to), error = errno;
            if (rc != 0) undo_publish(splits, published, from, to, error);
            published++;
            free(from);
            free(to);
        }
    size_t n = strlen(train->prefix) + 24;
    char *path = xmalloc(n), *tmp = xmalloc(n);
    snprintf(path, n, "%s_summary.json", train->prefix);
    snprintf(tmp, n, "%s_summary.json.tmp", train->prefix);
    int rc, error;
    if (fault_requested("prepare_publish_eio", published)) rc = -1, error = EIO;
    else rc = rename(tmp, path), error = errno;
    if (rc != 0) undo_publish(splits, published, tmp, path, error);
    free(path);
    free(tmp);
}

static void make_parent_dirs(const char *prefix) {
    char *dir = xstrdup(prefix);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (!make_dirs(dir)) fail("cannot create output directory %s: %s", dir, strerror(errno));
    }
    free(dir);
}

// ---------------------------------------------------------------- statistics

static double entropy_nats(const uint64_t *counts, uint32_t vocab_size, uint64_t total) {
    double h = 0;
    for (uint32_t i = 0; i < vocab_size; i++)
        if (counts[i]) {
            double p = (double)counts[i] / (double)total;
            h -= p * log(p);
        }
    return h;
}

// Cross-entropy of `eval` under add-one-smoothed unigram probabilities of `model`.
static double unigram_cross_entropy(const uint64_t *model, uint64_t model_total, const uint64_t *eval,
                                    uint64_t eval_total, uint32_t vocab_size) {
    double h = 0;
    for (uint32_t i = 0; i < vocab_size; i++)
        if (eval[i]) {
            double q = ((double)model[i] + 1) / ((double)model_total + vocab_size);
            h -= (double)eval[i] / (double)eval_total * log(q);
        }
    return h;
}

// ---------------------------------------------------------------- the pipeline

typedef struct {
    int thread;
    uint64_t start, count;   // in that thread's token buffer
} doc_tokens;

// The ids of one batch: per document, where its ids are in the per-thread buffers.
typedef struct {
    token_list *buffer;      // per thread
    doc_tokens *docs;
    size_t docs_capacity;
} batch_tokens;

typedef struct {
    const tokenizer *tok;
    const prepare_options *opt;
    const prep_input *inputs;
    uint32_t doc_token;
    int threads;
    tokenizer_scratch **scratch;   // per thread
    strbuf *json_text;             // per thread
    // The first failure of the batch being encoded (lowest document index).
    size_t error_doc;
    char error[400];
} encoder;

typedef struct {
    prep_reader *reader;
    split_output *train, *val;
    uint64_t total_bytes;
    double start, last_note;
} writer_state;

static void encode_doc(encoder *e, const prep_batch *b, long i, int thread, token_list *out, strbuf *json,
                       doc_tokens *dt) {
    const prep_doc *d = &b->docs[i];
    const char *text = b->text + d->offset;
    size_t bytes = d->bytes;
    char why[300];
    dt->thread = thread;
    dt->start = out->count;
    bool ok = true;
    if (d->is_json) {
        json->length = 0;
        ok = prep_json_text(text, bytes, e->opt->text_key, json, why, sizeof why);
        text = json->data;
        bytes = json->length;
    }
    if (ok && bytes > 0) {
        if (e->doc_token != sink->no_doc_token) token_list_push(out, e->doc_token);
        ok = tokenizer_encode_append(e->tok, e->scratch[thread], text, bytes, false, out, why, sizeof why);
    }
    dt->count = out->count - dt->start;
    if (!ok) {
#pragma omp critical(prepare_error)
        if ((size_t)i < e->error_doc) {
            e->error_doc = (size_t)i;
            snprintf(e->error, sizeof e->error, "%s:%llu: %s", e->inputs[d->input].path, (unsigned long long)d->line,
                     why);
        }
    }
}

// One progress line. Rates are over the whole run so far; the ETA extrapolates the rate of
// file bytes (compressed bytes, for compressed inputs) to the inputs' total size.
static void note_progress(const writer_state *w, double now) {
    uint64_t file_bytes = prep_reader_file_bytes_done(w->reader);
    uint64_t tokens = w->train->tokens + w->val->tokens;
    double seconds = now - w->start > 1e-3 ? now - w->start : 1e-3;
    double rate = (double)file_bytes / seconds;
    uint64_t left = w->total_bytes > file_bytes ? w->total_bytes - file_bytes : 0;
    char eta[32];
    format_duration(rate > 0 ? (double)left / rate : -1, eta, sizeof eta);
    note("prepare: %.1f of %.1f MB read (%.0f%%) at %.1f MB/s, %.1f MB of text, %.2fM tokens at %.2fM tokens/s, ETA %s",
         (double)file_bytes / 1e6, (double)w->total_bytes / 1e6,
         w->total_bytes ? 100.0 * (double)file_bytes / (double)w->total_bytes : 100.0, rate / 1e6,
         (double)prep_reader_bytes_done(w->reader) / 1e6, (double)tokens / 1e6, (double)tokens / 1e6 / seconds, eta);
}

// Appends an encoded batch to the shards, in input order, and notes progress.
static void write_batch(writer_state *w, const prepare_options *opt, const prep_batch *b, const batch_tokens *bt) {
    for (size_t i = 0; i < b->n_docs; i++) {
        const prep_doc *d = &b->docs[i];
        const doc_tokens *dt = &bt->docs[i];
        if (dt->count == 0) continue;   // empty text
        bool to_val = d->is_val || (opt->val_frac > 0 && picked_for_val(opt->seed, d->ordinal, opt->val_frac));
        split_output *o = to_val ? w->val : w->train;
        o->documents++;
        output_append(o, bt->buffer[dt->thread].ids + dt->start, dt->count);
    }
    double now = wall_seconds();
    if (!opt->quiet && now - w->last_note >= opt->progress_s) {
        note_progress(w, now);
        w->last_note = now;
    }
}

// One step of the pipeline, on all threads: one thread writes the previous batch (if any)
// and reads the next while the others encode the current one; it joins the encoding when its
// I/O is done. Returns whether the next batch has documents.
static bool pipeline_step(encoder *e, writer_state *w, const prep_batch *current, batch_tokens *current_tokens,
                          const prep_batch *previous, const batch_tokens *previous_tokens, prep_batch *next) {
    if (current->n_docs > current_tokens->docs_capacity) {
        current_tokens->docs_capacity = current->n_docs;
        current_tokens->docs = xrealloc(current_tokens->docs, current->n_docs * sizeof *current_tokens->docs);
    }
    for (int t = 0; t < e->threads; t++) current_tokens->buffer[t].count = 0;
    e->error_doc = SIZE_MAX;
    bool more = false;
    long n_docs = (long)current->n_docs;
#pragma omp parallel num_threads(e->threads)
    {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        // Thread-local copies: the per-thread structs share cache lines, and writing their
        // counts on every token from two cores would bounce those lines between them.
        token_list out = current_tokens->buffer[thread];
        strbuf json = e->json_text[thread];
#pragma omp single nowait
        {
            if (previous) write_batch(w, e->opt, previous, previous_tokens);
            more = prep_reader_fill(w->reader, next, (size_t)e->opt->batch_bytes);
        }
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < n_docs; i++) encode_doc(e, current, i, thread, &out, &json, &current_tokens->docs[i]);
        current_tokens->buffer[thread] = out;
        e->json_text[thread] = json;
    }
    if (e->error_doc != SIZE_MAX) fail("%s", e->error);
    return more;
}

// ---------------------------------------------------------------- main

static uint32_t resolve_doc_token(const tokenizer *tok, const char *spec) {
    uint32_t vocab = tokenizer_vocab_size(tok);
    if (!spec) {
        uint32_t id = tokenizer_doc_token(tok);
        if (id == TOKENIZER_NO_TOKEN)
            fail("the tokenizer has none of <|begin_of_text|>, <|endoftext|>, <s> ---> HINT: pass --doc_token ID, "
                 "--doc_token NAME or --doc_token none");
        return id;
    }
    if (strcmp(spec, "none") == 0) return sink->no_doc_token;
    if (spec[0] >= '0' && spec[0] <= '9') {
        uint64_t id = parse_count("doc_token", spec, 0);
        if (id >= vocab) fail("--doc_token %s is not below the vocabulary size %u", spec, vocab);
        return (uint32_t)id;
    }
    uint32_t id = tokenizer_special_id(tok, spec);
    if (id == TOKENIZER_NO_TOKEN) fail("--doc_token: the tokenizer has no special token %s", spec);
    return id;
}

static void print_split(const split_output *o) {
    printf("prepare: %-5s %llu document%s, %llu tokens, %d shard%s", o->split, (unsigned long long)o->documents,
           o->documents == 1 ? "" : "s", (unsigned long long)o->tokens, o->shards, o->shards == 1 ? "" : "s");
    if (o->shards > 0) {
        char *first = shard_path(o->prefix, o->split, 0, false);
        printf(" (%s%s)", first, o->shards > 1 ? ", ..." : "");
        free(first);
    }
    printf("\n");
}

static void write_summary(const char *prefix, const tokenizer *tok, const char *tokenizer_path, uint32_t doc_token,
                          const split_output *train, const split_output *val, double val_entropy,
                          double val_cross_entropy, uint64_t bytes, uint64_t file_bytes, double seconds) {
    strbuf sb = {0};
    sb_append(&sb, "{\"tokenizer\": ");
    sb_json_string(&sb, tokenizer_path);
    sb_append(&sb, ", \"tokenizer_name\": ");
    sb_json_string(&sb, tokenizer_name(tok));
    sb_printf(&sb, ", \"vocab_size\": %u, \"doc_token\": ", tokenizer_vocab_size(tok));
    if (doc_token == sink->no_doc_token) sb_append(&sb, "null");
    else sb_printf(&sb, "%u", doc_token);
    sb_printf(&sb, ", \"input_bytes\": %llu, \"input_file_bytes\": %llu, \"seconds\": ", (unsigned long long)bytes,
              (unsigned long long)file_bytes);
    sb_json_number(&sb, seconds);
    const split_output *splits[2] = {train, val};
    for (int s = 0; s < 2; s++) {
        sb_printf(&sb, ", \"%s\": {\"documents\": %llu, \"tokens\": %llu, \"shards\": %d}", splits[s]->split,
                  (unsigned long long)splits[s]->documents, (unsigned long long)splits[s]->tokens, splits[s]->shards);
    }
    if (val->tokens > 0) {
        sb_append(&sb, ", \"val_unigram_entropy_nats\": ");
        sb_json_number(&sb, val_entropy);
        sb_append(&sb, ", \"val_cross_entropy_under_train_unigram_nats\": ");
        sb_json_number(&sb, val_cross_entropy);
    }
    sb_append(&sb, "}\n");
    size_t n = strlen(prefix) + 24;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s_summary.json.tmp", prefix);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fwrite(sb.data, 1, sb.length, f) == sb.length && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int error = errno;
    if (f && fclose(f) != 0 && ok) ok = false, error = errno;
    if (ok && fault_requested("prepare_summary_enospc", 0)) ok = false, error = ENOSPC;   // a full disk, as late as can be
    if (!ok) {
        unlink(tmp);
        fail("cannot write %s: %s", tmp, strerror(error));
    }
    free(tmp);
    sb_free(&sb);
}

int prepare_main(int argc, char **argv, const shard_sink *shards) {
    sink = shards;
    prepare_options opt = parse_options(argc, argv);
    double start = wall_seconds();

    size_t n_inputs = 0;
    prep_input *inputs = prep_list_inputs(opt.inputs, opt.n_inputs, opt.format, opt.out_prefix, &n_inputs);
    if (opt.val_files) mark_val_files(inputs, n_inputs, opt.val_files);
    uint64_t total_bytes = 0;
    for (size_t i = 0; i < n_inputs; i++) total_bytes += inputs[i].bytes;

    char why[400];
    tokenizer *tok = tokenizer_load(opt.tokenizer_path, opt.encoding, why, sizeof why);
    if (!tok) fail("%s", why);
    uint32_t doc_token = resolve_doc_token(tok, opt.doc_token);
    uint32_t vocab_size = tokenizer_vocab_size(tok);

    make_parent_dirs(opt.out_prefix);
    check_replaced_leftovers(opt.out_prefix, opt.overwrite);
    old_shards(opt.out_prefix, opt.overwrite, false);   // refused without --overwrite
    old_shards(opt.out_prefix, true, true);              // a stopped run's partial shards
    split_output train = {"train", opt.out_prefix, vocab_size, doc_token, opt.shard_tokens, NULL, NULL, 0, 0, 0,
                          xcalloc(vocab_size, sizeof(uint64_t))};
    split_output val = train;
    val.split = "val";
    val.counts = xcalloc(vocab_size, sizeof(uint64_t));
    outputs_to_abort[0] = &train;
    outputs_to_abort[1] = &val;
    atexit(abort_run_shards);

    if (!opt.quiet) {
        char doc_name[80] = "none";
        if (doc_token != sink->no_doc_token) {
            size_t n;
            const uint8_t *b = tokenizer_token_bytes(tok, doc_token, &n);
            snprintf(doc_name, sizeof doc_name, "%u (%.*s)", doc_token, (int)(n < 60 ? n : 60), b ? (const char *)b : "");
        }
        size_t compressed = 0;
        for (size_t i = 0; i < n_inputs; i++) compressed += inputs[i].compression != PREP_PLAIN;
        char files[64] = "";
        if (compressed) snprintf(files, sizeof files, " (%zu compressed)", compressed);
        note("prepare: %zu input files%s, %.1f MB; tokenizer %s, vocab_size %u, doc_token %s, %d threads", n_inputs,
             files, (double)total_bytes / 1e6, tokenizer_name(tok), vocab_size, doc_name, opt.threads);
    }

    encoder enc = {0};
    enc.tok = tok;
    enc.opt = &opt;
    enc.inputs = inputs;
    enc.doc_token = doc_token;
    enc.threads = opt.threads;
    enc.scratch = xcalloc((size_t)opt.threads, sizeof *enc.scratch);
    enc.json_text = xcalloc((size_t)opt.threads, sizeof *enc.json_text);
    for (int t = 0; t < opt.threads; t++) enc.scratch[t] = tokenizer_scratch_new(tok);

    // Three batches rotate (being written, being encoded, being read) and two sets of token
    // buffers (the written batch's and the encoded batch's).
    prep_reader *reader = prep_reader_open(inputs, n_inputs, opt.separator, opt.separator_bytes);
    prep_batch batch[3] = {{0}};
    batch_tokens tokens[2] = {{0}};
    for (int k = 0; k < 2; k++) tokens[k].buffer = xcalloc((size_t)opt.threads, sizeof *tokens[k].buffer);
    writer_state ws = {reader, &train, &val, total_bytes, start, start};
    bool have = prep_reader_fill(reader, &batch[0], (size_t)opt.batch_bytes);
    long step = 0;
    while (have) {
        const prep_batch *previous = step > 0 ? &batch[(step + 2) % 3] : NULL;
        have = pipeline_step(&enc, &ws, &batch[step % 3], &tokens[step % 2], previous, &tokens[(step + 1) % 2],
                             &batch[(step + 1) % 3]);
        step++;
    }
    if (step > 0) write_batch(&ws, &opt, &batch[(step + 2) % 3], &tokens[(step + 1) % 2]);
    output_finish(&train);
    output_finish(&val);
    double seconds = wall_seconds() - start;
    uint64_t bytes = prep_reader_bytes_done(reader);
    uint64_t file_bytes = prep_reader_file_bytes_done(reader);

    if (train.tokens == 0) warn("no train tokens were written (are the inputs empty, or all in val?)");
    if ((opt.val_files || opt.val_frac > 0) && val.tokens == 0) warn("no val tokens were written");
    double val_entropy = val.tokens ? entropy_nats(val.counts, vocab_size, val.tokens) : 0;
    double val_cross = val.tokens ? unigram_cross_entropy(train.counts, train.tokens, val.counts, val.tokens, vocab_size)
                                  : 0;
    if (file_bytes != bytes)
        printf("prepare: read %zu files, %llu bytes (%llu bytes of text), in %.2f s (%.1f MB/s of files, %.1f MB/s of "
               "text, %.2fM tokens/s on %d threads)\n",
               n_inputs, (unsigned long long)file_bytes, (unsigned long long)bytes, seconds,
               (double)file_bytes / 1e6 / seconds, (double)bytes / 1e6 / seconds,
               (double)(train.tokens + val.tokens) / 1e6 / seconds, opt.threads);
    else
        printf("prepare: read %zu files, %llu bytes, in %.2f s (%.1f MB/s, %.2fM tokens/s on %d threads)\n", n_inputs,
               (unsigned long long)bytes, seconds, (double)bytes / 1e6 / seconds,
               (double)(train.tokens + val.tokens) / 1e6 / seconds, opt.threads);
    print_split(&train);
    print_split(&val);
    if (val.tokens) {
        printf("prepare: val unigram entropy %.4f nats/token; val cross-entropy under a unigram model of train "
               "(add-one) %.4f nats/token\n",
               val_entropy, val_cross);
    }
    // Complete: the summary is written aside (a full disk fails the run here, before anything
    // is published or moved), the earlier run's output is moved aside (--overwrite), this
    // one's takes its names, the summary its name last, and then the earlier output goes.
    write_summary(opt.out_prefix, tok, opt.tokenizer_path, doc_token, &train, &val, val_entropy, val_cross, bytes,
                  file_bytes, seconds);
    if (opt.overwrite) set_aside_earlier(opt.out_prefix);
    publish(&train, &val);
    outputs_to_abort[0] = outputs_to_abort[1] = NULL;   // nothing partial is left to remove
    if (opt.overwrite) drop_aside(opt.out_prefix);
    fflush(stdout);

    prep_reader_close(reader);
    for (int k = 0; k < 3; k++) prep_batch_free(&batch[k]);
    for (int k = 0; k < 2; k++) {
        for (int t = 0; t < opt.threads; t++) free(tokens[k].buffer[t].ids);
        free(tokens[k].buffer);
        free(tokens[k].docs);
    }
    for (int t = 0; t < opt.threads; t++) {
        tokenizer_scratch_free(enc.scratch[t]);
        sb_free(&enc.json_text[t]);
    }
    free(enc.scratch);
    free(enc.json_text);
    outputs_to_abort[0] = outputs_to_abort[1] = NULL;
    free(train.counts);
    free(val.counts);
    free(train.path);
    free(val.path);
    free(opt.separator);
    free(opt.inputs);
    tokenizer_free(tok);
    prep_free_inputs(inputs, n_inputs);
    return 0;
}
