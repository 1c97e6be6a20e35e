// Generation from a decoder-only model: the prompt, then token after token, each
// position run once through the blocks against their KV caches (the prompt, and a
// restarted window, as one step of several positions), with the context window started
// again from its second half when it is full, unless the blocks slide.
//
// Window: win[0 .. len) are the tokens whose keys and values the caches hold, at
// positions 0 .. len - 1. A new token goes to position len; at len == context the
// caches are reset and refilled with the last (context + 1) / 2 - 1 tokens, then the
// new one: what a full recomputation over that shorter window would compute.
// Blocks that attend through a sliding window and carry their positions in the attention
// (a scheme, no wpe) never need that: their caches are rings of the window's rows, and a
// position beyond the context is as good as any, so the window slides one token a step,
// exactly the whole forward over everything generated.
//
// Under autocast (ag_generator_set_autocast) the tape carries a table of bf16 copies of
// the weights (kernels/bf16_weights.h), which the linear layers of a step with one
// position read (ops/linear.c). Each copy is made at its first use, and the table's
// copies expire as a generation starts: the parameters may have changed since the last
// one (training between samples), not within one, and nothing tells the library that they
// did (they can be written through ag_tensor_f32 or ag_params_data). An expired copy is
// checked against its weights in the pass of its first product (written only where they
// changed), which reads them as making it would, but not the copy a second time.
#include <stdatomic.h>
#include <string.h>

#include "../kernels/bf16_weights.h"
#include "attograd/generate.h"
#include "nn.h"

struct ag_generator {
    ag_decoder d;
    ag_kv_cache **cache;  // [layers]
    ag_tape *tp;          // the callbacks' ops, grad disabled
    ag_tensor *x;         // [1, E]: one position's activations
    int32_t *win;         // [context]
    int len;
    bool slides;          // every block windowed, positions inside attention: no restart
    agi_bf16_weights *bf16;  // the weights' copies under autocast, or NULL
    // A generation is running: one started from its emit or a callback (or from another
    // thread meanwhile) would reset the caches and window it is reading, and free would
    // take them from under it.
    atomic_bool running;
};

void ag_generator_free(ag_generator *g) {
    if (!g) return;
    if (atomic_load(&g->running)) {
        ag_error("generator_free: the generator is generating (called from its emit or a "
                 "callback): not freed; free it after ag_generate returns");
        return;
    }
    for (int l = 0; g->cache && l < g->d.layers; l++) ag_kv_cache_free(g->cache[l]);
    agi_free(g->cache);
    ag_tape_free(g->tp);
    agi_bf16_weights_free(g->bf16);
    ag_tensor_free(g->x);
    agi_free(g->win);
    agi_free(g);
}

// A table of the GPT-2 ends: `dt` [rows, E] with at least `min_rows` rows.
static bool check_table(const char *name, const ag_tensor *t, int min_rows, ag_dtype dt,
                        int E) {
    if (t->dtype != dt || t->ndim != 2 || t->shape[1] != E) {
        ag_error("generator: %s is %s %s; the blocks need %s [%s, %d] (d_model %d)", name,
                 ag_dtype_name(t->dtype), agi_shape(t), ag_dtype_name(dt),
                 strcmp(name, "wpe") == 0 ? "context" : "V", E, E);
        return false;
    }
    if (t->shape[0] < min_rows) {
        ag_error("generator: %s %s has %d rows, fewer than the %d it needs", name, agi_shape(t),
                 t->shape[0], min_rows);
        return false;
    }
    return true;
}

// Everything a generation will use, checked now: a decoder that passes never fails
// mid-generation for its shape (only a callback or the logits can then fail).
static bool check_decoder(const ag_decoder *d) {
    if (!d || !d->blocks || d->layers < 1 || d->context < 1 || !(d->wte || d->embed_fn) ||
        !(d->head || d->head_fn)) {
        ag_error("generator: needs blocks (layers >= 1), context >= 1, "
                 "wte or embed_fn, head or head_fn; got layers %d, context %d",
                 d ? d->layers : 0, d ? d->context : 0);
        return false;
    }
    for (int l = 0; l < d->layers; l++) {
        if (!d->blocks[l].self_attn.out_proj.weight) {
            ag_error("generator: block %d is not made (no self_attn.out_proj.weight: its init "
                     "failed or was not called)",
                     l);
            return false;
        }
    }
    const ag_block *b0 = &d->blocks[0];
    const ag_dtype dt = b0->self_attn.out_proj.weight->dtype;
    const int E = b0->cfg.d_model;
    for (int l = 0; l < d->layers; l++) {
        const ag_block *b = &d->blocks[l];
        const ag_tensor *w = b->self_attn.out_proj.weight;
        if (w->dtype != dt || b->cfg.d_model != E) {
            ag_error("generator: block %d is %s d_model %d; block 0 is %s d_model %d", l,
                     ag_dtype_name(w->dtype), b->cfg.d_model, ag_dtype_name(dt), E);
            return false;
        }
    }
    if (!d->embed_fn) {
        if (!check_table("wte", d->wte, 1, dt, E)) return false;
        if (d->wpe && !check_table("wpe", d->wpe, d->context, dt, E)) return false;
    }
    if (!d->head_fn) {
        // Every token the head can draw is fed back through wte.
        int vocab = !d->embed_fn ? d->wte->shape[0] : 1;
        if (!check_table("head", d->head, 1, dt, E)) return false;
        if (!d->embed_fn && d->head->shape[0] > vocab) {
            ag_error("generator: head %s draws tokens up to %d, but wte %s has %d rows",
                     agi_shape(d->head), d->head->shape[0] - 1, agi_shape(d->wte), vocab);
            return false;
        }
        const ag_tensor *ln[2] = {d->ln_f ? d->ln_f->weight : NULL,
                                  d->ln_f ? d->ln_f->bias : NULL};
        for (int i = 0; i < 2; i++) {
            if (ln[i] && (ln[i]->dtype != dt || ln[i]->ndim != 1 || ln[i]->shape[0] != E)) {
                ag_error("generator: ln_f.%s is %s %s; the blocks need %s [%d]",
                         i ? "bias" : "weight", ag_dtype_name(ln[i]->dtype), agi_shape(ln[i]),
                         ag_dtype_name(dt), E);
                return false;
            }
        }
    }
    return true;
}

ag_generator *ag_generator_new(const ag_decoder *d) {
    if (!check_decoder(d)) return NULL;
    ag_generator *g = agi_calloc(sizeof *g);
    atomic_init(&g->running, false);
    g->d = *d;
    g->cache = agi_calloc((size_t)d->layers * sizeof *g->cache);
    for (int l = 0; l < d->layers; l++)
        if (!(g->cache[l] = ag_kv_cache_new_block(&d->blocks[l], 1, d->context)))
            return ag_generator_free(g), NULL;
    g->tp = ag_tape_new();
    ag_tape_set_grad_enabled(g->tp, false);
    g->x = ag_tensor_zeros(d->blocks[0].self_attn.out_proj.weight->dtype, 2,
                         (int[]){1, d->blocks[0].cfg.d_model});
    g->win = agi_calloc((size_t)d->context * sizeof *g->win);
    g->slides = !d->wpe;
    for (int l = 0; l < d->layers; l++) {
        const ag_block_config *c = &d->blocks[l].cfg;
        g->slides = g->slides && c->window > 0 && c->pos != AG_POS_NONE;
    }
    return g;
}

ag_autocast ag_generator_set_autocast(ag_generator *g, ag_autocast mode) {
    if (!agi_given(g, "generator_set_autocast", "generator")) return AG_AUTOCAST_OFF;
    const ag_autocast old = ag_tape_set_autocast(g->tp, mode);
    if (ag_tape_autocast(g->tp) == AG_AUTOCAST_BF16 && !g->bf16) {
        g->bf16 = agi_bf16_weights_new();
        agi_tape_set_bf16_weights(g->tp, g->bf16);
    }
    return old;
}

ag_autocast ag_generator_autocast(const ag_generator *g) {
    return g ? ag_tape_autocast(g->tp) : AG_AUTOCAST_OFF;
}

// GPT-2's ends.
static ag_tensor *embed(ag_tape *tp, const ag_decoder *d, int32_t token, int pos) {
    if (d->embed_fn) return d->embed_fn(tp, d->model, token, pos);
    ag_tensor *x = ag_embedding(tp, d->wte, &token, 1, (int[]){1});
    return d->wpe ? ag_add(tp, x, ag_slice(tp, d->wpe, 0, pos, 1)) : x;
}

static ag_tensor *head(ag_tape *tp, const ag_decoder *d, ag_tensor *x) {
    if (d->head_fn) return d->head_fn(tp, d->model, x);
    if (d->ln_f) x = ag_layernorm_layer_forward(tp, d->ln_f, x);
    return ag_linear(tp, x, d->head, NULL);
}

// Runs tokens[0 .. n) at positions g->len .. through the blocks, all n as one cached step
// of each block (the prompt, or a restarted window, in one go): g->x = the last position's
// output of the last block. tokens may point into g->win.
static bool feed(ag_generator *g, const int32_t *tokens, int n) {
    ag_tape_reset(g->tp);
    const int E = g->x->shape[1];
    const size_t row = (size_t)E * agi_dtype_size(g->x->dtype);
    ag_tensor *x = ag_tape_tensor(g->tp, g->x->dtype, 3, (int[]){1, n, E});
    for (int i = 0; x && i < n; i++) {
        const ag_tensor *e = embed(g->tp, &g->d, tokens[i], g->len + i);
        if (!e) return false;
        if (e->dtype != g->x->dtype || e->numel != (size_t)E) {
            ag_error("generate: embed gave %s %s for token %d, expected %s [1,%d]",
                     ag_dtype_name(e->dtype), agi_shape(e), (int)tokens[i],
                     ag_dtype_name(g->x->dtype), E);
            return false;
        }
        memcpy((char *)x->data + (size_t)i * row, e->data, row);
    }
    for (int l = 0; l < g->d.layers && x; l++)
        x = agi_block_forward_cached(g->tp, &g->d.blocks[l], g->cache[l], x);
    if (!x) return false;
    memcpy(g->x->data, (char *)x->data + (size_t)(n - 1) * row, row);
    if (!g->slides) memmove(g->win + g->len, tokens, (size_t)n * sizeof *tokens);
    g->len += n;
    return true;
}

// Feeds one drawn token; when the context is full, the window starts again from its last
// (context + 1) / 2 tokens, the new one included, fed as one step.
static bool push(ag_generator *g, int32_t token) {
    const int ctx = g->d.context;
    if (g->len < ctx || g->slides) return feed(g, &token, 1);
    const int keep = (ctx + 1) / 2 - 1;  // and the new token: (ctx + 1) / 2
    memmove(g->win, g->win + ctx - keep, (size_t)keep * sizeof *g->win);
    g->win[keep] = token;
    for (int l = 0; l < g->d.layers; l++) ag_kv_cache_reset(g->cache[l]);
    g->len = 0;
    return feed(g, g->win, keep + 1);
}

static int generate(ag_generator *g, const int32_t *prompt, int n_prompt, int n,
                    ag_sampler *s, int32_t *out, void (*emit)(int32_t token, void *user),
                    void *user) {
    // A token the built-in input cannot embed is refused here, once, before any step; the
    // generator's own draws are in range (ag_generator_new checked head against wte).
    for (int i = 0; !g->d.embed_fn && i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= g->d.wte->shape[0]) {
            ag_error("generate: prompt token %d at %d is outside [0, %d) (wte %s)",
                     (int)prompt[i], i, g->d.wte->shape[0], agi_shape(g->d.wte));
            return 0;
        }
    }
    // Its caches are its own: the cache's "make a new cache" would name what the caller
    // never made.
    for (int l = 0; l < g->d.layers; l++) {
        if (!agi_kv_cache_current(g->cache[l], &g->d.blocks[l].self_attn)) {
            ag_error("generate: block %d changed since the generator was made (heads pruned, "
                     "or made again): make a new generator", l);
            return 0;
        }
    }
    for (int l = 0; l < g->d.layers; l++) ag_kv_cache_reset(g->cache[l]);
    g->len = 0;
    agi_bf16_weights_expire(g->bf16);
    const int first = n_prompt > g->d.context ? n_prompt - g->d.context : 0;
    if (!feed(g, prompt + first, n_prompt - first)) return 0;
    for (int k = 0; k < n; k++) {
        const ag_tensor *logits = head(g->tp, &g->d, g->x);
        const int next = logits ? ag_sampler_next(s, logits, 0) : -1;
        if (next < 0) return k;
        if (out) out[k] = next;
        if (emit) emit(next, user);
        if (k + 1 < n && !push(g, next)) return k + 1;
    }
    return n;
}

int ag_generate(ag_generator *g, const int32_t *prompt, int n_prompt, int n, ag_sampler *s,
                int32_t *out, void (*emit)(int32_t token, void *user), void *user) {
    if (n_prompt > 0 && !prompt) {
        ag_error("generate: the prompt is NULL (n_prompt %d)", n_prompt);
        return 0;
    }
    if (!g || n_prompt < 1 || n < 0 || !s) {
        ag_error("generate: needs a generator, a prompt of >= 1 tokens, n >= 0 and a sampler; "
                 "got %d prompt tokens, n %d", n_prompt, n);
        return 0;
    }
    if (atomic_exchange(&g->running, true)) {
        ag_error("generate: the generator is already generating (called from its emit or a "
                 "callback, or from another thread): one generation at a time");
        return 0;
    }
    const int drawn = generate(g, prompt, n_prompt, n, s, out, emit, user);
    atomic_store(&g->running, false);
    return drawn;
}
