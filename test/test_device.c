// test/test_device.c — device selection and the MFU peak table (llmc/device.h).
//
// The peak table: every row by the names the drivers report, the specific-before-generic
// order (H100 NVL and PCIe are not taken for SXM), and unknown GPUs. Device selection from
// the probe's answers (a usable GPU; a CUDA build without a driver, CI's case; a CPU-only
// build): `auto` falls back to the CPU and says why, `cuda` is an error naming the cause
// and the fix. What the real probe says on this machine is checked through the binary
// (test/test_bad_input.sh). The memory line of `train_gpt plan` (gpu_memory_fit) at the
// edges of the table's sizes; the table's sizes are what the cards report, and the plan's fit
// and a run's budget are one rule (gpu_memory_budget_bytes).
#include "check.h"
#include "llmc/device.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void expect_peak(const char *name, int major, int minor, double want) {
    double got = -1.0;
    bool known = gpu_peak_tflops(name, major, minor, &got);
    EXPECT(known && fabs(got - want) < 1e-9, "%s: expected %.1f TFLOP/s, got %s %.1f", name, want,
           known ? "known" : "unknown", got);
}

static void expect_unknown(const char *name, int major, int minor) {
    double got = -1.0;
    EXPECT(!gpu_peak_tflops(name, major, minor, &got), "%s: expected unknown, got %.1f", name, got);
    EXPECT(got == -1.0, "%s: the output must be left alone for an unknown GPU", name);
}

static void test_peak_table(void) {
    expect_peak("NVIDIA A100-SXM4-80GB", 8, 0, 312.0);
    expect_peak("NVIDIA A100-SXM4-40GB", 8, 0, 312.0);
    expect_peak("NVIDIA A100-PCIE-40GB", 8, 0, 312.0);
    expect_peak("NVIDIA A100 80GB PCIe", 8, 0, 312.0);
    expect_peak("NVIDIA H100 80GB HBM3", 9, 0, 989.0);
    expect_peak("NVIDIA H100 PCIe", 9, 0, 756.0);
    expect_peak("NVIDIA H100 NVL", 9, 0, 835.0);
    expect_peak("NVIDIA GH200 480GB", 9, 0, 989.0);
    expect_peak("NVIDIA GH200 144G HBM3e", 9, 0, 989.0);
    expect_peak("NVIDIA H200", 9, 0, 989.0);
    expect_peak("NVIDIA B200", 10, 0, 2250.0);
    expect_peak("AMD Instinct MI250X", 9, 0, 191.5);     // HIP reports gfx90a as 9.0
    expect_peak("AMD Instinct MI250X/MI250", 9, 0, 191.5);
    expect_peak("AMD Instinct MI300X", 9, 4, 1307.4);
    expect_peak("nvidia h100 80gb hbm3", 9, 0, 989.0);   // case does not matter
    expect_peak("NVIDIA H100 80GB HBM3", 0, 0, 989.0);   // unknown compute capability: trust the name
    expect_unknown("NVIDIA GeForce RTX 4090", 8, 9);
    expect_unknown("Tesla V100-SXM2-16GB", 7, 0);
    expect_unknown("NVIDIA L40S", 8, 9);
    expect_unknown("", 0, 0);
    expect_unknown(NULL, 0, 0);
    expect_unknown("NVIDIA H100 80GB HBM3", 8, 0);       // an H100 name on non-Hopper: not trusted
}

// Probe answers as train_gpt.cu's probe gives them.
static gpu_info usable_h100(void) {
    gpu_info g;
    memset(&g, 0, sizeof g);
    g.compiled = g.usable = true;
    snprintf(g.name, sizeof g.name, "NVIDIA H100 80GB HBM3");
    g.cc_major = 9;
    g.memory_bytes = (int64_t)80 << 30;
    g.sm_count = 132;
    return g;
}
static gpu_info unusable(bool compiled, const char *why) {
    gpu_info g;
    memset(&g, 0, sizeof g);
    g.compiled = compiled;
    snprintf(g.why, sizeof g.why, "%s", why);
    return g;
}

static void test_choose(void) {
    char why[1024];
    gpu_info h100 = usable_h100();
    gpu_info no_driver = unusable(true, "the CUDA runtime reports error 35 (insufficient driver): this machine has "
                                        "no usable NVIDIA driver");
    gpu_info cpu_only = unusable(false, "this build has no CUDA backend (built without nvcc or with NO_CUDA=1)");

    EXPECT(device_choose("cpu", &h100, why, sizeof why) == DEVICE_CPU, "cpu, even with a GPU");
    EXPECT(strstr(why, "CPU") != NULL, "cpu: %s", why);
    EXPECT(device_choose("gpu", &h100, why, sizeof why) == DEVICE_ERROR, "an unknown device key is an error");
    EXPECT(strstr(why, "'gpu'") != NULL, "the error names the value: %s", why);

    EXPECT(device_choose("auto", &h100, why, sizeof why) == DEVICE_CUDA, "auto takes a usable GPU");
    EXPECT(strstr(why, h100.name) && strstr(why, "132 SMs"), "auto names the GPU: %s", why);
    EXPECT(device_choose("cuda", &h100, why, sizeof why) == DEVICE_CUDA, "cuda takes a usable GPU");
    EXPECT(strstr(why, "GPU 0 is") != NULL, "a one-GPU process names GPU 0: %s", why);
    gpu_info fourth = h100;
    fourth.index = 3;  // rank 3 of a node's 4
    device_choose("cuda", &fourth, why, sizeof why);
    EXPECT(strstr(why, "GPU 3 is") != NULL, "a node's rank 3 names the GPU it uses: %s", why);

    const gpu_info *without[] = {&no_driver, &cpu_only};
    for (int i = 0; i < 2; i++) {
        const gpu_info *g = without[i];
        EXPECT(device_choose("auto", g, why, sizeof why) == DEVICE_CPU, "auto without a usable GPU: the CPU");
        EXPECT(strstr(why, "training on the CPU") && strstr(why, g->why), "auto says why: %s", why);
        EXPECT(device_choose("cuda", g, why, sizeof why) == DEVICE_ERROR, "cuda without a usable GPU: an error");
        EXPECT(strncmp(why, "cuda was asked for, but ", 24) == 0 && strstr(why, g->why) && strstr(why, "device = cpu"),
               "cuda's error names the cause and the fix: %s", why);
    }
}

// A GPU there that this binary cannot use for a reason the user can fix (a driver older than the
// CUDA runtime: error 35 with a driver version): auto refuses instead of training on the CPU
// (a 1B model on a GPU node's CPU looked like a hang, after one note line).
static void test_present_unusable(void) {
    char why[700];
    gpu_info old_driver = {0};
    old_driver.compiled = true;
    old_driver.present = true;
    snprintf(old_driver.why, sizeof old_driver.why,
             "the NVIDIA driver here supports CUDA up to 12.4, and this binary was built with CUDA 13.0");
    EXPECT(device_choose("auto", &old_driver, why, sizeof why) == DEVICE_ERROR,
           "auto with a GPU it cannot use (driver too old): an error, not the CPU");
    EXPECT(strstr(why, "supports CUDA up to 12.4") && strstr(why, "device = cpu"), "auto's error says why and how to "
           "train on the CPU anyway: %s", why);
    EXPECT(device_choose("cpu", &old_driver, why, sizeof why) == DEVICE_CPU, "cpu stays the CPU");
    EXPECT(device_choose("cuda", &old_driver, why, sizeof why) == DEVICE_ERROR, "cuda: an error");
}

// A rank's GPU: its rank on the node; GPU 0 alone or where each rank sees one GPU; refused where
// the node runs more ranks than it shows GPUs (local_rank % count wrapped round, silently).
static void test_gpu_for_rank(void) {
    char why[600];
    EXPECT(gpu_for_rank(0, 1, 1, 8, why, sizeof why) == 0 && !why[0], "a job of one rank: GPU 0");
    EXPECT(gpu_for_rank(3, 4, 8, 4, why, sizeof why) == 3, "4 ranks on a node of 4 GPUs: rank 3 takes GPU 3");
    EXPECT(gpu_for_rank(3, 4, 8, 1, why, sizeof why) == 0, "--gpus-per-task=1 (each sees one GPU): GPU 0");
    EXPECT(gpu_for_rank(5, 8, 16, 4, why, sizeof why) == -1, "8 ranks on a node of 4 GPUs: refused");
    EXPECT(strstr(why, "8 ranks of the job but shows 4 GPUs") && strstr(why, "--gpus-per-node=8"),
           "the refusal names the ranks, the GPUs and the fix: %s", why);
    EXPECT(gpu_for_rank(5, 0, 16, 4, why, sizeof why) == 1, "the launcher did not say the node's ranks: no check");
}

static void test_mfu_peak(void) {
    char why[512];
    gpu_info h100 = usable_h100(), l40s = usable_h100();
    snprintf(l40s.name, sizeof l40s.name, "NVIDIA L40S");
    l40s.cc_major = 8;
    l40s.cc_minor = 9;
    EXPECT(device_mfu_peak(DEVICE_CPU, 0.0, &h100, why, sizeof why) == 0.0 && why[0] == 0, "CPU: unknown, no warning");
    EXPECT(device_mfu_peak(DEVICE_CPU, 123.0, &h100, why, sizeof why) == 123.0, "peak_tflops is used on the CPU");
    EXPECT(device_mfu_peak(DEVICE_CUDA, 700.0, &h100, why, sizeof why) == 700.0 && why[0] == 0,
           "peak_tflops overrides the table");
    double peak = device_mfu_peak(DEVICE_CUDA, 0.0, &h100, why, sizeof why);
    EXPECT(peak == 989.0 && why[0] == 0, "a known GPU: the table's 989, got %.1f", peak);
    peak = device_mfu_peak(DEVICE_CUDA, 0.0, &l40s, why, sizeof why);
    EXPECT(peak == 0.0 && strstr(why, "mfu is logged as null") && strstr(why, "L40S"),
           "an unknown GPU: 0 and a warning naming it: %s", why);
}

// The plan's memory line: which GPUs hold the plan plus the headroom, by name.
static void test_memory_fit(void) {
    char line[512];
    int64_t gib = (int64_t)1 << 30;
    gpu_memory_fit(60 * gib, line, sizeof line);  // 62 GiB with the headroom
    EXPECT(strstr(line, "A100 40GB ✗") && strstr(line, "A100 64GB ✓") && strstr(line, "H100 80GB ✓") &&
               strstr(line, "MI250X GCD 64GB ✓") && strstr(line, "MI300X 192GB ✓"),
           "60 GiB: %s", line);
    gpu_memory_fit(63 * gib, line, sizeof line);  // 65 GiB: above one MI250X GCD, within an MI300X
    EXPECT(strstr(line, "MI250X GCD 64GB ✗") && strstr(line, "H100 64GB ✗") && strstr(line, "MI300X 192GB ✓") &&
               strstr(line, "H200 141GB ✓"),
           "63 GiB: %s", line);
    gpu_memory_fit(191 * gib, line, sizeof line);  // nothing holds 193 GiB
    EXPECT(strstr(line, "MI300X 192GB ✗") && !strstr(line, "✓"), "191 GiB: %s", line);
    char tiny[16];
    gpu_memory_fit(gib, tiny, sizeof tiny);  // cut short, still a terminated string
    EXPECT(strlen(tiny) == sizeof tiny - 1 && strncmp(tiny, "A100 40GB ✓", strlen("A100 40GB ✓")) == 0, "a short buffer: '%s'", tiny);
}

// A run's budget is its device's totalGlobalMem less the headroom; `plan --gpu NAME` must take
// the same from the table's row, so the row holds what the card reports: an H100 80GB says
// 79.2 GiB (bench/results/2026-11-24-*-H100-80GB-HBM3.txt: "sm_90, 79.2 GiB"), not 80. With the
// nominal 80 GiB, plan found a 77.5 GiB plan fitting where the run (77.2 GiB) refused it.
static void test_memory_rows(void) {
    int64_t gib = (int64_t)1 << 30;
    char why[512], line[512], label[32];
    int h100 = gpu_memory_find("h100-80gb", why, sizeof why);
    EXPECT(h100 >= 0, "h100-80gb names a row: %s", why);
    if (h100 < 0) return;
    snprintf(label, sizeof label, "%.1f GiB", (double)gpu_memory_bytes(h100) / (double)gib);
    EXPECT(strcmp(label, "79.2 GiB") == 0, "H100 80GB: the driver's 79.2 GiB (the run's banner), got %s", label);
    // The run on that card: totalGlobalMem between 81082 and 81090 MiB (drivers differ); the
    // table's row is the lowest, so the plan never fits what a run there refuses.
    int64_t run_budget = gpu_memory_budget_bytes((int64_t)81082 << 20);
    EXPECT(gpu_memory_budget_bytes(gpu_memory_bytes(h100)) == run_budget,
           "H100 80GB: plan's budget %lld = a run's on 81082 MiB %lld",
           (long long)gpu_memory_budget_bytes(gpu_memory_bytes(h100)), (long long)run_budget);
    EXPECT(run_budget == gpu_memory_bytes(h100) - GPU_MEMORY_HEADROOM_BYTES, "the budget is the device less 2 GiB");
    for (int row = 0; row < gpu_memory_rows(); row++) {
        const char *name = gpu_memory_name(row);
        int64_t bytes = gpu_memory_bytes(row), budget = gpu_memory_budget_bytes(bytes);
        // The name's size in GiB: a driver offers less than it, by under 3 % (0.8 GiB of 80).
        const char *size = strrchr(name, ' ');
        int nominal = size ? atoi(size + 1) : 0;  // "H100 80GB": 80
        EXPECT(nominal > 0 && bytes < (int64_t)nominal * gib && bytes > (int64_t)nominal * gib * 97 / 100,
               "%s: %lld bytes, under its nominal %d GiB by less than 3 %%", name, (long long)bytes, nominal);
        // The plan's ✓ is the run's budget to the byte.
        char mark[64];
        snprintf(mark, sizeof mark, "%s ✓", name);
        gpu_memory_fit(budget, line, sizeof line);
        EXPECT(strstr(line, mark) != NULL, "%s: a plan of its budget fits: %s", name, line);
        gpu_memory_fit(budget + 1, line, sizeof line);
        EXPECT(strstr(line, mark) == NULL, "%s: a byte over its budget does not: %s", name, line);
    }
}

int main(void) {
    test_peak_table();
    test_memory_fit();
    test_memory_rows();
    test_choose();
    test_present_unusable();
    test_gpu_for_rank();
    test_mfu_peak();
    return check_summary("test_device");
}
