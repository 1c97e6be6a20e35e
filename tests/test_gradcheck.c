// The public gradcheck: passes on correct ops, and CATCHES wrong backwards —
// a missing factor, a wrong transpose, overwriting instead of accumulating,
// nondeterminism, and gradient from a zero upstream.
#include "op_checks.h"

// ---- Correct functions built from the elementwise ops -----------------------
static ag_tensor *f_add_broadcast(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_add(tp, in[0], in[1]);
}
static ag_tensor *f_mul_broadcast(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_mul(tp, in[0], in[1]);
}
static ag_tensor *f_scale(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_scale(tp, in[0], -1.75);
}
static ag_tensor *f_sum(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_sum(tp, ag_mul(tp, in[0], in[0]));
}
static ag_tensor *f_mean(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_mean(tp, ag_mul(tp, in[0], in[0]));
}

static void check_pair(ag_fn fn, int nda, const int *sa, int ndb, const int *sb, uint64_t seed) {
    ag_tensor *a = random_leaf(AG_F64, nda, sa, seed);
    ag_tensor *b = random_leaf(AG_F64, ndb, sb, seed + 100);
    ag_tensor *in[] = {a, b};
    ag_gradcheck_result r;
    CHECK(ag_gradcheck(fn, in, 2, NULL, NULL, &r));
    CHECK(r.checked == a->numel + b->numel);
    CHECK(r.verdict == AG_CHECK_PASS && r.fd.max_abs_err < 1e-8);
    ag_tensor_free(a);
    ag_tensor_free(b);
}

static void test_passes_on_add_and_mul_with_broadcasting(void) {
    const int s1[] = {3}, s23[] = {2, 3}, s423[] = {4, 2, 3}, s2423[] = {2, 4, 2, 3};
    ag_fn fns[] = {f_add_broadcast, f_mul_broadcast};
    for (int f = 0; f < 2; f++) {
        check_pair(fns[f], 1, s1, 1, s1, 1);
        check_pair(fns[f], 2, s23, 1, s1, 2);
        check_pair(fns[f], 3, s423, 2, s23, 3);
        check_pair(fns[f], 4, s2423, 3, s423, 4);
        check_pair(fns[f], 4, s2423, 4, s2423, 5);
    }
}

static void test_passes_on_scale_sum_and_mean(void) {
    ag_fn fns[] = {f_scale, f_sum, f_mean};
    const int shapes[][3] = {{1, 1, 1}, {5, 1, 1}, {2, 3, 4}};
    for (int f = 0; f < 3; f++) {
        for (int s = 0; s < 3; s++) {
            ag_tensor *x = random_leaf(AG_F64, 3, shapes[s], (uint64_t)(10 * f + s));
            CHECK(ag_gradcheck(fns[f], &x, 1, NULL, NULL, NULL));
            ag_tensor_free(x);
        }
    }
}

static void test_float32_passes_with_float32_tolerances(void) {
    ag_tensor *a = random_leaf(AG_F32, 2, (int[]){3, 4}, 21);
    ag_tensor *b = random_leaf(AG_F32, 1, (int[]){4}, 22);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.eps = 1e-2;
    o.atol = 1e-3;
    o.rtol = 1e-2;
    CHECK(ag_gradcheck(f_mul_broadcast, (ag_tensor *[]){a, b}, 2, NULL, &o, NULL));
    ag_tensor_free(a);
    ag_tensor_free(b);
}

// ---- Deliberately wrong backwards ---------------------------------------------
// y = x^2 with a backward that forgets the factor 2.
static void square_forward(ag_node *n) {
    const double *x = n->in[0]->data;
    for (size_t i = 0; i < n->out->numel; i++) ((double *)n->out->data)[i] = x[i] * x[i];
}
static void square_backward_missing_factor(ag_node *n) {
    const double *x = n->in[0]->data, *dy = n->out->grad;
    for (size_t i = 0; i < n->out->numel; i++) ((double *)n->in[0]->grad)[i] += x[i] * dy[i];
}
static const ag_op bad_square = {"bad_square", square_forward, square_backward_missing_factor, NULL};

static ag_tensor *f_bad_square(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_op_apply(tp, &bad_square, 1, in, in[0]->ndim, in[0]->shape, NULL, 0);
}

static void test_catches_a_missing_factor_and_reports_the_worst_element(void) {
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 3}, 31);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    CHECK(!ag_gradcheck(f_bad_square, &x, 1, NULL, &o, &r));
    CHECK(r.verdict == AG_CHECK_FAIL && r.fd.verdict == AG_CHECK_FAIL);
    CHECK(r.repeat_ok && r.zero_ok);  // only the values are wrong
    CHECK(r.fd.worst_input == 0);
    CHECK_NEAR(r.fd.worst_numeric, 2 * r.fd.worst_analytic, 1e-6);
    // The first failing elements, with what the differences expected and what came back.
    CHECK(r.fd.n_bad == AG_CHECK_ELEMENTS && r.fd.bad[0].index == 0 && r.fd.bad[3].index == 3);
    for (int b = 0; b < r.fd.n_bad; b++)
        CHECK_NEAR(r.fd.bad[b].expected, 2 * r.fd.bad[b].got, 1e-6);
    CHECK(strcmp(r.fd.bad[1].at, "(0,1)") == 0);
    CHECK(strstr(r.report, "input 0 [2,3] element (0,1): numeric ") != NULL);
    CHECK(strstr(r.report, "input 0: 6 of 6 elements failed\n") != NULL);
    ag_tensor_free(x);
}

// y = A x for a square A, with the gradient of x computed from A where A^T
// belongs (a wrong transpose; with a square A the shapes cannot reveal it).
static void matvec_forward(ag_node *n) {
    const double *A = n->in[0]->data, *x = n->in[1]->data;
    double *y = n->out->data;
    int m = n->in[0]->shape[0], k = n->in[0]->shape[1];
    for (int i = 0; i < m; i++) {
        y[i] = 0;
        for (int j = 0; j < k; j++) y[i] += A[i * k + j] * x[j];
    }
}
static void matvec_backward_wrong_transpose(ag_node *n) {
    const double *A = n->in[0]->data, *x = n->in[1]->data, *dy = n->out->grad;
    int m = n->in[0]->shape[0], k = n->in[0]->shape[1];
    double *dA = n->in[0]->grad, *dx = n->in[1]->grad;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < k; j++) {
            if (dA) dA[i * k + j] += dy[i] * x[j];
            if (dx) dx[j] += A[j * k + i] * dy[i];  // should be A[i * k + j]
        }
}
static const ag_op bad_matvec = {"bad_matvec", matvec_forward, matvec_backward_wrong_transpose, NULL};

static ag_tensor *f_bad_matvec(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_op_apply(tp, &bad_matvec, 2, in, 1, (int[]){in[0]->shape[0]}, NULL, 0);
}

static void test_catches_a_wrong_transpose(void) {
    ag_tensor *A = random_leaf(AG_F64, 2, (int[]){4, 4}, 32);
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){4}, 33);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    CHECK(!ag_gradcheck(f_bad_matvec, (ag_tensor *[]){A, x}, 2, NULL, &o, &r));
    CHECK(r.fd.worst_input == 1);  // the gradient of A is right, that of x is not
    for (int b = 0; b < r.fd.n_bad; b++) CHECK(r.fd.bad[b].input == 1);
    ag_tensor_free(A);
    ag_tensor_free(x);
}

// A backward that overwrites (=) instead of accumulating (+=): invisible for a
// tensor used once, wrong as soon as the tensor is also used elsewhere.
static void square_backward_overwrites(ag_node *n) {
    const double *x = n->in[0]->data, *dy = n->out->grad;
    for (size_t i = 0; i < n->out->numel; i++) ((double *)n->in[0]->grad)[i] = 2 * x[i] * dy[i];
}
static const ag_op overwriting_square = {"overwriting_square", square_forward,
                                         square_backward_overwrites, NULL};

static ag_tensor *f_overwrite_used_twice(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    ag_tensor *sq = ag_op_apply(tp, &overwriting_square, 1, in, in[0]->ndim, in[0]->shape, NULL, 0);
    return ag_add(tp, ag_scale(tp, in[0], 3.0), sq);  // x reaches y twice
}

static void test_catches_a_backward_that_overwrites_instead_of_accumulating(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){5}, 34);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    CHECK(!ag_gradcheck(f_overwrite_used_twice, &x, 1, NULL, &o, NULL));
    ag_tensor_free(x);
}

// A backward that depends on how often it ran: "backward twice" catches it.
static int drift_calls;
static void drift_backward(ag_node *n) {
    const double *x = n->in[0]->data, *dy = n->out->grad;
    drift_calls++;
    double wobble = drift_calls % 2 ? 0.0 : 1e-3;
    for (size_t i = 0; i < n->out->numel; i++)
        ((double *)n->in[0]->grad)[i] += (2 * x[i] + wobble) * dy[i];
}
static const ag_op drifting_square = {"drifting_square", square_forward, drift_backward, NULL};

static ag_tensor *f_drift(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_op_apply(tp, &drifting_square, 1, in, in[0]->ndim, in[0]->shape, NULL, 0);
}

static void test_catches_a_backward_that_differs_when_run_twice(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 35);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    drift_calls = 0;
    CHECK(!ag_gradcheck(f_drift, &x, 1, NULL, &o, &r));
    CHECK(!r.repeat_ok);
    CHECK(strstr(r.report, "backward run twice gave different gradients") != NULL);
    ag_tensor_free(x);
}

// A backward that adds a gradient even when the upstream gradient is zero.
static void leaky_backward(ag_node *n) {
    const double *x = n->in[0]->data, *dy = n->out->grad;
    for (size_t i = 0; i < n->out->numel; i++)
        ((double *)n->in[0]->grad)[i] += 2 * x[i] * dy[i] + (dy[i] == 0 ? 1e-9 : 0);
}
static const ag_op leaky_square = {"leaky_square", square_forward, leaky_backward, NULL};

static ag_tensor *f_leaky(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_op_apply(tp, &leaky_square, 1, in, in[0]->ndim, in[0]->shape, NULL, 0);
}

static void test_catches_gradient_from_a_zero_upstream(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 36);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    CHECK(!ag_gradcheck(f_leaky, &x, 1, NULL, &o, &r));
    CHECK(r.fd.verdict == AG_CHECK_PASS && r.repeat_ok && !r.zero_ok);
    CHECK(r.verdict == AG_CHECK_FAIL);
    ag_tensor_free(x);
}

static void test_leaves_inputs_and_their_gradients_as_it_found_them(void) {
    ag_tensor *a = random_leaf(AG_F64, 2, (int[]){2, 3}, 41);
    ag_tensor *b = random_leaf(AG_F64, 1, (int[]){3}, 42);
    ag_tensor *a0 = ag_tensor_convert(a, AG_F64);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_mul(tp, a, b)));  // user gradients present
    double ga = ag_tensor_grad_item(a, 4), gb = ag_tensor_grad_item(b, 1);
    CHECK(ag_gradcheck(f_mul_broadcast, (ag_tensor *[]){a, b}, 2, NULL, NULL, NULL));
    for (size_t i = 0; i < a->numel; i++) CHECK(ag_tensor_item(a, i) == ag_tensor_item(a0, i));
    CHECK(ag_tensor_grad_item(a, 4) == ga && ag_tensor_grad_item(b, 1) == gb);
    ag_tape_free(tp);
    ag_tensor_free(a);
    ag_tensor_free(a0);
    ag_tensor_free(b);
}

static void test_inputs_that_do_not_require_grad_are_passed_through(void) {
    ag_tensor *a = random_leaf(AG_F64, 2, (int[]){2, 3}, 43);
    ag_tensor *b = ag_tensor_ones(AG_F64, 1, (int[]){3});  // a constant
    ag_gradcheck_result r;
    CHECK(ag_gradcheck(f_mul_broadcast, (ag_tensor *[]){a, b}, 2, NULL, NULL, &r));
    CHECK(r.checked == 6);
    ag_tensor_free(a);
    ag_tensor_free(b);
}

// eps 0 or NaN made every difference 0 or NaN and failed a correct gradient ("3 of 3
// elements failed"), a negative eps passed; a NaN tolerance failed everything. Each is now
// refused with one line, as ag_tape_check refuses them, and checks nothing. So is an
// infinite atol or rtol, which passed a gradient twice too large.
static void test_refuses_an_eps_that_is_not_positive_and_finite_or_a_nan_tolerance(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 44);
    const double bad[][3] = {{0, 1e-5, 1e-3},  {NAN, 1e-5, 1e-3}, {-1e-6, 1e-5, 1e-3},
                             {INFINITY, 1e-5, 1e-3}, {1e-6, NAN, 1e-3}, {1e-6, 1e-5, -1},
                             {1e-6, INFINITY, 1e-3}, {1e-6, 1e-5, INFINITY}};
    testing_catch_errors();
    for (int i = 0; i < 8; i++) {
        ag_gradcheck_opts o = ag_gradcheck_defaults();
        o.eps = bad[i][0], o.atol = bad[i][1], o.rtol = bad[i][2], o.quiet = true;
        ag_gradcheck_result r;
        CHECK(!ag_gradcheck(f_sum, &x, 1, NULL, &o, &r));
        CHECK(r.verdict == AG_CHECK_FAIL && r.fd.comparisons == 0);
        const char *said =
            "gradcheck: eps must be finite and > 0 and atol, rtol finite and >= 0, got eps ";
        CHECK(testing_error_count == 1 && strncmp(testing_last_error, said, strlen(said)) == 0);
        testing_error_count = 0;
    }
    testing_release_errors();
    ag_tensor_free(x);
}

// y = x^2 at x of 1e100: outputs of 1e200, whose squares in the rounding allowance
// overflowed to an infinite tolerance, so a gradient twice too large (bad_square's is half,
// the missing factor 2) passed. The correct square, ag_mul(x, x), passes there.
static ag_tensor *f_right_square(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_mul(tp, in[0], in[0]);
}

static void test_outputs_of_1e200_still_catch_a_missing_factor(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){4}, 45);
    for (size_t i = 0; i < x->numel; i++) ag_tensor_set_item(x, i, ag_tensor_item(x, i) * 1e100);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    CHECK(!ag_gradcheck(f_bad_square, &x, 1, NULL, &o, &r) && r.verdict == AG_CHECK_FAIL);
    CHECK(r.fd.n_bad == 4);
    CHECK(ag_gradcheck(f_right_square, &x, 1, NULL, &o, &r));
    ag_tensor_free(x);
}

// A function that returns its input: the second run's perturbation changed the first
// run's output too (the same tensor), the difference was 0, and the identity's correct
// gradient, v itself, failed ("numeric 0"). PyTorch's gradcheck passes it.
static ag_tensor *f_identity(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)tp, (void)n, (void)u;
    return in[0];
}

static void test_a_function_that_returns_its_input_passes(void) {
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 3}, 46);
    ag_tensor *x0 = ag_tensor_convert(x, AG_F64);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    CHECK(ag_gradcheck(f_identity, &x, 1, NULL, &o, &r));
    CHECK(r.verdict == AG_CHECK_PASS && r.fd.comparisons == 6);
    for (size_t i = 0; i < x->numel; i++) CHECK(ag_tensor_item(x, i) == ag_tensor_item(x0, i));
    ag_tensor_free(x);
    ag_tensor_free(x0);
}

// exp at an input holding +inf: the infinite element is never perturbed (fd.not_finite),
// and its gradient from a zero upstream is 0 * inf = NaN, as IEEE has it. The zero-upstream
// check counted that NaN as a gradient from nothing and failed the correct exp.
static ag_tensor *f_exp(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ag_exp(tp, in[0]);
}

static void test_an_infinite_input_does_not_fail_the_zero_upstream_check(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 47);
    ag_tensor_set_item(x, 1, INFINITY);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    CHECK(ag_gradcheck(f_exp, &x, 1, NULL, &o, &r));
    CHECK(r.zero_ok && r.repeat_ok && r.fd.not_finite == 1 && r.fd.comparisons == 2);
    // A gradient from a zero upstream at a finite element still fails.
    CHECK(!ag_gradcheck(f_leaky, &x, 1, NULL, &o, &r) && !r.zero_ok);
    ag_tensor_free(x);
}

// A function whose output changes shape between calls (here after its third: the first
// run and element 0's two): the differences read the smaller output as if it were the
// first one's size, past its end, and called the result a kink. It is a failure that says
// so; the elements it names carry what backward gave (they said "analytic 0").
static int shape_calls;
static ag_tensor *f_changes_shape(ag_tape *tp, ag_tensor *const in[], int n, void *u) {
    (void)n, (void)u;
    return ++shape_calls <= 3 ? ag_scale(tp, in[0], 2.0) : ag_sum(tp, in[0]);
}

static void test_an_output_that_changes_shape_between_runs_fails_and_says_so(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){5}, 48);
    ag_gradcheck_opts o = ag_gradcheck_defaults();
    o.quiet = true;
    ag_gradcheck_result r;
    shape_calls = 0;
    CHECK(!ag_gradcheck(f_changes_shape, &x, 1, NULL, &o, &r) && r.verdict == AG_CHECK_FAIL);
    CHECK(strstr(r.fd.reason, "the function's output changed between runs ([5] f64 at the "
                              "inputs, [] f64 at a perturbed point)") != NULL);
    CHECK(r.fd.n_bad > 0 && r.fd.bad[0].index == 1);
    for (int b = 0; b < r.fd.n_bad; b++) CHECK(isnan(r.fd.bad[b].expected) && r.fd.bad[b].got != 0);
    ag_tensor_free(x);
}

// ---- Gradients the check leaves as they were -------------------------------------------
// y = sum(x * w), w a leaf the function reads without being given it (a model's weight).
static ag_tensor *f_times_w(ag_tape *tp, ag_tensor *const in[], int n, void *w) {
    (void)n;
    return ag_sum(tp, ag_mul(tp, in[0], w));
}

// Gradcheck in the middle of a run, as PyTorch's (which asks autograd.grad for the inputs'
// gradients) leaves every gradient as it was: the closed-over w's (its backwards summed
// into it), and an input's that did not exist (it stays NULL). The user's tape then
// records and backpropagates as before: d(x . w)/dx = w.
static void test_leaves_every_gradient_as_it_was(void) {
    ag_tensor *w = random_leaf(AG_F64, 1, (int[]){3}, 49);
    ag_tensor *u = random_leaf(AG_F64, 1, (int[]){3}, 50);
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 51);  // no gradient yet
    ag_tape *user = ag_tape_new();
    ag_backward(user, ag_sum(user, ag_mul(user, w, u)));  // w's gradient is u
    CHECK(ag_gradcheck(f_times_w, &x, 1, w, NULL, NULL));
    CHECK(x->grad == NULL);
    for (size_t i = 0; i < 3; i++) CHECK(ag_tensor_grad_item(w, i) == ag_tensor_item(u, i));
    ag_backward(user, ag_sum(user, ag_mul(user, x, w)));
    for (size_t i = 0; i < 3; i++) {
        CHECK(ag_tensor_grad_item(x, i) == ag_tensor_item(w, i));
        CHECK(ag_tensor_grad_item(w, i) == ag_tensor_item(u, i) + ag_tensor_item(x, i));
    }
    ag_tape_free(user);
    ag_tensor_free(w);
    ag_tensor_free(u);
    ag_tensor_free(x);
}

int main(void) {
    RUN(test_passes_on_add_and_mul_with_broadcasting);
    RUN(test_passes_on_scale_sum_and_mean);
    RUN(test_float32_passes_with_float32_tolerances);
    RUN(test_catches_a_missing_factor_and_reports_the_worst_element);
    RUN(test_catches_a_wrong_transpose);
    RUN(test_catches_a_backward_that_overwrites_instead_of_accumulating);
    RUN(test_catches_a_backward_that_differs_when_run_twice);
    RUN(test_catches_gradient_from_a_zero_upstream);
    RUN(test_leaves_inputs_and_their_gradients_as_it_found_them);
    RUN(test_inputs_that_do_not_require_grad_are_passed_through);
    RUN(test_refuses_an_eps_that_is_not_positive_and_finite_or_a_nan_tolerance);
    RUN(test_outputs_of_1e200_still_catch_a_missing_factor);
    RUN(test_a_function_that_returns_its_input_passes);
    RUN(test_an_infinite_input_does_not_fail_the_zero_upstream_check);
    RUN(test_an_output_that_changes_shape_between_runs_fails_and_says_so);
    RUN(test_leaves_every_gradient_as_it_was);
    return testing_summary();
}
