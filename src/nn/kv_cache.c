// The KV cache: inference one position (or a few) at a time for MultiheadAttention
// (self-attention, causal) and the transformer block.
//
// For new positions t0 .. t0 + n - 1 of each sequence (x: [B, n, E]), the step is the
// module's own forward on those rows (agi_mha_forward_cached in mha.c, and the block's in
// block.c): the projections, the position scheme's rotation at the new positions, then
// the fused attention of the new queries against every cached key (query offset t0,
// causal), out_proj. The new keys and values are stored first. This is rows t0 .. of the
// causal forward over positions 0 .. t0 + n - 1: a causal query never sees a later key,
// so the keys and values of earlier positions do not change when a position is added, and
// computing them once is exact. That holds for every position scheme too: a term depends
// on j - i alone, and a key rotated at its own position j stays what it was.
//
// The steps run the ops themselves, grad disabled, on a tape: the caller's (the generator
// passes its own) or, through the public calls below, one the cache makes on first use
// and resets at each step. A tape keeps its memory on reset, so a step allocates nothing
// once the tape has grown to a step's size.
#include <limits.h>
#include <string.h>

#include "nn.h"

// ff: the feed-forward width of the block the cache serves (0 for a module alone), for the
// widest row a step makes on its tape.
static ag_kv_cache *cache_new(const ag_mha *m, const void *owner, int B, int max_len, int ff) {
    if (!m || !m->in_proj_weight || B < 1 || max_len < 1) {
        ag_error("kv_cache: needs self-attention with the packed in_proj_weight, batch >= 1 "
                 "and max_len >= 1; got %s, batch %d, max_len %d",
                 !m ? "no module" : m->in_proj_weight ? "packed" : "separate projections", B,
                 max_len);
        return NULL;
    }
    const int E = m->cfg.embed_dim, extra = m->cfg.add_bias_kv + m->cfg.add_zero_attn;
    const int width = m->cfg.num_heads * m->head_dim;  // of k and of v, per position
    const ag_dtype dt = m->in_proj_weight->dtype;
    // The keys and values, [B, extra + max_len, width] each, and a step's widest row on its
    // tape ([B, 3 width] projections, or the block's [B, ff]), before anything is allocated.
    const size_t s = ag_dtype_size(dt), qkv = 3 * (size_t)width;
    size_t kv, row, rows = (size_t)max_len + (size_t)extra;
    const size_t widest = ff > 0 && (size_t)ff > qkv ? (size_t)ff : qkv;
    if (rows > INT_MAX || !agi_size_mul((size_t)B, rows, &kv) ||
        !agi_size_mul(kv, (size_t)width * s, &kv) || !agi_size_mul((size_t)B, widest * s, &row)) {
        ag_error("kv_cache: batch %d x max_len %d of %s width %d (feed-forward %d) is too "
                 "large: more than the 2^%d bytes one buffer may take",
                 B, max_len, ag_dtype_name(dt), E, ff, agi_max_bytes_log2());
        return NULL;
    }
    ag_kv_cache *c = agi_calloc(sizeof *c);
    *c = (ag_kv_cache){.owner = owner,
                       .version = m->version,
                       .dt = dt,
                       .batch = B,
                       .capacity = max_len,
                       .extra = extra,
                       .width = width};
    const int shape[3] = {B, (int)rows, width};
    c->k = ag_tensor_zeros(dt, 3, shape);
    c->v = ag_tensor_zeros(dt, 3, shape);
    if (!c->k || !c->v) {
        ag_kv_cache_free(c);
        return NULL;
    }
    return c;
}

ag_kv_cache *ag_kv_cache_new(const ag_mha *m, int batch, int max_len) {
    return cache_new(m, m, batch, max_len, 0);
}

ag_kv_cache *ag_kv_cache_new_block(const ag_block *b, int batch, int max_len) {
    return cache_new(b ? &b->self_attn : NULL, b, batch, max_len,
                     b ? b->cfg.dim_feedforward : 0);
}

void ag_kv_cache_free(ag_kv_cache *c) {
    if (!c) return;
    ag_tensor_free(c->k);
    ag_tensor_free(c->v);
    ag_tape_free(c->tp);
    agi_free(c);
}

void ag_kv_cache_reset(ag_kv_cache *c) {
    if (c) c->len = 0;
}
int ag_kv_cache_len(const ag_kv_cache *c) { return c ? c->len : 0; }
int ag_kv_cache_capacity(const ag_kv_cache *c) { return c ? c->capacity : 0; }

bool agi_kv_cache_check(const char *op, const ag_kv_cache *c, const void *owner,
                        const ag_mha *m, const ag_tensor *x, int *n) {
    if (!c || !m || c->owner != owner) {
        ag_error("%s: the cache was not made for this module", op);
        return false;
    }
    if (c->version != m->version) {
        ag_error("%s: the module changed since the cache was made (heads pruned, or made "
                 "again): make a new cache",
                 op);
        return false;
    }
    const int E = m->cfg.embed_dim;
    if (!x || x->dtype != c->dt || (x->ndim != 2 && x->ndim != 3) || x->shape[0] != c->batch ||
        x->shape[x->ndim - 1] != E) {
        ag_error("%s: x %s must be %s [%d,%d]", op, x ? agi_shape(x) : "NULL",
                 ag_dtype_name(c->dt), c->batch, E);
        return false;
    }
    *n = x->ndim == 3 ? x->shape[1] : 1;
    if (*n > c->capacity - c->len) {
        if (c->len == c->capacity)
            ag_error("%s: the cache is full (%d positions)", op, c->capacity);
        else
            ag_error("%s: %d new positions do not fit: the cache holds %d of %d", op, *n,
                     c->len, c->capacity);
        return false;
    }
    return true;
}

// Rows [row, row + count) of batch b of t [B, rows, width]: where they start.
static char *rows_at(const ag_tensor *t, int b, int row) {
    const size_t es = ag_dtype_size(t->dtype);
    return (char *)t->data + ((size_t)b * t->shape[1] + (size_t)row) * t->shape[2] * es;
}

void agi_kv_cache_append(ag_kv_cache *c, const ag_mha *m, const ag_tensor *k,
                         const ag_tensor *v) {
    const size_t es = ag_dtype_size(c->dt), row = (size_t)c->width * es;
    const int n = k->shape[1];
    for (int b = 0; b < c->batch; b++) {
        memcpy(rows_at(c->k, b, c->extra + c->len), rows_at(k, b, 0), (size_t)n * row);
        memcpy(rows_at(c->v, b, c->extra + c->len), rows_at(v, b, 0), (size_t)n * row);
        // The extra keys, written at every step: the parameters may have changed since
        // the last one (a cache is reset, not remade, between generations).
        int e = 0;
        if (m->bias_k) {
            memcpy(rows_at(c->k, b, e), m->bias_k->data, row);
            memcpy(rows_at(c->v, b, e), m->bias_v->data, row);
            e++;
        }
        if (m->cfg.add_zero_attn) {  // a zero key and value (the buffers start zeroed)
            memset(rows_at(c->k, b, e), 0, row);
            memset(rows_at(c->v, b, e), 0, row);
        }
    }
}

// The public steps: on the cache's own tape, x [B, E] (or [B, n, E]) into out, same shape.
static bool step(const char *op, const void *owner, const ag_mha *m, const ag_block *b,
                 ag_kv_cache *c, const ag_tensor *x, ag_tensor *out) {
    int n;
    if (!agi_kv_cache_check(op, c, owner, m, x, &n)) return false;
    if (out && (out->dtype != x->dtype || out->ndim != x->ndim || out->numel != x->numel)) {
        ag_error("%s: out %s must be %s %s, as x", op, agi_shape(out), ag_dtype_name(x->dtype),
                 agi_shape(x));
        return false;
    }
    if (!c->tp) {
        c->tp = ag_tape_new();
        ag_tape_set_grad_enabled(c->tp, false);
    }
    ag_tape_reset(c->tp);
    ag_tensor *in = (ag_tensor *)x;  // read only: the step's ops take it as an input
    ag_tensor *y = b ? agi_block_forward_cached(c->tp, b, c, in)
                     : agi_mha_forward_cached(c->tp, m, c, in);
    if (!y) return false;
    memcpy(out ? out->data : in->data, y->data, y->numel * ag_dtype_size(y->dtype));
    return true;
}

bool ag_mha_forward_cached(const ag_mha *m, ag_kv_cache *c, const ag_tensor *x,
                           ag_tensor *out) {
    return step("mha_forward_cached", m, m, NULL, c, x, out);
}

bool ag_block_forward_cached(const ag_block *b, ag_kv_cache *c, ag_tensor *x) {
    return step("block_forward_cached", b, b ? &b->self_attn : NULL, b, c, x, NULL);
}
