// The Adam and AdamW updates, element by element as torch.optim.Adam and
// AdamW 1.13 compute them (_single_tensor_adam(w)), with g the gradient, p
// the parameter and t the step count after this step:
//   AdamW: p = p * (1 - lr * weight_decay)             (decoupled decay)
//   Adam:  g = g + weight_decay * p                    (only if weight_decay != 0)
//   m = beta1 * m + (1 - beta1) * g                    exp_avg.mul_(b1).add_(g, alpha=1-b1)
//   v = beta2 * v + (1 - beta2) * g * g                exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p = p + (-step_size * m) / denom,  step_size = lr / (1 - beta1^t)   (addcdiv_)
// The products group as in PyTorch's CPU kernels: addcmul computes
// v + (value * g) * g and addcdiv p + (value * m) / denom. Scalars are rounded
// to `real` first, as PyTorch rounds a Python float to the tensor's dtype.
#include "../core/real.h"
#include "update.h"

// The branches test loop invariants; the compiler unswitches them.
void R(agi_adam_update)(const agi_update_args *a, size_t begin, size_t end) {
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    real *restrict m = (real *)a->state[0] + begin;
    real *restrict v = (real *)a->state[1] + begin;
    const real beta1 = (real)a->beta1, beta2 = (real)a->beta2;
    const real one_minus_beta1 = (real)(1.0 - a->beta1), one_minus_beta2 = (real)(1.0 - a->beta2);
    const real weight_decay = (real)a->weight_decay, shrink = (real)(1.0 - a->lr * a->weight_decay);
    const real neg_step_size = (real)-a->step_size, eps = (real)a->eps;
    const real bias_correction2_sqrt = (real)a->bias_correction2_sqrt;
    const bool decoupled = a->decoupled, coupled = !a->decoupled && a->weight_decay != 0;
    const size_t n = end - begin;
    for (size_t k = 0; k < n; k++) {
        real gk = g[k];
        if (decoupled) p[k] = p[k] * shrink;
        if (coupled) gk = gk + weight_decay * p[k];
        m[k] = beta1 * m[k] + one_minus_beta1 * gk;
        v[k] = beta2 * v[k] + one_minus_beta2 * gk * gk;
        real denom = r_sqrt(v[k]) / bias_correction2_sqrt + eps;
        p[k] = p[k] + neg_step_size * m[k] / denom;
    }
}
