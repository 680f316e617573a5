// llmc/guard.h — the spike guard: a step whose loss or gradient norm is far above the
// recent ones is not applied (docs/config.md#training-health, issue "a 72-hour run survives").
//
// The window holds the loss and the global gradient norm of the last W applied steps
// (W = spike_window). Once it is full and the lr warm-up is over, a step is skipped when
//     log(loss) > mean(log loss) + z·std(log loss)   or the same for the gradient norm
// (z = spike_z; population std over the window), and never below SPIKE_MIN_LOSS_RATIO /
// SPIKE_MIN_GRAD_NORM_RATIO times the window's geometric mean. In log space because gradient
// norms are heavy-tailed: twice the usual norm is common, thirty times is not.
// Only high values count: a sudden drop is no spike. Mean and std are recomputed from the
// stored values in a fixed order, so a resumed run (the window is in state.json) makes the
// same decisions bit for bit.
#ifndef TRAIN_GPT_GUARD_H
#define TRAIN_GPT_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPIKE_WINDOW_MAX 1024

// The least a limit stands above the window's geometric mean, however flat the window: a
// loss 10 % above the recent ones, a gradient norm 4 times theirs. Below these a skip costs
// more than it saves: leaving a plateau doubles the gradient norm for hundreds of steps
// (measured: 2-2.6x, markov DiLoCo runs), which clipping already bounds; a corrupted
// gradient is 30x and more.
#define SPIKE_MIN_LOSS_RATIO 1.1
#define SPIKE_MIN_GRAD_NORM_RATIO 4.0

// A lasting shift is no spike. Spikes "within the shift ratios": the gradient norm less than
// SPIKE_SHIFT_MAX_RATIO times its limit and the loss less than SPIKE_SHIFT_MAX_LOSS_RATIO times
// its own.
// - The gradient norm: when max_bad_steps − 1 steps in a row were skipped as such spikes with
//   the loss within its limit, the next step's norm may go up to SPIKE_SHIFT_MAX_RATIO times
//   the limit (with max_bad_steps = 1: at once), and the window starts over once it is applied.
//   (Until 2026-12 spikes of the loss counted toward the max_bad_steps − 1 too.)
//   A model leaving a plateau raised its norm 9-13x its window's for hundreds of steps (the
//   DiLoCo benchmark's markov runs at M = 2 and H = 200); a corrupted gradient (one element at
//   1e4) is thousands of times the limit.
// - The loss: max_bad_steps such spikes in a row roll back as any bad steps do (weights that
//   came apart give a high loss on any data, and the rollback is their cure); if the steps
//   right after the rollback are such spikes again, the data is what changed (the stream
//   moved to a harder source, a resume on other data: 1.6x the limit, lasting), and the first
//   of them is applied with the loss up to SPIKE_SHIFT_MAX_LOSS_RATIO times its limit, the
//   window starting over. Before 2026-12 every later step was skipped too, each streak rolled
//   back to the same checkpoint, and the run stopped when max_rollbacks ran out. Twice the
//   limit is a model that has come apart (a loss near log V), not data.
#define SPIKE_SHIFT_MAX_RATIO 25.0
#define SPIKE_SHIFT_MAX_LOSS_RATIO 2.0

typedef struct {
    int64_t size;                       // W the values were collected with (0: empty)
    int64_t count;                      // applied steps pushed so far; slot i % W holds step i
    double loss[SPIKE_WINDOW_MAX];
    double grad_norm[SPIKE_WINDOW_MAX];
} spike_window;

// The largest loss and gradient norm a step may have and still be applied; +inf for both
// while the guard is off (z ≤ 0), the window is not full, or step < warmup.
typedef struct {
    double max_loss, max_grad_norm;
} step_limits;

step_limits spike_limits(const spike_window *w, double z, int64_t step, int64_t warmup);
// Records an applied step. A window collected with another W starts over.
void spike_push(spike_window *w, int64_t window_size, double loss, double grad_norm);
// Whether a step's loss and norm exceed the limits (what the backends test on their side).
bool spike_exceeds(const step_limits *l, double loss, double grad_norm);
// Whether a spike looks like part of a lasting shift: above a limit, but the gradient norm
// within SPIKE_SHIFT_MAX_RATIO times its limit and the loss within SPIKE_SHIFT_MAX_LOSS_RATIO
// times its own.
bool spike_shift_like(const step_limits *l, double loss, double grad_norm);
// The limits while a shift may be accepted: l's gradient norm limit widened by its ratio, and
// with loss_too the loss limit by its own.
step_limits spike_shift_limits(const step_limits *l, bool loss_too);

#ifdef __cplusplus
}
#endif

#endif
