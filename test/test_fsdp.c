// test/test_fsdp.c — the CPU backend sharded over an FSDP group (cpu/backend.c, llmc/shard.h)
// against the whole-model backend, on however many ranks the launcher started (make test runs
// it as one rank, test/test_fsdp.sh under mpirun -np 2 and 4).
//
// Every rank trains its pieces of a small model for a few steps, rank r taking micro-batch
// s·ranks + r at step s; every rank also trains the whole model alone on the same
// micro-batches (grad_accum = ranks) as the reference. Checked, tied and untied head:
//   - the step's loss and gradient norm, and the weights and both moments after the steps
//     (this rank's pieces against the reference's values there), within a tolerance: the
//     only difference is the order of fp32 additions of the gradient (each rank's gradient
//     of its micro-batch, summed in rank order, against the whole model accumulating the
//     micro-batches one after another): relative differences of a few ulp in the gradient,
//     which AdamW's first steps (update ≈ lr·sign(g) where |g| ≫ ε) pass on as ~1e-5 of lr,
//     and as more where g is near zero and m/√v turns on the last bits (measured worst:
//     6e-4·lr, HSDP at 4 ranks); the bound 1e-2·lr absolute covers that with room, while a
//     wrong piece, a missing or doubled gradient moves a weight by ~lr per step: 100× the bound;
//   - one rank: bit for bit the whole backend (the same code path);
//   - the same run twice: bit for bit;
//   - HSDP (2 copies of a group of ranks/2) against FSDP over all ranks, same tolerance;
//   - validation loss sums within 1e-5 relative, the last position's logits within 1e-5 of the
//     largest logit (the weights' differences above, carried through three layers);
//   - each rank holds local_numel ≈ numel / ranks floats per buffer (+ padding < ranks per unit).
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

enum { B = 2, T = 16, STEPS = 3 };

static void load_config(train_config *cfg, bool tied) {
    char *argv[] = {"--vocab_size", "96", "--n_layer", "3", "--d_model", "32", "--n_head", "4", "--n_kv_head", "2",
                    "--d_ff", "72", "--seq_len", "16", "--tie_embeddings", tied ? "1" : "0", "--lr", "0.01",
                    "--warmup_steps", "1", "--max_steps", "10", "--doc_token", "0", "--device", "cpu",
                    "--grad_clip", "1.0", "--z_loss", "0.0001", "--batch_size", "2", "--train_data", "unused"};
    config_load(cfg, NULL, (int)(sizeof argv / sizeof argv[0]), argv);
}

// Micro-batch b of the run: tokens from a fixed hash, a document start now and then.
static void batch(int64_t b, int32_t *inputs, int32_t *targets) {
    for (int64_t i = 0; i < B * T; i++) {
        uint64_t x = (uint64_t)(b * B * T + i) * 0x9e3779b97f4a7c15ull;
        x ^= x >> 29;
        inputs[i] = (int32_t)(x % 96);
        targets[i] = (int32_t)((x >> 17) % 96);
    }
}

typedef struct {
    double loss[STEPS], norm[STEPS];
    float *params, *m, *v;   // local (sharded) or whole (reference)
    loss_sums val;
    float logits[96];
} run_result;

static void free_result(run_result *r) {
    free(r->params);
    free(r->m);
    free(r->v);
}

// STEPS steps of one backend; micro-batch a of step s is s·per_step + first + a·stride.
static run_result train(const train_config *cfg, const param_table *t, comm *group, comm *copies, int64_t numel,
                        const shard_map *map, int64_t first, int64_t accum, int64_t ranks_total) {
    run_result r;
    memset(&r, 0, sizeof r);
    r.params = alloc_floats((size_t)numel);
    r.m = alloc_floats((size_t)numel);
    r.v = alloc_floats((size_t)numel);
    shard_param_init(map, r.params, 1234);
    backend *be = group ? cpu_backend_create_sharded(t, group, copies, true, true, RECOMPUTE_OFF, B, T, r.params, r.m, r.v)
                        : cpu_backend_create(t, B, T, r.params, r.m, r.v);
    int32_t inputs[B * T], targets[B * T];
    step_limits limits = {INFINITY, INFINITY};
    int64_t per_step = accum * ranks_total;
    for (int s = 0; s < STEPS; s++) {
        for (int64_t a = 0; a < accum; a++) {
            batch(s * per_step + first + a, inputs, targets);
            backend_forward_backward(be, inputs, targets, B, T, 1.0f / (float)(B * T * per_step), (float)cfg->z_loss);
        }
        step_result sr = backend_step(be, lr_at_step(cfg, s), B * T * per_step, cfg, &limits);
        r.loss[s] = sr.loss;
        r.norm[s] = sr.grad_norm;
    }
    batch(1000 + first, inputs, targets);
    r.val = backend_forward_loss(be, inputs, targets, B, T);
    batch(2000, inputs, targets);
    backend_forward_last_logits(be, inputs, T, r.logits);
    backend_free(be);
    return r;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

// The largest |local − reference| over this rank's values, reference whole.
static double worst_piece_diff(const shard_map *map, const float *local, const float *whole) {
    float *mine = alloc_floats((size_t)map->local_numel);
    shard_take(map, whole, mine);
    double worst = 0.0;
    for (int64_t i = 0; i < map->local_numel; i++) worst = fmax(worst, fabs((double)local[i] - mine[i]));
    free(mine);
    return worst;
}

static void compare(const char *what, const shard_map *map, const run_result *got, const run_result *want,
                    const comm *world, double lr) {
    for (int s = 0; s < STEPS; s++) {
        EXPECT(rel(got->loss[s], want->loss[s]) < 1e-6, "%s step %d: loss %.9g vs %.9g", what, s, got->loss[s],
               want->loss[s]);
        EXPECT(rel(got->norm[s], want->norm[s]) < 1e-5, "%s step %d: grad norm %.9g vs %.9g", what, s, got->norm[s],
               want->norm[s]);
    }
    double dw = worst_piece_diff(map, got->params, want->params);
    double dm = worst_piece_diff(map, got->m, want->m);
    EXPECT(dw < 1e-2 * lr, "%s: weights differ by %.3g (bound %.3g)", what, dw, 1e-2 * lr);
    EXPECT(dm < 1e-5, "%s: first moment differs by %.3g", what, dm);
    double worst = 0.0, scale = 0.0;
    for (int i = 0; i < 96; i++) {
        worst = fmax(worst, fabs((double)got->logits[i] - want->logits[i]));
        scale = fmax(scale, fabs((double)want->logits[i]));
    }
    EXPECT(worst < 1e-5 * scale, "%s: last logits differ by %.3g (largest logit %.3g)", what, worst, scale);
    if (comm_rank(world) == 0)
        printf("  %s (rank 0): weights within %.2g·lr, first moment within %.2g, logits within %.2g of the largest\n",
               what, dw / lr, dm, worst / scale);
}

static void check_variant(comm *world, bool tied) {
    int rank = comm_rank(world), ranks = comm_size(world);
    train_config cfg;
    load_config(&cfg, tied);
    param_table t;
    param_table_build(&t, &cfg.model);
    shard_map whole, mine;
    shard_map_build(&whole, &t, 0, 1);
    shard_map_build(&mine, &t, rank, ranks);
    const char *head = tied ? "tied" : "untied";

    // Memory: 1/ranks of every unit, plus at most ranks − 1 values of padding per unit.
    EXPECT(mine.local_numel * ranks >= t.numel && mine.local_numel * ranks < t.numel + (int64_t)mine.count * ranks,
           "%s: %lld floats per buffer on each of %d ranks for %lld parameters", head, (long long)mine.local_numel,
           ranks, (long long)t.numel);

    run_result ref = train(&cfg, &t, NULL, NULL, t.numel, &whole, 0, ranks, 1);
    run_result got = train(&cfg, &t, world, NULL, mine.local_numel, &mine, rank, 1, ranks);
    char what[64];
    snprintf(what, sizeof what, "%s, FSDP over %d", head, ranks);
    compare(what, &mine, &got, &ref, world, cfg.lr);
    // The validation sums of the ranks' micro-batches against the reference's of the same.
    double val_got = comm_sum(world, got.val.ce_sum);
    double val_want = 0.0;
    {
        // the reference forward over every rank's validation micro-batch, in rank order
        float *p = alloc_floats((size_t)t.numel), *m = alloc_floats((size_t)t.numel), *v = alloc_floats((size_t)t.numel);
        memcpy(p, ref.params, (size_t)t.numel * sizeof(float));
        backend *be = cpu_backend_create(&t, B, T, p, m, v);
        int32_t inputs[B * T], targets[B * T];
        for (int r = 0; r < ranks; r++) {
            batch(1000 + r, inputs, targets);
            val_want += backend_forward_loss(be, inputs, targets, B, T).ce_sum;
        }
        backend_free(be);
        free(p);
        free(m);
        free(v);
    }
    EXPECT(rel(val_got, val_want) < 1e-5, "%s: validation ce %.9g vs %.9g", what, val_got, val_want);

    run_result again = train(&cfg, &t, world, NULL, mine.local_numel, &mine, rank, 1, ranks);
    bool same = memcmp(again.params, got.params, (size_t)mine.local_numel * sizeof(float)) == 0 &&
                memcmp(again.v, got.v, (size_t)mine.local_numel * sizeof(float)) == 0 &&
                memcmp(again.loss, got.loss, sizeof got.loss) == 0;
    EXPECT(same, "%s: the same run twice gives the same bits", what);
    if (ranks == 1) {
        bool exact = memcmp(got.params, ref.params, (size_t)t.numel * sizeof(float)) == 0 &&
                     memcmp(got.loss, ref.loss, sizeof ref.loss) == 0;
        EXPECT(exact, "%s: one rank is the whole backend, bit for bit", what);
    }
    free_result(&again);

    if (ranks % 2 == 0 && ranks > 2) {  // HSDP: copies of a group of ranks / 2
        int size = ranks / 2;
        comm *group = comm_split(world, rank / size, rank);
        comm *copies = comm_split(world, rank % size, rank);
        shard_map part;
        shard_map_build(&part, &t, comm_rank(group), size);
        run_result h = train(&cfg, &t, group, copies, part.local_numel, &part, rank, 1, ranks);
        snprintf(what, sizeof what, "%s, HSDP %d × %d", head, ranks / size, size);
        compare(what, &part, &h, &ref, world, cfg.lr);
        free_result(&h);
        shard_map_free(&part);
        comm_free(group);
        comm_free(copies);
    }
    free_result(&got);
    free_result(&ref);
    shard_map_free(&whole);
    shard_map_free(&mine);
    param_table_free(&t);
    config_free(&cfg);
}

int main(void) {
    comm *world = comm_world();
    check_variant(world, false);
    check_variant(world, true);
    char name[64];
    snprintf(name, sizeof name, "test_fsdp rank %d of %d", comm_rank(world), comm_size(world));
    int rc = check_summary(name);
    comm_finish();
    return rc;
}
