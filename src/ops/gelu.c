// Gaussian error linear unit, in PyTorch's two forms.
//   x: any -> y: same
//
// erf (approximate='none'): y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
//   Phi' = phi, the normal density phi(x) = exp(-x^2 / 2) / sqrt(2 pi), so by the
//   product rule dy/dx = Phi(x) + x phi(x).
// tanh (approximate='tanh'): y = x (1 + t) / 2, t = tanh(u), u = k (x + a x^3),
//   k = sqrt(2 / pi), a = 0.044715. tanh' = 1 - tanh^2, so
//   dy/dx = (1 + t) / 2 + x (1 - t^2) k (1 + 3 a x^2) / 2.
// Both derivatives are exact for their form (the tanh form is not differentiated
// as if it were the erf one). Backward recomputes them from x: nothing is saved.
//
// Speed: in f32 the loops use vecmath.h's 2^-v, which vectorises (libm's erff, expf and
// tanhf are calls that do not): Phi from one Gaussian and a short polynomial (below), and
// tanh(u) from e = exp(-2|u|): 1 + t = 2 / (1 + e) for u >= 0 and 2e / (1 + e) below,
// 1 - t^2 = 4e / (1 + e)^2, so neither side cancels. f64 keeps libm: it is the reference
// precision. Large tensors are split over threads in fixed chunks (deterministic).
#include "op.h"
#include "../kernels/vecmath.h"

#define INV_SQRT2 0.70710678118654752440         // 1 / sqrt(2)
#define INV_SQRT_2PI 0.39894228040143267794      // 1 / sqrt(2 pi)
#define SQRT_2_OVER_PI 0.79788456080286535588    // k = sqrt(2 / pi)
#define TANH_CUBIC 0.044715                      // a

typedef struct {
    ag_gelu_kind kind;
} gelu_params;

#ifdef AG_REAL_F64  // libm, the reference precision
static real gelu_erf(real x) { return (real)0.5 * x * (1 + r_erf(x * (real)INV_SQRT2)); }

static real gelu_erf_grad(real x) {
    real cdf = (real)0.5 * (1 + r_erf(x * (real)INV_SQRT2));
    real pdf = (real)INV_SQRT_2PI * r_exp((real)-0.5 * x * x);
    return cdf + x * pdf;
}

static real gelu_tanh(real x) {
    real t = r_tanh((real)SQRT_2_OVER_PI * (x + (real)TANH_CUBIC * x * x * x));
    return (real)0.5 * x * (1 + t);
}

static real gelu_tanh_grad(real x) {
    real t = r_tanh((real)SQRT_2_OVER_PI * (x + (real)TANH_CUBIC * x * x * x));
    real du = (real)SQRT_2_OVER_PI * (1 + 3 * (real)TANH_CUBIC * x * x);
    return (real)0.5 * (1 + t) + (real)0.5 * x * (1 - t * t) * du;
}

#define GELU_ERF gelu_erf
#define GELU_ERF_GRAD gelu_erf_grad
#define GELU_TANH gelu_tanh
#define GELU_TANH_GRAD gelu_tanh_grad
#else
// f32: with a = |x|, the tail Q(a) = Phi(-a) = exp(-a^2 / 2) R(a), so Phi(x) = 1 - Q or Q
// (neither side cancels) and phi(x) = exp(-a^2 / 2) / sqrt(2 pi) shares the exponential.
// exp(-a^2 / 2) = 2^-(a c)^2 with c = sqrt(log2(e) / 2). R(a) = t S(t), t = 1 / (1 + P a),
// S(t) = 1/2 + (1 - t) U(t) (so Phi(0) is exactly 1/2), U of degree 7 fitted for minimax
// relative error of R (Lawson's reweighted least squares at 30 digits) on a in [0, 14],
// beyond which exp(-a^2 / 2) is no float: 9.4e-8 in exact arithmetic. The float rounding
// of (a c)^2 adds a^2 2^-24 relative, as in any float exp of -a^2 / 2.
#define TAIL_P 0.3f
#define SQRT_HALF_LOG2E 0.84932180028801904272f  // c

AGI_INLINE float tail_ratio_f(float a) {  // R(a); U by Estrin's scheme
    const float t = 1.0f / (1.0f + TAIL_P * a), t2 = t * t, t4 = t2 * t2;
    const float u01 = -0.38035783845039f + t * -0.259850781287318f;
    const float u23 = -0.157962859257436f + t * -0.0379957587699458f;
    const float u45 = -0.0693740148113081f + t * 0.101554859995455f;
    const float u67 = -0.0219323795984844f + t * -0.00389383419974258f;
    return t * (0.5f + (1.0f - t) * ((u01 + t2 * u23) + t4 * (u45 + t2 * u67)));
}
// Phi(x), and *gauss = exp(-x^2 / 2).
AGI_INLINE float phi_cdf_f(float x, float *gauss) {
    // fabsf is one and; x < 0 ? -x : x is three operations (it must keep -0), and a sign of
    // zero in a changes nothing here.
    const float a = fabsf(x), ac = a * SQRT_HALF_LOG2E;
    *gauss = agi_exp2f_neg(ac * ac);
    const float q = *gauss * tail_ratio_f(a);
    return x >= 0 ? 1.0f - q : q;  // NaN: q is NaN
}
AGI_INLINE float gelu_erf_f(float x) {
    float g;
    return x * phi_cdf_f(x, &g);
}
AGI_INLINE float gelu_erf_grad_f(float x) {
    float g, cdf = phi_cdf_f(x, &g);
    return cdf + x * ((float)INV_SQRT_2PI * g);
}
// With w = 2 |u| log2(e), e = exp(-2|u|) = 2^-w; returns 1 + tanh(u) and sets
// *one_minus_t2 = 1 - tanh(u)^2.
AGI_INLINE float one_plus_tanh_f(float u, float w, float *one_minus_t2) {
    float e = agi_exp2f_neg(w), inv = 1.0f / (1.0f + e);
    *one_minus_t2 = 4.0f * e * inv * inv;
    return u >= 0 ? 2.0f * inv : 2.0f * e * inv;
}
// u = k (x + a x^3) = x (k + k a x^2), and w = 2 |u| log2(e) with the constants folded.
#define TANH_W1 (float)(2 * 1.44269504088896340736 * SQRT_2_OVER_PI)
#define TANH_W3 (float)(2 * 1.44269504088896340736 * SQRT_2_OVER_PI * TANH_CUBIC)
AGI_INLINE float gelu_tanh_f(float x) {
    float d, u = x * (TANH_W1 + TANH_W3 * (x * x)), w = fabsf(u);
    return 0.5f * x * one_plus_tanh_f(u, w, &d);
}
AGI_INLINE float gelu_tanh_grad_f(float x) {
    float d, u = x * (TANH_W1 + TANH_W3 * (x * x)), w = fabsf(u);
    float opt = one_plus_tanh_f(u, w, &d);
    float du = (float)SQRT_2_OVER_PI * (1 + 3 * (float)TANH_CUBIC * x * x);
    return 0.5f * opt + 0.5f * x * d * du;
}
#define GELU_ERF gelu_erf_f
#define GELU_ERF_GRAD gelu_erf_grad_f
#define GELU_TANH gelu_tanh_f
#define GELU_TANH_GRAD gelu_tanh_grad_f
#endif

// Elements per unit of parallel work.
#define CHUNK 8192

typedef struct {
    size_t n;
    bool tanh_form;
    const real *x, *dy;
    real *y, *dx;
} gelu_job;

// clang gives the resolver of a multiversioned function external linkage even when
// the function is static: hence R() names, so the f32 and f64 builds do not clash.
void R(agi_gelu_forward_chunks)(size_t begin, size_t end, void *ctx);
void R(agi_gelu_backward_chunks)(size_t begin, size_t end, void *ctx);

AGI_HOT void R(agi_gelu_forward_chunks)(size_t begin, size_t end, void *ctx) {
    const gelu_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    const real *restrict x = j->x;
    real *restrict y = j->y;
    if (j->tanh_form)
        for (size_t k = lo; k < hi; k++) y[k] = GELU_TANH(x[k]);
    else
        for (size_t k = lo; k < hi; k++) y[k] = GELU_ERF(x[k]);
}

AGI_HOT void R(agi_gelu_backward_chunks)(size_t begin, size_t end, void *ctx) {
    const gelu_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    const real *restrict x = j->x, *restrict dy = j->dy;
    real *restrict dx = j->dx;
    if (j->tanh_form)
        for (size_t k = lo; k < hi; k++) dx[k] += dy[k] * GELU_TANH_GRAD(x[k]);
    else
        for (size_t k = lo; k < hi; k++) dx[k] += dy[k] * GELU_ERF_GRAD(x[k]);
}

static void gelu_forward(ag_node *n) {
    gelu_job j = {n->out->numel, ((const gelu_params *)n->params)->kind == AG_GELU_TANH,
                  n->in[0]->data, NULL, n->out->data, NULL};
    agi_parallel_for((j.n + CHUNK - 1) / CHUNK, 20.0 * (double)j.n,
                     R(agi_gelu_forward_chunks), &j);
}

static void gelu_backward(ag_node *n) {
    gelu_job j = {n->out->numel, ((const gelu_params *)n->params)->kind == AG_GELU_TANH,
                  n->in[0]->data, n->out->grad, NULL, n->in[0]->grad};
    agi_parallel_for((j.n + CHUNK - 1) / CHUNK, 30.0 * (double)j.n,
                     R(agi_gelu_backward_chunks), &j);
}

const ag_op R(agi_gelu_op) = {"gelu", gelu_forward, gelu_backward,
    "dx = dy * (Phi(x) + x phi(x))  (tanh form: its own derivative)"};

#if AG_ONCE
ag_tensor *ag_gelu(ag_tape *tp, ag_tensor *x, ag_gelu_kind kind) {
    if (!agi_check_float("gelu", "x", x)) return NULL;
    if (kind != AG_GELU_ERF && kind != AG_GELU_TANH) {
        ag_error("gelu: unknown kind %d (AG_GELU_ERF or AG_GELU_TANH) for x %s", (int)kind,
                 agi_shape(x));
        return NULL;
    }
    gelu_params p = {kind};
    return ag_op_apply(tp, agi_pick(x, &agi_gelu_op_f32, &agi_gelu_op_f64), 1, &x, x->ndim,
                    x->shape, &p, sizeof p);
}
#endif
