// MultiheadAttention (self-attention, f32) forward + backward: the composed attention
// (ag_matmul -> ag_softmax -> ag_matmul, which stores [B, h, T, T] weights and their
// gradients) against the fused ag_attention (which stores a logsumexp per query), on 1
// and 2 threads. bench/pytorch_mha.py prints torch.nn.MultiheadAttention's numbers on
// the same shapes in the same format.
//
// Both paths are the module's own computation (src/nn/mha.c): q, k, v projections,
// split into heads, attention with scale 1/sqrt(d), merge, output projection; the input
// x requires grad, as it would inside a model. ag_mha_forward takes the fused path when
// no weights are asked for; the composed one is spelled out here, with the same ops.
//
// Flop count (the products only): the 4 projections, 2 B T E^2 each, and the two
// attention products, 2 B T^2 E each, once forward and twice backward:
//     3 (8 B T E^2 + 4 B T^2 E).
// The ceiling is cblas_sgemm on a large square product with 1 and 2 OpenBLAS threads.
// Each time is the best of at least MIN_RUNS steps after a warm-up step (more for small
// shapes, until MIN_SECONDS have been timed), since the machine may be shared. "tape MB"
// is the tape arena's peak (ag_tape_stats_get().bytes_peak) over the steps.
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC)

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attograd.h"

#define MIN_RUNS 3
#define MIN_SECONDS 1.0

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Keeps the best time; says whether to run again (run 0 only warms up).
static bool again(int run, double t, double *best, double *total) {
    if (run > 0) {
        if (t < *best) *best = t;
        *total += t;
    }
    return run < MIN_RUNS || *total < MIN_SECONDS;
}

static double sgemm_ceiling(int threads) {
    const int n = 1536;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) a[i] = b[i] = 1.0f / (float)(1 + i % 7);
    openblas_set_num_threads(threads);
    double best = 1e30, total = 0, t;
    int run = 0;
    do {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        t = now() - t0;
    } while (again(run++, t, &best, &total));
    openblas_set_num_threads(1);  // attograd's own threads only
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * n / best * 1e-9;
}

typedef struct {
    int B, T, E, h;
    ag_tensor *x, *dy;
    ag_tensor *w[4], *b[4];  // q, k, v and output projections, [E, E] and [E]
} problem;

static problem make_problem(int B, int T, int E, int h) {
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    problem p = {B, T, E, h, NULL, NULL, {NULL}, {NULL}};
    double bound = 1.0 / sqrt((double)E);
    p.x = ag_tensor_uniform(AG_F32, 3, (int[]){B, T, E}, &rng, -1, 1);
    p.dy = ag_tensor_uniform(AG_F32, 3, (int[]){B, T, E}, &rng, -1, 1);
    ag_tensor_set_requires_grad(p.x, true);
    for (int i = 0; i < 4; i++) {
        p.w[i] = ag_tensor_uniform(AG_F32, 2, (int[]){E, E}, &rng, -bound, bound);
        p.b[i] = ag_tensor_uniform(AG_F32, 1, (int[]){E}, &rng, -bound, bound);
        ag_tensor_set_requires_grad(p.w[i], true);
        ag_tensor_set_requires_grad(p.b[i], true);
    }
    return p;
}

static void free_problem(problem *p) {
    ag_tensor_free(p->x);
    ag_tensor_free(p->dy);
    for (int i = 0; i < 4; i++) {
        ag_tensor_free(p->w[i]);
        ag_tensor_free(p->b[i]);
    }
}

// One training step's forward and backward; returns its time in seconds.
static double step(ag_tape *tp, const problem *p, bool fused) {
    double t0 = now();
    ag_tape_reset(tp);
    ag_tensor *x = p->x, *qkv[3];
    for (int i = 0; i < 3; i++) {
        ag_tensor_zero_grad(p->w[i]);
        ag_tensor_zero_grad(p->b[i]);
        qkv[i] = ag_split_heads(tp, ag_linear(tp, x, p->w[i], p->b[i]), p->h);
    }
    ag_tensor_zero_grad(x);
    ag_tensor_zero_grad(p->w[3]);
    ag_tensor_zero_grad(p->b[3]);
    ag_attention_opts o = {.softmax = {.scale = 1.0 / sqrt((double)(p->E / p->h))}};
    ag_tensor *ctx;
    if (fused) {
        ctx = ag_attention(tp, qkv[0], qkv[1], qkv[2], &o);
    } else {
        ag_tensor *scores = ag_matmul(tp, qkv[0], qkv[1], false, true);
        ctx = ag_matmul(tp, ag_softmax(tp, scores, &o.softmax), qkv[2], false, false);
    }
    ag_tensor *y = ag_linear(tp, ag_merge_heads(tp, ctx), p->w[3], p->b[3]);
    ag_backward_with(tp, y, p->dy);
    return now() - t0;
}

typedef struct {
    double ms, gflops;
    size_t tape_peak;
} result;

static result measure(const problem *p, bool fused, int threads) {
    ag_set_num_threads(threads);
    ag_tape *tp = ag_tape_new();
    double best = 1e30, total = 0, t;
    int run = 0;
    do t = step(tp, p, fused);
    while (again(run++, t, &best, &total));
    result r;
    r.ms = 1e3 * best;
    double B = p->B, T = p->T, E = p->E;
    r.gflops = 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E) / best * 1e-9;
    r.tape_peak = ag_tape_stats_get(tp).bytes_peak;
    ag_tape_free(tp);
    ag_set_num_threads(1);
    return r;
}

int main(int argc, char **argv) {
    // B, T, E, h; the first is the demo's size. An argument limits the run to one shape.
    const int shapes[][4] = {{64, 32, 64, 4}, {8, 256, 256, 4}, {4, 1024, 256, 4},
                             {1, 4096, 128, 2}};
    int only = argc > 1 ? atoi(argv[1]) : -1;
    ag_tape *init = ag_tape_new();  // pins OpenBLAS to one thread
    ag_tape_free(init);
    double ceiling[3] = {0, sgemm_ceiling(1), sgemm_ceiling(2)};
    printf("MultiheadAttention f32 forward+backward, self-attention, no mask, no dropout\n");
    printf("GFLOP/s over 3*(8 B T E^2 + 4 B T^2 E) flop; %%sgemm of cblas_sgemm n=1536: "
           "%.1f GFLOP/s (1 thread), %.1f (2 threads)\n",
           ceiling[1], ceiling[2]);
    printf("%3s %5s %4s %2s | %-8s %3s | %9s %8s %7s | %9s\n", "B", "T", "E", "h", "path",
           "thr", "ms/step", "GFLOP/s", "%sgemm", "tape MB");
    for (int s = 0; s < 4; s++) {
        if (only >= 0 && s != only) continue;
        problem p = make_problem(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        for (int fused = 0; fused < 2; fused++) {
            result r[3];
            for (int threads = 1; threads <= 2; threads++) {
                r[threads] = measure(&p, fused, threads);
                printf("%3d %5d %4d %2d | %-8s %3d | %9.2f %8.1f %6.0f%% | %9.1f\n", p.B, p.T,
                       p.E, p.h, fused ? "fused" : "composed", threads, r[threads].ms,
                       r[threads].gflops, 100 * r[threads].gflops / ceiling[threads],
                       r[threads].tape_peak / 1048576.0);
                fflush(stdout);
            }
            if (r[2].ms > r[1].ms) printf("    ^ two threads slower than one\n");
        }
        free_problem(&p);
    }
    return 0;
}
