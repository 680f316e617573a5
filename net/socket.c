// net/socket.c — sockets with deadlines. See net/socket.h.
#include "net/socket.h"

#include "llmc/common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool net_split_host_port(const char *address, char *host, size_t host_bytes, char *port, size_t port_bytes,
                         char *err, size_t err_bytes) {
    const char *colon;
    const char *h = address;
    size_t h_len;
    if (address[0] == '[') {
        const char *close = strchr(address, ']');
        if (!close || close[1] != ':') {
            snprintf(err, err_bytes, "'%s': expected [IPv6]:port", address);
            return false;
        }
        h = address + 1;
        h_len = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(address, ':');
        if (!colon) {
            snprintf(err, err_bytes, "'%s': expected host:port", address);
            return false;
        }
        if (strchr(address, ':') != colon) {
            snprintf(err, err_bytes, "'%s': an IPv6 address needs brackets: [addr]:port", address);
            return false;
        }
        h_len = (size_t)(colon - address);
    }
    const char *p = colon + 1;
    char *end = NULL;
    long value = strtol(p, &end, 10);
    if (!*p || *end || value < 0 || value > 65535) {
        snprintf(err, err_bytes, "'%s': the port must be a number from 0 to 65535", address);
        return false;
    }
    if (h_len + 1 > host_bytes || strlen(p) + 1 > port_bytes) {
        snprintf(err, err_bytes, "'%s': address too long", address);
        return false;
    }
    memcpy(host, h, h_len);
    host[h_len] = '\0';
    snprintf(port, port_bytes, "%s", p);
    return true;
}

void net_format_address(const struct sockaddr *a, socklen_t length, char *out, size_t out_bytes) {
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getnameinfo(a, length, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, out_bytes, "(unknown address)");
        return;
    }
    if (a->sa_family == AF_INET6) snprintf(out, out_bytes, "[%s]:%s", host, port);
    else snprintf(out, out_bytes, "%s:%s", host, port);
}

static bool set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL, 0);
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

static long read_proc_long(const char *path, int field) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    for (int i = 0; i <= field; i++)
        if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

// Setting SO_RCVBUF/SO_SNDBUF switches Linux's buffer autotuning off for the socket, and the
// kernel caps the value at net.core.[rw]mem_max (often 208 KiB): setting it blindly would
// shrink the window on exactly the long fat links the streams are for. So a size is set
// only where the administrator's cap lets it exceed what autotuning would reach
// (net.ipv4.tcp_[rw]mem's maximum); otherwise autotuning stays in charge.
static void set_buffer(int fd, int option, const char *core_max_path, const char *tcp_mem_path) {
    const long wanted = 64L << 20;
    long cap = read_proc_long(core_max_path, 0);
    long autotune_max = read_proc_long(tcp_mem_path, 2);
    if (cap <= 0 || autotune_max <= 0) return;
    long size = cap < wanted ? cap : wanted;
    if (size <= autotune_max) return;
    int v = (int)size;
    (void)setsockopt(fd, SOL_SOCKET, option, &v, sizeof v);
}

// Keepalive probes (net/socket.h says why): without them a data connection idle over a long
// inner phase is forgotten by a firewall or NAT on the path, the next exchange's segments are
// dropped silently, and the hub evicts the replica at every outer step. 60 s is well below the
// idle timeouts of common middleboxes (cloud NAT gateways 350 s and more, enterprise firewalls
// an hour) and costs one 40-byte packet a minute per connection. A flow gone for good is then
// given up 60 + 6 × 10 s after its last packet instead of stalling the next exchange. The kernel
// answers probes, so a replica stopped (SIGSTOP) or deep in a step does not lose its sockets.
static void set_keepalive(int fd) {
    int on = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
#ifdef TCP_KEEPIDLE
    int idle_s = NET_KEEPALIVE_IDLE_S;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
#endif
#ifdef TCP_KEEPINTVL
    int interval_s = NET_KEEPALIVE_INTERVAL_S;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
#endif
#ifdef TCP_KEEPCNT
    int probes = NET_KEEPALIVE_PROBES;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
#endif
}

void net_tune(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_keepalive(fd);
    set_buffer(fd, SO_RCVBUF, "/proc/sys/net/core/rmem_max", "/proc/sys/net/ipv4/tcp_rmem");
    set_buffer(fd, SO_SNDBUF, "/proc/sys/net/core/wmem_max", "/proc/sys/net/ipv4/tcp_wmem");
}

int net_wait(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - wall_seconds();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

static int connect_one(int family, int socktype, int protocol, const struct sockaddr *address, socklen_t length,
                       double deadline, char *err, size_t err_bytes) {
    int fd = socket(family, socktype | SOCK_CLOEXEC, protocol);
    if (fd < 0) {
        snprintf(err, err_bytes, "socket: %s", strerror(errno));
        return -1;
    }
    if (!set_nonblocking(fd)) {
        snprintf(err, err_bytes, "fcntl: %s", strerror(errno));
        close(fd);
        return -1;
    }
    net_tune(fd);   // before connect: the window scale is negotiated in the SYN
    if (connect(fd, address, length) != 0) {
        if (errno != EINPROGRESS) {
            snprintf(err, err_bytes, "%s", strerror(errno));
            close(fd);
            return -1;
        }
        int r = net_wait(fd, POLLOUT, deadline);
        if (r <= 0) {
            snprintf(err, err_bytes, "%s", r == 0 ? "connection timed out" : strerror(errno));
            close(fd);
            return -1;
        }
        int so_error = 0;
        socklen_t len = sizeof so_error;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0) {
            snprintf(err, err_bytes, "%s", strerror(so_error ? so_error : errno));
            close(fd);
            return -1;
        }
    }
    return fd;
}

bool net_resolve(const char *address, net_addresses *out, char *err, size_t err_bytes) {
    char host[256], port[16];
    out->n = 0;
    if (!net_split_host_port(address, host, sizeof host, port, sizeof port, err, err_bytes)) return false;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *list = NULL;
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &list);
    if (rc != 0) {
        snprintf(err, err_bytes, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return false;
    }
    for (struct addrinfo *ai = list; ai && out->n < NET_MAX_ADDRESSES; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof out->a[0].address) continue;
        out->a[out->n].family = ai->ai_family;
        out->a[out->n].socktype = ai->ai_socktype;
        out->a[out->n].protocol = ai->ai_protocol;
        out->a[out->n].length = ai->ai_addrlen;
        memcpy(&out->a[out->n].address, ai->ai_addr, ai->ai_addrlen);
        out->n++;
    }
    freeaddrinfo(list);
    if (out->n == 0) {
        snprintf(err, err_bytes, "cannot resolve '%s': no usable address", host);
        return false;
    }
    return true;
}

int net_connect_to(net_addresses *addresses, double deadline, char *err, size_t err_bytes) {
    // Each address gets its share of the time left (at least 2 s), so that one that never
    // answers does not starve the others.
    int fd = -1, i = 0;
    if (addresses->n == 0) snprintf(err, err_bytes, "no address to connect to");
    for (; i < addresses->n && fd < 0; i++) {
        int left = addresses->n - i;
        double now = wall_seconds(), share = (deadline - now) / left;
        double until = left == 1 ? deadline : now + (share > 2.0 ? share : 2.0);
        fd = connect_one(addresses->a[i].family, addresses->a[i].socktype, addresses->a[i].protocol,
                         (const struct sockaddr *)&addresses->a[i].address, addresses->a[i].length,
                         until < deadline ? until : deadline, err, err_bytes);
    }
    if (fd >= 0 && i > 1) {   // the one that answered (i - 1) goes first
        net_address answered = addresses->a[i - 1];
        memmove(&addresses->a[1], &addresses->a[0], (size_t)(i - 1) * sizeof addresses->a[0]);
        addresses->a[0] = answered;
    }
    return fd;
}

int net_connect(const char *address, double deadline, char *err, size_t err_bytes) {
    net_addresses addresses;
    if (!net_resolve(address, &addresses, err, err_bytes)) return -1;
    return net_connect_to(&addresses, deadline, err, err_bytes);
}

int net_listen(const char *address, char *err, size_t err_bytes) {
    char host[256], port[16];
    if (!net_split_host_port(address, host, sizeof host, port, sizeof port, err, err_bytes)) return -1;
    bool any = host[0] == '\0' || strcmp(host, "*") == 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *list = NULL;
    int rc = getaddrinfo(any ? NULL : host, port, &hints, &list);
    if (rc != 0) {
        snprintf(err, err_bytes, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    // With no host, prefer the IPv6 wildcard (it takes IPv4 too unless the system says
    // otherwise); else the first address that binds.
    int fd = -1;
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
            if (any && pass == 0 && ai->ai_family != AF_INET6) continue;
            int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (s < 0) {
                snprintf(err, err_bytes, "socket: %s", strerror(errno));
                continue;
            }
            int one = 1;
            (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (ai->ai_family == AF_INET6 && any) {
                int zero = 0;
                (void)setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            }
            net_tune(s);   // accepted sockets inherit the buffer sizes
            if (bind(s, ai->ai_addr, ai->ai_addrlen) != 0 || listen(s, 128) != 0 || !set_nonblocking(s)) {
                snprintf(err, err_bytes, "cannot listen on %s: %s", address, strerror(errno));
                close(s);
                continue;
            }
            fd = s;
        }
    }
    freeaddrinfo(list);
    if (fd < 0 && !err[0]) snprintf(err, err_bytes, "cannot listen on %s: no usable address", address);
    return fd;
}

int net_local_port(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) return -1;
    if (a.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}

int net_accept(int listen_fd, char *peer, size_t peer_bytes) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    int fd = accept4(listen_fd, (struct sockaddr *)&a, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return -1;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_keepalive(fd);   // Linux copies the listener's, but not every system does
    net_format_address((struct sockaddr *)&a, len, peer, peer_bytes);
    return fd;
}

bool net_send_all(int fd, const void *buf, size_t bytes, double deadline, char *err, size_t err_bytes) {
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = send(fd, p + done, bytes - done, MSG_NOSIGNAL);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = net_wait(fd, POLLOUT, deadline);
            if (r == 0) {
                snprintf(err, err_bytes, "send timed out after %zu of %zu bytes", done, bytes);
                return false;
            }
            if (r < 0) {
                snprintf(err, err_bytes, "poll: %s", strerror(errno));
                return false;
            }
            continue;
        }
        snprintf(err, err_bytes, "send: %s", n < 0 ? strerror(errno) : "no progress");
        return false;
    }
    return true;
}

bool net_recv_all(int fd, void *buf, size_t bytes, double deadline, char *err, size_t err_bytes) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < bytes) {
        ssize_t n = recv(fd, p + done, bytes - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0) {
            snprintf(err, err_bytes, "connection closed after %zu of %zu bytes", done, bytes);
            return false;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int r = net_wait(fd, POLLIN, deadline);
            if (r == 0) {
                snprintf(err, err_bytes, "receive timed out after %zu of %zu bytes", done, bytes);
                return false;
            }
            if (r < 0) {
                snprintf(err, err_bytes, "poll: %s", strerror(errno));
                return false;
            }
            continue;
        }
        snprintf(err, err_bytes, "recv: %s", strerror(errno));
        return false;
    }
    return true;
}
