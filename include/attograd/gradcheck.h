// attograd/gradcheck.h — finite-difference gradient checks, for any function
// built from ops (built-in or your own).
//
// For a function y = f(x_1, ..., x_n) and a fixed random upstream gradient v
// (entries uniform in [-1, 1] from pcg32; 0 where y is infinite), gradcheck
// compares, element by element of every input that requires grad,
//     analytic  d<v, f(x)>/dx_i   from the tape's backward, with
//     numeric   (<v, f(x + h e_i)> - <v, f(x - h e_i)>) / (2 h).
// An element passes when |analytic - numeric| <= atol + rtol * |numeric| (torch.allclose
// semantics) plus what rounding of the outputs explains. Defaults are PyTorch's gradcheck
// defaults for float64: eps 1e-6, atol 1e-5, rtol 1e-3. Run it in AG_F64: float32 finite
// differences cannot tell a wrong transpose from rounding noise.
//
// The comparison itself is the one ag_tape_check makes node by node (the same code); how
// it decides, and why, is written in attograd/tape_check.h. In short, there are three
// verdicts, not two:
//   pass          every comparison agreed;
//   FAIL          a comparison disagreed by more than the tolerance and more than the
//                 differences' own uncertainty (a kink or rounding noise) can explain;
//                 the failing elements are listed (index, expected, got);
//   inconclusive  nothing failed, but something could not be checked, and `reason` says
//                 what: a non-differentiable point straddled by the differences (relu at
//                 exactly 0), float32 noise above the tolerance, a NaN among the inputs,
//                 or nothing compared at all.
//
// It also checks that running backward twice gives identical gradients, and
// that a zero upstream gradient gives zero input gradients.
#ifndef ATTOGRAD_GRADCHECK_H
#define ATTOGRAD_GRADCHECK_H

#include "attograd/tape.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ag_check_verdict {
    AG_CHECK_PASS = 0,
    AG_CHECK_FAIL,
    AG_CHECK_INCONCLUSIVE,
} ag_check_verdict;

// "pass", "FAIL", "inconclusive".
const char *ag_check_verdict_name(ag_check_verdict v);

// An element whose gradient the differences contradict.
typedef struct ag_check_element {
    int input;        // the input's slot (the function's inputs, or the node's)
    size_t index;     // flat index into that input
    char at[40];      // the same as a multi-index: "(0,2,1)"
    double expected;  // numeric: the central difference
    double got;       // analytic: what backward gave
} ag_check_element;

#define AG_CHECK_ELEMENTS 4

// What the finite differences found: the same record for ag_gradcheck (the whole
// function) and ag_tape_check (one node).
typedef struct ag_check_result {
    ag_check_verdict verdict;
    char reason[200];        // one line on why it failed or was inconclusive; "" on a pass
    bool elementwise;        // compared element by element (else along random directions)
    int comparisons;         // numbers compared (elements, or directions)
    int undecided;           // comparisons whose error a kink or noise could explain
    int not_finite;          // input elements that are +-inf: never perturbed, unchecked
    int smaller_steps;       // comparisons whose step left the function's domain (log of
                             // a value closer to 0 than eps) and was made smaller
    int forward_runs;
    double max_abs_err;      // largest |analytic - numeric|
    double max_rel_err;      // largest |analytic - numeric| / scale
    double noise;            // the one-sided differences' disagreement (rounding noise,
                             // kinks), typical size relative to the comparison's scale;
                             // the largest where measured (f32, or a comparison that did
                             // not pass at once)
    int worst_input;         // the comparison with the largest error over tolerance
    double worst_numeric, worst_analytic;
    int n_bad;               // elements named below (a failure along a direction is
    ag_check_element bad[AG_CHECK_ELEMENTS];  // narrowed down to elements by bisection)
} ag_check_result;

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
    ag_check_verdict verdict;  // the differences' verdict, FAIL also when one of the two
    bool repeat_ok;            // backward twice: identical gradients
    bool zero_ok;              // zero upstream: zero gradients
    ag_check_result fd;        // the finite differences, element by element
    size_t checked;            // number of input elements that require grad
    char report[1024];         // what failed and where, human readable
} ag_gradcheck_result;

// Inputs that require grad are checked (their values are perturbed in place
// and restored). Inputs that don't (masks, targets) are passed through. Every
// gradient is left as it was, as PyTorch's gradcheck leaves .grad: the inputs'
// and those of the other leaves the function reads (a model's parameters), a
// gradient that did not exist included (it stays NULL).
// `opts` may be NULL for the defaults; `res` may be NULL. Returns true on a
// pass (res->verdict AG_CHECK_PASS), false on a failure or an inconclusive check.
bool ag_gradcheck(ag_fn fn, ag_tensor *const inputs[], int n_inputs, void *user,
                  const ag_gradcheck_opts *opts, ag_gradcheck_result *res);

#ifdef __cplusplus
}
#endif
#endif
