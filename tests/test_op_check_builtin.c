// ag_op_check on every built-in op: a second witness beside each op's hand-written tests.
// The list of ops is the registry's (src/ops/registry.h): an op there without its
// description here (spec_<name>) does not compile. Each description says how to call the
// op and what its inputs look like (attograd/op_check.h); the suite makes the shapes.
#include "../src/ops/registry.h"
#include "testing.h"

#define FLOAT(n, d) {.name = n, .dims = d}
#define BROADCAST(n, d) {.name = n, .dims = d, .broadcast = true}
#define POSITIVE(n, d) {.name = n, .dims = d, .lo = 0.5, .hi = 2}
#define MASK(n, d) {.name = n, .dims = d, .kind = AG_INPUT_MASK, .broadcast = true}
#define IDS(n, d, b) {.name = n, .dims = d, .kind = AG_INPUT_INDEX32, .below = b}

// One op: its build function and its description. `dims` are the inputs' shapes.
#define SPEC(op, sizes, ...)                                                                \
    static const ag_op_spec spec_##op = {#op, build_##op, NULL,                             \
                                         sizeof((ag_op_input[]){__VA_ARGS__}) /             \
                                             sizeof(ag_op_input),                           \
                                         {__VA_ARGS__}, sizes}
#define BUILD(op) static ag_tensor *build_##op(ag_tape *tp, ag_tensor *const in[], const void *a)
#define UNUSED (void)a

// ---- Shapes ------------------------------------------------------------------------------
BUILD(reshape) {
    UNUSED;
    int n = (int)in[0]->numel;
    return ag_reshape(tp, in[0], 1, &n);
}
SPEC(reshape, "", FLOAT("x", "... N"));
BUILD(transpose) {
    UNUSED;
    return ag_transpose(tp, in[0], -1, -2);
}
SPEC(transpose, "", FLOAT("x", "... M N"));
BUILD(permute) {
    UNUSED;
    return ag_permute(tp, in[0], (int[]){2, 0, 1});
}
SPEC(permute, "", FLOAT("x", "A B C"));
BUILD(slice) {
    UNUSED;
    return ag_slice(tp, in[0], -1, 1, in[0]->shape[in[0]->ndim - 1] - 1);
}
SPEC(slice, "N>1", FLOAT("x", "... N"));
BUILD(concat) {
    UNUSED;
    return ag_concat(tp, in, 2, -1);
}
SPEC(concat, "", FLOAT("x0", "... N"), FLOAT("x1", "... M"));
BUILD(stack) {
    UNUSED;
    return ag_stack(tp, in, 2, 0);
}
SPEC(stack, "", FLOAT("x0", "... N"), FLOAT("x1", "... N"));
BUILD(expand) {
    UNUSED;
    return ag_expand(tp, in[0], 3, (int[]){in[0]->shape[0], 3, in[0]->shape[2]});
}
SPEC(expand, "", FLOAT("x", "A 1 N"));
BUILD(index_select) {
    UNUSED;
    return ag_index_select(tp, in[0], -1, in[1]);
}
SPEC(index_select, "", FLOAT("x", "... N"),
     {.name = "index", .dims = "K", .kind = AG_INPUT_INDEX, .below = 'N'});
BUILD(gather) {
    UNUSED;
    return ag_gather(tp, in[0], -1, in[1]);
}
SPEC(gather, "", FLOAT("x", "... N"),
     {.name = "index", .dims = "... K", .kind = AG_INPUT_INDEX, .below = 'N'});
BUILD(split_heads) {
    UNUSED;
    return ag_split_heads(tp, in[0], 2);
}
SPEC(split_heads, "E%2", FLOAT("x", "B T E"));
BUILD(merge_heads) {
    UNUSED;
    return ag_merge_heads(tp, in[0]);
}
SPEC(merge_heads, "", FLOAT("x", "B H T D"));

// ---- Broadcasting arithmetic ----------------------------------------------------------------
// An op of two inputs that broadcast against each other.
#define BINARY(op)                          \
    BUILD(op) {                             \
        UNUSED;                             \
        return ag_##op(tp, in[0], in[1]);   \
    }                                       \
    SPEC(op, "", BROADCAST("a", "..."), BROADCAST("b", "..."))
BINARY(add);
BINARY(sub);
BINARY(mul);
BUILD(div) {
    UNUSED;
    return ag_div(tp, in[0], in[1]);
}
SPEC(div, "", BROADCAST("a", "..."), {.name = "b", .dims = "...", .lo = 0.5, .hi = 2,
                                      .broadcast = true});
BUILD(where) {
    UNUSED;
    return ag_where(tp, in[0], in[1], in[2]);
}
SPEC(where, "", MASK("cond", "..."), BROADCAST("a", "..."), BROADCAST("b", "..."));
BUILD(masked_fill) {
    UNUSED;
    return ag_masked_fill(tp, in[0], in[1], -2.5);
}
SPEC(masked_fill, "", FLOAT("x", "..."), MASK("mask", "..."));
BUILD(scale) {
    UNUSED;
    return ag_scale(tp, in[0], -1.75);
}
SPEC(scale, "", FLOAT("x", "..."));

// ---- Elementwise ---------------------------------------------------------------------------
// An op of one input x; `more` its other arguments, in parentheses: (, -1, false).
#define ARGS(...) __VA_ARGS__
#define UNARY(op, more, ...)                \
    BUILD(op) {                             \
        UNUSED;                             \
        return ag_##op(tp, in[0] ARGS more); \
    }                                       \
    SPEC(op, "", __VA_ARGS__)
UNARY(neg, (), FLOAT("x", "..."));
UNARY(exp, (), FLOAT("x", "..."));
UNARY(log, (), POSITIVE("x", "..."));
UNARY(sqrt, (), POSITIVE("x", "..."));
UNARY(pow, (, 2.5), POSITIVE("x", "..."));
UNARY(abs, (), FLOAT("x", "..."));
UNARY(clamp, (, -0.5, 0.5), FLOAT("x", "..."));
UNARY(sigmoid, (), FLOAT("x", "..."));
UNARY(tanh, (), FLOAT("x", "..."));
UNARY(silu, (), FLOAT("x", "..."));
UNARY(relu, (), FLOAT("x", "..."));
UNARY(gelu, (, AG_GELU_ERF), FLOAT("x", "..."));

// ---- Reductions ----------------------------------------------------------------------------
UNARY(sum, (), FLOAT("x", "..."));
UNARY(mean, (), FLOAT("x", "..."));
UNARY(sum_dim, (, -1, false), FLOAT("x", "... N"));
UNARY(mean_dim, (, -1, true), FLOAT("x", "... N"));
UNARY(max_dim, (, -1, true), FLOAT("x", "... N"));
BUILD(var_dim) {
    UNUSED;
    return ag_var_dim(tp, in[0], -1, true, false);
}
SPEC(var_dim, "N>1", FLOAT("x", "... N"));
UNARY(logsumexp, (, -1, false), FLOAT("x", "... N"));

// ---- Normalisations ------------------------------------------------------------------------
UNARY(softmax_dim, (, -1), FLOAT("x", "... N"));
UNARY(log_softmax, (, -1), FLOAT("x", "... N"));
BUILD(softmax) {
    UNUSED;
    ag_softmax_opts o = {.scale = 0.5};
    return ag_softmax(tp, in[0], &o);
}
SPEC(softmax, "", FLOAT("x", "... T S"));
BUILD(layernorm) {
    UNUSED;
    return ag_layernorm(tp, in[0], in[1], in[2], 1e-5);
}
SPEC(layernorm, "", FLOAT("x", "... E"), FLOAT("w", "E"), FLOAT("b", "E"));
BUILD(rmsnorm) {
    UNUSED;
    return ag_rmsnorm(tp, in[0], in[1], 1e-5);
}
SPEC(rmsnorm, "", FLOAT("x", "... E"), FLOAT("w", "E"));

// ---- Products ------------------------------------------------------------------------------
BUILD(matmul) {
    UNUSED;
    return ag_matmul(tp, in[0], in[1], false, false);
}
SPEC(matmul, "", BROADCAST("a", "... M K"), BROADCAST("b", "... K N"));
BUILD(linear) {
    UNUSED;
    return ag_linear(tp, in[0], in[1], in[2]);
}
SPEC(linear, "", FLOAT("x", "... I"), FLOAT("w", "O I"), FLOAT("b", "O"));
BUILD(attention) {
    UNUSED;
    ag_attention_opts o = {.softmax = {.scale = 0.5}};
    return ag_attention(tp, in[0], in[1], in[2], &o);
}
SPEC(attention, "", FLOAT("q", "B H T D"), FLOAT("k", "B H S D"), FLOAT("v", "B H S D"));
BUILD(attention_packed) {
    UNUSED;
    ag_attention_opts o = {.softmax = {.scale = 0.5, .causal = true}, .heads = 2};
    return ag_attention_packed(tp, in[0], &o);
}
SPEC(attention_packed, "F%6", FLOAT("qkv", "B T F"));
BUILD(head_mask) {
    UNUSED;
    return ag_head_mask(tp, in[0], in[1], 0);
}
SPEC(head_mask, "", FLOAT("x", "B H T D"), FLOAT("mask", "H"));
BUILD(rope) {
    UNUSED;
    return ag_rope(tp, in[0], NULL);
}
SPEC(rope, "D%2", FLOAT("x", "B H T D"));

// ---- Lookup, regularisation, losses --------------------------------------------------------
BUILD(embedding) {
    UNUSED;
    return ag_embedding(tp, in[0], in[1]->data, in[1]->ndim, in[1]->shape);
}
SPEC(embedding, "", FLOAT("weight", "V E"), IDS("ids", "...", 'V'));
BUILD(dropout) {
    UNUSED;
    return ag_dropout(tp, in[0], 0.25, true, 3, 1);
}
SPEC(dropout, "", FLOAT("x", "... N"));
BUILD(cross_entropy) {
    UNUSED;
    return ag_cross_entropy(tp, in[0], in[1]->data, in[1]->numel, AG_IGNORE_INDEX);
}
SPEC(cross_entropy, "", FLOAT("logits", "... C"), IDS("targets", "...", 'C'));
BUILD(nll_loss) {
    UNUSED;
    return ag_nll_loss(tp, in[0], in[1]->data, in[1]->numel, AG_IGNORE_INDEX);
}
SPEC(nll_loss, "", FLOAT("logp", "... C"), IDS("targets", "...", 'C'));
BUILD(bce_with_logits) {
    UNUSED;
    return ag_bce_with_logits(tp, in[0], in[1]);
}
SPEC(bce_with_logits, "", FLOAT("x", "..."),
     {.name = "target", .dims = "...", .kind = AG_INPUT_CONSTANT, .lo = 0, .hi = 1,
      .fixed_range = true});
BUILD(mse) {
    UNUSED;
    return ag_mse(tp, in[0], in[1]);
}
SPEC(mse, "", FLOAT("x", "..."), FLOAT("target", "..."));

// Every op of the registry, by its description.
#define ENTRY(name, ...) &spec_##name,
static const ag_op_spec *const specs[] = {AGI_OPS(ENTRY)};

static void test_every_built_in_op_passes_the_op_suite(void) {
    int failed_ops = 0, checks = 0;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        ag_op_check_result r;
        if (!ag_op_check(specs[i], NULL, &r)) {
            failed_ops++;
            fprintf(stderr, "%s: %s\n", specs[i]->name, r.first_failure);
        }
        checks += r.passed + r.failed;
    }
    fprintf(stderr, "%d ops, %d checks, %d ops with a failure\n",
            (int)(sizeof specs / sizeof specs[0]), checks, failed_ops);
    CHECK(failed_ops == 0);
}

int main(void) {
    RUN(test_every_built_in_op_passes_the_op_suite);
    return testing_summary();
}
