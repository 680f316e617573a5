// llmc/json.c — strict JSON reader and text-building helpers (see llmc/json.h).
#include "llmc/json.h"
#include "llmc/common.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

typedef struct {
    const char *p, *end, *start;
    json_doc *doc;
    int depth;
} parser;

static bool parse_error(parser *ps, const char *what) {
    snprintf(ps->doc->error, sizeof ps->doc->error, "%s at byte %zu", what, (size_t)(ps->p - ps->start));
    return false;
}

static void skip_space(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static bool parse_value(parser *ps, json_value *out);

static void put_utf8(strbuf *sb, uint32_t cp) {
    char b[5] = {0};
    if (cp < 0x80) {
        b[0] = (char)cp;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
    } else {
        b[0] = (char)(0xF0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
    }
    sb_append(sb, b);
}

static bool parse_hex4(parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4) return parse_error(ps, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return parse_error(ps, "bad \\u escape");
    }
    *out = v;
    return true;
}

static bool parse_string(parser *ps, char **out) {
    ps->p++;  // opening quote
    strbuf sb = {0};
    sb_append(&sb, "");
    while (true) {
        if (ps->p >= ps->end) {
            sb_free(&sb);
            return parse_error(ps, "unterminated string");
        }
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            sb_free(&sb);
            return parse_error(ps, "control character in string");
        }
        if (c != '\\') {
            const char *run = ps->p;
            while (ps->p < ps->end && *ps->p != '"' && *ps->p != '\\' && (unsigned char)*ps->p >= 0x20) ps->p++;
            size_t n = (size_t)(ps->p - run);
            if (sb.length + n + 1 > sb.capacity) {
                sb.capacity = (sb.length + n + 1) * 2;
                sb.data = xrealloc(sb.data, sb.capacity);
            }
            memcpy(sb.data + sb.length, run, n);
            sb.length += n;
            sb.data[sb.length] = '\0';
            continue;
        }
        ps->p++;
        if (ps->p >= ps->end) {
            sb_free(&sb);
            return parse_error(ps, "unterminated escape");
        }
        char e = *ps->p++;
        const char *simple = NULL;
        switch (e) {
        case '"': simple = "\""; break;
        case '\\': simple = "\\"; break;
        case '/': simple = "/"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'n': simple = "\n"; break;
        case 'r': simple = "\r"; break;
        case 't': simple = "\t"; break;
        case 'u': {
            uint32_t cp;
            if (!parse_hex4(ps, &cp)) {
                sb_free(&sb);
                return false;
            }
            if (cp >= 0xD800 && cp < 0xDC00) {
                uint32_t lo;
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    sb_free(&sb);
                    return parse_error(ps, "lone surrogate");
                }
                ps->p += 2;
                if (!parse_hex4(ps, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    sb_free(&sb);
                    return parse_error(ps, "bad surrogate pair");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                sb_free(&sb);
                return parse_error(ps, "lone surrogate");
            }
            if (cp == 0) {
                sb_free(&sb);
                return parse_error(ps, "NUL in string");
            }
            put_utf8(&sb, cp);
            continue;
        }
        default:
            sb_free(&sb);
            return parse_error(ps, "bad escape");
        }
        sb_append(&sb, simple);
    }
    *out = sb.data;
    return true;
}

static bool parse_number(parser *ps, json_value *out) {
    const char *s = ps->p;
    const char *q = s;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end || !(*q >= '0' && *q <= '9')) return parse_error(ps, "bad number");
    if (*q == '0') q++;
    else
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    bool integral = true;
    if (q < ps->end && *q == '.') {
        integral = false;
        q++;
        if (q >= ps->end || !(*q >= '0' && *q <= '9')) return parse_error(ps, "bad number");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = false;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || !(*q >= '0' && *q <= '9')) return parse_error(ps, "bad number");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    size_t n = (size_t)(q - s);
    char buf[64];
    if (n >= sizeof buf) return parse_error(ps, "number too long");
    memcpy(buf, s, n);
    buf[n] = '\0';
    out->type = JSON_NUMBER;
    out->number = strtod(buf, NULL);
    if (integral) {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno == 0) {
            out->is_integer = true;
            out->integer = v;
        }
    }
    ps->p = q;
    return true;
}

static bool match_word(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return false;
    ps->p += n;
    return true;
}

static bool parse_container(parser *ps, json_value *out, bool is_object) {
    if (++ps->depth > 64) return parse_error(ps, "nesting too deep");
    ps->p++;
    out->type = is_object ? JSON_OBJECT : JSON_ARRAY;
    size_t capacity = 0;
    skip_space(ps);
    char close = is_object ? '}' : ']';
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return true;
    }
    while (true) {
        if (out->count == capacity) {
            capacity = capacity ? capacity * 2 : 8;
            out->items = xrealloc(out->items, capacity * sizeof *out->items);
            if (is_object) out->keys = xrealloc(out->keys, capacity * sizeof *out->keys);
        }
        json_value *item = &out->items[out->count];
        memset(item, 0, sizeof *item);
        if (is_object) {
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != '"') return parse_error(ps, "expected a key");
            if (!parse_string(ps, &out->keys[out->count])) return false;
            out->count++;  // key owned from here, so json_free releases it on error
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':') return parse_error(ps, "expected ':'");
            ps->p++;
            if (!parse_value(ps, item)) return false;
        } else {
            out->count++;
            if (!parse_value(ps, item)) return false;
        }
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            break;
        }
        return parse_error(ps, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    ps->depth--;
    return true;
}

static bool parse_value(parser *ps, json_value *out) {
    memset(out, 0, sizeof *out);
    skip_space(ps);
    if (ps->p >= ps->end) return parse_error(ps, "unexpected end");
    switch (*ps->p) {
    case '{': return parse_container(ps, out, true);
    case '[': return parse_container(ps, out, false);
    case '"':
        out->type = JSON_STRING;
        return parse_string(ps, &out->string);
    case 't':
        if (!match_word(ps, "true")) return parse_error(ps, "bad literal");
        out->type = JSON_BOOL;
        out->boolean = true;
        return true;
    case 'f':
        if (!match_word(ps, "false")) return parse_error(ps, "bad literal");
        out->type = JSON_BOOL;
        return true;
    case 'n':
        if (!match_word(ps, "null")) return parse_error(ps, "bad literal");
        out->type = JSON_NULL;
        return true;
    default: return parse_number(ps, out);
    }
}

static void free_value(json_value *v) {
    free(v->string);
    for (size_t i = 0; i < v->count; i++) {
        free_value(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

bool json_parse(const char *text, size_t bytes, json_doc *doc) {
    memset(doc, 0, sizeof *doc);
    parser ps = {text, text + bytes, text, doc, 0};
    if (!parse_value(&ps, &doc->root)) {
        free_value(&doc->root);
        return false;
    }
    skip_space(&ps);
    if (ps.p != ps.end) {
        free_value(&doc->root);
        return parse_error(&ps, "trailing characters");
    }
    return true;
}

void json_free(json_doc *doc) { free_value(&doc->root); }

const json_value *json_get(const json_value *object, const char *key) {
    if (!object || object->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0) return &object->items[i];
    return NULL;
}

static void sb_reserve(strbuf *sb, size_t extra) {
    if (sb->length + extra + 1 <= sb->capacity) return;
    size_t cap = sb->capacity ? sb->capacity : 256;
    while (cap < sb->length + extra + 1) cap *= 2;
    sb->data = xrealloc(sb->data, cap);
    sb->capacity = cap;
}

void sb_append(strbuf *sb, const char *text) {
    size_t n = strlen(text);
    sb_reserve(sb, n);
    memcpy(sb->data + sb->length, text, n + 1);
    sb->length += n;
}

void sb_printf(strbuf *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    sb_reserve(sb, (size_t)n);
    vsnprintf(sb->data + sb->length, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    sb->length += (size_t)n;
}

// escape: the JSON escapes; valid: ill-formed UTF-8 becomes U+FFFD (else the bytes as they are).
static void json_string(strbuf *sb, const char *text, bool valid) {
    sb_append(sb, "\"");
    for (const unsigned char *p = (const unsigned char *)text; *p;) {
        switch (*p) {
        case '"': sb_append(sb, "\\\""); break;
        case '\\': sb_append(sb, "\\\\"); break;
        case '\n': sb_append(sb, "\\n"); break;
        case '\r': sb_append(sb, "\\r"); break;
        case '\t': sb_append(sb, "\\t"); break;
        default:
            if (*p < 0x20) {
                sb_printf(sb, "\\u%04x", *p);
            } else if (*p < 0x80 || !valid) {
                char c[2] = {(char)*p, 0};
                sb_append(sb, c);
            } else {
                int bad = 0, n = utf8_char_length(p, &bad);
                if (n > 0) sb_printf(sb, "%.*s", n, (const char *)p);
                else sb_append(sb, "\xEF\xBF\xBD");   // U+FFFD
                p += n > 0 ? n : bad;
                continue;
            }
        }
        p++;
    }
    sb_append(sb, "\"");
}

void sb_json_string(strbuf *sb, const char *text) { json_string(sb, text, true); }
void sb_json_string_bytes(strbuf *sb, const char *text) { json_string(sb, text, false); }

void sb_json_number(strbuf *sb, double value) {
    if (!isfinite(value)) {
        sb_append(sb, "null");
        return;
    }
    if (value == floor(value) && fabs(value) < 1e15) {
        sb_printf(sb, "%.0f", value);
        return;
    }
    // The shortest of %.15g..%.17g that reads back to the same double.
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, value);
        if (strtod(buf, NULL) == value) break;
    }
    sb_append(sb, buf);
}

void sb_free(strbuf *sb) {
    free(sb->data);
    memset(sb, 0, sizeof *sb);
}
