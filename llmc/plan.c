// llmc/plan.c — the per-rank memory plan (llmc/plan.h).
#include "llmc/plan.h"

#include "llmc/common.h"
#include "llmc/quant.h"
#include "llmc/shard.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
//            to the embedding's (last), or its own reduce-scatter at the end where that is more.
// Taking the largest units makes it a bound: the true peak depends on which units meet.
rank_memory plan_rank_memory(const param_table *t, plan_split s, activation_plan a, int64_t diloco_bytes) {
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
    } else if (s.gpu) {
        // What the CUDA backend allocates (train_gpt.cu's create; docs/fsdp.md "The GPU path"):
        // the bf16 copy of the pieces (what the gathers send); bf16 slots for whole units, one of
        // the largest unit and PLAN_GPU_GATHER_SLOTS − 1 of a layer's (without resharding one per
        // unit, each its size); the norm gains in fp32 (all of them, this rank's share of them,
        // and the all-gather's ranks copies); unit gradients: one slot of the largest unit (the
        // embedding's fp32 lookup borrows it during the forward), PLAN_GPU_GRAD_SLOTS − 1 of a
        // layer's; the receive buffer below. Exact but for 256-byte rounding and the small
        // tables (AdamW's chunks, the gains' stretches).
        int64_t layer_unit = 0, all_units = 0, gains = 0;
        for (int u = 0; u < map.count; u++) {
            int64_t whole = map.units[u].piece * ranks;
            all_units += whole;
            if (u >= 1 && u <= t->cfg.n_layer && whole > layer_unit) layer_unit = whole;
        }
        for (int i = 0; i < t->count; i++)
            if (t->params[i].ndim == 1) gains += t->params[i].numel;
        int64_t slots = s.reshard ? map.max_unit + (PLAN_GPU_GATHER_SLOTS - 1) * layer_unit : all_units;
        m.gathered_weights = map.local_numel * 2 + slots * 2 + gains * 4 * (ranks + 2);
        m.gathered_grads = (map.max_unit + (PLAN_GPU_GRAD_SLOTS - 1) * layer_unit) * 4;
    } else {
        int64_t held = s.reshard ? largest_units(&map, s.prefetch ? 2 : 1, -1) : map.local_numel * ranks;
        m.gathered_weights = held * weight_bytes;
        int tied = t->cfg.tie_embeddings ? shard_unit_of(&map, P_EMBED, -1) : -1;
        int64_t biggest = largest_units(&map, 1, tied), piece = ceil_div(biggest, ranks);
        int64_t held_grads = largest_units(&map, 2, tied) + biggest + piece;
        if (tied >= 0) {
            // Held from the head's backward on; and at the end its own reduce-scatter (the
            // gradient, the all-to-all's receive buffer, its piece), alone by then.
            int64_t embed = map.units[tied].piece * ranks;
            held_grads += embed;
            if (2 * embed + map.units[tied].piece > held_grads) held_grads = 2 * embed + map.units[tied].piece;
        }
        m.gathered_grads = held_grads * 4;
        if (s.copies > 1) {
            // HSDP: comm_allreduce of the copies' gradient pieces, in chunks of at most 2²² values
            // padded to a multiple of the copies, and this rank's 1/copies of a chunk (docs/fsdp.md's
            // "HSDP all-reduce" row; the plan left it out on the CPU).
            int64_t chunk = map.local_numel < ((int64_t)1 << 22) ? map.local_numel : (int64_t)1 << 22;
            int64_t per = ceil_div(chunk, s.copies);
            m.gathered_grads += (per * s.copies + per) * 4;
        }
    }
    if (s.gpu) {
        // The GPU's collective buffers: the all-to-all's receive buffer (the largest unit under
        // FSDP; with HSDP at least a chunk of the copies' all-reduce, min(P/N + copies, 2²⁶)
        // values, and its sum, 1/copies of it), room past the gradient pieces for that
        // all-reduce's padding, and the step's gathered norm partials and loss sums.
        int copies = s.copies > 1 ? s.copies : 1, most = ranks > copies ? ranks : copies;
        int64_t xfer = ranks > 1 ? map.max_unit : 0;
        if (copies > 1) {
            int64_t chunk = map.local_numel + copies < ((int64_t)1 << 26) ? map.local_numel + copies : (int64_t)1 << 26;
            if (chunk > xfer) xfer = chunk;
        }
        m.gathered_grads += copies * 4;
        if (xfer > 0)  // + every rank's 1024 norm partials (GRAD_NORM_BLOCKS) and 2 loss sums, doubles
            m.gathered_grads += xfer * 4 + (copies > 1 ? xfer / copies * 4 : 0) + (int64_t)most * (1024 + 2) * 8;
    }
    m.gpu = s.gpu;
    m.activations = a.activations;
    m.workspace = a.workspace;
    m.diloco = diloco_bytes;
    m.total = m.weights + m.grads + m.optimizer + m.gathered_weights + m.gathered_grads + m.activations + m.workspace +
              (s.gpu ? 0 : m.diloco);
    shard_map_free(&map);
    return m;
}

// The local values of each of diloco_fragments fragments (sizes[P]), chosen as diloco.c's
// split_fragments chooses them: whole layers, fragment p starting at the layer boundary nearest
// p·numel/P of the whole model's layout (the embedding with the first, the head with the last).
// Returns the largest.
static int64_t fragment_sizes(const shard_map *s, const param_table *t, int P, int64_t *sizes) {
    int L = (int)t->cfg.n_layer;
    int64_t *global = xmalloc((size_t)(L + 1) * sizeof *global), *local = xmalloc((size_t)(L + 1) * sizeof *local);
    for (int l = 0; l < L; l++) {
        global[l] = l == 0 ? 0 : s->units[1 + l].start;  // unit 1 + l is layer l
        local[l] = l == 0 ? 0 : s->units[1 + l].local;
    }
    global[L] = t->numel;
    local[L] = s->local_numel;
    int first = 0;
    int64_t largest = 0;
    for (int p = 1; p <= P; p++) {
        int next = L;
        if (p < P) {
            double target = (double)t->numel * p / P;
            next = first + 1;
            for (int l = next; l <= L - (P - p); l++)
                if (fabs((double)global[l] - target) < fabs((double)global[next] - target)) next = l;
        }
        sizes[p - 1] = local[next] - local[first];
        if (sizes[p - 1] > largest) largest = sizes[p - 1];
        first = next;
    }
    free(global);
    free(local);
    return largest;
}

// The largest of the P fragments; *share (when not NULL) gets the values of the mpi transport's
// packed downlink residual in its replica 0 (net/transport_mpi.c): of every fragment, the
// segments of S values that replica reduces (0, M, 2M, ...), each whole.
static int64_t largest_fragment(const shard_map *s, const param_table *t, int P, int64_t S, int64_t M,
                                int64_t *share) {
    int64_t *sizes = xmalloc((size_t)P * sizeof *sizes);
    int64_t largest = fragment_sizes(s, t, P, sizes);
    if (share) {
        *share = 0;
        for (int p = 0; p < P; p++) *share += ((sizes[p] + S - 1) / S + M - 1) / M * S;
    }
    free(sizes);
    return largest;
}

// The uplink codec of cfg (diloco.c's: the kind of diloco_quant, sparse with diloco_topk < 1)
// and the downlink's (dense: the uplink's kind, or bf16 / fp32 as diloco_downlink asks).
static void diloco_codecs(const train_config *cfg, quant_codec *up, quant_codec *down) {
    int k = quant_kind_from_name(cfg->diloco_quant);
    quant_kind kind = k < 0 ? QUANT_NONE : (quant_kind)k;
    *up = quant_codec_of(kind, kind == QUANT_NONE ? 0 : quant_topk_keep(cfg->diloco_topk, cfg->diloco_quant_block));
    *down = kind == QUANT_NONE || strcmp(cfg->diloco_downlink, "fp32") == 0 ? QUANT_NONE
            : strcmp(cfg->diloco_downlink, "bf16") == 0                   ? QUANT_BF16
                                                                          : kind;
}

// What diloco_open (diloco.c) and the transport (net/transport_tcp.c, transport_hubs.c,
// transport_mpi.c) allocate for a rank's n pieces:
//   θ, m, Δ: 4n each (m whatever diloco_outer_momentum: the buffer is always there);
//   the residual: 4n with diloco_error_feedback and a quantized uplink;
//   the join state: a 456-byte header and θ, m (8n) as a joining replica receives them (tcp:
//   allocated for the join and freed after it, so a peak at a join; a donor sends its θ and m
//   where they are; mpi: membership is fixed, nothing is received);
//   the payload: the largest fragment encoded in the uplink codec, held by diloco.c and (tcp)
//   copied by the transport; the mean: the largest fragment in the downlink codec, held by the
//   transport (tcp over several hubs: once per hub session and once whole); the mpi transport
//   reduces in every replica: its downlink residual (diloco_downlink_feedback with an encoded
//   mean: 4 B for each value of the segments it reduces, about 4n/M) and one segment of every
//   replica's payload.
//   diloco_transport = local (M replicas in one process, one rank): θ, m, Δ once; the residual
//   and the payload once per replica; the reducer's mean, one segment of fp32 scratch and, with
//   diloco_downlink_feedback and an encoded mean, its downlink residual (4n), as the hub keeps it.
static diloco_memory local_diloco_memory(const train_config *cfg, const param_table *t) {
    diloco_memory d = {0};
    shard_map map;
    shard_map_build(&map, t, 0, 1);
    int64_t block = cfg->diloco_quant_block, segment = quant_segment_values(block), M = cfg->diloco_replicas;
    int64_t n = map.local_numel, largest = largest_fragment(&map, t, (int)cfg->diloco_fragments, segment, M, NULL);
    shard_map_free(&map);
    quant_codec up, down;
    diloco_codecs(cfg, &up, &down);
    d.theta = d.momentum = d.delta = 4 * n;
    d.residual = cfg->diloco_error_feedback && up != QUANT_NONE ? M * 4 * n : 0;
    d.payload = M * (int64_t)quant_segmented_bytes(up, largest, block, segment);
    d.mean = (int64_t)quant_segmented_bytes(down, largest, block, segment) + 4 * segment +
             (cfg->diloco_downlink_feedback && down != QUANT_NONE ? 4 * n : 0);
    d.total = d.theta + d.momentum + d.delta + d.residual + d.payload + d.mean;
    return d;
}

int plan_replicas_in_process(const train_config *cfg) {
    bool local = cfg->diloco_replicas > 0 && strcmp(cfg->diloco_transport, "local") == 0;
    return local ? (int)cfg->diloco_replicas : 1;
}

diloco_memory plan_diloco_memory(const train_config *cfg, const param_table *t, int ranks) {
    diloco_memory d = {0};
    if (cfg->diloco_replicas <= 0) return d;
    if (strcmp(cfg->diloco_transport, "local") == 0) return local_diloco_memory(cfg, t);
    shard_map map;
    shard_map_build(&map, t, 0, ranks > 0 ? ranks : 1);
    int64_t block = cfg->diloco_quant_block, segment = quant_segment_values(block), share = 0;
    int64_t n = map.local_numel,
            largest = largest_fragment(&map, t, (int)cfg->diloco_fragments, segment, cfg->diloco_replicas, &share);
    shard_map_free(&map);
    quant_codec up, down;
    diloco_codecs(cfg, &up, &down);
    bool tcp = strcmp(cfg->diloco_transport, "tcp") == 0;
    d.theta = d.momentum = d.delta = 4 * n;
    d.residual = cfg->diloco_error_feedback && up != QUANT_NONE ? 4 * n : 0;
    d.join_state = tcp ? PLAN_STATE_HEADER_BYTES + 8 * n : 0;
    int64_t payload = (int64_t)quant_segmented_bytes(up, largest, block, segment);
    int64_t mean = (int64_t)quant_segmented_bytes(down, largest, block, segment);
    d.payload = tcp ? 2 * payload : payload;
    if (tcp) {
        bool hubs = strchr(cfg->diloco_rendezvous, ',') != NULL;
        d.mean = hubs ? 2 * mean : mean;
    } else {
        bool feedback = cfg->diloco_downlink_feedback && down != QUANT_NONE;
        d.mean = mean + (feedback ? 4 * share : 0) +
                 (int64_t)(cfg->diloco_replicas * quant_encoded_bytes(up, segment, block) +
                           quant_encoded_bytes(down, segment, block)) +
                 4 * segment;
    }
    d.total = d.theta + d.momentum + d.delta + d.residual + d.join_state + d.payload + d.mean;
    return d;
}

// What one replica of `ranks` ranks moves per outer step (every rank its own pieces, each
// fragment of each piece cut into segments): the encoded payloads up and the mean down in
// cfg's codecs, plus the framing of every segment's DATA frame. docs/diloco.md's recipes
// quote it.
diloco_traffic plan_diloco_traffic(const train_config *cfg, const param_table *t, int ranks) {
    diloco_traffic x = {0};
    if (cfg->diloco_replicas <= 0) return x;
    quant_codec up, down;
    diloco_codecs(cfg, &up, &down);
    int64_t block = cfg->diloco_quant_block, segment = quant_segment_values(block);
    int P = (int)cfg->diloco_fragments;
    int64_t *sizes = xmalloc((size_t)P * sizeof *sizes);
    int64_t *frag_up = xcalloc((size_t)P, sizeof *frag_up), *frag_down = xcalloc((size_t)P, sizeof *frag_down);
    if (ranks < 1) ranks = 1;
    for (int r = 0; r < ranks; r++) {
        shard_map map;
        shard_map_build(&map, t, r, ranks);
        fragment_sizes(&map, t, P, sizes);
        shard_map_free(&map);
        for (int p = 0; p < P; p++) {
            int64_t segments = (sizes[p] + segment - 1) / segment;
            int64_t up_bytes = (int64_t)quant_segmented_bytes(up, sizes[p], block, segment);
            int64_t down_bytes = (int64_t)quant_segmented_bytes(down, sizes[p], block, segment);
            x.payload_up += up_bytes;
            x.payload_down += down_bytes;
            x.framing += segments * PLAN_SEGMENT_FRAMING_BYTES;
            x.contribute += PLAN_CONTRIBUTE_FRAME_BYTES;
            frag_up[p] += up_bytes + segments * PLAN_SEGMENT_FRAMING_BYTES + PLAN_CONTRIBUTE_FRAME_BYTES;
            frag_down[p] += down_bytes + segments * PLAN_SEGMENT_FRAMING_BYTES;
        }
    }
    for (int p = 0; p < P; p++) {
        if (frag_up[p] > x.fragment_up) x.fragment_up = frag_up[p];
        if (frag_down[p] > x.fragment_down) x.fragment_down = frag_down[p];
    }
    free(frag_up);
    free(frag_down);
    free(sizes);
    x.up = x.payload_up + x.framing + x.contribute;
    x.down = x.payload_down + x.framing;
    return x;
}

// A hub host: M replicas' uploads split over K hubs; the residual of every value a relay
// reduces (4 B, with an encoded downlink and diloco_downlink_feedback); on the way, per relay,
// each contributor's window of segments plus one per data stream, and the mean's backlog.
int plan_hubs(const train_config *cfg) {
    int hubs = 1;
    if (strcmp(cfg->diloco_transport, "tcp") == 0)
        for (const char *c = cfg->diloco_rendezvous; c && *c; c++) hubs += *c == ',';
    return hubs;
}

int64_t plan_pieces(const param_table *t, int ranks) {
    if (ranks < 1) ranks = 1;
    int64_t values = 0;
    for (int r = 0; r < ranks; r++) {
        shard_map map;
        shard_map_build(&map, t, r, ranks);
        values += map.local_numel;
        shard_map_free(&map);
    }
    return values;
}

hub_load plan_hub_load(const train_config *cfg, const param_table *t, int ranks) {
    hub_load h = {0};
    if (cfg->diloco_replicas <= 0 || strcmp(cfg->diloco_transport, "tcp") != 0) return h;
    if (ranks < 1) ranks = 1;
    h.hubs = plan_hubs(cfg);
    h.relays = ranks;
    diloco_traffic x = plan_diloco_traffic(cfg, t, ranks);
    int64_t M = cfg->diloco_replicas, K = h.hubs;
    h.in = M * x.up / K;
    h.out = M * x.down / K;
    quant_codec up, down;
    diloco_codecs(cfg, &up, &down);
    if (cfg->diloco_downlink_feedback && down != QUANT_NONE) h.residual = 4 * plan_pieces(t, ranks) / K;
    int64_t block = cfg->diloco_quant_block, segment = quant_segment_values(block);
    int64_t seg_up = (int64_t)quant_encoded_bytes(up, segment, block),
            seg_down = (int64_t)quant_encoded_bytes(down, segment, block);
    h.in_flight = (int64_t)ranks * (M * (PLAN_HUB_WINDOW_SEGMENTS + cfg->diloco_streams) * seg_up +
                                    PLAN_HUB_DOWN_BACKLOG_SEGMENTS * seg_down);
    h.cpu_s = (double)h.in / PLAN_HUB_BYTES_PER_CORE_S;
    return h;
}

static void units_of(int64_t total, double *u, const char **unit) {
    bool small = total < ((int64_t)1 << 30);
    *u = small ? 1048576.0 : 1073741824.0;
    *unit = small ? "MiB" : "GiB";
}

void plan_describe(const rank_memory *m, char *out, size_t out_bytes) {
    double u;
    const char *unit;
    units_of(m->total, &u, &unit);
    int n = snprintf(out, out_bytes,
                     "%.2f %s = %.2f weights + %.2f grads + %.2f AdamW (this rank's pieces) + %.2f gathered weights + "
                     "%.2f unit gradients + %.2f activations + %.2f workspace",
                     (double)m->total / u, unit, (double)m->weights / u, (double)m->grads / u,
                     (double)m->optimizer / u, (double)m->gathered_weights / u, (double)m->gathered_grads / u,
                     (double)m->activations / u, (double)m->workspace / u);
    if (m->diloco > 0 && n > 0 && (size_t)n < out_bytes)
        snprintf(out + n, out_bytes - (size_t)n, m->gpu ? " (+ %.2f DiLoCo in host memory)" : " + %.2f DiLoCo",
                 (double)m->diloco / u);
}

void plan_describe_diloco(const diloco_memory *m, char *out, size_t out_bytes) {
    double u;
    const char *unit;
    units_of(m->total, &u, &unit);
    snprintf(out, out_bytes,
             "%.2f %s = %.2f θ + %.2f momentum + %.2f Δ + %.2f residual + %.2f join state + %.2f payload + %.2f mean",
             (double)m->total / u, unit, (double)m->theta / u, (double)m->momentum / u, (double)m->delta / u,
             (double)m->residual / u, (double)m->join_state / u, (double)m->payload / u, (double)m->mean / u);
}

int plan_recompute_candidates(int64_t n_layer, recompute_setting *out, int cap) {
    int n = 0;
    if (n < cap) out[n++] = (recompute_setting){RECOMPUTE_NONE, 1};
    if (n < cap) out[n++] = (recompute_setting){RECOMPUTE_SELECTIVE, 1};
    // One recomputed layer saves nothing: the recompute scratch is one layer's worth. Every
    // layer is full's (k = 1).
    int64_t last = 1;  // layers recomputed by the previous candidate
    for (int64_t k = n_layer; k >= 2 && n < cap; k--) {
        int64_t layers = ceil_div(n_layer, k);
        if (layers == last || layers == n_layer) continue;  // the same count at a smaller k
        out[n++] = (recompute_setting){RECOMPUTE_FULL, k};
        last = layers;
    }
    if (n < cap) out[n++] = (recompute_setting){RECOMPUTE_FULL, 1};
    return n;
}

void plan_recompute_label(recompute_setting r, char *out, size_t out_bytes) {
    if (r.mode == RECOMPUTE_NONE || r.every <= 1) snprintf(out, out_bytes, "%s", recompute_name(r.mode));
    else snprintf(out, out_bytes, "%s on 1 layer in %" PRId64, recompute_name(r.mode), r.every);
}

// The limit in one cgroup's memory file: > 0, or -1 for none ("max" in v2, a missing file, or
// v1's "no limit", LLONG_MAX rounded down to a page: anything from 2⁶² up).
static int64_t cgroup_file_limit(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char text[64] = "";
    bool got = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!got) return -1;
    char *end = NULL;
    long long v = strtoll(text, &end, 10);
    return end != text && v > 0 && v < (1LL << 62) ? (int64_t)v : -1;
}

// The tighter of two limits, each > 0 or -1 for none.
static int64_t tighter(int64_t a, int64_t b) { return b > 0 && (a < 0 || b < a) ? b : a; }

// The lowest limit on the way from the cgroup at root + path up to root itself (each level's
// `file`), or -1: a job step's limit sits on its job's cgroup or above, not on the leaf.
static int64_t cgroup_walk_limit(const char *root, const char *path, const char *file) {
    char dir[4096];
    int n = snprintf(dir, sizeof dir, "%s%s%s", root, path[0] == '/' ? "" : "/", path);
    if (n < 0 || (size_t)n >= sizeof dir) return -1;
    size_t root_len = strlen(root);
    while (n > (int)root_len && dir[n - 1] == '/') dir[--n] = 0;  // "0::/" names the root itself
    int64_t lowest = -1;
    for (;;) {
        char at[4200];
        snprintf(at, sizeof at, "%s/%s", dir, file);
        int64_t v = cgroup_file_limit(at);
        lowest = tighter(lowest, v);
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= root_len || !slash || slash < dir + root_len) break;
        *slash = 0;
    }
    return lowest;
}

// Whether a v1 line's controller list ("memory", "cpu,memory") names the memory controller.
static bool names_memory(const char *list, size_t len) {
    for (const char *c = list; c < list + len;) {
        const char *comma = memchr(c, ',', (size_t)(list + len - c));
        size_t word = comma ? (size_t)(comma - c) : (size_t)(list + len - c);
        if (word == 6 && strncmp(c, "memory", 6) == 0) return true;
        if (!comma) break;
        c = comma + 1;
    }
    return false;
}

int64_t plan_cgroup_limit_bytes(const char *proc_self_cgroup, const char *cgroup_root) {
    FILE *f = fopen(proc_self_cgroup, "r");
    int64_t lowest = -1;
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        // "ID:CONTROLLERS:PATH": v2's is "0::PATH", v1's memory hierarchy "N:memory:PATH".
        char *first = strchr(line, ':'), *second = first ? strchr(first + 1, ':') : NULL;
        if (!second) continue;
        const char *path = second + 1;
        char root[4096];
        int64_t v = -1;
        if (second == first + 1 && strncmp(line, "0:", 2) == 0) {
            v = cgroup_walk_limit(cgroup_root, path, "memory.max");
        } else if (names_memory(first + 1, (size_t)(second - first - 1))) {
            snprintf(root, sizeof root, "%s/memory", cgroup_root);
            v = cgroup_walk_limit(root, path, "memory.limit_in_bytes");
        }
        lowest = tighter(lowest, v);
    }
    if (f) fclose(f);
    // No /proc/self/cgroup (or no line for memory): the roots, as the mounts show them.
    if (lowest < 0) {
        char at[4200];
        snprintf(at, sizeof at, "%s/memory.max", cgroup_root);
        lowest = cgroup_file_limit(at);
        snprintf(at, sizeof at, "%s/memory/memory.limit_in_bytes", cgroup_root);
        lowest = tighter(lowest, cgroup_file_limit(at));
    }
    return lowest;
}

int64_t plan_cpu_budget_bytes(int local_ranks, char *what, size_t what_bytes) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t ram = pages > 0 && page > 0 ? (int64_t)pages * page : 0, limit = plan_cgroup_limit_bytes("/proc/self/cgroup", "/sys/fs/cgroup");
    bool cgroup = limit > 0 && limit < ram;
    int64_t node = cgroup ? limit : ram;
    if (local_ranks < 1) local_ranks = 1;
    int64_t budget = node / local_ranks - PLAN_CPU_HEADROOM_BYTES;
    if (budget < 0) budget = 0;
    snprintf(what, what_bytes, "%s %.1f GiB / %d rank(s) on this node − %.0f GiB headroom",
             cgroup ? "the cgroup's memory limit" : "this machine's memory", (double)node / 1073741824.0,
             local_ranks, (double)PLAN_CPU_HEADROOM_BYTES / 1073741824.0);
    return budget;
}
