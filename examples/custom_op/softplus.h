// softplus, written as a user of attograd writes an op of their own: a forward, a
// backward that accumulates, a rule, and a constructor that checks its input and calls
// ag_op_apply. examples/custom_op/main.c verifies it with ag_op_check.
#ifndef CUSTOM_OP_SOFTPLUS_H
#define CUSTOM_OP_SOFTPLUS_H

#include <attograd.h>

// x: any shape, f32 or f64 -> same; y = log(1 + exp(x)), as torch.nn.functional.softplus.
ag_tensor *softplus(ag_tape *tp, ag_tensor *x);

// The same op with a deliberately wrong backward: its gradient is 1% too large. What a
// check must catch.
ag_tensor *softplus_wrong(ag_tape *tp, ag_tensor *x);

// The ops themselves: their forward and backward handle both dtypes, so each is its own
// f64 twin (ag_tape_check_opts.f64_twins = {&softplus_op, &softplus_op}).
extern const ag_op softplus_op, softplus_wrong_op;

// How ag_op_check sees each: one input x of any shape ("..."), values uniform in [-3, 3),
// where softplus bends; and the twins of both, for ag_op_check_opts.f64_twins (2 pairs).
extern const ag_op_spec softplus_spec, softplus_wrong_spec;
extern const ag_op *const softplus_twins[4];

#endif
