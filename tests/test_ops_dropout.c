// ag_dropout and ag_dropout_row_mask: the documented keep rule, replay by
// (seed, site), scaling, the p = 0 / p = 1 / eval edges, gradient checks, the
// bitmask's size, and determinism under threads.
#include <limits.h>
#include <stdlib.h>

#include "../src/ops/op.h"
#include "op_checks.h"

// Inputs in [0.5, 2): never 0, so an element was kept iff its output is not 0.
static ag_tensor *uniform(ag_dtype dt, int ndim, const int *shape, uint64_t seed) {
    return requiring_grad(uniform_tensor(dt, ndim, shape, seed, 0.5, 2.0));
}

// keep[k] = whether element k survived (x is never 0, so y != 0 iff kept).
static void kept_of(const ag_tensor *y, uint8_t *keep) {
    for (size_t k = 0; k < y->numel; k++) keep[k] = ag_tensor_item(y, k) != 0.0;
}

static size_t count_kept(const ag_tensor *y) {
    size_t n = 0;
    for (size_t k = 0; k < y->numel; k++) n += ag_tensor_item(y, k) != 0.0;
    return n;
}

static void test_keep_rule_is_pcg32_output_at_least_round_p_times_2_pow_32(void) {
    const int shape[] = {3, 4, 37};
    const double ps[] = {0.1, 0.5, 0.77};
    ag_tensor *x = uniform(AG_F64, 3, shape, 1);
    ag_tape *tp = ag_tape_new();
    for (int i = 0; i < 3; i++) {
        ag_tensor *y = ag_dropout(tp, x, ps[i], true, 1234, 99);
        uint64_t threshold = (uint64_t)llround(ps[i] * 4294967296.0);
        size_t D = 37, rows = x->numel / D, wrong = 0;
        for (size_t r = 0; r < rows; r++) {
            for (size_t c = 0; c < D; c++) {
                // The documented rule, replayed element by element.
                ag_pcg32 g = ag_pcg32_make(1234, 99);
                ag_pcg32_advance(&g, r * D + c);
                bool keep = ag_pcg32_next(&g) >= threshold;
                wrong += keep != (ag_tensor_item(y, r * D + c) != 0.0);
            }
        }
        CHECK(wrong == 0);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_same_seed_and_site_give_the_same_mask_on_every_forward(void) {
    const int shape[] = {4, 50};
    ag_tensor *x = uniform(AG_F64, 2, shape, 2);
    ag_tape *tp = ag_tape_new();
    double *first = malloc(x->numel * sizeof *first);
    memcpy(first, ag_dropout(tp, x, 0.3, true, 7, 3)->data, x->numel * sizeof *first);
    ag_tape_reset(tp);                                   // a new step, as in training
    ag_tensor *b = ag_dropout(tp, x, 0.3, true, 7, 3);
    ag_tensor *b2 = ag_dropout(tp, x, 0.3, true, 7, 3);  // twice on one tape
    CHECK(memcmp(first, b->data, x->numel * sizeof *first) == 0);
    CHECK(memcmp(b2->data, b->data, x->numel * sizeof *first) == 0);
    free(first);
    ag_tape *tp2 = ag_tape_new();
    ag_tensor *c = ag_dropout(tp2, x, 0.3, true, 7, 3);  // and on another tape
    CHECK(memcmp(b->data, c->data, x->numel * sizeof(double)) == 0);
    ag_tape_free(tp);
    ag_tape_free(tp2);
    ag_tensor_free(x);
}

static void test_different_site_or_seed_give_a_different_mask(void) {
    const int shape[] = {8, 64};
    ag_tensor *x = uniform(AG_F64, 2, shape, 3);
    ag_tape *tp = ag_tape_new();
    uint8_t *base = malloc(x->numel), *other = malloc(x->numel);
    kept_of(ag_dropout(tp, x, 0.5, true, 7, 3), base);
    const uint64_t seeds[] = {7, 8, 0}, sites[] = {4, 3, 3};
    for (int i = 0; i < 3; i++) {
        kept_of(ag_dropout(tp, x, 0.5, true, seeds[i], sites[i]), other);
        size_t differ = 0;
        for (size_t k = 0; k < x->numel; k++) differ += base[k] != other[k];
        CHECK(differ > x->numel / 4);  // independent masks differ in about half the places
    }
    free(base);
    free(other);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_kept_fraction_is_close_to_one_minus_p(void) {
    const int shape[] = {1000, 1000};
    ag_tensor *x = ag_tensor_ones(AG_F32, 2, shape);
    ag_tape *tp = ag_tape_new();
    const double ps[] = {0.1, 0.5, 0.9};
    for (int i = 0; i < 3; i++) {
        ag_tape_reset(tp);
        double frac = (double)count_kept(ag_dropout(tp, x, ps[i], true, 5, (uint64_t)i)) / 1e6;
        CHECK_NEAR(frac, 1.0 - ps[i], 0.003);  // 6 standard deviations at most
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_kept_values_are_x_over_one_minus_p_and_dropped_are_zero(void) {
    const int shape[] = {2, 3, 40};
    for (int dt = 0; dt < 2; dt++) {
        ag_tensor *x = uniform(dt ? AG_F64 : AG_F32, 3, shape, 4);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_dropout(tp, x, 0.25, true, 11, 12);
        size_t kept = 0;
        for (size_t k = 0; k < x->numel; k++) {
            double v = ag_tensor_item(y, k), want = ag_tensor_item(x, k) / 0.75;
            if (v == 0.0) continue;
            kept++;
            CHECK_NEAR(v, want, dt ? 1e-15 : 1e-7);
        }
        CHECK(kept > 0 && kept < x->numel);
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

static void test_row_mask_reproduces_every_row_of_the_forward(void) {
    const int shapes[][4] = {{5}, {3, 1}, {4, 31}, {2, 3, 32}, {2, 2, 3, 33}, {3, 100}};
    const int ndims[] = {1, 2, 2, 3, 4, 2};
    for (int c = 0; c < 6; c++) {
        ag_tensor *x = uniform(AG_F32, ndims[c], shapes[c], 5 + (uint64_t)c);
        int D = shapes[c][ndims[c] - 1];
        size_t rows = x->numel / (size_t)D;
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_dropout(tp, x, 0.4, true, 77, 100 + (uint64_t)c);
        uint8_t *fwd = malloc(x->numel), *row = malloc((size_t)D);
        kept_of(y, fwd);
        for (size_t r = 0; r < rows; r++) {
            ag_dropout_row_mask(77, 100 + (uint64_t)c, 0.4, r, D, row);
            CHECK(memcmp(row, fwd + r * D, (size_t)D) == 0);
        }
        free(fwd);
        free(row);
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
    // The edges agree with the forward too: p = 0 keeps all, p = 1 none.
    uint8_t keep[40];
    ag_dropout_row_mask(1, 2, 0.0, 3, 40, keep);
    for (int c = 0; c < 40; c++) CHECK(keep[c] == 1);
    ag_dropout_row_mask(1, 2, 1.0, 3, 40, keep);
    for (int c = 0; c < 40; c++) CHECK(keep[c] == 0);
}

// The forward draws LANES numbers at a time from generators stepped by affine maps; at every
// width around the lane count and the mask word, in both dtypes, on one thread and two, and
// for thresholds near both ends, element (r, c) is kept iff output r * D + c of one plain
// generator reaches the threshold, and backward passes exactly the kept elements.
static void test_lanes_draw_the_documented_numbers_at_every_width(void) {
    const int widths[] = {1, 2, 7, 31, 32, 33, 63, 64, 65, 96, 257, 1000};
    const double ps[] = {0.5, 1e-9, 0.999999};
    for (int t = 1; t <= 2; t++) {
        ag_threads_set(t);
        for (int dt = 0; dt < 2; dt++)
            for (int wi = 0; wi < 12; wi++)
                for (int pi = 0; pi < 3; pi++) {
                    const int D = widths[wi], rows = D < 100 ? 700 : 150;
                    ag_tensor *x = uniform(dt ? AG_F64 : AG_F32, 2, (int[]){rows, D}, 20);
                    ag_tape *tp = ag_tape_new();
                    ag_tensor *y = ag_dropout(tp, x, ps[pi], true, 5 + (uint64_t)wi, 9);
                    ag_backward(tp, ag_sum(tp, y));
                    uint64_t threshold = (uint64_t)llround(ps[pi] * 4294967296.0);
                    ag_pcg32 g = ag_pcg32_make(5 + (uint64_t)wi, 9);
                    size_t wrong = 0;
                    for (size_t k = 0; k < x->numel; k++) {
                        bool keep = ag_pcg32_next(&g) >= threshold;
                        wrong += keep != (ag_tensor_item(y, k) != 0.0);
                        wrong += keep != (ag_tensor_grad_item(x, k) != 0.0);
                    }
                    CHECK(wrong == 0);
                    ag_tape_free(tp);
                    ag_tensor_free(x);
                }
    }
    ag_threads_set(1);
}

// p just below 1 whose threshold round(p 2^32) is 2^32: no 32-bit output reaches it, so
// nothing is kept (y = x * 0, the gradient dy * 0), as at p = 1 and as the row mask says.
static void test_p_whose_threshold_rounds_to_2_pow_32_keeps_nothing(void) {
    const double p = 1 - ldexp(1, -34);
    const int shape[] = {20, 70};
    for (int dt = 0; dt < 2; dt++) {
        ag_tensor *x = uniform(dt ? AG_F64 : AG_F32, 2, shape, 21);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_dropout(tp, x, p, true, 3, 4);
        ag_backward(tp, ag_sum(tp, y));
        CHECK(count_kept(y) == 0);
        size_t nonzero_grad = 0;
        for (size_t k = 0; k < x->numel; k++) nonzero_grad += ag_tensor_grad_item(x, k) != 0.0;
        CHECK(nonzero_grad == 0);
        uint8_t keep[70];
        ag_dropout_row_mask(3, 4, p, 7, 70, keep);
        for (int c = 0; c < 70; c++) CHECK(keep[c] == 0);
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

static void test_p_zero_and_eval_mode_return_x_itself(void) {
    const int shape[] = {3, 4};
    ag_tensor *x = uniform(AG_F32, 2, shape, 6);
    ag_tape *tp = ag_tape_new();
    CHECK(ag_dropout(tp, x, 0.0, true, 1, 1) == x);
    CHECK(ag_dropout(tp, x, 0.5, false, 1, 1) == x);
    CHECK(ag_dropout(tp, x, 1.0, false, 1, 1) == x);
    CHECK(ag_tape_num_nodes(tp) == 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_p_one_gives_zeros_and_zero_gradient(void) {
    const int shape[] = {3, 5};
    ag_tensor *x = uniform(AG_F64, 2, shape, 7);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_dropout(tp, x, 1.0, true, 1, 1);
    for (size_t k = 0; k < x->numel; k++) CHECK(ag_tensor_item(y, k) == 0.0);
    ag_backward(tp, ag_sum(tp, y));
    for (size_t k = 0; k < x->numel; k++) CHECK(ag_tensor_grad_item(x, k) == 0.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// PyTorch computes x * mask / (1 - p): a NaN or inf that is dropped is NaN, not 0,
// and a NaN upstream gradient reaches x through dropped elements too.
static void test_dropped_nan_and_inf_stay_nan_forward_and_backward(void) {
    const int shape[] = {3, 40};
    const double ps[] = {0.5, 1.0};
    for (int dt = 0; dt < 2; dt++) {
        for (int i = 0; i < 2; i++) {
            ag_tensor *x = uniform((ag_dtype)dt, 2, shape, 7);
            for (size_t k = 0; k < x->numel; k += 2) ag_tensor_set_item(x, k, k % 4 ? INFINITY : NAN);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y = ag_dropout(tp, x, ps[i], true, 1, 1);
            ag_tensor *dy = ag_tape_tensor(tp, (ag_dtype)dt, 2, shape);
            ag_tensor_fill(dy, NAN);
            ag_backward_with(tp, y, dy);
            size_t bad_y = 0, bad_dx = 0, dropped = 0;
            for (size_t k = 0; k < x->numel; k++) {
                double v = ag_tensor_item(y, k);
                bool kept_inf = k % 2 == 0 && k % 4 && isinf(v) && v > 0;
                if (k % 2 == 0) bad_y += !isnan(v) && !kept_inf;
                dropped += k % 2 == 1 && v == 0.0;
                bad_dx += !isnan(ag_tensor_grad_item(x, k));
            }
            CHECK(bad_y == 0);
            CHECK(bad_dx == 0);
            CHECK(dropped > 0);  // the finite ones are dropped to 0 as before
            ag_tape_free(tp);
            ag_tensor_free(x);
        }
    }
}

static void test_p_outside_unit_interval_is_an_error(void) {
    const int shape[] = {2, 3};
    ag_tensor *x = uniform(AG_F32, 2, shape, 8);
    ag_tape *tp = ag_tape_new();
    const double bad[] = {-0.1, 1.0001, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        for (int training = 0; training < 2; training++) {
            testing_catch_errors();
            CHECK(ag_dropout(tp, x, bad[i], training, 1, 1) == NULL);
            CHECK(testing_error_count == 1);
            CHECK(strstr(testing_last_error, "dropout: p must be in [0, 1]") != NULL);
            CHECK(strstr(testing_last_error, "x [2,3]") != NULL);
            testing_release_errors();
        }
        uint8_t keep[4];
        testing_catch_errors();
        ag_dropout_row_mask(1, 1, bad[i], 0, 4, keep);
        CHECK(testing_error_count == 1);
        CHECK(strstr(testing_last_error, "dropout_row_mask: p must be in [0, 1]") != NULL);
        testing_release_errors();
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_bad_inputs_report_op_and_shapes(void) {
    const int shape[] = {3};
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, 1, shape);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(ag_dropout(tp, m, 0.5, true, 1, 1) == NULL);
    CHECK(strcmp(testing_last_error, "dropout: x [3] must be f32 or f64, not bool") == 0);
    CHECK(ag_dropout(tp, NULL, 0.5, true, 1, 1) == NULL);
    CHECK(strcmp(testing_last_error, "dropout: x is NULL") == 0);
    ag_dropout_row_mask(1, 1, 0.5, 0, 4, NULL);
    CHECK(strstr(testing_last_error, "dropout_row_mask: needs D >= 0 and a buffer") != NULL);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(m);
}

typedef struct {
    double p;
    uint64_t seed, site;
} dropout_args;

// A fixed seed: every call (of a gradient check, of the f32 and f64 runs) draws
// the same mask.
static ag_tensor *dropout_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const dropout_args *a = user;
    return ag_dropout(tp, in[0], a->p, true, a->seed, a->site);
}

static void test_gradcheck_p_0_1_with_a_fixed_seed(void) {
    const int shapes[][4] = {{7}, {3, 5}, {2, 3, 33}, {2, 2, 3, 4}};
    const int ndims[] = {1, 2, 3, 4};
    for (int c = 0; c < 4; c++) {
        ag_tensor *x = uniform(AG_F64, ndims[c], shapes[c], 9 + (uint64_t)c);
        dropout_args a = {0.1, 2024, (uint64_t)c};
        CHECK(ag_gradcheck(dropout_fn, &x, 1, &a, NULL, NULL));
        ag_tensor_free(x);
    }
}

static void test_backward_scales_upstream_by_the_same_mask(void) {
    const int shape[] = {4, 45};
    ag_tensor *x = uniform(AG_F64, 2, shape, 13);
    ag_tensor *dy = normal_tensor(AG_F64, 2, shape, 14, 0, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_dropout(tp, x, 0.6, true, 3, 4);
    ag_backward_with(tp, y, dy);
    for (size_t k = 0; k < x->numel; k++) {
        double want = ag_tensor_item(y, k) != 0.0 ? ag_tensor_item(dy, k) / 0.4 : 0.0;
        CHECK_NEAR(ag_tensor_grad_item(x, k), want, 1e-15);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(dy);
}

static void test_recorded_mask_costs_one_bit_per_element(void) {
    const int shape[] = {64, 1024};
    ag_tensor *x = uniform(AG_F32, 2, shape, 15);
    ag_tape *tp = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false);
    ag_dropout(tp, x, 0.5, true, 1, 1);
    size_t plain = ag_tape_usage(tp).bytes_used;
    ag_tape_reset(tp);
    ag_tape_set_grad_enabled(tp, true);
    ag_tensor *y = ag_dropout(tp, x, 0.5, true, 1, 1);
    size_t recorded = ag_tape_usage(tp).bytes_used;
    size_t bits = x->numel / 8;  // 8 KiB; a byte mask would take 64 KiB
    CHECK(y->node && y->node->saved);
    CHECK(recorded - plain >= bits);
    CHECK(recorded - plain <= bits + 1024);  // plus the node itself
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A row of D elements saves ceil(D / 32) words of keep flags. Computed as (D + 31) / 32,
// the count overflowed for D > INT_MAX - 31 (a row of 8 GB in f32): in practice a negative
// count, so the forward skipped every row (y left unwritten) and the tape refused the
// flags' buffer. By hand: 2^31 - 1 elements need 2^26 words; 2^31 - 32 = 32 (2^26 - 1)
// elements exactly 2^26 - 1. Shown on the count: the row itself would take 16 GB.
static void test_saved_words_of_a_row_near_int_max(void) {
    CHECK(agi_dropout_words(1) == 1);
    CHECK(agi_dropout_words(32) == 1);
    CHECK(agi_dropout_words(33) == 2);
    CHECK(agi_dropout_words(INT_MAX - 31) == 67108863);
    CHECK(agi_dropout_words(INT_MAX - 30) == 67108864);
    CHECK(agi_dropout_words(INT_MAX) == 67108864);
}

// The same mask in both, and |f32 - f64| <= 1e-5 |f64| + 1e-6 for every
// element of the output and of the gradient.
static void test_float32_and_float64_agree(void) {
    const int shape[] = {3, 4, 50};
    ag_tensor *x = uniform(AG_F64, 3, shape, 16);
    dropout_args a = {0.3, 9, 9};
    f32_f64_runs r = run_f32_and_f64(dropout_fn, &x, 1, &a);
    CHECK(r.y32 != NULL);
    if (r.y32) {
        for (size_t k = 0; k < x->numel; k++)
            CHECK((ag_tensor_item(r.y32, k) == 0.0) == (ag_tensor_item(r.y64, k) == 0.0));
        CHECK(all_close(r.y32, r.y64, false, 1e-5, 1e-6));
        CHECK(all_close(r.in32[0], r.in64[0], true, 1e-5, 1e-6));
    }
    free_f32_f64_runs(&r);
    ag_tensor_free(x);
}

// Large enough that the rows are split between the threads.
static void run_big(ag_tensor *x, float *out) {
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_dropout(tp, x, 0.2, true, 31, 41);
    ag_backward(tp, ag_sum(tp, y));
    memcpy(out, y->data, x->numel * sizeof *out);
    memcpy(out + x->numel, x->grad, x->numel * sizeof *out);
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_run_to_run_and_to_one_thread(void) {
    const int shape[] = {256, 257};
    ag_tensor *x = uniform(AG_F32, 2, shape, 17);
    size_t len = 2 * x->numel;
    float *one = malloc(len * sizeof *one), *a = malloc(len * sizeof *a),
          *b = malloc(len * sizeof *b);
    run_big(x, one);
    ag_threads_set(2);
    run_big(x, a);
    run_big(x, b);
    ag_threads_set(1);
    CHECK(memcmp(a, b, len * sizeof *a) == 0);
    CHECK(memcmp(a, one, len * sizeof *a) == 0);  // the mask is a function of the position
    free(one);
    free(a);
    free(b);
    ag_tensor_free(x);
}

// user: x and the upstream gradient dy; every step draws a new mask (site = step).
static void dropout_step(ag_tape *tp, int step, void *user) {
    ag_tensor *const *t = user;
    ag_backward_with(tp, ag_dropout(tp, t[0], 0.1, true, 5, (uint64_t)step), t[1]);
}

// After the first step has sized the tape, a step allocates nothing, on one thread
// or two.
static void test_repeated_step_allocates_no_heap_memory(void) {
    const int shape[] = {256, 257};
    ag_tensor *t[] = {uniform(AG_F32, 2, shape, 18), uniform(AG_F32, 2, shape, 19)};
    CHECK(repeated_step_allocates_nothing(dropout_step, t));
    ag_tensor_free(t[0]);
    ag_tensor_free(t[1]);
}

// agi_dropout_keep_rows (32 lanes of pcg32 a row, for the fused attention's replay)
// draws exactly what ag_dropout_row_mask draws, row by row, at every width.
static void test_replayed_rows_equal_row_masks(void) {
    static agi_dropout_plan plan[1];
    const int widths[] = {1, 5, 31, 32, 33, 64, 100, 257};
    bool same = true;
    for (int w = 0; w < 8; w++) {
        const int D = widths[w], rows = 5;
        const size_t row0 = 1000 + (size_t)D;
        uint8_t *a = malloc((size_t)rows * (D + 3)), *b = malloc((size_t)D);
        agi_dropout_plan_make(plan, 11, 22, 0.3, D);
        agi_dropout_keep_rows(plan, row0, rows, a, (size_t)D + 3);
        for (int r = 0; r < rows; r++) {
            ag_dropout_row_mask(11, 22, 0.3, row0 + (size_t)r, D, b);
            same &= memcmp(a + (size_t)r * (D + 3), b, (size_t)D) == 0;
        }
        free(a), free(b);
    }
    CHECK(same);
}

int main(void) {
    RUN(test_replayed_rows_equal_row_masks);
    RUN(test_keep_rule_is_pcg32_output_at_least_round_p_times_2_pow_32);
    RUN(test_same_seed_and_site_give_the_same_mask_on_every_forward);
    RUN(test_different_site_or_seed_give_a_different_mask);
    RUN(test_kept_fraction_is_close_to_one_minus_p);
    RUN(test_kept_values_are_x_over_one_minus_p_and_dropped_are_zero);
    RUN(test_row_mask_reproduces_every_row_of_the_forward);
    RUN(test_lanes_draw_the_documented_numbers_at_every_width);
    RUN(test_p_whose_threshold_rounds_to_2_pow_32_keeps_nothing);
    RUN(test_p_zero_and_eval_mode_return_x_itself);
    RUN(test_p_one_gives_zeros_and_zero_gradient);
    RUN(test_dropped_nan_and_inf_stay_nan_forward_and_backward);
    RUN(test_p_outside_unit_interval_is_an_error);
    RUN(test_bad_inputs_report_op_and_shapes);
    RUN(test_gradcheck_p_0_1_with_a_fixed_seed);
    RUN(test_backward_scales_upstream_by_the_same_mask);
    RUN(test_recorded_mask_costs_one_bit_per_element);
    RUN(test_saved_words_of_a_row_near_int_max);
    RUN(test_float32_and_float64_agree);
    RUN(test_two_threads_are_bit_identical_run_to_run_and_to_one_thread);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
