// Telling a NaN apart: ag_params_first_nonfinite names the parameter whose
// values or gradients hold a NaN or an infinity, and the norm that gradient
// clipping returns is not finite exactly when a training step went bad, so a
// training loop can stop at the first bad step instead of printing "loss nan"
// to the end (issue 9).
#include <stdlib.h>

#include "attograd/io.h"
#include "attograd/optim.h"
#include "testing.h"

static const ag_dtype dtypes[] = {AG_F32, AG_F64};

static void grad_set(ag_tensor *t, size_t i, double v) {
    if (t->dtype == AG_F64) ((double *)t->grad)[i] = v;
    else ((float *)t->grad)[i] = (float)v;
}

// Three parameters of different sizes, the middle one a single element (a
// size-1 tensor must be looked at too), all set to 0.5 with gradient 0.25.
static ag_params *three_params(ag_dtype dt) {
    ag_params *ps = ag_params_new(dt);
    ag_params_add(ps, "a", 2, (int[]){3, 5});
    ag_params_add(ps, "b", 1, (int[]){1});
    ag_params_add(ps, "c", 1, (int[]){7});
    for (int i = 0; i < ag_params_count(ps); i++) {
        ag_tensor *t = ag_params_at(ps, i);
        for (size_t k = 0; k < t->numel; k++) {
            ag_tensor_set_item(t, k, 0.5);
            grad_set(t, k, 0.25);
        }
    }
    return ps;
}

static void finite_store_gives_null(void) {
    for (int d = 0; d < 2; d++) {
        ag_params *ps = three_params(dtypes[d]);
        CHECK(ag_params_first_nonfinite(ps, false) == NULL);
        CHECK(ag_params_first_nonfinite(ps, true) == NULL);
        ag_params_free(ps);
    }
}

static void empty_store_gives_null(void) {
    ag_params *ps = ag_params_new(AG_F32);
    CHECK(ag_params_first_nonfinite(ps, false) == NULL);
    CHECK(ag_params_first_nonfinite(ps, true) == NULL);
    ag_params_free(ps);
}

// NaN, +inf and -inf, in the values or in the gradients, in each parameter:
// the one holding it is named, and the other buffer is still reported finite.
static void each_nonfinite_value_is_found(void) {
    const double bad[] = {NAN, INFINITY, -INFINITY};
    for (int d = 0; d < 2; d++)
        for (int b = 0; b < 3; b++)
            for (int grad = 0; grad < 2; grad++)
                for (int p = 0; p < 3; p++) {
                    ag_params *ps = three_params(dtypes[d]);
                    ag_tensor *t = ag_params_at(ps, p);
                    size_t last = t->numel - 1;
                    if (grad) grad_set(t, last, bad[b]);
                    else ag_tensor_set_item(t, last, bad[b]);
                    CHECK(ag_params_first_nonfinite(ps, grad) == t);
                    CHECK(ag_params_first_nonfinite(ps, !grad) == NULL);
                    ag_params_free(ps);
                }
}

// Two bad parameters: the first in order of addition is the one named.
static void the_first_bad_parameter_is_named(void) {
    ag_params *ps = three_params(AG_F64);
    ag_tensor_set_item(ag_params_at(ps, 2), 0, NAN);
    ag_tensor_set_item(ag_params_at(ps, 1), 0, INFINITY);
    CHECK(ag_params_first_nonfinite(ps, false) == ag_params_at(ps, 1));
    ag_params_free(ps);
}

// Huge but finite values are finite (x * 0 must not be fooled by them).
static void largest_finite_values_are_finite(void) {
    ag_params *ps = three_params(AG_F32);
    ag_tensor_set_item(ag_params_at(ps, 0), 4, 3.4028234663852886e38);
    ag_tensor_set_item(ag_params_at(ps, 2), 6, -3.4028234663852886e38);
    CHECK(ag_params_first_nonfinite(ps, false) == NULL);
    ag_params_free(ps);
    ps = three_params(AG_F64);
    ag_tensor_set_item(ag_params_at(ps, 0), 0, 1.7976931348623157e308);
    CHECK(ag_params_first_nonfinite(ps, false) == NULL);
    ag_params_free(ps);
}

// The clipping norm says when a step went bad: NaN for a NaN gradient, inf
// for an infinite one, and the gradients are not made to look finite.
static void clip_norm_is_not_finite_for_a_bad_gradient(void) {
    for (int d = 0; d < 2; d++) {
        ag_params *ps = three_params(dtypes[d]);
        grad_set(ag_params_at(ps, 2), 3, NAN);
        CHECK(isnan(ag_params_clip_grad_norm(ps, 1.0)));
        CHECK(ag_params_first_nonfinite(ps, true) == ag_params_at(ps, 2));
        ag_params_free(ps);

        ps = three_params(dtypes[d]);
        grad_set(ag_params_at(ps, 0), 0, -INFINITY);
        CHECK(isinf(ag_params_clip_grad_norm(ps, 1.0)));
        ag_params_free(ps);
    }
}

// A negative or NaN max_norm is a mistake in a setting, not a clipping
// (torch would flip the gradients' signs or make them NaN): it is refused,
// NaN is returned so the step's isfinite() check stops, and the gradients stay.
static void clip_refuses_a_negative_or_nan_max_norm(void) {
    const double bad[] = {-1.0, NAN, -INFINITY};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            ag_params *ps = three_params(dtypes[d]);
            testing_catch_errors();
            CHECK(isnan(ag_params_clip_grad_norm(ps, bad[k])));
            CHECK(testing_error_was(k == 0 ? "params_clip_grad_norm: max_norm must be >= 0, got -1"
                                    : k == 1 ? "params_clip_grad_norm: max_norm must be >= 0, got nan"
                                             : "params_clip_grad_norm: max_norm must be >= 0, got -inf"));
            testing_release_errors();
            CHECK(ag_params_grad_norm(ps) == sqrt(23 * 0.0625));
            ag_params_free(ps);
        }
}

// An absurd learning rate: loss = sum(x^2) at x = 1e10 with SGD lr 1e300
// sends x to -inf in one step; the check after the step finds it, and the
// next step's gradient and clipping norm are not finite either.
static void absurd_learning_rate_is_caught_after_one_step(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_tensor *x = ag_params_add(ps, "x", 1, (int[]){2});
    ag_tensor_set_item(x, 0, 1e10);
    ag_tensor_set_item(x, 1, 1.0);
    ag_optim_config cfg = ag_optim_defaults(AG_SGD);
    cfg.lr = 1e300;
    ag_optim *opt = ag_optim_new(ps, &cfg);
    ag_tape *tp = ag_tape_new();
    for (int step = 0; step < 2; step++) {
        ag_tape_reset(tp);
        ag_params_zero_grad(ps);
        ag_tensor *loss = ag_sum(tp, ag_mul(tp, x, x));
        ag_backward(tp, loss);
        double norm = ag_params_clip_grad_norm(ps, 1e308);
        if (step == 0) {
            CHECK(isfinite(ag_tensor_item(loss, 0)) && isfinite(norm));
            CHECK(ag_params_first_nonfinite(ps, true) == NULL);
            ag_optim_step(opt);
            CHECK(ag_params_first_nonfinite(ps, false) == x);
        } else {
            CHECK(!isfinite(ag_tensor_item(loss, 0)));
            CHECK(!isfinite(norm));
            CHECK(ag_params_first_nonfinite(ps, true) == x);
        }
    }
    ag_tape_free(tp);
    ag_optim_free(opt);
    ag_params_free(ps);
}

// A checkpoint may hold a NaN (the loader does not judge values): after the
// load the check names the parameter.
static void nan_loaded_from_a_checkpoint_is_found(void) {
    const char *path = "test_params_finite.safetensors";
    ag_params *ps = three_params(AG_F32);
    ag_tensor_set_item(ag_params_at(ps, 2), 5, NAN);
    ag_err err;
    CHECK(ag_params_save(ps, path, NULL, &err) == 0);
    ag_params_free(ps);
    ps = three_params(AG_F32);
    CHECK(ag_params_first_nonfinite(ps, false) == NULL);
    CHECK(ag_params_load(ps, path, &err) == 0);
    CHECK(ag_params_first_nonfinite(ps, false) == ag_params_at(ps, 2));
    ag_params_free(ps);
    remove(path);
}

int main(void) {
    RUN(finite_store_gives_null);
    RUN(empty_store_gives_null);
    RUN(each_nonfinite_value_is_found);
    RUN(the_first_bad_parameter_is_named);
    RUN(largest_finite_values_are_finite);
    RUN(clip_norm_is_not_finite_for_a_bad_gradient);
    RUN(clip_refuses_a_negative_or_nan_max_norm);
    RUN(absurd_learning_rate_is_caught_after_one_step);
    RUN(nan_loaded_from_a_checkpoint_is_found);
    return testing_summary();
}
