// A gradient check of every node of a tape, each on its own (see attograd/tape_check.h).
//
// A node is re-run only through its op's forward and backward, on a scratch copy of the
// node (node_replay.h): the real node, its output, its inputs' values and gradients are
// only read. The one thing this file knows of the ops is which f64 op is the twin of a
// built-in f32 op (agi_op_f64): an f32 node is checked through it.
#include <math.h>
#include <string.h>

#include "attograd/tape_check.h"
#include "node_replay.h"
#include "op.h"

ag_tape_check_opts ag_tape_check_defaults(void) {
    return (ag_tape_check_opts){.eps = 1e-6, .atol = 1e-5, .rtol = 1e-3, .f32_vs_f64 = 1e-4,
                                .eps_f32 = 1e-3, .atol_f32 = 1e-3, .rtol_f32 = 1e-2,
                                .seed = 0, .max_elementwise = 64, .directions = 2,
                                .directions_f32 = 16};
}

static double uniform(ag_pcg32 *g) { return 2.0 * ag_pcg32_double(g) - 1.0; }

// a - b, except that equal values differ by 0: a masked score is -inf in every run, and
// -inf - -inf would be NaN. A NaN never equals anything, so it stays NaN.
static double difference(double a, double b) { return a == b ? 0 : a - b; }

// <v, y_plus - y_minus>, in double.
static double v_dot_diff(const agi_replay *s) {
    double sum = 0;
    for (size_t j = 0; j < s->out.numel; j++)
        sum += s->v[j] * difference(agi_replay_get(&s->out, s->y_plus, j),
                                    agi_replay_get(&s->out, s->y_minus, j));
    return sum;
}

// max_i |a_i - b_i| / max_i |b_i| (or the difference alone when b is 0); infinite for a NaN
// or an infinity the other side does not match. `slack`, when not NULL, is subtracted from
// each |a_i - b_i| first: what storage rounding alone explains.
static double normwise(const double *a, const double *b, const double *slack, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(difference(a[i], b[i]));
        if (isnan(d) || isinf(d)) return INFINITY;
        if (slack) d = fmax(0, d - slack[i]);
        diff = fmax(diff, d);
        if (isfinite(b[i])) scale = fmax(scale, fabs(b[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

typedef struct {
    double eps, atol, rtol;
    double worst_ratio;  // largest err / tol so far, to pick the worst comparison
} tally;

static void compare(ag_tape_check_entry *e, tally *t, int slot, double num, double ana,
                    double scale) {
    double err = fabs(ana - num), tol = t->atol + t->rtol * scale;
    double rel = err / fmax(scale, 1e-300);
    bool pass = err <= tol;  // false for NaN too
    if (!pass) e->ok = false;
    e->comparisons++;
    // A NaN anywhere stays NaN in the maxima.
    if (isnan(err) || isnan(e->max_abs_err)) e->max_abs_err = NAN;
    else if (err > e->max_abs_err) e->max_abs_err = err;
    if (isnan(rel) || isnan(e->max_rel_err)) e->max_rel_err = NAN;
    else if (rel > e->max_rel_err) e->max_rel_err = rel;
    double ratio = pass ? err / tol : INFINITY;
    if (ratio > t->worst_ratio || e->worst_input < 0) {
        t->worst_ratio = ratio;
        e->worst_input = slot;
        e->worst_numeric = num;
        e->worst_analytic = ana;
    }
}

// A step that leaves the function's domain shows as an output that the node's own output
// has finite and a perturbed run has not: log or sqrt of a value closer to 0 than the step
// (the entropy's log(a + 1e-10) where attention is masked).
static bool left_domain(const agi_replay *s) {
    for (size_t j = 0; j < s->out.numel; j++)
        if (isfinite(agi_replay_get(&s->out, s->y, j)) &&
            (!isfinite(agi_replay_get(&s->out, s->y_plus, j)) ||
             !isfinite(agi_replay_get(&s->out, s->y_minus, j))))
            return true;
    return false;
}

// Sets input k to its unperturbed value plus h u (the whole direction u), or with u NULL
// plus h at element i alone. With `held`, stores what storage holds after rounding.
static void place(agi_replay *s, int k, const double *u, size_t i, double h, double *held) {
    ag_tensor *x = &s->in[k];
    const ag_tensor *x0 = s->x0[k];
    if (!u) {
        agi_replay_set(x, x->data, i, agi_replay_get(x0, x0->data, i) + h);
        if (held) held[0] = agi_replay_get(x, x->data, i);
        return;
    }
    for (size_t j = 0; j < x->numel; j++) {
        agi_replay_set(x, x->data, j, agi_replay_get(x0, x0->data, j) + h * u[j]);
        if (held) held[j] = agi_replay_get(x, x->data, j);
    }
}

enum { SHRINKS = 7 };  // a step 16^7 (about 3e8) times smaller at most

// The two runs of a central difference along u (or element i) into y_plus and y_minus.
// A step that leaves the domain is retried 16 times smaller; the first that stays inside
// is then made 256 times smaller still, so that the boundary's curvature (1/x^2 for log
// at x) does not show in the difference. Returns the step; `held` as for place().
static double two_runs(agi_replay *s, ag_tape_check_entry *e, int k, const double *u, size_t i,
                       double eps, double *held) {
    double h = eps;
    for (int shrink = 0;; shrink++) {
        place(s, k, u, i, h, held);
        agi_replay_forward(s, s->y_plus);
        place(s, k, u, i, -h, NULL);
        agi_replay_forward(s, s->y_minus);
        if (!left_domain(s)) {
            if (shrink == 0) return h;
            break;
        }
        if (shrink == SHRINKS) return h;  // an unbounded derivative: the NaN shows
        h /= 16;
    }
    h /= 256;
    e->smaller_steps++;
    place(s, k, u, i, h, held);
    agi_replay_forward(s, s->y_plus);
    place(s, k, u, i, -h, NULL);
    agi_replay_forward(s, s->y_minus);
    return h;
}

// Element by element: 2 forwards per finite element of every differentiated input (an
// infinite one, a masked score, has no neighbourhood to difference over).
static void check_elementwise(agi_replay *s, ag_tape_check_entry *e, tally *t) {
    for (int k = 0; k < s->node.n_in; k++) {
        if (!s->diff[k]) continue;
        ag_tensor *x = &s->in[k];
        const ag_tensor *x0 = s->x0[k];
        for (size_t i = 0; i < x->numel; i++) {
            if (!isfinite(agi_replay_get(x0, x0->data, i))) continue;
            double xp;  // what f32 storage actually holds
            two_runs(s, e, k, NULL, i, t->eps, &xp);
            double xm = agi_replay_get(x, x->data, i);
            agi_replay_set(x, x->data, i, agi_replay_get(x0, x0->data, i));
            double num = v_dot_diff(s) / (xp - xm);
            compare(e, t, k, num, s->ana[k][i], fabs(num));
        }
    }
}

// Along random directions u, input by input: 2 forwards per direction. u is 0 on the
// elements that are not finite: they stay as they are.
static void check_directions(agi_replay *s, ag_tape_check_entry *e, tally *t, int directions,
                             ag_pcg32 *g) {
    for (int k = 0; k < s->node.n_in; k++) {
        if (!s->diff[k]) continue;
        ag_tensor *x = &s->in[k];
        const ag_tensor *x0 = s->x0[k];
        double *u = ag_tape_alloc(s->buffers, 2 * x->numel * sizeof *u), *xp = u + x->numel;
        for (int d = 0; d < directions; d++) {
            for (size_t i = 0; i < x->numel; i++) {
                double r = uniform(g);  // drawn for every element: the stream stays aligned
                u[i] = isfinite(agi_replay_get(x0, x0->data, i)) ? r : 0;
            }
            double h = two_runs(s, e, k, u, 0, t->eps, xp);
            // The step actually taken is what storage holds: in f32, x +- h u round,
            // so the direction is (x+ - x-) / 2 h, u only approximately.
            double ana = 0, scale = 0;
            for (size_t i = 0; i < x->numel; i++) {
                if (u[i] == 0) continue;  // inf - inf would make the weight NaN
                double w = (xp[i] - agi_replay_get(x, x->data, i)) / (2 * h);
                ana += s->ana[k][i] * w;
                scale += fabs(s->ana[k][i] * w);
            }
            double num = v_dot_diff(s) / (2 * h);
            compare(e, t, k, num, ana, fmax(fabs(num), scale));
        }
        memcpy(x->data, x0->data, agi_replay_bytes(x));
    }
}

// "[2,4,8] ([4,4]) -> [2,4,8]": the node's shapes, non-differentiated inputs in parentheses.
static void describe(const ag_node *n, const bool diff[], char *buf, size_t size) {
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k <= n->n_in; k++) {
        const ag_tensor *t = k < n->n_in ? n->in[k] : n->out;
        char sh[64];
        ag_shape_str(t, sh, sizeof sh);
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
    size_t m = s32->out.numel;
    double *y32 = ag_tape_alloc(s32->buffers, 2 * m * sizeof *y32), *y64 = y32 + m;
    for (size_t j = 0; j < m; j++) {
        y32[j] = agi_replay_get(&s32->out, s32->y, j);
        y64[j] = agi_replay_get(&s64->out, s64->y, j);
    }
    e->f32_vs_f64 = normwise(y32, y64, NULL, m);
    for (int k = 0; k < n->n_in; k++) {
        if (!s32->diff[k]) continue;
        m = s32->in[k].numel;
        double *slack = ag_tape_alloc(s32->buffers, m * sizeof *slack);
        for (size_t i = 0; i < m; i++)
            slack[i] = 0x1p-24 * fabs(start[k][i] + s64->ana[k][i]);
        double err = normwise(s32->ana[k], s64->ana[k], slack, m);
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

static void check_node(const ag_node *n, ag_tape *scratch_tape, ag_tape *buffers,
                       const ag_tape_check_opts *o, ag_tape_check_entry *e) {
    double start = agi_seconds_now();
    memset(e, 0, sizeof *e);
    e->index = n->index;
    e->op = n->op->name ? n->op->name : "?";
    e->rule = n->op->rule;
    e->worst_input = -1;
    e->f32_vs_f64 = -1;  // no f64 twin to compare with
    e->f32_vs_f64_input = -1;
    e->ok = true;
    ag_tape_reset(buffers);

    const ag_dtype dt = n->out->dtype;
    const ag_op *twin = dt == AG_F32 ? f64_twin(n->op, o) : NULL;
    e->in_f64 = dt == AG_F64 || twin;
    agi_replay s, s64;  // the node as recorded; its f64 twin
    agi_replay_init(&s, n, n->op, dt, scratch_tape, buffers);
    size_t total = 0;
    for (int k = 0; k < n->n_in; k++) {
        if (!s.diff[k]) continue;
        const ag_tensor *x = n->in[k];
        total += x->numel;
        for (size_t i = 0; i < x->numel; i++)
            e->not_finite += !isfinite(agi_replay_get(x, x->data, i));
        e->inputs_checked++;
    }
    describe(n, s.diff, e->shapes, sizeof e->shapes);
    if (!n->op->backward || (twin && (!twin->forward || !twin->backward))) {
        bool own = !n->op->backward;
        snprintf(e->note, sizeof e->note, "the op%s has no %s", own ? "" : "'s f64 twin",
                 !own && !twin->forward ? "forward" : "backward");
        e->ok = false;
        e->forward_runs = 0;
        e->seconds = agi_seconds_now() - start;
        return;
    }
    // One stream per node: a node's check does not depend on which others ran.
    ag_pcg32 g = ag_pcg32_make(o->seed, 0x7461706563686bULL + (uint64_t)n->index);

    // The replay: the values backward needs (and saves) come from this forward.
    agi_replay_forward(&s, s.y);
    e->replay_diff = agi_replay_diff(&s, n->out);
    // Backward from a random upstream gradient, into input gradients that start random
    // too: a backward that assigns instead of accumulating then shows. An output that is
    // infinite (log_softmax of a masked -inf) stays so under any small change of the inputs,
    // so differences see none of its sensitivity: its upstream gradient is 0, for the
    // backward to be compared with what differences can see. Both are rounded to the
    // node's dtype, so that an f64 twin starts from the very same numbers.
    double *v = ag_tape_alloc(buffers, s.out.numel * sizeof *v);
    double *starts[AG_MAX_INPUTS] = {0};
    for (size_t j = 0; j < s.out.numel; j++) {
        double r = uniform(&g);
        v[j] = isinf(agi_replay_get(&s.out, s.y, j)) ? 0 : dt == AG_F32 ? (double)(float)r : r;
    }
    for (int k = 0; k < n->n_in; k++) {
        if (!s.diff[k]) continue;
        starts[k] = ag_tape_alloc(buffers, s.in[k].numel * sizeof *starts[k]);
        for (size_t i = 0; i < s.in[k].numel; i++) {
            double r = uniform(&g);
            starts[k][i] = dt == AG_F32 ? (double)(float)r : r;
        }
    }
    agi_replay_backward(&s, v, starts);

    agi_replay *checked = &s;  // the node whose backward is compared with differences
    tally t = {o->eps, o->atol, o->rtol, -1};
    int directions = o->directions;
    if (twin) {
        // The same op in f64 on the same inputs, then its backward from the same numbers;
        // the f32 node must agree with it, and it must agree with differences in f64.
        agi_replay_init(&s64, n, twin, AG_F64, scratch_tape, buffers);
        agi_replay_forward(&s64, s64.y);
        agi_replay_backward(&s64, v, starts);
        compare_with_twin(&s, &s64, n, starts, e);
        e->f32_agrees = e->f32_vs_f64 <= o->f32_vs_f64;
        if (!e->f32_agrees) e->ok = false;
        checked = &s64;
    } else if (dt == AG_F32) {
        // An f32 op of your own: float32 differences, along more directions, since one
        // direction can hide a wrong gradient in float32 noise by chance.
        t = (tally){o->eps_f32, o->atol_f32, o->rtol_f32, -1};
        directions = o->directions_f32;
    }
    e->elementwise = total <= (size_t)(o->max_elementwise > 0 ? o->max_elementwise : 0);
    if (e->elementwise)
        check_elementwise(checked, e, &t);
    else
        check_directions(checked, e, &t, directions > 0 ? directions : 1, &g);

    e->forward_runs = s.runs + (twin ? s64.runs : 0);
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
    if (!tp) {
        ag_error("tape_check: tape is NULL");
        return false;
    }
    if (!(o.eps > 0 && o.eps_f32 > 0 && isfinite(o.eps) && isfinite(o.eps_f32)) ||
        !(o.atol >= 0 && o.rtol >= 0 && o.atol_f32 >= 0 && o.rtol_f32 >= 0 &&
          o.f32_vs_f64 >= 0)) {
        ag_error("tape_check: eps must be finite and > 0 and tolerances >= 0, got eps %g "
                 "atol %g rtol %g f32_vs_f64 %g (f32: eps %g atol %g rtol %g)",
                 o.eps, o.atol, o.rtol, o.f32_vs_f64, o.eps_f32, o.atol_f32, o.rtol_f32);
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
        r->forward_runs += e->forward_runs;
        if (!e->ok) {
            if (r->first_failure < 0) r->first_failure = i;
            r->n_failed++;
        }
    }
    ag_tape_free(scratch_tape);
    ag_tape_free(buffers);
    r->ok = r->n_failed == 0;
    r->seconds = agi_seconds_now() - start;
    return r->ok;
}

void ag_tape_check_report_free(ag_tape_check_report *r) {
    if (!r) return;
    agi_free(r->nodes);
    r->nodes = NULL;
    r->n_nodes = 0;
}

void ag_tape_check_print(const ag_tape_check_report *r, FILE *f) {
    fprintf(f, "tape check: %d node%s, %d failed; %ld forward runs in %.3g s\n", r->n_nodes,
            r->n_nodes == 1 ? "" : "s", r->n_failed, r->forward_runs, r->seconds);
    fprintf(f, "  %-4s %-16s %-40s %-9s %-3s %5s %9s %9s %8s %8s\n", "#", "op", "shapes",
            "checked", "in", "runs", "max abs", "max rel", "f32 err", "ms");
    for (int i = 0; i < r->n_nodes; i++) {
        const ag_tape_check_entry *e = &r->nodes[i];
        char how[16], f32[16] = "-";
        snprintf(how, sizeof how, "%d %s", e->comparisons, e->elementwise ? "elem" : "dirs");
        if (e->f32_vs_f64 >= 0)
            snprintf(f32, sizeof f32, "%.1e", e->f32_vs_f64);
        fprintf(f, "  %-4d %-16s %-40s %-9s %-3s %5d %9.2e %9.2e %8s %8.2f  %s", e->index,
                e->op, e->shapes, how, e->in_f64 ? "f64" : "f32", e->forward_runs,
                e->max_abs_err, e->max_rel_err, f32, 1e3 * e->seconds, e->ok ? "ok" : "FAIL");
        if (e->note[0]) fprintf(f, "  (%s)", e->note);
        if (e->replay_diff != 0)
            fprintf(f, "  (replayed output differs from the tape's by %.2e)", e->replay_diff);
        fputs("\n", f);
    }
    if (r->first_failure < 0) {
        fputs("every node passed\n", f);
        return;
    }
    const ag_tape_check_entry *e = &r->nodes[r->first_failure];
    fprintf(f, "first failing node: #%d %s %s", e->index, e->op, e->shapes);
    if (e->worst_input >= 0)
        fprintf(f, ": input %d, numeric %.10g vs analytic %.10g", e->worst_input,
                e->worst_numeric, e->worst_analytic);
    fputs("\n", f);
    if (e->f32_vs_f64 >= 0 && !e->f32_agrees) {
        if (e->f32_vs_f64_input < 0)
            fprintf(f, "  its f32 output differs from its f64 twin's by %.2e (normwise)\n",
                    e->f32_vs_f64);
        else
            fprintf(f, "  its f32 gradient of input %d differs from its f64 twin's by %.2e "
                    "(normwise)\n", e->f32_vs_f64_input, e->f32_vs_f64);
    }
    if (e->rule) fprintf(f, "  its backward should do: %s\n", e->rule);
}
