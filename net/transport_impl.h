// net/transport_impl.h — what a transport implementation provides (private to transport*.c).
// net/transport.c forwards each public call of net/transport.h to the implementation's function.
#ifndef TRAIN_GPT_TRANSPORT_IMPL_H
#define TRAIN_GPT_TRANSPORT_IMPL_H

#include "net/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    join_result (*join)(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                        size_t *state_bytes);
    join_result (*rejoin)(void *impl, const replica_status *s, uint8_t *state, size_t state_capacity,
                          size_t *state_bytes);
    bool (*exchange)(void *impl, int64_t outer_step, const payload_spec *spec, const uint8_t *payload,
                     round_result *r);
    void (*send_state)(void *impl, const uint8_t *state, size_t bytes, const state_hooks *hooks);
    bool (*agree_stop)(void *impl, bool local_stop);
    void (*leave)(void *impl, int64_t outer_step, bool finished);   // says goodbye and frees
    void (*close)(void *impl);   // frees
    // Optional (NULL: the transport keeps no reducer state): transport_reducer_state and
    // transport_restore_reducer.
    bool (*reducer_state)(void *impl, const void **head, size_t *head_bytes, const void **body, size_t *body_bytes);
    bool (*restore_reducer)(void *impl, const uint8_t *bytes, size_t n, char *why, size_t why_bytes);
    // Optional (NULL: no catch-up transfers): transport_preserve_state, transport_send_catchup,
    // transport_catchup_count, transport_catchup_held and transport_catchup_extend.
    void (*preserve_state)(void *impl, size_t offset, size_t bytes);
    void (*send_catchup)(void *impl, int64_t round, const uint8_t *bytes, size_t n);
    int (*catchup_count)(void *impl);
    int (*catchup_held)(void *impl, uint64_t *bytes);
    int64_t (*catchup_extend)(void *impl, int64_t round);
    void (*poll)(void *impl, double seconds);   // optional (NULL: transport_poll naps)
    bool (*join_waited)(void *impl);            // optional (NULL: joins never wait)
} transport_ops;

// Wraps an implementation in the public handle.
transport *transport_wrap(const transport_ops *ops, void *impl);

#ifdef __cplusplus
}
#endif

#endif
