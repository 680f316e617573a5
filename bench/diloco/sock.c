// sock.c — see sock.h.
#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what, const char *host_port, const char *why) {
    fprintf(stderr, "error: %s %s: %s\n", what, host_port, why);
    exit(1);
}

void sock_resolve(const char *host_port, struct sockaddr_storage *addr, socklen_t *addr_bytes) {
    char host[256];
    const char *colon = strrchr(host_port, ':');
    if (!colon || colon == host_port || (size_t)(colon - host_port) >= sizeof host || !colon[1])
        die("address", host_port, "expected HOST:PORT");
    const char *h = host_port;
    size_t n = (size_t)(colon - host_port);
    if (h[0] == '[' && h[n - 1] == ']') h++, n -= 2;
    memcpy(host, h, n);
    host[n] = 0;
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) die("cannot resolve", host_port, gai_strerror(rc));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *addr_bytes = res->ai_addrlen;
    freeaddrinfo(res);
}

int sock_listen(const char *host_port) {
    struct sockaddr_storage a;
    socklen_t n;
    sock_resolve(host_port, &a, &n);
    int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket for", host_port, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, n) != 0) die("cannot bind", host_port, strerror(errno));
    if (listen(fd, 128) != 0) die("cannot listen on", host_port, strerror(errno));
    return fd;
}

int sock_connect(const char *host_port, double wait_s) {
    struct sockaddr_storage a;
    socklen_t n;
    sock_resolve(host_port, &a, &n);
    double deadline = now_s() + wait_s;
    for (;;) {
        int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket for", host_port, strerror(errno));
        if (connect(fd, (struct sockaddr *)&a, n) == 0) return fd;
        int e = errno;
        close(fd);
        if ((e != ECONNREFUSED && e != ENETUNREACH && e != EHOSTUNREACH) || now_s() > deadline)
            die("cannot connect to", host_port, strerror(e));
        usleep(50 * 1000);
    }
}

void sock_set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void sock_set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

bool sock_write_all(int fd, const void *buf, size_t bytes) {
    const uint8_t *p = buf;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        bytes -= (size_t)w;
    }
    return true;
}

bool sock_read_all(int fd, void *buf, size_t bytes) {
    uint8_t *p = buf;
    while (bytes > 0) {
        ssize_t r = read(fd, p, bytes);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        bytes -= (size_t)r;
    }
    return true;
}

uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double now_s(void) { return (double)now_ns() * 1e-9; }
