// net/relay.h — the hub of the tcp transport: `train_gpt relay` on a login or gateway node, or a
// thread inside one replica (transport_options.serve). Protocol and state machine:
// docs/protocol.md.
//
// The hub keeps the membership (heartbeats, evictions, joins at outer boundaries, the quorum a
// new group waits for) and reduces: it decodes each replica's payload segment by segment as
// it arrives (llmc/quant.h), sums the contributors' segment in fp32 in ascending replica id,
// divides, encodes the mean in the downlink codec (with the replicas' diloco_downlink_feedback,
// through an error-feedback residual of 4 bytes per model parameter) and sends that one
// segment to every contributor. A replica thus sends one payload and receives one, whatever
// the number of replicas, and every replica receives the same bytes; the hub holds about 16
// segments per contributor, not M payloads. It closes the round naming the contributions that
// arrived whole, and relays a donor's state to the replicas that join without looking inside
// it. Every error a peer can cause is logged on one line (naming the peer's address) and
// costs that peer its connection (or, for a contribution encoded differently from the
// round's, its place in the round); the hub itself carries on.
#ifndef TRAIN_GPT_RELAY_H
#define TRAIN_GPT_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *listen;         // "host:port" ("*:port" or ":port": every address; port 0: any free port)
    const uint8_t *secret;      // the shared secret (copied)
    size_t secret_bytes;
    double timeout_s;           // eviction of a silent replica, round deadline, handshakes
    int min_replicas;           // a round with fewer contributors is closed with apply = false
    int replicas;               // > 0: refuse replica ids >= replicas; 0: any id < 256
    double max_hold_s;          // > 0: a state transfer that holds the group's round longer is cut
                                // (its joiners wait again, its donor goes on); 0: no limit
    bool catch_up;              // joins by catch-up transfers (docs/protocol.md "Catch-up transfers"): a
                                // transfer longer than an inner phase does not hold the round
                                // (relay_main and a replica's served hub: on; zeroed options: off)
    bool join_in_flight;        // with catch_up: a replica that comes while a transfer's state is on its
                                // way joins it (docs/protocol.md "Catch-up transfers" step 8); off: it
                                // waits for the next transfer (relay_main and a served hub: on)
    FILE *log;                  // one line per event; NULL: stdout
    const char *name;           // what each log line starts with (NULL: "relay"; --shards: "relay shard J")
} relay_options;

typedef struct relay relay;

// Binds o->listen and starts the hub in a thread of this process. NULL with a one-line
// reason in err when it cannot listen (the port is taken, a bad address).
relay *relay_start_thread(const relay_options *o, char *err, size_t err_bytes);
// The port the hub listens on (the one picked for port 0).
int relay_port(const relay *r);
// Waits until no replica is connected, or max_wait_s; false on the timeout. A replica that
// hosts the hub calls this after its own goodbye, so that the others can finish the round
// in flight and leave before the hub goes.
bool relay_wait_until_empty(relay *r, double max_wait_s);
// Stops the thread and closes every connection (the replicas see the hub go).
void relay_stop(relay *r);

// `train_gpt relay --listen HOST:PORT --secret_file PATH [--timeout_s 60] [--min_replicas 1]
// [--replicas M] [--shards N] [--max_hold_s S] [--catch_up 0|1] [--join_in_flight 0|1]`: runs the hub in the foreground until SIGINT or SIGTERM. With
// --shards N (DiLoCo replicas of N ranks each), N independent hubs on ports PORT .. PORT+N−1,
// hub j for rank j of every replica (threads of this process). argv[0] is "relay". Returns the
// exit code; user errors exit through fail().
int relay_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
