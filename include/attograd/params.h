// attograd/params.h — a parameter store: every parameter of a model in one
// contiguous value buffer and every gradient in one contiguous gradient buffer.
//
// Zeroing gradients, clipping by global norm, an optimizer step, a checkpoint
// or a future all-reduce is then one pass over one array. Each parameter is a
// named tensor (PyTorch state_dict names, e.g. "self_attn.in_proj_weight")
// whose data and grad point into those buffers; the padding between
// parameters (to keep each one 64-byte aligned) is zero and stays zero.
#ifndef ATTOGRAD_PARAMS_H
#define ATTOGRAD_PARAMS_H

#include "attograd/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ag_params ag_params;

ag_params *ag_params_new(ag_dtype dt);
void ag_params_free(ag_params *ps);

// Adds a zero-filled parameter that requires grad. The name is copied and must
// be unique. The returned tensor stays valid (and at the same address) for the
// life of the store; adding parameters may move the buffers, never the tensors.
ag_tensor *ag_params_add(ag_params *ps, const char *name, int ndim, const int shape[]);

// Given a NULL store, each function below reports it (ag_error) and answers as an empty
// float32 store would: no parameters, no buffers, nothing to zero or decay; the gradient's
// norm, and ag_params_clip_grad_norm's, are NaN.
ag_dtype ag_params_dtype(const ag_params *ps);
int ag_params_count(const ag_params *ps);
// Parameter i, in order of addition; an i outside [0, count) is reported, giving NULL.
ag_tensor *ag_params_at(const ag_params *ps, int i);
ag_tensor *ag_params_find(const ag_params *ps, const char *name);  // NULL if absent
size_t ag_params_numel(const ag_params *ps);                  // sum of numels

// The two buffers, `ag_params_buffer_len` elements each (padding included).
size_t ag_params_buffer_len(const ag_params *ps);
void *ag_params_data(const ag_params *ps);
void *ag_params_grad(const ag_params *ps);

void ag_params_zero_grad(ag_params *ps);
// L2 norm of all gradients together.
double ag_params_grad_norm(const ag_params *ps);
// Scales all gradients so their global norm is at most max_norm (as
// torch.nn.utils.clip_grad_norm_, with its 1e-6 guard); returns the norm
// measured before clipping. The squares are summed in double, float32
// gradients' too, where PyTorch 1.13 sums a float32 norm in float32: finite
// float32 gradients always have a finite norm here (from a norm of 1.8e19 up
// PyTorch's is inf, and it scales every gradient by 0), and squares below
// 1e-38 still count (PyTorch's underflow to 0). The norm is NaN or inf when a
// gradient is NaN or inf (or, in float64, when the squares overflow): the step
// is then unusable, so check it with isfinite() before the optimizer step,
// which would spread the NaN into every parameter it touches. After a NaN norm
// the gradients are left as they were (torch would make them all NaN), so
// ag_params_first_nonfinite still names the parameter that went bad. A
// max_norm below 0 or NaN is an error: NaN is returned and the gradients are
// left as they were.
double ag_params_clip_grad_norm(ag_params *ps, double max_norm);

// The first parameter (in order of addition) holding a NaN or an infinity in
// its values (grad = false) or in its gradient (grad = true); NULL when every
// one is finite. One pass over the buffer: cheap enough for every training
// step, and after loading a checkpoint (a file may hold a NaN).
ag_tensor *ag_params_first_nonfinite(const ag_params *ps, bool grad);

// Gives parameter t a new shape and the values `values` (numel elements of the store's
// dtype), repacking both buffers: every other parameter keeps its values and gradient, t's
// gradient becomes zero, and t keeps its address, its weight decay group and whether it
// requires grad (a frozen parameter stays frozen). What ag_mha_prune_heads uses. The
// buffers' length changes, so an optimizer made for the store before no longer fits it:
// make a new one. A tape that recorded an op reading t before (a forward not yet
// differentiated) no longer fits it: ag_backward, ag_tape_check and ag_tape_html refuse
// it, naming t; reset it and record the forward again. False (after an error) if t is not
// in the store or the shape is bad.
bool ag_params_resize(ag_params *ps, ag_tensor *t, int ndim, const int shape[],
                      const void *values);

// ---- Weight decay groups ----------------------------------------------------------
// Every parameter decays by default: the optimizers apply their weight_decay to
// all of them, as torch.optim does with one parameter group. A parameter set to
// not decay is in a second group with weight_decay 0 (as nanoGPT puts biases,
// LayerNorm weights and embeddings). The optimizers read these flags at every
// step; an optimizer's checkpoint state records them (ag_optim_state, optim.h).
// The tag lives on the parameter, like requires_grad, rather than in the optimizer:
// it says what the parameter is (a bias, an embedding table) and is set where the
// model is built, before any optimizer exists; and it outlives optimizers (a store
// pruned with ag_params_resize needs a new one and keeps its groups). Core only keeps
// the tag; the optimizers give it its meaning.
void ag_params_set_decay(ag_params *ps, ag_tensor *param, bool decay);
bool ag_params_decays(const ag_params *ps, const ag_tensor *param);
// Decay only parameters of 2 or more dims (weight matrices, embedding tables),
// not biases and LayerNorm weights; returns how many parameters do not decay.
// Set an embedding apart afterwards with ag_params_set_decay(ps, w, false).
int ag_params_decay_matrices_only(ag_params *ps);

#ifdef __cplusplus
}
#endif
#endif
