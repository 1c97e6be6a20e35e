// The cost of ag_tape_check against one forward and backward of the graph it checks: the
// copy-task model and tiny_lm at their examples' default shapes, in f32 (checked through
// the f64 twins) and in f64, at the default and the strict settings. Rounds interleave
// the step and the checks; prints the medians and their ratios, by the wall clock and by
// the process's CPU time (everything here runs on one thread, so on a shared machine the
// CPU time is the steadier of the two).
//
//     bench_tape_check [rounds]     (default 5; one thread, as the examples' default)
#define _POSIX_C_SOURCE 200809L  // clock_gettime (timing.h)
#include <stdio.h>
#include <string.h>

#include "../examples/copy_task/model.h"
#include "../examples/tiny_lm/model.c"
#include "timing.h"

enum { MAX_ROUNDS = TIMING_MAX_RUNS };

typedef struct {
    const char *name;
    ag_dtype dt;
    // Builds the loss of one training step on tp.
    ag_tensor *(*loss)(ag_tape *tp, void *model);
    void *model;
} graph;

// ---- The copy task: d_model 64, 4 heads, 1 layer, batch 64 of 32 positions -----------
typedef struct {
    model m;
    int32_t ids[64 * 32], targets[64 * 32];
} copy_graph;

static ag_tensor *copy_loss(ag_tape *tp, void *p) {
    copy_graph *g = p;
    model_input in = {.B = 64, .T = 32, .ids = g->ids, .training = true, .dropout_seed = 9};
    return ag_cross_entropy(tp, model_forward(tp, &g->m, &in, NULL), g->targets, 64 * 32,
                            AG_IGNORE_INDEX);
}

static bool copy_init(copy_graph *g, ag_dtype dt) {
    model_config cfg = {.vocab = 12, .d_model = 64, .heads = 4, .layers = 1, .max_len = 64};
    ag_pcg32 rng = ag_pcg32_make(4, 5);
    for (int i = 0; i < 64 * 32; i++) {
        g->ids[i] = (int32_t)(ag_pcg32_next(&rng) % 12);
        // The copy task scores only the second half of each sequence.
        int32_t t = (int32_t)(ag_pcg32_next(&rng) % 12);
        g->targets[i] = i % 32 < 16 ? AG_IGNORE_INDEX : t;
    }
    return model_init(&g->m, &cfg, dt, 1);
}

// ---- tiny_lm: ctx 64, d_model 64, 4 heads, 4 pre-LN blocks, ff 256, dropout 0.1, batch 32
typedef struct {
    lm m;
    int32_t ids[32 * 64], targets[32 * 64];
} lm_graph;

static ag_tensor *lm_loss(ag_tape *tp, void *p) {
    lm_graph *g = p;
    ag_tensor *logits = lm_forward(tp, &g->m, g->ids, 32, 64, true, 7);
    return ag_cross_entropy(tp, logits, g->targets, 32 * 64, AG_IGNORE_INDEX);
}

static bool lm_graph_init(lm_graph *g, ag_dtype dt) {
    lm_config cfg = {.ctx = 64, .d_model = 64, .heads = 4, .layers = 4, .ff = 0,
                     .pos = AG_POS_NONE, .dropout = 0.1, .f64 = dt == AG_F64};
    ag_pcg32 rng = ag_pcg32_make(8, 9);
    for (int i = 0; i < 32 * 64; i++) {
        g->ids[i] = (int32_t)(ag_pcg32_next(&rng) % LM_VOCAB);
        g->targets[i] = (int32_t)(ag_pcg32_next(&rng) % LM_VOCAB);
    }
    return lm_init(&g->m, &cfg, 3);
}

static void add(timings *r, double t) {
    if (r->n < TIMING_MAX_RUNS) r->t[r->n++] = t;
}

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// One graph: rounds of (steps, the default check, the strict check).
static void measure(const graph *gr, int rounds) {
    ag_tape *tp = ag_tape_new();
    timings step = {0}, def = {0}, strict = {0}, cpu_step = {0}, cpu_def = {0}, cpu_strict = {0};
    long runs[2] = {0, 0};
    int nodes = 0;
    ag_check_verdict verdict[2] = {AG_CHECK_PASS, AG_CHECK_PASS};
    for (int round = 0; round <= rounds; round++) {  // round 0 warms up
        for (int s = 0; s < 5; s++) {
            ag_tape_reset(tp);
            double t0 = now(), c0 = cpu_now();
            ag_backward(tp, gr->loss(tp, gr->model));
            double t = now() - t0, c = cpu_now() - c0;
            if (round > 0) {
                add(&step, t);
                add(&cpu_step, c);
            }
        }
        for (int k = 0; k < 2; k++) {
            ag_tape_check_opts o = k ? ag_tape_check_strict() : ag_tape_check_defaults();
            ag_tape_check_report r;
            double t0 = now(), c0 = cpu_now();
            ag_tape_check(tp, &o, &r);
            double t = now() - t0, c = cpu_now() - c0;
            if (round > 0) {
                add(k ? &strict : &def, t);
                add(k ? &cpu_strict : &cpu_def, c);
            }
            runs[k] = r.forward_runs;
            nodes = r.n_nodes;
            verdict[k] = r.verdict;
            if (getenv("AG_SHOW_TAPE_CHECK") && round == 1) ag_tape_check_print(&r, stdout);
            ag_tape_check_report_free(&r);
        }
    }
    double ts = median(&step), td = median(&def), tt = median(&strict);
    double cs = median(&cpu_step), cd = median(&cpu_def), ct = median(&cpu_strict);
    printf("%-16s %5d %8.2f %8.1f %6.1fx %6.1fx %5ld %-5s %8.1f %6.1fx %6.1fx %5ld %s\n",
           gr->name, nodes, 1e3 * ts, 1e3 * td, td / ts, cd / cs, runs[0],
           ag_check_verdict_name(verdict[0]), 1e3 * tt, tt / ts, ct / cs, runs[1],
           ag_check_verdict_name(verdict[1]));
    fflush(stdout);
    ag_tape_free(tp);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    if (rounds < 1 || rounds >= MAX_ROUNDS / 5) {
        fprintf(stderr, "bench_tape_check: rounds must be 1 to %d, got %s\n",
                MAX_ROUNDS / 5 - 1, argv[1]);
        return 2;
    }
    ag_threads_set(1);
    printf("ag_tape_check against one forward + backward (medians of %d rounds; ratios by the "
           "wall clock and by CPU time)\n", rounds);
    printf("%-16s %5s %8s %8s %7s %7s %5s %-5s %8s %7s %7s %5s %s\n", "graph", "nodes",
           "step ms", "check ms", "wall", "cpu", "runs", "", "strict", "wall", "cpu", "runs", "");
    printf("%-16s %5s %8s %8s %7s %7s %5s %-5s %8s %7s %7s %5s %s\n", "", "", "", "default",
           "x step", "x step", "", "", "ms", "x step", "x step", "", "");
    for (ag_dtype dt = AG_F32; dt <= AG_F64; dt++) {
        copy_graph *cg = calloc(1, sizeof *cg);
        lm_graph *lg = calloc(1, sizeof *lg);
        if (!cg || !lg || !copy_init(cg, dt) || !lm_graph_init(lg, dt)) return 1;
        graph graphs[] = {
            {dt == AG_F32 ? "copy task, f32" : "copy task, f64", dt, copy_loss, cg},
            {dt == AG_F32 ? "tiny_lm, f32" : "tiny_lm, f64", dt, lm_loss, lg},
        };
        for (int i = 0; i < 2; i++) measure(&graphs[i], rounds);
        model_free(&cg->m);
        lm_free(&lg->m);
        free(cg);
        free(lg);
    }
    return 0;
}
