// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
// Program 1), element by element in the order of lion-pytorch's update_fn, with g
// the gradient, p the parameter and m the moment (exp_avg):
//   p = p * (1 - lr * weight_decay)                    (decoupled decay)
//   c = beta1 * m + (1 - beta1) * g
//   p = p + (-lr) * sign(c)                            sign(0) = 0, sign(NaN) = NaN
//   m = beta2 * m + (1 - beta2) * g
// The step moves every element by exactly lr (or not at all): the sign, not
// the size, of the interpolated moment chooses the direction. Scalars are
// rounded to `real` first, as PyTorch rounds a Python float to the tensor's
// dtype.
#include "../core/real.h"
#include "optimizer.h"

// A NaN stays a NaN rather than choosing a direction. torch.sign in PyTorch 1.13 gives 0
// for a NaN (lion-pytorch there would leave the parameter as it was): the NaN is kept, by
// the rule that a NaN never silently becomes a number.
static inline real sign_of(real c) { return c > 0 ? (real)1 : c < 0 ? (real)-1 : c; }

void R(agi_lion_update)(const agi_update_args *a, size_t begin, size_t end) {
    const ag_optim_config *c = a->cfg;
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    real *restrict m = (real *)a->state[0] + begin;
    const real beta1 = (real)c->beta1, beta2 = (real)c->beta2;
    const real one_minus_beta1 = (real)(1.0 - c->beta1), one_minus_beta2 = (real)(1.0 - c->beta2);
    const real shrink = (real)(1.0 - c->lr * a->weight_decay), neg_lr = (real)-c->lr;
    const size_t n = end - begin;
    for (size_t k = 0; k < n; k++) {
        real interpolated = beta1 * m[k] + one_minus_beta1 * g[k];
        p[k] = p[k] * shrink + neg_lr * sign_of(interpolated);
        m[k] = beta2 * m[k] + one_minus_beta2 * g[k];
    }
}

#if AG_ONCE
void agi_lion_update_f64(const agi_update_args *a, size_t begin, size_t end);

static bool lion_check(const ag_optim_config *c) { return agi_optim_check_betas(c); }

static int lion_buffers(const ag_optim_config *c, const char *names[AGI_OPTIM_MAX_BUFFERS]) {
    (void)c;
    names[0] = "exp_avg";
    return 1;
}

static const agi_setting lion_settings[] = {
    {"beta1", AGI_SETTING_FIELD(beta1), NULL},
    {"beta2", AGI_SETTING_FIELD(beta2), NULL},
    {NULL, 0, false, NULL},
};

const agi_optimizer agi_lion = {
    .name = "lion",
    .title = "Lion",
    .defaults = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99},  // the paper's and lion-pytorch's
    .check = lion_check,
    .buffers = lion_buffers,
    .settings = lion_settings,
    .update_f32 = agi_lion_update_f32,
    .update_f64 = agi_lion_update_f64,
    .flops_per_element = 10,
};
#endif
