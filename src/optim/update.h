// The per-element update kernels of the optimizers, shared by the driver
// (optim.c) and the typed kernels (sgd.c, adam.c).
//
// A step computes its scalars once, in double (as PyTorch does in Python),
// and hands them with the flat buffers to a kernel that updates elements
// [begin, end) of every buffer. The driver calls it on each parameter's
// range (never the padding), split into blocks across threads.
#ifndef ATTOGRAD_OPTIM_UPDATE_H
#define ATTOGRAD_OPTIM_UPDATE_H

#include <stdbool.h>
#include <stddef.h>

#include "attograd/optim.h"

typedef struct agi_update_args {
    void *param;        // the store's value buffer
    const void *grad;   // the store's gradient buffer
    void *state[2];     // momentum_buffer; or exp_avg, exp_avg_sq
    double lr, weight_decay;
    // SGD
    double momentum, dampening;
    bool nesterov;
    bool first;              // the momentum buffer is not initialised yet
    // Adam, AdamW
    double beta1, beta2, eps;
    double step_size;        // lr / (1 - beta1^t)
    double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
    bool decoupled;          // AdamW: decay p before the update
    // Lion: beta1, beta2 as above
} agi_update_args;

typedef void (*agi_update_fn)(const agi_update_args *a, size_t begin, size_t end);

void agi_sgd_update_f32(const agi_update_args *a, size_t begin, size_t end);
void agi_sgd_update_f64(const agi_update_args *a, size_t begin, size_t end);
void agi_adam_update_f32(const agi_update_args *a, size_t begin, size_t end);
void agi_adam_update_f64(const agi_update_args *a, size_t begin, size_t end);
void agi_lion_update_f32(const agi_update_args *a, size_t begin, size_t end);
void agi_lion_update_f64(const agi_update_args *a, size_t begin, size_t end);

// The store an optimizer updates; *state_len gets the length of each state
// buffer (the store's buffer length when the optimizer was made, which a
// store that grew since then no longer matches).
// Not const: the store is the caller's, not the optimizer's (restoring a checkpoint
// sets its decay groups).
ag_params *agi_optim_params(const ag_optim *o, size_t *state_len);

// Fills *s with o's description for checkpoints (optim_state.c).
void agi_optim_state_init(ag_state *s, ag_optim *o);

#endif
