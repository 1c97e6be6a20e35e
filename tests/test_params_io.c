// Checkpoints of a parameter store: a save/load round trip, conversion
// between f32 and f64 stores, and a strict load (as PyTorch's
// load_state_dict(strict=True)) that refuses a mismatched file without
// touching a single parameter.
#define _POSIX_C_SOURCE 200809L

#include "attograd/io.h"

#include "testing.h"
#include "testing_files.h"

// A small model: an embedding and one linear layer, randomly initialised.
static ag_params *model(ag_dtype dt, uint64_t seed) {
    ag_params *ps = ag_params_new(dt);
    ag_tensor *e = ag_params_add(ps, "embed.weight", 2, (int[]){5, 4});
    ag_tensor *w = ag_params_add(ps, "layer.0.weight", 2, (int[]){3, 4});
    ag_tensor *b = ag_params_add(ps, "layer.0.bias", 1, (int[]){3});
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    ag_tensor_init_normal(e, &rng, 0, 1);
    ag_tensor_init_normal(w, &rng, 0, 1);
    ag_tensor_init_normal(b, &rng, 0, 1);
    return ps;
}

// A copy of every value and gradient, to prove a failed load changed nothing.
typedef struct snapshot {
    unsigned char *data, *grad;
    size_t bytes;
} snapshot;

static snapshot take(const ag_params *ps) {
    snapshot s;
    s.bytes = ag_params_buffer_len(ps) * ag_dtype_size(ag_params_dtype(ps));
    s.data = malloc(s.bytes);
    s.grad = malloc(s.bytes);
    memcpy(s.data, ag_params_data(ps), s.bytes);
    memcpy(s.grad, ag_params_grad(ps), s.bytes);
    return s;
}

static bool unchanged(const ag_params *ps, snapshot s) {
    bool same = memcmp(s.data, ag_params_data(ps), s.bytes) == 0 &&
                memcmp(s.grad, ag_params_grad(ps), s.bytes) == 0;
    free(s.data);
    free(s.grad);
    return same;
}

static bool contains(const char *s, const char *part) {
    if (strstr(s, part)) return true;
    fprintf(stderr, "  message \"%s\"\n  lacks   \"%s\"\n", s, part);
    return false;
}

static void save_set(ag_safetensors *st, const char *path) {
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors_free(st);
}

static void add_copy(ag_safetensors *st, const char *name, const ag_tensor *t) {
    ag_err err;
    CHECK(ag_safetensors_add(st, name, t, &err) == 0);
}

static void test_round_trip_restores_every_value_and_keeps_gradients(void) {
    ag_params *src = model(AG_F32, 1), *dst = model(AG_F32, 2);
    const char *path = testing_path("ckpt.safetensors");
    ag_err err;
    CHECK(ag_params_save(src, path, (const char *[]){"step", "7", "arch", "tiny", NULL}, &err) ==
          0);
    ((float *)ag_params_grad(dst))[0] = 3.0f;  // a gradient in flight survives the load
    CHECK(ag_params_load(dst, path, &err) == 0);
    for (int i = 0; i < ag_params_count(src); i++) {
        const ag_tensor *a = ag_params_at(src, i), *b = ag_params_at(dst, i);
        CHECK(memcmp(a->data, b->data, a->numel * sizeof(float)) == 0);
    }
    CHECK(((float *)ag_params_grad(dst))[0] == 3.0f);

    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && ag_safetensors_count(st) == 3);
    CHECK(st && strcmp(ag_safetensors_meta(st, "step"), "7") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "arch"), "tiny") == 0);
    const ag_tensor *w = st ? ag_safetensors_find(st, "layer.0.weight") : NULL;
    CHECK(w && w->dtype == AG_F32 && w->ndim == 2 && w->shape[0] == 3 && w->shape[1] == 4);
    ag_safetensors_free(st);
    ag_params_free(src);
    ag_params_free(dst);
}

static void test_f64_checkpoint_loads_into_f32_store_and_back(void) {
    ag_params *p64 = model(AG_F64, 3), *p32 = model(AG_F32, 4), *again = model(AG_F64, 5);
    const char *path64 = testing_path("ckpt64.safetensors"), *path32 = testing_path("ckpt32.safetensors");
    ag_err err;
    CHECK(ag_params_save(p64, path64, NULL, &err) == 0);
    CHECK(ag_params_load(p32, path64, &err) == 0);
    const ag_tensor *a = ag_params_find(p64, "embed.weight"), *b = ag_params_find(p32, "embed.weight");
    for (size_t i = 0; i < a->numel; i++) CHECK(ag_tensor_f32(b)[i] == (float)ag_tensor_f64(a)[i]);
    CHECK(ag_params_save(p32, path32, NULL, &err) == 0);
    CHECK(ag_params_load(again, path32, &err) == 0);
    const ag_tensor *c = ag_params_find(again, "embed.weight");
    for (size_t i = 0; i < a->numel; i++) CHECK(ag_tensor_f64(c)[i] == (double)ag_tensor_f32(b)[i]);
    ag_params_free(p64);
    ag_params_free(p32);
    ag_params_free(again);
}

static void test_load_rejects_a_missing_tensor_without_touching_the_store(void) {
    ag_params *src = model(AG_F32, 1), *dst = model(AG_F32, 2);
    ag_safetensors *st = ag_safetensors_new();
    add_copy(st, "embed.weight", ag_params_find(src, "embed.weight"));
    add_copy(st, "layer.0.weight", ag_params_find(src, "layer.0.weight"));
    const char *path = testing_path("missing.safetensors");
    save_set(st, path);
    snapshot before = take(dst);
    ag_err err;
    CHECK(ag_params_load(dst, path, &err) != 0);
    CHECK(unchanged(dst, before));
    CHECK(contains(err.msg, path));
    CHECK(contains(err.msg, ": missing 1 of 3 parameters: 'layer.0.bias'"));
    ag_params_free(src);
    ag_params_free(dst);
}

static void test_load_rejects_an_unexpected_tensor_without_touching_the_store(void) {
    ag_params *src = model(AG_F32, 1), *dst = model(AG_F32, 2);
    ag_safetensors *st = ag_safetensors_new();
    ag_err err;
    CHECK(ag_safetensors_add_params(st, src, NULL, &err) == 0);
    add_copy(st, "head.weight", ag_params_find(src, "layer.0.weight"));
    CHECK(ag_safetensors_set_meta(st, "note", "metadata is not a tensor", &err) == 0);
    const char *path = testing_path("unexpected.safetensors");
    save_set(st, path);
    snapshot before = take(dst);
    CHECK(ag_params_load(dst, path, &err) != 0);
    CHECK(unchanged(dst, before));
    CHECK(contains(err.msg, ": 1 unexpected tensor: 'head.weight'"));
    ag_params_free(src);
    ag_params_free(dst);
}

static void test_load_rejects_a_wrong_shape_naming_both_shapes(void) {
    ag_params *dst = model(AG_F32, 2);
    ag_safetensors *st = ag_safetensors_new();
    ag_err err;
    CHECK(ag_safetensors_add_params(st, dst, NULL, &err) == 0);
    ag_params *other = ag_params_new(AG_F32);
    ag_params_add(other, "layer.0.weight", 2, (int[]){4, 3});
    ag_safetensors *swapped = ag_safetensors_new();
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const char *name = ag_safetensors_name(st, i);
        add_copy(swapped, name,
                 strcmp(name, "layer.0.weight") ? ag_safetensors_at(st, i)
                                                : ag_params_find(other, "layer.0.weight"));
    }
    ag_safetensors_free(st);
    const char *path = testing_path("shape.safetensors");
    save_set(swapped, path);
    snapshot before = take(dst);
    CHECK(ag_params_load(dst, path, &err) != 0);
    CHECK(unchanged(dst, before));
    CHECK(contains(err.msg, ": size mismatch for 'layer.0.weight': [4,3] in the file, [3,4] in the model"));
    ag_params_free(dst);
    ag_params_free(other);
}

static void test_load_rejects_integer_tensors(void) {
    ag_params *dst = ag_params_new(AG_F32);
    ag_params_add(dst, "count", 1, (int[]){2});
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *t = ag_tensor_zeros(AG_I64, 1, (int[]){2});
    add_copy(st, "count", t);
    ag_tensor_free(t);
    const char *path = testing_path("int.safetensors");
    save_set(st, path);
    ag_err err;
    CHECK(ag_params_load(dst, path, &err) != 0);
    CHECK(contains(err.msg, ": 'count' is I64 in the file; parameters load from F32 or F64"));
    ag_params_free(dst);
}

static void test_load_lists_every_problem_on_one_line(void) {
    ag_params *dst = model(AG_F32, 2);
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *wrong = ag_tensor_zeros(AG_F32, 1, (int[]){7});
    add_copy(st, "layer.0.bias", wrong);
    add_copy(st, "stray.a", wrong);
    add_copy(st, "stray.b", wrong);
    ag_tensor_free(wrong);
    ag_err err;
    snapshot before = take(dst);
    CHECK(ag_params_load_from(dst, st, NULL, &err) != 0);
    CHECK(unchanged(dst, before));
    CHECK(contains(err.msg, "missing 2 of 3 parameters: 'embed.weight', 'layer.0.weight'; "
                            "2 unexpected tensors: 'stray.a', 'stray.b'; "
                            "size mismatch for 'layer.0.bias': [7] in the file, [3] in the model"));
    CHECK(strchr(err.msg, '\n') == NULL);
    ag_safetensors_free(st);
    ag_params_free(dst);
}

static void test_a_long_report_is_cut_with_an_ellipsis(void) {
    ag_params *ps = ag_params_new(AG_F32);
    for (int i = 0; i < 100; i++) {
        char name[64];
        snprintf(name, sizeof name, "blocks.%d.attention.in_proj_weight", i);
        ag_params_add(ps, name, 1, (int[]){2});
    }
    const char *path = testing_path("empty.safetensors");
    save_set(ag_safetensors_new(), path);
    ag_err err;
    CHECK(ag_params_load(ps, path, &err) != 0);
    size_t n = strlen(err.msg);
    CHECK(n == sizeof err.msg - 1 && strcmp(err.msg + n - 3, "...") == 0);
    CHECK(contains(err.msg, ": missing 100 of 100 parameters: 'blocks.0.attention.in_proj_weight'"));
    ag_params_free(ps);
}

static void test_load_from_a_prefix_reads_one_model_of_many(void) {
    ag_params *enc = model(AG_F32, 1), *dec = model(AG_F32, 2);
    ag_safetensors *st = ag_safetensors_new();
    ag_err err;
    CHECK(ag_safetensors_add_params(st, enc, "encoder.", &err) == 0);
    CHECK(ag_safetensors_add_params(st, dec, "decoder.", &err) == 0);
    ag_tensor *step = ag_tensor_zeros(AG_I64, 0, NULL);
    add_copy(st, "optimizer.step", step);
    ag_tensor_free(step);
    CHECK(ag_safetensors_count(st) == 7);

    ag_params *enc2 = model(AG_F32, 3), *dec2 = model(AG_F32, 4);
    CHECK(ag_params_load_from(enc2, st, "encoder.", &err) == 0);
    CHECK(ag_params_load_from(dec2, st, "decoder.", &err) == 0);
    CHECK(memcmp(ag_params_data(enc2), ag_params_data(enc),
                 ag_params_buffer_len(enc) * sizeof(float)) == 0);
    CHECK(memcmp(ag_params_data(dec2), ag_params_data(dec),
                 ag_params_buffer_len(dec) * sizeof(float)) == 0);
    // Strict inside the prefix: the whole file is not one model.
    CHECK(ag_params_load_from(enc2, st, NULL, &err) != 0);
    CHECK(contains(err.msg, "missing 3 of 3 parameters"));
    CHECK(contains(err.msg, "7 unexpected tensors"));
    ag_safetensors_free(st);
    ag_params_free(enc);
    ag_params_free(dec);
    ag_params_free(enc2);
    ag_params_free(dec2);
}

static void test_add_params_rejects_a_taken_name_and_adds_nothing(void) {
    ag_params *ps = model(AG_F32, 1);
    ag_safetensors *st = ag_safetensors_new();
    add_copy(st, "m.layer.0.bias", ag_params_find(ps, "layer.0.bias"));
    ag_err err;
    CHECK(ag_safetensors_add_params(st, ps, "m.", &err) != 0);
    CHECK(contains(err.msg, "already holds a tensor named 'm.layer.0.bias'"));
    CHECK(ag_safetensors_count(st) == 1);
    ag_safetensors_free(st);
    ag_params_free(ps);
}

// A parameter may be named "__metadata__", but no file can hold a tensor of that name:
// the save says so, rather than that the (empty) set already holds one.
static void test_a_parameter_named_like_the_metadata_is_refused_as_reserved(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "__metadata__", 1, (int[]){3});
    const char *path = testing_path("reserved.safetensors");
    ag_err err;
    CHECK(ag_params_save(ps, path, NULL, &err) != 0);
    CHECK(contains(err.msg, "'__metadata__' is reserved for the metadata; no parameter can be "
                            "saved under that name"));
    CHECK(testing_count_files("reserved") == 0);
    ag_params_free(ps);
}

static void test_params_save_rejects_a_key_without_value(void) {
    ag_params *ps = model(AG_F32, 1);
    const char *path = testing_path("no_value.safetensors");
    ag_err err;
    CHECK(ag_params_save(ps, path, (const char *[]){"step", NULL}, &err) != 0);
    CHECK(contains(err.msg, "metadata key 'step' has no value"));
    CHECK(testing_count_files("no_value") == 0);
    ag_params_free(ps);
}

static void test_load_of_a_bad_file_names_the_file(void) {
    ag_params *ps = model(AG_F32, 1);
    snapshot before = take(ps);
    ag_err err;
    const char *path = testing_path("absent.safetensors");
    CHECK(ag_params_load(ps, path, &err) != 0);
    CHECK(contains(err.msg, path) && contains(err.msg, "cannot open"));
    const char *junk = testing_path("junk.safetensors");
    testing_write_file(junk, "\x02\0\0\0\0\0\0\0[]", 10);
    CHECK(ag_params_load(ps, junk, &err) != 0);
    CHECK(contains(err.msg, "junk.safetensors: the header must be a JSON object, found an array"));
    CHECK(unchanged(ps, before));
    ag_params_free(ps);
}

int main(void) {
    RUN(test_round_trip_restores_every_value_and_keeps_gradients);
    RUN(test_f64_checkpoint_loads_into_f32_store_and_back);
    RUN(test_load_rejects_a_missing_tensor_without_touching_the_store);
    RUN(test_load_rejects_an_unexpected_tensor_without_touching_the_store);
    RUN(test_load_rejects_a_wrong_shape_naming_both_shapes);
    RUN(test_load_rejects_integer_tensors);
    RUN(test_load_lists_every_problem_on_one_line);
    RUN(test_a_long_report_is_cut_with_an_ellipsis);
    RUN(test_load_from_a_prefix_reads_one_model_of_many);
    RUN(test_add_params_rejects_a_taken_name_and_adds_nothing);
    RUN(test_a_parameter_named_like_the_metadata_is_refused_as_reserved);
    RUN(test_params_save_rejects_a_key_without_value);
    RUN(test_load_of_a_bad_file_names_the_file);
    testing_remove_tmpdir();
    return testing_summary();
}
