// tok/internal.h — the inside of a loaded tokenizer, shared by the files that build one
// (tok/tiktoken.c, tok/hf.c) and the ones that use one (tok/tokenizer.c, tok/bpe.c). Not part of
// the API: everything else includes tok/tokenizer.h only.
//
// One representation serves both file kinds. A token is an id and its bytes. BPE needs:
//   byte_token[b]  the token of the single byte b (byte-level BPE has all 256);
//   pieces         bytes -> id of every mergeable token (the "whole piece is a token"
//                  shortcut that tiktoken always takes and tokenizer.json takes when
//                  model.ignore_merges is set);
//   pairs          (left id, right id) -> (rank, merged id). For tokenizer.json the pairs
//                  are model.merges and the rank is the line number. For tiktoken, merging
//                  two adjacent parts is allowed whenever their concatenation is a token and
//                  its rank is that token's rank; so every split of every token into two
//                  tokens becomes a pair, and the same heap-driven merge loop serves both.
#ifndef TRAIN_GPT_TOK_INTERNAL_H
#define TRAIN_GPT_TOK_INTERNAL_H

#include "tok/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TOK_MAX_STAGES 4

// Bit flags: a token can be both (GPT-2's tokenizer.json has <|endoftext|> in its vocab too).
enum { TOK_HOLE = 0, TOK_MERGEABLE = 1, TOK_SPECIAL = 2 };

// Up to 16 bytes of a piece as two little-endian words, zero-padded: the key of the piece
// map and of the per-thread piece cache, so that most lookups touch one cache line and never
// the token pool.
typedef struct {
    uint64_t lo, hi;
} tok_key16;

// Open-addressing map from token bytes to id. A slot keeps the first 16 bytes of its token
// inline; longer tokens compare the rest against the pool.
typedef struct {
    tok_key16 key;
    uint32_t id_plus_1;   // 0: empty
    uint32_t length;
} tok_piece_slot;

typedef struct {
    tok_piece_slot *slots;
    uint64_t mask;
    uint64_t count;
} tok_piece_map;

// Open-addressing map from (left << 32 | right) to (rank, result).
typedef struct {
    uint64_t key;      // UINT64_MAX: empty
    uint32_t rank, result;
} tok_pair_slot;

typedef struct {
    tok_pair_slot *slots;
    uint64_t mask;
    uint64_t count;
} tok_pair_map;

typedef struct {
    uint32_t id;
    uint32_t bytes;
    const uint8_t *text;   // points into the pool
} tok_special;

struct tokenizer {
    char name[96];
    uint32_t vocab_size;
    // Bytes of id i: pool[offset[i] .. offset[i] + length[i]); kind[i] says what i is.
    uint8_t *pool;
    size_t pool_bytes, pool_capacity;
    uint64_t *offset;
    uint32_t *length;
    uint8_t *kind;
    uint32_t byte_token[256];
    tok_piece_map pieces;
    tok_pair_map pairs;
    bool whole_piece_first;
    // Special tokens, longest first (so that a scan that takes the first hit is
    // leftmost-longest); first_byte[b] is set when some special token starts with b.
    tok_special *specials;
    size_t n_specials;
    bool special_first_byte[256];
    // Split regexes, applied in order: stage 0 cuts the text, stage k cuts each piece of
    // stage k-1 (how a Hugging Face pre-tokenizer Sequence behaves).
    int n_stages;
    char *pattern[TOK_MAX_STAGES];
    bool pattern_literal[TOK_MAX_STAGES];
    void *regex[TOK_MAX_STAGES];      // pcre2_code_8 *, NULL without PCRE2
    bool regex_jit[TOK_MAX_STAGES];
};

// token_list_push, inlined for the encoder's inner loop.
static inline void tok_push(token_list *l, uint32_t id) {
    if (l->count == l->capacity) token_list_push(l, id);
    else l->ids[l->count++] = id;
}

// ---- building (tok/tokenizer.c) ----
tokenizer *tok_new(uint32_t vocab_size);
// Sets id's bytes and kind; false if id is out of range or already set.
bool tok_set_token(tokenizer *t, uint32_t id, const uint8_t *bytes, size_t n, int kind);
// Adds a split regex stage (PCRE2 syntax, Rust/tiktoken semantics for \s; see tok/tokenizer.c).
bool tok_add_stage(tokenizer *t, const char *pattern, bool literal, char *why, size_t why_bytes);
// Builds byte_token, the piece map and the special list from the tokens set so far. False
// with a reason if some byte has no token.
bool tok_index_tokens(tokenizer *t, char *why, size_t why_bytes);

// ---- maps (tok/bpe.c) ----
uint64_t tok_hash_bytes(const uint8_t *p, size_t n);
void tok_piece_map_init(tok_piece_map *m, uint64_t expected);
void tok_piece_map_free(tok_piece_map *m);
// Inserts id (whose bytes are already in t's pool); false if those bytes are already there.
bool tok_piece_map_insert(tokenizer *t, uint32_t id);
uint32_t tok_piece_lookup(const tokenizer *t, const uint8_t *p, size_t n);   // TOKENIZER_NO_TOKEN if absent
void tok_pair_map_init(tok_pair_map *m, uint64_t expected);
void tok_pair_map_free(tok_pair_map *m);
// Inserts or overwrites.
void tok_pair_map_put(tok_pair_map *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t result);
// Builds the pair map of a tiktoken vocabulary (every split of a token into two tokens).
void tok_pairs_from_vocabulary(tokenizer *t);

// The tokens of recently merged pieces (up to 16 bytes that became up to 3 tokens): text
// repeats its rare words, and a hit skips the merge loop (a dozen lookups in a pair map of
// megabytes). Two 32-byte entries share a 64-byte line (a 2-way set): one memory access per
// lookup; 16,384 entries in 512 KiB per thread.
#define TOK_CACHE_SETS 8192
#define TOK_CACHE_TOKENS 3
typedef struct {
    tok_key16 key;
    uint32_t shape;   // piece bytes | n_tokens << 8; 0: empty
    uint32_t tokens[TOK_CACHE_TOKENS];
} tok_cache_entry;

// Merge state of one thread: buffers grown to the longest piece seen, and the cache.
typedef struct {
    uint32_t *token, *next, *prev;
    uint64_t *heap;
    size_t capacity;
    tok_cache_entry *cache;
} tok_bpe_scratch;
void tok_bpe_scratch_free(tok_bpe_scratch *s);
// Appends the tokens of one piece (n >= 1 bytes) to out. False, with nothing appended or
// read, for a piece longer than TOK_MAX_PIECE_BYTES: the merge loop's positions are 32-bit.
#define TOK_MAX_PIECE_BYTES ((size_t)UINT32_MAX)
bool tok_bpe_encode_piece(const tokenizer *t, tok_bpe_scratch *s, const uint8_t *p, size_t n, token_list *out);

// ---- loaders ----
tokenizer *tok_load_tiktoken(const char *path, const char *text, size_t bytes, const char *encoding, char *why,
                             size_t why_bytes);
tokenizer *tok_load_hf_json(const char *path, const char *text, size_t bytes, char *why, size_t why_bytes);

#ifdef __cplusplus
}
#endif

#endif
