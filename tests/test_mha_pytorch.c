// MultiheadAttention against PyTorch where the attograd-mha tool cannot take the case
// (tests/reference/mha_options_pytorch.safetensors, written by
// tests/pytorch/make_mha_options_reference.py):
// - "masks": add_bias_kv / add_zero_attn with causal and an attn_mask of a broadcast
//   shape ([B,1,1,S], [B,1,T,S], [T,S], [S], [1,h,T,S]), bool in both polarities or
//   additive, against torch.nn.MultiheadAttention given the mask expanded;
// - "positions": relative, T5, ALiBi and rotary positions inside the attention, against
//   an explicit PyTorch implementation, the position table's gradient included.
// - "gqa": grouped-query and multi-query attention (num_kv_heads < num_heads), with and
//   without a position scheme, masks, causal and not, T != S, odd head dims, against the
//   definition written in PyTorch (tests/reference/gqa_pytorch.safetensors, from
//   tests/pytorch/make_gqa_reference.py: k and v repeat_interleave'd, then attention);
// - "window": sliding-window attention, causal (the last W keys) and not (|i - j| < W),
//   with grouped-query attention, every position scheme and masks, against the definition
//   as a mask (tests/reference/window_pytorch.safetensors, make_window_reference.py).
// Each case runs on both paths of ag_mha_forward (fused: no weights; composed: weights), in
// float64 (every output and gradient within 1e-10 of PyTorch's, normwise per tensor) and
// float32 (1e-5 of the float64 reference).
#include <stdlib.h>

#include "op_checks.h"
#include "pytorch_reference.h"

static const ag_safetensors *st;
static double worst[2];  // float32, float64

static const ag_tensor *ref(int c, const char *what) {
    char name[160];
    snprintf(name, sizeof name, "c%d.%s", c, what);
    return ag_safetensors_find(st, name);
}

static const char *args_of(int c) {
    char key[32];
    snprintf(key, sizeof key, "c%d.args", c);
    return ag_safetensors_meta(st, key);
}

static double num(int c, const char *key, double fallback) {
    char buf[64];
    return reference_value(args_of(c), key, buf, sizeof buf) ? atof(buf) : fallback;
}

static bool has(int c, const char *key, const char *value) {
    char buf[64];
    return reference_value(args_of(c), key, buf, sizeof buf) && strcmp(buf, value) == 0;
}

static ag_mha_config config_of(int c) {
    ag_mha_config cfg = {.embed_dim = (int)num(c, "E", 0), .num_heads = (int)num(c, "h", 0),
                         .num_kv_heads = (int)num(c, "kvh", 0),
                         .head_dim = (int)num(c, "d", 0),
                         .window = (int)num(c, "window", 0),
                         .add_bias_kv = num(c, "bias_kv", 0) == 1,
                         .add_zero_attn = num(c, "zero_attn", 0) == 1};
    if (has(c, "pos", "relative")) {
        cfg.pos = AG_POS_RELATIVE;
        cfg.max_distance = (int)num(c, "M", 0);
    } else if (has(c, "pos", "t5")) {
        cfg.pos = AG_POS_T5;
        cfg.num_buckets = (int)num(c, "buckets", 0);
        cfg.max_distance = (int)num(c, "maxd", 0);
    } else if (has(c, "pos", "alibi")) {
        cfg.pos = AG_POS_ALIBI;
    } else if (has(c, "pos", "rope")) {
        cfg.pos = AG_POS_ROPE;
        cfg.rope_base = num(c, "base", 0);
    }
    return cfg;
}

// ours (values, or with `grad` its gradient) within tol of PyTorch's `what`.
static bool matches(int c, const char *what, const ag_tensor *ours, bool grad, double tol,
                    const char *path) {
    const ag_tensor *want = ref(c, what);
    if (!want || !ours || want->numel != ours->numel) {
        fprintf(stderr, "  case %d %s: %s missing or of the wrong size\n", c, path, what);
        return false;
    }
    double e = normwise_error_to(ours, grad, want);
    int dti = ours->dtype == AG_F64;
    worst[dti] = fmax(worst[dti], e);
    if (!(e <= tol))
        fprintf(stderr, "  case %d (%s) %s %s %s: differs from PyTorch by %.3g\n", c, args_of(c),
                ag_dtype_name(ours->dtype), path, what, e);
    return e <= tol;
}

static bool run_case(int c, ag_dtype dt, bool weights) {
    const double tol = dt == AG_F64 ? 1e-10 : 1e-5;
    const char *path = weights ? "weights path" : "fused path";
    ag_mha_config cfg = config_of(c);
    ag_params *ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    bool ok = ag_mha_init(&m, ps, "", &cfg, &rng);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "c%d.param.", c);
    ag_err err;
    if (ok && ag_params_load_from(ps, st, prefix, &err) != 0) {
        fprintf(stderr, "  case %d: %s\n", c, err.msg);
        ok = false;
    }
    const char *names[3] = {"query", "key", "value"};
    ag_tensor *x[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        if (ref(c, names[i])) x[i] = requiring_grad(ag_tensor_convert(ref(c, names[i]), dt));
    bool self = x[1] == NULL;
    ag_tensor *k = self ? x[0] : x[1], *v = self ? x[0] : x[2];
    const ag_tensor *rm = ref(c, "mask");
    ag_tensor *mask = rm ? ag_tensor_convert(rm, rm->dtype == AG_BOOL ? AG_BOOL : dt) : NULL;
    if (mask && mask->dtype != AG_BOOL) ag_tensor_set_requires_grad(mask, true);
    ag_tensor *kpm = ref(c, "kpm") ? ag_tensor_convert(ref(c, "kpm"), AG_BOOL) : NULL;
    ag_tensor *dy = ag_tensor_convert(ref(c, "grad_out"), dt);
    ag_mha_opts o = {.attn_mask = mask, .key_padding_mask = kpm, .causal = num(c, "causal", 0) == 1,
                     .mask_polarity = num(c, "keeps", 0) == 1 ? AG_MASK_KEEPS : AG_MASK_BLOCKS};
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = NULL;
    ag_tensor *y = ok ? ag_mha_forward(tp, &m, x[0], k, v, &o, weights ? &w : NULL) : NULL;
    ok = ok && y != NULL && (!weights || w != NULL);
    if (ok) {
        ag_backward_with(tp, y, dy);
        ok = matches(c, "out", y, false, tol, path);
        for (int i = 0; i < 3; i++) {
            if (!x[i]) continue;
            char what[32];
            snprintf(what, sizeof what, "grad.%s", names[i]);
            ok = matches(c, what, x[i], true, tol, path) && ok;
        }
        for (int i = 0; i < ag_params_count(ps); i++) {
            char what[160];
            snprintf(what, sizeof what, "grad.param.%s", ag_params_at(ps, i)->name);
            ok = matches(c, what, ag_params_at(ps, i), true, tol, path) && ok;
        }
        if (mask && mask->dtype != AG_BOOL)
            ok = matches(c, "grad.mask", mask, true, tol, path) && ok;
    }
    ag_tape_free(tp);
    for (int i = 0; i < 3; i++) ag_tensor_free(x[i]);
    ag_tensor_free(mask);
    ag_tensor_free(kpm);
    ag_tensor_free(dy);
    ag_params_free(ps);
    return ok;
}

// Runs every case of `kind` (at least `min_cases` of them) on both paths and dtypes.
static void run_cases(const char *kind, int min_cases) {
    int seen = 0;
    worst[0] = worst[1] = 0;
    for (int c = 0; c < reference_cases(st); c++) {
        char key[32];
        snprintf(key, sizeof key, "c%d.kind", c);
        const char *k = ag_safetensors_meta(st, key);
        if (!k || strcmp(k, kind) != 0) continue;
        seen++;
        for (int dti = 0; dti < 2; dti++)
            for (int weights = 0; weights < 2; weights++)
                CHECK(run_case(c, dti ? AG_F64 : AG_F32, weights));
    }
    CHECK(seen >= min_cases);
    fprintf(stderr, "     %d cases, worst relative error %.2e (float64), %.2e (float32)\n", seen,
            worst[1], worst[0]);
}

static void test_extra_keys_with_causal_and_broadcast_masks_match_pytorch(void) {
    run_cases("masks", 19);
}

static void test_every_position_scheme_matches_an_explicit_pytorch_mha(void) {
    run_cases("positions", 8);
}

static void test_grouped_and_multi_query_attention_match_their_pytorch_definition(void) {
    run_cases("gqa", 9);
}

static void test_sliding_window_attention_matches_its_pytorch_definition(void) {
    run_cases("window", 8);
}

int main(void) {
    st = load_reference("mha_options_pytorch.safetensors");
    CHECK(st != NULL);
    RUN(test_extra_keys_with_causal_and_broadcast_masks_match_pytorch);
    RUN(test_every_position_scheme_matches_an_explicit_pytorch_mha);
    ag_safetensors_free((ag_safetensors *)st);
    st = load_reference("gqa_pytorch.safetensors");
    CHECK(st != NULL);
    RUN(test_grouped_and_multi_query_attention_match_their_pytorch_definition);
    ag_safetensors_free((ag_safetensors *)st);
    st = load_reference("window_pytorch.safetensors");
    CHECK(st != NULL);
    RUN(test_sliding_window_attention_matches_its_pytorch_definition);
    ag_safetensors_free((ag_safetensors *)st);
    return testing_summary();
}
