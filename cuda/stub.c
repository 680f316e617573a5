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

backend *cuda_backend_create(const param_table *t, int64_t B, int64_t T) {
    (void)t, (void)B, (void)T;
    fail("internal error: the CUDA backend was called in a build without it (device_choose should have said cpu)");
}
int64_t cuda_model_plan_bytes(const param_table *t, int64_t B, int64_t T) {
    (void)t, (void)B, (void)T;
    return 0;
}
