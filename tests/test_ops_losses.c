// Losses: cross-entropy (fused log-softmax, ignore_index, extreme logits,
// PyTorch values) and mean squared error.
#include "op_checks.h"
#include <stdlib.h>

#define IGNORE (-100)  // PyTorch's default ignore_index

// ---- Cross-entropy -----------------------------------------------------------------------

typedef struct {
    const int32_t *targets;
    size_t n;
    int32_t ignore_index;
} ce_targets;

static ag_tensor *ce_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const ce_targets *t = user;
    return ag_cross_entropy(tp, in[0], t->targets, t->n, t->ignore_index);
}

// Targets uniform in [0, C), with every `ignore_every`-th one (if > 0) ignored.
static void random_targets(int32_t *t, size_t rows, int C, int ignore_every, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 9);
    for (size_t r = 0; r < rows; r++) {
        t[r] = (int32_t)ag_pcg32_bounded(&rng, (uint32_t)C);
        if (ignore_every > 0 && r % (size_t)ignore_every == 1) t[r] = IGNORE;
    }
}

// The definition, term by term: p = exp(x) / sum exp(x) without any shift (fine
// for the moderate logits used here), loss = mean of -log p[target] over kept
// rows, dloss/dx = (p - onehot) / kept.
static double naive_cross_entropy(const ag_tensor *x, const int32_t *t, double *grad) {
    size_t C = (size_t)x->shape[x->ndim - 1], rows = x->numel / C, kept = 0;
    double loss = 0;
    for (size_t r = 0; r < rows; r++) kept += t[r] != IGNORE;
    for (size_t r = 0; r < rows; r++) {
        double z = 0;
        for (size_t c = 0; c < C; c++) z += exp(ag_tensor_item(x, r * C + c));
        for (size_t c = 0; c < C; c++) {
            double p = exp(ag_tensor_item(x, r * C + c)) / z;
            grad[r * C + c] = t[r] == IGNORE ? 0.0 : (p - (c == (size_t)t[r])) / (double)kept;
        }
        if (t[r] != IGNORE) loss -= log(exp(ag_tensor_item(x, r * C + (size_t)t[r])) / z);
    }
    return loss / (double)kept;
}

static void test_cross_entropy_matches_naive_log_softmax(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){3, {3, 4, 6}}, 1, -4, 4);
    ag_tensor_set_requires_grad(x, true);
    int32_t t[12];
    random_targets(t, 12, 6, 5, 2);
    double grad[72];
    double want = naive_cross_entropy(x, t, grad);
    ag_tensor *y = ag_cross_entropy(tp, x, t, 12, IGNORE);
    CHECK(y && y->ndim == 0);
    CHECK_NEAR(ag_tensor_item(y, 0), want, 1e-13);
    ag_backward(tp, y);
    for (size_t i = 0; i < 72; i++) CHECK_NEAR(ag_tensor_grad_item(x, i), grad[i], 1e-14);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

// From PyTorch 1.13 (/usr/bin/python3):
//   x = torch.tensor([[1.5, -0.25, 0.5, 2.0], [0.0, 3.0, -1.0, 0.5],
//                     [-2.0, 0.75, 1.25, -0.5]], dtype=torch.float64, requires_grad=True)
//   t = torch.tensor([3, -100, 0])
//   loss = torch.nn.functional.cross_entropy(x, t, ignore_index=-100); loss.backward()
//   print('%.17g' % loss.item())
//   print([['%.17g' % v for v in row] for row in x.grad.tolist()])
static void test_cross_entropy_matches_pytorch_fixed_case(void) {
    const double logits[12] = {1.5, -0.25, 0.5, 2.0, 0.0, 3.0, -1.0, 0.5, -2.0, 0.75, 1.25, -0.5};
    const int32_t t[3] = {3, IGNORE, 0};
    const double torch_loss = 2.2542342909287179;
    const double torch_grad[12] = {
        0.15672140548318556,  0.027234096653909367, 0.057654583068757315, -0.24161008520585225,
        0,                    0,                    0,                    0,
        -0.48934235075540305, 0.16671368388402583,  0.27486439673637053,  0.047764270135006781};
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){3, 4}, logits);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *y = ag_cross_entropy(tp, x, t, 3, IGNORE);
    CHECK_NEAR(ag_tensor_item(y, 0), torch_loss, 1e-15);
    ag_backward(tp, y);
    for (size_t i = 0; i < 12; i++) CHECK_NEAR(ag_tensor_grad_item(x, i), torch_grad[i], 1e-15);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_ignored_rows_contribute_nothing(void) {
    // Rows 1 and 3 are ignored: the loss equals the loss of rows 0 and 2 alone,
    // however large the ignored logits are, and their gradient is exactly 0.
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){2, {4, 3}}, 3, -2, 2);
    ag_tensor_set_item(x, 1 * 3 + 0, 1e30);
    ag_tensor_set_item(x, 3 * 3 + 2, -1e30);
    ag_tensor_set_requires_grad(x, true);
    const int32_t t[4] = {2, IGNORE, 0, IGNORE};
    ag_tensor *y = ag_cross_entropy(tp, x, t, 4, IGNORE);
    ag_backward(tp, y);

    ag_tensor *kept = ag_tensor_zeros(AG_F64, 2, (int[]){2, 3});
    for (size_t c = 0; c < 3; c++) {
        ag_tensor_set_item(kept, c, ag_tensor_item(x, c));
        ag_tensor_set_item(kept, 3 + c, ag_tensor_item(x, 2 * 3 + c));
    }
    ag_tensor_set_requires_grad(kept, true);
    const int32_t kept_t[2] = {2, 0};
    ag_tensor *y_kept = ag_cross_entropy(tp, kept, kept_t, 2, IGNORE);
    ag_backward(tp, y_kept);

    CHECK(ag_tensor_item(y, 0) == ag_tensor_item(y_kept, 0));
    for (size_t c = 0; c < 3; c++) {
        CHECK(ag_tensor_grad_item(x, 1 * 3 + c) == 0.0);
        CHECK(ag_tensor_grad_item(x, 3 * 3 + c) == 0.0);
        CHECK(ag_tensor_grad_item(x, c) == ag_tensor_grad_item(kept, c));
        CHECK(ag_tensor_grad_item(x, 2 * 3 + c) == ag_tensor_grad_item(kept, 3 + c));
    }
    ag_tensor_free(kept);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

// An ignored row's gradient is 0 times its softmax: NaN when the softmax is, as PyTorch 1.13
// gives (x.grad after cross_entropy(x, t, ignore_index=-100).backward(), ignored rows with
// a NaN logit, a +inf logit, every logit -inf, and a -inf among finite logits: NaN, NaN, NaN,
// 0). The same with every target ignored (loss 0 here, NaN in PyTorch). Both dtypes, and
// 11 classes (16-row blocks in AVX-512) and 40 (rows) over 19 rows.
static void test_ignored_rows_with_a_nan_softmax_get_nan(void) {
    const int sizes[2] = {11, 40};
    for (int d = 0; d < 2; d++)
        for (int w = 0; w < 2; w++)
            for (int all = 0; all < 2; all++) {
                const ag_dtype dt = d ? AG_F64 : AG_F32;
                const int C = sizes[w], R = 19;
                ag_tape *tp = ag_tape_new();
                ag_tensor *x = random_tensor(dt, (test_shape){2, {R, C}}, 7 + w, -2, 2);
                int32_t t[19];
                for (int r = 0; r < R; r++) t[r] = all || r % 4 == 1 ? IGNORE : r % C;
                ag_tensor_set_item(x, 1 * C + 2, NAN);       // ignored: NaN
                ag_tensor_set_item(x, 5 * C + C - 1, INFINITY);  // ignored: NaN
                for (int c = 0; c < C; c++) ag_tensor_set_item(x, 9 * C + c, -INFINITY);  // NaN
                ag_tensor_set_item(x, 13 * C, -INFINITY);    // ignored, finite softmax: 0
                ag_tensor_set_requires_grad(x, true);
                ag_tensor *y = ag_cross_entropy(tp, x, t, (size_t)R, IGNORE);
                CHECK(isfinite(ag_tensor_item(y, 0)));
                ag_backward(tp, y);
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < C; c++) {
                        const double g = ag_tensor_grad_item(x, (size_t)(r * C + c));
                        if (r == 1 || r == 5 || r == 9) CHECK(isnan(g));
                        else if (t[r] == IGNORE) CHECK(g == 0.0);
                        else CHECK(isfinite(g) && g != 0.0);
                    }
                ag_tensor_free(x);
                ag_tape_free(tp);
            }
}

static void test_ignore_index_may_be_a_class_id(void) {
    // As in PyTorch, any value can be ignore_index, also one inside [0, C).
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){2, {3, 4}}, 4, -2, 2);
    ag_tensor_set_requires_grad(x, true);
    const int32_t t[3] = {1, 2, 3}, only_first[3] = {1, IGNORE, IGNORE};
    double a = ag_tensor_item(ag_cross_entropy(tp, x, t, 3, 2), 0);
    double b = ag_tensor_item(ag_cross_entropy(tp, x, only_first, 3, IGNORE), 0);
    double c = ag_tensor_item(ag_cross_entropy(tp, x, (const int32_t[]){IGNORE, IGNORE, 3},
                                              3, IGNORE), 0);
    CHECK_NEAR(a, (b + c) / 2, 1e-15);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_all_targets_ignored_gives_zero_loss_and_zero_grad(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F32, (test_shape){2, {3, 5}}, 5, -2, 2);
    ag_tensor_set_requires_grad(x, true);
    const int32_t t[3] = {IGNORE, IGNORE, IGNORE};
    ag_tensor *y = ag_cross_entropy(tp, x, t, 3, IGNORE);
    CHECK(y && ag_tensor_item(y, 0) == 0.0);
    ag_backward(tp, y);
    CHECK(x->grad != NULL);
    for (size_t i = 0; i < x->numel; i++) CHECK(ag_tensor_grad_item(x, i) == 0.0);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_extreme_logits_give_finite_loss_and_gradient(void) {
    // Row 0: lse = 1000, loss 1000 - (-1000) = 2000; p = (1, 0, 0).
    // Row 1: lse = 1000 + log(1 + e^-1), loss = 1 + log(1 + e^-1);
    //        p = (0, s, 1 - s), s = 1 / (1 + e^-1).
    const double logits[6] = {1000, -1000, 0, -1000, 1000, 999};
    const int32_t t[2] = {1, 2};
    const double s = 1 / (1 + exp(-1.0));
    const double want_loss = (2000 + 1 + log1p(exp(-1.0))) / 2;
    const double want_grad[6] = {0.5, -0.5, 0, 0, s / 2, (1 - s - 1) / 2};
    ag_dtype dts[2] = {AG_F64, AG_F32};
    for (int d = 0; d < 2; d++) {
        ag_tape *tp = ag_tape_new();
        ag_tensor *x64 = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, logits);
        ag_tensor *x = ag_tensor_convert(x64, dts[d]);
        ag_tensor_set_requires_grad(x, true);
        ag_tensor *y = ag_cross_entropy(tp, x, t, 2, IGNORE);
        // lse = 1000.31... carries an absolute rounding error of about 1e-13 in
        // double, which x - lse passes on to the probabilities.
        double tol = dts[d] == AG_F64 ? 1e-12 : 1e-6;
        CHECK(isfinite(ag_tensor_item(y, 0)));
        CHECK_NEAR(ag_tensor_item(y, 0), want_loss, tol);
        ag_backward(tp, y);
        for (size_t i = 0; i < 6; i++) {
            CHECK(isfinite(ag_tensor_grad_item(x, i)));
            CHECK_NEAR(ag_tensor_grad_item(x, i), want_grad[i], tol);
        }
        ag_tensor_free(x);
        ag_tensor_free(x64);
        ag_tape_free(tp);
    }
}

// A confident row, logits (0, -d, -d) with target 0, has the small loss log(1 + 2e^-d)
// (by hand: lse = log(1 + 2e^-d), x[t] = 0). Its sum s = 1 + 2e^-d is rounded once, to
// within 2^-53 of 1, so the loss can be had to that absolute error, as PyTorch has it
// (about 1e-16 here). The chunk's log of a product of sums once took its mantissa in
// [1/2, 1) and added 16 ln 2 back: an error of an ulp of 11, about 2e-15, on a loss
// of 1e-13.
static void test_cross_entropy_small_loss_keeps_its_accuracy_f64(void) {
    const double ds[] = {10, 15, 20, 25, 30, 35};
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        const double d = ds[k];
        ag_tape *tp = ag_tape_new();
        ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){1, 3}, (double[]){0, -d, -d});
        const int32_t t[1] = {0};
        ag_tensor *y = ag_cross_entropy(tp, x, t, 1, IGNORE);
        const double want = log1p(2 * exp(-d));
        CHECK(y && fabs(ag_tensor_item(y, 0) - want) <= 2.5e-16);
        if (y && !(fabs(ag_tensor_item(y, 0) - want) <= 2.5e-16))
            fprintf(stderr, "  d = %g: loss %.17g, want %.17g\n", d, ag_tensor_item(y, 0), want);
        ag_tensor_free(x);
        ag_tape_free(tp);
    }
}

static void test_cross_entropy_gradcheck_f64_over_shapes(void) {
    const struct {
        test_shape logits;
        int ignore_every;
    } cases[] = {
        {{1, {5}}, 0},          {{2, {1, 1}}, 0},      {{2, {4, 3}}, 0},
        {{2, {6, 4}}, 3},       {{3, {2, 3, 5}}, 2},   {{4, {2, 2, 2, 3}}, 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        test_shape s = cases[c].logits;
        ag_tensor *x = random_tensor(AG_F64, s, 10 + c, -3, 3);
        ag_tensor_set_requires_grad(x, true);
        int C = s.shape[s.ndim - 1];
        int32_t t[24];
        random_targets(t, x->numel / (size_t)C, C, cases[c].ignore_every, 20 + c);
        ce_targets user = {t, x->numel / (size_t)C, IGNORE};
        CHECK(ag_gradcheck(ce_fn, &x, 1, &user, NULL, NULL));
        ag_tensor_free(x);
    }
}

static void test_cross_entropy_f32_matches_f64(void) {
    ag_tensor *x = random_tensor(AG_F64, (test_shape){3, {2, 8, 10}}, 30, -5, 5);
    ag_tensor_set_requires_grad(x, true);
    int32_t t[16];
    random_targets(t, 16, 10, 5, 31);
    ce_targets user = {t, 16, IGNORE};
    CHECK(f32_vs_f64_error(ce_fn, &x, 1, &user) <= 1e-5);
    ag_tensor_free(x);
}

static void test_cross_entropy_without_recording_gives_the_same_loss(void) {
    // In no-grad mode nothing is kept for backward; the value must not change.
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F32, (test_shape){2, {5, 7}}, 35, -3, 3);
    ag_tensor_set_requires_grad(x, true);
    int32_t t[5];
    random_targets(t, 5, 7, 2, 36);
    ag_tensor *recorded = ag_cross_entropy(tp, x, t, 5, IGNORE);
    ag_tape_set_grad_enabled(tp, false);
    ag_tensor *plain = ag_cross_entropy(tp, x, t, 5, IGNORE);
    CHECK(recorded->requires_grad && !plain->requires_grad);
    CHECK(ag_tensor_item(plain, 0) == ag_tensor_item(recorded, 0));
    CHECK(ag_tape_num_nodes(tp) == 1);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_cross_entropy_same_bits_with_one_or_two_threads(void) {
    // Large enough (64 x 200 logits) for the rows to be split over threads.
    enum { ROWS = 64, C = 200 };
    ag_tensor *x = random_tensor(AG_F32, (test_shape){2, {ROWS, C}}, 40, -4, 4);
    ag_tensor_set_requires_grad(x, true);
    int32_t t[ROWS];
    random_targets(t, ROWS, C, 7, 41);
    static float grad[2][ROWS * C];
    float loss[2];
    for (int run = 0; run < 2; run++) {
        ag_threads_set(run + 1);
        ag_tape *tp = ag_tape_new();
        ag_tensor_zero_grad(x);
        ag_tensor *y = ag_cross_entropy(tp, x, t, ROWS, IGNORE);
        ag_backward(tp, y);
        loss[run] = ag_tensor_f32(y)[0];
        memcpy(grad[run], x->grad, sizeof grad[run]);
        ag_tape_free(tp);
    }
    ag_threads_set(1);
    CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0);
    CHECK(memcmp(grad[0], grad[1], sizeof grad[0]) == 0);
    ag_tensor_free(x);
}

static void test_out_of_range_target_names_position_and_value(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F32, 2, (int[]){4, 5});
    testing_catch_errors();
    CHECK(ag_cross_entropy(tp, x, (const int32_t[]){0, 4, IGNORE, 7}, 4, IGNORE) == NULL);
    CHECK(strcmp(testing_last_error,
                 "cross_entropy: target 7 at position 3 is out of range for 5 classes "
                 "(logits [4,5], ignore_index -100)") == 0);
    CHECK(ag_cross_entropy(tp, x, (const int32_t[]){0, -1, 0, 0}, 4, IGNORE) == NULL);
    CHECK(strstr(testing_last_error, "cross_entropy: target -1 at position 1 ") ==
          testing_last_error);
    // -100 is an ordinary out-of-range target when ignore_index is something else.
    CHECK(ag_cross_entropy(tp, x, (const int32_t[]){0, 1, 2, -100}, 4, -1) == NULL);
    CHECK(strstr(testing_last_error, "target -100 at position 3") != NULL);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tensor_free(x);
    ag_tape_free(tp);
}

// Targets are checked and copied in chunks split over the threads: the first bad one is
// still the one named, however far in and however many are bad; with none bad, the loss
// counts exactly the rows not ignored and reads the copy (the caller's array may change
// before backward).
static void test_targets_of_many_rows_checked_on_threads(void) {
    enum { ROWS = 100003, C = 3 };
    ag_tensor *x = ag_tensor_zeros(AG_F32, 2, (int[]){ROWS, C});
    ag_tensor_set_requires_grad(x, true);
    int32_t *t = malloc(ROWS * sizeof *t);
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        ag_tape *tp = ag_tape_new();
        for (int r = 0; r < ROWS; r++) t[r] = r % 5 == 4 ? IGNORE : r % C;
        t[70001] = C, t[99000] = -7, t[100002] = 1000;
        testing_catch_errors();
        CHECK(ag_cross_entropy(tp, x, t, ROWS, IGNORE) == NULL);
        CHECK(strcmp(testing_last_error,
                     "cross_entropy: target 3 at position 70001 is out of range for 3 classes "
                     "(logits [100003,3], ignore_index -100)") == 0);
        t[70001] = 0;
        CHECK(ag_nll_loss(tp, x, t, ROWS, IGNORE) == NULL);
        CHECK(strcmp(testing_last_error,
                     "nll_loss: target -7 at position 99000 is out of range for 3 classes "
                     "(logp [100003,3], ignore_index -100)") == 0);
        CHECK(testing_error_count == 2);
        testing_release_errors();
        t[99000] = 1, t[100002] = 2;
        // All logits 0: each kept row's loss is log 3, and backward sees the targets as they
        // were at the call, not as changed after it.
        ag_tensor *y = ag_cross_entropy(tp, x, t, ROWS, IGNORE);
        CHECK(y != NULL);
        CHECK(fabs(ag_tensor_f32(y)[0] - log(3.0)) < 1e-6);
        for (int r = 0; r < ROWS; r++) t[r] = IGNORE;
        ag_tensor_zero_grad(x);
        ag_backward(tp, y);
        const float *g = x->grad;
        // Row 5 is kept with target 2 (5 % 3), row 4 ignored: grad = (1/3 - onehot) / kept.
        const double kept = ROWS - ROWS / 5;
        CHECK(fabs(g[5 * C + 2] - (1.0 / 3 - 1) / kept) < 1e-12);
        CHECK(fabs(g[5 * C + 0] - (1.0 / 3) / kept) < 1e-12);
        CHECK(g[4 * C + 0] == 0 && g[4 * C + 1] == 0 && g[4 * C + 2] == 0);
        ag_tape_free(tp);
    }
    ag_threads_set(1);
    free(t);
    ag_tensor_free(x);
}

// The count is checked before any target is read, so a short array (here 3
// targets for 4 rows, inside a larger buffer so an overread would go unseen)
// is an error naming the count and the logits, not a read past its end.
static void test_target_count_other_than_rows_is_an_error(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F32, 3, (int[]){2, 2, 5});
    const int32_t t[5] = {0, 1, 2, 3, 4};
    testing_catch_errors();
    CHECK(ag_cross_entropy(tp, x, t, 3, IGNORE) == NULL);
    CHECK(strcmp(testing_last_error,
                 "cross_entropy: 3 targets for logits [2,2,5], which has 4 rows") == 0);
    CHECK(ag_cross_entropy(tp, x, t, 5, IGNORE) == NULL);
    CHECK(strcmp(testing_last_error,
                 "cross_entropy: 5 targets for logits [2,2,5], which has 4 rows") == 0);
    CHECK(testing_error_count == 2);
    testing_release_errors();
    CHECK(ag_cross_entropy(tp, x, t, 4, IGNORE) != NULL);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_cross_entropy_bad_logits_or_targets_are_errors(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *scalar = ag_tensor_zeros(AG_F32, 0, NULL);
    ag_tensor *mask = ag_tensor_zeros(AG_BOOL, 2, (int[]){4, 5});
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){4, 5});
    testing_catch_errors();
    CHECK(ag_cross_entropy(tp, scalar, (const int32_t[]){0}, 1, IGNORE) == NULL);
    CHECK(strcmp(testing_last_error,
                 "cross_entropy: logits [..., C] must have 1 to 4 dimensions, got []") == 0);
    CHECK(ag_cross_entropy(tp, mask, (const int32_t[]){0, 0, 0, 0}, 4, IGNORE) == NULL);
    CHECK(strcmp(testing_last_error,
                 "cross_entropy: logits [4,5] must be f32 or f64, not bool") == 0);
    CHECK(ag_cross_entropy(tp, x, NULL, 4, IGNORE) == NULL);
    CHECK(strcmp(testing_last_error,
                 "cross_entropy: targets is NULL (logits [4,5], 4 targets expected)") == 0);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tensor_free(x);
    ag_tensor_free(mask);
    ag_tensor_free(scalar);
    ag_tape_free(tp);
}

// ---- Mean squared error -----------------------------------------------------------------

static ag_tensor *mse_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n, (void)user;
    return ag_mse(tp, in[0], in[1]);
}

static void test_mse_is_the_mean_of_squared_differences(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){3, {2, 3, 4}}, 50, -2, 2);
    ag_tensor *t = random_tensor(AG_F64, (test_shape){3, {2, 3, 4}}, 51, -2, 2);
    double want = 0;
    for (size_t i = 0; i < x->numel; i++) {
        double d = ag_tensor_item(x, i) - ag_tensor_item(t, i);
        want += d * d;
    }
    want /= (double)x->numel;
    ag_tensor *y = ag_mse(tp, x, t);
    CHECK(y && y->ndim == 0);
    CHECK_NEAR(ag_tensor_item(y, 0), want, 1e-15);
    ag_tensor_free(t);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_mse_gradients_reach_both_inputs_with_opposite_signs(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){2, {3, 4}}, 52, -2, 2);
    ag_tensor *t = random_tensor(AG_F64, (test_shape){2, {3, 4}}, 53, -2, 2);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor_set_requires_grad(t, true);
    ag_backward(tp, ag_mse(tp, x, t));
    for (size_t i = 0; i < x->numel; i++) {
        double want = 2 * (ag_tensor_item(x, i) - ag_tensor_item(t, i)) / 12;
        CHECK_NEAR(ag_tensor_grad_item(x, i), want, 1e-15);
        CHECK_NEAR(ag_tensor_grad_item(t, i), -want, 1e-15);
    }
    ag_tensor_free(t);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_mse_target_without_grad_receives_none(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){1, {5}}, 54, -2, 2);
    ag_tensor *t = random_tensor(AG_F64, (test_shape){1, {5}}, 55, -2, 2);
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_mse(tp, x, t));
    CHECK(x->grad != NULL);
    CHECK(t->grad == NULL);
    ag_tensor_free(t);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

// The gradient is grouped (2 / n) (x - target) dy, as PyTorch's mse_loss_backward: with dy
// near the largest double, 2 dy / n overflowed first. torch 1.13, x = [-2, 0.5, 1],
// target = [0, -1.5, 1.25], dy = 1e308 (float64): x.grad = [-1.3333333333333333e+308,
// 1.3333333333333333e+308, -1.6666666666666666e+307], target.grad = -x.grad; float32 with
// dy = 3e38: x.grad = [-inf, inf, -5.000000347203086e+37].
static void test_mse_gradient_of_a_huge_upstream_is_pytorchs(void) {
    const double want64[3] = {-1.3333333333333333e+308, 1.3333333333333333e+308,
                              -1.6666666666666666e+307};
    const double want32[3] = {-INFINITY, INFINITY, -5.000000347203086e+37};
    for (int f = 0; f < 2; f++) {
        const ag_dtype dt = f ? AG_F32 : AG_F64;
        ag_tensor *x64 = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){-2, 0.5, 1});
        ag_tensor *t64 = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){0, -1.5, 1.25});
        ag_tensor *x = ag_tensor_convert(x64, dt), *t = ag_tensor_convert(t64, dt);
        ag_tensor_set_requires_grad(x, true);
        ag_tensor_set_requires_grad(t, true);
        ag_tensor *dy = ag_tensor_zeros(dt, 0, NULL);
        ag_tensor_set_item(dy, 0, f ? 3e38 : 1e308);
        ag_tape *tp = ag_tape_new();
        ag_backward_with(tp, ag_mse(tp, x, t), dy);
        for (size_t k = 0; k < 3; k++) {
            const double w = f ? want32[k] : want64[k];
            CHECK(ag_tensor_grad_item(x, k) == w);
            CHECK(ag_tensor_grad_item(t, k) == -w);
        }
        ag_tape_free(tp);
        ag_tensor_free(x64);
        ag_tensor_free(t64);
        ag_tensor_free(x);
        ag_tensor_free(t);
        ag_tensor_free(dy);
    }
}

static void test_mse_gradcheck_f64_over_shapes(void) {
    const test_shape shapes[] = {
        {0, {0}}, {1, {1}}, {1, {9}}, {2, {3, 4}}, {3, {2, 3, 4}}, {4, {2, 1, 3, 2}},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        ag_tensor *in[2] = {random_tensor(AG_F64, shapes[s], 60 + s, -2, 2),
                            random_tensor(AG_F64, shapes[s], 70 + s, -2, 2)};
        ag_tensor_set_requires_grad(in[0], true);
        ag_tensor_set_requires_grad(in[1], s % 2 == 0);  // a fixed target half the time
        CHECK(ag_gradcheck(mse_fn, in, 2, NULL, NULL, NULL));
        ag_tensor_free(in[0]);
        ag_tensor_free(in[1]);
    }
}

static void test_mse_f32_matches_f64(void) {
    ag_tensor *in[2] = {random_tensor(AG_F64, (test_shape){3, {4, 8, 16}}, 80, -3, 3),
                        random_tensor(AG_F64, (test_shape){3, {4, 8, 16}}, 81, -3, 3)};
    ag_tensor_set_requires_grad(in[0], true);
    ag_tensor_set_requires_grad(in[1], true);
    CHECK(f32_vs_f64_error(mse_fn, in, 2, NULL) <= 1e-5);
    ag_tensor_free(in[0]);
    ag_tensor_free(in[1]);
}

static void test_mse_shape_mismatch_names_both_shapes(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *a = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    ag_tensor *b = ag_tensor_zeros(AG_F32, 2, (int[]){3, 2});
    ag_tensor *flat = ag_tensor_zeros(AG_F32, 1, (int[]){6});
    ag_tensor *b64 = ag_tensor_zeros(AG_F64, 2, (int[]){2, 3});
    testing_catch_errors();
    CHECK(ag_mse(tp, a, b) == NULL);
    CHECK(strcmp(testing_last_error, "mse: shapes differ: [2,3] and [3,2]") == 0);
    CHECK(ag_mse(tp, a, flat) == NULL);  // equal numel is not enough
    CHECK(strcmp(testing_last_error, "mse: shapes differ: [2,3] and [6]") == 0);
    CHECK(ag_mse(tp, a, b64) == NULL);
    CHECK(strcmp(testing_last_error, "mse: dtypes differ: f32 [2,3] and f64 [2,3]") == 0);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tensor_free(b64);
    ag_tensor_free(flat);
    ag_tensor_free(b);
    ag_tensor_free(a);
    ag_tape_free(tp);
}

// ---- A training step through all the ops of this area -----------------------------------

enum { STEP_V = 50, STEP_C = 200, STEP_ROWS = 64 };

typedef struct {
    ag_tensor *w, *target;  // w: [V, C], target: [4, 16, C]
    int32_t ids[STEP_ROWS], t[STEP_ROWS];
} step_args;

static void training_step(ag_tape *tp, int step, void *user) {
    (void)step;
    const step_args *a = user;
    ag_tensor *h = ag_gelu(tp, ag_embedding(tp, a->w, a->ids, 2, (int[]){4, 16}), AG_GELU_TANH);
    ag_tensor *logits = ag_reshape(tp, ag_relu(tp, h), 2, (int[]){STEP_ROWS, STEP_C});
    ag_tensor *loss =
        ag_add(tp, ag_cross_entropy(tp, logits, a->t, STEP_ROWS, IGNORE), ag_mse(tp, h, a->target));
    ag_backward(tp, loss);
}

// After the first step has sized the tape, a step (embedding, gelu, relu,
// reshape, cross-entropy and mse, forward and backward) allocates nothing, on
// one thread or two.
static void test_repeated_step_allocates_no_heap_memory(void) {
    step_args a;
    a.w = random_tensor(AG_F32, (test_shape){2, {STEP_V, STEP_C}}, 90, -1, 1);
    a.target = random_tensor(AG_F32, (test_shape){3, {4, 16, STEP_C}}, 91, -1, 1);
    ag_tensor_set_requires_grad(a.w, true);
    random_targets(a.ids, STEP_ROWS, STEP_V, 0, 92);
    random_targets(a.t, STEP_ROWS, STEP_C, 9, 93);
    CHECK(repeated_step_allocates_nothing(training_step, &a));
    ag_tensor_free(a.target);
    ag_tensor_free(a.w);
}

// The loss sums its rows' terms in double: in float32, row 0 loses 3e38 - (-3e38) = 6e38,
// which is no float, but the mean over the two rows, (6e38 + log 2) / 2, is. PyTorch 1.13's
// float32 log_softmax gives -inf there and its loss is inf (README, "Extreme values"); its
// gradient, (0.5, -0.5, -0.25, 0.25), is the same.
static void test_cross_entropy_float32_mean_of_a_row_past_float_max_is_finite(void) {
    const float big = 3e38f;
    ag_tensor *x = ag_tensor_from(AG_F32, 2, (int[]){2, 2}, (float[]){big, -big, 0, 0});
    ag_tensor_set_requires_grad(x, true);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_cross_entropy(tp, x, (const int32_t[]){1, 0}, 2, IGNORE);
    CHECK(ag_tensor_item(y, 0) == (float)((2.0 * big + log(2.0)) / 2));
    ag_backward(tp, y);
    const double want[4] = {0.5, -0.5, -0.25, 0.25};
    for (size_t i = 0; i < 4; i++) CHECK(ag_tensor_grad_item(x, i) == want[i]);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

int main(void) {
    RUN(test_cross_entropy_matches_naive_log_softmax);
    RUN(test_cross_entropy_matches_pytorch_fixed_case);
    RUN(test_ignored_rows_contribute_nothing);
    RUN(test_ignored_rows_with_a_nan_softmax_get_nan);
    RUN(test_ignore_index_may_be_a_class_id);
    RUN(test_all_targets_ignored_gives_zero_loss_and_zero_grad);
    RUN(test_extreme_logits_give_finite_loss_and_gradient);
    RUN(test_cross_entropy_float32_mean_of_a_row_past_float_max_is_finite);
    RUN(test_cross_entropy_small_loss_keeps_its_accuracy_f64);
    RUN(test_cross_entropy_gradcheck_f64_over_shapes);
    RUN(test_cross_entropy_f32_matches_f64);
    RUN(test_cross_entropy_without_recording_gives_the_same_loss);
    RUN(test_cross_entropy_same_bits_with_one_or_two_threads);
    RUN(test_out_of_range_target_names_position_and_value);
    RUN(test_target_count_other_than_rows_is_an_error);
    RUN(test_targets_of_many_rows_checked_on_threads);
    RUN(test_cross_entropy_bad_logits_or_targets_are_errors);
    RUN(test_mse_is_the_mean_of_squared_differences);
    RUN(test_mse_gradients_reach_both_inputs_with_opposite_signs);
    RUN(test_mse_target_without_grad_receives_none);
    RUN(test_mse_gradcheck_f64_over_shapes);
    RUN(test_mse_gradient_of_a_huge_upstream_is_pytorchs);
    RUN(test_mse_f32_matches_f64);
    RUN(test_mse_shape_mismatch_names_both_shapes);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
