// The SGD update, element by element as torch.optim.SGD 1.13 computes it
// (_single_tensor_sgd), with g the gradient and p the parameter:
//   d = g + weight_decay * p                          (only if weight_decay != 0)
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf           (only with momentum)
//   p = p + (-lr) * d
// Scalars are rounded to `real` first, as PyTorch rounds a Python float to
// the tensor's dtype.
#include "../core/real.h"
#include "update.h"

// The branches test loop invariants; the compiler unswitches them, leaving a
// straight vectorisable loop for each configuration.
void R(agi_sgd_update)(const agi_update_args *a, size_t begin, size_t end) {
    real *restrict p = (real *)a->param + begin;
    const real *restrict g = (const real *)a->grad + begin;
    real *restrict buf = a->state[0] ? (real *)a->state[0] + begin : NULL;
    const real weight_decay = (real)a->weight_decay, momentum = (real)a->momentum;
    const real keep = (real)(1.0 - a->dampening), neg_lr = (real)-a->lr;
    const bool decay = a->weight_decay != 0, first = a->first, nesterov = a->nesterov;
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
