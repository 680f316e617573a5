// net/transport_tcp_hub.h — one hub's session of the tcp transport, for net/transport_hubs.c (a run
// with several hubs: docs/protocol.md, "Several hubs"). Private to net/transport_tcp.c and
// net/transport_hubs.c.
//
// Unlike transport_tcp_open's transport, a lost hub is never fatal here and nothing retries
// for long on its own: each call says whether the hub is still there, and the composite
// transport moves the hub's work to another hub while a background thread tries this one
// again. Only a fault of this replica's own configuration (secret, fingerprint, id) is fatal.
#ifndef TRAIN_GPT_TRANSPORT_TCP_HUB_H
#define TRAIN_GPT_TRANSPORT_TCP_HUB_H

#include "net/transport.h"

typedef struct tcp tcp_hub;

// A session with hub `index` of the `hubs` in diloco_rendezvous, at address (not connected yet;
// AUTH tells the hub its place, which every replica must agree on); o->rendezvous and o->serve
// are ignored. With hubs > 1 its CONTRIBUTEs say the round ids are 64·k + 8·attempt + share.
tcp_hub *tcp_hub_new(const transport_options *o, const char *address, int index, int hubs);
const char *tcp_hub_address(const tcp_hub *t);
bool tcp_hub_connected(const tcp_hub *t);
// Connects (control and data connections, handshakes), retrying until deadline; false with
// the last reason in err. quiet: no line saying it waits; stoppable: false at once when the
// options' stop flag is set.
bool tcp_hub_connect(tcp_hub *t, double deadline, bool quiet, bool stoppable, char *err, size_t err_bytes);
// JOIN with this status (the primary hub): *result as transport_join's; *state_round the
// round id the donor's state came after (JOIN_GOT_STATE). false: the hub is lost (disconnected).
bool tcp_hub_join(tcp_hub *t, const replica_status *s, uint8_t *state, size_t state_capacity, size_t *state_bytes,
                  join_result *result, int64_t *state_round);
// Whether a JOIN here since tcp_hub_clear_waited waited for the group's state (JOINED(wait), or
// a state began to come): transport_join_waited.
bool tcp_hub_join_waited(const tcp_hub *t);
void tcp_hub_clear_waited(tcp_hub *t);
// FOLLOW (docs/protocol.md): a member from round first_round on, without a state; *from_round
// (may be NULL): the round the hub expects it from (later when the hub's group, founded by
// another follower, has not begun yet, or when it has reduced part of that round without this
// replica). caught_up: it caught up through its primary (FOLLOW_CATCHUP: its first round here
// waits for it). false: lost.
bool tcp_hub_follow(tcp_hub *t, const replica_status *s, int64_t first_round, bool caught_up, int64_t *from_round);
// The same without waiting for the answer (the hub reads it before anything sent after it;
// the answer is taken with the next call's mail). false: the hub is lost.
bool tcp_hub_follow_now(tcp_hub *t, const replica_status *s, int64_t first_round);
// transport_exchange for one round (round: its id on the wire). false: the hub is unreachable.
bool tcp_hub_exchange(tcp_hub *t, int64_t round, const payload_spec *spec, const uint8_t *payload, round_result *r);
// DONE (docs/protocol.md, "Several hubs"): this replica's exchange for outer step k (the round
// number, not a round id) is over: completed (it has every share's mean), or given up. Without
// waiting for an answer; false: the hub is lost.
bool tcp_hub_done(tcp_hub *t, int64_t outer_step, bool completed);
// HOLD (docs/protocol.md, "Several hubs"): this replica begins to send its state through
// another hub (begin), or is done: this hub holds its rounds for it meanwhile. Without waiting
// for an answer; false: the hub is lost.
bool tcp_hub_hold(tcp_hub *t, bool begin);
void tcp_hub_send_state(tcp_hub *t, const uint8_t *state, size_t bytes, const state_hooks *hooks);
// The catch-up transfer through this hub (docs/protocol.md, "Catch-up transfers"; with several
// hubs it counts outer steps, "landings"). The donor's side: whether the ROUND that made it the
// donor here asked for a catch-up (tcp_hub_send_state then sends while the replica exchanges
// on), and transport_preserve_state / transport_send_catchup for it (nothing unless it sends).
// The joiner's side: whether its JOIN here took a catch-up state (this session defers CAUGHT_UP:
// the composite transport says it with tcp_hub_catchup_extend(t, -1)), transport_catchup_count /
// _extend (the means go to transport_options.catchup_sink).
bool tcp_hub_sends_catchup(const tcp_hub *t);
void tcp_hub_preserve_state(tcp_hub *t, size_t offset, size_t bytes);
void tcp_hub_send_catchup(tcp_hub *t, int64_t landing, const uint8_t *bytes, size_t n);
bool tcp_hub_took_catchup(const tcp_hub *t);
int tcp_hub_catchup_count(tcp_hub *t);
int tcp_hub_catchup_held(tcp_hub *t, uint64_t *bytes);
int64_t tcp_hub_catchup_extend(tcp_hub *t, int64_t landing);
// transport_poll through this session (it reads only while its catch-up CAUGHT_UP is deferred).
void tcp_hub_poll(tcp_hub *t, double seconds);
// Closes the connections (the hub drops this replica); the session can connect again.
void tcp_hub_disconnect(tcp_hub *t);
// LEAVE (when connected), then frees.
void tcp_hub_leave(tcp_hub *t, int64_t outer_step, bool finished);
void tcp_hub_free(tcp_hub *t);

// net/transport_hubs.c: the composite transport over several hubs ("h1:p1,h2:p2,..." in
// o->rendezvous, at most TRANSPORT_MAX_HUBS), called by transport_tcp_open.
#define TRANSPORT_MAX_HUBS 8
transport *transport_hubs_open(const transport_options *o);

#endif
