// tok/tokenizer.h — byte-level BPE: the tokenizer of train_gpt's data preparation and of the
// samples it prints while training. No Python, no network: a tokenizer is one file.
//
// Two file kinds load (the kind is told from the content, not the name):
//   *.tiktoken       one "base64(token bytes) SP rank" per line (OpenAI's rank files). The
//                    split regex and the special tokens are not in the file; they come from
//                    the named encoding: r50k_base (= gpt2), p50k_base, p50k_edit,
//                    cl100k_base, o200k_base, as tiktoken defines them.
//   tokenizer.json   a Hugging Face tokenizer of the byte-level BPE kind (GPT-2, Llama 3 /
//                    3.x): model.vocab, model.merges, added_tokens, and the split regex of
//                    the pre-tokenizer.
//
// Encoding is the usual two stages: the text is cut into pieces by the split regex (PCRE2,
// Unicode properties, JIT), then each piece becomes tokens by applying merges in rank order
// (a binary heap of candidate pairs, so a piece of n bytes costs O(n log n), not one rescan
// per merge). `decode(encode(s)) == s` for every byte string, invalid UTF-8 included: bytes
// the regex cannot match (invalid UTF-8) form pieces of their own and go through BPE like
// any other bytes. Every id below tokenizer_vocab_size() decodes to bytes; ids that name no
// token (holes in the id space, e.g. cl100k's 100256) and ids >= vocab_size decode to the
// replacement character U+FFFD ("\xEF\xBF\xBD") so that a sample from an untrained model
// (whose padded vocabulary may be larger) still prints.
//
// The loaded tokenizer is immutable: several threads may encode with one tokenizer at once
// (each call, or each tokenizer_scratch, has its own regex match data and merge buffers).
// Without PCRE2 (the build prints ✗ PCRE2), files still load and decode works; encoding
// returns false with a reason that says how to get PCRE2.
#ifndef TRAIN_GPT_TOKENIZER_H
#define TRAIN_GPT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tokenizer tokenizer;

#define TOKENIZER_NO_TOKEN 0xFFFFFFFFu

// Loads PATH. `encoding` names the tiktoken encoding (NULL: guessed from the file name, e.g.
// "r50k_base.tiktoken"); it must be NULL for a tokenizer.json. On failure returns NULL and
// writes a one-line reason (naming the file) into why.
tokenizer *tokenizer_load(const char *path, const char *encoding, char *why, size_t why_bytes);
void tokenizer_free(tokenizer *t);

// Size of the id space, special tokens included (r50k_base: 50257, cl100k_base: 100277,
// Llama 3: 128256). Every id an encoder emits is below it.
uint32_t tokenizer_vocab_size(const tokenizer *t);
// "r50k_base (tiktoken)", "tokenizer.json (BPE, 280147 merges)": for logs.
const char *tokenizer_name(const tokenizer *t);
// The id of the special token spelled `name` (e.g. "<|endoftext|>"), or TOKENIZER_NO_TOKEN.
uint32_t tokenizer_special_id(const tokenizer *t, const char *name);
// The token to put before each document: <|begin_of_text|> if the tokenizer has it, else
// <|endoftext|>, else <s>; TOKENIZER_NO_TOKEN if none of these exists.
uint32_t tokenizer_doc_token(const tokenizer *t);
// True if id is a special (added) token.
bool tokenizer_is_special(const tokenizer *t, uint32_t id);

// ---- encoding ----
// Ids of the text, in a buffer the caller frees. With allow_special, the spellings of special
// tokens in the text become their ids (leftmost, longest first); without it they are plain
// text (what data preparation wants: a web page that contains "<|endoftext|>" must not end
// a document). False (and a reason) only if this build has no PCRE2 or the regex engine fails.
bool tokenizer_encode(const tokenizer *t, const char *text, size_t bytes, bool allow_special, uint32_t **ids,
                      size_t *count, char *why, size_t why_bytes);

// Whether this build can run the split regex (it has PCRE2): without it tokenizer_encode and
// tokenizer_encode_append fail, and only tokenizer_encode_unsplit encodes.
bool tokenizer_can_split(void);
// BPE over the whole text as one piece, without the split regex and with special tokens as
// plain text: valid ids that decode to the text, but not always those tokenizer_encode gives
// (BPE may merge across a place where the regex cuts, e.g. a word and the space after it).
// Works in every build (a training sample's prompt in a build without PCRE2). False (and a
// reason) only for a text of 4 GiB or more.
bool tokenizer_encode_unsplit(const tokenizer *t, const char *text, size_t bytes, uint32_t **ids, size_t *count,
                              char *why, size_t why_bytes);

// A growing array of ids for callers that encode many texts (tokenizer_encode_append adds to
// its end). Free ids with free().
typedef struct {
    uint32_t *ids;
    size_t count, capacity;
} token_list;
void token_list_push(token_list *l, uint32_t id);

// Per-thread encoding state (regex match data, JIT stack, merge buffers), reused across
// calls so that a worker encoding millions of documents allocates once. One scratch must
// not be used by two threads at once.
typedef struct tokenizer_scratch tokenizer_scratch;
tokenizer_scratch *tokenizer_scratch_new(const tokenizer *t);
void tokenizer_scratch_free(tokenizer_scratch *s);
bool tokenizer_encode_append(const tokenizer *t, tokenizer_scratch *s, const char *text, size_t bytes,
                             bool allow_special, token_list *out, char *why, size_t why_bytes);

// ---- decoding ----
// The bytes of ids[0..n) (NUL-terminated, caller frees; the NUL is not counted in
// *bytes_out, which may be NULL). Special tokens decode to their spelling. Never fails.
char *tokenizer_decode(const tokenizer *t, const uint32_t *ids, size_t n, size_t *bytes_out);
// The bytes of one id (not NUL-terminated), or NULL (and *bytes = 0) for a hole or an id
// >= vocab_size. For streaming decoders; the pointer lives as long as t.
const uint8_t *tokenizer_token_bytes(const tokenizer *t, uint32_t id, size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif
