// llmc/common.h — what every file of train_gpt needs: fatal errors that name their cause,
// checked allocation and I/O, wall-clock time, and a few small integer helpers.
//
// Errors a user can cause (config, data, checkpoint, peers) go through fail(): one line on
// stderr, "train_gpt: error: ...", then exit(1). Internal invariants use CHECK(), which
// also names file:line because reaching it is a bug, not a user mistake.
#ifndef TRAIN_GPT_COMMON_H
#define TRAIN_GPT_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#define NORETURN __attribute__((noreturn))
#else
#define PRINTF_LIKE(f, a)
#define NORETURN
#endif

// One-line user-facing error, then exit(1).
NORETURN void fail(const char *fmt, ...) PRINTF_LIKE(1, 2);
// fail, with another exit status (the job scripts tell them apart: docs/slurm.md).
// EXIT_TEMPFAIL: a failure that another try may not meet (a rank of the job died or hangs, no
// progress): scripts/slurm/requeue.sh requeues it, up to MAX_FAILURES in a row.
#define EXIT_TEMPFAIL 75   // sysexits.h's EX_TEMPFAIL
NORETURN void fail_with_status(int status, const char *fmt, ...) PRINTF_LIKE(2, 3);
// Prints "train_gpt: warning: ..." and carries on.
void warn(const char *fmt, ...) PRINTF_LIKE(1, 2);
// A job of several ranks: errors and warnings name the rank; notes only where notes is true
// (rank 0 says what the job does, the others stay quiet unless something is wrong).
void log_set_rank(int rank, bool notes);
// Several DiLoCo replicas in one MPI job (diloco_transport = mpi): every line on stderr names
// the replica ("train_gpt: replica 1: ..."), notes included, and so do the step and outer lines
// on stdout (console_tag(): "replica 1 | ", else "").
void log_set_replica(int replica);
const char *console_tag(void);
// Prints "train_gpt | " and the line to stdout (what the run is, its plan and its memory): with
// several DiLoCo replicas in one MPI job each says whose ("train_gpt | replica 1 | model: ...").
void banner(const char *fmt, ...) PRINTF_LIKE(1, 2);
// Prints "train_gpt: ..." to stderr (progress and notices; stdout stays for step lines).
void note(const char *fmt, ...) PRINTF_LIKE(1, 2);

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) fail("internal error at %s:%d: %s", __FILE__, __LINE__, #cond); \
    } while (0)

void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t bytes);
char *xstrdup(const char *s);
// 64-byte aligned, zeroed; free with free().
float *alloc_floats(size_t count);

// Whole-file and exact-length I/O. The *_or_null/_ok variants report failure to the caller
// (who knows what the file is for and can say so); errno is left set.
bool read_exact(int fd, void *buf, size_t bytes);
bool write_exact(int fd, const void *buf, size_t bytes);
bool pread_exact(int fd, void *buf, size_t bytes, uint64_t offset);
bool pwrite_exact(int fd, const void *buf, size_t bytes, uint64_t offset);
// Appends bytes to fd (opened O_APPEND) whole or not at all: after a failed or short write (a
// full disk, a file size limit) the file is cut back to its length before, so a log never holds
// the front of a record that the rest of a later one would join. fail_after: a test hook's full
// disk after that many of the bytes (SIZE_MAX in a real run). Returns 0, or the errno (ENOSPC
// for a write that took nothing); *torn: the part written could not be cut back off.
int append_whole(int fd, const void *buf, size_t bytes, size_t fail_after, bool *torn);
// Reads a whole file into a NUL-terminated buffer; NULL on failure (errno set).
char *read_file_or_null(const char *path, size_t *bytes_out);
// A shared secret (DiLoCo's diloco_secret_file, the relay's --secret_file): the file's
// bytes without trailing whitespace, at least 16 of them, warning when others can read the
// file. `what` names the setting in the one-line error. Caller wipes and frees.
uint8_t *read_secret_file(const char *path, const char *what, size_t *bytes);
bool file_exists(const char *path);
bool dir_exists(const char *path);
// mkdir -p; false on failure (errno set).
bool make_dirs(const char *path);
// fsync of a directory so that a rename inside it is durable.
bool fsync_dir(const char *path);

double wall_seconds(void);
// 14.53B, 121.19M, 7.21K into buf.
const char *format_count(double n, char *buf, size_t bytes);
// "2.86 MiB", "1.50 GiB", "12.0 KiB", "512 B" into buf.
const char *format_bytes(uint64_t n, char *buf, size_t bytes);
// "1h02m", "3m10s", "12s" into buf.
const char *format_duration(double seconds, char *buf, size_t bytes);
// Whether text is a number as people write it (config values, command-line options): an
// optional '-', a digit or '.' and a digit first, no hex; the caller's strtod/strtol checks the rest.
bool plain_decimal(const char *text);

// The UTF-8 character at p (NUL-terminated text): its length in bytes (1-4) when it is well
// formed (no overlong forms, surrogates or code points above U+10FFFF), else 0 with *bad =
// the length of the maximal ill-formed subsequence there (at least 1), the bytes Unicode's
// recommended practice (and Python's errors="replace") turns into one U+FFFD.
int utf8_char_length(const unsigned char *p, int *bad);

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

#ifdef __cplusplus
}
#endif

#endif
