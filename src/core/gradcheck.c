// Finite-difference gradient checks (see attograd/gradcheck.h).
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "internal.h"

ag_gradcheck_opts ag_gradcheck_defaults(void) {
    ag_gradcheck_opts o = {1e-6, 1e-5, 1e-3, 0, false};
    return o;
}

static void append(ag_gradcheck_result *r, const char *fmt, ...) {
    size_t n = strlen(r->report);
    if (n + 1 >= sizeof r->report) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->report + n, sizeof r->report - n, fmt, ap);
    va_end(ap);
}

// "(1,0,3)": the multi-index of flat element i.
static const char *index_str(const ag_tensor *t, size_t i, char *buf, size_t size) {
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

// <v, y> in double.
static double dot_v(const ag_tensor *v, const ag_tensor *y) {
    double s = 0;
    for (size_t i = 0; i < y->numel; i++) s += ag_tensor_get(v, i) * ag_tensor_get(y, i);
    return s;
}

typedef struct {
    ag_fn fn;
    ag_tensor *const *inputs;
    int n;
    void *user;
    ag_tape *tp;
} call;

static ag_tensor *run(call *c) {
    ag_tape_reset(c->tp);
    return c->fn(c->tp, c->inputs, c->n, c->user);
}

// Zeroes the gradient of every checked input.
static void zero_grads(const call *c) {
    for (int i = 0; i < c->n; i++)
        if (c->inputs[i]->requires_grad) ag_tensor_zero_grad(c->inputs[i]);
}

// Copies the gradients of the checked inputs into one double array.
static void read_grads(const call *c, double *out) {
    size_t k = 0;
    for (int i = 0; i < c->n; i++) {
        const ag_tensor *x = c->inputs[i];
        if (!x->requires_grad) continue;
        for (size_t e = 0; e < x->numel; e++) out[k++] = ag_tensor_grad_get(x, e);
    }
}

bool ag_gradcheck(ag_fn fn, ag_tensor *const inputs[], int n_inputs, void *user,
                  const ag_gradcheck_opts *opts_in, ag_gradcheck_result *res_out) {
    ag_gradcheck_opts o = opts_in ? *opts_in : ag_gradcheck_defaults();
    ag_gradcheck_result res;
    memset(&res, 0, sizeof res);
    res.worst_input = -1;

    if (!fn || n_inputs < 0 || (n_inputs > 0 && !inputs)) {
        ag_error("gradcheck: %s (n_inputs %d)",
                 !fn ? "the function is NULL" : n_inputs < 0 ? "n_inputs is negative"
                                                            : "the input array is NULL",
                 n_inputs);
        if (res_out) *res_out = res;
        return false;
    }
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i]) {
            ag_error("gradcheck: input %d is NULL", i);
            if (res_out) *res_out = res;
            return false;
        }
    }
    size_t total = 0;
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i]->requires_grad) total += inputs[i]->numel;
    if (total == 0) {
        append(&res, "gradcheck: no input requires grad\n");
        goto done;
    }

    // The user's own gradients are set aside and restored at the end.
    double *saved = agi_malloc(total * sizeof *saved);
    double *analytic = agi_malloc(total * sizeof *analytic);
    double *again = agi_malloc(total * sizeof *again);
    call c = {fn, inputs, n_inputs, user, ag_tape_new()};
    read_grads(&c, saved);

    ag_tensor *y = run(&c);
    ag_tensor *v = NULL;
    if (!y || !y->requires_grad) {
        append(&res, "gradcheck: the function returned %s\n",
               y ? "an output that does not require grad" : "NULL");
        goto cleanup;
    }
    // A fixed random upstream gradient: checks every output element at once,
    // and a wrong gradient hides from it only with probability zero.
    v = ag_tensor_zeros(y->dtype, y->ndim, y->shape);
    ag_pcg32 rng = ag_pcg32_make(o.seed, 0x6772616463686bULL);
    ag_init_uniform(v, &rng, -1.0, 1.0);

    zero_grads(&c);
    ag_backward_with(c.tp, y, v);
    read_grads(&c, analytic);

    // Backward twice on the same tape must give the same gradients.
    zero_grads(&c);
    ag_backward_with(c.tp, y, v);
    read_grads(&c, again);
    res.repeat_ok = memcmp(analytic, again, total * sizeof *again) == 0;
    if (!res.repeat_ok) append(&res, "backward run twice gave different gradients\n");

    // A zero upstream gradient must give zero input gradients.
    zero_grads(&c);
    ag_tensor *zero = ag_tensor_zeros(y->dtype, y->ndim, y->shape);
    ag_backward_with(c.tp, y, zero);
    ag_tensor_free(zero);
    read_grads(&c, again);
    res.zero_ok = true;
    for (size_t k = 0; k < total; k++) res.zero_ok = res.zero_ok && again[k] == 0.0;
    if (!res.zero_ok) append(&res, "a zero upstream gradient gave nonzero input gradients\n");

    // Central differences, element by element.
    res.grad_ok = true;
    double worst_ratio = -1;
    size_t k = 0, failures = 0;
    for (int i = 0; i < n_inputs; i++) {
        ag_tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        for (size_t e = 0; e < x->numel; e++, k++) {
            double orig = ag_tensor_get(x, e);
            ag_tensor_set(x, e, orig + o.eps);
            double xp = ag_tensor_get(x, e);  // what f32 storage actually holds
            ag_tensor *yp = run(&c);
            double fp = yp ? dot_v(v, yp) : NAN;
            ag_tensor_set(x, e, orig - o.eps);
            double xm = ag_tensor_get(x, e);
            ag_tensor *ym = run(&c);
            double fm = ym ? dot_v(v, ym) : NAN;
            ag_tensor_set(x, e, orig);
            double num = (fp - fm) / (xp - xm), ana = analytic[k];
            double err = fabs(ana - num), tol = o.atol + o.rtol * fabs(num);
            double rel = err / fmax(fmax(fabs(num), fabs(ana)), 1e-300);
            if (err > res.max_abs_err) res.max_abs_err = err;
            if (err > 0 && rel > res.max_rel_err) res.max_rel_err = rel;
            bool pass = err <= tol;  // false for NaN too
            if (!pass) {
                res.grad_ok = false;
                if (failures < 5) {
                    char ib[64];
                    append(&res, "input %d %s element %s: numeric %.10g analytic %.10g\n", i,
                           agi_shape(x), index_str(x, e, ib, sizeof ib), num, ana);
                }
                failures++;
            }
            double ratio = pass ? err / tol : INFINITY;
            if (ratio > worst_ratio || res.worst_input < 0) {
                worst_ratio = ratio;
                res.worst_input = i;
                res.worst_index = e;
                res.worst_numeric = num;
                res.worst_analytic = ana;
            }
        }
    }
    res.checked = total;
    if (!res.grad_ok)
        append(&res, "%zu of %zu elements outside atol %.1e + rtol %.1e * |numeric|\n",
               failures, total, o.atol, o.rtol);
    res.ok = res.grad_ok && res.repeat_ok && res.zero_ok;

cleanup:
    // Restore the user's gradients.
    k = 0;
    for (int i = 0; i < n_inputs; i++) {
        ag_tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        if (x->grad) {
            ag_tensor view = ag_tensor_grad_view(x);
            for (size_t e = 0; e < x->numel; e++) ag_tensor_set(&view, e, saved[k + e]);
        }
        k += x->numel;
    }
    ag_tensor_free(v);
    ag_tape_free(c.tp);
    agi_free(saved);
    agi_free(analytic);
    agi_free(again);
done:
    if (!res.ok && !o.quiet) {
        fprintf(stderr, "gradcheck FAILED (max abs err %.3e, max rel err %.3e)\n%s",
                res.max_abs_err, res.max_rel_err, res.report);
    }
    if (res_out) *res_out = res;
    return res.ok;
}
