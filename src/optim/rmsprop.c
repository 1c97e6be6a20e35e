// RMSprop, element by element as torch.optim.RMSprop 1.13 computes it
// (_single_tensor_rmsprop), with g the gradient and p the parameter:
//   g = g + weight_decay * p                 (only if weight_decay != 0)
//   v = alpha * v + (1 - alpha) * g * g      square_avg.mul_(alpha).addcmul_(g, g, value=1-alpha)
//   centered:  a = alpha * a + (1 - alpha) * g          grad_avg.mul_(alpha).add_(g, alpha=1-alpha)
//              avg = sqrt(v - a * a) + eps   square_avg.addcmul(a, a, value=-1).sqrt_().add_(eps)
//   otherwise: avg = sqrt(v) + eps
//   momentum > 0: buf = momentum * buf + g / avg;  p = p + (-lr) * buf
//   otherwise:    p = p + (-lr * g) / avg              param.addcdiv_(g, avg, value=-lr)
// Every buffer starts at zero (PyTorch's state on the first step). As in adam.c the
// products group as PyTorch's CPU kernels group them (addcmul: v + (value * g) * g,
// addcdiv: p + (value * g) / avg), and scalars are rounded to `real` first.
#include "../core/real.h"
#include "optimizer.h"

// The branches test loop invariants; the compiler unswitches them.
void R(agi_rmsprop_update)(const agi_update_args *a, size_t begin, size_t end) {
    const ag_optim_config *c = a->cfg;
    const bool has_momentum = c->momentum > 0, centered = c->centered;
    const bool decay = a->weight_decay != 0;
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    // The buffers in rmsprop_buffers' order.
    real *restrict v = (real *)a->state[0] + begin;
    real *restrict buf = has_momentum ? (real *)a->state[1] + begin : NULL;
    real *restrict grad_avg = centered ? (real *)a->state[has_momentum ? 2 : 1] + begin : NULL;
    const real alpha = (real)c->alpha, one_minus_alpha = (real)(1.0 - c->alpha);
    const real weight_decay = (real)a->weight_decay, eps = (real)c->eps;
    const real momentum = (real)c->momentum, neg_lr = (real)-c->lr;
    const size_t n = end - begin;
    for (size_t k = 0; k < n; k++) {
        real gk = g[k];
        if (decay) gk = gk + weight_decay * p[k];
        v[k] = alpha * v[k] + one_minus_alpha * gk * gk;
        real avg;
        if (centered) {
            grad_avg[k] = alpha * grad_avg[k] + one_minus_alpha * gk;
            avg = r_sqrt(v[k] - grad_avg[k] * grad_avg[k]) + eps;
        } else {
            avg = r_sqrt(v[k]) + eps;
        }
        if (has_momentum) {
            buf[k] = momentum * buf[k] + gk / avg;
            p[k] = p[k] + neg_lr * buf[k];
        } else {
            p[k] = p[k] + neg_lr * gk / avg;
        }
    }
}

#if AG_ONCE
void agi_rmsprop_update_f64(const agi_update_args *a, size_t begin, size_t end);

// torch.optim.RMSprop's checks: alpha is only bounded below, as there.
static bool rmsprop_check(const ag_optim_config *c) {
    return agi_optim_check_nonnegative("eps", c->eps) &&
           agi_optim_check_nonnegative("momentum", c->momentum) &&
           agi_optim_check_nonnegative("alpha", c->alpha);
}

static int rmsprop_buffers(const ag_optim_config *c, const char *names[AGI_OPTIM_MAX_BUFFERS]) {
    int n = 0;
    names[n++] = "square_avg";
    if (c->momentum > 0) names[n++] = "momentum_buffer";
    if (c->centered) names[n++] = "grad_avg";
    return n;
}

static const agi_setting rmsprop_settings[] = {
    {"alpha", AGI_SETTING_FIELD(alpha), NULL},
    {"eps", AGI_SETTING_FIELD(eps), NULL},
    {"momentum", AGI_SETTING_FIELD(momentum), "a momentum buffer"},
    {"centered", AGI_SETTING_FIELD(centered), "a grad_avg buffer"},
    {NULL, 0, false, NULL},
};

const agi_optimizer agi_rmsprop = {
    .name = "rmsprop",
    .title = "RMSprop",
    .defaults = {.lr = 1e-2, .alpha = 0.99, .eps = 1e-8},
    .check = rmsprop_check,
    .buffers = rmsprop_buffers,
    .settings = rmsprop_settings,
    .update_f32 = agi_rmsprop_update_f32,
    .update_f64 = agi_rmsprop_update_f64,
    .flops_per_element = 16,  // the square root and the division counted as several
};
#endif
