// tok/tokenizer.c — loading dispatch, the pre-tokenizer (special tokens, then split regexes),
// encoding and decoding. See tok/tokenizer.h for the contract; the merge step is tok/bpe.c, the
// two file formats are tok/tiktoken.c and tok/hf.c.
//
// THE SPLIT REGEX. Patterns are tiktoken's (Rust `regex` / fancy-regex) or a tokenizer.json's
// (Oniguruma); PCRE2 runs them with these choices, so that they mean what their authors'
// engines mean:
//   PCRE2_UTF | PCRE2_UCP       \p{L}, \p{N}, case folding are Unicode;
//   PCRE2_MATCH_INVALID_UTF     invalid UTF-8 never matches and never stops the search;
//                               the unmatched bytes become pieces of their own (and BPE gives
//                               them byte tokens), which is what makes decode(encode(s)) == s
//                               hold for every byte string;
//   PCRE2_DOLLAR_ENDONLY        `$` is the end of the text, as in Rust (not "before a final
//                               newline", PCRE2's default);
//   \s and \S are rewritten to the Unicode White_Space set that Rust's regex and Oniguruma
//                               use (PCRE2's own \s lacks U+0085 NEXT LINE).
// Known divergence: JavaScript's \s (used by the JS tokenizers our tests compare with) also
// contains U+FEFF and lacks U+0085; Unicode versions also differ between engines (PCRE2 10.42
// knows Unicode 14), so letters added after that are not \p{L} here.
//
// A regex stage cuts its subject into matches and the gaps between them (gaps are only ever
// invalid UTF-8 for the patterns we ship, whose alternatives cover every character). With
// special tokens allowed, the text is first cut at each special token, and the regex runs on
// each stretch between them separately, as tiktoken and Hugging Face do.
#include "tok/internal.h"
#include "llmc/common.h"
#include "llmc/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#ifndef PCRE2_MATCH_INVALID_UTF
#error "PCRE2 10.34 or newer is needed (PCRE2_MATCH_INVALID_UTF)"
#endif
#endif

// ---------------------------------------------------------------- token lists

void token_list_push(token_list *l, uint32_t id) {
    if (l->count == l->capacity) {
        l->capacity = l->capacity ? l->capacity * 2 : 256;
        l->ids = xrealloc(l->ids, l->capacity * sizeof *l->ids);
    }
    l->ids[l->count++] = id;
}

// ---------------------------------------------------------------- building

tokenizer *tok_new(uint32_t vocab_size) {
    tokenizer *t = xcalloc(1, sizeof *t);
    t->vocab_size = vocab_size;
    t->offset = xcalloc(vocab_size, sizeof *t->offset);
    t->length = xcalloc(vocab_size, sizeof *t->length);
    t->kind = xcalloc(vocab_size, sizeof *t->kind);
    t->pool_capacity = (size_t)vocab_size * 8 + 1024;
    t->pool = xmalloc(t->pool_capacity);
    return t;
}

bool tok_set_token(tokenizer *t, uint32_t id, const uint8_t *bytes, size_t n, int kind) {
    if (id >= t->vocab_size || t->kind[id] != TOK_HOLE || n == 0 || n > UINT32_MAX) return false;
    if (t->pool_bytes + n > t->pool_capacity) {
        while (t->pool_bytes + n > t->pool_capacity) t->pool_capacity *= 2;
        t->pool = xrealloc(t->pool, t->pool_capacity);
    }
    memcpy(t->pool + t->pool_bytes, bytes, n);
    t->offset[id] = t->pool_bytes;
    t->length[id] = (uint32_t)n;
    t->kind[id] = (uint8_t)kind;
    t->pool_bytes += n;
    return true;
}

static int compare_specials(const void *a, const void *b) {
    const tok_special *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

// A printable rendering of token bytes for error messages.
static void describe_bytes(const uint8_t *p, size_t n, char *out, size_t out_bytes) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 < out_bytes; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7F && p[i] != '\\') out[k++] = (char)p[i];
        else k += (size_t)snprintf(out + k, out_bytes - k, "\\x%02X", p[i]);
    }
    out[k < out_bytes ? k : out_bytes - 1] = '\0';
}

bool tok_index_tokens(tokenizer *t, char *why, size_t why_bytes) {
    uint64_t mergeable = 0;
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (t->kind[id] & TOK_MERGEABLE) mergeable++;
        if (t->kind[id] & TOK_SPECIAL) t->n_specials++;
    }
    tok_piece_map_init(&t->pieces, mergeable);
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->kind[id] & TOK_MERGEABLE)) continue;
        if (!tok_piece_map_insert(t, id)) {
            char shown[64];
            describe_bytes(t->pool + t->offset[id], t->length[id], shown, sizeof shown);
            uint32_t other = tok_piece_lookup(t, t->pool + t->offset[id], t->length[id]);
            snprintf(why, why_bytes, "token \"%s\" appears twice (ids %u and %u)", shown, other, id);
            return false;
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_token[b] = tok_piece_lookup(t, &byte, 1);
        if (t->byte_token[b] == TOKENIZER_NO_TOKEN) {
            snprintf(why, why_bytes, "byte 0x%02X has no token, so this is not a byte-level BPE vocabulary", b);
            return false;
        }
    }
    t->specials = xcalloc(t->n_specials ? t->n_specials : 1, sizeof *t->specials);
    size_t k = 0;
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->kind[id] & TOK_SPECIAL)) continue;
        t->specials[k++] = (tok_special){id, t->length[id], t->pool + t->offset[id]};
        t->special_first_byte[t->pool[t->offset[id]]] = true;
    }
    qsort(t->specials, t->n_specials, sizeof *t->specials, compare_specials);
    return true;
}

#ifdef HAVE_PCRE2
// Rewrites \s and \S to the Unicode White_Space set (see the top comment). Inside a
// character class \s becomes the bare ranges; \S inside a class cannot be expressed that way
// and is left to PCRE2 (no pattern we know of uses it).
#define WHITE_SPACE_RANGES "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static char *rewrite_white_space(const char *pattern) {
    strbuf out = {0};
    sb_append(&out, "");
    bool in_class = false;
    for (const char *p = pattern; *p; p++) {
        if (*p == '\\' && p[1]) {
            if (p[1] == 's') sb_append(&out, in_class ? WHITE_SPACE_RANGES : "[" WHITE_SPACE_RANGES "]");
            else if (p[1] == 'S' && !in_class) sb_append(&out, "[^" WHITE_SPACE_RANGES "]");
            else {
                char two[3] = {p[0], p[1], 0};
                sb_append(&out, two);
            }
            p++;
            continue;
        }
        if (!in_class && *p == '[') {
            in_class = true;
            sb_append(&out, "[");
            // A ']' right after '[' or '[^' is a literal member, not the end.
            if (p[1] == '^') {
                sb_append(&out, "^");
                p++;
            }
            if (p[1] == ']') {
                sb_append(&out, "]");
                p++;
            }
            continue;
        }
        if (in_class && *p == '[' && p[1] == ':') {
            // POSIX class such as [:alpha:] inside a class: copy through its closing ":]".
            const char *end = strstr(p + 2, ":]");
            if (end) {
                size_t n = (size_t)(end + 2 - p);
                char *chunk = xmalloc(n + 1);
                memcpy(chunk, p, n);
                chunk[n] = '\0';
                sb_append(&out, chunk);
                free(chunk);
                p = end + 1;
                continue;
            }
        }
        if (in_class && *p == ']') in_class = false;
        char one[2] = {*p, 0};
        sb_append(&out, one);
    }
    return out.data;
}
#endif

bool tok_add_stage(tokenizer *t, const char *pattern, bool literal, char *why, size_t why_bytes) {
    if (t->n_stages == TOK_MAX_STAGES) {
        snprintf(why, why_bytes, "more than %d split stages in the pre-tokenizer", TOK_MAX_STAGES);
        return false;
    }
    int k = t->n_stages++;
    t->pattern[k] = xstrdup(pattern);
    t->pattern_literal[k] = literal;
#ifdef HAVE_PCRE2
    char *rewritten = literal ? xstrdup(pattern) : rewrite_white_space(pattern);
    uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_DOLLAR_ENDONLY);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)rewritten, PCRE2_ZERO_TERMINATED, options, &error, &error_offset, NULL);
    free(rewritten);
    if (!code) {
        PCRE2_UCHAR message[160];
        pcre2_get_error_message(error, message, sizeof message);
        snprintf(why, why_bytes, "split regex does not compile (%s at offset %zu): %.120s", (char *)message,
                 (size_t)error_offset, pattern);
        return false;
    }
    t->regex[k] = code;
    // Without JIT (e.g. an architecture PCRE2 has no JIT for) the interpreter is used: slower,
    // same results.
    t->regex_jit[k] = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
#endif
    return true;
}

// ---------------------------------------------------------------- loading

tokenizer *tokenizer_load(const char *path, const char *encoding, char *why, size_t why_bytes) {
    size_t bytes = 0;
    char *text = read_file_or_null(path, &bytes);
    if (!text) {
        snprintf(why, why_bytes, "cannot read tokenizer %s: %s", path, strerror(errno));
        return NULL;
    }
    // A UTF-8 byte order mark (some editors write one) is skipped: a tokenizer.json saved so
    // is still JSON. A JSON array is JSON too, and the JSON loader says it is not an object
    // (until 2026-12 a BOM or a '[' sent the file to the tiktoken loader, which asked for
    // --encoding).
    size_t bom = bytes >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    size_t i = bom;
    while (i < bytes && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) i++;
    tokenizer *t;
    if (i == bytes) {
        snprintf(why, why_bytes, "tokenizer %s is empty", path);
        t = NULL;
    } else if (text[i] == '{' || text[i] == '[') {
        if (encoding) {
            snprintf(why, why_bytes, "%s is a tokenizer.json; an encoding name (%s) applies to .tiktoken files only",
                     path, encoding);
            t = NULL;
        } else {
            t = tok_load_hf_json(path, text + bom, bytes - bom, why, why_bytes);
        }
    } else {
        t = tok_load_tiktoken(path, text, bytes, encoding, why, why_bytes);
    }
    free(text);
    return t;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->offset);
    free(t->length);
    free(t->kind);
    tok_piece_map_free(&t->pieces);
    tok_pair_map_free(&t->pairs);
    free(t->specials);
    for (int k = 0; k < t->n_stages; k++) {
        free(t->pattern[k]);
#ifdef HAVE_PCRE2
        pcre2_code_free(t->regex[k]);
#endif
    }
    free(t);
}

uint32_t tokenizer_vocab_size(const tokenizer *t) { return t->vocab_size; }

const char *tokenizer_name(const tokenizer *t) { return t->name; }

uint32_t tokenizer_special_id(const tokenizer *t, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < t->n_specials; i++)
        if (t->specials[i].bytes == n && memcmp(t->specials[i].text, name, n) == 0) return t->specials[i].id;
    return TOKENIZER_NO_TOKEN;
}

uint32_t tokenizer_doc_token(const tokenizer *t) {
    static const char *const preferred[] = {"<|begin_of_text|>", "<|endoftext|>", "<s>"};
    for (size_t i = 0; i < sizeof preferred / sizeof *preferred; i++) {
        uint32_t id = tokenizer_special_id(t, preferred[i]);
        if (id != TOKENIZER_NO_TOKEN) return id;
    }
    return TOKENIZER_NO_TOKEN;
}

bool tokenizer_is_special(const tokenizer *t, uint32_t id) {
    return id < t->vocab_size && (t->kind[id] & TOK_SPECIAL);
}

// ---------------------------------------------------------------- encoding

// BPE of one piece, or false and why for a piece too long for the merge loop (tok/bpe.c).
static bool bpe_piece(const tokenizer *t, tok_bpe_scratch *s, const uint8_t *p, size_t n, token_list *out, char *why,
                      size_t why_bytes) {
    if (tok_bpe_encode_piece(t, s, p, n, out)) return true;
    snprintf(why, why_bytes,
             "one piece of %zu bytes (text the split regex does not cut, e.g. a run of one character) is more than "
             "the %zu bytes BPE can merge at once",
             n, TOK_MAX_PIECE_BYTES);
    return false;
}

struct tokenizer_scratch {
#ifdef HAVE_PCRE2
    pcre2_match_data *match[TOK_MAX_STAGES];
    pcre2_match_context *context;
    pcre2_jit_stack *jit_stack;
    size_t jit_stack_bytes;
#endif
    tok_bpe_scratch bpe;
};

tokenizer_scratch *tokenizer_scratch_new(const tokenizer *t) {
    tokenizer_scratch *s = xcalloc(1, sizeof *s);
#ifdef HAVE_PCRE2
    for (int k = 0; k < t->n_stages; k++) {
        s->match[k] = pcre2_match_data_create_from_pattern(t->regex[k], NULL);
        if (!s->match[k]) fail("out of memory creating regex match data");
    }
    s->context = pcre2_match_context_create(NULL);
    if (!s->context) fail("out of memory creating a regex match context");
#endif
    return s;
}

void tokenizer_scratch_free(tokenizer_scratch *s) {
    if (!s) return;
#ifdef HAVE_PCRE2
    for (int k = 0; k < TOK_MAX_STAGES; k++) pcre2_match_data_free(s->match[k]);
    pcre2_match_context_free(s->context);
    pcre2_jit_stack_free(s->jit_stack);
#endif
    tok_bpe_scratch_free(&s->bpe);
    free(s);
}

#ifdef HAVE_PCRE2
// The JIT's default stack (32 KiB on the machine stack) is enough for every pattern we ship
// on any input we tried, but a pattern from some tokenizer.json may need more; then the
// stack grows (up to 1 GiB) and the match is retried.
static bool grow_jit_stack(tokenizer_scratch *s) {
    size_t bytes = s->jit_stack_bytes ? s->jit_stack_bytes * 8 : (size_t)1 << 20;
    if (bytes > ((size_t)1 << 30)) return false;
    pcre2_jit_stack_free(s->jit_stack);
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, bytes, NULL);
    if (!s->jit_stack) return false;
    s->jit_stack_bytes = bytes;
    pcre2_jit_stack_assign(s->context, NULL, s->jit_stack);
    return true;
}

// PCRE2's match limit, per match: its default, 10^7 steps, plus 8 per byte of the rest of the
// subject. `\s*[\r\n]` (cl100k, o200k, Llama 3) and o200k's letter classes step back once per
// character of a run, so with the default alone a document with a run of ~10^7 spaces or
// capitals failed the whole prepare ("match limit exceeded"); the shipped patterns stay within
// a few steps per byte. A pattern of some tokenizer.json that backtracks exponentially still
// fails within moments (an unbounded limit made it run for hours).
static void set_match_limit(tokenizer_scratch *s, size_t rest) {
    uint64_t limit = 10000000 + 8 * (uint64_t)rest;
    pcre2_set_match_limit(s->context, limit > UINT32_MAX ? UINT32_MAX : (uint32_t)limit);
}

static int match_at(const tokenizer *t, tokenizer_scratch *s, int stage, const uint8_t *subject, size_t bytes,
                    size_t start) {
    set_match_limit(s, bytes - start);
    while (true) {
        int rc = t->regex_jit[stage]
                     ? pcre2_jit_match(t->regex[stage], subject, bytes, start, 0, s->match[stage], s->context)
                     : pcre2_match(t->regex[stage], subject, bytes, start, 0, s->match[stage], s->context);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && grow_jit_stack(s)) continue;
        return rc;
    }
}

static bool encode_stage(const tokenizer *t, tokenizer_scratch *s, int stage, const uint8_t *subject, size_t bytes,
                         token_list *out, char *why, size_t why_bytes);

static bool encode_piece(const tokenizer *t, tokenizer_scratch *s, int stage, const uint8_t *p, size_t n,
                         token_list *out, char *why, size_t why_bytes) {
    if (n == 0) return true;
    if (stage == t->n_stages) return bpe_piece(t, &s->bpe, p, n, out, why, why_bytes);
    return encode_stage(t, s, stage, p, n, out, why, why_bytes);
}

static bool encode_stage(const tokenizer *t, tokenizer_scratch *s, int stage, const uint8_t *subject, size_t bytes,
                         token_list *out, char *why, size_t why_bytes) {
    // Pieces of the last stage go straight to BPE (the common case: one stage).
    bool last = stage + 1 == t->n_stages;
    size_t piece_start = 0, search_from = 0;
    while (piece_start < bytes) {
        int rc = match_at(t, s, stage, subject, bytes, search_from);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR message[160];
            pcre2_get_error_message(rc, message, sizeof message);
            snprintf(why, why_bytes, "split regex failed at byte %zu: %s", search_from, (char *)message);
            return false;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->match[stage]);
        size_t start = ov[0], end = ov[1];
        if (end == start) {
            // An empty match cuts nothing; look again one character further on.
            search_from = start + 1;
            while (search_from < bytes && (subject[search_from] & 0xC0) == 0x80) search_from++;
            if (search_from >= bytes) break;
            continue;
        }
        if (last) {
            if (start > piece_start &&
                !bpe_piece(t, &s->bpe, subject + piece_start, start - piece_start, out, why, why_bytes))
                return false;
            if (!bpe_piece(t, &s->bpe, subject + start, end - start, out, why, why_bytes)) return false;
        } else if (!encode_piece(t, s, stage + 1, subject + piece_start, start - piece_start, out, why, why_bytes) ||
                   !encode_piece(t, s, stage + 1, subject + start, end - start, out, why, why_bytes)) {
            return false;
        }
        piece_start = search_from = end;
    }
    return encode_piece(t, s, stage + 1, subject + piece_start, bytes - piece_start, out, why, why_bytes);
}
#endif

#ifdef HAVE_PCRE2
// The first special token at or after `from`: its position (bytes if none) and index.
static size_t find_special(const tokenizer *t, const uint8_t *text, size_t bytes, size_t from, size_t *which) {
    for (size_t i = from; i < bytes; i++) {
        if (!t->special_first_byte[text[i]]) continue;
        for (size_t k = 0; k < t->n_specials; k++) {
            const tok_special *sp = &t->specials[k];
            if (sp->bytes <= bytes - i && sp->text[0] == text[i] && memcmp(sp->text, text + i, sp->bytes) == 0) {
                *which = k;
                return i;
            }
        }
    }
    return bytes;
}
#endif

bool tokenizer_encode_append(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t bytes,
                             bool allow_special, token_list *out, char *why, size_t why_bytes) {
#ifndef HAVE_PCRE2
    (void)t, (void)s, (void)text, (void)bytes, (void)allow_special, (void)out;
    snprintf(why, why_bytes,
             "this train_gpt was built without PCRE2, so it cannot encode text ---> HINT: apt-get install "
             "libpcre2-dev (or your system's PCRE2 development package) and rebuild with make");
    return false;
#else
    const uint8_t *p = (const uint8_t *)text;
    if (!allow_special || t->n_specials == 0) return encode_stage(t, s, 0, p, bytes, out, why, why_bytes);
    size_t pos = 0;
    while (pos < bytes) {
        size_t which = 0;
        size_t at = find_special(t, p, bytes, pos, &which);
        if (!encode_stage(t, s, 0, p + pos, at - pos, out, why, why_bytes)) return false;
        if (at == bytes) break;
        token_list_push(out, t->specials[which].id);
        pos = at + t->specials[which].bytes;
    }
    return true;
#endif
}

bool tokenizer_encode(const tokenizer *t, const char *text, size_t bytes, bool allow_special, uint32_t **ids,
                      size_t *count, char *why, size_t why_bytes) {
    tokenizer_scratch *s = tokenizer_scratch_new(t);
    token_list out = {0};
    bool ok = tokenizer_encode_append(t, s, text, bytes, allow_special, &out, why, why_bytes);
    tokenizer_scratch_free(s);
    if (!ok) {
        free(out.ids);
        *ids = NULL;
        *count = 0;
        return false;
    }
    *ids = out.ids ? out.ids : xmalloc(sizeof(uint32_t));
    *count = out.count;
    return true;
}

bool tokenizer_can_split(void) {
#ifdef HAVE_PCRE2
    return true;
#else
    return false;
#endif
}

bool tokenizer_encode_unsplit(const tokenizer *t, const char *text, size_t bytes, uint32_t **ids, size_t *count,
                              char *why, size_t why_bytes) {
    *ids = NULL;
    *count = 0;
    tok_bpe_scratch bpe = {0};
    token_list out = {0};
    bool ok = bytes == 0 || bpe_piece(t, &bpe, (const uint8_t *)text, bytes, &out, why, why_bytes);
    tok_bpe_scratch_free(&bpe);
    if (!ok) return false;
    *ids = out.ids ? out.ids : xmalloc(sizeof(uint32_t));
    *count = out.count;
    return true;
}

// ---------------------------------------------------------------- decoding

static const uint8_t replacement_character[3] = {0xEF, 0xBF, 0xBD};

const uint8_t *tokenizer_token_bytes(const tokenizer *t, uint32_t id, size_t *bytes) {
    if (id >= t->vocab_size || t->kind[id] == TOK_HOLE) {
        *bytes = 0;
        return NULL;
    }
    *bytes = t->length[id];
    return t->pool + t->offset[id];
}

char *tokenizer_decode(const tokenizer *t, const uint32_t *ids, size_t n, size_t *bytes_out) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        total += tokenizer_token_bytes(t, ids[i], &len) ? len : sizeof replacement_character;
    }
    char *out = xmalloc(total + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *b = tokenizer_token_bytes(t, ids[i], &len);
        if (!b) {
            b = replacement_character;
            len = sizeof replacement_character;
        }
        memcpy(out + at, b, len);
        at += len;
    }
    out[at] = '\0';
    if (bytes_out) *bytes_out = at;
    return out;
}
