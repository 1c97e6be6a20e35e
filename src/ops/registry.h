// The op registry: every built-in op, one line each. It is the one list of ops (the idea
// of PyTorch's tools/autograd/derivatives.yaml); what else names the ops is made from it
// or checked against it:
//   made from it:   the extern declarations of every agi_<name>_op_f32 / _f64 (below),
//                   the f64 twin of each f32 op (agi_op_f64, for ag_tape_check), the
//                   table agi_ops, and the runner table of tests/test_ops_pytorch.c (a
//                   missing runner does not compile);
//   checked by tests/test_op_registry.c: an op defined in src/ops/ and not here, an op
//                   here without its `ag_<name>` in include/attograd/ops.h or in the
//                   README's op table (and the reverse), a name or rule that differs
//                   between the f32 and f64 variants;
//   checked by tests/test_ops_pytorch.c: an op here without a case in
//                   tests/reference/ops_pytorch.safetensors (and the reverse); and
//                   tests/pytorch/make_ops_reference.py refuses to write the file unless
//                   every op here has a case.
//
//   X(name, torch)
//     name   the op's name, as its ag_op says it; its variants are agi_<name>_op_f32 and
//            agi_<name>_op_f64 (one definition, `const ag_op R(agi_<name>_op)`, in its op
//            file), its constructor ag_<name> (include/attograd/ops.h). The gradient rule
//            is the ag_op's `rule`, written beside the op's backward.
//     torch  what the PyTorch reference case computes (tests/pytorch/make_ops_reference.py):
//            PyTorch's function, or the PyTorch expression for an op PyTorch lacks.
//
// To add an op: its file in src/ops/ (forward, backward, rule, constructor), its line
// here, its declaration in ops.h and its row in the README's op table, its runner in
// tests/test_ops_pytorch.c and its case in make_ops_reference.py (then run the script).
#ifndef ATTOGRAD_OPS_REGISTRY_H
#define ATTOGRAD_OPS_REGISTRY_H

#include "attograd/tape.h"

// clang-format off
#define AGI_OPS(X)                                                                          \
    /* shapes */                                                                            \
    X(reshape, "torch.reshape")                                                             \
    X(transpose, "torch.transpose")                                                         \
    X(permute, "torch.permute")                                                             \
    X(slice, "torch.narrow")                                                                \
    X(concat, "torch.cat")                                                                  \
    X(stack, "torch.stack")                                                                 \
    X(expand, "torch.Tensor.expand")                                                        \
    X(index_select, "torch.index_select")                                                   \
    X(gather, "torch.gather")                                                               \
    X(split_heads, "x.reshape(B, T, h, E // h).transpose(1, 2)")                            \
    X(merge_heads, "x.transpose(1, 2).reshape(B, T, h * d)")                                \
    /* broadcasting arithmetic */                                                           \
    X(add, "torch.add")                                                                     \
    X(sub, "torch.sub")                                                                     \
    X(mul, "torch.mul")                                                                     \
    X(div, "torch.div")                                                                     \
    X(where, "torch.where")                                                                 \
    X(masked_fill, "torch.Tensor.masked_fill")                                              \
    X(scale, "s * x")                                                                       \
    /* elementwise */                                                                       \
    X(neg, "torch.neg")                                                                     \
    X(exp, "torch.exp")                                                                     \
    X(log, "torch.log")                                                                     \
    X(sqrt, "torch.sqrt")                                                                   \
    X(pow, "torch.pow (scalar exponent)")                                                   \
    X(abs, "torch.abs")                                                                     \
    X(clamp, "torch.clamp")                                                                 \
    X(sigmoid, "torch.sigmoid")                                                             \
    X(tanh, "torch.tanh")                                                                   \
    X(silu, "torch.nn.functional.silu")                                                     \
    X(relu, "torch.nn.functional.relu")                                                     \
    X(gelu, "torch.nn.functional.gelu")                                                     \
    /* reductions */                                                                        \
    X(sum, "torch.sum")                                                                     \
    X(mean, "torch.mean")                                                                   \
    X(sum_dim, "torch.sum(x, dim, keepdim)")                                                \
    X(mean_dim, "torch.mean(x, dim, keepdim)")                                              \
    X(max_dim, "torch.max(x, dim, keepdim).values")                                         \
    X(var_dim, "torch.var(x, dim, unbiased, keepdim)")                                      \
    X(logsumexp, "torch.logsumexp")                                                         \
    /* normalisations */                                                                    \
    X(softmax_dim, "torch.softmax")                                                         \
    X(log_softmax, "torch.log_softmax")                                                     \
    X(softmax, "torch.softmax of scale * x, masked (a fully masked row: zeros)")            \
    X(layernorm, "torch.nn.functional.layer_norm")                                          \
    X(rmsnorm, "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w")                \
    /* products */                                                                          \
    X(matmul, "torch.matmul")                                                               \
    X(linear, "torch.nn.functional.linear")                                                 \
    X(attention, "softmax(q k^T * scale, masked) v, as torch composes it")                  \
    X(attention_packed, "the same on q, k, v cut from one [B, T, 3E] projection")           \
    X(head_mask, "x * mask[head]")                                                          \
    X(rope, "x * cos + rotate_half(x) * sin (HuggingFace LLaMA)")                           \
    /* lookup, regularisation */                                                            \
    X(embedding, "torch.nn.functional.embedding")                                           \
    X(dropout, "x * keep / (1 - p), keep drawn by attograd's pcg32 rule")                   \
    /* losses */                                                                            \
    X(cross_entropy, "torch.nn.functional.cross_entropy")                                   \
    X(nll_loss, "torch.nn.functional.nll_loss")                                             \
    X(bce_with_logits, "torch.nn.functional.binary_cross_entropy_with_logits")              \
    X(mse, "torch.nn.functional.mse_loss")
// clang-format on

#define AGI_OP_DECLARE(name, ...) extern const ag_op agi_##name##_op_f32, agi_##name##_op_f64;
AGI_OPS(AGI_OP_DECLARE)

// One op of the registry, as a table entry (extend it here and in registry.c).
typedef struct agi_op_entry {
    const char *name;        // as its ag_op's name: ag_<name> builds it
    const ag_op *f32, *f64;  // its two variants; f32->rule is its gradient rule
    const char *torch;       // what its PyTorch reference case computes
} agi_op_entry;

// Every op of AGI_OPS, in its order.
extern const agi_op_entry agi_ops[];
extern const int agi_n_ops;

// The entry of the op named `name`, or NULL.
const agi_op_entry *agi_op_find(const char *name);

// The f64 twin of a built-in f32 op; NULL for any other op (an f64 op, your own).
const ag_op *agi_op_f64(const ag_op *op);

#endif
