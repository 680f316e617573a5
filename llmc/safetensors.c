// llmc/safetensors.c — fp32 safetensors writer and validating reader (see llmc/safetensors.h).
#include "llmc/safetensors.h"
#include "llmc/checksum.h"
#include "llmc/common.h"
#include "llmc/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Little-endian hosts only (x86-64, aarch64, ppc64le): the tensor bytes are written as
// they are in memory.
_Static_assert(sizeof(float) == 4, "fp32 must be 4 bytes");

char *safetensors_header(const st_tensor_out *tensors, int count, const char *const *meta_keys,
                         const char *const *meta_values, int meta_count, size_t *header_bytes) {
    strbuf json = {0};
    sb_append(&json, "{");
    if (meta_count > 0) {
        sb_append(&json, "\"__metadata__\":{");
        for (int i = 0; i < meta_count; i++) {
            if (i) sb_append(&json, ",");
            sb_json_string(&json, meta_keys[i]);
            sb_append(&json, ":");
            sb_json_string(&json, meta_values[i]);
        }
        sb_append(&json, "}");
    }
    uint64_t offset = 0;
    for (int i = 0; i < count; i++) {
        const st_tensor_out *t = &tensors[i];
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        if (meta_count > 0 || i > 0) sb_append(&json, ",");
        sb_json_string(&json, t->name);
        sb_append(&json, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) sb_printf(&json, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        sb_printf(&json, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                  (unsigned long long)(offset + (uint64_t)numel * 4));
        offset += (uint64_t)numel * 4;
    }
    sb_append(&json, "}");
    while ((8 + json.length) % 8 != 0) sb_append(&json, " ");
    char *out = xmalloc(8 + json.length);
    for (int i = 0; i < 8; i++) out[i] = (char)(uint8_t)((uint64_t)json.length >> (8 * i));
    memcpy(out + 8, json.data, json.length);
    *header_bytes = 8 + json.length;
    sb_free(&json);
    return out;
}

bool safetensors_write(int fd, const st_tensor_out *tensors, int count, const char *const *meta_keys,
                       const char *const *meta_values, int meta_count, uint64_t *xxh64_out) {
    size_t header_bytes;
    char *header = safetensors_header(tensors, count, meta_keys, meta_values, meta_count, &header_bytes);
    xxh64_state h;
    xxh64_init(&h, 0);
    xxh64_update(&h, header, header_bytes);
    bool ok = write_exact(fd, header, header_bytes);
    free(header);
    for (int i = 0; ok && i < count; i++) {
        const st_tensor_out *t = &tensors[i];
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        // Write in pieces so a checksum pass and the write share the cache-warm bytes.
        const char *p = (const char *)t->data;
        size_t left = (size_t)numel * 4;
        while (ok && left > 0) {
            size_t n = left < (64u << 20) ? left : (64u << 20);
            xxh64_update(&h, p, n);
            ok = write_exact(fd, p, n);
            p += n;
            left -= n;
        }
    }
    *xxh64_out = xxh64_digest(&h);
    return ok;
}

static bool reject(char *why, size_t why_bytes, const char *msg) {
    snprintf(why, why_bytes, "%s", msg);
    return false;
}

static int compare_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

// By begin, then by end: a zero-size tensor at the offset where a non-empty one begins sorts
// first, so that the back-to-back check does not depend on qsort's order between them.
static int compare_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static bool parse_entry(const char *name, const json_value *v, uint64_t data_bytes, st_entry *e, char *why,
                        size_t why_bytes) {
    const json_value *dtype = json_get(v, "dtype"), *shape = json_get(v, "shape"), *offs = json_get(v, "data_offsets");
    if (v->type != JSON_OBJECT || !dtype || dtype->type != JSON_STRING || !shape || shape->type != JSON_ARRAY ||
        !offs || offs->type != JSON_ARRAY || offs->count != 2) {
        snprintf(why, why_bytes, "tensor '%s' has a malformed header entry", name);
        return false;
    }
    if (strcmp(dtype->string, "F32") != 0) {
        snprintf(why, why_bytes, "tensor '%s' has dtype %s; only F32 is supported", name, dtype->string);
        return false;
    }
    if (shape->count > 8) {
        snprintf(why, why_bytes, "tensor '%s' has too many dimensions", name);
        return false;
    }
    e->name = xstrdup(name);
    e->ndim = (int)shape->count;
    e->numel = 1;
    for (size_t d = 0; d < shape->count; d++) {
        const json_value *s = &shape->items[d];
        if (s->type != JSON_NUMBER || !s->is_integer || s->integer < 0 || s->integer > ((int64_t)1 << 40)) {
            snprintf(why, why_bytes, "tensor '%s' has a bad shape", name);
            return false;
        }
        e->shape[d] = s->integer;
        if (s->integer > 0 && e->numel > ((int64_t)1 << 40) / s->integer) {  // before the product could wrap
            snprintf(why, why_bytes, "tensor '%s' is implausibly large", name);
            return false;
        }
        e->numel *= s->integer;
        if (e->numel > ((int64_t)1 << 40)) {
            snprintf(why, why_bytes, "tensor '%s' is implausibly large", name);
            return false;
        }
    }
    for (int i = 0; i < 2; i++)
        if (offs->items[i].type != JSON_NUMBER || !offs->items[i].is_integer || offs->items[i].integer < 0) {
            snprintf(why, why_bytes, "tensor '%s' has bad data_offsets", name);
            return false;
        }
    e->begin = (uint64_t)offs->items[0].integer;
    e->end = (uint64_t)offs->items[1].integer;
    if (e->end < e->begin || e->end > data_bytes || e->end - e->begin != (uint64_t)e->numel * 4) {
        snprintf(why, why_bytes, "tensor '%s': data_offsets [%llu, %llu] do not match its shape or the file size",
                 name, (unsigned long long)e->begin, (unsigned long long)e->end);
        return false;
    }
    return true;
}

bool safetensors_open(const char *path, st_file *f, char *why, size_t why_bytes) {
    memset(f, 0, sizeof *f);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        snprintf(why, why_bytes, "cannot open: %s", strerror(errno));
        return false;
    }
    struct stat st;
    uint8_t len_bytes[8];
    if (fstat(f->fd, &st) != 0 || st.st_size < 8 || !pread_exact(f->fd, len_bytes, 8, 0)) {
        safetensors_close(f);
        return reject(why, why_bytes, "not a safetensors file (too short)");
    }
    uint64_t header_bytes = 0;
    for (int i = 0; i < 8; i++) header_bytes |= (uint64_t)len_bytes[i] << (8 * i);
    uint64_t file_bytes = (uint64_t)st.st_size;
    if (header_bytes < 2 || header_bytes > 100000000 || header_bytes > file_bytes - 8) {
        safetensors_close(f);
        return reject(why, why_bytes, "not a safetensors file (bad header length)");
    }
    char *text = xmalloc((size_t)header_bytes + 1);
    if (!pread_exact(f->fd, text, (size_t)header_bytes, 8)) {
        free(text);
        safetensors_close(f);
        return reject(why, why_bytes, "cannot read the safetensors header");
    }
    text[header_bytes] = '\0';
    size_t json_bytes = (size_t)header_bytes;
    while (json_bytes > 0 && text[json_bytes - 1] == ' ') json_bytes--;
    json_doc doc;
    if (!json_parse(text, json_bytes, &doc)) {
        snprintf(why, why_bytes, "safetensors header is not valid JSON (%s)", doc.error);
        free(text);
        safetensors_close(f);
        return false;
    }
    free(text);
    f->data_start = 8 + header_bytes;
    uint64_t data_bytes = file_bytes - f->data_start;
    bool ok = doc.root.type == JSON_OBJECT;
    if (!ok) reject(why, why_bytes, "safetensors header is not a JSON object");
    f->entries = xcalloc(doc.root.count + 1, sizeof *f->entries);
    for (size_t i = 0; ok && i < doc.root.count; i++) {
        const char *key = doc.root.keys[i];
        const json_value *v = &doc.root.items[i];
        if (strcmp(key, "__metadata__") == 0) {
            if (v->type != JSON_OBJECT) {
                ok = reject(why, why_bytes, "__metadata__ is not an object");
                break;
            }
            if (f->meta_keys) {  // JSON allows a key twice; a second one overflowed the first's arrays
                ok = reject(why, why_bytes, "__metadata__ appears twice");
                break;
            }
            f->meta_keys = xcalloc(v->count + 1, sizeof *f->meta_keys);
            f->meta_values = xcalloc(v->count + 1, sizeof *f->meta_values);
            for (size_t j = 0; j < v->count; j++) {
                if (v->items[j].type != JSON_STRING) {
                    ok = reject(why, why_bytes, "__metadata__ values must be strings");
                    break;
                }
                f->meta_keys[f->meta_count] = xstrdup(v->keys[j]);
                f->meta_values[f->meta_count] = xstrdup(v->items[j].string);
                f->meta_count++;
            }
            continue;
        }
        ok = parse_entry(key, v, data_bytes, &f->entries[f->count], why, why_bytes);
        if (f->entries[f->count].name) f->count++;
    }
    json_free(&doc);
    if (ok) {
        // The data section must be exactly the tensors, back to back.
        st_entry *sorted = xmalloc((size_t)(f->count + 1) * sizeof *sorted);
        memcpy(sorted, f->entries, (size_t)f->count * sizeof *sorted);
        qsort(sorted, (size_t)f->count, sizeof *sorted, compare_begin);
        uint64_t at = 0;
        for (int i = 0; ok && i < f->count; i++) {
            if (sorted[i].begin != at) ok = reject(why, why_bytes, "tensor data has a gap or an overlap");
            at = sorted[i].end;
        }
        if (ok && at != data_bytes) ok = reject(why, why_bytes, "file size does not match the tensors (truncated or padded)");
        // A name twice, found by sorting (a lookup per entry was quadratic: a header of 200k
        // tensors took a minute before its error).
        qsort(sorted, (size_t)f->count, sizeof *sorted, compare_name);
        for (int i = 1; ok && i < f->count; i++)
            if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
                snprintf(why, why_bytes, "tensor '%s' appears twice", sorted[i].name);
                ok = false;
            }
        free(sorted);
    }
    if (!ok) safetensors_close(f);
    return ok;
}

void safetensors_close(st_file *f) {
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->count; i++) free(f->entries[i].name);
    free(f->entries);
    for (int i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const st_entry *safetensors_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->entries[i].name, name) == 0) return &f->entries[i];
    return NULL;
}

const char *safetensors_meta(const st_file *f, const char *key) {
    for (int i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

bool safetensors_read(const st_file *f, const st_entry *e, float *out) {
    return pread_exact(f->fd, out, (size_t)(e->end - e->begin), f->data_start + e->begin);
}

bool safetensors_read_range(const st_file *f, const st_entry *e, int64_t first, int64_t count, float *out) {
    if (first < 0 || count < 0 || first + count > e->numel) return false;
    return pread_exact(f->fd, out, (size_t)count * 4, f->data_start + e->begin + (uint64_t)first * 4);
}
