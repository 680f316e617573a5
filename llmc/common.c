// llmc/common.c — fatal errors, checked allocation and I/O helpers, time. See llmc/common.h.
#include "llmc/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char log_tag[32];      // "rank 3", "replica 1": which process of a launch says it
static char console_prefix[32];
static bool log_notes = true;

void log_set_rank(int rank, bool notes) {
    snprintf(log_tag, sizeof log_tag, "rank %d", rank);
    log_notes = notes;
}

void log_set_replica(int replica) {
    snprintf(log_tag, sizeof log_tag, "replica %d", replica);
    snprintf(console_prefix, sizeof console_prefix, "replica %d | ", replica);
    log_notes = true;
}

const char *console_tag(void) { return console_prefix; }

void banner(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("train_gpt | %s", console_prefix);
    vprintf(fmt, ap);
    va_end(ap);
}

static void vprint_line(const char *prefix, const char *fmt, va_list ap) {
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    // One line per message: the whole point is that a log grep finds it.
    for (char *p = line; *p; p++)
        if (*p == '\n') *p = ' ';
    if (log_tag[0]) fprintf(stderr, "train_gpt: %s: %s%s\n", log_tag, prefix, line);
    else fprintf(stderr, "train_gpt: %s%s\n", prefix, line);
    fflush(stderr);
}

// One error line per process: when two threads fail at once (e.g. the connections to two hubs
// refused for the same misconfiguration), the second waits for the first to exit. The thread
// already failing (fail called again on its way out) goes on.
static atomic_bool failing = false;
static _Thread_local bool this_thread_failing = false;

static NORETURN void vfail_with_status(int status, const char *fmt, va_list ap) {
    if (atomic_exchange(&failing, true) && !this_thread_failing)
        for (;;) pause();
    this_thread_failing = true;
    vprint_line("error: ", fmt, ap);
    fflush(stdout);
    exit(status);
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail_with_status(1, fmt, ap);
}

void fail_with_status(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail_with_status(status, fmt, ap);
}

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_line("warning: ", fmt, ap);
    va_end(ap);
}

void note(const char *fmt, ...) {
    if (!log_notes) return;
    va_list ap;
    va_start(ap, fmt);
    vprint_line("", fmt, ap);
    va_end(ap);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail("out of memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fail("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fail("out of memory reallocating %zu bytes", bytes);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

float *alloc_floats(size_t count) {
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        fail("out of memory allocating %zu floats (%.2f GiB)", count, bytes / 1073741824.0);
    memset(p, 0, bytes);
    return p;
}

bool read_exact(int fd, void *buf, size_t bytes) {
    char *p = buf;
    while (bytes > 0) {
        ssize_t n = read(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;
            return false;
        }
        p += n;
        bytes -= (size_t)n;
    }
    return true;
}

bool write_exact(int fd, const void *buf, size_t bytes) {
    const char *p = buf;
    while (bytes > 0) {
        ssize_t n = write(fd, p, bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        bytes -= (size_t)n;
    }
    return true;
}

int append_whole(int fd, const void *buf, size_t bytes, size_t fail_after, bool *torn) {
    *torn = false;
    struct stat st;
    off_t before = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : -1;
    const char *p = buf;
    size_t done = 0;
    int err = 0;
    while (done < bytes) {
        size_t want = bytes - done;
        if (fail_after != SIZE_MAX) {
            if (done >= fail_after) {
                err = ENOSPC;
                break;
            }
            if (want > fail_after - done) want = fail_after - done;
        }
        ssize_t n = write(fd, p + done, want);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = n < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)n;
    }
    if (done == bytes) return 0;
    if (done > 0 && (before < 0 || ftruncate(fd, before) != 0)) *torn = true;
    return err;
}

// pread or pwrite until all bytes moved; a short end of file is EIO.
static bool positioned_io(int fd, char *p, size_t bytes, uint64_t offset, bool writing) {
    while (bytes > 0) {
        ssize_t n = writing ? pwrite(fd, p, bytes, (off_t)offset) : pread(fd, p, bytes, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;
            return false;
        }
        p += n;
        bytes -= (size_t)n;
        offset += (uint64_t)n;
    }
    return true;
}

bool pwrite_exact(int fd, const void *buf, size_t bytes, uint64_t offset) {
    return positioned_io(fd, (char *)buf, bytes, offset, true);
}

bool pread_exact(int fd, void *buf, size_t bytes, uint64_t offset) { return positioned_io(fd, buf, bytes, offset, false); }

// A pipe or a device (`<(cat x.conf)`, /dev/null) read to its end, up to 1 GiB; closes fd.
static char *read_stream_or_null(int fd, size_t *bytes_out) {
    size_t cap = 1 << 16, bytes = 0, limit = (size_t)1 << 30;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (bytes == cap) {
            if (cap >= limit) {
                free(buf);
                close(fd);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            buf = xrealloc(buf, cap + 1);
        }
        ssize_t n = read(fd, buf + bytes, cap - bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            errno = e;
            return NULL;
        }
        if (n == 0) break;
        bytes += (size_t)n;
    }
    close(fd);
    buf[bytes] = '\0';
    if (bytes_out) *bytes_out = bytes;
    return buf;
}

char *read_file_or_null(const char *path, size_t *bytes_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st = {0};   // mode 0 (not a directory) if fstat fails
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
        close(fd);
        errno = e;
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) return read_stream_or_null(fd, bytes_out);
    size_t bytes = (size_t)st.st_size;
    char *buf = xmalloc(bytes + 1);
    if (!read_exact(fd, buf, bytes)) {
        int e = errno;
        free(buf);
        close(fd);
        errno = e;
        return NULL;
    }
    close(fd);
    buf[bytes] = '\0';
    if (bytes_out) *bytes_out = bytes;
    return buf;
}

bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool make_dirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return false;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return false;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return false;
    if (!dir_exists(buf)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

bool fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = fsync(fd) == 0;
    close(fd);
    return ok;
}

double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *format_count(double n, char *buf, size_t bytes) {
    if (n >= 1e9) snprintf(buf, bytes, "%.2fB", n / 1e9);
    else if (n >= 1e6) snprintf(buf, bytes, "%.2fM", n / 1e6);
    else if (n >= 1e3) snprintf(buf, bytes, "%.2fK", n / 1e3);
    else snprintf(buf, bytes, "%.0f", n);
    return buf;
}

const char *format_bytes(uint64_t n, char *buf, size_t bytes) {
    if (n >= (1ull << 30)) snprintf(buf, bytes, "%.2f GiB", (double)n / 1073741824.0);
    else if (n >= (1ull << 20)) snprintf(buf, bytes, "%.2f MiB", (double)n / 1048576.0);
    else if (n >= 1024) snprintf(buf, bytes, "%.1f KiB", (double)n / 1024.0);
    else snprintf(buf, bytes, "%llu B", (unsigned long long)n);
    return buf;
}

const char *format_duration(double seconds, char *buf, size_t bytes) {
    if (!(seconds >= 0) || seconds > 1e9) {
        snprintf(buf, bytes, "?");
        return buf;
    }
    long s = (long)(seconds + 0.5);
    if (s >= 86400)
        snprintf(buf, bytes, "%ldd%02ldh", s / 86400, s % 86400 / 3600);
    else if (s >= 3600)
        snprintf(buf, bytes, "%ldh%02ldm", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        snprintf(buf, bytes, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, bytes, "%lds", s);
    return buf;
}

// Plain decimal, as a number is written: an optional '-', then a digit or '.' and a digit, and no
// hex. strtoll and strtod also take leading blanks, a '+' and (strtod) "0x1p-10", which a value
// from the command line ('--n_layer " 2"') could carry unseen.
bool plain_decimal(const char *text) {
    const char *d = text[0] == '-' ? text + 1 : text;
    return ((d[0] >= '0' && d[0] <= '9') || (d[0] == '.' && d[1] >= '0' && d[1] <= '9')) && !strpbrk(text, "xX");
}

static bool secret_blank(char c) { return c == '\n' || c == '\r' || c == ' ' || c == '\t'; }

// A regular file of at most SECRET_MAX_BYTES: a FIFO without a writer blocked the start for
// ever, and /dev/zero was read until memory ran out. Blanks at either end are not the secret
// (leading newlines counted toward the 16 bytes).
#define SECRET_MAX_BYTES 65536
uint8_t *read_secret_file(const char *path, const char *what, size_t *bytes) {
    struct stat st;
    if (stat(path, &st) != 0) fail("%s: cannot read '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        fail("%s: '%s' is not a regular file; a secret is a file of 16 or more bytes (e.g. openssl rand -hex 32 > "
             "FILE; chmod 600 FILE)", what, path);
    if (st.st_size > SECRET_MAX_BYTES)
        fail("%s: '%s' holds %lld bytes; a secret is at most %d (e.g. openssl rand -hex 32)", what, path,
             (long long)st.st_size, SECRET_MAX_BYTES);
    size_t n = 0;
    char *text = read_file_or_null(path, &n);
    if (!text) fail("%s: cannot read '%s': %s", what, path, strerror(errno));
    size_t first = 0;
    while (first < n && secret_blank(text[first])) first++;
    while (n > first && secret_blank(text[n - 1])) n--;
    n -= first;
    memmove(text, text + first, n);
    if (n < 16) fail("%s: '%s' holds %zu bytes; use at least 16 (e.g. openssl rand -hex 32)", what, path, n);
    if (st.st_mode & 077) warn("%s: '%s' can be read by other users (chmod 600 it)", what, path);
    *bytes = n;
    return (uint8_t *)text;
}

int utf8_char_length(const unsigned char *p, int *bad) {
    unsigned c = p[0];
    int need;                       // continuation bytes after the lead; -1: not a lead byte
    unsigned lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;   // no overlong forms
        if (c == 0xED) hi = 0x9F;   // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
    } else {
        need = -1;
    }
    int ok = 0;  // continuation bytes that fit (the text's NUL never does)
    while (need > 0 && ok < need && p[1 + ok] >= (ok == 0 ? lo : 0x80) && p[1 + ok] <= (ok == 0 ? hi : 0xBF)) ok++;
    if (need >= 0 && ok == need) return need + 1;
    *bad = 1 + ok;
    return 0;
}

