// ag_exp, ag_add with a broadcast operand, and ag_sum_dim in f32 against the memory
// bandwidth measured in the same run: these ops do a few flops per element, so memory
// bounds them, and the fraction of a plain loop's bandwidth they reach is their
// efficiency.
//
// Bandwidth: the best of several runs of two plain loops over the same sizes, on as many
// threads as the ops,
//   copy  y[i] = 2 * x[i]   (read N, write N)  -> the ceiling of exp and add;
//   read  s += x[i]         (read N; eight partial sums so it vectorises) -> of sum_dim.
// Ops run forward in no-grad mode on a tape that is reset each run (no allocation).
// Bytes counted: every element read or written once (add's broadcast row is counted
// once, it stays in cache). Each figure is the best of at least MIN_RUNS runs (more
// until MIN_SECONDS have been timed), since the machine may be shared.
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC), semaphores

#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attograd.h"

#define MIN_RUNS 5
#define MIN_SECONDS 0.5

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef void (*job)(void *ctx);

// The best wall time of fn over at least MIN_RUNS runs after one warm-up run.
static double best_time(job fn, void *ctx) {
    double best = 1e30, total = 0;
    for (int run = 0; run <= MIN_RUNS || total < MIN_SECONDS; run++) {
        double t0 = now();
        fn(ctx);
        double t = now() - t0;
        if (run == 0) continue;
        total += t;
        if (t < best) best = t;
    }
    return best;
}

// The plain loops run on as many threads as the ops: two threads split the range in halves,
// claimed by whichever thread comes first (as the library's pool claims its slices), so a
// helper that is slow to wake never holds a loop up.
typedef struct plain plain;
struct plain {
    size_t n;
    float *x, *y;
    int threads;
    void (*range)(plain *p, size_t lo, size_t hi, int half);
    float part[2];
    volatile float sink;
    sem_t go;
    atomic_int next, done;
    atomic_bool quit;
};

static void run_halves(plain *p) {
    for (int h; (h = atomic_fetch_add(&p->next, 1)) < 2;) {
        p->range(p, h ? p->n / 2 : 0, h ? p->n : p->n / 2, h);
        atomic_fetch_add(&p->done, 1);
    }
}

static void *helper_main(void *arg) {
    plain *p = arg;
    for (;;) {
        sem_wait(&p->go);
        if (atomic_load(&p->quit)) return NULL;
        run_halves(p);
    }
}

static void run_plain(plain *p) {
    if (p->threads == 1) {
        p->range(p, 0, p->n, 0);
        p->part[1] = 0;
        return;
    }
    atomic_store(&p->done, 0);
    atomic_store(&p->next, 0);
    sem_post(&p->go);
    run_halves(p);
    while (atomic_load(&p->done) < 2) sched_yield();
}

__attribute__((noinline)) static void copy_range(plain *p, size_t lo, size_t hi, int half) {
    const float *restrict x = p->x;
    float *restrict y = p->y;
    for (size_t i = lo; i < hi; i++) y[i] = 2 * x[i];
    p->part[half] = y[lo];
}

// The same eight interleaved partial sums as ag_sum_dim's rows.
__attribute__((noinline)) static void read_range(plain *p, size_t lo, size_t hi, int half) {
    const float *restrict x = p->x;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = lo; i + 8 <= hi; i += 8) {
        a0 += x[i], a1 += x[i + 1], a2 += x[i + 2], a3 += x[i + 3];
        a4 += x[i + 4], a5 += x[i + 5], a6 += x[i + 6], a7 += x[i + 7];
    }
    p->part[half] = ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7));
}

static void copy_loop(void *ctx) {
    plain *p = ctx;
    p->range = copy_range;
    run_plain(p);
    p->sink = p->part[0] + p->part[1];
}

static void read_loop(void *ctx) {
    plain *p = ctx;
    p->range = read_range;
    run_plain(p);
    p->sink = p->part[0] + p->part[1];
}

typedef struct {
    ag_tape *tp;
    ag_tensor *x, *bias;
    int which;  // 0 exp, 1 add, 2 sum_dim(-1), 3 sum_dim(0)
} op_run;

static void op_loop(void *ctx) {
    op_run *r = ctx;
    ag_tape_reset(r->tp);
    switch (r->which) {
    case 0: ag_exp(r->tp, r->x); break;
    case 1: ag_add(r->tp, r->x, r->bias); break;
    case 2: ag_sum_dim(r->tp, r->x, -1, false); break;
    default: ag_sum_dim(r->tp, r->x, 0, false); break;
    }
}

int main(void) {
    const int rows = 16384, cols = 1024;  // 16M floats: 64 MB, far beyond the caches
    const size_t n = (size_t)rows * cols;
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_tensor *x = ag_tensor_uniform(AG_F32, 2, (int[]){rows, cols}, &rng, -1, 1);
    ag_tensor *bias = ag_tensor_uniform(AG_F32, 1, (int[]){cols}, &rng, -1, 1);
    plain p = {.n = n, .x = ag_tensor_f32(x), .y = malloc(n * sizeof(float)), .threads = 1};
    sem_init(&p.go, 0, 0);
    pthread_t helper;
    if (pthread_create(&helper, NULL, helper_main, &p) != 0) {
        fprintf(stderr, "bench_ops: cannot start the plain loops' second thread\n");
        return 1;
    }
    ag_tape *tp = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false);

    printf("f32 [%d, %d] (%.0f MB); the machine is shared: figures are best-of-runs and\n"
           "vary from run to run; the fractions, taken in one run, are steadier\n\n",
           rows, cols, (double)n * sizeof(float) / 1e6);
    printf("%-8s %-24s %10s %10s %9s\n", "threads", "loop", "ms", "GB/s", "of bound");
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        p.threads = threads;
        double copy_gbs = 2.0 * (double)n * sizeof(float) / best_time(copy_loop, &p) / 1e9;
        double read_gbs = (double)n * sizeof(float) / best_time(read_loop, &p) / 1e9;
        printf("%-8d %-24s %10s %10.2f %9s\n", threads, "copy y = 2x (bound)", "", copy_gbs, "");
        printf("%-8d %-24s %10s %10.2f %9s\n", threads, "read sum (bound)", "", read_gbs, "");
        const char *names[] = {"ag_exp", "ag_add [R,C] + [C]", "ag_sum_dim(x, -1)",
                               "ag_sum_dim(x, 0)"};
        for (int w = 0; w < 4; w++) {
            op_run r = {tp, x, bias, w};
            double t = best_time(op_loop, &r);
            double bytes = (double)n * sizeof(float) * (w < 2 ? 2.0 : 1.0);
            double gbs = bytes / t / 1e9, bound = w < 2 ? copy_gbs : read_gbs;
            printf("%-8d %-24s %10.2f %10.2f %8.0f%%\n", threads, names[w], 1e3 * t, gbs,
                   100 * gbs / bound);
        }
    }
    ag_threads_set(1);
    atomic_store(&p.quit, true);
    sem_post(&p.go);
    pthread_join(helper, NULL);
    sem_destroy(&p.go);
    ag_tape_free(tp);
    free(p.y);
    ag_tensor_free(x);
    ag_tensor_free(bias);
    return 0;
}
