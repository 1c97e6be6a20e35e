// ag_attention: the fused attention must be the composition
//     matmul(q, k^T) -> softmax(opts) -> dropout -> matmul(., v)
// in every respect: forward and every gradient equal to the composed path's (1e-12 in
// float64, 1e-5 in float32) over shapes that cross block boundaries, every mask kind and
// shape, fully masked queries, causality with T != S, dropout; float64 gradient checks;
// float32 against float64; bit-identical reruns with threads; no heap allocation on a
// repeated step; memory that does not grow with T*S; error messages.
// Its other layouts, heads inside the last dim ([B, T, h*d] with opts heads) and packed
// (ag_attention_packed on [B, T, 3E]), must equal the [B, h, T, d] layout on the same
// numbers, over the same cases, and pass the same checks.
#include <stdlib.h>

#include "op_checks.h"

// ---- Cases ------------------------------------------------------------------------------

// One attention problem: shapes, options, and which masks to build.
typedef struct {
    int B, h, T, S, d, dv;
    double scale;
    bool causal;
    int bool_mask;  // 0 none, 2 = [T, S], 3 = [B*h, T, S], 4 = [B, h, T, S]
    int add_mask;   // same, for an additive mask (which also requires grad)
    bool key_padding;
    bool pad_all_of_batch_0;  // batch 0's keys are all padding: its queries see nothing
    double dropout;
} attn_case;

typedef struct {
    attn_case c;
    ag_attention_opts o;  // masks built for the case (heap tensors)
} problem;

static int mask_shape(const attn_case *c, int kind, int *shape) {
    if (kind == 2) {
        shape[0] = c->T, shape[1] = c->S;
    } else if (kind == 3) {
        shape[0] = c->B * c->h, shape[1] = c->T, shape[2] = c->S;
    } else {
        shape[0] = c->B, shape[1] = c->h, shape[2] = c->T, shape[3] = c->S;
    }
    return kind;
}

// With `neg_inf`, one entry of an additive mask is -inf (a learned mask may forbid a key
// outright); finite differences cannot be taken there, so gradient checks go without.
static problem make_problem(attn_case c, ag_dtype dt, uint64_t seed, bool neg_inf) {
    problem p;
    memset(&p, 0, sizeof p);
    p.c = c;
    p.o.softmax.scale = c.scale;
    p.o.softmax.causal = c.causal;
    int shape[4];
    if (c.bool_mask) {
        int nd = mask_shape(&c, c.bool_mask, shape);
        p.o.softmax.mask = bool_mask(nd, shape, 0.3, seed + 1);
    }
    if (c.add_mask) {
        int nd = mask_shape(&c, c.add_mask, shape);
        ag_pcg32 g = ag_pcg32_make(seed + 2, 3);
        ag_tensor *a = ag_tensor_uniform(dt, nd, shape, &g, -1.5, 1.5);
        if (neg_inf) ag_tensor_set_item(a, 1, -INFINITY);
        ag_tensor_set_requires_grad(a, true);
        p.o.softmax.additive_mask = a;
    }
    if (c.key_padding) {
        ag_tensor *kp = bool_mask(2, (int[]){c.B, c.S}, 0.25, seed + 3);
        if (c.pad_all_of_batch_0)
            for (int j = 0; j < c.S; j++) ((uint8_t *)kp->data)[j] = 1;
        p.o.softmax.key_padding_mask = kp;
    }
    p.o.dropout = c.dropout;
    p.o.training = c.dropout > 0;
    p.o.seed = 1234;
    p.o.site = 77;
    return p;
}

static void free_problem(problem *p) {
    ag_tensor_free(p->o.softmax.mask);
    ag_tensor_free(p->o.softmax.additive_mask);
    ag_tensor_free(p->o.softmax.key_padding_mask);
}

// q, k, v in [-1, 1) (requiring grad), as inputs 0..2; the additive mask, if any, is 3.
static int make_inputs(const problem *p, ag_dtype dt, uint64_t seed, ag_tensor *in[4]) {
    const attn_case *c = &p->c;
    test_shape sq = {4, {c->B, c->h, c->T, c->d}}, sk = {4, {c->B, c->h, c->S, c->d}},
               sv = {4, {c->B, c->h, c->S, c->dv}};
    in[0] = random_tensor(dt, sq, seed, -1, 1);
    in[1] = random_tensor(dt, sk, seed + 1, -1, 1);
    in[2] = random_tensor(dt, sv, seed + 2, -1, 1);
    for (int i = 0; i < 3; i++) ag_tensor_set_requires_grad(in[i], true);
    int n = 3;
    if (p->o.softmax.additive_mask) in[n++] = p->o.softmax.additive_mask;
    return n;
}

static void free_inputs(ag_tensor *in[4]) {
    for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
}

static ag_tensor *fused_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    ag_attention_opts o = ((problem *)user)->o;
    if (n > 3) o.softmax.additive_mask = in[3];
    return ag_attention(tp, in[0], in[1], in[2], &o);
}

// The reference: the same attention composed from the separate ops.
static ag_tensor *composed_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    ag_attention_opts o = ((problem *)user)->o;
    if (n > 3) o.softmax.additive_mask = in[3];
    ag_tensor *w = ag_softmax(tp, ag_matmul(tp, in[0], in[1], false, true), &o.softmax);
    w = ag_dropout(tp, w, o.dropout, o.training, o.seed, o.site);
    return ag_matmul(tp, w, in[2], false, false);
}

// The same attention with the heads inside the last dim: q, k, v [B, T, h*d].
static ag_tensor *inside_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    ag_attention_opts o = ((problem *)user)->o;
    o.heads = ((problem *)user)->c.h;
    if (n > 3) o.softmax.additive_mask = in[3];
    return ag_attention(tp, in[0], in[1], in[2], &o);
}

// And packed: one qkv [B, T, 3E]; the additive mask, if any, is input 1.
static ag_tensor *packed_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    ag_attention_opts o = ((problem *)user)->o;
    o.heads = ((problem *)user)->c.h;
    if (n > 1) o.softmax.additive_mask = in[1];
    return ag_attention_packed(tp, in[0], &o);
}

// Runs fn forward and backward with upstream gradient dy (or, when NULL, one fixed by the
// output's shape) and fresh gradients on the inputs; returns the output, on tp.
static ag_tensor *run_with(ag_fn fn, ag_tape *tp, ag_tensor *const in[], int n, problem *p,
                           const ag_tensor *dy) {
    for (int i = 0; i < n; i++) ag_tensor_zero_grad(in[i]);
    ag_tensor *y = fn(tp, in, n, p), *own = NULL;
    if (!dy) {
        ag_pcg32 g = ag_pcg32_make(9, 9);
        dy = own = ag_tensor_uniform(y->dtype, y->ndim, y->shape, &g, -1, 1);
    }
    ag_backward_with(tp, y, dy);
    ag_tensor_free(own);
    return y;
}

static ag_tensor *run(ag_fn fn, ag_tape *tp, ag_tensor *const in[], int n, problem *p) {
    return run_with(fn, tp, in, n, p, NULL);
}

// Largest normwise difference, fused against composed, over the output and the
// gradients of every input.
static double fused_vs_composed(problem *p, ag_dtype dt, uint64_t seed) {
    ag_tensor *a[4], *b[4];
    int n = make_inputs(p, dt, seed, a);
    make_inputs(p, dt, seed, b);
    if (n > 3) {  // the additive mask: a copy, so that each path has its own gradient
        b[3] = ag_tensor_convert(a[3], dt);
        ag_tensor_set_requires_grad(b[3], true);
    }
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *yf = run(fused_fn, t1, a, n, p), *yc = run(composed_fn, t2, b, n, p);
    double worst = normwise_error(yf, yc, false);
    for (int i = 0; i < n; i++) worst = fmax(worst, normwise_error(a[i], b[i], true));
    ag_tape_free(t1);
    ag_tape_free(t2);
    free_inputs(a);
    free_inputs(b);
    if (n > 3) ag_tensor_free(b[3]);
    return worst;
}

static const attn_case cases[] = {
    // B h  T  S  d  dv scale causal bool add kpm pad0 dropout
    {2, 3, 5, 7, 5, 3, 0.4, false, 0, 0, false, false, 0},       // S != T, dv != d
    {3, 2, 1, 4, 4, 4, 0.5, false, 0, 0, false, false, 0},       // T = 1
    {2, 1, 4, 1, 3, 2, 0.0, false, 0, 0, false, false, 0},       // S = 1, h = 1, scale 0 = 1
    {1, 1, 6, 6, 13, 6, 0.3, false, 0, 0, false, false, 0},      // d not a multiple of 8
    {2, 2, 6, 9, 4, 5, 0.5, true, 0, 0, false, false, 0},        // causal, T < S
    {2, 2, 9, 4, 4, 5, 0.5, true, 0, 0, false, false, 0},        // causal, T > S
    {2, 3, 4, 6, 3, 2, 0.6, false, 2, 0, false, false, 0},       // bool [T, S]
    {2, 3, 4, 6, 3, 2, 0.6, false, 3, 0, false, false, 0},       // bool [B*h, T, S]
    {2, 3, 4, 6, 3, 2, 0.6, false, 4, 0, false, false, 0},       // bool [B, h, T, S]
    {2, 3, 4, 6, 3, 2, 0.6, false, 0, 2, false, false, 0},       // additive [T, S]
    {2, 3, 4, 6, 3, 2, 0.6, false, 0, 3, false, false, 0},       // additive [B*h, T, S]
    {2, 3, 4, 6, 3, 2, 0.6, false, 0, 4, false, false, 0},       // additive [B, h, T, S]
    {3, 2, 4, 5, 3, 3, 0.6, false, 0, 0, true, true, 0},         // key padding, batch 0 empty
    {2, 2, 5, 7, 3, 4, 0.7, true, 2, 3, true, true, 0},          // everything at once
    {2, 3, 4, 6, 3, 2, 0.5, false, 0, 0, false, false, 0.1},     // dropout
    {2, 2, 5, 7, 3, 4, 0.7, true, 3, 2, true, false, 0.3},       // dropout and masks
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

// More keys than one block holds, so the online softmax rescales across key blocks, and
// in two cases more queries too (the op's blocks are 256 queries by 256 keys; a shorter
// sequence is taken whole).
static const attn_case large_cases[] = {
    {1, 2, 150, 600, 8, 5, 0.35, false, 0, 0, false, false, 0},
    {2, 1, 300, 290, 7, 9, 0.35, true, 0, 0, false, false, 0},
    {2, 2, 130, 520, 6, 6, 0.5, false, 2, 3, true, true, 0.1},
    {1, 2, 520, 300, 5, 4, 0.5, true, 4, 2, true, false, 0.2},
};
#define N_LARGE (int)(sizeof large_cases / sizeof large_cases[0])

// ---- Against the composed ops ------------------------------------------------------------

static void check_equal_to_composed(attn_case c, uint64_t seed) {
    for (int dt = 0; dt < 2; dt++) {
        ag_dtype type = dt ? AG_F64 : AG_F32;
        problem p = make_problem(c, type, seed, true);
        double err = fused_vs_composed(&p, type, seed + 10);
        double tol = dt ? 1e-12 : 1e-5;
        if (!(err <= tol))
            fprintf(stderr, "  case B%d h%d T%d S%d d%d dv%d (%s): fused differs by %.3g\n",
                    c.B, c.h, c.T, c.S, c.d, c.dv, dt ? "f64" : "f32", err);
        CHECK(err <= tol);
        free_problem(&p);
    }
}

static void test_forward_and_gradients_equal_the_composed_ops(void) {
    for (int i = 0; i < N_CASES; i++) check_equal_to_composed(cases[i], 100 + (uint64_t)i);
}

static void test_equal_to_composed_across_block_boundaries(void) {
    for (int i = 0; i < N_LARGE; i++) check_equal_to_composed(large_cases[i], 200 + (uint64_t)i);
}

static void test_q_k_v_may_be_one_tensor(void) {
    // Self-attention on one tensor: its gradient is the sum of the three.
    problem p = make_problem((attn_case){2, 2, 5, 5, 4, 4, 0.5, true, 0, 0, false, false, 0.2},
                             AG_F64, 300, true);
    ag_tensor *a[4], *b[4];
    make_inputs(&p, AG_F64, 301, a);
    make_inputs(&p, AG_F64, 301, b);
    ag_tensor *xa[3] = {a[0], a[0], a[0]}, *xb[3] = {b[0], b[0], b[0]};
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *yf = run(fused_fn, t1, xa, 3, &p), *yc = run(composed_fn, t2, xb, 3, &p);
    CHECK(normwise_error(yf, yc, false) < 1e-12);
    CHECK(normwise_error(a[0], b[0], true) < 1e-12);
    ag_tape_free(t1);
    ag_tape_free(t2);
    free_inputs(a);
    free_inputs(b);
    free_problem(&p);
}

// ---- Heads inside the last dim, and packed -------------------------------------------------

typedef enum { APART, INSIDE, PACKED } layout;  // [B, h, T, d]; [B, T, h*d]; [B, T, 3E]

static ag_fn layout_fn(layout L) {
    return L == APART ? fused_fn : L == INSIDE ? inside_fn : packed_fn;
}

// The self-attention version of a case, which the packed layout needs: S = T, dv = d.
static attn_case self_case(attn_case c) {
    c.S = c.T;
    c.dv = c.d;
    return c;
}

// Where element e of x [B, h, T, w] sits in a [B, T, ld] tensor that holds head j in
// columns [offset + j*w, offset + (j+1)*w): its flat index there.
static size_t inside_index(const ag_tensor *x, size_t e, int ld, int offset) {
    const size_t h = (size_t)x->shape[1], T = (size_t)x->shape[2], w = (size_t)x->shape[3];
    size_t i = e % w, t = e / w % T, j = e / (w * T) % h, b = e / (w * T * h);
    return (b * T + t) * (size_t)ld + (size_t)offset + j * w + i;
}

// Copies x [B, h, T, w] into columns [offset, offset + h*w) of y [B, T, ld].
static void put_inside(const ag_tensor *x, ag_tensor *y, int offset) {
    for (size_t e = 0; e < x->numel; e++)
        ag_tensor_set_item(y, inside_index(x, e, y->shape[2], offset), ag_tensor_item(x, e));
}

// x [B, h, T, w] with its heads inside the last dim, as ag_merge_heads makes it: a heap
// [B, T, h*w].
static ag_tensor *heads_inside(const ag_tensor *x) {
    int shape[3] = {x->shape[0], x->shape[2], x->shape[1] * x->shape[3]};
    ag_tensor *y = ag_tensor_zeros(x->dtype, 3, shape);
    put_inside(x, y, 0);
    return y;
}

// Normwise error of y's elements (values or gradients) at columns [offset, offset + h*w)
// of y [B, T, ld] against x [B, h, T, w]: max |y - x| / max |x|; infinite on a NaN.
static double inside_error(const ag_tensor *x, const ag_tensor *y, int offset, bool grad) {
    double diff = 0, scale = 0;
    for (size_t e = 0; e < x->numel; e++) {
        size_t f = inside_index(x, e, y->shape[2], offset);
        double a = grad ? ag_tensor_grad_item(x, e) : ag_tensor_item(x, e);
        double b = grad ? ag_tensor_grad_item(y, f) : ag_tensor_item(y, f);
        if (isnan(a) || isnan(b)) return INFINITY;
        diff = fmax(diff, fabs(a - b));
        scale = fmax(scale, fabs(a));
    }
    return scale > 0 ? diff / scale : diff;
}

// The inputs of layout L (INSIDE or PACKED) holding the values of the [B, h, T, d] inputs
// a[0..2], requiring grad: q, k, v [B, T, h*d], or one qkv [B, T, 3E] (S = T, dv = d);
// then a[3], the problem's additive mask, if n > 3.
static int layout_inputs(layout L, ag_tensor *const a[4], int n, ag_tensor *b[4]) {
    int m = 0;
    if (L == INSIDE) {
        for (int i = 0; i < 3; i++) b[m++] = heads_inside(a[i]);
    } else {
        const int E = a[0]->shape[1] * a[0]->shape[3];
        b[m] = ag_tensor_zeros(a[0]->dtype, 3, (int[]){a[0]->shape[0], a[0]->shape[2], 3 * E});
        for (int i = 0; i < 3; i++) put_inside(a[i], b[m], i * E);
        m++;
    }
    for (int i = 0; i < m; i++) ag_tensor_set_requires_grad(b[i], true);
    if (n > 3) b[m++] = a[3];
    return m;
}

// make_inputs in layout L; free with free_layout_inputs.
static int make_layout_inputs(const problem *p, layout L, ag_dtype dt, uint64_t seed,
                              ag_tensor *in[4]) {
    ag_tensor *a[4];
    int n = make_inputs(p, dt, seed, a);
    if (L == APART) {
        for (int i = 0; i < n; i++) in[i] = a[i];
        return n;
    }
    int m = layout_inputs(L, a, n, in);
    free_inputs(a);
    return m;
}

static void free_layout_inputs(layout L, ag_tensor *in[4]) {
    for (int i = 0; i < (L == PACKED ? 1 : 3); i++) ag_tensor_free(in[i]);
}

// Largest normwise difference between layout L and the [B, h, T, d] layout on the same
// numbers and the same upstream gradient, over the output and every gradient.
static double layout_vs_apart(problem *p, layout L, ag_dtype dt, uint64_t seed) {
    ag_tensor *a[4], *b[4];
    int n = make_inputs(p, dt, seed, a);
    int m = layout_inputs(L, a, n, b);
    if (n > 3) {  // the additive mask: a copy for the reference, so each has its gradient
        a[3] = ag_tensor_convert(b[m - 1], dt);
        ag_tensor_set_requires_grad(a[3], true);
    }
    const attn_case *c = &p->c;
    test_shape out = {4, {c->B, c->h, c->T, c->dv}};
    ag_tensor *dy = random_tensor(dt, out, seed + 5, -1, 1);
    ag_tensor *dy_inside = heads_inside(dy);
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *ya = run_with(fused_fn, t1, a, n, p, dy);
    ag_tensor *yl = run_with(layout_fn(L), t2, b, m, p, dy_inside);
    double worst = inside_error(ya, yl, 0, false);
    for (int i = 0; i < 3; i++) {
        const int E = c->h * c->d;  // packed: q, k, v at columns 0, E, 2E of one tensor
        worst = fmax(worst, L == INSIDE ? inside_error(a[i], b[i], 0, true)
                                        : inside_error(a[i], b[0], i * E, true));
    }
    if (n > 3) worst = fmax(worst, normwise_error(a[3], b[m - 1], true));
    ag_tape_free(t1);
    ag_tape_free(t2);
    ag_tensor_free(dy);
    ag_tensor_free(dy_inside);
    if (n > 3) ag_tensor_free(a[3]);
    free_inputs(a);
    free_layout_inputs(L, b);
    return worst;
}

static void check_layout_equals_apart(layout L, attn_case c, uint64_t seed) {
    if (L == PACKED) c = self_case(c);
    for (int dt = 0; dt < 2; dt++) {
        ag_dtype type = dt ? AG_F64 : AG_F32;
        problem p = make_problem(c, type, seed, true);
        double err = layout_vs_apart(&p, L, type, seed + 10);
        double tol = dt ? 1e-12 : 1e-5;
        if (!(err <= tol))
            fprintf(stderr, "  case B%d h%d T%d S%d d%d dv%d (%s, %s): differs by %.3g\n", c.B,
                    c.h, c.T, c.S, c.d, c.dv, L == INSIDE ? "inside" : "packed",
                    dt ? "f64" : "f32", err);
        CHECK(err <= tol);
        free_problem(&p);
    }
}

static void test_heads_inside_the_last_dim_equal_heads_apart(void) {
    for (int i = 0; i < N_CASES; i++)
        check_layout_equals_apart(INSIDE, cases[i], 1300 + (uint64_t)i);
    for (int i = 0; i < N_LARGE; i++)
        check_layout_equals_apart(INSIDE, large_cases[i], 1350 + (uint64_t)i);
}

static void test_packed_qkv_equals_heads_apart(void) {
    // Every case as self-attention (S = T, dv = d): masks, fully masked queries, causal,
    // dropout, d not a multiple of 8, several blocks of queries and keys.
    for (int i = 0; i < N_CASES; i++)
        check_layout_equals_apart(PACKED, cases[i], 1400 + (uint64_t)i);
    for (int i = 0; i < N_LARGE; i++)
        check_layout_equals_apart(PACKED, large_cases[i], 1450 + (uint64_t)i);
}

static void test_heads_inside_q_k_v_may_be_one_tensor(void) {
    // Unpacked self-attention on one [B, T, h*d] tensor: the three gradients add up.
    problem p = make_problem((attn_case){2, 2, 5, 5, 4, 4, 0.5, true, 0, 0, false, false, 0.2},
                             AG_F64, 1500, true);
    ag_tensor *a[4];
    make_inputs(&p, AG_F64, 1501, a);
    ag_tensor *x = heads_inside(a[0]);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *xa[3] = {a[0], a[0], a[0]}, *xi[3] = {x, x, x};
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *dy = random_tensor(AG_F64, (test_shape){4, {2, 2, 5, 4}}, 1502, -1, 1);
    ag_tensor *dy_inside = heads_inside(dy);
    ag_tensor *ya = run_with(fused_fn, t1, xa, 3, &p, dy);
    ag_tensor *yi = run_with(inside_fn, t2, xi, 3, &p, dy_inside);
    CHECK(inside_error(ya, yi, 0, false) < 1e-12);
    CHECK(inside_error(a[0], x, 0, true) < 1e-12);
    ag_tape_free(t1);
    ag_tape_free(t2);
    ag_tensor_free(dy);
    ag_tensor_free(dy_inside);
    ag_tensor_free(x);
    free_inputs(a);
    free_problem(&p);
}

// ---- Gradient checks -----------------------------------------------------------------------

// Checks q, k, v and, when `mask_too`, the additive mask.
static bool gradcheck_case(attn_case c, uint64_t seed, bool mask_too) {
    problem p = make_problem(c, AG_F64, seed, false);
    ag_tensor *in[4];
    int n = make_inputs(&p, AG_F64, seed + 10, in);
    if (!mask_too) n = 3;
    ag_gradcheck_result r;
    bool ok = ag_gradcheck(fused_fn, in, n, &p, NULL, &r);
    if (!ok)
        fprintf(stderr, "  gradcheck B%d h%d T%d S%d d%d dv%d failed\n", c.B, c.h, c.T, c.S,
                c.d, c.dv);
    free_inputs(in);
    free_problem(&p);
    return ok;
}

static void test_gradcheck_over_shapes_masks_and_dropout(void) {
    for (int i = 0; i < N_CASES; i++) CHECK(gradcheck_case(cases[i], 400 + (uint64_t)i, true));
}

static void test_gradcheck_heads_inside_and_packed(void) {
    // Every case, additive mask included; packed as self-attention (S = T, dv = d).
    for (int L = INSIDE; L <= PACKED; L++)
        for (int i = 0; i < N_CASES; i++) {
            attn_case c = L == PACKED ? self_case(cases[i]) : cases[i];
            problem p = make_problem(c, AG_F64, 1600 + (uint64_t)i, false);
            ag_tensor *in[4];
            int n = make_layout_inputs(&p, (layout)L, AG_F64, 1610 + (uint64_t)i, in);
            bool ok = ag_gradcheck(layout_fn((layout)L), in, n, &p, NULL, NULL);
            if (!ok)
                fprintf(stderr, "  gradcheck (%s) B%d h%d T%d S%d d%d dv%d failed\n",
                        L == INSIDE ? "inside" : "packed", c.B, c.h, c.T, c.S, c.d, c.dv);
            CHECK(ok);
            free_layout_inputs((layout)L, in);
            free_problem(&p);
        }
}

static void test_gradcheck_across_block_boundaries(void) {
    // More queries and more keys than one block holds (256 by 256), with masks and
    // dropout; one-wide heads keep it quick. The additive mask's own gradient is checked
    // on the small shapes, and against the composed ops on large ones.
    CHECK(gradcheck_case((attn_case){1, 1, 257, 270, 1, 1, 2.0, false, 2, 4, true, false, 0.1},
                         500, false));
}

// ---- Fully masked queries, dropout edges ------------------------------------------------------

// Output rows of queries that see no key are exactly zero, and so are their query
// gradients; no NaN anywhere.
static void test_fully_masked_query_gives_zeros_and_zero_gradients(void) {
    // Batch 0: every key is padding. Batch 1: query 2 is masked by the bool mask and
    // query 0 by an additive -inf on its only visible key (causal).
    attn_case c = {2, 2, 4, 5, 3, 2, 0.5, true, 2, 2, true, true, 0};
    problem p = make_problem(c, AG_F64, 600, false);
    uint8_t *m = p.o.softmax.mask->data;
    for (int j = 0; j < c.S; j++) m[2 * c.S + j] = 1;
    m[0] = 0;
    ag_tensor_set_item(p.o.softmax.additive_mask, 0, -INFINITY);
    uint8_t *kp = p.o.softmax.key_padding_mask->data;
    for (int j = 0; j < c.S; j++) kp[c.S + j] = 0;
    ag_tensor *in[4];
    int n = make_inputs(&p, AG_F64, 601, in);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = run(fused_fn, tp, in, n, &p);
    for (int k = 0; k < n; k++)
        for (size_t e = 0; e < in[k]->numel; e++) CHECK(!isnan(ag_tensor_grad_item(in[k], e)));
    for (int b = 0; b < c.B; b++)
        for (int hd = 0; hd < c.h; hd++)
            for (int t = 0; t < c.T; t++) {
                bool empty = b == 0 || t == 2 || t == 0;
                size_t row = ((size_t)b * c.h + hd) * c.T + t;
                for (int e = 0; e < c.dv; e++) {
                    double v = ag_tensor_item(y, row * c.dv + e);
                    CHECK(!isnan(v));
                    if (empty) CHECK(v == 0.0);
                }
                for (int e = 0; empty && e < c.d; e++)
                    CHECK(ag_tensor_grad_item(in[0], row * c.d + e) == 0.0);
            }
    // Batch 0 attends to nothing: its keys and values get no gradient either.
    for (size_t e = 0; e < (size_t)c.h * c.S * c.d; e++)
        CHECK(ag_tensor_grad_item(in[1], e) == 0.0);
    for (size_t e = 0; e < (size_t)c.h * c.S * c.dv; e++)
        CHECK(ag_tensor_grad_item(in[2], e) == 0.0);
    ag_tape_free(tp);
    // The additive -inf is not differentiable numerically: check q, k and v.
    CHECK(ag_gradcheck(fused_fn, in, 3, &p, NULL, NULL));
    free_inputs(in);
    free_problem(&p);
}

// A query row whose scores are all huge (an additive mask of float32's finfo.min on every
// key, as HuggingFace pads) has weights 1/3 each: backward must not take them as
// exp(s - logsumexp), which in the real type is exp(0) = 1 once m + log 3 rounds to m.
// q [1,1,2,1] = [0.3, 0.7], k [1,1,3,1] = [1, -1, 2], v [1,1,3,1] = [1, 3, 5], additive
// [2,3] = [[min, min, min], [0, 0, min]] (min = -3.4028234663852886e38), dO = [1, -2];
// expected from torch 1.13, softmax(q @ k^T + add) @ v, float64 (float32 to 1e-6):
static void test_huge_scores_give_the_composed_gradients(void) {
    const double mn = -3.4028234663852886e38;
    const double want_o[2] = {3.0, 1.3956322228828364};
    const double want_gq[2] = {0.6666666666666666, 1.269479179964917};
    const double want_gk[3] = {0.24431771298772084, -0.444317712987721, 0.19999999999999998};
    const double want_gv[3] = {-1.2710344437838301, -0.06229888954950319, 0.3333333333333333};
    const double want_ga[6] = {-0.6666666666666666, 0.0, 0.6666666666666666,
                               0.6347395899824584, -0.6347395899824586, 0.0};
    for (int f = 0; f < 2; f++) {
        const ag_dtype dt = f ? AG_F32 : AG_F64;
        const double tol = f ? 1e-6 : 1e-14;
        for (int recompute = 0; recompute < 2; recompute++) {
            ag_tensor *q = ag_tensor_from(AG_F64, 4, (int[]){1, 1, 2, 1}, (double[]){0.3, 0.7});
            ag_tensor *k = ag_tensor_from(AG_F64, 4, (int[]){1, 1, 3, 1}, (double[]){1, -1, 2});
            ag_tensor *v = ag_tensor_from(AG_F64, 4, (int[]){1, 1, 3, 1}, (double[]){1, 3, 5});
            ag_tensor *a = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, (double[]){mn, mn, mn, 0, 0, mn});
            ag_tensor *dO = ag_tensor_from(AG_F64, 4, (int[]){1, 1, 2, 1}, (double[]){1, -2});
            ag_tensor *t[5] = {q, k, v, a, dO};
            for (int i = 0; i < 5; i++) {
                ag_tensor *c = ag_tensor_convert(t[i], dt);
                ag_tensor_free(t[i]);
                t[i] = c;
                if (i < 4) ag_tensor_set_requires_grad(c, true);
            }
            ag_attention_opts o = {0};
            o.softmax.additive_mask = t[3];
            o.recompute_scores = recompute;
            ag_tape *tp = ag_tape_new();
            ag_tensor *y = ag_attention(tp, t[0], t[1], t[2], &o);
            ag_backward_with(tp, y, t[4]);
            for (size_t e = 0; e < 2; e++) {
                CHECK_NEAR(ag_tensor_item(y, e), want_o[e], tol);
                CHECK_NEAR(ag_tensor_grad_item(t[0], e), want_gq[e], tol);
            }
            for (size_t e = 0; e < 3; e++) {
                CHECK_NEAR(ag_tensor_grad_item(t[1], e), want_gk[e], tol);
                CHECK_NEAR(ag_tensor_grad_item(t[2], e), want_gv[e], tol);
            }
            for (size_t e = 0; e < 6; e++) CHECK_NEAR(ag_tensor_grad_item(t[3], e), want_ga[e], tol);
            ag_tape_free(tp);
            for (int i = 0; i < 5; i++) ag_tensor_free(t[i]);
        }
    }
}

static void test_dropout_one_gives_zeros_and_eval_mode_ignores_dropout(void) {
    attn_case c = {2, 2, 4, 6, 3, 3, 0.5, false, 0, 0, false, false, 1.0};
    problem p = make_problem(c, AG_F64, 700, true);
    ag_tensor *in[4];
    int n = make_inputs(&p, AG_F64, 701, in);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = run(fused_fn, tp, in, n, &p);
    for (size_t e = 0; e < y->numel; e++) CHECK(ag_tensor_item(y, e) == 0.0);
    for (int k = 0; k < n; k++)
        for (size_t e = 0; e < in[k]->numel; e++) CHECK(ag_tensor_grad_item(in[k], e) == 0.0);
    // Not training: p is ignored, as ag_dropout does (bit for bit the p = 0 result).
    p.o.dropout = 0.5;
    p.o.training = false;
    ag_tensor *eval = ag_attention(tp, in[0], in[1], in[2], &p.o);
    p.o.dropout = 0;
    ag_tensor *plain = ag_attention(tp, in[0], in[1], in[2], &p.o);
    CHECK(memcmp(eval->data, plain->data, eval->numel * sizeof(double)) == 0);
    ag_tape_free(tp);
    free_inputs(in);
    free_problem(&p);
}

// ---- Precision, threads, memory -----------------------------------------------------------

static void test_float32_matches_float64(void) {
    for (int L = APART; L <= PACKED; L++) {
        for (int i = 0; i < N_CASES; i++) {
            attn_case c = L == PACKED ? self_case(cases[i]) : cases[i];
            problem p = make_problem(c, AG_F64, 800 + (uint64_t)i, true);
            ag_tensor *in[4];
            int n = make_layout_inputs(&p, (layout)L, AG_F64, 810 + (uint64_t)i, in);
            CHECK(f32_vs_f64_error(layout_fn((layout)L), in, n, &p) < 1e-5);
            free_layout_inputs((layout)L, in);
            free_problem(&p);
        }
    }
    for (int i = 0; i < N_LARGE; i++) {
        problem p = make_problem(large_cases[i], AG_F64, 850 + (uint64_t)i, true);
        ag_tensor *in[4];
        int n = make_inputs(&p, AG_F64, 860 + (uint64_t)i, in);
        CHECK(f32_vs_f64_error(fused_fn, in, n, &p) < 1e-5);
        free_inputs(in);
        free_problem(&p);
    }
}

// Output and every gradient of one run, concatenated into `out` (doubles).
static size_t snapshot(ag_fn fn, problem *p, ag_tensor *const in[], int n, double *out) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = run(fn, tp, in, n, p);
    size_t k = 0;
    for (size_t e = 0; e < y->numel; e++) out[k++] = ag_tensor_item(y, e);
    for (int i = 0; i < n; i++)
        for (size_t e = 0; e < in[i]->numel; e++) out[k++] = ag_tensor_grad_item(in[i], e);
    ag_tape_free(tp);
    return k;
}

static void test_two_threads_are_bit_identical_run_to_run(void) {
    // Big enough to run threaded; every mask, dropout, several blocks per slice, and many
    // one-block slices (which the heads-inside layouts stage); in every layout (packed as
    // self-attention).
    const attn_case shapes[] = {
        {2, 3, 300, 280, 16, 8, 0.25, true, 3, 0, true, false, 0.1},  // per-slice masks
        {2, 3, 280, 300, 8, 16, 0.25, false, 0, 2, true, false, 0},   // shared additive
        {8, 4, 64, 48, 16, 8, 0.25, true, 3, 2, true, false, 0.1},    // short sequences
    };
    for (int L = APART; L <= PACKED; L++)
        for (int s = 0; s < 3; s++) {
            attn_case c = L == PACKED ? self_case(shapes[s]) : shapes[s];
            for (int dt = 0; dt < 2; dt++) {
                ag_dtype type = dt ? AG_F64 : AG_F32;
                problem p = make_problem(c, type, 900, true);
                ag_tensor *in[4];
                int n = make_layout_inputs(&p, (layout)L, type, 901, in);
                size_t len = 0;
                for (int i = 0; i < n; i++) len += in[i]->numel;
                len += (size_t)c.B * c.h * c.T * c.dv;
                double *one = malloc(len * sizeof *one), *a = malloc(len * sizeof *a),
                       *b = malloc(len * sizeof *b);
                ag_fn fn = layout_fn((layout)L);
                snapshot(fn, &p, in, n, one);
                ag_threads_set(2);
                snapshot(fn, &p, in, n, a);
                snapshot(fn, &p, in, n, b);
                ag_threads_set(1);
                CHECK(memcmp(a, b, len * sizeof *a) == 0);
                // A slice is one thread's from start to end, so only the gradient of a
                // shared [T, S] additive mask (summed across slices by parts, and last in
                // the snapshot) depends on the thread count; everything else is the same
                // bits as on one thread.
                size_t fixed = len - (p.o.softmax.additive_mask && c.add_mask == 2
                                          ? p.o.softmax.additive_mask->numel
                                          : 0);
                CHECK(memcmp(a, one, fixed * sizeof *a) == 0);
                double err = 0;
                for (size_t k = fixed; k < len; k++) err = fmax(err, fabs(a[k] - one[k]));
                CHECK(err < (dt ? 1e-12 : 1e-4));
                free(one);
                free(a);
                free(b);
                free_layout_inputs((layout)L, in);
                free_problem(&p);
            }
        }
}

// After the first step has sized the tape, a step allocates nothing, on one thread or
// two (big enough that the threaded path runs), with masks and dropout, in every layout,
// for long sequences and for short ones (staged in the heads-inside layouts).
static void check_repeated_step_allocates_nothing(attn_case c) {
    problem p = make_problem(c, AG_F32, 1000, true);
    ag_tensor *dy = random_tensor(AG_F32, (test_shape){4, {c.B, c.h, c.T, c.dv}}, 1002, -1, 1);
    ag_tensor *dy_inside = heads_inside(dy);
    ag_tape *tp = ag_tape_new();
    for (int L = APART; L <= PACKED; L++) {
        ag_tensor *in[4];
        int n = make_layout_inputs(&p, (layout)L, AG_F32, 1001, in);
        for (int threads = 1; threads <= 2; threads++) {
            ag_threads_set(threads);
            ag_memory_stats before = ag_memory_usage();
            for (int step = 0; step < 3; step++) {
                if (step == 1) before = ag_memory_usage();
                ag_tape_reset(tp);
                ag_backward_with(tp, layout_fn((layout)L)(tp, in, n, &p),
                                 L == APART ? dy : dy_inside);
            }
            CHECK(ag_memory_usage().allocations == before.allocations);
        }
        ag_threads_set(1);
        free_layout_inputs((layout)L, in);
    }
    ag_tape_free(tp);
    ag_tensor_free(dy);
    ag_tensor_free(dy_inside);
    free_problem(&p);
}

static void test_repeated_step_allocates_no_heap_memory(void) {
    check_repeated_step_allocates_nothing(
        (attn_case){2, 2, 300, 300, 16, 16, 0.25, true, 2, 2, true, false, 0.1});
    check_repeated_step_allocates_nothing(
        (attn_case){16, 4, 64, 64, 16, 16, 0.25, true, 2, 2, true, false, 0.1});
}

// Peak tape memory of a fused training step, on `threads` threads.
static size_t fused_step_peak(int T, int threads, bool composed) {
    const int d = 16;
    problem p = make_problem((attn_case){1, 1, T, T, d, d, 0.25, true, 0, 0, false, false, 0.1},
                             AG_F32, 1100, true);
    ag_tensor *in[4];
    int n = make_inputs(&p, AG_F32, 1101, in);
    ag_tensor *dy = random_tensor(AG_F32, (test_shape){4, {1, 1, T, d}}, 1102, -1, 1);
    ag_threads_set(threads);
    ag_tape *tp = ag_tape_new();
    ag_backward_with(tp, (composed ? composed_fn : fused_fn)(tp, in, n, &p), dy);
    size_t peak = ag_tape_usage(tp).bytes_peak;
    ag_threads_set(1);
    ag_tape_free(tp);
    ag_tensor_free(dy);
    free_inputs(in);
    free_problem(&p);
    return peak;
}

// Tape memory of a training step grows with T, not T * S: doubling T = S about doubles
// it (the composed ops quadruple), and at T = S = 2048, where one [T, S] float matrix is
// 16 MiB, the whole fused step (with dropout, on two threads) stays below half of that.
static void test_memory_does_not_grow_with_t_times_s(void) {
    const size_t matrix = (size_t)2048 * 2048 * sizeof(float);
    for (int threads = 1; threads <= 2; threads++) {
        size_t small = fused_step_peak(1024, threads, false);
        size_t large = fused_step_peak(2048, threads, false);
        CHECK(large < matrix / 2);
        CHECK((double)large < 2.5 * (double)small);
    }
    // The composed ops keep the scores, the weights and their gradients.
    CHECK(fused_step_peak(2048, 1, true) > 3 * matrix);
}

// ---- Recording and errors -----------------------------------------------------------------

static void test_no_grad_mode_records_nothing_and_gives_the_same_output(void) {
    problem p = make_problem(cases[13], AG_F64, 1200, true);
    ag_tensor *in[4];
    int n = make_inputs(&p, AG_F64, 1201, in);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = fused_fn(tp, in, n, &p);
    CHECK(ag_tape_num_nodes(tp) == 1);
    ag_node *node = ag_tape_node(tp, 0);
    CHECK(node && node->n_in == 6);  // q, k, v, mask, additive mask, key padding
    ag_tape_set_grad_enabled(tp, false);
    ag_tensor *z = fused_fn(tp, in, n, &p);
    CHECK(ag_tape_num_nodes(tp) == 1 && !z->requires_grad);
    CHECK(memcmp(y->data, z->data, y->numel * sizeof(double)) == 0);
    ag_tape_free(tp);
    free_inputs(in);
    free_problem(&p);
}

static void test_packed_node_has_one_qkv_input_and_its_own_name(void) {
    problem p = make_problem(self_case(cases[13]), AG_F64, 1250, true);
    ag_tensor *in[4];
    int n = make_layout_inputs(&p, PACKED, AG_F64, 1251, in);
    ag_tape *tp = ag_tape_new();
    packed_fn(tp, in, n, &p);
    ag_node *node = ag_tape_node(tp, 0);
    CHECK(ag_tape_num_nodes(tp) == 1 && node);
    CHECK(node && node->n_in == 4);  // qkv, mask, additive mask, key padding
    CHECK(node && strcmp(node->op->name, "attention_packed") == 0);
    ag_tape_free(tp);
    free_layout_inputs(PACKED, in);
    free_problem(&p);
}

static bool error_is(const char *message) { return strcmp(testing_last_error, message) == 0; }

static void test_bad_inputs_report_op_and_shapes(void) {
    const int B = 2, h = 2, T = 3, S = 4, d = 5;
    ag_tensor *q = ag_tensor_zeros(AG_F64, 4, (int[]){B, h, T, d});
    ag_tensor *k = ag_tensor_zeros(AG_F64, 4, (int[]){B, h, S, d});
    ag_tensor *v = ag_tensor_zeros(AG_F64, 4, (int[]){B, h, S, 6});
    ag_tensor *k3 = ag_tensor_zeros(AG_F64, 3, (int[]){B * h, S, d});
    ag_tensor *kd = ag_tensor_zeros(AG_F64, 4, (int[]){B, h, S, d + 1});
    ag_tensor *k32 = ag_tensor_zeros(AG_F32, 4, (int[]){B, h, S, d});
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, 2, (int[]){T, S + 1});
    ag_tensor *mf = ag_tensor_zeros(AG_F64, 2, (int[]){T, S});
    ag_tensor *kp = ag_tensor_zeros(AG_BOOL, 2, (int[]){B, T});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_attention(tp, q, k3, v, NULL));
    CHECK(error_is("attention: q [2,2,3,5], k [4,4,5] and v [2,2,4,6] must be "
                   "[B, h, T, d], [B, h, S, d] and [B, h, S, dv], or [B, T, h*d], "
                   "[B, S, h*d] and [B, S, h*dv]"));
    CHECK(!ag_attention(tp, q, kd, v, NULL));
    CHECK(strstr(testing_last_error, "with the same B, h, d and S") != NULL);
    CHECK(!ag_attention(tp, q, k32, v, NULL));
    CHECK(error_is("attention: dtypes differ: f64 [2,2,3,5] and f32 [2,2,4,5]"));
    ag_attention_opts o = {.softmax = {.mask = m}};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: mask [3,5] does not match scores [2,2,3,4] (expected [3,4], "
                   "[4,3,4] or a shape that broadcasts to [2,2,3,4])"));
    o.softmax.mask = mf;
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: mask [3,4] must be bool (true = masked), not f64"));
    o = (ag_attention_opts){.softmax = {.key_padding_mask = kp}};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: key_padding_mask [2,3] does not match q [2,2,3,5] "
                   "and k [2,2,4,5] (expected [2,4])"));
    o = (ag_attention_opts){.dropout = 1.5};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: dropout p must be in [0, 1], got 1.5; q [2,2,3,5]"));
    o = (ag_attention_opts){.softmax = {.scale = INFINITY}};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: scale must be finite, got inf; q [2,2,3,5]"));
    CHECK(!ag_attention(tp, q, NULL, v, NULL));
    CHECK(error_is("attention: k is NULL"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {q, k, v, k3, kd, k32, m, mf, kp};
    for (int i = 0; i < 9; i++) ag_tensor_free(all[i]);
}

static void test_bad_heads_inside_or_packed_inputs_report_op_and_shapes(void) {
    ag_tensor *q = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 10});
    ag_tensor *k = ag_tensor_zeros(AG_F64, 3, (int[]){2, 4, 10});
    ag_tensor *v = ag_tensor_zeros(AG_F64, 3, (int[]){2, 4, 12});
    ag_tensor *q4 = ag_tensor_zeros(AG_F64, 4, (int[]){2, 2, 3, 5});
    ag_tensor *k4 = ag_tensor_zeros(AG_F64, 4, (int[]){2, 2, 4, 5});
    ag_tensor *v4 = ag_tensor_zeros(AG_F64, 4, (int[]){2, 2, 4, 6});
    ag_tensor *qkv = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 30});
    ag_tensor *qkv_bool = ag_tensor_zeros(AG_BOOL, 3, (int[]){2, 3, 30});
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, 2, (int[]){3, 5});
    ag_tensor *kp = ag_tensor_zeros(AG_BOOL, 2, (int[]){2, 4});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_attention(tp, q, k, v, NULL));
    CHECK(error_is("attention: q [2,3,10], k [2,4,10] and v [2,4,12] are 3-D, [B, T, h*d], "
                   "[B, S, h*d] and [B, S, h*dv]: opts heads must give h >= 1, got 0"));
    ag_attention_opts o = {.heads = 3};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: q [2,3,10], k [2,4,10] and v [2,4,12] must be [B, T, h*d], "
                   "[B, S, h*d] and [B, S, h*dv] with the same B, S and h*d, for h = 3 heads"));
    CHECK(!ag_attention(tp, q, v, v, &(ag_attention_opts){.heads = 2}));
    CHECK(strstr(testing_last_error, "with the same B, S and h*d, for h = 2 heads") != NULL);
    CHECK(!ag_attention(tp, q4, k4, v4, &o));
    CHECK(error_is("attention: opts heads = 3, but q [2,2,3,5] has 2 heads (give 0 or h for "
                   "[B, h, T, d] inputs)"));
    o = (ag_attention_opts){.heads = 2, .softmax = {.mask = m}};
    CHECK(!ag_attention(tp, q, k, v, &o));
    CHECK(error_is("attention: mask [3,5] does not match scores [2,2,3,4] (expected [3,4], "
                   "[4,3,4] or a shape that broadcasts to [2,2,3,4])"));
    CHECK(!ag_attention_packed(tp, qkv, NULL));
    CHECK(error_is("attention_packed: qkv [2,3,30] must be [B, T, 3*h*d] with opts heads = "
                   "h >= 1, got heads = 0"));
    CHECK(!ag_attention_packed(tp, qkv, &(ag_attention_opts){.heads = 4}));
    CHECK(error_is("attention_packed: qkv [2,3,30] must be [B, T, 3*h*d] with opts heads = "
                   "h >= 1, got heads = 4"));
    CHECK(!ag_attention_packed(tp, q4, &(ag_attention_opts){.heads = 2}));
    CHECK(strstr(testing_last_error, "qkv [2,2,3,5] must be [B, T, 3*h*d]") != NULL);
    o = (ag_attention_opts){.heads = 2, .softmax = {.key_padding_mask = kp}};
    CHECK(!ag_attention_packed(tp, qkv, &o));
    CHECK(error_is("attention_packed: key_padding_mask [2,4] does not match qkv [2,3,30] "
                   "(expected [2,3])"));
    o = (ag_attention_opts){.heads = 2, .dropout = -1};
    CHECK(!ag_attention_packed(tp, qkv, &o));
    CHECK(error_is("attention_packed: dropout p must be in [0, 1], got -1; qkv [2,3,30]"));
    CHECK(!ag_attention_packed(tp, qkv_bool, &o));
    CHECK(error_is("attention_packed: qkv [2,3,30] must be f32 or f64, not bool"));
    CHECK(!ag_attention_packed(tp, NULL, &o));
    CHECK(error_is("attention_packed: qkv is NULL"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {q, k, v, q4, k4, v4, qkv, qkv_bool, m, kp};
    for (int i = 0; i < 10; i++) ag_tensor_free(all[i]);
}

// The scale multiplies q k^T, where PyTorch 1.13's MultiheadAttention scales q first
// (README, "Score overflow"). Query 0's score against key 0 is 16 * 1e19 * 6.25e18 = 1e39,
// past FLT_MAX, but 2.5e38 once q is scaled by 1/4: here its row is NaN; PyTorch's is v's
// key 0, (1, ..., 1), which scaling q by hand gives here too. Query 1 is finite either way.
static void test_float32_score_overflow_before_the_scale_makes_the_row_nan(void) {
    enum { D = 16 };
    float q[2 * D], qs[2 * D], k[2 * D], v[2 * D];
    for (int c = 0; c < D; c++) {
        q[c] = 1e19f, q[D + c] = 0.5f;
        qs[c] = 0.25f * q[c], qs[D + c] = 0.25f * q[D + c];
        k[c] = 6.25e18f, k[D + c] = 1;
        v[c] = 1, v[D + c] = 2;
    }
    const int shape[4] = {1, 1, 2, D};
    ag_tensor *tq = ag_tensor_from(AG_F32, 4, shape, q);
    ag_tensor *tqs = ag_tensor_from(AG_F32, 4, shape, qs);
    ag_tensor *tk = ag_tensor_from(AG_F32, 4, shape, k), *tv = ag_tensor_from(AG_F32, 4, shape, v);
    ag_tape *tp = ag_tape_new();
    ag_attention_opts scaled = {.softmax.scale = 0.25}, plain = {.softmax.scale = 1};
    ag_tensor *y = ag_attention(tp, tq, tk, tv, &scaled);
    ag_tensor *ys = ag_attention(tp, tqs, tk, tv, &plain);
    for (size_t c = 0; c < D; c++) {
        CHECK(isnan(ag_tensor_item(y, c)));
        CHECK(ag_tensor_item(ys, c) == 1);  // PyTorch's
        CHECK(ag_tensor_item(y, D + c) == ag_tensor_item(ys, D + c));
        CHECK(ag_tensor_item(ys, D + c) == 1);  // key 0's score 2e19 * 0.25: weight 1
    }
    ag_tensor_free(tq), ag_tensor_free(tqs), ag_tensor_free(tk), ag_tensor_free(tv);
    ag_tape_free(tp);
}

int main(void) {
    RUN(test_forward_and_gradients_equal_the_composed_ops);
    RUN(test_equal_to_composed_across_block_boundaries);
    RUN(test_q_k_v_may_be_one_tensor);
    RUN(test_float32_score_overflow_before_the_scale_makes_the_row_nan);
    RUN(test_heads_inside_the_last_dim_equal_heads_apart);
    RUN(test_packed_qkv_equals_heads_apart);
    RUN(test_heads_inside_q_k_v_may_be_one_tensor);
    RUN(test_gradcheck_over_shapes_masks_and_dropout);
    RUN(test_gradcheck_heads_inside_and_packed);
    RUN(test_gradcheck_across_block_boundaries);
    RUN(test_fully_masked_query_gives_zeros_and_zero_gradients);
    RUN(test_huge_scores_give_the_composed_gradients);
    RUN(test_dropout_one_gives_zeros_and_eval_mode_ignores_dropout);
    RUN(test_float32_matches_float64);
    RUN(test_two_threads_are_bit_identical_run_to_run);
    RUN(test_repeated_step_allocates_no_heap_memory);
    RUN(test_memory_does_not_grow_with_t_times_s);
    RUN(test_no_grad_mode_records_nothing_and_gives_the_same_output);
    RUN(test_packed_node_has_one_qkv_input_and_its_own_name);
    RUN(test_bad_inputs_report_op_and_shapes);
    RUN(test_bad_heads_inside_or_packed_inputs_report_op_and_shapes);
    return testing_summary();
}
