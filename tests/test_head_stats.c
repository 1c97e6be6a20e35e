// ag_attention_head_stats on weights whose answers are known: a head on the diagonal
// (entropy 0, distance 0), a uniform head (entropy log S), a previous-token head (distance
// 1), a fully masked query left out, the strongest pair averaged over the batch; the
// printed table; a bad shape.
#include "op_checks.h"

#define B 2
#define NH 3
#define T 4

static size_t at(int b, int h, int t, int s) { return (((size_t)b * NH + h) * T + t) * T + s; }

// head 0: a_tt = 1; head 1: uniform over the T keys; head 2: previous token (query 0 on
// itself), except batch 1's query 3, fully masked (zeros).
static ag_tensor *known_weights(void) {
    ag_tensor *w = ag_tensor_zeros(AG_F64, 4, (int[]){B, NH, T, T});
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            ag_tensor_set_item(w, at(b, 0, t, t), 1.0);
            for (int s = 0; s < T; s++) ag_tensor_set_item(w, at(b, 1, t, s), 1.0 / T);
            if (!(b == 1 && t == 3)) ag_tensor_set_item(w, at(b, 2, t, t ? t - 1 : 0), 1.0);
        }
    return w;
}

static void test_known_heads_give_known_entropy_distance_and_strongest_pair(void) {
    ag_tensor *w = known_weights();
    ag_head_stats st[NH];
    CHECK(ag_attention_head_stats(w, st));
    CHECK(st[0].entropy == 0.0 && st[0].distance == 0.0);
    CHECK(st[0].query == 0 && st[0].key == 0 && st[0].weight == 1.0);
    CHECK_NEAR(st[1].entropy, log(T), 1e-15);
    // uniform: mean over queries of (1/T) sum_s |t - s| = (6 + 4 + 4 + 6) / 16
    CHECK_NEAR(st[1].distance, 20.0 / 16, 1e-15);
    CHECK(st[2].entropy == 0.0);
    // 7 rows with weight: distances 0 (query 0), 1, 1, 1 and 0, 1, 1.
    CHECK_NEAR(st[2].distance, 5.0 / 7, 1e-15);
    CHECK(st[2].query == 0 && st[2].key == 0 && st[2].weight == 1.0);
    ag_tensor_free(w);
}

static void test_strongest_pair_is_averaged_over_the_batch(void) {
    ag_tensor *w = ag_tensor_zeros(AG_F64, 4, (int[]){2, 1, 2, 2});
    ag_tensor_set_item(w, 1, 0.9);  // batch 0: (0, 1) = 0.9, alone
    ag_tensor_set_item(w, 4 + 2, 0.6);  // (1, 0) = 0.6 in both batches
    ag_tensor_set_item(w, 2, 0.6);
    ag_head_stats st;
    CHECK(ag_attention_head_stats(w, &st));
    CHECK(st.query == 1 && st.key == 0 && st.weight == 0.6);
    ag_tensor_free(w);
}

// A NaN in the weights (a NaN input upstream) is not a fully masked query: the head's
// entropy, distance and strongest weight are NaN, and the other heads are untouched.
static void test_a_nan_weight_makes_its_heads_stats_nan_not_a_masked_row(void) {
    ag_tensor *w = known_weights();
    ag_tensor_set_item(w, at(1, 2, 2, 0), NAN);  // head 2, batch 1, query 2
    ag_head_stats st[NH];
    CHECK(ag_attention_head_stats(w, st));
    CHECK(isnan(st[2].entropy) && isnan(st[2].distance) && isnan(st[2].weight));
    CHECK(st[2].query == 2 && st[2].key == 0);
    CHECK(st[0].entropy == 0.0 && st[0].distance == 0.0 && st[0].weight == 1.0);
    CHECK_NEAR(st[1].entropy, log(T), 1e-15);
    ag_tensor_free(w);
}

static void test_table_has_a_line_per_head_and_the_importance_columns(void) {
    ag_tensor *w = known_weights();
    ag_head_stats st[NH];
    CHECK(ag_attention_head_stats(w, st));
    FILE *f = tmpfile();
    const double grad[NH] = {0.5, 0.25, 0.125}, abl[NH] = {1, 2, 3};
    ag_attention_head_stats_print(st, NH, (const double *[]){grad, abl},
                                  (const char *const[]){"gradient", "ablation"}, 2, f);
    rewind(f);
    char buf[2048] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK(n > 0);
    CHECK(strstr(buf, "entropy") && strstr(buf, "gradient") && strstr(buf, "ablation"));
    int lines = 0;
    for (char *p = buf; *p; p++) lines += *p == '\n';
    CHECK(lines == NH + 1);
    CHECK(strstr(buf, "1.386") != NULL);  // log 4
    ag_tensor_free(w);
}

// A NULL column inside the importance or names array is one line and an empty file, not
// a NULL dereference or printf("%s", NULL).
static void test_a_null_importance_column_or_name_is_one_line(void) {
    ag_head_stats st[NH] = {{0}};
    const double grad[NH] = {0};
    FILE *f = tmpfile();
    testing_catch_errors();
    ag_attention_head_stats_print(st, NH, (const double *[]){grad, NULL},
                                  (const char *const[]){"gradient", "ablation"}, 2, f);
    CHECK(testing_error_count == 1);
    CHECK(strcmp(testing_last_error, "attention_head_stats_print: importance column 1 of 2 "
                                     "has a NULL score array (3 heads)") == 0);
    ag_attention_head_stats_print(st, NH, (const double *[]){grad, grad},
                                  (const char *const[]){NULL, "ablation"}, 2, f);
    CHECK(testing_error_count == 2);
    CHECK(strcmp(testing_last_error, "attention_head_stats_print: importance column 0 of 2 "
                                     "has a NULL name (3 heads)") == 0);
    testing_release_errors();
    CHECK(ftell(f) == 0);
    fclose(f);
}

static void test_weights_that_are_not_4d_are_an_error(void) {
    ag_tensor *w = ag_tensor_zeros(AG_F64, 3, (int[]){2, 4, 4});
    ag_head_stats st[2];
    testing_catch_errors();
    CHECK(!ag_attention_head_stats(w, st));
    CHECK(strcmp(testing_last_error,
                 "attention_head_stats: weights f64 [2,4,4] must be f32 or f64 [B, h, T, S]") == 0);
    testing_release_errors();
    ag_tensor_free(w);
}

// Weights without data (a gradient view no backward has reached) gave true, NaN stats and
// one error line per element read: now one line and false.
static void test_weights_without_data_are_one_error(void) {
    ag_tensor *w = ag_tensor_zeros(AG_F64, 4, (int[]){1, 2, 3, 3});
    ag_tensor view = ag_tensor_grad_view(w);
    ag_head_stats st[2];
    testing_catch_errors();
    CHECK(!ag_attention_head_stats(&view, st));
    CHECK(testing_error_was("attention_head_stats: weights [1,2,3,3] have no data (a gradient "
                            "view no backward has reached)"));
    testing_release_errors();
    ag_tensor_free(w);
}

// 4-D weights of an integer dtype: the message names the dtype, where "weights [1,2,3,3]
// must be float [B, h, T, S]" showed a shape that fits.
static void test_weights_of_an_integer_dtype_are_named_so(void) {
    ag_tensor *w = ag_tensor_zeros(AG_I32, 4, (int[]){1, 2, 3, 3});
    ag_head_stats st[2];
    testing_catch_errors();
    CHECK(!ag_attention_head_stats(w, st));
    CHECK(strcmp(testing_last_error,
                 "attention_head_stats: weights i32 [1,2,3,3] must be f32 or f64 [B, h, T, S]") ==
          0);
    testing_release_errors();
    ag_tensor_free(w);
}

int main(void) {
    RUN(test_known_heads_give_known_entropy_distance_and_strongest_pair);
    RUN(test_strongest_pair_is_averaged_over_the_batch);
    RUN(test_a_nan_weight_makes_its_heads_stats_nan_not_a_masked_row);
    RUN(test_table_has_a_line_per_head_and_the_importance_columns);
    RUN(test_a_null_importance_column_or_name_is_one_line);
    RUN(test_weights_that_are_not_4d_are_an_error);
    RUN(test_weights_without_data_are_one_error);
    RUN(test_weights_of_an_integer_dtype_are_named_so);
    return testing_summary();
}
