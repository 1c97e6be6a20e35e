// A minimal test harness: each test is a function; CHECK records a failure
// with its file and line and carries on, so one run shows every failure.
#ifndef ATTOGRAD_TESTING_H
#define ATTOGRAD_TESTING_H

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "attograd.h"

static int testing_failures;
static const char *testing_current = "";

static inline void testing_fail(const char *file, int line, const char *what) {
    fprintf(stderr, "%s:%d: %s: CHECK failed: %s\n", file, line, testing_current, what);
    testing_failures++;
}

#define CHECK(cond) ((cond) ? (void)0 : testing_fail(__FILE__, __LINE__, #cond))

// |a - b| <= tol * max(1, |b|)
#define CHECK_NEAR(a, b, tol)                                                               \
    do {                                                                                    \
        double a_ = (a), b_ = (b);                                                          \
        if (!(fabs(a_ - b_) <= (tol) * fmax(1.0, fabs(b_)))) {                              \
            char m_[256];                                                                   \
            snprintf(m_, sizeof m_, "%s = %.17g, expected %s = %.17g (tol %g)", #a, a_, #b, \
                     b_, (double)(tol));                                                    \
            testing_fail(__FILE__, __LINE__, m_);                                           \
        }                                                                                   \
    } while (0)

static inline void testing_run(void (*fn)(void), const char *name) {
    int before = testing_failures;
    testing_current = name;
    fn();
    fprintf(stderr, "%s %s\n", testing_failures == before ? "ok  " : "FAIL", name);
}

#define RUN(fn) testing_run(fn, #fn)

static inline int testing_summary(void) {
    if (testing_failures) fprintf(stderr, "%d check(s) failed\n", testing_failures);
    return testing_failures ? 1 : 0;
}

// An error handler for tests that provoke errors on purpose: it records the
// message and returns, so the failing function returns NULL. The slices of a
// data-parallel step report from the pool's threads, several at once: the record
// is taken under a lock.
static char testing_last_error[512];
static int testing_error_count;
static pthread_mutex_t testing_error_lock = PTHREAD_MUTEX_INITIALIZER;

static inline void testing_record_error(const char *msg, void *user) {
    (void)user;
    pthread_mutex_lock(&testing_error_lock);
    snprintf(testing_last_error, sizeof testing_last_error, "%s", msg);
    testing_error_count++;
    pthread_mutex_unlock(&testing_error_lock);
}

static inline void testing_catch_errors(void) {
    testing_last_error[0] = 0;
    testing_error_count = 0;
    ag_error_handler_set(testing_record_error, NULL);
}

static inline void testing_release_errors(void) { ag_error_handler_set(NULL, NULL); }

// Exactly one error since the last check, with exactly this message (both printed when
// not); forgets it, so the next check starts afresh.
static inline bool testing_error_was(const char *expected) {
    bool ok = testing_error_count == 1 && strcmp(testing_last_error, expected) == 0;
    if (!ok)
        fprintf(stderr, "  message:  %s (%d errors)\n  expected: %s\n", testing_last_error,
                testing_error_count, expected);
    testing_error_count = 0;
    testing_last_error[0] = 0;
    return ok;
}

#endif
