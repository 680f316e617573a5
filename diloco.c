// diloco.c — the DiLoCo outer loop (see diloco.h and docs/diloco.md).
#include "diloco.h"
#include "llmc/bytes.h"
#include "llmc/checksum.h"
#include "llmc/common.h"
#include "llmc/fault.h"
#include "llmc/json.h"
#include "llmc/optim.h"
#include "llmc/plan.h"
#include "llmc/quant.h"
#include "net/transport.h"
#include "net/wire.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// The state a donor sends to a joining replica, little-endian:
//   "TGDLSTAT" (8 bytes), u32 version = 7, u32 flags (1: m follows θ),
//   i64 outer_step, i64 step, i64 tokens_seen, i64 numel,
//   i64 sent_at_step (the donor's step when the state's last chunk went: it trains while it
//                     sends, and the joiner skips the steps it took meanwhile),
//   i64 phase_ms (the donor's time in its inner phase then, in ms: with diloco_sync_every_s a
//                 joiner's phase ends T after the donor's began, not T after its join),
//   i64 final_next (step = max_steps: the fragment whose final sync comes next, 0 .. P; P: the
//                   final syncs are done. Else 0. A joiner goes on from there: final_syncs),
//   RECENT_ROUNDS × { i64 round (−1: none), u32 flags (1 applied), u32 fragment (the one it
//                     synced; version 6 had 0 there), u8 ids[32] (bit i of byte i/8: replica i's
//                     whole contribution is in the round's mean) },
//   f32 θ[numel], f32 m[numel] (only with flag 1: an m of zero bits is not sent, the joiner
//   zeroes its own — half the bytes where the outer steps take no momentum, outer_update)
// The donor's last rounds tell a joiner which fragments' work of the rounds it missed is already
// in θ (then it is not carried again) and how far each fragment moved on without it
// (carry_weights).
//
// A catch-up transfer (relay --catch_up, docs/protocol.md "Catch-up"): the state above stays
// the one of its round (the donor keeps aside what a later landing changes before it is sent:
// transport_preserve_state), and after it comes, for each round the donor lands meanwhile, a
// catch-up mean, little-endian:
//   "TGDLCTCH" (8 bytes), u32 version = 2, u32 flags (1: applied, 2: a final sync), i64 round,
//   i64 fragment,
//   i64 step (the donor's, at the landing), i64 tokens_seen (its, then), i64 phase_ms (its time
//   in its inner phase then), f64 outer lr, f64 outer μ (of this step of this fragment),
//   u8 ids[32] (the round's contributors), then with flag 1 the encoded mean of the fragment
//   (fragment mean_bytes).
// The joiner applies each to the state's θ and m as the members did, as it comes (take_catchup_mean).
#define CATCHUP_MAGIC "TGDLCTCH"
#define CATCHUP_VERSION 2
#define CATCHUP_APPLIED 1u
#define CATCHUP_FINAL 2u
#define CATCHUP_HEADER_BYTES 104
#define CATCHUP_IDS 72            // where the contributors' bits are
#define STATE_MAGIC "TGDLSTAT"
#define STATE_VERSION 7
#define STATE_HAS_MOMENTUM 1u
#define RECENT_ROUNDS 8
#define ROUND_RECORD_BYTES 48
#define STATE_COUNTERS_BYTES 72   // the magic, version, flags and the seven i64 counters
#define STATE_SENT_AT 48          // where sent_at_step is
#define STATE_PHASE_MS 56         // where phase_ms is
#define STATE_FINAL_NEXT 64       // where final_next is
#define STATE_HEADER_BYTES (STATE_COUNTERS_BYTES + RECENT_ROUNDS * ROUND_RECORD_BYTES)
_Static_assert(STATE_HEADER_BYTES == PLAN_STATE_HEADER_BYTES, "llmc/plan.h's state header size is diloco.c's");
// θ and m live in one block laid out as that state, the header just before θ, so a donor sends
// them where they are (no 8 B/param copy): [padding][header][θ][m], θ 64-byte aligned.
#define STATE_THETA_OFFSET ((STATE_HEADER_BYTES + 63) / 64 * 64)
// How long a rank of a sharded replica waits for the others while they join: a day (the
// largest comm_timeout_s), i.e. as long as the job lives.
#define COMM_NO_TIMEOUT_S 86400.0

// A contiguous range of the flat parameters made of whole layers (the embedding goes with
// the first fragment, the final norm and the LM head with the last). With P = 1 it is all.
typedef struct {
    int64_t offset, numel;
    int first_layer, layers;
    int64_t sync_offset;       // synced after every inner step s with s % H == sync_offset
    int64_t decay_offset;      // in the decay phase: (s − its start) % H_d == decay_offset
    size_t payload_bytes;      // its encoded outer gradient (segmented, llmc/quant.h)
    size_t mean_bytes;         // the encoded mean that comes back
} fragment;

// The exchange of one fragment: begun after an inner step, landed τ inner steps later (in
// the same call with τ = 0). Owned by the main thread; while `threaded`, `thread` runs
// transport_exchange on d->payload and writes ok and r.
typedef struct {
    bool active;
    bool threaded;
    bool final;                // one of the blocking syncs after the last step
    int fragment;
    int64_t round;             // st->outer_step when it began: the transport's round number
    int64_t begin_step;
    int64_t inner_steps;       // this replica's inner steps behind the contribution
    uint64_t tokens;           // and their training tokens: the contribution's weight in the mean
    double quant_err;
    bool poisoned;             // the diloco_nan_payload test hook overwrote the payload's first
    uint8_t unpoisoned[4];     // 4 bytes (block 0's scale): what encode wrote there
    FILE *dump;
    pthread_t thread;
    bool ok;
    round_result r;
} flight;

// The counters of a donor's state (check_state), and after a catch-up mean those of the donor
// at that landing (take_catchup_mean).
typedef struct {
    int64_t outer_step, step, tokens;
    int64_t sent_at_step;   // the donor's step when the last chunk went
    int64_t phase_ms;       // the donor's time in its inner phase then
    int64_t final_next;     // step = max_steps: the fragment whose final sync comes next (P: none)
    bool with_m;            // m follows θ (else it is zero)
} state_counters;

struct diloco {
    const train_config *cfg;
    const param_table *table;
    // A replica of several ranks (FSDP, docs/fsdp.md#diloco-over-sharded-replicas): every
    // buffer here holds this rank's pieces (shard's local layout, numel = its local_numel),
    // and the rank exchanges them with rank `rank` of every other replica over its own
    // transport. group is NULL and ranks 1 for a replica of one process.
    const shard_map *shard;
    comm *group;
    int rank, ranks;
    int64_t numel;
    metrics_log *log;
    transport *net;
    quant_codec quant;                     // how Δᵢ travels: diloco_quant, sparse with diloco_topk < 1
    quant_codec down;                      // the codec of the mean (diloco_downlink): always dense
    bool down_feedback;                    // the reducer's error feedback on the mean
    int64_t block, segment;
    float bound;                           // diloco_bound (0 with diloco_quant = none: weights travel)
    float *theta, *momentum, *residual;   // residual: NULL without error feedback
    float *delta;                          // this replica's Δᵢ while it is encoded, then the
                                           // decoded mean: the group's Δ, or with quant none
                                           // the mean of the θᵢ (one buffer: the first is sent
                                           // before the second arrives)
    uint8_t *payload;                      // sized for the largest fragment
    int n_fragments;                       // P
    fragment *fragments;
    int64_t overlap;                       // τ
    int64_t decay_from, decay_H;           // after inner step decay_from, sync every decay_H
                                           // steps (diloco_decay_inner_steps; INT64_MAX: never)
    bool streaming;                        // P > 1 or τ > 0: the metrics say which fragment
    flight flight;
    // diloco_transport = local (all M replicas in this process): one payload and one
    // error-feedback residual per replica; `payload` and `residual` are replica 0's. The hub's
    // reduction runs here too: its mean, its residual (NULL without downlink feedback).
    bool local;
    uint8_t **local_payload;
    float **local_residual;
    uint8_t *local_mean;
    float *hub_residual;
    float *segment_scratch;                // one segment of floats for the reduction
    bool quiet;                            // no progress line per outer step (diloco-tune)
    bool over;                             // the hub said the run is over (diloco_group_over)
    bool over_waited;                      // ... after the join had waited for the group's state (the run
                                           // finished meanwhile), not at once: agreed by every rank
    bool stopped;                          // a stop request ended a join (diloco_join_stopped)
    int64_t changed_lo, changed_hi;        // the local values the last call changed: [lo, hi)
    // diloco_sync_every_s: when this replica's inner phase began (its last round landed, or it
    // joined), and the extra inner steps it has taken in it beyond its H
    _Atomic double phase_start_s;          // read by a donor's sender thread (its stamp)
    double joined_phase_s;                 // a joiner: its donor's time in its phase (phase_ms)
    int64_t extra_steps;
    uint8_t *outer_block;                  // θ and m as a state (STATE_THETA_OFFSET): what a donor sends
    uint8_t *state;                        // a joiner's received state: allocated for the join only
    size_t state_bytes;                    // of a state: header + θ + m
    // A catch-up joiner applies each mean to the state as the transport hands it
    // (take_catchup_mean): how many so far, and the counters after the last.
    int caught_up;
    state_counters caught_up_counters;
    // At max_steps: the fragment whose final sync comes next (0 .. P), in the state a donor
    // sends, and where a replica that took such a state goes on (final_syncs).
    int64_t final_next;
    bool *carried;                         // per fragment, the last state taken: this replica's
                                           // late work was carried into it (adopt_state)
    bool joined_at_end;                    // diloco_join took a state at max_steps
    bool final_theta;                      // finish_final_syncs took θ into a fragment whose
                                           // final sync did not apply (on any rank)
    // Per fragment, where its final sync did not apply on this rank (skipped, failed, dropped
    // from it, or never held: the run was over): the inner steps of this replica's work behind
    // it; −1 where it applied or has not come (finish_final_syncs).
    int64_t *final_missed;
    // A donor sends its state from a thread while it trains on (θ and m do not change until
    // its next exchange, which waits for the thread first: finish_sending_state).
    pthread_t sender;
    bool sending;
    bool catching_up;                      // the transfer is a catch-up one: the donor exchanges on,
                                           // keeps the unsent state, sends each landed round's mean
    atomic_bool sender_finished;           // its sender returned (the hub ended the transfer)
    atomic_bool sender_began;              // a catch-up sender's transfer is under way (state_hooks.began)
    uint8_t *catchup;                      // a catch-up mean being built (header + the largest mean)
    atomic_bool cancel_sending;            // the donor leaves: its sender stops
    size_t send_bytes;                     // of the state being sent (state_header on)
    _Atomic int64_t live_step;             // the last inner step this replica finished
    // The last rounds this replica saw close (applied or skipped) and who was in them, for the
    // state it may donate; slot = round mod RECENT_ROUNDS.
    struct {
        int64_t round;                     // -1: none
        bool applied;
        int fragment;                      // the fragment it synced
        uint8_t ids[TRANSPORT_MAX_REPLICAS / 8];
    } recent[RECENT_ROUNDS];
    const char *dump_dir;                  // TRAIN_GPT_DILOCO_DUMP: tensors of each outer step, for tests
};

uint64_t diloco_hash(const float *x, int64_t n) { return xxh64(x, (size_t)n * sizeof(float), 0); }

// The param_hash of the replica: one process's diloco_hash of x; with several ranks the XXH64
// of the ranks' hashes of their pieces (8 bytes each, little-endian, in rank order). A
// collective: every rank of the replica calls it, and all get the same number.
static uint64_t replica_hash(const diloco *d, const float *x, int64_t n) {
    uint64_t mine = diloco_hash(x, n);
    if (d->ranks == 1) return mine;
    uint8_t *all = xmalloc((size_t)d->ranks * 8);
    for (int r = 0; r < d->ranks; r++) {
        uint64_t h = mine;
        comm_broadcast(d->group, &h, sizeof h, r);
        put_u64(all + 8 * r, h);
    }
    uint64_t h = xxh64(all, (size_t)d->ranks * 8, 0);
    free(all);
    return h;
}

// The same number on every rank of the replica: the largest and the smallest x over its ranks.
static double replica_max(const diloco *d, double x) { return d->ranks > 1 ? comm_max(d->group, x) : x; }
static double replica_min(const diloco *d, double x) { return d->ranks > 1 ? -comm_max(d->group, -x) : x; }
static double replica_sum(const diloco *d, double x) { return d->ranks > 1 ? comm_sum(d->group, x) : x; }

int diloco_replica_id(const diloco *d) { return (int)d->cfg->diloco_replica_id; }
int diloco_replicas(const diloco *d) { return (int)d->cfg->diloco_replicas; }

// What every replica of one run must agree on: the model, M, H, the outer optimizer, how Δ is
// encoded, when the run ends (max_steps: the final sync) and which rows each replica reads
// (seq_len is the model's; shuffle and seed). A replica with a different fingerprint is refused
// when it joins. What may differ (docs/diloco.md#replicas-of-different-sizes): batch_size,
// grad_accum, threads, device, the inner learning rate and its schedule's shape.
// A sharded replica's rank j meets rank j of the others only: its fingerprint names the split
// (ranks per replica, its piece, the local layout's size), so a rank can never join another
// piece's group, nor a replica of another split.
// The fingerprint is the XXH64 of a text of `key value` fields separated by `|` (`*text`, which
// the caller frees): the diloco_fingerprint event logs it, and a refusal names the field that
// differs where the transport can see both texts (MPI).
static uint64_t run_fingerprint(const train_config *cfg, const param_table *t, const data_identity *data, int rank,
                                int ranks, int64_t local, char **text) {
    char *model = model_config_to_json(&t->cfg);
    strbuf sb = {0};
    if (ranks > 1) sb_printf(&sb, "sharded %d ways, piece %d, %lld local values|", ranks, rank, (long long)local);
    sb_printf(&sb, "model %s|numel %lld|M %lld|H %lld|lr %.17g|mu %.17g|nesterov %d|mu warmup %lld|quant %s|block %lld|ef %d|P %lld|tau %lld|alpha %.17g|down %s|down ef %d|bound %.9g",
              model, (long long)t->numel, (long long)cfg->diloco_replicas, (long long)cfg->diloco_inner_steps,
              cfg->diloco_outer_lr, cfg->diloco_outer_momentum, (int)cfg->diloco_nesterov,
              (long long)cfg->diloco_momentum_warmup, cfg->diloco_quant, (long long)cfg->diloco_quant_block,
              (int)cfg->diloco_error_feedback, (long long)cfg->diloco_fragments, (long long)cfg->diloco_overlap_steps,
              cfg->diloco_merge_alpha, cfg->diloco_downlink, (int)cfg->diloco_downlink_feedback, cfg->diloco_bound);
    if (cfg->diloco_topk < 1) sb_printf(&sb, "|topk %.17g", cfg->diloco_topk);
    sb_printf(&sb, "|max_steps %lld|shuffle %d|seed %lld|min_replicas %lld", (long long)cfg->max_steps,
              (int)cfg->shuffle, (long long)cfg->seed, (long long)cfg->diloco_min_replicas);
    if (data)   // what the shards hold, not where they lie (dataloader_fingerprint)
        sb_printf(&sb, "|data %016llx (%lld tokens, %lld shards)", (unsigned long long)data->fingerprint,
                  (long long)data->tokens, (long long)data->shards);
    if (cfg->diloco_sync_every_s > 0) sb_printf(&sb, "|sync every %.17g s", cfg->diloco_sync_every_s);
    // With plain averaging in the decay phase, or another sync interval there, where that phase
    // starts decides the outer steps.
    if (cfg->diloco_plain_in_decay) sb_printf(&sb, "|plain in decay");
    if (cfg->diloco_decay_inner_steps > 0) sb_printf(&sb, "|decay H %lld", (long long)cfg->diloco_decay_inner_steps);
    if (cfg->diloco_plain_in_decay || cfg->diloco_decay_inner_steps > 0) sb_printf(&sb, "|decay_frac %.17g", cfg->decay_frac);
    uint64_t h = xxh64(sb.data, sb.length, 0);
    *text = sb.data;  // the strbuf's text, now the caller's
    free(model);
    return h;
}

// The diloco_fingerprint event: the run fingerprint and the text it hashes, written before the
// transport opens, so that a replica refused for a different fingerprint has logged what it
// covers next to the group's replicas' (docs/formats.md).
static void log_fingerprint(diloco *d, uint64_t fingerprint, const char *text) {
    strbuf sb = {0};
    sb_printf(&sb, "\"fingerprint\":\"%016llx\",\"covers\":", (unsigned long long)fingerprint);
    sb_json_string(&sb, text);
    metrics_event(d->log, "diloco_fingerprint", 0, sb.data);
    sb_free(&sb);
}

// Splits the model into P fragments of whole layers, each about numel / P: fragment p
// starts at the layer boundary nearest p·numel/P (every fragment keeps at least one layer).
// Fragment p syncs after inner steps s with s % H = ⌊(p + 1)·H / P⌋ % H, so with P = 1 at
// every multiple of H (classic DiLoCo) and otherwise spread evenly, fragment P − 1 last.
// With diloco_decay_inner_steps H_d, the same spread over H_d counts from the decay's start.
//
// A sharded replica chooses the same layers (from the whole model's layout, so its fragments
// are an unsharded replica's), and a fragment is then the range of the local layout that holds
// this rank's pieces of those layers: the same schedule and sizes on every rank.
static void split_fragments(diloco *d) {
    const param_table *t = d->table;
    int L = (int)t->cfg.n_layer, P = (int)d->cfg->diloco_fragments;
    int64_t H = d->cfg->diloco_inner_steps;
    int64_t *layer_start = xmalloc((size_t)(L + 1) * sizeof *layer_start);
    int64_t *local_start = xmalloc((size_t)(L + 1) * sizeof *local_start);
    for (int l = 0; l < L; l++) {
        layer_start[l] = l == 0 ? 0 : d->shard->units[1 + l].start;   // unit 1 + l is layer l
        local_start[l] = l == 0 ? 0 : d->shard->units[1 + l].local;
    }
    layer_start[L] = t->numel;
    local_start[L] = d->shard->local_numel;
    int *first = xmalloc((size_t)(P + 1) * sizeof *first);
    first[0] = 0;
    first[P] = L;
    for (int p = 1; p < P; p++) {
        double target = (double)t->numel * p / P;
        int best = first[p - 1] + 1;
        for (int l = best; l <= L - (P - p); l++)
            if (fabs((double)layer_start[l] - target) < fabs((double)layer_start[best] - target)) best = l;
        first[p] = best;
    }
    d->n_fragments = P;
    d->fragments = xcalloc((size_t)P, sizeof *d->fragments);
    for (int p = 0; p < P; p++) {
        fragment *f = &d->fragments[p];
        f->first_layer = first[p];
        f->layers = first[p + 1] - first[p];
        f->offset = local_start[first[p]];
        f->numel = local_start[first[p + 1]] - f->offset;
        f->sync_offset = ((int64_t)(p + 1) * H / P) % H;
        f->decay_offset = ((int64_t)(p + 1) * d->decay_H / P) % d->decay_H;
        f->payload_bytes = quant_segmented_bytes(d->quant, f->numel, d->block, d->segment);
        f->mean_bytes = quant_segmented_bytes(d->down, f->numel, d->block, d->segment);
    }
    free(first);
    free(layer_start);
    free(local_start);
}

// Rank j of a sharded replica meets its group at the hub on port + j: every "host:port" of
// the rendezvous (a comma-separated list keeps its commas; "[v6addr]:port" too) gets its port
// moved by j. (Parsed here, not by net/socket.c, which a build without tcp lacks.)
static char *rendezvous_of_rank(const char *rendezvous, int rank) {
    strbuf sb = {0};
    sb_append(&sb, "");
    const char *p = rendezvous;
    for (;;) {
        const char *comma = strchr(p, ',');
        int len = comma ? (int)(comma - p) : (int)strlen(p);
        const char *colon = NULL;
        for (const char *q = p; q < p + len; q++)
            if (*q == ':') colon = q;
        char *end = NULL;
        long base = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || end != p + len || base <= 0 || base + rank > 65535)
            fail("diloco_rendezvous: '%.*s': a replica of several ranks needs HOST:PORT with a fixed port (rank %d "
                 "uses port + %d)",
                 len, p, rank, rank);
        sb_printf(&sb, "%s%.*s:%ld", sb.length ? "," : "", (int)(colon - p), p, base + rank);
        if (!comma) break;
        p = comma + 1;
    }
    return sb.data;
}

static void take_catchup_mean(void *arg, int index, const uint8_t *p, size_t bytes, size_t state_bytes);

// The mean goes back dense: "same" is the uplink's kind without its sparsity (docs/quant.md,
// "Sparse outer gradients", says why).
static quant_kind downlink_kind(const train_config *cfg, quant_kind up) {
    return up == QUANT_NONE || strcmp(cfg->diloco_downlink, "fp32") == 0 ? QUANT_NONE
           : strcmp(cfg->diloco_downlink, "bf16") == 0                   ? QUANT_BF16
                                                                         : up;
}

// A sparse codec of few values per large block (diloco_topk 0.001, diloco_quant_block 4096,
// int4: 960-byte chunks) made chunks the hub refused at every outer step: the replicas
// rejoined, trained alone and exited 0 with no outer step applied. The hub list was checked
// only as the transport opened: `train_gpt plan` passed what the run then refused.
void diloco_check_config(const train_config *cfg) {
    if (cfg->diloco_replicas <= 0) return;
    if (strcmp(cfg->diloco_transport, "tcp") == 0 && cfg->diloco_rendezvous && cfg->diloco_rendezvous[0])
        transport_tcp_check_rendezvous(cfg->diloco_rendezvous, cfg->diloco_serve);
    int kind = quant_kind_from_name(cfg->diloco_quant);
    if (kind < 0) return;
    int64_t block = cfg->diloco_quant_block, segment = quant_segment_values(block);
    int64_t keep = kind != QUANT_NONE && cfg->diloco_topk < 1 ? quant_topk_keep(cfg->diloco_topk, block) : 0;
    size_t chunk = quant_encoded_bytes(quant_codec_of((quant_kind)kind, keep), segment, block);
    if (strcmp(cfg->diloco_transport, "tcp") == 0 && chunk < WIRE_MIN_CHUNK_BYTES) {
        int64_t least = keep;
        while (least + 1 < block &&
               quant_encoded_bytes(quant_codec_of((quant_kind)kind, least), segment, block) < WIRE_MIN_CHUNK_BYTES)
            least++;
        config_refuse("diloco_topk",
                      "%g with diloco_quant_block %lld and diloco_quant %s keeps %lld value(s) a block: chunks of "
                      "%zu bytes, under the tcp wire's least of %u (the hub refuses them); raise diloco_topk to %g or "
                      "more, or lower diloco_quant_block",
                      cfg->diloco_topk, (long long)block, cfg->diloco_quant, (long long)keep, chunk,
                      WIRE_MIN_CHUNK_BYTES, (double)least / (double)block);
    }
    // The mean comes back dense: fp32 at 2^21 values is 8 MiB a chunk.
    size_t down_chunk = quant_encoded_bytes(downlink_kind(cfg, (quant_kind)kind), segment, block), most = chunk > down_chunk ? chunk : down_chunk;
    if (strcmp(cfg->diloco_transport, "mpi") == 0 && (uint64_t)cfg->diloco_replicas * most >= (uint64_t)INT32_MAX)
        config_refuse("diloco_quant_block",
                      "%lld with diloco_quant %s and diloco_downlink %s: the %lld replicas' chunks of a segment (%zu "
                      "bytes each) pass MPI's int counts; lower diloco_quant_block",
                      (long long)block, cfg->diloco_quant, cfg->diloco_downlink, (long long)cfg->diloco_replicas, most);
}

diloco *diloco_open(const train_config *cfg, const shard_map *shard, const data_identity *data, comm *group, metrics_log *log,
                    const volatile sig_atomic_t *stop) {
    if (cfg->diloco_replicas <= 0) return NULL;
    const param_table *t = shard->table;
    diloco *d = xcalloc(1, sizeof *d);
    d->cfg = cfg;
    d->table = t;
    d->shard = shard;
    d->group = group && comm_size(group) > 1 ? group : NULL;
    d->rank = d->group ? comm_rank(group) : 0;
    d->ranks = d->group ? comm_size(group) : 1;
    if (d->ranks != shard->ranks || d->rank != shard->rank)
        fail("diloco: the replica's ranks (%d of %d) are not the model's split (%d of %d)", d->rank, d->ranks,
             shard->rank, shard->ranks);
    if (d->ranks > 1 && strcmp(cfg->diloco_transport, "tcp") != 0)
        fail("diloco_transport %s: a replica of %d ranks (fsdp_size %d) exchanges over tcp only (each rank its own "
             "connection to the hub; docs/fsdp.md#diloco-over-sharded-replicas)",
             cfg->diloco_transport, d->ranks, d->ranks);
    d->numel = shard->local_numel;
    d->log = log;
    d->block = cfg->diloco_quant_block;
    quant_kind kind = (quant_kind)quant_kind_from_name(cfg->diloco_quant);
    d->quant = quant_codec_of(kind, kind == QUANT_NONE ? 0 : quant_topk_keep(cfg->diloco_topk, d->block));
    d->segment = quant_segment_values(d->block);
    d->down = downlink_kind(cfg, kind);
    d->down_feedback = cfg->diloco_downlink_feedback && d->down != QUANT_NONE;
    d->bound = d->quant == QUANT_NONE ? 0.0f : (float)cfg->diloco_bound;
    d->overlap = cfg->diloco_overlap_steps;
    d->decay_H = cfg->diloco_decay_inner_steps > 0 ? cfg->diloco_decay_inner_steps : cfg->diloco_inner_steps;
    d->decay_from = cfg->diloco_decay_inner_steps > 0 && cfg->max_steps > decay_start_step(cfg)
                        ? decay_start_step(cfg) : INT64_MAX;
    d->streaming = cfg->diloco_fragments > 1 || d->overlap > 0;
    split_fragments(d);
    d->final_missed = xmalloc((size_t)d->n_fragments * sizeof *d->final_missed);
    for (int p = 0; p < d->n_fragments; p++) d->final_missed[p] = -1;
    d->carried = xcalloc((size_t)d->n_fragments, sizeof *d->carried);
    size_t largest = 0, largest_mean = 0;
    for (int p = 0; p < d->n_fragments; p++) {
        largest = d->fragments[p].payload_bytes > largest ? d->fragments[p].payload_bytes : largest;
        largest_mean = d->fragments[p].mean_bytes > largest_mean ? d->fragments[p].mean_bytes : largest_mean;
    }
    size_t n = (size_t)d->numel;
    d->outer_block = (uint8_t *)alloc_floats((STATE_THETA_OFFSET + 2 * n * sizeof(float)) / sizeof(float));
    d->theta = (float *)(d->outer_block + STATE_THETA_OFFSET);
    d->momentum = d->theta + n;
    d->state_bytes = STATE_HEADER_BYTES + 2 * n * sizeof(float);
    if (cfg->diloco_error_feedback && d->quant != QUANT_NONE) d->residual = alloc_floats(n);
    d->delta = alloc_floats(n);
    d->payload = xmalloc(largest);
    const char *dump = getenv("TRAIN_GPT_DILOCO_DUMP");
    d->dump_dir = dump && *dump && d->rank == 0 ? dump : NULL;   // sharded: rank 0's pieces only
    if (strcmp(cfg->diloco_transport, "local") == 0) {
        int m = (int)cfg->diloco_replicas;
        d->local = true;
        d->local_payload = xcalloc((size_t)m, sizeof *d->local_payload);
        d->local_residual = xcalloc((size_t)m, sizeof *d->local_residual);
        d->local_payload[0] = d->payload;
        d->local_residual[0] = d->residual;
        for (int i = 1; i < m; i++) {
            d->local_payload[i] = xmalloc(largest);
            if (d->residual) d->local_residual[i] = alloc_floats(n);
        }
        d->local_mean = xmalloc(largest_mean);
        d->segment_scratch = alloc_floats((size_t)d->segment);
        if (d->down_feedback) d->hub_residual = xcalloc(n, sizeof(float));
        return d;  // no transport: the exchange happens in memory, nobody joins late
    }
    for (int i = 0; i < RECENT_ROUNDS; i++) d->recent[i].round = -1;

    transport_options o = {0};
    o.replica_id = (int)cfg->diloco_replica_id;
    o.replicas = (int)cfg->diloco_replicas;
    o.min_replicas = (int)cfg->diloco_min_replicas;
    o.timeout_s = cfg->diloco_timeout_s;
    o.connect_timeout_s = cfg->diloco_connect_timeout_s;
    char *fingerprint_text = NULL;
    o.run_fingerprint = run_fingerprint(cfg, t, data, d->rank, d->ranks, d->numel, &fingerprint_text);
    o.fingerprint_text = fingerprint_text;
    log_fingerprint(d, o.run_fingerprint, fingerprint_text);
    o.threaded = d->overlap > 0;
    o.stop = stop;
    o.defer_caught_up = d->ranks > 1;   // its ranks tell their hubs together (agree_catchup_round)
    o.catchup_sink = take_catchup_mean;  // each mean applied as it comes: one held at a time
    o.catchup_arg = d;
    uint8_t *secret = NULL;
    if (strcmp(cfg->diloco_transport, "mpi") == 0) {
        d->net = transport_mpi_open(&o);
    } else {
        secret = read_secret_file(cfg->diloco_secret_file, "diloco_secret_file", &o.secret_bytes);
        o.secret = secret;
        char *rendezvous = d->ranks > 1 ? rendezvous_of_rank(cfg->diloco_rendezvous, d->rank) : NULL;
        o.rendezvous = rendezvous ? rendezvous : cfg->diloco_rendezvous;
        o.serve = cfg->diloco_serve;
        o.streams = (int)cfg->diloco_streams;
        d->net = transport_tcp_open(&o);
        free(rendezvous);
    }
    if (secret) {
        memset(secret, 0, o.secret_bytes);
        free(secret);
    }
    free(fingerprint_text);
    return d;
}

static bool restore_reducer(void *arg, const uint8_t *bytes, size_t n, char *why, size_t why_bytes) {
    diloco *d = arg;
    return !d->net || transport_restore_reducer(d->net, bytes, n, why, why_bytes);
}

void diloco_attach_buffers(diloco *d, model_buffers *b) {
    b->outer_theta = d->theta;
    b->outer_momentum = d->momentum;
    b->outer_residual = d->residual;
    b->reducer_head = b->reducer_body = NULL;
    if (d->net)
        transport_reducer_state(d->net, &b->reducer_head, &b->reducer_head_bytes, &b->reducer_body,
                                &b->reducer_body_bytes);
    b->reducer_load = restore_reducer;
    b->reducer_arg = d;
}

// ---------------------------------------------------------------- state transfer


// Whether every bit of x is 0 (a -0.0 is not: the joiner's memset must give the same bytes).
static bool all_zero_bits(const float *x, int64_t n) {
    const uint32_t *b = (const uint32_t *)x;
    uint32_t any = 0;
#pragma omp parallel for schedule(static) reduction(| : any)
    for (int64_t i = 0; i < n; i++) any |= b[i];
    return any == 0;
}

// One of a state's RECENT_ROUNDS records: i64 round, u32 flags (1 applied), u32 fragment,
// u8 ids[32].
static void put_round_record(uint8_t *q, int64_t round, bool applied, int fragment, const uint8_t *ids) {
    put_u64(q, (uint64_t)round);
    put_u32(q + 8, applied ? 1 : 0);
    put_u32(q + 12, (uint32_t)fragment);
    memcpy(q + 16, ids, TRANSPORT_MAX_REPLICAS / 8);
}

// The contributors of a round as bits (bit i of byte i/8: replica i).
static void contributor_bits(const round_result *r, uint8_t ids[TRANSPORT_MAX_REPLICAS / 8]) {
    memset(ids, 0, TRANSPORT_MAX_REPLICAS / 8);
    for (int c = 0; c < r->n; c++)
        if (r->ids[c] >= 0 && r->ids[c] < TRANSPORT_MAX_REPLICAS) ids[r->ids[c] / 8] |= (uint8_t)(1u << (r->ids[c] % 8));
}

// A catch-up mean's header (the format above CATCHUP_MAGIC), read: NULL, or why it is malformed.
typedef struct {
    bool applied, final;
    int64_t round, fragment, step, tokens, phase_ms;
    double lr, mu;
    const uint8_t *ids;     // TRANSPORT_MAX_REPLICAS / 8 bytes
} catchup_header;

static double get_f64(const uint8_t *p) {
    uint64_t bits = get_u64(p);
    double x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static void put_f64(uint8_t *p, double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    put_u64(p, bits);
}

static const char *read_catchup(const uint8_t *p, size_t bytes, catchup_header *h) {
    if (bytes < CATCHUP_HEADER_BYTES || memcmp(p, CATCHUP_MAGIC, 8) != 0 || get_u32(p + 8) != CATCHUP_VERSION ||
        (get_u32(p + 12) & ~(CATCHUP_APPLIED | CATCHUP_FINAL)) != 0)
        return "malformed";
    *h = (catchup_header){.applied = get_u32(p + 12) & CATCHUP_APPLIED, .final = (get_u32(p + 12) & CATCHUP_FINAL) != 0,
                          .round = (int64_t)get_u64(p + 16),
                          .fragment = (int64_t)get_u64(p + 24), .step = (int64_t)get_u64(p + 32),
                          .tokens = (int64_t)get_u64(p + 40), .phase_ms = (int64_t)get_u64(p + 48),
                          .lr = get_f64(p + 56), .mu = get_f64(p + 64), .ids = p + CATCHUP_IDS};
    return NULL;
}

// Where a donor's state begins: its header, just before θ in their block.
static uint8_t *state_header(const diloco *d) { return d->outer_block + STATE_THETA_OFFSET - STATE_HEADER_BYTES; }

// The donor's state: the header written in front of θ and m, which follow it in their block;
// returns the bytes to send (m left out where it is all zero).
static size_t pack_state(diloco *d, const train_state *st) {
    uint8_t *p = state_header(d);
    bool with_m = !all_zero_bits(d->momentum, d->numel);
    memcpy(p, STATE_MAGIC, 8);
    put_u32(p + 8, STATE_VERSION);
    put_u32(p + 12, with_m ? STATE_HAS_MOMENTUM : 0);
    put_u64(p + 16, (uint64_t)st->outer_step);
    put_u64(p + 24, (uint64_t)st->step);
    put_u64(p + 32, (uint64_t)st->tokens_seen);
    put_u64(p + 40, (uint64_t)d->numel);
    put_u64(p + STATE_SENT_AT, (uint64_t)st->step);   // stamped again as the last chunk goes
    put_u64(p + STATE_PHASE_MS, 0);
    put_u64(p + STATE_FINAL_NEXT, (uint64_t)(st->step == d->cfg->max_steps ? d->final_next : 0));
    for (int i = 0; i < RECENT_ROUNDS; i++)
        put_round_record(p + STATE_COUNTERS_BYTES + (size_t)i * ROUND_RECORD_BYTES, d->recent[i].round,
                         d->recent[i].applied, d->recent[i].fragment, d->recent[i].ids);
    return STATE_HEADER_BYTES + (with_m ? 2 : 1) * (size_t)d->numel * sizeof(float);
}

// A donor sends its state from a thread and trains on meanwhile: θ and m stay as they are
// until its next exchange (begin_round), rejoin or goodbye, each of which waits for the thread
// first. The state's first chunk goes last, stamped with the step the donor had reached then.
static void stamp_sent_at(void *arg) {
    diloco *d = (diloco *)arg;
    put_u64(state_header(d) + STATE_SENT_AT, (uint64_t)atomic_load(&d->live_step));
    double in_phase_s = wall_seconds() - atomic_load(&d->phase_start_s);
    put_u64(state_header(d) + STATE_PHASE_MS, (uint64_t)(in_phase_s > 0 ? llround(in_phase_s * 1e3) : 0));
}

static bool sending_cancelled(void *arg) { return atomic_load(&((diloco *)arg)->cancel_sending); }
static void sender_began(void *arg) { atomic_store(&((diloco *)arg)->sender_began, true); }

static void *state_sender_main(void *arg) {
    diloco *d = (diloco *)arg;
    if (fault_requested("diloco_late_sender", 0)) {   // test hook: the thread scheduled 1 s late
        struct timespec late = {1, 0};
        nanosleep(&late, NULL);
    }
    state_hooks hooks = {stamp_sent_at, sending_cancelled, sender_began, d};
    transport_send_state(d->net, state_header(d), d->send_bytes, &hooks);
    atomic_store(&d->sender_finished, true);
    return NULL;
}

static void finish_sending_state(diloco *d, bool cancel);

static void start_sending_state(diloco *d, const train_state *st, bool catch_up) {
    finish_sending_state(d, false);   // a catch-up transfer before it: ended by the hub already
    atomic_store(&d->live_step, st->step);
    d->send_bytes = pack_state(d, st);
    char size[32];
    note("diloco: replica %d sends its state (%s) to the joining replica(s) while it trains on%s",
         diloco_replica_id(d), format_bytes(d->send_bytes, size, sizeof size),
         catch_up ? " and exchanges (catch-up: then the means of the rounds it lands meanwhile)" : "");
    d->catching_up = catch_up;
    atomic_store(&d->sender_finished, false);
    atomic_store(&d->sender_began, false);
    atomic_store(&d->cancel_sending, false);
    int rc = pthread_create(&d->sender, NULL, state_sender_main, d);
    if (rc != 0) fail("diloco: cannot start the thread that sends the state: %s", strerror(rc));
    d->sending = true;
    // A catch-up transfer is under way before this replica's next exchange: begun later (the
    // sender thread scheduled after that exchange took the pump), the rounds this replica landed
    // meanwhile were neither preserved nor sent, and the state went out stamped with a later
    // round than its header's; the hub dropped the donor and the joiner looped.
    struct timespec ms = {0, 1000000};
    while (catch_up && !atomic_load(&d->sender_began) && !atomic_load(&d->sender_finished)) nanosleep(&ms, NULL);
}

// cancel: the replica leaves (a stop, walltime, the run's end): the rest of the state is not
// sent (the hub ends the transfer when the donor goes; its joiners wait for another donor).
static void finish_sending_state(diloco *d, bool cancel) {
    if (!d->sending) return;
    if (cancel) atomic_store(&d->cancel_sending, true);
    int rc = pthread_join(d->sender, NULL);
    if (rc != 0) fail("diloco: cannot join the thread that sends the state: %s", strerror(rc));
    d->sending = false;
    d->catching_up = false;
}

// Whether a catch-up transfer of this donor is still going (its state, or the means after it).
static bool catching_up_as_donor(const diloco *d) {
    return d->sending && d->catching_up && !atomic_load(&d->sender_finished);
}

// The counters of a donor's state, checked: fatal (with a one-line reason) when malformed.
static state_counters check_state(const diloco *d, size_t got) {
    const uint8_t *p = d->state;
    uint32_t flags = got >= STATE_HEADER_BYTES ? get_u32(p + 12) : 0;
    size_t want = STATE_HEADER_BYTES + (flags & STATE_HAS_MOMENTUM ? 2 : 1) * (size_t)d->numel * sizeof(float);
    if (got < STATE_HEADER_BYTES || memcmp(p, STATE_MAGIC, 8) != 0)
        fail("diloco: the state received from the donor replica is malformed (%zu bytes, no state header)", got);
    if (get_u32(p + 8) != STATE_VERSION)
        fail("diloco: the donor's state is of version %u, this build reads version %d (replicas of different "
             "builds)",
             get_u32(p + 8), STATE_VERSION);
    if ((flags & ~STATE_HAS_MOMENTUM) != 0 || (int64_t)get_u64(p + 40) != d->numel || got != want)
        fail("diloco: the state received from the donor replica is malformed (%zu bytes, flags %u, %lld values; "
             "expected %zu bytes of %lld values)",
             got, flags, (long long)get_u64(p + 40), want, (long long)d->numel);
    state_counters c = {(int64_t)get_u64(p + 16), (int64_t)get_u64(p + 24), (int64_t)get_u64(p + 32),
                        (int64_t)get_u64(p + STATE_SENT_AT), (int64_t)get_u64(p + STATE_PHASE_MS),
                        (int64_t)get_u64(p + STATE_FINAL_NEXT), (flags & STATE_HAS_MOMENTUM) != 0};
    if (c.outer_step < 0 || c.step < 0 || c.step > d->cfg->max_steps || c.tokens < 0 || c.sent_at_step < c.step ||
        c.sent_at_step > d->cfg->max_steps || c.phase_ms < 0 || c.phase_ms > ((int64_t)1 << 40) ||
        c.final_next < 0 || c.final_next > d->n_fragments || (c.final_next > 0 && c.step != d->cfg->max_steps))
        fail("diloco: the donor's state has impossible counters (outer step %lld, step %lld, sent at step %lld, "
             "%lld ms into its phase, final sync of fragment %lld next)",
             (long long)c.outer_step, (long long)c.step, (long long)c.sent_at_step, (long long)c.phase_ms,
             (long long)c.final_next);
    for (int i = 0; i < RECENT_ROUNDS; i++) {
        const uint8_t *q = p + STATE_COUNTERS_BYTES + (size_t)i * ROUND_RECORD_BYTES;
        int64_t round = (int64_t)get_u64(q);
        if (round < -1 || (get_u32(q + 8) & ~1u) != 0 || get_u32(q + 12) >= (uint32_t)d->n_fragments)
            fail("diloco: the donor's state has an impossible record of its recent rounds (round %lld of fragment %u, "
                 "flags %u; this run has %d fragments)",
                 (long long)round, get_u32(q + 12), get_u32(q + 8), d->n_fragments);
    }
    return c;
}

static FILE *dump_open(diloco *d, const char *what, int64_t outer_step, int fragment);
static void dump_tensor(FILE *f, const float *x, int64_t n);
static void dump_close(FILE *f);
static void dump_bytes(diloco *d, const char *what, int64_t outer_step, int fragment, const uint8_t *bytes, size_t n);

// Round `round` in the donor's record (the state's, which take_catchup_mean keeps up to date):
// false where the record does not hold it (too old, or a donor that joined since); else
// whether it was applied, which fragment it synced, and whether this replica's whole
// contribution was in its mean.
static bool recorded_round(const diloco *d, int64_t round, bool *applied, int *fragment, bool *mine) {
    int id = diloco_replica_id(d);
    const uint8_t *q = d->state + STATE_COUNTERS_BYTES + (size_t)(round % RECENT_ROUNDS) * ROUND_RECORD_BYTES;
    if ((int64_t)get_u64(q) != round) return false;
    *applied = get_u32(q + 8) & 1;
    *fragment = (int)get_u32(q + 12);
    *mine = q[16 + id / 8] >> (id % 8) & 1;
    return true;
}

// Why a fragment's unsent work is not carried (carry_weights).
enum { CARRIED = 0, CARRY_IN_THETA, CARRY_FINAL_OVER };

// A joiner's unsent work (docs/diloco.md#late-work-carried): the replica took the group's θ_K at
// outer step K, while its own θ (θ_k, the group's at its outer step k < K) and its local weights
// x still hold what it trained since k and the group never received — it was late, dropped or
// stopped, or its exchange failed. Each fragment is decided on its own (a round syncs one), from
// the donor's record of rounds k .. K − 1:
//   - below final_next (a state of max_steps): its final sync is over, no round is left to send
//     work carried into it: θ_K whole (what[p] CARRY_FINAL_OVER);
//   - synced by an applied round whose mean held this replica's whole contribution: its work is
//     in θ already, θ_K whole (CARRY_IN_THETA). A replica contributes to one of those rounds at
//     most, round k (the one it was dropped from or whose exchange failed: its outer step stays
//     k, and so does the number of the next exchange it tries, which rejoins), and its work on
//     the other fragments was never sent;
//   - every other keeps its work, weighted by its staleness (CARRIED):
//         x ← θ_K − w·(θ_k − x),   w = 1 / (1 + s)
//     per element in double, stored in fp32, so that the fragment's next exchange sends it with
//     the replica's new work. s: the applied rounds of the fragment among k .. K − 1, the outer
//     steps its θ moved on without the work (0: θ did not move, and x stays as it is), plus
//     ⌈u / P⌉ for the u rounds the record does not hold (more than RECENT_ROUNDS behind, or a
//     donor that joined since), as if they had synced the fragments in turn; such a round
//     counts as not holding this replica's contribution (carried: where it did, w times that
//     contribution counts twice).
// Until 2026-12 one decision held for the whole model: a replica whose contribution to round k
// counted carried nothing, and its unsent work on the other P − 1 fragments was lost; and every
// fragment took s = ⌈(K − k) / P⌉, halving the work of fragments no round had synced.
// Fills w[p] (0: not carried) and what[p]; returns why nothing at all is carried, or NULL.
static const char *carry_weights(const diloco *d, int64_t from, int64_t to, int64_t final_next, double *w,
                                 int *what) {
    int P = d->n_fragments;
    for (int p = 0; p < P; p++) {
        w[p] = 0.0;
        what[p] = p < final_next ? CARRY_FINAL_OVER : CARRIED;
    }
    if (!d->cfg->diloco_carry_late) return "diloco_carry_late = 0";
    if (from >= to) return "not behind the group";
    int64_t *applied_rounds = xcalloc((size_t)P, sizeof *applied_rounds), unknown = 0;
    for (int64_t round = from; round < to; round++) {
        bool applied, mine;
        int p;
        if (!recorded_round(d, round, &applied, &p, &mine)) unknown++;
        else if (applied && mine && what[p] == CARRIED) what[p] = CARRY_IN_THETA;
        else if (applied) applied_rounds[p]++;
    }
    bool any = false, in_theta = false;
    for (int p = 0; p < P; p++) {
        in_theta |= what[p] == CARRY_IN_THETA;
        if (what[p] != CARRIED) continue;
        w[p] = 1.0 / (1.0 + (double)(applied_rounds[p] + (unknown + P - 1) / P));
        any = true;
    }
    free(applied_rounds);
    return any        ? NULL
           : in_theta ? "its contribution is in the group's θ"
                      : "the final syncs are over: no round is left to send it";
}

// Test hook: DIR/carry_<replica>_<K>_0.f32 holds θ_k, the local weights before (as the join
// found them: a fragment merge still due not yet applied), θ_K and the local weights after
// (each numel fp32 values), and carry_… .bin, for each fragment in turn,
// its weight w (f64, 0: not carried) and its offset and values (i64 each).
static void dump_carry(diloco *d, int64_t to, const float *theta_from, const float *params_from, const float *params,
                       const double *w) {
    FILE *f = dump_open(d, "carry", to, 0);
    if (!f) return;
    dump_tensor(f, theta_from, d->numel);
    dump_tensor(f, params_from, d->numel);
    dump_tensor(f, d->theta, d->numel);
    dump_tensor(f, params, d->numel);
    dump_close(f);
    uint8_t *b = xmalloc((size_t)d->n_fragments * 24);
    for (int p = 0; p < d->n_fragments; p++) {
        put_f64(b + 24 * p, w[p]);
        put_u64(b + 24 * p + 8, (uint64_t)d->fragments[p].offset);
        put_u64(b + 24 * p + 16, (uint64_t)d->fragments[p].numel);
    }
    dump_bytes(d, "carry", to, 0, b, (size_t)d->n_fragments * 24);
    free(b);
}

// Takes over the group's state: θ, m, step counters, data position; params ← θ, less the
// replica's unsent work (carry_weight). Every rank of a sharded replica calls it together (the
// hash in the log is the replica's).
// What the last diloco_join / diloco_after_step / diloco_settle changed in params (HSDP's other
// copies take only that: diloco_changed_range).
static void changed_none(diloco *d) {
    d->changed_lo = d->numel;
    d->changed_hi = 0;
}
static void changed_add(diloco *d, int64_t offset, int64_t numel) {
    if (offset < d->changed_lo) d->changed_lo = offset;
    if (offset + numel > d->changed_hi) d->changed_hi = offset + numel;
}

static int fragment_due(const diloco *d, int64_t step);
static uint64_t tokens_per_step(const diloco *d);

// Whether some fragment syncs after inner step s (s ≥ 1), or s is the run's last step.
static bool any_sync_after(const diloco *d, int64_t s) { return s >= d->cfg->max_steps || fragment_due(d, s) >= 0; }

// The steps from `step` to the next sync (that sync's step included): what a replica at
// `step` trains before it contributes.
static int64_t steps_to_sync(const diloco *d, int64_t step) {
    int64_t s = step + 1;
    while (!any_sync_after(d, s)) s++;
    return s - step;
}

// The steps a joiner skips: those its donor trained while the state went (c->step to
// c->sent_at_step), so that its phase ends with the group's instead of a transfer later — but
// never a step after which some fragment syncs (each sync is a round the joiner takes part in),
// so it trains at least the step that ends its phase. Its data moves by them like the steps a
// late joiner missed (diloco_seek_data), and its next contribution of each fragment counts only
// the steps it trained (its tokens weigh it in the mean).
static int64_t joiner_skip(const diloco *d, const state_counters *c) {
    int64_t to = c->step;
    while (to < c->sent_at_step && !any_sync_after(d, to + 1)) to++;
    return to - c->step;
}

// A catch-up join: the means of the rounds the group closed while the state came (round K + 1,
// K + 2, .. after the state's K), each applied to the state's θ and m as the transport hands it
// (transport_options.catchup_sink: in order, once the state is whole; index 0 again for a new
// state, and -1 when a transfer whose means were handed is aborted), elementwise as every member applied them; the counters become those of the donor at
// that landing, and the state's record of recent rounds takes it. A malformed one is fatal. The
// joiner thus holds one mean at a time, not the j · b↓·N/P of every round closed meanwhile.
static bool average_delta(diloco *d, const fragment *f, const round_result *r);
static void outer_update(const diloco *d, const fragment *f, float *theta, float *momentum, double lr, double mu);

static void take_catchup_mean(void *arg, int index, const uint8_t *p, size_t bytes, size_t state_bytes) {
    diloco *d = arg;
    state_counters *c = &d->caught_up_counters;
    if (index < 0) {   // the transfer was aborted: the means taken were of a state that is gone
        d->caught_up = 0;
        return;
    }
    if (index == 0) {
        *c = check_state(d, state_bytes);
        d->caught_up = 0;
    }
    if (index != d->caught_up) fail("diloco: catch-up mean %d handed after %d (a transport bug)", index, d->caught_up);
    float *theta = (float *)(d->state + STATE_HEADER_BYTES), *momentum = theta + d->numel;
    if (!c->with_m) {
        memset(momentum, 0, (size_t)d->numel * sizeof(float));
        c->with_m = true;
    }
    catchup_header h;
    if (read_catchup(p, bytes, &h))
        fail("diloco: catch-up mean %d from the donor is malformed (%zu bytes)", index + 1, bytes);
    if (h.round != c->outer_step || h.fragment < 0 || h.fragment >= d->n_fragments || h.step < c->step ||
        h.step > d->cfg->max_steps || h.tokens < c->tokens || h.phase_ms < 0 ||
        bytes != CATCHUP_HEADER_BYTES + (h.applied ? d->fragments[h.fragment].mean_bytes : 0) || !isfinite(h.lr) ||
        !isfinite(h.mu) || (h.final && (h.step != d->cfg->max_steps || h.fragment < c->final_next)))
        fail("diloco: catch-up mean %d is inconsistent (round %lld after outer step %lld, fragment %lld, step %lld "
             "after %lld, %zu bytes)",
             index + 1, (long long)h.round, (long long)c->outer_step, (long long)h.fragment, (long long)h.step,
             (long long)c->step, bytes);
    if (h.applied) {
        const fragment *fr = &d->fragments[h.fragment];
        round_result r = {.mean = p + CATCHUP_HEADER_BYTES, .mean_bytes = fr->mean_bytes};
        if (!average_delta(d, fr, &r)) fail("diloco: catch-up mean of round %lld holds NaN/Inf", (long long)h.round);
        outer_update(d, fr, theta, momentum, h.lr, h.mu);
    }
    put_round_record(d->state + STATE_COUNTERS_BYTES + (size_t)(h.round % RECENT_ROUNDS) * ROUND_RECORD_BYTES,
                     h.round, h.applied, (int)h.fragment, h.ids);
    c->outer_step = h.round + 1;
    c->step = c->sent_at_step = h.step;
    c->tokens = h.tokens;
    c->phase_ms = h.phase_ms;
    if (h.final) c->final_next = h.fragment + 1;   // (a regular round at max_steps leaves it at 0)
    d->caught_up++;
}

// After a join that took a state: the counters it ends with, the state's or those after its
// catch-up means (all of which the transport handed: a count that differs is fatal), and how
// many means those were (*means).
static state_counters joined_counters(diloco *d, size_t got, int *means) {
    int count = transport_catchup_count(d->net);
    *means = count > 0 ? count : 0;
    if (count <= 0 && d->caught_up == 0) return check_state(d, got);
    if (d->caught_up != count)
        fail("diloco: replica %d applied %d catch-up mean(s) but the hub ended its catch-up after %d",
             diloco_replica_id(d), d->caught_up, count);
    return d->caught_up_counters;
}

static void merge_fragment(diloco *d, float *const *params, int n_params, train_state *st);
static double merge_alpha(const diloco *d, const train_state *st, int64_t begin);

static void adopt_state(diloco *d, size_t got, float *params, train_state *st, dataloader *train) {
    const uint8_t *p = d->state;
    int64_t state_round = check_state(d, got).outer_step;
    int caught_up = 0;
    state_counters c = joined_counters(d, got, &caught_up);
    size_t bytes = (size_t)d->numel * sizeof(float);
    // The local weights as the join found them, for the test dump only.
    float *params_found = NULL;
    if (d->dump_dir) {
        params_found = alloc_floats((size_t)d->numel);
        memcpy(params_found, params, bytes);
    }
    // A fragment merge still due (a checkpoint landed its round early, st->merge_step, and the
    // replica came back from it) is applied first: its round is in θ_k, this replica's
    // contribution to it too, and the merge takes (1 − α) of the local weights' difference from
    // θ_k out, as it would have at its step. The work carried below is what the replica would
    // have held then. Until 2026-12 the join dropped the merge and carried θ_k − x whole on
    // that fragment: (1 − α) of its own work of that round, in θ already, counted again.
    if (st->merge_step > 0) merge_fragment(d, &params, 1, st);
    int P = d->n_fragments;
    double *w = xcalloc((size_t)P, sizeof *w);
    int *what = xcalloc((size_t)P, sizeof *what);
    const char *why_not = carry_weights(d, st->outer_step, c.outer_step, c.final_next, w, what);
    const float *theta_to = (const float *)(p + STATE_HEADER_BYTES);  // θ_K, in the state buffer
    // A sharded replica's ranks decide for their own pieces (each group's record of who was in),
    // and all sum the carried work's square together (a collective, whatever each decided).
    double mine = 0.0;
    double *frag_sq = xcalloc((size_t)P, sizeof *frag_sq);   // this rank's work per fragment
    for (int q = 0; q < P && !why_not; q++) {
        const fragment *fr = &d->fragments[q];
        if (w[q] > 0.0)
            for (int64_t i = fr->offset; i < fr->offset + fr->numel; i++) {
                double x = (double)d->theta[i] - (double)params[i];
                frag_sq[q] += x * x;
            }
        mine += frag_sq[q];
    }
    if (!isfinite(mine)) {
        why_not = "its local work holds NaN/Inf";
        mine = 0.0;
    }
    double work_sq = replica_sum(d, mine);
    if (!why_not && work_sq == 0.0) why_not = "no local work since its last outer step";
    double w_max = 0.0;
    for (int q = 0; q < P; q++) {
        if (why_not) w[q] = 0.0;
        w_max = fmax(w_max, w[q]);
    }
    // The tensors before, for the test dump only.
    float *theta_from = NULL;
    if (w_max > 0.0 && d->dump_dir) {
        theta_from = alloc_floats((size_t)d->numel);
        memcpy(theta_from, d->theta, bytes);
    }
    // θ_k is still in d->theta and θ_K in the state buffer: no copy of the model needed.
    for (int q = 0; q < P; q++) {
        const fragment *fr = &d->fragments[q];
        double wq = w[q];
        if (wq == 0.0) {
            memcpy(params + fr->offset, theta_to + fr->offset, (size_t)fr->numel * sizeof(float));
            continue;
        }
#pragma omp parallel for schedule(static)
        for (int64_t i = fr->offset; i < fr->offset + fr->numel; i++)
            params[i] = (float)((double)theta_to[i] - wq * ((double)d->theta[i] - (double)params[i]));
    }
    d->final_next = c.final_next;
    // Work carried into fragment q weighs one inner step in its next contribution if there is
    // some on this rank's piece (a fragment synced just before the checkpoint it came back from
    // has none: its Δ is 0 and goes with tokens 0, left out of the mean). Each rank for its own
    // group, as carry_weights decides.
    for (int q = 0; q < P; q++) d->carried[q] = w[q] > 0.0 && frag_sq[q] > 0.0;
    free(frag_sq);
    for (int q = 0; q < P; q++) d->final_missed[q] = -1;   // θ whole, carried, or its final sync to come
    changed_add(d, 0, d->numel);
    memcpy(d->theta, theta_to, bytes);
    if (c.with_m) memcpy(d->momentum, p + STATE_HEADER_BYTES + bytes, bytes);
    else memset(d->momentum, 0, bytes);
    if (!all_finite(d->theta, d->numel) || !all_finite(d->momentum, d->numel))
        fail("diloco: the donor's state holds NaN/Inf");
    if (theta_from) dump_carry(d, c.outer_step, theta_from, params_found, params, w);
    free(theta_from);
    free(params_found);
    if (d->residual) memset(d->residual, 0, bytes);
    int64_t was = st->step, was_outer = st->outer_step;
    int64_t skip = (int64_t)replica_min(d, (double)joiner_skip(d, &c));
    st->step = c.step + skip;
    st->restart_step = st->step;
    st->outer_step = c.outer_step;
    st->tokens_seen = c.tokens + (uint64_t)skip * tokens_per_step(d);
    st->bad_steps = st->norm_spikes = st->loss_spikes = 0;   // new weights: no streak goes on
    st->merge_step = 0;
    st->merge_fragment = st->merge_fragments = 0;
    diloco_seek_data(d->cfg, train, st, was);
    d->joined_phase_s = (double)c.phase_ms / 1e3;  // join_group starts this replica's phase there
    uint64_t hash = replica_hash(d, d->theta, d->numel);
    uint64_t held_bytes = 0;
    int held = caught_up > 0 ? transport_catchup_held(d->net, &held_bytes) : 0;
    // What it carried: with streaming each fragment's weight (0: not carried) and the fragments
    // whose work was in θ already.
    strbuf carried = {0}, per = {0};
    sb_append(&per, "");
    if (w_max > 0.0) {
        sb_printf(&carried, "{\"from_outer_step\":%lld,\"weight\":%.17g,\"work_norm\":%.6g", (long long)was_outer,
                  w_max, sqrt(work_sq));
        if (P > 1) {
            sb_append(&carried, ",\"fragment_weights\":[");
            for (int q = 0; q < P; q++) sb_printf(&carried, "%s%.17g", q ? "," : "", w[q]);
            sb_append(&carried, "],\"in_theta\":[");
            for (int q = 0, n = 0; q < P; q++)
                if (what[q] == CARRY_IN_THETA) sb_printf(&carried, "%s%d", n++ ? "," : "", q);
            sb_append(&carried, "]");
            for (int q = 0; q < P; q++) {
                sb_append(&per, q ? ", " : ": fragment ");
                if (w[q] > 0.0) sb_printf(&per, "%d weight %.3g", q, w[q]);
                else sb_printf(&per, "%d %s", q, what[q] == CARRY_IN_THETA ? "in θ already" : "its final sync over");
            }
        }
        sb_append(&carried, "}");
    } else {
        sb_append(&carried, "false,\"not_carried\":");
        sb_json_string(&carried, why_not);
    }
    strbuf extra = {0};
    sb_printf(&extra,
              "\"outer_step\":%lld,\"from_step\":%lld,\"param_hash\":\"%016llx\",\"state_bytes\":%zu,"
              "\"skipped_steps\":%lld,\"donor_phase_s\":%.3f,\"caught_up_rounds\":%d,\"catchup_held_max\":%d,"
              "\"catchup_held_bytes\":%llu,\"carried\":%s",
              (long long)c.outer_step, (long long)was, (unsigned long long)hash, got, (long long)skip,
              d->joined_phase_s, caught_up, held, (unsigned long long)held_bytes, carried.data);
    metrics_event(d->log, "diloco_join", c.step, extra.data);
    note("diloco: replica %d took the group's state: outer step %lld, step %lld (was at step %lld, outer step %lld)",
         diloco_replica_id(d), (long long)c.outer_step, (long long)c.step, (long long)was, (long long)was_outer);
    if (c.outer_step < was_outer && d->rank == 0)
        warn("diloco: replica %d went back %lld outer step(s): the group it joined is at outer step %lld, its own "
             "state was at %lld (a replica behind the others founded the group after the hub lost it: "
             "docs/diloco.md#membership-and-faults-tcp)",
             diloco_replica_id(d), (long long)(was_outer - c.outer_step), (long long)c.outer_step,
             (long long)was_outer);
    if (caught_up > 0) {
        char size[32];
        note("diloco: replica %d caught up: the state of outer step %lld, then the means of the %d round(s) the group "
             "closed while it came, applied as they came (at most %d held at once, %s)",
             diloco_replica_id(d), (long long)state_round, caught_up, held, format_bytes(held_bytes, size, sizeof size));
    }
    if (skip > 0)
        note("diloco: replica %d skips to step %lld, where its donor was when the state arrived: its phase ends with "
             "the group's (%lld step(s) to its next sync)",
             diloco_replica_id(d), (long long)st->step, (long long)(steps_to_sync(d, st->step)));
    if (d->cfg->diloco_sync_every_s > 0)
        note("diloco: replica %d's inner phase began %.1f s ago with its donor's: it syncs when diloco_sync_every_s "
             "%g s is up (%.1f s from now, after at least %lld step(s))",
             diloco_replica_id(d), d->joined_phase_s, d->cfg->diloco_sync_every_s,
             fmax(0.0, d->cfg->diloco_sync_every_s - d->joined_phase_s), (long long)steps_to_sync(d, st->step));
    if (w_max > 0.0)
        note("diloco: replica %d carries its unsent work of outer steps %lld .. %lld into its weights, %s%.3g (norm "
             "%.3g)%s",
             diloco_replica_id(d), (long long)was_outer, (long long)c.outer_step, P > 1 ? "weight at most " : "weight ",
             w_max, sqrt(work_sq), per.data);
    sb_free(&carried);
    sb_free(&per);
    sb_free(&extra);
    free(w);
    free(what);
}

// The counters a join ends with: the state's, or after a catch-up the donor's at the last mean
// (its round + 1, its step and tokens): a sharded replica's ranks compare these (their states
// may be of different rounds — each rank's hub gives the state of the first close after that
// rank's JOIN — and their means bring them to the same).
static state_counters final_counters(diloco *d, size_t got) {
    int means;
    return joined_counters(d, got, &means);
}

// A sharded replica's ranks that took catch-up states end them at one round: each rank's hub
// answered its CAUGHT_UP with the last round it had closed, which may be one more at one hub
// than at another; those behind take the means up to the furthest (transport_catchup_extend),
// until all agree. false: a rank lost its hub meanwhile (every rank joins again).
static bool agree_catchup_round(diloco *d, size_t got) {
    state_counters c = check_state(d, got);
    // Every rank holds its state now: each tells its hubs it caught up (deferred until then:
    // transport_options.defer_caught_up) and waits for the means up to the round they answer.
    int64_t said = transport_catchup_extend(d->net, -1);
    int64_t mine = said == -2 ? c.outer_step - 1 : said;   // -2: a whole transfer's state, no means
    for (int attempt = 0; attempt < 16; attempt++) {
        if (replica_max(d, mine < 0 ? 1.0 : 0.0) > 0) return false;
        int64_t hi = (int64_t)replica_max(d, (double)mine), lo = (int64_t)replica_min(d, (double)mine);
        if (hi == lo) return true;
        if (mine < hi) mine = transport_catchup_extend(d->net, hi);
    }
    return false;
}

// Joins (or after an eviction rejoins) the group; returns whether it took the group's state.
//
// A sharded replica: every rank joins its own group (rank j of every replica), and the ranks
// then agree. All members: train on. All took a state: adopt it if the donors' counters (step,
// outer step, tokens) are the same on every rank — the pieces then come from groups at the same
// outer boundary, so together they are one model; if they differ, or some ranks are members
// while others took a state (a group's status is known only until its first round closes, so
// a replica joining at that moment can be a member of one group and not of another), every
// rank joins again with a status no group has: each then takes its group's state at the next
// round close, which the live replicas reach together. Three tries, then a one-line error
// (restarting the replica joins afresh).
static bool join_group_agreed(diloco *d, float *params, train_state *st, dataloader *train, bool rejoin) {
    for (int attempt = 0; attempt < 3; attempt++) {
        // After a disagreement a status that matches no group's makes every rank wait for a state.
        uint64_t hash = diloco_hash(d->theta, d->numel) ^ (attempt ? 0x5a5a5a5a5a5a5a5aull : 0);
        replica_status s = {st->outer_step, hash, st->step};
        size_t got = 0;
        d->caught_up = 0;   // the transport hands a catch-up's means from index 0 (take_catchup_mean)
        join_result r = rejoin || attempt ? transport_rejoin(d->net, &s, d->state, d->state_bytes, &got)
                                          : transport_join(d->net, &s, d->state, d->state_bytes, &got);
        // The run is over for every rank if it is over for one: that rank's group has nobody
        // left, so the replica could never apply an outer step again.
        bool over = r == JOIN_FINISHED;
        if (d->ranks > 1) over = replica_max(d, over ? 1.0 : 0.0) > 0;
        if (over) {
            // Over after the join had come as far as waiting for a state (on any rank, or on a
            // rank that joined its group meanwhile, or a join again after the ranks disagreed):
            // the run finished while this replica waited (a donor left before its state was
            // whole, or none came after the last round). Over at once everywhere: the run was
            // over when it came.
            bool waited = r != JOIN_FINISHED || attempt > 0 || transport_join_waited(d->net);
            if (d->ranks > 1) waited = replica_max(d, waited ? 1.0 : 0.0) > 0;
            d->over = true;
            d->over_waited = waited;
            return false;
        }
        // A stop request while the hub held the join: every rank stops, none adopts a state.
        bool stopped = r == JOIN_STOPPED;
        if (d->ranks > 1) stopped = replica_max(d, stopped ? 1.0 : 0.0) > 0;
        if (stopped) {
            d->stopped = true;
            return false;
        }
        if (d->ranks == 1) {
            if (r != JOIN_GOT_STATE) return false;
            adopt_state(d, got, params, st, train);
            return true;
        }
        bool took = r == JOIN_GOT_STATE;
        int ranks_took = (int)replica_sum(d, took ? 1.0 : 0.0);
        if (ranks_took == 0) return false;
        if (ranks_took == d->ranks && agree_catchup_round(d, got)) {
            state_counters c = final_counters(d, got);
            bool same = true;
            for (int i = 0; i < 3; i++) {
                double x = (double)(i == 0 ? c.outer_step : i == 1 ? c.step : c.tokens);
                same = same && replica_max(d, x) == replica_min(d, x);
            }
            if (same) {
                adopt_state(d, got, params, st, train);
                return true;
            }
        }
        if (attempt + 1 < 3)
            warn("diloco: replica %d's ranks joined their groups inconsistently (%d of %d took a state%s); joining "
                 "again (try %d of 3)",
                 diloco_replica_id(d), ranks_took, d->ranks, ranks_took == d->ranks ? " of different steps" : "",
                 attempt + 2);
    }
    fail("diloco: the %d ranks of replica %d could not take one consistent state from their groups in 3 tries; "
         "restart the replica (it resumes from its checkpoint and rejoins)",
         d->ranks, diloco_replica_id(d));
}

// The ranks of a replica join together (join_group_agreed). A join may wait for the group's
// next boundary (many inner steps of the others), and one rank may come back long before
// another (a member at once, another waiting for a state): the ranks wait for each other
// without comm_timeout_s (the launcher still ends a replica whose rank died).
static void poll_transport(void *arg, double seconds) { transport_poll(((diloco *)arg)->net, seconds); }

static bool join_group(diloco *d, float *params, train_state *st, dataloader *train, bool rejoin) {
    finish_sending_state(d, d->catching_up);   // rejoining, a catch-up donor's transfer is over
    double limit_s = comm_timeout();
    if (d->ranks > 1) {
        comm_set_timeout(COMM_NO_TIMEOUT_S);
        // A rank that holds its catch-up state first takes its means while its others receive
        // theirs: queued at its hub, they would make the hub stop reading the donor's rank there.
        comm_set_idle(poll_transport, d);
    }
    // 8 B/param that pages in only as a state arrives, and goes back to the system after it.
    d->state = xmalloc(d->state_bytes);
    bool took = join_group_agreed(d, params, st, train, rejoin);
    free(d->state);
    d->state = NULL;
    if (d->ranks > 1) {
        comm_set_timeout(limit_s);
        comm_set_idle(NULL, NULL);
    }
    // A joiner's phase began with its donor's (diloco_sync_every_s: it syncs with the group).
    d->phase_start_s = wall_seconds() - (took ? d->joined_phase_s : 0.0);
    d->extra_steps = 0;
    return took;
}

void diloco_seek_data(const train_config *cfg, dataloader *train, train_state *st, int64_t from_step) {
    int64_t per_epoch = dataloader_batches_per_epoch(train);
    int64_t at = st->data.epoch * per_epoch + st->data.index + (st->step - from_step) * cfg->grad_accum;
    if (at < 0) at = 0;
    dataloader_seek(train, (data_position){at / per_epoch, at % per_epoch});
    st->data = dataloader_position(train);
}

// Whether the last state taken left late work carried into a fragment whose final sync is to come.
static bool carries_into_final_syncs(const diloco *d) {
    for (int64_t q = d->final_next; q < d->n_fragments; q++)
        if (d->carried[q]) return true;
    return false;
}

void diloco_join(diloco *d, float *params, train_state *st, dataloader *train, bool fresh) {
    size_t bytes = (size_t)d->numel * sizeof(float);
    if (fresh) {
        memcpy(d->theta, params, bytes);
        memset(d->momentum, 0, bytes);
        if (d->residual) memset(d->residual, 0, bytes);
        st->outer_step = 0;
    }
    changed_none(d);
    if (join_group(d, params, st, train, false)) {
        // A state at max_steps: the group was in its final syncs (the last step's, one per
        // fragment) or past them, and this replica trains nothing of the run. It takes part in
        // those still to come with no work (tokens 0: the mean leaves it out), so that it ends
        // with the group's final θ, as the replicas that finished do (train_gpt.cu writes its
        // checkpoint then). Until 2026-12 it stopped at once ("nothing to do"): no checkpoint,
        // and with final syncs to come its θ was not the group's final one.
        d->joined_at_end = st->step == d->cfg->max_steps;
        if (d->joined_at_end && d->final_next < d->n_fragments)
            note("diloco: replica %d joined at the run's end (step %lld = max_steps): it takes part in the group's "
                 "%lld final sync(s) still to come, %s",
                 diloco_replica_id(d), (long long)st->step, (long long)(d->n_fragments - d->final_next),
                 carries_into_final_syncs(d) ? "with the late work it carries (weighted as one inner step a fragment)"
                            : "with no work of its own (tokens 0: the mean leaves it out)");
        else if (d->joined_at_end)
            note("diloco: replica %d joined after the group's final syncs: the state it took (step %lld = max_steps) "
                 "holds the group's final weights",
                 diloco_replica_id(d), (long long)st->step);
        return;
    }
    // Started fresh and told at its join that the run is over: a new run against an old relay
    // whose group finished (a configuration error), unless it had waited for the group's state
    // and the run finished meanwhile (a finishing donor does not wait for its transfer, and a
    // join after the last round close gets no donor at all). Then it came too late: nothing of
    // its own to keep, status 0 (train_gpt.cu: stopped, the run over) as a replica resumed from
    // a checkpoint does. Until 2026-12 that exited 1 with the line below.
    if (d->over && fresh && !d->over_waited)
        fail("diloco: replica %d starts a run that the relay says is over (another replica of the same "
             "configuration finished it); for a new run of this configuration restart the relay, or resume this "
             "replica from its checkpoint",
             diloco_replica_id(d));
    if (d->over && fresh) {
        note("diloco: replica %d came too late: the run finished while it waited for the group's state; the final "
             "weights are in the checkpoints of the replicas that finished, and it trained nothing of its own to "
             "save; it stops",
             diloco_replica_id(d));
        return;
    }
    if (d->over) {
        note("diloco: replica %d at step %lld (outer step %lld): the run is over, nothing to join; it stops",
             diloco_replica_id(d), (long long)st->step, (long long)st->outer_step);
        return;
    }
    if (d->stopped) {
        note("diloco: replica %d was stopped by a signal while it waited to join the group; it stops without "
             "training",
             diloco_replica_id(d));
        return;
    }
    uint64_t hash = replica_hash(d, d->theta, d->numel);
    char extra[128];
    snprintf(extra, sizeof extra, "\"outer_step\":%lld,\"param_hash\":\"%016llx\"", (long long)st->outer_step,
             (unsigned long long)hash);
    metrics_event(d->log, "diloco_member", st->step, extra);
    char sparse[64] = "";
    if (quant_codec_keep(d->quant))
        snprintf(sparse, sizeof sparse, ", the largest %lld of every %lld", (long long)quant_codec_keep(d->quant),
                 (long long)d->block);
    note("diloco: replica %d of %d joined at outer step %lld (%s transport, %s outer gradients%s%s)",
         diloco_replica_id(d), diloco_replicas(d), (long long)st->outer_step, d->cfg->diloco_transport,
         quant_kind_name(quant_codec_kind(d->quant)), sparse, d->ranks > 1 ? ", one group per rank" : "");
}

// ---------------------------------------------------------------- the outer step

// What this replica sends for fragment f: θᵢ itself (none) or its quantized Δᵢ. Returns the
// relative L2 error of what is sent against the true Δᵢ (0 for none).
static double encode_contribution(diloco *d, const fragment *f, const float *params, float *residual,
                                  uint8_t *payload) {
    int64_t o = f->offset, n = f->numel;
    if (d->quant == QUANT_NONE) {
        quant_encode_segments(QUANT_NONE, params + o, NULL, n, d->block, d->segment, payload);
        return 0.0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = o; i < o + n; i++) d->delta[i] = d->theta[i] - params[i];
    if (!d->local && fault_requested("diloco_hostile", 0))   // test hook: a replica gone wild
        for (int64_t i = o; i < o + n; i++) d->delta[i] *= 100.0f;
    return quant_encode_segments(d->quant, d->delta + o, residual ? residual + o : NULL, n, d->block, d->segment,
                                 payload);
}

// How fragment f travels: what the transport (and the hub) must know to reduce it, and the
// tokens behind it (its weight in the mean).
static payload_spec spec_of(const diloco *d, const fragment *f, uint64_t tokens) {
    return (payload_spec){.up_codec = d->quant, .down_codec = d->down, .down_feedback = d->down_feedback,
                          .block = d->block, .segment = d->segment, .values = f->numel, .offset = f->offset,
                          .model_values = d->numel, .bound = d->bound, .tokens = tokens, .no_work = tokens == 0};
}

// Whether fragment f syncs after inner step s (s ≥ 1): every H steps, and after the decay
// phase's start every H_d (diloco_decay_inner_steps), counted from that start.
static bool syncs_after(const diloco *d, const fragment *f, int64_t s) {
    if (s > d->decay_from) return (s - d->decay_from) % d->decay_H == f->decay_offset;
    return s % d->cfg->diloco_inner_steps == f->sync_offset;
}

// The inner steps since fragment f last synced, when it syncs after inner step `step`: back to
// the previous step it synced at (or the start). With streaming the fragment's phase is H
// steps like any other's; the final sync's may be shorter, and so may the one that crosses
// into the decay phase with diloco_decay_inner_steps.
static int64_t steps_since_sync(const diloco *d, const fragment *f, int64_t step) {
    int64_t previous = step - 1;
    while (previous > 0 && !syncs_after(d, f, previous)) previous--;
    return step - previous;
}

// The inner steps of this replica's work on fragment f that its sync after st->step sends: those
// since the fragment's previous sync; after a join or a rollback (the weights started over from
// θ at st->restart_step, saved in checkpoints) only those trained since.
static int64_t unsent_steps(const diloco *d, const fragment *f, const train_state *st) {
    return st->step - max_i64(st->restart_step, st->step - steps_since_sync(d, f, st->step));
}

// Training tokens of one inner step of this replica (all its ranks, HSDP's copies too: each
// reads its own micro-batches). Replicas may differ in batch_size and grad_accum (docs/diloco.md).
static uint64_t tokens_per_step(const diloco *d) {
    const train_config *c = d->cfg;
    uint64_t copies = c->dp_replicate > 1 ? (uint64_t)c->dp_replicate : 1;
    return (uint64_t)(c->batch_size * c->model.seq_len * c->grad_accum) * (uint64_t)d->ranks * copies;
}

// delta[fragment] ← the decoded mean the reducer sent back (the hub, the MPI ranks, or this
// process with diloco_transport = local): the group's Δ, or with quant none the mean of the
// θᵢ, whose Δ = θ − mean the outer step takes in double (exact: M = 1 with lr 1 then gives
// θ = θ₁ bit for bit). False when the mean
// holds NaN/Inf (every contribution to some segment was non-finite): every replica received
// the same bytes, so every replica skips the step alike.
static bool average_delta(diloco *d, const fragment *f, const round_result *r) {
    int64_t o = f->offset, n = f->numel;
    if (r->mean_bytes != f->mean_bytes) return false;
    const uint8_t *in = r->mean;
    for (int64_t s0 = 0; s0 < n; s0 += d->segment) {
        int64_t len = min_i64(d->segment, n - s0);
        if (!quant_is_finite(d->down, in, len, d->block)) return false;
        in += quant_encoded_bytes(d->down, len, d->block);
    }
    in = r->mean;
    for (int64_t s0 = 0; s0 < n; s0 += d->segment) {
        int64_t len = min_i64(d->segment, n - s0);
        quant_decode(d->down, in, len, d->block, d->delta + o + s0);
        in += quant_encoded_bytes(d->down, len, d->block);
    }
    return true;
}

// A round this replica's θ did not take (skipped by every replica, or its exchange failed):
// the residual goes back to what it was before the round's encode. Encoding set it to
// r' = (Δᵢ + r) − decode(sent) as if what was sent had counted; but θ stays and so do the local
// weights, so the next Δᵢ holds this round's work again, and with r' it would carry the part
// of it that was not sent twice: for good in θ, a whole quantization error with int4, and
// nearly the whole Δᵢ with a sparse codec (top 3 %: 97 % of it). r = r' − Δᵢ + decode(sent),
// equal to the old r up to fp32 rounding; with no memory of its own: d->delta still holds
// this round's Δᵢ (average_delta decodes into it only for a mean it applies) and d->payload
// what was sent. (diloco_transport = local never gets here: its M contributions are all
// finite, or begin_round stopped the run, so its mean is applied.)
static void restore_residual(diloco *d, const fragment *fr, flight *f) {
    if (!d->residual || d->quant == QUANT_NONE || d->local) return;
    if (f->poisoned) memcpy(d->payload, f->unpoisoned, sizeof f->unpoisoned);
    int64_t o = fr->offset, n = fr->numel;
    float *r = d->residual + o, *delta = d->delta + o;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) r[i] -= delta[i];
    quant_decode_segments(d->quant, d->payload, n, d->block, d->segment, delta);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) r[i] += delta[i];
}

// diloco_transport = local: the hub's reduction of the M contributions in this process,
// segment by segment, with the same arithmetic and the same downlink residual as the hub.
static void reduce_locally(diloco *d, const fragment *f, int m) {
    const uint8_t *ins[TRANSPORT_MAX_REPLICAS];
    size_t up = 0, down = 0;
    for (int64_t s0 = 0; s0 < f->numel; s0 += d->segment) {
        int64_t len = min_i64(d->segment, f->numel - s0);
        for (int i = 0; i < m; i++) ins[i] = d->local_payload[i] + up;
        float *residual = d->hub_residual ? d->hub_residual + f->offset + s0 : NULL;
        quant_reduction q = {.up = d->quant, .down = d->down, .block = d->block, .bound = d->bound};
        quant_reduce_segment(&q, ins, m, len, residual, d->segment_scratch, d->local_mean + down, NULL);
        up += quant_encoded_bytes(d->quant, len, d->block);
        down += quant_encoded_bytes(d->down, len, d->block);
    }
}

// The outer momentum of a fragment's outer step k (1-based): μ, ramped linearly from μ/W over
// the first W = diloco_momentum_warmup outer steps (0 = no ramp).
static double outer_momentum(const diloco *d, int64_t k) {
    double mu = d->cfg->diloco_outer_momentum;
    int64_t w = d->cfg->diloco_momentum_warmup;
    return w > 0 && k < w ? mu * (double)k / (double)w : mu;
}

// The step at which a round lands in a straight run: τ steps after it began, or at the last step.
// diloco_settle lands one earlier (a checkpoint with a round in flight); what the round computes
// takes this step, not the step it landed at, or a checkpoint would change θ (the outer lr and μ
// switch to plain averaging at the decay phase's start).
static int64_t landing_step(const diloco *d, const flight *f) {
    int64_t s = f->begin_step + (f->final ? 0 : d->overlap);
    return s < d->cfg->max_steps ? s : d->cfg->max_steps;
}

// The lr and μ of a fragment's outer step k landed after `step` inner steps: the config's, μ
// ramped (outer_momentum); lr 1, μ 0 (θ = the mean) with diloco_plain_in_decay once its inner
// steps reached the schedule's decay phase.
static void outer_settings(const diloco *d, int64_t k, int64_t step, double *lr, double *mu) {
    const train_config *cfg = d->cfg;
    int64_t decay_start = decay_start_step(cfg);
    bool plain = cfg->diloco_plain_in_decay && cfg->max_steps > decay_start && step > decay_start;
    *lr = plain ? 1.0 : cfg->diloco_outer_lr;
    *mu = plain ? 0.0 : outer_momentum(d, k);
}

// Outer step k of fragment f, landed after `step` inner steps: SGD with momentum μ as
// torch.optim.SGD(dampening=0) with Δ as the gradient — Nesterov (the default) or heavy-ball
// (diloco_nesterov = 0) — on θ and m, with outer_settings' lr and μ.
// theta and momentum: d->theta and d->momentum, or (a joiner catching up) the state's; Δ in
// d->delta.
static void outer_update(const diloco *d, const fragment *f, float *theta, float *momentum, double lr, double mu) {
    int64_t o = f->offset, n = f->numel;
    bool nesterov = d->cfg->diloco_nesterov;
#pragma omp parallel for schedule(static)
    for (int64_t i = o; i < o + n; i++) {
        double delta = d->quant == QUANT_NONE ? (double)theta[i] - (double)d->delta[i] : (double)d->delta[i];
        double m = mu * (double)momentum[i] + delta;
        double update = nesterov ? delta + mu * m : m;
        // μ = 0 (diloco_outer_momentum 0, or diloco_plain_in_decay's steps): no later step of
        // the run reads m, and it is kept at zero, as torch's SGD keeps no buffer without
        // momentum — so a donor need not send it (pack_state). (A run resumed with a larger
        // max_steps may take momentum again: it starts from m = 0, as torch turning it on.)
        momentum[i] = mu == 0.0 ? 0.0f : (float)m;
        theta[i] = (float)((double)theta[i] - lr * update);
    }
}

static void dump_tensor(FILE *f, const float *x, int64_t n) {
    if (fwrite(x, sizeof(float), (size_t)n, f) != (size_t)n) fail("TRAIN_GPT_DILOCO_DUMP: write failed");
}

// Test hook: DIR/outer_<replica>_<k>_<fragment>.f32 holds, for the fragment synced by outer
// step k, θ before, θᵢ (local weights), Δ (as fp32), m before, m after, θ after, each the
// fragment's numel fp32 values; DIR/merge_<replica>_<k>_<fragment>.f32 the local weights
// before the merge of outer step k's fragment, θ, and the local weights after;
// DIR/sent_<replica>_<k>_<fragment>.bin the encoded contribution it sent, DIR/tokens_… its
// tokens (u64 little-endian: its weight in the mean) and
// DIR/mean_<replica>_<k>_<fragment>.bin the encoded mean it received (applied rounds only).
static void dump_path(const diloco *d, const char *what, int64_t outer_step, int fragment, char *path, size_t bytes) {
    snprintf(path, bytes, "%s/%s_%d_%05lld_%d.f32", d->dump_dir, what, diloco_replica_id(d), (long long)outer_step,
             fragment);
}

// A round that applied nothing leaves no dump.
static void dump_discard(diloco *d, FILE *f, int64_t outer_step, int fragment) {
    if (!f) return;
    fclose(f);
    char path[4200];
    dump_path(d, "outer", outer_step, fragment, path, sizeof path);
    unlink(path);
}

static FILE *dump_open(diloco *d, const char *what, int64_t outer_step, int fragment) {
    if (!d->dump_dir) return NULL;
    char path[4200];
    dump_path(d, what, outer_step, fragment, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) fail("TRAIN_GPT_DILOCO_DUMP: cannot create '%s': %s", path, strerror(errno));
    return f;
}

static void dump_close(FILE *f) {
    if (f && fclose(f) != 0) fail("TRAIN_GPT_DILOCO_DUMP: write failed");
}

static void dump_bytes(diloco *d, const char *what, int64_t outer_step, int fragment, const uint8_t *bytes, size_t n) {
    if (!d->dump_dir) return;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s_%d_%05lld_%d.bin", d->dump_dir, what, diloco_replica_id(d),
             (long long)outer_step, fragment);
    FILE *f = fopen(path, "wb");
    if (!f) fail("TRAIN_GPT_DILOCO_DUMP: cannot create '%s': %s", path, strerror(errno));
    if (n && fwrite(bytes, 1, n, f) != n) fail("TRAIN_GPT_DILOCO_DUMP: write failed");
    dump_close(f);
}

static FILE *dump_begin(diloco *d, int p, int64_t outer_step, const float *params) {
    const fragment *fr = &d->fragments[p];
    FILE *f = dump_open(d, "outer", outer_step, p);
    if (!f) return NULL;
    dump_tensor(f, d->theta + fr->offset, fr->numel);
    dump_tensor(f, params + fr->offset, fr->numel);
    return f;
}

// Δ as the outer step takes it (before it changes θ), as fp32, for the dump.
static float *dump_delta(const diloco *d, const fragment *fr) {
    float *delta = alloc_floats((size_t)fr->numel);
    for (int64_t i = 0; i < fr->numel; i++) {
        int64_t j = fr->offset + i;
        delta[i] = d->quant == QUANT_NONE ? (float)((double)d->theta[j] - (double)d->delta[j]) : d->delta[j];
    }
    return delta;
}

static void dump_end(diloco *d, const fragment *fr, FILE *f, const float *delta, const float *momentum_before) {
    if (!f) return;
    dump_tensor(f, delta, fr->numel);
    dump_tensor(f, momentum_before, fr->numel);
    dump_tensor(f, d->momentum + fr->offset, fr->numel);
    dump_tensor(f, d->theta + fr->offset, fr->numel);
    dump_close(f);
}

static int64_t fragment_outer_step(const diloco *d, const flight *f);

static void log_outer_step(diloco *d, const train_state *st, const round_result *r, bool applied,
                           const char *reason) {
    const flight *fl = &d->flight;
    // A sharded replica's figures are the replica's: hashes over every rank's pieces, bytes
    // summed over its ranks (each has its own connection), times the slowest rank's, the
    // quantization error the ranks' mean; contributors are rank 0's group's (a collective: every
    // rank logs every round).
    uint64_t theta_hash = replica_hash(d, d->theta, d->numel), m_hash = replica_hash(d, d->momentum, d->numel);
    round_result rr = *r;
    rr.bytes_sent = (uint64_t)replica_sum(d, (double)r->bytes_sent);
    rr.bytes_recv = (uint64_t)replica_sum(d, (double)r->bytes_recv);
    rr.sync_s = replica_max(d, r->sync_s);
    rr.wait_s = replica_max(d, r->wait_s);
    r = &rr;
    double quant_err = replica_sum(d, fl->quant_err) / d->ranks;
    uint64_t fragment_hash = 0;
    if (d->streaming) {
        const fragment *f = &d->fragments[fl->fragment];
        fragment_hash = replica_hash(d, d->theta + f->offset, f->numel);
    }
    strbuf ids = {0};
    sb_append(&ids, "");
    for (int c = 0; c < r->n; c++) sb_printf(&ids, "%s%d", c ? "," : "", r->ids[c]);
    strbuf sb = {0};
    sb_printf(&sb, "\"outer_step\":%lld,\"step\":%lld,\"contributors\":[%s", (long long)st->outer_step,
              (long long)st->step, ids.data);
    sb_printf(&sb, "],\"applied\":%s,\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"sync_s\":%.4f,\"wait_s\":%.4f,",
              applied ? "true" : "false", (unsigned long long)r->bytes_sent, (unsigned long long)r->bytes_recv,
              r->sync_s, r->wait_s);
    sb_printf(&sb, "\"param_hash\":\"%016llx\",\"momentum_hash\":\"%016llx\",\"quant\":\"%s\",\"quant_rel_err\":%.6g",
              (unsigned long long)theta_hash, (unsigned long long)m_hash, quant_kind_name(quant_codec_kind(d->quant)), quant_err);
    sb_printf(&sb, ",\"inner_steps\":%lld,\"tokens\":%llu", (long long)fl->inner_steps,
              (unsigned long long)fl->tokens);
    if (applied) {
        double lr, mu;
        outer_settings(d, fragment_outer_step(d, fl), landing_step(d, fl), &lr, &mu);
        sb_printf(&sb, ",\"outer_lr\":%.9g,\"outer_momentum\":%.9g", lr, mu);
    }
    if (d->streaming) {
        sb_printf(&sb, ",\"fragment\":%d,\"fragment_hash\":\"%016llx\",\"began_at_step\":%lld,\"steps_in_flight\":%lld",
                  fl->fragment, (unsigned long long)fragment_hash,
                  (long long)fl->begin_step, (long long)(st->step - fl->begin_step));
    }
    if (reason) {
        sb_append(&sb, ",\"skipped\":");
        sb_json_string(&sb, reason);
    }
    metrics_object(d->log, sb.data);
    sb_free(&sb);
    if (d->quiet) {
        sb_free(&ids);
        return;
    }
    char sent[32], recv[32], frag[48] = "";
    format_count((double)r->bytes_sent, sent, sizeof sent);
    format_count((double)r->bytes_recv, recv, sizeof recv);
    if (d->streaming)
        snprintf(frag, sizeof frag, " | fragment %d/%d, %lld steps in flight", fl->fragment, d->n_fragments,
                 (long long)(st->step - fl->begin_step));
    printf("%souter %4lld | step %6lld%s | replicas [%s] | sent %sB recv %sB | sync %.2f s (wait %.2f s) | quant err "
           "%.2e | hash %016llx%s%s\n",
           console_tag(), (long long)st->outer_step, (long long)st->step, frag, ids.data, sent, recv, r->sync_s,
           r->wait_s, quant_err, (unsigned long long)theta_hash, reason ? " | SKIPPED: " : "", reason ? reason : "");
    fflush(stdout);
    sb_free(&ids);
}

// ---------------------------------------------------------------- the schedule

// The fragment whose sync begins after inner step `step`, or -1.
static int fragment_due(const diloco *d, int64_t step) {
    if (step <= 0) return -1;
    for (int p = 0; p < d->n_fragments; p++)
        if (syncs_after(d, &d->fragments[p], step)) return p;
    return -1;
}

void diloco_stepped(diloco *d, int64_t step) { atomic_store(&d->live_step, step); }

bool diloco_due(const diloco *d, const train_state *st, int64_t max_steps) {
    int64_t s = st->step;
    return s == max_steps || (d->flight.active && s >= d->flight.begin_step + d->overlap) ||
           (st->merge_step > 0 && s >= st->merge_step) || fragment_due(d, s) >= 0;
}

int64_t diloco_next_due(const diloco *d, const train_state *st, int64_t max_steps) {
    train_state probe = *st;
    for (probe.step = st->step + 1; probe.step < max_steps; probe.step++)
        if (diloco_due(d, &probe, max_steps)) return probe.step;
    return max_steps;
}

bool diloco_in_flight(const diloco *d) { return d->flight.active; }
const float *diloco_theta(const diloco *d) { return d->theta; }

// ---------------------------------------------------------------- begin, land, merge

static void *exchange_thread(void *arg) {
    diloco *d = (diloco *)arg;
    flight *f = &d->flight;
    payload_spec spec = spec_of(d, &d->fragments[f->fragment], f->tokens);
    f->ok = transport_exchange(d->net, f->round, &spec, d->payload, &f->r);
    return NULL;
}

// Starts the sync of fragment p: encodes every local replica's contribution (one, or M
// with diloco_transport = local) and hands it to the transport — on the exchange thread
// when it is to overlap inner steps, otherwise here, blocking.
static void begin_round(diloco *d, int p, float *const *params, int n_params, const train_state *st, bool final) {
    if (!catching_up_as_donor(d)) finish_sending_state(d, false);   // a catch-up donor exchanges on
    flight *f = &d->flight;
    const fragment *fr = &d->fragments[p];
    memset(f, 0, sizeof *f);
    f->active = true;
    f->fragment = p;
    f->final = final;
    if (!final) d->final_next = 0;   // (a round that lands at max_steps: the final syncs begin at 0)
    f->round = st->outer_step;
    f->begin_step = st->step;
    f->inner_steps = unsent_steps(d, fr, st) + d->extra_steps;
    d->extra_steps = 0;
    // No inner step since the state it took (a replica that joined at max_steps, in the group's
    // final syncs): no work, tokens 0 — the mean leaves its Δ = 0 out and min_replicas does not
    // count it (until 2026-12 it weighed one inner step: with one other contributor and
    // diloco_bound 3, a quarter of the mean). Late work it carried into the fragment
    // (adopt_state) still weighs one inner step.
    f->tokens = f->inner_steps > 0         ? (uint64_t)f->inner_steps * tokens_per_step(d)
                : d->carried[f->fragment] ? tokens_per_step(d)
                                          : 0;
    d->carried[f->fragment] = false;   // sent now: a later contribution counts its own steps
    round_result *r = &f->r;
    double t0 = wall_seconds();
    for (int i = 0; i < n_params; i++) {
        if (!all_finite(params[i] + fr->offset, fr->numel)) {
            if (d->local) fail("diloco: simulated replica %d's weights hold NaN/Inf at step %lld", i, (long long)st->step);
            fail("diloco: this replica's weights hold NaN/Inf at step %lld; not sending them to the others",
                 (long long)st->step);
        }
    }
    if (!d->local) {
        f->dump = dump_begin(d, p, f->round + 1, params[0]);
        f->quant_err = encode_contribution(d, fr, params[0], d->residual, d->payload);
        if (fault_requested("diloco_nan_payload", f->round)) {
            float nan = NAN;
            memcpy(f->unpoisoned, d->payload, sizeof f->unpoisoned);
            f->poisoned = true;
            memcpy(d->payload, &nan, sizeof nan);
        }
        dump_bytes(d, "sent", f->round + 1, p, d->payload, fr->payload_bytes);
        uint8_t tokens[8];
        put_u64(tokens, f->tokens);
        dump_bytes(d, "tokens", f->round + 1, p, tokens, sizeof tokens);
        if (fault_requested("diloco_late", f->round)) {  // test hook: the hub evicts this rank as late
            struct timespec late = {(time_t)d->cfg->diloco_timeout_s + 1, 0};
            nanosleep(&late, NULL);
        }
        f->threaded = d->overlap > 0 && !final;
        if (f->threaded) {
            int rc = pthread_create(&f->thread, NULL, exchange_thread, d);
            if (rc != 0) fail("diloco: cannot start the exchange thread: %s", strerror(rc));
        } else {
            payload_spec spec = spec_of(d, fr, f->tokens);
            f->ok = transport_exchange(d->net, f->round, &spec, d->payload, r);
        }
        return;
    }
    // Local: every replica's contribution, encoded exactly as a transport would carry it.
    r->outer_step = f->round;
    r->apply = true;
    for (int i = 0; i < n_params; i++) {
        f->quant_err += encode_contribution(d, fr, params[i], d->local_residual[i], d->local_payload[i]) / n_params;
        r->ids[r->n] = i;
        r->n++;
    }
    reduce_locally(d, fr, n_params);
    r->mean = d->local_mean;
    r->mean_bytes = fr->mean_bytes;
    r->bytes_sent = fr->payload_bytes;  // what each replica would send
    r->bytes_recv = fr->mean_bytes;     // and receive
    r->sync_s = wall_seconds() - t0;
    f->ok = true;
}

// Who was in round k, which fragment it synced and whether it was applied, for the state this
// replica may donate.
static void record_round(diloco *d, int64_t k, bool applied, int fragment, const round_result *r) {
    if (d->local) return;
    int slot = (int)(k % RECENT_ROUNDS);
    d->recent[slot].round = k;
    d->recent[slot].applied = applied;
    d->recent[slot].fragment = fragment;
    contributor_bits(r, d->recent[slot].ids);
}

// How many x in [1, n] are ≡ offset (mod period): the syncs of a fragment of that offset in the
// first n steps of a phase of that period (offset 0: at the multiples of period).
static int64_t syncs_in(int64_t n, int64_t offset, int64_t period) {
    int64_t first = offset == 0 ? period : offset;
    return n < first ? 0 : (n - first) / period + 1;
}

// The fragment's own count of outer steps (1-based, for the momentum warm-up) at the round in
// flight: its syncs after inner steps 1 .. begin_step on the schedule (syncs_after), this one
// included; a final sync after the last step counts the fragment's regular syncs before it
// (steps 1 .. max_steps − 1), + 1. Counted on the schedule rather than from the round number:
// round k is fragment k mod P's only while the fragments sync in turn, and the decay phase
// with diloco_decay_inner_steps starts its turn over at fragment 0 wherever the last one
// before it stood (P = 4, H = 12, H_d = 4, decay after step 80: fragment 1 syncs after step 78,
// then fragment 0 after 81, and until 2026-12 k / P + 1 gave fragments 0 and 1 one outer step
// too few and fragments 2 and 3 one too many from there on, the final syncs too). The same
// number on every replica: the schedule is in the run fingerprint.
static int64_t fragment_outer_step(const diloco *d, const flight *f) {
    const fragment *fr = &d->fragments[f->fragment];
    int64_t s = f->final ? d->cfg->max_steps - 1 : f->begin_step;
    int64_t before = s < d->decay_from ? s : d->decay_from;
    int64_t n = syncs_in(before, fr->sync_offset, d->cfg->diloco_inner_steps);
    if (s > d->decay_from) n += syncs_in(s - d->decay_from, fr->decay_offset, d->decay_H);
    return n + (f->final ? 1 : 0);
}

// A catch-up donor is about to change fragment f of θ and m: what of them is not yet on its way
// to the joiners is kept as it is (the state stays the one of its round).
static void keep_unsent_fragment(diloco *d, const fragment *f) {
    size_t theta_at = (size_t)STATE_HEADER_BYTES + (size_t)f->offset * sizeof(float);
    size_t bytes = (size_t)f->numel * sizeof(float);
    transport_preserve_state(d->net, theta_at, bytes);
    if (d->send_bytes > STATE_HEADER_BYTES + (size_t)d->numel * sizeof(float))   // m is sent too
        transport_preserve_state(d->net, theta_at + (size_t)d->numel * sizeof(float), bytes);
}

// A catch-up donor landed round f->round (applied, or skipped): its mean and settings go to
// the joiners after the state (the format above CATCHUP_MAGIC).
static void send_catchup_mean(diloco *d, const flight *f, const round_result *r, const train_state *st, bool applied,
                              double lr, double mu) {
    const fragment *fr = &d->fragments[f->fragment];
    size_t n = CATCHUP_HEADER_BYTES + (applied ? fr->mean_bytes : 0);
    if (!d->catchup) {
        size_t largest = 0;
        for (int p = 0; p < d->n_fragments; p++)
            if (d->fragments[p].mean_bytes > largest) largest = d->fragments[p].mean_bytes;
        d->catchup = xmalloc(CATCHUP_HEADER_BYTES + largest);
    }
    uint8_t *p = d->catchup;
    memset(p, 0, CATCHUP_HEADER_BYTES);
    memcpy(p, CATCHUP_MAGIC, 8);
    put_u32(p + 8, CATCHUP_VERSION);
    put_u32(p + 12, (applied ? CATCHUP_APPLIED : 0) | (f->final ? CATCHUP_FINAL : 0));
    put_u64(p + 16, (uint64_t)f->round);
    put_u64(p + 24, (uint64_t)f->fragment);
    put_u64(p + 32, (uint64_t)st->step);
    put_u64(p + 40, (uint64_t)st->tokens_seen);
    put_u64(p + 48, 0);   // phase ms: its next inner phase begins now
    put_f64(p + 56, lr);
    put_f64(p + 64, mu);
    contributor_bits(r, p + CATCHUP_IDS);
    if (applied) memcpy(p + CATCHUP_HEADER_BYTES, r->mean, fr->mean_bytes);
    transport_send_catchup(d->net, f->round, p, n);
}

// How a round ended for this rank's group, worst first: a sharded replica acts on the worst
// of its ranks' outcomes (docs/fsdp.md#diloco-over-sharded-replicas).
enum { ROUND_EVICTED = 0, ROUND_FAILED = 1, ROUND_SKIPPED = 2, ROUND_APPLIED = 3 };

// The local weights of fragment fr take θ: θᵢ ← a·θᵢ + (1 − a)·θ, in double (a = 0: θ itself,
// bit for bit: (float)(double)θ).
static void blend_theta(diloco *d, const fragment *fr, float *const *params, int n_params, double a) {
    const float *theta = d->theta + fr->offset;
    for (int r = 0; r < n_params; r++) {
        float *x = params[r] + fr->offset;
        if (a == 0.0) {
            memcpy(x, theta, (size_t)fr->numel * sizeof(float));
            continue;
        }
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < fr->numel; i++) x[i] = (float)(a * (double)x[i] + (1.0 - a) * (double)theta[i]);
    }
    changed_add(d, fr->offset, fr->numel);
}

// Waits for the round in flight and applies it to θ and m: the same bits on every replica.
// Blocking (τ = 0, or a final sync): the fragment of every params[i] becomes θ at once;
// otherwise it merges at begin + τ (st->merge_step). Returns whether params changed: they did
// when θ was copied in, or when this replica had been dropped and took the group's state.
//
// A sharded replica's ranks each land their own group's round, then agree on the worst
// outcome. A rank's θ, m and outer step always follow its own group (applied if the group
// applied), so no rank is ever behind its group, and so do its local weights: a rank whose
// group applied takes θ into its piece even when another rank's group skipped or failed —
// its Δ is in θ now, and local weights that kept it would send it again in the next Δ
// (θ_new − θᵢ), with the outer step just taken fed back against itself (until 2026-12 every
// rank kept its local weights then: the next round's Δ on the applied ranks was about twice
// their work). A rank whose group did not apply keeps its local weights (the next exchange
// carries this round's work). If any rank was dropped, every rank rejoins.
static bool land_round(diloco *d, float *const *params, int n_params, train_state *st, dataloader *train) {
    flight *f = &d->flight;
    if (!f->active) return false;
    if (f->threaded) {
        int rc = pthread_join(f->thread, NULL);
        if (rc != 0) fail("diloco: cannot join the exchange thread: %s", strerror(rc));
        f->threaded = false;
    }
    f->active = false;
    if (f->final) d->final_next = f->fragment + 1;   // whatever the outcome; a state taken below says its own
    const fragment *fr = &d->fragments[f->fragment];
    round_result *r = &f->r;
    int64_t k = f->round;  // this exchange makes outer step k + 1
    bool catch_up = catching_up_as_donor(d);   // a catch-up transfer of an earlier round goes on
    FILE *dump = f->dump;  // closed below, whatever the outcome
    f->dump = NULL;
    char why[160] = "";
    int outcome = ROUND_APPLIED;
    if (!f->ok) outcome = ROUND_FAILED;
    else if (r->evicted) outcome = ROUND_EVICTED;
    else if (!r->apply || r->n < d->cfg->diloco_min_replicas || r->n == 0) {
        outcome = ROUND_SKIPPED;
        snprintf(why, sizeof why, "%d contributor(s), diloco_min_replicas is %lld", r->n,
                 (long long)d->cfg->diloco_min_replicas);
    } else if (!average_delta(d, fr, r)) {
        outcome = ROUND_SKIPPED;
        snprintf(why, sizeof why, "the mean holds NaN/Inf (no finite contribution to part of it)");
    }
    if (f->final) d->final_missed[f->fragment] = outcome == ROUND_APPLIED ? -1 : f->inner_steps;
    if (outcome == ROUND_APPLIED) {
        float *momentum_before = NULL, *delta_dumped = NULL;
        if (dump) {
            delta_dumped = dump_delta(d, fr);
            momentum_before = alloc_floats((size_t)fr->numel);
            memcpy(momentum_before, d->momentum + fr->offset, (size_t)fr->numel * sizeof(float));
            dump_bytes(d, "mean", k + 1, f->fragment, r->mean, r->mean_bytes);
        }
        double lr, mu;
        outer_settings(d, fragment_outer_step(d, f), landing_step(d, f), &lr, &mu);
        if (catch_up) keep_unsent_fragment(d, fr);
        outer_update(d, fr, d->theta, d->momentum, lr, mu);
        if (catch_up) send_catchup_mean(d, f, r, st, true, lr, mu);
        st->outer_step = k + 1;
        dump_end(d, fr, dump, delta_dumped, momentum_before);
        free(momentum_before);
        free(delta_dumped);
    } else {
        // Never apply our own Δ as if it were the average. A skipped round is over for everyone:
        // θ stays, the count moves on (rounds keep unique numbers); a failed one keeps training
        // locally, and the next exchange of this fragment carries the work of both rounds.
        dump_discard(d, dump, k + 1, f->fragment);
        // (Evicted too: a rejoin as a member keeps the residual, and the weights keep Δᵢ.)
        if (outcome != ROUND_APPLIED) restore_residual(d, fr, f);
        if (outcome == ROUND_SKIPPED) st->outer_step = k + 1;
        if (outcome == ROUND_SKIPPED && catch_up) send_catchup_mean(d, f, r, st, false, 0.0, 0.0);
    }
    if (outcome >= ROUND_SKIPPED) record_round(d, k, outcome == ROUND_APPLIED, f->fragment, r);
    // The group's joiners wait for its donor, whatever this replica decides next.
    if (outcome >= ROUND_SKIPPED && r->send_state) start_sending_state(d, st, r->catch_up);
    int worst = (int)replica_min(d, (double)outcome);
    if (worst == ROUND_EVICTED) {
        if (outcome == ROUND_EVICTED)
            // Too late for the hub, or its session lost and found again (the transport's line
            // above says which): either way the round went on without it.
            warn("diloco: replica %d is out of outer step %lld (too late for the hub, or its session lost: the "
                 "transport says which); rejoining",
                 diloco_replica_id(d), (long long)k + 1);
        else
            note("diloco: another rank of replica %d was dropped from outer step %lld; every rank rejoins its group",
                 diloco_replica_id(d), (long long)k + 1);
        return join_group(d, params[0], st, train, true);
    }
    if (worst == ROUND_FAILED || worst == ROUND_SKIPPED) {
        // Ranks whose group applied take θ into their piece at once (streaming: merged now, not
        // at the merge step, which the replica's shared state could not hold for some ranks
        // only). Every rank says the weights changed if any did: a GPU's upload of the weights
        // gathers the norms' gains over the replica's ranks.
        bool took = outcome == ROUND_APPLIED;
        if (took) blend_theta(d, fr, params, n_params, f->final ? 0.0 : merge_alpha(d, st, f->begin_step));
        bool changed = replica_max(d, took ? 1.0 : 0.0) > 0;
        if (worst == ROUND_FAILED) {
            warn("diloco: the exchange for outer step %lld failed (%s); outer step skipped%s", (long long)k + 1,
                 outcome == ROUND_FAILED ? "the hub is unreachable" : "another rank's hub is unreachable",
                 took ? " (this rank's group applied it: its piece took θ)" : "");
            log_outer_step(d, st, r, false, "exchange failed");
        } else {
            if (outcome == ROUND_APPLIED)
                snprintf(why, sizeof why, "another rank's group did not apply it; the pieces whose group did took θ");
            log_outer_step(d, st, r, false, why);
        }
        return changed;
    }
    bool now = d->overlap == 0 || f->final;
    if (now) {
        blend_theta(d, fr, params, n_params, 0.0);
    } else {
        st->merge_step = f->begin_step + d->overlap;
        st->merge_fragment = f->fragment;
        st->merge_fragments = d->n_fragments;
    }
    log_outer_step(d, st, r, true, NULL);
    return now;
}

// The α with which a fragment whose contribution was taken after step `begin` merges into the
// local weights. 0 once the weights started over from θ since then (a rollback, a join:
// st->restart_step > begin): they no longer hold the work the landed θ carries, and blending them
// in took back α of that outer step (with one replica, α 0.5: half of it), or, where the round
// had landed before the rollback (a checkpoint's stop lands it early), did not, so a resumed run
// differed from the straight one. The fragment takes θ whole; its steps since the restart (at
// most diloco_overlap_steps) are dropped with it.
static double merge_alpha(const diloco *d, const train_state *st, int64_t begin) {
    return d->overlap == 0 || st->restart_step > begin ? 0.0 : d->cfg->diloco_merge_alpha;
}

// The fragment that landed last merges into the local weights: θᵢ ← α·θᵢ + (1 − α)·θ, in double.
static void merge_fragment(diloco *d, float *const *params, int n_params, train_state *st) {
    // The fragment that landed (saved with the checkpoint), not the schedule's: a resume with
    // another H would have merged a fragment whose θ never landed.
    int64_t begin = st->merge_step - d->overlap;
    int p = st->merge_fragments > 0 ? (int)st->merge_fragment : fragment_due(d, begin);
    bool same_split = st->merge_fragments == 0 || st->merge_fragments == d->n_fragments;
    st->merge_step = 0;
    st->merge_fragment = st->merge_fragments = 0;
    if (p < 0 || d->overlap == 0 || !same_split) {
        warn("diloco: a fragment merge was pending, but this config %s; skipped",
             !same_split        ? "splits the model into another number of fragments"
             : d->overlap == 0  ? "merges nothing (diloco_overlap_steps 0: a landed round is taken whole)"
                                : "has no fragment there");
        return;
    }
    const fragment *fr = &d->fragments[p];
    double a = merge_alpha(d, st, begin);
    FILE *dump = dump_open(d, "merge", st->outer_step, p);
    if (dump) {
        dump_tensor(dump, params[0] + fr->offset, fr->numel);
        dump_tensor(dump, d->theta + fr->offset, fr->numel);
    }
    blend_theta(d, fr, params, n_params, a);
    if (dump) {
        dump_tensor(dump, params[0] + fr->offset, fr->numel);
        dump_close(dump);
    }
}

// After the final syncs (the run's last step): a fragment whose final sync did not apply on this
// rank — too few contributors, a mean with NaN/Inf, a failed exchange, this replica dropped
// from it and the run over at its rejoin or a stop signal ending that rejoin (then the
// fragments after it never synced either) — takes θ, the group's last agreed weights, bit for
// bit, and this replica's work on it since (its final contribution's inner steps) is dropped
// and said so. Every replica then ends with the θ it knows, and one final outer step that did
// not apply leaves each replica's final checkpoint the same model (θ has not moved) instead of
// P different ones (until 2026-12 they kept their local weights there). A sharded replica's
// ranks each take their own group's θ into their pieces, and log for the replica (collectives:
// every rank makes the same calls; d->over and d->stopped are agreed by every rank).
// Returns whether params changed.
static bool finish_final_syncs(diloco *d, float *const *params, int n_params, const train_state *st) {
    int P = d->n_fragments;
    // A rejoin at a final sync found the run over, or a signal stopped it: the fragments after
    // it never synced here.
    if (d->over || d->stopped)
        for (int64_t q = d->final_next; q < P; q++)
            if (d->final_missed[q] < 0) d->final_missed[q] = unsent_steps(d, &d->fragments[q], st);
    bool mine = false;
    for (int q = 0; q < P; q++) mine |= d->final_missed[q] >= 0;
    if (replica_max(d, mine ? 1.0 : 0.0) == 0.0) return false;
    d->final_theta = true;
    strbuf fragments = {0}, steps = {0};
    sb_append(&fragments, "");
    sb_append(&steps, "");
    double sq = 0.0;
    int64_t dropped = 0;
    int n = 0;
    for (int q = 0; q < P; q++) {
        const fragment *fr = &d->fragments[q];
        int64_t missed = (int64_t)replica_max(d, (double)d->final_missed[q]);
        if (missed < 0) continue;
        if (d->final_missed[q] >= 0) {
            for (int64_t i = fr->offset; i < fr->offset + fr->numel; i++) {
                double x = (double)params[0][i] - (double)d->theta[i];
                sq += x * x;
            }
            blend_theta(d, fr, params, n_params, 0.0);
            d->final_missed[q] = -1;
        }
        sb_printf(&fragments, "%s%d", n ? "," : "", q);
        sb_printf(&steps, "%s%lld", n ? "," : "", (long long)missed);
        dropped = max_i64(dropped, missed);
        n++;
    }
    double norm = sqrt(replica_sum(d, sq));
    char extra[128];
    snprintf(extra, sizeof extra, "\"outer_step\":%lld,\"dropped_work_norm\":%.6g,", (long long)st->outer_step, norm);
    strbuf ev = {0};
    sb_printf(&ev, "%s\"fragments\":[%s],\"dropped_steps\":[%s]", extra, fragments.data, steps.data);
    metrics_event(d->log, "diloco_final_theta", st->step, ev.data);
    if (P == 1)
        warn("diloco: replica %d's final outer step did not apply; its weights become θ, the group's last agreed "
             "weights (outer step %lld), and its last %lld inner step(s) of work are dropped (norm %.3g)",
             diloco_replica_id(d), (long long)st->outer_step, (long long)dropped, norm);
    else
        warn("diloco: replica %d's final sync of fragment(s) %s did not apply; their weights become θ, the group's "
             "last agreed weights (outer step %lld), and this replica's work on them is dropped: %s inner step(s) "
             "(norm %.3g)",
             diloco_replica_id(d), fragments.data, (long long)st->outer_step, steps.data, norm);
    sb_free(&fragments);
    sb_free(&steps);
    sb_free(&ev);
    return true;
}

bool diloco_wants_extra_step(diloco *d, const train_state *st, int64_t max_steps, bool stop) {
    double T = d->cfg->diloco_sync_every_s;
    if (T <= 0 || d->local) return false;
    // Only where a sync is due (the same step on every rank): no collective on other steps.
    if (st->step != max_steps && fragment_due(d, st->step) < 0) return false;
    bool mine = wall_seconds() - d->phase_start_s < T;
    // A sharded replica's ranks step together: one more step if any rank's clock says so, none
    // if any rank must stop (2 outranks 1).
    return replica_max(d, stop ? 2.0 : mine ? 1.0 : 0.0) == 1.0;
}

void diloco_count_extra_step(diloco *d) { d->extra_steps++; }

bool diloco_after_step(diloco *d, float *const *params, int n_params, train_state *st, dataloader *train,
                       int64_t max_steps, double *stall_s) {
    double t0 = wall_seconds();
    bool changed = false;
    flight *f = &d->flight;
    changed_none(d);
    if (f->active && (st->step >= f->begin_step + d->overlap || st->step == max_steps))
        changed |= land_round(d, params, n_params, st, train);
    if (d->over || d->stopped) {   // a rejoin found the run over, or was stopped: no round to begin
        // (A round that landed at the last step dropped this replica, and the others had finished
        // or a signal stopped its rejoin: no final sync of its own, every fragment takes θ.)
        if (st->step == max_steps) changed |= finish_final_syncs(d, params, n_params, st);
        if (stall_s) *stall_s = wall_seconds() - t0;
        return changed;
    }
    if (st->merge_step > 0 && (st->step >= st->merge_step || st->step == max_steps)) {
        merge_fragment(d, params, n_params, st);
        changed = true;
    }
    if (st->step == max_steps) {
        // The last step: every fragment syncs once more, blocking, so that every replica ends
        // with the global weights θ (with P = 1 this is classic DiLoCo's final outer step). From
        // fragment 0 on, each in turn — or, where a state taken at max_steps says, from the
        // fragment whose final sync the group does next (adopt_state): a replica dropped from a
        // final sync, which took the state of a donor further on, goes on with the group's
        // rounds (until 2026-12 with its own next fragment: rounds of the wrong fragment, alone,
        // applied, and weights that were not the group's at the end).
        while (d->final_next < d->n_fragments) {
            begin_round(d, (int)d->final_next, params, n_params, st, true);
            changed |= land_round(d, params, n_params, st, train);
            if (st->step != max_steps || d->over || d->stopped) break;  // took the group's state: it trains on
        }
        // Stopped by a signal in a rejoin there, it ends the same way: the checkpoint written at
        // max_steps holds θ as it last took it (until 2026-12 its local weights, not θ, with no
        // diloco_final_theta event).
        if (st->step == max_steps) changed |= finish_final_syncs(d, params, n_params, st);
    } else {
        int p = fragment_due(d, st->step);
        if (p >= 0) {
            begin_round(d, p, params, n_params, st, false);
            if (d->overlap == 0) changed |= land_round(d, params, n_params, st, train);
        }
    }
    if (stall_s) *stall_s = wall_seconds() - t0;
    if (!f->active) d->phase_start_s = wall_seconds();   // the next inner phase begins
    return changed;
}

bool diloco_settle(diloco *d, float *params, train_state *st, dataloader *train) {
    changed_none(d);
    if (!d->flight.active) return false;
    float *p[1] = {params};
    return land_round(d, p, 1, st, train);
}

int64_t diloco_restart_from_theta(diloco *d, float *params, train_state *st, int64_t step) {
    int64_t discarded = 0;
    for (int p = 0; p < d->n_fragments; p++)
        discarded = max_i64(discarded, step - max_i64(st->restart_step, step - steps_since_sync(d, &d->fragments[p], step)));
    memcpy(params, d->theta, (size_t)d->numel * sizeof(float));
    changed_none(d);
    changed_add(d, 0, d->numel);
    st->restart_step = step;
    d->extra_steps = 0;
    for (int p = 0; p < d->n_fragments; p++) d->carried[p] = false;   // the carried work went with the rest
    return discarded;
}

void diloco_set_quiet(diloco *d, bool quiet) { d->quiet = quiet; }

void diloco_start_local(diloco *d, const float *params, train_state *st) {
    size_t bytes = (size_t)d->numel * sizeof(float);
    memcpy(d->theta, params, bytes);
    memset(d->momentum, 0, bytes);
    for (int i = 0; i < diloco_replicas(d); i++)
        if (d->local_residual[i]) memset(d->local_residual[i], 0, bytes);
    st->outer_step = 0;
    st->merge_step = 0;
    st->merge_fragment = st->merge_fragments = 0;
}

bool diloco_group_over(const diloco *d) { return d->over; }

bool diloco_join_stopped(const diloco *d) { return d && d->stopped; }

bool diloco_joined_at_end(const diloco *d) { return d && d->joined_at_end; }

bool diloco_final_incomplete(const diloco *d) { return d && d->final_theta; }

void diloco_changed_range(const diloco *d, int64_t *offset, int64_t *numel) {
    *offset = d->changed_hi > d->changed_lo ? d->changed_lo : 0;
    *numel = d->changed_hi > d->changed_lo ? d->changed_hi - d->changed_lo : 0;
}

bool diloco_agree_stop(diloco *d, bool local_stop) { return transport_agree_stop(d->net, local_stop); }

// An exchange still in flight when the run ends early (a fatal error elsewhere): wait for the
// exchange thread, then drop the round.
static void abandon_flight(diloco *d) {
    if (d->flight.active && d->flight.threaded) pthread_join(d->flight.thread, NULL);
    if (d->flight.dump) fclose(d->flight.dump);
    memset(&d->flight, 0, sizeof d->flight);
}

void diloco_leave(diloco *d, const train_state *st, bool finished) {
    if (!d) return;
    finish_sending_state(d, true);
    abandon_flight(d);
    if (!d->net) return;
    transport_leave(d->net, st->outer_step, finished && !d->over);
    d->net = NULL;
}

void diloco_close(diloco *d) {
    if (!d) return;
    finish_sending_state(d, true);
    abandon_flight(d);
    if (d->net) transport_close(d->net);
    free(d->outer_block);
    if (d->local_payload)
        for (int i = 1; i < diloco_replicas(d); i++) {
            free(d->local_payload[i]);
            free(d->local_residual[i]);
        }
    free(d->local_payload);
    free(d->local_residual);
    free(d->local_mean);
    free(d->hub_residual);
    free(d->segment_scratch);
    free(d->catchup);
    free(d->residual);
    free(d->delta);
    free(d->payload);
    free(d->fragments);
    free(d->final_missed);
    free(d->carried);
    free(d);
}
