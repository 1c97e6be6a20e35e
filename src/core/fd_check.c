// The finite-difference comparison shared by ag_gradcheck and ag_tape_check (see
// fd_check.h and attograd/gradcheck.h).
//
// One comparison: for the upstream gradient v and a direction u on one input (u = e_i
// for an element), with F(t) = <v, f(x + t u)>,
//     numeric   (F(h) - F(-h)) / 2h, from two runs of the function,
//     analytic  (J^T v) . u, from the backward already run.
// A step h along u moves element i by h u_i max(1, |x_i| 2^-32 / eps) (2^-12 in f32), so
// that x + h u still differs from x where x is large; the weights of the analytic side
// are the displacements storage actually holds, (x+_i - x-_i) / 2h.
//
// Three numbers decide it:
//   err = |analytic - numeric|;
//   tol = atol + rtol max(|numeric|, 0.01 s) + rho. Here s = sqrt(sum_i (g_i w_i)^2) is
//         the typical size of g . w = (J^T v) . u over random directions (its standard
//         deviation): the tolerance is relative to the comparison's own scale, whatever
//         the input's size. The old scale, sum_i |g_i w_i|, grows as n where g . w grows
//         as sqrt(n), which made the check sqrt(n) times looser on a large node. The floor
//         0.01 s keeps a direction along which g . w cancels by chance (|g . w| << s) from
//         asking more of the differences than they hold. rho is what rounding of the
//         outputs alone can move the numeric side by: 8 units of roundoff of every output
//         that changed, weighted by |v|, over the step;
//   unc = 1/2 sum_j |v_j| |(y+_j - y0_j)/a+ - (y0_j - y-_j)/a-|, from the two runs and the
//         unperturbed output y0: how much output j's one-sided slopes disagree. Where
//         every output is smooth it is about h |f''|, tiny. Where the step straddles a
//         kink (relu at exactly 0, a tie in max) output j's slopes differ by its jump,
//         and an analytic derivative that lies between the two slopes, as any sensible
//         choice at a kink does, differs from the central difference by at most half the
//         jump: unc bounds that disagreement (the sum of absolute values cannot be
//         cancelled by kinks of opposite signs). Rounding noise in the outputs shows in
//         it too, measured rather than estimated: the way to see float32 noise above the
//         tolerance, whatever cancellation inside the function causes it.
// Then
//   err <= tol                 pass (in float32, only if unc <= tol too: noise larger than
//                              the tolerance could hide an error, so a pass would not
//                              mean anything);
//   err > tol + unc            FAIL: neither a kink nor noise explains the difference;
//   in between                 undecided: in float64 the comparison is repeated with a
//                              step 16 times smaller first (a kink near the point but not
//                              at it, or curvature, then goes away; a kink at the point
//                              stays), and what the second try says counts.
// A comparison that fails in float64 is also repeated once, so a failure holds at two
// steps.
//
// Why this finds a relative error of 1% on a node of any size. Let the backward give
// (1 + d) g instead of g. Along any direction the error is d |g . w|, which exceeds
// rtol max(|g . w|, 0.01 s) unless |g . w| < 0.01 s rtol / (d - rtol). g . w is a sum of n
// independent terms of mean 0, nearly normal with standard deviation about s, so that
// happens with probability about 0.8 * 0.01 * rtol / (d - rtol): 9e-4 for d = 1% at rtol
// 1e-3 (and for d = 0.1% at rtol 1e-4), independently of n; two directions per input both
// miss with probability 8e-7. An error e that is not a multiple of g, of norm d |g|, is
// seen along a direction unless |e . w| < rtol |g . w|; for e orthogonal to g the two are
// independent normals and one direction misses with probability (2/pi) atan(rtol |g| /
// |e|) = 6.4% when |e| = 10 rtol |g|, two with 0.4%. Small nodes are compared element by
// element and miss nothing above rtol.
#include "fd_check.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

enum { SHRINKS = 7 };               // a step 16^7 (about 3e8) times smaller at most
static const double FLOOR = 0.01;   // of s, in the tolerance (see above)
static const double ROUNDING = 8;   // units of roundoff per output, in rho
static const double RETRY = 16;     // the second try's step is this much smaller

void agi_fd_result_init(ag_check_result *r) {
    memset(r, 0, sizeof *r);
    r->verdict = AG_CHECK_PASS;
    r->worst_input = -1;
}

static void set_reason(ag_check_result *r, const char *fmt, va_list ap) {
    if (r->reason[0]) return;  // the first reason is the one to read
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
}

void agi_fd_inconclusive(ag_check_result *r, const char *fmt, ...) {
    if (r->verdict == AG_CHECK_FAIL) return;
    r->verdict = AG_CHECK_INCONCLUSIVE;
    va_list ap;
    va_start(ap, fmt);
    set_reason(r, fmt, ap);
    va_end(ap);
}

void agi_fd_fail(ag_check_result *r, const char *fmt, ...) {
    if (r->verdict != AG_CHECK_FAIL) r->reason[0] = 0;  // a failure outranks the rest
    r->verdict = AG_CHECK_FAIL;
    va_list ap;
    va_start(ap, fmt);
    set_reason(r, fmt, ap);
    va_end(ap);
}

bool agi_fd_nan_inputs(ag_check_result *r, int slot, const ag_tensor *x) {
    if (x->dtype != AG_F32 && x->dtype != AG_F64) return false;
    size_t nans = 0;
    for (size_t i = 0; i < x->numel; i++) nans += isnan(agi_fd_get(x, x->data, i));
    if (nans)
        agi_fd_inconclusive(r, "input %d holds %zu NaN element%s: differences cannot check a "
                            "gradient through NaN", slot, nans, nans == 1 ? "" : "s");
    return nans > 0;
}

const char *agi_index_str(const ag_tensor *t, size_t i, char *buf, size_t size) {
    int idx[AG_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = (int)(i % (size_t)t->shape[d]);
        i /= (size_t)t->shape[d];
    }
    size_t n = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < t->ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, d ? ",%d" : "%d", idx[d]);
    if (n < size) snprintf(buf + n, size - n, ")");
    return buf;
}

const char *ag_check_verdict_name(ag_check_verdict v) {
    switch (v) {
    case AG_CHECK_PASS: return "pass";
    case AG_CHECK_FAIL: return "FAIL";
    case AG_CHECK_INCONCLUSIVE: return "inconclusive";
    }
    return "?";
}

// One comparison's numbers.
typedef struct {
    double num, ana, err, tol, unc;
    double scale;  // max(|numeric|, the floor)
    double h;      // the step taken
} measure;

enum { V_PASS, V_FAIL, V_UNDECIDED };

typedef struct {
    const agi_fd_fn *f;
    const agi_fd_opts *o;
    ag_check_result *r;
    ag_tape *scratch;
    bool f64;
    double unit;  // unit roundoff of the dtype the differences are taken in
    // The input under comparison.
    const agi_fd_input *in;
    void *x0;       // its unperturbed values, in its dtype
    double *scale;  // element i moves by h u_i scale[i]
    double *w;      // per element, (x+ - x-) / 2h as storage holds it (directions)
    double g_rms;   // the root mean square of its analytic gradient
    double worst_ratio;
    bool localised;  // the first failing direction was narrowed down to elements
    int failed;
    // The first undecided comparison, for the reason.
    int undecided_slot;
    double undecided_unc, undecided_err, undecided_scale;
} checker;

// a - b, except that equal values differ by 0: a masked score is -inf in every run, and
// -inf - -inf would be NaN. A NaN never equals anything, so it stays NaN.
static double difference(double a, double b) { return a == b ? 0 : a - b; }

// Sets the input to x0 + sign h u (u NULL: element i alone) and, with `held`, adds what
// storage holds afterwards, times `weight`, to held.
static void place(checker *c, const double *u, size_t i, double h, double sign, double *held,
                  double weight) {
    ag_tensor *x = c->in->x;
    if (!u) {
        agi_fd_set(x, x->data, i, agi_fd_get(x, c->x0, i) + sign * h * c->scale[i]);
        return;
    }
    for (size_t j = 0; j < x->numel; j++) {
        if (u[j] == 0) continue;  // stays at x0 (an infinite element, or outside a part)
        agi_fd_set(x, x->data, j, agi_fd_get(x, c->x0, j) + sign * h * c->scale[j] * u[j]);
        if (held) held[j] += weight * agi_fd_get(x, x->data, j);
    }
}

static void restore(checker *c, const double *u, size_t i) {
    ag_tensor *x = c->in->x;
    size_t size = ag_dtype_size(x->dtype);
    if (u) memcpy(x->data, c->x0, x->numel * size);
    else memcpy((char *)x->data + i * size, (const char *)c->x0 + i * size, size);
}

// Sums over the outputs of one pair of runs (see the top of the file).
typedef struct {
    double dot, slopes, rounding;
    bool left_domain;  // an output finite at x0 is not finite at x+ or x-
} sums;

static sums output_sums(const checker *c, const ag_tensor *P, const ag_tensor *M, double ap,
                        double am) {
    sums s = {0, 0, 0, false};
    const double *v = c->f->v, *y0 = c->f->y0;
    for (size_t j = 0; j < c->f->m; j++) {
        double p = agi_fd_get(P, P->data, j), q = agi_fd_get(M, M->data, j), y = y0[j];
        if (isfinite(y) && (!isfinite(p) || !isfinite(q))) s.left_domain = true;
        if (v[j] == 0 || (p == y && q == y)) continue;  // unmoved: identical rounding
        s.dot += v[j] * difference(p, q);
        s.slopes += fabs(v[j] * (difference(p, y) / ap - difference(y, q) / am));
        s.rounding += fabs(v[j]) * (fabs(p) + fabs(q));
    }
    return s;
}

// The two runs of one comparison at x0 +- h u (u NULL: element i), summed over outputs.
typedef struct {
    sums s;
    double denom;  // the step between the two points, as storage holds them
    bool failed;   // the function returned NULL
} pair;

static pair two_runs(checker *c, const double *u, size_t i, double h) {
    const agi_fd_fn *f = c->f;
    ag_tensor *x = c->in->x;
    pair p = {{0, 0, 0, false}, 0, false};
    if (u) memset(c->w, 0, x->numel * sizeof *c->w);
    place(c, u, i, h, +1, u ? c->w : NULL, 1);
    double xp = agi_fd_get(x, x->data, i);
    const ag_tensor *P = f->run(f->ctx, 0);
    place(c, u, i, h, -1, u ? c->w : NULL, -1);
    double xm = agi_fd_get(x, x->data, i);
    const ag_tensor *M = f->run(f->ctx, 1);
    restore(c, u, i);
    c->r->forward_runs += 2;
    if (!P || !M) {
        p.failed = true;
        return p;
    }
    // The step actually taken: in f32, x +- h rounds.
    double x0 = agi_fd_get(x, c->x0, i);
    p.denom = u ? 2 * h : xp - xm;
    p.s = output_sums(c, P, M, u ? h : xp - x0, u ? h : x0 - xm);
    return p;
}

// A comparison at step h. A step that leaves the function's domain (an output finite at
// x0 that is not at x0 +- h: log or sqrt of a value closer to 0 than the step) is retried
// 16 times smaller; the first that stays inside is then made 256 times smaller still, so
// that the boundary's curvature (1/x^2 for log at x) does not show in the difference.
static void measure_at(checker *c, const double *u, size_t i, double h, measure *m) {
    pair p = two_runs(c, u, i, h);
    if (p.s.left_domain && !p.failed) {
        for (int shrink = 0; p.s.left_domain && shrink < SHRINKS; shrink++) {
            h /= 16;
            p = two_runs(c, u, i, h);
        }
        if (!p.s.left_domain) {  // else an unbounded derivative: the NaN shows
            h /= 256;
            c->r->smaller_steps++;
            p = two_runs(c, u, i, h);
        }
    }
    memset(m, 0, sizeof *m);
    m->h = h;
    if (p.failed) {
        m->num = m->err = NAN;
        return;
    }
    m->num = p.s.dot / p.denom;
    double s = c->g_rms;  // an element: its input's typical gradient
    if (u) {
        double ana = 0, ss = 0;
        for (size_t j = 0; j < c->in->x->numel; j++) {
            if (u[j] == 0) continue;
            double t = c->in->ana[j] * c->w[j] / (2 * h);
            ana += t;
            ss += t * t;
        }
        m->ana = ana;
        s = sqrt(ss);
    } else {
        m->ana = c->in->ana[i];
    }
    m->unc = 0.5 * p.s.slopes;
    double rho = ROUNDING * c->unit * p.s.rounding / fabs(p.denom);
    m->err = fabs(m->ana - m->num);
    m->scale = fmax(fabs(m->num), FLOOR * s);
    m->tol = c->o->atol + c->o->rtol * m->scale + rho;
}

static int judge(const checker *c, const measure *m) {
    if (!(m->err <= m->tol + m->unc)) return V_FAIL;  // NaN too
    if (m->err <= m->tol && (c->f64 || m->unc <= m->tol)) return V_PASS;
    return V_UNDECIDED;
}

// One comparison, with the second try in f64 (see the top of the file).
static int compare(checker *c, const double *u, size_t i, measure *m) {
    measure_at(c, u, i, c->o->eps, m);
    int v = judge(c, m);
    if (v != V_PASS && c->f64 && !isnan(m->err)) {
        measure_at(c, u, i, m->h / RETRY, m);
        v = judge(c, m);
    }
    return v;
}

static void record(checker *c, const measure *m, int verdict) {
    ag_check_result *r = c->r;
    double scale = m->scale;
    double rel = m->err / fmax(scale, 1e-300);
    r->comparisons++;
    // A NaN anywhere stays NaN in the maxima.
    if (isnan(m->err) || isnan(r->max_abs_err)) r->max_abs_err = NAN;
    else if (m->err > r->max_abs_err) r->max_abs_err = m->err;
    if (isnan(rel) || isnan(r->max_rel_err)) r->max_rel_err = NAN;
    else if (rel > r->max_rel_err) r->max_rel_err = rel;
    double noise = m->unc / fmax(scale, 1e-300);
    if (noise > r->noise) r->noise = noise;
    double ratio = verdict == V_FAIL ? INFINITY : m->err / fmax(m->tol, 1e-300);
    if (ratio > c->worst_ratio || r->worst_input < 0) {
        c->worst_ratio = ratio;
        r->worst_input = c->in->slot;
        r->worst_numeric = m->num;
        r->worst_analytic = m->ana;
    }
    c->failed += verdict == V_FAIL;
    if (verdict == V_UNDECIDED && r->undecided++ == 0) {
        c->undecided_slot = c->in->slot;
        c->undecided_unc = m->unc;
        c->undecided_err = m->err;
        c->undecided_scale = scale;
    }
}

static void add_bad(const checker *c, size_t i, const measure *m) {
    ag_check_result *r = c->r;
    for (int b = 0; b < r->n_bad; b++)
        if (r->bad[b].input == c->in->slot && r->bad[b].index == i) return;
    if (r->n_bad == AG_CHECK_ELEMENTS) return;
    ag_check_element *e = &r->bad[r->n_bad++];
    *e = (ag_check_element){c->in->slot, i, "", m->num, m->ana};
    agi_index_str(c->in->x, i, e->at, sizeof e->at);
}

// Element i alone, at step h: added to the named elements when it fails.
static void check_one_element(checker *c, size_t i, double h) {
    if (!isfinite(agi_fd_get(c->in->x, c->x0, i))) return;
    measure m;
    measure_at(c, NULL, i, h, &m);
    if (judge(c, &m) == V_FAIL) add_bad(c, i, &m);
}

// A direction failed: which elements? Halve the part of u that fails until one element
// is left (2 runs per half tried, about 4 log2 n runs), then try the few elements whose
// analytic gradient is largest, where a scaled error is largest too.
static void localise(checker *c, const double *u, double h) {
    size_t n = c->in->x->numel, lo = 0, hi = n;
    double *part = ag_tape_alloc(c->scratch, n * sizeof *part);
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2, range[2][2] = {{lo, mid}, {mid, hi}};
        int found = -1;
        for (int half = 0; half < 2 && found < 0; half++) {
            memset(part, 0, n * sizeof *part);
            memcpy(part + range[half][0], u + range[half][0],
                   (range[half][1] - range[half][0]) * sizeof *part);
            measure m;
            measure_at(c, part, 0, h, &m);
            if (judge(c, &m) == V_FAIL) found = half;
        }
        if (found < 0) break;  // the error does not sit in one half
        lo = range[found][0];
        hi = range[found][1];
    }
    size_t tried[AG_CHECK_ELEMENTS];
    int n_tried = 0;
    if (hi - lo == 1) {
        check_one_element(c, lo, h);
        tried[n_tried++] = lo;
    }
    while (n_tried < AG_CHECK_ELEMENTS && c->r->n_bad < AG_CHECK_ELEMENTS) {
        size_t best = n;  // the largest |analytic| not tried yet
        for (size_t j = 0; j < n; j++) {
            bool seen = !isfinite(agi_fd_get(c->in->x, c->x0, j));
            for (int t = 0; t < n_tried; t++) seen = seen || tried[t] == j;
            if (!seen && (best == n || fabs(c->in->ana[j]) > fabs(c->in->ana[best]))) best = j;
        }
        if (best == n) break;
        check_one_element(c, best, h);
        tried[n_tried++] = best;
    }
}

// Prepares input k for comparisons: a copy of its values, the step scales.
static void begin_input(checker *c, const agi_fd_input *in) {
    const ag_tensor *x = in->x;
    c->in = in;
    size_t bytes = x->numel * ag_dtype_size(x->dtype);
    c->x0 = ag_tape_alloc(c->scratch, bytes);
    memcpy(c->x0, x->data, bytes);
    c->scale = ag_tape_alloc(c->scratch, x->numel * sizeof *c->scale);
    c->w = ag_tape_alloc(c->scratch, x->numel * sizeof *c->w);
    double rel = c->f64 ? 0x1p-32 : 0x1p-12, sum2 = 0;
    size_t finite = 0;
    for (size_t i = 0; i < x->numel; i++) {
        double xi = agi_fd_get(x, c->x0, i);
        c->scale[i] = fmax(1.0, fabs(xi) * rel / c->o->eps);
        if (isfinite(xi) && isfinite(in->ana[i])) {
            sum2 += in->ana[i] * in->ana[i];
            finite++;
        }
    }
    c->g_rms = finite ? sqrt(sum2 / (double)finite) : 0;
}

static void check_elementwise(checker *c) {
    for (int k = 0; k < c->f->n_in; k++) {
        begin_input(c, &c->f->in[k]);
        for (size_t i = 0; i < c->in->x->numel; i++) {
            if (!isfinite(agi_fd_get(c->in->x, c->x0, i))) continue;
            measure m;
            int v = compare(c, NULL, i, &m);
            record(c, &m, v);
            if (v == V_FAIL) add_bad(c, i, &m);
        }
    }
}

static double uniform(ag_pcg32 *g) { return 2.0 * ag_pcg32_double(g) - 1.0; }

static void check_directions(checker *c, ag_pcg32 *g) {
    for (int k = 0; k < c->f->n_in; k++) {
        begin_input(c, &c->f->in[k]);
        size_t n = c->in->x->numel;
        double *u = ag_tape_alloc(c->scratch, n * sizeof *u);
        for (int d = 0; d < c->o->directions; d++) {
            for (size_t i = 0; i < n; i++) {
                double r = uniform(g);  // drawn for every element: the stream stays aligned
                u[i] = isfinite(agi_fd_get(c->in->x, c->x0, i)) ? r : 0;
            }
            measure m;
            int v = compare(c, u, 0, &m);
            record(c, &m, v);
            if (v == V_FAIL && !c->localised) {
                c->localised = true;
                localise(c, u, m.h);
            }
        }
    }
}

void agi_fd_check(const agi_fd_fn *f, const agi_fd_opts *o, ag_pcg32 *g, ag_tape *scratch,
                  ag_check_result *r) {
    checker c = {.f = f, .o = o, .r = r, .scratch = scratch, .worst_ratio = -1};
    c.f64 = f->n_in > 0 && f->in[0].x->dtype == AG_F64;
    c.unit = c.f64 ? 0x1p-53 : 0x1p-24;
    size_t total = 0;
    for (int k = 0; k < f->n_in; k++) {
        const ag_tensor *x = f->in[k].x;
        total += x->numel;
        if (agi_fd_nan_inputs(r, f->in[k].slot, x)) return;
        for (size_t i = 0; i < x->numel; i++) r->not_finite += isinf(agi_fd_get(x, x->data, i)) != 0;
    }
    r->elementwise = total <= (size_t)o->max_elementwise;
    if (r->elementwise) check_elementwise(&c);
    else check_directions(&c, g);

    if (r->verdict == AG_CHECK_FAIL) return;  // the caller's failure stands
    if (c.failed) {
        agi_fd_fail(r, "input %d: numeric %.6g but analytic %.6g (%d of %d %s failed)",
                    r->worst_input, r->worst_numeric, r->worst_analytic, c.failed,
                    r->comparisons, r->elementwise ? "elements" : "random directions");
    } else if (r->undecided) {
        if (c.f64)
            agi_fd_inconclusive(
                r, "input %d: the differences straddle a kink (relu at 0, a tie in max): its "
                "one-sided slopes differ by up to %.2g, and %d of %d comparisons could not "
                "decide", c.undecided_slot, 2 * c.undecided_unc / c.undecided_scale,
                r->undecided, r->comparisons);
        else
            agi_fd_inconclusive(
                r, "input %d: float32 differences are too noisy here (noise %.1e of the "
                "derivative, rtol %.0e; %d of %d comparisons could not decide): give the op "
                "an f64 twin to check it in float64", c.undecided_slot,
                c.undecided_unc / c.undecided_scale, o->rtol, r->undecided, r->comparisons);
    } else if (r->comparisons == 0) {
        agi_fd_inconclusive(r, "nothing compared: %s", total ? "every input element is infinite"
                                                             : "no input to differentiate");
    }
}
