// Every op against PyTorch: tests/reference/ops_pytorch.safetensors holds
// cases computed by torch 1.13 in float64 (see tests/pytorch/
// make_ops_reference.py). Each case runs here in float64 and in float32; the
// output and every input gradient must match per tensor:
//     max |ours - torch| <= tol * max |torch|,  tol = 1e-10 (f64), 1e-5 (f32).
// The table that maps each op name to the code that runs a case is made from the op
// registry (src/ops/registry.h): an op without its run_<op> below does not compile, and
// test_reference_covers_every_op fails for an op without a case in the file.
#define _POSIX_C_SOURCE 200809L  // testing_files.h
#include "../src/ops/registry.h"
#include "op_checks.h"
#include "pytorch_reference.h"
#include "testing_files.h"

#define MAX_INPUTS 8

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
    return ag_safetensors_find(c->st, name);
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
        if (r->dtype == AG_I64) {  // ids, targets (as int32) and index tensors
            c->ints[k] = malloc(r->numel * sizeof(int32_t));
            for (size_t e = 0; e < r->numel; e++) c->ints[k][e] = (int32_t)ag_tensor_item(r, e);
            c->in[k] = ag_tensor_convert(r, AG_I64);
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

// A comma-separated list of ints ("2,0,-1") from the case's arguments; returns the count.
static int arg_ints(const ref_case *c, const char *key, int out[AG_MAX_DIMS]) {
    char buf[64];
    int n = 0;
    for (char *s = arg(c, key, buf, sizeof buf) ? buf : NULL; s && n < AG_MAX_DIMS;
         s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
        out[n++] = atoi(s);
    return n;
}

static int arg_int(const ref_case *c, const char *key) { return (int)arg_num(c, key, 0); }
static bool arg_bool(const ref_case *c, const char *key) { return arg_num(c, key, 0) != 0; }

// Inputs named x0, x1, ... (concat, stack); returns how many.
static int numbered(const ref_case *c, ag_tensor *xs[]) {
    int n = 0;
    char name[16];
    for (; n < MAX_INPUTS; n++) {
        snprintf(name, sizeof name, "x%d", n);
        if (!(xs[n] = input(c, name))) break;
    }
    return n;
}

// ---- One runner per op: THE list of ops with PyTorch cases ----------------------------
// test_reference_covers_every_op compares it with the ops defined in src/ops/ and with
// the cases in the reference file: an op missing here, or without a case, fails it.
#define X(name) input(c, name)
typedef ag_tensor *(*runner)(ag_tape *tp, const ref_case *c);

static ag_tensor *run_add(ag_tape *tp, const ref_case *c) { return ag_add(tp, X("a"), X("b")); }
static ag_tensor *run_sub(ag_tape *tp, const ref_case *c) { return ag_sub(tp, X("a"), X("b")); }
static ag_tensor *run_mul(ag_tape *tp, const ref_case *c) { return ag_mul(tp, X("a"), X("b")); }
static ag_tensor *run_div(ag_tape *tp, const ref_case *c) { return ag_div(tp, X("a"), X("b")); }
static ag_tensor *run_scale(ag_tape *tp, const ref_case *c) {
    return ag_scale(tp, X("x"), arg_num(c, "s", 1));
}
static ag_tensor *run_sum(ag_tape *tp, const ref_case *c) { return ag_sum(tp, X("x")); }
static ag_tensor *run_mean(ag_tape *tp, const ref_case *c) { return ag_mean(tp, X("x")); }
static ag_tensor *run_reshape(ag_tape *tp, const ref_case *c) {
    int shape[AG_MAX_DIMS], nd = arg_ints(c, "shape", shape);
    return ag_reshape(tp, X("x"), nd, shape);
}
static ag_tensor *run_relu(ag_tape *tp, const ref_case *c) { return ag_relu(tp, X("x")); }
static ag_tensor *run_gelu(ag_tape *tp, const ref_case *c) {
    char buf[16];
    bool tanh_form = arg(c, "kind", buf, sizeof buf) && !strcmp(buf, "tanh");
    return ag_gelu(tp, X("x"), tanh_form ? AG_GELU_TANH : AG_GELU_ERF);
}
static ag_tensor *run_linear(ag_tape *tp, const ref_case *c) {
    return ag_linear(tp, X("x"), X("w"), X("b"));
}
static ag_tensor *run_matmul(ag_tape *tp, const ref_case *c) {
    return ag_matmul(tp, X("a"), X("b"), arg_bool(c, "ta"), arg_bool(c, "tb"));
}
static ag_tensor *run_split_heads(ag_tape *tp, const ref_case *c) {
    return ag_split_heads(tp, X("x"), arg_int(c, "heads"));
}
static ag_tensor *run_merge_heads(ag_tape *tp, const ref_case *c) {
    return ag_merge_heads(tp, X("x"));
}
static ag_softmax_opts softmax_opts(const ref_case *c) {
    ag_softmax_opts o = {0};
    o.scale = arg_num(c, "scale", 1);
    o.causal = arg_bool(c, "causal");
    o.mask = X("mask");
    o.additive_mask = X("additive_mask");
    o.key_padding_mask = X("key_padding_mask");
    return o;
}
static ag_tensor *run_softmax(ag_tape *tp, const ref_case *c) {
    ag_softmax_opts o = softmax_opts(c);
    return ag_softmax(tp, X("x"), &o);
}
static ag_tensor *run_attention(ag_tape *tp, const ref_case *c) {
    ag_attention_opts o = {0};
    o.softmax = softmax_opts(c);
    o.heads = arg_int(c, "heads");
    return ag_attention(tp, X("q"), X("k"), X("v"), &o);
}
static ag_tensor *run_attention_packed(ag_tape *tp, const ref_case *c) {
    ag_attention_opts o = {0};
    o.softmax = softmax_opts(c);
    o.heads = arg_int(c, "heads");
    return ag_attention_packed(tp, X("qkv"), &o);
}
static ag_tensor *run_dropout(ag_tape *tp, const ref_case *c) {
    return ag_dropout(tp, X("x"), arg_num(c, "p", 0), true, (uint64_t)arg_num(c, "seed", 0),
                      (uint64_t)arg_num(c, "site", 0));
}
static ag_tensor *run_layernorm(ag_tape *tp, const ref_case *c) {
    return ag_layernorm(tp, X("x"), X("w"), X("b"), arg_num(c, "eps", 1e-5));
}
static ag_tensor *run_embedding(ag_tape *tp, const ref_case *c) {
    const ag_tensor *ids = ref_input(c, "ids");
    return ag_embedding(tp, X("weight"), ints(c, "ids"), ids->ndim, ids->shape);
}
static ag_tensor *run_cross_entropy(ag_tape *tp, const ref_case *c) {
    return ag_cross_entropy(tp, X("logits"), ints(c, "targets"), ref_input(c, "targets")->numel,
                            (int32_t)arg_num(c, "ignore_index", -100));
}
static ag_tensor *run_mse(ag_tape *tp, const ref_case *c) {
    return ag_mse(tp, X("x"), X("target"));
}
static ag_tensor *run_transpose(ag_tape *tp, const ref_case *c) {
    return ag_transpose(tp, X("x"), arg_int(c, "d0"), arg_int(c, "d1"));
}
static ag_tensor *run_permute(ag_tape *tp, const ref_case *c) {
    int perm[AG_MAX_DIMS];
    arg_ints(c, "perm", perm);
    return ag_permute(tp, X("x"), perm);
}
static ag_tensor *run_slice(ag_tape *tp, const ref_case *c) {
    return ag_slice(tp, X("x"), arg_int(c, "dim"), arg_int(c, "start"), arg_int(c, "length"));
}
static ag_tensor *run_concat(ag_tape *tp, const ref_case *c) {
    ag_tensor *xs[MAX_INPUTS];
    int n = numbered(c, xs);
    return ag_concat(tp, xs, n, arg_int(c, "dim"));
}
static ag_tensor *run_stack(ag_tape *tp, const ref_case *c) {
    ag_tensor *xs[MAX_INPUTS];
    int n = numbered(c, xs);
    return ag_stack(tp, xs, n, arg_int(c, "dim"));
}
static ag_tensor *run_expand(ag_tape *tp, const ref_case *c) {
    int shape[AG_MAX_DIMS], nd = arg_ints(c, "shape", shape);
    return ag_expand(tp, X("x"), nd, shape);
}
static ag_tensor *run_index_select(ag_tape *tp, const ref_case *c) {
    return ag_index_select(tp, X("x"), arg_int(c, "dim"), X("index"));
}
static ag_tensor *run_gather(ag_tape *tp, const ref_case *c) {
    return ag_gather(tp, X("x"), arg_int(c, "dim"), X("index"));
}
static ag_tensor *run_where(ag_tape *tp, const ref_case *c) {
    return ag_where(tp, X("cond"), X("a"), X("b"));
}
static ag_tensor *run_masked_fill(ag_tape *tp, const ref_case *c) {
    return ag_masked_fill(tp, X("x"), X("mask"), arg_num(c, "value", 0));
}
static ag_tensor *run_neg(ag_tape *tp, const ref_case *c) { return ag_neg(tp, X("x")); }
static ag_tensor *run_exp(ag_tape *tp, const ref_case *c) { return ag_exp(tp, X("x")); }
static ag_tensor *run_log(ag_tape *tp, const ref_case *c) { return ag_log(tp, X("x")); }
static ag_tensor *run_sqrt(ag_tape *tp, const ref_case *c) { return ag_sqrt(tp, X("x")); }
static ag_tensor *run_pow(ag_tape *tp, const ref_case *c) {
    return ag_pow(tp, X("x"), arg_num(c, "p", 1));
}
static ag_tensor *run_abs(ag_tape *tp, const ref_case *c) { return ag_abs(tp, X("x")); }
static ag_tensor *run_head_mask(ag_tape *tp, const ref_case *c) {
    return ag_head_mask(tp, X("x"), X("mask"), arg_int(c, "heads"));
}
static ag_tensor *run_rope(ag_tape *tp, const ref_case *c) {
    ag_rope_opts o = {arg_num(c, "base", 10000), arg_int(c, "offset"), arg_int(c, "heads")};
    return ag_rope(tp, X("x"), &o);
}
static ag_tensor *run_clamp(ag_tape *tp, const ref_case *c) {
    return ag_clamp(tp, X("x"), arg_num(c, "lo", -INFINITY), arg_num(c, "hi", INFINITY));
}
static ag_tensor *run_sigmoid(ag_tape *tp, const ref_case *c) { return ag_sigmoid(tp, X("x")); }
static ag_tensor *run_tanh(ag_tape *tp, const ref_case *c) { return ag_tanh(tp, X("x")); }
static ag_tensor *run_silu(ag_tape *tp, const ref_case *c) { return ag_silu(tp, X("x")); }
static ag_tensor *run_sum_dim(ag_tape *tp, const ref_case *c) {
    return ag_sum_dim(tp, X("x"), arg_int(c, "dim"), arg_bool(c, "keepdim"));
}
static ag_tensor *run_mean_dim(ag_tape *tp, const ref_case *c) {
    return ag_mean_dim(tp, X("x"), arg_int(c, "dim"), arg_bool(c, "keepdim"));
}
static ag_tensor *run_max_dim(ag_tape *tp, const ref_case *c) {
    return ag_max_dim(tp, X("x"), arg_int(c, "dim"), arg_bool(c, "keepdim"));
}
static ag_tensor *run_var_dim(ag_tape *tp, const ref_case *c) {
    return ag_var_dim(tp, X("x"), arg_int(c, "dim"), arg_bool(c, "unbiased"),
                      arg_bool(c, "keepdim"));
}
static ag_tensor *run_logsumexp(ag_tape *tp, const ref_case *c) {
    return ag_logsumexp(tp, X("x"), arg_int(c, "dim"), arg_bool(c, "keepdim"));
}
static ag_tensor *run_softmax_dim(ag_tape *tp, const ref_case *c) {
    return ag_softmax_dim(tp, X("x"), arg_int(c, "dim"));
}
static ag_tensor *run_log_softmax(ag_tape *tp, const ref_case *c) {
    return ag_log_softmax(tp, X("x"), arg_int(c, "dim"));
}
static ag_tensor *run_rmsnorm(ag_tape *tp, const ref_case *c) {
    return ag_rmsnorm(tp, X("x"), X("w"), arg_num(c, "eps", 1e-6));
}
static ag_tensor *run_nll_loss(ag_tape *tp, const ref_case *c) {
    return ag_nll_loss(tp, X("logp"), ints(c, "targets"), ref_input(c, "targets")->numel,
                       (int32_t)arg_num(c, "ignore_index", -100));
}
static ag_tensor *run_bce_with_logits(ag_tape *tp, const ref_case *c) {
    return ag_bce_with_logits(tp, X("x"), X("target"));
}
#undef X

// The dispatch: one runner per op of the registry, run_<op>.
#define RUNNER(name, ...) {#name, run_##name},
static const struct {
    const char *op;  // the ag_op's name, as the reference file's "c<i>.op" gives it
    runner run;
} ops[] = {AGI_OPS(RUNNER)};
#define N_OPS (int)(sizeof ops / sizeof ops[0])

static runner runner_for(const char *op) {
    for (int i = 0; op && i < N_OPS; i++)
        if (!strcmp(ops[i].op, op)) return ops[i].run;
    return NULL;
}

static ag_tensor *run(ag_tape *tp, const ref_case *c) {
    runner r = runner_for(c->op);
    return r ? r(tp, c) : NULL;
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
        const agi_op_entry *op = agi_op_find(c->op);
        fprintf(stderr, "case %d %s(%s) %s %s: relative error %.3e > %.0e against %s\n",
                c->index, c->op, c->args, ag_dtype_name(dt), what, e, tol,
                op ? op->torch : "?");
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
            if (c.in[i] && c.in[i]->requires_grad)
                compare(&c, what, c.in[i], true, tensor(&c, what), tol, dt);
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
    CHECK(n >= 100);
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

static bool reference_has_case(const char *op) {
    for (int i = 0; i < case_count(); i++) {
        char key[32];
        snprintf(key, sizeof key, "c%d.op", i);
        const char *name = ag_safetensors_meta(reference(), key);
        if (name && !strcmp(name, op)) return true;
    }
    return false;
}

// Every op of the registry has a case in the reference file
// (tests/pytorch/make_ops_reference.py writes them), and every case is of an op of the
// registry.
static void test_reference_covers_every_op(void) {
    for (int i = 0; i < N_OPS; i++) {
        if (!reference_has_case(ops[i].op)) {
            fprintf(stderr, "  op %s has no case in tests/reference/ops_pytorch.safetensors\n",
                    ops[i].op);
            CHECK(!"every op has a PyTorch case");
        }
    }
    for (int i = 0; i < case_count(); i++) {
        char key[32];
        snprintf(key, sizeof key, "c%d.op", i);
        CHECK(runner_for(ag_safetensors_meta(reference(), key)) != NULL);
    }
}

int main(void) {
    RUN(test_reference_covers_every_op);
    RUN(test_every_op_matches_pytorch_in_float64);
    RUN(test_every_op_matches_pytorch_in_float32);
    ag_safetensors_free((ag_safetensors *)reference());
    return testing_summary();
}
