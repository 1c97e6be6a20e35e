// Elementwise functions of one tensor.
//   x: any -> y: same shape
//   neg      y = -x                     dx = -dy
//   exp      y = e^x                    dx = dy * y
//   log      y = ln x                   dx = dy / x
//   sqrt     y = x^(1/2)                dx = dy / (2 y)
//   pow      y = x^p (p a scalar)       dx = dy * p * x^(p-1)   (0 when p = 0, as PyTorch)
//            (x^0.5 is sqrt x and x^-0.5 is 1 / sqrt x, as PyTorch computes them)
//   abs      y = |x|                    dx = dy * sign(x)       (sign(0) = 0)
//   clamp    y = min(max(x, lo), hi)    dx = dy where lo <= x <= hi, else 0
//            (lo > hi gives hi everywhere and zero gradient, as PyTorch)
//   sigmoid  y = 1 / (1 + e^-x)         dx = dy * y (1 - y)
//   tanh     y = tanh x                 dx = dy * (1 - y^2)
//   silu     y = x sigmoid(x) = x s     dx = dy * s (1 + x (1 - s))
// A NaN input gives a NaN output (clamp included, as in PyTorch). Elements are split
// across threads in chunks; each element's arithmetic does not depend on the split.
// In float32, exp, sigmoid, tanh and SiLU run on the library's vectorisable exp
// (src/kernels/vecmath.h), within about 2e-7 relative of libm over the whole float range,
// with exact ends: sigmoid(-inf) = 0, sigmoid(inf) = 1, tanh(+-inf) = +-1. float64 keeps libm.
#include <string.h>

#include "../kernels/vecmath.h"
#include "op.h"

typedef enum { NEG, EXP, LOG, SQRT, POW, ABS, CLAMP, SIGMOID, TANH, SILU } unary_kind;

typedef struct {
    unary_kind kind;
    double p, lo, hi;  // pow's exponent; clamp's bounds
} unary_params;

typedef struct {
    const unary_params *p;
    const real *x, *y, *dy;
    real *out;  // y in forward, dx in backward
    size_t numel;
} unary_job;

#define CHUNK 4096

static inline real fast_exp(real x) {
#ifdef AG_REAL_F64
    return r_exp(x);
#else
    return agi_expf_full(x);
#endif
}

AGI_HOT static void R(exp_block)(const real *x, real *y, size_t lo, size_t hi) {
    for (size_t k = lo; k < hi; k++) y[k] = fast_exp(x[k]);
}

// PyTorch computes x^0.5 as sqrt(x) and x^-0.5 as 1/sqrt(x), which C's pow does not
// match at -inf (NaN there, +inf and 0 from pow) or at -0 (-0 and -inf, +0 and +inf).
// Those two exponents, in forward and in backward's x^(p-1), take the same route.
static inline real r_pow(real x, real p) {
    if (p == (real)0.5) return r_sqrt(x);
    if (p == (real)-0.5) return 1 / r_sqrt(x);
    return _Generic(x, float: powf, default: pow)(x, p);
}

#ifdef AG_REAL_F64
static inline real sigmoid(real x) { return 1 / (1 + r_exp(-x)); }
static inline real fast_tanh(real x) { return r_tanh(x); }
#else
// 1 / (1 + e^-x) from e = e^-|x| <= 1, so nothing overflows: 1 / (1 + e) for x >= 0,
// e / (1 + e) below.
AGI_INLINE float sigmoid(float x) {
    float e = agi_expf_full(-fabsf(x));
    return (x >= 0 ? 1.0f : e) / (1.0f + e);
}

// tanh |x| = (1 - e) / (1 + e), e = e^-2|x|, with the sign of x. Below |x| = 0.3, 1 - e
// would lose the low bits of a small result, so the Taylor series takes over there:
// x (1 - x^2/3 + 2x^4/15 - 17x^6/315 + 62x^8/2835), truncation below 6e-8 relative.
AGI_INLINE float fast_tanh(float x) {
    float a = fabsf(x), z = x * x;
    float series = x * (1.0f + z * (-3.33333343e-1f + z * (1.33333340e-1f +
                   z * (-5.39682545e-2f + z * 2.18694880e-2f))));
    float e = agi_expf_full(-2.0f * a);
    float t = copysignf((1.0f - e) / (1.0f + e), x);
    return a < 0.3f ? series : t;
}
#endif

AGI_HOT static void R(sigmoid_block)(const real *x, real *y, size_t lo, size_t hi) {
    for (size_t k = lo; k < hi; k++) y[k] = sigmoid(x[k]);
}

AGI_HOT static void R(tanh_block)(const real *x, real *y, size_t lo, size_t hi) {
    for (size_t k = lo; k < hi; k++) y[k] = fast_tanh(x[k]);
}

AGI_HOT static void R(silu_block)(const real *x, real *y, size_t lo, size_t hi) {
    for (size_t k = lo; k < hi; k++) y[k] = x[k] * sigmoid(x[k]);
}

AGI_HOT static void R(silu_backward_block)(const real *x, const real *dy, real *dx, size_t lo,
                                           size_t hi) {
    for (size_t k = lo; k < hi; k++) {
        real s = sigmoid(x[k]);
        dx[k] += dy[k] * s * (1 + x[k] * (1 - s));
    }
}

static void forward_chunks(size_t begin, size_t end, void *ctx) {
    const unary_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK;
    if (hi > j->numel) hi = j->numel;
    const real *x = j->x;
    real *y = j->out;
    const real p = (real)j->p->p, cl = (real)j->p->lo, ch = (real)j->p->hi;
    switch (j->p->kind) {
    case NEG: for (size_t k = lo; k < hi; k++) y[k] = -x[k]; break;
    case EXP: R(exp_block)(x, y, lo, hi); break;
    case LOG: for (size_t k = lo; k < hi; k++) y[k] = r_log(x[k]); break;
    case SQRT: for (size_t k = lo; k < hi; k++) y[k] = r_sqrt(x[k]); break;
    case POW: for (size_t k = lo; k < hi; k++) y[k] = r_pow(x[k], p); break;
    case ABS: for (size_t k = lo; k < hi; k++) y[k] = r_fabs(x[k]); break;
    case CLAMP:
        for (size_t k = lo; k < hi; k++) {
            real above = x[k] < cl ? cl : x[k];  // max(x, lo), keeping a NaN
            y[k] = above > ch ? ch : above;
        }
        break;
    case SIGMOID: R(sigmoid_block)(x, y, lo, hi); break;
    case TANH: R(tanh_block)(x, y, lo, hi); break;
    case SILU: R(silu_block)(x, y, lo, hi); break;
    }
}

static void backward_chunks(size_t begin, size_t end, void *ctx) {
    const unary_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK;
    if (hi > j->numel) hi = j->numel;
    const real *x = j->x, *y = j->y, *dy = j->dy;
    real *dx = j->out;
    const real p = (real)j->p->p, cl = (real)j->p->lo, ch = (real)j->p->hi;
    switch (j->p->kind) {
    case NEG: for (size_t k = lo; k < hi; k++) dx[k] -= dy[k]; break;
    case EXP: for (size_t k = lo; k < hi; k++) dx[k] += dy[k] * y[k]; break;
    case LOG: for (size_t k = lo; k < hi; k++) dx[k] += dy[k] / x[k]; break;
    case SQRT: for (size_t k = lo; k < hi; k++) dx[k] += dy[k] / (2 * y[k]); break;
    case POW:
        if (p != 0)
            // PyTorch's grouping, dy * (p x^(p-1)): (dy * p) first can overflow in f32
            // where the true gradient is finite.
            for (size_t k = lo; k < hi; k++) dx[k] += dy[k] * (p * r_pow(x[k], p - 1));
        break;
    case ABS:
        for (size_t k = lo; k < hi; k++)
            dx[k] += x[k] > 0 ? dy[k] : x[k] < 0 ? -dy[k] : (real)0 * dy[k];
        break;
    case CLAMP:
        for (size_t k = lo; k < hi; k++)
            if (x[k] >= cl && x[k] <= ch) dx[k] += dy[k];
        break;
    case SIGMOID: for (size_t k = lo; k < hi; k++) dx[k] += dy[k] * y[k] * (1 - y[k]); break;
    case TANH: for (size_t k = lo; k < hi; k++) dx[k] += dy[k] * (1 - y[k] * y[k]); break;
    case SILU: R(silu_backward_block)(x, dy, dx, lo, hi); break;
    }
}

static size_t chunks(size_t numel) { return (numel + CHUNK - 1) / CHUNK; }

// Transcendental functions cost some tens of flops an element; the rest about one.
static double work(const unary_params *p, size_t numel) {
    bool cheap = p->kind == NEG || p->kind == ABS || p->kind == CLAMP;
    return (cheap ? 1.0 : 20.0) * (double)numel;
}

static void unary_forward(ag_node *n) {
    unary_job j = {n->params, n->in[0]->data, NULL, NULL, n->out->data, n->out->numel};
    agi_parallel_for(chunks(j.numel), work(j.p, j.numel), forward_chunks, &j);
}

static void unary_backward(ag_node *n) {
    unary_job j = {n->params, n->in[0]->data, n->out->data, n->out->grad, n->in[0]->grad,
                   n->out->numel};
    agi_parallel_for(chunks(j.numel), work(j.p, j.numel), backward_chunks, &j);
}

const ag_op R(agi_neg_op) = {"neg", unary_forward, unary_backward,
    "dx = -dy"};
const ag_op R(agi_exp_op) = {"exp", unary_forward, unary_backward,
    "dx = dy * y"};
const ag_op R(agi_log_op) = {"log", unary_forward, unary_backward,
    "dx = dy / x"};
const ag_op R(agi_sqrt_op) = {"sqrt", unary_forward, unary_backward,
    "dx = dy / (2 y)"};
const ag_op R(agi_pow_op) = {"pow", unary_forward, unary_backward,
    "dx = dy * p * x^(p-1)"};
const ag_op R(agi_abs_op) = {"abs", unary_forward, unary_backward,
    "dx = dy * sign(x)"};
const ag_op R(agi_clamp_op) = {"clamp", unary_forward, unary_backward,
    "dx = dy where lo <= x <= hi, else 0"};
const ag_op R(agi_sigmoid_op) = {"sigmoid", unary_forward, unary_backward,
    "dx = dy * y * (1 - y)"};
const ag_op R(agi_tanh_op) = {"tanh", unary_forward, unary_backward,
    "dx = dy * (1 - y^2)"};
const ag_op R(agi_silu_op) = {"silu", unary_forward, unary_backward,
    "dx = dy * s * (1 + x * (1 - s)), s = sigmoid(x)"};

#if AG_ONCE
static ag_tensor *unary(ag_tape *tp, const char *name, const ag_op *f32, const ag_op *f64,
                        ag_tensor *x, unary_params p) {
    if (!agi_check_float(name, "x", x)) return NULL;
    return ag_op_apply(tp, agi_pick(x, f32, f64), 1, &x, x->ndim, x->shape, &p, sizeof p);
}

#define UNARY_FN(name, KIND)                                                            \
    ag_tensor *ag_##name(ag_tape *tp, ag_tensor *x) {                                   \
        return unary(tp, #name, &agi_##name##_op_f32, &agi_##name##_op_f64, x,          \
                     (unary_params){KIND, 0, 0, 0});                                    \
    }
UNARY_FN(neg, NEG)
UNARY_FN(exp, EXP)
UNARY_FN(log, LOG)
UNARY_FN(sqrt, SQRT)
UNARY_FN(abs, ABS)
UNARY_FN(sigmoid, SIGMOID)
UNARY_FN(tanh, TANH)
UNARY_FN(silu, SILU)

ag_tensor *ag_pow(ag_tape *tp, ag_tensor *x, double p) {
    if (!isfinite(p)) {
        ag_error("pow: exponent must be finite, got %g; x %s", p, agi_shape(x));
        return NULL;
    }
    return unary(tp, "pow", &agi_pow_op_f32, &agi_pow_op_f64, x, (unary_params){POW, p, 0, 0});
}

ag_tensor *ag_clamp(ag_tape *tp, ag_tensor *x, double lo, double hi) {
    if (isnan(lo) || isnan(hi)) {
        ag_error("clamp: a bound is NaN: [%g, %g]; x %s", lo, hi, agi_shape(x));
        return NULL;
    }
    return unary(tp, "clamp", &agi_clamp_op_f32, &agi_clamp_op_f64, x,
                 (unary_params){CLAMP, 0, lo, hi});
}
#endif
