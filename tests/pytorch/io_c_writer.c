// Writes, with attograd, the same tensors and metadata that
// make_io_reference.py writes from PyTorch, so the script can check that
// PyTorch reads attograd's file back with equal values (and equal bytes).
// Built and run by make_io_reference.py; not part of CI.
//     io_c_writer OUT.safetensors
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attograd.h"
#include "attograd/io.h"

static void add(ag_safetensors *st, const char *name, ag_tensor *t) {
    ag_err err;
    if (ag_safetensors_add(st, name, t, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    ag_tensor_free(t);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
        return 2;
    }
    const float weight[6] = {1.0f, -2.5f, 0.1f, 3.4028234663852886e38f, 1e-45f, -0.0f};
    const double values[4] = {0.1, -1e-310, INFINITY, NAN};
    const uint8_t mask[6] = {1, 0, 0, 1, 1, 0}, bytes[4] = {0, 1, 128, 255};
    const int64_t ids[3] = {INT64_MIN, -1, INT64_MAX};
    const int32_t counts[2] = {INT32_MIN, 123456789};
    const float half = 0.5f;
    float kernel[24];
    for (int i = 0; i < 24; i++) kernel[i] = (float)i / 8 - 1;

    ag_safetensors *st = ag_safetensors_new();
    add(st, "weight_f32", ag_tensor_from(AG_F32, 2, (int[]){2, 3}, weight));
    add(st, "values_f64", ag_tensor_from(AG_F64, 1, (int[]){4}, values));
    add(st, "mask_bool", ag_tensor_from(AG_BOOL, 2, (int[]){2, 3}, mask));
    add(st, "bytes_u8", ag_tensor_from(AG_U8, 1, (int[]){4}, bytes));
    add(st, "ids_i64", ag_tensor_from(AG_I64, 1, (int[]){3}, ids));
    add(st, "counts_i32", ag_tensor_from(AG_I32, 1, (int[]){2}, counts));
    add(st, "scalar_f32", ag_tensor_from(AG_F32, 0, NULL, &half));
    add(st, "kernel_f32_4d", ag_tensor_from(AG_F32, 4, (int[]){2, 3, 1, 4}, kernel));
    ag_err err;
    if (ag_safetensors_set_meta(st, "format", "pt", &err) ||
        ag_safetensors_set_meta(st, "written_by", "torch 1.13 via safetensors_io.py", &err) ||
        ag_safetensors_set_meta(st, "unicode", "caf\xc3\xa9 \xe2\x88\x87", &err) ||
        ag_safetensors_save(st, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ag_safetensors_free(st);
    return 0;
}
