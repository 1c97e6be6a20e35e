// The optimizers against torch.optim 1.13 (parameters after every step of a
// fixed gradient sequence, tests/reference/optim_reference.h; PyTorch's state
// before its first step, loaded from tests/reference/optim_*_step0.safetensors),
// gradient clipping against torch.nn.utils.clip_grad_norm_, and the properties a
// training loop relies on: no allocation per step, untouched padding,
// bit-exact resumption, thread-count independence, the LR schedule.
#include <stdlib.h>

#include "attograd/io.h"
#include "attograd/optim.h"
#include "reference/optim_reference.h"
#include "testing.h"

// ---- Helpers ------------------------------------------------------------------

// |got - want| <= tol * |want|: relative, also for small values.
static void check_relative(double got, double want, double tol, const char *what, int step,
                           int i) {
    if (fabs(got - want) <= tol * fabs(want)) return;
    char m[256];
    snprintf(m, sizeof m, "%s, step %d, element %d: got %.17g, want %.17g (rel tol %g)", what,
             step + 1, i, got, want, tol);
    testing_fail(__FILE__, __LINE__, m);
}

static bool error_contains(const char *text) {
    return testing_error_count > 0 && strstr(testing_last_error, text) != NULL;
}

static double load(const void *p, ag_dtype dt, size_t i) {
    return dt == AG_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static void store(void *p, ag_dtype dt, size_t i, double v) {
    if (dt == AG_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

// The reference parameters, laid out by the store with padding between them.
static ag_params *reference_store(ag_dtype dt) {
    ag_params *ps = ag_params_new(dt);
    for (int i = 0; i < OPTREF_PARAMS; i++)
        ag_params_add(ps, optref_names[i], optref_ndim[i], optref_shape[i]);
    return ps;
}

// Writes OPTREF_NUMEL values (the parameters concatenated) into the values
// (grad = false) or the gradients of the store's parameters.
static void scatter(ag_params *ps, const double *src, bool grad) {
    size_t k = 0;
    for (int i = 0; i < ag_params_count(ps); i++) {
        ag_tensor *t = ag_params_at(ps, i);
        for (size_t j = 0; j < t->numel; j++) store(grad ? t->grad : t->data, t->dtype, j, src[k++]);
    }
}

static double gather(const ag_params *ps, int flat, bool grad) {
    for (int i = 0; i < ag_params_count(ps); i++) {
        const ag_tensor *t = ag_params_at(ps, i);
        if ((size_t)flat < t->numel) return load(grad ? t->grad : t->data, t->dtype, (size_t)flat);
        flat -= (int)t->numel;
    }
    return NAN;
}

static const optref_case *reference_case(const char *name) {
    for (size_t i = 0; i < sizeof optref_cases / sizeof optref_cases[0]; i++)
        if (strcmp(optref_cases[i].name, name) == 0) return &optref_cases[i];
    fprintf(stderr, "no reference case %s\n", name);
    abort();
}

static ag_optim_config reference_config(const optref_case *rc) {
    ag_optim_config c = ag_optim_defaults(rc->kind);
    c.lr = rc->lr[0];
    c.momentum = rc->momentum;
    c.dampening = rc->dampening;
    c.nesterov = rc->nesterov;
    c.weight_decay = rc->weight_decay;
    c.beta1 = rc->beta1;
    c.beta2 = rc->beta2;
    c.eps = rc->eps;
    c.alpha = rc->alpha;
    c.centered = rc->centered;
    return c;
}

// Replays the reference gradients from the reference parameters in `ps`,
// through `o`, and compares the parameters after every step with PyTorch's run
// in the same dtype (f32 also with the f64 run), and the final state with
// PyTorch's (f64 run).
static void replay_into(const optref_case *rc, ag_params *ps, ag_optim *o) {
    ag_dtype dt = ag_params_dtype(ps);
    for (int step = 0; step < OPTREF_STEPS; step++) {
        ag_optim_set_lr(o, rc->lr[step]);
        scatter(ps, optref_grads[step], true);
        ag_optim_step(o);
        for (int i = 0; i < OPTREF_NUMEL; i++) {
            double got = gather(ps, i, false);
            if (dt == AG_F64) {
                check_relative(got, rc->f64[step][i], 1e-12, "f64 vs torch f64", step, i);
            } else {
                check_relative(got, rc->f32[step][i], 1e-5, "f32 vs torch f32", step, i);
                check_relative(got, rc->f64[step][i], 1e-5, "f32 vs torch f64", step, i);
            }
        }
    }
    CHECK(ag_optim_step_count(o) == OPTREF_STEPS);
    // The state buffers hold what PyTorch's optimizer.state holds, at each
    // parameter's offset: a checkpoint can be exchanged with PyTorch.
    CHECK(ag_optim_state_count(o) == rc->n_state);
    for (int b = 0; b < rc->n_state && b < ag_optim_state_count(o); b++) {
        const void *state = ag_optim_state_data(o, b);
        size_t es = ag_dtype_size(dt);
        int flat = 0;
        for (int i = 0; i < ag_params_count(ps); i++) {
            const ag_tensor *t = ag_params_at(ps, i);
            size_t off = (size_t)((const char *)t->data - (const char *)ag_params_data(ps)) / es;
            for (size_t j = 0; j < t->numel; j++, flat++)
                check_relative(load(state, dt, off + j), rc->state[b][flat],
                               dt == AG_F64 ? 1e-12 : 1e-5, ag_optim_state_name(o, b),
                               OPTREF_STEPS - 1, flat);
        }
    }
}

static void replay(const char *name, ag_dtype dt) {
    const optref_case *rc = reference_case(name);
    ag_params *ps = reference_store(dt);
    scatter(ps, optref_init, false);
    ag_optim_config cfg = reference_config(rc);
    ag_optim *o = ag_optim_new(ps, &cfg);
    replay_into(rc, ps, o);
    ag_optim_free(o);
    ag_params_free(ps);
}

// A store with parameters of awkward sizes (so there is padding), values and
// gradients drawn from `rng`.
static ag_params *random_store(ag_dtype dt, const int *sizes, int n, ag_pcg32 *rng) {
    ag_params *ps = ag_params_new(dt);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "p%d", i);
        ag_tensor *t = ag_params_add(ps, name, 1, &sizes[i]);
        for (size_t j = 0; j < t->numel; j++) store(t->data, dt, j, ag_pcg32_normal(rng));
    }
    return ps;
}

static void random_grads(ag_params *ps, ag_pcg32 *rng) {
    for (int i = 0; i < ag_params_count(ps); i++) {
        ag_tensor *t = ag_params_at(ps, i);
        for (size_t j = 0; j < t->numel; j++) store(t->grad, t->dtype, j, ag_pcg32_normal(rng));
    }
}

static size_t buffer_bytes(const ag_params *ps) {
    return ag_params_buffer_len(ps) * ag_dtype_size(ag_params_dtype(ps));
}

// True when every element of `buf` outside the parameters is +0.0 (all bits
// zero).
static bool padding_is_zero(const ag_params *ps, const void *buf) {
    size_t es = ag_dtype_size(ag_params_dtype(ps)), at = 0;
    const unsigned char *b = buf;
    for (int i = 0; i <= ag_params_count(ps); i++) {
        size_t next = ag_params_buffer_len(ps);
        const ag_tensor *t = i < ag_params_count(ps) ? ag_params_at(ps, i) : NULL;
        if (t) next = (size_t)((const char *)t->data - (const char *)ag_params_data(ps)) / es;
        for (size_t k = at * es; k < next * es; k++)
            if (b[k]) return false;
        if (t) at = next + t->numel;
    }
    return true;
}

// ---- Against PyTorch ---------------------------------------------------------------

static void test_sgd_plain_matches_pytorch_f64(void) { replay("sgd_plain", AG_F64); }
static void test_sgd_plain_matches_pytorch_f32(void) { replay("sgd_plain", AG_F32); }

static void test_sgd_momentum_dampening_weight_decay_matches_pytorch_f64(void) {
    replay("sgd_momentum_dampening_weight_decay", AG_F64);
}
static void test_sgd_momentum_dampening_weight_decay_matches_pytorch_f32(void) {
    replay("sgd_momentum_dampening_weight_decay", AG_F32);
}

static void test_sgd_nesterov_matches_pytorch_f64(void) { replay("sgd_nesterov", AG_F64); }
static void test_sgd_nesterov_matches_pytorch_f32(void) { replay("sgd_nesterov", AG_F32); }

static void test_adam_matches_pytorch_f64(void) { replay("adam", AG_F64); }
static void test_adam_matches_pytorch_f32(void) { replay("adam", AG_F32); }

static void test_adam_weight_decay_and_custom_betas_match_pytorch_f64(void) {
    replay("adam_weight_decay", AG_F64);
}
static void test_adam_weight_decay_and_custom_betas_match_pytorch_f32(void) {
    replay("adam_weight_decay", AG_F32);
}

static void test_adamw_matches_pytorch_f64(void) { replay("adamw", AG_F64); }
static void test_adamw_matches_pytorch_f32(void) { replay("adamw", AG_F32); }

static void test_adamw_with_lr_changed_every_step_matches_pytorch_f64(void) {
    replay("adamw_changing_lr", AG_F64);
}
static void test_adamw_with_lr_changed_every_step_matches_pytorch_f32(void) {
    replay("adamw_changing_lr", AG_F32);
}

// Lion against its paper's update written in torch ops (torch 1.13 has no
// Lion); the last parameter's zero gradient checks sign(0) = 0.
static void test_lion_matches_its_update_in_torch_f64(void) { replay("lion", AG_F64); }
static void test_lion_matches_its_update_in_torch_f32(void) { replay("lion", AG_F32); }

static void test_lion_weight_decay_betas_and_changing_lr_match_torch_f64(void) {
    replay("lion_weight_decay_changing_lr", AG_F64);
}
static void test_lion_weight_decay_betas_and_changing_lr_match_torch_f32(void) {
    replay("lion_weight_decay_changing_lr", AG_F32);
}

static void test_rmsprop_matches_pytorch_f64(void) { replay("rmsprop", AG_F64); }
static void test_rmsprop_matches_pytorch_f32(void) { replay("rmsprop", AG_F32); }

static void test_rmsprop_momentum_weight_decay_and_custom_alpha_match_pytorch_f64(void) {
    replay("rmsprop_momentum_weight_decay", AG_F64);
}
static void test_rmsprop_momentum_weight_decay_and_custom_alpha_match_pytorch_f32(void) {
    replay("rmsprop_momentum_weight_decay", AG_F32);
}

static void test_rmsprop_centered_matches_pytorch_f64(void) { replay("rmsprop_centered", AG_F64); }
static void test_rmsprop_centered_matches_pytorch_f32(void) { replay("rmsprop_centered", AG_F32); }

static void test_rmsprop_centered_momentum_with_lr_changed_every_step_matches_pytorch_f64(void) {
    replay("rmsprop_centered_momentum_changing_lr", AG_F64);
}
static void test_rmsprop_centered_momentum_with_lr_changed_every_step_matches_pytorch_f32(void) {
    replay("rmsprop_centered_momentum_changing_lr", AG_F32);
}

// A gradient whose square and whose average's square both overflow float32: centered
// RMSprop's v - a * a is inf - inf, and the parameter becomes NaN, as PyTorch 1.13's plain
// kernels (ATEN_CPU_CAPABILITY=default) make it; its AVX2 addcmul is fused, gives inf and
// leaves the parameter at 1 (optim.h). With a gradient of 1e20 nothing overflows, and the
// parameter is PyTorch's (both kernels) 0.8994961977005005.
static void test_rmsprop_centered_overflowing_square_gives_nan_as_pytorchs_plain_kernels(void) {
    const float grads[2] = {1.9e21f, 1e20f};
    for (int c = 0; c < 2; c++) {
        ag_params *ps = ag_params_new(AG_F32);
        ag_tensor *p = ag_params_add(ps, "p", 1, (int[]){1});
        ag_tensor_fill(p, 1.0);
        ag_optim_config cfg = ag_optim_defaults(AG_RMSPROP);
        cfg.centered = true;
        ag_optim *o = ag_optim_new(ps, &cfg);
        ((float *)ag_params_grad(ps))[0] = grads[c];
        ag_optim_step(o);
        if (c == 0) CHECK(isnan(ag_tensor_item(p, 0)));
        else check_relative(ag_tensor_item(p, 0), 0.8994961977005005, 1e-6, "parameter", 0, 0);
        ag_optim_free(o);
        ag_params_free(ps);
    }
}

static void check_clip(const optref_clip *rc, ag_dtype dt) {
    ag_params *ps = reference_store(dt);
    scatter(ps, optref_clip_grads, true);
    double total = ag_params_clip_grad_norm(ps, rc->max_norm);
    double tol = dt == AG_F64 ? 1e-12 : 1e-6;
    check_relative(total, dt == AG_F64 ? rc->total_f64 : rc->total_f32, tol, "total norm", 0, 0);
    for (int i = 0; i < OPTREF_NUMEL; i++)
        check_relative(gather(ps, i, true), dt == AG_F64 ? rc->grads_f64[i] : rc->grads_f32[i],
                       tol, "clipped gradient", 0, i);
    CHECK(padding_is_zero(ps, ag_params_grad(ps)));
    ag_params_free(ps);
}

static void test_clip_grad_norm_matches_pytorch_when_clipping(void) {
    CHECK(optref_clips[0].total_f64 > optref_clips[0].max_norm);
    check_clip(&optref_clips[0], AG_F64);
    check_clip(&optref_clips[0], AG_F32);
}

static void test_clip_grad_norm_matches_pytorch_below_max_norm(void) {
    CHECK(optref_clips[1].total_f64 < optref_clips[1].max_norm);
    check_clip(&optref_clips[1], AG_F64);
    check_clip(&optref_clips[1], AG_F32);
}

// float32 gradients are squared and summed in double. PyTorch 1.13 sums them in float32:
// for these gradients its norm is inf (the squares pass FLT_MAX) and it scales every
// gradient by 0, and for tiny ones its norm is 0. Here the norm is the exact one,
// sqrt(2) * float(1e30), and clipping at 1 scales the gradients to (1, 1, 1e-30) / sqrt(2).
static void test_clip_grad_norm_float32_squares_neither_overflow_nor_underflow(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "p", 1, (int[]){3});
    float *g = ag_params_grad(ps);
    g[0] = g[1] = 1e30f;
    g[2] = 1;
    const double big = (double)1e30f;
    check_relative(ag_params_clip_grad_norm(ps, 1.0), sqrt(2.0) * big, 1e-12, "norm", 0, 0);
    check_relative(g[0], sqrt(0.5), 1e-6, "clipped gradient", 0, 0);
    check_relative(g[1], sqrt(0.5), 1e-6, "clipped gradient", 0, 1);
    check_relative(g[2], sqrt(0.5) / big, 1e-6, "clipped gradient", 0, 2);
    // Squares below FLT_MIN: PyTorch's float32 norm is 0; below max_norm, nothing scales.
    g[0] = 1e-30f, g[1] = 1e-40f, g[2] = 0;
    const double tiny = sqrt((double)1e-30f * 1e-30f + (double)1e-40f * 1e-40f);
    check_relative(ag_params_clip_grad_norm(ps, 1.0), tiny, 1e-12, "norm", 0, 0);
    CHECK(g[0] == 1e-30f && g[1] == 1e-40f && g[2] == 0);
    ag_params_free(ps);
}

// ---- Configuration and state -------------------------------------------------------

static void test_defaults_are_pytorchs(void) {
    ag_optim_config sgd = ag_optim_defaults(AG_SGD);
    CHECK(sgd.kind == AG_SGD && isnan(sgd.lr));
    CHECK(sgd.momentum == 0 && sgd.dampening == 0 && !sgd.nesterov && sgd.weight_decay == 0);
    ag_optim_config adam = ag_optim_defaults(AG_ADAM);
    CHECK(adam.kind == AG_ADAM && adam.lr == 1e-3 && adam.beta1 == 0.9 && adam.beta2 == 0.999);
    CHECK(adam.eps == 1e-8 && adam.weight_decay == 0);
    ag_optim_config adamw = ag_optim_defaults(AG_ADAMW);
    CHECK(adamw.kind == AG_ADAMW && adamw.lr == 1e-3 && adamw.beta1 == 0.9);
    CHECK(adamw.beta2 == 0.999 && adamw.eps == 1e-8 && adamw.weight_decay == 1e-2);
    ag_optim_config lion = ag_optim_defaults(AG_LION);  // the paper's
    CHECK(lion.kind == AG_LION && lion.lr == 1e-4 && lion.beta1 == 0.9 && lion.beta2 == 0.99);
    CHECK(lion.weight_decay == 0);
    ag_optim_config rmsprop = ag_optim_defaults(AG_RMSPROP);
    CHECK(rmsprop.kind == AG_RMSPROP && rmsprop.lr == 1e-2 && rmsprop.alpha == 0.99);
    CHECK(rmsprop.eps == 1e-8 && rmsprop.weight_decay == 0 && rmsprop.momentum == 0);
    CHECK(!rmsprop.centered);
}

// The kind names are the checkpoints' (ag_optim_state) and torch.optim's classes'.
static void test_every_kind_has_its_own_name_and_makes_an_optimizer_that_steps(void) {
    static const char *const names[AG_OPTIM_KIND_COUNT] = {
        [AG_SGD] = "sgd", [AG_ADAM] = "adam", [AG_ADAMW] = "adamw", [AG_LION] = "lion",
        [AG_RMSPROP] = "rmsprop"};
    ag_params *ps = reference_store(AG_F64);
    scatter(ps, optref_init, false);
    scatter(ps, optref_grads[0], true);
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        CHECK(names[kind] && strcmp(ag_optim_kind_name((ag_optim_kind)kind), names[kind]) == 0);
        ag_optim_config c = ag_optim_defaults((ag_optim_kind)kind);
        CHECK(c.kind == (ag_optim_kind)kind);
        if (isnan(c.lr)) c.lr = 0.1;
        ag_optim *o = ag_optim_new(ps, &c);
        CHECK(o != NULL);
        if (!o) continue;
        ag_state *st = ag_optim_state(o);
        CHECK(strcmp(st->kind(st->self), names[kind]) == 0);
        double before = gather(ps, 0, false);
        ag_optim_step(o);
        CHECK(ag_optim_step_count(o) == 1 && gather(ps, 0, false) != before);
        ag_optim_free(o);
    }
    testing_catch_errors();
    CHECK(ag_optim_kind_name(AG_OPTIM_KIND_COUNT) == NULL);
    CHECK(error_contains("optim_kind_name: unknown optimizer kind 5"));
    CHECK(ag_optim_kind_name((ag_optim_kind)-1) == NULL);
    testing_release_errors();
    ag_params_free(ps);
}

static void test_state_buffers_have_pytorchs_names(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_SGD);
    c.lr = 0.1;
    ag_optim *o = ag_optim_new(ps, &c);
    CHECK(ag_optim_state_count(o) == 0);
    CHECK(!ag_optim_has_momentum_buffer(o));
    ag_optim_free(o);

    c.momentum = 0.9;
    o = ag_optim_new(ps, &c);
    CHECK(ag_optim_state_count(o) == 1);
    CHECK(strcmp(ag_optim_state_name(o, 0), "momentum_buffer") == 0);
    CHECK(ag_optim_has_momentum_buffer(o));
    ag_optim_free(o);

    for (int kind = AG_ADAM; kind <= AG_ADAMW; kind++) {
        ag_optim_config a = ag_optim_defaults((ag_optim_kind)kind);
        o = ag_optim_new(ps, &a);
        CHECK(ag_optim_state_count(o) == 2);
        CHECK(strcmp(ag_optim_state_name(o, 0), "exp_avg") == 0);
        CHECK(strcmp(ag_optim_state_name(o, 1), "exp_avg_sq") == 0);
        CHECK(ag_optim_state_data(o, 0) != ag_optim_state_data(o, 1));
        CHECK(!ag_optim_has_momentum_buffer(o));
        ag_optim_free(o);
    }
    ag_optim_config l = ag_optim_defaults(AG_LION);
    o = ag_optim_new(ps, &l);
    CHECK(ag_optim_state_count(o) == 1);
    CHECK(strcmp(ag_optim_state_name(o, 0), "exp_avg") == 0);
    CHECK(!ag_optim_has_momentum_buffer(o));
    ag_optim_free(o);
    ag_params_free(ps);
}

// RMSprop keeps square_avg, then momentum_buffer and grad_avg when it needs them,
// in PyTorch's order. Its momentum buffer starts at zero: it has no first-step flag.
static void test_rmsprop_state_buffers_follow_momentum_and_centered(void) {
    ag_params *ps = reference_store(AG_F32);
    static const char *const want[4][3] = {
        {"square_avg"},
        {"square_avg", "momentum_buffer"},
        {"square_avg", "grad_avg"},
        {"square_avg", "momentum_buffer", "grad_avg"},
    };
    for (int k = 0; k < 4; k++) {
        ag_optim_config c = ag_optim_defaults(AG_RMSPROP);
        c.momentum = k & 1 ? 0.9 : 0;
        c.centered = k & 2;
        ag_optim *o = ag_optim_new(ps, &c);
        int n = 1 + (k & 1) + (k >> 1);
        CHECK(ag_optim_state_count(o) == n);
        for (int i = 0; i < n && i < ag_optim_state_count(o); i++)
            CHECK(strcmp(ag_optim_state_name(o, i), want[k][i]) == 0);
        CHECK(!ag_optim_has_momentum_buffer(o));
        ag_optim_free(o);
    }
    ag_params_free(ps);
}

// exp_avg after one Adam step is (1 - beta1) * g, at the parameter's offset.
static void test_state_buffers_share_the_store_layout(void) {
    ag_params *ps = reference_store(AG_F64);
    scatter(ps, optref_init, false);
    scatter(ps, optref_grads[0], true);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    ag_optim_step(o);
    const double *m = ag_optim_state_data(o, 0), *v = ag_optim_state_data(o, 1);
    for (int i = 0; i < ag_params_count(ps); i++) {
        const ag_tensor *t = ag_params_at(ps, i);
        size_t off = (size_t)((const double *)t->data - (const double *)ag_params_data(ps));
        const double *g = t->grad;
        for (size_t j = 0; j < t->numel; j++) {
            CHECK(m[off + j] == (1 - 0.9) * g[j]);
            CHECK(v[off + j] == (1 - 0.999) * g[j] * g[j]);
        }
    }
    CHECK(padding_is_zero(ps, m) && padding_is_zero(ps, v));
    ag_optim_free(o);
    ag_params_free(ps);
}

// PyTorch's first momentum step clones d (no dampening applied).
static void test_first_momentum_step_copies_the_gradient(void) {
    ag_params *ps = reference_store(AG_F64);
    scatter(ps, optref_init, false);
    scatter(ps, optref_grads[0], true);
    ag_optim_config c = ag_optim_defaults(AG_SGD);
    c.lr = 0.1;
    c.momentum = 0.9;
    c.dampening = 0.5;
    ag_optim *o = ag_optim_new(ps, &c);
    CHECK(!ag_optim_momentum_initialised(o));
    ag_optim_step(o);
    CHECK(ag_optim_momentum_initialised(o));
    CHECK(memcmp(ag_optim_state_data(o, 0), ag_params_grad(ps), buffer_bytes(ps)) == 0);
    ag_optim_free(o);
    ag_params_free(ps);
}

// PyTorch starts a parameter's momentum buffer on the first step where it has a
// gradient: one frozen on SGD's first step gets an undampened buffer when it joins.
// By hand (torch.optim.SGD 1.13 gives the same bits): w is frozen on step 1, then
// with g = 2, momentum 0.9, dampening 0.5, lr 0.1: buf = d = 2, w = 1 - 0.1 * 2 = 0.8
// (a dampened start would give buf = 0.5 * 2 = 1, w = 0.9). b steps on both, its
// buffer already started: buf = 4, then 0.9 * 4 + 0.5 * 4.
static void test_sgd_momentum_of_a_parameter_frozen_on_the_first_step_starts_undampened(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_tensor *w = ag_params_add(ps, "w", 1, (const int[]){1});
    ag_tensor *b = ag_params_add(ps, "b", 1, (const int[]){1});
    ((double *)w->data)[0] = 1;
    ((double *)b->data)[0] = 1;
    ag_optim_config c = ag_optim_defaults(AG_SGD);
    c.lr = 0.1;
    c.momentum = 0.9;
    c.dampening = 0.5;
    ag_optim *o = ag_optim_new(ps, &c);
    ag_tensor_set_requires_grad(w, false);
    ((double *)b->grad)[0] = 4;
    ag_optim_step(o);
    CHECK(((double *)w->data)[0] == 1);
    ag_tensor_set_requires_grad(w, true);
    ((double *)w->grad)[0] = 2;
    ag_optim_step(o);
    CHECK(((double *)w->data)[0] == 1 - 0.1 * 2.0);
    CHECK(((double *)ag_optim_state_data(o, 0))[0] == 2.0);
    CHECK(((double *)b->data)[0] == (1 - 0.1 * 4.0) - 0.1 * (0.9 * 4.0 + 0.5 * 4.0));
    ag_optim_free(o);
    ag_params_free(ps);
}

static void test_step_count_and_lr_are_tracked(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAMW);
    ag_optim *o = ag_optim_new(ps, &c);
    CHECK(ag_optim_step_count(o) == 0);
    CHECK(ag_optim_lr(o) == 1e-3);
    for (int i = 0; i < 3; i++) ag_optim_step(o);
    CHECK(ag_optim_step_count(o) == 3);
    ag_optim_set_lr(o, 0.25);
    CHECK(ag_optim_lr(o) == 0.25);
    ag_optim_config now = ag_optim_current_config(o);
    CHECK(now.lr == 0.25 && now.kind == AG_ADAMW && now.weight_decay == 1e-2);
    ag_optim_set_step_count(o, 100);
    CHECK(ag_optim_step_count(o) == 100);
    ag_optim_free(o);
    ag_params_free(ps);
}

// ---- Properties of a step ----------------------------------------------------------

static const int awkward_sizes[] = {3, 17, 5, 64, 1};
#define N_AWKWARD ((int)(sizeof awkward_sizes / sizeof awkward_sizes[0]))

static ag_optim_config every_feature(ag_optim_kind kind) {
    ag_optim_config c = ag_optim_defaults(kind);
    c.lr = 0.01;
    c.weight_decay = 0.1;
    if (kind == AG_SGD) {
        c.momentum = 0.9;
        c.nesterov = true;
    }
    if (kind == AG_RMSPROP) {
        c.momentum = 0.9;
        c.centered = true;
    }
    return c;
}

static void test_step_allocates_nothing(void) {
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        for (int dt = AG_F32; dt <= AG_F64; dt++) {
            ag_pcg32 rng = ag_pcg32_make(1, 2);
            ag_params *ps = random_store((ag_dtype)dt, awkward_sizes, N_AWKWARD, &rng);
            ag_optim_config c = every_feature((ag_optim_kind)kind);
            ag_optim *o = ag_optim_new(ps, &c);
            random_grads(ps, &rng);
            ag_memory_stats before = ag_memory_usage();
            for (int i = 0; i < 3; i++) ag_optim_step(o);
            ag_memory_stats after = ag_memory_usage();
            CHECK(after.allocations == before.allocations);
            CHECK(after.bytes_live == before.bytes_live);
            ag_optim_free(o);
            ag_params_free(ps);
        }
    }
}

// A parameter set to not decay is in the second group: updated as by the same
// optimizer with weight_decay 0, bit for bit, while the others get the decay,
// wherever the two kinds sit in the buffer.
static void test_fixed_decay_groups_match_the_two_single_group_runs(void) {
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        ag_params *ps[3];
        ag_optim *o[3];
        for (int r = 0; r < 3; r++) {
            ag_pcg32 rng = ag_pcg32_make(4, 5);
            ps[r] = random_store(AG_F64, awkward_sizes, N_AWKWARD, &rng);
            for (int i = 0; r == 0 && i < N_AWKWARD; i++)
                ag_params_set_decay(ps[0], ag_params_at(ps[0], i), i % 2 == 0);
            ag_optim_config c = every_feature((ag_optim_kind)kind);
            if (r == 2) c.weight_decay = 0;
            o[r] = ag_optim_new(ps[r], &c);
            for (int s = 0; s < 3; s++) random_grads(ps[r], &rng), ag_optim_step(o[r]);
        }
        for (int i = 0; i < N_AWKWARD; i++) {
            const ag_tensor *t = ag_params_at(ps[0], i), *want = ag_params_at(ps[i % 2 == 0 ? 1 : 2], i);
            CHECK(memcmp(t->data, want->data, t->numel * sizeof(double)) == 0);
        }
        for (int r = 0; r < 3; r++) ag_optim_free(o[r]), ag_params_free(ps[r]);
    }
}

// A frozen parameter is left as it is by every kind, its state too, though its
// gradient is not zero and decay and momentum would move it; the others are
// updated as in a store without it, bit for bit (the reference PyTorch has for
// a parameter whose .grad is None). Unfreezing it moves it again.
static void test_frozen_parameters_are_left_alone(void) {
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        ag_params *ps[2];
        ag_optim *o[2];
        for (int r = 0; r < 2; r++) {
            ag_pcg32 rng = ag_pcg32_make(6, 7);
            ps[r] = random_store(AG_F64, awkward_sizes, N_AWKWARD, &rng);
            ag_optim_config c = every_feature((ag_optim_kind)kind);
            o[r] = ag_optim_new(ps[r], &c);
            // Both stores step once with every parameter, so the state is not zero.
            random_grads(ps[r], &rng);
            ag_optim_step(o[r]);
            if (r == 0)
                for (int i = 1; i < N_AWKWARD; i += 2) ag_tensor_set_requires_grad(ag_params_at(ps[0], i), false);
            for (int s = 0; s < 3; s++) random_grads(ps[r], &rng), ag_optim_step(o[r]);
        }
        // The frozen ones as they were after the first step: a store stepped once.
        ag_pcg32 rng = ag_pcg32_make(6, 7);
        ag_params *first = random_store(AG_F64, awkward_sizes, N_AWKWARD, &rng);
        ag_optim_config c = every_feature((ag_optim_kind)kind);
        ag_optim *o1 = ag_optim_new(first, &c);
        random_grads(first, &rng);
        ag_optim_step(o1);
        for (int i = 0; i < N_AWKWARD; i++) {
            const ag_tensor *t = ag_params_at(ps[0], i);
            const ag_tensor *want = ag_params_at(i % 2 ? first : ps[1], i);
            CHECK(memcmp(t->data, want->data, t->numel * sizeof(double)) == 0);
        }
        for (int k = 0; k < ag_optim_state_count(o[0]); k++) {
            const double *st = ag_optim_state_data(o[0], k), *want = ag_optim_state_data(o1, k);
            for (int i = 1; i < N_AWKWARD; i += 2) {
                const ag_tensor *t = ag_params_at(ps[0], i);
                size_t at = (size_t)((const double *)t->data - (const double *)ag_params_data(ps[0]));
                CHECK(memcmp(st + at, want + at, t->numel * sizeof(double)) == 0);
            }
        }
        ag_tensor *t = ag_params_at(ps[0], 1);
        ag_tensor_set_requires_grad(t, true);
        double was = ag_tensor_item(t, 0);
        random_grads(ps[0], &rng);
        ag_optim_step(o[0]);
        CHECK(ag_tensor_item(t, 0) != was);
        ag_optim_free(o1), ag_params_free(first);
        for (int r = 0; r < 2; r++) ag_optim_free(o[r]), ag_params_free(ps[r]);
    }
}

static void test_decay_matrices_only_leaves_out_vectors(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor *w = ag_params_add(ps, "w", 2, (int[]){3, 4}), *b = ag_params_add(ps, "b", 1, (int[]){3});
    ag_tensor *e = ag_params_add(ps, "emb", 2, (int[]){5, 4});
    CHECK(ag_params_decays(ps, w) && ag_params_decays(ps, b));  // all decay by default
    CHECK(ag_params_decay_matrices_only(ps) == 1);
    CHECK(ag_params_decays(ps, w) && !ag_params_decays(ps, b) && ag_params_decays(ps, e));
    ag_params_set_decay(ps, e, false);
    CHECK(!ag_params_decays(ps, e));
    ag_tensor *stranger = ag_tensor_zeros(AG_F32, 1, (int[]){3});
    testing_catch_errors();
    ag_params_set_decay(ps, stranger, false);
    CHECK(strcmp(testing_last_error, "params_set_decay: the tensor is not a parameter of this store") == 0);
    testing_release_errors();
    ag_tensor_free(stranger);
    ag_params_free(ps);
}

// The padding between parameters is never touched: not by AdamW's decay,
// and not even when eps = 0 would make 0 / 0 there.
static void test_padding_stays_zero(void) {
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        for (int dt = AG_F32; dt <= AG_F64; dt++) {
            ag_pcg32 rng = ag_pcg32_make(3, 4);
            ag_params *ps = random_store((ag_dtype)dt, awkward_sizes, N_AWKWARD, &rng);
            ag_optim_config c = every_feature((ag_optim_kind)kind);
            ag_optim *o = ag_optim_new(ps, &c);
            for (int i = 0; i < 4; i++) {
                random_grads(ps, &rng);
                ag_optim_step(o);
            }
            c.eps = 0;
            ag_optim *no_eps = kind == AG_SGD ? NULL : ag_optim_new(ps, &c);
            if (no_eps) ag_optim_step(no_eps);
            CHECK(padding_is_zero(ps, ag_params_data(ps)));
            CHECK(padding_is_zero(ps, ag_params_grad(ps)));
            for (int i = 0; i < ag_optim_state_count(o); i++)
                CHECK(padding_is_zero(ps, ag_optim_state_data(o, i)));
            ag_optim_free(no_eps);
            ag_optim_free(o);
            ag_params_free(ps);
        }
    }
}

// A parameter at zero with zero gradient stays exactly +0 under every kind
// (weight decay included).
static void test_zero_parameter_with_zero_gradient_stays_zero(void) {
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_tensor *t = ag_params_add(ps, "w", 1, (int[]){7});
        ag_optim_config c = every_feature((ag_optim_kind)kind);
        ag_optim *o = ag_optim_new(ps, &c);
        for (int i = 0; i < 5; i++) ag_optim_step(o);
        for (size_t j = 0; j < t->numel; j++) {
            double p = ag_tensor_item(t, j);
            CHECK(p == 0 && !signbit(p));
        }
        ag_optim_free(o);
        ag_params_free(ps);
    }
}

// Runs `steps` steps with gradients from `rng`.
static void run_steps(ag_optim *o, ag_params *ps, ag_pcg32 *rng, int steps) {
    for (int i = 0; i < steps; i++) {
        random_grads(ps, rng);
        ag_optim_step(o);
    }
}

// Interrupted after 3 steps, saved and restored into a fresh store and
// optimizer, a run continues exactly as the uninterrupted one.
static void test_restored_state_continues_bit_identically(void) {
    ag_optim_config configs[] = {every_feature(AG_SGD), every_feature(AG_ADAM),
                                 every_feature(AG_ADAMW), every_feature(AG_RMSPROP)};
    configs[0].nesterov = false;
    configs[0].dampening = 0.1;
    for (int k = 0; k < (int)(sizeof configs / sizeof configs[0]); k++) {
        for (int dt = AG_F32; dt <= AG_F64; dt++) {
            ag_pcg32 rng = ag_pcg32_make(5, 6);
            ag_params *ps = random_store((ag_dtype)dt, awkward_sizes, N_AWKWARD, &rng);
            ag_optim *o = ag_optim_new(ps, &configs[k]);
            run_steps(o, ps, &rng, 3);

            // The checkpoint.
            size_t bytes = buffer_bytes(ps);
            int n_state = ag_optim_state_count(o);
            void *values = malloc(bytes), *state[3] = {NULL, NULL, NULL};
            memcpy(values, ag_params_data(ps), bytes);
            for (int i = 0; i < n_state; i++) {
                state[i] = malloc(bytes);
                memcpy(state[i], ag_optim_state_data(o, i), bytes);
            }
            int64_t steps = ag_optim_step_count(o);
            ag_pcg32 rng_at_checkpoint = rng;

            run_steps(o, ps, &rng, 3);

            ag_pcg32 scratch = ag_pcg32_make(99, 99);
            ag_params *ps2 = random_store((ag_dtype)dt, awkward_sizes, N_AWKWARD, &scratch);
            memcpy(ag_params_data(ps2), values, bytes);
            ag_optim *o2 = ag_optim_new(ps2, &configs[k]);
            for (int i = 0; i < n_state; i++) memcpy(ag_optim_state_data(o2, i), state[i], bytes);
            ag_optim_set_step_count(o2, steps);
            if (ag_optim_has_momentum_buffer(o2)) ag_optim_set_momentum_initialised(o2, true);
            run_steps(o2, ps2, &rng_at_checkpoint, 3);

            CHECK(ag_optim_step_count(o2) == ag_optim_step_count(o));
            CHECK(memcmp(ag_params_data(ps2), ag_params_data(ps), bytes) == 0);
            for (int i = 0; i < n_state; i++)
                CHECK(memcmp(ag_optim_state_data(o2, i), ag_optim_state_data(o, i), bytes) == 0);
            // The resumed run did move the parameters.
            CHECK(memcmp(ag_params_data(ps2), values, bytes) != 0);

            for (int i = 0; i < n_state; i++) free(state[i]);
            free(values);
            ag_optim_free(o2);
            ag_params_free(ps2);
            ag_optim_free(o);
            ag_params_free(ps);
        }
    }
}

// A store large enough to be split across threads, with parameters crossing
// the split points, gives the same bits with 1 and 2 threads.
static void test_step_is_identical_for_any_thread_count(void) {
    static const int big[] = {40000, 30001, 7, 30000};
    for (int kind = 0; kind < AG_OPTIM_KIND_COUNT; kind++) {
        ag_params *ps[2];
        ag_optim *o[2];
        for (int threads = 1; threads <= 2; threads++) {
            ag_threads_set(threads);
            ag_pcg32 rng = ag_pcg32_make(7, 8);
            ps[threads - 1] = random_store(AG_F32, big, 4, &rng);
            ag_optim_config c = every_feature((ag_optim_kind)kind);
            o[threads - 1] = ag_optim_new(ps[threads - 1], &c);
            run_steps(o[threads - 1], ps[threads - 1], &rng, 2);
        }
        ag_threads_set(1);
        size_t bytes = buffer_bytes(ps[0]);
        CHECK(memcmp(ag_params_data(ps[0]), ag_params_data(ps[1]), bytes) == 0);
        for (int i = 0; i < ag_optim_state_count(o[0]); i++)
            CHECK(memcmp(ag_optim_state_data(o[0], i), ag_optim_state_data(o[1], i), bytes) == 0);
        CHECK(padding_is_zero(ps[1], ag_params_data(ps[1])));
        for (int i = 0; i < 2; i++) {
            ag_optim_free(o[i]);
            ag_params_free(ps[i]);
        }
    }
}

// ---- PyTorch's state before its first step ----------------------------------------------
// PyTorch makes an optimizer's buffers on its first step, so its state_dict before
// then holds none; SGD's momentum buffer then starts as a copy of the step's
// direction, with weight decay and without dampening. Each file holds the
// reference parameters and the state_dict of the optimizer PyTorch then ran, in a
// checkpoint's layout; the optimizer that loads it has taken steps of its own.
static void replay_from_pytorch_before_first_step(const char *name, ag_dtype dt) {
    const optref_case *rc = reference_case(name);
    ag_params *ps = reference_store(dt);
    ag_optim_config cfg = reference_config(rc);
    ag_optim *o = ag_optim_new(ps, &cfg);
    ag_pcg32 rng = ag_pcg32_make(11, 12);
    run_steps(o, ps, &rng, 2);
    char path[512];
    snprintf(path, sizeof path, "%s/tests/reference/optim_%s_step0.safetensors", AG_SOURCE_DIR,
             name);
    ag_err err;
    int loaded = ag_checkpoint_load(ps, ag_optim_state(o), path, NULL, &err);
    if (loaded != 0) fprintf(stderr, "  %s\n", err.msg);
    CHECK(loaded == 0);
    if (loaded == 0) {
        CHECK(ag_optim_step_count(o) == 0 && !ag_optim_momentum_initialised(o));
        void *zeros = calloc(1, buffer_bytes(ps));
        for (int i = 0; i < ag_optim_state_count(o); i++)
            CHECK(memcmp(ag_optim_state_data(o, i), zeros, buffer_bytes(ps)) == 0);
        free(zeros);
        for (int i = 0; i < OPTREF_NUMEL; i++)
            CHECK(gather(ps, i, false) == (dt == AG_F64 ? optref_init[i] : (float)optref_init[i]));
        replay_into(rc, ps, o);
    }
    ag_optim_free(o);
    ag_params_free(ps);
}

static void test_pytorch_sgd_before_its_first_step_loads_and_steps_as_pytorch(void) {
    replay_from_pytorch_before_first_step("sgd_momentum_dampening_weight_decay", AG_F64);
    replay_from_pytorch_before_first_step("sgd_momentum_dampening_weight_decay", AG_F32);
}

static void test_pytorch_sgd_nesterov_before_its_first_step_loads_and_steps_as_pytorch(void) {
    replay_from_pytorch_before_first_step("sgd_nesterov", AG_F64);
    replay_from_pytorch_before_first_step("sgd_nesterov", AG_F32);
}

// Buffers that start at zero are zeros before the first step: a file may leave them out.
static void test_pytorch_adam_and_rmsprop_before_their_first_step_load_and_step_as_pytorch(void) {
    replay_from_pytorch_before_first_step("adam", AG_F64);
    replay_from_pytorch_before_first_step("adam", AG_F32);
    replay_from_pytorch_before_first_step("rmsprop_centered_momentum_changing_lr", AG_F64);
    replay_from_pytorch_before_first_step("rmsprop_centered_momentum_changing_lr", AG_F32);
}

// ---- Misuse ----------------------------------------------------------------------------

static void test_adding_parameters_after_optim_new_is_reported(void) {
    ag_params *ps = reference_store(AG_F64);
    scatter(ps, optref_init, false);
    scatter(ps, optref_grads[0], true);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    ag_params_add(ps, "late", 1, (int[]){4});
    size_t bytes = buffer_bytes(ps);
    void *before = malloc(bytes);
    memcpy(before, ag_params_data(ps), bytes);
    testing_catch_errors();
    ag_optim_step(o);
    testing_release_errors();
    CHECK(error_contains("optim_step: the parameter store grew"));
    CHECK(memcmp(before, ag_params_data(ps), bytes) == 0);
    CHECK(ag_optim_step_count(o) == 0);
    free(before);
    ag_optim_free(o);
    ag_params_free(ps);
}

// Pruning resizes parameters and repacks the store (ag_params_resize): the state no
// longer lines up with it. The message says what changed and what to do.
static void test_step_after_a_parameter_shrank_says_so_and_asks_for_a_new_optimizer(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    size_t before = ag_params_buffer_len(ps);
    ag_tensor *norm = ag_params_find(ps, "norm.weight");
    CHECK(ag_params_resize(ps, norm, 1, (int[]){2}, (const float[]){1, 2}));
    char want[300];
    snprintf(want, sizeof want,
             "optim_step: the parameter store shrank from %zu to %zu elements after "
             "ag_optim_new: 'norm.weight' was resized from 5 to 2 elements (ag_params_resize, as "
             "ag_mha_prune_heads does), and the optimizer's state no longer fits; make a new "
             "optimizer for the store as it is now",
             before, ag_params_buffer_len(ps));
    testing_catch_errors();
    ag_optim_step(o);
    testing_release_errors();
    CHECK(ag_params_buffer_len(ps) < before && error_contains(want));
    CHECK(ag_optim_step_count(o) == 0);
    ag_optim_free(o);
    o = ag_optim_new(ps, &c);  // what the message asks for
    testing_catch_errors();
    ag_optim_step(o);
    testing_release_errors();
    CHECK(testing_error_count == 0 && ag_optim_step_count(o) == 1);
    ag_optim_free(o);
    ag_params_free(ps);
}

// A parameter that shrinks inside its alignment padding leaves the store's length as
// it was, but not its contents.
static void test_step_after_a_resize_that_keeps_the_length_is_reported(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    size_t len = ag_params_buffer_len(ps);
    ag_tensor *w = ag_params_find(ps, "attn.in_proj_weight");
    CHECK(ag_params_resize(ps, w, 2, (int[]){1, 3}, (const float[]){1, 2, 3}));
    CHECK(ag_params_buffer_len(ps) == len);
    testing_catch_errors();
    ag_optim_step(o);
    testing_release_errors();
    char want[200];
    snprintf(want, sizeof want,
             "optim_step: the parameter store was repacked (%zu elements) after ag_optim_new: "
             "'attn.in_proj_weight' was resized from 6 to 3 elements",
             len);
    CHECK(error_contains(want) && error_contains("make a new optimizer"));
    CHECK(ag_optim_step_count(o) == 0);
    ag_optim_free(o);
    ag_params_free(ps);
}

// A new shape of as many elements ([2,3] to [3,2]) keeps the store's layout, so the count
// of elements let the step go on with each element's state now another weight's; the
// header promises a step after a resize is refused.
static void test_step_after_a_reshape_of_as_many_elements_is_reported(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    ag_tensor *w = ag_params_find(ps, "attn.in_proj_weight");
    CHECK(w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3);
    CHECK(ag_params_resize(ps, w, 2, (int[]){3, 2}, (const float[]){1, 2, 3, 4, 5, 6}));
    testing_catch_errors();
    ag_optim_step(o);
    testing_release_errors();
    CHECK(error_contains("optim_step: the parameter store was repacked") &&
          error_contains("'attn.in_proj_weight' was resized from [2,3] to [3,2]") &&
          error_contains("make a new optimizer"));
    CHECK(ag_optim_step_count(o) == 0 && ag_tensor_item(w, 0) == 1);
    ag_optim_free(o);
    ag_params_free(ps);
}

static void test_sgd_without_learning_rate_is_reported(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_SGD);
    testing_catch_errors();
    CHECK(ag_optim_new(ps, &c) == NULL);
    testing_release_errors();
    CHECK(error_contains("optim_new: SGD has no default learning rate"));
    ag_params_free(ps);
}

static void expect_rejected(ag_optim_config c, const char *message) {
    ag_params *ps = reference_store(AG_F32);
    testing_catch_errors();
    ag_optim *o = ag_optim_new(ps, &c);
    testing_release_errors();
    CHECK(o == NULL);
    if (!error_contains(message)) {
        fprintf(stderr, "  expected \"%s\", got \"%s\"\n", message, testing_last_error);
        CHECK(!"the expected error was not reported");
    }
    ag_optim_free(o);
    ag_params_free(ps);
}

static void test_hyperparameters_pytorch_rejects_are_reported(void) {
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    c.lr = -1;
    expect_rejected(c, "optim_new: lr must be finite and >= 0, got -1");
    c = ag_optim_defaults(AG_ADAMW);
    c.beta1 = 1.0;
    expect_rejected(c, "optim_new: betas must lie in [0, 1), got (1, 0.999)");
    c = ag_optim_defaults(AG_ADAM);
    c.beta2 = -0.5;
    expect_rejected(c, "optim_new: betas must lie in [0, 1), got (0.9, -0.5)");
    c = ag_optim_defaults(AG_ADAM);
    c.eps = -1e-8;
    expect_rejected(c, "optim_new: eps must be >= 0, got -1e-08");
    c = ag_optim_defaults(AG_ADAMW);
    c.weight_decay = NAN;
    expect_rejected(c, "optim_new: weight_decay must be >= 0, got nan");
    c = ag_optim_defaults(AG_SGD);
    c.lr = 0.1;
    c.momentum = -0.9;
    expect_rejected(c, "optim_new: momentum must be >= 0, got -0.9");
    c.momentum = 0;
    c.nesterov = true;
    expect_rejected(c, "optim_new: Nesterov momentum needs momentum > 0 and dampening 0, "
                       "got momentum 0, dampening 0");
    c.momentum = 0.9;
    c.dampening = 0.1;
    expect_rejected(c, "got momentum 0.9, dampening 0.1");
    c = ag_optim_defaults(AG_ADAM);
    c.kind = (ag_optim_kind)7;
    expect_rejected(c, "optim_new: unknown optimizer kind 7");
}

// torch.optim.RMSprop's checks: alpha, eps and momentum >= 0 (alpha may exceed 1).
static void test_rmsprop_hyperparameters_pytorch_rejects_are_reported(void) {
    ag_optim_config c = ag_optim_defaults(AG_RMSPROP);
    c.alpha = -0.5;
    expect_rejected(c, "optim_new: alpha must be >= 0, got -0.5");
    c = ag_optim_defaults(AG_RMSPROP);
    c.eps = -1e-8;
    expect_rejected(c, "optim_new: eps must be >= 0, got -1e-08");
    c = ag_optim_defaults(AG_RMSPROP);
    c.momentum = NAN;
    expect_rejected(c, "optim_new: momentum must be >= 0, got nan");
    c = ag_optim_defaults(AG_RMSPROP);
    c.weight_decay = -1;
    expect_rejected(c, "optim_new: weight_decay must be >= 0, got -1");
    c = ag_optim_defaults(AG_RMSPROP);
    c.alpha = 1.5;
    ag_params *ps = reference_store(AG_F32);
    ag_optim *o = ag_optim_new(ps, &c);
    CHECK(o != NULL);
    ag_optim_free(o);
    ag_params_free(ps);
}

static void test_empty_store_is_reported(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    testing_catch_errors();
    CHECK(ag_optim_new(ps, &c) == NULL);
    testing_release_errors();
    CHECK(error_contains("optim_new: the parameter store is empty"));
    ag_params_free(ps);
}

static void test_bad_state_access_is_reported(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    testing_catch_errors();
    CHECK(ag_optim_state_name(o, 2) == NULL);
    CHECK(error_contains("optim_state_name: state index 2 out of range [0, 2)"));
    CHECK(ag_optim_state_data(o, -1) == NULL);
    CHECK(error_contains("optim_state_data: state index -1 out of range [0, 2)"));
    ag_optim_set_momentum_initialised(o, true);
    CHECK(error_contains("only SGD with momentum has a momentum buffer"));
    CHECK(!ag_optim_momentum_initialised(o));
    ag_optim_set_step_count(o, -1);
    CHECK(error_contains("optim_set_step_count: steps must be >= 0 and <= 2^53, got -1"));
    CHECK(ag_optim_step_count(o) == 0);
    ag_optim_set_lr(o, NAN);
    CHECK(error_contains("optim_set_lr: lr must be finite and >= 0, got nan"));
    CHECK(ag_optim_lr(o) == 1e-3);
    testing_release_errors();
    ag_optim_free(o);
    ag_params_free(ps);
}

// The cap of checkpoint loading: beyond 2^53 the bias corrections' step is no longer
// exact, and near INT64_MAX the next step's count would overflow.
static void test_step_count_beyond_two_to_the_53_is_refused(void) {
    ag_params *ps = reference_store(AG_F32);
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    testing_catch_errors();
    ag_optim_set_step_count(o, INT64_MAX);
    CHECK(error_contains("optim_set_step_count: steps must be >= 0 and <= 2^53, "
                         "got 9223372036854775807"));
    CHECK(ag_optim_step_count(o) == 0);
    ag_optim_set_step_count(o, (INT64_C(1) << 53) + 1);
    CHECK(testing_error_count == 2 && ag_optim_step_count(o) == 0);
    testing_release_errors();
    ag_optim_set_step_count(o, INT64_C(1) << 53);
    ag_optim_step(o);
    CHECK(ag_optim_step_count(o) == (INT64_C(1) << 53) + 1);
    ag_optim_free(o);
    ag_params_free(ps);
}

// ---- Learning-rate schedule --------------------------------------------------------------

static void test_warmup_starts_at_base_over_warmup_steps(void) {
    CHECK_NEAR(ag_lr_warmup_cosine(0, 10, 110, 1e-3, 1e-4), 1e-4, 1e-15);
    CHECK_NEAR(ag_lr_warmup_cosine(4, 10, 110, 1e-3, 1e-4), 5e-4, 1e-15);
}

static void test_warmup_reaches_base_on_its_last_step_and_decay_starts_there(void) {
    CHECK_NEAR(ag_lr_warmup_cosine(9, 10, 110, 1e-3, 1e-4), 1e-3, 1e-15);
    CHECK_NEAR(ag_lr_warmup_cosine(10, 10, 110, 1e-3, 1e-4), 1e-3, 1e-15);
    CHECK(ag_lr_warmup_cosine(11, 10, 110, 1e-3, 1e-4) < 1e-3);
}

// Exactly base_lr, not within an ulp. In doubles (Python's floats agree) 0.1 * 3 / 3 is
// 0.10000000000000002 and 0.7 * 3 / 3 is 0.6999999999999998; 0.001 + (0.01 - 0.001) is
// 0.010000000000000002 and 6e-4 / 10 + (6e-4 - 6e-4 / 10) is 0.0005999999999999998.
static void test_warmup_and_decay_meet_exactly_at_base_lr(void) {
    CHECK(ag_lr_warmup_cosine(2, 3, 10, 0.1, 0.01) == 0.1);
    CHECK(ag_lr_warmup_cosine(2, 3, 10, 0.7, 0.07) == 0.7);
    CHECK(ag_lr_warmup_cosine(5, 5, 100, 0.01, 0.001) == 0.01);
    CHECK(ag_lr_warmup_cosine(5, 5, 100, 6e-4, 6e-4 / 10) == 6e-4);
    for (int64_t s = 5; s < 100; s++)
        CHECK(ag_lr_warmup_cosine(s, 5, 100, 6e-4, 6e-4 / 10) >= 6e-4 / 10);
}

static void test_cosine_is_halfway_at_mid_decay(void) {
    // progress 1/2: cos(pi / 2) = 0, so halfway between base and min.
    CHECK_NEAR(ag_lr_warmup_cosine(60, 10, 110, 1e-3, 1e-4), 5.5e-4, 1e-15);
    // progress 1/4: min + (base - min) * (1 + cos(pi / 4)) / 2.
    double quarter = 1e-4 + 0.5 * 9e-4 * (1 + sqrt(0.5));
    CHECK_NEAR(ag_lr_warmup_cosine(35, 10, 110, 1e-3, 1e-4), quarter, 1e-15);
}

static void test_schedule_ends_at_min_lr_and_stays_there(void) {
    double last = ag_lr_warmup_cosine(109, 10, 110, 1e-3, 1e-4);
    CHECK(last > 1e-4 && last < 1.01e-4);
    CHECK(ag_lr_warmup_cosine(110, 10, 110, 1e-3, 1e-4) == 1e-4);
    CHECK(ag_lr_warmup_cosine(100000, 10, 110, 1e-3, 1e-4) == 1e-4);
}

static void test_schedule_without_warmup_starts_at_base(void) {
    CHECK(ag_lr_warmup_cosine(0, 0, 100, 2.0, 0.0) == 2.0);
    CHECK_NEAR(ag_lr_warmup_cosine(50, 0, 100, 2.0, 0.0), 1.0, 1e-15);
}

static void test_schedule_decreases_monotonically_after_warmup(void) {
    double prev = ag_lr_warmup_cosine(10, 10, 1000, 1e-3, 1e-5);
    for (int64_t s = 11; s <= 1000; s++) {
        double lr = ag_lr_warmup_cosine(s, 10, 1000, 1e-3, 1e-5);
        CHECK(lr <= prev);
        prev = lr;
    }
}

static void test_bad_schedule_arguments_are_reported(void) {
    testing_catch_errors();
    CHECK(isnan(ag_lr_warmup_cosine(-1, 10, 100, 1e-3, 0)));
    CHECK(error_contains("lr_warmup_cosine: need 0 <= step and 0 <= warmup_steps <= total_steps, "
                         "got step -1, warmup_steps 10, total_steps 100"));
    testing_error_count = 0;
    CHECK(isnan(ag_lr_warmup_cosine(5, 10, 9, 1e-3, 0)));
    CHECK(error_contains("got step 5, warmup_steps 10, total_steps 9"));
    testing_release_errors();
}

int main(void) {
    RUN(test_sgd_plain_matches_pytorch_f64);
    RUN(test_sgd_plain_matches_pytorch_f32);
    RUN(test_sgd_momentum_dampening_weight_decay_matches_pytorch_f64);
    RUN(test_sgd_momentum_dampening_weight_decay_matches_pytorch_f32);
    RUN(test_sgd_nesterov_matches_pytorch_f64);
    RUN(test_sgd_nesterov_matches_pytorch_f32);
    RUN(test_adam_matches_pytorch_f64);
    RUN(test_adam_matches_pytorch_f32);
    RUN(test_adam_weight_decay_and_custom_betas_match_pytorch_f64);
    RUN(test_adam_weight_decay_and_custom_betas_match_pytorch_f32);
    RUN(test_adamw_matches_pytorch_f64);
    RUN(test_adamw_matches_pytorch_f32);
    RUN(test_adamw_with_lr_changed_every_step_matches_pytorch_f64);
    RUN(test_adamw_with_lr_changed_every_step_matches_pytorch_f32);
    RUN(test_lion_matches_its_update_in_torch_f64);
    RUN(test_lion_matches_its_update_in_torch_f32);
    RUN(test_lion_weight_decay_betas_and_changing_lr_match_torch_f64);
    RUN(test_lion_weight_decay_betas_and_changing_lr_match_torch_f32);
    RUN(test_rmsprop_matches_pytorch_f64);
    RUN(test_rmsprop_matches_pytorch_f32);
    RUN(test_rmsprop_momentum_weight_decay_and_custom_alpha_match_pytorch_f64);
    RUN(test_rmsprop_momentum_weight_decay_and_custom_alpha_match_pytorch_f32);
    RUN(test_rmsprop_centered_matches_pytorch_f64);
    RUN(test_rmsprop_centered_matches_pytorch_f32);
    RUN(test_rmsprop_centered_momentum_with_lr_changed_every_step_matches_pytorch_f64);
    RUN(test_rmsprop_centered_momentum_with_lr_changed_every_step_matches_pytorch_f32);
    RUN(test_rmsprop_centered_overflowing_square_gives_nan_as_pytorchs_plain_kernels);
    RUN(test_clip_grad_norm_matches_pytorch_when_clipping);
    RUN(test_clip_grad_norm_matches_pytorch_below_max_norm);
    RUN(test_clip_grad_norm_float32_squares_neither_overflow_nor_underflow);

    RUN(test_defaults_are_pytorchs);
    RUN(test_every_kind_has_its_own_name_and_makes_an_optimizer_that_steps);
    RUN(test_state_buffers_have_pytorchs_names);
    RUN(test_rmsprop_state_buffers_follow_momentum_and_centered);
    RUN(test_state_buffers_share_the_store_layout);
    RUN(test_first_momentum_step_copies_the_gradient);
    RUN(test_sgd_momentum_of_a_parameter_frozen_on_the_first_step_starts_undampened);
    RUN(test_step_count_and_lr_are_tracked);

    RUN(test_step_allocates_nothing);
    RUN(test_fixed_decay_groups_match_the_two_single_group_runs);
    RUN(test_frozen_parameters_are_left_alone);
    RUN(test_decay_matrices_only_leaves_out_vectors);
    RUN(test_padding_stays_zero);
    RUN(test_zero_parameter_with_zero_gradient_stays_zero);
    RUN(test_restored_state_continues_bit_identically);
    RUN(test_step_is_identical_for_any_thread_count);

    RUN(test_pytorch_sgd_before_its_first_step_loads_and_steps_as_pytorch);
    RUN(test_pytorch_sgd_nesterov_before_its_first_step_loads_and_steps_as_pytorch);
    RUN(test_pytorch_adam_and_rmsprop_before_their_first_step_load_and_step_as_pytorch);

    RUN(test_adding_parameters_after_optim_new_is_reported);
    RUN(test_step_after_a_parameter_shrank_says_so_and_asks_for_a_new_optimizer);
    RUN(test_step_after_a_resize_that_keeps_the_length_is_reported);
    RUN(test_step_after_a_reshape_of_as_many_elements_is_reported);
    RUN(test_sgd_without_learning_rate_is_reported);
    RUN(test_hyperparameters_pytorch_rejects_are_reported);
    RUN(test_rmsprop_hyperparameters_pytorch_rejects_are_reported);
    RUN(test_empty_store_is_reported);
    RUN(test_bad_state_access_is_reported);
    RUN(test_step_count_beyond_two_to_the_53_is_refused);

    RUN(test_warmup_starts_at_base_over_warmup_steps);
    RUN(test_warmup_reaches_base_on_its_last_step_and_decay_starts_there);
    RUN(test_warmup_and_decay_meet_exactly_at_base_lr);
    RUN(test_cosine_is_halfway_at_mid_decay);
    RUN(test_schedule_ends_at_min_lr_and_stays_there);
    RUN(test_schedule_without_warmup_starts_at_base);
    RUN(test_schedule_decreases_monotonically_after_warmup);
    RUN(test_bad_schedule_arguments_are_reported);
    return testing_summary();
}
