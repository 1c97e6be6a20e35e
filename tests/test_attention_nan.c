// A NaN stays a NaN (issue 9): a score row that contains a NaN (a NaN in q or k, or a
// +inf score from an infinite k) gives NaN, in ag_softmax and in every layout of the fused
// ag_attention, forward and backward, f32 and f64, exactly where the composed ops
// (matmul, softmax, matmul) give NaN; a NaN in v reaches the output columns it feeds.
// A row whose keys are all *masked* still gives zeros, even beside a NaN row.
#include <stdlib.h>

#include "op_checks.h"

typedef enum { APART, INSIDE, PACKED } layout;
typedef enum { NAN_Q, NAN_K, NAN_V, INF_K } poison;

typedef struct {
    int B, h, T, d;  // S = T (packed attention is self-attention)
    int pad_batch;  // every key of this batch is padding (its queries fully masked); -1: none
} nan_case;

// Element (b, head, t, c) of a [B, h, T, d] tensor placed in [B, T, h*d] (or, packed, in
// column block `block` of [B, T, 3*h*d]).
static size_t inside_at(const nan_case *c, int b, int head, int t, int col, int width,
                        int block) {
    return ((size_t)b * c->T + t) * width + (size_t)block * c->h * c->d + (size_t)head * c->d + col;
}

// Whether a and b (n values each, a's at stride-mapped positions) are NaN at the same
// places and otherwise within tol (normwise); at least one NaN must be present when
// `want_nan`.
static bool same_nans_and_close(const double *a, const double *b, size_t n, double tol,
                                bool want_nan, const char *what) {
    normwise e = {0, 0};
    size_t nans = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) {
            fprintf(stderr, "  %s[%zu]: %g, composed %g\n", what, i, a[i], b[i]);
            return false;
        }
        if (isnan(b[i])) {
            nans++;
            continue;
        }
        normwise_add(&e, a[i], b[i]);
    }
    if (want_nan && !nans) fprintf(stderr, "  %s: no NaN at all\n", what);
    if (normwise_result(e) > tol)
        fprintf(stderr, "  %s: differs by %g\n", what, normwise_result(e));
    return (!want_nan || nans) && normwise_result(e) <= tol;
}

// Values (or gradients) of a [B, h, T, d] tensor in [B, h, T, d] order, read from x in
// layout `l` (column block `block` when packed).
static double *gather(const nan_case *c, const ag_tensor *x, layout l, int block, bool grad) {
    size_t n = (size_t)c->B * c->h * c->T * c->d;
    double *out = malloc(n * sizeof *out);
    size_t at = 0;
    for (int b = 0; b < c->B; b++)
        for (int head = 0; head < c->h; head++)
            for (int t = 0; t < c->T; t++)
                for (int col = 0; col < c->d; col++, at++) {
                    size_t i = l == APART ? at
                                          : inside_at(c, b, head, t, col, x->shape[2], block);
                    out[at] = element(x, grad, i);
                }
    return out;
}

typedef struct {
    double *y, *g[3];
} result;

static void free_result(result *r) {
    free(r->y);
    for (int i = 0; i < 3; i++) free(r->g[i]);
}

static ag_tensor *key_padding(const nan_case *c) {
    if (c->pad_batch < 0) return NULL;
    ag_tensor *kp = ag_tensor_zeros(AG_BOOL, 2, (int[]){c->B, c->T});
    for (int j = 0; j < c->T; j++) ((uint8_t *)kp->data)[c->pad_batch * c->T + j] = 1;
    return kp;
}

// q, k, v [B, h, T, d] in [-1, 1) with the poison placed in slice (0, 0): NaN at q[0,0,1,2]
// or k[0,0,1,2] or v[0,0,1,2], or +inf at k[0,0,T-1,0].
static void make_qkv(const nan_case *c, ag_dtype dt, poison p, ag_tensor *x[3]) {
    const int shape[4] = {c->B, c->h, c->T, c->d};
    for (int i = 0; i < 3; i++) x[i] = uniform_tensor(dt, 4, shape, 40 + i, -1, 1);
    const size_t at = (size_t)1 * c->d + 2;
    if (p == NAN_Q) ag_tensor_set_item(x[0], at, NAN);
    if (p == NAN_K) ag_tensor_set_item(x[1], at, NAN);
    if (p == NAN_V) ag_tensor_set_item(x[2], at, NAN);
    if (p == INF_K) ag_tensor_set_item(x[1], (size_t)(c->T - 1) * c->d, INFINITY);
}

// The reference: matmul, softmax, matmul on [B, h, T, d].
static result composed(const nan_case *c, ag_dtype dt, poison p) {
    ag_tensor *x[3];
    make_qkv(c, dt, p, x);
    for (int i = 0; i < 3; i++) ag_tensor_set_requires_grad(x[i], true);
    ag_tensor *kp = key_padding(c);
    ag_softmax_opts so = {.scale = 0.5, .key_padding_mask = kp};
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = ag_softmax(tp, ag_matmul(tp, x[0], x[1], false, true), &so);
    ag_tensor *y = ag_matmul(tp, w, x[2], false, false);
    ag_tensor *dy = uniform_tensor(dt, y->ndim, y->shape, 9, -1, 1);
    ag_backward_with(tp, y, dy);
    result r = {gather(c, y, APART, 0, false), {0}};
    for (int i = 0; i < 3; i++) r.g[i] = gather(c, x[i], APART, 0, true);
    ag_tape_free(tp);
    for (int i = 0; i < 3; i++) ag_tensor_free(x[i]);
    ag_tensor_free(kp);
    ag_tensor_free(dy);
    return r;
}

// Copies [B, h, T, d] values into a [B, T, W] layout (column block `block` of dst).
static void scatter(const nan_case *c, const ag_tensor *src, int block, ag_tensor *dst) {
    size_t at = 0;
    for (int b = 0; b < c->B; b++)
        for (int head = 0; head < c->h; head++)
            for (int t = 0; t < c->T; t++)
                for (int col = 0; col < c->d; col++, at++)
                    ag_tensor_set_item(dst, inside_at(c, b, head, t, col, dst->shape[2], block),
                                  ag_tensor_item(src, at));
}

// The fused op in layout l, on the same numbers and upstream gradient as composed().
static result fused(const nan_case *c, ag_dtype dt, poison p, layout l) {
    ag_tensor *x[3], *in[3] = {0};
    make_qkv(c, dt, p, x);
    const int E = c->h * c->d;
    ag_tensor *kp = key_padding(c);
    ag_attention_opts o = {.softmax = {.scale = 0.5, .key_padding_mask = kp}};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y;
    if (l == APART) {
        for (int i = 0; i < 3; i++) in[i] = requiring_grad(x[i]), x[i] = NULL;
        y = ag_attention(tp, in[0], in[1], in[2], &o);
    } else if (l == INSIDE) {
        for (int i = 0; i < 3; i++) {
            in[i] = ag_tensor_zeros(dt, 3, (int[]){c->B, c->T, E});
            scatter(c, x[i], 0, in[i]);
            requiring_grad(in[i]);
        }
        o.heads = c->h;
        y = ag_attention(tp, in[0], in[1], in[2], &o);
    } else {
        in[0] = ag_tensor_zeros(dt, 3, (int[]){c->B, c->T, 3 * E});
        for (int i = 0; i < 3; i++) scatter(c, x[i], i, in[0]);
        requiring_grad(in[0]);
        o.heads = c->h;
        y = ag_attention_packed(tp, in[0], &o);
    }
    // The upstream gradient of composed(), in this layout.
    ag_tensor *dy4 = uniform_tensor(dt, 4, (int[]){c->B, c->h, c->T, c->d}, 9, -1, 1);
    ag_tensor *dy = dy4;
    if (l != APART) {
        dy = ag_tensor_zeros(dt, 3, y->shape);
        scatter(c, dy4, 0, dy);
    }
    ag_backward_with(tp, y, dy);
    result r = {gather(c, y, l, 0, false), {0}};
    for (int i = 0; i < 3; i++)
        r.g[i] = l == PACKED ? gather(c, in[0], l, i, true) : gather(c, in[i], l, 0, true);
    ag_tape_free(tp);
    for (int i = 0; i < 3; i++) {
        ag_tensor_free(x[i]);
        ag_tensor_free(in[i]);
    }
    if (dy != dy4) ag_tensor_free(dy);
    ag_tensor_free(dy4);
    ag_tensor_free(kp);
    return r;
}

static const nan_case nan_cases[] = {
    {2, 2, 5, 4, -1},
    {2, 2, 5, 4, 1},      // batch 1 fully masked: zeros beside the NaNs of batch 0
    {2, 2, 5, 4, 0},      // the poisoned batch fully masked: a NaN in v still reaches the
                          // output (zero weights times NaN), one in q or k does not
    {1, 1, 300, 8, -1},   // two blocks of keys and of queries: the online softmax
    {2, 2, 1, 3, -1},     // T = S = 1
};

// Fused against composed for every layout, dtype and case, with the given poison.
static void check_poison(poison p) {
    const char *lname[] = {"heads apart", "heads inside", "packed"};
    for (size_t ci = 0; ci < sizeof nan_cases / sizeof nan_cases[0]; ci++) {
        const nan_case *c = &nan_cases[ci];
        if (c->T == 1 && p == INF_K) continue;  // the +inf goes where the NaN does then
        for (int dti = 0; dti < 2; dti++) {
            ag_dtype dt = dti ? AG_F64 : AG_F32;
            const double tol = dti ? 1e-12 : 1e-5;
            result ref = composed(c, dt, p);
            for (int l = APART; l <= PACKED; l++) {
                result got = fused(c, dt, p, (layout)l);
                size_t n = (size_t)c->B * c->h * c->T * c->d;
                char what[96];
                snprintf(what, sizeof what, "case %zu %s %s output", ci, ag_dtype_name(dt),
                         lname[l]);
                const bool masked_out = c->pad_batch == 0 && p != NAN_V;
                CHECK(same_nans_and_close(got.y, ref.y, n, tol, !masked_out, what));
                for (int i = 0; i < 3; i++) {
                    snprintf(what, sizeof what, "case %zu %s %s grad %c", ci,
                             ag_dtype_name(dt), lname[l], "qkv"[i]);
                    CHECK(same_nans_and_close(got.g[i], ref.g[i], n, tol, false, what));
                }
                free_result(&got);
            }
            free_result(&ref);
        }
    }
}

static void test_nan_in_q_gives_nan_as_the_composed_ops(void) { check_poison(NAN_Q); }
static void test_nan_in_k_gives_nan_as_the_composed_ops(void) { check_poison(NAN_K); }
static void test_nan_in_v_gives_nan_as_the_composed_ops(void) { check_poison(NAN_V); }
static void test_inf_in_k_gives_nan_as_the_composed_ops(void) { check_poison(INF_K); }

// ag_softmax: a row of NaNs, a row with one NaN and a row with a +inf score give NaN rows
// (and NaN gradients); a fully masked row next to them gives zeros, even where its
// scores are NaN (a masked score is not a score).
// With causality the fused attention skips the keys no query of a block may see. A NaN
// row's weights are NaN at masked keys too, so the composed ops give every key NaN key
// and value gradients: the fused backward must not skip them (S > T, and T = S over
// several blocks of queries).
static void test_causal_nan_row_reaches_every_key_gradient(void) {
    const int sizes[][2] = {{4, 5}, {300, 300}};
    for (int z = 0; z < 2; z++) {
        const int T = sizes[z][0], S = sizes[z][1], d = 4;
        ag_tensor *q = random_leaf(AG_F64, 4, (int[]){1, 1, T, d}, 1);
        ag_tensor *k = random_leaf(AG_F64, 4, (int[]){1, 1, S, d}, 2);
        ag_tensor *v = random_leaf(AG_F64, 4, (int[]){1, 1, S, d}, 3);
        ((double *)q->data)[1 * d] = NAN;  // query row 1
        ag_tensor *grads[2][2];
        for (int fused = 0; fused < 2; fused++) {
            ag_tensor_zero_grad(k);
            ag_tensor_zero_grad(v);
            ag_tape *tp = ag_tape_new();
            ag_softmax_opts so = {.scale = 0.5, .causal = true};
            ag_attention_opts o = {.softmax = so};
            ag_tensor *y =
                fused ? ag_attention(tp, q, k, v, &o)
                      : ag_matmul(tp, ag_softmax(tp, ag_matmul(tp, q, k, false, true), &so), v,
                                  false, false);
            ag_backward(tp, ag_sum(tp, y));
            grads[fused][0] = ag_tensor_convert(k, AG_F64);
            grads[fused][1] = ag_tensor_convert(v, AG_F64);
            memcpy(grads[fused][0]->data, k->grad, k->numel * sizeof(double));
            memcpy(grads[fused][1]->data, v->grad, v->numel * sizeof(double));
            ag_tape_free(tp);
        }
        for (int g = 0; g < 2; g++) {
            CHECK(same_nans_and_close(grads[1][g]->data, grads[0][g]->data, grads[0][g]->numel,
                                      1e-12, true, g ? "dv" : "dk"));
            CHECK(isnan(((double *)grads[1][g]->data)[grads[1][g]->numel - 1]));
            for (int f = 0; f < 2; f++) ag_tensor_free(grads[f][g]);
        }
        ag_tensor_free(q), ag_tensor_free(k), ag_tensor_free(v);
    }
}

static void test_softmax_nan_rows_give_nan_and_masked_rows_zeros(void) {
    for (int dti = 0; dti < 2; dti++) {
        ag_dtype dt = dti ? AG_F64 : AG_F32;
        ag_tensor *x = requiring_grad(uniform_tensor(dt, 2, (int[]){4, 3}, 3, -1, 1));
        for (int j = 0; j < 3; j++) ag_tensor_set_item(x, j, NAN);  // row 0: all NaN
        ag_tensor_set_item(x, 4, NAN);                              // row 1: one NaN
        ag_tensor_set_item(x, 8, INFINITY);                         // row 2: +inf
        ag_tensor_set_item(x, 9, NAN);                              // row 3: masked NaN
        ag_tensor *m = ag_tensor_zeros(AG_BOOL, 2, (int[]){4, 3});
        for (int j = 0; j < 3; j++) ((uint8_t *)m->data)[9 + j] = 1;  // row 3 fully masked
        ag_tape *tp = ag_tape_new();
        ag_softmax_opts o = {.mask = m};
        ag_tensor *y = ag_softmax(tp, x, &o);
        ag_tensor *dy = uniform_tensor(dt, 2, (int[]){4, 3}, 4, -1, 1);
        ag_backward_with(tp, y, dy);
        for (int i = 0; i < 9; i++) {
            CHECK(isnan(ag_tensor_item(y, (size_t)i)));
            CHECK(isnan(ag_tensor_grad_item(x, (size_t)i)));
        }
        for (int i = 9; i < 12; i++) {
            CHECK(ag_tensor_item(y, (size_t)i) == 0);
            CHECK(ag_tensor_grad_item(x, (size_t)i) == 0);
        }
        ag_tape_free(tp);
        ag_tensor_free(x);
        ag_tensor_free(m);
        ag_tensor_free(dy);
    }
}

// Dropout p = 1 keeps no weight, but as in the composed ops (matmul, softmax, ag_dropout,
// matmul) and PyTorch's x * 0, a dropped weight times a NaN or infinite v, or a NaN weight
// times 0, is still NaN: the fused attention gives NaN where the composition does, and
// exactly zeros (output and gradients) where it gives zeros. It returned zeros for all.
static void test_dropout_one_keeps_nan_as_the_composed_ops(void) {
    const int B = 1, h = 2, T = 5, S = 7, d = 4;
    for (int dti = 0; dti < 2; dti++) {
        ag_dtype dt = dti ? AG_F64 : AG_F32;
        for (int poison = 0; poison < 5; poison++) {  // none, NaN q, NaN k, NaN v, inf v
            double *vals[2][4];  // [fused][y, dq, dk, dv]
            size_t sizes[4] = {(size_t)B * h * T * d, (size_t)B * h * T * d,
                               (size_t)B * h * S * d, (size_t)B * h * S * d};
            for (int fused = 0; fused < 2; fused++) {
                ag_tensor *q = random_leaf(dt, 4, (int[]){B, h, T, d}, 1);
                ag_tensor *k = random_leaf(dt, 4, (int[]){B, h, S, d}, 2);
                ag_tensor *v = random_leaf(dt, 4, (int[]){B, h, S, d}, 3);
                if (poison == 1) ag_tensor_set_item(q, 1 * d + 2, NAN);           // head 0, row 1
                if (poison == 2) ag_tensor_set_item(k, (size_t)S * d + 3, NAN);   // head 1, key 0
                if (poison == 3) ag_tensor_set_item(v, 2 * d + 1, NAN);           // head 0, key 2
                if (poison == 4) ag_tensor_set_item(v, (size_t)S * d + 5, INFINITY);
                ag_tape *tp = ag_tape_new();
                ag_softmax_opts so = {.scale = 0.5};
                ag_attention_opts o = {.softmax = so, .dropout = 1, .training = true,
                                       .seed = 7, .site = 9};
                ag_tensor *y =
                    fused ? ag_attention(tp, q, k, v, &o)
                          : ag_matmul(tp,
                                      ag_dropout(tp,
                                                 ag_softmax(tp, ag_matmul(tp, q, k, false, true),
                                                            &so),
                                                 1, true, 7, 9),
                                      v, false, false);
                ag_backward(tp, ag_sum(tp, y));
                const ag_tensor *src[4] = {y, q, k, v};
                for (int i = 0; i < 4; i++) {
                    vals[fused][i] = malloc(sizes[i] * sizeof(double));
                    for (size_t e = 0; e < sizes[i]; e++)
                        vals[fused][i][e] = element(src[i], i > 0, e);
                }
                ag_tape_free(tp);
                ag_tensor_free(q), ag_tensor_free(k), ag_tensor_free(v);
            }
            const char *names[] = {"output", "dq", "dk", "dv"};
            for (int i = 0; i < 4; i++) {
                char what[64];
                snprintf(what, sizeof what, "%s poison %d %s", ag_dtype_name(dt), poison,
                         names[i]);
                // the output holds a NaN for every poison; the gradients for NaN q or k
                CHECK(same_nans_and_close(vals[1][i], vals[0][i], sizes[i], 0,
                                          poison > 0 && (i == 0 || poison <= 2), what));
                free(vals[0][i]), free(vals[1][i]);
            }
        }
    }
}

int main(void) {
    RUN(test_nan_in_q_gives_nan_as_the_composed_ops);
    RUN(test_nan_in_k_gives_nan_as_the_composed_ops);
    RUN(test_nan_in_v_gives_nan_as_the_composed_ops);
    RUN(test_inf_in_k_gives_nan_as_the_composed_ops);
    RUN(test_causal_nan_row_reaches_every_key_gradient);
    RUN(test_softmax_nan_rows_give_nan_and_masked_rows_zeros);
    RUN(test_dropout_one_keeps_nan_as_the_composed_ops);
    return testing_summary();
}
