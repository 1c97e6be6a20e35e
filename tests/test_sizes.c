// Sizes that would wrap. Every public constructor refuses a shape whose bytes reach 2^64
// (numel * element size wraps around to a small number), reach 2^63 (a signed size turns
// negative), fall just below either, or pass AG_MAX_BYTES: one line naming the
// constructor and the shape, NULL, and not one byte allocated; never a tensor whose
// buffer is shorter than its shape. Nothing here allocates more than a few bytes.
#include <limits.h>
#include <stdlib.h>

#include "testing.h"

enum { N_SIZES = 3 };  // element sizes 1 (bool, u8), 4 (f32, i32), 8 (f64, i64)

// A shape of `elem`-byte elements whose bytes are 2^power - below.
typedef struct {
    int power;
    uint64_t below;
    int ndim;
    int shape[AG_MAX_DIMS];
} big_shape;

typedef struct {
    size_t elem;
    big_shape at_2_64, below_2_64, at_2_63, below_2_63;
} shapes_of_size;

static const shapes_of_size shapes[N_SIZES] = {
    {1,
     {64, 0, 4, {1 << 16, 1 << 16, 1 << 16, 1 << 16}},
     {64, 1, 4, {255, 164737, 65537, 6700417}},
     {63, 0, 4, {1 << 16, 1 << 16, 1 << 16, 1 << 15}},
     {63, 1, 4, {3577, 42799, 92737, 649657}}},
    {4,
     {64, 0, 3, {1 << 30, 1 << 30, 4}},
     {64, 4, 3, {3, 715827883, 2147483647}},
     {63, 0, 3, {1 << 30, 1 << 30, 2}},
     {63, 8, 3, {2, 1073741823, 1073741825}}},
    {8,
     {64, 0, 3, {1 << 30, 1 << 30, 2}},
     {64, 16, 3, {2, 1073741823, 1073741825}},
     {63, 0, 2, {1 << 30, 1 << 30}},
     {63, 8, 2, {1073741823, 1073741825}}},
};

// Exactly 2^power - below: the product modulo 2^64 says the low bits, its size in long
// double says which power of two it is near.
static bool has_its_bytes(size_t elem, const big_shape *s) {
    uint64_t low = elem;
    long double approx = (long double)elem;
    for (int i = 0; i < s->ndim; i++) {
        low *= (uint64_t)s->shape[i];
        approx *= s->shape[i];
    }
    long double power = s->power == 64 ? 18446744073709551616.0L : 9223372036854775808.0L;
    uint64_t expected = (s->power == 64 ? 0 : UINT64_C(1) << 63) - s->below;
    return low == expected && approx > 0.999L * power && approx <= power;
}

static void test_the_shapes_have_the_byte_counts_they_claim(void) {
    for (int k = 0; k < N_SIZES; k++) {
        const shapes_of_size *s = &shapes[k];
        CHECK(has_its_bytes(s->elem, &s->at_2_64));
        CHECK(has_its_bytes(s->elem, &s->below_2_64));
        CHECK(has_its_bytes(s->elem, &s->at_2_63));
        CHECK(has_its_bytes(s->elem, &s->below_2_63));
    }
}

// ---- Every constructor of a tensor from a shape ----------------------------------------

typedef struct {
    const char *name;  // as its messages name it
    bool floats_only;
    ag_tensor *(*make)(ag_dtype dt, int ndim, const int shape[]);
} constructor;

static ag_tape *tape;
static ag_params *stores[2];  // f32, f64: each holds "w" [1]
static ag_tensor *scalars[2];  // f32, f64: the input of the ops below
static const double some_data[8];

static ag_tensor *zeros(ag_dtype dt, int nd, const int s[]) { return ag_tensor_zeros(dt, nd, s); }
static ag_tensor *ones(ag_dtype dt, int nd, const int s[]) { return ag_tensor_ones(dt, nd, s); }
static ag_tensor *from(ag_dtype dt, int nd, const int s[]) {
    return ag_tensor_from(dt, nd, s, some_data);
}
static ag_tensor *uniform(ag_dtype dt, int nd, const int s[]) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    return ag_tensor_uniform(dt, nd, s, &rng, -1, 1);
}
static ag_tensor *normal(ag_dtype dt, int nd, const int s[]) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    return ag_tensor_normal(dt, nd, s, &rng, 0, 1);
}
static ag_tensor *tape_tensor(ag_dtype dt, int nd, const int s[]) {
    return ag_tape_tensor(tape, dt, nd, s);
}
static ag_tensor *params_add(ag_dtype dt, int nd, const int s[]) {
    return ag_params_add(stores[dt == AG_F64], "big", nd, s);
}
static ag_tensor *params_resize(ag_dtype dt, int nd, const int s[]) {
    ag_params *ps = stores[dt == AG_F64];
    ag_tensor *w = ag_params_find(ps, "w");
    return ag_params_resize(ps, w, nd, s, some_data) ? w : NULL;
}
// Ops that make their output's shape from a shape they are given.
static ag_tensor *expand(ag_dtype dt, int nd, const int s[]) {
    return ag_expand(tape, scalars[dt == AG_F64], nd, s);
}
static void never_runs(ag_node *n) {
    (void)n;
    abort();  // the output is refused before any forward runs
}
static const ag_op my_op = {"my_op", never_runs, NULL, NULL};
static ag_tensor *apply(ag_dtype dt, int nd, const int s[]) {
    return ag_op_apply(tape, &my_op, 1, &scalars[dt == AG_F64], nd, s, NULL, 0);
}

static const constructor constructors[] = {
    {"tensor_zeros", false, zeros},
    {"tensor_ones", false, ones},
    {"tensor_from", false, from},
    {"tensor_uniform", true, uniform},
    {"tensor_normal", true, normal},
    {"tape_tensor", false, tape_tensor},
    {"params_add", true, params_add},
    {"params_resize", true, params_resize},
    {"expand", true, expand},
    {"my_op", true, apply},
};

static const ag_dtype dtypes[] = {AG_F32, AG_F64, AG_BOOL, AG_U8, AG_I32, AG_I64};

static void setup(void) {
    tape = ag_tape_new();
    for (int k = 0; k < 2; k++) {
        stores[k] = ag_params_new(k ? AG_F64 : AG_F32);
        ag_params_add(stores[k], "w", 1, (int[]){1});
        scalars[k] = ag_tape_tensor(tape, k ? AG_F64 : AG_F32, 0, NULL);
    }
}

static void teardown(void) {
    ag_tape_free(tape);
    for (int k = 0; k < 2; k++) ag_params_free(stores[k]);
}

static const char *shape_text(int ndim, const int shape[]) {
    static char text[64];
    snprintf(text, sizeof text, "[");
    for (int i = 0; i < ndim; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), i ? ",%d" : "%d", shape[i]);
    strcat(text, "]");
    return text;
}

// `ctor` given `shape`: NULL, one line naming it and the shape, nothing allocated.
static bool refuses(const constructor *ctor, ag_dtype dt, int ndim, const int shape[]) {
    char expected[256];
    snprintf(expected, sizeof expected,
             "%s: %s %s is too large: more than the 2^48 bytes one tensor may hold", ctor->name,
             ag_dtype_name(dt), shape_text(ndim, shape));
    testing_error_count = 0;
    testing_last_error[0] = 0;
    ag_memory_stats before = ag_memory_usage();
    ag_tensor *t = ctor->make(dt, ndim, shape);
    ag_memory_stats after = ag_memory_usage();
    bool ok = t == NULL && testing_error_count == 1 && strcmp(testing_last_error, expected) == 0 &&
              after.allocations == before.allocations;
    if (!ok)
        fprintf(stderr, "  %s %s %s: got %s, %d errors, %llu allocations: %s\n", ctor->name,
                ag_dtype_name(dt), shape_text(ndim, shape), t ? "a tensor" : "NULL",
                testing_error_count,
                (unsigned long long)(after.allocations - before.allocations), testing_last_error);
    return ok;
}

static const shapes_of_size *shapes_for(ag_dtype dt) {
    size_t e = ag_dtype_size(dt);
    return &shapes[e == 1 ? 0 : e == 4 ? 1 : 2];
}

// Every constructor, every dtype it takes, the shape `pick` chooses for its element size.
static void every_constructor_refuses(const big_shape *(*pick)(const shapes_of_size *)) {
    setup();
    testing_catch_errors();
    for (size_t c = 0; c < sizeof constructors / sizeof *constructors; c++)
        for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
            if (constructors[c].floats_only && dtypes[d] != AG_F32 && dtypes[d] != AG_F64)
                continue;
            const big_shape *s = pick(shapes_for(dtypes[d]));
            CHECK(refuses(&constructors[c], dtypes[d], s->ndim, s->shape));
        }
    testing_release_errors();
    teardown();
}

static const big_shape *at_2_64(const shapes_of_size *s) { return &s->at_2_64; }
static const big_shape *below_2_64(const shapes_of_size *s) { return &s->below_2_64; }
static const big_shape *at_2_63(const shapes_of_size *s) { return &s->at_2_63; }
static const big_shape *below_2_63(const shapes_of_size *s) { return &s->below_2_63; }

static void test_every_constructor_refuses_shapes_of_2_64_bytes(void) {
    every_constructor_refuses(at_2_64);
}
static void test_every_constructor_refuses_shapes_just_below_2_64_bytes(void) {
    every_constructor_refuses(below_2_64);
}
static void test_every_constructor_refuses_shapes_of_2_63_bytes(void) {
    every_constructor_refuses(at_2_63);
}
static void test_every_constructor_refuses_shapes_just_below_2_63_bytes(void) {
    every_constructor_refuses(below_2_63);
}
// Just past AG_MAX_BYTES, and the largest shape there is ((2^31 - 1)^4 elements).
static void test_every_constructor_refuses_shapes_past_the_limit(void) {
    const int m = INT_MAX;
    CHECK(AG_MAX_BYTES == (size_t)1 << 48);
    setup();
    testing_catch_errors();
    for (size_t c = 0; c < sizeof constructors / sizeof *constructors; c++)
        for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++) {
            ag_dtype dt = dtypes[d];
            if (constructors[c].floats_only && dt != AG_F32 && dt != AG_F64) continue;
            int n = (int)(AG_MAX_BYTES / ag_dtype_size(dt) >> 24);  // n * 2^24 elements fill it
            CHECK(refuses(&constructors[c], dt, 2, (int[]){n, (1 << 24) + 1}));
            CHECK(refuses(&constructors[c], dt, 4, (int[]){m, m, m, m}));
        }
    testing_release_errors();
    teardown();
}

// Exactly AG_MAX_BYTES is within the limit and one element more is past it, both where the
// running product of the check and the next extent are below 2^32 (f32 [2^23, 2^23]: their
// product is compared) and where the product is not ([2^22, 2^22, 4]: 2^46 bytes times 4,
// the general division). Reshape reports a size within the limit by its element count.
static void test_the_limit_itself_is_allowed_and_one_more_element_is_not(void) {
    const int e22 = 1 << 22, e23 = 1 << 23;
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(tp, AG_F32, 1, (int[]){4});
    testing_catch_errors();
    CHECK(ag_reshape(tp, x, 2, (int[]){e23, e23}) == NULL);
    CHECK(testing_error_was("reshape: cannot reshape [4] (4 elements) to [8388608,8388608] "
                            "(70368744177664 elements)"));
    CHECK(ag_reshape(tp, x, 2, (int[]){e23, e23 + 1}) == NULL);
    CHECK(testing_error_was("reshape: f32 [8388608,8388609] is too large: more than the 2^48 "
                            "bytes one tensor may hold"));
    CHECK(ag_reshape(tp, x, 3, (int[]){e22, e22, 4}) == NULL);
    CHECK(testing_error_was("reshape: cannot reshape [4] (4 elements) to [4194304,4194304,4] "
                            "(70368744177664 elements)"));
    CHECK(ag_reshape(tp, x, 3, (int[]){e22, e22, 5}) == NULL);
    CHECK(testing_error_was("reshape: f32 [4194304,4194304,5] is too large: more than the "
                            "2^48 bytes one tensor may hold"));
    testing_release_errors();
    ag_tape_free(tp);
}

// [20, 48448661, 49477, 384773] has 2^64 + 4 elements: a numel that wraps is 4, which
// would let a reshape of 4 elements through and make a tensor of 4 bytes that claims it.
static void test_a_shape_whose_numel_wraps_to_a_small_number_is_refused(void) {
    const int wraps[] = {20, 48448661, 49477, 384773};
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(tp, AG_F32, 1, (int[]){4});
    testing_catch_errors();
    CHECK(ag_reshape(tp, x, 4, wraps) == NULL);
    CHECK(testing_error_was("reshape: f32 [20,48448661,49477,384773] is too large: more than "
                            "the 2^48 bytes one tensor may hold"));
    CHECK(ag_tensor_zeros(AG_U8, 4, wraps) == NULL);
    CHECK(testing_error_was("tensor_zeros: u8 [20,48448661,49477,384773] is too large: more "
                            "than the 2^48 bytes one tensor may hold"));
    testing_release_errors();
    ag_tape_free(tp);
}

// A refused shape is named as printf would write it, digit for digit, the largest extent
// included (shapes are written by hand, not by printf, which decode steps paid for).
static void test_a_refused_shape_is_named_digit_for_digit(void) {
    testing_catch_errors();
    CHECK(ag_tensor_zeros(AG_F32, 4, (int[]){10, 1000, 109, INT_MAX}) == NULL);
    CHECK(testing_error_was("tensor_zeros: f32 [10,1000,109,2147483647] is too large: more than "
                            "the 2^48 bytes one tensor may hold"));
    CHECK(ag_tensor_zeros(AG_U8, 1, (int[]){0}) == NULL);
    CHECK(testing_error_was("tensor_zeros: dimension 0 has extent 0, extents must be >= 1"));
    testing_release_errors();
}

// An embedding's output [*ids shape, E] is checked before a single id is read.
static void test_embedding_refuses_an_output_too_large_before_reading_ids(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = ag_tape_tensor(tp, AG_F32, 2, (int[]){2, 8});
    const int32_t one_id[1] = {0};  // far fewer than the shape says: never read
    testing_catch_errors();
    // 2^44 ids fit in 2^46 bytes; their 2^44 rows of 8 floats do not.
    CHECK(ag_embedding(tp, w, one_id, 2, (int[]){1 << 22, 1 << 22}) == NULL);
    CHECK(testing_error_was("embedding: f32 [4194304,4194304,8] is too large: more than the "
                            "2^48 bytes one tensor may hold"));
    CHECK(ag_embedding(tp, w, one_id, 2, (int[]){1 << 30, 1 << 30}) == NULL);
    CHECK(testing_error_was("embedding: i32 [1073741824,1073741824] is too large: more than "
                            "the 2^48 bytes one tensor may hold"));
    testing_release_errors();
    ag_tape_free(tp);
}

static void test_tape_alloc_refuses_more_than_the_limit(void) {
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(ag_tape_alloc(tp, SIZE_MAX) == NULL);
    CHECK(testing_error_was("tape_alloc: 18446744073709551615 bytes requested, more than the "
                            "2^48 one allocation may take"));
    CHECK(ag_tape_alloc(tp, AG_MAX_BYTES + 1) == NULL);
    CHECK(testing_error_was("tape_alloc: 281474976710657 bytes requested, more than the 2^48 "
                            "one allocation may take"));
    CHECK(ag_tape_alloc(tp, 100) != NULL);
    testing_release_errors();
    ag_tape_free(tp);
}

// The bytes of an op's own parameters, which ag_op_apply copies into the tape.
static void test_apply_refuses_params_larger_than_the_limit(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(tp, AG_F32, 1, (int[]){2});
    const char params[8] = {0};  // far fewer than params_size says: never read
    testing_catch_errors();
    CHECK(ag_op_apply(tp, &my_op, 1, &x, 1, (int[]){2}, params, SIZE_MAX) == NULL);
    CHECK(testing_error_was("my_op: params_size 18446744073709551615 is more than the 2^48 "
                            "bytes one allocation may take"));
    testing_release_errors();
    ag_tape_free(tp);
}

// batch * max_len * E * 4 bytes = 2^30 * 2^30 * 4 * 4 = 2^64: wrapped, a cache of no keys.
static void test_kv_cache_refuses_buffers_whose_bytes_wrap(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    ag_mha m;
    CHECK(ag_mha_init(&m, ps, "", &(ag_mha_config){.embed_dim = 4, .num_heads = 2}, &rng));
    testing_catch_errors();
    ag_memory_stats before = ag_memory_usage();
    CHECK(ag_kv_cache_new(&m, 1 << 30, 1 << 30) == NULL);
    CHECK(ag_memory_usage().allocations == before.allocations);
    CHECK(testing_error_was("kv_cache: batch 1073741824 x max_len 1073741824 of f32 width 4 "
                            "(feed-forward 0) is too large: more than the 2^48 bytes one buffer "
                            "may take"));
    testing_release_errors();
    ag_kv_cache *c = ag_kv_cache_new(&m, 2, 8);
    CHECK(c != NULL);
    ag_kv_cache_free(c);
    ag_params_free(ps);
}

// Below the limit nothing changes: the same constructors make ordinary tensors.
static void test_ordinary_shapes_are_still_made(void) {
    setup();
    for (size_t c = 0; c < sizeof constructors / sizeof *constructors; c++) {
        if (constructors[c].make == apply) continue;  // its op has no forward
        ag_tensor *t = constructors[c].make(AG_F32, 2, (int[]){2, 1});
        CHECK(t != NULL && t->numel == 2);
        ag_tensor_free(t);  // only heap tensors are freed; the others belong to tape or store
    }
    teardown();
}

int main(void) {
    RUN(test_the_shapes_have_the_byte_counts_they_claim);
    RUN(test_every_constructor_refuses_shapes_of_2_64_bytes);
    RUN(test_every_constructor_refuses_shapes_just_below_2_64_bytes);
    RUN(test_every_constructor_refuses_shapes_of_2_63_bytes);
    RUN(test_every_constructor_refuses_shapes_just_below_2_63_bytes);
    RUN(test_every_constructor_refuses_shapes_past_the_limit);
    RUN(test_the_limit_itself_is_allowed_and_one_more_element_is_not);
    RUN(test_a_shape_whose_numel_wraps_to_a_small_number_is_refused);
    RUN(test_embedding_refuses_an_output_too_large_before_reading_ids);
    RUN(test_tape_alloc_refuses_more_than_the_limit);
    RUN(test_apply_refuses_params_larger_than_the_limit);
    RUN(test_kv_cache_refuses_buffers_whose_bytes_wrap);
    RUN(test_ordinary_shapes_are_still_made);
    RUN(test_a_refused_shape_is_named_digit_for_digit);
    return testing_summary();
}
