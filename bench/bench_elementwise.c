// The elementwise ops in f32 against the memory bandwidth measured in the same
// run: each op's bytes moved per second as a share of what a plain scaled copy
// (y = s * x, STREAM's "scale") achieves on buffers of the same size.
//
// Bytes counted per element: GELU and ReLU forward read x and write y (8);
// backward read x and dy and update dx (16). Dropout forward reads x and writes
// y (8, plus 1 bit of mask); backward reads dy and updates dx (12). LayerNorm
// forward reads x and writes y (8); cross-entropy forward reads the logits (4).
// Each figure is the best of several runs (the machine may be shared).
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC)

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attograd.h"

enum { ROWS = 32768, COLS = 256, RUNS = 9 };
#define N ((size_t)ROWS * COLS)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double copy_bandwidth(const float *x, float *y) {
    double best = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t = now();
        for (size_t i = 0; i < N; i++) y[i] = 1.0001f * x[i];
        t = now() - t;
        if (t < best) best = t;
    }
    return 8.0 * (double)N / best;
}

typedef enum { GELU_ERF, GELU_TANH, RELU, DROPOUT, LAYERNORM, CROSS_ENTROPY, N_OPS } op_id;
static const char *names[N_OPS] = {"gelu (erf)", "gelu (tanh)", "relu", "dropout 0.1",
                                   "layernorm", "cross_entropy"};
static const double fwd_bytes[N_OPS] = {8, 8, 8, 8, 8, 4}, bwd_bytes[N_OPS] = {16, 16, 16, 12, 0, 0};

static ag_tensor *run(ag_tape *tp, op_id op, ag_tensor *x, ag_tensor *w, ag_tensor *b,
                      const int32_t *targets) {
    switch (op) {
    case GELU_ERF: return ag_gelu(tp, x, AG_GELU_ERF);
    case GELU_TANH: return ag_gelu(tp, x, AG_GELU_TANH);
    case RELU: return ag_relu(tp, x);
    case DROPOUT: return ag_dropout(tp, x, 0.1, true, 1, 2);
    case LAYERNORM: return ag_layernorm(tp, x, w, b, 1e-5);
    default: return ag_cross_entropy(tp, x, targets, ROWS, -100);
    }
}

int main(void) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_tensor *x = ag_tensor_uniform(AG_F32, 2, (int[]){ROWS, COLS}, &rng, -3, 3);
    ag_tensor *w = ag_tensor_ones(AG_F32, 1, (int[]){COLS}), *b = ag_tensor_new(AG_F32, 1, (int[]){COLS});
    ag_tensor *y = ag_tensor_new(AG_F32, 2, (int[]){ROWS, COLS});
    int32_t *targets = malloc(ROWS * sizeof *targets);
    for (int r = 0; r < ROWS; r++) targets[r] = (int32_t)ag_pcg32_bounded(&rng, COLS);
    ag_tensor_set_requires_grad(x, true);
    double bw = copy_bandwidth(ag_tensor_f32(x), ag_tensor_f32(y));
    printf("f32 [%d, %d] (%.0f MB per tensor); bandwidth of y = s * x on one thread: %.1f GB/s\n",
           ROWS, COLS, 4.0 * (double)N / 1e6, bw / 1e9);
    printf("%-14s %8s | %12s %6s | %12s %6s\n", "op", "threads", "forward GB/s", "% bw",
           "backward GB/s", "% bw");
    for (int threads = 1; threads <= 2; threads++) {
        ag_set_num_threads(threads);
        for (int op = 0; op < N_OPS; op++) {
            ag_tape *tp = ag_tape_new();
            double fbest = 1e30, bbest = 1e30;
            for (int r = 0; r < RUNS; r++) {
                ag_tape_reset(tp);
                double t = now();
                ag_tensor *out = run(tp, (op_id)op, x, w, b, targets);
                t = now() - t;
                if (t < fbest) fbest = t;
                if (bwd_bytes[op] == 0) continue;
                ag_backward_with(tp, out, out);  // allocates the gradients (untimed)
                ag_node *nd = ag_tape_node(tp, ag_tape_num_nodes(tp) - 1);
                t = now();
                nd->op->backward(nd);
                t = now() - t;
                if (t < bbest) bbest = t;
                ag_tape_reset(tp);
            }
            double f = fwd_bytes[op] * (double)N / fbest;
            printf("%-14s %8d | %12.1f %5.0f%% |", names[op], threads, f / 1e9, 100 * f / bw);
            if (bwd_bytes[op] > 0) {
                double g = bwd_bytes[op] * (double)N / bbest;
                printf(" %12.1f %5.0f%%\n", g / 1e9, 100 * g / bw);
            } else {
                printf(" %12s %6s\n", "-", "-");
            }
            ag_tape_free(tp);
        }
    }
    ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(b), ag_tensor_free(y);
    free(targets);
    return 0;
}
