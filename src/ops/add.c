// Addition with broadcasting over leading dims (a bias, a residual, a table of
// positions).
//   a: [..., *s], b: [*s] -> y: [..., *s]
//   y[o, i] = a[o, i] + b[i]
//   da = dy;  db[i] = sum over o of dy[o, i]
#include "op.h"

static void add_forward(ag_node *n) {
    const real *a = n->in[0]->data, *b = n->in[1]->data;
    real *y = n->out->data;
    size_t inner = n->in[1]->numel, outer = n->in[0]->numel / inner;
    for (size_t o = 0; o < outer; o++)
        for (size_t i = 0; i < inner; i++) y[o * inner + i] = a[o * inner + i] + b[i];
}

static void add_backward(ag_node *n) {
    const real *dy = n->out->grad;
    real *da = n->in[0]->grad, *db = n->in[1]->grad;
    size_t inner = n->in[1]->numel, outer = n->in[0]->numel / inner;
    if (da)
        for (size_t k = 0; k < n->out->numel; k++) da[k] += dy[k];
    if (db)
        for (size_t o = 0; o < outer; o++)
            for (size_t i = 0; i < inner; i++) db[i] += dy[o * inner + i];
}

const ag_op R(agi_add_op) = {"add", add_forward, add_backward,
    "da = dy; db = dy summed over the broadcast dims"};

#if AG_ONCE
extern const ag_op agi_add_op_f32, agi_add_op_f64;

ag_tensor *ag_add(ag_tape *tp, ag_tensor *a, ag_tensor *b) {
    if (!agi_check_float("add", "a", a) || !agi_check_float("add", "b", b) ||
        !agi_check_same_dtype("add", a, b) || !agi_check_trailing("add", a, b))
        return NULL;
    ag_tensor *in[] = {a, b};
    return ag_apply(tp, agi_pick(a, &agi_add_op_f32, &agi_add_op_f64), 2, in, a->ndim,
                    a->shape, NULL, 0);
}
#endif
