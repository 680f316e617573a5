// llmc/watchdog.h — ends a run that makes no progress (docs/config.md#training-health).
//
// The training loop names the phase it enters (a step, DiLoCo's outer work, validation, a
// checkpoint, a sample); a thread checks once a second how long the current phase has
// lasted. Past watchdog_s it prints one line — which rank, which phase, at which step, since
// when — and ends the process with WATCHDOG_EXIT_STATUS, without unwinding: a rank stuck in
// a collective whose peer died or was stopped, a hung file system, a GPU that stopped
// answering. The job then fails fast and can be requeued instead of holding its nodes until
// the walltime.
#ifndef TRAIN_GPT_WATCHDOG_H
#define TRAIN_GPT_WATCHDOG_H

#include <stdint.h>

#include "llmc/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WATCHDOG_EXIT_STATUS EXIT_TEMPFAIL   // llmc/common.h: a temporary failure, try again

// Starts the thread (timeout_s <= 0: the watchdog stays off). rank: for the message.
void watchdog_start(double timeout_s, int rank);
// The loop enters a phase (a string literal) at this step; NULL: not watched (a wait that
// has its own limit, such as joining a DiLoCo group).
void watchdog_phase(const char *phase, int64_t step);
// The same for a phase whose work says when it moves on (watchdog_progress): its time without
// progress counts from its last progress, not from its start. DiLoCo's outer work is one: an
// exchange may wait hours for a state transfer or move a 14B model's outer gradients over a
// slow link, and is stuck only when nothing moves (the transport has its own limits on a
// stalled link too: diloco_timeout_s).
void watchdog_phase_moving(const char *phase, int64_t step);
// Progress of such a phase, from any thread, without a lock (DiLoCo's tcp transport: when bytes
// move, or the hub says it holds the round for a state transfer). No effect in other phases.
void watchdog_progress(void);
void watchdog_stop(void);

#ifdef __cplusplus
}
#endif

#endif
