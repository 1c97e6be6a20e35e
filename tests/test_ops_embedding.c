// Embedding lookup: rows are copied, repeated ids accumulate their gradients,
// ids are copied at the call, and bad ids or shapes are reported clearly.
#include "op_checks.h"

typedef struct {
    const int32_t *ids;
    test_shape shape;
} lookup;

static ag_tensor *embedding_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const lookup *l = user;
    return ag_embedding(tp, in[0], l->ids, l->shape.ndim, l->shape.shape);
}

// numel(shape) ids uniform in [0, V), from pcg32 seeded (seed, 3).
static void random_ids(int32_t *ids, size_t count, int V, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 3);
    for (size_t i = 0; i < count; i++) ids[i] = (int32_t)ag_pcg32_bounded(&rng, (uint32_t)V);
}

static size_t shape_numel(test_shape s) {
    size_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= (size_t)s.shape[i];
    return n;
}

static void test_embedding_output_rows_are_weight_rows(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = random_tensor(AG_F32, (test_shape){2, {6, 5}}, 1, -1, 1);
    const int32_t ids[] = {4, 0, 5, 4, 2, 1};
    ag_tensor *y = ag_embedding(tp, w, ids, 2, (int[]){2, 3});
    CHECK(y && y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 5);
    for (size_t r = 0; r < 6; r++)
        for (size_t e = 0; e < 5; e++)
            CHECK(ag_tensor_item(y, r * 5 + e) == ag_tensor_item(w, (size_t)ids[r] * 5 + e));
    ag_tensor_free(w);
    ag_tape_free(tp);
}

static void test_embedding_scalar_id_gives_one_row(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = random_tensor(AG_F64, (test_shape){2, {3, 4}}, 2, -1, 1);
    const int32_t id = 2;
    ag_tensor *y = ag_embedding(tp, w, &id, 0, NULL);
    CHECK(y && y->ndim == 1 && y->shape[0] == 4);
    for (size_t e = 0; e < 4; e++) CHECK(ag_tensor_item(y, e) == ag_tensor_item(w, 8 + e));
    ag_tensor_free(w);
    ag_tape_free(tp);
}

static void test_repeated_ids_accumulate_their_rows_gradients(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = random_tensor(AG_F64, (test_shape){2, {5, 3}}, 3, -1, 1);
    ag_tensor_set_requires_grad(w, true);
    const int32_t ids[] = {3, 1, 3, 3, 0};
    ag_tensor *y = ag_embedding(tp, w, ids, 1, (int[]){5});
    ag_tensor *dy = random_tensor(AG_F64, (test_shape){2, {5, 3}}, 4, -1, 1);
    ag_backward_with(tp, y, dy);
    for (size_t v = 0; v < 5; v++) {
        for (size_t e = 0; e < 3; e++) {
            double want = 0;
            for (size_t r = 0; r < 5; r++)
                if ((size_t)ids[r] == v) want += ag_tensor_item(dy, r * 3 + e);
            CHECK_NEAR(ag_tensor_grad_item(w, v * 3 + e), want, 1e-15);
        }
    }
    // Rows no id points at (2 and 4) get exactly nothing.
    for (size_t e = 0; e < 3; e++) {
        CHECK(ag_tensor_grad_item(w, 2 * 3 + e) == 0.0);
        CHECK(ag_tensor_grad_item(w, 4 * 3 + e) == 0.0);
    }
    ag_tensor_free(dy);
    ag_tensor_free(w);
    ag_tape_free(tp);
}

static void test_backward_adds_to_an_existing_weight_gradient(void) {
    // A table shared by two lookups (tied embeddings) gets both contributions.
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = random_tensor(AG_F64, (test_shape){2, {4, 2}}, 5, -1, 1);
    ag_tensor_set_requires_grad(w, true);
    const int32_t a[] = {1, 2}, b[] = {2, 3};
    ag_tensor *ya = ag_embedding(tp, w, a, 1, (int[]){2});
    ag_tensor *yb = ag_embedding(tp, w, b, 1, (int[]){2});
    ag_backward(tp, ag_sum(tp, ag_add(tp, ya, yb)));
    const double want[4] = {0, 1, 2, 1};  // rows 0..3: how often each id occurs
    for (size_t v = 0; v < 4; v++)
        for (size_t e = 0; e < 2; e++) CHECK(ag_tensor_grad_item(w, v * 2 + e) == want[v]);
    ag_tensor_free(w);
    ag_tape_free(tp);
}

static void test_ids_are_copied_at_the_call(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = random_tensor(AG_F64, (test_shape){2, {4, 2}}, 6, -1, 1);
    ag_tensor_set_requires_grad(w, true);
    int32_t ids[] = {0, 0, 1};
    ag_tensor *y = ag_embedding(tp, w, ids, 1, (int[]){3});
    ids[0] = ids[1] = ids[2] = 3;  // the caller reuses its buffer before backward
    ag_backward(tp, ag_sum(tp, y));
    for (size_t e = 0; e < 2; e++) {
        CHECK(ag_tensor_grad_item(w, 0 * 2 + e) == 2.0);
        CHECK(ag_tensor_grad_item(w, 1 * 2 + e) == 1.0);
        CHECK(ag_tensor_grad_item(w, 3 * 2 + e) == 0.0);
    }
    ag_tensor_free(w);
    ag_tape_free(tp);
}

static void test_embedding_gradcheck_f64_over_shapes(void) {
    const struct {
        int V, E;
        test_shape ids;
    } cases[] = {
        {3, 4, {0, {0}}},  {1, 1, {1, {1}}},        {4, 3, {1, {7}}},
        {5, 2, {2, {3, 4}}}, {6, 3, {3, {2, 2, 3}}}, {2, 5, {2, {2, 3}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ag_tensor *w =
            random_tensor(AG_F64, (test_shape){2, {cases[c].V, cases[c].E}}, 10 + c, -1, 1);
        ag_tensor_set_requires_grad(w, true);
        int32_t ids[12];
        random_ids(ids, shape_numel(cases[c].ids), cases[c].V, 20 + c);
        lookup l = {ids, cases[c].ids};
        CHECK(ag_gradcheck(embedding_fn, &w, 1, &l, NULL, NULL));
        ag_tensor_free(w);
    }
}

static void test_embedding_f32_matches_f64(void) {
    ag_tensor *w = random_tensor(AG_F64, (test_shape){2, {7, 6}}, 30, -2, 2);
    ag_tensor_set_requires_grad(w, true);
    int32_t ids[24];
    random_ids(ids, 24, 7, 31);
    lookup l = {ids, {3, {2, 3, 4}}};
    CHECK(f32_vs_f64_error(embedding_fn, &w, 1, &l) <= 1e-5);
    ag_tensor_free(w);
}

static void test_out_of_range_id_names_id_position_and_rows(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = ag_tensor_zeros(AG_F32, 2, (int[]){10, 4});
    testing_catch_errors();
    const int32_t too_big[] = {0, 1, 2, 3, 4, 12};
    CHECK(ag_embedding(tp, w, too_big, 2, (int[]){2, 3}) == NULL);
    CHECK(strcmp(testing_last_error, "embedding: index 12 at position 5 is out of range for "
                                     "10 rows (weight [10,4], ids [2,3])") == 0);
    const int32_t negative[] = {0, -1};
    CHECK(ag_embedding(tp, w, negative, 1, (int[]){2}) == NULL);
    CHECK(strcmp(testing_last_error, "embedding: index -1 at position 1 is out of range for "
                                     "10 rows (weight [10,4], ids [2])") == 0);
    const int32_t edge[] = {10};
    CHECK(ag_embedding(tp, w, edge, 1, (int[]){1}) == NULL);
    CHECK(strstr(testing_last_error, "index 10 at position 0") != NULL);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tensor_free(w);
    ag_tape_free(tp);
}

static void test_bad_weight_or_ids_shape_is_an_error_naming_shapes(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w1 = ag_tensor_zeros(AG_F32, 1, (int[]){10});
    ag_tensor *w = ag_tensor_zeros(AG_F32, 2, (int[]){10, 4});
    ag_tensor *mask = ag_tensor_zeros(AG_BOOL, 2, (int[]){10, 4});
    const int32_t ids[16] = {0};
    testing_catch_errors();
    CHECK(ag_embedding(tp, w1, ids, 1, (int[]){2}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "embedding: weight [V, E] must have 2 dimensions, got [10]") == 0);
    CHECK(ag_embedding(tp, mask, ids, 1, (int[]){2}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "embedding: weight [10,4] must be f32 or f64, not bool") == 0);
    CHECK(ag_embedding(tp, w, ids, 4, (int[]){2, 2, 2, 2}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "embedding: ids [2,2,2,2] give an output of 5 dimensions, at most 4 are "
                 "supported (weight [10,4])") == 0);
    CHECK(ag_embedding(tp, w, NULL, 1, (int[]){2}) == NULL);
    CHECK(strcmp(testing_last_error, "embedding: ids is NULL (ids [2], weight [10,4])") == 0);
    CHECK(ag_embedding(tp, w, ids, 1, (int[]){0}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "embedding: dimension 0 has extent 0, extents must be >= 1") == 0);
    CHECK(testing_error_count == 5);
    testing_release_errors();
    ag_tensor_free(mask);
    ag_tensor_free(w);
    ag_tensor_free(w1);
    ag_tape_free(tp);
}

int main(void) {
    RUN(test_embedding_output_rows_are_weight_rows);
    RUN(test_embedding_scalar_id_gives_one_row);
    RUN(test_repeated_ids_accumulate_their_rows_gradients);
    RUN(test_backward_adds_to_an_existing_weight_gradient);
    RUN(test_ids_are_copied_at_the_call);
    RUN(test_embedding_gradcheck_f64_over_shapes);
    RUN(test_embedding_f32_matches_f64);
    RUN(test_out_of_range_id_names_id_position_and_rows);
    RUN(test_bad_weight_or_ids_shape_is_an_error_naming_shapes);
    return testing_summary();
}
