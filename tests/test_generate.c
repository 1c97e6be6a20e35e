// Generation: the KV-cache path of MultiheadAttention and the transformer block
// against full recomputation, and the sampler (greedy, temperature, top-k, top-p).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/gemv.h"
#include "op_checks.h"

enum { V = 11, E = 16, H = 4, FF = 24, LAYERS = 2, PROMPT = 3, NEW = 50, MAXLEN = PROMPT + NEW };

// A tiny GPT: embedding (tied head), blocks, final LayerNorm; learned positions (a wpe
// table added to the input) or a position scheme inside the attention.
typedef struct {
    ag_params *ps;
    ag_embedding_layer wte, wpe;
    ag_block blocks[LAYERS];
    ag_layernorm_layer ln_f;
    ag_pos_kind pos;  // AG_POS_NONE: learned positions (wpe)
    // What the generator's head saw, step by step: logits and the allocation count.
    double logits[NEW][V];
    uint64_t allocs[NEW];
    int steps;
} gpt;

// The attention's shape beyond the defaults: kv heads (0: one per head) and a sliding
// window (0: none).
typedef struct {
    int kv_heads, window;
} attn_shape;

static void gpt_init(gpt *g, ag_dtype dt, bool norm_first, ag_activation act, ag_pos_kind pos,
                     attn_shape a) {
    *g = (gpt){.ps = ag_params_new(dt), .pos = pos};
    ag_pcg32 rng = ag_pcg32_make(5, 6);
    ag_embedding_layer_init(&g->wte, g->ps, "wte", V, E, &rng);
    if (pos == AG_POS_NONE) ag_embedding_layer_init(&g->wpe, g->ps, "wpe", MAXLEN, E, &rng);
    // Small tables and distances, so that clipping (relative) and the logarithmic and
    // last buckets (T5) are reached within 53 positions.
    ag_block_config bc = {.d_model = E, .num_heads = H, .dim_feedforward = FF, .dropout = 0.1,
                          .activation = act, .norm_first = norm_first, .layer_norm_eps = 1e-5,
                          .pos = pos, .max_distance = pos == AG_POS_T5 ? 20 : 6,
                          .num_buckets = 10, .num_kv_heads = a.kv_heads, .window = a.window};
    for (int l = 0; l < LAYERS; l++) {
        char name[16];
        snprintf(name, sizeof name, "b%d", l);
        CHECK(ag_block_init(&g->blocks[l], g->ps, name, &bc, &rng));
        // The tables start at zero: give them values, so a wrong bias shows.
        if (g->blocks[l].self_attn.pos_table)
            ag_tensor_init_normal(g->blocks[l].self_attn.pos_table, &rng, 0, 1);
    }
    ag_layernorm_layer_init(&g->ln_f, g->ps, "ln_f", E);
    // LayerNorm weights and biases away from 1 and 0, so a wrong one shows.
    ag_tensor_set_item(g->ln_f.weight, 3, 1.7), ag_tensor_set_item(g->ln_f.bias, 5, -0.3);
}

// The generator's two ends. The head also records what it computed.
static ag_tensor *gpt_embed(ag_tape *tp, const void *model, int32_t token, int pos) {
    const gpt *g = model;
    ag_tensor *x = ag_embedding(tp, g->wte.weight, &token, 1, (int[]){1});
    return g->pos == AG_POS_NONE ? ag_add(tp, x, ag_slice(tp, g->wpe.weight, 0, pos, 1)) : x;
}

static ag_tensor *gpt_head(ag_tape *tp, const void *model, ag_tensor *x) {
    gpt *g = (gpt *)model;
    ag_tensor *logits = ag_linear(tp, ag_layernorm_layer_forward(tp, &g->ln_f, x),
                                  g->wte.weight, NULL);
    if (g->steps < NEW) {
        for (int c = 0; c < V; c++) g->logits[g->steps][c] = ag_tensor_item(logits, (size_t)c);
        g->allocs[g->steps++] = ag_memory_usage().allocations;
    }
    return logits;
}

// The last position's logits [1, 1, V] from the whole window ids[0..T).
static ag_tensor *full_logits(ag_tape *tp, const gpt *g, const int32_t *ids, int T) {
    ag_tensor *x = ag_embedding(tp, g->wte.weight, ids, 2, (int[]){1, T});
    if (g->pos == AG_POS_NONE) x = ag_add(tp, x, ag_slice(tp, g->wpe.weight, 0, 0, T));
    ag_block_opts o = {.causal = true};
    for (int l = 0; l < LAYERS; l++) x = ag_block_forward(tp, &g->blocks[l], x, &o);
    x = ag_layernorm_layer_forward(tp, &g->ln_f, x);
    return ag_linear(tp, ag_slice(tp, x, 1, -1, 1), g->wte.weight, NULL);
}

// Greedy generation of NEW tokens after a prompt through ag_generate (KV caches, a
// context of `context` positions), against full recomputation over the same window
// at every step: returns the largest logit difference; *same: whether greedy
// decoding of the recomputed logits picks the same tokens.
// Under autocast `ac`: the generator's steps and the recomputation both.
static double shaped_vs_full(ag_autocast ac, ag_dtype dt, bool norm_first, ag_activation act,
                             ag_pos_kind pos, attn_shape a, int context, bool builtin,
                             bool *same, uint64_t *allocs_after_first) {
    gpt *g = malloc(sizeof *g);
    gpt_init(g, dt, norm_first, act, pos, a);
    ag_decoder d = {g->blocks, LAYERS, context, .embed_fn = gpt_embed, .head_fn = gpt_head,
                    .model = g};
    if (builtin)  // GPT-2's ends, as the library builds them (the head still records)
        d.embed_fn = NULL, d.wte = g->wte.weight, d.wpe = g->wpe.weight;
    ag_generator *gen = ag_generator_new(&d);
    ag_generator_set_autocast(gen, ac);
    ag_sampler *s = ag_sampler_new(V, &(ag_sample_config){0, 0, 1}, 1, 1);
    int32_t ids[MAXLEN] = {4, 9, 2};
    CHECK(ag_generate(gen, ids, PROMPT, NEW, s, ids + PROMPT, NULL, NULL) == NEW);
    CHECK(g->steps == NEW);
    *allocs_after_first = g->allocs[NEW - 1] - g->allocs[1];
    // The window the generator's rule gives: when full, it starts again from the last
    // (context + 1) / 2 tokens, the new one included; blocks that slide never start again.
    const bool slides = a.window > 0 && pos != AG_POS_NONE;
    ag_tape *tp = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false);
    ag_tape_set_autocast(tp, ac);
    double worst = 0;
    *same = true;
    int start = PROMPT > context ? PROMPT - context : 0;
    for (int k = 0; k < NEW; k++) {
        const int end = PROMPT + k;  // the window is ids[start, end)
        if (!slides && k > 0 && end - 1 - start == context) start = end - (context + 1) / 2;
        ag_tape_reset(tp);
        ag_tensor *full = full_logits(tp, g, ids + start, end - start);
        int best = 0;
        for (int c = 0; c < V; c++) {
            double f = ag_tensor_item(full, (size_t)c);
            worst = fmax(worst, fabs(g->logits[k][c] - f));
            if (f > ag_tensor_item(full, (size_t)best)) best = c;
        }
        *same = *same && best == ids[end];
    }
    ag_sampler_free(s);
    ag_generator_free(gen);
    ag_tape_free(tp), ag_params_free(g->ps);
    free(g);
    return worst;
}

static double cached_vs_full(ag_dtype dt, bool norm_first, ag_activation act, ag_pos_kind pos,
                             int context, bool builtin, bool *same, uint64_t *allocs_after_first) {
    return shaped_vs_full(AG_AUTOCAST_OFF, dt, norm_first, act, pos, (attn_shape){0, 0}, context,
                          builtin, same, allocs_after_first);
}

static const ag_pos_kind every_scheme[] = {AG_POS_NONE, AG_POS_RELATIVE, AG_POS_T5,
                                           AG_POS_ALIBI, AG_POS_ROPE};

static void test_cached_generation_equals_full_recomputation_for_50_tokens_f64(void) {
    for (int i = 0; i < 5; i++) {
        bool same;
        uint64_t allocs;
        for (int builtin = 0; builtin < 2; builtin++) {
            double err = cached_vs_full(AG_F64, true, AG_ACT_GELU, every_scheme[i], MAXLEN,
                                        builtin, &same, &allocs);
            CHECK(err <= 1e-12);
            CHECK(same);
        }
    }
    bool same;
    uint64_t allocs;
    // Post-LN with ReLU as well.
    double err =
        cached_vs_full(AG_F64, false, AG_ACT_RELU, AG_POS_NONE, MAXLEN, 0, &same, &allocs);
    CHECK(err <= 1e-12);
    CHECK(same);
}

static void test_a_full_context_starts_again_from_its_second_half(void) {
    // A context of 8 (and of 7, odd) fills six times in 50 tokens; each window equals a
    // full recomputation over the same tokens from position 0.
    for (int i = 0; i < 5; i++)
        for (int context = 7; context <= 8; context++) {
            bool same;
            uint64_t allocs;
            CHECK(cached_vs_full(AG_F64, true, AG_ACT_GELU, every_scheme[i], context, true,
                                 &same, &allocs) <= 1e-12);
            CHECK(same);
        }
    // A prompt longer than the context keeps its last tokens.
    bool same;
    uint64_t allocs;
    CHECK(cached_vs_full(AG_F64, true, AG_ACT_GELU, AG_POS_ROPE, 2, 0, &same, &allocs) <= 1e-12);
    CHECK(same);
}

static void test_windowed_blocks_slide_and_equal_the_whole_forward(void) {
    // Blocks with a window of 5 and positions inside their attention: 50 tokens through a
    // context of 8 never start again; every step's logits are those of the whole causal
    // forward over all the tokens so far, from position 0 (53 positions), grouped kv
    // heads or not, and a token costs no allocation.
    for (int i = 1; i < 5; i++)
        for (int kv = 0; kv <= 2; kv += 2) {
            bool same;
            uint64_t allocs;
            CHECK(shaped_vs_full(AG_AUTOCAST_OFF, AG_F64, true, AG_ACT_GELU, every_scheme[i],
                                 (attn_shape){kv, 5}, 8, false, &same, &allocs) <= 1e-12);
            CHECK(same);
            CHECK(allocs == 0);
        }
}

static void test_windowed_blocks_with_learned_positions_start_again(void) {
    // Learned positions (wpe) end at the context: windowed, grouped blocks still start
    // again from the second half, as the whole forward over each restarted window.
    for (int builtin = 0; builtin < 2; builtin++) {
        bool same;
        uint64_t allocs;
        CHECK(shaped_vs_full(AG_AUTOCAST_OFF, AG_F64, false, AG_ACT_RELU, AG_POS_NONE,
                             (attn_shape){2, 5}, 8, builtin, &same, &allocs) <= 1e-12);
        CHECK(same);
        CHECK(allocs == 0);
    }
}

static void test_cached_generation_in_f32_stays_close_to_full(void) {
    for (int i = 0; i < 5; i++) {
        bool same;
        uint64_t allocs;
        CHECK(cached_vs_full(AG_F32, true, AG_ACT_GELU, every_scheme[i], MAXLEN, 0, &same,
                             &allocs) <= 1e-4);
    }
}

static void test_a_cached_step_allocates_nothing(void) {
    // The caches hold every buffer; the callbacks' tape keeps its memory across
    // resets. Counted from the second token to the last, restarts of the window
    // included.
    for (int i = 0; i < 5; i++)
        for (int context = 8; context <= MAXLEN; context += MAXLEN - 8) {
            bool same;
            uint64_t allocs;
            cached_vs_full(AG_F64, true, AG_ACT_GELU, every_scheme[i], context, true, &same,
                           &allocs);
            CHECK(allocs == 0);
        }
}

// Under autocast a step reads bf16 copies of the weights (a matrix-vector kernel of its
// own, summing in another order than the products of the full forward): the logits stay
// close to the autocast forward over the same tokens (a float32 sum in another order can
// move an activation's bf16 rounding by one unit, 2^-8 of it, hence the margin), and from
// the second token to the last, restarts of the window included, nothing is allocated.
static void test_bf16_generation_matches_the_autocast_forward_and_allocates_nothing(void) {
    double worst = 0;
    for (int i = 0; i < 5; i++)
        for (int context = 8; context <= MAXLEN; context += MAXLEN - 8)
            for (int builtin = 0; builtin < 2; builtin++) {
                bool same;
                uint64_t allocs;
                const double err =
                    shaped_vs_full(AG_AUTOCAST_BF16, AG_F32, true, AG_ACT_GELU, every_scheme[i],
                                   (attn_shape){0, 0}, context, builtin, &same, &allocs);
                worst = fmax(worst, err);
                CHECK(allocs == 0);
            }
    printf("bf16 generation vs the autocast forward: largest logit difference %.1e\n", worst);
    CHECK(worst <= 1e-3);
}

// A tiny GPT (RoPE) behind the callbacks, a greedy sampler and a prompt: the bf16
// copies' tests below.
typedef struct {
    gpt *g;
    ag_decoder d;
    ag_sampler *s;
} greedy_gpt;

static const int32_t greedy_prompt[PROMPT] = {4, 9, 2};

static greedy_gpt greedy_gpt_make(void) {
    greedy_gpt t = {malloc(sizeof(gpt)), {0},
                    ag_sampler_new(V, &(ag_sample_config){0, 0, 1}, 1, 1)};
    gpt_init(t.g, AG_F32, true, AG_ACT_GELU, AG_POS_ROPE, (attn_shape){0, 0});
    t.d = (ag_decoder){t.g->blocks, LAYERS, MAXLEN, .embed_fn = gpt_embed,
                       .head_fn = gpt_head, .model = t.g};
    return t;
}

static void greedy_gpt_free(greedy_gpt *t) {
    ag_sampler_free(t->s);
    ag_params_free(t->g->ps);
    free(t->g);
}

// NEW tokens into out from the prompt by gen; the head's logits are in t->g->logits.
static bool greedy_run(greedy_gpt *t, ag_generator *gen, int32_t *out) {
    t->g->steps = 0;
    return ag_generate(gen, greedy_prompt, PROMPT, NEW, t->s, out, NULL, NULL) == NEW;
}

// The copies are made as each generation starts: a generation after the parameters
// changed gives what a new generator gives, and they take bf16's bytes.
static void test_bf16_generation_reads_the_parameters_as_each_generation_starts(void) {
    greedy_gpt t = greedy_gpt_make();
    int32_t out[2][NEW];
    // What a first generation holds on to (its tape's memory), in float32 and in bf16.
    size_t grew[2];
    ag_generator *gen = NULL;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        ag_generator_free(gen);
        const size_t before = ag_memory_usage().bytes_live;
        gen = ag_generator_new(&t.d);
        CHECK(ag_generator_set_autocast(gen, bf16 ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF) ==
              AG_AUTOCAST_OFF);
        CHECK(greedy_run(&t, gen, out[0]));
        grew[bf16] = ag_memory_usage().bytes_live - before;
    }
    CHECK(ag_generator_autocast(gen) == AG_AUTOCAST_BF16);
    // Every linear layer's weight as bf16, packed (rows and k padded for the kernel):
    // in_proj, out_proj, linear1, linear2, the head.
    const size_t copies =
        2 * (LAYERS * (agi_gemv_bf16_packed_len(3 * E, E) + agi_gemv_bf16_packed_len(E, E) +
                       agi_gemv_bf16_packed_len(FF, E) + agi_gemv_bf16_packed_len(E, FF)) +
             agi_gemv_bf16_packed_len(V, E));
    CHECK(grew[1] - grew[0] >= copies && grew[1] - grew[0] < copies + 4096);
    for (int l = 0; l < LAYERS; l++) ag_tensor_fill(t.g->blocks[l].linear2.weight, 0.03);
    CHECK(greedy_run(&t, gen, out[0]));
    double changed[NEW][V];
    memcpy(changed, t.g->logits, sizeof changed);
    ag_generator *fresh = ag_generator_new(&t.d);
    ag_generator_set_autocast(fresh, AG_AUTOCAST_BF16);
    CHECK(greedy_run(&t, fresh, out[1]));
    CHECK(memcmp(changed, t.g->logits, sizeof changed) == 0);
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    ag_generator_free(fresh);
    ag_generator_free(gen);
    greedy_gpt_free(&t);
}

// A generation started from the emit of another on the same generator: it reset the
// caches and the window the outer one was reading, which then went on from the inner
// one's positions (silently other tokens); a free from there took them away. Both are
// refused, and the outer generation draws what it draws alone.
typedef struct {
    greedy_gpt *t;
    ag_generator *gen;
    int emitted, inner;
} reentry;

static void emit_reenter(int32_t token, void *user) {
    (void)token;
    reentry *r = user;
    if (r->emitted++ != 1) return;
    int32_t out[NEW];
    r->inner = ag_generate(r->gen, (const int32_t[]){1, 1}, 2, NEW, r->t->s, out, NULL, NULL);
    ag_generator_free(r->gen);
}

static void test_a_generation_from_inside_one_is_refused(void) {
    greedy_gpt t = greedy_gpt_make();
    int32_t alone[NEW], out[NEW];
    ag_generator *gen = ag_generator_new(&t.d);
    CHECK(greedy_run(&t, gen, alone));
    reentry r = {&t, gen, 0, -1};
    testing_catch_errors();
    CHECK(ag_generate(gen, greedy_prompt, PROMPT, NEW, t.s, out, emit_reenter, &r) == NEW);
    CHECK(r.inner == 0 && testing_error_count == 2);
    CHECK(strstr(testing_last_error, "generator_free: the generator is generating") != NULL);
    testing_release_errors();
    CHECK(memcmp(out, alone, sizeof out) == 0);
    ag_generator_free(gen);
    greedy_gpt_free(&t);
}

// A generator made before ag_mha_prune_heads is refused after it, naming the generator:
// the error was its cache's, "make a new cache", a cache the caller never made.
static void test_a_generator_made_before_pruning_says_to_make_a_new_generator(void) {
    greedy_gpt t = greedy_gpt_make();
    int32_t out[NEW];
    ag_generator *gen = ag_generator_new(&t.d);
    CHECK(greedy_run(&t, gen, out));
    CHECK(ag_mha_prune_heads(&t.g->blocks[1].self_attn, t.g->ps, (int[]){0}, 1));
    testing_catch_errors();
    CHECK(ag_generate(gen, greedy_prompt, PROMPT, NEW, t.s, out, NULL, NULL) == 0);
    CHECK(testing_error_was("generate: block 1 changed since the generator was made (heads "
                            "pruned, or made again): make a new generator"));
    testing_release_errors();
    ag_generator *fresh = ag_generator_new(&t.d);
    CHECK(greedy_run(&t, fresh, out));
    ag_generator_free(fresh);
    ag_generator_free(gen);
    greedy_gpt_free(&t);
}

// The bf16 copies are checked against the parameters as each generation starts: with the
// parameters unchanged, a second generation repeats the first bit for bit; after an
// optimizer step, it gives what a new generator gives (not the first's logits).
static void test_bf16_generation_follows_a_training_step_and_repeats_without_one(void) {
    greedy_gpt t = greedy_gpt_make();
    int32_t out[4][NEW];
    static double logits[4][NEW][V];
    ag_generator *gen = ag_generator_new(&t.d), *fresh = NULL;
    ag_generator_set_autocast(gen, AG_AUTOCAST_BF16);
    for (int run = 0; run < 4; run++) {  // gen, gen again, gen after a step, a new one
        if (run == 2) {
            ag_optim_config cfg = ag_optim_defaults(AG_SGD);
            cfg.lr = 0.05;
            ag_optim *opt = ag_optim_new(t.g->ps, &cfg);
            ag_tape *tp = ag_tape_new();
            const int32_t ids[5] = {1, 7, 3, 3, 10};
            ag_params_zero_grad(t.g->ps);
            ag_backward(tp, ag_sum(tp, full_logits(tp, t.g, ids, 5)));
            ag_optim_step(opt);
            ag_tape_free(tp);
            ag_optim_free(opt);
        }
        if (run == 3) {
            fresh = ag_generator_new(&t.d);
            ag_generator_set_autocast(fresh, AG_AUTOCAST_BF16);
        }
        CHECK(greedy_run(&t, run == 3 ? fresh : gen, out[run]));
        memcpy(logits[run], t.g->logits, sizeof logits[run]);
    }
    CHECK(memcmp(logits[1], logits[0], sizeof logits[0]) == 0);
    CHECK(memcmp(out[1], out[0], sizeof out[0]) == 0);
    CHECK(memcmp(logits[2], logits[0], sizeof logits[0]) != 0);
    CHECK(memcmp(logits[2], logits[3], sizeof logits[0]) == 0);
    CHECK(memcmp(out[2], out[3], sizeof out[0]) == 0);
    ag_generator_free(fresh);
    ag_generator_free(gen);
    greedy_gpt_free(&t);
}

static void test_mha_cached_rows_equal_causal_forward_for_a_batch(void) {
    enum { B = 2, T = 7 };
    for (int i = 0; i < 5; i++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_pcg32 rng = ag_pcg32_make(3, 4);
        ag_mha m;
        ag_mha_config mc = {.embed_dim = E, .num_heads = H, .pos = every_scheme[i],
                            .max_distance = every_scheme[i] == AG_POS_T5 ? 20 : 3,
                            .num_buckets = 10};
        CHECK(ag_mha_init(&m, ps, "attn", &mc, &rng));
        ag_tensor_fill(m.in_proj_bias, 0.05), ag_tensor_fill(m.out_proj.bias, -0.02);
        if (m.pos_table) ag_tensor_init_normal(m.pos_table, &rng, 0, 1);
        ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 8, -1, 1);
        ag_tape *tp = ag_tape_new();
        ag_tensor *full = ag_mha_forward(tp, &m, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
        ag_kv_cache *c = ag_kv_cache_new(&m, B, T);
        ag_tensor *xt = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
        ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
        double worst = 0;
        for (int t = 0; t < T; t++) {
            for (int b = 0; b < B; b++)
                for (int e = 0; e < E; e++)
                    ag_tensor_set_item(xt, (size_t)(b * E + e),
                                  ag_tensor_item(x, ((size_t)b * T + t) * E + e));
            CHECK(ag_mha_forward_cached(&m, c, xt, out));
            for (int b = 0; b < B; b++)
                for (int e = 0; e < E; e++)
                    worst = fmax(worst, fabs(ag_tensor_item(out, (size_t)(b * E + e)) -
                                             ag_tensor_item(full, ((size_t)b * T + t) * E + e)));
        }
        CHECK(worst <= 1e-13);
        ag_kv_cache_free(c);
        ag_tensor_free(xt), ag_tensor_free(out), ag_tensor_free(x);
        ag_tape_free(tp), ag_params_free(ps);
    }
}

// The rows of m's causal forward over x [B, T, E], against ag_mha_forward_cached fed
// positions in the given chunks (chunks[i] new positions at a time, adding up to T): the
// largest difference.
static double cached_mha_vs_full(const ag_mha *m, ag_tensor *x, const int *chunks, int n) {
    const int B = x->shape[0], T = x->shape[1], E = x->shape[2];
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = ag_mha_forward(tp, m, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
    ag_kv_cache *c = ag_kv_cache_new(m, B, T);
    double worst = 0;
    for (int i = 0, t0 = 0; i < n; t0 += chunks[i++]) {
        const int k = chunks[i];
        ag_tensor *xt = ag_tensor_zeros(x->dtype, 3, (int[]){B, k, E});
        ag_tensor *out = ag_tensor_zeros(x->dtype, 3, (int[]){B, k, E});
        for (int b = 0; b < B; b++)
            for (int r = 0; r < k; r++)
                for (int e = 0; e < E; e++)
                    ag_tensor_set_item(xt, ((size_t)b * k + r) * E + e,
                                  ag_tensor_item(x, ((size_t)b * T + t0 + r) * E + e));
        CHECK(ag_mha_forward_cached(m, c, xt, out));
        CHECK(ag_kv_cache_len(c) == t0 + k);
        for (int b = 0; b < B; b++)
            for (int r = 0; r < k; r++)
                for (int e = 0; e < E; e++)
                    worst = fmax(worst,
                                 fabs(ag_tensor_item(out, ((size_t)b * k + r) * E + e) -
                                      ag_tensor_item(full, ((size_t)b * T + t0 + r) * E + e)));
        ag_tensor_free(xt), ag_tensor_free(out);
    }
    ag_kv_cache_free(c);
    ag_tape_free(tp);
    return worst;
}

// What the cache once refused (pruned heads, add_bias_kv, add_zero_attn) runs, and equals
// the full forward: everything ag_mha_init accepts runs in the cached path too.
static void test_cached_rows_equal_the_forward_with_pruned_heads_and_extra_keys(void) {
    enum { B = 2, T = 6 };
    const ag_mha_config cfgs[] = {
        {.embed_dim = E, .num_heads = H, .add_bias_kv = true},
        {.embed_dim = E, .num_heads = H, .add_zero_attn = true},
        {.embed_dim = E, .num_heads = H, .add_bias_kv = true, .add_zero_attn = true},
        {.embed_dim = E, .num_heads = H, .pos = AG_POS_RELATIVE, .max_distance = 3},
        {.embed_dim = E, .num_heads = H, .pos = AG_POS_ROPE},
    };
    const int one[T] = {1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 5; i++)
        for (int prune = 0; prune < 2; prune++) {
            ag_params *ps = ag_params_new(AG_F64);
            ag_pcg32 rng = ag_pcg32_make(30 + (uint64_t)i, 4);
            ag_mha m;
            CHECK(ag_mha_init(&m, ps, "attn", &cfgs[i], &rng));
            for (int p = 0; p < ag_params_count(ps); p++)
                ag_tensor_init_uniform(ag_params_at(ps, p), &rng, -0.6, 0.6);
            if (prune) CHECK(ag_mha_prune_heads(&m, ps, (int[]){2, 0}, 2));
            ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 40 + (uint64_t)i, -1, 1);
            CHECK(cached_mha_vs_full(&m, x, one, T) <= 1e-13);
            ag_tensor_free(x), ag_params_free(ps);
        }
}

// A step of several positions at once (a prompt) gives what one step each gives.
static void test_a_step_of_several_positions_equals_the_forward(void) {
    enum { B = 2, T = 9 };
    const int chunks[3] = {4, 1, 4};
    for (int i = 0; i < 5; i++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_pcg32 rng = ag_pcg32_make(50 + (uint64_t)i, 4);
        ag_mha m;
        ag_mha_config mc = {.embed_dim = E, .num_heads = H, .pos = every_scheme[i],
                            .max_distance = every_scheme[i] == AG_POS_T5 ? 20 : 3,
                            .num_buckets = 10};
        CHECK(ag_mha_init(&m, ps, "attn", &mc, &rng));
        for (int p = 0; p < ag_params_count(ps); p++)
            ag_tensor_init_uniform(ag_params_at(ps, p), &rng, -0.6, 0.6);
        ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 60 + (uint64_t)i, -1, 1);
        CHECK(cached_mha_vs_full(&m, x, chunks, 3) <= 1e-13);
        ag_tensor_free(x), ag_params_free(ps);
    }
}

// Issue 20, item 3: a cache made before ag_mha_prune_heads read past the pruned weights
// (valgrind: invalid reads; output inf). It is refused now, and a new cache runs.
static void test_a_cache_made_before_pruning_is_refused_after_it(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_mha m;
    CHECK(ag_mha_init(&m, ps, "a", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng));
    ag_tensor *x = uniform_tensor(AG_F64, 2, (int[]){1, E}, 5, -1, 1);
    ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){1, E});
    ag_kv_cache *c = ag_kv_cache_new(&m, 1, 4);
    CHECK(ag_mha_forward_cached(&m, c, x, out));
    CHECK(ag_mha_prune_heads(&m, ps, (int[]){1}, 1));
    testing_catch_errors();
    CHECK(!ag_mha_forward_cached(&m, c, x, out));
    CHECK(strcmp(testing_last_error,
                 "mha_forward_cached: the module changed since the cache was made (heads "
                 "pruned, or made again): make a new cache") == 0);
    testing_release_errors();
    ag_kv_cache *fresh = ag_kv_cache_new(&m, 1, 4);
    CHECK(ag_mha_forward_cached(&m, fresh, x, out));
    for (int e = 0; e < E; e++) CHECK(isfinite(ag_tensor_item(out, (size_t)e)));
    ag_kv_cache_free(c), ag_kv_cache_free(fresh);
    ag_tensor_free(x), ag_tensor_free(out), ag_params_free(ps);
}

static void test_cache_misuse_is_reported(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_mha m, other, cross;
    ag_mha_init(&m, ps, "a", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng);
    ag_mha_init(&other, ps, "o", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng);
    ag_mha_init(&cross, ps, "c", &(ag_mha_config){.embed_dim = E, .num_heads = H, .kdim = 5},
                &rng);
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){1, E});
    ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){1, E});
    ag_tensor *wrong = ag_tensor_zeros(AG_F32, 2, (int[]){1, E});
    testing_catch_errors();
    CHECK(ag_kv_cache_new(&cross, 1, 4) == NULL);
    CHECK(strstr(testing_last_error, "separate projections") != NULL);
    ag_kv_cache *c = ag_kv_cache_new(&m, 1, 2);
    CHECK(!ag_mha_forward_cached(&other, c, x, out));
    CHECK(strcmp(testing_last_error,
                 "mha_forward_cached: the cache was not made for this module") == 0);
    CHECK(!ag_mha_forward_cached(&m, c, wrong, out));
    CHECK(strcmp(testing_last_error, "mha_forward_cached: x f32 [1,16] must be f64 [rows,16] or "
                                     "[rows,n,16] with rows <= 1") == 0);
    CHECK(ag_mha_forward_cached(&m, c, x, out) && ag_mha_forward_cached(&m, c, x, out));
    CHECK(!ag_mha_forward_cached(&m, c, x, out));
    CHECK(strcmp(testing_last_error,
                 "mha_forward_cached: the cache is full (2 positions)") == 0);
    ag_kv_cache_reset(c);
    CHECK(ag_kv_cache_len(c) == 0 && ag_mha_forward_cached(&m, c, x, out));
    CHECK(testing_error_count == 4);
    testing_catch_errors();  // count afresh
    // NULL handles are named as such (a NULL cache was "not made for this module", and a
    // NULL list of rows "1 row" refused as if out of range).
    CHECK(!ag_mha_forward_cached(&m, NULL, x, out));
    CHECK(testing_error_was("mha_forward_cached: the cache is NULL"));
    CHECK(!ag_mha_forward_cached(NULL, c, x, out));
    CHECK(testing_error_was("mha_forward_cached: the module is NULL"));
    CHECK(!ag_kv_cache_reorder(c, NULL, 1));
    CHECK(testing_error_was("kv_cache_reorder: the list of rows `from` is NULL"));
    CHECK(!ag_sampler_new(4, NULL, 1, 1));
    CHECK(testing_error_was("sampler: the config is NULL"));
    CHECK(ag_sampler_next(NULL, x, 0) == -1);
    CHECK(testing_error_was("sampler: the sampler is NULL"));
    // out of x's size but another shape (rows and positions swapped) is refused, not
    // written in x's layout.
    ag_kv_cache *c2 = ag_kv_cache_new(&m, 2, 2);
    ag_tensor *x21 = ag_tensor_zeros(AG_F64, 3, (int[]){2, 1, E});
    ag_tensor *out12 = ag_tensor_zeros(AG_F64, 3, (int[]){1, 2, E});
    CHECK(!ag_mha_forward_cached(&m, c2, x21, out12));
    CHECK(testing_error_was("mha_forward_cached: out f64 [1,2,16] must be f64 [2,1,16], as x"));
    CHECK(ag_kv_cache_len(c2) == 0);
    ag_kv_cache_free(c2);
    ag_tensor_free(x21), ag_tensor_free(out12);
    testing_release_errors();
    ag_kv_cache_free(c);
    ag_tensor_free(x), ag_tensor_free(out), ag_tensor_free(wrong), ag_params_free(ps);
}

// A step of fewer rows, or a reorder to fewer, leaves the other sequences without those
// positions: stepping them again, or reordering from them, is refused (it read zeros, or
// another step's keys, silently); the rows still held run on, and a reset starts afresh.
static void test_rows_a_step_or_reorder_left_behind_are_refused(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_mha m;
    CHECK(ag_mha_init(&m, ps, "a", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng));
    ag_tensor *x3 = ag_tensor_uniform(AG_F64, 2, (int[]){3, E}, &rng, -1, 1);
    ag_tensor *x2 = ag_tensor_uniform(AG_F64, 2, (int[]){2, E}, &rng, -1, 1);
    ag_kv_cache *c = ag_kv_cache_new(&m, 3, 8);
    testing_catch_errors();
    CHECK(ag_mha_forward_cached(&m, c, x3, NULL) && ag_mha_forward_cached(&m, c, x2, NULL));
    CHECK(!ag_mha_forward_cached(&m, c, x3, NULL));
    CHECK(testing_error_was("mha_forward_cached: x [3,16] steps 3 sequences, but only the first "
                            "2 hold the 2 positions before (a step or a reorder since the last "
                            "reset ran only those)"));
    CHECK(!ag_kv_cache_reorder(c, (const int[]){2, 0}, 2));
    CHECK(testing_error_was("kv_cache_reorder: row 0 comes from row 2, but only the first 2 "
                            "hold the 2 positions stored"));
    CHECK(ag_kv_cache_reorder(c, (const int[]){1}, 1));
    CHECK(!ag_mha_forward_cached(&m, c, x2, NULL));
    CHECK(testing_error_was("mha_forward_cached: x [2,16] steps 2 sequences, but only the first "
                            "1 hold the 2 positions before (a step or a reorder since the last "
                            "reset ran only those)"));
    CHECK(ag_kv_cache_reorder(c, (const int[]){0, 0, 0}, 3));
    CHECK(ag_mha_forward_cached(&m, c, x3, NULL));
    ag_kv_cache_reset(c);
    CHECK(ag_mha_forward_cached(&m, c, x3, NULL));
    CHECK(testing_error_count == 0);
    testing_release_errors();
    ag_kv_cache_free(c);
    ag_tensor_free(x3), ag_tensor_free(x2), ag_params_free(ps);
}

static void test_gpt2_ends_built_in_give_the_callbacks_tokens(void) {
    for (int i = 0; i < 5; i++) {
        gpt *g = malloc(sizeof *g);
        gpt_init(g, AG_F64, true, AG_ACT_GELU, every_scheme[i], (attn_shape){0, 0});
        ag_decoder own = {g->blocks, LAYERS, 9, .embed_fn = gpt_embed, .head_fn = gpt_head,
                          .model = g};
        ag_decoder gpt2 = {g->blocks, LAYERS, 9, .wte = g->wte.weight, .wpe = g->wpe.weight,
                           .ln_f = &g->ln_f, .head = g->wte.weight};
        int32_t a[NEW], b[NEW], prompt[PROMPT] = {4, 9, 2};
        const ag_decoder *ds[2] = {&own, &gpt2};
        int32_t *outs[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            ag_generator *gen = ag_generator_new(ds[k]);
            ag_sampler *s = ag_sampler_new(V, &(ag_sample_config){1, 0, 1}, 7, 1);  // T = 1
            CHECK(ag_generate(gen, prompt, PROMPT, NEW, s, outs[k], NULL, NULL) == NEW);
            ag_sampler_free(s), ag_generator_free(gen);
        }
        CHECK(memcmp(a, b, sizeof a) == 0);
        ag_params_free(g->ps), free(g);
    }
}

static ag_tensor *wrong_embed(ag_tape *tp, const void *model, int32_t token, int pos) {
    (void)model, (void)token, (void)pos;
    return ag_tape_tensor(tp, AG_F64, 2, (int[]){1, E + 1});
}

static void test_generator_misuse_is_reported(void) {
    gpt *g = malloc(sizeof *g);
    gpt_init(g, AG_F64, true, AG_ACT_GELU, AG_POS_NONE, (attn_shape){0, 0});
    ag_sampler *s = ag_sampler_new(V, &(ag_sample_config){0, 0, 1}, 1, 1);
    testing_catch_errors();
    ag_decoder none = {g->blocks, 0, 8, .embed_fn = gpt_embed, .head_fn = gpt_head};
    CHECK(ag_generator_new(&none) == NULL);
    CHECK(strstr(testing_last_error, "generator: needs blocks") != NULL);
    ag_generator *gen = ag_generator_new(&(ag_decoder){g->blocks, LAYERS, 8,
                                                       .embed_fn = wrong_embed,
                                                       .head_fn = gpt_head, .model = g});
    int32_t ids[4] = {1, 2, 3, 4};
    CHECK(ag_generate(gen, ids, 2, 2, s, ids + 2, NULL, NULL) == 0);
    CHECK(strcmp(testing_last_error, "generate: embed gave f64 [1,17] for token 1, expected "
                                     "f64 [1,16]") == 0);
    CHECK(ag_generate(gen, ids, 0, 2, s, NULL, NULL, NULL) == 0);
    CHECK(testing_error_count == 3);
    // A block or module never made (zeroed: its init failed or was not called) is refused
    // with one line; the generator and the caches read its dtype through a NULL weight.
    testing_catch_errors();
    ag_block unmade[2] = {g->blocks[0]};
    CHECK(ag_generator_new(&(ag_decoder){unmade, 2, 8, .embed_fn = gpt_embed,
                                         .head_fn = gpt_head, .model = g}) == NULL);
    CHECK(testing_error_was("generator: block 1 is not made (no self_attn.out_proj.weight: its "
                            "init failed or was not called)"));
    CHECK(ag_kv_cache_new_block(&unmade[1], 1, 4) == NULL);
    CHECK(testing_error_was("kv_cache: needs self-attention (kdim = vdim = embed_dim), batch "
                            ">= 1 and max_len >= 1; got a module not made (no out_proj.weight: "
                            "its init failed or was not called), batch 1, max_len 4"));
    CHECK(ag_kv_cache_new(&(ag_mha){0}, 1, 4) == NULL);
    CHECK(testing_error_count == 1);
    testing_release_errors();
    ag_generator_free(gen);
    ag_sampler_free(s);
    ag_params_free(g->ps);
    free(g);
}

// A prompt token the built-in input cannot embed is one error naming the token and wte,
// reported before any step, not an embedding error followed by the add it broke.
static void test_a_prompt_token_outside_wte_is_one_error_before_any_step(void) {
    gpt *g = malloc(sizeof *g);
    gpt_init(g, AG_F64, true, AG_ACT_GELU, AG_POS_NONE, (attn_shape){0, 0});
    ag_generator *gen = ag_generator_new(&(ag_decoder){g->blocks, LAYERS, MAXLEN,
                                                       .wte = g->wte.weight,
                                                       .wpe = g->wpe.weight,
                                                       .head = g->wte.weight});
    ag_sampler *s = ag_sampler_new(V, &(ag_sample_config){0}, 1, 1);
    testing_catch_errors();
    CHECK(ag_generate(gen, (const int32_t[]){4, V, 2}, 3, 2, s, NULL, NULL, NULL) == 0);
    CHECK(testing_error_was("generate: prompt token 11 at 1 is outside [0, 11) (wte [11,16])"));
    CHECK(ag_generate(gen, (const int32_t[]){-1}, 1, 2, s, NULL, NULL, NULL) == 0);
    CHECK(testing_error_was("generate: prompt token -1 at 0 is outside [0, 11) (wte [11,16])"));
    testing_release_errors();
    ag_sampler_free(s);
    ag_generator_free(gen);
    ag_params_free(g->ps);
    free(g);
}

// ag_generator_new refuses, by name and shape, each end or block that would otherwise
// fail in the middle of a generation (where the default handler aborts).
static void test_generator_checks_every_end_and_block_at_creation(void) {
    gpt *g = malloc(sizeof *g), *g32 = malloc(sizeof *g32);
    gpt_init(g, AG_F64, true, AG_ACT_GELU, AG_POS_NONE, (attn_shape){0, 0});
    gpt_init(g32, AG_F32, true, AG_ACT_GELU, AG_POS_NONE, (attn_shape){0, 0});
    ag_tensor *wide = ag_tensor_zeros(AG_F64, 2, (int[]){V, E + 1});
    ag_tensor *longer = ag_tensor_zeros(AG_F64, 2, (int[]){V + 1, E});
    ag_tensor *short_bias = ag_tensor_zeros(AG_F64, 1, (int[]){E - 1});
    ag_layernorm_layer bad_ln = {g->ln_f.weight, short_bias, 1e-5};
    ag_block mixed[LAYERS] = {g->blocks[0], g32->blocks[1]};
    const ag_decoder good = {g->blocks, LAYERS, MAXLEN, .wte = g->wte.weight,
                             .wpe = g->wpe.weight, .ln_f = &g->ln_f, .head = g->wte.weight};
    ag_decoder d[8];
    for (int i = 0; i < 8; i++) d[i] = good;
    d[0].context = MAXLEN + 1;  // learned positions for 53, a window of 54
    d[1].head = wide, d[2].head = g32->wte.weight, d[3].head = longer;
    d[4].wte = wide, d[5].wpe = g32->wpe.weight, d[6].ln_f = &bad_ln, d[7].blocks = mixed;
    const char *expected[8] = {
        "generator: wpe [53,16] has 53 rows, fewer than the 54 it needs",
        "generator: head is f64 [11,17]; the blocks need f64 [V, 16] (d_model 16)",
        "generator: head is f32 [11,16]; the blocks need f64 [V, 16] (d_model 16)",
        "generator: head [12,16] draws tokens up to 11, but wte [11,16] has 11 rows",
        "generator: wte is f64 [11,17]; the blocks need f64 [V, 16] (d_model 16)",
        "generator: wpe is f32 [53,16]; the blocks need f64 [context, 16] (d_model 16)",
        "generator: ln_f.bias is f64 [15]; the blocks need f64 [16]",
        "generator: block 1 is f32 d_model 16; block 0 is f64 d_model 16"};
    testing_catch_errors();
    for (int i = 0; i < 8; i++) {
        ag_generator *gen = ag_generator_new(&d[i]);
        CHECK(gen == NULL && testing_error_was(expected[i]));
        ag_generator_free(gen);
    }
    testing_release_errors();
    // The callbacks' ends are the model's own business: only the blocks are checked.
    ag_decoder own = good;
    own.wte = NULL, own.wpe = wide, own.embed_fn = gpt_embed, own.model = g;
    ag_generator *gen = ag_generator_new(&own);
    CHECK(gen != NULL);
    ag_generator_free(gen);
    ag_tensor_free(wide), ag_tensor_free(longer), ag_tensor_free(short_bias);
    ag_params_free(g->ps), ag_params_free(g32->ps);
    free(g), free(g32);
}

// ---- The sampler ----------------------------------------------------------------------

static ag_tensor *logits_of(const double *z, int n) {
    return ag_tensor_from(AG_F64, 2, (int[]){1, n}, z);
}

static void test_greedy_top_1_and_tiny_top_p_all_take_the_argmax(void) {
    const double z[6] = {0.1, 2.0, -1.0, 2.0, 1.9, 0.0};  // a tie: the lower index wins
    ag_tensor *l = logits_of(z, 6);
    const ag_sample_config cfgs[3] = {{0, 0, 1}, {5.0, 1, 1}, {5.0, 0, 1e-9}};
    for (int i = 0; i < 3; i++) {
        ag_sampler *s = ag_sampler_new(6, &cfgs[i], 9, 1);
        for (int k = 0; k < 20; k++) CHECK(ag_sampler_next(s, l, 0) == 1);
        ag_sampler_free(s);
    }
    ag_tensor_free(l);
}

// Greedy decoding reads neither filter: a zeroed config is a valid greedy sampler.
static void test_a_zeroed_config_is_greedy(void) {
    const double z[5] = {0.3, -1.0, 2.5, 2.4, 0.0};
    ag_tensor *l = logits_of(z, 5);
    ag_sampler *s = ag_sampler_new(5, &(ag_sample_config){0}, 1, 1);
    CHECK(s != NULL);
    for (int k = 0; s && k < 10; k++) CHECK(ag_sampler_next(s, l, 0) == 2);
    ag_sampler_free(s);
    ag_tensor_free(l);
}

// A filter left 0 is off: {.temperature = T} draws from every token, as {T, 0, 1} does,
// draw for draw.
static void test_a_temperature_alone_samples_from_every_token(void) {
    const double z[4] = {0.5, 0.0, -0.5, 0.2};
    ag_tensor *l = logits_of(z, 4);
    ag_sampler *a = ag_sampler_new(4, &(ag_sample_config){.temperature = 2.0}, 3, 1);
    ag_sampler *b = ag_sampler_new(4, &(ag_sample_config){2.0, 0, 1}, 3, 1);
    int seen[4] = {0}, same = 0;
    for (int k = 0; a && b && k < 2000; k++) {
        int x = ag_sampler_next(a, l, 0);
        same += x == ag_sampler_next(b, l, 0);
        seen[x]++;
    }
    CHECK(same == 2000);
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] > 0 && seen[3] > 0);
    ag_sampler_free(a), ag_sampler_free(b);
    ag_tensor_free(l);
}

static void test_draws_follow_softmax_over_temperature(void) {
    const double z[4] = {1.0, 0.0, -1.0, 0.5};
    const double T = 1.5;
    ag_tensor *l = logits_of(z, 4);
    ag_sampler *s = ag_sampler_new(4, &(ag_sample_config){T, 0, 1}, 4, 2);
    enum { N = 40000 };
    int count[4] = {0};
    for (int k = 0; k < N; k++) count[ag_sampler_next(s, l, 0)]++;
    double Z = 0;
    for (int c = 0; c < 4; c++) Z += exp(z[c] / T);
    for (int c = 0; c < 4; c++) {
        double p = exp(z[c] / T) / Z, sd = sqrt(p * (1 - p) / N);
        CHECK(fabs((double)count[c] / N - p) < 5 * sd);
    }
    ag_sampler_free(s);
    ag_tensor_free(l);
}

static void test_top_k_and_top_p_keep_only_the_likeliest(void) {
    // Probabilities about 0.53, 0.20, 0.17, 0.07, 0.03.
    const double z[5] = {2.0, 1.0, 0.8, -0.1, -1.0};
    ag_tensor *l = logits_of(z, 5);
    ag_sampler *k2 = ag_sampler_new(5, &(ag_sample_config){1, 2, 1}, 1, 1);
    ag_sampler *p80 = ag_sampler_new(5, &(ag_sample_config){1, 0, 0.8}, 1, 1);
    int seen_k[5] = {0}, seen_p[5] = {0};
    for (int k = 0; k < 5000; k++)
        seen_k[ag_sampler_next(k2, l, 0)]++, seen_p[ag_sampler_next(p80, l, 0)]++;
    CHECK(seen_k[0] > 0 && seen_k[1] > 0 && seen_k[2] + seen_k[3] + seen_k[4] == 0);
    // 0.53 + 0.20 < 0.8 <= 0.53 + 0.20 + 0.17: the three likeliest.
    CHECK(seen_p[0] > 0 && seen_p[1] > 0 && seen_p[2] > 0 && seen_p[3] + seen_p[4] == 0);
    ag_sampler_free(k2), ag_sampler_free(p80);
    ag_tensor_free(l);
}

// Top-k over a byte vocabulary with many equal logits (and a few -inf): the k kept are
// the likeliest, equal ones by the lower index, as a comparison sort orders them.
static const double *sorted_p;
static int likelier_first(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    if (sorted_p[i] != sorted_p[j]) return sorted_p[i] > sorted_p[j] ? -1 : 1;
    return (i > j) - (i < j);
}

static void test_top_k_keeps_the_likeliest_and_equal_ones_by_lower_index(void) {
    enum { V = 256, K = 7, DRAWS = 2000 };
    const double T = 50;  // near-equal probabilities: every kept token is drawn
    ag_pcg32 rng = ag_pcg32_make(3, 3);
    double z[V], p[V], m = -INFINITY;
    int order[V];
    for (int c = 0; c < V; c++) {
        z[c] = c % 37 == 5 ? -INFINITY : floor(ag_pcg32_double(&rng) * 9) / 2;  // 0, 0.5 .. 4
        m = fmax(m, z[c]);
    }
    for (int c = 0; c < V; c++) p[c] = exp((z[c] - m) / T), order[c] = c;  // as the sampler
    sorted_p = p;
    qsort(order, V, sizeof *order, likelier_first);
    bool kept[V] = {false};
    for (int i = 0; i < K; i++) kept[order[i]] = true;
    CHECK(z[order[K - 1]] == z[order[K]]);  // the cut falls inside a run of equal logits
    ag_tensor *l = logits_of(z, V);
    ag_sampler *s = ag_sampler_new(V, &(ag_sample_config){T, K, 1}, 5, 1);
    int seen[V] = {0};
    for (int k = 0; k < DRAWS; k++) seen[ag_sampler_next(s, l, 0)]++;
    for (int c = 0; c < V; c++) CHECK(kept[c] ? seen[c] > 0 : seen[c] == 0);
    ag_sampler_free(s);
    ag_tensor_free(l);
}

// Top-p sorts only the tokens above (1 - top_p) / V of the mass when those reach top_p:
// draw for draw the same tokens as the whole vocabulary sorted by a comparison sort
// (likelier first, equal ones by index), kept by top-k then top-p, and drawn with the
// sampler's stream; over byte-vocabulary rows with runs of equal logits and -inf, flat
// rows and peaked ones, for several top_p and top_k.
static int reference_draw(const double *z, int V, const ag_sample_config *c, ag_pcg32 *rng) {
    double p[256], m = -INFINITY, total = 0;
    int order[256];
    for (int i = 0; i < V; i++) m = fmax(m, z[i]);
    for (int i = 0; i < V; i++) total += p[i] = exp((z[i] - m) / c->temperature), order[i] = i;
    sorted_p = p;
    qsort(order, (size_t)V, sizeof *order, likelier_first);
    int kept = c->top_k > 0 && c->top_k < V ? c->top_k : V;
    double acc = 0;
    for (int i = 0; i < kept; i++)
        if ((acc += p[order[i]] / total) >= c->top_p) {
            kept = i + 1;
            break;
        }
    total = 0;
    for (int i = 0; i < kept; i++) total += p[order[i]];
    const double u = ag_pcg32_double(rng) * total;
    acc = 0;
    for (int i = 0; i < kept; i++)
        if (u < (acc += p[order[i]])) return order[i];
    return order[kept - 1];
}

static void test_top_p_draws_equal_a_full_sort_draw_for_draw(void) {
    enum { V = 256, ROWS = 300 };
    const ag_sample_config cfgs[] = {{0.8, 0, 0.95}, {1.0, 0, 0.5}, {2.0, 0, 0.999},
                                     {0.8, 3, 0.95}, {1.5, 40, 0.9}, {30, 0, 0.95},
                                     // Probabilities alike in their high bits, unlike in
                                     // their low ones: runs longer than insertion sorts.
                                     {1e9, 10, 1}, {1e9, 0, 0.3}, {1e9, 100, 0.9}};
    ag_pcg32 zr = ag_pcg32_make(11, 2);
    int differ = 0;
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        ag_sampler *s = ag_sampler_new(V, &cfgs[k], 7, 3);
        ag_pcg32 rng = ag_pcg32_make(7, 3);
        for (int r = 0; r < ROWS; r++) {
            double z[V];
            const double spread = r % 3 == 0 ? 0.5 : r % 3 == 1 ? 4 : 12;
            for (int c = 0; c < V; c++)
                z[c] = c % 41 == 7 ? -INFINITY : floor(ag_pcg32_double(&zr) * spread * 4) / 4;
            ag_tensor *l = logits_of(z, V);
            differ += ag_sampler_next(s, l, 0) != reference_draw(z, V, &cfgs[k], &rng);
            ag_tensor_free(l);
        }
        ag_sampler_free(s);
    }
    CHECK(differ == 0);
}

// A draw with top-k over a GPT-2-sized vocabulary whose probabilities agree in their first
// 20 mantissa bits (a temperature far above the logits' spread): the sort orders such a
// run by its low bits (it took about V^2 / 4 insertion moves before; the time is not
// asserted here), and the draw keeps to the top k.
static void test_a_draw_from_nearly_equal_probabilities_keeps_to_the_top_k(void) {
    enum { VOCAB = 50257, DRAWS = 20 };
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_tensor *z = ag_tensor_uniform(AG_F32, 2, (int[]){1, VOCAB}, &rng, -10, 10);
    ag_sampler *s = ag_sampler_new(VOCAB, &(ag_sample_config){1e10, 50, 1}, 1, 1);
    int tokens[DRAWS];
    for (int k = 0; k < DRAWS; k++) tokens[k] = ag_sampler_next(s, z, 0);
    // Top-k keeps the 50 largest logits (probabilities fall with them, however little).
    const float *zf = ag_tensor_f32(z);
    for (int k = 0; k < DRAWS; k++) {
        CHECK(tokens[k] >= 0);
        int above = 0;
        for (int c = 0; tokens[k] >= 0 && c < VOCAB; c++) above += zf[c] > zf[tokens[k]];
        CHECK(above < 50);
    }
    ag_sampler_free(s);
    ag_tensor_free(z);
}

static void test_same_seed_same_draws_other_seed_other_draws(void) {
    const double z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    ag_tensor *l = logits_of(z, 8);
    ag_sample_config c = {1, 0, 1};
    ag_sampler *a = ag_sampler_new(8, &c, 5, 1), *b = ag_sampler_new(8, &c, 5, 1);
    ag_sampler *d = ag_sampler_new(8, &c, 6, 1);
    int same = 0, differ = 0;
    for (int k = 0; k < 100; k++) {
        int x = ag_sampler_next(a, l, 0);
        same += x == ag_sampler_next(b, l, 0);
        differ += x != ag_sampler_next(d, l, 0);
    }
    CHECK(same == 100 && differ > 50);
    ag_sampler_free(a), ag_sampler_free(b), ag_sampler_free(d);
    ag_tensor_free(l);
}

static void test_a_nan_row_is_an_error_not_a_token(void) {
    const double z[6] = {0, 1, 2, 3, 4, 5};
    ag_tensor *l = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, z);
    ag_tensor_set_item(l, 4, NAN);
    ag_sampler *s = ag_sampler_new(3, &(ag_sample_config){0, 0, 1}, 1, 1);
    testing_catch_errors();
    CHECK(ag_sampler_next(s, l, 0) == 2);
    CHECK(ag_sampler_next(s, l, 1) == -1);
    CHECK(strcmp(testing_last_error, "sampler: row 1 of logits [2,3] holds a NaN") == 0);
    CHECK(ag_sampler_next(s, l, 2) == -1);
    CHECK(ag_sampler_new(3, &(ag_sample_config){-1, 0, 1}, 1, 1) == NULL);
    CHECK(ag_sampler_new(3, &(ag_sample_config){1, 0, 1.5}, 1, 1) == NULL);
    CHECK(testing_error_count == 4);
    testing_release_errors();
    ag_sampler_free(s);
    ag_tensor_free(l);
}

// A gradient's view that no backward has reached has no data: reported, as every function
// of tensor.h reports it, not read (it was a NULL dereference).
static void test_logits_without_data_are_an_error_not_a_token(void) {
    ag_tensor *l = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    ag_tensor g = ag_tensor_grad_view(l);
    ag_sampler *s = ag_sampler_new(3, &(ag_sample_config){0, 0, 1}, 1, 1);
    testing_catch_errors();
    CHECK(ag_sampler_next(s, &g, 0) == -1);
    CHECK(testing_error_was("sampler: logits [2,3] have no data (a gradient view no backward "
                            "has reached)"));
    testing_release_errors();
    ag_sampler_free(s);
    ag_tensor_free(l);
}

// A row in which no token has a finite probability is reported, as a NaN row is, and
// gives -1: all -inf (softmax 0/0, whatever the temperature; greedy included), and a +inf
// when sampling (exp(inf - inf) is NaN: PyTorch's multinomial raises there).
static void test_a_row_without_a_finite_probability_is_an_error_not_a_token(void) {
    const double inf = INFINITY;
    const double z[9] = {-inf, -inf, -inf, 0, inf, 1, -inf, 2, -inf};
    ag_tensor *l = ag_tensor_from(AG_F64, 2, (int[]){3, 3}, z);
    ag_sampler *greedy = ag_sampler_new(3, &(ag_sample_config){0, 0, 1}, 1, 1);
    ag_sampler *hot = ag_sampler_new(3, &(ag_sample_config){1, 0, 1}, 1, 1);
    ag_sampler *top = ag_sampler_new(3, &(ag_sample_config){0.7, 2, 0.9}, 1, 1);
    testing_catch_errors();
    ag_sampler *all[3] = {greedy, hot, top};
    for (int k = 0; k < 3; k++) {
        CHECK(ag_sampler_next(all[k], l, 0) == -1);
        CHECK(testing_error_was("sampler: row 0 of logits [3,3] is all -inf: no token has a "
                                "probability"));
    }
    CHECK(ag_sampler_next(greedy, l, 1) == 1);  // the arg max, +inf, as torch.argmax
    CHECK(testing_error_count == 0);
    CHECK(ag_sampler_next(hot, l, 1) == -1);
    CHECK(testing_error_was("sampler: row 1 of logits [3,3] holds +inf: its probabilities at "
                            "temperature 1 are NaN"));
    CHECK(ag_sampler_next(top, l, 1) == -1);
    CHECK(testing_error_was("sampler: row 1 of logits [3,3] holds +inf: its probabilities at "
                            "temperature 0.7 are NaN"));
    // -inf among finite logits is a token of probability 0, never drawn.
    for (int i = 0; i < 200; i++) CHECK(ag_sampler_next(hot, l, 2) == 1);
    CHECK(testing_error_count == 0);
    testing_release_errors();
    ag_sampler_free(greedy), ag_sampler_free(hot), ag_sampler_free(top);
    ag_tensor_free(l);
}

// A cache step's x or out, or a sampler's logits, of the right shape but the wrong dtype:
// the message names the dtype, where "x [1,8] must be f64 [rows,8] ..." showed a shape
// that fits and nothing wrong.
static void test_a_step_or_logits_of_the_wrong_dtype_are_named_so(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    CHECK(mha_random(&m, ps, &(ag_mha_config){.embed_dim = 8, .num_heads = 2}, 1));
    ag_kv_cache *c = ag_kv_cache_new(&m, 1, 2);
    ag_tensor *x32 = ag_tensor_zeros(AG_F32, 2, (int[]){1, 8});
    ag_tensor *x64 = ag_tensor_zeros(AG_F64, 2, (int[]){1, 8});
    ag_tensor *out32 = ag_tensor_zeros(AG_F32, 2, (int[]){1, 8});
    ag_tensor *logits = ag_tensor_zeros(AG_I32, 1, (int[]){5});
    ag_sampler *s = ag_sampler_new(5, &(ag_sample_config){0}, 1, 1);
    testing_catch_errors();
    CHECK(!ag_mha_forward_cached(&m, c, x32, x32));
    CHECK(testing_error_was("mha_forward_cached: x f32 [1,8] must be f64 [rows,8] or "
                            "[rows,n,8] with rows <= 1"));
    CHECK(!ag_mha_forward_cached(&m, c, x64, out32));
    CHECK(testing_error_was("mha_forward_cached: out f32 [1,8] must be f64 [1,8], as x"));
    CHECK(ag_sampler_next(s, logits, 0) == -1);
    CHECK(testing_error_was("sampler: logits i32 [5] must be f32 or f64 [..., 5]"));
    testing_release_errors();
    ag_sampler_free(s);
    ag_kv_cache_free(c);
    ag_tensor_free(x32);
    ag_tensor_free(x64);
    ag_tensor_free(out32);
    ag_tensor_free(logits);
    ag_params_free(ps);
}

int main(void) {
    RUN(test_cached_generation_equals_full_recomputation_for_50_tokens_f64);
    RUN(test_a_full_context_starts_again_from_its_second_half);
    RUN(test_gpt2_ends_built_in_give_the_callbacks_tokens);
    RUN(test_windowed_blocks_slide_and_equal_the_whole_forward);
    RUN(test_windowed_blocks_with_learned_positions_start_again);
    RUN(test_cached_generation_in_f32_stays_close_to_full);
    RUN(test_a_cached_step_allocates_nothing);
    RUN(test_bf16_generation_matches_the_autocast_forward_and_allocates_nothing);
    RUN(test_bf16_generation_reads_the_parameters_as_each_generation_starts);
    RUN(test_bf16_generation_follows_a_training_step_and_repeats_without_one);
    RUN(test_mha_cached_rows_equal_causal_forward_for_a_batch);
    RUN(test_cached_rows_equal_the_forward_with_pruned_heads_and_extra_keys);
    RUN(test_a_generator_made_before_pruning_says_to_make_a_new_generator);
    RUN(test_a_generation_from_inside_one_is_refused);
    RUN(test_a_step_of_several_positions_equals_the_forward);
    RUN(test_a_cache_made_before_pruning_is_refused_after_it);
    RUN(test_cache_misuse_is_reported);
    RUN(test_rows_a_step_or_reorder_left_behind_are_refused);
    RUN(test_generator_misuse_is_reported);
    RUN(test_generator_checks_every_end_and_block_at_creation);
    RUN(test_a_prompt_token_outside_wte_is_one_error_before_any_step);
    RUN(test_greedy_top_1_and_tiny_top_p_all_take_the_argmax);
    RUN(test_a_zeroed_config_is_greedy);
    RUN(test_a_temperature_alone_samples_from_every_token);
    RUN(test_draws_follow_softmax_over_temperature);
    RUN(test_top_k_and_top_p_keep_only_the_likeliest);
    RUN(test_top_k_keeps_the_likeliest_and_equal_ones_by_lower_index);
    RUN(test_top_p_draws_equal_a_full_sort_draw_for_draw);
    RUN(test_a_draw_from_nearly_equal_probabilities_keeps_to_the_top_k);
    RUN(test_same_seed_same_draws_other_seed_other_draws);
    RUN(test_a_nan_row_is_an_error_not_a_token);
    RUN(test_logits_without_data_are_an_error_not_a_token);
    RUN(test_a_row_without_a_finite_probability_is_an_error_not_a_token);
    RUN(test_a_step_or_logits_of_the_wrong_dtype_are_named_so);
    return testing_summary();
}
