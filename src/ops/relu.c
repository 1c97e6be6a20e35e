// Rectified linear unit.
//   x: any -> y: same
//   y = max(x, 0);  dx = dy where x > 0, else 0
// At exactly x = 0 the gradient is 0, as in PyTorch (the subgradient it picks).
#include "op.h"

static void relu_forward(ag_node *n) {
    const real *x = n->in[0]->data;
    real *y = n->out->data;
    // Written as "x <= 0 ? 0 : x" so that a NaN input stays NaN, as in PyTorch.
    for (size_t k = 0; k < n->out->numel; k++) y[k] = x[k] <= 0 ? 0 : x[k];
}

static void relu_backward(ag_node *n) {
    const real *x = n->in[0]->data, *dy = n->out->grad;
    real *dx = n->in[0]->grad;
    for (size_t k = 0; k < n->out->numel; k++)
        if (x[k] > 0) dx[k] += dy[k];
}

const ag_op R(agi_relu_op) = {"relu", relu_forward, relu_backward,
    "dx = dy where x > 0, else 0"};

#if AG_ONCE
extern const ag_op agi_relu_op_f32, agi_relu_op_f64;

ag_tensor *ag_relu(ag_tape *tp, ag_tensor *x) {
    if (!agi_check_float("relu", "x", x)) return NULL;
    return ag_apply(tp, agi_pick(x, &agi_relu_op_f32, &agi_relu_op_f64), 1, &x, x->ndim,
                    x->shape, NULL, 0);
}
#endif
