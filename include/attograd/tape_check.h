// attograd/tape_check.h — which node is wrong? A gradient check of every node
// of a recorded tape, each on its own.
//
// ag_gradcheck says that a whole function's gradient is wrong; ag_tape_check
// says which node. For each node y = f(x_1, ..., x_n) on the tape it re-runs
// that node's forward on perturbed copies of its inputs and compares the differences
// with that node's backward applied to a random upstream gradient v (entries uniform in
// [-1, 1], fixed seed):
//   - a small node (at most max_elementwise differentiable input elements), element by
//     element: the difference of <v, f(x)> along e_k against (J^T v)_k;
//   - a larger one, for each differentiable input, along `directions` random directions
//     u (one by default): the difference of <v, f(x)> along u, which is v . J u, against
//     (J^T v) . u.
// In f64 each comparison first takes one forward run (a one-sided difference against the
// node's replayed output); only where that does not agree does it take the central
// difference (two runs) and, if still needed, a second one at eps / 16. A whole model's
// tape costs a few forward passes per node.
// The comparison is ag_gradcheck's (one finite-difference core for both; its reasoning
// is at the top of src/core/fd_check.c). A comparison passes when
//     |analytic - numeric| <= atol + rtol * max(|numeric|, 0.01 s) + rounding,
// where s is the comparison's own typical size: along a direction, the root of
// sum_k ((J^T v)_k u_k)^2, the standard deviation of (J^T v) . u over random u (which grows
// as sqrt(n), like the value compared, so the tolerance is as tight on a node of 4096
// elements as on one of 16); element by element, the root mean square of the input's
// gradient. It fails when the difference also exceeds what the one-sided differences say
// the function's kinks and rounding noise can explain; in between it is undecided. With
// the defaults (rtol 1e-4) a gradient scaled by 1.01 (1% too large or too small) is
// missed along a direction with probability about 1e-4, whatever the node's size, and an
// error of relative size 1% orthogonal to the gradient with 0.64%;
// ag_tape_check_strict() (rtol 1e-5) does the same for 0.1%.
//
// Verdicts: pass, FAIL, or inconclusive with its reason: the differences straddle a kink
// (relu at exactly 0, as in relu(relu(x)) or relu(x * mask); a tie in max), float32
// differences of an op without a twin are noisier than rtol_f32 (the noise level is
// given: name the op's f64 twin), an input holds a NaN, or nothing was compared. A failure
// names the input and, narrowed down by bisection for a direction, elements (index, what
// the differences expect, what backward gave), and the printout adds the op's rule.
//
// The input gradients start from random values rather than zero, so a backward
// that overwrites (=) instead of accumulating (+=) is caught too; and every
// output buffer starts as NaN, so a forward that leaves an element unwritten is.
//
// The tape is left as it was: the node's forward and backward run on a scratch
// copy of the node (its own output, input copies and gradients, and a private
// tape for whatever the op allocates or saves). What the node does not own is
// shared read-only: its params (so dropout, seeded by its params, replays the
// same mask), and its inputs that are not differentiated: inputs of dtype bool
// or integer (masks) and float inputs that do not require grad. A custom op
// (ag_op_apply with your forward and backward) is checked like a built-in one.
//
// Precision: differences are taken in float64. An f64 node runs as recorded.
// An f32 node of a built-in op is checked through the same op's f64 variant
// (its f64 twin, compiled from the same source): its inputs promoted to f64,
// the twin's backward against differences in f64 (eps, atol, rtol),
// and the f32 node's own output and input gradients against the twin's, from
// the same inputs, upstream gradient and starting gradients, normwise within
// f32_vs_f64 (a bug in code only the f32 variant runs shows there). A linear, matmul or
// attention node recorded under bf16 autocast (ag_tape_set_autocast) rounds its
// products' operands to bfloat16, which its twin does not: both then run from its
// inputs and upstream gradient rounded to bfloat16 (the differences too). Then a linear
// or matmul node still agrees within f32_vs_f64 (a product of bf16 values is exact in
// f32); an attention node within 3e-2 if f32_vs_f64 is smaller (it rounds its weights
// and score gradients inside, by bf16's rounding). An f32 op
// of your own has no twin: it is checked in float32 (eps_f32, atol_f32,
// rtol_f32) along directions_f32 random directions, enough to catch a missing
// factor, a wrong transpose or `=` for `+=` every time in the tests, though
// float32 differences can still hide an error of a percent or so, and where their
// noise exceeds rtol_f32 (inputs of large magnitude) the node is inconclusive: name your
// op's f64 twin in opts.f64_twins (or record it in AG_F64) for a check you can trust.
//
// Infinities: values that are equal in two runs (a masked -inf) differ by 0;
// an input element that is not finite is never perturbed (its gradient cannot
// be checked by differences: see fd.not_finite), and an output element that is
// infinite gets upstream gradient 0 (no small change of the inputs moves it).
// Domains: a step that makes an output non-finite where the node's own output
// is finite (log or sqrt of a value closer to 0 than eps, as in the entropy
// log(a + 1e-10) of a masked a = 0) is retried smaller (see fd.smaller_steps).
#ifndef ATTOGRAD_TAPE_CHECK_H
#define ATTOGRAD_TAPE_CHECK_H

#include <stdio.h>

#include "attograd/gradcheck.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ag_tape_check_opts {
    double eps, atol, rtol;              // differences in f64: 1e-6, 0, 1e-4
    double f32_vs_f64;                   // an f32 node against its f64 twin, normwise: 1e-4
    double eps_f32, atol_f32, rtol_f32;  // f32 nodes without a twin: 1e-3, 0, 1e-2
    uint64_t seed;                       // for v, the directions and the starting gradients
    int max_elementwise;                 // 64: nodes this small are checked element by element
    int directions;                      // 1: random directions per input of a larger node
    int directions_f32;                  // 16: the same, for an f32 node without a twin
    // Twins for your own ops (default none): n_f64_twins pairs {f32 op, the same op in
    // f64}, f64_twins[2 i] and f64_twins[2 i + 1]. An op whose forward and backward
    // handle both dtypes is its own twin: {&my_op, &my_op}.
    const ag_op *const *f64_twins;
    int n_f64_twins;
} ag_tape_check_opts;

ag_tape_check_opts ag_tape_check_defaults(void);
// The stricter setting: the defaults with rtol 1e-5 and eps 1e-7 (f32_vs_f64 stays 1e-4),
// which find a relative error of 0.1% as the defaults find 1%.
ag_tape_check_opts ag_tape_check_strict(void);

// The verdict on one node.
typedef struct ag_tape_check_entry {
    int index;              // position on the tape
    const char *op;         // the op's name
    const char *rule;       // the op's backward rule, or NULL
    char shapes[192];       // "[2,4,8] [24,8] [24] -> [2,4,24]"; an input not
                            // differentiated is in parentheses: "([4,4])"
    int inputs_checked;     // differentiable inputs
    ag_check_result fd;     // the verdict and what the differences found (input slots are
                            // the node's); forward_runs counts the replays too
    bool in_f64;            // differences taken in f64 (an f64 node, or an f32 node
                            // through its op's f64 twin)
    double f32_vs_f64;      // an f32 node checked through its twin: the largest normwise
                            // difference between the two, in the output or an input's
                            // gradient (-1 when there is no twin)
    int f32_vs_f64_input;   // where: the input slot, or -1 for the output
    bool f32_agrees;        // f32_vs_f64 is within opts.f32_vs_f64
    double replay_diff;     // max |replayed output - recorded output|: 0 unless an
                            // input changed since recording (then the check is of
                            // the node at its inputs' current values)
    double seconds;
} ag_tape_check_entry;

typedef struct ag_tape_check_report {
    int n_nodes;
    ag_tape_check_entry *nodes;  // n_nodes entries (free with ag_tape_check_report_free)
    ag_check_verdict verdict;    // FAIL if a node failed, else INCONCLUSIVE if one was
    int n_failed, n_inconclusive;
    int first_failure;           // index of the first failing node, -1 if none
    long forward_runs;           // over all nodes
    double seconds;
} ag_tape_check_report;

// Checks every node of `tp` (after a forward; a backward before it does not
// matter: the check uses its own gradients). The tape's values, gradients and
// saved state are left untouched. `opts` may be NULL for the defaults.
// Returns true when every node passed (report->verdict AG_CHECK_PASS); free the
// report with ag_tape_check_report_free.
bool ag_tape_check(ag_tape *tp, const ag_tape_check_opts *opts, ag_tape_check_report *report);
void ag_tape_check_report_free(ag_tape_check_report *report);

// One line per node (index, op, shapes, how it was checked, max abs and rel error,
// verdict), then a summary; for each node that failed or was inconclusive, why, and
// for a failure the elements (index, expected, got) and the op's rule. The report of
// a refused call (bad options, a NULL tape) prints one line saying so.
void ag_tape_check_print(const ag_tape_check_report *report, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
