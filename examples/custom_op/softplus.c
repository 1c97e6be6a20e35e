// softplus(x) = log(1 + exp(x)).
//   x: any shape -> y: same shape
// Stable for any x: log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), which neither
// overflows for large x nor loses the small value for very negative x.
// Gradient: dy/dx = exp(x) / (1 + exp(x)) = sigmoid(x), so dx += dy * sigmoid(x), with
// sigmoid(x) = 1 / (1 + exp(-x)) for x >= 0 and exp(x) / (1 + exp(x)) below (no overflow).
#include "softplus.h"

#include <math.h>

static double softplus_of(double x) { return fmax(x, 0) + log1p(exp(-fabs(x))); }

static double sigmoid_of(double x) {
    if (x >= 0) return 1 / (1 + exp(-x));
    double e = exp(x);
    return e / (1 + e);
}

// A NaN stays a NaN: fmax(NaN, 0) would give 0, so NaN goes through x + ... instead.
static double softplus_or_nan(double x) { return isnan(x) ? x : softplus_of(x); }

static void softplus_forward(ag_node *n) {
    const ag_tensor *x = n->in[0];
    if (x->dtype == AG_F64) {
        const double *xd = ag_tensor_f64(x);
        double *yd = ag_tensor_f64(n->out);
        for (size_t i = 0; i < x->numel; i++) yd[i] = softplus_or_nan(xd[i]);
    } else {
        const float *xf = ag_tensor_f32(x);
        float *yf = ag_tensor_f32(n->out);
        for (size_t i = 0; i < x->numel; i++) yf[i] = (float)softplus_or_nan(xf[i]);
    }
}

// dx += dy * sigmoid(x) * factor; factor is 1 for the real op.
static void backward_scaled(ag_node *n, double factor) {
    const ag_tensor *x = n->in[0];
    if (x->dtype == AG_F64) {
        const double *xd = ag_tensor_f64(x), *dy = n->out->grad;
        double *dx = x->grad;
        for (size_t i = 0; i < x->numel; i++) dx[i] += dy[i] * sigmoid_of(xd[i]) * factor;
    } else {
        const float *xf = ag_tensor_f32(x), *dy = n->out->grad;
        float *dx = x->grad;
        for (size_t i = 0; i < x->numel; i++)
            dx[i] += (float)(dy[i] * sigmoid_of(xf[i]) * factor);
    }
}

static void softplus_backward(ag_node *n) { backward_scaled(n, 1.0); }
static void softplus_wrong_backward(ag_node *n) { backward_scaled(n, 1.01); }

const ag_op softplus_op = {"softplus", softplus_forward, softplus_backward,
                           "dx = dy * sigmoid(x)"};
const ag_op softplus_wrong_op = {"softplus_wrong", softplus_forward,
                                        softplus_wrong_backward, "dx = dy * sigmoid(x)"};

static ag_tensor *apply(ag_tape *tp, const ag_op *op, ag_tensor *x) {
    if (!x || (x->dtype != AG_F32 && x->dtype != AG_F64)) {
        ag_error("%s: x must be an f32 or f64 tensor, got %s", op->name,
                 x ? ag_dtype_name(x->dtype) : "NULL");
        return NULL;
    }
    return ag_op_apply(tp, op, 1, &x, x->ndim, x->shape, NULL, 0);
}

ag_tensor *softplus(ag_tape *tp, ag_tensor *x) { return apply(tp, &softplus_op, x); }
ag_tensor *softplus_wrong(ag_tape *tp, ag_tensor *x) { return apply(tp, &softplus_wrong_op, x); }

static ag_tensor *build_softplus(ag_tape *tp, ag_tensor *const in[], const void *args) {
    (void)args;
    return softplus(tp, in[0]);
}

static ag_tensor *build_softplus_wrong(ag_tape *tp, ag_tensor *const in[], const void *args) {
    (void)args;
    return softplus_wrong(tp, in[0]);
}

const ag_op_spec softplus_spec = {"softplus", build_softplus, NULL, 1,
                                  {{.name = "x", .dims = "...", .lo = -3, .hi = 3}}, ""};
const ag_op_spec softplus_wrong_spec = {"softplus_wrong", build_softplus_wrong, NULL, 1,
                                        {{.name = "x", .dims = "...", .lo = -3, .hi = 3}}, ""};
const ag_op *const softplus_twins[4] = {&softplus_op, &softplus_op, &softplus_wrong_op,
                                        &softplus_wrong_op};
