// test/test_comm.c — llmc/comm.h's collectives against a serial reference, on however many
// ranks the launcher started (make test runs it alone, and test/test_comm.sh under mpirun
// -np 2 and 4). Every rank can regenerate every rank's data (a pure function of rank and
// index), so it computes the expected results itself: the all-gather is the concatenation;
// the reduce-scatter and the sum must equal the fp32 / double sums in rank order, bit for bit
// (the values are random fractions, so another order would differ in the last bits); the
// non-blocking forms give the same bits; and the same holds inside groups from comm_split.
#include "check.h"
#include "llmc/common.h"
#include "llmc/comm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// The value rank r puts at index i of buffer `which`: a fraction with a full mantissa, of
// magnitudes spread over a few binades so that the order of a sum shows in its last bits.
static float value(int which, int r, int64_t i) {
    uint64_t x = (uint64_t)which * 0x9e3779b97f4a7c15ull ^ ((uint64_t)r << 32) ^ (uint64_t)i;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    double u = (double)(x >> 11) / 9007199254740992.0;   // [0, 1)
    return (float)((u - 0.5) * ldexp(1.0, (int)(x % 7)));
}

static void check_group(const comm *c, const char *name, int which) {
    int rank = comm_rank(c), size = comm_size(c);
    const int64_t n = 1001;   // per rank: not a multiple of anything
    float *mine = alloc_floats(n), *all = alloc_floats((size_t)size * n), *want = alloc_floats((size_t)size * n);
    for (int64_t i = 0; i < n; i++) mine[i] = value(which, rank, i);
    for (int r = 0; r < size; r++)
        for (int64_t i = 0; i < n; i++) want[(size_t)r * n + i] = value(which, r, i);
    comm_allgather(c, mine, n, all);
    EXPECT(memcmp(all, want, (size_t)size * n * sizeof(float)) == 0, "%s: all-gather = every rank's values in order",
           name);
    memset(all, 0, (size_t)size * n * sizeof(float));
    comm_wait(comm_iallgather(c, mine, n, all));
    EXPECT(memcmp(all, want, (size_t)size * n * sizeof(float)) == 0, "%s: non-blocking all-gather", name);

    // Reduce-scatter: rank r contributes value(which + 1, r, j) at every j of size·n.
    float *full = alloc_floats((size_t)size * n), *part = alloc_floats(n), *expect = alloc_floats(n);
    for (int64_t j = 0; j < (int64_t)size * n; j++) full[j] = value(which + 1, rank, j);
    for (int64_t i = 0; i < n; i++) {
        float s = value(which + 1, 0, (int64_t)rank * n + i);
        for (int r = 1; r < size; r++) s = s + value(which + 1, r, (int64_t)rank * n + i);
        expect[i] = s;
    }
    comm_reduce_scatter(c, full, n, part);
    EXPECT(memcmp(part, expect, n * sizeof(float)) == 0, "%s: reduce-scatter = the fp32 sum in rank order", name);
    memset(part, 0, n * sizeof(float));
    comm_wait(comm_ireduce_scatter(c, full, n, part));
    EXPECT(memcmp(part, expect, n * sizeof(float)) == 0, "%s: non-blocking reduce-scatter", name);
    if (size > 2) {   // proof that the order shows: the reverse order differs somewhere
        int differ = 0;
        for (int64_t i = 0; i < n; i++) {
            float s = value(which + 1, size - 1, (int64_t)rank * n + i);
            for (int r = size - 2; r >= 0; r--) s = s + value(which + 1, r, (int64_t)rank * n + i);
            differ += s != expect[i];
        }
        EXPECT(differ > 0, "%s: the data tells the order of a sum (reverse differs at %d of %lld)", name, differ,
               (long long)n);
    }
    double x = 0.1 * (rank + 1) + 1e-17 * rank, sum = 0.0;
    for (int r = 0; r < size; r++) sum += 0.1 * (r + 1) + 1e-17 * r;
    EXPECT(comm_sum(c, x) == sum, "%s: the sum of a double in rank order", name);
    free(mine), free(all), free(want), free(full), free(part), free(expect);
}

int main(void) {
    launch_info l = launch_detect();
    comm *world = comm_world();
    EXPECT(comm_size(world) == l.size && comm_rank(world) == l.rank,
           "the world is the launcher's: rank %d of %d (%s says %d of %d)", comm_rank(world), comm_size(world),
           l.launcher, l.rank, l.size);
    // The local rank (a rank's GPU) is mpirun's, also under stale SLURM variables (test_comm.sh).
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (local)
        EXPECT(l.local_rank == atoi(local) && strcmp(l.launcher, "openmpi") == 0,
               "the local rank is mpirun's %s (%s says %d)", local, l.launcher, l.local_rank);
    check_group(world, "world", 1);
    // Two groups, even and odd ranks, each ordered by rank: the shape of HSDP's groups.
    comm *group = comm_split(world, comm_rank(world) % 2, comm_rank(world));
    int size = comm_size(world), rank = comm_rank(world);
    EXPECT(comm_size(group) == (size + 1 - rank % 2) / 2 && comm_rank(group) == rank / 2,
           "split: rank %d of %d in its group (world rank %d of %d)", comm_rank(group), comm_size(group), rank, size);
    check_group(group, rank % 2 ? "odd ranks" : "even ranks", 10 + rank % 2);
    comm_free(group);
    char name[64];
    snprintf(name, sizeof name, "test_comm rank %d of %d", rank, size);
    int status = check_summary(name);
    comm_finish();
    return status;
}
