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

// One training step's batch: B sequences of T token ids over `vocab` symbols, each
// position's target drawn too, the first `unscored` positions of a sequence ignored.
enum { MAX_TOKENS = 64 * 32 };

typedef struct {
    const char *name;
    int B, T;
    int32_t ids[MAX_TOKENS], targets[MAX_TOKENS];
    // The model's logits [B, T, vocab] for ids, on tp.
    ag_tensor *(*logits)(ag_tape *tp, const void *model, const int32_t *ids, int B, int T);
    const void *model;
} graph;

static void draw_batch(graph *g, int vocab, int unscored, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 5);
    for (int i = 0; i < g->B * g->T; i++) {
        g->ids[i] = (int32_t)(ag_pcg32_next(&rng) % (uint32_t)vocab);
        int32_t t = (int32_t)(ag_pcg32_next(&rng) % (uint32_t)vocab);
        g->targets[i] = i % g->T < unscored ? AG_IGNORE_INDEX : t;
    }
}

static ag_tensor *loss_of(ag_tape *tp, const graph *g) {
    return ag_cross_entropy(tp, g->logits(tp, g->model, g->ids, g->B, g->T), g->targets,
                            (size_t)(g->B * g->T), AG_IGNORE_INDEX);
}

// The copy task: d_model 64, 4 heads, 1 layer, batch 64 of 32 positions, the first half
// of each sequence not scored.
static ag_tensor *copy_logits(ag_tape *tp, const void *m, const int32_t *ids, int B, int T) {
    model_input in = {.B = B, .T = T, .ids = ids, .training = true, .dropout_seed = 9};
    return model_forward(tp, m, &in, NULL);
}

// tiny_lm: ctx 64, d_model 64, 4 heads, 4 pre-LN blocks, ff 256, dropout 0.1, batch 32.
static ag_tensor *lm_logits(ag_tape *tp, const void *m, const int32_t *ids, int B, int T) {
    return lm_forward(tp, m, ids, B, T, true, 7);
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
            ag_backward(tp, loss_of(tp, gr));
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
        model_config mc = {.vocab = 12, .d_model = 64, .heads = 4, .layers = 1, .max_len = 64};
        lm_config lc = {.ctx = 64, .d_model = 64, .heads = 4, .layers = 4, .ff = 0,
                        .pos = AG_POS_NONE, .dropout = 0.1, .f64 = dt == AG_F64};
        model copy_model;
        lm lm_model;
        graph *g = calloc(2, sizeof *g);
        if (!g || !model_init(&copy_model, &mc, dt, 1) || !lm_init(&lm_model, &lc, 3)) return 1;
        g[0] = (graph){dt == AG_F32 ? "copy task, f32" : "copy task, f64", 64, 32, {0}, {0},
                       copy_logits, &copy_model};
        g[1] = (graph){dt == AG_F32 ? "tiny_lm, f32" : "tiny_lm, f64", 32, 64, {0}, {0},
                       lm_logits, &lm_model};
        draw_batch(&g[0], mc.vocab, 16, 4);
        draw_batch(&g[1], LM_VOCAB, 0, 8);
        for (int i = 0; i < 2; i++) measure(&g[i], rounds);
        model_free(&copy_model);
        lm_free(&lm_model);
        free(g);
    }
    return 0;
}
