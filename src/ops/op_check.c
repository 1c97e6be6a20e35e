// The checks of ag_op_check (see attograd/op_check.h): shapes generated from an op's
// description, then each check run through the op's own build function, one report line
// each.
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../core/fd_check.h"
#include "attograd/op_check.h"
#include "attograd/tape_check.h"
#include "op.h"

ag_op_check_opts ag_op_check_defaults(void) {
    return (ag_op_check_opts){.seed = 0, .f32_vs_f64 = 1e-5, .grad = ag_gradcheck_defaults(),
                              .out = stdout};
}

// ---- The report ----------------------------------------------------------------------------

typedef struct {
    const ag_op_spec *spec;
    ag_op_check_opts o;
    ag_op_check_result *res;
    // The errors reported while building the op (a refusal is a result here).
    int errors;
    char error[256];
} suite;

static void record_error(const char *message, void *user) {
    suite *s = user;
    if (s->errors++ == 0) snprintf(s->error, sizeof s->error, "%s", message);
}

static void clear_errors(suite *s) {
    s->errors = 0;
    s->error[0] = 0;
}

// One line: "  ok    <check>: <what>" or "  FAIL  <check>: <what>".
static void report(suite *s, bool ok, const char *check, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (ok) {
        s->res->passed++;
    } else {
        if (s->res->failed++ == 0)
            snprintf(s->res->first_failure, sizeof s->res->first_failure, "%.80s: %.170s", check,
                     what);
    }
    if (s->o.out)
        fprintf(s->o.out, "  %-5s %s %s: %s\n", ok ? "ok" : "FAIL",
                s->spec->name ? s->spec->name : "op", check, what);
}

// ---- Shapes from the description --------------------------------------------------------

enum { MAX_TOKENS = AG_MAX_DIMS + 1, BATCH_MAX = 2, MAX_SIZE = 1 << 16 };

// One token of a shape: "..." (the batch dims), a letter, or a fixed size.
typedef struct {
    int n;
    char letter[MAX_TOKENS];  // the letter, '.' for "...", 0 for a fixed size
    int fixed[MAX_TOKENS];
} dims;

// A letter of a shape: ASCII only, whatever the locale. isalpha follows it, and in a
// single-byte one (de_DE.ISO-8859-1) takes 0xE4 'ä' for a letter, which then, a negative
// char, indexes the tables of sizes below their start.
static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Parses "... K", "O I", "B T 3", "": false on anything else.
static bool parse_dims(const char *text, dims *d) {
    d->n = 0;
    for (const char *p = text ? text : ""; *p;) {
        if (*p == ' ' || *p == ',') {
            p++;
            continue;
        }
        if (d->n == MAX_TOKENS) return false;
        if (strncmp(p, "...", 3) == 0) {
            d->letter[d->n++] = '.';
            p += 3;
        } else if (is_letter(*p) && !is_letter(p[1]) && !isdigit((unsigned char)p[1])) {
            d->letter[d->n++] = *p++;
        } else if (isdigit((unsigned char)*p)) {
            long v = strtol(p, (char **)&p, 10);
            if (v < 1 || v > MAX_SIZE) return false;  // strtol saturates; (int) would wrap
            d->letter[d->n] = 0;
            d->fixed[d->n++] = (int)v;
        } else {
            return false;
        }
    }
    // At most one "...", and at most AG_MAX_DIMS named dims: beyond them a case's shapes
    // would not fit a tensor (nor the arrays they are built in).
    int named = 0, batches = 0;
    for (int t = 0; t < d->n; t++) {
        batches += d->letter[t] == '.';
        named += d->letter[t] != '.';
    }
    return batches <= 1 && named <= AG_MAX_DIMS;
}

static bool has_batch(const dims *d) {
    for (int t = 0; t < d->n; t++)
        if (d->letter[t] == '.') return true;
    return false;
}

// How a case edits the shapes of the inputs marked `broadcast` (their batch dims).
enum { AS_IS, BROADCAST_BOTH, FEWER_DIMS };

// A generated case: a size for every letter, the batch dims, an edit, a magnitude.
typedef struct {
    const char *what;
    int size[128];  // by letter
    int n_batch, batch[BATCH_MAX + 4];
    int edit;
    double magnitude;
} plan;

typedef struct {
    dims d[AG_MAX_INPUTS];
    char letters[64];  // every letter, in order of first appearance
    int n_letters;
    int multiple[128], least[128];  // from `sizes`: a multiple of, at least
    bool any_batch, any_broadcast;
    int named_beside_batch;  // the most named dims of an input that also has "...": a
                             // plan gives those at most AG_MAX_DIMS minus these batch dims
} described;

static bool describe_spec(const ag_op_spec *spec, described *ds, char *why, size_t size) {
    memset(ds, 0, sizeof *ds);
    for (int c = 0; c < 128; c++) ds->multiple[c] = ds->least[c] = 1;
    if (spec->n_in < 1 || spec->n_in > AG_MAX_INPUTS || !spec->build) {
        snprintf(why, size, "needs a build function and 1 to %d inputs, got %d", AG_MAX_INPUTS,
                 spec->n_in);
        return false;
    }
    for (int k = 0; k < spec->n_in; k++) {
        const ag_op_input *in = &spec->in[k];
        if (!parse_dims(in->dims, &ds->d[k])) {
            snprintf(why, size, "input %d (%s): cannot read its dims \"%s\"", k,
                     in->name ? in->name : "?", in->dims ? in->dims : "");
            return false;
        }
        bool batch = has_batch(&ds->d[k]);
        if (batch && ds->d[k].n - 1 > ds->named_beside_batch)
            ds->named_beside_batch = ds->d[k].n - 1;
        ds->any_batch = ds->any_batch || batch;
        ds->any_broadcast = ds->any_broadcast || (in->broadcast && batch);
        for (int t = 0; t < ds->d[k].n; t++) {
            char l = ds->d[k].letter[t];
            if (l == '.' || l == 0 || strchr(ds->letters, l)) continue;
            ds->letters[ds->n_letters++] = l;
        }
        if ((unsigned)in->kind > (unsigned)AG_INPUT_INDEX32) {
            snprintf(why, size, "input %d (%s): unknown kind %d", k, in->name ? in->name : "?",
                     (int)in->kind);
            return false;
        }
        if ((in->kind == AG_INPUT_INDEX || in->kind == AG_INPUT_INDEX32) &&
            !is_letter(in->below)) {
            snprintf(why, size, "input %d (%s): an index needs the letter its values stay below",
                     k, in->name ? in->name : "?");
            return false;
        }
    }
    for (const char *p = spec->sizes ? spec->sizes : ""; *p;) {
        if (*p == ' ') {
            p++;
            continue;
        }
        char l = *p, op = p[1];
        char *end;
        long v = strtol(p + 2, &end, 10);
        if (!is_letter(l) || (op != '%' && op != '>') || end == p + 2 || v < 1 ||
            v > MAX_SIZE) {
            snprintf(why, size, "cannot read the size constraint \"%s\"", p);
            return false;
        }
        if (op == '%') ds->multiple[(int)l] = (int)v;
        else ds->least[(int)l] = (int)v + 1;
        p = end;
    }
    return true;
}

// Size n for letter l, made to hold its constraints.
static int constrained(const described *ds, char l, int n) {
    int m = ds->multiple[(int)l];
    if (n < ds->least[(int)l]) n = ds->least[(int)l];
    return (n + m - 1) / m * m;
}

static plan make_plan(const described *ds, const char *what, bool ones, int n_batch,
                      int edit, double magnitude) {
    plan p;
    memset(&p, 0, sizeof p);
    p.what = what;
    for (int i = 0; i < ds->n_letters; i++)  // 3, 4, 5, ...: no two dims alike by chance
        p.size[(int)ds->letters[i]] = constrained(ds, ds->letters[i], ones ? 1 : 3 + i);
    p.n_batch = n_batch < AG_MAX_DIMS - ds->named_beside_batch
                    ? n_batch : AG_MAX_DIMS - ds->named_beside_batch;
    for (int b = 0; b < p.n_batch; b++) p.batch[b] = ones ? 1 : 2 + b;
    p.edit = edit;
    p.magnitude = magnitude;
    return p;
}

// The shape of input k in plan p.
static int shape_of(const ag_op_spec *spec, const described *ds, const plan *p, int k,
                    int shape[AG_MAX_DIMS + BATCH_MAX]) {
    const dims *d = &ds->d[k];
    int n = 0, first_batch = -1;
    for (int t = 0; t < d->n; t++) {
        if (d->letter[t] == '.') {
            first_batch = n;
            for (int b = 0; b < p->n_batch; b++) shape[n++] = p->batch[b];
        } else {
            shape[n++] = d->letter[t] ? p->size[(int)d->letter[t]] : d->fixed[t];
        }
    }
    if (!spec->in[k].broadcast || first_batch < 0 || p->n_batch == 0) return n;
    // The inputs that broadcast, in order: the first and the second one.
    int which = 0;
    for (int j = 0; j < k; j++) which += spec->in[j].broadcast && has_batch(&ds->d[j]);
    if (p->edit == BROADCAST_BOTH) {  // [1, 3] against [2, 1]
        if (which == 0) shape[first_batch] = 1;
        if (which == 1) shape[first_batch + p->n_batch - 1] = 1;
    } else if (p->edit == FEWER_DIMS && which == 0) {  // [3] against [2, 3]
        memmove(shape + first_batch, shape + first_batch + 1,
                (size_t)(n - first_batch - 1) * sizeof *shape);
        n--;
    }
    return n;
}

// In double: up to 6 extents of up to 2^17 each, whose product passes any integer's range.
static double numel_of(const int *shape, int n) {
    double e = 1;
    for (int i = 0; i < n; i++) e *= shape[i];
    return e;
}

// ---- Inputs ----------------------------------------------------------------------------

typedef struct {
    int n;
    ag_tensor *t[AG_MAX_INPUTS];
} inputs;

static void inputs_free(inputs *in) {
    for (int k = 0; k < in->n; k++) ag_tensor_free(in->t[k]);
    in->n = 0;
}

// The inputs of plan p in dtype dt (float ones), values from (seed, stream).
static inputs make_inputs(const ag_op_spec *spec, const described *ds, const plan *p,
                          ag_dtype dt, uint64_t seed, uint64_t stream) {
    inputs in = {0};
    ag_pcg32 g = ag_pcg32_make(seed, stream);
    for (int k = 0; k < spec->n_in; k++) {
        const ag_op_input *d = &spec->in[k];
        int shape[AG_MAX_DIMS + BATCH_MAX];
        int n = shape_of(spec, ds, p, k, shape);
        ag_dtype kind_dt = d->kind == AG_INPUT_MASK      ? AG_BOOL
                           : d->kind == AG_INPUT_INDEX   ? AG_I64
                           : d->kind == AG_INPUT_INDEX32 ? AG_I32
                                                         : dt;
        ag_tensor *t = ag_tensor_zeros(kind_dt, n, shape);
        in.t[in.n++] = t;
        if (!t) continue;
        double lo = d->lo, hi = d->hi, m = d->fixed_range ? 1 : p->magnitude;
        if (lo == 0 && hi == 0) lo = -1, hi = 1;
        int below = p->size[(int)d->below];
        for (size_t i = 0; i < t->numel; i++) {
            double r = ag_pcg32_double(&g);
            double v = d->kind == AG_INPUT_MASK  ? (r < 1.0 / 3)
                       : kind_dt == AG_I64 || kind_dt == AG_I32 ? floor(r * below)
                                                                : m * (lo + (hi - lo) * r);
            ag_tensor_set_item(t, i, v);
        }
        ag_tensor_set_requires_grad(t, d->kind == AG_INPUT_FLOAT);
    }
    return in;
}

// The same values in another float dtype (masks and indices shared as they are).
static inputs convert_inputs(const inputs *src, ag_dtype dt) {
    inputs out = {src->n, {0}};
    for (int k = 0; k < src->n; k++) {
        const ag_tensor *t = src->t[k];
        out.t[k] = ag_tensor_convert(t, agi_is_float(t->dtype) ? dt : t->dtype);
        ag_tensor_set_requires_grad(out.t[k], t->requires_grad);
    }
    return out;
}

// "[2,3] [3] (bool [2,1])": the shapes, inputs that are not differentiated in parentheses.
static const char *shapes_str(const inputs *in, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k < in->n && len < size; k++) {
        const ag_tensor *t = in->t[k];
        char sh[64];
        ag_tensor_shape_str(t, sh, sizeof sh);
        const char *sep = k ? " " : "";
        if (t->requires_grad)
            len += (size_t)snprintf(buf + len, size - len, "%s%s", sep, sh);
        else if (agi_is_float(t->dtype))
            len += (size_t)snprintf(buf + len, size - len, "%s(%s)", sep, sh);
        else
            len += (size_t)snprintf(buf + len, size - len, "%s(%s %s)", sep,
                                    ag_dtype_name(t->dtype), sh);
    }
    return buf;
}

// ---- Running the op ------------------------------------------------------------------------

static ag_tensor *build_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const ag_op_spec *spec = user;
    return spec->build(tp, in, spec->args);
}

// One forward and backward on tp (reset first) from upstream gradient v (drawn from seed
// when *v is NULL, then kept): the output, or NULL if the op refused.
static ag_tensor *forward_backward(suite *s, ag_tape *tp, inputs *in, ag_tensor **v,
                                   uint64_t seed) {
    ag_tape_reset(tp);
    for (int k = 0; k < in->n; k++)
        if (in->t[k]->requires_grad) ag_tensor_zero_grad(in->t[k]);
    ag_tensor *y = s->spec->build(tp, in->t, s->spec->args);
    if (!y) return NULL;
    if (!*v) {
        ag_pcg32 g = ag_pcg32_make(seed, 0x76);
        *v = ag_tensor_uniform(y->dtype, y->ndim, y->shape, &g, -1, 1);
    }
    if (y->requires_grad) ag_backward_with(tp, y, *v);
    return y;
}

// Bitwise equality of the values (or the gradients) of two tensors of the same shape.
static bool same_bits(const ag_tensor *a, const ag_tensor *b, bool grad) {
    if (a->numel != b->numel || a->dtype != b->dtype) return false;
    size_t bytes = a->numel * ag_dtype_size(a->dtype);
    if (!grad) return memcmp(a->data, b->data, bytes) == 0;
    if (!a->grad || !b->grad) return a->grad == b->grad;
    return memcmp(a->grad, b->grad, bytes) == 0;
}

// ---- The checks ----------------------------------------------------------------------------

// A finite-difference check that did not pass: the first named element (index, what the
// differences expect, what backward gave), then why; "inconclusive: why" when it is.
static void report_not_passed(suite *s, const char *check, const char *where,
                              ag_check_verdict v, const char *why, const ag_check_result *fd) {
    if (v == AG_CHECK_FAIL && fd->n_bad)
        report(s, false, check, "%s: input %d element %s: expected %.8g, got %.8g (%s)", where,
               fd->bad[0].input, fd->bad[0].at, fd->bad[0].expected, fd->bad[0].got, why);
    else
        report(s, false, check, "%s: %s: %s", where, ag_check_verdict_name(v), why);
}

static void check_gradcheck(suite *s, const described *ds, const plan *p, int index) {
    inputs in = make_inputs(s->spec, ds, p, AG_F64, s->o.seed, 100 + (uint64_t)index);
    char sh[256], check[96];
    shapes_str(&in, sh, sizeof sh);
    snprintf(check, sizeof check, "gradcheck f64, %s", p->what);
    ag_gradcheck_opts go = s->o.grad;
    go.quiet = true;
    ag_gradcheck_result r;
    clear_errors(s);
    ag_gradcheck(build_fn, in.t, in.n, (void *)s->spec, &go, &r);
    if (s->errors) {
        report(s, false, check, "%s: refused: %s", sh, s->error);
    } else if (r.verdict == AG_CHECK_PASS) {
        report(s, true, check, "%s: max rel error %.1e", sh, r.fd.max_rel_err);
    } else {
        const char *why = r.fd.verdict != AG_CHECK_PASS ? r.fd.reason
                          : !r.repeat_ok ? "backward run twice gave different gradients"
                                         : "a zero upstream gradient gave nonzero gradients";
        ag_check_verdict v = r.fd.verdict == AG_CHECK_PASS ? AG_CHECK_FAIL : r.fd.verdict;
        report_not_passed(s, check, sh, v, why, &r.fd);
    }
    inputs_free(&in);
}

// ag_tape_check of the op's node(s): f64, and f32 where the op has an f64 twin.
static void check_tape(suite *s, const described *ds, const plan *p, ag_dtype dt) {
    inputs in = make_inputs(s->spec, ds, p, dt, s->o.seed, 200);
    char sh[256], check[64];
    shapes_str(&in, sh, sizeof sh);
    snprintf(check, sizeof check, "tape check %s", ag_dtype_name(dt));
    ag_tape *tp = ag_tape_new();
    ag_tensor *v = NULL;
    clear_errors(s);
    ag_tensor *y = forward_backward(s, tp, &in, &v, s->o.seed);
    if (!y) {
        report(s, false, check, "%s: refused: %s", sh, s->error);
    } else {
        ag_tape_check_opts o = ag_tape_check_defaults();
        o.seed = s->o.seed;
        o.f64_twins = s->o.f64_twins;
        o.n_f64_twins = s->o.n_f64_twins;
        ag_tape_check_report r;
        ag_tape_check(tp, &o, &r);
        if (r.verdict == AG_CHECK_PASS) {
            report(s, true, check, "%s: %d node%s pass", sh, r.n_nodes, r.n_nodes == 1 ? "" : "s");
        } else {
            int i = r.first_failure >= 0 ? r.first_failure : 0;
            for (int j = 0; r.first_failure < 0 && j < r.n_nodes; j++)
                if (r.nodes[j].fd.verdict != AG_CHECK_PASS) i = j;
            const ag_tape_check_entry *e = r.n_nodes ? &r.nodes[i] : NULL;
            char where[320];
            snprintf(where, sizeof where, "%s: node #%d %s", sh, i, e ? e->op : "?");
            if (e) report_not_passed(s, check, where, e->fd.verdict, e->fd.reason, &e->fd);
            else report(s, false, check, "%s: the op recorded no node", sh);
        }
        ag_tape_check_report_free(&r);
    }
    ag_tensor_free(v);
    ag_tape_free(tp);
    inputs_free(&in);
}

static double normwise_err(const ag_tensor *a, const ag_tensor *b, bool grad) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < b->numel; i++) {
        double x = grad ? ag_tensor_grad_item(a, i) : ag_tensor_item(a, i);
        double y = grad ? ag_tensor_grad_item(b, i) : ag_tensor_item(b, i);
        if (x == y) continue;  // equal infinities too
        double d = fabs(x - y);
        if (!(d < INFINITY)) return INFINITY;
        diff = d > diff ? d : diff;
        scale = fabs(y) > scale ? fabs(y) : scale;
    }
    return scale > 0 ? diff / scale : diff;
}

static void check_f32_vs_f64(suite *s, const described *ds, const plan *p) {
    inputs base = make_inputs(s->spec, ds, p, AG_F32, s->o.seed, 300);
    inputs in64 = convert_inputs(&base, AG_F64);
    char sh[256];
    shapes_str(&base, sh, sizeof sh);
    ag_tape *t32 = ag_tape_new(), *t64 = ag_tape_new();
    ag_tensor *v32 = NULL, *v64 = NULL;
    clear_errors(s);
    ag_tensor *y32 = forward_backward(s, t32, &base, &v32, s->o.seed);
    if (y32) v64 = ag_tensor_convert(v32, AG_F64);
    ag_tensor *y64 = y32 ? forward_backward(s, t64, &in64, &v64, s->o.seed) : NULL;
    if (!y32 || !y64) {
        report(s, false, "f32 vs f64", "%s: refused: %s", sh, s->error);
    } else {
        double worst = normwise_err(y32, y64, false);
        char where[256];
        int len = snprintf(where, sizeof where, "output %.1e", worst);
        for (int k = 0; k < base.n; k++) {
            if (!base.t[k]->requires_grad) continue;
            double e = normwise_err(base.t[k], in64.t[k], true);
            if (e > worst || isnan(e)) worst = e;
            if (len < (int)sizeof where)
                len += snprintf(where + len, sizeof where - (size_t)len, ", d%s %.1e",
                                s->spec->in[k].name ? s->spec->in[k].name : "?", e);
        }
        report(s, worst <= s->o.f32_vs_f64, "f32 vs f64", "%s: %s (normwise; at most %.0e)", sh,
               where, s->o.f32_vs_f64);
    }
    ag_tensor_free(v32), ag_tensor_free(v64);
    ag_tape_free(t32), ag_tape_free(t64);
    inputs_free(&base), inputs_free(&in64);
}

// A case grown until its largest input holds 2^18 elements (or a dim reaches 1024): large
// enough for the ops to split their work over the threads.
static plan large_plan(const ag_op_spec *spec, const described *ds) {
    plan p = make_plan(ds, "large", false, ds->any_batch ? 2 : 0, AS_IS, 1);
    for (int round = 0; round < 64; round++) {
        double biggest = 0;
        for (int k = 0; k < spec->n_in; k++) {
            int shape[AG_MAX_DIMS + BATCH_MAX];
            const int n = shape_of(spec, ds, &p, k, shape);
            const double e = numel_of(shape, n);
            biggest = e > biggest ? e : biggest;
        }
        if (biggest >= 1 << 18) break;
        // Double the smallest size (a letter or a batch dim).
        int *smallest = NULL;
        for (int i = 0; i < ds->n_letters; i++) {
            int *sz = &p.size[(int)ds->letters[i]];
            if (!smallest || *sz < *smallest) smallest = sz;
        }
        for (int b = 0; b < p.n_batch; b++)
            if (!smallest || p.batch[b] < *smallest) smallest = &p.batch[b];
        if (!smallest || *smallest >= 1024) break;
        *smallest *= 2;
    }
    return p;
}

static void check_threads(suite *s, const described *ds) {
    plan p = large_plan(s->spec, ds);
    inputs one = make_inputs(s->spec, ds, &p, AG_F32, s->o.seed, 400);
    inputs two = convert_inputs(&one, AG_F32);
    char sh[256];
    shapes_str(&one, sh, sizeof sh);
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *v = NULL;
    clear_errors(s);
    // As if the count were 1, then 2, on this thread alone: setting the process's count
    // would change it under the other threads of the program, and two checks running at
    // once would each put back what the other had set.
    agi_threads_as_if(1);
    ag_tensor *y1 = forward_backward(s, t1, &one, &v, s->o.seed);
    agi_threads_as_if(2);
    ag_tensor *y2 = y1 ? forward_backward(s, t2, &two, &v, s->o.seed) : NULL;
    agi_threads_as_if(0);
    if (!y1 || !y2) {
        report(s, false, "threads 1 vs 2", "%s: refused: %s", sh, s->error);
    } else {
        const char *differs = same_bits(y1, y2, false) ? NULL : "the output";
        for (int k = 0; !differs && k < one.n; k++)
            if (one.t[k]->requires_grad && !same_bits(one.t[k], two.t[k], true))
                differs = s->spec->in[k].name ? s->spec->in[k].name : "an input's gradient";
        if (differs) report(s, false, "threads 1 vs 2", "%s: %s differs", sh, differs);
        else report(s, true, "threads 1 vs 2", "%s: bit-identical", sh);
    }
    ag_tensor_free(v);
    ag_tape_free(t1), ag_tape_free(t2);
    inputs_free(&one), inputs_free(&two);
}

// The float input element with the largest gradient made NaN: the output must hold a NaN.
static void check_nan(suite *s, const described *ds, const plan *p) {
    inputs in = make_inputs(s->spec, ds, p, AG_F64, s->o.seed, 500);
    ag_tape *tp = ag_tape_new();
    ag_tensor *v = NULL;
    clear_errors(s);
    ag_tensor *y = forward_backward(s, tp, &in, &v, s->o.seed);
    int best_k = -1;
    size_t best_i = 0;
    double best = -1;
    for (int k = 0; y && k < in.n; k++) {
        if (!in.t[k]->requires_grad || !in.t[k]->grad) continue;
        for (size_t i = 0; i < in.t[k]->numel; i++) {
            double gi = fabs(ag_tensor_grad_item(in.t[k], i));
            if (gi > best) {
                best = gi;
                best_k = k;
                best_i = i;
            }
        }
    }
    if (!y || best <= 0) {
        report(s, false, "NaN in -> NaN out", "%s",
               !y ? s->error : "no input element reaches the output (every gradient is 0)");
    } else {
        char at[40];
        agi_index_str(in.t[best_k], best_i, at, sizeof at);
        ag_tensor_set_item(in.t[best_k], best_i, NAN);
        ag_tape_reset(tp);
        ag_tensor *z = s->spec->build(tp, in.t, s->spec->args);
        size_t nans = 0;
        for (size_t j = 0; z && j < z->numel; j++) nans += isnan(ag_tensor_item(z, j)) != 0;
        report(s, z && nans > 0, "NaN in -> NaN out", "%s element %s NaN -> %zu of %zu outputs NaN",
               s->spec->in[best_k].name ? s->spec->in[best_k].name : "input", at, nans,
               z ? z->numel : 0);
    }
    ag_tensor_free(v);
    ag_tape_free(tp);
    inputs_free(&in);
}

// Inputs that share a size, given different ones: the op must refuse with one line.
static void check_bad_shapes(suite *s, const described *ds, const plan *p) {
    const ag_op_spec *spec = s->spec;
    // The first input token (a letter or the batch dims) that an earlier input shares.
    int bad_k = -1, bad_t = -1;
    for (int k = 1; k < spec->n_in && bad_k < 0; k++) {
        for (int t = 0; t < ds->d[k].n && bad_k < 0; t++) {
            char l = ds->d[k].letter[t];
            if (!l || (l == '.' && p->n_batch == 0)) continue;
            for (int j = 0; j < k && bad_k < 0; j++)
                for (int u = 0; u < ds->d[j].n; u++)
                    if (ds->d[j].letter[u] == l) bad_k = k, bad_t = t;
        }
    }
    if (bad_k < 0) {
        report(s, true, "bad shapes refused", "none to make: the inputs share no size");
        return;
    }
    // Input bad_k with that size one larger: a copy of the plan where only it changes.
    inputs in = make_inputs(spec, ds, p, AG_F64, s->o.seed, 600);
    int shape[AG_MAX_DIMS + BATCH_MAX];
    int n = shape_of(spec, ds, p, bad_k, shape);
    int pos = 0;  // where token bad_t lands in the shape
    for (int t = 0; t < bad_t; t++) pos += ds->d[bad_k].letter[t] == '.' ? p->n_batch : 1;
    shape[pos] += 1;
    clear_errors(s);
    ag_tensor *wrong = ag_tensor_zeros(in.t[bad_k]->dtype, n, shape);
    if (!wrong) {  // one larger than a case that fits: past the bytes a tensor may hold
        report(s, false, "bad shapes refused", "could not make the case: %s", s->error);
        inputs_free(&in);
        return;
    }
    ag_tensor_set_requires_grad(wrong, in.t[bad_k]->requires_grad);
    ag_tensor_free(in.t[bad_k]);
    in.t[bad_k] = wrong;
    char sh[256];
    shapes_str(&in, sh, sizeof sh);
    ag_tape *tp = ag_tape_new();
    clear_errors(s);
    ag_tensor *y = spec->build(tp, in.t, spec->args);
    bool one_line = s->errors == 1 && !strchr(s->error, '\n');
    if (y)
        report(s, false, "bad shapes refused", "%s: accepted", sh);
    else if (!one_line)
        report(s, false, "bad shapes refused", "%s: %d errors reported", sh, s->errors);
    else
        report(s, true, "bad shapes refused", "%s: \"%s\"", sh, s->error);
    ag_tape_free(tp);
    inputs_free(&in);
}

// A second call on the same tape allocates nothing and gives the same bits.
static void check_memory_and_replay(suite *s, const described *ds, const plan *p) {
    inputs in = make_inputs(s->spec, ds, p, AG_F32, s->o.seed, 700);
    char sh[256];
    shapes_str(&in, sh, sizeof sh);
    ag_tape *tp = ag_tape_new();
    ag_tensor *v = NULL, *first = NULL, *grads[AG_MAX_INPUTS] = {0};
    clear_errors(s);
    ag_tensor *y = forward_backward(s, tp, &in, &v, s->o.seed);
    if (y) {
        first = ag_tensor_convert(y, y->dtype);
        for (int k = 0; k < in.n; k++) {
            if (!in.t[k]->requires_grad) continue;
            ag_tensor g = ag_tensor_grad_view(in.t[k]);
            grads[k] = ag_tensor_convert(&g, g.dtype);
        }
    }
    // This thread's allocations (and its jobs'), which other threads' do not move.
    uint64_t before = agi_allocations_here();
    ag_tensor *y2 = y ? forward_backward(s, tp, &in, &v, s->o.seed) : NULL;
    uint64_t allocations = agi_allocations_here() - before;
    if (!y || !y2) {
        report(s, false, "no allocation after warm-up", "%s: refused: %s", sh, s->error);
        report(s, false, "repeated call replays", "%s: refused: %s", sh, s->error);
    } else {
        report(s, allocations == 0, "no allocation after warm-up", "%s: %llu in the second call",
               sh, (unsigned long long)allocations);
        const char *differs = same_bits(first, y2, false) ? NULL : "the output";
        for (int k = 0; !differs && k < in.n; k++) {
            if (!grads[k]) continue;
            ag_tensor g = ag_tensor_grad_view(in.t[k]);
            if (!same_bits(grads[k], &g, false))
                differs = s->spec->in[k].name ? s->spec->in[k].name : "an input's gradient";
        }
        if (differs) report(s, false, "repeated call replays", "%s: %s differs", sh, differs);
        else report(s, true, "repeated call replays", "%s: bit for bit", sh);
    }
    ag_tensor_free(first), ag_tensor_free(v);
    for (int k = 0; k < in.n; k++) ag_tensor_free(grads[k]);
    ag_tape_free(tp);
    inputs_free(&in);
}

// Whether every input of every case fits a tensor (in 8-byte elements, f64 and i64, the
// widest a case makes); else reports which does not. Sizes of 1 to 65536 over 4 dims, and
// the batch dims, can ask far more than AG_MAX_BYTES: such a case's inputs could not be
// made, and every check then read them through NULL.
static bool cases_fit(suite *s, const described *ds, const plan plans[], int n_plans) {
    const ag_op_spec *spec = s->spec;
    for (int i = 0; i <= n_plans; i++) {
        const plan p = i < n_plans ? plans[i] : large_plan(spec, ds);
        for (int k = 0; k < spec->n_in; k++) {
            int shape[AG_MAX_DIMS + BATCH_MAX];
            const int n = shape_of(spec, ds, &p, k, shape);
            size_t bytes;
            if (agi_shape_bytes(AG_F64, n, shape, &bytes)) continue;
            report(s, false, "description",
                   "input %d (%s) in the case \"%s\" would be f64 %s: more than the 2^%d bytes a "
                   "tensor may hold",
                   k, spec->in[k].name ? spec->in[k].name : "?", p.what,
                   agi_shape_of(n, shape), agi_max_bytes_log2());
            return false;
        }
    }
    return true;
}

bool ag_op_check(const ag_op_spec *spec, const ag_op_check_opts *opts, ag_op_check_result *res) {
    ag_op_check_result local;
    suite s = {.spec = spec, .o = opts ? *opts : ag_op_check_defaults(), .res = res ? res : &local};
    memset(s.res, 0, sizeof *s.res);
    if (!spec) {
        ag_error("op_check: spec is NULL");
        return false;
    }
    if (!agi_fd_steps_ok(s.o.grad.eps, s.o.grad.atol, s.o.grad.rtol) ||
        !(s.o.f32_vs_f64 >= 0)) {
        ag_error("op_check: %s: grad.eps must be finite and > 0 and grad.atol, grad.rtol, "
                 "f32_vs_f64 >= 0, got eps %g atol %g rtol %g f32_vs_f64 %g",
                 spec->name ? spec->name : "op",
                 s.o.grad.eps, s.o.grad.atol, s.o.grad.rtol, s.o.f32_vs_f64);
        return false;
    }
    // This thread's handler, not the process's: another thread's errors are not this op's.
    const agi_error_scope outer = agi_error_scope_set((agi_error_scope){record_error, &s});
    described ds;
    char why[160];
    if (!describe_spec(spec, &ds, why, sizeof why)) {
        report(&s, false, "description", "%s", why);
    } else {
        plan plans[] = {
            make_plan(&ds, "sizes 3, 4, 5, ...", false, 1, AS_IS, 1),
            make_plan(&ds, "size-1 dims", true, 1, AS_IS, 1),
            make_plan(&ds, "no batch dims", false, 0, AS_IS, 1),
            make_plan(&ds, "two batch dims", false, 2, AS_IS, 1),
            make_plan(&ds, "broadcast both ways", false, 2, BROADCAST_BOTH, 1),
            make_plan(&ds, "fewer leading dims", false, 2, FEWER_DIMS, 1),
            make_plan(&ds, "values x100", false, 1, AS_IS, 100),
            make_plan(&ds, "values x0.001", false, 1, AS_IS, 1e-3),
        };
        const int n_plans = (int)(sizeof plans / sizeof plans[0]);
        if (cases_fit(&s, &ds, plans, n_plans)) {
            for (int i = 0; i < n_plans; i++) {
                bool batch_case = i >= 2 && i <= 5, broadcast_case = i == 4 || i == 5;
                if ((batch_case && !ds.any_batch) || (broadcast_case && !ds.any_broadcast))
                    continue;
                check_gradcheck(&s, &ds, &plans[i], i);
            }
            check_tape(&s, &ds, &plans[0], AG_F64);
            check_tape(&s, &ds, &plans[0], AG_F32);
            check_f32_vs_f64(&s, &ds, &plans[0]);
            check_threads(&s, &ds);
            check_nan(&s, &ds, &plans[ds.any_batch ? 3 : 0]);
            check_bad_shapes(&s, &ds, &plans[0]);
            check_memory_and_replay(&s, &ds, &plans[0]);
        }
    }
    agi_error_scope_set(outer);
    if (s.o.out) fprintf(s.o.out, "%d passed, %d failed\n", s.res->passed, s.res->failed);
    return s.res->failed == 0;
}
