// Elementwise product with broadcasting over leading dims.
//   a: [..., *s], b: [*s] -> y: [..., *s]
//   y[o, i] = a[o, i] * b[i]
//   da[o, i] = dy[o, i] * b[i];  db[i] = sum over o of dy[o, i] * a[o, i]
#include "op.h"

static void mul_forward(ag_node *n) {
    const real *a = n->in[0]->data, *b = n->in[1]->data;
    real *y = n->out->data;
    size_t inner = n->in[1]->numel, outer = n->in[0]->numel / inner;
    for (size_t o = 0; o < outer; o++)
        for (size_t i = 0; i < inner; i++) y[o * inner + i] = a[o * inner + i] * b[i];
}

static void mul_backward(ag_node *n) {
    const real *a = n->in[0]->data, *b = n->in[1]->data, *dy = n->out->grad;
    real *da = n->in[0]->grad, *db = n->in[1]->grad;
    size_t inner = n->in[1]->numel, outer = n->in[0]->numel / inner;
    for (size_t o = 0; o < outer; o++) {
        for (size_t i = 0; i < inner; i++) {
            size_t k = o * inner + i;
            if (da) da[k] += dy[k] * b[i];
            if (db) db[i] += dy[k] * a[k];
        }
    }
}

const ag_op R(agi_mul_op) = {"mul", mul_forward, mul_backward,
    "da = dy * b; db = dy * a, summed over the broadcast dims"};

#if AG_ONCE
extern const ag_op agi_mul_op_f32, agi_mul_op_f64;

ag_tensor *ag_mul(ag_tape *tp, ag_tensor *a, ag_tensor *b) {
    if (!agi_check_float("mul", "a", a) || !agi_check_float("mul", "b", b) ||
        !agi_check_same_dtype("mul", a, b) || !agi_check_trailing("mul", a, b))
        return NULL;
    ag_tensor *in[] = {a, b};
    return ag_apply(tp, agi_pick(a, &agi_mul_op_f32, &agi_mul_op_f64), 2, in, a->ndim,
                    a->shape, NULL, 0);
}
#endif
