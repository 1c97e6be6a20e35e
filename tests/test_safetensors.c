// safetensors: what is written (byte for byte), what reads back, every rule
// a file must satisfy (each with a hand-made bad file and the message it
// gets), and that truncated or corrupted files never crash the reader.
#define _POSIX_C_SOURCE 200809L

#include "attograd/io.h"

#include <errno.h>
#include <stdint.h>

#include "testing.h"
#include "testing_files.h"

// ---- Helpers --------------------------------------------------------------------------

// A file image: 8-byte little-endian length, the header as given, the data.
static unsigned char image[1 << 16];

static size_t make_image_n(const char *header, size_t n, const void *data, size_t data_len) {
    for (int i = 0; i < 8; i++) image[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(image + 8, header, n);
    if (data_len) memcpy(image + 8 + n, data, data_len);
    return 8 + n + data_len;
}

static size_t make_image(const char *header, const void *data, size_t data_len) {
    return make_image_n(header, strlen(header), data, data_len);
}

static bool has_bytes(const unsigned char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return true;
    return false;
}

static bool contains(const char *s, const char *part) {
    if (strstr(s, part)) return true;
    fprintf(stderr, "  message \"%s\"\n  lacks   \"%s\"\n", s, part);
    return false;
}

// Loading the image, from a file and from memory, fails; the message starts
// with the file's name and contains `part`.
static bool image_fails_with(size_t n, const char *part) {
    const char *path = testing_path("bad.safetensors");
    testing_write_file(path, image, n);
    ag_err err = {{0}};
    ag_safetensors *st = ag_safetensors_load(path, &err);
    if (st) {
        fprintf(stderr, "  loaded although it should fail with \"%s\"\n", part);
        ag_safetensors_free(st);
        return false;
    }
    bool ok = strncmp(err.msg, path, strlen(path)) == 0 && err.msg[strlen(path)] == ':';
    if (!ok) fprintf(stderr, "  message \"%s\" does not start with the path\n", err.msg);
    ok = contains(err.msg, part) && ok;
    if (getenv("AG_TEST_VERBOSE")) fprintf(stderr, "  %s\n", err.msg);
    ag_err err2 = {{0}};
    st = ag_safetensors_load_buffer(image, n, "bad.safetensors", &err2);
    ok = !st && strcmp(err2.msg, err.msg + strlen(path) - strlen("bad.safetensors")) == 0 && ok;
    ag_safetensors_free(st);
    return ok;
}

static bool header_fails_with(const char *header, size_t data_len, const char *part) {
    static const unsigned char zeros[4096];
    return image_fails_with(make_image(header, zeros, data_len), part);
}

static ag_tensor *tensor_of(ag_dtype dt, int ndim, const int shape[], const void *data) {
    return ag_tensor_from(dt, ndim, shape, data);
}

static void add(ag_safetensors *st, const char *name, ag_tensor *t) {
    ag_err err;
    CHECK(ag_safetensors_add(st, name, t, &err) == 0);
    ag_tensor_free(t);
}

static bool same_tensor(const ag_tensor *a, const ag_tensor *b) {
    return a && b && a->dtype == b->dtype && ag_tensor_same_shape(a, b) &&
           memcmp(a->data, b->data, a->numel * ag_dtype_size(a->dtype)) == 0;
}

// A set with every dtype, a scalar, a 4-D tensor, awkward values and metadata.
static ag_safetensors *sample_set(void) {
    ag_safetensors *st = ag_safetensors_new();
    const float f32[6] = {0.0f, -0.0f, 1.5f, INFINITY, -1e-45f, 3.4028235e38f};
    const double f64[4] = {NAN, -INFINITY, 1e-310, 0.1};
    const uint8_t b[4] = {1, 0, 0, 1}, u8[5] = {0, 1, 127, 128, 255};
    const int32_t i32[6] = {INT32_MIN, -1, 0, 1, 2, INT32_MAX};
    const int64_t i64[2] = {INT64_MIN, INT64_MAX};
    const float scalar = 42.25f;
    double four[12];
    for (int i = 0; i < 12; i++) four[i] = i * 0.25 - 1;
    add(st, "layer.weight", tensor_of(AG_F32, 2, (int[]){2, 3}, f32));
    add(st, "layer.bias", tensor_of(AG_F64, 1, (int[]){4}, f64));
    add(st, "mask", tensor_of(AG_BOOL, 2, (int[]){2, 2}, b));
    add(st, "bytes", tensor_of(AG_U8, 1, (int[]){5}, u8));
    add(st, "ids", tensor_of(AG_I32, 3, (int[]){3, 1, 2}, i32));
    add(st, "step", tensor_of(AG_I64, 1, (int[]){2}, i64));
    add(st, "temperature", tensor_of(AG_F32, 0, NULL, &scalar));
    add(st, "kernel", tensor_of(AG_F64, 4, (int[]){2, 1, 3, 2}, four));
    ag_err err;
    CHECK(ag_safetensors_set_meta(st, "format", "pt", &err) == 0);
    CHECK(ag_safetensors_set_meta(st, "note", "quote\" tab\t caf\xc3\xa9 \xf0\x9f\x98\x80", &err) ==
          0);
    return st;
}

// ---- Round trips and the exact bytes written ----------------------------------------------

static void test_round_trip_keeps_every_dtype_shape_and_value(void) {
    ag_safetensors *st = sample_set();
    const char *path = testing_path("sample.safetensors");
    ag_err err = {{0}};
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors *back = ag_safetensors_load(path, &err);
    CHECK(back != NULL);
    if (!back) {
        fprintf(stderr, "  %s\n", err.msg);
        ag_safetensors_free(st);
        return;
    }
    CHECK(ag_safetensors_count(back) == 8);
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const char *name = ag_safetensors_name(st, i);
        CHECK(strcmp(ag_safetensors_name(back, i), name) == 0);
        CHECK(same_tensor(ag_safetensors_find(back, name), ag_safetensors_find(st, name)));
    }
    const ag_tensor *t = ag_safetensors_find(back, "temperature");
    CHECK(t && t->ndim == 0 && t->numel == 1 && ag_tensor_item(t, 0) == 42.25);
    t = ag_safetensors_find(back, "kernel");
    CHECK(t && t->ndim == 4 && t->shape[0] == 2 && t->shape[3] == 2 && t->numel == 12);
    CHECK(ag_safetensors_meta_count(back) == 2);
    CHECK(strcmp(ag_safetensors_meta(back, "format"), "pt") == 0);
    CHECK(strcmp(ag_safetensors_meta(back, "note"),
                 "quote\" tab\t caf\xc3\xa9 \xf0\x9f\x98\x80") == 0);
    ag_safetensors_free(back);
    ag_safetensors_free(st);
}

static void test_header_is_byte_exact_for_a_small_case(void) {
    // The reference implementation's own serialization cases: "attn.0" fills
    // 64 bytes exactly; "attn0" (4-D) needs 7 spaces to reach 72.
    const float v[6] = {0, 1, 2, 3, 4, 5};
    const char *cases[2][2] = {
        {"attn.0", "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}"},
        {"attn0", "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       "}};
    for (int c = 0; c < 2; c++) {
        ag_safetensors *st = ag_safetensors_new();
        add(st, cases[c][0], c == 0 ? tensor_of(AG_F32, 3, (int[]){1, 2, 3}, v)
                                    : tensor_of(AG_F32, 4, (int[]){1, 1, 2, 3}, v));
        const char *path = testing_path("exact.safetensors");
        ag_err err;
        CHECK(ag_safetensors_save(st, path, &err) == 0);
        size_t n;
        unsigned char *bytes = testing_read_file(path, &n);
        size_t expect_n = make_image(cases[c][1], v, sizeof v);
        CHECK(bytes && n == expect_n && memcmp(bytes, image, n) == 0);
        CHECK(bytes && bytes[0] == (c == 0 ? 64 : 72) && bytes[1] == 0);
        free(bytes);
        ag_safetensors_free(st);
    }
}

static void test_empty_and_metadata_only_sets_pad_to_eight(void) {
    ag_safetensors *st = ag_safetensors_new();
    const char *path = testing_path("empty.safetensors");
    ag_err err;
    size_t n;
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    unsigned char *bytes = testing_read_file(path, &n);
    CHECK(bytes && n == make_image("{}      ", NULL, 0) && memcmp(bytes, image, n) == 0);
    free(bytes);
    CHECK(ag_safetensors_set_meta(st, "framework", "pt", &err) == 0);
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    bytes = testing_read_file(path, &n);
    CHECK(bytes && n == make_image("{\"__metadata__\":{\"framework\":\"pt\"}}     ", NULL, 0) &&
          memcmp(bytes, image, n) == 0);
    free(bytes);
    ag_safetensors_free(st);
    ag_safetensors *back = ag_safetensors_load(path, &err);
    CHECK(back && ag_safetensors_count(back) == 0 && ag_safetensors_meta_count(back) == 1);
    ag_safetensors_free(back);
}

static void test_tensors_are_ordered_by_dtype_alignment_then_name(void) {
    ag_safetensors *st = ag_safetensors_new();
    const int64_t zeros[3] = {0, 0, 0};
    add(st, "a_bool", tensor_of(AG_BOOL, 1, (int[]){3}, zeros));
    add(st, "b_f32", tensor_of(AG_F32, 1, (int[]){1}, zeros));
    add(st, "c_i64", tensor_of(AG_I64, 1, (int[]){1}, zeros));
    add(st, "d_u8", tensor_of(AG_U8, 1, (int[]){1}, zeros));
    add(st, "e_f64", tensor_of(AG_F64, 1, (int[]){1}, zeros));
    add(st, "f_i32", tensor_of(AG_I32, 1, (int[]){1}, zeros));
    add(st, "a_f32", tensor_of(AG_F32, 1, (int[]){3}, zeros));
    const char *path = testing_path("order.safetensors");
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    size_t n;
    unsigned char *bytes = testing_read_file(path, &n);
    const char *expect =
        "{\"c_i64\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
        "\"e_f64\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
        "\"a_f32\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[16,28]},"
        "\"b_f32\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[28,32]},"
        "\"f_i32\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[32,36]},"
        "\"d_u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[36,37]},"
        "\"a_bool\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[37,40]}}";
    size_t len = strlen(expect), padded = (len + 7) / 8 * 8;
    CHECK(bytes && n == 8 + padded + 40);
    CHECK(bytes && bytes[0] + 256u * bytes[1] == padded && memcmp(bytes + 8, expect, len) == 0);
    for (size_t i = len; bytes && i < padded; i++) CHECK(bytes[8 + i] == ' ');
    free(bytes);
    ag_safetensors_free(st);
}

static void test_names_are_escaped_as_json_and_read_back(void) {
    const char *name = "we\"ird\\name\n\x01 caf\xc3\xa9";
    ag_safetensors *st = ag_safetensors_new();
    const float one = 1;
    add(st, name, tensor_of(AG_F32, 0, NULL, &one));
    const char *path = testing_path("escaped.safetensors");
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    size_t n;
    unsigned char *bytes = testing_read_file(path, &n);
    const char *quoted = "\"we\\\"ird\\\\name\\n\\u0001 caf\xc3\xa9\"";
    CHECK(bytes && n > 8 && has_bytes(bytes + 8, n - 8, quoted));
    free(bytes);
    ag_safetensors *back = ag_safetensors_load(path, &err);
    CHECK(back && ag_safetensors_find(back, name) != NULL);
    ag_safetensors_free(back);
    ag_safetensors_free(st);
}

static void test_reader_accepts_any_order_whitespace_and_escapes(void) {
    // Pretty-printed, metadata last, entries out of offset order, escaped
    // names (one a surrogate pair), padding with newlines.
    const char *header =
        "{\n  \"b\\u00e9\" : {\"data_offsets\": [8, 12], \"shape\": [ ], \"dtype\": \"I32\"},\n"
        "  \"\\ud83d\\ude00\\/x\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]},\n"
        "  \"__metadata__\": {\"k\": \"v\\n\"}\n}\n\n\n";
    unsigned char data[12];
    const double d = -2.5;
    const int32_t i = -7;
    memcpy(data, &d, 8);
    memcpy(data + 8, &i, 4);
    size_t n = make_image(header, data, sizeof data);
    ag_err err = {{0}};
    ag_safetensors *st = ag_safetensors_load_buffer(image, n, "pretty", &err);
    CHECK(st != NULL);
    if (!st) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    const ag_tensor *a = ag_safetensors_find(st, "b\xc3\xa9");
    const ag_tensor *b = ag_safetensors_find(st, "\xf0\x9f\x98\x80/x");
    CHECK(a && a->dtype == AG_I32 && a->ndim == 0 && ag_tensor_item(a, 0) == -7);
    CHECK(b && b->dtype == AG_F64 && b->ndim == 1 && ag_tensor_item(b, 0) == -2.5);
    CHECK(strcmp(ag_safetensors_meta(st, "k"), "v\n") == 0);
    CHECK(ag_safetensors_meta(st, "absent") == NULL && ag_safetensors_find(st, "absent") == NULL);
    ag_safetensors_free(st);
}

// ---- The set's own API -----------------------------------------------------------------------

static void test_set_keeps_names_and_metadata_sorted(void) {
    ag_safetensors *st = ag_safetensors_new();
    const float v = 0;
    const char *names[] = {"zeta", "alpha", "mid", "Beta"};
    for (int i = 0; i < 4; i++) add(st, names[i], tensor_of(AG_F32, 0, NULL, &v));
    CHECK(ag_safetensors_count(st) == 4);
    CHECK(strcmp(ag_safetensors_name(st, 0), "Beta") == 0);  // byte order: 'B' < 'a'
    CHECK(strcmp(ag_safetensors_name(st, 1), "alpha") == 0);
    CHECK(strcmp(ag_safetensors_name(st, 3), "zeta") == 0);
    CHECK(ag_safetensors_name(st, 4) == NULL && ag_safetensors_name(st, -1) == NULL);
    CHECK(ag_safetensors_at(st, 2) == ag_safetensors_find(st, "mid"));
    CHECK(strcmp(ag_safetensors_at(st, 2)->name, "mid") == 0);
    ag_err err;
    CHECK(ag_safetensors_set_meta(st, "b", "1", &err) == 0);
    CHECK(ag_safetensors_set_meta(st, "a", "2", &err) == 0);
    CHECK(ag_safetensors_set_meta(st, "b", "3", &err) == 0);  // replaces
    CHECK(ag_safetensors_meta_count(st) == 2);
    CHECK(strcmp(ag_safetensors_meta_key(st, 0), "a") == 0);
    CHECK(strcmp(ag_safetensors_meta_value(st, 1), "3") == 0);
    CHECK(ag_safetensors_meta_key(st, 2) == NULL && ag_safetensors_meta_value(st, -1) == NULL);
    ag_safetensors_free(st);
}

// What a failed load leaves in a variable reads as an empty set: no entries,
// no metadata, every lookup NULL (and freeing it does nothing).
static void test_a_null_set_reads_as_empty(void) {
    CHECK(ag_safetensors_count(NULL) == 0 && ag_safetensors_meta_count(NULL) == 0);
    CHECK(ag_safetensors_name(NULL, 0) == NULL && ag_safetensors_at(NULL, 0) == NULL);
    CHECK(ag_safetensors_find(NULL, "w") == NULL && ag_safetensors_meta(NULL, "step") == NULL);
    CHECK(ag_safetensors_meta_key(NULL, 0) == NULL && ag_safetensors_meta_value(NULL, 0) == NULL);
    ag_safetensors_free(NULL);
}

static void test_add_copies_the_values(void) {
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *t = ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){1, 2});
    ag_err err;
    CHECK(ag_safetensors_add(st, "t", t, &err) == 0);
    ag_tensor_f32(t)[0] = 99;
    const ag_tensor *in = ag_safetensors_find(st, "t");
    CHECK(in != t && in->data != t->data && ag_tensor_item(in, 0) == 1);
    ag_tensor_free((ag_tensor *)in);  // the set owns it: ignored
    CHECK(ag_tensor_item(ag_safetensors_find(st, "t"), 1) == 2);
    ag_tensor_free(t);
    ag_safetensors_free(st);
}

// tensor.h: a set's tensor's gradient, once a backward reaches it, lives in the set and is
// freed with it (it used to outlive the set, a leak of one gradient per tensor).
static void test_a_tensor_of_the_set_frees_its_gradient_with_the_set(void) {
    const size_t before = ag_memory_usage().bytes_live;
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *t = ag_tensor_from(AG_F32, 1, (int[]){3}, (float[]){1, 2, 3});
    ag_err err;
    CHECK(ag_safetensors_add(st, "x", t, &err) == 0);
    ag_tensor_free(t);
    ag_tensor *x = (ag_tensor *)ag_safetensors_find(st, "x");
    ag_tensor_set_requires_grad(x, true);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, x)));
    CHECK(x->grad && ag_tensor_grad_item(x, 2) == 6);  // d/dx sum x^2 = 2x
    ag_tape_free(tp);
    ag_safetensors_free(st);
    CHECK(ag_memory_usage().bytes_live == before);
}

static void test_add_rejects_taken_reserved_and_invalid_names(void) {
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *t = ag_tensor_zeros(AG_F32, 1, (int[]){2});
    ag_err err;
    CHECK(ag_safetensors_add(st, "w", t, &err) == 0);
    CHECK(ag_safetensors_add(st, "w", t, &err) != 0);
    CHECK(contains(err.msg, "already holds a tensor named 'w'"));
    CHECK(ag_safetensors_add(st, "__metadata__", t, &err) != 0);
    CHECK(contains(err.msg, "'__metadata__' is reserved"));
    CHECK(ag_safetensors_add(st, "bad\xff", t, &err) != 0);
    CHECK(contains(err.msg, "'bad\\xFF' is not valid UTF-8"));
    CHECK(ag_safetensors_set_meta(st, "k", "\xc3", &err) != 0);
    CHECK(contains(err.msg, "metadata 'k' is not valid UTF-8"));
    CHECK(ag_safetensors_add(st, "n", NULL, &err) != 0);
    CHECK(ag_safetensors_add(st, "n", t, NULL) == 0);  // err may be NULL
    CHECK(ag_safetensors_count(st) == 2);
    ag_tensor_free(t);
    ag_safetensors_free(st);
}

// ---- Every rule a file must satisfy ------------------------------------------------------

static const char *const f32_entry = "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";

static void test_rejects_missing_and_unreadable_files(void) {
    ag_err err;
    const char *path = testing_path("does_not_exist.safetensors");
    CHECK(ag_safetensors_load(path, &err) == NULL);
    CHECK(contains(err.msg, path) && contains(err.msg, "cannot open: No such file"));
    CHECK(ag_safetensors_load(testing_tmpdir(), &err) == NULL);
    CHECK(contains(err.msg, "is a directory, not a file"));
}

// An empty path: the line began ": cannot open", naming no file.
static void test_an_empty_path_is_named_in_the_message(void) {
    ag_err err;
    CHECK(ag_safetensors_load("", &err) == NULL);
    CHECK(strcmp(err.msg, "safetensors_load: the path is empty; name a file to read") == 0);
}

static void test_rejects_files_shorter_than_the_length_field(void) {
    memcpy(image, "\x08\0\0\0\0", 5);
    CHECK(image_fails_with(5, "5 bytes is too short: a safetensors file starts with an 8-byte"));
    CHECK(image_fails_with(0, "0 bytes is too short"));
}

static void test_rejects_header_length_over_the_limit(void) {
    size_t n = make_image("{}", NULL, 0);
    image[3] = 0x10;  // 2 + 0x10000000 = 268435458 > 100 MB
    CHECK(image_fails_with(n, "header length 268435458 exceeds the limit of 100000000 bytes"));
    memset(image, 0xff, 8);
    CHECK(image_fails_with(n, "header length 18446744073709551615 exceeds the limit"));
}

static void test_rejects_header_length_past_the_end_of_the_file(void) {
    size_t n = make_image("{}      ", NULL, 0);
    image[0] = 9;
    CHECK(image_fails_with(n, "header length 9 exceeds the 8 bytes after it (truncated file?)"));
}

static void test_rejects_malformed_json(void) {
    CHECK(header_fails_with("{\"w\":", 0, "invalid JSON in the header: expected a value but "
                                          "found the end of the text at byte 5 of the header"));
    CHECK(header_fails_with("{\"w\" {}}", 0, "expected ':' but found '{' at byte 5"));
    CHECK(header_fails_with("", 0, "invalid JSON in the header: expected a value"));
    CHECK(header_fails_with("{} {}", 0, "unexpected '{' after the end of the JSON value"));
    // Padding is whitespace, not NUL bytes.
    CHECK(image_fails_with(make_image_n("{}\0\0\0\0\0\0", 8, NULL, 0),
                           "unexpected byte 0x00 after the end of the JSON value at byte 2"));
    CHECK(header_fails_with("{\"caf\xc3\":1}", 0, "invalid UTF-8 in a string"));
}

// The format: "The header data MUST begin with a { character"; padding goes at its end.
// (The reference implementation refuses the rest as InvalidHeaderStart.)
static void test_rejects_whitespace_before_the_header_object(void) {
    static const char *const starts[] = {" ", "\n", "\t", "\r\n"};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
        char header[128];
        snprintf(header, sizeof header, "%s{\"w\":%s}", starts[i], f32_entry);
        CHECK(header_fails_with(header, 8, "the header starts with whitespace; its first byte "
                                           "must be '{'"));
    }
}

static void test_rejects_a_header_that_is_not_an_object(void) {
    CHECK(header_fails_with("[1, 2]  ", 0, "the header must be a JSON object, found an array"));
    CHECK(header_fails_with("\"x\"", 0, "the header must be a JSON object, found a string"));
}

static void test_rejects_an_entry_that_is_not_an_object(void) {
    CHECK(header_fails_with("{\"w\":[0,8]}", 8,
                            "tensor 'w': expected an object with dtype, shape and data_offsets, "
                            "found an array"));
}

static void test_rejects_missing_fields(void) {
    CHECK(header_fails_with("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                            "tensor 'w': missing \"dtype\""));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8,
                            "tensor 'w': missing \"shape\""));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
                            "tensor 'w': missing \"data_offsets\""));
}

static void test_rejects_unknown_and_repeated_fields(void) {
    CHECK(header_fails_with(
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"offsets\":[0,8]}}", 8,
        "tensor 'w': unknown field 'offsets' (an entry has dtype, shape and data_offsets)"));
    CHECK(header_fails_with(
        "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
        "tensor 'w': field \"dtype\" appears twice"));
}

static void test_dtype_names_are_spelled_as_in_files(void) {
    const ag_dtype dts[] = {AG_F32, AG_F64, AG_BOOL, AG_U8, AG_I32, AG_I64};
    const char *names[] = {"F32", "F64", "BOOL", "U8", "I32", "I64"};
    for (int i = 0; i < 6; i++) CHECK(strcmp(ag_safetensors_dtype_name(dts[i]), names[i]) == 0);
    CHECK(strcmp(ag_safetensors_dtype_name((ag_dtype)99), "?") == 0);
}

static void test_rejects_unsupported_and_unknown_dtypes(void) {
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                            "tensor 'w': unsupported dtype F16 (attograd reads BOOL, U8, I32, "
                            "F32, F64 and I64)"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                            4, "unsupported dtype BF16"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                            "tensor 'w': unknown dtype 'f32'"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                            "tensor 'w': dtype must be a string such as \"F32\", found a number"));
    // The format's newer dtypes are the format's too: refused as unsupported, not unknown.
    const char *newer[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "C64", "U64"};
    for (int i = 0; i < 6; i++) {
        char header[128], part[64];
        snprintf(header, sizeof header,
                 "{\"w\":{\"dtype\":\"%s\",\"shape\":[2],\"data_offsets\":[0,4]}}", newer[i]);
        snprintf(part, sizeof part, "unsupported dtype %s (", newer[i]);
        CHECK(header_fails_with(header, 4, part));
    }
}

static void test_rejects_more_than_four_dimensions(void) {
    CHECK(header_fails_with(
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,2,1],\"data_offsets\":[0,2]}}", 2,
        "tensor 'w': shape has 6 dimensions; attograd supports at most 4"));
}

static void test_rejects_zero_negative_and_huge_extents(void) {
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[0,0]}}",
                            0,
                            "tensor 'w': dimension 1 is 0; attograd tensors have extents >= 1"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
                            8, "tensor 'w': dimension 0 is negative (-2)"));
    CHECK(header_fails_with(
        "{\"w\":{\"dtype\":\"U8\",\"shape\":[2147483648],\"data_offsets\":[0,8]}}", 8,
        "tensor 'w': dimension 0 is 2147483648, more than attograd's limit 2147483647"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
                            8, "tensor 'w': shape entry 2.0 is not an integer"));
    CHECK(header_fails_with(
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8,
        "tensor 'w': shape entry 99999999999999999999 is out of range"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}",
                            8, "tensor 'w': shape must be an array of integers, found a string"));
    CHECK(header_fails_with(
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[[2]],\"data_offsets\":[0,8]}}", 8,
        "tensor 'w': shape entries must be integers, found an array"));
}

static void test_rejects_malformed_data_offsets(void) {
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}", 8,
                            "tensor 'w': data_offsets has 1 entry, expected 2 [begin, end]"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}",
                            8, "tensor 'w': data_offsets has 3 entries, expected 2"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}",
                            8, "tensor 'w': data_offsets entry -8 is negative"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":{}}}", 8,
                            "tensor 'w': data_offsets must be an array [begin, end], found an "
                            "object"));
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                            "tensor 'w': data_offsets [8,0] end before they begin"));
}

static void test_rejects_offsets_that_disagree_with_dtype_and_shape(void) {
    CHECK(header_fails_with(
        "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,100]}}", 100,
        "bad.safetensors: tensor 'in_proj_weight': data_offsets [0,100] hold 100 bytes but F32 "
        "[4,8] needs 128"));
    CHECK(header_fails_with(
        "{\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
        "tensor 's': data_offsets [0,4] hold 4 bytes but I64 [] needs 8"));
    // A product of extents beyond 2^64 must not wrap around to a small number; nothing
    // beyond AG_MAX_BYTES (base.h) is a tensor.
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F64\",\"shape\":[2147483647,2147483647,"
                            "2147483647,2147483647],\"data_offsets\":[0,8]}}",
                            8, "needs more than 2^48"));
}

static void test_rejects_offsets_past_the_end_of_the_data(void) {
    CHECK(header_fails_with("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8,
                            "tensor 'w': data_offsets [4,12] reach past the end of the data (8 "
                            "bytes; truncated file?)"));
}

static void test_rejects_overlapping_tensors(void) {
    CHECK(header_fails_with(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
        12, "tensors 'a' [0,8] and 'b' [4,12] overlap"));
}

static void test_rejects_holes_and_trailing_bytes(void) {
    CHECK(header_fails_with(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
        20, "data bytes [8,12) belong to no tensor (a hole before 'b')"));
    CHECK(header_fails_with("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                            "data bytes [0,4) belong to no tensor (a hole before 'a')"));
    CHECK(header_fails_with("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9,
                            "data bytes [8,9) at the end of the file belong to no tensor"));
    CHECK(header_fails_with("{}", 1, "data bytes [0,1) at the end of the file belong to no tensor"));
}

static void test_rejects_duplicate_tensor_names(void) {
    char header[256];
    snprintf(header, sizeof header, "{\"w\":%s,\"w\":%s}", f32_entry, f32_entry);
    CHECK(header_fails_with(header, 8, "tensor 'w' appears twice in the header"));
    // Equal after unescaping is equal.
    snprintf(header, sizeof header, "{\"w\":%s,\"\\u0077\":%s}", f32_entry, f32_entry);
    CHECK(header_fails_with(header, 8, "tensor 'w' appears twice in the header"));
}

static void test_rejects_malformed_metadata(void) {
    CHECK(header_fails_with("{\"__metadata__\":{\"step\":100}}", 0,
                            "__metadata__ 'step' must be a string, found a number"));
    CHECK(header_fails_with("{\"__metadata__\":[\"a\"]}", 0,
                            "__metadata__ must be an object of strings, found an array"));
    CHECK(header_fails_with("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                            "__metadata__ key 'k' appears twice"));
    CHECK(header_fails_with("{\"__metadata__\":{},\"__metadata__\":{}}", 0,
                            "\"__metadata__\" appears twice in the header"));
    CHECK(header_fails_with("{\"__metadata__\":{\"k\":{\"deep\":[[[[[]]]]]}}}", 0,
                            "__metadata__ 'k' must be a string, found an object"));
}

static void test_rejects_bool_bytes_other_than_zero_and_one(void) {
    const unsigned char data[4] = {0, 1, 2, 1};
    size_t n = make_image("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                          data, 4);
    CHECK(image_fails_with(n, "tensor 'm': BOOL element 2 is 2; BOOL bytes are 0 or 1"));
}

// The loader refuses BOOL bytes other than 0 and 1, so the set refuses them too: a set
// that was added to without an error always saves to a file that loads.
static void test_add_refuses_bool_bytes_other_than_zero_and_one(void) {
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *bad = ag_tensor_from(AG_BOOL, 1, (int[]){4}, (uint8_t[]){0, 1, 2, 1});
    ag_tensor *good = ag_tensor_from(AG_BOOL, 1, (int[]){2}, (uint8_t[]){1, 0});
    ag_err err;
    CHECK(ag_safetensors_add(st, "m", bad, &err) != 0);
    CHECK(contains(err.msg, "safetensors_add: tensor 'm': BOOL element 2 is 2; BOOL bytes are 0 or 1"));
    CHECK(ag_safetensors_count(st) == 0);
    CHECK(ag_safetensors_add(st, "ok", good, &err) == 0);
    const char *path = testing_path("bools.safetensors");
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors *back = ag_safetensors_load(path, &err);
    CHECK(back && same_tensor(ag_safetensors_find(back, "ok"), good));
    ag_safetensors_free(back);
    ag_tensor_free(bad);
    ag_tensor_free(good);
    ag_safetensors_free(st);
}

static void test_messages_show_hostile_names_on_one_line(void) {
    CHECK(header_fails_with("{\"evil\\nname\\u0007\":{\"dtype\":\"F16\",\"shape\":[1],"
                            "\"data_offsets\":[0,2]}}",
                            2, "tensor 'evil\\x0Aname\\x07': unsupported dtype F16"));
    char header[1200];
    int n = snprintf(header, sizeof header, "{\"");
    for (int i = 0; i < 1000; i++) header[n++] = 'x';
    snprintf(header + n, sizeof header - (size_t)n, "\":[]}");
    CHECK(header_fails_with(header, 0, "xxx...': expected an object"));
}

// ---- Never crash ---------------------------------------------------------------------------

static unsigned char *sample_bytes(size_t *n) {
    ag_safetensors *st = sample_set();
    const char *path = testing_path("sample_bytes.safetensors");
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors_free(st);
    return testing_read_file(path, n);
}

static void test_truncation_at_every_length_fails_cleanly(void) {
    size_t n;
    unsigned char *full = sample_bytes(&n);
    const char *path = testing_path("truncated.safetensors");
    int failures = 0;
    for (size_t len = 0; len < n; len++) {
        ag_err err = {{0}};
        testing_write_file(path, full, len);
        ag_safetensors *a = ag_safetensors_load(path, &err);
        bool named = strncmp(err.msg, path, strlen(path)) == 0;
        ag_safetensors *b = ag_safetensors_load_buffer(full, len, "mem", &err);
        failures += a != NULL || b != NULL || !named;
        ag_safetensors_free(a);
        ag_safetensors_free(b);
    }
    CHECK(failures == 0);
    ag_err err;
    ag_safetensors *whole = ag_safetensors_load_buffer(full, n, "mem", &err);
    CHECK(whole != NULL);
    ag_safetensors_free(whole);
    free(full);
}

// A loaded set must be self-consistent whatever bytes it came from.
static bool consistent(const ag_safetensors *st) {
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        if (t->numel != numel || t->ndim > AG_MAX_DIMS || !t->data) return false;
        if (i && strcmp(ag_safetensors_name(st, i - 1), ag_safetensors_name(st, i)) >= 0)
            return false;
        for (size_t k = 0; t->dtype == AG_BOOL && k < t->numel; k++)
            if (((const uint8_t *)t->data)[k] > 1) return false;
    }
    return true;
}

static void test_random_byte_flips_never_crash(void) {
    size_t n;
    unsigned char *full = sample_bytes(&n);
    unsigned char *copy = malloc(n);
    ag_pcg32 rng = ag_pcg32_make(2024, 11);
    int loaded = 0, bad = 0;
    for (int iter = 0; iter < 4000; iter++) {
        memcpy(copy, full, n);
        int flips = 1 + (int)ag_pcg32_bounded(&rng, 4);
        for (int f = 0; f < flips; f++) {
            // Mostly the header (where the structure is), sometimes anywhere.
            uint32_t span = ag_pcg32_bounded(&rng, 4) ? (uint32_t)(copy[0] + 8) : (uint32_t)n;
            uint32_t at = ag_pcg32_bounded(&rng, span < n ? span : (uint32_t)n);
            copy[at] = ag_pcg32_bounded(&rng, 2) ? (unsigned char)ag_pcg32_next(&rng)
                                                 : (unsigned char)(copy[at] ^ (1u << ag_pcg32_bounded(&rng, 8)));
        }
        ag_err err = {{0}};
        ag_safetensors *st = ag_safetensors_load_buffer(copy, n, "flipped", &err);
        if (st) {
            loaded++;
            bad += !consistent(st);
        } else {
            bad += strncmp(err.msg, "flipped: ", 9) != 0 || strchr(err.msg, '\n') != NULL;
        }
        ag_safetensors_free(st);
    }
    CHECK(bad == 0);
    CHECK(loaded < 4000);  // the flips did break files
    free(copy);
    free(full);
}

static void test_random_garbage_headers_never_crash(void) {
    static const char *const pieces[] = {
        "{", "}", "[", "]", ",", ":", "\"w\"", "\"dtype\"", "\"shape\"", "\"data_offsets\"",
        "\"F32\"", "\"BOOL\"", "\"__metadata__\"", "0", "1", "4", "8", "-1", "1e2", "\"",
        "\\u", "99999999999999999999", " ", "null", "\xff"};
    const uint32_t n_pieces = (uint32_t)(sizeof pieces / sizeof pieces[0]);
    ag_pcg32 rng = ag_pcg32_make(5, 5);
    static const unsigned char zeros[64];
    int bad = 0;
    for (int iter = 0; iter < 3000; iter++) {
        char header[512];
        size_t len = 0;
        int count = 1 + (int)ag_pcg32_bounded(&rng, 60);
        for (int i = 0; i < count; i++) {
            const char *p = pieces[ag_pcg32_bounded(&rng, n_pieces)];
            size_t pl = strlen(p);
            if (len + pl >= sizeof header) break;
            memcpy(header + len, p, pl);
            len += pl;
        }
        header[len] = 0;
        size_t n = make_image(header, zeros, ag_pcg32_bounded(&rng, 3) * 8);
        ag_err err = {{0}};
        ag_safetensors *st = ag_safetensors_load_buffer(image, n, "garbage", &err);
        bad += st ? !consistent(st) : strncmp(err.msg, "garbage: ", 9) != 0;
        ag_safetensors_free(st);
    }
    CHECK(bad == 0);
}

// ---- A file written by PyTorch -----------------------------------------------------------------

// tests/pytorch/make_io_reference.py wrote this from torch tensors with
// tests/pytorch/safetensors_io.py; the values here are the script's.
static void test_pytorch_written_file_loads_with_exact_values(void) {
    const char *path = AG_SOURCE_DIR "/tests/reference/io_pytorch_written.safetensors";
    ag_err err = {{0}};
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st != NULL);
    if (!st) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK(ag_safetensors_count(st) == 8);
    CHECK(strcmp(ag_safetensors_meta(st, "format"), "pt") == 0);
    CHECK(strcmp(ag_safetensors_meta(st, "written_by"), "torch 1.13 via safetensors_io.py") == 0);
    CHECK(strcmp(ag_safetensors_meta(st, "unicode"), "caf\xc3\xa9 \xe2\x88\x87") == 0);

    const ag_tensor *t = ag_safetensors_find(st, "weight_f32");
    const float wf[6] = {1.0f, -2.5f, 0.1f, 3.4028234663852886e38f, 1e-45f, -0.0f};
    CHECK(t && t->dtype == AG_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t && memcmp(t->data, wf, sizeof wf) == 0);

    t = ag_safetensors_find(st, "values_f64");
    CHECK(t && t->dtype == AG_F64 && t->ndim == 1 && t->shape[0] == 4);
    if (t) {
        const double *d = t->data;
        CHECK(d[0] == 0.1 && d[1] == -1e-310 && isinf(d[2]) && d[2] > 0 && isnan(d[3]));
    }
    t = ag_safetensors_find(st, "mask_bool");
    const uint8_t mask[6] = {1, 0, 0, 1, 1, 0};
    CHECK(t && t->dtype == AG_BOOL && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
          memcmp(t->data, mask, 6) == 0);

    t = ag_safetensors_find(st, "bytes_u8");
    const uint8_t bytes[4] = {0, 1, 128, 255};
    CHECK(t && t->dtype == AG_U8 && t->ndim == 1 && memcmp(t->data, bytes, 4) == 0);

    t = ag_safetensors_find(st, "ids_i64");
    const int64_t ids[3] = {INT64_MIN, -1, INT64_MAX};
    CHECK(t && t->dtype == AG_I64 && t->ndim == 1 && memcmp(t->data, ids, sizeof ids) == 0);

    t = ag_safetensors_find(st, "counts_i32");
    const int32_t counts[2] = {INT32_MIN, 123456789};
    CHECK(t && t->dtype == AG_I32 && t->ndim == 1 && memcmp(t->data, counts, sizeof counts) == 0);

    t = ag_safetensors_find(st, "scalar_f32");
    CHECK(t && t->dtype == AG_F32 && t->ndim == 0 && ag_tensor_item(t, 0) == 0.5);

    t = ag_safetensors_find(st, "kernel_f32_4d");  // torch.arange(24) / 8 - 1, as [2,3,1,4]
    CHECK(t && t->dtype == AG_F32 && t->ndim == 4 && t->shape[0] == 2 && t->shape[1] == 3 &&
          t->shape[2] == 1 && t->shape[3] == 4);
    for (int i = 0; t && i < 24; i++) CHECK(ag_tensor_f32(t)[i] == (float)i / 8 - 1);
    ag_safetensors_free(st);
}

// A path longer than the message filled it and the problem was cut off: loading one past
// PATH_MAX said only the path. Past 200 bytes a path is shown as its first 80 bytes,
// "...", and its last 100, and the problem follows.
static void test_a_long_path_leaves_room_for_the_problem(void) {
    static char path[5000];
    for (size_t i = 0; i + 1 < sizeof path; i++) path[i] = i % 2 ? '/' : 'd';
    path[sizeof path - 2] = 'f';
    ag_err err = {{0}};
    CHECK(ag_safetensors_load(path, &err) == NULL);
    char want[512];
    snprintf(want, sizeof want, "%.80s...%s: cannot open: %s", path, path + sizeof path - 101,
             strerror(ENAMETOOLONG));
    CHECK(strcmp(err.msg, want) == 0);
}

int main(void) {
    RUN(test_a_null_set_reads_as_empty);
    RUN(test_round_trip_keeps_every_dtype_shape_and_value);
    RUN(test_header_is_byte_exact_for_a_small_case);
    RUN(test_empty_and_metadata_only_sets_pad_to_eight);
    RUN(test_tensors_are_ordered_by_dtype_alignment_then_name);
    RUN(test_names_are_escaped_as_json_and_read_back);
    RUN(test_reader_accepts_any_order_whitespace_and_escapes);
    RUN(test_set_keeps_names_and_metadata_sorted);
    RUN(test_add_copies_the_values);
    RUN(test_a_tensor_of_the_set_frees_its_gradient_with_the_set);
    RUN(test_add_rejects_taken_reserved_and_invalid_names);
    RUN(test_rejects_missing_and_unreadable_files);
    RUN(test_rejects_files_shorter_than_the_length_field);
    RUN(test_rejects_header_length_over_the_limit);
    RUN(test_rejects_header_length_past_the_end_of_the_file);
    RUN(test_rejects_malformed_json);
    RUN(test_rejects_whitespace_before_the_header_object);
    RUN(test_rejects_a_header_that_is_not_an_object);
    RUN(test_rejects_an_entry_that_is_not_an_object);
    RUN(test_rejects_missing_fields);
    RUN(test_rejects_unknown_and_repeated_fields);
    RUN(test_dtype_names_are_spelled_as_in_files);
    RUN(test_rejects_unsupported_and_unknown_dtypes);
    RUN(test_rejects_more_than_four_dimensions);
    RUN(test_rejects_zero_negative_and_huge_extents);
    RUN(test_rejects_malformed_data_offsets);
    RUN(test_rejects_offsets_that_disagree_with_dtype_and_shape);
    RUN(test_rejects_offsets_past_the_end_of_the_data);
    RUN(test_rejects_overlapping_tensors);
    RUN(test_rejects_holes_and_trailing_bytes);
    RUN(test_rejects_duplicate_tensor_names);
    RUN(test_rejects_malformed_metadata);
    RUN(test_rejects_bool_bytes_other_than_zero_and_one);
    RUN(test_add_refuses_bool_bytes_other_than_zero_and_one);
    RUN(test_messages_show_hostile_names_on_one_line);
    RUN(test_truncation_at_every_length_fails_cleanly);
    RUN(test_random_byte_flips_never_crash);
    RUN(test_random_garbage_headers_never_crash);
    RUN(test_pytorch_written_file_loads_with_exact_values);
    RUN(test_a_long_path_leaves_room_for_the_problem);
    RUN(test_an_empty_path_is_named_in_the_message);
    testing_remove_tmpdir();
    return testing_summary();
}
