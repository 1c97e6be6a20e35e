// attograd/ops.h — differentiable ops. Each takes the tape it records on and
// returns its output in tape memory (or NULL after reporting an error).
//
// Shapes use PyTorch conventions: B batch, T query length, S key length,
// E embedding width, h heads, d = E / h head width, C classes.
// Every op works in AG_F32 and AG_F64; all float inputs of one op must share
// the dtype. Every matrix product goes through OpenBLAS (sgemm / dgemm).
#ifndef ATTOGRAD_OPS_H
#define ATTOGRAD_OPS_H

#include "attograd/tape.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- Elementwise ----------------------------------------------------------------
// a: [..., *s], b: [*s] -> [..., *s]. b's shape equals a's or a trailing part
// of it (a bias [E] over [B,T,E], a position table [T,E] over [B,T,E]); its
// gradient is summed over the broadcast leading dims.
ag_tensor *ag_add(ag_tape *tp, ag_tensor *a, ag_tensor *b);
ag_tensor *ag_mul(ag_tape *tp, ag_tensor *a, ag_tensor *b);
// x: any -> same; y = s * x
ag_tensor *ag_scale(ag_tape *tp, ag_tensor *x, double s);
// x: any -> same
ag_tensor *ag_relu(ag_tape *tp, ag_tensor *x);

typedef enum ag_gelu_kind {
    AG_GELU_ERF,   // x * Phi(x), exact (PyTorch approximate='none')
    AG_GELU_TANH,  // PyTorch approximate='tanh'
} ag_gelu_kind;
ag_tensor *ag_gelu(ag_tape *tp, ag_tensor *x, ag_gelu_kind kind);

// x: any -> `shape` with the same numel (a copy; gradients flow back).
ag_tensor *ag_reshape(ag_tape *tp, ag_tensor *x, int ndim, const int shape[]);

// ---- Reductions and losses --------------------------------------------------------
// x: any -> [] (a scalar)
ag_tensor *ag_sum(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_mean(ag_tape *tp, ag_tensor *x);
// x, target: same shape -> [], mean((x - target)^2); both may require grad.
ag_tensor *ag_mse(ag_tape *tp, ag_tensor *x, ag_tensor *target);
// logits: [..., C], targets: n_targets ints in [0, C) or == ignore_index -> [],
// the mean over non-ignored positions of -log softmax(logits)[target], fused
// and stable. n_targets must equal numel/C (the rows of logits); it is checked
// before any target is read. If every target is ignored the loss is 0 with zero
// gradient (PyTorch returns NaN there). Targets are copied; an out-of-range
// target is an error naming its position and value.
ag_tensor *ag_cross_entropy(ag_tape *tp, ag_tensor *logits, const int32_t *targets,
                            size_t n_targets, int32_t ignore_index);

// ---- Lookup and projections -------------------------------------------------------
// weight: [V, E], ids: `shape` ints in [0, V) -> [*shape, E]. Backward adds each
// output row's gradient into its weight row (repeated ids accumulate).
ag_tensor *ag_embedding(ag_tape *tp, ag_tensor *weight, const int32_t *ids, int ndim,
                        const int shape[]);
// x: [..., in], w: [out, in] (PyTorch layout), b: [out] or NULL -> [..., out];
// y = x w^T + b.
ag_tensor *ag_linear(ag_tape *tp, ag_tensor *x, ag_tensor *w, ag_tensor *b);
// a: [..., M, K] (or [..., K, M] with trans_a), b: [..., K, N] (or [..., N, K]
// with trans_b) -> [..., M, N]. Leading dims must be equal (no broadcasting);
// 2-D operands are a plain matrix product. Q K^T is (q, k, false, true).
ag_tensor *ag_matmul(ag_tape *tp, ag_tensor *a, ag_tensor *b, bool trans_a, bool trans_b);

// ---- Heads ---------------------------------------------------------------------------
// x: [B, T, E] -> [B, h, T, E/h]; E must be divisible by h.
ag_tensor *ag_split_heads(ag_tape *tp, ag_tensor *x, int heads);
// x: [B, h, T, d] -> [B, T, h*d]
ag_tensor *ag_merge_heads(ag_tape *tp, ag_tensor *x);

// ---- Masked scaled softmax ----------------------------------------------------------
// MASK POLARITY: as in torch.nn.MultiheadAttention, a boolean mask entry that is
// TRUE means "NOT allowed to attend". (torch's scaled_dot_product_attention uses
// the opposite polarity: there true means allowed.) Key padding: true = padding.
typedef struct ag_softmax_opts {
    double scale;                 // scores are x * scale; 0 is taken as 1
    bool causal;                  // mask key j > query i (top-left aligned when T != S)
    ag_tensor *mask;              // AG_BOOL [T, S] or [N, T, S], true = masked
    ag_tensor *additive_mask;     // float [T, S] or [N, T, S], added to the scores
                                  // (either mask may also have x's own shape, [B,h,T,S])
    ag_tensor *key_padding_mask;  // AG_BOOL [B, S], true = padding; x is [B, ..., T, S]
} ag_softmax_opts;
// x: [..., T, S] -> [..., T, S], softmax over S of scale*x + additive - inf*masked.
// N above is the product of x's leading dims (B*h for [B, h, T, S]).
// A row whose keys are all masked gives zeros and passes zero gradient (PyTorch
// gives NaN there). An additive -inf counts as masked. An additive mask that
// requires grad receives its gradient (summed over slices when it is [T, S]).
// opts may be NULL (plain softmax).
ag_tensor *ag_softmax(ag_tape *tp, ag_tensor *x, const ag_softmax_opts *opts);

// ---- Fused scaled-dot-product attention ------------------------------------------------
typedef struct ag_attention_opts {
    ag_softmax_opts softmax;  // scale, causal and masks, exactly as ag_softmax takes them
                              // on the scores [B, h, T, S] (scale 0 means 1, as there:
                              // pass 1/sqrt(d) for the usual attention)
    double dropout;           // p on the attention weights, in [0, 1]
    bool training;            // dropout applies only when training (and p > 0)
    uint64_t seed, site;      // the dropout stream, as ag_dropout's
    int heads;                // h, for heads inside the last dim (3-D q, k, v, and
                              // ag_attention_packed); 0 (or h) for [B, h, T, d] inputs
} ag_attention_opts;
// q: [B, h, T, d], k: [B, h, S, d], v: [B, h, S, dv] -> [B, h, T, dv];
//     out = dropout(softmax(q k^T, &o->softmax), o->dropout, o->training, o->seed, o->site) v
// with the semantics of exactly that composition of ag_matmul, ag_softmax, ag_dropout and
// ag_matmul: the same masks (and polarity), zeros and zero gradient for a fully masked
// query, the same dropout mask (row (b*h + head)*T + t of the weights, D = S), a gradient
// for an additive mask that requires grad. It computes blocks of scores on the fly (an
// online softmax) and saves only a logsumexp per query for backward, which recomputes
// them: no [T, S] weights are ever stored, so memory grows with T, not T * S (the one
// exception: the gradient of a shared [T, S] additive mask takes a [T, S] buffer per
// extra thread). The weights themselves are therefore not available; compose the ops
// when you need them. opts may be NULL (unscaled, unmasked, no dropout).
//
// Heads inside the last dim, as a projection makes them (h = opts->heads, required):
//     q: [B, T, h*d], k: [B, S, h*d], v: [B, S, h*dv] -> [B, T, h*dv]
// is the same attention on the heads that ag_split_heads would make, its output the one
// ag_merge_heads would make of the 4-D result (same masks, same dropout rows), without
// either copy: each head is read and written in place.
ag_tensor *ag_attention(ag_tape *tp, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                        const ag_attention_opts *opts);
// Self-attention on one packed projection (x in_proj_weight^T for in_proj_weight
// [3E, E], as torch.nn.MultiheadAttention packs it):
//     qkv: [B, T, 3E] -> [B, T, E],  E = h*d, h = opts->heads (required)
// is ag_attention(q, k, v, opts) for q, k, v = columns [0, E), [E, 2E), [2E, 3E) of qkv,
// with their gradients landing in qkv's one gradient. S = T.
ag_tensor *ag_attention_packed(ag_tape *tp, ag_tensor *qkv, const ag_attention_opts *opts);

// ---- Dropout ---------------------------------------------------------------------------
// x: [..., D] -> same. Inverted dropout: y = x * keep / (1 - p) when training,
// y = x otherwise; p = 1 gives x * 0. A dropped element is multiplied by 0,
// not set to 0, so a NaN or inf there gives NaN, as in PyTorch (and a NaN
// upstream gradient stays NaN in backward). The keep mask of element (r, c),
// r the row over the leading dims, is drawn from pcg32 seeded (seed, site) and
// advanced to r * D + c, so the same (seed, site) replays the same mask on
// every forward and any row can be regenerated on its own. The exact rule:
// with u the next 32-bit output of that generator, the element is kept iff
//     u >= round(p * 2^32)        (round half away from zero),
// so P(keep) is 1 - p to within 2^-33. p must be in [0, 1]. When not training,
// or when p = 0, x itself is returned (no node, as PyTorch in eval mode).
ag_tensor *ag_dropout(ag_tape *tp, ag_tensor *x, double p, bool training, uint64_t seed,
                      uint64_t site);
// Regenerates, on its own, the keep mask of row `row` of ag_dropout(x: [..., D],
// p, training = true, seed, site): keep[c] = 1 if element (row, c) is kept, else
// 0 (D bytes). Same rule and code as the forward, so a fused kernel can replay a
// row's mask instead of storing it.
void ag_dropout_row_mask(uint64_t seed, uint64_t site, double p, size_t row, int D,
                         uint8_t *keep);

// ---- LayerNorm -----------------------------------------------------------------------
// x: [..., E], w: [E] or NULL, b: [E] or NULL -> [..., E].
// y = (x - mean) / sqrt(var + eps) * w + b, biased variance (as PyTorch).
ag_tensor *ag_layernorm(ag_tape *tp, ag_tensor *x, ag_tensor *w, ag_tensor *b, double eps);

#ifdef __cplusplus
}
#endif
#endif
