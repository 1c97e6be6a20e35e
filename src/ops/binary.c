// Add, subtract, multiply and divide with numpy/PyTorch broadcasting.
//   a: [*sa], b: [*sb] -> y: broadcast(sa, sb) (size-1 dims on either side, different ranks)
//   y = a + b:  da = dy,                    db = dy
//   y = a - b:  da = dy,                    db = -dy
//   y = a * b:  da = dy * b,                db = dy * a
//   y = a / b:  da = dy / b,                db = -dy * a / b^2
// each gradient summed over the dims along which its operand was broadcast. That sum runs
// over the output in row-major order on one thread, so it is the same on every run; an
// operand that was not broadcast receives its gradient split across threads.
//
// The geometry (src/ops/shape.c) merges dims, so the same-shape case is one flat loop and
// a bias [E] over [B,T,E] is rows of E against one row: both loops vectorise.
#include "shape.h"

typedef enum { ADD, SUB, MUL, DIV } binary_kind;

typedef struct {
    binary_kind kind;
} binary_params;

typedef struct {
    agi_bcast g;
    binary_kind kind;
    const real *a, *b, *y, *dy;
    real *d;     // the gradient being filled
    int which;   // 0: da, 1: db
} binary_job;

#define BINARY_LOOP(OP)                                                              \
    do {                                                                             \
        if (sa && sb)                                                                \
            for (size_t i = 0; i < len; i++) y[i] = a[i] OP b[i];                    \
        else if (sa) {                                                               \
            const real bv = b[0];                                                    \
            for (size_t i = 0; i < len; i++) y[i] = a[i] OP bv;                      \
        } else if (sb) {                                                             \
            const real av = a[0];                                                    \
            for (size_t i = 0; i < len; i++) y[i] = av OP b[i];                      \
        } else {                                                                     \
            const real v = a[0] OP b[0];                                             \
            for (size_t i = 0; i < len; i++) y[i] = v;                               \
        }                                                                            \
    } while (0)

static void forward_units(int begin, int end, void *ctx) {
    const binary_job *j = ctx;
    size_t off[2], len;
    const bool sa = j->g.stride[0][3] != 0, sb = j->g.stride[1][3] != 0;
    for (int u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, (size_t)u, off, &len);
        const real *a = j->a + off[0], *b = j->b + off[1];
        real *y = (real *)j->y + o;
        switch (j->kind) {
        case ADD: BINARY_LOOP(+); break;
        case SUB: BINARY_LOOP(-); break;
        case MUL: BINARY_LOOP(*); break;
        case DIV: BINARY_LOOP(/); break;
        }
    }
}

// The contribution of dy[i] to the gradient of operand `which`, given both operands.
static inline real grad_term(binary_kind kind, int which, real dy, real a, real b) {
    switch (kind) {
    case ADD: return dy;
    case SUB: return which ? -dy : dy;
    case MUL: return which ? dy * a : dy * b;
    case DIV: return which ? -dy * a / (b * b) : dy / b;
    }
    return 0;
}

static void backward_units(int begin, int end, void *ctx) {
    const binary_job *j = ctx;
    size_t off[2], len;
    const size_t sa = j->g.stride[0][3], sb = j->g.stride[1][3];
    const size_t sd = j->g.stride[j->which][3];
    for (int u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, (size_t)u, off, &len);
        const real *a = j->a + off[0], *b = j->b + off[1], *dy = j->dy + o;
        real *d = j->d + off[j->which];
        if (sd) {
            for (size_t i = 0; i < len; i++) d[i] += grad_term(j->kind, j->which, dy[i],
                                                               a[i * sa], b[i * sb]);
        } else {
            real acc = 0;
            for (size_t i = 0; i < len; i++) acc += grad_term(j->kind, j->which, dy[i],
                                                              a[i * sa], b[i * sb]);
            d[0] += acc;
        }
    }
}

static binary_job make_job(const ag_node *n) {
    binary_job j;
    ag_tensor *const ops[] = {n->in[0], n->in[1]};
    agi_bcast_init(&j.g, 2, ops, n->out->ndim, n->out->shape);
    j.kind = ((const binary_params *)n->params)->kind;
    j.a = n->in[0]->data;
    j.b = n->in[1]->data;
    j.y = n->out->data;
    j.dy = n->out->grad;
    j.d = NULL;
    j.which = 0;
    return j;
}

static void binary_forward(ag_node *n) {
    binary_job j = make_job(n);
    agi_parallel_for((int)j.g.units, (double)n->out->numel, forward_units, &j);
}

static void binary_backward(ag_node *n) {
    binary_job j = make_job(n);
    for (int k = 0; k < 2; k++) {
        if (!n->in[k]->grad) continue;
        j.which = k;
        j.d = n->in[k]->grad;
        if (j.g.full[k])
            agi_parallel_for((int)j.g.units, 2.0 * (double)n->out->numel, backward_units, &j);
        else
            backward_units(0, (int)j.g.units, &j);
    }
}

const ag_op R(agi_add_op) = {"add", binary_forward, binary_backward,
    "da = dy; db = dy; each summed over its broadcast dims"};
const ag_op R(agi_sub_op) = {"sub", binary_forward, binary_backward,
    "da = dy; db = -dy; each summed over its broadcast dims"};
const ag_op R(agi_mul_op) = {"mul", binary_forward, binary_backward,
    "da = dy * b; db = dy * a; each summed over its broadcast dims"};
const ag_op R(agi_div_op) = {"div", binary_forward, binary_backward,
    "da = dy / b; db = -dy * a / b^2; each summed over its broadcast dims"};

#if AG_ONCE
extern const ag_op agi_add_op_f32, agi_add_op_f64, agi_sub_op_f32, agi_sub_op_f64,
    agi_mul_op_f32, agi_mul_op_f64, agi_div_op_f32, agi_div_op_f64;

static ag_tensor *binary(ag_tape *tp, const char *name, binary_kind kind, const ag_op *f32,
                         const ag_op *f64, ag_tensor *a, ag_tensor *b) {
    if (!agi_check_float(name, "a", a) || !agi_check_float(name, "b", b) ||
        !agi_check_same_dtype(name, a, b))
        return NULL;
    ag_tensor *in[] = {a, b};
    int ndim, shape[AG_MAX_DIMS];
    if (!agi_broadcast_shape(name, 2, in, &ndim, shape)) return NULL;
    binary_params p = {kind};
    return ag_apply(tp, agi_pick(a, f32, f64), 2, in, ndim, shape, &p, sizeof p);
}

ag_tensor *ag_add(ag_tape *tp, ag_tensor *a, ag_tensor *b) {
    return binary(tp, "add", ADD, &agi_add_op_f32, &agi_add_op_f64, a, b);
}
ag_tensor *ag_sub(ag_tape *tp, ag_tensor *a, ag_tensor *b) {
    return binary(tp, "sub", SUB, &agi_sub_op_f32, &agi_sub_op_f64, a, b);
}
ag_tensor *ag_mul(ag_tape *tp, ag_tensor *a, ag_tensor *b) {
    return binary(tp, "mul", MUL, &agi_mul_op_f32, &agi_mul_op_f64, a, b);
}
ag_tensor *ag_div(ag_tape *tp, ag_tensor *a, ag_tensor *b) {
    return binary(tp, "div", DIV, &agi_div_op_f32, &agi_div_op_f64, a, b);
}
#endif
