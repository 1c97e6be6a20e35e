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
// on j - i alone, and a key rotated at its own position j stays what it was. With a
// sliding window W only the last W positions are ever read again: the cache is a ring of
// W rows (nn.h), and runs for any length.
//
// The steps run the ops themselves, grad disabled, on a tape: the caller's (the generator
// passes its own) or, through the public calls below, one the cache makes on first use
// and resets at each step. A tape keeps its memory on reset, so a step allocates nothing
// once the tape has grown to a step's size.
#include <limits.h>
#include <string.h>

#include "nn.h"

// The key and value buffers of a cache whose other fields are set: [n, rows, width] each.
static ag_kv_cache *with_buffers(ag_kv_cache *c, int n, int rows, int width) {
    const int shape[3] = {n, rows, width};
    c->k = ag_tensor_zeros(c->dt, 3, shape);
    c->v = ag_tensor_zeros(c->dt, 3, shape);
    if (!c->k || !c->v) {
        ag_kv_cache_free(c);
        return NULL;
    }
    return c;
}

ag_kv_cache *agi_kv_cache_new_for(const ag_mha *m, const void *owner, int B, int max_len, int ff) {
    // A module without parameters (its init failed, or was never called) has no dtype.
    const bool made = m && m->out_proj.weight;
    const bool self = made && m->cfg.kdim == m->cfg.embed_dim && m->cfg.vdim == m->cfg.embed_dim;
    if (!self || B < 1 || max_len < 1) {
        ag_error("kv_cache: needs self-attention (kdim = vdim = embed_dim), batch >= 1 and "
                 "max_len >= 1; got %s, batch %d, max_len %d",
                 !m      ? "no module"
                 : !made ? "a module not made (no out_proj.weight: its init failed or was "
                           "not called)"
                 : self  ? "self-attention"
                         : "separate projections of kdim or vdim != embed_dim",
                 B, max_len);
        return NULL;
    }
    const int E = m->cfg.embed_dim, extra = m->cfg.add_bias_kv + m->cfg.add_zero_attn;
    // Of k and of v, per position: the kv heads only (h_kv * d; h * d without grouping).
    const int width = m->cfg.num_kv_heads * m->head_dim;
    const ag_dtype dt = m->out_proj.weight->dtype;
    // The keys and values, [B, extra + max_len, width] each, and a step's widest row on its
    // tape ([B, I + 2 width] projections, or the block's [B, ff]), before anything is
    // allocated.
    const size_t s = agi_dtype_size(dt),
                 qkv = (size_t)m->cfg.num_heads * m->head_dim + 2 * (size_t)width;
    size_t kv, row, rows = m->cfg.window ? (size_t)m->cfg.window : (size_t)max_len + (size_t)extra;
    const size_t widest = ff > 0 && (size_t)ff > qkv ? (size_t)ff : qkv;
    if (rows > INT_MAX || !agi_size_mul((size_t)B, rows, &kv) ||
        !agi_size_mul(kv, (size_t)width * s, &kv) || !agi_size_mul((size_t)B, widest * s, &row)) {
        ag_error("kv_cache: batch %d x max_len %d of %s width %d (feed-forward %d) is too "
                 "large: more than the 2^%d bytes one buffer may take",
                 B, max_len, ag_dtype_name(dt), E, ff, agi_max_bytes_log2());
        return NULL;
    }
    ag_kv_cache *c = agi_calloc(sizeof *c);
    const int window = m->cfg.window;  // a ring of W rows, whatever max_len (no extra keys)
    *c = (ag_kv_cache){.owner = owner,
                       .version = m->version,
                       .dt = dt,
                       .batch = B,
                       .capacity = window ? window : max_len,
                       .rows = B,
                       .extra = extra,
                       .width = width,
                       .window = window};
    return with_buffers(c, B, (int)rows, width);
}

ag_kv_cache *ag_kv_cache_new(const ag_mha *m, int batch, int max_len) {
    return agi_kv_cache_new_for(m, m, batch, max_len, 0);
}

ag_kv_cache *ag_kv_cache_new_block(const ag_block *b, int batch, int max_len) {
    return agi_kv_cache_new_for(b ? &b->self_attn : NULL, b, batch, max_len,
                                b ? b->cfg.dim_feedforward : 0);
}

void ag_kv_cache_free(ag_kv_cache *c) {
    if (!c) return;
    ag_tensor_free(c->k);
    ag_tensor_free(c->v);
    ag_tensor_free(c->k_spare);
    ag_tensor_free(c->v_spare);
    ag_tensor_free(c->key_padding);
    ag_tape_free(c->tp);
    agi_free(c);
}

void ag_kv_cache_reset(ag_kv_cache *c) {
    if (c) c->len = 0, c->rows = c->batch;
}
int ag_kv_cache_len(const ag_kv_cache *c) { return c ? c->len : 0; }
int ag_kv_cache_capacity(const ag_kv_cache *c) { return c ? c->capacity : 0; }
size_t ag_kv_cache_bytes(const ag_kv_cache *c) {
    return c ? (c->k->numel + c->v->numel) * agi_dtype_size(c->dt) : 0;
}

bool agi_kv_cache_current(const ag_kv_cache *c, const ag_mha *m) {
    return c->version == m->version;
}

bool agi_kv_cache_check(const char *op, const ag_kv_cache *c, const void *owner,
                        const ag_mha *m, const ag_tensor *x, int *n) {
    if (!agi_given(c, op, "cache") || !agi_given(m, op, "module")) return false;
    if (c->owner != owner) {
        ag_error("%s: the cache was not made for this module", op);
        return false;
    }
    if (!agi_kv_cache_current(c, m)) {
        ag_error("%s: the module changed since the cache was made (heads pruned, or made "
                 "again): make a new cache",
                 op);
        return false;
    }
    const int E = m->cfg.embed_dim;
    if (!x || x->dtype != c->dt || (x->ndim != 2 && x->ndim != 3) || x->shape[0] > c->batch ||
        x->shape[x->ndim - 1] != E) {
        ag_error("%s: x %s must be %s [rows,%d] or [rows,n,%d] with rows <= %d", op,
                 agi_dtype_shape(x), ag_dtype_name(c->dt), E, E, c->batch);
        return false;
    }
    if (c->memory) {
        ag_error("%s: the cache holds an encoder memory, not the positions of a "
                 "self-attention",
                 op);
        return false;
    }
    if (c->len > 0 && x->shape[0] > c->rows) {
        ag_error("%s: x %s steps %d sequences, but only the first %d hold the %d positions "
                 "before (a step or a reorder since the last reset ran only those)",
                 op, agi_shape(x), x->shape[0], c->rows, c->len);
        return false;
    }
    *n = x->ndim == 3 ? x->shape[1] : 1;
    if (c->window && *n > INT_MAX - c->len) {
        ag_error("%s: %d new positions after %d: more than INT_MAX positions", op, *n, c->len);
        return false;
    }
    if (!c->window && *n > c->capacity - c->len) {
        if (c->len == c->capacity)
            ag_error("%s: the cache is full (%d positions)", op, c->capacity);
        else
            ag_error("%s: %d new positions do not fit: the cache holds %d of %d", op, *n,
                     c->len, c->capacity);
        return false;
    }
    return true;
}

// The first `rows` sequences of a cache buffer [batch, ...], as the step's tensors are.
ag_tensor *agi_kv_cache_rows(ag_tape *tp, ag_tensor *t, int rows) {
    return rows == t->shape[0] ? t : agi_rows_view(tp, t, 0, rows);
}

// Rows [row, row + count) of batch b of t [B, rows, width]: where they start.
static char *rows_at(const ag_tensor *t, int b, int row) {
    const size_t es = agi_dtype_size(t->dtype);
    return (char *)t->data + ((size_t)b * t->shape[1] + (size_t)row) * t->shape[2] * es;
}

ag_tensor *agi_kv_cache_window(ag_tape *tp, const ag_kv_cache *c, const ag_tensor *ring,
                               const ag_tensor *fresh, int seen) {
    const int rows = fresh->shape[0], n = fresh->shape[1];
    const size_t row = (size_t)c->width * agi_dtype_size(c->dt);
    ag_tensor *t = ag_tape_tensor(tp, c->dt, 3, (int[]){rows, seen + n, c->width});
    for (int b = 0; b < rows; b++) {
        for (int i = 0; i < seen; i++)  // position len - seen + i
            memcpy(rows_at(t, b, i), rows_at(ring, b, (c->len - seen + i) % c->window), row);
        memcpy(rows_at(t, b, seen), rows_at(fresh, b, 0), (size_t)n * row);
    }
    return t;
}

void agi_kv_cache_append(ag_kv_cache *c, const ag_mha *m, const ag_tensor *k,
                         const ag_tensor *v) {
    const size_t es = agi_dtype_size(c->dt), row = (size_t)c->width * es;
    const int n = k->shape[1];
    if (k->shape[0] < c->rows) c->rows = k->shape[0];  // the others miss these positions
    if (c->window) {  // the last W of the new positions, each at its row of the ring
        for (int b = 0; b < k->shape[0]; b++)
            for (int i = n > c->window ? n - c->window : 0; i < n; i++) {
                const int at = (int)(((long long)c->len + i) % c->window);
                memcpy(rows_at(c->k, b, at), rows_at(k, b, i), row);
                memcpy(rows_at(c->v, b, at), rows_at(v, b, i), row);
            }
        return;
    }
    for (int b = 0; b < k->shape[0]; b++) {
        memcpy(rows_at(c->k, b, c->extra + c->len), rows_at(k, b, 0), (size_t)n * row);
        memcpy(rows_at(c->v, b, c->extra + c->len), rows_at(v, b, 0), (size_t)n * row);
        // The extra keys, written at the first step of each generation: the parameters
        // may have changed since the last one (a cache is reset, not remade, between
        // generations), not within one.
        if (c->len > 0) continue;
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
    if (out && (out->dtype != x->dtype || !ag_tensor_same_shape(out, x))) {
        ag_error("%s: out %s must be %s, as x", op, agi_dtype_shape(out), agi_dtype_shape(x));
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
    memcpy(out ? out->data : in->data, y->data, y->numel * agi_dtype_size(y->dtype));
    return true;
}

bool ag_mha_forward_cached(const ag_mha *m, ag_kv_cache *c, const ag_tensor *x,
                           ag_tensor *out) {
    return step("mha_forward_cached", m, m, NULL, c, x, out);
}

bool ag_block_forward_cached(const ag_block *b, ag_kv_cache *c, ag_tensor *x) {
    return step("block_forward_cached", b, b ? &b->self_attn : NULL, b, c, x, NULL);
}

// ---- Beams: sequences change places ---------------------------------------------------
bool agi_kv_cache_reserve_reorder(ag_kv_cache *c) {
    if (!c->k_spare) {
        c->k_spare = ag_tensor_zeros(c->dt, 3, c->k->shape);
        c->v_spare = ag_tensor_zeros(c->dt, 3, c->v->shape);
    }
    return c->k_spare && c->v_spare;
}

bool ag_kv_cache_reorder(ag_kv_cache *c, const int *from, int n) {
    if (!agi_given(c, "kv_cache_reorder", "cache") ||
        !agi_given(from, "kv_cache_reorder", "list of rows `from`"))
        return false;
    if (n < 1 || n > c->batch || c->memory) {
        ag_error("kv_cache_reorder: needs a self-attention cache and 1 to %d rows, got %d",
                 c->batch, n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (from[i] < 0 || from[i] >= c->batch) {
            ag_error("kv_cache_reorder: row %d comes from row %d, outside [0, %d)", i, from[i],
                     c->batch);
            return false;
        }
        if (c->len > 0 && from[i] >= c->rows) {
            ag_error("kv_cache_reorder: row %d comes from row %d, but only the first %d hold "
                     "the %d positions stored",
                     i, from[i], c->rows, c->len);
            return false;
        }
    }
    const int held = c->window ? c->capacity : c->extra + c->len;  // a ring: all its rows
    const size_t used = (size_t)held * (size_t)c->width * agi_dtype_size(c->dt);
    // Sequences only dropped (a greedy search's finished inputs): each kept row moves up in
    // place, from a row not yet overwritten, with no buffer to make mid-decoding.
    bool increasing = true;
    for (int i = 0; i < n && increasing; i++) increasing = i == 0 || from[i] > from[i - 1];
    if (increasing) {
        for (int i = 0; i < n; i++) {
            if (from[i] == i) continue;
            memcpy(rows_at(c->k, i, 0), rows_at(c->k, from[i], 0), used);
            memcpy(rows_at(c->v, i, 0), rows_at(c->v, from[i], 0), used);
        }
        if (c->len > 0) c->rows = n;
        return true;
    }
    if (!agi_kv_cache_reserve_reorder(c)) return false;
    // Each kept row's positions (its extra keys included) into the spare buffers, which
    // then become the cache's: a row may feed several, or none.
    for (int i = 0; i < n; i++) {
        memcpy(rows_at(c->k_spare, i, 0), rows_at(c->k, from[i], 0), used);
        memcpy(rows_at(c->v_spare, i, 0), rows_at(c->v, from[i], 0), used);
    }
    ag_tensor *k = c->k, *v = c->v;
    c->k = c->k_spare, c->v = c->v_spare;
    c->k_spare = k, c->v_spare = v;
    if (c->len > 0) c->rows = n;  // the spare's rows from n on are another step's
    return true;
}

// ---- Memory: an encoder's keys and values for attention over it ------------------------
ag_kv_cache *agi_kv_cache_new_memory(const ag_mha *m, const void *owner, int sources,
                                     int max_src) {
    const int width = m->cfg.num_kv_heads * m->head_dim;
    const ag_dtype dt = m->out_proj.weight->dtype;
    size_t bytes;
    if (sources < 1 || max_src < 1 || !agi_size_mul((size_t)sources, (size_t)max_src, &bytes) ||
        !agi_size_mul(bytes, (size_t)width * agi_dtype_size(dt), &bytes)) {
        ag_error("decoder_cache: %d inputs of up to %d memory positions of width %d: needs "
                 "each >= 1 and at most 2^%d bytes",
                 sources, max_src, width, agi_max_bytes_log2());
        return NULL;
    }
    ag_kv_cache *c = agi_calloc(sizeof *c);
    *c = (ag_kv_cache){.owner = owner, .version = m->version, .dt = dt, .batch = sources,
                       .capacity = max_src, .width = width, .memory = true};
    return with_buffers(c, sources, max_src, width);
}

void agi_kv_cache_set_memory(ag_kv_cache *c, const ag_tensor *k, const ag_tensor *v,
                             const ag_tensor *key_padding, ag_mask_polarity polarity) {
    const int B = k->shape[0], S = k->shape[1];
    const size_t row = (size_t)S * (size_t)c->width * agi_dtype_size(c->dt);
    for (int b = 0; b < B; b++) {
        memcpy(rows_at(c->k, b, 0), rows_at(k, b, 0), row);
        memcpy(rows_at(c->v, b, 0), rows_at(v, b, 0), row);
    }
    ag_tensor_free(c->key_padding);
    c->key_padding = key_padding ? ag_tensor_convert(key_padding, AG_BOOL) : NULL;
    c->polarity = polarity;
    c->len = S;
}

void agi_kv_cache_keep_memory(ag_kv_cache *c, const int *keep, int n) {
    const size_t row = (size_t)c->len * (size_t)c->width * agi_dtype_size(c->dt);
    for (int i = 0; i < n; i++) {  // keep is increasing: row i is never one still to move
        if (keep[i] == i) continue;
        memmove(rows_at(c->k, i, 0), rows_at(c->k, keep[i], 0), row);
        memmove(rows_at(c->v, i, 0), rows_at(c->v, keep[i], 0), row);
        if (c->key_padding)
            memmove((uint8_t *)c->key_padding->data + (size_t)i * c->len,
                    (uint8_t *)c->key_padding->data + (size_t)keep[i] * c->len, (size_t)c->len);
    }
}

