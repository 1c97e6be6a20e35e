// Choosing elementwise between two tensors (ag_where) or filling masked places with a
// constant (ag_masked_fill), with numpy broadcasting.
//   where:        cond: bool [*sc], a: [*sa], b: [*sb] -> y: broadcast(sc, sa, sb)
//                 y = cond ? a : b;    da = dy where cond, db = dy where !cond
//                 (each summed over its broadcast dims, on one thread, in order)
//   masked_fill:  x: [*s], mask: bool broadcasting to [*s] -> y: [*s]
//                 y = mask ? value : x;   dx = dy where !mask, else exactly 0
// value may be -inf (a mask for a later softmax): the gradient of a masked place is a
// plain 0, never 0 * inf, so no NaN reaches x.
#include "shape.h"

typedef struct {
    double value;  // masked_fill
} where_params;

typedef struct {
    agi_bcast g;
    const uint8_t *cond;
    const real *a, *b, *dy;
    real *y;  // forward
    real *d;      // backward: the gradient being filled
    double *sum;  // or, for a broadcast operand, its sum in double
    real value;
    int which;  // where: 1 (a) or 2 (b); masked_fill: 0 (x)
    bool fill;
} where_job;

// Operand order in the geometry: where (cond, a, b); masked_fill (x, mask).
static void forward_units(size_t begin, size_t end, void *ctx) {
    const where_job *j = ctx;
    size_t off[3], len;
    for (size_t u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, u, off, &len);
        real *y = j->y + o;
        if (j->fill) {
            const real *x = j->a + off[0];
            const uint8_t *m = j->cond + off[1];
            size_t sx = j->g.stride[0][3], sm = j->g.stride[1][3];
            for (size_t i = 0; i < len; i++) y[i] = m[i * sm] ? j->value : x[i * sx];
        } else {
            const uint8_t *c = j->cond + off[0];
            const real *a = j->a + off[1], *b = j->b + off[2];
            size_t sc = j->g.stride[0][3], sa = j->g.stride[1][3], sb = j->g.stride[2][3];
            for (size_t i = 0; i < len; i++) y[i] = c[i * sc] ? a[i * sa] : b[i * sb];
        }
    }
}

// Units [begin, end) of the gradient of operand j->which: into j->d (real) or, for an
// operand that was broadcast, into j->sum (double: a float sum over many broadcast rows
// drifts by up to that many roundings).
static void backward_units(size_t begin, size_t end, void *ctx) {
    const where_job *j = ctx;
    size_t off[3], len;
    for (size_t u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, u, off, &len);
        const real *dy = j->dy + o;
        size_t sd = j->g.stride[j->which][3];
        int mi = j->fill ? 1 : 0;
        const uint8_t *m = j->cond + off[mi];
        size_t sm = j->g.stride[mi][3];
        bool take = j->which == 1;  // where's a takes the true places; b and x the false
        if (j->sum) {
            double *s = j->sum + off[j->which];
            for (size_t i = 0; i < len; i++)
                if ((m[i * sm] != 0) == take) s[i * sd] += dy[i];
        } else {
            real *d = j->d + off[j->which];
            for (size_t i = 0; i < len; i++)
                if ((m[i * sm] != 0) == take) d[i * sd] += dy[i];
        }
    }
}

static where_job make_job(const ag_node *n, bool fill) {
    where_job j = {0};
    j.fill = fill;
    if (fill) {
        ag_tensor *const ops[] = {n->in[0], n->in[1]};
        agi_bcast_init(&j.g, 2, ops, n->out->ndim, n->out->shape);
        j.a = n->in[0]->data;
        j.cond = n->in[1]->data;
        j.value = (real)((const where_params *)n->params)->value;
    } else {
        ag_tensor *const ops[] = {n->in[0], n->in[1], n->in[2]};
        agi_bcast_init(&j.g, 3, ops, n->out->ndim, n->out->shape);
        j.cond = n->in[0]->data;
        j.a = n->in[1]->data;
        j.b = n->in[2]->data;
    }
    return j;
}

static void run_forward(ag_node *n, bool fill) {
    where_job j = make_job(n, fill);
    j.y = n->out->data;
    agi_parallel_for(j.g.units, (double)n->out->numel, forward_units, &j);
}

static void run_backward(ag_node *n, bool fill) {
    where_job j = make_job(n, fill);
    j.dy = n->out->grad;
    for (int k = fill ? 0 : 1; k < (fill ? 1 : 3); k++) {
        if (!n->in[k]->grad) continue;
        j.which = k;
        j.d = n->in[k]->grad;
        j.sum = NULL;
        if (j.g.full[k]) {
            agi_parallel_for(j.g.units, (double)n->out->numel, backward_units, &j);
            continue;
        }
        const size_t numel = n->in[k]->numel;
        j.sum = agi_grad_sums(n->tape, numel);
        backward_units(0, j.g.units, &j);
        R(agi_grad_sums_add)(j.d, j.sum, numel);
    }
}

static void where_forward(ag_node *n) { run_forward(n, false); }
static void where_backward(ag_node *n) { run_backward(n, false); }
static void masked_fill_forward(ag_node *n) { run_forward(n, true); }
static void masked_fill_backward(ag_node *n) { run_backward(n, true); }

const ag_op R(agi_where_op) = {"where", where_forward, where_backward,
    "da = dy where cond, db = dy where !cond; summed over broadcast dims"};
const ag_op R(agi_masked_fill_op) = {"masked_fill", masked_fill_forward, masked_fill_backward,
    "dx = dy where !mask, else 0"};

#if AG_ONCE
static bool check_bool(const char *op, const char *what, const ag_tensor *m) {
    if (!m) {
        ag_error("%s: %s is NULL", op, what);
        return false;
    }
    if (m->dtype == AG_BOOL) return true;
    ag_error("%s: %s %s must be bool, not %s", op, what, agi_shape(m), ag_dtype_name(m->dtype));
    return false;
}

ag_tensor *ag_where(ag_tape *tp, ag_tensor *cond, ag_tensor *a, ag_tensor *b) {
    if (!check_bool("where", "cond", cond) || !agi_check_float("where", "a", a) ||
        !agi_check_float("where", "b", b) || !agi_check_same_dtype("where", a, b))
        return NULL;
    ag_tensor *in[] = {cond, a, b};
    int ndim, shape[AG_MAX_DIMS];
    if (!agi_broadcast_shape("where", 3, in, &ndim, shape)) return NULL;
    return ag_op_apply(tp, agi_pick(a, &agi_where_op_f32, &agi_where_op_f64), 3, in, ndim, shape,
                    NULL, 0);
}

ag_tensor *ag_masked_fill(ag_tape *tp, ag_tensor *x, ag_tensor *mask, double value) {
    if (!agi_check_float("masked_fill", "x", x) || !check_bool("masked_fill", "mask", mask))
        return NULL;
    ag_tensor *in[] = {x, mask};
    int ndim, shape[AG_MAX_DIMS];
    if (!agi_broadcast_shape("masked_fill", 2, in, &ndim, shape)) return NULL;
    ag_tensor out;
    agi_tensor_header(&out, x->dtype, ndim, shape);
    if (!ag_tensor_same_shape(&out, x)) {
        ag_error("masked_fill: mask %s does not broadcast to x %s (the output keeps x's shape)",
                 agi_shape(mask), agi_shape(x));
        return NULL;
    }
    where_params p = {value};
    return ag_op_apply(tp, agi_pick(x, &agi_masked_fill_op_f32, &agi_masked_fill_op_f64), 2, in,
                    x->ndim, x->shape, &p, sizeof p);
}
#endif
