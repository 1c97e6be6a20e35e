// Finite-difference gradient checks of a whole function (see attograd/gradcheck.h). The
// comparison itself is src/core/fd_check.c, which ag_tape_check shares.
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "fd_check.h"

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

// The function, run on one of two tapes: the output of a run on tape `which` stays valid
// until the next run on it, so a central difference holds both of its outputs at once.
typedef struct {
    ag_fn fn;
    ag_tensor *const *inputs;
    int n;
    void *user;
    ag_tape *tapes[2];
    ag_tensor *copies[2];  // outputs that were inputs themselves, copied (run_for_differences)
    const ag_tensor *y0;   // the output at the unperturbed inputs
    char changed[160];     // how a later run's output differed from y0 in shape or dtype
} call;

static const ag_tensor *run_on(void *ctx, int which) {
    call *c = ctx;
    ag_tape_reset(c->tapes[which]);
    return c->fn(c->tapes[which], c->inputs, c->n, c->user);
}

// run_on for the differences. A function may return one of its inputs (the identity):
// the perturbation of the second run, then its restoring, changed the first run's output
// under the comparison, the difference came out 0, and a correct gradient failed. Such an
// output is copied.
static const ag_tensor *run_for_differences(void *ctx, int which) {
    call *c = ctx;
    const ag_tensor *y = run_on(ctx, which);
    // A function whose output changed shape between runs was read as if it had not:
    // past the end of a smaller output. Such a run is a failed one, and said so.
    if (y && (y->dtype != c->y0->dtype || !ag_tensor_same_shape(y, c->y0))) {
        if (!c->changed[0])
            snprintf(c->changed, sizeof c->changed, "%s %s at the inputs, %s %s at a perturbed "
                     "point", agi_shape(c->y0), ag_dtype_name(c->y0->dtype), agi_shape(y),
                     ag_dtype_name(y->dtype));
        return NULL;
    }
    bool is_input = false;
    for (int i = 0; y && i < c->n && !is_input; i++) is_input = y->data == c->inputs[i]->data;
    if (!is_input) return y;
    if (!c->copies[which]) c->copies[which] = ag_tensor_convert(y, y->dtype);
    else ag_tensor_copy(c->copies[which], y);
    return c->copies[which];
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
        for (size_t e = 0; e < x->numel; e++) out[k++] = ag_tensor_grad_item(x, e);
    }
}

// The gradient of one leaf the check's backwards may write: the checked inputs, and every
// tensor requiring grad that the function reads without being given it (a model's
// parameters). PyTorch's gradcheck asks autograd.grad for the inputs' gradients and
// leaves every .grad as it was; so does this one, pointer included: a gradient the
// backwards made where there was none goes again, and one in the check's tape memory
// would otherwise dangle once that tape is freed.
typedef struct {
    ag_tensor *t;
    void *grad;  // t->grad before the check
    void *copy;  // its bytes then (NULL when grad is)
} kept_grad;

static void keep_grad(kept_grad **kept, int *n, int *cap, ag_tensor *t) {
    if (!t->requires_grad) return;
    for (int i = 0; i < *n; i++)
        if ((*kept)[i].t == t) return;
    *kept = agi_reserve(*kept, cap, *n, *n + 1, 16, sizeof **kept);
    kept_grad *k = &(*kept)[(*n)++];
    k->t = t;
    k->grad = t->grad;
    k->copy = NULL;
    if (t->grad) {
        size_t bytes = t->numel * agi_dtype_size(t->dtype);
        k->copy = agi_malloc(bytes);
        memcpy(k->copy, t->grad, bytes);
    }
}

// The inputs and the leaves of the graph the first run recorded on tapes[0] (output y).
static int keep_grads(const call *c, ag_tensor *y, kept_grad **kept) {
    int n = 0, cap = 0;
    *kept = NULL;
    for (int i = 0; i < c->n; i++) keep_grad(kept, &n, &cap, c->inputs[i]);
    if (!y->node) keep_grad(kept, &n, &cap, y);
    for (int i = 0; i < ag_tape_num_nodes(c->tapes[0]); i++) {
        const ag_node *node = ag_tape_node(c->tapes[0], i);
        for (int k = 0; k < node->n_in; k++)
            if (!node->in[k]->node) keep_grad(kept, &n, &cap, node->in[k]);
    }
    return n;
}

// Puts every kept gradient back as it was, and frees the record. Runs while tapes[0]
// still holds the first run, so a leaf the function made on it is still there.
static void restore_grads(kept_grad *kept, int n) {
    for (int i = 0; i < n; i++) {
        ag_tensor *t = kept[i].t;
        if (kept[i].grad) {
            memcpy(kept[i].grad, kept[i].copy, t->numel * agi_dtype_size(t->dtype));
        } else if (t->grad && !(t->agi_bookkeeping & AGI_TAPE)) {
            agi_free(t->grad);  // made by agi_ensure_grad off the tape (a tape's goes with it)
        }
        t->grad = kept[i].grad;
        agi_free(kept[i].copy);
    }
    agi_free(kept);
}

// Whether the gradients `g` (read_grads' order) are 0 at every finite input element. At
// an infinite one, 0 times the op's derivative there is NaN by IEEE rules (exp at +inf:
// 0 * inf): a correct backward failed the check. Such elements are not checked by the
// differences either (fd.not_finite).
static bool zero_where_finite(const call *c, const double *g) {
    size_t k = 0;
    bool zero = true;
    for (int i = 0; i < c->n; i++) {
        const ag_tensor *x = c->inputs[i];
        if (!x->requires_grad) continue;
        for (size_t e = 0; e < x->numel; e++, k++)
            zero = zero && (g[k] == 0.0 || isinf(ag_tensor_item(x, e)));
    }
    return zero;
}

// The finite differences, with `analytic` from the backward of upstream gradient v.
static void compare(call *c, const ag_gradcheck_opts *o, const ag_tensor *v, const ag_tensor *y0,
                    const double *analytic, ag_check_result *fd) {
    ag_tape *scratch = ag_tape_new();
    agi_fd_input *in = ag_tape_alloc(scratch, (size_t)c->n * sizeof *in);
    int n_in = 0;
    size_t k = 0;
    for (int i = 0; i < c->n; i++) {
        if (!c->inputs[i]->requires_grad) continue;
        if (agi_fd_nan_inputs(fd, i, c->inputs[i])) break;
        in[n_in++] = (agi_fd_input){c->inputs[i], i, analytic + k, NULL};
        k += c->inputs[i]->numel;
    }
    agi_fd_fn f = {run_for_differences, c, n_in, in, v->numel, v, y0};
    agi_fd_opts fo = {o->eps, o->atol, o->rtol, INT_MAX, 1, false};  // element by element
    if (fd->verdict == AG_CHECK_PASS) agi_fd_check(&f, &fo, NULL, scratch, fd);
    if (c->changed[0]) {  // this, not the NaN differences it left, is the failure to read
        fd->verdict = AG_CHECK_INCONCLUSIVE;
        fd->reason[0] = 0;
        agi_fd_fail(fd, "the function's output changed between runs (%s): it must build the "
                    "same output every call", c->changed);
    }
    ag_tape_free(scratch);
}

// The report's lines for the finite differences: the reason and the named elements.
static void describe(ag_gradcheck_result *r, const call *c) {
    if (r->fd.verdict == AG_CHECK_PASS) return;
    append(r, "%s\n", r->fd.reason);
    for (int b = 0; b < r->fd.n_bad; b++) {
        const ag_check_element *e = &r->fd.bad[b];
        append(r, "input %d %s element %s: numeric %.10g analytic %.10g\n", e->input,
               agi_shape(c->inputs[e->input]), e->at, e->expected, e->got);
    }
}

bool ag_gradcheck(ag_fn fn, ag_tensor *const inputs[], int n_inputs, void *user,
                  const ag_gradcheck_opts *opts_in, ag_gradcheck_result *res_out) {
    ag_gradcheck_opts o = opts_in ? *opts_in : ag_gradcheck_defaults();
    ag_gradcheck_result res;
    memset(&res, 0, sizeof res);
    agi_fd_result_init(&res.fd);

    // A refused call checked nothing: it is no pass.
    res.verdict = res.fd.verdict = AG_CHECK_FAIL;
    if (!fn || n_inputs < 0 || (n_inputs > 0 && !inputs)) {
        ag_error("gradcheck: %s (n_inputs %d)",
                 !fn ? "the function is NULL" : n_inputs < 0 ? "n_inputs is negative"
                                                            : "the input array is NULL",
                 n_inputs);
        if (res_out) *res_out = res;
        return false;
    }
    if (!agi_fd_steps_ok(o.eps, o.atol, o.rtol)) {
        ag_error("gradcheck: eps must be finite and > 0 and atol, rtol finite and >= 0, got "
                 "eps %g atol %g rtol %g", o.eps, o.atol, o.rtol);
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
    res.verdict = res.fd.verdict = AG_CHECK_PASS;
    size_t total = 0;
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i]->requires_grad) total += inputs[i]->numel;
    res.checked = total;
    if (total == 0) {
        agi_fd_inconclusive(&res.fd, "nothing compared: no input requires grad");
        append(&res, "gradcheck: no input requires grad\n");
        goto done;
    }

    double *analytic = agi_malloc(total * sizeof *analytic);
    double *again = agi_malloc(total * sizeof *again);
    ag_tensor *y0 = NULL;
    call c = {fn, inputs, n_inputs, user, {ag_tape_new(), ag_tape_new()}, {NULL, NULL}, NULL, ""};
    ag_tensor *y = (ag_tensor *)run_on(&c, 0);
    ag_tensor *v = NULL;
    if (!y || !y->requires_grad) {
        agi_fd_fail(&res.fd, "the function returned %s",
                    y ? "an output that does not require grad" : "NULL");
        append(&res, "gradcheck: %s\n", res.fd.reason);
        goto cleanup;
    }
    // A fixed random upstream gradient: checks every output element at once, and a wrong
    // gradient hides from it only with probability zero. An infinite output stays so under
    // any small change of the inputs, so differences see none of its sensitivity: its
    // upstream gradient is 0.
    y0 = ag_tensor_convert(y, y->dtype);  // the tape's copy goes with the next run
    c.y0 = y0;
    v = ag_tensor_zeros(y->dtype, y->ndim, y->shape);
    ag_pcg32 rng = ag_pcg32_make(o.seed, 0x6772616463686bULL);
    ag_tensor_init_uniform(v, &rng, -1.0, 1.0);
    for (size_t j = 0; j < y->numel; j++)
        if (isinf(ag_tensor_item(y, j))) ag_tensor_set_item(v, j, 0);

    // The user's own gradients are set aside, and restored once the backwards are done.
    kept_grad *kept;
    const int n_kept = keep_grads(&c, y, &kept);
    zero_grads(&c);
    ag_backward_with(c.tapes[0], y, v);
    read_grads(&c, analytic);

    // Backward twice on the same tape must give the same gradients.
    zero_grads(&c);
    ag_backward_with(c.tapes[0], y, v);
    read_grads(&c, again);
    res.repeat_ok = memcmp(analytic, again, total * sizeof *again) == 0;
    if (!res.repeat_ok) append(&res, "backward run twice gave different gradients\n");

    // A zero upstream gradient must give zero input gradients.
    zero_grads(&c);
    ag_tensor *zero = ag_tensor_zeros(y->dtype, y->ndim, y->shape);
    ag_backward_with(c.tapes[0], y, zero);
    ag_tensor_free(zero);
    read_grads(&c, again);
    res.zero_ok = zero_where_finite(&c, again);
    if (!res.zero_ok) append(&res, "a zero upstream gradient gave nonzero input gradients\n");
    restore_grads(kept, n_kept);

    compare(&c, &o, v, y0, analytic, &res.fd);
    describe(&res, &c);

cleanup:
    ag_tensor_free(v);
    ag_tape_free(c.tapes[0]);
    ag_tape_free(c.tapes[1]);
    ag_tensor_free(c.copies[0]);
    ag_tensor_free(c.copies[1]);
    agi_free(analytic);
    agi_free(again);
    ag_tensor_free(y0);
done:
    res.verdict = res.fd.verdict;
    if (total && (!res.repeat_ok || !res.zero_ok)) res.verdict = AG_CHECK_FAIL;
    if (res.verdict != AG_CHECK_PASS && !o.quiet) {
        fprintf(stderr, "gradcheck %s (max abs err %.3e, max rel err %.3e)\n%s",
                ag_check_verdict_name(res.verdict), res.fd.max_abs_err, res.fd.max_rel_err,
                res.report);
    }
    if (res_out) *res_out = res;
    return res.verdict == AG_CHECK_PASS;
}
