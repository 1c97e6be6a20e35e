// Checks shared by the op tests: random inputs over a list of shapes, and the
// float32-versus-float64 comparison. Built on the public API only.
#ifndef ATTOGRAD_OP_CHECKS_H
#define ATTOGRAD_OP_CHECKS_H

#include "testing.h"

typedef struct {
    int ndim;
    int shape[AG_MAX_DIMS];
} test_shape;

// Uniform in [lo, hi), drawn from pcg32 seeded (seed, 17).
static inline ag_tensor *random_tensor(ag_dtype dt, test_shape s, uint64_t seed, double lo,
                                       double hi) {
    ag_pcg32 rng = ag_pcg32_make(seed, 17);
    return ag_tensor_uniform(dt, s.ndim, s.shape, &rng, lo, hi);
}

// max_i |a_i - b_i| / max_i |b_i| over the values (grad = false) or the
// gradients (grad = true) of two tensors of equal numel: the error of a
// relative to b in the infinity norm. Elements that come from cancellation
// cannot be relatively accurate one by one in float32; the norm can.
static inline double normwise_error(const ag_tensor *a, const ag_tensor *b, bool grad) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < b->numel; i++) {
        double x = grad ? ag_tensor_grad_get(a, i) : ag_tensor_get(a, i);
        double y = grad ? ag_tensor_grad_get(b, i) : ag_tensor_get(b, i);
        diff = fmax(diff, fabs(x - y));
        scale = fmax(scale, fabs(y));
    }
    return scale > 0 ? diff / scale : diff;
}

// Runs `fn` in float32 and in float64 on the same values (the f64 inputs are
// first rounded to f32, so both see identical numbers), backpropagates the same
// random upstream gradient through both, and returns the largest normwise
// error of the f32 output and of the f32 input gradients against f64.
static inline double f32_vs_f64_error(ag_fn fn, ag_tensor *const inputs[], int n,
                                      void *user) {
    ag_tensor *in32[AG_MAX_INPUTS], *in64[AG_MAX_INPUTS];
    for (int i = 0; i < n; i++) {
        in32[i] = ag_tensor_convert(inputs[i], AG_F32);
        in64[i] = ag_tensor_convert(in32[i], AG_F64);
        ag_tensor_set_requires_grad(in32[i], inputs[i]->requires_grad);
        ag_tensor_set_requires_grad(in64[i], inputs[i]->requires_grad);
    }
    ag_tape *t32 = ag_tape_new(), *t64 = ag_tape_new();
    ag_tensor *y32 = fn(t32, in32, n, user), *y64 = fn(t64, in64, n, user);
    ag_pcg32 rng = ag_pcg32_make(5, 5);
    ag_tensor *v64 = ag_tensor_uniform(AG_F64, y64->ndim, y64->shape, &rng, -1, 1);
    ag_tensor *v32 = ag_tensor_convert(v64, AG_F32);
    ag_backward_with(t32, y32, v32);
    ag_backward_with(t64, y64, v64);

    double worst = normwise_error(y32, y64, false);
    if (worst > 1e-5) fprintf(stderr, "  f32 output differs from f64 by %.3g\n", worst);
    for (int i = 0; i < n; i++) {
        if (!inputs[i]->requires_grad) continue;
        double e = normwise_error(in32[i], in64[i], true);
        if (e > 1e-5) fprintf(stderr, "  f32 gradient of input %d differs by %.3g\n", i, e);
        worst = fmax(worst, e);
    }
    ag_tensor_free(v32);
    ag_tensor_free(v64);
    ag_tape_free(t32);
    ag_tape_free(t64);
    for (int i = 0; i < n; i++) {
        ag_tensor_free(in32[i]);
        ag_tensor_free(in64[i]);
    }
    return worst;
}

#endif
