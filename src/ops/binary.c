// Add, subtract, multiply and divide with numpy/PyTorch broadcasting.
//   a: [*sa], b: [*sb] -> y: broadcast(sa, sb) (size-1 dims on either side, different ranks)
//   y = a + b:  da = dy,                    db = dy
//   y = a - b:  da = dy,                    db = -dy
//   y = a * b:  da = dy * b,                db = dy * a
//   y = a / b:  da = dy / b,                db = -dy * (a / b) / b (as PyTorch; b^2 alone
//                                           under- or overflows where a / b^2 does not)
// each gradient summed over the dims along which its operand was broadcast. That sum runs
// in double, over the output in row-major order on one thread (along a unit in eight
// interleaved partial sums), so it does not depend on the run or the thread count;
// operands that were not broadcast receive their gradients split across threads, in one
// pass that reads dy once.
//
// The geometry (src/ops/shape.c) merges dims, so the same-shape case is one flat loop and
// a bias [E] over [B,T,E] is rows of E against one row; every case of operator, operand
// and broadcast has a loop of its own, so each vectorises.
#include "shape.h"

typedef enum { ADD, SUB, MUL, DIV } binary_kind;

typedef struct {
    binary_kind kind;
} binary_params;

typedef struct {
    agi_bcast g;
    binary_kind kind;
    const real *a, *b, *y, *dy;
    real *d[2];   // the gradients of a and b
    bool todo[2]; // which of them the current pass fills
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

// y[i] = a[i * sa] OP b[i * sb] for i < len (sa, sb: whether the operand runs along).
static inline void forward_unit(binary_kind kind, size_t len, const real *a, bool sa,
                                const real *b, bool sb, real *y) {
    switch (kind) {
    case ADD: BINARY_LOOP(+); break;
    case SUB: BINARY_LOOP(-); break;
    case MUL: BINARY_LOOP(*); break;
    case DIV: BINARY_LOOP(/); break;
    }
}

static void forward_units(size_t begin, size_t end, void *ctx) {
    const binary_job *j = ctx;
    size_t off[2], len;
    const bool sa = j->g.stride[0][3] != 0, sb = j->g.stride[1][3] != 0;
    for (size_t u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, u, off, &len);
        forward_unit(j->kind, len, j->a + off[0], sa, j->b + off[1], sb, (real *)j->y + o);
    }
}

// The gradient of operand `which` over one unit of n output elements: dy at dy[i], the
// operands at a[i * sa] and b[i * sb]. GRAD_TERMS expands INTO(term) for the case at hand;
// av and bv are the operands when they are broadcast along the unit. One loop per case,
// so each vectorises.
#define GRAD_TERMS(INTO)                                                                   \
    do {                                                                                   \
        const real av = a[0], bv = b[0];                                                   \
        switch (kind) {                                                                    \
        case ADD: INTO(dy[i]); break;                                                      \
        case SUB:                                                                          \
            if (which) INTO(-dy[i]);                                                       \
            else INTO(dy[i]);                                                              \
            break;                                                                         \
        case MUL:                                                                          \
            if (which ? sa : sb) {                                                         \
                if (which) INTO(dy[i] * a[i]);                                             \
                else INTO(dy[i] * b[i]);                                                   \
            } else {                                                                       \
                if (which) INTO(dy[i] * av);                                               \
                else INTO(dy[i] * bv);                                                     \
            }                                                                              \
            break;                                                                         \
        case DIV:                                                                          \
            if (!which) {                                                                  \
                if (sb) INTO(dy[i] / b[i]);                                                \
                else INTO(dy[i] / bv);                                                     \
            } else if (sa && sb) { /* (a / b) / b, never a / b^2: b^2 under- or overflows */ \
                INTO(-dy[i] * (a[i] / b[i] / b[i]));                                       \
            } else if (sa) {                                                               \
                INTO(-dy[i] * (a[i] / bv / bv));                                           \
            } else if (sb) {                                                               \
                INTO(-dy[i] * (av / b[i] / b[i]));                                         \
            } else {                                                                       \
                INTO(-dy[i] * (av / bv / bv));                                             \
            }                                                                              \
            break;                                                                         \
        }                                                                                  \
    } while (0)

// An operand that was not broadcast: its gradient element by element, added to d[i].
#define ADD_INTO_D(TERM)                                                                   \
    for (size_t i = 0; i < n; i++) d[i] += (TERM)

static void grad_unit(binary_kind kind, int which, size_t n, const real *restrict dy,
                      const real *a, size_t sa, const real *b, size_t sb, real *d) {
    GRAD_TERMS(ADD_INTO_D);
}

// A broadcast operand: its gradient summed into a double accumulator s, element by element
// (ss = 1) or, when it is broadcast along the unit (ss = 0), into s[0] in eight
// interleaved sums in a fixed order (they vectorise and stay the same). In double: a
// float sum over a million rows (a bias's gradient) drifts by up to that many roundings.
#define SUM_INTO_S(TERM)                                                                   \
    do {                                                                                   \
        if (ss) {                                                                          \
            for (size_t i = 0; i < n; i++) s[i] += (TERM);                                 \
        } else {                                                                           \
            double acc[8] = {0};                                                           \
            size_t i = 0;                                                                  \
            while (i + 8 <= n)                                                             \
                for (int k = 0; k < 8; k++, i++) acc[k] += (TERM);                         \
            for (int k = 0; i < n; k++, i++) acc[k] += (TERM);                             \
            s[0] += ((acc[0] + acc[4]) + (acc[1] + acc[5])) +                              \
                    ((acc[2] + acc[6]) + (acc[3] + acc[7]));                               \
        }                                                                                  \
    } while (0)

static void sum_unit(binary_kind kind, int which, size_t n, const real *restrict dy,
                     const real *a, size_t sa, const real *b, size_t sb, double *s, size_t ss) {
    GRAD_TERMS(SUM_INTO_S);
}

// Backward over units for the operands flagged in `todo`, neither of them broadcast: both
// share one pass, so dy is read once (a before b at every element, as when a + a gives one
// tensor both gradients).
static void backward_units(size_t begin, size_t end, void *ctx) {
    const binary_job *j = ctx;
    size_t off[2], len;
    const size_t sa = j->g.stride[0][3], sb = j->g.stride[1][3];
    for (size_t u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, u, off, &len);
        const real *a = j->a + off[0], *b = j->b + off[1], *dy = j->dy + o;
        for (int k = 0; k < 2; k++)
            if (j->todo[k]) grad_unit(j->kind, k, len, dy, a, sa, b, sb, j->d[k] + off[k]);
    }
}

// The gradient of broadcast operand k, summed over every unit in row-major order into s
// (its numel doubles, zeroed).
static void sum_units(const binary_job *j, int k, double *s) {
    size_t off[2], len;
    const size_t sa = j->g.stride[0][3], sb = j->g.stride[1][3];
    for (size_t u = 0; u < j->g.units; u++) {
        size_t o = agi_bcast_unit(&j->g, u, off, &len);
        sum_unit(j->kind, k, len, j->dy + o, j->a + off[0], sa, j->b + off[1], sb,
                 s + off[k], j->g.stride[k][3]);
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
    j.d[0] = n->in[0]->grad;
    j.d[1] = n->in[1]->grad;
    j.todo[0] = j.todo[1] = false;
    return j;
}

// Outputs up to this many elements whose operands both have all of them (neither is
// broadcast: one that is has fewer) are one flat loop on the calling thread, without the
// geometry, whose setup took longer than the adds of a decode step's rows (README,
// "Decoding speed"). The elements are the same either way.
enum { FLAT_ELEMENTS = 4096 };

static void binary_forward(ag_node *n) {
    const size_t len = n->out->numel;
    if (len <= FLAT_ELEMENTS && n->in[0]->numel == len && n->in[1]->numel == len) {
        forward_unit(((const binary_params *)n->params)->kind, len, n->in[0]->data, true,
                     n->in[1]->data, true, n->out->data);
        return;
    }
    binary_job j = make_job(n);
    agi_parallel_for(j.g.units, (double)n->out->numel, forward_units, &j);
}

static void binary_backward(ag_node *n) {
    binary_job j = make_job(n);
    // Operands that were not broadcast receive their gradients split across threads, in
    // one pass; one that was sums over units on one thread, in row-major order, so that
    // its sum does not depend on the thread count.
    j.todo[0] = j.d[0] && j.g.full[0];
    j.todo[1] = j.d[1] && j.g.full[1];
    if (j.todo[0] || j.todo[1])
        agi_parallel_for(j.g.units, 2.0 * (double)n->out->numel, backward_units, &j);
    for (int k = 0; k < 2; k++) {
        if (!j.d[k] || j.g.full[k]) continue;
        const size_t numel = n->in[k]->numel;
        double *s = agi_grad_sums(n->tape, numel);
        sum_units(&j, k, s);
        R(agi_grad_sums_add)(j.d[k], s, numel);
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
static ag_tensor *binary(ag_tape *tp, const char *name, binary_kind kind, const ag_op *f32,
                         const ag_op *f64, ag_tensor *a, ag_tensor *b) {
    if (!agi_check_float(name, "a", a) || !agi_check_float(name, "b", b) ||
        !agi_check_same_dtype(name, a, b))
        return NULL;
    ag_tensor *in[] = {a, b};
    int ndim, shape[AG_MAX_DIMS];
    if (!agi_broadcast_shape(name, 2, in, &ndim, shape)) return NULL;
    binary_params p = {kind};
    return ag_op_apply(tp, agi_pick(a, f32, f64), 2, in, ndim, shape, &p, sizeof p);
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
