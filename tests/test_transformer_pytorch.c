// The decoder layer and the encoder-decoder stacks against torch.nn.TransformerDecoderLayer
// and torch.nn.Transformer (batch_first=True): each case in
// tests/reference/transformer_pytorch.safetensors (see
// tests/pytorch/make_transformer_reference.py) is loaded strictly into attograd's module
// by PyTorch's state_dict names, and the output and the gradients of the inputs and of
// every parameter are compared, per tensor, as max |ours - torch| / max |torch|: within
// 1e-12 in float64, and in float32 within 1e-5 and within 4 times PyTorch's own float32
// error on the same case.
// The cases: post-LN and pre-LN, ReLU and GELU, causal self-attention, bool and float
// tgt_mask and memory_mask, key padding of target and memory, T != S, T = 1, one head,
// stacks of 1 to 3 layers; and a transformer with every mask at once (src_mask, causal
// tgt, memory_mask, and the three key padding masks, memory's not src's) and another
// layer_norm_eps, and one of B = S = T = 1.
#include "op_checks.h"
#include "pytorch_reference.h"

static const ag_safetensors *reference(void) {
    static ag_safetensors *st;
    if (!st) st = load_reference("transformer_pytorch.safetensors");
    return st;
}

// Case `c` of kind 'd' (decoder layer) or 't' (transformer): its tensor `what`.
static const ag_tensor *get(char kind, int c, const char *what) {
    char name[320];
    snprintf(name, sizeof name, "%c%d.%s", kind, c, what);
    return ag_safetensors_find(reference(), name);
}

static const char *settings(char kind, int c) {
    char name[32];
    snprintf(name, sizeof name, "%c%d.config", kind, c);
    return ag_safetensors_meta(reference(), name);
}

// The integer `key` of a case's configuration; -1 if absent.
static int config(char kind, int c, const char *key) {
    char value[32];
    return reference_value(settings(kind, c), key, value, sizeof value) ? atoi(value) : -1;
}

static int cases(const char *which) {
    const char *n = reference() ? ag_safetensors_meta(reference(), which) : NULL;
    return n ? atoi(n) : 0;
}

static double worst;

// Our output (or, with `grad`, our gradient) against torch's.
static void expect(char kind, int c, const char *what, const ag_tensor *ours, bool grad,
                   double tol) {
    const ag_tensor *ref = get(kind, c, what);
    const void *buf = grad ? ours->grad : ours->data;
    CHECK(ref && buf && ref->numel == ours->numel);
    if (!ref || !buf || ref->numel != ours->numel) return;
    const double e = normwise_error_to(ours, grad, ref);
    worst = fmax(worst, e);
    if (!(e <= tol)) {
        fprintf(stderr, "case %c%d %s %s: relative error %.3e > %.0e\n", kind, c,
                ag_dtype_name(ours->dtype), what, e, tol);
        CHECK(!"differs from PyTorch");
    }
}

static ag_block_config layer_config(char kind, int c) {
    char eps[32];  // layer_norm_eps, when the case sets one (0: PyTorch's 1e-5)
    const bool has_eps = reference_value(settings(kind, c), "eps", eps, sizeof eps);
    return (ag_block_config){.layer_norm_eps = has_eps ? atof(eps) : 0,
                             .d_model = config(kind, c, "d_model"),
                             .num_heads = config(kind, c, "nhead"),
                             .dim_feedforward = config(kind, c, "ff"),
                             .norm_first = config(kind, c, "norm_first") == 1,
                             .activation = strstr(settings(kind, c), "act=gelu") ? AG_ACT_GELU
                                                                                 : AG_ACT_RELU};
}

// A case's tensor in dtype dt (masks: bool stays bool, a float mask becomes dt), or NULL.
static ag_tensor *input(char kind, int c, const char *what, ag_dtype dt) {
    const ag_tensor *t = get(kind, c, what);
    if (!t) return NULL;
    return ag_tensor_convert(t, t->dtype == AG_BOOL ? AG_BOOL : dt);
}

// The state_dict of case (kind, c), strictly: every tensor of the module present, of its
// shape, and no other.
static bool load_strict(ag_params *ps, char kind, int c) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%c%d.param.", kind, c);
    ag_err err;
    const int rc = ag_params_load_from(ps, reference(), prefix, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    return rc == 0;
}

// The masks of a case as the forward takes them.
typedef struct masks {
    ag_tensor *t[6];
} masks;

static ag_transformer_opts masks_of(char kind, int c, ag_dtype dt, masks *m) {
    const char *names[6] = {"tgt_mask", "memory_mask", "tgt_key_padding_mask",
                            "memory_key_padding_mask", "src_key_padding_mask", "src_mask"};
    for (int i = 0; i < 6; i++) m->t[i] = input(kind, c, names[i], dt);
    ag_transformer_opts o = {.tgt_mask = m->t[0], .memory_mask = m->t[1],
                             .tgt_key_padding_mask = m->t[2],
                             .memory_key_padding_mask = m->t[3],
                             .src_key_padding_mask = m->t[4], .src_mask = m->t[5],
                             .causal = config(kind, c, "causal") == 1};
    // The script passes src's as memory's too, unless the case has one of its own.
    if (kind == 't' && !o.memory_key_padding_mask) o.memory_key_padding_mask = m->t[4];
    return o;
}

static void masks_free(masks *m) {
    for (int i = 0; i < 6; i++) ag_tensor_free(m->t[i]);
}

// Backward from torch's upstream gradient, then every gradient against torch's.
static void expect_gradients(char kind, int c, ag_tape *tp, ag_tensor *y, ag_params *ps,
                             ag_tensor *const inputs[2], const char *const input_names[2],
                             double tol) {
    ag_tensor *dy = ag_tensor_convert(get(kind, c, "grad_out"), y->dtype);
    ag_backward_with(tp, y, dy);
    for (int i = 0; i < 2; i++) {
        char what[64];
        snprintf(what, sizeof what, "grad.%s", input_names[i]);
        expect(kind, c, what, inputs[i], true, tol);
    }
    for (int i = 0; i < ag_params_count(ps); i++) {
        ag_tensor *p = ag_params_at(ps, i);
        char what[200];
        snprintf(what, sizeof what, "grad.%s", p->name);
        expect(kind, c, what, p, true, tol);
    }
    ag_tensor_free(dy);
}

static void run_decoder_case(int c, ag_dtype dt, double tol) {
    ag_params *ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_decoder_layer l;
    const ag_block_config cfg = layer_config('d', c);
    CHECK(ag_decoder_layer_init(&l, ps, "", &cfg, &rng));
    CHECK(load_strict(ps, 'd', c));
    ag_tensor *in[2] = {input('d', c, "tgt", dt), input('d', c, "memory", dt)};
    for (int i = 0; i < 2; i++) ag_tensor_set_requires_grad(in[i], true);
    masks m;
    const ag_transformer_opts o = masks_of('d', c, dt, &m);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_decoder_layer_forward(tp, &l, in[0], in[1], &o);
    CHECK(y != NULL);
    if (y) {
        expect('d', c, "out", y, false, tol);
        expect_gradients('d', c, tp, y, ps, in, (const char *const[]){"tgt", "memory"}, tol);
    }
    ag_tape_free(tp);
    masks_free(&m);
    ag_tensor_free(in[0]);
    ag_tensor_free(in[1]);
    ag_params_free(ps);
}

static bool transformer_of(int c, ag_params *ps, ag_transformer *t) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    const ag_transformer_config cfg = {.layer = layer_config('t', c),
                                       .num_encoder_layers = config('t', c, "enc"),
                                       .num_decoder_layers = config('t', c, "dec")};
    return ag_transformer_init(t, ps, "", &cfg, &rng);
}

static void run_transformer_case(int c, ag_dtype dt, double tol) {
    ag_params *ps = ag_params_new(dt);
    ag_transformer t;
    CHECK(transformer_of(c, ps, &t));
    CHECK(load_strict(ps, 't', c));
    ag_tensor *in[2] = {input('t', c, "src", dt), input('t', c, "tgt", dt)};
    for (int i = 0; i < 2; i++) ag_tensor_set_requires_grad(in[i], true);
    masks m;
    const ag_transformer_opts o = masks_of('t', c, dt, &m);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_transformer_forward(tp, &t, in[0], in[1], &o);
    CHECK(y != NULL);
    if (y) {
        expect('t', c, "out", y, false, tol);
        expect_gradients('t', c, tp, y, ps, in, (const char *const[]){"src", "tgt"}, tol);
    }
    ag_tape_free(tp);
    masks_free(&m);
    ag_tensor_free(in[0]);
    ag_tensor_free(in[1]);
    ag_transformer_free(&t);
    ag_params_free(ps);
}

static void test_decoder_layer_matches_transformer_decoder_layer_in_float64(void) {
    CHECK(cases("decoder_cases") == 6);
    worst = 0;
    for (int c = 0; c < cases("decoder_cases"); c++) run_decoder_case(c, AG_F64, 1e-12);
    fprintf(stderr, "     worst relative error %.2e\n", worst);
}

// In float32 each case's worst error (over the output and every gradient) is held to a
// few times PyTorch's own float32 error on the same case (the script measures it).
static void f32_like_pytorch(char kind, int c, void (*run)(int, ag_dtype, double)) {
    char name[48];
    snprintf(name, sizeof name, "%c%d.torch_f32_error", kind, c);
    const char *torch = ag_safetensors_meta(reference(), name);
    CHECK(torch != NULL);
    const double theirs = torch ? atof(torch) : 0;
    worst = 0;
    run(c, AG_F32, 1e-5);
    fprintf(stderr, "     %c%d: %.2e (PyTorch's float32: %.2e)\n", kind, c, worst, theirs);
    CHECK(worst <= 4 * theirs);
}

static void test_decoder_layer_matches_transformer_decoder_layer_in_float32(void) {
    for (int c = 0; c < cases("decoder_cases"); c++) f32_like_pytorch('d', c, run_decoder_case);
}

static void test_transformer_matches_nn_transformer_in_float64(void) {
    CHECK(cases("transformer_cases") == 6);
    worst = 0;
    for (int c = 0; c < cases("transformer_cases"); c++) run_transformer_case(c, AG_F64, 1e-12);
    fprintf(stderr, "     worst relative error %.2e\n", worst);
}

static void test_transformer_matches_nn_transformer_in_float32(void) {
    for (int c = 0; c < cases("transformer_cases"); c++)
        f32_like_pytorch('t', c, run_transformer_case);
}

// A checkpoint moves both ways with strict=True: attograd's parameters are PyTorch's
// state_dict, name for name and shape for shape (the strict loads above, which refuse a
// tensor missing on either side); a checkpoint attograd writes loads strictly back and
// gives the same output. It is left in the working directory as
// transformer_from_attograd.safetensors, for make_transformer_reference.py --check to
// load into nn.Transformer(strict=True) by hand.
static void test_a_checkpoint_moves_both_ways_with_pytorchs_names(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_transformer t;
    CHECK(transformer_of(0, ps, &t));
    CHECK(load_strict(ps, 't', 0));
    int in_file = 0;
    for (int i = 0; i < ag_safetensors_count(reference()); i++)
        in_file += strncmp(ag_safetensors_name(reference(), i), "t0.param.", 9) == 0;
    CHECK(in_file == ag_params_count(ps));
    ag_err err;
    CHECK(ag_params_save(ps, "transformer_from_attograd.safetensors", NULL, &err) == 0);
    ag_params *back = ag_params_new(AG_F64);
    ag_transformer t2;
    CHECK(transformer_of(0, back, &t2));
    CHECK(ag_params_load(back, "transformer_from_attograd.safetensors", &err) == 0);
    for (int i = 0; i < ag_params_count(ps); i++)
        CHECK(normwise_error_to(ag_params_at(back, i), false, ag_params_at(ps, i)) == 0);
    ag_transformer_free(&t);
    ag_transformer_free(&t2);
    ag_params_free(ps);
    ag_params_free(back);
}

int main(void) {
    RUN(test_decoder_layer_matches_transformer_decoder_layer_in_float64);
    RUN(test_decoder_layer_matches_transformer_decoder_layer_in_float32);
    RUN(test_transformer_matches_nn_transformer_in_float64);
    RUN(test_transformer_matches_nn_transformer_in_float32);
    RUN(test_a_checkpoint_moves_both_ways_with_pytorchs_names);
    ag_safetensors_free((ag_safetensors *)reference());
    return testing_summary();
}
