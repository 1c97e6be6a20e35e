// Every op against PyTorch: tests/reference/ops_pytorch.safetensors holds
// cases computed by torch 1.13 in float64 (see tests/pytorch/
// make_ops_reference.py). Each case runs here in float64 and in float32; the
// output and every input gradient must match per tensor:
//     max |ours - torch| <= tol * max |torch|,  tol = 1e-10 (f64), 1e-5 (f32).
#include "op_checks.h"
#include "pytorch_reference.h"

#define MAX_INPUTS 6

typedef struct {
    const ag_safetensors *st;
    int index;
    const char *op, *args;
    int n;
    const char *names[MAX_INPUTS];
    const ag_tensor *ref[MAX_INPUTS];  // reference inputs (f64, bool or i64)
    ag_tensor *in[MAX_INPUTS];         // ours, in the dtype under test
    int32_t *ints[MAX_INPUTS];         // integer inputs as int32
} ref_case;

static const ag_tensor *tensor(const ref_case *c, const char *what) {
    char name[128];
    snprintf(name, sizeof name, "c%d.%s", c->index, what);
    return ag_safetensors_get(c->st, name);
}

// The value of `key` in the case's "key=value key=value" arguments, or NULL.
static const char *arg(const ref_case *c, const char *key, char *buf, size_t size) {
    return reference_value(c->args, key, buf, size);
}

static double arg_num(const ref_case *c, const char *key, double fallback) {
    char buf[64];
    return arg(c, key, buf, sizeof buf) ? atof(buf) : fallback;
}

static ag_tensor *input(const ref_case *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->names[i], name) == 0) return c->in[i];
    return NULL;
}

static const int32_t *ints(const ref_case *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->names[i], name) == 0) return c->ints[i];
    return NULL;
}

static const ag_tensor *ref_input(const ref_case *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->names[i], name) == 0) return c->ref[i];
    return NULL;
}

// Collects the case's inputs ("c<i>.in.<name>") and converts them.
static void load_inputs(ref_case *c, ag_dtype dt) {
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "c%d.in.", c->index);
    c->n = 0;
    for (int i = 0; i < ag_safetensors_count(c->st) && c->n < MAX_INPUTS; i++) {
        const char *name = ag_safetensors_name(c->st, i);
        if (strncmp(name, prefix, (size_t)plen) != 0) continue;
        const ag_tensor *r = ag_safetensors_at(c->st, i);
        int k = c->n++;
        c->names[k] = name + plen;
        c->ref[k] = r;
        c->ints[k] = NULL;
        if (r->dtype == AG_I64) {
            c->ints[k] = malloc(r->numel * sizeof(int32_t));
            for (size_t e = 0; e < r->numel; e++) c->ints[k][e] = (int32_t)ag_tensor_get(r, e);
            c->in[k] = NULL;
        } else {
            c->in[k] = ag_tensor_convert(r, r->dtype == AG_BOOL ? AG_BOOL : dt);
            char what[96];
            snprintf(what, sizeof what, "grad.%s", c->names[k]);
            if (tensor(c, what)) ag_tensor_set_requires_grad(c->in[k], true);
        }
    }
}

static void free_inputs(ref_case *c) {
    for (int i = 0; i < c->n; i++) {
        ag_tensor_free(c->in[i]);
        free(c->ints[i]);
    }
}

static ag_tensor *run(ag_tape *tp, const ref_case *c) {
    const char *op = c->op;
    char buf[64];
    if (!strcmp(op, "add")) return ag_add(tp, input(c, "a"), input(c, "b"));
    if (!strcmp(op, "mul")) return ag_mul(tp, input(c, "a"), input(c, "b"));
    if (!strcmp(op, "scale")) return ag_scale(tp, input(c, "x"), arg_num(c, "s", 1));
    if (!strcmp(op, "sum")) return ag_sum(tp, input(c, "x"));
    if (!strcmp(op, "mean")) return ag_mean(tp, input(c, "x"));
    if (!strcmp(op, "reshape")) {
        int shape[AG_MAX_DIMS], nd = 0;
        for (char *s = arg(c, "shape", buf, sizeof buf) ? buf : NULL; s && nd < AG_MAX_DIMS;
             s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
            shape[nd++] = atoi(s);
        return ag_reshape(tp, input(c, "x"), nd, shape);
    }
    if (!strcmp(op, "relu")) return ag_relu(tp, input(c, "x"));
    if (!strcmp(op, "gelu")) {
        bool tanh_form = arg(c, "kind", buf, sizeof buf) && !strcmp(buf, "tanh");
        return ag_gelu(tp, input(c, "x"), tanh_form ? AG_GELU_TANH : AG_GELU_ERF);
    }
    if (!strcmp(op, "linear")) return ag_linear(tp, input(c, "x"), input(c, "w"), input(c, "b"));
    if (!strcmp(op, "matmul"))
        return ag_matmul(tp, input(c, "a"), input(c, "b"), arg_num(c, "ta", 0) != 0,
                         arg_num(c, "tb", 0) != 0);
    if (!strcmp(op, "split_heads"))
        return ag_split_heads(tp, input(c, "x"), (int)arg_num(c, "heads", 1));
    if (!strcmp(op, "merge_heads")) return ag_merge_heads(tp, input(c, "x"));
    if (!strcmp(op, "softmax")) {
        ag_softmax_opts o = {0};
        o.scale = arg_num(c, "scale", 1);
        o.causal = arg_num(c, "causal", 0) != 0;
        o.mask = input(c, "mask");
        o.additive_mask = input(c, "additive_mask");
        o.key_padding_mask = input(c, "key_padding_mask");
        return ag_softmax(tp, input(c, "x"), &o);
    }
    if (!strcmp(op, "dropout"))
        return ag_dropout(tp, input(c, "x"), arg_num(c, "p", 0), true,
                          (uint64_t)arg_num(c, "seed", 0), (uint64_t)arg_num(c, "site", 0));
    if (!strcmp(op, "layernorm"))
        return ag_layernorm(tp, input(c, "x"), input(c, "w"), input(c, "b"),
                            arg_num(c, "eps", 1e-5));
    if (!strcmp(op, "embedding")) {
        const ag_tensor *ids = ref_input(c, "ids");
        return ag_embedding(tp, input(c, "weight"), ints(c, "ids"), ids->ndim, ids->shape);
    }
    if (!strcmp(op, "cross_entropy"))
        return ag_cross_entropy(tp, input(c, "logits"), ints(c, "targets"),
                                ref_input(c, "targets")->numel,
                                (int32_t)arg_num(c, "ignore_index", -100));
    if (!strcmp(op, "mse")) return ag_mse(tp, input(c, "x"), input(c, "target"));
    return NULL;
}

static int checked_tensors;
static double worst_error;

// Our output (or, with `grad`, our gradient of an input) against torch's: a
// missing gradient counts as zeros.
static void compare(const ref_case *c, const char *what, const ag_tensor *ours, bool grad,
                    const ag_tensor *ref, double tol, ag_dtype dt) {
    if (!ref) return;
    checked_tensors++;
    if (!ours || ours->numel != ref->numel) {
        fprintf(stderr, "case %d %s(%s) %s: %s\n", c->index, c->op, c->args, what,
                ours ? "element count differs" : "missing");
        CHECK(!"a tensor is missing or has the wrong size");
        return;
    }
    double e = normwise_error_to(ours, grad, ref);
    worst_error = fmax(worst_error, e);
    if (!(e <= tol)) {
        fprintf(stderr, "case %d %s(%s) %s %s: relative error %.3e > %.0e\n", c->index, c->op,
                c->args, ag_dtype_name(dt), what, e, tol);
        CHECK(!"differs from PyTorch");
    }
}

static void run_case(const ag_safetensors *st, int index, ag_dtype dt, double tol) {
    char key[32];
    ref_case c = {0};
    c.st = st;
    c.index = index;
    snprintf(key, sizeof key, "c%d.op", index);
    c.op = ag_safetensors_meta(st, key);
    snprintf(key, sizeof key, "c%d.args", index);
    c.args = ag_safetensors_meta(st, key);
    CHECK(c.op && c.args);
    if (!c.op || !c.args) return;
    load_inputs(&c, dt);

    ag_tape *tp = ag_tape_new();
    ag_tensor *y = run(tp, &c);
    if (!y) {
        fprintf(stderr, "case %d: op '%s' unknown or failed\n", index, c.op);
        CHECK(!"op ran");
    } else {
        compare(&c, "output", y, false, tensor(&c, "out"), tol, dt);
        ag_tensor *dy = ag_tensor_convert(tensor(&c, "grad_out"), dt);
        ag_backward_with(tp, y, dy);
        ag_tensor_free(dy);
        for (int i = 0; i < c.n; i++) {
            char what[96];
            snprintf(what, sizeof what, "grad.%s", c.names[i]);
            if (c.in[i]) compare(&c, what, c.in[i], true, tensor(&c, what), tol, dt);
        }
    }
    ag_tape_free(tp);
    free_inputs(&c);
}

static const ag_safetensors *reference(void) {
    static ag_safetensors *st;
    if (!st) st = load_reference("ops_pytorch.safetensors");
    return st;
}

static int case_count(void) { return reference_cases(reference()); }

static void test_every_op_matches_pytorch_in_float64(void) {
    int n = case_count();
    CHECK(n >= 40);
    checked_tensors = 0;
    worst_error = 0;
    for (int i = 0; i < n; i++) run_case(reference(), i, AG_F64, 1e-10);
    fprintf(stderr, "     %d cases, %d tensors compared in f64, worst relative error %.2e\n", n,
            checked_tensors, worst_error);
}

static void test_every_op_matches_pytorch_in_float32(void) {
    int n = case_count();
    checked_tensors = 0;
    worst_error = 0;
    for (int i = 0; i < n; i++) run_case(reference(), i, AG_F32, 1e-5);
    fprintf(stderr, "     %d cases, %d tensors compared in f32, worst relative error %.2e\n", n,
            checked_tensors, worst_error);
}

static void test_reference_covers_every_op(void) {
    const char *ops[] = {"add", "mul", "scale", "sum", "mean", "reshape", "relu", "gelu",
                         "linear", "matmul", "split_heads", "merge_heads", "softmax",
                         "dropout", "layernorm", "embedding", "cross_entropy", "mse"};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        bool found = false;
        for (int i = 0; i < case_count() && !found; i++) {
            char key[32];
            snprintf(key, sizeof key, "c%d.op", i);
            const char *op = ag_safetensors_meta(reference(), key);
            found = op && !strcmp(op, ops[k]);
        }
        if (!found) fprintf(stderr, "no PyTorch case for %s\n", ops[k]);
        CHECK(found);
    }
}

int main(void) {
    RUN(test_reference_covers_every_op);
    RUN(test_every_op_matches_pytorch_in_float64);
    RUN(test_every_op_matches_pytorch_in_float32);
    ag_safetensors_free((ag_safetensors *)reference());
    return testing_summary();
}
