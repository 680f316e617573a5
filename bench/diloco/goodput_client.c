// goodput_client.c — the two sides of bench/diloco/goodput.sh: one DiLoCo replica driving
// the transport (net/transport.h) with payloads of a chosen size, and a plain-TCP sender /
// receiver that measures the raw link the transport runs on (the baseline).
//
//   goodput_client transport --rendezvous HOST:PORT --replica_id I --replicas M
//                  --secret_file PATH [--streams S] [--timeout_s 60] [--payload_mb 100]
//                  [--exchanges 3] [--link_mbit 100] [--label NAME] [--barrier_dir DIR]
//       Opens the tcp transport, joins, waits until a round has every replica in it, then
//       does N timed exchanges of a payload of P bytes: P / 4 fp32 values, unquantized
//       (codec none both ways, no error feedback), each a small random integer that is a
//       pure function of (replica id, step, index). The hub returns their mean; the sums are
//       exact, so every replica recomputes, after the timed call, the mean of the replicas
//       the round names (fp32 sum in ascending id, one division) and checks the hub's bytes
//       against it. Before each timed exchange the replicas meet at a barrier so that they
//       start together: with --barrier_dir (the replicas run on one machine) a file per
//       replica and exchange in DIR; without it, a tiny round (256 values) through the
//       transport, which starts the far replica one hub-to-replica latency after the near one.
//   goodput_client relay --listen HOST:PORT --secret_file PATH [--timeout_s 60] ...
//       The hub: net/relay.c's relay_main, the same code as `train_gpt relay`.
//   goodput_client sink --listen HOST:PORT
//       The far end of the raw-TCP measurements: serves upload, download and ping clients
//       (one thread per connection) until killed.
//   goodput_client upload|download --connect HOST:PORT [--payload_mb 100] [--streams 1]
//                  [--link_mbit 100] [--label NAME]
//       Sends P bytes to the sink (upload) or receives P bytes from it (download), split over
//       S parallel TCP connections. Timed from the first byte sent (or requested) until the
//       sink acknowledged every byte (or the last byte arrived).
//   goodput_client ping --connect HOST:PORT [--count 20]
//       Round trips of a 64-byte message through the sink: min / median / max RTT.
//
// What is counted (printed with the results too): goodput = payload bytes / wall time,
// payload meaning the application's bytes only — no transport framing, no HMAC tags, no TCP/IP
// or Ethernet headers. For an exchange, the payload bytes are those this replica had to move
// over the busier direction of its link: max(its payload sent, the mean received). The hub
// reduces, so both are P whatever the number of replicas, and the count is P. On a
// full-duplex link of rate R the fastest possible exchange therefore takes P / R, and
// goodput / R is the fraction of that ideal the transport reached.
// The wire bytes the transport reports (round_result.bytes_sent / bytes_recv: payload +
// framing) are printed alongside as wire Mbit/s. The raw-TCP baseline counts the same way
// (payload bytes / time), so it shows what a plain TCP connection gets on the same link after
// TCP/IP/Ethernet headers: about 1448 / 1514 = 95.6 % of the shaped rate at MTU 1500.
#include "llmc/quant.h"
#include "net/relay.h"
#include "sock.h"
#include "net/transport.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ---------------------------------------------------------------- options

typedef struct {
    const char *rendezvous, *secret_file, *listen, *connect, *label, *barrier_dir;
    int replica_id, replicas, streams, exchanges, count;
    double timeout_s, payload_mb, link_mbit;
} options;

static void usage(void) {
    fprintf(stderr,
            "usage: goodput_client transport --rendezvous HOST:PORT --replica_id I --replicas M --secret_file PATH\n"
            "                      [--streams S] [--timeout_s 60] [--payload_mb 100] [--exchanges 3]\n"
            "                      [--link_mbit 100] [--label NAME] [--barrier_dir DIR]\n"
            "       goodput_client relay --listen HOST:PORT --secret_file PATH [--timeout_s 60] (the hub)\n"
            "       goodput_client sink --listen HOST:PORT\n"
            "       goodput_client upload|download --connect HOST:PORT [--payload_mb 100] [--streams 1]\n"
            "                      [--link_mbit 100] [--label NAME]\n"
            "       goodput_client ping --connect HOST:PORT [--count 20]\n");
    exit(2);
}

static int int_option(const char *name, const char *v, int lo, int hi) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "goodput_client: error: %s %s: expected an integer in %d .. %d\n", name, v, lo, hi);
        exit(1);
    }
    return (int)x;
}

static double real_option(const char *name, const char *v, double lo, double hi) {
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "goodput_client: error: %s %s: expected a number in %g .. %g\n", name, v, lo, hi);
        exit(1);
    }
    return x;
}

static options parse_options(int argc, char **argv) {
    options o = {.replica_id = -1, .streams = 1, .exchanges = 3, .count = 20, .timeout_s = 60,
                 .payload_mb = 100, .link_mbit = 100, .label = ""};
    for (int i = 0; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (strcmp(k, "--rendezvous") == 0) o.rendezvous = v;
        else if (strcmp(k, "--secret_file") == 0) o.secret_file = v;
        else if (strcmp(k, "--listen") == 0) o.listen = v;
        else if (strcmp(k, "--connect") == 0) o.connect = v;
        else if (strcmp(k, "--label") == 0) o.label = v;
        else if (strcmp(k, "--barrier_dir") == 0) o.barrier_dir = v;
        else if (strcmp(k, "--replica_id") == 0) o.replica_id = int_option(k, v, 0, TRANSPORT_MAX_REPLICAS - 1);
        else if (strcmp(k, "--replicas") == 0) o.replicas = int_option(k, v, 1, TRANSPORT_MAX_REPLICAS);
        else if (strcmp(k, "--streams") == 0) o.streams = int_option(k, v, 1, 64);
        else if (strcmp(k, "--exchanges") == 0) o.exchanges = int_option(k, v, 1, 1000);
        else if (strcmp(k, "--count") == 0) o.count = int_option(k, v, 1, 100000);
        else if (strcmp(k, "--timeout_s") == 0) o.timeout_s = real_option(k, v, 0.1, 86400);
        else if (strcmp(k, "--payload_mb") == 0) o.payload_mb = real_option(k, v, 1e-6, 16384);
        else if (strcmp(k, "--link_mbit") == 0) o.link_mbit = real_option(k, v, 1e-3, 1e6);
        else usage();
    }
    return o;
}

static void require(const void *option, const char *name) {
    if (!option) {
        fprintf(stderr, "goodput_client: error: %s is required\n", name);
        exit(1);
    }
}

static size_t payload_bytes(const options *o) { return (size_t)(o->payload_mb * 1e6); }

static double mbit_per_s(double bytes, double seconds) { return seconds > 0 ? bytes * 8 / seconds / 1e6 : 0; }

// ---------------------------------------------------------------- payloads

#define PAYLOAD_BLOCK 128
#define TINY_VALUES 256   // the barrier's and the warm-up's rounds

// n fp32 values, unquantized both ways: the payload is the values' bytes, as is the mean.
static payload_spec spec_of(int64_t n) {
    return (payload_spec){.up_codec = QUANT_NONE, .down_codec = QUANT_NONE, .down_feedback = false,
                          .block = PAYLOAD_BLOCK, .segment = quant_segment_values(PAYLOAD_BLOCK), .values = n,
                          .offset = 0, .model_values = n};
}

// The values of replica `id` for outer step `step`: integers in -1000 .. 1000 from
// xorshift64*, so that each replica can regenerate every other replica's, and any sum of
// them (up to TRANSPORT_MAX_REPLICAS) is exact in fp32. accumulate: x[i] = x[i] + value
// (one fp32 addition, as the hub's), else x[i] = value.
static void fill_values(float *x, int64_t n, int id, int64_t step, bool accumulate) {
    uint64_t s = 0x9E3779B97F4A7C15ull ^ ((uint64_t)id << 32) ^ (uint64_t)step * 0xD1B54A32D192ED03ull;
    if (!s) s = 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        float v = (float)((int)((s * 0x2545F4914F6CDD1Dull >> 32) % 2001) - 1000);
        x[i] = accumulate ? x[i] + v : v;
    }
}

// ---------------------------------------------------------------- transport mode

// The file's bytes without trailing whitespace, as diloco.c reads diloco_secret_file.
static uint8_t *read_secret(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "goodput_client: error: cannot read the secret file '%s': %s\n", path, strerror(errno));
        exit(1);
    }
    uint8_t *s = malloc(4096);
    size_t n = fread(s, 1, 4096, f);
    fclose(f);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (n < 16) {
        fprintf(stderr, "goodput_client: error: the secret file '%s' holds %zu bytes; use at least 16\n", path, n);
        exit(1);
    }
    *bytes = n;
    return s;
}

// Checks the round's mean against the mean of the regenerated values of the replicas it names
// (fp32 sum in ascending id, then one fp32 division by their count: the hub's arithmetic),
// encoded as the hub encodes it; prints what differs. sum holds spec->values floats, expect
// payload_spec_down_bytes(spec) bytes.
static bool round_is_intact(const round_result *r, int64_t step, int replicas, const payload_spec *spec, float *sum,
                            uint8_t *expect) {
    bool ok = r->outer_step == step && r->n == replicas && r->apply && !r->evicted;
    if (!ok)
        fprintf(stderr, "goodput_client: round %lld: outer_step %lld, %d of %d contributed, apply %d, evicted %d\n",
                (long long)step, (long long)r->outer_step, r->n, replicas, r->apply, r->evicted);
    size_t bytes = payload_spec_down_bytes(spec);
    if (r->n < 1 || !r->mean || r->mean_bytes != bytes) {
        fprintf(stderr, "goodput_client: round %lld: a mean of %zu bytes from %d replicas, expected %zu bytes\n",
                (long long)step, r->mean ? r->mean_bytes : 0, r->n, bytes);
        return false;
    }
    int64_t n = spec->values;
    for (int i = 0; i < r->n; i++) fill_values(sum, n, r->ids[i], step, i > 0);
    if (r->n > 1) {
        float divisor = (float)r->n;
        for (int64_t i = 0; i < n; i++) sum[i] = sum[i] / divisor;
    }
    quant_encode_segments((quant_kind)spec->down_codec, sum, NULL, n, spec->block, spec->segment, expect);
    if (memcmp(r->mean, expect, bytes) != 0) {
        size_t at = 0;
        while (r->mean[at] == expect[at]) at++;
        fprintf(stderr, "goodput_client: round %lld: the hub's mean of replicas", (long long)step);
        for (int i = 0; i < r->n; i++) fprintf(stderr, " %d", r->ids[i]);
        fprintf(stderr, " is not the mean of what they sent (%zu bytes, the first difference at byte %zu)\n", bytes, at);
        ok = false;
    }
    return ok;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The benchmark's replica state, as diloco.c's is for a real run: what a joining replica
// takes from the donor. Here just the next outer step.
typedef struct {
    transport *t;
    const options *o;
    int64_t step;               // the next outer step to contribute to
    int64_t rounds_alone;       // warm-up rounds with fewer than o->replicas contributors
} replica;

static join_result replica_join(replica *r, bool rejoin) {
    replica_status status = {r->step, 0x5eed, 0};
    uint8_t state[64];
    size_t state_bytes = 0;
    join_result j = rejoin ? transport_rejoin(r->t, &status, state, sizeof state, &state_bytes)
                           : transport_join(r->t, &status, state, sizeof state, &state_bytes);
    if (j == JOIN_GOT_STATE) {
        if (state_bytes != 8) {
            fprintf(stderr, "goodput_client: error: the donor's state is %zu bytes, expected 8\n", state_bytes);
            exit(1);
        }
        memcpy(&r->step, state, 8);
    }
    return j;
}

// One exchange at r->step, untimed, with what diloco.c does around it: rejoin after an
// eviction, hand the state to joiners. true when every replica contributed.
static bool replica_sync_round(replica *r, const payload_spec *spec, const uint8_t *payload) {
    round_result res;
    memset(&res, 0, sizeof res);
    if (!transport_exchange(r->t, r->step, spec, payload, &res)) {
        fprintf(stderr, "goodput_client: error: outer step %lld: the transport is gone (hub unreachable)\n",
                (long long)r->step);
        exit(1);
    }
    if (res.evicted) {
        replica_join(r, true);
        return false;
    }
    r->step++;
    if (res.send_state) transport_send_state(r->t, (const uint8_t *)&r->step, 8, NULL);
    return res.n == r->o->replicas;
}

// A tiny round's payload: TINY_VALUES zeros, encoded.
static payload_spec tiny_spec;
static uint8_t tiny_payload[TINY_VALUES * sizeof(float)];

static void tiny_init(void) {
    float zeros[TINY_VALUES] = {0};
    tiny_spec = spec_of(TINY_VALUES);
    if (payload_spec_up_bytes(&tiny_spec) != sizeof tiny_payload) {
        fprintf(stderr, "goodput_client: error: a tiny payload is %zu bytes, expected %zu\n",
                payload_spec_up_bytes(&tiny_spec), sizeof tiny_payload);
        exit(1);
    }
    quant_encode_segments(QUANT_NONE, zeros, NULL, TINY_VALUES, tiny_spec.block, tiny_spec.segment, tiny_payload);
}

// Until a round has every replica in it (the others may still be starting): tiny rounds.
static void replica_wait_for_group(replica *r) {
    double deadline = now_s() + r->o->timeout_s;
    while (!replica_sync_round(r, &tiny_spec, tiny_payload)) {
        r->rounds_alone++;
        if (now_s() > deadline) {
            fprintf(stderr, "goodput_client: error: the other replicas did not join within %.0f s\n", r->o->timeout_s);
            exit(1);
        }
        usleep(20 * 1000);
    }
}

// Waits until every replica reached barrier `k` (a file per replica in o->barrier_dir).
static void file_barrier(const options *o, int k) {
    char path[4096];
    snprintf(path, sizeof path, "%s/r%d.%d", o->barrier_dir, o->replica_id, k);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "goodput_client: error: --barrier_dir: cannot create %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fclose(f);
    double deadline = now_s() + o->timeout_s;
    for (int id = 0; id < o->replicas; id++) {
        snprintf(path, sizeof path, "%s/r%d.%d", o->barrier_dir, id, k);
        while (access(path, F_OK) != 0) {
            if (now_s() > deadline) {
                fprintf(stderr, "goodput_client: error: replica %d did not reach barrier %d within %.0f s\n", id, k,
                        o->timeout_s);
                exit(1);
            }
            usleep(1000);
        }
    }
}

static int run_transport(const options *o) {
    require(o->rendezvous, "--rendezvous");
    require(o->secret_file, "--secret_file");
    if (o->replica_id < 0 || o->replicas <= 0 || o->replica_id >= o->replicas) {
        fprintf(stderr, "goodput_client: error: --replica_id must be in 0 .. --replicas - 1\n");
        return 1;
    }
    // P bytes = n fp32 values; the payload and the mean are n * 4 bytes (codec none).
    int64_t n = (int64_t)(payload_bytes(o) / sizeof(float));
    if (n < 1) {
        fprintf(stderr, "goodput_client: error: --payload_mb %g is less than one fp32 value\n", o->payload_mb);
        return 1;
    }
    payload_spec spec = spec_of(n);
    size_t bytes = payload_spec_up_bytes(&spec), mean_bytes = payload_spec_down_bytes(&spec);
    // values: this replica's values, then the expected mean; payload: the encoded values, then
    // (after the exchange, before the next one regenerates it) the encoded expected mean.
    float *values = malloc((size_t)n * sizeof *values);
    uint8_t *payload = malloc(bytes > mean_bytes ? bytes : mean_bytes);
    double *goodput = malloc((size_t)o->exchanges * sizeof *goodput);
    if (!values || !payload || !goodput) {
        fprintf(stderr, "goodput_client: error: out of memory for two %zu-byte payloads\n", bytes);
        return 1;
    }
    tiny_init();
    transport_options to = {0};
    to.replica_id = o->replica_id;
    to.replicas = o->replicas;
    to.min_replicas = 1;
    to.timeout_s = o->timeout_s;
    to.connect_timeout_s = 30;
    to.rendezvous = o->rendezvous;
    to.streams = o->streams;
    to.secret = read_secret(o->secret_file, &to.secret_bytes);
    to.run_fingerprint = 0x676f6f6470757400ull;  // "goodput": every replica of the benchmark agrees
    double open_start = now_s();
    replica r = {.o = o};
    r.t = transport_tcp_open(&to);
    join_result j = replica_join(&r, false);
    replica_wait_for_group(&r);
    printf("%s replica %d: joined (%s) and in step with the group after %.3f s (%lld warm-up rounds alone); "
           "%d replicas, %d stream(s), payload %zu bytes, %d exchanges\n",
           o->label, o->replica_id, j == JOIN_MEMBER ? "member" : "got state", now_s() - open_start,
           (long long)r.rounds_alone, o->replicas, o->streams, bytes, o->exchanges);

    bool all_ok = true;
    double total_s = 0, total_bytes = 0;
    for (int k = 0; k < o->exchanges; k++) {
        // A barrier first: every replica starts the timed exchange with its payload ready.
        int64_t step = o->barrier_dir ? r.step : r.step + 1;
        fill_values(values, n, o->replica_id, step, false);
        quant_encode_segments((quant_kind)spec.up_codec, values, NULL, n, spec.block, spec.segment, payload);
        if (o->barrier_dir) {
            file_barrier(o, k);
        } else if (!replica_sync_round(&r, &tiny_spec, tiny_payload) || r.step != step) {
            fprintf(stderr, "goodput_client: error: a replica left the group before exchange %d\n", k);
            return 1;
        }
        round_result res;
        memset(&res, 0, sizeof res);
        double t0 = now_s();
        bool ok = transport_exchange(r.t, step, &spec, payload, &res);
        double t1 = now_s(), dt = t1 - t0;
        if (!ok) {
            fprintf(stderr, "goodput_client: error: exchange %d: the transport is gone (hub unreachable)\n", k);
            return 1;
        }
        r.step++;
        if (res.send_state) transport_send_state(r.t, (const uint8_t *)&r.step, 8, NULL);
        bool intact = round_is_intact(&res, step, o->replicas, &spec, values, payload);
        all_ok = all_ok && intact;
        // The payload moved: max(own payload sent, mean received); both are P (codec none).
        size_t received = res.mean ? res.mean_bytes : 0;
        double moved = (double)(received > bytes ? received : bytes);
        goodput[k] = mbit_per_s(moved, dt);
        total_s += dt;
        total_bytes += moved;
        printf("%s replica %d exchange %d: payload sent %zu B, mean of %d received %zu B, "
               "wire sent %llu B, wire received %llu B, time %.3f s (sync_s %.3f, wait_s %.3f), "
               "goodput %.2f Mbit/s = %.1f %% of %.0f Mbit/s, wire up %.2f / down %.2f Mbit/s, payloads %s\n",
               o->label, o->replica_id, k, bytes, res.n, received, (unsigned long long)res.bytes_sent,
               (unsigned long long)res.bytes_recv, dt, res.sync_s, res.wait_s, goodput[k],
               100 * goodput[k] / o->link_mbit, o->link_mbit, mbit_per_s((double)res.bytes_sent, dt),
               mbit_per_s((double)res.bytes_recv, dt), intact ? "verified" : "CORRUPT");
        // For the group's round time: every replica runs on this machine, on one monotonic clock.
        printf("TIMING %s|%d|%d|%.6f|%.6f|%.0f\n", o->label, o->replica_id, k, t0, t1, moved);
    }
    transport_leave(r.t, 0, false);
    qsort(goodput, (size_t)o->exchanges, sizeof *goodput, compare_doubles);
    double overall = mbit_per_s(total_bytes, total_s);
    printf("%s replica %d summary: %d exchanges of %zu B, %d stream(s): goodput overall %.2f Mbit/s = %.1f %% of "
           "%.0f Mbit/s (min %.2f, median %.2f, max %.2f); payloads %s\n",
           o->label, o->replica_id, o->exchanges, bytes, o->streams, overall, 100 * overall / o->link_mbit, o->link_mbit,
           goodput[0], goodput[o->exchanges / 2], goodput[o->exchanges - 1], all_ok ? "all verified" : "CORRUPT");
    free(values);
    free(payload);
    free(goodput);
    return all_ok ? 0 : 1;
}

// ---------------------------------------------------------------- raw TCP: sink and clients
//
// Each raw connection starts with a 9-byte request: one letter and a little-endian uint64.
//   'U' n: the client sends n bytes; the sink answers with the uint64 count it read.
//   'D' n: the sink sends n bytes.
//   'P' n: n round trips of a 64-byte message, echoed.

#define RAW_CHUNK (1 << 20)
#define PING_BYTES 64

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void *sink_serve(void *arg) {
    int fd = (int)(intptr_t)arg;
    uint8_t req[9], ack[8];
    uint8_t *buf = malloc(RAW_CHUNK);
    if (buf && sock_read_all(fd, req, sizeof req)) {
        uint64_t n = get_u64(req + 1), done = 0;
        if (req[0] == 'U') {
            while (done < n) {
                ssize_t r = read(fd, buf, n - done < RAW_CHUNK ? (size_t)(n - done) : RAW_CHUNK);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) break;
                done += (uint64_t)r;
            }
            put_u64(ack, done);
            sock_write_all(fd, ack, sizeof ack);
        } else if (req[0] == 'D') {
            memset(buf, 0xA5, RAW_CHUNK);
            while (done < n) {
                size_t m = n - done < RAW_CHUNK ? (size_t)(n - done) : RAW_CHUNK;
                if (!sock_write_all(fd, buf, m)) break;
                done += m;
            }
        } else if (req[0] == 'P') {
            sock_set_nodelay(fd);
            for (uint64_t i = 0; i < n && sock_read_all(fd, buf, PING_BYTES); i++)
                if (!sock_write_all(fd, buf, PING_BYTES)) break;
        }
    }
    free(buf);
    close(fd);
    return NULL;
}

static int run_sink(const options *o) {
    require(o->listen, "--listen");
    int listener = sock_listen(o->listen);
    fprintf(stderr, "goodput_client sink: listening on %s\n", o->listen);
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("goodput_client sink: accept");
            return 1;
        }
        pthread_t th;
        if (pthread_create(&th, NULL, sink_serve, (void *)(intptr_t)fd) != 0) {
            close(fd);
            continue;
        }
        pthread_detach(th);
    }
}

typedef struct {
    int fd;
    char kind;          // 'U' or 'D'
    uint64_t bytes;
    uint64_t done;      // bytes acknowledged (U) or received (D)
    pthread_barrier_t *start;
} raw_stream;

static void *raw_stream_run(void *arg) {
    raw_stream *s = arg;
    uint8_t req[9], ack[8];
    uint8_t *buf = malloc(RAW_CHUNK);
    req[0] = (uint8_t)s->kind;
    put_u64(req + 1, s->bytes);
    pthread_barrier_wait(s->start);
    if (!buf || !sock_write_all(s->fd, req, sizeof req)) goto out;
    if (s->kind == 'U') {
        memset(buf, 0x5A, RAW_CHUNK);
        for (uint64_t sent = 0; sent < s->bytes;) {
            size_t m = s->bytes - sent < RAW_CHUNK ? (size_t)(s->bytes - sent) : RAW_CHUNK;
            if (!sock_write_all(s->fd, buf, m)) goto out;
            sent += m;
        }
        if (sock_read_all(s->fd, ack, sizeof ack)) s->done = get_u64(ack);
    } else {
        while (s->done < s->bytes) {
            ssize_t r = read(s->fd, buf, RAW_CHUNK);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            s->done += (uint64_t)r;
        }
    }
out:
    free(buf);
    return NULL;
}

static int run_raw(const options *o, char kind) {
    require(o->connect, "--connect");
    uint64_t bytes = payload_bytes(o);
    int n = o->streams;
    raw_stream *s = calloc((size_t)n, sizeof *s);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        s[i].fd = sock_connect(o->connect, 10);
        s[i].kind = kind;
        s[i].bytes = bytes / (uint64_t)n + ((uint64_t)i < bytes % (uint64_t)n);
        s[i].start = &start;
        pthread_create(&th[i], NULL, raw_stream_run, &s[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    uint64_t done = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        done += s[i].done;
        close(s[i].fd);
    }
    double dt = now_s() - t0;
    double g = mbit_per_s((double)done, dt);
    printf("%s raw TCP %s, %d stream(s): %llu of %llu payload bytes in %.3f s: goodput %.2f Mbit/s = %.1f %% of "
           "%.0f Mbit/s\n",
           o->label, kind == 'U' ? "upload" : "download", n, (unsigned long long)done, (unsigned long long)bytes, dt, g,
           100 * g / o->link_mbit, o->link_mbit);
    free(s);
    free(th);
    return done == bytes ? 0 : 1;
}

static int run_ping(const options *o) {
    require(o->connect, "--connect");
    int fd = sock_connect(o->connect, 10);
    sock_set_nodelay(fd);
    uint8_t req[9], msg[PING_BYTES] = {0};
    req[0] = 'P';
    put_u64(req + 1, (uint64_t)o->count);
    if (!sock_write_all(fd, req, sizeof req)) return 1;
    double *rtt_ms = malloc((size_t)o->count * sizeof *rtt_ms);
    for (int i = 0; i < o->count; i++) {
        double t0 = now_s();
        if (!sock_write_all(fd, msg, sizeof msg) || !sock_read_all(fd, msg, sizeof msg)) {
            fprintf(stderr, "goodput_client: error: ping %d: the connection closed\n", i);
            return 1;
        }
        rtt_ms[i] = (now_s() - t0) * 1e3;
    }
    close(fd);
    qsort(rtt_ms, (size_t)o->count, sizeof *rtt_ms, compare_doubles);
    printf("%s ping over %s: %d round trips of %d bytes: RTT min %.2f ms, median %.2f ms, max %.2f ms\n", o->label,
           o->connect, o->count, PING_BYTES, rtt_ms[0], rtt_ms[o->count / 2], rtt_ms[o->count - 1]);
    free(rtt_ms);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    if (strcmp(argv[1], "relay") == 0) return relay_main(argc - 1, argv + 1);
    options o = parse_options(argc - 2, argv + 2);
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);  // a peer that goes away is a failed write, not a dead process
    if (strcmp(argv[1], "transport") == 0) return run_transport(&o);
    if (strcmp(argv[1], "sink") == 0) return run_sink(&o);
    if (strcmp(argv[1], "upload") == 0) return run_raw(&o, 'U');
    if (strcmp(argv[1], "download") == 0) return run_raw(&o, 'D');
    if (strcmp(argv[1], "ping") == 0) return run_ping(&o);
    usage();
}
