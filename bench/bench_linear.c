// ag_linear in f32: forward + backward GFLOP/s against raw cblas_sgemm.
//
// Forward and backward are three products of the same size (Y = X W^T,
// dX = dY W, dW = dY^T X), 6 * M * in * out flop in all; the bias adds
// O(M * out) and is not counted. The ceiling is the same three cblas_sgemm
// calls on the same buffers. Each figure is the best of at least MIN_RUNS
// runs (more for small shapes, until MIN_SECONDS have been timed), since the
// machine may be shared.
//
// Columns, for 1 and then 2 threads:
//   sgemm  the three cblas_sgemm calls (OpenBLAS with that many threads)
//   op     ag_linear forward, then the op's own backward (node->op->backward)
//   tape   a training step's view: ag_tape_reset, ag_linear, ag_backward_with
//          (which also seeds dY element by element and allocates it)
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC)

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attograd.h"

#define MIN_RUNS 5
#define MIN_SECONDS 0.3

// Keeps the best time; says whether to run again (run 0 only warms up).
static bool again(int run, double t, double *best, double *total) {
    if (run > 0) {
        if (t < *best) *best = t;
        *total += t;
    }
    return run < MIN_RUNS || *total < MIN_SECONDS;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    int M, in, out;
    ag_tensor *x, *w, *b, *dy;
    float *dx, *dw;  // plain buffers for the raw sgemm runs
} problem;

static problem make_problem(int M, int in, int out) {
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    problem p = {M, in, out, NULL, NULL, NULL, NULL, NULL, NULL};
    p.x = ag_tensor_uniform(AG_F32, 2, (int[]){M, in}, &rng, -1, 1);
    p.w = ag_tensor_uniform(AG_F32, 2, (int[]){out, in}, &rng, -1, 1);
    p.b = ag_tensor_uniform(AG_F32, 1, (int[]){out}, &rng, -1, 1);
    p.dy = ag_tensor_uniform(AG_F32, 2, (int[]){M, out}, &rng, -1, 1);
    ag_tensor_set_requires_grad(p.x, true);
    ag_tensor_set_requires_grad(p.w, true);
    ag_tensor_set_requires_grad(p.b, true);
    p.dx = calloc((size_t)M * in, sizeof(float));
    p.dw = calloc((size_t)out * in, sizeof(float));
    return p;
}

static void free_problem(problem *p) {
    ag_tensor_free(p->x);
    ag_tensor_free(p->w);
    ag_tensor_free(p->b);
    ag_tensor_free(p->dy);
    free(p->dx);
    free(p->dw);
}

static double gflops(const problem *p, double seconds) {
    return 6.0 * p->M * p->in * p->out / seconds * 1e-9;
}

static double time_sgemm(const problem *p, float *y) {
    const float *x = ag_tensor_f32(p->x), *w = ag_tensor_f32(p->w), *dy = ag_tensor_f32(p->dy);
    int M = p->M, in = p->in, out = p->out;
    double best = 1e30, total = 0, t;
    int run = 0;
    do {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, out, in, 1, x, in, w, in, 0, y,
                    out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, in, out, 1, dy, out, w, in, 1,
                    p->dx, in);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, M, 1, dy, out, x, in, 1,
                    p->dw, in);
        t = now() - t0;
    } while (again(run++, t, &best, &total));
    return gflops(p, best);
}

static double time_op(const problem *p, ag_tape *tp) {
    double best = 1e30, total = 0, t;
    int run = 0;
    do {
        ag_tape_reset(tp);
        double t0 = now();
        ag_tensor *y = ag_linear(tp, p->x, p->w, p->b);
        double forward = now() - t0;
        ag_backward_with(tp, y, p->dy);  // untimed: allocates and seeds dY
        t0 = now();
        y->node->op->backward(y->node);
        t = forward + (now() - t0);
    } while (again(run++, t, &best, &total));
    return gflops(p, best);
}

static double time_tape(const problem *p, ag_tape *tp) {
    double best = 1e30, total = 0, t;
    int run = 0;
    do {
        double t0 = now();
        ag_tape_reset(tp);
        ag_tensor *y = ag_linear(tp, p->x, p->w, p->b);
        ag_backward_with(tp, y, p->dy);
        t = now() - t0;
    } while (again(run++, t, &best, &total));
    return gflops(p, best);
}

int main(void) {
    const int shapes[][3] = {{2112, 64, 64}, {4096, 512, 512}, {4096, 512, 2048}};
    ag_tape *tp = ag_tape_new();  // also pins OpenBLAS to one thread
    printf("ag_linear f32 forward+backward, GFLOP/s (6*M*in*out flop, best run)\n");
    printf("%5s %4s %4s | %7s %7s %7s | %7s %7s %7s\n", "M", "in", "out", "sgemm1", "op1",
           "tape1", "sgemm2", "op2", "tape2");
    for (int s = 0; s < 3; s++) {
        problem p = make_problem(shapes[s][0], shapes[s][1], shapes[s][2]);
        float *y = malloc((size_t)p.M * p.out * sizeof(float));
        double g[2][3];
        for (int threads = 1; threads <= 2; threads++) {
            openblas_set_num_threads(threads);
            g[threads - 1][0] = time_sgemm(&p, y);
            openblas_set_num_threads(1);  // attograd's own threads only
            ag_threads_set(threads);
            g[threads - 1][1] = time_op(&p, tp);
            g[threads - 1][2] = time_tape(&p, tp);
            ag_threads_set(1);
        }
        printf("%5d %4d %4d | %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f\n", p.M, p.in, p.out,
               g[0][0], g[0][1], g[0][2], g[1][0], g[1][1], g[1][2]);
        fflush(stdout);
        free(y);
        free_problem(&p);
    }
    ag_tape_free(tp);
    return 0;
}
