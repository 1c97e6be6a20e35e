// Gaussian error linear unit, in PyTorch's two forms.
//   x: any -> y: same
//
// erf (approximate='none'): y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
//   Phi' = phi, the normal density phi(x) = exp(-x^2 / 2) / sqrt(2 pi), so by the
//   product rule dy/dx = Phi(x) + x phi(x).
// tanh (approximate='tanh'): y = x (1 + t) / 2, t = tanh(u), u = k (x + a x^3),
//   k = sqrt(2 / pi), a = 0.044715. tanh' = 1 - tanh^2, so
//   dy/dx = (1 + t) / 2 + x (1 - t^2) k (1 + 3 a x^2) / 2.
// Both derivatives are exact for their form (the tanh form is not differentiated
// as if it were the erf one). Backward recomputes them from x: nothing is saved.
#include "op.h"

#define INV_SQRT2 0.70710678118654752440         // 1 / sqrt(2)
#define INV_SQRT_2PI 0.39894228040143267794      // 1 / sqrt(2 pi)
#define SQRT_2_OVER_PI 0.79788456080286535588    // k = sqrt(2 / pi)
#define TANH_CUBIC 0.044715                      // a

typedef struct {
    ag_gelu_kind kind;
} gelu_params;

static real gelu_erf(real x) { return (real)0.5 * x * (1 + r_erf(x * (real)INV_SQRT2)); }

static real gelu_erf_grad(real x) {
    real cdf = (real)0.5 * (1 + r_erf(x * (real)INV_SQRT2));
    real pdf = (real)INV_SQRT_2PI * r_exp((real)-0.5 * x * x);
    return cdf + x * pdf;
}

static real gelu_tanh(real x) {
    real t = r_tanh((real)SQRT_2_OVER_PI * (x + (real)TANH_CUBIC * x * x * x));
    return (real)0.5 * x * (1 + t);
}

static real gelu_tanh_grad(real x) {
    real t = r_tanh((real)SQRT_2_OVER_PI * (x + (real)TANH_CUBIC * x * x * x));
    real du = (real)SQRT_2_OVER_PI * (1 + 3 * (real)TANH_CUBIC * x * x);
    return (real)0.5 * (1 + t) + (real)0.5 * x * (1 - t * t) * du;
}

static void gelu_forward(ag_node *n) {
    const real *x = n->in[0]->data;
    real *y = n->out->data;
    if (((const gelu_params *)n->params)->kind == AG_GELU_TANH)
        for (size_t k = 0; k < n->out->numel; k++) y[k] = gelu_tanh(x[k]);
    else
        for (size_t k = 0; k < n->out->numel; k++) y[k] = gelu_erf(x[k]);
}

static void gelu_backward(ag_node *n) {
    const real *x = n->in[0]->data, *dy = n->out->grad;
    real *dx = n->in[0]->grad;
    if (((const gelu_params *)n->params)->kind == AG_GELU_TANH)
        for (size_t k = 0; k < n->out->numel; k++) dx[k] += dy[k] * gelu_tanh_grad(x[k]);
    else
        for (size_t k = 0; k < n->out->numel; k++) dx[k] += dy[k] * gelu_erf_grad(x[k]);
}

const ag_op R(agi_gelu_op) = {"gelu", gelu_forward, gelu_backward,
    "dx = dy * (Phi(x) + x phi(x))  (tanh form: its own derivative)"};

#if AG_ONCE
extern const ag_op agi_gelu_op_f32, agi_gelu_op_f64;

ag_tensor *ag_gelu(ag_tape *tp, ag_tensor *x, ag_gelu_kind kind) {
    if (!agi_check_float("gelu", "x", x)) return NULL;
    if (kind != AG_GELU_ERF && kind != AG_GELU_TANH) {
        ag_error("gelu: unknown kind %d (AG_GELU_ERF or AG_GELU_TANH) for x %s", (int)kind,
                 agi_shape(x));
        return NULL;
    }
    gelu_params p = {kind};
    return ag_apply(tp, agi_pick(x, &agi_gelu_op_f32, &agi_gelu_op_f64), 1, &x, x->ndim,
                    x->shape, &p, sizeof p);
}
#endif
