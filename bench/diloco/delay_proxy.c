// delay_proxy.c — a TCP proxy that adds a fixed one-way delay to every byte, both ways.
//
// Why it exists: the goodput benchmark (bench/diloco/goodput.sh) must show the transport on
// a WAN-like link: 100 Mbit/s and ~25 ms one way. tbf gives the rate, but the usual way to
// add the delay, `tc qdisc ... netem delay 25ms`, is not available in the kernel of the
// machines we run on (sch_netem is not built; neither is sch_fq, which a BPF program could
// otherwise use to delay packets). So the delay is added here, in user space: the proxy
// accepts connections on --listen, opens one connection to --target for each, and forwards
// bytes both ways; every read is stamped with its arrival time and its bytes are written
// out once now >= stamp + delay. Nothing is reordered, dropped or merged across
// connections; the FIN of each direction is delayed like the bytes before it.
//
// What it models: the latency a protocol sees end to end — every request / response, every
// round's barrier, every store-and-forward hop pays 2 x delay of round trip, as over a WAN.
//
// What it does not model:
//   - TCP's own control loop over the long path. The proxy terminates TCP: the sender's
//     connection ends at the proxy, so its congestion window and socket buffers see the
//     short RTT of its own hop, not the 2 x delay of the path. On a real 50 ms RTT link each
//     connection needs about rate x RTT (625 KB at 100 Mbit/s) of window; here it does not.
//   - Loss and jitter: the delay is fixed, nothing is dropped.
//   - The buffer: up to --buffer_mb per direction per connection waits in the proxy, like a
//     deep router queue (bufferbloat) rather than a shallow one. When it is full the proxy
//     stops reading, so the sender is slowed by TCP flow control, never by a drop.
//
// Throughput: one process, one poll loop, nonblocking sockets, one ring buffer per direction.
// A direction can carry at most buffer / delay (4 MiB / 25 ms = 1.3 Gbit/s by default);
// beyond that the proxy itself would throttle. Timing resolution: reads that arrive within
// 50 us of each other share one stamp (their bytes may leave up to 50 us early).
//
// Usage: delay_proxy --listen HOST:PORT --target HOST:PORT [--delay_ms 25] [--buffer_mb 4]
//                    [--quiet]
// Runs until SIGINT / SIGTERM; logs each connection's open and close (bytes each way) on
// stderr unless --quiet.
#include "sock.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MERGE_NS 50000ull         // reads closer than this share a stamp
#define STAMPS_PER_LINE 65536     // bounds the stamp queue; full: stop reading, like a full ring

// When the bytes up to stream offset `end` may leave.
typedef struct {
    uint64_t end;
    uint64_t due_ns;
} stamp;

// One direction of one connection: bytes read from `from`, held until due, written to `to`.
typedef struct {
    int from, to;
    uint8_t *ring;
    size_t cap;
    uint64_t in, out;            // bytes read from `from` / written to `to`, since the start
    stamp *stamps;               // circular, STAMPS_PER_LINE
    size_t first, count;
    bool eof;                    // `from` sent its FIN ...
    uint64_t eof_due_ns;         // ... which may be passed on at this time
    bool shut;                   // FIN passed on to `to`
} delay_line;

typedef struct {
    int client, target;
    bool connecting;             // the connection to the target is not established yet
    delay_line up, down;         // client -> target, target -> client
    int id;
    double opened_s;
} proxied_conn;

typedef struct {
    uint64_t delay_ns;
    size_t buffer_bytes;
    bool quiet;
} proxy_config;

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static void line_init(delay_line *l, int from, int to, size_t cap) {
    memset(l, 0, sizeof *l);
    l->from = from;
    l->to = to;
    l->cap = cap;
    l->ring = malloc(cap);
    l->stamps = malloc(STAMPS_PER_LINE * sizeof *l->stamps);
    if (!l->ring || !l->stamps) {
        fprintf(stderr, "delay_proxy: error: out of memory for a %zu-byte buffer\n", cap);
        exit(1);
    }
}

static void line_free(delay_line *l) {
    free(l->ring);
    free(l->stamps);
}

static bool line_can_read(const delay_line *l) {
    return !l->eof && l->in - l->out < l->cap && l->count < STAMPS_PER_LINE;
}

// Bytes that are due (stamp + delay <= now) and not yet written; drops spent stamps.
static uint64_t line_due_bytes(delay_line *l, uint64_t now) {
    while (l->count > 0 && l->stamps[l->first].end <= l->out) {
        l->first = (l->first + 1) % STAMPS_PER_LINE;
        l->count--;
    }
    uint64_t due_end = l->out;
    for (size_t i = 0; i < l->count; i++) {
        const stamp *s = &l->stamps[(l->first + i) % STAMPS_PER_LINE];
        if (s->due_ns > now) break;
        due_end = s->end;
    }
    return due_end - l->out;
}

// When this line next needs attention without any socket event (UINT64_MAX: not before one).
static uint64_t line_next_due(delay_line *l, uint64_t now) {
    if (line_due_bytes(l, now) > 0) return UINT64_MAX;  // waiting for POLLOUT, not for time
    if (l->count > 0) return l->stamps[l->first].due_ns;
    if (l->eof && !l->shut) return l->eof_due_ns;
    return UINT64_MAX;
}

// Reads what `from` has into the ring. false: the connection failed (reset).
static bool line_read(delay_line *l, uint64_t now, uint64_t delay_ns) {
    while (line_can_read(l)) {
        size_t at = (size_t)(l->in % l->cap);
        size_t room = l->cap - (size_t)(l->in - l->out);
        size_t contiguous = l->cap - at < room ? l->cap - at : room;
        ssize_t r = read(l->from, l->ring + at, contiguous);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
        if (r == 0) {
            l->eof = true;
            l->eof_due_ns = now + delay_ns;
            return true;
        }
        l->in += (uint64_t)r;
        uint64_t due = now + delay_ns;
        stamp *last = l->count ? &l->stamps[(l->first + l->count - 1) % STAMPS_PER_LINE] : NULL;
        if (last && due - last->due_ns <= MERGE_NS) {
            last->end = l->in;
        } else {
            l->stamps[(l->first + l->count) % STAMPS_PER_LINE] = (stamp){l->in, due};
            l->count++;
        }
        if ((size_t)r < contiguous) return true;  // drained the socket for now
    }
    return true;
}

// Writes the due bytes to `to`, and the FIN once it is due. false: the connection failed.
static bool line_write(delay_line *l, uint64_t now) {
    for (;;) {
        uint64_t due = line_due_bytes(l, now);
        if (due == 0) break;
        size_t at = (size_t)(l->out % l->cap);
        size_t n = l->cap - at < due ? l->cap - at : (size_t)due;
        ssize_t w = write(l->to, l->ring + at, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
        l->out += (uint64_t)w;
        if ((size_t)w < n) return true;  // the socket buffer is full
    }
    if (l->eof && !l->shut && l->out == l->in && now >= l->eof_due_ns) {
        shutdown(l->to, SHUT_WR);
        l->shut = true;
    }
    return true;
}

static short client_events(const proxied_conn *c, uint64_t now) {
    short ev = 0;
    if (line_can_read(&c->up)) ev |= POLLIN;
    if (!c->connecting && line_due_bytes((delay_line *)&c->down, now) > 0) ev |= POLLOUT;
    return ev;
}

static short target_events(const proxied_conn *c, uint64_t now) {
    if (c->connecting) return POLLOUT;
    short ev = 0;
    if (line_can_read(&c->down)) ev |= POLLIN;
    if (line_due_bytes((delay_line *)&c->up, now) > 0) ev |= POLLOUT;
    return ev;
}

static void conn_close(proxied_conn *c, const proxy_config *cfg, const char *why) {
    if (!cfg->quiet)
        fprintf(stderr, "delay_proxy: connection %d closed (%s) after %.2f s: %llu bytes up, %llu bytes down\n",
                c->id, why, now_s() - c->opened_s, (unsigned long long)c->up.out,
                (unsigned long long)c->down.out);
    close(c->client);
    close(c->target);
    line_free(&c->up);
    line_free(&c->down);
}

// Starts a nonblocking connect to the target for a freshly accepted client.
static bool conn_open(proxied_conn *c, int client, const struct sockaddr_storage *target, socklen_t target_bytes,
                      const proxy_config *cfg, int id) {
    int t = socket(target->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (t < 0) return false;
    int rc = connect(t, (const struct sockaddr *)target, target_bytes);
    if (rc != 0 && errno != EINPROGRESS) {
        fprintf(stderr, "delay_proxy: connection %d: cannot connect to the target: %s\n", id, strerror(errno));
        close(t);
        return false;
    }
    sock_set_nonblocking(client);
    sock_set_nodelay(client);
    sock_set_nodelay(t);
    c->client = client;
    c->target = t;
    c->connecting = rc != 0;
    c->id = id;
    c->opened_s = now_s();
    line_init(&c->up, client, t, cfg->buffer_bytes);
    line_init(&c->down, t, client, cfg->buffer_bytes);
    return true;
}

// Handles one connection's poll results; false when it is finished (closed).
static bool conn_service(proxied_conn *c, short client_rev, short target_rev, const proxy_config *cfg) {
    uint64_t now = now_ns();
    if (c->connecting && target_rev) {
        int err = 0;
        socklen_t n = sizeof err;
        getsockopt(c->target, SOL_SOCKET, SO_ERROR, &err, &n);
        if (err) {
            fprintf(stderr, "delay_proxy: connection %d: cannot connect to the target: %s\n", c->id, strerror(err));
            conn_close(c, cfg, "target unreachable");
            return false;
        }
        c->connecting = false;
        if (!cfg->quiet) fprintf(stderr, "delay_proxy: connection %d open\n", c->id);
    }
    bool ok = true;
    if (client_rev & (POLLIN | POLLHUP | POLLERR)) ok = ok && line_read(&c->up, now, cfg->delay_ns);
    if (!c->connecting && (target_rev & (POLLIN | POLLHUP | POLLERR)))
        ok = ok && line_read(&c->down, now, cfg->delay_ns);
    if (!c->connecting) ok = ok && line_write(&c->up, now) && line_write(&c->down, now);
    if (!ok) {
        conn_close(c, cfg, strerror(errno));
        return false;
    }
    if (c->up.shut && c->down.shut) {
        conn_close(c, cfg, "both sides finished");
        return false;
    }
    return true;
}

static void usage(void) {
    fprintf(stderr,
            "usage: delay_proxy --listen HOST:PORT --target HOST:PORT [--delay_ms 25] [--buffer_mb 4] [--quiet]\n"
            "  Forwards every connection to --target, delaying the bytes of each direction by --delay_ms.\n");
    exit(2);
}

static void run_proxy(int listener, const char *target_addr, const proxy_config *cfg) {
    struct sockaddr_storage target;
    socklen_t target_bytes;
    sock_resolve(target_addr, &target, &target_bytes);
    sock_set_nonblocking(listener);
    proxied_conn *conns = NULL;
    struct pollfd *fds = NULL;
    size_t n = 0, cap = 0;
    int next_id = 0;
    while (!stop_requested) {
        uint64_t now = now_ns(), wake = UINT64_MAX;
        if (cap < 1 + 2 * n) {
            cap = 2 * (1 + 2 * n);
            fds = realloc(fds, cap * sizeof *fds);
            if (!fds) exit(1);
        }
        fds[0] = (struct pollfd){listener, POLLIN, 0};
        for (size_t i = 0; i < n; i++) {
            fds[1 + 2 * i] = (struct pollfd){conns[i].client, client_events(&conns[i], now), 0};
            fds[2 + 2 * i] = (struct pollfd){conns[i].target, target_events(&conns[i], now), 0};
            uint64_t a = line_next_due(&conns[i].up, now), b = line_next_due(&conns[i].down, now);
            if (a < wake) wake = a;
            if (b < wake) wake = b;
        }
        struct timespec ts, *timeout = NULL;
        if (wake != UINT64_MAX) {
            uint64_t wait = wake > now ? wake - now : 0;
            ts.tv_sec = (time_t)(wait / 1000000000ull);
            ts.tv_nsec = (long)(wait % 1000000000ull);
            timeout = &ts;
        }
        int rc = ppoll(fds, 1 + 2 * n, timeout, NULL);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) {
            perror("delay_proxy: poll");
            exit(1);
        }
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (conn_service(&conns[i], fds[1 + 2 * i].revents, fds[2 + 2 * i].revents, cfg)) conns[kept++] = conns[i];
        }
        n = kept;
        if (fds[0].revents & POLLIN) {
            int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
            if (client < 0) continue;
            conns = realloc(conns, (n + 1) * sizeof *conns);
            if (!conns) exit(1);
            if (conn_open(&conns[n], client, &target, target_bytes, cfg, next_id++)) n++;
            else close(client);
        }
    }
    for (size_t i = 0; i < n; i++) conn_close(&conns[i], cfg, "proxy stopped");
    free(conns);
    free(fds);
}

int main(int argc, char **argv) {
    const char *listen_addr = NULL, *target_addr = NULL;
    double delay_ms = 25, buffer_mb = 4;
    proxy_config cfg = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quiet") == 0) { cfg.quiet = true; continue; }
        if (!v) usage();
        if (strcmp(a, "--listen") == 0) listen_addr = v;
        else if (strcmp(a, "--target") == 0) target_addr = v;
        else if (strcmp(a, "--delay_ms") == 0) delay_ms = atof(v);
        else if (strcmp(a, "--buffer_mb") == 0) buffer_mb = atof(v);
        else usage();
        i++;
    }
    if (!listen_addr || !target_addr) usage();
    if (delay_ms < 0 || delay_ms > 10000) {
        fprintf(stderr, "delay_proxy: error: --delay_ms %g is out of range (0 .. 10000)\n", delay_ms);
        return 1;
    }
    if (buffer_mb < 0.0625 || buffer_mb > 1024) {
        fprintf(stderr, "delay_proxy: error: --buffer_mb %g is out of range (0.0625 .. 1024)\n", buffer_mb);
        return 1;
    }
    cfg.delay_ns = (uint64_t)(delay_ms * 1e6);
    cfg.buffer_bytes = (size_t)(buffer_mb * 1048576);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int listener = sock_listen(listen_addr);
    fprintf(stderr,
            "delay_proxy: %s -> %s, %.1f ms one way each direction, %.1f MiB buffer per direction "
            "(caps a connection at %.0f Mbit/s)\n",
            listen_addr, target_addr, delay_ms, buffer_mb,
            delay_ms > 0 ? (double)cfg.buffer_bytes * 8 / (delay_ms * 1e-3) / 1e6 : 1e9);
    run_proxy(listener, target_addr, &cfg);
    close(listener);
    return 0;
}
