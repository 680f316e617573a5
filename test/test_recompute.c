// test/test_recompute.c — activation recomputation on the CPU backend (issue #18, cpu/model.h):
// recompute = selective / full / every N-th layer against none, on however many ranks the
// launcher started (make test: one; test/test_recompute.sh: mpirun -np 2, the FSDP case).
//
// Checked, on the tiny test model (2 layers), a 4-layer one and a 4-layer one without QK-norm
// and with an untied head (the path where selective keeps the projections itself):
//   1. 10 steps of grad_accum 2 in every mode: the same losses, gradient norms, weights and both
//      AdamW moments as none, BIT FOR BIT (memcmp), then the same validation loss sums and
//      last-position logits. No tolerance: the recomputation calls the forward's kernels on the
//      same inputs at the same thread count, so any difference at all is a bug (a wrong input,
//      a buffer of another layer, a stale scratch).
//   2. Resume: 5 steps in one mode, the state downloaded into a new backend of another mode,
//      5 more steps: bit for bit the straight run of none.
//   3. Memory: the activation bytes the model's allocator counts (peak) against
//      cpu_model_plan_bytes, for every mode, within 10 % (the bound for the planner;
//      the two can differ only by alloc_floats rounding each buffer up to 64 bytes: measured
//      equal here, every buffer being a multiple of 64 bytes), and full against the hand arithmetic of "the layers' inputs plus one layer's
//      activations" (+ the classifier's and the backward's scratch) within the same 10 %. A
//      layer that keeps what it should recompute moves the figure by > 14 % on these models.
//      Also on the 124M config's shape at seq 128.
//   4. The FSDP provider's protocol (one rank): the passes over a provider that hands out a
//      fresh copy of a unit's weights at its first acquire and overwrites it with NaN at its
//      last release (what a reshard frees) — a recomputation that read weights it does not
//      hold would turn the gradients into NaN — give none's gradients bit for bit, and call
//      acquire / prefetch / release in the same order as none (no gather more).
//   5. Several ranks: the sharded backend with full (and selective) recomputation against the
//      sharded backend without, bit for bit, with fsdp_reshard_after_forward 1 and 0, and
//      no more gathered bytes at once than without.
#include "check.h"
#include "cpu/model.h"
#include "llmc/common.h"
#include "llmc/config.h"
#include "llmc/guard.h"
#include "llmc/optim.h"
#include "llmc/shard.h"
#include "llmc/comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 4, T = 32, STEPS = 10, ACCUM = 2, V = 64 };

typedef struct {
    const char *name;
    int n_layer;
    bool qk_norm, tied;
} model_case;

static void load_config(train_config *cfg, const model_case *mc) {
    char layers[8];
    snprintf(layers, sizeof layers, "%d", mc->n_layer);
    // test/configs/tiny_test.conf's model (NoPE every 2nd layer, GQA, documents, z-loss)
    char *argv[] = {"--vocab_size", "64", "--n_layer", layers, "--d_model", "64", "--n_head", "4", "--n_kv_head", "2",
                    "--d_ff", "128", "--seq_len", "32", "--nope_every", "2", "--doc_token", "0",
                    "--qk_norm", mc->qk_norm ? "1" : "0", "--tie_embeddings", mc->tied ? "1" : "0", "--lr", "3e-3",
                    "--warmup_steps", "3", "--max_steps", "10", "--device", "cpu", "--batch_size", "4",
                    "--grad_accum", "2", "--train_data", "unused"};
    config_load(cfg, NULL, (int)(sizeof argv / sizeof argv[0]), argv);
}

// Micro-batch b: tokens from a fixed hash, token 0 (the document token) now and then.
static void batch(int64_t b, int32_t *inputs, int32_t *targets) {
    for (int64_t i = 0; i < B * T; i++) {
        uint64_t x = (uint64_t)(b * B * T + i + 1) * 0x9e3779b97f4a7c15ull;
        x ^= x >> 29;
        inputs[i] = (int32_t)(x % 61 == 0 ? 0 : x % V);
        targets[i] = (int32_t)((x >> 17) % V);
    }
}

static const char *mode_label(recompute_setting r) {
    static char label[64];
    snprintf(label, sizeof label, "%s%s", recompute_name(r.mode), r.every > 1 ? " every 2nd layer" : "");
    return label;
}

// ---------------------------------------------------------------- 1, 2, 5: training runs

typedef struct {
    double loss[STEPS], norm[STEPS];
    float *params, *m, *v;
    int64_t adam_step;
    loss_sums val;
    float logits[V];
    int64_t gathered_peak;
} run_result;

static void free_result(run_result *r) {
    free(r->params);
    free(r->m);
    free(r->v);
}

typedef struct {
    const train_config *cfg;
    const param_table *t;
    comm *group;  // NULL: one process
    const shard_map *map;
    bool reshard;
} run_setup;

static backend *make_backend(const run_setup *s, recompute_setting r, run_result *res) {
    return cpu_backend_create_sharded(s->t, s->group, NULL, s->reshard, true, r, B, T, res->params, res->m, res->v);
}

// Steps [from, to) on a backend; micro-batch a of step s on rank k is (s·ACCUM + a)·ranks + k.
static void steps(const run_setup *s, backend *be, run_result *res, int from, int to) {
    int rank = s->group ? comm_rank(s->group) : 0, ranks = s->group ? comm_size(s->group) : 1;
    int32_t inputs[B * T], targets[B * T];
    step_limits limits = {INFINITY, INFINITY};
    for (int step = from; step < to; step++) {
        for (int a = 0; a < ACCUM; a++) {
            batch(((int64_t)step * ACCUM + a) * ranks + rank, inputs, targets);
            backend_forward_backward(be, inputs, targets, B, T, 1.0f / (float)(B * T * ACCUM * ranks),
                                     (float)s->cfg->z_loss);
        }
        step_result sr = backend_step(be, lr_at_step(s->cfg, step), B * T * ACCUM * ranks, s->cfg, &limits);
        res->loss[step] = sr.loss;
        res->norm[step] = sr.grad_norm;
        res->adam_step = sr.adam_step;
    }
}

static void finish_run(const run_setup *s, backend *be, run_result *res) {
    int32_t inputs[B * T], targets[B * T];
    batch(1000, inputs, targets);
    res->val = backend_forward_loss(be, inputs, targets, B, T);
    batch(2000, inputs, targets);
    backend_forward_last_logits(be, inputs, T, res->logits);
    res->gathered_peak = be->gathered_peak_bytes;
    (void)s;
}

static run_result new_result(const run_setup *s) {
    run_result r;
    memset(&r, 0, sizeof r);
    size_t n = (size_t)s->map->local_numel;
    r.params = alloc_floats(n);
    r.m = alloc_floats(n);
    r.v = alloc_floats(n);
    shard_param_init(s->map, r.params, 1234);
    return r;
}

// STEPS steps in one mode; with switch_at > 0, the state moves at that step into a new
// backend of mode `then` (a resume: weights, moments and AdamW's t, nothing else).
static run_result train(const run_setup *s, recompute_setting r, int switch_at, recompute_setting then) {
    run_result res = new_result(s);
    backend *be = make_backend(s, r, &res);
    if (switch_at > 0) {
        steps(s, be, &res, 0, switch_at);
        size_t n = (size_t)s->map->local_numel;
        float *p = alloc_floats(n), *m = alloc_floats(n), *v = alloc_floats(n);
        backend_download(be, p, m, v);
        backend_free(be);
        memset(res.params, 0, n * sizeof(float));  // nothing but what is uploaded carries over
        memset(res.m, 0, n * sizeof(float));
        memset(res.v, 0, n * sizeof(float));
        be = make_backend(s, then, &res);
        backend_upload(be, p, m, v, res.adam_step);
        free(p), free(m), free(v);
        steps(s, be, &res, switch_at, STEPS);
    } else {
        steps(s, be, &res, 0, STEPS);
    }
    finish_run(s, be, &res);
    backend_free(be);
    return res;
}

static bool same_run(const run_result *a, const run_result *b, int64_t n) {
    size_t bytes = (size_t)n * sizeof(float);
    return memcmp(a->loss, b->loss, sizeof a->loss) == 0 && memcmp(a->norm, b->norm, sizeof a->norm) == 0 &&
           memcmp(a->params, b->params, bytes) == 0 && memcmp(a->m, b->m, bytes) == 0 &&
           memcmp(a->v, b->v, bytes) == 0 && a->val.ce_sum == b->val.ce_sum &&
           a->val.lse_sq_sum == b->val.lse_sq_sum && memcmp(a->logits, b->logits, sizeof a->logits) == 0;
}

// The largest |a − b| of the weights, for the message of a failure.
static double worst_diff(const float *a, const float *b, int64_t n) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

static const recompute_setting MODES[] = {
    {RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_FULL, 1}, {RECOMPUTE_FULL, 2}, {RECOMPUTE_SELECTIVE, 2}};
#define N_MODES ((int)(sizeof MODES / sizeof MODES[0]))

static void check_training(const model_case *mc, comm *world) {
    train_config cfg;
    load_config(&cfg, mc);
    param_table t;
    param_table_build(&t, &cfg.model);
    int ranks = comm_size(world);
    shard_map map;
    shard_map_build(&map, &t, comm_rank(world), ranks);
    bool say = comm_rank(world) == 0;
    for (int reshard = 1; reshard >= (ranks > 1 ? 0 : 1); reshard--) {
        run_setup s = {&cfg, &t, ranks > 1 ? world : NULL, &map, reshard == 1};
        char where[96];
        snprintf(where, sizeof where, "%s%s", mc->name,
                 ranks == 1 ? "" : reshard ? ", FSDP (reshard after forward)" : ", FSDP (kept for the backward)");
        run_result none = train(&s, RECOMPUTE_OFF, 0, RECOMPUTE_OFF);
        EXPECT(isfinite(none.loss[STEPS - 1]), "%s: none's last loss %g", where, none.loss[STEPS - 1]);
        for (int i = 0; i < N_MODES; i++) {
            run_result got = train(&s, MODES[i], 0, RECOMPUTE_OFF);
            bool same = same_run(&got, &none, map.local_numel);
            EXPECT(same, "%s: recompute %s: %d steps × grad_accum %d bit for bit as none (weights differ by up to "
                         "%.3g, last loss %.9g vs %.9g)",
                   where, mode_label(MODES[i]), STEPS, ACCUM, worst_diff(got.params, none.params, map.local_numel),
                   got.loss[STEPS - 1], none.loss[STEPS - 1]);
            EXPECT(got.gathered_peak == none.gathered_peak, "%s: recompute %s gathers %lld bytes at most, none %lld",
                   where, mode_label(MODES[i]), (long long)got.gathered_peak, (long long)none.gathered_peak);
            if (say && same) printf("  %s: recompute %s = none bit for bit\n", where, mode_label(MODES[i]));
            free_result(&got);
        }
        // 2. resume across modes: full → selective, selective → none, none → full every 2nd
        const recompute_setting from[] = {{RECOMPUTE_FULL, 1}, {RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_NONE, 1}};
        const recompute_setting to[] = {{RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_NONE, 1}, {RECOMPUTE_FULL, 2}};
        for (int i = 0; i < 3; i++) {
            run_result got = train(&s, from[i], STEPS / 2, to[i]);
            char label[64];
            snprintf(label, sizeof label, "%s", mode_label(from[i]));
            EXPECT(same_run(&got, &none, map.local_numel),
                   "%s: %d steps of %s, resumed as %s: bit for bit the straight run of none", where, STEPS / 2, label,
                   mode_label(to[i]));
            free_result(&got);
        }
        free_result(&none);
    }
    shard_map_free(&map);
    param_table_free(&t);
    config_free(&cfg);
}

// ---------------------------------------------------------------- 3: memory

static double rel(double a, double b) { return fabs(a - b) / b; }

// Hand arithmetic of recompute = full (cpu/model.h), in floats: the L + 1 residual streams
// (the layers' inputs and the last output), one layer's activations without recomputation,
// the final norm, positions, the backward's scratch, one chunk of logits, the RoPE tables.
static int64_t full_by_hand(const model_config *c, int64_t Bm, int64_t Tm) {
    int64_t N = Bm * Tm, C = c->d_model, F = c->d_ff, Hq = c->n_head, Hkv = c->n_kv_head, D = c->head_dim;
    int64_t QD = Hq * D, KD = Hkv * D;
    int64_t inputs = (c->n_layer + 1) * N * C;
    int64_t layer = N * C           // resid_mid
                    + N * C + N     // attn_in, its 1/rms
                    + N * QD + N * KD + N * KD  // q, k, v
                    + N * QD + N * Hq           // attention output, log-sum-exp
                    + N * C + N                 // mlp_in, its 1/rms
                    + 3 * N * F;                // gate, up, act
    if (c->qk_norm) layer += N * QD + N * KD + N * Hq + N * Hkv;  // q, k before QK-norm, their 1/rms
    int64_t final = N * C + N + 2 * N;                             // final norm, 1/rms; start, pos
    int64_t backward = 3 * N * C + 2 * N * QD + 2 * N * KD + 3 * N * F;
    int64_t logits = (N < (1 << 24) / c->vocab_size ? N : (1 << 24) / c->vocab_size) * c->vocab_size;
    return 4 * (inputs + layer + final + backward + logits + Tm * D);
}

static void check_memory_of(const char *name, const train_config *cfg, int64_t Bm, int64_t Tm, bool say) {
    param_table t;
    param_table_build(&t, &cfg->model);
    const recompute_setting modes[] = {{RECOMPUTE_NONE, 1}, {RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_FULL, 1},
                                       {RECOMPUTE_FULL, 2}, {RECOMPUTE_SELECTIVE, 2}};
    int64_t measured[5], planned[5];
    for (int i = 0; i < 5; i++) {
        cpu_model *m = cpu_model_create_recompute(&t, Bm, Tm, modes[i]);
        measured[i] = cpu_model_activation_peak_bytes(m);
        EXPECT(cpu_model_activation_bytes(m) == measured[i], "%s: held = peak after create", name);
        cpu_model_free(m);
        planned[i] = cpu_model_plan_bytes(&t, Bm, Tm, modes[i]);
        EXPECT(rel((double)measured[i], (double)planned[i]) < 0.10,
               "%s: recompute %s: measured %lld bytes of activations, planned %lld (bound 10 %%)", name,
               mode_label(modes[i]), (long long)measured[i], (long long)planned[i]);
        if (say)
            printf("  %s, %lld x %lld tokens: recompute %-26s measured %10lld B, planned %10lld B (%+.3f %%), "
                   "%.3f of none\n",
                   name, (long long)Bm, (long long)Tm, mode_label(modes[i]), (long long)measured[i],
                   (long long)planned[i], 100.0 * ((double)measured[i] - (double)planned[i]) / (double)planned[i],
                   (double)measured[i] / (double)measured[0]);
    }
    EXPECT(measured[0] > measured[1] && measured[1] > measured[2], "%s: none > selective > full (%lld, %lld, %lld)",
           name, (long long)measured[0], (long long)measured[1], (long long)measured[2]);
    EXPECT(measured[2] < measured[3] && measured[3] < measured[0], "%s: full < full every 2nd layer < none", name);
    int64_t hand = full_by_hand(&cfg->model, Bm, Tm);
    EXPECT(rel((double)measured[2], (double)hand) < 0.10,
           "%s: full measured %lld bytes, the layers' inputs + one layer + scratch by hand %lld (bound 10 %%)", name,
           (long long)measured[2], (long long)hand);
    EXPECT(rel((double)planned[2], (double)hand) < 0.001, "%s: full planned %lld bytes, by hand %lld", name,
           (long long)planned[2], (long long)hand);
    // none = full + the other L − 1 layers' activations (the same planner, the difference by hand)
    int64_t layer_bytes = (planned[0] - planned[2]) / (cfg->model.n_layer - 1);
    EXPECT(layer_bytes * (cfg->model.n_layer - 1) == planned[0] - planned[2],
           "%s: none − full is a whole number of layers", name);
    param_table_free(&t);
}

static void check_memory(bool say) {
    model_case four = {"4 layers", 4, true, true};
    train_config cfg;
    load_config(&cfg, &four);
    check_memory_of("4 layers", &cfg, B, T, say);
    config_free(&cfg);
    // configs/gpt-124m.conf's shape at seq 128, batch 1 (75 MB for none)
    char *argv[] = {"--vocab_size", "50257", "--n_layer", "12", "--d_model", "768", "--n_head", "12",
                    "--n_kv_head", "4", "--d_ff", "2304", "--seq_len", "1024", "--nope_every", "4",
                    "--doc_token", "50256", "--lr", "1e-3", "--max_steps", "1", "--batch_size", "1",
                    "--train_data", "unused"};
    config_load(&cfg, NULL, (int)(sizeof argv / sizeof argv[0]), argv);
    check_memory_of("124M", &cfg, 1, 128, say);
    config_free(&cfg);
}

// ---------------------------------------------------------------- 4: the units protocol

// Whole-model weights handed out as copies: made at a unit's first acquire, overwritten with
// NaN and freed at its last release. Every call is logged.
typedef struct {
    cpu_units base;
    const shard_map *map;
    const float *params;
    float *grads;
    float **copy;
    int *refs;
    char log[8192];
    size_t log_len;
    int copies_made;
} poison_units;

static void note_call(poison_units *p, char what, int unit) {
    if (p->log_len + 8 < sizeof p->log) p->log_len += (size_t)snprintf(p->log + p->log_len, 8, "%c%d ", what, unit);
}
static const float *poison_acquire(cpu_units *u, int unit) {
    poison_units *p = (poison_units *)u;
    note_call(p, 'a', unit);
    if (p->refs[unit]++ == 0) {
        int64_t n = p->map->units[unit].numel;
        p->copy[unit] = alloc_floats((size_t)n);
        memcpy(p->copy[unit], p->params + p->map->units[unit].start, (size_t)n * sizeof(float));
        p->copies_made++;
    }
    return p->copy[unit];
}
static void poison_prefetch(cpu_units *u, int unit) { note_call((poison_units *)u, 'p', unit); }
static void poison_release(cpu_units *u, int unit, bool backward_follows) {
    poison_units *p = (poison_units *)u;
    (void)backward_follows;  // always reshard: the strictest case
    note_call(p, 'r', unit);
    CHECK(p->refs[unit] > 0);
    if (--p->refs[unit] == 0) {
        for (int64_t i = 0; i < p->map->units[unit].numel; i++) p->copy[unit][i] = NAN;
        free(p->copy[unit]);
        p->copy[unit] = NULL;
    }
}
static float *poison_grads(cpu_units *u, int unit) {
    poison_units *p = (poison_units *)u;
    return p->grads + p->map->units[unit].start;
}
static void poison_done(cpu_units *u, int unit) { note_call((poison_units *)u, 'd', unit); }

static void check_units_protocol(bool say) {
    model_case four = {"4 layers", 4, true, false};
    train_config cfg;
    load_config(&cfg, &four);
    param_table t;
    param_table_build(&t, &cfg.model);
    shard_map map;
    shard_map_build(&map, &t, 0, 1);
    float *params = alloc_floats((size_t)t.numel), *want = alloc_floats((size_t)t.numel);
    param_init(&t, params, 99);
    int32_t inputs[B * T], targets[B * T];
    batch(7, inputs, targets);
    cpu_model *plain = cpu_model_create(&t, B, T);
    loss_sums want_sums = cpu_forward_backward(plain, params, want, inputs, targets, B, T, 0.01f, 1e-4f);
    cpu_model_free(plain);
    char none_log[8192] = "";
    const recompute_setting modes[] = {{RECOMPUTE_NONE, 1}, {RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_FULL, 1},
                                       {RECOMPUTE_FULL, 2}};
    for (int i = 0; i < 4; i++) {
        poison_units p;
        memset(&p, 0, sizeof p);
        p.base = (cpu_units){poison_acquire, poison_prefetch, poison_release, poison_grads, poison_done};
        p.map = &map;
        p.params = params;
        p.grads = alloc_floats((size_t)t.numel);
        p.copy = xcalloc((size_t)map.count, sizeof *p.copy);
        p.refs = xcalloc((size_t)map.count, sizeof *p.refs);
        cpu_model *m = cpu_model_create_recompute(&t, B, T, modes[i]);
        loss_sums sums = cpu_forward_backward_units(m, &p.base, inputs, targets, B, T, 0.01f, 1e-4f);
        cpu_model_free(m);
        EXPECT(memcmp(p.grads, want, (size_t)t.numel * sizeof(float)) == 0 && sums.ce_sum == want_sums.ce_sum,
               "recompute %s over a provider that poisons released weights: the gradients of the whole model bit "
               "for bit (grad[0] %g vs %g)",
               mode_label(modes[i]), p.grads[0], want[0]);
        bool all_released = true;
        for (int u = 0; u < map.count; u++) all_released = all_released && p.refs[u] == 0;
        EXPECT(all_released, "recompute %s: every acquire released", mode_label(modes[i]));
        if (i == 0) snprintf(none_log, sizeof none_log, "%s", p.log);
        EXPECT(strcmp(p.log, none_log) == 0,
               "recompute %s calls the provider as none does:\n    %s\n  none:\n    %s", mode_label(modes[i]), p.log,
               none_log);
        if (say && i == 2) printf("  units provider, recompute full: %d copies of units made (as none), calls: %s\n",
                                  p.copies_made, p.log);
        free(p.grads);
        free(p.copy);
        free(p.refs);
    }
    free(params);
    free(want);
    shard_map_free(&map);
    param_table_free(&t);
    config_free(&cfg);
}

int main(void) {
    comm *world = comm_world();
    bool say = comm_rank(world) == 0;
    const model_case cases[] = {{"tiny (2 layers)", 2, true, true},
                                {"4 layers", 4, true, true},
                                {"4 layers, no QK-norm, untied", 4, false, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_training(&cases[i], world);
    if (comm_size(world) == 1) {
        check_memory(say);
        check_units_protocol(say);
    }
    char name[64];
    snprintf(name, sizeof name, "test_recompute rank %d of %d", comm_rank(world), comm_size(world));
    int rc = check_summary(name);
    comm_finish();
    return rc;
}
