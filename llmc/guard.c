// llmc/guard.c — the spike guard's window (see guard.h).
#include "llmc/guard.h"

#include <math.h>

// exp(mean + z·std) of the logarithms of the first n values, and at least min_ratio times
// their geometric mean exp(mean). In log space because gradient norms are heavy-tailed: a step
// at twice the usual norm is common, one at 30 times is not; the same holds for the loss at a
// smaller scale. The floor matters on a plateau: a window of nearly equal values has a std
// near 0, and without it the limit sat a hair above them, so the rise of the gradient norm
// when the model leaves the plateau (2-2.6x in the DiLoCo benchmark's markov runs) was skipped
// step after step until the run stopped (docs/config.md#training-health).
static double upper_limit(const double *x, int64_t n, double z, double min_ratio) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += log(x[i]);
    double mean = sum / (double)n, var = 0.0;
    for (int64_t i = 0; i < n; i++) var += (log(x[i]) - mean) * (log(x[i]) - mean);
    double std = sqrt(var / (double)n);
    double margin = z * std > log(min_ratio) ? z * std : log(min_ratio);
    return exp(mean + margin);
}

step_limits spike_limits(const spike_window *w, double z, int64_t step, int64_t warmup) {
    step_limits l = {INFINITY, INFINITY};
    if (z <= 0.0 || w->size <= 0 || w->count < w->size || step < warmup) return l;
    l.max_loss = upper_limit(w->loss, w->size, z, SPIKE_MIN_LOSS_RATIO);
    l.max_grad_norm = upper_limit(w->grad_norm, w->size, z, SPIKE_MIN_GRAD_NORM_RATIO);
    return l;
}

void spike_push(spike_window *w, int64_t window_size, double loss, double grad_norm) {
    if (window_size < 1 || window_size > SPIKE_WINDOW_MAX || !(loss > 0.0) || !(grad_norm > 0.0)) return;
    if (w->size != window_size) {
        w->size = window_size;
        w->count = 0;
    }
    int64_t slot = w->count % w->size;
    w->loss[slot] = loss;
    w->grad_norm[slot] = grad_norm;
    w->count++;
}

bool spike_exceeds(const step_limits *l, double loss, double grad_norm) {
    return loss > l->max_loss || grad_norm > l->max_grad_norm;
}

step_limits spike_shift_limits(const step_limits *l, bool loss_too) {
    return (step_limits){loss_too ? l->max_loss * SPIKE_SHIFT_MAX_LOSS_RATIO : l->max_loss,
                         l->max_grad_norm * SPIKE_SHIFT_MAX_RATIO};
}

bool spike_shift_like(const step_limits *l, double loss, double grad_norm) {
    step_limits wide = spike_shift_limits(l, true);
    return spike_exceeds(l, loss, grad_norm) && !spike_exceeds(&wide, loss, grad_norm);
}
