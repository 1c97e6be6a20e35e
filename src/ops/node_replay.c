// One node run alone, on a scratch copy (see node_replay.h).
#include <math.h>
#include <string.h>

#include "node_replay.h"

#include "../core/fd_check.h"

// The float types are read directly (agi_fd_get): these run over every output element of
// every run.
double agi_replay_get(const ag_tensor *t, const void *buf, size_t i) {
    if (agi_is_float(t->dtype)) return agi_fd_get(t, buf, i);
    ag_tensor view = *t;
    view.data = (void *)buf;
    return ag_tensor_item(&view, i);
}

void agi_replay_set(const ag_tensor *t, void *buf, size_t i, double v) {
    if (agi_is_float(t->dtype)) {
        agi_fd_set(t, buf, i, v);
    } else {
        ag_tensor view = *t;
        view.data = buf;
        ag_tensor_set_item(&view, i, v);
    }
}

size_t agi_replay_bytes(const ag_tensor *t) { return t->numel * ag_dtype_size(t->dtype); }

// A copy of x in `buffers`, converted to dtype dt.
static void *copy_as(ag_tape *buffers, const ag_tensor *x, ag_dtype dt) {
    ag_tensor view = *x;
    view.dtype = dt;
    view.data = ag_tape_alloc(buffers, agi_replay_bytes(&view));
    if (dt == x->dtype)
        memcpy(view.data, x->data, agi_replay_bytes(x));
    else
        for (size_t i = 0; i < x->numel; i++)
            agi_replay_set(&view, view.data, i, agi_replay_get(x, x->data, i));
    return view.data;
}

// Inputs the copy does not differentiate are shared, unless they must be converted; those
// it differentiates are copied (it perturbs them).
void agi_replay_init(agi_replay *s, const ag_node *n, const ag_op *op, ag_dtype dt,
                     ag_tape *tape, ag_tape *buffers) {
    memset(s, 0, sizeof *s);
    s->tape = tape;
    s->buffers = buffers;
    s->node = *n;
    s->node.op = op;
    s->node.tape = tape;
    s->node.out = &s->out;
    s->node.saved = NULL;
    for (int k = 0; k < n->n_in; k++) {
        const ag_tensor *x = n->in[k];
        bool is_float = agi_is_float(x->dtype);
        s->diff[k] = is_float && x->requires_grad;
        s->in[k] = *x;
        s->in[k].node = NULL;
        s->in[k].agi_bookkeeping = 0;
        s->in[k].grad = NULL;  // not differentiated: backward leaves it alone
        if (is_float && (x->dtype != dt || s->diff[k])) {
            s->in[k].dtype = dt;
            s->in[k].data = copy_as(buffers, x, dt);
        }
        if (s->diff[k]) {
            s->in[k].grad = ag_tape_alloc(buffers, agi_replay_bytes(&s->in[k]));
            s->ana[k] = ag_tape_alloc(buffers, x->numel * sizeof *s->ana[k]);
        }
        s->node.in[k] = &s->in[k];
    }
    s->out = *n->out;
    s->out.dtype = dt;
    s->out.agi_bookkeeping = 0;
    s->out.node = &s->node;
    s->out.requires_grad = true;
    s->out.grad = ag_tape_alloc(buffers, agi_replay_bytes(&s->out));
    s->y = ag_tape_alloc(buffers, agi_replay_bytes(&s->out));
}

// All bits set is a NaN in f32 and f64.
void agi_replay_forward(agi_replay *s, void *out) {
    memset(out, 0xff, agi_replay_bytes(&s->out));
    ag_tape_reset(s->tape);
    s->node.saved = NULL;
    s->out.data = out;
    s->node.op->forward(&s->node);
    s->runs++;
}

// The starting gradients are rounded to the dtype as stored.
void agi_replay_backward(agi_replay *s, double *const start[]) {
    s->out.data = s->y;
    for (int k = 0; k < s->node.n_in; k++) {
        if (!s->diff[k]) continue;
        for (size_t i = 0; i < s->in[k].numel; i++)
            agi_replay_set(&s->in[k], s->in[k].grad, i, start[k][i]);
    }
    s->node.op->backward(&s->node);
    for (int k = 0; k < s->node.n_in; k++) {
        if (!s->diff[k]) continue;
        for (size_t i = 0; i < s->in[k].numel; i++)
            s->ana[k][i] = agi_replay_get(&s->in[k], s->in[k].grad, i) - start[k][i];
    }
}


double agi_replay_diff(const agi_replay *s, const ag_tensor *recorded) {
    double worst = 0;
    for (size_t j = 0; j < s->out.numel; j++) {
        double a = agi_replay_get(&s->out, s->y, j);
        double b = agi_replay_get(recorded, recorded->data, j);
        // Equal values (a masked -inf in both) differ by 0, and so do two NaNs.
        double d = a == b || (isnan(a) && isnan(b)) ? 0 : fabs(a - b);
        if (isnan(d)) return d;
        if (d > worst) worst = d;
    }
    return worst;
}

bool agi_node_sends(const ag_node *n, double *const sends[], bool differentiated[],
                    double *replay_diff) {
    const ag_tensor *y = n->out;
    if (!n->op->backward || !y->grad) return false;
    ag_tape *tape = ag_tape_new(), *buffers = ag_tape_new();
    agi_replay s;
    agi_replay_init(&s, n, n->op, y->dtype, tape, buffers);
    agi_replay_forward(&s, s.y);
    *replay_diff = agi_replay_diff(&s, y);
    for (size_t j = 0; j < y->numel; j++)
        agi_replay_set(&s.out, s.out.grad, j, agi_replay_get(y, y->grad, j));
    double *start[AG_MAX_INPUTS] = {0};
    for (int k = 0; k < n->n_in; k++) {
        differentiated[k] = s.diff[k];
        if (!s.diff[k]) continue;
        start[k] = ag_tape_alloc(buffers, s.in[k].numel * sizeof *start[k]);
        memset(start[k], 0, s.in[k].numel * sizeof *start[k]);
    }
    agi_replay_backward(&s, start);
    for (int k = 0; k < n->n_in; k++)
        if (s.diff[k] && sends[k]) memcpy(sends[k], s.ana[k], s.in[k].numel * sizeof *sends[k]);
    ag_tape_free(tape);
    ag_tape_free(buffers);
    return true;
}
