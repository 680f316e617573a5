// cuda/probe.cu — asks the CUDA runtime, once, whether this process can train on a GPU
// (llmc/device.h's cuda_probe_device, with C linkage). It is the first CUDA call of a run, so
// it is where a machine without a driver is told apart from one with a GPU:
//   cudaErrorInsufficientDriver (35)  no usable NVIDIA driver (the usual case on a login
//                                     node or a CI machine that has the toolkit only)
//   cudaErrorNoDevice (100)           a driver but no visible device (CUDA_VISIBLE_DEVICES)
//   compute capability < 8.0          no bf16 tensor cores: the backend needs sm_80+
//   cudaErrorNoKernelImageForDevice   the binary was built for other GPUs (CUDA_ARCH)
// The runtime is linked statically (cudart_static), so the binary starts on machines with
// no libcuda.so at all; the runtime looks for the driver only here, at run time.
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "llmc/device.h"
}

// A kernel that exists only so that cudaFuncGetAttributes can tell whether this binary
// holds code the device can run.
__global__ void probe_kernel(int *x) {
    if (x) *x = 1;
}

static void say(gpu_info *info, const char *fmt, cudaError_t e) {
    snprintf(info->why, sizeof info->why, fmt, (int)e, cudaGetErrorString(e));
}

extern "C" bool cuda_probe_compiled(void) { return true; }

extern "C" void cuda_probe_device(gpu_info *info) {
    memset(info, 0, sizeof *info);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver) {
        snprintf(info->why, sizeof info->why,
                 "the CUDA runtime reports error 35 (insufficient driver): this machine has no usable NVIDIA driver");
        return;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        if (visible)
            snprintf(info->why, sizeof info->why, "no CUDA device (CUDA_VISIBLE_DEVICES='%s')", visible);
        else
            snprintf(info->why, sizeof info->why, "no CUDA device");
        return;
    }
    if (e != cudaSuccess) {
        say(info, "the CUDA runtime reports error %d (%s)", e);
        return;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        say(info, "the CUDA runtime cannot read the properties of GPU 0: error %d (%s)", e);
        return;
    }
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->memory_bytes = (int64_t)prop.totalGlobalMem;
    info->sm_count = prop.multiProcessorCount;
    if (prop.major < 8) {
        snprintf(info->why, sizeof info->why,
                 "GPU 0 (%s) has compute capability %d.%d; the CUDA backend needs bf16 tensor cores, 8.0 (A100) or "
                 "newer",
                 prop.name, prop.major, prop.minor);
        return;
    }
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, probe_kernel);
    if (e != cudaSuccess) {
        snprintf(info->why, sizeof info->why,
                 "this binary has no kernels for GPU 0 (%s, sm_%d%d): error %d (%s); rebuild with "
                 "make CUDA_ARCH=\"-gencode arch=compute_%d%d,code=sm_%d%d\"",
                 prop.name, prop.major, prop.minor, (int)e, cudaGetErrorString(e), prop.major, prop.minor, prop.major,
                 prop.minor);
        cudaGetLastError();  // clear it: the caller may go on with the CPU
        return;
    }
    info->usable = true;
}
