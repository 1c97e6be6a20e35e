// The optimizers, one entry each, by their kind in attograd/optim.h. Each descriptor
// lives in the optimizer's own file, beside its update kernel (optimizer.h says what
// a descriptor holds).
#include "../core/internal.h"
#include "optimizer.h"

extern const agi_optimizer agi_sgd, agi_adam, agi_adamw, agi_lion, agi_rmsprop;

static const agi_optimizer *const optimizers[AG_OPTIM_KIND_COUNT] = {
    [AG_SGD] = &agi_sgd,
    [AG_ADAM] = &agi_adam,
    [AG_ADAMW] = &agi_adamw,
    [AG_LION] = &agi_lion,
    [AG_RMSPROP] = &agi_rmsprop,
};

const agi_optimizer *agi_optimizer_of(ag_optim_kind kind) {
    // Through unsigned: an out-of-range enum value may be negative.
    return (unsigned)kind < AG_OPTIM_KIND_COUNT ? optimizers[kind] : NULL;
}

const char *ag_optim_kind_name(ag_optim_kind kind) {
    const agi_optimizer *d = agi_optimizer_of(kind);
    if (!d) ag_error("optim_kind_name: unknown optimizer kind %d", (int)kind);
    return d ? d->name : NULL;
}
