// Shared by the module files: composing PyTorch-style parameter names, a module's
// positions, and the KV cache's step on the modules' own code.
#ifndef ATTOGRAD_NN_INTERNAL_H
#define ATTOGRAD_NN_INTERNAL_H

#include "../core/internal.h"
#include "../ops/pos.h"
#include "attograd/generate.h"
#include "attograd/nn.h"
#include "attograd/ops.h"

#define AGI_NAME_MAX 256

// Whether `name` may name a module (module_name.c): NULL or "" (the root), or
// dot-separated components, none empty. Reports "<op>: module name ..." otherwise.
bool agi_module_name_ok(const char *op, const char *name);
// out = module + "." + member ("layers.0" and "norm1.weight" give
// "layers.0.norm1.weight"), or member alone for the root module (NULL or "");
// false (after reporting) if it does not fit.
bool agi_join_name(char out[AGI_NAME_MAX], const char *module, const char *member);

// A public init's undo (init_undo.c): begin records the store's count and the generator
// (either may be NULL); end, given the init's result, removes the parameters added since
// and restores the generator when it failed, zeroes `size` bytes of the module when
// `module` is not NULL, and returns `ok`.
typedef struct agi_init_undo {
    ag_params *ps;
    int count;
    ag_pcg32 *rng;
    ag_pcg32 rng_at;
} agi_init_undo;
agi_init_undo agi_init_begin(ag_params *ps, ag_pcg32 *rng);
bool agi_init_end(const agi_init_undo *u, bool ok, void *module, size_t size);

// The position scheme of module m (src/ops/pos.h), with its parameters, for a forward
// that is causal or not: the one place where a module's config becomes a scheme.
agi_pos agi_mha_pos(const ag_mha *m, bool causal);
// A value for ag_mha.version that no module has had before: each init and each change of
// shape takes one, so a KV cache can tell whether its module is still the one it was
// made for.
uint64_t agi_mha_version_next(void);

// ---- The parts of a transformer layer (sublayer.c) -------------------------------------
// Shared by the encoder layer (ag_block) and the decoder layer, as PyTorch's share them.
// A forward's dropout: whether it trains, its seed, and the layer's site; each dropout of
// a layer draws at site + one of these (the encoder layer's values are its masks since
// the first release: keep them).
typedef struct agi_layer_run {
    bool training;
    uint64_t seed, site;
} agi_layer_run;
enum { AGI_DROP_SELF = 1, AGI_DROP_FF_OUT = 2, AGI_DROP_FF_INNER = 3, AGI_DROP_CROSS = 4 };
// A layer's self-attention: d_model, heads, dropout, bias and position settings.
// The config a layer keeps: `cfg` checked (by `op`'s name in the message), with
// layer_norm_eps 0 made PyTorch's 1e-5. False after reporting.
bool agi_layer_config(const char *op, const ag_block_config *cfg, ag_block_config *out);
ag_mha_config agi_layer_attention_config(const ag_block_config *cfg);
// The feed-forward network's linear1 [d_model -> dim_feedforward] and linear2 (back),
// with a bias unless cfg->no_bias, made in PyTorch's order under `name`.
bool agi_feed_forward_init(ag_linear_layer *l1, ag_linear_layer *l2, ag_params *ps,
                           const char *name, const ag_block_config *cfg, ag_pcg32 *rng);
// A LayerNorm of d_model with the layer's eps (a weight only with no_bias).
bool agi_layer_norm_init(ag_layernorm_layer *l, ag_params *ps, const char *name,
                         const ag_block_config *cfg);
// Whether x, the input `what` of a layer's forward `op`, is [B, L, d_model] in the dtype of
// the layer's parameter `param` (not checked when NULL: a layer not made has d_model 0);
// reported otherwise (a NULL x included), once, before any op would report its own
// consequence.
bool agi_layer_input_ok(const char *op, const char *what, const ag_tensor *x, int d_model,
                        const ag_tensor *param);
// A residual sublayer f: agi_sublayer_out(norm, x, f(agi_sublayer_in(norm, x))) is
// norm(x + f(x)) post-LN, x + f(norm(x)) pre-LN (norm_first).
ag_tensor *agi_sublayer_in(ag_tape *tp, const ag_layernorm_layer *norm, bool norm_first,
                           ag_tensor *x);
ag_tensor *agi_sublayer_out(ag_tape *tp, const ag_layernorm_layer *norm, bool norm_first,
                            ag_tensor *x, ag_tensor *fx);
// x, or in training its dropout at the layer's site + which.
ag_tensor *agi_layer_dropout(ag_tape *tp, const ag_block_config *cfg, ag_tensor *x,
                             const agi_layer_run *run, uint64_t which);
// drop(linear2(drop(act(linear1(x))))), the layer's feed-forward network.
ag_tensor *agi_feed_forward(ag_tape *tp, const ag_block_config *cfg, const ag_linear_layer *l1,
                            const ag_linear_layer *l2, ag_tensor *x, const agi_layer_run *run);

// ---- The KV cache (kv_cache.c) --------------------------------------------------------
// What a cache holds for one attention module: the keys and values of every position
// so far, as the fused attention reads them (heads inside the last dim).
//
// Positions: row `extra + t` of k and v holds position t (t < len); rows [0, extra) hold
// the module's extra keys (add_bias_kv's bias_k / bias_v, add_zero_attn's zeros), written
// at each step. Softmax does not depend on the order of the keys, and no position scheme
// combines with extra keys, so putting them first changes nothing but rounding, and the
// causal rule of a query at position t is the plain one: rows <= extra + t.
//
// Grouped-query attention stores only the kv heads: `width` is num_kv_heads * d.
//
// Sliding window (window = W > 0, no extra keys): a ring of `capacity` = W rows, position
// t at row t % W, so memory is O(W) and a cache never fills. A step gathers the (at most
// W - 1) cached positions its first query can see, in position order, before its new
// rows (agi_kv_cache_window), and runs the attention there with query offset = their
// number: every position term depends on j - i alone, and the keys were rotated at their
// own positions when stored, so this is exactly the full causal forward's rows.
//
// Also here:
//   - cross-attention keeps K and V projected once from an encoder memory: a
//     memory cache, whose rows are filled once per set of inputs, whose steps append
//     nothing and attend without causality (agi_mha_forward_memory).
//
// A step may run the first rows <= batch sequences only (a search's live hypotheses);
// between steps, beams reorder the sequences (ag_kv_cache_reorder: row i becomes what
// row from[i] was), through spare buffers of the same size made on the first reorder.
//
// A memory cache (memory = true): k and v [sources, capacity, width] hold the keys and
// values of `len` = S memory positions of each input, projected once by the module's own
// code; key_padding [sources, S] is the memory's key padding mask (or NULL). When inputs
// finish, the rows of those still decoding move to the front in their order
// (agi_kv_cache_keep_memory), so that rows [0, G) are the G live inputs.
struct ag_kv_cache {
    const void *owner;  // the module (or block) the cache was made for
    uint64_t version;   // its ag_mha.version then: any change of shape since is refused
    ag_dtype dt;
    int batch, capacity, len;  // positions: room for `capacity`, `len` stored
    int rows;                  // the first `rows` sequences hold all len positions: a step
                               // or a reorder of fewer leaves the others undefined
    int extra;                 // rows of extra keys before position 0
    int width;                 // what a position stores of k and of v: h_kv * d
    int window;                // > 0: the module's sliding window, the rows a ring
    ag_tensor *k, *v;          // [batch, extra + capacity, width]
    ag_tensor *k_spare, *v_spare;  // reorders gather into these, then swap; made on first use
    bool memory;                   // an encoder's memory, not self-attention positions
    ag_tensor *key_padding;        // memory: bool [batch, len], or NULL
    ag_mask_polarity polarity;     // memory: of key_padding
    ag_tape *tp;               // the public steps' ops, grad disabled; made on first use
};

// Whether c was made for m as m is now (not before its heads were pruned, or before it
// was made again).
bool agi_kv_cache_current(const ag_kv_cache *c, const ag_mha *m);
// Whether c may run a step of m (its owner `owner`) on x [batch, E] or [batch, n, E]
// with room for n more positions; reports "<op>: ..." otherwise. *n receives n.
bool agi_kv_cache_check(const char *op, const ag_kv_cache *c, const void *owner,
                        const ag_mha *m, const ag_tensor *x, int *n);
// Stores the n new positions' k and v ([rows, n, width]) of the first rows sequences
// after the len already held, and the module's extra keys in their rows; the step then
// advances len by n.
void agi_kv_cache_append(ag_kv_cache *c, const ag_mha *m, const ag_tensor *k,
                         const ag_tensor *v);
// A windowed step's keys (or values): of ring (c->k or c->v) the `seen` positions before
// the new ones, in position order, then the new rows `fresh` [rows, n, width]; on tp,
// [rows, seen + n, width]. Before agi_kv_cache_append, which overwrites ring rows.
ag_tensor *agi_kv_cache_window(ag_tape *tp, const ag_kv_cache *c, const ag_tensor *ring,
                               const ag_tensor *fresh, int seen);
// t (a cache's k or v, [batch, ...]) as its first `rows` sequences, a view on tp.
ag_tensor *agi_kv_cache_rows(ag_tape *tp, ag_tensor *t, int rows);
// Makes the spare buffers a reorder gathers into (once); false if they cannot be had.
bool agi_kv_cache_reserve_reorder(ag_kv_cache *c);
// The self-attention cache of `m` for `owner`, the module or the layer whose steps run on
// it (a step with another owner is refused); ff is the owner's feed-forward width (0 for a
// module alone), the widest row a step makes on its tape, checked with the buffers' sizes.
ag_kv_cache *agi_kv_cache_new_for(const ag_mha *m, const void *owner, int B, int max_len,
                                  int ff);

// A memory cache for module m (owner: what the steps name), `sources` inputs of up to
// max_src positions. NULL after reporting.
ag_kv_cache *agi_kv_cache_new_memory(const ag_mha *m, const void *owner, int sources,
                                     int max_src);
// Stores k, v [B, S, width] (B <= sources, S <= capacity) as inputs 0 .. B-1 and their
// key padding mask (bool-convertible [B, S], or NULL) with its polarity; len becomes S.
void agi_kv_cache_set_memory(ag_kv_cache *c, const ag_tensor *k, const ag_tensor *v,
                             const ag_tensor *key_padding, ag_mask_polarity polarity);
// Keeps rows keep[0] < keep[1] < ... < keep[n-1] as rows 0 .. n-1.
void agi_kv_cache_keep_memory(ag_kv_cache *c, const int *keep, int n);

// The rows of a step against a memory cache, grouped by input: `groups` live inputs
// (rows 0 .. groups-1 of the cache), the g-th with rows[g] consecutive rows of x.
typedef struct agi_memory_rows {
    int groups;
    const int *rows;  // [groups]
} agi_memory_rows;

// The memory's keys and values as ag_mha_forward projects them: k, v [B, S, width] of
// memory [B, S, kdim] on tp (grad disabled). False after reporting.
bool agi_mha_project_memory(ag_tape *tp, const ag_mha *m, ag_tensor *memory, ag_tensor **k,
                            ag_tensor **v);
// The attention of x [rows, n, E] over the memory in c, on tp (grad disabled), as
// ag_mha_forward(x, memory, memory, key_padding_mask) gives those rows: the same query
// projection, fused attention (not causal) and out_proj. NULL after reporting.
ag_tensor *agi_mha_forward_memory(ag_tape *tp, const ag_mha *m, ag_kv_cache *c,
                                  const agi_memory_rows *r, ag_tensor *x);
// A decoder's tgt [B, T, d_model] and memory [B, S, d_model] of one dtype (decoder_layer.c);
// false after reporting, for `op`, what differs.
bool agi_decoder_inputs_ok(const char *op, const ag_tensor *tgt, const ag_tensor *memory,
                           int d_model, const ag_tensor *param);
// The decoder layer's cached step (decoder_layer.c): x [rows, n, E], the next positions,
// against its self-attention cache and its memory cache, in eval.
ag_tensor *agi_decoder_layer_forward_cached(ag_tape *tp, const ag_decoder_layer *l,
                                            ag_kv_cache *self, ag_kv_cache *memory,
                                            const agi_memory_rows *rows, ag_tensor *x);

// Who answers for the attention's masks in messages: the public op the caller called and
// its own names for the attention's attn_mask and key_padding_mask (nn.Transformer's
// memory_mask and memory_key_padding_mask, say), so that a bad mask is named as given.
typedef struct agi_mask_caller {
    const char *op, *attn_mask, *key_padding_mask;
} agi_mask_caller;
// ag_mha_forward and ag_block_forward with their masks reported for `who` (the block's
// input x checked by the caller).
ag_tensor *agi_mha_forward_for(ag_tape *tp, const ag_mha *m, ag_tensor *query, ag_tensor *key,
                               ag_tensor *value, const ag_mha_opts *opts, ag_tensor **weights,
                               const agi_mask_caller *who);
ag_tensor *agi_block_forward_for(ag_tape *tp, const ag_block *b, ag_tensor *x,
                                 const ag_block_opts *opts, const agi_mask_caller *who);
// ag_decoder_layer_forward for `op`, its inputs checked by the caller (agi_decoder_inputs_ok).
ag_tensor *agi_decoder_layer_forward_for(ag_tape *tp, const ag_decoder_layer *l,
                                         ag_tensor *tgt, ag_tensor *memory,
                                         const ag_transformer_opts *opts, const char *op);

// The cached steps, on tp (grad disabled): x [batch, n, E] -> [batch, n, E], the rows of
// n new positions after the c->len stored, as ag_mha_forward / ag_block_forward (causal,
// eval) would give them over all the positions; c stores the new positions. The same
// code as those forwards: the projections, the position scheme's rotation, the fused
// attention on the cached keys (query offset len), out_proj, the block's LayerNorms and
// feed-forward. NULL after reporting.
ag_tensor *agi_mha_forward_cached(ag_tape *tp, const ag_mha *m, ag_kv_cache *c, ag_tensor *x);
ag_tensor *agi_block_forward_cached(ag_tape *tp, const ag_block *b, ag_kv_cache *c,
                                    ag_tensor *x);

// A sampler's settings in range (vocab >= 1, temperature >= 0 and finite, top_k >= 0,
// top_p in [0, 1]); false after one line naming `op`. The sampler's check, and beam
// search's, which takes no sampler but the same config.
bool agi_sample_config_ok(const char *op, int vocab, const ag_sample_config *cfg);

#endif
