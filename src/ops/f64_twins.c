// Every built-in op's f32 variant and its f64 twin, for ag_tape_check: an f32 node is
// checked through the same op in f64 (src/ops/tape_check.c). The typed sources define
// both variants from one text (src/core/real.h), so the twin runs the same arithmetic.
// tests/test_tape_check.c fails for an op defined in src/ops/ that is missing here.
#include "op.h"

#define TWIN(x) {&agi_##x##_op_f32, &agi_##x##_op_f64}
#define DECLARE(x) extern const ag_op agi_##x##_op_f32, agi_##x##_op_f64;
#define OPS(X)                                                                                 \
    X(attention) X(attention_packed) X(add) X(sub) X(mul) X(div) X(concat) X(stack)           \
    X(cross_entropy) X(dropout) X(embedding) X(expand) X(gelu) X(head_mask) X(split_heads)    \
    X(merge_heads) X(index_select) X(gather) X(layernorm) X(linear) X(logsumexp)              \
    X(softmax_dim) X(log_softmax) X(nll_loss) X(bce_with_logits) X(matmul) X(mse) X(permute)  \
    X(transpose) X(sum) X(mean) X(sum_dim) X(mean_dim) X(max_dim) X(var_dim) X(relu)          \
    X(reshape) X(rmsnorm) X(rope) X(scale) X(slice) X(softmax) X(neg) X(exp) X(log) X(sqrt)   \
    X(pow) X(abs) X(clamp) X(sigmoid) X(tanh) X(silu) X(where) X(masked_fill)

OPS(DECLARE)
#define ENTRY(x) TWIN(x),
static const struct {
    const ag_op *f32, *f64;
} twins[] = {OPS(ENTRY)};

const ag_op *agi_op_f64(const ag_op *op) {
    for (size_t i = 0; i < sizeof twins / sizeof twins[0]; i++)
        if (twins[i].f32 == op) return twins[i].f64;
    return NULL;
}
