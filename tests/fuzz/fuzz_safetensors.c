// libFuzzer target for the safetensors reader: any bytes must either load
// into a self-consistent set or fail with a one-line message; never crash,
// read out of bounds, leak or hit undefined behaviour. Built only with clang
// (tests/fuzz/CMakeLists.txt), never run by ctest. See tests/fuzz/README.md.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attograd.h"
#include "attograd/io.h"

static void require(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ag_err err = {{0}};
    ag_safetensors *st = ag_safetensors_load_buffer(data, size, "fuzz", &err);
    if (!st) {
        require(strncmp(err.msg, "fuzz: ", 6) == 0, "message does not name the file");
        require(strchr(err.msg, '\n') == NULL, "message is not one line");
        return 0;
    }
    size_t bytes = 0;
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        require(t->ndim >= 0 && t->ndim <= AG_MAX_DIMS && t->numel == numel, "bad shape");
        require(ag_safetensors_find(st, ag_safetensors_name(st, i)) == t, "lookup differs");
        // Touch every byte, so the sanitizers see any bad allocation.
        const unsigned char *p = t->data;
        unsigned sum = 0;
        for (size_t k = 0; k < t->numel * ag_dtype_size(t->dtype); k++) sum += p[k];
        (void)sum;
        bytes += t->numel * ag_dtype_size(t->dtype);
    }
    require(bytes <= size, "tensors hold more bytes than the file");
    for (int i = 0; i < ag_safetensors_meta_count(st); i++)
        require(ag_safetensors_meta(st, ag_safetensors_meta_key(st, i)) ==
                    ag_safetensors_meta_value(st, i),
                "metadata lookup differs");
    ag_safetensors_free(st);
    return 0;
}
