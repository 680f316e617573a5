// net/socket.h — the sockets under the tcp transport: "host:port" addresses, connect with a
// deadline, listen, accept, and exact sends and receives that give up at a deadline.
//
// Every function that can block takes an absolute deadline (wall_seconds()) and waits with
// poll(), so no call can hang on a peer that stopped answering. Sockets are non-blocking
// once created; SIGPIPE never fires (MSG_NOSIGNAL); TCP_NODELAY is on (the control frames
// are small and latency-bound), and so is TCP keepalive (NET_KEEPALIVE_IDLE_S below). Errors
// come back as a one-line reason in a caller's buffer: the caller knows which peer it was and
// says so.
#ifndef TRAIN_GPT_NET_H
#define TRAIN_GPT_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

// Splits "host:port", "[v6addr]:port" or ":port" (host empty: any address). false with a
// reason when malformed.
bool net_split_host_port(const char *address, char *host, size_t host_bytes, char *port, size_t port_bytes,
                         char *err, size_t err_bytes);

// Connects to address, trying every address the name resolves to, until deadline. Returns
// a non-blocking, tuned socket, or -1 with the reason. (Name resolution itself uses the
// system resolver's own timeouts.)
int net_connect(const char *address, double deadline, char *err, size_t err_bytes);

// The socket addresses a "host:port" resolves to (the first NET_MAX_ADDRESSES), looked up once
// for several connections to one peer: a replica's control and data connections to its hub take
// one lookup, not one each (a cluster's login-node resolver may take seconds per lookup).
#define NET_MAX_ADDRESSES 16
typedef struct {
    int family, socktype, protocol;
    socklen_t length;
    struct sockaddr_storage address;
} net_address;
typedef struct {
    int n;
    net_address a[NET_MAX_ADDRESSES];
} net_addresses;

// false with the reason ("cannot resolve 'host': ...") when the name does not resolve.
bool net_resolve(const char *address, net_addresses *out, char *err, size_t err_bytes);
// net_connect over addresses already resolved. The one that answered moves to the front, so
// that the next connection to the same peer tries it first (not, say, an IPv6 address the path
// does not carry, which would cost each connection its share of the deadline first).
int net_connect_to(net_addresses *addresses, double deadline, char *err, size_t err_bytes);

// Listens on address (port 0: an ephemeral port; host empty or "*": every address).
// Returns a non-blocking listening socket, or -1 with the reason.
int net_listen(const char *address, char *err, size_t err_bytes);
// The port a socket is bound to (for port 0), or -1.
int net_local_port(int fd);

// Accepts one pending connection: a non-blocking, tuned socket and the peer's "addr:port",
// or -1 (errno EAGAIN when none is pending).
int net_accept(int listen_fd, char *peer, size_t peer_bytes);

// "1.2.3.4:5678" / "[::1]:5678" of a socket address.
void net_format_address(const struct sockaddr *a, socklen_t length, char *out, size_t out_bytes);

// Sends / receives exactly bytes, waiting with poll() until deadline. false with a reason on
// a timeout, an error, or (recv) the peer closing ("closed after X of Y bytes").
bool net_send_all(int fd, const void *buf, size_t bytes, double deadline, char *err, size_t err_bytes);
bool net_recv_all(int fd, void *buf, size_t bytes, double deadline, char *err, size_t err_bytes);

// Waits until fd is readable (events POLLIN) or writable (POLLOUT) or deadline: 1 ready,
// 0 timed out, -1 error.
int net_wait(int fd, short events, double deadline);

// TCP_NODELAY, TCP keepalive (below), and large socket buffers where the system allows them
// (see net/socket.c).
void net_tune(int fd);

// TCP keepalive on every socket net_connect and net_accept return (and net_listen's, which
// accepted sockets inherit on Linux): after NET_KEEPALIVE_IDLE_S with nothing on the wire the
// kernel sends a probe, then one every NET_KEEPALIVE_INTERVAL_S, and gives the connection up
// after NET_KEEPALIVE_PROBES unanswered ones. A data connection carries nothing for a whole inner
// phase (tens of minutes), and a stateful firewall or NAT between the replicas and the hub
// forgets a flow idle longer than its timeout (5 to 60 minutes are common defaults) and then
// drops its packets silently: the probes keep the flow known to it. Where the system lacks one
// of the three settings (not Linux), its default stands.
#define NET_KEEPALIVE_IDLE_S 60
#define NET_KEEPALIVE_INTERVAL_S 10
#define NET_KEEPALIVE_PROBES 6

#ifdef __cplusplus
}
#endif

#endif
