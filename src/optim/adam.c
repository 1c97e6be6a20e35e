// Adam and AdamW, element by element as torch.optim.Adam and AdamW 1.13 compute them
// (_single_tensor_adam(w)), with g the gradient, p the parameter and t the step count
// after this step:
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
#include "../core/multiversion.h"
#include "optimizer.h"

// The step's scalars (adam_prepare).
enum { STEP_SIZE, BIAS_CORRECTION2_SQRT };

// The branches test loop invariants; the compiler unswitches them. Multiversioned
// (AGI_HOT): the baseline's 4-wide square roots and divisions, not the memory, bounded
// the loop (a GPT-2-size model's 85 million elements in about 60 ms); every version does
// the same correctly rounded operations per element, without contraction.
void R(agi_adam_update_rows)(const agi_update_args *a, size_t begin, size_t end,
                             bool decoupled);

AGI_HOT void R(agi_adam_update_rows)(const agi_update_args *a, size_t begin, size_t end,
                                     bool decoupled) {
    const ag_optim_config *c = a->cfg;
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    real *restrict m = (real *)a->state[0] + begin;
    real *restrict v = (real *)a->state[1] + begin;
    const real beta1 = (real)c->beta1, beta2 = (real)c->beta2;
    const real one_minus_beta1 = (real)(1.0 - c->beta1), one_minus_beta2 = (real)(1.0 - c->beta2);
    const real weight_decay = (real)a->weight_decay, shrink = (real)(1.0 - c->lr * a->weight_decay);
    const real neg_step_size = (real)-a->scalar[STEP_SIZE], eps = (real)c->eps;
    const real bias_correction2_sqrt = (real)a->scalar[BIAS_CORRECTION2_SQRT];
    const bool coupled = !decoupled && a->weight_decay != 0;
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

void R(agi_adam_update)(const agi_update_args *a, size_t begin, size_t end) {
    R(agi_adam_update_rows)(a, begin, end, false);
}

void R(agi_adamw_update)(const agi_update_args *a, size_t begin, size_t end) {
    R(agi_adam_update_rows)(a, begin, end, true);
}

#if AG_ONCE
void agi_adam_update_f64(const agi_update_args *a, size_t begin, size_t end);
void agi_adamw_update_f64(const agi_update_args *a, size_t begin, size_t end);

static bool adam_check(const ag_optim_config *c) {
    return agi_optim_check_nonnegative("eps", c->eps) && agi_optim_check_betas(c);
}

static int adam_buffers(const ag_optim_config *c, const char *names[AGI_OPTIM_MAX_BUFFERS]) {
    (void)c;
    names[0] = "exp_avg";
    names[1] = "exp_avg_sq";
    return 2;
}

// As PyTorch, in double: beta ** step with the step as a float.
static void adam_prepare(const ag_optim_config *c, int64_t t,
                         double scalar[AGI_OPTIM_MAX_SCALARS]) {
    scalar[STEP_SIZE] = c->lr / (1 - pow(c->beta1, (double)t));
    scalar[BIAS_CORRECTION2_SQRT] = sqrt(1 - pow(c->beta2, (double)t));
}

static const agi_setting adam_settings[] = {
    {"beta1", AGI_SETTING_FIELD(beta1), NULL},
    {"beta2", AGI_SETTING_FIELD(beta2), NULL},
    {"eps", AGI_SETTING_FIELD(eps), NULL},
    {NULL, 0, false, NULL},
};

// Counting the square root and the division as several.
#define ADAM_FLOPS_PER_ELEMENT 20

const agi_optimizer agi_adam = {
    .name = "adam",
    .title = "Adam",
    .defaults = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8},
    .check = adam_check,
    .buffers = adam_buffers,
    .settings = adam_settings,
    .prepare = adam_prepare,
    .update_f32 = agi_adam_update_f32,
    .update_f64 = agi_adam_update_f64,
    .flops_per_element = ADAM_FLOPS_PER_ELEMENT,
};

const agi_optimizer agi_adamw = {
    .name = "adamw",
    .title = "AdamW",
    .defaults = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2},
    .check = adam_check,
    .buffers = adam_buffers,
    .settings = adam_settings,
    .prepare = adam_prepare,
    .update_f32 = agi_adamw_update_f32,
    .update_f64 = agi_adamw_update_f64,
    .flops_per_element = ADAM_FLOPS_PER_ELEMENT,
};
#endif
