// Multiplication by a constant.
//   x: any -> y: same;  y = s * x;  dx = s * dy
#include "op.h"

typedef struct {
    double s;
} scale_params;

static void scale_forward(ag_node *n) {
    const real *x = n->in[0]->data;
    real *y = n->out->data, s = (real)((const scale_params *)n->params)->s;
    for (size_t k = 0; k < n->out->numel; k++) y[k] = s * x[k];
}

static void scale_backward(ag_node *n) {
    const real *dy = n->out->grad;
    real *dx = n->in[0]->grad, s = (real)((const scale_params *)n->params)->s;
    for (size_t k = 0; k < n->out->numel; k++) dx[k] += s * dy[k];
}

const ag_op R(agi_scale_op) = {"scale", scale_forward, scale_backward,
    "dx = s * dy"};

#if AG_ONCE
ag_tensor *ag_scale(ag_tape *tp, ag_tensor *x, double s) {
    if (!agi_check_float("scale", "x", x)) return NULL;
    scale_params p = {s};
    return ag_op_apply(tp, agi_pick(x, &agi_scale_op_f32, &agi_scale_op_f64), 1, &x, x->ndim,
                    x->shape, &p, sizeof p);
}
#endif
