// llmc/shard.h — how the ranks of an FSDP group split the model (issue #14).
//
// The model is cut into units, each a contiguous range of the parameter table's flat layout:
// unit 0 the embedding, unit 1 + l layer l, the last unit the final norm and (untied) the LM
// head. Every rank holds 1/ranks of every unit: with piece = ceil(numel / ranks), rank r
// holds the unit's values [r·piece, (r + 1)·piece), the last pieces padded with zeros. A
// rank's local buffers (weights, gradients, both AdamW moments, DiLoCo's outer state) are its
// pieces of every unit in unit order, piece after piece: local_numel floats each.
//
// Gathering a unit is an all-gather of the pieces (ranks·piece floats: the unit whole, then
// the padding); its gradient is a reduce-scatter of a ranks·piece buffer. With one rank a
// piece is the whole unit, there is no padding, and the local layout is the table's layout:
// every function here then reads and writes exactly the whole-model buffers.
#ifndef TRAIN_GPT_SHARD_H
#define TRAIN_GPT_SHARD_H

#include <stdint.h>

#include "llmc/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int first, count;      // tensors [first, first + count) of the table
    int64_t start, numel;  // their range in the flat layout
    int64_t piece;         // each rank's share: ceil(numel / ranks)
    int64_t local;         // where this rank's piece starts in the local buffers
} shard_unit;

typedef struct {
    const param_table *table;
    int rank, ranks;
    int count;             // units: n_layer + 2
    shard_unit *units;
    int64_t local_numel;   // Σ piece over the units
    int64_t max_unit;      // the largest ranks·piece (a gathered unit's buffer)
} shard_map;

void shard_map_build(shard_map *s, const param_table *t, int rank, int ranks);
void shard_map_free(shard_map *s);

// The unit that holds a tensor of this kind in this layer (-1: outside the blocks); a tied
// head is the embedding's unit.
int shard_unit_of(const shard_map *s, param_kind kind, int layer);
// The part of unit u this rank holds: flat-layout range [*lo, *hi) (empty for a unit with
// fewer values than ranks·piece reaches).
void shard_owned(const shard_map *s, int u, int64_t *lo, int64_t *hi);

// Calls fn for every stretch of this rank's values inside the flat-layout range [g0, g1), in
// order: the stretch's flat offset, its offset in the local buffers, and its length.
typedef void (*shard_visit_fn)(void *ctx, int64_t global, int64_t local, int64_t count);
void shard_visit(const shard_map *s, int64_t g0, int64_t g1, shard_visit_fn fn, void *ctx);

// local ← this rank's values of a whole-model buffer (padding zeroed), and the reverse
// (only the values this rank holds are written).
void shard_take(const shard_map *s, const float *whole, float *local);
void shard_put(const shard_map *s, const float *local, float *whole);

// Normal(0, init_std) for matrices, 1 for gains: the values param_init gives, this rank's
// part only. Each tensor's stream is drawn whole (at most one tensor held at a time).
void shard_param_init(const shard_map *s, float *local, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif
