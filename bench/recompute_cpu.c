// bench/recompute_cpu.c — what activation recomputation (issue #18) costs and saves on the CPU
// backend: the time of a training step (one micro-batch's forward and backward, then AdamW)
// and the activation memory the backend's allocator counts, for recompute = none, selective,
// full and full on every 2nd layer.
//
//   bench_recompute CONFIG [BATCH [SEQ [ROUNDS [THREADS]]]]   defaults 1, the config's seq_len, 6, 2
//
// One backend per mode in one process, over the same weights; a round times one step of each
// mode back to back, the order rotated from round to round. On a machine shared with other
// jobs the load drifts over minutes, so besides each mode's median and fastest step the
// overhead is also given paired: the median over the rounds of (mode's step / none's step in
// the same round), which cancels what the load does to both. CPU time (the process's, all
// threads) is given beside wall time: it moves less with other load, but counts the time
// OpenMP threads spin at a barrier. The first step of each backend (first touch of its
// buffers) is run before the rounds and not timed.
#include "cpu/model.h"
#include "llmc/common.h"
#include "llmc/config.h"
#include "llmc/guard.h"
#include "llmc/optim.h"
#include "cpu/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { MODES = 4, MAX_ROUNDS = 64 };

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *x, int n) {
    double s[MAX_ROUNDS];
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, compare_doubles);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double smallest(const double *x, int n) {
    double m = x[0];
    for (int i = 1; i < n; i++) m = fmin(m, x[i]);
    return m;
}

int main(int argc, char **argv) {
    if (argc < 2) fail("usage: bench_recompute CONFIG [BATCH [SEQ [ROUNDS [THREADS]]]]");
    gemm_fix_cpu_kernels(argv);
    int64_t batch = argc > 2 ? atoll(argv[2]) : 1;
    char batch_text[32];
    snprintf(batch_text, sizeof batch_text, "%lld", (long long)batch);
    char *overrides[] = {"--batch_size", batch_text, "--train_data", "unused", "--device", "cpu"};
    train_config cfg;
    config_load(&cfg, argv[1], 6, overrides);
    int64_t seq = argc > 3 ? atoll(argv[3]) : cfg.model.seq_len;
    int rounds = argc > 4 ? atoi(argv[4]) : 6;
    int threads = argc > 5 ? atoi(argv[5]) : 2;
    if (batch < 1 || seq < 2 || seq > cfg.model.seq_len || rounds < 1 || rounds > MAX_ROUNDS || threads < 1)
        fail("bench_recompute: BATCH >= 1, 2 <= SEQ <= seq_len, 1 <= ROUNDS <= %d, THREADS >= 1", MAX_ROUNDS);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    gemm_set_threads(threads);
    param_table t;
    param_table_build(&t, &cfg.model);
    float *params = alloc_floats((size_t)t.numel), *m = alloc_floats((size_t)t.numel);
    float *v = alloc_floats((size_t)t.numel);
    param_init(&t, params, 1);
    const recompute_setting modes[MODES] = {
        {RECOMPUTE_NONE, 1}, {RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_FULL, 1}, {RECOMPUTE_FULL, 2}};
    const char *names[MODES] = {"none", "selective", "full", "full, every 2nd"};
    backend *be[MODES];
    int32_t *inputs = xmalloc((size_t)(batch * seq) * sizeof *inputs);
    int32_t *targets = xmalloc((size_t)(batch * seq) * sizeof *targets);
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < batch * seq; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        inputs[i] = (int32_t)(x % (uint64_t)cfg.model.vocab_size);
        targets[i] = (int32_t)((x >> 20) % (uint64_t)cfg.model.vocab_size);
    }
    step_limits limits = {INFINITY, INFINITY};
    float scale = 1.0f / (float)(batch * seq);
    for (int i = 0; i < MODES; i++) {
        be[i] = cpu_backend_create_sharded(&t, NULL, NULL, true, true, modes[i], batch, seq, params, m, v);
        backend_forward_backward(be[i], inputs, targets, batch, seq, scale, (float)cfg.z_loss);
        backend_step(be[i], 1e-4, batch * seq, &cfg, &limits);
    }
    static double wall[MODES][MAX_ROUNDS], cpu[MODES][MAX_ROUNDS], ratio[MODES][MAX_ROUNDS],
        cpu_ratio[MODES][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < MODES; k++) {
            int i = (k + r) % MODES;
            double w0 = wall_seconds(), c0 = cpu_seconds();
            backend_forward_backward(be[i], inputs, targets, batch, seq, scale, (float)cfg.z_loss);
            backend_step(be[i], 1e-4, batch * seq, &cfg, &limits);
            wall[i][r] = 1e3 * (wall_seconds() - w0);
            cpu[i][r] = 1e3 * (cpu_seconds() - c0);
        }
        for (int i = 0; i < MODES; i++) {
            ratio[i][r] = wall[i][r] / wall[0][r];
            cpu_ratio[i][r] = cpu[i][r] / cpu[0][r];
        }
        fprintf(stderr, "round %d:", r + 1);
        for (int i = 0; i < MODES; i++) fprintf(stderr, " %s %.0f ms", names[i], wall[i][r]);
        fprintf(stderr, "\n");
    }
    printf("# %s, %lld x %lld tokens, %d threads, %d rounds, %s\n", argv[1], (long long)batch, (long long)seq, threads,
           rounds, gemm_backend_name());
    printf("%-16s %10s %10s %10s %14s %12s %14s %16s %16s\n", "mode", "median ms", "fastest ms", "cpu ms",
           "paired wall", "paired cpu", "fastest/none", "activation MiB", "planned MiB");
    for (int i = 0; i < MODES; i++) {
        double act = (double)be[i]->activation_peak_bytes / 1048576.0;
        double planned = (double)cpu_model_plan_bytes(&t, batch, seq, modes[i]) / 1048576.0;
        printf("%-16s %10.0f %10.0f %10.0f %+13.1f%% %+11.1f%% %+13.1f%% %9.1f (%.2f) %16.1f\n", names[i],
               median(wall[i], rounds), smallest(wall[i], rounds), median(cpu[i], rounds),
               100 * (median(ratio[i], rounds) - 1), 100 * (median(cpu_ratio[i], rounds) - 1),
               100 * (smallest(wall[i], rounds) / smallest(wall[0], rounds) - 1), act,
               act / ((double)be[0]->activation_peak_bytes / 1048576.0), planned);
    }
    printf("# every step (wall ms), by round:\n");
    for (int i = 0; i < MODES; i++) {
        printf("#   %-16s", names[i]);
        for (int r = 0; r < rounds; r++) printf(" %.0f", wall[i][r]);
        printf("\n");
    }
    for (int i = 0; i < MODES; i++) backend_free(be[i]);
    free(inputs);
    free(targets);
    free(params);
    free(m);
    free(v);
    param_table_free(&t);
    config_free(&cfg);
    return 0;
}
