// The Lion update (Chen et al. 2023, "Symbolic Discovery of Optimization
// Algorithms", Program 1), element by element in the order of lion-pytorch's
// update_fn, with g the gradient, p the parameter and m the moment (exp_avg):
//   p = p * (1 - lr * weight_decay)                    (decoupled decay)
//   c = beta1 * m + (1 - beta1) * g
//   p = p + (-lr) * sign(c)                            sign(0) = 0, sign(NaN) = NaN
//   m = beta2 * m + (1 - beta2) * g
// The step moves every element by exactly lr (or not at all): the sign, not
// the size, of the interpolated moment chooses the direction. Scalars are
// rounded to `real` first, as PyTorch rounds a Python float to the tensor's
// dtype.
#include "../core/real.h"
#include "update.h"

// torch.sign: a NaN stays a NaN rather than choosing a direction.
static inline real sign_of(real c) { return c > 0 ? (real)1 : c < 0 ? (real)-1 : c; }

void R(agi_lion_update)(const agi_update_args *a, size_t begin, size_t end) {
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    real *restrict m = (real *)a->state[0] + begin;
    const real beta1 = (real)a->beta1, beta2 = (real)a->beta2;
    const real one_minus_beta1 = (real)(1.0 - a->beta1), one_minus_beta2 = (real)(1.0 - a->beta2);
    const real shrink = (real)(1.0 - a->lr * a->weight_decay), neg_lr = (real)-a->lr;
    const size_t n = end - begin;
    for (size_t k = 0; k < n; k++) {
        real c = beta1 * m[k] + one_minus_beta1 * g[k];
        p[k] = p[k] * shrink + neg_lr * sign_of(c);
        m[k] = beta2 * m[k] + one_minus_beta2 * g[k];
    }
}
