// The storage dtypes u8, i32 and i64: created, read, written, converted and
// printed like the others, but never differentiated.
#include <stdlib.h>

#include "testing.h"

static void test_names_and_sizes(void) {
    CHECK(strcmp(ag_dtype_name(AG_U8), "u8") == 0 && ag_dtype_size(AG_U8) == 1);
    CHECK(strcmp(ag_dtype_name(AG_I32), "i32") == 0 && ag_dtype_size(AG_I32) == 4);
    CHECK(strcmp(ag_dtype_name(AG_I64), "i64") == 0 && ag_dtype_size(AG_I64) == 8);
    CHECK(strcmp(ag_dtype_name(AG_BOOL), "bool") == 0 && ag_dtype_size(AG_BOOL) == 1);
    CHECK(strcmp(ag_dtype_name(AG_F32), "f32") == 0 && ag_dtype_size(AG_F32) == 4);
    CHECK(strcmp(ag_dtype_name(AG_F64), "f64") == 0 && ag_dtype_size(AG_F64) == 8);
    CHECK(ag_dtype_size((ag_dtype)99) == 0 && strcmp(ag_dtype_name((ag_dtype)99), "?") == 0);
    CHECK(ag_dtype_size((ag_dtype)6) == 0 && strcmp(ag_dtype_name((ag_dtype)6), "?") == 0);
    CHECK(ag_dtype_size((ag_dtype)-1) == 0 && strcmp(ag_dtype_name((ag_dtype)-1), "?") == 0);
    // The existing values are kept: files and code that stored them stay valid.
    CHECK(AG_F32 == 0 && AG_F64 == 1 && AG_BOOL == 2);
}

static void test_from_keeps_integers_exactly(void) {
    const int64_t big[3] = {INT64_MIN, (int64_t)1 << 60 | 1, INT64_MAX};
    ag_tensor *t = ag_tensor_from(AG_I64, 1, (int[]){3}, big);
    CHECK(memcmp(t->data, big, sizeof big) == 0);
    CHECK(ag_tensor_item(t, 1) == (double)((int64_t)1 << 60));  // get rounds beyond 2^53
    ag_tensor_free(t);
    const int32_t small[2] = {INT32_MIN, -7};
    t = ag_tensor_from(AG_I32, 1, (int[]){2}, small);
    CHECK(ag_tensor_item(t, 0) == INT32_MIN && ag_tensor_item(t, 1) == -7);
    ag_tensor_free(t);
}

static void test_set_truncates_toward_zero_and_saturates(void) {
    ag_tensor *u8 = ag_tensor_zeros(AG_U8, 1, (int[]){6});
    ag_tensor *i32 = ag_tensor_zeros(AG_I32, 1, (int[]){6});
    ag_tensor *i64 = ag_tensor_zeros(AG_I64, 1, (int[]){6});
    const double v[6] = {2.9, -2.9, 1e300, -1e300, NAN, 255.5};
    for (size_t i = 0; i < 6; i++) {
        ag_tensor_set_item(u8, i, v[i]);
        ag_tensor_set_item(i32, i, v[i]);
        ag_tensor_set_item(i64, i, v[i]);
    }
    const uint8_t *a = u8->data;
    const int32_t *b = i32->data;
    const int64_t *c = i64->data;
    CHECK(a[0] == 2 && a[1] == 0 && a[2] == 255 && a[3] == 0 && a[4] == 0 && a[5] == 255);
    CHECK(b[0] == 2 && b[1] == -2 && b[2] == INT32_MAX && b[3] == INT32_MIN && b[4] == 0 &&
          b[5] == 255);
    CHECK(c[0] == 2 && c[1] == -2 && c[2] == INT64_MAX && c[3] == INT64_MIN && c[4] == 0 &&
          c[5] == 255);
    ag_tensor_set_item(i64, 0, 0x1p63);  // 2^63 itself does not fit
    ag_tensor_set_item(i64, 1, -0x1p63);
    CHECK(c[0] == INT64_MAX && c[1] == INT64_MIN);
    ag_tensor_free(u8);
    ag_tensor_free(i32);
    ag_tensor_free(i64);
}

static void test_convert_between_float_and_integer(void) {
    ag_tensor *f = ag_tensor_from(AG_F32, 1, (int[]){3}, (float[]){1.75f, -3.5f, 40000.f});
    ag_tensor *i = ag_tensor_convert(f, AG_I32);
    ag_tensor *u = ag_tensor_convert(f, AG_U8);
    CHECK(i && ((int32_t *)i->data)[0] == 1 && ((int32_t *)i->data)[1] == -3 &&
          ((int32_t *)i->data)[2] == 40000);
    CHECK(u && ((uint8_t *)u->data)[0] == 1 && ((uint8_t *)u->data)[1] == 0 &&
          ((uint8_t *)u->data)[2] == 255);
    ag_tensor *back = ag_tensor_convert(i, AG_F64);
    CHECK(back && ag_tensor_f64(back)[1] == -3.0);
    ag_tensor_free(f);
    ag_tensor_free(i);
    ag_tensor_free(u);
    ag_tensor_free(back);
}

// torch 1.13: torch.tensor([2**60 + 2**36 + 1, ...], dtype=torch.int64).float(). Each i64
// rounds once to the nearest float; through a double, 2^60 + 2^36 + 1 became 2^60 + 2^36,
// a tie that then went to even, 2^60.
static void test_i64_to_f32_rounds_once(void) {
    const int64_t v[4] = {((int64_t)1 << 60) + ((int64_t)1 << 36) + 1,
                          -(((int64_t)1 << 60) + ((int64_t)1 << 36) + 1),
                          ((int64_t)1 << 53) + 1, 9007199791611905};
    const int64_t want[4] = {1152921642045800448, -1152921642045800448, 9007199254740992,
                             9007200328482816};
    ag_tensor *t = ag_tensor_from(AG_I64, 1, (int[]){4}, v);
    ag_tensor *f = ag_tensor_convert(t, AG_F32);
    ag_tensor *g = ag_tensor_zeros(AG_F32, 1, (int[]){4});
    ag_tensor_copy(g, t);
    for (int i = 0; i < 4; i++) {
        CHECK(f && (double)ag_tensor_f32(f)[i] == (double)want[i]);
        CHECK((double)ag_tensor_f32(g)[i] == (double)want[i]);
    }
    ag_tensor_free(t);
    ag_tensor_free(f);
    ag_tensor_free(g);
}

static void test_storage_dtypes_cannot_require_grad_or_enter_ops(void) {
    testing_catch_errors();
    ag_tensor *t = ag_tensor_zeros(AG_I64, 1, (int[]){2});
    ag_tensor_set_requires_grad(t, true);
    CHECK(!t->requires_grad);
    CHECK(strstr(testing_last_error, "set_requires_grad: a i64 tensor [2] cannot require grad"));
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_I32, 1, (int[]){2});
    testing_last_error[0] = 0;
    CHECK(ag_add(tp, x, x) == NULL);
    CHECK(strstr(testing_last_error, "i32") != NULL);
    ag_tape_free(tp);
    ag_tensor_free(t);
    ag_tensor_free(x);
    testing_release_errors();
}

static void test_integer_tensors_print_exactly(void) {
    const int64_t v[2] = {INT64_MAX, -5};
    ag_tensor *t = ag_tensor_from(AG_I64, 1, (int[]){2}, v);
    char buf[256] = {0};
    FILE *f = tmpfile();
    ag_tensor_print(t, f);
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    CHECK(strstr(buf, "i64 [2]") && strstr(buf, "[9223372036854775807 -5]"));
    ag_tensor_free(t);
}

int main(void) {
    RUN(test_names_and_sizes);
    RUN(test_from_keeps_integers_exactly);
    RUN(test_set_truncates_toward_zero_and_saturates);
    RUN(test_convert_between_float_and_integer);
    RUN(test_i64_to_f32_rounds_once);
    RUN(test_storage_dtypes_cannot_require_grad_or_enter_ops);
    RUN(test_integer_tensors_print_exactly);
    return testing_summary();
}
