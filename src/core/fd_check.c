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
//   tol = atol + rtol max(|numeric|, 0.01 s) + rho. Along a direction s is
//         sqrt(sum_i (g_i w_i)^2), the typical size of g . w = (J^T v) . u over random
//         directions (its standard deviation); for an element, the root mean square of
//         its input's gradient. The tolerance is relative to the comparison's own scale,
//         whatever the input's size. The old scale, sum_i |g_i w_i|, grows as n where
//         g . w grows as sqrt(n), which made the check sqrt(n) times looser on a large
//         node. The floor 0.01 s keeps a direction along which g . w cancels by chance
//         (|g . w| << s), or an element whose gradient is nearly 0, from asking more of
//         the differences than they hold. rho is what rounding of the outputs can move
//         the numeric side by: 16 units of roundoff of every output, weighted by v,
//         added as a root of squares (rounding errors are independent), over the step.
//         Every output counts, moved or not: a change smaller than an output's rounding
//         is lost in it;
//   unc = 1/2 sum_j |v_j| |(y+_j - y0_j)/a+ - (y0_j - y-_j)/a-|, from the two runs and the
//         unperturbed output y0: how much output j's one-sided slopes disagree. Where
//         every output is smooth it is about h |f''|, tiny. Where the step straddles a
//         kink (relu at exactly 0, a tie in max) output j's slopes differ by its jump,
//         and an analytic derivative that lies between the two slopes, as any sensible
//         choice at a kink does, differs from the central difference by at most half the
//         jump: unc bounds that disagreement (the sum of absolute values cannot be
//         cancelled by kinks of opposite signs). Rounding noise in the outputs shows in
//         it too, measured rather than estimated: the way to see float32 noise above the
//         tolerance, whatever cancellation inside the function causes it. (Its root of
//         squares, the noise's typical size, is what the report calls the noise level.)
// Then
//   err <= tol                 pass (in float32, only if unc <= tol too: noise larger than
//                              the tolerance could hide an error, so a pass would not
//                              mean anything);
//   err > tol + unc            FAIL: neither a kink nor noise explains the difference;
//   in between                 undecided.
// In float64 a comparison that does not pass is repeated with a step 16 times smaller (a
// kink near the point but not at it, or curvature, then goes away; a kink at the point
// stays; a real error stays too), and the second try counts. One that stays undecided
// along a direction while its input holds elements at exactly 0 (relu of relu(x), relu(x
// * mask): the kinks sit there) is compared once more with those elements left out.
// When the caller asks (ag_tape_check), a float64 comparison first takes one run, a
// one-sided difference against y0, and goes on to the above only when that disagrees.
//
// Why this finds a relative error of 1% on a node of any size. Let the backward give
// (1 + d) g instead of g. Along any direction the error is d |g . w|, which exceeds
// rtol max(|g . w|, 0.01 s) unless |g . w| < 0.01 s rtol / (d - rtol). g . w is a sum of n
// independent terms of mean 0, nearly normal with standard deviation about s, so that
// happens with probability about 0.8 * 0.01 * rtol / (d - rtol): 8e-5 for d = 1% at
// ag_tape_check's rtol 1e-4 (and for d = 0.1% at the strict 1e-5), independently of n. An
// error e that is not a multiple of g, of norm d |g|, is seen along a direction unless
// |e . w| < rtol |g . w|; for e orthogonal to g the two are independent normals and one
// direction misses with probability (2/pi) atan(rtol |g| / |e|): 0.64% when |e| = 100
// rtol |g| (d = 1% at rtol 1e-4). Small nodes are compared element by element and miss
// nothing above rtol.
#include "fd_check.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

enum { SHRINKS = 7 };               // a step 16^7 (about 3e8) times smaller at most
static const double FLOOR = 0.01;   // of s, in the tolerance (see above)
static const double ROUNDING = 16;  // units of roundoff per output, in rho
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
    for (size_t i = 0; i < x->numel; i++) nans += isnan(agi_fd_get(x, x->data, i)) != 0;
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
    double noise;  // the typical size of the same disagreements (random ones add as a
                   // root of squares, where unc adds them as a sum: its bound)
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
    double yscale;  // a power of 2 that brings the largest finite |y0| below 1: outputs
                    // are squared in rho, and outputs of 1e160 squared overflowed to an
                    // infinite tolerance that passed any gradient
    // The input under comparison.
    const agi_fd_input *in;
    const ag_tensor *x0;  // its unperturbed values (f32 or f64, maybe not x's dtype)
    double rel;     // element i moves by h u_i max(1, rel |x0_i|) (see step_scale)
    double g_rms;   // the root mean square of its analytic gradient
    size_t zeros;   // its elements at exactly 0
    size_t zeros_left_out;  // elements at exactly 0 left out of directions (kinks), and
    int zeros_slot;         // of which input
    double worst_ratio;
    bool localised;  // the first failing direction was narrowed down to elements
    int failed;
    // The first undecided comparison, for the reason.
    int undecided_slot;
    double undecided_unc, undecided_noise, undecided_scale;
} checker;

// a - b, except that equal values differ by 0: a masked score is -inf in every run, and
// -inf - -inf would be NaN. A NaN never equals anything, so it stays NaN.
static double difference(double a, double b) { return a == b ? 0 : a - b; }

// How much more than h an element at x0 moves: max(1, rel |x0|), so that x0 + h still
// differs from x0 where x0 is large; 1 for an infinite element, which stays put.
static inline double step_scale(const checker *c, double x0) {
    double s = fabs(x0) * c->rel;
    return s > 1 && s < INFINITY ? s : 1;
}

static inline double x0_at(const checker *c, size_t i) {
    return agi_fd_get(c->x0, c->x0->data, i);
}

// Sets element i of the input to x0 + sign h scale_i.
static void place_element(checker *c, size_t i, double h, double sign) {
    double x0 = x0_at(c, i);
    agi_fd_set(c->in->x, c->in->x->data, i, x0 + sign * h * step_scale(c, x0));
}

// Sets the input to x0 + sign h (scale * u).
static void place_direction(checker *c, const double *u, double h, double sign) {
    ag_tensor *x = c->in->x;
    for (size_t j = 0; j < x->numel; j++) {
        double x0 = x0_at(c, j);
        agi_fd_set(x, x->data, j, x0 + sign * h * step_scale(c, x0) * u[j]);
    }
}

// Where storage puts x0 + t (rounded to f32 in an f32 input).
static inline double stored(const checker *c, double x0, double t) {
    return c->f64 ? x0 + t : (double)(float)(x0 + t);
}

// The comparison's weight of element j along u at step h: (x+ - x-) / 2h for a central
// difference, (x+ - x0) / h for a one-sided one, as storage holds the points.
static inline double weight(const checker *c, const double *u, size_t j, double h,
                            bool central) {
    if (u[j] == 0) return 0;
    double x0 = x0_at(c, j), d = h * step_scale(c, x0) * u[j];
    return central ? (stored(c, x0, d) - stored(c, x0, -d)) / (2 * h)
                   : (stored(c, x0, d) - stored(c, x0, 0)) / h;
}

static void restore(checker *c, const double *u, size_t i) {
    ag_tensor *x = c->in->x;
    if (!u) {
        agi_fd_set(x, x->data, i, x0_at(c, i));
    } else if (c->x0->dtype == x->dtype) {
        memcpy(x->data, c->x0->data, x->numel * ag_dtype_size(x->dtype));
    } else {
        for (size_t j = 0; j < x->numel; j++) agi_fd_set(x, x->data, j, x0_at(c, j));
    }
}

// The two runs of one comparison at x0 +- h u (u NULL: element i), and their sums over
// the outputs (see the top of the file).
typedef struct {
    const ag_tensor *P, *M;  // the outputs at x+ and x-; NULL if the function failed
    double denom;            // the step between the two points, as storage holds them
    double ap, am;           // the steps to either side of x0
    double dot, rounding;    // rounding: sum of squares of v_j y_j, times yscale^2
    bool left_domain;        // an output finite at x0 is not finite at x+ or x-
} pair;

static void difference_sums(const checker *c, pair *p) {
    const ag_tensor *y0 = c->f->y0, *v = c->f->v;
    for (size_t j = 0; j < c->f->m; j++) {
        double a = agi_fd_get(p->P, p->P->data, j), b = agi_fd_get(p->M, p->M->data, j);
        double y = agi_fd_get(y0, y0->data, j), vj = agi_fd_get(v, v->data, j);
        if (isfinite(y) && (!isfinite(a) || !isfinite(b))) p->left_domain = true;
        if (vj == 0) continue;
        // An output that did not move may still have been meant to: a change smaller than
        // its rounding is lost in it. So every output counts in the rounding.
        if (isfinite(a) && isfinite(b)) {
            double sa = vj * a * c->yscale, sb = vj * b * c->yscale;
            p->rounding += sa * sa + sb * sb;
        }
        p->dot += vj * difference(a, b);
    }
}

// The one-sided slopes' disagreement, as a sum (unc, the bound) and as a root of squares
// (noise, the typical size). Only wanted when a comparison is not a clear pass, or in f32.
static void slope_sums(const checker *c, const pair *p, measure *m) {
    const double iap = 1 / p->ap, iam = 1 / p->am;
    const ag_tensor *y0 = c->f->y0, *v = c->f->v;
    double sum = 0, sum2 = 0;
    for (size_t j = 0; j < c->f->m; j++) {
        double a = agi_fd_get(p->P, p->P->data, j), b = agi_fd_get(p->M, p->M->data, j);
        double y = agi_fd_get(y0, y0->data, j), vj = agi_fd_get(v, v->data, j);
        if (vj == 0 || (a == y && b == y)) continue;
        double jump = vj * (difference(a, y) * iap - difference(y, b) * iam);
        sum += fabs(jump);
        sum2 += jump * jump;
    }
    m->unc = 0.5 * sum;
    m->noise = 0.5 * sqrt(sum2);
}

static pair two_runs(checker *c, const double *u, size_t i, double h) {
    const agi_fd_fn *f = c->f;
    ag_tensor *x = c->in->x;
    pair p = {0};
    if (u) place_direction(c, u, h, +1);
    else place_element(c, i, h, +1);
    double xp = agi_fd_get(x, x->data, i);
    p.P = f->run(f->ctx, 0);
    if (u) place_direction(c, u, h, -1);
    else place_element(c, i, h, -1);
    double xm = agi_fd_get(x, x->data, i);
    p.M = f->run(f->ctx, 1);
    restore(c, u, i);
    c->r->forward_runs += 2;
    if (!p.P || !p.M) {
        p.P = p.M = NULL;
        return p;
    }
    // The step actually taken: in f32, x +- h rounds.
    double x0 = x0_at(c, i);
    p.denom = u ? 2 * h : xp - xm;
    p.ap = u ? h : xp - x0;
    p.am = u ? h : x0 - xm;
    difference_sums(c, &p);
    return p;
}

// A power of 2 (exact to multiply by) that brings `most` (>= 0) below 1, so that squares
// of numbers up to it do not overflow; 1 when most is below 1 already, or infinite.
static double scale_below_one(double most) {
    if (!(most >= 1) || isinf(most)) return 1;
    int e;
    (void)frexp(most, &e);
    return ldexp(1, -e);
}

// sqrt(sum_j (g_j w_j)^2), the terms scaled by a power of 2 from their largest finite
// magnitude `most`: squared as they are, terms of 1e160 made s infinite, and with it the
// tolerance.
static double root_sum_squares_weighted(const checker *c, const double *u, double h,
                                        bool central, double most) {
    double k = scale_below_one(most), ss = 0;
    for (size_t j = 0; j < c->in->x->numel; j++) {
        if (u[j] == 0) continue;
        double t = c->in->ana[j] * weight(c, u, j, h, central) * k;
        if (isfinite(t)) ss += t * t;  // as in g_rms: an infinite gradient made s infinite
    }
    return sqrt(ss) / k;
}

// The analytic side of a comparison at step h, (J^T v) . w (an element: its gradient),
// and the error and tolerance against numeric value `num` whose rounding can reach `rho`.
static void finish(const checker *c, const double *u, size_t i, double h, bool central,
                   double num, double rho, measure *m) {
    double s = c->g_rms;  // an element: its input's typical gradient
    m->num = num;
    if (u) {
        double ana = 0, most = 0;
        for (size_t j = 0; j < c->in->x->numel; j++) {
            if (u[j] == 0) continue;
            double t = c->in->ana[j] * weight(c, u, j, h, central);
            ana += t;
            if (fabs(t) > most && isfinite(t)) most = fabs(t);
        }
        m->ana = ana;
        s = root_sum_squares_weighted(c, u, h, central, most);
    } else {
        m->ana = c->in->ana[i];
    }
    m->err = fabs(m->ana - m->num);
    m->scale = fmax(fabs(m->num), FLOOR * s);
    m->tol = c->o->atol + c->o->rtol * m->scale + rho;
}

// The first look in f64, when the options ask for it (ag_tape_check): one run at x0 + h u
// against the unperturbed output, (F(h) - F(0)) / h. Its truncation error, h/2 F'', is a
// millionth of the derivative or less for the smooth ops of a network, far inside rtol:
// where it agrees, the comparison passes on one run; anything else (a disagreement, a
// step out of the domain) goes on to the central difference. Half the runs, same verdicts.
static bool one_sided_pass(checker *c, const double *u, size_t i, double h, measure *m) {
    const agi_fd_fn *f = c->f;
    ag_tensor *x = c->in->x;
    if (u) place_direction(c, u, h, +1);
    else place_element(c, i, h, +1);
    double step = u ? h : agi_fd_get(x, x->data, i) - x0_at(c, i);
    const ag_tensor *P = f->run(f->ctx, 0);
    restore(c, u, i);
    c->r->forward_runs++;
    if (!P) return false;
    double dot = 0, rounding = 0;
    for (size_t j = 0; j < f->m; j++) {
        double a = agi_fd_get(P, P->data, j), y = agi_fd_get(f->y0, f->y0->data, j);
        double vj = agi_fd_get(f->v, f->v->data, j);
        if (isfinite(y) && !isfinite(a)) return false;  // out of the domain
        if (vj == 0) continue;
        if (isfinite(a)) {
            double sa = vj * a * c->yscale, sy = vj * y * c->yscale;
            rounding += sa * sa + sy * sy;
        }
        dot += vj * difference(a, y);
    }
    memset(m, 0, sizeof *m);
    m->h = h;
    finish(c, u, i, h, false, dot / step,
           ROUNDING * c->unit * (sqrt(rounding) / c->yscale) / fabs(step), m);
    return m->err <= m->tol;
}

// A comparison at step h. A step that leaves the function's domain (an output finite at
// x0 that is not at x0 +- h: log or sqrt of a value closer to 0 than the step) is retried
// 16 times smaller; the first that stays inside is then made 256 times smaller still, so
// that the boundary's curvature (1/x^2 for log at x) does not show in the difference.
static void measure_at(checker *c, const double *u, size_t i, double h, measure *m) {
    pair p = two_runs(c, u, i, h);
    if (p.left_domain && p.P) {
        for (int shrink = 0; p.left_domain && shrink < SHRINKS; shrink++) {
            h /= 16;
            p = two_runs(c, u, i, h);
        }
        if (!p.left_domain) {  // else an unbounded derivative: the NaN shows
            h /= 256;
            c->r->smaller_steps++;
            p = two_runs(c, u, i, h);
        }
    }
    memset(m, 0, sizeof *m);
    m->h = h;
    if (!p.P) {  // the function failed: no numeric side, but the analytic one is reported
        finish(c, u, i, h, true, NAN, 0, m);
        return;
    }
    finish(c, u, i, h, true, p.dot / p.denom,
           ROUNDING * c->unit * (sqrt(p.rounding) / c->yscale) / fabs(p.denom), m);
    if (!c->f64 || !(m->err <= m->tol)) slope_sums(c, &p, m);
}

static int judge(const checker *c, const measure *m) {
    if (!(m->err <= m->tol + m->unc)) return V_FAIL;  // NaN too
    if (m->err <= m->tol && (c->f64 || m->unc <= m->tol)) return V_PASS;
    return V_UNDECIDED;
}

// One comparison, with the second try in f64 (see the top of the file).
static int two_steps(checker *c, const double *u, size_t i, measure *m) {
    if (c->f64 && c->o->one_sided_first && one_sided_pass(c, u, i, c->o->eps, m)) return V_PASS;
    measure_at(c, u, i, c->o->eps, m);
    int v = judge(c, m);
    if (v != V_PASS && c->f64 && !isnan(m->err)) {
        measure_at(c, u, i, m->h / RETRY, m);
        v = judge(c, m);
    }
    return v;
}

// A direction that stays undecided while its input holds elements at exactly 0 (relu of
// relu(x), relu(x * mask): the kinks are exactly there) is compared once more without
// them, so that the rest of the input is still checked: a failure then shows, and a pass
// leaves the node inconclusive for those elements alone.
static int compare(checker *c, const double *u, size_t i, measure *m) {
    int v = two_steps(c, u, i, m);
    if (v == V_UNDECIDED && u && c->zeros) {
        size_t n = c->in->x->numel;
        double *away = ag_tape_alloc(c->scratch, n * sizeof *away);
        for (size_t j = 0; j < n; j++) away[j] = x0_at(c, j) == 0 ? 0 : u[j];
        measure without;
        int w = two_steps(c, away, 0, &without);
        if (w != V_UNDECIDED) {
            *m = without;
            v = w;
            c->zeros_left_out = c->zeros;
            c->zeros_slot = c->in->slot;
        }
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
    double noise = m->noise / fmax(scale, 1e-300);
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
        c->undecided_noise = m->noise;
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
    if (!isfinite(x0_at(c, i))) return;
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
            bool seen = !isfinite(x0_at(c, j));
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
    c->x0 = in->x0;
    if (!c->x0) {  // a copy of the values before any perturbation
        ag_tensor *copy = ag_tape_alloc(c->scratch, sizeof *copy);
        *copy = *x;
        copy->data = ag_tape_alloc(c->scratch, x->numel * ag_dtype_size(x->dtype));
        memcpy(copy->data, x->data, x->numel * ag_dtype_size(x->dtype));
        c->x0 = copy;
    }
    double sum2 = 0, most = 0;
    size_t finite = 0;
    c->zeros = 0;
    for (size_t i = 0; i < x->numel; i++) {
        double xi = x0_at(c, i);
        c->zeros += xi == 0;
        if (isfinite(xi) && isfinite(in->ana[i])) {
            most = fmax(most, fabs(in->ana[i]));
            finite++;
        } else if (isinf(xi)) {
            c->r->not_finite++;
        }
    }
    double k = scale_below_one(most);  // gradients of 1e160 squared would overflow
    for (size_t i = 0; i < x->numel; i++) {
        if (!isfinite(x0_at(c, i)) || !isfinite(in->ana[i])) continue;
        double g = in->ana[i] * k;
        sum2 += g * g;
    }
    c->g_rms = finite ? sqrt(sum2 / (double)finite) / k : 0;
}

static void check_elementwise(checker *c) {
    for (int k = 0; k < c->f->n_in; k++) {
        begin_input(c, &c->f->in[k]);
        for (size_t i = 0; i < c->in->x->numel; i++) {
            if (!isfinite(x0_at(c, i))) continue;
            measure m;
            int v = compare(c, NULL, i, &m);
            record(c, &m, v);
            if (v == V_FAIL) add_bad(c, i, &m);
        }
    }
}

static void check_directions(checker *c, ag_pcg32 *g) {
    for (int k = 0; k < c->f->n_in; k++) {
        begin_input(c, &c->f->in[k]);
        size_t n = c->in->x->numel;
        double *u = ag_tape_alloc(c->scratch, n * sizeof *u);
        for (int d = 0; d < c->o->directions; d++) {
            for (size_t i = 0; i < n; i++) {
                double r = agi_fd_uniform(g);  // for every element: the stream stays aligned
                u[i] = isfinite(x0_at(c, i)) ? r : 0;
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
    c.rel = (c.f64 ? 0x1p-32 : 0x1p-12) / o->eps;
    c.unit = c.f64 ? 0x1p-53 : 0x1p-24;
    double most = 0;
    for (size_t j = 0; j < f->m; j++) {
        double y = agi_fd_get(f->y0, f->y0->data, j);
        if (isfinite(y)) most = fmax(most, fabs(y));
    }
    c.yscale = scale_below_one(most);
    size_t total = 0;
    for (int k = 0; k < f->n_in; k++) total += f->in[k].x->numel;
    r->elementwise = total <= (size_t)o->max_elementwise;
    if (r->elementwise) check_elementwise(&c);
    else check_directions(&c, g);

    if (r->verdict == AG_CHECK_FAIL) return;  // the caller's failure stands
    if (c.failed) {
        if (r->elementwise)
            agi_fd_fail(r, "input %d: %d of %d elements failed", r->worst_input, c.failed,
                        r->comparisons);
        else
            agi_fd_fail(r, "input %d: %d of %d random directions failed (along one: numeric "
                        "%.6g, analytic %.6g)", r->worst_input, c.failed, r->comparisons,
                        r->worst_numeric, r->worst_analytic);
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
                c.undecided_noise / c.undecided_scale, o->rtol, r->undecided, r->comparisons);
    } else if (c.zeros_left_out) {
        agi_fd_inconclusive(r, "input %d: its %zu elements at exactly 0 sit on a kink (relu at "
                            "0): left out of the directions, the rest agree", c.zeros_slot,
                            c.zeros_left_out);
    } else if (r->comparisons == 0) {
        agi_fd_inconclusive(r, "nothing compared: %s", total ? "every input element is infinite"
                                                             : "no input to differentiate");
    }
}
