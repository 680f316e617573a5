// llmc/device.c — choosing the device and the MFU peak table (see llmc/device.h).
//
// The probe of the CUDA runtime is train_gpt.cu's (its GPU section, or "no CUDA backend"
// without nvcc); this file only interprets its answer, so it compiles and is tested the
// same way in both builds.
#include "llmc/device.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

// ---------------------------------------------------------------- peak table

// Dense bf16 TFLOP/s (no sparsity), BACKGROUND.md §4: torchtitan's table, llm.c for H100
// SXM, nanochat for MI300X. Matched as substrings of the name the driver reports, first
// match wins, so the more specific names come first ("H100 NVL" and "H100 PCIe" before
// the bare "H100", which is the SXM part: "NVIDIA H100 80GB HBM3").
typedef struct {
    const char *needle;
    double tflops;
} peak_row;

static const peak_row peak_table[] = {
    {"GH200", 989.0},       // NVIDIA GH200 480GB / 144G HBM3e: the H100 SXM tensor peak
    {"H100 NVL", 835.0},
    {"H100 PCIe", 756.0},
    {"H100", 989.0},        // NVIDIA H100 80GB HBM3, H100 SXM5 ...
    {"H200", 989.0},        // NVIDIA H200
    {"B200", 2250.0},
    {"A100", 312.0},        // A100-SXM4-40GB/80GB, A100-PCIE-40GB, A100 80GB PCIe: same tensor peak
    {"MI250X", 191.5},      // per GCD: each GCD is one device to the runtime
    {"MI250", 191.5},
    {"MI300X", 1307.4},
};

bool gpu_peak_tflops(const char *name, int cc_major, int cc_minor, double *tflops) {
    (void)cc_minor;
    if (!name) return false;
    for (size_t i = 0; i < sizeof peak_table / sizeof peak_table[0]; i++) {
        if (!strcasestr(name, peak_table[i].needle)) continue;
        // A name that says H100 on something that is not Hopper is not a row of this table.
        if (strstr(peak_table[i].needle, "H100") && cc_major > 0 && cc_major != 9) return false;
        *tflops = peak_table[i].tflops;
        return true;
    }
    return false;
}

// ---------------------------------------------------------------- memory table

// One device's memory as its driver reports it (cudaDeviceProp::totalGlobalMem, hipDeviceProp's;
// PyTorch's total_memory, in MiB), which is what a run's budget starts from
// (gpu_memory_budget_bytes): `train_gpt plan --gpu NAME` must plan against the same figure, not
// the name's nominal size. Until 2026-12 the table held the nominal GiB (80 for an H100 80GB,
// which reports 79.2): plan said a mode fitted that a run on the card then refused.
// Reported (the lowest seen where drivers differ):
//   H100 80GB HBM3  81082 MiB (79.18 GiB; 81089 and 81090 on other drivers; bench/results: 79.2 GiB)
//   H200            143156 MiB (139.8 GiB)
//   A100-SXM4-40GB  40536 MiB
//   MI250X (a GCD)  65520 MiB (64 GiB − 16 MiB), MI300X 196592 MiB (192 GiB − 16 MiB)
// Not seen here (A100 64GB and 80GB, H100 64GB, GH200 96GB): the nominal GiB scaled by the
// H100 80GB's 81082 / 81920, rounded down — the share its driver offers; conservative where a
// driver offers more.
typedef struct {
    const char *name;
    int64_t mib;
} memory_row;

#define MEMORY_SEEN_SHARE(gib) ((int64_t)(gib) * 81082 / 80)  // MiB: gib GiB at the H100 80GB's share

static const memory_row memory_table[] = {
    {"A100 40GB", 40536},
    {"A100 64GB", MEMORY_SEEN_SHARE(64)},
    {"A100 80GB", MEMORY_SEEN_SHARE(80)},
    {"H100 64GB", MEMORY_SEEN_SHARE(64)},
    {"H100 80GB", 81082},
    {"GH200 96GB", MEMORY_SEEN_SHARE(96)},
    {"H200 141GB", 143156},
    {"MI250X GCD 64GB", 65520},
    {"MI300X 192GB", 196592},
};

int64_t gpu_memory_budget_bytes(int64_t device_bytes) { return device_bytes - GPU_MEMORY_HEADROOM_BYTES; }

void gpu_memory_fit(int64_t plan_bytes, char *out, size_t out_bytes) {
    size_t at = 0;
    if (out_bytes) out[0] = 0;
    for (size_t i = 0; i < sizeof memory_table / sizeof memory_table[0] && at < out_bytes; i++) {
        bool fits = plan_bytes <= gpu_memory_budget_bytes(gpu_memory_bytes((int)i));
        int n = snprintf(out + at, out_bytes - at, "%s%s %s", i ? ", " : "", memory_table[i].name, fits ? "✓" : "✗");
        if (n < 0) break;
        at += (size_t)n;  // past out_bytes when cut short: the loop ends
    }
}

int gpu_memory_rows(void) { return (int)(sizeof memory_table / sizeof memory_table[0]); }
const char *gpu_memory_name(int row) { return memory_table[row].name; }
int64_t gpu_memory_bytes(int row) { return memory_table[row].mib << 20; }

// Lower case, letters and digits only: "H100 64GB" and "h100-64gb" both become "h10064gb".
static void squeeze(const char *in, char *out, size_t out_bytes) {
    size_t n = 0;
    for (; *in && n + 1 < out_bytes; in++)
        if (isalnum((unsigned char)*in)) out[n++] = (char)tolower((unsigned char)*in);
    out[n] = 0;
}

int gpu_memory_find(const char *spelling, char *why, size_t why_bytes) {
    char want[64], name[64], names[512] = "";
    squeeze(spelling, want, sizeof want);
    int found = -1, matches = 0;
    for (int i = 0; i < gpu_memory_rows(); i++) {
        squeeze(memory_table[i].name, name, sizeof name);
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", memory_table[i].name);
        if (strcmp(name, want) == 0) return i;
        if (want[0] && strncmp(name, want, strlen(want)) == 0) {
            found = i;
            matches++;
        }
    }
    if (matches == 1) return found;
    snprintf(why, why_bytes, "'%s' %s one of: %s", spelling, matches ? "names more than" : "is not", names);
    return -1;
}

// ---------------------------------------------------------------- choosing

device_kind device_choose(const char *key, const gpu_info *g, char *why, size_t why_bytes) {
    if (!key || strcmp(key, "cpu") == 0) {
        snprintf(why, why_bytes, "device = cpu: training on the CPU");
        return DEVICE_CPU;
    }
    bool want_auto = strcmp(key, "auto") == 0;
    if (!want_auto && strcmp(key, "cuda") != 0) {
        snprintf(why, why_bytes, "device: expected auto, cpu or cuda, got '%s'", key);
        return DEVICE_ERROR;
    }
    if (g->usable) {
        snprintf(why, why_bytes, "device = %s: GPU %d is %s (sm_%d%d, %.1f GiB, %d SMs)", key, g->index, g->name,
                 g->cc_major, g->cc_minor, (double)g->memory_bytes / 1073741824.0, g->sm_count);
        return DEVICE_CUDA;
    }
    if (want_auto && g->present) {
        snprintf(why, why_bytes, "device = auto: this node has a GPU this binary cannot use: %s (set device = cpu to "
                 "train on the CPU anyway)", g->why);
        return DEVICE_ERROR;
    }
    if (want_auto) {
        snprintf(why, why_bytes, "device = auto: no usable GPU (%s); training on the CPU", g->why);
        return DEVICE_CPU;
    }
    snprintf(why, why_bytes, "cuda was asked for, but %s; set device = cpu or auto", g->why);
    return DEVICE_ERROR;
}

int gpu_for_rank(int local_rank, int node_ranks, int size, int count, char *why, size_t why_bytes) {
    if (why_bytes) why[0] = 0;
    if (size <= 1 || count <= 1) return 0;
    if (node_ranks > count) {
        snprintf(why, why_bytes,
                 "this node runs %d ranks of the job but shows %d GPUs: ranks would share a GPU, each planning its "
                 "memory as if it had the GPU alone; give every rank its own GPU (srun --gpus-per-node=%d, or "
                 "--gpus-per-task=1) or run %d ranks per node",
                 node_ranks, count, node_ranks, count);
        return -1;
    }
    return local_rank % count;
}

double device_mfu_peak(device_kind kind, double configured, const gpu_info *g, char *why, size_t why_bytes) {
    if (why_bytes) why[0] = 0;
    if (configured > 0) return configured;
    if (kind != DEVICE_CUDA) return 0.0;
    double peak = 0.0;
    if (gpu_peak_tflops(g->name, g->cc_major, g->cc_minor, &peak)) return peak;
    snprintf(why, why_bytes,
             "GPU '%s' (sm_%d%d) is not in the MFU peak table: mfu is logged as null; set peak_tflops to its dense "
             "bf16 TFLOP/s",
             g->name, g->cc_major, g->cc_minor);
    return 0.0;
}
