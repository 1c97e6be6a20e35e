// torch.nn.MultiheadAttention (batch_first=True), built from the ops so its
// gradients come from the tape:
//   q, k, v = query Wq^T + bq, key Wk^T + bk, value Wv^T + bv   [B,T,E] [B,S,E] [B,S,E]
//   per head: A = softmax(q k^T / sqrt(d) + masks)               [B,h,T,S]
//   (grouped-query, num_kv_heads h_kv < h: k and v [B,S,h_kv*d], head i reading kv head
//   i / (h / h_kv); the fused path reads them in place, the composed one repeats them;
//   a sliding window W masks the keys W or more positions from a query, the fused path
//   never reading those blocks)
//             A = dropout(A)                                     (training only)
//   out = merge_heads(A v) Wo^T + bo                             [B,T,E]
// One description of the attention (`describe`: scale, causality, masks, dropout, and the
// module's position scheme, src/ops/pos.h) runs on three paths with the same result:
//   fused     the caller does not ask for the weights: ag_attention, which never stores
//             A (memory linear in T), the scheme inside it (a RoPE rotation included);
//   composed  the caller asks for the weights: the ops (matmul, softmax, dropout,
//             matmul), the scheme's rotation as ops, its term in the softmax, since the
//             weights are then needed whole anyway (PyTorch too takes its fast path only
//             without weights). The reference the tests hold the others to;
//   cached    new positions against a KV cache (agi_mha_forward_cached): the same
//             projections, rotation as ops at the new positions, and the fused attention
//             on the cached keys, its queries offset by the positions before them.
//
// The fused path reads the heads straight out of the projections [B, T, E] (a head is a
// column block), so it needs no split_heads / merge_heads copies, forward or backward.
// Self-attention (query, key and value one tensor, and the packed in_proj_weight) goes
// further, as PyTorch does: one product with the whole in_proj_weight [3E, E] gives
// [B, T, 3E] = [q | k | v] for ag_attention_packed. One gemm with N = 3E runs closer to
// the BLAS peak than three with N = E (measured in bench/README.md), and backward's dx
// and dW are one product each too.
#include <limits.h>
#include <stdatomic.h>
#include <math.h>
#include <string.h>

#include "../ops/op.h"  // agi_dropout_site
#include "nn.h"

// The module's position scheme with its parameters (the scheme's defaults for those the
// config leaves 0), for head width d.
static agi_pos pos_of(const ag_mha_config *cfg, int d) {
    agi_pos p = {.p = {.kind = cfg->pos,
                       .max_distance = cfg->max_distance,
                       .num_buckets = cfg->num_buckets,
                       .heads = cfg->num_heads,
                       .base = cfg->rope_base},
                 .head_dim = d};
    agi_pos_defaults(&p);
    return p;
}

agi_pos agi_mha_pos(const ag_mha *m, bool causal) {
    agi_pos p = pos_of(&m->cfg, m->head_dim);
    p.p.bidirectional = !causal;  // T5 and ALiBi: the causal variant for a causal forward
    return p;
}

uint64_t agi_mha_version_next(void) {
    static _Atomic uint64_t versions;
    return atomic_fetch_add(&versions, 1) + 1;
}

// Everything ag_mha_init can refuse, checked before a parameter is added, so a refused
// config leaves the store as it was: whatever the forward, the composed path or a KV
// cache would refuse about the config is refused here (the position scheme's parameters
// for the causal and the bidirectional forward). Sizes are computed in 64 bits: h * d and
// 3 * h * d are tensor extents (in_proj_weight has 3hd rows), which must fit in an int.
static bool check_config(const ag_mha_config *cfg) {
    int E = cfg->embed_dim, h = cfg->num_heads;
    if (E < 1 || h < 1 || cfg->head_dim < 0 || (cfg->head_dim == 0 && E % h != 0)) {
        ag_error("mha: embed_dim %d must be a positive multiple of num_heads %d", E, h);
        return false;
    }
    if (cfg->kdim < 0 || cfg->vdim < 0) {
        ag_error("mha: kdim %d and vdim %d must be >= 0 (0 means embed_dim %d)", cfg->kdim,
                 cfg->vdim, E);
        return false;
    }
    if (!(cfg->dropout >= 0.0 && cfg->dropout <= 1.0)) {
        ag_error("mha: dropout %g must be in [0, 1]", cfg->dropout);
        return false;
    }
    if (cfg->num_kv_heads < 0 || (cfg->num_kv_heads > 0 && h % cfg->num_kv_heads != 0)) {
        ag_error("mha: num_kv_heads %d must divide num_heads %d (0 means num_heads)",
                 cfg->num_kv_heads, h);
        return false;
    }
    if (cfg->window < 0 || (cfg->window > 0 && (cfg->add_bias_kv || cfg->add_zero_attn))) {
        ag_error(cfg->window < 0 ? "mha: window %d must be >= 0 (0: no sliding window)"
                                 : "mha: window %d does not combine with add_bias_kv or "
                                   "add_zero_attn (their keys have no position in a window)",
                 cfg->window);
        return false;
    }
    int d = cfg->head_dim ? cfg->head_dim : E / h;
    long long I = (long long)h * d;  // in_proj_weight has 3I rows, in_proj_bias 3I entries
    if (I > INT_MAX / 3) {
        ag_error("mha: embed_dim %d, num_heads %d, head_dim %d: in_proj_weight would have "
                 "3 * %lld rows, more than INT_MAX (%d)",
                 E, h, d, I, INT_MAX);
        return false;
    }
    const agi_pos pos = pos_of(cfg, d);
    return agi_pos_check_module("mha", &pos, cfg->add_bias_kv || cfg->add_zero_attn);
}

static bool init_parts(ag_mha *m, ag_params *ps, const char *module, const ag_mha_config *cfg,
                       ag_pcg32 *rng) {
    if (!agi_given(m, "mha_init", "module") || !agi_given(cfg, "mha_init", "config") ||
        !agi_given(rng, "mha_init", "rng"))
        return false;
    memset(m, 0, sizeof *m);
    if (!agi_module_name_ok("mha_init", module) || !check_config(cfg)) return false;
    int E = cfg->embed_dim, h = cfg->num_heads;
    m->cfg = *cfg;
    m->cfg.kdim = cfg->kdim ? cfg->kdim : E;
    m->cfg.vdim = cfg->vdim ? cfg->vdim : E;
    m->head_dim = m->cfg.head_dim = cfg->head_dim ? cfg->head_dim : E / h;
    const int kvh = m->cfg.num_kv_heads = cfg->num_kv_heads ? cfg->num_kv_heads : h;
    const agi_pos pos = pos_of(cfg, m->head_dim);  // with the scheme's defaults
    m->cfg.max_distance = pos.p.max_distance;
    m->cfg.num_buckets = pos.p.num_buckets;
    m->cfg.rope_base = pos.p.base;
    m->version = agi_mha_version_next();
    int I = h * m->head_dim;  // all heads side by side (E unless head_dim says otherwise)
    int Ikv = kvh * m->head_dim;  // the kv heads side by side: I unless grouped
    char name[AGI_NAME_MAX];
    // In PyTorch's state_dict order: projections, in_proj_bias, out_proj.
    if (m->cfg.kdim == E && m->cfg.vdim == E && kvh == h) {
        if (!agi_join_name(name, module, "in_proj_weight") ||
            !(m->in_proj_weight = ag_params_add(ps, name, 2, (int[]){3 * I, E})))
            return false;
        ag_tensor_init_xavier_uniform(m->in_proj_weight, rng, 1.0);
    } else {
        const char *names[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
        int in[3] = {E, m->cfg.kdim, m->cfg.vdim}, out[3] = {I, Ikv, Ikv};
        ag_tensor **w[3] = {&m->q_proj_weight, &m->k_proj_weight, &m->v_proj_weight};
        for (int i = 0; i < 3; i++) {
            if (!agi_join_name(name, module, names[i]) ||
                !(*w[i] = ag_params_add(ps, name, 2, (int[]){out[i], in[i]})))
                return false;
            ag_tensor_init_xavier_uniform(*w[i], rng, 1.0);
        }
    }
    if (!cfg->no_bias) {
        if (!agi_join_name(name, module, "in_proj_bias") ||
            !(m->in_proj_bias = ag_params_add(ps, name, 1, (int[]){I + 2 * Ikv})))
            return false;
    }
    if (cfg->add_bias_kv) {
        const char *names[2] = {"bias_k", "bias_v"};
        ag_tensor **t[2] = {&m->bias_k, &m->bias_v};
        for (int i = 0; i < 2; i++) {
            if (!agi_join_name(name, module, names[i]) ||
                !(*t[i] = ag_params_add(ps, name, 3, (int[]){1, 1, Ikv})))
                return false;
            // xavier_normal on [1, 1, Ikv]: fan_in = fan_out = Ikv, std = sqrt(2 / 2Ikv)
            ag_tensor_init_normal(*t[i], rng, 0.0, sqrt(1.0 / Ikv));
        }
    }
    if (!agi_join_name(name, module, "out_proj") ||
        !ag_linear_layer_init(&m->out_proj, ps, name, I, E, !cfg->no_bias, rng))
        return false;
    if (m->out_proj.bias) ag_tensor_fill(m->out_proj.bias, 0.0);  // as PyTorch's _reset_parameters
    const int cols = agi_pos_table_cols(&pos);  // the scheme's learned table, if it has one
    if (cols > 0 && (!agi_join_name(name, module, "relative_attention_bias.weight") ||
                     !(m->pos_table = ag_params_add(ps, name, 2, (int[]){h, cols}))))
        return false;
    if (!agi_join_name(name, module, "attn_dropout")) return false;
    m->site = agi_dropout_site(name, NULL);
    return true;
}

bool ag_mha_init(ag_mha *m, ag_params *ps, const char *module, const ag_mha_config *cfg,
                 ag_pcg32 *rng) {
    const agi_init_undo u = agi_init_begin(ps, rng);
    const bool ok = init_parts(m, ps, module, cfg, rng);
    return agi_init_end(&u, ok, m, m ? sizeof *m : 0);
}

static bool check_inputs(const ag_mha *m, const ag_tensor *q, const ag_tensor *k,
                         const ag_tensor *v) {
    if (!agi_given(m, "mha", "module")) return false;
    if (!q || !k || !v) {
        ag_error("mha: query, key and value must not be NULL");
        return false;
    }
    if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3) {
        ag_error("mha: query %s, key %s and value %s must be [B, T, E], [B, S, kdim], "
                 "[B, S, vdim]",
                 agi_shape(q), agi_shape(k), agi_shape(v));
        return false;
    }
    if (q->shape[2] != m->cfg.embed_dim || k->shape[2] != m->cfg.kdim ||
        v->shape[2] != m->cfg.vdim) {
        ag_error("mha: query %s, key %s, value %s do not match embed_dim %d, kdim %d, vdim %d",
                 agi_shape(q), agi_shape(k), agi_shape(v), m->cfg.embed_dim, m->cfg.kdim,
                 m->cfg.vdim);
        return false;
    }
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != v->shape[1]) {
        ag_error("mha: batch or key length differ: query %s, key %s, value %s", agi_shape(q),
                 agi_shape(k), agi_shape(v));
        return false;
    }
    // Else the first projection reported the dtypes and the attention that it had no input.
    const ag_dtype dt = m->out_proj.weight->dtype;
    if (q->dtype != dt || k->dtype != dt || v->dtype != dt) {
        ag_error("mha: query %s, key %s and value %s must be %s, as the module's parameters",
                 ag_dtype_name(q->dtype), ag_dtype_name(k->dtype), ag_dtype_name(v->dtype),
                 ag_dtype_name(dt));
        return false;
    }
    return true;
}

// One of the three input projections, x [B, L, in] -> [B, L, I] (q) or [B, L, Ikv] (k,
// v), on its rows of the packed weight and bias, [0, I), [I, I + Ikv), [I + Ikv, I +
// 2 Ikv) (views: gradients land in the packed tensors).
static ag_tensor *project(ag_tape *tp, const ag_mha *m, int i, ag_tensor *x, ag_tensor *separate) {
    const int I = m->cfg.num_heads * m->head_dim, Ikv = m->cfg.num_kv_heads * m->head_dim;
    const int at = i == 0 ? 0 : I + (i - 1) * Ikv, rows = i == 0 ? I : Ikv;
    ag_tensor *w = m->in_proj_weight ? agi_rows_view(tp, m->in_proj_weight, at, rows) : separate;
    ag_tensor *b = m->in_proj_bias ? agi_rows_view(tp, m->in_proj_bias, at, rows) : NULL;
    return ag_linear(tp, x, w, b);
}

// The weights PyTorch returns with need_weights: a copy (no gradient),
// averaged over heads unless asked per head.
static ag_tensor *weights_copy(ag_tape *tp, const ag_tensor *attn, bool per_head) {
    int B = attn->shape[0], h = attn->shape[1], T = attn->shape[2], S = attn->shape[3];
    if (per_head) {
        ag_tensor *w = ag_tape_tensor(tp, attn->dtype, 4, attn->shape);
        ag_tensor_copy(w, attn);
        return w;
    }
    ag_tensor *w = ag_tape_tensor(tp, attn->dtype, 3, (int[]){B, T, S});
    size_t plane = (size_t)T * S;
    for (int b = 0; b < B; b++)
        for (size_t e = 0; e < plane; e++) {
            double s = 0;
            for (int k = 0; k < h; k++) s += ag_tensor_item(attn, ((size_t)b * h + k) * plane + e);
            ag_tensor_set_item(w, (size_t)b * plane + e, s / h);
        }
    return w;
}

// A bool mask for S + extra keys: `mask` (NULL, or any shape that broadcasts to the
// scores [B, h, T, S], its last dim S) with `extra` more columns that may be attended
// (PyTorch pads its masks with one zero column per extra key), and with `causal`, key
// j > query i masked among the first S keys only (PyTorch's triu(1) [T, S] mask, padded
// the same way; the attention's own causal flag would mask the extra keys too). Causal
// needs the query index, so the result then has a T dim: the mask broadcast to
// [..., T, S + extra] (a [B,1,1,S] mask becomes [B,1,T,S+extra]; [S] or none, [T,S+extra]).
// Values follow the polarity: true = masked (BLOCKS) or true = may attend (KEEPS). In tape
// memory, without a gradient (a bool mask has none).
static ag_tensor *pad_bool_mask(ag_tape *tp, const ag_tensor *mask, int T, int S, int extra,
                                bool causal, bool keeps) {
    int shape[AG_MAX_DIMS] = {T, S}, nd = 2;
    if (mask && (mask->ndim >= 2 || !causal)) {
        nd = mask->ndim;
        memcpy(shape, mask->shape, sizeof shape);
    }
    int mask_t = mask && mask->ndim >= 2 ? mask->shape[mask->ndim - 2] : 1;  // T or 1
    if (causal) shape[nd - 2] = T;
    const int W = S + extra;
    shape[nd - 1] = W;
    ag_tensor *out = ag_tape_tensor(tp, AG_BOOL, nd, shape);
    uint8_t *o = out->data;
    const uint8_t *in = mask ? mask->data : NULL;
    size_t rows = out->numel / (size_t)W;
    for (size_t r = 0; r < rows; r++) {
        // The mask's row for output row r: the same row, or (a [.., 1, S] mask broadcast over
        // T) row r / T, or (a 1-D mask) its only row.
        size_t from = !mask || mask->ndim == 1 ? 0 : causal && mask_t == 1 ? r / (size_t)T : r;
        int t = (int)(r % (size_t)T);
        for (int j = 0; j < W; j++) {
            // Any nonzero byte is true, as every other reader of a bool mask takes it.
            bool blocked = j < S && ((in && (in[from * (size_t)S + j] != 0) != keeps) ||
                                     (causal && j > t));
            o[r * (size_t)W + j] = blocked != keeps;  // the extra keys: never blocked
        }
    }
    return out;
}

// An additive mask [..., S] -> [..., S + extra], zeros added for the extra keys, through
// ag_concat: a mask that requires grad gets its gradient through the tape.
static ag_tensor *pad_additive_mask(ag_tape *tp, ag_tensor *mask, int extra) {
    int shape[AG_MAX_DIMS];
    memcpy(shape, mask->shape, sizeof shape);
    shape[mask->ndim - 1] = extra;
    ag_tensor *zeros = ag_tape_tensor(tp, mask->dtype, mask->ndim, shape);
    return ag_concat(tp, (ag_tensor *[]){mask, zeros}, 2, mask->ndim - 1);
}

// One more key (and value) position at the end of x [B, S, I]: `row` ([1, 1, I], learned)
// broadcast over the batch, or zeros when row is NULL.
static ag_tensor *append_position(ag_tape *tp, ag_tensor *x, ag_tensor *row) {
    if (!x) return NULL;
    const int shape[] = {x->shape[0], 1, x->shape[2]};
    ag_tensor *last = row ? ag_expand(tp, row, 3, shape) : ag_tape_tensor(tp, x->dtype, 3, shape);
    return last ? ag_concat(tp, (ag_tensor *[]){x, last}, 2, 1) : NULL;
}

// add_bias_kv and add_zero_attn: k, v [B, S, I] -> [B, S + extra, I], and the masks
// padded to match (the causal flag becomes part of the bool mask, since the extra keys
// sit after every query's position yet are visible to all).
static bool append_extra_keys(ag_tape *tp, const ag_mha *m, ag_tensor **k, ag_tensor **v,
                              ag_softmax_opts *so, const ag_tensor *query,
                              const ag_tensor *key) {
    const int T = query->shape[1], S = key->shape[1];
    if (m->cfg.add_bias_kv) {
        *k = append_position(tp, *k, m->bias_k);
        *v = append_position(tp, *v, m->bias_v);
    }
    if (m->cfg.add_zero_attn) {
        *k = append_position(tp, *k, NULL);
        *v = append_position(tp, *v, NULL);
    }
    if (!*k || !*v) return false;
    const int extra = m->cfg.add_bias_kv + m->cfg.add_zero_attn;
    bool keeps = so->mask_polarity == AG_MASK_KEEPS;
    if (so->mask || so->causal) {
        so->mask = pad_bool_mask(tp, so->mask, T, S, extra, so->causal, keeps);
        if (!so->mask) return false;
    }
    so->causal = false;
    if (so->additive_mask) {
        so->additive_mask = pad_additive_mask(tp, so->additive_mask, extra);
        if (!so->additive_mask) return false;
    }
    if (so->key_padding_mask) {
        so->key_padding_mask = pad_bool_mask(tp, so->key_padding_mask, T, S, extra, false, keeps);
        if (!so->key_padding_mask) return false;
    }
    return true;
}

// The masks as the caller gave them, against the scores [B, h, T, S] before any extra
// keys, with the attention's own checks, before anything is computed: a message names the
// caller's op, its mask by the caller's name and its shape as given (after add_bias_kv's
// padding it would ask for S + extra columns; a mask of the wrong dtype would be refused
// by the padding's concat).
static bool masks_ok(const agi_mask_caller *who, const ag_mha *m, const ag_softmax_opts *so,
                     const ag_tensor *query, const ag_tensor *key) {
    const int B = query->shape[0], T = query->shape[1], S = key->shape[1];
    const ag_tensor *masks[2] = {so->mask ? so->mask : so->additive_mask, so->key_padding_mask};
    for (int i = 0; i < 2 && m->cfg.add_bias_kv + m->cfg.add_zero_attn; i++)
        if (masks[i] && (masks[i]->ndim < 1 || masks[i]->shape[masks[i]->ndim - 1] != S)) {
            ag_error("%s: %s %s must end in S = %d keys with add_bias_kv or add_zero_attn",
                     who->op, i ? who->key_padding_mask : who->attn_mask,
                     agi_shape(masks[i]), S);
            return false;
        }
    ag_tensor *in[AG_MAX_INPUTS];
    int n_in = 0;
    agi_scores checked;
    const agi_about about = {"query", query, "key", key};
    const agi_mask_names names = {who->attn_mask, who->attn_mask, who->key_padding_mask};
    return agi_check_softmax_masks(who->op, so, query->dtype, 4,
                                   (int[]){B, m->cfg.num_heads, T, S}, 0, &about, &about,
                                   &names, in, &n_in, &checked);
}

// The description of one forward's attention, its position scheme aside (each path runs
// that its own way): scale, causality, masks and their polarity, dropout, the heads.
static ag_attention_opts describe(const ag_mha *m, const ag_mha_opts *opts) {
    ag_attention_opts ao = {.dropout = m->cfg.dropout,
                            .training = opts->training,
                            .seed = opts->dropout_seed,
                            .site = m->site,
                            .heads = m->cfg.num_heads,
                            .kv_heads = m->cfg.num_kv_heads};
    ao.softmax.scale = 1.0 / sqrt((double)m->head_dim);
    ao.softmax.causal = opts->causal;
    ao.softmax.window = m->cfg.window;
    ao.softmax.key_padding_mask = opts->key_padding_mask;
    ao.softmax.mask_polarity = opts->mask_polarity;
    if (opts->attn_mask && opts->attn_mask->dtype == AG_BOOL)
        ao.softmax.mask = opts->attn_mask;
    else
        ao.softmax.additive_mask = opts->attn_mask;
    return ao;
}

// x [B, h_kv, S, d] -> [B, h, S, d], kv head j repeated as heads j*g .. j*g + g - 1
// (PyTorch's repeat_interleave(g, dim=1)); the gradient of each kv head sums its copies'.
static ag_tensor *repeat_kv(ag_tape *tp, ag_tensor *x, int h) {
    const int kvh = x ? x->shape[1] : h;
    if (!x || kvh == h) return x;
    ag_tensor *index = ag_tape_tensor(tp, AG_I32, 1, (int[]){h});
    for (int i = 0; i < h; i++) ((int32_t *)index->data)[i] = i / (h / kvh);
    return ag_index_select(tp, x, 1, index);
}

// The composed attention on q [B,T,I], k, v [B,S,Ikv] -> [B,T,I], with the weights (no
// gradient) in *weights.
static ag_tensor *composed(ag_tape *tp, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                           const ag_attention_opts *ao, bool per_head, ag_tensor **weights) {
    q = ag_split_heads(tp, q, ao->heads);
    k = repeat_kv(tp, ag_split_heads(tp, k, ao->kv_heads), ao->heads);
    v = repeat_kv(tp, ag_split_heads(tp, v, ao->kv_heads), ao->heads);
    ag_tensor *attn = ag_softmax(tp, ag_matmul(tp, q, k, false, true), &ao->softmax);
    if (!attn) return NULL;  // the softmax said why (a mask's shape); dropout would add a line
    attn = ag_dropout(tp, attn, ao->dropout, ao->training, ao->seed, ao->site);  // [B,h,T,S]
    if (!attn) return NULL;
    *weights = weights_copy(tp, attn, per_head);
    return ag_merge_heads(tp, ag_matmul(tp, attn, v, false, false));  // [B,T,I]
}

ag_tensor *ag_mha_forward(ag_tape *tp, const ag_mha *m, ag_tensor *query, ag_tensor *key,
                          ag_tensor *value, const ag_mha_opts *opts, ag_tensor **weights) {
    static const agi_mask_caller mha = {"mha", "attn_mask", "key_padding_mask"};
    return agi_mha_forward_for(tp, m, query, key, value, opts, weights, &mha);
}

ag_tensor *agi_mha_forward_for(ag_tape *tp, const ag_mha *m, ag_tensor *query, ag_tensor *key,
                               ag_tensor *value, const ag_mha_opts *opts, ag_tensor **weights,
                               const agi_mask_caller *who) {
    static const ag_mha_opts none;
    if (!opts) opts = &none;
    if (weights) *weights = NULL;
    if (!check_inputs(m, query, key, value)) return NULL;
    if (opts->head_mask && (opts->head_mask->ndim != 1 ||
                            opts->head_mask->shape[0] != m->cfg.num_heads)) {
        ag_error("%s: head_mask %s must be [%d], one entry per head", who->op,
                 agi_shape(opts->head_mask), m->cfg.num_heads);
        return NULL;
    }
    if (opts->mask_polarity != AG_MASK_BLOCKS && opts->mask_polarity != AG_MASK_KEEPS) {
        ag_error("%s: unknown mask_polarity %d (AG_MASK_BLOCKS or AG_MASK_KEEPS)", who->op,
                 (int)opts->mask_polarity);
        return NULL;
    }
    const int h = m->cfg.num_heads, kvh = m->cfg.num_kv_heads;
    ag_attention_opts ao = describe(m, opts);
    if (!masks_ok(who, m, &ao.softmax, query, key)) return NULL;
    const agi_pos pos = agi_mha_pos(m, opts->causal);
    ag_tensor *ctx;  // [B,T,I]: every head's output side by side
    int extra = m->cfg.add_bias_kv + m->cfg.add_zero_attn;
    if (!weights && !extra && query == key && key == value && m->in_proj_weight) {
        agi_pos_inside(&pos, m->pos_table, &ao);
        ag_tensor *qkv = ag_linear(tp, query, m->in_proj_weight, m->in_proj_bias);  // [B,T,3I]
        ctx = ag_attention_packed(tp, qkv, &ao);
    } else {
        ag_tensor *q = project(tp, m, 0, query, m->q_proj_weight);  // [B,T,I]
        ag_tensor *k = project(tp, m, 1, key, m->k_proj_weight);    // [B,S,Ikv]
        ag_tensor *v = project(tp, m, 2, value, m->v_proj_weight);  // [B,S,Ikv]
        if (weights) {  // the scheme's rotation as ops, its term in the softmax
            q = agi_pos_rotate(tp, &pos, q, h, 0);
            k = agi_pos_rotate(tp, &pos, k, kvh, 0);
            ao.softmax.pos = agi_pos_terms(&pos, m->pos_table);
        } else {
            agi_pos_inside(&pos, m->pos_table, &ao);
        }
        if (extra && !append_extra_keys(tp, m, &k, &v, &ao.softmax, query, key))
            return NULL;
        ctx = weights ? composed(tp, q, k, v, &ao, opts->per_head_weights, weights)
                      : ag_attention(tp, q, k, v, &ao);
    }
    if (ctx && opts->head_mask) ctx = ag_head_mask(tp, ctx, opts->head_mask, h);
    if (!ctx) return NULL;
    return ag_linear_layer_forward(tp, &m->out_proj, ctx);  // [B,T,E]
}

// x [B, n, 3I] -> columns [i*I, (i+1)*I), [B, n, I].
static ag_tensor *third(ag_tape *tp, ag_tensor *x, int i) {
    const int I = x->shape[2] / 3;
    return ag_slice(tp, x, 2, i * I, I);
}

ag_tensor *agi_mha_forward_cached(ag_tape *tp, const ag_mha *m, ag_kv_cache *c, ag_tensor *x) {
    int n;
    if (!agi_kv_cache_check("mha_forward_cached", c, c ? c->owner : NULL, m, x, &n))
        return NULL;
    if (ag_tape_grad_enabled(tp)) {
        ag_error("mha_forward_cached: the tape must have grad disabled (a cached step has no "
                 "backward)");
        return NULL;
    }
    const int h = m->cfg.num_heads, B = x->shape[0];  // the first B <= batch sequences
    const ag_mha_opts eval = {.causal = true};
    ag_attention_opts ao = describe(m, &eval);
    const agi_pos pos = agi_mha_pos(m, true);
    if (x->ndim == 2) x = ag_reshape(tp, x, 3, (int[]){B, 1, m->cfg.embed_dim});
    ag_tensor *q, *k, *v;  // [B,n,I], [B,n,Ikv], [B,n,Ikv]
    if (m->in_proj_weight) {  // one product, as the packed forward
        ag_tensor *qkv = ag_linear(tp, x, m->in_proj_weight, m->in_proj_bias);  // [B,n,3I]
        if (!qkv) return NULL;
        q = third(tp, qkv, 0), k = third(tp, qkv, 1), v = third(tp, qkv, 2);
    } else {
        q = project(tp, m, 0, x, m->q_proj_weight);
        k = project(tp, m, 1, x, m->k_proj_weight);
        v = project(tp, m, 2, x, m->v_proj_weight);
    }
    // The new rows at positions len, len + 1, ...; keys are cached rotated.
    q = agi_pos_rotate(tp, &pos, q, h, c->len);
    k = agi_pos_rotate(tp, &pos, k, m->cfg.num_kv_heads, c->len);
    if (!q || !k || !v) return NULL;
    ao.softmax.pos = agi_pos_terms(&pos, m->pos_table);
    ag_tensor *ctx;  // [B,n,I]
    if (c->window) {  // the positions the new rows can see, gathered, then the new rows
        const int seen = c->len < c->window - 1 ? c->len : c->window - 1;
        ag_tensor *kw = agi_kv_cache_window(tp, c, c->k, k, seen);
        ag_tensor *vw = agi_kv_cache_window(tp, c, c->v, v, seen);
        agi_kv_cache_append(c, m, k, v);
        ao.softmax.q_offset = seen;
        ctx = ag_attention(tp, q, kw, vw, &ao);
    } else {
        agi_kv_cache_append(c, m, k, v);
        ao.softmax.q_offset = c->extra + c->len;  // the rows before the new ones
        ao.kv_len = c->extra + c->len + n;
        ctx = ag_attention(tp, q, agi_kv_cache_rows(tp, c->k, B), agi_kv_cache_rows(tp, c->v, B),
                           &ao);
    }
    if (!ctx) return NULL;
    c->len += n;
    return ag_linear_layer_forward(tp, &m->out_proj, ctx);  // [B,n,E]
}

bool agi_mha_project_memory(ag_tape *tp, const ag_mha *m, ag_tensor *memory, ag_tensor **k,
                            ag_tensor **v) {
    *k = project(tp, m, 1, memory, m->k_proj_weight);  // [B,S,I]
    *v = project(tp, m, 2, memory, m->v_proj_weight);
    return *k && *v;
}

ag_tensor *agi_mha_forward_memory(ag_tape *tp, const ag_mha *m, ag_kv_cache *c,
                                  const agi_memory_rows *r, ag_tensor *x) {
    const int E = m->cfg.embed_dim, I = m->cfg.num_heads * m->head_dim;
    if (!c || !c->memory || c->version != m->version || !x || x->dtype != c->dt ||
        x->ndim != 3 || x->shape[2] != E || r->groups < 1 || r->groups > c->batch) {
        ag_error("mha_forward_memory: x %s against a memory cache of module version %llu "
                 "(the module's: %llu), %d live inputs of %d",
                 x ? agi_shape(x) : "NULL", c ? (unsigned long long)c->version : 0ULL,
                 (unsigned long long)m->version, r->groups, c ? c->batch : 0);
        return NULL;
    }
    const int rows = x->shape[0], n = x->shape[1];
    const ag_mha_opts eval = {.mask_polarity = c->polarity};
    ag_attention_opts ao = describe(m, &eval);
    ao.kv_len = c->len;
    ag_tensor *q = project(tp, m, 0, x, m->q_proj_weight);  // [rows,n,I]
    if (!q) return NULL;
    // Rows of one input read the same keys, and no query sees another (no causality over
    // memory): the g rows of n positions of an input are g * n queries of one sequence.
    bool equal = true;
    for (int g = 1; g < r->groups; g++) equal &= r->rows[g] == r->rows[0];
    ag_tensor *ctx;
    if (equal) {
        const int G = r->groups;
        q = ag_reshape(tp, q, 3, (int[]){G, rows / G * n, I});
        ao.softmax.key_padding_mask =
            c->key_padding ? agi_kv_cache_rows(tp, c->key_padding, G) : NULL;
        ctx = ag_attention(tp, q, agi_kv_cache_rows(tp, c->k, G),
                           agi_kv_cache_rows(tp, c->v, G), &ao);
        ctx = ag_reshape(tp, ctx, 3, (int[]){rows, n, I});
    } else {  // one input at a time, each into its rows of ctx
        ctx = ag_tape_tensor(tp, x->dtype, 3, (int[]){rows, n, I});
        const size_t row_bytes = (size_t)n * I * ag_dtype_size(x->dtype);
        for (int g = 0, r0 = 0; g < r->groups && ctx; r0 += r->rows[g++]) {
            ag_tensor *qg = ag_reshape(tp, agi_rows_view(tp, q, r0, r->rows[g]), 3,
                                       (int[]){1, r->rows[g] * n, I});
            ao.softmax.key_padding_mask =
                c->key_padding ? agi_rows_view(tp, c->key_padding, g, 1) : NULL;
            ag_tensor *y = ag_attention(tp, qg, agi_rows_view(tp, c->k, g, 1),
                                        agi_rows_view(tp, c->v, g, 1), &ao);
            if (!y) return NULL;
            memcpy((char *)ctx->data + (size_t)r0 * row_bytes, y->data,
                   (size_t)r->rows[g] * row_bytes);
        }
    }
    if (!ctx) return NULL;
    return ag_linear_layer_forward(tp, &m->out_proj, ctx);  // [rows,n,E]
}
