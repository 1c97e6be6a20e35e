// The finite-difference core that ag_gradcheck (the whole function, src/core/gradcheck.c)
// and ag_tape_check (node by node, src/ops/tape_check.c) share: given a function that can
// be re-run at perturbed inputs, the analytic J^T v of each input and the upstream
// gradient v, it compares the two along elements or random directions and returns a
// verdict (attograd/gradcheck.h). How it decides is written in fd_check.c.
#ifndef ATTOGRAD_FD_CHECK_H
#define ATTOGRAD_FD_CHECK_H

#include <math.h>

#include "internal.h"

// One input whose gradient is checked.
typedef struct agi_fd_input {
    ag_tensor *x;          // f32 or f64: its data is perturbed in place, then restored
    int slot;              // its position among the function's inputs, for reports
    const double *ana;     // what backward gave: (J^T v)_i, element by element
    const ag_tensor *x0;   // its values, unperturbed (any float dtype: f32 values of an f64
                           // x are widened exactly); NULL: the core copies x first
} agi_fd_input;

typedef struct agi_fd_fn {
    // Runs the function at the inputs' current values into output `which` (0 or 1); the
    // output stays valid until the next run with the same `which`. NULL if it failed.
    const ag_tensor *(*run)(void *ctx, int which);
    void *ctx;
    int n_in;
    const agi_fd_input *in;
    size_t m;           // output elements
    const ag_tensor *v;   // the upstream gradient (0 where y0 is infinite), f32 or f64
    const ag_tensor *y0;  // the output at the unperturbed inputs (its dtype: the run's)
} agi_fd_fn;

typedef struct agi_fd_opts {
    double eps, atol, rtol;
    int max_elementwise;  // inputs holding this many elements or fewer in all: element by
                          // element; more: along `directions` random directions per input
    int directions;
    bool one_sided_first;  // in f64, try one run per comparison first (fd_check.c)
} agi_fd_opts;

// Compares and fills r. Differences are taken in the dtype of the inputs (all f32 or all
// f64); the directions are drawn from g. Scratch memory comes from `scratch` (not reset).
// The inputs hold no NaN (agi_fd_nan_inputs first).
void agi_fd_check(const agi_fd_fn *f, const agi_fd_opts *o, ag_pcg32 *g, ag_tape *scratch,
                  ag_check_result *r);

// Whether a step and its tolerances can decide anything: eps finite and > 0, atol and rtol
// finite and >= 0 (a NaN is none of these). A zero or NaN eps makes every difference 0 or
// NaN and so fails a correct gradient; a negative one mirrors the step; an infinite
// tolerance passes any gradient, a gradient twice too large too.
static inline bool agi_fd_steps_ok(double eps, double atol, double rtol) {
    return eps > 0 && eps < INFINITY && atol >= 0 && atol < INFINITY && rtol >= 0 &&
           rtol < INFINITY;
}

// A result before any comparison: verdict pass, no worst input.
void agi_fd_result_init(ag_check_result *r);

// Sets r's verdict to INCONCLUSIVE (unless it failed) with a reason, like printf.
void agi_fd_inconclusive(ag_check_result *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
// Sets r's verdict to FAIL with a reason (the first reason stays).
void agi_fd_fail(ag_check_result *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// If float tensor x (input `slot`) holds a NaN, makes r INCONCLUSIVE saying so and
// returns true: a difference through a NaN is NaN, whatever the gradient.
bool agi_fd_nan_inputs(ag_check_result *r, int slot, const ag_tensor *x);

// "(1,0,3)": the multi-index of flat element i of a tensor shaped like t.
const char *agi_index_str(const ag_tensor *t, size_t i, char *buf, size_t size);

// Element i of a float tensor's data `buf` (t's dtype), as a double; and the reverse.
static inline double agi_fd_get(const ag_tensor *t, const void *buf, size_t i) {
    return t->dtype == AG_F64 ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}
static inline void agi_fd_set(const ag_tensor *t, void *buf, size_t i, double v) {
    if (t->dtype == AG_F64) ((double *)buf)[i] = v;
    else ((float *)buf)[i] = (float)v;
}

// Uniform in [-1, 1), from one draw of g (a direction or an upstream gradient).
static inline double agi_fd_uniform(ag_pcg32 *g) {
    return (double)(int32_t)ag_pcg32_next(g) * 0x1p-31;
}

#endif
