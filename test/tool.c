// test/tool.c — helpers for the shell tests, built as build/test_tool.
//
//   test_tool shard OUT VOCAB DOC_TOKEN N_TOKENS SEED [PERIOD [DOC_MIN DOC_MAX]]
//       Writes a shard of N_TOKENS tokens through the real shard writer. Tokens follow a
//       learnable pattern (a noisy repeating sequence of PERIOD tokens, default 17) cut into
//       documents: each starts with DOC_TOKEN (the shard's first token is one) and is
//       DOC_MIN..DOC_MAX tokens long, its document token included, drawn uniformly. The
//       default, 51 151 (a document token every 51–151 tokens), is what the tests were
//       written against and stays byte for byte the same. DOC_MIN = DOC_MAX = 0 writes no
//       document token at all but still keeps DOC_TOKEN out of the other tokens and in the
//       header: plain causal data for a config that has a doc_token (bench/gpu/run.sh).
//       DOC_TOKEN -1 writes none and records none.
//   test_tool markov OUT VOCAB DOC_TOKEN N_TOKENS LANG_SEED SAMPLE_SEED
//       Writes a shard sampled from a random order-2 Markov "language": each pair of previous
//       tokens has 4 possible successors (chosen by LANG_SEED) with probabilities 0.5, 0.25,
//       0.15, 0.1, so the best possible loss is 1.21 nats and a small model needs many tokens
//       to learn all VOCAB² contexts: more data means a lower loss (the DiLoCo convergence
//       test). Train and validation shards share LANG_SEED and differ in SAMPLE_SEED.
//       Documents of 51–151 tokens start with DOC_TOKEN, after which the context restarts.
//   test_tool flip FILE OFFSET
//       Flips every bit of the byte at OFFSET (negative: from the end).
//   test_tool truncate FILE BYTES
//       Cuts FILE to BYTES bytes (negative: remove that many from the end).
//   test_tool tokens SHARD
//       Prints the shard's tokens, one per line (after full verification).
//   test_tool forge_n_tokens SHARD N
//       Sets the header's n_tokens to N and its header checksum to match (a forged header).
//   test_tool forge_doc_token SHARD N
//       The same for the header's doc_token (u32).
//   test_tool forge_token SHARD INDEX VALUE
//       Sets token INDEX to VALUE (even one not below the header's vocab_size) and every
//       checksum to match (payload, header, version 2's chunk table): a shard that only the
//       token range check can refuse.
//   test_tool rechunk SHARD CHUNK_BYTES
//       Writes SHARD again (its tokens verified first) with chunks of CHUNK_BYTES, or as a
//       version 1 shard (no chunk table) with 0: the same tokens and fingerprint.
//   test_tool xxh64 FILE
//       Prints FILE's XXH64 as 16 hex digits (what checksums.xxh64 lists), for tests that
//       edit a checkpoint's state.json on purpose.
//   test_tool quant KIND KEEP BLOCK N SEED PATTERN DIR
//       quant.cu's encoder with error feedback on N values (PATTERN 0: Gaussian, 1: every |x|
//       equal, 2: mostly zeros, 3: a NaN in the second block) and a residual of N(0, 0.1)
//       values, codec KIND (int8, int4, int2, none) keeping KEEP of every BLOCK values (0:
//       dense). Writes DIR/x.f32, r.f32 (before), enc.bin, r_after.f32, dec.f32 (quant_decode of
//       enc.bin) and DIR/case.txt ("encode KIND@KEEP BLOCK N") for test/diloco_check.py --codec.
//   test_tool quant_reduce KIND KEEP DOWN BLOCK N SEED M DIR
//       The hub's reduction (quant_reduce_segment, bound 3, the downlink's error feedback from a
//       residual of N(0, 0.01) values) of M contributions encoded as in `quant` (contribution 1
//       scaled by 100, which the bound catches; with M > 3 contribution 3 holds a NaN). Writes
//       DIR/in_J.bin, r.f32 (before), out.bin, r_after.f32 and DIR/case.txt ("reduce
//       KIND@KEEP DOWN BLOCK N M").
#include "llmc/common.h"
#include "llmc/checksum.h"
#include "llmc/quant.h"
#include "dataloader.h"
#include "llmc/rng.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// The gap to the next document token, drawn after writing one: a document of
// doc_min..doc_max tokens is its document token and then 'gap' others.
static int64_t next_document_gap(rng_state *r, int64_t doc_min, int64_t doc_max) {
    return doc_min - 1 + (int64_t)(rng_next(r) % (uint64_t)(doc_max - doc_min + 1));
}

static int write_pattern_shard(int argc, char **argv) {
    const char *usage = "usage: test_tool shard OUT VOCAB DOC_TOKEN N_TOKENS SEED [PERIOD [DOC_MIN DOC_MAX]]";
    if (argc < 6 || argc == 8 || argc > 9) fail("%s", usage);
    const char *out = argv[1];
    uint32_t vocab = (uint32_t)atoll(argv[2]);
    long long doc = atoll(argv[3]);
    uint64_t n = (uint64_t)atoll(argv[4]);
    uint64_t seed = (uint64_t)atoll(argv[5]);
    int64_t period = argc > 6 ? atoll(argv[6]) : 17;
    int64_t doc_min = argc > 8 ? atoll(argv[7]) : 51, doc_max = argc > 8 ? atoll(argv[8]) : 151;
    bool no_documents = doc_min == 0 && doc_max == 0;
    if (vocab < 2) fail("shard: VOCAB must be at least 2");
    if (period < 1) fail("shard: PERIOD must be at least 1");
    if (!no_documents && (doc_min < 1 || doc_max < doc_min))
        fail("shard: DOC_MIN DOC_MAX must satisfy 1 <= DOC_MIN <= DOC_MAX, or both be 0 (no documents)");
    shard_writer *w = shard_writer_open(out, vocab, doc < 0 ? SHARD_NO_DOC_TOKEN : (uint32_t)doc);
    if (!w) fail("cannot create '%s': %s", out, strerror(errno));
    rng_state r;
    rng_seed(&r, seed, 7);
    uint32_t *pattern = xmalloc((size_t)period * sizeof *pattern);
    for (int64_t i = 0; i < period; i++) {
        uint32_t t;
        do t = (uint32_t)(rng_next(&r) % vocab);
        while ((long long)t == doc);
        pattern[i] = t;
    }
    int64_t until_doc = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t;
        if (doc >= 0 && !no_documents && until_doc-- <= 0) {
            t = (uint32_t)doc;
            until_doc = next_document_gap(&r, doc_min, doc_max);
        } else if (rng_next(&r) % 10 == 0) {
            do t = (uint32_t)(rng_next(&r) % vocab);
            while ((long long)t == doc);
        } else {
            t = pattern[i % (uint64_t)period];
        }
        if (!shard_writer_append(w, &t, 1)) fail("write failed: %s", strerror(errno));
    }
    free(pattern);
    if (!shard_writer_close(w)) fail("cannot finish '%s': %s", out, strerror(errno));
    return 0;
}

// The k-th successor of context (a, b) in language `lang`: a fixed hash, never doc.
static uint32_t markov_successor(uint64_t lang, uint32_t a, uint32_t b, int k, uint32_t vocab, long long doc) {
    uint64_t z = lang ^ ((uint64_t)a << 40) ^ ((uint64_t)b << 20) ^ (uint64_t)k;
    for (uint64_t bump = 0;; bump++) {
        uint64_t x = (z + bump * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
        x ^= x >> 31;
        x *= 0x94D049BB133111EBull;
        x ^= x >> 29;
        uint32_t t = (uint32_t)(x % vocab);
        if ((long long)t != doc) return t;
    }
}

static int write_markov_shard(int argc, char **argv) {
    if (argc != 7) fail("usage: test_tool markov OUT VOCAB DOC_TOKEN N_TOKENS LANG_SEED SAMPLE_SEED");
    const char *out = argv[1];
    uint32_t vocab = (uint32_t)atoll(argv[2]);
    long long doc = atoll(argv[3]);
    uint64_t n = (uint64_t)atoll(argv[4]), lang = (uint64_t)atoll(argv[5]) * 0x2545F4914F6CDD1Dull;
    if (vocab < 8 || doc < 0 || doc >= vocab) fail("markov: VOCAB must be >= 8 and 0 <= DOC_TOKEN < VOCAB");
    shard_writer *w = shard_writer_open(out, vocab, (uint32_t)doc);
    if (!w) fail("cannot create '%s': %s", out, strerror(errno));
    rng_state r;
    rng_seed(&r, (uint64_t)atoll(argv[6]), 11);
    static const double cumulative[4] = {0.5, 0.75, 0.9, 1.0};
    uint32_t a = (uint32_t)doc, b = (uint32_t)doc;
    int64_t until_doc = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t;
        if (until_doc-- <= 0) {
            t = (uint32_t)doc;
            until_doc = next_document_gap(&r, 51, 151);
            a = b = t;
        } else {
            double u = rng_uniform(&r);
            int k = 0;
            while (k < 3 && u >= cumulative[k]) k++;
            t = markov_successor(lang, a, b, k, vocab, doc);
            a = b;
            b = t;
        }
        if (!shard_writer_append(w, &t, 1)) fail("write failed: %s", strerror(errno));
    }
    if (!shard_writer_close(w)) fail("cannot finish '%s': %s", out, strerror(errno));
    return 0;
}

static int flip_byte(int argc, char **argv) {
    if (argc < 3) fail("usage: test_tool flip FILE OFFSET");
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) fail("cannot open '%s': %s", argv[1], strerror(errno));
    struct stat st;
    fstat(fd, &st);
    long long off = atoll(argv[2]);
    if (off < 0) off += st.st_size;
    if (off < 0 || off >= st.st_size) fail("offset outside the file");
    unsigned char b;
    if (!pread_exact(fd, &b, 1, (uint64_t)off)) fail("read failed");
    b ^= 0xFF;
    if (pwrite(fd, &b, 1, off) != 1) fail("write failed");
    close(fd);
    return 0;
}

static int truncate_file(int argc, char **argv) {
    if (argc < 3) fail("usage: test_tool truncate FILE BYTES");
    struct stat st;
    if (stat(argv[1], &st) != 0) fail("cannot stat '%s'", argv[1]);
    long long bytes = atoll(argv[2]);
    if (bytes < 0) bytes += st.st_size;
    if (truncate(argv[1], bytes) != 0) fail("truncate failed: %s", strerror(errno));
    return 0;
}

// A forged header: the field of `bytes` at `at` (n_tokens: 16, 8; doc_token: 36, 4) set to N
// (decimal) and the header checksum made to match, so that only the field's own check can
// refuse it.
static int forge_header(int argc, char **argv, int at, int bytes) {
    if (argc < 3) fail("usage: test_tool %s SHARD N", argv[0]);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) fail("cannot open '%s': %s", argv[1], strerror(errno));
    uint8_t h[SHARD_HEADER_BYTES];
    if (!pread_exact(fd, h, sizeof h, 0)) fail("cannot read the header of '%s'", argv[1]);
    uint64_t n = strtoull(argv[2], NULL, 10);
    for (int i = 0; i < bytes; i++) h[at + i] = (uint8_t)(n >> (8 * i));
    uint64_t sum = xxh64(h, 56, 0);
    for (int i = 0; i < 8; i++) h[56 + i] = (uint8_t)(sum >> (8 * i));
    if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h) fail("write failed");
    close(fd);
    return 0;
}

// A forged token: written in place, then the payload checksum recomputed and the header
// checksum after it, as a buggy writer that skipped the range check would have made it.
static int forge_token(int argc, char **argv) {
    if (argc < 4) fail("usage: test_tool forge_token SHARD INDEX VALUE");
    shard_header sh;
    char why[256];
    if (!shard_read_header(argv[1], &sh, why, sizeof why)) fail("%s: %s", argv[1], why);
    uint64_t index = strtoull(argv[2], NULL, 10);
    uint32_t value = (uint32_t)strtoul(argv[3], NULL, 10);
    if (index >= sh.n_tokens) fail("forge_token: INDEX beyond the shard's %llu tokens", (unsigned long long)sh.n_tokens);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) fail("cannot open '%s': %s", argv[1], strerror(errno));
    size_t bytes = (size_t)(sh.n_tokens * sh.token_bytes);
    uint8_t *payload = xmalloc(bytes), h[SHARD_HEADER_BYTES];
    if (!pread_exact(fd, h, sizeof h, 0) || !pread_exact(fd, payload, bytes, SHARD_HEADER_BYTES))
        fail("cannot read '%s'", argv[1]);
    for (uint32_t b = 0; b < sh.token_bytes; b++) payload[index * sh.token_bytes + b] = (uint8_t)(value >> (8 * b));
    uint64_t sum = xxh64(payload, bytes, 0);
    for (int i = 0; i < 8; i++) h[24 + i] = (uint8_t)(sum >> (8 * i));
    sum = xxh64(h, 56, 0);
    for (int i = 0; i < 8; i++) h[56 + i] = (uint8_t)(sum >> (8 * i));
    if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h ||
        pwrite(fd, payload, bytes, SHARD_HEADER_BYTES) != (ssize_t)bytes)
        fail("write failed");
    if (sh.version >= 2) {   // the chunk holding it gets its entry
        uint64_t k = index * sh.token_bytes / sh.chunk_bytes, at = k * sh.chunk_bytes;
        uint64_t n = bytes - at < sh.chunk_bytes ? bytes - at : sh.chunk_bytes;
        uint8_t entry[8];
        sum = xxh64(payload + at, (size_t)n, k);
        for (int i = 0; i < 8; i++) entry[i] = (uint8_t)(sum >> (8 * i));
        if (pwrite(fd, entry, 8, (off_t)(SHARD_HEADER_BYTES + bytes + 8 * k)) != 8) fail("write failed");
    }
    close(fd);
    free(payload);
    return 0;
}

static int rechunk(int argc, char **argv) {
    if (argc < 3) fail("usage: test_tool rechunk SHARD CHUNK_BYTES");
    shard_header h;
    char why[256];
    uint32_t *tokens = shard_read_all(argv[1], &h, why, sizeof why);
    if (!tokens) fail("%s: %s", argv[1], why);
    shard_writer *w = shard_writer_open_chunked(argv[1], h.vocab_size, h.doc_token, (uint32_t)atoll(argv[2]));
    if (!w) fail("cannot create '%s.tmp': %s", argv[1], strerror(errno));
    if (!shard_writer_append(w, tokens, h.n_tokens) || !shard_writer_close(w))
        fail("cannot write '%s': %s", argv[1], strerror(errno));
    free(tokens);
    return 0;
}

static int print_tokens(int argc, char **argv) {
    if (argc < 2) fail("usage: test_tool tokens SHARD");
    shard_header h;
    char why[256];
    uint32_t *tokens = shard_read_all(argv[1], &h, why, sizeof why);
    if (!tokens) fail("%s: %s", argv[1], why);
    for (uint64_t i = 0; i < h.n_tokens; i++) printf("%u\n", tokens[i]);
    free(tokens);
    return 0;
}

static int print_xxh64(int argc, char **argv) {
    if (argc < 2) fail("usage: test_tool xxh64 FILE");
    size_t bytes = 0;
    char *data = read_file_or_null(argv[1], &bytes);
    if (!data) fail("cannot read '%s'", argv[1]);
    printf("%016llx\n", (unsigned long long)xxh64(data, bytes, 0));
    free(data);
    return 0;
}

static void write_all(const char *dir, const char *name, const void *data, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) fail("cannot write '%s'", path);
}

static quant_codec codec_from(const char *kind, const char *keep) {
    int k = quant_kind_from_name(kind);
    if (k < 0) fail("quant: unknown codec '%s' (int8, int4, int2, none, bf16)", kind);
    return quant_codec_of((quant_kind)k, atoll(keep));
}

static void quant_fill(float *x, int64_t n, int64_t block, int pattern, rng_state *r) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)rng_normal(r);
        if (pattern == 1) x[i] = x[i] < 0 ? -0.5f : 0.5f;
        if (pattern == 2 && rng_next(r) % 13) x[i] = 0.0f;
    }
    if (pattern == 3 && n > block) x[block + 1] = NAN;
}

static int quant_case(int argc, char **argv) {
    if (argc != 8) fail("usage: test_tool quant KIND KEEP BLOCK N SEED PATTERN DIR");
    quant_codec c = codec_from(argv[1], argv[2]);
    int64_t block = atoll(argv[3]), n = atoll(argv[4]);
    rng_state r;
    rng_seed(&r, (uint64_t)atoll(argv[5]), 7);
    const char *dir = argv[7];
    float *x = alloc_floats((size_t)n + 1), *res = alloc_floats((size_t)n + 1), *back = alloc_floats((size_t)n + 1);
    quant_fill(x, n, block, atoi(argv[6]), &r);
    for (int64_t i = 0; i < n; i++) res[i] = (float)(rng_normal(&r) * 0.1);
    size_t bytes = quant_encoded_bytes(c, n, block), values = (size_t)n * sizeof(float);
    uint8_t *enc = xmalloc(bytes + 1);
    write_all(dir, "x.f32", x, values);
    write_all(dir, "r.f32", res, values);
    quant_encode_feedback(c, x, res, n, block, enc);
    quant_decode(c, enc, n, block, back);
    write_all(dir, "enc.bin", enc, bytes);
    write_all(dir, "r_after.f32", res, values);
    write_all(dir, "dec.f32", back, values);
    char text[128];
    int len = snprintf(text, sizeof text, "encode %s@%lld %lld %lld\n", quant_kind_name(quant_codec_kind(c)),
                       (long long)quant_codec_keep(c), (long long)block, (long long)n);
    write_all(dir, "case.txt", text, (size_t)len);
    free(x), free(res), free(back), free(enc);
    return 0;
}

static int quant_reduce_case(int argc, char **argv) {
    if (argc != 9) fail("usage: test_tool quant_reduce KIND KEEP DOWN BLOCK N SEED M DIR");
    quant_codec up = codec_from(argv[1], argv[2]), down = codec_from(argv[3], "0");
    int64_t block = atoll(argv[4]), n = atoll(argv[5]);
    int m = atoi(argv[7]);
    if (m < 1 || m > 64) fail("quant_reduce: M in 1..64");
    rng_state r;
    rng_seed(&r, (uint64_t)atoll(argv[6]), 9);
    const char *dir = argv[8];
    size_t bytes = quant_encoded_bytes(up, n, block), values = (size_t)n * sizeof(float);
    uint8_t *in[64];
    float *x = alloc_floats((size_t)n + 1), *res = alloc_floats((size_t)n + 1), *scratch = alloc_floats((size_t)n + 1);
    for (int j = 0; j < m; j++) {
        quant_fill(x, n, block, j == 3 ? 3 : 0, &r);
        if (j == 1)
            for (int64_t i = 0; i < n; i++) x[i] *= 100.0f;
        in[j] = xmalloc(bytes + 1);
        quant_encode(up, x, n, block, in[j]);
        char name[32];
        snprintf(name, sizeof name, "in_%d.bin", j);
        write_all(dir, name, in[j], bytes);
    }
    for (int64_t i = 0; i < n; i++) res[i] = (float)(rng_normal(&r) * 0.01);
    write_all(dir, "r.f32", res, values);
    size_t out_bytes = quant_encoded_bytes(down, n, block);
    uint8_t *out = xmalloc(out_bytes + 1);
    quant_reduction q = {.up = up, .down = down, .block = block, .bound = 3.0f};
    quant_reduce_segment(&q, (const uint8_t *const *)in, m, n, res, scratch, out, NULL);
    write_all(dir, "out.bin", out, out_bytes);
    write_all(dir, "r_after.f32", res, values);
    char text[160];
    int len = snprintf(text, sizeof text, "reduce %s@%lld %s %lld %lld %d\n", quant_kind_name(quant_codec_kind(up)),
                       (long long)quant_codec_keep(up), quant_kind_name(quant_codec_kind(down)), (long long)block,
                       (long long)n, m);
    write_all(dir, "case.txt", text, (size_t)len);
    for (int j = 0; j < m; j++) free(in[j]);
    free(x), free(res), free(scratch), free(out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) fail("usage: test_tool shard|markov|flip|truncate|tokens|forge_n_tokens|forge_doc_token|forge_token|rechunk|xxh64|quant|quant_reduce ...");
    if (!strcmp(argv[1], "quant")) return quant_case(argc - 1, argv + 1);
    if (!strcmp(argv[1], "quant_reduce")) return quant_reduce_case(argc - 1, argv + 1);
    if (!strcmp(argv[1], "xxh64")) return print_xxh64(argc - 1, argv + 1);
    if (!strcmp(argv[1], "shard")) return write_pattern_shard(argc - 1, argv + 1);
    if (!strcmp(argv[1], "markov")) return write_markov_shard(argc - 1, argv + 1);
    if (!strcmp(argv[1], "flip")) return flip_byte(argc - 1, argv + 1);
    if (!strcmp(argv[1], "truncate")) return truncate_file(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokens")) return print_tokens(argc - 1, argv + 1);
    if (!strcmp(argv[1], "forge_n_tokens")) return forge_header(argc - 1, argv + 1, 16, 8);
    if (!strcmp(argv[1], "forge_doc_token")) return forge_header(argc - 1, argv + 1, 36, 4);
    if (!strcmp(argv[1], "forge_token")) return forge_token(argc - 1, argv + 1);
    if (!strcmp(argv[1], "rechunk")) return rechunk(argc - 1, argv + 1);
    fail("unknown test_tool command '%s'", argv[1]);
}
