// tok/prepare_input.c — input files, documents and JSONL text for `train_gpt prepare` (see
// tok/prepare_input.h).
//
// The reader streams each file through a pending buffer: it looks for the next document
// boundary (a newline for JSONL, the separator for text) in what it has, copies each whole
// document into the batch, and reads another block only when no boundary is left. At the
// end of a file the rest is the last document. So memory is a block plus the batch, and the
// batch always ends on a document boundary: the tokens of a document never depend on how
// the input was cut into batches. The blocks are text: a compressed file is decoded block by
// block as it is read (tok/prepare_stream.c), so documents never see the compression.
//
// The JSONL reader is its own small strict JSON scanner rather than llmc/json.h's tree builder:
// it only has to keep one member of each line, must keep NUL characters (\u0000) that
// llmc/json.h refuses, and runs on every line of corpora of many gigabytes.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tok/prepare_input.h"
#include "llmc/common.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ---------------------------------------------------------------- listing inputs

typedef struct {
    prep_input *items;
    size_t count, capacity;
    const char *format_name;
    uint64_t skipped;        // files in directories that are not text or JSONL by name
    char *first_skipped;
    char *out_dir;           // the output's directory (realpath; NULL: none yet) and its name prefix
    const char *out_base;
    uint64_t own;            // files of a run of this --out found in the input directories
    char *first_own;
} input_list;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// Whether the name without its compression suffix ends in one of the suffixes.
static bool named_like(const char *path, prep_compression compression, const char *const *suffixes, size_t n) {
    size_t bytes = strlen(path) - strlen(prep_compression_suffix(compression));
    if (compression == PREP_ZSTD && ends_with(path, ".zstd")) bytes = strlen(path) - strlen(".zstd");
    char *name = xmalloc(bytes + 1);
    memcpy(name, path, bytes);
    name[bytes] = '\0';
    bool match = false;
    for (size_t i = 0; i < n && !match; i++) match = ends_with(name, suffixes[i]);
    free(name);
    return match;
}

// .json too: corpora of JSON lines are often named so (C4's c4-train.00000-of-01024.json.gz), and
// read as text each file became one document of JSON syntax without a word; a file that is one
// JSON document over many lines is an error at its first line instead.
static const char *const jsonl_suffixes[] = {".jsonl", ".ndjson", ".json"};
static const char *const corpus_suffixes[] = {".txt", ".jsonl", ".ndjson", ".json"};

// Whether path, found in a directory, is output of a run of this --out (PREFIX_summary.json,
// PREFIX_train_NNNNNN.bin, their .partial, .tmp and .replaced): with the output next to its text, a second
// run read the first one's shards and summary as text (or failed on the summary as JSONL).
static bool own_output(const input_list *list, const char *path) {
    if (!list->out_dir) return false;
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    size_t n = strlen(list->out_base);
    if (strncmp(name, list->out_base, n) != 0 || name[n] != '_') return false;
    const char *rest = name + n + 1;
    if (strcmp(rest, "summary.json") != 0 && strcmp(rest, "summary.json.tmp") != 0 &&
        strcmp(rest, "summary.json.replaced") != 0) {   // not summary.jsonl
        if (strncmp(rest, "train_", 6) == 0) rest += 6;
        else if (strncmp(rest, "val_", 4) == 0) rest += 4;
        else return false;
        for (int i = 0; i < 6; i++)
            if (rest[i] < '0' || rest[i] > '9') return false;
        rest += 6;
        if (strcmp(rest, ".bin") != 0 && strcmp(rest, ".bin.partial") != 0 && strcmp(rest, ".bin.partial.tmp") != 0 &&
            strcmp(rest, ".bin.tmp") != 0 && strcmp(rest, ".bin.replaced") != 0)
            return false;
    }
    char *dir = slash ? xstrdup(path) : xstrdup(".");
    if (slash) dir[slash - path] = '\0';
    char *real = realpath(slash == path ? "/" : dir, NULL);
    bool same = real && strcmp(real, list->out_dir) == 0;
    free(real);
    free(dir);
    return same;
}

// Leaves path out when it is output of this --out (own_output), counting it for the note.
static bool left_out_as_own(input_list *list, const char *path) {
    if (!own_output(list, path)) return false;
    if (list->own++ == 0) list->first_own = xstrdup(path);
    return true;
}

// in_directory: found by walking a directory (not named by the user), so with --format auto
// only files named like text or JSONL are taken, and never this --out's own output.
static void add_file(input_list *list, const char *path, uint64_t bytes, bool in_directory) {
    bool is_auto = strcmp(list->format_name, "auto") == 0;
    if (in_directory && left_out_as_own(list, path)) return;
    if (in_directory && is_auto) {
        // Test the name before prep_compression_of, which refuses .xz and the like.
        prep_compression c = ends_with(path, ".gz") ? PREP_GZIP
                             : ends_with(path, ".zst") || ends_with(path, ".zstd") ? PREP_ZSTD
                                                                                   : PREP_PLAIN;
        if (!named_like(path, c, corpus_suffixes, 4)) {
            if (list->skipped++ == 0) list->first_skipped = xstrdup(path);
            return;
        }
    }
    prep_compression compression = prep_compression_of(path);
    prep_compression_require(compression, path);
    if (list->count == list->capacity) {
        list->capacity = list->capacity ? list->capacity * 2 : 16;
        list->items = xrealloc(list->items, list->capacity * sizeof *list->items);
    }
    prep_format format = PREP_TEXT;
    if (strcmp(list->format_name, "jsonl") == 0 || (is_auto && named_like(path, compression, jsonl_suffixes, 3)))
        format = PREP_JSONL;
    list->items[list->count++] = (prep_input){xstrdup(path), bytes, format, compression, false};
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void add_path(input_list *list, const char *path, int depth) {
    struct stat st;
    if (stat(path, &st) != 0) fail("cannot read input %s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        if (access(path, R_OK) != 0) fail("cannot read input %s: %s", path, strerror(errno));
        add_file(list, path, (uint64_t)st.st_size, depth > 0);
        return;
    }
    if (!S_ISDIR(st.st_mode)) fail("input %s is neither a file nor a directory", path);
    if (depth > 64) fail("input %s: directories nested too deep (a link loop?)", path);
    DIR *dir = opendir(path);
    if (!dir) fail("cannot read input directory %s: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, capacity = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.') continue;   // hidden files, "." and ".."
        if (n == capacity) {
            capacity = capacity ? capacity * 2 : 64;
            names = xrealloc(names, capacity * sizeof *names);
        }
        names[n++] = xstrdup(e->d_name);
    }
    closedir(dir);
    qsort(names, n, sizeof *names, compare_names);
    for (size_t i = 0; i < n; i++) {
        char *child = xmalloc(strlen(path) + strlen(names[i]) + 2);
        sprintf(child, "%s%s%s", path, ends_with(path, "/") ? "" : "/", names[i]);
        add_path(list, child, depth + 1);
        free(child);
        free(names[i]);
    }
    free(names);
}

// An argument that names no file but has glob characters is a pattern: each match (sorted
// by glob) is an input as if named, directories walked.
static bool add_pattern(input_list *list, const char *pattern) {
    struct stat st;
    if (stat(pattern, &st) == 0 || !strpbrk(pattern, "*?[")) return false;
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) fail("input pattern %s matches no file", pattern);
    if (rc != 0) fail("cannot expand input pattern %s: %s", pattern, rc == GLOB_NOSPACE ? "out of memory" : "read error");
    for (size_t i = 0; i < g.gl_pathc; i++) {
        // 'dir/*' lists the earlier run's output as a directory would.
        if (!left_out_as_own(list, g.gl_pathv[i])) add_path(list, g.gl_pathv[i], 0);
    }
    globfree(&g);
    return true;
}

prep_input *prep_list_inputs(char *const *paths, int n_paths, const char *format_name, const char *out_prefix,
                             size_t *count) {
    if (strcmp(format_name, "auto") != 0 && strcmp(format_name, "text") != 0 && strcmp(format_name, "jsonl") != 0)
        fail("--format must be auto, text or jsonl, not '%s'", format_name);
    input_list list = {0};
    list.format_name = format_name;
    if (out_prefix) {
        const char *slash = strrchr(out_prefix, '/');
        char *dir = slash ? xstrdup(out_prefix) : xstrdup(".");
        if (slash) dir[slash - out_prefix] = '\0';
        list.out_dir = realpath(slash == out_prefix ? "/" : dir, NULL);   // NULL: not there yet, nothing of it to find
        list.out_base = slash ? slash + 1 : out_prefix;
        free(dir);
    }
    for (int i = 0; i < n_paths; i++)
        if (!add_pattern(&list, paths[i])) add_path(&list, paths[i], 0);
    if (list.own > 0)
        note("prepare: left out %llu file%s of an earlier run of this --out found in the input directories, e.g. %s",
             (unsigned long long)list.own, list.own == 1 ? "" : "s", list.first_own);
    free(list.first_own);
    free(list.out_dir);
    if (list.skipped > 0)
        warn("skipped %llu file%s in the input directories not named *.txt, *.jsonl, *.ndjson or *.json (optionally .gz or "
             ".zst), e.g. %s ---> HINT: name such files on the command line, or pass --format text or jsonl",
             (unsigned long long)list.skipped, list.skipped == 1 ? "" : "s", list.first_skipped);
    free(list.first_skipped);
    if (list.count == 0)
        fail("no input files (the directories given hold %s)",
             strcmp(format_name, "auto") == 0 ? "no *.txt, *.jsonl, *.ndjson or *.json files" : "no files");
    *count = list.count;
    return list.items;
}

void prep_free_inputs(prep_input *inputs, size_t count) {
    for (size_t i = 0; i < count; i++) free(inputs[i].path);
    free(inputs);
}

// ---------------------------------------------------------------- batches

void prep_batch_free(prep_batch *b) {
    free(b->text);
    free(b->docs);
    memset(b, 0, sizeof *b);
}

static void batch_add(prep_batch *b, const char *bytes, size_t n, const prep_doc *doc) {
    if (b->bytes + n > b->capacity) {
        size_t cap = b->capacity ? b->capacity : 1 << 20;
        while (cap < b->bytes + n) cap *= 2;
        b->text = xrealloc(b->text, cap);
        b->capacity = cap;
    }
    if (b->n_docs == b->docs_capacity) {
        b->docs_capacity = b->docs_capacity ? b->docs_capacity * 2 : 1024;
        b->docs = xrealloc(b->docs, b->docs_capacity * sizeof *b->docs);
    }
    memcpy(b->text + b->bytes, bytes, n);
    prep_doc d = *doc;
    d.offset = b->bytes;
    d.bytes = n;
    b->docs[b->n_docs++] = d;
    b->bytes += n;
}

// ---------------------------------------------------------------- the reader

#define READ_BLOCK_BYTES ((size_t)8 << 20)

struct prep_reader {
    const prep_input *inputs;
    size_t n_inputs;
    const char *separator;
    size_t separator_bytes;
    size_t current;          // input being read
    prep_stream *stream;     // NULL: not open
    bool at_eof;
    char *pending;           // bytes read from the current file, not yet made documents
    size_t pending_start, pending_end, pending_capacity;
    size_t scan_from;        // no boundary in pending before this offset
    uint64_t line;           // documents (or lines) of the current file so far
    uint64_t ordinal;
    uint64_t bytes_done;     // text
    uint64_t file_bytes_done;   // of the files closed
    size_t block_bytes;      // read size: the smaller of READ_BLOCK_BYTES and the batch size
};

prep_reader *prep_reader_open(const prep_input *inputs, size_t n_inputs, const char *separator, size_t separator_bytes) {
    prep_reader *r = xcalloc(1, sizeof *r);
    r->inputs = inputs;
    r->n_inputs = n_inputs;
    r->separator = separator;
    r->separator_bytes = separator ? separator_bytes : 0;
    return r;
}

void prep_reader_close(prep_reader *r) {
    if (!r) return;
    prep_stream_close(r->stream);
    free(r->pending);
    free(r);
}

uint64_t prep_reader_bytes_done(const prep_reader *r) { return r->bytes_done; }

uint64_t prep_reader_file_bytes_done(const prep_reader *r) {
    return r->file_bytes_done + (r->stream ? prep_stream_file_bytes(r->stream) : 0);
}

// Appends up to `want` bytes of the current file's text to pending; sets at_eof at its end.
static void read_more(prep_reader *r, size_t want) {
    if (r->pending_start > 0) {   // compact
        memmove(r->pending, r->pending + r->pending_start, r->pending_end - r->pending_start);
        r->pending_end -= r->pending_start;
        r->scan_from -= r->pending_start;
        r->pending_start = 0;
    }
    if (r->pending_end + want > r->pending_capacity) {
        r->pending_capacity = r->pending_end + want;
        r->pending = xrealloc(r->pending, r->pending_capacity);
    }
    size_t got = prep_stream_read(r->stream, r->pending + r->pending_end, want);
    r->pending_end += got;
    if (got < want) r->at_eof = true;
}

static bool open_next_input(prep_reader *r) {
    while (r->current < r->n_inputs) {
        const prep_input *in = &r->inputs[r->current];
        r->stream = prep_stream_open(in->path, in->compression);
        r->at_eof = false;
        r->pending_start = r->pending_end = r->scan_from = 0;
        r->line = 0;
        return true;
    }
    return false;
}

static void close_input(prep_reader *r) {
    r->file_bytes_done += prep_stream_file_bytes(r->stream);
    prep_stream_close(r->stream);
    r->stream = NULL;
    r->current++;
}

// Emits pending[start, end) as a document (unless it is empty, or a blank JSONL line).
static void emit(prep_reader *r, prep_batch *b, size_t start, size_t end) {
    const prep_input *in = &r->inputs[r->current];
    r->line++;
    const char *p = r->pending + start;
    size_t n = end - start;
    if (in->format == PREP_JSONL) {
        while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        size_t lead = 0;
        while (lead < n && (p[lead] == ' ' || p[lead] == '\t')) lead++;
        if (lead == n) return;
    }
    if (n == 0) return;
    prep_doc doc = {0, 0, (uint32_t)r->current, r->ordinal++, r->line, in->format == PREP_JSONL, in->is_val};
    batch_add(b, p, n, &doc);
}

bool prep_reader_fill(prep_reader *r, prep_batch *b, size_t target_bytes) {
    b->bytes = 0;
    b->n_docs = 0;
    // Small batches read small blocks (tests use this to cut separators across reads).
    r->block_bytes = target_bytes < READ_BLOCK_BYTES ? (target_bytes > 16 ? target_bytes : 16) : READ_BLOCK_BYTES;
    while (b->bytes < target_bytes) {
        if (!r->stream && !open_next_input(r)) break;
        const prep_input *in = &r->inputs[r->current];
        const char *delimiter = in->format == PREP_JSONL ? "\n" : r->separator;
        size_t delimiter_bytes = in->format == PREP_JSONL ? 1 : r->separator_bytes;
        if (!delimiter) {
            // One document per file: read it whole.
            while (!r->at_eof) read_more(r, r->block_bytes);
            emit(r, b, r->pending_start, r->pending_end);
            r->bytes_done += r->pending_end - r->pending_start;
            close_input(r);
            continue;
        }
        const char *base = r->pending + r->pending_start;
        size_t have = r->pending_end - r->pending_start;
        size_t from = r->scan_from - r->pending_start;
        const char *hit = have > from ? memmem(base + from, have - from, delimiter, delimiter_bytes) : NULL;
        if (hit) {
            size_t end = (size_t)(hit - r->pending);
            emit(r, b, r->pending_start, end);
            r->bytes_done += end + delimiter_bytes - r->pending_start;
            r->pending_start = r->scan_from = end + delimiter_bytes;
            continue;
        }
        if (!r->at_eof) {
            // A separator may straddle the old end: rescan its last bytes - 1.
            r->scan_from = r->pending_end >= delimiter_bytes - 1 + r->pending_start
                               ? r->pending_end - (delimiter_bytes - 1)
                               : r->pending_start;
            read_more(r, r->block_bytes);
            continue;
        }
        emit(r, b, r->pending_start, r->pending_end);
        r->bytes_done += r->pending_end - r->pending_start;
        close_input(r);
    }
    return b->n_docs > 0 || r->current < r->n_inputs;
}

// ---------------------------------------------------------------- JSONL text

typedef struct {
    const char *p, *end, *start;
    char *why;
    size_t why_bytes;
    int depth;
} scanner;

static bool scan_error(scanner *s, const char *what) {
    snprintf(s->why, s->why_bytes, "%s at column %zu", what, (size_t)(s->p - s->start) + 1);
    return false;
}

static void skip_space(scanner *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r' || *s->p == '\n')) s->p++;
}

static void append_bytes(strbuf *out, const void *bytes, size_t n) {
    if (!out) return;
    if (out->length + n + 1 > out->capacity) {
        size_t cap = out->capacity ? out->capacity : 256;
        while (cap < out->length + n + 1) cap *= 2;
        out->data = xrealloc(out->data, cap);
        out->capacity = cap;
    }
    memcpy(out->data + out->length, bytes, n);
    out->length += n;
    out->data[out->length] = '\0';
}

static void append_code_point(strbuf *out, uint32_t cp) {
    uint8_t b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (uint8_t)(0xF0 | (cp >> 18));
        b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    append_bytes(out, b, n);
}

static bool hex4(scanner *s, uint32_t *v) {
    if (s->end - s->p < 4) return scan_error(s, "truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *s->p++;
        *v <<= 4;
        if (c >= '0' && c <= '9') *v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') *v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') *v |= (uint32_t)(c - 'A' + 10);
        else return scan_error(s, "bad \\u escape");
    }
    return true;
}

// A string at s->p (on its opening quote), unescaped into out unless out is NULL.
static bool scan_string(scanner *s, strbuf *out) {
    s->p++;
    while (true) {
        const char *run = s->p;
        while (s->p < s->end && *s->p != '"' && *s->p != '\\' && (unsigned char)*s->p >= 0x20) s->p++;
        append_bytes(out, run, (size_t)(s->p - run));
        if (s->p >= s->end) return scan_error(s, "unterminated string");
        char c = *s->p++;
        if (c == '"') return true;
        if (c != '\\') return scan_error(s, "control character in string");
        if (s->p >= s->end) return scan_error(s, "unterminated escape");
        char e = *s->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            append_bytes(out, &decoded[simple - "\"\\/bfnrt"], 1);
            continue;
        }
        if (e != 'u') return scan_error(s, "bad escape");
        uint32_t cp;
        if (!hex4(s, &cp)) return false;
        if (cp >= 0xD800 && cp < 0xDC00 && s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u') {
            const char *save = s->p;
            s->p += 2;
            uint32_t lo;
            if (!hex4(s, &lo)) return false;
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else s->p = save;   // a lone high surrogate; the next escape stands alone
        }
        if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;   // lone surrogate: not text
        if (out) append_code_point(out, cp);
    }
}

static bool scan_value(scanner *s, const char *key, strbuf *out, bool *found);

static bool scan_number(scanner *s) {
    const char *q = s->p;
    if (q < s->end && *q == '-') q++;
    if (q >= s->end || *q < '0' || *q > '9') return scan_error(s, "bad value");
    if (*q == '0') q++;
    else
        while (q < s->end && *q >= '0' && *q <= '9') q++;
    if (q < s->end && *q == '.') {
        q++;
        if (q >= s->end || *q < '0' || *q > '9') return scan_error(s, "bad number");
        while (q < s->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < s->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < s->end && (*q == '+' || *q == '-')) q++;
        if (q >= s->end || *q < '0' || *q > '9') return scan_error(s, "bad number");
        while (q < s->end && *q >= '0' && *q <= '9') q++;
    }
    s->p = q;
    return true;
}

static bool scan_literal(scanner *s, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return scan_error(s, "bad value");
    s->p += n;
    return true;
}

// An object or array; at depth 1 (the line's object) the member `key` is unescaped into out.
static bool scan_container(scanner *s, const char *key, strbuf *out, bool *found) {
    bool object = *s->p == '{';
    char close = object ? '}' : ']';
    if (++s->depth > 128) return scan_error(s, "nesting too deep");
    s->p++;
    skip_space(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        s->depth--;
        return true;
    }
    while (true) {
        skip_space(s);
        bool wanted = false;
        if (object) {
            if (s->p >= s->end || *s->p != '"') return scan_error(s, "expected a member name");
            strbuf name = {0};
            if (!scan_string(s, &name)) {
                sb_free(&name);
                return false;
            }
            wanted = s->depth == 1 && key && name.data && strlen(name.data) == name.length && strcmp(name.data, key) == 0;
            sb_free(&name);
            skip_space(s);
            if (s->p >= s->end || *s->p != ':') return scan_error(s, "expected ':'");
            s->p++;
        }
        skip_space(s);
        if (wanted) {
            if (*found) return scan_error(s, "the text member appears twice");
            if (s->p >= s->end || *s->p != '"') return scan_error(s, "the text member is not a string");
            *found = true;
            if (!scan_string(s, out)) return false;
        } else if (!scan_value(s, NULL, NULL, found)) {
            return false;
        }
        skip_space(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == close) {
            s->p++;
            s->depth--;
            return true;
        }
        return scan_error(s, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool scan_value(scanner *s, const char *key, strbuf *out, bool *found) {
    skip_space(s);
    if (s->p >= s->end) return scan_error(s, "unexpected end of line");
    switch (*s->p) {
    case '{':
    case '[': return scan_container(s, key, out, found);
    case '"': return scan_string(s, NULL);
    case 't': return scan_literal(s, "true");
    case 'f': return scan_literal(s, "false");
    case 'n': return scan_literal(s, "null");
    default: return scan_number(s);
    }
}

bool prep_json_text(const char *line, size_t bytes, const char *key, strbuf *out, char *why, size_t why_bytes) {
    scanner s = {line, line + bytes, line, why, why_bytes, 0};
    skip_space(&s);
    if (s.p >= s.end || *s.p != '{') return scan_error(&s, "not a JSON object");
    bool found = false;
    append_bytes(out, "", 0);
    if (!scan_container(&s, key, out, &found)) return false;
    skip_space(&s);
    if (s.p != s.end) return scan_error(&s, "trailing characters after the object");
    if (!found) {
        snprintf(why, why_bytes, "no \"%s\" member", key);
        return false;
    }
    return true;
}
