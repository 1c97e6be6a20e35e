// MultiheadAttention (self-attention, f32) forward + backward: the composed attention
// (ag_matmul -> ag_softmax -> ag_matmul, which stores [B, h, T, T] weights and their
// gradients) against the fused ag_attention (which stores a logsumexp per query) in its
// three layouts, on 1 and 2 threads. bench/pytorch_mha.py prints torch.nn.
// MultiheadAttention's numbers on the same shapes in the same format.
//
// Every path computes the module (src/nn/mha.c) on the same weights: q, k, v
// projections, attention with scale 1/sqrt(d) per head, output projection; the input x
// requires grad, as it would inside a model. The paths, spelled out here with the ops:
//   composed  3 projections, split_heads, matmul, softmax, matmul, merge_heads
//             (ag_mha_forward when asked for the weights)
//   split     3 projections, split_heads, ag_attention on [B, h, T, d], merge_heads
//             (ag_mha_forward's fused path before it read heads in place)
//   inside    3 projections, ag_attention on [B, T, E] with opts heads (no copies:
//             ag_mha_forward when query, key and value differ)
//   packed    1 projection with the [3E, E] weight, ag_attention_packed
//             (ag_mha_forward for self-attention)
//
// Flop count (the products only): the 4 projections, 2 B T E^2 each, and the two
// attention products, 2 B T^2 E each, once forward and twice backward:
//     3 (8 B T E^2 + 4 B T^2 E).
// The ceiling is the f32 FMA peak of 1 and 2 threads (bench/peak.h), measured in the same
// run; "%peak" is the share of it. Each time is the median of at least MIN_RUNS steps after a
// warm-up step (more for small shapes, until MIN_SECONDS have been timed), since the
// machine may be shared. "tape MB" is the tape arena's peak
// (ag_tape_usage().bytes_peak) over the steps.
//
//   bench_mha [--cpu] [--path P] [B T E h [threads]]
//       the shapes of the speed table (or one shape), every path or path P (composed,
//       split, inside, packed), on threads 1 and 2 (or the given count); --cpu (one
//       thread) times the thread's CPU time, for a busy machine
//   bench_mha --pos SCHEME B T E h [threads]
//       the fused "inside" path with a position scheme (none, relative, t5, alibi, rope,
//       sinusoidal, in any case, or all; relative: M = 128; t5: 32 buckets, max_distance
//       128; both bidirectional; rope: q and k rotated inside the attention; sinusoidal:
//       D = head_dim), its time and tape peak against the plain fused path, the schemes
//       taking turns over rounds
#define _POSIX_C_SOURCE 200809L  // clock_gettime(CLOCK_MONOTONIC)

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "attograd.h"
#include "peak.h"
#include "schemes.h"

#define MIN_RUNS 5
#define MIN_SECONDS 1.0

typedef enum { COMPOSED, SPLIT, INSIDE, PACKED, PATHS } path;
static const char *const path_names[PATHS] = {"composed", "split", "inside", "packed"};

typedef struct {
    int B, T, E, h;
    ag_tensor *x, *dy;
    ag_tensor *w[4], *b[4];  // q, k, v and output projections, [E, E] and [E]
    ag_tensor *w_in, *b_in;  // w[0..2] and b[0..2] stacked: [3E, E] and [3E]
    ag_pos_bias pos;         // for the fused paths
} problem;

static const char *pos_names[SCHEMES_MOST];  // schemes.h
static int schemes;

static void name_schemes(void) { schemes = schemes_list(pos_names); }

// The position bias `kind` for p's heads (a fixed random table for relative and t5).
static ag_pos_bias make_pos(int h, int d, ag_pos_kind kind) {
    ag_pos_bias pos = {kind, NULL, 0, 0, true, 0, 0, 0};
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    if (kind == AG_POS_RELATIVE) {
        pos.max_distance = 128;
        pos.table = ag_tensor_uniform(AG_F32, 2, (int[]){h, 2 * 128 + 1}, &rng, -1, 1);
    } else if (kind == AG_POS_T5) {
        pos.num_buckets = 32;
        pos.max_distance = 128;
        pos.table = ag_tensor_uniform(AG_F32, 2, (int[]){h, 32}, &rng, -1, 1);
    } else if (kind == AG_POS_ALIBI) {
        pos.heads = h;
    } else if (kind == AG_POS_SINUSOIDAL) {
        pos.heads = h;
        pos.dims = d;
    }
    if (pos.table) ag_tensor_set_requires_grad(pos.table, true);
    return pos;
}

// t[0], t[1] and t[2] stacked along the first dim (a copy), requiring grad.
static ag_tensor *stack3(ag_tensor *const t[3]) {
    int shape[2] = {3 * t[0]->shape[0], t[0]->ndim > 1 ? t[0]->shape[1] : 1};
    ag_tensor *s = ag_tensor_zeros(AG_F32, t[0]->ndim, shape);
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < t[i]->numel; e++)
            ag_tensor_set_item(s, (size_t)i * t[i]->numel + e, ag_tensor_item(t[i], e));
    ag_tensor_set_requires_grad(s, true);
    return s;
}

static problem make_problem(int B, int T, int E, int h) {
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    problem p = {B, T, E, h, NULL, NULL, {NULL}, {NULL}, NULL, NULL, {0}};
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
    p.w_in = stack3(p.w);
    p.b_in = stack3(p.b);
    return p;
}

static void free_problem(problem *p) {
    ag_tensor_free(p->x);
    ag_tensor_free(p->dy);
    for (int i = 0; i < 4; i++) {
        ag_tensor_free(p->w[i]);
        ag_tensor_free(p->b[i]);
    }
    ag_tensor_free(p->w_in);
    ag_tensor_free(p->b_in);
    ag_tensor_free(p->pos.table);
}

// One training step's forward and backward; returns its time in seconds.
static double step(ag_tape *tp, const problem *p, path how) {
    double t0 = now();
    ag_tape_reset(tp);
    ag_tensor_zero_grad(p->x);
    ag_tensor_zero_grad(p->w_in);
    ag_tensor_zero_grad(p->b_in);
    for (int i = 0; i < 4; i++) {
        ag_tensor_zero_grad(p->w[i]);
        ag_tensor_zero_grad(p->b[i]);
    }
    ag_tensor *x = p->x, *ctx;  // ctx: [B, T, E], the heads side by side
    if (p->pos.table) ag_tensor_zero_grad(p->pos.table);
    ag_attention_opts o = {.softmax = {.scale = 1.0 / sqrt((double)(p->E / p->h)),
                                       .pos = p->pos.kind == AG_POS_ROPE ? (ag_pos_bias){0}
                                                                         : p->pos},
                           .heads = p->h, .rope = p->pos.kind == AG_POS_ROPE};
    if (how == PACKED) {
        ctx = ag_attention_packed(tp, ag_linear(tp, x, p->w_in, p->b_in), &o);
    } else {
        ag_tensor *qkv[3];
        for (int i = 0; i < 3; i++) qkv[i] = ag_linear(tp, x, p->w[i], p->b[i]);
        if (how == INSIDE) {
            ctx = ag_attention(tp, qkv[0], qkv[1], qkv[2], &o);
        } else {
            for (int i = 0; i < 3; i++) qkv[i] = ag_split_heads(tp, qkv[i], p->h);
            ag_tensor *heads;
            if (how == SPLIT) {
                heads = ag_attention(tp, qkv[0], qkv[1], qkv[2], &o);
            } else {
                ag_tensor *scores = ag_matmul(tp, qkv[0], qkv[1], false, true);
                heads = ag_matmul(tp, ag_softmax(tp, scores, &o.softmax), qkv[2], false, false);
            }
            ctx = ag_merge_heads(tp, heads);
        }
    }
    ag_tensor *y = ag_linear(tp, ctx, p->w[3], p->b[3]);
    ag_backward_with(tp, y, p->dy);
    return now() - t0;
}

typedef struct {
    double ms, gflops;
    size_t tape_peak;
} result;

static result measure(const problem *p, path how, int threads) {
    ag_threads_set(threads);
    ag_tape *tp = ag_tape_new();
    timings times = {{0}, 0, 0};
    double t;
    int run = 0;
    do t = step(tp, p, how);
    while (again(run++, t, &times, MIN_RUNS, MIN_SECONDS));
    const double best = median(&times);
    result r;
    r.ms = 1e3 * best;
    double B = p->B, T = p->T, E = p->E;
    r.gflops = 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E) / best * 1e-9;
    r.tape_peak = ag_tape_usage(tp).bytes_peak;
    ag_tape_free(tp);
    ag_threads_set(1);
    return r;
}

static void print_row(const problem *p, const char *name, int threads, result r,
                      const double ceiling[3]) {
    printf("%3d %5d %4d %2d | %-10s %3d | %9.2f %8.1f %6.0f%% | %9.1f\n", p->B, p->T, p->E,
           p->h, name, threads, r.ms, r.gflops, 100 * r.gflops / ceiling[threads],
           r.tape_peak / 1048576.0);
    fflush(stdout);
}

// The fused inside path with each position scheme asked for, against the plain one.
// The schemes take turns, ROUNDS times, and each keeps the median of its rounds, so that
// a slow spell of a shared machine does not land on one scheme only.
enum { ROUNDS = 3 };

static void compare_positions(problem *p, int threads, const char *which,
                              const double ceiling[3]) {
    bool on[SCHEMES_MOST];
    ag_pos_bias pos[SCHEMES_MOST];
    timings ms[SCHEMES_MOST];
    size_t peak[SCHEMES_MOST];
    for (int k = 0; k < schemes; k++) {
        on[k] = k == AG_POS_NONE || schemes_takes(which, k);
        pos[k] = make_pos(p->h, p->E / p->h, (ag_pos_kind)k);
        ms[k] = (timings){{0}, 0, 0};
    }
    for (int round = 0; round < ROUNDS; round++)
        for (int k = 0; k < schemes; k++) {
            if (!on[k]) continue;
            p->pos = pos[k];
            result r = measure(p, INSIDE, threads);
            ms[k].t[ms[k].n++] = r.ms;
            peak[k] = r.tape_peak;
        }
    p->pos = (ag_pos_bias){0};
    double plain = 0;
    for (int k = 0; k < schemes; k++) {
        if (on[k]) {
            result r = {median(&ms[k]), 0, peak[k]};
            double B = p->B, T = p->T, E = p->E;
            r.gflops = 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E) / (r.ms * 1e-3) * 1e-9;
            print_row(p, pos_names[k], threads, r, ceiling);
            if (k == AG_POS_NONE)
                plain = r.ms;
            else
                printf("    %s: time %+.1f%%, tape peak %+.1f%% against the plain fused path\n",
                       pos_names[k], 100 * (r.ms / plain - 1),
                       100 * ((double)peak[k] / (double)peak[AG_POS_NONE] - 1));
        }
        ag_tensor_free(pos[k].table);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: bench_mha [--cpu] [--path composed|split|inside|packed] [B T E h [threads]]\n"
                    "       bench_mha --pos ");
    schemes_print(stderr);
    fprintf(stderr, "all B T E h [threads]\n"
                    "       (E a multiple of h; threads 1 or 2, both when not given; --cpu: the\n"
                    "       thread's CPU time, with threads 1)\n");
    return 2;
}

int main(int argc, char **argv) {
    // B, T, E, h: the speed table's shapes; the first is the copy-task demo's.
    const int shapes[][4] = {{64, 32, 64, 4},   {32, 64, 128, 4},  {16, 128, 256, 8},
                             {8, 512, 512, 8},  {1, 2048, 512, 8}, {1, 4096, 256, 4}};
    int one[4] = {0}, threads_only = 0, path_only = -1;
    const char *pos = NULL;
    int a = 1;
    for (; a < argc && strcmp(argv[a], "--cpu") == 0; a++) timing_clock = CLOCK_THREAD_CPUTIME_ID;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (strcmp(argv[a], "--pos") == 0) {
            pos = argv[a + 1];
        } else if (strcmp(argv[a], "--path") == 0) {
            for (int k = 0; k < PATHS; k++)
                if (strcmp(argv[a + 1], path_names[k]) == 0) path_only = k;
            if (path_only < 0) return usage();
        } else {
            return usage();
        }
    }
    const int rest = argc - a;
    if (rest != 0 && rest != 4 && rest != 5) return usage();
    for (int i = 0; i < 4 && rest; i++) one[i] = atoi(argv[a + i]);
    if (rest == 5) threads_only = atoi(argv[a + 4]);
    if ((rest && (one[0] < 1 || one[1] < 1 || one[2] < 1 || one[3] < 1 || one[2] % one[3])) ||
        threads_only < 0 || threads_only > 2 || (pos && !rest) ||
        (timing_clock != CLOCK_MONOTONIC && threads_only != 1))
        return usage();
    bool known = !pos || strcmp(pos, "all") == 0;
    name_schemes();
    for (int k = 0; k < schemes && pos; k++) known |= schemes_takes(pos, k);
    if (!known) {
        fprintf(stderr, "bench_mha: unknown position scheme '%s'\n", pos);
        return 2;
    }
    ag_tape_free(ag_tape_new());  // pins OpenBLAS to one thread
    double ceiling[3] = {0, peak_gflops(PEAK_F32, 1), peak_gflops(PEAK_F32, 2)};
    printf("MultiheadAttention f32 forward+backward, self-attention, no mask, no dropout\n");
    printf("GFLOP/s over 3*(8 B T E^2 + 4 B T^2 E) flop; %%peak of the f32 FMA peak: "
           "%.1f GFLOP/s (1 thread), %.1f (2 threads); times are medians; load %s\n",
           ceiling[1], ceiling[2], load_average());
    printf("%3s %5s %4s %2s | %-10s %3s | %9s %8s %7s | %9s\n", "B", "T", "E", "h", "path",
           "thr", "ms/step", "GFLOP/s", "%peak", "tape MB");
    const int n_shapes = rest ? 1 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < n_shapes; s++) {
        const int *sh = rest ? one : shapes[s];
        problem p = make_problem(sh[0], sh[1], sh[2], sh[3]);
        for (int threads = 1; threads <= 2 && pos; threads++)
            if (!threads_only || threads == threads_only)
                compare_positions(&p, threads, pos, ceiling);
        for (int how = 0; how < PATHS && !pos; how++) {
            if (path_only >= 0 && how != path_only) continue;
            result r[3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
            for (int threads = 1; threads <= 2; threads++) {
                if (threads_only && threads != threads_only) continue;
                r[threads] = measure(&p, (path)how, threads);
                print_row(&p, path_names[how], threads, r[threads], ceiling);
            }
            if (!threads_only && r[2].ms > r[1].ms) printf("    ^ two threads slower than one\n");
        }
        free_problem(&p);
    }
    return 0;
}
