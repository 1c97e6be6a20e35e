// Decoding an encoder-decoder with ag_search: a step embeds each live hypothesis's last
// token at its position, runs the decoder's cached step and the head; beams reorder the
// decoder's caches. Everything is made once per call.
#include <stdlib.h>

#include "nn.h"

typedef struct decoding {
    const ag_seq2seq *m;
    ag_decoder_cache *cache;
    ag_tape *tp;
    int32_t *last;  // [rows]: each live hypothesis's last token
} decoding;

static ag_tensor *embed(ag_tape *tp, const ag_seq2seq *m, const int32_t *tokens, int n,
                        int pos) {
    if (m->embed_fn) return m->embed_fn(tp, m->model, tokens, n, pos);
    ag_tensor *x = ag_embedding(tp, m->wte, tokens, 1, (int[]){n});  // [n, E]
    return m->wpe ? ag_add(tp, x, ag_slice(tp, m->wpe, 0, pos, 1)) : x;
}

static ag_tensor *step(void *user, const ag_search_hyps *h) {
    decoding *d = user;
    const ag_seq2seq *m = d->m;
    ag_tape_reset(d->tp);
    for (int i = 0; i < h->n; i++) d->last[i] = h->tokens[(size_t)i * h->stride + h->len - 1];
    ag_tensor *x = embed(d->tp, m, d->last, h->n, h->len - 1);
    ag_tensor *y = x ? ag_transformer_decoder_forward_cached(d->tp, m->decoder, d->cache, x,
                                                             h->source)
                     : NULL;
    if (!y) return NULL;
    y = ag_reshape(d->tp, y, 2, (int[]){h->n, y->shape[2]});  // [n, E]
    return m->head_fn ? m->head_fn(d->tp, m->model, y)
                      : ag_linear(d->tp, y, m->head, m->head_bias);
}

static bool reorder(void *user, const int *from, int n) {
    return ag_decoder_cache_reorder(((decoding *)user)->cache, from, n);
}

// The built-in ends, checked before decoding starts, so that an end the decoding cannot
// use fails now with one line naming it, not at the step that first reads it (in a line
// naming an op inside): each table is [rows, E] in the decoder's dtype and d_model, the
// head's bias [V]; every token the head draws is fed back through wte, and the last step
// embeds position max_new_tokens - 1.
static bool check_tables(const ag_seq2seq *m, int vocab, int max_new_tokens) {
    const ag_decoder_layer *l0 = &m->decoder->layers[0];
    if (!l0->self_attn.out_proj.weight) {
        ag_error("seq2seq_generate: the decoder's layer 0 is not made (no "
                 "self_attn.out_proj.weight: its init failed or was not called)");
        return false;
    }
    const ag_dtype dt = l0->self_attn.out_proj.weight->dtype;
    const int E = l0->cfg.d_model;
    const ag_tensor *tables[3] = {m->embed_fn ? NULL : m->wte, m->embed_fn ? NULL : m->wpe,
                                  m->head_fn ? NULL : m->head};
    const char *names[3] = {"wte", "wpe", "head"};
    for (int i = 0; i < 3; i++) {
        const ag_tensor *t = tables[i];
        if (t && (t->ndim != 2 || t->shape[1] != E || t->dtype != dt)) {
            ag_error("seq2seq_generate: %s %s %s must be a table %s [rows, %d] (the decoder's "
                     "dtype and d_model)",
                     names[i], ag_dtype_name(t->dtype), agi_shape(t), ag_dtype_name(dt), E);
            return false;
        }
    }
    const ag_tensor *bias = m->head_fn ? NULL : m->head_bias;
    if (bias && (bias->ndim != 1 || bias->shape[0] != vocab || bias->dtype != dt)) {
        ag_error("seq2seq_generate: head_bias %s %s must be %s [%d], as head %s",
                 ag_dtype_name(bias->dtype), agi_shape(bias), ag_dtype_name(dt), vocab,
                 agi_shape(m->head));
        return false;
    }
    if (m->embed_fn) return true;
    if (vocab > m->wte->shape[0]) {
        ag_error("seq2seq_generate: head %s draws tokens up to %d, but wte %s has %d rows",
                 agi_shape(m->head), vocab - 1, agi_shape(m->wte), m->wte->shape[0]);
        return false;
    }
    if (m->wpe && m->wpe->shape[0] < max_new_tokens) {
        ag_error("seq2seq_generate: wpe %s has %d rows, fewer than the %d positions of "
                 "max_new_tokens",
                 agi_shape(m->wpe), m->wpe->shape[0], max_new_tokens);
        return false;
    }
    return true;
}

bool ag_seq2seq_generate(const ag_seq2seq *m, ag_tensor *memory,
                         const ag_tensor *memory_key_padding_mask, ag_mask_polarity polarity,
                         const ag_search_config *cfg, int32_t start_token, int32_t *out,
                         int *lengths, double *scores) {
    // The vocabulary: the head's rows, or wte's with a head of one's own.
    const ag_tensor *rows = m ? (m->head ? m->head : m->wte) : NULL;
    if (!m || !m->decoder || !m->decoder->layers || !(m->wte || m->embed_fn) ||
        !(m->head || m->head_fn) || !rows || rows->ndim != 2 || !cfg || !memory ||
        memory->ndim != 3) {
        ag_error("seq2seq_generate: needs a decoder, wte or embed_fn, head or head_fn (head "
                 "or wte giving the vocabulary), a search config and memory [B, S, E]; got "
                 "memory %s",
                 memory ? agi_shape(memory) : "NULL");
        return false;
    }
    const int B = memory->shape[0], beams = cfg->num_beams > 1 ? cfg->num_beams : 1;
    const int vocab = rows->shape[0];
    // The search's configuration first: a bad one is reported once, by the search.
    ag_search *s = ag_search_new(B, vocab, 1, cfg);
    if (!s || !check_tables(m, vocab, cfg->max_new_tokens)) {
        ag_search_free(s);
        return false;
    }
    decoding d = {.m = m,
                  .cache = ag_decoder_cache_new(m->decoder, B, beams, cfg->max_new_tokens,
                                                memory->shape[1]),
                  .tp = ag_tape_new(),
                  .last = agi_calloc((size_t)B * beams * sizeof(int32_t))};
    ag_tape_set_grad_enabled(d.tp, false);
    int32_t *start = agi_calloc((size_t)B * sizeof *start);
    for (int b = 0; b < B; b++) start[b] = start_token;
    const bool ok = d.cache &&
                    ag_decoder_cache_set_memory(d.cache, memory, memory_key_padding_mask,
                                                polarity) &&
                    ag_search_run(s, &(ag_search_model){step, reorder, &d}, start, out, lengths,
                                  scores);
    ag_search_free(s);
    ag_decoder_cache_free(d.cache);
    ag_tape_free(d.tp);
    agi_free(d.last);
    agi_free(start);
    return ok;
}
