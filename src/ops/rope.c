// Rotary position embedding (RoPE), the rotate_half convention of HuggingFace LLaMA and
// GPT-NeoX: the pairs of a row are (c, c + d/2), c < d/2, not neighbours.
//   x: [B, h, T, d] or [B, T, h*d] -> y: same.  Row of position t = pos_offset + (its
//   query index), angle a_c = t base^(-2c/d):
//     y_c = x_c cos a_c - x_{c+d/2} sin a_c,  y_{c+d/2} = x_{c+d/2} cos a_c + x_c sin a_c.
// Gradient: each pair is rotated by a_c, an orthogonal map, so backward rotates dy by -a_c:
//     dx_c = dy_c cos a_c + dy_{c+d/2} sin a_c,  dx_{c+d/2} = dy_{c+d/2} cos a_c - dy_c sin a_c.
// cos and sin depend on (t, c) only: one [T, d/2] table each per call, in tape memory.
#include <string.h>

#include "op.h"

typedef struct {
    double base;
    int pos_offset;
    int T, d;
    int rows_per_t;  // consecutive d-wide rows sharing a position: 1, or h heads inside
} rope_params;

typedef struct {
    const rope_params *p;
    const real *cs;  // [T, d/2] cos, then [T, d/2] sin
    const real *src;
    real *dst;
    real sign;  // +1 forward, -1 backward (the inverse rotation)
} rope_job;

real *R(agi_rope_table)(ag_tape *tp, double base, long long offset, int T, int d) {
    const int half = d / 2;
    real *cs = ag_tape_alloc(tp, 2 * (size_t)T * half * sizeof *cs);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < half; c++) {
            // offset + t in double: positions past INT_MAX (an offset near it) must not wrap.
            const double a = ((double)offset + t) * pow(base, -2.0 * c / d);
            cs[(size_t)t * half + c] = (real)cos(a);
            cs[((size_t)T + (size_t)t) * half + c] = (real)sin(a);  // T + t: past INT_MAX
        }
    return cs;
}

void R(agi_rope_rows)(const real *cs, int T, int t0, int d, const real *src, int lds,
                      real *dst, int ldd, int rows, real sign, bool add) {
    const int half = d / 2;
    for (int r = 0; r < rows; r++) {
        // Row T + t0 + r of the table in size_t: past INT_MAX for a table of over 2^30 rows.
        const real *co = cs + (size_t)(t0 + r) * half,
                   *si = cs + ((size_t)T + (size_t)(t0 + r)) * half;
        const real *x = src + (size_t)r * lds;
        real *y = dst + (size_t)r * ldd;
        for (int c = 0; c < half; c++) {
            const real s = sign * si[c];
            const real a = x[c] * co[c] - x[c + half] * s, b = x[c + half] * co[c] + x[c] * s;
            if (add) {
                y[c] += a;
                y[c + half] += b;
            } else {
                y[c] = a;
                y[c + half] = b;
            }
        }
    }
}

// dst += (forward: =) the rotation of src, rows [begin, end).
static void rotate_rows(size_t begin, size_t end, void *ctx) {
    const rope_job *J = ctx;
    const int d = J->p->d, T = J->p->T;
    for (size_t r = begin; r < end; r++)
        R(agi_rope_rows)(J->cs, T, (int)(r / (size_t)J->p->rows_per_t % (size_t)T), d,
                         J->src + r * d, d, J->dst + r * d, d, 1, J->sign, J->sign < 0);
}

static void rope_run(ag_node *n, const real *src, real *dst, real sign) {
    const rope_params *p = n->params;
    rope_job J = {p, R(agi_rope_table)(n->tape, p->base, p->pos_offset, p->T, p->d), src, dst,
                  sign};
    const size_t rows = n->out->numel / (size_t)p->d;
    agi_parallel_for(rows, 6.0 * (double)n->out->numel, rotate_rows, &J);
}

static void rope_forward(ag_node *n) { rope_run(n, n->in[0]->data, n->out->data, 1); }

static void rope_backward(ag_node *n) {
    if (n->in[0]->grad) rope_run(n, n->out->grad, n->in[0]->grad, -1);
}

const ag_op R(agi_rope_op) = {"rope", rope_forward, rope_backward,
    "dx = dy rotated back by the angle: (dx_c, dx_{c+d/2}) = R(-a_c) (dy_c, dy_{c+d/2})"};

#if AG_ONCE
ag_tensor *ag_rope(ag_tape *tp, ag_tensor *x, const ag_rope_opts *opts) {
    static const ag_rope_opts plain;
    const ag_rope_opts *o = opts ? opts : &plain;
    if (!agi_check_float("rope", "x", x)) return NULL;
    rope_params p;
    memset(&p, 0, sizeof p);
    p.base = o->base == 0 ? 10000.0 : o->base;
    p.pos_offset = o->pos_offset;
    const int h = o->heads;
    if (h == 0 && x->ndim == 4) {
        p.T = x->shape[2], p.d = x->shape[3], p.rows_per_t = 1;
    } else if (h > 0 && x->ndim == 3 && x->shape[2] % h == 0) {
        p.T = x->shape[1], p.d = x->shape[2] / h, p.rows_per_t = h;
    } else {
        ag_error("rope: x %s must be [B, h, T, d] with opts heads = 0, or [B, T, h*d] with "
                 "opts heads = h, got heads = %d",
                 agi_shape(x), h);
        return NULL;
    }
    if (p.d % 2 != 0) {
        ag_error("rope: head width d = %d of x %s must be even (pairs (c, c + d/2))", p.d,
                 agi_shape(x));
        return NULL;
    }
    if (!(p.base > 0 && isfinite(p.base)) || o->pos_offset < 0) {
        ag_error("rope: base must be > 0 and pos_offset >= 0, got %g and %d; x %s", o->base,
                 o->pos_offset, agi_shape(x));
        return NULL;
    }
    return ag_op_apply(tp, agi_pick(x, &agi_rope_op_f32, &agi_rope_op_f64), 1, &x, x->ndim,
                    x->shape, &p, sizeof p);
}
#endif
