// ag_softmax: masked scaled softmax. Forward against a naive computation written
// here, float64 gradient checks over shapes and mask combinations, the fully
// masked row (zeros and zero gradient, where PyTorch gives NaN), f32 against f64,
// error messages, determinism under threads.
#include <stdlib.h>

#include "op_checks.h"

// ---- Helpers ------------------------------------------------------------------------

// Normal(0, std): scores, additive masks, upstream gradients.
static ag_tensor *normal(ag_dtype dt, int ndim, const int *shape, uint64_t seed, double std) {
    return normal_tensor(dt, ndim, shape, seed, 0.0, std);
}

static ag_tensor *scores(int ndim, const int *shape, uint64_t seed) {
    return requiring_grad(normal(AG_F64, ndim, shape, seed, 1.5));
}

static ag_tensor *bool_from(int ndim, const int *shape, const uint8_t *values) {
    return ag_tensor_from(AG_BOOL, ndim, shape, values);
}

static void free_opts(ag_softmax_opts *o) {
    ag_tensor_free(o->mask);
    ag_tensor_free(o->additive_mask);
    ag_tensor_free(o->key_padding_mask);
}

static int T_of(const ag_tensor *x) { return x->shape[x->ndim - 2]; }
static int S_of(const ag_tensor *x) { return x->shape[x->ndim - 1]; }

// Whether key j of row r (slice n = r / T, query i = r % T) may be attended to,
// and its score; written from the definition, independently of the library.
static bool naive_score(const ag_tensor *x, const ag_softmax_opts *o, size_t r, int j,
                        double *s) {
    int T = T_of(x), S = S_of(x);
    size_t N = x->numel / ((size_t)T * S), n = r / (size_t)T, i = r % (size_t)T;
    double scale = o && o->scale != 0 ? o->scale : 1.0;
    *s = scale * ag_tensor_item(x, r * S + j);
    if (!o) return true;
    // A [T, S] mask applies to every slice; a larger one has a block per slice.
    size_t mi = (size_t)j + (size_t)S * (o->mask && o->mask->numel == (size_t)T * S ? i : r);
    size_t ai = (size_t)j +
                (size_t)S * (o->additive_mask && o->additive_mask->numel == (size_t)T * S ? i : r);
    if (o->additive_mask) *s += ag_tensor_item(o->additive_mask, ai);
    if (o->mask && ((const uint8_t *)o->mask->data)[mi]) return false;
    if (o->causal && (size_t)j > i) return false;
    if (o->key_padding_mask) {
        size_t B = (size_t)o->key_padding_mask->shape[0], b = n / (N / B);
        if (((const uint8_t *)o->key_padding_mask->data)[b * S + j]) return false;
    }
    return *s != -INFINITY;
}

// y (numel doubles) and allowed (numel flags) from the definition.
static void naive_softmax(const ag_tensor *x, const ag_softmax_opts *o, double *y,
                          bool *allowed) {
    int S = S_of(x);
    size_t rows = x->numel / (size_t)S;
    for (size_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0, s;
        for (int j = 0; j < S; j++) {
            allowed[r * S + j] = naive_score(x, o, r, j, &s);
            if (allowed[r * S + j] && s > mx) mx = s;
        }
        for (int j = 0; j < S; j++) {
            naive_score(x, o, r, j, &s);
            y[r * S + j] = allowed[r * S + j] ? exp(s - mx) : 0.0;
            sum += y[r * S + j];
        }
        for (int j = 0; j < S; j++) y[r * S + j] = sum > 0 ? y[r * S + j] / sum : 0.0;
    }
}

typedef struct {
    ag_softmax_opts o;
} fn_case;

// inputs: x, then the additive mask when it is checked too.
static ag_tensor *softmax_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    ag_softmax_opts o = ((fn_case *)user)->o;
    if (n > 1) o.additive_mask = in[1];
    return ag_softmax(tp, in[0], &o);
}

static bool gradcheck(ag_tensor *x, const ag_softmax_opts *o) {
    fn_case c = {*o};
    ag_tensor *in[2] = {x, o->additive_mask};
    int n = o->additive_mask && o->additive_mask->requires_grad ? 2 : 1;
    bool ok = ag_gradcheck(softmax_fn, in, n, &c, NULL, NULL);
    if (!ok) {
        char shape[64];
        fprintf(stderr, "  gradcheck on scores %s failed\n", ag_tensor_shape_str(x, shape, sizeof shape));
    }
    return ok;
}

// Forward and backward with a random upstream gradient; returns y (on tp).
static ag_tensor *forward_backward(ag_tape *tp, ag_tensor *x, const ag_softmax_opts *o,
                                   uint64_t seed) {
    ag_tensor *y = ag_softmax(tp, x, o);
    ag_tensor *dy = normal(x->dtype, x->ndim, x->shape, seed, 1.0);
    ag_backward_with(tp, y, dy);
    ag_tensor_free(dy);
    return y;
}

// ---- Forward -----------------------------------------------------------------------

static void check_against_naive(ag_tensor *x, const ag_softmax_opts *o) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_softmax(tp, x, o);
    double *ref = malloc(x->numel * sizeof *ref);
    bool *allowed = malloc(x->numel * sizeof *allowed);
    naive_softmax(x, o, ref, allowed);
    for (size_t k = 0; k < x->numel; k++) {
        double v = ag_tensor_item(y, k);
        if (!allowed[k]) CHECK(v == 0.0);  // exactly 0, not merely tiny
        CHECK_NEAR(v, ref[k], 1e-14);
    }
    free(ref);
    free(allowed);
    ag_tape_free(tp);
}

static void test_forward_matches_naive_computation(void) {
    // plain, scaled, over 2 to 4 dims
    const int shapes[][4] = {{2, 3, 5}, {3, 4, 4}, {2, 3, 4, 6}, {2, 1, 1, 7}, {1, 2, 6, 3}};
    const int ndims[] = {2, 3, 4, 4, 4};
    for (int c = 0; c < 5; c++) {
        ag_tensor *x = scores(ndims[c], shapes[c], 100 + (uint64_t)c);
        check_against_naive(x, NULL);
        ag_softmax_opts o = {.scale = 0.37};
        check_against_naive(x, &o);
        ag_tensor_free(x);
    }
    // every mask at once on [B, h, T, S] = [2, 3, 4, 6]
    const int xs[] = {2, 3, 4, 6}, ms[] = {4, 6}, kps[] = {2, 6}, per[] = {6, 4, 6};
    ag_tensor *x = scores(4, xs, 1);
    for (int shared = 0; shared < 2; shared++) {
        ag_softmax_opts o = {.scale = 0.5, .causal = true};
        o.mask = shared ? bool_mask(2, ms, 0.3, 2) : bool_mask(3, per, 0.3, 2);
        o.additive_mask = shared ? normal(AG_F64, 2, ms, 3, 1.0) : normal(AG_F64, 3, per, 3, 1.0);
        ag_tensor_set_item(o.additive_mask, 1, -INFINITY);
        o.key_padding_mask = bool_mask(2, kps, 0.25, 4);
        check_against_naive(x, &o);
        free_opts(&o);
    }
    // a mask with x's own shape
    ag_softmax_opts o = {.mask = bool_mask(4, xs, 0.4, 5)};
    check_against_naive(x, &o);
    free_opts(&o);
    ag_tensor_free(x);
}

static void test_rows_sum_to_one_and_large_scores_are_stable(void) {
    const int shape[] = {3, 8};
    for (int dt = 0; dt < 2; dt++) {
        ag_tensor *x = normal(dt ? AG_F64 : AG_F32, 2, shape, 7, 1.0);
        for (size_t k = 0; k < x->numel; k++)
            ag_tensor_set_item(x, k, 1000.0 * (double)(k % 3) + ag_tensor_item(x, k));
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_softmax(tp, x, NULL);
        for (int r = 0; r < 3; r++) {
            double sum = 0;
            for (int j = 0; j < 8; j++) {
                double v = ag_tensor_item(y, (size_t)r * 8 + j);
                CHECK(isfinite(v));
                sum += v;
            }
            CHECK_NEAR(sum, 1.0, dt ? 1e-15 : 1e-6);
        }
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

static void test_null_opts_and_zero_scale_are_plain_softmax(void) {
    const int shape[] = {2, 3, 5};
    ag_tensor *x = scores(3, shape, 8);
    ag_tape *tp = ag_tape_new();
    ag_softmax_opts zero = {0}, one = {.scale = 1.0};
    ag_tensor *a = ag_softmax(tp, x, NULL), *b = ag_softmax(tp, x, &zero),
              *c = ag_softmax(tp, x, &one);
    CHECK(memcmp(a->data, b->data, x->numel * sizeof(double)) == 0);
    CHECK(memcmp(a->data, c->data, x->numel * sizeof(double)) == 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_single_allowed_key_gives_exactly_one_and_zero_grad(void) {
    // Row 0 may see only key 2, row 1 only key 0.
    const int xs[] = {2, 4}, ms[] = {2, 4};
    const uint8_t mv[] = {1, 1, 0, 1, 0, 1, 1, 1};
    ag_tensor *x = scores(2, xs, 9);
    ag_softmax_opts o = {.mask = bool_from(2, ms, mv)};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = forward_backward(tp, x, &o, 10);
    const double want[] = {0, 0, 1, 0, 1, 0, 0, 0};
    for (int k = 0; k < 8; k++) CHECK(ag_tensor_item(y, (size_t)k) == want[k]);
    // y = e_k, so g = y (dy - dy_k) vanishes exactly: one key, nothing to trade off.
    for (int k = 0; k < 8; k++) CHECK(ag_tensor_grad_item(x, (size_t)k) == 0.0);

    const int cs[] = {3, 5};
    ag_tensor *x2 = scores(2, cs, 11);
    ag_softmax_opts causal = {.causal = true};
    ag_tensor *y2 = ag_softmax(tp, x2, &causal);
    CHECK(ag_tensor_item(y2, 0) == 1.0);  // query 0 sees key 0 alone
    ag_tape_free(tp);
    free_opts(&o);
    ag_tensor_free(x);
    ag_tensor_free(x2);
}

// ---- Fully masked rows ---------------------------------------------------------------

// Row `row` of y and of dx must be exactly zero (and nothing anywhere is NaN).
static void check_zero_row(ag_tensor *x, const ag_softmax_opts *o, size_t row) {
    int S = S_of(x);
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = forward_backward(tp, x, o, 20);
    for (size_t k = 0; k < x->numel; k++) {
        CHECK(!isnan(ag_tensor_item(y, k)));
        CHECK(!isnan(ag_tensor_grad_item(x, k)));
    }
    for (int j = 0; j < S; j++) {
        CHECK(ag_tensor_item(y, row * S + j) == 0.0);
        CHECK(ag_tensor_grad_item(x, row * S + j) == 0.0);
    }
    ag_tape_free(tp);
    CHECK(gradcheck(x, o));
}

static void test_fully_masked_row_by_bool_mask_gives_zeros_and_zero_grad(void) {
    const int xs[] = {2, 3, 4}, ms[] = {3, 4};
    const uint8_t mv[] = {0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0};  // query 1 sees nothing
    ag_tensor *x = scores(3, xs, 21);
    ag_softmax_opts o = {.mask = bool_from(2, ms, mv)};
    check_zero_row(x, &o, 1);
    check_zero_row(x, &o, 4);  // the shared mask blocks query 1 of slice 1 too
    free_opts(&o);
    ag_tensor_free(x);
}

static void test_fully_masked_row_by_key_padding_gives_zeros_and_zero_grad(void) {
    // Batch 1 is all padding: every row of its two heads is empty.
    const int xs[] = {2, 2, 3, 4}, ks[] = {2, 4};
    const uint8_t kv[] = {0, 0, 1, 1, 1, 1, 1, 1};
    ag_tensor *x = scores(4, xs, 22);
    ag_softmax_opts o = {.key_padding_mask = bool_from(2, ks, kv)};
    for (size_t row = 6; row < 12; row++) check_zero_row(x, &o, row);
    free_opts(&o);
    ag_tensor_free(x);
}

static void test_fully_masked_row_by_additive_neg_inf_gives_zeros_and_zero_grad(void) {
    const int xs[] = {2, 3, 5}, as[] = {2, 3, 5};
    ag_tensor *x = scores(3, xs, 23);
    ag_softmax_opts o = {.additive_mask = ag_tensor_zeros(AG_F64, 3, as), .scale = 0.7};
    for (int j = 0; j < 5; j++) ag_tensor_set_item(o.additive_mask, 2 * 5 + (size_t)j, -INFINITY);
    ag_tensor_set_item(o.additive_mask, 0, -INFINITY);  // and one masked key elsewhere
    check_zero_row(x, &o, 2);
    // A learned additive mask gets exactly zero gradient where it is -inf, never NaN.
    ag_tensor_set_requires_grad(o.additive_mask, true);
    ag_tape *tp = ag_tape_new();
    forward_backward(tp, x, &o, 28);
    for (size_t k = 0; k < x->numel; k++) {
        double g = ag_tensor_grad_item(o.additive_mask, k);
        CHECK(isfinite(g));
        if (ag_tensor_item(o.additive_mask, k) == -INFINITY) CHECK(g == 0.0);
    }
    ag_tape_free(tp);
    free_opts(&o);
    ag_tensor_free(x);
}

static void test_masked_keys_get_exactly_zero_gradient(void) {
    const int xs[] = {2, 2, 5, 6}, ms[] = {4, 5, 6};
    ag_tensor *x = scores(4, xs, 24);
    ag_softmax_opts o = {.mask = bool_mask(3, ms, 0.4, 25), .causal = true,
                         .additive_mask = normal(AG_F64, 3, ms, 26, 1.0)};
    ag_tensor_set_requires_grad(o.additive_mask, true);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = forward_backward(tp, x, &o, 27);
    for (size_t k = 0; k < x->numel; k++) {
        if (ag_tensor_item(y, k) != 0.0) continue;
        CHECK(ag_tensor_grad_item(x, k) == 0.0);
        CHECK(ag_tensor_grad_item(o.additive_mask, k) == 0.0);
    }
    ag_tape_free(tp);
    free_opts(&o);
    ag_tensor_free(x);
}

// ---- Gradient checks (float64) --------------------------------------------------------

static const int grad_shapes[][4] = {
    {3, 5},        // 2-D
    {2, 4, 4},     // [N, T, S]
    {2, 3, 4, 4},  // [B, h, T, S]
    {2, 1, 3, 5},  // h = 1, S != T
    {2, 2, 1, 6},  // T = 1
    {1, 2, 5, 3},  // S < T
};
static const int grad_ndims[] = {2, 3, 4, 4, 4, 4};
#define N_GRAD_SHAPES 6

static size_t leading(int c) {
    size_t n = 1;
    for (int d = 0; d < grad_ndims[c] - 2; d++) n *= (size_t)grad_shapes[c][d];
    return n;
}

static void test_gradcheck_plain_and_scaled_over_shapes(void) {
    for (int c = 0; c < N_GRAD_SHAPES; c++) {
        ag_tensor *x = scores(grad_ndims[c], grad_shapes[c], 30 + (uint64_t)c);
        ag_softmax_opts plain = {0}, scaled = {.scale = 0.41};
        CHECK(gradcheck(x, &plain));
        CHECK(gradcheck(x, &scaled));
        ag_tensor_free(x);
    }
}

static void test_gradcheck_bool_mask_shared_and_per_slice(void) {
    for (int c = 0; c < N_GRAD_SHAPES; c++) {
        const int *xs = grad_shapes[c];
        int nd = grad_ndims[c], T = xs[nd - 2], S = xs[nd - 1];
        ag_tensor *x = scores(nd, xs, 40 + (uint64_t)c);
        const int ts[] = {T, S}, nts[] = {(int)leading(c), T, S};
        ag_softmax_opts shared = {.mask = bool_mask(2, ts, 0.35, 41)};
        ag_softmax_opts per = {.mask = bool_mask(3, nts, 0.35, 42), .scale = 0.6};
        CHECK(gradcheck(x, &shared));
        CHECK(gradcheck(x, &per));
        free_opts(&shared);
        free_opts(&per);
        ag_tensor_free(x);
    }
}

static void test_gradcheck_additive_mask_requiring_grad(void) {
    for (int c = 0; c < N_GRAD_SHAPES; c++) {
        const int *xs = grad_shapes[c];
        int nd = grad_ndims[c], T = xs[nd - 2], S = xs[nd - 1];
        ag_tensor *x = scores(nd, xs, 50 + (uint64_t)c);
        const int ts[] = {T, S}, nts[] = {(int)leading(c), T, S};
        ag_softmax_opts shared = {.additive_mask = normal(AG_F64, 2, ts, 51, 1.0)};
        ag_softmax_opts per = {.additive_mask = normal(AG_F64, 3, nts, 52, 1.0), .scale = 0.3};
        ag_softmax_opts same = {.additive_mask = normal(AG_F64, nd, xs, 53, 1.0)};
        ag_tensor_set_requires_grad(shared.additive_mask, true);
        ag_tensor_set_requires_grad(per.additive_mask, true);
        ag_tensor_set_requires_grad(same.additive_mask, true);
        CHECK(gradcheck(x, &shared));
        CHECK(gradcheck(x, &per));
        CHECK(gradcheck(x, &same));
        // The mask alone may require grad, too.
        ag_tensor_set_requires_grad(x, false);
        CHECK(gradcheck(x, &shared));
        ag_tensor_set_requires_grad(x, true);
        free_opts(&shared);
        free_opts(&per);
        free_opts(&same);
        ag_tensor_free(x);
    }
}

static void test_gradcheck_causal_with_t_not_equal_s(void) {
    const int shapes[][4] = {{2, 3, 5}, {2, 5, 3}, {1, 2, 4, 4}, {2, 1, 1, 3}};
    const int nd[] = {3, 3, 4, 4};
    for (int c = 0; c < 4; c++) {
        ag_tensor *x = scores(nd[c], shapes[c], 60 + (uint64_t)c);
        ag_softmax_opts o = {.causal = true, .scale = 0.8};
        CHECK(gradcheck(x, &o));
        check_against_naive(x, &o);
        ag_tensor_free(x);
    }
}

static void test_gradcheck_key_padding(void) {
    for (int c = 1; c < N_GRAD_SHAPES; c++) {  // needs a batch dim: not the 2-D case
        const int *xs = grad_shapes[c];
        int nd = grad_ndims[c];
        const int ks[] = {xs[0], xs[nd - 1]};
        ag_tensor *x = scores(nd, xs, 70 + (uint64_t)c);
        ag_softmax_opts o = {.key_padding_mask = bool_mask(2, ks, 0.3, 71)};
        CHECK(gradcheck(x, &o));
        free_opts(&o);
        ag_tensor_free(x);
    }
}

// The sliding window and the query offset, on ag_softmax itself (the fused attention's
// are checked in test_attention_gqa_window.c and test_attention_offset.c): with and
// without causal, with an additive mask whose gradient is checked too.
static void test_gradcheck_window_and_query_offset(void) {
    const int xs[] = {2, 2, 4, 6}, ts[] = {4, 6};
    ag_tensor *x = scores(4, xs, 90);
    for (int W = 1; W <= 3; W++)
        for (int causal = 0; causal < 2; causal++)
            for (int off = 0; off <= 2; off += 2) {
                ag_softmax_opts o = {.scale = 0.6, .causal = causal, .window = W,
                                     .q_offset = off};
                CHECK(gradcheck(x, &o));
                o.additive_mask = normal(AG_F64, 2, ts, 91 + (uint64_t)W, 1.0);
                ag_tensor_set_requires_grad(o.additive_mask, true);
                CHECK(gradcheck(x, &o));
                free_opts(&o);
            }
    ag_tensor_free(x);
}

static void test_gradcheck_all_masks_combined(void) {
    for (int c = 1; c < N_GRAD_SHAPES; c++) {
        const int *xs = grad_shapes[c];
        int nd = grad_ndims[c], T = xs[nd - 2], S = xs[nd - 1];
        const int ts[] = {T, S}, nts[] = {(int)leading(c), T, S}, ks[] = {xs[0], S};
        ag_tensor *x = scores(nd, xs, 80 + (uint64_t)c);
        for (int shared = 0; shared < 2; shared++) {
            ag_softmax_opts o = {.scale = 0.45, .causal = true};
            o.mask = shared ? bool_mask(2, ts, 0.25, 81) : bool_mask(3, nts, 0.25, 81);
            o.additive_mask = shared ? normal(AG_F64, 2, ts, 82, 1.0)
                                     : normal(AG_F64, 3, nts, 82, 1.0);
            ag_tensor_set_requires_grad(o.additive_mask, true);
            o.key_padding_mask = bool_mask(2, ks, 0.2, 83);
            CHECK(gradcheck(x, &o));
            check_against_naive(x, &o);
            free_opts(&o);
        }
        ag_tensor_free(x);
    }
}

// ---- float32 -------------------------------------------------------------------------

// |f32 - f64| <= 1e-5 |f64| + 1e-6 for every element of the output and of the
// gradients of x and of the additive mask.
static void test_float32_matches_float64(void) {
    for (int c = 1; c < N_GRAD_SHAPES; c++) {
        const int *xs = grad_shapes[c];
        int nd = grad_ndims[c], T = xs[nd - 2], S = xs[nd - 1];
        const int ts[] = {T, S}, ks[] = {xs[0], S};
        // x and the additive mask are inputs; the bool masks ride in the options.
        ag_tensor *in[] = {requiring_grad(normal(AG_F64, nd, xs, 90 + (uint64_t)c, 3.0)),
                           requiring_grad(normal(AG_F64, 2, ts, 91, 1.0))};
        fn_case fc = {{.scale = 0.7, .causal = true, .mask = bool_mask(2, ts, 0.2, 93),
                       .key_padding_mask = bool_mask(2, ks, 0.2, 94)}};
        CHECK(f32_close_to_f64(softmax_fn, in, 2, &fc, 1e-5, 1e-6));
        free_opts(&fc.o);
        ag_tensor_free(in[0]);
        ag_tensor_free(in[1]);
    }
}

// ---- The tape -------------------------------------------------------------------------

// The float32 gradients of an additive mask [S] broadcast over 2^15 rows and of a
// relative-position table, both sums over the rows, against float64 on the same numbers
// (max-norm relative error). They were summed in float, row after row: 5e-6 and 7e-7
// off. In double: 1e-7 and 2e-7 (the table's entries sum terms that nearly cancel).
static void test_float32_mask_and_table_gradients_over_many_rows_match_float64(void) {
    const int B = 128, h = 4, T = 64, S = 32, M = 8;
    ag_tensor *t32[4] = {uniform_tensor(AG_F32, 4, (int[]){B, h, T, S}, 121, -2, 2),
                         uniform_tensor(AG_F32, 1, (int[]){S}, 122, -1, 1),
                         uniform_tensor(AG_F32, 2, (int[]){h, 2 * M + 1}, 123, -1, 1),
                         uniform_tensor(AG_F32, 4, (int[]){B, h, T, S}, 124, 0, 1)};
    ag_tensor *t64[4];
    for (int k = 0; k < 4; k++) t64[k] = ag_tensor_convert(t32[k], AG_F64);  // exactly
    ag_tape *tp = ag_tape_new();
    for (int f = 0; f < 2; f++) {
        ag_tensor **t = f ? t64 : t32;
        ag_tensor_set_requires_grad(t[1], true);
        ag_tensor_set_requires_grad(t[2], true);
        ag_softmax_opts o = {.additive_mask = t[1]};
        o.pos = (ag_pos_bias){.kind = AG_POS_RELATIVE, .table = t[2], .max_distance = M};
        ag_backward_with(tp, ag_softmax(tp, t[0], &o), t[3]);
    }
    const double e[2] = {normwise_error(t32[1], t64[1], true),
                         normwise_error(t32[2], t64[2], true)};
    if (e[0] > 5e-7 || e[1] > 5e-7)
        fprintf(stderr, "  mask gradient %.2e, table gradient %.2e off\n", e[0], e[1]);
    CHECK(e[0] <= 5e-7 && e[1] <= 5e-7);
    ag_tape_free(tp);
    for (int k = 0; k < 4; k++) ag_tensor_free(t32[k]), ag_tensor_free(t64[k]);
}

static void test_masks_are_recorded_as_inputs_and_nothing_is_saved(void) {
    const int xs[] = {2, 2, 3, 4}, ts[] = {3, 4}, ks[] = {2, 4};
    ag_tensor *x = scores(4, xs, 100);
    ag_softmax_opts o = {.mask = bool_mask(2, ts, 0.3, 101),
                         .additive_mask = normal(AG_F64, 2, ts, 102, 1.0),
                         .key_padding_mask = bool_mask(2, ks, 0.3, 103)};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_softmax(tp, x, &o);
    CHECK(ag_tape_num_nodes(tp) == 1);
    ag_node *n = ag_tape_node(tp, 0);
    CHECK(n->out == y);
    CHECK(n->n_in == 4);
    CHECK(n->in[0] == x && n->in[1] == o.mask && n->in[2] == o.additive_mask &&
          n->in[3] == o.key_padding_mask);
    CHECK(n->saved == NULL);  // backward needs only y, the node's output
    ag_tape_free(tp);
    free_opts(&o);
    ag_tensor_free(x);
}

// ---- Errors -----------------------------------------------------------------------------

static void check_error(ag_tensor *x, const ag_softmax_opts *o, const char *expected) {
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    CHECK(ag_softmax(tp, x, o) == NULL);
    CHECK(testing_error_count == 1);
    if (!strstr(testing_last_error, expected)) {
        fprintf(stderr, "  message: %s\n  expected it to contain: %s\n", testing_last_error,
                expected);
        CHECK(!"error message");
    }
    CHECK(strchr(testing_last_error, '\n') == NULL);
    ag_tape_free(tp);
    testing_release_errors();
}

static void test_bad_inputs_report_op_and_shapes(void) {
    const int xs[] = {2, 4, 5, 7}, bad[] = {5, 6}, ts[] = {5, 7}, ks[] = {3, 7}, x2[] = {5, 7},
              x1[] = {7};
    ag_tensor *x = scores(4, xs, 110), *s2 = scores(2, x2, 111), *s1 = scores(1, x1, 112);
    ag_tensor *mask_bad = bool_mask(2, bad, 0.5, 1), *mask_f = normal(AG_F64, 2, ts, 2, 1.0);
    ag_tensor *add32 = normal(AG_F32, 2, ts, 3, 1.0), *kp_bad = bool_mask(2, ks, 0.5, 4);
    ag_tensor *kp_ok = bool_mask(2, (const int[]){5, 7}, 0.5, 5);

    check_error(x, &(ag_softmax_opts){.mask = mask_bad},
                "softmax: mask [5,6] does not match scores [2,4,5,7]");
    check_error(x, &(ag_softmax_opts){.mask = mask_f}, "softmax: mask [5,7] must be bool");
    check_error(x, &(ag_softmax_opts){.additive_mask = add32},
                "softmax: additive_mask [5,7] is f32 but scores [2,4,5,7] are f64");
    check_error(x, &(ag_softmax_opts){.additive_mask = mask_bad},
                "softmax: additive_mask [5,6] is bool but scores [2,4,5,7] are f64");
    check_error(x, &(ag_softmax_opts){.key_padding_mask = kp_bad},
                "softmax: key_padding_mask [3,7] does not match scores [2,4,5,7] "
                "(expected [2,7])");
    check_error(x, &(ag_softmax_opts){.key_padding_mask = mask_f},
                "softmax: key_padding_mask [5,7] must be bool");
    check_error(s2, &(ag_softmax_opts){.key_padding_mask = kp_ok},
                "softmax: key_padding_mask [5,7] needs scores with a batch dimension");
    check_error(s1, NULL, "softmax: scores must have 2 to 4 dimensions, got [7]");
    check_error(x, &(ag_softmax_opts){.scale = NAN}, "softmax: scale must be finite");
    check_error(mask_bad, NULL, "softmax: scores [5,6] must be f32 or f64, not bool");
    check_error(NULL, NULL, "softmax: scores is NULL");

    ag_tensor *all[] = {x, s2, s1, mask_bad, mask_f, add32, kp_bad, kp_ok};
    for (int i = 0; i < 8; i++) ag_tensor_free(all[i]);
}

// ---- Threads ------------------------------------------------------------------------------

// Big enough that agi_parallel_for really splits the rows.
static void run_big(ag_tensor *x, ag_tensor *add, const ag_softmax_opts *o, double *out) {
    ag_tensor_zero_grad(x);
    ag_tensor_zero_grad(add);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = forward_backward(tp, x, o, 120);
    size_t n = x->numel;
    memcpy(out, y->data, n * sizeof *out);
    memcpy(out + n, x->grad, n * sizeof *out);
    memcpy(out + 2 * n, add->grad, add->numel * sizeof *out);
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_run_to_run_and_to_one_thread(void) {
    const int xs[] = {2, 4, 64, 96}, ts[] = {64, 96}, ks[] = {2, 96};
    ag_tensor *x = scores(4, xs, 121);
    ag_softmax_opts o = {.scale = 0.125, .causal = true, .mask = bool_mask(2, ts, 0.1, 122),
                         .additive_mask = normal(AG_F64, 2, ts, 123, 1.0),
                         .key_padding_mask = bool_mask(2, ks, 0.1, 124)};
    ag_tensor_set_requires_grad(o.additive_mask, true);
    size_t len = 2 * x->numel + o.additive_mask->numel;
    double *one = malloc(len * sizeof *one), *a = malloc(len * sizeof *a),
           *b = malloc(len * sizeof *b);
    run_big(x, o.additive_mask, &o, one);
    ag_threads_set(2);
    run_big(x, o.additive_mask, &o, a);
    run_big(x, o.additive_mask, &o, b);
    ag_threads_set(1);
    CHECK(memcmp(a, b, len * sizeof *a) == 0);
    // Rows are independent and the shared mask's gradient is summed over slices in a
    // fixed order, so the thread count does not change a bit either.
    CHECK(memcmp(a, one, len * sizeof *a) == 0);
    free(one);
    free(a);
    free(b);
    free_opts(&o);
    ag_tensor_free(x);
}

typedef struct {
    ag_tensor *x, *dy;
    ag_softmax_opts o;
} step_args;

static void softmax_step(ag_tape *tp, int step, void *user) {
    (void)step;
    step_args *a = user;
    ag_backward_with(tp, ag_softmax(tp, a->x, &a->o), a->dy);
}

// After the first step has sized the tape, a step allocates nothing, on one thread
// or two (big enough that both threaded paths run).
static void test_repeated_step_allocates_no_heap_memory(void) {
    const int xs[] = {2, 4, 64, 96}, ts[] = {64, 96}, ks[] = {2, 96};
    step_args a = {requiring_grad(normal(AG_F32, 4, xs, 130, 1.0)), normal(AG_F32, 4, xs, 131, 1.0),
                   {.scale = 0.125, .causal = true, .mask = bool_mask(2, ts, 0.1, 132),
                    .additive_mask = requiring_grad(normal(AG_F32, 2, ts, 133, 1.0)),
                    .key_padding_mask = bool_mask(2, ks, 0.1, 134)}};
    CHECK(repeated_step_allocates_nothing(softmax_step, &a));
    free_opts(&a.o);
    ag_tensor_free(a.x);
    ag_tensor_free(a.dy);
}

int main(void) {
    RUN(test_forward_matches_naive_computation);
    RUN(test_rows_sum_to_one_and_large_scores_are_stable);
    RUN(test_null_opts_and_zero_scale_are_plain_softmax);
    RUN(test_single_allowed_key_gives_exactly_one_and_zero_grad);
    RUN(test_fully_masked_row_by_bool_mask_gives_zeros_and_zero_grad);
    RUN(test_fully_masked_row_by_key_padding_gives_zeros_and_zero_grad);
    RUN(test_fully_masked_row_by_additive_neg_inf_gives_zeros_and_zero_grad);
    RUN(test_masked_keys_get_exactly_zero_gradient);
    RUN(test_gradcheck_plain_and_scaled_over_shapes);
    RUN(test_gradcheck_bool_mask_shared_and_per_slice);
    RUN(test_gradcheck_additive_mask_requiring_grad);
    RUN(test_gradcheck_causal_with_t_not_equal_s);
    RUN(test_gradcheck_key_padding);
    RUN(test_gradcheck_window_and_query_offset);
    RUN(test_gradcheck_all_masks_combined);
    RUN(test_float32_matches_float64);
    RUN(test_float32_mask_and_table_gradients_over_many_rows_match_float64);
    RUN(test_masks_are_recorded_as_inputs_and_nothing_is_saved);
    RUN(test_bad_inputs_report_op_and_shapes);
    RUN(test_two_threads_are_bit_identical_run_to_run_and_to_one_thread);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
