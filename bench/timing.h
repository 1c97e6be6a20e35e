// What the benchmarks share: a clock and medians of repeated runs (peak.h has the
// ceilings they are measured against).
#ifndef ATTOGRAD_BENCH_TIMING_H
#define ATTOGRAD_BENCH_TIMING_H

#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#define TIMING_MAX_RUNS 64

// The clock of now(): wall time, or (a benchmark's --cpu option, on one thread) the
// calling thread's CPU time, which a busy neighbour taking turns on the core does not
// add to (its cache pollution still does).
static clockid_t timing_clock = CLOCK_MONOTONIC;

static inline double now(void) {
    struct timespec t;
    clock_gettime(timing_clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    double t[TIMING_MAX_RUNS], total;
    int n;
} timings;

// Records time t of run `run` (run 0 only warms up); says whether to run again: at least
// min_runs timed runs, and more until min_seconds have been timed (at most
// TIMING_MAX_RUNS), since the machine may be shared.
static inline bool again(int run, double t, timings *r, int min_runs, double min_seconds) {
    if (run > 0 && r->n < TIMING_MAX_RUNS) {
        r->t[r->n++] = t;
        r->total += t;
    }
    return r->n < TIMING_MAX_RUNS && (r->n < min_runs || r->total < min_seconds);
}

static inline int timing_by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double median(timings *r) {
    qsort(r->t, (size_t)r->n, sizeof r->t[0], timing_by_value);
    return r->n % 2 ? r->t[r->n / 2] : 0.5 * (r->t[r->n / 2 - 1] + r->t[r->n / 2]);
}

#endif
