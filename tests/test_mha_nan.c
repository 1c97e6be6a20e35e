// MultiheadAttention keeps a NaN a NaN (issue 9), on both paths (fused: no weights asked
// for, self-attention through the packed projection; composed: weights asked for), in
// float32 and float64, in self- and cross-attention: a NaN in q, k or v, or a +inf in k,
// gives NaN where it reaches, the same NaN (and the same finite values elsewhere) on both
// paths, forward and backward; the other batch stays finite. A query whose keys are all
// masked is not a NaN: its attention is zero, so its output row is exactly out_proj.bias,
// and its input row gets no gradient.
// In cross-attention the poison is an element of query, key or value; in self-attention,
// where one tensor is all three, it is an element of in_proj_bias's q, k or v block (every
// position's q, k or v of one head), or an element of the input itself.
#include <stdlib.h>

#include "op_checks.h"

// S <= T: under causal with S > T, keys j >= T are attended by no query, and there the
// fused attention kernel (src/ops/attention*.c) gives k's and v's gradients 0 where the
// composed ops and PyTorch give NaN (0 * NaN) for a NaN in q or k: reported to the kernel's
// owner, not covered here.
enum { B = 2, T = 5, S = 4, E = 8, H = 2 };

typedef enum { NAN_Q, NAN_K, NAN_V, INF_K, NAN_X, N_POISONS } poison;
static const char *const poison_names[] = {"NaN in q", "NaN in k", "NaN in v", "+inf in k",
                                           "NaN in the input"};

typedef struct {
    ag_params *ps;
    ag_mha m;
    ag_tensor *x[3], *dy;  // query, key, value (one tensor in self-attention)
    bool self;
} setup;

static setup make_setup(ag_dtype dt, bool self, uint64_t seed) {
    setup s = {.self = self};
    s.ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    ag_mha_config cfg = {.embed_dim = E, .num_heads = H};
    CHECK(ag_mha_init(&s.m, s.ps, "", &cfg, &rng));
    for (int i = 0; i < ag_params_count(s.ps); i++)
        ag_tensor_init_uniform(ag_params_at(s.ps, i), &rng, -0.7, 0.7);
    int L = self ? T : S;
    s.x[0] = random_leaf(dt, 3, (int[]){B, T, E}, seed + 1);
    s.x[1] = self ? s.x[0] : random_leaf(dt, 3, (int[]){B, L, E}, seed + 2);
    s.x[2] = self ? s.x[0] : random_leaf(dt, 3, (int[]){B, L, E}, seed + 3);
    s.dy = uniform_tensor(dt, 3, (int[]){B, T, E}, seed + 4, -1, 1);
    return s;
}

static void free_setup(setup *s) {
    ag_tensor_free(s->x[0]);
    if (!s->self) {
        ag_tensor_free(s->x[1]);
        ag_tensor_free(s->x[2]);
    }
    ag_tensor_free(s->dy);
    ag_params_free(s->ps);
}

// Puts the poison in place (see the top of the file); false if it has no place here.
static bool apply(setup *s, poison p) {
    double nan = NAN, value = p == INF_K ? INFINITY : nan;
    if (p == NAN_X) {
        ag_tensor_set_item(s->x[0], (size_t)(0 * T + 2) * E + 1, nan);  // batch 0, position 2
        return true;
    }
    int block = p == NAN_Q ? 0 : p == NAN_V ? 2 : 1;  // q, k, v
    if (s->self) {  // head 1's first component, for every position
        ag_tensor_set_item(s->m.in_proj_bias, (size_t)block * E + E / H, value);
        return true;
    }
    size_t at = block == 0 ? (size_t)(0 * T + 1) * E + 2 : (size_t)(0 * S + 2) * E + 1;
    ag_tensor_set_item(s->x[block], at, value);  // batch 0: query 1, or key/value 2
    return true;
}

// The output and every gradient (parameters, then the distinct inputs), malloc'd.
static double *run(setup *s, const ag_mha_opts *o, bool weights, size_t *n) {
    ag_params_zero_grad(s->ps);
    for (int i = 0; i < 3; i++) ag_tensor_zero_grad(s->x[i]);
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = NULL;
    ag_tensor *y = ag_mha_forward(tp, &s->m, s->x[0], s->x[1], s->x[2], o, weights ? &w : NULL);
    CHECK(y != NULL);
    if (!y) {
        ag_tape_free(tp);
        *n = 0;
        return NULL;
    }
    ag_backward_with(tp, y, s->dy);
    const ag_tensor *parts[12];
    int np = 0;
    for (int i = 0; i < ag_params_count(s->ps); i++) parts[np++] = ag_params_at(s->ps, i);
    for (int i = 0; i < (s->self ? 1 : 3); i++) parts[np++] = s->x[i];
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

// NaN at the same places, infinities equal, the rest within tol normwise.
static bool same_nans_and_close(const double *a, const double *b, size_t n, double tol,
                                const char *what) {
    normwise e = {0, 0};
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) {
            fprintf(stderr, "  %s: element %zu is %g on the fused path, %g with weights\n",
                    what, i, a[i], b[i]);
            return false;
        }
        if (!isnan(a[i])) normwise_add(&e, a[i], b[i]);
    }
    if (!(normwise_result(e) <= tol))
        fprintf(stderr, "  %s: the paths differ by %.3g\n", what, normwise_result(e));
    return normwise_result(e) <= tol;
}

// How many of output row (b, t)'s E values are NaN.
static int nans_in_row(const double *out, int b, int t) {
    int k = 0;
    for (int e = 0; e < E; e++) k += isnan(out[((size_t)b * T + t) * E + e]) != 0;
    return k;
}

// Where the poison must (or must not) reach in the output, from the rule "a NaN reaches
// what the composed ops compute from it": batch 1 never; in cross-attention a NaN in query
// row 1 only that row, a NaN in a key or a value every query of batch 0; in
// self-attention, one head's q, k or v (or the input at position 2) every row of batch 0,
// and the bias blocks batch 1 too.
static bool reaches_where_it_should(const double *out, const setup *s, poison p) {
    bool ok = true;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int n = nans_in_row(out, b, t);
            bool poisoned_batch = b == 0 || (s->self && p != NAN_X);
            bool want_all = poisoned_batch && (s->self || p != NAN_Q || t == 1);
            if (p == INF_K && poisoned_batch) continue;  // +inf: NaN or a zero weight
            if (want_all ? n != E : n != 0) {
                fprintf(stderr, "  %s %s: output row (%d, %d) has %d NaN\n",
                        s->self ? "self" : "cross", poison_names[p], b, t, n);
                ok = false;
            }
        }
    return ok;
}

static void check_poison(poison p) {
    for (int dti = 0; dti < 2; dti++) {
        ag_dtype dt = dti ? AG_F64 : AG_F32;
        double tol = dti ? 1e-12 : 1e-5;
        for (int self = 0; self < 2; self++)
            for (int causal = 0; causal < 2; causal++) {
                if (p == NAN_X && !self) continue;
                setup s = make_setup(dt, self, 10 + (uint64_t)p);
                CHECK(apply(&s, p));
                ag_mha_opts o = {.causal = causal};
                size_t nf, nw;
                double *fused = run(&s, &o, false, &nf), *weights = run(&s, &o, true, &nw);
                char what[128];
                snprintf(what, sizeof what, "%s %s %s%s", ag_dtype_name(dt),
                         self ? "self" : "cross", poison_names[p], causal ? " causal" : "");
                CHECK(fused && weights && nf == nw);
                if (fused && weights && nf == nw) {
                    CHECK(same_nans_and_close(fused, weights, nf, tol, what));
                    if (!causal) CHECK(reaches_where_it_should(fused, &s, p));
                    size_t nans = 0;  // the gradients carry it too
                    for (size_t i = (size_t)B * T * E; i < nf; i++) nans += isnan(fused[i]) != 0;
                    CHECK(nans > 0);
                }
                free(fused);
                free(weights);
                free_setup(&s);
            }
    }
}

static void test_nan_in_q_reaches_the_same_places_on_both_paths(void) { check_poison(NAN_Q); }
static void test_nan_in_k_reaches_the_same_places_on_both_paths(void) { check_poison(NAN_K); }
static void test_nan_in_v_reaches_the_same_places_on_both_paths(void) { check_poison(NAN_V); }
static void test_inf_in_k_reaches_the_same_places_on_both_paths(void) { check_poison(INF_K); }
static void test_nan_in_the_input_reaches_the_same_places_on_both_paths(void) {
    check_poison(NAN_X);
}

// Fully masked queries: cross-attention with batch 1's keys all padded; self-attention
// with query 0 masked from key 0, the only key causal leaves it. Their output rows are
// exactly out_proj.bias, on both paths, and their input rows get no gradient.
static void test_a_fully_masked_query_gives_exactly_the_output_bias(void) {
    for (int dti = 0; dti < 2; dti++) {
        ag_dtype dt = dti ? AG_F64 : AG_F32;
        for (int self = 0; self < 2; self++)
            for (int weights = 0; weights < 2; weights++) {
                setup s = make_setup(dt, self, 30);
                ag_tensor *kpm = ag_tensor_zeros(AG_BOOL, 2, (int[]){B, S});
                for (int j = 0; j < S; j++) ((uint8_t *)kpm->data)[S + j] = 1;
                ag_tensor *am = ag_tensor_zeros(AG_BOOL, 2, (int[]){T, T});
                ((uint8_t *)am->data)[0] = 1;
                ag_mha_opts o = self ? (ag_mha_opts){.attn_mask = am, .causal = true}
                                     : (ag_mha_opts){.key_padding_mask = kpm};
                ag_tape *tp = ag_tape_new();
                ag_tensor *w = NULL;
                ag_tensor *y = ag_mha_forward(tp, &s.m, s.x[0], s.x[1], s.x[2], &o,
                                              weights ? &w : NULL);
                CHECK(y != NULL);
                if (y) {
                    ag_backward_with(tp, y, s.dy);
                    bool exact = true, no_grad = true, others_move = false;
                    for (int b = 0; b < B; b++)
                        for (int t = 0; t < T; t++) {
                            bool masked = self ? t == 0 : b == 1;
                            for (int e = 0; e < E; e++) {
                                size_t i = ((size_t)b * T + t) * E + (size_t)e;
                                double bias = ag_tensor_item(s.m.out_proj.bias, (size_t)e);
                                if (masked) {
                                    exact = exact && ag_tensor_item(y, i) == bias;
                                    if (!self)
                                        no_grad = no_grad && ag_tensor_grad_item(s.x[0], i) == 0;
                                } else {
                                    others_move = others_move || ag_tensor_item(y, i) != bias;
                                }
                            }
                        }
                    CHECK(exact);
                    CHECK(no_grad);
                    CHECK(others_move);
                }
                ag_tape_free(tp);
                ag_tensor_free(kpm);
                ag_tensor_free(am);
                free_setup(&s);
            }
    }
}

// A NaN query row and key padding, against torch 1.13:
// nn.MultiheadAttention merges key_padding_mask into a float attn_mask with masked_fill,
// so an entry at a padded key gets gradient 0 even in a NaN row, and a [T, S] mask shared
// by the batch stays finite where only that row's padded keys meet it. attograd put
// 0 * NaN = NaN there, on both paths. Reference values: torch 1.13 in float64 on the
// weights and inputs below, made by the same formulas (tests/pytorch has no such case).
static void test_a_nan_row_gives_padded_keys_additive_mask_entries_no_gradient(void) {
    enum { PB = 2, PT = 2, PS = 3, PE = 4, PH = 2 };
    const double ref2[PT * PS] = {NAN, 0.13782185748075543, NAN,
                                  0.1030964652070549, -0.10103946078956905, -0.002057004417485811};
    const double ref3[PB * PH * PT * PS] = {
        0.015072897455978047, -0.015072897455978049, 0.0, 0.04685629773546004,
        -0.046856297735460045, 0.0, -0.1528947549367335, 0.1528947549367335, 0.0,
        0.054183163054108995, -0.054183163054109, 0.0, NAN, 0.0, NAN, -0.03784855843528568,
        0.0, 0.03784855843528567, NAN, 0.0, NAN, 0.039905562852771505, 0.0,
        -0.03990556285277149};
    for (int dti = 0; dti < 2; dti++) {
        const ag_dtype dt = dti ? AG_F64 : AG_F32;
        const double tol = dti ? 1e-12 : 1e-5;
        for (int per_slice = 0; per_slice < 2; per_slice++)
            for (int weights = 0; weights < 2; weights++) {
                ag_params *ps = ag_params_new(dt);
                ag_pcg32 rng = ag_pcg32_make(1, 1);
                ag_mha m;
                CHECK(ag_mha_init(&m, ps, "", &(ag_mha_config){.embed_dim = PE, .num_heads = PH},
                                  &rng));
                for (int p = 0; p < ag_params_count(ps); p++) {  // state_dict order
                    ag_tensor *t = ag_params_at(ps, p);
                    for (size_t i = 0; i < t->numel; i++)
                        ag_tensor_set_item(t, i, 0.6 * sin(0.37 * (double)(i + 1) + p));
                }
                ag_tensor *q = ag_tensor_zeros(dt, 3, (int[]){PB, PT, PE});
                ag_tensor *kv = ag_tensor_zeros(dt, 3, (int[]){PB, PS, PE});
                ag_tensor *dy = ag_tensor_zeros(dt, 3, (int[]){PB, PT, PE});
                for (size_t i = 0; i < q->numel; i++) {
                    ag_tensor_set_item(q, i, 0.8 * sin(1.0 + (double)i));
                    ag_tensor_set_item(dy, i, 0.3 * cos((double)i));
                }
                for (size_t i = 0; i < kv->numel; i++)
                    ag_tensor_set_item(kv, i, 0.8 * cos(0.5 + (double)i));
                ag_tensor_set_item(q, (size_t)PT * PE, NAN);  // batch 1, query 0
                ag_tensor *am = per_slice ? ag_tensor_zeros(dt, 3, (int[]){PB * PH, PT, PS})
                                          : ag_tensor_zeros(dt, 2, (int[]){PT, PS});
                for (size_t i = 0; i < am->numel; i++)
                    ag_tensor_set_item(am, i, 0.1 * (double)i - 0.2);
                ag_tensor_set_requires_grad(am, true);
                ag_tensor *kpm = ag_tensor_zeros(AG_BOOL, 2, (int[]){PB, PS});
                ((uint8_t *)kpm->data)[2] = 1;       // batch 0 pads key 2
                ((uint8_t *)kpm->data)[PS + 1] = 1;  // batch 1 pads key 1
                ag_tape *tp = ag_tape_new();
                ag_tensor *w = NULL;
                ag_tensor *y = ag_mha_forward(tp, &m, q, kv, kv,
                                              &(ag_mha_opts){.attn_mask = am, .key_padding_mask = kpm},
                                              weights ? &w : NULL);
                CHECK(y != NULL);
                if (y) {
                    ag_backward_with(tp, y, dy);
                    const double *ref = per_slice ? ref3 : ref2;
                    for (size_t i = 0; i < am->numel; i++) {
                        const double g = ag_tensor_grad_item(am, i);
                        if (isnan(ref[i])) {
                            CHECK(isnan(g));
                        } else if (!(fabs(g - ref[i]) <= tol * 0.16)) {
                            fprintf(stderr, "  %s %s %s: mask gradient %zu is %g, torch %g\n",
                                    ag_dtype_name(dt), per_slice ? "[B*h,T,S]" : "[T,S]",
                                    weights ? "weights path" : "fused path", i, g, ref[i]);
                            CHECK(!"differs from PyTorch");
                        }
                    }
                }
                ag_tape_free(tp);
                ag_tensor_free(q);
                ag_tensor_free(kv);
                ag_tensor_free(dy);
                ag_tensor_free(am);
                ag_tensor_free(kpm);
                ag_params_free(ps);
            }
    }
}

int main(void) {
    RUN(test_nan_in_q_reaches_the_same_places_on_both_paths);
    RUN(test_nan_in_k_reaches_the_same_places_on_both_paths);
    RUN(test_nan_in_v_reaches_the_same_places_on_both_paths);
    RUN(test_inf_in_k_reaches_the_same_places_on_both_paths);
    RUN(test_nan_in_the_input_reaches_the_same_places_on_both_paths);
    RUN(test_a_fully_masked_query_gives_exactly_the_output_bias);
    RUN(test_a_nan_row_gives_padded_keys_additive_mask_entries_no_gradient);
    return testing_summary();
}
