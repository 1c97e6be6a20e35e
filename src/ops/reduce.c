// Reductions to a scalar: sum and mean.
//   x: any -> y: []
//   sum:  y = sum_k x[k];        dx[k] = dy
//   mean: y = sum_k x[k] / n;    dx[k] = dy / n
// Accumulated in double even for f32, so a long sum does not drift.
#include "op.h"

typedef struct {
    double factor;  // 1 for sum, 1/n for mean
} reduce_params;

static void reduce_forward(ag_node *n) {
    const real *x = n->in[0]->data;
    double s = 0;
    for (size_t k = 0; k < n->in[0]->numel; k++) s += x[k];
    ((real *)n->out->data)[0] = (real)(s * ((const reduce_params *)n->params)->factor);
}

static void reduce_backward(ag_node *n) {
    real g = (real)(((const real *)n->out->grad)[0] * ((const reduce_params *)n->params)->factor);
    real *dx = n->in[0]->grad;
    for (size_t k = 0; k < n->in[0]->numel; k++) dx[k] += g;
}

const ag_op R(agi_sum_op) = {"sum", reduce_forward, reduce_backward,
    "dx = dy"};
const ag_op R(agi_mean_op) = {"mean", reduce_forward, reduce_backward,
    "dx = dy / n"};

#if AG_ONCE
ag_tensor *ag_sum(ag_tape *tp, ag_tensor *x) {
    if (!agi_check_float("sum", "x", x)) return NULL;
    reduce_params p = {1.0};
    return ag_op_apply(tp, agi_pick(x, &agi_sum_op_f32, &agi_sum_op_f64), 1, &x, 0, NULL, &p,
                    sizeof p);
}

ag_tensor *ag_mean(ag_tape *tp, ag_tensor *x) {
    if (!agi_check_float("mean", "x", x)) return NULL;
    reduce_params p = {1.0 / (double)x->numel};
    return ag_op_apply(tp, agi_pick(x, &agi_mean_op_f32, &agi_mean_op_f64), 1, &x, 0, NULL, &p,
                    sizeof p);
}
#endif
