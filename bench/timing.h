// What the benchmarks share: a monotonic clock, medians of repeated runs, and the
// sgemm ceiling measured in the same run as what is compared with it.
#ifndef ATTOGRAD_BENCH_TIMING_H
#define ATTOGRAD_BENCH_TIMING_H

#include <cblas.h>
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

// OpenBLAS's pthreads build restarts its workers when given more than one thread, and
// they spin for a while after each call: beside attograd's own threads they would take
// the second core. The library stops them at start; a benchmark stops them again.
extern int blas_thread_shutdown_(void) __attribute__((weak));

// GFLOP/s of cblas_sgemm on a square product of n = 1536 with `threads` OpenBLAS
// threads (the median of several), after which OpenBLAS is pinned to one thread again
// and its workers are stopped.
static inline double sgemm_ceiling(int threads) {
    const int n = 1536;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) a[i] = b[i] = 1.0f / (float)(1 + i % 7);
    openblas_set_num_threads(threads);
    timings r = {{0}, 0, 0};
    double t;
    int run = 0;
    do {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        t = now() - t0;
    } while (again(run++, t, &r, 5, 1.0));
    const double mid = median(&r);
    openblas_set_num_threads(1);
    if (threads > 1 && blas_thread_shutdown_) blas_thread_shutdown_();
    free(a), free(b), free(c);
    return 2.0 * n * n * n / mid * 1e-9;
}

#endif
