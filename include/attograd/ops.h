// attograd/ops.h — differentiable ops. Each takes the tape it records on and
// returns its output in tape memory (or NULL after reporting an error).
//
// Shapes use PyTorch conventions: B batch, T query length, S key length,
// E embedding width, h heads, d = E / h head width, C classes.
// Every op works in AG_F32 and AG_F64; all float inputs of one op must share
// the dtype. Every matrix product goes through one function: attograd's own tile
// kernels where the CPU has AVX-512, OpenBLAS (sgemm / dgemm) elsewhere.
// In float32 the reductions, the losses and the norms' statistics sum in double (the
// matrix products sum in float32), so a result that fits in float32 stays finite where
// PyTorch's float32 sum overflows; the README's "Extreme values, against PyTorch 1.13"
// lists the differences.
#ifndef ATTOGRAD_OPS_H
#define ATTOGRAD_OPS_H

#include "attograd/tape.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- Elementwise ----------------------------------------------------------------
// a, b -> broadcast(a, b), numpy/PyTorch broadcasting in full: shapes are
// right-aligned, and each dim must be equal or 1 on one side (a bias [E] over
// [B,T,E], a mask [B,1,T,S] over [B,h,T,S], a column [N,1] against a row [M]).
// Each gradient is summed over the dims its operand was broadcast along, in a
// fixed order (the same every run). Same-shape and trailing-part operands take
// one vectorised loop, split across threads above a size threshold.
ag_tensor *ag_add(ag_tape *tp, ag_tensor *a, ag_tensor *b);
ag_tensor *ag_mul(ag_tape *tp, ag_tensor *a, ag_tensor *b);
// x: any -> same; y = s * x
ag_tensor *ag_scale(ag_tape *tp, ag_tensor *x, double s);
// x: any -> same; gradient 0 at x <= 0 (0 included), dy elsewhere and at a NaN (as PyTorch)
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
// The target value that means "not scored" (PyTorch's default
// ignore_index): pass it as ag_cross_entropy's ignore_index.
#define AG_IGNORE_INDEX (-100)

// logits: [..., C], targets: n_targets ints in [0, C) or == ignore_index -> [],
// the mean over non-ignored positions of -log softmax(logits)[target], fused
// and stable. n_targets must equal numel/C (the rows of logits); it is checked
// before any target is read. An ignored row's gradient is 0, or NaN (as
// PyTorch's) when its softmax is NaN: a NaN or +inf logit, or all -inf. If every
// target is ignored the loss is 0 and so is the gradient but for such rows
// (PyTorch's loss is NaN there). Targets are copied; an out-of-range target is
// an error naming its position and value.
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
// with trans_b) -> [..., M, N]. Leading dims broadcast as in numpy ([B,h,T,d] x
// [d,S], [B,1,T,d] x [1,h,d,S]); a broadcast operand's gradient sums over the
// products that shared it. 2-D operands are a plain matrix product. Q K^T is
// (q, k, false, true).
ag_tensor *ag_matmul(ag_tape *tp, ag_tensor *a, ag_tensor *b, bool trans_a, bool trans_b);

// ---- Heads ---------------------------------------------------------------------------
// x: [B, T, E] -> [B, h, T, E/h]; E must be divisible by h.
ag_tensor *ag_split_heads(ag_tape *tp, ag_tensor *x, int heads);
// x: [B, h, T, d] -> [B, T, h*d]
ag_tensor *ag_merge_heads(ag_tape *tp, ag_tensor *x);

// ---- Head mask ------------------------------------------------------------------------
// x: [B, h, T, d] (heads 0 or h) or [B, T, h*d] (heads = h, required), mask: [h] -> x's
// shape; head j's elements times mask[j]. The mask receives a gradient (the sum over its
// head of dy * x), so |d loss / d mask| measures each head's importance; a 0 entry
// silences the head. A mask whose length is not h is an error naming both shapes.
ag_tensor *ag_head_mask(ag_tape *tp, ag_tensor *x, ag_tensor *mask, int heads);

// ---- Masked scaled softmax ----------------------------------------------------------
// MASK POLARITY: by default (AG_MASK_BLOCKS), as in torch.nn.MultiheadAttention, a
// boolean mask entry that is TRUE means "NOT allowed to attend", and key padding true =
// padding. AG_MASK_KEEPS takes the opposite polarity, that of
// F.scaled_dot_product_attention and HuggingFace's attention_mask: true = may attend.
typedef enum ag_mask_polarity { AG_MASK_BLOCKS = 0, AG_MASK_KEEPS = 1 } ag_mask_polarity;

// Position information inside attention. RELATIVE, T5, ALIBI and SINUSOIDAL add a bias
// b(head, i, j) to the scaled score of query i and key j (before the masks); ROPE is the
// op ag_rope, applied to q and k.
typedef enum ag_pos_kind {
    AG_POS_NONE = 0,
    AG_POS_RELATIVE,  // learned table [h, 2M+1]: b = table[head, clip(j - i, -M, M) + M]
    AG_POS_T5,        // learned table [h, num_buckets]: b = table[head, bucket(j - i)],
                      // the buckets of HuggingFace's T5Attention._relative_position_bucket
    AG_POS_ALIBI,     // fixed: b = -slope_head |i - j| (bidirectional), or
                      // slope_head (j - i) (causal: -slope (i - j) for the keys j <= i a
                      // causal mask leaves; softmax is unchanged by the per-row shift)
    AG_POS_ROPE,      // rotary embedding: not a bias, see ag_rope
    AG_POS_SINUSOIDAL,  // fixed, from the inner product of sinusoidal embeddings of width
                        // D = dims (after Sandwich, Chi et al. 2023): b = lambda_head
                        // sum_{c=1..D/2} (cos((j - i) w_c) - 1), w_c = base^(-2c/D),
                        // lambda_head = h / (8 (head + 1)); 0 at j = i, <= 0 elsewhere
} ag_pos_kind;

// The kind's name: its AG_POS_ constant's without the prefix ("T5" for AG_POS_T5), from
// the library's table of schemes. NULL, unreported, for a value no kind has: counting up
// from AG_POS_NONE until NULL lists every kind (a program's choices: the examples' --pos).
const char *ag_pos_kind_name(ag_pos_kind kind);

typedef struct ag_pos_bias {
    ag_pos_kind kind;    // a kind with a term here: not ROPE (ag_rope, opts.rope)
    ag_tensor *table;    // RELATIVE: [h, 2M+1], index clip(j - i, -M, M) + M;
                         // T5: [h, num_buckets]; ALIBI: NULL. May require grad.
    int max_distance;    // RELATIVE: M; T5: max_distance (128 in T5)
    int num_buckets;     // T5 (32 in T5)
    bool bidirectional;  // T5 and ALIBI: false = causal variant
    int heads;           // ALIBI, SINUSOIDAL: h (the table's first dim gives it for the
                         // others)
    int dims;            // SINUSOIDAL: D >= 2 (a module gives its head_dim)
    double base;         // SINUSOIDAL (and a module's ROPE): 0 means 10000
} ag_pos_bias;

typedef struct ag_softmax_opts {
    double scale;                 // scores are x * scale; 0 is taken as 1
    bool causal;                  // mask key j > query i (top-left aligned when T != S,
                                  // unless q_offset says otherwise)
    int q_offset;                 // >= 0 (q_offset + T an int): position of query row 0
                                  // among the keys; query i sits at q_offset + i, for
                                  // causality (key j > q_offset + i masked) and the
                                  // position term (relative position j - q_offset - i).
                                  // A KV cache's new rows: its length;
                                  // bottom-right aligned causal: S - T
    int window;                   // > 0: sliding window (local attention) of W = window:
                                  // query i (at position p = q_offset + i) sees key j only
                                  // if p - j < W, and with causal also j <= p -- the last W
                                  // keys, itself included (Mistral's sliding_window as
                                  // HuggingFace counts it: W keys, not W + 1); without
                                  // causal also j - p < W (|p - j| < W: W - 1 keys on each
                                  // side, 2W - 1 in all). 0: no window
    ag_tensor *mask;              // AG_BOOL, masked where true (see mask_polarity)
    ag_tensor *additive_mask;     // float, added to the scores
                                  // Either mask ends in S. With 1, 2 or 4 dims it
                                  // broadcasts to the scores [..., T, S] from the right
                                  // (for [B, h, T, S]: [S], [T, S], [B, 1, 1, S],
                                  // [B, 1, T, S], [1, h, T, S], [B, h, T, S], ...); with
                                  // 3 dims it is one [T, S] plane per slice, [N, T, S]
                                  // (N = B*h, as nn.MultiheadAttention; N or T may be 1),
                                  // never [h, T, S] or [B, T, S]. It is read in place,
                                  // never expanded.
    ag_tensor *key_padding_mask;  // AG_BOOL [B, S], true = padding; x is [B, ..., T, S]
    ag_mask_polarity mask_polarity;  // applies to `mask` and key_padding_mask
    ag_pos_bias pos;              // position bias inside the softmax; x's leading index
                                  // n (over [..., T, S]) is of head n % h
} ag_softmax_opts;
// x: [..., T, S] -> [..., T, S], softmax over S of scale*x + additive - inf*masked.
// N above is the product of x's leading dims (B*h for [B, h, T, S]).
// A row whose keys are all masked gives zeros and passes zero gradient (PyTorch
// gives NaN there). An additive -inf counts as masked. A row whose unmasked scores
// contain a NaN (or a +inf) gives NaN, forward and backward, as in PyTorch. An
// additive mask that requires grad receives its gradient (summed over the dims it
// broadcasts over), and so does a position table.
// opts may be NULL (plain softmax).
ag_tensor *ag_softmax(ag_tape *tp, ag_tensor *x, const ag_softmax_opts *opts);

// ---- Rotary position embedding ---------------------------------------------------------
typedef struct ag_rope_opts {
    double base;     // 0 means 10000
    int pos_offset;  // position of row 0 (the cached length, with a KV cache)
    int heads;       // 0 for x [B, h, T, d]; h for x [B, T, h*d]
} ag_rope_opts;
// x: [B, h, T, d] or [B, T, h*d] (opts->heads = h) -> same, d even. Rotates each pair
// (x_c, x_{c+d/2}) of row t by the angle (pos_offset + t) base^(-2c/d), c < d/2: the
// rotate_half convention of HuggingFace LLaMA and GPT-NeoX,
//     y = x cos + rotate_half(x) sin,  rotate_half(x) = [-x2, x1].
// Backward is the inverse rotation. opts may be NULL.
ag_tensor *ag_rope(ag_tape *tp, ag_tensor *x, const ag_rope_opts *opts);

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
    int kv_heads;             // h_kv, the heads of k and v (grouped-query attention): 0
                              // means h; else it divides h, and query head i reads kv head
                              // i / (h / h_kv) (PyTorch 2.5's scaled_dot_product_attention
                              // with enable_gqa: k and v repeat_interleave'd to h heads,
                              // here read in place, never copied); 1 is multi-query
    int kv_len;               // the keys in use, S: the first kv_len rows of k and v (which
                              // may hold more, a KV cache's capacity); 0: all of them
    bool rope;                // rotate q and k first, as ag_rope(q), ag_rope(k) with
    ag_rope_opts rope_opts;   // rope_opts (its base and pos_offset; heads is ignored), but
                              // inside: no rotated copies are kept (d must be even); query
                              // i at position pos_offset + q_offset + i, key j at
                              // pos_offset + j
    ag_tensor *head_mask;     // float [h], or NULL: head j's output times head_mask[j], as
                              // ag_head_mask after the attention (the mask receives its
                              // gradient)
    bool recompute_scores;    // backward makes the scores again from q and k even for
                              // S <= 1024, where forward would keep them (see below):
                              // less memory, the same bits
} ag_attention_opts;
// q: [B, h, T, d], k: [B, h, S, d], v: [B, h, S, dv] -> [B, h, T, dv];
//     out = dropout(softmax(q k^T, &o->softmax), o->dropout, o->training, o->seed, o->site) v
// with the semantics of exactly that composition of ag_matmul, ag_softmax, ag_dropout and
// ag_matmul: the same masks (and polarity), position bias, zeros and zero gradient for a
// fully masked query, NaN for a query whose scores hold a NaN or +inf (a NaN in q, k or
// v reaches the output and gradients where the composition puts it; one exception: with
// causal or a window, the keys that no query of a block of queries may see are not read
// for that block (so with a window W time grows as T * W, not T * S), and a NaN held only
// there does not spread through their zero weights as 0 * NaN does in the composition),
// the same dropout mask (row (b*h + head)*T + t of the
// weights, D = S), a gradient for an additive mask that requires grad. It computes blocks of scores on the fly (an
// online softmax) and saves a row max and log sum per query for backward. When recording with at
// most S = 1024 keys, it also keeps the masked scores (B h T S floats, rows padded to a
// multiple of 16 and never to one of 64: about what torch.nn.MultiheadAttention keeps
// of its weights) if they take at most 512 MiB, so that backward reads them instead of
// making them again (one product in seven, and the masks). For longer sequences, or
// with opts recompute_scores, backward recomputes them from q and k, flash-attention
// style: no [T, S] matrix is stored, so memory grows with T, not T * S (the one
// exception: the gradient of an additive mask shared by several slices takes a buffer
// of the mask's size per extra thread). Both ways give the same bits. A position bias
// is computed from (i, j) per
// block, and its table's gradient gathered in its backward (a [h, T+S-1] buffer per
// thread). The weights themselves are not available; compose the ops when
// you need them. opts may be NULL (unscaled, unmasked, no dropout).
//
// With kv_heads = h_kv < h, k and v have h_kv heads ([B, h_kv, S, d], [B, h_kv, S, dv];
// heads inside: [B, S, h_kv*d], [B, S, h_kv*dv]; packed: qkv [B, T, (h + 2 h_kv) d]), and
// the gradient of a kv head is the sum over the h / h_kv query heads that read it.
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
// with their gradients landing in qkv's one gradient. S = T. With kv_heads = h_kv: qkv
// [B, T, (h + 2 h_kv) d], q, k, v the columns [0, hd), [hd, hd + h_kv d), [hd + h_kv d, ...).
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

// ==== General ops: shapes, broadcasting, elementwise math, reductions ====================
// PyTorch's names and semantics. `dim` counts as in PyTorch: -1 is the last dim, and a dim
// outside [-ndim, ndim) is an error. Tensors stay contiguous: every op here that changes a
// shape (transpose, permute, slice, concat, stack, expand, index_select, gather) COPIES its
// input into a new tape tensor; none returns a view.

// ---- Shapes ----------------------------------------------------------------------------
// x: [.., a, .., b, ..] -> [.., b, .., a, ..] (dims d0 and d1 swapped).
ag_tensor *ag_transpose(ag_tape *tp, ag_tensor *x, int d0, int d1);
// x: [s_0, ..., s_{n-1}] -> [s_perm[0], ..., s_perm[n-1]]; perm has x->ndim entries.
ag_tensor *ag_permute(ag_tape *tp, ag_tensor *x, const int perm[]);
// PyTorch's narrow: entries [start, start + length) of dim; start < 0 counts from the end.
ag_tensor *ag_slice(ag_tape *tp, ag_tensor *x, int dim, int start, int length);
// xs[k]: shapes equal except along dim -> sizes along dim added up. Any n >= 1 (more than
// AG_MAX_INPUTS inputs take several nodes).
ag_tensor *ag_concat(ag_tape *tp, ag_tensor *const xs[], int n, int dim);
// xs[k]: all the same shape [*s] -> [*s with n inserted at dim] (dim in [-ndim-1, ndim]).
ag_tensor *ag_stack(ag_tape *tp, ag_tensor *const xs[], int n, int dim);
// x -> `shape` by broadcasting (new leading dims, size-1 dims repeated); -1 in shape
// keeps x's size. Backward sums over the broadcast dims.
ag_tensor *ag_expand(ag_tape *tp, ag_tensor *x, int ndim, const int shape[]);
// x: [.., n, ..], index: i32 or i64 [m] with entries in [0, n) -> [.., m, ..].
// Both take a copy of the index they checked when they record, so the index may
// change after the call.
ag_tensor *ag_index_select(ag_tape *tp, ag_tensor *x, int dim, ag_tensor *index);
// x, index (i32 or i64, same number of dims, index.shape[d] <= x.shape[d] for d != dim)
// -> index's shape; y[p] = x[p with coordinate dim replaced by index[p]].
ag_tensor *ag_gather(ag_tape *tp, ag_tensor *x, int dim, ag_tensor *index);

// ---- More broadcasting arithmetic (as ag_add and ag_mul above) -------------------------
ag_tensor *ag_sub(ag_tape *tp, ag_tensor *a, ag_tensor *b);
ag_tensor *ag_div(ag_tape *tp, ag_tensor *a, ag_tensor *b);
// cond (bool), a, b broadcast together -> cond ? a : b.
ag_tensor *ag_where(ag_tape *tp, ag_tensor *cond, ag_tensor *a, ag_tensor *b);
// x, mask (bool, broadcasting to x's shape) -> x's shape, value where mask is true.
// value may be -INFINITY; masked places pass exactly zero gradient (never NaN).
ag_tensor *ag_masked_fill(ag_tape *tp, ag_tensor *x, ag_tensor *mask, double value);

// ---- Elementwise functions: x -> same shape -----------------------------------------------
ag_tensor *ag_neg(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_exp(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_log(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_sqrt(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_pow(ag_tape *tp, ag_tensor *x, double p);  // x^p, p a finite scalar
ag_tensor *ag_abs(ag_tape *tp, ag_tensor *x);            // gradient sign(x), 0 at 0
// min(max(x, lo), hi); pass -INFINITY or INFINITY for one side. Gradient 1 where
// lo <= x <= hi (PyTorch's convention at the bounds), 0 elsewhere; lo > hi gives hi
// everywhere (a NaN stays NaN) and zero gradient, as PyTorch. A NaN bound is an error
// (PyTorch: a NaN result).
ag_tensor *ag_clamp(ag_tape *tp, ag_tensor *x, double lo, double hi);
ag_tensor *ag_sigmoid(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_tanh(ag_tape *tp, ag_tensor *x);
ag_tensor *ag_silu(ag_tape *tp, ag_tensor *x);  // x * sigmoid(x)

// ---- Reductions along a dim ----------------------------------------------------------------
// x -> x's shape without dim (or with it kept as 1 when keepdim).
ag_tensor *ag_sum_dim(ag_tape *tp, ag_tensor *x, int dim, bool keepdim);
ag_tensor *ag_mean_dim(ag_tape *tp, ag_tensor *x, int dim, bool keepdim);
// The values of torch.max(x, dim); the gradient goes to the first arg max (ties as PyTorch).
ag_tensor *ag_max_dim(ag_tape *tp, ag_tensor *x, int dim, bool keepdim);
// Variance, divided by n - 1 (unbiased) or n. Unbiased with n = 1 is an error.
ag_tensor *ag_var_dim(ag_tape *tp, ag_tensor *x, int dim, bool unbiased, bool keepdim);
// log sum exp along dim, stable. A row entirely -inf gives -inf and zero gradient.
ag_tensor *ag_logsumexp(ag_tape *tp, ag_tensor *x, int dim, bool keepdim);
// x -> same shape. Stable: the max is subtracted first, so float32 keeps its accuracy
// whatever the logits' common offset. A row entirely -inf gives zeros (softmax) or -inf
// (log_softmax) and zero gradient, where PyTorch gives NaN; in another row a -inf entry
// gets weight 0 and, from softmax, zero gradient (from log_softmax, whose output there is
// -inf, its own dy, as PyTorch: d y_j / d x_j = 1 - p_j = 1); a NaN or a +inf entry makes
// the whole row NaN, as in PyTorch.
// (ag_softmax above is the masked, scaled attention softmax over the last dim.)
ag_tensor *ag_softmax_dim(ag_tape *tp, ag_tensor *x, int dim);
ag_tensor *ag_log_softmax(ag_tape *tp, ag_tensor *x, int dim);

// ---- Norms and losses ------------------------------------------------------------------------
// x: [..., E], w: [E] or NULL -> [..., E]; y = x / sqrt(mean(x^2) + eps) * w.
ag_tensor *ag_rmsnorm(ag_tape *tp, ag_tensor *x, ag_tensor *w, double eps);
// logp: [..., C] log-probabilities, targets as ag_cross_entropy (n_targets of them, which
// must equal numel/C; checked before any target is read) -> [], the mean over
// non-ignored positions of -logp[target] (0 with zero gradient if all are ignored).
ag_tensor *ag_nll_loss(ag_tape *tp, ag_tensor *logp, const int32_t *targets,
                       size_t n_targets, int32_t ignore_index);
// x (logits), target (in [0, 1]): same shape -> [], the mean of
// -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))), stable for any |x|; both may
// require grad. An infinite x gives +inf (NaN where the term is 0 * inf: x = +inf, t = 1 or
// x = -inf, t = 0), as PyTorch for x = +inf; PyTorch gives NaN for every x = -inf.
ag_tensor *ag_bce_with_logits(ag_tape *tp, ag_tensor *x, ag_tensor *target);

#ifdef __cplusplus
}
#endif
#endif
