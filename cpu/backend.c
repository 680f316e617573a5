// cpu/backend.c — the CPU backend of llmc/backend.h: cpu/model.c's forward and backward, and
// llmc/optim.c's step, over the trainer's host buffers (fp32 throughout).
//
// One rank of an FSDP group (issue #14, llmc/shard.h): the trainer's buffers are this rank's
// pieces of every unit. Before a unit is used its pieces are all-gathered into a buffer of the
// whole unit; the next unit's gathering starts when a unit is acquired (prefetch), and the
// buffer is freed when the unit is released (fsdp_reshard_after_forward = 0 keeps the
// forward's units for the backward). A unit's gradient goes to a whole-unit buffer, then is
// reduce-scattered (a sum in rank order) while the next unit's backward runs, and added to
// this rank's gradient pieces. With HSDP (dp_replicate > 1) the step's gradient pieces are
// all-reduced across the copies before the norm. The norm is the square root of the ranks'
// sums of squares, added in rank order. A group of one rank is the whole model in place:
// no copies, no collectives.
#include "cpu/model.h"
#include "llmc/common.h"
#include "llmc/optim.h"
#include "llmc/comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *weights;      // the whole unit, gathered (ranks·piece), NULL when not held
    comm_request *gather;
    int refs;
    bool keep;           // held for the backward pass (fsdp_reshard_after_forward = 0)
    float *grad;         // the whole unit's gradient during a backward pass
} unit_state;

typedef struct {
    backend base;
    const param_table *table;
    shard_map map;                         // this rank's pieces (one rank: the whole model)
    comm *group, *copies;                  // the FSDP group, and the HSDP copies (NULL: none)
    bool reshard;                          // fsdp_reshard_after_forward
    cpu_model *model;
    float *params, *exp_avg, *exp_avg_sq;  // the caller's (local_numel floats each)
    float *grads;                          // ours
    int64_t adam_step;
    loss_sums step_sums;                   // the micro-batches of the step so far
    // The sharded passes' state.
    cpu_units units;
    unit_state *unit;
    comm_request *scatter;                 // the reduce-scatter in flight
    int scatter_unit;
    float *scatter_out, *scatter_in;
    int64_t gathered_floats, peak_gathered_floats;
    int64_t grad_floats, peak_grad_floats;  // whole-unit gradients held, and a reduce-scatter's buffers
    bool prefetch;                         // fsdp_prefetch
} cpu_backend;

// Waits for a collective, adding the time it kept this rank waiting to base.comm_wait_s.
static void timed_wait(cpu_backend *c, comm_request *r) {
    double t0 = wall_seconds();
    comm_wait(r);
    c->base.comm_wait_s += wall_seconds() - t0;
}

static cpu_backend *cpu_of(backend *b) { return (cpu_backend *)b; }
static bool sharded(const cpu_backend *c) { return c->map.ranks > 1; }

// ---------------------------------------------------------------- units: gathered on demand

static cpu_backend *of_units(cpu_units *u) { return (cpu_backend *)((char *)u - offsetof(cpu_backend, units)); }

static void start_gather(cpu_backend *c, int u) {
    unit_state *st = &c->unit[u];
    const shard_unit *x = &c->map.units[u];
    st->weights = alloc_floats((size_t)(x->piece * c->map.ranks));
    c->gathered_floats += x->piece * c->map.ranks;
    if (c->gathered_floats > c->peak_gathered_floats) c->peak_gathered_floats = c->gathered_floats;
    c->base.gathered_peak_bytes = c->peak_gathered_floats * (int64_t)sizeof(float);
    st->gather = comm_iallgather(c->group, c->params + x->local, x->piece, st->weights);
}

static const float *units_acquire(cpu_units *u, int unit) {
    cpu_backend *c = of_units(u);
    unit_state *st = &c->unit[unit];
    if (!st->weights) start_gather(c, unit);
    if (st->gather) {
        timed_wait(c, st->gather);
        st->gather = NULL;
    }
    st->refs++;
    return st->weights;
}

static void units_prefetch(cpu_units *u, int unit) {
    cpu_backend *c = of_units(u);
    if (c->prefetch && unit >= 0 && unit < c->map.count && !c->unit[unit].weights) start_gather(c, unit);
}

static void units_release(cpu_units *u, int unit, bool backward_follows) {
    cpu_backend *c = of_units(u);
    unit_state *st = &c->unit[unit];
    CHECK(st->refs > 0);
    st->refs--;
    st->keep = backward_follows && !c->reshard;
    if (st->refs == 0 && !st->keep) {
        free(st->weights);
        st->weights = NULL;
        c->gathered_floats -= c->map.units[unit].piece * c->map.ranks;
    }
}

// Counts whole-unit gradient buffers (and the scatter's piece) for the memory plan's check.
static void count_grad_floats(cpu_backend *c, int64_t delta) {
    c->grad_floats += delta;
    if (c->grad_floats > c->peak_grad_floats) c->peak_grad_floats = c->grad_floats;
    c->base.grads_peak_bytes = c->peak_grad_floats * (int64_t)sizeof(float);
}

static float *units_grads(cpu_units *u, int unit) {
    cpu_backend *c = of_units(u);
    unit_state *st = &c->unit[unit];
    if (!st->grad) {
        st->grad = alloc_floats((size_t)(c->map.units[unit].piece * c->map.ranks));  // zeroed
        count_grad_floats(c, c->map.units[unit].piece * c->map.ranks);
    }
    return st->grad;
}

// The reduce-scatter in flight lands: its sum is added to this rank's gradient pieces.
static void finish_scatter(cpu_backend *c) {
    if (!c->scatter) return;
    timed_wait(c, c->scatter);
    const shard_unit *x = &c->map.units[c->scatter_unit];
    float *g = c->grads + x->local;
    for (int64_t i = 0; i < x->piece; i++) g[i] += c->scatter_out[i];
    free(c->scatter_out);
    free(c->scatter_in);
    count_grad_floats(c, -x->piece * (2 * c->map.ranks + 1));
    c->scatter = NULL;
}

static void units_grads_done(cpu_units *u, int unit) {
    cpu_backend *c = of_units(u);
    finish_scatter(c);
    unit_state *st = &c->unit[unit];
    const shard_unit *x = &c->map.units[unit];
    c->scatter_unit = unit;
    c->scatter_in = st->grad;
    c->scatter_out = alloc_floats((size_t)x->piece);
    count_grad_floats(c, x->piece * (c->map.ranks + 1));  // the piece, and the all-to-all's receive buffer
    c->scatter = comm_ireduce_scatter(c->group, st->grad, x->piece, c->scatter_out);
    st->grad = NULL;
}

// ---------------------------------------------------------------- the backend

// Copies n floats unless they are already in place; NULL src means zeros.
static void copy_in(float *dst, const float *src, int64_t n) {
    if (!dst || dst == src) return;
    if (src) memcpy(dst, src, (size_t)n * sizeof(float));
    else memset(dst, 0, (size_t)n * sizeof(float));
}

static void cpu_upload(backend *b, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step) {
    cpu_backend *c = cpu_of(b);
    copy_in(c->params, params, c->map.local_numel);
    copy_in(c->exp_avg, exp_avg, c->map.local_numel);
    copy_in(c->exp_avg_sq, exp_avg_sq, c->map.local_numel);
    c->adam_step = adam_step;
}

static void cpu_upload_params(backend *b, const float *params) {
    cpu_backend *c = cpu_of(b);
    copy_in(c->params, params, c->map.local_numel);
}

static void cpu_download(backend *b, float *params, float *exp_avg, float *exp_avg_sq) {
    cpu_backend *c = cpu_of(b);
    size_t n = (size_t)c->map.local_numel * sizeof(float);
    if (params && params != c->params) memcpy(params, c->params, n);
    if (exp_avg && exp_avg != c->exp_avg) memcpy(exp_avg, c->exp_avg, n);
    if (exp_avg_sq && exp_avg_sq != c->exp_avg_sq) memcpy(exp_avg_sq, c->exp_avg_sq, n);
}

static void add_sums(loss_sums *to, loss_sums s) {
    to->ce_sum += s.ce_sum;
    to->lse_sq_sum += s.lse_sq_sum;
    to->rows += s.rows;
}

static void cpu_forward_backward_step(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B,
                                      int64_t T, float grad_scale, float z_loss) {
    cpu_backend *c = cpu_of(b);
    if (!sharded(c)) {
        add_sums(&c->step_sums,
                 cpu_forward_backward(c->model, c->params, c->grads, inputs, targets, B, T, grad_scale, z_loss));
        return;
    }
    add_sums(&c->step_sums, cpu_forward_backward_units(c->model, &c->units, inputs, targets, B, T, grad_scale, z_loss));
    finish_scatter(c);
}

// Σ over the group, then over the copies: every rank of the job gets the same bits.
static double job_sum(const cpu_backend *c, double x) {
    if (c->group) x = comm_sum(c->group, x);
    if (c->copies) x = comm_sum(c->copies, x);
    return x;
}

static step_result cpu_step(backend *b, double lr, int64_t rows, const train_config *cfg, const step_limits *limits) {
    cpu_backend *c = cpu_of(b);
    int64_t n = c->map.local_numel;
    step_result r;
    memset(&r, 0, sizeof r);
    (void)rows;  // the loss sums count their own rows
    double t0 = wall_seconds();
    double ce = job_sum(c, c->step_sums.ce_sum), lse_sq = job_sum(c, c->step_sums.lse_sq_sum);
    double all_rows = job_sum(c, (double)c->step_sums.rows);
    r.loss = ce / all_rows;
    r.z_loss = cfg->z_loss * lse_sq / all_rows;
    if (c->copies) comm_allreduce(c->copies, c->grads, n);
    double waited = wall_seconds() - t0;
    double sq = grad_sum_squares(c->grads, n);
    t0 = wall_seconds();
    if (c->group) sq = comm_sum(c->group, sq);
    if (c->group || c->copies) c->base.comm_wait_s += waited + wall_seconds() - t0;
    r.grad_norm = sqrt(sq);
    r.skipped = !isfinite(r.loss) || !isfinite(r.z_loss) || !isfinite(r.grad_norm);
    r.spike = !r.skipped && spike_exceeds(limits, r.loss, r.grad_norm);
    r.skipped = r.skipped || r.spike;
    if (!r.skipped)
        optimizer_apply_shard(&c->map, c->params, c->grads, c->exp_avg, c->exp_avg_sq, &c->adam_step, r.grad_norm,
                              lr, cfg);
    r.adam_step = c->adam_step;
    memset(c->grads, 0, (size_t)n * sizeof(float));
    memset(&c->step_sums, 0, sizeof c->step_sums);
    return r;
}

static loss_sums cpu_loss(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T) {
    cpu_backend *c = cpu_of(b);
    if (!sharded(c)) return cpu_forward_loss(c->model, c->params, inputs, targets, B, T);
    return cpu_forward_loss_units(c->model, &c->units, inputs, targets, B, T);
}

static void cpu_last_logits(backend *b, const int32_t *inputs, int64_t T, float *logits) {
    cpu_backend *c = cpu_of(b);
    if (!sharded(c)) cpu_forward_last_logits(c->model, c->params, inputs, T, logits);
    else cpu_forward_last_logits_units(c->model, &c->units, inputs, T, logits);
}

static void cpu_poison_grad(backend *b, float value) { cpu_of(b)->grads[0] = value; }

static int64_t cpu_device_bytes(const backend *b) {
    (void)b;
    return 0;  // the CPU is the host: nothing beyond the host's buffers and the activations
}

static void cpu_destroy(backend *b) {
    cpu_backend *c = cpu_of(b);
    finish_scatter(c);
    for (int u = 0; c->unit && u < c->map.count; u++) {
        comm_wait(c->unit[u].gather);
        free(c->unit[u].weights);
        free(c->unit[u].grad);
    }
    free(c->unit);
    cpu_model_free(c->model);
    shard_map_free(&c->map);
    free(c->grads);
    free(c);
}

static const backend_ops cpu_ops = {
    .upload = cpu_upload,
    .upload_params = cpu_upload_params,
    .download = cpu_download,
    .forward_backward = cpu_forward_backward_step,
    .step = cpu_step,
    .forward_loss = cpu_loss,
    .forward_last_logits = cpu_last_logits,
    .poison_grad = cpu_poison_grad,
    .device_bytes = cpu_device_bytes,
    .destroy = cpu_destroy,
};

backend *cpu_backend_create_sharded(const param_table *t, comm *group, comm *copies, bool reshard_after_forward,
                                    bool prefetch, recompute_setting recompute, int64_t B, int64_t T, float *params,
                                    float *exp_avg, float *exp_avg_sq) {
    cpu_backend *c = xcalloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    c->base.name = "cpu";
    c->table = t;
    int ranks = group ? comm_size(group) : 1;
    shard_map_build(&c->map, t, group ? comm_rank(group) : 0, ranks);
    c->group = ranks > 1 ? group : NULL;
    c->copies = copies && comm_size(copies) > 1 ? copies : NULL;
    c->reshard = reshard_after_forward;
    c->prefetch = prefetch;
    c->model = cpu_model_create_recompute(t, B, T, recompute);
    c->base.activation_peak_bytes = cpu_model_activation_peak_bytes(c->model);
    c->params = params;
    c->exp_avg = exp_avg;
    c->exp_avg_sq = exp_avg_sq;
    c->grads = alloc_floats((size_t)c->map.local_numel);
    c->units = (cpu_units){units_acquire, units_prefetch, units_release, units_grads, units_grads_done};
    c->unit = xcalloc((size_t)c->map.count, sizeof *c->unit);
    return &c->base;
}

backend *cpu_backend_create(const param_table *t, int64_t B, int64_t T, float *params, float *exp_avg,
                            float *exp_avg_sq) {
    return cpu_backend_create_sharded(t, NULL, NULL, true, true, RECOMPUTE_OFF, B, T, params, exp_avg, exp_avg_sq);
}
