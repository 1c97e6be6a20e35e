// The fused attention keeps its masked scores from forward for backward when they fit
// its budget, and makes them again from q and k with opts recompute_scores (or above the
// budget). The two paths are one computation: the same output and the same gradients,
// bit for bit, in float32 and float64, on 1 and 2 threads, in every layout, with masks
// (a fully masked row included), a position bias, RoPE, grouped-query heads, a sliding
// window, dropout, several blocks of keys, T = 1, and NaN inputs. Both paths pass the
// float64 gradient check, and a repeated step on either allocates nothing.
#include <stdlib.h>

#include "op_checks.h"

typedef enum { APART, INSIDE, PACKED } layout;

typedef struct {
    const char *name;
    int B, h, kvh, T, S, d;
    layout lay;
    bool causal;
    int window;
    bool add_mask;   // an additive [T, S] mask requiring grad (shared by every slice)
    bool bool_mask;  // a boolean [T, S] mask
    bool pad;        // every key of batch 1 padding: its queries are fully masked
    ag_pos_kind pos;  // NONE, RELATIVE (a table requiring grad), ALIBI, or ROPE
    double dropout;
    bool nan_q;       // a NaN in one query row
} kcase;

static const kcase cases[] = {
    {"plain, heads apart", 2, 3, 3, 5, 7, 4, APART, false, 0, false, false, false,
     AG_POS_NONE, 0, false},
    {"causal, heads inside", 2, 2, 2, 6, 6, 3, INSIDE, true, 0, false, false, false,
     AG_POS_NONE, 0, false},
    {"packed, masks, a padded batch", 2, 2, 2, 5, 5, 4, PACKED, false, 0, true, true, true,
     AG_POS_NONE, 0, false},
    {"relative position table, window", 1, 2, 2, 9, 9, 2, INSIDE, true, 3, false, false,
     false, AG_POS_RELATIVE, 0, false},
    {"rope, grouped-query heads", 2, 4, 2, 5, 6, 4, APART, true, 0, false, false, false,
     AG_POS_ROPE, 0, false},
    {"alibi, dropout", 2, 2, 2, 6, 6, 2, INSIDE, false, 0, false, false, false,
     AG_POS_ALIBI, 0.3, false},
    {"T = 1", 2, 2, 1, 1, 1, 3, PACKED, true, 0, false, false, false, AG_POS_NONE, 0,
     false},
    {"several blocks of keys and queries, window", 1, 1, 1, 300, 300, 2, PACKED, true, 40,
     true, false, false, AG_POS_NONE, 0, false},
    {"several blocks, a NaN query", 1, 2, 2, 280, 280, 2, INSIDE, true, 0, false, false,
     false, AG_POS_NONE, 0, true},
    {"a NaN query beside a fully masked batch", 2, 2, 2, 4, 4, 3, PACKED, false, 0, false,
     true, true, AG_POS_NONE, 0, true},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

// The inputs of a case, as ag_attention (or ag_attention_packed) takes them: q, k, v (or
// qkv alone), then the tensors opts refer to.
typedef struct {
    ag_tensor *x[3], *add, *mask, *kpm, *table;
    int nx;
} inputs;

static ag_tensor *operand(const kcase *c, ag_dtype dt, int heads, int rows, uint64_t seed) {
    if (c->lay == APART) return random_leaf(dt, 4, (int[]){c->B, heads, rows, c->d}, seed);
    return random_leaf(dt, 3, (int[]){c->B, rows, heads * c->d}, seed);
}

static inputs make_inputs(const kcase *c, ag_dtype dt) {
    inputs in;
    memset(&in, 0, sizeof in);
    if (c->lay == PACKED) {
        in.x[0] = random_leaf(dt, 3, (int[]){c->B, c->T, (c->h + 2 * c->kvh) * c->d}, 1);
        in.nx = 1;
    } else {
        in.x[0] = operand(c, dt, c->h, c->T, 1);
        in.x[1] = operand(c, dt, c->kvh, c->S, 2);
        in.x[2] = operand(c, dt, c->kvh, c->S, 3);
        in.nx = 3;
    }
    if (c->nan_q) {  // query 1 of batch 0, head 0, element 0
        const size_t at = c->lay == APART ? (size_t)c->d : (size_t)in.x[0]->shape[2];
        ag_tensor_set_item(in.x[0], at, NAN);
    }
    if (c->add_mask) in.add = random_leaf(dt, 2, (int[]){c->T, c->S}, 4);
    if (c->bool_mask) in.mask = bool_mask(2, (int[]){c->T, c->S}, 0.3, 5);
    if (c->pad) {
        in.kpm = ag_tensor_zeros(AG_BOOL, 2, (int[]){c->B, c->S});
        for (int j = 0; j < c->S; j++) ((uint8_t *)in.kpm->data)[c->S + j] = 1;
    }
    if (c->pos == AG_POS_RELATIVE) in.table = random_leaf(dt, 2, (int[]){c->h, 2 * 3 + 1}, 6);
    return in;
}

static void free_inputs(inputs *in) {
    for (int i = 0; i < in->nx; i++) ag_tensor_free(in->x[i]);
    ag_tensor_free(in->add);
    ag_tensor_free(in->mask);
    ag_tensor_free(in->kpm);
    ag_tensor_free(in->table);
}

static ag_attention_opts opts_of(const kcase *c, const inputs *in, bool recompute) {
    ag_attention_opts o = {
        .softmax = {.scale = 0.7, .causal = c->causal, .window = c->window,
                    .mask = in->mask, .additive_mask = in->add, .key_padding_mask = in->kpm},
        .dropout = c->dropout, .training = c->dropout > 0, .seed = 11, .site = 3,
        .heads = c->lay == APART ? 0 : c->h, .kv_heads = c->kvh,
        .rope = c->pos == AG_POS_ROPE, .recompute_scores = recompute};
    if (c->pos == AG_POS_RELATIVE)
        o.softmax.pos = (ag_pos_bias){.kind = AG_POS_RELATIVE, .table = in->table,
                                      .max_distance = 3};
    if (c->pos == AG_POS_ALIBI)
        o.softmax.pos = (ag_pos_bias){.kind = AG_POS_ALIBI, .heads = c->h,
                                      .bidirectional = !c->causal};
    return o;
}

static ag_tensor *attend(ag_tape *tp, const kcase *c, const inputs *in, bool recompute) {
    const ag_attention_opts o = opts_of(c, in, recompute);
    return c->lay == PACKED ? ag_attention_packed(tp, in->x[0], &o)
                            : ag_attention(tp, in->x[0], in->x[1], in->x[2], &o);
}

// Appends the bytes of n reals at p to *buf.
static void append(unsigned char **buf, size_t *len, const void *p, size_t bytes) {
    *buf = realloc(*buf, *len + bytes);
    memcpy(*buf + *len, p, bytes);
    *len += bytes;
}

// Forward and backward of case c (upstream gradient uniform from seed 7); returns the
// bytes of the output and of every gradient, one after another.
static unsigned char *run(const kcase *c, ag_dtype dt, bool recompute, int threads,
                          size_t *len) {
    ag_threads_set(threads);
    inputs in = make_inputs(c, dt);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = attend(tp, c, &in, recompute);
    unsigned char *buf = NULL;
    *len = 0;
    if (y) {
        ag_tensor *dy = uniform_tensor(dt, y->ndim, y->shape, 7, -1, 1);
        ag_backward_with(tp, y, dy);
        const size_t es = dt == AG_F64 ? sizeof(double) : sizeof(float);
        append(&buf, len, y->data, y->numel * es);
        ag_tensor *grads[] = {in.x[0], in.x[1], in.x[2], in.add, in.table};
        for (int i = 0; i < 5; i++)
            if (grads[i]) append(&buf, len, grads[i]->grad, grads[i]->numel * es);
        ag_tensor_free(dy);
    }
    ag_tape_free(tp);
    free_inputs(&in);
    ag_threads_set(1);
    return buf;
}

static void kept_scores_give_the_bits_of_recomputed_ones(void) {
    for (int i = 0; i < N_CASES; i++)
        for (int t = 0; t < 2; t++)
            for (int threads = 1; threads <= 2; threads++) {
                const ag_dtype dt = t ? AG_F64 : AG_F32;
                size_t n_kept, n_again;
                unsigned char *kept = run(&cases[i], dt, false, threads, &n_kept);
                unsigned char *again = run(&cases[i], dt, true, threads, &n_again);
                const bool same = kept && again && n_kept == n_again &&
                                  memcmp(kept, again, n_kept) == 0;
                if (!same)
                    fprintf(stderr, "  %s, %s, %d thread(s): kept and recomputed differ\n",
                            cases[i].name, t ? "f64" : "f32", threads);
                CHECK(same);
                free(kept);
                free(again);
            }
}

// The kept path is the one taken by default: its forward holds at least the B h T S
// scores more tape memory than with recompute_scores.
static void forward_keeps_the_scores_unless_told_to_recompute(void) {
    const kcase *c = &cases[7];
    size_t used[2];
    for (int recompute = 0; recompute <= 1; recompute++) {
        inputs in = make_inputs(c, AG_F32);
        ag_tape *tp = ag_tape_new();
        CHECK(attend(tp, c, &in, recompute) != NULL);
        used[recompute] = ag_tape_usage(tp).bytes_used;
        ag_tape_free(tp);
        free_inputs(&in);
    }
    CHECK(used[0] >= used[1] + (size_t)c->B * c->h * c->T * c->S * sizeof(float));
}

// NaN stays NaN on the kept path: the NaN query's output row and the gradients it
// reaches are NaN, the other rows of its slice finite.
static void a_nan_query_gives_nan_on_the_kept_path(void) {
    const kcase *c = &cases[N_CASES - 1];
    inputs in = make_inputs(c, AG_F32);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = attend(tp, c, &in, false);
    CHECK(y != NULL);
    if (y) {
        const int E = c->h * c->d;
        CHECK(isnan(ag_tensor_item(y, (size_t)E)));     // batch 0, query 1, head 0
        CHECK(!isnan(ag_tensor_item(y, 0)));            // batch 0, query 0
        CHECK(ag_tensor_item(y, (size_t)c->T * E) == 0);  // batch 1: fully masked
        ag_tensor *dy = uniform_tensor(AG_F32, 3, y->shape, 7, -1, 1);
        ag_backward_with(tp, y, dy);
        bool nan = false;
        for (size_t e = 0; e < in.x[0]->numel; e++) nan |= isnan(((float *)in.x[0]->grad)[e]);
        CHECK(nan);
        ag_tensor_free(dy);
    }
    ag_tape_free(tp);
    free_inputs(&in);
}

typedef struct {
    const kcase *c;
    bool recompute;
    inputs in;  // x, add and table are replaced by the checked inputs
} gc_user;

static ag_tensor *gc_fn(ag_tape *tp, ag_tensor *const x[], int n, void *user) {
    const gc_user *u = user;
    inputs in = u->in;
    int at = 0;
    for (int i = 0; i < in.nx; i++) in.x[i] = x[at++];
    if (in.add) in.add = x[at++];
    if (in.table) in.table = x[at++];
    (void)n;
    return attend(tp, u->c, &in, u->recompute);
}

// Float64 gradient checks of both paths: masks with a padded batch (packed), a position
// table with a window, RoPE with grouped-query heads.
static void both_paths_pass_the_float64_gradient_check(void) {
    const int which[] = {2, 3, 4};
    for (int w = 0; w < 3; w++)
        for (int recompute = 0; recompute <= 1; recompute++) {
            const kcase *c = &cases[which[w]];
            gc_user u = {c, recompute, make_inputs(c, AG_F64)};
            ag_tensor *x[5];
            int n = 0;
            for (int i = 0; i < u.in.nx; i++) x[n++] = u.in.x[i];
            if (u.in.add) x[n++] = u.in.add;
            if (u.in.table) x[n++] = u.in.table;
            ag_gradcheck_result res;
            const bool ok = ag_gradcheck(gc_fn, x, n, &u, NULL, &res);
            if (!ok) fprintf(stderr, "  %s (recompute %d): %s\n", c->name, recompute, res.report);
            CHECK(ok);
            free_inputs(&u.in);
        }
}

static inputs step_inputs;
static void kept_step(ag_tape *tp, int step, void *user) {
    (void)step;
    const bool *recompute = user;
    ag_tensor *y = attend(tp, &cases[2], &step_inputs, *recompute);
    ag_backward(tp, ag_sum(tp, y));
}

static void a_repeated_step_allocates_nothing_on_either_path(void) {
    step_inputs = make_inputs(&cases[2], AG_F32);
    for (int recompute = 0; recompute <= 1; recompute++) {
        bool r = recompute;
        CHECK(repeated_step_allocates_nothing(kept_step, &r));
    }
    free_inputs(&step_inputs);
}

int main(void) {
    RUN(forward_keeps_the_scores_unless_told_to_recompute);
    RUN(kept_scores_give_the_bits_of_recomputed_ones);
    RUN(a_nan_query_gives_nan_on_the_kept_path);
    RUN(both_paths_pass_the_float64_gradient_check);
    RUN(a_repeated_step_allocates_nothing_on_either_path);
    return testing_summary();
}
