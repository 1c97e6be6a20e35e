// Queries at an offset and keys with room to spare (ag_softmax_opts.q_offset,
// ag_attention_opts.kv_len), what a KV cache's step asks of the fused attention: n query
// rows at positions t0 .. t0 + n - 1 against the first S rows of k and v, which hold
// more (rows past S are NaN here, so reading one would show). Equal to rows t0 .. of the
// attention of all t0 + n queries, output and every gradient (a position table's
// included; rows past S get none), for every position scheme, causal and not, in both
// layouts; gradchecked in float64, fused and composed; float32 against float64; and the
// misuse is refused. One query row without grad (a decode step) equals the recorded path.
// RoPE inside at a query offset keeps tables of the T + S positions it rotates.
#include <stdlib.h>

#include "op_checks.h"

typedef struct {
    int B, h, t0, n, S, cap, d;
    ag_pos_kind kind;  // NONE, RELATIVE, T5, ALIBI, or ROPE (opts.rope)
    bool causal, inside;
} ocase;

static const ocase cases[] = {
    // B h t0 n  S  cap d  kind             causal inside
    {2, 3, 4, 3, 7, 9, 4, AG_POS_NONE, true, false},
    {2, 3, 4, 3, 7, 9, 4, AG_POS_RELATIVE, true, true},
    {1, 2, 5, 1, 6, 8, 2, AG_POS_T5, true, false},
    {2, 2, 3, 2, 5, 5, 3, AG_POS_ALIBI, false, true},
    {2, 3, 2, 4, 6, 10, 4, AG_POS_ROPE, true, true},
    {1, 1, 0, 1, 1, 3, 2, AG_POS_RELATIVE, true, false},  // T = 1, S = 1, h = 1
    {1, 2, 6, 2, 4, 6, 2, AG_POS_ALIBI, true, false},     // q_offset >= S: every key seen
    {2, 2, 250, 20, 290, 300, 2, AG_POS_T5, true, true},  // beyond a block of keys
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

// Element (b, head, row, c) of an operand of `rows` rows.
static size_t at(const ocase *c, int rows, int b, int head, int row, int col) {
    return c->inside ? ((size_t)b * rows + row) * (size_t)(c->h * c->d) + (size_t)head * c->d + col
                     : (((size_t)b * c->h + head) * rows + row) * (size_t)c->d + col;
}

static ag_tensor *operand(const ocase *c, ag_dtype dt, int rows) {
    return c->inside ? ag_tensor_zeros(dt, 3, (int[]){c->B, rows, c->h * c->d})
                     : ag_tensor_zeros(dt, 4, (int[]){c->B, c->h, rows, c->d});
}

typedef struct {
    const ocase *c;
    bool offset;    // the n rows at q_offset t0 against kv_len S; else all t0 + n rows
    bool composed;  // matmul, softmax, matmul (heads apart, no RoPE)
    int table;      // input index of the position table, or -1
} problem;

static ag_pos_bias pos_of(const ocase *c, ag_tensor *table) {
    ag_pos_bias p = {0};
    if (c->kind == AG_POS_NONE || c->kind == AG_POS_ROPE) return p;
    p.kind = c->kind;
    p.table = table;
    p.max_distance = c->kind == AG_POS_T5 ? 12 : 2;
    p.num_buckets = 6;
    p.bidirectional = !c->causal;
    p.heads = c->kind == AG_POS_ALIBI ? c->h : 0;
    return p;
}

static ag_tensor *attend(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const problem *p = user;
    const ocase *c = p->c;
    ag_attention_opts o = {.softmax = {.scale = 0.6, .causal = c->causal,
                                       .q_offset = p->offset ? c->t0 : 0,
                                       .pos = pos_of(c, p->table >= 0 ? in[p->table] : NULL)},
                           .heads = c->inside ? c->h : 0,
                           .kv_len = p->offset ? c->S : 0,
                           .rope = c->kind == AG_POS_ROPE};
    if (!p->composed) return ag_attention(tp, in[0], in[1], in[2], &o);
    ag_tensor *k = in[1], *v = in[2];
    if (p->offset) {  // the composed path reads whole tensors: the first S rows
        k = ag_slice(tp, k, 2, 0, c->S);
        v = ag_slice(tp, v, 2, 0, c->S);
    }
    ag_tensor *w = ag_softmax(tp, ag_matmul(tp, in[0], k, false, true), &o.softmax);
    return ag_matmul(tp, w, v, false, false);
}

// The inputs of both forms in float64: q of t0 + n rows and its last n; k, v of S rows and
// their copies with cap rows (NaN past S); the table. full[] and off[] get q, k, v, table.
static int make(const ocase *c, ag_tensor *full[4], ag_tensor *off[4], uint64_t seed) {
    const int T = c->t0 + c->n;
    full[0] = operand(c, AG_F64, T), off[0] = operand(c, AG_F64, c->n);
    full[1] = operand(c, AG_F64, c->S), off[1] = operand(c, AG_F64, c->cap);
    full[2] = operand(c, AG_F64, c->S), off[2] = operand(c, AG_F64, c->cap);
    ag_pcg32 rng = ag_pcg32_make(seed, 3);
    for (int b = 0; b < c->B; b++)
        for (int hd = 0; hd < c->h; hd++)
            for (int col = 0; col < c->d; col++) {
                for (int r = 0; r < T; r++) {
                    const double x = ag_pcg32_double(&rng) * 2 - 1;
                    ag_tensor_set_item(full[0], at(c, T, b, hd, r, col), x);
                    if (r >= c->t0) ag_tensor_set_item(off[0], at(c, c->n, b, hd, r - c->t0, col), x);
                }
                for (int i = 1; i < 3; i++)
                    for (int r = 0; r < c->cap; r++) {
                        const double x = ag_pcg32_double(&rng) * 2 - 1;
                        if (r < c->S) ag_tensor_set_item(full[i], at(c, c->S, b, hd, r, col), x);
                        ag_tensor_set_item(off[i], at(c, c->cap, b, hd, r, col), r < c->S ? x : NAN);
                    }
            }
    int n = 3;
    full[3] = off[3] = NULL;
    if (c->kind == AG_POS_RELATIVE || c->kind == AG_POS_T5) {
        const int cols = c->kind == AG_POS_T5 ? 6 : 5;
        full[3] = uniform_tensor(AG_F64, 2, (int[]){c->h, cols}, seed + 1, -1, 1);
        off[3] = ag_tensor_convert(full[3], AG_F64);
        n = 4;
    }
    for (int i = 0; i < n; i++) {
        ag_tensor_set_requires_grad(full[i], true);
        ag_tensor_set_requires_grad(off[i], true);
    }
    return n;
}

// Output and every gradient of the offset form against rows t0 .. of the full one.
static double offset_vs_full(const ocase *c, uint64_t seed) {
    ag_tensor *full[4], *off[4];
    const int n = make(c, full, off, seed);
    problem pf = {c, false, false, n == 4 ? 3 : -1}, po = {c, true, false, n == 4 ? 3 : -1};
    ag_tape *tf = ag_tape_new(), *to = ag_tape_new();
    ag_tensor *yf = attend(tf, full, n, &pf), *yo = attend(to, off, n, &po);
    const int T = c->t0 + c->n;
    // The upstream gradient: random on the last n rows of the full output, 0 before.
    ag_tensor *gf = operand(c, AG_F64, T), *go = operand(c, AG_F64, c->n);
    ag_pcg32 rng = ag_pcg32_make(seed + 7, 1);
    normwise e = {0, 0}, eq = {0, 0}, ek = {0, 0}, ev = {0, 0};
    for (int b = 0; b < c->B; b++)
        for (int hd = 0; hd < c->h; hd++)
            for (int r = 0; r < c->n; r++)
                for (int col = 0; col < c->d; col++) {
                    const double g = ag_pcg32_double(&rng) * 2 - 1;
                    ag_tensor_set_item(gf, at(c, T, b, hd, c->t0 + r, col), g);
                    ag_tensor_set_item(go, at(c, c->n, b, hd, r, col), g);
                    normwise_add(&e, ag_tensor_item(yo, at(c, c->n, b, hd, r, col)),
                                 ag_tensor_item(yf, at(c, T, b, hd, c->t0 + r, col)));
                }
    ag_backward_with(tf, yf, gf);
    ag_backward_with(to, yo, go);
    for (int b = 0; b < c->B; b++)
        for (int hd = 0; hd < c->h; hd++)
            for (int col = 0; col < c->d; col++) {
                for (int r = 0; r < c->n; r++)
                    normwise_add(&eq, ag_tensor_grad_item(off[0], at(c, c->n, b, hd, r, col)),
                                 ag_tensor_grad_item(full[0], at(c, T, b, hd, c->t0 + r, col)));
                for (int r = 0; r < c->cap; r++) {
                    const double want_k = r < c->S ? ag_tensor_grad_item(full[1], at(c, c->S, b, hd, r, col)) : 0;
                    const double want_v = r < c->S ? ag_tensor_grad_item(full[2], at(c, c->S, b, hd, r, col)) : 0;
                    normwise_add(&ek, ag_tensor_grad_item(off[1], at(c, c->cap, b, hd, r, col)), want_k);
                    normwise_add(&ev, ag_tensor_grad_item(off[2], at(c, c->cap, b, hd, r, col)), want_v);
                }
            }
    double worst = fmax(normwise_result(e), fmax(normwise_result(eq),
                        fmax(normwise_result(ek), normwise_result(ev))));
    if (n == 4) worst = fmax(worst, normwise_error(off[3], full[3], true));
    ag_tape_free(tf), ag_tape_free(to);
    ag_tensor_free(gf), ag_tensor_free(go);
    for (int i = 0; i < n; i++) ag_tensor_free(full[i]), ag_tensor_free(off[i]);
    return worst;
}

static void test_offset_rows_equal_the_rows_of_the_full_attention(void) {
    for (int i = 0; i < N_CASES; i++) {
        const double err = offset_vs_full(&cases[i], 10 + (uint64_t)i);
        if (!(err <= 1e-13)) fprintf(stderr, "  case %d: %.3g\n", i, err);
        CHECK(err <= 1e-13);
    }
}

// Gradcheck needs finite inputs: the rows past S hold values here (still unread).
static int finite_inputs(const ocase *c, ag_tensor *in[4], uint64_t seed) {
    ag_tensor *full[4];
    const int n = make(c, full, in, seed);
    for (int i = 0; i < n; i++) ag_tensor_free(full[i]);
    for (int i = 1; i < 3; i++)
        for (size_t e = 0; e < in[i]->numel; e++)
            if (isnan(ag_tensor_item(in[i], e))) ag_tensor_set_item(in[i], e, 0.25);
    return n;
}

static void test_gradcheck_fused_and_composed_at_an_offset(void) {
    for (int i = 0; i < N_CASES - 1; i++) {  // the long case is for the blocks, above
        const ocase *c = &cases[i];
        for (int composed = 0; composed < 2; composed++) {
            if (composed && (c->inside || c->kind == AG_POS_ROPE)) continue;
            ag_tensor *in[4];
            const int n = finite_inputs(c, in, 30 + (uint64_t)i);
            problem p = {c, true, composed, n == 4 ? 3 : -1};
            const bool ok = ag_gradcheck(attend, in, n, &p, NULL, NULL);
            if (!ok) fprintf(stderr, "  case %d composed %d\n", i, composed);
            CHECK(ok);
            for (int k = 0; k < n; k++) ag_tensor_free(in[k]);
        }
    }
}

static void test_float32_at_an_offset_matches_float64(void) {
    for (int i = 0; i < N_CASES; i++) {
        const ocase *c = &cases[i];
        ag_tensor *in[4];
        const int n = finite_inputs(c, in, 50 + (uint64_t)i);
        problem p = {c, true, false, n == 4 ? 3 : -1};
        CHECK(f32_vs_f64_error(attend, in, n, &p) < 1e-5);
        for (int k = 0; k < n; k++) ag_tensor_free(in[k]);
    }
}

static void test_misuse_is_one_line(void) {
    ag_tensor *q = uniform_tensor(AG_F64, 4, (int[]){1, 2, 3, 4}, 1, -1, 1);
    ag_tensor *k = uniform_tensor(AG_F64, 4, (int[]){1, 2, 5, 4}, 2, -1, 1);
    ag_tensor *qkv = uniform_tensor(AG_F64, 3, (int[]){1, 3, 24}, 3, -1, 1);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_attention(tp, q, k, k, &(ag_attention_opts){.kv_len = 6}));
    CHECK(strcmp(testing_last_error,
                 "attention: kv_len 6 must be in [0, 5] (0: all the rows of k [1,2,5,4])") == 0);
    CHECK(!ag_attention(tp, q, k, k, &(ag_attention_opts){.softmax = {.q_offset = -1}}));
    CHECK(strcmp(testing_last_error,
                 "attention: q_offset must be >= 0, got -1; q [1,2,3,4]") == 0);
    CHECK(!ag_attention_packed(tp, qkv, &(ag_attention_opts){.heads = 2, .kv_len = 2}));
    CHECK(strcmp(testing_last_error, "attention_packed: kv_len 2: the keys are the T = 3 rows "
                                     "of qkv [1,3,24] (give 0)") == 0);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(q), ag_tensor_free(k), ag_tensor_free(qkv);
}

// ---- One query row without grad: the decode step's path ---------------------------------
// A step of decoding attends one query a slice against the cached keys, grad disabled: the
// op then takes its products as dot products on k and v in place. It must give what the
// recorded path (the tile or BLAS products) gives, in float64 to 1e-12, for everything a
// cache step can ask: each position scheme, the masks, grouped-query heads, a window,
// causal or not, both layouts; a fully masked row stays zeros and a NaN stays a NaN.
typedef struct {
    int B, h, kvh, S, cap, d, q_offset, window;
    ag_pos_kind kind;  // NONE, RELATIVE, T5, ALIBI, SINUSOIDAL, or ROPE (opts.rope)
    bool causal, inside;
    bool mask, additive, kpm;  // a bool mask [1, S], an additive one [B, h, 1, S], key padding
    bool all_masked;           // key padding masks every key of sequence 0
    bool nan_key;              // key 1 of sequence 0, kv head 0, holds a NaN
} rcase;

static const rcase row_cases[] = {
    // B h kvh S cap d  q_off win kind            causal inside mask  add   kpm   all   nan
    {2, 3, 3, 7, 9, 4, 6, 0, AG_POS_NONE, true, false, false, false, false, false, false},
    {2, 4, 2, 9, 9, 20, 8, 0, AG_POS_RELATIVE, true, true, true, false, false, false, false},
    {1, 2, 1, 12, 14, 5, 11, 0, AG_POS_T5, true, false, false, true, false, false, false},
    {2, 2, 2, 6, 8, 3, 2, 0, AG_POS_ALIBI, false, true, false, false, true, false, false},
    {2, 4, 4, 10, 10, 8, 9, 0, AG_POS_SINUSOIDAL, true, false, false, false, false, false, false},
    {2, 2, 1, 8, 11, 6, 7, 0, AG_POS_ROPE, true, true, true, true, true, false, false},
    {1, 1, 1, 1, 3, 2, 0, 0, AG_POS_NONE, true, false, false, false, false, false, false},  // S = 1, h = 1
    {2, 3, 3, 40, 40, 33, 39, 5, AG_POS_RELATIVE, true, true, false, false, false, false, false},
    {1, 2, 2, 30, 32, 16, 12, 4, AG_POS_ALIBI, false, false, true, false, false, false, false},
    {2, 2, 2, 70, 70, 17, 69, 0, AG_POS_T5, true, false, false, true, false, false, false},
    {2, 2, 1, 5, 5, 4, 4, 0, AG_POS_NONE, true, true, false, false, true, true, false},
    {2, 2, 2, 5, 6, 4, 4, 0, AG_POS_NONE, true, false, false, false, false, false, true},
};
#define N_ROW_CASES (int)(sizeof row_cases / sizeof row_cases[0])

typedef struct {
    const rcase *c;
    ag_tensor *table, *mask, *additive, *kpm;
} row_problem;

static ag_tensor *attend_row(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const row_problem *p = user;
    const rcase *c = p->c;
    ag_pos_bias pos = {0};
    if (c->kind != AG_POS_NONE && c->kind != AG_POS_ROPE) {
        pos.kind = c->kind;
        pos.table = p->table;
        pos.max_distance = c->kind == AG_POS_T5 ? 12 : 2;
        pos.num_buckets = 6;
        pos.bidirectional = !c->causal;
        pos.heads = c->kind == AG_POS_ALIBI || c->kind == AG_POS_SINUSOIDAL ? c->h : 0;
        pos.dims = c->kind == AG_POS_SINUSOIDAL ? 8 : 0;
    }
    ag_attention_opts o = {.softmax = {.scale = 0.7, .causal = c->causal,
                                       .q_offset = c->q_offset, .window = c->window,
                                       .mask = p->mask, .additive_mask = p->additive,
                                       .key_padding_mask = p->kpm, .pos = pos},
                           .heads = c->inside ? c->h : 0,
                           .kv_heads = c->kvh,
                           .kv_len = c->S,
                           .rope = c->kind == AG_POS_ROPE};
    return ag_attention(tp, in[0], in[1], in[2], &o);
}

// q, k, v of case c in dtype dt (rows of k and v past S are NaN: never read), and the
// masks and table in p.
static void make_row(const rcase *c, ag_dtype dt, ag_tensor *in[3], row_problem *p,
                     uint64_t seed) {
    const int B = c->B, h = c->h, kvh = c->kvh, d = c->d;
    in[0] = c->inside ? uniform_tensor(dt, 3, (int[]){B, 1, h * d}, seed, -1, 1)
                      : uniform_tensor(dt, 4, (int[]){B, h, 1, d}, seed, -1, 1);
    for (int i = 1; i < 3; i++) {
        in[i] = c->inside ? uniform_tensor(dt, 3, (int[]){B, c->cap, kvh * d}, seed + i, -1, 1)
                          : uniform_tensor(dt, 4, (int[]){B, kvh, c->cap, d}, seed + i, -1, 1);
        for (int b = 0; b < B; b++)
            for (int hd = 0; hd < kvh; hd++)
                for (int r = 0; r < c->cap; r++)
                    for (int col = 0; col < d; col++) {
                        const size_t e = c->inside
                            ? ((size_t)b * c->cap + r) * (size_t)(kvh * d) + (size_t)hd * d + col
                            : (((size_t)b * kvh + hd) * c->cap + r) * (size_t)d + col;
                        if (r >= c->S || (c->nan_key && i == 1 && b == 0 && hd == 0 && r == 1))
                            ag_tensor_set_item(in[i], e, NAN);
                    }
    }
    memset(p, 0, sizeof *p);
    p->c = c;
    if (c->kind == AG_POS_RELATIVE || c->kind == AG_POS_T5)
        p->table = uniform_tensor(dt, 2, (int[]){h, c->kind == AG_POS_T5 ? 6 : 5}, seed + 3, -1, 1);
    if (c->mask) p->mask = bool_mask(2, (int[]){1, c->S}, 0.3, seed + 4);
    if (c->additive) p->additive = uniform_tensor(dt, 4, (int[]){B, h, 1, c->S}, seed + 5, -2, 2);
    if (c->kpm || c->all_masked) {
        p->kpm = bool_mask(2, (int[]){B, c->S}, 0.3, seed + 6);
        if (c->all_masked) memset(p->kpm->data, 1, (size_t)c->S);  // sequence 0: all padding
    }
}

// Case c run both ways: grad disabled (the one-row path) and recorded (q requires grad).
typedef struct {
    ag_tape *tr, *tg;
    ag_tensor *in[3], *row, *recorded;
    row_problem p;
} row_run;

static row_run run_both(const rcase *c, ag_dtype dt, uint64_t seed) {
    row_run r;
    r.tr = ag_tape_new(), r.tg = ag_tape_new();
    make_row(c, dt, r.in, &r.p, seed);
    ag_tape_set_grad_enabled(r.tr, false);
    r.row = attend_row(r.tr, r.in, 3, &r.p);
    ag_tensor_set_requires_grad(r.in[0], true);
    r.recorded = attend_row(r.tg, r.in, 3, &r.p);
    return r;
}

static void free_run(row_run *r) {
    for (int i = 0; i < 3; i++) ag_tensor_free(r->in[i]);
    ag_tensor_free(r->p.table), ag_tensor_free(r->p.mask), ag_tensor_free(r->p.additive);
    ag_tensor_free(r->p.kpm);
    ag_tape_free(r->tr), ag_tape_free(r->tg);
}

// Largest difference, relative to 1 + |recorded|; NaN where exactly one of the two is.
static double row_vs_recorded(const ag_tensor *a, const ag_tensor *b) {
    if (!a || !b) return NAN;
    double worst = 0;
    for (size_t e = 0; e < a->numel; e++) {
        const double x = ag_tensor_item(a, e), y = ag_tensor_item(b, e);
        if (isnan(x) || isnan(y)) {
            if (isnan(x) != isnan(y)) return NAN;
            continue;
        }
        worst = fmax(worst, fabs(x - y) / (1 + fabs(y)));
    }
    return worst;
}

static bool every_case_within(ag_dtype dt, double tol) {
    bool ok = true;
    for (int i = 0; i < N_ROW_CASES; i++) {
        row_run r = run_both(&row_cases[i], dt, 70 + (uint64_t)i);
        const double err = row_vs_recorded(r.row, r.recorded);
        if (!(err <= tol)) fprintf(stderr, "  case %d: %.3g\n", i, err), ok = false;
        free_run(&r);
    }
    return ok;
}

static void test_one_row_without_grad_equals_the_recorded_attention(void) {
    CHECK(every_case_within(AG_F64, 1e-12));
}

static void test_one_row_in_float32_matches_the_recorded_attention(void) {
    CHECK(every_case_within(AG_F32, 1e-6));
}

// Sequence 0's keys all padding: its rows are exactly 0 (as ag_softmax's fully masked
// row), sequence 1's are not.
static void test_one_row_fully_masked_is_zeros(void) {
    const rcase *c = &row_cases[10];
    row_run r = run_both(c, AG_F64, 5);
    const size_t per_seq = r.row->numel / (size_t)c->B;
    bool zeros = true, others = false;
    for (size_t e = 0; e < r.row->numel; e++) {
        if (e < per_seq) zeros &= ag_tensor_item(r.row, e) == 0;
        else others |= ag_tensor_item(r.row, e) != 0;
    }
    CHECK(zeros && others);
    free_run(&r);
}

// A NaN in a key of sequence 0, kv head 0: that head's output row is NaN (every element),
// every other row finite.
static void test_one_row_nan_key_gives_a_nan_row(void) {
    const rcase *c = &row_cases[11];
    row_run r = run_both(c, AG_F64, 6);
    bool as_said = true;  // heads apart: [B, h, 1, d], head 0 of sequence 0 first
    for (size_t e = 0; e < r.row->numel; e++)
        as_said &= isnan(ag_tensor_item(r.row, e)) == (e < (size_t)c->d);
    CHECK(as_said);
    free_run(&r);
}

// ---- RoPE inside at a query offset --------------------------------------------------------
// opts.rope rotates query i at position pos_offset + q_offset + i and key j at pos_offset
// + j. Its cos and sin tables cover those positions only: a table from position 0 up to
// q_offset + T (as it was) made a decode step with one query at q_offset 2^22 build and
// keep 2^22 rows, 128 MiB of tape and a second of cos and sin for two keys. The result is
// the composition ag_rope(q, at pos_offset + q_offset), ag_rope(k, at pos_offset), then
// attention, output and gradients, for queries past the keys, straddling their end, and
// within them.
typedef struct {
    ag_tensor *q, *k, *v;
    int q_offset;
    bool composed;
} rope_offset_case;

static double *rope_at_offset(const rope_offset_case *c, size_t *bytes_peak, size_t *n) {
    ag_tensor *in[3] = {c->q, c->k, c->v};
    for (int i = 0; i < 3; i++) ag_tensor_zero_grad(in[i]);
    ag_tape *tp = ag_tape_new();
    ag_attention_opts o = {.softmax = {.scale = 0.5, .causal = true, .q_offset = c->q_offset},
                           .rope = !c->composed, .rope_opts = {.pos_offset = 3}};
    ag_tensor *q = c->q, *k = c->k;
    if (c->composed) {
        q = ag_rope(tp, q, &(ag_rope_opts){.pos_offset = 3 + c->q_offset});
        k = ag_rope(tp, k, &(ag_rope_opts){.pos_offset = 3});
    }
    ag_tensor *y = ag_attention(tp, q, k, c->v, &o);
    CHECK(y != NULL);
    *bytes_peak = ag_tape_usage(tp).bytes_peak;
    if (!y) {
        ag_tape_free(tp);
        return NULL;
    }
    ag_tensor *dy = uniform_tensor(AG_F64, 4, y->shape, 8, -1, 1);
    ag_backward_with(tp, y, dy);
    *n = y->numel + c->q->numel + c->k->numel + c->v->numel;
    double *v = malloc(*n * sizeof *v), *at = v;
    for (size_t e = 0; e < y->numel; e++) *at++ = ag_tensor_item(y, e);
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < in[i]->numel; e++) *at++ = ag_tensor_grad_item(in[i], e);
    ag_tensor_free(dy);
    ag_tape_free(tp);
    return v;
}

static void test_rope_at_a_query_offset_keeps_tables_of_t_and_s(void) {
    const struct {
        int T, S, q_offset;
    } cases[] = {{1, 2, 1 << 22}, {3, 4, 3}, {3, 3, 2}, {2, 5, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int T = cases[i].T, S = cases[i].S;
        rope_offset_case c = {random_leaf(AG_F64, 4, (int[]){2, 2, T, 4}, 40 + i),
                              random_leaf(AG_F64, 4, (int[]){2, 2, S, 4}, 50 + i),
                              random_leaf(AG_F64, 4, (int[]){2, 2, S, 3}, 60 + i),
                              cases[i].q_offset, false};
        size_t peak, n0 = 0, n1 = 0, composed_peak;
        double *fused = rope_at_offset(&c, &peak, &n0);
        c.composed = true;
        double *composed = rope_at_offset(&c, &composed_peak, &n1);
        normwise e = {0, 0};
        for (size_t j = 0; fused && composed && n0 == n1 && j < n0; j++)
            normwise_add(&e, fused[j], composed[j]);
        const double err = fused && composed && n0 == n1 ? normwise_result(e) : INFINITY;
        if (!(err <= 1e-12 && peak < (1u << 20)))
            fprintf(stderr, "  T %d S %d q_offset %d: error %.3g, tape peak %zu bytes\n", T, S,
                    c.q_offset, err, peak);
        CHECK(err <= 1e-12);
        CHECK(peak < (1u << 20));  // the inputs are 1.2 KiB; a table to 2^22, 128 MiB
        free(fused), free(composed);
        ag_tensor_free(c.q), ag_tensor_free(c.k), ag_tensor_free(c.v);
    }
}

int main(void) {
    RUN(test_offset_rows_equal_the_rows_of_the_full_attention);
    RUN(test_gradcheck_fused_and_composed_at_an_offset);
    RUN(test_float32_at_an_offset_matches_float64);
    RUN(test_misuse_is_one_line);
    RUN(test_one_row_without_grad_equals_the_recorded_attention);
    RUN(test_one_row_in_float32_matches_the_recorded_attention);
    RUN(test_one_row_fully_masked_is_zeros);
    RUN(test_one_row_nan_key_gives_a_nan_row);
    RUN(test_rope_at_a_query_offset_keeps_tables_of_t_and_s);
    return testing_summary();
}
