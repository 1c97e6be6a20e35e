// ag_data_parallel_step: a step split over threads by the batch gives the gradients and
// the loss of the whole batch, bit for bit the plain step on one thread, the same bits
// every run for a thread count, and allocates nothing once it has run.
#include <float.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "model.h"  // examples/copy_task: the demo's model
#include "testing.h"

enum { B = 12, T = 8, V = 7 };

typedef struct {
    model net;
    int32_t ids[B * T], targets[B * T];
} batch;

static void batch_init(batch *b, ag_dtype dt) {
    model_config cfg = {.vocab = V, .d_model = 16, .heads = 2, .layers = 2, .max_len = T};
    CHECK(model_init(&b->net, &cfg, dt, 5));
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    for (int i = 0; i < B * T; i++) {
        b->ids[i] = (int32_t)ag_pcg32_bounded(&rng, V);
        // Ignored positions differ from sequence to sequence, so that slices count
        // different numbers of targets.
        b->targets[i] = ag_pcg32_bounded(&rng, 3) == 0 ? AG_IGNORE_INDEX
                                                        : (int32_t)ag_pcg32_bounded(&rng, V);
    }
}

static int counted(const batch *b, int begin, int end) {
    int c = 0;
    for (int i = begin * T; i < end * T; i++) c += b->targets[i] != AG_IGNORE_INDEX;
    return c;
}

static ag_tensor *loss_of(ag_tape *tp, int begin, int end, void *user, double *weight) {
    batch *b = user;
    model_input in = {.B = end - begin, .T = T, .ids = b->ids + begin * T};
    ag_tensor *logits = model_forward(tp, &b->net, &in, NULL);
    *weight = counted(b, begin, end);
    return ag_cross_entropy(tp, logits, b->targets + begin * T, (size_t)(end - begin) * T,
                            AG_IGNORE_INDEX);
}

// The plain step over the whole batch: its loss, and the gradients in the store.
static double plain_step(batch *b, ag_tape *tp) {
    ag_tape_reset(tp);
    ag_params_zero_grad(b->net.ps);
    double w;
    ag_tensor *loss = loss_of(tp, 0, B, b, &w);
    ag_backward(tp, loss);
    return ag_tensor_item(loss, 0);
}

static void *grad_copy(const batch *b) {
    size_t bytes = ag_params_buffer_len(b->net.ps) * ag_dtype_size(ag_params_dtype(b->net.ps));
    void *g = malloc(bytes);
    memcpy(g, ag_params_grad(b->net.ps), bytes);
    return g;
}

static double max_diff(const batch *b, const void *g1, const void *g2) {
    double worst = 0;
    for (size_t i = 0; i < ag_params_buffer_len(b->net.ps); i++) {
        double x = ag_params_dtype(b->net.ps) == AG_F64 ? ((const double *)g1)[i]
                                                        : ((const float *)g1)[i];
        double y = ag_params_dtype(b->net.ps) == AG_F64 ? ((const double *)g2)[i]
                                                        : ((const float *)g2)[i];
        worst = fmax(worst, fabs(x - y));
    }
    return worst;
}

static void test_one_thread_is_the_plain_step(void) {
    static batch b;
    batch_init(&b, AG_F32);
    ag_tape *tp = ag_tape_new();
    ag_threads_set(1);
    double plain = plain_step(&b, tp);
    void *g = grad_copy(&b);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    ag_params_zero_grad(b.net.ps);
    double split = ag_data_parallel_step(dp, B, loss_of, &b);
    CHECK(split == plain);
    CHECK(memcmp(g, ag_params_grad(b.net.ps),
                 ag_params_buffer_len(b.net.ps) * sizeof(float)) == 0);
    free(g);
    ag_data_parallel_free(dp);
    ag_tape_free(tp);
    model_free(&b.net);
}

// The plain step's loss and gradients on a batch, and a data_parallel to compare with it.
typedef struct {
    ag_tape *tp;
    double loss;
    void *grad;
    ag_data_parallel *dp;
} whole_batch;

static whole_batch whole_batch_make(batch *b) {
    whole_batch w = {ag_tape_new(), 0, NULL, ag_data_parallel_new(b->net.ps)};
    w.loss = plain_step(b, w.tp);
    w.grad = grad_copy(b);
    return w;
}

static void whole_batch_free(whole_batch *w, batch *b) {
    ag_threads_set(1);
    free(w->grad);
    ag_data_parallel_free(w->dp);
    ag_tape_free(w->tp);
    model_free(&b->net);
}

// A step on each of n thread counts, from zeroed gradients, gives the plain step's loss
// and gradients (f64, to 1e-14).
static void check_steps_match(batch *b, const whole_batch *w, const int threads[], int n) {
    for (int i = 0; i < n; i++) {
        ag_threads_set(threads[i]);
        ag_params_zero_grad(b->net.ps);
        double split = ag_data_parallel_step(w->dp, B, loss_of, b);
        CHECK_NEAR(split, w->loss, 1e-14);
        double d = max_diff(b, w->grad, ag_params_grad(b->net.ps));
        if (!(d < 1e-14)) fprintf(stderr, "  %d threads: gradient differs by %.3g\n",
                                  threads[i], d);
        CHECK(d < 1e-14);
    }
}

// f64: the slices' gradients, weighted by their counted targets, are the whole batch's.
static void test_slices_give_the_whole_batch_gradient(void) {
    static batch b;
    batch_init(&b, AG_F64);
    whole_batch w = whole_batch_make(&b);
    check_steps_match(&b, &w, (const int[]){2, 3, 5}, 3);
    // Gradients accumulate into what the store holds, as for any backward.
    ag_threads_set(2);
    double split = ag_data_parallel_step(w.dp, B, loss_of, &b);
    CHECK_NEAR(split, w.loss, 1e-14);
    double worst = 0;
    for (size_t e = 0; e < ag_params_buffer_len(b.net.ps); e++)
        worst = fmax(worst,
                     fabs(((double *)ag_params_grad(b.net.ps))[e] - 2 * ((double *)w.grad)[e]));
    CHECK(worst < 1e-14);
    whole_batch_free(&w, &b);
}

// A frozen parameter is handed to the slices as it is, gradient buffer and all: no slice
// may add into it (they would, all at once, into the store's one buffer), and the others
// still get the whole batch's gradient.
static void test_a_frozen_parameter_gets_no_gradient_from_the_slices(void) {
    static batch b;
    batch_init(&b, AG_F64);
    ag_tensor *frozen = ag_params_find(b.net.ps, "head.weight");  // read beside activations
    CHECK(frozen != NULL);
    ag_tensor_set_requires_grad(frozen, false);
    whole_batch w = whole_batch_make(&b);
    check_steps_match(&b, &w, (const int[]){3}, 1);
    for (size_t i = 0; i < frozen->numel; i++) CHECK(ag_tensor_grad_item(frozen, i) == 0.0);
    whole_batch_free(&w, &b);
}

static void test_same_bits_every_run_for_a_thread_count(void) {
    static batch b;
    batch_init(&b, AG_F32);
    ag_threads_set(2);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    ag_params_zero_grad(b.net.ps);
    double first = ag_data_parallel_step(dp, B, loss_of, &b);
    void *g = grad_copy(&b);
    for (int run = 0; run < 5; run++) {
        ag_params_zero_grad(b.net.ps);
        CHECK(ag_data_parallel_step(dp, B, loss_of, &b) == first);
        CHECK(memcmp(g, ag_params_grad(b.net.ps),
                     ag_params_buffer_len(b.net.ps) * sizeof(float)) == 0);
    }
    ag_threads_set(1);
    free(g);
    ag_data_parallel_free(dp);
    model_free(&b.net);
}

static void test_a_repeated_step_allocates_nothing(void) {
    static batch b;
    batch_init(&b, AG_F32);
    ag_threads_set(2);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    for (int s = 0; s < 2; s++) ag_data_parallel_step(dp, B, loss_of, &b);
    ag_memory_stats before = ag_memory_usage();
    for (int s = 0; s < 3; s++) ag_data_parallel_step(dp, B, loss_of, &b);
    CHECK(ag_memory_usage().allocations == before.allocations);
    ag_threads_set(1);
    ag_data_parallel_free(dp);
    model_free(&b.net);
}

// More threads than items: one slice per item.
static void test_fewer_items_than_threads(void) {
    static batch b;
    batch_init(&b, AG_F64);
    ag_tape *tp = ag_tape_new();
    ag_tape_reset(tp);
    ag_params_zero_grad(b.net.ps);
    double w;
    ag_tensor *loss = loss_of(tp, 0, 2, &b, &w);
    ag_backward(tp, loss);
    double plain = ag_tensor_item(loss, 0);
    void *g = grad_copy(&b);
    ag_threads_set(4);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    ag_params_zero_grad(b.net.ps);
    CHECK_NEAR(ag_data_parallel_step(dp, 2, loss_of, &b), plain, 1e-14);
    CHECK(max_diff(&b, g, ag_params_grad(b.net.ps)) < 1e-14);
    CHECK(ag_data_parallel_tape(dp, 1) != NULL && ag_data_parallel_tape(dp, 2) == NULL);
    ag_threads_set(1);
    free(g);
    ag_data_parallel_free(dp);
    ag_tape_free(tp);
    model_free(&b.net);
}

// A slice whose items have no scored target (weight 0) contributes nothing: the step
// gives the loss and gradients of the whole batch, as with fewer threads.
static void test_a_slice_of_weight_0_contributes_nothing(void) {
    static batch b;
    batch_init(&b, AG_F64);
    for (int i = B / 2 * T; i < B * T; i++) b.targets[i] = AG_IGNORE_INDEX;
    whole_batch w = whole_batch_make(&b);
    // The last slice, items 6 to 11 of 2 slices or 8 to 11 of 3, scores none.
    check_steps_match(&b, &w, (const int[]){2, 3}, 2);
    whole_batch_free(&w, &b);
}

// With no scored target anywhere there is no mean to take: an error, and the gradients
// are left as they were.
static void test_a_batch_of_weight_0_is_an_error(void) {
    static batch b;
    batch_init(&b, AG_F32);
    for (int i = 0; i < B * T; i++) b.targets[i] = AG_IGNORE_INDEX;
    ag_threads_set(2);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    ag_params_zero_grad(b.net.ps);
    testing_catch_errors();
    double loss = ag_data_parallel_step(dp, B, loss_of, &b);
    testing_release_errors();
    CHECK(isnan(loss));
    CHECK(strcmp(testing_last_error, "data_parallel_step: every slice of the 12 items has "
                                     "weight 0; at least one must weigh more") == 0);
    bool zero = true;
    for (size_t e = 0; e < ag_params_buffer_len(b.net.ps); e++)
        zero = zero && ((const float *)ag_params_grad(b.net.ps))[e] == 0;
    CHECK(zero);
    ag_threads_set(1);
    ag_data_parallel_free(dp);
    model_free(&b.net);
}

// A tensor of the user's that requires grad would be written by every thread at once.
static ag_tensor *uses_a_foreign_leaf(ag_tape *tp, int begin, int end, void *user,
                                      double *weight) {
    (void)begin, (void)end;
    *weight = 1;
    ag_tensor *y = ag_mul(tp, (ag_tensor *)user, (ag_tensor *)user);
    return y ? ag_sum(tp, y) : NULL;
}

static void test_a_leaf_outside_the_store_is_an_error(void) {
    static batch b;
    batch_init(&b, AG_F32);
    ag_tensor *x = ag_tensor_ones(AG_F32, 1, (int[]){3});
    ag_tensor_set_name(x, "head_mask");
    ag_tensor_set_requires_grad(x, true);
    ag_threads_set(2);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    testing_catch_errors();
    double loss = ag_data_parallel_step(dp, 4, uses_a_foreign_leaf, x);
    testing_release_errors();
    CHECK(isnan(loss));
    CHECK(strstr(testing_last_error, "data_parallel: head_mask [3] requires grad") != NULL);
    ag_threads_set(1);
    ag_data_parallel_free(dp);
    ag_tensor_free(x);
    model_free(&b.net);
}

// Weights that are each finite but add up to more than the largest double share the batch
// as they stand: the same step as equal weights of 1, to the bit (the shares of two
// DBL_MAX weights are 1/2, not DBL_MAX / inf = 0).
typedef struct {
    batch *b;
    double weight;
} weighed;

static ag_tensor *loss_weighed(ag_tape *tp, int begin, int end, void *user, double *weight) {
    weighed *wd = user;
    ag_tensor *loss = loss_of(tp, begin, end, wd->b, weight);
    *weight = wd->weight;
    return loss;
}

static void test_weights_whose_sum_overflows_still_share_the_batch(void) {
    static batch b;
    batch_init(&b, AG_F64);
    ag_threads_set(2);
    ag_data_parallel *dp = ag_data_parallel_new(b.net.ps);
    ag_params_zero_grad(b.net.ps);
    double equal = ag_data_parallel_step(dp, B, loss_weighed, &(weighed){&b, 1});
    void *g = grad_copy(&b);
    ag_params_zero_grad(b.net.ps);
    double huge = ag_data_parallel_step(dp, B, loss_weighed, &(weighed){&b, DBL_MAX});
    CHECK(huge == equal && equal > 0);
    CHECK(memcmp(g, ag_params_grad(b.net.ps), ag_params_buffer_len(b.net.ps) * sizeof(double)) ==
          0);
    ag_threads_set(1);
    free(g);
    ag_data_parallel_free(dp);
    model_free(&b.net);
}

// A store of one parameter w = [1, 2, 3, 4] for steps whose loss is sum(w * w) over any
// slice, its data_parallel on two threads, and a tape of the caller's.
typedef struct {
    ag_params *ps;
    ag_tensor *w;
    ag_data_parallel *dp;
    ag_tape *own;
} squares;

static squares squares_make(void) {
    squares sq = {ag_params_new(AG_F32), NULL, NULL, ag_tape_new()};
    sq.w = ag_params_add(sq.ps, "w", 1, (int[]){4});
    for (int i = 0; i < 4; i++) ag_tensor_set_item(sq.w, (size_t)i, i + 1);
    sq.dp = ag_data_parallel_new(sq.ps);
    ag_threads_set(2);
    return sq;
}

static void squares_free(squares *sq) {
    ag_threads_set(1);
    ag_data_parallel_free(sq->dp);
    ag_params_free(sq->ps);
    ag_tape_free(sq->own);
}

static ag_tensor *sum_of_squares(ag_tape *tp, ag_tensor *w) {
    ag_tensor *y = ag_mul(tp, w, w);
    return y ? ag_sum(tp, y) : NULL;
}

// A step over 4 items from zeroed gradients, its errors caught: its loss.
static double squares_step(squares *sq, ag_batch_loss_fn fn, void *user) {
    ag_params_zero_grad(sq->ps);
    testing_catch_errors();
    double loss = ag_data_parallel_step(sq->dp, 4, fn, user);
    testing_release_errors();
    return loss;
}

static float first_grad(const squares *sq) { return ((const float *)ag_params_grad(sq->ps))[0]; }

// A loss that leaves its slice's tape in no-grad mode and under autocast (an evaluation
// tail, say): the next step's tapes are fresh again, recording gradients in float32, as
// the header promises, so its gradient is that of the first step.
static atomic_int stale_tapes;  // the slices run on the threads at once
static ag_tensor *leaves_its_tape_changed(ag_tape *tp, int begin, int end, void *user,
                                          double *weight) {
    squares *sq = user;
    *weight = end - begin;
    if (!ag_tape_grad_enabled(tp) || ag_tape_autocast(tp) != AG_AUTOCAST_OFF)
        atomic_fetch_add(&stale_tapes, 1);
    ag_tensor *loss = sum_of_squares(tp, sq->w);
    ag_tape_set_grad_enabled(tp, false);
    ag_tape_set_autocast(tp, AG_AUTOCAST_BF16);
    return loss;
}

static void test_each_step_starts_on_fresh_tapes(void) {
    squares sq = squares_make();
    atomic_store(&stale_tapes, 0);
    CHECK(squares_step(&sq, leaves_its_tape_changed, &sq) == 30);
    const float first = first_grad(&sq);
    CHECK(first == 2);  // each slice's loss is sum(w * w) = 30, weighed alike: d/dw0 = 2 w0
    CHECK(squares_step(&sq, leaves_its_tape_changed, &sq) == 30);
    CHECK(atomic_load(&stale_tapes) == 0 && first_grad(&sq) == first);
    squares_free(&sq);
}

// A loss recorded on a tape other than the slice's (the caller's own tape, by mistake)
// cannot be differentiated on the slice's: an error before any backward, and the store's
// gradients stay as they were (not those of the other slices alone).
static ag_tensor *first_slice_on_own_tape(ag_tape *tp, int begin, int end, void *user,
                                          double *weight) {
    squares *sq = user;
    *weight = end - begin;
    return sum_of_squares(begin == 0 ? sq->own : tp, sq->w);
}

static void test_a_loss_recorded_on_another_tape_is_an_error(void) {
    squares sq = squares_make();
    CHECK(isnan(squares_step(&sq, first_slice_on_own_tape, &sq)));
    CHECK(testing_error_was("data_parallel_step: slice 0 of 2 (items 0 to 2) gave a loss [] (not "
                            "recorded on the slice's tape) with weight 2; the loss must be a "
                            "scalar that requires grad, recorded on the slice's tape, and the "
                            "weight finite and >= 0"));
    CHECK(first_grad(&sq) == 0);
    squares_free(&sq);
}

// A loss function that gives no loss for a slice, and says nothing: the step says it.
static ag_tensor *no_loss_for_the_second_slice(ag_tape *tp, int begin, int end, void *user,
                                               double *weight) {
    squares *sq = user;
    *weight = end - begin;
    return begin > 0 ? NULL : sum_of_squares(tp, sq->w);
}

static void test_a_silent_null_loss_is_reported(void) {
    squares sq = squares_make();
    CHECK(isnan(squares_step(&sq, no_loss_for_the_second_slice, &sq)));
    CHECK(testing_error_was("data_parallel_step: the loss function returned NULL for slice 1 "
                            "of 2 (items 2 to 4) and reported no error"));
    CHECK(first_grad(&sq) == 0);
    squares_free(&sq);
}

// A slice whose backward fails (here an op without one, in the second slice only) is
// reported through a handler that returns: the step does not pass for the whole batch's.
// Its loss is NaN, after a line of its own; the first slice's gradients may be in the
// store, the second's are not added.
static void copy_forward(ag_node *n) { ag_tensor_copy(n->out, n->in[0]); }
static const ag_op forward_only_op = {"forward_only", copy_forward, NULL, NULL};

static ag_tensor *second_slice_without_backward(ag_tape *tp, int begin, int end, void *user,
                                                double *weight) {
    squares *sq = user;
    *weight = end - begin;
    ag_tensor *w = sq->w;
    if (begin > 0) w = ag_op_apply(tp, &forward_only_op, 1, &w, 1, w->shape, NULL, 0);
    return sum_of_squares(tp, w);
}

static void test_a_failed_backward_in_a_slice_gives_nan(void) {
    squares sq = squares_make();
    CHECK(isnan(squares_step(&sq, second_slice_without_backward, &sq)));
    CHECK(testing_error_count == 2);
    CHECK(strcmp(testing_last_error, "data_parallel_step: an error was reported during the "
                                     "slices' backward (above); the store's gradients may hold "
                                     "part of the batch's") == 0);
    CHECK(first_grad(&sq) == 0 || first_grad(&sq) == 1);  // never the batch's 2
    squares_free(&sq);
}

// The loss function runs inside a job of the thread pool, which stopping the workers
// would wait for: changing the thread count there is an error (it deadlocked), and the
// step goes on with the count it has. So it is in a step of one slice (one thread, or one
// item), which runs its loss function on the calling thread: there the count changed.
static ag_tensor *sets_the_thread_count(ag_tape *tp, int begin, int end, void *user,
                                        double *weight) {
    squares *sq = user;
    if (begin == 0) ag_threads_set(3);
    *weight = end - begin;
    return sum_of_squares(tp, sq->w);
}

static void test_setting_the_thread_count_inside_a_step_is_an_error(void) {
    const struct {
        int threads, items;
    } runs[] = {{2, 4}, {1, 4}, {2, 1}};
    for (int r = 0; r < 3; r++) {
        squares sq = squares_make();
        ag_threads_set(runs[r].threads);
        ag_params_zero_grad(sq.ps);
        testing_catch_errors();
        CHECK(ag_data_parallel_step(sq.dp, runs[r].items, sets_the_thread_count, &sq) == 30);
        testing_release_errors();
        CHECK(testing_error_was("threads_set: called from inside a parallel job (a "
                                "data-parallel loss function, say), which holds the pool; set "
                                "the thread count between steps"));
        CHECK(ag_threads() == runs[r].threads && first_grad(&sq) == 2);
        squares_free(&sq);
    }
}

// A step of the same data_parallel called from inside its loss function would reset the
// tapes the running step records on (it crashed): an error, and the running step goes on.
typedef struct {
    squares *sq;
    double inner;  // what the step inside returned
} nested;

static ag_tensor *steps_again(ag_tape *tp, int begin, int end, void *user, double *weight) {
    nested *ns = user;
    if (begin == 0) ns->inner = ag_data_parallel_step(ns->sq->dp, 4, steps_again, ns);
    *weight = end - begin;
    return sum_of_squares(tp, ns->sq->w);
}

static void test_a_step_inside_its_own_step_is_an_error(void) {
    squares sq = squares_make();
    nested ns = {&sq, 0};
    CHECK(squares_step(&sq, steps_again, &ns) == 30);
    CHECK(testing_error_was("data_parallel_step: called while a step of the same data_parallel "
                            "runs (from its loss function, or from another thread); its tapes "
                            "are in use"));
    CHECK(isnan(ns.inner) && first_grad(&sq) == 2);
    squares_free(&sq);
}

// Freed from inside its own loss function, the data_parallel's tapes went from under the
// running step (a use after free): an error that frees nothing, and the step goes on.
static ag_tensor *frees_its_data_parallel(ag_tape *tp, int begin, int end, void *user,
                                          double *weight) {
    squares *sq = user;
    if (begin == 0) ag_data_parallel_free(sq->dp);
    *weight = end - begin;
    return sum_of_squares(tp, sq->w);
}

static void test_a_free_inside_its_own_step_is_an_error(void) {
    squares sq = squares_make();
    CHECK(squares_step(&sq, frees_its_data_parallel, &sq) == 30);
    CHECK(testing_error_was("data_parallel_free: a step of this data_parallel runs (called "
                            "from its loss function, or from another thread): not freed; free "
                            "it after the step returns"));
    CHECK(first_grad(&sq) == 2);
    squares_free(&sq);
}

int main(void) {
    RUN(test_one_thread_is_the_plain_step);
    RUN(test_slices_give_the_whole_batch_gradient);
    RUN(test_a_frozen_parameter_gets_no_gradient_from_the_slices);
    RUN(test_same_bits_every_run_for_a_thread_count);
    RUN(test_a_repeated_step_allocates_nothing);
    RUN(test_fewer_items_than_threads);
    RUN(test_a_slice_of_weight_0_contributes_nothing);
    RUN(test_a_batch_of_weight_0_is_an_error);
    RUN(test_a_leaf_outside_the_store_is_an_error);
    RUN(test_weights_whose_sum_overflows_still_share_the_batch);
    RUN(test_each_step_starts_on_fresh_tapes);
    RUN(test_a_loss_recorded_on_another_tape_is_an_error);
    RUN(test_a_silent_null_loss_is_reported);
    RUN(test_a_failed_backward_in_a_slice_gives_nan);
    RUN(test_setting_the_thread_count_inside_a_step_is_an_error);
    RUN(test_a_step_inside_its_own_step_is_an_error);
    RUN(test_a_free_inside_its_own_step_is_an_error);
    return testing_summary();
}
