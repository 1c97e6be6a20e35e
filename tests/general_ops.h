// Helpers for the tests of the general ops (shapes, broadcasting, elementwise, reductions):
// the checks every op gets, in one call.
#ifndef ATTOGRAD_GENERAL_OPS_H
#define ATTOGRAD_GENERAL_OPS_H

#include "op_checks.h"

// A float64 leaf, uniform in [-1, 1), requiring grad.
static inline ag_tensor *leaf(int ndim, const int *shape, uint64_t seed) {
    return random_leaf(AG_F64, ndim, shape, seed);
}

static inline void free_tensors(ag_tensor *const t[], int n) {
    for (int i = 0; i < n; i++) ag_tensor_free(t[i]);
}

// The float64 gradient check of fn on `in` and, for up to AG_MAX_INPUTS inputs,
// float32 agreeing with float64 (normwise 1e-5, outputs and every gradient);
// prints `label` on a failure.
static inline bool op_checks_pass(const char *label, ag_fn fn, ag_tensor *const in[], int n,
                                  void *user) {
    ag_gradcheck_result r;
    bool grad = ag_gradcheck(fn, in, n, user, NULL, &r);
    // (run_f32_and_f64 holds at most AG_MAX_INPUTS inputs; more are gradchecked only)
    double e = n <= AG_MAX_INPUTS ? f32_vs_f64_error(fn, in, n, user) : 0;
    if (!grad || !(e <= 1e-5))
        fprintf(stderr, "  %s: gradcheck %s, f32 vs f64 %.2e\n", label, grad ? "ok" : "FAILED",
                e);
    return grad && e <= 1e-5;
}

// Whether y is NULL and the one error reported reads exactly `expected`.
// Call between testing_catch_errors() and testing_release_errors().
static inline bool fails_with(const ag_tensor *y, const char *expected) {
    bool ok = testing_error_was(expected);
    return y == NULL && ok;
}

// Whether every gradient entry of t is finite (no NaN, no infinity).
static inline bool grad_all_finite(const ag_tensor *t) {
    for (size_t i = 0; i < t->numel; i++)
        if (!isfinite(ag_tensor_grad_item(t, i))) return false;
    return true;
}

#endif
