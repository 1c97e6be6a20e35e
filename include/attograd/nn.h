// attograd/nn.h — modules: Linear, LayerNorm, Embedding, MultiheadAttention
// and a transformer block, with PyTorch's semantics, initialisation and
// parameter names, so weights and results move between the two.
//
// A module is a plain struct of parameter tensors that live in an ag_params
// store (one contiguous buffer per model). `*_init` takes the module's name, as
// torch.nn.Module.state_dict makes it, adds the parameters under name + "." +
// PyTorch's name ("head" gives head.weight and head.bias; a block named
// "layers.0" gives layers.0.self_attn.in_proj_weight; NULL or "" is the root
// module, whose tensors are named by themselves) and initialises them as PyTorch
// does, drawing from `rng`. A name with an empty component ("head.", ".head",
// "a..b") is refused with one line. An init is all or nothing: one that fails (a
// NULL `rng`, a name already in the store) returns false with one line, takes back the
// parameters it had added and the draws it had made from `rng`, and leaves the module
// zeroed.
// `*_forward` builds the computation on a tape; its gradients come from the
// tape like any op's. A NULL module, or a layer's input that is not [B, L, d_model], is
// one line naming the function, and a NULL result.
//
// Flags follow one rule: a `*_config` struct zeroed (or designated-initialised
// with only what you change) means PyTorch's defaults, so a flag whose PyTorch
// default is True is spelled as its negation (ag_mha_config.no_bias: false,
// the default, has biases, as nn.MultiheadAttention(bias=True)); an explicit
// argument takes PyTorch's own name and sense (ag_linear_layer_init's `bias`,
// as nn.Linear(bias=...)).
//
// Dropout: a forward in training mode takes `dropout_seed` from its options
// (vary it per step) and each module draws from its own pcg32 stream, derived
// from its name, so masks are reproducible and independent.
#ifndef ATTOGRAD_NN_H
#define ATTOGRAD_NN_H

#include "attograd/ops.h"
#include "attograd/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- Linear (torch.nn.Linear) -------------------------------------------------
// weight [out, in] ~ kaiming_uniform(a = sqrt 5), bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)).
typedef struct ag_linear_layer {
    ag_tensor *weight, *bias;  // bias NULL when created without
} ag_linear_layer;

bool ag_linear_layer_init(ag_linear_layer *l, ag_params *ps, const char *name, int in, int out,
                          bool bias, ag_pcg32 *rng);
// x: [..., in] -> [..., out]
ag_tensor *ag_linear_layer_forward(ag_tape *tp, const ag_linear_layer *l, ag_tensor *x);

// ---- LayerNorm (torch.nn.LayerNorm, elementwise_affine) --------------------------
typedef struct ag_layernorm_layer {
    ag_tensor *weight, *bias;  // [E], ones and zeros
    double eps;                // 1e-5 as PyTorch
} ag_layernorm_layer;

bool ag_layernorm_layer_init(ag_layernorm_layer *l, ag_params *ps, const char *name, int dim);
// x: [..., E] -> [..., E]
ag_tensor *ag_layernorm_layer_forward(ag_tape *tp, const ag_layernorm_layer *l, ag_tensor *x);

// ---- Embedding (torch.nn.Embedding) -----------------------------------------------
typedef struct ag_embedding_layer {
    ag_tensor *weight;  // [V, E] ~ N(0, 1)
} ag_embedding_layer;

bool ag_embedding_layer_init(ag_embedding_layer *l, ag_params *ps, const char *name, int num,
                             int dim, ag_pcg32 *rng);
// ids: `shape` ints in [0, V) -> [*shape, E]
ag_tensor *ag_embedding_layer_forward(ag_tape *tp, const ag_embedding_layer *l,
                                      const int32_t *ids, int ndim, const int shape[]);

// ---- MultiheadAttention (torch.nn.MultiheadAttention, batch_first=True) -------------
typedef struct ag_mha_config {
    int embed_dim;   // E
    int num_heads;   // h; E must be divisible by h
    double dropout;  // on the attention weights, training only
    bool no_bias;    // true = PyTorch bias=False (the default, false, has biases)
    int kdim, vdim;  // 0 means E; if either differs from E the projections are separate
    int head_dim;    // d; 0 means E / h. A model with pruned heads keeps its d while h
                     // shrinks (see ag_mha_prune_heads), so h*d may be less than E
    int num_kv_heads;    // h_kv, grouped-query attention: 0 means h (every head its own
                         // keys and values); else it divides h, and query head i reads kv
                         // head i / (h / h_kv) (PyTorch 2.5 scaled_dot_product_attention's
                         // enable_gqa; LLaMA-2 / Mistral); 1 is multi-query attention. The
                         // key and value projections then make h_kv*d, not h*d, columns
    int window;          // > 0: sliding-window (local) attention of W = window, as
                         // ag_softmax_opts.window: a causal forward's query sees the last W
                         // keys, itself included (Mistral); a bidirectional one the keys
                         // within W - 1 of it. A KV cache then keeps a ring of the last W
                         // positions and runs for any length. Not with add_bias_kv or
                         // add_zero_attn (their keys have no position). 0: none
    bool add_bias_kv;    // PyTorch's: learned bias_k, bias_v [1, 1, E] appended to the
                         // projected keys and values as one more position
    bool add_zero_attn;  // PyTorch's: then a zero key and value appended as well
    // Positions inside the attention (see ag_pos_kind in ops.h). RELATIVE and T5 add a
    // learned table, "relative_attention_bias.weight" [h, 2M+1] or [h, num_buckets]
    // (zeros at init: no bias until trained); ALIBI and SINUSOIDAL (D = head_dim) are
    // fixed; ROPE rotates q and k with ag_rope (d even). T5 and ALIBI use their causal
    // variant when the forward is causal. Not combined with add_bias_kv or add_zero_attn.
    // ag_mha_init refuses parameters with which a causal or a bidirectional forward, or a
    // KV cache, could not run.
    ag_pos_kind pos;
    int max_distance;  // RELATIVE: M (0 means 16); T5: max_distance (0 means 128)
    int num_buckets;   // T5 (0 means 32)
    double rope_base;  // ROPE's and SINUSOIDAL's base (0 means 10000)
} ag_mha_config;

// Parameters under PyTorch's names (name + "." + ...):
//   in_proj_weight [3E, E] and in_proj_bias [3E] when kdim = vdim = E, or else
//   q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim] (and
//   in_proj_bias [3E]); out_proj.weight [E, E], out_proj.bias [E].
// With head_dim set, I = h*d replaces E as the projections' output width (their
// rows) and as out_proj.weight's columns: [3I, E], [I, E], [E, I].
// Grouped-query (num_kv_heads = h_kv < h; PyTorch has no such module): the projections
// are always separate, in nn.MultiheadAttention's separate form with the key and value
// ones narrower, q_proj_weight [I, E], k_proj_weight [Ikv, kdim], v_proj_weight
// [Ikv, vdim], Ikv = h_kv*d, each xavier_uniform for its own shape; in_proj_bias
// [I + 2 Ikv] (q's, k's, v's); bias_k and bias_v [1, 1, Ikv]. (A packed in_proj_weight
// [I + 2 Ikv, E] would save a product, but under PyTorch's name it would claim a shape
// nn.MultiheadAttention's loaders do not expect.)
// With add_bias_kv: bias_k and bias_v [1, 1, I] after in_proj_bias (PyTorch's order),
// ~ N(0, 1/I) (xavier_normal as PyTorch computes it for that shape). Those two options
// make S + 1 or S + 2 keys; the masks get columns for them that may be attended (false
// under AG_MASK_BLOCKS, true under AG_MASK_KEEPS, 0 for an additive mask, whose gradient
// still flows), as PyTorch pads them, and `causal` applies to the S real keys only (the
// extra ones are visible to every query, as with PyTorch's padded triu mask). A bool mask
// without a T dim ([B,1,1,S], [S]) is then broadcast to [..., T, S + extra] in tape memory.
// Init as PyTorch: xavier_uniform on in_proj_weight (or each q/k/v weight),
// zero in_proj_bias and out_proj.bias, out_proj.weight as nn.Linear.
typedef struct ag_mha {
    ag_mha_config cfg;
    int head_dim;
    ag_tensor *in_proj_weight;
    ag_tensor *q_proj_weight, *k_proj_weight, *v_proj_weight;
    ag_tensor *in_proj_bias;
    ag_tensor *bias_k, *bias_v;  // add_bias_kv only
    ag_tensor *pos_table;        // RELATIVE and T5 only: relative_attention_bias.weight
    ag_linear_layer out_proj;
    uint64_t site;     // dropout stream, derived from the module's name
    uint64_t version;  // a value no other module or state of this one has had: set by
                       // ag_mha_init, changed by ag_mha_prune_heads. A KV cache made for
                       // one version refuses the module at any other.
} ag_mha;

bool ag_mha_init(ag_mha *m, ag_params *ps, const char *name, const ag_mha_config *cfg,
                 ag_pcg32 *rng);

typedef struct ag_mha_opts {
    // Optional masks. MASK POLARITY (mask_polarity below) by default as in
    // torch.nn.MultiheadAttention: a boolean entry that is TRUE means NOT allowed to
    // attend / padding.
    ag_tensor *key_padding_mask;  // AG_BOOL [B, S]
    ag_tensor *attn_mask;         // AG_BOOL or float (additive, may require grad), ending in
                                  // S: 1, 2 or 4 dims broadcasting to the scores [B, h, T, S]
                                  // ([S], [T, S], [B, 1, 1, S], [B, 1, T, S], [1, h, T, S],
                                  // [B, h, T, S], ...), or 3 dims one plane per slice,
                                  // [B*h, T, S] as PyTorch (never [h, T, S] or [B, T, S]:
                                  // see ag_softmax_opts)
    bool causal;                  // mask key j > query i
    bool per_head_weights;        // weights [B, h, T, S] instead of averaged [B, T, S]
    bool training;                // apply dropout
    uint64_t dropout_seed;
    ag_tensor *head_mask;         // float [h] or NULL: head j's output (its context, before
                                  // out_proj) times head_mask[j], with a gradient to the
                                  // mask (ag_head_mask); the returned weights are unscaled
    ag_mask_polarity mask_polarity;  // of attn_mask (bool) and key_padding_mask together:
                                     // AG_MASK_BLOCKS (the default, PyTorch MHA: true = may
                                     // not attend) or AG_MASK_KEEPS (F.scaled_dot_product_
                                     // attention, HuggingFace: true = may attend)
} ag_mha_opts;

// query [B, T, E], key [B, S, kdim], value [B, S, vdim] -> output [B, T, E].
// If `weights` is non-NULL (PyTorch need_weights=True), *weights receives the
// attention weights (after dropout, as PyTorch returns them): averaged over
// heads [B, T, S], or [B, h, T, S] with per_head_weights. The weights are for
// inspection: they carry no gradient. opts may be NULL.
// Without weights the attention runs fused (ag_attention): no [B, h, T, S] matrix is
// stored, so memory grows with T, not T * S, and the heads are read in place from the
// projections (no split/merge copies); self-attention (query, key and value the same
// tensor) projects once with the whole in_proj_weight (ag_attention_packed), as PyTorch
// does. With weights it runs as the separate ops (matmul, softmax, dropout, matmul) to
// have them. All paths give the same result.
// A query whose keys are all masked gets zero attention (PyTorch: NaN).
ag_tensor *ag_mha_forward(ag_tape *tp, const ag_mha *m, ag_tensor *query, ag_tensor *key,
                          ag_tensor *value, const ag_mha_opts *opts, ag_tensor **weights);

// ---- Heads: analysis, importance, pruning -------------------------------------------
// What each head of one attention layer looks at, from its weights [B, h, T, S] (as
// ag_mha_forward returns them with per_head_weights):
typedef struct ag_head_stats {
    double entropy;   // mean over queries of -sum_j a_ij log a_ij, in nats (0: one key;
                      // log S: uniform); fully masked queries (all zeros) are left out;
                      // a NaN weight makes entropy, distance and weight NaN
    double distance;  // sum a_ij |i - j| / sum a_ij: the mean distance attended over
    int query, key;   // the strongest pair: argmax of the weights averaged over the batch
    double weight;    // that averaged weight
} ag_head_stats;
// Fills stats[0 .. h-1]. False (after an error naming the shape) unless weights is float
// and 4-D, with data.
bool ag_attention_head_stats(const ag_tensor *weights, ag_head_stats *stats);
// A table, one line per head; with n_importance > 0, columns importance[i][head] headed
// names[i] (e.g. the two importance scores below).
void ag_attention_head_stats_print(const ag_head_stats *stats, int heads,
                                   const double *importance[], const char *const names[],
                                   int n_importance, FILE *f);

// Head importance. The callback builds the loss of validation batch `batch` on `tp`,
// passing masks[l] (float [heads] of dtype dt, values set by the helper) as layer l's
// ag_mha_opts.head_mask (or ag_block_opts.head_mask), and returns the scalar loss (NULL on
// failure). importance receives layers * heads scores, layer by layer. Both measures return
// false when the callback fails or returns more than one value, and true with NaN scores
// where a loss was NaN.
#define AG_HEAD_MAX_LAYERS 64
typedef ag_tensor *(*ag_head_loss_fn)(ag_tape *tp, ag_tensor *const masks[], int batch,
                                      void *user);
// Michel, Levy & Neubig (2019): mean over batches of |d loss / d mask[l][j]| at mask = 1.
// One forward and backward per batch; the backward also adds into the model's parameter
// gradients, so zero them before training on.
bool ag_head_importance_gradient(ag_head_loss_fn fn, void *user, ag_dtype dt, int layers,
                                 int heads, int batches, double *importance);
// Ablation: mean loss with mask[l][j] = 0 (all others 1) minus mean loss with all ones;
// layers * heads + 1 forwards per batch, in no-grad mode.
bool ag_head_importance_ablation(ag_head_loss_fn fn, void *user, ag_dtype dt, int layers,
                                 int heads, int batches, double *importance);

// With grouped-query attention (num_kv_heads < num_heads) only whole groups can go: the
// h / h_kv query heads of a kv head together, and that kv head with them (num_kv_heads
// drops by one per group); a list that splits a group is refused.
// Removes heads heads[0 .. n-1] (indices among the module's current heads) for real:
// in_proj_weight shrinks to [3(h-n)d, E] (or q/k/v_proj_weight to [(h-n)d, in]),
// in_proj_bias to [3(h-n)d], out_proj.weight to [E, (h-n)d]; cfg.num_heads becomes h - n
// and cfg.head_dim stays d. The store is repacked (ag_params_resize): make a new optimizer
// afterwards, and record on a reset tape (one that recorded the module before is refused). The result equals the unpruned module with those heads' head_mask at 0,
// output and gradients. To checkpoint, save cfg.num_heads (and cfg.num_kv_heads) in the
// metadata and rebuild with {num_heads, num_kv_heads, head_dim} before loading. Errors:
// an index out of range, an index twice, every head, a split group, and any head of a
// module whose position terms follow from the head count (AG_POS_ALIBI's slopes,
// AG_POS_SINUSOIDAL's scales: the heads kept would change theirs); the module is then
// unchanged. n = 0 prunes nothing and succeeds, whatever the scheme.
bool ag_mha_prune_heads(ag_mha *m, ag_params *ps, const int *heads, int n);

// ---- Transformer block (torch.nn.TransformerEncoderLayer, batch_first=True) ----------
// post-LN:  x = norm1(x + drop(attn(x)));  x = norm2(x + drop(ff(x)))
// pre-LN:   x = x + drop(attn(norm1(x)));  x = x + drop(ff(norm2(x)))
// ff(x) = linear2(drop(act(linear1(x)))). With `causal` in the forward options
// it is a decoder-only (GPT-style) block.
typedef enum ag_activation { AG_ACT_RELU, AG_ACT_GELU } ag_activation;

typedef struct ag_block_config {
    int d_model, num_heads, dim_feedforward;
    double dropout;            // every dropout of the block, as PyTorch
    ag_activation activation;  // PyTorch default: ReLU; GELU is the erf form
    bool norm_first;           // pre-LN
    double layer_norm_eps;     // 0 means 1e-5
    bool no_bias;              // PyTorch's bias=False: no bias in the linears, the
                               // LayerNorms or the attention
    // Positions inside the attention, as ag_mha_config's fields of the same names.
    ag_pos_kind pos;
    int max_distance, num_buckets;
    double rope_base;
    int num_kv_heads;  // grouped-query attention, as ag_mha_config's (0: num_heads)
    int window;        // sliding window of the self-attention, as ag_mha_config's (a
                       // decoder layer's attention over the memory has none)
    // The attention's add_bias_kv and add_zero_attn, as ag_mha_config's (self_attn.bias_k
    // and self_attn.bias_v with add_bias_kv).
    bool add_bias_kv, add_zero_attn;
} ag_block_config;

// Names: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.* (PyTorch's).
typedef struct ag_block {
    ag_block_config cfg;
    ag_mha self_attn;
    ag_linear_layer linear1, linear2;
    ag_layernorm_layer norm1, norm2;
    uint64_t site;
} ag_block;

bool ag_block_init(ag_block *b, ag_params *ps, const char *name, const ag_block_config *cfg,
                   ag_pcg32 *rng);

typedef struct ag_block_opts {
    ag_tensor *key_padding_mask;  // AG_BOOL [B, T], true = padding (AG_MASK_BLOCKS)
    ag_tensor *attn_mask;         // as ag_mha_opts (any shape broadcasting to [B, h, T, T])
    bool causal;
    bool training;
    uint64_t dropout_seed;
    ag_tensor *head_mask;         // as ag_mha_opts: float [num_heads] or NULL
    ag_tensor **attn_weights;     // if non-NULL, receives the attention weights (no
                                  // gradient), as ag_mha_forward's `weights`; the block
                                  // then runs the composed attention
    bool per_head_weights;        // those weights [B, h, T, T] instead of averaged
    ag_mask_polarity mask_polarity;  // as ag_mha_opts: of attn_mask and key_padding_mask
} ag_block_opts;

// x: [B, T, d_model] -> [B, T, d_model]. opts may be NULL (eval, no masks).
ag_tensor *ag_block_forward(ag_tape *tp, const ag_block *b, ag_tensor *x,
                            const ag_block_opts *opts);

// ---- Encoder-decoder: torch.nn.TransformerDecoderLayer and torch.nn.Transformer -------
// The decoder layer (batch_first=True) reads a target x [B, T, E] and an encoder's memory
// [B, S, E]:
// post-LN:  x = norm1(x + drop(self_attn(x)))
//           x = norm2(x + drop(multihead_attn(x, memory, memory)))
//           x = norm3(x + drop(ff(x)))
// pre-LN:   x = x + drop(self_attn(norm1(x)));  x = x + drop(multihead_attn(norm2(x),
//           memory, memory));  x = x + drop(ff(norm3(x)))
// with ff and every setting as the encoder layer's (ag_block_config, one config for both;
// a position scheme applies to self_attn, none to multihead_attn, which has no extra keys).
// Names, in PyTorch's state_dict order: self_attn.*, multihead_attn.*, linear1.*,
// linear2.*, norm1.*, norm2.*, norm3.*.
typedef struct ag_decoder_layer {
    ag_block_config cfg;
    ag_mha self_attn, multihead_attn;
    ag_linear_layer linear1, linear2;
    ag_layernorm_layer norm1, norm2, norm3;
    uint64_t site;
} ag_decoder_layer;

bool ag_decoder_layer_init(ag_decoder_layer *l, ag_params *ps, const char *name,
                           const ag_block_config *cfg, ag_pcg32 *rng);

// The masks and settings of an encoder-decoder forward, with nn.Transformer's names; each
// forward reads the fields it has (the decoder layer and the decoder: tgt_* and
// memory_*; the encoder: src_*). Bool masks follow mask_polarity (AG_MASK_BLOCKS, the
// default, as nn.Transformer: true = may not attend); attention masks take any shape
// ag_mha_opts.attn_mask takes, and a float one is added to the scores.
typedef struct ag_transformer_opts {
    ag_tensor *src_mask;                 // the encoder's self-attention, [S, S] ...
    ag_tensor *tgt_mask;                 // the decoder's self-attention, [T, T] ...
    ag_tensor *memory_mask;              // the decoder's attention over memory, [T, S] ...
    ag_tensor *src_key_padding_mask;     // AG_BOOL [B, S]
    ag_tensor *tgt_key_padding_mask;     // AG_BOOL [B, T]
    ag_tensor *memory_key_padding_mask;  // AG_BOOL [B, S]
    bool causal;                         // the decoder's self-attention is causal (key j >
                                         // query i masked), as tgt_mask = triu(1) would make it
    bool training;
    uint64_t dropout_seed;
    ag_mask_polarity mask_polarity;      // of every bool mask above
    ag_tensor **cross_weights;           // if non-NULL, receives the attention weights over
                                         // memory (no gradient): the decoder layer's, or a
                                         // decoder's last layer's; [B, T, S] averaged over
                                         // heads, or [B, h, T, S] with per_head_weights
    bool per_head_weights;
} ag_transformer_opts;

// tgt [B, T, E], memory [B, S, E] -> [B, T, E]. opts may be NULL (eval, no masks).
ag_tensor *ag_decoder_layer_forward(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *tgt,
                                    ag_tensor *memory, const ag_transformer_opts *opts);

// The stacks, as torch.nn.TransformerEncoder and TransformerDecoder with a final LayerNorm
// (nn.Transformer's): layers.<i>.* then norm.* under the stack's name.
typedef struct ag_transformer_encoder {
    int num_layers;
    ag_block *layers;
    ag_layernorm_layer norm;
} ag_transformer_encoder;

typedef struct ag_transformer_decoder {
    int num_layers;
    ag_decoder_layer *layers;
    ag_layernorm_layer norm;
} ag_transformer_decoder;

bool ag_transformer_encoder_init(ag_transformer_encoder *e, ag_params *ps, const char *name,
                                 const ag_block_config *cfg, int num_layers, ag_pcg32 *rng);
bool ag_transformer_decoder_init(ag_transformer_decoder *d, ag_params *ps, const char *name,
                                 const ag_block_config *cfg, int num_layers, ag_pcg32 *rng);
void ag_transformer_encoder_free(ag_transformer_encoder *e);  // the layers array
void ag_transformer_decoder_free(ag_transformer_decoder *d);
// src [B, S, E] -> memory [B, S, E]; tgt [B, T, E], memory -> [B, T, E].
ag_tensor *ag_transformer_encoder_forward(ag_tape *tp, const ag_transformer_encoder *e,
                                          ag_tensor *src, const ag_transformer_opts *opts);
ag_tensor *ag_transformer_decoder_forward(ag_tape *tp, const ag_transformer_decoder *d,
                                          ag_tensor *tgt, ag_tensor *memory,
                                          const ag_transformer_opts *opts);

// torch.nn.Transformer: encoder.* and decoder.* under its name; initialised as PyTorch's
// _reset_parameters does (xavier_uniform on every parameter of two or more dims).
typedef struct ag_transformer_config {
    ag_block_config layer;  // every layer's, encoder and decoder
    int num_encoder_layers, num_decoder_layers;  // >= 1 each
} ag_transformer_config;

typedef struct ag_transformer {
    ag_transformer_encoder encoder;
    ag_transformer_decoder decoder;
} ag_transformer;

bool ag_transformer_init(ag_transformer *t, ag_params *ps, const char *name,
                         const ag_transformer_config *cfg, ag_pcg32 *rng);
void ag_transformer_free(ag_transformer *t);
// src [B, S, E], tgt [B, T, E] -> [B, T, E]: the decoder on the encoder's memory.
ag_tensor *ag_transformer_forward(ag_tape *tp, const ag_transformer *t, ag_tensor *src,
                                  ag_tensor *tgt, const ag_transformer_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
