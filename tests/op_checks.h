// Helpers shared by the tests of the ops (and of the tape, gradcheck and the
// PyTorch comparisons): random inputs, comparing tensors normwise or element by
// element, running a function in float32 against float64, and proving that a
// repeated step allocates no heap memory. Built on the public API only.
#ifndef ATTOGRAD_OP_CHECKS_H
#define ATTOGRAD_OP_CHECKS_H

#include "testing.h"

// ---- Random inputs ----------------------------------------------------------------------
// Every draw comes from pcg32 seeded (seed, 17): a test names its inputs by seed.

typedef struct {
    int ndim;
    int shape[AG_MAX_DIMS];
} test_shape;

// Uniform in [lo, hi).
static inline ag_tensor *uniform_tensor(ag_dtype dt, int ndim, const int shape[],
                                        uint64_t seed, double lo, double hi) {
    ag_pcg32 rng = ag_pcg32_make(seed, 17);
    return ag_tensor_uniform(dt, ndim, shape, &rng, lo, hi);
}

// Normal with the given mean and standard deviation.
static inline ag_tensor *normal_tensor(ag_dtype dt, int ndim, const int shape[], uint64_t seed,
                                       double mean, double std) {
    ag_pcg32 rng = ag_pcg32_make(seed, 17);
    return ag_tensor_normal(dt, ndim, shape, &rng, mean, std);
}

// uniform_tensor for a shape from a list of test_shape.
static inline ag_tensor *random_tensor(ag_dtype dt, test_shape s, uint64_t seed, double lo,
                                       double hi) {
    return uniform_tensor(dt, s.ndim, s.shape, seed, lo, hi);
}

// t, now requiring grad: a leaf whose gradient backward fills.
static inline ag_tensor *requiring_grad(ag_tensor *t) {
    ag_tensor_set_requires_grad(t, true);
    return t;
}

// The usual input of a gradient check: uniform in [-1, 1), requiring grad.
// A bool mask with each entry true (masked) with probability `density`.
static inline ag_tensor *bool_mask(int ndim, const int *shape, double density, uint64_t seed) {
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, ndim, shape);
    ag_pcg32 g = ag_pcg32_make(seed, 12);
    uint8_t *d = m->data;
    for (size_t k = 0; k < m->numel; k++) d[k] = ag_pcg32_double(&g) < density;
    return m;
}

static inline ag_tensor *random_leaf(ag_dtype dt, int ndim, const int shape[], uint64_t seed) {
    return requiring_grad(uniform_tensor(dt, ndim, shape, seed, -1.0, 1.0));
}

// A MultiheadAttention named "attn" whose parameters are all drawn uniform in
// [-0.6, 0.6) from pcg32 (seed, 9), away from its init (biases and position tables start
// at 0); false, the store left empty, when ag_mha_init refuses cfg.
static inline bool mha_random(ag_mha *m, ag_params *ps, const ag_mha_config *cfg,
                              uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 9);
    if (!ag_mha_init(m, ps, "attn", cfg, &rng)) return false;
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.6, 0.6);
    return true;
}

// A float64 gradcheck of ag_mha_forward on a module mha_random makes of cfg (then with
// heads[0 .. n_pruned) pruned): of the query (and, in cross-attention, key [B, S, kdim]
// and value [B, S, vdim]) and every parameter, through the fused path or, with `weights`,
// the composed one. B = 2, T = 4, S = 4 (self) or 5.
typedef struct {
    ag_mha m;
    ag_mha_opts opts;
    bool weights, self;
} mha_gradcheck_case;

static inline ag_tensor *mha_gradcheck_fn(ag_tape *tp, ag_tensor *const in[], int n,
                                          void *user) {
    (void)n;
    mha_gradcheck_case *c = user;
    ag_tensor *w = NULL;
    ag_tensor *k = c->self ? in[0] : in[1], *v = c->self ? in[0] : in[2];
    return ag_mha_forward(tp, &c->m, in[0], k, v, &c->opts, c->weights ? &w : NULL);
}

static inline bool mha_gradcheck(const ag_mha_config *cfg, ag_mha_opts opts, bool self,
                                 bool weights, const int *heads, int n_pruned, uint64_t seed) {
    ag_params *ps = ag_params_new(AG_F64);
    mha_gradcheck_case c = {.opts = opts, .weights = weights, .self = self};
    bool ok = mha_random(&c.m, ps, cfg, seed);
    if (ok && n_pruned) ok = ag_mha_prune_heads(&c.m, ps, heads, n_pruned);
    if (!ok || ag_params_count(ps) > 20) {
        ag_params_free(ps);
        return false;
    }
    const int E = cfg->embed_dim, S = self ? 4 : 5;
    ag_tensor *in[23];
    int n = 0;
    in[n++] = random_leaf(AG_F64, 3, (int[]){2, 4, E}, seed + 1);
    if (!self) {
        in[n++] = random_leaf(AG_F64, 3, (int[]){2, S, cfg->kdim ? cfg->kdim : E}, seed + 2);
        in[n++] = random_leaf(AG_F64, 3, (int[]){2, S, cfg->vdim ? cfg->vdim : E}, seed + 3);
    }
    const int n_inputs = n;
    for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
    ag_gradcheck_result r;
    ok = ag_gradcheck(mha_gradcheck_fn, in, n, &c, NULL, &r);
    if (!ok) fprintf(stderr, "  mha gradcheck (%s path): %s\n", weights ? "weights" : "fused",
                     r.report);
    for (int i = 0; i < n_inputs; i++) ag_tensor_free(in[i]);
    ag_params_free(ps);
    return ok;
}

// ---- Comparing tensors ------------------------------------------------------------------

// Element i of t's values or, with `grad`, of its gradient (0 when it has none).
static inline double element(const ag_tensor *t, bool grad, size_t i) {
    return grad ? ag_tensor_grad_item(t, i) : ag_tensor_item(t, i);
}

// The error of values x_i against reference values y_i in the infinity norm,
//     max_i |x_i - y_i| / max_i |y_i|   (max_i |x_i - y_i| when every y_i is 0).
// Elements that come from cancellation cannot be relatively accurate one by one
// in float32; the norm can. A NaN on either side, or an infinity the other side
// does not match, makes the error infinite; equal infinities count as equal.
typedef struct {
    double diff, scale;
} normwise;

static inline void normwise_add(normwise *e, double x, double y) {
    if (isinf(x) || isinf(y)) {
        if (x != y) e->diff = INFINITY;
        return;
    }
    double d = fabs(x - y);
    e->diff = isnan(d) ? INFINITY : fmax(e->diff, d);
    e->scale = fmax(e->scale, fabs(y));
}

static inline double normwise_result(normwise e) {
    return e.scale > 0 ? e.diff / e.scale : e.diff;
}

// The normwise error of a against b (equal numel): of their values, or with
// `grad` of their gradients.
static inline double normwise_error(const ag_tensor *a, const ag_tensor *b, bool grad) {
    normwise e = {0, 0};
    for (size_t i = 0; i < b->numel; i++)
        normwise_add(&e, element(a, grad, i), element(b, grad, i));
    return normwise_result(e);
}

// The normwise error of a's values (or, with `grad`, its gradient) against the
// values of a reference tensor of equal numel.
static inline double normwise_error_to(const ag_tensor *a, bool grad, const ag_tensor *ref) {
    normwise e = {0, 0};
    for (size_t i = 0; i < ref->numel; i++)
        normwise_add(&e, element(a, grad, i), ag_tensor_item(ref, i));
    return normwise_result(e);
}

// The normwise error of n floats a[i] against b[i] (results copied out of tapes).
static inline double normwise_error_f32(const float *a, const float *b, size_t n) {
    normwise e = {0, 0};
    for (size_t i = 0; i < n; i++) normwise_add(&e, a[i], b[i]);
    return normwise_result(e);
}

// Whether every element of a is within atol + rtol |b_i| of b's (values, or
// gradients with `grad`), as torch.allclose; NaN is never close.
static inline bool all_close(const ag_tensor *a, const ag_tensor *b, bool grad, double rtol,
                             double atol) {
    bool ok = true;
    for (size_t i = 0; i < b->numel; i++) {
        double x = element(a, grad, i), y = element(b, grad, i);
        ok = ok && fabs(x - y) <= rtol * fabs(y) + atol;
    }
    return ok;
}

// ---- float32 against float64 ------------------------------------------------------------

// One function run in float32 and in float64 on the same values: the f64 inputs
// are the f32 ones widened, so both see identical numbers, and both runs
// backpropagate the same random upstream gradient.
typedef struct {
    int n;
    ag_tensor *in32[AG_MAX_INPUTS], *in64[AG_MAX_INPUTS];  // gradients filled by backward
    ag_tensor *y32, *y64;                                  // outputs (NULL if fn failed)
    ag_tape *t32, *t64;
    ag_tensor *v32, *v64;                                  // upstream gradients
} f32_f64_runs;

// `inputs` (any float dtype) give the values; each copy requires grad when its
// input does.
static inline f32_f64_runs run_f32_and_f64(ag_fn fn, ag_tensor *const inputs[], int n,
                                           void *user) {
    f32_f64_runs r = {0};
    r.n = n;
    for (int i = 0; i < n; i++) {
        r.in32[i] = ag_tensor_convert(inputs[i], AG_F32);
        r.in64[i] = ag_tensor_convert(r.in32[i], AG_F64);
        ag_tensor_set_requires_grad(r.in32[i], inputs[i]->requires_grad);
        ag_tensor_set_requires_grad(r.in64[i], inputs[i]->requires_grad);
    }
    r.t32 = ag_tape_new();
    r.t64 = ag_tape_new();
    r.y32 = fn(r.t32, r.in32, n, user);
    r.y64 = fn(r.t64, r.in64, n, user);
    if (!r.y32 || !r.y64 || r.y32->dtype != AG_F32 || r.y64->dtype != AG_F64) {
        fprintf(stderr, "  the f32 and f64 runs did not give an f32 and an f64 output\n");
        r.y32 = r.y64 = NULL;
        return r;
    }
    ag_pcg32 rng = ag_pcg32_make(5, 5);
    r.v64 = ag_tensor_uniform(AG_F64, r.y64->ndim, r.y64->shape, &rng, -1, 1);
    r.v32 = ag_tensor_convert(r.v64, AG_F32);
    ag_backward_with(r.t32, r.y32, r.v32);
    ag_backward_with(r.t64, r.y64, r.v64);
    return r;
}

static inline void free_f32_f64_runs(f32_f64_runs *r) {
    ag_tensor_free(r->v32);
    ag_tensor_free(r->v64);
    ag_tape_free(r->t32);
    ag_tape_free(r->t64);
    for (int i = 0; i < r->n; i++) {
        ag_tensor_free(r->in32[i]);
        ag_tensor_free(r->in64[i]);
    }
}

// The largest normwise error of the f32 output and of the f32 input gradients
// against f64 (infinite when the runs failed).
static inline double f32_vs_f64_error(ag_fn fn, ag_tensor *const inputs[], int n,
                                      void *user) {
    f32_f64_runs r = run_f32_and_f64(fn, inputs, n, user);
    double worst = INFINITY;
    if (r.y32) {
        worst = normwise_error(r.y32, r.y64, false);
        if (worst > 1e-5) fprintf(stderr, "  f32 output differs from f64 by %.3g\n", worst);
        for (int i = 0; i < n; i++) {
            if (!inputs[i]->requires_grad) continue;
            double e = normwise_error(r.in32[i], r.in64[i], true);
            if (e > 1e-5) fprintf(stderr, "  f32 gradient of input %d differs by %.3g\n", i, e);
            worst = fmax(worst, e);
        }
    }
    free_f32_f64_runs(&r);
    return worst;
}

// Whether the f32 output and every f32 input gradient are all_close to f64's.
static inline bool f32_close_to_f64(ag_fn fn, ag_tensor *const inputs[], int n, void *user,
                                    double rtol, double atol) {
    f32_f64_runs r = run_f32_and_f64(fn, inputs, n, user);
    bool ok = r.y32 != NULL;
    if (ok && !all_close(r.y32, r.y64, false, rtol, atol)) {
        fprintf(stderr, "  f32 output is not close to f64\n");
        ok = false;
    }
    for (int i = 0; ok && i < n; i++) {
        if (inputs[i]->requires_grad && !all_close(r.in32[i], r.in64[i], true, rtol, atol)) {
            fprintf(stderr, "  f32 gradient of input %d is not close to f64\n", i);
            ok = false;
        }
    }
    free_f32_f64_runs(&r);
    return ok;
}

// ---- No heap allocation in a repeated step ----------------------------------------------

// One training step on tp (forward and backward); `step` counts 0, 1, 2.
typedef void (*step_fn)(ag_tape *tp, int step, void *user);

// Runs three steps (a tape reset, then `step`) on one tape with 1 and then 2
// threads, and returns whether the second and third steps allocated no heap
// memory on both: only the first may, as it sizes the tape (and starts the
// thread pool). Leaves one thread set.
static inline bool repeated_step_allocates_nothing(step_fn step, void *user) {
    ag_tape *tp = ag_tape_new();
    bool ok = true;
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        uint64_t before = 0;
        for (int s = 0; s < 3; s++) {
            if (s == 1) before = ag_memory_usage().allocations;
            ag_tape_reset(tp);
            step(tp, s, user);
        }
        uint64_t allocated = ag_memory_usage().allocations - before;
        if (allocated) {
            fprintf(stderr, "  %d thread(s): %llu heap allocations in two repeated steps\n",
                    threads, (unsigned long long)allocated);
            ok = false;
        }
    }
    ag_threads_set(1);
    ag_tape_free(tp);
    return ok;
}

#endif
