// The transformer block against torch.nn.TransformerEncoderLayer
// (batch_first=True): each case in tests/reference/block_pytorch.safetensors
// (see tests/pytorch/make_block_reference.py) loads PyTorch's state_dict into
// an ag_block and compares the output and the gradients of the input and of
// every parameter, in float64 (1e-10) and float32 (1e-5), per tensor:
//     max |ours - torch| <= tol * max |torch|.
// Among the cases: bias=False (TransformerEncoderLayer(bias=False), which torch 1.13
// lacks: its reference is the layer with every bias zero and frozen), and a layer whose
// self_attn has add_bias_kv and add_zero_attn, with a key padding mask in AG_MASK_KEEPS.
#include "op_checks.h"
#include "pytorch_reference.h"

static const ag_safetensors *reference(void) {
    static ag_safetensors *st;
    if (!st) st = load_reference("block_pytorch.safetensors");
    return st;
}

static const ag_tensor *get(int c, const char *what) {
    char name[160];
    snprintf(name, sizeof name, "c%d.%s", c, what);
    return ag_safetensors_find(reference(), name);
}

// The integer `key` in case c's "key=value ..." configuration; -1 if absent.
static int config(int c, const char *key) {
    char name[32], value[32];
    snprintf(name, sizeof name, "c%d.config", c);
    const char *s = ag_safetensors_meta(reference(), name);
    return reference_value(s, key, value, sizeof value) ? atoi(value) : -1;
}

static double worst;

// Our output (or, with `grad`, our gradient) against torch's.
static void expect(int c, const char *what, const ag_tensor *ours, bool grad, double tol) {
    const ag_tensor *ref = get(c, what);
    const void *buf = grad ? ours->grad : ours->data;
    CHECK(ref && buf && ref->numel == ours->numel);
    if (!ref || !buf || ref->numel != ours->numel) return;
    double e = normwise_error_to(ours, grad, ref);
    worst = fmax(worst, e);
    if (!(e <= tol)) {
        fprintf(stderr, "case %d %s %s: relative error %.3e > %.0e\n", c, ag_dtype_name(ours->dtype),
                what, e, tol);
        CHECK(!"block differs from PyTorch");
    }
}

static void run_case(int c, ag_dtype dt, double tol) {
    ag_block_config cfg = {.d_model = config(c, "d_model"), .num_heads = config(c, "nhead"),
                           .dim_feedforward = config(c, "ff"),
                           .norm_first = config(c, "norm_first") == 1,
                           .no_bias = config(c, "bias") == 0,
                           .add_bias_kv = config(c, "bias_kv") == 1,
                           .add_zero_attn = config(c, "zero_attn") == 1};
    char name[32];
    snprintf(name, sizeof name, "c%d.config", c);
    cfg.activation = strstr(ag_safetensors_meta(reference(), name), "act=gelu") ? AG_ACT_GELU
                                                                                : AG_ACT_RELU;
    ag_params *ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_block b;
    CHECK(ag_block_init(&b, ps, "", &cfg, &rng));
    char prefix[32];
    snprintf(prefix, sizeof prefix, "c%d.param.", c);
    ag_err err;
    int rc = ag_params_load_from(ps, reference(), prefix, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CHECK(rc == 0);

    ag_tensor *x = ag_tensor_convert(get(c, "x"), dt);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *kpm = get(c, "key_padding_mask") ? ag_tensor_convert(get(c, "key_padding_mask"), AG_BOOL)
                                                : NULL;
    ag_block_opts o = {.causal = config(c, "causal") == 1, .key_padding_mask = kpm,
                       .mask_polarity = config(c, "keeps") == 1 ? AG_MASK_KEEPS : AG_MASK_BLOCKS};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_block_forward(tp, &b, x, &o);
    expect(c, "out", y, false, tol);
    ag_tensor *dy = ag_tensor_convert(get(c, "grad_out"), dt);
    ag_backward_with(tp, y, dy);
    expect(c, "grad.x", x, true, tol);
    for (int i = 0; i < ag_params_count(ps); i++) {
        ag_tensor *p = ag_params_at(ps, i);
        char what[160];
        snprintf(what, sizeof what, "grad.%s", p->name);
        expect(c, what, p, true, tol);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(dy);
    ag_tensor_free(kpm);
    ag_params_free(ps);
}

static int cases(void) { return reference_cases(reference()); }

static void test_block_matches_transformer_encoder_layer_in_float64(void) {
    CHECK(cases() == 8);
    worst = 0;
    for (int c = 0; c < cases(); c++) run_case(c, AG_F64, 1e-10);
    fprintf(stderr, "     worst relative error %.2e\n", worst);
}

static void test_block_matches_transformer_encoder_layer_in_float32(void) {
    worst = 0;
    for (int c = 0; c < cases(); c++) run_case(c, AG_F32, 1e-5);
    fprintf(stderr, "     worst relative error %.2e\n", worst);
}

int main(void) {
    RUN(test_block_matches_transformer_encoder_layer_in_float64);
    RUN(test_block_matches_transformer_encoder_layer_in_float32);
    ag_safetensors_free((ag_safetensors *)reference());
    return testing_summary();
}
