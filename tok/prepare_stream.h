// tok/prepare_stream.h — the bytes of one input file of `train_gpt prepare`, read as a stream
// whether the file is plain, gzip (.gz) or zstd (.zst).
//
// A compressed file is never decompressed whole: each read inflates just enough to fill the
// caller's buffer, so a corpus file of any size costs two fixed buffers (and zstd's window).
// gzip files may hold several members (cat a.gz b.gz, pigz, bgzip), zstd files several
// frames (cat a.zst b.zst, zstd -T), skippable frames included: the text is their
// concatenation. zlib and libzstd are optional at build time (HAVE_ZLIB, HAVE_ZSTD, found by
// tok/tok.mk): a build without one refuses such files when they are listed, before any work.
//
// Corrupt or truncated data is a user error: one line naming the file and the compressed
// byte offset where decoding stopped, e.g.
//   train_gpt: error: web/00017.jsonl.gz: corrupt gzip data at byte 81920: invalid distance too far back
//   train_gpt: error: web/00018.jsonl.zst: truncated zstd data: the file ends at byte 65536 inside a frame
#ifndef TRAIN_GPT_PREPARE_STREAM_H
#define TRAIN_GPT_PREPARE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PREP_PLAIN, PREP_GZIP, PREP_ZSTD } prep_compression;

// By the file name's suffix: .gz is gzip, .zst zstd, anything else plain. A name that ends in
// a compression or archive suffix prepare cannot read (.bz2, .xz, .zip, .tar, ...) fails
// with a one-line error naming the file.
prep_compression prep_compression_of(const char *path);
// The suffix a compression adds (".gz", ".zst"; "" for plain).
const char *prep_compression_suffix(prep_compression c);
// Fails (one line naming the file and what to install) if this build cannot read c.
void prep_compression_require(prep_compression c, const char *path);

typedef struct prep_stream prep_stream;
// Opens path; fails (one line) if it cannot be opened. Keeps a copy of path for messages.
prep_stream *prep_stream_open(const char *path, prep_compression c);
// Up to `bytes` bytes of (decompressed) text into buf; fewer only at the end of the file; 0
// once the text is exhausted. Fails (one line) on a read error or bad compressed data.
size_t prep_stream_read(prep_stream *s, void *buf, size_t bytes);
// Bytes of the file itself decoded so far (the compressed offset; for progress and errors).
uint64_t prep_stream_file_bytes(const prep_stream *s);
void prep_stream_close(prep_stream *s);

#ifdef __cplusplus
}
#endif

#endif
