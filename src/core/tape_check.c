// A gradient check of every node of a tape, each on its own (see attograd/tape_check.h).
//
// The tape knows no op, and neither does this file: a node is re-run only through its
// op's forward and backward, on a scratch copy of the node. The copy has its own output,
// its own copies of the inputs it differentiates (with their own gradients), and a
// private tape, so whatever the op allocates or saves (node->saved) lands there. The
// real node, its output, its inputs' values and gradients are only read.
#include <math.h>
#include <string.h>
#include <time.h>

#include "attograd/tape_check.h"
#include "internal.h"

ag_tape_check_opts ag_tape_check_defaults(void) {
    ag_tape_check_opts o = {1e-6, 1e-5, 1e-3, 1e-3, 1e-3, 2e-2, 0, 64, 2};
    return o;
}

static double seconds_now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Element i of `buf`, laid out as t (any dtype), as a double; and the reverse. The
// float types are read directly: these run over every output element of every run.
static double get(const ag_tensor *t, const void *buf, size_t i) {
    if (t->dtype == AG_F64) return ((const double *)buf)[i];
    if (t->dtype == AG_F32) return ((const float *)buf)[i];
    ag_tensor view = *t;
    view.data = (void *)buf;
    return ag_tensor_get(&view, i);
}

static void set(const ag_tensor *t, void *buf, size_t i, double v) {
    if (t->dtype == AG_F64) {
        ((double *)buf)[i] = v;
    } else if (t->dtype == AG_F32) {
        ((float *)buf)[i] = (float)v;
    } else {
        ag_tensor view = *t;
        view.data = buf;
        ag_tensor_set(&view, i, v);
    }
}

static size_t bytes_of(const ag_tensor *t) { return t->numel * ag_dtype_size(t->dtype); }

// The scratch copy of one node.
typedef struct {
    ag_node node;
    ag_tensor in[AG_MAX_INPUTS], out;
    bool diff[AG_MAX_INPUTS];      // input k is differentiated (float, requires grad)
    double *ana[AG_MAX_INPUTS];    // analytic (J^T v) for input k
    double *v;                     // the upstream gradient, as the op's dtype holds it
    void *y_plus, *y_minus;        // output buffers of the perturbed runs
    ag_tape *tape;     // what the op allocates or saves: reset before every forward
    ag_tape *buffers;  // the buffers above: reset per node, so its blocks are reused
    int runs;
} scratch;

static double uniform(ag_pcg32 *g) { return 2.0 * ag_pcg32_double(g) - 1.0; }

// One forward of the scratch node into `out`. The buffer starts as NaN: an element the
// forward leaves unwritten (every one must be written) then fails the check.
static void run_forward(scratch *s, void *out) {
    for (size_t j = 0; j < s->out.numel; j++) set(&s->out, out, j, NAN);
    ag_tape_reset(s->tape);
    s->node.saved = NULL;
    s->out.data = out;
    s->node.op->forward(&s->node);
    s->runs++;
}

// a - b, except that equal values differ by 0: a masked score is -inf in every run, and
// -inf - -inf would be NaN. A NaN never equals anything, so it stays NaN.
static double difference(double a, double b) { return a == b ? 0 : a - b; }

// <v, y_plus - y_minus>, in double.
static double v_dot_diff(const scratch *s) {
    double sum = 0;
    for (size_t j = 0; j < s->out.numel; j++)
        sum += s->v[j] * difference(get(&s->out, s->y_plus, j), get(&s->out, s->y_minus, j));
    return sum;
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
static bool left_domain(const scratch *s, const void *y) {
    for (size_t j = 0; j < s->out.numel; j++)
        if (isfinite(get(&s->out, y, j)) && (!isfinite(get(&s->out, s->y_plus, j)) ||
                                             !isfinite(get(&s->out, s->y_minus, j))))
            return true;
    return false;
}

// Sets input k to its recorded value plus h u (the whole direction u), or with u NULL plus
// h at element i alone. With `held`, stores what storage holds after rounding.
static void place(scratch *s, int k, const ag_tensor *x0, const double *u, size_t i, double h,
                  double *held) {
    ag_tensor *x = &s->in[k];
    if (!u) {
        set(x, x->data, i, get(x0, x0->data, i) + h);
        if (held) held[0] = get(x, x->data, i);
        return;
    }
    for (size_t j = 0; j < x->numel; j++) {
        set(x, x->data, j, get(x0, x0->data, j) + h * u[j]);
        if (held) held[j] = get(x, x->data, j);
    }
}

enum { SHRINKS = 7 };  // a step 16^7 (about 3e8) times smaller at most

// The two runs of a central difference along u (or element i) into y_plus and y_minus.
// A step that leaves the domain is retried 16 times smaller; the first that stays inside
// is then made 256 times smaller still, so that the boundary's curvature (1/x^2 for log
// at x) does not show in the difference. Returns the step; `held` as for place().
static double two_runs(scratch *s, ag_tape_check_entry *e, int k, const ag_tensor *x0,
                       const double *u, size_t i, double eps, const void *y, double *held) {
    double h = eps;
    for (int shrink = 0;; shrink++) {
        place(s, k, x0, u, i, h, held);
        run_forward(s, s->y_plus);
        place(s, k, x0, u, i, -h, NULL);
        run_forward(s, s->y_minus);
        if (!left_domain(s, y)) {
            if (shrink == 0) return h;
            break;
        }
        if (shrink == SHRINKS) return h;  // an unbounded derivative: the NaN shows
        h /= 16;
    }
    h /= 256;
    e->smaller_steps++;
    place(s, k, x0, u, i, h, held);
    run_forward(s, s->y_plus);
    place(s, k, x0, u, i, -h, NULL);
    run_forward(s, s->y_minus);
    return h;
}

// Element by element: 2 forwards per finite element of every differentiated input (an
// infinite one, a masked score, has no neighbourhood to difference over).
static void check_elementwise(scratch *s, const ag_node *real, ag_tape_check_entry *e,
                              tally *t, const void *y) {
    for (int k = 0; k < s->node.n_in; k++) {
        if (!s->diff[k]) continue;
        ag_tensor *x = &s->in[k];
        const ag_tensor *x0 = real->in[k];
        for (size_t i = 0; i < x->numel; i++) {
            if (!isfinite(get(x0, x0->data, i))) continue;
            double xp;  // what f32 storage actually holds
            two_runs(s, e, k, x0, NULL, i, t->eps, y, &xp);
            double xm = get(x, x->data, i);
            set(x, x->data, i, get(x0, x0->data, i));
            double num = v_dot_diff(s) / (xp - xm);
            compare(e, t, k, num, s->ana[k][i], fabs(num));
        }
    }
}

// Along random directions u, input by input: 2 forwards per direction. u is 0 on the
// elements that are not finite: they stay as they are.
static void check_directions(scratch *s, const ag_node *real, ag_tape_check_entry *e,
                             tally *t, const void *y, int directions, ag_pcg32 *g) {
    for (int k = 0; k < s->node.n_in; k++) {
        if (!s->diff[k]) continue;
        ag_tensor *x = &s->in[k];
        const ag_tensor *x0 = real->in[k];
        double *u = ag_tape_alloc(s->buffers, 2 * x->numel * sizeof *u), *xp = u + x->numel;
        for (int d = 0; d < directions; d++) {
            for (size_t i = 0; i < x->numel; i++) {
                double r = uniform(g);  // drawn for every element: the stream stays aligned
                u[i] = isfinite(get(x0, x0->data, i)) ? r : 0;
            }
            double h = two_runs(s, e, k, x0, u, 0, t->eps, y, xp);
            // The step actually taken is what storage holds: in f32, x +- h u round,
            // so the direction is (x+ - x-) / 2 h, u only approximately.
            double ana = 0, scale = 0;
            for (size_t i = 0; i < x->numel; i++) {
                if (u[i] == 0) continue;  // inf - inf would make the weight NaN
                double w = (xp[i] - get(x, x->data, i)) / (2 * h);
                ana += s->ana[k][i] * w;
                scale += fabs(s->ana[k][i] * w);
            }
            double num = v_dot_diff(s) / (2 * h);
            compare(e, t, k, num, ana, fmax(fabs(num), scale));
        }
        memcpy(x->data, x0->data, bytes_of(x));
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

static void check_node(const ag_node *n, ag_tape *scratch_tape, ag_tape *buffers,
                       const ag_tape_check_opts *o, ag_tape_check_entry *e) {
    double start = seconds_now();
    memset(e, 0, sizeof *e);
    e->index = n->index;
    e->op = n->op->name ? n->op->name : "?";
    e->rule = n->op->rule;
    e->worst_input = -1;
    e->ok = true;

    scratch s;
    memset(&s, 0, sizeof s);
    s.tape = scratch_tape;
    s.buffers = buffers;
    ag_tape_reset(buffers);
    s.node = *n;
    s.node.tape = scratch_tape;
    s.node.out = &s.out;
    size_t total = 0;
    for (int k = 0; k < n->n_in; k++) {
        const ag_tensor *x = n->in[k];
        s.diff[k] = agi_is_float(x->dtype) && x->requires_grad;
        s.in[k] = *x;
        s.in[k].node = NULL;
        s.in[k].agi_bookkeeping = 0;
        s.in[k].grad = NULL;  // not differentiated: backward leaves it alone
        if (s.diff[k]) {
            s.in[k].data = ag_tape_alloc(buffers, bytes_of(x));
            memcpy(s.in[k].data, x->data, bytes_of(x));
            s.in[k].grad = ag_tape_alloc(buffers, bytes_of(x));
            s.ana[k] = ag_tape_alloc(buffers, x->numel * sizeof *s.ana[k]);
            total += x->numel;
            for (size_t i = 0; i < x->numel; i++) e->not_finite += !isfinite(get(x, x->data, i));
            e->inputs_checked++;
        }
        s.node.in[k] = &s.in[k];
    }
    describe(n, s.diff, e->shapes, sizeof e->shapes);
    s.out = *n->out;
    s.out.agi_bookkeeping = 0;
    s.out.node = &s.node;
    s.out.requires_grad = true;
    void *y = ag_tape_alloc(buffers, bytes_of(&s.out));
    s.out.grad = ag_tape_alloc(buffers, bytes_of(&s.out));
    s.y_plus = ag_tape_alloc(buffers, bytes_of(&s.out));
    s.y_minus = ag_tape_alloc(buffers, bytes_of(&s.out));
    s.v = ag_tape_alloc(buffers, s.out.numel * sizeof *s.v);

    const bool f64 = s.out.dtype == AG_F64;
    tally t = {f64 ? o->eps : o->eps_f32, f64 ? o->atol : o->atol_f32,
               f64 ? o->rtol : o->rtol_f32, -1};
    // One stream per node: a node's check does not depend on which others ran.
    ag_pcg32 g = ag_pcg32_make(o->seed, 0x7461706563686bULL + (uint64_t)n->index);

    if (!n->op->backward) {
        snprintf(e->note, sizeof e->note, "the op has no backward");
        e->ok = false;
        goto cleanup;
    }
    // The replay: the values backward needs (and saves) come from this forward.
    run_forward(&s, y);
    for (size_t j = 0; j < s.out.numel; j++) {
        double a = get(&s.out, y, j), b = get(n->out, n->out->data, j);
        double d = (isnan(a) && isnan(b)) ? 0 : fabs(difference(a, b));
        if (isnan(d) || d > e->replay_diff) e->replay_diff = d;
        if (isnan(d)) break;
    }
    // Backward from a random upstream gradient, into input gradients that start random
    // too: a backward that assigns instead of accumulating then shows. An output that is
    // infinite (log_softmax of a masked -inf) stays so under any small change of the inputs,
    // so differences see none of its sensitivity: its upstream gradient is 0, for the
    // backward to be compared with what differences can see.
    for (size_t j = 0; j < s.out.numel; j++) {
        double r = uniform(&g);
        set(&s.out, s.out.grad, j, isinf(get(&s.out, y, j)) ? 0 : r);
        s.v[j] = get(&s.out, s.out.grad, j);
    }
    for (int k = 0; k < n->n_in; k++) {
        if (!s.diff[k]) continue;
        for (size_t i = 0; i < s.in[k].numel; i++) {
            set(&s.in[k], s.in[k].grad, i, uniform(&g));
            s.ana[k][i] = get(&s.in[k], s.in[k].grad, i);
        }
    }
    s.node.op->backward(&s.node);
    for (int k = 0; k < n->n_in; k++) {
        if (!s.diff[k]) continue;
        for (size_t i = 0; i < s.in[k].numel; i++)
            s.ana[k][i] = get(&s.in[k], s.in[k].grad, i) - s.ana[k][i];
    }

    e->elementwise = total <= (size_t)(o->max_elementwise > 0 ? o->max_elementwise : 0);
    if (e->elementwise)
        check_elementwise(&s, n, e, &t, y);
    else
        check_directions(&s, n, e, &t, y, o->directions > 0 ? o->directions : 1, &g);

cleanup:
    e->forward_runs = s.runs;
    ag_tape_reset(scratch_tape);
    e->seconds = seconds_now() - start;
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
        !(o.atol >= 0 && o.rtol >= 0 && o.atol_f32 >= 0 && o.rtol_f32 >= 0)) {
        ag_error("tape_check: eps must be finite and > 0 and tolerances >= 0, got eps %g "
                 "atol %g rtol %g (f32: eps %g atol %g rtol %g)",
                 o.eps, o.atol, o.rtol, o.eps_f32, o.atol_f32, o.rtol_f32);
        return false;
    }
    double start = seconds_now();
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
    r->seconds = seconds_now() - start;
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
    fprintf(f, "  %-4s %-16s %-40s %-9s %5s %9s %9s %8s\n", "#", "op", "shapes", "checked",
            "runs", "max abs", "max rel", "ms");
    for (int i = 0; i < r->n_nodes; i++) {
        const ag_tape_check_entry *e = &r->nodes[i];
        char how[16];
        snprintf(how, sizeof how, "%d %s", e->comparisons, e->elementwise ? "elem" : "dirs");
        fprintf(f, "  %-4d %-16s %-40s %-9s %5d %9.2e %9.2e %8.2f  %s", e->index, e->op,
                e->shapes, how, e->forward_runs, e->max_abs_err, e->max_rel_err,
                1e3 * e->seconds, e->ok ? "ok" : "FAIL");
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
    if (e->rule) fprintf(f, "  its backward should do: %s\n", e->rule);
}
