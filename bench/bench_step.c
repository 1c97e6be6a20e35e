// One training step of the copy-task demo's model, phase by phase, on 1 and 2
// threads: token + position embedding, causal MultiheadAttention, residual,
// LayerNorm, linear head, cross-entropy, backward, Adam. B = 64 sequences of
// T = 32 positions, d_model 64, 4 heads, vocabulary 11 (examples/copy_task).
//
// Each phase's time is the median over STEPS steps (after WARMUP steps), with
// the 1- and 2-thread configurations interleaved round by round, since the
// machine may be shared; "step" is the median of whole steps.
#define _POSIX_C_SOURCE 200809L  // clock_gettime

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attograd.h"

enum { B = 64, T = 32, E = 64, H = 4, V = 11, WARMUP = 5, STEPS = 60, ROUNDS = 3 };
enum { FORWARD, BACKWARD, OPTIM, STEP, PHASES };
static const char *phase_names[PHASES] = {"forward", "backward", "optimizer", "step"};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    ag_params *ps;
    ag_embedding_layer tok, pos;
    ag_mha attn;
    ag_layernorm_layer norm;
    ag_linear_layer head;
    ag_optim *opt;
    int32_t ids[B * T], targets[B * T], positions[T];
} model;

static void model_init(model *m) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    m->ps = ag_params_new(AG_F32);
    ag_mha_config mc = {.embed_dim = E, .num_heads = H};
    ag_embedding_layer_init(&m->tok, m->ps, "tok.", V, E, &rng);
    ag_embedding_layer_init(&m->pos, m->ps, "pos.", T, E, &rng);
    ag_mha_init(&m->attn, m->ps, "attn.", &mc, &rng);
    ag_layernorm_layer_init(&m->norm, m->ps, "norm.", E);
    ag_linear_layer_init(&m->head, m->ps, "head.", E, V, true, &rng);
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    m->opt = ag_optim_new(m->ps, &oc);
    for (int i = 0; i < B * T; i++) {
        m->ids[i] = (int32_t)ag_pcg32_bounded(&rng, V);
        m->targets[i] = i % T >= T / 2 ? (int32_t)ag_pcg32_bounded(&rng, V) : -100;
    }
    for (int t = 0; t < T; t++) m->positions[t] = t;
}

// One step; adds each phase's seconds to times[].
static void step(ag_tape *tp, model *m, double times[PHASES]) {
    double t0 = now();
    ag_tape_reset(tp);
    ag_params_zero_grad(m->ps);
    ag_tensor *x = ag_add(tp, ag_embedding_layer_forward(tp, &m->tok, m->ids, 2, (int[]){B, T}),
                          ag_embedding_layer_forward(tp, &m->pos, m->positions, 1, (int[]){T}));
    ag_mha_opts o = {.causal = true};
    x = ag_layernorm_layer_forward(tp, &m->norm,
                                   ag_add(tp, x, ag_mha_forward(tp, &m->attn, x, x, x, &o, NULL)));
    ag_tensor *loss = ag_cross_entropy(tp, ag_linear_layer_forward(tp, &m->head, x), m->targets, B * T, -100);
    double t1 = now();
    ag_backward(tp, loss);
    double t2 = now();
    ag_optim_step(m->opt);
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
    model m[2];
    ag_tape *tp[2];
    for (int k = 0; k < 2; k++) {
        model_init(&m[k]);
        tp[k] = ag_tape_new();
    }
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 0; k < 2; k++) {
            ag_set_num_threads(k + 1);
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
        ag_params_free(m[k].ps);
    }
    return 0;
}
