// test/test_device.c — device selection and the MFU peak table (llmc/device.h).
//
// The peak table: every row by the names the drivers report, the specific-before-generic
// order (H100 NVL and PCIe are not taken for SXM), and unknown GPUs. Device selection on
// whatever machine runs the test: without a usable GPU (a CPU-only build, or the CUDA
// build on a machine without a driver, as in CI) `auto` falls back to the CPU and says why,
// and `cuda` is an error naming the cause; with one, both choose the GPU.
#include "check.h"
#include "llmc/device.h"

#include <math.h>
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

static void test_choose(void) {
    char why[1024];
    EXPECT(device_choose("cpu", why, sizeof why) == DEVICE_CPU, "cpu");
    EXPECT(strstr(why, "CPU") != NULL, "cpu: %s", why);
    EXPECT(device_choose("gpu", why, sizeof why) == DEVICE_ERROR, "an unknown device key is an error");
    EXPECT(strstr(why, "'gpu'") != NULL, "the error names the value: %s", why);

    const gpu_info *g = device_gpu_info();
    EXPECT(device_gpu_info() == g, "the probe is cached");
    device_kind for_auto = device_choose("auto", why, sizeof why);
    char why_auto[1024];
    memcpy(why_auto, why, sizeof why);
    device_kind for_cuda = device_choose("cuda", why, sizeof why);
    printf("test_device: %s build; GPU probe: %s\n  auto: %s\n  cuda: %s\n",
           device_has_cuda_backend() ? "CUDA" : "CPU-only", g->usable ? g->name : g->why, why_auto, why);
    if (g->usable) {
        EXPECT(device_has_cuda_backend(), "a usable GPU implies the CUDA backend");
        EXPECT(for_auto == DEVICE_CUDA && for_cuda == DEVICE_CUDA, "a usable GPU is chosen by auto and cuda");
        EXPECT(strstr(why_auto, g->name) != NULL, "auto names the GPU: %s", why_auto);
        EXPECT(g->cc_major >= 8, "usable means compute capability 8.0 or newer");
        return;
    }
    EXPECT(for_auto == DEVICE_CPU, "auto without a usable GPU falls back to the CPU");
    EXPECT(strstr(why_auto, "training on the CPU") != NULL && strstr(why_auto, g->why) != NULL,
           "auto says why: %s", why_auto);
    EXPECT(for_cuda == DEVICE_ERROR, "cuda without a usable GPU is an error");
    EXPECT(strncmp(why, "cuda was asked for, but ", 24) == 0 && strstr(why, g->why) && strstr(why, "device = cpu"),
           "cuda's error names the cause and the fix: %s", why);
    if (!device_has_cuda_backend()) {
        EXPECT(strstr(g->why, "this build has no CUDA backend") != NULL, "CPU-only build: %s", g->why);
    } else {
        // The CUDA build on a machine without a (usable) GPU: CI's case. The runtime's own
        // error number and meaning are in the reason.
        EXPECT(strstr(g->why, "error 35 (insufficient driver)") || strstr(g->why, "no CUDA device") ||
                   strstr(g->why, "compute capability") || strstr(g->why, "the CUDA runtime reports error"),
               "CUDA build without a GPU: %s", g->why);
    }
}

static void test_mfu_peak(void) {
    char why[512];
    EXPECT(device_mfu_peak(DEVICE_CPU, 0.0, why, sizeof why) == 0.0 && why[0] == 0, "CPU: unknown, no warning");
    EXPECT(device_mfu_peak(DEVICE_CPU, 123.0, why, sizeof why) == 123.0, "peak_tflops is used on the CPU");
    EXPECT(device_mfu_peak(DEVICE_CUDA, 700.0, why, sizeof why) == 700.0 && why[0] == 0,
           "peak_tflops overrides the table");
    const gpu_info *g = device_gpu_info();
    double table = 0.0;
    double peak = device_mfu_peak(DEVICE_CUDA, 0.0, why, sizeof why);
    if (gpu_peak_tflops(g->name, g->cc_major, g->cc_minor, &table))
        EXPECT(peak == table && why[0] == 0, "a known GPU: the table's %.1f, got %.1f", table, peak);
    else
        EXPECT(peak == 0.0 && strstr(why, "mfu is logged as null"), "an unknown GPU: 0 and a warning: %s", why);
}

int main(void) {
    test_peak_table();
    test_choose();
    test_mfu_peak();
    return check_summary("test_device");
}
