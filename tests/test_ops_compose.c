// The general ops compose into models nobody planned for: the source documents'
// RelativeMultiHeadAttention (a learnable per-head bias table [h, 2M+1] indexed by the
// clipped relative position, added to the scores inside the softmax) and the per-head
// attention entropy -sum(a * log(a + 1e-10)), built from matmul, reshape, transpose,
// index_select, broadcasting add, masked_fill with -inf, softmax_dim, log, mul and
// reductions along a dim. Gradient checks in float64, float32 against float64, PyTorch
// (tests/pytorch/make_compose_reference.py), and no allocation in a repeated step.
#include "general_ops.h"
#include "pytorch_reference.h"

typedef struct {
    int B, T, E, H, M;
    ag_tensor *rel_index;  // i64 [T*T]: clip(i - j, -M, M) + M
    ag_tensor *causal;     // bool [T, T]: true above the diagonal (masked)
    int output;            // 0: the attention output, 1: the entropy
} rel_mha;

static rel_mha make_model(int B, int T, int E, int H, int M) {
    rel_mha m = {B, T, E, H, M, ag_tensor_zeros(AG_I64, 1, (int[]){T * T}),
                 ag_tensor_zeros(AG_BOOL, 2, (int[]){T, T}), 0};
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            int rel = i - j < -M ? -M : i - j > M ? M : i - j;
            ag_tensor_set_item(m.rel_index, (size_t)(i * T + j), rel + M);
            ag_tensor_set_item(m.causal, (size_t)(i * T + j), j > i);
        }
    return m;
}

static void free_model(rel_mha *m) {
    ag_tensor_free(m->rel_index);
    ag_tensor_free(m->causal);
}

// [B, T, E] -> [B, h, T, d]
static ag_tensor *heads(ag_tape *tp, const rel_mha *m, ag_tensor *y) {
    int d = m->E / m->H;
    return ag_transpose(tp, ag_reshape(tp, y, 4, (int[]){m->B, m->T, m->H, d}), 1, 2);
}

// in: x [B,T,E], w_q, w_k, w_v, w_o [E,E], rel_bias [h, 2M+1]. Writes the attention
// weights' entropy per head ([B, h], the mean over queries) to *entropy.
static ag_tensor *forward(ag_tape *tp, ag_tensor *const in[], const rel_mha *m,
                          ag_tensor **entropy) {
    const int B = m->B, T = m->T, E = m->E, H = m->H, d = E / H;
    ag_tensor *q = heads(tp, m, ag_matmul(tp, in[0], in[1], false, true));
    ag_tensor *k = heads(tp, m, ag_matmul(tp, in[0], in[2], false, true));
    ag_tensor *v = heads(tp, m, ag_matmul(tp, in[0], in[3], false, true));
    ag_tensor *scores = ag_scale(tp, ag_matmul(tp, q, k, false, true), 1 / sqrt((double)d));
    ag_tensor *bias = ag_reshape(tp, ag_index_select(tp, in[5], 1, m->rel_index), 3,
                                 (int[]){H, T, T});
    scores = ag_masked_fill(tp, ag_add(tp, scores, bias), m->causal, -INFINITY);
    ag_tensor *a = ag_softmax_dim(tp, scores, -1);  // [B, h, T, T]

    ag_tensor *tiny = ag_tape_tensor(tp, a->dtype, 0, NULL);
    ag_tensor_fill(tiny, 1e-10);
    ag_tensor *plogp = ag_mul(tp, a, ag_log(tp, ag_add(tp, a, tiny)));
    *entropy = ag_neg(tp, ag_mean_dim(tp, ag_sum_dim(tp, plogp, -1, false), -1, false));

    ag_tensor *o = ag_reshape(tp, ag_transpose(tp, ag_matmul(tp, a, v, false, false), 1, 2), 3,
                              (int[]){B, T, E});
    return ag_matmul(tp, o, in[4], false, true);
}

static ag_tensor *model_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const rel_mha *m = user;
    ag_tensor *entropy, *out = forward(tp, in, m, &entropy);
    return m->output ? entropy : out;
}

static const char *const names[] = {"x", "w_q", "w_k", "w_v", "w_o", "rel_bias"};

static void make_inputs(const rel_mha *m, ag_tensor *in[6], uint64_t seed) {
    int E = m->E;
    in[0] = leaf(3, (int[]){m->B, m->T, E}, seed);
    for (int i = 1; i <= 4; i++) in[i] = leaf(2, (int[]){E, E}, seed + (uint64_t)i);
    in[5] = leaf(2, (int[]){m->H, 2 * m->M + 1}, seed + 5);
}

static void test_relative_attention_and_entropy_gradcheck_in_float64(void) {
    const int sizes[][5] = {{2, 5, 8, 2, 2}, {1, 1, 4, 1, 3}, {2, 4, 6, 3, 1}};  // T = 1, h = 1
    for (int s = 0; s < 3; s++) {
        rel_mha m = make_model(sizes[s][0], sizes[s][1], sizes[s][2], sizes[s][3], sizes[s][4]);
        ag_tensor *in[6];
        make_inputs(&m, in, 10 + 10 * (uint64_t)s);
        for (m.output = 0; m.output < 2; m.output++) {
            char label[64];
            snprintf(label, sizeof label, "%s, sizes %d", m.output ? "entropy" : "output", s);
            // With T = 1 the entropy is -log(1 + 1e-10) = -1e-10, which float32 rounds to
            // 0: only its gradient check is meaningful there.
            if (m.output && m.T == 1)
                CHECK(ag_gradcheck(model_fn, in, 6, &m, NULL, NULL));
            else
                CHECK(op_checks_pass(label, model_fn, in, 6, &m));
        }
        free_tensors(in, 6);
        free_model(&m);
    }
}

static int meta_int(const ag_safetensors *st, const char *key) {
    const char *v = ag_safetensors_meta(st, key);
    return v ? atoi(v) : 0;
}

static double worst_f64, worst_f32;

static void compare_with_pytorch(const ag_safetensors *st, ag_dtype dt, double tol) {
    rel_mha m = make_model(meta_int(st, "B"), meta_int(st, "T"), meta_int(st, "E"),
                           meta_int(st, "heads"), meta_int(st, "max_rel"));
    ag_tensor *in[6];
    char key[32];
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof key, "in.%s", names[i]);
        in[i] = requiring_grad(ag_tensor_convert(ag_safetensors_find(st, key), dt));
    }
    ag_tape *tp = ag_tape_new();
    ag_tensor *entropy, *out = forward(tp, in, &m, &entropy);
    ag_tensor *g_out = ag_tensor_convert(ag_safetensors_find(st, "g_out"), dt);
    ag_tensor *g_ent = ag_tensor_convert(ag_safetensors_find(st, "g_ent"), dt);
    ag_backward(tp, ag_add(tp, ag_sum(tp, ag_mul(tp, out, g_out)),
                           ag_sum(tp, ag_mul(tp, entropy, g_ent))));
    double worst = fmax(normwise_error_to(out, false, ag_safetensors_find(st, "out")),
                        normwise_error_to(entropy, false, ag_safetensors_find(st, "entropy")));
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof key, "grad.%s", names[i]);
        double e = normwise_error_to(in[i], true, ag_safetensors_find(st, key));
        if (!(e <= tol)) fprintf(stderr, "  %s %s: %.3e\n", ag_dtype_name(dt), key, e);
        worst = fmax(worst, e);
    }
    CHECK(worst <= tol);
    if (dt == AG_F64) worst_f64 = worst; else worst_f32 = worst;
    ag_tape_free(tp);
    ag_tensor_free(g_out);
    ag_tensor_free(g_ent);
    free_tensors(in, 6);
    free_model(&m);
}

static void test_relative_attention_and_entropy_match_pytorch(void) {
    ag_safetensors *st = load_reference("compose_pytorch.safetensors");
    CHECK(st != NULL);
    if (!st) return;
    compare_with_pytorch(st, AG_F64, 1e-10);
    compare_with_pytorch(st, AG_F32, 1e-5);
    fprintf(stderr, "     worst normwise error against PyTorch: f64 %.2e, f32 %.2e\n", worst_f64,
            worst_f32);
    ag_safetensors_free(st);
}

// Node by node: the causal mask puts -inf into the scores (masked_fill, softmax_dim), and
// every node must still pass its own check, in float64 and in float32.
static void test_tape_check_passes_every_node_of_the_relative_attention_tape(void) {
    for (int f32 = 0; f32 < 2; f32++) {
        rel_mha m = make_model(2, 5, 8, 2, 2);
        ag_tensor *in[6];
        make_inputs(&m, in, 40);
        if (f32)
            for (int i = 0; i < 6; i++) {
                ag_tensor *t = requiring_grad(ag_tensor_convert(in[i], AG_F32));
                ag_tensor_free(in[i]);
                in[i] = t;
            }
        ag_tape *tp = ag_tape_new();
        ag_tensor *entropy, *out = forward(tp, in, &m, &entropy);
        ag_backward(tp, ag_add(tp, ag_mean(tp, ag_mul(tp, out, out)), ag_mean(tp, entropy)));
        ag_tape_check_report r;
        CHECK(ag_tape_check(tp, NULL, &r));
        CHECK(r.n_nodes == ag_tape_num_nodes(tp) && r.n_nodes > 25);
        int masked = 0, log_steps = 0;
        for (int i = 0; i < r.n_nodes; i++) {
            // f32 nodes too: through their ops' f64 twins
            CHECK(r.nodes[i].fd.verdict == AG_CHECK_PASS && r.nodes[i].replay_diff == 0 &&
                  r.nodes[i].in_f64);
            if (!strcmp(r.nodes[i].op, "softmax_dim")) masked = r.nodes[i].fd.not_finite;
            if (!strcmp(r.nodes[i].op, "log")) log_steps = r.nodes[i].fd.smaller_steps;
        }
        CHECK(masked == 2 * 2 * 10);  // B h T(T-1)/2 masked scores
        // log(a + 1e-10) at a masked a = 0: a step of eps would leave log's domain.
        CHECK(log_steps > 0);
        if (r.verdict != AG_CHECK_PASS) ag_tape_check_print(&r, stderr);
        ag_tape_check_report_free(&r);
        ag_tape_free(tp);
        free_tensors(in, 6);
        free_model(&m);
    }
}

typedef struct {
    rel_mha m;
    ag_tensor *in[6];
} step_ctx;

static void model_step(ag_tape *tp, int step, void *user) {
    (void)step;
    step_ctx *c = user;
    ag_tensor *entropy, *out = forward(tp, c->in, &c->m, &entropy);
    ag_backward(tp, ag_add(tp, ag_mean(tp, ag_mul(tp, out, out)), ag_mean(tp, entropy)));
}

static void test_repeated_step_allocates_no_heap_memory(void) {
    step_ctx c = {make_model(4, 32, 64, 4, 8), {0}};
    make_inputs(&c.m, c.in, 90);
    CHECK(repeated_step_allocates_nothing(model_step, &c));
    free_tensors(c.in, 6);
    free_model(&c.m);
}

int main(void) {
    RUN(test_relative_attention_and_entropy_gradcheck_in_float64);
    RUN(test_relative_attention_and_entropy_match_pytorch);
    RUN(test_tape_check_passes_every_node_of_the_relative_attention_tape);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
