// Module names are names: every *_init takes the module's name as
// torch.nn.Module.state_dict makes it ("head" -> head.weight, head.bias) and refuses,
// with one line, a name PyTorch never makes (a trailing dot, an empty component).
#include "testing.h"

static bool has(const ag_params *ps, const char *name) { return ag_params_find(ps, name); }

static ag_params *ps;  // each test's store, made by fresh()
static ag_pcg32 rng;

static void fresh(void) {
    ag_params_free(ps);
    ps = ag_params_new(AG_F32);
    rng = ag_pcg32_make(1, 1);
}

static void test_linear_named_head_owns_head_weight_and_head_bias(void) {
    fresh();
    ag_linear_layer l;
    CHECK(ag_linear_layer_init(&l, ps, "head", 4, 3, true, &rng));
    CHECK(ag_params_count(ps) == 2);
    CHECK(l.weight == ag_params_find(ps, "head.weight"));
    CHECK(l.bias == ag_params_find(ps, "head.bias"));
}

static void test_layernorm_and_embedding_take_dotted_names(void) {
    fresh();
    ag_layernorm_layer n;
    ag_embedding_layer e;
    CHECK(ag_layernorm_layer_init(&n, ps, "decoder.norm", 4));
    CHECK(ag_embedding_layer_init(&e, ps, "src_emb", 10, 4, &rng));
    CHECK(has(ps, "decoder.norm.weight") && has(ps, "decoder.norm.bias"));
    CHECK(has(ps, "src_emb.weight"));
    CHECK(ag_params_count(ps) == 3);
}

static void test_root_module_names_its_tensors_by_themselves(void) {
    fresh();
    ag_mha m;
    CHECK(ag_mha_init(&m, ps, "", &(ag_mha_config){.embed_dim = 4, .num_heads = 2}, &rng));
    CHECK(has(ps, "in_proj_weight") && has(ps, "out_proj.weight"));
    ag_params *ps2 = ag_params_new(AG_F32);
    ag_linear_layer l;
    CHECK(ag_linear_layer_init(&l, ps2, NULL, 4, 3, false, &rng));
    CHECK(ag_params_count(ps2) == 1 && has(ps2, "weight"));
    ag_params_free(ps2);
}

static void test_nested_modules_join_their_names_with_dots(void) {
    fresh();
    ag_mha m;
    ag_block b;
    CHECK(ag_mha_init(&m, ps, "attn", &(ag_mha_config){.embed_dim = 4, .num_heads = 2}, &rng));
    CHECK(ag_block_init(&b, ps, "encoder.layers.3",
                        &(ag_block_config){.d_model = 4, .num_heads = 2, .dim_feedforward = 8},
                        &rng));
    CHECK(has(ps, "attn.in_proj_weight") && has(ps, "attn.out_proj.bias"));
    CHECK(has(ps, "encoder.layers.3.self_attn.out_proj.weight"));
    CHECK(has(ps, "encoder.layers.3.linear2.bias") && has(ps, "encoder.layers.3.norm2.weight"));
}

// Each init refuses each malformed name, names itself and the name in one line, and
// leaves the store as it was.
static void test_a_name_with_an_empty_component_is_refused_by_every_init(void) {
    const char *bad[] = {"head.", ".head", "a..b", "."};
    const char *ops[] = {"linear_layer_init", "layernorm_layer_init", "embedding_layer_init",
                         "mha_init", "block_init"};
    fresh();
    testing_catch_errors();
    for (int i = 0; i < 4; i++) {
        for (int op = 0; op < 5; op++) {
            testing_last_error[0] = 0;
            ag_linear_layer l;
            ag_layernorm_layer n;
            ag_embedding_layer e;
            ag_mha m;
            ag_block b;
            bool ok = true;
            switch (op) {
            case 0: ok = ag_linear_layer_init(&l, ps, bad[i], 4, 3, true, &rng); break;
            case 1: ok = ag_layernorm_layer_init(&n, ps, bad[i], 4); break;
            case 2: ok = ag_embedding_layer_init(&e, ps, bad[i], 5, 4, &rng); break;
            case 3:
                ok = ag_mha_init(&m, ps, bad[i], &(ag_mha_config){.embed_dim = 4, .num_heads = 2},
                                 &rng);
                break;
            default:
                ok = ag_block_init(&b, ps, bad[i],
                                   &(ag_block_config){.d_model = 4, .num_heads = 2,
                                                      .dim_feedforward = 8},
                                   &rng);
            }
            CHECK(!ok);
            CHECK(strstr(testing_last_error, ops[op]) == testing_last_error);
            char quoted[16];
            snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
            CHECK(strstr(testing_last_error, quoted));
            CHECK(!strchr(testing_last_error, '\n'));
        }
    }
    testing_release_errors();
    CHECK(ag_params_count(ps) == 0);
}

// Dropout streams derive from the names: two modules of different names draw
// different masks, and the same name draws the same mask in another store.
static void test_dropout_streams_follow_the_module_name(void) {
    fresh();
    ag_mha_config cfg = {.embed_dim = 4, .num_heads = 2, .dropout = 0.5};
    ag_mha a, b, a2;
    CHECK(ag_mha_init(&a, ps, "a", &cfg, &rng));
    CHECK(ag_mha_init(&b, ps, "b", &cfg, &rng));
    ag_params *ps2 = ag_params_new(AG_F32);
    CHECK(ag_mha_init(&a2, ps2, "a", &cfg, &rng));
    CHECK(a.site != b.site);
    CHECK(a.site == a2.site);
    ag_params_free(ps2);
}

// A size the store refuses is one line per init call, as any bad argument: LayerNorm went
// on to add its bias after its weight was refused and reported both.
static void test_a_bad_size_is_one_line_per_init(void) {
    fresh();
    testing_catch_errors();
    ag_linear_layer l;
    ag_layernorm_layer n;
    ag_embedding_layer e;
    int before = testing_error_count;
    CHECK(!ag_layernorm_layer_init(&n, ps, "norm", 0));
    CHECK(testing_error_count == before + 1);
    CHECK(!ag_linear_layer_init(&l, ps, "proj", 0, 3, true, &rng));
    CHECK(testing_error_count == before + 2);
    CHECK(!ag_embedding_layer_init(&e, ps, "emb", 5, -1, &rng));
    CHECK(testing_error_count == before + 3);
    testing_release_errors();
    CHECK(ag_params_count(ps) == 0);
}

// The parameters' values, in store order, for comparing two stores.
static bool same_values(const ag_params *a, const ag_params *b) {
    if (ag_params_count(a) != ag_params_count(b)) return false;
    for (int i = 0; i < ag_params_count(a); i++) {
        const ag_tensor *x = ag_params_at(a, i), *y = ag_params_at(b, i);
        if (strcmp(x->name, y->name) != 0 || x->numel != y->numel ||
            memcmp(x->data, y->data, x->numel * sizeof(float)) != 0)
            return false;
    }
    return true;
}

// An init that fails part-way (here: its last parameter's name is taken) takes back what
// it added and the generator's draws: the store held orphans that the optimizer trained
// and a checkpoint saved, and a retry drew other values than a first try.
static void test_an_init_that_fails_part_way_leaves_store_and_generator_as_they_were(void) {
    const ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6};
    enum { BLOCK, DECODER, MHA, ENCODER, TRANSFORMER, KINDS };
    const char *taken[KINDS] = {"m.norm2.bias", "m.norm3.bias", "m.out_proj.bias",
                                "m.norm.bias", "m.decoder.norm.bias"};
    for (int kind = 0; kind < KINDS; kind++) {
        fresh();
        ag_params *ref = ag_params_new(AG_F32);
        ag_pcg32 ref_rng = ag_pcg32_make(1, 1);
        CHECK(ag_params_add(ps, taken[kind], 1, (int[]){4}));
        CHECK(ag_params_add(ref, taken[kind], 1, (int[]){4}));
        const size_t numel = ag_params_numel(ps);
        const ag_pcg32 before = rng;
        ag_block b;
        ag_decoder_layer d;
        ag_mha m;
        ag_transformer_encoder e;
        ag_transformer t;
        const ag_mha_config mc = {.embed_dim = 4, .num_heads = 2};
        const ag_transformer_config tc = {.layer = cfg, .num_encoder_layers = 1,
                                          .num_decoder_layers = 1};
        testing_catch_errors();
        bool made = kind == BLOCK     ? ag_block_init(&b, ps, "m", &cfg, &rng)
                    : kind == DECODER ? ag_decoder_layer_init(&d, ps, "m", &cfg, &rng)
                    : kind == MHA     ? ag_mha_init(&m, ps, "m", &mc, &rng)
                    : kind == ENCODER ? ag_transformer_encoder_init(&e, ps, "m", &cfg, 1, &rng)
                                      : ag_transformer_init(&t, ps, "m", &tc, &rng);
        CHECK(!made);
        CHECK(testing_error_count == 1);
        testing_release_errors();
        CHECK(ag_params_count(ps) == 1);
        CHECK(ag_params_numel(ps) == numel);
        CHECK(rng.state == before.state && rng.inc == before.inc);
        // A retry under another name makes what a first try would have made.
        ag_transformer_encoder e2;
        ag_transformer t2;
        made = kind == BLOCK     ? ag_block_init(&b, ps, "n", &cfg, &rng) &&
                                   ag_block_init(&b, ref, "n", &cfg, &ref_rng)
               : kind == DECODER ? ag_decoder_layer_init(&d, ps, "n", &cfg, &rng) &&
                                   ag_decoder_layer_init(&d, ref, "n", &cfg, &ref_rng)
               : kind == MHA     ? ag_mha_init(&m, ps, "n", &mc, &rng) &&
                                   ag_mha_init(&m, ref, "n", &mc, &ref_rng)
               : kind == ENCODER ? ag_transformer_encoder_init(&e, ps, "n", &cfg, 1, &rng) &&
                                   ag_transformer_encoder_init(&e2, ref, "n", &cfg, 1, &ref_rng)
                                 : ag_transformer_init(&t, ps, "n", &tc, &rng) &&
                                   ag_transformer_init(&t2, ref, "n", &tc, &ref_rng);
        CHECK(made);
        CHECK(same_values(ps, ref));
        if (kind == ENCODER) ag_transformer_encoder_free(&e), ag_transformer_encoder_free(&e2);
        if (kind == TRANSFORMER) ag_transformer_free(&t), ag_transformer_free(&t2);
        ag_params_free(ref);
    }
}

// A parameter added where a taken-back one lay starts from zeros, as in a fresh buffer:
// LayerNorm's bias (never written by its init) held the taken-back weights' values.
static void test_a_parameter_added_after_a_failed_init_starts_from_zeros(void) {
    fresh();
    CHECK(ag_params_add(ps, "p.bias", 1, (int[]){8}));
    testing_catch_errors();
    ag_linear_layer l;
    CHECK(!ag_linear_layer_init(&l, ps, "p", 8, 8, true, &rng));
    CHECK(l.weight == NULL);  // the module holds no pointer to a parameter taken back
    testing_release_errors();
    ag_layernorm_layer n;
    CHECK(ag_layernorm_layer_init(&n, ps, "q", 16));  // its bias where the weight lay
    const float *bias = ag_tensor_f32(n.bias);
    for (int i = 0; i < 16; i++) CHECK(bias[i] == 0.0f);
    const float *grad = ag_params_grad(ps);
    for (size_t i = 0; i < ag_params_buffer_len(ps); i++) CHECK(grad[i] == 0.0f);
}

// Without a generator a layer was made with zero weights after a line from the
// initialiser, and its init returned true.
static void test_a_null_generator_is_refused_by_every_init(void) {
    fresh();
    const ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6};
    ag_linear_layer l;
    ag_embedding_layer e;
    ag_mha m;
    ag_block b;
    testing_catch_errors();
    CHECK(!ag_linear_layer_init(&l, ps, "l", 4, 4, true, NULL));
    CHECK(testing_error_was("linear_layer_init: the rng is NULL"));
    CHECK(!ag_embedding_layer_init(&e, ps, "e", 4, 4, NULL));
    CHECK(testing_error_was("embedding_layer_init: the rng is NULL"));
    CHECK(!ag_mha_init(&m, ps, "m", &(ag_mha_config){.embed_dim = 4, .num_heads = 2}, NULL));
    CHECK(testing_error_was("mha_init: the rng is NULL"));
    CHECK(!ag_block_init(&b, ps, "b", &cfg, NULL));
    CHECK(testing_error_was("block_init: the rng is NULL"));
    testing_release_errors();
    CHECK(ag_params_count(ps) == 0);
}

int main(void) {
    RUN(test_linear_named_head_owns_head_weight_and_head_bias);
    RUN(test_layernorm_and_embedding_take_dotted_names);
    RUN(test_root_module_names_its_tensors_by_themselves);
    RUN(test_nested_modules_join_their_names_with_dots);
    RUN(test_a_name_with_an_empty_component_is_refused_by_every_init);
    RUN(test_dropout_streams_follow_the_module_name);
    RUN(test_a_bad_size_is_one_line_per_init);
    RUN(test_an_init_that_fails_part_way_leaves_store_and_generator_as_they_were);
    RUN(test_a_parameter_added_after_a_failed_init_starts_from_zeros);
    RUN(test_a_null_generator_is_refused_by_every_init);
    ag_params_free(ps);
    return testing_summary();
}
