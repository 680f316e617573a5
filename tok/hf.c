// tok/hf.c — Hugging Face tokenizer.json files of the byte-level BPE kind (GPT-2, Llama 3,
// Llama 3.x, and others built the same way).
//
// What is read, and what is refused with a one-line reason rather than silently ignored:
//   model            type "BPE"; vocab {token: id}; merges ["a b", ...] or [["a","b"], ...];
//                    ignore_merges (whole piece in the vocabulary -> one token). Refused:
//                    dropout > 0, byte_fallback, a continuing_subword_prefix or
//                    end_of_word_suffix (not byte-level BPE).
//   added_tokens     [{id, content, ...}]: matched in the text when special tokens are
//                    allowed. Refused: lstrip / rstrip / single_word.
//   normalizer       must be null (Llama 3 has none; NFC and friends are not implemented).
//   pre_tokenizer    ByteLevel (use_regex: GPT-2's regex), Split (Regex or String pattern,
//                    behavior Isolated), or a Sequence of those. ByteLevel must not have
//                    add_prefix_space.
// Byte-level vocabularies spell bytes as printable characters (GPT-2's bytes_to_unicode:
// printable Latin-1 bytes stand for themselves, the other 68 bytes map to U+0100..U+0143);
// tokens are stored as the bytes they stand for. Special tokens are stored as their content.
#include "tok/internal.h"
#include "llmc/common.h"
#include "llmc/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

// char_to_byte[c] for code points c < 324 of the byte-level alphabet, -1 elsewhere.
static void build_byte_alphabet(int char_to_byte[324]) {
    for (int c = 0; c < 324; c++) char_to_byte[c] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        char_to_byte[printable ? b : 256 + extra++] = b;
    }
}

// Decodes one UTF-8 code point at *p (strict); -1 if malformed.
static int32_t next_code_point(const unsigned char **p) {
    const unsigned char *s = *p;
    if (s[0] < 0x80) {
        *p = s + 1;
        return s[0];
    }
    int n = s[0] >= 0xF0 ? 3 : s[0] >= 0xE0 ? 2 : s[0] >= 0xC0 ? 1 : -1;
    if (n < 0) return -1;
    int32_t cp = s[0] & (0x3F >> n);
    for (int i = 1; i <= n; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *p = s + n + 1;
    return cp;
}

// A vocabulary string to the bytes it stands for; false if some character is not in the
// byte-level alphabet.
static bool spelled_to_bytes(const int char_to_byte[324], const char *spelled, uint8_t *out, size_t *n) {
    const unsigned char *p = (const unsigned char *)spelled;
    size_t k = 0;
    while (*p) {
        int32_t cp = next_code_point(&p);
        if (cp < 0 || cp >= 324 || char_to_byte[cp] < 0) return false;
        out[k++] = (uint8_t)char_to_byte[cp];
    }
    *n = k;
    return k > 0;
}

static bool is_null_or_absent(const json_value *v) { return !v || v->type == JSON_NULL; }

static bool is_true(const json_value *v) { return v && v->type == JSON_BOOL && v->boolean; }

static const char *string_member(const json_value *object, const char *key) {
    const json_value *v = json_get(object, key);
    return v && v->type == JSON_STRING ? v->string : NULL;
}

// Adds the split stages of one pre-tokenizer (recursing into a Sequence).
static bool add_pre_tokenizer(tokenizer *t, const json_value *pre, bool *saw_byte_level, char *why, size_t why_bytes) {
    const char *type = string_member(pre, "type");
    if (!type) {
        snprintf(why, why_bytes, "pre_tokenizer without a type");
        return false;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_value *list = json_get(pre, "pretokenizers");
        if (!list || list->type != JSON_ARRAY) {
            snprintf(why, why_bytes, "pre_tokenizer Sequence without a pretokenizers list");
            return false;
        }
        for (size_t i = 0; i < list->count; i++)
            if (!add_pre_tokenizer(t, &list->items[i], saw_byte_level, why, why_bytes)) return false;
        return true;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        *saw_byte_level = true;
        if (is_true(json_get(pre, "add_prefix_space"))) {
            snprintf(why, why_bytes, "ByteLevel pre_tokenizer with add_prefix_space is not supported");
            return false;
        }
        const json_value *use_regex = json_get(pre, "use_regex");
        // use_regex defaults to true in the tokenizers library.
        if (!use_regex || is_true(use_regex)) return tok_add_stage(t, GPT2_PATTERN, false, why, why_bytes);
        return true;
    }
    if (strcmp(type, "Split") == 0) {
        const char *behavior = string_member(pre, "behavior");
        if (!behavior || strcmp(behavior, "Isolated") != 0 || is_true(json_get(pre, "invert"))) {
            snprintf(why, why_bytes, "Split pre_tokenizer with behavior %s%s is not supported (only Isolated)",
                     behavior ? behavior : "(none)", is_true(json_get(pre, "invert")) ? " and invert" : "");
            return false;
        }
        const json_value *pattern = json_get(pre, "pattern");
        const char *regex = string_member(pattern, "Regex");
        const char *literal = string_member(pattern, "String");
        if (!regex && !literal) {
            snprintf(why, why_bytes, "Split pre_tokenizer without a Regex or String pattern");
            return false;
        }
        return tok_add_stage(t, regex ? regex : literal, regex == NULL, why, why_bytes);
    }
    snprintf(why, why_bytes, "pre_tokenizer of type %s is not supported", type);
    return false;
}

static bool check_model(const json_value *model, char *why, size_t why_bytes) {
    const char *type = string_member(model, "type");
    if (type && strcmp(type, "BPE") != 0) {
        snprintf(why, why_bytes, "model type %s is not supported (only byte-level BPE)", type);
        return false;
    }
    const json_value *dropout = json_get(model, "dropout");
    if (!is_null_or_absent(dropout) && !(dropout->type == JSON_NUMBER && dropout->number == 0)) {
        snprintf(why, why_bytes, "BPE dropout is not supported");
        return false;
    }
    if (is_true(json_get(model, "byte_fallback"))) {
        snprintf(why, why_bytes, "byte_fallback BPE (SentencePiece style) is not byte-level BPE; not supported");
        return false;
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = string_member(model, affixes[i]);
        if (s && *s) {
            snprintf(why, why_bytes, "BPE with a %s is not byte-level BPE; not supported", affixes[i]);
            return false;
        }
    }
    return true;
}

// The largest id space taken: 2^24 ids, 64 times the largest vocabularies in use (~2^18). The
// tables are sized by it (13 bytes an id): one id of 2^30 - 1 among 50,000 made 14 GB of them,
// for a tokenizer no model could have.
#define HF_MAX_IDS (1 << 24)

// Largest id among vocab and added tokens, checking that each is an integer in range.
static bool find_id_space(const json_value *vocab, const json_value *added, uint32_t *size, char *why,
                          size_t why_bytes) {
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->count; i++) {
        const json_value *v = &vocab->items[i];
        if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer >= HF_MAX_IDS) {
            snprintf(why, why_bytes, "vocab entry %.60s has a bad id (ids are 0 .. %d)", vocab->keys[i], HF_MAX_IDS - 1);
            return false;
        }
        if (v->integer > max_id) max_id = v->integer;
    }
    for (size_t i = 0; added && i < added->count; i++) {
        const json_value *id = json_get(&added->items[i], "id");
        if (!id || id->type != JSON_NUMBER || !id->is_integer || id->integer < 0 || id->integer >= HF_MAX_IDS) {
            snprintf(why, why_bytes, "added_tokens[%zu] has a bad id (ids are 0 .. %d)", i, HF_MAX_IDS - 1);
            return false;
        }
        if (id->integer > max_id) max_id = id->integer;
    }
    if (max_id < 0) {
        snprintf(why, why_bytes, "empty vocabulary");
        return false;
    }
    *size = (uint32_t)max_id + 1;
    return true;
}

static bool add_vocab(tokenizer *t, const json_value *vocab, const int char_to_byte[324], char *why, size_t why_bytes) {
    size_t longest = 1;
    for (size_t i = 0; i < vocab->count; i++) longest = strlen(vocab->keys[i]) > longest ? strlen(vocab->keys[i]) : longest;
    uint8_t *bytes = xmalloc(longest);
    bool ok = true;
    for (size_t i = 0; i < vocab->count && ok; i++) {
        size_t n = 0;
        uint32_t id = (uint32_t)vocab->items[i].integer;
        if (!spelled_to_bytes(char_to_byte, vocab->keys[i], bytes, &n)) {
            snprintf(why, why_bytes, "vocab entry \"%.60s\" is not spelled in the byte-level alphabet (not a "
                     "byte-level BPE)", vocab->keys[i]);
            ok = false;
        } else if (!tok_set_token(t, id, bytes, n, TOK_MERGEABLE)) {
            snprintf(why, why_bytes, "vocab id %u is used twice", id);
            ok = false;
        }
    }
    free(bytes);
    return ok;
}

static bool add_added_tokens(tokenizer *t, const json_value *added, char *why, size_t why_bytes) {
    for (size_t i = 0; added && i < added->count; i++) {
        const json_value *a = &added->items[i];
        const char *content = string_member(a, "content");
        uint32_t id = (uint32_t)json_get(a, "id")->integer;
        if (!content || !*content) {
            snprintf(why, why_bytes, "added_tokens[%zu] has no content", i);
            return false;
        }
        static const char *const unsupported[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++) {
            if (is_true(json_get(a, unsupported[k]))) {
                snprintf(why, why_bytes, "added token %.60s has %s, which is not supported", content, unsupported[k]);
                return false;
            }
        }
        // An added token may also be in the vocabulary (GPT-2's <|endoftext|>); it then stays
        // mergeable too and decodes to the same bytes either way.
        if (t->kind[id] == TOK_MERGEABLE) {
            size_t n = strlen(content);
            if (t->length[id] != n || memcmp(t->pool + t->offset[id], content, n) != 0) {
                snprintf(why, why_bytes, "added token %.60s reuses vocab id %u of another token", content, id);
                return false;
            }
            t->kind[id] |= TOK_SPECIAL;
            continue;
        }
        if (!tok_set_token(t, id, (const uint8_t *)content, strlen(content), TOK_SPECIAL)) {
            snprintf(why, why_bytes, "added token id %u is used twice", id);
            return false;
        }
    }
    return true;
}

// Splits one merges entry into its two spelled sides (pointers into the JSON, or into
// `buffer` for the "a b" form).
static bool merge_sides(const json_value *m, char *buffer, size_t buffer_bytes, const char **a, const char **b) {
    if (m->type == JSON_ARRAY && m->count == 2 && m->items[0].type == JSON_STRING && m->items[1].type == JSON_STRING) {
        *a = m->items[0].string;
        *b = m->items[1].string;
        return true;
    }
    if (m->type != JSON_STRING) return false;
    // Byte-level spellings never contain a plain space (the space byte is spelled U+0120).
    const char *space = strchr(m->string, ' ');
    if (!space || strchr(space + 1, ' ') || strlen(m->string) + 1 > buffer_bytes) return false;
    memcpy(buffer, m->string, strlen(m->string) + 1);
    buffer[space - m->string] = '\0';
    *a = buffer;
    *b = buffer + (space - m->string) + 1;
    return **a && **b;
}

static bool add_merges(tokenizer *t, const json_value *merges, const int char_to_byte[324], char *why,
                       size_t why_bytes) {
    tok_pair_map_init(&t->pairs, merges->count);
    char buffer[2048];
    uint8_t left_bytes[1024], right_bytes[2048];
    for (size_t i = 0; i < merges->count; i++) {
        const char *a, *b;
        size_t na, nb;
        if (!merge_sides(&merges->items[i], buffer, sizeof buffer, &a, &b)) {
            snprintf(why, why_bytes, "merges[%zu] is not a pair of tokens", i);
            return false;
        }
        if (strlen(a) > sizeof left_bytes || strlen(b) > sizeof left_bytes ||
            !spelled_to_bytes(char_to_byte, a, left_bytes, &na) || !spelled_to_bytes(char_to_byte, b, right_bytes, &nb)) {
            snprintf(why, why_bytes, "merges[%zu] (%.40s %.40s) is not spelled in the byte-level alphabet", i, a, b);
            return false;
        }
        uint32_t left = tok_piece_lookup(t, left_bytes, na);
        uint32_t right = tok_piece_lookup(t, right_bytes, nb);
        memmove(right_bytes + na, right_bytes, nb);
        memcpy(right_bytes, left_bytes, na);
        uint32_t merged = tok_piece_lookup(t, right_bytes, na + nb);
        if (left == TOKENIZER_NO_TOKEN || right == TOKENIZER_NO_TOKEN || merged == TOKENIZER_NO_TOKEN) {
            snprintf(why, why_bytes, "merges[%zu] (%.40s %.40s) uses or makes a token that is not in the vocab", i, a, b);
            return false;
        }
        // As in the tokenizers library, a repeated pair takes the rank of its last line.
        tok_pair_map_put(&t->pairs, left, right, (uint32_t)i, merged);
    }
    return true;
}

static tokenizer *build(const json_value *root, char *why, size_t why_bytes) {
    const json_value *model = json_get(root, "model");
    const json_value *vocab = json_get(model, "vocab");
    const json_value *merges = json_get(model, "merges");
    const json_value *added = json_get(root, "added_tokens");
    if (!model || model->type != JSON_OBJECT || !vocab || vocab->type != JSON_OBJECT || !merges ||
        merges->type != JSON_ARRAY) {
        snprintf(why, why_bytes, "not a BPE tokenizer.json (no model.vocab object and model.merges list)");
        return NULL;
    }
    if (added && added->type != JSON_ARRAY) {
        snprintf(why, why_bytes, "added_tokens is not a list");
        return NULL;
    }
    if (!check_model(model, why, why_bytes)) return NULL;
    const json_value *normalizer = json_get(root, "normalizer");
    if (!is_null_or_absent(normalizer)) {
        const char *type = string_member(normalizer, "type");
        snprintf(why, why_bytes, "normalizer %s is not supported (only tokenizers without one)", type ? type : "?");
        return NULL;
    }
    uint32_t vocab_size = 0;
    if (!find_id_space(vocab, added, &vocab_size, why, why_bytes)) return NULL;

    tokenizer *t = tok_new(vocab_size);
    snprintf(t->name, sizeof t->name, "tokenizer.json (BPE, %zu merges)", merges->count);
    t->whole_piece_first = is_true(json_get(model, "ignore_merges"));
    int char_to_byte[324];
    build_byte_alphabet(char_to_byte);
    bool saw_byte_level = false;
    const json_value *pre = json_get(root, "pre_tokenizer");
    bool ok = add_vocab(t, vocab, char_to_byte, why, why_bytes) && add_added_tokens(t, added, why, why_bytes) &&
              tok_index_tokens(t, why, why_bytes) && add_merges(t, merges, char_to_byte, why, why_bytes);
    if (ok && is_null_or_absent(pre)) {
        snprintf(why, why_bytes, "no pre_tokenizer (a byte-level BPE needs a ByteLevel one)");
        ok = false;
    }
    ok = ok && add_pre_tokenizer(t, pre, &saw_byte_level, why, why_bytes);
    if (ok && !saw_byte_level) {
        snprintf(why, why_bytes, "the pre_tokenizer has no ByteLevel step, so this is not a byte-level BPE");
        ok = false;
    }
    if (!ok) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

tokenizer *tok_load_hf_json(const char *path, const char *text, size_t bytes, char *why, size_t why_bytes) {
    json_doc doc;
    if (!json_parse(text, bytes, &doc)) {
        snprintf(why, why_bytes, "%s is not valid JSON: %s", path, doc.error);
        return NULL;
    }
    char reason[300];
    tokenizer *t = doc.root.type == JSON_OBJECT ? build(&doc.root, reason, sizeof reason) : NULL;
    if (doc.root.type != JSON_OBJECT) snprintf(reason, sizeof reason, "not a JSON object");
    if (!t) snprintf(why, why_bytes, "%s: %s", path, reason);
    json_free(&doc);
    return t;
}
