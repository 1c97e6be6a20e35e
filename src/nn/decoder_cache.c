// The caches of an encoder-decoder's decoder: per layer, a self-attention KV cache with a
// row for every hypothesis (batch * beams), and a memory cache with a row for every input,
// its keys and values projected once from the encoder's memory.
//
// A step's rows are grouped by input, in input order. Inputs only ever finish, so the
// inputs of a step are a subsequence of those of the step before; when they are fewer,
// the memory rows of the inputs still decoding move to the front (rows [0, G) of a memory
// cache are the G live inputs, in order), once per finished input, not per token.
#include <string.h>

#include "nn.h"

struct ag_decoder_cache {
    const ag_transformer_decoder *d;
    int batch, beams, max_len, max_src;
    int layers;                    // d's, kept: the cache may be freed after the decoder
    ag_kv_cache **self, **memory;  // [layers] each
    int *live, n_live;             // the inputs rows [0, n_live) of the memory caches hold
    int *keep, *group_rows;        // [batch]: a step's scratch
    ag_tape *tp;                   // set_memory's projections, grad disabled
};

void ag_decoder_cache_free(ag_decoder_cache *c) {
    if (!c) return;
    for (int l = 0; l < c->layers; l++) {
        if (c->self) ag_kv_cache_free(c->self[l]);
        if (c->memory) ag_kv_cache_free(c->memory[l]);
    }
    agi_free(c->self);
    agi_free(c->memory);
    agi_free(c->live);
    agi_free(c->keep);
    agi_free(c->group_rows);
    ag_tape_free(c->tp);
    agi_free(c);
}

ag_decoder_cache *ag_decoder_cache_new(const ag_transformer_decoder *d, int batch, int beams,
                                       int max_len, int max_src) {
    size_t rows;
    if (!d || d->num_layers < 1 || !d->layers || batch < 1 || beams < 1 || max_len < 1 ||
        max_src < 1 || !agi_size_mul((size_t)batch, (size_t)beams, &rows) ||
        rows > (size_t)INT32_MAX) {
        ag_error("decoder_cache: needs a decoder with layers, batch, beams, max_len and "
                 "max_src >= 1 (batch * beams an int); got batch %d, beams %d, max_len %d, "
                 "max_src %d",
                 batch, beams, max_len, max_src);
        return NULL;
    }
    ag_decoder_cache *c = agi_calloc(sizeof *c);
    *c = (ag_decoder_cache){.d = d, .batch = batch, .beams = beams, .max_len = max_len,
                            .max_src = max_src, .layers = d->num_layers};
    const int L = d->num_layers;
    c->self = agi_calloc((size_t)L * sizeof *c->self);
    c->memory = agi_calloc((size_t)L * sizeof *c->memory);
    c->live = agi_calloc((size_t)batch * sizeof *c->live);
    c->keep = agi_calloc((size_t)batch * sizeof *c->keep);
    c->group_rows = agi_calloc((size_t)batch * sizeof *c->group_rows);
    for (int l = 0; l < L; l++) {
        const ag_decoder_layer *layer = &d->layers[l];
        c->self[l] = agi_kv_cache_new_for(&layer->self_attn, layer, (int)rows, max_len,
                                          layer->cfg.dim_feedforward);
        if (!c->self[l]) return ag_decoder_cache_free(c), NULL;
        c->memory[l] = agi_kv_cache_new_memory(&layer->multihead_attn, layer, batch, max_src);
        if (!c->memory[l] || (beams > 1 && !agi_kv_cache_reserve_reorder(c->self[l])))
            return ag_decoder_cache_free(c), NULL;
    }
    c->tp = ag_tape_new();
    ag_tape_set_grad_enabled(c->tp, false);
    return c;
}

// The decoder is still the one the caches were made for: as many layers, each with the
// attention modules they were made for, at the versions they had (ag_mha.version). The
// calls below walk the decoder's layers and index the caches by them, and copy
// projections the width of its modules into buffers the width they had: a decoder made
// again with more layers, freed (zeroed: no layers), or with heads pruned would have them
// read and write past the caches, or through a NULL layer array.
static bool same_decoder(const char *fn, const ag_decoder_cache *c,
                         const ag_transformer_decoder *d) {
    bool same = d->layers && d->num_layers == c->layers;
    for (int l = 0; same && l < c->layers; l++) {
        const ag_decoder_layer *layer = &d->layers[l];
        same = c->self[l]->owner == layer && c->memory[l]->owner == layer &&
               agi_kv_cache_current(c->self[l], &layer->self_attn) &&
               agi_kv_cache_current(c->memory[l], &layer->multihead_attn);
    }
    if (!same)
        ag_error("%s: the decoder changed since the cache was made (%d layer%s then, %d now; "
                 "layers made again, freed, or heads pruned): make a new cache",
                 fn, c->layers, c->layers == 1 ? "" : "s", d->layers ? d->num_layers : 0);
    return same;
}

bool ag_decoder_cache_set_memory(ag_decoder_cache *c, ag_tensor *memory,
                                 const ag_tensor *memory_key_padding_mask,
                                 ag_mask_polarity polarity) {
    if (!agi_given(c, "decoder_cache_set_memory", "cache")) return false;
    if (!same_decoder("decoder_cache_set_memory", c, c->d)) return false;
    if (!memory || memory->ndim != 3 || memory->shape[0] > c->batch ||
        memory->shape[1] > c->max_src ||
        memory->shape[2] != c->d->layers[0].multihead_attn.cfg.kdim ||
        memory->dtype != c->memory[0]->dt) {
        ag_error("decoder_cache_set_memory: memory %s must be %s [B, S, %d] with B <= %d and "
                 "S <= %d",
                 agi_dtype_shape(memory), ag_dtype_name(c->memory[0]->dt),
                 c->d->layers[0].multihead_attn.cfg.kdim, c->batch, c->max_src);
        return false;
    }
    const ag_tensor *kpm = memory_key_padding_mask;
    if (kpm && (kpm->dtype != AG_BOOL || kpm->ndim != 2 || kpm->shape[0] != memory->shape[0] ||
                kpm->shape[1] != memory->shape[1])) {
        ag_error("decoder_cache_set_memory: memory_key_padding_mask %s must be bool [%d,%d]",
                 agi_dtype_shape(kpm), memory->shape[0], memory->shape[1]);
        return false;
    }
    if (polarity != AG_MASK_BLOCKS && polarity != AG_MASK_KEEPS) {  // else every step fails
        ag_error("decoder_cache_set_memory: unknown mask polarity %d (AG_MASK_BLOCKS or "
                 "AG_MASK_KEEPS), memory %s",
                 (int)polarity, agi_shape(memory));
        return false;
    }
    for (int l = 0; l < c->layers; l++) {
        ag_tape_reset(c->tp);
        ag_tensor *k, *v;
        if (!agi_mha_project_memory(c->tp, &c->d->layers[l].multihead_attn, memory, &k, &v))
            return false;
        agi_kv_cache_set_memory(c->memory[l], k, v, kpm, polarity);
        ag_kv_cache_reset(c->self[l]);
    }
    c->n_live = memory->shape[0];
    for (int b = 0; b < c->n_live; b++) c->live[b] = b;
    return true;
}

// The step's groups of rows by input (into c->group_rows), and the memory rows moved
// when inputs have finished since the last step. False after reporting rows that are not
// grouped by input in order, an input that had finished, or too many rows for an input.
static bool group_rows(ag_decoder_cache *c, const int *source, int rows, int *groups) {
    int g = 0, at = 0;  // at: where in c->live the next input is looked for
    bool ok = true;
    for (int i = 0; ok && i < rows; i++) {
        if (i > 0 && source[i] == source[i - 1]) {
            ok = ++c->group_rows[g - 1] <= c->beams;
            continue;
        }
        while (at < c->n_live && c->live[at] != source[i]) at++;
        if ((ok = at < c->n_live)) {
            c->keep[g] = at++;
            c->group_rows[g++] = 1;
        }
    }
    if (!ok) {
        ag_error("decoder_forward_cached: the rows' inputs must be grouped in input order, at "
                 "most %d rows an input, among the %d inputs still decoding",
                 c->beams, c->n_live);
        return false;
    }
    if (g < c->n_live) {
        for (int l = 0; l < c->layers; l++)
            agi_kv_cache_keep_memory(c->memory[l], c->keep, g);
        for (int i = 0; i < g; i++) c->live[i] = c->live[c->keep[i]];
        c->n_live = g;
    }
    *groups = g;
    return true;
}

ag_tensor *ag_transformer_decoder_forward_cached(ag_tape *tp, const ag_transformer_decoder *d,
                                                 ag_decoder_cache *c, ag_tensor *x,
                                                 const int *source) {
    if (!agi_given(tp, "decoder_forward_cached", "tape") ||
        !agi_given(c, "decoder_forward_cached", "cache"))
        return NULL;
    if (c->d != d || !x || !source || (x->ndim != 2 && x->ndim != 3) ||
        x->shape[0] > c->batch * c->beams) {
        ag_error("decoder_forward_cached: needs the decoder's cache, x [rows, E] or "
                 "[rows, n, E] with rows <= %d, and the rows' inputs; got x %s",
                 c->batch * c->beams, x ? agi_shape(x) : "NULL");
        return NULL;
    }
    if (!same_decoder("decoder_forward_cached", c, d)) return NULL;
    if (ag_tape_grad_enabled(tp)) {
        ag_error("decoder_forward_cached: the tape must have grad disabled (a cached step has "
                 "no backward)");
        return NULL;
    }
    if (c->n_live == 0) {
        ag_error("decoder_forward_cached: no memory: call ag_decoder_cache_set_memory first");
        return NULL;
    }
    // x and the room left, checked here against layer 0's cache (every layer's holds the
    // same positions) before anything moves: else a pre-LN layer's LayerNorm reported a
    // bad x and its attention a second line, and a full cache was named an MHA's.
    int n;
    if (!agi_kv_cache_check("decoder_forward_cached", c->self[0], &d->layers[0],
                            &d->layers[0].self_attn, x, &n))
        return NULL;
    int groups;
    if (!group_rows(c, source, x->shape[0], &groups)) return NULL;
    const agi_memory_rows r = {groups, c->group_rows};
    if (x->ndim == 2) x = ag_reshape(tp, x, 3, (int[]){x->shape[0], 1, x->shape[1]});
    for (int l = 0; l < d->num_layers && x; l++)
        x = agi_decoder_layer_forward_cached(tp, &d->layers[l], c->self[l], c->memory[l], &r,
                                             x);
    return x ? ag_layernorm_layer_forward(tp, &d->norm, x) : NULL;
}

bool ag_decoder_cache_reorder(ag_decoder_cache *c, const int *from, int n) {
    if (!agi_given(c, "decoder_cache_reorder", "cache") ||
        !same_decoder("decoder_cache_reorder", c, c->d))
        return false;
    for (int l = 0; l < c->layers; l++)
        if (!ag_kv_cache_reorder(c->self[l], from, n)) return false;
    return true;
}
