// llmc/device.h — which device a run trains on, and how fast that device is.
//
// device_choose() implements the `device` key once, at start-up, from what the probe of the
// CUDA runtime found (gpu_info; the probe is train_gpt.cu's, which asks the runtime once):
//   cpu   → the CPU.
//   auto  → the GPU if this build has the CUDA backend and the CUDA runtime finds a usable
//           device (a driver, a device, compute capability ≥ 8.0, a kernel image for it);
//           otherwise the CPU, with the reason (the caller prints it as a notice) — but an
//           error where a GPU is there that this binary cannot use for a reason the user can
//           fix (gpu_info.present: a driver older than the runtime, no kernel image): a 1B
//           model on the CPU of a GPU node looks like a hang.
//   cuda  → the GPU, or DEVICE_ERROR with the reason (the caller makes it a fatal error).
// On a machine without an NVIDIA driver the runtime returns error 35
// (cudaErrorInsufficientDriver), and the probe makes that a one-line reason, not a crash; a
// build without nvcc (make NO_CUDA=1, or no toolkit) says "this build has no CUDA backend".
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

// What the CUDA runtime said about device 0.
typedef struct {
    bool compiled;               // this build has the CUDA backend
    bool usable;                 // the CUDA backend can run on it
    bool present;                // not usable, but a GPU is there that a driver update or a rebuild
                                 // would let it use (a driver older than the runtime, no kernel
                                 // image for it): auto refuses rather than train on the CPU
    char name[256];              // "NVIDIA H100 80GB HBM3"
    int cc_major, cc_minor;      // compute capability
    int64_t memory_bytes;        // total device memory
    int sm_count;
    int index;                   // which of the GPUs this process sees it uses (its rank on the node)
    char why[512];               // when not usable: the reason, one line
} gpu_info;

// device_key: "auto", "cpu" or "cuda" (anything else is DEVICE_ERROR); gpu: the probe's
// answer. why receives one line for the user in every case: the GPU chosen, why the CPU is
// used, or the error.
device_kind device_choose(const char *device_key, const gpu_info *gpu, char *why, size_t why_bytes);

// Which of the `count` GPUs this process sees a rank takes: its rank on the node (local_rank of
// node_ranks; GPU 0 for a job of one rank, or where each rank sees one GPU, as under srun
// --gpus-per-task=1). -1, with the reason in why, when the node runs more ranks than it shows
// GPUs (count > 1): ranks would share a GPU, each planning its memory as if it had it alone
// (they ran out of memory, or NCCL refused the duplicate GPU with an unhelpful error).
// node_ranks 0: the launcher did not say (no check). One GPU seen by several ranks is not
// refused: srun --gpus-per-task=1 shows each its own as GPU 0, which only a device's bus id
// would tell apart from one GPU shared.
int gpu_for_rank(int local_rank, int node_ranks, int size, int count, char *why, size_t why_bytes);

// Dense bf16 TFLOP/s of one device (one GCD for MI250X); false if the GPU is unknown.
bool gpu_peak_tflops(const char *name, int cc_major, int cc_minor, double *tflops);

// The memory of the GPUs train_gpt's users train on, for `train_gpt plan` (which runs on a
// login node, with no GPU to ask): into out, one line naming each with ✓ where one device
// holds plan_bytes (the GPU memory plan) plus GPU_MEMORY_HEADROOM_BYTES, ✗ where it does not,
// e.g. "A100 40GB ✗, A100 64GB ✓, ..., MI250X GCD 64GB ✓, MI300X 192GB ✓". One GCD of an
// MI250X is one device (64 GB of the package's 128).
#define GPU_MEMORY_HEADROOM_BYTES ((int64_t)2 << 30)
// What one rank's plan may use on a device of device_bytes (its totalGlobalMem, or a row of the
// table below, which holds what each card reports): the run's budget and the plan's, one rule.
int64_t gpu_memory_budget_bytes(int64_t device_bytes);
void gpu_memory_fit(int64_t plan_bytes, char *out, size_t out_bytes);
// The same table, row by row: its size, each row's name and memory (bytes, as the card's
// driver reports them: llmc/device.c says where each figure comes from), and the row a user's
// spelling names ("h100-64gb", "H100 64GB", "gh200": case, spaces and dashes do not matter; a
// prefix must name one row). -1 when it names none or several, with the reason in why.
int gpu_memory_rows(void);
const char *gpu_memory_name(int row);
int64_t gpu_memory_bytes(int row);
int gpu_memory_find(const char *spelling, char *why, size_t why_bytes);

// The peak for MFU: `configured` (the peak_tflops key) when > 0; on DEVICE_CUDA the table's
// entry for gpu (GPU 0); otherwise 0 = unknown (metrics then log mfu as null, never a
// made-up number). For an unknown GPU, why receives the warning to print; else it is emptied.
double device_mfu_peak(device_kind kind, double configured, const gpu_info *gpu, char *why, size_t why_bytes);

#ifdef __cplusplus
}
#endif

#endif
