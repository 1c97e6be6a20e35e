// Sliding-window attention: fused forward + backward time of ag_attention with a causal
// window W against sequence length T, to show it grows as T * W, not T^2: each doubling
// of T should cost about 2x (the target: at most 2.2x). Float32, heads inside
// ([B, T, h*d] as a projection makes them), B = 1, h = 8, d = 64, grouped-query with
// h_kv = 2 and without, and for contrast the full causal attention (no window: 4x a
// doubling, T^2); the lengths interleaved round by round (A B C A B C ...) so that
// a busy neighbour slows them alike, each time the median of its rounds.
//
//   bench_window [--cpu] [W [rounds]]     W = 256, rounds = 5 by default
//       --cpu: the calling thread's CPU time (one thread, on a busy machine).
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attograd.h"
#include "timing.h"

enum { H = 8, D = 64, LENGTHS = 3 };
static const int lengths[LENGTHS] = {2048, 4096, 8192};

typedef struct {
    ag_tensor *q, *k, *v, *dy;
    ag_tape *tp;
} problem;

static problem make(int T, int kvh) {
    ag_pcg32 rng = ag_pcg32_make(1, (uint64_t)T);
    problem p = {ag_tensor_uniform(AG_F32, 3, (int[]){1, T, H * D}, &rng, -1, 1),
                 ag_tensor_uniform(AG_F32, 3, (int[]){1, T, kvh * D}, &rng, -1, 1),
                 ag_tensor_uniform(AG_F32, 3, (int[]){1, T, kvh * D}, &rng, -1, 1),
                 ag_tensor_uniform(AG_F32, 3, (int[]){1, T, H * D}, &rng, -1, 1), ag_tape_new()};
    ag_tensor_set_requires_grad(p.q, true);
    ag_tensor_set_requires_grad(p.k, true);
    ag_tensor_set_requires_grad(p.v, true);
    return p;
}

static void free_problem(problem *p) {
    ag_tensor_free(p->q), ag_tensor_free(p->k), ag_tensor_free(p->v), ag_tensor_free(p->dy);
    ag_tape_free(p->tp);
}

// One forward and backward; its seconds.
static double run(problem *p, int W, int kvh) {
    ag_tape_reset(p->tp);
    ag_attention_opts o = {.heads = H, .kv_heads = kvh};
    o.softmax.scale = 0.125;  // 1 / sqrt(64)
    o.softmax.causal = true;
    o.softmax.window = W;
    const double t0 = now();
    ag_tensor *y = ag_attention(p->tp, p->q, p->k, p->v, &o);
    if (!y) exit(1);
    ag_backward_with(p->tp, y, p->dy);
    return now() - t0;
}

int main(int argc, char **argv) {
    int a = 1;
    if (a < argc && strcmp(argv[a], "--cpu") == 0) {
        timing_clock = CLOCK_THREAD_CPUTIME_ID;
        a++;
    }
    const int W = a < argc ? atoi(argv[a]) : 256, rounds = a + 1 < argc ? atoi(argv[a + 1]) : 5;
    if (W < 1 || rounds < 1 || rounds >= TIMING_MAX_RUNS || argc > a + 2) {
        fprintf(stderr, "usage: bench_window [--cpu] [W [rounds]]\n");
        return 2;
    }
    ag_tape_free(ag_tape_new());  // pins OpenBLAS to one thread
    ag_threads_set(1);
    printf("sliding-window attention, causal, W = %d, f32, B = 1, h = %d, d = %d, one "
           "thread; fwd+bwd ms, median of %d rounds (%s)\n",
           W, H, D, rounds, timing_clock == CLOCK_MONOTONIC ? "wall clock" : "CPU time");
    printf("%6s | %5s | %6s | %9s | %s\n", "window", "h_kv", "T", "ms", "x previous T");
    const int kv_heads[3] = {H, 2, H}, windows[3] = {W, W, 0};
    for (int g = 0; g < 3; g++) {
        problem p[LENGTHS];
        timings t[LENGTHS];
        memset(t, 0, sizeof t);
        for (int i = 0; i < LENGTHS; i++) p[i] = make(lengths[i], kv_heads[g]);
        for (int r = 0; r <= rounds; r++)  // round 0 warms up
            for (int i = 0; i < LENGTHS; i++) {
                const double s = run(&p[i], windows[g], kv_heads[g]);
                if (r > 0) t[i].t[t[i].n++] = s;
            }
        double prev = 0;
        for (int i = 0; i < LENGTHS; i++) {
            const double ms = 1e3 * median(&t[i]);
            printf("%6d | %5d | %6d | %9.2f |", windows[g], kv_heads[g], lengths[i], ms);
            if (prev > 0) printf(" %.2f", ms / prev);
            printf("\n");
            prev = ms;
            free_problem(&p[i]);
        }
    }
    return 0;
}
