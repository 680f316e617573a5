// tok/tiktoken.c — OpenAI's rank files (*.tiktoken) and the encodings that give them meaning.
//
// A rank file is lines of "BASE64 SP RANK\n": the bytes of a mergeable token and its rank,
// which is also its id. It carries neither the split regex nor the special tokens, so those
// come from the encoding's definition in tiktoken (openai_public.py), copied below. A file is
// checked against the encoding it is loaded as: its number of ranks must be the encoding's,
// so a truncated file, or a cl100k file loaded as r50k_base, is refused instead of producing
// wrong ids.
#include "tok/internal.h"
#include "llmc/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    uint32_t id;
} special_def;

typedef struct {
    const char *name;
    uint32_t n_ranks;      // mergeable tokens in the file
    uint32_t rank_limit;   // every rank is below this (p50k has a hole at 50256)
    const char *pattern;
    special_def specials[8];
} encoding_def;

// GPT-2's split regex as tiktoken writes it (possessive, so PCRE2 never backtracks into
// the runs; it cuts every text exactly as GPT-2's original '...|\s+(?!\S)|\s+ does).
#define R50K_PATTERN "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s"
#define CL100K_PATTERN                                                                                         \
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|" \
    "\\s*[\\r\\n]|\\s+(?!\\S)|\\s"
#define O200K_PATTERN                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                                    \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                                                    \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const encoding_def encodings[] = {
    {"r50k_base", 50256, 50256, R50K_PATTERN, {{"<|endoftext|>", 50256}}},
    {"p50k_base", 50280, 50281, R50K_PATTERN, {{"<|endoftext|>", 50256}}},
    {"p50k_edit",
     50280,
     50281,
     R50K_PATTERN,
     {{"<|endoftext|>", 50256}, {"<|fim_prefix|>", 50281}, {"<|fim_middle|>", 50282}, {"<|fim_suffix|>", 50283}}},
    {"cl100k_base",
     100256,
     100256,
     CL100K_PATTERN,
     {{"<|endoftext|>", 100257},
      {"<|fim_prefix|>", 100258},
      {"<|fim_middle|>", 100259},
      {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}}},
    {"o200k_base", 199998, 199998, O200K_PATTERN, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
};
#define N_ENCODINGS (sizeof encodings / sizeof *encodings)

static const encoding_def *find_encoding(const char *name) {
    if (strcmp(name, "gpt2") == 0) name = "r50k_base";
    for (size_t i = 0; i < N_ENCODINGS; i++)
        if (strcmp(encodings[i].name, name) == 0) return &encodings[i];
    return NULL;
}

// The encoding named in the file's base name: "r50k_base.tiktoken", "cl100k_base", "gpt2".
static const encoding_def *guess_encoding(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strstr(base, "p50k_edit")) return find_encoding("p50k_edit");
    static const char *const stems[][2] = {
        {"r50k", "r50k_base"}, {"gpt2", "r50k_base"}, {"p50k", "p50k_base"}, {"cl100k", "cl100k_base"}, {"o200k", "o200k_base"}};
    for (size_t i = 0; i < sizeof stems / sizeof *stems; i++)
        if (strstr(base, stems[i][0])) return find_encoding(stems[i][1]);
    return NULL;
}

static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Strict standard base64 with '=' padding; false on anything else. out holds n/4*3 bytes.
static bool base64_decode(const char *in, size_t n, uint8_t *out, size_t *out_bytes) {
    if (n == 0 || n % 4 != 0) return false;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            unsigned char c = (unsigned char)in[i + j];
            if (c == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
                continue;
            }
            if (pad) return false;   // data after padding
            v[j] = base64_value(c);
            if (v[j] < 0) return false;
        }
        uint32_t bits = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[k++] = (uint8_t)(bits >> 16);
        if (pad < 2) out[k++] = (uint8_t)(bits >> 8);
        if (pad < 1) out[k++] = (uint8_t)bits;
    }
    *out_bytes = k;
    return true;
}

tokenizer *tok_load_tiktoken(const char *path, const char *text, size_t bytes, const char *encoding, char *why,
                             size_t why_bytes) {
    const encoding_def *enc = encoding ? find_encoding(encoding) : guess_encoding(path);
    if (!enc) {
        if (encoding)
            snprintf(why, why_bytes,
                     "unknown tiktoken encoding '%s' (known: r50k_base, gpt2, p50k_base, p50k_edit, cl100k_base, "
                     "o200k_base)",
                     encoding);
        else
            snprintf(why, why_bytes,
                     "cannot tell which encoding %s is from its name ---> HINT: pass --encoding r50k_base, p50k_base, "
                     "p50k_edit, cl100k_base or o200k_base",
                     path);
        return NULL;
    }
    uint32_t vocab_size = enc->rank_limit;
    for (size_t i = 0; i < 8 && enc->specials[i].name; i++)
        if (enc->specials[i].id + 1 > vocab_size) vocab_size = enc->specials[i].id + 1;
    tokenizer *t = tok_new(vocab_size);
    snprintf(t->name, sizeof t->name, "%s (tiktoken)", enc->name);
    t->whole_piece_first = true;
    for (size_t i = 0; i < 8 && enc->specials[i].name; i++) {
        const special_def *s = &enc->specials[i];
        CHECK(tok_set_token(t, s->id, (const uint8_t *)s->name, strlen(s->name), TOK_SPECIAL));
    }

    uint8_t decoded[1024];
    size_t line = 0, ranks = 0;
    const char *p = text, *end = text + bytes;
    while (p < end) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *stop = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
        if (stop == p) {
            // A blank line (a file that ends in "\n\n"): tiktoken's load_tiktoken_bpe skips
            // them; until 2026-12 it was "not a tiktoken line".
            p = eol < end ? eol + 1 : end;
            continue;
        }
        const char *space = memchr(p, ' ', (size_t)(stop - p));
        size_t decoded_bytes = 0;
        char *rank_end = NULL;
        unsigned long long rank = 0;
        bool overflow = false;
        if (space && space > p && (size_t)(space - p) <= sizeof decoded / 3 * 4 && space + 1 < stop) {
            errno = 0;
            rank = strtoull(space + 1, &rank_end, 10);
            overflow = errno == ERANGE;
        }
        if (!space || rank_end != stop || space[1] < '0' || space[1] > '9' ||
            !base64_decode(p, (size_t)(space - p), decoded, &decoded_bytes)) {
            snprintf(why, why_bytes, "%s:%zu: not a tiktoken line (expected \"BASE64 RANK\")", path, line);
            tokenizer_free(t);
            return NULL;
        }
        if (overflow || rank >= enc->rank_limit) {
            // The rank as written: one past 2^64 - 1 was reported as 18446744073709551615.
            int digits = (int)(stop - space - 1);
            snprintf(why, why_bytes, "%s:%zu: rank %.*s%s is too large for %s, whose ranks are below %u", path, line,
                     digits < 40 ? digits : 40, space + 1, digits > 40 ? "..." : "", enc->name, enc->rank_limit);
            tokenizer_free(t);
            return NULL;
        }
        if (!tok_set_token(t, (uint32_t)rank, decoded, decoded_bytes, TOK_MERGEABLE)) {
            snprintf(why, why_bytes, "%s:%zu: rank %llu appears twice or is a special token's id", path, line, rank);
            tokenizer_free(t);
            return NULL;
        }
        ranks++;
        p = eol < end ? eol + 1 : end;
    }
    if (ranks != enc->n_ranks) {
        snprintf(why, why_bytes, "%s has %zu ranks but %s has %u (truncated, or another encoding's file?)", path, ranks,
                 enc->name, enc->n_ranks);
        tokenizer_free(t);
        return NULL;
    }
    char reason[200];
    if (!tok_index_tokens(t, reason, sizeof reason)) {
        snprintf(why, why_bytes, "%s: %s", path, reason);
        tokenizer_free(t);
        return NULL;
    }
    tok_pairs_from_vocabulary(t);
    if (!tok_add_stage(t, enc->pattern, false, reason, sizeof reason)) {
        snprintf(why, why_bytes, "%s: %s", path, reason);
        tokenizer_free(t);
        return NULL;
    }
    return t;
}
