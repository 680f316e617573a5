// llmc/plan.c — the per-rank memory plan (llmc/plan.h).
#include "llmc/plan.h"

#include "llmc/common.h"
#include "llmc/shard.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

// The sum of the k largest whole-unit buffers (ranks·piece values each), leaving out unit `skip`
// (-1: none).
static int64_t largest_units(const shard_map *m, int k, int skip) {
    int64_t *sizes = xmalloc((size_t)m->count * sizeof *sizes), sum = 0;
    for (int u = 0; u < m->count; u++) sizes[u] = u == skip ? 0 : m->units[u].piece * m->ranks;
    for (int i = 0; i < k && i < m->count; i++) {  // k is 1 or 2: a partial selection
        int best = i;
        for (int u = i + 1; u < m->count; u++)
            if (sizes[u] > sizes[best]) best = u;
        int64_t t = sizes[i];
        sizes[i] = sizes[best];
        sizes[best] = t;
        sum += sizes[i];
    }
    free(sizes);
    return sum;
}

// The units are gathered and reduced as llmc/shard.h and cpu/backend.c do it:
//   weights: the unit in use and, with prefetch, the next one — or, without resharding, every
//            unit from its forward to its backward (the whole model) plus none more;
//   grads:   the unit whose backward runs, and the one being reduce-scattered with its
//            all-to-all's receive buffer (another ranks·piece) and its piece of the sum; with
//            tied embeddings the embedding's gradient on top, from the head's backward (first)
//            to the embedding's (last).
// Taking the largest units makes it a bound: the true peak depends on which units meet.
rank_memory plan_rank_memory(const param_table *t, plan_split s, int64_t activation_bytes) {
    rank_memory m = {0};
    int ranks = s.ranks > 0 ? s.ranks : 1;
    shard_map map;
    shard_map_build(&map, t, 0, ranks);
    m.weights = map.local_numel * 4;
    m.grads = map.local_numel * 4;
    m.optimizer = map.local_numel * 8;
    int64_t weight_bytes = s.gpu ? 2 : 4;
    if (ranks == 1) {
        m.gathered_weights = s.gpu ? t->numel * 2 : 0;  // the GPU's bf16 copy; the CPU reads in place
    } else {
        int64_t held = s.reshard ? largest_units(&map, s.prefetch ? 2 : 1, -1) : map.local_numel * ranks;
        m.gathered_weights = held * weight_bytes;
        int tied = t->cfg.tie_embeddings ? shard_unit_of(&map, P_EMBED, -1) : -1;
        int64_t biggest = largest_units(&map, 1, tied), piece = ceil_div(biggest, ranks);
        int64_t held_grads = largest_units(&map, 2, tied) + biggest + piece;
        if (tied >= 0) held_grads += map.units[tied].piece * ranks;
        m.gathered_grads = held_grads * 4;
    }
    m.activations = activation_bytes;
    m.total = m.weights + m.grads + m.optimizer + m.gathered_weights + m.gathered_grads + m.activations;
    shard_map_free(&map);
    return m;
}

void plan_describe(const rank_memory *m, char *out, size_t out_bytes) {
    bool small = m->total < ((int64_t)1 << 30);
    const double u = small ? 1048576.0 : 1073741824.0;
    const char *unit = small ? "MiB" : "GiB";
    snprintf(out, out_bytes,
             "%.2f %s = %.2f weights + %.2f grads + %.2f AdamW (this rank's pieces) + %.2f gathered weights + "
             "%.2f unit gradients + %.2f activations",
             (double)m->total / u, unit, (double)m->weights / u, (double)m->grads / u, (double)m->optimizer / u,
             (double)m->gathered_weights / u, (double)m->gathered_grads / u, (double)m->activations / u);
}
