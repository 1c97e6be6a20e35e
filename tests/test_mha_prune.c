// ag_mha_prune_heads: the pruned module gives the output and gradients of the unpruned
// one with those heads' head_mask at 0 (float64, every path: packed self-attention,
// separate kdim/vdim projections, the composed path with weights); the shapes shrink;
// pruning twice composes; a pruned model trains with a new optimizer and no allocation
// per step, and checkpoints and reloads with its head count in the metadata; an
// optimizer made before pruning refuses to step, saying why; errors.
#include <stdlib.h>

#include "op_checks.h"

typedef struct {
    ag_params *ps;
    ag_mha m;
} module;

static void module_init(module *mod, const ag_mha_config *cfg, ag_dtype dt, uint64_t seed) {
    mod->ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    CHECK(ag_mha_init(&mod->m, mod->ps, "attn", cfg, &rng));
    for (int i = 0; i < ag_params_count(mod->ps); i++)  // biases too, away from 0
        ag_tensor_init_uniform(ag_params_at(mod->ps, i), &rng, -0.7, 0.7);
}

typedef struct {
    ag_tensor *q, *kv, *dy, *mask;
    bool self, with_weights;
} run_in;

// Forward and backward with dy; returns the output (in tp).
static ag_tensor *run(ag_tape *tp, module *mod, const run_in *in, ag_tensor *head_mask) {
    ag_params_zero_grad(mod->ps);
    ag_tensor_zero_grad(in->q);
    ag_tensor_zero_grad(in->kv);
    ag_tensor *w = NULL, *kv = in->self ? in->q : in->kv;
    ag_mha_opts o = {.causal = in->self, .head_mask = head_mask, .per_head_weights = true};
    ag_tensor *y = ag_mha_forward(tp, &mod->m, in->q, kv, kv, &o, in->with_weights ? &w : NULL);
    if (y) ag_backward_with(tp, y, in->dy);
    return y;
}

// The element of the unpruned parameter `t` that the pruned one's element (r, c) came
// from: rows (or, for out_proj.weight, columns) of kept heads, part by part.
static size_t source_index(const ag_tensor *t, size_t e, int E_cols_new, int h, int d,
                           const int *keep, int nk, bool columns, int cols_old) {
    if (columns) {
        size_t r = e / (size_t)E_cols_new, c = e % (size_t)E_cols_new;
        return r * (size_t)cols_old + (size_t)keep[c / (size_t)d] * d + c % (size_t)d;
    }
    int cols = t->ndim == 2 ? t->shape[1] : 1;
    size_t r = e / (size_t)cols, c = e % (size_t)cols;
    size_t part = r / ((size_t)nk * d), in_part = r % ((size_t)nk * d);
    size_t old_r = part * (size_t)h * d + (size_t)keep[in_part / (size_t)d] * d + in_part % d;
    return old_r * (size_t)cols + c;
}

// Pruning `heads` equals masking them: output, input gradients, and each remaining weight's
// gradient equal the masked module's gradient at that weight's old place.
static void check_prune_equals_mask(const ag_mha_config *cfg, const int *heads, int n,
                                    bool self, bool with_weights, uint64_t seed) {
    module a, b;
    module_init(&a, cfg, AG_F64, seed);
    module_init(&b, cfg, AG_F64, seed);
    int h = cfg->num_heads, d = a.m.head_dim, E = cfg->embed_dim;
    ag_pcg32 rng = ag_pcg32_make(seed, 2);
    run_in in = {ag_tensor_uniform(AG_F64, 3, (int[]){2, 4, E}, &rng, -1, 1),
                 ag_tensor_uniform(AG_F64, 3, (int[]){2, 5, E}, &rng, -1, 1),
                 ag_tensor_uniform(AG_F64, 3, (int[]){2, 4, E}, &rng, -1, 1), NULL, self,
                 with_weights};
    if (a.m.cfg.kdim != E) {
        ag_tensor_free(in.kv);
        in.kv = ag_tensor_uniform(AG_F64, 3, (int[]){2, 5, a.m.cfg.kdim}, &rng, -1, 1);
    }
    ag_tensor_set_requires_grad(in.q, true);
    ag_tensor_set_requires_grad(in.kv, true);
    ag_tensor *mask = ag_tensor_ones(AG_F64, 1, &h);
    for (int i = 0; i < n; i++) ag_tensor_set_item(mask, (size_t)heads[i], 0.0);
    ag_tape *tp = ag_tape_new();

    ag_tensor *ya = run(tp, &a, &in, mask);
    double *dq = malloc(in.q->numel * sizeof *dq), *dkv = malloc(in.kv->numel * sizeof *dkv);
    for (size_t e = 0; e < in.q->numel; e++) dq[e] = ag_tensor_grad_item(in.q, e);
    for (size_t e = 0; e < in.kv->numel; e++) dkv[e] = ag_tensor_grad_item(in.kv, e);
    ag_tensor *masked_out = ag_tensor_convert(ya, AG_F64);
    int keep[16], nk = 0;
    for (int j = 0; j < h; j++) {
        bool gone = false;
        for (int i = 0; i < n; i++) gone = gone || heads[i] == j;
        if (!gone) keep[nk++] = j;
    }

    CHECK(ag_mha_prune_heads(&b.m, b.ps, heads, n));
    CHECK(b.m.cfg.num_heads == h - n && b.m.head_dim == d);
    ag_tensor *yb = run(tp, &b, &in, NULL);
    CHECK(yb && normwise_error(yb, masked_out, false) < 1e-14);
    normwise eq = {0, 0}, ekv = {0, 0};
    for (size_t e = 0; e < in.q->numel; e++) normwise_add(&eq, ag_tensor_grad_item(in.q, e), dq[e]);
    for (size_t e = 0; e < in.kv->numel; e++)
        normwise_add(&ekv, ag_tensor_grad_item(in.kv, e), dkv[e]);
    CHECK(normwise_result(eq) < 1e-14 && normwise_result(ekv) < 1e-14);
    for (int i = 0; i < ag_params_count(b.ps); i++) {
        ag_tensor *tb = ag_params_at(b.ps, i), *ta = ag_params_at(a.ps, i);
        CHECK(strcmp(tb->name, ta->name) == 0);
        bool out_w = tb == b.m.out_proj.weight || tb == b.m.bias_k || tb == b.m.bias_v;
        bool pruned = tb != b.m.out_proj.bias;
        normwise ev = {0, 0}, eg = {0, 0};
        for (size_t e = 0; e < tb->numel; e++) {
            size_t src = !pruned ? e
                                 : source_index(tb, e, nk * d, h, d, keep, nk, out_w,
                                                ta->shape[ta->ndim - 1]);
            normwise_add(&ev, ag_tensor_item(tb, e), ag_tensor_item(ta, src));
            normwise_add(&eg, ag_tensor_grad_item(tb, e), ag_tensor_grad_item(ta, src));
        }
        CHECK(normwise_result(ev) == 0.0);
        CHECK(normwise_result(eg) < 1e-14);
    }
    ag_tape_free(tp);
    free(dq);
    free(dkv);
    ag_tensor_free(masked_out);
    ag_tensor_free(mask);
    ag_tensor_free(in.q);
    ag_tensor_free(in.kv);
    ag_tensor_free(in.dy);
    ag_params_free(a.ps);
    ag_params_free(b.ps);
}

static void test_pruned_output_and_gradients_equal_a_zero_head_mask(void) {
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    ag_mha_config nb = {.embed_dim = 6, .num_heads = 3, .no_bias = true};
    ag_mha_config sep = {.embed_dim = 6, .num_heads = 3, .kdim = 4, .vdim = 4};
    for (int w = 0; w < 2; w++) {
        check_prune_equals_mask(&cfg, (int[]){1}, 1, true, w, 1);        // packed self-attention
        check_prune_equals_mask(&cfg, (int[]){3, 0}, 2, false, w, 2);     // three projections
        check_prune_equals_mask(&cfg, (int[]){0, 1, 2}, 3, true, w, 3);   // h = 1 remains
        check_prune_equals_mask(&nb, (int[]){2}, 1, true, w, 4);          // no biases
        check_prune_equals_mask(&sep, (int[]){1}, 1, false, w, 5);        // q/k/v_proj_weight
        ag_mha_config extra = {.embed_dim = 8, .num_heads = 4, .add_bias_kv = true,
                               .add_zero_attn = true};
        check_prune_equals_mask(&extra, (int[]){2, 1}, 2, true, w, 6);    // bias_k, bias_v
    }
}

static void test_shapes_shrink_and_pruning_twice_composes(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    module_init(&mod, &cfg, AG_F32, 6);
    size_t before = ag_params_numel(mod.ps);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){2}, 1));
    CHECK(mod.m.in_proj_weight->shape[0] == 18 && mod.m.in_proj_weight->shape[1] == 8);
    CHECK(mod.m.in_proj_bias->shape[0] == 18);
    CHECK(mod.m.out_proj.weight->shape[0] == 8 && mod.m.out_proj.weight->shape[1] == 6);
    CHECK(ag_params_numel(mod.ps) == before - 3 * 2 * 8 - 2 * 3 - 8 * 2);
    CHECK(ag_params_find(mod.ps, "attn.in_proj_weight") == mod.m.in_proj_weight);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){0}, 1));  // index among the 3 left
    CHECK(mod.m.cfg.num_heads == 2 && mod.m.out_proj.weight->shape[1] == 4);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, NULL, 0));  // nothing to do
    ag_params_free(mod.ps);
}

typedef struct {
    module *mod;
    ag_optim *opt;
    ag_tensor *x, *target;
} train_data;

static void train_step(ag_tape *tp, int step, void *user) {
    (void)step;
    train_data *t = user;
    ag_params_zero_grad(t->mod->ps);
    ag_tensor *y = ag_mha_forward(tp, &t->mod->m, t->x, t->x, t->x,
                                  &(ag_mha_opts){.causal = true}, NULL);
    ag_backward(tp, ag_mse(tp, y, t->target));
    ag_optim_step(t->opt);
}

// The pruned heads have no weights left to train: after steps with a new optimizer the
// shapes are the pruned ones and the repeated steps allocate nothing.
static void test_a_pruned_module_trains_with_a_new_optimizer_allocating_nothing(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 16, .num_heads = 4};
    module_init(&mod, &cfg, AG_F32, 7);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1, 3}, 2));
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    train_data t = {&mod, ag_optim_new(mod.ps, &oc),
                    uniform_tensor(AG_F32, 3, (int[]){2, 6, 16}, 8, -1, 1),
                    uniform_tensor(AG_F32, 3, (int[]){2, 6, 16}, 9, -1, 1)};
    CHECK(repeated_step_allocates_nothing(train_step, &t));
    CHECK(mod.m.in_proj_weight->shape[0] == 3 * 8 && mod.m.out_proj.weight->shape[1] == 8);
    ag_optim_free(t.opt);
    ag_tensor_free(t.x);
    ag_tensor_free(t.target);
    ag_params_free(mod.ps);
}

// The weight decay groups live on the parameters and outlive pruning (params.h): an
// in_proj_bias set apart from decay (as nanoGPT sets biases apart) stays apart after its
// resize, which had put every resized parameter back in the decaying group.
static void test_pruning_keeps_the_weight_decay_groups(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 16, .num_heads = 4};
    module_init(&mod, &cfg, AG_F32, 7);
    CHECK(ag_params_decay_matrices_only(mod.ps) == 2);  // in_proj_bias, out_proj.bias
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1, 3}, 2));
    CHECK(!ag_params_decays(mod.ps, mod.m.in_proj_bias));
    CHECK(!ag_params_decays(mod.ps, mod.m.out_proj.bias));
    CHECK(ag_params_decays(mod.ps, mod.m.in_proj_weight));
    CHECK(ag_params_decays(mod.ps, mod.m.out_proj.weight));
    ag_params_free(mod.ps);
}

// A frozen projection (fine-tuning the rest) stays frozen when pruned: the resize made it
// require grad again, and the next optimizer trained it.
static void test_pruning_keeps_a_frozen_projection_frozen(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 16, .num_heads = 4};
    module_init(&mod, &cfg, AG_F32, 7);
    ag_tensor_set_requires_grad(mod.m.in_proj_weight, false);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1, 3}, 2));
    CHECK(!mod.m.in_proj_weight->requires_grad);
    CHECK(mod.m.in_proj_bias->requires_grad && mod.m.out_proj.weight->requires_grad);
    ag_params_free(mod.ps);
}

// Pruning repacks the store under the optimizer's state: its step says the store shrank
// and asks for a new optimizer, and changes nothing.
static void test_an_optimizer_made_before_pruning_says_the_store_shrank_and_to_make_a_new_one(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 16, .num_heads = 4};
    module_init(&mod, &cfg, AG_F32, 7);
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    ag_optim *opt = ag_optim_new(mod.ps, &oc);
    size_t before = ag_params_buffer_len(mod.ps);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1, 3}, 2));
    size_t after = ag_params_buffer_len(mod.ps);
    char want[160];
    snprintf(want, sizeof want, "optim_step: the parameter store shrank from %zu to %zu elements",
             before, after);
    testing_catch_errors();
    ag_optim_step(opt);
    testing_release_errors();
    CHECK(after < before && testing_error_count == 1);
    CHECK(strstr(testing_last_error, want) && strstr(testing_last_error, "'attn.in_proj_weight'"));
    CHECK(strstr(testing_last_error, "make a new optimizer for the store as it is now"));
    CHECK(ag_optim_step_count(opt) == 0);
    ag_optim_free(opt);
    ag_params_free(mod.ps);
}

// Pruning between a forward and its backward: the tape's nodes read the parameters at their
// new shapes against outputs and gradients of the old ones. Backward ran (a silently wrong
// gradient; a parameter grown instead would be read past its recorded outputs), and so did
// ag_tape_check (a false failure) and ag_tape_html; each now refuses the tape in one line,
// and a forward recorded again runs.
static void test_a_tape_recorded_before_pruning_is_refused(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2};
    module_init(&mod, &cfg, AG_F64, 11);
    ag_pcg32 rng = ag_pcg32_make(12, 1);
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){2, 3, 8}, &rng, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_mha_forward(tp, &mod.m, x, x, x, NULL, NULL);
    ag_tensor *loss = ag_sum(tp, ag_mul(tp, y, y));
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1}, 1));
    const char *why = "parameter 'attn.out_proj.weight' was resized from [8,8] to [8,4] after "
                      "this tape recorded it (ag_params_resize, as ag_mha_prune_heads does): "
                      "reset the tape and run the forward again";
    char want[320];
    testing_catch_errors();
    ag_backward(tp, loss);
    snprintf(want, sizeof want, "backward: %s", why);
    CHECK(testing_error_was(want));
    for (int i = 0; i < ag_params_count(mod.ps); i++)  // no gradient moved
        CHECK(ag_tensor_grad_item(ag_params_at(mod.ps, i), 0) == 0);
    ag_tape_check_report r;
    CHECK(!ag_tape_check(tp, NULL, &r));
    snprintf(want, sizeof want, "tape_check: %s", why);
    CHECK(testing_error_was(want));
    ag_tape_check_report_free(&r);
    ag_err err;
    CHECK(ag_tape_html(tp, "test_mha_prune_refused.html", NULL, &err) == -1);
    snprintf(want, sizeof want, "tape_html: %s", why);
    CHECK(testing_error_was(want) && strcmp(err.msg, want) == 0);
    testing_release_errors();
    ag_tape_reset(tp);
    y = ag_mha_forward(tp, &mod.m, x, x, x, NULL, NULL);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, y, y)));
    CHECK(mod.m.out_proj.weight->grad && ag_tensor_grad_item(mod.m.out_proj.weight, 0) != 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(mod.ps);
}

static void test_a_pruned_module_checkpoints_and_reloads_with_its_head_count(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    module_init(&mod, &cfg, AG_F64, 10);
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){0, 2}, 2));
    char path[] = "test_mha_prune.safetensors", heads[16], dim[16];
    snprintf(heads, sizeof heads, "%d", mod.m.cfg.num_heads);
    snprintf(dim, sizeof dim, "%d", mod.m.head_dim);
    ag_err err;
    CHECK(ag_params_save(mod.ps, path,
                         (const char *[]){"attn.num_heads", heads, "attn.head_dim", dim, NULL},
                         &err) == 0);
    // Reload as a user would: the head count from the metadata, then the weights.
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && strcmp(ag_safetensors_meta(st, "attn.num_heads"), "2") == 0);
    ag_mha_config back = {.embed_dim = 8,
                          .num_heads = atoi(ag_safetensors_meta(st, "attn.num_heads")),
                          .head_dim = atoi(ag_safetensors_meta(st, "attn.head_dim"))};
    module re;
    module_init(&re, &back, AG_F64, 11);
    CHECK(ag_params_load(re.ps, path, &err) == 0);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){2, 3, 8}, 12, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y1 = ag_mha_forward(tp, &mod.m, x, x, x, NULL, NULL);
    ag_tensor *y2 = ag_mha_forward(tp, &re.m, x, x, x, NULL, NULL);
    CHECK(y1 && y2 && normwise_error(y2, y1, false) == 0.0);
    // The unpruned shape does not load the pruned file.
    module full;
    module_init(&full, &cfg, AG_F64, 13);
    CHECK(ag_params_load(full.ps, path, &err) != 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_safetensors_free(st);
    ag_params_free(mod.ps);
    ag_params_free(re.ps);
    ag_params_free(full.ps);
    remove(path);
}

// ag_block_config has no head_dim, so a block is rebuilt at its pruned shape the way it
// got there: made whole, then as many heads pruned (which ones does not matter: the
// weights loaded replace them all).
static void test_a_pruned_block_reloads_into_a_whole_block_pruned_alike(void) {
    const ag_block_config cfg = {.d_model = 8, .num_heads = 4, .dim_feedforward = 16};
    ag_params *ps = ag_params_new(AG_F64), *ps2 = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(20, 1);
    ag_block b, b2;
    CHECK(ag_block_init(&b, ps, "layer", &cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.7, 0.7);
    CHECK(ag_mha_prune_heads(&b.self_attn, ps, (int[]){1, 3}, 2));
    char path[] = "test_mha_prune_block.safetensors";
    ag_err err;
    CHECK(ag_params_save(ps, path, NULL, &err) == 0);
    CHECK(ag_block_init(&b2, ps2, "layer", &cfg, &rng));
    CHECK(ag_params_load(ps2, path, &err) != 0);  // the whole shape does not take it
    CHECK(ag_mha_prune_heads(&b2.self_attn, ps2, (int[]){0, 1}, 2));
    CHECK(ag_params_load(ps2, path, &err) == 0);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){2, 5, 8}, 21, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y1 = ag_block_forward(tp, &b, x, &(ag_block_opts){.causal = true});
    ag_tensor *y2 = ag_block_forward(tp, &b2, x, &(ag_block_opts){.causal = true});
    CHECK(y1 && y2 && normwise_error(y2, y1, false) == 0.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
    ag_params_free(ps2);
    remove(path);
}

static void test_bad_head_lists_are_one_line_errors_and_change_nothing(void) {
    module mod;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    module_init(&mod, &cfg, AG_F64, 14);
    size_t numel = ag_params_numel(mod.ps);
    testing_catch_errors();
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1, 4}, 2));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: head 4 is out of range [0, 4)") == 0);
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){-1}, 1));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: head -1 is out of range [0, 4)") == 0);
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){2, 0, 2}, 3));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: head 2 is listed twice (of 4 heads)") ==
          0);
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){0, 1, 2, 3}, 4));
    CHECK(strcmp(testing_last_error,
                 "mha_prune_heads: cannot prune 4 of 4 heads (at least one must stay)") == 0);
    ag_params *other = ag_params_new(AG_F64);
    CHECK(!ag_mha_prune_heads(&mod.m, other, (int[]){0}, 1));
    CHECK(strcmp(testing_last_error,
                 "mha_prune_heads: attn.in_proj_weight is not in this parameter store") == 0);
    testing_release_errors();
    CHECK(mod.m.cfg.num_heads == 4 && ag_params_numel(mod.ps) == numel);
    ag_params_free(other);
    ag_params_free(mod.ps);
}


// A list with a repeat is "listed twice" even when it is as long as the head count; and a
// module one of whose tensors does not hold its heads (here out_proj.weight, the sixth to
// be cut) is refused before anything changes: no tensor half-pruned, the store as it was.
static void test_every_check_comes_before_the_first_change(void) {
    module mod;
    ag_mha_config two = {.embed_dim = 8, .num_heads = 2};
    module_init(&mod, &two, AG_F64, 15);
    testing_catch_errors();
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){1, 1}, 2));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: head 1 is listed twice (of 2 heads)") ==
          0);
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){0, 1, 0}, 3));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: head 0 is listed twice (of 2 heads)") ==
          0);
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, NULL, 1));
    CHECK(strcmp(testing_last_error,
                 "mha_prune_heads: n = 1 heads to prune, but the list is NULL") == 0);
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){0}, -1));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: n = -1 heads to prune; it must be >= 0") ==
          0);
    testing_release_errors();
    CHECK(mod.m.cfg.num_heads == 2);
    ag_params_free(mod.ps);

    ag_mha_config four = {.embed_dim = 8, .num_heads = 4};
    module_init(&mod, &four, AG_F64, 16);
    ag_tensor *odd = ag_params_add(mod.ps, "attn.odd", 2, (int[]){8, 6});
    ag_tensor *out_w = mod.m.out_proj.weight;
    mod.m.out_proj.weight = odd;
    size_t numel = ag_params_numel(mod.ps);
    double *before = malloc(numel * sizeof *before);
    size_t k = 0;
    for (int i = 0; i < ag_params_count(mod.ps); i++)
        for (size_t e = 0; e < ag_params_at(mod.ps, i)->numel; e++)
            before[k++] = ag_tensor_item(ag_params_at(mod.ps, i), e);
    testing_catch_errors();
    CHECK(!ag_mha_prune_heads(&mod.m, mod.ps, (int[]){2}, 1));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: attn.odd [8,6] does not hold 4 heads of "
                                     "width 2 (last dim 8)") == 0);
    testing_release_errors();
    CHECK(mod.m.cfg.num_heads == 4 && ag_params_numel(mod.ps) == numel);
    CHECK(mod.m.in_proj_weight->shape[0] == 24 && mod.m.in_proj_bias->shape[0] == 24);
    k = 0;
    bool same = true;
    for (int i = 0; i < ag_params_count(mod.ps); i++)
        for (size_t e = 0; e < ag_params_at(mod.ps, i)->numel; e++)
            same = same && ag_tensor_item(ag_params_at(mod.ps, i), e) == before[k++];
    CHECK(same);
    mod.m.out_proj.weight = out_w;
    CHECK(ag_mha_prune_heads(&mod.m, mod.ps, (int[]){2}, 1));  // the module itself is fine
    CHECK(mod.m.cfg.num_heads == 3 && mod.m.in_proj_weight->shape[0] == 18);
    free(before);
    ag_params_free(mod.ps);
}

// A float64 gradcheck of modules whose h*d is less than E, fused and composed: one with
// head_dim set, and one with a head pruned (its projections cut to the heads left).
static void test_gradcheck_of_pruned_modules(void) {
    for (int w = 0; w < 2; w++) {
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 2, .head_dim = 3},
                            (ag_mha_opts){.causal = true}, true, w, NULL, 0, 10));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4},
                            (ag_mha_opts){.causal = true}, true, w, (int[]){1}, 1, 20));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 4, .kdim = 5,
                                             .vdim = 6},
                            (ag_mha_opts){0}, false, w, (int[]){0, 2}, 2, 30));
    }
}

int main(void) {
    RUN(test_pruned_output_and_gradients_equal_a_zero_head_mask);
    RUN(test_shapes_shrink_and_pruning_twice_composes);
    RUN(test_a_pruned_module_trains_with_a_new_optimizer_allocating_nothing);
    RUN(test_pruning_keeps_the_weight_decay_groups);
    RUN(test_pruning_keeps_a_frozen_projection_frozen);
    RUN(test_an_optimizer_made_before_pruning_says_the_store_shrank_and_to_make_a_new_one);
    RUN(test_a_tape_recorded_before_pruning_is_refused);
    RUN(test_a_pruned_module_checkpoints_and_reloads_with_its_head_count);
    RUN(test_a_pruned_block_reloads_into_a_whole_block_pruned_alike);
    RUN(test_bad_head_lists_are_one_line_errors_and_change_nothing);
    RUN(test_every_check_comes_before_the_first_change);
    RUN(test_gradcheck_of_pruned_modules);
    return testing_summary();
}
