// bench/quant_bytes.c — what quantizing DiLoCo's outer gradient costs and saves, for one
// model: bytes per outer step per parameter for none / int8 / int4 at several block sizes,
// the relative L2 error on Gaussian data, and the CPU throughput of encode, encode with
// error feedback, decode, and the reducer's mean of two contributions (decode both, add).
//
//   bench_quant_bytes [CONFIG | N]     default configs/gpt-124m.conf (121.19M parameters)
//
// Throughput is in GB/s of fp32 input (encode) or fp32 output (decode): 4·n bytes over the
// best of five wall-clock runs, comparable with memcpy speed.
// The data is N(0, 1e-3): the scale does not matter to quantization, only the shape.
#include "llmc/common.h"
#include "llmc/config.h"
#include "llmc/params.h"
#include "llmc/quant.h"
#include "llmc/rng.h"

#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { REPEATS = 5 };

static int64_t parameter_count(const char *arg) {
    char *end;
    long long n = strtoll(arg, &end, 10);
    if (*end == '\0' && n > 0) return n;
    train_config cfg;
    config_load(&cfg, arg, 0, NULL);
    param_table t;
    param_table_build(&t, &cfg.model);
    int64_t numel = t.numel;
    param_table_free(&t);
    config_free(&cfg);
    return numel;
}

// Gaussian data, filled in parallel from independent streams so that 121M values take a
// moment, not seconds.
static float *gaussian(int64_t n) {
    float *x = alloc_floats((size_t)n);
    const int64_t chunk = 1 << 20;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (n + chunk - 1) / chunk; c++) {
        rng_state r;
        rng_seed(&r, 1234, (uint64_t)c);
        for (int64_t i = c * chunk; i < min_i64((c + 1) * chunk, n); i++) x[i] = (float)(rng_normal(&r) * 1e-3);
    }
    return x;
}

static const char *cpu_name(char *buf, size_t bytes) {
    snprintf(buf, bytes, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return buf;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(buf, bytes, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    fclose(f);
    return buf;
}

typedef enum { OP_ENCODE, OP_FEEDBACK, OP_DECODE, OP_MEAN } bench_op;

// Best wall-clock seconds of REPEATS runs of one operation.
static double best_seconds(bench_op op, quant_kind k, int64_t n, int64_t block, const float *x, float *residual,
                           uint8_t *enc, float *back) {
    const uint8_t *two[2] = {enc, enc};
    double best = 1e30;
    for (int rep = 0; rep < REPEATS; rep++) {
        double t0 = wall_seconds();
        switch (op) {
        case OP_ENCODE: quant_encode(k, x, n, block, enc); break;
        case OP_FEEDBACK: quant_encode_feedback(k, x, residual, n, block, enc); break;
        case OP_DECODE: quant_decode(k, enc, n, block, back); break;
        case OP_MEAN: quant_mean(k, two, 2, n, block, NULL, back); break;   // the reducer, 2 contributions
        }
        double t = wall_seconds() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc > 2) {
        fprintf(stderr, "usage: bench_quant_bytes [CONFIG | N]\n");
        return 2;
    }
    int64_t n = parameter_count(argc == 2 ? argv[1] : "configs/gpt-124m.conf");
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    char count[32], cpu[256];
    printf("# bench_quant_bytes: n = %lld parameters (%s), %d threads, %s\n", (long long)n,
           format_count((double)n, count, sizeof count), threads, cpu_name(cpu, sizeof cpu));
    printf("# bytes/param = quant_encoded_bytes / n; MB = bytes per outer step per replica (1e6 bytes);\n");
    printf("# rel_err = ||decode(encode(x)) - x|| / ||x|| on Gaussian data; GB/s = 4n bytes / best of %d runs\n",
           REPEATS);
    printf("%-5s %6s %12s %9s %9s %9s %9s %9s %9s\n", "kind", "block", "bytes/param", "MB", "rel_err", "enc_GB/s",
           "ef_GB/s", "dec_GB/s", "mean2_GB/s");

    float *x = gaussian(n), *residual = alloc_floats((size_t)n), *back = alloc_floats((size_t)n);
    uint8_t *enc = xmalloc(quant_encoded_bytes(QUANT_NONE, n, 1));
    const int64_t blocks[] = {32, 64, 128, 256, 1024, 4096};
    for (int k = 0; k < 3; k++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
            if (k == QUANT_NONE && bi > 0) break; // no blocks: one line
            int64_t block = blocks[bi];
            size_t bytes = quant_encoded_bytes((quant_kind)k, n, block);
            memset(residual, 0, sizeof(float) * (size_t)n);
            double rel = quant_encode_feedback((quant_kind)k, x, residual, n, block, enc);
            double gb = 4.0 * (double)n / 1e9;
            double enc_s = best_seconds(OP_ENCODE, (quant_kind)k, n, block, x, residual, enc, back);
            double ef_s = best_seconds(OP_FEEDBACK, (quant_kind)k, n, block, x, residual, enc, back);
            double dec_s = best_seconds(OP_DECODE, (quant_kind)k, n, block, x, residual, enc, back);
            double mean_s = best_seconds(OP_MEAN, (quant_kind)k, n, block, x, residual, enc, back);
            printf("%-5s %6s %12.5f %9.2f %9.5f %9.2f %9.2f %9.2f %9.2f\n", quant_kind_name((quant_kind)k),
                   k == QUANT_NONE ? "-" : (snprintf(count, sizeof count, "%lld", (long long)block), count),
                   (double)bytes / (double)n, (double)bytes / 1e6, rel, gb / enc_s, gb / ef_s, gb / dec_s, gb / mean_s);
            fflush(stdout);
        }
    free(x), free(residual), free(back), free(enc);
    return 0;
}
