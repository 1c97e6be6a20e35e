// Cached decoding (attograd/generate.h): the decoder of an encoder-decoder one position at a
// time against its caches (the memory projected once, the self-attention cached), and a
// decoder-only model under beam search with ag_kv_cache_reorder. Each equals running the
// whole decoder on the prefix, at every step, to 1e-12 in float64, for greedy and beam
// search; a step allocates nothing; misuse is reported.
#include <stdlib.h>

#include "testing.h"

enum { V = 7, E = 8, H = 2, FF = 12, LAYERS = 2, B = 3, S = 5, MAX_LEN = 9, BEAMS = 3 };
enum { END = 0, START = 1 };

// A toy encoder-decoder: token and position tables, a decoder stack and a head, reading
// a fixed memory per input (any tensor would do: the encoder is not what is cached).
typedef struct toy {
    ag_params *ps;
    ag_transformer_decoder d;
    ag_tensor *emb, *pos, *head;  // [V, E], [MAX_LEN, E], [V, E]
    ag_tensor *memory, *kpm;      // [B, S, E] and bool [B, S]: the inputs, some padded
    ag_tensor *memory_of[B], *kpm_of[B];  // each input's alone, [1, S, E] and [1, S]
    ag_decoder_cache *cache;
    ag_tape *tp;        // the cached steps
    ag_tape *full_tp;   // the recomputations
    double worst;       // the largest difference between the two, over every step
    int steps;
    uint64_t allocs[32];  // the allocation count at each cached step
    bool recompute;       // the step returns the recomputation's scores
    bool cached_only;     // the step does not recompute (to count its allocations)
    bool plain_end;       // the end token's score is the model's alone
} toy;

// kv_heads: the layers' num_kv_heads (0: H; 1: multi-query self- and cross-attention);
// window: their self-attention's sliding window (0: none).
static void toy_init(toy *t, bool norm_first, ag_activation act, int kv_heads, int window) {
    memset(t, 0, sizeof *t);
    t->ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(23, 1);
    ag_block_config cfg = {.d_model = E, .num_heads = H, .dim_feedforward = FF,
                           .norm_first = norm_first, .activation = act,
                           .num_kv_heads = kv_heads, .window = window};
    CHECK(ag_transformer_decoder_init(&t->d, t->ps, "decoder", &cfg, LAYERS, &rng));
    t->emb = ag_params_add(t->ps, "emb", 2, (int[]){V, E});
    t->pos = ag_params_add(t->ps, "pos", 2, (int[]){MAX_LEN, E});
    t->head = ag_params_add(t->ps, "head", 2, (int[]){V, E});
    for (int i = 0; i < ag_params_count(t->ps); i++)  // the norms and biases too
        ag_tensor_init_uniform(ag_params_at(t->ps, i), &rng, -1, 1);
    t->memory = ag_tensor_uniform(AG_F64, 3, (int[]){B, S, E}, &rng, -1, 1);
    // Input 0 has 3 memory positions, input 1 all 5, input 2 has 4.
    const uint8_t pad[B * S] = {0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    t->kpm = ag_tensor_from(AG_BOOL, 2, (int[]){B, S}, pad);
    for (int b = 0; b < B; b++) {
        t->memory_of[b] = ag_tensor_from(AG_F64, 3, (int[]){1, S, E},
                                         (double *)t->memory->data + (size_t)b * S * E);
        t->kpm_of[b] = ag_tensor_from(AG_BOOL, 2, (int[]){1, S}, pad + b * S);
    }
    t->cache = ag_decoder_cache_new(&t->d, B, BEAMS, MAX_LEN, S);
    CHECK(t->cache != NULL);
    t->tp = ag_tape_new();
    t->full_tp = ag_tape_new();
    ag_tape_set_grad_enabled(t->tp, false);
    ag_tape_set_grad_enabled(t->full_tp, false);
}

static void toy_free(toy *t) {
    ag_decoder_cache_free(t->cache);
    ag_tape_free(t->tp);
    ag_tape_free(t->full_tp);
    ag_tensor_free(t->memory), ag_tensor_free(t->kpm);
    for (int b = 0; b < B; b++) ag_tensor_free(t->memory_of[b]), ag_tensor_free(t->kpm_of[b]);
    ag_transformer_decoder_free(&t->d);
    ag_params_free(t->ps);
}

// Token embeddings plus positions: x [rows, n, E] for tokens[r * stride + p0 + j].
static ag_tensor *embed(ag_tape *tp, const toy *t, const int32_t *tokens, int rows, int stride,
                        int p0, int n) {
    ag_tensor *x = ag_tape_tensor(tp, AG_F64, 3, (int[]){rows, n, E});
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++)
            for (int e = 0; e < E; e++)
                ((double *)x->data)[((size_t)r * n + j) * E + e] =
                    ag_tensor_item(t->emb, (size_t)tokens[r * stride + p0 + j] * E + e) +
                    ag_tensor_item(t->pos, (size_t)(p0 + j) * E + e);
    return x;
}

// The whole decoder on hypothesis i's prefix, its input's memory alone: the scores of its
// next token, into row i of z [n, V].
static void full_scores(toy *t, const ag_search_hyps *h, int i, ag_tensor *z) {
    ag_tape_reset(t->full_tp);
    const int b = h->source[i];
    ag_tensor *x = embed(t->full_tp, t, h->tokens + (size_t)i * h->stride, 1, 0, 0, h->len);
    ag_transformer_opts o = {.causal = true, .memory_key_padding_mask = t->kpm_of[b]};
    ag_tensor *y = ag_transformer_decoder_forward(t->full_tp, &t->d, x, t->memory_of[b], &o);
    y = ag_slice(t->full_tp, y, 1, h->len - 1, 1);  // the last position
    ag_tensor *logits = ag_linear(t->full_tp, y, t->head, NULL);  // [1, 1, V]
    memcpy((double *)z->data + (size_t)i * V, logits->data, V * sizeof(double));
}

// The search's step: the cached decoder on each hypothesis's last token (all start tokens
// at the first step), checked against the recomputation.
static ag_tensor *toy_step(void *model, const ag_search_hyps *h) {
    toy *t = model;
    if (t->steps < 32) t->allocs[t->steps] = ag_memory_usage().allocations;
    t->steps++;
    ag_tape_reset(t->tp);
    // One start token: each step's new position is each hypothesis's last token.
    ag_tensor *x = embed(t->tp, t, h->tokens, h->n, h->stride, h->len - 1, 1);
    ag_tensor *y = ag_transformer_decoder_forward_cached(t->tp, &t->d, t->cache, x, h->source);
    if (!y) return NULL;
    ag_tensor *z = ag_reshape(t->tp, ag_linear(t->tp, y, t->head, NULL), 2, (int[]){h->n, V});
    if (t->cached_only) return z;
    ag_tensor *full = ag_tape_tensor(t->tp, AG_F64, 2, (int[]){h->n, V});
    for (int i = 0; i < h->n; i++) full_scores(t, h, i, full);
    for (size_t k = 0; k < z->numel; k++)
        t->worst = fmax(t->worst, fabs(ag_tensor_item(z, k) - ag_tensor_item(full, k)));
    // The end token's score grows with the length, so that hypotheses end at various steps.
    for (int i = 0; !t->plain_end && i < h->n; i++) {
        const size_t at = (size_t)i * V + END;
        ag_tensor_set_item(z, at, ag_tensor_item(z, at) - 4 + 0.9 * h->len);
        ag_tensor_set_item(full, at, ag_tensor_item(full, at) - 4 + 0.9 * h->len);
    }
    return t->recompute ? full : z;
}

static bool toy_reorder(void *model, const int *from, int n) {
    return ag_decoder_cache_reorder(((toy *)model)->cache, from, n);
}

// One search of B inputs from the start token, end token END; out [B, MAX_LEN - 1].
static bool toy_search(toy *t, int beams, int end, int32_t *out, int *lengths,
                       double *scores) {
    CHECK(ag_decoder_cache_set_memory(t->cache, t->memory, t->kpm, AG_MASK_BLOCKS));
    t->steps = 0;
    ag_search_config cfg = {.max_new_tokens = MAX_LEN - 1, .end_token = end,
                            .num_beams = beams, .length_penalty = 1};
    ag_search *s = ag_search_new(B, V, 1, &cfg);
    const int32_t start[B] = {START, START, START};
    bool ok = ag_search_run(s, &(ag_search_model){toy_step, toy_reorder, t}, start, out,
                            lengths, scores);
    ag_search_free(s);
    return ok;
}

// Position by position against the whole decoder on the prefix, without a search: every
// row of every step, for post-LN and pre-LN, ReLU and GELU.
static void test_cached_steps_equal_the_whole_decoder_at_every_position(void) {
    for (int v = 0; v < 4; v++) {  // v = 2: multi-query attention; 3: a window of 3
        toy t;
        toy_init(&t, v >= 1, v >= 1 ? AG_ACT_GELU : AG_ACT_RELU, v == 2 ? 1 : 0, v == 3 ? 3 : 0);
        CHECK(ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS));
        int32_t tokens[B * MAX_LEN];
        ag_pcg32 rng = ag_pcg32_make(4, 4);
        for (int i = 0; i < B * MAX_LEN; i++) tokens[i] = (int32_t)ag_pcg32_bounded(&rng, V);
        ag_tensor *x_all = embed(t.full_tp, &t, tokens, B, MAX_LEN, 0, MAX_LEN);
        ag_transformer_opts o = {.causal = true, .memory_key_padding_mask = t.kpm};
        ag_tape *whole = ag_tape_new();
        ag_tape_set_grad_enabled(whole, false);
        ag_tensor *y_all = ag_transformer_decoder_forward(whole, &t.d, x_all, t.memory, &o);
        double worst = 0;
        const int source[B] = {0, 1, 2};
        for (int p = 0; p < MAX_LEN; p++) {
            ag_tape_reset(t.tp);
            ag_tensor *x = embed(t.tp, &t, tokens, B, MAX_LEN, p, 1);
            ag_tensor *y = ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, source);
            for (int b = 0; y && b < B; b++)
                for (int e = 0; e < E; e++)
                    worst = fmax(worst, fabs(ag_tensor_item(y, (size_t)b * E + e) -
                                             ag_tensor_item(y_all, ((size_t)b * MAX_LEN + p) * E + e)));
        }
        CHECK(worst <= 1e-12);
        ag_tape_free(whole);
        toy_free(&t);
    }
}

// Greedy and beam search through the caches: at every step, every live hypothesis's scores
// equal the whole decoder's on its prefix; and a search run on the recomputed scores finds
// the same hypotheses.
static void test_cached_greedy_and_beam_search_equal_recomputation(void) {
    for (int beams = 0; beams <= BEAMS; beams += BEAMS) {
        toy t;
        toy_init(&t, beams > 0, AG_ACT_RELU, 0, 0);
        int32_t out[B * BEAMS * MAX_LEN], again[B * BEAMS * MAX_LEN];
        int len[B * BEAMS], len2[B * BEAMS];
        double sc[B * BEAMS], sc2[B * BEAMS];
        CHECK(toy_search(&t, beams, END, out, len, sc));
        CHECK(t.worst <= 1e-12);
        CHECK(t.steps > 2);
        t.recompute = true;
        CHECK(toy_search(&t, beams, END, again, len2, sc2));
        CHECK(memcmp(out, again, (size_t)B * (MAX_LEN - 1) * sizeof(int32_t)) == 0);
        CHECK(memcmp(len, len2, B * sizeof(int)) == 0);
        for (int b = 0; b < B; b++) CHECK_NEAR(sc[b], sc2[b], 1e-12);
        bool differ = false;  // the inputs' memories lead to different translations
        for (int b = 1; b < B; b++)
            differ |= memcmp(out, out + b * (MAX_LEN - 1), (MAX_LEN - 1) * sizeof(int32_t)) != 0;
        CHECK(differ);
        toy_free(&t);
    }
}

// From the second step on, a cached beam-search step allocates nothing: the caches, the
// search and the tape hold every buffer (no end token: every step runs B * BEAMS rows).
static void test_a_cached_decoding_step_allocates_nothing(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    t.cached_only = true;
    int32_t out[B * (MAX_LEN - 1)];
    int len[B];
    CHECK(toy_search(&t, BEAMS, -1, out, len, NULL));
    CHECK(t.steps == MAX_LEN - 1);
    CHECK(t.allocs[t.steps - 1] == t.allocs[1]);
    toy_free(&t);
}

// A head that records the allocation count at each step, and ends input 0 (row 0 while it
// is live) at step 3: the others run to max_new_tokens, so the search reorders the caches
// once, mid-decoding.
typedef struct counting_head {
    toy *t;
    int steps;
    uint64_t allocs[MAX_LEN];
} counting_head;

static ag_tensor *counting_head_fn(ag_tape *tp, const void *model, ag_tensor *x) {
    counting_head *h = (counting_head *)model;
    if (h->steps < MAX_LEN) h->allocs[h->steps] = ag_memory_usage().allocations;
    ag_tensor *z = ag_linear(tp, x, h->t->head, NULL);  // [n, V]
    for (int i = 0; i < z->shape[0]; i++)
        ag_tensor_set_item(z, (size_t)i * V + END, i == 0 && h->steps == 2 ? 1e3 : -INFINITY);
    h->steps++;
    return z;
}

// Greedy decoding allocates what it needs at the start, as ag_seq2seq_generate says: an
// input that finishes early moves the other hypotheses up (a reorder of the caches),
// which made the caches' reorder buffers at that step when there are no beams.
static void test_greedy_seq2seq_allocates_nothing_when_an_input_finishes(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    counting_head h = {.t = &t};
    ag_seq2seq s2s = {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = t.head,
                      .head_fn = counting_head_fn, .model = &h};
    ag_search_config cfg = {.max_new_tokens = MAX_LEN - 1, .end_token = END};
    int32_t out[B * (MAX_LEN - 1)];
    int len[B];
    CHECK(ag_seq2seq_generate(&s2s, t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, out, len,
                              NULL));
    CHECK(len[0] == 3 && len[1] == MAX_LEN - 1 && len[2] == MAX_LEN - 1);
    CHECK(h.steps == MAX_LEN - 1);
    CHECK(h.allocs[h.steps - 1] == h.allocs[1]);
    toy_free(&t);
}

// ag_seq2seq_generate, the decoding of an encoder-decoder given its ends (token and
// position tables, head), finds what a search on the whole decoder's scores finds.
static void test_seq2seq_generate_equals_the_search_on_recomputed_scores(void) {
    for (int beams = 0; beams <= BEAMS; beams += BEAMS) {
        toy t;
        toy_init(&t, true, AG_ACT_GELU, 0, 0);
        t.plain_end = t.recompute = true;
        int32_t want[B * BEAMS * MAX_LEN], got[B * BEAMS * MAX_LEN];
        int want_len[B * BEAMS], got_len[B * BEAMS];
        double want_sc[B * BEAMS], got_sc[B * BEAMS];
        CHECK(toy_search(&t, beams, END, want, want_len, want_sc));
        ag_seq2seq s2s = {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = t.head};
        ag_search_config cfg = {.max_new_tokens = MAX_LEN - 1, .end_token = END,
                                .num_beams = beams, .length_penalty = 1};
        CHECK(ag_seq2seq_generate(&s2s, t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, got,
                                  got_len, got_sc));
        CHECK(memcmp(want, got, (size_t)B * (MAX_LEN - 1) * sizeof(int32_t)) == 0);
        CHECK(memcmp(want_len, got_len, B * sizeof(int)) == 0);
        for (int b = 0; b < B; b++) CHECK_NEAR(got_sc[b], want_sc[b], 1e-12);
        toy_free(&t);
    }
}

// ag_seq2seq_generate checks its built-in ends before the first step: a head that can draw
// a token wte has no row for, or a wpe with fewer rows than the positions max_new_tokens
// reaches, is one error naming both, not a failed embedding or slice mid-decoding.
static void test_seq2seq_refuses_a_head_wider_than_wte_before_decoding(void) {
    toy t;
    toy_init(&t, true, AG_ACT_GELU, 0, 0);
    ag_tensor *wide_head = ag_tensor_zeros(AG_F64, 2, (int[]){V + 1, E});
    ag_tensor_set_item(wide_head, (size_t)V * E, 100.0);  // token V would be drawn first
    ag_seq2seq s2s = {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = wide_head};
    ag_search_config cfg = {.max_new_tokens = MAX_LEN, .end_token = END};
    int32_t out[B * MAX_LEN];
    testing_catch_errors();
    CHECK(!ag_seq2seq_generate(&s2s, t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, out, NULL,
                               NULL));
    CHECK(testing_error_was("seq2seq_generate: head [8,8] draws tokens up to 7, but wte [7,8] "
                            "has 7 rows"));
    testing_release_errors();
    ag_tensor_free(wide_head);
    toy_free(&t);
}

// An end of another width or dtype than the decoder's is one line naming it, before the
// memory is projected (it was reported at the first step, by the op that read it: the
// self-attention's cache for wte and wpe, ag_linear for the head).
static void test_seq2seq_refuses_ends_of_another_width_or_dtype_before_decoding(void) {
    toy t;
    toy_init(&t, true, AG_ACT_GELU, 0, 0);
    ag_tensor *narrow = ag_tensor_zeros(AG_F64, 2, (int[]){V, E - 2});
    ag_tensor *single = ag_tensor_zeros(AG_F32, 2, (int[]){MAX_LEN, E});
    ag_tensor *bias = ag_tensor_zeros(AG_F64, 1, (int[]){V + 1});
    ag_search_config cfg = {.max_new_tokens = 4, .end_token = END};
    int32_t out[B * 4];
    const ag_seq2seq cases[4] = {
        {.decoder = &t.d, .wte = narrow, .wpe = t.pos, .head = t.head},
        {.decoder = &t.d, .wte = t.emb, .wpe = single, .head = t.head},
        {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = narrow},
        {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = t.head, .head_bias = bias}};
    const char *want[4] = {
        "seq2seq_generate: wte f64 [7,6] must be a table f64 [rows, 8] (the decoder's dtype "
        "and d_model)",
        "seq2seq_generate: wpe f32 [9,8] must be a table f64 [rows, 8] (the decoder's dtype "
        "and d_model)",
        "seq2seq_generate: head f64 [7,6] must be a table f64 [rows, 8] (the decoder's dtype "
        "and d_model)",
        "seq2seq_generate: head_bias f64 [8] must be f64 [7], as head [7,8]"};
    testing_catch_errors();
    for (int i = 0; i < 4; i++) {
        CHECK(!ag_seq2seq_generate(&cases[i], t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, out,
                                   NULL, NULL));
        CHECK(testing_error_was(want[i]));
    }
    testing_release_errors();
    ag_tensor_free(narrow), ag_tensor_free(single), ag_tensor_free(bias);
    toy_free(&t);
}

static void test_seq2seq_refuses_a_wpe_shorter_than_max_new_tokens_before_decoding(void) {
    toy t;
    toy_init(&t, true, AG_ACT_GELU, 0, 0);
    ag_seq2seq s2s = {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = t.head};
    ag_search_config cfg = {.max_new_tokens = MAX_LEN + 1, .end_token = -1};
    int32_t out[B * (MAX_LEN + 1)];
    testing_catch_errors();
    CHECK(!ag_seq2seq_generate(&s2s, t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, out, NULL,
                               NULL));
    CHECK(testing_error_was("seq2seq_generate: wpe [9,8] has 9 rows, fewer than the 10 "
                            "positions of max_new_tokens"));
    // Exactly enough rows: the last step embeds position MAX_LEN - 1.
    cfg.max_new_tokens = MAX_LEN;
    CHECK(ag_seq2seq_generate(&s2s, t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, out, NULL,
                              NULL));
    CHECK(testing_error_count == 0);
    testing_release_errors();
    toy_free(&t);
}

// A search configuration the search refuses is reported once, by the search, not a second
// time by the caches made for it.
static void test_seq2seq_reports_a_bad_search_config_once(void) {
    toy t;
    toy_init(&t, true, AG_ACT_GELU, 0, 0);
    ag_seq2seq s2s = {.decoder = &t.d, .wte = t.emb, .wpe = t.pos, .head = t.head};
    ag_search_config cfg = {.max_new_tokens = 0, .end_token = END};
    int32_t out[B];
    testing_catch_errors();
    CHECK(!ag_seq2seq_generate(&s2s, t.memory, t.kpm, AG_MASK_BLOCKS, &cfg, START, out, NULL,
                               NULL));
    CHECK(testing_error_was("search: needs batch, vocab, start_len and max_new_tokens >= 1, "
                            "num_beams >= 0 and end_token < vocab; got batch 3, vocab 7, "
                            "start_len 1, max_new_tokens 0, num_beams 0, end_token 0"));
    testing_release_errors();
    toy_free(&t);
}

// ---- A decoder-only model under beam search --------------------------------------------
// GPT-style: causal blocks with KV caches of B * BEAMS rows, a prompt of PROMPT tokens per
// input (all of it run at the first step, several positions at once), then each
// hypothesis's last token; beams reorder the caches with ag_kv_cache_reorder.
enum { PROMPT = 3 };

typedef struct gpt {
    ag_params *ps;
    ag_block blocks[LAYERS];
    ag_kv_cache *cache[LAYERS];
    ag_tensor *emb, *pos, *head;
    ag_tape *tp, *full_tp;
    double worst;
    int steps;
} gpt;

static ag_tensor *gpt_embed(ag_tape *tp, const gpt *g, const int32_t *tokens, int rows,
                            int stride, int p0, int n) {
    const toy as_toy = {.emb = g->emb, .pos = g->pos};
    return embed(tp, &as_toy, tokens, rows, stride, p0, n);
}

static ag_tensor *gpt_step(void *model, const ag_search_hyps *h) {
    gpt *g = model;
    const int first = g->steps++ == 0 ? 0 : h->len - 1, n = h->len - first;
    ag_tape_reset(g->tp);
    ag_tensor *x = gpt_embed(g->tp, g, h->tokens, h->n, h->stride, first, n);  // [rows, n, E]
    for (int l = 0; l < LAYERS; l++)
        if (!ag_block_forward_cached(&g->blocks[l], g->cache[l], x)) return NULL;
    ag_tensor *last = ag_slice(g->tp, x, 1, n - 1, 1);
    ag_tensor *z = ag_reshape(g->tp, ag_linear(g->tp, last, g->head, NULL), 2, (int[]){h->n, V});
    for (int i = 0; i < h->n; i++) {  // the whole model on the prefix
        ag_tape_reset(g->full_tp);
        ag_tensor *y = gpt_embed(g->full_tp, g, h->tokens + (size_t)i * h->stride, 1, 0, 0,
                                 h->len);
        for (int l = 0; l < LAYERS; l++)
            y = ag_block_forward(g->full_tp, &g->blocks[l], y, &(ag_block_opts){.causal = true});
        y = ag_linear(g->full_tp, ag_slice(g->full_tp, y, 1, h->len - 1, 1), g->head, NULL);
        for (int v = 0; v < V; v++)
            g->worst = fmax(g->worst, fabs(ag_tensor_item(y, v) -
                                           ag_tensor_item(z, (size_t)i * V + v)));
    }
    for (int i = 0; i < h->n; i++) {  // ends at various lengths, as above
        const size_t at = (size_t)i * V + END;
        ag_tensor_set_item(z, at, ag_tensor_item(z, at) - 6 + 0.9 * h->len);
    }
    return z;
}

static bool gpt_reorder(void *model, const int *from, int n) {
    gpt *g = model;
    for (int l = 0; l < LAYERS; l++)
        if (!ag_kv_cache_reorder(g->cache[l], from, n)) return false;
    return true;
}

static void test_decoder_only_beam_search_through_reordered_kv_caches(void) {
    gpt g = {.ps = ag_params_new(AG_F64)};
    ag_pcg32 rng = ag_pcg32_make(31, 1);
    ag_block_config cfg = {.d_model = E, .num_heads = H, .dim_feedforward = FF,
                           .norm_first = true, .activation = AG_ACT_GELU};
    for (int l = 0; l < LAYERS; l++) {
        char name[24];
        snprintf(name, sizeof name, "blocks.%d", l);
        CHECK(ag_block_init(&g.blocks[l], g.ps, name, &cfg, &rng));
    }
    g.emb = ag_params_add(g.ps, "emb", 2, (int[]){V, E});
    g.pos = ag_params_add(g.ps, "pos", 2, (int[]){MAX_LEN + PROMPT, E});
    g.head = ag_params_add(g.ps, "head", 2, (int[]){V, E});
    for (int i = 0; i < ag_params_count(g.ps); i++)
        ag_tensor_init_uniform(ag_params_at(g.ps, i), &rng, -1, 1);
    for (int l = 0; l < LAYERS; l++)
        g.cache[l] = ag_kv_cache_new_block(&g.blocks[l], B * BEAMS, MAX_LEN + PROMPT);
    g.tp = ag_tape_new();
    g.full_tp = ag_tape_new();
    ag_tape_set_grad_enabled(g.tp, false);
    ag_tape_set_grad_enabled(g.full_tp, false);
    ag_search_config sc = {.max_new_tokens = MAX_LEN, .end_token = END, .num_beams = BEAMS,
                           .length_penalty = 1};
    ag_search *s = ag_search_new(B, V, PROMPT, &sc);
    const int32_t prompt[B * PROMPT] = {1, 2, 3, 4, 5, 6, 2, 2, 5};
    int32_t out[B * MAX_LEN];
    int len[B];
    CHECK(ag_search_run(s, &(ag_search_model){gpt_step, gpt_reorder, &g}, prompt, out, len,
                        NULL));
    CHECK(g.steps > 2);
    CHECK(g.worst <= 1e-12);
    ag_search_free(s);
    for (int l = 0; l < LAYERS; l++) ag_kv_cache_free(g.cache[l]);
    ag_tape_free(g.tp);
    ag_tape_free(g.full_tp);
    ag_params_free(g.ps);
}

static void test_decoder_cache_misuse_is_reported(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    testing_catch_errors();
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    const int source[B] = {0, 1, 2}, shuffled[B] = {1, 0, 2};
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, source));
    CHECK(testing_error_was(
        "decoder_forward_cached: no memory: call ag_decoder_cache_set_memory first"));
    ag_tensor *long_memory = ag_tensor_zeros(AG_F64, 3, (int[]){B, S + 1, E});
    CHECK(!ag_decoder_cache_set_memory(t.cache, long_memory, NULL, AG_MASK_BLOCKS));
    CHECK(testing_error_was("decoder_cache_set_memory: memory f64 [3,6,8] must be f64 [B, S, 8] "
                            "with B <= 3 and S <= 5"));
    CHECK(ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS));
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, shuffled));
    CHECK(testing_error_was("decoder_forward_cached: the rows' inputs must be grouped in input "
                            "order, at most 3 rows an input, among the 3 inputs still decoding"));
    CHECK(!ag_decoder_cache_reorder(t.cache, (const int[]){0, 9}, 2));
    CHECK(testing_error_was("kv_cache_reorder: row 1 comes from row 9, outside [0, 9)"));
    ag_tape_set_grad_enabled(t.tp, true);
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, source));
    CHECK(testing_error_was("decoder_forward_cached: the tape must have grad disabled (a "
                            "cached step has no backward)"));
    // NULL handles, named (a NULL cache was "memory [3,5,8] must be  [B, S, 0] with B <= 0
    // and S <= 0", and a NULL tape two lines from the ops inside).
    CHECK(!ag_decoder_cache_set_memory(NULL, t.memory, NULL, AG_MASK_BLOCKS));
    CHECK(testing_error_was("decoder_cache_set_memory: the cache is NULL"));
    CHECK(!ag_transformer_decoder_forward_cached(NULL, &t.d, t.cache, x, source));
    CHECK(testing_error_was("decoder_forward_cached: the tape is NULL"));
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, NULL, x, source));
    CHECK(testing_error_was("decoder_forward_cached: the cache is NULL"));
    // A decoder whose layers were never made (zeroed): one line, where the caches and
    // seq2seq_generate read the dtype through a NULL weight.
    ag_decoder_layer unmade = {0};
    const ag_transformer_decoder unmade_d = {.num_layers = 1, .layers = &unmade};
    CHECK(!ag_decoder_cache_new(&unmade_d, 1, 1, 4, 4));
    CHECK(strstr(testing_last_error, "got a module not made (no out_proj.weight") != NULL);
    ag_seq2seq unmade_s2s = {.decoder = &unmade_d, .wte = t.emb, .head = t.head};
    ag_search_config greedy = {.max_new_tokens = 4, .end_token = END};
    int32_t out[B * 4];
    testing_catch_errors();
    CHECK(!ag_seq2seq_generate(&unmade_s2s, t.memory, NULL, AG_MASK_BLOCKS, &greedy, START, out,
                               NULL, NULL));
    CHECK(testing_error_was("seq2seq_generate: the decoder's layer 0 is not made (no "
                            "self_attn.out_proj.weight: its init failed or was not called)"));
    testing_release_errors();
    ag_tensor_free(x);
    ag_tensor_free(long_memory);
    toy_free(&t);
}

// A step's bad x, or one past the capacity, is one line naming the decoder's step, and
// changes nothing: a pre-LN layer's LayerNorm reported a misshapen x and its attention a
// second line ("mha_forward_cached: x NULL ..."), a full cache was named an MHA's, and the
// inputs absent from the failed step had already been dropped for good.
static void test_a_bad_step_is_one_line_and_changes_nothing(void) {
    toy t;
    toy_init(&t, true, AG_ACT_RELU, 0, 0);
    CHECK(ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS));
    testing_catch_errors();
    ag_tensor *narrow = ag_tensor_zeros(AG_F64, 2, (int[]){2, E - 2});
    ag_tensor *f32 = ag_tensor_zeros(AG_F32, 2, (int[]){2, E});
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    const int two[2] = {0, 2}, all[B] = {0, 1, 2};
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, narrow, two));
    CHECK(testing_error_was("decoder_forward_cached: x f64 [2,6] must be f64 [rows,8] or "
                            "[rows,n,8] with rows <= 9"));
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, f32, two));
    CHECK(testing_error_was("decoder_forward_cached: x f32 [2,8] must be f64 [rows,8] or "
                            "[rows,n,8] with rows <= 9"));
    for (int p = 0; p < MAX_LEN; p++) {  // input 1 still decodes: the failed steps kept it
        ag_tape_reset(t.tp);
        CHECK(ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, all) != NULL);
    }
    CHECK(testing_error_count == 0);
    ag_tape_reset(t.tp);
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, all));
    CHECK(testing_error_was("decoder_forward_cached: the cache is full (9 positions)"));
    testing_release_errors();
    ag_tensor_free(narrow), ag_tensor_free(f32), ag_tensor_free(x);
    toy_free(&t);
}

// The caches free all they hold whichever of the decoder and the caches goes first: the
// free read the layer count through the decoder, which ag_transformer_decoder_free zeroes,
// and so leaked every layer's caches (and read freed memory when the decoder was gone).
static void test_the_caches_free_everything_after_the_decoder(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    ag_decoder_cache_free(t.cache);
    t.cache = NULL;
    ag_transformer_decoder d = t.d;  // a decoder of t's layers, freed before its caches
    const size_t before = ag_memory_usage().bytes_live;
    ag_decoder_cache *c = ag_decoder_cache_new(&d, B, BEAMS, MAX_LEN, S);
    CHECK(c && ag_decoder_cache_set_memory(c, t.memory, t.kpm, AG_MASK_BLOCKS));
    memset(&d, 0, sizeof d);  // as ag_transformer_decoder_free leaves it (t.d keeps the layers)
    ag_decoder_cache_free(c);
    CHECK(ag_memory_usage().bytes_live == before);
    toy_free(&t);
}

// One error reported since the last check (forgotten, for the next).
static bool one_line(void) {
    const bool one = testing_error_count == 1;
    testing_error_count = 0;
    return one;
}

// A decoder changed after its cache was made is refused, in one line, by the three calls
// that read it: made again with more layers, they walked its layers past the cache's
// (reorder read a cache pointer beyond its array); freed, set_memory and the step read
// its NULL layer array and reorder did nothing and said yes; with cross-attention heads
// pruned, set_memory copied the narrower projections as rows of the old width.
static void test_a_changed_decoder_is_refused_by_its_cache(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    testing_catch_errors();
    const int source[B] = {0, 1, 2}, keep[B] = {0, 1, 2};
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    CHECK(ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS));
    // Heads pruned in the last layer's attention over the memory.
    CHECK(ag_mha_prune_heads(&t.d.layers[LAYERS - 1].multihead_attn, t.ps, (int[]){0}, 1));
    CHECK(!ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS));
    CHECK(testing_error_was("decoder_cache_set_memory: the decoder changed since the cache "
                            "was made (2 layers then, 2 now; layers made again, freed, or "
                            "heads pruned): make a new cache"));
    CHECK(!ag_decoder_cache_reorder(t.cache, keep, B) && one_line());
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, source) && one_line());
    // Made again, with more layers, in another store.
    ag_transformer_decoder_free(&t.d);
    ag_params *more = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(5, 1);
    ag_block_config cfg = {.d_model = E, .num_heads = H, .dim_feedforward = FF};
    CHECK(ag_transformer_decoder_init(&t.d, more, "decoder", &cfg, LAYERS + 1, &rng));
    CHECK(!ag_decoder_cache_reorder(t.cache, keep, B));
    CHECK(testing_error_was("decoder_cache_reorder: the decoder changed since the cache was "
                            "made (2 layers then, 3 now; layers made again, freed, or heads "
                            "pruned): make a new cache"));
    CHECK(!ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS) && one_line());
    ag_tape_reset(t.tp);
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, source) && one_line());
    // Freed: no layers.
    ag_transformer_decoder_free(&t.d);
    CHECK(!ag_decoder_cache_set_memory(t.cache, t.memory, t.kpm, AG_MASK_BLOCKS) && one_line());
    CHECK(!ag_decoder_cache_reorder(t.cache, keep, B) && one_line());
    ag_tape_reset(t.tp);
    CHECK(!ag_transformer_decoder_forward_cached(t.tp, &t.d, t.cache, x, source));
    CHECK(testing_error_was("decoder_forward_cached: the decoder changed since the cache was "
                            "made (2 layers then, 0 now; layers made again, freed, or heads "
                            "pruned): make a new cache"));
    testing_release_errors();
    ag_tensor_free(x);
    ag_params_free(more);
    toy_free(&t);
}

// A polarity that is neither kind is refused where it is given, not at every step after.
static void test_set_memory_refuses_an_unknown_polarity(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    testing_catch_errors();
    CHECK(!ag_decoder_cache_set_memory(t.cache, t.memory, NULL, (ag_mask_polarity)7));
    CHECK(testing_error_was("decoder_cache_set_memory: unknown mask polarity 7 "
                            "(AG_MASK_BLOCKS or AG_MASK_KEEPS), memory [3,5,8]"));
    testing_release_errors();
    toy_free(&t);
}

// Memory or its key padding mask of the right shape but the wrong dtype: the message names
// the dtype, where "memory_key_padding_mask [3,5] must be bool [3,5]" showed a shape that
// fits and nothing wrong.
static void test_memory_or_its_mask_of_the_wrong_dtype_are_named_so(void) {
    toy t;
    toy_init(&t, false, AG_ACT_RELU, 0, 0);
    ag_tensor *m32 = ag_tensor_convert(t.memory, AG_F32);
    ag_tensor *kpm8 = ag_tensor_zeros(AG_U8, 2, (int[]){t.memory->shape[0], t.memory->shape[1]});
    char want[160];
    testing_catch_errors();
    CHECK(!ag_decoder_cache_set_memory(t.cache, m32, NULL, AG_MASK_BLOCKS));
    snprintf(want, sizeof want,
             "decoder_cache_set_memory: memory f32 [%d,%d,%d] must be f64 [B, S, %d] with B <= "
             "%d and S <= %d",
             t.memory->shape[0], t.memory->shape[1], E, E, B, S);
    CHECK(testing_error_was(want));
    CHECK(!ag_decoder_cache_set_memory(t.cache, t.memory, kpm8, AG_MASK_BLOCKS));
    snprintf(want, sizeof want,
             "decoder_cache_set_memory: memory_key_padding_mask u8 [%d,%d] must be bool [%d,%d]",
             t.memory->shape[0], t.memory->shape[1], t.memory->shape[0], t.memory->shape[1]);
    CHECK(testing_error_was(want));
    testing_release_errors();
    ag_tensor_free(m32);
    ag_tensor_free(kpm8);
    toy_free(&t);
}

int main(void) {
    RUN(test_cached_steps_equal_the_whole_decoder_at_every_position);
    RUN(test_cached_greedy_and_beam_search_equal_recomputation);
    RUN(test_a_cached_decoding_step_allocates_nothing);
    RUN(test_seq2seq_generate_equals_the_search_on_recomputed_scores);
    RUN(test_decoder_only_beam_search_through_reordered_kv_caches);
    RUN(test_decoder_cache_misuse_is_reported);
    RUN(test_set_memory_refuses_an_unknown_polarity);
    RUN(test_a_bad_step_is_one_line_and_changes_nothing);
    RUN(test_the_caches_free_everything_after_the_decoder);
    RUN(test_a_changed_decoder_is_refused_by_its_cache);
    RUN(test_seq2seq_refuses_a_head_wider_than_wte_before_decoding);
    RUN(test_seq2seq_refuses_ends_of_another_width_or_dtype_before_decoding);
    RUN(test_greedy_seq2seq_allocates_nothing_when_an_input_finishes);
    RUN(test_seq2seq_refuses_a_wpe_shorter_than_max_new_tokens_before_decoding);
    RUN(test_seq2seq_reports_a_bad_search_config_once);
    RUN(test_memory_or_its_mask_of_the_wrong_dtype_are_named_so);
    return testing_summary();
}
