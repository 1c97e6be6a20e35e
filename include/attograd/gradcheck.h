// attograd/gradcheck.h — finite-difference gradient checks, for any function
// built from ops (built-in or your own).
//
// For a function y = f(x_1, ..., x_n) and a fixed random upstream gradient v
// (entries uniform in [-1, 1] from pcg32), gradcheck compares, element by
// element of every input that requires grad,
//     analytic  d<v, f(x)>/dx_i   from the tape's backward, with
//     numeric   (<v, f(x + eps e_i)> - <v, f(x - eps e_i)>) / (2 eps).
// An element passes when |analytic - numeric| <= atol + rtol * |numeric|
// (torch.allclose semantics). Defaults are PyTorch's gradcheck defaults for
// float64: eps 1e-6, atol 1e-5, rtol 1e-3. Run it in AG_F64: float32 finite
// differences cannot tell a wrong transpose from rounding noise.
//
// It also checks that running backward twice gives identical gradients, and
// that a zero upstream gradient gives zero input gradients.
#ifndef ATTOGRAD_GRADCHECK_H
#define ATTOGRAD_GRADCHECK_H

#include "attograd/tape.h"

#ifdef __cplusplus
extern "C" {
#endif

// Builds the function on `tp` from `inputs` and returns its output. Called
// many times (the tape is reset in between); it must be deterministic: with
// dropout, use a fixed seed so every call draws the same mask.
typedef ag_tensor *(*ag_fn)(ag_tape *tp, ag_tensor *const inputs[], int n_inputs,
                            void *user);

typedef struct ag_gradcheck_opts {
    double eps, atol, rtol;
    uint64_t seed;  // for the upstream gradient v
    bool quiet;     // if false, a failure prints a report to stderr
} ag_gradcheck_opts;

// eps 1e-6, atol 1e-5, rtol 1e-3, seed 0, quiet false.
ag_gradcheck_opts ag_gradcheck_defaults(void);

typedef struct ag_gradcheck_result {
    bool ok;                // every check below passed
    bool grad_ok;           // analytic matches numeric everywhere
    bool repeat_ok;         // backward twice: identical gradients
    bool zero_ok;           // zero upstream: zero gradients
    double max_abs_err;     // over all checked elements
    double max_rel_err;     // |a - n| / max(|n|, tiny)
    int worst_input;        // the element with the largest excess over tolerance
    size_t worst_index;     // flat index into that input
    double worst_numeric;
    double worst_analytic;
    size_t checked;         // number of elements compared
    char report[1024];      // what failed and where, human readable
} ag_gradcheck_result;

// Inputs that require grad are checked (their values are perturbed in place
// and restored). Inputs that don't (masks, targets) are passed through.
// `opts` may be NULL for the defaults; `res` may be NULL. Returns res->ok.
bool ag_gradcheck(ag_fn fn, ag_tensor *const inputs[], int n_inputs, void *user,
                  const ag_gradcheck_opts *opts, ag_gradcheck_result *res);

#ifdef __cplusplus
}
#endif
#endif
