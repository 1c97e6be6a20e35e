// What an optimizer is to the rest of src/optim: a descriptor. Each optimizer is one
// file (sgd.c, adam.c, lion.c, rmsprop.c) holding its update kernel and its
// `agi_optimizer`: defaults, hyperparameter checks, state buffers, the scalars of a
// step, its names and the settings a checkpoint saves. optimizers.c lists them once,
// by ag_optim_kind. The object (optim.c) and its checkpoint description
// (optim_state.c) read the descriptor and name no optimizer, so a new optimizer is
// its file, its line in optimizers.c and its kind (with any new hyperparameter) in
// attograd/optim.h.
//
// A step computes its scalars once, in double (as PyTorch does in Python), and hands
// them with the flat buffers to the kernel, which updates elements [begin, end) of
// every buffer. The driver calls it on each parameter's range (never the padding),
// split into blocks across threads.
#ifndef ATTOGRAD_OPTIM_OPTIMIZER_H
#define ATTOGRAD_OPTIM_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attograd/optim.h"

#define AGI_OPTIM_MAX_BUFFERS 3  // RMSprop's square_avg, momentum_buffer, grad_avg
#define AGI_OPTIM_MAX_SCALARS 2  // Adam's step_size, bias_correction2_sqrt

typedef struct agi_update_args {
    void *param;                          // the store's value buffer
    const void *grad;                     // the store's gradient buffer
    void *state[AGI_OPTIM_MAX_BUFFERS];   // the state buffers, in the descriptor's order
    const ag_optim_config *cfg;           // the hyperparameters; cfg->lr is the current lr
    double weight_decay;                  // the parameter's group's: cfg->weight_decay or 0
    bool first;                           // no step has updated these parameters since the
                                          // buffers were made (SGD starts its momentum
                                          // buffer as a copy of that step's)
    double scalar[AGI_OPTIM_MAX_SCALARS]; // what the descriptor's prepare computed
} agi_update_args;

typedef void (*agi_update_fn)(const agi_update_args *a, size_t begin, size_t end);

// A hyperparameter as a checkpoint saves it, "optimizer.<key>": a double or bool
// field of ag_optim_config, written with the fewest digits that read back exactly.
typedef struct agi_setting {
    const char *key;      // PyTorch's param_group key (beta1, beta2 for its betas)
    size_t offset;        // of the field in ag_optim_config
    bool is_bool;
    // For a setting that decides which buffers exist, what it decides ("a momentum
    // buffer"): a file is loaded only into an optimizer that agrees on it. The other
    // settings are saved for the reader and stay as the code that makes the
    // optimizer sets them.
    const char *decides;
} agi_setting;

// The offset and kind of a field of ag_optim_config, for agi_setting (a field of
// another type does not compile).
#define AGI_SETTING_FIELD(field)               \
    offsetof(ag_optim_config, field),          \
        _Generic(((ag_optim_config *)0)->field, bool: true, double: false)

typedef struct agi_optimizer {
    const char *name;   // the checkpoint's kind, "adamw" (ag_optim_kind_name)
    const char *title;  // torch.optim's class, for messages: "AdamW"
    // torch.optim's defaults (kind aside); lr NAN when it has none (SGD).
    ag_optim_config defaults;
    // The checks of torch.optim's constructor beyond lr >= 0 and weight_decay >= 0,
    // which optim.c makes for all: false after one ag_error line.
    bool (*check)(const ag_optim_config *c);
    // The state buffers c needs, by PyTorch's state keys and in PyTorch's order;
    // returns their number (at most AGI_OPTIM_MAX_BUFFERS).
    int (*buffers)(const ag_optim_config *c, const char *names[AGI_OPTIM_MAX_BUFFERS]);
    // True when the momentum buffer starts as a copy of the first step's direction
    // rather than at zero (SGD): the optimizer then keeps, and a checkpoint saves as
    // "momentum_initialised", whether that step has been taken.
    bool momentum_starts_on_first_step;
    // The settings a checkpoint saves after "step", "lr" and "weight_decay", in that
    // order; ended by {NULL}.
    const agi_setting *settings;
    // The step's scalars, from c and the step count t (after this step), once per
    // step: what does not depend on the parameter's decay group. NULL: none.
    void (*prepare)(const ag_optim_config *c, int64_t t, double scalar[AGI_OPTIM_MAX_SCALARS]);
    agi_update_fn update_f32, update_f64;
    double flops_per_element;  // how the thread pool weighs a step
} agi_optimizer;

// The descriptor of `kind`, or NULL when it is no kind (optimizers.c).
const agi_optimizer *agi_optimizer_of(ag_optim_kind kind);

// Checks the descriptors share: false after one line, "optim_new: ...".
bool agi_optim_check_nonnegative(const char *what, double v);
bool agi_optim_check_betas(const ag_optim_config *c);

// The store an optimizer updates; *state_len gets the length of each state buffer
// (the store's buffer length when the optimizer was made, which a store that grew or
// shrank since no longer matches). Not const: the store is the caller's, not the
// optimizer's (restoring a checkpoint sets its decay groups).
ag_params *agi_optim_params(const ag_optim *o, size_t *state_len);
// The store is as the optimizer was made for it: no parameter added, none resized.
bool agi_optim_fits(const ag_optim *o);

// Whether a step has updated parameter i (of the store, in order) since the buffers
// were made: SGD starts its momentum buffer on that parameter's first update.
bool agi_optim_started(const ag_optim *o, int i);
void agi_optim_set_started(ag_optim *o, int i, bool started);

// Fills *s with o's description for checkpoints (optim_state.c).
void agi_optim_state_init(ag_state *s, ag_optim *o);

#endif
