// llmc/optim.c — WSD schedule, gradient norm and clipping, AdamW (see llmc/optim.h).
#include "llmc/optim.h"
#include "llmc/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double lr_at_step(const train_config *cfg, int64_t s) {
    double peak = cfg->lr, lo = cfg->min_lr_frac * cfg->lr;
    int64_t S = cfg->max_steps;
    if (s < cfg->warmup_steps) return peak * (double)(s + 1) / (double)cfg->warmup_steps;
    int64_t decay_start = decay_start_step(cfg);
    if (s >= decay_start && S > decay_start) {
        // At most 1: past max_steps (asked only of a run resumed beyond a lowered max_steps: its
        // warning) the lr stays at its floor; it went on down the line, below 0.
        double p = s >= S ? 1.0 : (double)(s - decay_start) / (double)(S - decay_start);
        if (strcmp(cfg->decay_shape, "sqrt") == 0) return lo + (peak - lo) * (1.0 - sqrt(p));
        return peak + (lo - peak) * p;
    }
    return peak;
}

#define NORM_BLOCK 65536

double grad_sum_squares(const float *grads, int64_t count) {
    int64_t blocks = ceil_div(count, NORM_BLOCK);
    double *partial = xmalloc((size_t)blocks * sizeof *partial);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i0 = b * NORM_BLOCK, i1 = min_i64(count, i0 + NORM_BLOCK);
        double s = 0.0;
        for (int64_t i = i0; i < i1; i++) s += (double)grads[i] * grads[i];
        partial[b] = s;
    }
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) total += partial[b];
    free(partial);
    return total;
}

double grad_global_norm(const float *grads, int64_t count) { return sqrt(grad_sum_squares(grads, count)); }

double grad_clip(float *grads, int64_t count, double norm, double max_norm) {
    if (max_norm <= 0.0) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    if (coef >= 1.0) return 1.0;
    float c = (float)coef;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) grads[i] *= c;
    return coef;
}

// The scalars of one AdamW step, shared by every stretch of it.
typedef struct {
    float beta1, beta2, one_minus_b1, one_minus_b2, step_size, bias2_sqrt, eps, keep_decay;
} adamw_step;

static adamw_step adamw_scalars(int64_t adam_step, double lr, const train_config *cfg) {
    double b1 = cfg->beta1, b2 = cfg->beta2;
    adamw_step a;
    a.beta1 = (float)b1;
    a.beta2 = (float)b2;
    a.one_minus_b1 = (float)(1.0 - b1);
    a.one_minus_b2 = (float)(1.0 - b2);
    double bias1 = 1.0 - pow(b1, (double)adam_step), bias2 = 1.0 - pow(b2, (double)adam_step);
    a.step_size = (float)(lr / bias1);
    a.bias2_sqrt = (float)sqrt(bias2);
    a.eps = (float)cfg->adam_eps;
    a.keep_decay = (float)(1.0 - lr * cfg->weight_decay);
    return a;
}

// n values of one tensor (decayed or not): the element-wise update.
static void adamw_stretch(const adamw_step *a, bool decay, float *w, const float *g, float *mm, float *vv, int64_t n) {
    float keep = decay ? a->keep_decay : 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        float gj = g[j];
        float wj = w[j] * keep;
        float mj = mm[j] * a->beta1 + gj * a->one_minus_b1;
        float vj = vv[j] * a->beta2 + gj * gj * a->one_minus_b2;
        mm[j] = mj;
        vv[j] = vj;
        w[j] = wj - a->step_size * (mj / (sqrtf(vj) / a->bias2_sqrt + a->eps));
    }
}

void adamw_update(const param_table *t, float *params, const float *grads, float *m, float *v, int64_t adam_step,
                  double lr, const train_config *cfg) {
    adamw_step a = adamw_scalars(adam_step, lr, cfg);
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        int64_t o = p->offset;
        adamw_stretch(&a, p->decay, params + o, grads + o, m + o, v + o, p->numel);
    }
}

typedef struct {
    const adamw_step *a;
    bool decay;
    float *params, *m, *v;
    const float *grads;
} adamw_shard_ctx;

static void adamw_visit(void *ctx, int64_t global, int64_t local, int64_t count) {
    (void)global;
    adamw_shard_ctx *c = ctx;
    adamw_stretch(c->a, c->decay, c->params + local, c->grads + local, c->m + local, c->v + local, count);
}

void adamw_update_shard(const shard_map *s, float *params, const float *grads, float *m, float *v,
                        int64_t adam_step, double lr, const train_config *cfg) {
    adamw_step a = adamw_scalars(adam_step, lr, cfg);
    const param_table *t = s->table;
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        adamw_shard_ctx c = {&a, p->decay, params, m, v, grads};
        shard_visit(s, p->offset, p->offset + p->numel, adamw_visit, &c);
    }
}

void optimizer_apply(const param_table *t, float *params, float *grads, float *m, float *v, int64_t *adam_step,
                     double grad_norm, double lr, const train_config *cfg) {
    grad_clip(grads, t->numel, grad_norm, cfg->grad_clip);
    (*adam_step)++;
    adamw_update(t, params, grads, m, v, *adam_step, lr, cfg);
}

void optimizer_apply_shard(const shard_map *s, float *params, float *grads, float *m, float *v, int64_t *adam_step,
                           double grad_norm, double lr, const train_config *cfg) {
    grad_clip(grads, s->local_numel, grad_norm, cfg->grad_clip);
    (*adam_step)++;
    adamw_update_shard(s, params, grads, m, v, *adam_step, lr, cfg);
}

bool all_finite(const float *x, int64_t count) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < count; i++) bad |= !isfinite(x[i]);
    return !bad;
}
