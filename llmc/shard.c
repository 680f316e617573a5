// llmc/shard.c — the FSDP split of the model into units and pieces (see llmc/shard.h).
#include "llmc/shard.h"
#include "llmc/common.h"
#include "llmc/rng.h"

#include <stdlib.h>
#include <string.h>

// The unit of tensor i: 0 for the embedding, 1 + layer inside the blocks, the last for what
// follows the blocks.
static int unit_of_tensor(const param_table *t, int i) {
    const param_info *p = &t->params[i];
    if (p->kind == P_EMBED) return 0;
    if (p->layer >= 0) return 1 + p->layer;
    return (int)t->cfg.n_layer + 1;
}

void shard_map_build(shard_map *s, const param_table *t, int rank, int ranks) {
    CHECK(ranks >= 1 && rank >= 0 && rank < ranks);
    memset(s, 0, sizeof *s);
    s->table = t;
    s->rank = rank;
    s->ranks = ranks;
    s->count = (int)t->cfg.n_layer + 2;
    s->units = xcalloc((size_t)s->count, sizeof *s->units);
    for (int u = 0; u < s->count; u++) s->units[u].first = -1;
    for (int i = 0; i < t->count; i++) {
        shard_unit *u = &s->units[unit_of_tensor(t, i)];
        const param_info *p = &t->params[i];
        if (u->first < 0) {
            u->first = i;
            u->start = p->offset;
        }
        CHECK(u->start + u->numel == p->offset);  // a unit's tensors are contiguous in the table
        u->count++;
        u->numel += p->numel;
    }
    for (int u = 0; u < s->count; u++) {
        shard_unit *x = &s->units[u];
        CHECK(x->first >= 0);
        x->piece = ceil_div(x->numel, ranks);
        x->local = s->local_numel;
        s->local_numel += x->piece;
        s->max_unit = max_i64(s->max_unit, x->piece * ranks);
    }
}

void shard_map_free(shard_map *s) {
    free(s->units);
    memset(s, 0, sizeof *s);
}

int shard_unit_of(const shard_map *s, param_kind kind, int layer) {
    if (kind == P_LM_HEAD && s->table->cfg.tie_embeddings) kind = P_EMBED;
    if (kind == P_EMBED) return 0;
    return layer >= 0 ? 1 + layer : s->count - 1;
}

void shard_owned(const shard_map *s, int u, int64_t *lo, int64_t *hi) {
    const shard_unit *x = &s->units[u];
    int64_t a = min_i64(x->numel, (int64_t)s->rank * x->piece), b = min_i64(x->numel, a + x->piece);
    *lo = x->start + a;
    *hi = x->start + b;
}

void shard_visit(const shard_map *s, int64_t g0, int64_t g1, shard_visit_fn fn, void *ctx) {
    for (int u = 0; u < s->count; u++) {
        int64_t lo, hi;
        shard_owned(s, u, &lo, &hi);
        int64_t a = max_i64(lo, g0), b = min_i64(hi, g1);
        if (a < b) fn(ctx, a, s->units[u].local + (a - lo), b - a);
    }
}

typedef struct {
    const float *from;
    float *to;
    bool to_local;
} copy_ctx;

static void copy_stretch(void *ctx, int64_t global, int64_t local, int64_t count) {
    copy_ctx *c = ctx;
    if (c->to_local) memcpy(c->to + local, c->from + global, (size_t)count * sizeof(float));
    else memcpy(c->to + global, c->from + local, (size_t)count * sizeof(float));
}

void shard_take(const shard_map *s, const float *whole, float *local) {
    memset(local, 0, (size_t)s->local_numel * sizeof(float));
    copy_ctx c = {whole, local, true};
    shard_visit(s, 0, s->table->numel, copy_stretch, &c);
}

void shard_put(const shard_map *s, const float *local, float *whole) {
    copy_ctx c = {local, whole, false};
    shard_visit(s, 0, s->table->numel, copy_stretch, &c);
}

typedef struct {
    const shard_map *s;
    float *local;
    uint64_t seed;
} init_ctx;

// Tensor i's values at flat offsets [global, global + count): its stream from the start, the
// values before the stretch drawn and dropped (param_init's exact values, in any split).
static void init_tensor_stretch(const init_ctx *c, int i, int64_t global, int64_t local, int64_t count) {
    const param_info *p = &c->s->table->params[i];
    float *w = c->local + local;
    if (p->ndim == 1) {
        for (int64_t j = 0; j < count; j++) w[j] = 1.0f;
        return;
    }
    float std = (float)c->s->table->cfg.init_std;
    rng_state r;
    rng_seed(&r, c->seed, (uint64_t)i + 1);
    for (int64_t j = p->offset; j < global; j++) (void)rng_normal(&r);
    for (int64_t j = 0; j < count; j++) w[j] = (float)rng_normal(&r) * std;
}

void shard_param_init(const shard_map *s, float *local, uint64_t seed) {
    const param_table *t = s->table;
    memset(local, 0, (size_t)s->local_numel * sizeof(float));
    init_ctx c = {s, local, seed};
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        for (int u = 0; u < s->count; u++) {
            int64_t lo, hi;
            shard_owned(s, u, &lo, &hi);
            int64_t a = max_i64(lo, p->offset), b = min_i64(hi, p->offset + p->numel);
            if (a < b) init_tensor_stretch(&c, i, a, s->units[u].local + (a - lo), b - a);
        }
    }
}
