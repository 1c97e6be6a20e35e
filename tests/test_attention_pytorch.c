// Parity with PyTorch (tests/reference/attention_pytorch.safetensors, written by
// tests/pytorch/make_attention_reference.py from explicit PyTorch code): attention with
// a position bias (relative, T5, ALiBi), masks of broadcast shapes in both polarities,
// NaN inputs (a NaN in q, k or v, a +inf in k); and the rotary embedding. Each attention
// case runs through the fused ag_attention and through the composed matmul, softmax,
// matmul; every output and gradient (the position table's and the additive mask's
// included) must match PyTorch's normwise to 1e-10 in float64 and 1e-5 in float32, with
// NaN exactly where PyTorch has it.
#include <stdlib.h>

#include "op_checks.h"
#include "pytorch_reference.h"

typedef struct {
    const ag_safetensors *st;
    int i;
    const char *args;
} ref_case;

static const ag_tensor *ref(const ref_case *c, const char *what) {
    char name[64];
    snprintf(name, sizeof name, "c%d.%s", c->i, what);
    return ag_safetensors_find(c->st, name);
}

static double num(const ref_case *c, const char *key, double fallback) {
    char buf[64];
    return reference_value(c->args, key, buf, sizeof buf) ? atof(buf) : fallback;
}

static bool has_arg(const ref_case *c, const char *key, const char *value) {
    char buf[64];
    return reference_value(c->args, key, buf, sizeof buf) && strcmp(buf, value) == 0;
}

// A copy of the case's tensor `what` (floats in dtype dt), requiring grad when asked;
// NULL when the case has none.
static ag_tensor *copy_of(const ref_case *c, const char *what, ag_dtype dt, bool grad) {
    const ag_tensor *r = ref(c, what);
    if (!r) return NULL;
    ag_tensor *t = ag_tensor_convert(r, r->dtype == AG_BOOL ? AG_BOOL : dt);
    ag_tensor_set_requires_grad(t, grad);
    return t;
}

// Values (or gradients) of x against the reference: NaN at the same places, the rest
// within tol normwise.
static bool matches(const ag_tensor *x, bool grad, const ag_tensor *want, double tol,
                    const char *what) {
    if (!x || !want || x->numel != want->numel) {
        fprintf(stderr, "  %s: missing or of the wrong size\n", what);
        return false;
    }
    normwise e = {0, 0};
    for (size_t k = 0; k < want->numel; k++) {
        double a = element(x, grad, k), b = ag_tensor_item(want, k);
        if (isnan(a) != isnan(b)) {
            fprintf(stderr, "  %s[%zu] = %g, PyTorch %g\n", what, k, a, b);
            return false;
        }
        if (!isnan(b)) normwise_add(&e, a, b);
    }
    if (normwise_result(e) > tol)
        fprintf(stderr, "  %s differs from PyTorch by %.3g\n", what, normwise_result(e));
    return normwise_result(e) <= tol;
}

static ag_pos_bias pos_of(const ref_case *c) {
    ag_pos_bias p;
    memset(&p, 0, sizeof p);
    if (has_arg(c, "pos", "relative")) {
        p.kind = AG_POS_RELATIVE;
        p.max_distance = (int)num(c, "M", 0);
    } else if (has_arg(c, "pos", "t5")) {
        p.kind = AG_POS_T5;
        p.num_buckets = (int)num(c, "buckets", 0);
        p.max_distance = (int)num(c, "maxd", 0);
        p.bidirectional = num(c, "bidir", 0) == 1;
    } else if (has_arg(c, "pos", "alibi")) {
        p.kind = AG_POS_ALIBI;
        p.heads = (int)num(c, "heads", 0);
        p.bidirectional = num(c, "bidir", 0) == 1;
    }
    return p;
}

static bool attention_case(const ref_case *c, ag_dtype dt, bool fused) {
    const double tol = dt == AG_F64 ? 1e-10 : 1e-5;
    const char *names[] = {"q", "k", "v", "table", "add"};
    ag_tensor *x[5];
    for (int i = 0; i < 5; i++) x[i] = copy_of(c, names[i], dt, true);
    ag_tensor *mask = copy_of(c, "mask", dt, false), *kpm = copy_of(c, "kpm", dt, false);
    ag_tensor *dy = copy_of(c, "grad_out", dt, false);
    ag_softmax_opts so = {.scale = num(c, "scale", 1), .causal = num(c, "causal", 0) == 1,
                          .mask = mask, .additive_mask = x[4], .key_padding_mask = kpm,
                          .mask_polarity = num(c, "keeps", 0) == 1 ? AG_MASK_KEEPS
                                                                  : AG_MASK_BLOCKS,
                          .pos = pos_of(c)};
    so.pos.table = x[3];
    ag_tape *tp = ag_tape_new();
    ag_tensor *y;
    if (fused) {
        ag_attention_opts o = {.softmax = so};
        y = ag_attention(tp, x[0], x[1], x[2], &o);
    } else {
        ag_tensor *w = ag_softmax(tp, ag_matmul(tp, x[0], x[1], false, true), &so);
        y = ag_matmul(tp, w, x[2], false, false);
    }
    bool ok = y != NULL;
    if (ok) {
        ag_backward_with(tp, y, dy);
        char what[80];
        snprintf(what, sizeof what, "case %d %s %s out", c->i, ag_dtype_name(dt),
                 fused ? "fused" : "composed");
        ok = matches(y, false, ref(c, "out"), tol, what);
        for (int i = 0; i < 5; i++) {
            if (!x[i]) continue;
            char g[32];
            snprintf(g, sizeof g, "grad.%s", names[i]);
            snprintf(what, sizeof what, "case %d %s %s %s", c->i, ag_dtype_name(dt),
                     fused ? "fused" : "composed", g);
            ok = matches(x[i], true, ref(c, g), tol, what) && ok;
        }
    }
    ag_tape_free(tp);
    for (int i = 0; i < 5; i++) ag_tensor_free(x[i]);
    ag_tensor_free(mask);
    ag_tensor_free(kpm);
    ag_tensor_free(dy);
    return ok;
}

static bool rope_case(const ref_case *c, ag_dtype dt) {
    const double tol = dt == AG_F64 ? 1e-10 : 1e-5;
    ag_tensor *x = copy_of(c, "x", dt, true), *dy = copy_of(c, "grad_out", dt, false);
    ag_rope_opts o = {.base = num(c, "base", 0), .pos_offset = (int)num(c, "offset", 0),
                      .heads = (int)num(c, "heads", 0)};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_rope(tp, x, &o);
    bool ok = y != NULL;
    if (ok) {
        ag_backward_with(tp, y, dy);
        char what[64];
        snprintf(what, sizeof what, "case %d %s rope", c->i, ag_dtype_name(dt));
        ok = matches(y, false, ref(c, "out"), tol, what) &&
             matches(x, true, ref(c, "grad.x"), tol, what);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(dy);
    return ok;
}

// Runs every case of `kind` (at least `min_cases` of them must exist).
static void run_cases(const char *kind, int min_cases) {
    ag_safetensors *st = load_reference("attention_pytorch.safetensors");
    CHECK(st != NULL);
    int n = reference_cases(st), seen = 0;
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "c%d.kind", i);
        const char *k = ag_safetensors_meta(st, key);
        if (!k || strcmp(k, kind) != 0) continue;
        snprintf(key, sizeof key, "c%d.args", i);
        ref_case c = {st, i, ag_safetensors_meta(st, key)};
        seen++;
        for (int dti = 0; dti < 2; dti++) {
            ag_dtype dt = dti ? AG_F64 : AG_F32;
            if (strcmp(kind, "rope") == 0) {
                CHECK(rope_case(&c, dt));
            } else {
                CHECK(attention_case(&c, dt, true));
                CHECK(attention_case(&c, dt, false));
            }
        }
    }
    CHECK(seen >= min_cases);
    ag_safetensors_free(st);
}

static void test_attention_options_match_pytorch(void) { run_cases("attention", 14); }
static void test_rope_matches_pytorch(void) { run_cases("rope", 3); }

int main(void) {
    RUN(test_attention_options_match_pytorch);
    RUN(test_rope_matches_pytorch);
    return testing_summary();
}
