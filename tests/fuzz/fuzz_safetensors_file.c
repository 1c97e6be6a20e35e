// libFuzzer target for file loads: any file must either load through
// ag_safetensors_load and ag_params_load, or fail with one line naming it;
// never crash, read out of bounds, leak or hit undefined behaviour. A file
// that loads also loads into a parameter store made to its measure, and a
// store with one more parameter refuses it. See tests/fuzz/README.md.
#include "fuzz_common.h"

#include "attograd/io.h"

#define TARGET "fuzz_safetensors_file"
// Stores bigger than this are not built (the file's data is already bounded
// by its size; this bounds the store's own buffers).
#define MAX_STORE_NUMEL (1 << 20)

// Programming errors reported by the library while building a store (a name
// or shape a parameter cannot have) make store_like give up, not abort.
static int library_errors;
static void count_error(const char *msg, void *user) {
    (void)msg, (void)user;
    library_errors++;
}

// A store with the file's tensors, under their names and shapes, when they
// are all F32 or all F64; NULL otherwise, or when the store would not take
// them or be too big.
static ag_params *store_like(const ag_safetensors *st) {
    int n = ag_safetensors_count(st);
    if (n == 0) return NULL;
    ag_dtype dt = ag_safetensors_at(st, 0)->dtype;
    if (dt != AG_F32 && dt != AG_F64) return NULL;
    size_t numel = 0;
    for (int i = 0; i < n; i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        numel += t->numel;
        if (t->dtype != dt || numel > MAX_STORE_NUMEL) return NULL;
    }
    ag_error_handler_set(count_error, NULL);
    library_errors = 0;
    ag_params *ps = ag_params_new(dt);
    for (int i = 0; i < n && !library_errors; i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        if (!ag_params_add(ps, ag_safetensors_name(st, i), t->ndim, t->shape)) library_errors++;
    }
    ag_error_handler_set(NULL, NULL);
    if (library_errors) {
        ag_params_free(ps);
        return NULL;
    }
    return ps;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("file.safetensors", data, size);
    ag_err err = {{0}};
    ag_safetensors *st = ag_safetensors_load(path, &err);
    if (!st) {
        fuzz_check_message(TARGET, &err, path);
        return 0;
    }
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        fuzz_require(ag_safetensors_find(st, ag_safetensors_name(st, i)) == t, TARGET,
                     "lookup differs");
        fuzz_require(t->numel * ag_dtype_size(t->dtype) <= size, TARGET, "tensor beyond the file");
    }
    ag_params *ps = store_like(st);
    if (ps) {
        fuzz_require(ag_params_load(ps, path, &err) == 0, TARGET, "its own store refuses it");
        for (int i = 0; i < ag_params_count(ps); i++) {
            const ag_tensor *p = ag_params_at(ps, i), *t = ag_safetensors_at(st, i);
            fuzz_require(memcmp(p->data, t->data, t->numel * ag_dtype_size(t->dtype)) == 0, TARGET,
                         "loaded values differ");
        }
        // A name the file does not have (the file may hold any name, this one too).
        char extra[64] = "fuzz.extra.parameter";
        for (int k = 0; ag_safetensors_find(st, extra); k++)
            snprintf(extra, sizeof extra, "fuzz.extra.parameter.%d", k);
        fuzz_require(ag_params_add(ps, extra, 1, (int[]){1}) != NULL, TARGET,
                     "the extra parameter is refused");
        fuzz_require(ag_params_load(ps, path, &err) != 0, TARGET, "a missing parameter loads");
        fuzz_check_message(TARGET, &err, path);
        ag_params_free(ps);
    }
    ag_safetensors_free(st);
    return 0;
}
