// One training step of the copy-task demo's model, phase by phase, on 1 and 2
// threads: token + position embedding, causal MultiheadAttention, residual,
// LayerNorm, linear head, cross-entropy, backward, Adam. B = 64 sequences of
// T = 32 positions, d_model 64, 4 heads, vocabulary 11: the model of
// examples/copy_task (model.c, linked, not copied) with one layer.
//
// Each phase's time is the median over STEPS steps (after WARMUP steps), with
// the 1- and 2-thread configurations interleaved round by round, since the
// machine may be shared; "step" is the median of whole steps.
#define _POSIX_C_SOURCE 200809L  // clock_gettime

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attograd.h"
#include "model.h"  // examples/copy_task: the model itself

enum { B = 64, T = 32, E = 64, H = 4, V = 11, WARMUP = 5, STEPS = 60, ROUNDS = 3 };
enum { FORWARD, BACKWARD, OPTIM, STEP, PHASES };
static const char *phase_names[PHASES] = {"forward", "backward", "optimizer", "step"};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    model net;
    ag_optim *opt;
    int32_t ids[B * T], targets[B * T];
} run;

static void run_init(run *r) {
    model_config cfg = {.vocab = V, .d_model = E, .heads = H, .layers = 1, .max_len = T};
    model_init(&r->net, &cfg, AG_F32, 1);
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    r->opt = ag_optim_new(r->net.ps, &oc);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    for (int i = 0; i < B * T; i++) {
        r->ids[i] = (int32_t)ag_pcg32_bounded(&rng, V);
        r->targets[i] = i % T >= T / 2 ? (int32_t)ag_pcg32_bounded(&rng, V) : AG_IGNORE_INDEX;
    }
}

// One step; sets each phase's seconds in times[].
static void step(ag_tape *tp, run *r, double times[PHASES]) {
    double t0 = now();
    ag_tape_reset(tp);
    ag_params_zero_grad(r->net.ps);
    model_input in = {.B = B, .T = T, .ids = r->ids};
    ag_tensor *loss =
        ag_cross_entropy(tp, model_forward(tp, &r->net, &in, NULL), r->targets,
                         (size_t)B * T, AG_IGNORE_INDEX);
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

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    static double samples[2][PHASES][ROUNDS * STEPS];
    int n = 0;
    static run m[2];
    ag_tape *tp[2];
    for (int k = 0; k < 2; k++) {
        run_init(&m[k]);
        tp[k] = ag_tape_new();
    }
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 0; k < 2; k++) {
            ag_threads_set(k + 1);
            double times[PHASES];
            for (int s = 0; s < WARMUP; s++) step(tp[k], &m[k], times);
            for (int s = 0; s < STEPS; s++) {
                step(tp[k], &m[k], times);
                for (int p = 0; p < PHASES; p++) samples[k][p][round * STEPS + s] = times[p];
            }
        }
        n += STEPS;
    }
    printf("copy-task training step (B=%d T=%d E=%d h=%d V=%d, f32), median ms over %d steps\n",
           B, T, E, H, V, n);
    printf("%-10s %10s %10s\n", "phase", "1 thread", "2 threads");
    for (int p = 0; p < PHASES; p++) {
        double med[2];
        for (int k = 0; k < 2; k++) {
            qsort(samples[k][p], (size_t)n, sizeof(double), compare);
            med[k] = samples[k][p][n / 2];
        }
        printf("%-10s %10.3f %10.3f\n", phase_names[p], 1e3 * med[0], 1e3 * med[1]);
    }
    for (int k = 0; k < 2; k++) {
        ag_tape_free(tp[k]);
        ag_optim_free(m[k].opt);
        model_free(&m[k].net);
    }
    return 0;
}
