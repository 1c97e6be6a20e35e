// The GPT-2-size training step of tiny_lm's model (examples/tiny_lm/model.c, linked, not
// copied): 12 pre-LN blocks of width 768, 12 heads, context 256, a batch of 4, bytes,
// the head tied to the embedding, no dropout; cross-entropy, backward, clipping and
// AdamW. In f32 and under autocast (bf16 products), the two taking turns step by step
// in one process so that a busy machine slows both alike; each phase's median.
//
// Products, forward once and backward twice, per token: 24 E^2 a layer (q, k, v, out
// and the two feed-forward layers) + 4 T E (the attention's two products, counted whole
// although causal) and 2 E 256 for the head: 552 GFLOP a step, "%peak" of the f32 FMA
// peak measured in the same run (the share the bf16 step reaches of the f32 peak is
// above 100% when it runs faster than f32 can).
//
//   bench_gpt2_step [--cpu] [--steps N] [--threads T] [--split batch|ops]
// --cpu (one thread) times the thread's CPU time, for a busy machine. With 2 threads
// the step runs as tiny_lm --threads 2 runs it (ag_data_parallel: each thread half the
// batch), and only the whole step is timed; --split ops runs it on one tape instead, each
// op split over the threads (the bits of one thread's step).
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"  // examples/tiny_lm
#include "peak.h"

enum { E = 768, H = 12, L = 12, T = 256, B = 4, WARMUP = 2 };
enum { FORWARD, BACKWARD, OPTIM, STEP, PHASES };
static const char *const phase_names[PHASES] = {"forward", "backward", "optimizer", "step"};
enum { MODES = 2 };
static const char *const mode_names[MODES] = {"f32", "bf16 (autocast)"};

typedef struct {
    const lm *m;
    const int32_t *ids, *targets;
    ag_autocast mode;
} batch;

static ag_tensor *loss_of(ag_tape *tp, int begin, int end, void *user, double *weight) {
    const batch *b = user;
    ag_tape_set_autocast(tp, b->mode);
    *weight = (double)(end - begin) * T;
    ag_tensor *logits = lm_forward(tp, b->m, b->ids + (size_t)begin * T, end - begin, T, false, 0);
    return ag_cross_entropy(tp, logits, b->targets + (size_t)begin * T, (size_t)(end - begin) * T,
                            -1);
}

// One step; its phases' seconds in t[] (forward and backward NAN when data-parallel).
static void step(ag_tape *tp, ag_data_parallel *dp, ag_optim *opt, lm *m, batch *b,
                 bool by_batch, double t[PHASES]) {
    const double t0 = now();
    ag_params_zero_grad(m->ps);
    double t1 = t0, t2;
    if (!by_batch) {
        ag_tape_reset(tp);
        double w;
        ag_tensor *loss = loss_of(tp, 0, B, b, &w);
        t1 = now();
        ag_backward(tp, loss);
        t2 = now();
        t[FORWARD] = t1 - t0;
        t[BACKWARD] = t2 - t1;
    } else {
        ag_data_parallel_step(dp, B, loss_of, b);
        t2 = now();
        t[FORWARD] = t[BACKWARD] = NAN;
    }
    ag_params_clip_grad_norm(m->ps, 1.0);
    ag_optim_step(opt);
    const double t3 = now();
    t[OPTIM] = t3 - t2;
    t[STEP] = t3 - t0;
}

int main(int argc, char **argv) {
    int steps = 5, threads = 1;
    bool split_ops = false;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--cpu") == 0) {
            timing_clock = CLOCK_THREAD_CPUTIME_ID;
        } else if (a + 1 < argc && strcmp(argv[a], "--steps") == 0) {
            steps = atoi(argv[++a]);
        } else if (a + 1 < argc && strcmp(argv[a], "--threads") == 0) {
            threads = atoi(argv[++a]);
        } else if (a + 1 < argc && strcmp(argv[a], "--split") == 0 &&
                   (strcmp(argv[a + 1], "batch") == 0 || strcmp(argv[a + 1], "ops") == 0)) {
            split_ops = strcmp(argv[++a], "ops") == 0;
        } else {
            fprintf(stderr, "usage: bench_gpt2_step [--cpu] [--steps N] [--threads T] "
                            "[--split batch|ops]\n");
            return 2;
        }
    }
    if (steps < 1 || steps > 1000 || threads < 1 ||
        (timing_clock != CLOCK_MONOTONIC && threads != 1)) {
        fprintf(stderr, "bench_gpt2_step: steps 1..1000, threads >= 1, --cpu with one thread\n");
        return 2;
    }
    ag_threads_set(threads);
    lm_config cfg = {.ctx = T, .d_model = E, .heads = H, .layers = L, .pos = AG_POS_NONE};
    lm m;
    if (!lm_init(&m, &cfg, 1)) return 1;
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    ag_optim *opt = ag_optim_new(m.ps, &oc);
    ag_data_parallel *dp = ag_data_parallel_new(m.ps);
    int32_t *ids = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)ag_pcg32_bounded(&rng, 256);
        targets[i] = (int32_t)ag_pcg32_bounded(&rng, 256);
    }
    ag_tape *tp[MODES] = {ag_tape_new(), ag_tape_new()};
    const double peak = peak_gflops(PEAK_F32, threads);
    static double samples[MODES][PHASES][1000];
    for (int s = 0; s < WARMUP + steps; s++)
        for (int k = 0; k < MODES; k++) {
            batch b = {&m, ids, targets, k ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF};
            double t[PHASES];
            step(tp[k], dp, opt, &m, &b, threads > 1 && !split_ops, t);
            if (s >= WARMUP)
                for (int p = 0; p < PHASES; p++) samples[k][p][s - WARMUP] = t[p];
        }
    const double flop = 3.0 * B * T * (L * (24.0 * E * E + 4.0 * T * E) + 2.0 * E * 256);
    printf("GPT-2-size step (tiny_lm's model, E %d, %d heads, %d layers, T %d, batch %d), %d "
           "thread%s%s, %s time, median of %d steps; f32 peak %.1f GFLOP/s; load %s\n",
           E, H, L, T, B, threads, threads > 1 ? "s" : "",
           threads == 1 ? "" : split_ops ? " (each op split)" : " (the batch split)",
           timing_clock == CLOCK_MONOTONIC ? "wall" : "CPU", steps, peak, load_average());
    printf("%-16s %10s %10s %10s %10s | %7s\n", "", phase_names[0], phase_names[1],
           phase_names[2], phase_names[3], "%peak");
    double med[MODES][PHASES];
    for (int k = 0; k < MODES; k++) {
        printf("%-16s", mode_names[k]);
        for (int p = 0; p < PHASES; p++) {
            qsort(samples[k][p], (size_t)steps, sizeof(double), timing_by_value);
            med[k][p] = samples[k][p][steps / 2];
            if (isnan(med[k][p]))
                printf(" %10s", "-");
            else
                printf(" %8.3f s", med[k][p]);
        }
        printf(" | %6.0f%%\n", 100 * flop / med[k][STEP] * 1e-9 / peak);
    }
    printf("bf16 / f32: %.2fx the speed of the step\n", med[0][STEP] / med[1][STEP]);
    for (int k = 0; k < MODES; k++) ag_tape_free(tp[k]);
    ag_data_parallel_free(dp);
    ag_optim_free(opt);
    lm_free(&m);
    free(ids), free(targets);
    return 0;
}
