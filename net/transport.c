// net/transport.c — the public transport calls, forwarded to the implementation (see net/transport.h).
#include "net/transport_impl.h"
#include "llmc/common.h"
#include "llmc/quant.h"

#include <stdlib.h>
#include <time.h>

struct transport {
    const transport_ops *ops;
    void *impl;
};

transport *transport_wrap(const transport_ops *ops, void *impl) {
    transport *t = xcalloc(1, sizeof *t);
    t->ops = ops;
    t->impl = impl;
    return t;
}

join_result transport_join(transport *t, const replica_status *s, uint8_t *state, size_t state_capacity,
                           size_t *state_bytes) {
    return t->ops->join(t->impl, s, state, state_capacity, state_bytes);
}

join_result transport_rejoin(transport *t, const replica_status *s, uint8_t *state, size_t state_capacity,
                             size_t *state_bytes) {
    return t->ops->rejoin(t->impl, s, state, state_capacity, state_bytes);
}

bool transport_join_waited(transport *t) { return t->ops->join_waited && t->ops->join_waited(t->impl); }

size_t payload_spec_up_bytes(const payload_spec *s) {
    return quant_segmented_bytes(s->up_codec, s->values, s->block, s->segment);
}

size_t payload_spec_down_bytes(const payload_spec *s) {
    return quant_segmented_bytes(s->down_codec, s->values, s->block, s->segment);
}

bool transport_exchange(transport *t, int64_t outer_step, const payload_spec *spec, const uint8_t *payload,
                        round_result *r) {
    return t->ops->exchange(t->impl, outer_step, spec, payload, r);
}

void transport_send_state(transport *t, const uint8_t *state, size_t bytes, const state_hooks *hooks) {
    t->ops->send_state(t->impl, state, bytes, hooks);
}

bool transport_reducer_state(transport *t, const void **head, size_t *head_bytes, const void **body,
                             size_t *body_bytes) {
    return t->ops->reducer_state && t->ops->reducer_state(t->impl, head, head_bytes, body, body_bytes);
}

bool transport_restore_reducer(transport *t, const uint8_t *bytes, size_t n, char *why, size_t why_bytes) {
    if (t->ops->restore_reducer) return t->ops->restore_reducer(t->impl, bytes, n, why, why_bytes);
    note("diloco (%s): the checkpoint holds a downlink residual of the mpi transport; this transport keeps none: "
         "not used",
         t->ops->name);
    return true;
}

void transport_preserve_state(transport *t, size_t offset, size_t bytes) {
    if (t->ops->preserve_state) t->ops->preserve_state(t->impl, offset, bytes);
}

void transport_send_catchup(transport *t, int64_t round, const uint8_t *bytes, size_t n) {
    if (t->ops->send_catchup) t->ops->send_catchup(t->impl, round, bytes, n);
}

int transport_catchup_count(transport *t) { return t->ops->catchup_count ? t->ops->catchup_count(t->impl) : 0; }

int transport_catchup_held(transport *t, uint64_t *bytes) {
    *bytes = 0;
    return t->ops->catchup_held ? t->ops->catchup_held(t->impl, bytes) : 0;
}

int64_t transport_catchup_extend(transport *t, int64_t round) {
    if (!t->ops->catchup_extend) return round < 0 ? -2 : -1;
    return t->ops->catchup_extend(t->impl, round);
}

void transport_poll(transport *t, double seconds) {
    if (t->ops->poll) {
        t->ops->poll(t->impl, seconds);
        return;
    }
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

bool transport_agree_stop(transport *t, bool local_stop) { return t->ops->agree_stop(t->impl, local_stop); }

void transport_leave(transport *t, int64_t outer_step, bool finished) {
    if (!t) return;
    t->ops->leave(t->impl, outer_step, finished);
    free(t);
}

void transport_close(transport *t) {
    if (!t) return;
    t->ops->close(t->impl);
    free(t);
}
