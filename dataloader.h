// dataloader.h — token shards (the on-disk format) and the loader that turns a set of
// shards into micro-batches.
//
// SHARD FORMAT, version 2 (all integers little-endian; documented in docs/formats.md):
//
//   offset  size  field
//        0     8  magic "TGPTSHRD"
//        8     4  version = 2 (1: the older format, below)
//       12     4  token_bytes: 2 (uint16 tokens, vocab_size <= 65536) or 4 (uint32)
//       16     8  n_tokens
//       24     8  payload_xxh64: XXH64 (seed 0) of the n_tokens * token_bytes payload bytes
//       32     4  vocab_size of the tokenizer that wrote it (every token is below it)
//       36     4  doc_token: the token placed before each document, 0xFFFFFFFF if none
//       40     4  chunk_bytes: a power of two from 256 to 16 MiB (the writer's default: 16 KiB)
//       44    12  reserved, zero
//       56     8  header_xxh64: XXH64 (seed 0) of bytes 0..55
//       64     P  payload: n_tokens tokens of token_bytes each (P = n_tokens * token_bytes)
//   64 + P  8·K  the chunk table: K = ceil(P / chunk_bytes) XXH64s, entry k the XXH64 with
//                seed k of payload bytes [k·chunk_bytes, min((k+1)·chunk_bytes, P))
//
// The file is exactly 64 + P + 8·K bytes; anything else is a truncated or padded shard and
// is refused. A shard is written to NAME.tmp, fsynced and renamed, so a reader never sees
// half of one. Version 1 (written until 2026-12) has no chunk table (the file is 64 + P
// bytes, bytes 40..55 reserved): only the whole payload's checksum, so a reader must hash the
// whole shard before it can trust any of it. Both are read; the writer writes version 2 (a
// chunk_bytes of 0 asks it for version 1, for tests of the old format).
//
// UPGRADING. shard_upgrade (`train_gpt shards upgrade`) writes a version 1 shard again as version
// 2 in place, through the writer, with the same header fields and payload bytes (below).
//
// THE LOADER. The train shards, in the order given (a glob is sorted), are one stream of
// tokens. A micro-batch holds batch_size rows of seq_len + 1 tokens (inputs, and targets
// shifted by one).
//   shuffle = 0: micro-batch i of the whole run is the contiguous window of tokens
//     [i·B·T, (i+1)·B·T + 1) of the stream (as llm.c does); rows are consecutive
//     T-token slices of it. The stream wraps at its end (a new epoch).
//   shuffle = 1: the stream is cut into windows of T + 1 tokens starting every T tokens;
//     each epoch visits all windows once in an order given by a keyed permutation of
//     (seed, epoch), and a micro-batch is B consecutive windows of that order.
// With several processes the data is split in two levels (data_split), so processes read
// disjoint data:
//   DiLoCo replica i of M takes rows (windows) i, i + M, i + 2M, … of that sequence — a split
//     by rows, not micro-batches, so replicas with different batch_size still read disjoint
//     rows (their seq_len, shuffle and seed must agree: the same windows in the same order);
//   rank r of a replica's N processes (FSDP) takes micro-batches r, r + N, … of its replica's
//     rows (micro-batch k of the replica holds its rows k·B … k·B + B − 1).
// So rank r of replica i reads, as its micro-batch `index`, the rows
//     ((index·N + r)·B + b)·M + i,  b = 0 … B − 1,
// which with M = 1 is micro-batch index·N + r of the sequence. The position (epoch,
// micro-batch index) is all a checkpoint needs to resume the stream exactly.
#ifndef TRAIN_GPT_DATALOADER_H
#define TRAIN_GPT_DATALOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmc/state.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_MAGIC "TGPTSHRD"
#define SHARD_VERSION 2
#define SHARD_HEADER_BYTES 64
#define SHARD_NO_DOC_TOKEN 0xFFFFFFFFu
#define SHARD_CHUNK_BYTES (16u << 10)     // the writer's chunk: a 4-16 KB row reads 1-3 chunks
#define SHARD_MIN_CHUNK_BYTES 256u
#define SHARD_MAX_CHUNK_BYTES (16u << 20)

typedef struct {
    uint32_t version;
    uint32_t token_bytes;
    uint64_t n_tokens;
    uint64_t payload_xxh64;
    uint32_t vocab_size;
    uint32_t doc_token;
    uint32_t chunk_bytes;   // version 2; 0 in version 1
} shard_header;

// The file's size for this header: header, payload and (version 2) chunk table. Only for a
// header whose n_tokens · token_bytes does not wrap (shard_read_header checks that first).
uint64_t shard_file_bytes(const shard_header *h);

// ---- writing shards ----
// Streams tokens into PATH.tmp and, on close, fixes up the header, fsyncs and renames
// to PATH. token_bytes is 2 when vocab_size <= 65536, else 4.
typedef struct shard_writer shard_writer;
// NULL (errno set) if PATH.tmp cannot be created. Version 2, chunks of SHARD_CHUNK_BYTES.
shard_writer *shard_writer_open(const char *path, uint32_t vocab_size, uint32_t doc_token);
// The same with another chunk size (a power of two from SHARD_MIN_CHUNK_BYTES to
// SHARD_MAX_CHUNK_BYTES, else errno = EINVAL), or 0: a version 1 shard (tests of old shards).
// A doc_token at or above vocab_size (other than SHARD_NO_DOC_TOKEN) is EINVAL too.
shard_writer *shard_writer_open_chunked(const char *path, uint32_t vocab_size, uint32_t doc_token,
                                        uint32_t chunk_bytes);
// false on an I/O error or a token >= vocab_size (errno = EINVAL).
bool shard_writer_append(shard_writer *w, const uint32_t *tokens, uint64_t count);
uint64_t shard_writer_tokens(const shard_writer *w);
// Finishes and renames; false on failure (PATH.tmp is removed). Frees w either way.
bool shard_writer_close(shard_writer *w);
// Drops a shard being written (removes PATH.tmp). Frees w.
void shard_writer_abort(shard_writer *w);

// ---- reading shards ----
// Reads and checks a shard's header against its file size. On failure returns false and
// writes a one-line reason (without the path) into why.
bool shard_read_header(const char *path, shard_header *h, char *why, size_t why_bytes);
// Reads a whole shard, checks its checksums (the payload's and, version 2, every chunk's) and
// every token < vocab_size. Returns the tokens as uint32 (caller frees) or NULL with a reason
// in why.
uint32_t *shard_read_all(const char *path, shard_header *h, char *why, size_t why_bytes);

// ---- upgrading shards (`train_gpt shards upgrade`) ----
// Writes the version 1 shard at path again as version 2 (chunks of SHARD_CHUNK_BYTES), in
// place: through the writer to PATH.tmp, fsynced, renamed over PATH (a symbolic link's target,
// the link left as it is), with the old file's permission bits. The payload is streamed in
// 8 MiB pieces (memory: those and the writer's chunk table, 8 bytes per 16 KiB) and read once:
// its tokens are checked against vocab_size as they pass, and the checksum the writer computed
// over them must be the header's payload_xxh64 before the rename. So the new file holds the
// same tokens at the same width under the same header fields (n_tokens, token_bytes,
// payload_xxh64, vocab_size, doc_token): the same data fingerprint, and a run reading the shard
// reads on (it notices the new file and verifies it again). The file stays as it was on any
// result but SHARD_UPGRADED. While it works it holds an flock on the shard, so that two
// upgrades over the same shards (array jobs) never write the same one.
typedef enum {
    SHARD_UPGRADED,  // written again as version 2
    SHARD_CURRENT,   // version 2 already
    SHARD_REFUSED,   // not a sound shard (bad header or size, corrupt payload, a token out of range),
                     // not to be opened, or replaced by another program while it was read: why says which
    SHARD_BUSY,      // another process holds its lock: it is upgrading it
    SHARD_FAILED,    // reading it, or writing or renaming the new file failed (why: the call's error;
                     // PATH.tmp removed)
} shard_upgrade_result;

// *h: the header, once read (zero before). progress(ctx, bytes), when not NULL: payload bytes
// read since its last call, after each piece.
shard_upgrade_result shard_upgrade(const char *path, shard_header *h, void (*progress)(void *ctx, uint64_t bytes),
                                   void *ctx, char *why, size_t why_bytes);

// ---- the loader ----
// Its position, data_position (epoch, micro-batch index), is in llmc/state.h.
typedef struct dataloader dataloader;

// Opens the shards named by `spec` (a path, a glob, or comma-separated list of either)
// and checks every header. `key` names the config key for error messages. Fails
// (one-line error) on no match, a bad shard, or too few tokens for one micro-batch.
// Who reads which rows (the split above): DiLoCo replica `replica` of `replicas`, and rank
// `rank` of that replica's `ranks` processes. {0, 1, 0, 1}: one process reads everything.
typedef struct {
    int replica, replicas;
    int rank, ranks;
} data_split;

dataloader *dataloader_open_split(const char *spec, const char *key, int64_t batch_size, int64_t seq_len,
                                  bool shuffle, uint64_t seed, data_split split);
// The same for processes that are not DiLoCo replicas: rank `rank` of `world` ({0, 1, rank, world}).
dataloader *dataloader_open(const char *spec, const char *key, int64_t batch_size, int64_t seq_len,
                            bool shuffle, uint64_t seed, int rank, int world);
void dataloader_close(dataloader *d);
// Fills inputs and targets (each batch_size * seq_len tokens) with the next micro-batch.
void dataloader_next(dataloader *d, int32_t *inputs, int32_t *targets);
data_position dataloader_position(const dataloader *d);
void dataloader_seek(dataloader *d, data_position pos);
// Restarts at the first micro-batch of epoch 0 (validation uses the same batches each time).
void dataloader_rewind(dataloader *d);
uint64_t dataloader_total_tokens(const dataloader *d);
int dataloader_shard_count(const dataloader *d);
// What the data is, not where it lies: the XXH64 of every shard's header fields that say what
// it holds (token count and width, vocab_size, doc_token, payload checksum), in order. Copies
// of the same shards under other paths (another cluster's file system) have the same
// fingerprint; two loaders with equal fingerprints read the same token stream. DiLoCo's
// replicas, a job's ranks and a resumed run compare it (they split or continue the same rows).
uint64_t dataloader_fingerprint(const dataloader *d);
// Largest vocab_size among the shard headers, and their doc_token (SHARD_NO_DOC_TOKEN when
// absent). Shards that disagree on it stop the run with a line when `masking` (documents would
// be cut at another token in some of them); else the first shard's, with a warning.
uint32_t dataloader_vocab_size(const dataloader *d);
uint32_t dataloader_doc_token(const dataloader *d, bool masking);
// Micro-batches per epoch for one process.
int64_t dataloader_batches_per_epoch(const dataloader *d);
// Verifies now the stream's first `tokens` tokens as reading them would (version 2: the
// chunks that hold them; version 1: every shard that holds one, whole); fails with one line
// naming the shard. For the validation set at start, so that a bad one stops the run before it
// trains rather than after.
void dataloader_verify_prefix(dataloader *d, uint64_t tokens);
// What this loader has read from its shards' payloads and chunk tables so far (rows, and the
// chunks or whole shards read to verify them), and of that, the bytes it hashed to verify.
uint64_t dataloader_bytes_read(const dataloader *d);
uint64_t dataloader_bytes_hashed(const dataloader *d);

#ifdef __cplusplus
}
#endif

#endif

// ================================================================ implementation
// Compiled once: the Makefile builds this header as C with DATALOADER_IMPLEMENTATION
// defined (build/dataloader_impl.o); every other file includes it for the declarations above.
//
// Shards are opened lazily and read with pread, so a dataset of thousands of shards costs
// one open file at a time. A version 2 shard is verified where it is read: a row reads the
// chunks that hold it and their table entries, checks each chunk's checksum and every token of
// it against vocab_size, and is taken from those verified bytes; the verified range of the last
// shard read is kept, so the next row inside it (shuffle = 0, validation) costs no read. So a
// process hashes about what it reads (a row plus up to two chunks), whatever the corpus's size,
// and nothing is kept across processes or starts that could go stale. A version 1 shard has
// one checksum over its whole payload, so it is verified whole the first time this process
// reads from it (a full pass over that shard, at disk speed) before any of its tokens is used.
// A shard that changes while the run reads it (rewritten by a `prepare --overwrite`, copied
// over again) is noticed when it is next opened: a new file (device, inode), size or mtime
// has its header compared with the one the run started with (other tokens are an error) and
// its payload verified again before any of its tokens is used.
#if defined(DATALOADER_IMPLEMENTATION) && !defined(TRAIN_GPT_DATALOADER_IMPLEMENTED)
#define TRAIN_GPT_DATALOADER_IMPLEMENTED

#include "llmc/bytes.h"
#include "llmc/checksum.h"
#include "llmc/common.h"
#include "llmc/fault.h"
#include "llmc/rng.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

// ---------------------------------------------------------------- header encoding


static void encode_header(const shard_header *h, uint8_t out[SHARD_HEADER_BYTES]) {
    memset(out, 0, SHARD_HEADER_BYTES);
    memcpy(out, SHARD_MAGIC, 8);
    put_u32(out + 8, h->version);
    put_u32(out + 12, h->token_bytes);
    put_u64(out + 16, h->n_tokens);
    put_u64(out + 24, h->payload_xxh64);
    put_u32(out + 32, h->vocab_size);
    put_u32(out + 36, h->doc_token);
    if (h->version >= 2) put_u32(out + 40, h->chunk_bytes);
    put_u64(out + 56, xxh64(out, 56, 0));
}

static bool decode_header(const uint8_t in[SHARD_HEADER_BYTES], shard_header *h, char *why, size_t why_bytes) {
    if (memcmp(in, SHARD_MAGIC, 8) != 0) {
        snprintf(why, why_bytes, "not a train_gpt token shard (bad magic)");
        return false;
    }
    if (get_u64(in + 56) != xxh64(in, 56, 0)) {
        snprintf(why, why_bytes, "shard header checksum mismatch (corrupt header)");
        return false;
    }
    h->version = get_u32(in + 8);
    h->token_bytes = get_u32(in + 12);
    h->n_tokens = get_u64(in + 16);
    h->payload_xxh64 = get_u64(in + 24);
    h->vocab_size = get_u32(in + 32);
    h->doc_token = get_u32(in + 36);
    h->chunk_bytes = h->version >= 2 ? get_u32(in + 40) : 0;
    if (h->version != 1 && h->version != 2) {
        snprintf(why, why_bytes, "shard version %u is not supported (this build reads versions 1 and 2)", h->version);
        return false;
    }
    if (h->version == 2 && (h->chunk_bytes < SHARD_MIN_CHUNK_BYTES || h->chunk_bytes > SHARD_MAX_CHUNK_BYTES ||
                            (h->chunk_bytes & (h->chunk_bytes - 1)) != 0)) {
        snprintf(why, why_bytes, "bad chunk size %u bytes (a power of two from %u to %u)", h->chunk_bytes,
                 SHARD_MIN_CHUNK_BYTES, SHARD_MAX_CHUNK_BYTES);
        return false;
    }
    if (h->token_bytes != 2 && h->token_bytes != 4) {
        snprintf(why, why_bytes, "bad token width %u bytes", h->token_bytes);
        return false;
    }
    if (h->vocab_size == 0 || (h->token_bytes == 2 && h->vocab_size > 65536)) {
        snprintf(why, why_bytes, "vocab_size %u does not fit %u-byte tokens", h->vocab_size, h->token_bytes);
        return false;
    }
    if (h->doc_token != SHARD_NO_DOC_TOKEN && h->doc_token >= h->vocab_size) {   // masking would find none
        snprintf(why, why_bytes, "doc_token %u is not below the shard's vocab_size %u", h->doc_token, h->vocab_size);
        return false;
    }
    return true;
}

static uint64_t shard_chunks(const shard_header *h) {
    uint64_t payload = h->n_tokens * h->token_bytes;
    return h->version >= 2 ? (payload + h->chunk_bytes - 1) / h->chunk_bytes : 0;
}

uint64_t shard_file_bytes(const shard_header *h) {
    return SHARD_HEADER_BYTES + h->n_tokens * h->token_bytes + 8 * shard_chunks(h);
}

// ---------------------------------------------------------------- writer

struct shard_writer {
    int fd;
    uint64_t index;   // the writers this process opened before it: the test faults' STEP
    char *path, *tmp_path;
    shard_header header;
    xxh64_state hash;
    uint8_t *buffer;
    size_t buffered_bytes, capacity_bytes;
    // version 2: the chunk being hashed (its bytes so far) and the table of those done
    xxh64_state chunk;
    uint64_t chunk_fill;
    uint8_t *table;
    uint64_t chunks, table_capacity;
};

shard_writer *shard_writer_open(const char *path, uint32_t vocab_size, uint32_t doc_token) {
    return shard_writer_open_chunked(path, vocab_size, doc_token, SHARD_CHUNK_BYTES);
}

shard_writer *shard_writer_open_chunked(const char *path, uint32_t vocab_size, uint32_t doc_token,
                                        uint32_t chunk_bytes) {
    if (vocab_size == 0 || (doc_token != SHARD_NO_DOC_TOKEN && doc_token >= vocab_size) ||
        (chunk_bytes != 0 && (chunk_bytes < SHARD_MIN_CHUNK_BYTES || chunk_bytes > SHARD_MAX_CHUNK_BYTES ||
                              (chunk_bytes & (chunk_bytes - 1)) != 0))) {
        errno = EINVAL;
        return NULL;
    }
    shard_writer *w = xcalloc(1, sizeof *w);
    static uint64_t writers_opened;
    w->index = writers_opened++;
    w->path = xstrdup(path);
    w->tmp_path = xmalloc(strlen(path) + 5);
    sprintf(w->tmp_path, "%s.tmp", path);
    // Created anew, never through what is there: a NAME.tmp left by a killed writer goes, and a
    // symbolic link of that name is removed, not followed (it once had its target overwritten).
    if (unlink(w->tmp_path) == 0 || errno == ENOENT)
        w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    else
        w->fd = -1;
    if (w->fd < 0) {
        int e = errno;
        free(w->path);
        free(w->tmp_path);
        free(w);
        errno = e;
        return NULL;
    }
    w->header.version = chunk_bytes ? SHARD_VERSION : 1;
    w->header.chunk_bytes = chunk_bytes;
    xxh64_init(&w->chunk, 0);   // chunk k is hashed with seed k
    w->header.token_bytes = vocab_size <= 65536 ? 2 : 4;
    w->header.vocab_size = vocab_size;
    w->header.doc_token = doc_token;
    xxh64_init(&w->hash, 0);
    w->capacity_bytes = 1 << 20;
    w->buffer = xmalloc(w->capacity_bytes);
    uint8_t blank[SHARD_HEADER_BYTES] = {0};
    if (!write_exact(w->fd, blank, sizeof blank)) {
        int e = errno;
        shard_writer_abort(w);
        errno = e;
        return NULL;
    }
    return w;
}

static void end_chunk(shard_writer *w) {
    if (w->chunks == w->table_capacity) {
        w->table_capacity = w->table_capacity ? 2 * w->table_capacity : 1024;
        w->table = xrealloc(w->table, (size_t)w->table_capacity * 8);
    }
    put_u64(w->table + 8 * w->chunks, xxh64_digest(&w->chunk));
    w->chunks++;
    xxh64_init(&w->chunk, w->chunks);
    w->chunk_fill = 0;
}

// Version 2: the payload bytes p[0..n) into the chunk hashes, a table entry per full chunk.
static void hash_chunks(shard_writer *w, const uint8_t *p, size_t n) {
    uint64_t size = w->header.chunk_bytes;
    while (n > 0) {
        size_t take = n < size - w->chunk_fill ? n : (size_t)(size - w->chunk_fill);
        xxh64_update(&w->chunk, p, take);
        w->chunk_fill += take;
        p += take;
        n -= take;
        if (w->chunk_fill == size) end_chunk(w);
    }
}

// Payload bytes p[0..n) into the checksums and the file, after those written before.
static bool write_payload(shard_writer *w, const uint8_t *p, size_t n) {
    if (n == 0) return true;
    xxh64_update(&w->hash, p, n);
    if (w->header.chunk_bytes) hash_chunks(w, p, n);
    if (fault_requested("shard_write_enospc", (int64_t)w->index)) {   // half of it, then a full disk
        (void)write_exact(w->fd, p, n / 2);
        errno = ENOSPC;
        return false;
    }
    return write_exact(w->fd, p, n);
}

static bool flush_buffer(shard_writer *w) {
    bool ok = write_payload(w, w->buffer, w->buffered_bytes);
    w->buffered_bytes = 0;
    return ok;
}

bool shard_writer_append(shard_writer *w, const uint32_t *tokens, uint64_t count) {
    uint32_t width = w->header.token_bytes;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t t = tokens[i];
        if (t >= w->header.vocab_size) {
            errno = EINVAL;
            return false;
        }
        if (w->buffered_bytes + width > w->capacity_bytes && !flush_buffer(w)) return false;
        uint8_t *p = w->buffer + w->buffered_bytes;
        p[0] = (uint8_t)t;
        p[1] = (uint8_t)(t >> 8);
        if (width == 4) {
            p[2] = (uint8_t)(t >> 16);
            p[3] = (uint8_t)(t >> 24);
        }
        w->buffered_bytes += width;
    }
    w->header.n_tokens += count;
    return true;
}

uint64_t shard_writer_tokens(const shard_writer *w) { return w->header.n_tokens; }

static void writer_free(shard_writer *w) {
    free(w->buffer);
    free(w->table);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

// shard_writer_close, with `may_rename` (when not NULL) asked right before the rename, after the
// fsync: false leaves PATH as it is (PATH.tmp removed) and returns false.
static bool writer_close_if(shard_writer *w, bool (*may_rename)(void *), void *ctx);

bool shard_writer_close(shard_writer *w) { return writer_close_if(w, NULL, NULL); }

static bool writer_close_if(shard_writer *w, bool (*may_rename)(void *), void *ctx) {
    bool ok = flush_buffer(w);
    if (w->header.chunk_bytes) {   // the last, shorter chunk, then the table after the payload
        if (w->chunk_fill > 0) end_chunk(w);
        ok = ok && write_exact(w->fd, w->table, (size_t)w->chunks * 8);
    }
    w->header.payload_xxh64 = xxh64_digest(&w->hash);
    uint8_t header[SHARD_HEADER_BYTES];
    encode_header(&w->header, header);
    ok = ok && pwrite(w->fd, header, sizeof header, 0) == (ssize_t)sizeof header;
    ok = ok && fsync(w->fd) == 0;
    int e = errno;
    ok = close(w->fd) == 0 && ok;
    if (ok && fault_requested("shard_rename_eio", (int64_t)w->index)) ok = false, errno = EIO;
    if (ok && may_rename && fault_requested("stop_before_rename", (int64_t)w->index)) raise(SIGSTOP);
    if (ok && may_rename && !may_rename(ctx)) ok = false;
    ok = ok && rename(w->tmp_path, w->path) == 0;
    if (!ok) {
        e = errno ? errno : e;
        unlink(w->tmp_path);
    }
    writer_free(w);
    errno = e;
    return ok;
}

void shard_writer_abort(shard_writer *w) {
    close(w->fd);
    unlink(w->tmp_path);
    writer_free(w);
}

// ---------------------------------------------------------------- reader

// shard_read_header on a file open as fd (the upgrade reads the header of the file it locked).
static bool read_header_fd(int fd, shard_header *h, char *why, size_t why_bytes) {
    struct stat st;
    uint8_t raw[SHARD_HEADER_BYTES];
    bool ok = fstat(fd, &st) == 0;
    if (!ok) snprintf(why, why_bytes, "cannot stat: %s", strerror(errno));
    if (ok && (uint64_t)st.st_size < SHARD_HEADER_BYTES) {
        snprintf(why, why_bytes, "truncated shard (%lld bytes, the header alone is %d)", (long long)st.st_size,
                 SHARD_HEADER_BYTES);
        ok = false;
    }
    if (ok && !pread_exact(fd, raw, sizeof raw, 0)) {
        snprintf(why, why_bytes, "cannot read header: %s", strerror(errno));
        ok = false;
    }
    if (!ok || !decode_header(raw, h, why, why_bytes)) return false;
    uint64_t payload = (uint64_t)st.st_size - SHARD_HEADER_BYTES;
    if (h->n_tokens > payload / h->token_bytes) {  // also where n_tokens · width would wrap
        snprintf(why, why_bytes, "truncated shard: %lld bytes, the header says %llu tokens of %u bytes",
                 (long long)st.st_size, (unsigned long long)h->n_tokens, h->token_bytes);
        return false;
    }
    uint64_t expected = shard_file_bytes(h);
    if ((uint64_t)st.st_size != expected) {
        snprintf(why, why_bytes, "%s shard: %lld bytes, the header says %llu tokens = %llu bytes%s",
                 (uint64_t)st.st_size < expected ? "truncated" : "oversized", (long long)st.st_size,
                 (unsigned long long)h->n_tokens, (unsigned long long)expected,
                 h->version >= 2 ? " with its chunk table" : "");
        return false;
    }
    return true;
}

bool shard_read_header(const char *path, shard_header *h, char *why, size_t why_bytes) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_bytes, "cannot open: %s", strerror(errno));
        return false;
    }
    bool ok = read_header_fd(fd, h, why, why_bytes);
    close(fd);
    return ok;
}

// Token i of a shard's payload bytes of `width` (2 or 4) bytes per token, little-endian.
static inline uint32_t token_at(const uint8_t *raw, uint32_t width, uint64_t i) {
    return width == 2 ? (uint32_t)raw[2 * i] | (uint32_t)raw[2 * i + 1] << 8 : get_u32(raw + 4 * i);
}

static void widen_tokens(const uint8_t *raw, uint32_t width, uint64_t count, uint32_t *out) {
    for (uint64_t i = 0; i < count; i++) out[i] = token_at(raw, width, i);
}

uint32_t *shard_read_all(const char *path, shard_header *h, char *why, size_t why_bytes) {
    if (!shard_read_header(path, h, why, why_bytes)) return NULL;
    size_t bytes = (size_t)(h->n_tokens * h->token_bytes);
    uint8_t *raw = xmalloc(bytes);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && pread_exact(fd, raw, bytes, SHARD_HEADER_BYTES);
    if (fd >= 0) close(fd);
    if (!ok) {
        snprintf(why, why_bytes, "cannot read tokens: %s", strerror(errno));
        free(raw);
        return NULL;
    }
    if (ok && xxh64(raw, bytes, 0) != h->payload_xxh64) {
        snprintf(why, why_bytes, "shard payload checksum mismatch (corrupt data)");
        ok = false;
    }
    uint64_t chunks = shard_chunks(h);
    uint8_t *table = xmalloc((size_t)chunks * 8 + 1);
    if (ok && chunks > 0) {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        ok = fd >= 0 && pread_exact(fd, table, (size_t)chunks * 8, SHARD_HEADER_BYTES + bytes);
        if (fd >= 0) close(fd);
        if (!ok) snprintf(why, why_bytes, "cannot read the chunk table: %s", strerror(errno));
    }
    for (uint64_t k = 0; ok && k < chunks; k++) {
        uint64_t at = k * h->chunk_bytes, n = bytes - at < h->chunk_bytes ? bytes - at : h->chunk_bytes;
        if (xxh64(raw + at, (size_t)n, k) != get_u64(table + 8 * k)) {
            snprintf(why, why_bytes, "payload checksum mismatch in chunk %llu (file bytes %llu..%llu, or its entry in "
                     "the chunk table): corrupt data", (unsigned long long)k,
                     (unsigned long long)(SHARD_HEADER_BYTES + at), (unsigned long long)(SHARD_HEADER_BYTES + at + n - 1));
            ok = false;
        }
    }
    free(table);
    if (!ok) {
        free(raw);
        return NULL;
    }
    uint32_t *tokens = xmalloc((size_t)h->n_tokens * sizeof *tokens + 1);
    widen_tokens(raw, h->token_bytes, h->n_tokens, tokens);
    free(raw);
    for (uint64_t i = 0; i < h->n_tokens; i++)
        if (tokens[i] >= h->vocab_size) {
            snprintf(why, why_bytes, "token %u at index %llu is not below the shard's vocab_size %u", tokens[i],
                     (unsigned long long)i, h->vocab_size);
            free(tokens);
            return NULL;
        }
    return tokens;
}

// ---------------------------------------------------------------- loader

typedef struct {
    char *path;
    shard_header header;
    uint64_t first_token;  // offset of this shard in the concatenated stream
    bool verified;         // version 1: its whole payload, in this process
    // The file behind path when it was last opened (seen), for noticing a replaced one.
    bool seen, replaced;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} shard_entry;

struct dataloader {
    char *key;
    shard_entry *shards;
    int n_shards;
    uint64_t total_tokens;
    uint64_t fingerprint;        // dataloader_fingerprint
    int64_t B, T;
    bool shuffle;
    uint64_t seed;
    data_split split;
    int64_t batches_per_epoch;   // per process
    uint64_t n_rows;             // per epoch, all processes: windows of T+1 tokens, stride T
    data_position pos;
    int open_fd, open_shard;
    uint8_t *raw;                // read buffer for one row (version 1)
    uint32_t *row;
    // Version 2: payload bytes [cache_lo, cache_hi) of shard cache_shard (-1: none), whole
    // chunks read and verified, and a buffer for their chunk table entries.
    int cache_shard;
    uint64_t cache_lo, cache_hi;
    uint8_t *cache, *entries;
    size_t cache_capacity, entries_capacity;
    uint64_t bytes_read, bytes_hashed;   // dataloader_bytes_read, dataloader_bytes_hashed
};

static void add_shard(dataloader *d, int *capacity, const char *path) {
    if (d->n_shards == *capacity) {
        *capacity = *capacity ? *capacity * 2 : 16;
        d->shards = xrealloc(d->shards, (size_t)*capacity * sizeof *d->shards);
    }
    shard_entry *s = &d->shards[d->n_shards++];
    memset(s, 0, sizeof *s);
    s->path = xstrdup(path);
    char why[256];
    if (!shard_read_header(path, &s->header, why, sizeof why)) fail("%s: shard '%s': %s", d->key, path, why);
    s->first_token = d->total_tokens;
    d->total_tokens += s->header.n_tokens;
}

static bool has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

typedef struct {
    dev_t dev;
    ino_t ino;
    int index;
} shard_identity;

static int compare_shard_identity(const void *a, const void *b) {
    const shard_identity *x = (const shard_identity *)a, *y = (const shard_identity *)b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return x->index - y->index;
}

// A file listed more than once (a name and a glob that matches it, a hard link, two spellings
// of one path) is read that many times per epoch: a way to weight a source, or a mistake, so it
// is said, not refused (until 2026-12 nothing was said).
static void note_repeated_shards(const dataloader *d) {
    shard_identity *ids = (shard_identity *)xmalloc((size_t)d->n_shards * sizeof *ids);
    int n = 0;
    for (int i = 0; i < d->n_shards; i++) {
        struct stat st;
        if (stat(d->shards[i].path, &st) == 0) ids[n++] = (shard_identity){st.st_dev, st.st_ino, i};
    }
    qsort(ids, (size_t)n, sizeof *ids, compare_shard_identity);
    int repeated = 0, a = -1, b = -1, times = 0;   // the first such file's first two places, and count
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && ids[j].dev == ids[i].dev && ids[j].ino == ids[i].ino) j++;
        if (j - i > 1 && repeated++ == 0) a = ids[i].index, b = ids[i + 1].index, times = j - i;
        i = j;
    }
    if (repeated > 0)
        note("%s: %d shard file(s) listed more than once are read that many times per epoch (e.g. shard %d '%s' "
             "is shard %d '%s' too, %d times in all)",
             d->key, repeated, a + 1, d->shards[a].path, b + 1, d->shards[b].path, times);
    free(ids);
}

static void collect_shards(dataloader *d, const char *spec) {
    int capacity = 0;
    char *copy = xstrdup(spec);
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ') item++;
        char *end = item + strlen(item);
        while (end > item && end[-1] == ' ') *--end = '\0';
        if (*item == '\0') continue;
        // A file of that very name is taken as it is, as `shards upgrade` does: a path with '['
        // in it (prepare --out 'runs[1]/x') was globbed, and matched runs1/x ... when that existed.
        if (!has_glob_chars(item) || file_exists(item)) {
            if (!file_exists(item)) fail("%s: no such shard file '%s'", d->key, item);
            add_shard(d, &capacity, item);
            continue;
        }
        glob_t g;
        int rc = glob(item, 0, NULL, &g);  // glob() sorts its matches
        if (rc == GLOB_NOMATCH) fail("%s: no file matches '%s'", d->key, item);
        if (rc != 0) fail("%s: cannot expand '%s'", d->key, item);
        for (size_t i = 0; i < g.gl_pathc; i++) add_shard(d, &capacity, g.gl_pathv[i]);
        globfree(&g);
    }
    free(copy);
    if (d->n_shards == 0) fail("%s: no shard files given", d->key);
    note_repeated_shards(d);
    xxh64_state h;
    xxh64_init(&h, 0);
    for (int i = 0; i < d->n_shards; i++) {
        const shard_header *sh = &d->shards[i].header;
        uint8_t fields[28];
        put_u64(fields, sh->n_tokens);
        put_u64(fields + 8, sh->payload_xxh64);
        put_u32(fields + 16, sh->token_bytes);
        put_u32(fields + 20, sh->vocab_size);
        put_u32(fields + 24, sh->doc_token);
        xxh64_update(&h, fields, sizeof fields);
    }
    d->fingerprint = xxh64_digest(&h);
}

dataloader *dataloader_open_split(const char *spec, const char *key, int64_t batch_size, int64_t seq_len,
                                  bool shuffle, uint64_t seed, data_split split) {
    CHECK(batch_size > 0 && seq_len > 0 && split.replicas > 0 && split.replica >= 0 &&
          split.replica < split.replicas && split.ranks > 0 && split.rank >= 0 && split.rank < split.ranks);
    dataloader *d = xcalloc(1, sizeof *d);
    d->key = xstrdup(key);
    d->B = batch_size;
    d->T = seq_len;
    d->shuffle = shuffle;
    d->seed = seed;
    d->split = split;
    d->open_fd = -1;
    d->open_shard = -1;
    d->cache_shard = -1;
    collect_shards(d, spec);
    int old = 0;
    for (int i = 0; i < d->n_shards; i++) old += d->shards[i].header.version < 2;
    if (old > 0)
        note("%s: %d of the %d shards are version 1, with one checksum over each whole shard: every process reads "
             "each of them whole the first time it reads from it, after every start (version 2, which prepare writes, "
             "is verified chunk by chunk as it is read: docs/formats.md); `train_gpt shards upgrade` rewrites them as "
             "version 2 in place (docs/data.md)",
             key, old, d->n_shards);
    uint64_t usable = d->total_tokens > 0 ? d->total_tokens - 1 : 0;  // the last token is only a target
    // Every replica gets the same number of rows (the last rows_total mod M are not read), so
    // replicas of any batch size have the same epoch in rows.
    d->n_rows = usable / (uint64_t)seq_len;
    uint64_t replica_rows = d->n_rows / (uint64_t)split.replicas;
    d->batches_per_epoch = (int64_t)(replica_rows / (uint64_t)batch_size) / split.ranks;
    if (d->batches_per_epoch < 1)
        fail("%s: %llu tokens are too few for one micro-batch of %lld x %lld tokens for each of %d process(es)", key,
             (unsigned long long)d->total_tokens, (long long)batch_size, (long long)seq_len,
             split.replicas * split.ranks);
    d->raw = xmalloc((size_t)(seq_len + 1) * 4);
    d->row = xmalloc((size_t)(seq_len + 1) * sizeof *d->row);
    return d;
}

dataloader *dataloader_open(const char *spec, const char *key, int64_t batch_size, int64_t seq_len, bool shuffle,
                            uint64_t seed, int rank, int world) {
    return dataloader_open_split(spec, key, batch_size, seq_len, shuffle, seed, (data_split){0, 1, rank, world});
}

void dataloader_close(dataloader *d) {
    if (!d) return;
    if (d->open_fd >= 0) close(d->open_fd);
    for (int i = 0; i < d->n_shards; i++) free(d->shards[i].path);
    free(d->shards);
    free(d->raw);
    free(d->row);
    free(d->cache);
    free(d->entries);
    free(d->key);
    free(d);
}

static int shard_of_token(const dataloader *d, uint64_t token) {
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->shards[mid].first_token <= token) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The same tokens: the fields the fingerprint covers. The version and chunk size may differ (a
// version 1 shard converted to version 2 under the run is the same data).
static bool same_header(const shard_header *a, const shard_header *b) {
    return a->token_bytes == b->token_bytes && a->n_tokens == b->n_tokens && a->payload_xxh64 == b->payload_xxh64 &&
           a->vocab_size == b->vocab_size && a->doc_token == b->doc_token;
}

// Checks the file just opened for shard i against the one the run knows (see the top): on its
// first open, or when it is another file or was written since, its header must be the one the
// run started with, and (after a change) its payload is verified again before it is read.
static void check_identity(dataloader *d, int i, int fd) {
    shard_entry *s = &d->shards[i];
    struct stat st;
    if (fstat(fd, &st) != 0) fail("%s: cannot stat shard '%s': %s", d->key, s->path, strerror(errno));
    if (s->seen && st.st_dev == s->dev && st.st_ino == s->ino && st.st_size == s->size &&
        st.st_mtim.tv_sec == s->mtime.tv_sec && st.st_mtim.tv_nsec == s->mtime.tv_nsec)
        return;
    uint8_t raw[SHARD_HEADER_BYTES];
    shard_header now;
    char why[256] = "cannot read its header";
    bool ok = pread_exact(fd, raw, sizeof raw, 0) && decode_header(raw, &now, why, sizeof why);
    if (ok && (!same_header(&now, &s->header) || (uint64_t)st.st_size != shard_file_bytes(&now))) {
        snprintf(why, sizeof why, "it now holds %llu tokens of %u bytes (%lld bytes, checksum %016llx), not the %llu "
                 "(checksum %016llx) the run started with",
                 (unsigned long long)now.n_tokens, now.token_bytes, (long long)st.st_size,
                 (unsigned long long)now.payload_xxh64, (unsigned long long)s->header.n_tokens,
                 (unsigned long long)s->header.payload_xxh64);
        ok = false;
    }
    if (!ok) fail("%s: shard '%s' changed while the run was reading it: %s", d->key, s->path, why);
    if (s->seen) {
        s->verified = false;   // the same tokens by its header; they are checked again before use
        s->replaced = true;
        if (d->cache_shard == i) d->cache_shard = -1;
    }
    // Its version and chunk size are the file's, also at its first open: one written again
    // between the run's start (which read every header) and then, as version 1 or with another
    // chunk size, was read by the start's layout ("read error", or "corrupt data" in chunk 0).
    s->header = now;
    s->seen = true;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->size = st.st_size;
    s->mtime = st.st_mtim;
}

static int shard_fd(dataloader *d, int i) {
    if (d->open_shard == i) return d->open_fd;
    if (d->open_fd >= 0) close(d->open_fd);
    d->open_fd = open(d->shards[i].path, O_RDONLY | O_CLOEXEC);
    d->open_shard = d->open_fd >= 0 ? i : -1;
    if (d->open_fd < 0) fail("%s: cannot open shard '%s': %s", d->key, d->shards[i].path, strerror(errno));
    check_identity(d, i, d->open_fd);
    return d->open_fd;
}

// The index of the first of count tokens that is not below vocab_size, or count when all
// are. The common case (all below) is a max over the chunk, which compilers vectorize.
static uint64_t first_token_at_or_above(const uint8_t *raw, uint32_t width, uint64_t count, uint32_t vocab_size) {
    uint32_t max = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t t = token_at(raw, width, i);
        max = t > max ? t : max;
    }
    if (max < vocab_size) return count;
    for (uint64_t i = 0; i < count; i++)
        if (token_at(raw, width, i) >= vocab_size) return i;
    return count;
}

static void fail_token_range(const dataloader *d, const shard_entry *s, uint32_t token, uint64_t index) {
    fail("%s: shard '%s': token %u at index %llu is not below its vocab_size %u", d->key, s->path, token,
         (unsigned long long)index, s->header.vocab_size);
}

// Version 1: one pass over the payload checks its checksum and every token against the
// header's vocab_size, so a shard with a bad token fails before its first token is used, not
// when the window holding it comes up (hours into a run, and again on every resume).
static void verify_shard(dataloader *d, int i) {
    shard_entry *s = &d->shards[i];
    int fd = shard_fd(d, i);
    xxh64_state h;
    xxh64_init(&h, 0);
    uint32_t width = s->header.token_bytes;
    uint64_t left = s->header.n_tokens * width, offset = SHARD_HEADER_BYTES;
    uint64_t bad_index = UINT64_MAX;   // the first token out of range, reported after the checksum
    uint32_t bad_token = 0;
    size_t chunk_bytes = 8 << 20;      // a multiple of both widths: tokens never straddle chunks
    uint8_t *chunk = xmalloc(chunk_bytes);
    while (left > 0) {
        size_t n = left < chunk_bytes ? (size_t)left : chunk_bytes;
        if (!pread_exact(fd, chunk, n, offset)) fail("%s: shard '%s': read error: %s", d->key, s->path, strerror(errno));
        xxh64_update(&h, chunk, n);
        d->bytes_read += n;
        d->bytes_hashed += n;
        if (bad_index == UINT64_MAX) {
            uint64_t k = first_token_at_or_above(chunk, width, n / width, s->header.vocab_size);
            if (k < n / width) {
                bad_index = (offset - SHARD_HEADER_BYTES) / width + k;
                bad_token = token_at(chunk, width, k);
            }
        }
        left -= n;
        offset += n;
    }
    free(chunk);
    // A checksum mismatch first: corrupt bytes explain a wild token, not the other way round.
    if (xxh64_digest(&h) != s->header.payload_xxh64)
        fail("%s: shard '%s': payload checksum mismatch (%s)", d->key, s->path,
             s->replaced ? "it was written again while the run was reading it, and its tokens changed" : "corrupt data");
    if (bad_index != UINT64_MAX) fail_token_range(d, s, bad_token, bad_index);
    s->verified = true;
}

static void *grow(void *p, size_t *capacity, size_t bytes) {
    if (bytes <= *capacity) return p;
    *capacity = bytes;
    return xrealloc(p, bytes);
}

// Version 2: makes chunks [c0, c1) of shard i the verified range. The chunks of it the range
// holds already are kept (rows read in order hash each chunk once); the others are read with
// their table entries, each checked against its checksum and every token of it against
// vocab_size (the whole chunk: a bad token stops the run when its chunk is first read, not
// only when its own row comes up). An error names the shard, the chunk and its bytes in the
// file.
static void load_chunks(dataloader *d, int i, uint64_t c0, uint64_t c1) {
    shard_entry *s = &d->shards[i];
    int fd = shard_fd(d, i);   // open already: the callers noticed a replaced file before they chose this path
    const shard_header *h = &s->header;
    CHECK(h->version >= 2);
    uint64_t size = h->chunk_bytes, payload = h->n_tokens * h->token_bytes;
    uint64_t lo = c0 * size, hi = min_i64((int64_t)(c1 * size), (int64_t)payload);
    uint64_t kept = 0;   // bytes of [lo, hi) that the verified range holds, from lo on
    if (d->cache_shard == i && d->cache_lo <= lo && lo < d->cache_hi)
        kept = min_i64((int64_t)d->cache_hi, (int64_t)hi) - lo;
    d->cache_shard = -1;
    d->cache = grow(d->cache, &d->cache_capacity, (size_t)(hi - lo));
    if (kept > 0) memmove(d->cache, d->cache + (lo - d->cache_lo), (size_t)kept);
    // The first chunk to read: a kept range ends at a chunk's end, or at the payload's.
    uint64_t k0 = lo + kept >= hi ? c1 : (lo + kept) / size;
    uint64_t from = k0 * size;
    if (from < hi) {
        d->entries = grow(d->entries, &d->entries_capacity, (size_t)(c1 - k0) * 8);
        if (!pread_exact(fd, d->cache + (from - lo), (size_t)(hi - from), SHARD_HEADER_BYTES + from) ||
            !pread_exact(fd, d->entries, (size_t)(c1 - k0) * 8, SHARD_HEADER_BYTES + payload + 8 * k0))
            fail("%s: shard '%s': read error: %s", d->key, s->path, strerror(errno));
        d->bytes_read += (hi - from) + 8 * (c1 - k0);
        d->bytes_hashed += hi - from;
    }
    for (uint64_t k = k0; k < c1; k++) {
        const uint8_t *bytes = d->cache + (k * size - lo);
        uint64_t n = min_i64((int64_t)size, (int64_t)(payload - k * size));
        if (xxh64(bytes, (size_t)n, k) != get_u64(d->entries + 8 * (k - k0)))
            fail("%s: shard '%s': payload checksum mismatch in chunk %llu (file bytes %llu..%llu, or its entry in the "
                 "chunk table): %s", d->key, s->path, (unsigned long long)k,
                 (unsigned long long)(SHARD_HEADER_BYTES + k * size),
                 (unsigned long long)(SHARD_HEADER_BYTES + k * size + n - 1),
                 s->replaced ? "it was written again while the run was reading it, and its tokens changed"
                             : "corrupt data");
        uint64_t tokens = n / h->token_bytes, bad = first_token_at_or_above(bytes, h->token_bytes, tokens, h->vocab_size);
        if (bad < tokens) fail_token_range(d, s, token_at(bytes, h->token_bytes, bad), k * size / h->token_bytes + bad);
    }
    d->cache_shard = i;
    d->cache_lo = lo;
    d->cache_hi = hi;
}

// Version 2: tokens [first, first + count) of shard i into out, from verified chunks.
static void read_chunked(dataloader *d, int i, uint64_t first, uint64_t count, uint32_t *out) {
    const shard_header *h = &d->shards[i].header;
    uint64_t a = first * h->token_bytes, b = (first + count) * h->token_bytes;
    if (d->cache_shard != i || a < d->cache_lo || b > d->cache_hi)
        load_chunks(d, i, a / h->chunk_bytes, (b + h->chunk_bytes - 1) / h->chunk_bytes);
    widen_tokens(d->cache + (a - d->cache_lo), h->token_bytes, count, out);
}

// Reads stream tokens [start, start + count) into d->row, across shard boundaries.
static void read_stream(dataloader *d, uint64_t start, uint64_t count) {
    CHECK(start + count <= d->total_tokens);
    uint64_t done = 0;
    while (done < count) {
        uint64_t at = start + done;
        int i = shard_of_token(d, at);
        shard_entry *s = &d->shards[i];
        uint64_t in_shard = at - s->first_token;
        uint64_t n = min_i64((int64_t)(count - done), (int64_t)(s->header.n_tokens - in_shard));
        // First: a replaced file is noticed here (the entry then has its header, of either
        // version) and its tokens verified again below before they are used.
        int fd = shard_fd(d, i);
        if (s->header.version >= 2) {
            read_chunked(d, i, in_shard, n, d->row + done);
            done += n;
            continue;
        }
        if (!s->verified) verify_shard(d, i);
        uint32_t width = s->header.token_bytes;
        if (!pread_exact(fd, d->raw, (size_t)(n * width), SHARD_HEADER_BYTES + in_shard * width))
            fail("%s: shard '%s': read error: %s", d->key, s->path, strerror(errno));
        d->bytes_read += n * width;
        widen_tokens(d->raw, width, n, d->row + done);
        // verify_shard checked every token already; this second check costs nothing next
        // to the read.
        for (uint64_t k = 0; k < n; k++)
            if (d->row[done + k] >= s->header.vocab_size) fail_token_range(d, s, d->row[done + k], in_shard + k);
        done += n;
    }
}

// A keyed bijection on [0, n): a 4-round Feistel network on the smallest even number of
// bits that covers n, with cycle walking for values >= n. O(1) memory for any dataset.
static uint64_t mix64(uint64_t z) {
    return splitmix64(&z);
}

static uint64_t permute_index(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch) {
    int bits = 2;
    while (bits < 64 && (1ULL << bits) < n) bits += 2;
    int half = bits / 2;
    uint64_t mask = (1ULL << half) - 1;
    uint64_t keys[4];
    uint64_t k = seed * 0x2545F4914F6CDD1DULL ^ (epoch + 1) * 0x9E3779B97F4A7C15ULL;
    for (int r = 0; r < 4; r++) keys[r] = mix64(k + (uint64_t)r);
    uint64_t x = i;
    do {
        uint64_t left = x >> half, right = x & mask;
        for (int r = 0; r < 4; r++) {
            uint64_t next = left ^ (mix64(right ^ keys[r]) & mask);
            left = right;
            right = next;
        }
        x = (left << half) | right;
    } while (x >= n);
    return x;
}

void dataloader_next(dataloader *d, int32_t *inputs, int32_t *targets) {
    if (d->pos.index >= d->batches_per_epoch) {
        d->pos.epoch++;
        d->pos.index = 0;
    }
    const data_split *sp = &d->split;
    uint64_t batch = (uint64_t)(d->pos.index * sp->ranks + sp->rank);   // of the replica's rows
    uint64_t T = (uint64_t)d->T;
    for (int64_t b = 0; b < d->B; b++) {
        uint64_t row = (batch * (uint64_t)d->B + (uint64_t)b) * (uint64_t)sp->replicas + (uint64_t)sp->replica;
        uint64_t window = d->shuffle ? permute_index(row, d->n_rows, d->seed, (uint64_t)d->pos.epoch) : row;
        uint64_t start = window * T;
        read_stream(d, start, T + 1);
        for (uint64_t t = 0; t < T; t++) {
            inputs[b * (int64_t)T + (int64_t)t] = (int32_t)d->row[t];
            targets[b * (int64_t)T + (int64_t)t] = (int32_t)d->row[t + 1];
        }
    }
    d->pos.index++;
}

data_position dataloader_position(const dataloader *d) { return d->pos; }

void dataloader_seek(dataloader *d, data_position pos) {
    CHECK(pos.epoch >= 0 && pos.index >= 0);
    d->pos = pos;
}

void dataloader_rewind(dataloader *d) { d->pos = (data_position){0, 0}; }

uint64_t dataloader_total_tokens(const dataloader *d) { return d->total_tokens; }
int dataloader_shard_count(const dataloader *d) { return d->n_shards; }
uint64_t dataloader_fingerprint(const dataloader *d) { return d->fingerprint; }

uint32_t dataloader_vocab_size(const dataloader *d) {
    uint32_t v = 0;
    for (int i = 0; i < d->n_shards; i++)
        if (d->shards[i].header.vocab_size > v) v = d->shards[i].header.vocab_size;
    return v;
}

uint32_t dataloader_doc_token(const dataloader *d, bool masking) {
    uint32_t first = d->shards[0].header.doc_token;
    for (int i = 1; i < d->n_shards; i++) {
        uint32_t other = d->shards[i].header.doc_token;
        if (other == first) continue;
        if (masking)   // until 2026-12 a warning, and the other shards' documents cut at the wrong token
            fail("%s: shards disagree on doc_token (%u in '%s', %u in '%s'): document masking would cut some at "
                 "the wrong token ---> HINT: prepare them with one tokenizer and --doc_token, or doc_masking = 0",
                 d->key, first, d->shards[0].path, other, d->shards[i].path);
        warn("%s: shards disagree on doc_token (%u in '%s', %u in '%s'); using %u", d->key, first, d->shards[0].path,
             other, d->shards[i].path, first);
        break;
    }
    return first;
}

int64_t dataloader_batches_per_epoch(const dataloader *d) { return d->batches_per_epoch; }

void dataloader_verify_prefix(dataloader *d, uint64_t tokens) {
    for (int i = 0; i < d->n_shards && d->shards[i].first_token < tokens; i++) {
        shard_entry *s = &d->shards[i];
        shard_fd(d, i);   // a replaced file is noticed before its version or flag is trusted
        if (s->header.version < 2) {
            if (!s->verified) verify_shard(d, i);
            continue;
        }
        // The chunks that hold its first `tokens`, about 4 MiB at a time (the cache holds that
        // much, not the whole set).
        uint64_t n = min_i64((int64_t)(tokens - s->first_token), (int64_t)s->header.n_tokens);
        uint64_t size = s->header.chunk_bytes, last = (n * s->header.token_bytes + size - 1) / size;
        uint64_t step = size < (4u << 20) ? (4u << 20) / size : 1;
        for (uint64_t c = 0; c < last; c += step) load_chunks(d, i, c, min_i64((int64_t)(c + step), (int64_t)last));
    }
}

uint64_t dataloader_bytes_read(const dataloader *d) { return d->bytes_read; }
uint64_t dataloader_bytes_hashed(const dataloader *d) { return d->bytes_hashed; }

// ---------------------------------------------------------------- upgrading shards

// Whether the name path still leads to the file open as fd (st: its fstat): another program
// may have written a new shard under the name since it was opened.
static bool names_file(const char *path, const struct stat *st) {
    struct stat now;
    return stat(path, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino;
}

typedef struct {
    const char *path;
    const struct stat *st;
    bool replaced;   // set when the name no longer leads to the file
} name_check;

static bool still_names(void *ctx) {
    name_check *c = (name_check *)ctx;
    c->replaced = !names_file(c->path, c->st);
    return !c->replaced;
}

// The XXH64 of a shard's whole payload (after a bad token: corrupt bytes explain a wild token,
// not the other way round, so the checksum decides which one is said). false on a read error.
static bool payload_checksum(int fd, const shard_header *h, uint8_t *piece, size_t piece_bytes, uint64_t *sum) {
    xxh64_state x;
    xxh64_init(&x, 0);
    for (uint64_t at = 0, payload = h->n_tokens * h->token_bytes; at < payload;) {
        size_t n = payload - at < piece_bytes ? (size_t)(payload - at) : piece_bytes;
        if (!pread_exact(fd, piece, n, SHARD_HEADER_BYTES + at)) return false;
        xxh64_update(&x, piece, n);
        at += n;
    }
    *sum = xxh64_digest(&x);
    return true;
}

// Streams the payload of the version 1 shard open as fd into w; the result and why as
// shard_upgrade's. w is closed (renamed over real) or aborted.
static shard_upgrade_result upgrade_payload(int fd, const char *real, const struct stat *st, const shard_header *h,
                                            shard_writer *w, void (*progress)(void *, uint64_t), void *ctx,
                                            char *why, size_t why_bytes) {
    const size_t piece_bytes = 8 << 20;   // a multiple of both widths: no token straddles two pieces
    uint8_t *piece = xmalloc(piece_bytes);
    uint32_t width = h->token_bytes;
    uint64_t payload = h->n_tokens * width, at = 0, bad = UINT64_MAX;
    bool read_ok = true, write_ok = true;
    while (at < payload && read_ok && write_ok && bad == UINT64_MAX) {
        size_t n = payload - at < piece_bytes ? (size_t)(payload - at) : piece_bytes;
        read_ok = pread_exact(fd, piece, n, SHARD_HEADER_BYTES + at);
        if (!read_ok) break;
        uint64_t count = n / width, k = first_token_at_or_above(piece, width, count, h->vocab_size);
        if (k < count) bad = at / width + k;
        // The bytes as they are (tokens at the file's width, checked above), past the writer's
        // buffer, which stays empty.
        write_ok = write_payload(w, piece, (size_t)(k * width));
        w->header.n_tokens += k;
        at += n;
        if (progress) progress(ctx, n);
    }
    int e = errno;
    shard_upgrade_result r = SHARD_UPGRADED;
    uint64_t sum = 0;
    if (!read_ok) {
        snprintf(why, why_bytes, "read error: %s", strerror(e));
        r = SHARD_FAILED;
    } else if (!write_ok) {
        snprintf(why, why_bytes, "cannot write '%s.tmp': %s", real, strerror(e));
        r = SHARD_FAILED;
    } else if (bad != UINT64_MAX) {
        uint8_t t[4];
        if (!pread_exact(fd, t, width, SHARD_HEADER_BYTES + bad * width) ||
            !payload_checksum(fd, h, piece, piece_bytes, &sum)) {
            snprintf(why, why_bytes, "read error: %s", strerror(errno));
            r = SHARD_FAILED;
        } else if (sum != h->payload_xxh64) {
            snprintf(why, why_bytes, "payload checksum mismatch (corrupt data)");
            r = SHARD_REFUSED;
        } else {
            snprintf(why, why_bytes, "token %u at index %llu is not below its vocab_size %u", token_at(t, width, 0),
                     (unsigned long long)bad, h->vocab_size);
            r = SHARD_REFUSED;
        }
    } else if (xxh64_digest(&w->hash) != h->payload_xxh64) {   // of every byte written
        snprintf(why, why_bytes, "payload checksum mismatch (corrupt data)");
        r = SHARD_REFUSED;
    } else {
        // The owner and group kept where this user may set them (root; a member of the group),
        // then the permission bits (a chown clears set-id bits): the file's owner could be left
        // without access to a copy that root wrote as its own.
        if (fchown(w->fd, st->st_uid, st->st_gid) != 0) (void)!fchown(w->fd, (uid_t)-1, st->st_gid);
        if (fchmod(w->fd, st->st_mode & 07777) != 0) {
            snprintf(why, why_bytes, "cannot set the permissions of '%s.tmp': %s", real, strerror(errno));
            r = SHARD_FAILED;
        }
    }
    free(piece);
    if (r != SHARD_UPGRADED) {
        shard_writer_abort(w);
    } else {
        // The name is checked again right before the rename, after the fsync (seconds for a
        // large shard): a file another program put there meanwhile was replaced by the old
        // data's copy.
        name_check c = {real, st, false};
        if (!writer_close_if(w, still_names, &c)) {
            r = c.replaced ? SHARD_REFUSED : SHARD_FAILED;
            if (c.replaced)
                snprintf(why, why_bytes, "another program wrote a new file under its name while it was read; that one "
                         "is left as it is");
            else
                snprintf(why, why_bytes, "cannot finish '%s.tmp' (write, fsync or rename over the shard): %s", real,
                         strerror(errno));
        }
    }
    return r;
}

shard_upgrade_result shard_upgrade(const char *path, shard_header *h, void (*progress)(void *ctx, uint64_t bytes),
                                   void *ctx, char *why, size_t why_bytes) {
    memset(h, 0, sizeof *h);
    // A link's target is the shard: renaming over the link would put a copy in its place.
    char *real = realpath(path, NULL);
    if (!real) {
        snprintf(why, why_bytes, "cannot open: %s", strerror(errno));
        return SHARD_REFUSED;
    }
    // Opened, locked, and the name checked to lead to it still: an upgrade that held the lock
    // before may have renamed its new file over the name since this open.
    int fd = -1;
    struct stat st;
    for (int tries = 0; fd < 0; tries++) {
        fd = open(real, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0) {
            snprintf(why, why_bytes, "cannot open: %s", strerror(errno));
            if (fd >= 0) close(fd);
            free(real);
            return SHARD_REFUSED;
        }
        // Where the file system has no flock (ENOLCK, EINVAL, EBADF: some NFS mounts), unlocked.
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
            // A file of several hard links: the holder may be upgrading another of its names,
            // which takes the version 2 file alone. This name waits for it and is upgraded after
            // (it was left "to the other process" and stayed version 1, the command saying 0).
            if (st.st_nlink > 1 && flock(fd, LOCK_EX) == 0) {
                if (!names_file(real, &st) && tries < 3) {
                    close(fd);
                    fd = -1;
                }
                continue;
            }
            close(fd);
            free(real);
            snprintf(why, why_bytes, "another process holds its lock (upgrading it)");
            return SHARD_BUSY;
        }
        if (!names_file(real, &st) && tries < 3) {
            close(fd);
            fd = -1;
        }
    }
    shard_upgrade_result r = SHARD_CURRENT;
    if (!read_header_fd(fd, h, why, why_bytes)) {
        r = SHARD_REFUSED;
    } else if (h->version == 1) {
        shard_writer *w = shard_writer_open(real, h->vocab_size, h->doc_token);
        if (!w) {
            snprintf(why, why_bytes, "cannot create '%s.tmp': %s", real, strerror(errno));
            r = SHARD_FAILED;
        } else {
            // The width the file has: the writer's own for its vocab_size, unless another
            // program wrote it (uint32 tokens of a small vocabulary); the payload bytes, and so
            // its checksum, are the same only at the same width.
            w->header.token_bytes = h->token_bytes;
            r = upgrade_payload(fd, real, &st, h, w, progress, ctx, why, why_bytes);
        }
    }
    close(fd);   // and with it the lock
    free(real);
    return r;
}

#endif  // DATALOADER_IMPLEMENTATION
