// Grouped-query and multi-query attention in the modules (ag_mha_config.num_kv_heads):
// the parameters it makes, pruning whole groups (and refusing to split one), the KV cache
// storing only the kv heads (its bytes divided by the group size), a block decoding
// through its cache as its forward gives, and a checkpoint of a pruned grouped module.
// Its paths (fused, composed, cached) against each other are in test_mha_paths.c and
// against PyTorch in test_mha_pytorch.c.
#include <stdlib.h>

#include "op_checks.h"


static bool shape_is(const ag_tensor *t, int rows, int cols) {
    return t && t->ndim == (cols ? 2 : 1) && t->shape[0] == rows && (!cols || t->shape[1] == cols);
}

static void test_kv_projections_make_only_the_kv_heads(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    const ag_mha_config gqa = {.embed_dim = 12, .num_heads = 6, .num_kv_heads = 2};
    CHECK(mha_random(&m, ps, &gqa, 1));
    CHECK(m.cfg.num_kv_heads == 2 && m.head_dim == 2 && !m.in_proj_weight);
    CHECK(shape_is(ag_params_find(ps, "attn.q_proj_weight"), 12, 12));
    CHECK(shape_is(ag_params_find(ps, "attn.k_proj_weight"), 4, 12));
    CHECK(shape_is(ag_params_find(ps, "attn.v_proj_weight"), 4, 12));
    CHECK(shape_is(ag_params_find(ps, "attn.in_proj_bias"), 20, 0));
    CHECK(shape_is(ag_params_find(ps, "attn.out_proj.weight"), 12, 12));
    ag_params_free(ps);
    ps = ag_params_new(AG_F64);  // num_kv_heads = num_heads is plain attention, packed
    const ag_mha_config as_many = {.embed_dim = 12, .num_heads = 6, .num_kv_heads = 6};
    CHECK(mha_random(&m, ps, &as_many, 1));
    CHECK(shape_is(m.in_proj_weight, 36, 12) && m.cfg.num_kv_heads == 6);
    ag_params_free(ps);
    ps = ag_params_new(AG_F64);  // 0 means num_heads
    CHECK(mha_random(&m, ps, &(ag_mha_config){.embed_dim = 12, .num_heads = 6}, 1));
    CHECK(m.in_proj_weight && m.cfg.num_kv_heads == 6);
    ag_params_free(ps);
}

static void test_init_refuses_kv_heads_that_do_not_divide_the_heads(void) {
    const int bad[] = {4, 5, -1};
    testing_catch_errors();
    for (int i = 0; i < 3; i++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_mha m;
        const ag_mha_config cfg = {.embed_dim = 12, .num_heads = 6, .num_kv_heads = bad[i]};
        CHECK(!mha_random(&m, ps, &cfg, 1));
        char want[120];
        snprintf(want, sizeof want,
                 "mha: num_kv_heads %d must divide num_heads 6 (0 means num_heads)", bad[i]);
        CHECK(testing_error_was(want));
        CHECK(ag_params_count(ps) == 0);
        ag_params_free(ps);
    }
    testing_release_errors();
}

// Output, and the gradient of the input, of a self-attention forward with `head_mask`.
static double *forward(const ag_mha *m, ag_tensor *x, ag_tensor *head_mask, bool causal) {
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_mha_forward(tp, m, x, x, x,
                                  &(ag_mha_opts){.causal = causal, .head_mask = head_mask}, NULL);
    CHECK(y != NULL);
    ag_tensor *dy = uniform_tensor(AG_F64, 3, y->shape, 5, -1, 1);
    ag_backward_with(tp, y, dy);
    double *v = malloc((y->numel + x->numel) * sizeof *v);
    for (size_t e = 0; e < y->numel; e++) v[e] = ag_tensor_item(y, e);
    for (size_t e = 0; e < x->numel; e++) v[y->numel + e] = ag_tensor_grad_item(x, e);
    ag_tensor_free(dy);
    ag_tape_free(tp);
    return v;
}

static void test_pruning_a_whole_group_equals_masking_its_heads(void) {
    const ag_mha_config cfg = {.embed_dim = 12, .num_heads = 6, .num_kv_heads = 3,
                               .pos = AG_POS_ROPE, .add_bias_kv = false};
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    CHECK(mha_random(&m, ps, &cfg, 3));
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){2, 5, 12}, 4);
    ag_tensor *mask = ag_tensor_ones(AG_F64, 1, (int[]){6});
    ag_tensor_set_item(mask, 2, 0.0);
    ag_tensor_set_item(mask, 3, 0.0);  // heads 2 and 3: the group of kv head 1
    double *masked = forward(&m, x, mask, true);
    const uint64_t version = m.version;
    CHECK(ag_mha_prune_heads(&m, ps, (int[]){3, 2}, 2));
    CHECK(m.cfg.num_heads == 4 && m.cfg.num_kv_heads == 2 && m.version != version);
    CHECK(shape_is(m.q_proj_weight, 8, 12) && shape_is(m.k_proj_weight, 4, 12) &&
          shape_is(m.v_proj_weight, 4, 12) && shape_is(m.in_proj_bias, 16, 0) &&
          shape_is(m.out_proj.weight, 12, 8));
    double *pruned = forward(&m, x, NULL, true);
    normwise e = {0, 0};
    for (size_t i = 0; i < 2 * x->numel; i++) normwise_add(&e, pruned[i], masked[i]);
    CHECK(normwise_result(e) < 1e-14);
    free(masked), free(pruned);
    ag_tensor_free(mask);
    ag_tensor_free(x);
    ag_params_free(ps);
}

static void test_pruning_part_of_a_group_is_refused_and_changes_nothing(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    const ag_mha_config cfg = {.embed_dim = 12, .num_heads = 6, .num_kv_heads = 2};
    CHECK(mha_random(&m, ps, &cfg, 5));
    const size_t numel = ag_params_numel(ps);
    const uint64_t version = m.version;
    testing_catch_errors();
    CHECK(!ag_mha_prune_heads(&m, ps, (int[]){3, 4}, 2));
    CHECK(testing_error_was("mha_prune_heads: the list splits the group of heads 3 to 5 (which "
                            "read kv head 1): with num_kv_heads 2 < num_heads 6 only whole "
                            "groups can be pruned"));
    CHECK(!ag_mha_prune_heads(&m, ps, (int[]){0, 1, 2, 3, 4, 5}, 6));
    CHECK(testing_error_was("mha_prune_heads: cannot prune 6 of 6 heads (at least one must "
                            "stay)"));
    testing_release_errors();
    CHECK(ag_params_numel(ps) == numel && m.version == version && m.cfg.num_heads == 6 &&
          m.cfg.num_kv_heads == 2);
    CHECK(ag_mha_prune_heads(&m, ps, (int[]){0, 1, 2}, 3));  // a whole group
    CHECK(m.cfg.num_heads == 3 && m.cfg.num_kv_heads == 1);
    ag_params_free(ps);
}

// bytes of a cache for one module of h heads, h_kv of them for k and v
static size_t cache_bytes(int h, int kvh) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_mha m;
    const ag_mha_config cfg = {.embed_dim = 64, .num_heads = h, .num_kv_heads = kvh};
    CHECK(mha_random(&m, ps, &cfg, 6));
    ag_kv_cache *c = ag_kv_cache_new(&m, 2, 100);
    const size_t bytes = ag_kv_cache_bytes(c);
    ag_kv_cache_free(c);
    ag_params_free(ps);
    return bytes;
}

static void test_a_cache_stores_only_the_kv_heads(void) {
    const size_t full = cache_bytes(8, 0);
    CHECK(full == 2 * (size_t)2 * 100 * 64 * sizeof(float));  // k and v, [2, 100, 64] each
    CHECK(cache_bytes(8, 2) * 4 == full);
    CHECK(cache_bytes(8, 1) * 8 == full);  // multi-query
    CHECK(ag_kv_cache_bytes(NULL) == 0);
}

// A pre-LN block with grouped-query attention and RoPE, position by position through its
// cache, as its causal forward over the whole sequence.
static void test_a_grouped_block_decodes_through_its_cache_as_its_forward(void) {
    enum { B = 2, T = 7, E = 12 };
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(7, 7);
    ag_block b;
    CHECK(ag_block_init(&b, ps, "layer",
                        &(ag_block_config){.d_model = E, .num_heads = 6, .num_kv_heads = 2,
                                           .dim_feedforward = 16, .norm_first = true,
                                           .pos = AG_POS_ROPE},
                        &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.5, 0.5);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 8, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = ag_block_forward(tp, &b, x, &(ag_block_opts){.causal = true});
    ag_kv_cache *c = ag_kv_cache_new_block(&b, B, T);
    CHECK(full && c);
    ag_tensor *step = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    normwise e = {0, 0};
    for (int t = 0; full && c && t < T; t++) {
        for (int r = 0; r < B; r++)
            for (int i = 0; i < E; i++)
                ag_tensor_set_item(step, (size_t)r * E + i,
                              ag_tensor_item(x, ((size_t)r * T + t) * E + i));
        CHECK(ag_block_forward_cached(&b, c, step));
        for (int r = 0; r < B; r++)
            for (int i = 0; i < E; i++)
                normwise_add(&e, ag_tensor_item(step, (size_t)r * E + i),
                             ag_tensor_item(full, ((size_t)r * T + t) * E + i));
    }
    CHECK(normwise_result(e) < 1e-13);
    ag_tensor_free(step);
    ag_kv_cache_free(c);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
}

static void test_a_pruned_grouped_module_checkpoints_and_reloads(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    const ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2};
    CHECK(mha_random(&m, ps, &cfg, 9));
    CHECK(ag_mha_prune_heads(&m, ps, (int[]){0, 1}, 2));
    char path[] = "test_mha_gqa.safetensors", heads[16], kv[16];
    snprintf(heads, sizeof heads, "%d", m.cfg.num_heads);
    snprintf(kv, sizeof kv, "%d", m.cfg.num_kv_heads);
    ag_err err;
    CHECK(ag_params_save(ps, path,
                         (const char *[]){"attn.num_heads", heads, "attn.num_kv_heads", kv, NULL},
                         &err) == 0);
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st != NULL);
    ag_mha_config back = {.embed_dim = 8,
                          .num_heads = atoi(ag_safetensors_meta(st, "attn.num_heads")),
                          .num_kv_heads = atoi(ag_safetensors_meta(st, "attn.num_kv_heads")),
                          .head_dim = m.head_dim};
    ag_params *ps2 = ag_params_new(AG_F64);
    ag_mha re;
    CHECK(mha_random(&re, ps2, &back, 10));
    CHECK(ag_params_load(ps2, path, &err) == 0);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){2, 3, 8}, 12, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y1 = ag_mha_forward(tp, &m, x, x, x, NULL, NULL);
    ag_tensor *y2 = ag_mha_forward(tp, &re, x, x, x, NULL, NULL);
    CHECK(y1 && y2 && normwise_error(y2, y1, false) == 0.0);
    // Full attention of the same widths does not load it: its names and shapes differ.
    ag_params *ps3 = ag_params_new(AG_F64);
    ag_mha plain;
    const ag_mha_config narrow = {.embed_dim = 8, .num_heads = 2, .head_dim = 2};
    CHECK(mha_random(&plain, ps3, &narrow, 11));
    CHECK(ag_params_load(ps3, path, &err) != 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_safetensors_free(st);
    ag_params_free(ps);
    ag_params_free(ps2);
    ag_params_free(ps3);
    remove(path);
}

// A float64 gradcheck of grouped-query and multi-query modules, fused and composed: the
// narrower k and v projections and their part of in_proj_bias, with masks, cross-attention
// of other widths, bias_k and bias_v, no bias with RoPE.
static void test_gradcheck_of_grouped_query_modules(void) {
    ag_tensor *kpm = bool_mask(2, (int[]){2, 4}, 0.3, 3);
    ag_tensor *am = uniform_tensor(AG_F64, 2, (int[]){4, 4}, 5, -1, 1);
    for (int w = 0; w < 2; w++) {
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2},
                            (ag_mha_opts){.causal = true}, true, w, NULL, 0, 10));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .num_kv_heads = 1},
                            (ag_mha_opts){.key_padding_mask = kpm, .attn_mask = am}, true, w,
                            NULL, 0, 20));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2,
                                             .kdim = 6, .vdim = 5},
                            (ag_mha_opts){0}, false, w, NULL, 0, 30));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2,
                                             .add_bias_kv = true, .add_zero_attn = true},
                            (ag_mha_opts){.causal = true}, true, w, NULL, 0, 40));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2,
                                             .no_bias = true, .pos = AG_POS_ROPE},
                            (ag_mha_opts){.causal = true}, true, w, NULL, 0, 50));
        // A whole group pruned: heads 2 and 3 with their kv head.
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2},
                            (ag_mha_opts){.causal = true}, true, w, (int[]){2, 3}, 2, 60));
    }
    ag_tensor_free(kpm);
    ag_tensor_free(am);
}

int main(void) {
    RUN(test_kv_projections_make_only_the_kv_heads);
    RUN(test_init_refuses_kv_heads_that_do_not_divide_the_heads);
    RUN(test_pruning_a_whole_group_equals_masking_its_heads);
    RUN(test_pruning_part_of_a_group_is_refused_and_changes_nothing);
    RUN(test_a_cache_stores_only_the_kv_heads);
    RUN(test_a_grouped_block_decodes_through_its_cache_as_its_forward);
    RUN(test_a_pruned_grouped_module_checkpoints_and_reloads);
    RUN(test_gradcheck_of_grouped_query_modules);
    return testing_summary();
}
