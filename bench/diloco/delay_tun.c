// delay_tun.c — a packet-level one-way delay for one direction of a veth link, in user space.
//
// Why it exists next to delay_proxy.c: the proxy adds the delay to the bytes an application
// sees, but it terminates TCP, so each TCP connection still runs over a short-RTT hop and
// never needs the ~625 KB of window that 100 Mbit/s x 50 ms RTT asks of a real WAN (nor
// pays slow start at that RTT after an idle period). This program delays IP packets
// instead, so TCP itself sees the long RTT. netem would do this in the kernel; the kernels
// we run on do not have it.
//
// How: it creates a TUN device (--tun) in the current network namespace; goodput.sh routes
// the far side's address into it (`ip route add PEER/32 dev TUN`). Every packet the kernel
// routes there is read, stamped with its arrival time, and sent --delay_ms later out of the
// real interface (--out) through an AF_PACKET socket, addressed to the peer's MAC
// (--peer_mac), so it still passes that interface's qdisc (tbf). Run one instance in each
// namespace to delay both directions. Replies arrive on the real interface as usual (turn
// off rp_filter: they come in on an interface that is not the route back to their source).
//
// What it does not model: jitter and random loss. Its queue (--queue_mb) only drops when
// full, like a router's; the drops are counted and printed at exit. The TUN device has no
// segmentation offload, so TCP sends MTU-sized packets through it (the CPU cost of that is
// part of what is measured; at 100 Mbit/s it is ~8,300 packets per second each way).
//
// Its queue holds up to --queue_mb / 2 KiB packets (8,192 by default: 0.5 s at 100 Mbit/s).
//
// Usage: delay_tun --tun NAME --out IFACE --peer_mac XX:XX:XX:XX:XX:XX [--delay_ms 25]
//                  [--queue_mb 16]
// Runs until SIGINT / SIGTERM.
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <linux/if_tun.h>
#include <arpa/inet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define TUN_MTU 1500               // set on the device, so that every packet fits a slot
#define SLOT_BYTES 2048

// One delayed packet.
typedef struct {
    uint64_t due_ns;
    uint32_t bytes;
    uint8_t data[SLOT_BYTES];
} queued_packet;

// A FIFO of delayed packets (all have the same delay, so arrival order is departure order).
typedef struct {
    queued_packet *slots;
    size_t cap, first, count;
    uint64_t delayed, dropped_full, dropped_send;
} packet_queue;

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static void die(const char *what, const char *detail) {
    fprintf(stderr, "delay_tun: error: %s: %s\n", what, detail);
    exit(1);
}

// Creates the TUN device (no packet-info header) and brings it up.
static int tun_open(const char *name) {
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) die("cannot open /dev/net/tun (modprobe tun; run as root)", strerror(errno));
    struct ifreq ifr = {0};
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("cannot create the TUN device", strerror(errno));
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifr.ifr_mtu = TUN_MTU;
    if (ioctl(s, SIOCSIFMTU, &ifr) != 0) die("cannot set the TUN device's MTU", strerror(errno));
    if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) die("cannot read the TUN device's flags", strerror(errno));
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) die("cannot bring the TUN device up", strerror(errno));
    close(s);
    sock_set_nonblocking(fd);
    return fd;
}

static void parse_mac(const char *text, uint8_t mac[6]) {
    unsigned v[6];
    if (sscanf(text, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
        die("--peer_mac: expected XX:XX:XX:XX:XX:XX", text);
    for (int i = 0; i < 6; i++) mac[i] = (uint8_t)v[i];
}

// An AF_PACKET socket that sends IPv4 packets out of `iface` to `mac` (the kernel writes the
// Ethernet header), through the interface's qdisc.
static int packet_open(const char *iface, const uint8_t mac[6], struct sockaddr_ll *to) {
    int fd = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_IP));
    if (fd < 0) die("cannot open an AF_PACKET socket (run as root)", strerror(errno));
    unsigned index = if_nametoindex(iface);
    if (!index) die("--out: no such interface", iface);
    memset(to, 0, sizeof *to);
    to->sll_family = AF_PACKET;
    to->sll_protocol = htons(ETH_P_IP);
    to->sll_ifindex = (int)index;
    to->sll_halen = 6;
    memcpy(to->sll_addr, mac, 6);
    // The qdisc (tbf, up to its limit) should be where packets queue, not this socket.
    int bytes = 16 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    sock_set_nonblocking(fd);
    return fd;
}

static queued_packet *queue_front(packet_queue *q) { return q->count ? &q->slots[q->first] : NULL; }

static void queue_pop(packet_queue *q) {
    q->first = (q->first + 1) % q->cap;
    q->count--;
}

// Reads every packet the TUN device holds into the queue (a full queue drops, like a router).
static void read_packets(int tun, packet_queue *q, uint64_t delay_ns) {
    static queued_packet scratch;
    for (;;) {
        queued_packet *p = q->count < q->cap ? &q->slots[(q->first + q->count) % q->cap] : &scratch;
        ssize_t r = read(tun, p->data, SLOT_BYTES);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        if (p == &scratch) {
            q->dropped_full++;
            continue;
        }
        p->bytes = (uint32_t)r;
        p->due_ns = now_ns() + delay_ns;
        q->count++;
        q->delayed++;
    }
}

// Sends every packet that is due; stops early when the socket is full (the qdisc is backed up).
static void send_due(int out, const struct sockaddr_ll *to, packet_queue *q, uint64_t now) {
    queued_packet *h;
    while ((h = queue_front(q)) && h->due_ns <= now) {
        ssize_t w = sendto(out, h->data, h->bytes, 0, (const struct sockaddr *)to, sizeof *to);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (w < 0) q->dropped_send++;   // ENOBUFS: the qdisc dropped it, as a router would
        queue_pop(q);
    }
}

static void usage(void) {
    fprintf(stderr, "usage: delay_tun --tun NAME --out IFACE --peer_mac XX:XX:XX:XX:XX:XX [--delay_ms 25] "
                    "[--queue_mb 16]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *tun_name = NULL, *out_name = NULL, *mac_text = NULL;
    double delay_ms = 25, queue_mb = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--tun") == 0) tun_name = v;
        else if (strcmp(k, "--out") == 0) out_name = v;
        else if (strcmp(k, "--peer_mac") == 0) mac_text = v;
        else if (strcmp(k, "--delay_ms") == 0) delay_ms = atof(v);
        else if (strcmp(k, "--queue_mb") == 0) queue_mb = atof(v);
        else usage();
    }
    if (argc % 2 == 0 || !tun_name || !out_name || !mac_text) usage();
    if (delay_ms < 0 || delay_ms > 10000) die("--delay_ms out of range (0 .. 10000)", "");
    if (queue_mb < 1 || queue_mb > 1024) die("--queue_mb out of range (1 .. 1024)", "");
    uint8_t mac[6];
    parse_mac(mac_text, mac);
    struct sockaddr_ll to;
    int out = packet_open(out_name, mac, &to);
    int tun = tun_open(tun_name);
    packet_queue q = {0};
    q.cap = (size_t)(queue_mb * 1048576) / sizeof(queued_packet);
    q.slots = malloc(q.cap * sizeof *q.slots);
    if (!q.slots) die("out of memory for the queue", "");
    uint64_t delay_ns = (uint64_t)(delay_ms * 1e6);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fprintf(stderr, "delay_tun: %s -> %s (to %s), %.1f ms, queue %.0f MiB\n", tun_name, out_name, mac_text, delay_ms,
            queue_mb);
    while (!stop_requested) {
        uint64_t now = now_ns();
        send_due(out, &to, &q, now);
        queued_packet *h = queue_front(&q);
        struct pollfd fds[2] = {{tun, POLLIN, 0}, {out, 0, 0}};
        struct timespec ts, *timeout = NULL;
        if (h && h->due_ns <= now) {
            fds[1].events = POLLOUT;   // due but the socket was full
        } else if (h) {
            uint64_t wait = h->due_ns - now;
            ts.tv_sec = (time_t)(wait / 1000000000ull);
            ts.tv_nsec = (long)(wait % 1000000000ull);
            timeout = &ts;
        }
        int rc = ppoll(fds, 2, timeout, NULL);
        if (rc < 0 && errno != EINTR) die("poll", strerror(errno));
        if (rc > 0 && (fds[0].revents & POLLIN)) read_packets(tun, &q, delay_ns);
    }
    fprintf(stderr, "delay_tun: %s: %llu packets delayed, %llu dropped (queue full), %llu dropped by the qdisc\n",
            tun_name, (unsigned long long)q.delayed, (unsigned long long)q.dropped_full,
            (unsigned long long)q.dropped_send);
    return 0;
}
