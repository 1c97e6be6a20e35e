// attograd/tensor.h — dense tensors: up to 4 dims, row-major, contiguous.
//
// A tensor lives in one of four places, and that decides who frees it:
//   - the heap: ag_tensor_zeros and friends; free with ag_tensor_free;
//   - a tape: every op output and ag_tape_tensor; released by ag_tape_reset;
//   - a parameter store (ag_params): freed with the store;
//   - a tensor set read from or bound for a file (ag_safetensors, io.h):
//     freed with the set.
// Its gradient, once a backward reaches it, lives in the same place.
#ifndef ATTOGRAD_TENSOR_H
#define ATTOGRAD_TENSOR_H

#include <stdio.h>

#include "attograd/base.h"
#include "attograd/random.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AG_MAX_DIMS 4

typedef struct ag_node ag_node;

// Fields are public for reading (shapes, data, grad); change them only
// through the functions below.
typedef struct ag_tensor {
    ag_dtype dtype;
    int ndim;                 // 0 (a scalar) to AG_MAX_DIMS
    int shape[AG_MAX_DIMS];   // unused trailing entries are 1
    size_t numel;
    void *data;               // numel elements of dtype
    void *grad;               // same layout as data; NULL until backward reaches it
    bool requires_grad;
    ag_node *node;            // the op that produced this tensor; NULL for a leaf
    const char *name;         // optional; shown by printing and ag_tape_dot
    // Where the tensor lives and what backward marked: the library's own,
    // not part of the API (never read or write it).
    uint32_t agi_bookkeeping;
} ag_tensor;

// ---- Creation (heap) ----------------------------------------------------------
// `shape` has `ndim` entries, each >= 1, e.g. (int[]){B, T, E}.
ag_tensor *ag_tensor_zeros(ag_dtype dt, int ndim, const int shape[]);
ag_tensor *ag_tensor_ones(ag_dtype dt, int ndim, const int shape[]);
// Copies numel elements of type `dt` (float, double, uint8_t for bool and u8,
// int32_t, int64_t) from `data`.
ag_tensor *ag_tensor_from(ag_dtype dt, int ndim, const int shape[], const void *data);
ag_tensor *ag_tensor_uniform(ag_dtype dt, int ndim, const int shape[], ag_pcg32 *rng,
                             double lo, double hi);
ag_tensor *ag_tensor_normal(ag_dtype dt, int ndim, const int shape[], ag_pcg32 *rng,
                            double mean, double std);
// A heap copy of `src` converted to `dt` (values only, no grad).
ag_tensor *ag_tensor_convert(const ag_tensor *src, ag_dtype dt);
// Frees a heap tensor and its grad. Tape and parameter tensors are ignored.
void ag_tensor_free(ag_tensor *t);

// ---- Initialisers, as torch.nn.init defines them --------------------------------
// For a weight of shape [out, in] (PyTorch layout): fan_in = in, fan_out = out.
// As torch's uniform_ and normal_, a range with lo > hi, a NaN or an infinite
// width, and a std below 0 or NaN are errors that leave the tensor as it was
// (ag_tensor_uniform and ag_tensor_normal then return NULL).
void ag_tensor_init_uniform(ag_tensor *t, ag_pcg32 *rng, double lo, double hi);
void ag_tensor_init_normal(ag_tensor *t, ag_pcg32 *rng, double mean, double std);
// U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)).
void ag_tensor_init_xavier_uniform(ag_tensor *t, ag_pcg32 *rng, double gain);
// U(-b, b), b = sqrt(6 / ((1 + a^2) * fan_in)): leaky-ReLU gain with slope a.
// nn.Linear uses a = sqrt(5) for its weight.
void ag_tensor_init_kaiming_uniform(ag_tensor *t, ag_pcg32 *rng, double a);
int ag_tensor_fan_in(const ag_tensor *t);
int ag_tensor_fan_out(const ag_tensor *t);

// ---- Values -----------------------------------------------------------------------
void ag_tensor_fill(ag_tensor *t, double v);
// Copies values from `src` (same numel) with conversion, as ag_tensor_set_item.
void ag_tensor_copy(ag_tensor *dst, const ag_tensor *src);
// Element `i` in flat row-major order, as a double (any dtype; an i64 beyond
// 2^53 is rounded to the nearest double).
double ag_tensor_item(const ag_tensor *t, size_t i);
// Stores `v` converted to the tensor's dtype: bool stores v != 0; u8, i32 and
// i64 truncate toward zero and saturate at their range, with NaN stored as 0.
void ag_tensor_set_item(ag_tensor *t, size_t i, double v);
// Gradient element `i`; 0 when no gradient has reached the tensor.
// These three report an index >= numel (item and grad_item return NaN,
// set_item stores nothing), as they do a view with no data.
double ag_tensor_grad_item(const ag_tensor *t, size_t i);
// The gradient as a tensor of its own (t's dtype, shape and name; data is
// t->grad, NULL until a backward reaches t; no grad of its own), to print,
// read or write with the functions here. A view: it owns nothing, ag_tensor_free
// ignores it, and it cannot be made to require grad (an error). Given NULL it reports and
// returns a float32 scalar view without data.
//     ag_tensor g = ag_tensor_grad_view(w);
//     ag_tensor_print(&g, stdout);
ag_tensor ag_tensor_grad_view(const ag_tensor *t);
// Typed views of the data; report an error if the dtype differs.
float *ag_tensor_f32(const ag_tensor *t);
double *ag_tensor_f64(const ag_tensor *t);

// A leaf's flag: a parameter frozen or unfrozen, an input whose gradient is wanted. An
// op's output that requires grad cannot be made to stop (an error, as in PyTorch): to
// use its values outside the graph, take ag_detach(tp, y) (tape.h).
void ag_tensor_set_requires_grad(ag_tensor *t, bool requires_grad);
void ag_tensor_set_name(ag_tensor *t, const char *name);  // not copied: keep it alive
void ag_tensor_zero_grad(ag_tensor *t);

// ---- Shapes and printing -----------------------------------------------------------
bool ag_tensor_same_shape(const ag_tensor *a, const ag_tensor *b);
// Writes e.g. "[4,8]" (a scalar is "[]"); returns buf.
char *ag_tensor_shape_str(const ag_tensor *t, char *buf, size_t size);
// Prints "name: f32 [2,3]" and then the values (at most 6 per row, 6 rows per
// matrix, with "..." where it skips).
void ag_tensor_print(const ag_tensor *t, FILE *f);
// ag_tensor_print, then "grad:" and the gradient in the same layout (or "grad: none"
// when no backward has reached the tensor): values and gradients side by side, for
// tests and teaching.
void ag_tensor_print_grad(const ag_tensor *t, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
