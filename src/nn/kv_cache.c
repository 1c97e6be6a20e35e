// Inference one position at a time: MultiheadAttention (self-attention, causal)
// and the transformer block against a KV cache, without a tape.
//
// For the new position t of each sequence b (x: [B, E]):
//   q, k_t, v_t = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv    (one product with in_proj_weight)
//   RoPE: q and k_t rotated at their absolute position t   (as ag_rope with pos_offset t)
//   k_t, v_t are stored at position t of the cache         K, V: [B, max_len, E]
//   per head: a_j = softmax_j(q . k_j / sqrt(d) + bias(head, t, j)), j <= t
//             ctx = sum_j a_j v_j
//   out = ctx Wo^T + bo
// which is row t of the causal ag_mha_forward over positions 0..t: a causal query
// never sees a later key, so the keys and values of earlier positions do not change
// when a position is added, and computing them once is exact. That holds for every
// position scheme too: the relative, T5 and ALiBi bias of (t, j) depends on t - j
// alone, and a key rotated at its own position j stays what it was. The block
// composes it with its LayerNorms, feed-forward and residuals exactly as
// ag_block_forward does in eval mode (no dropout).
//
// Everything a step needs lives in the cache, allocated when it is made: a step
// allocates nothing.
#include <string.h>

#include "attograd/generate.h"
#include "../core/real.h"
#include "../kernels/gemm.h"
#include "../ops/op.h"
#include "nn.h"

// The cache's buffers, in the dtype of the module's parameters.
typedef struct {
    int B, max_len, len, E, h, ff;
    void *k, *v;                     // [B, max_len, E]
    void *qkv, *ctx, *xn, *hid, *p;  // [B, 3E], [B, E], [B, E], [B, ff], [max_len]
    // Positions, fixed when the cache is made (the tables' values are read at each step):
    int *col;         // RELATIVE, T5: col[t - j], the table column of key j for query t
    double *slope;    // ALIBI: [h]
    double *freq;     // ROPE: [d/2], base^(-2c/d) as ag_rope computes it
    void *rot;        // ROPE: [d], cos then sin of position t's angles
} kv_buffers;

struct ag_kv_cache {
    kv_buffers buf;
    ag_dtype dt;
    const void *owner;  // the module the cache was made for
};

// y[B, N] = x[B, K] W[N, K]^T + b[N] (b may be NULL)
static void linear(int B, int N, int K, const real *x, const ag_tensor *w, const ag_tensor *b,
                   real *y) {
    if (b)
        for (int r = 0; r < B; r++) memcpy(y + (size_t)r * N, b->data, (size_t)N * sizeof(real));
    R(agi_gemm)(false, true, B, N, K, 1, x, K, w->data, K, b ? 1 : 0, y, N);
}

// y = LayerNorm(x) row by row, as ag_layernorm computes it (biased variance, in double).
static void layernorm(int B, int E, const real *x, const ag_layernorm_layer *l, real *y) {
    const real *w = l->weight ? l->weight->data : NULL, *b = l->bias ? l->bias->data : NULL;
    for (int r = 0; r < B; r++) {
        const real *xr = x + (size_t)r * E;
        double mean = 0, var = 0;
        for (int e = 0; e < E; e++) mean += xr[e];
        mean /= E;
        for (int e = 0; e < E; e++) var += ((double)xr[e] - mean) * ((double)xr[e] - mean);
        double rstd = 1 / sqrt(var / E + l->eps);
        for (int e = 0; e < E; e++) {
            real v = (real)(((double)xr[e] - mean) * rstd);
            y[(size_t)r * E + e] = (w ? v * w[e] : v) + (b ? b[e] : 0);
        }
    }
}

// Rotates every head of one row x [h*d] by the angles of `cs` (ag_rope's arithmetic).
static void rope_row(real *x, int h, int d, const real *cs) {
    const int half = d / 2;
    for (int hd = 0; hd < h; hd++) {
        real *xh = x + hd * d;
        for (int c = 0; c < half; c++) {
            const real a = xh[c] * cs[c] - xh[c + half] * cs[half + c];
            const real b = xh[c + half] * cs[c] + xh[c] * cs[half + c];
            xh[c] = a, xh[c + half] = b;
        }
    }
}

// The position bias of query t and key j for head hd, as pos_bias.c computes it.
static real bias(const ag_mha *m, const kv_buffers *c, int hd, int t, int j) {
    if (c->slope) return (real)(c->slope[hd] * (j - t));  // ALiBi, causal: slope (j - i)
    if (!c->col) return 0;
    const real *table = m->pos_table->data;
    return table[(size_t)hd * m->pos_table->shape[1] + c->col[t - j]];
}

// out [B, E] = attention output for the new position of each sequence, from x [B, E].
static void mha_step(const ag_mha *m, kv_buffers *c, const real *x, real *out) {
    const int B = c->B, E = c->E, h = c->h, d = E / h, t = c->len;
    const real scale = (real)(1.0 / sqrt((double)d));
    real *qkv = c->qkv, *ctx = c->ctx, *p = c->p, *cs = c->rot;
    linear(B, 3 * E, E, x, m->in_proj_weight, m->in_proj_bias, qkv);
    if (cs)
        for (int i = 0; i < d / 2; i++) {
            const double a = (double)t * c->freq[i];
            cs[i] = (real)cos(a), cs[d / 2 + i] = (real)sin(a);
        }
    for (int b = 0; b < B; b++) {
        real *q = qkv + (size_t)b * 3 * E;
        if (cs) rope_row(q, h, d, cs), rope_row(q + E, h, d, cs);  // k stored rotated
        real *K = (real *)c->k + (size_t)b * c->max_len * E;
        real *V = (real *)c->v + (size_t)b * c->max_len * E;
        memcpy(K + (size_t)t * E, q + E, (size_t)E * sizeof(real));
        memcpy(V + (size_t)t * E, q + 2 * E, (size_t)E * sizeof(real));
        for (int hd = 0; hd < h; hd++) {
            const real *qh = q + hd * d;
            real mx = -INFINITY;
            for (int j = 0; j <= t; j++) {
                const real *kj = K + (size_t)j * E + hd * d;
                real s = 0;
                for (int i = 0; i < d; i++) s += qh[i] * kj[i];
                p[j] = s * scale + bias(m, c, hd, t, j);
                mx = p[j] > mx || p[j] != p[j] ? p[j] : mx;  // a NaN score makes the row NaN
            }
            real sum = 0;
            for (int j = 0; j <= t; j++) sum += p[j] = r_exp(p[j] - mx);
            real *o = ctx + (size_t)b * E + hd * d;
            for (int i = 0; i < d; i++) o[i] = 0;
            for (int j = 0; j <= t; j++) {
                const real *vj = V + (size_t)j * E + hd * d, a = p[j] / sum;
                for (int i = 0; i < d; i++) o[i] += a * vj[i];
            }
        }
    }
    linear(B, E, E, ctx, m->out_proj.weight, m->out_proj.bias, out);
}

static void block_step(const ag_block *blk, kv_buffers *c, real *x) {
    const int B = c->B, E = c->E, F = c->ff;
    const bool pre = blk->cfg.norm_first;
    real *a = c->xn, *hid = c->hid;
    // Attention sub-layer. The output goes to hid (only its first B*E are used here).
    mha_step(&blk->self_attn, c, pre ? (layernorm(B, E, x, &blk->norm1, a), a) : x, hid);
    for (size_t i = 0; i < (size_t)B * E; i++) x[i] += hid[i];
    if (!pre) layernorm(B, E, x, &blk->norm1, x);
    // Feed-forward sub-layer.
    const real *in = pre ? (layernorm(B, E, x, &blk->norm2, a), a) : x;
    linear(B, F, E, in, blk->linear1.weight, blk->linear1.bias, hid);
    for (size_t i = 0; i < (size_t)B * F; i++) {
        real z = hid[i];
        hid[i] = blk->cfg.activation == AG_ACT_GELU
                     ? (real)0.5 * z * (1 + r_erf(z * (real)0.70710678118654752440))
                     : (z > 0 ? z : 0);
    }
    linear(B, E, F, hid, blk->linear2.weight, blk->linear2.bias, a);
    for (size_t i = 0; i < (size_t)B * E; i++) x[i] += a[i];
    if (!pre) layernorm(B, E, x, &blk->norm2, x);
}

void R(agi_mha_step)(const ag_mha *m, ag_kv_cache *c, const void *x, void *out);
void R(agi_block_step)(const ag_block *b, ag_kv_cache *c, void *x);
void R(agi_mha_step)(const ag_mha *m, ag_kv_cache *c, const void *x, void *out) {
    mha_step(m, &c->buf, x, out);
    c->buf.len++;
}
void R(agi_block_step)(const ag_block *b, ag_kv_cache *c, void *x) {
    block_step(b, &c->buf, x);
    c->buf.len++;
}

#if AG_ONCE
void agi_mha_step_f64(const ag_mha *m, ag_kv_cache *c, const void *x, void *out);
void agi_block_step_f64(const ag_block *b, ag_kv_cache *c, void *x);

// What a step needs of the module's position scheme, computed once. The query is
// always the last position, so the bias takes the causal variant.
static void positions_init(kv_buffers *c, const ag_mha *m, size_t real_size) {
    const int h = c->h, d = c->E / h;
    if (m->cfg.pos == AG_POS_RELATIVE || m->cfg.pos == AG_POS_T5) {
        ag_pos_bias pb = {.kind = m->cfg.pos, .max_distance = m->cfg.max_distance,
                          .num_buckets = m->cfg.num_buckets, .bidirectional = false};
        c->col = agi_calloc((size_t)c->max_len * sizeof *c->col);
        for (int k = 0; k < c->max_len; k++) c->col[k] = agi_pos_column(&pb, -k);  // j - i = -k
    } else if (m->cfg.pos == AG_POS_ALIBI) {
        c->slope = agi_calloc((size_t)h * sizeof *c->slope);
        for (int hd = 0; hd < h; hd++) c->slope[hd] = agi_alibi_slope(hd, h);
    } else if (m->cfg.pos == AG_POS_ROPE) {
        c->freq = agi_calloc((size_t)(d / 2) * sizeof *c->freq);
        for (int i = 0; i < d / 2; i++) c->freq[i] = pow(m->cfg.rope_base, -2.0 * i / d);
        c->rot = agi_calloc((size_t)d * real_size);
    }
}

static ag_kv_cache *cache_new(const ag_mha *m, const void *owner, int B, int max_len, int ff) {
    if (!m || !m->in_proj_weight || B < 1 || max_len < 1) {
        ag_error("kv_cache: needs self-attention with the packed in_proj_weight, batch >= 1 "
                 "and max_len >= 1; got %s, batch %d, max_len %d",
                 !m ? "no module" : m->in_proj_weight ? "packed" : "separate projections", B,
                 max_len);
        return NULL;
    }
    // What the one-position path does not compute: it would silently differ from the
    // module's forward.
    const char *unsupported = m->head_dim * m->cfg.num_heads != m->cfg.embed_dim
                                  ? "pruned heads (h*d != E)"
                              : m->cfg.add_bias_kv   ? "add_bias_kv"
                              : m->cfg.add_zero_attn ? "add_zero_attn"
                                                     : NULL;
    if (unsupported) {
        ag_error("kv_cache: the module uses %s, which the cached path does not support",
                 unsupported);
        return NULL;
    }
    int E = m->cfg.embed_dim;
    size_t s = ag_dtype_size(m->in_proj_weight->dtype), kv, row;
    size_t qkv = 3 * (size_t)E, widest = ff > 0 && (size_t)ff > qkv ? (size_t)ff : qkv;
    if (!agi_size_mul((size_t)B, (size_t)max_len, &kv) || !agi_size_mul(kv, (size_t)E * s, &kv) ||
        !agi_size_mul((size_t)B, widest * s, &row)) {
        ag_error("kv_cache: batch %d x max_len %d of %s width %d (feed-forward %d) is too "
                 "large: more than the 2^%d bytes one buffer may take",
                 B, max_len, ag_dtype_name(m->in_proj_weight->dtype), E, ff,
                 agi_max_bytes_log2());
        return NULL;
    }
    ag_kv_cache *cache = agi_calloc(sizeof *cache);
    cache->dt = m->in_proj_weight->dtype;
    cache->owner = owner;
    kv_buffers *c = &cache->buf;
    *c = (kv_buffers){.B = B, .max_len = max_len, .E = E, .h = m->cfg.num_heads,
                      .ff = ff < E ? E : ff};
    c->k = agi_calloc(kv);
    c->v = agi_calloc(kv);
    c->qkv = agi_calloc((size_t)B * 3 * E * s);
    c->ctx = agi_calloc((size_t)B * E * s);
    c->xn = agi_calloc((size_t)B * E * s);
    c->hid = agi_calloc((size_t)B * c->ff * s);
    c->p = agi_calloc((size_t)max_len * s);
    positions_init(c, m, s);
    return cache;
}

ag_kv_cache *ag_kv_cache_new(const ag_mha *m, int batch, int max_len) {
    return cache_new(m, m, batch, max_len, 0);
}

ag_kv_cache *ag_kv_cache_new_block(const ag_block *b, int batch, int max_len) {
    return b ? cache_new(&b->self_attn, b, batch, max_len, b->cfg.dim_feedforward)
             : cache_new(NULL, NULL, batch, max_len, 0);
}

void ag_kv_cache_free(ag_kv_cache *c) {
    if (!c) return;
    const kv_buffers *b = &c->buf;
    void *bufs[] = {b->k, b->v, b->qkv, b->ctx, b->xn, b->hid, b->p,
                    b->col, b->slope, b->freq, b->rot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) agi_free(bufs[i]);
    agi_free(c);
}

void ag_kv_cache_reset(ag_kv_cache *c) {
    if (c) c->buf.len = 0;
}
int ag_kv_cache_len(const ag_kv_cache *c) { return c ? c->buf.len : 0; }
int ag_kv_cache_capacity(const ag_kv_cache *c) { return c ? c->buf.max_len : 0; }

static bool check_step(const char *op, const ag_kv_cache *c, const void *owner,
                       const ag_tensor *x, const ag_tensor *out) {
    if (!c || c->owner != owner) {
        ag_error("%s: the cache was not made for this module", op);
        return false;
    }
    const ag_tensor *ts[2] = {x, out};
    for (int i = 0; i < 2; i++) {
        const ag_tensor *t = ts[i];
        if (i == 1 && !out) break;
        if (!t || t->dtype != c->dt || t->ndim != 2 || t->shape[0] != c->buf.B ||
            t->shape[1] != c->buf.E) {
            ag_error("%s: %s %s must be %s [%d,%d]", op, i ? "out" : "x",
                     t ? agi_shape(t) : "NULL", ag_dtype_name(c->dt), c->buf.B, c->buf.E);
            return false;
        }
    }
    if (c->buf.len >= c->buf.max_len) {
        ag_error("%s: the cache is full (%d positions)", op, c->buf.max_len);
        return false;
    }
    return true;
}

bool ag_mha_forward_cached(const ag_mha *m, ag_kv_cache *c, const ag_tensor *x,
                           ag_tensor *out) {
    if (!check_step("mha_forward_cached", c, m, x, out)) return false;
    if (c->dt == AG_F64) agi_mha_step_f64(m, c, x->data, out->data);
    else agi_mha_step_f32(m, c, x->data, out->data);
    return true;
}

bool ag_block_forward_cached(const ag_block *b, ag_kv_cache *c, ag_tensor *x) {
    if (!check_step("block_forward_cached", c, b, x, NULL)) return false;
    if (c->dt == AG_F64) agi_block_step_f64(b, c, x->data);
    else agi_block_step_f32(b, c, x->data);
    return true;
}
#endif
