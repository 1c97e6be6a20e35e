// One training step of the copy-task demo's model: token + position embedding, causal
// MultiheadAttention, residual, LayerNorm, linear head, cross-entropy, backward, Adam.
// B = 64 sequences of T = 32 positions, d_model 64, 4 heads, vocabulary 11: the model of
// examples/copy_task (model.c, linked, not copied) with one layer. Three ways:
//   1 thread              the plain step (phase by phase)
//   2 threads, ops        the plain step, each large op split over the threads
//   2 threads, batch      ag_data_parallel_step: each thread the forward and backward
//                         of half the batch on its own tape, gradients added in order
// The step's products are 3 (8 B T E^2 + 4 B T^2 E) + 6 B T E V flop (forward once,
// backward twice); "%peak" is the share of the f32 FMA peak (bench/peak.h) of 1 or 2
// threads measured in the same run that the step's products reach. Times are medians
// over STEPS steps per round, the three ways taking turns for ROUNDS rounds, since the
// machine may be shared.
#define _POSIX_C_SOURCE 200809L  // clock_gettime

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attograd.h"
#include "model.h"  // examples/copy_task: the model itself
#include "peak.h"

enum { B = 64, T = 32, E = 64, H = 4, V = 11, WARMUP = 5, STEPS = 60, ROUNDS = 3 };
enum { FORWARD, BACKWARD, OPTIM, STEP, PHASES };
static const char *phase_names[PHASES] = {"forward", "backward", "optimizer", "step"};
enum { ONE, OPS2, BATCH2, WAYS };
static const char *way_names[WAYS] = {"1 thread", "2 threads, ops", "2 threads, batch"};

typedef struct {
    model net;
    ag_optim *opt;
    ag_data_parallel *dp;
    int32_t ids[B * T], targets[B * T];
} run;

static void run_init(run *r) {
    model_config cfg = {.vocab = V, .d_model = E, .heads = H, .layers = 1, .max_len = T};
    model_init(&r->net, &cfg, AG_F32, 1);
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    r->opt = ag_optim_new(r->net.ps, &oc);
    r->dp = ag_data_parallel_new(r->net.ps);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    for (int i = 0; i < B * T; i++) {
        r->ids[i] = (int32_t)ag_pcg32_bounded(&rng, V);
        r->targets[i] = i % T >= T / 2 ? (int32_t)ag_pcg32_bounded(&rng, V) : AG_IGNORE_INDEX;
    }
}

// The loss of sequences [begin, end), weighted by their counted targets.
static ag_tensor *loss_of(ag_tape *tp, int begin, int end, void *user, double *weight) {
    run *r = user;
    model_input in = {.B = end - begin, .T = T, .ids = r->ids + begin * T};
    int counted = 0;
    for (int i = begin * T; i < end * T; i++) counted += r->targets[i] != AG_IGNORE_INDEX;
    *weight = counted;
    return ag_cross_entropy(tp, model_forward(tp, &r->net, &in, NULL), r->targets + begin * T,
                            (size_t)(end - begin) * T, AG_IGNORE_INDEX);
}

// One plain step; sets each phase's seconds in times[].
static void step(ag_tape *tp, run *r, double times[PHASES]) {
    double t0 = now();
    ag_tape_reset(tp);
    ag_params_zero_grad(r->net.ps);
    double w;
    ag_tensor *loss = loss_of(tp, 0, B, r, &w);
    double t1 = now();
    ag_backward(tp, loss);
    double t2 = now();
    ag_optim_step(r->opt);
    double t3 = now();
    times[FORWARD] = t1 - t0;
    times[BACKWARD] = t2 - t1;
    times[OPTIM] = t3 - t2;
    times[STEP] = t3 - t0;
}

static void batch_step(run *r, double times[PHASES]) {
    double t0 = now();
    ag_params_zero_grad(r->net.ps);
    ag_data_parallel_step(r->dp, B, loss_of, r);
    double t1 = now();
    ag_optim_step(r->opt);
    double t2 = now();
    times[FORWARD] = times[BACKWARD] = NAN;
    times[OPTIM] = t2 - t1;
    times[STEP] = t2 - t0;
}

int main(void) {
    static double samples[WAYS][PHASES][ROUNDS * STEPS];
    static run m[WAYS];
    ag_tape *tp[WAYS];
    for (int k = 0; k < WAYS; k++) {
        run_init(&m[k]);
        tp[k] = ag_tape_new();
    }
    const double ceiling[WAYS] = {peak_gflops(PEAK_F32, 1), peak_gflops(PEAK_F32, 2), 0};
    int n = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 0; k < WAYS; k++) {
            ag_threads_set(k == ONE ? 1 : 2);
            double times[PHASES];
            for (int s = 0; s < WARMUP + STEPS; s++) {
                if (k == BATCH2)
                    batch_step(&m[k], times);
                else
                    step(tp[k], &m[k], times);
                if (s >= WARMUP)
                    for (int p = 0; p < PHASES; p++)
                        samples[k][p][round * STEPS + s - WARMUP] = times[p];
            }
        }
        n += STEPS;
    }
    const double flop = 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E) + 6.0 * B * T * E * V;
    printf("copy-task training step (B=%d T=%d E=%d h=%d V=%d, f32, %.0f MFLOP of products), "
           "median ms over %d steps\n", B, T, E, H, V, flop * 1e-6, n);
    printf("f32 FMA peak: %.1f GFLOP/s on 1 thread, %.1f on 2; load %s\n", ceiling[ONE],
           ceiling[OPS2], load_average());
    printf("%-18s %9s %9s %9s %9s | %8s %10s %8s\n", "", phase_names[0], phase_names[1],
           phase_names[2], phase_names[3], "GFLOP/s", "%peak", "speedup");
    double one = 0;
    for (int k = 0; k < WAYS; k++) {
        double med[PHASES];
        for (int p = 0; p < PHASES; p++) {
            qsort(samples[k][p], (size_t)n, sizeof(double), timing_by_value);
            med[p] = samples[k][p][n / 2];
        }
        if (k == ONE) one = med[STEP];
        const double c = k == ONE ? ceiling[ONE] : ceiling[OPS2];
        printf("%-18s", way_names[k]);
        for (int p = 0; p < PHASES; p++)
            if (isnan(med[p]))
                printf(" %9s", "-");
            else
                printf(" %9.3f", 1e3 * med[p]);
        printf(" | %8.1f %9.0f%% %7.2fx\n", flop / med[STEP] * 1e-9,
               100 * flop / med[STEP] * 1e-9 / c, one / med[STEP]);
    }
    for (int k = 0; k < WAYS; k++) {
        ag_tape_free(tp[k]);
        ag_data_parallel_free(m[k].dp);
        ag_optim_free(m[k].opt);
        model_free(&m[k].net);
    }
    return 0;
}
