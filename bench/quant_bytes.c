// bench/quant_bytes.c — what quantizing DiLoCo's outer gradient costs and saves, for one
// model: bytes per outer step per parameter for none / int8 / int4 / int2 at several block
// sizes, the relative L2 error on Gaussian data, and the CPU throughput of encode, encode with
// error feedback, decode, and the reducer's mean of two contributions (decode both, add).
// Then the sparse codecs (diloco_topk): where offsets beat the bitmap for each block size
// (the crossover), and for the settings of docs/diloco.md the bytes per parameter up and
// down, with the same error and throughput columns.
//
//   bench_quant_bytes [--sparse] [CONFIG | N]   default configs/gpt-124m.conf (121.19M
//                                               parameters); --sparse: the sparse tables only
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
static double best_seconds(bench_op op, quant_codec k, int64_t n, int64_t block, const float *x, float *residual,
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

// One line of a throughput table: codec k at `block`, labelled.
static void measure(const char *label, quant_codec k, int64_t n, int64_t block, const float *x, float *residual,
                    uint8_t *enc, float *back) {
    size_t bytes = quant_encoded_bytes(k, n, block);
    memset(residual, 0, sizeof(float) * (size_t)n);
    double rel = quant_encode_feedback(k, x, residual, n, block, enc);
    double gb = 4.0 * (double)n / 1e9;
    double enc_s = best_seconds(OP_ENCODE, k, n, block, x, residual, enc, back);
    double ef_s = best_seconds(OP_FEEDBACK, k, n, block, x, residual, enc, back);
    double dec_s = best_seconds(OP_DECODE, k, n, block, x, residual, enc, back);
    double mean_s = best_seconds(OP_MEAN, k, n, block, x, residual, enc, back);
    char b[32];
    printf("%-13s %6s %12.5f %9.2f %9.5f %9.2f %9.2f %9.2f %9.2f\n", label,
           quant_codec_kind(k) == QUANT_NONE ? "-" : (snprintf(b, sizeof b, "%lld", (long long)block), b),
           (double)bytes / (double)n, (double)bytes / 1e6, rel, gb / enc_s, gb / ef_s, gb / dec_s, gb / mean_s);
    fflush(stdout);
}

// Offsets (w = ceil(log2 block) bits each) against the bitmap (block bits): the largest keep
// for which offsets are smaller, per block size.
static void crossover_table(void) {
    printf("\n# index coding of a sparse block: offsets of w bits each (ceil(keep·w/8) bytes) while smaller than the\n"
           "# bitmap (ceil(block/8) bytes), else the bitmap; chosen from (block, keep) alone (quant_sparse_offsets)\n");
    printf("%6s %3s %13s %16s %16s\n", "block", "w", "bitmap_bytes", "offsets_up_to", "crossover_topk");
    const int64_t blocks[] = {32, 64, 128, 256, 1024, 4096};
    for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
        int64_t block = blocks[bi], last = 0;
        for (int64_t keep = 1; keep < block; keep++)
            if (quant_sparse_offsets(block, keep)) last = keep;
        int w = 0;
        while (((int64_t)1 << w) < block) w++;
        printf("%6lld %3d %13lld %16lld %15.2f%%\n", (long long)block, w, (long long)((block + 7) / 8), (long long)last,
               100.0 * (double)last / (double)block);
    }
}

// The settings of docs/diloco.md: uplink and downlink bytes per parameter (downlink: the
// uplink's kind, dense; fp32 for none), then the throughput table of the sparse codecs.
static void sparse_tables(int64_t n, const float *x, float *residual, uint8_t *enc, float *back) {
    crossover_table();
    struct {
        const char *label;
        quant_kind kind;
        double topk;
    } settings[] = {{"fp32", QUANT_NONE, 1}, {"int8", QUANT_INT8, 1}, {"int4", QUANT_INT4, 1},
                    {"int2", QUANT_INT2, 1}, {"int8+top0.25", QUANT_INT8, 0.25}, {"int4+top0.25", QUANT_INT4, 0.25},
                    {"int2+top0.25", QUANT_INT2, 0.25}, {"int8+top0.03", QUANT_INT8, 0.03},
                    {"int4+top0.03", QUANT_INT4, 0.03}, {"int2+top0.03", QUANT_INT2, 0.03}};
    const int64_t blocks[] = {128, 1024};
    printf("\n# bytes per parameter per outer step, each replica: up = its Δᵢ, down = the mean (dense, the uplink's\n"
           "# kind; the hub sends it to every replica); MB for these n\n");
    printf("%-13s %6s %5s %10s %10s %9s %9s\n", "setting", "block", "keep", "up_B/param", "down_B/param", "up_MB",
           "down_MB");
    for (size_t bi = 0; bi < 2; bi++)
        for (size_t si = 0; si < sizeof settings / sizeof *settings; si++) {
            if (settings[si].kind == QUANT_NONE && bi > 0) continue;
            int64_t block = blocks[bi];
            int64_t keep = settings[si].kind == QUANT_NONE ? 0 : quant_topk_keep(settings[si].topk, block);
            quant_codec up = quant_codec_of(settings[si].kind, keep), down = settings[si].kind;
            double upb = (double)quant_encoded_bytes(up, n, block), downb = (double)quant_encoded_bytes(down, n, block);
            printf("%-13s %6lld %5lld %10.4f %10.4f %9.2f %9.2f\n", settings[si].label, (long long)block,
                   (long long)(keep ? keep : block), upb / (double)n, downb / (double)n, upb / 1e6, downb / 1e6);
        }
    printf("\n# the sparse codecs' error (relative L2 of one round, no residual yet: what is not kept counts in\n"
           "# full) and CPU throughput, as the dense table above\n");
    printf("%-13s %6s %12s %9s %9s %9s %9s %9s %9s\n", "setting", "block", "bytes/param", "MB", "rel_err", "enc_GB/s",
           "ef_GB/s", "dec_GB/s", "mean2_GB/s");
    for (size_t si = 4; si < sizeof settings / sizeof *settings; si++)
        measure(settings[si].label, quant_codec_of(settings[si].kind, quant_topk_keep(settings[si].topk, 128)), n,
                128, x, residual, enc, back);
}

int main(int argc, char **argv) {
    bool sparse_only = argc > 1 && strcmp(argv[1], "--sparse") == 0;
    if (sparse_only) argc--, argv++;
    if (argc > 2) {
        fprintf(stderr, "usage: bench_quant_bytes [--sparse] [CONFIG | N]\n");
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
    float *x = gaussian(n), *residual = alloc_floats((size_t)n), *back = alloc_floats((size_t)n);
    uint8_t *enc = xmalloc(quant_encoded_bytes(QUANT_NONE, n, 1));
    if (!sparse_only) {
        printf("%-13s %6s %12s %9s %9s %9s %9s %9s %9s\n", "kind", "block", "bytes/param", "MB", "rel_err",
               "enc_GB/s", "ef_GB/s", "dec_GB/s", "mean2_GB/s");
        const quant_kind kinds[4] = {QUANT_NONE, QUANT_INT8, QUANT_INT4, QUANT_INT2};
        const int64_t blocks[] = {32, 64, 128, 256, 1024, 4096};
        for (int ki = 0; ki < 4; ki++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
                if (kinds[ki] == QUANT_NONE && bi > 0) break; // no blocks: one line
                measure(quant_kind_name(kinds[ki]), kinds[ki], n, blocks[bi], x, residual, enc, back);
            }
    }
    sparse_tables(n, x, residual, enc, back);
    free(x), free(residual), free(back), free(enc);
    return 0;
}
