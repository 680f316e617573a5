// llmc/watchdog.c — see watchdog.h.
#include "llmc/watchdog.h"
#include "llmc/common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    bool running, stopping;
    double timeout_s;
    int rank;
    const char *phase;      // NULL: not watched
    bool moving;            // watchdog_phase_moving: progress counts
    int64_t step;
    double since;           // wall_seconds() when the phase began
} dog = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
static _Atomic double progress_s;  // run_seconds() of the last watchdog_progress
// Seconds the watch thread found the process not running (SIGSTOP, a SLURM suspend, a machine's
// sleep): its 1 s tick came that much late. CLOCK_MONOTONIC runs on meanwhile, and a job
// suspended for longer than watchdog_s was ended as hung at its SIGCONT.
static _Atomic double stopped_s;
enum { TICK_S = 1, LATE_TICK_S = 5 };   // a tick later than this: the process was not running

// The time the watchdog counts in: wall_seconds() without the stops.
static double run_seconds(void) { return wall_seconds() - atomic_load(&stopped_s); }

static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&dog.lock);
    double last_tick = wall_seconds();
    while (!dog.stopping) {
        double wall = wall_seconds();
        if (wall - last_tick > LATE_TICK_S) atomic_store(&stopped_s, atomic_load(&stopped_s) + (wall - last_tick - TICK_S));
        last_tick = wall;
        double now = run_seconds(), progress = atomic_load(&progress_s);
        double quiet_since = dog.moving && progress > dog.since ? progress : dog.since;
        if (dog.phase && now - quiet_since > dog.timeout_s) {
            time_t began = time(NULL) - (time_t)(now - quiet_since);
            char when[32];
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&began));
            fprintf(stderr,
                    "train_gpt: error: watchdog: rank %d made no progress for %.0f s in %s at step %lld (since %s; "
                    "watchdog_s = %g); exiting with status %d so that the job can be requeued\n",
                    dog.rank, now - quiet_since, dog.phase, (long long)dog.step, when, dog.timeout_s,
                    WATCHDOG_EXIT_STATUS);
            fflush(stderr);
            _exit(WATCHDOG_EXIT_STATUS);
        }
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += TICK_S;
        pthread_cond_timedwait(&dog.wake, &dog.lock, &t);
    }
    pthread_mutex_unlock(&dog.lock);
    return NULL;
}

void watchdog_start(double timeout_s, int rank) {
    if (timeout_s <= 0 || dog.running) return;
    dog.timeout_s = timeout_s;
    dog.rank = rank;
    dog.phase = NULL;
    dog.stopping = false;
    int rc = pthread_create(&dog.thread, NULL, watch, NULL);
    if (rc != 0) fail("watchdog: cannot start its thread");
    dog.running = true;
}

static void enter(const char *phase, int64_t step, bool moving) {
    if (!dog.running) return;
    pthread_mutex_lock(&dog.lock);
    dog.phase = phase;
    dog.moving = moving;
    dog.step = step;
    dog.since = run_seconds();
    pthread_mutex_unlock(&dog.lock);
}

void watchdog_phase(const char *phase, int64_t step) { enter(phase, step, false); }
void watchdog_phase_moving(const char *phase, int64_t step) { enter(phase, step, true); }

void watchdog_progress(void) { atomic_store(&progress_s, run_seconds()); }

void watchdog_stop(void) {
    if (!dog.running) return;
    pthread_mutex_lock(&dog.lock);
    dog.stopping = true;
    pthread_cond_signal(&dog.wake);
    pthread_mutex_unlock(&dog.lock);
    pthread_join(dog.thread, NULL);
    dog.running = false;
}
