// sock.h — the few socket helpers the goodput benchmark's programs share (delay_proxy.c,
// delay_tun.c, goodput_client.c): "host:port" parsing, listening and connecting sockets, a monotonic
// clock. Every function that can fail because of what the user typed (an address, a port
// in use, a peer that is not there) prints one line naming the cause and exits 1.
#ifndef BENCH_DILOCO_SOCK_H
#define BENCH_DILOCO_SOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

// Resolves "host:port" (IPv4 or a name; "[v6]:port" for IPv6) into *addr; exits on error.
void sock_resolve(const char *host_port, struct sockaddr_storage *addr, socklen_t *addr_bytes);
// A listening TCP socket on "host:port" (SO_REUSEADDR); exits on error.
int sock_listen(const char *host_port);
// A connected TCP socket to "host:port", retrying refused connections for up to wait_s
// seconds (the peer may still be starting); exits when it cannot connect.
int sock_connect(const char *host_port, double wait_s);
// TCP_NODELAY on, so that small messages are not held back by Nagle's algorithm.
void sock_set_nodelay(int fd);
void sock_set_nonblocking(int fd);
// Loops until all bytes are written / read; false on error or (for read) a premature EOF.
bool sock_write_all(int fd, const void *buf, size_t bytes);
bool sock_read_all(int fd, void *buf, size_t bytes);
// Monotonic clock.
uint64_t now_ns(void);
double now_s(void);

#endif
