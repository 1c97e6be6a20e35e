// MultiheadAttention's masks (issue 11): an attn_mask of any shape that broadcasts to the
// scores [B, h, T, S], in either polarity, on both paths (fused: no weights asked for;
// composed: weights asked for), alone and with add_bias_kv / add_zero_attn and causal,
// where the masks are padded for the extra keys:
// - a mask gives what its expansion to [B*h, T, S] gives (output and every gradient);
// - AG_MASK_KEEPS with a mask gives what AG_MASK_BLOCKS gives with the masks inverted;
// - an additive mask that requires grad gets its gradient (gradcheck), with extra keys too;
// - bad polarity and shapes are one-line errors; a repeated step allocates nothing.
// PyTorch's own values for these cases: tests/test_mha_pytorch.c.
#include <stdlib.h>

#include "op_checks.h"

enum { B = 2, E = 8, H = 2 };

typedef struct {
    ag_params *ps;
    ag_mha m;
} module;

// Biases start at zero in PyTorch's init: every parameter is drawn away from 0 instead.
static void module_init(module *mod, const ag_mha_config *cfg, ag_dtype dt, uint64_t seed) {
    mod->ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    CHECK(ag_mha_init(&mod->m, mod->ps, "", cfg, &rng));
    for (int i = 0; i < ag_params_count(mod->ps); i++)
        ag_tensor_init_uniform(ag_params_at(mod->ps, i), &rng, -0.7, 0.7);
}

// One forward and backward: the output, then the gradients of every parameter, of the
// distinct tensors among x[0..2], and of an additive attn_mask that requires grad, in one
// malloc'd array of *n values.
static double *run(module *mod, ag_tensor *const x[3], ag_tensor *dy, const ag_mha_opts *o,
                   bool weights, size_t *n) {
    ag_params_zero_grad(mod->ps);
    for (int i = 0; i < 3; i++) ag_tensor_zero_grad(x[i]);
    if (o->attn_mask && o->attn_mask->requires_grad) ag_tensor_zero_grad(o->attn_mask);
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = NULL;
    ag_tensor *y = ag_mha_forward(tp, &mod->m, x[0], x[1], x[2], o, weights ? &w : NULL);
    CHECK(y != NULL && (!weights || w != NULL));
    if (!y) {
        ag_tape_free(tp);
        *n = 0;
        return NULL;
    }
    ag_backward_with(tp, y, dy);
    const ag_tensor *parts[16];
    int np = 0;
    for (int i = 0; i < ag_params_count(mod->ps); i++) parts[np++] = ag_params_at(mod->ps, i);
    for (int i = 0; i < 3; i++)
        if (i == 0 || (x[i] != x[0] && x[i] != x[i - 1])) parts[np++] = x[i];
    if (o->attn_mask && o->attn_mask->requires_grad) parts[np++] = o->attn_mask;
    size_t total = y->numel;
    for (int p = 0; p < np; p++) total += parts[p]->numel;
    double *v = malloc(total * sizeof *v);
    size_t k = 0;
    for (size_t e = 0; e < y->numel; e++) v[k++] = ag_tensor_item(y, e);
    for (int p = 0; p < np; p++)
        for (size_t e = 0; e < parts[p]->numel; e++) v[k++] = ag_tensor_grad_item(parts[p], e);
    ag_tape_free(tp);
    *n = total;
    return v;
}

static double diff(const double *a, const double *b, size_t n) {
    normwise e = {0, 0};
    for (size_t i = 0; i < n; i++) normwise_add(&e, a[i], b[i]);
    return normwise_result(e);
}

// m broadcast to [B*h, T, S] (its dims right-aligned with [B, h, T, S]): the explicit
// form, with nothing left to broadcast.
static ag_tensor *expanded(const ag_tensor *m, int h, int T, int S) {
    int ms[4] = {1, 1, 1, 1};
    for (int k = 0; k < m->ndim; k++) ms[4 - m->ndim + k] = m->shape[k];
    ag_tensor *x = ag_tensor_zeros(m->dtype, 3, (int[]){B * h, T, S});
    size_t e = 0;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < h; j++)
            for (int t = 0; t < T; t++)
                for (int s = 0; s < S; s++) {
                    size_t from = (((size_t)(ms[0] > 1 ? b : 0) * ms[1] + (ms[1] > 1 ? j : 0)) *
                                       ms[2] + (ms[2] > 1 ? t : 0)) * ms[3] + s;
                    ag_tensor_set_item(x, e++, ag_tensor_item(m, from));
                }
    return x;
}

static const char *shape_of(const ag_tensor *t) {
    static char buf[64];
    return ag_tensor_shape_str(t, buf, sizeof buf);
}

static ag_tensor *inverted(const ag_tensor *m) {
    ag_tensor *x = ag_tensor_zeros(AG_BOOL, m->ndim, m->shape);
    for (size_t e = 0; e < m->numel; e++) ((uint8_t *)x->data)[e] = !((uint8_t *)m->data)[e];
    return x;
}

// Mask shapes for T queries and S keys, every one broadcasting to [B, H, T, S].
static int mask_shapes(int T, int S, int shapes[][4], int *ndims) {
    const int all[][5] = {{4, B, 1, 1, S}, {4, B, 1, T, S}, {2, T, S},      {1, S},
                          {4, 1, 1, T, S}, {4, 1, H, T, S}, {4, B, H, T, S}};
    int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) {
        ndims[i] = all[i][0];
        for (int k = 0; k < ndims[i]; k++) shapes[i][k] = all[i][1 + k];
    }
    return n;
}

static const ag_mha_config configs[] = {
    {.embed_dim = E, .num_heads = H},
    {.embed_dim = E, .num_heads = H, .add_bias_kv = true},
    {.embed_dim = E, .num_heads = H, .add_zero_attn = true},
    {.embed_dim = E, .num_heads = H, .add_bias_kv = true, .add_zero_attn = true},
};
static const char *const config_names[] = {"plain", "add_bias_kv", "add_zero_attn", "both"};

typedef struct {
    ag_tensor *x[3], *dy;
    int T, S;
} inputs;

static inputs make_inputs(ag_dtype dt, bool self, int T, int S, uint64_t seed) {
    inputs in = {{NULL}, NULL, T, self ? T : S};
    in.x[0] = random_leaf(dt, 3, (int[]){B, T, E}, seed);
    in.x[1] = self ? in.x[0] : random_leaf(dt, 3, (int[]){B, S, E}, seed + 1);
    in.x[2] = self ? in.x[0] : random_leaf(dt, 3, (int[]){B, S, E}, seed + 2);
    in.dy = uniform_tensor(dt, 3, (int[]){B, T, E}, seed + 3, -1, 1);
    return in;
}

static void free_inputs(inputs *in) {
    ag_tensor_free(in->x[0]);
    if (in->x[1] != in->x[0]) ag_tensor_free(in->x[1]);
    if (in->x[2] != in->x[0]) ag_tensor_free(in->x[2]);
    ag_tensor_free(in->dy);
}

// The two runs of one comparison; prints what differs.
static bool same(module *mod, const inputs *in, const ag_mha_opts *a, const ag_mha_opts *b,
                 bool weights, double tol, const char *what) {
    size_t na, nb;
    double *ra = run(mod, in->x, in->dy, a, weights, &na);
    double *rb = run(mod, in->x, in->dy, b, weights, &nb);
    double d = na == nb && ra && rb ? diff(ra, rb, na) : INFINITY;
    if (!(d <= tol)) fprintf(stderr, "  %s (%s path): differs by %.3g\n", what,
                             weights ? "weights" : "fused", d);
    free(ra);
    free(rb);
    return d <= tol;
}

// Every mask shape, bool and additive, gives what its [B*h, T, S] expansion gives, with
// and without causal, for every extra-key config, on both paths, in self- and
// cross-attention. (With add_bias_kv or add_zero_attn and causal, a mask without a T dim
// was read as if it had one: 0.239 off for [B,1,1,S], 0.186 for [S].)
static void test_a_mask_gives_what_its_expansion_gives(void) {
    for (int dti = 0; dti < 2; dti++) {
        ag_dtype dt = dti ? AG_F64 : AG_F32;
        double tol = dti ? 1e-12 : 2e-6;
        for (int c = 0; c < 4; c++) {
            module mod;
            module_init(&mod, &configs[c], dt, 10 + (uint64_t)c);
            for (int self = 0; self < 2; self++) {
                inputs in = make_inputs(dt, self, 5, 6, 20 + (uint64_t)c);
                int shapes[8][4], ndims[8];
                int n = mask_shapes(in.T, in.S, shapes, ndims);
                for (int s = 0; s < n; s++)
                    for (int additive = 0; additive < 2; additive++) {
                        uint64_t seed = 100 + (uint64_t)s;
                        ag_tensor *m = additive
                                           ? uniform_tensor(dt, ndims[s], shapes[s], seed, -2, 2)
                                           : bool_mask(ndims[s], shapes[s], 0.3, seed);
                        ag_tensor *full = expanded(m, H, in.T, in.S);
                        for (int causal = 0; causal < 2; causal++)
                            for (int weights = 0; weights < 2; weights++) {
                                char what[160];
                                snprintf(what, sizeof what, "%s %s %s mask %s%s %s",
                                         ag_dtype_name(dt), config_names[c],
                                         additive ? "additive" : "bool", shape_of(m),
                                         causal ? " causal" : "", self ? "self" : "cross");
                                ag_mha_opts a = {.attn_mask = m, .causal = causal};
                                ag_mha_opts b = {.attn_mask = full, .causal = causal};
                                CHECK(same(&mod, &in, &a, &b, weights, tol, what));
                            }
                        ag_tensor_free(m);
                        ag_tensor_free(full);
                    }
                free_inputs(&in);
            }
            ag_params_free(mod.ps);
        }
    }
}

// Issue 20, item 13: a 3-D mask is one [T, S] plane per slice b*h + head, [B*h, T, S],
// never broadcast as [h, T, S]. With B = h (here 2 = 2), a per-batch [B, T, S] mask used
// to be read as per head, silently; it is refused, at the op as in the module, the
// message giving the 4-D forms. [B*h, T, S] gives what its [B, h, T, S] form gives, and a
// first dim of 1 what the [T, S] plane gives.
static void test_a_3d_mask_is_one_plane_per_slice_never_per_head_or_batch(void) {
    module mod;
    module_init(&mod, &configs[0], AG_F64, 90);
    inputs in = make_inputs(AG_F64, false, 5, 6, 91);
    ag_tensor *per_batch = bool_mask(3, (int[]){B, 5, 6}, 0.3, 92);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2],
                          &(ag_mha_opts){.attn_mask = per_batch}, NULL));
    CHECK(strcmp(testing_last_error,
                 "mha: attn_mask [2,5,6] does not match scores [2,2,5,6] (a 3-D mask is one "
                 "[T, S] plane per slice b*h + head: [4,5,6], or 1 for all; per head give "
                 "[1,2,5,6], per batch [2,1,5,6])") == 0);
    ag_tensor *scores = uniform_tensor(AG_F64, 4, (int[]){B, H, 5, 6}, 93, -1, 1);
    ag_tensor *per_head = bool_mask(3, (int[]){H, 5, 6}, 0.3, 94);
    CHECK(!ag_softmax(tp, scores, &(ag_softmax_opts){.mask = per_head}));
    CHECK(strstr(testing_last_error, "softmax: mask [2,5,6] does not match scores [2,2,5,6] "
                                     "(a 3-D mask is one [T, S] plane per slice") ==
          testing_last_error);
    testing_release_errors();
    ag_tape_free(tp);
    // Per slice, and the same plane for every slice.
    ag_tensor *slices = bool_mask(3, (int[]){B * H, 5, 6}, 0.3, 95);
    ag_tensor *slices4 = ag_tensor_zeros(AG_BOOL, 4, (int[]){B, H, 5, 6});
    memcpy(slices4->data, slices->data, slices->numel);
    ag_tensor *plane = bool_mask(2, (int[]){5, 6}, 0.3, 96);
    ag_tensor *plane3 = ag_tensor_zeros(AG_BOOL, 3, (int[]){1, 5, 6});
    memcpy(plane3->data, plane->data, plane->numel);
    for (int weights = 0; weights < 2; weights++) {
        CHECK(same(&mod, &in, &(ag_mha_opts){.attn_mask = slices},
                   &(ag_mha_opts){.attn_mask = slices4}, weights, 0, "[B*h, T, S]"));
        CHECK(same(&mod, &in, &(ag_mha_opts){.attn_mask = plane3},
                   &(ag_mha_opts){.attn_mask = plane}, weights, 0, "[1, T, S]"));
    }
    ag_tensor *all[] = {per_batch, scores, per_head, slices, slices4, plane, plane3};
    for (int i = 0; i < 7; i++) ag_tensor_free(all[i]);
    free_inputs(&in);
    ag_params_free(mod.ps);
}

// AG_MASK_KEEPS with a bool mask and a key padding mask gives what AG_MASK_BLOCKS gives
// with both inverted; the extra keys stay visible either way.
static void test_keeps_equals_blocks_with_the_masks_inverted(void) {
    for (int dti = 0; dti < 2; dti++) {
        ag_dtype dt = dti ? AG_F64 : AG_F32;
        double tol = dti ? 1e-12 : 2e-6;
        for (int c = 0; c < 4; c++) {
            module mod;
            module_init(&mod, &configs[c], dt, 30 + (uint64_t)c);
            for (int self = 0; self < 2; self++) {
                inputs in = make_inputs(dt, self, 4, 6, 40 + (uint64_t)c);
                int shapes[8][4], ndims[8];
                int n = mask_shapes(in.T, in.S, shapes, ndims);
                ag_tensor *kpm = bool_mask(2, (int[]){B, in.S}, 0.6, 7);
                ag_tensor *kpm_inv = inverted(kpm);
                for (int s = 0; s < n; s++) {
                    ag_tensor *m = bool_mask(ndims[s], shapes[s], 0.4, 200 + (uint64_t)s);
                    ag_tensor *m_inv = inverted(m);
                    for (int causal = 0; causal < 2; causal++)
                        for (int weights = 0; weights < 2; weights++) {
                            char what[160];
                            snprintf(what, sizeof what, "%s %s keeps mask %s%s %s",
                                     ag_dtype_name(dt), config_names[c], shape_of(m),
                                     causal ? " causal" : "", self ? "self" : "cross");
                            ag_mha_opts keeps = {.attn_mask = m, .key_padding_mask = kpm,
                                                 .causal = causal,
                                                 .mask_polarity = AG_MASK_KEEPS};
                            ag_mha_opts blocks = {.attn_mask = m_inv, .key_padding_mask = kpm_inv,
                                                  .causal = causal};
                            CHECK(same(&mod, &in, &keeps, &blocks, weights, tol, what));
                        }
                    ag_tensor_free(m);
                    ag_tensor_free(m_inv);
                }
                ag_tensor_free(kpm);
                ag_tensor_free(kpm_inv);
                free_inputs(&in);
            }
            ag_params_free(mod.ps);
        }
    }
}

// A bool byte other than 0 (ag_tensor_from copies the bytes it is given) means true on
// every path, as the fused kernels and ag_softmax read it: with AG_MASK_KEEPS the extra
// keys' padding took a 2 for "blocked" (2 != keeps), so add_bias_kv attended nothing where
// the plain module attended the key.
static void test_a_nonzero_bool_byte_is_true_with_extra_keys_and_keeps(void) {
    for (int c = 0; c < 4; c++) {
        module mod;
        module_init(&mod, &configs[c], AG_F64, 50 + (uint64_t)c);
        inputs in = make_inputs(AG_F64, true, 4, 4, 60 + (uint64_t)c);
        ag_tensor *m = bool_mask(2, (int[]){4, 4}, 0.5, 61);
        ag_tensor *kpm = bool_mask(2, (int[]){B, 4}, 0.7, 62);
        ag_tensor *m2 = ag_tensor_from(AG_BOOL, 2, m->shape, m->data);
        ag_tensor *kpm2 = ag_tensor_from(AG_BOOL, 2, kpm->shape, kpm->data);
        for (size_t e = 0; e < m2->numel; e++) ((uint8_t *)m2->data)[e] *= 2;
        for (size_t e = 0; e < kpm2->numel; e++) ((uint8_t *)kpm2->data)[e] *= 255;
        for (int weights = 0; weights < 2; weights++) {
            ag_mha_opts ones = {.attn_mask = m, .key_padding_mask = kpm,
                                .mask_polarity = AG_MASK_KEEPS};
            ag_mha_opts other = {.attn_mask = m2, .key_padding_mask = kpm2,
                                 .mask_polarity = AG_MASK_KEEPS};
            CHECK(same(&mod, &in, &ones, &other, weights, 0, config_names[c]));
            ones.mask_polarity = other.mask_polarity = AG_MASK_BLOCKS;
            CHECK(same(&mod, &in, &ones, &other, weights, 0, config_names[c]));
        }
        ag_tensor_free(m);
        ag_tensor_free(kpm);
        ag_tensor_free(m2);
        ag_tensor_free(kpm2);
        free_inputs(&in);
        ag_params_free(mod.ps);
    }
}

// ---- Gradient checks -----------------------------------------------------------------------

typedef struct {
    module mod;
    ag_mha_opts opts;
    bool weights;
} grad_case;

// in: query (also key and value), the parameters, then the attn_mask when it requires grad.
static ag_tensor *mha_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    grad_case *c = user;
    ag_mha_opts o = c->opts;
    if (o.attn_mask && o.attn_mask->requires_grad) o.attn_mask = in[n - 1];
    ag_tensor *w = NULL;
    return ag_mha_forward(tp, &c->mod.m, in[0], in[0], in[0], &o, c->weights ? &w : NULL);
}

static bool gradcheck_masks(const ag_mha_config *cfg, ag_mha_opts opts, int T, bool weights,
                            uint64_t seed) {
    grad_case c = {.opts = opts, .weights = weights};
    module_init(&c.mod, cfg, AG_F64, seed);
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){B, T, E}, seed + 1);
    ag_tensor *in[16];
    int n = 0;
    in[n++] = x;
    for (int i = 0; i < ag_params_count(c.mod.ps); i++) in[n++] = ag_params_at(c.mod.ps, i);
    if (opts.attn_mask && opts.attn_mask->requires_grad) in[n++] = opts.attn_mask;
    ag_gradcheck_result r;
    bool ok = ag_gradcheck(mha_fn, in, n, &c, NULL, &r);
    if (!ok) fprintf(stderr, "  gradcheck: max abs err %.3g\n", r.fd.max_abs_err);
    ag_tensor_free(x);
    ag_params_free(c.mod.ps);
    return ok;
}

// An additive mask's gradient flows with the extra keys too (the padded copy used to drop
// it silently): gradcheck with the mask among the inputs, causal, both paths; and a bool
// mask in AG_MASK_KEEPS with a key padding mask.
static void test_gradcheck_with_extra_keys_additive_mask_and_keeps(void) {
    const int T = 4;
    ag_tensor *masks[] = {random_leaf(AG_F64, 4, (int[]){B, 1, 1, T}, 50),
                          random_leaf(AG_F64, 2, (int[]){T, T}, 51),
                          random_leaf(AG_F64, 1, (int[]){T}, 52),
                          random_leaf(AG_F64, 3, (int[]){B * H, T, T}, 53)};
    ag_tensor *keep = bool_mask(4, (int[]){B, 1, 1, T}, 0.5, 54);
    ag_tensor *kpm = bool_mask(2, (int[]){B, T}, 0.3, 55);
    for (int c = 1; c < 4; c++)
        for (int weights = 0; weights < 2; weights++) {
            for (int i = 0; i < 4; i++)
                CHECK(gradcheck_masks(&configs[c], (ag_mha_opts){.attn_mask = masks[i],
                                                                 .causal = i % 2 == 0},
                                      T, weights, 60 + (uint64_t)c));
            CHECK(gradcheck_masks(&configs[c],
                                  (ag_mha_opts){.attn_mask = keep, .key_padding_mask = kpm,
                                                .causal = true, .mask_polarity = AG_MASK_KEEPS},
                                  T, weights, 70 + (uint64_t)c));
        }
    for (int i = 0; i < 4; i++) ag_tensor_free(masks[i]);
    ag_tensor_free(keep);
    ag_tensor_free(kpm);
}

// The gradient an additive [B,1,1,S] mask receives is its expansion's gradient summed over
// the dims it broadcasts over, on both paths, with the extra keys and causal.
static void test_a_broadcast_additive_mask_gets_its_expansions_gradient_summed(void) {
    module mod;
    module_init(&mod, &configs[3], AG_F64, 80);
    inputs in = make_inputs(AG_F64, true, 5, 5, 81);
    ag_tensor *m = random_leaf(AG_F64, 4, (int[]){B, 1, 1, 5}, 82);
    ag_tensor *full = requiring_grad(expanded(m, H, 5, 5));
    for (int weights = 0; weights < 2; weights++) {
        size_t n;
        ag_mha_opts a = {.attn_mask = m, .causal = true}, b = {.attn_mask = full, .causal = true};
        free(run(&mod, in.x, in.dy, &a, weights, &n));
        free(run(&mod, in.x, in.dy, &b, weights, &n));
        normwise e = {0, 0};
        for (int bb = 0; bb < B; bb++)
            for (int s = 0; s < 5; s++) {
                double sum = 0;
                for (int j = 0; j < H * 5; j++)
                    sum += ag_tensor_grad_item(full, ((size_t)bb * H * 5 + (size_t)j) * 5 + s);
                normwise_add(&e, ag_tensor_grad_item(m, (size_t)bb * 5 + s), sum);
            }
        CHECK(normwise_result(e) < 1e-12);
        CHECK(ag_tensor_grad_item(m, 0) != 0);
    }
    ag_tensor_free(m);
    ag_tensor_free(full);
    free_inputs(&in);
    ag_params_free(mod.ps);
}

// ---- Errors and memory ---------------------------------------------------------------------

static void test_bad_polarity_and_mask_shapes_are_one_line_errors(void) {
    module mod;
    module_init(&mod, &configs[3], AG_F64, 90);
    inputs in = make_inputs(AG_F64, false, 4, 6, 91);
    ag_tensor *m = bool_mask(4, (int[]){B, 1, 3, 6}, 0.3, 92);
    ag_tensor *kpm = bool_mask(2, (int[]){B, 7}, 0.3, 93);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    ag_mha_opts o = {.mask_polarity = (ag_mask_polarity)7};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(strcmp(testing_last_error,
                 "mha: unknown mask_polarity 7 (AG_MASK_BLOCKS or AG_MASK_KEEPS)") == 0);
    o = (ag_mha_opts){.attn_mask = m, .causal = true};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(strcmp(testing_last_error,
                 "mha: attn_mask [2,1,3,6] does not match scores [2,2,4,6] (expected [4,6], "
                 "[4,4,6] "
                 "or a shape that broadcasts to [2,2,4,6])") == 0);
    o = (ag_mha_opts){.key_padding_mask = kpm};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(strcmp(testing_last_error, "mha: key_padding_mask [2,7] must end in S = 6 keys with "
                                     "add_bias_kv or add_zero_attn") == 0);
    ag_tensor *kpm_f = uniform_tensor(AG_F64, 2, (int[]){B, 6}, 94, 0, 1);
    o = (ag_mha_opts){.key_padding_mask = kpm_f};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(strcmp(testing_last_error,
                 "mha: key_padding_mask [2,6] must be bool (true = masked), not f64") == 0);
    // With the extra keys, the masks were checked only after their padding, so the messages
    // named the padded shapes: a 3-D mask [8,4,6] was "mask [8,4,8]", expected "[4,4,8]" (it
    // must be [4,4,6]), a key padding mask [3,6] was "[3,8]", expected "[2,8]"; and an
    // integer mask was refused by the padding's concat ("concat: xs[0] [4,6] must be f32 or
    // f64").
    ag_tensor *planes = bool_mask(3, (int[]){2 * B * H, 4, 6}, 0.3, 96);
    ag_tensor *ints = ag_tensor_zeros(AG_I32, 2, (int[]){4, 6});
    ag_tensor *kpm_b = bool_mask(2, (int[]){B + 1, 6}, 0.3, 97);
    testing_error_count = 0;
    o = (ag_mha_opts){.attn_mask = planes};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(testing_error_was("mha: attn_mask [8,4,6] does not match scores [2,2,4,6] (a 3-D "
                            "mask is "
                            "one [T, S] plane per slice b*h + head: [4,4,6], or 1 for all; per "
                            "head give [1,2,4,6], per batch [2,1,4,6])"));
    o = (ag_mha_opts){.attn_mask = ints};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(testing_error_was("mha: attn_mask [4,6] is i32 but scores [2,2,4,6] are f64"));
    o = (ag_mha_opts){.key_padding_mask = kpm_b};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(testing_error_was("mha: key_padding_mask [3,6] does not match query [2,4,8] and key "
                            "[2,6,8] (expected [2,6])"));
    ag_tensor_free(planes);
    ag_tensor_free(ints);
    ag_tensor_free(kpm_b);
    // Without extra keys too, the module checks the masks as given, under its own names
    // (the softmax's "mask" was the caller's attn_mask); with the weights asked for (the
    // composed path) the softmax's line was followed by "dropout: x is NULL".
    module plain;
    module_init(&plain, &configs[0], AG_F64, 95);
    ag_tensor *w = NULL;
    testing_error_count = 0;
    o = (ag_mha_opts){.key_padding_mask = kpm};
    CHECK(!ag_mha_forward(tp, &plain.m, in.x[0], in.x[1], in.x[2], &o, &w));
    CHECK(testing_error_was("mha: key_padding_mask [2,7] does not match query [2,4,8] and key "
                            "[2,6,8] (expected [2,6])"));
    o = (ag_mha_opts){.attn_mask = m};
    CHECK(!ag_mha_forward(tp, &plain.m, in.x[0], in.x[1], in.x[2], &o, &w));
    CHECK(testing_error_was("mha: attn_mask [2,1,3,6] does not match scores [2,2,4,6] (expected "
                            "[4,6], [4,4,6] or a shape that broadcasts to [2,2,4,6])"));
    CHECK(w == NULL);
    ag_params_free(plain.ps);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(m);
    ag_tensor_free(kpm);
    ag_tensor_free(kpm_f);
    free_inputs(&in);
    ag_params_free(mod.ps);
}

typedef struct {
    module *mod;
    inputs *in;
    ag_mha_opts opts;
    bool weights;
} step_data;

static void masked_step(ag_tape *tp, int step, void *user) {
    (void)step;
    step_data *d = user;
    ag_params_zero_grad(d->mod->ps);
    ag_tensor *w = NULL;
    ag_tensor *y = ag_mha_forward(tp, &d->mod->m, d->in->x[0], d->in->x[1], d->in->x[2],
                                  &d->opts, d->weights ? &w : NULL);
    ag_backward_with(tp, y, d->in->dy);
}

// A mask without data (the gradient view of a tensor no backward has reached): with
// add_bias_kv the module pads a bool mask itself, and read such a mask as no mask at all,
// attending to every key; it is refused, as any op refuses such an input.
static void test_a_mask_without_data_is_refused_not_dropped(void) {
    module mod;
    module_init(&mod, &configs[1], AG_F64, 96);
    inputs in = make_inputs(AG_F64, false, 4, 6, 97);
    ag_tensor *kpm = bool_mask(2, (int[]){B, 6}, 0.3, 98);
    ag_tensor *m = bool_mask(2, (int[]){4, 6}, 0.3, 99);
    ag_tensor kpm_view = ag_tensor_grad_view(kpm), m_view = ag_tensor_grad_view(m);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    ag_mha_opts o = {.key_padding_mask = &kpm_view};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(testing_error_was("mha: key_padding_mask [2,6] has no data (a gradient view no "
                            "backward has reached)"));
    o = (ag_mha_opts){.attn_mask = &m_view, .causal = true};
    CHECK(!ag_mha_forward(tp, &mod.m, in.x[0], in.x[1], in.x[2], &o, NULL));
    CHECK(testing_error_was("mha: attn_mask [4,6] has no data (a gradient view no backward has "
                            "reached)"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(m);
    ag_tensor_free(kpm);
    free_inputs(&in);
    ag_params_free(mod.ps);
}

static void test_a_repeated_masked_step_allocates_nothing(void) {
    module mod;
    module_init(&mod, &configs[3], AG_F32, 95);
    inputs in = make_inputs(AG_F32, true, 6, 6, 96);
    ag_tensor *add = random_leaf(AG_F32, 4, (int[]){B, 1, 1, 6}, 97);
    ag_tensor *m = bool_mask(1, (int[]){6}, 0.3, 98);
    ag_tensor *kpm = bool_mask(2, (int[]){B, 6}, 0.3, 99);
    for (int weights = 0; weights < 2; weights++) {
        step_data d = {&mod, &in, {.attn_mask = add, .causal = true}, weights};
        CHECK(repeated_step_allocates_nothing(masked_step, &d));
        d.opts = (ag_mha_opts){.attn_mask = m, .key_padding_mask = kpm, .causal = true,
                               .mask_polarity = AG_MASK_KEEPS};
        CHECK(repeated_step_allocates_nothing(masked_step, &d));
    }
    ag_tensor_free(add);
    ag_tensor_free(m);
    ag_tensor_free(kpm);
    free_inputs(&in);
    ag_params_free(mod.ps);
}

int main(void) {
    RUN(test_a_mask_gives_what_its_expansion_gives);
    RUN(test_a_3d_mask_is_one_plane_per_slice_never_per_head_or_batch);
    RUN(test_keeps_equals_blocks_with_the_masks_inverted);
    RUN(test_a_nonzero_bool_byte_is_true_with_extra_keys_and_keeps);
    RUN(test_gradcheck_with_extra_keys_additive_mask_and_keeps);
    RUN(test_a_broadcast_additive_mask_gets_its_expansions_gradient_summed);
    RUN(test_bad_polarity_and_mask_shapes_are_one_line_errors);
    RUN(test_a_mask_without_data_is_refused_not_dropped);
    RUN(test_a_repeated_masked_step_allocates_nothing);
    return testing_summary();
}
