// attograd/data_parallel.h — one training step split over threads by the batch, as
// torch.nn.DataParallel splits it over devices.
//
// Splitting each op of a small model over threads gains little: its products are small
// and every op hands work out and waits for it. Here each thread instead runs the whole
// forward and backward of a contiguous slice of the batch on a tape of its own, and the
// gradients of the slices are added into the parameter store's gradient buffer in slice
// order. Thread k of P takes items [n k / P, n (k + 1) / P). Results are bit-identical for
// a given thread count (ag_threads_set), and with one thread the step is exactly the
// plain one: forward, ag_backward, gradients added into the store.
//
//     static ag_tensor *loss_of(ag_tape *tp, int begin, int end, void *user, double *w) {
//         my_batch *b = user;  // items [begin, end) of this step's batch
//         ag_tensor *logits = my_forward(tp, b->model, b->ids + begin * T, end - begin);
//         *w = count_targets(b, begin, end);  // the slice's share of the mean loss
//         return ag_cross_entropy(tp, logits, b->targets + begin * T, (end - begin) * T, -100);
//     }
//     ...
//     ag_data_parallel *dp = ag_data_parallel_new(model_params);
//     for (step ...) {
//         ag_params_zero_grad(model_params);
//         double loss = ag_data_parallel_step(dp, batch_size, loss_of, &batch);
//         ag_params_clip_grad_norm(model_params, 1.0);
//         ag_optim_step(opt);
//     }
//
// Each slice's loss is a mean over its own items; the step's loss is their mean weighted
// by the weights the function reports (the number of counted targets, for a
// cross-entropy with ignored positions; or end - begin), and each slice's backward is
// seeded with its weight over the total, so the gradients are those of the whole
// batch's loss. Inside a slice the ops run on its thread alone.
//
// Only parameters of the store may require grad in the function (a tensor of your own
// that requires grad would be written by every thread at once: it is an error). The
// function runs on several threads at once: it must not write shared state. Dropout
// draws its masks from the rows of each slice's own tensors, so they differ from a
// one-thread run (and are the same for every run with the same thread count).
#ifndef ATTOGRAD_DATA_PARALLEL_H
#define ATTOGRAD_DATA_PARALLEL_H

#include "attograd/params.h"
#include "attograd/tape.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ag_data_parallel ag_data_parallel;

// The loss of items [begin, end) of the batch, recorded on tp (fresh for this step: no
// nodes, gradients recorded, autocast off, whatever the last step left it in), and
// in *weight the slice's share of the batch (e.g. its counted targets; finite and >= 0).
// A slice of weight 0 contributes nothing (its loss is neither differentiated nor
// averaged in); at least one slice of a step must weigh more. NULL after an error.
typedef ag_tensor *(*ag_batch_loss_fn)(ag_tape *tp, int begin, int end, void *user,
                                       double *weight);

// The tapes and gradient buffers of the threads, for the parameters of ps (which must
// outlive it; it may grow or be pruned between steps); reused step after step (a repeated
// step allocates nothing).
ag_data_parallel *ag_data_parallel_new(ag_params *ps);
void ag_data_parallel_free(ag_data_parallel *dp);

// Runs fn on min(ag_threads(), n) slices of items [0, n), forward then backward, and
// adds the gradients into the store's gradient buffer (which is not zeroed first: zero
// it as for any backward). Returns the weighted mean loss, or NaN after an error: then
// the store's gradients are unchanged, unless the error came during a slice's backward
// (with a handler that returns), after which they may hold part of the batch's. One step
// of a data_parallel at a time: a step called from its own loss function, or from a
// second thread meanwhile, is an error; so is ag_data_parallel_free (it frees nothing).
double ag_data_parallel_step(ag_data_parallel *dp, int n, ag_batch_loss_fn fn, void *user);

// The tape slice k of the last step recorded on (k < the slices it used), e.g. to read
// more of its outputs or to print it; NULL for k out of range. It stays the
// data_parallel's: do not free it (ag_data_parallel_free does); it is reset at the next
// step, and a backward on it adds the parameters' gradients into the slice's own buffer
// (slice 0: the store's), as the step's backward did.
ag_tape *ag_data_parallel_tape(const ag_data_parallel *dp, int k);

#ifdef __cplusplus
}
#endif
#endif
