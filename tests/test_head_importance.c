// Head importance: the gradient score is the mean |d loss / d mask| (checked against
// finite differences of the loss), the ablation score the loss increase when one head is
// silenced (checked against zeroing that head's columns of out_proj.weight), a dead head
// scores 0 both ways, and errors (a failing callback, bad sizes) return false.
#include "op_checks.h"

#define L 2
#define H 3

// Two self-attention layers on fixed inputs; loss = mse(output, target) per batch.
typedef struct {
    ag_params *ps;
    ag_mha mha[L];
    ag_tensor *x[2], *target[2];
    bool fail, vector;
} toy;

static void toy_init(toy *t) {
    t->ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(3, 3);
    ag_mha_config cfg = {.embed_dim = 6, .num_heads = H};
    for (int l = 0; l < L; l++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", l);
        CHECK(ag_mha_init(&t->mha[l], t->ps, name, &cfg, &rng));
        ag_tensor_init_uniform(t->mha[l].out_proj.bias, &rng, -0.5, 0.5);
    }
    for (int b = 0; b < 2; b++) {
        t->x[b] = ag_tensor_uniform(AG_F64, 3, (int[]){2, 4, 6}, &rng, -1, 1);
        t->target[b] = ag_tensor_uniform(AG_F64, 3, (int[]){2, 4, 6}, &rng, -1, 1);
    }
    t->fail = t->vector = false;
}

static void toy_free(toy *t) {
    for (int b = 0; b < 2; b++) {
        ag_tensor_free(t->x[b]);
        ag_tensor_free(t->target[b]);
    }
    ag_params_free(t->ps);
}

static ag_tensor *toy_loss(ag_tape *tp, ag_tensor *const masks[], int batch, void *user) {
    toy *t = user;
    if (t->fail) return NULL;
    ag_tensor *h = t->x[batch];
    for (int l = 0; l < L; l++) {
        ag_mha_opts o = {.causal = true, .head_mask = masks ? masks[l] : NULL};
        h = ag_mha_forward(tp, &t->mha[l], h, h, h, &o, NULL);
    }
    return t->vector ? h : ag_mse(tp, h, t->target[batch]);
}

// The mean loss over both batches with every mask 1 except masks[l][j] = v.
static double loss_with(toy *t, int l, int j, double v) {
    ag_tensor *m[L];
    for (int i = 0; i < L; i++) m[i] = ag_tensor_ones(AG_F64, 1, (int[]){H});
    ag_tensor_set_item(m[l], (size_t)j, v);
    ag_tape *tp = ag_tape_new();
    double s = 0;
    for (int b = 0; b < 2; b++) {
        ag_tape_reset(tp);
        s += ag_tensor_item(toy_loss(tp, m, b, t), 0) / 2;
    }
    ag_tape_free(tp);
    for (int i = 0; i < L; i++) ag_tensor_free(m[i]);
    return s;
}

static void test_gradient_importance_is_the_mean_absolute_mask_derivative(void) {
    toy t;
    toy_init(&t);
    double imp[L * H];
    CHECK(ag_head_importance_gradient(toy_loss, &t, AG_F64, L, H, 2, imp));
    for (int l = 0; l < L; l++)
        for (int j = 0; j < H; j++) {
            // Per batch |dL_b/dm|, averaged: finite differences batch by batch.
            double want = 0, eps = 1e-6;
            for (int b = 0; b < 2; b++) {
                ag_tensor *m[L];
                for (int i = 0; i < L; i++) m[i] = ag_tensor_ones(AG_F64, 1, (int[]){H});
                ag_tape *tp = ag_tape_new();
                ag_tensor_set_item(m[l], (size_t)j, 1 + eps);
                double up = ag_tensor_item(toy_loss(tp, m, b, &t), 0);
                ag_tensor_set_item(m[l], (size_t)j, 1 - eps);
                double down = ag_tensor_item(toy_loss(tp, m, b, &t), 0);
                want += fabs(up - down) / (2 * eps) / 2;
                ag_tape_free(tp);
                for (int i = 0; i < L; i++) ag_tensor_free(m[i]);
            }
            CHECK_NEAR(imp[l * H + j], want, 1e-7);
            CHECK(imp[l * H + j] > 0);
        }
    toy_free(&t);
}

static void test_ablation_importance_is_the_loss_increase_without_the_head(void) {
    toy t;
    toy_init(&t);
    double imp[L * H];
    CHECK(ag_head_importance_ablation(toy_loss, &t, AG_F64, L, H, 2, imp));
    double base = loss_with(&t, 0, 0, 1.0);
    for (int l = 0; l < L; l++)
        for (int j = 0; j < H; j++) {
            // Silencing by hand: head j's columns of out_proj.weight set to 0.
            ag_tensor *w = t.mha[l].out_proj.weight;
            double saved[6 * 2];
            for (int r = 0; r < 6; r++)
                for (int c = 0; c < 2; c++) {
                    size_t i = (size_t)r * 6 + (size_t)j * 2 + c;
                    saved[r * 2 + c] = ag_tensor_item(w, i);
                    ag_tensor_set_item(w, i, 0.0);
                }
            double silenced = loss_with(&t, 0, 0, 1.0);
            for (int r = 0; r < 6; r++)
                for (int c = 0; c < 2; c++)
                    ag_tensor_set_item(w, (size_t)r * 6 + (size_t)j * 2 + c, saved[r * 2 + c]);
            CHECK_NEAR(imp[l * H + j], silenced - base, 1e-13);
        }
    toy_free(&t);
}

static void test_a_dead_head_scores_zero_both_ways(void) {
    toy t;
    toy_init(&t);
    ag_tensor *w = t.mha[1].out_proj.weight;  // layer 1, head 2: its output is discarded
    for (int r = 0; r < 6; r++)
        for (int c = 4; c < 6; c++) ag_tensor_set_item(w, (size_t)r * 6 + c, 0.0);
    double g[L * H], a[L * H];
    CHECK(ag_head_importance_gradient(toy_loss, &t, AG_F64, L, H, 2, g));
    CHECK(ag_head_importance_ablation(toy_loss, &t, AG_F64, L, H, 2, a));
    CHECK(g[1 * H + 2] == 0.0);
    CHECK(a[1 * H + 2] == 0.0);
    CHECK(g[0] > 0 && g[1 * H + 1] > 0);
    toy_free(&t);
}

static void test_failures_return_false(void) {
    toy t;
    toy_init(&t);
    double imp[L * H];
    t.fail = true;
    CHECK(!ag_head_importance_gradient(toy_loss, &t, AG_F64, L, H, 2, imp));
    CHECK(!ag_head_importance_ablation(toy_loss, &t, AG_F64, L, H, 2, imp));
    t.fail = false;
    testing_catch_errors();
    CHECK(!ag_head_importance_gradient(toy_loss, &t, AG_F64, 0, H, 2, imp));
    CHECK(strcmp(testing_last_error,
                 "head_importance_gradient: layers 0 must be in [1, 64] and heads 3 >= 1") == 0);
    CHECK(!ag_head_importance_ablation(toy_loss, &t, AG_BOOL, L, H, 2, imp));
    testing_release_errors();
    toy_free(&t);
}

// A NaN loss (here a NaN input in batch 1) is a result, not a failure: both measures
// return true, and the scores it enters are NaN.
static void test_a_nan_loss_gives_nan_scores_both_ways(void) {
    toy t;
    toy_init(&t);
    ag_tensor_set_item(t.x[1], 5, NAN);
    double g[L * H], a[L * H];
    CHECK(ag_head_importance_gradient(toy_loss, &t, AG_F64, L, H, 2, g));
    CHECK(ag_head_importance_ablation(toy_loss, &t, AG_F64, L, H, 2, a));
    for (int i = 0; i < L * H; i++) CHECK(isnan(g[i]) && isnan(a[i]));
    toy_free(&t);
}

// A NaN that does not pass through the masks (a term of its own added to the loss) leaves
// their derivatives finite, but the loss is NaN: the scores it enters are NaN all the same.
static ag_tensor *loss_plus_nan(ag_tape *tp, ag_tensor *const masks[], int batch, void *user) {
    ag_tensor *loss = toy_loss(tp, masks, batch, user);
    ag_tensor *nan = ag_tape_tensor(tp, AG_F64, 0, NULL);
    ag_tensor_set_item(nan, 0, batch == 1 ? NAN : 0.0);
    return ag_add(tp, loss, nan);
}

static void test_a_nan_loss_outside_the_masks_still_gives_nan_scores(void) {
    toy t;
    toy_init(&t);
    double g[L * H], a[L * H];
    CHECK(ag_head_importance_gradient(loss_plus_nan, &t, AG_F64, L, H, 2, g));
    CHECK(ag_head_importance_ablation(loss_plus_nan, &t, AG_F64, L, H, 2, a));
    for (int i = 0; i < L * H; i++) CHECK(isnan(g[i]) && isnan(a[i]));
    toy_free(&t);
}

static void test_a_loss_of_more_than_one_value_is_one_line(void) {
    toy t;
    toy_init(&t);
    t.vector = true;
    double imp[L * H];
    testing_catch_errors();
    CHECK(!ag_head_importance_ablation(toy_loss, &t, AG_F64, L, H, 2, imp));
    CHECK(strcmp(testing_last_error, "head_importance_ablation: the loss callback returned "
                                     "[2,4,6] for batch 0; it must return one value") == 0);
    CHECK(!ag_head_importance_gradient(toy_loss, &t, AG_F64, L, H, 2, imp));
    CHECK(strstr(testing_last_error, "head_importance_gradient: the loss callback") != NULL);
    testing_release_errors();
    toy_free(&t);
}

// A loss recorded in no-grad mode has no derivative: the gradient measure says so once and
// returns false, not true with every score 0 after backward's refusal.
static ag_tensor *no_grad_loss(ag_tape *tp, ag_tensor *const masks[], int batch, void *user) {
    ag_tape_set_grad_enabled(tp, false);
    ag_tensor *loss = toy_loss(tp, masks, batch, user);
    ag_tape_set_grad_enabled(tp, true);
    return loss;
}

static void test_a_loss_without_grad_is_one_line_and_false(void) {
    toy t;
    toy_init(&t);
    double imp[L * H];
    testing_catch_errors();
    CHECK(!ag_head_importance_gradient(no_grad_loss, &t, AG_F64, L, H, 2, imp));
    CHECK(testing_error_count == 1);
    CHECK(strcmp(testing_last_error,
                 "head_importance_gradient: the loss callback returned a loss [] for batch 0 "
                 "that does not require grad (computed in no-grad mode, or from no mask or "
                 "parameter); the masks' derivatives need one") == 0);
    testing_release_errors();
    toy_free(&t);
}

// A loss recorded on a tape of the callback's own: backward refuses it (one line, its
// own), and the measure returns false rather than true with every score 0.
static ag_tape *other_tape;
static ag_tensor *loss_on_another_tape(ag_tape *tp, ag_tensor *const masks[], int batch,
                                       void *user) {
    (void)tp;
    ag_tape_reset(other_tape);
    return toy_loss(other_tape, masks, batch, user);
}

static void test_a_loss_on_another_tape_is_one_line_and_false(void) {
    toy t;
    toy_init(&t);
    other_tape = ag_tape_new();
    double imp[L * H];
    testing_catch_errors();
    CHECK(!ag_head_importance_gradient(loss_on_another_tape, &t, AG_F64, L, H, 2, imp));
    CHECK(testing_error_count == 1);
    CHECK(strcmp(testing_last_error,
                 "backward: the output [] was not recorded on this tape") == 0);
    testing_release_errors();
    ag_tape_free(other_tape);
    toy_free(&t);
}

int main(void) {
    RUN(test_gradient_importance_is_the_mean_absolute_mask_derivative);
    RUN(test_ablation_importance_is_the_loss_increase_without_the_head);
    RUN(test_a_dead_head_scores_zero_both_ways);
    RUN(test_failures_return_false);
    RUN(test_a_nan_loss_gives_nan_scores_both_ways);
    RUN(test_a_nan_loss_outside_the_masks_still_gives_nan_scores);
    RUN(test_a_loss_of_more_than_one_value_is_one_line);
    RUN(test_a_loss_without_grad_is_one_line_and_false);
    RUN(test_a_loss_on_another_tape_is_one_line_and_false);
    return testing_summary();
}
