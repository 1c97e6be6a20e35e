// Position bias (RELATIVE, T5, ALiBi), mask polarity and broadcast masks in ag_softmax and
// the fused ag_attention (issue 11), and the rotary embedding ag_rope: the fused op
// equals the composed ops (matmul, softmax, matmul) in every layout, forward and every
// gradient (the table's and a broadcast additive mask's included); float64 gradient
// checks; float32 against float64; KEEPS polarity = BLOCKS on the inverted mask; a
// broadcast mask = its expansion; bit-identical reruns on two threads; no heap
// allocation on a repeated step; no T x S buffer; one-line errors; q_offset near INT_MAX;
// more heads than score slices, up to INT_MAX.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "op_checks.h"
#include "../src/ops/op.h"
#include "../src/ops/pos.h"

typedef struct {
    int B, h, T, S, d;
    ag_pos_kind kind;
    int M, buckets, maxd;  // RELATIVE: M; T5: buckets, maxd
    bool bidir, causal;
    int add_nd, add_shape[4];    // additive mask (requires grad); add_nd 0: none
    int mask_nd, mask_shape[4];  // bool mask; 0: none
    bool kpm, keeps;
} pcase;

typedef struct {
    pcase c;
    ag_tensor *mask, *kpm;  // bool, owned
    int table, add;         // input index of the table and the additive mask, or -1
    bool inside;            // q, k, v are [B, T, h*d]
} problem;

static ag_pos_bias pos_of(const pcase *c, ag_tensor *table) {
    ag_pos_bias p = {c->kind, table, c->kind == AG_POS_T5 ? c->maxd : c->M, c->buckets,
                     c->bidir, c->kind == AG_POS_ALIBI ? c->h : 0, 0, 0};
    return p;
}

static ag_softmax_opts opts_of(const problem *p, ag_tensor *const in[]) {
    const pcase *c = &p->c;
    ag_softmax_opts o = {.scale = 0.45, .causal = c->causal, .mask = p->mask,
                         .additive_mask = p->add >= 0 ? in[p->add] : NULL,
                         .key_padding_mask = p->kpm,
                         .mask_polarity = c->keeps ? AG_MASK_KEEPS : AG_MASK_BLOCKS,
                         .pos = pos_of(c, p->table >= 0 ? in[p->table] : NULL)};
    return o;
}

static ag_tensor *fused_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const problem *p = user;
    ag_attention_opts o = {.softmax = opts_of(p, in), .heads = p->inside ? p->c.h : 0};
    return ag_attention(tp, in[0], in[1], in[2], &o);
}

static ag_tensor *composed_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const problem *p = user;
    ag_softmax_opts o = opts_of(p, in);
    ag_tensor *q = in[0], *k = in[1], *v = in[2];
    if (p->inside) {
        q = ag_split_heads(tp, q, p->c.h);
        k = ag_split_heads(tp, k, p->c.h);
        v = ag_split_heads(tp, v, p->c.h);
    }
    ag_tensor *w = ag_softmax(tp, ag_matmul(tp, q, k, false, true), &o);
    ag_tensor *y = ag_matmul(tp, w, v, false, false);
    return p->inside ? ag_merge_heads(tp, y) : y;
}

// q, k, v (and the table and additive mask, requiring grad) in dtype dt; returns n.
static int make_inputs(problem *p, ag_dtype dt, bool inside, uint64_t seed, ag_tensor *in[5]) {
    const pcase *c = &p->c;
    p->inside = inside;
    if (inside) {
        in[0] = random_leaf(dt, 3, (int[]){c->B, c->T, c->h * c->d}, seed);
        in[1] = random_leaf(dt, 3, (int[]){c->B, c->S, c->h * c->d}, seed + 1);
        in[2] = random_leaf(dt, 3, (int[]){c->B, c->S, c->h * c->d}, seed + 2);
    } else {
        in[0] = random_leaf(dt, 4, (int[]){c->B, c->h, c->T, c->d}, seed);
        in[1] = random_leaf(dt, 4, (int[]){c->B, c->h, c->S, c->d}, seed + 1);
        in[2] = random_leaf(dt, 4, (int[]){c->B, c->h, c->S, c->d}, seed + 2);
    }
    int n = 3;
    p->table = p->add = -1;
    if (c->kind == AG_POS_RELATIVE || c->kind == AG_POS_T5) {
        int cols = c->kind == AG_POS_RELATIVE ? 2 * c->M + 1 : c->buckets;
        p->table = n;
        in[n++] = random_leaf(dt, 2, (int[]){c->h, cols}, seed + 3);
    }
    if (c->add_nd) {
        p->add = n;
        in[n++] = random_leaf(dt, c->add_nd, c->add_shape, seed + 4);
    }
    p->mask = c->mask_nd ? bool_mask(c->mask_nd, c->mask_shape, 0.3, seed + 5) : NULL;
    p->kpm = c->kpm ? bool_mask(2, (int[]){c->B, c->S}, 0.2, seed + 6) : NULL;
    return n;
}

static void free_inputs(problem *p, ag_tensor *in[], int n) {
    for (int i = 0; i < n; i++) ag_tensor_free(in[i]);
    ag_tensor_free(p->mask);
    ag_tensor_free(p->kpm);
    p->mask = p->kpm = NULL;
}

static const pcase cases[] = {
    // B h  T  S  d  kind             M  bkt maxd bidir causal add             mask
    {2, 3, 5, 7, 4, AG_POS_RELATIVE, 2, 0, 0, false, false, 0, {0}, 0, {0}, false, false},
    {2, 2, 6, 6, 3, AG_POS_RELATIVE, 3, 0, 0, false, true, 4, {2, 1, 1, 6}, 0, {0}, true, false},
    {1, 2, 12, 12, 3, AG_POS_T5, 0, 8, 10, true, false, 2, {12, 12}, 0, {0}, false, false},
    {2, 2, 9, 9, 3, AG_POS_T5, 0, 6, 8, false, true, 0, {0}, 4, {2, 1, 9, 9}, false, true},
    {1, 4, 6, 8, 3, AG_POS_ALIBI, 0, 0, 0, true, false, 3, {4, 6, 8}, 0, {0}, true, false},
    {2, 3, 7, 7, 2, AG_POS_ALIBI, 0, 0, 0, false, true, 0, {0}, 2, {7, 7}, false, true},
    {2, 2, 5, 6, 3, AG_POS_NONE, 0, 0, 0, false, false, 4, {1, 1, 5, 6}, 4, {2, 1, 1, 6}, true,
     true},
    {1, 1, 1, 1, 2, AG_POS_RELATIVE, 1, 0, 0, false, false, 0, {0}, 0, {0}, false, false},  // T=1
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

// Longer than a block (256) each way, so the bias crosses block boundaries and the
// online softmax rescales; one-wide heads keep it quick.
static const pcase long_cases[] = {
    {1, 2, 300, 520, 2, AG_POS_RELATIVE, 40, 0, 0, false, false, 4, {1, 1, 1, 520}, 0, {0}, false,
     false},
    {1, 2, 300, 300, 2, AG_POS_T5, 0, 32, 128, false, true, 0, {0}, 0, {0}, false, false},
    {1, 3, 280, 300, 2, AG_POS_ALIBI, 0, 0, 0, true, false, 0, {0}, 2, {280, 300}, true, false},
};

// Fused against composed: output and every input gradient, normwise.
static double fused_vs_composed(pcase c, ag_dtype dt, bool inside, uint64_t seed) {
    problem pa = {.c = c}, pb = {.c = c};
    ag_tensor *a[5], *b[5];
    int n = make_inputs(&pa, dt, inside, seed, a);
    make_inputs(&pb, dt, inside, seed, b);
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *ya = fused_fn(t1, a, n, &pa), *yb = composed_fn(t2, b, n, &pb);
    double worst = INFINITY;
    if (ya && yb) {
        ag_tensor *dy = uniform_tensor(dt, ya->ndim, ya->shape, 9, -1, 1);
        ag_backward_with(t1, ya, dy);
        ag_backward_with(t2, yb, dy);
        worst = normwise_error(ya, yb, false);
        for (int i = 0; i < n; i++) worst = fmax(worst, normwise_error(a[i], b[i], true));
        ag_tensor_free(dy);
    }
    ag_tape_free(t1);
    ag_tape_free(t2);
    free_inputs(&pa, a, n);
    free_inputs(&pb, b, n);
    return worst;
}

static void test_fused_equals_composed_for_each_scheme_and_mask(void) {
    for (int i = 0; i < N_CASES; i++)
        for (int inside = 0; inside <= 1; inside++) {
            double e = fused_vs_composed(cases[i], AG_F64, inside, 100 + (uint64_t)i);
            if (!(e <= 1e-12)) fprintf(stderr, "  case %d inside %d: %g\n", i, inside, e);
            CHECK(e <= 1e-12);
            e = fused_vs_composed(cases[i], AG_F32, inside, 100 + (uint64_t)i);
            CHECK(e <= 1e-5);
        }
}

static void test_fused_equals_composed_across_block_boundaries(void) {
    for (int i = 0; i < 3; i++) {
        double e = fused_vs_composed(long_cases[i], AG_F64, i == 2, 200 + (uint64_t)i);
        if (!(e <= 1e-12)) fprintf(stderr, "  long case %d: %g\n", i, e);
        CHECK(e <= 1e-12);
    }
}

static bool gradcheck(pcase c, bool inside, bool fused, uint64_t seed) {
    problem p = {.c = c};
    ag_tensor *in[5];
    int n = make_inputs(&p, AG_F64, inside, seed, in);
    bool ok = ag_gradcheck(fused ? fused_fn : composed_fn, in, n, &p, NULL, NULL);
    if (!ok) fprintf(stderr, "  gradcheck kind %d inside %d fused %d\n", c.kind, inside, fused);
    free_inputs(&p, in, n);
    return ok;
}

static void test_gradcheck_fused_with_table_and_mask_gradients(void) {
    for (int i = 0; i < N_CASES; i++) {
        CHECK(gradcheck(cases[i], false, true, 300 + (uint64_t)i));
        CHECK(gradcheck(cases[i], true, true, 310 + (uint64_t)i));
    }
}

static void test_gradcheck_composed_softmax_with_table_and_mask_gradients(void) {
    for (int i = 0; i < N_CASES; i++) CHECK(gradcheck(cases[i], false, false, 320 + (uint64_t)i));
}

static ag_tensor *packed_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const problem *p = user;
    ag_attention_opts o = {.softmax = opts_of(p, in), .heads = p->c.h};
    return ag_attention_packed(tp, in[0], &o);
}

static void test_gradcheck_packed_with_each_scheme(void) {
    const ag_pos_kind kinds[] = {AG_POS_RELATIVE, AG_POS_T5, AG_POS_ALIBI};
    for (int k = 0; k < 3; k++) {
        pcase c = {2, 2, 6, 6, 3, kinds[k], 2, 6, 8, k == 2, k == 1, 2, {6, 6}, 0, {0}, false,
                   false};
        problem p = {.c = c};
        p.inside = true;
        ag_tensor *in[3];
        in[0] = random_leaf(AG_F64, 3, (int[]){2, 6, 3 * 2 * 3}, 400 + (uint64_t)k);
        int n = 1;
        p.table = p.add = -1;
        if (k < 2) {
            p.table = n;
            in[n++] = random_leaf(AG_F64, 2, (int[]){2, k == 0 ? 5 : 6}, 410 + (uint64_t)k);
        }
        p.add = n;
        in[n++] = random_leaf(AG_F64, 2, (int[]){6, 6}, 420 + (uint64_t)k);
        CHECK(ag_gradcheck(packed_fn, in, n, &p, NULL, NULL));
        free_inputs(&p, in, n);
    }
}

static void test_float32_matches_float64(void) {
    for (int i = 0; i < N_CASES; i++) {
        problem p = {.c = cases[i]};
        ag_tensor *in[5];
        int n = make_inputs(&p, AG_F64, false, 500 + (uint64_t)i, in);
        CHECK(f32_vs_f64_error(fused_fn, in, n, &p) <= 1e-5);
        CHECK(f32_vs_f64_error(composed_fn, in, n, &p) <= 1e-5);
        free_inputs(&p, in, n);
    }
}

// Runs fn on in (gradients zeroed first), returns a heap copy of output and gradients.
static double *outputs(ag_fn fn, ag_tensor *const in[], int n, problem *p, size_t *len) {
    for (int i = 0; i < n; i++) ag_tensor_zero_grad(in[i]);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = fn(tp, in, n, p);
    ag_tensor *dy = uniform_tensor(y->dtype, y->ndim, y->shape, 7, -1, 1);
    ag_backward_with(tp, y, dy);
    size_t total = y->numel;
    for (int i = 0; i < n; i++) total += in[i]->numel;
    double *out = malloc(total * sizeof *out), *at = out;
    for (size_t k = 0; k < y->numel; k++) *at++ = ag_tensor_item(y, k);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < in[i]->numel; k++) *at++ = ag_tensor_grad_item(in[i], k);
    *len = total;
    ag_tensor_free(dy);
    ag_tape_free(tp);
    return out;
}

static void test_keeps_polarity_equals_blocks_on_the_inverted_masks(void) {
    for (int fused = 0; fused <= 1; fused++) {
        pcase c = cases[6];  // mask [2,1,1,6] and key padding, KEEPS
        problem p = {.c = c};
        ag_tensor *in[5];
        int n = make_inputs(&p, AG_F64, false, 600, in);
        size_t la, lb;
        double *a = outputs(fused ? fused_fn : composed_fn, in, n, &p, &la);
        p.c.keeps = false;
        for (size_t k = 0; k < p.mask->numel; k++) ((uint8_t *)p.mask->data)[k] ^= 1;
        for (size_t k = 0; k < p.kpm->numel; k++) ((uint8_t *)p.kpm->data)[k] ^= 1;
        double *b = outputs(fused ? fused_fn : composed_fn, in, n, &p, &lb);
        CHECK(la == lb && memcmp(a, b, la * sizeof *a) == 0);
        free(a);
        free(b);
        free_inputs(&p, in, n);
    }
}

// A broadcast mask gives what its expansion to [B, h, T, S] gives, and the broadcast
// additive mask's gradient is the expansion's summed over the broadcast dims.
static void test_broadcast_masks_equal_their_expansion(void) {
    const int B = 2, h = 3, T = 4, S = 5;
    const int shapes[][5] = {{4, B, 1, T, S}, {4, B, 1, 1, S}, {4, 1, 1, T, S}, {2, T, S, 0, 0},
                             {4, 1, h, T, S}, {1, S, 0, 0, 0}, {4, 1, h, 1, S}};
    for (int si = 0; si < 7; si++)
        for (int fused = 0; fused <= 1; fused++) {
            const int nd = shapes[si][0];
            const int *sh = shapes[si] + 1;
            pcase c = {B, h, T, S, 3, AG_POS_NONE, 0, 0, 0, false, false, nd, {0}, nd, {0},
                       false, false};
            memcpy(c.add_shape, sh, sizeof c.add_shape);
            memcpy(c.mask_shape, sh, sizeof c.mask_shape);
            problem p = {.c = c};
            ag_tensor *in[5];
            int n = make_inputs(&p, AG_F64, false, 700 + (uint64_t)si, in);
            // The expansions: element (b, hd, i, j) from the broadcast index.
            const int full[4] = {B, h, T, S};
            ag_tensor *add_x = requiring_grad(ag_tensor_zeros(AG_F64, 4, full));
            ag_tensor *mask_x = ag_tensor_zeros(AG_BOOL, 4, full);
            size_t src_of[2 * 3 * 4 * 5];
            for (size_t e = 0; e < add_x->numel; e++) {
                size_t rest = e, src = 0, stride = 1;
                for (int dim = 3, md = nd - 1; dim >= 0; dim--, md--) {
                    const size_t idx = rest % (size_t)full[dim];
                    rest /= (size_t)full[dim];
                    if (md < 0) continue;
                    if (sh[md] > 1) src += idx * stride;
                    stride *= (size_t)sh[md];
                }
                src_of[e] = src;
                ag_tensor_set_item(add_x, e, ag_tensor_item(in[p.add], src));
                ((uint8_t *)mask_x->data)[e] = ((uint8_t *)p.mask->data)[src];
            }
            size_t la, lb;
            double *a = outputs(fused ? fused_fn : composed_fn, in, n, &p, &la);
            ag_tensor *bcast = in[p.add], *bmask = p.mask;
            in[p.add] = add_x;
            p.mask = mask_x;
            double *b = outputs(fused ? fused_fn : composed_fn, in, n, &p, &lb);
            // Output and q, k, v gradients first, then the mask gradient.
            size_t qkv = 0;
            for (int i = 0; i < 3; i++) qkv += in[i]->numel;
            const size_t y = (size_t)B * h * T * 3;
            normwise e = {0, 0};
            for (size_t k = 0; k < y + qkv; k++) normwise_add(&e, a[k], b[k]);
            CHECK(normwise_result(e) <= 1e-13);
            double *summed = calloc(bcast->numel, sizeof *summed);
            for (size_t k = 0; k < add_x->numel; k++) summed[src_of[k]] += b[y + qkv + k];
            normwise g = {0, 0};
            for (size_t k = 0; k < bcast->numel; k++) normwise_add(&g, a[y + qkv + k], summed[k]);
            if (!(normwise_result(g) <= 1e-13))
                fprintf(stderr, "  shape %d fused %d: mask gradient differs by %g\n", si, fused,
                        normwise_result(g));
            CHECK(normwise_result(g) <= 1e-13);
            free(summed);
            free(a);
            free(b);
            in[p.add] = bcast;
            p.mask = bmask;
            ag_tensor_free(add_x);
            ag_tensor_free(mask_x);
            free_inputs(&p, in, n);
        }
}

static void test_two_threads_are_bit_identical_run_to_run(void) {
    ag_threads_set(2);
    for (int i = 0; i < 3; i++) {
        problem p = {.c = long_cases[i]};
        ag_tensor *in[5];
        int n = make_inputs(&p, AG_F32, i == 2, 800 + (uint64_t)i, in);
        size_t la, lb;
        double *a = outputs(fused_fn, in, n, &p, &la), *b = outputs(fused_fn, in, n, &p, &lb);
        CHECK(la == lb && memcmp(a, b, la * sizeof *a) == 0);
        free(a);
        free(b);
        free_inputs(&p, in, n);
    }
    ag_threads_set(1);
}

typedef struct {
    problem p;
    ag_tensor **in;
    int n;
} step_ctx;

static void step(ag_tape *tp, int s, void *user) {
    (void)s;
    step_ctx *x = user;
    for (int i = 0; i < x->n; i++) ag_tensor_zero_grad(x->in[i]);
    ag_backward(tp, ag_sum(tp, fused_fn(tp, x->in, x->n, &x->p)));
    ag_backward(tp, ag_sum(tp, composed_fn(tp, x->in, x->n, &x->p)));
}

static void test_repeated_step_allocates_no_heap_memory(void) {
    for (int i = 0; i < N_CASES; i++) {
        step_ctx x = {.p = {.c = cases[i]}};
        ag_tensor *in[5];
        x.n = make_inputs(&x.p, AG_F32, i % 2 == 1, 900 + (uint64_t)i, in);
        x.in = in;
        CHECK(repeated_step_allocates_nothing(step, &x));
        free_inputs(&x.p, in, x.n);
    }
}

// The tape's peak over one fused step (forward and backward) at T = S.
static size_t fused_peak(int T, ag_pos_kind kind) {
    pcase c = {1, 2, T, T, 16, kind, 64, 32, 128, false, true, 0, {0}, 0, {0}, false, false};
    problem p = {.c = c};
    ag_tensor *in[5];
    int n = make_inputs(&p, AG_F32, false, 950, in);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, fused_fn(tp, in, n, &p)));
    size_t peak = ag_tape_usage(tp).bytes_peak;
    ag_tape_free(tp);
    free_inputs(&p, in, n);
    return peak;
}

static void test_position_bias_stores_no_t_by_s_buffer(void) {
    ag_threads_set(2);
    const size_t plain = fused_peak(2048, AG_POS_NONE);
    const ag_pos_kind kinds[] = {AG_POS_RELATIVE, AG_POS_T5, AG_POS_ALIBI};
    for (int k = 0; k < 3; k++) {
        size_t with = fused_peak(2048, kinds[k]);
        if (!((double)with <= 1.1 * (double)plain))
            fprintf(stderr, "  kind %d: peak %zu vs plain %zu\n", kinds[k], with, plain);
        CHECK((double)with <= 1.1 * (double)plain);
    }
    ag_threads_set(1);
}

// ---- ag_rope ---------------------------------------------------------------------------

static ag_tensor *rope_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ag_rope(tp, in[0], user);
}

static void test_rope_gradcheck_and_float32_in_both_layouts(void) {
    ag_rope_opts apart = {.base = 100, .pos_offset = 2}, inside = {.pos_offset = 5, .heads = 3};
    ag_tensor *x4 = random_leaf(AG_F64, 4, (int[]){2, 3, 5, 6}, 1000);
    ag_tensor *x3 = random_leaf(AG_F64, 3, (int[]){2, 5, 3 * 4}, 1001);
    CHECK(ag_gradcheck(rope_fn, &x4, 1, &apart, NULL, NULL));
    CHECK(ag_gradcheck(rope_fn, &x3, 1, &inside, NULL, NULL));
    CHECK(f32_vs_f64_error(rope_fn, &x4, 1, &apart) <= 1e-6);
    CHECK(f32_vs_f64_error(rope_fn, &x3, 1, &inside) <= 1e-6);
    ag_tensor_free(x4);
    ag_tensor_free(x3);
}

static void rope_step(ag_tape *tp, int s, void *user) {
    (void)s;
    ag_tensor **x = user;
    ag_tensor_zero_grad(x[0]);
    ag_tensor_zero_grad(x[1]);
    ag_backward(tp, ag_sum(tp, ag_rope(tp, x[0], &(ag_rope_opts){.pos_offset = 3})));
    ag_backward(tp, ag_sum(tp, ag_rope(tp, x[1], &(ag_rope_opts){.heads = 2})));
}

static void test_rope_repeated_step_allocates_no_heap_memory(void) {
    ag_tensor *x[2] = {random_leaf(AG_F32, 4, (int[]){2, 2, 300, 8}, 1050),
                       random_leaf(AG_F32, 3, (int[]){2, 300, 16}, 1051)};
    CHECK(repeated_step_allocates_nothing(rope_step, x));
    ag_tensor_free(x[0]);
    ag_tensor_free(x[1]);
}

// With a KV cache, rows [t0, t0 + n) roped with pos_offset t0 are those rows of the whole.
static void test_rope_pos_offset_continues_the_positions(void) {
    ag_tensor *x = uniform_tensor(AG_F64, 4, (int[]){1, 2, 7, 4}, 1100, -1, 1);
    ag_tensor *tail = ag_tensor_zeros(AG_F64, 4, (int[]){1, 2, 3, 4});
    for (int hd = 0; hd < 2; hd++)
        for (int t = 0; t < 3; t++)
            for (int c = 0; c < 4; c++)
                ag_tensor_set_item(tail, ((size_t)hd * 3 + t) * 4 + c,
                              ag_tensor_item(x, ((size_t)hd * 7 + 4 + t) * 4 + c));
    ag_tape *tp = ag_tape_new();
    ag_tensor *all = ag_rope(tp, x, NULL);
    ag_tensor *part = ag_rope(tp, tail, &(ag_rope_opts){.pos_offset = 4});
    double worst = 0;
    for (int hd = 0; hd < 2; hd++)
        for (int t = 0; t < 3; t++)
            for (int c = 0; c < 4; c++)
                worst = fmax(worst, fabs(ag_tensor_item(part, ((size_t)hd * 3 + t) * 4 + c) -
                                         ag_tensor_item(all, ((size_t)hd * 7 + 4 + t) * 4 + c)));
    CHECK(worst <= 1e-15);
    // Row 0 without offset is not rotated at all.
    for (int c = 0; c < 4; c++) CHECK(ag_tensor_item(all, (size_t)c) == ag_tensor_item(x, (size_t)c));
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(tail);
}

// ---- Errors ------------------------------------------------------------------------------

static bool error_is(const char *want) {
    if (strcmp(testing_last_error, want) == 0) return true;
    fprintf(stderr, "  got:  %s\n  want: %s\n", testing_last_error, want);
    return false;
}

static void test_misuse_reports_one_line(void) {
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    ag_tensor *q = uniform_tensor(AG_F64, 4, (int[]){2, 2, 3, 4}, 1, -1, 1);
    ag_tensor *k = uniform_tensor(AG_F64, 4, (int[]){2, 2, 5, 4}, 2, -1, 1);
    ag_tensor *t_bad = ag_tensor_zeros(AG_F64, 2, (int[]){3, 5});
    ag_tensor *t_ok = ag_tensor_zeros(AG_F64, 2, (int[]){2, 5});
    ag_tensor *m_bad = ag_tensor_zeros(AG_BOOL, 4, (int[]){2, 3, 3, 5});
    ag_tensor *x_odd = ag_tensor_zeros(AG_F64, 4, (int[]){1, 1, 2, 5});
    ag_attention_opts o = {.softmax = {.pos = {AG_POS_RELATIVE, t_bad, 2, 0, false, 0, 0, 0}}};
    CHECK(!ag_attention(tp, q, k, k, &o));
    CHECK(error_is("attention: relative position table f64 [3,5] must be f64 [h, 5] (2M+1, M = 2); "
                   "q [2,2,3,4]"));
    o.softmax.pos = (ag_pos_bias){AG_POS_T5, t_ok, 4, 8, true, 0, 0, 0};
    CHECK(!ag_attention(tp, q, k, k, &o));
    CHECK(error_is("attention: T5 table f64 [2,5] must be f64 [h, 8] (num_buckets = 8, "
                   "max_distance > num_buckets / 4 (/ 2 causal)); q [2,2,3,4]"));
    o.softmax.pos = (ag_pos_bias){AG_POS_ALIBI, NULL, 0, 0, true, 3, 0, 0};
    CHECK(!ag_attention(tp, q, k, k, &o));
    CHECK(error_is("attention: ALiBi takes no table and pos heads = h >= 1, got heads 3; "
                   "q [2,2,3,4]"));
    o.softmax.pos = (ag_pos_bias){AG_POS_ROPE, NULL, 0, 0, true, 0, 0, 0};
    CHECK(!ag_attention(tp, q, k, k, &o));
    CHECK(error_is("attention: pos kind 4 is not a bias inside the softmax (RELATIVE, T5, "
                   "ALIBI or SINUSOIDAL; ROPE is the op ag_rope); q [2,2,3,4]"));
    o.softmax.pos = (ag_pos_bias){0};
    o.softmax.mask = m_bad;
    CHECK(!ag_attention(tp, q, k, k, &o));
    CHECK(error_is("attention: mask [2,3,3,5] does not match scores [2,2,3,5] (expected [3,5], "
                   "[4,3,5] or a shape that broadcasts to [2,2,3,5])"));
    o.softmax.mask = NULL;
    o.softmax.mask_polarity = (ag_mask_polarity)2;
    CHECK(!ag_attention(tp, q, k, k, &o));
    CHECK(error_is("attention: mask_polarity must be AG_MASK_BLOCKS or AG_MASK_KEEPS, got 2; "
                   "q [2,2,3,4]"));
    ag_softmax_opts so = {.mask = t_ok, .mask_polarity = AG_MASK_KEEPS};
    CHECK(!ag_softmax(tp, k, &so));
    CHECK(error_is("softmax: mask [2,5] must be bool (true = may attend), not f64"));
    CHECK(!ag_rope(tp, x_odd, NULL));
    CHECK(error_is("rope: head width d = 5 of x [1,1,2,5] must be even (pairs (c, c + d/2))"));
    CHECK(!ag_rope(tp, q, &(ag_rope_opts){.heads = 2}));
    CHECK(error_is("rope: x [2,2,3,4] must be [B, h, T, d] with opts heads = 0, or [B, T, h*d] "
                   "with opts heads = h, got heads = 2"));
    CHECK(!ag_rope(tp, q, &(ag_rope_opts){.base = -1}));
    CHECK(error_is("rope: base must be > 0 and pos_offset >= 0, got -1 and 0; x [2,2,3,4]"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {q, k, t_bad, t_ok, m_bad, x_odd};
    for (int i = 0; i < 6; i++) ag_tensor_free(all[i]);
}

// Query positions near INT_MAX: the relative position j - q_offset - i was formed in int,
// so with q_offset = INT_MAX - 1 and T = 3 the last query's position wrapped and its ALiBi
// row came out wrong (undefined behaviour). Such a q_offset is refused now; the largest
// one that fits gives the rows of a small offset (keys all earlier, so each row's softmax
// depends on j alone: by hand, shift invariance).
static void test_q_offset_near_int_max(void) {
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F64, 4, (int[]){1, 1, 3, 4});
    ag_softmax_opts o = {.q_offset = 5, .pos = {.kind = AG_POS_ALIBI, .heads = 1,
                                                .bidirectional = true}};
    ag_tensor *near = ag_softmax(tp, x, &o);
    o.q_offset = INT_MAX - 3;  // the last query at INT_MAX - 1
    ag_tensor *far = ag_softmax(tp, x, &o);
    CHECK(near && far);
    for (size_t i = 0; near && far && i < near->numel; i++)
        CHECK_NEAR(ag_tensor_item(far, i), ag_tensor_item(near, i), 1e-6);
    o.q_offset = INT_MAX - 1;
    CHECK(!ag_softmax(tp, x, &o));
    CHECK(error_is("softmax: q_offset + T must fit in an int, got q_offset 2147483646 and "
                   "T = 3; scores [1,1,3,4]"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A position term has T + S - 1 entries a head, which the fused attention and ag_softmax
// count in ints: with T + S - 1 past INT_MAX (reached by the fused attention with q and k
// of 4 GB each; here through the check both share, on a shape alone) the count wrapped.
// Refused now with one line; T + S - 1 = INT_MAX passes, as does any size without a
// position term.
static void test_position_terms_past_int_max_entries_are_refused(void) {
    testing_catch_errors();
    ag_tensor q;
    agi_tensor_header(&q, AG_F32, 4, (int[]){1, 1, 1, 1});
    const agi_about subject = {"q", &q, NULL, NULL};
    ag_softmax_opts o = {.pos = {.kind = AG_POS_ALIBI, .heads = 1}};
    ag_tensor *in[AG_MAX_INPUTS];
    int n_in = 0;
    agi_scores m;
    const int half = 1 << 30;  // T + S - 1 = 2^31 - 1 = INT_MAX
    CHECK(agi_check_softmax_masks("attention", &o, AG_F32, 4, (int[]){1, 1, half, half}, 1,
                                  &subject, &subject, NULL, in, &n_in, &m));
    CHECK(!agi_check_softmax_masks("attention", &o, AG_F32, 4,
                                   (int[]){1, 1, half + 1, half}, 1, &subject, &subject, NULL, in,
                                   &n_in, &m));
    CHECK(testing_error_was("attention: a position term over 1073741825 queries and "
                            "1073741824 keys needs T + S - 1 entries, more than INT_MAX; "
                            "q [1,1,1,1]"));
    o.pos.kind = AG_POS_NONE;
    CHECK(agi_check_softmax_masks("attention", &o, AG_F32, 4,
                                  (int[]){1, 1, INT_MAX, INT_MAX}, 1, &subject, &subject, NULL, in,
                                  &n_in, &m));
    CHECK(testing_error_count == 0);
    testing_release_errors();
}

// The fused attention never makes its scores, so its position term, h (T + S - 1) reals in
// one tape allocation, was bounded by nothing: q [1, 2^23, 1, 1] against k and v of 2^23 + 1
// keys (32 MB each) asked 2^48 + 2^25 bytes, the tape refused them and the op then wrote
// the term through NULL. Refused now with one line before anything is recorded; a term of
// exactly 2^48 bytes passes the check (on a shape alone: running it would take 2^46 scores).
static void test_position_term_past_max_bytes_is_refused(void) {
    testing_catch_errors();
    const int H = 1 << 23, S = (1 << 23) + 1;
    ag_tensor *q = ag_tensor_zeros(AG_F32, 4, (int[]){1, H, 1, 1});
    ag_tensor *k = ag_tensor_zeros(AG_F32, 4, (int[]){1, 1, S, 1});
    ag_tensor *v = ag_tensor_zeros(AG_F32, 4, (int[]){1, 1, S, 1});
    ag_tape *tp = ag_tape_new();
    ag_attention_opts o = {.kv_heads = 1,
                           .softmax = {.pos = {.kind = AG_POS_ALIBI, .heads = H,
                                               .bidirectional = true}}};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(testing_error_was("attention: a position term of 8388608 heads over 1 queries and 8388609 "
                   "keys needs 8388608 x 8388609 f32 values, more than the 2^48 bytes one "
                   "allocation may take; q [1,8388608,1,1]"));
    CHECK(ag_tape_num_nodes(tp) == 0);
    const agi_about subject = {"q", q, NULL, NULL};
    ag_tensor *in[AG_MAX_INPUTS];
    int n_in = 0;
    agi_scores m;
    CHECK(agi_check_softmax_masks("attention", &o.softmax, AG_F32, 4,
                                  (int[]){1, H, 1, S - 1}, H, &subject, &subject, NULL, in,
                                  &n_in, &m));
    CHECK(testing_error_count == 0);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(q);
    ag_tensor_free(k);
    ag_tensor_free(v);
}

// Slice n of ag_softmax's leading ones reads head n % h: with more heads than slices, the
// later heads are never read. Two slices under an 8-head RELATIVE table or 8-head ALiBi
// equal the first two of eight slices, forward and the table's gradient (its rows 2 to 7
// get none); and h = INT_MAX (asking 120 GB for the unread heads' terms, and looping
// forever in ALiBi's slopes, whose power of two overflowed) gives ALiBi's slopes by hand:
// p = 2^30, slope_k = 2^(-8 (k + 1) / 2^30).
static void test_more_heads_than_slices_reads_only_the_first(void) {
    const int T = 3, S = 4, M = 2, H = 8;
    for (int kind = 0; kind < 2; kind++) {
        ag_tape *tp = ag_tape_new();
        ag_tensor *x8 = uniform_tensor(AG_F64, 4, (int[]){1, H, T, S}, 31, -1, 1);
        ag_tensor *x2 = ag_tensor_from(AG_F64, 4, (int[]){1, 2, T, S}, ag_tensor_f64(x8));
        ag_tensor *w8 = uniform_tensor(AG_F64, 4, (int[]){1, H, T, S}, 32, -1, 1);
        for (size_t i = 2 * (size_t)T * S; i < w8->numel; i++) ag_tensor_f64(w8)[i] = 0;
        ag_tensor *w2 = ag_tensor_from(AG_F64, 4, (int[]){1, 2, T, S}, ag_tensor_f64(w8));
        ag_tensor *tab[2];
        for (int r = 0; r < 2; r++)
            tab[r] = requiring_grad(uniform_tensor(AG_F64, 2, (int[]){H, 2 * M + 1}, 33, -1, 1));
        ag_tensor *y[2];
        for (int r = 0; r < 2; r++) {
            ag_softmax_opts o = {.scale = 0.7};
            if (kind == 0)
                o.pos = (ag_pos_bias){.kind = AG_POS_RELATIVE, .table = tab[r], .max_distance = M};
            else
                o.pos = (ag_pos_bias){.kind = AG_POS_ALIBI, .heads = H, .bidirectional = true};
            y[r] = ag_softmax(tp, r ? x2 : x8, &o);
            if (kind == 0) ag_backward(tp, ag_sum(tp, ag_mul(tp, y[r], r ? w2 : w8)));
        }
        CHECK(y[0] && y[1]);
        for (size_t i = 0; y[0] && y[1] && i < y[1]->numel; i++)
            CHECK(ag_tensor_item(y[1], i) == ag_tensor_item(y[0], i));
        const double *g8 = tab[0]->grad, *g2 = tab[1]->grad;
        for (int i = 0; kind == 0 && g8 && g2 && i < H * (2 * M + 1); i++)
            CHECK_NEAR(g2[i], i < 2 * (2 * M + 1) ? g8[i] : 0.0, 1e-15);
        ag_tape_free(tp);
        ag_tensor_free(x8), ag_tensor_free(x2), ag_tensor_free(w8), ag_tensor_free(w2);
        ag_tensor_free(tab[0]), ag_tensor_free(tab[1]);
    }
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = uniform_tensor(AG_F64, 4, (int[]){1, 2, T, S}, 34, -1, 1);
    ag_softmax_opts o = {.pos = {.kind = AG_POS_ALIBI, .heads = INT_MAX, .bidirectional = true}};
    ag_tensor *y = ag_softmax(tp, x, &o);
    CHECK(y != NULL);
    for (int k = 0; y && k < 2; k++)
        for (int i = 0; i < T; i++) {
            const double slope = pow(2.0, -8.0 * (k + 1) / 1073741824.0);
            double e[4], sum = 0;
            for (int j = 0; j < S; j++)
                sum += e[j] = exp(ag_tensor_item(x, ((size_t)k * T + i) * S + j) - slope * abs(i - j));
            for (int j = 0; j < S; j++)
                CHECK_NEAR(ag_tensor_item(y, ((size_t)k * T + i) * S + j), e[j] / sum, 1e-15);
        }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// ALiBi's slopes past the power of two p below h are every other one of 2p's: head k >= p
// has 2^(-8 (2 (k - p) + 1) / (2p)) (the paper's get_slopes, by hand). For h > 2^30, p is
// 2^30 and 2p was computed in int: it wrapped to INT_MIN (undefined behaviour), and the
// slopes of heads 2^30 and on came out above 1. Reaching such a head through an op takes
// 2^30 + 1 score slices (4 GB), so the scheme's own slope is asked here.
static void test_alibi_slopes_past_two_to_the_thirty_heads(void) {
    const agi_pos_scheme *s = agi_pos_scheme_of(AG_POS_ALIBI);
    const ag_pos_bias p = {.kind = AG_POS_ALIBI, .heads = INT_MAX, .bidirectional = true};
    const double two_p = 2147483648.0;  // 2^31
    CHECK(s->head_scale(&p, 1 << 30) == pow(2.0, -8.0 / two_p));
    CHECK(s->head_scale(&p, INT_MAX - 1) == pow(2.0, -8.0 * (two_p - 3) / two_p));
    CHECK(s->head_scale(&p, (1 << 30) - 1) == pow(2.0, -8.0));  // the last of p's own
}

// A table of the right shape in the other float dtype: the message names its dtype, where
// "table [2,5] must be f64 [h, 5]" showed a shape that fits and nothing wrong.
static void test_a_table_of_the_other_dtype_is_named_so(void) {
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    ag_tensor *q = uniform_tensor(AG_F64, 4, (int[]){2, 2, 3, 4}, 1, -1, 1);
    ag_tensor *t32 = ag_tensor_zeros(AG_F32, 2, (int[]){2, 5});
    ag_attention_opts o = {.softmax = {.pos = {.kind = AG_POS_RELATIVE, .table = t32,
                                               .max_distance = 2}}};
    CHECK(!ag_attention(tp, q, q, q, &o));
    CHECK(error_is("attention: relative position table f32 [2,5] must be f64 [h, 5] (2M+1, "
                   "M = 2); q [2,2,3,4]"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(q);
    ag_tensor_free(t32);
}

// Every kind's name, from the library's table of schemes, and NULL past the last (the
// examples list their --pos choices by counting up until it): a list of the examples' own
// had lost AG_POS_SINUSOIDAL, added to the table later.
static void test_pos_kind_names(void) {
    const char *const names[] = {"NONE", "RELATIVE", "T5", "ALIBI", "ROPE", "SINUSOIDAL"};
    CHECK(AG_POS_SINUSOIDAL == 5);
    for (int k = 0; k < 6; k++) {
        const char *name = ag_pos_kind_name((ag_pos_kind)k);
        CHECK(name && strcmp(name, names[k]) == 0);
    }
    CHECK(ag_pos_kind_name((ag_pos_kind)(AG_POS_SINUSOIDAL + 1)) == NULL);
    CHECK(ag_pos_kind_name((ag_pos_kind)-1) == NULL);
}

int main(void) {
    RUN(test_fused_equals_composed_for_each_scheme_and_mask);
    RUN(test_pos_kind_names);
    RUN(test_fused_equals_composed_across_block_boundaries);
    RUN(test_gradcheck_fused_with_table_and_mask_gradients);
    RUN(test_gradcheck_composed_softmax_with_table_and_mask_gradients);
    RUN(test_gradcheck_packed_with_each_scheme);
    RUN(test_float32_matches_float64);
    RUN(test_keeps_polarity_equals_blocks_on_the_inverted_masks);
    RUN(test_broadcast_masks_equal_their_expansion);
    RUN(test_two_threads_are_bit_identical_run_to_run);
    RUN(test_repeated_step_allocates_no_heap_memory);
    RUN(test_position_bias_stores_no_t_by_s_buffer);
    RUN(test_rope_gradcheck_and_float32_in_both_layouts);
    RUN(test_rope_pos_offset_continues_the_positions);
    RUN(test_rope_repeated_step_allocates_no_heap_memory);
    RUN(test_misuse_reports_one_line);
    RUN(test_q_offset_near_int_max);
    RUN(test_position_terms_past_int_max_entries_are_refused);
    RUN(test_position_term_past_max_bytes_is_refused);
    RUN(test_more_heads_than_slices_reads_only_the_first);
    RUN(test_alibi_slopes_past_two_to_the_thirty_heads);
    RUN(test_a_table_of_the_other_dtype_is_named_so);
    return testing_summary();
}
