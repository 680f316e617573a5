// llmc/json.h — a small JSON reader and writer, for the few JSON texts train_gpt handles: the
// safetensors header, the model config in its metadata, checkpoint state and
// metrics.jsonl lines. The reader builds a tree of json_value nodes owned by one
// json_doc; it rejects anything that is not strict JSON (RFC 8259), nests at most 64
// deep, and says where it stopped.
#ifndef TRAIN_GPT_JSON_H
#define TRAIN_GPT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    bool boolean;
    double number;
    bool is_integer;      // the text was an integer that fits int64
    int64_t integer;
    char *string;         // JSON_STRING (NUL-terminated; may contain no NUL)
    size_t count;         // JSON_ARRAY / JSON_OBJECT
    json_value *items;    // array elements or object values
    char **keys;          // JSON_OBJECT keys, parallel to items
};

typedef struct {
    json_value root;
    char error[160];
} json_doc;

// Parses text[0..bytes); false with doc->error set on malformed input.
bool json_parse(const char *text, size_t bytes, json_doc *doc);
void json_free(json_doc *doc);
// Object member by key (first match), or NULL.
const json_value *json_get(const json_value *object, const char *key);

// A growing string for writing JSON and other text.
typedef struct {
    char *data;
    size_t length;
    size_t capacity;
} strbuf;

void sb_append(strbuf *sb, const char *text);
void sb_printf(strbuf *sb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
// Appends text as a quoted, escaped JSON string, valid UTF-8: each ill-formed sequence becomes
// U+FFFD (as Python's errors="replace"), so that any JSON reader takes it.
void sb_json_string(strbuf *sb, const char *text);
// The same with the bytes as they are: for text this program reads back itself and compares
// (a checkpoint's config, whose paths need not be UTF-8); json_parse takes it.
void sb_json_string_bytes(strbuf *sb, const char *text);
// Appends a double so that it reads back to the same bits (or null if not finite).
void sb_json_number(strbuf *sb, double value);
void sb_free(strbuf *sb);

#ifdef __cplusplus
}
#endif

#endif
