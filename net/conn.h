// net/conn.h — one framed, authenticated connection over a non-blocking socket: the piece the
// hub (net/relay.c) and the replicas (net/transport_tcp.c) share.
//
// Sending queues whole frames (sealed at once: sequence number and tag); a frame's bulk
// bytes can point into a buffer owned elsewhere (a reference-counted blob on the hub, the
// caller's payload on a replica), so a payload forwarded to many peers is never copied.
// Receiving assembles one frame at a time: the header first, checked against the type's
// bound and the set of types this connection accepts *before* any buffer grows, then the
// rest, then the tag and sequence number (wire_parse). A peer can therefore make us hold at
// most one frame of a type we currently accept.
//
// Not thread-safe: one thread reads, and sends are serialised by the caller.
#ifndef TRAIN_GPT_CONN_H
#define TRAIN_GPT_CONN_H

#include "net/wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// A reference-counted byte buffer (single-threaded counts: the hub's event loop).
typedef struct {
    int refs;
    size_t bytes;
    uint8_t *data;
} blob;

// NULL when the memory is not there (the caller refuses the transfer; never fatal).
blob *blob_new(size_t bytes);
blob *blob_ref(blob *b);
void blob_release(blob *b);

typedef struct out_frame out_frame;

typedef struct {
    int fd;
    char peer[96];                      // "addr:port" for messages
    uint8_t key_rx[WIRE_KEY_BYTES], key_tx[WIRE_KEY_BYTES];   // all zero until the handshake ends
    uint64_t seq_rx, seq_tx;
    uint64_t allowed_rx;                // bit t set: frames of type t are accepted
    // receive: one frame being assembled
    uint8_t *in;
    size_t in_cap, in_have, in_need;
    bool in_done;                       // in holds a parsed frame, consumed by the next read
    // send queue
    out_frame *out_head, *out_tail;
    size_t out_frames;
    uint64_t out_bytes;                 // queued and not yet written
    uint64_t bytes_rx, bytes_tx;        // totals, framing included
    double last_rx_s;                   // when the last whole frame arrived
    wire_error rx_error;                // why the last CONN_ERROR read failed, when the bytes did (else WIRE_OK)
} conn;

#define CONN_ALLOW(type) ((uint64_t)1 << (type))

void conn_init(conn *c, int fd, const char *peer);
// Closes the socket and frees the buffers (releasing the blobs queued frames hold).
void conn_close(conn *c);

// Queues one frame: payload (copied) then bulk (not copied: it must stay valid until sent;
// ref, if any, is taken and released when the frame is gone). The frame is sealed now with
// the current key_tx and the next sequence number.
void conn_send(conn *c, unsigned type, const void *payload, size_t payload_bytes, const uint8_t *bulk,
               size_t bulk_bytes, blob *ref);
// Writes what the socket takes now. 1: queue empty, 0: more to write, -1: error (err).
int conn_flush(conn *c, char *err, size_t err_bytes);
// Writes the whole queue, waiting until deadline. false with a reason.
bool conn_flush_until(conn *c, double deadline, char *err, size_t err_bytes);
// Drops every queued frame not yet begun (the one half-written must finish: the stream
// would lose its framing) and gives their sequence numbers back: the next frame sent takes the
// first dropped one's, so the peer still sees contiguous numbers.
void conn_drop_unsent(conn *c);

typedef enum { CONN_FRAME, CONN_AGAIN, CONN_CLOSED, CONN_ERROR } conn_result;

// Reads at most one frame without blocking. CONN_FRAME: *f describes it (payload valid
// until the next read). CONN_CLOSED: the peer closed cleanly between frames. CONN_ERROR:
// err says what was wrong (a bad frame, a truncated one, a socket error).
conn_result conn_read(conn *c, wire_frame *f, char *err, size_t err_bytes);
// The same, waiting until deadline for a whole frame ("timed out" is a CONN_ERROR).
conn_result conn_read_until(conn *c, wire_frame *f, double deadline, char *err, size_t err_bytes);

#ifdef __cplusplus
}
#endif

#endif
