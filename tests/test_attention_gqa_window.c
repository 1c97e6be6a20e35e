// Grouped-query attention (ag_attention with opts kv_heads = h_kv < h) and sliding-window
// attention (softmax.window = W) in the fused op: in every layout (heads apart, heads
// inside, packed) each is its definition, composed from ops -- k and v repeated to h
// heads by ag_index_select (PyTorch's repeat_interleave, query head i reading kv head
// i / (h / h_kv)), then matmul, softmax (whose window is checked against an explicit mask
// of the definition), dropout, matmul -- to 1e-12 in float64, output and every gradient
// (q, k, v, the additive mask, the position table), with masks, causal and not, T != S,
// odd head dims, RoPE, a position bias, dropout and a query offset; gradcheck in float64;
// bad kv_heads and windows refused.
#include <stdlib.h>

#include "op_checks.h"

enum { B = 2 };
enum layout { APART, INSIDE, PACKED };

typedef struct {
    enum layout layout;
    int h, kvh, T, S, d;
    bool causal, masks, rope, t5, dropout;
    int window, q_offset;
} gqa_case;

typedef struct {
    gqa_case c;
    ag_tensor *mask, *kpm;  // bool [T, S] and [B, S], or NULL
} problem;

// The options both computations take (the additive mask and the table are inputs).
static ag_attention_opts opts_of(const problem *p, ag_tensor *add, ag_tensor *table) {
    const gqa_case *c = &p->c;
    ag_attention_opts o = {.heads = c->h, .kv_heads = c->kvh};
    o.softmax.scale = 1.0 / sqrt((double)c->d);
    o.softmax.causal = c->causal;
    o.softmax.window = c->window;
    o.softmax.q_offset = c->q_offset;
    o.softmax.mask = p->mask;
    o.softmax.key_padding_mask = p->kpm;
    o.softmax.additive_mask = add;
    if (table)
        o.softmax.pos = (ag_pos_bias){.kind = AG_POS_T5, .table = table, .max_distance = 20,
                                      .num_buckets = 8, .bidirectional = !c->causal};
    o.rope = c->rope;
    o.rope_opts.base = 10000;
    o.rope_opts.pos_offset = c->q_offset;
    o.dropout = c->dropout ? 0.3 : 0;
    o.training = c->dropout;
    o.seed = 5, o.site = 6;
    return o;
}

// in: q, k, v (or qkv), then the additive mask and the table when the case has them.
static void extras(const problem *p, ag_tensor *const in[], int n, ag_tensor **add,
                   ag_tensor **table) {
    const int first = p->c.layout == PACKED ? 1 : 3;
    *add = p->c.masks && n > first ? in[first] : NULL;
    *table = p->c.t5 ? in[n - 1] : NULL;
}

static ag_tensor *fused_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    const problem *p = user;
    ag_tensor *add, *table;
    extras(p, in, n, &add, &table);
    ag_attention_opts o = opts_of(p, add, table);
    return p->c.layout == PACKED ? ag_attention_packed(tp, in[0], &o)
                                 : ag_attention(tp, in[0], in[1], in[2], &o);
}

// x [B, h_kv, L, d] -> [B, h, L, d]: kv head j as heads j*g .. j*g + g - 1.
static ag_tensor *repeat_interleave(ag_tape *tp, ag_tensor *x, int h) {
    const int kvh = x->shape[1];
    ag_tensor *index = ag_tape_tensor(tp, AG_I64, 1, (int[]){h});
    for (int i = 0; i < h; i++) ((int64_t *)index->data)[i] = i / (h / kvh);
    return ag_index_select(tp, x, 1, index);
}

// The definition, from ops.
static ag_tensor *composed_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    const problem *p = user;
    const gqa_case *c = &p->c;
    ag_tensor *add, *table;
    extras(p, in, n, &add, &table);
    ag_attention_opts o = opts_of(p, add, table);
    ag_tensor *q = in[0], *k = in[1], *v = in[2];
    if (c->layout == PACKED) {
        const int I = c->h * c->d, Ikv = c->kvh * c->d;
        q = ag_slice(tp, in[0], 2, 0, I);
        k = ag_slice(tp, in[0], 2, I, Ikv);
        v = ag_slice(tp, in[0], 2, I + Ikv, Ikv);
    }
    if (c->layout != APART) {
        q = ag_split_heads(tp, q, c->h);
        k = ag_split_heads(tp, k, c->kvh);
        v = ag_split_heads(tp, v, c->kvh);
    }
    if (c->rope) {  // queries at q_offset + i, keys at j
        q = ag_rope(tp, q, &o.rope_opts);
        k = ag_rope(tp, k, &(ag_rope_opts){.base = o.rope_opts.base});
    }
    k = repeat_interleave(tp, k, c->h);
    v = repeat_interleave(tp, v, c->h);
    ag_tensor *w = ag_softmax(tp, ag_matmul(tp, q, k, false, true), &o.softmax);
    w = ag_dropout(tp, w, o.dropout, o.training, o.seed, o.site);
    ag_tensor *y = ag_matmul(tp, w, v, false, false);
    return c->layout == APART ? y : ag_merge_heads(tp, y);
}

// The case's inputs in float64 (in[]; returns how many) and its bool masks in *p.
static int make_inputs(problem *p, const gqa_case *c, uint64_t seed, ag_tensor *in[5]) {
    p->c = *c;
    const int h = c->h, kvh = c->kvh, T = c->T, S = c->layout == PACKED ? c->T : c->S, d = c->d;
    p->c.S = S;
    int n = 0;
    if (c->layout == APART) {
        in[n++] = random_leaf(AG_F64, 4, (int[]){B, h, T, d}, seed);
        in[n++] = random_leaf(AG_F64, 4, (int[]){B, kvh, S, d}, seed + 1);
        in[n++] = random_leaf(AG_F64, 4, (int[]){B, kvh, S, d}, seed + 2);
    } else if (c->layout == INSIDE) {
        in[n++] = random_leaf(AG_F64, 3, (int[]){B, T, h * d}, seed);
        in[n++] = random_leaf(AG_F64, 3, (int[]){B, S, kvh * d}, seed + 1);
        in[n++] = random_leaf(AG_F64, 3, (int[]){B, S, kvh * d}, seed + 2);
    } else {
        in[n++] = random_leaf(AG_F64, 3, (int[]){B, T, (h + 2 * kvh) * d}, seed);
    }
    p->mask = p->kpm = NULL;
    if (c->masks) {
        in[n++] = random_leaf(AG_F64, 4, (int[]){B, 1, T, S}, seed + 3);
        p->mask = bool_mask(2, (int[]){T, S}, 0.2, seed + 4);
        p->kpm = bool_mask(2, (int[]){B, S}, 0.3, seed + 5);
        for (int t = 0; t < T; t++) ((uint8_t *)p->mask->data)[(size_t)t * S] = 0;
        for (int b = 0; b < B; b++) ((uint8_t *)p->kpm->data)[(size_t)b * S] = 0;
    }
    if (c->t5) in[n++] = random_leaf(AG_F64, 2, (int[]){h, 8}, seed + 6);
    return n;
}

static void free_problem(problem *p, ag_tensor *in[], int n) {
    for (int i = 0; i < n; i++) ag_tensor_free(in[i]);
    ag_tensor_free(p->mask);
    ag_tensor_free(p->kpm);
}

// Output and every input's gradient of fn, as one array of `*total` values.
static double *outputs_and_gradients(ag_fn fn, problem *p, ag_tensor *in[], int n,
                                     size_t *total) {
    for (int i = 0; i < n; i++) ag_tensor_zero_grad(in[i]);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = fn(tp, in, n, p);
    CHECK(y != NULL);
    if (!y) {
        ag_tape_free(tp);
        return NULL;
    }
    ag_tensor *dy = uniform_tensor(AG_F64, y->ndim, y->shape, 99, -1, 1);
    ag_backward_with(tp, y, dy);
    size_t m = y->numel;
    for (int i = 0; i < n; i++) m += in[i]->numel;
    double *v = malloc(m * sizeof *v), *at = v;
    for (size_t e = 0; e < y->numel; e++) *at++ = ag_tensor_item(y, e);
    for (int i = 0; i < n; i++)
        for (size_t e = 0; e < in[i]->numel; e++) *at++ = ag_tensor_grad_item(in[i], e);
    ag_tensor_free(dy);
    ag_tape_free(tp);
    *total = m;
    return v;
}

// The normwise distance of the fused op from its definition, output and gradients.
static double fused_vs_definition(const gqa_case *c, uint64_t seed) {
    problem p;
    ag_tensor *in[5];
    const int n = make_inputs(&p, c, seed, in);
    size_t na = 0, nb = 0;
    double *a = outputs_and_gradients(fused_fn, &p, in, n, &na);
    double *b = outputs_and_gradients(composed_fn, &p, in, n, &nb);
    normwise e = {0, 0};
    for (size_t i = 0; a && b && na == nb && i < na; i++) normwise_add(&e, a[i], b[i]);
    const double err = a && b && na == nb ? normwise_result(e) : INFINITY;
    free(a), free(b);
    free_problem(&p, in, n);
    return err;
}

static const gqa_case cases[] = {
    // layout  h  kvh T  S  d  causal masks  rope   t5     dropout
    {APART, 4, 2, 5, 7, 3, false, false, false, false, false, 0, 0},
    {APART, 4, 2, 7, 5, 4, true, true, true, false, false, 0, 0},
    {APART, 6, 3, 6, 6, 5, true, true, false, true, false, 0, 0},
    {APART, 4, 1, 5, 7, 2, false, true, false, true, true, 0, 0},  // multi-query
    {INSIDE, 4, 2, 5, 7, 3, true, true, false, true, false, 0, 0},
    {INSIDE, 8, 2, 9, 4, 4, false, true, true, false, true, 0, 0},
    {INSIDE, 3, 1, 4, 6, 5, false, false, false, false, false, 0, 0},
    {INSIDE, 4, 4, 5, 7, 3, true, true, false, false, false, 0, 0},  // kv_heads = h: plain
    {PACKED, 4, 2, 6, 6, 3, true, true, false, true, false, 0, 0},
    {PACKED, 6, 2, 5, 5, 4, false, true, true, false, true, 0, 0},
    {PACKED, 2, 1, 7, 7, 5, true, false, false, false, false, 0, 0},
    // One block and more: 300 queries and keys cross the 256-row blocks.
    {INSIDE, 4, 2, 300, 270, 4, true, true, false, false, false, 0, 0},
    {APART, 2, 1, 270, 300, 3, false, false, false, true, false, 0, 0},
    // Sliding windows: causal (the last W keys) and not (|i - j| < W), every option.
    {APART, 2, 2, 9, 9, 3, true, false, false, false, false, 3, 0},
    {APART, 4, 2, 8, 11, 4, false, true, true, false, false, 2, 0},
    {INSIDE, 4, 1, 7, 7, 5, true, true, false, true, true, 1, 0},
    {INSIDE, 2, 2, 6, 9, 2, false, false, false, true, false, 4, 0},
    {INSIDE, 4, 2, 5, 12, 4, true, true, true, false, false, 3, 7},  // query offset
    {PACKED, 4, 2, 10, 10, 4, true, true, true, true, true, 4, 0},
    {PACKED, 2, 1, 8, 8, 3, false, true, false, false, false, 3, 0},
    // Across blocks: whole key blocks skipped on both sides, windows shorter and longer
    // than a block, and wider than the sequence.
    {INSIDE, 2, 1, 700, 700, 4, true, true, true, false, false, 100, 0},
    {APART, 2, 2, 600, 650, 3, false, false, false, true, false, 300, 0},
    {PACKED, 2, 2, 520, 520, 2, true, false, false, false, true, 1, 0},
    {INSIDE, 2, 2, 300, 300, 4, true, true, false, false, false, 5000, 0},
    {INSIDE, 2, 2, 40, 560, 4, true, false, true, false, false, 50, 500},
};

static void test_grouped_attention_is_its_definition_in_every_layout(void) {
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double e = fused_vs_definition(&cases[i], 100 + 10 * (uint64_t)i);
        if (!(e <= 1e-12)) fprintf(stderr, "  case %zu: %.3g\n", i, e);
        CHECK(e <= 1e-12);
        worst = fmax(worst, e);
    }
    fprintf(stderr, "     %zu cases, worst normwise error %.2e (float64)\n",
            sizeof cases / sizeof cases[0], worst);
}

static void test_grouped_attention_passes_gradcheck(void) {
    const gqa_case checked[] = {
        {APART, 4, 2, 3, 4, 3, true, true, false, true, false, 0, 0},
        {INSIDE, 4, 1, 4, 3, 2, false, true, true, false, false, 0, 0},
        {PACKED, 4, 2, 3, 3, 2, true, false, true, false, false, 0, 0},
        {APART, 2, 1, 5, 5, 2, true, true, false, true, false, 2, 0},
        {INSIDE, 2, 2, 4, 6, 2, false, true, true, false, false, 2, 1},
    };
    for (size_t i = 0; i < sizeof checked / sizeof checked[0]; i++) {
        problem p;
        ag_tensor *in[5];
        const int n = make_inputs(&p, &checked[i], 40 + (uint64_t)i, in);
        CHECK(ag_gradcheck(fused_fn, in, n, &p, NULL, NULL));
        free_problem(&p, in, n);
    }
}

// A kv head's gradient comes from its own group only: heads 2 and 3 read kv head 1, so
// with their upstream gradient zero, kv head 1 gets none.
static void test_a_kv_head_gets_gradient_from_its_group_only(void) {
    problem p;
    ag_tensor *in[5];
    const gqa_case c = {APART, 4, 2, 4, 4, 2, false, false, false, false, false, 0, 0};
    const int n = make_inputs(&p, &c, 7, in);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = fused_fn(tp, in, n, &p);
    ag_tensor *dy = uniform_tensor(AG_F64, 4, y->shape, 99, -1, 1);
    const size_t plane = (size_t)c.T * c.d;
    for (int b = 0; b < B; b++)
        for (size_t e = 0; e < 2 * plane; e++)
            ag_tensor_set_item(dy, ((size_t)b * 4 + 2) * plane + e, 0);
    ag_backward_with(tp, y, dy);
    double kv1 = 0;
    for (int b = 0; b < B; b++)
        for (size_t e = 0; e < plane; e++)
            kv1 += fabs(ag_tensor_grad_item(in[1], ((size_t)b * 2 + 1) * plane + e)) +
                   fabs(ag_tensor_grad_item(in[2], ((size_t)b * 2 + 1) * plane + e));
    CHECK(kv1 == 0);
    ag_tensor_free(dy);
    ag_tape_free(tp);
    free_problem(&p, in, n);
}

// ag_softmax's window is its definition: the scores with every key j at distance
// |p - j| >= W from the query's position p = q_offset + i masked (and with causal the
// later keys), as an explicit bool mask.
static void test_a_window_masks_exactly_the_keys_w_or_more_away(void) {
    enum { N = 2, T = 6, S = 9 };
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){N, T, S}, 3, -2, 2);
    for (int causal = 0; causal < 2; causal++)
        for (int W = 1; W <= 10; W += 3)
            for (int off = 0; off <= 3; off += 3) {
                ag_tensor *m = ag_tensor_zeros(AG_BOOL, 2, (int[]){T, S});
                for (int i = 0; i < T; i++)
                    for (int j = 0; j < S; j++) {
                        const int p = off + i;
                        ((uint8_t *)m->data)[i * S + j] =
                            abs(p - j) >= W || (causal && j > p);
                    }
                ag_tape *tp = ag_tape_new();
                ag_tensor *a = ag_softmax(
                    tp, x, &(ag_softmax_opts){.causal = causal, .window = W, .q_offset = off});
                ag_tensor *b = ag_softmax(tp, x, &(ag_softmax_opts){.mask = m});
                CHECK(a && b && normwise_error(a, b, false) == 0.0);
                ag_tape_free(tp);
                ag_tensor_free(m);
            }
    ag_tensor_free(x);
}

// A query whose window holds only masked keys gets zeros and no gradient, as any fully
// masked query.
static void test_a_query_whose_window_is_masked_gets_zeros(void) {
    problem p;
    ag_tensor *in[5];
    const gqa_case c = {APART, 2, 1, 4, 6, 2, true, false, false, false, false, 1, 0};
    const int n = make_inputs(&p, &c, 9, in);
    p.kpm = bool_mask(2, (int[]){B, 6}, 0, 1);
    ((uint8_t *)p.kpm->data)[2] = 1;  // batch 0, key 2: query 2's only key with W = 1
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = fused_fn(tp, in, n, &p);
    ag_tensor *dy = uniform_tensor(AG_F64, 4, y->shape, 99, -1, 1);
    ag_backward_with(tp, y, dy);
    for (int head = 0; head < 2; head++)
        for (int e = 0; e < c.d; e++) {
            const size_t at = (((size_t)head * c.T) + 2) * c.d + (size_t)e;  // batch 0, query 2
            CHECK(ag_tensor_item(y, at) == 0 && ag_tensor_grad_item(in[0], at) == 0);
        }
    ag_tensor_free(dy);
    ag_tape_free(tp);
    free_problem(&p, in, n);
}

// A NaN in one query (T = 1 and h = 1 among the cases) reaches the output and every
// gradient exactly where the composition puts it, window or not, grouped or not.
static void test_a_nan_query_spreads_as_in_the_composition(void) {
    const gqa_case nan_cases[] = {
        {APART, 4, 2, 6, 8, 2, true, false, false, false, false, 2, 0},
        {INSIDE, 2, 1, 5, 5, 3, false, true, false, true, false, 3, 0},
        {APART, 1, 1, 1, 4, 2, true, false, false, false, false, 2, 3},  // T = 1, h = 1
        {INSIDE, 4, 4, 300, 300, 2, true, false, false, false, false, 40, 0},
    };
    for (size_t i = 0; i < sizeof nan_cases / sizeof nan_cases[0]; i++) {
        problem p;
        ag_tensor *in[5];
        const int n = make_inputs(&p, &nan_cases[i], 60 + (uint64_t)i, in);
        ag_tensor_set_item(in[0], in[0]->numel / 2, NAN);
        size_t na = 0, nb = 0;
        double *a = outputs_and_gradients(fused_fn, &p, in, n, &na);
        double *b = outputs_and_gradients(composed_fn, &p, in, n, &nb);
        bool same = a && b && na == nb;
        size_t nans = 0;
        normwise e = {0, 0};
        for (size_t k = 0; same && k < na; k++) {
            same = isnan(a[k]) == isnan(b[k]);
            nans += isnan(a[k]) != 0;
            if (!isnan(a[k])) normwise_add(&e, a[k], b[k]);
        }
        CHECK(same && nans > 0 && normwise_result(e) <= 1e-12);
        free(a), free(b);
        free_problem(&p, in, n);
    }
}

static void test_bad_kv_heads_are_refused_naming_the_shapes(void) {
    ag_tensor *q = ag_tensor_zeros(AG_F64, 4, (int[]){2, 4, 3, 2});
    ag_tensor *k = ag_tensor_zeros(AG_F64, 4, (int[]){2, 2, 5, 2});
    ag_tensor *q3 = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 8});
    ag_tensor *k3 = ag_tensor_zeros(AG_F64, 3, (int[]){2, 5, 4});
    ag_tensor *qkv = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 16});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_attention(tp, q, k, k, &(ag_attention_opts){.kv_heads = 3}));
    CHECK(testing_error_was("attention: opts kv_heads = 3 must divide the 4 query heads (0 "
                            "means 4); q [2,4,3,2] and k [2,2,5,2]"));
    CHECK(!ag_attention(tp, q, k, k, NULL));  // kv_heads 0 means h: k must have 4 heads
    CHECK(testing_error_was("attention: q [2,4,3,2], k [2,2,5,2] and v [2,2,5,2] must be "
                            "[B, h, T, d], [B, h, S, d] and [B, h, S, dv] with the same B, h, "
                            "d and S"));
    CHECK(!ag_attention(tp, q, k, k, &(ag_attention_opts){.kv_heads = 1}));
    CHECK(testing_error_was("attention: q [2,4,3,2], k [2,2,5,2] and v [2,2,5,2] must be "
                            "[B, h, T, d], [B, h_kv, S, d] and [B, h_kv, S, dv] with the same "
                            "B, d and S, h_kv = 1 (opts kv_heads)"));
    CHECK(ag_attention(tp, q, k, k, &(ag_attention_opts){.kv_heads = 2}) != NULL);
    CHECK(!ag_attention(tp, q3, k3, k3, &(ag_attention_opts){.heads = 4, .kv_heads = 1}));
    CHECK(testing_error_was("attention: q [2,3,8], k [2,5,4] and v [2,5,4] must be [B, T, h*d], "
                            "[B, S, h_kv*d] and [B, S, h_kv*dv] with the same B, S and d, for "
                            "h = 4 heads, h_kv = 1"));
    CHECK(ag_attention(tp, q3, k3, k3, &(ag_attention_opts){.heads = 4, .kv_heads = 2}) != NULL);
    CHECK(!ag_attention_packed(tp, qkv, &(ag_attention_opts){.heads = 4, .kv_heads = 1}));
    CHECK(testing_error_was("attention_packed: qkv [2,3,16] must be [B, T, (h + 2 h_kv) d] "
                            "with opts heads = h = 4 and kv_heads = h_kv = 1"));
    CHECK(ag_attention_packed(tp, qkv, &(ag_attention_opts){.heads = 4, .kv_heads = 2}) != NULL);
    CHECK(!ag_attention_packed(tp, qkv, &(ag_attention_opts){.heads = 4, .kv_heads = -2}));
    CHECK(testing_error_was("attention_packed: opts kv_heads = -2 must divide the 4 query "
                            "heads (0 means 4); qkv [2,3,16]"));
    CHECK(!ag_attention(tp, q, k, k, &(ag_attention_opts){.kv_heads = 2, .softmax.window = -1}));
    CHECK(testing_error_was("attention: window must be >= 0 (0: no sliding window), got -1; "
                            "q [2,4,3,2]"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {q, k, q3, k3, qkv};
    for (int i = 0; i < 5; i++) ag_tensor_free(all[i]);
}

// With heads inside the last dim, the output [B, T, h*dv] has h dv columns where v has
// h_kv dv: h = 1025 query heads over one kv head whose v is [1, 1, 2^22] (16 MB) made
// 1025 * 2^22 = 2^32 + 2^22 columns, which wrapped in int to 2^22: an output of 16 MB that
// the heads then wrote 16 GB into. Refused with one line, nothing recorded.
static void test_output_columns_past_int_max_are_refused(void) {
    ag_tensor *q = ag_tensor_zeros(AG_F32, 3, (int[]){1, 1, 1025});
    ag_tensor *k = ag_tensor_zeros(AG_F32, 3, (int[]){1, 1, 1});
    ag_tensor *v = ag_tensor_zeros(AG_F32, 3, (int[]){1, 1, 1 << 22});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_attention(tp, q, k, v, &(ag_attention_opts){.heads = 1025, .kv_heads = 1}));
    CHECK(testing_error_was("attention: the output [B, T, h*dv] of q [1,1,1025], k [1,1,1] and "
                            "v [1,1,4194304] would have 1025 x 4194304 = 4299161600 columns, "
                            "more than an extent may be (2147483647); h_kv = 1"));
    CHECK(ag_tape_num_nodes(tp) == 0);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(q), ag_tensor_free(k), ag_tensor_free(v);
}

int main(void) {
    RUN(test_grouped_attention_is_its_definition_in_every_layout);
    RUN(test_grouped_attention_passes_gradcheck);
    RUN(test_a_kv_head_gets_gradient_from_its_group_only);
    RUN(test_a_window_masks_exactly_the_keys_w_or_more_away);
    RUN(test_a_query_whose_window_is_masked_gets_zeros);
    RUN(test_a_nan_query_spreads_as_in_the_composition);
    RUN(test_bad_kv_heads_are_refused_naming_the_shapes);
    RUN(test_output_columns_past_int_max_are_refused);
    return testing_summary();
}
