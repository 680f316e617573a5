// cpu/backend.c — the CPU backend of llmc/backend.h: cpu/model.c's forward and backward, and
// llmc/optim.c's step, over the trainer's host buffers (fp32 throughout).
#include "cpu/model.h"
#include "llmc/common.h"
#include "llmc/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    backend base;
    const param_table *table;
    cpu_model *model;
    float *params, *exp_avg, *exp_avg_sq;  // the caller's
    float *grads;                          // ours
    int64_t adam_step;
    loss_sums step_sums;                   // the micro-batches of the step so far
} cpu_backend;

static cpu_backend *cpu_of(backend *b) { return (cpu_backend *)b; }

// Copies n floats unless they are already in place; NULL src means zeros.
static void copy_in(float *dst, const float *src, int64_t n) {
    if (!dst || dst == src) return;
    if (src) memcpy(dst, src, (size_t)n * sizeof(float));
    else memset(dst, 0, (size_t)n * sizeof(float));
}

static void cpu_upload(backend *b, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step) {
    cpu_backend *c = cpu_of(b);
    copy_in(c->params, params, c->table->numel);
    copy_in(c->exp_avg, exp_avg, c->table->numel);
    copy_in(c->exp_avg_sq, exp_avg_sq, c->table->numel);
    c->adam_step = adam_step;
}

static void cpu_upload_params(backend *b, const float *params) {
    cpu_backend *c = cpu_of(b);
    copy_in(c->params, params, c->table->numel);
}

static void cpu_download(backend *b, float *params, float *exp_avg, float *exp_avg_sq) {
    cpu_backend *c = cpu_of(b);
    int64_t n = c->table->numel;
    if (params && params != c->params) memcpy(params, c->params, (size_t)n * sizeof(float));
    if (exp_avg && exp_avg != c->exp_avg) memcpy(exp_avg, c->exp_avg, (size_t)n * sizeof(float));
    if (exp_avg_sq && exp_avg_sq != c->exp_avg_sq) memcpy(exp_avg_sq, c->exp_avg_sq, (size_t)n * sizeof(float));
}

static void cpu_forward_backward_step(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B,
                                      int64_t T, float grad_scale, float z_loss) {
    cpu_backend *c = cpu_of(b);
    loss_sums s = cpu_forward_backward(c->model, c->params, c->grads, inputs, targets, B, T, grad_scale, z_loss);
    c->step_sums.ce_sum += s.ce_sum;
    c->step_sums.lse_sq_sum += s.lse_sq_sum;
    c->step_sums.rows += s.rows;
}

static step_result cpu_step(backend *b, double lr, int64_t rows, const train_config *cfg, const step_limits *limits) {
    cpu_backend *c = cpu_of(b);
    int64_t numel = c->table->numel;
    step_result r;
    memset(&r, 0, sizeof r);
    (void)rows;  // the loss sums count their own rows
    r.loss = c->step_sums.ce_sum / (double)c->step_sums.rows;
    r.z_loss = cfg->z_loss * c->step_sums.lse_sq_sum / (double)c->step_sums.rows;
    r.grad_norm = grad_global_norm(c->grads, numel);
    r.skipped = !isfinite(r.loss) || !isfinite(r.z_loss) || !isfinite(r.grad_norm);
    r.spike = !r.skipped && spike_exceeds(limits, r.loss, r.grad_norm);
    r.skipped = r.skipped || r.spike;
    if (!r.skipped)
        optimizer_apply(c->table, c->params, c->grads, c->exp_avg, c->exp_avg_sq, &c->adam_step, r.grad_norm, lr,
                        cfg);
    r.adam_step = c->adam_step;
    memset(c->grads, 0, (size_t)numel * sizeof(float));
    memset(&c->step_sums, 0, sizeof c->step_sums);
    return r;
}

static loss_sums cpu_loss(backend *b, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T) {
    cpu_backend *c = cpu_of(b);
    return cpu_forward_loss(c->model, c->params, inputs, targets, B, T);
}

static void cpu_last_logits(backend *b, const int32_t *inputs, int64_t T, float *logits) {
    cpu_backend *c = cpu_of(b);
    cpu_forward_last_logits(c->model, c->params, inputs, T, logits);
}

static void cpu_poison_grad(backend *b, float value) { cpu_of(b)->grads[0] = value; }

static int64_t cpu_device_bytes(const backend *b) {
    (void)b;
    return 0;  // the CPU is the host: nothing beyond the host's buffers and the activations
}

static void cpu_destroy(backend *b) {
    cpu_backend *c = cpu_of(b);
    cpu_model_free(c->model);
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

backend *cpu_backend_create(const param_table *t, int64_t B, int64_t T, float *params, float *exp_avg,
                            float *exp_avg_sq) {
    cpu_backend *c = xcalloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    c->base.name = "cpu";
    c->table = t;
    c->model = cpu_model_create(t, B, T);
    c->params = params;
    c->exp_avg = exp_avg;
    c->exp_avg_sq = exp_avg_sq;
    c->grads = alloc_floats((size_t)t->numel);
    return &c->base;
}
