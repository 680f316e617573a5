// llmc/safetensors.h — reading and writing the safetensors format (Hugging Face), fp32 only.
//
// Layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length
// n, then n bytes of JSON (padded with spaces so the data starts 8-byte aligned), then the
// raw little-endian tensor bytes. The JSON maps each tensor name to
// {"dtype":"F32","shape":[...],"data_offsets":[begin,end]} (offsets relative to the data)
// and may hold "__metadata__": a string → string map.
//
// The reader validates what a corrupt or hostile file could get wrong: header length
// against the file size, strict JSON, dtype, shape × 4 == end − begin, offsets inside the
// data section, no overlaps, no gaps, and no bytes after the last tensor.
#ifndef TRAIN_GPT_SAFETENSORS_H
#define TRAIN_GPT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[2];
} st_tensor_out;

// Writes a whole safetensors file to fd (already open, positioned at 0). The XXH64 of
// every byte written goes to *xxh64_out. false on an I/O error (errno set).
bool safetensors_write(int fd, const st_tensor_out *tensors, int count, const char *const *meta_keys,
                       const char *const *meta_values, int meta_count, uint64_t *xxh64_out);

// The bytes before the data of such a file (the length field, the JSON, its padding; the
// tensors' data pointers are not used): tensor i's data then starts at header_bytes +
// Σ_{j<i} 4·numel_j. Caller frees. (FSDP's ranks write their pieces at those offsets.)
char *safetensors_header(const st_tensor_out *tensors, int count, const char *const *meta_keys,
                         const char *const *meta_values, int meta_count, size_t *header_bytes);

typedef struct {
    char *name;
    int ndim;
    int64_t shape[8];
    int64_t numel;
    uint64_t begin, end;   // relative to the data section
} st_entry;

typedef struct {
    int fd;
    uint64_t data_start;
    int count;
    st_entry *entries;
    int meta_count;
    char **meta_keys, **meta_values;
} st_file;

// Opens and validates. false with a one-line reason in why.
bool safetensors_open(const char *path, st_file *f, char *why, size_t why_bytes);
void safetensors_close(st_file *f);
const st_entry *safetensors_find(const st_file *f, const char *name);
const char *safetensors_meta(const st_file *f, const char *key);
// Reads one tensor's floats into out (numel floats). false on an I/O error.
bool safetensors_read(const st_file *f, const st_entry *e, float *out);
// Reads values [first, first + count) of one tensor. false on an I/O error or a range outside it.
bool safetensors_read_range(const st_file *f, const st_entry *e, int64_t first, int64_t count, float *out);

#ifdef __cplusplus
}
#endif

#endif
