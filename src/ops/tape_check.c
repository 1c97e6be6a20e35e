// A gradient check of every node of a tape, each on its own (see attograd/tape_check.h).
//
// A node is re-run only through its op's forward and backward, on a scratch copy of the
// node (node_replay.h): the real node, its output, its inputs' values and gradients are
// only read. The comparisons are the finite-difference core's (src/core/fd_check.c). The
// one thing this file knows of the ops is which f64 op is the twin of a built-in f32 op
// (agi_op_f64): an f32 node is checked through it (from bf16 inputs for a node of an op
// whose products follow autocast, recorded under it: agi_node_autocast).
#include <math.h>
#include <string.h>

#include "../core/fd_check.h"
#include "../kernels/bf16_gemm.h"
#include "attograd/tape_check.h"
#include "node_replay.h"
#include "op.h"

// An f32 attention node recorded under bf16 autocast against its f64 twin, normwise,
// both from inputs already in bf16: the node still rounds what it computes inside to bf16
// for its products (the weights and the score gradients), a relative error of up to 2^-8
// each; several times that leaves room for cancellation in the sums and still finds a
// gradient a few percent off, or a wrong transpose. A linear or matmul node rounds nothing
// inside (a product of two bf16 values is exact in f32), so it keeps f32_vs_f64.
#define AGI_BF16_VS_F64 3e-2

ag_tape_check_opts ag_tape_check_defaults(void) {
    return (ag_tape_check_opts){.eps = 1e-6, .atol = 0, .rtol = 1e-4, .f32_vs_f64 = 1e-4,
                                .eps_f32 = 1e-3, .atol_f32 = 0, .rtol_f32 = 1e-2,
                                .seed = 0, .max_elementwise = 64, .directions = 1,
                                .directions_f32 = 16};
}

ag_tape_check_opts ag_tape_check_strict(void) {
    ag_tape_check_opts o = ag_tape_check_defaults();
    o.eps = 1e-7;
    o.rtol = 1e-5;
    return o;
}

// The core's view of a replay: a forward at the copy's current input values, into one of
// two outputs (a central difference holds both at once).
typedef struct {
    agi_replay *s;
    ag_tensor out[2];
} runs;

static const ag_tensor *run_for_core(void *ctx, int which) {
    runs *r = ctx;
    agi_replay_forward(r->s, r->out[which].data);
    r->s->runs--;  // the core counts its own runs
    return &r->out[which];
}

// max_i |a_i - b_i| / max_i |b_i| (or the difference alone when b is 0), added up pair by
// pair; infinite for a NaN or an infinity the other side does not match. `slack` is
// subtracted from |a_i - b_i| first: what storage rounding alone explains.
typedef struct {
    double diff, scale;
} normwise;

// Written as selects, not branches: these loops run over every output and gradient.
static inline normwise normwise_add(normwise e, double a, double b, double slack) {
    double d = a == b ? 0 : fabs(a - b);
    d = d < INFINITY ? d - slack : INFINITY;  // a NaN too
    double s = fabs(b);
    e.diff = d > e.diff ? d : e.diff;
    e.scale = s > e.scale && s < INFINITY ? s : e.scale;
    return e;
}

static double normwise_result(normwise e) { return e.scale > 0 ? e.diff / e.scale : e.diff; }

// "[2,4,8] ([4,4]) -> [2,4,8]": the node's shapes, non-differentiated inputs in parentheses.
static void describe(const ag_node *n, const bool diff[], char *buf, size_t size) {
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k <= n->n_in; k++) {
        const ag_tensor *t = k < n->n_in ? n->in[k] : n->out;
        char sh[64];
        ag_tensor_shape_str(t, sh, sizeof sh);
        const char *fmt = k == n->n_in ? "-> %s" : diff[k] ? "%s " : "(%s) ";
        if (len < size) len += (size_t)snprintf(buf + len, size - len, fmt, sh);
    }
}

// The f32 node s32 against its f64 twin s64, run from the same inputs, upstream gradient
// and starting gradients: the output, then each input's gradient, normwise. Records the
// worst in e (input -1: the output). An f32 gradient holds start + (J^T v), rounded once:
// an error of up to an ulp of that sum is storage, not the op.
static void compare_with_twin(const agi_replay *s32, const agi_replay *s64, const ag_node *n,
                              double *const start[], ag_tape_check_entry *e) {
    normwise out = {0, 0};
    for (size_t j = 0; j < s32->out.numel; j++)
        out = normwise_add(out, agi_fd_get(&s32->out, s32->y, j),
                           agi_fd_get(&s64->out, s64->y, j), 0);
    e->f32_vs_f64 = normwise_result(out);
    for (int k = 0; k < n->n_in; k++) {
        if (!s32->diff[k]) continue;
        normwise g = {0, 0};
        for (size_t i = 0; i < s32->in[k].numel; i++)
            g = normwise_add(g, s32->ana[k][i], s64->ana[k][i],
                             0x1p-24 * fabs(start[k][i] + s64->ana[k][i]));
        double err = normwise_result(g);
        if (!(err <= e->f32_vs_f64)) {
            e->f32_vs_f64 = err;
            e->f32_vs_f64_input = k;
        }
    }
}

// The f64 twin of an f32 op: a built-in's, or one the options name; NULL if none.
static const ag_op *f64_twin(const ag_op *op, const ag_tape_check_opts *o) {
    const ag_op *twin = agi_op_f64(op);
    for (int i = 0; !twin && o->f64_twins && i < o->n_f64_twins; i++)
        if (o->f64_twins[2 * i] == op) twin = o->f64_twins[2 * i + 1];
    return twin;
}

// The finite differences of replayed node s (its analytic gradients already in s->ana),
// from the upstream gradient its backward read, around its replayed output; `moved`: its
// inputs are no longer the node's (rounded to bf16).
static void differences(agi_replay *s, const ag_node *n, const ag_tape_check_opts *o, bool f64,
                        bool moved, ag_pcg32 *g, ag_check_result *fd) {
    size_t m = s->out.numel;
    ag_tensor y0 = s->out;
    y0.data = s->y;
    runs r = {s, {s->out, s->out}};
    for (int w = 0; w < 2; w++)
        r.out[w].data = ag_tape_alloc(s->buffers, agi_replay_bytes(&s->out));
    agi_fd_input in[AG_MAX_INPUTS];
    int n_in = 0;
    for (int k = 0; k < s->node.n_in; k++)
        if (s->diff[k])
            in[n_in++] = (agi_fd_input){&s->in[k], k, s->ana[k], moved ? NULL : n->in[k]};
    ag_tensor v = s->out;  // the upstream gradient, as backward read it
    v.data = s->out.grad;
    agi_fd_fn f = {run_for_core, &r, n_in, in, m, &v, &y0};
    agi_fd_opts fo = {f64 ? o->eps : o->eps_f32, f64 ? o->atol : o->atol_f32,
                      f64 ? o->rtol : o->rtol_f32, o->max_elementwise,
                      f64 ? o->directions : o->directions_f32, true};
    agi_fd_check(&f, &fo, g, s->buffers, fd);
}

// The built-in ops whose products follow the tape's autocast (ag_tape_set_autocast), and
// whether they also round what they compute inside to bf16 (attention's weights and score
// gradients), which puts them under AGI_BF16_VS_F64 rather than f32_vs_f64.
typedef struct {
    const ag_op *op;
    bool rounds_inside;
} autocast_op;

static const autocast_op *autocast_op_of(const ag_op *op) {
    static const autocast_op ops[] = {{&agi_linear_op_f32, false},
                                      {&agi_matmul_op_f32, false},
                                      {&agi_attention_op_f32, true},
                                      {&agi_attention_packed_op_f32, true}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (ops[i].op == op) return &ops[i];
    return NULL;
}

// x as the products of a node under bf16 autocast see it: rounded to bfloat16.
static double bf16_of(double x) { return agi_bf16_value(agi_bf16_round((float)x)); }

// The float inputs of replay s rounded to bfloat16: in place for those it differentiates
// (its own copies), into copies in `buffers` for the others (shared with the node).
static void round_inputs_to_bf16(agi_replay *s, ag_tape *buffers) {
    for (int k = 0; k < s->node.n_in; k++) {
        ag_tensor *x = &s->in[k];
        if (!agi_is_float(x->dtype)) continue;
        const void *from = x->data;
        if (!s->diff[k]) x->data = ag_tape_alloc(buffers, agi_replay_bytes(x));
        for (size_t i = 0; i < x->numel; i++)
            agi_fd_set(x, x->data, i, bf16_of(agi_fd_get(x, from, i)));
    }
}

static void check_node(const ag_node *n, ag_tape *scratch_tape, ag_tape *buffers,
                       const ag_tape_check_opts *o, ag_tape_check_entry *e) {
    double start = agi_seconds_now();
    memset(e, 0, sizeof *e);
    agi_fd_result_init(&e->fd);
    e->index = n->index;
    e->op = n->op->name ? n->op->name : "?";
    e->rule = n->op->rule;
    e->f32_vs_f64 = -1;  // no f64 twin to compare with
    e->f32_vs_f64_input = -1;
    ag_tape_reset(buffers);

    const ag_dtype dt = n->out->dtype;
    const ag_op *twin = dt == AG_F32 ? f64_twin(n->op, o) : NULL;
    e->in_f64 = dt == AG_F64 || twin;
    agi_replay s, s64;  // the node as recorded; its f64 twin
    agi_replay_init(&s, n, n->op, dt, scratch_tape, buffers);
    for (int k = 0; k < n->n_in; k++) e->inputs_checked += s.diff[k];
    describe(n, s.diff, e->shapes, sizeof e->shapes);
    bool nan = false;
    for (int k = 0; k < n->n_in && !nan; k++) nan = agi_fd_nan_inputs(&e->fd, k, n->in[k]);
    if (!n->op->backward || (twin && (!twin->forward || !twin->backward))) {
        bool own = !n->op->backward;
        agi_fd_fail(&e->fd, "the op%s has no %s", own ? "" : "'s f64 twin",
                    !own && !twin->forward ? "forward" : "backward");
    }
    if (nan || e->fd.verdict == AG_CHECK_FAIL) {
        e->seconds = agi_seconds_now() - start;
        return;
    }
    // One stream per node: a node's check does not depend on which others ran.
    ag_pcg32 g = ag_pcg32_make(o->seed, 0x7461706563686bULL + (uint64_t)n->index);

    // The replay: the values backward needs (and saves) come from this forward.
    agi_replay_forward(&s, s.y);
    e->replay_diff = agi_replay_diff(&s, n->out);
    // Under bf16 autocast the node's products round their operands, which its f64 twin
    // (f64 ignores autocast) does not. Both run from inputs (all of them: a key that does
    // not require grad is an operand too) and an upstream gradient already in bfloat16,
    // so that they differ by the rounding of what the node computes inside (scores,
    // weights, gradients) and not by its inputs' rounding, which a peaked softmax can
    // amplify without bound.
    const autocast_op *ac = autocast_op_of(n->op);
    const bool bf16 = twin && ac && agi_node_autocast(n) == AG_AUTOCAST_BF16;
    if (bf16) {
        round_inputs_to_bf16(&s, buffers);
        agi_replay_forward(&s, s.y);
    }
    // Backward from a random upstream gradient, into input gradients that start random
    // too: a backward that assigns instead of accumulating then shows. An output that is
    // infinite (log_softmax of a masked -inf) stays so under any small change of the inputs,
    // so differences see none of its sensitivity: its upstream gradient is 0, for the
    // backward to be compared with what differences can see. Both are rounded to the
    // node's dtype, so that an f64 twin starts from the very same numbers.
    double *starts[AG_MAX_INPUTS] = {0};
    for (size_t j = 0; j < s.out.numel; j++) {
        double r = agi_fd_uniform(&g);  // drawn for every element: the stream stays aligned
        agi_fd_set(&s.out, s.out.grad, j,
                   isinf(agi_fd_get(&s.out, s.y, j)) ? 0 : bf16 ? bf16_of(r) : r);
    }
    for (int k = 0; k < n->n_in; k++) {
        if (!s.diff[k]) continue;
        starts[k] = ag_tape_alloc(buffers, s.in[k].numel * sizeof *starts[k]);
        for (size_t i = 0; i < s.in[k].numel; i++) {
            double r = agi_fd_uniform(&g);
            starts[k][i] = dt == AG_F32 ? (double)(float)r : r;
        }
    }
    agi_replay_backward(&s, starts);

    agi_replay *checked = &s;  // the node whose backward is compared with differences
    if (twin) {
        // The same op in f64 on the same inputs, then its backward from the same numbers;
        // the f32 node must agree with it, and it must agree with differences in f64.
        agi_replay_init(&s64, n, twin, AG_F64, scratch_tape, buffers);
        if (bf16) round_inputs_to_bf16(&s64, buffers);
        agi_replay_forward(&s64, s64.y);
        for (size_t j = 0; j < s.out.numel; j++)
            agi_fd_set(&s64.out, s64.out.grad, j, agi_fd_get(&s.out, s.out.grad, j));
        agi_replay_backward(&s64, starts);
        compare_with_twin(&s, &s64, n, starts, e);
        const bool inside = bf16 && ac->rounds_inside;
        const double tol = inside && o->f32_vs_f64 < AGI_BF16_VS_F64 ? AGI_BF16_VS_F64
                                                                    : o->f32_vs_f64;
        const char *what = inside ? "bf16 autocast bound" : "f32_vs_f64";
        e->f32_agrees = e->f32_vs_f64 <= tol;
        if (!e->f32_agrees) {
            if (e->f32_vs_f64_input < 0)
                agi_fd_fail(&e->fd, "its f32 output differs from its f64 twin's by %.2e "
                            "(normwise, more than %s %.0e)", e->f32_vs_f64, what, tol);
            else
                agi_fd_fail(&e->fd, "its f32 gradient of input %d differs from its f64 "
                            "twin's by %.2e (normwise, more than %s %.0e)",
                            e->f32_vs_f64_input, e->f32_vs_f64, what, tol);
        }
        checked = &s64;
    }
    differences(checked, n, o, e->in_f64, bf16, &g, &e->fd);
    e->fd.forward_runs += s.runs + (twin ? s64.runs : 0);
    ag_tape_reset(scratch_tape);
    e->seconds = agi_seconds_now() - start;
}

bool ag_tape_check(ag_tape *tp, const ag_tape_check_opts *opts, ag_tape_check_report *r) {
    ag_tape_check_opts o = opts ? *opts : ag_tape_check_defaults();
    if (!r) {
        ag_error("tape_check: report is NULL");
        return false;
    }
    memset(r, 0, sizeof *r);
    r->first_failure = -1;
    r->verdict = AG_CHECK_FAIL;  // until the nodes say otherwise
    if (!agi_given(tp, "tape_check", "tape")) return false;
    char why[256];
    if (agi_tape_params_changed(tp, why, sizeof why)) {
        ag_error("tape_check: %s", why);
        return false;
    }
    if (!agi_fd_steps_ok(o.eps, o.atol, o.rtol) ||
        !agi_fd_steps_ok(o.eps_f32, o.atol_f32, o.rtol_f32) || !(o.f32_vs_f64 >= 0)) {
        ag_error("tape_check: eps must be finite and > 0 and tolerances finite and >= 0, got "
                 "eps %g atol %g rtol %g f32_vs_f64 %g (f32: eps %g atol %g rtol %g)",
                 o.eps, o.atol, o.rtol, o.f32_vs_f64, o.eps_f32, o.atol_f32, o.rtol_f32);
        return false;
    }
    if (o.directions < 1 || o.directions_f32 < 1 || o.max_elementwise < 0) {
        ag_error("tape_check: directions and directions_f32 must be >= 1 and max_elementwise "
                 ">= 0, got %d, %d and %d", o.directions, o.directions_f32, o.max_elementwise);
        return false;
    }
    if (o.n_f64_twins < 0 || (o.n_f64_twins > 0 && !o.f64_twins)) {
        ag_error("tape_check: %d f64 twins given with f64_twins %s", o.n_f64_twins,
                 o.f64_twins ? "set" : "NULL");
        return false;
    }
    double start = agi_seconds_now();
    r->n_nodes = ag_tape_num_nodes(tp);
    r->nodes = agi_calloc((size_t)(r->n_nodes ? r->n_nodes : 1) * sizeof *r->nodes);
    ag_tape *scratch_tape = ag_tape_new(), *buffers = ag_tape_new();
    for (int i = 0; i < r->n_nodes; i++) {
        ag_tape_check_entry *e = &r->nodes[i];
        check_node(ag_tape_node(tp, i), scratch_tape, buffers, &o, e);
        r->forward_runs += e->fd.forward_runs;
        if (e->fd.verdict == AG_CHECK_FAIL) {
            if (r->first_failure < 0) r->first_failure = i;
            r->n_failed++;
        }
        r->n_inconclusive += e->fd.verdict == AG_CHECK_INCONCLUSIVE;
    }
    ag_tape_free(scratch_tape);
    ag_tape_free(buffers);
    r->verdict = r->n_failed ? AG_CHECK_FAIL
                 : r->n_inconclusive || r->n_nodes == 0 ? AG_CHECK_INCONCLUSIVE
                                                        : AG_CHECK_PASS;
    r->seconds = agi_seconds_now() - start;
    return r->verdict == AG_CHECK_PASS;
}

void ag_tape_check_report_free(ag_tape_check_report *r) {
    if (!r) return;
    agi_free(r->nodes);
    r->nodes = NULL;
    r->n_nodes = 0;
}

// The why of a node that did not pass: its reason, its named elements, its rule.
static void print_details(const ag_tape_check_entry *e, FILE *f) {
    fprintf(f, "#%d %s %s: %s: %s\n", e->index, e->op, e->shapes,
            ag_check_verdict_name(e->fd.verdict), e->fd.reason);
    for (int b = 0; b < e->fd.n_bad; b++) {
        const ag_check_element *el = &e->fd.bad[b];
        fprintf(f, "  input %d element %s: expected %.10g, got %.10g\n", el->input, el->at,
                el->expected, el->got);
    }
    if (e->fd.verdict == AG_CHECK_FAIL && e->rule)
        fprintf(f, "  its backward should do: %s\n", e->rule);
}

void ag_tape_check_print(const ag_tape_check_report *r, FILE *f) {
    if (!agi_given(r, "tape_check_print", "report") ||
        !agi_given(f, "tape_check_print", "stream"))
        return;
    if (!r->nodes && r->verdict != AG_CHECK_PASS) {  // a refused call: no table to read as one
        fputs("tape check: refused, nothing was checked (see the error it reported)\n", f);
        return;
    }
    fprintf(f, "tape check: %d node%s, %d failed, %d inconclusive; %ld forward runs in %.3g s\n",
            r->n_nodes, r->n_nodes == 1 ? "" : "s", r->n_failed, r->n_inconclusive,
            r->forward_runs, r->seconds);
    fprintf(f, "  %-4s %-16s %-40s %-9s %-3s %5s %9s %9s %8s %8s\n", "#", "op", "shapes",
            "checked", "in", "runs", "max abs", "max rel", "f32 err", "ms");
    for (int i = 0; i < r->n_nodes; i++) {
        const ag_tape_check_entry *e = &r->nodes[i];
        char how[16], f32[16] = "-";
        snprintf(how, sizeof how, "%d %s", e->fd.comparisons, e->fd.elementwise ? "elem" : "dirs");
        if (e->f32_vs_f64 >= 0) snprintf(f32, sizeof f32, "%.1e", e->f32_vs_f64);
        fprintf(f, "  %-4d %-16s %-40s %-9s %-3s %5d %9.2e %9.2e %8s %8.2f  %s", e->index,
                e->op, e->shapes, how, e->in_f64 ? "f64" : "f32", e->fd.forward_runs,
                e->fd.max_abs_err, e->fd.max_rel_err, f32, 1e3 * e->seconds,
                e->fd.verdict == AG_CHECK_PASS ? "ok" : ag_check_verdict_name(e->fd.verdict));
        if (e->replay_diff != 0)
            fprintf(f, "  (replayed output differs from the tape's by %.2e)", e->replay_diff);
        fputs("\n", f);
    }
    if (r->verdict == AG_CHECK_PASS) {
        fputs("every node passed\n", f);
        return;
    }
    if (r->first_failure >= 0)
        fprintf(f, "first failing node: #%d %s\n", r->first_failure,
                r->nodes[r->first_failure].op);
    for (int i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].fd.verdict != AG_CHECK_PASS) print_details(&r->nodes[i], f);
}
