// cuda/stub.c — the CUDA side of a CPU-only build (make NO_CUDA=1, or no nvcc found): a
// probe that says so, and the entry points of cuda/backend.h, which device_choose() never
// lets a CPU-only build reach. Linking them keeps train.c free of #ifdefs.
#include "cuda/backend.h"
#include "llmc/common.h"
#include "llmc/device.h"

#include <stdio.h>
#include <string.h>

bool cuda_probe_compiled(void) { return false; }

void cuda_probe_device(gpu_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->why, sizeof info->why, "this build has no CUDA backend (built without nvcc or with NO_CUDA=1)");
}

// ---------------------------------------------------------------- cuda/backend.h

static NORETURN void no_backend(void) {
    fail("internal error: the CUDA backend was called in a build without it (device_choose should have said cpu)");
}

cuda_model *cuda_model_create(const param_table *t, int64_t B, int64_t T) {
    (void)t, (void)B, (void)T;
    no_backend();
}
void cuda_model_free(cuda_model *m) { (void)m; }
int64_t cuda_model_device_bytes(const cuda_model *m) {
    (void)m;
    return 0;
}
int64_t cuda_device_used_bytes(void) { return 0; }
int64_t cuda_model_plan_bytes(const param_table *t, int64_t B, int64_t T) {
    (void)t, (void)B, (void)T;
    return 0;
}
void cuda_model_upload(cuda_model *m, const float *params, const float *exp_avg, const float *exp_avg_sq,
                       int64_t adam_step) {
    (void)m, (void)params, (void)exp_avg, (void)exp_avg_sq, (void)adam_step;
    no_backend();
}
void cuda_model_upload_params(cuda_model *m, const float *params) {
    (void)m, (void)params;
    no_backend();
}
void cuda_model_download(cuda_model *m, float *params, float *exp_avg, float *exp_avg_sq) {
    (void)m, (void)params, (void)exp_avg, (void)exp_avg_sq;
    no_backend();
}
void cuda_model_download_grads(cuda_model *m, float *grads) {
    (void)m, (void)grads;
    no_backend();
}
void cuda_model_zero_grads(cuda_model *m) {
    (void)m;
    no_backend();
}
void cuda_model_poison_grad(cuda_model *m) {
    (void)m;
    no_backend();
}
void cuda_forward_backward(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T,
                           float grad_scale, float z_loss) {
    (void)m, (void)inputs, (void)targets, (void)B, (void)T, (void)grad_scale, (void)z_loss;
    no_backend();
}
loss_sums cuda_step_loss_so_far(cuda_model *m) {
    (void)m;
    no_backend();
}
void cuda_step(cuda_model *m, int64_t step, double lr, int64_t rows, const train_config *cfg) {
    (void)m, (void)step, (void)lr, (void)rows, (void)cfg;
    no_backend();
}
bool cuda_step_poll(cuda_model *m, cuda_step_result *r, bool wait) {
    (void)m, (void)r, (void)wait;
    no_backend();
}
loss_sums cuda_forward_loss(cuda_model *m, const int32_t *inputs, const int32_t *targets, int64_t B, int64_t T) {
    (void)m, (void)inputs, (void)targets, (void)B, (void)T;
    no_backend();
}
void cuda_forward_logits(cuda_model *m, const int32_t *inputs, int64_t B, int64_t T, float *logits) {
    (void)m, (void)inputs, (void)B, (void)T, (void)logits;
    no_backend();
}
void cuda_forward_last_logits(cuda_model *m, const int32_t *inputs, int64_t T, float *logits) {
    (void)m, (void)inputs, (void)T, (void)logits;
    no_backend();
}
