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

// The position scheme of module m (src/ops/pos.h), with its parameters, for a forward
// that is causal or not: the one place where a module's config becomes a scheme.
agi_pos agi_mha_pos(const ag_mha *m, bool causal);
// A value for ag_mha.version that no module has had before: each init and each change of
// shape takes one, so a KV cache can tell whether its module is still the one it was
// made for.
uint64_t agi_mha_version_next(void);

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
// What comes next plugs in here (issue 22, second half; issue 23):
//   - grouped-query attention stores only the kv heads: `width` becomes kv_heads * d;
//   - a rolling sliding window keeps `capacity` = W rows and writes position t at row
//     extra + t % W (agi_kv_cache_append), the attention reading the W rows with their
//     positions (agi_mha_forward_cached's q_offset and kv_len are where that goes);
//   - cross-attention keeps K and V projected once from an encoder memory: a cache whose
//     rows are filled at creation, whose steps append nothing and attend without
//     causality.
struct ag_kv_cache {
    const void *owner;  // the module (or block) the cache was made for
    uint64_t version;   // its ag_mha.version then: any change of shape since is refused
    ag_dtype dt;
    int batch, capacity, len;  // positions: room for `capacity`, `len` stored
    int extra;                 // rows of extra keys before position 0
    int width;                 // what a position stores of k and of v: h * d
    ag_tensor *k, *v;          // [batch, extra + capacity, width]
    ag_tape *tp;               // the public steps' ops, grad disabled; made on first use
};

// Whether c may run a step of m (its owner `owner`) on x [batch, E] or [batch, n, E]
// with room for n more positions; reports "<op>: ..." otherwise. *n receives n.
bool agi_kv_cache_check(const char *op, const ag_kv_cache *c, const void *owner,
                        const ag_mha *m, const ag_tensor *x, int *n);
// Stores the n new positions' k and v ([batch, n, width]) after the len already held,
// and the module's extra keys in their rows; the step then advances len by n.
void agi_kv_cache_append(ag_kv_cache *c, const ag_mha *m, const ag_tensor *k,
                         const ag_tensor *v);

// The cached steps, on tp (grad disabled): x [batch, n, E] -> [batch, n, E], the rows of
// n new positions after the c->len stored, as ag_mha_forward / ag_block_forward (causal,
// eval) would give them over all the positions; c stores the new positions. The same
// code as those forwards: the projections, the position scheme's rotation, the fused
// attention on the cached keys (query offset len), out_proj, the block's LayerNorms and
// feed-forward. NULL after reporting.
ag_tensor *agi_mha_forward_cached(ag_tape *tp, const ag_mha *m, ag_kv_cache *c, ag_tensor *x);
ag_tensor *agi_block_forward_cached(ag_tape *tp, const ag_block *b, ag_kv_cache *c,
                                    ag_tensor *x);

#endif
