// test/check.h — the few lines of test harness the C tests share: EXPECT records a failed
// check with file:line and a message and carries on, so one run shows every failure;
// check_summary() prints the count and gives the exit code.
#ifndef TRAIN_GPT_TEST_CHECK_H
#define TRAIN_GPT_TEST_CHECK_H

#include <stdio.h>

static int checks_run = 0, checks_failed = 0;

#define EXPECT(cond, ...)                                                         \
    do {                                                                          \
        checks_run++;                                                             \
        if (!(cond)) {                                                            \
            checks_failed++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

static inline int check_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, checks_run, checks_failed);
    return checks_failed ? 1 : 0;
}

#endif
