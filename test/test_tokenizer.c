// test/test_tokenizer.c — tests of the tokenizer library.
//
// With no arguments (what `make test` runs) it needs no files: it writes small synthetic
// tokenizers to a temporary directory and checks
//   - the heap-driven merge loop against a naive reference (rescan all pairs, merge the
//     leftmost lowest rank, repeat) on random pieces and random merge tables, with and
//     without ignore_merges, and tokenizer_encode_unsplit against it on whole texts;
//   - decode(encode(s)) == s on random byte strings, invalid UTF-8 included;
//   - special tokens (allowed or plain text, longest first), decode of holes and of ids
//     past the vocabulary, tokenizer_doc_token;
//   - that broken, truncated and unreadable tokenizer files give a one-line reason;
//   - that several threads encoding with one tokenizer get the same ids as one thread.
// With arguments it is the checker the shell test drives with real tokenizer files:
//   test_tokenizer plans TestPlans.txt DATA_DIR     gpt-tokenizer's golden vectors
//   test_tokenizer compare TOKENIZER VECTORS.jsonl [ENCODING]
//                                                   {"text", "allow_special", "ids"} lines made
//                                                   by a JS tokenizer
//   test_tokenizer roundtrip TOKENIZER [ENCODING]   random byte strings round-trip
//   test_tokenizer can_encode                       "yes", or "no (...)" in a build without PCRE2
//   test_tokenizer shards TOKENIZER ENCODING|- MANIFEST TRAIN_SHARDS VAL_SHARDS DOC_TOKEN
//                                                   what `prepare` wrote, read back with
//                                                   dataloader.h, against encoding each document
//                                                   of MANIFEST (one hex string per line) alone
#include "llmc/common.h"
#include "dataloader.h"
#include "llmc/json.h"
#include "tok/internal.h"
#include "tok/tokenizer.h"
#include "tok/sample.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int checks_run, checks_failed;

#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        checks_run++;                                                                      \
        if (!(cond)) {                                                                     \
            checks_failed++;                                                               \
            if (checks_failed <= 30) {                                                     \
                fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
                fprintf(stderr, __VA_ARGS__);                                              \
                fputc('\n', stderr);                                                       \
            }                                                                              \
        }                                                                                  \
    } while (0)

static int summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, checks_run, checks_failed);
    return checks_failed ? 1 : 0;
}

// ---------------------------------------------------------------- small helpers

static uint64_t rng_state = 0x853C49E6748FEA9Bull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static char temp_dir[256];

static const char *temp_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", temp_dir, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) fail("cannot write %s", path);
}

static bool one_line(const char *s) { return s[0] != '\0' && strchr(s, '\n') == NULL; }

// GPT-2's byte -> printable character map (the spelling of byte-level vocabularies).
static void spell_bytes(strbuf *sb, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int b = p[i], extra = 0;
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = b;
        if (!printable) {
            for (int c = 0; c < b; c++)
                if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) extra++;
            cp = 256 + extra;
        }
        char u[4];
        if (cp < 0x80) {
            u[0] = (char)cp;
            u[1] = 0;
        } else {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
            u[2] = 0;
        }
        sb_append(sb, u);
    }
}

// ---------------------------------------------------------------- a synthetic tokenizer.json

typedef struct {
    uint8_t bytes[32];
    size_t n;
} token_bytes;

typedef struct {
    token_bytes *tokens;   // id -> bytes (0..255 are the single bytes)
    size_t n_tokens;
    uint32_t (*merges)[3]; // left, right, result; rank = index
    size_t n_merges;
} toy_vocab;

// Random merges over a small alphabet so that random pieces merge a lot.
static const uint8_t toy_alphabet[] = {'a', 'b', 'c', ' ', 0xC3, 0xA9, 0xFF, '\n'};

static toy_vocab make_toy_vocab(size_t n_merges) {
    toy_vocab v = {0};
    v.tokens = xcalloc(256 + n_merges, sizeof *v.tokens);
    v.merges = xcalloc(n_merges, sizeof *v.merges);
    for (int b = 0; b < 256; b++) {
        v.tokens[b].bytes[0] = (uint8_t)b;
        v.tokens[b].n = 1;
    }
    v.n_tokens = 256;
    size_t tries = 0;
    while (v.n_merges < n_merges && tries++ < 100000) {
        // Left and right from the alphabet's bytes or earlier merges.
        uint32_t pick[2];
        for (int s = 0; s < 2; s++) {
            if (v.n_tokens > 256 && rnd() % 2) pick[s] = 256 + rnd() % (uint32_t)(v.n_tokens - 256);
            else pick[s] = toy_alphabet[rnd() % sizeof toy_alphabet];
        }
        token_bytes merged = v.tokens[pick[0]];
        const token_bytes *r = &v.tokens[pick[1]];
        if (merged.n + r->n > sizeof merged.bytes) continue;
        memcpy(merged.bytes + merged.n, r->bytes, r->n);
        merged.n += r->n;
        bool exists = false;
        for (size_t i = 0; i < v.n_tokens && !exists; i++)
            exists = v.tokens[i].n == merged.n && memcmp(v.tokens[i].bytes, merged.bytes, merged.n) == 0;
        if (exists) continue;
        v.tokens[v.n_tokens] = merged;
        v.merges[v.n_merges][0] = pick[0];
        v.merges[v.n_merges][1] = pick[1];
        v.merges[v.n_merges][2] = (uint32_t)v.n_tokens;
        v.n_tokens++;
        v.n_merges++;
    }
    return v;
}

static void free_toy_vocab(toy_vocab *v) {
    free(v->tokens);
    free(v->merges);
}

// Writes the toy vocabulary as a tokenizer.json. Added tokens get ids after a hole of 3.
static void write_toy_json(const char *path, const toy_vocab *v, bool ignore_merges, const char *pre_tokenizer) {
    strbuf sb = {0};
    sb_append(&sb, "{\"version\":\"1.0\",\"normalizer\":null,\"added_tokens\":[");
    const char *added[] = {"<|begin_of_text|>", "<|end|>", "<|end|>x"};
    for (int i = 0; i < 3; i++) {
        sb_printf(&sb, "%s{\"id\":%zu,\"content\":", i ? "," : "", v->n_tokens + 3 + (size_t)i);
        sb_json_string(&sb, added[i]);
        sb_append(&sb, ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}");
    }
    sb_printf(&sb, "],\"pre_tokenizer\":%s,\"model\":{\"type\":\"BPE\",\"dropout\":null,\"ignore_merges\":%s,\"vocab\":{",
              pre_tokenizer, ignore_merges ? "true" : "false");
    for (size_t i = 0; i < v->n_tokens; i++) {
        strbuf spelled = {0};
        sb_append(&spelled, "");
        spell_bytes(&spelled, v->tokens[i].bytes, v->tokens[i].n);
        if (i) sb_append(&sb, ",");
        sb_json_string(&sb, spelled.data);
        sb_printf(&sb, ":%zu", i);
        sb_free(&spelled);
    }
    sb_append(&sb, "},\"merges\":[");
    for (size_t m = 0; m < v->n_merges; m++) {
        strbuf pair = {0};
        sb_append(&pair, "");
        spell_bytes(&pair, v->tokens[v->merges[m][0]].bytes, v->tokens[v->merges[m][0]].n);
        sb_append(&pair, " ");
        spell_bytes(&pair, v->tokens[v->merges[m][1]].bytes, v->tokens[v->merges[m][1]].n);
        if (m) sb_append(&sb, ",");
        // Alternate the two merge spellings tokenizer.json files use.
        if (m % 2) {
            sb_json_string(&sb, pair.data);
        } else {
            char *space = strchr(pair.data, ' ');
            *space = '\0';
            sb_append(&sb, "[");
            sb_json_string(&sb, pair.data);
            sb_append(&sb, ",");
            sb_json_string(&sb, space + 1);
            sb_append(&sb, "]");
        }
        sb_free(&pair);
    }
    sb_append(&sb, "]}}");
    write_file(path, sb.data, sb.length);
    sb_free(&sb);
}

// The reference: rescan every adjacent pair, merge the leftmost one of lowest rank, repeat.
static size_t naive_bpe(const toy_vocab *v, bool ignore_merges, const uint8_t *p, size_t n, uint32_t *out) {
    if (ignore_merges) {
        for (size_t i = 0; i < v->n_tokens; i++)
            if (v->tokens[i].n == n && memcmp(v->tokens[i].bytes, p, n) == 0) {
                out[0] = (uint32_t)i;
                return 1;
            }
    }
    size_t count = n;
    for (size_t i = 0; i < n; i++) out[i] = p[i];
    while (count > 1) {
        size_t best_rank = SIZE_MAX, best_pos = 0;
        for (size_t i = 0; i + 1 < count; i++)
            for (size_t m = 0; m < v->n_merges && m < best_rank; m++)
                if (v->merges[m][0] == out[i] && v->merges[m][1] == out[i + 1]) {
                    best_rank = m;
                    best_pos = i;
                }
        if (best_rank == SIZE_MAX) break;
        out[best_pos] = v->merges[best_rank][2];
        memmove(out + best_pos + 1, out + best_pos + 2, (count - best_pos - 2) * sizeof *out);
        count--;
    }
    return count;
}

#define BYTE_LEVEL_SPLIT "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}"
// One piece per text: a Split that matches everything (so BPE sees whole strings).
#define WHOLE_TEXT_SPLIT                                                                                   \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?s).+\"},"   \
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"     \
    "\"trim_offsets\":true,\"use_regex\":false}]}"

static void test_merge_order(void) {
    for (int variant = 0; variant < 4; variant++) {
        bool ignore_merges = variant % 2;
        toy_vocab v = make_toy_vocab(variant < 2 ? 60 : 400);
        const char *path = temp_path("toy.json");
        write_toy_json(path, &v, ignore_merges, BYTE_LEVEL_SPLIT);
        char why[300];
        tokenizer *t = tokenizer_load(path, NULL, why, sizeof why);
        EXPECT(t != NULL, "toy tokenizer did not load: %s", why);
        if (!t) {
            free_toy_vocab(&v);
            continue;
        }
        EXPECT(tokenizer_vocab_size(t) == v.n_tokens + 6, "vocab size %u, want %zu", tokenizer_vocab_size(t),
               v.n_tokens + 6);
        tok_bpe_scratch scratch = {0};
        int mismatches = 0;
        for (int trial = 0; trial < 3000; trial++) {
            uint8_t piece[40];
            size_t n = 1 + rnd() % (trial < 2000 ? 12 : sizeof piece);
            for (size_t i = 0; i < n; i++) piece[i] = toy_alphabet[rnd() % sizeof toy_alphabet];
            uint32_t want[40];
            size_t want_n = naive_bpe(&v, ignore_merges, piece, n, want);
            token_list got = {0};
            bool encoded = tok_bpe_encode_piece(t, &scratch, piece, n, &got);
            // Twice: the second time may come from the piece cache.
            token_list again = {0};
            encoded = tok_bpe_encode_piece(t, &scratch, piece, n, &again) && encoded;
            bool same = encoded && got.count == want_n && memcmp(got.ids, want, want_n * sizeof *want) == 0 &&
                        again.count == want_n && memcmp(again.ids, want, want_n * sizeof *want) == 0;
            if (!same) mismatches++;
            free(got.ids);
            free(again.ids);
        }
        EXPECT(mismatches == 0, "variant %d (%zu merges, ignore_merges %d): %d of 3000 pieces merge differently "
               "from the naive reference", variant, v.n_merges, ignore_merges, mismatches);
        tok_bpe_scratch_free(&scratch);
        tokenizer_free(t);
        free_toy_vocab(&v);
    }
}

// tokenizer_encode_unsplit (a sample prompt in a build without PCRE2): BPE over the whole
// text, so exactly the naive reference's ids on the text as one piece, which decode to it.
static void test_encode_unsplit(void) {
    toy_vocab v = make_toy_vocab(200);
    const char *path = temp_path("toy_unsplit.json");
    write_toy_json(path, &v, false, BYTE_LEVEL_SPLIT);
    char why[300] = "";
    tokenizer *t = tokenizer_load(path, NULL, why, sizeof why);
    EXPECT(t != NULL, "toy tokenizer did not load: %s", why);
    if (!t) {
        free_toy_vocab(&v);
        return;
    }
    int mismatches = 0, failures = 0;
    for (int trial = 0; trial < 200; trial++) {
        uint8_t text[80];
        size_t n = rnd() % sizeof text;
        for (size_t i = 0; i < n; i++) text[i] = toy_alphabet[rnd() % sizeof toy_alphabet];
        uint32_t want[80];
        size_t want_n = n ? naive_bpe(&v, false, text, n, want) : 0;
        uint32_t *ids = NULL;
        size_t count = 0;
        if (!tokenizer_encode_unsplit(t, (const char *)text, n, &ids, &count, why, sizeof why)) {
            failures++;
            continue;
        }
        size_t back_n = 0;
        char *back = tokenizer_decode(t, ids, count, &back_n);
        if (count != want_n || memcmp(ids, want, want_n * sizeof *want) != 0 || back_n != n ||
            memcmp(back, text, n) != 0)
            mismatches++;
        free(back);
        free(ids);
    }
    // A piece of 2^32 bytes would wrap the merge loop's 32-bit positions: refused, before
    // a byte of it is read (so this small buffer can stand for 4 GiB).
    const char small[1] = {'a'};
    uint32_t *ids = NULL;
    size_t count = 0;
    char reason[300] = "";
    token_list none = {0};
    tok_bpe_scratch scratch = {0};
    EXPECT(!tok_bpe_encode_piece(t, &scratch, (const uint8_t *)small, (size_t)1 << 32, &none) && none.count == 0,
           "a piece of 2^32 bytes was merged");
    tok_bpe_scratch_free(&scratch);
    EXPECT(!tokenizer_encode_unsplit(t, small, (size_t)1 << 32, &ids, &count, reason, sizeof reason) &&
               one_line(reason) && strstr(reason, "one piece of 4294967296 bytes"),
           "a text of 2^32 bytes, unsplit: [%s]", reason);
    EXPECT(failures == 0, "tokenizer_encode_unsplit failed %d times: %s", failures, why);
    EXPECT(mismatches == 0, "tokenizer_encode_unsplit: %d of 200 texts differ from BPE over the whole text, or do "
           "not decode back", mismatches);
    tokenizer_free(t);
    free_toy_vocab(&v);
}

// ---------------------------------------------------------------- round trips, specials, decode
#ifdef HAVE_PCRE2

static void expect_round_trip(const tokenizer *t, const uint8_t *text, size_t n, bool allow_special, const char *what) {
    uint32_t *ids = NULL;
    size_t count = 0;
    char why[300] = "";
    bool ok = tokenizer_encode(t, (const char *)text, n, allow_special, &ids, &count, why, sizeof why);
    EXPECT(ok, "%s: encode failed: %s", what, why);
    if (!ok) return;
    bool in_range = true;
    for (size_t i = 0; i < count; i++) in_range = in_range && ids[i] < tokenizer_vocab_size(t);
    EXPECT(in_range, "%s: an id is out of range", what);
    size_t back_n = 0;
    char *back = tokenizer_decode(t, ids, count, &back_n);
    EXPECT(back_n == n && memcmp(back, text, n) == 0, "%s: decode(encode(s)) != s (%zu bytes in, %zu out)", what, n,
           back_n);
    free(back);
    free(ids);
}

static void random_bytes_round_trips(const tokenizer *t, int count, const char *what) {
    static const char *const fragments[] = {" ", "  ", "\n", "\r\n", "\t", "a", "The", " cat", "'s", "'LL", "123",
                                            "4567", "é", "中文", "😀", "👩‍💻", "\xC3", "\xA9", "\xFF", "\xF0\x9F",
                                            "\xE2\x82", "\xED\xA0\x80", "<|endoftext|>", "<|begin_of_text|>", "!!",
                                            "...", "\x00", "\x85", "\xC2\x85", "\xEF\xBB\xBF"};
    const size_t n_fragments = sizeof fragments / sizeof *fragments;
    for (int trial = 0; trial < count; trial++) {
        uint8_t text[600];
        size_t n = 0, target = rnd() % 300;
        int style = trial % 3;
        while (n < target) {
            if (style == 0) {
                text[n++] = (uint8_t)rnd();   // uniform random bytes: mostly invalid UTF-8
            } else {
                const char *f = fragments[rnd() % n_fragments];
                size_t len = strlen(f) ? strlen(f) : 1;   // "\x00" is one NUL byte
                if (n + len > sizeof text) break;
                memcpy(text + n, f, len);
                n += len;
            }
        }
        char label[80];
        snprintf(label, sizeof label, "%s random text %d", what, trial);
        expect_round_trip(t, text, n, trial % 2 == 0, label);
    }
    // Long runs stress the regex engine (backtracking, JIT stack) and the merge heap.
    size_t big = 300000;
    uint8_t *run = xmalloc(big);
    const uint8_t fills[] = {' ', '\n', '7', 'x', '-', 0xFF};
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(run, fills[f], big);
        run[big - 1] = 'z';
        char label[80];
        snprintf(label, sizeof label, "%s run of 0x%02X", what, fills[f]);
        expect_round_trip(t, run, big, false, label);
    }
    free(run);
}

static void test_round_trips_and_specials(void) {
    toy_vocab v = make_toy_vocab(300);
    const char *path = temp_path("toy_gpt2.json");
    write_toy_json(path, &v, true, BYTE_LEVEL_SPLIT);
    char why[300];
    tokenizer *t = tokenizer_load(path, NULL, why, sizeof why);
    EXPECT(t != NULL, "toy tokenizer did not load: %s", why);
    if (!t) return;
    uint32_t n_tokens = (uint32_t)v.n_tokens;
    random_bytes_round_trips(t, 600, "toy");

    // Special tokens: <|end|>x is longer than <|end|> and must win where both match.
    uint32_t begin = tokenizer_special_id(t, "<|begin_of_text|>"), end = tokenizer_special_id(t, "<|end|>"),
             endx = tokenizer_special_id(t, "<|end|>x");
    EXPECT(begin == n_tokens + 3 && end == n_tokens + 4 && endx == n_tokens + 5, "special ids %u %u %u", begin, end,
           endx);
    EXPECT(tokenizer_special_id(t, "<|nope|>") == TOKENIZER_NO_TOKEN, "unknown special found");
    EXPECT(tokenizer_doc_token(t) == begin, "doc token %u, want <|begin_of_text|> %u", tokenizer_doc_token(t), begin);
    EXPECT(tokenizer_is_special(t, end) && !tokenizer_is_special(t, 'a'), "is_special");
    const char *text = "a<|end|>xb<|end|><|begin_of_text|>";
    uint32_t *ids;
    size_t count;
    EXPECT(tokenizer_encode(t, text, strlen(text), true, &ids, &count, why, sizeof why), "encode: %s", why);
    EXPECT(count == 5 && ids[0] == t->byte_token['a'] && ids[1] == endx && ids[2] == t->byte_token['b'] &&
               ids[3] == end && ids[4] == begin,
           "specials allowed: got %zu ids", count);
    free(ids);
    EXPECT(tokenizer_encode(t, text, strlen(text), false, &ids, &count, why, sizeof why), "encode: %s", why);
    bool none_special = true;
    for (size_t i = 0; i < count; i++) none_special = none_special && !tokenizer_is_special(t, ids[i]);
    EXPECT(none_special && count > 5, "specials not allowed: special ids in the output");
    free(ids);

    // Decode: holes and ids past the vocabulary are U+FFFD; specials are their spelling.
    uint32_t odd[] = {'h', n_tokens, end, n_tokens + 2, 1000000, 'i'};
    size_t n = 0;
    char *s = tokenizer_decode(t, odd, 6, &n);
    const char *want = "h\xEF\xBF\xBD<|end|>\xEF\xBF\xBD\xEF\xBF\xBDi";
    EXPECT(n == strlen(want) && memcmp(s, want, n) == 0 && s[n] == '\0', "decode of holes: got %zu bytes", n);
    free(s);
    size_t len = 99;
    EXPECT(tokenizer_token_bytes(t, n_tokens + 1, &len) == NULL && len == 0, "hole has bytes");
    EXPECT(tokenizer_token_bytes(t, 'q', &len) != NULL && len == 1, "byte token");
    s = tokenizer_decode(t, NULL, 0, &n);
    EXPECT(n == 0 && s[0] == '\0', "empty decode");
    free(s);
    EXPECT(tokenizer_encode(t, "", 0, true, &ids, &count, why, sizeof why) && count == 0, "empty encode");
    free(ids);
    tokenizer_free(t);

    // A multi-stage pre-tokenizer (Split then ByteLevel) also round-trips.
    write_toy_json(path, &v, false, WHOLE_TEXT_SPLIT);
    t = tokenizer_load(path, NULL, why, sizeof why);
    EXPECT(t != NULL, "toy tokenizer (Split) did not load: %s", why);
    if (t) random_bytes_round_trips(t, 150, "toy Split");
    tokenizer_free(t);
    free_toy_vocab(&v);
}

// Several threads, one tokenizer: the same ids as a single thread.
static void test_threads(void) {
    toy_vocab v = make_toy_vocab(300);
    const char *path = temp_path("toy_threads.json");
    write_toy_json(path, &v, true, BYTE_LEVEL_SPLIT);
    char why[300];
    tokenizer *t = tokenizer_load(path, NULL, why, sizeof why);
    EXPECT(t != NULL, "%s", why);
    if (!t) return;
    enum { DOCS = 64 };
    char *docs[DOCS];
    size_t sizes[DOCS];
    token_list serial[DOCS], parallel[DOCS];
    memset(serial, 0, sizeof serial);
    memset(parallel, 0, sizeof parallel);
    for (int d = 0; d < DOCS; d++) {
        sizes[d] = 2000 + rnd() % 2000;
        docs[d] = xmalloc(sizes[d]);
        for (size_t i = 0; i < sizes[d]; i++) docs[d][i] = (char)toy_alphabet[rnd() % sizeof toy_alphabet];
        tokenizer_scratch *s = tokenizer_scratch_new(t);
        EXPECT(tokenizer_encode_append(t, s, docs[d], sizes[d], false, &serial[d], why, sizeof why), "%s", why);
        tokenizer_scratch_free(s);
    }
    int failures = 0;
#pragma omp parallel num_threads(4) reduction(+ : failures)
    {
        tokenizer_scratch *s = tokenizer_scratch_new(t);
        char reason[300];
#pragma omp for schedule(dynamic, 1)
        for (int d = 0; d < DOCS; d++)
            if (!tokenizer_encode_append(t, s, docs[d], sizes[d], false, &parallel[d], reason, sizeof reason)) failures++;
        tokenizer_scratch_free(s);
    }
    EXPECT(failures == 0, "parallel encode failed");
    int differ = 0;
    for (int d = 0; d < DOCS; d++) {
        if (serial[d].count != parallel[d].count ||
            memcmp(serial[d].ids, parallel[d].ids, serial[d].count * sizeof(uint32_t)) != 0)
            differ++;
        free(serial[d].ids);
        free(parallel[d].ids);
        free(docs[d]);
    }
    EXPECT(differ == 0, "%d of %d documents encode differently on 4 threads", differ, DOCS);
    tokenizer_free(t);
    free_toy_vocab(&v);
}

#endif

// ---------------------------------------------------------------- broken files

static void expect_load_fails(const char *path, const char *encoding, const char *must_contain, const char *what) {
    char why[400] = "";
    tokenizer *t = tokenizer_load(path, encoding, why, sizeof why);
    EXPECT(t == NULL, "%s: loaded", what);
    EXPECT(one_line(why), "%s: reason is not one line: [%s]", what, why);
    EXPECT(strstr(why, must_contain) != NULL, "%s: reason [%s] lacks [%s]", what, why, must_contain);
    tokenizer_free(t);
}

static void test_broken_files(void) {
    expect_load_fails(temp_path("does_not_exist.tiktoken"), NULL, "cannot read", "missing file");
    expect_load_fails(temp_dir, NULL, "cannot read", "a directory");
    const char *empty = temp_path("empty.tiktoken");
    write_file(empty, "", 0);
    expect_load_fails(empty, NULL, "is empty", "empty file");

    // tiktoken files: a tiny valid prefix of r50k would fail on the rank count; each broken
    // line must be named.
    const char *tk = temp_path("r50k_base.tiktoken");
    write_file(tk, "IQ== 0\nIg== 1\n", 14);
    expect_load_fails(tk, NULL, "has 2 ranks but r50k_base has 50256", "truncated tiktoken");
    write_file(tk, "IQ== 0\nnot base64! 1\n", 21);
    expect_load_fails(tk, NULL, ":2: not a tiktoken line", "bad base64");
    write_file(tk, "IQ== 0\nIg==\n", 12);
    expect_load_fails(tk, NULL, ":2: not a tiktoken line", "missing rank");
    write_file(tk, "IQ== 0\nIg== 1x\n", 15);
    expect_load_fails(tk, NULL, ":2: not a tiktoken line", "bad rank");
    write_file(tk, "IQ== 0\nIg== 0\n", 14);
    expect_load_fails(tk, NULL, ":2: rank 0 appears twice", "duplicate rank");
    write_file(tk, "IQ== 99999\n", 11);
    expect_load_fails(tk, NULL, ":1: rank 99999 is too large", "rank out of range");
    // Past 2^64 - 1: the rank as written (it was reported as 18446744073709551615).
    write_file(tk, "IQ== 99999999999999999999999\n", 29);
    expect_load_fails(tk, NULL, ":1: rank 99999999999999999999999 is too large", "rank past 2^64");
    // Blank lines are skipped, as tiktoken's loader does: at the end ("\n\n") and between
    // lines, LF or CRLF; only the count of ranks is then wrong (they were "not a tiktoken line").
    write_file(tk, "IQ== 0\nIg== 1\n\n", 15);
    expect_load_fails(tk, NULL, "has 2 ranks but r50k_base has 50256", "a blank line at the end");
    write_file(tk, "IQ== 0\r\n\r\nIg== 1\r\n", 18);
    expect_load_fails(tk, NULL, "has 2 ranks but r50k_base has 50256", "a blank CRLF line between");
    const char *p50k = temp_path("p50k_base.tiktoken");
    write_file(p50k, "IQ== 50256\n", 11);   // p50k's ranks skip 50256, <|endoftext|>
    expect_load_fails(p50k, NULL, "special token's id", "rank on a special id");
    write_file(tk, "I=Q= 0\n", 7);
    expect_load_fails(tk, NULL, "not a tiktoken line", "bad padding");
    const char *unknown = temp_path("mystery.tiktoken");
    write_file(unknown, "IQ== 0\n", 7);
    expect_load_fails(unknown, NULL, "--encoding", "unguessable encoding");
    expect_load_fails(unknown, "r99k", "unknown tiktoken encoding", "unknown encoding");

    // tokenizer.json files.
    toy_vocab v = make_toy_vocab(50);
    const char *good = temp_path("good.json");
    write_toy_json(good, &v, true, BYTE_LEVEL_SPLIT);
    size_t n = 0;
    char *json = read_file_or_null(good, &n);
    const char *bad = temp_path("bad.json");
    write_file(bad, json, n / 2);
    expect_load_fails(bad, NULL, "not valid JSON", "truncated json");
    expect_load_fails(good, "r50k_base", "applies to .tiktoken files only", "encoding given for json");
    // JSON that is not an object, and a tokenizer.json behind a UTF-8 byte order mark: both
    // went to the tiktoken loader, which asked for --encoding.
    const char *array = temp_path("array.json");
    write_file(array, " [1, 2]\n", 8);
    expect_load_fails(array, NULL, "array.json: not a JSON object", "a JSON array");
    write_file(array, "\xEF\xBB\xBF[]", 5);
    expect_load_fails(array, NULL, "array.json: not a JSON object", "a JSON array after a BOM");
    strbuf with_bom = {0};
    sb_append(&with_bom, "\xEF\xBB\xBF");
    sb_append(&with_bom, json);
    const char *bom_path = temp_path("bom.json");
    write_file(bom_path, with_bom.data, with_bom.length);
    sb_free(&with_bom);
    char why[400] = "";
    tokenizer *loaded = tokenizer_load(bom_path, NULL, why, sizeof why);
    EXPECT(loaded != NULL && tokenizer_vocab_size(loaded) == v.n_tokens + 6,
           "a tokenizer.json behind a UTF-8 BOM does not load: %s", why);
    tokenizer_free(loaded);
    struct {
        const char *from, *to, *reason;
    } edits[] = {
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model type WordPiece"},
        {"\"dropout\":null", "\"dropout\":0.1", "dropout"},
        {"\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}", "normalizer NFC"},
        {"\"add_prefix_space\":false", "\"add_prefix_space\":true", "add_prefix_space"},
        {"\"type\":\"ByteLevel\"", "\"type\":\"Whitespace\"", "Whitespace"},
        {"\"lstrip\":false", "\"lstrip\":true", "lstrip"},
        {"\"merges\":[", "\"merges\":[\"a zzz\",", "not in the vocab"},
        {"\"merges\":[", "\"merges\":[\"a\",", "not a pair"},
        {"\"vocab\":{", "\"vocab\":{\"\xE4\xB8\xAD\":7777,", "byte-level alphabet"},
        {"\"vocab\":{", "\"vocab\":{\"zz\":-1,", "bad id"},
        {"\"vocab\":{", "\"vocab\":{\"zz\":16777216,", "bad id (ids are 0 .. 16777215)"},   // tables of 2^24+ ids
        {"\"vocab\":{", "\"vocab\":{\"zzq\":0,", "used twice"},
    };
    for (size_t e = 0; e < sizeof edits / sizeof *edits; e++) {
        char *at = strstr(json, edits[e].from);
        EXPECT(at != NULL, "edit %zu: [%s] not in the toy json", e, edits[e].from);
        if (!at) continue;
        strbuf sb = {0};
        sb_append(&sb, "");
        char saved = *at;
        *at = '\0';
        sb_append(&sb, json);
        *at = saved;
        sb_append(&sb, edits[e].to);
        sb_append(&sb, at + strlen(edits[e].from));
        write_file(bad, sb.data, sb.length);
        expect_load_fails(bad, NULL, edits[e].reason, edits[e].from);
        sb_free(&sb);
    }
    // A vocabulary without all 256 bytes is not byte-level.
    char *byte_a = strstr(json, "\"a\":97");
    EXPECT(byte_a != NULL, "toy json lacks \"a\":97");
    if (byte_a) {
        memcpy(byte_a, "\"\xC4\xA0\xC4\xA0\"", 6);   // "ĠĠ" (two spaces) instead of "a"; same length
        write_file(bad, json, n);
        expect_load_fails(bad, NULL, "", "vocab without byte a");
    }
    free(json);
    free_toy_vocab(&v);
}

// ---------------------------------------------------------------- modes with real files

static tokenizer *load_or_die(const char *path, const char *encoding) {
    char why[400];
    tokenizer *t = tokenizer_load(path, encoding, why, sizeof why);
    if (!t) fail("%s", why);
    return t;
}

static void format_ids(strbuf *sb, const uint32_t *ids, size_t n) {
    sb_append(sb, "[");
    for (size_t i = 0; i < n; i++) sb_printf(sb, "%s%u", i ? ", " : "", ids[i]);
    sb_append(sb, "]");
}

// gpt-tokenizer's TestPlans.txt: blocks of "EncodingName: X\nSample: S\nEncoded: [ids]"
// separated by blank lines (the format its own test reads).
static int run_plans(const char *plans_path, const char *data_dir) {
    size_t n;
    char *text = read_file_or_null(plans_path, &n);
    if (!text) fail("cannot read %s", plans_path);
    const char *names[8] = {0};
    tokenizer *loaded[8] = {0};
    int n_loaded = 0, cases = 0;
    int per_encoding[8] = {0};
    char *p = text;
    while (*p) {
        char *block_end = strstr(p, "\n\n");
        if (block_end) *block_end = '\0';
        char *name_line = p, *sample_line = strchr(name_line, '\n');
        char *ids_line = sample_line ? strchr(sample_line + 1, '\n') : NULL;
        p = block_end ? block_end + 2 : p + strlen(p);
        if (!sample_line || !ids_line) continue;
        *sample_line++ = '\0';
        *ids_line++ = '\0';
        size_t ids_len = strlen(ids_line);
        while (ids_len && (ids_line[ids_len - 1] == '\n' || ids_line[ids_len - 1] == '\r')) ids_line[--ids_len] = '\0';
        if (strncmp(name_line, "EncodingName: ", 14) || strncmp(sample_line, "Sample:", 7) ||
            strncmp(ids_line, "Encoded: ", 9))
            fail("%s: unexpected block starting [%.40s]", plans_path, name_line);
        const char *encoding = name_line + 14;
        const char *sample = sample_line[7] == ' ' ? sample_line + 8 : sample_line + 7;
        int k = 0;
        while (k < n_loaded && strcmp(names[k], encoding) != 0) k++;
        if (k == n_loaded) {
            if (n_loaded == 8) fail("too many encodings in %s", plans_path);
            char path[1024];
            // p50k_edit has p50k_base's ranks (and more special tokens).
            snprintf(path, sizeof path, "%s/%s.tiktoken", data_dir,
                     strcmp(encoding, "p50k_edit") == 0 ? "p50k_base" : encoding);
            names[k] = encoding;
            loaded[k] = load_or_die(path, encoding);
            n_loaded++;
        }
        uint32_t *ids;
        size_t count;
        char why[300];
        EXPECT(tokenizer_encode(loaded[k], sample, strlen(sample), false, &ids, &count, why, sizeof why), "%s", why);
        strbuf got = {0};
        format_ids(&got, ids, count);
        EXPECT(strcmp(got.data, ids_line + 9) == 0, "%s [%s]:\n  want %s\n  got  %s", encoding, sample, ids_line + 9,
               got.data);
        size_t back_n;
        char *back = tokenizer_decode(loaded[k], ids, count, &back_n);
        EXPECT(back_n == strlen(sample) && memcmp(back, sample, back_n) == 0, "%s [%s]: decode differs", encoding,
               sample);
        free(back);
        sb_free(&got);
        free(ids);
        cases++;
        per_encoding[k]++;
    }
    for (int k = 0; k < n_loaded; k++) {
        printf("  %s: %d cases\n", names[k], per_encoding[k]);
        tokenizer_free(loaded[k]);
    }
    free(text);
    EXPECT(cases >= 250, "only %d cases found in %s", cases, plans_path);
    return summary("test_tokenizer plans");
}

// {"text": "...", "allow_special": bool, "ids": [...]} per line, from
// test/tokenizer/make_vectors.js.
static int run_compare(const char *tokenizer_path, const char *vectors_path, const char *encoding) {
    tokenizer *t = load_or_die(tokenizer_path, encoding);
    size_t n;
    char *text = read_file_or_null(vectors_path, &n);
    if (!text) fail("cannot read %s", vectors_path);
    int cases = 0;
    size_t line_no = 0;
    for (char *line = text; *line;) {
        char *eol = strchr(line, '\n');
        if (eol) *eol = '\0';
        line_no++;
        if (*line) {
            json_doc doc;
            if (!json_parse(line, strlen(line), &doc)) fail("%s:%zu: %s", vectors_path, line_no, doc.error);
            const json_value *sample = json_get(&doc.root, "text"), *want = json_get(&doc.root, "ids");
            const json_value *allow = json_get(&doc.root, "allow_special");
            if (!sample || sample->type != JSON_STRING || !want || want->type != JSON_ARRAY || !allow ||
                allow->type != JSON_BOOL)
                fail("%s:%zu: expected {\"text\", \"allow_special\", \"ids\"}", vectors_path, line_no);
            uint32_t *ids;
            size_t count;
            char why[300];
            EXPECT(tokenizer_encode(t, sample->string, strlen(sample->string), allow->boolean, &ids, &count, why,
                                    sizeof why),
                   "%s", why);
            bool same = count == want->count;
            for (size_t i = 0; same && i < count; i++) same = want->items[i].integer == (int64_t)ids[i];
            strbuf got = {0};
            format_ids(&got, ids, count);
            EXPECT(same, "%s:%zu: ids differ from the JS tokenizer's; got %s", vectors_path, line_no, got.data);
            size_t back_n;
            char *back = tokenizer_decode(t, ids, count, &back_n);
            EXPECT(back_n == strlen(sample->string) && memcmp(back, sample->string, back_n) == 0,
                   "%s:%zu: decode differs from the text", vectors_path, line_no);
            free(back);
            sb_free(&got);
            free(ids);
            json_free(&doc);
            cases++;
        }
        line = eol ? eol + 1 : line + strlen(line);
    }
    printf("  %s: %d strings\n", vectors_path, cases);
    EXPECT(cases >= 200, "only %d strings in %s", cases, vectors_path);
    free(text);
    tokenizer_free(t);
    return summary("test_tokenizer compare");
}

static int run_roundtrip(const char *tokenizer_path, const char *encoding) {
    tokenizer *t = load_or_die(tokenizer_path, encoding);
#ifdef HAVE_PCRE2
    random_bytes_round_trips(t, 1500, tokenizer_name(t));
#else
    fail("this build has no PCRE2: cannot encode");
#endif
    tokenizer_free(t);
    return summary("test_tokenizer roundtrip");
}

// ---------------------------------------------------------------- prepare's shards

typedef struct {
    uint32_t *ids;
    size_t count;
    shard_header header;
    int shards;
} shard_stream;

// All shards matching a glob, in sorted order, as one stream (what the loader reads).
static shard_stream read_shards(const char *pattern) {
    shard_stream s = {0};
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0) return s;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char why[300];
        shard_header h;
        uint32_t *ids = shard_read_all(g.gl_pathv[i], &h, why, sizeof why);
        if (!ids) fail("%s: %s", g.gl_pathv[i], why);
        EXPECT(i == 0 || (h.vocab_size == s.header.vocab_size && h.doc_token == s.header.doc_token),
               "%s: header differs from the first shard's", g.gl_pathv[i]);
        s.header = h;
        s.ids = xrealloc(s.ids, (s.count + h.n_tokens + 1) * sizeof *s.ids);
        memcpy(s.ids + s.count, ids, h.n_tokens * sizeof *ids);
        s.count += h.n_tokens;
        s.shards++;
        free(ids);
    }
    globfree(&g);
    return s;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// The manifest lists every non-empty document in input order, one lowercase hex line each.
// Each must appear, whole and in order, in exactly one of the two streams: the streams are
// the documents of their split interleaved back into input order.
static int run_shards(const char *tokenizer_path, const char *encoding, const char *manifest, const char *train_glob,
                      const char *val_glob, uint32_t doc_token) {
    tokenizer *t = load_or_die(tokenizer_path, strcmp(encoding, "-") ? encoding : NULL);
    shard_stream split[2] = {read_shards(train_glob), read_shards(val_glob)};
    uint32_t expected_width = tokenizer_vocab_size(t) <= 65536 ? 2 : 4;
    for (int k = 0; k < 2; k++) {
        if (!split[k].shards) continue;
        EXPECT(split[k].header.vocab_size == tokenizer_vocab_size(t), "%s: vocab_size %u, want %u",
               k ? "val" : "train", split[k].header.vocab_size, tokenizer_vocab_size(t));
        EXPECT(split[k].header.doc_token == doc_token, "%s: doc_token %u, want %u", k ? "val" : "train",
               split[k].header.doc_token, doc_token);
        EXPECT(split[k].header.token_bytes == expected_width, "%s: %u-byte tokens, want %u", k ? "val" : "train",
               split[k].header.token_bytes, expected_width);
    }
    size_t n;
    char *text = read_file_or_null(manifest, &n);
    if (!text) fail("cannot read %s", manifest);
    size_t at[2] = {0, 0}, docs[2] = {0, 0}, line_no = 0;
    int misplaced = 0;
    tokenizer_scratch *scratch = tokenizer_scratch_new(t);
    for (char *line = text; *line;) {
        char *eol = strchr(line, '\n');
        if (eol) *eol = '\0';
        line_no++;
        size_t hex_len = strlen(line);
        uint8_t *doc = xmalloc(hex_len / 2 + 1);
        for (size_t i = 0; i + 1 < hex_len; i += 2) {
            int hi = hex_value(line[i]), lo = hex_value(line[i + 1]);
            if (hi < 0 || lo < 0) fail("%s:%zu: not hex", manifest, line_no);
            doc[i / 2] = (uint8_t)(hi << 4 | lo);
        }
        token_list want = {0};
        if (doc_token != SHARD_NO_DOC_TOKEN) token_list_push(&want, doc_token);
        char why[300];
        EXPECT(tokenizer_encode_append(t, scratch, (const char *)doc, hex_len / 2, false, &want, why, sizeof why),
               "%s", why);
        int found = -1;
        for (int k = 0; k < 2 && found < 0; k++) {
            if (at[k] + want.count > split[k].count) continue;
            if (memcmp(split[k].ids + at[k], want.ids, want.count * sizeof *want.ids) != 0) continue;
            // Without document tokens the next document must start right after this one.
            found = k;
        }
        if (found < 0) misplaced++;
        else {
            at[found] += want.count;
            docs[found]++;
        }
        free(want.ids);
        free(doc);
        line = eol ? eol + 1 : line + strlen(line);
    }
    tokenizer_scratch_free(scratch);
    EXPECT(misplaced == 0, "%d of %zu documents are not where they belong in the shards", misplaced, line_no);
    EXPECT(at[0] == split[0].count && at[1] == split[1].count,
           "tokens left over: train %zu of %zu used, val %zu of %zu used", at[0], split[0].count, at[1],
           split[1].count);
    printf("  %zu documents: train %zu (%zu tokens, %d shards), val %zu (%zu tokens, %d shards)\n", line_no, docs[0],
           split[0].count, split[0].shards, docs[1], split[1].count, split[1].shards);
    printf("DOCS train=%zu val=%zu\n", docs[0], docs[1]);
    free(text);
    free(split[0].ids);
    free(split[1].ids);
    tokenizer_free(t);
    return summary("test_tokenizer shards");
}

// tok/sample.h's sample_printable: a sampled NUL, ESC or DEL becomes U+FFFD, the rest is kept.
static void test_sample_printable(void) {
    static const char raw[] = "ab\0c\x1b[31mred\ttab\nline\x7f\xC3\xA9";
    char *got = sample_printable(raw, sizeof raw - 1);
    static const char want[] = "ab\xEF\xBF\xBD" "c\xEF\xBF\xBD[31mred\ttab\nline\xEF\xBF\xBD\xC3\xA9";
    EXPECT(strcmp(got, want) == 0, "sample_printable: got '%s'", got);
    free(got);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "can_encode") == 0) {   // the shell tests' probe
        puts(tokenizer_can_split() ? "yes" : "no (built without PCRE2)");
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "plans") == 0) return run_plans(argv[2], argv[3]);
    if (argc >= 4 && strcmp(argv[1], "compare") == 0) return run_compare(argv[2], argv[3], argc > 4 ? argv[4] : NULL);
    if (argc >= 3 && strcmp(argv[1], "roundtrip") == 0) return run_roundtrip(argv[2], argc > 3 ? argv[3] : NULL);
    if (argc == 8 && strcmp(argv[1], "shards") == 0)
        return run_shards(argv[2], argv[3], argv[4], argv[5], argv[6],
                          strcmp(argv[7], "none") == 0 ? SHARD_NO_DOC_TOKEN : (uint32_t)strtoul(argv[7], NULL, 10));
    if (argc != 1)
        fail("usage: test_tokenizer [can_encode | plans FILE DIR | compare TOKENIZER VECTORS [ENC] | roundtrip TOKENIZER [ENC] | "
             "shards TOKENIZER ENC|- MANIFEST TRAIN_GLOB VAL_GLOB DOC_TOKEN|none]");

    snprintf(temp_dir, sizeof temp_dir, "/tmp/test_tokenizer.XXXXXX");
    if (!mkdtemp(temp_dir)) fail("cannot make a temporary directory");
    test_merge_order();
    test_sample_printable();
    test_broken_files();
    test_encode_unsplit();
#ifdef HAVE_PCRE2
    test_round_trips_and_specials();
    test_threads();
#else
    {
        // Without PCRE2 a tokenizer still loads and decodes (and encodes unsplit: above);
        // encoding says why it cannot.
        toy_vocab v = make_toy_vocab(20);
        const char *path = temp_path("nopcre.json");
        write_toy_json(path, &v, true, BYTE_LEVEL_SPLIT);
        char why[300] = "";
        tokenizer *t = tokenizer_load(path, NULL, why, sizeof why);
        EXPECT(t != NULL, "%s", why);
        uint32_t *ids;
        size_t count;
        EXPECT(t && !tokenizer_encode(t, "a", 1, false, &ids, &count, why, sizeof why) && strstr(why, "PCRE2"),
               "encode without PCRE2 must fail naming PCRE2");
        EXPECT(!tokenizer_can_split(), "tokenizer_can_split() in a build without PCRE2");
        tokenizer_free(t);
        free_toy_vocab(&v);
    }
#endif
    char command[400];
    snprintf(command, sizeof command, "rm -rf '%s'", temp_dir);
    if (system(command) != 0) warn("could not remove %s", temp_dir);
    return summary("test_tokenizer");
}
