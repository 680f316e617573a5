// tok/bpe.c — the merge step of byte-level BPE, and the two hash maps it reads.
//
// A piece starts as one part per byte. Every adjacent pair of parts that has a merge is a
// candidate keyed (rank, position of its left part); a binary min-heap yields the lowest
// rank, ties to the leftmost, which is the order of both tiktoken's byte_pair_merge and
// Hugging Face's Word::merge_all. After a merge only the two pairs that touch the new part
// change, so they are pushed; entries made stale by earlier merges stay in the heap and are
// recognised when popped (the pair now at that position no longer has that rank). That is
// O(n log n) per piece instead of a rescan of all pairs per merge, which matters for long
// pieces (a run of 10^5 digits or dashes is one piece for some regexes).
//
// Maps are open addressing with linear probing, sized to at most half full, built once at
// load and then read-only, so encoders on many threads share them without locks.
#include "tok/internal.h"
#include "llmc/common.h"

#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------- hashing

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBull;
    return h ^ (h >> 32);
}

// n <= 8 bytes as a zero-padded little-endian word, reading only p[0..n) (a piece may end
// the buffer). Two overlapping 4-byte loads cover 4..8 bytes; 1..3 bytes are gathered.
static inline uint64_t load_up_to_8(const uint8_t *p, size_t n) {
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        return (uint64_t)a | ((uint64_t)b << (8 * (n - 4)));
    }
    if (n == 0) return 0;
    return (uint64_t)p[0] | ((uint64_t)p[n / 2] << (8 * (n / 2))) | ((uint64_t)p[n - 1] << (8 * (n - 1)));
}

static inline tok_key16 key16(const uint8_t *p, size_t n) {
    tok_key16 k;
    if (n >= 16) {
        memcpy(&k.lo, p, 8);
        memcpy(&k.hi, p + 8, 8);
    } else if (n >= 8) {
        memcpy(&k.lo, p, 8);
        k.hi = load_up_to_8(p + 8, n - 8);
    } else {
        k.lo = load_up_to_8(p, n);
        k.hi = 0;
    }
    return k;
}

uint64_t tok_hash_bytes(const uint8_t *p, size_t n) {
    tok_key16 k = key16(p, n);
    uint64_t h = mix64(k.lo ^ 0x9E3779B97F4A7C15ull) ^ mix64(k.hi + (uint64_t)n * 0xC2B2AE3D27D4EB4Full);
    for (size_t i = 16; i < n; i += 8) {
        uint64_t v = load_up_to_8(p + i, n - i < 8 ? n - i : 8);
        h = mix64(h ^ v);
    }
    return h;
}

static uint64_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    key ^= key >> 29;
    key *= 0xBF58476D1CE4E5B9ull;
    return key ^ (key >> 32);
}

static uint64_t table_size_for(uint64_t expected) {
    uint64_t size = 16;
    while (size < expected * 2 + 16) size *= 2;
    return size;
}

// ---------------------------------------------------------------- piece map

void tok_piece_map_init(tok_piece_map *m, uint64_t expected) {
    uint64_t size = table_size_for(expected);
    m->slots = xcalloc(size, sizeof *m->slots);
    m->mask = size - 1;
    m->count = 0;
}

void tok_piece_map_free(tok_piece_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static inline bool slot_holds(const tokenizer *t, const tok_piece_slot *slot, tok_key16 k, const uint8_t *p, size_t n) {
    if (slot->length != n || slot->key.lo != k.lo || slot->key.hi != k.hi) return false;
    return n <= 16 || memcmp(t->pool + t->offset[slot->id_plus_1 - 1] + 16, p + 16, n - 16) == 0;
}

bool tok_piece_map_insert(tokenizer *t, uint32_t id) {
    tok_piece_map *m = &t->pieces;
    CHECK(m->count * 2 < m->mask + 1);
    const uint8_t *p = t->pool + t->offset[id];
    size_t n = t->length[id];
    tok_key16 k = key16(p, n);
    for (uint64_t i = tok_hash_bytes(p, n) & m->mask;; i = (i + 1) & m->mask) {
        tok_piece_slot *slot = &m->slots[i];
        if (slot->id_plus_1 == 0) {
            *slot = (tok_piece_slot){k, id + 1, (uint32_t)n};
            m->count++;
            return true;
        }
        if (slot_holds(t, slot, k, p, n)) return false;
    }
}

uint32_t tok_piece_lookup(const tokenizer *t, const uint8_t *p, size_t n) {
    const tok_piece_map *m = &t->pieces;
    tok_key16 k = key16(p, n);
    for (uint64_t i = tok_hash_bytes(p, n) & m->mask;; i = (i + 1) & m->mask) {
        const tok_piece_slot *slot = &m->slots[i];
        if (slot->id_plus_1 == 0) return TOKENIZER_NO_TOKEN;
        if (slot_holds(t, slot, k, p, n)) return slot->id_plus_1 - 1;
    }
}

// ---------------------------------------------------------------- pair map

void tok_pair_map_init(tok_pair_map *m, uint64_t expected) {
    uint64_t size = table_size_for(expected);
    m->slots = xmalloc(size * sizeof *m->slots);
    for (uint64_t i = 0; i < size; i++) m->slots[i].key = UINT64_MAX;
    m->mask = size - 1;
    m->count = 0;
}

void tok_pair_map_free(tok_pair_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static void pair_map_grow(tok_pair_map *m) {
    tok_pair_map bigger;
    tok_pair_map_init(&bigger, (m->mask + 1));
    for (uint64_t i = 0; i <= m->mask; i++) {
        tok_pair_slot s = m->slots[i];
        if (s.key != UINT64_MAX) tok_pair_map_put(&bigger, (uint32_t)(s.key >> 32), (uint32_t)s.key, s.rank, s.result);
    }
    free(m->slots);
    *m = bigger;
}

void tok_pair_map_put(tok_pair_map *m, uint32_t left, uint32_t right, uint32_t rank, uint32_t result) {
    if ((m->count + 1) * 2 > m->mask + 1) pair_map_grow(m);
    uint64_t key = (uint64_t)left << 32 | right;
    for (uint64_t i = hash_pair(key) & m->mask;; i = (i + 1) & m->mask) {
        tok_pair_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) {
            s->key = key;
            m->count++;
        } else if (s->key != key) {
            continue;
        }
        s->rank = rank;
        s->result = result;
        return;
    }
}

static inline const tok_pair_slot *pair_lookup(const tok_pair_map *m, uint32_t left, uint32_t right) {
    uint64_t key = (uint64_t)left << 32 | right;
    for (uint64_t i = hash_pair(key) & m->mask;; i = (i + 1) & m->mask) {
        const tok_pair_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

void tok_pairs_from_vocabulary(tokenizer *t) {
    uint64_t total_splits = 0;
    for (uint32_t id = 0; id < t->vocab_size; id++)
        if ((t->kind[id] & TOK_MERGEABLE) && t->length[id] > 1) total_splits += t->length[id] - 1;
    tok_pair_map_init(&t->pairs, total_splits / 2 + 1024);
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->kind[id] & TOK_MERGEABLE)) continue;
        const uint8_t *p = t->pool + t->offset[id];
        size_t n = t->length[id];
        for (size_t k = 1; k < n; k++) {
            uint32_t left = tok_piece_lookup(t, p, k);
            if (left == TOKENIZER_NO_TOKEN) continue;
            uint32_t right = tok_piece_lookup(t, p + k, n - k);
            if (right == TOKENIZER_NO_TOKEN) continue;
            // A tiktoken rank is the token id itself.
            tok_pair_map_put(&t->pairs, left, right, id, id);
        }
    }
}

// ---------------------------------------------------------------- merging

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
    free(s->token);
    free(s->next);
    free(s->prev);
    free(s->heap);
    free(s->cache);
    memset(s, 0, sizeof *s);
}

static void scratch_reserve(tok_bpe_scratch *s, size_t n) {
    if (n <= s->capacity) return;
    size_t cap = s->capacity ? s->capacity : 64;
    while (cap < n) cap *= 2;
    free(s->token);
    free(s->next);
    free(s->prev);
    free(s->heap);
    s->token = xmalloc(cap * sizeof *s->token);
    s->next = xmalloc(cap * sizeof *s->next);
    s->prev = xmalloc(cap * sizeof *s->prev);
    // At most n - 1 initial candidates plus 2 per merge (n - 1 merges).
    s->heap = xmalloc(3 * cap * sizeof *s->heap);
    s->capacity = cap;
}

// Heap entries are (rank << 32 | left position): comparing the integers compares by rank,
// then by position, which is exactly the merge order we need.
static void heap_push(uint64_t *heap, size_t *size, uint64_t v) {
    size_t i = (*size)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent] <= v) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, size_t *size) {
    uint64_t top = heap[0];
    uint64_t last = heap[--(*size)];
    size_t n = *size, i = 0;
    while (true) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap[child + 1] < heap[child]) child++;
        if (heap[child] >= last) break;
        heap[i] = heap[child];
        i = child;
    }
    if (n > 0) heap[i] = last;
    return top;
}

// The merge loop proper: p[0..n) to tokens in s->token, linked by s->next from 0 to n.
static void merge_piece(const tokenizer *t, tok_bpe_scratch *s, const uint8_t *p, size_t n) {
    scratch_reserve(s, n);
    uint32_t *token = s->token, *next = s->next, *prev = s->prev;
    for (size_t i = 0; i < n; i++) {
        token[i] = t->byte_token[p[i]];
        next[i] = (uint32_t)(i + 1);
        prev[i] = (uint32_t)i - 1;   // UINT32_MAX for the first part
    }
    size_t heap_size = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_pair_slot *m = pair_lookup(&t->pairs, token[i], token[i + 1]);
        if (m) heap_push(s->heap, &heap_size, (uint64_t)m->rank << 32 | i);
    }
    const uint32_t end = (uint32_t)n;
    while (heap_size > 0) {
        uint64_t top = heap_pop(s->heap, &heap_size);
        uint32_t rank = (uint32_t)(top >> 32), left = (uint32_t)top;
        // Stale if the left part was absorbed (token set to NO_TOKEN), is now last, or the
        // pair at this position changed to one of another rank.
        if (token[left] == TOKENIZER_NO_TOKEN) continue;
        uint32_t right = next[left];
        if (right == end) continue;
        const tok_pair_slot *m = pair_lookup(&t->pairs, token[left], token[right]);
        if (!m || m->rank != rank) continue;
        token[left] = m->result;
        token[right] = TOKENIZER_NO_TOKEN;
        next[left] = next[right];
        if (next[left] != end) prev[next[left]] = left;
        if (prev[left] != UINT32_MAX) {
            const tok_pair_slot *a = pair_lookup(&t->pairs, token[prev[left]], token[left]);
            if (a) heap_push(s->heap, &heap_size, (uint64_t)a->rank << 32 | prev[left]);
        }
        if (next[left] != end) {
            const tok_pair_slot *b = pair_lookup(&t->pairs, token[left], token[next[left]]);
            if (b) heap_push(s->heap, &heap_size, (uint64_t)b->rank << 32 | left);
        }
    }
}

bool tok_bpe_encode_piece(const tokenizer *t, tok_bpe_scratch *s, const uint8_t *p, size_t n, token_list *out) {
    // Positions (next, prev, the heap's low half) are uint32_t, and UINT32_MAX + 1 bytes
    // would wrap them (no test: it would take 4 GiB of text and ~150 GB of scratch).
    if (n > TOK_MAX_PIECE_BYTES) return false;
    if (n == 1) {
        tok_push(out, t->byte_token[p[0]]);
        return true;
    }
    if (t->whole_piece_first) {
        uint32_t whole = tok_piece_lookup(t, p, n);
        if (whole != TOKENIZER_NO_TOKEN) {
            tok_push(out, whole);
            return true;
        }
    }
    // Only merged pieces are cached: whole-token pieces cost one map lookup anyway, and
    // keeping them out leaves the cache to the words that need the merge loop.
    tok_cache_entry *set = NULL;
    tok_key16 k = {0, 0};
    if (n <= 16) {
        if (!s->cache) {
            s->cache = aligned_alloc(64, 2 * TOK_CACHE_SETS * sizeof *s->cache);
            if (!s->cache) fail("out of memory allocating the tokenizer's piece cache");
            memset(s->cache, 0, 2 * TOK_CACHE_SETS * sizeof *s->cache);
        }
        k = key16(p, n);
        set = &s->cache[2 * (mix64(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull) ^ n) & (TOK_CACHE_SETS - 1))];
        for (int way = 0; way < 2; way++) {
            const tok_cache_entry *e = &set[way];
            if ((e->shape & 0xFF) == n && e->key.lo == k.lo && e->key.hi == k.hi) {
                for (uint32_t i = 0; i < e->shape >> 8; i++) tok_push(out, e->tokens[i]);
                return true;
            }
        }
    }
    size_t first = out->count;
    merge_piece(t, s, p, n);
    for (uint32_t i = 0; i != (uint32_t)n; i = s->next[i]) tok_push(out, s->token[i]);
    size_t made = out->count - first;
    if (set && made <= TOK_CACHE_TOKENS) {
        // The newest entry goes first; the older one moves to the second way.
        set[1] = set[0];
        set[0].key = k;
        set[0].shape = (uint32_t)n | (uint32_t)made << 8;
        memcpy(set[0].tokens, out->ids + first, made * sizeof *set[0].tokens);
    }
    return true;
}
