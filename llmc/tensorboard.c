// llmc/tensorboard.c — TensorBoard event files (llmc/tensorboard.h has the format, byte for
// byte). Three layers: CRC32C, a protobuf encoder just big enough for the messages we write,
// and the writer, which builds one Event at a time in reused buffers and frames it as a
// TFRecord.
#include "llmc/tensorboard.h"
#include "llmc/common.h"
#include "llmc/fault.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ---------------------------------------------------------------- CRC32C

static uint32_t crc_table[256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_build(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(uint32_t crc, const void *data, size_t bytes) {
    pthread_once(&crc_table_once, crc_table_build);
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    for (size_t i = 0; i < bytes; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t tb_crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

// ---------------------------------------------------------------- protobuf encoding

// The field numbers we write, from TensorFlow's .proto files (names as there).
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5, EVENT_SESSION_LOG = 7 };
enum { SUMMARY_VALUE = 1 };
enum { VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2, VALUE_TENSOR = 8, VALUE_METADATA = 9 };
enum { TENSOR_DTYPE = 1, TENSOR_SHAPE = 2, TENSOR_STRING_VAL = 8 };
enum { METADATA_PLUGIN_DATA = 1, PLUGIN_DATA_PLUGIN_NAME = 1 };
enum { SESSION_LOG_STATUS = 1 };
enum { DT_STRING = 7, SESSION_START = 1 };
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

typedef struct {
    uint8_t *data;
    size_t length, capacity;
} pb_buf;

static void pb_put(pb_buf *b, const void *bytes, size_t n) {
    if (n == 0) return;
    if (b->length + n > b->capacity) {
        size_t cap = b->capacity ? b->capacity : 512;
        while (cap < b->length + n) cap *= 2;
        b->data = (uint8_t *)xrealloc(b->data, cap);
        b->capacity = cap;
    }
    memcpy(b->data + b->length, bytes, n);
    b->length += n;
}

static void pb_varint(pb_buf *b, uint64_t v) {
    uint8_t out[10];
    size_t n = 0;
    do {
        out[n] = (uint8_t)(v & 0x7F);
        v >>= 7;
        if (v) out[n] |= 0x80;
        n++;
    } while (v);
    pb_put(b, out, n);
}

static void pb_little_endian(pb_buf *b, uint64_t v, int bytes) {
    uint8_t out[8];
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
    pb_put(b, out, (size_t)bytes);
}

static void pb_key(pb_buf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_field_varint(pb_buf *b, int field, uint64_t v) {
    pb_key(b, field, WIRE_VARINT);
    pb_varint(b, v);
}

static void pb_field_double(pb_buf *b, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_key(b, field, WIRE_FIXED64);
    pb_little_endian(b, bits, 8);
}

static void pb_field_float(pb_buf *b, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_key(b, field, WIRE_FIXED32);
    pb_little_endian(b, bits, 4);
}

static void pb_field_bytes(pb_buf *b, int field, const void *data, size_t n) {
    pb_key(b, field, WIRE_BYTES);
    pb_varint(b, n);
    pb_put(b, data, n);
}

static void pb_field_string(pb_buf *b, int field, const char *s) { pb_field_bytes(b, field, s, strlen(s)); }

// An embedded message: its bytes were built in inner.
static void pb_field_message(pb_buf *b, int field, const pb_buf *inner) {
    pb_field_bytes(b, field, inner->data, inner->length);
}

// ---------------------------------------------------------------- the writer

struct tb_writer {
    int fd;                      // O_APPEND: a record goes whole or not at all (append_whole)
    int64_t records;             // records tried (the test hook's count)
    char *path;
    bool broken;                 // a write failed: said once, nothing more is written
    pb_buf text, inner, value, summary, event, record;  // scratch, reused by every event
};

static double unix_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The host name as it goes into the file name: characters other than letters, digits,
// '-', '_' and '.' become '_' (a name is never a path).
static void file_name_host(char *out, size_t bytes) {
    if (gethostname(out, bytes) != 0) out[0] = '\0';
    out[bytes - 1] = '\0';
    for (char *c = out; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.') *c = '_';
    if (!out[0]) snprintf(out, bytes, "localhost");
}

// text as valid UTF-8: each maximal ill-formed subsequence becomes U+FFFD (Unicode's
// recommended practice, and Python's errors="replace"). TensorBoard's text plugin decodes
// strictly, and a sample can end inside a character or hold any bytes.
static void put_valid_utf8(pb_buf *b, const char *text) {
    static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD};
    const uint8_t *p = (const uint8_t *)text;
    while (*p) {
        int bad = 0, n = utf8_char_length(p, &bad);
        if (n > 0) pb_put(b, p, (size_t)n);
        else pb_put(b, replacement, sizeof replacement);
        p += n > 0 ? n : bad;
    }
}

// Frames w->event as a TFRecord and hands it to the kernel in one write.
static void write_record(tb_writer *w) {
    pb_buf *r = &w->record;
    r->length = 0;
    uint64_t n = w->event.length;
    pb_little_endian(r, n, 8);
    pb_little_endian(r, tb_crc32c_masked(tb_crc32c(0, r->data, 8)), 4);
    pb_put(r, w->event.data, w->event.length);
    pb_little_endian(r, tb_crc32c_masked(tb_crc32c(0, w->event.data, w->event.length)), 4);
    // A record cut short (a full disk) is cut back off: readers stop at a truncated record.
    // Test hook tb_enospc:N: record N of this file meets a full disk after half its bytes.
    bool torn;
    size_t fail_after = fault_requested("tb_enospc", w->records++) ? r->length / 2 : SIZE_MAX;
    int err = append_whole(w->fd, r->data, r->length, fail_after, &torn);
    if (err) {
        warn("tensorboard: cannot write to '%s': %s; no more TensorBoard events in this run (metrics.jsonl goes on)%s",
             w->path, strerror(err), torn ? "; the record cut short could not be cut back off" : "");
        w->broken = true;
    }
}

static void event_begin(tb_writer *w, int64_t step) {
    w->event.length = 0;
    pb_field_double(&w->event, EVENT_WALL_TIME, unix_seconds());
    pb_field_varint(&w->event, EVENT_STEP, (uint64_t)step);
}

tb_writer *tb_open(const char *out_dir) {
    if (!make_dirs(out_dir)) fail("out_dir: cannot create '%s': %s", out_dir, strerror(errno));
    char host[256];
    file_name_host(host, sizeof host);
    long long now = (long long)time(NULL);
    tb_writer *w = (tb_writer *)xcalloc(1, sizeof *w);
    size_t cap = strlen(out_dir) + strlen(host) + 64;
    w->path = (char *)xmalloc(cap);
    // O_EXCL: a run never appends to another run's file, even one started in the same second.
    for (int n = 0;; n++) {
        if (n == 0) snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s", out_dir, now, host);
        else snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s.%d", out_dir, now, host, n);
        w->fd = open(w->path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd >= 0) break;
        if (errno != EEXIST || n == 999) fail("tensorboard: cannot create '%s': %s", w->path, strerror(errno));
    }
    w->event.length = 0;
    pb_field_double(&w->event, EVENT_WALL_TIME, unix_seconds());
    pb_field_string(&w->event, EVENT_FILE_VERSION, "brain.Event:2");
    write_record(w);
    return w;
}

void tb_close(tb_writer *w) {
    if (!w) return;
    if (close(w->fd) != 0 && !w->broken) warn("tensorboard: cannot write to '%s': %s", w->path, strerror(errno));
    free(w->text.data);
    free(w->inner.data);
    free(w->value.data);
    free(w->summary.data);
    free(w->event.data);
    free(w->record.data);
    free(w->path);
    free(w);
}

const char *tb_path(const tb_writer *w) { return w ? w->path : ""; }

void tb_scalars(tb_writer *w, int64_t step, const tb_value *values, int count) {
    if (!w || w->broken) return;
    w->summary.length = 0;
    for (int i = 0; i < count; i++) {
        double v = values[i].value;
        if (!isfinite(v) || fabs(v) > FLT_MAX) continue;  // float32 would make it infinite
        w->value.length = 0;
        pb_field_string(&w->value, VALUE_TAG, values[i].tag);
        pb_field_float(&w->value, VALUE_SIMPLE_VALUE, (float)v);
        pb_field_message(&w->summary, SUMMARY_VALUE, &w->value);
    }
    if (w->summary.length == 0) return;
    event_begin(w, step);
    pb_field_message(&w->event, EVENT_SUMMARY, &w->summary);
    write_record(w);
}

void tb_scalar(tb_writer *w, const char *tag, int64_t step, double value) {
    tb_value v = {tag, value};
    tb_scalars(w, step, &v, 1);
}

void tb_text(tb_writer *w, const char *tag, int64_t step, const char *text) {
    if (!w || w->broken) return;
    w->value.length = 0;
    pb_field_string(&w->value, VALUE_TAG, tag);
    w->inner.length = 0;  // TensorProto: a scalar string
    pb_field_varint(&w->inner, TENSOR_DTYPE, DT_STRING);
    pb_field_bytes(&w->inner, TENSOR_SHAPE, NULL, 0);
    w->text.length = 0;
    put_valid_utf8(&w->text, text);
    pb_field_message(&w->inner, TENSOR_STRING_VAL, &w->text);
    pb_field_message(&w->value, VALUE_TENSOR, &w->inner);
    w->inner.length = 0;  // PluginData, then SummaryMetadata around it
    pb_field_string(&w->inner, PLUGIN_DATA_PLUGIN_NAME, "text");
    w->summary.length = 0;
    pb_field_message(&w->summary, METADATA_PLUGIN_DATA, &w->inner);
    pb_field_message(&w->value, VALUE_METADATA, &w->summary);
    w->summary.length = 0;
    pb_field_message(&w->summary, SUMMARY_VALUE, &w->value);
    event_begin(w, step);
    pb_field_message(&w->event, EVENT_SUMMARY, &w->summary);
    write_record(w);
}

void tb_restart(tb_writer *w, int64_t step) {
    if (!w || w->broken) return;
    w->inner.length = 0;
    pb_field_varint(&w->inner, SESSION_LOG_STATUS, SESSION_START);
    event_begin(w, step);
    pb_field_message(&w->event, EVENT_SESSION_LOG, &w->inner);
    write_record(w);
}
