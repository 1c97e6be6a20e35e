// One more position at the end of a sequence: what nn.MultiheadAttention's add_bias_kv
// (a learned key and value) and add_zero_attn (a zero key and value) do to k and v.
//   x: [B, S, E], row: E elements (bias_k is [1, 1, E]) or NULL for zeros -> y: [B, S+1, E]
//   y[b, s] = x[b, s] for s < S;  y[b, S] = row
//   dx[b, s] = dy[b, s];  drow = sum over b of dy[b, S]
#include <string.h>

#include "op.h"

static void append_row_forward(ag_node *n) {
    const ag_tensor *x = n->in[0];
    int B = x->shape[0];
    size_t block = (size_t)x->shape[1] * x->shape[2], E = (size_t)x->shape[2];
    const real *xd = x->data, *r = n->n_in > 1 ? n->in[1]->data : NULL;
    real *y = n->out->data;
    for (int b = 0; b < B; b++) {
        real *yb = y + (size_t)b * (block + E);
        memcpy(yb, xd + (size_t)b * block, block * sizeof *y);
        if (r)
            memcpy(yb + block, r, E * sizeof *y);
        else
            memset(yb + block, 0, E * sizeof *y);
    }
}

static void append_row_backward(ag_node *n) {
    const ag_tensor *x = n->in[0];
    int B = x->shape[0];
    size_t block = (size_t)x->shape[1] * x->shape[2], E = (size_t)x->shape[2];
    const real *dy = n->out->grad;
    real *dx = x->grad, *dr = n->n_in > 1 ? n->in[1]->grad : NULL;
    for (int b = 0; b < B; b++) {
        const real *db = dy + (size_t)b * (block + E);
        if (dx)
            for (size_t i = 0; i < block; i++) dx[(size_t)b * block + i] += db[i];
        if (dr)
            for (size_t i = 0; i < E; i++) dr[i] += db[block + i];
    }
}

const ag_op R(agi_append_row_op) = {"append_row", append_row_forward, append_row_backward,
    "dx = dy[:, :S]; drow = sum over b of dy[:, S]"};

#if AG_ONCE
extern const ag_op agi_append_row_op_f32, agi_append_row_op_f64;

ag_tensor *agi_append_row(ag_tape *tp, ag_tensor *x, ag_tensor *row) {
    if (!agi_check_float("append_row", "x", x) ||
        !agi_check_ndim("append_row", "x [B, S, E]", x, 3, 3) ||
        (row && (!agi_check_float("append_row", "row", row) ||
                 !agi_check_same_dtype("append_row", x, row))))
        return NULL;
    if (row && row->numel != (size_t)x->shape[2]) {
        ag_error("append_row: row %s does not have E = %d elements of x %s", agi_shape(row),
                 x->shape[2], agi_shape(x));
        return NULL;
    }
    ag_tensor *in[] = {x, row};
    int shape[] = {x->shape[0], x->shape[1] + 1, x->shape[2]};
    return ag_apply(tp, agi_pick(x, &agi_append_row_op_f32, &agi_append_row_op_f64),
                    row ? 2 : 1, in, 3, shape, NULL, 0);
}
#endif
