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
    int64_t decay_start = S - (int64_t)llround(cfg->decay_frac * (double)S);
    if (s >= decay_start && S > decay_start) {
        double p = (double)(s - decay_start) / (double)(S - decay_start);
        if (strcmp(cfg->decay_shape, "sqrt") == 0) return lo + (peak - lo) * (1.0 - sqrt(p));
        return peak + (lo - peak) * p;
    }
    return peak;
}

#define NORM_BLOCK 65536

double grad_global_norm(const float *grads, int64_t count) {
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
    return sqrt(total);
}

double grad_clip(float *grads, int64_t count, double norm, double max_norm) {
    if (max_norm <= 0.0) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    if (coef >= 1.0) return 1.0;
    float c = (float)coef;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) grads[i] *= c;
    return coef;
}

void adamw_update(const param_table *t, float *params, const float *grads, float *m, float *v, int64_t adam_step,
                  double lr, const train_config *cfg) {
    double b1 = cfg->beta1, b2 = cfg->beta2;
    float beta1 = (float)b1, beta2 = (float)b2;
    float one_minus_b1 = (float)(1.0 - b1), one_minus_b2 = (float)(1.0 - b2);
    double bias1 = 1.0 - pow(b1, (double)adam_step), bias2 = 1.0 - pow(b2, (double)adam_step);
    float step_size = (float)(lr / bias1);
    float bias2_sqrt = (float)sqrt(bias2);
    float eps = (float)cfg->adam_eps;
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        float keep = p->decay ? (float)(1.0 - lr * cfg->weight_decay) : 1.0f;
        float *w = params + p->offset, *mm = m + p->offset, *vv = v + p->offset;
        const float *g = grads + p->offset;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < p->numel; j++) {
            float gj = g[j];
            float wj = w[j] * keep;
            float mj = mm[j] * beta1 + gj * one_minus_b1;
            float vj = vv[j] * beta2 + gj * gj * one_minus_b2;
            mm[j] = mj;
            vv[j] = vj;
            w[j] = wj - step_size * (mj / (sqrtf(vj) / bias2_sqrt + eps));
        }
    }
}

void optimizer_apply(const param_table *t, float *params, float *grads, float *m, float *v, int64_t *adam_step,
                     double grad_norm, double lr, const train_config *cfg) {
    grad_clip(grads, t->numel, grad_norm, cfg->grad_clip);
    (*adam_step)++;
    adamw_update(t, params, grads, m, v, *adam_step, lr, cfg);
}

bool all_finite(const float *x, int64_t count) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < count; i++) bad |= !isfinite(x[i]);
    return !bad;
}
