// A NULL where the public API takes a shape, an array or a generator: one line naming the
// function and what is NULL, and a NULL (false, 0) result; never a crash. Every function
// of include/ with such an argument is here (ag_dist_sum, in attograd_dist, is in
// tests/mpi/test_dist_sum.c).
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "testing.h"
#include "testing_files.h"

static void test_tensor_constructors_refuse_a_null_shape_data_or_rng(void) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    testing_catch_errors();
    CHECK(ag_tensor_zeros(AG_F32, 2, NULL) == NULL);
    CHECK(testing_error_was("tensor_zeros: the shape is NULL (2 dimensions requested)"));
    CHECK(ag_tensor_ones(AG_F64, 1, NULL) == NULL);
    CHECK(testing_error_was("tensor_ones: the shape is NULL (1 dimensions requested)"));
    CHECK(ag_tensor_from(AG_F32, 2, NULL, (float[]){1, 2}) == NULL);
    CHECK(testing_error_was("tensor_from: the shape is NULL (2 dimensions requested)"));
    CHECK(ag_tensor_from(AG_F32, 1, (int[]){2}, NULL) == NULL);
    CHECK(testing_error_was("tensor_from: data is NULL"));
    CHECK(ag_tensor_uniform(AG_F32, 2, NULL, &rng, -1, 1) == NULL);
    CHECK(testing_error_was("tensor_uniform: the shape is NULL (2 dimensions requested)"));
    CHECK(ag_tensor_uniform(AG_F32, 1, (int[]){2}, NULL, -1, 1) == NULL);
    CHECK(testing_error_was("tensor_uniform: rng is NULL"));
    CHECK(ag_tensor_normal(AG_F64, 2, NULL, &rng, 0, 1) == NULL);
    CHECK(testing_error_was("tensor_normal: the shape is NULL (2 dimensions requested)"));
    CHECK(ag_tensor_normal(AG_F64, 1, (int[]){2}, NULL, 0, 1) == NULL);
    CHECK(testing_error_was("tensor_normal: rng is NULL"));
    testing_release_errors();
    // A scalar has no extents to read: its shape may be NULL.
    ag_tensor *s = ag_tensor_zeros(AG_F32, 0, NULL);
    CHECK(s != NULL && s->numel == 1);
    ag_tensor_free(s);
}

// The functions on one tensor report a NULL tensor (or stream) in their own name;
// ag_tensor_same_shape, a question, answers false.
static void test_a_grad_view_of_null_is_an_empty_view(void) {
    testing_catch_errors();
    ag_tensor g = ag_tensor_grad_view(NULL);  // dereferenced NULL before
    CHECK(testing_error_was("tensor_grad_view: the tensor is NULL"));
    CHECK(g.data == NULL && g.ndim == 0 && g.numel == 1);
    CHECK(isnan(ag_tensor_item(&g, 0)));
    CHECK(testing_error_was("tensor_item: tensor [] has no data (a gradient no backward has "
                            "reached)"));
    testing_release_errors();
}

static void test_tensor_functions_refuse_a_null_tensor_or_stream(void) {
    ag_tensor *t = ag_tensor_zeros(AG_F32, 1, (int[]){2});
    testing_catch_errors();
    CHECK(isnan(ag_tensor_item(NULL, 0)));
    CHECK(testing_error_was("tensor_item: the tensor is NULL"));
    ag_tensor_set_item(NULL, 0, 1);
    CHECK(testing_error_was("tensor_set_item: the tensor is NULL"));
    CHECK(isnan(ag_tensor_grad_item(NULL, 0)));
    CHECK(testing_error_was("tensor_grad_item: the tensor is NULL"));
    ag_tensor_fill(NULL, 1);
    CHECK(testing_error_was("tensor_fill: the tensor is NULL"));
    ag_tensor_copy(t, NULL);
    CHECK(testing_error_was("tensor_copy: the tensor is NULL"));
    ag_tensor_copy(NULL, t);
    CHECK(testing_error_was("tensor_copy: the tensor is NULL"));
    CHECK(ag_tensor_f32(NULL) == NULL);
    CHECK(testing_error_was("tensor_f32: the tensor is NULL"));
    CHECK(ag_tensor_f64(NULL) == NULL);
    CHECK(testing_error_was("tensor_f64: the tensor is NULL"));
    ag_tensor_set_requires_grad(NULL, true);
    CHECK(testing_error_was("set_requires_grad: the tensor is NULL"));
    ag_tensor_set_name(NULL, "x");
    CHECK(testing_error_was("tensor_set_name: the tensor is NULL"));
    ag_tensor_zero_grad(NULL);
    CHECK(testing_error_was("tensor_zero_grad: the tensor is NULL"));
    ag_tensor_print(t, NULL);
    CHECK(testing_error_was("tensor_print: the stream is NULL"));
    ag_tensor_print_grad(t, NULL);
    CHECK(testing_error_was("tensor_print_grad: the stream is NULL"));
    CHECK(!ag_tensor_same_shape(t, NULL) && !ag_tensor_same_shape(NULL, t));
    CHECK(testing_error_count == 0);
    testing_release_errors();
    ag_tensor_free(t);
}

static void test_initialisers_refuse_a_null_generator(void) {
    ag_tensor *w = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    testing_catch_errors();
    ag_tensor_init_uniform(w, NULL, -1, 1);
    CHECK(testing_error_was("tensor_init_uniform: rng is NULL (tensor [2,3])"));
    ag_tensor_init_normal(w, NULL, 0, 1);
    CHECK(testing_error_was("tensor_init_normal: rng is NULL (tensor [2,3])"));
    ag_tensor_init_xavier_uniform(w, NULL, 1);
    CHECK(testing_error_was("tensor_init_xavier_uniform: rng is NULL (tensor [2,3])"));
    ag_tensor_init_kaiming_uniform(w, NULL, 1);
    CHECK(testing_error_was("tensor_init_kaiming_uniform: rng is NULL (tensor [2,3])"));
    testing_release_errors();
    ag_tensor_free(w);
}

static void copy_forward(ag_node *n) {
    memcpy(n->out->data, n->in[0]->data, n->out->numel * sizeof(float));
}

static void test_tape_refuses_a_null_shape_input_array_or_params(void) {
    static const ag_op copy = {"my_copy", copy_forward, NULL, NULL};
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(tp, AG_F32, 1, (int[]){2});
    testing_catch_errors();
    CHECK(ag_tape_tensor(tp, AG_F32, 2, NULL) == NULL);
    CHECK(testing_error_was("tape_tensor: the shape is NULL (2 dimensions requested)"));
    CHECK(ag_tape_tensor(NULL, AG_F32, 1, (int[]){2}) == NULL);
    CHECK(testing_error_was("tape_tensor: the tape is NULL"));
    CHECK(ag_tape_alloc(NULL, 8) == NULL);
    CHECK(testing_error_was("tape_alloc: the tape is NULL"));
    CHECK(ag_op_apply(tp, &copy, 1, NULL, 1, (int[]){2}, NULL, 0) == NULL);
    CHECK(testing_error_was("my_copy: the input array is NULL (n_in 1)"));
    CHECK(ag_op_apply(tp, &copy, 1, &x, 1, NULL, NULL, 0) == NULL);
    CHECK(testing_error_was("my_copy: the shape is NULL (1 dimensions requested)"));
    CHECK(ag_op_apply(tp, &copy, 1, &x, 1, (int[]){2}, NULL, 8) == NULL);
    CHECK(testing_error_was("my_copy: params is NULL (params_size 8)"));
    testing_release_errors();
    CHECK(ag_op_apply(tp, &copy, 1, &x, 1, (int[]){2}, NULL, 0) != NULL);
    ag_tape_free(tp);
}

// The tape's own functions report a NULL tape (and the printers, the check's too, a NULL
// stream) and give a neutral result, where they dereferenced it. ag_tape_free(NULL) does
// nothing.
static void test_tape_functions_refuse_a_null_tape_or_stream(void) {
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    ag_tape_reset(NULL);
    CHECK(testing_error_was("tape_reset: the tape is NULL"));
    CHECK(!ag_tape_set_grad_enabled(NULL, false));
    CHECK(testing_error_was("tape_set_grad_enabled: the tape is NULL"));
    CHECK(!ag_tape_grad_enabled(NULL));
    CHECK(testing_error_was("tape_grad_enabled: the tape is NULL"));
    ag_tape_set_profiling(NULL, true);
    CHECK(testing_error_was("tape_set_profiling: the tape is NULL"));
    CHECK(ag_tape_num_nodes(NULL) == 0);
    CHECK(testing_error_was("tape_num_nodes: the tape is NULL"));
    CHECK(ag_tape_node(NULL, 0) == NULL);
    CHECK(testing_error_was("tape_node: the tape is NULL"));
    CHECK(ag_tape_usage(NULL).bytes_peak == 0);
    CHECK(testing_error_was("tape_usage: the tape is NULL"));
    ag_tensor *leaf = ag_tensor_zeros(AG_F32, 0, NULL);
    ag_tensor_set_requires_grad(leaf, true);
    ag_backward(NULL, leaf);
    CHECK(testing_error_was("backward: the tape is NULL"));
    // A NULL loss (what a failed op returns) is named as such, not as a loss that does not
    // require grad or a gradient that does not match "(null)".
    ag_backward(tp, NULL);
    CHECK(testing_error_was("backward: the loss is NULL"));
    ag_backward_with(tp, NULL, leaf);
    CHECK(testing_error_was("backward: the output is NULL"));
    ag_backward_with(tp, leaf, NULL);
    CHECK(testing_error_was("backward: the upstream gradient is NULL"));
    ag_tape_print(NULL, stdout);
    CHECK(testing_error_was("tape_print: the tape is NULL"));
    ag_tape_print(tp, NULL);
    CHECK(testing_error_was("tape_print: the stream is NULL"));
    ag_tape_print_verbose(tp, NULL);
    CHECK(testing_error_was("tape_print_verbose: the stream is NULL"));
    ag_tape_profile_print(NULL, stdout);
    CHECK(testing_error_was("tape_profile_print: the tape is NULL"));
    ag_tape_dot(tp, NULL);
    CHECK(testing_error_was("tape_dot: the stream is NULL"));
    ag_tape_check_print(NULL, stdout);
    CHECK(testing_error_was("tape_check_print: the report is NULL"));
    ag_tape_check_report r;
    ag_tape_check(tp, NULL, &r);
    ag_tape_check_print(&r, NULL);
    CHECK(testing_error_was("tape_check_print: the stream is NULL"));
    ag_tape_check_report_free(&r);
    testing_release_errors();
    ag_tape_free(NULL);
    ag_tensor_free(leaf);
    ag_tape_free(tp);
}

static void test_params_refuse_a_null_store_shape_name_or_values(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor *w = ag_params_add(ps, "w", 1, (int[]){2});
    testing_catch_errors();
    CHECK(ag_params_add(ps, "v", 2, NULL) == NULL);
    CHECK(testing_error_was("params_add: the shape is NULL (2 dimensions requested)"));
    CHECK(ag_params_add(NULL, "v", 1, (int[]){2}) == NULL);
    CHECK(testing_error_was("params_add: the store is NULL"));
    CHECK(!ag_params_resize(ps, w, 1, NULL, (float[]){1, 2}));
    CHECK(testing_error_was("params_resize: the shape is NULL (1 dimensions requested)"));
    CHECK(!ag_params_resize(ps, w, 1, (int[]){3}, NULL));
    CHECK(testing_error_was("params_resize: the values for 'w' [3] are NULL"));
    CHECK(ag_params_find(ps, NULL) == NULL);
    CHECK(testing_error_was("params_find: the name is NULL"));
    // An index outside the store was a silent NULL.
    CHECK(ag_params_at(ps, 1) == NULL);
    CHECK(testing_error_was("params_at: index 1 is out of range for a store of 1 parameters"));
    CHECK(ag_params_at(ps, -1) == NULL);
    CHECK(testing_error_was("params_at: index -1 is out of range for a store of 1 parameters"));
    testing_release_errors();
    CHECK(ag_params_count(ps) == 1 && w->numel == 2);
    ag_params_free(ps);
}

// Every question and pass of the store, given NULL, reports in its own name and answers as
// an empty store: before, each dereferenced it.
static void test_params_functions_refuse_a_null_store(void) {
    testing_catch_errors();
    CHECK(ag_params_find(NULL, "w") == NULL);
    CHECK(testing_error_was("params_find: the store is NULL"));
    CHECK(ag_params_dtype(NULL) == AG_F32);
    CHECK(testing_error_was("params_dtype: the store is NULL"));
    CHECK(ag_params_count(NULL) == 0);
    CHECK(testing_error_was("params_count: the store is NULL"));
    CHECK(ag_params_at(NULL, 0) == NULL);
    CHECK(testing_error_was("params_at: the store is NULL"));
    CHECK(ag_params_numel(NULL) == 0);
    CHECK(testing_error_was("params_numel: the store is NULL"));
    CHECK(ag_params_buffer_len(NULL) == 0);
    CHECK(testing_error_was("params_buffer_len: the store is NULL"));
    CHECK(ag_params_data(NULL) == NULL);
    CHECK(testing_error_was("params_data: the store is NULL"));
    CHECK(ag_params_grad(NULL) == NULL);
    CHECK(testing_error_was("params_grad: the store is NULL"));
    ag_params_zero_grad(NULL);
    CHECK(testing_error_was("params_zero_grad: the store is NULL"));
    CHECK(isnan(ag_params_grad_norm(NULL)));
    CHECK(testing_error_was("params_grad_norm: the store is NULL"));
    CHECK(isnan(ag_params_clip_grad_norm(NULL, 1.0)));
    CHECK(testing_error_was("params_clip_grad_norm: the store is NULL"));
    CHECK(ag_params_first_nonfinite(NULL, true) == NULL);
    CHECK(testing_error_was("params_first_nonfinite: the store is NULL"));
    CHECK(ag_params_decay_matrices_only(NULL) == 0);
    CHECK(testing_error_was("params_decay_matrices_only: the store is NULL"));
    // Given a parameter of some store, these said it "is not a parameter of this store".
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor *w = ag_params_add(ps, "w", 1, (const int[]){2});
    ag_params_set_decay(NULL, w, false);
    CHECK(testing_error_was("params_set_decay: the store is NULL"));
    CHECK(ag_params_decays(ps, w));
    CHECK(!ag_params_decays(NULL, w));
    CHECK(testing_error_was("params_decays: the store is NULL"));
    ag_params_free(ps);
    testing_release_errors();
}

// An op given no tape said "needs a tape and an op with a forward function"; five ops
// said "tape is NULL" in their own words. All say the one thing, in the op's name.
static void test_ops_name_a_null_tape(void) {
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){2, 3});
    testing_catch_errors();
    CHECK(!ag_var_dim(NULL, x, 1, false, false));
    CHECK(testing_error_was("var_dim: the tape is NULL"));
    CHECK(!ag_add(NULL, x, x));
    CHECK(testing_error_was("add: the tape is NULL"));
    CHECK(!ag_embedding(NULL, x, (int32_t[]){0}, 1, (int[]){1}));
    CHECK(testing_error_was("embedding: the tape is NULL"));
    testing_release_errors();
    ag_tensor_free(x);
}

static void test_ops_refuse_a_null_array(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(tp, AG_F32, 2, (int[]){2, 3});
    ag_tensor *w = ag_tape_tensor(tp, AG_F32, 2, (int[]){4, 3});
    ag_embedding_layer emb = {w};
    testing_catch_errors();
    CHECK(ag_cross_entropy(tp, x, NULL, 2, -100) == NULL);
    CHECK(testing_error_was("cross_entropy: targets is NULL (logits [2,3], 2 targets expected)"));
    CHECK(ag_nll_loss(tp, x, NULL, 2, -100) == NULL);
    CHECK(testing_error_was("nll_loss: targets is NULL (logp [2,3], 2 targets expected)"));
    CHECK(ag_embedding(tp, w, NULL, 1, (int[]){2}) == NULL);
    CHECK(testing_error_was("embedding: ids is NULL (ids [2], weight [4,3])"));
    CHECK(ag_embedding(tp, w, (int32_t[]){0, 1}, 1, NULL) == NULL);
    CHECK(testing_error_was("embedding: ids shape is NULL for 1 dimensions (weight [4,3])"));
    CHECK(ag_embedding_layer_forward(tp, &emb, NULL, 1, (int[]){2}) == NULL);
    CHECK(testing_error_was("embedding: ids is NULL (ids [2], weight [4,3])"));
    CHECK(ag_permute(tp, x, NULL) == NULL);
    CHECK(testing_error_was("permute: perm is NULL (x [2,3])"));
    CHECK(ag_reshape(tp, x, 2, NULL) == NULL);
    CHECK(testing_error_was("reshape: shape is NULL for 2 dimensions (x [2,3])"));
    CHECK(ag_expand(tp, x, 2, NULL) == NULL);
    CHECK(testing_error_was("expand: the shape is NULL (ndim 2, x [2,3])"));
    CHECK(ag_concat(tp, NULL, 2, 0) == NULL);
    CHECK(testing_error_was("concat: the tensor array xs is NULL (n 2)"));
    CHECK(ag_stack(tp, NULL, 2, 0) == NULL);
    CHECK(testing_error_was("stack: the tensor array xs is NULL (n 2)"));
    ag_dropout_row_mask(1, 2, 0.5, 0, 4, NULL);
    CHECK(testing_error_was("dropout_row_mask: needs D >= 0 and a buffer of D bytes, got D = 4 and "
                       "no buffer"));
    testing_release_errors();
    ag_tape_free(tp);
}

static ag_tensor *sum_of(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n, (void)user;
    return ag_sum(tp, in[0]);
}

static void test_gradcheck_refuses_a_null_input_array_or_function(void) {
    ag_gradcheck_result res;
    testing_catch_errors();
    CHECK(!ag_gradcheck(sum_of, NULL, 1, NULL, NULL, &res) && res.verdict == AG_CHECK_FAIL);
    CHECK(testing_error_was("gradcheck: the input array is NULL (n_inputs 1)"));
    CHECK(!ag_gradcheck(NULL, (ag_tensor *[]){NULL}, 1, NULL, NULL, &res) &&
          res.verdict == AG_CHECK_FAIL);
    CHECK(testing_error_was("gradcheck: the function is NULL (n_inputs 1)"));
    CHECK(!ag_gradcheck(sum_of, (ag_tensor *[]){NULL}, 1, NULL, NULL, &res) &&
          res.verdict == AG_CHECK_FAIL);
    CHECK(testing_error_was("gradcheck: input 0 is NULL"));
    testing_release_errors();
}

static ag_tensor *no_loss(ag_tape *tp, ag_tensor *const masks[], int batch, void *user) {
    (void)tp, (void)masks, (void)batch, (void)user;
    return NULL;
}

static void test_head_analysis_refuses_null_arrays(void) {
    ag_tensor *weights = ag_tensor_zeros(AG_F32, 4, (int[]){1, 2, 3, 3});
    ag_head_stats stats[2] = {{0}};
    double importance[4];
    int heads[1] = {0};
    ag_mha m = {0};
    testing_catch_errors();
    CHECK(!ag_attention_head_stats(weights, NULL));
    CHECK(testing_error_was("attention_head_stats: the stats array is NULL (weights [1,2,3,3])"));
    ag_attention_head_stats_print(NULL, 2, NULL, NULL, 0, stderr);
    CHECK(testing_error_was("attention_head_stats_print: the stats array is NULL (2 heads, 0 "
                       "importance columns)"));
    ag_attention_head_stats_print(stats, 2, NULL, NULL, 1, stderr);
    CHECK(testing_error_was("attention_head_stats_print: the importance array is NULL (2 heads, 1 "
                       "importance columns)"));
    CHECK(!ag_head_importance_gradient(no_loss, NULL, AG_F32, 2, 2, 1, NULL));
    CHECK(testing_error_was("head_importance_gradient: the importance array is NULL"));
    CHECK(!ag_head_importance_ablation(NULL, NULL, AG_F32, 2, 2, 1, importance));
    CHECK(testing_error_was("head_importance_ablation: the loss callback is NULL"));
    CHECK(!ag_head_importance_ablation(no_loss, NULL, AG_F32, 2, 2, 0, importance));
    CHECK(testing_error_was("head_importance_ablation: batches 0; a mean needs at least 1"));
    CHECK(!ag_mha_prune_heads(&m, NULL, heads, 1));
    CHECK(testing_error_was("mha_prune_heads: the parameter store is NULL"));
    testing_release_errors();
    ag_tensor_free(weights);
}

static void test_nn_forwards_refuse_a_null_module(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F64, 3, (int[]){1, 2, 4});
    testing_catch_errors();
    CHECK(!ag_linear_layer_forward(tp, NULL, x));
    CHECK(testing_error_was("linear_layer_forward: the layer is NULL"));
    CHECK(!ag_layernorm_layer_forward(tp, NULL, x));
    CHECK(testing_error_was("layernorm_layer_forward: the layer is NULL"));
    CHECK(!ag_mha_forward(tp, NULL, x, x, x, NULL, NULL));
    CHECK(testing_error_was("mha: the module is NULL"));
    CHECK(!ag_block_forward(tp, NULL, x, NULL));
    CHECK(testing_error_was("block_forward: the block is NULL"));
    CHECK(!ag_decoder_layer_forward(tp, NULL, x, x, NULL));
    CHECK(testing_error_was("decoder_layer_forward: the layer is NULL"));
    CHECK(!ag_transformer_encoder_forward(tp, NULL, x, NULL));
    CHECK(testing_error_was("transformer_encoder_forward: the encoder is NULL"));
    CHECK(!ag_transformer_decoder_forward(tp, NULL, x, x, NULL));
    CHECK(testing_error_was("transformer_decoder_forward: the decoder is NULL"));
    CHECK(!ag_transformer_forward(tp, NULL, x, x, NULL));
    CHECK(testing_error_was("transformer_forward: the transformer is NULL"));
    testing_release_errors();
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_module_inits_refuse_a_null_module_or_config(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    const ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 4};
    testing_catch_errors();
    CHECK(!ag_mha_init(&m, ps, "a", NULL, &rng));
    CHECK(testing_error_was("mha_init: the config is NULL"));
    CHECK(!ag_mha_init(NULL, ps, "a", &(ag_mha_config){.embed_dim = 4, .num_heads = 2}, &rng));
    CHECK(testing_error_was("mha_init: the module is NULL"));
    CHECK(!ag_block_init(NULL, ps, "b", &cfg, &rng));
    CHECK(testing_error_was("block_init: the block is NULL"));
    CHECK(!ag_decoder_layer_init(NULL, ps, "d", &cfg, &rng));
    CHECK(testing_error_was("decoder_layer_init: the layer is NULL"));
    // These five wrote through the NULL module before they looked at anything.
    CHECK(!ag_linear_layer_init(NULL, ps, "l", 4, 4, true, &rng));
    CHECK(testing_error_was("linear_layer_init: the layer is NULL"));
    CHECK(!ag_layernorm_layer_init(NULL, ps, "n", 4));
    CHECK(testing_error_was("layernorm_layer_init: the layer is NULL"));
    CHECK(!ag_embedding_layer_init(NULL, ps, "e", 4, 4, &rng));
    CHECK(testing_error_was("embedding_layer_init: the layer is NULL"));
    CHECK(!ag_transformer_encoder_init(NULL, ps, "enc", &cfg, 1, &rng));
    CHECK(testing_error_was("transformer_encoder_init: the encoder is NULL"));
    CHECK(!ag_transformer_decoder_init(NULL, ps, "dec", &cfg, 1, &rng));
    CHECK(testing_error_was("transformer_decoder_init: the decoder is NULL"));
    const ag_transformer_config tcfg = {.layer = cfg, .num_encoder_layers = 1,
                                        .num_decoder_layers = 1};
    CHECK(!ag_transformer_init(NULL, ps, "t", &tcfg, &rng));
    CHECK(testing_error_was("transformer_init: the transformer is NULL"));
    testing_release_errors();
    CHECK(ag_params_count(ps) == 0);
    ag_params_free(ps);
}

static void test_optimizer_functions_refuse_a_null_optimizer(void) {
    testing_catch_errors();
    ag_optim_step(NULL);
    CHECK(testing_error_was("optim_step: the optimizer is NULL"));
    ag_optim_set_lr(NULL, 0.1);
    CHECK(testing_error_was("optim_set_lr: the optimizer is NULL"));
    CHECK(isnan(ag_optim_lr(NULL)));
    CHECK(testing_error_was("optim_lr: the optimizer is NULL"));
    CHECK(ag_optim_current_config(NULL).lr == 0);
    CHECK(testing_error_was("optim_current_config: the optimizer is NULL"));
    CHECK(ag_optim_step_count(NULL) == 0);
    CHECK(testing_error_was("optim_step_count: the optimizer is NULL"));
    ag_optim_set_step_count(NULL, 3);
    CHECK(testing_error_was("optim_set_step_count: the optimizer is NULL"));
    CHECK(ag_optim_state_count(NULL) == 0);
    CHECK(testing_error_was("optim_state_count: the optimizer is NULL"));
    CHECK(ag_optim_state_name(NULL, 0) == NULL);
    CHECK(testing_error_was("optim_state_name: the optimizer is NULL"));
    CHECK(ag_optim_state_data(NULL, 0) == NULL);
    CHECK(testing_error_was("optim_state_data: the optimizer is NULL"));
    CHECK(!ag_optim_has_momentum_buffer(NULL));
    CHECK(testing_error_was("optim_has_momentum_buffer: the optimizer is NULL"));
    CHECK(!ag_optim_momentum_initialised(NULL));
    CHECK(testing_error_was("optim_momentum_initialised: the optimizer is NULL"));
    ag_optim_set_momentum_initialised(NULL, true);
    CHECK(testing_error_was("optim_set_momentum_initialised: the optimizer is NULL"));
    CHECK(ag_optim_state(NULL) == NULL);
    ag_optim_free(NULL);
    testing_release_errors();
}

static void test_generate_refuses_a_null_prompt(void) {
    testing_catch_errors();
    CHECK(ag_generate(NULL, NULL, 2, 1, NULL, NULL, NULL, NULL) == 0);
    CHECK(testing_error_was("generate: the prompt is NULL (n_prompt 2)"));
    testing_release_errors();
}

static void test_decoder_cache_reorder_refuses_a_null_cache(void) {
    testing_catch_errors();
    CHECK(!ag_decoder_cache_reorder(NULL, (const int[]){0}, 1));
    CHECK(testing_error_was("decoder_cache_reorder: the cache is NULL"));
    testing_release_errors();
}

static void test_autocast_switches_refuse_a_null_tape_or_generator(void) {
    testing_catch_errors();
    CHECK(ag_tape_set_autocast(NULL, AG_AUTOCAST_BF16) == AG_AUTOCAST_OFF);
    CHECK(testing_error_was("tape_set_autocast: the tape is NULL"));
    CHECK(ag_generator_set_autocast(NULL, AG_AUTOCAST_BF16) == AG_AUTOCAST_OFF);
    CHECK(testing_error_was("generator_set_autocast: the generator is NULL"));
    testing_release_errors();
}

static void test_shape_str_with_no_buffer_writes_nothing(void) {
    ag_tensor *t = ag_tensor_zeros(AG_F32, 1, (int[]){3});
    CHECK(ag_tensor_shape_str(t, NULL, 16) == NULL);
    char buf[1] = {'x'};
    CHECK(ag_tensor_shape_str(t, buf, 0) == buf && buf[0] == 'x');
    ag_tensor_free(t);
}

// A file writer given NULL bytes fails at commit, as a failed write does, and leaves the
// target as it was.
static void test_file_writer_given_null_bytes_fails_at_commit(void) {
    const char *path = testing_path("null_bytes.txt");
    testing_write_file(path, "old", 3);
    ag_err err = {{0}};
    ag_file_writer *w = ag_file_writer_open(path, &err);
    CHECK(w != NULL);
    ag_file_writer_write(w, "new", 3);
    ag_file_writer_write(w, NULL, 5);
    CHECK(ag_file_writer_commit(w, &err) == -1);
    CHECK(strstr(err.msg, "Bad address") != NULL && strstr(err.msg, "was left as it was"));
    size_t n;
    unsigned char *text = testing_read_file(path, &n);
    CHECK(text && n == 3 && memcmp(text, "old", 3) == 0);
    free(text);
}

int main(void) {
    RUN(test_tensor_constructors_refuse_a_null_shape_data_or_rng);
    RUN(test_a_grad_view_of_null_is_an_empty_view);
    RUN(test_tensor_functions_refuse_a_null_tensor_or_stream);
    RUN(test_initialisers_refuse_a_null_generator);
    RUN(test_tape_refuses_a_null_shape_input_array_or_params);
    RUN(test_tape_functions_refuse_a_null_tape_or_stream);
    RUN(test_params_refuse_a_null_store_shape_name_or_values);
    RUN(test_params_functions_refuse_a_null_store);
    RUN(test_ops_name_a_null_tape);
    RUN(test_ops_refuse_a_null_array);
    RUN(test_gradcheck_refuses_a_null_input_array_or_function);
    RUN(test_head_analysis_refuses_null_arrays);
    RUN(test_nn_forwards_refuse_a_null_module);
    RUN(test_module_inits_refuse_a_null_module_or_config);
    RUN(test_optimizer_functions_refuse_a_null_optimizer);
    RUN(test_generate_refuses_a_null_prompt);
    RUN(test_decoder_cache_reorder_refuses_a_null_cache);
    RUN(test_autocast_switches_refuse_a_null_tape_or_generator);
    RUN(test_shape_str_with_no_buffer_writes_nothing);
    RUN(test_file_writer_given_null_bytes_fails_at_commit);
    testing_remove_tmpdir();
    return testing_summary();
}
