// test/test_units.c — unit tests of the pieces around the model: checksum, JSON, the
// learning-rate schedule, the parameter table and FLOP count, token shards and the
// loader's three orders (contiguous, shuffled, split across ranks), safetensors and
// checkpoints (round trip and every corruption they must refuse); the memory plan's cgroup
// limit read from fake cgroup trees (v1 and v2, a limit below the process's own cgroup).
#include "check.h"
#include "llmc/bytes.h"
#include "llmc/checkpoint.h"
#include "llmc/checksum.h"
#include "llmc/comm.h"
#include "llmc/common.h"
#include "llmc/config.h"
#include "llmc/guard.h"
#include "dataloader.h"
#include "llmc/json.h"
#include "llmc/params.h"
#include "llmc/optim.h"
#include "llmc/plan.h"
#include "llmc/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmp_root[256];

static void path_in_tmp(char *out, size_t bytes, const char *name) { snprintf(out, bytes, "%s/%s", tmp_root, name); }

static void flip_byte_at(const char *path, long offset) {
    int fd = open(path, O_RDWR);
    struct stat st;
    fstat(fd, &st);
    if (offset < 0) offset += st.st_size;
    unsigned char b;
    pread(fd, &b, 1, offset);
    b ^= 0x01;
    pwrite(fd, &b, 1, offset);
    close(fd);
}

// ---------------------------------------------------------------- checksum

static void test_xxh64(void) {
    // The published test vector of XXH64 for the empty input, seed 0.
    EXPECT(xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL, "empty-input vector");
    char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (char)(i * 31 + 7);
    uint64_t whole = xxh64(buf, sizeof buf, 0);
    for (size_t piece = 1; piece < 70; piece += 7) {
        xxh64_state s;
        xxh64_init(&s, 0);
        for (size_t at = 0; at < sizeof buf; at += piece)
            xxh64_update(&s, buf + at, at + piece > sizeof buf ? sizeof buf - at : piece);
        EXPECT(xxh64_digest(&s) == whole, "streaming in pieces of %zu matches one shot", piece);
    }
    buf[500] ^= 1;
    EXPECT(xxh64(buf, sizeof buf, 0) != whole, "a flipped bit changes the hash");
    EXPECT(xxh64(buf, sizeof buf, 1) != xxh64(buf, sizeof buf, 0), "the seed matters");
}

// ---------------------------------------------------------------- JSON

static void test_json(void) {
    const char *good = "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"b\": {\"c\": 9007199254740993}}";
    json_doc doc;
    EXPECT(json_parse(good, strlen(good), &doc), "parses: %s", doc.error);
    const json_value *a = json_get(&doc.root, "a");
    EXPECT(a && a->type == JSON_ARRAY && a->count == 5, "array of 5");
    if (a && a->count == 5) {
        EXPECT(a->items[0].is_integer && a->items[0].integer == 1, "integer");
        EXPECT(a->items[1].number == -2500.0 && !a->items[1].is_integer, "float");
        EXPECT(a->items[2].type == JSON_BOOL && a->items[2].boolean, "true");
        EXPECT(a->items[3].type == JSON_NULL, "null");
        EXPECT(strcmp(a->items[4].string, "x\xc3\xa9\xf0\x9f\x98\x80\n") == 0, "escapes and a surrogate pair");
    }
    const json_value *c = json_get(json_get(&doc.root, "b"), "c");
    EXPECT(c && c->is_integer && c->integer == 9007199254740993LL, "int64 beyond 2^53 is exact");
    json_free(&doc);
    const char *bad[] = {"{\"a\":1,}", "[1 2]", "{\"a\" 1}", "\"unterminated", "{\"a\":01}", "[1.]", "tru",
                         "{\"a\":1} x", "\"\\ud800\"", "[\"\x01\"]", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bool ok = json_parse(bad[i], strlen(bad[i]), &doc);
        EXPECT(!ok, "rejects %s", bad[i]);
        if (ok) json_free(&doc);
    }
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    EXPECT(!json_parse(deep, 200, &doc), "rejects nesting deeper than 64");
    strbuf sb = {0};
    sb_json_number(&sb, 0.1);
    EXPECT(strcmp(sb.data, "0.1") == 0, "shortest round-trip number, got %s", sb.data);
    sb_free(&sb);
    // Strings: valid UTF-8 (é, an emoji) kept, each ill-formed sequence (a cut 3-byte character,
    // a lone continuation byte, 0xFF) one U+FFFD; the _bytes variant keeps them, and json_parse
    // reads both back.
    const char *text = "a\xc3\xa9\xf0\x9f\x98\x80 \xe2\x82!\x80\xff\"\x01";
    sb_json_string(&sb, text);
    EXPECT(strcmp(sb.data, "\"a\xc3\xa9\xf0\x9f\x98\x80 \xef\xbf\xbd!\xef\xbf\xbd\xef\xbf\xbd\\\"\\u0001\"") == 0,
           "ill-formed UTF-8 becomes U+FFFD, got %s", sb.data);
    EXPECT(json_parse(sb.data, sb.length, &doc), "reads back: %s", doc.error);
    json_free(&doc);
    sb_free(&sb);
    sb_json_string_bytes(&sb, text);
    EXPECT(json_parse(sb.data, sb.length, &doc) && doc.root.type == JSON_STRING && strcmp(doc.root.string, text) == 0,
           "the bytes variant reads back to the same bytes");
    json_free(&doc);
    sb_free(&sb);
}

// ---------------------------------------------------------------- schedule

static void test_schedule(void) {
    train_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.lr = 1.0;
    cfg.min_lr_frac = 0.1;
    cfg.max_steps = 100;
    cfg.warmup_steps = 10;
    cfg.decay_frac = 0.2;
    cfg.decay_shape = "linear";
    // By hand from DESIGN.md: warmup peak·(s+1)/10; decay starts at 100 − 20 = 80.
    EXPECT(fabs(lr_at_step(&cfg, 0) - 0.1) < 1e-15, "warmup step 0");
    EXPECT(fabs(lr_at_step(&cfg, 9) - 1.0) < 1e-15, "warmup reaches the peak at step 9");
    EXPECT(lr_at_step(&cfg, 50) == 1.0, "stable phase");
    EXPECT(lr_at_step(&cfg, 79) == 1.0, "last stable step");
    EXPECT(fabs(lr_at_step(&cfg, 80) - 1.0) < 1e-15, "decay starts at the peak (p = 0)");
    EXPECT(fabs(lr_at_step(&cfg, 90) - (1.0 + (0.1 - 1.0) * 0.5)) < 1e-15, "linear decay midway");
    EXPECT(fabs(lr_at_step(&cfg, 99) - (1.0 + (0.1 - 1.0) * 0.95)) < 1e-15, "linear decay last step");
    // Past max_steps (a resume with max_steps lowered below the saved step: its warning) the
    // floor, not the line drawn on below it (step 120: -0.8).
    EXPECT(fabs(lr_at_step(&cfg, 100) - 0.1) < 1e-15 && fabs(lr_at_step(&cfg, 120) - 0.1) < 1e-15,
           "past max_steps: min_lr_frac · lr (got %g at step 120)", lr_at_step(&cfg, 120));
    cfg.decay_shape = "sqrt";
    EXPECT(fabs(lr_at_step(&cfg, 90) - (0.1 + 0.9 * (1.0 - sqrt(0.5)))) < 1e-15, "sqrt decay midway");
    EXPECT(fabs(lr_at_step(&cfg, 120) - 0.1) < 1e-15, "sqrt, past max_steps: min_lr_frac · lr");
    cfg.decay_frac = 0.125;  // 12.5 steps: rounds half away from zero to 13, decay from 87
    EXPECT(lr_at_step(&cfg, 86) == 1.0 && lr_at_step(&cfg, 88) < 1.0, "round(12.5) = 13");
    cfg.decay_frac = 0.0;
    EXPECT(lr_at_step(&cfg, 99) == 1.0, "no decay phase when decay_frac = 0");
}

// ---------------------------------------------------------------- parameter table

static model_config small_model(bool tied, bool qk_norm) {
    model_config m = {.vocab_size = 50, .n_layer = 3, .d_model = 16, .n_head = 4, .n_kv_head = 2, .head_dim = 8,
                      .d_ff = 40, .seq_len = 32, .rope_theta = 10000, .nope_every = 4, .qk_norm = qk_norm,
                      .tie_embeddings = tied, .norm_eps = 1e-6, .init_std = 0.02, .doc_masking = true,
                      .doc_token = 0};
    return m;
}

static void test_param_table(void) {
    for (int variant = 0; variant < 4; variant++) {
        bool tied = variant & 1, qk = variant & 2;
        model_config m = small_model(tied, qk);
        param_table t;
        param_table_build(&t, &m);
        int per_layer = qk ? 11 : 9;
        EXPECT(t.count == 2 + 3 * per_layer + (tied ? 0 : 1), "tensor count for tied=%d qk=%d", tied, qk);
        int64_t offset = 0, decayed = 0;
        for (int i = 0; i < t.count; i++) {
            const param_info *p = &t.params[i];
            EXPECT(p->offset == offset, "%s is contiguous", p->name);
            offset += p->numel;
            bool should_decay = p->ndim == 2 && p->kind != P_EMBED;
            EXPECT(p->decay == should_decay, "%s decay flag", p->name);
            decayed += p->decay;
        }
        EXPECT(offset == t.numel, "numel adds up");
        // per layer: q 32x16, k 16x16, v 16x16, o 16x32, gate 40x16, up 40x16, down 16x40
        int64_t per_layer_matmul = 32 * 16 + 16 * 16 * 2 + 16 * 32 + 40 * 16 * 3;
        int64_t n = 3 * per_layer_matmul + 50 * 16;
        EXPECT(model_matmul_params(&t) == n, "matmul parameters %lld vs %lld", (long long)model_matmul_params(&t),
               (long long)n);
        double flops = 6.0 * (double)n + 12.0 * 3 * 4 * 8 * 32;
        EXPECT(model_flops_per_token(&t) == flops, "PaLM FLOPs per token");
        EXPECT(decayed == 3 * 7 + (tied ? 0 : 1), "decayed tensors are the 2-D weights and an untied head");
        const param_info *q = param_find(&t, P_WQ, 1);
        EXPECT(q && strcmp(q->name, "model.layers.1.self_attn.q_proj.weight") == 0 && q->shape[0] == 32 &&
                   q->shape[1] == 16,
               "q_proj name and shape");
        EXPECT((param_find(&t, P_Q_NORM, 0) != NULL) == qk, "q_norm exists iff qk_norm");
        float *flat = alloc_floats((size_t)t.numel);
        EXPECT(param_ptr(&t, flat, P_LM_HEAD, -1) == (tied ? flat : flat + param_find(&t, P_LM_HEAD, -1)->offset),
               "the tied head is the embedding");
        free(flat);
        param_table_free(&t);
    }
    model_config m = small_model(true, true);
    m.nope_every = 4;
    EXPECT(layer_uses_rope(&m, 0) && layer_uses_rope(&m, 2) && !layer_uses_rope(&m, 3) && !layer_uses_rope(&m, 7),
           "NoPE on layers 3, 7, ...");
    m.nope_every = 0;
    EXPECT(layer_uses_rope(&m, 3), "nope_every = 0: RoPE everywhere");
    char *json = model_config_to_json(&m);
    model_config back;
    const char *why;
    EXPECT(model_config_from_json(json, &back, &why) && model_config_equal(&m, &back), "model config JSON round trip");
    // Values a config file could not give are refused, not carried in: a rope_theta of 1e999
    // read as inf and wrote back as null (found by test/fuzz_files.c), a negative n_layer.
    const struct {
        const char *key, *value;
    } bad[] = {{"rope_theta", "1e999"}, {"n_layer", "-3"}, {"norm_eps", "-1"}, {"vocab_size", "1"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char pattern[64], *edited = xmalloc(strlen(json) + 64);
        snprintf(pattern, sizeof pattern, "\"%s\":", bad[i].key);
        const char *at = strstr(json, pattern);
        CHECK(at);
        const char *end = at + strlen(pattern) + strcspn(at + strlen(pattern), ",}");
        sprintf(edited, "%.*s%s%s", (int)(at + strlen(pattern) - json), json, bad[i].value, end);
        why = NULL;
        EXPECT(!model_config_from_json(edited, &back, &why) && why && strstr(why, bad[i].key),
               "model config with %s = %s refused (%s)", bad[i].key, bad[i].value, why ? why : "accepted");
        free(edited);
    }
    free(json);
}

// ---------------------------------------------------------------- shards and loader

static void write_shard(const char *path, uint32_t vocab, const uint32_t *tokens, uint64_t n) {
    shard_writer *w = shard_writer_open(path, vocab, 0);
    CHECK(w && shard_writer_append(w, tokens, n) && shard_writer_close(w));
}

static void test_shards(void) {
    char p1[300], p2[300], spec[700];
    path_in_tmp(p1, sizeof p1, "a.bin");
    path_in_tmp(p2, sizeof p2, "b.bin");
    uint32_t tokens[1000];
    for (int i = 0; i < 1000; i++) tokens[i] = (uint32_t)i;
    write_shard(p1, 70000, tokens, 600);  // vocab > 65536: 4-byte tokens
    write_shard(p2, 70000, tokens + 600, 400);
    shard_header h;
    char why[256];
    uint32_t *back = shard_read_all(p1, &h, why, sizeof why);
    EXPECT(back && h.token_bytes == 4 && h.n_tokens == 600 && back[599] == 599, "4-byte shard round trip");
    free(back);
    char small[300];
    path_in_tmp(small, sizeof small, "small.bin");
    write_shard(small, 1000, tokens, 1000);
    back = shard_read_all(small, &h, why, sizeof why);
    EXPECT(back && h.token_bytes == 2 && back[999] == 999, "2-byte shard round trip");
    free(back);
    shard_writer *w = shard_writer_open(small, 10, 0);
    uint32_t too_big = 10;
    EXPECT(!shard_writer_append(w, &too_big, 1), "writer refuses a token >= vocab_size");
    shard_writer_abort(w);

    // Contiguous order across the two shards: micro-batch i = tokens [i·B·T, (i+1)·B·T + 1).
    snprintf(spec, sizeof spec, "%s,%s", p1, p2);
    int64_t B = 2, T = 7;
    dataloader *d = dataloader_open(spec, "test", B, T, false, 0, 0, 1);
    int32_t in[14], tg[14];
    int64_t per_epoch = dataloader_batches_per_epoch(d);
    EXPECT(per_epoch == 999 / 14, "batches per epoch");
    bool contiguous = true;
    for (int64_t i = 0; i < per_epoch; i++) {
        dataloader_next(d, in, tg);
        for (int64_t k = 0; k < B * T; k++)
            contiguous &= in[k] == (int32_t)(i * B * T + k) && tg[k] == (int32_t)(i * B * T + k + 1);
    }
    EXPECT(contiguous, "shuffle = 0 reads the concatenated shards contiguously (across the shard boundary)");
    dataloader_next(d, in, tg);
    EXPECT(in[0] == 0 && dataloader_position(d).epoch == 1, "wraps to a new epoch");
    dataloader_close(d);

    // Ranks take disjoint micro-batches: rank r gets global batches r, r + world, ...
    int world = 3;
    bool disjoint = true;
    for (int r = 0; r < world; r++) {
        d = dataloader_open(spec, "test", B, T, false, 0, r, world);
        for (int64_t j = 0; j < dataloader_batches_per_epoch(d); j++) {
            dataloader_next(d, in, tg);
            disjoint &= in[0] == (int32_t)((j * world + r) * B * T);
        }
        dataloader_close(d);
    }
    EXPECT(disjoint, "rank split");

    // DiLoCo replicas of different batch sizes (and one of two ranks) read disjoint rows: replica
    // i takes rows i, i + M, ..., each in micro-batches of its own B, a rank every N-th of them.
    {
        int M = 3;
        int64_t rows = 999 / T, Bs[3] = {1, 2, 3}, read = 0;
        int ranks_of[3] = {1, 2, 1};
        int *hits = xcalloc((size_t)rows, sizeof *hits);
        bool formula = true;
        for (int i = 0; i < M; i++)
            for (int r = 0; r < ranks_of[i]; r++) {
                int64_t Bi = Bs[i];
                int32_t in2[21], tg2[21];
                d = dataloader_open_split(spec, "test", Bi, T, false, 0, (data_split){i, M, r, ranks_of[i]});
                EXPECT(dataloader_batches_per_epoch(d) == rows / M / Bi / ranks_of[i], "replica %d rank %d: batches", i, r);
                for (int64_t k = 0; k < dataloader_batches_per_epoch(d); k++) {
                    dataloader_next(d, in2, tg2);
                    for (int64_t b = 0; b < Bi; b++) {
                        int64_t row = ((k * ranks_of[i] + r) * Bi + b) * M + i;
                        formula &= in2[b * T] == (int32_t)(row * T) && tg2[b * T + T - 1] == (int32_t)(row * T + T);
                        if (in2[b * T] % T == 0 && in2[b * T] / T < rows) hits[in2[b * T] / T]++;
                        read++;
                    }
                }
                dataloader_close(d);
            }
        int64_t twice = 0;
        for (int64_t w2 = 0; w2 < rows; w2++) twice += hits[w2] > 1;
        EXPECT(formula, "replica split: rank r of replica i reads rows ((index*N + r)*B + b)*M + i");
        EXPECT(twice == 0 && read > rows / 2, "replicas of batch 1, 2 and 3 read disjoint rows (%lld read twice, %lld read)",
               (long long)twice, (long long)read);
        free(hits);
    }

    // Shuffled: every window of T + 1 tokens once per epoch, a new order each epoch, and a
    // position that replays exactly.
    d = dataloader_open(spec, "test", B, T, true, 7, 0, 1);
    int64_t windows = 999 / T, batches = dataloader_batches_per_epoch(d);
    EXPECT(batches == windows / B, "shuffled batches per epoch");
    int *seen = xcalloc((size_t)windows, sizeof *seen);
    int32_t first_epoch_first = -1;
    bool windows_ok = true;
    for (int64_t i = 0; i < batches; i++) {
        dataloader_next(d, in, tg);
        if (i == 0) first_epoch_first = in[0];
        for (int64_t b = 0; b < B; b++) {
            int32_t start = in[b * T];
            windows_ok &= start % T == 0 && tg[b * T + T - 1] == start + (int32_t)T;
            if (start % T == 0 && start / T < windows) seen[start / T]++;
        }
    }
    int64_t covered = 0, repeated = 0;
    for (int64_t w2 = 0; w2 < windows; w2++) {
        covered += seen[w2] > 0;
        repeated += seen[w2] > 1;
    }
    EXPECT(windows_ok, "shuffled rows are whole windows starting at multiples of T");
    EXPECT(repeated == 0 && covered == batches * B, "each window at most once per epoch (%lld repeated)",
           (long long)repeated);
    data_position pos = dataloader_position(d);
    dataloader_next(d, in, tg);
    int32_t next_first = in[0];
    EXPECT(next_first != first_epoch_first || in[T] != 0, "epoch 1 starts differently from epoch 0");
    dataloader_seek(d, pos);
    dataloader_next(d, in, tg);
    EXPECT(in[0] == next_first, "seek replays the same micro-batch");
    free(seen);
    dataloader_close(d);

    // Header problems are refused with a reason.
    char bad[300];
    path_in_tmp(bad, sizeof bad, "bad.bin");
    write_shard(bad, 1000, tokens, 100);
    flip_byte_at(bad, 0);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "magic"), "wrong magic: %s", why);
    write_shard(bad, 1000, tokens, 100);
    truncate(bad, 64 + 150);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "truncated"), "truncated: %s", why);
    write_shard(bad, 1000, tokens, 100);
    flip_byte_at(bad, 16);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "header checksum"), "bad header: %s", why);
    write_shard(bad, 1000, tokens, 100);
    flip_byte_at(bad, SHARD_HEADER_BYTES + 199);   // the payload's last byte
    EXPECT(shard_read_header(bad, &h, why, sizeof why), "a flipped payload byte passes the header check");
    EXPECT(!shard_read_all(bad, &h, why, sizeof why) && strstr(why, "payload checksum mismatch (corrupt"),
           "payload: %s", why);
}

// A header field set to `value` with the header checksum made to match.
static void forge_header_u32(const char *path, int offset, uint32_t value) {
    int fd = open(path, O_RDWR);
    uint8_t h[SHARD_HEADER_BYTES];
    CHECK(fd >= 0 && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
    put_u32(h + offset, value);
    put_u64(h + 56, xxh64(h, 56, 0));
    CHECK(pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
    close(fd);
}

// Version 2 (chunk table) and version 1 shards of the same tokens: files of the documented
// size, the same tokens through shard_read_all and the loader (contiguous and shuffled, rows
// across shard and chunk boundaries, a shard of one token), the same fingerprint; the loader
// hashes about what it reads of version 2 and the whole of version 1; refusals.
static void test_shard_versions(void) {
    static const uint32_t chunk_sizes[] = {0, 256, 512};
    static const uint64_t sizes[3] = {700, 1, 1299};
    uint32_t tokens[2000];
    for (uint32_t vocab = 1000; vocab <= 70000; vocab += 69000) {
        for (int i = 0; i < 2000; i++) tokens[i] = (uint32_t)(i * 7919u % vocab);
        uint64_t fingerprint[3];
        int32_t shuffled[3][3 * 17];
        for (int c = 0; c < 3; c++) {
            char paths[3][300], spec[1000] = "";
            uint64_t at = 0;
            bool sizes_ok = true, round_trip = true;
            for (int k = 0; k < 3; k++) {
                char name[32];
                snprintf(name, sizeof name, "v%u_%u_%d.bin", vocab, chunk_sizes[c], k);
                path_in_tmp(paths[k], sizeof paths[k], name);
                shard_writer *w = shard_writer_open_chunked(paths[k], vocab, 0, chunk_sizes[c]);
                CHECK(w && shard_writer_append(w, tokens + at, sizes[k]) && shard_writer_close(w));
                shard_header h;
                char why[256];
                uint32_t *back = shard_read_all(paths[k], &h, why, sizeof why);
                struct stat st;
                stat(paths[k], &st);
                uint64_t payload = sizes[k] * (vocab > 65536 ? 4 : 2);
                uint64_t chunks = chunk_sizes[c] ? (payload + chunk_sizes[c] - 1) / chunk_sizes[c] : 0;
                sizes_ok &= h.version == (chunk_sizes[c] ? 2u : 1u) && h.chunk_bytes == chunk_sizes[c] &&
                            (uint64_t)st.st_size == 64 + payload + 8 * chunks && shard_file_bytes(&h) == (uint64_t)st.st_size;
                round_trip &= back && memcmp(back, tokens + at, sizes[k] * 4) == 0;
                free(back);
                at += sizes[k];
                snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%s", k ? "," : "", paths[k]);
            }
            EXPECT(sizes_ok && round_trip, "vocab %u, chunk %u: version, file size 64 + payload + 8 per chunk, round trip",
                   vocab, chunk_sizes[c]);
            int64_t B = 3, T = 17;
            dataloader *d = dataloader_open(spec, "test", B, T, false, 0, 0, 1);
            int32_t in[51], tg[51];
            bool contiguous = true;
            int64_t batches = dataloader_batches_per_epoch(d);
            for (int64_t i = 0; i < batches; i++) {
                dataloader_next(d, in, tg);
                for (int64_t k = 0; k < B * T; k++)
                    contiguous &= in[k] == (int32_t)tokens[i * B * T + k] && tg[k] == (int32_t)tokens[i * B * T + k + 1];
            }
            EXPECT(contiguous, "vocab %u, chunk %u: shuffle = 0 reads the tokens in order", vocab, chunk_sizes[c]);
            uint64_t width = vocab > 65536 ? 4 : 2, hashed = dataloader_bytes_hashed(d);
            // Version 2: each chunk of the corpus once (rows in order: the verified range serves
            // the next row until it passes its end), version 1: each shard once.
            EXPECT(hashed == 2000 * width, "vocab %u, chunk %u: read in order, every payload byte hashed once (%llu)",
                   vocab, chunk_sizes[c], (unsigned long long)hashed);
            dataloader_close(d);
            d = dataloader_open(spec, "test", B, T, true, 11, 0, 1);
            dataloader_seek(d, (data_position){0, 5});
            dataloader_next(d, in, tg);
            memcpy(shuffled[c], in, sizeof in);
            hashed = dataloader_bytes_hashed(d);
            uint64_t bound = chunk_sizes[c] ? (uint64_t)B * ((T + 1) * width + 2 * (chunk_sizes[c] - 1)) : 2000 * width;
            EXPECT(hashed > 0 && hashed <= bound, "vocab %u, chunk %u: one shuffled micro-batch hashes %llu bytes (at most %llu)",
                   vocab, chunk_sizes[c], (unsigned long long)hashed, (unsigned long long)bound);
            fingerprint[c] = dataloader_fingerprint(d);
            dataloader_close(d);
        }
        EXPECT(fingerprint[0] == fingerprint[1] && fingerprint[1] == fingerprint[2] &&
               !memcmp(shuffled[0], shuffled[1], sizeof shuffled[0]) && !memcmp(shuffled[1], shuffled[2], sizeof shuffled[0]),
               "vocab %u: versions 1 and 2 of the same tokens: one fingerprint, the same shuffled micro-batch", vocab);
    }

    // Refusals: another version, a chunk size that is not a power of two in range, a table cut
    // short; a flipped table entry (shard_read_all names the chunk).
    char bad[300], why[256];
    shard_header h;
    path_in_tmp(bad, sizeof bad, "v2bad.bin");
    for (int i = 0; i < 1000; i++) tokens[i] = (uint32_t)i;
    shard_writer *w = shard_writer_open_chunked(bad, 1000, 0, 256);
    CHECK(w && shard_writer_append(w, tokens, 1000) && shard_writer_close(w));   // 2000 bytes: 8 chunks
    forge_header_u32(bad, 8, 3);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "version 3 is not supported"), "version 3: %s", why);
    forge_header_u32(bad, 8, 2);
    EXPECT(shard_read_header(bad, &h, why, sizeof why), "version 2 again: %s", why);
    forge_header_u32(bad, 40, 384);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "bad chunk size 384"), "chunk 384: %s", why);
    forge_header_u32(bad, 40, 128);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "bad chunk size 128"), "chunk 128: %s", why);
    forge_header_u32(bad, 40, 512);   // the right size for another table: the file is too long
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "oversized shard") && strstr(why, "chunk table"),
           "a chunk size the table does not fit: %s", why);
    forge_header_u32(bad, 40, 256);
    flip_byte_at(bad, 64 + 2000 + 8 * 5 + 1);
    EXPECT(!shard_read_all(bad, &h, why, sizeof why) && strstr(why, "mismatch in chunk 5 (file bytes 1344..1599"),
           "a flipped table entry: %s", why);
    truncate(bad, 64 + 2000 + 8 * 7);
    EXPECT(!shard_read_header(bad, &h, why, sizeof why) && strstr(why, "truncated shard") && strstr(why, "chunk table"),
           "a table cut short: %s", why);
    EXPECT(shard_writer_open_chunked(bad, 1000, 0, 300) == NULL && errno == EINVAL, "the writer refuses chunk size 300");
}

static void add_bytes(void *ctx, uint64_t bytes) { *(uint64_t *)ctx += bytes; }

// The XXH64 of a whole file: whether shard_upgrade left it as it was.
static uint64_t file_xxh64(const char *path) {
    size_t bytes = 0;
    char *data = read_file_or_null(path, &bytes);
    uint64_t sum = data ? xxh64(data, bytes, 0) : 0;
    free(data);
    return sum;
}

// shard_upgrade (`train_gpt shards upgrade`): version 1 shards of either width, two of its 8 MiB
// pieces long, become version 2 of the same tokens and header fields (progress adds up to the
// payload); version 2 is left as it is; a uint32 shard of a small vocabulary (another program's)
// keeps its width, and with it its payload checksum; a token out of range in the second piece is
// named at its index in the shard, and a checksum mismatch beside it is said instead; a flipped
// byte that leaves every token in range is refused by the checksum; a refused shard is left byte
// for byte, without a .tmp.
static void test_shard_upgrade(void) {
    const uint64_t n = 5000000;   // 10 MB of uint16, 20 MB of uint32: past the first 8 MiB piece
    uint32_t *tokens = xmalloc(n * sizeof *tokens);
    char path[300], tmp_path[310], why[256];
    path_in_tmp(path, sizeof path, "upgrade.bin");
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);
    shard_header before, after, h;
    for (uint32_t vocab = 1000; vocab <= 70000; vocab += 69000) {
        for (uint64_t i = 0; i < n; i++) tokens[i] = (uint32_t)(i * 7919u % vocab);
        shard_writer *w = shard_writer_open_chunked(path, vocab, 7, 0);
        CHECK(w && shard_writer_append(w, tokens, n) && shard_writer_close(w));
        CHECK(shard_read_header(path, &before, why, sizeof why) && before.version == 1);
        uint64_t seen = 0;
        shard_upgrade_result r = shard_upgrade(path, &h, add_bytes, &seen, why, sizeof why);
        uint32_t *back = shard_read_all(path, &after, why, sizeof why);
        EXPECT(r == SHARD_UPGRADED && back && !memcmp(back, tokens, n * sizeof *tokens) && after.version == 2 &&
                   after.chunk_bytes == SHARD_CHUNK_BYTES && after.token_bytes == before.token_bytes &&
                   after.n_tokens == n && after.payload_xxh64 == before.payload_xxh64 && after.vocab_size == vocab &&
                   after.doc_token == 7 && seen == n * before.token_bytes && !file_exists(tmp_path),
               "vocab %u: upgraded (%d, %s): version %u, the same tokens and header fields, %llu bytes seen", vocab,
               (int)r, r == SHARD_UPGRADED ? "" : why, after.version, (unsigned long long)seen);
        free(back);
        uint64_t sum = file_xxh64(path);
        EXPECT(shard_upgrade(path, &h, NULL, NULL, why, sizeof why) == SHARD_CURRENT && h.version == 2 &&
                   file_xxh64(path) == sum,
               "vocab %u: version 2 already: left as it is", vocab);
    }

    // uint32 tokens under vocab_size 1000 (the writer would take uint16 for it).
    for (uint64_t i = 0; i < n; i++) tokens[i] = (uint32_t)(i % 1000);
    shard_writer *w = shard_writer_open_chunked(path, 70000, 7, 0);
    CHECK(w && shard_writer_append(w, tokens, n) && shard_writer_close(w));
    forge_header_u32(path, 32, 1000);
    CHECK(shard_read_header(path, &before, why, sizeof why) && before.token_bytes == 4 && before.vocab_size == 1000);
    shard_upgrade_result r = shard_upgrade(path, &h, NULL, NULL, why, sizeof why);
    uint32_t *back = shard_read_all(path, &after, why, sizeof why);
    EXPECT(r == SHARD_UPGRADED && back && !memcmp(back, tokens, n * sizeof *tokens) && after.version == 2 &&
               after.token_bytes == 4 && after.payload_xxh64 == before.payload_xxh64,
           "uint32 tokens of a 1000-token vocabulary: upgraded (%d, %s) at width %u, the same payload checksum", (int)r,
           r == SHARD_UPGRADED ? "" : why, after.token_bytes);
    free(back);

    // Token 4,500,000 (in the second piece) at 998, the others below 997, then vocab_size forged
    // to 998.
    for (uint64_t i = 0; i < n; i++) tokens[i] = (uint32_t)(i % 997);
    tokens[4500000] = 998;
    w = shard_writer_open_chunked(path, 1000, 7, 0);
    CHECK(w && shard_writer_append(w, tokens, n) && shard_writer_close(w));
    forge_header_u32(path, 32, 998);
    uint64_t sum = file_xxh64(path);
    r = shard_upgrade(path, &h, NULL, NULL, why, sizeof why);
    EXPECT(r == SHARD_REFUSED && strstr(why, "token 998 at index 4500000 is not below its vocab_size 998") &&
               file_xxh64(path) == sum && !file_exists(tmp_path),
           "a token out of range in the second piece: refused (%d: %s), the file as it was", (int)r, why);
    flip_byte_at(path, SHARD_HEADER_BYTES + 2 * 4400000);
    sum = file_xxh64(path);
    r = shard_upgrade(path, &h, NULL, NULL, why, sizeof why);
    EXPECT(r == SHARD_REFUSED && strstr(why, "payload checksum mismatch (corrupt data)") && file_xxh64(path) == sum &&
               !file_exists(tmp_path),
           "... and with a flipped byte before it: the checksum said (%d: %s), the file as it was", (int)r, why);

    // A flipped byte whose token stays in range (999 ^ 1 = 998 < 1000): only the checksum the
    // writer computed tells.
    for (uint64_t i = 0; i < n; i++) tokens[i] = (uint32_t)(i * 7919u % 1000);
    w = shard_writer_open_chunked(path, 1000, 7, 0);
    CHECK(w && shard_writer_append(w, tokens, n) && shard_writer_close(w));
    flip_byte_at(path, SHARD_HEADER_BYTES + 2 * 4400000);
    sum = file_xxh64(path);
    r = shard_upgrade(path, &h, NULL, NULL, why, sizeof why);
    EXPECT(r == SHARD_REFUSED && strstr(why, "payload checksum mismatch (corrupt data)") && file_xxh64(path) == sum &&
               !file_exists(tmp_path),
           "a flipped byte, every token in range: refused (%d: %s), the file as it was", (int)r, why);
    free(tokens);
}

// A shard rewritten while a loader reads it (dataloader.h): the loader reads two shards of 100
// tokens in order, B = 1, T = 10, until the second is open; then `change` rewrites the first,
// and the loader reads on into the next epoch, which opens the first again. Run in a child
// (the loader's errors are fatal): its exit status, its stderr in `err`, and whether the first
// micro-batch of epoch 1 was the first shard's tokens as they are now (*fresh).
typedef enum { SAME_TOKENS, OTHER_TOKENS, BYTE_IN_PLACE } shard_change;

static int read_across_change(const char *p1, const char *p2, const uint32_t *tokens, shard_change change, char *err,
                              size_t err_bytes) {
    char err_path[300], spec[700];
    path_in_tmp(err_path, sizeof err_path, "change.err");
    snprintf(spec, sizeof spec, "%s,%s", p1, p2);
    write_shard(p1, 1000, tokens, 100);
    write_shard(p2, 1000, tokens + 100, 100);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        dataloader *d = dataloader_open(spec, "train_data", 1, 10, false, 0, 0, 1);
        int32_t in[10], tg[10];
        for (int i = 0; i < 12; i++) dataloader_next(d, in, tg);   // into the second shard
        uint32_t other[100];
        for (int i = 0; i < 100; i++) other[i] = change == OTHER_TOKENS ? 999 - (uint32_t)i : tokens[i];
        if (change == BYTE_IN_PLACE) {
            // Written again in place, header kept (the same file, a later mtime).
            int f = open(p1, O_WRONLY);
            uint8_t b = 0x55;
            CHECK(f >= 0 && pwrite(f, &b, 1, SHARD_HEADER_BYTES + 3) == 1);
            struct timespec later[2] = {{0, UTIME_OMIT}, {time(NULL) + 5, 0}};
            CHECK(futimens(f, later) == 0);
            close(f);
        } else {
            write_shard(p1, 1000, other, 100);   // a new file under the same name (renamed into place)
        }
        while (dataloader_position(d).epoch == 0 || dataloader_position(d).index == 0) dataloader_next(d, in, tg);
        _exit(in[0] == (int32_t)other[0] ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t n = 0;
    char *text = read_file_or_null(err_path, &n);
    snprintf(err, err_bytes, "%s", text ? text : "");
    free(text);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A shard written again with the same tokens in another layout (chunk size `chunk`, 0: version
// 1) after the loader read every header at its start but before it first opened that shard
// (shard 2 of 2, shuffle 0): the loader must read it by its new layout. Returns the child's
// status (0: every row of shard 2 as written; 3: other tokens), its stderr in err.
static int read_relaid_before_open(uint32_t chunk, char *err, size_t err_bytes) {
    char p1[300], p2[300], err_path[300], spec[700];
    path_in_tmp(p1, sizeof p1, "r1.bin");
    path_in_tmp(p2, sizeof p2, "r2.bin");
    path_in_tmp(err_path, sizeof err_path, "relaid.err");
    enum { N = 5000, T = 100 };
    uint32_t *tokens = xmalloc(2 * N * sizeof *tokens);
    for (uint32_t k = 0; k < 2 * N; k++) tokens[k] = (k * 2654435761u) % 1000;
    const char *paths[2] = {p1, p2};
    for (int f = 0; f < 2; f++) {
        shard_writer *w = shard_writer_open_chunked(paths[f], 1000, 7, 256);
        CHECK(w && shard_writer_append(w, tokens + (size_t)f * N, N) && shard_writer_close(w));
    }
    snprintf(spec, sizeof spec, "%s,%s", p1, p2);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        dataloader *d = dataloader_open(spec, "train_data", 1, T, false, 0, 0, 1);
        int32_t in[T], tg[T];
        dataloader_next(d, in, tg);   // shard 1 only
        shard_writer *w = shard_writer_open_chunked(p2, 1000, 7, chunk);
        CHECK(w && shard_writer_append(w, tokens + N, N) && shard_writer_close(w));
        // Rows of T + 1 tokens, T apart: row r starts at token r·T of the stream.
        for (int r = 1; r < 2 * N / T - 1; r++) {
            dataloader_next(d, in, tg);
            for (int i = 0; i < T; i++)
                if (in[i] != (int32_t)tokens[(size_t)r * T + (size_t)i]) _exit(3);
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    free(tokens);
    size_t n = 0;
    char *text = read_file_or_null(err_path, &n);
    snprintf(err, err_bytes, "%s", text ? text : "");
    free(text);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_shard_changes(void) {
    char relaid_err[600];
    int relaid = read_relaid_before_open(512, relaid_err, sizeof relaid_err);
    EXPECT(relaid == 0, "a shard written again with another chunk size before its first open: read by its new "
           "layout (status %d: %s)", relaid, relaid_err);
    relaid = read_relaid_before_open(0, relaid_err, sizeof relaid_err);
    EXPECT(relaid == 0, "a shard written again as version 1 before its first open: read whole as version 1 (status "
           "%d: %s)", relaid, relaid_err);
    char p1[300], p2[300], p3[300], err[600];
    path_in_tmp(p1, sizeof p1, "c1.bin");
    path_in_tmp(p2, sizeof p2, "c2.bin");
    path_in_tmp(p3, sizeof p3, "c3.bin");
    uint32_t tokens[200];
    for (int i = 0; i < 200; i++) tokens[i] = (uint32_t)(i * 7 % 1000);
    int rc = read_across_change(p1, p2, tokens, SAME_TOKENS, err, sizeof err);
    EXPECT(rc == 0, "a shard copied again with the same tokens: read on (status %d: %s)", rc, err);
    rc = read_across_change(p1, p2, tokens, OTHER_TOKENS, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "changed while the run was reading it") && strstr(err, "c1.bin"),
           "a shard rewritten with other tokens: one line naming it (status %d: %s)", rc, err);
    rc = read_across_change(p1, p2, tokens, BYTE_IN_PLACE, err, sizeof err);
    EXPECT(rc == 1 && strstr(err, "written again while the run was reading it"),
           "a shard changed in place under its old header: its checksum is verified again (status %d: %s)", rc, err);

    // The fingerprint: what the shards hold, not their paths; another set of shards differs.
    char spec[1000];
    write_shard(p1, 1000, tokens, 100);
    write_shard(p2, 1000, tokens + 100, 100);
    write_shard(p3, 1000, tokens, 100);   // p1's tokens under another name
    snprintf(spec, sizeof spec, "%s,%s", p1, p2);
    dataloader *a = dataloader_open(spec, "a", 1, 10, false, 0, 0, 1);
    snprintf(spec, sizeof spec, "%s,%s", p3, p2);
    dataloader *b = dataloader_open(spec, "b", 1, 10, true, 5, 0, 1);
    snprintf(spec, sizeof spec, "%s,%s,%s", p1, p2, p3);
    dataloader *c = dataloader_open(spec, "c", 1, 10, false, 0, 0, 1);
    snprintf(spec, sizeof spec, "%s,%s", p2, p1);
    dataloader *e = dataloader_open(spec, "e", 1, 10, false, 0, 0, 1);
    EXPECT(dataloader_fingerprint(a) == dataloader_fingerprint(b), "the same tokens under other paths: one fingerprint");
    EXPECT(dataloader_fingerprint(a) != dataloader_fingerprint(c) && dataloader_fingerprint(a) != dataloader_fingerprint(e),
           "another shard, another order: other fingerprints");
    EXPECT(dataloader_shard_count(c) == 3, "shard count");
    dataloader_close(a);
    dataloader_close(b);
    dataloader_close(c);
    dataloader_close(e);
}

// ---------------------------------------------------------------- safetensors and checkpoints

static void test_safetensors(void) {
    char path[300], why[256];
    path_in_tmp(path, sizeof path, "t.safetensors");
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, 0.5f, 7};
    st_tensor_out out[] = {{"a", a, 2, {2, 3}}, {"b", b, 1, {3, 0}}};
    const char *k[] = {"k"}, *v[] = {"v \"quoted\""};
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t hash;
    EXPECT(safetensors_write(fd, out, 2, k, v, 1, &hash), "write");
    close(fd);
    st_file f;
    EXPECT(safetensors_open(path, &f, why, sizeof why), "open: %s", why);
    const st_entry *e = safetensors_find(&f, "a");
    float back[6] = {0};
    EXPECT(e && e->ndim == 2 && e->shape[1] == 3 && safetensors_read(&f, e, back) && back[5] == 6, "tensor a");
    EXPECT(f.data_start % 8 == 0, "data section is 8-byte aligned");
    const char *meta = safetensors_meta(&f, "k");
    EXPECT(meta && strcmp(meta, "v \"quoted\"") == 0, "metadata round trip");
    safetensors_close(&f);
    uint64_t check;
    size_t bytes;
    char *raw = read_file_or_null(path, &bytes);
    check = xxh64(raw, bytes, 0);
    free(raw);
    EXPECT(check == hash, "the hash returned by the writer is the file's");
    truncate(path, (off_t)bytes - 4);
    EXPECT(!safetensors_open(path, &f, why, sizeof why), "truncated file refused");
    fd = open(path, O_WRONLY | O_TRUNC);
    uint64_t huge = 1ULL << 62;
    write(fd, &huge, 8);
    close(fd);
    EXPECT(!safetensors_open(path, &f, why, sizeof why) && strstr(why, "header length"), "huge header length: %s",
           why);
    // Hand-written headers (8 bytes of length, the JSON, then the data): a name twice at
    // disjoint offsets, a shape whose product wraps int64 (2⁴⁰ · 2⁴⁰) without the check, and
    // __metadata__ twice (the second wrote past the first's arrays: ASan saw it in a review).
    const char *headers[3][2] = {
        {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"x\" :{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         "appears twice"},
        {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}",
         "implausibly large"},
        {"{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"c\":\"3\"},\"__metadata__\":{\"d\":\"4\",\"e\":\"5\",\"f\":\"6\",\"g\":\"7\"},"
         "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         "__metadata__ appears twice"}};
    for (int h = 0; h < 3; h++) {
        fd = open(path, O_WRONLY | O_TRUNC);
        uint64_t len = strlen(headers[h][0]);
        float data[2] = {1, 2};
        write(fd, &len, 8);
        write(fd, headers[h][0], len);
        write(fd, data, sizeof data);
        close(fd);
        EXPECT(!safetensors_open(path, &f, why, sizeof why) && strstr(why, headers[h][1]), "%s: %s", headers[h][1], why);
    }
    // A zero-size tensor at the offset where a non-empty one begins is back to back with it
    // (sorted by begin only, it came after it and was refused as a gap or overlap).
    const char *empty = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    fd = open(path, O_WRONLY | O_TRUNC);
    uint64_t len = strlen(empty);
    float data[2] = {1, 2};
    write(fd, &len, 8);
    write(fd, empty, len);
    write(fd, data, sizeof data);
    close(fd);
    EXPECT(safetensors_open(path, &f, why, sizeof why), "a zero-size tensor sharing an offset is accepted: %s", why);
    if (f.entries) safetensors_close(&f);
}

// A config that checkpoint_save can write (its strings set, the rest zero) for model m.
static train_config checkpoint_test_config(model_config m) {
    train_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model = m;
    cfg.device = "cpu";
    cfg.decay_shape = "linear";
    cfg.train_data = cfg.val_data = cfg.out_dir = cfg.resume = cfg.init_from = cfg.tokenizer = cfg.sample_prompt = "";
    cfg.diloco_transport = cfg.diloco_rendezvous = cfg.diloco_quant = cfg.diloco_secret_file = "";
    return cfg;
}

static void test_checkpoints(void) {
    model_config m = small_model(false, true);
    param_table t;
    param_table_build(&t, &m);
    size_t n = (size_t)t.numel;
    float *p = alloc_floats(n), *mm = alloc_floats(n), *vv = alloc_floats(n);
    param_init(&t, p, 5);
    for (size_t i = 0; i < n; i++) {
        mm[i] = (float)i * 1e-3f;
        vv[i] = (float)i * 1e-6f;
    }
    train_config cfg = checkpoint_test_config(m);
    model_buffers b = {.table = &t, .params = p, .exp_avg = mm, .exp_avg_sq = vv};
    char out_dir[300];
    path_in_tmp(out_dir, sizeof out_dir, "ckpt");
    train_state s = {.step = 7, .adam_step = 6, .data = {1, 2}, .bad_steps = 1, .tokens_seen = 99, .restart_step = 5};
    EXPECT(checkpoint_save(out_dir, &b, &s, &cfg), "save step 7");
    s.step = 9;
    EXPECT(checkpoint_save(out_dir, &b, &s, &cfg), "save step 9");
    float *p2 = alloc_floats(n), *m2 = alloc_floats(n), *v2 = alloc_floats(n);
    model_buffers b2 = {.table = &t, .params = p2, .exp_avg = m2, .exp_avg_sq = v2};
    train_state s2;
    char *from = checkpoint_load_latest(out_dir, &b2, &s2);
    EXPECT(from && strstr(from, "step_00000009"), "newest checkpoint chosen");
    free(from);
    EXPECT(memcmp(p, p2, n * 4) == 0 && memcmp(mm, m2, n * 4) == 0 && memcmp(vv, v2, n * 4) == 0,
           "weights and moments round trip bit for bit");
    EXPECT(s2.step == 9 && s2.adam_step == 6 && s2.data.epoch == 1 && s2.data.index == 2 && s2.bad_steps == 1 &&
               s2.tokens_seen == 99 && s2.restart_step == 5,
           "state round trip (DiLoCo's outer_restart_step too)");
    // A flipped byte anywhere in the newest makes resume fall back to the older one.
    char victim[400], why[512];
    snprintf(victim, sizeof victim, "%s/step_00000009/optimizer.safetensors", out_dir);
    flip_byte_at(victim, -3);
    char dir9[400];
    snprintf(dir9, sizeof dir9, "%s/step_00000009", out_dir);
    EXPECT(!checkpoint_load(dir9, &b2, &s2, why, sizeof why) && strstr(why, "checksum"), "flip detected: %s", why);
    from = checkpoint_load_latest(out_dir, &b2, &s2);
    EXPECT(from && strstr(from, "step_00000007") && s2.step == 7, "falls back to the previous checkpoint");
    free(from);
    EXPECT(dir_exists(dir9), "the corrupt checkpoint is left in place");
    // A different architecture is refused by name.
    model_config other = m;
    other.d_ff = 48;
    param_table t3;
    param_table_build(&t3, &other);
    float *p3 = alloc_floats((size_t)t3.numel), *m3 = alloc_floats((size_t)t3.numel), *v3 = alloc_floats((size_t)t3.numel);
    model_buffers b3 = {.table = &t3, .params = p3, .exp_avg = m3, .exp_avg_sq = v3};
    char dir7[320];
    snprintf(dir7, sizeof dir7, "%s/step_00000007", out_dir);
    EXPECT(!checkpoint_load(dir7, &b3, &s2, why, sizeof why) && strstr(why, "d_ff"), "architecture mismatch: %s", why);
    // Weights only (init_from).
    char weights[512];
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir7);
    memset(p2, 0, n * 4);
    EXPECT(load_weights(weights, &t, p2, why, sizeof why) && memcmp(p, p2, n * 4) == 0, "load_weights");
    // Pruning keeps the newest.
    s.step = 11;
    checkpoint_save(out_dir, &b, &s, &cfg);
    checkpoint_prune(out_dir, 2, 11);
    EXPECT(checkpoint_count(out_dir, NULL) == 2 && !dir_exists(dir7), "prune to 2 removes the oldest");
    // A newer checkpoint (one a resume skipped as corrupt) is neither counted nor removed.
    char dir20[320], dir11[320];
    snprintf(dir20, sizeof dir20, "%s/step_00000020", out_dir);
    snprintf(dir11, sizeof dir11, "%s/step_00000011", out_dir);
    EXPECT(mkdir(dir20, 0755) == 0, "mkdir %s", dir20);
    checkpoint_prune(out_dir, 1, 11);
    EXPECT(checkpoint_count(out_dir, NULL) == 2 && dir_exists(dir11) && dir_exists(dir20),
           "prune to 1 at step 11 keeps step 11 and the newer step 20");
    // A NaN never reaches a checkpoint.
    p[3] = NAN;
    s.step = 12;
    EXPECT(!checkpoint_save(out_dir, &b, &s, &cfg), "refuses to save NaN weights");
    free(p);
    free(mm);
    free(vv);
    free(p2);
    free(m2);
    free(v2);
    free(p3);
    free(m3);
    free(v3);
    param_table_free(&t);
    param_table_free(&t3);
}

// DIR/FILE (a checkpoint's tensor file) with one more tensor "extra", and checksums.xxh64 made
// to match: what a checkpoint with a tensor the config does not use looks like.
static void add_extra_tensor(const char *dir, const char *file) {
    char path[600], why[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    st_file f;
    CHECK(safetensors_open(path, &f, why, sizeof why));
    st_tensor_out *out = calloc((size_t)f.count + 1, sizeof *out);
    float **data = calloc((size_t)f.count, sizeof *data);
    for (int i = 0; i < f.count; i++) {
        const st_entry *e = &f.entries[i];
        data[i] = alloc_floats((size_t)e->numel);
        CHECK(safetensors_read(&f, e, data[i]));
        out[i] = (st_tensor_out){e->name, data[i], e->ndim, {e->shape[0], e->ndim > 1 ? e->shape[1] : 0}};
    }
    float one = 1;
    out[f.count] = (st_tensor_out){"extra", &one, 1, {1, 0}};
    int fd = open(path, O_WRONLY | O_TRUNC);
    uint64_t hash;
    CHECK(safetensors_write(fd, out, f.count + 1, (const char *const *)f.meta_keys, (const char *const *)f.meta_values,
                            f.meta_count, &hash));
    close(fd);
    for (int i = 0; i < f.count; i++) free(data[i]);
    free(data);
    free(out);
    safetensors_close(&f);
    char sums_path[600], line[300];
    snprintf(sums_path, sizeof sums_path, "%s/checksums.xxh64", dir);
    size_t bytes;
    char *sums = read_file_or_null(sums_path, &bytes);
    CHECK(sums);
    FILE *w = fopen(sums_path, "w");
    for (char *l = strtok(sums, "\n"); l; l = strtok(NULL, "\n")) {
        snprintf(line, sizeof line, "%s", l);
        if (strcmp(line + 18, file) == 0) snprintf(line, sizeof line, "%016llx  %s", (unsigned long long)hash, file);
        fprintf(w, "%s\n", line);
    }
    fclose(w);
    free(sums);
}

// What a load refuses beyond corruption: a tensor the config does not use (optimizer.safetensors
// and outer.safetensors took one without a word), a shape error's wording for 1-D tensors, a
// checkpoint under another step's name; and which directories are checkpoints at all.
static void test_checkpoint_refusals(void) {
    model_config m = small_model(false, true);
    param_table t;
    param_table_build(&t, &m);
    size_t n = (size_t)t.numel;
    float *p = alloc_floats(n), *mm = alloc_floats(n), *vv = alloc_floats(n), *th = alloc_floats(n),
          *mo = alloc_floats(n);
    param_init(&t, p, 5);
    memcpy(th, p, n * 4);
    train_config cfg = checkpoint_test_config(m);
    model_buffers b = {.table = &t, .params = p, .exp_avg = mm, .exp_avg_sq = vv, .outer_theta = th, .outer_momentum = mo};
    char out_dir[300], dir[400], why[512];
    path_in_tmp(out_dir, sizeof out_dir, "refusals");
    train_state s = {.step = 4, .adam_step = 4};
    const char *files[] = {"optimizer.safetensors", "outer.safetensors"};
    for (int i = 0; i < 2; i++) {
        s.step = 4 + i;
        EXPECT(checkpoint_save(out_dir, &b, &s, &cfg), "save step %lld", (long long)s.step);
        snprintf(dir, sizeof dir, "%s/step_%08lld", out_dir, (long long)s.step);
        EXPECT(checkpoint_load(dir, &b, &s, why, sizeof why), "the saved checkpoint loads: %s", why);
        add_extra_tensor(dir, files[i]);
        snprintf(why, sizeof why, "(loaded)");
        EXPECT(!checkpoint_load(dir, &b, &s, why, sizeof why) && strstr(why, files[i]) && strstr(why, "tensors"),
               "%s with an extra tensor is refused: %s", files[i], why);
    }
    // The shape error names a 1-D shape as it is ([64,1] against [640] once: a stray 0).
    const param_info *flat = NULL;
    for (int i = 0; i < t.count && !flat; i++)
        if (t.params[i].ndim == 1) flat = &t.params[i];
    CHECK(flat);
    st_tensor_out *out = calloc((size_t)t.count, sizeof *out);
    for (int i = 0; i < t.count; i++) {
        const param_info *q = &t.params[i];
        out[i] = (st_tensor_out){q->name, p + q->offset, q->ndim, {q->shape[0], q->shape[1]}};
        if (q == flat) out[i] = (st_tensor_out){q->name, p + q->offset, 2, {q->shape[0], 1}};
    }
    char weights[400], want[64];
    path_in_tmp(weights, sizeof weights, "reshaped.safetensors");
    int fd = open(weights, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t hash;
    CHECK(safetensors_write(fd, out, t.count, NULL, NULL, 0, &hash));
    close(fd);
    free(out);
    snprintf(want, sizeof want, "has shape [%lld,1], the config needs [%lld]", (long long)flat->shape[0],
             (long long)flat->shape[0]);
    EXPECT(!load_weights(weights, &t, mm, why, sizeof why) && strstr(why, want), "a 1-D shape in the error: %s", why);
    // Only step_%08lld names are checkpoints: step_0005 is step 5 spelled otherwise, and ckpt_keep
    // 1 once removed the step_00000005 just written for it.
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "mkdir %s/step_0005 %s/step_00000006x", out_dir, out_dir);
    CHECK(system(cmd) == 0);
    EXPECT(checkpoint_count(out_dir, NULL) == 2 && checkpoint_newest_step(out_dir, NULL) == 5,
           "other spellings are not counted (%d checkpoints, newest %lld)", checkpoint_count(out_dir, NULL),
           (long long)checkpoint_newest_step(out_dir, NULL));
    checkpoint_prune(out_dir, 1, 5);
    snprintf(dir, sizeof dir, "%s/step_00000005", out_dir);
    bool kept = dir_exists(dir);
    snprintf(dir, sizeof dir, "%s/step_0005", out_dir);
    EXPECT(kept && dir_exists(dir) && checkpoint_count(out_dir, NULL) == 1,
           "prune to 1 keeps step_00000005 and leaves step_0005 alone");
    // A copy under another step's name is no checkpoint of that step.
    snprintf(cmd, sizeof cmd, "cp -r %s/step_00000005 %s/step_00000016", out_dir, out_dir);
    CHECK(system(cmd) == 0);
    snprintf(dir, sizeof dir, "%s/step_00000016", out_dir);
    b.outer_theta = b.outer_momentum = NULL;
    EXPECT(!checkpoint_load(dir, &b, &s, why, sizeof why) && strstr(why, "its name says step 16"),
           "step 5 named step_00000016 is refused: %s", why);
    free(p);
    free(mm);
    free(vv);
    free(th);
    free(mo);
    param_table_free(&t);
}

// The spike guard's limits: z·std in log space above the window's geometric mean, never less
// than the floors (a flat window: a plateau). The markov DiLoCo run that stopped: a window of
// gradient norms near 0.63 and a step at 1.2 when the model left the plateau.
static void test_spike_limits(void) {
    spike_window *w = calloc(1, sizeof *w);
    for (int i = 0; i < 20; i++) spike_push(w, 20, 4.7, 0.63 + 0.001 * (i % 3));
    step_limits off = spike_limits(w, 6.0, 10, 50);
    EXPECT(isinf(off.max_loss) && isinf(off.max_grad_norm), "during the lr warm-up the guard does not act");
    step_limits l = spike_limits(w, 6.0, 100, 50);
    double geo = exp((log(0.63) * 7 + log(0.631) * 7 + log(0.632) * 6) / 20);
    EXPECT(fabs(l.max_grad_norm / geo - SPIKE_MIN_GRAD_NORM_RATIO) < 1e-9 && fabs(l.max_loss / 4.7 - SPIKE_MIN_LOSS_RATIO) < 1e-9,
           "a flat window: limits at the floors (norm %.6f = %.6f x its geometric mean, loss %.6f)", l.max_grad_norm,
           l.max_grad_norm / geo, l.max_loss);
    EXPECT(!spike_exceeds(&l, 4.69, 1.2), "leaving a plateau (norm 1.2 against 0.63, loss as before) is no spike");
    EXPECT(spike_exceeds(&l, 4.69, 0.63 * 30), "a norm 30x the window's is a spike");
    EXPECT(spike_exceeds(&l, 4.7 * 1.2, 0.63), "a loss 20 %% above the window's is a spike");
    EXPECT(spike_shift_like(&l, 4.69, 0.63 * 12), "a norm 12x the window's, the loss as before: a possible shift");
    EXPECT(spike_shift_like(&l, 4.7 * 1.6, 0.63), "a loss 1.6x the window's, the norm as before: a possible shift");
    EXPECT(spike_shift_like(&l, 4.7 * 1.2, 0.63 * 12), "... both at once too");
    EXPECT(!spike_shift_like(&l, 4.69, 0.63 * 4 * SPIKE_SHIFT_MAX_RATIO * 1.01), "... not a norm beyond 25x its limit");
    EXPECT(!spike_shift_like(&l, 4.7 * 1.1 * SPIKE_SHIFT_MAX_LOSS_RATIO * 1.01, 0.63), "... nor a loss beyond 2x its limit");
    EXPECT(!spike_shift_like(&l, 4.69, 1.2), "... nor below the limits (no spike at all)");
    step_limits wide = spike_shift_limits(&l, false), wider = spike_shift_limits(&l, true);
    EXPECT(wide.max_loss == l.max_loss && wide.max_grad_norm == l.max_grad_norm * SPIKE_SHIFT_MAX_RATIO &&
               wider.max_loss == l.max_loss * SPIKE_SHIFT_MAX_LOSS_RATIO,
           "shift limits: the norm's widened, the loss's only after a rollback");
    // A window with spread: z·std wins over the floor. Norms alternating 0.1 and 1.0: log-std
    // ln(10)/2, so the limit is sqrt(0.1) · 10^3 = 316.2 (z 6), far above 4 x the mean.
    spike_window *v = calloc(1, sizeof *v);
    for (int i = 0; i < 20; i++) spike_push(v, 20, 3.0, i % 2 ? 1.0 : 0.1);
    step_limits s = spike_limits(v, 6.0, 100, 50);
    EXPECT(fabs(s.max_grad_norm - sqrt(0.1) * 1000.0) < 1e-6, "a spread window: limit = exp(mean + z std) = %.4f",
           s.max_grad_norm);
    free(w);
    free(v);
}

// ---------------------------------------------------------------- config

static void load_config(train_config *cfg, const char *const *extra, int n_extra) {
    const char *base[] = {"--vocab_size", "64", "--n_layer", "2", "--d_model", "64", "--n_head", "4", "--d_ff", "128",
                          "--seq_len", "32", "--batch_size", "4", "--max_steps", "100", "--lr", "1e-3",
                          "--train_data", "x.bin"};
    int n_base = (int)(sizeof base / sizeof base[0]);
    char *argv[64];
    CHECK(n_base + n_extra <= 64);
    for (int i = 0; i < n_base; i++) argv[i] = (char *)base[i];
    for (int i = 0; i < n_extra; i++) argv[n_base + i] = (char *)extra[i];
    config_load(cfg, NULL, n_base + n_extra, argv);
}

// ---------------------------------------------------------------- the cgroup's memory limit

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    CHECK(make_dirs(dir));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

// SLURM puts a job step in a cgroup below the job's, and --mem on the job's: the root says
// "max". The plan read the root only (memory.max, memory/memory.limit_in_bytes), so a node's
// RAM was the budget of a job held to a fraction of it.
static void test_cgroup_limit(void) {
    char root[300], proc[300], dir[512];
    // v2: the root unlimited, the job at 8 GiB, its step at 12 GiB ("max" above the job's user
    // slice): the lowest on the way up, the job's.
    path_in_tmp(root, sizeof root, "cg2");
    path_in_tmp(proc, sizeof proc, "cg2_self");
    write_text(root, "memory.max", "max\n");
    snprintf(dir, sizeof dir, "%s/system.slice", root);
    write_text(dir, "memory.max", "max\n");
    snprintf(dir, sizeof dir, "%s/system.slice/job_42", root);
    write_text(dir, "memory.max", "8589934592\n");
    snprintf(dir, sizeof dir, "%s/system.slice/job_42/step_0", root);
    write_text(dir, "memory.max", "12884901888\n");
    snprintf(dir, sizeof dir, "%s/system.slice/job_42/step_0/task_0", root);
    write_text(dir, "memory.max", "max\n");
    write_text(tmp_root, "cg2_self", "0::/system.slice/job_42/step_0/task_0\n");
    EXPECT(plan_cgroup_limit_bytes(proc, root) == 8589934592LL, "v2, 8 GiB on the job's cgroup: got %lld",
           (long long)plan_cgroup_limit_bytes(proc, root));
    // The same tree, every level "max": no limit; the process in the root ("0::/"): the root's.
    write_text(tmp_root, "cg2_self", "0::/system.slice\n");
    EXPECT(plan_cgroup_limit_bytes(proc, root) == -1, "v2, max all the way up: none, got %lld",
           (long long)plan_cgroup_limit_bytes(proc, root));
    write_text(root, "memory.max", "4294967296\n");
    write_text(tmp_root, "cg2_self", "0::/\n");
    EXPECT(plan_cgroup_limit_bytes(proc, root) == 4294967296LL, "v2, the process in the root: the root's, got %lld",
           (long long)plan_cgroup_limit_bytes(proc, root));
    // v1: the memory hierarchy's line (here shared with cpu), its limit two levels up, v1's
    // "no limit" (LLONG_MAX rounded to a page) elsewhere; other hierarchies' lines ignored.
    path_in_tmp(root, sizeof root, "cg1");
    path_in_tmp(proc, sizeof proc, "cg1_self");
    snprintf(dir, sizeof dir, "%s/memory", root);
    write_text(dir, "memory.limit_in_bytes", "9223372036854771712\n");
    snprintf(dir, sizeof dir, "%s/memory/slurm/uid_1000/job_7", root);
    write_text(dir, "memory.limit_in_bytes", "2147483648\n");
    snprintf(dir, sizeof dir, "%s/memory/slurm/uid_1000/job_7/step_batch/task_0", root);
    write_text(dir, "memory.limit_in_bytes", "9223372036854771712\n");
    snprintf(dir, sizeof dir, "%s/cpu", root);
    write_text(dir, "memory.limit_in_bytes", "1048576\n");  // not the memory hierarchy: not read
    write_text(tmp_root, "cg1_self",
               "12:pids:/slurm/uid_1000/job_7\n4:cpu,memory:/slurm/uid_1000/job_7/step_batch/task_0\n"
               "1:name=systemd:/user.slice\n0::/\n");
    EXPECT(plan_cgroup_limit_bytes(proc, root) == 2147483648LL, "v1, 2 GiB on the job's cgroup: got %lld",
           (long long)plan_cgroup_limit_bytes(proc, root));
    write_text(tmp_root, "cg1_self", "4:memory:/slurm\n");
    EXPECT(plan_cgroup_limit_bytes(proc, root) == -1, "v1, no limit up to the root: none, got %lld",
           (long long)plan_cgroup_limit_bytes(proc, root));
    // A cgroup the mounts do not show (a container's view): the levels that exist, here the root.
    write_text(tmp_root, "cg1_self", "4:memory:/docker/0123abcd\n");
    snprintf(dir, sizeof dir, "%s/memory", root);
    write_text(dir, "memory.limit_in_bytes", "3221225472\n");
    EXPECT(plan_cgroup_limit_bytes(proc, root) == 3221225472LL, "v1, a path not mounted: the root's, got %lld",
           (long long)plan_cgroup_limit_bytes(proc, root));
}

// Products of keys each within its range. diloco_fragments · (diloco_overlap_steps + 1)
// overflowed int64 (undefined; in practice it wrapped negative and diloco_decay_inner_steps
// became H / 4) for an overlap near its bound, before DiLoCo's rules that refuse it.
static void test_config_products(void) {
    train_config cfg;
    const char *overlap[] = {"--diloco_fragments", "2", "--diloco_overlap_steps", "9000000000000000000",
                             "--diloco_plain_in_decay", "1"};
    load_config(&cfg, overlap, 6);
    EXPECT(cfg.diloco_decay_inner_steps == 0, "an overlap of 9e18 steps: no shorter decay interval (got %lld)",
           (long long)cfg.diloco_decay_inner_steps);
    config_free(&cfg);
    const char *streaming[] = {"--diloco_fragments", "2", "--diloco_overlap_steps", "20", "--diloco_plain_in_decay", "1"};
    load_config(&cfg, streaming, 6);
    EXPECT(cfg.diloco_decay_inner_steps == 125, "H 500, P 2, overlap 20: the decay interval is H / 4 = %lld",
           (long long)cfg.diloco_decay_inner_steps);
    config_free(&cfg);
}

// srun without --ntasks-per-node sets no SLURM_NTASKS_PER_NODE, only the per-node lists
// ("4(x2),3"): launch_detect took every rank of the job for this node's, and the CPU budget
// was divided by all of them (node_ranks now; local_size, fsdp_size = 0's group, unchanged).
static void test_slurm_tasks_per_node(void) {
    EXPECT(slurm_tasks_on_node("4(x2),3", 0) == 4 && slurm_tasks_on_node("4(x2),3", 1) == 4 &&
               slurm_tasks_on_node("4(x2),3", 2) == 3 && slurm_tasks_on_node("4(x2),3", 3) == 0,
           "4(x2),3: 4, 4, 3, then none");
    EXPECT(slurm_tasks_on_node("2", 0) == 2 && slurm_tasks_on_node("1,2,3", 2) == 3, "plain lists");
    EXPECT(slurm_tasks_on_node("4(2)", 0) == 0 && slurm_tasks_on_node("x", 0) == 0 && slurm_tasks_on_node("", 0) == 0,
           "malformed lists say nothing");
    const char *keep[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) unsetenv(keep[i]);
    setenv("SLURM_PROCID", "9", 1);
    setenv("SLURM_NTASKS", "11", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2),3", 1);
    setenv("SLURM_STEP_NODEID", "2", 1);
    launch_info l = launch_detect();
    EXPECT(strcmp(l.launcher, "slurm") == 0 && l.size == 11 && l.node_ranks == 3,
           "srun, 11 tasks as 4(x2),3, on node 2: 3 ranks on this node, got %d of %d (%s)", l.node_ranks, l.size,
           l.launcher);
    EXPECT(l.local_size == 11, "fsdp_size = 0's group stays the job's ranks where SLURM does not say: %d", l.local_size);
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    unsetenv("SLURM_STEP_NODEID");
    setenv("SLURM_TASKS_PER_NODE", "4(x2),3", 1);
    setenv("SLURM_NODEID", "1", 1);
    l = launch_detect();
    EXPECT(l.node_ranks == 4, "the job's list on node 1: 4 ranks, got %d", l.node_ranks);
    setenv("SLURM_NTASKS_PER_NODE", "5", 1);
    l = launch_detect();
    EXPECT(l.local_size == 5 && l.node_ranks == 5, "SLURM_NTASKS_PER_NODE first: 5, got %d, %d", l.local_size,
           l.node_ranks);
    EXPECT(l.node_ranks_known, "SLURM_NTASKS_PER_NODE: the node's ranks are known");
    const char *set[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_NODEID",
                         "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) unsetenv(set[i]);
    // A launcher that gives the rank alone (PMI_RANK, PMI_SIZE: Cray PALS): node_ranks is the job's
    // size, a guess, not the node's (the GPU check took 16 ranks of 4 nodes for one node's).
    setenv("PMI_RANK", "5", 1);
    setenv("PMI_SIZE", "16", 1);
    l = launch_detect();
    EXPECT(l.size == 16 && !l.node_ranks_known, "PMI_RANK alone: the node's ranks are not known (node_ranks %d)",
           l.node_ranks);
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
}

int main(void) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/train_gpt_units_%d", (int)getpid());
    CHECK(make_dirs(tmp_root));
    test_xxh64();
    test_json();
    test_schedule();
    test_param_table();
    test_shards();
    test_shard_versions();
    test_shard_changes();
    test_shard_upgrade();
    test_safetensors();
    test_checkpoints();
    test_checkpoint_refusals();
    test_spike_limits();
    test_config_products();
    test_cgroup_limit();
    test_slurm_tasks_per_node();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd) != 0) warn("could not remove %s", tmp_root);
    return check_summary("test_units");
}
