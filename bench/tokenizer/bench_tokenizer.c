// bench/tokenizer/bench_tokenizer.c — encoder throughput on one core, the C half of the
// comparison with gpt-tokenizer (bench_gpt_tokenizer.js prints the same line format).
//
// Usage: bench_tokenizer TOKENIZER ENCODING|- TEXT [REPEATS]
// Prints, for one thread:
//   cold  the first encode of the process, with a fresh per-thread piece cache (what "one
//         run" of a tool costs);
//   warm  the best of REPEATS (default 5) further encodes with the same scratch, whose piece
//         cache carries over, as gpt-tokenizer's merge cache does between its calls (and as
//         each `prepare` thread keeps its scratch for a whole run).
// Time is wall-clock around the encode call only (loading the tokenizer and reading the
// text excluded, as for the JS side), and also the thread's CPU time. The ids' count and a
// checksum let run.sh check that both sides produced the same ids.
#include "llmc/common.h"
#include "tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Same as the JS side: h = (h * 31 + id) mod 2^32 over all ids.
static uint32_t ids_checksum(const uint32_t *ids, size_t n) {
    uint32_t h = 0;
    for (size_t i = 0; i < n; i++) h = h * 31u + ids[i];
    return h;
}

int main(int argc, char **argv) {
    if (argc < 4) fail("usage: bench_tokenizer TOKENIZER ENCODING|- TEXT [REPEATS]");
    int repeats = argc > 4 ? atoi(argv[4]) : 5;
    char why[400];
    tokenizer *t = tokenizer_load(argv[1], strcmp(argv[2], "-") ? argv[2] : NULL, why, sizeof why);
    if (!t) fail("%s", why);
    size_t bytes = 0;
    char *text = read_file_or_null(argv[3], &bytes);
    if (!text) fail("cannot read %s", argv[3]);
    token_list out = {0};
    out.capacity = bytes / 2 + 16;   // allocation outside the timed region, as a warm JS heap
    out.ids = xmalloc(out.capacity * sizeof *out.ids);
    double best_wall = 1e30, best_cpu = 1e30;
    tokenizer_scratch *s = tokenizer_scratch_new(t);
    for (int rep = 0; rep <= repeats; rep++) {
        out.count = 0;
        double w0 = wall_seconds(), c0 = thread_cpu_seconds();
        if (!tokenizer_encode_append(t, s, text, bytes, false, &out, why, sizeof why)) fail("%s", why);
        double wall = wall_seconds() - w0, cpu = thread_cpu_seconds() - c0;
        if (rep == 0) {
            printf("ours %s cold bytes=%zu tokens=%zu checksum=%08x wall_s=%.4f cpu_s=%.4f tok_per_s=%.0f\n",
                   argv[2], bytes, out.count, ids_checksum(out.ids, out.count), wall, cpu, (double)out.count / wall);
        } else {
            if (wall < best_wall) best_wall = wall;
            if (cpu < best_cpu) best_cpu = cpu;
        }
    }
    printf("ours %s warm bytes=%zu tokens=%zu checksum=%08x wall_s=%.4f cpu_s=%.4f tok_per_s=%.0f\n", argv[2], bytes,
           out.count, ids_checksum(out.ids, out.count), best_wall, best_cpu, (double)out.count / best_wall);
    tokenizer_scratch_free(s);
    free(out.ids);
    free(text);
    tokenizer_free(t);
    return 0;
}
