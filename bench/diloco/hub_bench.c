// hub_bench.c — one synthetic DiLoCo replica for bench/diloco/hub_throughput.sh: it drives the
// tcp transport (net/transport.h, one hub or several) with int8 outer gradients of a chosen
// size, int8 back with the hub's error feedback, as a replica of `diloco_quant = int8` does,
// without training in between, so that the hubs' work per round is all there is to measure.
//
//   hub_bench --rendezvous H1:P1[,H2:P2...] --replica_id I --replicas M --secret_file PATH
//             [--values N] [--rounds R] [--timeout_s 60]
//
// Joins (min_replicas M: every round has all M), then R exchanges of N values (block 128,
// segments of quant_segment_values(128)), values a pure function of (replica, round, index).
// Prints one line per exchange: seconds, bytes sent and received, contributors.
#include "llmc/common.h"
#include "llmc/quant.h"
#include "net/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const char *arg(int argc, char **argv, const char *name, const char *dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    if (!dflt) fail("hub_bench: %s is required", name);
    return dflt;
}

int main(int argc, char **argv) {
    int id = atoi(arg(argc, argv, "--replica_id", NULL)), m = atoi(arg(argc, argv, "--replicas", NULL));
    int64_t n = atoll(arg(argc, argv, "--values", "16000000"));
    int rounds = atoi(arg(argc, argv, "--rounds", "3"));
    size_t secret_bytes = 0;
    char *secret = read_file_or_null(arg(argc, argv, "--secret_file", NULL), &secret_bytes);
    if (!secret) fail("hub_bench: cannot read the secret file");
    while (secret_bytes && (secret[secret_bytes - 1] == '\n' || secret[secret_bytes - 1] == ' ')) secret_bytes--;
    transport_options o = {.replica_id = id, .replicas = m, .min_replicas = m,
                           .timeout_s = atof(arg(argc, argv, "--timeout_s", "60")), .connect_timeout_s = 60,
                           .rendezvous = arg(argc, argv, "--rendezvous", NULL), .streams = 2,
                           .secret = (const uint8_t *)secret, .secret_bytes = secret_bytes,
                           .run_fingerprint = 0x4855424245ull};
    transport *t = transport_tcp_open(&o);
    const int64_t block = 128, segment = quant_segment_values(block);
    payload_spec spec = {.up_codec = QUANT_INT8, .down_codec = QUANT_INT8, .down_feedback = true, .block = block,
                         .segment = segment, .values = n, .offset = 0, .model_values = n};
    float *x = xmalloc((size_t)n * sizeof(float));
    uint8_t *payload = xmalloc(payload_spec_up_bytes(&spec));
    size_t state_bytes = 0;
    replica_status s = {0, 1, 0};
    transport_join(t, &s, NULL, 0, &state_bytes);
    for (int k = 0; k < rounds; k++) {
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)((int64_t)(mix((uint64_t)id << 40 ^ (uint64_t)k << 32 ^ (uint64_t)i) % 2001) - 1000) * 1e-6f;
        quant_encode_segments(QUANT_INT8, x, NULL, n, block, segment, payload);
        round_result r;
        double t0 = wall_seconds();
        bool ok = transport_exchange(t, k, &spec, payload, &r);
        printf("replica %d round %d: %s %.3f s, sent %llu, received %llu, %d contributor(s)\n", id, k,
               ok && !r.evicted ? "ok" : "FAILED", wall_seconds() - t0, (unsigned long long)r.bytes_sent,
               (unsigned long long)r.bytes_recv, r.n);
        fflush(stdout);
        if (!ok || r.evicted) return 1;
    }
    transport_leave(t, 0, false);
    free(x);
    free(payload);
    free(secret);
    return 0;
}
