// net/conn.c — framed connections over non-blocking sockets. See net/conn.h.
#include "net/conn.h"

#include "llmc/common.h"
#include "net/socket.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

struct out_frame {
    out_frame *next;
    uint8_t *head;              // header + copied payload
    size_t head_bytes;
    const uint8_t *bulk;
    size_t bulk_bytes;
    blob *ref;
    uint8_t tag[WIRE_TAG_BYTES];
    uint64_t seq;               // its sequence number (sealed into head and tag)
    size_t sent;                // of head_bytes + bulk_bytes + WIRE_TAG_BYTES
};

blob *blob_new(size_t bytes) {
    blob *b = malloc(sizeof *b);
    if (!b) return NULL;
    b->data = malloc(bytes ? bytes : 1);
    if (!b->data) {
        free(b);
        return NULL;
    }
    b->refs = 1;
    b->bytes = bytes;
    return b;
}

blob *blob_ref(blob *b) {
    if (b) b->refs++;
    return b;
}

void blob_release(blob *b) {
    if (b && --b->refs == 0) {
        free(b->data);
        free(b);
    }
}

void conn_init(conn *c, int fd, const char *peer) {
    memset(c, 0, sizeof *c);
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "?");
    c->last_rx_s = wall_seconds();
}

static void free_frame(out_frame *f) {
    blob_release(f->ref);
    free(f->head);
    free(f);
}

void conn_close(conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    for (out_frame *f = c->out_head, *next; f; f = next) {
        next = f->next;
        free_frame(f);
    }
    c->out_head = c->out_tail = NULL;
    c->out_frames = 0;
    c->out_bytes = 0;
    free(c->in);
    c->in = NULL;
    c->in_cap = c->in_have = c->in_need = 0;
    c->in_done = false;
}

void conn_send(conn *c, unsigned type, const void *payload, size_t payload_bytes, const uint8_t *bulk,
               size_t bulk_bytes, blob *ref) {
    out_frame *f = xcalloc(1, sizeof *f);
    f->head_bytes = WIRE_HEADER_BYTES + payload_bytes;
    f->head = xmalloc(f->head_bytes);
    f->seq = c->seq_tx++;
    wire_put_header(f->head, type, f->seq, payload_bytes + bulk_bytes);
    if (payload_bytes) memcpy(f->head + WIRE_HEADER_BYTES, payload, payload_bytes);
    f->bulk = bulk;
    f->bulk_bytes = bulk_bytes;
    f->ref = blob_ref(ref);
    wire_tag(c->key_tx, f->head, f->head_bytes, bulk, bulk_bytes, f->tag);
    if (c->out_tail) c->out_tail->next = f;
    else c->out_head = f;
    c->out_tail = f;
    c->out_frames++;
    c->out_bytes += f->head_bytes + bulk_bytes + WIRE_TAG_BYTES;
}

// The dropped frames were sealed with sequence numbers the peer has not seen: the next frame
// takes the first of them, so the numbers the peer sees stay contiguous (the peer rejects a gap
// as a replayed or reordered frame).
void conn_drop_unsent(conn *c) {
    out_frame *keep = c->out_head && c->out_head->sent > 0 ? c->out_head : NULL;
    out_frame *f = keep ? keep->next : c->out_head;
    if (f) c->seq_tx = f->seq;
    while (f) {
        out_frame *next = f->next;
        c->out_bytes -= f->head_bytes + f->bulk_bytes + WIRE_TAG_BYTES;
        c->out_frames--;
        free_frame(f);
        f = next;
    }
    if (keep) keep->next = NULL;
    c->out_head = c->out_tail = keep;
}

// Gathers up to 16 queued frames into one writev.
int conn_flush(conn *c, char *err, size_t err_bytes) {
    while (c->out_head) {
        struct iovec iov[48];
        int n_iov = 0;
        for (out_frame *f = c->out_head; f && n_iov + 3 <= 48; f = f->next) {
            const uint8_t *part[3] = {f->head, f->bulk, f->tag};
            size_t size[3] = {f->head_bytes, f->bulk_bytes, WIRE_TAG_BYTES};
            size_t skip = f->sent;
            for (int i = 0; i < 3; i++) {
                if (skip >= size[i]) {
                    skip -= size[i];
                    continue;
                }
                iov[n_iov].iov_base = (void *)(part[i] + skip);
                iov[n_iov].iov_len = size[i] - skip;
                n_iov++;
                skip = 0;
            }
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            snprintf(err, err_bytes, "send: %s", strerror(errno));
            return -1;
        }
        size_t left = (size_t)n;
        c->bytes_tx += left;
        c->out_bytes -= left;
        while (left && c->out_head) {
            out_frame *f = c->out_head;
            size_t total = f->head_bytes + f->bulk_bytes + WIRE_TAG_BYTES;
            size_t take = total - f->sent < left ? total - f->sent : left;
            f->sent += take;
            left -= take;
            if (f->sent == total) {
                c->out_head = f->next;
                if (!c->out_head) c->out_tail = NULL;
                c->out_frames--;
                free_frame(f);
            }
        }
    }
    return 1;
}

bool conn_flush_until(conn *c, double deadline, char *err, size_t err_bytes) {
    for (;;) {
        int r = conn_flush(c, err, err_bytes);
        if (r == 1) return true;
        if (r < 0) return false;
        int w = net_wait(c->fd, POLLOUT, deadline);
        if (w == 0) {
            snprintf(err, err_bytes, "send timed out (%llu bytes still queued)", (unsigned long long)c->out_bytes);
            return false;
        }
        if (w < 0) {
            snprintf(err, err_bytes, "poll: %s", strerror(errno));
            return false;
        }
    }
}

static void describe(wire_error e, const wire_frame *f, char *err, size_t err_bytes) {
    uint64_t lo = 0, hi = 0;
    switch (e) {
    case WIRE_TOO_LONG:
        wire_payload_bounds(f->type, &lo, &hi);
        snprintf(err, err_bytes, "%s frame with a payload length of %llu, over its bound of %llu",
                 wire_type_name(f->type), (unsigned long long)f->payload_bytes, (unsigned long long)hi);
        break;
    case WIRE_TOO_SHORT:
        wire_payload_bounds(f->type, &lo, &hi);
        snprintf(err, err_bytes, "%s frame with a payload length of %llu, under its size of %llu",
                 wire_type_name(f->type), (unsigned long long)f->payload_bytes, (unsigned long long)lo);
        break;
    case WIRE_BAD_VERSION:
        snprintf(err, err_bytes, "protocol version %u (this build speaks %d)", f->version, WIRE_VERSION);
        break;
    case WIRE_BAD_TYPE: snprintf(err, err_bytes, "unknown frame type %u", f->type); break;
    case WIRE_BAD_SEQUENCE:
        snprintf(err, err_bytes, "%s: %s frame has sequence number %llu", wire_error_string(e),
                 wire_type_name(f->type), (unsigned long long)f->seq);
        break;
    default: snprintf(err, err_bytes, "%s", wire_error_string(e)); break;
    }
}

static bool grow_input(conn *c, size_t need) {
    if (c->in_cap >= need) return true;
    uint8_t *p = realloc(c->in, need);
    if (!p) return false;
    c->in = p;
    c->in_cap = need;
    return true;
}

conn_result conn_read(conn *c, wire_frame *f, char *err, size_t err_bytes) {
    if (c->in_done) {
        c->in_done = false;
        c->in_have = 0;
    }
    if (c->in_have == 0) c->in_need = WIRE_HEADER_BYTES;
    if (!grow_input(c, WIRE_HEADER_BYTES)) {
        snprintf(err, err_bytes, "out of memory");
        return CONN_ERROR;
    }
    for (;;) {
        while (c->in_have < c->in_need) {
            ssize_t n = recv(c->fd, c->in + c->in_have, c->in_need - c->in_have, 0);
            if (n > 0) {
                c->in_have += (size_t)n;
                c->bytes_rx += (uint64_t)n;
                // Garbage shows in its first bytes: reject it without waiting for more.
                if (c->in_need == WIRE_HEADER_BYTES && c->in_have < WIRE_HEADER_BYTES) {
                    wire_frame partial;
                    if (wire_parse(c->in, c->in_have, c->key_rx, c->seq_rx, &partial) == WIRE_BAD_MAGIC) {
                        c->rx_error = WIRE_BAD_MAGIC;
                        describe(WIRE_BAD_MAGIC, &partial, err, err_bytes);
                        return CONN_ERROR;
                    }
                }
                continue;
            }
            if (n == 0) {
                if (c->in_have == 0) return CONN_CLOSED;
                snprintf(err, err_bytes, "truncated frame: the peer closed after %zu of %zu bytes", c->in_have,
                         c->in_need);
                return CONN_ERROR;
            }
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return CONN_AGAIN;
            snprintf(err, err_bytes, "recv: %s", strerror(errno));
            return CONN_ERROR;
        }
        if (c->in_need == WIRE_HEADER_BYTES) {
            wire_frame h;
            wire_error e = wire_check_header(c->in, &h);
            if (e != WIRE_OK) {
                c->rx_error = e;
                describe(e, &h, err, err_bytes);
                return CONN_ERROR;
            }
            if (!(c->allowed_rx & CONN_ALLOW(h.type))) {
                snprintf(err, err_bytes, "unexpected %s frame at this point of the protocol", wire_type_name(h.type));
                return CONN_ERROR;
            }
            c->in_need = (size_t)h.frame_bytes;
            if (!grow_input(c, c->in_need)) {
                snprintf(err, err_bytes, "out of memory for a %zu-byte frame", c->in_need);
                return CONN_ERROR;
            }
            continue;
        }
        wire_error e = wire_parse(c->in, c->in_have, c->key_rx, c->seq_rx, f);
        if (e != WIRE_OK) {
            c->rx_error = e;
            describe(e, f, err, err_bytes);
            return CONN_ERROR;
        }
        c->seq_rx++;
        c->in_done = true;
        c->last_rx_s = wall_seconds();
        return CONN_FRAME;
    }
}

conn_result conn_read_until(conn *c, wire_frame *f, double deadline, char *err, size_t err_bytes) {
    for (;;) {
        conn_result r = conn_read(c, f, err, err_bytes);
        if (r != CONN_AGAIN) return r;
        int w = net_wait(c->fd, POLLIN, deadline);
        if (w == 0) {
            snprintf(err, err_bytes, "timed out waiting for a frame");
            return CONN_ERROR;
        }
        if (w < 0) {
            snprintf(err, err_bytes, "poll: %s", strerror(errno));
            return CONN_ERROR;
        }
    }
}
