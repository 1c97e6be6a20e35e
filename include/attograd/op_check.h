// attograd/op_check.h — the checks a careful reviewer runs on an op, for your own ops
// (PyTorch's OpInfo idea, in C): describe how to build the op and what its inputs look
// like, and ag_op_check generates the shapes and values and runs
//   - a float64 gradcheck on each generated case: sizes all different (nothing square),
//     size-1 dims, no batch dims (1-d or 0-d inputs where the description allows them),
//     two batch dims, broadcasting both ways (inputs marked `broadcast`), values 100 times
//     larger and 1000 times smaller;
//   - ag_tape_check of the op's node (a backward that overwrites instead of accumulating
//     shows there, not in a gradcheck);
//   - float32 against float64 on the same values (output and gradients, normwise);
//   - 1 and 2 threads, on a case grown large enough to be split: bit-identical;
//   - NaN in, NaN out: the input element with the largest gradient made NaN;
//   - bad shapes refused with one error line: inputs that share a size (a letter, or the
//     batch dims) given different sizes;
//   - no heap allocation on a second call on the same tape (ag_memory_stats);
//   - a repeated call replays bit for bit.
// It prints one line per check and a summary line "N passed, M failed".
//
// An input's shape is written with letters, digits and "...":
//     "... K"     any batch dims (the same for every input that has "..."), then a size K
//     "O I"       two dims: O and I are sizes shared by every input that names them
//     "B T 3"     a fixed size
//     ""          a 0-d tensor (a scalar)
// with at most AG_MAX_DIMS letters and sizes (1 to 65536) and one "..."; the cases give an
// input with "..." as many batch dims as fit beside its other dims (at most 2).
// `sizes` constrains letters: "E%2" (E a multiple of 2), "N>1" (N at least 2), separated
// by spaces. Example, y = x w^T + b:
//     static ag_tensor *build(ag_tape *tp, ag_tensor *const in[], const void *args) {
//         (void)args;
//         return ag_linear(tp, in[0], in[1], in[2]);
//     }
//     ag_op_spec spec = {"linear", build, NULL, 3, {{.name = "x", .dims = "... I"},
//                        {.name = "w", .dims = "O I"}, {.name = "b", .dims = "O"}}, ""};
//     ag_op_check(&spec, NULL, NULL);
// Every check builds the op through `build`, so the op is tested as users call it.
#ifndef ATTOGRAD_OP_CHECK_H
#define ATTOGRAD_OP_CHECK_H

#include <stdio.h>

#include "attograd/gradcheck.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ag_op_input_kind {
    AG_INPUT_FLOAT = 0,  // f32 or f64 (the dtype under test), requires grad: checked
    AG_INPUT_CONSTANT,   // f32 or f64, does not require grad (a target)
    AG_INPUT_MASK,       // bool, true with probability 1/3
    AG_INPUT_INDEX,      // i64, values in [0, size of the letter `below`)
    AG_INPUT_INDEX32,    // the same in i32 (token ids, class targets)
} ag_op_input_kind;

typedef struct ag_op_input {
    const char *name;       // for the report: "x", "weight"
    const char *dims;       // its shape, as above
    ag_op_input_kind kind;
    double lo, hi;          // float values uniform in [lo, hi); both 0: [-1, 1)
    bool fixed_range;       // the values keep their range in the large and tiny cases
                            // (a probability, a target in [0, 1])
    bool broadcast;         // may be given with size-1 dims or fewer leading dims
    char below;             // an index: the letter whose size bounds its values
} ag_op_input;

// Builds the op under test on tp from its inputs (in the order of ag_op_spec.in) and
// `args` (anything the op needs besides its inputs: a dim, eps); returns its output, or
// NULL after reporting an error (ag_error) as every op does.
typedef ag_tensor *(*ag_op_build)(ag_tape *tp, ag_tensor *const in[], const void *args);

typedef struct ag_op_spec {
    const char *name;
    ag_op_build build;
    const void *args;
    int n_in;
    ag_op_input in[AG_MAX_INPUTS];
    const char *sizes;      // constraints on the letters ("E%2 N>1"); NULL or "" for none
} ag_op_spec;

typedef struct ag_op_check_opts {
    uint64_t seed;              // for every value drawn
    double f32_vs_f64;          // normwise, output and gradients: 1e-5
    ag_gradcheck_opts grad;     // the float64 gradchecks (quiet is forced)
    FILE *out;                  // the report's lines; NULL: none
    // Twins for the tape check of an op of your own that handles both dtypes (as in
    // ag_tape_check_opts): {f32 op, f64 op} pairs. Built-in ops have theirs.
    const ag_op *const *f64_twins;
    int n_f64_twins;
} ag_op_check_opts;

// seed 0, f32_vs_f64 1e-5, ag_gradcheck_defaults(), out stdout.
ag_op_check_opts ag_op_check_defaults(void);

typedef struct ag_op_check_result {
    int passed, failed;
    char first_failure[256];  // "<check>: <what>" of the first check that failed, or ""
} ag_op_check_result;

// Runs every check on the op `spec` describes. While it runs, the errors of the calling
// thread (and of the pool's workers in its jobs) go to a handler of its own (a refusal is
// a result, not an abort), and the threads check runs the op as 1 and 2 threads would, on
// the calling thread; the process's handler and thread count are left alone, so several
// threads may each run a check at once. `opts` and `res` may be NULL. Returns true when no
// check failed.
bool ag_op_check(const ag_op_spec *spec, const ag_op_check_opts *opts, ag_op_check_result *res);

#ifdef __cplusplus
}
#endif
#endif
