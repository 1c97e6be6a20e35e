// Mean squared error.
//   x: any, target: same shape -> y: []
//   y = (1 / n) sum_k (x[k] - target[k])^2
//   dx[k] = 2 (x[k] - target[k]) dy / n;  dtarget[k] = -dx[k]
// The sum is accumulated in double, so a long f32 sum does not drift.
#include "op.h"

static void mse_forward(ag_node *n) {
    const real *x = n->in[0]->data, *t = n->in[1]->data;
    size_t count = n->in[0]->numel;
    double s = 0;
    for (size_t k = 0; k < count; k++) {
        double d = (double)x[k] - (double)t[k];
        s += d * d;
    }
    ((real *)n->out->data)[0] = (real)(s / (double)count);
}

static void mse_backward(ag_node *n) {
    const real *x = n->in[0]->data, *t = n->in[1]->data;
    real *dx = n->in[0]->grad, *dt = n->in[1]->grad;
    size_t count = n->in[0]->numel;
    // PyTorch's grouping, (2 / n) (x - target) dy: 2 dy / n first overflows for a dy
    // near the largest finite value where the gradient is finite.
    const real norm = (real)(2.0 / (double)count), dy = ((const real *)n->out->grad)[0];
    for (size_t k = 0; k < count; k++) {
        real d = norm * (x[k] - t[k]) * dy;
        if (dx) dx[k] += d;
        if (dt) dt[k] -= d;
    }
}

const ag_op R(agi_mse_op) = {"mse", mse_forward, mse_backward,
    "dx = 2 (x - target) dy / n; dtarget = -dx"};

#if AG_ONCE
ag_tensor *ag_mse(ag_tape *tp, ag_tensor *x, ag_tensor *target) {
    if (!agi_check_float("mse", "x", x) || !agi_check_float("mse", "target", target) ||
        !agi_check_same_dtype("mse", x, target) || !agi_check_same_shape("mse", x, target))
        return NULL;
    ag_tensor *in[] = {x, target};
    return ag_op_apply(tp, agi_pick(x, &agi_mse_op_f32, &agi_mse_op_f64), 2, in, 0, NULL, NULL,
                    0);
}
#endif
