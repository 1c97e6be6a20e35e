// The elementwise ops of a training step in f32, forward and backward, at 1 and 2 threads,
// against the memory bandwidth measured in the same run: GELU (erf and tanh), ReLU,
// dropout, add (a broadcast bias and same-shape), LayerNorm with weight and bias, and
// cross-entropy over rows of 256 classes (tiny_lm's bytes) and of 11 (the copy task).
// These ops do little arithmetic per element, so memory bounds them, and the share of a
// plain loop's bandwidth they reach is their efficiency.
//
// Bandwidth: a plain scaled copy y = s * x (STREAM's "scale": read N floats, write N) over
// tensors of the size the ops use, on as many threads as the op (two threads split the
// range in halves, claimed as the library's pool claims its slices). It is
// measured next to every op, run by run: a share is the op's rate over the copy's in the
// same run (milliseconds apart, so both saw about the same load), and the table prints the
// median share of RUNS runs after a warm-up run, next to the median GB/s of op and copy.
//
// Bytes counted, per element of the op's [rows, cols] input (what the op must read and
// write; a small operand that stays in cache, such as a bias or LayerNorm's weight, is not
// counted; dx += ... reads and writes dx):
//   GELU, ReLU        forward x, y: 8                  backward x, dy, dx: 16
//   dropout           forward x, y, mask bit: 8.125    backward dy, mask bit, dx: 12.125
//   add [R,C] + [C]   forward a, y: 8                  backward dy, da: 12
//   add [R,C] + [R,C] forward a, b, y: 12              backward dy, da, db: 20
//   LayerNorm         forward x, y: 8                  backward x, dy, dx: 16
//   cross-entropy     forward logits: 4                backward logits, dx: 12
// and per row, both ways (forward writes, backward reads): the statistics the op saves for
// its backward (LayerNorm's mean and 1/std, 16 bytes; cross-entropy's max and 1/sum, 8 bytes)
// and cross-entropy's target, 4 bytes. Those are 0.06 to 0.05 bytes per element over rows of
// 256, but 1.1 per logit over rows of 11 classes, where leaving them out would undercount the
// forward's traffic by a fifth. (The copy of the targets that ag_cross_entropy keeps on the
// tape is not charged: another design could do without it.) The copy's y is written without
// being read, yet the cache reads each line of it first; dx += ... reads its lines anyway. So
// the copy moves 12 bytes for the 8 counted, and a backward that updates dx can pass 100%.
// Backward runs the node's backward alone, its buffers allocated, after a copy that has
// pushed them out of the caches (as the forward finds its input after the timed copy).
//
//   bench_elementwise            every op
//   bench_elementwise NAME...    the ops whose names start with one of NAME
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC), semaphores

#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attograd.h"

enum { ROWS = 32768, COLS = 256, RUNS = 11 };
#define N ((size_t)ROWS * COLS)  // elements of every op's input (8M floats, 32 MB)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- The plain copy, on one or two threads -----------------------------------------------
// Two threads split the range in halves, claimed by whichever thread comes first, as the
// library's pool does: a helper that is slow to wake (the machine is shared) never holds
// the copy up, the caller copies both halves instead.

static struct {
    const float *x;
    float *y;
    sem_t go;
    atomic_int next, done;
    atomic_bool quit;
} copy;

// Compiled for the same instruction sets as the library's multiversioned loops, so that the
// reference is as fast a plain loop as the ops get.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
static void copy_range(size_t lo, size_t hi) {
    const float *restrict x = copy.x;
    float *restrict y = copy.y;
    for (size_t i = lo; i < hi; i++) y[i] = 1.0001f * x[i];
}

static void copy_halves(void) {
    for (int half; (half = atomic_fetch_add(&copy.next, 1)) < 2;) {
        copy_range(half * (N / 2), half ? N : N / 2);
        atomic_fetch_add(&copy.done, 1);
    }
}

static void *copy_helper(void *arg) {
    (void)arg;
    for (;;) {
        sem_wait(&copy.go);
        if (atomic_load(&copy.quit)) return NULL;
        copy_halves();
    }
}

// Seconds for one copy of N floats.
static double copy_seconds(int threads) {
    double t = now();
    if (threads == 1) {
        copy_range(0, N);
    } else {
        atomic_store(&copy.done, 0);
        atomic_store(&copy.next, 0);
        sem_post(&copy.go);
        copy_halves();
        while (atomic_load(&copy.done) < 2) sched_yield();
    }
    return now() - t;
}

// ---- The ops -------------------------------------------------------------------------------

typedef enum {
    GELU_ERF, GELU_TANH, RELU, DROPOUT, ADD_BIAS, ADD_SAME, LAYERNORM, CE_256, CE_11, N_OPS
} op_id;

static const struct {
    const char *name;
    double fwd, bwd;  // bytes per input element
    int cols;         // the input is [N / cols, cols]
} ops[N_OPS] = {
    {"gelu_erf", 8, 16, COLS},      {"gelu_tanh", 8, 16, COLS},
    {"relu", 8, 16, COLS},          {"dropout_0.1", 8.125, 12.125, COLS},
    {"add_bias", 8, 12, COLS},      {"add_same", 12, 20, COLS},
    {"layernorm", 8, 16, COLS},     {"cross_entropy_256", 4, 12, 256},
    {"cross_entropy_11", 4, 12, 11},
};

typedef struct {
    ag_tensor *x, *other, *w, *b, *ce_x;
    int32_t *targets;
    int ce_rows;
} inputs;

static ag_tensor *run(ag_tape *tp, op_id op, const inputs *in) {
    switch (op) {
    case GELU_ERF: return ag_gelu(tp, in->x, AG_GELU_ERF);
    case GELU_TANH: return ag_gelu(tp, in->x, AG_GELU_TANH);
    case RELU: return ag_relu(tp, in->x);
    case DROPOUT: return ag_dropout(tp, in->x, 0.1, true, 1, 2);
    case ADD_BIAS: return ag_add(tp, in->x, in->b);
    case ADD_SAME: return ag_add(tp, in->x, in->other);
    case LAYERNORM: return ag_layernorm(tp, in->x, in->w, in->b, 1e-5);
    default: return ag_cross_entropy(tp, in->ce_x, in->targets, (size_t)in->ce_rows, -100);
    }
}

// The logits of a cross-entropy case: [N / C, C], with one target per row.
static void make_logits(inputs *in, int C, ag_pcg32 *rng) {
    ag_tensor_free(in->ce_x);
    free(in->targets);
    in->ce_rows = (int)(N / (size_t)C);
    in->ce_x = ag_tensor_uniform(AG_F32, 2, (int[]){in->ce_rows, C}, rng, -3, 3);
    ag_tensor_set_requires_grad(in->ce_x, true);
    in->targets = malloc((size_t)in->ce_rows * sizeof *in->targets);
    for (int r = 0; r < in->ce_rows; r++) in->targets[r] = (int32_t)ag_pcg32_bounded(rng, (uint32_t)C);
}

static bool wanted(const char *name, int argc, char **argv) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; i++)
        if (strncmp(name, argv[i], strlen(argv[i])) == 0) return true;
    return false;
}

int main(int argc, char **argv) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    inputs in = {0};
    in.x = ag_tensor_uniform(AG_F32, 2, (int[]){ROWS, COLS}, &rng, -3, 3);
    in.other = ag_tensor_uniform(AG_F32, 2, (int[]){ROWS, COLS}, &rng, -3, 3);
    in.w = ag_tensor_uniform(AG_F32, 1, (int[]){COLS}, &rng, 0.5, 1.5);
    in.b = ag_tensor_uniform(AG_F32, 1, (int[]){COLS}, &rng, -1, 1);
    ag_tensor *const trained[] = {in.x, in.other, in.w, in.b};
    for (int k = 0; k < 4; k++) ag_tensor_set_requires_grad(trained[k], true);
    // The copy's own buffers: it never warms an op's tensors in the caches.
    ag_tensor *cx = ag_tensor_uniform(AG_F32, 2, (int[]){ROWS, COLS}, &rng, -3, 3);
    ag_tensor *cy = ag_tensor_zeros(AG_F32, 2, (int[]){ROWS, COLS});
    copy.x = ag_tensor_f32(cx);
    copy.y = ag_tensor_f32(cy);
    sem_init(&copy.go, 0, 0);
    pthread_t helper;
    if (pthread_create(&helper, NULL, copy_helper, NULL) != 0) {
        fprintf(stderr, "bench_elementwise: cannot start the copy's second thread\n");
        return 1;
    }

    printf("f32, every op on %zu elements (%.0f MB per tensor); medians of %d runs; share =\n"
           "the op's GB/s over the copy's (y = s * x) on as many threads in the same run\n\n",
           N, 4.0 * (double)N / 1e6, RUNS);
    printf("%-18s %3s | %8s | %8s %6s | %8s %6s\n", "op", "thr", "copy", "forward", "share",
           "backward", "share");
    printf("%-18s %3s | %8s | %8s %6s | %8s %6s\n", "", "", "GB/s", "GB/s", "", "GB/s", "");
    for (int op = 0; op < N_OPS; op++) {
        if (!wanted(ops[op].name, argc, argv)) continue;
        if (op >= CE_256) make_logits(&in, ops[op].cols, &rng);
        const double rows = (double)(N / (size_t)ops[op].cols);
        // Per row: cross-entropy's target and {max, 1/sum}, LayerNorm's {mean, 1/std}.
        const double row_bytes = op >= CE_256 ? 12 * rows : op == LAYERNORM ? 16 * rows : 0;
        for (int threads = 1; threads <= 2; threads++) {
            ag_threads_set(threads);
            ag_tape *tp = ag_tape_new();
            double tc[RUNS], tf[RUNS], tb[RUNS];
            for (int r = -1; r < RUNS; r++) {  // run -1 warms up
                double c = copy_seconds(threads);
                ag_tape_reset(tp);
                double t = now();
                ag_tensor *out = run(tp, (op_id)op, &in);
                double f = now() - t;
                ag_backward_with(tp, out, out);  // allocates the gradients (untimed)
                ag_node *nd = ag_tape_node(tp, ag_tape_num_nodes(tp) - 1);
                copy_seconds(threads);  // untimed: leaves the op's tensors out of cache
                t = now();
                nd->op->backward(nd);
                double b = now() - t;
                if (r >= 0) tc[r] = c, tf[r] = f, tb[r] = b;
            }
            ag_tape_free(tp);
            // Shares run by run (op and copy a few milliseconds apart), then their median.
            const double fb = ops[op].fwd * (double)N + row_bytes, bb = ops[op].bwd * (double)N + row_bytes;
            double fshare[RUNS], bshare[RUNS];
            for (int r = 0; r < RUNS; r++) {
                fshare[r] = fb / tf[r] / (8.0 * (double)N / tc[r]);
                bshare[r] = bb / tb[r] / (8.0 * (double)N / tc[r]);
            }
            printf("%-18s %3d | %8.1f | %8.1f %5.0f%% | %8.1f %5.0f%%\n", ops[op].name, threads,
                   8.0 * (double)N / median(tc, RUNS) / 1e9, fb / median(tf, RUNS) / 1e9,
                   100 * median(fshare, RUNS), bb / median(tb, RUNS) / 1e9, 100 * median(bshare, RUNS));
            fflush(stdout);
        }
    }
    ag_threads_set(1);
    atomic_store(&copy.quit, true);
    sem_post(&copy.go);
    pthread_join(helper, NULL);
    sem_destroy(&copy.go);
    ag_tensor_free(in.x), ag_tensor_free(in.other), ag_tensor_free(in.w), ag_tensor_free(in.b);
    ag_tensor_free(in.ce_x), ag_tensor_free(cx), ag_tensor_free(cy);
    free(in.targets);
    return 0;
}
