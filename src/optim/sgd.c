// SGD, element by element as torch.optim.SGD 1.13 computes it (_single_tensor_sgd),
// with g the gradient and p the parameter:
//   d = g + weight_decay * p                          (only if weight_decay != 0)
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf           (only with momentum)
//   p = p + (-lr) * d
// PyTorch makes the momentum buffer on the first step, as a clone of d: dampening is
// not applied then. Scalars are rounded to `real` first, as PyTorch rounds a Python
// float to the tensor's dtype.
#include "../core/real.h"
#include "optimizer.h"

// The branches test loop invariants; the compiler unswitches them, leaving a
// straight vectorisable loop for each configuration.
void R(agi_sgd_update)(const agi_update_args *a, size_t begin, size_t end) {
    const ag_optim_config *c = a->cfg;
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    real *restrict buf = a->state[0] ? (real *)a->state[0] + begin : NULL;
    const real weight_decay = (real)a->weight_decay, momentum = (real)c->momentum;
    const real keep = (real)(1.0 - c->dampening), neg_lr = (real)-c->lr;
    const bool decay = a->weight_decay != 0, first = a->first, nesterov = c->nesterov;
    const size_t n = end - begin;
    for (size_t k = 0; k < n; k++) {
        real d = g[k];
        if (decay) d = d + weight_decay * p[k];
        if (buf) {
            buf[k] = first ? d : momentum * buf[k] + keep * d;
            d = nesterov ? d + momentum * buf[k] : buf[k];
        }
        p[k] = p[k] + neg_lr * d;
    }
}

#if AG_ONCE
void agi_sgd_update_f64(const agi_update_args *a, size_t begin, size_t end);

static bool sgd_check(const ag_optim_config *c) {
    if (!agi_optim_check_nonnegative("momentum", c->momentum)) return false;
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0)) {
        ag_error("optim_new: Nesterov momentum needs momentum > 0 and dampening 0, "
                 "got momentum %g, dampening %g", c->momentum, c->dampening);
        return false;
    }
    return true;
}

static int sgd_buffers(const ag_optim_config *c, const char *names[AGI_OPTIM_MAX_BUFFERS]) {
    if (c->momentum == 0) return 0;
    names[0] = "momentum_buffer";
    return 1;
}

static const agi_setting sgd_settings[] = {
    {"momentum", AGI_SETTING_FIELD(momentum), "a momentum buffer"},
    {"dampening", AGI_SETTING_FIELD(dampening), NULL},
    {"nesterov", AGI_SETTING_FIELD(nesterov), NULL},
    {NULL, 0, false, NULL},
};

const agi_optimizer agi_sgd = {
    .name = "sgd",
    .title = "SGD",
    .defaults = {.lr = NAN},  // torch.optim.SGD requires an lr
    .check = sgd_check,
    .buffers = sgd_buffers,
    .momentum_starts_on_first_step = true,
    .settings = sgd_settings,
    .update_f32 = agi_sgd_update_f32,
    .update_f64 = agi_sgd_update_f64,
    .flops_per_element = 6,
};
#endif
