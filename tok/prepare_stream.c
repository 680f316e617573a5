// tok/prepare_stream.c — plain, gzip and zstd input files as byte streams (see
// tok/prepare_stream.h).
//
// A compressed stream owns an input buffer of the file's bytes (in[in_pos, in_bytes) not yet
// consumed) and decodes from it straight into the caller's buffer. The compressed offset of
// an error is the file bytes read minus those still unconsumed: where the decoder stopped.
//
// End of data is checked, not assumed: a gzip member must reach its trailer (CRC-32 and
// length, which zlib checks), and what follows a member must be another member; a zstd file
// must end at a frame boundary (ZSTD_decompressStream returned 0), and a frame's checksum,
// when it has one (the zstd tool writes one by default), is checked by libzstd. A decoder
// that makes no progress with the file at its end is a truncated file. The offset of corrupt
// gzip data is where zlib stopped; libzstd does not say, so it gets at most 16 KiB per call
// and an error is reported at the end of that window: the bad bytes lie in the 16 KiB before.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tok/prepare_stream.h"
#include "llmc/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef HAVE_ZSTD
#include <zstd.h>
#endif

#define COMPRESSED_BLOCK_BYTES ((size_t)1 << 20)

struct prep_stream {
    char *path;
    prep_compression compression;
    int fd;
    bool file_eof;
    uint64_t file_bytes_read;   // read from fd
    unsigned char *in;          // compressed bytes, in[in_pos, in_bytes) not yet decoded
    size_t in_pos, in_bytes;
    bool between_members;       // gzip: a member ended; another or the end of the file follows
    bool at_frame_end;          // zstd: the last call ended a frame (or none began yet)
#ifdef HAVE_ZLIB
    z_stream z;
#endif
#ifdef HAVE_ZSTD
    ZSTD_DStream *zstd;
#endif
};

// ---------------------------------------------------------------- names

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

prep_compression prep_compression_of(const char *path) {
    static const char *const archives[] = {".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tar"};
    static const char *const unknown[] = {".bz2", ".xz", ".lz4", ".lzma", ".lz", ".zip", ".7z", ".br", ".Z", ".rar"};
    for (size_t i = 0; i < sizeof archives / sizeof *archives; i++)
        if (ends_with(path, archives[i]))
            fail("%s: a tar archive, not a text or JSONL file ---> HINT: unpack it and give prepare the directory", path);
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++)
        if (ends_with(path, unknown[i]))
            fail("%s: prepare cannot read %s files (it reads plain, .gz and .zst files) ---> HINT: decompress it, "
                 "or recompress it with gzip or zstd",
                 path, unknown[i]);
    if (ends_with(path, ".gz")) return PREP_GZIP;
    if (ends_with(path, ".zst") || ends_with(path, ".zstd")) return PREP_ZSTD;
    return PREP_PLAIN;
}

const char *prep_compression_suffix(prep_compression c) {
    return c == PREP_GZIP ? ".gz" : c == PREP_ZSTD ? ".zst" : "";
}

void prep_compression_require(prep_compression c, const char *path) {
#ifndef HAVE_ZLIB
    if (c == PREP_GZIP)
        fail("%s: a gzip file, and this train_gpt was built without zlib ---> HINT: install zlib "
             "(Debian: apt-get install zlib1g-dev) and rebuild (make)",
             path);
#endif
#ifndef HAVE_ZSTD
    if (c == PREP_ZSTD)
        fail("%s: a zstd file, and this train_gpt was built without libzstd ---> HINT: install libzstd "
             "(Debian: apt-get install libzstd-dev) and rebuild (make)",
             path);
#endif
    (void)c;
    (void)path;
}

// ---------------------------------------------------------------- open, close

prep_stream *prep_stream_open(const char *path, prep_compression c) {
    prep_compression_require(c, path);
    prep_stream *s = xcalloc(1, sizeof *s);
    s->path = xstrdup(path);
    s->compression = c;
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) fail("cannot read input %s: %s", path, strerror(errno));
    if (c == PREP_PLAIN) return s;
    s->in = xmalloc(COMPRESSED_BLOCK_BYTES);
#ifdef HAVE_ZLIB
    if (c == PREP_GZIP) {
        // 16 + 15: gzip headers only (not raw deflate or zlib), a window of up to 32 KiB.
        int rc = inflateInit2(&s->z, 16 + 15);
        if (rc != Z_OK) fail("%s: cannot start zlib: %s", path, s->z.msg ? s->z.msg : zError(rc));
    }
#endif
#ifdef HAVE_ZSTD
    if (c == PREP_ZSTD) {
        s->zstd = ZSTD_createDStream();
        if (!s->zstd) fail("%s: cannot start libzstd: out of memory", path);
        // Accept windows up to 2 GiB: corpora compressed with zstd --long=31 exist.
        size_t rc = ZSTD_DCtx_setParameter(s->zstd, ZSTD_d_windowLogMax, sizeof(size_t) == 8 ? 31 : 30);
        if (ZSTD_isError(rc)) fail("%s: cannot set up libzstd: %s", path, ZSTD_getErrorName(rc));
        s->at_frame_end = true;
    }
#endif
    return s;
}

void prep_stream_close(prep_stream *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
#ifdef HAVE_ZLIB
    if (s->compression == PREP_GZIP) inflateEnd(&s->z);
#endif
#ifdef HAVE_ZSTD
    if (s->compression == PREP_ZSTD) ZSTD_freeDStream(s->zstd);
#endif
    free(s->in);
    free(s->path);
    free(s);
}

uint64_t prep_stream_file_bytes(const prep_stream *s) {
    return s->file_bytes_read - (uint64_t)(s->in_bytes - s->in_pos);
}

// ---------------------------------------------------------------- reading

// read(2) until `bytes` or the end of the file; fails on an error.
static size_t read_file(prep_stream *s, void *buf, size_t bytes) {
    size_t done = 0;
    while (done < bytes && !s->file_eof) {
        ssize_t got = read(s->fd, (char *)buf + done, bytes - done);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) fail("cannot read input %s: %s", s->path, strerror(errno));
        if (got == 0) s->file_eof = true;
        done += (size_t)got;
    }
    s->file_bytes_read += done;
    return done;
}

#if defined(HAVE_ZLIB) || defined(HAVE_ZSTD)
// Refills the compressed buffer once it is used up.
static void refill(prep_stream *s) {
    if (s->in_pos < s->in_bytes || s->file_eof) return;
    s->in_pos = 0;
    s->in_bytes = read_file(s, s->in, COMPRESSED_BLOCK_BYTES);
}

static void fail_truncated(const prep_stream *s, const char *format, const char *unit) {
    if (s->file_bytes_read == 0) fail("%s: empty file, not %s data", s->path, format);
    fail("%s: truncated %s data: the file ends at byte %llu inside a %s", s->path, format,
         (unsigned long long)s->file_bytes_read, unit);
}
#endif

#ifdef HAVE_ZLIB
static size_t read_gzip(prep_stream *s, unsigned char *out, size_t bytes) {
    size_t done = 0;
    while (done < bytes) {
        refill(s);
        if (s->between_members) {
            if (s->in_pos == s->in_bytes) break;   // the end of the file after a whole member
            if (s->in[s->in_pos] != 0x1f)
                fail("%s: corrupt gzip data at byte %llu: what follows the gzip member before it is not gzip", s->path,
                     (unsigned long long)prep_stream_file_bytes(s));
            inflateReset(&s->z);
            s->between_members = false;
        }
        s->z.next_in = s->in + s->in_pos;
        s->z.avail_in = (uInt)(s->in_bytes - s->in_pos);
        s->z.next_out = out + done;
        size_t room = bytes - done;
        s->z.avail_out = room > (1u << 30) ? (1u << 30) : (uInt)room;
        uInt avail_out = s->z.avail_out;
        int rc = inflate(&s->z, Z_NO_FLUSH);
        s->in_pos = s->in_bytes - s->z.avail_in;
        done += avail_out - s->z.avail_out;
        if (rc == Z_STREAM_END) s->between_members = true;
        else if (rc == Z_BUF_ERROR && s->in_pos == s->in_bytes) {
            if (s->file_eof) fail_truncated(s, "gzip", "gzip member");   // needs input that is not there
        } else if (rc == Z_MEM_ERROR) {
            fail("%s: out of memory in zlib", s->path);
        } else if (rc != Z_OK) {
            fail("%s: corrupt gzip data at byte %llu: %s", s->path, (unsigned long long)prep_stream_file_bytes(s),
                 s->z.msg ? s->z.msg : rc == Z_NEED_DICT ? "needs a preset dictionary" : zError(rc));
        }
    }
    return done;
}
#endif

#ifdef HAVE_ZSTD
#define ZSTD_STEP_BYTES ((size_t)16 << 10)

static size_t read_zstd(prep_stream *s, unsigned char *out, size_t bytes) {
    size_t done = 0;
    while (done < bytes) {
        refill(s);
        if (s->at_frame_end && s->in_pos == s->in_bytes && s->file_eof) {
            if (s->file_bytes_read == 0) fail_truncated(s, "zstd", "frame");
            break;   // the end of the file at a frame boundary
        }
        // At most ZSTD_STEP_BYTES per call: libzstd does not say where in its input an error
        // lies, so the window handed over bounds it.
        size_t window = s->in_bytes - s->in_pos < ZSTD_STEP_BYTES ? s->in_bytes - s->in_pos : ZSTD_STEP_BYTES;
        ZSTD_inBuffer in = {s->in, s->in_pos + window, s->in_pos};
        ZSTD_outBuffer o = {out, bytes, done};
        size_t rc = ZSTD_decompressStream(s->zstd, &o, &in);
        if (ZSTD_isError(rc))
            fail("%s: corrupt zstd data at byte %llu: %s", s->path,
                 (unsigned long long)(prep_stream_file_bytes(s) + window), ZSTD_getErrorName(rc));
        bool progress = in.pos != s->in_pos || o.pos != done;
        s->in_pos = in.pos;
        done = o.pos;
        s->at_frame_end = rc == 0;
        if (!progress && !s->at_frame_end && s->in_pos == s->in_bytes && s->file_eof)
            fail_truncated(s, "zstd", "frame");
    }
    return done;
}
#endif

size_t prep_stream_read(prep_stream *s, void *buf, size_t bytes) {
    switch (s->compression) {
#ifdef HAVE_ZLIB
    case PREP_GZIP: return read_gzip(s, buf, bytes);
#endif
#ifdef HAVE_ZSTD
    case PREP_ZSTD: return read_zstd(s, buf, bytes);
#endif
    case PREP_PLAIN: return read_file(s, buf, bytes);
    default: fail("internal error: %s: compression %d is not built in", s->path, (int)s->compression);
    }
}
