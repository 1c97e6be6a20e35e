// Tensors, initialisers, printing, and the parameter store.
#include <stdlib.h>

#include "testing.h"

static void test_new_tensor_is_zero_filled_with_the_given_shape(void) {
    ag_tensor *t = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 4});
    CHECK(t->ndim == 3 && t->numel == 24);
    CHECK(t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 4 && t->shape[3] == 1);
    for (size_t i = 0; i < t->numel; i++) CHECK(ag_tensor_item(t, i) == 0.0);
    CHECK(!t->requires_grad && t->grad == NULL && t->node == NULL);
    ag_tensor_free(t);
    ag_tensor *s = ag_tensor_zeros(AG_F32, 0, NULL);  // a scalar
    CHECK(s->ndim == 0 && s->numel == 1);
    ag_tensor_free(s);
}

static void test_ones_from_and_convert(void) {
    ag_tensor *o = ag_tensor_ones(AG_F32, 2, (int[]){2, 2});
    CHECK(ag_tensor_f32(o)[3] == 1.0f);
    ag_tensor *d = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){0.1, -2, 3.5});
    ag_tensor *f = ag_tensor_convert(d, AG_F32);
    CHECK(f->dtype == AG_F32 && ag_tensor_f32(f)[0] == 0.1f);
    ag_tensor *m = ag_tensor_from(AG_BOOL, 1, (int[]){3}, (uint8_t[]){1, 0, 1});
    CHECK(ag_tensor_item(m, 0) == 1.0 && ag_tensor_item(m, 1) == 0.0);
    ag_tensor_free(o);
    ag_tensor_free(d);
    ag_tensor_free(f);
    ag_tensor_free(m);
}

static void test_bad_shapes_and_dtypes_are_reported(void) {
    testing_catch_errors();
    CHECK(ag_tensor_zeros(AG_F32, 5, (int[]){1, 1, 1, 1, 1}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "tensor_zeros: 5 dimensions requested, at most 4 are supported") == 0);
    CHECK(ag_tensor_zeros(AG_F32, -1, NULL) == NULL);
    CHECK(strcmp(testing_last_error,
                 "tensor_zeros: -1 dimensions requested, a tensor has 0 to 4") == 0);
    CHECK(ag_tensor_zeros(AG_F32, 2, (int[]){3, 0}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "tensor_zeros: dimension 1 has extent 0, extents must be >= 1") == 0);
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, 1, (int[]){2});
    ag_tensor_set_requires_grad(m, true);
    CHECK(strcmp(testing_last_error, "set_requires_grad: a bool tensor [2] cannot require grad") ==
          0);
    CHECK(!m->requires_grad);
    CHECK(ag_tensor_f32(m) == NULL);
    CHECK(strcmp(testing_last_error, "tensor_f32: tensor [2] is bool, not f32") == 0);
    testing_release_errors();
    ag_tensor_free(m);
}

static void test_initialisers_follow_torch_nn_init_bounds(void) {
    ag_pcg32 rng = ag_pcg32_make(3, 3);
    ag_tensor *w = ag_tensor_zeros(AG_F64, 2, (int[]){48, 16});  // [out, in]
    CHECK(ag_tensor_fan_in(w) == 16 && ag_tensor_fan_out(w) == 48);
    ag_tensor_init_xavier_uniform(w, &rng, 1.0);
    double bound = sqrt(6.0 / (16 + 48)), lo = 1, hi = -1;
    for (size_t i = 0; i < w->numel; i++) {
        lo = fmin(lo, ag_tensor_item(w, i));
        hi = fmax(hi, ag_tensor_item(w, i));
    }
    CHECK(lo >= -bound && hi < bound && lo < -0.9 * bound && hi > 0.9 * bound);
    ag_tensor_init_kaiming_uniform(w, &rng, sqrt(5.0));  // nn.Linear's weight init
    bound = 1.0 / sqrt(16.0);  // sqrt(6 / ((1 + 5) * fan_in))
    lo = 1, hi = -1;
    for (size_t i = 0; i < w->numel; i++) {
        lo = fmin(lo, ag_tensor_item(w, i));
        hi = fmax(hi, ag_tensor_item(w, i));
    }
    CHECK(lo >= -bound && hi < bound && lo < -0.9 * bound && hi > 0.9 * bound);
    ag_tensor_free(w);
}

// As torch's uniform_ and normal_: a reversed, NaN or unbounded range and a
// negative or NaN std are refused, and the tensor keeps its values.
static void test_initialisers_refuse_a_bad_range_or_std(void) {
    ag_pcg32 rng = ag_pcg32_make(3, 3);
    ag_tensor *w = ag_tensor_zeros(AG_F64, 2, (int[]){4, 3});
    testing_catch_errors();
    ag_tensor_init_uniform(w, &rng, 1, 0);
    CHECK(testing_error_was("tensor_init_uniform: needs lo <= hi, both finite, got lo 1, hi 0 "
                            "(tensor [4,3])"));
    ag_tensor_init_uniform(w, &rng, NAN, 1);
    CHECK(testing_error_was("tensor_init_uniform: needs lo <= hi, both finite, got lo nan, hi 1 "
                            "(tensor [4,3])"));
    ag_tensor_init_uniform(w, &rng, -1e308, 1e308);  // hi - lo overflows
    CHECK(testing_error_was("tensor_init_uniform: needs lo <= hi, both finite, got lo -1e+308, "
                            "hi 1e+308 (tensor [4,3])"));
    ag_tensor_init_normal(w, &rng, 0, -1);
    CHECK(testing_error_was("tensor_init_normal: std must be >= 0, got -1 (tensor [4,3])"));
    ag_tensor_init_xavier_uniform(w, &rng, -1);  // U(b, -b)
    CHECK(testing_error_was("tensor_init_xavier_uniform: needs lo <= hi, both finite, got lo "
                            "0.92582, hi -0.92582 (tensor [4,3])"));
    ag_tensor_init_kaiming_uniform(w, &rng, NAN);
    CHECK(testing_error_count == 1 && strstr(testing_last_error, "tensor_init_kaiming_uniform: "));
    testing_error_count = 0;
    CHECK(ag_tensor_uniform(AG_F32, 1, (int[]){2}, &rng, 2, 1) == NULL);
    CHECK(testing_error_was("tensor_uniform: needs lo <= hi, both finite, got lo 2, hi 1 "
                            "(tensor [2])"));
    CHECK(ag_tensor_normal(AG_F32, 1, (int[]){2}, &rng, 0, NAN) == NULL);
    CHECK(testing_error_was("tensor_normal: std must be >= 0, got nan (tensor [2])"));
    testing_release_errors();
    for (size_t i = 0; i < w->numel; i++) CHECK(ag_tensor_item(w, i) == 0.0);
    ag_tensor_init_uniform(w, &rng, 0.5, 0.5);  // an empty range's one value, as torch
    CHECK(ag_tensor_item(w, 0) == 0.5 && ag_tensor_item(w, 11) == 0.5);
    ag_tensor_free(w);
}

static void test_same_generator_gives_same_values_in_f32_and_f64(void) {
    ag_pcg32 r1 = ag_pcg32_make(9, 1), r2 = ag_pcg32_make(9, 1);
    ag_tensor *a = ag_tensor_normal(AG_F64, 1, (int[]){50}, &r1, 0.5, 2.0);
    ag_tensor *b = ag_tensor_normal(AG_F32, 1, (int[]){50}, &r2, 0.5, 2.0);
    for (size_t i = 0; i < 50; i++) CHECK(ag_tensor_f32(b)[i] == (float)ag_tensor_f64(a)[i]);
    ag_tensor_free(a);
    ag_tensor_free(b);
}

static char *print_to_string(const ag_tensor *t) {
    FILE *f = tmpfile();
    ag_tensor_print(t, f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    fclose(f);
    return s;
}

static void test_print_shows_name_dtype_shape_and_elides_large_tensors(void) {
    ag_tensor *t = ag_tensor_zeros(AG_F32, 2, (int[]){10, 20});
    for (size_t i = 0; i < t->numel; i++) ag_tensor_set_item(t, i, (double)i);
    ag_tensor_set_name(t, "w");
    char *s = print_to_string(t);
    CHECK(strncmp(s, "w: f32 [10,20]\n", 15) == 0);
    CHECK(strstr(s, "  [        0         1         2 ...        17        18        19]\n") !=
          NULL);
    CHECK(strstr(s, "  ...\n") != NULL);
    CHECK(strstr(s, "  [      180       181       182 ...       197       198       199]\n") !=
          NULL);
    CHECK(strstr(s, " 60 ") == NULL);  // row 3 is elided
    free(s);
    ag_tensor_free(t);
}

static void test_shape_strings(void) {
    char buf[32];
    ag_tensor *t = ag_tensor_zeros(AG_F32, 4, (int[]){2, 4, 5, 7});
    CHECK(strcmp(ag_tensor_shape_str(t, buf, sizeof buf), "[2,4,5,7]") == 0);
    ag_tensor *s = ag_tensor_zeros(AG_F32, 0, NULL);
    CHECK(strcmp(ag_tensor_shape_str(s, buf, sizeof buf), "[]") == 0);
    ag_tensor_free(t);
    ag_tensor_free(s);
}

static void test_params_live_in_one_aligned_contiguous_buffer(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor *a = ag_params_add(ps, "a.weight", 2, (int[]){3, 5});
    ag_tensor_fill(a, 1.5);
    ag_tensor *first_a = a;
    // Enough parameters to force the buffers to grow (and move) several times.
    char name[32];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "layer%d.bias", i);
        ag_tensor *b = ag_params_add(ps, name, 1, (int[]){100 + i});
        ag_tensor_fill(b, (double)i);
    }
    CHECK(ag_params_count(ps) == 41);
    CHECK(ag_params_find(ps, "a.weight") == first_a);  // tensors never move
    CHECK(ag_tensor_item(first_a, 14) == 1.5);           // values survive growth
    CHECK(ag_tensor_item(ag_params_find(ps, "layer39.bias"), 138) == 39.0);
    CHECK(ag_params_find(ps, "nope") == NULL);
    const char *base = ag_params_data(ps);
    size_t numel = 15;
    for (int i = 0; i < ag_params_count(ps); i++) {
        ag_tensor *t = ag_params_at(ps, i);
        CHECK(((uintptr_t)t->data % 64) == 0);
        CHECK((const char *)t->data >= base &&
              (const char *)t->data + t->numel * 4 <= base + ag_params_buffer_len(ps) * 4);
        CHECK((char *)t->grad - (char *)ag_params_grad(ps) == (const char *)t->data - base);
        CHECK(t->requires_grad);
        if (i) numel += t->numel;
    }
    CHECK(ag_params_numel(ps) == numel);
    ag_params_free(ps);
}

static void test_params_reject_duplicate_names(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_params_add(ps, "w", 1, (int[]){2});
    testing_catch_errors();
    CHECK(ag_params_add(ps, "w", 1, (int[]){2}) == NULL);
    CHECK(strcmp(testing_last_error, "params_add: a parameter named 'w' already exists") == 0);
    testing_release_errors();
    ag_params_free(ps);
}

static void test_clip_grad_norm_scales_all_gradients_together(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_tensor *a = ag_params_add(ps, "a", 1, (int[]){2});
    ag_tensor *b = ag_params_add(ps, "b", 1, (int[]){1});
    ((double *)a->grad)[0] = 3;
    ((double *)a->grad)[1] = 0;
    ((double *)b->grad)[0] = 4;
    CHECK_NEAR(ag_params_grad_norm(ps), 5.0, 1e-15);
    double before = ag_params_clip_grad_norm(ps, 1.0);
    CHECK_NEAR(before, 5.0, 1e-15);
    CHECK_NEAR(((double *)a->grad)[0], 3.0 / (5.0 + 1e-6), 1e-15);
    CHECK_NEAR(((double *)b->grad)[0], 4.0 / (5.0 + 1e-6), 1e-15);
    ag_params_clip_grad_norm(ps, 10.0);  // below the limit: unchanged
    CHECK_NEAR(((double *)b->grad)[0], 4.0 / (5.0 + 1e-6), 1e-15);
    ag_params_zero_grad(ps);
    CHECK(ag_params_grad_norm(ps) == 0.0);
    ag_params_free(ps);
}

// The gradient as a tensor: same shape, dtype and name; writes reach t->grad;
// before any backward its data is NULL.
static void test_grad_view_reads_and_writes_the_gradient(void) {
    ag_tensor *x = ag_tensor_ones(AG_F32, 2, (int[]){2, 2});
    ag_tensor_set_name(x, "x");
    ag_tensor_set_requires_grad(x, true);
    CHECK(ag_tensor_grad_view(x).data == NULL);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 3.0)));
    ag_tensor g = ag_tensor_grad_view(x);
    CHECK(g.data == x->grad && g.dtype == AG_F32 && ag_tensor_same_shape(&g, x));
    CHECK(strcmp(g.name, "x") == 0 && !g.requires_grad && g.grad == NULL && g.node == NULL);
    CHECK(ag_tensor_item(&g, 3) == 3.0);
    ag_tensor_set_item(&g, 1, 7.0);
    CHECK(ag_tensor_grad_item(x, 1) == 7.0);
    ag_tensor_free(&g);  // a view: ignored, frees nothing
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// An element past the end is another allocation's: item and grad_item give
// NaN and set_item stores nothing, each with a line naming the index.
static void test_an_index_past_the_end_is_an_error(void) {
    ag_tensor *t = ag_tensor_ones(AG_F32, 2, (int[]){3, 4});
    testing_catch_errors();
    CHECK(isnan(ag_tensor_item(t, 12)));
    CHECK(testing_error_was("tensor_item: index 12 is out of range for [3,4] (12 elements)"));
    ag_tensor_set_item(t, 99, 5.0);
    CHECK(testing_error_was("tensor_set_item: index 99 is out of range for [3,4] (12 elements)"));
    CHECK(isnan(ag_tensor_grad_item(t, (size_t)-1)));
    CHECK(testing_error_count == 1);
    testing_release_errors();
    CHECK(ag_tensor_item(t, 11) == 1.0 && ag_tensor_grad_item(t, 11) == 0.0);
    ag_tensor_free(t);
}

// A gradient's view before any backward has no data: printing says so, and
// reading an element is an error, not a NULL dereference.
static void test_a_gradient_view_without_data_prints_and_reads_safely(void) {
    ag_tensor *x = ag_tensor_ones(AG_F64, 1, (int[]){3});
    ag_tensor g = ag_tensor_grad_view(x);
    char *s = print_to_string(&g);
    CHECK(strcmp(s, "f64 [3]\n  (no data: a gradient no backward has reached)\n") == 0);
    free(s);
    testing_catch_errors();
    CHECK(isnan(ag_tensor_item(&g, 0)));
    CHECK(testing_error_was("tensor_item: tensor [3] has no data (a gradient no backward has "
                            "reached)"));
    ag_tensor_fill(&g, 1.0);
    CHECK(testing_error_was("tensor_fill: tensor [3] has no data (a gradient no backward has "
                            "reached)"));
    // One report for the whole tensor, and nothing returned after it.
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_tensor_init_uniform(&g, &rng, -1, 1);
    CHECK(testing_error_was("tensor_init_uniform: tensor [3] has no data (a gradient no "
                            "backward has reached)"));
    CHECK(ag_tensor_convert(&g, AG_F32) == NULL);
    CHECK(testing_error_was("tensor_convert: tensor [3] has no data (a gradient no backward "
                            "has reached)"));
    CHECK(ag_tensor_convert(x, (ag_dtype)9) == NULL);
    CHECK(testing_error_was("tensor_convert: unknown dtype 9"));
    testing_release_errors();
    ag_tensor_free(x);
}

// A view owns nothing, and ag_tensor_free ignores it: a gradient backward gave it leaked.
static void test_grad_view_cannot_require_grad(void) {
    ag_tensor *x = ag_tensor_ones(AG_F64, 1, (int[]){3});
    ag_tensor_set_requires_grad(x, true);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, x));
    ag_tensor g = ag_tensor_grad_view(x);
    testing_catch_errors();
    ag_tensor_set_requires_grad(&g, true);
    CHECK(testing_error_was("set_requires_grad: [3] is a gradient view (ag_tensor_grad_view), "
                            "which owns nothing and cannot hold a gradient of its own"));
    testing_release_errors();
    CHECK(!g.requires_grad);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_thread_count_reads_back_what_was_set(void) {
    ag_threads_set(2);
    CHECK(ag_threads() == 2);
    ag_threads_set(1);
    CHECK(ag_threads() == 1);
}

// As torch.set_num_threads, a count below 1 is an error and the count stays;
// the pool's 64 threads cap a larger one.
static void test_a_thread_count_below_one_is_refused_and_above_64_capped(void) {
    ag_threads_set(2);
    testing_catch_errors();
    ag_threads_set(0);
    CHECK(testing_error_was("threads_set: the count must be >= 1, got 0; it stays 2"));
    ag_threads_set(-3);
    CHECK(testing_error_was("threads_set: the count must be >= 1, got -3; it stays 2"));
    testing_release_errors();
    CHECK(ag_threads() == 2);
    ag_threads_set(1000);
    CHECK(ag_threads() == 64);
    ag_threads_set(1);
}

static void count_error(const char *message, void *user) {
    (void)message;
    ++*(int *)user;
}

static void test_error_handler_set_installs_the_handler_and_returns_the_previous(void) {
    int seen = 0;
    ag_error_handler before = ag_error_handler_set(count_error, &seen);
    ag_tensor_zeros(AG_F32, 5, (int[]){1, 1, 1, 1, 1});
    CHECK(seen == 1);
    CHECK(ag_error_handler_set(before, NULL) == count_error);
}

static void test_version_is_semantic(void) {
    int major, minor, patch;
    CHECK(sscanf(ag_version(), "%d.%d.%d", &major, &minor, &patch) == 3);
}

int main(void) {
    RUN(test_new_tensor_is_zero_filled_with_the_given_shape);
    RUN(test_ones_from_and_convert);
    RUN(test_bad_shapes_and_dtypes_are_reported);
    RUN(test_initialisers_follow_torch_nn_init_bounds);
    RUN(test_initialisers_refuse_a_bad_range_or_std);
    RUN(test_same_generator_gives_same_values_in_f32_and_f64);
    RUN(test_print_shows_name_dtype_shape_and_elides_large_tensors);
    RUN(test_shape_strings);
    RUN(test_params_live_in_one_aligned_contiguous_buffer);
    RUN(test_params_reject_duplicate_names);
    RUN(test_clip_grad_norm_scales_all_gradients_together);
    RUN(test_grad_view_reads_and_writes_the_gradient);
    RUN(test_an_index_past_the_end_is_an_error);
    RUN(test_a_gradient_view_without_data_prints_and_reads_safely);
    RUN(test_grad_view_cannot_require_grad);
    RUN(test_thread_count_reads_back_what_was_set);
    RUN(test_a_thread_count_below_one_is_refused_and_above_64_capped);
    RUN(test_error_handler_set_installs_the_handler_and_returns_the_previous);
    RUN(test_version_is_semantic);
    return testing_summary();
}
