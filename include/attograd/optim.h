// attograd/optim.h — SGD, Adam, AdamW and RMSprop over a parameter store, with
// PyTorch's update formulas, Lion with its paper's, and learning-rate
// schedules.
//
// An optimizer works on the whole store at once: each of its state buffers
// (momentum_buffer; exp_avg and exp_avg_sq; square_avg, ...) is one array with
// the layout of the store's value buffer, so a step is one pass over flat arrays.
//
//     ag_optim_config cfg = ag_optim_defaults(AG_ADAMW);
//     cfg.lr = 3e-4;
//     ag_optim *opt = ag_optim_new(ps, &cfg);   // after every ag_params_add
//     for (int64_t step = 0; step < total; step++) {
//         ag_params_zero_grad(ps);
//         ... forward, backward ...
//         ag_params_clip_grad_norm(ps, 1.0);
//         ag_optim_set_lr(opt, ag_lr_warmup_cosine(step, warmup, total, 3e-4, 3e-5));
//         ag_optim_step(opt);
//     }
//     ag_optim_free(opt);
//
// The updates are those of torch.optim 1.13 (single-tensor path), element by
// element, in the same order of operations; scalars are computed in double
// and, for an f32 store, rounded to float before use, as PyTorch does. The
// parameters and state buffers are then PyTorch's bits, f32 and f64, when
// PyTorch runs its plain CPU kernels (ATEN_CPU_CAPABILITY=default); its AVX2
// kernels fuse some multiply-adds, which moves a result by a few units in the
// last place of its terms (relatively more where the terms cancel). Where a
// product overflows, the fused form can differ in kind: after a gradient above
// 1.9e21 (float32, alpha 0.99), centered RMSprop's v - a * a (addcmul with
// value -1) is inf - inf = NaN unfused, as here (the parameter becomes NaN),
// but inf fused (the exact a * a is finite): PyTorch's AVX2 step leaves the
// parameter as it was.
//
// Differences from torch.optim, all deliberate:
//   - every parameter of the store that requires a gradient is updated on
//     every step; a frozen one (ag_tensor_set_requires_grad(p, false)) is left
//     alone, its state too, as PyTorch leaves one whose .grad is None. A
//     parameter that requires a gradient but received none has grad 0 (after
//     ag_params_zero_grad), which leaves it alone under plain SGD but still
//     lets momentum, Adam's moments and AdamW's decay move it, as PyTorch does
//     for a zero (not None) gradient. SGD starts a parameter's momentum buffer
//     on the first step that updates it, as PyTorch does on the first step
//     where the parameter has a gradient. With one step count (below), a
//     parameter unfrozen later continues Adam's bias correction from the
//     store's count, where PyTorch's would count its own steps;
//   - one step count for the whole store (PyTorch keeps a float32 "step"
//     tensor per parameter, all equal when every parameter has a gradient);
//   - no parameter groups beyond weight decay on or off per parameter
//     (ag_params_set_decay: the other group has weight_decay 0); no amsgrad,
//     maximize, foreach, differentiable or fused variants.
//   - the padding between parameters in the store is never read or written,
//     so it stays zero whatever the values (even with eps = 0 or NaN grads).
#ifndef ATTOGRAD_OPTIM_H
#define ATTOGRAD_OPTIM_H

#include "attograd/params.h"
#include "attograd/state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ag_optim_kind {
    AG_SGD = 0,
    AG_ADAM = 1,
    AG_ADAMW = 2,
    AG_LION = 3,
    AG_RMSPROP = 4,
    AG_OPTIM_KIND_COUNT  // the number of kinds, not a kind
} ag_optim_kind;

// The kind's name in checkpoints ("sgd", "adam", "adamw", "lion", "rmsprop"): the
// lower-case name of its torch.optim class. NULL (and reported) for no kind.
const char *ag_optim_kind_name(ag_optim_kind kind);

// Hyperparameters, with PyTorch's names. Fields a kind does not use are
// ignored (SGD: lr, momentum, dampening, nesterov, weight_decay; Adam and
// AdamW: lr, beta1, beta2, eps, weight_decay; Lion: lr, beta1, beta2,
// weight_decay; RMSprop: lr, alpha, eps, weight_decay, momentum, centered).
typedef struct ag_optim_config {
    ag_optim_kind kind;
    double lr;            // >= 0
    double momentum;      // SGD, RMSprop: >= 0; 0 means no momentum buffer
    double dampening;     // SGD
    bool nesterov;        // SGD; needs momentum > 0 and dampening == 0
    double weight_decay;  // >= 0. SGD, Adam, RMSprop: L2 added to the gradient;
                          // AdamW, Lion: decoupled, p *= 1 - lr * weight_decay
    double beta1, beta2;  // Adam(W), Lion: in [0, 1)
    double eps;           // Adam(W), RMSprop: >= 0
    double alpha;         // RMSprop: the square average's decay, >= 0
    bool centered;        // RMSprop: divide by the gradient's estimated variance
                          // rather than its mean square (a grad_avg buffer)
} ag_optim_config;

// torch.optim's defaults for each kind:
//   AG_SGD:   lr = NAN (PyTorch's SGD has no default learning rate: set one,
//             or ag_optim_new reports it), momentum 0, dampening 0,
//             nesterov false, weight_decay 0;
//   AG_ADAM:  lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0;
//   AG_ADAMW: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2;
//   AG_LION:  lr 1e-4, betas (0.9, 0.99), weight_decay 0 (the paper's; it
//             suggests an lr 3-10x smaller and a weight_decay 3-10x larger
//             than AdamW's);
//   AG_RMSPROP: lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0,
//             centered false.
ag_optim_config ag_optim_defaults(ag_optim_kind kind);

typedef struct ag_optim ag_optim;

// An optimizer over every parameter of `ps`, with zeroed state and step
// count 0. Add all parameters before this call: a step after the store has
// grown, or after a parameter was resized (ag_params_resize, ag_mha_prune_heads),
// is reported as an error (and does nothing): make a new optimizer then. The
// store must outlive the optimizer. Reports (through ag_error) and returns NULL on an empty
// store or a hyperparameter PyTorch would reject.
ag_optim *ag_optim_new(ag_params *ps, const ag_optim_config *cfg);
void ag_optim_free(ag_optim *o);

// One update of every parameter from the gradients in the store. Performs no
// heap allocation. With g the gradient, p the parameter, t the step count
// after incrementing it:
//
// AG_SGD:
//     d = g + weight_decay * p
//     if momentum != 0:
//         buf = d                                    on the first step
//         buf = momentum * buf + (1 - dampening) * d  afterwards
//         d = nesterov ? d + momentum * buf : buf
//     p = p - lr * d
// AG_ADAM:
//     g = g + weight_decay * p
//     m = beta1 * m + (1 - beta1) * g
//     v = beta2 * v + (1 - beta2) * g * g
//     p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// AG_ADAMW: first p = p * (1 - lr * weight_decay), then AG_ADAM without the
//     weight decay in the gradient.
// AG_LION (Chen et al. 2023; no torch.optim counterpart in 1.13):
//     p = p * (1 - lr * weight_decay)
//     p = p - lr * sign(beta1 * m + (1 - beta1) * g)     sign(0) = 0
//     m = beta2 * m + (1 - beta2) * g
// AG_RMSPROP:
//     g = g + weight_decay * p
//     v = alpha * v + (1 - alpha) * g * g               (square_avg)
//     if centered: a = alpha * a + (1 - alpha) * g      (grad_avg)
//                  avg = sqrt(v - a * a) + eps
//     else:        avg = sqrt(v) + eps
//     if momentum > 0: buf = momentum * buf + g / avg;  p = p - lr * buf
//     else:            p = p - lr * g / avg
void ag_optim_step(ag_optim *o);

// Every function below, and ag_optim_step, reports a NULL optimizer in one line and then
// does nothing, returning NAN (the lr), 0, false, NULL or a zeroed config.
// The learning rate used by the following steps (e.g. from a schedule).
void ag_optim_set_lr(ag_optim *o, double lr);
double ag_optim_lr(const ag_optim *o);
// The configuration, with the current learning rate.
ag_optim_config ag_optim_current_config(const ag_optim *o);
// The number of steps taken (PyTorch's state["step"]).
int64_t ag_optim_step_count(const ag_optim *o);

// ---- State, for checkpoints -------------------------------------------------
// Resuming bit-exactly needs the parameters, every state buffer, the step
// count and, for SGD with momentum, whether the momentum buffer has been
// initialised. Restore by copying each buffer into a fresh optimizer's and
// setting the rest:
//
//     for (int i = 0; i < ag_optim_state_count(o); i++)
//         memcpy(ag_optim_state_data(o, i), saved[i], len * ag_dtype_size(dt));
//     ag_optim_set_step_count(o, saved_step);
//     if (ag_optim_has_momentum_buffer(o)) ag_optim_set_momentum_initialised(o, true);
//
// State buffers, by kind and in this order:
//   SGD, momentum == 0:  none;
//   SGD, momentum != 0:  "momentum_buffer";
//   Adam, AdamW:         "exp_avg", "exp_avg_sq";
//   Lion:                "exp_avg";
//   RMSprop:             "square_avg", then "momentum_buffer" when momentum > 0,
//                        then "grad_avg" when centered.
// Each holds ag_params_buffer_len(ps) elements of ag_params_dtype(ps), laid
// out as the store's value buffer: a parameter's state starts at the same
// element offset as its value. Padding is zero.
int ag_optim_state_count(const ag_optim *o);
const char *ag_optim_state_name(const ag_optim *o, int i);  // PyTorch's state key
void *ag_optim_state_data(const ag_optim *o, int i);
// 0 <= steps <= AG_OPTIM_MAX_STEPS: beyond 2^53 a step count is no longer exact as the
// double the bias corrections raise the betas to, and near INT64_MAX the next step would
// overflow. Anything else is reported and leaves the count as it was.
#define AG_OPTIM_MAX_STEPS (INT64_C(1) << 53)
void ag_optim_set_step_count(ag_optim *o, int64_t steps);

// SGD with momentum only. PyTorch creates SGD's momentum buffer on the first
// step as a copy of d (no dampening), so a checkpoint taken before any step
// has no momentum_buffer. Initialised is false for a new optimizer and true
// after its first step. A parameter frozen on every step so far starts its
// buffer on its first update all the same; setting initialised (either way)
// marks every parameter alike, so the copy above forgets such a parameter,
// where ag_optim_state's checkpoints keep it ("momentum_not_started").
// (RMSprop's momentum_buffer starts at zero, as PyTorch's: it needs no flag.)
bool ag_optim_has_momentum_buffer(const ag_optim *o);
bool ag_optim_momentum_initialised(const ag_optim *o);
void ag_optim_set_momentum_initialised(ag_optim *o, bool initialised);

// The optimizer as a checkpoint sees it (attograd/state.h): its kind
// (ag_optim_kind_name); settings "step", "lr", "weight_decay", and
// "momentum", "dampening", "nesterov", "momentum_initialised" (SGD), "beta1",
// "beta2", "eps" (Adam, AdamW), "beta1", "beta2" (Lion), "alpha", "eps",
// "momentum", "centered" (RMSprop), and "no_decay" when some parameters do not
// decay (ag_params_set_decay): a JSON array of their names (PyTorch's second
// param_group, weight_decay 0); "momentum_not_started" (SGD with momentum, once
// initialised) when some parameters have been frozen on every step so far: a
// JSON array of their names (PyTorch has no momentum_buffer for them); its state
// buffers.
// Restoring sets the step count, the learning rate, the store's decay groups
// (every parameter decays when the file has no "no_decay") and, for SGD with
// momentum, momentum_initialised and which parameters have not started their
// buffers (all have when the file has no "momentum_not_started"); it refuses a
// file whose momentum is 0 where the optimizer's is not (or the other way
// round), an RMSprop file centered where the optimizer is not (or the other
// way round), and a step count that is not a plain decimal integer in
// [0, 2^53]. The other hyperparameters stay as you made the optimizer. A file
// may leave out the buffers PyTorch has not made yet: SGD's momentum_buffer
// when "momentum_initialised" is false, and every buffer at step 0 (PyTorch's
// state before the first step, which starts them at zero); they load as zeros. Valid while `o` lives; NULL for NULL.
//     ag_checkpoint_save(ps, ag_optim_state(opt), "run.safetensors", NULL, &err);
ag_state *ag_optim_state(ag_optim *o);

// ---- Learning-rate schedules ----------------------------------------------------
// Linear warmup, then cosine decay to min_lr, for the 0-based step about to
// be taken:
//   step < warmup_steps:           base_lr * ((step + 1) / warmup_steps)
//   warmup_steps <= step < total:  base_lr - (base_lr - min_lr) * (0.5 * (1 - cos(pi * q))),
//                                  q = (step - warmup_steps) / (total_steps - warmup_steps)
//   step >= total_steps:           min_lr
// So warmup reaches base_lr exactly at its last step (warmup_steps - 1), decay
// starts at exactly base_lr on step warmup_steps and approaches min_lr as step
// nears total_steps, never passing it. warmup_steps = 0 means no warmup.
// Reports an error and returns NAN for step < 0, warmup_steps < 0 or
// total_steps < warmup_steps.
double ag_lr_warmup_cosine(int64_t step, int64_t warmup_steps, int64_t total_steps,
                           double base_lr, double min_lr);

#ifdef __cplusplus
}
#endif
#endif
