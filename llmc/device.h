// llmc/device.h — which device a run trains on, and how fast that device is.
//
// device_choose() implements the `device` key once, at start-up:
//   cpu   → the CPU.
//   auto  → the GPU if this build has the CUDA backend and the CUDA runtime finds a usable
//           device (a driver, a device, compute capability ≥ 8.0, a kernel image for it);
//           otherwise the CPU, with the reason (the caller prints it as a notice).
//   cuda  → the GPU, or DEVICE_ERROR with the reason (the caller makes it a fatal error).
// The CUDA runtime is asked once per process (cudaGetDeviceCount and the properties of
// device 0) and the answer cached: on a machine without an NVIDIA driver the runtime
// returns error 35 (cudaErrorInsufficientDriver), and that becomes a one-line reason, not
// a crash. A build without nvcc (make NO_CUDA=1, or no toolkit) links a probe that always
// answers "this build has no CUDA backend".
//
// gpu_peak_tflops() is the MFU table: dense bf16 TFLOP/s by the name the driver reports
// (the compute capability only breaks ties). An unknown GPU returns false: the caller
// warns and logs mfu as null unless peak_tflops is set in the config.
#ifndef TRAIN_GPT_DEVICE_H
#define TRAIN_GPT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DEVICE_CPU = 0,
    DEVICE_CUDA = 1,
    DEVICE_ERROR = 2,   // `cuda` was asked for and cannot be had; why says why
} device_kind;

// device_key: "auto", "cpu" or "cuda" (anything else is DEVICE_ERROR). why receives one
// line for the user in every case: the GPU chosen, why the CPU is used, or the error.
device_kind device_choose(const char *device_key, char *why, size_t why_bytes);

// What the CUDA runtime said about device 0 (valid when device_choose gave DEVICE_CUDA).
typedef struct {
    bool usable;                 // the CUDA backend can run on it
    char name[256];              // "NVIDIA H100 80GB HBM3"
    int cc_major, cc_minor;      // compute capability
    int64_t memory_bytes;        // total device memory
    int sm_count;
    char why[512];               // when not usable: the reason, one line
} gpu_info;

// The cached probe of device 0 (probes on first call). Never fails.
const gpu_info *device_gpu_info(void);

// True if this binary was built with the CUDA backend.
bool device_has_cuda_backend(void);

// Dense bf16 TFLOP/s of one device (one GCD for MI250X); false if the GPU is unknown.
bool gpu_peak_tflops(const char *name, int cc_major, int cc_minor, double *tflops);

// The peak for MFU: `configured` (the peak_tflops key) when > 0; on DEVICE_CUDA the table's
// entry for GPU 0; otherwise 0 = unknown (metrics then log mfu as null, never a made-up
// number). For an unknown GPU, why receives the warning to print; else it is emptied.
double device_mfu_peak(device_kind kind, double configured, char *why, size_t why_bytes);

// The probe itself, in cuda/probe.cu (C linkage) or, in a CPU-only build, cuda/stub.c:
// fills *info from the CUDA runtime. Exposed for the tests; use device_gpu_info().
void cuda_probe_device(gpu_info *info);
// True in cuda/probe.cu, false in cuda/stub.c.
bool cuda_probe_compiled(void);

#ifdef __cplusplus
}
#endif

#endif
